/* loader.c: the data loader: shards matched by a glob, concatenated, cut into windows of B*T+1 tokens.
 *
 * Window k (over the whole run) is in epoch e = k / W with W = (N-1)/(B*T); it reads the B*T+1 tokens
 * starting at token p*B*T where p = k % W, or p = perm_e(k % W) with shuffle. perm_e is a keyed
 * Feistel permutation of [0, 2^bits) (six rounds of a splitmix64-based round function), restricted to
 * [0, W) by cycle walking: a bijection computed in O(1) memory from (seed, e) alone, so any window can
 * be read directly without replaying history (data-parallel rank r asks for k = (i*accum + j)*world + r)
 * and the loader's whole position is the index of its next window. Windows may span shard boundaries.
 * The tail of each epoch (fewer than B*T tokens after the last full window) is never read.
 * A set `loom data prepare` wrote has an index beside it (LOOM_SHARD_INDEX): every shard it lists for
 * the set the glob names must be there with its size, so a half-written or half-deleted data set is
 * an error naming the missing file; shards without an index (llm.c's) load unchecked.
 * Shards are read in their own width (uint16 or uint32, straight from the mapping: nothing is widened
 * in memory), and all the shards of one loader have the same width: a glob matching both is refused,
 * since one tokenizer writes one width, so a mix is two data sets. Every token a window reads is
 * checked against the vocabulary (opts.vocab_size; without one, against the largest int) as it is
 * copied, so an id the model cannot embed is an error naming the shard and the token's offset. */
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/util.h"
#include "data/shard_index.h"
#include "loom/data.h"

struct loom_loader {
	char *pattern;
	loom_shard_t *shards;
	uint64_t *start; /* start[i]: index of shard i's first token in the concatenation */
	int n_shards;
	int token_bytes;  /* of every shard: 2 or 4 */
	uint32_t limit;   /* token ids must be below this: opts.vocab_size, else 2^31 (an int) */
	uint64_t n_tokens, windows; /* N and W */
	loom_loader_opts_t o;
	uint64_t next; /* next window index for loom_loader_next */
};

static uint64_t mix64(uint64_t x)
{
	x += 0x9E3779B97F4A7C15ull;
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
	x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
	return x ^ (x >> 31);
}

/* A permutation of [0, n), keyed: i -> perm(i). */
static uint64_t permute(uint64_t i, uint64_t n, uint64_t key)
{
	int bits = 2, half;
	uint64_t mask;
	if (n <= 1)
		return 0;
	while (bits < 64 && (1ull << bits) < n)
		bits++;
	if (bits & 1)
		bits++;
	half = bits / 2;
	mask = (1ull << half) - 1;
	do {
		uint64_t l = i >> half, r = i & mask;
		for (uint64_t round = 0; round < 6; round++) {
			uint64_t f = mix64(r ^ key ^ (round << 58)) & mask, nl = r;
			r = l ^ f;
			l = nl;
		}
		i = (l << half) | r;
	} while (i >= n);
	return i;
}

/* The set a shard name belongs to: its name up to the last '_' ("train" for train_000003.bin). */
static size_t set_len(const char *base)
{
	const char *u = strrchr(base, '_');
	return u ? (size_t)(u - base) : 0;
}

/* When the directory of `first` (a matched shard, or the pattern itself when nothing matched) holds
 * a LOOM_SHARD_INDEX, check the shard set the pattern names against it: every shard the index lists
 * for the set exists with its size (no training on part of a data set), and no matched file of the
 * set is unlisted. Without an index (shards made by llm.c's scripts) nothing is checked. */
