/* muon_opt.c: MuonAdamW (loom/muon.h, --optimizer muon) as the optimizer of the replica strategies
 * (local, ddp: every rank holds the whole averaged gradient after finish_grads).
 *
 * With one data-parallel rank the optimizer updates every tensor. With N, it is nanochat's
 * DistMuonAdamW's division of work: the K same-shape Muon matrices of a group are dealt in contiguous
 * chunks of ceil(K/N) per rank (loom_muon_owned), the owner alone runs the Muon update (momentum,
 * Polar Express, NorMuon, cautious decay) and keeps the matrix's momentum and second moment, and one
 * all-gather over the data-parallel axis brings every rank the updated matrices. The gradient reaches
 * the owner by DDP's all-reduce (the strategy's buckets, overlapped with backward), which gives every
 * rank the same averaged bits; nanochat reduce-scatters each matrix to its owner instead: the same
 * mean, half the traffic, no overlap. AdamW's tensors are updated on every rank (replicated state,
 * tiny next to the matrices' Muon work); sharding them is ZeRO's job (docs/muon.md).
 *
 * A pipeline stage's strategy owns only the matrices its stage uses (tensor_used); the others have
 * zero gradients there, and Muon's cautious decay would move them (X = 0 passes the mask), so they
 * are AdamW's, whose update of a zero gradient from zero moments is exactly 0.
 *
 * Invariant: after each step every rank's parameters are the same bits, equal to one process's
 * MuonAdamW over the averaged gradient (each matrix is updated once, by its owner, from the same
 * bits; tests/test_muon_dist.c at 2, 3 and 4 ranks).
 *
 * Checkpoints: the writer writes the AdamW moments (muon_adamw.safetensors, "<name>.exp_avg" and
 * ".exp_avg_sq") and every rank its matrices' state (muon_r<rank>.safetensors,
 * "<name>.momentum_buffer" and "<name>.second_momentum"); loading finds each matrix it owns in
 * whichever muon_r*.safetensors holds it, so a run resumes on any number of ranks. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/util.h"
#include "loom/muon.h"
#include "parallel/strategy.h"

struct loom__muon_plan {
	int nmat;       /* Muon matrices in all (the all-gather's order: rank 0's, then rank 1's, ...) */
	int *order;     /* tensor indices in that order */
	size_t *counts; /* floats each rank contributes */
	float *stage;   /* the all-gather's buffer: every Muon matrix's floats */
	size_t total;
};

void loom__muon_free(loom_strategy_t *s)
{
	if (s->muon) {
		loom_muonadamw_free(s->muon);
		free(s->muon);
		s->muon = NULL;
	}
	if (s->muon_plan) {
		free(s->muon_plan->order), free(s->muon_plan->counts);
		loom_free_aligned(s->muon_plan->stage);
		free(s->muon_plan);
		s->muon_plan = NULL;
	}
}

int loom__muon_init(loom_strategy_t *s, const loom_strategy_config_t *cfg)
{
	int n, rc = LOOM_ENOMEM, N = s->dp_size;
	const loom_tensor_info_t *t0 = loom_model_tensors(s->model, &n);
	loom_tensor_info_t *t = loom__malloc((size_t)n * sizeof *t);
	int *mine = loom__malloc((size_t)n * sizeof *mine);
	struct loom__muon_plan *p = loom__calloc(1, sizeof *p);
	if (!t || !mine || !p)
		goto fail;
	s->muon_plan = p;
	memcpy(t, t0, (size_t)n * sizeof *t);
	for (int i = 0; i < n; i++) /* a pipeline stage's unused matrices: AdamW's (a zero update) */
		if (t[i].opt_group == LOOM_OPT_MATRIX && cfg->tensor_used && !cfg->tensor_used[i])
			t[i].opt_group = LOOM_OPT_VECTOR;
	if (!(p->order = loom__malloc((size_t)n * sizeof *p->order)) || !(p->counts = loom__calloc((size_t)N, sizeof *p->counts)))
		goto fail;
	int nmine = 0;
	for (int r = 0; r < N; r++) {
		int k = loom_muon_owned(t, n, r, N, p->order + p->nmat);
		for (int j = 0; j < k; j++)
			p->counts[r] += t[p->order[p->nmat + j]].numel;
		if (r == s->dp_rank) {
			memcpy(mine, p->order + p->nmat, (size_t)k * sizeof *mine);
			nmine = k;
		}
		p->nmat += k;
		p->total += p->counts[r];
	}
	if (N > 1 && !(p->stage = loom_alloc_aligned(LOOM_MAX(p->total, 1) * sizeof(float))))
		goto fail;
	loom_muon_owned_t own = {.ranges = NULL, .nranges = 0, .matrices = mine, .nmatrices = nmine};
	if (!(s->muon = loom__calloc(1, sizeof *s->muon)))
		goto fail;
	if ((rc = loom_muonadamw_init(s->muon, t, n, &cfg->muon, &own)) != LOOM_OK) {
		free(s->muon);
		s->muon = NULL;
		goto out;
	}
	s->mem.optim = (2 * s->muon->adam_n) * sizeof(float) + (N > 1 ? p->total * sizeof(float) : 0);
	for (int k = 0; k < s->muon->nmat; k++) {
		const loom_muon_matrix_t *m = &s->muon->mats[k];
		s->mem.optim += ((size_t)m->rows * m->cols + (size_t)LOOM_MAX(m->rows, m->cols)) * sizeof(float);
	}
	rc = LOOM_OK;
	goto out;
fail:
	rc = loom_seterr(LOOM_ENOMEM, "muon: out of memory for the optimizer's plan");
out:
	free(t), free(mine);
	if (rc != LOOM_OK)
		loom__muon_free(s);
	return rc;
}

