/* llama.c: the Llama / Qwen2 family (transformers' LlamaForCausalLM, Qwen2ForCausalLM) as a model
 * family: its sizes, the activation layout, the rotary tables, initialization, and the family table;
 * creation, the views, the hooks and the unit calls are the shared base's (model/family.c), the passes
 * llama_passes.c, the kernels llama_kernels.c, the parameter table llama_layout.c, sampling
 * llama_generate.c.
 *
 * The contract is GPT-2's (loom/gpt2.h) and so are the invariants (family.c states them); kernels
 * reach tensors only through the views, read after the unit's param-use hook. The backward
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

typedef loom_llama_t ll_t;

/* The layout of every activation buffer in one allocation (base NULL: measure only), as nanochat's:
 * the recompute scratch, the arenas, the head scratch, the forward and backward scratch. */
static size_t layout(loom__fam_t *f, char *base, loom_model_act_bytes_t *bytes)
{
	ll_t *m = (ll_t *)f;
	const ll_dims_t *d = &m->d;
	size_t off = 0, C = (size_t)d->C, N = (size_t)m->f.B * m->f.T, T = (size_t)m->f.T, mark;
	size_t Q = (size_t)d->nh * d->D, KV = (size_t)d->nkv * d->D, I = (size_t)d->il;
	size_t lse = (size_t)m->f.B * d->nh * T, Ns = m->f.sp ? N / (size_t)m->f.tp : N;
	ll_layer_t shared = {0}, dummy;
	ll_arena_t dummy_arena;
	memset(bytes, 0, sizeof *bytes);
#define LAYER_BUFS(a, LSE, ATTY)                                                                                         \
	do {                                                                                                           \
		(a)->xn1 = loom__fam_carve(base, &off, Ns * C);                                                                      \
		(a)->rstd1 = loom__fam_carve(base, &off, Ns);                                                                        \
		(a)->q = loom__fam_carve(base, &off, N * Q);                                                                         \
		(a)->k = loom__fam_carve(base, &off, N * KV);                                                                        \
		(a)->v = loom__fam_carve(base, &off, N * KV);                                                                        \
		(a)->lse = (LSE);                                                                                          \
		(a)->atty = (ATTY);                                                                                        \
		(a)->x2 = loom__fam_carve(base, &off, Ns * C);                                                                       \
		(a)->xn2 = loom__fam_carve(base, &off, Ns * C);                                                                      \
		(a)->rstd2 = loom__fam_carve(base, &off, Ns);                                                                        \
		(a)->g = loom__fam_carve(base, &off, N * I);                                                                         \
		(a)->u = loom__fam_carve(base, &off, N * I);                                                                         \
		(a)->act = loom__fam_carve(base, &off, N * I);                                                                       \
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
		ll_arena_t *ar = base ? &m->arenas[k] : &dummy_arena;
		ar->in = loom__fam_carve(base, &off, N * C);
		for (int l = m->f.lo; l < m->f.hi; l++) {
			ll_layer_t *a = base ? &ar->layers[l - m->f.lo] : &dummy;
			size_t l0 = off;
			if (m->f.act_ckpt == LOOM_ACT_CKPT_BLOCKS) {
				*a = shared;
			} else {
				int sel = m->f.act_ckpt == LOOM_ACT_CKPT_SELECTIVE;
				LAYER_BUFS(a, sel ? shared.lse : loom__fam_carve(base, &off, lse), sel ? shared.atty : loom__fam_carve(base, &off, N * Q));
			}
			a->out = loom__fam_carve(base, &off, (l == m->f.hi - 1 ? N : Ns) * C); /* block hi-1's whole */
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
	m->f.ftmp = loom__fam_carve(base, &off, N * C);
	m->f.dres = loom__fam_carve(base, &off, N * C);
	m->dx2 = loom__fam_carve(base, &off, N * C);
	m->dxn = loom__fam_carve(base, &off, N * C);
	m->dq = loom__fam_carve(base, &off, N * Q);
	m->dk = loom__fam_carve(base, &off, N * KV);
	m->dv = loom__fam_carve(base, &off, N * KV);
	m->datty = loom__fam_carve(base, &off, N * Q);
	m->dact = loom__fam_carve(base, &off, N * I);
	m->dg = loom__fam_carve(base, &off, N * I);
	m->du = loom__fam_carve(base, &off, N * I);
	m->dnw = loom__fam_carve(base, &off, C);
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
	ll_t *m = (ll_t *)f;
	loom__ll_normalize(cfg, &f->cfg);
	loom__ll_dims(&f->cfg, f->tp, &m->d);
	m->eps = (float)f->cfg.rms_norm_eps;
	m->norm_i = loom__ll_norm_index(&m->d);
	m->head_i = loom__ll_head_index(&m->d);
	f->rot = m->d.D / 2;
}

static int alloc(loom__fam_t *f)
{
	ll_t *m = (ll_t *)f;
	if (!(m->arenas = loom__calloc((size_t)f->narenas, sizeof *m->arenas)))
		return LOOM_ENOMEM;
	for (int k = 0; k < f->narenas; k++)
		if (!(m->arenas[k].layers = loom__calloc((size_t)LOOM_MAX(f->hi - f->lo, 1), sizeof *m->arenas[k].layers)))
			return LOOM_ENOMEM;
	return LOOM_OK;
}

static void release(loom__fam_t *f)
{
	ll_t *m = (ll_t *)f;
	loom__fam_kv_free(m->kv);
	if (m->arenas)
		for (int k = 0; k < f->narenas; k++)
			free(m->arenas[k].layers);
	free(m->arenas);
}

/* cos and sin of position t times each inverse frequency (llama_layout.c), computed in double and
 * rounded once, for every position of a sequence (cp T of them). */
static void rotary_tables(loom__fam_t *f)
{
	ll_t *m = (ll_t *)f;
	int h2 = m->d.D / 2;
	double inv[LOOM_MAX(1, h2)];
	loom__ll_inv_freq(&m->f.cfg, inv);
	for (int t = 0; t < m->f.T * m->f.cp; t++)
		for (int i = 0; i < h2; i++) {
			double f = (double)t * inv[i];
			m->f.cos[(size_t)t * h2 + i] = (float)cos(f);
			m->f.sin[(size_t)t * h2 + i] = (float)sin(f);
		}
}

#define M(mm) ((ll_t *)(mm))

/* transformers' _init_weights for LlamaForCausalLM: every matrix (embed_tokens, the projections,
 * lm_head) N(0, initializer_range = 0.02), biases 0, norm weights 1. Tensor i draws from its own stream
 * (seed ^ 0x9e3779b97f4a7c15 (i + 1), as the other families), over the whole tensor in row-major order,
 * so a tensor-parallel shard gets exactly the whole model's values at its positions. */
static void ll_init(loom_model_t *mm, uint64_t seed)
{
	ll_t *m = M(mm);
	for (int i = 0; i < m->f.ntensors; i++) {
		loom_tensor_info_t f;
		const loom_tensor_info_t *sh = &m->f.tensors[i];
		float *p = m->f.pview[i];
		rng_t r;
		if (!p)
			continue;
		loom__ll_tensor_info(&m->f.cfg, i, &f);
		if (f.ndim == 1) {
			int norm = strstr(f.name, "norm") != NULL;
			for (size_t a = 0; a < sh->numel; a++)
				p[a] = norm ? 1.0f : 0.0f;
			continue;
		}
		size_t rows = f.shape[0], cols = f.shape[1], srows = sh->shape[0], scols = sh->shape[1];
		size_t r0 = f.tp_dim == 0 ? (size_t)m->f.tp_rank * srows : 0, c0 = f.tp_dim == 1 ? (size_t)m->f.tp_rank * scols : 0;
		rng_seed(&r, seed ^ (0x9e3779b97f4a7c15ULL * (uint64_t)(i + 1)));
		for (size_t a = 0; a < rows; a++)
			for (size_t b = 0; b < cols; b++) {
				float v = (float)(0.02 * rng_normal(&r));
				if (a >= r0 && a < r0 + srows && b >= c0 && b < c0 + scols)
					p[(a - r0) * scols + (b - c0)] = v;
			}
	}
}

static const loom__fam_kind_t llama_kind;

static int ll_create(loom_model_t **out, const loom_model_config_t *cfg, const loom_model_opts_t *o)
{
	return loom__fam_create(&llama_kind, out, cfg, o);
}

static int ll_act_bytes(const loom_model_config_t *cfg, const loom_model_opts_t *o, loom_model_act_bytes_t *out)
{
	return loom__fam_act_bytes(&llama_kind, cfg, o, out);
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
	.tp_shard = loom__fam_tp_shard,
	.tp_unshard = loom__fam_tp_unshard,
	.tp_copy_tensor = loom__fam_tp_copy_tensor,
	.act_bytes = ll_act_bytes,
	.create = ll_create,
	.init = ll_init,
	.set_inputs = NULL,
	.kv_cache_alloc = loom__ll_kv_cache_alloc,
	.generate = loom__fam_generate,
	.profile = loom__fam_profile,
	.profile_report = loom__fam_profile_report,
	.unit_flops = loom__ll_unit_flops,
	LOOM__FAM_TABLE_OPS,
};

static const loom__fam_kind_t llama_kind = {
	.table = &llama_family,
	.len_name = "max_position_embeddings",
	.layers_name = "num_hidden_layers",
	.size = sizeof(ll_t),
	.setup = setup,
	.layout = layout,
	.alloc = alloc,
	.release = release,
	.rotary = rotary_tables,
	.embed_forward = loom__ll_embed_forward,
	.block_forward = loom__ll_block_forward,
	.head_forward = loom__ll_head_forward,
	.head_forward_backward = loom__ll_head_forward_backward,
	.block_backward = loom__ll_block_backward,
	.embed_backward = loom__ll_embed_backward,
	.stream = loom__ll_stream,
	.kv_cache_alloc = loom__ll_kv_cache_alloc,
	.step = loom__ll_step,
};

const loom_model_family_t *loom__llama_family(void)
{
	return &llama_family;
}
