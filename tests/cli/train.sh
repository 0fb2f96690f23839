#!/usr/bin/env bash
# Prompt tuning from the REPL through a real loopback swarm of sepal-server processes: train prints every
# step's loss and the validation metrics, saves parameters that eval loads back; the causal-LM task on a text
# file; plugins; and clear errors for bad input.
. "$(dirname "$0")/lib.bash"
M="${SEPAL_STORIES15M_DIR:?}"
export SEPAL_SERVER_BIN="$SEPAL_BIN_DIR/server/sepal-server"
export SEPAL_CACHE="$TMP/cache"
mkdir -p "$SEPAL_CACHE"
ln -s "${SEPAL_SENTIMENT_DIR:?}" "$SEPAL_CACHE/sentiment" # the sst2 task's default data directory
if [ ! -f "$M/model.safetensors" ] || [ ! -f "$SEPAL_SENTIMENT_DIR/imdb.json" ]; then
    bad "run scripts/fetch-model.sh and scripts/fetch-sentiment.sh first"
    finish
fi

out=$("$SEPAL" -c "load $M; swarm up 3; train sst2 --tuning deep_ptune --pre-seq-len 4 --batch 8 --max-length 32 \
    --max-steps 6 --eval-batches 4 --seed 3 --save $TMP/p.safetensors; \
    eval sst2 --tuning deep_ptune --pre-seq-len 4 --batch 8 --max-length 32 --eval-batches 4 --load $TMP/p.safetensors" 2>&1)
rc=$?
[ $rc -eq 0 ] && ok "train + eval through 3 servers exit 0" || { bad "train exit $rc"; echo "$out" | tail -5; }
steps=$(grep -cE "^epoch 1 step [1-6]/6: loss [0-9.]+ lr" <<< "$out")
[ "$steps" -eq 6 ] && ok "six steps with their loss" || bad "expected 6 step lines, got $steps"
grep -qE "^epoch 1: validation accuracy=[0-9.]+ n=32 loss=[0-9.]+" <<< "$out" && ok "validation metrics" || bad "no validation line"
[ -s "$TMP/p.safetensors" ] && ok "parameters saved" || bad "no saved parameters"
v1=$(grep -oE "validation accuracy=[0-9.]+ n=32 loss=[0-9.]+" <<< "$out" | sed 's/validation //')
v2=$(grep -oE "^sst2: accuracy=[0-9.]+ n=32 loss=[0-9.]+" <<< "$out" | sed 's/^sst2: //')
[ -n "$v1" ] && [ "$v1" = "$v2" ] && ok "eval --load reproduces the trained metrics ($v2)" || bad "eval after load: '$v2' vs '$v1'"

# generation with the trained prompts (the deep_ptune file saved above), and a file that holds none
expect 0 "generate with trained deep prompts through 3 servers" "^Once upon a time" -- \
    "$SEPAL" -c "load $M; swarm up 3; generate 'Once upon a time' --prompts $TMP/p.safetensors --max-new-tokens 8"
expect 1 "generate --prompts with a missing file" "generate: .*nonexistent" -- \
    "$SEPAL" -c "load $M; swarm up 1; generate 'Once' --prompts $TMP/nonexistent.safetensors"

# microbatches pipelined over the servers give the losses of the unsplit step (same seed, same batches; f32 on the
# wire: wire auto may judge a loopback link slow under ASan and send bf16 in one run and not another)
losses() { grep -oE "^epoch 1 step [0-9]+/4: loss [0-9.]+" <<< "$1" | awk '{print $6}'; }
pipe_out=$("$SEPAL" -c "load $M; set wire f32; swarm up 3; \
    train sst2 --tuning deep_ptune --pre-seq-len 4 --batch 8 --max-length 32 --max-steps 4 --eval-batches 1 --seed 5 \
        --microbatches 1; \
    train sst2 --tuning deep_ptune --pre-seq-len 4 --batch 8 --max-length 32 --max-steps 4 --eval-batches 1 --seed 5 \
        --microbatches 4 --schedule 1f1b --max-in-flight 2; \
    train sst2 --tuning deep_ptune --pre-seq-len 4 --batch 8 --max-length 32 --max-steps 4 --eval-batches 1 --seed 5 \
        --microbatches 3 --schedule afab" 2>&1)
