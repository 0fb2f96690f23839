#!/usr/bin/env bash
# scale.sh - sepal at a real model's size on one machine: Llama-2-7B-shaped models (`sepal model init --like
# llama-2-7b`, bf16 on disk, random weights) served with --dtype int8 by sepal-server processes on loopback,
# against one process (`sepal model generate --dtype int8`, every block local, the same encoding; the client's LM
# head is int8 too, as the one process encodes it). Greedy texts must be identical.
#   case 1: 8 layers, 3 servers (3, 3 and 2 blocks): tokens/s, swarm / one process. Goal >= 0.97. One `sepal -c`
#           session: load, connect, a warm-up, then R pairs of `generate` (the swarm) and `model generate` (one
#           process, in the same app while the servers idle), in turns.
#   case 4: 32 layers (13.5 GB), 4 servers of 8 blocks: each server's load time (all 4 started together) and RSS
#           after load, after use and at its peak against its span's weight bytes (goal <= 1.1x + 64 MB), the
#           client's RSS against its local parts, tokens/s swarm / one process, and one prompt-tuning step (ptune,
#           causal_lm) through the swarm. The swarm (7.2 GB of servers and a 1.2 GB client) and the one process
#           (8-9.4 GB) do not fit this machine together, so the R pairs alternate whole turns: servers started,
#           a client session, servers stopped; then `sepal model generate` alone; in turns.
# Prints every pair, the medians and the median of the pairs' ratios.
#
# usage: bench/scale.sh [--case "1 4"] [--reps R] [--tokens N] [--models DIR] [--build DIR] [--remove]
#                       [--spans "0:3 3:6 6:8"]
#   --reps R      pairs (default 3); --tokens N new tokens a generation (default 32)
#   --models DIR  where the models are (made there the first time and kept; default $SEPAL_CACHE/models, else
#                 ~/.cache/sepal/models); --remove deletes the ones this run made, at the end
#   --build DIR   sepal's build (default $SEPAL_BUILD_DIR or build)
#   --spans LIST  case 1's servers, one span each (default "0:3 3:6 6:8")
# Exit status: 0 after a run (whatever the ratios), 1 when a step fails or a text through the swarm differs from
# the one process's. Every server it started is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

cases="1 4" reps=3 tokens=32 build="${SEPAL_BUILD_DIR:-build}" remove=0 prompt="Once upon a time" spans1="0:3 3:6 6:8"
models="${SEPAL_CACHE:-$HOME/.cache/sepal}/models"
while [ $# -gt 0 ]; do
    case "$1" in
    --case) cases="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    --tokens) tokens="$2"; shift 2 ;;
    --models) models="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --remove) remove=1; shift ;;
    --spans) spans1="$2"; shift 2 ;;
    -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
    *) echo "scale: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
die() { echo "scale: $*" >&2; exit 1; }

