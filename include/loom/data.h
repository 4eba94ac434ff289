/* loom/data.h: token shards (llm.c's format), the byte-level / llm.c tokenizer, the data loader and
 * `loom data prepare`.
 *
 * Shard file: a header of 256 int32 (little-endian): [0] magic, [1] version, [2] token count N; then N
 * tokens: uint16 for magic 20240520 version 1 (llm.c's "gpt-2" shards), uint32 for magic 20240801
 * version 7 (llm.c's "llama-3" shards, for vocabularies of more than 65536 ids). Datasets prepared for
 * llm.c (e.g. its FineWeb shards) load as they are.
 *
 * Loader: the shards matched by a glob, sorted by name, are one concatenated token stream of N tokens.
 * For micro-batches of B x T tokens there are W = (N-1)/(B*T) windows per epoch; window k (counting
 * from 0 over the whole run) is in epoch k/W and, without shuffle, holds the B*T+1 tokens starting at
 * token (k%W)*B*T. Inputs are its first B*T tokens, targets the same shifted by one (llm.c's
 * convention). With shuffle, position k%W of epoch e reads window perm_e(k%W), where perm_e is a
 * seeded permutation of [0, W) derived from (seed, e) only, so any window can be computed directly.
 * Data-parallel rank r of `world` reads, in step i, micro-step j, window (i*accum + j)*world + r; the
 * loader's sequential next() with rank/world set yields exactly that sequence.
 *
 * Thread safety: an object (shard, tokenizer, loader) may be used by one thread at a time, except
 * where a function says otherwise; distinct objects are independent. Errors: see loom/error.h. */
#ifndef LOOM_DATA_H
#define LOOM_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "loom/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- shards ---------------------------------------------------------------------------------- */

#define LOOM_SHARD_MAGIC 20240520   /* uint16 tokens (llm.c's "gpt-2" shards) */
#define LOOM_SHARD_VERSION 1
#define LOOM_SHARD32_MAGIC 20240801 /* uint32 tokens (llm.c's "llama-3" shards) */
#define LOOM_SHARD32_VERSION 7
#define LOOM_SHARD16_MAX_VOCAB 65536 /* the most ids a uint16 shard can hold; more need uint32 shards */
#define LOOM_SHARD_HEADER_INTS 256
/* The index `loom data prepare` writes beside its shards (text: each set's shard and token counts,
 * each shard's size). When a loader's shards have one beside them, the loader checks that
 * every shard of the set is there with its size; shards without one (llm.c's) load unchecked. */
#define LOOM_SHARD_INDEX "shards.index"

/* A read-only, memory-mapped shard. Caller-owned struct; fields are read-only for the caller. Tokens
 * are read in the file's width (never widened in memory): use loom_shard_token, or cast tokens to
 * uint16_t / uint32_t by token_bytes. */
typedef struct {
	char *path;              /* owned copy of the file name */
	const void *tokens;      /* n_tokens tokens of token_bytes each, inside the mapping */
	int token_bytes;         /* 2 (uint16, version 1) or 4 (uint32, version 7) */
	size_t n_tokens;
	void *map;               /* whole-file mapping (internal) */
	size_t map_bytes;
} loom_shard_t;

/* Token i (< n_tokens) of an open shard. */
static inline uint32_t loom_shard_token(const loom_shard_t *s, size_t i)
{
	return s->token_bytes == 4 ? ((const uint32_t *)s->tokens)[i] : ((const uint16_t *)s->tokens)[i];
}

/* Map and validate a shard of either width. LOOM_ENOENT/LOOM_EIO when it cannot be opened,
 * LOOM_EFORMAT when the magic is neither 20240520 nor 20240801, the version is not the magic's
 * (1 with 20240520, 7 with 20240801), or the file size is not 1024 + N * token_bytes (the message
 * names the file, what was found and what was expected). On failure *s is left closed (safe to
 * loom_shard_close). */
int loom_shard_open(loom_shard_t *s, const char *path);
void loom_shard_close(loom_shard_t *s); /* idempotent; zeroes *s */
/* The largest token id of an open shard (a scan of its tokens); 0 for an empty shard. */
uint32_t loom_shard_max_token(const loom_shard_t *s);

/* Write n tokens as a uint16 shard (magic 20240520, version 1), or as a uint32 shard (magic
 * 20240801, version 7: loom_shard_write32), atomically (temp file in the same directory, fsync,
 * rename). LOOM_EINVAL for n >= 2^31, LOOM_EIO/LOOM_ESYS naming the file on failure. */
int loom_shard_write(const char *path, const uint16_t *tokens, size_t n);
int loom_shard_write32(const char *path, const uint32_t *tokens, size_t n);

