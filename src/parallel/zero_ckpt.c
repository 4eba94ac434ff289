/* zero_ckpt.c: checkpoints of the strategies whose AdamW state is sharded over the data-parallel axis
 * (ZeRO, zero.c), and the reading side for every strategy.
 *
 * A sharded checkpoint holds, beside state.json:
 *   model.safetensors                 the whole parameters (HF names), written by the writer (data-
 *                                     parallel rank 0, global rank 0 when tp = pp = 1): replicated at
 *                                     stages 1 and 2, gathered from the shards at stage 3; so `loom
 *                                     sample`, `info` and `convert` read it as they read DDP's;
 *   optim.rankR-of-N.safetensors      written by rank R itself: its slice of the AdamW moments,
 *                                     tensors "exp_avg" and "exp_avg_sq" of `count` floats, which are
 *                                     the floats [offset, offset + count) of the flat layout;
 *   zero.json                         the index (loom_kv): format "loom-zero", stage, world N,
 *                                     parameters, and for each rank R "shard.R.file", ".offset",
 *                                     ".count".
 * Every rank writes into the checkpoint's temporary directory once the writer has begun it (the first
 * collective of the save says so), and the save ends with a collective that every rank enters only
 * after its file is complete, so the writer commits (MANIFEST, rename) a directory that holds all
 * of them: a crash at any point leaves the previous checkpoint as the newest complete one.
 *
 * Load reads the parameters (its slice of them at stage 3) and, for its owned range, the slices of
 * every shard that overlaps it, whatever the world size that wrote them: resharding is reading other
 * slices. A checkpoint without zero.json (DDP's: optim.safetensors, the moments of every tensor under
 * PyTorch's names) is read the same way, and DDP reads a ZeRO checkpoint through this file too. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/util.h"
#include "parallel/strategy.h"

enum { TAG_P = 0x2e03 };

static void shard_name(const loom_strategy_t *s, char *buf, size_t cap, int rank, int size)
{
	if (s->muon) /* MuonAdamW's state file (muon_opt.c) */
		loom__muon_state_name(buf, cap, rank);
	else
		snprintf(buf, cap, "optim.rank%d-of-%d.safetensors", rank, size);
}

/* Where rank q's owned range starts (q = size: nparams). */
static size_t shard_at(const loom_strategy_t *s, int q)
{
	return s->shard_off ? s->shard_off[q] : loom__zero_shard_offset(s->nparams, q, s->dp_size);
}

/* This rank's moments as a shard file in the checkpoint's directory. */
static int write_shard(loom_strategy_t *s, const loom_ckpt_writer_t *w)
{
	char name[128], path[1300], off[32], cnt[32], rk[16], ws[16];
	if (s->muon)
		return loom__muon_write_shard(s, w->tmp);
	shard_name(s, name, sizeof name, s->dp_rank, s->dp_size);
	snprintf(path, sizeof path, "%s/%s", w->tmp, name);
	snprintf(off, sizeof off, "%zu", s->own_offset), snprintf(cnt, sizeof cnt, "%zu", s->own_count);
	snprintf(rk, sizeof rk, "%d", s->dp_rank), snprintf(ws, sizeof ws, "%d", s->dp_size);
	const char *meta[] = {"format", "loom-zero-shard", "offset", off, "count", cnt, "rank", rk, "world", ws};
	loom_st_tensor_t t[2] = {
		{.name = "exp_avg", .dtype = LOOM_ST_F32, .ndim = 1, .shape = {s->own_count}, .data = s->opt.m,
		 .nbytes = s->own_count * sizeof(float)},
		{.name = "exp_avg_sq", .dtype = LOOM_ST_F32, .ndim = 1, .shape = {s->own_count}, .data = s->opt.v,
		 .nbytes = s->own_count * sizeof(float)},
	};
	return loom_st_write(path, t, 2, meta, 5);
}

