#!/usr/bin/env bash
# scale.sh - sepal at a real model's size on one machine: Llama-2-7B-shaped models (`sepal model init --like
# llama-2-7b`, bf16 on disk, random weights) served with --dtype int8 by sepal-server processes on loopback,
# against one process (`sepal model generate --dtype int8`, every block local, the same encoding).
#   case 1: 8 layers, 3 servers (3, 3 and 2 blocks): greedy tokens/s, swarm / one process. Goal >= 0.97.
#   case 4: 32 layers (13.5 GB), 4 servers of 8 blocks started together: each server's load time and RSS after
#           load, after use and at its peak against its span's weight bytes (goal <= 1.1x + 64 MB), the client's
#           RSS against its local parts, greedy tokens/s swarm / one process, and one prompt-tuning step
#           (ptune, causal_lm) through the swarm.
# Each case is one `sepal -c` session: load (the client's LM head in int8, as the one process encodes it), connect,
# a warm-up generation, then R pairs of `generate` (the swarm) and `model generate` (one process, in the same app
# while the servers idle; it loads the model each time: its decode rate is what is compared), in turns. The texts
# must be identical. Prints every pair, the medians and the median of the pairs' ratios.
#
# usage: bench/scale.sh [--case "1 4"] [--reps R] [--tokens N] [--models DIR] [--build DIR] [--remove]
#                       [--spans "0:3 3:6 6:8"]
#   --reps R      pairs (default 3); --tokens N new tokens a generation (default 32)
#   --models DIR  where the models are (made there the first time, kept; default $SEPAL_CACHE/models, else
#                 ~/.cache/sepal/models); --remove deletes the ones this run made, at the end
#   --build DIR   sepal's build (default $SEPAL_BUILD_DIR or build)
#   --spans LIST  case 1's servers, one span each (default "0:3 3:6 6:8")
# Memory: case 4 holds 4 x 1.8 GB of servers, a 1.2 GB client and, during `model generate`, a 8-9.4 GB process:
# run it on a quiet machine with 20 GB free. Exit status: 0 after a run (whatever the ratios), 1 when a step
# fails or a text through the swarm differs from the one process's.
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
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "scale: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
die() { echo "scale: $*" >&2; exit 1; }