static int check_index(const char *pattern, const char *first, const char *const *paths, size_t n)
{
	char dir[1100], ipath[1200], fpath[1400], name[300];
	const char *slash = strrchr(first, '/'), *pbase = strrchr(pattern, '/');
	struct stat sb;
	loom__shard_index_t idx;
	const loom__index_set_t *set;
	int rc = LOOM_OK;
	size_t sl;
	if (slash)
		snprintf(dir, sizeof dir, "%.*s", (int)(slash - first), first);
	else
		snprintf(dir, sizeof dir, ".");
	if (!n && strpbrk(dir, "*?[")) /* nothing matched and the directory part is itself a pattern */
		return LOOM_OK;
	snprintf(ipath, sizeof ipath, "%s/%s", dir, LOOM_SHARD_INDEX);
	if (stat(ipath, &sb) != 0)
		return LOOM_OK;
	if ((rc = loom__shard_index_load(ipath, &idx)) != LOOM_OK)
		return loom_seterr(rc == LOOM_ENOMEM ? rc : LOOM_EFORMAT, "loader '%s': %s", pattern, loom_errmsg());
	/* the set: from the pattern's file part when it names one ("val_*.bin"), else from the first match */
	pbase = pbase ? pbase + 1 : pattern;
	sl = set_len(pbase);
	if (sl == 0 || (strpbrk(pbase, "*?[") && strpbrk(pbase, "*?[") < pbase + sl)) {
		pbase = n ? (slash ? slash + 1 : first) : pbase;
		sl = set_len(pbase);
	}
	if (!sl || !(set = loom__shard_index_set(&idx, pbase, sl))) {
		if (n == 0)
			rc = loom_seterr(LOOM_ENOENT, "loader: no files match '%s' (the data set %s has no '%.*s' shards)",
			                 pattern, ipath, (int)sl, pbase);
		goto out;
	}
	if (n == 0 && set->shards == 0) {
		rc = loom_seterr(LOOM_ENOENT, "loader: no files match '%s': %s lists no %s shards (prepare the data with "
		                 "--val-fraction > 0 for validation data)", pattern, ipath, set->name);
		goto out;
	}
	for (int64_t i = 0; i < set->shards; i++) {
		const loom__index_file_t *f;
		snprintf(name, sizeof name, "%s_%06lld.bin", set->name, (long long)i);
		snprintf(fpath, sizeof fpath, "%s/%s", dir, name);
		if (!(f = loom__shard_index_file(&idx, name))) {
			rc = loom_seterr(LOOM_EFORMAT, "loader '%s': the shard index %s lacks %s (damaged index)", pattern, ipath,
			                 name);
			goto out;
		}
		if (stat(fpath, &sb) != 0) {
			rc = loom_seterr(LOOM_ENOENT, "loader '%s': %s is missing: %s lists %lld %s shard(s) (an incomplete "
			                 "data set: prepare it again)", pattern, fpath, ipath, (long long)set->shards, set->name);
			goto out;
		}
		if ((uint64_t)sb.st_size != f->bytes) {
			rc = loom_seterr(LOOM_EFORMAT, "loader '%s': %s has %lld bytes, %s says %llu (a damaged or partly "
			                 "written shard: prepare the data again)", pattern, fpath, (long long)sb.st_size, ipath,
			                 (unsigned long long)f->bytes);
			goto out;
		}
	}
	for (size_t i = 0; i < n; i++) { /* matched files of the set that the index does not know */
		const char *b = strrchr(paths[i], '/');
		b = b ? b + 1 : paths[i];
		if (set_len(b) == sl && !strncmp(b, set->name, sl) && !loom__shard_index_file(&idx, b)) {
			rc = loom_seterr(LOOM_EFORMAT, "loader '%s': %s is not part of the data set that %s describes (a "
			                 "leftover of an older set?)", pattern, paths[i], ipath);
			goto out;
		}
	}
out:
	loom__shard_index_free(&idx);
	return rc;
}

void loom_loader_destroy(loom_loader_t *ld)
{
	if (!ld)
		return;
	for (int i = 0; i < ld->n_shards; i++)
		loom_shard_close(&ld->shards[i]);
	free(ld->shards);
	free(ld->start);
	free(ld->pattern);
	free(ld);
}

