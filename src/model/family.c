/* family.c: what every model family shares (family.h), written once: creation and destruction around a
 * family's sizes and layout, the parameter and gradient views, the hooks, the checks and entry points
 * of the unit calls over a family's passes, the helpers those passes call, and the sampling loop.
 *
 * The invariants are loom/gpt2.h's, for every family: every buffer is allocated in create and a
 * training step allocates nothing; activations are laid out for the capacity B x T (a smaller call
 * packs its rows at the start); each arena holds one micro-batch and the backward scratch is shared;
 * kernels reach tensors only through the views pview/gview, which point into the owned buffers or
 * wherever a caller set them; a pass reports its first reduction failure (tp_err) or the gemm's once,
 * at its end. Nothing here knows a family's tensors: units are found by the table's `layer`. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "model/family.h"
#include "model/fastmath.h"
#include "model/rng.h"

#define DEFAULT_CHUNK 512

#define F(m) LOOM__FAM(m)
#define CF(m) LOOM__CFAM(m)

static const char *name_of(const loom__fam_t *f)
{
	return f->kind->table->name;
}

/* ---- creation ---------------------------------------------------------------------------------------- */

float *loom__fam_carve(char *base, size_t *off, size_t nfloats)
{
	float *p = base ? (float *)(base + *off) : NULL;
	size_t b = loom__fam_size_mul(nfloats, sizeof(float));
	*off = b > SIZE_MAX - 63 || *off > SIZE_MAX - 63 - b ? SIZE_MAX : *off + (b + 63) / 64 * 64;
	return p;
}

/* The options' checks of create (LOOM_EINVAL with the detail). */
static int check_opts(const loom__fam_kind_t *k, const loom_model_config_t *cfg, const loom_model_opts_t *o)
{
	const char *who = k->table->name;
	int rc, L = cfg->n_layer;
	if ((rc = k->table->config_check(cfg)) != LOOM_OK)
		return rc;
	if (o->B <= 0 || o->T <= 0 || o->T > cfg->seq_len)
		return loom_seterr(LOOM_EINVAL, "%s create: batch %d x %d tokens (expected B >= 1 and 1 <= T <= %s %d)", who,
		                   o->B, o->T, k->len_name, cfg->seq_len);
	int lo = o->layer_lo, hi = o->layer_hi ? o->layer_hi : L;
	/* lo == hi == L: the head alone (a last pipeline stage whose head outweighs the blocks) */
	if (lo < 0 || (lo >= hi && !(lo == hi && hi == L)) || hi > L || o->arenas < 0)
		return loom_seterr(LOOM_EINVAL, "%s create: layers [%d, %d) with %d arenas (expected 0 <= lo < hi <= "
		                   "%s %d, or lo = hi = %s for the head alone, and arenas >= 1)", who, o->layer_lo,
		                   o->layer_hi, o->arenas, k->layers_name, L, k->layers_name);
	int tp = o->tp_size ? o->tp_size : 1;
	if (tp < 1 || o->tp_rank < 0 || o->tp_rank >= tp)
		return loom_seterr(LOOM_EINVAL, "%s create: tensor-parallel rank %d of %d (expected 0 <= rank < size)", who,
		                   o->tp_rank, tp);
	if ((int)o->act_ckpt < LOOM_ACT_CKPT_NONE || (int)o->act_ckpt > LOOM_ACT_CKPT_SELECTIVE)
		return loom_seterr(LOOM_EINVAL, "%s create: activation checkpointing mode %d (expected 0 none, 1 blocks, "
		                   "2 selective)", who, (int)o->act_ckpt);
	if (o->dtype != LOOM_COMPUTE_FP32 && o->dtype != LOOM_COMPUTE_BF16)
		return loom_seterr(LOOM_EINVAL, "%s create: dtype %d (expected fp32 or bf16)", who, (int)o->dtype);
	if (o->sequence_parallel && tp < 2)
		return loom_seterr(LOOM_EINVAL, "%s create: sequence parallelism shards the sequence over the "
		                   "tensor-parallel ranks and needs tp > 1 (tp_size %d)", who, o->tp_size);
	if (o->sequence_parallel && ((long)o->B * o->T) % tp != 0)
		return loom_seterr(LOOM_EINVAL, "%s create: sequence parallelism: the %d x %d = %ld positions of a "
		                   "micro-batch are not divisible by tp = %d (each rank holds an equal share)", who, o->B, o->T,
		                   (long)o->B * o->T, tp);
	if ((rc = loom__cp_opts_check(who, k->len_name, cfg, o)) != LOOM_OK)
		return rc;
	loom_bf16_path_t path;
	if (o->dtype == LOOM_COMPUTE_BF16 && (rc = loom_bf16_path(&path)) != LOOM_OK)
		return rc; /* LOOM_BF16 asks for what cannot run: its message says what is missing */
	return k->table->tp_check(cfg, tp);
}

/* The sizes create derives from the checked options (the shared ones, then the family's): everything
 * the layout reads. */
