/* bpe.c: GPT-2's byte-level BPE: loading vocab.json/merges.txt (or encoder.json/vocab.bpe),
 * encoding and decoding.
 *
 * Shape. Tokens are kept as the bytes they stand for, not as GPT-2's byte-to-unicode strings: the
 * mapping is a bijection, so merging strings (the reference) and merging ids by the rank of the id
 * pair are the same computation. Three tables: id -> bytes (decode), bytes -> id (load-time
 * lookups), and (left id, right id) -> (rank, merged id), an open-addressing hash keyed by the pair.
 *
 * Merging a piece. The reference repeatedly takes the lowest-ranked adjacent pair and merges all its
 * occurrences left to right. bpe_fast() does the same with a linked list of symbols and a min-heap of
 * (rank, position) candidates, validated lazily, in O(n log n) instead of O(n^2) per piece (a piece
 * can be a megabyte of letters in hostile input). The two agree whenever every merge's tokens are
 * single bytes or made only by merges of lower rank ("well formed", checked at load: GPT-2's and
 * loom's trained files are), because then merging never creates a pair that outranks the rank being
 * processed, and a merge cannot create another occurrence of its own pair. A tokenizer that is not
 * well formed uses bpe_reference(), the reference algorithm as written; tests compare the two.
 *
 * Cache. Text repeats its pieces (" the", ","), so results for pieces up to CACHE_MAX_PIECE bytes
 * are cached in a hash table that is simply emptied when full; caching never changes results. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "ckpt/json.h"
#include "core/fileio.h"
#include "core/util.h"
#include "data/bpe_internal.h"
#include "loom/tokenizer.h"

#define BPE_MAX_ID (1 << 24)
#define BPE_ID_SLACK 65536          /* ids may exceed the number of tokens by this much (holes) */
#define BPE_FILE_MAX (64u << 20)    /* vocab.json / merges.txt (GPT-2's: 1 MB and 456 KB) */
#define BPE_PATTERN_MAX (64u << 10) /* pattern.txt */
#define CACHE_MAX_PIECE 64
#define CACHE_SLOTS (1u << 16)       /* power of two; emptied at half full */
#define CACHE_POOL_INTS (4u << 20)   /* key bytes and ids, counted in ints */

/* \s of ECMAScript (the reference is JavaScript): \t-\r, space, U+00A0, U+1680, U+2000-200A,
 * U+2028, U+2029, U+202F, U+205F, U+3000, U+FEFF. */
#define JS_WS "\\t-\\r \\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}\\x{feff}"
const char loom_bpe_pattern_gpt2[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" JS_WS "\\p{L}\\p{N}]+"
                                     "|[" JS_WS "]+(?![^" JS_WS "])|[" JS_WS "]+";
const char loom_bpe_pattern_gpt4[] = "'(?i:[sdmt]|ll|ve|re)|[^\\r\\n\\p{L}\\p{N}]?+\\p{L}+|\\p{N}{1,3}"
                                     "| ?[^\\s\\p{L}\\p{N}]++[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+";

/* ---- byte-to-unicode ------------------------------------------------------------------------ */

static int printable_byte(int b)
{
	return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

static int byte_cp_table[256];
static signed short cp_byte_table[256 + 68]; /* 68 bytes are not printable: U+0100..U+0143 */
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void build_tables(void)
{
	int n = 0; /* the bytes that are not printable take 256, 257, ... in byte order */
	for (int c = 0; c < 256 + 68; c++)
		cp_byte_table[c] = -1;
	for (int b = 0; b < 256; b++) {
		byte_cp_table[b] = printable_byte(b) ? b : 256 + n++;
		cp_byte_table[byte_cp_table[b]] = (signed short)b;
	}
}

static void init_tables(void)
{
	pthread_once(&tables_once, build_tables);
}

int loom__bpe_byte_cp(int b)
{
	init_tables();
	return byte_cp_table[b & 0xFF];
}

int loom__bpe_cp_byte(uint32_t cp)
{
	init_tables();
	return cp < 256 + 68 ? cp_byte_table[cp] : -1;
}

void loom__bpe_write_mapped(FILE *f, const unsigned char *p, size_t n)
{
	init_tables();
	for (size_t i = 0; i < n; i++) {
		int cp = byte_cp_table[p[i]];
		if (cp < 0x80)
			fputc(cp, f);
		else {
			fputc(0xC0 | (cp >> 6), f);
			fputc(0x80 | (cp & 0x3F), f);
		}
	}
}

/* Bytes of a byte-level token string s[0..n) (UTF-8 of mapped code points) into out (n bytes at
 * most). Returns the byte count, or -1 when s is not such a string. */
static long unmap(const char *s, size_t n, unsigned char *out)
{
	const unsigned char *p = (const unsigned char *)s;
	long k = 0;
	for (size_t i = 0; i < n;) {
		uint32_t cp;
		if (p[i] < 0x80)
			cp = p[i], i += 1;
		else if ((p[i] & 0xE0) == 0xC0 && p[i] >= 0xC2 && i + 1 < n && (p[i + 1] & 0xC0) == 0x80) /* no overlong forms */
			cp = ((uint32_t)(p[i] & 0x1F) << 6) | (p[i + 1] & 0x3F), i += 2;
		else
			return -1;
		if (cp >= 256 + 68 || cp_byte_table[cp] < 0)
			return -1;
		out[k++] = (unsigned char)cp_byte_table[cp];
	}
	return k;
}

/* ---- splitter ------------------------------------------------------------------------------- */

struct loom__bpe_splitter {
	pcre2_code *re;
	pcre2_match_data *md;
};

int loom__bpe_splitter_create(loom__bpe_splitter_t **out, const char *pattern)
{
	return loom__bpe_splitter_create_ex(out, pattern, 0);
}

int loom__bpe_splitter_create_ex(loom__bpe_splitter_t **out, const char *pattern, int literal)
{
	int err = 0, rc = LOOM_OK;
	PCRE2_SIZE off = 0;
	loom__bpe_splitter_t *sp = loom__calloc(1, sizeof *sp);
	*out = NULL;
	if (!sp)
		return loom_seterr(LOOM_ENOMEM, "tokenizer: out of memory for the regex");
	sp->re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_MATCH_INVALID_UTF |
	                       (literal ? PCRE2_LITERAL : PCRE2_UCP), &err, &off, NULL);
	if (!sp->re) {
		PCRE2_UCHAR msg[256];
		pcre2_get_error_message(err, msg, sizeof msg);
		rc = loom_seterr(LOOM_EINVAL, "tokenizer: bad pre-tokenization regex at offset %zu: %s", (size_t)off,
		                 (const char *)msg);
		goto done;
	}
	(void)pcre2_jit_compile(sp->re, PCRE2_JIT_COMPLETE); /* the interpreter is the fallback */
	sp->md = pcre2_match_data_create_from_pattern(sp->re, NULL);
	if (!sp->md)
		rc = loom_seterr(LOOM_ENOMEM, "tokenizer: out of memory for the regex match data");
done:
	if (rc != LOOM_OK)
		loom__bpe_splitter_destroy(sp);
	else
		*out = sp;
	return rc;
}

