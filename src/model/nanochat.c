/* nanochat.c: nanochat's GPT (karpathy/nanochat bac5a35, nanochat/gpt.py) as a model family: creation,
 * parameter and gradient views, initialization, the passes of each unit forward and backward, the
 * whole-model passes composed of them, the hooks, and the family table.
 *
 * The contract is GPT-2's (loom/gpt2.h) and so are the invariants: every buffer is allocated in create
 * and a training step allocates nothing; activations are laid out for the capacity B x T and a smaller
 * call packs its rows at the start; each arena holds one micro-batch, the backward scratch is shared;
 * kernels reach tensors only through the views, read after the unit's param-use hook. The backward
 * reports tensor i to the grad-ready callback once per micro-step as soon as nothing later adds to it,
 * so over a whole model indices arrive strictly decreasing: lm_head, each block's from mlp.c_proj down
 * to value_embeds.i, then x0_lambdas, resid_lambdas (every block adds to them: final after block 0,
 * reported by the embedding's backward, or by block lo's when the model does not hold the embedding)
 * and wte. The residual stream is [x | x0] (2C floats per position); its gradient likewise, the x0
 * half accumulating every block's share down to the embedding. With activation checkpointing a block
 * keeps only its output and block_backward recomputes the rest with the forward's own code. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "model/fastmath.h"
#include "model/nanochat.h"
#include "model/nanochat_model.h"
#include "model/rng.h"

#define DEFAULT_CHUNK 512

typedef loom_nanochat_t nc_t;

static float *carve(char *base, size_t *off, size_t nfloats)
{
	float *p = base ? (float *)(base + *off) : NULL;
	*off += (nfloats * sizeof(float) + 63) / 64 * 64;
	return p;
}

/* The layout of every activation buffer in one allocation (base NULL: measure only), as gpt2.c's:
 * the recompute scratch, the arenas, the head scratch, the forward and backward scratch. */
static size_t layout(nc_t *m, char *base, loom_model_act_bytes_t *bytes)
{
	const nc_dims_t *d = &m->d;
	size_t off = 0, C = (size_t)d->C, N = (size_t)m->B * m->T, T = (size_t)m->T, mark;
	size_t Q = (size_t)d->nh * d->D, KV = (size_t)d->nkv * d->D, Hd = (size_t)d->hid;
	size_t att = (size_t)m->B * d->nh * T * T;
	nc_layer_t shared = {0}, dummy;
	nc_arena_t dummy_arena;
	memset(bytes, 0, sizeof *bytes);
#define LAYER_BUFS(a, ATT)                                                                                         \
	do {                                                                                                           \
		(a)->xin = carve(base, &off, N * C);                                                                       \
		(a)->xn1 = carve(base, &off, N * C);                                                                       \
		(a)->rstd1 = carve(base, &off, N);                                                                         \
		(a)->q = carve(base, &off, N * Q);                                                                         \
		(a)->qrstd = carve(base, &off, N * d->nh);                                                                 \
		(a)->k = carve(base, &off, N * KV);                                                                        \
		(a)->krstd = carve(base, &off, N * d->nkv);                                                                \
		(a)->v = carve(base, &off, N * KV);                                                                        \
		(a)->gate = carve(base, &off, N * d->nkv);                                                                 \
		(a)->att = (ATT);                                                                                          \
		(a)->atty = carve(base, &off, N * Q);                                                                      \
		(a)->x2 = carve(base, &off, N * C);                                                                        \
		(a)->xn2 = carve(base, &off, N * C);                                                                       \
		(a)->rstd2 = carve(base, &off, N);                                                                         \
		(a)->fch = carve(base, &off, N * Hd);                                                                      \
		(a)->act = carve(base, &off, N * Hd);                                                                      \
	} while (0)
	if (m->act_ckpt == LOOM_ACT_CKPT_BLOCKS) {
		float *p = carve(base, &off, att);
		LAYER_BUFS(&shared, p);
	} else if (m->act_ckpt == LOOM_ACT_CKPT_SELECTIVE) {
		shared.att = carve(base, &off, att);
	}
	bytes->recompute = mark = off;
	for (int k = 0; k < m->narenas; k++) {
		nc_arena_t *ar = base ? &m->arenas[k] : &dummy_arena;
		ar->in = carve(base, &off, N * 2 * C);
		ar->tok = (int *)carve(base, &off, N); /* ints: the same size as floats */
		ar->rstd0 = carve(base, &off, N);
		for (int l = m->lo; l < m->hi; l++) {
			nc_layer_t *a = base ? &ar->layers[l - m->lo] : &dummy;
			size_t l0 = off;
			if (m->act_ckpt == LOOM_ACT_CKPT_BLOCKS) {
				*a = shared;
			} else {
				float *p = m->act_ckpt == LOOM_ACT_CKPT_SELECTIVE ? shared.att : carve(base, &off, att);
				LAYER_BUFS(a, p);
			}
			a->out = carve(base, &off, N * 2 * C);
			bytes->per_layer = off - l0;
		}
		if (m->has_head) {
			ar->xf = carve(base, &off, N * C);
			ar->rstdf = carve(base, &off, N);
			ar->losses = carve(base, &off, N);
		}
	}
#undef LAYER_BUFS
	bytes->kept = off - mark, mark = off;
	if (m->has_head) {
		m->logits = carve(base, &off, (size_t)m->chunk * (m->tp > 1 ? d->vl : d->V));
		m->last_logits = carve(base, &off, (size_t)m->B * d->V);
		if (m->tp > 1)
			m->tp_stats = carve(base, &off, 3 * (size_t)m->chunk);
	}
	bytes->head = off - mark, mark = off;
	m->ftmp = carve(base, &off, N * C);
	m->dres = carve(base, &off, N * 2 * C);
	m->dx2 = carve(base, &off, N * C);
	m->dxin = carve(base, &off, N * C);
	m->dxn = carve(base, &off, N * C);
	m->dq = carve(base, &off, N * Q);
	m->dk = carve(base, &off, N * KV);
	m->dv = carve(base, &off, N * KV);
	m->dkh = carve(base, &off, N * Q);
	m->dvh = carve(base, &off, N * Q);
	m->datty = carve(base, &off, N * Q);
	m->dh1 = carve(base, &off, N * Hd);
	m->dh2 = carve(base, &off, N * Hd);
	m->dgate = carve(base, &off, N * d->nkv);
	m->dscal = carve(base, &off, 2 * N);
	m->att_scratch = carve(base, &off, T * T * (size_t)m->att_threads);
	m->cos = carve(base, &off, T * (size_t)d->D / 2);
	m->sin = carve(base, &off, T * (size_t)d->D / 2);
	bytes->backward = off - mark;
	bytes->total = off;
	return off;
}

