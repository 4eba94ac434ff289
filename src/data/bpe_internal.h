/* bpe_internal.h: what the BPE loader/encoder (bpe.c) and trainer (bpe_train.c) share (internal):
 * GPT-2's byte-to-unicode table, the pre-tokenization splitter over PCRE2, and a byte-string hash. */
#ifndef LOOM_DATA_BPE_INTERNAL_H
#define LOOM_DATA_BPE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ckpt/json.h"
#include "loom/tokenizer.h"

/* GPT-2's bytes_to_unicode(): byte b is written as code point loom__bpe_byte_cp(b) (printable
 * Latin-1 bytes as themselves, the others as U+0100..U+0143). loom__bpe_cp_byte() inverts it: the
 * byte, or -1 when cp is not in the table. */
int loom__bpe_byte_cp(int b);
int loom__bpe_cp_byte(uint32_t cp);

/* Append the byte-level spelling (UTF-8 of the mapped code points) of bytes p[0..n) to f. */
void loom__bpe_write_mapped(FILE *f, const unsigned char *p, size_t n);

/* A compiled pre-tokenization regex (UTF + UCP + MATCH_INVALID_UTF, JIT when available). */
typedef struct loom__bpe_splitter loom__bpe_splitter_t;

/* Compile `pattern` (with literal != 0: the exact string, not a regex); LOOM_EINVAL with PCRE2's
 * message and offset, LOOM_ENOMEM. */
int loom__bpe_splitter_create(loom__bpe_splitter_t **sp, const char *pattern);
int loom__bpe_splitter_create_ex(loom__bpe_splitter_t **sp, const char *pattern, int literal);
void loom__bpe_splitter_destroy(loom__bpe_splitter_t *sp);

/* Call fn(p, n, arg) for each piece of text[0..len) in order; pieces cover the text exactly. Bytes
 * the regex cannot match (invalid UTF-8) form pieces of their own. Stops at fn's first nonzero
 * return, which it returns; LOOM_EINVAL on a PCRE2 matching error; else 0. */
int loom__bpe_split(loom__bpe_splitter_t *sp, const char *text, size_t len,
                    int (*fn)(const unsigned char *p, size_t n, void *arg), void *arg);

/* For tests: encode one piece with the reference algorithm (no regex, no cache) into a malloc'ed
 * array; and whether the tokenizer's merges are well formed (bpe.c's top comment). */
int loom__bpe_piece_reference(loom_bpe_t *t, const unsigned char *p, size_t n, int **ids, size_t *m);
int loom__bpe_well_formed(const loom_bpe_t *t);

/* ---- building a tokenizer (bpe.c), for the tokenizer.json reader (tokenizer_json.c) ------------ */

#define LOOM__BPE_MAX_STEPS 8    /* pre-tokenization steps */
#define LOOM__BPE_MAX_TEMPLATE 4 /* special tokens before / after the text */

/* What a pre-tokenization step was written as (to save it back): a Split, ByteLevel, Digits. */
enum { LOOM__BPE_STEP_SPLIT, LOOM__BPE_STEP_BYTELEVEL, LOOM__BPE_STEP_DIGITS };

/* Results of loom__bpe_merge_add (loom__bpe_merge_error gives the words). */
enum {
	LOOM__MERGE_OK, LOOM__MERGE_BAD_FIRST, LOOM__MERGE_BAD_SECOND, LOOM__MERGE_NO_FIRST, LOOM__MERGE_NO_SECOND,
	LOOM__MERGE_NO_RESULT, LOOM__MERGE_NOMEM
};

/* An empty tokenizer (seeded hash tables); LOOM_ENOMEM. Then, in this order: the vocabulary (a JSON
 * object of byte-level token string -> id; errors name `where`), the merges (begin with an upper bound
 * on their number, add each in rank order, end), the steps, the added tokens, the template. */
int loom__bpe_new(loom_bpe_t **t);
int loom__bpe_load_vocab(loom_bpe_t *t, const json_t *vocab, const char *where);
int loom__bpe_merges_begin(loom_bpe_t *t, size_t max_merges);
int loom__bpe_merge_add(loom_bpe_t *t, const char *a, size_t alen, const char *b, size_t blen);
void loom__bpe_merges_end(loom_bpe_t *t);
const char *loom__bpe_merge_error(int code);
/* A step: split by `pattern` (NULL: none) after prepending a space to pieces not starting with one
 * (prefix_space). LOOM_EINVAL for a bad regex, LOOM_EFORMAT beyond LOOM__BPE_MAX_STEPS. */
int loom__bpe_add_step(loom_bpe_t *t, int kind, const char *pattern, int literal, int prefix_space);
int loom__bpe_set_pattern_text(loom_bpe_t *t, const char *description); /* what loom_bpe_pattern says */
void loom__bpe_set_ignore_merges(loom_bpe_t *t, int on);
/* A token matched in the text before pre-tokenization: content[0..len) (raw bytes) is token `id`,
 * either one of the vocabulary's with the same bytes or a new id (at most 65536 past the vocabulary).
 * special: matched only with LOOM_BPE_SPECIAL; normalized: matched in the second pass. LOOM_EFORMAT
 * for an empty content, a bad or repeated id, a repeated content. */
int loom__bpe_add_token(loom_bpe_t *t, int id, const char *content, size_t len, int special, int normalized);
/* The ids LOOM_BPE_TEMPLATE puts before and after the text; LOOM_EFORMAT for an id not in use. */
int loom__bpe_set_template(loom_bpe_t *t, const int *before, int n_before, const int *after, int n_after);

/* Reading it back (for saving): step i's kind (-1 past the last), added token i (-1 past the last),
 * the template's ids before (after = 0) or after the text, the merges as id pairs in rank order. */
int loom__bpe_step(const loom_bpe_t *t, int i, const char **pattern, int *literal, int *prefix_space);
int loom__bpe_added(const loom_bpe_t *t, int i, int *id, int *special, int *normalized);
int loom__bpe_template(const loom_bpe_t *t, int after, const int **ids);
int loom__bpe_ignore_merges(const loom_bpe_t *t);
int loom__bpe_model_token(const loom_bpe_t *t, int id); /* 1: id is in the model's vocabulary */
const int32_t (*loom__bpe_merge_list(const loom_bpe_t *t))[2];

/* tokenizer_json.c: read a Hugging Face tokenizer.json (loom_bpe_load's file case). */
int loom__bpe_load_json(loom_bpe_t **t, const char *path);

static inline uint64_t loom__bpe_hash(const unsigned char *p, size_t n)
{
	uint64_t h = 1469598103934665603ull ^ n;
	for (size_t i = 0; i < n; i++)
		h = (h ^ p[i]) * 1099511628211ull;
	return h ^ (h >> 29);
}

#endif