sepal="$build/app/sepal" server="$build/server/sepal-server"
[ -x "$sepal" ] && [ -x "$server" ] || die "$sepal or $server not found: build first"
export OPENBLAS_THREAD_TIMEOUT=4 # idle BLAS threads sleep at once (several processes share the cores)
tmp="$(mktemp -d)"
pids=() made=() peers=""
stop_servers() {
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    pids=()
}
cleanup() {
    stop_servers
    rm -rf "$tmp"
    if [ "$remove" = 1 ]; then
        local m
        for m in "${made[@]}"; do rm -rf "$m"; done
    fi
}
trap cleanup EXIT
. bench/pairs.sh # median, pairs_script
kb() { awk -v k="$2" '$1 == k":" {print $2}' "/proc/$1/status"; } # a /proc status field in kB
free_port() { python3 -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"; }
# decode rate of every "N new in S s" line of a file: (N - 1) / S, one-token steps per second after the prompt
rates() { sed -n 's/^sepal: .* \([0-9]*\) new in \([0-9.]*\) s .*/\1 \2/p' "$1" | awk '{printf "%.2f\n", ($1 - 1) / $2}'; }
between() { awk -v m="$2" '$0 ~ /^@@/ {on = ($0 == m); next} on' "$1"; } # the lines after marker m, to the next

# The model of `layers` layers (made once): sets model.
model_dir() {
    model="$models/llama-2-7b-like-$1l"
    [ "$1" = 32 ] && model="$models/llama-2-7b-like"
    if [ ! -f "$model/config.json" ]; then
        echo "making $model ($1 layers; kept for later runs)"
        "$sepal" model init "$model" --like llama-2-7b --layers "$1" 2>&1 | tail -1 || die "model init failed"
        made+=("$model")
    fi
}

# Starts one int8 server per span, all at once (the first's DHT port fixed, so the others join at once), waits for
# each to serve; sets peers and writes "index blocks load_s weights_MB pid" lines to $tmp/servers. Runs in this
# shell (never in $(...)): pids must reach stop_servers.
start_servers() {
    local d0 i=0 span t0 n=$#
    d0="$(free_port)"
    t0="$(date +%s.%N)"
    : >"$tmp/servers"
    for span in "$@"; do
        local join=(--new-swarm --dht-port "$d0")
        [ $i -gt 0 ] && join=(--initial-peers "127.0.0.1:$d0" --dht-port 0)
        "$server" --model "$model" --blocks "$span" --dtype int8 --no-measure "${join[@]}" >"$tmp/s$i.out" 2>&1 &
        pids+=($!)
        i=$((i + 1))
    done
    local done_at=() left=$n
    while [ "$left" -gt 0 ]; do
        for i in $(seq 0 $((n - 1))); do
            [ -n "${done_at[$i]:-}" ] && continue
            kill -0 "${pids[$i]}" 2>/dev/null || { cat "$tmp/s$i.out" >&2; die "server $i died"; }
            grep -q "^sepal-server: serving" "$tmp/s$i.out" || continue
            done_at[$i]="$(date +%s.%N)"
            left=$((left - 1))
        done
        sleep 0.1
    done
    for i in $(seq 0 $((n - 1))); do
        local mb blocks
        mb="$(sed -n 's/.*int8 weights, \([0-9.]*\) MB.*/\1/p' "$tmp/s$i.out")"
        blocks="$(sed -n 's/^sepal-server: serving blocks \([0-9:]*\) .*/\1/p' "$tmp/s$i.out")"
        echo "$i $blocks $(awk -v a="${done_at[$i]}" -v b="$t0" 'BEGIN {printf "%.1f", a - b}') $mb ${pids[$i]}" \
            >>"$tmp/servers"
    done
    peers="127.0.0.1:$d0"
}

# Each server's RSS and peak now (kB) into $tmp/rss.<tag>.
server_rss() {
    local i blocks load mb pid
    : >"$tmp/rss.$1"
    while read -r i blocks load mb pid; do
        echo "$i $(kb "$pid" VmRSS) $(kb "$pid" VmHWM)" >>"$tmp/rss.$1"
    done <"$tmp/servers"
}

# Runs `sepal -c script` into $tmp/out and $tmp/err; at the line @@rss it records the app's RSS (kB) in
# $tmp/client_rss and the servers' in $tmp/rss.used.
client() {
    "$sepal" -c "$1" >"$tmp/out" 2>"$tmp/err" &
    local app=$!
    until grep -q '^@@rss' "$tmp/out" 2>/dev/null; do
        kill -0 "$app" 2>/dev/null || break
        sleep 0.2
    done
    kb "$app" VmRSS >"$tmp/client_rss" 2>/dev/null || echo 0 >"$tmp/client_rss"
    [ -s "$tmp/servers" ] && server_rss used
    wait "$app" || { tail -20 "$tmp/err" >&2; die "the session failed"; }
}

# Pair k: the two rates and texts; prints it and adds it to $tmp/sw, $tmp/on, $tmp/ra.
pair() {
    local k="$1" sw="$2" on="$3" ts="$4" to="$5" same=identical r
    if [ -z "$ts" ] || [ "$ts" != "$to" ]; then
        same=different fail=1
        { echo "    swarm: $ts"; echo "    one:   $to"; } >&2
    fi
    r="$(awk -v a="$sw" -v b="$on" 'BEGIN {printf "%.3f", a / b}')"
    echo "$sw" >>"$tmp/sw"; echo "$on" >>"$tmp/on"; echo "$r" >>"$tmp/ra"
    printf '  pair %d: swarm %s tok/s, one process %s tok/s, ratio %s, texts %s\n' "$k" "$sw" "$on" "$r" "$same"
}

summarize() {
    summary+=("$(printf '%s: swarm %.2f tok/s, one process %.2f tok/s, ratio %.3f%s' "$1" "$(median <"$tmp/sw")" \
        "$(median <"$tmp/on")" "$(median <"$tmp/ra")" "$2")")
    : >"$tmp/sw" && : >"$tmp/on" && : >"$tmp/ra"
}

gen="generate '$prompt' --max-new-tokens $tokens --ignore-eos"
one_args=(--prompt "$prompt" --max-new-tokens "$tokens" --ignore-eos --dtype int8)

case1() {
    model_dir 8
    # shellcheck disable=SC2086
    start_servers $spans1
    echo "case 1: $model, $(wc -w <<<"$spans1") servers (blocks $spans1)"
    local one="model generate $model --prompt '$prompt' --max-new-tokens $tokens --ignore-eos --dtype int8" k
    pairs_script "$gen" "$one" "$reps"
    client "load $model; set dtype int8; connect --initial-peers $peers; $gen; echo @@rss$pairs_cmds; echo @@end"
    rates "$tmp/err" >"$tmp/rates"
    [ "$(wc -l <"$tmp/rates")" -eq $((2 * reps + 1)) ] || { cat "$tmp/err" >&2; die "expected $((2 * reps + 1)) rates"; }
    for k in $(seq 1 "$reps"); do
        local a b
        a="$(sed -n "$((2 * k))p" "$tmp/rates")" b="$(sed -n "$((2 * k + 1))p" "$tmp/rates")"
        [ "${order[$((2 * k - 2))]}" = swarm ] || { local t="$a"; a="$b"; b="$t"; }
        pair "$k" "$a" "$b" "$(between "$tmp/out" "@@swarm $k")" "$(between "$tmp/out" "@@one $k")"
    done
    stop_servers
    summarize "case 1, 8 layers, $(wc -w <<<"$spans1") servers" " (goal >= 0.97)"
}

# One swarm turn of case 4: servers up, a client session (the first also trains a step), servers down. Appends
# its rate to $tmp/rate.swarm and its text to $tmp/text.swarm.<k>; the first keeps the memory figures.
swarm_turn() {
    local k="$1" extra=""
    start_servers 0:8 8:16 16:24 24:32
    server_rss loaded
    [ "$k" = 1 ] && extra="; echo @@train; train causal_lm --args 'file=$tmp/text.txt' --tuning ptune --batch 2 \
--max-length 32 --pre-seq-len 4 --microbatches 1 --max-steps 1 --epochs 1 --warmup 0"
    client "load $model; set dtype int8; connect --initial-peers $peers; $gen; echo @@rss; sleep 2; echo @@swarm; $gen$extra"
    server_rss after
    stop_servers
    rates "$tmp/err" | sed -n 2p >>"$tmp/rate.swarm"
    between "$tmp/out" "@@swarm" >"$tmp/text.swarm.$k"
    if [ "$k" = 1 ]; then
        cp "$tmp/servers" "$tmp/servers.1"
        cp "$tmp/rss.loaded" "$tmp/rss.loaded.1"
        cp "$tmp/rss.after" "$tmp/rss.after.1"
        cp "$tmp/client_rss" "$tmp/client_rss.1"
        cp "$tmp/err" "$tmp/err.1"
        cp "$tmp/out" "$tmp/out.1"
    fi
    awk '{printf "%s ", $3}' "$tmp/servers" >>"$tmp/loads" && echo >>"$tmp/loads"
}

one_turn() {
    "$sepal" model generate "$model" "${one_args[@]}" >"$tmp/one.out" 2>"$tmp/one.err" || {
        cat "$tmp/one.err" >&2
        die "model generate failed"
    }
    rates "$tmp/one.err" >>"$tmp/rate.one"
    cp "$tmp/one.out" "$tmp/text.one.$1"
}

# The memory figures of case 4's first swarm turn.
report_memory() {
    echo "  load times of the 4 servers started together, each turn (s): $(tr '\n' ';' <"$tmp/loads" | sed 's/ ;/; /g')"
    echo "  server  blocks  load s  weights MB  RSS MB after load / after use / peak  RSS / weights  RSS <= 1.1x + 64 MB"
    local i blocks load mb pid rl ru hwm worst
    while read -r i blocks load mb pid; do
        read -r _ rl _ <<<"$(sed -n "$((i + 1))p" "$tmp/rss.loaded.1")"
        read -r _ ru hwm <<<"$(sed -n "$((i + 1))p" "$tmp/rss.after.1")"
        worst=$((rl > ru ? rl : ru))
        # MB = 10^6 bytes, as the server prints its weights
        awk -v i="$i" -v b="$blocks" -v l="$load" -v w="$mb" -v rl="$rl" -v ru="$ru" -v h="$hwm" -v x="$worst" 'BEGIN {
            k = 1024 / 1e6
            printf "  %-6s  %-6s  %6s  %10.1f  %10.1f / %.1f / %.1f        %.3fx          %s\n", i, b, l, w,
                rl * k, ru * k, h * k, x * k / w, (x * k <= 1.1 * w + 64) ? "met" : "missed" }'
    done <"$tmp/servers.1"
    local parts head
    parts="$(sed -n 's/.*(\([0-9.]*\) MB of local parts.*/\1/p' "$tmp/err.1" | head -1)"
    head="$(sed -n 's/^the LM head is now int8 (\([0-9.]*\) MB)$/\1/p' "$tmp/err.1" | head -1)"
    awk -v r="$(cat "$tmp/client_rss.1")" -v p="$parts" -v h="${head:-0}" 'BEGIN {
        printf "  client: RSS %.1f MB after load, connect and a generation; local parts %.1f MB (embeddings, norm, head)", r * 1024 / 1e6, p
        printf " + its int8 copy %.1f MB: %.3fx\n", h, r * 1024 / 1e6 / (p + h) }'
    echo "  prompt-tuning step through the swarm: $(between "$tmp/out.1" "@@train" | grep -E 'step 1/1' | head -1)"
}

