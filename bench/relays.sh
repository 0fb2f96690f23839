# relays.sh - bench/linkem relays for the shell benches and tests that put links between a client and servers
# (sourced by bench/wan.sh and tests/cli/push.sh; they set `linkem` to the binary, `pids` (an array) to what they
# stop, and `tmp` to a scratch directory).

# relays NAME DELAY PORT...: one linkem of that one-way delay (ms), a link leading to each 127.0.0.1:PORT; prints the
# links' own ports in the same order (empty when it did not start). Its output goes to $tmp/NAME.out and .err (the
# counts at SIGTERM).
relays() {
    local name=$1 delay=$2 args=() p
    shift 2
    for p in "$@"; do args+=(--listen 127.0.0.1:0 --to "127.0.0.1:$p"); done
    "$linkem" --delay "$delay" "${args[@]}" >"$tmp/$name.out" 2>"$tmp/$name.err" &
    pids+=($!)
    for _ in $(seq 100); do grep -q "^linkem: ready" "$tmp/$name.out" && break; sleep 0.05; done
    sed -n 's/^linkem: 127\.0\.0\.1:\([0-9]*\) -> .*/\1/p' "$tmp/$name.out" | tr '\n' ' '
    echo
}