static int write_index(loom_strategy_t *s, const loom_ckpt_writer_t *w, int stage)
{
	loom_kv_t *kv;
	char key[64], name[128], path[1200];
	int rc;
	if ((rc = loom_kv_create(&kv)) != LOOM_OK)
		return rc;
	rc = rc ? rc : loom_kv_set_str(kv, "format", "loom-zero");
	rc = rc ? rc : loom_kv_set_i64(kv, "stage", stage);
	rc = rc ? rc : loom_kv_set_i64(kv, "world", s->dp_size);
	rc = rc ? rc : loom_kv_set_i64(kv, "parameters", (int64_t)s->nparams);
	for (int q = 0; q < s->dp_size && rc == LOOM_OK; q++) {
		size_t a = shard_at(s, q), b = shard_at(s, q + 1);
		shard_name(s, name, sizeof name, q, s->dp_size);
		snprintf(key, sizeof key, "shard.%d.file", q);
		rc = loom_kv_set_str(kv, key, name);
		snprintf(key, sizeof key, "shard.%d.offset", q);
		rc = rc ? rc : loom_kv_set_i64(kv, key, (int64_t)a);
		snprintf(key, sizeof key, "shard.%d.count", q);
		rc = rc ? rc : loom_kv_set_i64(kv, key, (int64_t)(b - a));
	}
	if (rc == LOOM_OK && (rc = loom_ckpt_file(w, "zero.json", path, sizeof path)) == LOOM_OK)
		rc = loom_kv_save(kv, path);
	loom_kv_destroy(kv);
	return rc;
}

/* The whole parameters on the writer: at stage 3 each rank sends its shard there. */
static int gather_params(loom_strategy_t *s, float **out)
{
	int rc = LOOM_OK;
	float *p;
	*out = NULL;
	if (s->params) { /* replicated */
		*out = s->params;
		return LOOM_OK;
	}
	if (s->dp_rank != 0) {
		if ((rc = loom_send(s->dp, s->own_params, s->own_count, LOOM_FLOAT32, 0, TAG_P)) != LOOM_OK)
			return loom_seterr(rc, "zero: rank %d: sending its parameter shard to the writer: %s", s->dp_rank,
			                   loom_comm_errmsg(s->dp));
		return LOOM_OK;
	}
	if (!(p = loom_alloc_aligned(LOOM_MAX(s->nparams, 1) * sizeof(float))))
		return loom_seterr(LOOM_ENOMEM, "zero: out of memory for gathering %zu parameters to save them", s->nparams);
	memcpy(p + s->own_offset, s->own_params, s->own_count * sizeof(float));
	for (int q = 1; q < s->dp_size && rc == LOOM_OK; q++) {
		size_t a = shard_at(s, q), b = shard_at(s, q + 1);
		if ((rc = loom_recv(s->dp, p + a, b - a, LOOM_FLOAT32, q, TAG_P)) != LOOM_OK)
			rc = loom_seterr(rc, "zero: receiving the parameter shard of rank %d: %s", q, loom_comm_errmsg(s->dp));
	}
	if (rc != LOOM_OK) {
		loom_free_aligned(p);
		return rc;
	}
	*out = p;
	return LOOM_OK;
}

int loom__ckpt_part_begin(loom_strategy_t *s, int writer, const loom_ckpt_writer_t *w, const char *who, int *go)
{
	int ok = !writer || (w && w->active), all = ok, rc;
	*go = 0;
	if (s->dp_size > 1 && (rc = loom_allreduce(s->dp, &ok, &all, 1, LOOM_INT32, LOOM_MIN)) != LOOM_OK)
		return loom_seterr(rc, "%s: rank %d: starting the checkpoint: %s", who, s->dp_rank, loom_comm_errmsg(s->dp));
	if (!all)
		return writer ? LOOM_OK : loom_seterr(LOOM_EIO, "%s: rank %d: the writer could not begin the checkpoint", who,
		                                      s->dp_rank);
	*go = 1;
	return LOOM_OK;
}

