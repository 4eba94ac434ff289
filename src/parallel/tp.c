/* tp.c: the "tensor parallel" strategy (Megatron-LM): each rank of a tensor-parallel group holds a
 * shard of the model (loom_model_opts_t's tp_size/tp_rank: heads, MLP columns, vocabulary rows) and
 * gives the model its reduction (an all-reduce over the group's communicator) for the f and g points
 * of every pass; the data-parallel axis, when it has several ranks, averages each shard's gradients
 * with the DDP reducer (loom/ddp.h, buckets overlapped with backward) among the ranks that hold the
 * same shard (with pipeline parallel: the stage's tensors, which its model holds alone; the pipeline
 * executor adds the stages together, src/parallel/pp.c).
 *
 * Invariant (checked by tests/test_tp.c against one process at the same total batch): after every
 * step, unsharding the group's parameters (loom_model_tp_unshard of each rank's shard) gives the
 * parameters one whole-model process would have, up to float rounding (the reductions sum in another
 * order); the replicated tensors (LayerNorms, wpe, the row-parallel biases) are bit-identical on the
 * ranks of a group, because every value they are computed from comes out of an all-reduce that gives
 * every rank the same bits; the ranks that hold the same shard on the data-parallel axis are
 * bit-identical (DDP's invariant). The gradient norm sums the squares of the split tensors over the
 * group (one all-reduce of a double) and adds those of the replicated ones once.
 *
 * Checkpoints are always whole: save all-gathers the group's shards and the writer writes the full
 * HF-layout tensors (model.safetensors, optim.safetensors), so a checkpoint of any tp loads at any
 * other tp, in `loom sample` and in PyTorch; load reads the full tensors and keeps this rank's shard. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "loom/ddp.h"
#include "parallel/strategy.h"

typedef struct {
	loom_strategy_t base; /* first: a loom_strategy_t * is a tp_strategy_t * */
	loom_comm_t *tp;
	int tp_rank, tp_size;
	loom__tp_group_t group; /* the model's reduction over tp (its time: the all-reduces since finish_grads) */
	loom_ddp_t *ddp;    /* the data-parallel axis's reducer; NULL with one data-parallel rank */
	int ntensors;
	const loom_tensor_info_t *tensors; /* the model's (shard) table */
} tp_strategy_t;

void loom__tp_group_init(loom__tp_group_t *g, loom_comm_t *comm)
{
	g->comm = comm;
	g->rank = comm ? loom_comm_rank(comm) : 0;
	g->size = comm ? loom_comm_size(comm) : 1;
	g->ms = 0.0;
}

/* The model's reduction: a blocking collective on the tensor-parallel communicator; with sequence
 * parallelism also the in-place all-gather and reduce-scatter of rank-ordered parts (loom/model.h). */
int loom__tp_group_reduce(void *ctx, float *buf, size_t n, loom_tp_op_t op)
{
	static const char *const what[] = {"all-reduce (sum)", "all-reduce (max)", "all-gather", "reduce-scatter"};
	loom__tp_group_t *g = ctx;
	double t0 = loom_now();
	size_t part = n / (size_t)g->size;
	int rc = op == LOOM_TP_ALLGATHER ? loom_allgather(g->comm, buf + (size_t)g->rank * part, buf, part, LOOM_FLOAT32)
	       : op == LOOM_TP_REDUCE_SCATTER
	           ? loom_reduce_scatter(g->comm, buf, buf + (size_t)g->rank * part, part, LOOM_FLOAT32, LOOM_SUM)
	           : loom_allreduce(g->comm, buf, buf, n, LOOM_FLOAT32, op == LOOM_TP_MAX ? LOOM_MAX : LOOM_SUM);
	g->ms += 1e3 * (loom_now() - t0);
	if (rc != LOOM_OK)
		return loom_seterr(rc, "tensor parallel: rank %d of %d: %s of %zu floats: %s", g->rank, g->size, what[op], n,
		                   loom_comm_errmsg(g->comm));
	return LOOM_OK;
}

double loom__tp_group_take_ms(loom__tp_group_t *g)
{
	double ms = g->ms;
	g->ms = 0.0;
	return ms;
}

static void tp_destroy(loom_strategy_t *s)
{
	tp_strategy_t *t = (tp_strategy_t *)s;
	if (s->model)
		loom_model_on_tp_reduce(s->model, NULL, NULL);
	loom_ddp_destroy(t->ddp); /* the model's gradient view goes back to its own buffer */
	loom_adamw_free(&s->opt);
	free(t);
}

