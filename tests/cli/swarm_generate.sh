#!/usr/bin/env bash
# End to end through real processes: `sepal -c` loads a model's local parts, starts a loopback swarm of
# sepal-server processes, and generates through it. stories15M (3 servers x 2 blocks) must print exactly
# what llama2.c's run.c printed; the tiny checkpoints of every family (2 servers) must give their golden greedy ids.
. "$(dirname "$0")/lib.bash"
M="${SEPAL_STORIES15M_DIR:?}"
G="$SEPAL_TEST_DATA/stories15M/golden.jsonl"
GQA="$SEPAL_TEST_DATA/hf-tiny/llama-gqa"
export SEPAL_SERVER_BIN="$SEPAL_BIN_DIR/server/sepal-server"
export SEPAL_CACHE="$TMP/cache" # the servers' throughput cache: fresh, so they measure for real

if [ ! -f "$M/model.safetensors" ]; then
    bad "$M: no converted stories15M; run scripts/fetch-model.sh first"
    finish
fi

# One app session: the swarm stays up for all five golden prompts.
script="load $M; swarm up 3"
n=$(wc -l < "$G")
for i in $(seq 0 $((n - 1))); do
    python3 - "$G" "$i" "$TMP/want$i" > "$TMP/args$i" <<'PY'
import json, sys, shlex
d = [json.loads(l) for l in open(sys.argv[1])][int(sys.argv[2])]
open(sys.argv[3], "w").write(d["text"])
print(shlex.quote(d["prompt"]), "--max-new-tokens", d["steps"] - len(d["prompt_ids"]) + 1)
PY
    script="$script; echo ==$i==; generate $(cat "$TMP/args$i")"
done
script="$script; servers; servers -l; servers --long; route; swarm down"
"$SEPAL" -c "$script" > "$TMP/out" 2> "$TMP/err"
rc=$?
[ $rc -eq 0 ] && ok "swarm session exits 0" || { bad "swarm session exit $rc"; tail -5 "$TMP/err"; }
for i in $(seq 0 $((n - 1))); do
    # the text between ==i== and the next marker (or the servers table)
    awk -v s="==$i==" -v e="==$((i + 1))==" '$0==s{on=1;next} $0==e||/^id +name /{on=0} on' "$TMP/out" > "$TMP/got$i"
    if cmp -s "$TMP/got$i" "$TMP/want$i"; then
        ok "stories15M line $i through 3 servers identical to run.c"
    else
        bad "stories15M line $i differs from run.c"
        diff <(fold -w 80 "$TMP/want$i") <(fold -w 80 "$TMP/got$i") | head -6 | sed 's/^/    /'
    fi
done
# (into a file: every column, the version last; a server of swarm up named `local`, as in the TUI)
grep -qE "^[0-9a-f]{8} local +127\.0\.0\.1:[0-9]+ +0:2 +online .* 0\.1\.0$" "$TMP/out" && ok "servers table lists 0:2 online" || bad "servers table"
# servers -l (and --long): every field of each record, one block per server, nothing cut
awk '/^server [0-9a-f]+ /{on=1} /^[0-9]+:[0-9]+ 127\.0\.0\.1/{on=0} on' "$TMP/out" > "$TMP/long"
nlong=$(grep -cE "^server [0-9a-f]{16} \(local: started by swarm up\)$" "$TMP/long")
[ "$nlong" -eq 6 ] && ok "servers -l and --long: 3 servers each, full ids" ||
    bad "servers -l: $nlong server blocks, want 6"
for f in "name        local \(no --public-name\)" "address     ws://127\.0\.0\.1:[0-9]+" "dht node    127\.0\.0\.1:[0-9]+" \
         "model       stories15M \(config [0-9a-f]{16}, 6 blocks\)" "state       online" \
         "throughput  [0-9]+\.[0-9] tokens/s per block" \
         "rps         inference [0-9.]+ steps/s, forward [0-9.]+ tokens/s, network [0-9.]+ tokens/s" \
         "dtype       f32" "quant       none" "cache left  [0-9]+ tokens" \
         "queue wait  [0-9.e+-]+ s \(new sessions refused over 5 s\)" \
         "ping        ([0-9.]+ (ms|us)|-) \(from this app\)" \
         "version     0\.1\.0" "announced   [0-9]+\.[0-9] s ago \(every [0-9]+ s\)"; do
    n=$(grep -cE "^  $f$" "$TMP/long")
    [ "$n" -eq 6 ] && ok "servers -l shows /$f/ for each server" || bad "servers -l: /$f/ $n times, want 6"
