#!/usr/bin/env bash
# gpu-swarm.sh BUILD_DIR - a mixed swarm on a GPU (issue 27; ctest gpu_swarm): for tiny golden checkpoints of
# tests/data/hf-tiny (llama with GQA, bloom, falcon-7b, mixtral), one CPU server and one `--device cuda` server hold the two
# halves of the blocks, and the client's greedy tokens (generate --ids) equal those of a CPU-only swarm of the same
# halves: f32 for every family, bf16 for llama; beam search (hypo_ids' reorder on the device) and two clients at once
# (the batched decode pass) too. The GPU server measures its throughput on the device, says "on cuda:0 NAME" and
# `servers` shows "f32 cuda:0"; then BUILD_DIR/tests/test_server_gpu when it is there. Without a usable GPU it prints "skipped: ..." and exits 77.
# Needs only BUILD_DIR/server/sepal-server and sepal-server-cuda (the first hands --device cuda to it), BUILD_DIR/app/sepal (with their shared libraries) and tests/data.
set -u
BUILD=$(cd "${1:?usage: scripts/gpu-swarm.sh BUILD_DIR}" && pwd)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
S="$BUILD/server/sepal-server"
C="$BUILD/app/sepal"
D="$ROOT/tests/data/hf-tiny"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/sepal-gpu-XXXXXX")
export SEPAL_CACHE="$TMP/cache" # the throughput is measured, not read from an earlier run's cache
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; rm -rf "$TMP"' EXIT
PASS=0 FAIL=0
ok() { PASS=$((PASS + 1)); echo "ok: $1"; }
bad() { FAIL=$((FAIL + 1)); echo "FAIL: $1"; }

DEV=${SEPAL_GPU_SWARM_DEVICE:-cuda} # cpu: the script's own check on a machine without a GPU (the device lines fail)
probe=$("$S" --model "$D/llama-gqa" --blocks 0:2 --device cuda:999 --no-measure 2>&1)
if [ "$DEV" = cuda ] && printf '%s\n' "$probe" | grep -q "no usable GPU"; then
    echo "skipped: $probe"
    exit 77
fi

# serve NAME MODEL BLOCKS ARGS...: a server in the background; its port in PORT (empty if it did not start)
serve() {
    local name=$1 model=$2 blocks=$3
    shift 3
    : > "$TMP/$name.log" # (the loop below reads it before the child has opened it)
    "$S" --model "$model" --blocks "$blocks" "$@" > "$TMP/$name.log" 2>&1 &
    PIDS+=($!)
    PORT=
    for _ in $(seq 600); do
        grep -q "^sepal-server: serving" "$TMP/$name.log" && break
        kill -0 "${PIDS[-1]}" 2>/dev/null || break
        sleep 0.1
    done
    PORT=$(grep -o 'ws://127.0.0.1:[0-9]*' "$TMP/$name.log" | head -1 | cut -d: -f3)
    [ -n "$PORT" ] || { bad "$name did not start: $(tail -3 "$TMP/$name.log")"; }
}
# gen MODEL PORTS ARGS...: the ids generate prints (prompt included)
gen() {
    local model=$1 ports=$2
    shift 2
    "$C" -c "load $model; connect $ports; generate --ids 1,5,9,13,17,21 --greedy --max-new-tokens 24 --ignore-eos $*" \
        2>"$TMP/gen.err" | grep -E '^[0-9]+(,? [0-9]+)*$|^[0-9, ]+$' | tail -1
}

