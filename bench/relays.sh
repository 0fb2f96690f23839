# relays.sh - bench/linkem relays for the shell benches and tests that put links between a client and servers
# (sourced by bench/wan.sh, wan-train.sh, ttft.sh, bench/bandwidth.sh, tests/cli/push.sh, route_push.sh and
# route_links.sh; they set `linkem` to the binary, `pids` (an array) to what they stop, and `tmp` to a scratch
# directory), and the benches' stop_all and free_ports.

# relays NAME DELAY PORT...: one linkem of that one-way delay (ms), a link leading to each 127.0.0.1:PORT; prints the
# links' own ports in the same order (empty when it did not start). Its output goes to $tmp/NAME.out and .err (the
# counts at SIGTERM).
relays() {
    local name=$1 delay=$2 args=() p
    shift 2
    for p in "$@"; do args+=(--listen 127.0.0.1:0 --to "127.0.0.1:$p"); done
    linkem_ports "$name" --delay "$delay" "${args[@]}"
}

# relays_from NAME DELAY FROM FROM_DELAY PORT...: as relays, but the connections from source address FROM (a server's
# --source-address) cross each link with FROM_DELAY ms instead (linkem --from): one link a server, slow or fast by
# who connects.
relays_from() {
    local name=$1 delay=$2 from=$3 fdelay=$4 args=() p
    shift 4
    for p in "$@"; do args+=(--listen 127.0.0.1:0 --to "127.0.0.1:$p" --from "$from" --delay "$fdelay"); done
    linkem_ports "$name" --delay "$delay" "${args[@]}"
}

# linkem_ports NAME ARGS...: starts linkem ARGS (output in $tmp/NAME.out and .err), waits until it is ready and prints
# its links' ports in order. Call it (and relays, relays_from) in the shell that stops pids, never in $(...).
linkem_ports() {
    local name=$1
    shift
    "$linkem" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" &
    pids+=($!)
    for _ in $(seq 100); do grep -q "^linkem: ready" "$tmp/$name.out" && break; sleep 0.05; done
    sed -n 's/^linkem: 127\.0\.0\.1:\([0-9]*\) -> .*/\1/p' "$tmp/$name.out" | tr '\n' ' '
    echo
}

# far_bins NAME: sets sepal, server and linkem to the programs in $build, or ends the bench NAME saying to build.
far_bins() {
    sepal="$build/app/sepal" server="$build/server/sepal-server" linkem="$build/bench/linkem"
    [ -x "$sepal" ] && [ -x "$server" ] && [ -x "$linkem" ] ||
        { echo "$1: sepal, sepal-server or linkem not in $build: build first" >&2; exit 1; }
}

# model_8l HIDDEN: sets model to the 8-layer Llama-2-7B shape of that width in $models (4096: llama-2-7b-like-8l, else
# llama-2-7b-like-8l-hHIDDEN), made there the first time (`model init --like`; kept for later runs); 1 if that fails.
model_8l() {
    local init=()
    if [ "$1" = 4096 ]; then model="$models/llama-2-7b-like-8l"; else
        model="$models/llama-2-7b-like-8l-h$1" init=(--hidden "$1"); fi
    [ -f "$model/config.json" ] && return 0
    echo "making $model (8 layers; kept for later runs)"
    "$sepal" model init "$model" --like llama-2-7b --layers 8 "${init[@]}" 2>&1 | tail -1
}

# wan_servers: 3 sepal-server processes of $model in int8 (blocks 0:3, 3:6, 6:8: the array spans), each behind two
# links of the one linkem that wan_links starts, for its websocket and its bulk port (--announce, --announce-bulk-port:
# the client's requests and replies and the other servers' pushes all cross them, so the client and the servers
# measure the links and `wire auto` engages); the servers connect to each other from 127.0.0.2 (--source-address),
# which the links carry in 5 ms each way (linkem --from), as bench/wan.sh's, wan-train.sh's and ttft.sh's WAN has
# them. Sets the array cl (the links' websocket ports: what the client connects to); returns once they serve, 1 if
# something did not start (said on stderr). Call it, and wan_links, in the shell that stops pids.
wan_servers() {
    local i
    spans=(0:3 3:6 6:8)
    read -r -a ports <<<"$(free_ports 12)" # websocket 0-2, bulk 3-5, and the links leading to them: 6-11
    cl=("${ports[@]:6:3}")
    for i in 0 1 2; do
        "$server" --model "$model" --blocks "${spans[$i]}" --dtype int8 --no-measure --port "${ports[$i]}" \
            --bulk-port "${ports[$((3 + i))]}" --source-address 127.0.0.2 --announce "127.0.0.1:${ports[$((6 + i))]}" \
            --announce-bulk-port "${ports[$((9 + i))]}" >"$tmp/s$i.out" 2>&1 &
        pids+=($!)
    done
    for i in 0 1 2; do
        until grep -qs "^sepal-server: serving" "$tmp/s$i.out"; do
            kill -0 "${pids[$((${#pids[@]} - 3 + i))]}" 2>/dev/null || { cat "$tmp/s$i.out" >&2; return 1; }
            sleep 0.2
        done
    done
}

# wan_links DELAY [RATE]: (re)starts the linkem of wan_servers' WAN: each server's two links, crossed by the client in
# DELAY ms each way and by the other servers in 5 ms, at RATE Mbit/s each way (default 0: unlimited), on the ports the
# servers announce (the last call's linkem stops first); 1 if it did not start. A server's connection to another
# that crossed the stopped links is gone: its next push connects again.
wan_links() {
    local args=() i
    for i in 0 1 2 3 4 5; do
        args+=(--listen "127.0.0.1:${ports[$((6 + i))]}" --to "127.0.0.1:${ports[$i]}" --from 127.0.0.2 --delay 5)
    done
    [ -n "${wan_lk:-}" ] && { kill "$wan_lk" 2>/dev/null; wait "$wan_lk" 2>/dev/null || true; }
    "$linkem" --delay "$1" --rate "${2:-0}" "${args[@]}" >"$tmp/wan.out" 2>"$tmp/wan.err" &
    wan_lk=$!
    pids+=($wan_lk)
    for _ in $(seq 100); do grep -qs "^linkem: ready" "$tmp/wan.out" && break; sleep 0.05; done
    grep -qs "^linkem: ready" "$tmp/wan.out" || { cat "$tmp/wan.err" >&2; return 1; }
}

# stop_all: stops every process in pids and waits for them.
stop_all() {
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    pids=()
}

# free_ports N: N free TCP ports on 127.0.0.1, space-separated.
free_ports() {
    python3 -c "
import socket
ss = [socket.socket() for _ in range($1)]
for s in ss: s.bind(('127.0.0.1', 0))
print(' '.join(str(s.getsockname()[1]) for s in ss))"
}
