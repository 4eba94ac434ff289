/* strategy.c: the choice of a parallel strategy as a table, and the whole-state operations shared by
 * the strategies whose every rank holds the whole training state (local.c, ddp.c).
 *
 * The table is the rule: a row matches the trainer's `strategy` name, its ZeRO stage and whether the
 * data-parallel axis has one rank or several; loom__strategy_describe prints the same rows, so the
 * rule and its description cannot disagree. ZeRO (issue 8) adds rows, not branches. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/util.h"
#include "loom/ckpt.h"
#include "parallel/strategy.h"

static const struct {
	const char *name;
	int zero;
	int several; /* 0: the data-parallel axis has one rank; 1: more than one; -1: either */
	int tensor;  /* 1: the tensor-parallel axis has more than one rank; 0: one; -1: either */
	const loom_strategy_ops_t *(*ops)(void);
	const char *what;
	int no_own_grads, no_own_params; /* the model needs no gradient (parameter) buffer of its own */
} strategies[] = {
	{"ddp", 0, 0, 0, loom__local_strategy, "the model's own gradients and one optimizer; nothing is communicated"},
	{"ddp", 0, 1, 0, loom__ddp_strategy, "every rank holds all parameters and AdamW state; gradients are averaged "
	                                 "in buckets of shared memory while backward runs"},
	{"ddp", 0, -1, 1, loom__tp_strategy, "each rank of a tensor-parallel group holds a shard (heads, MLP columns, "
	                                 "vocabulary rows) and all-reduces activations in every pass; shards are "
	                                 "averaged across data-parallel ranks as DDP does"},
	{"ddp", 1, 1, -1, loom__zero1_strategy, "ZeRO-1: each rank keeps AdamW state for its 1/N of the parameters (of its "
	                                 "tensor-parallel shard, with tp > 1); "
	                                 "gradients are reduce-scattered per unit on the last micro-step, the "
	                                 "updated parameters all-gathered"},
	{"ddp", 2, 1, -1, loom__zero2_strategy, "ZeRO-2: as ZeRO-1, and each rank keeps only its 1/N of the gradients; "
	                                 "every micro-step reduce-scatters each unit as backward finishes it", 1, 0},
	{"ddp", 3, 1, -1, loom__zero3_strategy, "ZeRO-3 (fully sharded): as ZeRO-2, and each rank keeps only its 1/N of "
	                                 "the parameters; each unit is all-gathered just before it runs, the next "
	                                 "one prefetched", 1, 1},
};

void loom__strategy_model_opts(const char *name, int zero, int dp, int tp, int *no_own_grads, int *no_own_params)
{
	*no_own_grads = *no_own_params = 0;
	name = name && *name ? name : "ddp";
	for (size_t k = 0; k < LOOM_ARRAY_LEN(strategies); k++)
		if (strcmp(strategies[k].name, name) == 0 && strategies[k].zero == zero &&
		    (strategies[k].several < 0 || strategies[k].several == (dp > 1)) &&
		    (strategies[k].tensor < 0 || strategies[k].tensor == (tp > 1))) {
			*no_own_grads = strategies[k].no_own_grads, *no_own_params = strategies[k].no_own_params;
			return;
		}
}

void loom__strategy_describe(char *buf, size_t cap)
{
	size_t len = 0;
	if (cap)
		buf[0] = 0;
	for (size_t k = 0; k < LOOM_ARRAY_LEN(strategies) && len < cap; k++) {
		int n = snprintf(buf + len, cap - len, "%s zero=%d %s%s: %s: %s\n", strategies[k].name, strategies[k].zero,
		                 strategies[k].several < 0 ? "ranks>=1" : strategies[k].several ? "ranks>1" : "ranks=1",
		                 strategies[k].tensor > 0 ? " tp>1" : strategies[k].tensor < 0 ? " tp>=1" : "", strategies[k].ops()->name, strategies[k].what);
		if (n < 0)
			break;
		len += (size_t)n;
	}
}

