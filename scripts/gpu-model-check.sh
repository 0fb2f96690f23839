#!/usr/bin/env bash
# gpu-model-check.sh BUILD_DIR - `sepal model check DIR --device cuda` on every golden checkpoint of tests/data/hf-tiny
# (issue 27; ctest gpu_model_check): the blocks on the GPU in f32 against transformers' outputs with model check's
# tolerances (each block's in -> out 1e-4 and grad_out -> grad_in 1e-3, the logits 1e-4), and the greedy ids through
# the device's KV caches (a prefill, then decode steps: CUDA graphs). Each failing check's lines are printed. Without
# a usable GPU it prints "skipped: ..." and exits 77. SEPAL_GPU_CHECK_DEVICE=cpu runs the same loop on the CPU (the
# script's own check on a machine without a GPU).
set -u
BUILD=$(cd "${1:?usage: scripts/gpu-model-check.sh BUILD_DIR}" && pwd)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
C="$BUILD/app/sepal"
DEV=${SEPAL_GPU_CHECK_DEVICE:-cuda}
probe=$("$C" model check "$ROOT/tests/data/hf-tiny/llama-gqa" --device cuda:999 2>&1)
if [ "$DEV" = cuda ] && printf '%s\n' "$probe" | grep -qE "no usable GPU|built without CUDA"; then
    echo "skipped: $probe"
    exit 77
fi
PASS=0 FAIL=0
for g in "$ROOT"/tests/data/hf-tiny/*/golden.safetensors; do
    d=$(dirname "$g")
    out=$("$C" model check "$d" --device "$DEV" 2>&1)
    rc=$?
    where=$(printf '%s\n' "$out" | grep -m1 -oE "^blocks on cuda:[0-9]+ .*" || echo "blocks on cpu")
    if [ $rc -eq 0 ] && printf '%s\n' "$out" | grep -qx "PASS: 0 check(s) failed" &&
        { [ "$DEV" = cpu ] || printf '%s\n' "$out" | grep -qE "^blocks on cuda:0 "; }; then
        PASS=$((PASS + 1))
        echo "ok: $(basename "$d"): $where, every check within tolerance"
    else
        FAIL=$((FAIL + 1))
        echo "FAIL: $(basename "$d") (exit $rc, $where):"
        printf '%s\n' "$out" | grep -E "FAIL|error|^sepal:" | sed 's/^/    /'
    fi
done
echo "$PASS passed, $FAIL failed"
[ "$PASS" -gt 0 ] && [ "$FAIL" -eq 0 ]
