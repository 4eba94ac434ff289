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
 * A pipeline stage's model holds only its own tensors (src/parallel/pp.c), so its strategy's
 * matrices are the stage's. Its checkpoints are not written yet (the stages' state files would need
 * stage-wise names and AdamW slices): the pipeline's save refuses.
 *
 * Invariant: after each step every rank's parameters are the same bits, equal to one process's
 * MuonAdamW over the averaged gradient (each matrix is updated once, by its owner, from the same
 * bits; tests/test_muon_dist.c at 2, 3 and 4 ranks).
 *
 * Under ZeRO (zero.c) the owned ranges snap to tensor boundaries (loom__zero_muon_offsets), so every
 * matrix lies in one rank's shard: that rank owns it for Muon and the AdamW floats of its range as
 * ZeRO-1/2/3 own them; ZeRO's own reduce-scatter and all-gather move the gradients and parameters.
 *
 * Checkpoints: every rank writes muon_r<rank>.safetensors: its matrices' "<name>.momentum_buffer" and
 * "<name>.second_momentum", and the AdamW moments it owns as "adam.<lo>.<hi>.exp_avg" / ".exp_avg_sq"
 * (floats [lo, hi) of the flat layout; under plain data parallel the writer's file alone, the state
 * being replicated). Loading finds each matrix it owns in whichever file holds it and reads the
 * slices of the AdamW moments that overlap its own, so a run resumes on any number of ranks, with or
 * without ZeRO. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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
	/* its state, and with N ranks the staging of every matrix's update (loom plan counts alike) */
	s->mem.optim = (loom_muonadamw_state_floats(t, n, NULL, mine, nmine) + (N > 1 ? p->total : 0)) * sizeof(float);
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

/* MuonAdamW's partition under ZeRO: the default rule's offset moved up to the next tensor boundary,
 * so that no matrix is cut between two ranks (the ranges stay contiguous and in rank order). */
size_t loom__muon_shard_offset(const loom_tensor_info_t *t, int n, size_t nparams, int q, int N)
{
	size_t want = loom__zero_shard_offset(nparams, q, N);
	if (q <= 0 || q >= N)
		return want;
	for (int i = 0; i < n; i++)
		if (t[i].offset >= want)
			return t[i].offset;
	return nparams;
}

int loom__muon_range_matrices(const loom_tensor_info_t *t, int n, const size_t *range, int *out)
{
	int k = 0;
	for (int i = 0; i < n; i++)
		if (t[i].opt_group == LOOM_OPT_MATRIX && t[i].offset >= range[0] && t[i].offset < range[1])
			out[k++] = i;
	return k;
}

/* MuonAdamW over this rank's range: the AdamW floats of [own_offset, + own_count) and the Muon
 * matrices inside it (a pipeline stage's unused ones are left to AdamW, whose zero update is exact). */
