/* nanochat.c: nanochat's GPT (karpathy/nanochat bac5a35, nanochat/gpt.py) as a model family: creation
 * and the activation layout, parameter and gradient views, initialization, the hooks, and the family
 * table; the passes are nanochat_passes.c, the kernels nanochat_kernels.c, the parameter table
 * nanochat_layout.c, sampling nanochat_generate.c.
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
#include "model/nanochat/nanochat.h"
#include "model/nanochat/nanochat_model.h"
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
	size_t lse = (size_t)m->B * d->nh * T, Ns = m->sp ? N / (size_t)m->tp : N;
	nc_layer_t shared = {0}, dummy;
	nc_arena_t dummy_arena;
	memset(bytes, 0, sizeof *bytes);
#define LAYER_BUFS(a, LSE, ATTY)                                                                                         \
	do {                                                                                                           \
		(a)->xin = carve(base, &off, Ns * C);                                                                      \
		(a)->xn1 = carve(base, &off, Ns * C);                                                                      \
		(a)->rstd1 = carve(base, &off, Ns);                                                                        \
		(a)->q = carve(base, &off, N * Q);                                                                         \
		(a)->qrstd = carve(base, &off, N * d->nh);                                                                 \
		(a)->k = carve(base, &off, N * KV);                                                                        \
		(a)->krstd = carve(base, &off, N * d->nkv);                                                                \
		(a)->v = carve(base, &off, N * KV);                                                                        \
		(a)->gate = carve(base, &off, N * d->nkv);                                                                 \
		(a)->lse = (LSE);                                                                                          \
		(a)->atty = (ATTY);                                                                                        \
		(a)->x2 = carve(base, &off, Ns * C);                                                                       \
		(a)->xn2 = carve(base, &off, Ns * C);                                                                      \
		(a)->rstd2 = carve(base, &off, Ns);                                                                        \
		(a)->fch = carve(base, &off, N * Hd);                                                                      \
		(a)->act = carve(base, &off, N * Hd);                                                                      \
	} while (0)
	/* selective: the attention's output and lse are recomputed before the block's backward */
	if (m->act_ckpt != LOOM_ACT_CKPT_NONE) {
		shared.lse = carve(base, &off, lse);
		shared.atty = carve(base, &off, N * Q);
	}
	if (m->act_ckpt == LOOM_ACT_CKPT_BLOCKS)
		LAYER_BUFS(&shared, shared.lse, shared.atty);
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
				int sel = m->act_ckpt == LOOM_ACT_CKPT_SELECTIVE;
				LAYER_BUFS(a, sel ? shared.lse : carve(base, &off, lse), sel ? shared.atty : carve(base, &off, N * Q));
			}
			a->out = carve(base, &off, (l == m->hi - 1 ? N : Ns) * 2 * C); /* block hi-1's whole */
			if (l == m->lo)
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
	/* shared scratch, counted with the backward's: a block forward's row-parallel product before its
	 * sum, the embedding's lookup */
	m->ftmp = carve(base, &off, N * C);
	m->dres = carve(base, &off, N * 2 * C);
	m->dx2 = carve(base, &off, N * C);
	m->dxin = carve(base, &off, N * C);
	m->dxn = carve(base, &off, N * C);
	m->dq = carve(base, &off, N * Q);
	m->dk = carve(base, &off, N * KV);
	m->dv = carve(base, &off, N * KV);
	m->dkh = carve(base, &off, N * Q);
	m->datty = carve(base, &off, N * Q);
	m->dh1 = carve(base, &off, N * Hd);
	m->dh2 = carve(base, &off, N * Hd);
	m->dgate = carve(base, &off, N * d->nkv);
	m->dscal = carve(base, &off, 2 * N);
	/* context parallel: the kernel's backward partials cover the whole sequence's keys, the gathered keys
	 * and values of one layer live in cp_mem */
	m->att_scratch = carve(base, &off, loom__flash_scratch_floats(m->B, m->T * m->cp, d->nkv, d->D, m->att_threads));
	if (m->cp > 1)
		m->cp_mem = carve(base, &off, loom__cp_scratch_floats(m->B, m->T, m->cp, d->nh, d->nkv, d->D));
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
	if (o->sequence_parallel && tp < 2)
		return loom_seterr(LOOM_EINVAL, "nanochat create: sequence parallelism shards the sequence over the "
		                   "tensor-parallel ranks and needs tp > 1 (tp_size %d)", o->tp_size);
	if (o->sequence_parallel && ((long)o->B * o->T) % tp != 0)
		return loom_seterr(LOOM_EINVAL, "nanochat create: sequence parallelism: the %d x %d = %ld positions of a "
		                   "micro-batch are not divisible by tp = %d (each rank holds an equal share)", o->B, o->T,
		                   (long)o->B * o->T, tp);
	if (o->dtype != LOOM_COMPUTE_FP32 && o->dtype != LOOM_COMPUTE_BF16)
		return loom_seterr(LOOM_EINVAL, "nanochat create: dtype %d (expected fp32 or bf16)", (int)o->dtype);
	if ((rc = loom__cp_opts_check("nanochat", "sequence_len", cfg, o)) != LOOM_OK)
		return rc;
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
	m->sp = o->sequence_parallel && tp > 1;
	m->cp = o->cp_size > 1 ? o->cp_size : 1, m->cp_rank = m->cp > 1 ? o->cp_rank : 0;
	m->cp_ring = m->cp > 1 && loom__cp_ring_env() == 1;
	m->cp_T = -1, m->cp_K = 2; /* the layout's K, computed at the first pass (loom__cp_chunks_memo) */
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
 * then rounded to bfloat16 as it keeps them; for every position of a sequence (cp T of them). */
