/* ddp.c: data-parallel gradient averaging with buckets overlapped with backward (loom/ddp.h), and the
 * "ddp" parallel strategy built on it (src/parallel/strategy.h).
 *
 * Buckets are ranges of consecutive tensors of the gradient buffer, formed from the last tensor
 * backwards, because backward finishes gradients in reverse tensor order. A bucket is launched when
 * all of its tensors have been reported by the model's grad-ready callback (counted, so the order
 * within a bucket does not matter); launches happen in bucket order on every rank, which keeps the
 * non-blocking collectives matched across ranks.
 *
 * Memory: a loom_ddp_t owns its gradient storage (in the communicator's shared memory when it can,
 * so each bucket's all-reduce is single-copy) and points the model's gradient view at it once, at
 * create (loom_model_set_grad_buffer); the model's own buffer is left alone, and destroy points the
 * view back at it with the current values. Gradient pointers are taken from loom_ddp_grads (or from
 * the model) after create, never before.
 *
 * Invariant of the strategy (checked by tests/test_ddp.c's ddp_strategy_invariant and by
 * tests/test_ddp_train.c): after every step the parameters and AdamW state of all ranks are
 * bit-identical, and equal to those of one process that averaged the ranks' gradients itself; the
 * averaged gradients are the same bits on every rank (one all-reduce gives every rank the same
 * result), so the norm, clipping and AdamW need no further communication. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "loom/ddp.h"
#include "parallel/strategy.h"

typedef struct {
	int lo, hi;          /* tensor indices, inclusive */
	size_t offset, count; /* floats */
	int ready;           /* tensors reported this micro-step */
	loom_request_t *req;
} bucket_t;

struct loom_ddp {
	loom_comm_t *comm;
	loom_model_t *model;
	float *grads;       /* owned: the gradient storage the model's gradient view points at */
	float *model_grads; /* the model's own gradient buffer (not ours), its view's target again on destroy */
	int shared;         /* grads from loom_comm_alloc */
	size_t nparams;
	int ntensors, nbuckets, sync, launched;
	loom_comm_stats_t at_launch; /* counters when this step's first bucket was launched */
	int *bucket_of; /* tensor -> bucket */
	bucket_t *buckets;
	int err;
	uint16_t *g16; /* with a bf16 reduce: the bf16 staging of every gradient (buckets at their offsets) */
	int g16_shared;
};

/* fp32 -> bf16, round to nearest even (NaN kept a NaN), and back: as the collectives' own (also ZeRO's
 * bf16 gradient reduction, zero.c). */
