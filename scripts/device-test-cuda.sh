#!/usr/bin/env bash
# Builds and runs the CUDA Check suites (test_cuda_host, test_cuda, test_cuda_block) and the benchmarks
# (bench_kern_cuda, bench_block_cuda) on a GPU machine that has nvcc but none of our Debian -dev packages and no
# network (the lent device machine). The packages travel as .deb files in .debs/ (made here with: mkdir -p .debs &&
# cd .debs && apt-get download libopenblas0-pthread libopenblas-pthread-dev libopenblas-dev check libsubunit0
# libsubunit-dev libcjson1 libcjson-dev libgfortran5) and are unpacked under /tmp/deps, never into /. Without .debs/ the system's
# packages are used (a machine like this one: the build is checked, test_cuda reports itself skipped and the
# benchmark says there is no GPU). Outputs (objects, binaries, logs, summary.txt, bench_*.txt) go to
# $OUT/device-build (or /tmp/device-build). SEPAL_CUDA_SUITES and SEPAL_CUDA_BENCHES name a subset to build and run
# (default: all of them; "" for none).
# SEPAL_DEVICE_BUILD_ONLY=1 builds and runs nothing (to build here, with -arch sm_90, and carry the binaries);
# SEPAL_DEVICE_PREBUILT=DIR takes the suites and benchmarks from DIR instead of compiling when every library they
# need is found there (ldd), and compiles them otherwise. SEPAL_CUDA_BENCH_ARGS: arguments for the benchmarks
# (e.g. --decode).
set -euo pipefail
cd "$(dirname "$0")/.."
CUDA="${CUDA_HOME:-/usr/local/cuda}"
if [ ! -x "$CUDA/bin/nvcc" ] && command -v nvcc > /dev/null; then CUDA="$(dirname "$(dirname "$(command -v nvcc)")")"; fi
INC=(-Icommon -Icore -Icuda -Iclient/train -Itests)
LIBDIRS=(-L"$CUDA/lib64")
export LD_LIBRARY_PATH="$CUDA/lib64:${LD_LIBRARY_PATH:-}"
NVINC=()
# cuBLAS from the toolkit, else from the Python wheel a PyTorch image carries (nvidia/cublas/{include,lib})
if ! compgen -G "$CUDA/lib64/libcublas.so*" > /dev/null; then
    W=$(python3 -c 'import nvidia.cublas, os; print(os.path.dirname(nvidia.cublas.__file__))' 2>/dev/null ||
        find / -path /proc -prune -o -name 'libcublas.so*' -path '*nvidia/cublas/lib*' -print 2>/dev/null | head -1 | xargs -r dirname | xargs -r dirname)
    if [ -n "$W" ]; then
        echo "cuBLAS from $W"
        NVINC+=(-I"$W/include")
        INC+=(-I"$W/include")
        [ -e "$W/lib/libcublas.so" ] || { mkdir -p /tmp/cublas-link; ln -sf "$W"/lib/libcublas.so.* /tmp/cublas-link/; ln -sf "$(ls "$W"/lib/libcublas.so.* | head -1)" /tmp/cublas-link/libcublas.so; LIBDIRS+=(-L/tmp/cublas-link); }
        LIBDIRS+=(-L"$W/lib")
        export LD_LIBRARY_PATH="$W/lib:$LD_LIBRARY_PATH"
    fi
