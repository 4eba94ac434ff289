/* llama.c: the Llama / Qwen2 family (transformers' LlamaForCausalLM, Qwen2ForCausalLM) as a model
 * family: creation and the activation layout, parameter and gradient views, initialization, the hooks,
 * and the family table; the passes are llama_passes.c, the kernels llama_kernels.c, the parameter table
 * llama_layout.c, sampling llama_generate.c.
 *
 * The contract is GPT-2's (loom/gpt2.h) and so are the invariants: every buffer is allocated in create
 * and a training step allocates nothing; activations are laid out for the capacity B x T and a smaller
 * call packs its rows at the start; each arena holds one micro-batch, the backward scratch is shared;
 * kernels reach tensors only through the views, read after the unit's param-use hook. The backward
 * reports tensor i to the grad-ready callback once per micro-step as soon as nothing later adds to it,
 * so over a whole model indices arrive strictly decreasing: lm_head (untied), model.norm, each block's
 * from mlp.down_proj's bias down to input_layernorm, and embed_tokens last (tied: the head's share and
 * the embedding's; a model without the embedding reports it right after the head's, as GPT-2 does
 * with its tied wte). With activation
 * checkpointing a block keeps only its output and block_backward recomputes the rest with the
 * forward's own code. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "model/fastmath.h"
#include "model/llama/llama.h"
#include "model/llama/llama_model.h"
#include "model/rng.h"

#define DEFAULT_CHUNK 512

typedef loom_llama_t ll_t;

static float *carve(char *base, size_t *off, size_t nfloats)
{
	float *p = base ? (float *)(base + *off) : NULL;
	*off += (nfloats * sizeof(float) + 63) / 64 * 64;
	return p;
}

/* The layout of every activation buffer in one allocation (base NULL: measure only), as nanochat's:
 * the recompute scratch, the arenas, the head scratch, the forward and backward scratch. */
