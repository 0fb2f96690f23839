#!/usr/bin/env python3
"""Checks a tokenizer.json written by `sepal model convert-llama2c` with Hugging Face's own libraries.

usage: check_hf_tokenizer.py MODEL_DIR GOLDEN_JSONL

For every golden line (llama2.c run.c's output), HF `tokenizers` and `transformers.AutoTokenizer` must
encode the prompt to run.c's prompt_ids and decode prompt + generated ids to run.c's text. Needs
`tokenizers` and `transformers` (present on the GPU machine; not needed by the test suite)."""
import json
import sys

from tokenizers import Tokenizer
from transformers import AutoTokenizer

model_dir, golden = sys.argv[1], sys.argv[2]
raw = Tokenizer.from_file(f"{model_dir}/tokenizer.json")
auto = AutoTokenizer.from_pretrained(model_dir)
fails = 0
for i, line in enumerate(open(golden)):
    g = json.loads(line)
    ids_raw = raw.encode(g["prompt"]).ids
    ids_auto = auto(g["prompt"])["input_ids"]
    gen = [t for t in g["gen_ids_full"] if t != 1]
    text = auto.decode(g["prompt_ids"] + gen, skip_special_tokens=True)
    ok = ids_raw == g["prompt_ids"] and ids_auto == g["prompt_ids"] and text + "\n" == g["text"]
    fails += not ok
    print(f"line {i}: tokenizers {ids_raw == g['prompt_ids']}, AutoTokenizer {ids_auto == g['prompt_ids']}, "
          f"decode {text + chr(10) == g['text']}")
    if not ok:
        print("  want", g["prompt_ids"], "\n  raw ", ids_raw, "\n  auto", ids_auto)
for s in ["Hello world", "  two  spaces", "日本 ✓ é", "tab\there", "new\nline"]:
    a, b = raw.encode(s).ids, auto(s)["input_ids"]
    print(repr(s), a, "round trip:", repr(auto.decode(b, skip_special_tokens=True)))
print(f"{len(open(golden).readlines()) - fails} passed, {fails} failed")
sys.exit(1 if fails else 0)
