#!/usr/bin/env bash
# prefill.sh - prompt processing (prefill) tokens/s of sepal (`sepal model generate`, every block in one process)
# against llama.cpp v0.5.0 (`llama-completion`'s "prompt eval time") on stories15M, prompts of 128 and 512
# tokens, reps interleaved (A B, B A, ...), each at every kernel level asked (SEPAL_ISA; at avx2 and avxvnni with
# OPENBLAS_CORETYPE=Haswell, so that sepal's large products run OpenBLAS's AVX2 sgemm, as on an AVX2 machine;
# llama.cpp the SIMD of the same level, as in compare.sh: at avx2 its AVX2-only build, scripts/fetch-llama-cpp.sh
# --isa avx2, at avx512 its native one; which is printed) with 1 and 2 threads:
#   sepal --dtype f32  vs llama.cpp F32,  int8 vs Q8_0,  nf4 vs Q4_0   (goal: ratio >= 1.0)
# stories15M's context is 256 positions (llama.cpp's GGUF says 128): both run it here with a context of 1024,
# sepal from a copy of the model whose config.json says max_position_embeddings 1024 (the weights linked, not
# copied), llama.cpp with -c 1024 (it warns that this exceeds the trained context, and runs). What the positions
# past 256 mean does not matter to the speed. The prompt is a story sentence repeated, cut to the number of words
# that makes exactly N tokens in sepal's tokenizer (llama.cpp's tokenizer counts the same; both counts printed).
# Each run generates one token after the prompt (-n 1 / --max-new-tokens 1): only the prompt's rate is read,
# sepal's "N prompt tokens in S s (R tok/s)" line (R, from the unrounded time) and llama.cpp's "prompt eval time
# = X ms / N tokens" line. Loading is outside both. A llama.cpp run whose output has no timings is run again, up
# to three times; then that rep is reported and left out (the summary counts them). Both run with default settings
# but llama.cpp's waiting threads (--llama-wait; bench/llama.sh unsets SEPAL_*, OPENBLAS_*, OMP_* and GOTO_*).
#
# usage: bench/prefill.sh [--reps R] [--lengths "128 512"] [--threads "1 2"] [--pairs "f32 int8 nf4"]
#                         [--isa "avx2 avx512"] [--load "idle busy"] [--llama-wait "passive default"] [--build DIR]
#   --load busy: two busy processes (`yes >/dev/null`) for those reps, as compare.sh does
#   --llama-wait: passive (the default) or default or both, as compare.sh's
# llama.cpp and its GGUFs come from scripts/fetch-llama-cpp.sh, stories15M from scripts/fetch-model.sh. Exit status
# 0 after a run (whatever the ratios), 1 when a run fails.
set -euo pipefail
cd "$(dirname "$0")/.."

reps=5 lengths="128 512" threads_list="1 2" pairs="f32 int8 nf4" isas="avx2 avx512" loads="idle" build="${SEPAL_BUILD_DIR:-build}"
waits=passive
while [ $# -gt 0 ]; do
    case "$1" in
    --reps) reps="$2"; shift 2 ;;
    --lengths) lengths="$2"; shift 2 ;;
    --threads) threads_list="$2"; shift 2 ;;
    --pairs) pairs="$2"; shift 2 ;;
    --isa) isas="$2"; shift 2 ;;
    --load) loads="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --llama-wait) waits="$2"; shift 2 ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "prefill: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
bench=prefill
. bench/llama.sh
check_waits "$waits"
. bench/pairs.sh

# the model with a context of 1024: its files linked, config.json rewritten
long="$tmp/model"
mkdir -p "$long"
for f in "$model"/*; do ln -s "$f" "$long/"; done
rm "$long/config.json"
sed 's/"max_position_embeddings":[[:space:]]*[0-9]*/"max_position_embeddings": 1024/' "$model/config.json" >"$long/config.json"
grep -q '"max_position_embeddings": 1024' "$long/config.json" || die "cannot set the context in $long/config.json"