done
for span in "0:2 \(2\)" "2:4 \(2\)" "4:6 \(2\)"; do
    n=$(grep -cE "^  blocks      $span$" "$TMP/long")
    [ "$n" -eq 2 ] && ok "servers -l shows blocks $span" || bad "servers -l: blocks $span $n times, want 2"
done
# the servers before the last block ping their successors: each ping names one of the swarm's servers in full
id24=$(awk '/^server /{id=$2} /^  blocks      2:4/{print id; exit}' "$TMP/long")
grep -qE "^  next pings  $id24 ([0-9.]+ (ms|us)) \(127\.0\.0\.1:[0-9]+, blocks 2:4\)$" "$TMP/long" &&
    ok "servers -l: 0:2's next-hop ping to 2:4's server ($id24)" || bad "servers -l: no next-hop ping to $id24"
n=$(grep -cE "^  next pings  none$" "$TMP/long")
[ "$n" -eq 2 ] && ok "servers -l: the last block's server pings nobody" ||
    bad "servers -l: 'next pings none' $n times, want 2"

# a server's --public-name, whole in servers --long (the table cuts it), through connect --initial-peers
"$SEPAL_SERVER_BIN" --model "$M" --blocks 0:6 --new-swarm --public-name alice-with-a-long-public-name --no-measure \
    --port 0 > "$TMP/named.out" 2> "$TMP/named.err" &
named=$!
for _ in $(seq 100); do grep -q "^sepal-server: serving" "$TMP/named.out" && break; sleep 0.1; done
dht=$(grep -oE "DHT 127\.0\.0\.1:[0-9]+" "$TMP/named.out" | head -1 | cut -d' ' -f2)
# connect waits for the view's first round: the server is listed at once, no sleep
"$SEPAL" -c "load $M; connect --initial-peers $dht; servers; servers --long" > "$TMP/named" 2>&1
grep -qE "^joined the swarm through $dht \(DHT node on 127\.0\.0\.1:[0-9]+\): 1 server seen$" "$TMP/named" &&
    ok "connect --initial-peers returns with the server in its view" ||
    { bad "connect --initial-peers: the join line"; head -5 "$TMP/named"; }
grep -qE "^  name        alice-with-a-long-public-name$" "$TMP/named" &&
    ok "servers --long shows the whole public name" ||
    { bad "servers --long lacks the public name"; tail -5 "$TMP/named"; }
grep -qE "^[0-9a-f]{8} alice-with-a +127\.0\.0\.1:[0-9]+ +0:6 +online " "$TMP/named" && ok "servers cuts it to 12" ||
    bad "servers table row of the named server"
grep -qE "^server [0-9a-f]{16}$" "$TMP/named" && ok "servers --long: a server not started here" ||
    bad "servers --long id line"
kill "$named"; wait "$named"
hop="127\.0\.0\.1:[0-9]+ \([0-9.]+ ms\)"
grep -qE "^0:2 $hop -> 2:4 $hop -> 4:6 $hop \+ [0-9.]+ ms local; [0-9]+ steps/s expected$" "$TMP/out" &&
    ok "route 0:2 -> 2:4 -> 4:6 with latencies" || bad "route"
grep -q "stopped" "$TMP/err" && ok "swarm down stops the servers" || bad "swarm down"