# one family and dtype: CPU-only swarm, then CPU + GPU
mixed() {
    local fam=$1 dtype=$2 n half m="$D/$1"
    n=$(python3 -c "import json,sys; c=json.load(open('$m/config.json')); print(c.get('num_hidden_layers', c.get('n_layer')))" 2>/dev/null ||
        grep -oE '"(num_hidden_layers|n_layer)": *[0-9]+' "$m/config.json" | grep -oE '[0-9]+$')
    half=$((n / 2))
    serve "$fam-$dtype-cpu0" "$m" "0:$half" --dtype "$dtype" --no-measure; local p0=$PORT
    serve "$fam-$dtype-cpu1" "$m" "$half:$n" --dtype "$dtype" --no-measure; local p1=$PORT
    serve "$fam-$dtype-gpu1" "$m" "$half:$n" --dtype "$dtype" --device "$DEV"; local g1=$PORT
    [ -n "$p0" ] && [ -n "$p1" ] && [ -n "$g1" ] || return
    local want got
    want=$(gen "$m" "127.0.0.1:$p0,127.0.0.1:$p1")
    got=$(gen "$m" "127.0.0.1:$p0,127.0.0.1:$g1")
    if [ -n "$want" ] && [ "$got" = "$want" ]; then
        ok "$fam $dtype: CPU 0:$half + GPU $half:$n give the CPU swarm's greedy ids ($got)"
    else
        bad "$fam $dtype: CPU swarm '$want', with the GPU '$got' ($(tail -2 "$TMP/gen.err"))"
    fi
    [ "$fam" = llama-gqa ] || return
    want=$(gen "$m" "127.0.0.1:$p0,127.0.0.1:$p1" --beams 3)
    got=$(gen "$m" "127.0.0.1:$p0,127.0.0.1:$g1" --beams 3)
    [ -n "$want" ] && [ "$got" = "$want" ] && ok "$fam $dtype: beam search (reorder on the device) the same ($got)" ||
        bad "$fam $dtype beams: CPU '$want', GPU '$got'"
    # two clients at once: their decode steps may meet in one batched pass on the device
    local a b
    gen "$m" "127.0.0.1:$p0,127.0.0.1:$g1" > "$TMP/a" &
    gen "$m" "127.0.0.1:$p0,127.0.0.1:$g1" > "$TMP/b"
    wait $!
    a=$(cat "$TMP/a") b=$(cat "$TMP/b")
    want=$(gen "$m" "127.0.0.1:$p0,127.0.0.1:$p1")
    [ "$a" = "$want" ] && [ "$b" = "$want" ] && ok "$fam $dtype: two clients at once, each the CPU's ids" ||
        bad "$fam $dtype two clients: '$a' / '$b', want '$want'"
    if [ "$dtype" = f32 ]; then
        grep -qE "; f32 weights, [0-9.]+ MB, on cuda:0 .+$" "$TMP/$fam-$dtype-gpu1.log" &&
            ok "the GPU server says where it runs: $(grep -oE 'on cuda:0 .+$' "$TMP/$fam-$dtype-gpu1.log")" ||
            bad "serving line: $(grep serving "$TMP/$fam-$dtype-gpu1.log")"
        grep -qE "serving blocks [0-9:]+ .*, [1-9][0-9.]* steps/s, [1-9][0-9]* tokens/s" "$TMP/$fam-$dtype-gpu1.log" &&
            ok "its throughput is measured on the device: $(grep -oE '[0-9.]+ steps/s, [0-9]+ tokens/s' "$TMP/$fam-$dtype-gpu1.log")" ||
            bad "throughput: $(grep serving "$TMP/$fam-$dtype-gpu1.log")"
        local sv
        sv=$("$C" -c "load $m; connect 127.0.0.1:$p0,127.0.0.1:$g1; servers; servers --long" 2>&1)
        printf '%s\n' "$sv" | grep -qE " f32 cuda:0 " && printf '%s\n' "$sv" | grep -qE "^  device +cuda:0 " &&
            printf '%s\n' "$sv" | grep -qE "^  device +cpu$" && ok "servers shows each server's device" ||
            bad "servers: $(printf '%s\n' "$sv" | grep -E 'device|f32' | head -5)"
    fi
}

for fam in llama-gqa bloom falcon-7b mixtral; do
    mixed "$fam" f32
done
mixed llama-gqa bf16
mixed llama-gqa fp16
for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
wait 2>/dev/null
# the RPCs themselves against a CPU server's, within 1e-4 relative (test_server_gpu, when built; not when the caller
# runs it as a suite of its own: SEPAL_GPU_SWARM_NO_SERVER_TEST=1, scripts/gpu-all.sh)
if [ -x "$BUILD/tests/test_server_gpu" ] && [ -z "${SEPAL_GPU_SWARM_NO_SERVER_TEST:-}" ]; then
    if "$BUILD/tests/test_server_gpu" > "$TMP/test_server_gpu.out" 2>&1; then
        ok "test_server_gpu: $(grep -E 'Checks' "$TMP/test_server_gpu.out")"
    else
        bad "test_server_gpu: $(tail -5 "$TMP/test_server_gpu.out")"
    fi
fi
# every server shut down cleanly (its device freed), none crashed
if grep -lE "Sanitizer|Segmentation|cuda: |internal" "$TMP"/*.log >/dev/null 2>&1; then
    bad "a server's log: $(grep -hE "Sanitizer|Segmentation|cuda: |internal" "$TMP"/*.log | head -3)"
else
    ok "no server logged an error"
fi
echo "$PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
