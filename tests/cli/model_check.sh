#!/usr/bin/env bash
# `sepal model info|check` on the golden tiny checkpoints, and on broken copies of them.
. "$(dirname "$0")/lib.bash"
T="$SEPAL_TEST_DATA/hf-tiny"

expect 0 "check llama-gqa (sharded)" "^PASS: 0 check" -- "$SEPAL" model check "$T/llama-gqa"
expect 0 "check llama3-rope" "^PASS: 0 check" -- "$SEPAL" model check "$T/llama3-rope"
expect 0 "check with --golden" "greedy ids +16/16 ids identical +ok" -- \
    "$SEPAL" model check "$T/llama3-rope" --golden "$T/llama3-rope/golden.safetensors"
# every family: transformers' goldens, and tools/hf_reference.py's for the variants transformers did not make
for m in bloom bloom-bias falcon-new falcon-7b falcon-bias falcon-seq mixtral; do
    expect 0 "check $m" "^PASS: 0 check" -- "$SEPAL" model check "$T/$m"
done
expect 0 "info llama-gqa" "parameters: +250432" -- "$SEPAL" model info "$T/llama-gqa"
expect 0 "info llama3-rope" "rope: +llama3, theta 500000" -- "$SEPAL" model info "$T/llama3-rope"
expect 0 "info bloom" "attention: +multi-head \(4 heads of 16\), ALiBi, fused QKV" -- "$SEPAL" model info "$T/bloom"
expect 0 "info bloom local parts" "local parts: +embeddings \+ embedding LayerNorm, final LayerNorm, head tied" -- \
    "$SEPAL" model info "$T/bloom"
expect 0 "info falcon-new" "block: +parallel attention \+ MLP, 2 LayerNorms" -- "$SEPAL" model info "$T/falcon-new"
expect 0 "info falcon-7b" "multi-query \(4 heads of 16 on 1 KV head\), RoPE" -- "$SEPAL" model info "$T/falcon-7b"
expect 0 "info falcon-7b kv" "KV cache: +128 bytes per position" -- "$SEPAL" model info "$T/falcon-7b"
expect 0 "info mixtral" "experts: +a token uses 2 of 4: 61824 of the block's 110976 parameters" -- \
    "$SEPAL" model info "$T/mixtral"
expect 0 "info mixtral parameters" "parameters: +287552 \(0.29M\): 2 blocks of 110976, 65600 local" -- \
    "$SEPAL" model info "$T/mixtral"

# A family we do not serve: described, refused by check with exit 2.
mkdir -p "$TMP/gpt2"
cp "$T/bloom/model.safetensors" "$TMP/gpt2/"
echo '{"architectures":["GPT2LMHeadModel"],"model_type":"gpt2","n_embd":64,"n_layer":3,"n_head":4,"vocab_size":512}' \
    > "$TMP/gpt2/config.json"
expect 2 "check gpt2 is unsupported" "unsupported architecture: gpt2 \(supported: llama, bloom, falcon, mixtral\)" -- \
    "$SEPAL" model check "$TMP/gpt2"
expect 2 "sepal-server refuses gpt2 before loading" \
    "^sepal-server: unsupported architecture: gpt2 \(supported: llama, bloom, falcon, mixtral\)" -- \
    "${SEPAL_BIN_DIR:?}/server/sepal-server" --model "$TMP/gpt2" --blocks 0:1 --port 0
expect 0 "info gpt2 (unsupported, still described)" "GPT2LMHeadModel \(gpt2, unsupported; supported: llama" -- \
    "$SEPAL" model info "$TMP/gpt2"

# Family checks that can fail: BLOOM's biases and LayerNorms, Falcon's fused QKV rows, Mixtral's router.
cp -r "$T/bloom-bias" "$TMP/bloom-flipped"
python3 - "$TMP/bloom-flipped/model.safetensors" <<'PY'
import json, struct, sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
for name in ("transformer.h.1.self_attention.query_key_value.bias", "transformer.h.0.post_attention_layernorm.bias"):
    s, e = h[name]["data_offsets"]
    b[8 + n + s:8 + n + e] = bytes(e - s)  # zeros
