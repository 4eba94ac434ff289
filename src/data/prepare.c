/* prepare.c: `loom data prepare`: text files -> token shards + tokenizer (llm.c formats), with the
 * byte-level tokenizer or a BPE tokenizer: a directory or a tokenizer.json (loom/tokenizer.h).
 *
 * Each document becomes end-of-text (256, or the BPE tokenizer's document start: "<|endoftext|>", or
 * the BOS of a tokenizer.json's post-processor such as Llama 3's "<|begin_of_text|>") followed by its
 * tokens (its bytes, or its BPE ids encoded as plain text), so every document starts with EOT.
 * Documents are whole files, or the pieces of a file between lines equal to a separator (fortune
 * files use "%"); empty documents are dropped. The validation split is deterministic and takes whole
 * documents: document i goes to val iff floor((i+1) f) > floor(i f) (evenly spread, round(n f) of
 * them, document 0 always in train); only when that selects none (fewer than 1/f documents) does val
 * become the last ceil(f x tokens) tokens of the stream, after an EOT. Inputs are held in memory.
 * Shards hold uint16 tokens (llm.c's "gpt-2" format) when the tokenizer's ids fit (at most 65536 of
 * them, its added tokens included), else uint32 (llm.c's "llama-3" format): the narrowest that holds
 * every id, so a uint16 set is byte for byte what it was before uint32 shards existed.
 *
 * Output: the whole new set (shards, tokenizer files and the index LOOM_SHARD_INDEX giving each
 * shard's size and each set's shard count) is written into a temporary directory beside OUT and put
 * in place only when complete (swap_in), so any failure (a full disk, a bad input) leaves the old set
 * as it was, and the loader can tell a complete set from a partial one. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/util.h"
#include "core/fileio.h"
#include "data/shard_index.h"
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
	void *buf;  /* cap tokens of width bytes: uint16_t or uint32_t */
	int width;
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
	rc = w->width == 4 ? loom_shard_write32(path, w->buf, w->n) : loom_shard_write(path, w->buf, w->n);
	if (rc != LOOM_OK)
		return rc;
	w->index++;
	w->n = 0;
	return LOOM_OK;
}