/* ---- tokenizer ------------------------------------------------------------------------------- */

#define LOOM_TOKENIZER_MAGIC 20240328
#define LOOM_BYTE_VOCAB 257 /* bytes 0-255, then end-of-text */
#define LOOM_BYTE_EOT 256

/* A token table: token i decodes to bytes[i] (lengths[i] bytes, plus a terminating NUL that is not
 * counted). Caller-owned struct; release with loom_tokenizer_free. */
typedef struct {
	int vocab_size;
	int eot_token;
	unsigned char **bytes;
	int *lengths;
	int byte_level; /* 1 when tokens 0-255 are the single bytes 0-255 (then encode works) */
} loom_tokenizer_t;

/* The byte-level tokenizer: vocab 257, token b < 256 is byte b, 256 is end-of-text, which decodes
 * to "<|endoftext|>". LOOM_ENOMEM on allocation failure. */
int loom_tokenizer_init_bytes(loom_tokenizer_t *tok);
/* Load an llm.c tokenizer file (magic 20240328; version 1: eot 50256, vocab must be 50257;
 * version 2: eot in header[3]). LOOM_EFORMAT naming the file for bad magic/version, truncation,
 * zero-length tokens or trailing bytes. */
int loom_tokenizer_load(loom_tokenizer_t *tok, const char *path);
/* Write in llm.c's format, version 2, atomically. */
int loom_tokenizer_save(const loom_tokenizer_t *tok, const char *path);
void loom_tokenizer_free(loom_tokenizer_t *tok); /* idempotent; zeroes *tok */
/* Bytes of token id (length in *len), or NULL (and *len = 0) when id is out of range. The pointer
 * stays valid until loom_tokenizer_free. */
const unsigned char *loom_tokenizer_decode(const loom_tokenizer_t *tok, int id, int *len);
/* Encode text with the byte tokenizer: out[i] = (unsigned char)text[i], so *n_out = len. Needs
 * cap >= len. LOOM_ENOTSUP when tok is not byte-level (BPE encoding is not implemented),
 * LOOM_EINVAL when cap is too small. */
int loom_tokenizer_encode(const loom_tokenizer_t *tok, const char *text, size_t len, int *out, size_t cap,
                          size_t *n_out);

/* ---- loader ---------------------------------------------------------------------------------- */

typedef struct {
	int B, T;      /* micro-batch: B rows of T tokens */
	int shuffle;   /* 0: windows in order; 1: seeded permutation per epoch */
	uint64_t seed; /* shuffle seed */
	/* next() yields windows rank, rank + world, rank + 2 world, ...; world <= 0 means rank 0 of 1. */
	int rank;
	int world;
	/* The model's vocabulary: every token a window reads must be < vocab_size, else the read is
	 * LOOM_EINVAL naming the shard and the token's offset. 0: only ids above INT32_MAX are refused
	 * (LOOM_EFORMAT), as no int holds them. */
	int vocab_size;
} loom_loader_opts_t;

/* The complete position of a loader: a plain struct that a trainer stores in its checkpoint and
 * gives back to loom_loader_set_state. n_tokens, B, T, shuffle, seed, rank and world are checked on
 * restore, so a state from different data or settings is refused rather than silently misused. */
typedef struct {
	uint64_t next_window; /* global index k of the window next() returns */
	uint64_t epoch;       /* next_window / windows_per_epoch (informational; checked on restore) */
	uint64_t seed;
	uint64_t n_tokens;    /* tokens of the concatenated shards */
	int32_t B, T, shuffle, rank, world;
	int32_t reserved_;    /* zero; keeps the struct free of padding */
} loom_loader_state_t;

typedef struct loom_loader loom_loader_t;

/* Open every shard matching `pattern` (glob(3), sorted by name). LOOM_ENOENT when nothing matches,
 * LOOM_EFORMAT for a bad shard or for shards of both widths (uint16 and uint32: two data sets),
 * LOOM_EINVAL (naming the glob, N, B and T) when there is not even one
 * window (N - 1 < B*T) or B, T, rank or world are invalid. */
int loom_loader_create(loom_loader_t **ld, const char *pattern, const loom_loader_opts_t *opts);
void loom_loader_destroy(loom_loader_t *ld); /* safe on NULL */

uint64_t loom_loader_num_tokens(const loom_loader_t *ld);
uint64_t loom_loader_windows_per_epoch(const loom_loader_t *ld); /* W */
int loom_loader_num_shards(const loom_loader_t *ld);
/* Bytes per token of the loader's shards: 2 (uint16) or 4 (uint32). */
int loom_loader_token_bytes(const loom_loader_t *ld);
/* The largest token id in all the shards (a full scan of the mapped tokens, about 50 ms per 100M
 * tokens): lets a trainer check the whole data set against its vocabulary once, at start. */
