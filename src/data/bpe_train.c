/* bpe_train.c: training a byte-level BPE on a corpus (nanochat's recipe) and writing it in
 * Hugging Face's files (vocab.json, merges.txt).
 *
 * Shape. The corpus is split by the pre-tokenization regex and only the distinct pieces ("words")
 * and their frequencies are kept, so the merge loop works on a table far smaller than the text.
 * Each distinct pair of adjacent symbols has an entry holding its weighted count and the list of
 * words it occurs in; a max-heap orders pairs by (count desc, left id asc, right id asc), with stale
 * entries corrected when they surface (counts of old pairs only go down; a merge's new pairs are
 * pushed once, with their count after the merge). A merge visits only the words in its pair's list
 * and updates the counts of the neighbouring pairs from the positions it rewrites:
 *     ... p [l r] n ...  ->  ... p N n ...:   (l,r) -1, (p,l) -1, (p,N) +1, (r,n) -1, (N,n) +1
 * where p is read from the already rewritten word, which makes runs such as "l r l r" come out right.
 * Invariant after each merge: every pair's count equals the sum over words of frequency x
 * occurrences (tests check the merges against a brute-force recount). The result depends only on the
 * bytes of the corpus and the options: the order of words never decides anything. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/json.h"
#include "core/fileio.h"
#include "core/util.h"
#include "data/bpe_internal.h"
#include "loom/tokenizer.h"

/* ---- distinct pieces and their counts -------------------------------------------------------- */

typedef struct {
	uint64_t hash, count;
	size_t off;  /* bytes at arena + off */
	uint32_t len;
	uint32_t used;
} piece_t;

typedef struct {
	piece_t *slots;
	size_t cap, n;
	unsigned char *arena;
	size_t arena_len, arena_cap;
	uint64_t chunks;
} pieces_t;

static int pieces_grow(pieces_t *ps)
{
	size_t nc = ps->cap ? 2 * ps->cap : 1u << 16;
	piece_t *ns = loom__calloc(nc, sizeof *ns);
	if (!ns)
		return loom_seterr(LOOM_ENOMEM, "tokenizer train: out of memory for %zu distinct pieces", ps->n);
	for (size_t i = 0; i < ps->cap; i++) {
		if (!ps->slots[i].used)
			continue;
		size_t j = ps->slots[i].hash & (nc - 1);
		while (ns[j].used)
			j = (j + 1) & (nc - 1);
		ns[j] = ps->slots[i];
	}
	free(ps->slots);
	ps->slots = ns, ps->cap = nc;
	return LOOM_OK;
}

static int count_piece(const unsigned char *p, size_t n, void *arg)
{
	pieces_t *ps = arg;
	uint64_t h;
	size_t i;
	ps->chunks++;
	if (n < 2) /* a single byte has no pair: it cannot take part in any merge */
		return 0;
	if (n > INT32_MAX)
		n = INT32_MAX; /* a 2 GB piece of one class: only its first 2 GB count */
	if (2 * (ps->n + 1) > ps->cap && pieces_grow(ps) != LOOM_OK)
		return LOOM_ENOMEM;
	h = loom__bpe_hash(p, n);
	for (i = h & (ps->cap - 1); ps->slots[i].used; i = (i + 1) & (ps->cap - 1)) {
		piece_t *s = &ps->slots[i];
		if (s->hash == h && s->len == n && memcmp(ps->arena + s->off, p, n) == 0) {
			s->count++;
			return 0;
		}
	}
	if (ps->arena_len + n > ps->arena_cap) {
		size_t nc = ps->arena_cap ? ps->arena_cap : 1u << 20;
		while (nc < ps->arena_len + n)
			nc *= 2;
		unsigned char *na = loom__realloc(ps->arena, nc);
		if (!na)
			return loom_seterr(LOOM_ENOMEM, "tokenizer train: out of memory for %zu bytes of pieces", nc);
		ps->arena = na, ps->arena_cap = nc;
	}
	memcpy(ps->arena + ps->arena_len, p, n);
	ps->slots[i] = (piece_t){h, 1, ps->arena_len, (uint32_t)n, 1};
	ps->arena_len += n;
	ps->n++;
	return 0;
}