static int sw_push(shard_writer_t *w, int tok)
{
	if (w->width == 4)
		((uint32_t *)w->buf)[w->n++] = (uint32_t)tok;
	else
		((uint16_t *)w->buf)[w->n++] = (uint16_t)tok;
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

static int copy_file(const char *a, const char *b)
{
	char *text = NULL;
	size_t len = 0;
	atomic_file_t af;
	int rc;
	if ((rc = loom__read_file_max(a, (size_t)256 << 20, &text, &len)) == LOOM_OK && (rc = loom__atomic_open(&af, b)) == LOOM_OK) {
		if ((rc = loom__atomic_write(&af, text, len)) == LOOM_OK)
			rc = loom__atomic_commit(&af);
		else
			loom__atomic_abort(&af);
	}
	free(text);
	return rc;
}

/* Copy the BPE tokenizer's files into the new set's directory `out`: a tokenizer.json (the source
 * itself, or the one in the source directory, which loom_bpe_load reads first) as tokenizer.json;
 * else vocab.json, merges.txt (and pattern.txt). So the shards' directory is itself a tokenizer
 * directory. The source may be the output directory itself (its files are copied into the new set
 * before it replaces the old). */
static int copy_tokenizer(const char *src, const char *out)
{
	static const char *const names[][2] = {{"vocab.json", "vocab.json"}, {"merges.txt", "merges.txt"},
	                                       {"encoder.json", "vocab.json"}, {"vocab.bpe", "merges.txt"},
	                                       {"pattern.txt", "pattern.txt"}};
	char a[1300], b[1300];
	int rc = LOOM_OK, copied[3] = {0, 0, 0};
	struct stat sb;
	snprintf(b, sizeof b, "%s/tokenizer.json", out);
	if (stat(src, &sb) == 0 && S_ISREG(sb.st_mode))
		return copy_file(src, b);
	snprintf(a, sizeof a, "%s/tokenizer.json", src);
	if (stat(a, &sb) == 0 && S_ISREG(sb.st_mode))
		return copy_file(a, b);
	for (size_t i = 0; i < sizeof names / sizeof names[0] && rc == LOOM_OK; i++) {
		int slot = i == 4 ? 2 : (int)(i % 2);
		snprintf(a, sizeof a, "%s/%s", src, names[i][0]);
		snprintf(b, sizeof b, "%s/%s", out, names[i][1]);
		if (copied[slot] || access(a, R_OK) != 0)
			continue;
		rc = copy_file(a, b);
		copied[slot] = 1;
	}
	return rc; /* no pattern.txt: GPT-2's (the new set has none, so a stale one goes with the old set) */
}

/* Write tokenizer.bin (llm.c's format) for a BPE vocabulary when the format can hold it (every id in
 * use, tokens of 1..255 bytes); otherwise leave none (and remove an old one). */
static int save_bpe_table(const loom_bpe_t *bpe, const char *path)
{
	loom_tokenizer_t tok = {0};
	int rc = LOOM_OK, v = loom_bpe_vocab_size(bpe);
	tok.vocab_size = v, tok.eot_token = loom_bpe_doc_start(bpe);
	tok.bytes = loom__calloc((size_t)v, sizeof *tok.bytes);
	tok.lengths = loom__calloc((size_t)v, sizeof *tok.lengths);
	if (!tok.bytes || !tok.lengths) {
		rc = loom_seterr(LOOM_ENOMEM, "data prepare: out of memory for the tokenizer table");
		goto done;
	}
	for (int i = 0; i < v; i++) {
		size_t len;
		const unsigned char *b = loom_bpe_token(bpe, i, &len);
		if (!b || len < 1 || len > 255)
			goto done; /* none in the new set */
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

/* Whether `name` is a file `loom data prepare` writes (so a directory of only such files is a data
 * set it may replace whole), and whether it is a shard name (PREFIX_NNNNNN.bin). */
static int is_shard_name(const char *s)
{
	size_t plen = strncmp(s, "train_", 6) == 0 ? 6 : strncmp(s, "val_", 4) == 0 ? 4 : 0;
	int ok = plen && strlen(s) == plen + 10 && strcmp(s + plen + 6, ".bin") == 0;
	for (size_t i = 0; ok && i < 6; i++)
		ok = s[plen + i] >= '0' && s[plen + i] <= '9';
	return ok;
}

static int is_owned_name(const char *s)
{
	static const char *const own[] = {"tokenizer.bin", "vocab.json", "merges.txt", "pattern.txt", "tokenizer.json",
	                                  LOOM_SHARD_INDEX};
	for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
		if (!strcmp(s, own[i]))
			return 1;
	return is_shard_name(s);
}

/* Count the old shards of dir, and whether every entry of dir is a file prepare owns. */
static int scan_old(const char *dir, int *shards, int *only_owned)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	*shards = 0, *only_owned = 1;
	if (!d)
		return loom_seterr(LOOM_ESYS, "data prepare: cannot list %s: %s", dir, strerror(errno));
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		*shards += is_shard_name(e->d_name);
		*only_owned &= is_owned_name(e->d_name);
	}
	closedir(d);
	return LOOM_OK;
}

/* Put the new set (complete in tmp) in place of out. out missing: rename. out holding only files
 * prepare writes: exchange the two directories atomically (renameat2 RENAME_EXCHANGE; two renames
 * where the filesystem lacks it) and delete the old set. Otherwise (other files live in out): delete
 * the old index first (a set without an index is not trusted as complete), then the old shards and
 * stale tokenizer files, move the new files in, and the new index last. */
static int swap_in(const char *tmp, const char *out, int *removed)
{
	struct stat sb;
	int only_owned, rc;
	DIR *d;
	struct dirent *e;
	char a[1500], b[1500];
	*removed = 0;
	if (stat(out, &sb) != 0) {
		if (rename(tmp, out) != 0)
			return loom_seterr(LOOM_ESYS, "data prepare: rename %s -> %s: %s", tmp, out, strerror(errno));
		return loom__fsync_parent(out);
	}
	if (!S_ISDIR(sb.st_mode))
		return loom_seterr(LOOM_EINVAL, "data prepare: output %s exists and is not a directory", out);
	if ((rc = scan_old(out, removed, &only_owned)) != LOOM_OK)
		return rc;
	if (only_owned) {
		if (syscall(SYS_renameat2, AT_FDCWD, tmp, AT_FDCWD, out, 2 /* RENAME_EXCHANGE */) != 0) {
			snprintf(a, sizeof a, "%s.old", tmp);
			if (rename(out, a) != 0 || rename(tmp, out) != 0)
				return loom_seterr(LOOM_ESYS, "data prepare: replacing %s by %s: %s", out, tmp, strerror(errno));
			if (rename(a, tmp) != 0)
				return loom_seterr(LOOM_ESYS, "data prepare: rename %s -> %s: %s", a, tmp, strerror(errno));
		}
		if ((rc = loom__fsync_parent(out)) != LOOM_OK)
			return rc;
		return loom__rm_rf(tmp); /* the old set */
	}
	static const char *const stale[] = {LOOM_SHARD_INDEX, "tokenizer.bin", "pattern.txt", "tokenizer.json", "vocab.json",
	                                    "merges.txt"};
	for (size_t i = 0; i < sizeof stale / sizeof stale[0]; i++) {
		snprintf(b, sizeof b, "%s/%s", out, stale[i]);
		if (unlink(b) != 0 && errno != ENOENT)
			return loom_seterr(LOOM_ESYS, "data prepare: cannot remove %s: %s", b, strerror(errno));
		if (i == 0 && (rc = loom__fsync_path(out)) != LOOM_OK)
			return rc;
	}
	if (!(d = opendir(out)))
		return loom_seterr(LOOM_ESYS, "data prepare: cannot list %s: %s", out, strerror(errno));
	while ((e = readdir(d))) {
		if (!is_shard_name(e->d_name))
			continue;
		snprintf(b, sizeof b, "%s/%s", out, e->d_name);
		if (unlink(b) != 0) {
			closedir(d);
			return loom_seterr(LOOM_ESYS, "data prepare: cannot remove old shard %s: %s", b, strerror(errno));
		}
	}
	closedir(d);
	if (!(d = opendir(tmp)))
		return loom_seterr(LOOM_ESYS, "data prepare: cannot list %s: %s", tmp, strerror(errno));
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.' || !strcmp(e->d_name, LOOM_SHARD_INDEX))
			continue;
		snprintf(a, sizeof a, "%s/%s", tmp, e->d_name);
		snprintf(b, sizeof b, "%s/%s", out, e->d_name);
		if (rename(a, b) != 0) {
			closedir(d);
			return loom_seterr(LOOM_ESYS, "data prepare: rename %s -> %s: %s", a, b, strerror(errno));
		}
	}
	closedir(d);
	if ((rc = loom__fsync_path(out)) != LOOM_OK)
		return rc;
	snprintf(a, sizeof a, "%s/%s", tmp, LOOM_SHARD_INDEX);
	snprintf(b, sizeof b, "%s/%s", out, LOOM_SHARD_INDEX);
	if (rename(a, b) != 0)
		return loom_seterr(LOOM_ESYS, "data prepare: rename %s -> %s: %s", a, b, strerror(errno));
	if ((rc = loom__fsync_path(out)) != LOOM_OK)
		return rc;
	return loom__rm_rf(tmp);
}