void loom__bpe_splitter_destroy(loom__bpe_splitter_t *sp)
{
	if (!sp)
		return;
	pcre2_match_data_free(sp->md);
	pcre2_code_free(sp->re);
	free(sp);
}

int loom__bpe_split(loom__bpe_splitter_t *sp, const char *text, size_t len,
                    int (*fn)(const unsigned char *p, size_t n, void *arg), void *arg)
{
	const unsigned char *s = (const unsigned char *)text;
	size_t pos = 0;
	int rc;
	while (pos < len) {
		int m = pcre2_match(sp->re, s, len, pos, 0, sp->md, NULL);
		if (m == PCRE2_ERROR_NOMATCH)
			return fn(s + pos, len - pos, arg);
		if (m < 0) {
			PCRE2_UCHAR msg[256];
			pcre2_get_error_message(m, msg, sizeof msg);
			return loom_seterr(LOOM_EINVAL, "tokenizer: regex match failed at byte %zu: %s", pos, (const char *)msg);
		}
		PCRE2_SIZE *ov = pcre2_get_ovector_pointer(sp->md);
		size_t a = ov[0], b = ov[1];
		if (a > pos && (rc = fn(s + pos, a - pos, arg)) != 0) /* bytes no alternative can match */
			return rc;
		if (b <= a) /* an empty match (only a custom pattern can give one): take one byte */
			b = a + 1;
		if ((rc = fn(s + a, b - a, arg)) != 0)
			return rc;
		pos = b;
	}
	return 0;
}

/* ---- the tokenizer -------------------------------------------------------------------------- */

typedef struct {
	uint64_t key; /* (left + 1) << 32 | right; 0 = empty */
	int32_t rank, result;
} merge_slot_t;

typedef struct {
	uint64_t hash;
	uint32_t key_off, key_len; /* key bytes at (char *)(pool + key_off) */
	uint32_t ids_off, n_ids;   /* 0 n_ids: empty slot (a piece has at least one id) */
} cache_slot_t;

typedef struct {
	int32_t rank, pos;
} cand_t;

/* One pre-tokenization step: a regex split (pieces and the gaps between matches, "Isolated"), after
 * prepending a space to a piece that does not start with one when prefix_space is set. */
typedef struct {
	loom__bpe_splitter_t *sp; /* NULL: no split */
	char *pattern;            /* as given (for saving), NULL with sp */
	int kind, literal, prefix_space;
} step_t;

/* A token matched in the text before pre-tokenization (its bytes are tok[id]). */
typedef struct {
	int id, special, normalized;
} added_t;

struct loom_bpe {
	int vocab_size, eot, n_merges, well_formed;
	int n_model;         /* tokens of the model's vocabulary (the rest are added tokens) */
	unsigned char **tok; /* tok[id]: bytes of the token (NUL-terminated), NULL for ids not in use */
	uint32_t *tok_len;
	uint32_t *vmap;      /* bytes -> id + 1; 0 = empty */
	size_t vmap_cap;
	merge_slot_t *mmap;
	size_t mmap_cap;
	int byte_id[256];
	uint64_t seed;       /* random per tokenizer: a hostile file cannot pick colliding slots */
	char *pattern;       /* description of the pre-tokenizer (loom_bpe_pattern) */
	step_t steps[LOOM__BPE_MAX_STEPS];
	int n_steps, ignore_merges;
	added_t *added;      /* longest first (leftmost-longest matching) */
	int n_added;
	unsigned char first[2][256]; /* first[normalized][b]: some added token of that pass starts with b */
	int n_plain[2];      /* added tokens of each pass not marked special (matched without LOOM_BPE_SPECIAL) */
	int tmpl[2][LOOM__BPE_MAX_TEMPLATE], n_tmpl[2]; /* ids before / after the text (TemplateProcessing) */
	int32_t (*merge_list)[2]; /* merges in rank order (for saving) */
	int32_t *made_by;    /* while merges are added: highest rank of a merge producing each token */
	/* encode state */
	int flags;
	int *sym, *nxt, *prv;
	cand_t *heap;
	size_t scratch_cap, heap_cap;
	int *out;
	size_t n_out, out_cap;
	cache_slot_t *cache;
	size_t cache_used;
	int32_t *pool;
	size_t pool_used;
	int allow_special;
};

static uint64_t pair_key(int l, int r)
{
	return ((uint64_t)(uint32_t)(l + 1) << 32) | (uint32_t)r;
}

static size_t mix64(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	return (size_t)x;
}

static const merge_slot_t *merge_find(const loom_bpe_t *t, int l, int r)
{
	uint64_t k = pair_key(l, r);
	for (size_t i = mix64(k ^ t->seed) & (t->mmap_cap - 1);; i = (i + 1) & (t->mmap_cap - 1)) {
		if (t->mmap[i].key == k)
			return &t->mmap[i];
		if (t->mmap[i].key == 0)
			return NULL;
	}
}

static int32_t merge_rank(const loom_bpe_t *t, int l, int r)
{
	const merge_slot_t *m = merge_find(t, l, r);
	return m ? m->rank : -1;
}

static size_t vocab_slot(const loom_bpe_t *t, const unsigned char *p, size_t n)
{
	return mix64(loom__bpe_hash(p, n) ^ t->seed) & (t->vmap_cap - 1);
}

/* Id of the token whose bytes are p[0..n), or -1. */
static int vocab_find(const loom_bpe_t *t, const unsigned char *p, size_t n)
{
	for (size_t i = vocab_slot(t, p, n);; i = (i + 1) & (t->vmap_cap - 1)) {
		uint32_t v = t->vmap[i];
		if (v == 0)
			return -1;
		if (t->tok_len[v - 1] == n && memcmp(t->tok[v - 1], p, n) == 0)
			return (int)v - 1;
	}
}

void loom_bpe_destroy(loom_bpe_t *t)
{
	if (!t)
		return;
	if (t->tok)
		for (int i = 0; i < t->vocab_size; i++)
			free(t->tok[i]);
	free(t->tok);
	free(t->tok_len);
	free(t->vmap);
	free(t->mmap);
	free(t->pattern);
	for (int i = 0; i < t->n_steps; i++) {
		loom__bpe_splitter_destroy(t->steps[i].sp);
		free(t->steps[i].pattern);
	}
	free(t->added);
	free(t->merge_list);
	free(t->made_by);
	free(t->sym), free(t->nxt), free(t->prv), free(t->heap), free(t->out);
	free(t->cache), free(t->pool);
	free(t);
}

