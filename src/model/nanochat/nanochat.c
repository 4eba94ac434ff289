/* nanochat.c: nanochat's GPT (karpathy/nanochat bac5a35, nanochat/gpt.py) as a model family: creation
 * sizes, the activation layout, the rotary tables, initialization, and the family table; creation, the
 * views, the hooks and the unit calls are the shared base's (model/family.c), the passes
 * nanochat_passes.c, the kernels nanochat_kernels.c, the parameter table nanochat_layout.c, sampling
 * nanochat_generate.c.
 *
 * The contract is GPT-2's (loom/gpt2.h) and so are the invariants (family.c states them); kernels
 * reach tensors only through the views, read after the unit's param-use hook. The backward
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

typedef loom_nanochat_t nc_t;

/* The layout of every activation buffer in one allocation (base NULL: measure only), as gpt2.c's:
 * the recompute scratch, the arenas, the head scratch, the forward and backward scratch. */
static size_t layout(loom__fam_t *f, char *base, loom_model_act_bytes_t *bytes)
{
	nc_t *m = (nc_t *)f;
	const nc_dims_t *d = &m->d;
	size_t off = 0, C = (size_t)d->C, N = (size_t)m->f.B * m->f.T, T = (size_t)m->f.T, mark;
	size_t Q = (size_t)d->nh * d->D, KV = (size_t)d->nkv * d->D, Hd = (size_t)d->hid;
	size_t lse = (size_t)m->f.B * d->nh * T, Ns = m->f.sp ? N / (size_t)m->f.tp : N;
	nc_layer_t shared = {0}, dummy;
	nc_arena_t dummy_arena;
	memset(bytes, 0, sizeof *bytes);
#define LAYER_BUFS(a, LSE, ATTY)                                                                                         \
	do {                                                                                                           \
		(a)->xin = loom__fam_carve(base, &off, Ns * C);                                                                      \
		(a)->xn1 = loom__fam_carve(base, &off, Ns * C);                                                                      \
		(a)->rstd1 = loom__fam_carve(base, &off, Ns);                                                                        \
		(a)->q = loom__fam_carve(base, &off, N * Q);                                                                         \
		(a)->qrstd = loom__fam_carve(base, &off, N * d->nh);                                                                 \
		(a)->k = loom__fam_carve(base, &off, N * KV);                                                                        \
		(a)->krstd = loom__fam_carve(base, &off, N * d->nkv);                                                                \
		(a)->v = loom__fam_carve(base, &off, N * KV);                                                                        \
		(a)->gate = loom__fam_carve(base, &off, N * d->nkv);                                                                 \
		(a)->lse = (LSE);                                                                                          \
		(a)->atty = (ATTY);                                                                                        \
		(a)->x2 = loom__fam_carve(base, &off, Ns * C);                                                                       \
		(a)->xn2 = loom__fam_carve(base, &off, Ns * C);                                                                      \
		(a)->rstd2 = loom__fam_carve(base, &off, Ns);                                                                        \
		(a)->fch = loom__fam_carve(base, &off, N * Hd);                                                                      \
		(a)->act = loom__fam_carve(base, &off, N * Hd);                                                                      \
	} while (0)
	/* selective: the attention's output and lse are recomputed before the block's backward */
	if (m->f.act_ckpt != LOOM_ACT_CKPT_NONE) {
		shared.lse = loom__fam_carve(base, &off, lse);
		shared.atty = loom__fam_carve(base, &off, N * Q);
	}
	if (m->f.act_ckpt == LOOM_ACT_CKPT_BLOCKS)
		LAYER_BUFS(&shared, shared.lse, shared.atty);
	bytes->recompute = mark = off;
	for (int k = 0; k < m->f.narenas; k++) {
		nc_arena_t *ar = base ? &m->arenas[k] : &dummy_arena;
		ar->in = loom__fam_carve(base, &off, N * 2 * C);
		ar->tok = (int *)loom__fam_carve(base, &off, N); /* ints: the same size as floats */
		ar->rstd0 = loom__fam_carve(base, &off, N);
		for (int l = m->f.lo; l < m->f.hi; l++) {
			nc_layer_t *a = base ? &ar->layers[l - m->f.lo] : &dummy;
			size_t l0 = off;
			if (m->f.act_ckpt == LOOM_ACT_CKPT_BLOCKS) {
				*a = shared;
			} else {
				int sel = m->f.act_ckpt == LOOM_ACT_CKPT_SELECTIVE;
				LAYER_BUFS(a, sel ? shared.lse : loom__fam_carve(base, &off, lse), sel ? shared.atty : loom__fam_carve(base, &off, N * Q));
			}
			a->out = loom__fam_carve(base, &off, (l == m->f.hi - 1 ? N : Ns) * 2 * C); /* block hi-1's whole */
			if (l == m->f.lo)
				bytes->per_layer = off - l0;
		}
		if (m->f.has_head) {
			ar->xf = loom__fam_carve(base, &off, N * C);
			ar->rstdf = loom__fam_carve(base, &off, N);
			ar->losses = loom__fam_carve(base, &off, N);
		}
	}
#undef LAYER_BUFS
	bytes->kept = off - mark, mark = off;
	if (m->f.has_head) {
		m->f.logits = loom__fam_carve(base, &off, (size_t)m->f.chunk * (m->f.tp > 1 ? d->vl : d->V));
		m->f.last_logits = loom__fam_carve(base, &off, (size_t)m->f.B * d->V);
		if (m->f.tp > 1)
			m->f.tp_stats = loom__fam_carve(base, &off, 3 * (size_t)m->f.chunk);
	}
	bytes->head = off - mark, mark = off;
	/* shared scratch, counted with the backward's: a block forward's row-parallel product before its
	 * sum, the embedding's lookup */
	m->f.ftmp = loom__fam_carve(base, &off, N * C);
	m->f.dres = loom__fam_carve(base, &off, N * 2 * C);
	m->dx2 = loom__fam_carve(base, &off, N * C);
	m->dxin = loom__fam_carve(base, &off, N * C);
	m->dxn = loom__fam_carve(base, &off, N * C);
	m->dq = loom__fam_carve(base, &off, N * Q);
	m->dk = loom__fam_carve(base, &off, N * KV);
	m->dv = loom__fam_carve(base, &off, N * KV);
	m->dkh = loom__fam_carve(base, &off, N * Q);
	m->datty = loom__fam_carve(base, &off, N * Q);
	m->dh1 = loom__fam_carve(base, &off, N * Hd);
	m->dh2 = loom__fam_carve(base, &off, N * Hd);
	m->dgate = loom__fam_carve(base, &off, N * d->nkv);
	m->dscal = loom__fam_carve(base, &off, 2 * N);
	/* context parallel: the kernel's backward partials cover the whole sequence's keys, the gathered keys
	 * and values of one layer live in cp_mem */
	m->f.att_scratch = loom__fam_carve(base, &off, loom__flash_scratch_floats(m->f.B, m->f.T * m->f.cp, d->nkv, d->D, m->f.att_threads));
	if (m->f.cp > 1)
		m->f.cp_mem = loom__fam_carve(base, &off, loom__cp_scratch_floats(m->f.B, m->f.T, m->f.cp, d->nh, d->nkv, d->D));
	bytes->backward = off - mark;
	bytes->total = off;
	return off;
}

