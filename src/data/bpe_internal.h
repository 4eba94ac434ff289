/* bpe_internal.h: what the BPE loader/encoder (bpe.c) and trainer (bpe_train.c) share (internal):
 * GPT-2's byte-to-unicode table, the pre-tokenization splitter over PCRE2, and a byte-string hash. */
#ifndef LOOM_DATA_BPE_INTERNAL_H
#define LOOM_DATA_BPE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

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

/* Compile `pattern`; LOOM_EINVAL with PCRE2's message and offset, LOOM_ENOMEM. */
int loom__bpe_splitter_create(loom__bpe_splitter_t **sp, const char *pattern);
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

static inline uint64_t loom__bpe_hash(const unsigned char *p, size_t n)
{
	uint64_t h = 1469598103934665603ull ^ n;
	for (size_t i = 0; i < n; i++)
		h = (h ^ p[i]) * 1099511628211ull;
	return h ^ (h >> 29);
}

#endif