static int check_opts(const loom_model_config_t *cfg, const loom_model_opts_t *o)
{
	int rc, L = cfg->n_layer;
	if ((rc = loom__nc_config_check(cfg)) != LOOM_OK)
		return rc;
	if (o->B <= 0 || o->T <= 0 || o->T > cfg->seq_len)
		return loom_seterr(LOOM_EINVAL, "nanochat create: batch %d x %d tokens (expected B >= 1 and 1 <= T <= "
		                   "sequence_len %d)", o->B, o->T, cfg->seq_len);
	int lo = o->layer_lo, hi = o->layer_hi ? o->layer_hi : L;
	if (lo < 0 || (lo >= hi && !(lo == hi && hi == L)) || hi > L || o->arenas < 0)
		return loom_seterr(LOOM_EINVAL, "nanochat create: layers [%d, %d) with %d arenas (expected 0 <= lo < hi <= "
		                   "n_layer %d, or lo = hi = n_layer for the head alone, and arenas >= 1)", o->layer_lo,
		                   o->layer_hi, o->arenas, L);
	int tp = o->tp_size ? o->tp_size : 1;
	if (tp < 1 || o->tp_rank < 0 || o->tp_rank >= tp)
		return loom_seterr(LOOM_EINVAL, "nanochat create: tensor-parallel rank %d of %d (expected 0 <= rank < size)",
		                   o->tp_rank, tp);
	if ((int)o->act_ckpt < LOOM_ACT_CKPT_NONE || (int)o->act_ckpt > LOOM_ACT_CKPT_SELECTIVE)
		return loom_seterr(LOOM_EINVAL, "nanochat create: activation checkpointing mode %d", (int)o->act_ckpt);
	if (o->dtype != LOOM_COMPUTE_FP32 && o->dtype != LOOM_COMPUTE_BF16)
		return loom_seterr(LOOM_EINVAL, "nanochat create: dtype %d (expected fp32 or bf16)", (int)o->dtype);
	loom_bf16_path_t path;
	if (o->dtype == LOOM_COMPUTE_BF16 && (rc = loom_bf16_path(&path)) != LOOM_OK)
		return rc;
	return loom__nc_tp_check(cfg, tp);
}

static void setup(nc_t *m, const loom_model_config_t *cfg, const loom_model_opts_t *o)
{
	int L = cfg->n_layer, tp = o->tp_size ? o->tp_size : 1;
	loom__nc_normalize(cfg, &m->cfg);
	loom__nc_dims(&m->cfg, tp, &m->d);
	m->B = o->B, m->T = o->T;
	m->lo = o->layer_lo, m->hi = o->layer_hi ? o->layer_hi : L;
	m->has_embed = m->lo == 0, m->has_head = m->hi == L;
	m->narenas = o->arenas ? o->arenas : 1;
	m->gemm.dtype = o->dtype;
	if (o->dtype == LOOM_COMPUTE_BF16) {
		loom_bf16_path_t path = LOOM_BF16_AUTO;
		(void)loom_bf16_path(&path);
		m->gemm.path = (int)path;
	}
	m->tp = tp, m->tp_rank = tp > 1 ? o->tp_rank : 0;
	m->nparams = loom__nc_shard_params(cfg, tp);
	m->ntensors = loom__nc_num_tensors(cfg);
	long chunk = loom_env_long("LOOM_CLS_CHUNK", DEFAULT_CHUNK, NULL);
	m->chunk = (int)LOOM_MAX(1, LOOM_MIN(chunk, (long)o->B * o->T));
	m->att_threads = LOOM_MAX(omp_get_max_threads(), omp_get_num_procs());
	m->act_ckpt = (int)o->act_ckpt;
}

static int nc_act_bytes(const loom_model_config_t *cfg, const loom_model_opts_t *o, loom_model_act_bytes_t *out)
{
	nc_t m;
	int rc;
	memset(out, 0, sizeof *out);
	if ((rc = check_opts(cfg, o)) != LOOM_OK)
		return rc;
	memset(&m, 0, sizeof m);
	setup(&m, cfg, o);
	layout(&m, NULL, out);
	return LOOM_OK;
}

static void point_params(nc_t *m, float *params)
{
	m->params = params;
	for (int i = 0; i < m->ntensors; i++)
		m->pview[i] = params ? params + m->tensors[i].offset : NULL;
}

static void point_grads(nc_t *m, float *grads)
{
	m->grads = grads;
	m->grad_split = 0;
	for (int i = 0; i < m->ntensors; i++)
		m->gview[i] = grads ? grads + m->tensors[i].offset : NULL;
}

/* The rotary tables as gpt.py computes them in fp32 (inv_freq = 1 / 10000^(2i/D), angle t inv_freq),
 * then rounded to bfloat16 as it keeps them. */
static void rotary_tables(nc_t *m)
{
	int D = m->d.D, h2 = D / 2;
	for (int t = 0; t < m->T; t++)
		for (int i = 0; i < h2; i++) {
			float e = (float)(2 * i) / (float)D;
			float inv = 1.0f / powf(10000.0f, e);
			float f = (float)t * inv;
			m->cos[(size_t)t * h2 + i] = loom__bf16_round(cosf(f));
			m->sin[(size_t)t * h2 + i] = loom__bf16_round(sinf(f));
		}
}

static void nc_destroy(loom_model_t *mm);

static int nc_create(loom_model_t **out, const loom_model_config_t *cfg, const loom_model_opts_t *o)
{
	nc_t *m = NULL;
	int rc, tp = o->tp_size ? o->tp_size : 1;
	*out = NULL;
	if ((rc = check_opts(cfg, o)) != LOOM_OK)
		return rc;
	size_t want = sizeof *m;
	if (!(m = loom__calloc(1, sizeof *m)))
		goto nomem;
	m->base.family = loom__nanochat_family();
	setup(m, cfg, o);
	want = (size_t)m->ntensors * sizeof *m->tensors;
	if (!(m->tensors = loom__calloc((size_t)m->ntensors, sizeof *m->tensors)) ||
	    !(m->pview = loom__calloc((size_t)m->ntensors, sizeof *m->pview)) ||
	    !(m->gview = loom__calloc((size_t)m->ntensors, sizeof *m->gview)) ||
	    !(m->window = loom__calloc((size_t)m->d.L, sizeof *m->window)) ||
	    !(m->arenas = loom__calloc((size_t)m->narenas, sizeof *m->arenas)))
		goto nomem;
	for (int k = 0; k < m->narenas; k++)
		if (!(m->arenas[k].layers = loom__calloc((size_t)LOOM_MAX(m->hi - m->lo, 1), sizeof *m->arenas[k].layers)))
			goto nomem;
	for (int i = 0; i < m->ntensors; i++)
		loom__nc_shard_info(&m->cfg, tp, i, &m->tensors[i]);
	for (int l = 0; l < m->d.L; l++)
		m->window[l] = loom__nc_window(&m->cfg, l);
	want = m->nparams * sizeof(float);
	if ((!o->no_own_params && !(m->params_own = loom_alloc_aligned(want))) ||
	    (!o->no_own_grads && !(m->grads_own = loom_alloc_aligned(want))))
		goto nomem;
	point_params(m, m->params_own);
	point_grads(m, m->grads_own);
	want = layout(m, NULL, &m->act);
	if (!(m->mem = loom_alloc_aligned(want)))
		goto nomem;
	layout(m, m->mem, &m->act);
	rotary_tables(m);
	loom__gemm_setup_threads();
	*out = &m->base;
	return LOOM_OK;
nomem:
	nc_destroy(m ? &m->base : NULL);
	return loom_seterr(LOOM_ENOMEM, "nanochat create: out of memory for L%d C%d V%d with batch %d x %d (%zu bytes "
	                   "requested)", cfg->n_layer, cfg->n_embd, cfg->vocab_size, o->B, o->T, want);
}

#define M(mm) ((nc_t *)(mm))
#define CM(mm) ((const nc_t *)(mm))

static void nc_destroy(loom_model_t *mm)
{
	nc_t *m = M(mm);
	if (!m)
		return;
	loom__nc_kv_free(m);
	loom__gemm_ctx_free(&m->gemm);
	loom_free_aligned(m->mem);
	loom_free_aligned(m->params_own);
	loom_free_aligned(m->grads_own);
	if (m->arenas)
		for (int k = 0; k < m->narenas; k++)
			free(m->arenas[k].layers);
	free(m->arenas);
	free(m->window);
	free(m->tensors);
	free(m->pview);
	free(m->gview);
	free(m);
}

