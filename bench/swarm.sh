#!/usr/bin/env bash
# swarm.sh - stories15M greedy decode tokens/s through a loopback swarm of N servers (`swarm up N`, default
# settings, no environment variables) against one process (`model generate`: every block local), for N = 1, 2,
# 3, 6, on an idle machine and under contention (two busy processes, `yes >/dev/null`, for those runs).
# Each N is one `sepal -c` session: load, swarm up N, a warm-up generation, then R pairs of
# `generate` (the swarm) and `model generate` (one process, in the same app while the servers idle), in turns
# (swarm first, then one process first, ...). Prints every pair, the medians, the median of the pairs' ratios
# and, under contention, the swarm's median against its idle median. The texts must be identical (greedy).
# The hop: the client calls each server in turn, so a token costs N round trips more than one process; the
# per-hop overhead is (1 / swarm rate - 1 / one-process rate) / N, each pair's, the median printed against the
# raw TCP round trip of a 1232-byte message (stories15M's hidden state and header) between two threads on
# loopback, which bench_wire measures (2000 round trips, the median) just before each N's session, under the
# same load.
# Goals: swarm / one process >= 0.95 with 3 servers, >= 0.90 with 6; under contention >= 0.5 of the idle rate;
# per-hop overhead <= 1.5x the raw round trip.
#
# usage: bench/swarm.sh [--reps R] [--tokens N] [--servers "1 2 3 6"] [--load "idle busy"] [--build DIR]
#                       [--prompt TEXT]
#   --reps R     pairs per N (default 5); --tokens N new tokens a generation (default 120)
#   --build DIR  sepal's build (default $SEPAL_BUILD_DIR or build; its sepal-server is the one started)
# Tokens/s is the decode rate sepal reports ("N new in S s"), as (N - 1) / S: one-token steps (with sampling)
# per second after the prompt. Exit status: 0 after a run (whatever the ratios), 1 when a step fails or a
# swarm text differs from the one-process text.
set -euo pipefail
cd "$(dirname "$0")/.."

reps=5 tokens=120 servers="1 2 3 6" loads="idle busy" build="${SEPAL_BUILD_DIR:-build}" prompt="Once upon a time"
while [ $# -gt 0 ]; do
    case "$1" in
    --reps) reps="$2"; shift 2 ;;
    --tokens) tokens="$2"; shift 2 ;;
    --servers) servers="$2"; shift 2 ;;
    --load) loads="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --prompt) prompt="$2"; shift 2 ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "swarm: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
die() { echo "swarm: $*" >&2; exit 1; }

sepal="$build/app/sepal"
[ -x "$sepal" ] || die "$sepal not found: build first (SEPAL_BUILD_DIR=$build scripts/build.sh)"
[ -x "$build/server/sepal-server" ] || die "$build/server/sepal-server not found: build first"
wire="$build/bench/bench_wire"
[ -x "$wire" ] || die "$wire not found: build first"
model="$(scripts/fetch-model.sh "$sepal" | tail -1)" || die "scripts/fetch-model.sh failed"
# default settings, no environment variables (SEPAL_SERVER_BIN picks this build's server; nothing else)
for v in $(env | sed -n 's/^\(SEPAL_[A-Z_]*\|OPENBLAS_[A-Z_]*\|OMP_[A-Z_]*\|GOTO_[A-Z_]*\)=.*/\1/p'); do
    [ "$v" = SEPAL_CACHE ] || unset "$v"
done
export SEPAL_SERVER_BIN="$build/server/sepal-server"

. bench/busy.sh
. bench/pairs.sh
q() { printf "'%s'" "$1"; } # the prompt quoted for a sepal command line
# raw_rtt -> the median raw TCP round trip of 1232 bytes on loopback, in microseconds
raw_rtt() {
    "$wire" --size-mib 1 --msgs 1 --reps 1 --rtt 2000 --small 1232 2>&1 |
        sed -n 's/^  raw TCP *median *\([0-9.]*\) us.*/\1/p' | grep . || die "bench_wire measured no round trip"
}

echo "swarm: $("$sepal" --version 2>/dev/null | head -1), stories15M, \"$prompt\" + $tokens tokens greedy, $reps pairs a" \
    "swarm size, default settings, $(getconf _NPROCESSORS_ONLN) cores, $(date -u '+%Y-%m-%d %H:%M UTC')," \
    "load $(cut -d' ' -f1-3 /proc/loadavg)"