static int file_exists(const char *path)
{
	struct stat sb;
	return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

static size_t pow2_at_least(size_t n)
{
	size_t c = 16;
	while (c < n)
		c <<= 1;
	return c;
}

int loom__bpe_new(loom_bpe_t **out)
{
	loom_bpe_t *t;
	init_tables();
	*out = NULL;
	if (!(t = loom__calloc(1, sizeof *t)))
		return loom_seterr(LOOM_ENOMEM, "tokenizer: out of memory");
	/* Hash-flooding defence: slots depend on a secret seed, so a vocabulary or merges crafted to
	 * collide cannot make loading quadratic. Results never depend on slots. */
	if (getrandom(&t->seed, sizeof t->seed, GRND_NONBLOCK) != (ssize_t)sizeof t->seed)
		t->seed = (uint64_t)(loom_now() * 1e9) ^ (uint64_t)(uintptr_t)t;
	t->eot = -1;
	*out = t;
	return LOOM_OK;
}

int loom__bpe_load_vocab(loom_bpe_t *t, const json_t *root, const char *path)
{
	int rc = LOOM_OK, max_id = -1;
	unsigned char *buf = NULL;
	if (root->type != JSON_OBJECT)
		return loom_seterr(LOOM_EFORMAT, "%s: expected a JSON object of token -> id, found %s", path,
		                   loom__json_type_name(root->type));
	if (root->n == 0)
		return loom_seterr(LOOM_EFORMAT, "%s: the vocabulary is empty", path);
	for (int i = 0; i < root->n; i++) {
		const json_t *v = &root->kids[i];
		int64_t id;
		if (v->type != JSON_NUMBER || loom__json_to_i64(v, &id) != 0 || id < 0 || id >= BPE_MAX_ID)
			return loom_seterr(LOOM_EFORMAT, "%s: token #%d \"%.40s\" has id %s (expected an integer in [0, %d))",
			                   path, i, v->key, v->type == JSON_NUMBER ? v->s : loom__json_type_name(v->type),
			                   BPE_MAX_ID);
		if (id > max_id)
			max_id = (int)id;
	}
	if (max_id >= root->n + BPE_ID_SLACK) /* before allocating tables of max_id entries */
		return loom_seterr(LOOM_EFORMAT, "%s: id %d for a vocabulary of %d tokens (ids must be below the token count "
		                   "+ %d)", path, max_id, root->n, BPE_ID_SLACK);
	t->vocab_size = max_id + 1;
	t->n_model = root->n;
	t->tok = loom__calloc((size_t)t->vocab_size, sizeof *t->tok);
	t->tok_len = loom__calloc((size_t)t->vocab_size, sizeof *t->tok_len);
	t->vmap_cap = pow2_at_least(2 * (size_t)root->n);
	t->vmap = loom__calloc(t->vmap_cap, sizeof *t->vmap);
	if (!t->tok || !t->tok_len || !t->vmap)
		return loom_seterr(LOOM_ENOMEM, "%s: out of memory for %d tokens", path, t->vocab_size);
	for (int i = 0; i < root->n; i++) {
		const json_t *v = &root->kids[i];
		size_t klen = strlen(v->key);
		int64_t id;
		loom__json_to_i64(v, &id);
		buf = loom__malloc(klen + 1);
		if (!buf) {
			rc = loom_seterr(LOOM_ENOMEM, "%s: out of memory", path);
			goto done;
		}
		long n = unmap(v->key, klen, buf);
		if (n <= 0) {
			rc = loom_seterr(LOOM_EFORMAT, "%s: token #%d \"%.40s\" (id %d) is not a byte-level token string "
			                 "(GPT-2's byte-to-unicode characters)", path, i, v->key, (int)id);
			goto done;
		}
		buf[n] = 0;
		if (t->tok[id]) {
			rc = loom_seterr(LOOM_EFORMAT, "%s: id %d is given to two tokens (the second is #%d \"%.40s\")", path,
			                 (int)id, i, v->key);
			goto done;
		}
		if (vocab_find(t, buf, (size_t)n) >= 0) {
			rc = loom_seterr(LOOM_EFORMAT, "%s: token \"%.40s\" appears twice (ids %d and %d)", path, v->key,
			                 vocab_find(t, buf, (size_t)n), (int)id);
			goto done;
		}
		t->tok[id] = buf, t->tok_len[id] = (uint32_t)n, buf = NULL;
		size_t s = vocab_slot(t, t->tok[id], (size_t)n);
		while (t->vmap[s])
			s = (s + 1) & (t->vmap_cap - 1);
		t->vmap[s] = (uint32_t)id + 1;
	}
	for (int b = 0; b < 256; b++) {
		unsigned char c = (unsigned char)b;
		if ((t->byte_id[b] = vocab_find(t, &c, 1)) < 0) {
			rc = loom_seterr(LOOM_EFORMAT, "%s: byte 0x%02x has no single-byte token (a byte-level BPE needs all 256)",
			                 path, b);
			goto done;
		}
	}
	t->eot = vocab_find(t, (const unsigned char *)LOOM_BPE_EOT_TEXT, strlen(LOOM_BPE_EOT_TEXT));
done:
	free(buf);
	return rc;
}

int loom__bpe_merges_begin(loom_bpe_t *t, size_t max_merges)
{
	if (max_merges > (size_t)INT32_MAX / 4)
		return loom_seterr(LOOM_EFORMAT, "tokenizer: %zu merges are too many", max_merges);
	t->mmap_cap = pow2_at_least(2 * max_merges + 2);
	t->mmap = loom__calloc(t->mmap_cap, sizeof *t->mmap);
	t->made_by = loom__malloc((size_t)t->vocab_size * sizeof *t->made_by);
	t->merge_list = loom__malloc((max_merges + 1) * sizeof *t->merge_list);
	if (!t->mmap || !t->made_by || !t->merge_list)
		return loom_seterr(LOOM_ENOMEM, "tokenizer: out of memory for %zu merges", max_merges);
	for (int i = 0; i < t->vocab_size; i++)
		t->made_by[i] = -1;
	t->well_formed = 1;
	t->n_merges = 0;
	return LOOM_OK;
}

int loom__bpe_merge_add(loom_bpe_t *t, const char *sa, size_t la, const char *sb, size_t lb)
{
	unsigned char *a = loom__malloc(la + 1), *b = loom__malloc(lb + 1), *ab = loom__malloc(la + lb + 2);
	int rc = LOOM__MERGE_OK;
	if (!a || !b || !ab) {
		rc = LOOM__MERGE_NOMEM;
		goto done;
	}
	long na = unmap(sa, la, a), nb = unmap(sb, lb, b);
	if (na <= 0 || nb <= 0) {
		rc = na <= 0 ? LOOM__MERGE_BAD_FIRST : LOOM__MERGE_BAD_SECOND;
		goto done;
	}
	int ia = vocab_find(t, a, (size_t)na), ib = vocab_find(t, b, (size_t)nb);
	memcpy(ab, a, (size_t)na), memcpy(ab + na, b, (size_t)nb);
	int iab = vocab_find(t, ab, (size_t)(na + nb));
	if (ia < 0 || ib < 0 || iab < 0) {
		rc = ia < 0 ? LOOM__MERGE_NO_FIRST : ib < 0 ? LOOM__MERGE_NO_SECOND : LOOM__MERGE_NO_RESULT;
		goto done;
	}
	uint64_t k = pair_key(ia, ib);
	size_t s = mix64(k ^ t->seed) & (t->mmap_cap - 1);
	while (t->mmap[s].key && t->mmap[s].key != k)
		s = (s + 1) & (t->mmap_cap - 1);
	/* A repeated merge takes its later rank, as the reference's dict(zip(merges, ranks)) does. */
	t->mmap[s].key = k, t->mmap[s].rank = t->n_merges, t->mmap[s].result = iab;
	if (t->made_by[iab] >= 0) /* a token made by two merges (or a repeated merge): be conservative */
		t->well_formed = 0;
	t->made_by[iab] = t->n_merges;
	t->merge_list[t->n_merges][0] = ia, t->merge_list[t->n_merges][1] = ib;
	t->n_merges++;
done:
	free(a), free(b), free(ab);
	return rc;
}

void loom__bpe_merges_end(loom_bpe_t *t)
{
	/* Well formed: a merge's tokens are bytes or made by lower-ranked merges only (see the top). */
	for (size_t s = 0; s < t->mmap_cap && t->well_formed; s++) {
		if (!t->mmap[s].key)
			continue;
		int l = (int)(t->mmap[s].key >> 32) - 1, r = (int)(uint32_t)t->mmap[s].key;
		if (t->made_by[l] >= t->mmap[s].rank || t->made_by[r] >= t->mmap[s].rank)
			t->well_formed = 0;
	}
	free(t->made_by);
	t->made_by = NULL;
}

const char *loom__bpe_merge_error(int code)
{
	switch (code) {
	case LOOM__MERGE_BAD_FIRST: return "the first token is not a byte-level token string";
	case LOOM__MERGE_BAD_SECOND: return "the second token is not a byte-level token string";
	case LOOM__MERGE_NO_FIRST: return "the first token is not in the vocabulary";
	case LOOM__MERGE_NO_SECOND: return "the second token is not in the vocabulary";
	case LOOM__MERGE_NO_RESULT: return "the merged token is not in the vocabulary";
	case LOOM__MERGE_NOMEM: return "out of memory";
	default: return "ok";
	}
}

/* Read the merges, one "A B" per line (rank = order), into the pair table. */
static int load_merges(loom_bpe_t *t, char *text, size_t len, const char *path)
{
	int rc = LOOM_OK, line = 0;
	size_t n_lines = 0;
	for (size_t i = 0; i < len; i++) /* upper bound on merges, for the table size */
		n_lines += text[i] == '\n';
	if ((rc = loom__bpe_merges_begin(t, n_lines + 1)) != LOOM_OK)
		return loom_seterr(rc, "%s: %s", path, loom_errmsg());
	for (char *p = text, *end = text + len; p < end;) {
		char *nl = memchr(p, '\n', (size_t)(end - p)), *e = nl ? nl : end;
		char *f[3];
		size_t fl[3];
		int nf = 0, mrc;
		line++;
		if (e > p && e[-1] == '\r')
			e--;
		if (line == 1 && e - p >= 8 && memcmp(p, "#version", 8) == 0)
			goto next;
		for (char *q = p; q < e && nf < 3;) { /* fields separated by runs of spaces, as the reference splits */
			while (q < e && (*q == ' ' || *q == '\t'))
				q++;
			if (q == e)
				break;
			f[nf] = q;
			while (q < e && *q != ' ' && *q != '\t')
				q++;
			fl[nf] = (size_t)(q - f[nf]);
			nf++;
		}
		if (nf == 0)
			goto next;
		if (nf != 2)
			return loom_seterr(LOOM_EFORMAT, "%s:%d: expected two tokens separated by a space, found %s: \"%.*s\"",
			                   path, line, nf < 2 ? "one" : "more", (int)LOOM_MIN(e - p, 60), p);
		if ((mrc = loom__bpe_merge_add(t, f[0], fl[0], f[1], fl[1])) == LOOM__MERGE_NOMEM)
			return loom_seterr(LOOM_ENOMEM, "%s: out of memory", path);
		if (mrc == LOOM__MERGE_BAD_FIRST || mrc == LOOM__MERGE_BAD_SECOND)
			return loom_seterr(LOOM_EFORMAT, "%s:%d: \"%.*s\" is not a byte-level token string", path, line,
			                   (int)(mrc == LOOM__MERGE_BAD_FIRST ? fl[0] : fl[1]),
			                   mrc == LOOM__MERGE_BAD_FIRST ? f[0] : f[1]);
		if (mrc != LOOM__MERGE_OK)
			return loom_seterr(LOOM_EFORMAT, "%s:%d: merge \"%.*s %.*s\": %s is not in the vocabulary", path, line,
			                   (int)fl[0], f[0], (int)fl[1], f[1],
			                   mrc == LOOM__MERGE_NO_FIRST    ? "the first token"
			                   : mrc == LOOM__MERGE_NO_SECOND ? "the second token"
			                                                  : "the merged token");
	next:
		p = nl ? nl + 1 : end;
	}
	loom__bpe_merges_end(t);
	return rc;
}

int loom__bpe_add_step(loom_bpe_t *t, int kind, const char *pattern, int literal, int prefix_space)
{
	step_t *s;
	int rc;
	if (t->n_steps == LOOM__BPE_MAX_STEPS)
		return loom_seterr(LOOM_EFORMAT, "tokenizer: more than %d pre-tokenization steps", LOOM__BPE_MAX_STEPS);
	s = &t->steps[t->n_steps];
	memset(s, 0, sizeof *s);
	s->kind = kind, s->literal = literal, s->prefix_space = prefix_space;
	if (pattern) {
		if (!(s->pattern = loom__strdup(pattern)))
			return loom_seterr(LOOM_ENOMEM, "tokenizer: out of memory");
		if ((rc = loom__bpe_splitter_create_ex(&s->sp, pattern, literal)) != LOOM_OK) {
			free(s->pattern);
			s->pattern = NULL;
			return rc;
		}
	}
	t->n_steps++;
	return LOOM_OK;
}

int loom__bpe_step(const loom_bpe_t *t, int i, const char **pattern, int *literal, int *prefix_space)
{
	if (i < 0 || i >= t->n_steps)
		return -1;
	*pattern = t->steps[i].pattern, *literal = t->steps[i].literal, *prefix_space = t->steps[i].prefix_space;
	return t->steps[i].kind;
}

int loom__bpe_set_pattern_text(loom_bpe_t *t, const char *description)
{
	free(t->pattern);
	if (!(t->pattern = loom__strdup(description)))
		return loom_seterr(LOOM_ENOMEM, "tokenizer: out of memory");
	return LOOM_OK;
}

void loom__bpe_set_ignore_merges(loom_bpe_t *t, int on) { t->ignore_merges = on; }
int loom__bpe_ignore_merges(const loom_bpe_t *t) { return t->ignore_merges; }

int loom__bpe_add_token(loom_bpe_t *t, int id, const char *content, size_t len, int special, int normalized)
{
	added_t *na;
	if (len == 0)
		return loom_seterr(LOOM_EFORMAT, "added token %d has empty content", id);
	if (id < 0 || id >= BPE_MAX_ID || id >= t->n_model + BPE_ID_SLACK)
		return loom_seterr(LOOM_EFORMAT, "added token \"%.40s\" has id %d (expected an id in [0, %d))", content, id,
		                   LOOM_MIN(BPE_MAX_ID, t->n_model + BPE_ID_SLACK));
	for (int i = 0; i < t->n_added; i++) {
		const added_t *a = &t->added[i];
		if (a->id == id)
			return loom_seterr(LOOM_EFORMAT, "added token id %d appears twice", id);
		if (t->tok_len[a->id] == len && memcmp(t->tok[a->id], content, len) == 0)
			return loom_seterr(LOOM_EFORMAT, "added token \"%.40s\" appears twice (ids %d and %d)", content, a->id, id);
	}
	if (id < t->vocab_size && t->tok[id]) { /* also in the model's vocabulary: the same text, as in GPT-2's file */
		if (t->tok_len[id] != len || memcmp(t->tok[id], content, len) != 0)
			return loom_seterr(LOOM_EFORMAT, "added token \"%.40s\" has id %d, which the vocabulary gives to a "
			                   "different token", content, id);
	} else {
		if (id >= t->vocab_size) {
			unsigned char **nt = loom__realloc(t->tok, (size_t)(id + 1) * sizeof *nt);
			if (!nt)
				return loom_seterr(LOOM_ENOMEM, "tokenizer: out of memory");
			t->tok = nt;
			uint32_t *nl = loom__realloc(t->tok_len, (size_t)(id + 1) * sizeof *nl);
			if (!nl)
				return loom_seterr(LOOM_ENOMEM, "tokenizer: out of memory");
			t->tok_len = nl;
			for (int i = t->vocab_size; i <= id; i++)
				t->tok[i] = NULL, t->tok_len[i] = 0;
			t->vocab_size = id + 1;
		}
		if (!(t->tok[id] = loom__malloc(len + 1)))
			return loom_seterr(LOOM_ENOMEM, "tokenizer: out of memory");
		memcpy(t->tok[id], content, len);
		t->tok[id][len] = 0;
		t->tok_len[id] = (uint32_t)len;
	}
	if (!(na = loom__realloc(t->added, (size_t)(t->n_added + 1) * sizeof *na)))
		return loom_seterr(LOOM_ENOMEM, "tokenizer: out of memory");
	t->added = na;
	/* insertion keeps the list longest first (ties: file order), so the first match is the longest */
	int k = t->n_added;
	while (k > 0 && t->tok_len[t->added[k - 1].id] < len) {
		t->added[k] = t->added[k - 1];
		k--;
	}
	t->added[k] = (added_t){id, special != 0, normalized != 0};
	t->n_added++;
	t->first[normalized != 0][(unsigned char)content[0]] = 1;
	t->n_plain[normalized != 0] += !special;
	if (len == strlen(LOOM_BPE_EOT_TEXT) && memcmp(content, LOOM_BPE_EOT_TEXT, len) == 0)
		t->eot = id;
	return LOOM_OK;
}

int loom__bpe_added(const loom_bpe_t *t, int i, int *id, int *special, int *normalized)
{
	if (i < 0 || i >= t->n_added)
		return -1;
	*id = t->added[i].id, *special = t->added[i].special, *normalized = t->added[i].normalized;
	return 0;
}

int loom__bpe_set_template(loom_bpe_t *t, const int *before, int n_before, const int *after, int n_after)
{
	if (n_before > LOOM__BPE_MAX_TEMPLATE || n_after > LOOM__BPE_MAX_TEMPLATE)
		return loom_seterr(LOOM_EFORMAT, "more than %d special tokens on one side of the text", LOOM__BPE_MAX_TEMPLATE);
	for (int i = 0; i < n_before + n_after; i++) {
		int id = i < n_before ? before[i] : after[i - n_before];
		if (id < 0 || id >= t->vocab_size || !t->tok[id])
			return loom_seterr(LOOM_EFORMAT, "special token id %d is not in the vocabulary", id);
	}
	memcpy(t->tmpl[0], before, (size_t)n_before * sizeof *before);
	memcpy(t->tmpl[1], after, (size_t)n_after * sizeof *after);
	t->n_tmpl[0] = n_before, t->n_tmpl[1] = n_after;
	return LOOM_OK;
}

int loom__bpe_template(const loom_bpe_t *t, int after, const int **ids)
{
	*ids = t->tmpl[after != 0];
	return t->n_tmpl[after != 0];
}

const int32_t (*loom__bpe_merge_list(const loom_bpe_t *t))[2] { return (const int32_t(*)[2])t->merge_list; }

static int load_file(const char *dir, const char *name, char *path, size_t cap, char **text, size_t *len)
{
	snprintf(path, cap, "%s/%s", dir, name);
	return loom__read_file_max(path, BPE_FILE_MAX, text, len);
}

/* The directory format: vocab.json + merges.txt (or encoder.json + vocab.bpe) and pattern.txt. */
static int load_dir(loom_bpe_t **out, const char *dir)
{
	int rc = LOOM_OK;
	char path[4096], *text = NULL, err[256];
	size_t len = 0;
	json_t root;
	const char *vname = "vocab.json", *mname = "merges.txt";
	loom_bpe_t *t = NULL;
	memset(&root, 0, sizeof root);
	*out = NULL;
	snprintf(path, sizeof path, "%s/%s", dir, vname);
	if (!file_exists(path))
		vname = "encoder.json", mname = "vocab.bpe";
	snprintf(path, sizeof path, "%s/%s", dir, vname);
	if (!file_exists(path))
		return loom_seterr(LOOM_ENOENT, "%s: not a tokenizer directory (expected tokenizer.json, vocab.json + "
		                   "merges.txt, or encoder.json + vocab.bpe)", dir);
	if ((rc = loom__bpe_new(&t)) != LOOM_OK)
		return rc;
	if ((rc = load_file(dir, vname, path, sizeof path, &text, &len)) != LOOM_OK)
		goto done;
	if ((rc = loom__json_parse(text, len, &root, err, sizeof err)) != 0) {
		/* the parser reports allocation failures in its text too */
		rc = loom_seterr(rc == LOOM_ENOMEM ? LOOM_ENOMEM : LOOM_EFORMAT, "%s: bad JSON %s", path, err);
		goto done;
	}
	if ((rc = loom__bpe_load_vocab(t, &root, path)) != LOOM_OK)
		goto done;
	loom__json_free(&root);
	memset(&root, 0, sizeof root);
	free(text), text = NULL;
	if ((rc = load_file(dir, mname, path, sizeof path, &text, &len)) != LOOM_OK)
		goto done;
	if ((rc = load_merges(t, text, len, path)) != LOOM_OK)
		goto done;
	free(text), text = NULL;
	snprintf(path, sizeof path, "%s/pattern.txt", dir);
	if (file_exists(path)) {
		if ((rc = loom__read_file_max(path, BPE_PATTERN_MAX, &text, &len)) != LOOM_OK)
			goto done;
		while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == '\r'))
			text[--len] = 0;
		if (len == 0 || memchr(text, 0, len) || memchr(text, '\n', len)) {
			rc = loom_seterr(LOOM_EINVAL, "%s: expected one line holding the pre-tokenization regex", path);
			goto done;
		}
		t->pattern = text, text = NULL;
	} else if (!(t->pattern = loom__strdup(loom_bpe_pattern_gpt2))) {
		rc = loom_seterr(LOOM_ENOMEM, "tokenizer: out of memory");
		goto done;
	}
	if ((rc = loom__bpe_add_step(t, LOOM__BPE_STEP_SPLIT, t->pattern, 0, 0)) != LOOM_OK) {
		loom_seterr(rc, "%s/pattern.txt: %s", dir, loom_errmsg());
		goto done;
	}
	/* "<|endoftext|>" is GPT-2's one special token: matched in the text when the caller allows it */
	if (t->eot >= 0 && (rc = loom__bpe_add_token(t, t->eot, LOOM_BPE_EOT_TEXT, strlen(LOOM_BPE_EOT_TEXT), 1, 0)) != 0)
		goto done;
