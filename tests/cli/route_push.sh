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
# Then a pushed chain is sought among servers that can push: S5 0:2 10 ms, S6 2:6 10 ms but a server from before push
# (SEPAL_SERVER_OLD=nopush: no caps), S7 2:4 40 ms, S8 4:6 10 ms. Pushed, S5 -> S6 would cost 30 ms, S5 -> S7 -> S8
# 70; relayed 40 and 120. With push on the route is S5 -> S7 -> S8, pushed (not S5 -> S6 relayed because the
# cheapest chain holds a server that cannot push); with push off, and auto (pushed 70 against relayed 40), S5 -> S6.
. "$(dirname "$0")/lib.bash"
. "${SEPAL_SRC_DIR:?}/bench/relays.sh" # relays
S="$SEPAL_BIN_DIR/server/sepal-server"
linkem="$SEPAL_BIN_DIR/bench/linkem" tmp="$TMP"
M="$TMP/l7"
narrow_llama "$M" 6

# free ports: the four servers' websocket and DHT ports
read -r P1 P2 P3 P4 P5 P6 P7 P8 D1 D2 D3 D4 D5 D6 D7 D8 < <(free_ports 16)
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

# routes [DHT]: the route line of `route` with push on, off and auto, in one process (the same pings), into $TMP/on,
# off, auto; through the DHT node at port DHT (default D1)
routes() {
    "$SEPAL" -c "load $M; connect --initial-peers 127.0.0.1:${1:-$D1}; set push on; route; echo @@off; set push off; route;
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

# generate_then_stop DHT SETTINGS WHAT N...: a generation through the swarm at DHT port DHT (SETTINGS before it),
# then servers N... stopped (their shutdown lines count the pushes)
generate_then_stop() {
    local dht=$1 settings=$2 what=$3 n pid
    shift 3
    "$SEPAL" -c "load $M; connect --initial-peers 127.0.0.1:$dht; ${settings}set ignore-eos on;
                 generate 'Once upon a time' --max-new-tokens 6" > /dev/null 2> "$TMP/gen.err" &&
        ok "$what: the client generates" || { bad "$what: generate"; tail -3 "$TMP/gen.err"; }
    for n in "$@"; do
        pid=$(eval echo "\$PID$n")
        kill "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    done
}
pushes() { sed -n 's/^sepal-server: shutting down (.*; pushes: \([0-9]*\) in, \([0-9]*\) out)$/\1 \2/p' "$TMP/s$1.out"; }
# pushed_along A B C: the steps went from server A to B and on from B (as many as A pushed), none into C
pushed_along() {
    local ia oa ib ob ic oc
    read -r ia oa < <(pushes "$1")
    read -r ib ob < <(pushes "$2")
    read -r ic oc < <(pushes "$3")
    [ "${oa:-0}" -gt 0 ] && [ "${ib:-0}" -eq "$oa" ] && [ "${ob:-0}" -eq "$oa" ] && [ "${ic:-0}" -eq 0 ] &&
        ok "the steps were pushed S$1 -> S$2 -> on ($oa of them), none into S$3" ||
        bad "pushes: S$1 '$ia $oa', S$2 '$ib $ob', S$3 '$ic $oc'"
}

# a generation with push auto: its steps pushed S1 -> S3 -> S4, none into S2
generate_then_stop "$D1" "" "push auto" 1 2 3 4
pushed_along 1 3 2

# an older server on the cheapest pushed chain: push on seeks the cheapest chain of servers that can push
relays r5 10 $P5 > "$TMP/r5.ports"
relays r6 10 $P6 > "$TMP/r6.ports"
relays r7 40 $P7 > "$TMP/r7.ports"
relays r8 10 $P8 > "$TMP/r8.ports"
read -r A5 < "$TMP/r5.ports"
read -r A6 < "$TMP/r6.ports"
read -r A7 < "$TMP/r7.ports"
read -r A8 < "$TMP/r8.ports"
server 5 0:2 --new-swarm
SEPAL_SERVER_OLD=nopush server 6 2:6 --initial-peers "127.0.0.1:$D5"
server 7 2:4 --initial-peers "127.0.0.1:$D5"
server 8 4:6 --initial-peers "127.0.0.1:$D5"
via_s6="^0:2 127\.0\.0\.1:$A5 \([0-9.]+ ms\) -> 2:6 127\.0\.0\.1:$A6 \([0-9.]+ ms\)"
via_s7="^0:2 127\.0\.0\.1:$A5 \([0-9.]+ ms\) -> 2:4 127\.0\.0\.1:$A7 \([0-9.]+ ms\) -> 4:6 127\.0\.0\.1:$A8 \([0-9.]+ ms\)"
for _ in $(seq ${ROUTE_TRIES:-60}); do
    routes "$D5"
    grep -qE "$via_s7" "$TMP/on" && grep -qE "$via_s6" "$TMP/off" && grep -qE "$via_s6" "$TMP/auto" && break
    sleep 1
done
grep -qE "$via_s7" "$TMP/on" && ok "push on, an older server on the cheapest chain: the route goes S5 -> S7 -> S8" ||
    bad "push on, an older server on the cheapest chain: route '$(cat "$TMP/on")'"
grep -qE "$via_s6" "$TMP/off" && ok "push off: the route goes S5 -> S6" || bad "push off: route '$(cat "$TMP/off")'"
grep -qE "$via_s6" "$TMP/auto" && ok "push auto: the route goes S5 -> S6 (relayed 40 ms against pushed 70)" ||
    bad "push auto: route '$(cat "$TMP/auto")'"
generate_then_stop "$D5" "set push on; " "push on" 5 6 7 8
pushed_along 5 7 6 # S5 -> S7 -> S8, none into the older S6
finish