static const loom_model_config_t *nc_config(const loom_model_t *m)
{
	return &CM(m)->cfg;
}

static loom_compute_dtype_t nc_dtype(const loom_model_t *m)
{
	return (loom_compute_dtype_t)CM(m)->gemm.dtype;
}

static const loom_tensor_info_t *nc_tensors(const loom_model_t *m, int *n)
{
	if (n)
		*n = CM(m)->ntensors;
	return CM(m)->tensors;
}

static size_t nc_param_count(const loom_model_t *m)
{
	return CM(m)->nparams;
}

static float *nc_params(loom_model_t *m)
{
	return M(m)->params;
}

static float *nc_grads(loom_model_t *m)
{
	return M(m)->grads;
}

static int nc_set_grad_buffer(loom_model_t *m, float *grads)
{
	if (!grads)
		return loom_seterr(LOOM_EINVAL, "nanochat set_grad_buffer: NULL buffer");
	point_grads(M(m), grads);
	return LOOM_OK;
}

static int nc_own_grads(loom_model_t *mm)
{
	nc_t *m = M(mm);
	if (!m->grads_own && !(m->grads_own = loom_alloc_aligned(m->nparams * sizeof(float))))
		return loom_seterr(LOOM_ENOMEM, "nanochat own_grads: out of memory for %zu gradients", m->nparams);
	point_grads(m, m->grads_own);
	return LOOM_OK;
}

static int nc_set_param_buffer(loom_model_t *mm, float *params)
{
	nc_t *m = M(mm);
	if (!params && !m->params_own && !(m->params_own = loom_alloc_aligned(m->nparams * sizeof(float))))
		return loom_seterr(LOOM_ENOMEM, "nanochat set_param_buffer: out of memory for %zu parameters", m->nparams);
	point_params(m, params ? params : m->params_own);
	return LOOM_OK;
}

static int nc_set_tensor_view(loom_model_t *mm, int tensor, float *param, float *grad)
{
	nc_t *m = M(mm);
	if (tensor < 0 || tensor >= m->ntensors)
		return loom_seterr(LOOM_EINVAL, "nanochat set_tensor_view: tensor %d out of range [0, %d)", tensor,
		                   m->ntensors);
	if (param)
		m->pview[tensor] = param;
	if (grad) {
		m->gview[tensor] = grad;
		m->grad_split = 1;
	}
	return LOOM_OK;
}

static int nc_set_unit_view(loom_model_t *mm, int unit, float *params, float *grads)
{
	nc_t *m = M(mm);
	int first, end;
	if (unit < -1 || unit > m->d.L)
		return loom_seterr(LOOM_EINVAL, "nanochat set_unit_view: unit %d out of range [-1, %d]", unit, m->d.L);
	loom__nc_unit_range(&m->cfg, unit, &first, &end);
	size_t base = m->tensors[first].offset;
	for (int i = first; i < end; i++)
		nc_set_tensor_view(mm, i, params ? params + (m->tensors[i].offset - base) : NULL,
		                   grads ? grads + (m->tensors[i].offset - base) : NULL);
	return LOOM_OK;
}

static float *nc_tensor_param(loom_model_t *m, int t)
{
	return t >= 0 && t < M(m)->ntensors ? M(m)->pview[t] : NULL;
}

static float *nc_tensor_grad(loom_model_t *m, int t)
{
	return t >= 0 && t < M(m)->ntensors ? M(m)->gview[t] : NULL;
}

/* init_weights: wte N(0, 1), lm_head N(0, 0.001), c_q, c_k, c_v, c_fc and the value embeddings
 * uniform in [-s, s) with s = sqrt(3 / C), the projections and gates zero, resid_lambdas 1, x0_lambdas
 * 0.1. Tensor i draws from its own stream (seed ^ 0x9e3779b97f4a7c15 (i + 1), as GPT-2's init), over
 * the real rows of the whole tensor in row-major order, so a tensor-parallel shard gets exactly the
 * whole model's values at its positions; vocabulary padding rows are 0. */
static void nc_init(loom_model_t *mm, uint64_t seed)
{
	nc_t *m = M(mm);
	const nc_dims_t *d = &m->d;
	double s = sqrt(3.0 / d->C);
	for (int i = 0; i < m->ntensors; i++) {
		loom_tensor_info_t f;
		const loom_tensor_info_t *sh = &m->tensors[i];
		float *p = m->pview[i];
		rng_t r;
		if (!p)
			continue;
		loom__nc_tensor_info(&m->cfg, i, &f);
		memset(p, 0, sh->numel * sizeof(float));
		const char *nm = f.name;
		int kind; /* 0 zero, 1 normal std, 2 uniform +-s, 3 constant */
		double std = 0.0, cst = 0.0;
		if (i == NC_RESID)
			kind = 3, cst = 1.0;
		else if (i == NC_X0)
			kind = 3, cst = 0.1;
		else if (i == NC_WTE)
			kind = 1, std = 1.0;
		else if (i == m->ntensors - 1)
			kind = 1, std = 0.001;
		else if (strstr(nm, "c_proj") || strstr(nm, "ve_gate"))
			kind = 0;
		else
			kind = 2;
		if (kind == 0)
			continue;
		int vocab_rows = i == NC_WTE || i == m->ntensors - 1 || strncmp(nm, "value_embeds", 12) == 0;
		size_t rows = f.ndim == 2 ? f.shape[0] : 1, cols = f.ndim == 2 ? f.shape[1] : f.shape[0];
		if (vocab_rows)
			rows = (size_t)d->V;
		size_t srows = sh->ndim == 2 ? sh->shape[0] : 1, scols = sh->ndim == 2 ? sh->shape[1] : sh->shape[0];
		size_t r0 = f.tp_dim == 0 ? (size_t)m->tp_rank * srows : 0, c0 = f.tp_dim == 1 ? (size_t)m->tp_rank * scols : 0;
		rng_seed(&r, seed ^ (0x9e3779b97f4a7c15ULL * (uint64_t)(i + 1)));
		for (size_t a = 0; a < rows; a++)
			for (size_t b = 0; b < cols; b++) {
				float v = kind == 3 ? (float)cst
				          : kind == 1 ? (float)(std * rng_normal(&r))
				                      : (float)(-s + 2.0 * s * rng_uniform(&r));
				if (a >= r0 && a < r0 + srows && b >= c0 && b < c0 + scols)
					p[(a - r0) * scols + (b - c0)] = v;
			}
	}
}

static void nc_layers(const loom_model_t *mm, int *lo, int *hi, int *arenas)
{
	const nc_t *m = CM(mm);
	if (lo)
		*lo = m->lo;
	if (hi)
		*hi = m->hi;
	if (arenas)
		*arenas = m->narenas;
}

static loom_act_ckpt_t nc_act_ckpt(const loom_model_t *m)
{
	return (loom_act_ckpt_t)CM(m)->act_ckpt;
}

static long long nc_recomputes(const loom_model_t *m)
{
	return CM(m)->recomputes;
}

static void nc_model_act_bytes(const loom_model_t *m, loom_model_act_bytes_t *out)
{
	*out = CM(m)->act;
}

/* ---- checks -------------------------------------------------------------------------------------- */