int loom_loader_create(loom_loader_t **out, const char *pattern, const loom_loader_opts_t *opts)
{
	loom_loader_t *ld;
	glob_t g;
	int rc = LOOM_OK, grc;
	uint64_t bt;
	*out = NULL;
	if (opts->B <= 0 || opts->T <= 0)
		return loom_seterr(LOOM_EINVAL, "loader %s: B=%d and T=%d must be positive", pattern, opts->B, opts->T);
	if (opts->world > 0 && (opts->rank < 0 || opts->rank >= opts->world))
		return loom_seterr(LOOM_EINVAL, "loader %s: rank %d outside [0, world=%d)", pattern, opts->rank,
		                   opts->world);
	if (opts->vocab_size < 0)
		return loom_seterr(LOOM_EINVAL, "loader %s: vocabulary size %d is negative", pattern, opts->vocab_size);
	ld = loom__calloc(1, sizeof *ld);
	if (!ld)
		return loom_seterr(LOOM_ENOMEM, "loader %s: out of memory", pattern);
	ld->o = *opts;
	ld->limit = opts->vocab_size > 0 ? (uint32_t)opts->vocab_size : (uint32_t)INT32_MAX + 1u;
	if (ld->o.world <= 0)
		ld->o.world = 1, ld->o.rank = 0;
	ld->pattern = loom__strdup(pattern);
	grc = glob(pattern, GLOB_ERR, NULL, &g);
	if (grc == GLOB_NOMATCH || grc == GLOB_ABORTED || (grc == 0 && g.gl_pathc == 0)) {
		if (grc == 0 || grc == GLOB_ABORTED)
			globfree(&g);
		loom_loader_destroy(ld);
		/* an indexed set whose shards are all gone: name the first missing one */
		if ((rc = check_index(pattern, pattern, NULL, 0)) != LOOM_OK)
			return rc;
		/* GLOB_ABORTED: a directory of the pattern cannot be read, most often because it does not exist */
		return loom_seterr(LOOM_ENOENT, "loader: no files match '%s'%s", pattern,
		                   grc == GLOB_ABORTED ? " (a directory in it does not exist or cannot be read)" : "");
	}
	if (grc != 0) { /* GLOB_NOSPACE: the only other failure */
		loom_loader_destroy(ld);
		return loom_seterr(LOOM_ENOMEM, "loader: out of memory expanding '%s'", pattern);
	}
	ld->shards = loom__calloc(g.gl_pathc, sizeof *ld->shards);
	ld->start = loom__calloc(g.gl_pathc + 1, sizeof *ld->start);
	if (!ld->pattern || !ld->shards || !ld->start) {
		rc = loom_seterr(LOOM_ENOMEM, "loader %s: out of memory", pattern);
		goto out;
	}
	if ((rc = check_index(pattern, g.gl_pathv[0], (const char *const *)g.gl_pathv, g.gl_pathc)) != LOOM_OK)
		goto out;
	for (size_t i = 0; i < g.gl_pathc; i++) {
		struct stat sb;
		if (stat(g.gl_pathv[i], &sb) == 0 && !S_ISREG(sb.st_mode)) {
			rc = loom_seterr(LOOM_EINVAL, "loader: '%s' (matched by '%s') is %s, not a token shard file", g.gl_pathv[i],
			                 pattern, S_ISDIR(sb.st_mode) ? "a directory" : "not a regular file");
			goto out;
		}
		if ((rc = loom_shard_open(&ld->shards[i], g.gl_pathv[i])) != LOOM_OK)
			goto out;
		ld->n_shards++;
		if (i == 0)
			ld->token_bytes = ld->shards[0].token_bytes;
		if (ld->shards[i].token_bytes != ld->token_bytes) {
			rc = loom_seterr(LOOM_EFORMAT, "loader '%s': %s holds uint%d tokens but %s holds uint%d: one data set "
			                 "is written in one width by one tokenizer, so these are two data sets (give a glob "
			                 "that matches one)", pattern, g.gl_pathv[i], 8 * ld->shards[i].token_bytes,
			                 g.gl_pathv[0], 8 * ld->token_bytes);
			goto out;
		}
		ld->start[i] = ld->n_tokens;
		ld->n_tokens += ld->shards[i].n_tokens;
	}
	ld->start[ld->n_shards] = ld->n_tokens;
	bt = (uint64_t)opts->B * (uint64_t)opts->T;
	ld->windows = ld->n_tokens > 0 ? (ld->n_tokens - 1) / bt : 0;
	if (ld->windows == 0) {
		rc = loom_seterr(LOOM_EINVAL, "loader %s: %llu tokens in %d shard(s), fewer than one window of B*T+1 = %llu "
		                 "tokens (B=%d, T=%d)", pattern, (unsigned long long)ld->n_tokens, ld->n_shards,
		                 (unsigned long long)bt + 1, opts->B, opts->T);
		goto out;
	}
	ld->next = (uint64_t)ld->o.rank;
out:
	globfree(&g);
	if (rc != LOOM_OK) {
		loom_loader_destroy(ld);
		return rc;
	}
	*out = ld;
	return LOOM_OK;
}