int loom__muon_step(loom_strategy_t *s, float lr_multiplier, float grad_scale)
{
	struct loom__muon_plan *p = s->muon_plan;
	const loom_tensor_info_t *t = loom_model_tensors(s->model, NULL);
	int rc;
	if ((rc = loom_muonadamw_step(s->muon, s->params, s->grads, lr_multiplier, grad_scale)) != LOOM_OK)
		return rc;
	if (s->dp_size <= 1 || p->total == 0)
		return LOOM_OK;
	/* every rank's updated matrices to every rank: pack in the plan's order, all-gather, unpack */
	size_t off = 0, mine = 0;
	for (int r = 0; r < s->dp_rank; r++)
		off += p->counts[r];
	size_t at = 0;
	for (int k = 0; k < p->nmat; k++) {
		const loom_tensor_info_t *ti = &t[p->order[k]];
		if (at >= off && at < off + p->counts[s->dp_rank])
			memcpy(p->stage + at, s->params + ti->offset, ti->numel * sizeof(float)), mine += ti->numel;
		at += ti->numel;
	}
	if ((rc = loom_allgatherv(s->dp, p->stage + off, mine, p->stage, p->counts, LOOM_FLOAT32)) != LOOM_OK)
		return loom_seterr(rc, "muon: rank %d: gathering the updated matrices: %s", s->dp_rank,
		                   loom_comm_errmsg(s->dp));
	at = 0;
	for (int k = 0; k < p->nmat; k++) {
		const loom_tensor_info_t *ti = &t[p->order[k]];
		if (at < off || at >= off + mine)
			memcpy(s->params + ti->offset, p->stage + at, ti->numel * sizeof(float));
		at += ti->numel;
	}
	return LOOM_OK;
}

/* ---- checkpoints -------------------------------------------------------------------------------- */

static int save_adamw(loom_strategy_t *s, const char *path)
{
	const loom_tensor_info_t *t = loom_model_tensors(s->model, NULL);
	loom_muonadamw_t *o = s->muon;
	int n = 2 * o->npieces, rc;
	loom_st_tensor_t *st = loom__calloc((size_t)LOOM_MAX(n, 1), sizeof *st);
	char (*names)[LOOM_TENSOR_NAME_MAX + 32] = loom__calloc((size_t)LOOM_MAX(n, 1), sizeof *names);
	char step[32];
	const char *meta[4] = {"loom", "muon-adamw", "step", step};
	if (!st || !names) {
		free(st), free(names);
		return loom_seterr(LOOM_ENOMEM, "%s: out of memory", path);
	}
	snprintf(step, sizeof step, "%lld", o->step);
	for (int i = 0; i < n; i++) {
		const loom_muon_adam_piece_t *pc = &o->pieces[i % o->npieces];
		snprintf(names[i], sizeof names[i], "%s.%s", t[pc->tensor].name, i < o->npieces ? "exp_avg" : "exp_avg_sq");
		st[i].name = names[i], st[i].dtype = LOOM_ST_F32, st[i].ndim = 1, st[i].shape[0] = pc->numel;
		st[i].data = (i < o->npieces ? o->m : o->v) + pc->state, st[i].nbytes = pc->numel * sizeof(float);
	}
	rc = loom_st_write(path, st, n, meta, 2);
	free(st), free(names);
	return rc;
}