static int check_tokens(const nc_t *m, const int *ids, int n, int T, const char *what)
{
	int V = m->d.V;
	if (!ids)
		return loom_seterr(LOOM_EINVAL, "nanochat: %s is NULL", what);
	for (int i = 0; i < n; i++)
		if (ids[i] < 0 || ids[i] >= V)
			return loom_seterr(LOOM_EINVAL, "nanochat: token id %d at %s[b=%d][t=%d] is outside the vocabulary [0, %d)",
			                   ids[i], what, i / T, i % T, V);
	return LOOM_OK;
}

static int check_unit(const nc_t *m, int mb, int unit, int B, int T, const char *op)
{
	int L = m->d.L;
	if (mb < 0 || mb >= m->narenas)
		return loom_seterr(LOOM_EINVAL, "nanochat %s: arena %d out of range [0, %d)", op, mb, m->narenas);
	if (unit < 0 && !m->has_embed)
		return loom_seterr(LOOM_EINVAL, "nanochat %s: the model does not hold the embedding (blocks [%d, %d))", op,
		                   m->lo, m->hi);
	if (unit >= 0 && unit < L && (unit < m->lo || unit >= m->hi))
		return loom_seterr(LOOM_EINVAL, "nanochat %s: block %d is not held (blocks [%d, %d))", op, unit, m->lo, m->hi);
	if (unit >= L && !m->has_head)
		return loom_seterr(LOOM_EINVAL, "nanochat %s: the model does not hold the head (blocks [%d, %d) of %d)", op,
		                   m->lo, m->hi, L);
	if (m->tp > 1 && !m->tp_reduce)
		return loom_seterr(LOOM_EINVAL, "nanochat %s: tensor-parallel rank %d of %d has no reduction", op, m->tp_rank,
		                   m->tp);
	if (B <= 0 || T <= 0 || B > m->B || T > m->T)
		return loom_seterr(LOOM_EINVAL, "nanochat %s: batch %d x %d tokens does not fit the model's %d x %d", op, B, T,
		                   m->B, m->T);
	return LOOM_OK;
}

/* ---- the units' passes ------------------------------------------------------------------------------ */

void loom__nc_param_use(nc_t *m, int unit, int phase)
{
	if (m->on_use)
		m->on_use(m->on_use_ctx, unit, phase);
}

static void ready(nc_t *m, int i)
{
	if (i >= 0 && m->on_ready)
		m->on_ready(m->on_ready_ctx, i);
}

void loom__nc_tp_reduce(nc_t *m, float *buf, size_t n, loom_tp_op_t op)
{
	if (m->tp <= 1 || m->tp_err)
		return;
	int rc = m->tp_reduce(m->tp_ctx, buf, n, op);
	if (rc != LOOM_OK)
		m->tp_err = rc;
}

static void zero(float *p, size_t n)
{
	const size_t block = 16384;
#pragma omp parallel for schedule(static) if (n >= 4 * block)
	for (size_t i = 0; i < n; i += block)
		memset(p + i, 0, sizeof(float) * (n - i < block ? n - i : block));
}

static float *stream(const nc_t *m, const nc_arena_t *ar, int l)
{
	return l == m->lo ? ar->in : ar->layers[l - 1 - m->lo].out;
}

static void embed_forward(nc_t *m, nc_arena_t *ar, const int *inputs, int B, int T)
{
	int C = m->d.C, N = B * T;
	loom__nc_param_use(m, -1, 0);
	memcpy(ar->tok, inputs, sizeof(int) * (size_t)N);
	ar->has_tok = 1;
	/* x = wte[tok] (vocab-parallel: each rank's rows, summed over the group), both halves rmsnorm(x) */
	loom__nc_gather(m->ftmp, C, m->pview[NC_WTE], C, inputs, m->tp_rank * m->d.vl, m->d.vl, N, C);
	loom__nc_tp_reduce(m, m->ftmp, (size_t)N * C, LOOM_TP_SUM);
	loom__nc_rmsnorm_forward(ar->in + C, 2 * C, ar->rstd0, m->ftmp, C, N, C);
#pragma omp parallel for schedule(static) if ((long)N * C >= 32768)
	for (int n = 0; n < N; n++)
		memcpy(ar->in + (size_t)n * 2 * C, ar->in + (size_t)n * 2 * C + C, sizeof(float) * (size_t)C);
}

/* y (N,out) = x (N,in; rows ldx apart) W^T, W [out, in] */
static void linear(float *y, int ldy, const float *x, int ldx, const float *w, int N, int in, int out)
{
	loom__gemm(0, 1, N, out, in, 1.0f, x, ldx, w, in, 0.0f, y, ldy);
}

/* dx (N,in) += dy W; dW [out, in] += dy^T x */
static void linear_backward(float *dx, int lddx, float *dw, const float *dy, int lddy, const float *x, int ldx,
                            const float *w, int N, int in, int out)
{
	if (dx)
		loom__gemm(0, 0, N, in, out, 1.0f, dy, lddy, w, in, 1.0f, dx, lddx);
	loom__gemm(1, 0, out, in, N, 1.0f, dy, lddy, x, ldx, 1.0f, dw, in);
}

#define LT(l, j) loom__nc_lt(&m->cfg, (l), (j))
#define W(j) m->pview[LT(l, j)]
#define G(j) m->gview[LT(l, j)]

/* Block l's forward from the stream `in` (N,2C) with tokens tok, into a; whole 0 stops after the MLP's
 * activation (a recomputation: the output is kept). */
static void block_forward_acts(nc_t *m, int l, nc_layer_t *a, const float *in, const int *tok, int B, int T,
                               int whole)
{
	const nc_dims_t *d = &m->d;
	int C = d->C, N = B * T, D = d->D, nh = d->nh, nkv = d->nkv, Q = nh * D, KV = nkv * D, Hd = d->hid;
	int ve = loom__nc_has_ve(l, d->L);
	float r = m->pview[NC_RESID][l], z = m->pview[NC_X0][l];
#pragma omp parallel for schedule(static) if ((long)N * C >= 32768)
	for (int n = 0; n < N; n++) {
		const float *x = in + (size_t)n * 2 * C, *x0 = x + C;
		float *o = a->xin + (size_t)n * C;
#pragma omp simd
		for (int c = 0; c < C; c++)
			o[c] = r * x[c] + z * x0[c];
	}
	loom__nc_rmsnorm_forward(a->xn1, C, a->rstd1, a->xin, C, N, C);
	linear(a->q, Q, a->xn1, C, W(NC_Q), N, C, Q);
	linear(a->k, KV, a->xn1, C, W(NC_K), N, C, KV);
	linear(a->v, KV, a->xn1, C, W(NC_V), N, C, KV);
	if (ve) {
		/* v += 2 sigmoid(xn[:32] Wg^T) ve[tok], per kv head */
		linear(a->gate, nkv, a->xn1, C, W(NC_GATE), N, NC_GATE_CH, nkv);
		const float *tab = W(NC_VE);
#pragma omp parallel for schedule(static) if ((long)N * KV >= 32768)
		for (int n = 0; n < N; n++) {
			const float *e = tab + (size_t)tok[n] * KV;
			float *v = a->v + (size_t)n * KV;
			for (int h = 0; h < nkv; h++) {
				float s = 1.0f / (1.0f + expf(-a->gate[(size_t)n * nkv + h]));
				a->gate[(size_t)n * nkv + h] = s;
				float g = 2.0f * s;
#pragma omp simd
				for (int i = 0; i < D; i++)
					v[h * D + i] += g * e[h * D + i];
			}
		}
	}
	loom__nc_rope_forward(a->q, m->cos, m->sin, N, T, 0, nh, D);
	loom__nc_rope_forward(a->k, m->cos, m->sin, N, T, 0, nkv, D);
	loom__nc_rmsnorm_forward(a->q, D, a->qrstd, a->q, D, N * nh, D);
	loom__nc_rmsnorm_forward(a->k, D, a->krstd, a->k, D, N * nkv, D);
	loom__nc_attention_forward(a->atty, a->att, a->q, a->k, a->v, B, T, nh, nkv, D, m->window[l]);
	linear(a->x2, C, a->atty, Q, W(NC_O), N, Q, C);
	loom__nc_tp_reduce(m, a->x2, (size_t)N * C, LOOM_TP_SUM);
#pragma omp parallel for simd schedule(static) if ((long)N * C >= 32768)
	for (size_t i = 0; i < (size_t)N * C; i++)
		a->x2[i] += a->xin[i];
	loom__nc_rmsnorm_forward(a->xn2, C, a->rstd2, a->x2, C, N, C);
	linear(a->fch, Hd, a->xn2, C, W(NC_FC), N, C, Hd);
	loom__nc_relu2_forward(a->act, a->fch, (size_t)N * Hd);
	if (!whole)
		return;
	linear(m->ftmp, C, a->act, Hd, W(NC_P), N, Hd, C);
	loom__nc_tp_reduce(m, m->ftmp, (size_t)N * C, LOOM_TP_SUM);
	float *out = a->out;
#pragma omp parallel for schedule(static) if ((long)N * C >= 32768)
	for (int n = 0; n < N; n++) {
		const float *x2 = a->x2 + (size_t)n * C, *p = m->ftmp + (size_t)n * C, *x0 = in + (size_t)n * 2 * C + C;
		float *o = out + (size_t)n * 2 * C;
#pragma omp simd
		for (int c = 0; c < C; c++) {
			o[c] = x2[c] + p[c];
			o[C + c] = x0[c];
		}
	}
}

