#!/usr/bin/env bash
# train-vs-torch.sh - prompt-tuning tokens/s of our single-process step (bench_train --local-only) vs
# PyTorch doing the same step (bench/train_torch.py) on the identical batches and initial parameters, with
# the same thread count, rounds interleaved (ours, torch, torch, ours, ...). tokens = the positions really run,
# B x (T + P) per step. Prints "ours X tok/s, pytorch Y tok/s, ratio X/Y (goal >= 1.0)".
#
# usage: bench/train-vs-torch.sh [--threads N] [--rounds K] [--reps R] [--build DIR] [MODEL_DIR]
#   --threads N  OpenBLAS threads for both, torch.set_num_threads(N) and OMP_NUM_THREADS=N (default 2)
#   --rounds K   runs of each program (default 3); --reps R timed steps per run (default 8), after 1 warm-up
#   --build DIR  where bench_train was built (default $SEPAL_BUILD_DIR or build)
# Both run with OPENBLAS_THREAD_TIMEOUT=4; PyTorch also with OMP_WAIT_POLICY=PASSIVE unless it is set.
# PYTHON=... picks the interpreter (default: the first of python3 on PATH and /usr/bin/python3 that has torch).
# Exit status: 0 after a run (whatever the ratio), 2 if PyTorch or bench_train is missing, 1 on a failed run
# (including a warm-up loss that differs from ours on identical inputs).
set -euo pipefail
cd "$(dirname "$0")/.."

threads=2 rounds=3 reps=8 build="${SEPAL_BUILD_DIR:-build}" model=()
while [ $# -gt 0 ]; do
    case "$1" in
    --threads) threads="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    -*) echo "train-vs-torch: unknown option $1" >&2; exit 2 ;;
    *) model=("$1"); shift ;;
    esac
done

py=""
for p in ${PYTHON:-} python3 /usr/bin/python3; do
    if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import torch, numpy' >/dev/null 2>&1; then
        py="$p"
        break
    fi
done
if [ -z "$py" ]; then
    echo "train-vs-torch: PyTorch is not installed (no python3 with torch and numpy; on Debian: apt-get install -y python3-torch python3-numpy, or set PYTHON=...)" >&2
    exit 2
fi
bin="$build/bench/bench_train"
if [ ! -x "$bin" ]; then
    echo "train-vs-torch: $bin not found: build first (SEPAL_BUILD_DIR=$build scripts/build.sh)" >&2
    exit 2
fi

export OPENBLAS_NUM_THREADS="$threads" OPENBLAS_THREAD_TIMEOUT=4 OMP_NUM_THREADS="$threads"
# PyTorch's OpenMP threads otherwise spin after each parallel region, competing with OpenBLAS's threads for
# the cores (the counterpart of OPENBLAS_THREAD_TIMEOUT=4); PASSIVE is its faster setting on a small machine.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
dump="$tmp/batch.txt"

run_ours() {
    "$bin" "${model[@]}" --local-only --reps "$reps" --dump-batch "$dump" >"$tmp/ours.$1" 2>&1 ||
        { cat "$tmp/ours.$1" >&2; echo "train-vs-torch: bench_train failed" >&2; exit 1; }
}
run_torch() {
    "$py" bench/train_torch.py "$dump" --threads "$threads" >"$tmp/torch.$1" 2>&1 ||
        { cat "$tmp/torch.$1" >&2; echo "train-vs-torch: train_torch.py failed" >&2; exit 1; }
}
# "  rep N: ... X tok/s (T t, P positions, M ms, ..." -> "X P M"
reps_of() { sed -n 's/^  rep [0-9]*: [a-z]* \([0-9.]*\) tok\/s (T [0-9]*, \([0-9]*\) positions, \([0-9.]*\) ms.*/\1 \2 \3/p' "$@"; }
median() { sort -g | awk '{v[NR] = $1} END {print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
summary() { # files -> "median aggregate"
    local m a
    m="$(reps_of "$@" | awk '{print $1}' | median)"
    a="$(reps_of "$@" | awk '{p += $2; t += $3} END {printf "%.1f", p / (t / 1000)}')"
    echo "$m $a"
}

echo "train-vs-torch: $threads thread(s), $rounds rounds x $reps reps, OPENBLAS_THREAD_TIMEOUT=4, OMP_WAIT_POLICY=$OMP_WAIT_POLICY, $($py -c 'import torch; print("torch", torch.__version__)'), $(getconf _NPROCESSORS_ONLN) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
run_ours 0 # the dump every round uses (batches and initial parameters are the same every run)
for k in $(seq 1 "$rounds"); do
    if [ $((k % 2)) -eq 1 ]; then run_ours "$k"; run_torch "$k"; else run_torch "$k"; run_ours "$k"; fi
    read -r om oa <<<"$(summary "$tmp/ours.$k")"
    read -r tm ta <<<"$(summary "$tmp/torch.$k")"
    chk="$(sed -n 's/^  warm-up: .*|diff| \([^)]*\)).*/\1/p' "$tmp/torch.$k")"
    printf '  round %d: ours %.0f tok/s (all reps %.0f), pytorch %.0f tok/s (all reps %.0f), ratio %.2f; warm-up loss |ours - torch| %s\n' \
        "$k" "$om" "$oa" "$tm" "$ta" "$(awk -v a="$om" -v b="$tm" 'BEGIN {print a / b}')" "$chk"
done
files_o=() files_t=()
for k in $(seq 1 "$rounds"); do files_o+=("$tmp/ours.$k"); files_t+=("$tmp/torch.$k"); done
read -r om oa <<<"$(summary "${files_o[@]}")"
read -r tm ta <<<"$(summary "${files_t[@]}")"
grep -h '^train step' "$tmp/ours.1" "$tmp/torch.1" | sed 's/^/  (round 1) /'
printf 'prompt tuning (deep_ptune, sst2, %d threads): ours %.0f tok/s, pytorch %.0f tok/s, ratio %.2f (goal >= 1.0); over all reps: ours %.0f, pytorch %.0f, ratio %.2f\n' \
    "$threads" "$om" "$tm" "$(awk -v a="$om" -v b="$tm" 'BEGIN {print a / b}')" "$oa" "$ta" \
    "$(awk -v a="$oa" -v b="$ta" 'BEGIN {print a / b}')"
