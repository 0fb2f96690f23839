#!/usr/bin/env bash
# `sepal model generate` on stories15M (converted by our command) prints exactly what llama2.c's run.c
# printed for every golden prompt: the prompt, then the greedy continuation, then a newline; at every kernel
# level the CPU runs (SEPAL_ISA), and an unknown or missing level is refused.
. "$(dirname "$0")/lib.bash"
M="${SEPAL_STORIES15M_DIR:?}"
G="$SEPAL_TEST_DATA/stories15M/golden.jsonl"
if [ ! -f "$M/model.safetensors" ]; then
    bad "$M: no converted stories15M; run scripts/fetch-model.sh first"
    finish
fi
n=$(wc -l < "$G")
for i in $(seq 0 $((n - 1))); do
    # prompt, and new tokens = steps - len(prompt_ids) + 1 (run.c's -n counts the prompt)
    python3 - "$G" "$i" "$TMP/prompt" "$TMP/want" "$TMP/n" <<'PY'
import json, sys
d = [json.loads(l) for l in open(sys.argv[1])][int(sys.argv[2])]
open(sys.argv[3], "w").write(d["prompt"])
open(sys.argv[4], "w").write(d["text"])
open(sys.argv[5], "w").write(str(d["steps"] - len(d["prompt_ids"]) + 1))
PY
    "$SEPAL" model generate "$M" --prompt "$(cat "$TMP/prompt")" --max-new-tokens "$(cat "$TMP/n")" > "$TMP/got" 2> "$TMP/err"
    rc=$?
    if [ $rc -ne 0 ]; then
        bad "line $i: exit $rc: $(cat "$TMP/err")"
    elif cmp -s "$TMP/got" "$TMP/want"; then
        ok "line $i: $(head -c 40 "$TMP/prompt") ... identical to run.c"
    else
        bad "line $i: text differs from run.c"
        diff <(fold -w 80 "$TMP/want") <(fold -w 80 "$TMP/got") | head -6 | sed 's/^/    /'
    fi
done
# the last golden line at every kernel level (SEPAL_ISA): run.c's text again, and the note names the level; a
# level this CPU lacks is refused (exit 2, saying what it runs), an unknown name too
for isa in scalar avx2 avxvnni avx512; do
    SEPAL_ISA=$isa "$SEPAL" model generate "$M" --prompt "$(cat "$TMP/prompt")" --max-new-tokens "$(cat "$TMP/n")" \
        > "$TMP/got" 2> "$TMP/err"
    rc=$?
    if [ $rc -eq 0 ] && cmp -s "$TMP/got" "$TMP/want" && grep -q "^model generate: $isa kernels " "$TMP/err"; then
        ok "SEPAL_ISA=$isa: identical to run.c ($(grep '^model generate: ' "$TMP/err"))"
    elif [ $rc -eq 2 ] && grep -q "^sepal: SEPAL_ISA=$isa: this CPU does not run $isa kernels (it runs scalar" "$TMP/err"; then
        ok "SEPAL_ISA=$isa refused: $(cat "$TMP/err")"
    else
        bad "SEPAL_ISA=$isa: exit $rc: $(tail -3 "$TMP/err")"
    fi
done
# OpenBLAS's kernels (core/blastune.h): where it picks a core without AVX2 on a CPU it does not know (Debian 12's
# 0.3.21 on newer CPUs: "Prescott"), sepal runs itself again with OPENBLAS_CORETYPE set to what the CPU has; the
# note names the core that runs. A coretype the user set, and SEPAL_BLAS_CORE=keep, are left alone.
strong='^(Haswell|Zen|SkylakeX|Cooperlake|SapphireRapids)$'
core_of() { sed -n 's/^model generate: .*, OpenBLAS \([A-Za-z0-9()]*\), [0-9]* threads\{0,1\}$/\1/p' "$1"; }
env -u OPENBLAS_CORETYPE OPENBLAS_VERBOSE=2 "$SEPAL" model generate "$M" --prompt "$(cat "$TMP/prompt")" \
    --max-new-tokens "$(cat "$TMP/n")" > "$TMP/got" 2> "$TMP/err"