static void block_forward(nc_t *m, nc_arena_t *ar, int l, int B, int T)
{
	loom__nc_param_use(m, l, 0);
	block_forward_acts(m, l, &ar->layers[l - m->lo], stream(m, ar, l), ar->tok, B, T, 1);
}

/* The final rmsnorm of rows [r0, r0 + n). */
static void head_norm(nc_t *m, nc_arena_t *ar, int r0, int n)
{
	int C = m->d.C;
	loom__nc_rmsnorm_forward(ar->xf + (size_t)r0 * C, C, ar->rstdf + r0, stream(m, ar, m->hi) + (size_t)r0 * 2 * C,
	                         2 * C, n, C);
}

static float mean_loss(const float *losses, int n, int N)
{
	double s = 0.0;
	for (int i = 0; i < n; i++)
		s += losses[i];
	return (float)(s / N);
}

/* The vocab-parallel head (tp > 1): this rank's lm_head rows hold ids [v0, v0 + vl), of which Vv are
 * real. Per chunk of positions the softcapped local logits, the group's row maxima (max), then the
 * sums of exponentials and the target logits (sum, one reduction of both); with dx, dx (N,C) += the
 * local dlogits W (partial sums, reduced once at the end) and dw += dlogits^T x. The full logits
 * never exist on one rank. */
static void tp_classifier(nc_t *m, float *losses, float *dx, float *dw, const float *x, const float *w,
                          const int *targets, float dloss, int N)
{
	int C = m->d.C, v0 = m->tp_rank * m->d.vl, Vv = LOOM_MAX(0, LOOM_MIN(m->d.vl, m->d.V - v0));
	const float inv = 1.0f / NC_SOFTCAP;
	for (int n0 = 0; n0 < N; n0 += m->chunk) {
		int nc = LOOM_MIN(m->chunk, N - n0);
		float *mx = m->tp_stats, *sums = m->tp_stats + nc, *z = m->logits;
		if (Vv > 0)
			loom__nc_logits(z, x + (size_t)n0 * C, C, w, nc, C, Vv);
		for (int i = 0; i < nc; i++) {
			const float *zi = z + (size_t)i * Vv;
			float v = -INFINITY;
#pragma omp simd reduction(max : v)
			for (int j = 0; j < Vv; j++)
				v = zi[j] > v ? zi[j] : v;
			mx[i] = v;
		}
		loom__nc_tp_reduce(m, mx, (size_t)nc, LOOM_TP_MAX);
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
		loom__nc_tp_reduce(m, sums, 2 * (size_t)nc, LOOM_TP_SUM);
		for (int i = 0; i < nc; i++)
			losses[n0 + i] = logf(sums[2 * i]) + mx[i] - sums[2 * i + 1];
		if (!dx || Vv == 0)
			continue;
#pragma omp parallel for schedule(static) if ((long)nc * Vv >= 32768)
		for (int i = 0; i < nc; i++) {
			float *zi = z + (size_t)i * Vv, g = dloss / sums[2 * i];
			int t = targets[n0 + i] - v0;
#pragma omp simd
			for (int j = 0; j < Vv; j++) {
				float c = zi[j], u = c * inv;
				zi[j] = (g * fast_expf(c - mx[i]) - (j == t ? dloss : 0.0f)) * (1.0f - u * u);
			}
		}
		loom__gemm(0, 0, nc, C, Vv, 1.0f, z, Vv, w, C, 1.0f, dx + (size_t)n0 * C, C);
		loom__gemm(1, 0, Vv, C, nc, 1.0f, z, Vv, x + (size_t)n0 * C, C, 1.0f, dw, C);
	}
	if (dx)
		loom__nc_tp_reduce(m, dx, (size_t)N * C, LOOM_TP_SUM);
}

static void head_forward(nc_t *m, nc_arena_t *ar, const int *targets, int B, int T, float *loss)
{
	int C = m->d.C, V = m->d.V, N = B * T;
	loom__nc_param_use(m, m->d.L, 0);
	head_norm(m, ar, 0, N);
	const float *w = m->pview[m->ntensors - 1];
	if (targets && m->tp > 1) {
		tp_classifier(m, ar->losses, NULL, NULL, ar->xf, w, targets, 0.0f, N);
		if (loss)
			*loss = mean_loss(ar->losses, N, N);
	} else if (targets) {
		loom__nc_classifier(ar->losses, NULL, NULL, m->logits, m->chunk, ar->xf, w, targets, 0.0f, N, C, V);
		if (loss)
			*loss = mean_loss(ar->losses, N, N);
	} else {
		loom__nc_logits(m->last_logits, ar->xf + (size_t)(T - 1) * C, T * C, w, B, C, V);
	}
}

static void head_forward_backward(nc_t *m, nc_arena_t *ar, const int *targets, int N, int r0, int n, float grad_scale,
                                  float *loss)
{
	int C = m->d.C, V = m->d.V, lm = m->ntensors - 1;
	size_t o = (size_t)r0 * C;
	loom__nc_param_use(m, m->d.L, 0);
	loom__nc_param_use(m, m->d.L, 1);
	head_norm(m, ar, r0, n);
	zero(m->dxn + o, (size_t)n * C);
	if (m->tp > 1)
		tp_classifier(m, ar->losses + r0, m->dxn + o, m->gview[lm], ar->xf + o, m->pview[lm], targets + r0,
		              grad_scale / (float)N, n);
	else
		loom__nc_classifier(ar->losses + r0, m->dxn + o, m->gview[lm], m->logits, m->chunk, ar->xf + o,
		                    m->pview[lm], targets + r0, grad_scale / (float)N, n, C, V);
	if (loss)
		*loss = mean_loss(ar->losses + r0, n, N);
	float *dr = m->dres + (size_t)r0 * 2 * C;
#pragma omp parallel for schedule(static) if ((long)n * C >= 32768)
	for (int i = 0; i < n; i++)
		memset(dr + (size_t)i * 2 * C, 0, sizeof(float) * 2 * (size_t)C);
	loom__nc_rmsnorm_backward(dr, 2 * C, m->dxn + o, C, ar->xf + o, C, ar->rstdf + r0, n, C);
	ready(m, lm);
}

