#!/usr/bin/env bash
# ttft.sh - issue 24's bench 3, generation: time to the first token of a long prompt (default 1000 tokens) through
# links of limited rate, per wire format of the hidden states (the `wire` setting: f32, f16, bf16, q8, and auto, which
# chooses by the links as measured). A Llama-2-7B-shaped model of 8 layers in int8 (hidden 1024 by default, as
# bench/bandwidth.sh's: a 4096-wide prefill is compute-bound for tens of seconds on 2 shared cores) on 3 sepal-server
# processes (blocks 0:3, 3:6, 6:8); the client reaches each (websocket and bulk port) through a bench/linkem link of
# D ms each way (default 25) and R Mbit/s each way, the servers reach each other through the same links in 5 ms at
# R Mbit/s (their --announce addresses, connecting from 127.0.0.2), as bench/wan.sh's topology. One `sepal -c`
# session per rate: load, connect, a warm-up (which measures the links), then N rounds of one generation of 1 new
# token per format, in rotating order. Prints each round, each format's median time to the first token, the median of
# its ratios to f32's in the same rounds, whether its first token is f32's, and each link as the client measured it
# with what auto sends there (`servers --long`). The `push` setting is the client's (default auto: pushed on these
# links); --push off measures client-driven steps.
#
# usage: bench/ttft.sh [--rates "100"] [--delay D] [--rounds N] [--prompt-tokens T] [--hidden H] [--push MODE]
#                      [--formats "f32 f16 bf16 q8 auto"] [--models DIR] [--build DIR]
# Exit status: 0 after a run (whatever the figures), 1 when a generation fails. Every process it started is stopped
# on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

rates="100" delay=25 rounds=3 ptok=1000 hidden=1024 push=auto formats="f32 f16 bf16 q8 auto"
build="${SEPAL_BUILD_DIR:-build}" models="${SEPAL_CACHE:-$HOME/.cache/sepal}/models"
while [ $# -gt 0 ]; do
    case "$1" in
    --rates) rates="$2"; shift 2 ;;
    --delay) delay="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --prompt-tokens) ptok="$2"; shift 2 ;;
    --hidden) hidden="$2"; shift 2 ;;
    --push) push="$2"; shift 2 ;;
    --formats) formats="$2"; shift 2 ;;
    --models) models="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "ttft: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
die() { echo "ttft: $*" >&2; exit 1; }

. bench/pairs.sh # median, between
. bench/relays.sh # far_bins, model_8l, wan_servers, wan_links, stop_all
far_bins ttft
export OPENBLAS_THREAD_TIMEOUT=4
tmp="$(mktemp -d)"
pids=()
trap 'stop_all; rm -rf "$tmp"' EXIT
model_8l "$hidden" || die "model init failed"
ids="$(python3 -c "import random; random.seed(1); print(','.join(str(random.randint(3, 31999)) for _ in range($ptok)))")"
read -r -a fmts <<<"$formats"
nf=${#fmts[@]}
wan_servers || die "the swarm did not start"
echo "bench 3 (generation): $model (hidden $hidden), int8, 3 servers (blocks ${spans[*]}), client links $delay ms each"
echo "  way, server links 5 ms, a $ptok-token prompt, push $push, formats: $formats"
echo "  CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) (shared)"

for r in $rates; do
    wan_links "$delay" "$r" || die "linkem did not start"
    gen="generate --ids $ids --max-new-tokens 1 --ignore-eos"
    script="load $model; set dtype int8; set step-timeout 120; set push $push"
    script="$script; connect 127.0.0.1:${cl[0]},127.0.0.1:${cl[1]},127.0.0.1:${cl[2]}; $gen" # a warm-up
    order=()
    for k in $(seq 1 "$rounds"); do # rotating order: each format moves up a place each round
        for j in $(seq 0 $((nf - 1))); do
            f="${fmts[$(((j + k) % nf))]}"
            order+=("$f")
            script="$script; set wire $f; echo @@$f $k; $gen"
        done
    done
    script="$script; echo @@links; servers --long"
    "$sepal" -c "$script" >"$tmp/out" 2>"$tmp/err" || { tail -20 "$tmp/err" >&2; die "the session failed at $r Mbit/s"; }
    sed -n 's/^sepal: .*, first after \([0-9.]*\) s;.*/\1/p' "$tmp/err" | tail -n +2 >"$tmp/ttft"
    [ "$(wc -l <"$tmp/ttft")" -eq $((nf * rounds)) ] || { cat "$tmp/err" >&2; die "expected $((nf * rounds)) times"; }
    echo "$r Mbit/s each way (the prompt's hidden states: $((ptok * hidden * 4 / 1000)) kB in f32 a crossing):"
    for f in "${fmts[@]}"; do : >"$tmp/t.$f" && : >"$tmp/r.$f"; done
    for k in $(seq 1 "$rounds"); do
        declare -A v=()
        line="  round $k:"
        for j in $(seq 0 $((nf - 1))); do
            i=$((nf * (k - 1) + j))
            v[${order[$i]}]="$(sed -n "$((i + 1))p" "$tmp/ttft")"
        done
        for f in "${fmts[@]}"; do
            echo "${v[$f]}" >>"$tmp/t.$f"
            awk -v a="${v[$f]}" -v b="${v[${fmts[0]}]}" 'BEGIN {printf "%.3f\n", a / b}' >>"$tmp/r.$f"
            line="$line $f ${v[$f]} s"
        done
        echo "$line"
        unset v
    done
    want="$(between "$tmp/out" "@@${fmts[0]} 1" | tail -1)"
    for f in "${fmts[@]}"; do
        same=same
        [ "$(between "$tmp/out" "@@$f 1" | tail -1)" = "$want" ] || same=different
        printf '  %-5s time to first token %.3f s (median), %.3fx %s (median of the rounds'"'"' ratios); first token %s\n' \
            "$f" "$(median <"$tmp/t.$f")" "$(median <"$tmp/r.$f")" "${fmts[0]}" "$same"
    done
    awk '$0 == "@@links" {on = 1; next} on' "$tmp/out" | grep -E "^  (address|link) " |
        paste - - | sed 's/^  address *\(.*\)\t  link *\(.*\)/  link of \1: \2/'
done
echo "  load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