sepal="$build/app/sepal" server="$build/server/sepal-server"
[ -x "$sepal" ] && [ -x "$server" ] || die "$sepal or $server not found: build first"
export OPENBLAS_THREAD_TIMEOUT=4 # idle BLAS threads sleep at once (several processes share the cores)
tmp="$(mktemp -d)"
pids=()
made=()
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
median() { sort -g | awk '{v[NR] = $1} END {if (!NR) print 0; else print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
kb() { awk -v k="$2" '$1 == k":" {print $2}' "/proc/$1/status"; } # a /proc status field in kB
free_port() { python3 -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"; }

# The model of `layers` layers, made once.
model_dir() {
    local dir="$models/llama-2-7b-like-$1l"
    [ "$1" = 32 ] && dir="$models/llama-2-7b-like"
    if [ ! -f "$dir/config.json" ]; then
        echo "making $dir ($1 layers; kept for later runs)" >&2
        "$sepal" model init "$dir" --like llama-2-7b --layers "$1" >&2 || die "model init failed"
        made+=("$dir")
    fi
    echo "$dir"
}

# Starts one server per span, all at once (their DHT ports fixed, so they join without waiting); waits for
# each to serve and writes "index blocks load_s weights_MB pid" lines to $tmp/servers.
start_servers() {
    local model="$1"
    shift
    local d0 i=0 span t0
    d0="$(free_port)"
    t0="$(date +%s.%N)"
    : >"$tmp/servers"
    for span in "$@"; do
        local peers=(--new-swarm --dht-port "$d0")
        [ $i -gt 0 ] && peers=(--initial-peers "127.0.0.1:$d0" --dht-port 0)
        "$server" --model "$model" --blocks "$span" --dtype int8 --no-measure "${peers[@]}" >"$tmp/s$i.out" 2>&1 &
        pids+=($!)
        i=$((i + 1))
    done
    for i in $(seq 0 $(($# - 1))); do
        while ! grep -q "^sepal-server: serving" "$tmp/s$i.out"; do
            kill -0 "${pids[$i]}" 2>/dev/null || { cat "$tmp/s$i.out" >&2; die "server $i died"; }
            sleep 0.1
        done
        [ -f "$tmp/t$i" ] || date +%s.%N >"$tmp/t$i"
        local mb blocks
        mb="$(sed -n 's/.*int8 weights, \([0-9.]*\) MB.*/\1/p' "$tmp/s$i.out")"
        blocks="$(sed -n 's/^sepal-server: serving blocks \([0-9:]*\) .*/\1/p' "$tmp/s$i.out")"
        echo "$i $blocks $(awk -v a="$(cat "$tmp/t$i")" -v b="$t0" 'BEGIN {printf "%.1f", a - b}') $mb ${pids[$i]}" >>"$tmp/servers"
    done
    rm -f "$tmp"/t*
    echo "127.0.0.1:$d0"
}

# Records each server's RSS now (kB) into $tmp/rss.<tag>.
server_rss() {
    local i blocks load mb pid
    : >"$tmp/rss.$1"
    while read -r i blocks load mb pid; do
        echo "$i $(kb "$pid" VmRSS) $(kb "$pid" VmHWM)" >>"$tmp/rss.$1"
    done <"$tmp/servers"
}

# The session: load, connect, a warm-up, R pairs in turns, then `extra` commands. Fills $tmp/out, $tmp/err and
# $tmp/client_rss (the app's RSS in kB after load, connect and the warm-up).
session() {
    local model="$1" peers="$2" extra="$3"
    local gen="generate '$prompt' --max-new-tokens $tokens --ignore-eos"
    local one="model generate $model --prompt '$prompt' --max-new-tokens $tokens --ignore-eos --dtype int8"
    local script="load $model; set dtype int8; connect --initial-peers $peers; $gen; echo @@rss; sleep 3" k
    order=()
    for k in $(seq 1 "$reps"); do
        if [ $((k % 2)) -eq 1 ]; then
            script="$script; echo @@swarm $k; $gen; echo @@one $k; $one"
            order+=(swarm one)
        else
            script="$script; echo @@one $k; $one; echo @@swarm $k; $gen"
            order+=(one swarm)
        fi
    done
    script="$script; echo @@end${extra:+; $extra}"
    "$sepal" -c "$script" >"$tmp/out" 2>"$tmp/err" &
    local app=$!
    until grep -q '^@@rss' "$tmp/out" 2>/dev/null; do
        kill -0 "$app" 2>/dev/null || break
        sleep 0.2
    done
    kb "$app" VmRSS >"$tmp/client_rss" 2>/dev/null || echo 0 >"$tmp/client_rss"
    server_rss used
    wait "$app" || { tail -20 "$tmp/err" >&2; die "the session failed"; }
}

# Prints the pairs from $tmp/out and $tmp/err; appends the medians line to summary.
pairs() {
    sed -n 's/^sepal: .* \([0-9]*\) new in \([0-9.]*\) s .*/\1 \2/p' "$tmp/err" |
        awk '{ printf "%.2f\n", ($1 - 1) / $2 }' >"$tmp/rates"
    [ "$(wc -l <"$tmp/rates")" -eq $((2 * reps + 1)) ] || { cat "$tmp/err" >&2; die "expected $((2 * reps + 1)) token rates"; }
    : >"$tmp/sw" && : >"$tmp/on" && : >"$tmp/ra"
    local k a b sw on ts to same r
    for k in $(seq 1 "$reps"); do
        a="$(sed -n "$((2 * k))p" "$tmp/rates")" b="$(sed -n "$((2 * k + 1))p" "$tmp/rates")"
        if [ "${order[$((2 * k - 2))]}" = swarm ]; then sw="$a" on="$b"; else sw="$b" on="$a"; fi
        ts="$(awk -v m="@@swarm $k" '$0 ~ /^@@/ {on = ($0 == m); next} on' "$tmp/out")"
        to="$(awk -v m="@@one $k" '$0 ~ /^@@/ {on = ($0 == m); next} on' "$tmp/out")"
        same=identical
        if [ -z "$ts" ] || [ "$ts" != "$to" ]; then
            same=different fail=1
            { echo "    swarm: $ts"; echo "    one:   $to"; } >&2
        fi
        r="$(awk -v a="$sw" -v b="$on" 'BEGIN {printf "%.3f", a / b}')"
        echo "$sw" >>"$tmp/sw"; echo "$on" >>"$tmp/on"; echo "$r" >>"$tmp/ra"
        printf '  pair %d: swarm %s tok/s, one process %s tok/s, ratio %s, texts %s\n' "$k" "$sw" "$on" "$r" "$same"
    done
    summary+=("$(printf '%s: swarm %.2f tok/s, one process %.2f tok/s, ratio %.3f%s' "$1" "$(median <"$tmp/sw")" \
        "$(median <"$tmp/on")" "$(median <"$tmp/ra")" "$2")")
}

echo "scale: $("$sepal" --version 2>/dev/null | head -1), $(lscpu | sed -n 's/^Model name: *//p'), $(getconf _NPROCESSORS_ONLN)" \
    "cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo), $(date -u '+%Y-%m-%d %H:%M UTC')," \
    "load $(cut -d' ' -f1-3 /proc/loadavg); \"$prompt\" + $tokens tokens greedy, $reps pairs, int8"
fail=0
summary=()
for c in $cases; do
    case "$c" in
    1)
        m="$(model_dir 8)"
        n1=$(wc -w <<<"$spans1")
        # shellcheck disable=SC2086
        peers="$(start_servers "$m" $spans1)"
        echo "case 1: $m, $n1 servers (blocks $spans1)"
        session "$m" "$peers" ""
        pairs "case 1, 8 layers, $n1 servers" " (goal >= 0.97)"
        stop_servers
        ;;
    4)
        m="$(model_dir 32)"
        peers="$(start_servers "$m" 0:8 8:16 16:24 24:32)"
        server_rss loaded
        echo "case 4: $m, 4 servers of 8 blocks, started together"
        python3 -c "
import random
random.seed(1)
words = 'the a little girl boy dog cat saw ran found big small happy sad tree house ball sun day'.split()
print('\n'.join(' '.join(random.choice(words) for _ in range(60)) for _ in range(20)))" >"$tmp/text.txt"
        session "$m" "$peers" "echo @@train; train causal_lm --args 'file=$tmp/text.txt' --tuning ptune --batch 2 --max-length 32 --pre-seq-len 4 --microbatches 1 --max-steps 1 --epochs 1 --warmup 0"
        server_rss after
        echo "  server  blocks  load s  weights MB  RSS MB after load / after use / peak  RSS / weights  RSS <= 1.1x + 64 MB"
        while read -r i blocks load mb pid; do
            read -r _ rl _ <<<"$(sed -n "$((i + 1))p" "$tmp/rss.loaded")"
            read -r _ ru hwm <<<"$(sed -n "$((i + 1))p" "$tmp/rss.after")"
            worst=$((rl > ru ? rl : ru))
            # MB = 10^6 bytes, as the server prints its weights
            awk -v i="$i" -v b="$blocks" -v l="$load" -v w="$mb" -v rl="$rl" -v ru="$ru" -v h="$hwm" -v x="$worst" 'BEGIN {
                k = 1024 / 1e6
                printf "  %-6s  %-6s  %6s  %10.1f  %10.1f / %.1f / %.1f        %.3fx          %s\n", i, b, l, w,
                    rl * k, ru * k, h * k, x * k / w, (x * k <= 1.1 * w + 64) ? "met" : "missed" }'
        done <"$tmp/servers"
        parts="$(sed -n 's/.*(\([0-9.]*\) MB of local parts.*/\1/p' "$tmp/err" | head -1)"
        head="$(sed -n 's/^the LM head is now int8 (\([0-9.]*\) MB)$/\1/p' "$tmp/err" | head -1)"
        awk -v r="$(cat "$tmp/client_rss")" -v p="$parts" -v h="${head:-0}" 'BEGIN {
            printf "  client: RSS %.1f MB after load, connect and a generation; local parts %.1f MB (embeddings, norm, head) + its int8 copy %.1f MB: %.3fx\n",
                r * 1024 / 1e6, p, h, r * 1024 / 1e6 / (p + h) }'
        grep -qE '^@@train' "$tmp/out" && echo "  prompt-tuning step: $(awk '/^@@train/ {on = 1; next} on' "$tmp/out" | tail -3 | tr '\n' ' ')"
        echo "  train's stderr: $(grep -iE 'step|loss' "$tmp/err" | tail -2 | tr '\n' ' ')"
        pairs "case 4, 32 layers, 4 servers" ""
        stop_servers
        ;;
    *) die "unknown case $c (1 or 4)" ;;
    esac
done
echo "summary (medians; ratio = median of the pairs' ratios), load now $(cut -d' ' -f1-3 /proc/loadavg):"
printf '  %s\n' "${summary[@]}"
[ "$fail" = 0 ] || die "a text through the swarm differs from the one process's (above)"