static void rotary_tables(nc_t *m)
{
	int D = m->d.D, h2 = D / 2;
	for (int t = 0; t < m->T * m->cp; t++)
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
	want = (size_t)m->T * m->cp * m->d.D * sizeof(float); /* cos and sin: (cp) T x D/2 each */
	if (!(m->rope = loom_alloc_aligned(want)))
		goto nomem;
	m->cos = m->rope, m->sin = m->rope + (size_t)m->T * m->cp * m->d.D / 2;
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
	loom_free_aligned(m->rope);
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

static int nc_sequence_parallel(const loom_model_t *m)
{
	return CM(m)->sp;
}

static long long nc_recomputes(const loom_model_t *m)
{
	return CM(m)->recomputes;
}

static void nc_model_act_bytes(const loom_model_t *m, loom_model_act_bytes_t *out)
{
	*out = CM(m)->act;
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

static int nc_kv_width(const loom_model_config_t *cfg)
{
	loom_model_config_t c;
	loom__nc_normalize(cfg, &c);
	return c.n_kv_head * (c.n_embd / c.n_head);
}

static void nc_on_cp_reduce(loom_model_t *m, loom_tp_reduce_fn fn, void *ctx)
{
	M(m)->cp_fn = fn;
	M(m)->cp_ctx = ctx;
}

static int nc_cp_size(const loom_model_t *m)
{
	return CM(m)->cp;
}

static int nc_cp_rank(const loom_model_t *m)
{
	return CM(m)->cp_rank;
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
	.kv_width = nc_kv_width,
	.tp_check = loom__nc_tp_check,
	.shard_info = loom__nc_shard_info,
	.shard_params = loom__nc_shard_params,
	.tp_shard = loom__nc_tp_shard,
	.tp_unshard = loom__nc_tp_unshard,
	.tp_copy_tensor = loom__nc_tp_copy_tensor,
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
	.sequence_parallel = nc_sequence_parallel,
	.recomputes = nc_recomputes,
	.model_act_bytes = nc_model_act_bytes,
	.forward = loom__nc_forward,
	.logits = loom__nc_last_logits,
	.zero_grad = loom__nc_zero_grad,
	.forward_backward = loom__nc_forward_backward,
	.on_grad_ready = nc_on_grad_ready,
	.on_param_use = nc_on_param_use,
	.on_tp_reduce = nc_on_tp_reduce,
	.set_inputs = loom__nc_set_inputs,
	.embed_forward = loom__nc_embed_forward,
	.block_forward = loom__nc_block_forward,
	.head_forward = loom__nc_head_forward,
	.head_forward_backward = loom__nc_head_forward_backward,
	.head_forward_backward_rows = loom__nc_head_forward_backward_rows,
	.block_backward = loom__nc_block_backward,
	.embed_backward = loom__nc_embed_backward,
	.block_input = loom__nc_block_input,
	.stream_grad = loom__nc_stream_grad,
	.tp_size = nc_tp_size,
	.tp_rank = nc_tp_rank,
	.on_cp_reduce = nc_on_cp_reduce,
	.cp_size = nc_cp_size,
	.cp_rank = nc_cp_rank,
	.kv_cache_alloc = nc_kv_cache_alloc,
	.generate = nc_generate,
	.profile = nc_profile,
	.profile_report = nc_profile_report,
};

const loom_model_family_t *loom__nanochat_family(void)
{
	return &nanochat_family;
}