static int tp_create(loom_strategy_t **out, const loom_strategy_config_t *cfg)
{
	tp_strategy_t *t;
	loom_optim_segment_t *segs = NULL;
	int rc, n;
	*out = NULL;
	int size = cfg->tp ? loom_comm_size(cfg->tp) : 1, rank = cfg->tp ? loom_comm_rank(cfg->tp) : 0;
	if (loom_model_tp_size(cfg->model) != size || loom_model_tp_rank(cfg->model) != rank)
		return loom_seterr(LOOM_EINVAL, "tensor parallel: rank %d of a tensor-parallel group of %d, but the model "
		                   "was created as shard %d of %d (loom_model_opts_t tp_size, tp_rank)", rank, size,
		                   loom_model_tp_rank(cfg->model), loom_model_tp_size(cfg->model));
	if (!(t = loom__calloc(1, sizeof *t)))
		return loom_seterr(LOOM_ENOMEM, "trainer: out of memory");
	loom_strategy_t *s = &t->base;
	s->ops = loom__tp_strategy();
	t->tp = cfg->tp, t->tp_rank = rank, t->tp_size = size;
	loom__tp_group_init(&t->group, cfg->tp);
	s->mcfg = *loom_model_get_config(cfg->model);
	s->dp = cfg->dp;
	s->dp_rank = cfg->dp ? loom_comm_rank(cfg->dp) : 0;
	s->dp_size = cfg->dp ? loom_comm_size(cfg->dp) : 1;
	s->writer = cfg->writer;
	s->norm_skip = cfg->norm_skip;
	if (cfg->dp && s->dp_size > 1 &&
	    ((rc = loom_ddp_create(&t->ddp, cfg->dp, cfg->model, cfg->bucket_mb, LOOM_MIN(1.0, cfg->bucket_mb))) != LOOM_OK ||
	     (rc = loom_ddp_set_reduce_dtype(t->ddp, cfg->grad_reduce_dtype)) != LOOM_OK))
		goto fail;
	s->model = cfg->model;
	s->params = loom_model_params(cfg->model);
	s->grads = t->ddp ? loom_ddp_grads(t->ddp) : loom_model_grads(cfg->model);
	s->nparams = loom_model_param_count(cfg->model);
	s->own_offset = 0, s->own_count = s->nparams;
	s->mem.params = s->mem.grads = s->nparams * sizeof(float); /* the shard's, as the memory line reports */
	s->mem.optim = 2 * s->nparams * sizeof(float);
	t->tensors = loom_model_tensors(cfg->model, &n);
	t->ntensors = n;
	/* AdamW over the shard: one segment per tensor of the shard table, with its decay */
	if (!(segs = loom__malloc((size_t)n * sizeof *segs))) {
		rc = loom_seterr(LOOM_ENOMEM, "trainer: out of memory");
		goto fail;
	}
	for (int i = 0; i < n; i++)
		segs[i].offset = t->tensors[i].offset, segs[i].numel = t->tensors[i].numel, segs[i].decay = t->tensors[i].decay;
	if ((rc = loom_adamw_init(&s->opt, &cfg->adamw, s->nparams, segs, n)) != LOOM_OK)
		goto fail;
	free(segs);
	loom_model_on_tp_reduce(cfg->model, loom__tp_group_reduce, &t->group);
	*out = s;
	return LOOM_OK;
fail:
	free(segs);
	tp_destroy(s);
	return rc;
}

static void tp_set_sync(loom_strategy_t *s, int sync)
{
	tp_strategy_t *t = (tp_strategy_t *)s;
	if (t->ddp)
		loom_ddp_set_sync(t->ddp, sync);
}

static int tp_finish_grads(loom_strategy_t *s, loom_strategy_stats_t *st)
{
	tp_strategy_t *t = (tp_strategy_t *)s;
	loom_ddp_stats_t ds = {0};
	int rc = t->ddp ? loom_ddp_wait(t->ddp, &ds) : LOOM_OK;
	/* the tensor-parallel all-reduces block the training thread: all of their time is exposed */
	double ms = loom__tp_group_take_ms(&t->group);
	st->comm_ms = ds.comm_ms + ms;
	st->exposed_comm_ms = ds.exposed_comm_ms + ms;
	return rc;
}