done:
	loom__json_free(&root);
	free(text);
	if (rc != LOOM_OK)
		loom_bpe_destroy(t);
	else
		*out = t;
	return rc;
}

int loom_bpe_load(loom_bpe_t **out, const char *path)
{
	struct stat sb;
	char json[4096];
	*out = NULL;
	init_tables();
	if (!path)
		return loom_seterr(LOOM_EINVAL, "tokenizer: no path given");
	if (stat(path, &sb) != 0)
		return loom_seterr(LOOM_ENOENT, "%s: not a tokenizer directory or tokenizer.json (no such file or directory)",
		                   path);
	if (S_ISREG(sb.st_mode))
		return loom__bpe_load_json(out, path);
	/* A directory holding tokenizer.json is read from it, as transformers' fast tokenizers do, even when
	 * vocab.json + merges.txt are there too (Hugging Face's GPT-2 directory has all three). */
	if (snprintf(json, sizeof json, "%s/tokenizer.json", path) < (int)sizeof json && file_exists(json))
		return loom__bpe_load_json(out, json);
	return load_dir(out, path);
}

int loom__bpe_model_token(const loom_bpe_t *t, int id)
{
	return id >= 0 && id < t->vocab_size && t->tok[id] && vocab_find(t, t->tok[id], t->tok_len[id]) == id;
}