all=$(losses "$pipe_out" | tr '\n' ' ')
if awk -v a="$all" 'BEGIN { n = split(a, v, " "); if (n != 12) exit 1; for (i = 1; i <= n; i++) if (v[i] !~ /^[0-9]+\.[0-9]+$/) exit 1;
        for (i = 1; i <= 4; i++) for (k = 1; k <= 2; k++) { d = v[i] - v[i + 4 * k]; if (d < 0) d = -d; if (d > 2e-3) exit 1 } }'; then
    ok "1F1B (4 microbatches, 2 in flight) and AFAB (3) through 3 servers: the losses of one microbatch ($all)"
else
    bad "pipelined losses differ or are missing: '$all'"; echo "$pipe_out" | tail -5
fi

# causal LM on a text file, head = the model's own LM head
for i in $(seq 1 40); do echo "Once upon a time there was a cat named Tom. Tom liked to play in the sun with his ball."; done > "$TMP/story.txt"
expect 0 "causal-LM prompt tuning on a text file" "^epoch 1: validation loss=[0-9.]+ perplexity=[0-9.]+" -- \
    "$SEPAL" -c "load $M; swarm up 2; train causal_lm --args 'file=$TMP/story.txt length=32' --tuning ptune --pre-seq-len 4 --batch 4 --max-length 32 --max-steps 3"
# --max-steps above what the epochs hold: announced, counted and scheduled to the steps that run; the task's own
# loss said once
out=$("$SEPAL" -c "load $M; swarm up 1; train causal_lm --args 'file=$TMP/story.txt length=32' --tuning ptune \
    --pre-seq-len 4 --batch 8 --max-length 32 --epochs 1 --warmup 0 --max-steps 500" 2>&1)
n=$(grep -cE "^epoch 1 step [0-9]+/[0-9]+: " <<< "$out")
if [ "$n" -ge 2 ] && grep -qE "^training causal_lm with ptune \(P 4\), batch 8, lr 0.01, 1 epoch \($n steps\)$" <<< "$out" &&
    [ "$(grep -cE "^epoch 1 step [0-9]+/$n: " <<< "$out")" -eq "$n" ] && grep -qE "^epoch 1 step $n/$n: " <<< "$out"; then
    ok "--max-steps 500 over a 1-epoch run of $n steps: '1 epoch ($n steps)', counted 1/$n .. $n/$n"
else
    bad "--max-steps beyond the epochs:"; grep -E "^training|^epoch 1 step" <<< "$out" | head -4 | sed 's/^/    /'
fi
lr_last=$(grep -E "^epoch 1 step $n/$n: " <<< "$out" | grep -oE "lr [0-9.e+-]+" | awk '{print $2}')
awk -v lr="$lr_last" -v n="$n" 'BEGIN { exit !(lr + 0 > 0 && lr + 0 <= 0.01 / (n - 1) * 1.0001 + 1e-12 || n <= 1) }' &&
    ok "the lr decays toward the last step that runs (step $n: lr $lr_last)" || bad "the lr at the last step: $lr_last"
grep -qE "^epoch 1: validation loss=[0-9.]+ perplexity=[0-9.]+ tokens=[0-9]+$" <<< "$out" &&
    ok "causal_lm's validation says its loss once" || bad "validation: $(grep 'validation' <<< "$out")"

