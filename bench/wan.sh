#!/usr/bin/env bash
# wan.sh - issue 24's bench 2: an emulated WAN on one machine. A Llama-2-7B-shaped model of 8 layers (`sepal model
# init --like llama-2-7b --layers 8`, made once) served with --dtype int8 by 3 sepal-server processes (blocks 0:3, 3:6,
# 6:8); the client reaches each (websocket and bulk port) through a bench/linkem link of D ms each way (default 25),
# the servers reach each other through the same links in 5 ms (their --announce addresses, connecting from 127.0.0.2:
# relays.sh's wan_servers). Per-token latency of greedy decode steps, push on
# (server to server) and push off (client-driven), against the floor: one process's compute per token (`model
# generate --dtype int8`, every block local, in the same app while the servers idle) + D + 5 + 5 + D ms (what a
# token must cross at least: client -> server 1 -> server 2 -> server 3 -> client). Goal with push: <= 1.15x the
# floor. One `sepal -c` session per delay: load, connect, a warm-up, then R triples (push on, push off, one
# process) in rotating order. Texts must be identical. Prints every triple, the medians, the medians of the
# triples' ratios (to the floor, and push on / push off) and how many generations stopped pushing (a push not
# acknowledged within 2 s turns a generation client-driven).
#
# usage: bench/wan.sh [--delays "25 200"] [--reps R] [--tokens N] [--wire W] [--models DIR] [--build DIR]
#   --delays LIST  client <-> server one-way delays in ms, a session each (default "25")
#   --reps R       triples (default 3); --tokens N new tokens a generation (default 32)
#   --wire W       the client's wire setting (default f32: the texts must be one process's; with auto a prompt's
#                  prefill over a link measured slow goes in bf16)
#   --models DIR   where the model is (made there the first time; default $SEPAL_CACHE/models, else
#                  ~/.cache/sepal/models); --build DIR: sepal's build (default $SEPAL_BUILD_DIR or build)
# Exit status: 0 after a run (whatever the ratios), 1 when a step fails or a text differs. Every process it started
# is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

delays="25" reps=3 tokens=32 wire=f32 build="${SEPAL_BUILD_DIR:-build}" prompt="Once upon a time"
models="${SEPAL_CACHE:-$HOME/.cache/sepal}/models"
while [ $# -gt 0 ]; do
    case "$1" in
    --delays) delays="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    --tokens) tokens="$2"; shift 2 ;;
    --wire) wire="$2"; shift 2 ;;
    --models) models="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "wan: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
die() { echo "wan: $*" >&2; exit 1; }

. bench/pairs.sh # median, between
. bench/relays.sh # far_bins, model_8l, wan_servers, wan_links, stop_all
far_bins wan
export OPENBLAS_THREAD_TIMEOUT=4 # idle BLAS threads sleep at once (several processes share the cores)
tmp="$(mktemp -d)"
pids=()
trap 'stop_all; rm -rf "$tmp"' EXIT
# milliseconds per decode step of every "N new in S s" line of a file: S / (N - 1) (the first token is the prefill's)
ms_per_token() { sed -n 's/^sepal: .* \([0-9]*\) new in \([0-9.]*\) s .*/\1 \2/p' "$1" | awk '{printf "%.1f\n", 1000 * $2 / ($1 - 1)}'; }

model_8l 4096 || die "model init failed"

wan_servers || die "the swarm did not start"
echo "bench 2: $model, int8, 3 servers (blocks ${spans[*]}), servers 5 ms apart (linkem), $tokens new tokens"
echo "  CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores (shared with other work: figures are a loaded machine's)"