story="Once upon a time, there was a little girl named Lily. She loved to play outside in the sunshine with her dog."
story="$story One day, she saw a big red ball in the park and ran to get it."
words() { # the first N words of the story repeated
    local s="" i
    for i in $(seq 1 $(($1 / 36 + 2))); do s="$s $story"; done
    echo "$s" | tr -s ' ' '\n' | sed '/^$/d' | head -n "$1" | tr '\n' ' ' | sed 's/ $//'
}
# sepal_run PROMPT DTYPE THREADS ISA -> "tokens rate" (prompt tokens and their tokens/s)
sepal_run() { # (at avx2 and avxvnni OpenBLAS runs its Haswell kernels too: an AVX2 machine's sgemm)
    local core=()
    [ "$4" = avx512 ] || core=(OPENBLAS_CORETYPE=Haswell)
    env "${core[@]}" SEPAL_ISA="$4" "$sepal" model generate "$long" --prompt "$1" --max-new-tokens 1 --dtype "$2" --threads "$3" \
        >/dev/null 2>"$tmp/s.err" || { cat "$tmp/s.err" >&2; die "sepal model generate failed"; }
    sed -n 's/^sepal: \([0-9]*\) prompt tokens in [0-9.]* s (\([0-9]*\) tok\/s).*/\1 \2/p' "$tmp/s.err" | tail -1 |
        awk '$2 > 0 { printf "%d %.1f\n", $1, $2 }' | grep . || { cat "$tmp/s.err" >&2; die "no prompt rate in sepal's output"; }
}
# llama_run PROMPT DTYPE THREADS -> "tokens rate", or nothing when three runs in a row printed no prompt eval time
# (llama.cpp writes its log from a thread of its own, not flushed at exit: on a loaded machine a run's timings
# were missing from its output now and then): the rep is reported and left out, the bench goes on ($wait: how
# its threads wait)
llama_run() {
    local try out
    for try in 1 2 3; do
        llama_exec "$wait" "$completion" -m "$(gguf_of "$2")" -p "$1" -n 1 -t "$3" -tb "$3" -c 1024 --temp 0 --seed 0 -no-cnv \
            --no-warmup --simple-io </dev/null >/dev/null 2>"$tmp/l.err" || { tail -20 "$tmp/l.err" >&2; die "llama-completion failed"; }
        out="$(sed -n 's/.*prompt eval time = *\([0-9.]*\) ms \/ *\([0-9]*\) tokens.*/\2 \1/p' "$tmp/l.err" | tail -1 |
            awk '$2 > 0 { printf "%d %.1f\n", $1, $1 / ($2 / 1000) }')"
        [ -n "$out" ] && { echo "$out"; return; }
        cp "$tmp/l.err" "$tmp/l.missing"
    done
    echo "$bench: no prompt eval time in llama.cpp's output in $try runs (the last one's end:)" >&2
    tail -5 "$tmp/l.missing" | sed 's/^/    /' >&2
}
# prompt_of N -> a prompt of exactly N tokens in sepal's tokenizer (or the nearest above)
prompt_of() {
    local n=$(($1 * 4 / 5)) got
    for _ in $(seq 1 40); do
        got="$(sepal_run "$(words "$n")" f32 1 "${isas%% *}" | cut -d' ' -f1)"
        [ "$got" -ge "$1" ] && break
        n=$((n + ($1 - got + 1) / 2))
    done
    while [ "$got" -gt "$1" ] && [ "$n" -gt 1 ]; do
        local t="$(sepal_run "$(words $((n - 1)))" f32 1 "${isas%% *}" | cut -d' ' -f1)"
        [ "$t" -ge "$1" ] || break
        n=$((n - 1)) got="$t"
    done
    words "$n"
}