/* ---- pairs ---------------------------------------------------------------------------------- */

typedef struct {
	uint64_t key;   /* (left + 1) << 32 | right */
	int64_t count;  /* weighted occurrences */
	int32_t *words; /* words holding the pair (possibly no longer: checked when used) */
	int32_t n_words, cap_words;
	int32_t last;   /* last word appended, to keep the list free of repeats */
} pair_t;

typedef struct {
	int64_t count;
	uint64_t key;
} hent_t;

typedef struct {
	/* words */
	int32_t *sym;     /* symbols of all words, word w at sym[w_off[w]], w_len[w] of them */
	size_t *w_off;
	int32_t *w_len;
	uint64_t *w_freq;
	int32_t n_words;
	/* pairs */
	pair_t *pairs;
	size_t n_pairs, pairs_cap;
	uint32_t *index;  /* hash of key -> pair index + 1 */
	size_t index_cap;
	hent_t *heap;
	size_t heap_n, heap_cap;
	int32_t *fresh;   /* pairs created by the current merge */
	size_t n_fresh, fresh_cap;
} trainer_t;

static uint64_t key_of(int32_t l, int32_t r)
{
	return ((uint64_t)(uint32_t)(l + 1) << 32) | (uint32_t)r;
}

static size_t mix(uint64_t x)
{
	x ^= x >> 31;
	x *= 0x9e3779b97f4a7c15ull;
	x ^= x >> 29;
	return (size_t)x;
}

static int index_rebuild(trainer_t *tr, size_t cap)
{
	uint32_t *ni = loom__calloc(cap, sizeof *ni);
	if (!ni)
		return loom_seterr(LOOM_ENOMEM, "tokenizer train: out of memory for %zu pairs", tr->n_pairs);
	for (size_t p = 0; p < tr->n_pairs; p++) {
		size_t i = mix(tr->pairs[p].key) & (cap - 1);
		while (ni[i])
			i = (i + 1) & (cap - 1);
		ni[i] = (uint32_t)p + 1;
	}
	free(tr->index);
	tr->index = ni, tr->index_cap = cap;
	return LOOM_OK;
}

/* Index of pair (l, r), created with count 0 when missing; -1 on allocation failure. */
static long pair_get(trainer_t *tr, int32_t l, int32_t r, int create)
{
	uint64_t k = key_of(l, r);
	size_t i;
	for (i = mix(k) & (tr->index_cap - 1); tr->index[i]; i = (i + 1) & (tr->index_cap - 1))
		if (tr->pairs[tr->index[i] - 1].key == k)
			return (long)tr->index[i] - 1;
	if (!create)
		return -1;
	if (tr->n_pairs == tr->pairs_cap) {
		size_t nc = tr->pairs_cap ? 2 * tr->pairs_cap : 1u << 16;
		pair_t *np = loom__realloc(tr->pairs, nc * sizeof *np);
		if (!np)
			return -1;
		tr->pairs = np, tr->pairs_cap = nc;
	}
	tr->pairs[tr->n_pairs] = (pair_t){k, 0, NULL, 0, 0, -1};
	tr->index[i] = (uint32_t)tr->n_pairs + 1;
	tr->n_pairs++;
	if (2 * tr->n_pairs > tr->index_cap && index_rebuild(tr, 2 * tr->index_cap) != LOOM_OK)
		return -1;
	return (long)tr->n_pairs - 1;
}

static int add_word(pair_t *p, int32_t w)
{
	if (p->last == w)
		return 0;
	if (p->n_words == p->cap_words) {
		int32_t nc = p->cap_words ? 2 * p->cap_words : 4;
		int32_t *nw = loom__realloc(p->words, (size_t)nc * sizeof *nw);
		if (!nw)
			return -1;
		p->words = nw, p->cap_words = nc;
	}
	p->words[p->n_words++] = w;
	p->last = w;
	return 0;
}

static int hent_before(hent_t a, hent_t b)
{
	return a.count > b.count || (a.count == b.count && a.key < b.key);
}