static void recompute(nc_t *m, int l, nc_layer_t *a, const float *in, const int *tok, int B, int T)
{
	const nc_dims_t *d = &m->d;
	if (m->act_ckpt == LOOM_ACT_CKPT_BLOCKS)
		block_forward_acts(m, l, a, in, tok, B, T, 0);
	else if (m->act_ckpt == LOOM_ACT_CKPT_SELECTIVE)
		loom__nc_attention_probs(a->att, a->q, a->k, B, T, d->nh, d->nkv, d->D, m->window[l]);
	else
		return;
	m->recomputes++;
}

static void block_backward(nc_t *m, nc_arena_t *ar, int l, int B, int T)
{
	const nc_dims_t *d = &m->d;
	int C = d->C, N = B * T, D = d->D, nh = d->nh, nkv = d->nkv, Q = nh * D, KV = nkv * D, Hd = d->hid;
	int ve = loom__nc_has_ve(l, d->L);
	nc_layer_t *a = &ar->layers[l - m->lo];
	const float *in = stream(m, ar, l);
	const int *tok = ar->tok;
	float *dres = m->dres;
	loom__nc_param_use(m, l, 1);
	recompute(m, l, a, in, tok, B, T);
	/* MLP: out = x2 + relu(xn2 Wfc^T)^2 Wp^T */
	zero(m->dh1, (size_t)N * Hd);
	linear_backward(m->dh1, Hd, G(NC_P), dres, 2 * C, a->act, Hd, W(NC_P), N, Hd, C);
	ready(m, LT(l, NC_P));
	zero(m->dh2, (size_t)N * Hd);
	loom__nc_relu2_backward(m->dh2, a->fch, m->dh1, (size_t)N * Hd);
	zero(m->dxn, (size_t)N * C);
	linear_backward(m->dxn, C, G(NC_FC), m->dh2, Hd, a->xn2, C, W(NC_FC), N, C, Hd);
	loom__nc_tp_reduce(m, m->dxn, (size_t)N * C, LOOM_TP_SUM);
	ready(m, LT(l, NC_FC));
#pragma omp parallel for schedule(static) if ((long)N * C >= 32768)
	for (int n = 0; n < N; n++)
		memcpy(m->dx2 + (size_t)n * C, dres + (size_t)n * 2 * C, sizeof(float) * (size_t)C);
	loom__nc_rmsnorm_backward(m->dx2, C, m->dxn, C, a->xn2, C, a->rstd2, N, C);
	/* attention: x2 = xin + atty Wo^T */
	zero(m->datty, (size_t)N * Q);
	linear_backward(m->datty, Q, G(NC_O), m->dx2, C, a->atty, Q, W(NC_O), N, Q, C);
	ready(m, LT(l, NC_O));
	zero(m->dq, (size_t)N * Q);
	zero(m->dk, (size_t)N * KV);
	zero(m->dv, (size_t)N * KV);
	loom__nc_attention_backward(m->dq, m->dk, m->dv, m->dkh, m->dvh, m->att_scratch, m->att_threads, m->datty, a->q,
	                            a->k, a->v, a->att, B, T, nh, nkv, D, m->window[l]);
	/* QK-norm and rotary, backward, in place */
	zero(m->dkh, (size_t)N * Q);
	loom__nc_rmsnorm_backward(m->dkh, D, m->dq, D, a->q, D, a->qrstd, N * nh, D);
	memcpy(m->dq, m->dkh, sizeof(float) * (size_t)N * Q);
	zero(m->dkh, (size_t)N * KV);
	loom__nc_rmsnorm_backward(m->dkh, D, m->dk, D, a->k, D, a->krstd, N * nkv, D);
	memcpy(m->dk, m->dkh, sizeof(float) * (size_t)N * KV);
	loom__nc_rope_backward(m->dq, m->cos, m->sin, N, T, 0, nh, D);
	loom__nc_rope_backward(m->dk, m->cos, m->sin, N, T, 0, nkv, D);
	/* the projections' weight gradients, the input's gradient summed over q, k, v (and the gate) */
	zero(m->dxn, (size_t)N * C);
	linear_backward(m->dxn, C, G(NC_V), m->dv, KV, a->xn1, C, W(NC_V), N, C, KV);
	ready(m, LT(l, NC_V));
	linear_backward(m->dxn, C, G(NC_K), m->dk, KV, a->xn1, C, W(NC_K), N, C, KV);
	ready(m, LT(l, NC_K));
	linear_backward(m->dxn, C, G(NC_Q), m->dq, Q, a->xn1, C, W(NC_Q), N, C, Q);
	ready(m, LT(l, NC_Q));
	if (ve) {
		/* dgate_logit = sum_i dv e 2 s (1 - s); dve[tok] += 2 s dv */
		const float *tab = W(NC_VE);
#pragma omp parallel for schedule(static) if ((long)N * KV >= 32768)
		for (int n = 0; n < N; n++) {
			const float *e = tab + (size_t)tok[n] * KV;
			float *dvr = m->dv + (size_t)n * KV;
			for (int h = 0; h < nkv; h++) {
				float s = a->gate[(size_t)n * nkv + h], dot = 0.0f;
#pragma omp simd reduction(+ : dot)
				for (int i = 0; i < D; i++)
					dot += dvr[h * D + i] * e[h * D + i];
				m->dgate[(size_t)n * nkv + h] = 2.0f * dot * s * (1.0f - s);
				float g = 2.0f * s;
#pragma omp simd
				for (int i = 0; i < D; i++)
					dvr[h * D + i] *= g; /* dv becomes the value embedding's gradient (dv is done with) */
			}
		}
		linear_backward(m->dxn, C, G(NC_GATE), m->dgate, nkv, a->xn1, C, W(NC_GATE), N, NC_GATE_CH, nkv);
		ready(m, LT(l, NC_GATE));
		loom__nc_scatter_add(G(NC_VE), KV, m->dv, KV, tok, 0, d->Vp, N, KV);
		ready(m, LT(l, NC_VE));
	}
	loom__nc_tp_reduce(m, m->dxn, (size_t)N * C, LOOM_TP_SUM);
	/* dxin = dx2 + rmsnorm backward; then the mix xin = r x + z x0 */
	memcpy(m->dxin, m->dx2, sizeof(float) * (size_t)N * C);
	loom__nc_rmsnorm_backward(m->dxin, C, m->dxn, C, a->xn1, C, a->rstd1, N, C);
	float r = m->pview[NC_RESID][l], z = m->pview[NC_X0][l];
	float *sr = m->dscal, *sz = m->dscal + N;
#pragma omp parallel for schedule(static) if ((long)N * C >= 32768)
	for (int n = 0; n < N; n++) {
		const float *g = m->dxin + (size_t)n * C, *x = in + (size_t)n * 2 * C, *x0 = x + C;
		float *dx = dres + (size_t)n * 2 * C, *dx0 = dx + C, a1 = 0.0f, a2 = 0.0f;
#pragma omp simd reduction(+ : a1, a2)
		for (int c = 0; c < C; c++) {
			a1 += g[c] * x[c];
			a2 += g[c] * x0[c];
		}
#pragma omp simd
		for (int c = 0; c < C; c++) {
			dx[c] = r * g[c];
			dx0[c] += z * g[c];
		}
		sr[n] = a1, sz[n] = a2;
	}
	double s1 = 0.0, s2 = 0.0;
	for (int n = 0; n < N; n++)
		s1 += sr[n], s2 += sz[n];
	m->gview[NC_RESID][l] += (float)s1;
	m->gview[NC_X0][l] += (float)s2;
	if (l == m->lo && !m->has_embed) {
		ready(m, NC_X0);
		ready(m, NC_RESID);
	}
}