/* The family's sizes (family.c's setup has set the shared ones from the options). */
static void setup(loom__fam_t *f, const loom_model_config_t *cfg)
{
	nc_t *m = (nc_t *)f;
	loom__nc_normalize(cfg, &f->cfg);
	loom__nc_dims(&f->cfg, f->tp, &m->d);
	f->rot = m->d.D / 2;
}

static int alloc(loom__fam_t *f)
{
	nc_t *m = (nc_t *)f;
	if (!(m->window = loom__calloc((size_t)m->d.L, sizeof *m->window)) ||
	    !(m->arenas = loom__calloc((size_t)f->narenas, sizeof *m->arenas)))
		return LOOM_ENOMEM;
	for (int l = 0; l < m->d.L; l++)
		m->window[l] = loom__nc_window(&f->cfg, l);
	for (int k = 0; k < f->narenas; k++)
		if (!(m->arenas[k].layers = loom__calloc((size_t)LOOM_MAX(f->hi - f->lo, 1), sizeof *m->arenas[k].layers)))
			return LOOM_ENOMEM;
	return LOOM_OK;
}

static void release(loom__fam_t *f)
{
	nc_t *m = (nc_t *)f;
	loom__fam_kv_free(m->kv);
	if (m->arenas)
		for (int k = 0; k < f->narenas; k++)
			free(m->arenas[k].layers);
	free(m->arenas);
	free(m->window);
}