static void setup(loom__fam_t *f, const loom__fam_kind_t *k, const loom_model_config_t *cfg,
                  const loom_model_opts_t *o)
{
	int L = cfg->n_layer, tp = o->tp_size ? o->tp_size : 1;
	f->base.family = k->table;
	f->kind = k;
	f->cfg = *cfg;
	f->B = o->B, f->T = o->T;
	f->lo = o->layer_lo, f->hi = o->layer_hi ? o->layer_hi : L;
	f->has_embed = f->lo == 0, f->has_head = f->hi == L;
	f->narenas = o->arenas ? o->arenas : 1;
	f->gemm.dtype = o->dtype;
	if (o->dtype == LOOM_COMPUTE_BF16) { /* the path is the model's for its life (create checked it can run) */
		loom_bf16_path_t path = LOOM_BF16_AUTO; /* (AUTO again: chosen at the first GEMM, errors there) */
		(void)loom_bf16_path(&path);
		f->gemm.path = (int)path;
	}
	f->tp = tp, f->tp_rank = tp > 1 ? o->tp_rank : 0;
	f->nparams = k->table->shard_params(cfg, tp);
	f->ntensors = k->table->num_tensors(cfg);
	long chunk = loom_env_long("LOOM_CLS_CHUNK", DEFAULT_CHUNK, NULL);
	f->chunk = (int)LOOM_MAX(1, LOOM_MIN(chunk, (long)o->B * o->T));
	f->att_threads = LOOM_MAX(omp_get_max_threads(), omp_get_num_procs());
	f->act_ckpt = (int)o->act_ckpt;
	f->sp = o->sequence_parallel && tp > 1;
	f->cp = o->cp_size > 1 ? o->cp_size : 1, f->cp_rank = f->cp > 1 ? o->cp_rank : 0;
	f->cp_ring = f->cp > 1 && loom__cp_ring_env() == 1;
	f->cp_T = -1, f->cp_K = 2; /* the layout's K, computed at the first pass (loom__cp_chunks_memo) */
	k->setup(f, cfg);
}

/* The activations of a batch whose size does not fit in size_t. */
static int too_large(const char *who, const loom_model_config_t *cfg, const loom_model_opts_t *o)
{
	return loom_seterr(LOOM_ENOMEM, "%s create: the activations of batch %d x %d (L%d C%d H%d V%d) are larger than "
	                   "the address space (their byte count overflows); lower --batch-size or --seq-len", who, o->B,
	                   o->T, cfg->n_layer, cfg->n_embd, cfg->n_head, cfg->vocab_size);
}

int loom__fam_act_bytes(const loom__fam_kind_t *k, const loom_model_config_t *cfg, const loom_model_opts_t *o,
                        loom_model_act_bytes_t *out)
{
	loom__fam_t *f;
	int rc;
	memset(out, 0, sizeof *out);
	if ((rc = check_opts(k, cfg, o)) != LOOM_OK)
		return rc;
	if (!(f = loom__calloc(1, k->size)))
		return loom_seterr(LOOM_ENOMEM, "%s act_bytes: out of memory (%zu bytes)", k->table->name, k->size);
	setup(f, k, cfg, o);
	size_t bytes = k->layout(f, NULL, out);
	free(f);
	return bytes == SIZE_MAX ? too_large(k->table->name, cfg, o) : LOOM_OK;
}

static void point_params(loom__fam_t *f, float *params)
{
	f->params = params;
	for (int i = 0; i < f->ntensors; i++)
		f->pview[i] = params ? params + f->tensors[i].offset : NULL;
}

static void point_grads(loom__fam_t *f, float *grads)
{
	f->grads = grads;
	f->grad_split = 0;
	for (int i = 0; i < f->ntensors; i++)
		f->gview[i] = grads ? grads + f->tensors[i].offset : NULL;
}

int loom__fam_create(const loom__fam_kind_t *k, loom_model_t **out, const loom_model_config_t *cfg,
                     const loom_model_opts_t *o)
{
	loom__fam_t *f = NULL;
	int rc, tp = o->tp_size ? o->tp_size : 1;
	*out = NULL;
	if ((rc = check_opts(k, cfg, o)) != LOOM_OK)
		return rc;
	size_t want = k->size; /* the allocation being attempted, for the message */
	if (!(f = loom__calloc(1, k->size)))
		goto nomem;
	setup(f, k, cfg, o);
	want = (size_t)f->ntensors * sizeof *f->tensors;
	if (!(f->tensors = loom__calloc((size_t)f->ntensors, sizeof *f->tensors)) ||
	    !(f->pview = loom__calloc((size_t)f->ntensors, sizeof *f->pview)) ||
	    !(f->gview = loom__calloc((size_t)f->ntensors, sizeof *f->gview)) || k->alloc(f) != LOOM_OK)
		goto nomem;
	for (int i = 0; i < f->ntensors; i++)
		k->table->shard_info(cfg, tp, i, &f->tensors[i]);
	want = f->nparams * sizeof(float);
	if ((!o->no_own_params && !(f->params_own = loom_alloc_aligned(want))) ||
	    (!o->no_own_grads && !(f->grads_own = loom_alloc_aligned(want))))
		goto nomem;
	point_params(f, f->params_own);
	point_grads(f, f->grads_own);
	want = k->layout(f, NULL, &f->act);
	if (want == SIZE_MAX) {
		loom__fam_destroy(&f->base);
		return too_large(k->table->name, cfg, o);
	}
	if (!(f->mem = loom_alloc_aligned(want)))
		goto nomem;
	k->layout(f, f->mem, &f->act);
	if (f->rot > 0) {
		size_t n = (size_t)f->T * f->cp * f->rot; /* cos and sin: (cp T, rot) each */
		want = 2 * n * sizeof(float);
		if (!(f->rope = loom_alloc_aligned(want)))
			goto nomem;
		f->cos = f->rope, f->sin = f->rope + n;
		k->rotary(f);
	}
	loom__gemm_setup_threads();
	*out = &f->base;
	return LOOM_OK;
nomem:
	loom__fam_destroy(f ? &f->base : NULL);
	return loom_seterr(LOOM_ENOMEM, "%s create: out of memory for L%d C%d V%d with batch %d x %d, layers [%d, %d), "
	                   "%d arenas, activation checkpointing %s (%zu bytes requested; parameters and gradients take "
	                   "%zu bytes each)", k->table->name, cfg->n_layer, cfg->n_embd, cfg->vocab_size, o->B, o->T,
	                   o->layer_lo, o->layer_hi ? o->layer_hi : cfg->n_layer, o->arenas ? o->arenas : 1,
	                   loom_act_ckpt_name(o->act_ckpt), want, k->table->shard_params(cfg, tp) * sizeof(float));
}

