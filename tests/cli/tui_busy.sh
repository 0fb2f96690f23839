#!/usr/bin/env bash
# A busy server in the TUI: the real `sepal` in tmux (tui_tmux.bash) following a swarm of one sepal-server of
# stories15M that refuses new sessions while its decode steps wait over 1 ms in its queue (--max-queue-wait 0.001)
# and answers 20 ms late (SEPAL_SERVER_FAULT=slow:20). Three other clients generating at once saturate it: its
# record says so, and the TUI shows it busy in its swarm row (the ping column, in the warning colour) and on its
# hop in the route panel; once their generations end, the busy mark goes. Every check polls the screen.
. "$(dirname "$0")/lib.bash"
. "$(dirname "$0")/tui_tmux.bash"
S="$SEPAL_BIN_DIR/server/sepal-server"
SEPAL_SERVER_FAULT=slow:20 "$S" --model "$M" --blocks 0: --new-swarm --no-measure --max-queue-wait 0.001 \
    > "$TMP/srv.out" 2> "$TMP/srv.err" &
SRV=$!
PIDS="$SRV"
trap 'kill $PIDS 2>/dev/null; cleanup' EXIT
for i in $(seq 600); do grep -q "^sepal-server: serving" "$TMP/srv.out" && break; sleep 0.05; done
PEER=127.0.0.1:$(grep -oE 'DHT 127\.0\.0\.1:[0-9]+' "$TMP/srv.out" | cut -d: -f2)
PORT=$(grep -o 'ws://127.0.0.1:[0-9]*' "$TMP/srv.out" | cut -d: -f3)
[ -n "$PORT" ] && ok "a server up (port $PORT, DHT $PEER)" || { bad "no server: $(cat "$TMP/srv.err")"; finish; }

start b 120x30 LANG=C.UTF-8 -- -c "'load $M; connect --initial-peers $PEER'" --tui
check b "the : line opens" "^:$" 30
text b 'route'
keys b Enter
check b "the route panel: its hop, not busy" "you .*\[0:6\)" 20
pane b | grep -qE ' busy .*0:6|\[0:6\)[^│]* busy' && bad "busy before any load" || ok "not busy while idle"

# three clients generating at once: their steps wait in its queue, over the bound
for k in 1 2 3; do
    "$SEPAL" -c "load $M; connect 127.0.0.1:$PORT; generate 'Once upon a time' --max-new-tokens 300 --ignore-eos" \
        > "$TMP/load$k.out" 2>&1 &
    PIDS="$PIDS $!"
done
check b "the swarm panel: the server's row says busy" " busy .*0:6" 30
check b "the route panel: its hop says busy" "\[0:6\)[^│]* busy" 10
# the row's busy cell in the warning colour (the pane with its escapes: not the plain text colour)
T capture-pane -e -p -t b | grep -E "0:6" | grep -qE $'\e\\[[0-9;]*m *busy' && ok "the busy cell is coloured" ||
    bad "the busy cell has no colour of its own"
for p in ${PIDS#"$SRV"}; do wait "$p"; done
check b "the load done: the busy mark goes" "you .*\[0:6\)" 5
wait_gone b " busy .*0:6" 30 && ok "no longer busy once the queue is empty" || bad "still busy after the load"
finish