static void embed_backward(nc_t *m, nc_arena_t *ar, const int *inputs, int B, int T)
{
	int C = m->d.C, N = B * T;
	loom__nc_param_use(m, -1, 1);
	/* both halves of the stream are x0 = rmsnorm(wte[tok]) */
	zero(m->dxn, (size_t)N * C);
#pragma omp parallel for schedule(static) if ((long)N * C >= 32768)
	for (int n = 0; n < N; n++) {
		const float *g = m->dres + (size_t)n * 2 * C;
		float *o = m->dx2 + (size_t)n * C;
#pragma omp simd
		for (int c = 0; c < C; c++)
			o[c] = g[c] + g[C + c];
	}
	loom__nc_rmsnorm_backward(m->dxn, C, m->dx2, C, ar->in + C, 2 * C, ar->rstd0, N, C);
	ready(m, NC_X0);
	ready(m, NC_RESID);
	loom__nc_scatter_add(m->gview[NC_WTE], C, m->dxn, C, inputs, m->tp_rank * m->d.vl, m->d.vl, N, C);
	ready(m, NC_WTE);
}

#undef W
#undef G

/* ---- public unit calls ---------------------------------------------------------------------------- */

static int status(nc_t *m)
{
	int rc = m->tp_err, grc = loom__gemm_status(&m->gemm);
	m->tp_err = 0;
	return rc ? rc : grc;
}

static int nc_set_inputs(loom_model_t *mm, int mb, const int *inputs, int B, int T)
{
	nc_t *m = M(mm);
	int rc;
	if (mb < 0 || mb >= m->narenas)
		return loom_seterr(LOOM_EINVAL, "nanochat set_inputs: arena %d out of range [0, %d)", mb, m->narenas);
	if (B <= 0 || T <= 0 || B > m->B || T > m->T)
		return loom_seterr(LOOM_EINVAL, "nanochat set_inputs: batch %d x %d tokens does not fit the model's %d x %d",
		                   B, T, m->B, m->T);
	if ((rc = check_tokens(m, inputs, B * T, T, "inputs")) != LOOM_OK)
		return rc;
	memcpy(m->arenas[mb].tok, inputs, sizeof(int) * (size_t)B * T);
	m->arenas[mb].has_tok = 1;
	return LOOM_OK;
}

static int nc_embed_forward(loom_model_t *mm, int mb, const int *inputs, int B, int T)
{
	nc_t *m = M(mm);
	int rc;
	if ((rc = check_unit(m, mb, -1, B, T, "embed_forward")) != LOOM_OK ||
	    (rc = check_tokens(m, inputs, B * T, T, "inputs")) != LOOM_OK)
		return rc;
	loom__gemm_setup(&m->gemm);
	embed_forward(m, &m->arenas[mb], inputs, B, T);
	return status(m);
}

/* Arena, block and size of a block call, and the arena's tokens (the value embeddings read them). */
static int check_block(const nc_t *m, int mb, int l, int B, int T, const char *op)
{
	int rc;
	if (l < m->lo || l >= m->hi)
		return loom_seterr(LOOM_EINVAL, "nanochat %s: block %d is not held (blocks [%d, %d))", op, l, m->lo, m->hi);
	if ((rc = check_unit(m, mb, l, B, T, op)) != LOOM_OK)
		return rc;
	if (!m->arenas[mb].has_tok)
		return loom_seterr(LOOM_EINVAL, "nanochat %s: arena %d has no token ids (call embed_forward or set_inputs "
		                   "first: the value embeddings read them)", op, mb);
	return LOOM_OK;
}

static int nc_block_forward(loom_model_t *mm, int mb, int l, int B, int T)
{
	nc_t *m = M(mm);
	int rc;
	if ((rc = check_block(m, mb, l, B, T, "block_forward")) != LOOM_OK)
		return rc;
	loom__gemm_setup(&m->gemm);
	block_forward(m, &m->arenas[mb], l, B, T);
	return status(m);
}

static int nc_head_forward(loom_model_t *mm, int mb, const int *targets, int B, int T, float *loss)
{
	nc_t *m = M(mm);
	int rc;
	if ((rc = check_unit(m, mb, m->d.L, B, T, "head_forward")) != LOOM_OK ||
	    (targets && (rc = check_tokens(m, targets, B * T, T, "targets")) != LOOM_OK))
		return rc;
	if (m->tp > 1 && !targets)
		return loom_seterr(LOOM_EINVAL, "nanochat head_forward: a tensor-parallel model computes losses only");
	loom__gemm_setup(&m->gemm);
	head_forward(m, &m->arenas[mb], targets, B, T, loss);
	return status(m);
}

static int nc_head_forward_backward_rows(loom_model_t *mm, int mb, const int *targets, int B, int T, int row0,
                                         int rows, float grad_scale, float *loss)
{
	nc_t *m = M(mm);
	int rc;
	if ((rc = check_unit(m, mb, m->d.L, B, T, "head_forward_backward")) != LOOM_OK)
		return rc;
	if (row0 < 0 || rows < 1 || row0 > B * T - rows)
		return loom_seterr(LOOM_EINVAL, "nanochat head_forward_backward_rows: rows [%d, %d) of a batch of %d x %d "
		                   "positions", row0, row0 + rows, B, T);
	if (!targets)
		return loom_seterr(LOOM_EINVAL, "nanochat head_forward_backward: targets are NULL");
	if ((rc = check_tokens(m, targets + row0, rows, T, "targets")) != LOOM_OK)
		return rc;
	loom__gemm_setup(&m->gemm);
	head_forward_backward(m, &m->arenas[mb], targets, B * T, row0, rows, grad_scale, loss);
	return status(m);
}

static int nc_head_forward_backward(loom_model_t *mm, int mb, const int *targets, int B, int T, float grad_scale,
                                    float *loss)
{
	if (B <= 0 || T <= 0)
		return loom_seterr(LOOM_EINVAL, "nanochat head_forward_backward: batch %d x %d", B, T);
	return nc_head_forward_backward_rows(mm, mb, targets, B, T, 0, B * T, grad_scale, loss);
}

static int nc_block_backward(loom_model_t *mm, int mb, int l, int B, int T)
{
	nc_t *m = M(mm);
	int rc;
	if ((rc = check_block(m, mb, l, B, T, "block_backward")) != LOOM_OK)
		return rc;
	loom__gemm_setup(&m->gemm);
	block_backward(m, &m->arenas[mb], l, B, T);
	return status(m);
}

static int nc_embed_backward(loom_model_t *mm, int mb, const int *inputs, int B, int T)
{
	nc_t *m = M(mm);
	int rc;
	if ((rc = check_unit(m, mb, -1, B, T, "embed_backward")) != LOOM_OK ||
	    (rc = check_tokens(m, inputs, B * T, T, "inputs")) != LOOM_OK)
		return rc;
	loom__gemm_setup(&m->gemm);
	embed_backward(m, &m->arenas[mb], inputs, B, T);
	return status(m);
}