void loom__fam_destroy(loom_model_t *m)
{
	loom__fam_t *f = F(m);
	if (!f)
		return;
	f->kind->release(f);
	loom__gemm_ctx_free(&f->gemm);
	loom_free_aligned(f->mem);
	loom_free_aligned(f->rope);
	loom_free_aligned(f->params_own);
	loom_free_aligned(f->grads_own);
	free(f->tensors);
	free(f->pview);
	free(f->gview);
	free(f);
}

/* ---- tensor-parallel shards ---------------------------------------------------------------------------- */

void loom__fam_tp_copy_tensor(const loom_model_config_t *cfg, int tp, int r, int i, float *full, float *shard,
                              int to_shard)
{
	const loom_model_family_t *fam = loom_model_family(cfg->arch);
	loom_tensor_info_t f, s;
	fam->shard_info(cfg, 1, i, &f);
	fam->shard_info(cfg, tp, i, &s);
	size_t cols = f.ndim == 2 ? f.shape[1] : f.shape[0];
	size_t srows = s.ndim == 2 ? s.shape[0] : 1, scols = s.ndim == 2 ? s.shape[1] : s.shape[0];
	size_t r0 = 0, c0 = 0;
	if (f.tp_dim == 0 && f.ndim == 2)
		r0 = (size_t)r * srows;
	else if (f.tp_dim == 0 || f.tp_dim == 1) /* a split vector, or a matrix split by columns */
		c0 = (size_t)r * scols;
	for (size_t a = 0; a < srows; a++) {
		float *pf = full + (r0 + a) * cols + c0, *ps = shard + a * scols;
		if (to_shard)
			memcpy(ps, pf, scols * sizeof(float));
		else
			memcpy(pf, ps, scols * sizeof(float));
	}
}

static void shard_copy(const loom_model_config_t *cfg, int tp, int r, float *full, float *shard, int to_shard)
{
	const loom_model_family_t *fam = loom_model_family(cfg->arch);
	int n = fam->num_tensors(cfg);
	for (int i = 0; i < n; i++) {
		loom_tensor_info_t f, s;
		fam->shard_info(cfg, 1, i, &f);
		fam->shard_info(cfg, tp, i, &s);
		loom__fam_tp_copy_tensor(cfg, tp, r, i, full + f.offset, shard + s.offset, to_shard);
	}
}

void loom__fam_tp_shard(const loom_model_config_t *cfg, int tp, int r, const float *full, float *shard)
{
	shard_copy(cfg, tp, r, (float *)full, shard, 1); /* full is only read */
}

void loom__fam_tp_unshard(const loom_model_config_t *cfg, int tp, int r, const float *shard, float *full)
{
	shard_copy(cfg, tp, r, full, (float *)shard, 0); /* shard is only read */
}

/* ---- the shared state -------------------------------------------------------------------------------- */

const loom_model_config_t *loom__fam_config(const loom_model_t *m)
{
	return &CF(m)->cfg;
}

loom_compute_dtype_t loom__fam_dtype(const loom_model_t *m)
{
	return (loom_compute_dtype_t)CF(m)->gemm.dtype;
}

const loom_tensor_info_t *loom__fam_tensors(const loom_model_t *m, int *n)
{
	if (n)
		*n = CF(m)->ntensors;
	return CF(m)->tensors;
}

size_t loom__fam_param_count(const loom_model_t *m)
{
	return CF(m)->nparams;
}

float *loom__fam_params(loom_model_t *m)
{
	return F(m)->params;
}

float *loom__fam_grads(loom_model_t *m)
{
	return F(m)->grads;
}

int loom__fam_set_grad_buffer(loom_model_t *m, float *grads)
{
	if (!grads)
		return loom_seterr(LOOM_EINVAL, "%s set_grad_buffer: NULL buffer", name_of(F(m)));
	point_grads(F(m), grads);
	return LOOM_OK;
}

int loom__fam_own_grads(loom_model_t *m)
{
	loom__fam_t *f = F(m);
	if (!f->grads_own && !(f->grads_own = loom_alloc_aligned(f->nparams * sizeof(float))))
		return loom_seterr(LOOM_ENOMEM, "%s own_grads: out of memory for %zu gradients", name_of(f), f->nparams);
	point_grads(f, f->grads_own);
	return LOOM_OK;
}

int loom__fam_set_param_buffer(loom_model_t *m, float *params)
{
	loom__fam_t *f = F(m);
	if (!params && !f->params_own && !(f->params_own = loom_alloc_aligned(f->nparams * sizeof(float))))
		return loom_seterr(LOOM_ENOMEM, "%s set_param_buffer: out of memory for %zu parameters", name_of(f),
		                   f->nparams);
	point_params(f, params ? params : f->params_own);
	return LOOM_OK;
}

int loom__fam_set_tensor_view(loom_model_t *m, int tensor, float *param, float *grad)
{
	loom__fam_t *f = F(m);
	if (tensor < 0 || tensor >= f->ntensors)
		return loom_seterr(LOOM_EINVAL, "%s set_tensor_view: tensor %d out of range [0, %d)", name_of(f), tensor,
		                   f->ntensors);
	if (param)
		f->pview[tensor] = param;
	if (grad) {
		f->gview[tensor] = grad;
		f->grad_split = 1;
	}
	return LOOM_OK;
}