uint64_t loom_loader_num_tokens(const loom_loader_t *ld)
{
	return ld->n_tokens;
}

uint64_t loom_loader_windows_per_epoch(const loom_loader_t *ld)
{
	return ld->windows;
}

int loom_loader_num_shards(const loom_loader_t *ld)
{
	return ld->n_shards;
}

uint32_t loom_loader_max_token(const loom_loader_t *ld)
{
	uint32_t m = 0;
	for (int i = 0; i < ld->n_shards; i++) {
		uint32_t sm = loom_shard_max_token(&ld->shards[i]);
		m = sm > m ? sm : m;
	}
	return m;
}

int loom_loader_token_bytes(const loom_loader_t *ld)
{
	return ld->token_bytes;
}

uint64_t loom_loader_window_start(const loom_loader_t *ld, uint64_t k)
{
	uint64_t epoch = k / ld->windows, p = k % ld->windows;
	if (!ld->o.shuffle)
		return p;
	return permute(p, ld->windows, mix64(ld->o.seed ^ mix64(epoch ^ 0x5DEECE66Dull)));
}

/* The error for token `at` of shard sh, outside the loader's limit, read by window k. */
static int bad_token(const loom_loader_t *ld, const loom_shard_t *sh, uint64_t at, uint64_t k)
{
	uint32_t id = loom_shard_token(sh, at);
	unsigned long long byte = (unsigned long long)(LOOM_SHARD_HEADER_INTS * 4 + at * (uint64_t)sh->token_bytes);
	if (ld->o.vocab_size > 0)
		return loom_seterr(LOOM_EINVAL, "loader '%s': %s: token id %u at token %llu (byte %llu; window %llu) is "
		                   "outside the model's vocabulary of %d: the data was tokenized for another model",
		                   ld->pattern, sh->path, id, (unsigned long long)at, byte, (unsigned long long)k,
		                   ld->o.vocab_size);
	return loom_seterr(LOOM_EFORMAT, "loader '%s': %s: token id %u at token %llu (byte %llu; window %llu) is above "
	                   "%d, the largest id loom reads (a damaged shard?)", ld->pattern, sh->path, id,
	                   (unsigned long long)at, byte, (unsigned long long)k, INT32_MAX);
}

/* Copy tokens [off, off + take) of shard sh to positions got, got+1, ... of a window of bt + 1 (inputs
 * take the first bt, targets the last bt), in the shard's width. Returns take, or the index in the
 * range of the first id >= limit (where it stops). */