int loom_bpe_vocab_size(const loom_bpe_t *t) { return t->vocab_size; }
int loom_bpe_eot(const loom_bpe_t *t) { return t->eot; }
int loom_bpe_doc_start(const loom_bpe_t *t) { return t->n_tmpl[0] > 0 ? t->tmpl[0][0] : t->eot; }
int loom_bpe_num_merges(const loom_bpe_t *t) { return t->n_merges; }
const char *loom_bpe_pattern(const loom_bpe_t *t) { return t->pattern; }

const unsigned char *loom_bpe_token(const loom_bpe_t *t, int id, size_t *len)
{
	if (id < 0 || id >= t->vocab_size || !t->tok[id]) {
		*len = 0;
		return NULL;
	}
	*len = t->tok_len[id];
	return t->tok[id];
}

/* ---- encoding ------------------------------------------------------------------------------- */

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
	if (need <= *cap)
		return 0;
	size_t nc = *cap ? *cap : 64;
	while (nc < need)
		nc *= 2;
	void *np = loom__realloc(*p, nc * elem);
	if (!np)
		return -1;
	*p = np, *cap = nc;
	return 0;
}

static int emit(loom_bpe_t *t, const int *ids, size_t n)
{
	if (n == 0)
		return LOOM_OK;
	if (grow((void **)&t->out, &t->out_cap, t->n_out + n, sizeof *t->out) != 0)
		return loom_seterr(LOOM_ENOMEM, "tokenizer: out of memory for %zu ids", t->n_out + n);
	memcpy(t->out + t->n_out, ids, n * sizeof *ids);
	t->n_out += n;
	return LOOM_OK;
}

