/* tp.c: the "tensor parallel" strategy (Megatron-LM): each rank of a tensor-parallel group holds a
 * shard of the model (loom_model_opts_t's tp_size/tp_rank: heads, MLP columns, vocabulary rows) and
 * gives the model its reduction (an all-reduce over the group's communicator) for the f and g points
 * of every pass; the data-parallel axis, when it has several ranks, averages each shard's gradients
 * with the DDP reducer (loom/ddp.h, buckets overlapped with backward) among the ranks that hold the
 * same shard (with pipeline parallel: the buckets cover the stage's tensors only, strategy.h's
 * tensor_used; the pipeline executor adds the stages together, src/parallel/pp.c).
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
	loom_ddp_t *ddp;    /* the data-parallel axis's reducer; NULL with one data-parallel rank */
	int ntensors;
	const loom_tensor_info_t *tensors; /* the model's (shard) table */
	double reduce_ms;   /* time in tensor-parallel all-reduces since the last finish_grads */
} tp_strategy_t;

/* The model's reduction: a blocking all-reduce on the tensor-parallel communicator. */
static int tp_reduce(void *ctx, float *buf, size_t n, loom_tp_op_t op)
{
	tp_strategy_t *t = ctx;
	double t0 = loom_now();
	int rc = loom_allreduce(t->tp, buf, buf, n, LOOM_FLOAT32, op == LOOM_TP_MAX ? LOOM_MAX : LOOM_SUM);
	t->reduce_ms += 1e3 * (loom_now() - t0);
	if (rc != LOOM_OK)
		return loom_seterr(rc, "tensor parallel: rank %d of %d: all-reduce (%s) of %zu floats: %s", t->tp_rank,
		                   t->tp_size, op == LOOM_TP_MAX ? "max" : "sum", n, loom_comm_errmsg(t->tp));
	return LOOM_OK;
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
	s->mcfg = *loom_model_get_config(cfg->model);
	s->dp = cfg->dp;
	s->dp_rank = cfg->dp ? loom_comm_rank(cfg->dp) : 0;
	s->dp_size = cfg->dp ? loom_comm_size(cfg->dp) : 1;
	s->writer = cfg->writer;
	if (cfg->dp && s->dp_size > 1 &&
	    ((rc = loom__ddp_create_used(&t->ddp, cfg->dp, cfg->model, cfg->bucket_mb, LOOM_MIN(1.0, cfg->bucket_mb),
	                                 cfg->tensor_used)) != LOOM_OK ||
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
	loom_model_on_tp_reduce(cfg->model, tp_reduce, t);
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
	st->comm_ms = ds.comm_ms + t->reduce_ms;
	st->exposed_comm_ms = ds.exposed_comm_ms + t->reduce_ms;
	t->reduce_ms = 0.0;
	return rc;
}

static int tp_grad_norm(loom_strategy_t *s, double *norm)
{
	tp_strategy_t *t = (tp_strategy_t *)s;
	double split = 0.0, whole = 0.0;
	int rc;
	for (int i = 0; i < t->ntensors; i++) {
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
	uint64_t mine = 0, *all;
	int rc, bad = 0;
	char list[256] = "";
	size_t len = 0;
	if (t->ddp && (rc = loom_ddp_check_replicas(t->ddp)) != LOOM_OK)
		return rc;
	for (int i = 0; i < t->ntensors; i++)
		if (t->tensors[i].tp_dim < 0)
			mine = mine * 0x100000001b3ULL ^ loom_checksum_f32(s->params + t->tensors[i].offset, t->tensors[i].numel);
	if (!(all = loom__calloc((size_t)t->tp_size, sizeof *all)))
		return loom_seterr(LOOM_ENOMEM, "tensor parallel: out of memory");
	if ((rc = loom_allgather(t->tp, &mine, all, 1, LOOM_INT64)) != LOOM_OK) {
		free(all);
		return loom_seterr(rc, "tensor parallel: rank %d: gathering checksums: %s", t->tp_rank,
		                   loom_comm_errmsg(t->tp));
	}
	for (int r = 1; r < t->tp_size; r++)
		if (all[r] != all[0]) {
			bad++;
			if (len + 16 < sizeof list)
				len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", bad > 1 ? ", " : "", r);
		}
	free(all);
	if (bad)
		return loom_seterr(LOOM_EMISMATCH, "tensor parallel: rank %d: the replicated tensors (those tensor "
		                   "parallelism keeps whole) of tensor-parallel rank(s) %s differ from rank 0's", t->tp_rank, list);
	return LOOM_OK;
}

/* full (whole-model floats) = the group's shards of src (this rank's shard of nparams floats),
 * through the scratch `all` (tp_size x nparams floats). Collective over the group. */
static int gather_full(tp_strategy_t *t, const float *src, float *all, float *full)
{
	loom_strategy_t *s = &t->base;
	int rc = loom_allgather(t->tp, src, all, s->nparams, LOOM_FLOAT32);
	if (rc != LOOM_OK)
		return loom_seterr(rc, "tensor parallel: rank %d: gathering the shards for a checkpoint: %s", t->tp_rank,
		                   loom_comm_errmsg(t->tp));
	if (full)
		for (int r = 0; r < t->tp_size; r++)
			loom_model_tp_unshard(&s->mcfg, t->tp_size, r, all + (size_t)r * s->nparams, full);
	return LOOM_OK;
}

static int tp_save(loom_strategy_t *s, const loom_ckpt_writer_t *w)
{
	tp_strategy_t *t = (tp_strategy_t *)s;
	const loom_ckpt_writer_t *out = w && w->active ? w : NULL; /* non-writers get an inactive writer */
	size_t nfull = loom_model_num_params(&s->mcfg);
	float *all = loom_alloc_aligned((size_t)t->tp_size * s->nparams * sizeof(float));
	float *p = out ? loom_alloc_aligned(nfull * sizeof(float)) : NULL;
	float *m = out ? loom_alloc_aligned(nfull * sizeof(float)) : NULL;
	float *v = out ? loom_alloc_aligned(nfull * sizeof(float)) : NULL;
	char path[1200];
	int rc;
	/* (a rank that cannot allocate returns before the gathers: the others' gathers then fail with the
	 * communicator's timeout, naming the missing rank) */
	if (!all || (out && (!p || !m || !v))) {
		rc = loom_seterr(LOOM_ENOMEM, "tensor parallel: rank %d: out of memory for a checkpoint", t->tp_rank);
		goto out;
	}
	if ((rc = gather_full(t, s->params, all, p)) || (rc = gather_full(t, s->opt.m, all, m)))
		goto out;
	if ((rc = gather_full(t, s->opt.v, all, v)))
		goto out;
	if (out && ((rc = loom_ckpt_file(out, "model.safetensors", path, sizeof path)) ||
	          (rc = loom_model_save_safetensors(path, &s->mcfg, p)) ||
	          (rc = loom_ckpt_file(out, "optim.safetensors", path, sizeof path)) ||
	          (rc = loom_optim_save(path, &s->mcfg, m, v))))
		goto out;
out:
	loom_free_aligned(all), loom_free_aligned(p), loom_free_aligned(m), loom_free_aligned(v);
	return rc;
}

static int tp_load(loom_strategy_t *s, const char *dir, long long step)
{
	tp_strategy_t *t = (tp_strategy_t *)s;
	const loom_model_config_t *c = &s->mcfg;
	size_t nfull = loom_model_num_params(c);
	float *p = loom_alloc_aligned(nfull * sizeof(float)), *v = loom_alloc_aligned(nfull * sizeof(float));
	loom_model_config_t saved;
	char file[1200];
	int rc;
	if (!p || !v) {
		rc = loom_seterr(LOOM_ENOMEM, "tensor parallel: rank %d: out of memory to read a checkpoint", t->tp_rank);
		goto out;
	}
	snprintf(file, sizeof file, "%s/model.safetensors", dir);
	if ((rc = loom_model_config(file, c->n_head, &saved, NULL)) != LOOM_OK)
		goto out;
	if (!loom_model_config_equal(&saved, c)) {
		rc = loom_seterr(LOOM_EMISMATCH, "resume: %s holds a model L%d H%d C%d T%d V%d, this run's is "
		                 "L%d H%d C%d T%d V%d", file, saved.n_layer, saved.n_head, saved.n_embd, saved.seq_len,
		                 saved.vocab_size, c->n_layer, c->n_head, c->n_embd, c->seq_len, c->vocab_size);
		goto out;
	}
	if ((rc = loom_model_load(file, c, p)) != LOOM_OK)
		goto out;
	loom_model_tp_shard(c, t->tp_size, t->tp_rank, p, s->params);
	snprintf(file, sizeof file, "%s/optim.safetensors", dir);
	if ((rc = loom_optim_load(file, c, p, v)) != LOOM_OK)
		goto out;
	loom_model_tp_shard(c, t->tp_size, t->tp_rank, p, s->opt.m);
	loom_model_tp_shard(c, t->tp_size, t->tp_rank, v, s->opt.v);
	s->opt.step = step;
out:
	loom_free_aligned(p), loom_free_aligned(v);
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