int loom__strategy_create(loom_strategy_t **out, const loom_strategy_config_t *cfg)
{
	const char *name = cfg->name && *cfg->name ? cfg->name : "ddp";
	int several = cfg->dp && loom_comm_size(cfg->dp) > 1, tensor = cfg->tp && loom_comm_size(cfg->tp) > 1, named = 0;
	*out = NULL;
	if (cfg->optimizer == LOOM_OPTIMIZER_MUON && tensor)
		return loom_seterr(LOOM_ENOTSUP, "trainer: --optimizer muon with --tp > 1: a tensor-parallel shard of a "
		                   "matrix cannot be orthogonalized alone (MuonAdamW runs with data parallel, ZeRO 1-3 and "
		                   "pipeline stages)");
	if (cfg->optimizer == LOOM_OPTIMIZER_MUON && cfg->zero > 0 && cfg->deferred)
		return loom_seterr(LOOM_ENOTSUP, "trainer: --optimizer muon with --zero %d and --pp: MuonAdamW's matrices are "
		                   "not sharded over a pipeline stage's data-parallel ranks yet (use --zero 0 with --pp)",
		                   cfg->zero);
	for (size_t k = 0; k < LOOM_ARRAY_LEN(strategies); k++) {
		if (strcmp(strategies[k].name, name) != 0)
			continue;
		named = 1;
		if (strategies[k].zero == cfg->zero && (strategies[k].several < 0 || strategies[k].several == several) &&
		    (strategies[k].tensor < 0 || strategies[k].tensor == tensor))
			return strategies[k].ops()->create(out, cfg);
	}
	if (!named)
		return loom_seterr(LOOM_ENOTSUP, "trainer: parallel strategy '%s' does not exist (available: ddp)", name);
	if (cfg->zero > 0 && !several)
		return loom_seterr(LOOM_ENOTSUP, "trainer: ZeRO stage %d shards the training state over the data-parallel "
		                   "ranks and needs more than one (run under `loom run`/mpirun/srun, or --zero 0)", cfg->zero);
	return loom_seterr(LOOM_ENOTSUP, "trainer: strategy '%s' with ZeRO stage %d is not implemented (available: "
	                   "zero = 0, 1, 2, 3)", name, cfg->zero);
}

void loom__strategy_destroy(loom_strategy_t *s)
{
	if (s)
		s->ops->destroy(s);
}

int loom__replica_init(loom_strategy_t *s, const loom_strategy_config_t *cfg, float *grads)
{
	s->model = cfg->model;
	s->mcfg = *loom_model_get_config(cfg->model);
	s->dp = cfg->dp;
	s->dp_rank = cfg->dp ? loom_comm_rank(cfg->dp) : 0;
	s->dp_size = cfg->dp ? loom_comm_size(cfg->dp) : 1;
	s->writer = cfg->writer;
	s->norm_skip = cfg->norm_skip;
	s->params = loom_model_params(cfg->model);
	s->grads = grads;
	s->nparams = loom_model_param_count(cfg->model); /* the model's: a tp shard's, a pipeline stage's */
	s->own_offset = 0, s->own_count = s->nparams;
	s->own_grads = grads;
	s->own_params = s->params;
	s->mem.params = s->mem.grads = s->nparams * sizeof(float);
	s->mem.optim = 2 * s->nparams * sizeof(float);
	s->mem.comm = 0;
	if (cfg->optimizer == LOOM_OPTIMIZER_MUON)
		return loom__muon_init(s, cfg);
	int nt;
	const loom_tensor_info_t *ti = loom_model_tensors(cfg->model, &nt);
	return loom_adamw_init_table_range(&s->opt, &cfg->adamw, ti, nt, s->nparams, 0, s->nparams);
}

void loom__replica_free(loom_strategy_t *s)
{
	loom_adamw_free(&s->opt);
	loom__muon_free(s);
}

int loom__replica_grad_norm(loom_strategy_t *s, double *norm)
{
	int n;
	const loom_tensor_info_t *ti;
	if (!s->norm_skip) {
		*norm = loom_grad_norm(s->grads, s->nparams);
		return LOOM_OK;
	}
	double sq = 0.0; /* tensor by tensor: a copy another pipeline stage owns is left out */
	ti = loom_model_tensors(s->model, &n);
	for (int t = 0; t < n; t++)
		if (!s->norm_skip[t])
			sq += loom_grad_sumsq(s->grads + ti[t].offset, ti[t].numel);
	*norm = sqrt(sq);
	return LOOM_OK;
}

int loom__replica_optim_step(loom_strategy_t *s, float lr, float grad_scale)
{
	if (s->muon)
		return loom__muon_step(s, lr, grad_scale);
	return loom_adamw_step(&s->opt, s->params, s->grads, lr, grad_scale);
}

int loom__replica_save(loom_strategy_t *s, const loom_ckpt_writer_t *w)
{
	char path[1200];
	int rc;
	if (s->muon) /* each rank has its own matrices' state */
		return loom__muon_save(s, w);
	if (!w || !w->active) /* every rank holds the same state: the writer alone writes it */
		return LOOM_OK;
	if ((rc = loom_ckpt_file(w, "model.safetensors", path, sizeof path)) ||
	    (rc = loom_model_save_safetensors(path, &s->mcfg, s->params)))
		return rc;
	if ((rc = loom_ckpt_file(w, "optim.safetensors", path, sizeof path)) ||
	    (rc = loom_optim_save(path, &s->mcfg, s->opt.m, s->opt.v)))
		return rc;
	return LOOM_OK;
}