int loom__ckpt_part_end(loom_strategy_t *s, int rc, const char *who)
{
	int mine = rc == LOOM_OK, all = mine, r;
	if (s->dp_size > 1 && (r = loom_allreduce(s->dp, &mine, &all, 1, LOOM_INT32, LOOM_MIN)) != LOOM_OK)
		return loom_seterr(r, "%s: rank %d: finishing the checkpoint: %s", who, s->dp_rank, loom_comm_errmsg(s->dp));
	if (rc == LOOM_OK && !all)
		rc = loom_seterr(LOOM_EIO, "%s: rank %d: another rank failed to write its part of the checkpoint", who,
		                 s->dp_rank);
	return rc;
}

int loom__sharded_save(loom_strategy_t *s, const loom_ckpt_writer_t *w, int stage)
{
	char path[1200];
	float *p = NULL;
	int rc, go;
	/* 1: has the writer begun the checkpoint? (everyone learns it; nobody writes otherwise) */
	if ((rc = loom__ckpt_part_begin(s, s->dp_rank == 0, w, "zero", &go)) != LOOM_OK || !go)
		return rc;
	/* 2: the shards, the parameters and the index */
	rc = write_shard(s, w);
	int r = gather_params(s, &p);
	rc = rc ? rc : r;
	if (s->dp_rank == 0 && rc == LOOM_OK) {
		if ((rc = loom_ckpt_file(w, "model.safetensors", path, sizeof path)) == LOOM_OK &&
		    (rc = loom_model_save_safetensors(path, &s->mcfg, p)) == LOOM_OK)
			rc = write_index(s, w, stage);
	}
	if (p != s->params)
		loom_free_aligned(p);
	/* 3: every file complete before the writer commits; a failure anywhere fails the save everywhere */
	return loom__ckpt_part_end(s, rc, "zero");
}

/* Copy [off, off + n) of the flat layout from file `path` into dst[0] (and dst[1]): with suffixes,
 * the moments (every tensor's "<name>.exp_avg" into dst[0], ".exp_avg_sq" into dst[1]); without, the
 * parameters (HF names, with or without "transformer."). */
static int load_slices(const char *path, const loom_model_config_t *c, size_t off, size_t n, float *const *dst,
                       int moments)
{
	loom_st_t *st;
	int nt = loom_model_num_tensors(c), rc;
	if ((rc = loom_st_open(&st, path)) != LOOM_OK)
		return rc;
	for (int i = 0; i < (moments ? 2 : 1) * nt && rc == LOOM_OK; i++) {
		loom_tensor_info_t info;
		char name[LOOM_TENSOR_NAME_MAX + 16];
		const loom_st_tensor_t *t;
		int k;
		loom_model_tensor_info(c, i % nt, &info);
		if (moments)
			snprintf(name, sizeof name, "%s.%s", info.name, i < nt ? "exp_avg" : "exp_avg_sq");
		else
			snprintf(name, sizeof name, "%s", info.name);
		k = loom_st_find(st, name);
		if (k < 0 && !moments) {
			snprintf(name, sizeof name, "transformer.%s", info.name);
			k = loom_st_find(st, name);
		}
		if (k < 0) {
			rc = loom_seterr(LOOM_EFORMAT, "%s: missing tensor '%s'", path, name);
			break;
		}
		t = loom_st_get(st, k);
		if (t->dtype != LOOM_ST_F32 || t->nbytes != info.numel * sizeof(float)) {
			rc = loom_seterr(LOOM_EFORMAT, "%s: tensor '%s' is not F32 of %zu elements", path, name, info.numel);
			break;
		}
		size_t lo = LOOM_MAX(off, info.offset), hi = LOOM_MIN(off + n, info.offset + info.numel);
		if (hi > lo)
			rc = loom_st_read_bytes(st, k, (lo - info.offset) * sizeof(float), (hi - lo) * sizeof(float),
			                        dst[i < nt ? 0 : 1] + (lo - off));
	}
	loom_st_close(st);
	return rc;
}

/* The moments of the range [a, a + count) of a flat buffer of nparams floats (into m and v, count
 * floats each) from the shards listed in dir/zero.json: every overlapping shard's slice. Names every
 * missing shard file at once. */