open(p, "wb").write(b)
PY
expect 1 "check detects zeroed BLOOM biases" "FAIL: [1-9][0-9]* check\(s\) failed" -- "$SEPAL" model check "$TMP/bloom-flipped"
cp -r "$T/mixtral" "$TMP/mixtral-router"
python3 - "$TMP/mixtral-router/model.safetensors" <<'PY'
import json, struct, sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
s, e = h["model.layers.0.block_sparse_moe.gate.weight"]["data_offsets"]
rows = [b[8 + n + s + r * (e - s) // 4:8 + n + s + (r + 1) * (e - s) // 4] for r in range(4)]
b[8 + n + s:8 + n + e] = rows[1] + rows[0] + rows[3] + rows[2]  # experts 0<->1, 2<->3 swapped in the router
open(p, "wb").write(b)
PY
expect 1 "check detects a swapped router" "FAIL: [1-9][0-9]* check\(s\) failed" -- "$SEPAL" model check "$TMP/mixtral-router"
cp -r "$T/falcon-7b" "$TMP/falcon-mq"
sed -i 's/"multi_query": true/"multi_query": false/' "$TMP/falcon-mq/config.json"
expect 1 "falcon-7b read as multi-head: a clear shape error" "query_key_value.weight.*shape" -- \
    "$SEPAL" model check "$TMP/falcon-mq"

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
expect 1 "config missing" "nofield: not a model directory \(no config.json\)$" -- "$SEPAL" model info "$TMP/nofield"

# --device: cpu is this process (the default); a bad value, and a GPU that cannot run, are refused (exit 2) before the
# model is read. On a GPU, scripts/gpu-model-check.sh (ctest gpu_model_check) runs every checkpoint there.
expect 0 "--device cpu" "^PASS: 0 check" -- "$SEPAL" model check "$T/mixtral" --device cpu
expect 2 "--device gpu refused" \
    "^sepal: model check: --device: expected cpu, cuda or cuda:N \(N: a GPU's index, 0 the first\), got 'gpu'$" -- \
    "$SEPAL" model check "$T/mixtral" --device gpu
out=$("$SEPAL" model check "$T/mixtral" --device cuda:999 2>&1)
rc=$?
if [ $rc -eq 2 ] && printf '%s\n' "$out" | grep -qE "^sepal: model check: --device cuda:999: (no usable GPU: .+|no GPU 999: this machine has [0-9]+|this sepal was built without CUDA)$"; then
    ok "--device cuda:999 refused: $out"
else
    bad "--device cuda:999: exit $rc: $out"
fi

# A golden file of another model: values differ, and it lacks block 3.
expect 1 "golden of another model" "logits +max\|err\| [0-9.e+]+ +FAIL" -- \
    "$SEPAL" model check "$T/llama-gqa" --golden "$T/llama3-rope/golden.safetensors"
expect 1 "golden lacking a tensor" "golden.safetensors: tensor 'block.3.in' not found" -- \
    "$SEPAL" model check "$T/llama-gqa" --golden "$T/llama3-rope/golden.safetensors"
expect 1 "golden file missing" "nope.safetensors: No such file" -- \
    "$SEPAL" model check "$T/llama-gqa" --golden "$TMP/nope.safetensors"
# a model directory without golden outputs and no --golden: what is needed, and what a golden file is
cp -r "$T/llama-gqa" "$TMP/nogolden"
rm "$TMP/nogolden/golden.safetensors"
expect 1 "no golden file: --golden FILE and what one is" \
    "^sepal: model check: $TMP/nogolden has no golden.safetensors: give --golden FILE, the outputs to compare with \(the model's logits, every block's in -> out and grad_in, greedy ids; safetensors as tests/data/hf-tiny/README.md describes\)$" -- \
    "$SEPAL" model check "$TMP/nogolden"
expect 1 "not a model directory comes first" "^sepal: $TMP: not a model directory \(no config.json\)$" -- "$SEPAL" model check "$TMP"

# Usage errors.
expect 2 "unknown flag" "^Try 'sepal --help' for more information.$" -- "$SEPAL" --bogus
expect 2 "unknown option" "unknown option '--bogus'" -- "$SEPAL" model generate "$T/llama-gqa" --prompt x --bogus 1
expect 2 "model generate without its required --prompt" "^sepal: model generate: needs --prompt TEXT$" -- \
    "$SEPAL" model generate "$T/llama-gqa"
expect 2 "bad number" "--max-new-tokens: expected an integer" -- "$SEPAL" model generate "$T/llama-gqa" --prompt x --max-new-tokens ten
finish
