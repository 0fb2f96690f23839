#!/usr/bin/env bash
# sepal-server --dtype: blocks held as bf16, fp16, int8 or nf4 (encoded at load) serve generation and training.
# The dtype is what the server announces and what `servers` shows; bf16, fp16 and int8 give f32's greedy text for
# these 30 tokens (stories15M; int8 drifts after 15-94 tokens, see bench_quality), nf4 a text of its own; the
# client's LM head in fp16 (`set dtype float16`, an alias) and `sepal model generate --dtype f16` too; a deep prompt-tuning
# step through an int8 server has a finite loss that falls; a bad --dtype is refused.
. "$(dirname "$0")/lib.bash"
M="${SEPAL_STORIES15M_DIR:?}"
S="$SEPAL_BIN_DIR/server/sepal-server"
if [ ! -f "$M/model.safetensors" ]; then
    bad "$M: no converted stories15M; run scripts/fetch-model.sh first"
    finish
fi
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; rm -rf "$TMP"' EXIT
start() { # start DTYPE: a server of all blocks, its port in $PORT
    "$S" --model "$M" --blocks 0:6 --dtype "$1" --no-measure > "$TMP/srv.$1" 2>&1 &
    PIDS+=($!)
    for i in $(seq 200); do grep -q "^sepal-server: serving" "$TMP/srv.$1" && break; sleep 0.05; done
    PORT=$(grep -o 'ws://127.0.0.1:[0-9]*' "$TMP/srv.$1" | cut -d: -f3)
}
gen() { "$SEPAL" -c "load $M; ${1:-}connect 127.0.0.1:$PORT; servers; generate 'Tom had a red kite' --greedy --max-new-tokens 30" 2>/dev/null; }
start f32
want=$(gen | grep -m1 '^Tom had a red kite')
[ -n "$want" ] && ok "f32: $want" || bad "f32 generated nothing"
for d in bf16 fp16 int8 nf4; do
    start $d
    grep -qE "; $d weights, [0-9.]+ MB" "$TMP/srv.$d" && ok "$d: the server says so" || bad "$d: $(head -1 "$TMP/srv.$d")"
    out=$(gen)
    printf '%s\n' "$out" | grep -qE "^[0-9a-f]{8} .* $d " && ok "$d: servers shows it" || bad "$d: servers: $(printf '%s\n' "$out" | sed -n 2p)"
    got=$(printf '%s\n' "$out" | grep -m1 '^Tom had a red kite')
    if [ "$d" = nf4 ]; then
        [ -n "$got" ] && [ "${got#Tom had a red kite}" != "$got" ] && ok "nf4 generates: $got" || bad "nf4: '$got'"
    else
        [ "$got" = "$want" ] && ok "$d: the same greedy text as f32" || bad "$d: '$got'"
    fi
done
# the client's LM head in fp16 (the dtype setting), through the fp16 server: f32's text again
PORT=$(grep -o 'ws://127.0.0.1:[0-9]*' "$TMP/srv.fp16" | cut -d: -f3)
out=$(gen "set dtype float16; show dtype; ") # (an alias: the setting holds fp16)
got=$(printf '%s\n' "$out" | grep -m1 '^Tom had a red kite')
printf '%s\n' "$out" | grep -qE '^dtype +fp16 ' && ok "set dtype fp16: the LM head in fp16" || bad "show dtype after set dtype float16: $(printf '%s\n' "$out" | grep '^dtype')"
[ "$got" = "$want" ] && ok "fp16 LM head (set dtype fp16): the same greedy text as f32" || bad "fp16 head: '$got'"
# the model run locally in fp16 (blocks and LM head)
got=$("$SEPAL" model generate "$M" --prompt 'Tom had a red kite' --temperature 0 --max-new-tokens 30 --dtype f16 2>/dev/null |
    grep -m1 '^Tom had a red kite')
[ "$got" = "$want" ] && ok "sepal model generate --dtype f16 (fp16's alias): the same greedy text as f32" || bad "model generate f16: '$got'"
# training through the int8 server: the backward to the input runs on the decoded weights
PORT=$(grep -o 'ws://127.0.0.1:[0-9]*' "$TMP/srv.int8" | cut -d: -f3)
out=$("$SEPAL" -c "load $M; connect 127.0.0.1:$PORT; train sst2 --tuning deep_ptune --max-steps 12 --eval-batches 1 --lr 3e-2" 2>&1)
first=$(printf '%s\n' "$out" | grep -m1 -oE 'step 1/[0-9]+: loss [0-9.]+' | awk '{print $NF}')
last=$(printf '%s\n' "$out" | grep -oE 'step [0-9]+/[0-9]+: loss [0-9.]+' | tail -3 | awk '{s += $NF} END {print s / NR}')
if [ -n "$first" ] && [ -n "$last" ] && awk "BEGIN {exit !($last < $first)}"; then
    ok "int8: deep prompt tuning's loss falls ($first -> mean of the last 3: $last)"
else
    bad "int8 training: first '$first', last '$last'"; printf '%s\n' "$out" | tail -3 | sed 's/^/    /'
fi
# a checkpoint holding a weight fp16 cannot hold: refused at load, naming the tensor, the weight and its value
mkdir -p "$TMP/big" && cp "$M"/* "$TMP/big/"
python3 - "$TMP/big/model.safetensors" <<'EOF'
import json, struct, sys
f = open(sys.argv[1], "r+b")
n = struct.unpack("<Q", f.read(8))[0]
t = json.loads(f.read(n))["model.layers.3.mlp.down_proj.weight"]
f.seek(8 + n + t["data_offsets"][0] + 4 * (7 * t["shape"][1] + 12))
f.write(struct.pack("<f", 70000.0))
EOF
expect 2 "fp16: a weight beyond 65504 is refused at load" \
    "^sepal-server: block 3 to fp16: model.layers.3.mlp.down_proj.weight: weights: \[288, 768\]: weight \(7, 12\) = 70000 is beyond fp16's largest finite value 65504" \
    -- "$S" --model "$TMP/big" --blocks 0:6 --dtype fp16 --no-measure
expect 2 "a bad --dtype is refused" "--dtype: 'int4' is not one of f32, bf16, fp16, int8, nf4" -- "$S" --model "$M" --blocks 0:6 --dtype int4
finish