/* The unit's tensors from the table: contiguous, units in order (loom/model.h). */
int loom__fam_set_unit_view(loom_model_t *m, int unit, float *params, float *grads)
{
	loom__fam_t *f = F(m);
	int L = f->cfg.n_layer, first = 0, end;
	if (unit < -1 || unit > L)
		return loom_seterr(LOOM_EINVAL, "%s set_unit_view: unit %d out of range [-1, %d]", name_of(f), unit, L);
	while (first < f->ntensors && f->tensors[first].layer != unit)
		first++;
	for (end = first; end < f->ntensors && f->tensors[end].layer == unit; end++) {
		size_t at = f->tensors[end].offset - f->tensors[first].offset;
		loom__fam_set_tensor_view(m, end, params ? params + at : NULL, grads ? grads + at : NULL);
	}
	return LOOM_OK;
}

float *loom__fam_tensor_param(loom_model_t *m, int t)
{
	return t >= 0 && t < F(m)->ntensors ? F(m)->pview[t] : NULL;
}

float *loom__fam_tensor_grad(loom_model_t *m, int t)
{
	return t >= 0 && t < F(m)->ntensors ? F(m)->gview[t] : NULL;
}

void loom__fam_layers(const loom_model_t *m, int *lo, int *hi, int *arenas)
{
	if (lo)
		*lo = CF(m)->lo;
	if (hi)
		*hi = CF(m)->hi;
	if (arenas)
		*arenas = CF(m)->narenas;
}

loom_act_ckpt_t loom__fam_act_ckpt(const loom_model_t *m)
{
	return (loom_act_ckpt_t)CF(m)->act_ckpt;
}

int loom__fam_sequence_parallel(const loom_model_t *m)
{
	return CF(m)->sp;
}

long long loom__fam_recomputes(const loom_model_t *m)
{
	return CF(m)->recomputes;
}

void loom__fam_model_act_bytes(const loom_model_t *m, loom_model_act_bytes_t *out)
{
	*out = CF(m)->act;
}

void loom__fam_on_grad_ready(loom_model_t *m, loom_grad_ready_fn fn, void *ctx)
{
	F(m)->on_ready = fn;
	F(m)->on_ready_ctx = ctx;
}

void loom__fam_on_param_use(loom_model_t *m, loom_param_use_fn fn, void *ctx)
{
	F(m)->on_use = fn;
	F(m)->on_use_ctx = ctx;
}

void loom__fam_on_tp_reduce(loom_model_t *m, loom_tp_reduce_fn fn, void *ctx)
{
	F(m)->tp_reduce = fn;
	F(m)->tp_ctx = ctx;
}

void loom__fam_on_cp_reduce(loom_model_t *m, loom_tp_reduce_fn fn, void *ctx)
{
	F(m)->cp_fn = fn;
	F(m)->cp_ctx = ctx;
}

int loom__fam_tp_size(const loom_model_t *m)
{
	return CF(m)->tp;
}

int loom__fam_tp_rank(const loom_model_t *m)
{
	return CF(m)->tp_rank;
}

int loom__fam_cp_size(const loom_model_t *m)
{
	return CF(m)->cp;
}

int loom__fam_cp_rank(const loom_model_t *m)
{
	return CF(m)->cp_rank;
}

const float *loom__fam_last_logits(const loom_model_t *m)
{
	return CF(m)->last_logits;
}

void loom__fam_zero_grad(loom_model_t *m)
{
	loom__fam_t *f = F(m);
	if (!f->grad_split) {
		if (f->grads)
			loom__fam_zero(f->grads, f->nparams);
		return;
	}
	for (int i = 0; i < f->ntensors; i++)
		if (f->gview[i])
			loom__fam_zero(f->gview[i], f->tensors[i].numel);
}

void loom__fam_profile(loom_model_t *m, int enable)
{
	(void)m, (void)enable;
}

void loom__fam_profile_report(loom_model_t *m, void *file, int steps)
{
	(void)steps;
	fprintf((FILE *)file, "%s: no per-kernel profile (not implemented for this family)\n", name_of(F(m)));
}

float *loom__fam_stream_grad(loom_model_t *m)
{
	return F(m)->dres;
}

/* ---- checks ------------------------------------------------------------------------------------------ */

int loom__fam_check_tokens(const loom__fam_t *f, const int *ids, int n, int T, const char *what)
{
	int V = f->cfg.vocab_size;
	if (!ids)
		return loom_seterr(LOOM_EINVAL, "%s: %s is NULL", name_of(f), what);
	for (int i = 0; i < n; i++)
		if (ids[i] < 0 || ids[i] >= V)
			return loom_seterr(LOOM_EINVAL, "%s: token id %d at %s[b=%d][t=%d] is outside the vocabulary [0, %d)",
			                   name_of(f), ids[i], what, i / T, i % T, V);
	return LOOM_OK;
}

/* Arena mb, unit (-1 embedding, a held block, L head), the hooks a parallel model needs, and the size of a
 * unit call. */