gen="generate $(q "$prompt") --max-new-tokens $tokens --ignore-eos"
one="model generate $model --prompt $(q "$prompt") --max-new-tokens $tokens --ignore-eos"
fail=0
summary=()
declare -A idle_swarm
for load in $loads; do
    [ "$load" = busy ] && start_busy
    for n in $servers; do
        rtt="$(raw_rtt)"
        pairs_script "$gen" "$one" "$reps"
        script="load $model; swarm up $n; $gen$pairs_cmds; echo @@end"
        "$sepal" -c "$script" >"$tmp/out" 2>"$tmp/err" || { tail -20 "$tmp/err" >&2; die "the session of $n servers failed"; }
        # the rates in command order: the warm-up first
        sed -n 's/^sepal: .* \([0-9]*\) new in \([0-9.]*\) s .*/\1 \2/p' "$tmp/err" |
            awk '{ printf "%.1f\n", ($1 - 1) / $2 }' >"$tmp/rates"
        [ "$(wc -l <"$tmp/rates")" -eq $((2 * reps + 1)) ] || { cat "$tmp/err" >&2; die "expected $((2 * reps + 1)) token rates"; }
        : >"$tmp/sw" && : >"$tmp/on" && : >"$tmp/ra" && : >"$tmp/hop"
        for k in $(seq 1 "$reps"); do
            a="$(sed -n "$((2 * k))p" "$tmp/rates")" b="$(sed -n "$((2 * k + 1))p" "$tmp/rates")"
            if [ "${order[$((2 * k - 2))]}" = swarm ]; then sw="$a" on="$b"; else sw="$b" on="$a"; fi
            # the texts between the markers
            ts="$(awk -v m="@@swarm $k" '$0 ~ /^@@/ {on = ($0 == m); next} on' "$tmp/out")"
            to="$(awk -v m="@@one $k" '$0 ~ /^@@/ {on = ($0 == m); next} on' "$tmp/out")"
            same=identical
            if [ -z "$ts" ] || [ "$ts" != "$to" ]; then
                same=different
                fail=1
                { echo "    swarm: $ts"; echo "    one:   $to"; } >&2
            fi
            r="$(awk -v a="$sw" -v b="$on" 'BEGIN {printf "%.3f", a / b}')"
            hop="$(awk -v a="$sw" -v b="$on" -v n="$n" 'BEGIN {printf "%.1f", (1e6 / a - 1e6 / b) / n}')"
            echo "$sw" >>"$tmp/sw"; echo "$on" >>"$tmp/on"; echo "$r" >>"$tmp/ra"; echo "$hop" >>"$tmp/hop"
            printf '  %s, %d server(s), pair %d: swarm %s tok/s, one process %s tok/s, ratio %s, per hop %s us, texts %s\n' \
                "$load" "$n" "$k" "$sw" "$on" "$r" "$hop" "$same"
        done
        ms="$(median <"$tmp/sw")" mo="$(median <"$tmp/on")" mr="$(median <"$tmp/ra")"
        goal="" && [ "$n" = 3 ] && goal=" (goal >= 0.95)"
        [ "$n" = 6 ] && goal=" (goal >= 0.90)"
        line="$(printf '%-5s %d server(s): swarm %.0f tok/s, one process %.0f tok/s, ratio %.2f%s' "$load," "$n" "$ms" "$mo" "$mr" "$goal")"
        line="$line; $(awk -v h="$(median <"$tmp/hop")" -v r="$rtt" 'BEGIN {
            printf "per hop %.0f us, raw TCP round trip %.0f us: %.2fx (goal <= 1.5)", h, r, h / r }')"
        if [ "$load" = idle ]; then
            idle_swarm[$n]="$ms"
        elif [ -n "${idle_swarm[$n]:-}" ]; then
            line="$line; swarm busy / idle $(awk -v a="$ms" -v b="${idle_swarm[$n]}" 'BEGIN {printf "%.2f", a / b}') (goal >= 0.5)"
        fi
        echo "$line"
        summary+=("$line")
    done
    [ "$load" = busy ] && stop_busy
done
echo "summary (medians; ratio = median of the pairs' ratios), load now $(cut -d' ' -f1-3 /proc/loadavg):"
printf '  %s\n' "${summary[@]}"
[ "$fail" = 0 ] || die "a swarm text differs from the one-process text (above)"