fi
if compgen -G ".debs/*.deb" > /dev/null; then
    D=/tmp/deps
    mkdir -p "$D"
    for f in .debs/*.deb; do dpkg -x "$f" "$D"; done
    U="$D/usr"
    LIB="$U/lib/x86_64-linux-gnu"
    INC+=(-I"$U/include" -I"$U/include/x86_64-linux-gnu/openblas-pthread" -I"$U/include/cjson")
    LIBDIRS+=(-L"$LIB" -L"$LIB/openblas-pthread")
    export LD_LIBRARY_PATH="$LIB:$LIB/openblas-pthread:$LD_LIBRARY_PATH"
    CHECK=(-l:libcheck.a -lsubunit)
else
    INC+=($(pkg-config --cflags openblas check libcjson 2>/dev/null || true))
    CHECK=($(pkg-config --libs check))
fi
OUTDIR="${OUT:-/tmp}/device-build"
mkdir -p "$OUTDIR"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
ARCH="${SEPAL_CUDA_ARCH:-sm_90}"
OBJS=() PIDS=()
SUITES=(${SEPAL_CUDA_SUITES-test_cuda_host test_cuda test_cuda_block})
BENCHES=(${SEPAL_CUDA_BENCHES-kern_cuda block_cuda})
BINS=("${SUITES[@]}" "${BENCHES[@]/#/bench_}")
# 0 when DIR holds every binary and ldd finds every library they need
prebuilt_ok() {
    local b
    for b in "${BINS[@]}"; do
        [ -x "$1/$b" ] || return 1
        if ldd "$1/$b" | grep -q "not found"; then ldd "$1/$b" | grep "not found"; return 1; fi
    done
}
# waits for every job in PIDS; fails when one did
wait_all() { local p; for p in "${PIDS[@]}"; do wait "$p"; done; PIDS=(); }
# compiles the binaries into OUTDIR (16 cores there: the .cu files and the links in parallel)
compile_all() {
    for src in cuda/*.cu; do
        o="$OUTDIR/$(basename "$src" .cu).o"
        "$CUDA/bin/nvcc" -O3 -std=c++17 -arch="$ARCH" -DSEPAL_HAVE_CUBLAS=1 -Icommon -Icore -Icuda "${NVINC[@]}" -c "$src" -o "$o" &
        PIDS+=($!)
        OBJS+=("$o")
    done
    wait_all
    # sepal_common's files (common/CMakeLists.txt: not swarmkey.c, which needs OpenSSL) and core/ (the CPU
    # references: ops, the weight encodings, the block); for the tests, client/train/optim.c with its CUDA path (it
    # needs only common/ and the autograd.h header, not autograd.c) and the host harness.
    local COMMON=($(sed -n 's/^add_library(sepal_common STATIC \(.*\))$/\1/p' common/CMakeLists.txt))
    local LIB_SRC=("${COMMON[@]/#/common/}" core/*.c cuda/wlayout.c) # core/block.c and what it loads with
    local TEST_SRC=(client/train/optim.c tests/testrun.c tests/cuda_emul.c)
    local LINK=("${LIBDIRS[@]}" -l:libopenblas.so.0 -lcjson -lcublas -lcudart -lstdc++ -lm -lpthread -lrt)
    local CC=(gcc -O2 -std=c11 -D_GNU_SOURCE -DSEPAL_HAVE_CUDA=1 -Wall -Wextra "${INC[@]}")
    local t b
    for t in "${SUITES[@]}"; do
        "${CC[@]}" "${LIB_SRC[@]}" "${TEST_SRC[@]}" "tests/$t.c" "${OBJS[@]}" "${CHECK[@]}" "${LINK[@]}" -o "$OUTDIR/$t" &
        PIDS+=($!)
    done
    for b in "${BENCHES[@]}"; do
        "${CC[@]}" "${LIB_SRC[@]}" "bench/$b.c" "${OBJS[@]}" "${LINK[@]}" -o "$OUTDIR/bench_$b" &
        PIDS+=($!)
    done
    wait_all
}
PB="${SEPAL_DEVICE_PREBUILT:-}"
if [ -n "$PB" ] && prebuilt_ok "$PB"; then
    echo "binaries from $PB (built before; not compiled here)" | tee -a "$OUTDIR/summary.txt"
    for b in "${BINS[@]}"; do cp "$PB/$b" "$OUTDIR/"; done
else
    [ -z "$PB" ] || echo "prebuilt binaries in $PB do not start here: compiling" | tee -a "$OUTDIR/summary.txt"
    compile_all
fi
[ "${SEPAL_DEVICE_BUILD_ONLY:-0}" = 1 ] && exit 0
rc=0
for t in "${SUITES[@]}"; do
    set +e
    "$OUTDIR/$t" 2>&1 | tee "$OUTDIR/$t.log"
    r=${PIPESTATUS[0]}
    set -e
    echo "$t: exit $r" | tee -a "$OUTDIR/summary.txt"
    [ "$r" -eq 0 ] || [ "$r" -eq 77 ] || rc=1
done
# the kernels' and the block's speed (bench/kern_cuda.c, bench/block_cuda.c), whatever the tests said
for b in "${BENCHES[@]}"; do
    timeout 300 "$OUTDIR/bench_$b" ${SEPAL_CUDA_BENCH_ARGS:-} 2>&1 | tee "$OUTDIR/bench_$b.txt" || rc=1
done
exit $rc
