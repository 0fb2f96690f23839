#!/usr/bin/env bash
# bandwidth.sh - issue 24's bench 3: prompt tuning through links of limited rate, per wire format of training's
# hidden states and gradients (the `wire` setting: f32, f16, bf16, q8, and auto, which chooses by the link the client
# measured). A Llama-2-7B-shaped model of 8 layers in int8 on 3 sepal-server processes (blocks 0:3, 3:6, 6:8), each
# behind a bench/linkem relay of D ms each way (default 25) and R Mbit/s each way (each of --rates, default
# "1000 100") for its websocket and its bulk port (--announce, --announce-bulk-port: clients and the other servers'
# pushes cross it). Per rate, one `sepal -c` session trains causal_lm (ptune, a fixed seed: the same data and start
# each time) for N steps in each format, in rotating order; prints the median steps/s of each (from the step lines'
# tokens/s), its ratio to f32's at that rate, each format's losses against f32's (max |difference| over the steps),
# and what the client measured of each link and auto sent there (`servers --long`). Gradient error per format:
# test_runtime's (README, "Training over a slow link").
#
# usage: bench/bandwidth.sh [--rates "1000 100"] [--delay D] [--steps N] [--batch B] [--length L] [--hidden H]
#                           [--formats "f32 f16 bf16 q8 auto"] [--models DIR] [--build DIR]
#   --hidden H  the model's width: 4096 (Llama-2-7B's) uses llama-2-7b-like-8l; narrower ones (default 1024, since
#               a 4096-wide step takes tens of seconds on 2 shared cores) are made once as llama-2-7b-like-8l-hH
# Exit status: 0 after a run, 1 when a step fails. Every process it started is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

rates="1000 100" delay=25 steps=4 batch=4 length=32 hidden=1024 formats="f32 f16 bf16 q8 auto"
build="${SEPAL_BUILD_DIR:-build}" models="${SEPAL_CACHE:-$HOME/.cache/sepal}/models"
while [ $# -gt 0 ]; do
    case "$1" in
    --rates) rates="$2"; shift 2 ;;
    --delay) delay="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    --length) length="$2"; shift 2 ;;
    --hidden) hidden="$2"; shift 2 ;;
    --formats) formats="$2"; shift 2 ;;
    --models) models="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "bandwidth: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
die() { echo "bandwidth: $*" >&2; exit 1; }

. bench/pairs.sh # median
. bench/relays.sh # far_bins, model_8l, stop_all, free_ports
far_bins bandwidth
export OPENBLAS_THREAD_TIMEOUT=4
tmp="$(mktemp -d)"
pids=()
trap 'stop_all; rm -rf "$tmp"' EXIT

model_8l "$hidden" || die "model init failed"
spans=(0:3 3:6 6:8)
read -r -a ports <<<"$(free_ports 12)" # ws, bulk, the ws relay, the bulk relay of each server
for i in 0 1 2; do
    "$server" --model "$model" --blocks "${spans[$i]}" --dtype int8 --no-measure --port "${ports[$i]}" \
        --bulk-port "${ports[$((3 + i))]}" --announce "127.0.0.1:${ports[$((6 + i))]}" \
        --announce-bulk-port "${ports[$((9 + i))]}" >"$tmp/s$i.out" 2>&1 &
    pids+=($!)
done
for i in 0 1 2; do
    until grep -qs "^sepal-server: serving" "$tmp/s$i.out"; do
        kill -0 "${pids[$i]}" 2>/dev/null || { cat "$tmp/s$i.out" >&2; die "server $i died"; }
        sleep 0.2
    done
done
# a text to tune on: the stories15M tokenizer's kind of English
python3 -c "print(' '.join(['Once upon a time there was a little girl who liked to play in the park with her dog.'] * 200))" \
    >"$tmp/text.txt"