static int save_matrices(loom_strategy_t *s, const char *path)
{
	const loom_tensor_info_t *t = loom_model_tensors(s->model, NULL);
	loom_muonadamw_t *o = s->muon;
	int n = 2 * o->nmat, rc;
	loom_st_tensor_t *st = loom__calloc((size_t)LOOM_MAX(n, 1), sizeof *st);
	char (*names)[LOOM_TENSOR_NAME_MAX + 32] = loom__calloc((size_t)LOOM_MAX(n, 1), sizeof *names);
	const char *meta[2] = {"loom", "muon-matrices"};
	if (!st || !names) {
		free(st), free(names);
		return loom_seterr(LOOM_ENOMEM, "%s: out of memory", path);
	}
	for (int i = 0; i < n; i++) {
		const loom_muon_matrix_t *m = &o->mats[i % o->nmat];
		int buf = i < o->nmat;
		snprintf(names[i], sizeof names[i], "%s.%s", t[m->tensor].name, buf ? "momentum_buffer" : "second_momentum");
		st[i].name = names[i], st[i].dtype = LOOM_ST_F32, st[i].ndim = 1;
		st[i].shape[0] = buf ? (size_t)m->rows * m->cols : (size_t)LOOM_MAX(m->rows, m->cols);
		st[i].data = buf ? m->buf : m->s, st[i].nbytes = st[i].shape[0] * sizeof(float);
	}
	rc = loom_st_write(path, st, n, meta, 1);
	free(st), free(names);
	return rc;
}

int loom__muon_save(loom_strategy_t *s, const loom_ckpt_writer_t *w)
{
	char path[1200], name[64];
	int rc = LOOM_OK, ok = !s->writer || (w && w->active), all = ok;
	/* has the writer begun? every rank writes into its temp directory only then */
	if (s->dp_size > 1 && (rc = loom_allreduce(s->dp, &ok, &all, 1, LOOM_INT32, LOOM_MIN)) != LOOM_OK)
		return loom_seterr(rc, "muon: rank %d: starting the checkpoint: %s", s->dp_rank, loom_comm_errmsg(s->dp));
	if (!all)
		return s->writer ? LOOM_OK : loom_seterr(LOOM_EIO, "muon: rank %d: the writer could not begin the checkpoint",
		                                         s->dp_rank);
	if (s->writer) {
		if ((rc = loom_ckpt_file(w, "model.safetensors", path, sizeof path)) == LOOM_OK &&
		    (rc = loom_model_save_safetensors(path, &s->mcfg, s->params)) == LOOM_OK &&
		    (rc = loom_ckpt_file(w, "muon_adamw.safetensors", path, sizeof path)) == LOOM_OK)
			rc = save_adamw(s, path);
	}
	snprintf(name, sizeof name, "muon_r%d.safetensors", s->dp_rank);
	if (rc == LOOM_OK) {
		if (w && w->active)
			rc = loom_ckpt_file(w, name, path, sizeof path);
		else
			snprintf(path, sizeof path, "%s/%s", w ? w->tmp : ".", name);
		rc = rc ? rc : save_matrices(s, path);
	}
	int mine = rc == LOOM_OK, r;
	if (s->dp_size > 1) {
		if ((r = loom_allreduce(s->dp, &mine, &all, 1, LOOM_INT32, LOOM_MIN)) != LOOM_OK)
			return loom_seterr(r, "muon: rank %d: finishing the checkpoint: %s", s->dp_rank, loom_comm_errmsg(s->dp));
		if (rc == LOOM_OK && !all)
			rc = loom_seterr(LOOM_EIO, "muon: rank %d: another rank failed to write its part of the checkpoint",
			                 s->dp_rank);
	}
	return rc;
}

/* Copy tensor `name` (n floats, F32) of an open file into dst; 1 when found, 0 when absent, < 0 on a
 * wrong size. */