static int heap_push(trainer_t *tr, hent_t e)
{
	if (tr->heap_n == tr->heap_cap) {
		size_t nc = tr->heap_cap ? 2 * tr->heap_cap : 1u << 16;
		hent_t *nh = loom__realloc(tr->heap, nc * sizeof *nh);
		if (!nh)
			return loom_seterr(LOOM_ENOMEM, "tokenizer train: out of memory for the pair heap");
		tr->heap = nh, tr->heap_cap = nc;
	}
	size_t i = tr->heap_n++;
	while (i > 0 && hent_before(e, tr->heap[(i - 1) / 2])) {
		tr->heap[i] = tr->heap[(i - 1) / 2];
		i = (i - 1) / 2;
	}
	tr->heap[i] = e;
	return LOOM_OK;
}

static hent_t heap_pop(trainer_t *tr)
{
	hent_t top = tr->heap[0], last = tr->heap[--tr->heap_n];
	size_t i = 0, n = tr->heap_n;
	for (;;) {
		size_t c = 2 * i + 1;
		if (c >= n)
			break;
		if (c + 1 < n && hent_before(tr->heap[c + 1], tr->heap[c]))
			c++;
		if (!hent_before(tr->heap[c], last))
			break;
		tr->heap[i] = tr->heap[c];
		i = c;
	}
	if (n > 0)
		tr->heap[i] = last;
	return top;
}

/* count of (l, r) += d; with d > 0 the word joins the pair's list and a new pair is remembered. */
static int bump(trainer_t *tr, int32_t l, int32_t r, int64_t d, int32_t w, int32_t new_id)
{
	long p = pair_get(tr, l, r, d > 0);
	if (p < 0)
		return d > 0 ? loom_seterr(LOOM_ENOMEM, "tokenizer train: out of memory for pairs") : LOOM_OK;
	tr->pairs[p].count += d;
	if (d > 0) {
		if (tr->pairs[p].last == -1 && (l == new_id || r == new_id)) {
			if (tr->n_fresh == tr->fresh_cap) {
				size_t nc = tr->fresh_cap ? 2 * tr->fresh_cap : 1024;
				int32_t *nf = loom__realloc(tr->fresh, nc * sizeof *nf);
				if (!nf)
					return loom_seterr(LOOM_ENOMEM, "tokenizer train: out of memory");
				tr->fresh = nf, tr->fresh_cap = nc;
			}
			tr->fresh[tr->n_fresh++] = (int32_t)p;
		}
		if (add_word(&tr->pairs[p], w) != 0)
			return loom_seterr(LOOM_ENOMEM, "tokenizer train: out of memory for pair positions");
	}
	return LOOM_OK;
}

/* Rewrite every word holding (l, r) with new_id and update the neighbouring counts. */
static int apply_merge(trainer_t *tr, long pi, int32_t l, int32_t r, int32_t new_id)
{
	int rc = LOOM_OK;
	int32_t *words = tr->pairs[pi].words, n_words = tr->pairs[pi].n_words;
	tr->pairs[pi].words = NULL, tr->pairs[pi].n_words = tr->pairs[pi].cap_words = 0;
	tr->n_fresh = 0;
	for (int32_t k = 0; k < n_words; k++) {
		int32_t w = words[k], *s = tr->sym + tr->w_off[words[k]], n = tr->w_len[w], o = 0;
		int64_t f = (int64_t)tr->w_freq[w];
		for (int32_t i = 0; i < n;) {
			if (i + 1 < n && s[i] == l && s[i + 1] == r) {
				if ((rc = bump(tr, l, r, -f, w, new_id)) != LOOM_OK)
					goto done;
				if (o > 0 && ((rc = bump(tr, s[o - 1], l, -f, w, new_id)) != LOOM_OK ||
				              (rc = bump(tr, s[o - 1], new_id, f, w, new_id)) != LOOM_OK))
					goto done;
				if (i + 2 < n && ((rc = bump(tr, r, s[i + 2], -f, w, new_id)) != LOOM_OK ||
				                  (rc = bump(tr, new_id, s[i + 2], f, w, new_id)) != LOOM_OK))
					goto done;
				s[o++] = new_id;
				i += 2;
			} else
				s[o++] = s[i++];
		}
		tr->w_len[w] = o;
	}
	for (size_t i = 0; i < tr->n_fresh; i++) {
		pair_t *p = &tr->pairs[tr->fresh[i]];
		if (p->count > 0 && (rc = heap_push(tr, (hent_t){p->count, p->key})) != LOOM_OK)
			goto done;
	}
done:
	free(words);
	return rc;
}

