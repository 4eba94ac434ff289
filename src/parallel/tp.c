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
 * Checkpoints are always whole, and streamed: the writer (tp rank 0 of the group) writes the full
 * HF-layout tensors (model.safetensors, optim.safetensors) one at a time, each split tensor unsharded
 * from the shards the others send it in file order, so no rank holds more than its shard and a tensor;
 * a checkpoint of any tp loads at any other tp, in `loom sample` and in PyTorch; load reads one full
 * tensor at a time and keeps this rank's shard of it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/model_internal.h"
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
	g->name = "tensor parallel";
	g->nring = 0;
}

/* The ring's point-to-point operations (context parallel's ring attention): start a send to the next
 * rank or a receive from the previous one, or wait for every one started. At most 4 in flight. */
#define RING_TAG 0x6370 /* "cp" */
static int ring_op(loom__tp_group_t *g, float *buf, size_t n, loom_tp_op_t op)
{
	int rc = LOOM_OK, next = (g->rank + 1) % g->size, prev = (g->rank + g->size - 1) % g->size;
	if (op == LOOM_TP_WAIT) {
		for (int k = 0; k < g->nring; k++) {
			int r = loom_wait(g->ring[k]);
			rc = rc ? rc : r;
		}
		g->nring = 0;
		return rc;
	}
	if (g->nring == (int)LOOM_ARRAY_LEN(g->ring))
		return loom_seterr(LOOM_ESTATE, "%s: rank %d: more than %d ring transfers in flight", g->name, g->rank,
		                   g->nring);
	rc = op == LOOM_TP_SEND_NEXT ? loom_isend(g->comm, buf, n, LOOM_FLOAT32, next, RING_TAG, &g->ring[g->nring])
	                             : loom_irecv(g->comm, buf, n, LOOM_FLOAT32, prev, RING_TAG, &g->ring[g->nring]);
	if (rc == LOOM_OK)
		g->nring++;
	return rc;
}

/* The model's reduction: a blocking collective on the tensor-parallel communicator; with sequence
 * parallelism also the in-place all-gather and reduce-scatter of rank-ordered parts (loom/model.h). */