/* Remove the temporary directories of earlier prepares of the same output that were killed
 * (DIR/.NAME.prepare-PID whose process no longer exists); `tmp` is this run's. */
static int remove_stale(const char *tmp)
{
	char parent[1100], prefix[300], path[1500];
	const char *slash = strrchr(tmp, '/'), *base = slash ? slash + 1 : tmp, *dash = strrchr(base, '-');
	DIR *d;
	struct dirent *e;
	int rc = LOOM_OK;
	snprintf(parent, sizeof parent, "%.*s", slash ? (int)(slash - tmp) : 1, slash ? tmp : ".");
	snprintf(prefix, sizeof prefix, "%.*s", (int)(dash - base + 1), base); /* ".NAME.prepare-" */
	if (!(d = opendir(parent)))
		return LOOM_OK;
	while (rc == LOOM_OK && (e = readdir(d))) {
		char *end;
		long pid;
		if (strncmp(e->d_name, prefix, strlen(prefix)) != 0)
			continue;
		pid = strtol(e->d_name + strlen(prefix), &end, 10);
		if (*end || pid <= 0 || (kill((pid_t)pid, 0) != 0 && errno == ESRCH)) {
			snprintf(path, sizeof path, "%s/%s", parent, e->d_name);
			rc = loom__rm_rf(path);
		}
	}
	closedir(d);
	return rc;
}

/* The index of the new set: how many shards and tokens each set has, and each shard's size. */
static int write_index(const char *dir, const shard_writer_t *tw, const shard_writer_t *vw)
{
	loom__index_set_t sets[2];
	loom__shard_index_t idx = {sets, 2, NULL, 0};
	char path[1400];
	int rc = LOOM_OK;
	if (!(idx.files = loom__calloc((size_t)(tw->index + vw->index) + 1, sizeof *idx.files)))
		return loom_seterr(LOOM_ENOMEM, "data prepare: out of memory for the shard index");
	for (int set = 0; set < 2 && rc == LOOM_OK; set++) {
		const shard_writer_t *w = set ? vw : tw;
		snprintf(sets[set].name, sizeof sets[set].name, "%s", w->prefix);
		sets[set].shards = w->index, sets[set].tokens = w->total;
		for (int i = 0; i < w->index; i++) {
			struct stat sb;
			loom__index_file_t *f = &idx.files[idx.n_files];
			snprintf(f->name, sizeof f->name, "%s_%06d.bin", w->prefix, i);
			snprintf(path, sizeof path, "%s/%s", dir, f->name);
			if (stat(path, &sb) != 0) {
				rc = loom_seterr(LOOM_ESYS, "data prepare: %s: %s", path, strerror(errno));
				break;
			}
			f->bytes = (uint64_t)sb.st_size;
			idx.n_files++;
		}
	}
	if (rc == LOOM_OK)
		rc = loom__shard_index_write(dir, &idx);
	free(idx.files);
	return rc;
}