/* ---- output --------------------------------------------------------------------------------- */

static int write_mapped_json(FILE *f, const unsigned char *p, size_t n, char *buf)
{
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		int cp = loom__bpe_byte_cp(p[i]);
		if (cp < 0x80)
			buf[k++] = (char)cp;
		else
			buf[k++] = (char)(0xC0 | (cp >> 6)), buf[k++] = (char)(0x80 | (cp & 0x3F));
	}
	loom__json_write_string(f, buf, k);
	return 0;
}

static int write_outputs(const char *dir, unsigned char **tok, const size_t *tok_len, int n_tok,
                         const int32_t (*merges)[2], int n_merges, const char *pattern)
{
	int rc = LOOM_OK;
	char path[4096], *buf = NULL;
	size_t maxlen = strlen(LOOM_BPE_EOT_TEXT);
	atomic_file_t af;
	memset(&af, 0, sizeof af);
	for (int i = 0; i < n_tok; i++)
		maxlen = LOOM_MAX(maxlen, tok_len[i]);
	if (!(buf = loom__malloc(2 * maxlen + 1)))
		return loom_seterr(LOOM_ENOMEM, "tokenizer train: out of memory");
	if ((rc = loom__mkdir_p(dir)) != LOOM_OK)
		goto done;
	snprintf(path, sizeof path, "%s/vocab.json", dir);
	if ((rc = loom__atomic_open(&af, path)) != LOOM_OK)
		goto done;
	fputc('{', af.f);
	for (int i = 0; i < n_tok; i++) {
		write_mapped_json(af.f, tok[i], tok_len[i], buf);
		fprintf(af.f, ": %d, ", i);
	}
	loom__json_write_string(af.f, LOOM_BPE_EOT_TEXT, strlen(LOOM_BPE_EOT_TEXT));
	fprintf(af.f, ": %d}\n", n_tok);
	if ((rc = loom__atomic_commit(&af)) != LOOM_OK)
		goto done;
	snprintf(path, sizeof path, "%s/merges.txt", dir);
	if ((rc = loom__atomic_open(&af, path)) != LOOM_OK)
		goto done;
	fputs("#version: 0.2\n", af.f);
	for (int m = 0; m < n_merges; m++) {
		loom__bpe_write_mapped(af.f, tok[merges[m][0]], tok_len[merges[m][0]]);
		fputc(' ', af.f);
		loom__bpe_write_mapped(af.f, tok[merges[m][1]], tok_len[merges[m][1]]);
		fputc('\n', af.f);
	}
	if ((rc = loom__atomic_commit(&af)) != LOOM_OK)
		goto done;
	snprintf(path, sizeof path, "%s/pattern.txt", dir);
	if (strcmp(pattern, loom_bpe_pattern_gpt2) == 0) {
		unlink(path); /* GPT-2's pattern is the default: no file, and no stale one */
	} else {
		if ((rc = loom__atomic_open(&af, path)) != LOOM_OK)
			goto done;
		fprintf(af.f, "%s\n", pattern);
		rc = loom__atomic_commit(&af);
	}
done:
	if (rc != LOOM_OK)
		loom__atomic_abort(&af);
	free(buf);
	return rc;
}

/* ---- training ------------------------------------------------------------------------------- */