int loom__tp_group_reduce(void *ctx, float *buf, size_t n, loom_tp_op_t op)
{
	static const char *const what[] = {"all-reduce (sum)", "all-reduce (max)", "all-gather", "reduce-scatter",
	                                   "ring send", "ring receive", "ring wait"};
	loom__tp_group_t *g = ctx;
	double t0 = loom_now();
	size_t part = n / (size_t)g->size;
	if ((int)op < 0 || (int)op >= (int)LOOM_ARRAY_LEN(what))
		return loom_seterr(LOOM_EINVAL, "%s: rank %d: operation %d", g->name, g->rank, (int)op);
	int rc = op == LOOM_TP_ALLGATHER ? loom_allgather(g->comm, buf + (size_t)g->rank * part, buf, part, LOOM_FLOAT32)
	       : op == LOOM_TP_REDUCE_SCATTER
	           ? loom_reduce_scatter(g->comm, buf, buf + (size_t)g->rank * part, part, LOOM_FLOAT32, LOOM_SUM)
	       : op >= LOOM_TP_SEND_NEXT
	           ? ring_op(g, buf, n, op)
	           : loom_allreduce(g->comm, buf, buf, n, LOOM_FLOAT32, op == LOOM_TP_MAX ? LOOM_MAX : LOOM_SUM);
	g->ms += 1e3 * (loom_now() - t0);
	if (rc != LOOM_OK)
		return loom_seterr(rc, "%s: rank %d of %d: %s of %zu floats: %s", g->name, g->rank, g->size, what[op], n,
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
/* ---- checkpoints, streamed tensor by tensor ----------------------------------------------------- */

enum { TAG_TP_CKPT = 6091 }; /* + 0 parameters, 1 and 2 the moments */

static int is_split(const loom_model_config_t *c, int t)
{
	loom_tensor_info_t fi;
	return loom_model_tensor_info(c, t, &fi) == LOOM_OK && fi.tp_dim >= 0;
}

typedef struct {
	const loom__tp_group_t *g;
	const loom_model_config_t *c;
	loom__tp_shard_fn get;
	void *ctx;
	float *shard, *full; /* one shard of a tensor received, one whole tensor (the writer's) */
	int kind, next;
} tp_stream_t;

/* The writer's (tp rank 0) tensor i of file st->kind: its own shard and, for a split tensor, every
 * other rank's received and unsharded into one whole tensor. */
static int tp_fill(void *ctx, int i, const void **data)
{
	tp_stream_t *st = ctx;
	const loom__tp_group_t *g = st->g;
	const float *own;
	int t, which, rc;
	loom__ckpt_item(loom_model_num_tensors(st->c), st->kind, i, &t, &which);
	st->next = i + 1;
	if ((rc = st->get(st->ctx, which, t, &own)) != LOOM_OK)
		return rc;
	if (g->size == 1 || !is_split(st->c, t)) { /* kept whole by every rank: the writer's copy */
		*data = own;
		return LOOM_OK;
	}
	loom_tensor_info_t li;
	loom_model_shard_info(st->c, g->size, t, &li);
	loom_model_tp_unshard_tensor(st->c, g->size, 0, t, own, st->full);
	for (int q = 1; q < g->size; q++) {
		if ((rc = loom_recv(g->comm, st->shard, li.numel, LOOM_FLOAT32, q, TAG_TP_CKPT + which)) != LOOM_OK)
			return loom_seterr(rc, "tensor parallel: rank 0: receiving rank %d's shard of %s for a checkpoint: %s", q,
			                   li.name, loom_comm_errmsg(g->comm));
		loom_model_tp_unshard_tensor(st->c, g->size, q, t, st->shard, st->full);
	}
	*data = st->full;
	return LOOM_OK;
}

/* The rest of file st->kind after its writer stopped (or without one): received and dropped. */
static int tp_drain(tp_stream_t *st, int rc)
{
	int count = loom__ckpt_count(loom_model_num_tensors(st->c), st->kind);
	for (int i = st->next; i < count; i++) {
		const void *d;
		int r = tp_fill(st, i, &d);
		rc = rc != LOOM_OK ? rc : r;
	}
	return rc;
}

int loom__tp_write_stream(const loom__tp_group_t *g, const loom_model_config_t *c, loom__tp_shard_fn get, void *ctx,
                          const loom_ckpt_writer_t *w)
{
	tp_stream_t st = {.g = g, .c = c, .get = get, .ctx = ctx};
	int n = loom_model_num_tensors(c), rc = LOOM_OK, bad;
	char path[1200];
	if (g->rank == 0) {
		size_t most = 1, mosts = 1;
		for (int t = 0; t < n; t++) {
			loom_tensor_info_t fi, li;
			loom_model_tensor_info(c, t, &fi);
			loom_model_shard_info(c, g->size, t, &li);
			most = LOOM_MAX(most, fi.numel), mosts = LOOM_MAX(mosts, li.numel);
		}
		if (g->size > 1 && (!(st.full = loom_alloc_aligned(most * sizeof(float))) ||
		                    !(st.shard = loom_alloc_aligned(mosts * sizeof(float)))))
			rc = loom_seterr(LOOM_ENOMEM, "tensor parallel: rank 0: out of memory for a checkpoint's tensor");
	}
	/* every rank of the group agrees before the transfers, so a failed one leaves none waiting */
	bad = rc != LOOM_OK;
	if (g->size > 1) {
		int arc = loom_allreduce(g->comm, &bad, &bad, 1, LOOM_INT32, LOOM_MAX);
		if (arc != LOOM_OK)
			rc = loom_seterr(arc, "tensor parallel: rank %d: agreeing on a checkpoint: %s", g->rank,
			                 loom_comm_errmsg(g->comm));
		else if (bad && rc == LOOM_OK)
			rc = loom_seterr(LOOM_ENOMEM, "tensor parallel: rank %d: another rank could not write a checkpoint",
			                 g->rank);
	}
	if (rc != LOOM_OK)
		goto out;
	if (g->rank != 0) { /* every tensor's shard taken in the writers' order; the split ones sent */
		for (int kind = 0; kind < 2 && rc == LOOM_OK; kind++)
			for (int i = 0; i < loom__ckpt_count(n, kind) && rc == LOOM_OK; i++) {
				const float *own;
				int t, which;
				loom__ckpt_item(n, kind, i, &t, &which);
				if ((rc = get(ctx, which, t, &own)) != LOOM_OK || !is_split(c, t))
					continue;
				loom_tensor_info_t li;
				loom_model_shard_info(c, g->size, t, &li);
				if ((rc = loom_send(g->comm, own, li.numel, LOOM_FLOAT32, 0, TAG_TP_CKPT + which)) != LOOM_OK)
					rc = loom_seterr(rc, "tensor parallel: rank %d: sending its shard of %s for a checkpoint: %s",
					                 g->rank, li.name, loom_comm_errmsg(g->comm));
			}
		goto out;
	}
	int active = w && w->active;
	if (active && (rc = loom_ckpt_file(w, "model.safetensors", path, sizeof path)) == LOOM_OK)
		rc = loom__model_save_fill(path, c, tp_fill, &st);
	rc = tp_drain(&st, rc);
	st.kind = 1, st.next = 0;
	if (active && rc == LOOM_OK && (rc = loom_ckpt_file(w, "optim.safetensors", path, sizeof path)) == LOOM_OK)
		rc = loom__optim_save_fill(path, c, tp_fill, &st);
	rc = tp_drain(&st, rc);
out:
	loom_free_aligned(st.full), loom_free_aligned(st.shard);
	return rc;
}

/* A rank's whole shard buffers as loom__tp_write_stream takes them. */
typedef struct {
	const loom_model_config_t *c;
	int tp;
	const float *src[3];
} whole_src_t;

static int whole_get(void *ctx, int which, int t, const float **shard)
{
	whole_src_t *ws = ctx;
	loom_tensor_info_t li;
	loom_model_shard_info(ws->c, ws->tp, t, &li);
	*shard = ws->src[which] + li.offset;
	return LOOM_OK;
}

int loom__tp_write_whole(const loom__tp_group_t *g, const loom_model_config_t *c, const float *p, const float *m,
                         const float *v, const loom_ckpt_writer_t *w)
{
	whole_src_t ws = {.c = c, .tp = g->size, .src = {p, m, v}};
	return loom__tp_write_stream(g, c, whole_get, &ws, w);
}

/* This rank's shard of the table's tensor t alone into p, m, v (any NULL: not read), with scratch of 3
 * x the full tensor's numel floats. */
static int read_tensor(const loom__tp_group_t *g, const char *dir, const loom_model_config_t *c, int t, float *p,
                       float *m, float *v, float *scratch)
{
	loom_tensor_info_t fi;
	int rc;
	loom_model_tensor_info(c, t, &fi);
	float *full[3] = {scratch, m ? scratch + fi.numel : NULL, v ? scratch + 2 * fi.numel : NULL}, *dst[3] = {p, m, v};
	if ((rc = loom__read_state_range(dir, c, fi.offset, fi.numel, p ? full[0] : NULL, full[1], full[2])) != LOOM_OK)
		return rc;
	for (int k = 0; k < 3; k++)
		if (dst[k])
			loom_model_tp_shard_tensor(c, g->size, g->rank, t, full[k], dst[k]);
	return LOOM_OK;
}

int loom__tp_read_tensors(const loom__tp_group_t *g, const char *dir, const loom_model_config_t *c, int n,
                          const int *idx, const loom_tensor_info_t *at, float *p, float *m, float *v)
{
	int rc = LOOM_OK;
	size_t most = 1;
	float *scratch;
	for (int k = 0; k < n; k++) {
		loom_tensor_info_t fi;
		loom_model_tensor_info(c, idx ? idx[k] : k, &fi);
		most = LOOM_MAX(most, fi.numel);
	}
	if (!(scratch = loom_alloc_aligned(3 * most * sizeof(float))))
		return loom_seterr(LOOM_ENOMEM, "tensor parallel: rank %d: out of memory to read a checkpoint", g->rank);
	for (int k = 0; k < n && rc == LOOM_OK; k++) {
		int t = idx ? idx[k] : k;
		loom_tensor_info_t li;
		if (at)
			li = at[k];
		else
			loom_model_shard_info(c, g->size, t, &li);
		size_t o = li.offset;
		rc = read_tensor(g, dir, c, t, p ? p + o : NULL, m ? m + o : NULL, v ? v + o : NULL, scratch);
	}
	loom_free_aligned(scratch);
	return rc;
}

int loom__tp_read_shard(const loom__tp_group_t *g, const char *dir, const loom_model_config_t *c, float *p, float *m,
                        float *v)
{
	return loom__tp_read_tensors(g, dir, c, loom_model_num_tensors(c), NULL, NULL, p, m, v);
}

static int tp_save(loom_strategy_t *s, const loom_ckpt_writer_t *w)
{
	tp_strategy_t *t = (tp_strategy_t *)s;
	/* every data-parallel replica holds the same shards: the group of data-parallel rank 0 writes */
	if (s->dp_rank != 0)
		return LOOM_OK;
	return loom__tp_write_whole(&t->group, &s->mcfg, s->params, s->opt.m, s->opt.v, w);
}

/* Any checkpoint (DDP's, ZeRO's shards, another tp's): the whole state, and this rank's shard of it. */
static int tp_load(loom_strategy_t *s, const char *dir, long long step)
{
	tp_strategy_t *t = (tp_strategy_t *)s;
	int rc = loom__tp_read_shard(&t->group, dir, &s->mcfg, s->params, s->opt.m, s->opt.v);
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