static int take(const loom_st_t *st, const char *name, float *dst, size_t n)
{
	int k = loom_st_find(st, name);
	if (k < 0)
		return 0;
	const loom_st_tensor_t *t = loom_st_get(st, k);
	if (t->dtype != LOOM_ST_F32 || t->nbytes != n * sizeof(float))
		return loom_seterr(LOOM_EFORMAT, "%s: tensor '%s' is not F32 of %zu elements", loom_st_path(st), name, n);
	memcpy(dst, t->data, n * sizeof(float));
	return 1;
}

int loom__muon_load(loom_strategy_t *s, const char *dir, long long step)
{
	const loom_tensor_info_t *t = loom_model_tensors(s->model, NULL);
	loom_muonadamw_t *o = s->muon;
	char path[1400], name[LOOM_TENSOR_NAME_MAX + 32];
	loom_st_t *st = NULL;
	loom_model_config_t saved;
	int rc, found;
	snprintf(path, sizeof path, "%s/muon_adamw.safetensors", dir);
	if (access(path, R_OK) != 0)
		return loom_seterr(LOOM_EMISMATCH, "resume: %s has no MuonAdamW state (muon_adamw.safetensors): it was "
		                   "written with --optimizer adamw; resume with that optimizer", dir);
	snprintf(path, sizeof path, "%s/model.safetensors", dir);
	if ((rc = loom_model_config(path, s->mcfg.n_head, &saved, NULL)) != LOOM_OK)
		return rc;
	if (!loom_model_config_equal(&saved, &s->mcfg))
		return loom_seterr(LOOM_EMISMATCH, "resume: %s holds another model than this run's", path);
	if ((rc = loom_model_load(path, &s->mcfg, s->params)) != LOOM_OK)
		return rc;
	snprintf(path, sizeof path, "%s/muon_adamw.safetensors", dir);
	if ((rc = loom_st_open(&st, path)) != LOOM_OK)
		return rc;
	for (int i = 0; i < 2 * o->npieces; i++) {
		const loom_muon_adam_piece_t *pc = &o->pieces[i % o->npieces];
		snprintf(name, sizeof name, "%s.%s", t[pc->tensor].name, i < o->npieces ? "exp_avg" : "exp_avg_sq");
		if ((found = take(st, name, (i < o->npieces ? o->m : o->v) + pc->state, pc->numel)) <= 0) {
			rc = found < 0 ? found : loom_seterr(LOOM_EFORMAT, "%s: missing tensor '%s'", path, name);
			break;
		}
	}
	loom_st_close(st);
	if (rc != LOOM_OK)
		return rc;
	/* each owned matrix's state from whichever rank's file holds it (any world size wrote them) */
	unsigned char *got = loom__calloc((size_t)LOOM_MAX(o->nmat, 1), 1);
	DIR *d = opendir(dir);
	struct dirent *e;
	if (!got || !d) {
		free(got);
		if (d)
			closedir(d);
		return loom_seterr(got ? LOOM_ESYS : LOOM_ENOMEM, "resume: %s: cannot list the Muon state files", dir);
	}
	while (rc == LOOM_OK && (e = readdir(d))) {
		if (strncmp(e->d_name, "muon_r", 6) != 0 || !strstr(e->d_name, ".safetensors"))
			continue;
		snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
		if ((rc = loom_st_open(&st, path)) != LOOM_OK)
			break;
		for (int k = 0; k < o->nmat && rc == LOOM_OK; k++) {
			loom_muon_matrix_t *m = &o->mats[k];
			snprintf(name, sizeof name, "%s.momentum_buffer", t[m->tensor].name);
			if ((found = take(st, name, m->buf, (size_t)m->rows * m->cols)) < 0) {
				rc = found;
			} else if (found) {
				snprintf(name, sizeof name, "%s.second_momentum", t[m->tensor].name);
				if ((found = take(st, name, m->s, (size_t)LOOM_MAX(m->rows, m->cols))) <= 0)
					rc = found < 0 ? found : loom_seterr(LOOM_EFORMAT, "%s: missing tensor '%s'", path, name);
				got[k] = 1;
			}
		}
		loom_st_close(st);
	}
	closedir(d);
	for (int k = 0; rc == LOOM_OK && k < o->nmat; k++)
		if (!got[k])
			rc = loom_seterr(LOOM_EFORMAT, "resume: %s: no muon_r*.safetensors holds the state of '%s'", dir,
			                 t[o->mats[k].tensor].name);
	free(got);
	if (rc == LOOM_OK)
		o->step = step;
	return rc;
}
