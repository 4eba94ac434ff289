/* prepare.c: `loom data prepare`: text files -> token shards + tokenizer (llm.c formats), with the
 * byte-level tokenizer or a BPE tokenizer directory (loom/tokenizer.h).
 *
 * Each document becomes end-of-text (256, or the BPE tokenizer's "<|endoftext|>") followed by its
 * tokens (its bytes, or its BPE ids encoded as plain text), so every document starts with EOT.
 * Documents are whole files, or the pieces of a file between lines equal to a separator (fortune
 * files use "%"); empty documents are dropped. The validation split is deterministic and takes whole
 * documents: document i goes to val iff floor((i+1) f) > floor(i f) (evenly spread, round(n f) of
 * them, document 0 always in train); only when that selects none (fewer than 1/f documents) does val
 * become the last ceil(f x tokens) tokens of the stream, after an EOT. Inputs are held in memory. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/util.h"
#include "core/fileio.h"
#include "loom/data.h"
#include "loom/tokenizer.h"

typedef struct {
	const char *p;
	size_t len; /* tokens: bytes of p, or ids */
	int *ids;   /* BPE ids, or NULL for bytes */
} doc_t;

static int doc_token(const doc_t *d, size_t t)
{
	return d->ids ? d->ids[t] : (unsigned char)d->p[t];
}

typedef struct {
	const char *dir, *prefix;
	uint16_t *buf;
	size_t n, cap;
	int index;
	uint64_t total;
} shard_writer_t;

static int sw_flush(shard_writer_t *w)
{
	char path[1100];
	int rc;
	if (snprintf(path, sizeof path, "%s/%s_%06d.bin", w->dir, w->prefix, w->index) >= (int)sizeof path)
		return loom_seterr(LOOM_EINVAL, "data prepare: output path %s too long", w->dir);
	if ((rc = loom_shard_write(path, w->buf, w->n)) != LOOM_OK)
		return rc;
	w->index++;
	w->n = 0;
	return LOOM_OK;
}

static int sw_push(shard_writer_t *w, int tok)
{
	w->buf[w->n++] = (uint16_t)tok;
	w->total++;
	return w->n == w->cap ? sw_flush(w) : LOOM_OK;
}

static int sw_push_doc(shard_writer_t *w, const doc_t *d)
{
	int rc = LOOM_OK;
	for (size_t i = 0; rc == LOOM_OK && i < d->len; i++)
		rc = sw_push(w, doc_token(d, i));
	return rc;
}

/* Copy the BPE tokenizer's files into out_dir as vocab.json, merges.txt (and pattern.txt), so that the
 * shards' directory is itself a tokenizer directory. Nothing to do when it is the same directory. */
static int copy_tokenizer(const char *src, const char *out)
{
	static const char *const names[][2] = {{"vocab.json", "vocab.json"}, {"merges.txt", "merges.txt"},
	                                       {"encoder.json", "vocab.json"}, {"vocab.bpe", "merges.txt"},
	                                       {"pattern.txt", "pattern.txt"}};
	char a[1100], b[1100], *ra = realpath(src, NULL), *rb = realpath(out, NULL);
	int same = ra && rb && strcmp(ra, rb) == 0, rc = LOOM_OK, copied[3] = {0, 0, 0};
	free(ra), free(rb);
	if (same)
		return LOOM_OK;
	for (size_t i = 0; i < sizeof names / sizeof names[0] && rc == LOOM_OK; i++) {
		int slot = i == 4 ? 2 : (int)(i % 2);
		char *text = NULL;
		size_t len = 0;
		atomic_file_t af;
		snprintf(a, sizeof a, "%s/%s", src, names[i][0]);
		snprintf(b, sizeof b, "%s/%s", out, names[i][1]);
		if (copied[slot] || access(a, R_OK) != 0)
			continue;
		if ((rc = loom__read_file(a, &text, &len)) == LOOM_OK && (rc = loom__atomic_open(&af, b)) == LOOM_OK) {
			if ((rc = loom__atomic_write(&af, text, len)) == LOOM_OK)
				rc = loom__atomic_commit(&af);
			else
				loom__atomic_abort(&af);
		}
		free(text);
		copied[slot] = 1;
	}
	if (rc == LOOM_OK && !copied[2]) { /* no pattern.txt: GPT-2's; drop a stale one */
		snprintf(b, sizeof b, "%s/pattern.txt", out);
		unlink(b);
	}
	return rc;
}

/* Write tokenizer.bin (llm.c's format) for a BPE vocabulary when the format can hold it (every id in
 * use, tokens of 1..255 bytes); otherwise leave none (and remove an old one). */