int loom__muon_init_range(loom_strategy_t *s, const loom_strategy_config_t *cfg)
{
	int n, nm = 0, rc;
	const loom_tensor_info_t *t0 = loom_model_tensors(s->model, &n);
	loom_tensor_info_t *t = loom__malloc((size_t)n * sizeof *t);
	int *mats = loom__malloc((size_t)n * sizeof *mats);
	if (!t || !mats || !(s->muon = loom__calloc(1, sizeof *s->muon))) {
		free(t), free(mats);
		return loom_seterr(LOOM_ENOMEM, "zero: out of memory for MuonAdamW");
	}
	memcpy(t, t0, (size_t)n * sizeof *t);
	size_t range[1][2] = {{s->own_offset, s->own_offset + s->own_count}};
	nm = loom__muon_range_matrices(t, n, range[0], mats);
	loom_muon_owned_t own = {.ranges = (const size_t(*)[2])range, .nranges = 1, .matrices = mats, .nmatrices = nm};
	rc = loom_muonadamw_init(s->muon, t, n, &cfg->muon, &own);
	if (rc == LOOM_OK)
		s->mem.optim = loom_muonadamw_state_floats(t, n, range[0], mats, nm) * sizeof(float);
	free(t), free(mats);
	if (rc != LOOM_OK) {
		free(s->muon);
		s->muon = NULL;
		return rc;
	}
	return LOOM_OK;
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

/* This rank's state as one file: its matrices' "<name>.momentum_buffer" and "<name>.second_momentum",
 * and with with_adam its AdamW pieces as "adam.<lo>.<hi>.exp_avg" / ".exp_avg_sq" (floats [lo, hi) of
 * the flat layout, so any other partition reads its slices of them). */
static int write_state(loom_strategy_t *s, const char *path, int with_adam)
{
	const loom_tensor_info_t *t = loom_model_tensors(s->model, NULL);
	loom_muonadamw_t *o = s->muon;
	int na = with_adam ? 2 * o->npieces : 0, n = 2 * o->nmat + na, rc;
	loom_st_tensor_t *st = loom__calloc((size_t)LOOM_MAX(n, 1), sizeof *st);
	char (*names)[LOOM_TENSOR_NAME_MAX + 48] = loom__calloc((size_t)LOOM_MAX(n, 1), sizeof *names);
	char step[32], rank[16];
	const char *meta[6] = {"format", "loom-muon", "step", step, "rank", rank};
	if (!st || !names) {
		free(st), free(names);
		return loom_seterr(LOOM_ENOMEM, "%s: out of memory", path);
	}
	snprintf(step, sizeof step, "%lld", o->step), snprintf(rank, sizeof rank, "%d", s->dp_rank);
	for (int i = 0; i < 2 * o->nmat; i++) {
		const loom_muon_matrix_t *m = &o->mats[i % o->nmat];
		int buf = i < o->nmat;
		snprintf(names[i], sizeof names[i], "%s.%s", t[m->tensor].name, buf ? "momentum_buffer" : "second_momentum");
		st[i].shape[0] = buf ? (size_t)m->rows * m->cols : (size_t)LOOM_MAX(m->rows, m->cols);
		st[i].data = buf ? m->buf : m->s;
	}
	for (int i = 0; i < na; i++) {
		const loom_muon_adam_piece_t *pc = &o->pieces[i % o->npieces];
		int first = i < o->npieces;
		snprintf(names[2 * o->nmat + i], sizeof names[0], "adam.%zu.%zu.%s", pc->offset, pc->offset + pc->numel,
		         first ? "exp_avg" : "exp_avg_sq");
		st[2 * o->nmat + i].shape[0] = pc->numel;
		st[2 * o->nmat + i].data = (first ? o->m : o->v) + pc->state;
	}
	for (int i = 0; i < n; i++) {
		st[i].name = names[i], st[i].dtype = LOOM_ST_F32, st[i].ndim = 1;
		st[i].nbytes = st[i].shape[0] * sizeof(float);
	}
	rc = loom_st_write(path, st, n, meta, 3);
	free(st), free(names);
	return rc;
}

void loom__muon_state_name(char *buf, size_t cap, int rank)
{
	snprintf(buf, cap, "muon_r%d.safetensors", rank);
}

int loom__muon_write_shard(loom_strategy_t *s, const char *dir)
{
	char name[64], path[1300];
	loom__muon_state_name(name, sizeof name, s->dp_rank);
	snprintf(path, sizeof path, "%s/%s", dir, name);
	return write_state(s, path, 1);
}

int loom__muon_save(loom_strategy_t *s, const loom_ckpt_writer_t *w)
{
	char path[1200], name[64];
	int rc, go;
	/* has the writer begun? every rank writes into its temporary directory only then */
	if ((rc = loom__ckpt_part_begin(s, s->writer, w, "muon", &go)) != LOOM_OK || !go)
		return rc;
	if (s->writer && (rc = loom_ckpt_file(w, "model.safetensors", path, sizeof path)) == LOOM_OK)
		rc = loom_model_save_safetensors(path, &s->mcfg, s->params);
	loom__muon_state_name(name, sizeof name, s->dp_rank);
	if (rc == LOOM_OK) {
		if (w && w->active)
			rc = loom_ckpt_file(w, name, path, sizeof path);
		else
			snprintf(path, sizeof path, "%s/%s", w ? w->tmp : ".", name);
		/* the AdamW state is replicated here: the writer's file holds it */
		rc = rc ? rc : write_state(s, path, s->writer);
	}
	return loom__ckpt_part_end(s, rc, "muon");
}

int loom__muon_has_state(const char *dir)
{
	char path[1200];
	snprintf(path, sizeof path, "%s/muon_r0.safetensors", dir);
	return access(path, R_OK) == 0;
}

/* Copy tensor k (n floats, F32) of an open file into dst; LOOM_EFORMAT for another size or type. */
static int take(const loom_st_t *st, int k, float *dst, size_t n)
{
	const loom_st_tensor_t *t = loom_st_get(st, k);
	if (t->dtype != LOOM_ST_F32 || t->nbytes != n * sizeof(float))
		return loom_seterr(LOOM_EFORMAT, "%s: tensor '%s' is not F32 of %zu elements", loom_st_path(st), t->name, n);
	return loom_st_read_bytes(st, k, 0, n * sizeof(float), dst);
}

/* One file's share of what this rank owns: matrices by name, AdamW slices by overlap. */
static int read_state_file(loom_strategy_t *s, const char *path, unsigned char *got, size_t *adam_floats)
{
	const loom_tensor_info_t *t = loom_model_tensors(s->model, NULL);
	loom_muonadamw_t *o = s->muon;
	char name[LOOM_TENSOR_NAME_MAX + 48];
	loom_st_t *st;
	int rc;
	if ((rc = loom_st_open(&st, path)) != LOOM_OK)
		return rc;
	for (int k = 0; k < o->nmat && rc == LOOM_OK; k++) {
		loom_muon_matrix_t *m = &o->mats[k];
		snprintf(name, sizeof name, "%s.momentum_buffer", t[m->tensor].name);
		int i = loom_st_find(st, name);
		if (i < 0)
			continue;
		if ((rc = take(st, i, m->buf, (size_t)m->rows * m->cols)) != LOOM_OK)
			break;
		snprintf(name, sizeof name, "%s.second_momentum", t[m->tensor].name);
		if ((i = loom_st_find(st, name)) < 0)
			rc = loom_seterr(LOOM_EFORMAT, "%s: missing tensor '%s'", path, name);
		else
			rc = take(st, i, m->s, (size_t)LOOM_MAX(m->rows, m->cols));
		got[k] = 1;
	}
	for (int i = 0; i < loom_st_count(st) && rc == LOOM_OK; i++) {
		const loom_st_tensor_t *tt = loom_st_get(st, i);
		size_t lo, hi;
		char kind[16];
		if (sscanf(tt->name, "adam.%zu.%zu.%15s", &lo, &hi, kind) != 3)
			continue;
		int first = strcmp(kind, "exp_avg") == 0;
		if ((!first && strcmp(kind, "exp_avg_sq") != 0) || hi < lo || tt->dtype != LOOM_ST_F32 ||
		    tt->nbytes != (hi - lo) * sizeof(float)) {
			rc = loom_seterr(LOOM_EFORMAT, "%s: tensor '%s' is not an AdamW moment slice of F32", path, tt->name);
			break;
		}
		for (int k = 0; k < o->npieces; k++) {
			const loom_muon_adam_piece_t *pc = &o->pieces[k];
			size_t a = LOOM_MAX(lo, pc->offset), b = LOOM_MIN(hi, pc->offset + pc->numel);
			if (a >= b)
				continue;
			if ((rc = loom_st_read_bytes(st, i, (a - lo) * sizeof(float), (b - a) * sizeof(float),
			                             (first ? o->m : o->v) + pc->state + (a - pc->offset))) != LOOM_OK)
				break;
			*adam_floats += b - a;
		}
	}
	loom_st_close(st);
	return rc;
}

int loom__muon_load_state(loom_strategy_t *s, const char *dir, long long step)
{
	const loom_tensor_info_t *t = loom_model_tensors(s->model, NULL);
	loom_muonadamw_t *o = s->muon;
	char path[1400];
	int rc = LOOM_OK;
	size_t adam = 0;
	if (!loom__muon_has_state(dir))
		return loom_seterr(LOOM_EMISMATCH, "resume: %s has no MuonAdamW state (muon_r0.safetensors): it was "
		                   "written with --optimizer adamw; resume with that optimizer", dir);
	/* each owned matrix and AdamW slice from whichever rank's file holds it (any world size wrote them) */
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
		rc = read_state_file(s, path, got, &adam);
	}
	closedir(d);
	for (int k = 0; rc == LOOM_OK && k < o->nmat; k++)
		if (!got[k])
			rc = loom_seterr(LOOM_EFORMAT, "resume: %s: no muon_r*.safetensors holds the state of '%s'", dir,
			                 t[o->mats[k].tensor].name);
	free(got);
	if (rc == LOOM_OK && adam != 2 * o->adam_n)
		rc = loom_seterr(LOOM_EFORMAT, "resume: %s: the muon_r*.safetensors files hold %zu of this rank's %zu AdamW "
		                 "moment floats", dir, adam, 2 * o->adam_n);
	if (rc == LOOM_OK)
		o->step = step;
	return rc;
}

int loom__muon_load(loom_strategy_t *s, const char *dir, long long step)
{
	char path[1400];
	loom_model_config_t saved;
	struct stat sb;
	int rc;
	snprintf(path, sizeof path, "%s/zero.json", dir);
	if (stat(path, &sb) == 0) /* written by a ZeRO strategy: the same state files, the same reader */
		return loom__sharded_load(s, dir, step);
	if (!loom__muon_has_state(dir))
		return loom__muon_load_state(s, dir, step); /* says which optimizer wrote it */
	snprintf(path, sizeof path, "%s/model.safetensors", dir);
	if ((rc = loom_model_config(path, s->mcfg.n_head, &saved, NULL)) != LOOM_OK)
		return rc;
	if (!loom_model_config_equal(&saved, &s->mcfg))
		return loom_seterr(LOOM_EMISMATCH, "resume: %s holds another model than this run's", path);
	if ((rc = loom_model_load(path, &s->mcfg, s->params)) != LOOM_OK)
		return rc;
	return loom__muon_load_state(s, dir, step);
}