static uint64_t copy_tokens(const loom_shard_t *sh, uint64_t off, uint64_t take, uint64_t got, uint64_t bt,
                            uint32_t limit, int *inputs, int *targets)
{
	const uint16_t *t16 = sh->token_bytes == 2 ? (const uint16_t *)sh->tokens + off : NULL;
	const uint32_t *t32 = sh->token_bytes == 4 ? (const uint32_t *)sh->tokens + off : NULL;
	for (uint64_t j = 0; j < take; j++) {
		uint32_t tok = t16 ? t16[j] : t32[j];
		uint64_t t = got + j;
		if (tok >= limit)
			return j;
		if (t < bt)
			inputs[t] = (int)tok;
		if (t > 0)
			targets[t - 1] = (int)tok;
	}
	return take;
}

int loom_loader_window(const loom_loader_t *ld, uint64_t k, int *inputs, int *targets)
{
	uint64_t bt = (uint64_t)ld->o.B * (uint64_t)ld->o.T;
	uint64_t s = loom_loader_window_start(ld, k) * bt, need = bt + 1, got = 0;
	int lo = 0, hi = ld->n_shards - 1, i;
	/* Largest shard i with start[i] <= s (zero-length shards are skipped below). */
	while (lo < hi) {
		int mid = (lo + hi + 1) / 2;
		if (ld->start[mid] <= s)
			lo = mid;
		else
			hi = mid - 1;
	}
	i = lo;
	while (got < need) {
		const loom_shard_t *sh;
		uint64_t off, take, bad;
		if (i >= ld->n_shards) /* cannot happen: s + bt + 1 <= N by the choice of W */
			return loom_seterr(LOOM_ESTATE, "loader %s: window %llu runs past the end of the data", ld->pattern,
			                   (unsigned long long)k);
		sh = &ld->shards[i];
		off = s + got - ld->start[i];
		if (off >= sh->n_tokens) {
			i++;
			continue;
		}
		take = LOOM_MIN(sh->n_tokens - off, need - got);
		if ((bad = copy_tokens(sh, off, take, got, bt, ld->limit, inputs, targets)) < take)
			return bad_token(ld, sh, off + bad, k);
		got += take;
	}
	return LOOM_OK;
}

int loom_loader_next(loom_loader_t *ld, int *inputs, int *targets)
{
	int rc = loom_loader_window(ld, ld->next, inputs, targets);
	if (rc == LOOM_OK)
		ld->next += (uint64_t)ld->o.world;
	return rc;
}

void loom_loader_seek(loom_loader_t *ld, uint64_t k)
{
	ld->next = k;
}

void loom_loader_get_state(const loom_loader_t *ld, loom_loader_state_t *st)
{
	memset(st, 0, sizeof *st);
	st->next_window = ld->next;
	st->epoch = ld->next / ld->windows;
	st->seed = ld->o.seed;
	st->n_tokens = ld->n_tokens;
	st->B = ld->o.B, st->T = ld->o.T, st->shuffle = ld->o.shuffle;
	st->rank = ld->o.rank, st->world = ld->o.world;
}

#define CHECK_FIELD(name, saved, cur)                                                                       \
	do {                                                                                                    \
		if ((unsigned long long)(saved) != (unsigned long long)(cur))                                       \
			return loom_seterr(LOOM_EMISMATCH, "loader %s: saved state has %s=%llu but this loader has %llu", \
			                   ld->pattern, name, (unsigned long long)(saved), (unsigned long long)(cur));   \
	} while (0)

int loom_loader_set_state(loom_loader_t *ld, const loom_loader_state_t *st)
{
	CHECK_FIELD("n_tokens", st->n_tokens, ld->n_tokens);
	CHECK_FIELD("B", st->B, ld->o.B);
	CHECK_FIELD("T", st->T, ld->o.T);
	CHECK_FIELD("shuffle", st->shuffle, ld->o.shuffle);
	CHECK_FIELD("seed", st->shuffle ? st->seed : 0, ld->o.shuffle ? ld->o.seed : 0);
	CHECK_FIELD("world", st->world, ld->o.world);
	CHECK_FIELD("rank", st->rank, ld->o.rank);
	CHECK_FIELD("epoch (of next_window)", st->epoch, st->next_window / ld->windows);
	ld->next = st->next_window;
	return LOOM_OK;
}