static int save_bpe_table(const loom_bpe_t *bpe, const char *path)
{
	loom_tokenizer_t tok = {0};
	int rc = LOOM_OK, v = loom_bpe_vocab_size(bpe);
	tok.vocab_size = v, tok.eot_token = loom_bpe_eot(bpe);
	tok.bytes = loom__calloc((size_t)v, sizeof *tok.bytes);
	tok.lengths = loom__calloc((size_t)v, sizeof *tok.lengths);
	if (!tok.bytes || !tok.lengths) {
		rc = loom_seterr(LOOM_ENOMEM, "data prepare: out of memory for the tokenizer table");
		goto done;
	}
	for (int i = 0; i < v; i++) {
		size_t len;
		const unsigned char *b = loom_bpe_token(bpe, i, &len);
		if (!b || len < 1 || len > 255) {
			unlink(path);
			goto done;
		}
		tok.bytes[i] = (unsigned char *)b, tok.lengths[i] = (int)len;
	}
	rc = loom_tokenizer_save(&tok, path);
done:
	free(tok.bytes), free(tok.lengths); /* the bytes belong to bpe */
	return rc;
}

/* Append the documents of one file (text[0..len)) to *docs. */
static int split_docs(const char *text, size_t len, const char *sep, doc_t **docs, size_t *n, size_t *cap)
{
	size_t seplen = sep ? strlen(sep) : 0, start = 0, pos = 0;
	for (;;) {
		size_t end = len, next = len;
		if (sep) {
			/* Find the next line equal to sep (with "\n" or "\r\n" or end of text after it). */
			while (pos < len) {
				const char *nl = memchr(text + pos, '\n', len - pos);
				size_t eol = nl ? (size_t)(nl - text) : len, l = eol - pos;
				if (l > 0 && text[eol - 1] == '\r' && eol > pos)
					l--;
				if (l == seplen && memcmp(text + pos, sep, seplen) == 0) {
					end = pos;
					next = nl ? eol + 1 : len;
					pos = next;
					break;
				}
				pos = nl ? eol + 1 : len;
			}
		}
		if (end > start) {
			if (*n == *cap) {
				size_t nc = *cap ? 2 * *cap : 1024;
				doc_t *nd = loom__realloc(*docs, nc * sizeof *nd);
				if (!nd)
					return loom_seterr(LOOM_ENOMEM, "data prepare: out of memory");
				*docs = nd, *cap = nc;
			}
			(*docs)[(*n)++] = (doc_t){text + start, end - start, NULL};
		}
		if (end == len)
			return LOOM_OK;
		start = next;
	}
}

static int remove_old_shards(const char *dir, int *removed)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	*removed = 0;
	if (!d)
		return loom_seterr(LOOM_ESYS, "data prepare: cannot list %s", dir);
	while ((e = readdir(d))) {
		const char *s = e->d_name;
		size_t plen = strncmp(s, "train_", 6) == 0 ? 6 : strncmp(s, "val_", 4) == 0 ? 4 : 0;
		int ok = plen && strlen(s) == plen + 10 && strcmp(s + plen + 6, ".bin") == 0;
		char path[1100];
		for (size_t i = 0; ok && i < 6; i++)
			ok = s[plen + i] >= '0' && s[plen + i] <= '9';
		if (!ok)
			continue;
		snprintf(path, sizeof path, "%s/%s", dir, s);
		if (unlink(path) != 0) {
			closedir(d);
			return loom_seterr(LOOM_ESYS, "data prepare: cannot remove old shard %s", path);
		}
		(*removed)++;
	}
	closedir(d);
	return LOOM_OK;
}

