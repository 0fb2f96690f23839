#!/usr/bin/env bash
# Every error a new user meets, table-driven: the exact message, exit status 1 (2 for usage), and nothing
# half-done: no file written, no server left, and the swarm still usable after each one (one session, -k).
. "$(dirname "$0")/lib.bash"
M="${SEPAL_STORIES15M_DIR:?}"
G="$SEPAL_TEST_DATA/hf-tiny/llama-gqa"
S="$SEPAL_BIN_DIR/server/sepal-server"
export SEPAL_SERVER_BIN="$S"
if [ ! -f "$M/model.safetensors" ]; then
    bad "$M: no converted stories15M; run scripts/fetch-model.sh first"
    finish
fi
cd "$TMP"
LONG=$(python3 -c 'print(" ".join(["once upon a time there was a big dog"] * 40))')

# ---- one session: each row of the table is a command that must fail with its message; -k goes on --------
# rows: command | the message (an extended regex)
cat > "$TMP/table" <<EOF
generate "$LONG"|generate: the prompt has [0-9]+ tokens, more than the model's context of 256
generate hi --top-p 2|generate: --top-p: expected a number in \(0, 1\], got '2'
generate hi --temperature -1|generate: --temperature: expected a number in \[0, 100\], got '-1'
generate hi --beams 0|generate: --beams: expected an integer in \[1, 64\], got '0'
generate hi --max-new-tokens lots|generate: --max-new-tokens: expected an integer in \[0, 1048576\], got 'lots'
generate hi --tuning head|generate: '--tuning' is an option of train, not of generate
generate hi --bogus|generate: unknown option '--bogus' \(its options: --max-new-tokens, 
generate hi there|generate: unexpected argument 'there' \(usage: generate PROMPT; quote arguments with blanks\)
generate hi --prompts nope.safetensors|generate: --prompts: nope.safetensors: No such file
generate hi --prompts $TMP/garbage|generate: --prompts: .*garbage
eval sst2 --lr 3|eval: '--lr' is an option of train, not of eval
eval sst2 --save x.safetensors|eval: '--save' is an option of train, not of eval
train sst2 --tuning bogus|train: --tuning: 'bogus' is not one of head, ptune, deep_ptune
train sst2 --save $TMP/exists.safetensors --max-steps 1|train: --save .*exists.safetensors: the file exists \(add --overwrite to replace it\)
train nosuchtask|train: unknown task 'nosuchtask' \(tasks: sst2, causal_lm
train sst2 --args data=${SEPAL_SENTIMENT_DIR:-} --max-length 250 --pre-seq-len 16|train: 16 prompt positions \+ max_length 250 exceed the model's context of 256$
set temprature 1|set: unknown setting 'temprature' \(did you mean temperature\?
set s 1|set: ambiguous setting 's': seed, stop
set top-p 0|set: top-p: expected a number in \(0, 1\], got '0'
s|ambiguous command 's': set, show, sleep, swarm, servers
frobnicate|unknown command 'frobnicate' \(try 'help'\)
swarm up 3|a swarm is already up \(swarm down first\)
swarm sideways|swarm: unknown subcommand 'sideways' \(one of: up, down\)
swarm|swarm: which one\? usage: swarm up\|down
connect 127.0.0.1:1|127.0.0.1:1: connection refused \(no server listens there\)
connect nosuchhost.invalid:80|nosuchhost.invalid:80: no such host
connect 127.0.0.1:NOTSEP|127.0.0.1:NOTSEP: not a sepal server
connect 127.0.0.1:GQAPORT|127.0.0.1:GQAPORT serves llama-gqa \(config [0-9a-f]+, 4 blocks\), but the loaded model is stories15M \(config [0-9a-f]+, 6 blocks\)
load $TMP/nope|$TMP/nope.*No such file
load $TMP|$TMP: not a model directory \(no config.json\)$
generate --ids 1,99999|generate: token id 99999 outside the vocabulary \(0\.\.31999\)$
genrate hi|unknown command 'genrate' \(did you mean generate\?\)$
generate hi --temprature 1|generate: unknown option '--temprature' \(did you mean --temperature\?\)$
help frobnicate|help: unknown command 'frobnicate'
EOF
echo "not a safetensors file" > "$TMP/garbage"
echo "keep me" > "$TMP/exists.safetensors"
# a TCP port that answers, but not as a websocket server; a server of another model
python3 -c '
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", 0)); s.listen(8)
print(s.getsockname()[1], flush=True)
s.settimeout(1)
end = time.time() + 120
while time.time() < end:
    try:
        c, _ = s.accept()
    except socket.timeout:
        continue
    c.recv(1000); c.send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi"); c.close()
' > "$TMP/notsep.port" &
NOTSEP_PID=$!
"$S" --model "$G" --blocks 0:4 --no-measure > "$TMP/gqa.out" 2>&1 &
GQA_PID=$!
trap 'kill $NOTSEP_PID $GQA_PID 2>/dev/null; rm -rf "$TMP"' EXIT
for i in $(seq 200); do [ -s "$TMP/notsep.port" ] && grep -q "^sepal-server: serving" "$TMP/gqa.out" && break; sleep 0.05; done
NOTSEP=$(cat "$TMP/notsep.port")
GQAPORT=$(grep -o 'ws://127.0.0.1:[0-9]*' "$TMP/gqa.out" | cut -d: -f3)
sed -i "s/NOTSEP/$NOTSEP/g; s/GQAPORT/$GQAPORT/g" "$TMP/table"

args=(-k -c "load $M; swarm up 3" -c "generate 'Tom had a red kite' --greedy --max-new-tokens 20")
while IFS='|' read -r cmd msg; do args+=(-c "$cmd"); done < "$TMP/table"
args+=(-c "generate 'Tom had a red kite' --greedy --max-new-tokens 20" -c "servers")
"$SEPAL" "${args[@]}" > "$TMP/out" 2> "$TMP/err" &
SESSION=$!
for i in $(seq 400); do grep -q "^3 servers" "$TMP/err" && break; sleep 0.05; done
kids=$(pgrep -P "$SESSION" -f sepal-server | tr '\n' ' ')
wait "$SESSION"
rc=$?
[ $rc -eq 1 ] && ok "a session of failing commands under -k exits 1" || bad "session exit $rc, expected 1"
while IFS='|' read -r cmd msg; do
    grep -qE -- "^sepal: $msg" "$TMP/err" && ok "$cmd" || { bad "$cmd: no /sepal: $msg/"; grep -iF -- "$(echo "$cmd" | cut -c1-12)" "$TMP/err" | head -2 | sed 's/^/    /'; }
done < "$TMP/table"
n=$(grep -c 'stop: length' "$TMP/err")
[ "$n" -eq 2 ] && ok "the swarm still generates after all of them" || bad "$n of 2 generations"
first=$(grep -m1 '^Tom had a red kite' "$TMP/out"); last=$(grep '^Tom had a red kite' "$TMP/out" | tail -1)
[ -n "$first" ] && [ "$first" = "$last" ] && ok "the same text before and after" || bad "texts differ: '$first' / '$last'"
n=$(grep -cE '^[0-9a-f]{8} local .* online .* 0\.1\.0$' "$TMP/out")
[ "$n" -eq 3 ] && ok "3 servers online at the end" || bad "$n servers online at the end"
[ "$(cat "$TMP/exists.safetensors")" = "keep me" ] && ok "--save did not touch an existing file" || bad "--save overwrote a file"
[ ! -e "$TMP/x.safetensors" ] && ok "eval --save wrote nothing" || bad "eval --save wrote a file"
grep -q 'prompt has' "$TMP/out" && bad "the over-long prompt was echoed before the refusal" || ok "an over-long prompt is refused before anything is printed"
grep -qE '(\w+: )\1' "$TMP/err" && bad "a message says its prefix twice: $(grep -E '(\w+: )\1' "$TMP/err" | head -1)" ||
    ok "no message says its prefix twice"
sleep 0.5
left=0
for k in $kids; do kill -0 "$k" 2>/dev/null && left=$((left + 1)); done
[ -n "$kids" ] && [ "$left" -eq 0 ] && ok "no server left after the session" || bad "servers '$kids': $left left"

# ---- what generation says of itself: each thing once, in words ----------------------------------------------
# one prompt token (not "1 prompt tokens"), and sampling options at temperature 0: one warning, not silence
"$SEPAL" -c "load $M; swarm up 1; generate --ids 1 --max-new-tokens 1000 --top-p 0.5 --seed 3" > "$TMP/g.out" 2> "$TMP/g.err"
rc=$?
[ $rc -eq 0 ] && ok "generate --ids 1 exits 0" || bad "generate --ids 1: exit $rc"
grep -qx "sepal: warning: --max-new-tokens 1000: 1 prompt token leaves room for 256 in the context of 256" "$TMP/g.err" &&
    ok "the clamp says '1 prompt token leaves room'" || bad "the clamp: $(grep 'max-new' "$TMP/g.err")"
grep -qE "^sepal: 1 prompt token in [0-9.]+ s" "$TMP/g.err" && ok "the figures say '1 prompt token'" ||
    bad "the figures: $(grep 'prompt' "$TMP/g.err")"
W="sepal: warning: --top-p, --seed have no effect at temperature 0 (greedy decoding; sampling needs --temperature above 0)"
[ "$(grep -cxF "$W" "$TMP/g.err")" -eq 1 ] && [ "$(grep -c 'no effect' "$TMP/g.err")" -eq 1 ] &&
    ok "sampling options at temperature 0: one warning" || bad "sampling at temperature 0: $(grep -c 'no effect' "$TMP/g.err") warnings"
"$SEPAL" model generate "$M" --prompt "Once" --top-k 5 --max-new-tokens 4 > /dev/null 2> "$TMP/mg.err"
grep -qxF "sepal: warning: --top-k has no effect at temperature 0 (greedy decoding; sampling needs --temperature above 0)" \
    "$TMP/mg.err" && ok "model generate warns the same way" || bad "model generate --top-k at 0: $(head -2 "$TMP/mg.err")"
"$SEPAL" model generate "$M" --prompt "Once" --top-k 5 --temperature 0.7 --max-new-tokens 4 > /dev/null 2> "$TMP/mg.err"
grep -q "no effect" "$TMP/mg.err" && bad "a warning while sampling" || ok "no warning when it samples"

# ---- the context rule: clamped with one warning -----------------------------------------------------------
expect 0 "generate clamps --max-new-tokens with one warning" \
    "warning: --max-new-tokens 1000: [0-9]+ prompt tokens leave room for [0-9]+ in the context of 256" -- \
    "$SEPAL" -c "load $M; swarm up 2; generate 'Once upon a time' --max-new-tokens 1000 --greedy"
expect 0 "model generate clamps the same way" "warning: --max-new-tokens 1000: .* in the context of 256" -- \
    "$SEPAL" model generate "$M" --prompt "Once upon a time" --max-new-tokens 1000
expect 1 "model generate refuses an over-long prompt" "the prompt has [0-9]+ tokens, more than the model's context of 256" -- \
    "$SEPAL" model generate "$M" --prompt "$LONG"

# ---- swarm up: the blocks-per-server setting that cannot cover the model, nothing started -------------------
expect 1 "swarm up: servers of K blocks that cannot cover the model" \
    "^sepal: swarm up: 2 servers of 2 blocks cannot cover the model's 6 blocks \(need at least 3 servers\)$" -- \
    "$SEPAL" -c "load $M; set blocks-per-server 2; swarm up 2"
expect 1 "swarm up: more blocks per server than the model has" \
    "^sepal: swarm up: --blocks-per-server 7 is more than the model's 6 blocks$" -- \
    "$SEPAL" -c "load $M; swarm up 2 --blocks-per-server 7"

# ---- parameters of another model ---------------------------------------------------------------------------
"$SEPAL" -c "load $M; swarm up 2; train sst2 --tuning ptune --pre-seq-len 4 --max-steps 2 --eval-batches 1 --save $TMP/p15.safetensors" > /dev/null 2>&1
[ -s "$TMP/p15.safetensors" ] && ok "train --save wrote a file" || bad "train --save wrote nothing"
expect 1 "eval --load refuses another model's file" "p15.safetensors was trained for stories15M \(config [0-9a-f]+\), not for the loaded llama-gqa" -- \
    "$SEPAL" -c "load $G; connect 127.0.0.1:$GQAPORT; eval --load $TMP/p15.safetensors"
expect 0 "eval --load needs no repeated options" "sst2: accuracy=" -- \
    "$SEPAL" -c "load $M; swarm up 2; eval --load $TMP/p15.safetensors --eval-batches 1"
expect 1 "eval --load with a contradicting --tuning" "holds --tuning ptune --pre-seq-len 4; leave those options out" -- \
    "$SEPAL" -c "load $M; swarm up 1; eval --load $TMP/p15.safetensors --tuning deep_ptune"

# ---- sepal-server --------------------------------------------------------------------------------------------
v1=$("$SEPAL" --version); v2=$("$S" --version)
[ "${v1#sepal }" = "${v2#sepal-server }" ] && ok "sepal and sepal-server print the same version ($v1)" || bad "versions: '$v1' vs '$v2'"
expect 1 "sepal-server: port in use" "^sepal-server: port $GQAPORT is in use" -- "$S" --model "$M" --blocks 0:6 --port "$GQAPORT" --no-measure
expect 2 "sepal-server: a misspelt option gets the nearest name" "^sepal-server: unknown option '--blocs' \(did you mean --blocks\?\); --help lists the options$" -- "$S" --model "$M" --blocs 0:6
expect 2 "sepal-server: a stray word" "^sepal-server: unexpected argument 'serve' \(--help lists the options\)$" -- "$S" serve --model "$M"
expect 1 "sepal-server: a foreign --host" "^sepal-server: --host 10.1.2.3: not an address of this machine" -- "$S" --model "$M" --blocks 0:6 --host 10.1.2.3 --no-measure
expect 1 "sepal-server: a foreign --source-address" "^sepal-server: --source-address 10.1.2.3: not an address of this machine" -- "$S" --model "$M" --blocks 0:6 --source-address 10.1.2.3 --no-measure
out=$("$S" --help)
for o in $(grep -oE -- '"--[a-z][a-z-]*"' "$SEPAL_SRC_DIR/server/main.c" | tr -d '"' | sort -u); do
    printf '%s\n' "$out" | grep -qE -- "^  $o([ ,]|$)" || bad "sepal-server --help lacks $o"
done
ok "sepal-server --help lists every option it parses"
finish