/* The rotary tables as gpt.py computes them in fp32 (inv_freq = 1 / 10000^(2i/D), angle t inv_freq),
 * then rounded to bfloat16 as it keeps them; for every position of a sequence (cp T of them). */
static void rotary_tables(loom__fam_t *f)
{
	nc_t *m = (nc_t *)f;
	int D = m->d.D, h2 = D / 2;
	for (int t = 0; t < m->f.T * m->f.cp; t++)
		for (int i = 0; i < h2; i++) {
			float e = (float)(2 * i) / (float)D;
			float inv = 1.0f / powf(10000.0f, e);
			float f = (float)t * inv;
			m->f.cos[(size_t)t * h2 + i] = loom__bf16_round(cosf(f));
			m->f.sin[(size_t)t * h2 + i] = loom__bf16_round(sinf(f));
		}
}

#define M(mm) ((nc_t *)(mm))

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
	for (int i = 0; i < m->f.ntensors; i++) {
		loom_tensor_info_t f;
		const loom_tensor_info_t *sh = &m->f.tensors[i];
		float *p = m->f.pview[i];
		rng_t r;
		if (!p)
			continue;
		loom__nc_tensor_info(&m->f.cfg, i, &f);
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
		else if (i == m->f.ntensors - 1)
			kind = 1, std = 0.001;
		else if (strstr(nm, "c_proj") || strstr(nm, "ve_gate"))
			kind = 0;
		else
			kind = 2;
		if (kind == 0)
			continue;
		int vocab_rows = i == NC_WTE || i == m->f.ntensors - 1 || strncmp(nm, "value_embeds", 12) == 0;
		size_t rows = f.ndim == 2 ? f.shape[0] : 1, cols = f.ndim == 2 ? f.shape[1] : f.shape[0];
		if (vocab_rows)
			rows = (size_t)d->V;
		size_t srows = sh->ndim == 2 ? sh->shape[0] : 1, scols = sh->ndim == 2 ? sh->shape[1] : sh->shape[0];
		size_t r0 = f.tp_dim == 0 ? (size_t)m->f.tp_rank * srows : 0, c0 = f.tp_dim == 1 ? (size_t)m->f.tp_rank * scols : 0;
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

static int nc_kv_width(const loom_model_config_t *cfg)
{
	loom_model_config_t c;
	loom__nc_normalize(cfg, &c);
	return c.n_kv_head * (c.n_embd / c.n_head);
}

static const loom__fam_kind_t nanochat_kind;

static int nc_create(loom_model_t **out, const loom_model_config_t *cfg, const loom_model_opts_t *o)
{
	return loom__fam_create(&nanochat_kind, out, cfg, o);
}

static int nc_act_bytes(const loom_model_config_t *cfg, const loom_model_opts_t *o, loom_model_act_bytes_t *out)
{
	return loom__fam_act_bytes(&nanochat_kind, cfg, o, out);
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
	.tp_shard = loom__fam_tp_shard,
	.tp_unshard = loom__fam_tp_unshard,
	.tp_copy_tensor = loom__fam_tp_copy_tensor,
	.act_bytes = nc_act_bytes,
	.create = nc_create,
	.init = nc_init,
	.set_inputs = loom__nc_set_inputs,
	.kv_cache_alloc = loom__nc_kv_cache_alloc,
	.generate = loom__fam_generate,
	.profile = loom__fam_profile,
	.profile_report = loom__fam_profile_report,
	LOOM__FAM_TABLE_OPS,
};

static const loom__fam_kind_t nanochat_kind = {
	.table = &nanochat_family,
	.len_name = "sequence_len",
	.layers_name = "n_layer",
	.size = sizeof(nc_t),
	.setup = setup,
	.layout = layout,
	.alloc = alloc,
	.release = release,
	.rotary = rotary_tables,
	.embed_forward = loom__nc_embed_forward,
	.block_forward = loom__nc_block_forward,
	.head_forward = loom__nc_head_forward,
	.head_forward_backward = loom__nc_head_forward_backward,
	.block_backward = loom__nc_block_backward,
	.embed_backward = loom__nc_embed_backward,
	.stream = loom__nc_stream,
	.kv_cache_alloc = loom__nc_kv_cache_alloc,
	.step = loom__nc_step,
	.block_check = loom__nc_block_check,
};

const loom_model_family_t *loom__nanochat_family(void)
{
	return &nanochat_family;
}