static int tp_grad_norm(loom_strategy_t *s, double *norm)
{
	tp_strategy_t *t = (tp_strategy_t *)s;
	double split = 0.0, whole = 0.0;
	int rc;
	for (int i = 0; i < t->ntensors; i++) {
		if (s->norm_skip && s->norm_skip[i]) /* a copy another pipeline stage owns */
			continue;
		double q = loom_grad_sumsq(s->grads + t->tensors[i].offset, t->tensors[i].numel);
		if (t->tensors[i].tp_dim >= 0)
			split += q;
		else
			whole += q;
	}
	if ((rc = loom_allreduce(t->tp, &split, &split, 1, LOOM_FLOAT64, LOOM_SUM)) != LOOM_OK)
		return loom_seterr(rc, "tensor parallel: rank %d: summing the squared gradient norm: %s", t->tp_rank,
		                   loom_comm_errmsg(t->tp));
	*norm = sqrt(split + whole);
	return LOOM_OK;
}

static int tp_optim_step(loom_strategy_t *s, float lr, float grad_scale)
{
	return loom_adamw_step(&s->opt, s->params, s->grads, lr, grad_scale);
}

static int tp_sync_params(loom_strategy_t *s)
{
	tp_strategy_t *t = (tp_strategy_t *)s;
	return t->ddp ? loom_ddp_broadcast_params(t->ddp) : LOOM_OK;
}

/* The replicated tensors of every rank of the group are bit-identical; with several data-parallel
 * ranks, so are the shards along that axis (DDP's check). */
static int tp_check_replicas(loom_strategy_t *s)
{
	tp_strategy_t *t = (tp_strategy_t *)s;
	int rc;
	if (t->ddp && (rc = loom_ddp_check_replicas(t->ddp)) != LOOM_OK)
		return rc;
	return loom__tp_check_whole(&t->group, t->tensors, t->ntensors, s->params);
}

int loom__tp_check_whole(const loom__tp_group_t *g, const loom_tensor_info_t *tensors, int ntensors, const float *params)
{
	uint64_t mine = 0, *all;
	int rc, bad = 0;
	char list[256] = "";
	size_t len = 0;
	if (g->size <= 1)
		return LOOM_OK;
	for (int i = 0; i < ntensors; i++)
		if (tensors[i].tp_dim < 0)
			mine = mine * 0x100000001b3ULL ^ loom_checksum_f32(params + tensors[i].offset, tensors[i].numel);
	if (!(all = loom__calloc((size_t)g->size, sizeof *all)))
		return loom_seterr(LOOM_ENOMEM, "tensor parallel: out of memory");
	if ((rc = loom_allgather(g->comm, &mine, all, 1, LOOM_INT64)) != LOOM_OK) {
		free(all);
		return loom_seterr(rc, "tensor parallel: rank %d: gathering checksums: %s", g->rank, loom_comm_errmsg(g->comm));
	}
	for (int r = 1; r < g->size; r++)
		if (all[r] != all[0]) {
			bad++;
			if (len + 16 < sizeof list)
				len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", bad > 1 ? ", " : "", r);
		}
	free(all);
	if (bad)
		return loom_seterr(LOOM_EMISMATCH, "tensor parallel: rank %d: the replicated tensors (those tensor "
		                   "parallelism keeps whole) of tensor-parallel rank(s) %s differ from rank 0's", g->rank, list);
	return LOOM_OK;
}

/* full (whole-model floats) = the group's shards of src (this rank's shard of nshard floats),
 * through the scratch `all` (size x nshard floats). Collective over the group. */
static int gather_full(const loom__tp_group_t *g, const loom_model_config_t *c, size_t nshard, const float *src,
                       float *all, float *full)
{
	int rc = g->size > 1 ? loom_allgather(g->comm, src, all, nshard, LOOM_FLOAT32) : LOOM_OK;
	if (rc != LOOM_OK)
		return loom_seterr(rc, "tensor parallel: rank %d: gathering the shards for a checkpoint: %s", g->rank,
		                   loom_comm_errmsg(g->comm));
	if (g->size == 1)
		memcpy(full, src, nshard * sizeof(float));
	else
		for (int r = 0; r < g->size; r++)
			loom_model_tp_unshard(c, g->size, r, all + (size_t)r * nshard, full);
	return LOOM_OK;
}

