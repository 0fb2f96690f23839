#!/usr/bin/env bash
# `sepal model info|check` on the golden tiny checkpoints, and on broken copies of them.
. "$(dirname "$0")/lib.bash"
T="$SEPAL_TEST_DATA/hf-tiny"

expect 0 "check llama-gqa (sharded)" "^PASS: 0 check" -- "$SEPAL" model check "$T/llama-gqa"
expect 0 "check llama3-rope" "^PASS: 0 check" -- "$SEPAL" model check "$T/llama3-rope"
expect 0 "check with --golden" "greedy ids +16/16 ids identical +ok" -- \
    "$SEPAL" model check "$T/llama3-rope" --golden "$T/llama3-rope/golden.safetensors"
for m in bloom falcon-new mixtral; do
    expect 2 "check $m is unsupported" "unsupported architecture: [A-Za-z]+ForCausalLM" -- "$SEPAL" model check "$T/$m"
done
expect 0 "info llama-gqa" "parameters: +250432" -- "$SEPAL" model info "$T/llama-gqa"
expect 0 "info llama3-rope" "rope: +llama3, theta 500000" -- "$SEPAL" model info "$T/llama3-rope"
expect 0 "info bloom (unsupported still described)" "BloomForCausalLM \(unsupported\)" -- "$SEPAL" model info "$T/bloom"

# A check that can fail: flip bytes inside one weight tensor's data.
cp -r "$T/llama3-rope" "$TMP/flipped"
printf '\x40\x40\x40\x40\x40\x40\x40\x40' | dd of="$TMP/flipped/model.safetensors" bs=1 seek=200000 conv=notrunc status=none
expect 1 "check detects changed weights" "FAIL: [1-9][0-9]* check\(s\) failed" -- "$SEPAL" model check "$TMP/flipped"

# Truncated checkpoint: a clear error naming the file.
cp -r "$T/llama3-rope" "$TMP/trunc"
truncate -s 100000 "$TMP/trunc/model.safetensors"
expect 1 "truncated safetensors" "trunc/model.safetensors: tensor '[^']+': data_offsets .* outside the data section" -- \
    "$SEPAL" model check "$TMP/trunc"
: > "$TMP/trunc/model.safetensors"
expect 1 "empty safetensors" "trunc/model.safetensors: truncated safetensors file" -- "$SEPAL" model info "$TMP/trunc"

# A tensor missing from the sharded index.
cp -r "$T/llama-gqa" "$TMP/missing"
sed -i '/"model.layers.2.mlp.up_proj.weight"/d' "$TMP/missing/model.safetensors.index.json"
expect 1 "missing tensor" "tensor 'model.layers.2.mlp.up_proj.weight' not found" -- "$SEPAL" model check "$TMP/missing"

# A shard that disappeared.
rm "$TMP/missing/model-00005-of-00008.safetensors"
expect 1 "missing shard" "model-00005-of-00008.safetensors: No such file" -- "$SEPAL" model check "$TMP/missing"

# A config without a required field, and no config at all.
cp -r "$T/llama3-rope" "$TMP/nofield"
sed -i '/"rms_norm_eps"/d' "$TMP/nofield/config.json"
expect 1 "config missing field" "nofield/config.json: missing field 'rms_norm_eps'" -- "$SEPAL" model check "$TMP/nofield"
rm "$TMP/nofield/config.json"
expect 1 "config missing" "nofield/config.json: No such file" -- "$SEPAL" model info "$TMP/nofield"

# A golden file of another model: values differ, and it lacks block 3.
expect 1 "golden of another model" "logits +max\|err\| [0-9.e+]+ +FAIL" -- \
    "$SEPAL" model check "$T/llama-gqa" --golden "$T/llama3-rope/golden.safetensors"
expect 1 "golden lacking a tensor" "golden.safetensors: tensor 'block.3.in' not found" -- \
    "$SEPAL" model check "$T/llama-gqa" --golden "$T/llama3-rope/golden.safetensors"
expect 1 "golden file missing" "nope.safetensors: No such file" -- \
    "$SEPAL" model check "$T/llama-gqa" --golden "$TMP/nope.safetensors"

# Usage errors.
expect 2 "unknown flag" "usage: sepal" -- "$SEPAL" --bogus
expect 2 "unknown option" "unknown option '--bogus'" -- "$SEPAL" model generate "$T/llama-gqa" --prompt x --bogus 1
expect 2 "bad number" "--max-new-tokens: expected an integer" -- "$SEPAL" model generate "$T/llama-gqa" --prompt x --max-new-tokens ten
finish