expect 0 "plugin list shows the built-in tasks" "^sst2 .*classes" -- "$SEPAL" -c "plugin list"
expect 0 "plugin load of the sst2 .so" "loaded task sst2" -- "$SEPAL" -c "plugin load $SEPAL_BIN_DIR/plugins/libsepal_sst2.so"
expect 1 "plugin of another ABI version is refused" "ABI 7.* 1" -- "$SEPAL" -c "plugin load $SEPAL_BIN_DIR/plugins/libsepal_test_bad_abi.so"
expect 1 "plugin that does not exist" "nonexistent" -- "$SEPAL" -c "plugin load $TMP/nonexistent.so"
expect 1 "train before load" "no model loaded" -- "$SEPAL" -c "train sst2"
expect 1 "train without servers" "no servers" -- "$SEPAL" -c "load $M; train sst2"
expect 1 "unknown task" "unknown task 'nosuchtask'" -- "$SEPAL" -c "load $M; train nosuchtask"
expect 1 "bad tuning" "'bogus' is not one of head, ptune, deep_ptune" -- "$SEPAL" -c "train sst2 --tuning bogus"
expect 1 "bad number" "--lr: expected a number" -- "$SEPAL" -c "train sst2 --lr fast"
expect 1 "causal_lm without a file" "file" -- "$SEPAL" -c "load $M; swarm up 1; train causal_lm"
# the task's arguments are checked before the swarm (and by --dry-run): their one message, not "no servers"
one_error() { # DESCRIPTION EXPECTED-STDERR -- sepal's arguments...
    local desc=$1 want=$2
    shift 3
    "$SEPAL" "$@" > /dev/null 2> "$TMP/oe.err"
    local rc=$?
    [ $rc -eq 1 ] && [ "$(grep -v '^loaded ' "$TMP/oe.err")" = "$want" ] && ok "$desc" ||
        { bad "$desc: exit $rc, stderr:"; head -4 "$TMP/oe.err" | sed 's/^/    /'; }
}
NOFILE="sepal: train: causal_lm: cannot read $TMP/none.txt: No such file or directory"
one_error "train: a missing --args file before 'no servers'" "$NOFILE" -- -c "load $M; train causal_lm --args file=$TMP/none.txt"
one_error "train: a missing --args file before the model" "$NOFILE" -- -c "train causal_lm --args file=$TMP/none.txt"
one_error "--dry-run: a missing --args file" "$NOFILE" -- --dry-run -c "load $M; swarm up 1; train causal_lm --args file=$TMP/none.txt"
one_error "--dry-run: a task's unknown argument" "sepal: eval: sst2: unknown argument dat=x (it takes data=DIR)" -- \
    --dry-run -c "eval sst2 --args dat=x"
# --device cuda where CUDA cannot run (test_cuda says 77 without a GPU; without it, no CUDA was built): said in
# words, before the model and the swarm
"$SEPAL_BIN_DIR/tests/test_cuda" > /dev/null 2>&1
if [ $? -eq 77 ] || [ ! -x "$SEPAL_BIN_DIR/tests/test_cuda" ]; then
    "$SEPAL" -c "train sst2 --device cuda" > /dev/null 2> "$TMP/cuda.err"
    case "$(cat "$TMP/cuda.err")" in
    "sepal: train: --device cuda: no usable GPU: "?* | "sepal: train: --device cuda: this sepal was built without CUDA")
        ok "--device cuda without a GPU: $(cat "$TMP/cuda.err")" ;;
    *) bad "--device cuda without a GPU: $(cat "$TMP/cuda.err")" ;;
    esac
    expect 1 "set device cuda:1 without a GPU: refused" \
        "^sepal: set: device cuda:1: (no usable GPU: .+|this sepal was built without CUDA)$" -- "$SEPAL" -c "set device cuda:1"
else
    echo "a usable GPU: --device cuda's refusal not checked"
fi
expect 1 "set device: not a device" "^sepal: set: device gpu: 'gpu' is not a device: cpu, cuda or cuda:N$" -- \
    "$SEPAL" -c "set device gpu"
expect 1 "--device: not a device" "^sepal: eval: --device cuda:x: 'cuda:x' is not a device: cpu, cuda or cuda:N$" -- \
    "$SEPAL" -c "eval sst2 --device cuda:x"
expect 0 "set device cpu, then auto" '^device +"auto"' -- "$SEPAL" -c "set device cpu; set device auto; show"
expect 0 "--dry-run: good task arguments pass" "" -- "$SEPAL" --dry-run -c "train causal_lm --args 'file=$TMP/story.txt length=32'"
expect 1 "context overflow" "context" -- "$SEPAL" -c "load $M; swarm up 1; train sst2 --max-length 250 --pre-seq-len 16"
finish
