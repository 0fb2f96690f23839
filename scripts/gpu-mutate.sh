#!/usr/bin/env bash
# gpu-mutate.sh - on a lent GPU machine, after scripts/gpu-all.sh's build (SEPAL_GPU_BUILD, default /tmp/gpu-build):
# plants one mutation at a time in the CUDA sources the GPU suites guard, rebuilds the suite that should catch it,
# runs it, and restores the source. Each mutation must make its suite fail ("caught"); one that passes is reported
# "MISSED" and the script exits 1. The mutations (file, sed expression, suite):
#   flash.cu      the softmax scale 1/sqrt(hd) -> 1.1/sqrt(hd)          (flash attention: forward, prefill, backward)
#   fused_decode.cu  the decode step's scale 1/sqrt(hd) -> 1.1/sqrt(hd)  (the fused decode attention)
#   moe.cu        each pair's routing weight taken twice in the experts' sum
#   fused.cu      the bf16 path's norm over C/2 values' mean of squares
# Usage (device tool, carry [".debs-full"]): bash scripts/gpu-mutate.sh [MAX_SECONDS]   (builds first unless the
# build is there; stops starting mutations after MAX_SECONDS)
set -uo pipefail
cd "$(dirname "$0")/.."
B="${SEPAL_GPU_BUILD:-/tmp/gpu-build}" max="${1:-200}" t0=$(date +%s) missed=0
export SEPAL_GPU_BUILD="$B"
if [ ! -x "$B/tests/test_cuda_block" ]; then # the build gpu-all.sh makes, from .debs-full
    SEPAL_GPU_TESTS="" bash scripts/gpu-build.sh .debs-full > "${OUT:-/tmp}/gpu-mutate-build.txt" 2>&1
    echo "gpu-mutate: built after $(($(date +%s) - t0)) s"
fi
D=/tmp/deps A=x86_64-linux-gnu
export LD_LIBRARY_PATH="$D/usr/lib/$A:$D/lib/$A:$D/usr/lib/$A/openblas-pthread:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
muts=(
    "cuda/flash.cu|s|p->scale = 1.0f / sqrtf((float)hd);|p->scale = 1.1f / sqrtf((float)hd);|test_cuda_block"
    "cuda/fused_decode.cu|s|float scale = 1.0f / sqrtf((float)hd)|float scale = 1.1f / sqrtf((float)hd)|test_cuda_block"
    "cuda/moe.cu|s|v += rw\[t \* K + k\] \* ys|v += 2.0f * rw[t * K + k] * ys|test_cuda_block"
    "cuda/fused.cu|s|sp_km_sumsq_part(x, C, tid, nt), sh), C, eps)|sp_km_sumsq_part(x, C, tid, nt), sh), C / 2, eps)|test_cuda_block"
)
for m in "${muts[@]}"; do
    IFS='|' read -r file _ from to suite <<< "$m"
    if [ $(($(date +%s) - t0)) -gt "$max" ]; then echo "gpu-mutate: $file: not run (time)"; continue; fi
    cp "$file" "/tmp/mut.orig"
    sed -i "s|$from|$to|" "$file"
    if cmp -s "$file" /tmp/mut.orig; then echo "gpu-mutate: $file: the pattern did not match: MISSED"; missed=1; continue; fi
    if ! cmake --build "$B" --target "$suite" -j 16 > /tmp/mut.build 2>&1; then
        echo "gpu-mutate: $file: the mutant did not build"; tail -5 /tmp/mut.build; cp /tmp/mut.orig "$file"; continue
    fi
    if CK_FORK=no timeout 60 "$B/tests/$suite" > /tmp/mut.out 2>&1; then
        echo "gpu-mutate: $file ($to): $suite passed: MISSED"; missed=1
    else
        echo "gpu-mutate: $file: caught by $suite: $(grep -m1 -E 'Failure|Error|error' /tmp/mut.out | cut -c1-200)"
    fi
    cp /tmp/mut.orig "$file"
done
cmake --build "$B" --target test_cuda_block -j 16 > /dev/null 2>&1
echo "gpu-mutate: done after $(($(date +%s) - t0)) s"
exit $missed