static size_t layout(ll_t *m, char *base, loom_model_act_bytes_t *bytes)
{
	const ll_dims_t *d = &m->d;
	size_t off = 0, C = (size_t)d->C, N = (size_t)m->B * m->T, T = (size_t)m->T, mark;
	size_t Q = (size_t)d->nh * d->D, KV = (size_t)d->nkv * d->D, I = (size_t)d->il;
	size_t lse = (size_t)m->B * d->nh * T, Ns = m->sp ? N / (size_t)m->tp : N;
	ll_layer_t shared = {0}, dummy;
	ll_arena_t dummy_arena;
	memset(bytes, 0, sizeof *bytes);
#define LAYER_BUFS(a, LSE, ATTY)                                                                                         \
	do {                                                                                                           \
		(a)->xn1 = carve(base, &off, Ns * C);                                                                      \
		(a)->rstd1 = carve(base, &off, Ns);                                                                        \
		(a)->q = carve(base, &off, N * Q);                                                                         \
		(a)->k = carve(base, &off, N * KV);                                                                        \
		(a)->v = carve(base, &off, N * KV);                                                                        \
		(a)->lse = (LSE);                                                                                          \
		(a)->atty = (ATTY);                                                                                        \
		(a)->x2 = carve(base, &off, Ns * C);                                                                       \
		(a)->xn2 = carve(base, &off, Ns * C);                                                                      \
		(a)->rstd2 = carve(base, &off, Ns);                                                                        \
		(a)->g = carve(base, &off, N * I);                                                                         \
		(a)->u = carve(base, &off, N * I);                                                                         \
		(a)->act = carve(base, &off, N * I);                                                                       \
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
		ll_arena_t *ar = base ? &m->arenas[k] : &dummy_arena;
		ar->in = carve(base, &off, N * C);
		for (int l = m->lo; l < m->hi; l++) {
			ll_layer_t *a = base ? &ar->layers[l - m->lo] : &dummy;
			size_t l0 = off;
			if (m->act_ckpt == LOOM_ACT_CKPT_BLOCKS) {
				*a = shared;
			} else {
				int sel = m->act_ckpt == LOOM_ACT_CKPT_SELECTIVE;
				LAYER_BUFS(a, sel ? shared.lse : carve(base, &off, lse), sel ? shared.atty : carve(base, &off, N * Q));
			}
			a->out = carve(base, &off, (l == m->hi - 1 ? N : Ns) * C); /* block hi-1's whole */
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
	m->ftmp = carve(base, &off, N * C);
	m->dres = carve(base, &off, N * C);
	m->dx2 = carve(base, &off, N * C);
	m->dxn = carve(base, &off, N * C);
	m->dq = carve(base, &off, N * Q);
	m->dk = carve(base, &off, N * KV);
	m->dv = carve(base, &off, N * KV);
	m->datty = carve(base, &off, N * Q);
	m->dact = carve(base, &off, N * I);
	m->dg = carve(base, &off, N * I);
	m->du = carve(base, &off, N * I);
	m->dnw = carve(base, &off, C);
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
	if ((rc = loom__ll_config_check(cfg)) != LOOM_OK)
		return rc;
	if (o->B <= 0 || o->T <= 0 || o->T > cfg->seq_len)
		return loom_seterr(LOOM_EINVAL, "llama create: batch %d x %d tokens (expected B >= 1 and 1 <= T <= "
		                   "max_position_embeddings %d)", o->B, o->T, cfg->seq_len);
	int lo = o->layer_lo, hi = o->layer_hi ? o->layer_hi : L;
	if (lo < 0 || (lo >= hi && !(lo == hi && hi == L)) || hi > L || o->arenas < 0)
		return loom_seterr(LOOM_EINVAL, "llama create: layers [%d, %d) with %d arenas (expected 0 <= lo < hi <= "
		                   "num_hidden_layers %d, or lo = hi = num_hidden_layers for the head alone, and arenas >= 1)",
		                   o->layer_lo, o->layer_hi, o->arenas, L);
	int tp = o->tp_size ? o->tp_size : 1;
	if (tp < 1 || o->tp_rank < 0 || o->tp_rank >= tp)
		return loom_seterr(LOOM_EINVAL, "llama create: tensor-parallel rank %d of %d (expected 0 <= rank < size)",
		                   o->tp_rank, tp);
	if ((int)o->act_ckpt < LOOM_ACT_CKPT_NONE || (int)o->act_ckpt > LOOM_ACT_CKPT_SELECTIVE)
		return loom_seterr(LOOM_EINVAL, "llama create: activation checkpointing mode %d", (int)o->act_ckpt);
	if (o->sequence_parallel && tp < 2)
		return loom_seterr(LOOM_EINVAL, "llama create: sequence parallelism shards the sequence over the "
		                   "tensor-parallel ranks and needs tp > 1 (tp_size %d)", o->tp_size);
	if (o->sequence_parallel && ((long)o->B * o->T) % tp != 0)
		return loom_seterr(LOOM_EINVAL, "llama create: sequence parallelism: the %d x %d = %ld positions of a "
		                   "micro-batch are not divisible by tp = %d (each rank holds an equal share)", o->B, o->T,
		                   (long)o->B * o->T, tp);
	if (o->dtype != LOOM_COMPUTE_FP32 && o->dtype != LOOM_COMPUTE_BF16)
		return loom_seterr(LOOM_EINVAL, "llama create: dtype %d (expected fp32 or bf16)", (int)o->dtype);
	if ((rc = loom__cp_opts_check("llama", "max_position_embeddings", cfg, o)) != LOOM_OK)
		return rc;
	loom_bf16_path_t path;
	if (o->dtype == LOOM_COMPUTE_BF16 && (rc = loom_bf16_path(&path)) != LOOM_OK)
		return rc;
	return loom__ll_tp_check(cfg, tp);
}

static void setup(ll_t *m, const loom_model_config_t *cfg, const loom_model_opts_t *o)
{
	int L = cfg->n_layer, tp = o->tp_size ? o->tp_size : 1;
	loom__ll_normalize(cfg, &m->cfg);
	loom__ll_dims(&m->cfg, tp, &m->d);
	m->eps = (float)m->cfg.rms_norm_eps;
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
	m->nparams = loom__ll_shard_params(cfg, tp);
	m->ntensors = loom__ll_num_tensors(cfg);
	m->norm_i = loom__ll_norm_index(&m->d);
	m->head_i = loom__ll_head_index(&m->d);
	long chunk = loom_env_long("LOOM_CLS_CHUNK", DEFAULT_CHUNK, NULL);
	m->chunk = (int)LOOM_MAX(1, LOOM_MIN(chunk, (long)o->B * o->T));
	m->att_threads = LOOM_MAX(omp_get_max_threads(), omp_get_num_procs());
	m->act_ckpt = (int)o->act_ckpt;
	m->sp = o->sequence_parallel && tp > 1;
	m->cp = o->cp_size > 1 ? o->cp_size : 1, m->cp_rank = m->cp > 1 ? o->cp_rank : 0;
	m->cp_ring = m->cp > 1 && loom__cp_ring_env() == 1;
	m->cp_T = -1, m->cp_K = 2; /* the layout's K, computed at the first pass (loom__cp_chunks_memo) */
}

static int ll_act_bytes(const loom_model_config_t *cfg, const loom_model_opts_t *o, loom_model_act_bytes_t *out)
{
	ll_t m;
	int rc;
	memset(out, 0, sizeof *out);
	if ((rc = check_opts(cfg, o)) != LOOM_OK)
		return rc;
	memset(&m, 0, sizeof m);
	setup(&m, cfg, o);
	layout(&m, NULL, out);
	return LOOM_OK;
}

static void point_params(ll_t *m, float *params)
{
	m->params = params;
	for (int i = 0; i < m->ntensors; i++)
		m->pview[i] = params ? params + m->tensors[i].offset : NULL;
}

static void point_grads(ll_t *m, float *grads)
{
	m->grads = grads;
	m->grad_split = 0;
	for (int i = 0; i < m->ntensors; i++)
		m->gview[i] = grads ? grads + m->tensors[i].offset : NULL;
}

/* cos and sin of position t times each inverse frequency (llama_layout.c), computed in double and
 * rounded once, for every position of a sequence (cp T of them). */
static void rotary_tables(ll_t *m)
{
	int h2 = m->d.D / 2;
	double inv[LOOM_MAX(1, h2)];
	loom__ll_inv_freq(&m->cfg, inv);
	for (int t = 0; t < m->T * m->cp; t++)
		for (int i = 0; i < h2; i++) {
			double f = (double)t * inv[i];
			m->cos[(size_t)t * h2 + i] = (float)cos(f);
			m->sin[(size_t)t * h2 + i] = (float)sin(f);
		}
}

static void ll_destroy(loom_model_t *mm);

static int ll_create(loom_model_t **out, const loom_model_config_t *cfg, const loom_model_opts_t *o)
{
	ll_t *m = NULL;
	int rc, tp = o->tp_size ? o->tp_size : 1;
	*out = NULL;
	if ((rc = check_opts(cfg, o)) != LOOM_OK)
		return rc;
	size_t want = sizeof *m;
	if (!(m = loom__calloc(1, sizeof *m)))
		goto nomem;
	m->base.family = loom__llama_family();
	setup(m, cfg, o);
	want = (size_t)m->ntensors * sizeof *m->tensors;
	if (!(m->tensors = loom__calloc((size_t)m->ntensors, sizeof *m->tensors)) ||
	    !(m->pview = loom__calloc((size_t)m->ntensors, sizeof *m->pview)) ||
	    !(m->gview = loom__calloc((size_t)m->ntensors, sizeof *m->gview)) ||
	    !(m->arenas = loom__calloc((size_t)m->narenas, sizeof *m->arenas)))
		goto nomem;
	for (int k = 0; k < m->narenas; k++)
		if (!(m->arenas[k].layers = loom__calloc((size_t)LOOM_MAX(m->hi - m->lo, 1), sizeof *m->arenas[k].layers)))
			goto nomem;
	for (int i = 0; i < m->ntensors; i++)
		loom__ll_shard_info(&m->cfg, tp, i, &m->tensors[i]);
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
	ll_destroy(m ? &m->base : NULL);
	return loom_seterr(LOOM_ENOMEM, "llama create: out of memory for L%d C%d V%d with batch %d x %d (%zu bytes "
	                   "requested)", cfg->n_layer, cfg->n_embd, cfg->vocab_size, o->B, o->T, want);
}

#define M(mm) ((ll_t *)(mm))
#define CM(mm) ((const ll_t *)(mm))

static void ll_destroy(loom_model_t *mm)
{
	ll_t *m = M(mm);
	if (!m)
		return;
	loom__ll_kv_free(m);
	loom__gemm_ctx_free(&m->gemm);
	loom_free_aligned(m->mem);
	loom_free_aligned(m->rope);
	loom_free_aligned(m->params_own);
	loom_free_aligned(m->grads_own);
	if (m->arenas)
		for (int k = 0; k < m->narenas; k++)
			free(m->arenas[k].layers);
	free(m->arenas);
	free(m->tensors);
	free(m->pview);
	free(m->gview);
	free(m);
}

static const loom_model_config_t *ll_config(const loom_model_t *m)
{
	return &CM(m)->cfg;
}

static loom_compute_dtype_t ll_dtype(const loom_model_t *m)
{
	return (loom_compute_dtype_t)CM(m)->gemm.dtype;
}

static const loom_tensor_info_t *ll_tensors(const loom_model_t *m, int *n)
{
	if (n)
		*n = CM(m)->ntensors;
	return CM(m)->tensors;
}

static size_t ll_param_count(const loom_model_t *m)
{
	return CM(m)->nparams;
}

static float *ll_params(loom_model_t *m)
{
	return M(m)->params;
}

static float *ll_grads(loom_model_t *m)
{
	return M(m)->grads;
}

static int ll_set_grad_buffer(loom_model_t *m, float *grads)
{
	if (!grads)
		return loom_seterr(LOOM_EINVAL, "llama set_grad_buffer: NULL buffer");
	point_grads(M(m), grads);
	return LOOM_OK;
}

static int ll_own_grads(loom_model_t *mm)
{
	ll_t *m = M(mm);
	if (!m->grads_own && !(m->grads_own = loom_alloc_aligned(m->nparams * sizeof(float))))
		return loom_seterr(LOOM_ENOMEM, "llama own_grads: out of memory for %zu gradients", m->nparams);
	point_grads(m, m->grads_own);
	return LOOM_OK;
}

static int ll_set_param_buffer(loom_model_t *mm, float *params)
{
	ll_t *m = M(mm);
	if (!params && !m->params_own && !(m->params_own = loom_alloc_aligned(m->nparams * sizeof(float))))
		return loom_seterr(LOOM_ENOMEM, "llama set_param_buffer: out of memory for %zu parameters", m->nparams);
	point_params(m, params ? params : m->params_own);
	return LOOM_OK;
}

static int ll_set_tensor_view(loom_model_t *mm, int tensor, float *param, float *grad)
{
	ll_t *m = M(mm);
	if (tensor < 0 || tensor >= m->ntensors)
		return loom_seterr(LOOM_EINVAL, "llama set_tensor_view: tensor %d out of range [0, %d)", tensor, m->ntensors);
	if (param)
		m->pview[tensor] = param;
	if (grad) {
		m->gview[tensor] = grad;
		m->grad_split = 1;
	}
	return LOOM_OK;
}

static int ll_set_unit_view(loom_model_t *mm, int unit, float *params, float *grads)
{
	ll_t *m = M(mm);
	int first, end;
	if (unit < -1 || unit > m->d.L)
		return loom_seterr(LOOM_EINVAL, "llama set_unit_view: unit %d out of range [-1, %d]", unit, m->d.L);
	loom__ll_unit_range(&m->d, unit, &first, &end);
	size_t base = m->tensors[first].offset;
	for (int i = first; i < end; i++)
		ll_set_tensor_view(mm, i, params ? params + (m->tensors[i].offset - base) : NULL,
		                   grads ? grads + (m->tensors[i].offset - base) : NULL);
	return LOOM_OK;
}

static float *ll_tensor_param(loom_model_t *m, int t)
{
	return t >= 0 && t < M(m)->ntensors ? M(m)->pview[t] : NULL;
}

static float *ll_tensor_grad(loom_model_t *m, int t)
{
	return t >= 0 && t < M(m)->ntensors ? M(m)->gview[t] : NULL;
}

/* transformers' _init_weights for LlamaForCausalLM: every matrix (embed_tokens, the projections,
 * lm_head) N(0, initializer_range = 0.02), biases 0, norm weights 1. Tensor i draws from its own stream
 * (seed ^ 0x9e3779b97f4a7c15 (i + 1), as the other families), over the whole tensor in row-major order,
 * so a tensor-parallel shard gets exactly the whole model's values at its positions. */
static void ll_init(loom_model_t *mm, uint64_t seed)
{
	ll_t *m = M(mm);
	for (int i = 0; i < m->ntensors; i++) {
		loom_tensor_info_t f;
		const loom_tensor_info_t *sh = &m->tensors[i];
		float *p = m->pview[i];
		rng_t r;
		if (!p)
			continue;
		loom__ll_tensor_info(&m->cfg, i, &f);
		if (f.ndim == 1) {
			int norm = strstr(f.name, "norm") != NULL;
			for (size_t a = 0; a < sh->numel; a++)
				p[a] = norm ? 1.0f : 0.0f;
			continue;
		}
		size_t rows = f.shape[0], cols = f.shape[1], srows = sh->shape[0], scols = sh->shape[1];
		size_t r0 = f.tp_dim == 0 ? (size_t)m->tp_rank * srows : 0, c0 = f.tp_dim == 1 ? (size_t)m->tp_rank * scols : 0;
		rng_seed(&r, seed ^ (0x9e3779b97f4a7c15ULL * (uint64_t)(i + 1)));
		for (size_t a = 0; a < rows; a++)
			for (size_t b = 0; b < cols; b++) {
				float v = (float)(0.02 * rng_normal(&r));
				if (a >= r0 && a < r0 + srows && b >= c0 && b < c0 + scols)
					p[(a - r0) * scols + (b - c0)] = v;
			}
	}
}

static void ll_layers(const loom_model_t *mm, int *lo, int *hi, int *arenas)
{
	const ll_t *m = CM(mm);
	if (lo)
		*lo = m->lo;
	if (hi)
		*hi = m->hi;
	if (arenas)
		*arenas = m->narenas;
}

static loom_act_ckpt_t ll_act_ckpt(const loom_model_t *m)
{
	return (loom_act_ckpt_t)CM(m)->act_ckpt;
}

static int ll_sequence_parallel(const loom_model_t *m)
{
	return CM(m)->sp;
}

static long long ll_recomputes(const loom_model_t *m)
{
	return CM(m)->recomputes;
}

static void ll_model_act_bytes(const loom_model_t *m, loom_model_act_bytes_t *out)
{
	*out = CM(m)->act;
}

static void ll_on_grad_ready(loom_model_t *m, loom_grad_ready_fn fn, void *ctx)
{
	M(m)->on_ready = fn;
	M(m)->on_ready_ctx = ctx;
}

static void ll_on_param_use(loom_model_t *m, loom_param_use_fn fn, void *ctx)
{
	M(m)->on_use = fn;
	M(m)->on_use_ctx = ctx;
}

static void ll_on_tp_reduce(loom_model_t *m, loom_tp_reduce_fn fn, void *ctx)
{
	M(m)->tp_reduce = fn;
	M(m)->tp_ctx = ctx;
}

static void ll_on_cp_reduce(loom_model_t *m, loom_tp_reduce_fn fn, void *ctx)
{
	M(m)->cp_fn = fn;
	M(m)->cp_ctx = ctx;
}

static int ll_cp_size(const loom_model_t *m)
{
	return CM(m)->cp;
}

static int ll_cp_rank(const loom_model_t *m)
{
	return CM(m)->cp_rank;
}

static int ll_tp_size(const loom_model_t *m)
{
	return CM(m)->tp;
}

static int ll_tp_rank(const loom_model_t *m)
{
	return CM(m)->tp_rank;
}

static int ll_kv_cache_alloc(loom_model_t *m)
{
	return loom__ll_kv_alloc(M(m));
}

static int ll_generate(loom_model_t *m, const int *prompt, int n_prompt, int max_new, float temperature, int top_k,
                       uint64_t seed, int stop_token, int *out, int *n_out, void (*on_token)(void *ctx, int token),
                       void *ctx)
{
	return loom__ll_generate(M(m), prompt, n_prompt, max_new, temperature, top_k, seed, stop_token, out, n_out,
	                         on_token, ctx);
}

static void ll_profile(loom_model_t *m, int enable)
{
	(void)m, (void)enable; /* no per-kernel timing in this family yet */
}

static void ll_profile_report(loom_model_t *m, void *file, int steps)
{
	(void)m, (void)steps;
	fprintf((FILE *)file, "llama: no per-kernel profile (not implemented for this family)\n");
}

static const loom_model_family_t llama_family = {
	.name = "llama",
	.arch = LOOM_ARCH_LLAMA,
	.config_check = loom__ll_config_check,
	.num_tensors = loom__ll_num_tensors,
	.tensor_info = loom__ll_tensor_info,
	.num_params = loom__ll_num_params,
	.flops_per_token = loom__ll_flops_per_token,
	.stream_width = loom__ll_stream_width,
	.kv_width = loom__ll_kv_width,
	.tp_check = loom__ll_tp_check,
	.shard_info = loom__ll_shard_info,
	.shard_params = loom__ll_shard_params,
	.tp_shard = loom__ll_tp_shard,
	.tp_unshard = loom__ll_tp_unshard,
	.tp_copy_tensor = loom__ll_tp_copy_tensor,
	.act_bytes = ll_act_bytes,
	.create = ll_create,
	.destroy = ll_destroy,
	.config = ll_config,
	.dtype = ll_dtype,
	.tensors = ll_tensors,
	.param_count = ll_param_count,
	.params = ll_params,
	.grads = ll_grads,
	.set_grad_buffer = ll_set_grad_buffer,
	.set_param_buffer = ll_set_param_buffer,
	.own_grads = ll_own_grads,
	.set_tensor_view = ll_set_tensor_view,
	.set_unit_view = ll_set_unit_view,
	.tensor_param = ll_tensor_param,
	.tensor_grad = ll_tensor_grad,
	.init = ll_init,
	.layers = ll_layers,
	.act_ckpt = ll_act_ckpt,
	.sequence_parallel = ll_sequence_parallel,
	.recomputes = ll_recomputes,
	.model_act_bytes = ll_model_act_bytes,
	.forward = loom__ll_forward,
	.logits = loom__ll_last_logits,
	.zero_grad = loom__ll_zero_grad,
	.forward_backward = loom__ll_forward_backward,
	.on_grad_ready = ll_on_grad_ready,
	.on_param_use = ll_on_param_use,
	.on_tp_reduce = ll_on_tp_reduce,
	.set_inputs = NULL,
	.embed_forward = loom__ll_embed_forward,
	.block_forward = loom__ll_block_forward,
	.head_forward = loom__ll_head_forward,
	.head_forward_backward = loom__ll_head_forward_backward,
	.head_forward_backward_rows = loom__ll_head_forward_backward_rows,
	.block_backward = loom__ll_block_backward,
	.embed_backward = loom__ll_embed_backward,
	.block_input = loom__ll_block_input,
	.stream_grad = loom__ll_stream_grad,
	.tp_size = ll_tp_size,
	.tp_rank = ll_tp_rank,
	.on_cp_reduce = ll_on_cp_reduce,
	.cp_size = ll_cp_size,
	.cp_rank = ll_cp_rank,
	.kv_cache_alloc = ll_kv_cache_alloc,
	.generate = ll_generate,
	.profile = ll_profile,
	.profile_report = ll_profile_report,
	.unit_flops = loom__ll_unit_flops,
};

const loom_model_family_t *loom__llama_family(void)
{
	return &llama_family;
}