static int check_unit(const loom__fam_t *f, int mb, int unit, int B, int T, const char *op)
{
	const char *who = name_of(f);
	int L = f->cfg.n_layer;
	if (mb < 0 || mb >= f->narenas)
		return loom_seterr(LOOM_EINVAL, "%s %s: arena %d out of range [0, %d)", who, op, mb, f->narenas);
	if (unit < 0 && !f->has_embed)
		return loom_seterr(LOOM_EINVAL, "%s %s: the model does not hold the embedding (blocks [%d, %d))", who, op,
		                   f->lo, f->hi);
	if (unit >= 0 && unit < L && (unit < f->lo || unit >= f->hi))
		return loom_seterr(LOOM_EINVAL, "%s %s: block %d is not held (blocks [%d, %d))", who, op, unit, f->lo, f->hi);
	if (unit >= L && !f->has_head)
		return loom_seterr(LOOM_EINVAL, "%s %s: the model does not hold the head (blocks [%d, %d) of %d)", who, op,
		                   f->lo, f->hi, L);
	if (f->tp > 1 && !f->tp_reduce)
		return loom_seterr(LOOM_EINVAL, "%s %s: tensor-parallel rank %d of %d has no reduction "
		                   "(loom_model_on_tp_reduce)", who, op, f->tp_rank, f->tp);
	if (B <= 0 || T <= 0 || B > f->B || T > f->T)
		return loom_seterr(LOOM_EINVAL, "%s %s: batch %d x %d tokens does not fit the model's %d x %d (from create)",
		                   who, op, B, T, f->B, f->T);
	if (f->sp && (B * T) % f->tp != 0)
		return loom_seterr(LOOM_EINVAL, "%s %s: sequence parallelism: the %d x %d positions are not divisible by "
		                   "tp = %d", who, op, B, T, f->tp);
	if (f->cp > 1 && !f->cp_fn)
		return loom_seterr(LOOM_EINVAL, "%s %s: context-parallel rank %d of %d has no gather "
		                   "(loom_model_on_cp_reduce)", who, op, f->cp_rank, f->cp);
	if (f->cp > 1 && T % 2 != 0)
		return loom_seterr(LOOM_EINVAL, "%s %s: context parallel: %d rows of each sequence are not two equal "
		                   "chunks (an even number is needed)", who, op, T);
	return LOOM_OK;
}

static int check_block(const loom__fam_t *f, int mb, int l, int B, int T, const char *op)
{
	int rc;
	if (l < f->lo || l >= f->hi)
		return loom_seterr(LOOM_EINVAL, "%s %s: block %d is not held (blocks [%d, %d))", name_of(f), op, l, f->lo,
		                   f->hi);
	if ((rc = check_unit(f, mb, l, B, T, op)) != LOOM_OK)
		return rc;
	return f->kind->block_check ? f->kind->block_check(f, mb, op) : LOOM_OK;
}

/* A tensor- or context-parallel model has no whole logits to return: it computes losses only. */
static int check_targets(const loom__fam_t *f, const int *targets, const char *op)
{
	if (f->tp > 1 && !targets)
		return loom_seterr(LOOM_EINVAL, "%s %s: a tensor-parallel model computes losses only (its logits are split "
		                   "across ranks); load the checkpoint into a whole model to sample", name_of(f), op);
	if (f->cp > 1 && !targets)
		return loom_seterr(LOOM_EINVAL, "%s %s: a context-parallel model computes losses only (it holds chunks "
		                   "of each sequence); load the checkpoint into a whole model to sample", name_of(f), op);
	return LOOM_OK;
}

static int check_call(const loom__fam_t *f, const int *inputs, const int *targets, int B, int T, const char *op)
{
	int rc;
	if (!f->has_embed || !f->has_head)
		return loom_seterr(LOOM_EINVAL, "%s %s: needs every layer, the model holds blocks [%d, %d) of %d",
		                   name_of(f), op, f->lo, f->hi, f->cfg.n_layer);
	if ((rc = check_unit(f, 0, -1, B, T, op)) != LOOM_OK || (rc = check_targets(f, targets, op)) != LOOM_OK ||
	    (rc = loom__fam_check_tokens(f, inputs, B * T, T, "inputs")) != LOOM_OK)
		return rc;
	if (targets && (rc = loom__fam_check_tokens(f, targets, B * T, T, "targets")) != LOOM_OK)
		return rc;
	return LOOM_OK;
}

/* ---- the unit calls ---------------------------------------------------------------------------------- */

/* The pass's status: its first reduction failure, else the gemm's; both cleared for the next pass. */
static int status(loom__fam_t *f)
{
	int rc = f->tp_err, grc = loom__gemm_status(&f->gemm);
	f->tp_err = 0;
	return rc ? rc : grc;
}

int loom__fam_embed_forward(loom_model_t *m, int mb, const int *inputs, int B, int T)
{
	loom__fam_t *f = F(m);
	int rc;
	if ((rc = check_unit(f, mb, -1, B, T, "embed_forward")) != LOOM_OK ||
	    (rc = loom__fam_check_tokens(f, inputs, B * T, T, "inputs")) != LOOM_OK)
		return rc;
	loom__gemm_setup(&f->gemm);
	f->kind->embed_forward(f, mb, inputs, B, T);
	return status(f);
}

int loom__fam_block_forward(loom_model_t *m, int mb, int l, int B, int T)
{
	loom__fam_t *f = F(m);
	int rc;
	if ((rc = check_block(f, mb, l, B, T, "block_forward")) != LOOM_OK)
		return rc;
	loom__gemm_setup(&f->gemm);
	f->kind->block_forward(f, mb, l, B, T);
	return status(f);
}