int loom_bpe_train(const char *const *files, int n_files, const char *out_dir, const loom_bpe_train_opts_t *opts,
                   loom_bpe_train_summary_t *summary)
{
	int rc = LOOM_OK, n_tok = 256, want;
	double t0 = loom_now(), t1;
	const char *pattern = opts && opts->pattern ? opts->pattern : loom_bpe_pattern_gpt2;
	loom__bpe_splitter_t *sp = NULL;
	pieces_t ps;
	trainer_t tr;
	unsigned char **tok = NULL;
	size_t *tok_len = NULL, total_sym = 0;
	int32_t (*merges)[2] = NULL;
	loom_bpe_train_summary_t sum;
	memset(&ps, 0, sizeof ps);
	memset(&tr, 0, sizeof tr);
	memset(&sum, 0, sizeof sum);
	if (!opts || opts->vocab_size < 257 || opts->vocab_size > (1 << 24) || !out_dir || n_files < 1 || !files)
		return loom_seterr(LOOM_EINVAL, "tokenizer train: needs input files, an output directory and a vocab size "
		                   "in [257, %d] (got %d)", 1 << 24, opts ? opts->vocab_size : 0);
	want = opts->vocab_size - 257;
	if ((rc = loom__bpe_splitter_create(&sp, pattern)) != LOOM_OK || (rc = pieces_grow(&ps)) != LOOM_OK)
		goto done;
	for (int i = 0; i < n_files; i++) {
		char *text = NULL;
		size_t len = 0;
		if ((rc = loom__read_file(files[i], &text, &len)) != LOOM_OK)
			goto done;
		rc = loom__bpe_split(sp, text, len, count_piece, &ps);
		free(text);
		if (rc != 0) {
			rc = rc < 0 ? rc : LOOM_ENOMEM;
			goto done;
		}
		sum.bytes += len;
	}
	sum.chunks = ps.chunks;
	sum.unique_chunks = ps.n;
	t1 = loom_now();
	sum.split_s = t1 - t0;
	if (opts->verbose)
		fprintf(stderr, "tokenizer train: %.1f MB in %.2f s (%.1f MB/s): %llu pieces, %zu distinct with a pair\n",
		        (double)sum.bytes / 1e6, sum.split_s, (double)sum.bytes / 1e6 / (sum.split_s > 0 ? sum.split_s : 1e-9),
		        (unsigned long long)sum.chunks, ps.n);

	/* Words, and the pairs they hold. */
	tr.n_words = (int32_t)ps.n;
	tr.w_off = loom__malloc((ps.n + 1) * sizeof *tr.w_off);
	tr.w_len = loom__malloc((ps.n + 1) * sizeof *tr.w_len);
	tr.w_freq = loom__malloc((ps.n + 1) * sizeof *tr.w_freq);
	tr.sym = loom__malloc((ps.arena_len + 1) * sizeof *tr.sym);
	tok = loom__calloc((size_t)opts->vocab_size, sizeof *tok);
	tok_len = loom__calloc((size_t)opts->vocab_size, sizeof *tok_len);
	merges = loom__malloc(((size_t)want + 1) * sizeof *merges);
	if (!tr.w_off || !tr.w_len || !tr.w_freq || !tr.sym || !tok || !tok_len || !merges ||
	    (rc = index_rebuild(&tr, 1u << 17)) != LOOM_OK) {
		rc = loom_seterr(LOOM_ENOMEM, "tokenizer train: out of memory for %zu words", ps.n);
		goto done;
	}
	for (int b = 0; b < 256; b++) {
		if (!(tok[b] = loom__malloc(1))) {
			rc = loom_seterr(LOOM_ENOMEM, "tokenizer train: out of memory");
			goto done;
		}
		tok[b][0] = (unsigned char)b, tok_len[b] = 1;
	}
	{
		int32_t w = 0;
		for (size_t i = 0; i < ps.cap; i++) {
			piece_t *p = &ps.slots[i];
			if (!p->used)
				continue;
			tr.w_off[w] = total_sym, tr.w_len[w] = (int32_t)p->len, tr.w_freq[w] = p->count;
			for (uint32_t j = 0; j < p->len; j++)
				tr.sym[total_sym + j] = ps.arena[p->off + j];
			for (uint32_t j = 0; j + 1 < p->len; j++)
				if ((rc = bump(&tr, tr.sym[total_sym + j], tr.sym[total_sym + j + 1], (int64_t)p->count, w, -1)) != LOOM_OK)
					goto done;
			total_sym += p->len;
			w++;
		}
	}
	free(ps.slots), free(ps.arena);
	memset(&ps, 0, sizeof ps);
	for (size_t p = 0; p < tr.n_pairs; p++)
		if (tr.pairs[p].count > 0 && (rc = heap_push(&tr, (hent_t){tr.pairs[p].count, tr.pairs[p].key})) != LOOM_OK)
			goto done;

	/* Merges. */
	while (sum.merges < want && tr.heap_n > 0) {
		hent_t top = heap_pop(&tr);
		int32_t l = (int32_t)(top.key >> 32) - 1, r = (int32_t)(uint32_t)top.key;
		long pi = pair_get(&tr, l, r, 0);
		if (pi < 0 || tr.pairs[pi].count <= 0)
			continue;
		if (tr.pairs[pi].count != top.count) { /* stale: counts only fall, so push the current one back */
			if ((rc = heap_push(&tr, (hent_t){tr.pairs[pi].count, top.key})) != LOOM_OK)
				goto done;
			continue;
		}
		int32_t id = n_tok;
		if (!(tok[id] = loom__malloc(tok_len[l] + tok_len[r]))) {
			rc = loom_seterr(LOOM_ENOMEM, "tokenizer train: out of memory");
			goto done;
		}
		memcpy(tok[id], tok[l], tok_len[l]), memcpy(tok[id] + tok_len[l], tok[r], tok_len[r]);
		tok_len[id] = tok_len[l] + tok_len[r];
		merges[sum.merges][0] = l, merges[sum.merges][1] = r;
		n_tok++, sum.merges++;
		if ((rc = apply_merge(&tr, pi, l, r, id)) != LOOM_OK)
			goto done;
		tr.pairs[pi].count = 0;
		if (opts->verbose && sum.merges % 1000 == 0)
			fprintf(stderr, "tokenizer train: %d/%d merges (last: count %lld)\n", sum.merges, want,
			        (long long)top.count);
	}
	sum.merge_s = loom_now() - t1;
	if (opts->json) {
		/* tokenizer.json: written through the directory format, so both come from one writer and the file is
		 * what loom_bpe_save_json makes of the loaded tokenizer (the same ids, which tests check) */
		char tmp[4096], json[4096];
		loom_bpe_t *t = NULL;
		if (snprintf(tmp, sizeof tmp, "%s/.train-%ld", out_dir, (long)getpid()) >= (int)sizeof tmp ||
		    snprintf(json, sizeof json, "%s/tokenizer.json", out_dir) >= (int)sizeof json) {
			rc = loom_seterr(LOOM_EINVAL, "tokenizer train: output path %s too long", out_dir);
			goto done;
		}
		if ((rc = write_outputs(tmp, tok, tok_len, n_tok, (const int32_t(*)[2])merges, sum.merges, pattern)) ==
		    LOOM_OK && (rc = loom_bpe_load(&t, tmp)) == LOOM_OK)
			rc = loom_bpe_save_json(t, json);
		loom_bpe_destroy(t);
		if (loom__rm_rf(tmp) != LOOM_OK && rc == LOOM_OK)
			rc = loom_seterr(LOOM_ESYS, "tokenizer train: cannot remove %s", tmp);
		if (rc != LOOM_OK)
			goto done;
	} else if ((rc = write_outputs(out_dir, tok, tok_len, n_tok, (const int32_t(*)[2])merges, sum.merges, pattern)) !=
	           LOOM_OK)
		goto done;
	sum.total_s = loom_now() - t0;
	if (summary)
		*summary = sum;
done:
	loom__bpe_splitter_destroy(sp);
	free(ps.slots), free(ps.arena);
	for (size_t p = 0; p < tr.n_pairs; p++)
		free(tr.pairs[p].words);
	free(tr.pairs), free(tr.index), free(tr.heap), free(tr.fresh);
	free(tr.sym), free(tr.w_off), free(tr.w_len), free(tr.w_freq);
	if (tok)
		for (int i = 0; i < n_tok; i++)
			free(tok[i]);
	free(tok), free(tok_len), free(merges);
	return rc;
}
