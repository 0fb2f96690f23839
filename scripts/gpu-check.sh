#!/usr/bin/env bash
# The one prepared command for a lent GPU machine (issue 27): builds the CUDA suites and benchmarks with
# scripts/device-test-cuda.sh (packages from .debs/, see there), runs them, then runs test_cuda once more under
# compute-sanitizer's memcheck. Builds under /tmp/gpu-check; only the logs go to $OUT (the device tool returns at
# most 8 files): summary.txt, test_cuda_host.log, test_cuda.log, test_cuda_block.log, bench_kern_cuda.txt,
# bench_block_cuda.txt, memcheck.log, build.log. SEPAL_CUDA_SUITES / SEPAL_CUDA_BENCHES (device-test-cuda.sh) pick
# a subset; memcheck runs on the first suite of them that is a GPU suite.
# Usage (device tool): bash scripts/gpu-check.sh   with .debs carried. Runs in about 3 minutes on an H100/H200
# (bench_block_cuda: 30 s of it). SEPAL_MEMCHECK_S: memcheck's time limit (default 180; 0: no memcheck);
# device-test-cuda.sh's SEPAL_DEVICE_PREBUILT (binaries built before, e.g. here with SEPAL_DEVICE_BUILD_ONLY=1) and
# SEPAL_CUDA_BENCH_ARGS pass on.
set -uo pipefail
cd "$(dirname "$0")/.."
DEST="${OUT:-/tmp/gpu-check-out}"
mkdir -p "$DEST"
W=/tmp/gpu-check
rm -rf "$W"
mkdir -p "$W"
t0=$(date +%s)
{
    echo "start $(date -u +%FT%TZ)"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader || true
    nvcc --version | tail -2 || true
    gcc --version | head -1 || true
    ls /usr/local/cuda/lib64 2>&1 | grep -E 'cublas|cudart' | head -4
    command -v nvcc cmake compute-sanitizer || true
    nproc
} > "$DEST/summary.txt" 2>&1
OUT="$W" bash scripts/device-test-cuda.sh > "$DEST/build.log" 2>&1
echo "device-test-cuda.sh: exit $? after $(( $(date +%s) - t0 )) s" >> "$DEST/summary.txt"
B="$W/device-build"
for f in summary.txt test_cuda_host.log test_cuda.log test_cuda_block.log bench_kern_cuda.txt bench_block_cuda.txt; do
    [ -f "$B/$f" ] || continue
    if [ "$f" = summary.txt ]; then cat "$B/$f" >> "$DEST/summary.txt"; else cp "$B/$f" "$DEST/"; fi
done
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
MC=""
for t in ${SEPAL_CUDA_SUITES-test_cuda test_cuda_block}; do
    [ "$t" != test_cuda_host ] && [ -x "$B/$t" ] && { MC="$t"; break; }
done
if [ -n "$MC" ] && [ -n "$CS" ] && [ "${SEPAL_MEMCHECK_S:-180}" != 0 ]; then
    export LD_LIBRARY_PATH="/tmp/deps/usr/lib/x86_64-linux-gnu:/tmp/deps/usr/lib/x86_64-linux-gnu/openblas-pthread:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
    timeout "${SEPAL_MEMCHECK_S:-180}" "$CS" --tool memcheck --leak-check no --report-api-errors no --error-exitcode 9 "$B/$MC" > "$DEST/memcheck.log" 2>&1
    echo "memcheck $MC: exit $? after $(( $(date +%s) - t0 )) s" >> "$DEST/summary.txt"
fi
echo "end $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s" >> "$DEST/summary.txt"
cat "$DEST/summary.txt"
grep -E '^[0-9]+%|FAIL|Error|error' "$DEST"/test_cuda*.log | head -40