int loom__fam_head_forward(loom_model_t *m, int mb, const int *targets, int B, int T, float *loss)
{
	loom__fam_t *f = F(m);
	int rc;
	if ((rc = check_unit(f, mb, f->cfg.n_layer, B, T, "head_forward")) != LOOM_OK ||
	    (targets && (rc = loom__fam_check_tokens(f, targets, B * T, T, "targets")) != LOOM_OK) ||
	    (rc = check_targets(f, targets, "head_forward")) != LOOM_OK)
		return rc;
	loom__gemm_setup(&f->gemm);
	f->kind->head_forward(f, mb, targets, B, T, loss);
	return status(f);
}

int loom__fam_head_forward_backward_rows(loom_model_t *m, int mb, const int *targets, int B, int T, int row0,
                                         int rows, float grad_scale, float *loss)
{
	loom__fam_t *f = F(m);
	int rc;
	if ((rc = check_unit(f, mb, f->cfg.n_layer, B, T, "head_forward_backward")) != LOOM_OK)
		return rc;
	if (row0 < 0 || rows < 1 || row0 > B * T - rows)
		return loom_seterr(LOOM_EINVAL, "%s head_forward_backward_rows: rows [%d, %d) of a batch of %d x %d "
		                   "positions", name_of(f), row0, row0 + rows, B, T);
	if (!targets)
		return loom_seterr(LOOM_EINVAL, "%s head_forward_backward: targets are NULL", name_of(f));
	if ((rc = loom__fam_check_tokens(f, targets + row0, rows, T, "targets")) != LOOM_OK)
		return rc;
	loom__gemm_setup(&f->gemm);
	f->kind->head_forward_backward(f, mb, targets, B * T, row0, rows, grad_scale, loss);
	return status(f);
}

int loom__fam_head_forward_backward(loom_model_t *m, int mb, const int *targets, int B, int T, float grad_scale,
                                    float *loss)
{
	if (B <= 0 || T <= 0)
		return loom_seterr(LOOM_EINVAL, "%s head_forward_backward: batch %d x %d", name_of(F(m)), B, T);
	return loom__fam_head_forward_backward_rows(m, mb, targets, B, T, 0, B * T, grad_scale, loss);
}

int loom__fam_block_backward(loom_model_t *m, int mb, int l, int B, int T)
{
	loom__fam_t *f = F(m);
	int rc;
	if ((rc = check_block(f, mb, l, B, T, "block_backward")) != LOOM_OK)
		return rc;
	loom__gemm_setup(&f->gemm);
	f->kind->block_backward(f, mb, l, B, T);
	return status(f);
}

int loom__fam_embed_backward(loom_model_t *m, int mb, const int *inputs, int B, int T)
{
	loom__fam_t *f = F(m);
	int rc;
	if ((rc = check_unit(f, mb, -1, B, T, "embed_backward")) != LOOM_OK ||
	    (rc = loom__fam_check_tokens(f, inputs, B * T, T, "inputs")) != LOOM_OK)
		return rc;
	loom__gemm_setup(&f->gemm);
	f->kind->embed_backward(f, mb, inputs, B, T);
	return status(f);
}

float *loom__fam_block_input(loom_model_t *m, int mb, int l)
{
	loom__fam_t *f = F(m);
	if (mb < 0 || mb >= f->narenas || l < f->lo || l > f->hi)
		return NULL;
	return f->kind->stream(f, mb, l);
}

/* ---- the whole model: the same passes in order on arena 0 ------------------------------------------- */

int loom__fam_forward(loom_model_t *m, const int *inputs, const int *targets, int B, int T, float *loss)
{
	loom__fam_t *f = F(m);
	const loom__fam_kind_t *k = f->kind;
	int rc;
	if ((rc = check_call(f, inputs, targets, B, T, "forward")) != LOOM_OK)
		return rc;
	loom__gemm_setup(&f->gemm);
	k->embed_forward(f, 0, inputs, B, T);
	for (int l = 0; l < f->cfg.n_layer; l++)
		k->block_forward(f, 0, l, B, T);
	k->head_forward(f, 0, targets, B, T, loss);
	return status(f);
}

int loom__fam_forward_backward(loom_model_t *m, const int *inputs, const int *targets, int B, int T,
                               float grad_scale, float *loss)
{
	loom__fam_t *f = F(m);
	const loom__fam_kind_t *k = f->kind;
	int rc, L = f->cfg.n_layer;
	if (!targets)
		return loom_seterr(LOOM_EINVAL, "%s forward_backward: targets are NULL", name_of(f));
	if ((rc = check_call(f, inputs, targets, B, T, "forward_backward")) != LOOM_OK)
		return rc;
	loom__gemm_setup(&f->gemm);
	k->embed_forward(f, 0, inputs, B, T);
	for (int l = 0; l < L; l++)
		k->block_forward(f, 0, l, B, T);
	k->head_forward_backward(f, 0, targets, B * T, 0, B * T, grad_scale, loss);
	for (int l = L - 1; l >= 0; l--)
		k->block_backward(f, 0, l, B, T);
	k->embed_backward(f, 0, inputs, B, T);
	return status(f);
}

/* ---- helpers of the passes --------------------------------------------------------------------------- */

void loom__fam_param_use(loom__fam_t *f, int unit, int phase)
{
	if (f->on_use)
		f->on_use(f->on_use_ctx, unit, phase);
}

void loom__fam_ready(loom__fam_t *f, int i)
{
	if (i >= 0 && f->on_ready)
		f->on_ready(f->on_ready_ctx, i);
}

void loom__fam_tp_reduce(loom__fam_t *f, float *buf, size_t n, loom_tp_op_t op)
{
	if (f->tp <= 1 || f->tp_err)
		return;
	int rc = f->tp_reduce(f->tp_ctx, buf, n, op);
	if (rc != LOOM_OK)
		f->tp_err = rc;
}