# The tiny checkpoints (no tokenizer): ids in, ids out, against the golden greedy.output (transformers' for
# llama-gqa, bloom, falcon-new, mixtral; tools/hf_reference.py's for falcon-7b), through `swarm up 2`.
golden_greedy() {
    python3 -c "
import struct, json
f = open('$1/golden.safetensors', 'rb'); n = struct.unpack('<Q', f.read(8))[0]; h = json.loads(f.read(n)); base = 8 + n
def ids(name):
    e = h[name]; f.seek(base + e['data_offsets'][0]); b = f.read(e['data_offsets'][1] - e['data_offsets'][0])
    return list(struct.unpack('<%dq' % (len(b) // 8), b))
print(','.join(map(str, ids('greedy.prompt'))), ' '.join(map(str, ids('greedy.output'))))"
}
for m in llama-gqa bloom falcon-new falcon-7b mixtral; do
    want=$(golden_greedy "$SEPAL_TEST_DATA/hf-tiny/$m")
    prompt=${want%% *}
    out=${want#* }
    expect 0 "$m through a swarm of 2 gives the golden greedy ids" "^$out\$" -- \
        "$SEPAL" -c "load $SEPAL_TEST_DATA/hf-tiny/$m; swarm up 2; route; generate --ids $prompt --max-new-tokens 16; swarm down"
done

# sampling with a seed is reproducible through the swarm, and differs with another seed
s1=$("$SEPAL" -c "load $M; swarm up 2 --blocks-per-server 3; generate 'The dog' --temperature 0.9 --top-k 40 --seed 5 --max-new-tokens 30; generate 'The dog' --temperature 0.9 --top-k 40 --seed 5 --max-new-tokens 30; generate 'The dog' --temperature 0.9 --top-k 40 --seed 6 --max-new-tokens 30" 2>/dev/null)
l1=$(sed -n 1p <<< "$s1"); l2=$(sed -n 2p <<< "$s1"); l3=$(sed -n 3p <<< "$s1")
[ -n "$l1" ] && [ "$l1" = "$l2" ] && ok "same seed, same text" || bad "seeded sampling not reproducible: '$l1' vs '$l2'"
[ "$l1" != "$l3" ] && ok "another seed, another text" || bad "different seeds gave the same text"

# beams through the swarm equal the local runner's beams (the C suite compares them token by token; here
# the command runs end to end)
expect 0 "beam search through the swarm" "^Once upon a time" -- \
    "$SEPAL" -c "load $M; swarm up 3; generate 'Once upon a time' --beams 3 --max-new-tokens 20"
expect 0 "stop string cuts the text" "^Once upon a time, there was a little girl named Lily\.$" -- \
    "$SEPAL" -c "load $M; swarm up 3; generate 'Once upon a time' --stop ' She' --max-new-tokens 60"

# a server restarted on the same address (kill -9, then the same --port: a new id, the old record still in the
# DHT): `servers` shows one row per server, `route` one chain, and the greedy text is the same as before
S="$SEPAL_BIN_DIR/server/sepal-server"
"$S" --model "$M" --blocks 0:3 --new-swarm --no-measure > "$TMP/ra.out" 2>&1 &
RA=$!
for i in $(seq 200); do grep -q "^sepal-server: serving" "$TMP/ra.out" && break; sleep 0.05; done
DA=$(grep -oE 'DHT 127\.0\.0\.1:[0-9]+' "$TMP/ra.out" | cut -d: -f2)
"$S" --model "$M" --blocks 3:6 --initial-peers "127.0.0.1:$DA" --no-measure > "$TMP/rb.out" 2>&1 &
RB=$!
for i in $(seq 200); do grep -q "^sepal-server: serving" "$TMP/rb.out" && break; sleep 0.05; done
PB=$(grep -oE 'ws://127\.0\.0\.1:[0-9]+' "$TMP/rb.out" | cut -d: -f3)
mkfifo "$TMP/rin"
"$SEPAL" < "$TMP/rin" > "$TMP/rout" 2> "$TMP/rerr" &
RS=$!
exec 4> "$TMP/rin"
trap 'exec 4>&-; kill $RA $RB $RS 2>/dev/null; rm -rf "$TMP"' EXIT
# wait_n N PATTERN FILE: until FILE has N lines matching PATTERN (60 s at most)
wait_n() {
    local i
    for i in $(seq 1200); do [ "$(grep -cE -- "$2" "$3")" -ge "$1" ] && return 0; sleep 0.05; done
    return 1
}
trap '' PIPE # a session that ended early: the writes below fail, the checks say why
echo "load $M; connect --initial-peers 127.0.0.1:$DA" >&4
wait_n 1 "^server [0-9a-f]+ joined: blocks 0:3" "$TMP/rerr" &&
    wait_n 1 "^server [0-9a-f]+ joined: blocks 3:6" "$TMP/rerr" ||
    bad "restart: the client did not find both servers: $(tail -2 "$TMP/rerr")"
echo "generate 'Tom had a red kite' --greedy --max-new-tokens 12" >&4
wait_n 1 "; stop: " "$TMP/rerr" || bad "restart: the first generation: $(tail -2 "$TMP/rerr")"
kill -9 $RB
{ wait $RB; } 2>/dev/null
"$S" --model "$M" --blocks 3:6 --port "$PB" --initial-peers "127.0.0.1:$DA" --no-measure > "$TMP/rb.out" 2>&1 &
RB=$!
wait_n 2 "^server [0-9a-f]+ joined: blocks 3:6" "$TMP/rerr" || bad "restart: the client never saw the new record"
echo "generate 'Tom had a red kite' --greedy --max-new-tokens 12; servers; route; quit" >&4
exec 4>&-
wait $RS
rc=$?
[ $rc -eq 0 ] && ok "restart: the session exits 0" || bad "restart: exit $rc: $(tail -3 "$TMP/rerr")"
n=$(grep -cE "^[0-9a-f]{8} .* 127\.0\.0\.1:$PB +3:6 " "$TMP/rout")
rows=$(grep -cE "^[0-9a-f]{8} " "$TMP/rout")
[ "$n" -eq 1 ] && [ "$rows" -eq 2 ] && ok "restart: servers shows one row per server" ||
    bad "restart: $n rows for :$PB, $rows in all"
grep -vE "^(Tom had|id |[0-9a-f]{8} )" "$TMP/rout" > "$TMP/rroute"
hop="127\.0\.0\.1:[0-9]+ \([0-9.]+ ms\)"
grep -qE "^0:3 $hop -> 3:6 127\.0\.0\.1:$PB \([0-9.]+ ms\) \+ [0-9.]+ ms local; [0-9]+ steps/s expected$" "$TMP/rroute" &&
    [ "$(wc -l < "$TMP/rroute")" -eq 1 ] && ok "restart: route prints one chain" ||
    { bad "restart: route"; sed 's/^/    /' "$TMP/rroute"; }
t1=$(grep '^Tom had' "$TMP/rout" | head -1); t2=$(grep '^Tom had' "$TMP/rout" | tail -1)
[ "$(grep -c '^Tom had' "$TMP/rout")" -eq 2 ] && [ "$t1" = "$t2" ] && ok "restart: the same greedy text" ||
    bad "restart: '$t1' vs '$t2'"
kill $RA $RB 2>/dev/null
wait $RA $RB 2>/dev/null

# errors: clear message, non-zero exit, no crash
expect 1 "generate before load" "no model loaded" -- "$SEPAL" -c "generate hello"
expect 1 "generate without servers" "no servers" -- "$SEPAL" -c "load $M; generate hello"
expect 1 "unreachable server" "127\.0\.0\.1:1" -- "$SEPAL" -c "load $M; connect 127.0.0.1:1"
expect 1 "bad address" "HOST:PORT" -- "$SEPAL" -c "connect nowhere"
expect 1 "swarm up without a model" "no model loaded" -- "$SEPAL" -c "swarm up 2"
expect 1 "too many servers for the blocks" "9 servers for 4 blocks leave some without a block" -- "$SEPAL" -c "load $GQA; swarm up 9"
expect 1 "ids outside the vocabulary" "outside the vocabulary" -- "$SEPAL" -c "load $GQA; swarm up 1; generate --ids 1,99999"
expect 1 "text prompt without a tokenizer" "no tokenizer" -- "$SEPAL" -c "load $GQA; swarm up 1; generate hello"
expect 1 "bad option" "unknown option '--bogus'" -- "$SEPAL" -c "load $M; swarm up 1; generate hi --bogus 3"
# no server process is left behind by any of the above
sleep 0.5
left=$(pgrep -f "sepal-server --model .*(stories15M|hf-tiny)" -u "$(id -u)" -P $$ | wc -l)
[ "$left" -eq 0 ] && ok "no sepal-server left running" || bad "$left sepal-server processes left"
finish
