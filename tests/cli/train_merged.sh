#!/usr/bin/env bash
# Three trainings at once through one sepal-server (stories15M, every block, each answer 400 ms late: the server is
# the bottleneck; a client has one request in flight, so while one is served the other two wait together, and
# merge into a pass): every step's
# loss and gradient norm, as `train --log` writes them (JSON numbers, every bit), equal those of the same runs made
# one after the other through a --no-batch server; the first server's metrics count the merged passes.
. "$(dirname "$0")/lib.bash"
M="${SEPAL_STORIES15M_DIR:?}"
SERVER="$SEPAL_BIN_DIR/server/sepal-server"
export SEPAL_CACHE="$TMP/cache"
[ -f "$M/model.safetensors" ] || { bad "$M: no converted stories15M; run scripts/fetch-model.sh first"; finish; }

# start NAME FAULT ARGS...: a server of every block (SEPAL_SERVER_FAULT=FAULT); its ws port in $PORT, its metrics
# URL in $MURL
start() {
    local name=$1 fault=$2
    shift 2
    SEPAL_SERVER_FAULT=$fault "$SERVER" --model "$M" --blocks 0: --no-measure --new-swarm --metrics 127.0.0.1:0 "$@" \
        > "$TMP/$name.out" 2> "$TMP/$name.err" &
    PIDS="${PIDS:-} $!"
    for _ in $(seq 150); do grep -q "ws://" "$TMP/$name.out" 2>/dev/null && break; sleep 0.1; done
    PORT=$(grep -o 'ws://127.0.0.1:[0-9]*' "$TMP/$name.out" | cut -d: -f3)
    MURL=$(grep -o 'metrics at http://127.0.0.1:[0-9]*/metrics' "$TMP/$name.out" | cut -d' ' -f3)
}
trap 'kill $PIDS 2>/dev/null; rm -rf "$TMP"' EXIT
start merging slow:400
P1=$PORT M1=$MURL
start alone '' --no-batch
P2=$PORT
[ -n "$P1" ] && [ -n "$P2" ] && ok "two servers up (ports $P1, $P2)" ||
    { bad "a server did not start: $(cat "$TMP"/*.err)"; finish; }

# train PORT SEED LOG: 2 steps of deep prompt tuning on a text (causal LM: every batch of the same length, so that
# the two runs' requests can merge; 4 microbatches, all in flight) through the server at PORT
for i in $(seq 1 40); do echo "Once upon a time there was a cat named Tom. Tom liked to play in the sun with his ball."; done > "$TMP/story.txt"
train() {
    "$SEPAL" -c "load $M; connect 127.0.0.1:$1; train causal_lm --args 'file=$TMP/story.txt length=32' \
        --tuning deep_ptune --pre-seq-len 4 --batch 8 --max-length 32 --max-steps 2 --eval-batches 1 --seed $2 --schedule afab --max-in-flight 4 \
        --log $TMP/$3.jsonl" > "$TMP/$3.out" 2>&1
}
train "$P1" 3 a & A=$!
train "$P1" 4 b & B=$!
train "$P1" 5 c & C=$!
wait $A && wait $B && wait $C && ok "three trainings at once through one server" ||
    { bad "a training failed: $(tail -3 "$TMP/a.out" "$TMP/b.out" "$TMP/c.out")"; finish; }
train "$P2" 3 a1 && train "$P2" 4 b1 && train "$P2" 5 c1 && ok "the same trainings one after the other (--no-batch)" ||
    { bad "a training alone failed: $(tail -3 "$TMP/a1.out" "$TMP/b1.out" "$TMP/c1.out")"; finish; }

# steps LOG: each step's "step", "loss" and "grad_norm" as written
steps() { grep -o '"step":[0-9]*\|"loss":[^,}]*\|"grad_norm":[^,}]*' "$TMP/$1.jsonl" | paste -sd' '; }
for r in a b c; do
    got=$(steps $r) want=$(steps ${r}1)
    n=$(grep -o '"loss"' <<< "$got" | wc -l)
    [ "$n" -ge 2 ] && [ "$got" = "$want" ] && ok "run $r: $n steps' losses and gradient norms as alone" ||
        bad "run $r differs from alone: '$got' vs '$want'"
done
fwd=$(curl -s "$M1" | awk '$1 == "sepal_batched_passes_total{kind=\"forward\"}" { print $2 }')
bwd=$(curl -s "$M1" | awk '$1 == "sepal_batched_passes_total{kind=\"backward\"}" { print $2 }')
[ "${fwd:-0}" -ge 1 ] && [ "${bwd:-0}" -ge 1 ] && ok "merged passes counted: $fwd forward, $bwd backward" ||
    bad "no merged passes: forward '${fwd:-}', backward '${bwd:-}'"
finish
