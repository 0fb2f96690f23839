#!/usr/bin/env bash
# `train --log FILE` and `plot FILE [FILE...]`: two prompt-tuning runs of sst2 through a real 2-server swarm of
# stories15M, at two learning rates, each logging JSON Lines (the run's line, then every step's step, epoch, loss,
# lr, grad_norm, tokens_per_s, t, and the epoch's validation); `plot` draws both in the REPL as text (a marker per
# run, the legend with first, last and best values), any metric of them; its errors (a missing file, a file that
# is not a log, a metric the logs lack, a log that exists); and in the TUI (tmux) the training panel shows the
# runs' curves with their names until a training starts.
. "$(dirname "$0")/lib.bash"
. "$(dirname "$0")/tui_tmux.bash"
cd "$TMP" || exit 1
TR="sst2 --tuning ptune --pre-seq-len 4 --batch 4 --max-length 32 --max-steps 12 --eval-batches 1"
SEPAL_CACHE="$TMP/cache" "$SEPAL" -c "load $M; swarm up 2; train $TR --log a.jsonl; train $TR --lr 0.05 --log b.jsonl; \
echo ==plot==; plot a.jsonl b.jsonl; echo ==acc==; plot a.jsonl b.jsonl --metric accuracy --height 6; \
echo ==gn==; plot b.jsonl --metric grad_norm --width 40 --height 5" > out 2> err
rc=$?
[ $rc -eq 0 ] && ok "two runs logged and plotted" || { bad "sepal -c: exit $rc: $(tail -3 err)"; finish; }
python3 - a.jsonl b.jsonl > check <<'PY'
import json, math, sys
for path in sys.argv[1:]:
    lines = [json.loads(l) for l in open(path)]
    assert "run" in lines[0] and "sst2" in lines[0]["run"] and "started" in lines[0], lines[0]
    steps = [l for l in lines[1:] if "validation" not in l]
    vals = [l for l in lines[1:] if "validation" in l]
    assert [s["step"] for s in steps] == list(range(1, 13)), [s["step"] for s in steps]
    for s in steps:
        assert set(s) == {"step", "epoch", "loss", "lr", "grad_norm", "tokens_per_s", "t"}, s
        assert math.isfinite(s["loss"]) and s["grad_norm"] > 0 and s["tokens_per_s"] > 0 and s["lr"] >= 0, s
    assert len(vals) == 1 and vals[0]["step"] == 12 and set(vals[0]["validation"]) >= {"accuracy", "loss", "n"}, vals
    assert lines[-1] is vals[0]
print("ok")
PY
[ "$(cat check)" = ok ] && ok "each log: the run's line, 12 steps (loss, lr, grad_norm > 0, tokens_per_s, t), then the validation" ||
    bad "the logs: $(cat check) $(head -3 a.jsonl)"
lr_a=$(python3 -c 'import json; print(max(json.loads(l).get("lr", 0) for l in open("a.jsonl")))')
lr_b=$(python3 -c 'import json; print(max(json.loads(l).get("lr", 0) for l in open("b.jsonl")))')
awk -v a="$lr_a" -v b="$lr_b" 'BEGIN { exit !(b > 4 * a) }' && ok "the runs differ: peak lr $lr_a and $lr_b" || bad "lr $lr_a / $lr_b"

plot=$(sed -n '/^==plot==$/,/^==acc==$/p' out)
printf '%s\n' "$plot" | grep -q "^loss of 2 runs$" && ok "plot: the metric and the runs" || bad "plot: $plot"
grid=$(printf '%s\n' "$plot" | grep -E '^ *[-0-9.e]* [+|]' | grep -v -- '---')
[ "$(printf '%s\n' "$grid" | wc -l)" -eq 16 ] && ok "plot: 16 rows of the grid, the y range at the left" || bad "grid: $grid"
printf '%s\n' "$grid" | grep -q '\*' && printf '%s\n' "$grid" | grep -q 'o' && ok "plot: both runs' markers (* and o)" ||
    bad "markers: $grid"
printf '%s\n' "$plot" | grep -qE '^  \* a\.jsonl: 12 points, loss [0-9.e+-]+ -> [0-9.e+-]+ \(min [0-9.e+-]+ at step [0-9]+\)$' &&
    printf '%s\n' "$plot" | grep -qE '^  o b\.jsonl: 12 points, loss ' && ok "plot: a legend line per run (first, last, min)" ||
    bad "legend: $(printf '%s\n' "$plot" | tail -3)"
sed -n '/^==acc==$/,/^==gn==$/p' out | grep -qE '^  o b\.jsonl: 1 point, accuracy [0-9.]+ -> [0-9.]+ \(max ' &&
    ok "plot --metric accuracy: the validation's (max is best)" || bad "accuracy: $(sed -n '/^==acc==$/,/^==gn==$/p' out)"
sed -n '/^==gn==$/,$p' out | grep -qE '^grad_norm of 1 run$' && ok "plot --metric grad_norm of one run" ||
    bad "grad_norm: $(sed -n '/^==gn==$/,$p' out | head -3)"

expect 1 "plot: a missing file" "plot: nofile.jsonl: cannot read it" -- "$SEPAL" -c "plot nofile.jsonl"
echo "not json" > bad.jsonl
expect 1 "plot: a file that is not a log" "plot: bad.jsonl:1: not a line of a training log \(train --log FILE writes them\)" -- \
    "$SEPAL" -c "plot bad.jsonl"
expect 1 "plot: a metric the log lacks, with the ones it has" \
    "plot: a.jsonl has no 'perplexity' values \(it has: loss, lr, grad_norm, tokens_per_s, accuracy, n, val_loss\)" -- \
    "$SEPAL" -c "plot a.jsonl --metric perplexity"
expect 1 "train --log: an existing log is not replaced" "train: --log a.jsonl: the file exists \(add --overwrite to replace it\)" -- \
    "$SEPAL" -c "load $M; train $TR --log a.jsonl"

# the TUI: the training panel shows the runs
start p 100x30 LANG=C.UTF-8 -- -c "'plot $TMP/a.jsonl $TMP/b.jsonl'" --tui
check p "the TUI: the training panel plots the runs" "─ 4 Train ─+ plot: loss, 2 runs ─" 30
check p "... naming each run in its colour" "─ a\.jsonl  ─ b\.jsonl"
check p "... with the steps under the curves" "1 +step +12"
text p "plot $TMP/a.jsonl $TMP/b.jsonl --metric lr"
keys p Enter
check p "another metric: the title says it" "─ 4 Train ─+ plot: lr, 2 runs ─" 20
keys p Escape
keys p q
check p "q leaves" "^\[exit 0\]" 20
finish