static float *nc_block_input(loom_model_t *mm, int mb, int l)
{
	nc_t *m = M(mm);
	if (mb < 0 || mb >= m->narenas || l < m->lo || l > m->hi)
		return NULL;
	return stream(m, &m->arenas[mb], l);
}

static float *nc_stream_grad(loom_model_t *m)
{
	return M(m)->dres;
}

/* ---- the whole model -------------------------------------------------------------------------------- */

static int check_call(const nc_t *m, const int *inputs, const int *targets, int B, int T, const char *op)
{
	int rc;
	if (!m->has_embed || !m->has_head)
		return loom_seterr(LOOM_EINVAL, "nanochat %s: needs every layer, the model holds blocks [%d, %d) of %d", op,
		                   m->lo, m->hi, m->d.L);
	if ((rc = check_unit(m, 0, -1, B, T, op)) != LOOM_OK)
		return rc;
	if (m->tp > 1 && !targets)
		return loom_seterr(LOOM_EINVAL, "nanochat %s: a tensor-parallel model computes losses only", op);
	if ((rc = check_tokens(m, inputs, B * T, T, "inputs")) != LOOM_OK)
		return rc;
	if (targets && (rc = check_tokens(m, targets, B * T, T, "targets")) != LOOM_OK)
		return rc;
	return LOOM_OK;
}

static int nc_forward(loom_model_t *mm, const int *inputs, const int *targets, int B, int T, float *loss)
{
	nc_t *m = M(mm);
	nc_arena_t *ar = &m->arenas[0];
	int rc;
	if ((rc = check_call(m, inputs, targets, B, T, "forward")) != LOOM_OK)
		return rc;
	loom__gemm_setup(&m->gemm);
	embed_forward(m, ar, inputs, B, T);
	for (int l = 0; l < m->d.L; l++)
		block_forward(m, ar, l, B, T);
	head_forward(m, ar, targets, B, T, loss);
	return status(m);
}

static const float *nc_logits(const loom_model_t *m)
{
	return CM(m)->last_logits;
}

static void nc_zero_grad(loom_model_t *mm)
{
	nc_t *m = M(mm);
	if (!m->grad_split) {
		if (m->grads)
			zero(m->grads, m->nparams);
		return;
	}
	for (int i = 0; i < m->ntensors; i++)
		if (m->gview[i])
			zero(m->gview[i], m->tensors[i].numel);
}

static int nc_forward_backward(loom_model_t *mm, const int *inputs, const int *targets, int B, int T,
                               float grad_scale, float *loss)
{
	nc_t *m = M(mm);
	nc_arena_t *ar = &m->arenas[0];
	int rc, L = m->d.L;
	if (!targets)
		return loom_seterr(LOOM_EINVAL, "nanochat forward_backward: targets are NULL");
	if ((rc = check_call(m, inputs, targets, B, T, "forward_backward")) != LOOM_OK)
		return rc;
	loom__gemm_setup(&m->gemm);
	embed_forward(m, ar, inputs, B, T);
	for (int l = 0; l < L; l++)
		block_forward(m, ar, l, B, T);
	head_forward_backward(m, ar, targets, B * T, 0, B * T, grad_scale, loss);
	for (int l = L - 1; l >= 0; l--)
		block_backward(m, ar, l, B, T);
	embed_backward(m, ar, inputs, B, T);
	return status(m);
}

static void nc_on_grad_ready(loom_model_t *m, loom_grad_ready_fn fn, void *ctx)
{
	M(m)->on_ready = fn;
	M(m)->on_ready_ctx = ctx;
}

static void nc_on_param_use(loom_model_t *m, loom_param_use_fn fn, void *ctx)
{
	M(m)->on_use = fn;
	M(m)->on_use_ctx = ctx;
}

static void nc_on_tp_reduce(loom_model_t *m, loom_tp_reduce_fn fn, void *ctx)
{
	M(m)->tp_reduce = fn;
	M(m)->tp_ctx = ctx;
}

static int nc_tp_size(const loom_model_t *m)
{
	return CM(m)->tp;
}

static int nc_tp_rank(const loom_model_t *m)
{
	return CM(m)->tp_rank;
}

static int nc_kv_cache_alloc(loom_model_t *m)
{
	return loom__nc_kv_alloc(M(m));
}

static int nc_generate(loom_model_t *m, const int *prompt, int n_prompt, int max_new, float temperature, int top_k,
                       uint64_t seed, int stop_token, int *out, int *n_out, void (*on_token)(void *ctx, int token),
                       void *ctx)
{
	return loom__nc_generate(M(m), prompt, n_prompt, max_new, temperature, top_k, seed, stop_token, out, n_out,
	                         on_token, ctx);
}

static void nc_profile(loom_model_t *m, int enable)
{
	(void)m, (void)enable; /* no per-kernel timing in this family yet */
}

static void nc_profile_report(loom_model_t *m, void *file, int steps)
{
	(void)m, (void)steps;
	fprintf((FILE *)file, "nanochat: no per-kernel profile (not implemented for this family)\n");
}

static const loom_model_family_t nanochat_family = {
	.name = "nanochat",
	.arch = LOOM_ARCH_NANOCHAT,
	.config_check = loom__nc_config_check,
	.num_tensors = loom__nc_num_tensors,
	.tensor_info = loom__nc_tensor_info,
	.num_params = loom__nc_num_params,
	.flops_per_token = loom__nc_flops_per_token,
	.stream_width = loom__nc_stream_width,
	.tp_check = loom__nc_tp_check,
	.shard_info = loom__nc_shard_info,
	.shard_params = loom__nc_shard_params,
	.tp_shard = loom__nc_tp_shard,
	.tp_unshard = loom__nc_tp_unshard,
	.act_bytes = nc_act_bytes,
	.create = nc_create,
	.destroy = nc_destroy,
	.config = nc_config,
	.dtype = nc_dtype,
	.tensors = nc_tensors,
	.param_count = nc_param_count,
	.params = nc_params,
	.grads = nc_grads,
	.set_grad_buffer = nc_set_grad_buffer,
	.set_param_buffer = nc_set_param_buffer,
	.own_grads = nc_own_grads,
	.set_tensor_view = nc_set_tensor_view,
	.set_unit_view = nc_set_unit_view,
	.tensor_param = nc_tensor_param,
	.tensor_grad = nc_tensor_grad,
	.init = nc_init,
	.layers = nc_layers,
	.act_ckpt = nc_act_ckpt,
	.recomputes = nc_recomputes,
	.model_act_bytes = nc_model_act_bytes,
	.forward = nc_forward,
	.logits = nc_logits,
	.zero_grad = nc_zero_grad,
	.forward_backward = nc_forward_backward,
	.on_grad_ready = nc_on_grad_ready,
	.on_param_use = nc_on_param_use,
	.on_tp_reduce = nc_on_tp_reduce,
	.set_inputs = nc_set_inputs,
	.embed_forward = nc_embed_forward,
	.block_forward = nc_block_forward,
	.head_forward = nc_head_forward,
	.head_forward_backward = nc_head_forward_backward,
	.head_forward_backward_rows = nc_head_forward_backward_rows,
	.block_backward = nc_block_backward,
	.embed_backward = nc_embed_backward,
	.block_input = nc_block_input,
	.stream_grad = nc_stream_grad,
	.tp_size = nc_tp_size,
	.tp_rank = nc_tp_rank,
	.kv_cache_alloc = nc_kv_cache_alloc,
	.generate = nc_generate,
	.profile = nc_profile,
	.profile_report = nc_profile_report,
};

const loom_model_family_t *loom__nanochat_family(void)
{
	return &nanochat_family;
}