echo "bench 3: $model (hidden $hidden), int8, 3 servers (blocks ${spans[*]}), client links $delay ms each way;"
echo "  causal_lm ptune, batch $batch x $length tokens, $steps steps a format, formats: $formats"
echo "  CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) (shared)"

train="train causal_lm --args 'file=$tmp/text.txt length=$length' --tuning ptune --pre-seq-len 4 --batch $batch"
train="$train --max-length $length --max-steps $steps --eval-batches 1 --seed 7"
read -r -a fmts <<<"$formats"
nf=${#fmts[@]} ri=0
lk=
for r in $rates; do
    ri=$((ri + 1))
    args=()
    for i in 0 1 2 3 4 5; do args+=(--listen "127.0.0.1:${ports[$((6 + i))]}" --to "127.0.0.1:${ports[$i]}"); done
    [ -n "$lk" ] && { kill "$lk"; wait "$lk" 2>/dev/null || true; } # the last rate's relays: their ports again
    "$linkem" --delay "$delay" --rate "$r" "${args[@]}" >"$tmp/l$r.out" 2>"$tmp/l$r.err" &
    lk=$!
    pids+=($lk)
    for _ in $(seq 100); do grep -qs "^linkem: ready" "$tmp/l$r.out" && break; sleep 0.05; done
    grep -q "^linkem: ready" "$tmp/l$r.out" || { cat "$tmp/l$r.err" >&2; die "linkem did not start"; }
    cl=("${ports[@]:6:3}")
    script="load $model; set step-timeout 120; connect 127.0.0.1:${cl[0]},127.0.0.1:${cl[1]},127.0.0.1:${cl[2]}"
    for k in $(seq 0 $((nf - 1))); do # rotating order: the first format runs cold once, then each moves up a place
        f="${fmts[$(((k + ri) % nf))]}"
        script="$script; set wire $f; echo @@$f; $train"
    done
    script="$script; echo @@links; servers --long"
    "$sepal" -c "$script" >"$tmp/out" 2>&1 || { tail -20 "$tmp/out" >&2; die "the session failed at $r Mbit/s"; }
    echo "$r Mbit/s each way:"
    for f in "${fmts[@]}"; do
        awk -v m="@@$f" '$0 ~ /^@@/ {on = ($0 == m); next} on' "$tmp/out" | grep -E "^epoch [0-9]+ step" >"$tmp/$f.steps" || true
        [ -s "$tmp/$f.steps" ] || { cat "$tmp/out" >&2; die "no step lines for $f"; }
        sed -n 's/.*loss \([0-9.]*\) .*/\1/p' "$tmp/$f.steps" >"$tmp/$f.loss"
        sed -n 's/.*(\([0-9.]*\) tok\/s)$/\1/p' "$tmp/$f.steps" | tail -n +2 |
            awk -v n="$((batch * length))" '{printf "%.4f\n", $1 / n}' >"$tmp/$f.sps" # the first step warms up
    done
    base="$(median <"$tmp/${fmts[0]}.sps")"
    for f in "${fmts[@]}"; do
        sps="$(median <"$tmp/$f.sps")"
        dl="$(paste "$tmp/$f.loss" "$tmp/${fmts[0]}.loss" | awk '{d = $1 - $2; d = d < 0 ? -d : d; if (d > m) m = d} END {printf "%.4f", m}')"
        printf '  %-5s %.3f steps/s (%.2fx %s), losses %s; max |loss - %s loss| %s\n' "$f" "$sps" \
            "$(awk -v a="$sps" -v b="$base" 'BEGIN {print (b > 0 ? a / b : 0)}')" "${fmts[0]}" \
            "$(tr '\n' ' ' <"$tmp/$f.loss" | sed 's/ $//')" "${fmts[0]}" "$dl"
    done
    awk '$0 == "@@links" {on = 1; next} on' "$tmp/out" | grep -E "^  (address|link) " |
        paste - - | sed 's/^  address *\(.*\)\t  link *\(.*\)/  link of \1: \2/'
done