void loom__fam_zero(float *p, size_t n)
{
	const size_t block = 16384;
#pragma omp parallel for schedule(static) if (n >= 4 * block)
	for (size_t i = 0; i < n; i += block)
		memset(p + i, 0, sizeof(float) * (n - i < block ? n - i : block));
}

float loom__fam_mean_loss(const float *losses, int n, int N)
{
	double s = 0.0;
	for (int i = 0; i < n; i++)
		s += losses[i];
	return (float)(s / N);
}

const float *loom__fam_sp_gather(loom__fam_t *f, const float *x, int N, int C)
{
	if (!f->sp)
		return x;
	memcpy(f->ftmp + loom__fam_sp_row0(f, N) * C, x, sizeof(float) * (size_t)(N / f->tp) * C);
	loom__fam_tp_reduce(f, f->ftmp, (size_t)N * C, LOOM_TP_ALLGATHER);
	return f->ftmp;
}

void loom__fam_rope(loom__fam_t *f, loom__fam_rope_fn fn, float *x, int B, int T, int H, int D)
{
	if (f->cp <= 1) {
		fn(x, f->cos, f->sin, B * T, T, 0, H, D);
		return;
	}
	int K = loom__fam_cp_chunks(f, T), c = T / K;
	for (int b = 0; b < B; b++)
		for (int h = 0; h < K; h++)
			fn(x + ((size_t)b * T + (size_t)h * c) * H * D, f->cos, f->sin, c, c,
			   loom__cp_pos(h * c, T, f->cp, f->cp_rank, K), H, D);
}

void loom__fam_tp_classifier(loom__fam_t *f, float *losses, float *dx, float *dw, const float *x, const float *w,
                             const int *targets, float dloss, int N, int C, int v0, int Vv, loom__fam_logits_fn logits,
                             float softcap)
{
	const float inv = softcap > 0.0f ? 1.0f / softcap : 0.0f;
	for (int n0 = 0; n0 < N; n0 += f->chunk) {
		int nc = LOOM_MIN(f->chunk, N - n0);
		float *mx = f->tp_stats, *sums = f->tp_stats + nc, *z = f->logits;
		if (Vv > 0 && logits)
			logits(z, x + (size_t)n0 * C, C, w, nc, C, Vv);
		else if (Vv > 0)
			loom__gemm(0, 1, nc, Vv, C, 1.0f, x + (size_t)n0 * C, C, w, C, 0.0f, z, Vv);
		for (int i = 0; i < nc; i++) {
			const float *zi = z + (size_t)i * Vv;
			float v = -INFINITY;
#pragma omp simd reduction(max : v)
			for (int j = 0; j < Vv; j++)
				v = zi[j] > v ? zi[j] : v;
			mx[i] = v;
		}
		loom__fam_tp_reduce(f, mx, (size_t)nc, LOOM_TP_MAX);
#pragma omp parallel for schedule(static) if ((long)nc * Vv >= 32768)
		for (int i = 0; i < nc; i++) {
			const float *zi = z + (size_t)i * Vv;
			float s = 0.0f;
			int t = targets[n0 + i] - v0;
#pragma omp simd reduction(+ : s)
			for (int j = 0; j < Vv; j++)
				s += fast_expf(zi[j] - mx[i]);
			sums[2 * i] = s;
			sums[2 * i + 1] = t >= 0 && t < Vv ? zi[t] : 0.0f;
		}
		loom__fam_tp_reduce(f, sums, 2 * (size_t)nc, LOOM_TP_SUM);
		for (int i = 0; i < nc; i++)
			losses[n0 + i] = logf(sums[2 * i]) + mx[i] - sums[2 * i + 1];
		if (!dx || Vv == 0)
			continue;
#pragma omp parallel for schedule(static) if ((long)nc * Vv >= 32768)
		for (int i = 0; i < nc; i++) {
			float *zi = z + (size_t)i * Vv, g = dloss / sums[2 * i];
			int t = targets[n0 + i] - v0;
			if (softcap > 0.0f) { /* through the cap: d(c tanh(z/c))/dz = 1 - (logit/c)^2 */
#pragma omp simd
				for (int j = 0; j < Vv; j++) {
					float c = zi[j], u = c * inv;
					zi[j] = (g * fast_expf(c - mx[i]) - (j == t ? dloss : 0.0f)) * (1.0f - u * u);
				}
			} else {
#pragma omp simd
				for (int j = 0; j < Vv; j++)
					zi[j] = g * fast_expf(zi[j] - mx[i]) - (j == t ? dloss : 0.0f);
			}
		}
		loom__gemm(0, 0, nc, C, Vv, 1.0f, z, Vv, w, C, 1.0f, dx + (size_t)n0 * C, C);
		loom__gemm(1, 0, Vv, C, nc, 1.0f, z, Vv, x + (size_t)n0 * C, C, 1.0f, dw, C);
	}
	if (dx)
		loom__fam_tp_reduce(f, dx, (size_t)N * C, LOOM_TP_SUM);
}

/* Context parallel: the attention's group, form, hook and scratch. */
static loom__cp_t cp_of(loom__fam_t *f, int T)
{
	loom__cp_t cp = {.N = f->cp, .r = f->cp_rank, .K = loom__fam_cp_chunks(f, T), .ring = f->cp_ring, .fn = f->cp_fn,
	                 .ctx = f->cp_ctx, .mem = f->cp_mem, .scratch = f->att_scratch, .scratch_threads = f->att_threads};
	return cp;
}

