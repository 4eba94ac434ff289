/* zero_ckpt.c: checkpoints of the strategies whose AdamW state is sharded over the data-parallel axis
 * (ZeRO, zero.c): the checkpoint has the layout every strategy writes (model.safetensors with the
 * parameters, optim.safetensors with the moments of every tensor under PyTorch's names), so that a
 * checkpoint of any stage and world size resumes at any other (resharding is reading another slice)
 * and `loom sample`, `info` and `convert` read it as they read DDP's.
 *
 * Save: data-parallel rank q sends its slice of m and v (the owned range, loom__zero_shard_offset), and
 * at stage 3 of the parameters, to data-parallel rank 0, the writer (global rank 0 when tp = pp = 1),
 * which assembles the whole tensors and writes them; at stages 1 and 2 the parameters are replicated
 * and the writer writes its own. The writer holds 8 (stage 3: 12) bytes per parameter more while it
 * saves and frees them after. Load: every rank reads the replicated parameters (stage 3: its slice of
 * them) and copies its own slice of each moment tensor straight from the mapped file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "parallel/strategy.h"

enum { TAG_M = 0x2e01, TAG_V = 0x2e02, TAG_P = 0x2e03 };

int loom__sharded_save(loom_strategy_t *s, const loom_ckpt_writer_t *w)
{
	char path[1200];
	float *m = NULL, *v = NULL;
	int rc = LOOM_OK, N = s->dp_size;
	float *p = NULL;
	if (s->dp_rank != 0) {
		if ((rc = loom_send(s->dp, s->opt.m, s->own_count, LOOM_FLOAT32, 0, TAG_M)) ||
		    (rc = loom_send(s->dp, s->opt.v, s->own_count, LOOM_FLOAT32, 0, TAG_V)) ||
		    (!s->params && (rc = loom_send(s->dp, s->own_params, s->own_count, LOOM_FLOAT32, 0, TAG_P))))
			return loom_seterr(rc, "zero: rank %d: sending its AdamW shard to the writer: %s", s->dp_rank,
			                   loom_comm_errmsg(s->dp));
		return LOOM_OK;
	}
	/* The writer (w NULL when it could not start the checkpoint: it still receives, then drops). */
	m = loom_alloc_aligned(LOOM_MAX(s->nparams, 1) * sizeof(float));
	v = loom_alloc_aligned(LOOM_MAX(s->nparams, 1) * sizeof(float));
	if (!s->params)
		p = loom_alloc_aligned(LOOM_MAX(s->nparams, 1) * sizeof(float));
	if (!m || !v || (!s->params && !p)) {
		rc = loom_seterr(LOOM_ENOMEM, "zero: out of memory for gathering the AdamW state of %zu parameters",
		                 s->nparams);
		/* nothing to receive into: the senders then fail on their deadline, naming rank 0 */
		goto out;
	}
	memcpy(m + s->own_offset, s->opt.m, s->own_count * sizeof(float));
	memcpy(v + s->own_offset, s->opt.v, s->own_count * sizeof(float));
	if (p)
		memcpy(p + s->own_offset, s->own_params, s->own_count * sizeof(float));
	for (int q = 1; q < N && rc == LOOM_OK; q++) {
		size_t off = loom__zero_shard_offset(s->nparams, q, N), n = loom__zero_shard_offset(s->nparams, q + 1, N) - off;
		if ((rc = loom_recv(s->dp, m + off, n, LOOM_FLOAT32, q, TAG_M)) ||
		    (rc = loom_recv(s->dp, v + off, n, LOOM_FLOAT32, q, TAG_V)) ||
		    (p && (rc = loom_recv(s->dp, p + off, n, LOOM_FLOAT32, q, TAG_P))))
			rc = loom_seterr(rc, "zero: receiving the AdamW shard of rank %d: %s", q, loom_comm_errmsg(s->dp));
	}
	if (rc != LOOM_OK || !w)
		goto out;
	if ((rc = loom_ckpt_file(w, "model.safetensors", path, sizeof path)) ||
	    (rc = loom_model_save_safetensors(path, &s->mcfg, p ? p : s->params)))
		goto out;
	if ((rc = loom_ckpt_file(w, "optim.safetensors", path, sizeof path)) ||
	    (rc = loom_optim_save(path, &s->mcfg, m, v)))
		goto out;
out:
	loom_free_aligned(p);
	loom_free_aligned(m);
	loom_free_aligned(v);
	return rc;
}

/* Copy [off, off + n) of the flat layout from file `path` into dst[0] (and dst[1]): with suffixes,
 * the moments (every tensor's "<name>.exp_avg" into dst[0], ".exp_avg_sq" into dst[1]); without, the
 * parameters (HF names, with or without "transformer."). */
static int load_slices(const char *path, const loom_gpt2_config_t *c, size_t off, size_t n, float *const *dst,
                       int moments)
{
	loom_st_t *st;
	int nt = loom_gpt2_num_tensors(c), rc;
	if ((rc = loom_st_open(&st, path)) != LOOM_OK)
		return rc;
	for (int i = 0; i < (moments ? 2 : 1) * nt && rc == LOOM_OK; i++) {
		loom_tensor_info_t info;
		char name[LOOM_TENSOR_NAME_MAX + 16];
		const loom_st_tensor_t *t;
		int k;
		loom_gpt2_tensor_info(c, i % nt, &info);
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
			memcpy(dst[i < nt ? 0 : 1] + (lo - off), (const float *)t->data + (lo - info.offset),
			       (hi - lo) * sizeof(float));
	}
	loom_st_close(st);
	return rc;
}

int loom__sharded_load(loom_strategy_t *s, const char *dir, long long step)
{
	char file[1200];
	loom_gpt2_config_t saved;
	const loom_gpt2_config_t *c = &s->mcfg;
	int rc;
	snprintf(file, sizeof file, "%s/model.safetensors", dir);
	if ((rc = loom_model_config(file, c->n_head, &saved, NULL)) != LOOM_OK)
		return rc;
	if (memcmp(&saved, c, sizeof saved) != 0)
		return loom_seterr(LOOM_EMISMATCH, "resume: %s holds a model L%d H%d C%d T%d V%d, this run's is "
		                   "L%d H%d C%d T%d V%d", file, saved.n_layer, saved.n_head, saved.n_embd, saved.seq_len,
		                   saved.vocab_size, c->n_layer, c->n_head, c->n_embd, c->seq_len, c->vocab_size);
	if (s->params && (rc = loom_model_load(file, c, s->params)) != LOOM_OK)
		return rc;
	if (!s->params) { /* stage 3: this rank's slice of the parameters */
		if ((rc = load_slices(file, c, s->own_offset, s->own_count, &s->own_params, 0)) != LOOM_OK)
			return rc;
		loom__zero_set_loaded(s);
	}
	snprintf(file, sizeof file, "%s/optim.safetensors", dir);
	float *mv[2] = {s->opt.m, s->opt.v};
	if ((rc = load_slices(file, c, s->own_offset, s->own_count, mv, 1)) != LOOM_OK)
		return rc;
	s->opt.step = step;
	return LOOM_OK;
}