static int load_shards(const char *dir, const char *index, size_t total, size_t a, size_t count, float *m, float *v)
{
	loom_kv_t *kv;
	char key[64], path[1300], missing[600] = "";
	const char *file;
	int64_t world, nparams, off, cnt;
	size_t b = a + count, len = 0;
	int rc, nmissing = 0;
	struct stat sb;
	if ((rc = loom_kv_load(&kv, index)) != LOOM_OK)
		return rc;
	if ((rc = loom_kv_get_i64(kv, "world", &world)) || (rc = loom_kv_get_i64(kv, "parameters", &nparams)))
		goto out;
	if (nparams != (int64_t)total || world < 1) {
		rc = loom_seterr(LOOM_EMISMATCH, "%s: %lld parameters in %lld shards, the model has %zu", index,
		                 (long long)nparams, (long long)world, total);
		goto out;
	}
	for (int pass = 0; pass < 2 && rc == LOOM_OK; pass++) { /* pass 0: every file there? pass 1: read */
		for (int64_t q = 0; q < world && rc == LOOM_OK; q++) {
			snprintf(key, sizeof key, "shard.%lld.file", (long long)q);
			if ((rc = loom_kv_get_str(kv, key, &file)))
				break;
			snprintf(key, sizeof key, "shard.%lld.offset", (long long)q);
			if ((rc = loom_kv_get_i64(kv, key, &off)))
				break;
			snprintf(key, sizeof key, "shard.%lld.count", (long long)q);
			if ((rc = loom_kv_get_i64(kv, key, &cnt)))
				break;
			snprintf(path, sizeof path, "%s/%s", dir, file);
			if (pass == 0) {
				if (stat(path, &sb) != 0) {
					nmissing++;
					if (len + strlen(file) + 8 < sizeof missing)
						len += (size_t)snprintf(missing + len, sizeof missing - len, "%s%s", len ? ", " : "", file);
				}
				continue;
			}
			size_t lo = LOOM_MAX(a, (size_t)off), hi = LOOM_MIN(b, (size_t)(off + cnt));
			if (hi <= lo)
				continue;
			loom_st_t *st;
			if ((rc = loom_st_open(&st, path)) != LOOM_OK)
				break;
			int im = loom_st_find(st, "exp_avg"), iv = loom_st_find(st, "exp_avg_sq");
			const loom_st_tensor_t *tm = loom_st_get(st, im), *tv = loom_st_get(st, iv);
			if (!tm || !tv || tm->dtype != LOOM_ST_F32 || tv->dtype != LOOM_ST_F32 ||
			    tm->nbytes != (size_t)cnt * sizeof(float) || tv->nbytes != (size_t)cnt * sizeof(float)) {
				rc = loom_seterr(LOOM_EFORMAT, "%s: expected tensors exp_avg and exp_avg_sq of %lld F32 values (as "
				                 "%s says)", path, (long long)cnt, index);
			} else if ((rc = loom_st_read_bytes(st, im, (lo - (size_t)off) * sizeof(float), (hi - lo) * sizeof(float),
			                                    m + (lo - a))) == LOOM_OK) {
				rc = loom_st_read_bytes(st, iv, (lo - (size_t)off) * sizeof(float), (hi - lo) * sizeof(float), v + (lo - a));
			}
			loom_st_close(st);
		}
		if (pass == 0 && nmissing)
			rc = loom_seterr(LOOM_ENOENT, "resume from %s: %d of the %lld optimizer shard files listed in zero.json "
			                 "are missing: %s", dir, nmissing, (long long)world, missing);
	}
out:
	loom_kv_destroy(kv);
	return rc;
}