core="$(core_of "$TMP/err")" chosen="$(sed -n 's/^Core: //p' "$TMP/err" | head -1)"
if ! cmp -s "$TMP/got" "$TMP/want" || [ -z "$core" ]; then
    bad "OpenBLAS's core: the text differs or the note names none: $(tail -3 "$TMP/err")"
elif grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo && ! [[ "$core" =~ $strong ]]; then
    bad "this CPU has AVX2 and FMA, OpenBLAS runs its $core kernels (it chose $chosen)"
elif [[ "$chosen" =~ $strong ]] && [ "$(grep -c '^Core: ' "$TMP/err")" != 1 ]; then
    bad "OpenBLAS chose $chosen, and sepal ran itself again: $(grep '^Core: ' "$TMP/err" | tr '\n' ' ')"
else
    ok "OpenBLAS runs its $core kernels (it chose $chosen by itself), text identical to run.c"
fi
env OPENBLAS_CORETYPE=Prescott "$SEPAL" model generate "$M" --prompt "$(cat "$TMP/prompt")" \
    --max-new-tokens "$(cat "$TMP/n")" > "$TMP/got" 2> "$TMP/err"
if cmp -s "$TMP/got" "$TMP/want" && [ "$(core_of "$TMP/err")" = Prescott ]; then
    ok "OPENBLAS_CORETYPE=Prescott is kept, text identical to run.c"
else
    bad "OPENBLAS_CORETYPE=Prescott: $(tail -3 "$TMP/err")"
fi
env -u OPENBLAS_CORETYPE SEPAL_BLAS_CORE=keep OPENBLAS_VERBOSE=2 "$SEPAL" model generate "$M" --prompt Hi \
    --max-new-tokens 2 > /dev/null 2> "$TMP/err"
if [ "$(grep -c '^Core: ' "$TMP/err")" = 1 ] && [ "$(sed -n 's/^Core: //p' "$TMP/err")" = "$(core_of "$TMP/err")" ]; then
    ok "SEPAL_BLAS_CORE=keep keeps OpenBLAS's choice ($(core_of "$TMP/err"))"
else
    bad "SEPAL_BLAS_CORE=keep: $(grep -E '^(Core|model generate):' "$TMP/err" | tr '\n' ' ')"
fi
expect 2 "an unknown SEPAL_ISA is refused" "^sepal: SEPAL_ISA=avx9: not a kernel level \(scalar, avx2, avxvnni, avx512\)$" -- \
    env SEPAL_ISA=avx9 "$SEPAL" model generate "$M" --prompt Hi --max-new-tokens 2
expect 0 "sampling with a seed is repeatable" "" -- bash -c "[ \"\$('$SEPAL' model generate '$M' --prompt Hi --temperature 0.9 --seed 7 --max-new-tokens 20 2>/dev/null)\" = \"\$('$SEPAL' model generate '$M' --prompt Hi --temperature 0.9 --seed 7 --max-new-tokens 20 2>/dev/null)\" ]"
expect 0 "different seeds differ" "" -- bash -c "[ \"\$('$SEPAL' model generate '$M' --prompt Hi --temperature 0.9 --seed 7 --max-new-tokens 20 2>/dev/null)\" != \"\$('$SEPAL' model generate '$M' --prompt Hi --temperature 0.9 --seed 8 --max-new-tokens 20 2>/dev/null)\" ]"
# the greedy story ends (EOS) after 217 new tokens; --ignore-eos goes on to the limit, --min-new-tokens past 217
expect 0 "the story ends by itself" "217 new in .* stop: eos" -- "$SEPAL" model generate "$M" --prompt "Once upon a time" --max-new-tokens 250
expect 0 "--ignore-eos goes on to --max-new-tokens" "250 new in .* stop: length" -- "$SEPAL" model generate "$M" --prompt "Once upon a time" --max-new-tokens 250 --ignore-eos
expect 0 "--min-new-tokens holds the end back" " 2(4[0-9]|50) new in " -- "$SEPAL" model generate "$M" --prompt "Once upon a time" --max-new-tokens 250 --min-new-tokens 240
expect 1 "missing tokenizer" "tokenizer.json" -- "$SEPAL" model generate "$SEPAL_TEST_DATA/hf-tiny/llama-gqa" --prompt Hi
finish