static int scratch(loom_bpe_t *t, size_t n)
{
	size_t c1 = t->scratch_cap, c2 = t->scratch_cap, c3 = t->scratch_cap;
	if (n <= t->scratch_cap)
		return LOOM_OK;
	if (grow((void **)&t->sym, &c1, n, sizeof(int)) || grow((void **)&t->nxt, &c2, n, sizeof(int)) ||
	    grow((void **)&t->prv, &c3, n, sizeof(int)))
		return loom_seterr(LOOM_ENOMEM, "tokenizer: out of memory for a piece of %zu bytes", n);
	t->scratch_cap = LOOM_MIN(c1, LOOM_MIN(c2, c3));
	return LOOM_OK;
}

static int cand_less(cand_t a, cand_t b)
{
	return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static int heap_push(loom_bpe_t *t, size_t *n, cand_t c)
{
	if (grow((void **)&t->heap, &t->heap_cap, *n + 1, sizeof *t->heap) != 0)
		return loom_seterr(LOOM_ENOMEM, "tokenizer: out of memory");
	size_t i = (*n)++;
	while (i > 0 && cand_less(c, t->heap[(i - 1) / 2])) {
		t->heap[i] = t->heap[(i - 1) / 2];
		i = (i - 1) / 2;
	}
	t->heap[i] = c;
	return LOOM_OK;
}

static cand_t heap_pop(loom_bpe_t *t, size_t *n)
{
	cand_t top = t->heap[0], last = t->heap[--*n];
	size_t i = 0;
	for (;;) {
		size_t c = 2 * i + 1;
		if (c >= *n)
			break;
		if (c + 1 < *n && cand_less(t->heap[c + 1], t->heap[c]))
			c++;
		if (!cand_less(t->heap[c], last))
			break;
		t->heap[i] = t->heap[c];
		i = c;
	}
	if (*n > 0)
		t->heap[i] = last;
	return top;
}

/* Merge the piece p[0..n) (n >= 1) with the heap; the ids are left in t->sym[0..*m). */
static int bpe_fast(loom_bpe_t *t, const unsigned char *p, size_t n, size_t *m)
{
	int rc;
	size_t hn = 0;
	if ((rc = scratch(t, n)) != LOOM_OK)
		return rc;
	int *sym = t->sym, *nxt = t->nxt, *prv = t->prv;
	for (size_t i = 0; i < n; i++)
		sym[i] = t->byte_id[p[i]], nxt[i] = i + 1 < n ? (int)i + 1 : -1, prv[i] = (int)i - 1;
	for (size_t i = 0; i + 1 < n; i++) {
		int32_t r = merge_rank(t, sym[i], sym[i + 1]);
		if (r >= 0 && (rc = heap_push(t, &hn, (cand_t){r, (int32_t)i})) != LOOM_OK)
			return rc;
	}
	while (hn > 0) {
		cand_t c = heap_pop(t, &hn);
		int i = c.pos, j = nxt[i];
		if (sym[i] < 0 || j < 0)
			continue;
		const merge_slot_t *ms = merge_find(t, sym[i], sym[j]);
		if (!ms || ms->rank != c.rank) /* stale: a neighbour changed since it was pushed */
			continue;
		sym[i] = ms->result;
		sym[j] = -1; /* j leaves the list */
		nxt[i] = nxt[j];
		if (nxt[j] >= 0)
			prv[nxt[j]] = i;
		if (prv[i] >= 0) {
			int32_t r = merge_rank(t, sym[prv[i]], sym[i]);
			if (r >= 0 && (rc = heap_push(t, &hn, (cand_t){r, prv[i]})) != LOOM_OK)
				return rc;
		}
		if (nxt[i] >= 0) {
			int32_t r = merge_rank(t, sym[i], sym[nxt[i]]);
			if (r >= 0 && (rc = heap_push(t, &hn, (cand_t){r, i})) != LOOM_OK)
				return rc;
		}
	}
	size_t k = 0;
	for (int i = 0; i >= 0; i = nxt[i])
		sym[k++] = sym[i];
	*m = k;
	return LOOM_OK;
}

/* The reference algorithm (OpenAI's encoder.py bpe()): O(n^2) per piece. Same output contract. */
static int bpe_reference(loom_bpe_t *t, const unsigned char *p, size_t n, size_t *m)
{
	int rc;
	if ((rc = scratch(t, n)) != LOOM_OK)
		return rc;
	int *w = t->sym, *nw = t->nxt;
	size_t len = n;
	for (size_t i = 0; i < n; i++)
		w[i] = t->byte_id[p[i]];
	while (len > 1) {
		int32_t best = -1;
		int bl = 0, br = 0;
		for (size_t i = 0; i + 1 < len; i++) {
			int32_t r = merge_rank(t, w[i], w[i + 1]);
			if (r >= 0 && (best < 0 || r < best))
				best = r, bl = w[i], br = w[i + 1];
		}
		if (best < 0)
			break;
		int res = merge_find(t, bl, br)->result;
		size_t k = 0;
		for (size_t i = 0; i < len;) {
			if (i + 1 < len && w[i] == bl && w[i + 1] == br)
				nw[k++] = res, i += 2;
			else
				nw[k++] = w[i++];
		}
		memcpy(w, nw, k * sizeof *w);
		len = k;
	}
	*m = len;
	return LOOM_OK;
}

static cache_slot_t *cache_lookup(loom_bpe_t *t, const unsigned char *p, size_t n, uint64_t h)
{
	for (size_t i = h & (CACHE_SLOTS - 1);; i = (i + 1) & (CACHE_SLOTS - 1)) {
		cache_slot_t *s = &t->cache[i];
		if (s->n_ids == 0 || (s->hash == h && s->key_len == n && memcmp(t->pool + s->key_off, p, n) == 0))
			return s;
	}
}

/* Encode one pre-tokenized piece onto t->out. */
static int encode_piece(const unsigned char *p, size_t n, void *arg)
{
	loom_bpe_t *t = arg;
	size_t m = 0;
	int rc;
	cache_slot_t *slot = NULL;
	uint64_t h = 0;
	if (n > (size_t)INT32_MAX / 2) /* positions are ints */
		return loom_seterr(LOOM_EINVAL, "tokenizer: a piece of %zu bytes (one class of characters) is too long", n);
	if (t->ignore_merges) { /* Llama 3's rule: a piece that is a token whole is that token */
		int id = vocab_find(t, p, n);
		if (id >= 0)
			return emit(t, &id, 1);
	}
	if (n <= CACHE_MAX_PIECE) {
		if (!t->cache) {
			t->cache = loom__calloc(CACHE_SLOTS, sizeof *t->cache);
			t->pool = loom__malloc(CACHE_POOL_INTS * sizeof *t->pool);
			if (!t->cache || !t->pool) {
				free(t->cache), free(t->pool);
				t->cache = NULL, t->pool = NULL;
				return loom_seterr(LOOM_ENOMEM, "tokenizer: out of memory for the cache");
			}
		}
		h = loom__bpe_hash(p, n);
		slot = cache_lookup(t, p, n, h);
		if (slot->n_ids)
			return emit(t, t->pool + slot->ids_off, slot->n_ids);
	}
	if ((rc = (t->well_formed ? bpe_fast : bpe_reference)(t, p, n, &m)) != LOOM_OK)
		return rc;
	if (slot) {
		size_t need = (n + 3) / 4 + m;
		if (t->cache_used >= CACHE_SLOTS / 2 || t->pool_used + need > CACHE_POOL_INTS) {
			memset(t->cache, 0, CACHE_SLOTS * sizeof *t->cache); /* full: start over */
			t->cache_used = t->pool_used = 0;
			slot = cache_lookup(t, p, n, h);
		}
		slot->hash = h, slot->key_len = (uint32_t)n, slot->key_off = (uint32_t)t->pool_used;
		memcpy(t->pool + t->pool_used, p, n);
		t->pool_used += (n + 3) / 4;
		slot->ids_off = (uint32_t)t->pool_used, slot->n_ids = (uint32_t)m;
		memcpy(t->pool + t->pool_used, t->sym, m * sizeof *t->sym);
		t->pool_used += m;
		t->cache_used++;
	}
	return emit(t, t->sym, m);
}

typedef struct {
	loom_bpe_t *t;
	int step;
} step_arg_t;

static int run_step(loom_bpe_t *t, int k, const unsigned char *p, size_t n);

static int step_piece(const unsigned char *p, size_t n, void *arg)
{
	step_arg_t *a = arg;
	return run_step(a->t, a->step, p, n);
}

/* Pre-tokenization step k on one piece, then the steps after it, then BPE on each final piece. */
static int run_step(loom_bpe_t *t, int k, const unsigned char *p, size_t n)
{
	const step_t *s;
	unsigned char *buf = NULL;
	int rc;
	if (k == t->n_steps)
		return encode_piece(p, n, t);
	s = &t->steps[k];
	if (s->prefix_space && p[0] != ' ') { /* ByteLevel's add_prefix_space, per piece as Hugging Face's */
		if (!(buf = loom__malloc(n + 1)))
			return loom_seterr(LOOM_ENOMEM, "tokenizer: out of memory for a piece of %zu bytes", n + 1);
		buf[0] = ' ';
		memcpy(buf + 1, p, n);
		p = buf, n++;
	}
	if (s->sp) {
		step_arg_t a = {t, k + 1};
		rc = loom__bpe_split(s->sp, (const char *)p, n, step_piece, &a);
	} else
		rc = run_step(t, k + 1, p, n);
	free(buf);
	return rc;
}

/* Split p[0..n) on the added tokens of pass 0 (normalized false) then pass 1 (normalized true), as
 * Hugging Face's AddedVocabulary does: the leftmost match, the longest there; the text between goes
 * to the next pass, and after the last to pre-tokenization. */
static int split_added(loom_bpe_t *t, int pass, const unsigned char *p, size_t n)
{
	size_t start = 0;
	int rc;
	if (n == 0)
		return LOOM_OK;
	if (pass == 2)
		return run_step(t, 0, p, n);
	if (!(t->flags & LOOM_BPE_SPECIAL) && t->n_plain[pass] == 0) /* nothing this pass can match */
		return split_added(t, pass + 1, p, n);
	for (size_t i = 0; i < n; i++) {
		const added_t *hit = NULL;
		if (!t->first[pass][p[i]])
			continue;
		for (int k = 0; k < t->n_added && !hit; k++) {
			const added_t *a = &t->added[k];
			size_t len = t->tok_len[a->id];
			if (a->normalized == pass && (!a->special || (t->flags & LOOM_BPE_SPECIAL)) && len <= n - i &&
			    memcmp(p + i, t->tok[a->id], len) == 0)
				hit = a;
		}
		if (!hit)
			continue;
		if ((rc = split_added(t, pass + 1, p + start, i - start)) != LOOM_OK || (rc = emit(t, &hit->id, 1)) != LOOM_OK)
			return rc;
		i += t->tok_len[hit->id] - 1;
		start = i + 1;
	}
	return split_added(t, pass + 1, p + start, n - start);
}

int loom_bpe_encode(loom_bpe_t *t, const char *text, size_t len, int flags, int **ids, size_t *n)
{
	int rc = LOOM_OK;
	if (!t || (!text && len) || !ids || !n)
		return loom_seterr(LOOM_EINVAL, "tokenizer: encode needs a tokenizer, text and outputs");
	*ids = NULL, *n = 0;
	t->n_out = 0;
	t->flags = flags;
	if ((flags & LOOM_BPE_TEMPLATE) && (rc = emit(t, t->tmpl[0], (size_t)t->n_tmpl[0])) != LOOM_OK)
		goto done;
	if ((rc = split_added(t, 0, (const unsigned char *)text, len)) != LOOM_OK)
		goto done;
	if ((flags & LOOM_BPE_TEMPLATE) && (rc = emit(t, t->tmpl[1], (size_t)t->n_tmpl[1])) != LOOM_OK)
		goto done;
	if (t->n_out > 0) {
		if (!(*ids = loom__malloc(t->n_out * sizeof **ids))) {
			rc = loom_seterr(LOOM_ENOMEM, "tokenizer: out of memory for %zu ids", t->n_out);
			goto done;
		}
		memcpy(*ids, t->out, t->n_out * sizeof **ids);
		*n = t->n_out;
	}
done:
	t->n_out = 0;
	if (t->out_cap > (1u << 20)) { /* do not keep a huge buffer around after a big text */
		free(t->out);
		t->out = NULL, t->out_cap = 0;
	}
	return rc;
}

int loom_bpe_decode(const loom_bpe_t *t, const int *ids, size_t n, char **text, size_t *len)
{
	size_t total = 0;
	char *s;
	if (!t || (!ids && n) || !text || !len)
		return loom_seterr(LOOM_EINVAL, "tokenizer: decode needs a tokenizer, ids and outputs");
	*text = NULL, *len = 0;
	for (size_t i = 0; i < n; i++) {
		if (ids[i] < 0 || ids[i] >= t->vocab_size || !t->tok[ids[i]])
			return loom_seterr(LOOM_EINVAL, "tokenizer: id %d at position %zu is not in the vocabulary (size %d)",
			                   ids[i], i, t->vocab_size);
		total += t->tok_len[ids[i]];
	}
	if (!(s = loom__malloc(total + 1)))
		return loom_seterr(LOOM_ENOMEM, "tokenizer: out of memory for %zu bytes of text", total + 1);
	total = 0;
	for (size_t i = 0; i < n; i++) {
		memcpy(s + total, t->tok[ids[i]], t->tok_len[ids[i]]);
		total += t->tok_len[ids[i]];
	}
	s[total] = 0;
	*text = s, *len = total;
	return LOOM_OK;
}

int loom__bpe_piece_reference(loom_bpe_t *t, const unsigned char *p, size_t n, int **ids, size_t *m)
{
	int rc = bpe_reference(t, p, n, m);
	if (rc != LOOM_OK)
		return rc;
	if (!(*ids = loom__malloc((*m + 1) * sizeof **ids)))
		return loom_seterr(LOOM_ENOMEM, "tokenizer: out of memory");
	memcpy(*ids, t->sym, *m * sizeof **ids);
	return LOOM_OK;
}

int loom__bpe_well_formed(const loom_bpe_t *t) { return t->well_formed; }
