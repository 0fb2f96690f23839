#!/usr/bin/env bash
# Servers behind relays (bench/linkem, 10 ms and 50 Mbit/s each way) announce the relays' addresses (`sepal-server
# --announce HOST:PORT --announce-bulk-port P`): their records carry them, the client's `servers -l` shows them, and
# the client reaches both servers, websocket and bulk channel, only through the relays (linkem's counts; the direct
# ports are never dialled by it) and generates the same text as one process; after a long prompt each link is
# measured both ways (`servers -l`). A narrow Llama-2-7B shape (`model init --like`, 4 layers of 256). Bad --announce
# options are refused before anything starts.
. "$(dirname "$0")/lib.bash"
S="$SEPAL_BIN_DIR/server/sepal-server"
L="$SEPAL_BIN_DIR/bench/linkem"
M="$TMP/l7"
narrow_llama "$M" 4

expect 2 "--announce HOST:PORT with the bulk channel on and no bulk port" \
    "^sepal-server: --announce HOST:PORT moves the websocket's port: say where clients reach the bulk channel too \(--announce-bulk-port P\), or turn it off \(--bulk-port -1\) \(--help lists the options\)$" \
    -- "$S" --model "$M" --blocks 0:2 --announce 127.0.0.1:40000
expect 2 "--announce-bulk-port alone" "^sepal-server: --announce-bulk-port goes with --announce HOST:PORT" -- \
    "$S" --model "$M" --blocks 0:2 --announce-bulk-port 40001
expect 2 "a bad --announce" "^sepal-server: --announce: expected HOST or HOST:PORT \(a port in 1\.\.65535, a host of at most 63 characters\), got '127\.0\.0\.1:x'$" \
    -- "$S" --model "$M" --blocks 0:2 --announce 127.0.0.1:x

