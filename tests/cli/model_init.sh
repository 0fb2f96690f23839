#!/usr/bin/env bash
# `sepal model init`: a narrow Llama-2-7B shape and a narrow Mixtral in shards, described by `model info` and run
# by `model generate`; a used directory, an unknown name and bad sizes refused with exit 2, nothing lost.
. "$(dirname "$0")/lib.bash"
export SEPAL_CACHE="$(dirname "${SEPAL_STORIES15M_DIR:?}")/.." # stories15M's tokenizer

D="$TMP/l7"
expect 0 "init a narrow llama-2-7b" \
    "^$D: llama-2-7b-shaped, 3 layers of 256, 18\.8M parameters, bf16, 37\.6 MB in 1 shard; tokenizer: stories15M's, 32000 tokens$" \
    -- "$SEPAL" model init "$D" --like llama-2-7b --layers 3 --hidden 256
for f in config.json model.safetensors tokenizer.json tokenizer_config.json generation_config.json; do
    [ -f "$D/$f" ] && ok "it wrote $f" || bad "no $f"
done
expect 0 "info: the layers and width asked for" "^layers: +3$" -- "$SEPAL" model info "$D"
expect 0 "info: Llama-2-7B's heads, narrower" "^heads: +32 \(kv heads 32, head dim 8\)$" -- "$SEPAL" model info "$D"
expect 0 "info: bf16 tensors" "^dtype: +BF16 \(config\), 30 tensors BF16$" -- "$SEPAL" model info "$D"
expect 0 "generate runs on it" "tok/s" -- "$SEPAL" model generate "$D" --prompt "Once upon a time" --max-new-tokens 4
cp "$D/config.json" "$TMP/config.before"
expect 2 "a used directory is refused" "^sepal: $D: not empty \(model init writes a new directory\)$" -- \
    "$SEPAL" model init "$D" --like falcon-40b
cmp -s "$D/config.json" "$TMP/config.before" && ok "and left as it was" || bad "the used directory changed"

M="$TMP/mx"
expect 0 "init a narrow mixtral-8x7b in shards of 4 MB" "in [0-9]+ shards; tokenizer: stories15M's" -- \
    "$SEPAL" model init "$M" --like mixtral-8x7b --layers 2 --hidden 256 --shard-size 4MB --seed 7
n=$(ls "$M"/model-*-of-*.safetensors 2>/dev/null | wc -l)
[ "$n" -ge 4 ] && [ -f "$M/model.safetensors.index.json" ] && ok "$n shards and an index" || bad "$n shards"
expect 0 "info: the experts" "^mlp: +sparse mixture of SwiGLU experts: 8 experts of 896, 2 per token$" -- \
    "$SEPAL" model info "$M"
expect 0 "generate through the shards" "tok/s" -- "$SEPAL" model generate "$M" --prompt "Hello" --max-new-tokens 3

expect 2 "an unknown name" "'gpt-5' is not one of llama-2-7b, llama-2-70b" -- "$SEPAL" model init "$TMP/x" --like gpt-5
expect 2 "--like is needed" "model init: needs --like, one of llama-2-7b\|llama-2-70b" -- "$SEPAL" model init "$TMP/x"
expect 2 "a bad shard size" "expected a size such as 5GB, 500MB or 2GiB, got '5 GB'" -- \
    "$SEPAL" model init "$TMP/x" --like llama-2-7b --shard-size "5 GB"
expect 2 "a width that is no multiple of 64" "--hidden 200: llama-2-7b's width can be cut to a multiple of 64" -- \
    "$SEPAL" model init "$TMP/x" --like llama-2-7b --hidden 200
expect 2 "more layers than the model has" "--layers 31: bloom-7b1 has 30 layers" -- \
    "$SEPAL" model init "$TMP/x" --like bloom-7b1 --layers 31
[ ! -e "$TMP/x" ] && ok "nothing was created by the refused commands" || bad "$TMP/x exists"
finish