void loom__grad_to_bf16(uint16_t *d, const float *s, size_t n)
{
#pragma omp parallel for simd schedule(static) if (n >= 65536)
	for (size_t i = 0; i < n; i++) {
		uint32_t u;
		memcpy(&u, &s[i], 4);
		d[i] = (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)((u >> 16) | 0x40)
		                                       : (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
	}
}

void loom__grad_from_bf16(float *d, const uint16_t *s, size_t n)
{
#pragma omp parallel for simd schedule(static) if (n >= 65536)
	for (size_t i = 0; i < n; i++) {
		uint32_t u = (uint32_t)s[i] << 16;
		memcpy(&d[i], &u, 4);
	}
}

static void on_grad_ready(void *ctx, int t)
{
	loom_ddp_t *d = ctx;
	bucket_t *b;
	if (!d->sync || d->err || t < 0 || t >= d->ntensors || d->bucket_of[t] < 0)
		return;
	b = &d->buckets[d->bucket_of[t]];
	if (++b->ready == b->hi - b->lo + 1) {
		if (d->launched == 0)
			loom_comm_stats(d->comm, &d->at_launch);
		int rc;
		if (d->g16) { /* bf16 reduce: the bucket's final gradients rounded into the staging buffer */
			loom__grad_to_bf16(d->g16 + b->offset, d->grads + b->offset, b->count);
			rc = loom_iallreduce(d->comm, d->g16 + b->offset, d->g16 + b->offset, b->count, LOOM_BFLOAT16,
			                     LOOM_AVG, &b->req);
		} else {
			rc = loom_iallreduce(d->comm, d->grads + b->offset, d->grads + b->offset, b->count, LOOM_FLOAT32,
			                     LOOM_AVG, &b->req);
		}
		if (rc != LOOM_OK)
			d->err = rc, b->req = NULL;
		d->launched++;
	}
}

int loom_ddp_create(loom_ddp_t **out, loom_comm_t *comm, loom_model_t *model, double bucket_mb, double first_bucket_mb)
{
	return loom__ddp_create_used(out, comm, model, bucket_mb, first_bucket_mb, NULL);
}

/* Buckets over the tensors with used[t] != 0 only (NULL: all), for a pipeline stage's model, which
 * reports only its own tensors: an unused tensor closes the bucket before it and belongs to none. */
int loom__ddp_create_used(loom_ddp_t **out, loom_comm_t *comm, loom_model_t *model, double bucket_mb,
                          double first_bucket_mb, const unsigned char *used)
{
	const loom_model_config_t *cfg = loom_model_get_config(model);
	loom_ddp_t *d;
	loom_tensor_info_t info;
	size_t limit, bytes = 0;
	*out = NULL;
	if (!(bucket_mb > 0) || !(first_bucket_mb > 0))
		return loom_seterr(LOOM_EINVAL, "ddp: bucket sizes must be positive (got %g MiB and first %g MiB)",
		                   bucket_mb, first_bucket_mb);
	const loom_tensor_info_t *table = loom_model_tensors(model, NULL); /* the model's (a shard's, with tp) */
	size_t nparams = loom_model_param_count(model);
	d = loom__calloc(1, sizeof *d);
	if (!d)
		return loom_seterr(LOOM_ENOMEM, "ddp: out of memory");
	d->comm = comm, d->model = model, d->sync = 1;
	d->nparams = nparams;
	d->ntensors = loom_model_num_tensors(cfg);
	d->bucket_of = loom__calloc((size_t)d->ntensors, sizeof *d->bucket_of);
	d->buckets = loom__calloc((size_t)d->ntensors, sizeof *d->buckets);
	if (!d->bucket_of || !d->buckets)
		goto oom;

	/* Our gradient storage in shared memory, starting from the model's current gradients; the model's
	 * gradient view points at it from here on (its own buffer is not touched). */
	d->grads = loom_comm_alloc(comm, d->nparams * sizeof(float));
	d->shared = d->grads != NULL;
	if (!d->grads)
		d->grads = loom_alloc_aligned(d->nparams * sizeof(float));
	if (!d->grads)
		goto oom;
	d->model_grads = loom_model_grads(model);
	memcpy(d->grads, d->model_grads, d->nparams * sizeof(float));
	loom_model_set_grad_buffer(model, d->grads);

	/* Buckets from the last tensor backwards; a bucket closes once it reaches its size limit. */
	limit = (size_t)(first_bucket_mb * 1048576.0);
	for (int t = d->ntensors - 1; t >= 0; t--) {
		bucket_t *b = &d->buckets[d->nbuckets];
		if (used && !used[t]) {
			d->bucket_of[t] = -1;
			continue;
		}
		info = table[t];
		if (bytes == 0)
			b->hi = t;
		b->lo = t;
		d->bucket_of[t] = d->nbuckets;
		bytes += info.numel * sizeof(float);
		if (bytes >= limit || t == 0 || (used && !used[t - 1])) {
			loom_tensor_info_t lo;
			lo = table[b->lo];
			b->offset = lo.offset;
			info = table[b->hi];
			b->count = info.offset + info.numel - lo.offset;
			d->nbuckets++;
			bytes = 0;
			limit = (size_t)(bucket_mb * 1048576.0);
		}
	}
	loom_model_on_grad_ready(model, on_grad_ready, d);
	*out = d;
	return LOOM_OK;
oom:
	loom_ddp_destroy(d); /* nothing attached yet: the model is untouched */
	return loom_seterr(LOOM_ENOMEM, "ddp: out of memory for the buckets and %zu gradients", nparams);
}

void loom_ddp_destroy(loom_ddp_t *d)
{
	if (!d)
		return;
	for (int b = 0; b < d->nbuckets; b++)
		if (d->buckets[b].req)
			loom_wait(d->buckets[b].req);
	if (d->model && d->model_grads) { /* detach: the model works on its own buffer again */
		loom_model_on_grad_ready(d->model, NULL, NULL);
		memcpy(d->model_grads, d->grads, d->nparams * sizeof(float));
		loom_model_set_grad_buffer(d->model, d->model_grads);
	}
	if (d->grads) {
		if (d->shared)
			loom_comm_free(d->comm, d->grads);
		else
			loom_free_aligned(d->grads);
	}
	if (d->g16) {
		if (d->g16_shared)
			loom_comm_free(d->comm, d->g16);
		else
			loom_free_aligned(d->g16);
	}
	free(d->bucket_of);
	free(d->buckets);
	free(d);
}

int loom_ddp_set_reduce_dtype(loom_ddp_t *d, loom_dtype_t dt)
{
	if (dt != LOOM_FLOAT32 && dt != LOOM_BFLOAT16)
		return loom_seterr(LOOM_EINVAL, "ddp: gradients are reduced in float32 or bfloat16, not %s",
		                   loom_dtype_name(dt));
	if (dt == LOOM_BFLOAT16 && !d->g16) {
		d->g16 = loom_comm_alloc(d->comm, d->nparams * sizeof(uint16_t));
		d->g16_shared = d->g16 != NULL;
		if (!d->g16 && !(d->g16 = loom_alloc_aligned(d->nparams * sizeof(uint16_t))))
			return loom_seterr(LOOM_ENOMEM, "ddp: out of memory for %zu bf16 gradients", d->nparams);
	} else if (dt == LOOM_FLOAT32 && d->g16) {
		if (d->g16_shared)
			loom_comm_free(d->comm, d->g16);
		else
			loom_free_aligned(d->g16);
		d->g16 = NULL;
	}
	return LOOM_OK;
}

void loom_ddp_set_sync(loom_ddp_t *d, int sync)
{
	d->sync = sync != 0;
}

int loom_ddp_wait(loom_ddp_t *d, loom_ddp_stats_t *st)
{
	loom_comm_stats_t now;
	double t0 = loom_now();
	int rc = d->err, launched = d->launched;
	for (int b = 0; b < d->nbuckets; b++) {
		bucket_t *k = &d->buckets[b];
		if (k->req) {
			int r = loom_wait(k->req);
			k->req = NULL;
			if (r == LOOM_OK && d->g16) /* the averaged bf16 gradients, widened back */
				loom__grad_from_bf16(d->grads + k->offset, d->g16 + k->offset, k->count);
			if (r != LOOM_OK && rc == LOOM_OK)
				rc = loom_seterr(r, "ddp: all-reduce of gradient bucket %d failed: %s", b,
				                 loom_comm_errmsg(d->comm));
		} else if (d->sync && rc == LOOM_OK) {
			rc = loom_seterr(LOOM_ESTATE, "ddp: gradient bucket %d (tensors %d..%d) was never complete: "
			                 "%d of %d gradients reported", b, k->lo, k->hi, k->ready, k->hi - k->lo + 1);
		}
		k->ready = 0;
	}
	loom_comm_stats(d->comm, &now);
	if (st) {
		st->exposed_comm_ms = 1e3 * (loom_now() - t0);
		st->comm_ms = launched ? 1e3 * (now.busy_s - d->at_launch.busy_s) : 0.0;
		st->buckets = launched;
	}
	d->launched = 0;
	d->err = LOOM_OK;
	d->sync = 1;
	return rc;
}

uint64_t loom_checksum_f32(const float *x, size_t n)
{
	/* Four independent multiply-xorshift lanes over the 32-bit words, folded at the end. */
	uint64_t h[4] = {0x9e3779b97f4a7c15ull, 0xc2b2ae3d27d4eb4full, 0x165667b19e3779f9ull, 0x27d4eb2f165667c5ull};
	const uint32_t *w = (const uint32_t *)(const void *)x;
	size_t i = 0;
	for (; i + 4 <= n; i += 4)
		for (int k = 0; k < 4; k++) {
			h[k] = (h[k] ^ w[i + k]) * 0x100000001b3ull;
			h[k] ^= h[k] >> 29;
		}
	for (; i < n; i++)
		h[0] = ((h[0] ^ w[i]) * 0x100000001b3ull) ^ (h[0] >> 29);
	return h[0] ^ (h[1] * 31) ^ (h[2] * 961) ^ (h[3] * 29791) ^ (uint64_t)n;
}

static int compare_checksums(loom_ddp_t *d, const char *what)
{
	int size = loom_comm_size(d->comm), rc, bad = 0;
	uint64_t mine = loom_checksum_f32(loom_model_params(d->model), d->nparams);
	uint64_t *all = loom__calloc((size_t)size, sizeof *all);
	char list[512] = "";
	size_t len = 0;
	if (!all)
		return loom_seterr(LOOM_ENOMEM, "ddp: out of memory");
	rc = loom_allgather(d->comm, &mine, all, 1, LOOM_INT64);
	if (rc != LOOM_OK) {
		free(all);
		return loom_seterr(rc, "ddp: %s: gathering parameter checksums failed: %s", what, loom_comm_errmsg(d->comm));
	}
	for (int r = 1; r < size; r++) {
		if (all[r] != all[0]) {
			bad++;
			if (len + 32 < sizeof list)
				len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", bad > 1 ? ", " : "", r);
		}
	}
	if (bad) {
		rc = loom_seterr(LOOM_EMISMATCH, "ddp: %s: parameters of rank(s) %s differ from rank 0's "
		                 "(checksum of rank 0 %016llx, of rank %d %016llx)", what, list,
		                 (unsigned long long)all[0], loom_comm_rank(d->comm), (unsigned long long)mine);
	}
	free(all);
	return rc;
}

int loom_ddp_broadcast_params(loom_ddp_t *d)
{
	int rc = loom_broadcast(d->comm, loom_model_params(d->model), d->nparams, LOOM_FLOAT32, 0);
	if (rc != LOOM_OK)
		return loom_seterr(rc, "ddp: broadcasting parameters from rank 0 failed: %s", loom_comm_errmsg(d->comm));
	return compare_checksums(d, "after broadcast");
}

int loom_ddp_check_replicas(loom_ddp_t *d)
{
	return compare_checksums(d, "replica check");
}

int loom_ddp_bucket(const loom_ddp_t *d, int b, size_t *offset, size_t *count)
{
	if (b >= 0 && b < d->nbuckets && offset && count) {
		*offset = d->buckets[b].offset;
		*count = d->buckets[b].count;
	}
	return d->nbuckets;
}

int loom_ddp_zero_copy(const loom_ddp_t *d)
{
	return d->shared;
}

float *loom_ddp_grads(loom_ddp_t *d)
{
	return d->grads;
}

/* ---- the "ddp" strategy ------------------------------------------------------------------------ */

typedef struct {
	loom_strategy_t base; /* first: a loom_strategy_t * is a ddp_strategy_t * */
	loom_ddp_t *ddp;
} ddp_strategy_t;

static void ddp_s_destroy(loom_strategy_t *s)
{
	ddp_strategy_t *d = (ddp_strategy_t *)s;
	loom_ddp_destroy(d->ddp); /* the model's gradient view goes back to its own buffer */
	loom__replica_free(s);
	free(d);
}

static int ddp_s_create(loom_strategy_t **out, const loom_strategy_config_t *cfg)
{
	ddp_strategy_t *d = loom__calloc(1, sizeof *d);
	int rc;
	*out = NULL;
	if (!d)
		return loom_seterr(LOOM_ENOMEM, "trainer: out of memory");
	d->base.ops = loom__ddp_strategy();
	/* PyTorch DDP's layout: the first bucket (the last layers, whose gradients come first) 1 MiB. */
	if ((rc = loom__ddp_create_used(&d->ddp, cfg->dp, cfg->model, cfg->bucket_mb, LOOM_MIN(1.0, cfg->bucket_mb),
	                                cfg->tensor_used)) ||
	    (rc = loom_ddp_set_reduce_dtype(d->ddp, cfg->grad_reduce_dtype)) ||
	    (rc = loom__replica_init(&d->base, cfg, loom_ddp_grads(d->ddp)))) {
		ddp_s_destroy(&d->base);
		return rc;
	}
	*out = &d->base;
	return LOOM_OK;
}

static void ddp_s_set_sync(loom_strategy_t *s, int sync)
{
	loom_ddp_set_sync(((ddp_strategy_t *)s)->ddp, sync);
}

static int ddp_s_finish_grads(loom_strategy_t *s, loom_strategy_stats_t *st)
{
	loom_ddp_stats_t ds;
	int rc = loom_ddp_wait(((ddp_strategy_t *)s)->ddp, &ds);
	st->comm_ms = ds.comm_ms, st->exposed_comm_ms = ds.exposed_comm_ms;
	return rc;
}

static int ddp_s_sync_params(loom_strategy_t *s)
{
	return loom_ddp_broadcast_params(((ddp_strategy_t *)s)->ddp);
}

static int ddp_s_check_replicas(loom_strategy_t *s)
{
	return loom_ddp_check_replicas(((ddp_strategy_t *)s)->ddp);
}

static const loom_strategy_ops_t ddp_ops = {
	.name = "ddp",
	.create = ddp_s_create,
	.destroy = ddp_s_destroy,
	.set_sync = ddp_s_set_sync,
	.finish_grads = ddp_s_finish_grads,
	.grad_norm = loom__replica_grad_norm,
	.optim_step = loom__replica_optim_step,
	.sync_params = ddp_s_sync_params,
	.check_replicas = ddp_s_check_replicas,
	.save = loom__replica_save,
	.load = loom__replica_load,
};

const loom_strategy_ops_t *loom__ddp_strategy(void)
{
	return &ddp_ops;
}
