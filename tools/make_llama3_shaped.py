#!/usr/bin/env python3
"""Writes a Llama-3-shaped checkpoint's local parts for bench_client_mem: what a client of a Llama-3.2-1B-sized
model loads (config.json; model.safetensors with the f32 embeddings [128256, 2048] (tied head) and the final
norm; a byte-level BPE tokenizer.json of Llama 3's size and kind). The weights are random (N(0, 0.02)); the
tokenizer is GPT-2's vocabulary and merges (scripts/fetch-gpt2-tokenizer.sh) grown with merges of its own tokens
to 128000 pieces, plus 256 special tokens, under Llama 3's pre-tokenizer (its split regex, then ByteLevel).
It has no blocks: a server cannot run it; a client can load it and tokenize with it.

usage: /usr/bin/python3 tools/make_llama3_shaped.py GPT2_TOKENIZER_JSON OUTDIR   (needs numpy)
"""
import json
import os
import struct
import sys

import numpy as np

VOCAB, HIDDEN, REGULAR = 128256, 2048, 128000
LLAMA3_SPLIT = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
                "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")


def grow(vocab, merges):
    """GPT-2's pieces and merges, then merges of pieces already there, in a fixed order, up to REGULAR."""
    vocab = {k: v for k, v in vocab.items() if k != "<|endoftext|>"}
    pieces = sorted(vocab, key=lambda p: vocab[p])
    nid = len(vocab)
    merges = list(merges)
    left = [p for p in pieces if len(p) >= 2][:4000]
    right = [p for p in pieces if 1 <= len(p) <= 3][:2000]
    for a in left:
        for b in right:
            if nid >= REGULAR:
                return vocab, merges
            m = a + b
            if m in vocab:
                continue
            vocab[m] = nid
            merges.append(a + " " + b)
            nid += 1
    raise SystemExit("could not grow the vocabulary to %d" % REGULAR)


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, arr in tensors:
        b = arr.astype(np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
        blobs.append(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    src, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    gpt2 = json.load(open(src, encoding="utf-8"))
    vocab, merges = grow(gpt2["model"]["vocab"], gpt2["model"]["merges"])
    added = [{"id": REGULAR + i, "content": "<|reserved_special_token_%d|>" % i, "single_word": False,
              "lstrip": False, "rstrip": False, "normalized": False, "special": True} for i in range(VOCAB - REGULAR)]
    added[0]["content"], added[1]["content"] = "<|begin_of_text|>", "<|end_of_text|>"
    tok = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_SPLIT}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": vocab, "merges": merges},
    }
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>", "add_bos_token": True}, f)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
           "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
           "vocab_size": VOCAB, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
           "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 8192},
           "tie_word_embeddings": True, "bos_token_id": REGULAR, "eos_token_id": REGULAR + 1,
           "torch_dtype": "float32"}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    rng = np.random.default_rng(0)
    embed = rng.standard_normal((VOCAB, HIDDEN), dtype=np.float32) * 0.02
    write_safetensors(os.path.join(out, "model.safetensors"),
                      [("model.embed_tokens.weight", embed), ("model.norm.weight", np.ones(HIDDEN, np.float32))])
    print(out)


if __name__ == "__main__":
    main()