case4() {
    model_dir 32
    echo "case 4: $model, 4 servers of 8 blocks, started together; swarm and one process in whole turns"
    python3 -c "
import random
random.seed(1)
words = 'the a little girl boy dog cat saw ran found big small happy sad tree house ball sun day'.split()
print('\n'.join(' '.join(random.choice(words) for _ in range(60)) for _ in range(20)))" >"$tmp/text.txt"
    : >"$tmp/rate.swarm" && : >"$tmp/rate.one" && : >"$tmp/loads"
    local k
    for k in $(seq 1 "$reps"); do
        if [ $((k % 2)) -eq 1 ]; then swarm_turn "$k"; one_turn "$k"; else one_turn "$k"; swarm_turn "$k"; fi
        pair "$k" "$(sed -n "${k}p" "$tmp/rate.swarm")" "$(sed -n "${k}p" "$tmp/rate.one")" \
            "$(cat "$tmp/text.swarm.$k")" "$(cat "$tmp/text.one.$k")"
    done
    report_memory
    summarize "case 4, 32 layers, 4 servers" ""
}

echo "scale: $("$sepal" --version 2>/dev/null | head -1), $(lscpu | sed -n 's/^Model name: *//p') (family" \
    "$(lscpu | sed -n 's/^CPU family: *//p')), $(getconf _NPROCESSORS_ONLN) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)," \
    "$(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg); \"$prompt\" + $tokens tokens greedy," \
    "$reps pairs, int8"
fail=0
summary=()
: >"$tmp/sw" && : >"$tmp/on" && : >"$tmp/ra"
for c in $cases; do
    case "$c" in
    1) case1 ;;
    4) case4 ;;
    *) die "unknown case $c (1 or 4)" ;;
    esac
done
echo "summary (medians; ratio = median of the pairs' ratios), load now $(cut -d' ' -f1-3 /proc/loadavg):"
printf '  %s\n' "${summary[@]}"
[ "$fail" = 0 ] || die "a text through the swarm differs from the one process's (above)"
