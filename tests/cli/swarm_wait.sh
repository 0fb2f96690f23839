#!/usr/bin/env bash
# Blocks without a server, through real processes on loopback (`sepal -c` against sepal-server processes):
#  - a server for blocks 3:6 is joining (announced, still loading: SEPAL_SERVER_LOAD_DELAY): `generate` says at each
#    retry that block 3 has no online server yet, who is joining and when the next try comes, and prints the
#    prompt only with the first token, after those lines; the text is the same greedy text as with every server up;
#  - the server of 3:6 killed (its record still fresh in the DHT) and nobody joining: `generate` fails at once
#    with the reason (no online server holds block 3, and none is joining), prints no prompt, waits no retry.
. "$(dirname "$0")/lib.bash"
need_stories15M
M=$SEPAL_STORIES15M_DIR
S="$SEPAL_BIN_DIR/server/sepal-server"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; rm -rf "$TMP"' EXIT
# serving NAME: waits (30 s at most) for the server's serving line in $TMP/NAME.out
serving() {
    local i
    for i in $(seq 600); do grep -q "^sepal-server: serving" "$TMP/$1.out" && return 0; sleep 0.05; done
    bad "server $1 did not start: $(tail -2 "$TMP/$1.err")"
    finish
}
"$S" --model "$M" --blocks 0:3 --new-swarm --no-measure > "$TMP/a.out" 2> "$TMP/a.err" &
pids+=($!)
serving a
PEER=127.0.0.1:$(grep -oE 'DHT 127\.0\.0\.1:[0-9]+' "$TMP/a.out" | cut -d: -f2)
WANT=$("$SEPAL" -c "load $M; swarm up 2; generate 'Tom had a red kite' --greedy --max-new-tokens 12" 2>/dev/null)

# the server of 3:6 announces itself joining, then loads for 8 s
SEPAL_SERVER_LOAD_DELAY=8 "$S" --model "$M" --blocks 3:6 --initial-peers "$PEER" --no-measure > "$TMP/b.out" 2> "$TMP/b.err" &
B=$!
pids+=($B)
# until a client finds it joining (its record has reached the swarm's DHT)
for i in $(seq 100); do
    "$SEPAL" -c "load $M; connect --initial-peers $PEER; servers" 2>/dev/null | grep -qE " 3:6 +joining " && break
    sleep 0.05
done
"$SEPAL" -c "load $M; connect --initial-peers $PEER; generate 'Tom had a red kite' --greedy --max-new-tokens 12" \
    > "$TMP/wait" 2>&1
rc=$?
[ $rc -eq 0 ] && ok "waiting for a joining server: generate exits 0" || bad "waiting: exit $rc: $(tail -3 "$TMP/wait")"
line='^sepal: no online server holds block 3 \(of 0\.\.5\) yet; server [0-9a-f]{16} \(blocks 3:6\) is joining; retry'
n=$(grep -cE "$line [0-9]+ of 8 (now|in [0-9]+ s)$" "$TMP/wait")
[ "$n" -ge 2 ] && ok "a line at each retry: block 3 has no server yet, who is joining, when the next try is ($n)" ||
    { bad "waiting: $n retry lines"; sed 's/^/    | /' "$TMP/wait"; }
grep -qE "$line 1 of 8 now$" "$TMP/wait" && grep -qE "$line 2 of 8 in 1 s$" "$TMP/wait" &&
    ok "the retries' times: now, then in 1 s" || bad "waiting: the first retries' times"
first_retry=$(grep -nE "$line" "$TMP/wait" | head -1 | cut -d: -f1)
prompt=$(grep -n '^Tom had a red kite' "$TMP/wait" | head -1 | cut -d: -f1)
[ -n "$prompt" ] && [ -n "$first_retry" ] && [ "$prompt" -gt "$(grep -nE "$line" "$TMP/wait" | tail -1 | cut -d: -f1)" ] &&
    ok "the prompt comes with the text, after the waiting lines (line $prompt)" ||
    { bad "the prompt came before the wait ended"; sed 's/^/    | /' "$TMP/wait"; }
got=$(grep '^Tom had a red kite' "$TMP/wait")
[ -n "$WANT" ] && [ "$got" = "$WANT" ] && ok "the same greedy text as with every server up" ||
    bad "text '$got', want '$WANT'"

# the server of 3:6 killed: its record stays fresh in the DHT for a while, nobody else holds 3:6, nobody joins
kill -9 $B
wait $B 2>/dev/null
"$SEPAL" -c "load $M; connect --initial-peers $PEER; generate 'Hi' --max-new-tokens 12" > "$TMP/none" 2>&1
rc=$?
[ $rc -eq 1 ] && ok "no server for 3:6, none joining: generate fails (exit 1)" || bad "none: exit $rc"
# (the dead server's failure, if a request met it, else its ping found it down before any request)
why="(127\.0\.0\.1:[0-9]+ \(blocks 3:6\): .*; no other server|no online server) holds block 3 \(of 0\.\.5\)"
grep -qE "^sepal: generate: no server could run blocks 0:6: $why, and none is joining$" "$TMP/none" &&
    ok "... at once, saying why" || { bad "none: the error"; sed 's/^/    | /' "$TMP/none"; }
grep -q "^Hi" "$TMP/none" && bad "the prompt was printed before the failure" || ok "no prompt printed before it"
n=$(grep -cE "retry [0-9]+ of 8" "$TMP/none")
[ "$n" -le 1 ] && ok "no retry waited for ($n retry line: the dead server's own failure)" ||
    { bad "$n retry lines"; sed 's/^/    | /' "$TMP/none"; }
grep -qE "nothing listens there now" "$TMP/none" || [ "$n" -eq 0 ] && ok "the dead server's address is down" ||
    bad "the failure line does not say the address is down"
finish