gen="generate '$prompt' --max-new-tokens $tokens --ignore-eos"
one="model generate $model --prompt '$prompt' --max-new-tokens $tokens --ignore-eos --dtype int8"
fail=0 summary=()
for d in $delays; do
    wan_links "$d" || die "linkem did not start"
    script="load $model; set dtype int8; set step-timeout 60; set wire $wire; connect 127.0.0.1:${cl[0]},127.0.0.1:${cl[1]},127.0.0.1:${cl[2]}"
    script="$script; $gen" # a warm-up (push on)
    kinds=(on off one) order=()
    for k in $(seq 1 "$reps"); do
        for j in 0 1 2; do
            kind="${kinds[$(((k - 1 + j) % 3))]}"
            order+=("$kind")
            case "$kind" in
            on) script="$script; set push on; echo @@on $k; $gen" ;;
            off) script="$script; set push off; echo @@off $k; $gen" ;;
            one) script="$script; echo @@one $k; $one" ;;
            esac
        done
    done
    "$sepal" -c "$script" >"$tmp/out" 2>"$tmp/err" || { tail -20 "$tmp/err" >&2; die "the session failed"; }
    ms_per_token "$tmp/err" | tail -n +2 >"$tmp/ms"
    [ "$(wc -l <"$tmp/ms")" -eq $((3 * reps)) ] || { cat "$tmp/err" >&2; die "expected $((3 * reps)) rates"; }
    echo "client <-> servers $d ms each way: floor = one process + $d + 5 + 5 + $d ms"
    : >"$tmp/r.on" && : >"$tmp/r.off" && : >"$tmp/r.one" && : >"$tmp/r.fl" && : >"$tmp/r.ron" && : >"$tmp/r.roff"
    : >"$tmp/r.onoff"
    for k in $(seq 1 "$reps"); do
        declare -A v=()
        for j in 0 1 2; do v[${order[$((3 * (k - 1) + j))]}]="$(sed -n "$((3 * (k - 1) + j + 1))p" "$tmp/ms")"; done
        same=identical
        ton="$(between "$tmp/out" "@@on $k")" toff="$(between "$tmp/out" "@@off $k")" tone="$(between "$tmp/out" "@@one $k")"
        if [ -z "$ton" ] || [ "$ton" != "$toff" ] || [ "$ton" != "$tone" ]; then same=different fail=1; fi
        floor="$(awk -v c="${v[one]}" -v d="$d" 'BEGIN {printf "%.1f", c + 2 * d + 10}')"
        echo "${v[on]}" >>"$tmp/r.on"; echo "${v[off]}" >>"$tmp/r.off"; echo "${v[one]}" >>"$tmp/r.one"
        echo "$floor" >>"$tmp/r.fl"
        awk -v a="${v[on]}" -v f="$floor" 'BEGIN {printf "%.3f\n", a / f}' >>"$tmp/r.ron"
        awk -v a="${v[off]}" -v f="$floor" 'BEGIN {printf "%.3f\n", a / f}' >>"$tmp/r.roff"
        awk -v a="${v[on]}" -v b="${v[off]}" 'BEGIN {printf "%.3f\n", a / b}' >>"$tmp/r.onoff"
        printf '  triple %d: push on %s ms/token, push off %s, one process %s (floor %s): on %.3fx, off %.3fx the floor, on/off %.3f; texts %s\n' \
            "$k" "${v[on]}" "${v[off]}" "${v[one]}" "$floor" "$(tail -1 "$tmp/r.ron")" "$(tail -1 "$tmp/r.roff")" \
            "$(tail -1 "$tmp/r.onoff")" "$same"
        unset v
    done
    nopush="$(grep -c "could not push" "$tmp/err" || true)" # a push not acknowledged in 2 s: that generation went client-driven
    summary+=("$(printf '%s ms links: push on %.1f ms/token, push off %.1f, one process %.1f, floor %.1f; on %.3fx the floor (goal <= 1.15), off %.3fx; on/off %.3f; generations that stopped pushing: %s' \
        "$d" "$(median <"$tmp/r.on")" "$(median <"$tmp/r.off")" "$(median <"$tmp/r.one")" "$(median <"$tmp/r.fl")" \
        "$(median <"$tmp/r.ron")" "$(median <"$tmp/r.roff")" "$(median <"$tmp/r.onoff")" "$nopush")")
done
echo "medians:"
for s in "${summary[@]}"; do echo "  $s"; done
[ "$fail" = 0 ] || { echo "wan: a text differs (see above)" >&2; exit 1; }
