#!/usr/bin/env bash
# gpu-all.sh - issue 27's whole check in one command on a lent GPU machine: the full CMake build with CUDA
# (scripts/gpu-build.sh, packages from .debs-full), the GPU suites through ctest (whatever built: a target that
# failed to link does not stop the others), the kernels' and the block's benchmarks, and the mixed swarm
# (ctest's gpu_swarm: scripts/gpu-swarm.sh). Logs alone go to $OUT (the device tool returns at most 8 files):
# gpu-build.txt (the summary), build.log, ctest.log, bench_kern_cuda.txt, bench_block_cuda.txt, and ncu.txt (a
# profile, last, at most 150 s: SEPAL_GPU_NCU_S).
# Usage (device tool, carry [".debs-full"]): bash scripts/gpu-all.sh     About 3 minutes on an H200 (before ncu).
set -uo pipefail
cd "$(dirname "$0")/.."
DEST="${OUT:-/tmp/gpu-all}"
mkdir -p "$DEST"
export OUT="$DEST" SEPAL_GPU_BUILD=/tmp/gpu-build
B=$SEPAL_GPU_BUILD
t0=$(date +%s)
SEPAL_GPU_TESTS="" bash scripts/gpu-build.sh .debs-full
echo "gpu-all: build exit $? after $(($(date +%s) - t0)) s" | tee -a "$DEST/gpu-build.txt"
D=/tmp/deps A=x86_64-linux-gnu
export LD_LIBRARY_PATH="$D/usr/lib/$A:$D/lib/$A:$D/usr/lib/$A/openblas-pthread:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >> "$DEST/gpu-build.txt" 2>&1
# the benchmarks first (the GPU to themselves), then the suites in parallel; gpu_swarm is scripts/gpu-swarm.sh (the
# mixed swarm; test_server_gpu runs beside it as a suite of its own here), gpu_model_check scripts/gpu-model-check.sh
# (model check --device cuda on every golden checkpoint)
[ -x "$B/bench/bench_kern_cuda" ] && timeout 60 "$B/bench/bench_kern_cuda" --decode > "$DEST/bench_kern_cuda.txt" 2>&1
# (150 s: bench_block_cuda's Mixtral-8x7B decode step in three encodings, 1.4 G random weights each, is new and
# not yet timed; the benchmarks took 29 s before it; it prints line by line, so a timeout keeps what it printed)
[ -x "$B/bench/bench_block_cuda" ] && timeout 150 "$B/bench/bench_block_cuda" > "$DEST/bench_block_cuda.txt" 2>&1
echo "gpu-all: benchmarks done after $(($(date +%s) - t0)) s" | tee -a "$DEST/gpu-build.txt"
SUITES="${SEPAL_GPU_SUITES:-^(test_cuda|test_cuda_host|test_cuda_block|test_cuda_train|test_server_gpu|gpu_swarm|gpu_model_check)\$}"
export SEPAL_GPU_SWARM_NO_SERVER_TEST=1 # test_server_gpu is a suite above, not gpu_swarm's tail
# (240 s: test_server_gpu grew by the kept activations' and generation's cases, not yet timed on a GPU)
timeout "${SEPAL_GPU_CTEST_S:-240}" ctest --test-dir "$B" -R "$SUITES" -j 6 --timeout 235 --output-on-failure > "$DEST/ctest.log" 2>&1
echo "gpu-all: ctest exit $? after $(($(date +%s) - t0)) s" | tee -a "$DEST/gpu-build.txt"
grep -E 'tests passed|Passed|Failed|Skipped|Not Run|\*\*\*' "$DEST/ctest.log" | tee -a "$DEST/gpu-build.txt"
# last, so that nothing above waits for it: Nsight Compute over one of each kind of work (bench_block_cuda
# --profile: the 7B decode step in bf16, int8, NF4 and fp16, the bf16 forward + backward, a Mixtral-8x7B decode
# step) when the machine has ncu and
# lets it read the counters: what limits each kernel (speed of light, occupancy, warp stalls), for the next session
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -n "$NCU" ] && [ -x "$B/bench/bench_block_cuda" ]; then
    timeout "${SEPAL_GPU_NCU_S:-150}" "$NCU" --profile-from-start off --section SpeedOfLight --section Occupancy \
        --section LaunchStats --section WarpStateStats "$B/bench/bench_block_cuda" --profile > "$DEST/ncu.txt" 2>&1
    echo "gpu-all: ncu exit $? after $(($(date +%s) - t0)) s" | tee -a "$DEST/gpu-build.txt"
else
    echo "gpu-all: no ncu here (or no bench_block_cuda): no profile" | tee -a "$DEST/gpu-build.txt"
fi
echo "gpu-all: end after $(($(date +%s) - t0)) s" | tee -a "$DEST/gpu-build.txt"