int loom__tp_write_whole(const loom__tp_group_t *g, const loom_model_config_t *c, size_t nshard, const float *p,
                         const float *m, const float *v, const loom_ckpt_writer_t *w)
{
	const loom_ckpt_writer_t *out = w && w->active ? w : NULL; /* non-writers get an inactive writer */
	size_t nfull = loom_model_num_params(c);
	float *all = loom_alloc_aligned((size_t)g->size * nshard * sizeof(float));
	float *fp = loom_alloc_aligned(nfull * sizeof(float)), *fm = loom_alloc_aligned(nfull * sizeof(float));
	float *fv = loom_alloc_aligned(nfull * sizeof(float));
	char path[1200];
	int rc;
	/* (a rank that cannot allocate returns before the gathers: the others' gathers then fail with the
	 * communicator's timeout, naming the missing rank) */
	if (!all || !fp || !fm || !fv) {
		rc = loom_seterr(LOOM_ENOMEM, "tensor parallel: rank %d: out of memory for a checkpoint", g->rank);
		goto out;
	}
	if ((rc = gather_full(g, c, nshard, p, all, fp)) || (rc = gather_full(g, c, nshard, m, all, fm)) ||
	    (rc = gather_full(g, c, nshard, v, all, fv)))
		goto out;
	if (out && ((rc = loom_ckpt_file(out, "model.safetensors", path, sizeof path)) ||
	            (rc = loom_model_save_safetensors(path, c, fp)) ||
	            (rc = loom_ckpt_file(out, "optim.safetensors", path, sizeof path)) ||
	            (rc = loom_optim_save(path, c, fm, fv))))
		goto out;
out:
	loom_free_aligned(all), loom_free_aligned(fp), loom_free_aligned(fm), loom_free_aligned(fv);
	return rc;
}

int loom__tp_read_shard(const loom__tp_group_t *g, const char *dir, const loom_model_config_t *c, size_t nshard, float *p,
                        float *m, float *v)
{
	size_t nfull = loom_model_num_params(c);
	float *fp = p ? loom_alloc_aligned(nfull * sizeof(float)) : NULL;
	float *fm = m ? loom_alloc_aligned(nfull * sizeof(float)) : NULL, *fv = v ? loom_alloc_aligned(nfull * sizeof(float)) : NULL;
	int rc;
	(void)nshard;
	if ((p && !fp) || (m && !fm) || (v && !fv)) {
		rc = loom_seterr(LOOM_ENOMEM, "tensor parallel: rank %d: out of memory to read a checkpoint", g->rank);
		goto out;
	}
	if ((rc = loom__read_whole_state(dir, c, fp, fm, fv)) != LOOM_OK)
		goto out;
	float *full[3] = {fp, fm, fv}, *dst[3] = {p, m, v};
	for (int k = 0; k < 3; k++)
		if (dst[k])
			loom_model_tp_shard(c, g->size, g->rank, full[k], dst[k]);
out:
	loom_free_aligned(fp), loom_free_aligned(fm), loom_free_aligned(fv);
	return rc;
}

static int tp_save(loom_strategy_t *s, const loom_ckpt_writer_t *w)
{
	tp_strategy_t *t = (tp_strategy_t *)s;
	/* every data-parallel replica holds the same shards: the group of data-parallel rank 0 writes */
	if (s->dp_rank != 0)
		return LOOM_OK;
	return loom__tp_write_whole(&t->group, &s->mcfg, s->nparams, s->params, s->opt.m, s->opt.v, w);
}

/* Any checkpoint (DDP's, ZeRO's shards, another tp's): the whole state, and this rank's shard of it. */
static int tp_load(loom_strategy_t *s, const char *dir, long long step)
{
	tp_strategy_t *t = (tp_strategy_t *)s;
	int rc = loom__tp_read_shard(&t->group, dir, &s->mcfg, s->nparams, s->params, s->opt.m, s->opt.v);
	if (rc == LOOM_OK)
		s->opt.step = step;
	return rc;
}

static const loom_strategy_ops_t tp_ops = {
	.name = "tp",
	.create = tp_create,
	.destroy = tp_destroy,
	.set_sync = tp_set_sync,
	.finish_grads = tp_finish_grads,
	.grad_norm = tp_grad_norm,
	.optim_step = tp_optim_step,
	.sync_params = tp_sync_params,
	.check_replicas = tp_check_replicas,
	.save = tp_save,
	.load = tp_load,
};

const loom_strategy_ops_t *loom__tp_strategy(void)
{
	return &tp_ops;
}