uint32_t loom_loader_max_token(const loom_loader_t *ld);

/* Fill inputs and targets (B*T ints each) with window k, independent of the loader's position.
 * LOOM_EINVAL / LOOM_EFORMAT for a token id at or above the limit (opts.vocab_size), naming the shard,
 * the token's offset in it and the window (inputs and targets are then partly written).
 * Thread-safe for concurrent calls (reads only). */
int loom_loader_window(const loom_loader_t *ld, uint64_t k, int *inputs, int *targets);
/* Index (in units of windows, i.e. the start token is this x B*T) that window k reads: the
 * permutation applied within k's epoch (k % W without shuffle). */
uint64_t loom_loader_window_start(const loom_loader_t *ld, uint64_t k);

/* Read the window at the loader's position, then advance the position by `world`. */
int loom_loader_next(loom_loader_t *ld, int *inputs, int *targets);
void loom_loader_get_state(const loom_loader_t *ld, loom_loader_state_t *st);
/* Restore a position saved by get_state. LOOM_EMISMATCH (naming the field, saved and current
 * values) when the state belongs to other data or settings. */
int loom_loader_set_state(loom_loader_t *ld, const loom_loader_state_t *st);
/* Move the position to window k (e.g. rank + world * micro-steps done). */
void loom_loader_seek(loom_loader_t *ld, uint64_t k);

/* ---- data prepare ---------------------------------------------------------------------------- */

typedef struct {
	const char *const *inputs; /* text files, in this order */
	int n_inputs;
	const char *out_dir;       /* created if missing */
	double val_fraction;       /* [0, 1): see loom_data_prepare */
	size_t shard_tokens;       /* tokens per shard file (0: 100,000,000 as llm.c's FineWeb) */
	const char *doc_sep;       /* NULL: each file is one document; else lines equal to this string
	                              (e.g. "%" for fortune files) separate documents and are dropped */
	const char *tokenizer;     /* NULL: the byte tokenizer; else a BPE tokenizer directory
	                              (loom/tokenizer.h), see loom_data_prepare */
} loom_prepare_opts_t;

typedef struct {
	uint64_t documents, train_documents, val_documents;
	uint64_t train_tokens, val_tokens;
	int train_shards, val_shards;
	int removed_shards;        /* old train_/val_ shards of DIR replaced */
	int val_tail_split;        /* 1 when val is the tail of the token stream (too few documents) */
	int token_bytes;           /* the shards' tokens: 2 (uint16) or 4 (uint32, a vocabulary above 65536) */
} loom_prepare_summary_t;

/* Tokenize text files with the byte tokenizer into OUT/train_000000.bin.. and OUT/val_000000.bin..,
 * and write OUT/tokenizer.bin (llm.c format, version 2). Every document is end-of-text (256)
 * followed by its bytes. With opts->tokenizer, documents are BPE-encoded as plain text and preceded
 * by the tokenizer's document start (its post-processor's BOS, else "<|endoftext|>"; LOOM_EINVAL when
 * it has neither); shards hold uint16 tokens when the tokenizer has at most 65536 ids (its added
 * tokens included), else uint32 (magic 20240801, version 7: llm.c's llama-3 shards);
 * the tokenizer's files are copied into OUT as vocab.json + merges.txt (+ pattern.txt), so OUT is
 * itself a tokenizer directory, and OUT/tokenizer.bin holds its table when llm.c's format can (every
 * id used, tokens of at most 255 bytes, as GPT-2's). Validation split, deterministic: document i (0-based over all inputs in
 * order) goes to val when floor((i+1) f) > floor(i f), i.e. every (1/f)-th document, evenly spread,
 * round(n f) of them. When that selects no document (fewer than 1/f documents) but f > 0, val is
 * instead the last ceil(f x tokens) tokens of the stream (preceded by an end-of-text), and train the
 * rest. Inputs are read whole into memory. The new set (shards, tokenizer files, LOOM_SHARD_INDEX)
 * is written into a temporary directory beside OUT and replaces OUT's old set only when complete: on
 * any failure the old set is left as it was. OUT holding only files prepare writes is swapped whole
 * (atomically); otherwise the old index, train_NNNNNN.bin / val_NNNNNN.bin, tokenizer.bin and
 * pattern.txt are removed and the new files moved in, the index last. Either way the glob
 * OUT/train_*.bin names exactly the new shards. */
int loom_data_prepare(const loom_prepare_opts_t *opts, loom_prepare_summary_t *summary);

#ifdef __cplusplus
}
#endif
#endif