int loom__fam_cp_chunks(loom__fam_t *f, int T)
{
	return loom__cp_chunks_memo(&f->cfg, f->cp, T, &f->cp_T, &f->cp_K);
}

void loom__fam_attention_forward(loom__fam_t *f, const loom__flash_t *a, float *out, int ldo, float *lse)
{
	if (f->cp <= 1) {
		loom__flash_forward(a, out, ldo, lse);
		return;
	}
	if (f->tp_err)
		return;
	loom__cp_t cp = cp_of(f, a->Tq);
	f->tp_err = loom__cp_attention_forward(&cp, a, out, ldo, lse);
}

void loom__fam_attention_backward(loom__fam_t *f, const loom__flash_t *a, float *dq, int ldq, float *dk, float *dv,
                                  int ldk, const float *dout, const float *out, int ldo, const float *lse)
{
	if (f->cp <= 1) {
		loom__flash_backward(a, dq, ldq, dk, dv, ldk, dout, ldo, out, ldo, lse, f->att_scratch, f->att_threads);
		return;
	}
	if (f->tp_err)
		return;
	loom__cp_t cp = cp_of(f, a->Tq);
	f->tp_err = loom__cp_attention_backward(&cp, a, dq, ldq, dk, dv, ldk, dout, ldo, out, ldo, lse);
}

/* ---- sampling ---------------------------------------------------------------------------------------- */

int loom__fam_generate_check(const loom__fam_t *f, const int *prompt, int n_prompt, int max_new, float temperature,
                             int top_k, const int *out, int *n_out)
{
	const char *who = name_of(f);
	int V = f->cfg.vocab_size;
	if (n_out)
		*n_out = 0;
	if (!n_out || (max_new > 0 && !out) || max_new < 0)
		return loom_seterr(LOOM_EINVAL, "%s generate: max_new %d with out %s and n_out %s", who, max_new,
		                   out ? "given" : "NULL", n_out ? "given" : "NULL");
	if (!prompt || n_prompt < 1 || n_prompt > f->T)
		return loom_seterr(LOOM_EINVAL, "%s generate: prompt of %d tokens (expected 1 to %d, the model's T)", who,
		                   n_prompt, f->T);
	if (!(temperature >= 0.0f) || !isfinite(temperature) || top_k < 0)
		return loom_seterr(LOOM_EINVAL, "%s generate: temperature %g, top_k %d (expected >= 0 each)", who,
		                   (double)temperature, top_k);
	for (int i = 0; i < n_prompt; i++)
		if (prompt[i] < 0 || prompt[i] >= V)
			return loom_seterr(LOOM_EINVAL, "%s generate: prompt token %d at %d is outside the vocabulary [0, %d)",
			                   who, prompt[i], i, V);
	return LOOM_OK;
}

int loom__fam_kv_alloc(loom__fam_t *f, size_t size, size_t (*layout)(const loom__fam_t *f, void *kv, char *base),
                       void **kv)
{
	*kv = NULL;
	if (!f->has_embed || !f->has_head || f->tp > 1 || f->cp > 1)
		return loom_seterr(LOOM_EINVAL, "%s generate: needs the whole model (blocks [%d, %d) of %d held, tp %d, "
		                   "cp %d)", name_of(f), f->lo, f->hi, f->cfg.n_layer, f->tp, f->cp);
	void **c = loom__calloc(1, size); /* a cache's first member is its allocation */
	size_t bytes = c ? layout(f, c, NULL) : size;
	if (!c || !(*c = loom_alloc_aligned(bytes))) {
		free(c);
		return loom_seterr(LOOM_ENOMEM, "%s generate: out of memory for the KV cache (%zu bytes)", name_of(f), bytes);
	}
	layout(f, c, *c);
	*kv = c;
	return LOOM_OK;
}

void loom__fam_kv_free(void *kv)
{
	if (kv) {
		loom_free_aligned(*(void **)kv);
		free(kv);
	}
}

void loom__fam_sample(loom__fam_t *f, loom__fam_step_fn step, const float *logits, float *topk, int n_prompt,
                      int max_new, float temperature, int top_k, uint64_t seed, int stop_token, int *out, int *n_out,
                      void (*on_token)(void *ctx, int token), void *ctx)
{
	int V = f->cfg.vocab_size, T = f->T;
	rng_t r;
	rng_seed(&r, seed);
	for (int pos = n_prompt; *n_out < max_new && pos < T; pos++) {
		int tok = loom__sample_token(logits, V, temperature, top_k, topk, &r);
		out[(*n_out)++] = tok;
		if (on_token)
			on_token(ctx, tok);
		if (tok == stop_token || *n_out == max_new || pos + 1 == T)
			break;
		step(f, tok, pos);
	}
}

int loom__fam_generate(loom_model_t *m, const int *prompt, int n_prompt, int max_new, float temperature, int top_k,
                       uint64_t seed, int stop_token, int *out, int *n_out, void (*on_token)(void *ctx, int token),
                       void *ctx)
{
	loom__fam_t *f = F(m);
	int rc;
	if ((rc = loom__fam_generate_check(f, prompt, n_prompt, max_new, temperature, top_k, out, n_out)) != LOOM_OK ||
	    (rc = f->kind->kv_cache_alloc(m)) != LOOM_OK)
		return rc;
	loom__gemm_setup(&f->gemm);
	for (int p = 0; p < n_prompt; p++)
		f->kind->step(f, prompt[p], p);
	loom__fam_sample(f, f->kind->step, f->kv_logits, f->kv_topk, n_prompt, max_new, temperature, top_k, seed,
	                 stop_token, out, n_out, on_token, ctx);
	return loom__gemm_status(&f->gemm);
}
