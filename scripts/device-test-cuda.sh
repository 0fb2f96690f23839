#!/usr/bin/env bash
# Builds and runs the CUDA Check suite on a GPU machine that has nvcc but none of our Debian -dev
# packages and no network (the lent device machine). The packages travel as .deb files in .debs/
# (made here with: mkdir -p .debs && cd .debs && apt-get download libopenblas0-pthread
# libopenblas-pthread-dev libopenblas-dev check libsubunit0 libsubunit-dev libcjson1 libcjson-dev
# libgfortran5) and are unpacked under /tmp/deps, never into /.
set -euo pipefail
cd "$(dirname "$0")/.."
D=/tmp/deps
mkdir -p "$D"
for f in .debs/*.deb; do dpkg -x "$f" "$D"; done
U="$D/usr"
LIB="$U/lib/x86_64-linux-gnu"
CUDA="${CUDA_HOME:-/usr/local/cuda}"
INC=(-Icommon -Icore -Icuda -Iclient -Iclient/train -Itests -I"$U/include" -I"$U/include/x86_64-linux-gnu/openblas-pthread" -I"$U/include/cjson")
OUTDIR="${OUT:-/tmp}/device-build"
mkdir -p "$OUTDIR"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
for cu in cuda_backend optim; do
    "$CUDA/bin/nvcc" -O2 -std=c++17 -arch=sm_90 -Icommon -Icuda -c "cuda/$cu.cu" -o "$OUTDIR/$cu.o"
done
# client/train/optim.c with its CUDA path (it needs only common/ and the autograd.h header, not autograd.c).
gcc -O2 -std=c11 -D_GNU_SOURCE -DSEPAL_HAVE_CUDA=1 -Wall -Wextra "${INC[@]}" \
    common/*.c core/ops.c client/train/optim.c tests/test_cuda.c tests/testutil.c "$OUTDIR/cuda_backend.o" "$OUTDIR/optim.o" \
    -L"$LIB" -L"$LIB/openblas-pthread" -L"$CUDA/lib64" \
    -l:libopenblas.so.0 -l:libcheck.a -lsubunit -lcudart -lstdc++ -lm -lpthread -lrt -o "$OUTDIR/test_cuda"
export LD_LIBRARY_PATH="$LIB:$LIB/openblas-pthread:$CUDA/lib64:${LD_LIBRARY_PATH:-}"
"$OUTDIR/test_cuda"
