#!/usr/bin/env bash
# compare.sh - stories15M greedy decode tokens/s of sepal (`sepal model generate`: every block in one process)
# against llama.cpp v0.5.0 (`llama-completion`) on the same machine, reps interleaved (A B, B A, ...):
#   sepal --dtype f32  vs llama.cpp F32    (goal: ratio >= 1.5)
#   sepal --dtype int8 vs llama.cpp Q8_0   (goal: ratio >= 1.5)
#   sepal --dtype nf4  vs llama.cpp Q4_0   (goal: ratio >= 1.0)
# each at every kernel level asked (SEPAL_ISA: avx2, avx512; a level this CPU lacks is skipped, said once; the
# level that ran is what sepal's note names), with 1 and 2 threads (sepal --threads N, llama.cpp -t N), on an
# idle machine and under contention (two busy processes, `yes >/dev/null`, started before those reps and
# stopped after them). llama.cpp runs the SIMD of sepal's level (bench/llama.sh: at avx2 an AVX2-only build of it,
# at avx512 its native one, -march=native; which build and its system_info line are printed).
# Prints every rep, the medians, the median of the pairs' ratios, and whether the greedy texts are identical
# (sepal f32 = llama.cpp F32 is required: a difference fails the run; int8 = Q8_0 and nf4 = Q4_0 are reported:
# the encodings and the activations' rounding differ).
#
# usage: bench/compare.sh [--reps R] [--tokens N] [--threads "1 2"] [--pairs "f32 int8 nf4"] [--isa "avx2 avx512"]
#                         [--load "idle busy"] [--llama-wait "passive default"] [--build DIR] [--prompt TEXT]
#   --reps R     pairs of runs per condition (default 5); --tokens N new tokens a run (default 120; llama.cpp's
#                stories15M GGUF has a context of 128)
#   --threads, --pairs, --isa, --load  which conditions (default: all); --build DIR: sepal's build (default
#                $SEPAL_BUILD_DIR or build)
#   --llama-wait how llama.cpp's threads wait (bench/llama.sh): passive (the default: OMP_WAIT_POLICY=passive and
#                --poll 0, its threads sleep at once, as sepal's pool does on a busy machine) or default (its own
#                settings: they spin first); both: each condition runs with each, paired with sepal each time
# Tokens/s is the decode rate both programs report, one-token forward passes (with sampling) per second after
# the prompt: llama.cpp's "eval time" line (runs / time), and sepal's "N new in S s" line as (N - 1) / S (the
# first new token comes from the prompt's pass). Loading, converting and quantising are outside it.
# llama.cpp is fetched and built by scripts/fetch-llama-cpp.sh into ${SEPAL_CACHE:-~/.cache/sepal} (the first
# run takes minutes); stories15M by scripts/fetch-model.sh. Both run with default settings but llama.cpp's waiting
# threads (--llama-wait; bench/llama.sh, shared with prefill.sh, unsets SEPAL_*, OPENBLAS_*, OMP_* and GOTO_* first).
# Exit status: 0 after a run (whatever the ratios), 1 when a step fails or sepal's f32 text differs from llama.cpp's
# F32 text.
set -euo pipefail
cd "$(dirname "$0")/.."

reps=5 tokens=120 threads_list="1 2" pairs="f32 int8 nf4" isas="avx2 avx512" loads="idle busy" build="${SEPAL_BUILD_DIR:-build}"
waits=passive
prompt="Once upon a time"
while [ $# -gt 0 ]; do
    case "$1" in
    --reps) reps="$2"; shift 2 ;;
    --tokens) tokens="$2"; shift 2 ;;
    --threads) threads_list="$2"; shift 2 ;;
    --pairs) pairs="$2"; shift 2 ;;
    --isa) isas="$2"; shift 2 ;;
    --load) loads="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --prompt) prompt="$2"; shift 2 ;;
    --llama-wait) waits="$2"; shift 2 ;;
    -h|--help) sed -n '2,32p' "$0"; exit 0 ;;
    *) echo "compare: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
bench=compare
. bench/llama.sh
check_waits "$waits"

goal_of() { case "$1" in nf4) echo 1.0 ;; *) echo 1.5 ;; esac; }