isas="$(levels_run "$isas")"
for d in $pairs; do [ -f "$(gguf_of "$d")" ] || die "$(gguf_of "$d") missing: run scripts/fetch-llama-cpp.sh"; done
cpu="$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
echo "prefill: $("$sepal" --version 2>/dev/null | head -1) vs llama.cpp v0.5.0, stories15M (context 1024), prompts of" \
    "$lengths tokens, $reps rep pairs a condition, $cpu, $(getconf _NPROCESSORS_ONLN) cores, sepal's kernel levels:" \
    "$isas, llama.cpp's threads wait: $(for w in $waits; do wait_says "$w"; done | paste -sd ';' | sed 's/;/; /g')," \
    "$(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg)"
llama_builds "$isas"
declare -A prompts
missing=0
for n in $lengths; do prompts[$n]="$(prompt_of "$n")"; done
summary=()
for load in $loads; do
    [ "$load" = busy ] && start_busy
    for n in $lengths; do
        for th in $threads_list; do
            for d in $pairs; do
                for isa in $isas; do
                    ln="$(llama_name "$d")" completion="$(llama_for "$isa")"
                    for wait in $waits; do : >"$tmp/s.$wait" && : >"$tmp/l.$wait" && : >"$tmp/r.$wait"; done
                    for k in $(seq 1 "$reps"); do
                        for wait in $waits; do # the settings in turns within a rep: each paired with sepal
                            if [ $((k % 2)) -eq 1 ]; then
                                s="$(sepal_run "${prompts[$n]}" "$d" "$th" "$isa")"; l="$(llama_run "${prompts[$n]}" "$d" "$th")"
                            else
                                l="$(llama_run "${prompts[$n]}" "$d" "$th")"; s="$(sepal_run "${prompts[$n]}" "$d" "$th" "$isa")"
                            fi
                            if [ -z "$l" ]; then
                                printf '  %s, %s tokens, %s thread(s), %s on %s, rep %d: sepal %s tok/s, llama.cpp (%s) no figure: rep left out\n' \
                                    "$load" "$n" "$th" "$d" "$isa" "$k" "${s#* }" "$wait"
                                missing=$((missing + 1))
                                continue
                            fi
                            r="$(awk -v a="${s#* }" -v b="${l#* }" 'BEGIN {printf "%.3f", a / b}')"
                            echo "${s#* }" >>"$tmp/s.$wait"; echo "${l#* }" >>"$tmp/l.$wait"; echo "$r" >>"$tmp/r.$wait"
                            printf '  %s, %s tokens, %s thread(s), %s on %s, rep %d: sepal %s tok/s (%s tokens), llama.cpp %s (%s) %s tok/s (%s tokens), ratio %s\n' \
                                "$load" "$n" "$th" "$d" "$isa" "$k" "${s#* }" "${s%% *}" "$ln" "$wait" "${l#* }" "${l%% *}" "$r"
                        done
                    done
                    for wait in $waits; do
                        if [ -s "$tmp/r.$wait" ]; then
                            line="$(printf '%-5s %3s tokens, %s thread(s), %-12s %-7s sepal %.0f tok/s, llama.cpp (%s) %.0f tok/s, ratio %.2f (goal >= 1.0)' \
                                "$load," "$n" "$th" "$d vs $ln," "$isa:" "$(median <"$tmp/s.$wait")" "$wait" "$(median <"$tmp/l.$wait")" \
                                "$(median <"$tmp/r.$wait")")"
                        else
                            line="$(printf '%-5s %3s tokens, %s thread(s), %-12s %-7s no pair (llama.cpp (%s) printed no timings)' \
                                "$load," "$n" "$th" "$d vs $ln," "$isa:" "$wait")"
                        fi
                        echo "$line"
                        summary+=("$line")
                    done
                done
            done
        done
    done
    [ "$load" = busy ] && stop_busy
done
echo "summary (medians; ratio = median of the pairs' ratios), load now $(cut -d' ' -f1-3 /proc/loadavg)$(
    [ "$missing" -eq 0 ] || echo ", $missing rep(s) left out: llama.cpp printed no timings"):"
printf '  %s\n' "${summary[@]}"