int loom_data_prepare(const loom_prepare_opts_t *o, loom_prepare_summary_t *sum)
{
	char **texts = NULL;
	doc_t *docs = NULL;
	size_t n_docs = 0, docs_cap = 0, shard_tokens = o->shard_tokens ? o->shard_tokens : 100000000;
	unsigned char *is_val = NULL;
	shard_writer_t tw = {o->out_dir, "train", NULL, 0, 0, 0, 0}, vw = {o->out_dir, "val", NULL, 0, 0, 0, 0};
	uint64_t total = 0;
	loom_tokenizer_t tok = {0};
	loom_bpe_t *bpe = NULL;
	double f = o->val_fraction;
	char path[1100];
	int rc = LOOM_OK, eot = LOOM_BYTE_EOT;
	memset(sum, 0, sizeof *sum);
	if (!(f >= 0.0 && f < 1.0))
		return loom_seterr(LOOM_EINVAL, "data prepare: val fraction %g outside [0, 1)", f);
	if (o->n_inputs <= 0)
		return loom_seterr(LOOM_EINVAL, "data prepare: no input files");
	if (o->doc_sep && strchr(o->doc_sep, '\n'))
		return loom_seterr(LOOM_EINVAL, "data prepare: the document separator must be one line");
	if (shard_tokens > INT32_MAX)
		return loom_seterr(LOOM_EINVAL, "data prepare: %zu tokens per shard exceed the format's limit", shard_tokens);
	texts = loom__calloc((size_t)o->n_inputs, sizeof *texts);
	if (!texts)
		return loom_seterr(LOOM_ENOMEM, "data prepare: out of memory");
	for (int i = 0; i < o->n_inputs; i++) {
		size_t len;
		if ((rc = loom__read_file(o->inputs[i], &texts[i], &len)) != LOOM_OK)
			goto out;
		if ((rc = split_docs(texts[i], len, o->doc_sep, &docs, &n_docs, &docs_cap)) != LOOM_OK)
			goto out;
	}
	if (n_docs == 0) {
		rc = loom_seterr(LOOM_EINVAL, "data prepare: the %d input file(s) hold no text", o->n_inputs);
		goto out;
	}
	if (o->tokenizer) {
		if ((rc = loom_bpe_load(&bpe, o->tokenizer)) != LOOM_OK)
			goto out;
		if ((eot = loom_bpe_eot(bpe)) < 0 || loom_bpe_vocab_size(bpe) > 65536) {
			rc = loom_seterr(LOOM_EINVAL, "data prepare: tokenizer %s: %s", o->tokenizer,
			                 eot < 0 ? "has no \"<|endoftext|>\" token to separate documents"
			                         : "has more than 65536 tokens (shards hold uint16)");
			goto out;
		}
		for (size_t i = 0; i < n_docs; i++) /* documents are plain text: "<|endoftext|>" in them is not special */
			if ((rc = loom_bpe_encode(bpe, docs[i].p, docs[i].len, 0, &docs[i].ids, &docs[i].len)) != LOOM_OK)
				goto out;
	}
	is_val = loom__calloc(n_docs, 1);
	if (!is_val) {
		rc = loom_seterr(LOOM_ENOMEM, "data prepare: out of memory");
		goto out;
	}
	for (size_t i = 0; i < n_docs; i++) {
		is_val[i] = floor((double)(i + 1) * f) > floor((double)i * f);
		sum->val_documents += is_val[i];
		total += 1 + docs[i].len;
	}
	sum->documents = n_docs;
	sum->val_tail_split = f > 0 && sum->val_documents == 0;
	if (sum->val_tail_split && total - (uint64_t)ceil(f * (double)total) == 0) {
		rc = loom_seterr(LOOM_EINVAL, "data prepare: %llu tokens are too few to split with val fraction %g",
		                 (unsigned long long)total, f);
		goto out;
	}
	sum->train_documents = n_docs - sum->val_documents;
	if ((rc = loom__mkdir_p(o->out_dir)) != LOOM_OK || (rc = remove_old_shards(o->out_dir, &sum->removed_shards)) != LOOM_OK)
		goto out;
	tw.cap = vw.cap = (size_t)LOOM_MIN((uint64_t)shard_tokens, total + 1);
	tw.buf = loom__malloc(tw.cap * sizeof *tw.buf);
	vw.buf = loom__malloc(vw.cap * sizeof *vw.buf);
	if (!tw.buf || !vw.buf) {
		rc = loom_seterr(LOOM_ENOMEM, "data prepare: out of memory for shard buffers");
		goto out;
	}
	if (sum->val_tail_split) {
		uint64_t n_train = total - (uint64_t)ceil(f * (double)total), pos = 0;
		int val_started = 0;
		for (size_t i = 0; rc == LOOM_OK && i < n_docs; i++) {
			/* Token pos is EOT, tokens pos+1.. are the document's bytes. */
			for (uint64_t t = 0; rc == LOOM_OK && t <= docs[i].len; t++, pos++) {
				int token = t == 0 ? eot : doc_token(&docs[i], t - 1);
				if (pos < n_train) {
					rc = sw_push(&tw, token);
				} else {
					if (!val_started && token != eot)
						rc = sw_push(&vw, eot);
					val_started = 1;
					if (rc == LOOM_OK)
						rc = sw_push(&vw, token);
				}
			}
		}
	} else {
		for (size_t i = 0; rc == LOOM_OK && i < n_docs; i++) {
			shard_writer_t *w = is_val[i] ? &vw : &tw;
			rc = sw_push(w, eot);
			if (rc == LOOM_OK)
				rc = sw_push_doc(w, &docs[i]);
		}
	}
	if (rc == LOOM_OK && tw.n > 0)
		rc = sw_flush(&tw);
	if (rc == LOOM_OK && vw.n > 0)
		rc = sw_flush(&vw);
	if (rc != LOOM_OK)
		goto out;
	snprintf(path, sizeof path, "%s/tokenizer.bin", o->out_dir);
	if (bpe) {
		if ((rc = save_bpe_table(bpe, path)) != LOOM_OK || (rc = copy_tokenizer(o->tokenizer, o->out_dir)) != LOOM_OK)
			goto out;
	} else {
		if ((rc = loom_tokenizer_init_bytes(&tok)) != LOOM_OK)
			goto out;
		if ((rc = loom_tokenizer_save(&tok, path)) != LOOM_OK)
			goto out;
	}
	sum->train_tokens = tw.total, sum->val_tokens = vw.total;
	sum->train_shards = tw.index, sum->val_shards = vw.index;
out:
	loom_tokenizer_free(&tok);
	for (int i = 0; texts && i < o->n_inputs; i++)
		free(texts[i]);
	free(texts);
	for (size_t i = 0; docs && i < n_docs; i++)
		free(docs[i].ids);
	free(docs);
	loom_bpe_destroy(bpe);
	free(is_val);
	free(tw.buf);
	free(vw.buf);
	return rc;
}