# six free ports: each server's websocket and bulk port (the relays lead there) and its DHT port
read -r P1 Q1 D1 P2 Q2 D2 < <(python3 -c "
import socket
ss = [socket.socket() for _ in range(6)]
for s in ss: s.bind(('127.0.0.1', 0))
print(' '.join(str(s.getsockname()[1]) for s in ss))")
"$L" --delay 10 --rate 50 --listen 127.0.0.1:0 --to 127.0.0.1:$P1 --listen 127.0.0.1:0 --to 127.0.0.1:$Q1 \
    --listen 127.0.0.1:0 --to 127.0.0.1:$P2 --listen 127.0.0.1:0 --to 127.0.0.1:$Q2 > "$TMP/linkem.out" 2> "$TMP/linkem.err" &
LK=$!
trap 'kill $LK $A $B 2>/dev/null; rm -rf "$TMP"' EXIT
for _ in $(seq 100); do grep -q "^linkem: ready" "$TMP/linkem.out" && break; sleep 0.05; done
read -r R1 RB1 R2 RB2 < <(sed -n 's/^linkem: 127\.0\.0\.1:\([0-9]*\) -> .*/\1/p' "$TMP/linkem.out" | tr '\n' ' ')
[ -n "$RB2" ] && ok "four relays: $R1 -> $P1, $RB1 -> $Q1, $R2 -> $P2, $RB2 -> $Q2" || bad "linkem did not start"

"$S" --model "$M" --blocks 0:2 --port $P1 --bulk-port $Q1 --dht-port $D1 --new-swarm --no-measure \
    --announce 127.0.0.1:$R1 --announce-bulk-port $RB1 > "$TMP/a.out" 2>&1 &
A=$!
"$S" --model "$M" --blocks 2:4 --port $P2 --bulk-port $Q2 --dht-port $D2 --initial-peers 127.0.0.1:$D1 --no-measure \
    --announce 127.0.0.1:$R2 --announce-bulk-port $RB2 > "$TMP/b.out" 2>&1 &
B=$!
for f in a b; do
    for _ in $(seq 300); do grep -q "^sepal-server: announced" "$TMP/$f.out" && break; sleep 0.05; done
done
grep -qE "^sepal-server: announced as ws://127\.0\.0\.1:$R1 \(bulk port $RB1\): clients reach it there$" "$TMP/a.out" &&
    ok "the server says where it is announced" || { bad "no announced line"; tail -3 "$TMP/a.out"; }

# both records in the DHT (a loaded machine may take a while to store the second)
for _ in $(seq 60); do
    n=$("$SEPAL" -c "load $M; connect --initial-peers 127.0.0.1:$D1; servers" 2>/dev/null | grep -cE ' online ')
    [ "$n" -ge 2 ] && break
    sleep 0.5
done
[ "$n" -ge 2 ] && ok "the client sees both servers" || bad "the client sees $n servers"
"$SEPAL" model generate "$M" --prompt "Once upon a time" --max-new-tokens 12 > "$TMP/want" 2> /dev/null
"$SEPAL" -c "load $M; connect --initial-peers 127.0.0.1:$D1; servers -l; route; echo ==text==;
             generate 'Once upon a time' --max-new-tokens 12" > "$TMP/out" 2> "$TMP/err"
rc=$?
[ $rc -eq 0 ] && ok "the client generates through the relays" || { bad "the client: exit $rc"; tail -5 "$TMP/err"; }
for r in $R1 $R2; do
    grep -qE "^  address     ws://127\.0\.0\.1:$r$" "$TMP/out" && ok "servers -l shows the relay's address :$r" ||
        bad "servers -l lacks ws://127.0.0.1:$r"
done
grep -qE "ws://127\.0\.0\.1:($P1|$P2)" "$TMP/out" && bad "a direct address is in the client's view" ||
    ok "no direct address in the client's view"
grep -qE "^0:2 127\.0\.0\.1:$R1 \([0-9.]+ ms\) -> 2:4 127\.0\.0\.1:$R2 \([0-9.]+ ms\)( \+ [0-9.]+ ms local)?;" "$TMP/out" &&
    ok "the route goes through both relays" || { bad "route"; grep -E '^0:2' "$TMP/out"; }
sed -n '/^==text==$/,$p' "$TMP/out" | tail -n +2 > "$TMP/got"
cmp -s "$TMP/got" "$TMP/want" && ok "the same text as one process" ||
    { bad "the text through the relays differs"; diff "$TMP/want" "$TMP/got" | head -4; }

# a prompt of 40 KiB of hidden state at least: its messages go over the bulk channel, through the bulk relays (the
# client sends each server its input: with push on, the second server's would come from the first)
# (then each server's link as measured both ways: the server timed the prompt's hidden state it got, the client the
# reply; a link's rate is known from its second measurement on; `servers -l` shows the two rates; four times: on a
# loaded machine a reply can be whole in the client's buffer before it reads it, and then that one is not timed)
long=$(python3 -c "print(' '.join(['Once upon a time there was a little girl.'] * 12))")
"$SEPAL" -c "load $M; connect --initial-peers 127.0.0.1:$D1; set push off; generate '$long' --max-new-tokens 2;
             generate '$long' --max-new-tokens 2; generate '$long' --max-new-tokens 2;
             generate '$long' --max-new-tokens 2; servers -l" > "$TMP/long" 2>&1 && ok "a long prompt through the relays" || bad "a long prompt through the relays"
n=$(grep -cE "^  link        to it [0-9.]+ Mbit/s, from it [0-9.]+ Mbit/s \(measured on large messages; -: none yet\): wire auto sends (f32|bf16), asks for (f32|bf16) back$" "$TMP/long")
[ "$n" = 2 ] && ok "servers -l: both servers' links measured both ways" ||
    { bad "servers -l: $n links measured both ways"; grep -E "^  link " "$TMP/long"; }

kill $A $B
wait $A $B 2>/dev/null
kill -TERM $LK
wait $LK
rc=$?
[ $rc -eq 0 ] && ok "linkem exits 0" || bad "linkem exit $rc"
link_line() { grep -E "^linkem: 127\.0\.0\.1:0 -> 127\.0\.0\.1:$1: " "$TMP/linkem.err"; }
# relay_used WHAT PORT MIN_BYTES: the relay to PORT carried 2 connections at least and more than MIN_BYTES toward it
relay_used() {
    local n b
    n=$(link_line "$2" | sed -n 's/.*: \([0-9]*\) connections.*/\1/p')
    b=$(link_line "$2" | sed -n 's/.* \([0-9]*\) bytes toward.*/\1/p')
    [ "${n:-0}" -ge 2 ] && [ "${b:-0}" -gt "$3" ] && ok "$1 relay to :$2: $n connections, $b bytes toward" ||
        bad "$1 relay to :$2: '$(link_line "$2")'"
}
for p in $P1 $P2; do relay_used websocket "$p" 0; done
for q in $Q1 $Q2; do relay_used bulk "$q" 65536; done
finish
