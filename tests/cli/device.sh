#!/usr/bin/env bash
# sepal-server --device: a bad value is refused; --device cuda on a machine without a usable GPU (or from a build
# without CUDA) and a GPU index that is not there are start-up errors (exit 2, nothing started), for Mixtral as for
# the others (its experts run on the GPU too); a CPU server says "on cpu". The GPU path itself is scripts/gpu-swarm.sh (ctest gpu_swarm: skipped
# without a GPU).
. "$(dirname "$0")/lib.bash"
S="$SEPAL_BIN_DIR/server/sepal-server"
M="$SEPAL_TEST_DATA/hf-tiny/llama-gqa"
for v in gpu cuda:x cuda: cuda:-1 CUDA; do
    expect 2 "--device $v is refused" \
        "^sepal-server: --device: expected cpu, cuda or cuda:N \(N: a GPU's index, 0 the first\), got '$v'$" -- \
        timeout 20 "$S" --model "$M" --blocks 0:2 --device "$v" # (a value taken by mistake would serve)
done
# cuda:999: no such GPU here, with or without one
out=$("$S" --model "$M" --blocks 0:2 --device cuda:999 --no-measure 2>&1)
rc=$?
if [ "$rc" -eq 2 ] && printf '%s\n' "$out" | grep -qE "^sepal-server: --device cuda:999: no usable GPU \(.+\)$"; then
    ok "no GPU here: cuda:999 refused ($out)"
    expect 2 "--device cuda without a GPU" "^sepal-server: --device cuda:0: no usable GPU \(.+\)$" -- \
        "$S" --model "$M" --blocks 0:2 --device cuda --no-measure
    expect 2 "a Mixtral span: the same (not refused for its experts)" \
        "^sepal-server: --device cuda:0: no usable GPU \(.+\)$" -- \
        "$S" --model "$SEPAL_TEST_DATA/hf-tiny/mixtral" --blocks 0:1 --device cuda --no-measure
    out=$("$S" --model "$M" --blocks 0:2 --device cuda --no-measure --new-swarm 2>&1)
    printf '%s\n' "$out" | grep -qvE "serving|DHT|joined" && [ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] &&
        ok "nothing half-started: one line, no swarm joined" || bad "--device cuda --new-swarm: $out"
elif [ "$rc" -eq 2 ] && printf '%s\n' "$out" | grep -qE "^sepal-server: --device cuda:999: no device 999 \([0-9]+ GPU"; then
    ok "a GPU is here: cuda:999 refused ($out); its serving is scripts/gpu-swarm.sh's"
else
    bad "--device cuda:999: exit $rc: $out"
fi
"$S" --model "$M" --blocks 0:2 --no-measure > "$TMP/srv" 2>&1 &
pid=$!
for i in $(seq 200); do grep -q "^sepal-server: serving" "$TMP/srv" && break; sleep 0.05; done
kill $pid 2>/dev/null
wait $pid 2>/dev/null
grep -qE "^sepal-server: serving blocks 0:2 .*; f32 weights, [0-9.]+ MB, on cpu$" "$TMP/srv" && ok "a CPU server says 'on cpu'" ||
    bad "the serving line: $(head -1 "$TMP/srv")"
finish
