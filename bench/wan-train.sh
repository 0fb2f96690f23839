#!/usr/bin/env bash
# wan-train.sh - training's passes over an emulated WAN, pushed from server to server and client-driven. A
# Llama-2-7B-shaped model of 8 layers (narrowed to --hidden, default 1024: a 4096-wide step takes tens of seconds on 2
# shared cores) in int8 on 3 sepal-server processes (blocks 0:3, 3:6, 6:8); the client reaches each through a
# bench/linkem link of D ms each way (default 25) for its websocket and bulk port, the servers reach each other
# through the same links in 5 ms (their --announce addresses, connecting from 127.0.0.2), as bench/wan.sh. One `sepal
# -c` session trains causal_lm (ptune, a fixed seed: the same data and start each time) for N steps with `push on` and
# with `push off`, R pairs in rotating order after a warm-up;
# prints each run's steps/s (the median of its steps but the first), the medians, the median of the pairs' ratios
# (on / off), and whether the losses of the two are the same (f32: they must be, bit for bit as printed).
# A pass crosses the client's link twice per server client-driven (6 x D through 3 servers), once each way pushed
# (2 x D + 2 x 5 ms).
#
# --wire W is the client's wire setting (default f32: the losses of push on and off are then the same bit for bit;
# auto may choose differently on the two, as each measures the links its own way).
#
# usage: bench/wan-train.sh [--delay D] [--reps R] [--steps N] [--batch B] [--length L] [--microbatches M]
#                           [--hidden H] [--wire W] [--models DIR] [--build DIR]
# Exit status: 0 after a run (whatever the ratios), 1 when a step fails or the losses differ. Every process it
# started is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

delay=25 reps=2 steps=4 batch=4 length=32 micro=4 hidden=1024 wire=f32
build="${SEPAL_BUILD_DIR:-build}" models="${SEPAL_CACHE:-$HOME/.cache/sepal}/models"
while [ $# -gt 0 ]; do
    case "$1" in
    --delay) delay="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    --length) length="$2"; shift 2 ;;
    --microbatches) micro="$2"; shift 2 ;;
    --hidden) hidden="$2"; shift 2 ;;
    --wire) wire="$2"; shift 2 ;;
    --models) models="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "wan-train: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
die() { echo "wan-train: $*" >&2; exit 1; }

. bench/pairs.sh # median, between
. bench/relays.sh # far_bins, model_8l, wan_servers, wan_links, stop_all
far_bins wan-train
export OPENBLAS_THREAD_TIMEOUT=4
tmp="$(mktemp -d)"
pids=()
trap 'stop_all; rm -rf "$tmp"' EXIT

model_8l "$hidden" || die "model init failed"
wan_servers || die "the swarm did not start"
wan_links "$delay" || die "linkem did not start"
python3 -c "print(' '.join(['Once upon a time there was a little girl who liked to play in the park with her dog.'] * 200))" \
    >"$tmp/text.txt"
echo "training over an emulated WAN: $model (hidden $hidden), int8, 3 servers (blocks ${spans[*]}); client links $delay ms"
echo "  each way, servers 5 ms apart; causal_lm ptune, batch $batch x $length, $micro microbatches, $steps steps a run"
echo "  CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) (shared)"

train="train causal_lm --args 'file=$tmp/text.txt length=$length' --tuning ptune --pre-seq-len 4 --batch $batch"
train="$train --max-length $length --max-steps $steps --eval-batches 1 --seed 7 --microbatches $micro"
script="load $model; set step-timeout 120; set wire $wire; connect 127.0.0.1:${cl[0]},127.0.0.1:${cl[1]},127.0.0.1:${cl[2]}"
script="$script; set push on; echo @@warm; $train"
kinds=(on off) order=()
for k in $(seq 1 "$reps"); do
    for j in 0 1; do
        kind="${kinds[$(((k - 1 + j) % 2))]}"
        order+=("$kind")
        script="$script; set push $kind; echo @@$kind$k; $train"
    done
done
"$sepal" -c "$script" >"$tmp/out" 2>&1 || { tail -20 "$tmp/out" >&2; die "the session failed"; }
# steps/s of run M (its step lines but the first), its losses
sps() { between "$tmp/out" "@@$1" | grep -E "^epoch [0-9]+ step" | sed -n 's/.*(\([0-9.]*\) tok\/s)$/\1/p' |
    tail -n +2 | awk -v n="$((batch * length))" '{printf "%.4f\n", $1 / n}' | median; }
losses() { between "$tmp/out" "@@$1" | grep -E "^epoch [0-9]+ step" | sed -n 's/.*loss \([0-9.]*\) .*/\1/p' | tr '\n' ' '; }
: >"$tmp/on" && : >"$tmp/off" && : >"$tmp/ratio"
fail=0
for k in $(seq 1 "$reps"); do
    on="$(sps on$k)" off="$(sps off$k)"
    echo "$on" >>"$tmp/on"; echo "$off" >>"$tmp/off"
    awk -v a="$on" -v b="$off" 'BEGIN {printf "%.3f\n", a / b}' >>"$tmp/ratio"
    same=same
    [ -n "$(losses on$k)" ] && [ "$(losses on$k)" = "$(losses off$k)" ] || { same=different; fail=1; }
    printf '  pair %d: push on %.3f steps/s, push off %.3f: on/off %.3f; losses %s (%s)\n' "$k" "$on" "$off" \
        "$(tail -1 "$tmp/ratio")" "$same" "$(losses on$k)"
done
printf 'medians: push on %.3f steps/s, push off %.3f; on/off %.3f (pairs: %s)\n' "$(median <"$tmp/on")" \
    "$(median <"$tmp/off")" "$(median <"$tmp/ratio")" "$(tr '\n' ' ' <"$tmp/ratio" | sed 's/ $//')"
grep -q "could not push" "$tmp/out" && echo "  (a server could not push: $(grep -m1 'could not push' "$tmp/out"))"
[ "$fail" = 0 ] || { echo "wan-train: the losses differ (see above)" >&2; exit 1; }
