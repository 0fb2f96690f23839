#!/usr/bin/env bash
# Server-to-server push (`set push auto|on|off`) through bench/linkem relays: the client reaches each server through a
# relay of 10 ms each way, the servers reach each other through others of 5 ms (their --announce addresses, which
# HELLO tells the client and the client tells each server of its successor). A narrow Llama-2-7B shape (`model init
# --like`, 6 layers of 256), 3 servers of 2 blocks:
#  - push on and off give the same greedy text (that of one process) and the same beams; with push on every step of
#    the generations went from server to server (each server's shutdown line counts the pushes: exactly the steps),
#    with push off none did, nor with push auto where the client reaches the servers directly (loopback: pings far
#    under 1 ms);
#  - a server killed (kill -9) in the middle of a pushed generation (push auto: 10 ms relays): the same text; its
#    replacement announces an
#    address nothing listens at, so the first server cannot push to it and the generation goes on client-driven,
#    saying so.
. "$(dirname "$0")/lib.bash"
. "${SEPAL_SRC_DIR:?}/bench/relays.sh" # relays
S="$SEPAL_BIN_DIR/server/sepal-server"
linkem="$SEPAL_BIN_DIR/bench/linkem" tmp="$TMP"
M="$TMP/l7"
narrow_llama "$M" 6