# run_sepal DTYPE THREADS OUT -> prints tok/s; the text in OUT.txt ($isa: the kernel level)
run_sepal() {
    SEPAL_ISA="$isa" "$sepal" model generate "$model" --prompt "$prompt" --max-new-tokens "$tokens" --ignore-eos \
        --dtype "$1" --threads "$2" >"$3.txt" 2>"$3.err" || { cat "$3.err" >&2; die "sepal model generate failed"; }
    sed -n 's/^sepal: .* \([0-9]*\) new in \([0-9.]*\) s .*/\1 \2/p' "$3.err" | tail -1 |
        awk '{ if ($1 < 2 || $2 <= 0) exit 1; printf "%.1f\n", ($1 - 1) / $2 }' ||
        { cat "$3.err" >&2; die "no token rate in sepal's output"; }
}
# run_llama DTYPE THREADS OUT -> prints tok/s; the text in OUT.txt ($wait: how its threads wait)
run_llama() { # a run whose output lacks the eval time (seen once on a loaded machine, exit 0) is run again
    local try rate
    for try in 1 2; do
        llama_exec "$wait" "$completion" -m "$(gguf_of "$1")" -p "$prompt" -n "$tokens" -t "$2" -tb "$2" -c 128 --temp 0 --seed 0 \
            --ignore-eos -no-cnv --no-warmup --simple-io </dev/null >"$3.txt" 2>"$3.err" ||
            { tail -20 "$3.err" >&2; die "llama-completion failed"; }
        rate="$(sed -n 's/.*eval time = *\([0-9.]*\) ms \/ *\([0-9]*\) runs.*/\1 \2/p' "$3.err" | tail -1 |
            awk '$1 > 0 { printf "%.1f\n", $2 / ($1 / 1000) }')"
        [ -n "$rate" ] && { echo "$rate"; return; }
    done
    tail -20 "$3.err" >&2
    die "no eval time in llama.cpp's output"
}
norm_text() { tr -s ' \n' ' ' <"$1" | sed 's/^ *//; s/ *$//'; }
median() { sort -g | awk '{v[NR] = $1} END {if (!NR) print 0; else print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

for d in $pairs; do [ -f "$(gguf_of "$d")" ] || die "$(gguf_of "$d") missing: run scripts/fetch-llama-cpp.sh"; done
isas="$(levels_run "$isas")"
cpu="$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
echo "compare: $("$sepal" --version 2>/dev/null | head -1) vs llama.cpp v0.5.0 (node-llama-cpp@3.22.1), stories15M," \
    "\"$prompt\" + $tokens tokens greedy, $reps rep pairs a condition, $cpu, $(getconf _NPROCESSORS_ONLN) cores," \
    "sepal's kernel levels: $isas, llama.cpp's threads wait: $(for w in $waits; do wait_says "$w"; done | paste -sd ';' |
        sed 's/;/; /g'), $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg)"
llama_builds "$isas"
fail=0
summary=()
for load in $loads; do
    [ "$load" = busy ] && start_busy
    for th in $threads_list; do
        for d in $pairs; do
            for isa in $isas; do
                ln="$(llama_name "$d")" completion="$(llama_for "$isa")"
                for wait in $waits; do : >"$tmp/s.$wait" && : >"$tmp/l.$wait" && : >"$tmp/r.$wait"; done
                for k in $(seq 1 "$reps"); do
                    for wait in $waits; do # the settings in turns within a rep: each paired with sepal
                        if [ $((k % 2)) -eq 1 ]; then
                            s="$(run_sepal "$d" "$th" "$tmp/s$k")"; l="$(run_llama "$d" "$th" "$tmp/l$k")"
                        else
                            l="$(run_llama "$d" "$th" "$tmp/l$k")"; s="$(run_sepal "$d" "$th" "$tmp/s$k")"
                        fi
                        ran="$(sed -n 's/^model generate: \([a-z0-9]*\) kernels.*/\1/p' "$tmp/s$k.err" | tail -1)"
                        [ "$ran" = "$isa" ] || die "SEPAL_ISA=$isa ran '${ran:-?}' kernels"
                        r="$(awk -v a="$s" -v b="$l" 'BEGIN {printf "%.3f", a / b}')"
                        echo "$s" >>"$tmp/s.$wait"; echo "$l" >>"$tmp/l.$wait"; echo "$r" >>"$tmp/r.$wait"
                        same=identical
                        [ "$(norm_text "$tmp/s$k.txt")" = "$(norm_text "$tmp/l$k.txt")" ] || same=different
                        printf '  %s, %s thread(s), %s on %s, rep %d: sepal %s %s tok/s, llama.cpp %s (%s) %s tok/s, ratio %s, texts %s\n' \
                            "$load" "$th" "$d" "$isa" "$k" "$d" "$s" "$ln" "$wait" "$l" "$r" "$same"
                        if [ "$same" = different ] && [ "$d" = f32 ]; then
                            fail=1
                            { echo "    sepal:     $(norm_text "$tmp/s$k.txt")"; echo "    llama.cpp: $(norm_text "$tmp/l$k.txt")"; } >&2
                        fi
                    done
                done
                for wait in $waits; do
                    line="$(printf '%-5s %s thread(s), %-12s %-7s sepal %s %.0f tok/s, llama.cpp %s (%s) %.0f tok/s, ratio %.2f (goal >= %s)' \
                        "$load," "$th" "$d vs $ln," "$isa:" "$d" "$(median <"$tmp/s.$wait")" "$ln" "$wait" \
                        "$(median <"$tmp/l.$wait")" "$(median <"$tmp/r.$wait")" "$(goal_of "$d")")"
                    echo "$line"
                    summary+=("$line")
                done
            done
        done
    done
    [ "$load" = busy ] && stop_busy
done
echo "summary (medians; ratio = median of the pairs' ratios), load now $(cut -d' ' -f1-3 /proc/loadavg):"
printf '  %s\n' "${summary[@]}"
[ "$fail" = 0 ] || die "sepal's f32 text differs from llama.cpp's F32 text (above)"