int loom__check_ckpt_model(const char *file, const loom_model_config_t *c)
{
	loom_model_config_t saved;
	int rc;
	if ((rc = loom_model_config(file, c->n_head, &saved, NULL)) != LOOM_OK)
		return rc;
	if (!loom_model_config_equal(&saved, c))
		return loom_seterr(LOOM_EMISMATCH, "resume: %s holds a model L%d H%d C%d T%d V%d, this run's is "
		                   "L%d H%d C%d T%d V%d", file, saved.n_layer, saved.n_head, saved.n_embd, saved.seq_len,
		                   saved.vocab_size, c->n_layer, c->n_head, c->n_embd, c->seq_len, c->vocab_size);
	return LOOM_OK;
}

int loom__sharded_load(loom_strategy_t *s, const char *dir, long long step)
{
	char file[1200];
	const loom_model_config_t *c = &s->mcfg;
	struct stat sb;
	int rc;
	snprintf(file, sizeof file, "%s/model.safetensors", dir);
	if ((rc = loom__check_ckpt_model(file, c)) != LOOM_OK)
		return rc;
	if (s->params && (rc = loom_model_load(file, c, s->params)) != LOOM_OK)
		return rc;
	if (!s->params) { /* stage 3: this rank's slice of the parameters */
		if ((rc = load_slices(file, c, s->own_offset, s->own_count, &s->own_params, 0)) != LOOM_OK)
			return rc;
		loom__zero_set_loaded(s);
	}
	if (s->muon) /* MuonAdamW's state: its matrices by name, the moments of its range by overlap */
		return loom__muon_load_state(s, dir, step);
	if (loom__muon_has_state(dir))
		return loom_seterr(LOOM_EMISMATCH, "resume: %s was written with --optimizer muon; resume with it", dir);
	snprintf(file, sizeof file, "%s/zero.json", dir);
	if (stat(file, &sb) == 0) {
		if ((rc = load_shards(dir, file, s->nparams, s->own_offset, s->own_count, s->opt.m, s->opt.v)) != LOOM_OK)
			return rc;
	} else {
		snprintf(file, sizeof file, "%s/optim.safetensors", dir);
		float *mv[2] = {s->opt.m, s->opt.v};
		if ((rc = load_slices(file, c, s->own_offset, s->own_count, mv, 1)) != LOOM_OK)
			return rc;
	}
	s->opt.step = step;
	return LOOM_OK;
}

/* [off, off + n) of a checkpoint's whole state into p, m, v; whole: the range is all of it, and the
 * parameters may be of any dtype loom_model_load reads (a range reads F32 slices). */
static int read_state(const char *dir, const loom_model_config_t *c, size_t off, size_t n, int whole, float *p,
                      float *m, float *v)
{
	char file[1200];
	struct stat sb;
	size_t total = loom_model_num_params(c);
	int rc;
	if (off > total || n > total - off)
		return loom_seterr(LOOM_EINVAL, "resume: range [%zu, %zu) of a state of %zu floats", off, off + n, total);
	snprintf(file, sizeof file, "%s/model.safetensors", dir);
	if ((rc = loom__check_ckpt_model(file, c)) != LOOM_OK)
		return rc;
	if (p && (rc = whole ? loom_model_load(file, c, p) : load_slices(file, c, off, n, &p, 0)) != LOOM_OK)
		return rc;
	if (!m || !v)
		return LOOM_OK;
	if (loom__muon_has_state(dir))
		return loom_seterr(LOOM_EMISMATCH, "resume: %s was written with --optimizer muon; resume with it", dir);
	snprintf(file, sizeof file, "%s/zero.json", dir);
	if (stat(file, &sb) == 0)
		return load_shards(dir, file, total, off, n, m, v);
	snprintf(file, sizeof file, "%s/optim.safetensors", dir);
	float *mv[2] = {m, v};
	return load_slices(file, c, off, n, mv, 1);
}

int loom__read_whole_state(const char *dir, const loom_model_config_t *c, float *p, float *m, float *v)
{
	return read_state(dir, c, 0, loom_model_num_params(c), 1, p, m, v);
}

int loom__read_state_range(const char *dir, const loom_model_config_t *c, size_t off, size_t n, float *p, float *m,
                           float *v)
{
	return read_state(dir, c, off, n, 0, p, m, v);
}