int loom__replica_load(loom_strategy_t *s, const char *dir, long long step)
{
	char file[1200];
	const loom_model_config_t *c = &s->mcfg;
	int rc;
	struct stat sb;
	if (s->muon)
		return loom__muon_load(s, dir, step);
	if (loom__muon_has_state(dir))
		return loom_seterr(LOOM_EMISMATCH, "resume: %s was written with --optimizer muon; resume with it", dir);
	snprintf(file, sizeof file, "%s/zero.json", dir);
	if (stat(file, &sb) == 0) /* written by a ZeRO strategy: the moments are in shards */
		return loom__sharded_load(s, dir, step);
	snprintf(file, sizeof file, "%s/model.safetensors", dir);
	if ((rc = loom__check_ckpt_model(file, c)) != LOOM_OK)
		return rc;
	if ((rc = loom_model_load(file, c, s->params)) != LOOM_OK)
		return rc;
	snprintf(file, sizeof file, "%s/optim.safetensors", dir);
	if ((rc = loom_optim_load(file, c, s->opt.m, s->opt.v)) != LOOM_OK)
		return rc;
	s->opt.step = step;
	return LOOM_OK;
}

/* Rank q's range: the strategy's rule (shard_off), ZeRO's default, or everything for a replica. */
static size_t range_at(const loom_strategy_t *s, int q)
{
	if (s->own_count == s->nparams)
		return q == 0 ? 0 : s->nparams;
	return s->shard_off ? s->shard_off[q] : loom__zero_shard_offset(s->nparams, q, s->dp_size);
}

static int export_one(loom_strategy_t *s, const float *mine, float *whole, size_t *counts)
{
	if (s->own_count == s->nparams || !s->dp) {
		if (whole != mine)
			memcpy(whole, mine, s->nparams * sizeof(float));
		return LOOM_OK;
	}
	int rc = loom_allgatherv(s->dp, mine, s->own_count, whole, counts, LOOM_FLOAT32);
	if (rc != LOOM_OK)
		return loom_seterr(rc, "rank %d of %d data-parallel: gathering the owned ranges of the training state: %s",
		                   s->dp_rank, s->dp_size, loom_comm_errmsg(s->dp));
	return LOOM_OK;
}

int loom__strategy_export(loom_strategy_t *s, float *p, float *m, float *v)
{
	if (s->muon && (m || v))
		return loom_seterr(LOOM_ENOTSUP, "trainer: MuonAdamW's state is per matrix and rank: it is not gathered as "
		                   "a flat buffer");
	return s->ops->export_state ? s->ops->export_state(s, p, m, v) : loom__strategy_export_owned(s, p, m, v);
}

int loom__strategy_state_views(loom_strategy_t *s, float **p, float **m, float **v)
{
	if (s->muon || s->ops->export_state || !s->params || (s->own_count != s->nparams && s->dp))
		return LOOM_ENOTSUP;
	*p = s->params, *m = s->opt.m, *v = s->opt.v;
	return LOOM_OK;
}

int loom__strategy_export_owned(loom_strategy_t *s, float *p, float *m, float *v)
{
	int rc;
	size_t *counts = loom__calloc((size_t)s->dp_size, sizeof *counts);
	if (!counts)
		return loom_seterr(LOOM_ENOMEM, "trainer: out of memory");
	for (int q = 0; q < s->dp_size; q++)
		counts[q] = range_at(s, q + 1) - range_at(s, q);
	rc = LOOM_OK;
	if (p && s->params) /* kept whole (and current: ZeRO settles its gathers in export_state) */
		memcpy(p, s->params, s->nparams * sizeof(float));
	else if (p)
		rc = export_one(s, s->own_params, p, counts);
	if (rc == LOOM_OK && m)
		rc = export_one(s, s->opt.m, m, counts);
	if (rc == LOOM_OK && v)
		rc = export_one(s, s->opt.v, v, counts);
	free(counts);
	return rc;
}

int loom__strategy_import(loom_strategy_t *s, const float *p, const float *m, const float *v, long long step)
{
	if (s->muon)
		return loom_seterr(LOOM_ENOTSUP, "trainer: MuonAdamW's state is per matrix and rank: it is not read from a "
		                   "flat buffer");
	return s->ops->import_state ? s->ops->import_state(s, p, m, v, step) : loom__strategy_import_owned(s, p, m, v, step);
}

int loom__strategy_import_owned(loom_strategy_t *s, const float *p, const float *m, const float *v, long long step)
{
	if (p && s->params)
		memcpy(s->params, p, s->nparams * sizeof(float));
	else if (p)
		memcpy(s->own_params, p + s->own_offset, s->own_count * sizeof(float));
	if (m)
		memcpy(s->opt.m, m + s->own_offset, s->own_count * sizeof(float));
	if (v)
		memcpy(s->opt.v, v + s->own_offset, s->own_count * sizeof(float));
	s->opt.step = step;
	return LOOM_OK;
}
