#!/usr/bin/env bash
# Routing prices chains as the session will run them (`set push`): relayed by the client, each hop costs the client's
# round trip to its server; pushed, the client's one-way link to the first server, each server's measured link to
# the next (the pings in its DHT record) and the last server's back to the client. Four servers of a narrow
# Llama-2-7B shape (6 layers of 256) behind bench/linkem relays that they --announce (so the client and the servers
# reach each server through its relay), one-way delays: S1 0:2 10 ms, S2 2:6 80 ms, S3 2:4 100 ms, S4 4:6 10 ms.
#   relayed: S1 -> S2 = 2 x 10 + 2 x 80 = 180 ms, S1 -> S3 -> S4 = 2 x (10 + 100 + 10) = 240 ms: S1 -> S2;
#   pushed:  S1 -> S2 = 10 + 80 + 80 = 170 ms,      S1 -> S3 -> S4 = 10 + 100 + 10 + 10 = 130 ms: S1 -> S3 -> S4.
# (margins of 60 and 40 ms: a loaded machine adds some to each ping)
# `route` with push off goes S1 -> S2, with push on and push auto (pings far above 1 ms) S1 -> S3 -> S4, and a
# generation with push auto pushes its steps along that chain.
. "$(dirname "$0")/lib.bash"
. "${SEPAL_SRC_DIR:?}/bench/relays.sh" # relays
S="$SEPAL_BIN_DIR/server/sepal-server"
linkem="$SEPAL_BIN_DIR/bench/linkem" tmp="$TMP"
M="$TMP/l7"
narrow_llama "$M" 6

# free ports: the four servers' websocket and DHT ports
read -r P1 P2 P3 P4 D1 D2 D3 D4 < <(python3 -c "
import socket
ss = [socket.socket() for _ in range(8)]
for s in ss: s.bind(('127.0.0.1', 0))
print(' '.join(str(s.getsockname()[1]) for s in ss))")
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; rm -rf "$TMP"' EXIT
# (relays run in this shell, never in $(...): their pids must reach the trap)
relays r1 10 $P1 > "$TMP/r1.ports"
relays r2 80 $P2 > "$TMP/r2.ports"
relays r3 100 $P3 > "$TMP/r3.ports"
relays r4 10 $P4 > "$TMP/r4.ports"
read -r A1 < "$TMP/r1.ports"
read -r A2 < "$TMP/r2.ports"
read -r A3 < "$TMP/r3.ports"
read -r A4 < "$TMP/r4.ports"
[ -n "$A1" ] && [ -n "$A2" ] && [ -n "$A3" ] && [ -n "$A4" ] && ok "relays of 10, 80, 100 and 10 ms" ||
    bad "linkem did not start"

# server N BLOCKS DHT-ARGS...: sepal-server N on port P<N>, DHT port D<N>, announced at its relay
server() {
    local n=$1 blocks=$2 port dht ann
    shift 2
    port=$(eval echo "\$P$n") dht=$(eval echo "\$D$n") ann=$(eval echo "\$A$n")
    "$S" --model "$M" --blocks "$blocks" --port "$port" --bulk-port -1 --dht-port "$dht" --no-measure \
        --announce "127.0.0.1:$ann" "$@" > "$TMP/s$n.out" 2>&1 &
    pids+=($!)
    eval "PID$n=$!"
}
server 1 0:2 --new-swarm
server 2 2:6 --initial-peers "127.0.0.1:$D1"
server 3 2:4 --initial-peers "127.0.0.1:$D1"
server 4 4:6 --initial-peers "127.0.0.1:$D1"

# routes: the route line of `route` with push on, off and auto, in one process (the same pings), into $TMP/on, off, auto
routes() {
    "$SEPAL" -c "load $M; connect --initial-peers 127.0.0.1:$D1; set push on; route; echo @@off; set push off; route;
                 echo @@auto; set push auto; route" 2>/dev/null | grep -E '^(0:2 |@@)' > "$TMP/routes"
    sed -n '1p' "$TMP/routes" > "$TMP/on"
    sed -n '/^@@off$/{n;p}' "$TMP/routes" > "$TMP/off"
    sed -n '/^@@auto$/{n;p}' "$TMP/routes" > "$TMP/auto"
}
via_s2="^0:2 127\.0\.0\.1:$A1 \([0-9.]+ ms\) -> 2:6 127\.0\.0\.1:$A2 \([0-9.]+ ms\)"
via_s3="^0:2 127\.0\.0\.1:$A1 \([0-9.]+ ms\) -> 2:4 127\.0\.0\.1:$A3 \([0-9.]+ ms\) -> 4:6 127\.0\.0\.1:$A4 \([0-9.]+ ms\)"
# the servers ping their successors soon after they see them, and publish the pings: until S1's and S3's records
# carry them, a pushed chain guesses each switch from the client's own ping (80 + 80 ms against 100 + 10 + 10: the
# same choice). The routes are read until they are as the links make them (a loaded machine may take a while to
# store four records, and a load spike may make one ping seconds long for a while)
for _ in $(seq ${ROUTE_TRIES:-60}); do
    routes
    grep -qE "$via_s3" "$TMP/on" && grep -qE "$via_s2" "$TMP/off" && grep -qE "$via_s3" "$TMP/auto" && break
    sleep 1
done
grep -qE "$via_s3" "$TMP/on" && ok "push on: the route goes S1 -> S3 -> S4 ($(cat "$TMP/on"))" ||
    { bad "push on: route '$(cat "$TMP/on")'"
      "$SEPAL" -c "load $M; connect --initial-peers 127.0.0.1:$D1; servers -l" 2>&1 | grep -E 'address|blocks  |state|next pings|^   |ping  '; }
grep -qE "$via_s2" "$TMP/off" && ok "push off: the route goes S1 -> S2 ($(cat "$TMP/off"))" ||
    bad "push off: route '$(cat "$TMP/off")'"
grep -qE "$via_s3" "$TMP/auto" && ok "push auto: the route goes S1 -> S3 -> S4" || bad "push auto: route '$(cat "$TMP/auto")'"

# a generation with push auto: its steps pushed S1 -> S3 -> S4 (the servers' shutdown lines count the pushes)
"$SEPAL" -c "load $M; connect --initial-peers 127.0.0.1:$D1; set ignore-eos on; generate 'Once upon a time' --max-new-tokens 6" \
    > /dev/null 2> "$TMP/gen.err" && ok "push auto: the client generates" || { bad "generate"; tail -3 "$TMP/gen.err"; }
for n in 1 2 3 4; do
    pid=$(eval echo "\$PID$n")
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
done
pushes() { sed -n 's/^sepal-server: shutting down (.*; pushes: \([0-9]*\) in, \([0-9]*\) out)$/\1 \2/p' "$TMP/s$1.out"; }
read -r in1 out1 < <(pushes 1)
read -r in2 out2 < <(pushes 2)
read -r in3 out3 < <(pushes 3)
[ "${out1:-0}" -gt 0 ] && [ "${in3:-0}" -eq "$out1" ] && [ "${out3:-0}" -eq "$out1" ] && [ "${in2:-0}" -eq 0 ] &&
    ok "the steps were pushed S1 -> S3 -> S4 ($out1 of them), none into S2" ||
    bad "pushes: S1 '$in1 $out1', S2 '$in2 $out2', S3 '$in3 $out3'"
finish