int loom_data_prepare(const loom_prepare_opts_t *o, loom_prepare_summary_t *sum)
{
	char **texts = NULL;
	doc_t *docs = NULL;
	size_t n_docs = 0, docs_cap = 0, shard_tokens = o->shard_tokens ? o->shard_tokens : 100000000;
	unsigned char *is_val = NULL;
	shard_writer_t tw = {NULL, "train", NULL, 2, 0, 0, 0, 0}, vw = {NULL, "val", NULL, 2, 0, 0, 0, 0};
	uint64_t total = 0;
	loom_tokenizer_t tok = {0};
	loom_bpe_t *bpe = NULL;
	double f = o->val_fraction;
	char path[1300], out[1024], tmp[1100];
	int rc = LOOM_OK, eot = LOOM_BYTE_EOT, have_tmp = 0;
	memset(sum, 0, sizeof *sum);
	if (!o->out_dir || !*o->out_dir || snprintf(out, sizeof out, "%s", o->out_dir) >= (int)sizeof out - 64)
		return loom_seterr(LOOM_EINVAL, "data prepare: output directory '%s' empty or too long",
		                   o->out_dir ? o->out_dir : "");
	for (size_t l = strlen(out); l > 1 && out[l - 1] == '/'; l--)
		out[l - 1] = 0;
	{ /* the new set is built beside the output: DIR/.NAME.prepare-PID, on the same filesystem */
		const char *slash = strrchr(out, '/');
		if (slash)
			snprintf(tmp, sizeof tmp, "%.*s/.%s.prepare-%ld", (int)(slash - out), out, slash + 1, (long)getpid());
		else
			snprintf(tmp, sizeof tmp, ".%s.prepare-%ld", out, (long)getpid());
	}
	tw.dir = vw.dir = tmp;
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
		if ((eot = loom_bpe_doc_start(bpe)) < 0) {
			rc = loom_seterr(LOOM_EINVAL, "data prepare: tokenizer %s: has no \"<|endoftext|>\" token nor a "
			                 "post-processor BOS to start documents", o->tokenizer);
			goto out;
		}
		if (loom_bpe_vocab_size(bpe) > LOOM_SHARD16_MAX_VOCAB) /* ids 0..vocab-1, added tokens included */
			tw.width = vw.width = 4;
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
	{ /* the output's parent must exist; the new set goes into a fresh temporary directory beside it */
		char parent[1100], *slash;
		snprintf(parent, sizeof parent, "%s", tmp);
		if ((slash = strrchr(parent, '/')) && slash > parent) {
			*slash = 0;
			if ((rc = loom__mkdir_p(parent)) != LOOM_OK)
				goto out;
		}
		if ((rc = loom__rm_rf(tmp)) != LOOM_OK || (rc = remove_stale(tmp)) != LOOM_OK)
			goto out;
		if (mkdir(tmp, 0777) != 0) {
			rc = loom_seterr(LOOM_ESYS, "data prepare: cannot create %s: %s", tmp, strerror(errno));
			goto out;
		}
		have_tmp = 1;
	}
	tw.cap = vw.cap = (size_t)LOOM_MIN((uint64_t)shard_tokens, total + 1);
	tw.buf = loom__malloc(tw.cap * (size_t)tw.width);
	vw.buf = loom__malloc(vw.cap * (size_t)vw.width);
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
	snprintf(path, sizeof path, "%s/tokenizer.bin", tmp);
	if (bpe) {
		if ((rc = save_bpe_table(bpe, path)) != LOOM_OK || (rc = copy_tokenizer(o->tokenizer, tmp)) != LOOM_OK)
			goto out;
	} else {
		if ((rc = loom_tokenizer_init_bytes(&tok)) != LOOM_OK)
			goto out;
		if ((rc = loom_tokenizer_save(&tok, path)) != LOOM_OK)
			goto out;
	}
	if ((rc = write_index(tmp, &tw, &vw)) != LOOM_OK || (rc = loom__fsync_path(tmp)) != LOOM_OK)
		goto out;
	if ((rc = swap_in(tmp, out, &sum->removed_shards)) != LOOM_OK)
		goto out;
	have_tmp = 0;
	sum->train_tokens = tw.total, sum->val_tokens = vw.total;
	sum->train_shards = tw.index, sum->val_shards = vw.index;
	sum->token_bytes = tw.width;
out:
	if (have_tmp) /* any failure before the swap: the old set is untouched */
		loom__rm_rf(tmp);
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