# free ports: four servers' websocket ports, and one nothing listens at
read -r P1 P2 P3 P4 DEAD < <(python3 -c "
import socket
ss = [socket.socket() for _ in range(5)]
for s in ss: s.bind(('127.0.0.1', 0))
print(' '.join(str(s.getsockname()[1]) for s in ss))")
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; rm -rf "$TMP"' EXIT
# (relays run in this shell, never in $(...): their pids must reach the trap)
relays peer 5 $P1 $P2 $P3 $P4 > "$TMP/peer.ports"
relays client 10 $P1 $P2 $P3 > "$TMP/client.ports"
relays far 30 $P4 > "$TMP/far.ports"
read -r A1 A2 A3 A4 < "$TMP/peer.ports"
read -r C1 C2 C3 < "$TMP/client.ports"
read -r C4 < "$TMP/far.ports"
[ -n "$A4" ] && [ -n "$C3" ] && [ -n "$C4" ] && ok "relays: servers at 5 ms from each other, 10 ms from the client" ||
    bad "linkem did not start"

# server N BLOCKS ANNOUNCE_PORT [ENV...]: sepal-server N on port P<N>, announced at 127.0.0.1:ANNOUNCE_PORT
server() {
    local n=$1 blocks=$2 ann=$3 port
    shift 3
    port=$(eval echo "\$P$n")
    env "$@" "$S" --model "$M" --blocks "$blocks" --port "$port" --bulk-port -1 --no-measure \
        --announce "127.0.0.1:$ann" > "$TMP/s$n.out" 2>&1 &
    pids+=($!)
    eval "PID$n=$!"
}
wait_serving() {
    local n
    for n in "$@"; do
        for _ in $(seq 300); do grep -q "^sepal-server: serving" "$TMP/s$n.out" && break; sleep 0.05; done
    done
}
# stop N...: SIGTERM, and the shutdown line's pushes "IN OUT" into $TMP/s<N>.pushes
stop() {
    local n pid
    for n in "$@"; do
        pid=$(eval echo "\$PID$n")
        kill "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
        sed -n 's/^sepal-server: shutting down (.*; pushes: \([0-9]*\) in, \([0-9]*\) out)$/\1 \2/p' "$TMP/s$n.out" \
            > "$TMP/s$n.pushes"
    done
}

prompt="Once upon a time"
"$SEPAL" model generate "$M" --prompt "$prompt" --max-new-tokens 16 --ignore-eos > "$TMP/want" 2> /dev/null
client() { # client PUSH PORTS: greedy 16 tokens, then 3 beams of 8 (16 + 8 steps), through the ports given
    "$SEPAL" -c "load $M; connect $2; set push $1; set ignore-eos on; echo ==greedy==;
                 generate '$prompt' --max-new-tokens 16; echo ==beams==; set beams 3; generate '$prompt' --max-new-tokens 8"
}

server 1 0:2 "$A1"
server 2 2:4 "$A2"
server 3 4:6 "$A3"
wait_serving 1 2 3
relayed="127.0.0.1:$C1,127.0.0.1:$C2,127.0.0.1:$C3"
client on "$relayed" > "$TMP/on" 2> "$TMP/on.err" && ok "push on: the client generates" || { bad "push on"; tail -5 "$TMP/on.err"; }
client off "$relayed" > "$TMP/off" 2> "$TMP/off.err" && ok "push off: the client generates" ||
    { bad "push off"; tail -5 "$TMP/off.err"; }
client auto "127.0.0.1:$P1,127.0.0.1:$P2,127.0.0.1:$P3" > "$TMP/auto" 2> "$TMP/auto.err" &&
    ok "push auto, the servers reached directly: the client generates" || { bad "push auto"; tail -5 "$TMP/auto.err"; }
sed -n '/^==greedy==$/,/^==beams==$/p' "$TMP/on" | sed '1d;$d' > "$TMP/greedy.on"
cmp -s "$TMP/greedy.on" "$TMP/want" && ok "push on: the greedy text of one process" ||
    { bad "push on: the greedy text differs"; diff "$TMP/want" "$TMP/greedy.on" | head -4; }
cmp -s "$TMP/on" "$TMP/off" && cmp -s "$TMP/on" "$TMP/auto" && ok "push on, off and auto: the same greedy text and beams" ||
    { bad "push on, off and auto differ"; diff "$TMP/on" "$TMP/off" | head -6; diff "$TMP/on" "$TMP/auto" | head -6; }
stop 1 2 3
# 24 steps with push on: each went 1 -> 2 -> 3; none with push off, nor with auto on loopback
for want in "1:0 24" "2:24 24" "3:24 0"; do
    n=${want%%:*}
    [ "$(cat "$TMP/s$n.pushes")" = "${want#*:}" ] && ok "server $n: pushes in, out: ${want#*:}" ||
        bad "server $n: pushes in, out: '$(cat "$TMP/s$n.pushes")', expected '${want#*:}'"
done

# kill -9 of the middle server in a pushed generation (slowed to 40 ms a step, so that it is in the middle); its
# replacement (the far one, so not routed first) announces a dead port: the first server cannot push to it
server 1 0:2 "$A1"
server 2 2:4 "$A2" SEPAL_SERVER_FAULT=slow:40
server 3 4:6 "$A3"
server 4 2:4 "$DEAD"
wait_serving 1 2 3 4
"$SEPAL" model generate "$M" --prompt "$prompt" --max-new-tokens 48 --ignore-eos > "$TMP/want48" 2> /dev/null
"$SEPAL" -c "load $M; connect 127.0.0.1:$C1,127.0.0.1:$C2,127.0.0.1:$C3,127.0.0.1:$C4; route;
             generate '$prompt' --max-new-tokens 48 --ignore-eos" > "$TMP/kill" 2> "$TMP/kill.err" &
CL=$!
for _ in $(seq 400); do # until a few steps went through server 2
    [ "$(grep -c "" "$TMP/kill.err")" -gt 0 ] && grep -q "prompt tokens\|^127.0.0.1:$C3 serves" "$TMP/kill.err" && break
    sleep 0.05
done
sleep 1
kill -9 "$PID2"
wait "$PID2" 2>/dev/null
wait "$CL"
rc=$?
[ $rc -eq 0 ] && ok "the generation survives the kill" || { bad "the client: exit $rc"; tail -5 "$TMP/kill.err"; }
grep -q "127\.0\.0\.1:$C2" "$TMP/kill.err" && grep -qE "127\.0\.0\.1:$C4" "$TMP/kill.err" &&
    ok "the client saw the server fail and routed to the replacement" || { bad "no failover seen"; cat "$TMP/kill.err"; }
grep -qE "^(sepal: )?127\.0\.0\.1:$C1 could not push to the next server: this generation's steps are client-driven$" \
    "$TMP/kill.err" && ok "it says the first server could not push to the replacement" ||
    { bad "no 'could not push' notice"; cat "$TMP/kill.err"; }
sed -n '/^0:2 /,$p' "$TMP/kill" | tail -n +2 > "$TMP/got48"
cmp -s "$TMP/got48" "$TMP/want48" && ok "the same text as one process" ||
    { bad "the text after the kill differs"; diff "$TMP/want48" "$TMP/got48" | head -4; }
stop 1 3 4
finish
