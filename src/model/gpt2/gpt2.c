/* gpt2.c: the GPT-2 model: its sizes and activation layout, initialization, and the passes of each
 * unit (embedding, block, head) forward and backward; creation, the views, the hooks, the checks of
 * each call and the whole-model passes are the shared base's (model/family.c), which the loom_gpt2_*
 * calls of loom/gpt2.h reach.
 *
 * Invariants: every buffer (parameters, gradients, activations of every arena, backward scratch) is
 * allocated and touched once in loom_gpt2_create, so a training step allocates nothing and takes no
 * page faults. Activations are laid out for the capacity B x T given at create; a call with smaller
 * b x t packs its b*t rows at the start of each buffer. Each arena holds one micro-batch's
 * activations; the backward scratch is shared, so one micro-batch's backward runs at a time. The
 * backward walks the network in exact reverse, and reports tensor i to the grad-ready callback as
 * soon as nothing later in this backward adds to it: over a whole model, tensor indices arrive
 * strictly decreasing, each once, with wte (whose gradient also gets the embedding's share) last.
 * The kernels reach parameters and gradients only through the views (model.h), read when the
 * kernel is called, i.e. after the unit's param-use hook has run. A tensor-parallel shard (tp > 1,
 * tp_model.c) runs the same passes on its local sizes, with the reductions at the f and g points;
 * with tp 1 no reduction exists and the passes are the whole model's, unchanged. With sequence
 * parallelism (sp) the LayerNorms and residual adds of a block run on the rank's rows [r N/tp,
 * (r+1) N/tp) only, the f/g points becoming an all-gather before and a reduce-scatter after the split
 * matmuls; the stream is whole at the unit boundaries (block lo's input, block hi-1's output, the head,
 * dres after block lo), so the embedding, the head and a pipeline's transfers are those of tp. With activation
 * checkpointing (act_ckpt) an arena keeps only part of each layer's activations and the rest lives in
 * one shared recompute scratch (layout_acts), which block_backward refills with the forward's own
 * kernels before reading it: losses and gradients are bit-identical to keeping everything. With context
 * parallelism (cp > 1) the T rows of a sequence are this rank's chunks of a sequence of cp T positions
 * (the layout of kernels.h's loom__cp_chunk; head-tail for GPT-2, whose attention is causal only): the
 * embedding adds their positions' wpe rows, the attention runs over the group
 * (cp_attention.c, through the cp hook), and everything else is position-wise and unchanged. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "model/kernels.h"
#include "model/gpt2/model.h"
#include "model/rng.h"

#define G2(f) ((loom_gpt2_t *)(f))

/* Tensor index of layer l's j-th tensor (j in the order of gpt2.h). */
static int lt(int l, int j)
{
	return 2 + LOOM_GPT2_LAYER_TENSORS * l + j;
}

enum { LN1_W, LN1_B, QKV_W, QKV_B, ATTPROJ_W, ATTPROJ_B, LN2_W, LN2_B, FC_W, FC_B, FCPROJ_W, FCPROJ_B };

/* The layout of every activation buffer, in one allocation: the recompute scratch (activation
 * checkpointing), then arena after arena (each: block lo's input, the held blocks' kept
 * activations, the head's), then the shared head scratch and backward scratch. With base NULL it
 * only measures (writing no pointer into the arenas). Byte counts by role go to *bytes.
 *
 * What a layer keeps is the checkpointing mode's: none keeps all of layer_acts_t; blocks keeps res3
 * only (the next block's input) and points every other field at one block's scratch, shared by all
 * layers and arenas, which each forward overwrites and each block_backward refills; selective keeps
 * all but atty and lse (the attention's output and log-sum-exp), which point at one layer's in the
 * scratch and are recomputed by the attention forward before the block's backward. So the kernels and the
 * passes read and write through the same pointers in every mode. */
static size_t layout_acts(loom__fam_t *f, char *base, loom_gpt2_act_bytes_t *bytes)
{
	loom_gpt2_t *m = (loom_gpt2_t *)f;
	/* with tensor parallelism the per-head and per-MLP-column buffers are the local shards'; with
	 * sequence parallelism the stream-sized ones between the tensor-parallel regions hold Ns = N/tp rows */
	size_t off = 0, C = (size_t)m->f.cfg.n_embd, V = (size_t)m->Vl, N = (size_t)m->f.B * m->f.T;
	size_t NH = (size_t)m->NHl, T = (size_t)m->f.T, Cl = (size_t)m->Cl, mark;
	size_t Ns = m->f.sp ? N / (size_t)m->f.tp : N;
	size_t lse = loom__fam_size_mul(loom__fam_size_mul((size_t)m->f.B, NH), T);
	size_t NC = loom__fam_size_mul(N, C), NCl = loom__fam_size_mul(N, Cl), N3 = loom__fam_size_mul(N, 3 * Cl), N4 = loom__fam_size_mul(N, 4 * Cl);
	size_t NsC = loom__fam_size_mul(Ns, C);
	layer_acts_t shared = {0}, dummy_layer;
	arena_t dummy_arena;
	memset(bytes, 0, sizeof *bytes);
	if (m->f.act_ckpt == LOOM_ACT_CKPT_BLOCKS) {
		shared.ln1 = loom__fam_carve(base, &off, NsC);
		shared.ln1_mean = loom__fam_carve(base, &off, Ns);
		shared.ln1_rstd = loom__fam_carve(base, &off, Ns);
		shared.qkv = loom__fam_carve(base, &off, N3);
		shared.lse = loom__fam_carve(base, &off, lse);
		shared.atty = loom__fam_carve(base, &off, NCl);
		shared.res2 = loom__fam_carve(base, &off, NsC);
		shared.ln2 = loom__fam_carve(base, &off, NsC);
		shared.ln2_mean = loom__fam_carve(base, &off, Ns);
		shared.ln2_rstd = loom__fam_carve(base, &off, Ns);
		shared.fch = loom__fam_carve(base, &off, N4);
		shared.fch_gelu = loom__fam_carve(base, &off, N4);
	} else if (m->f.act_ckpt == LOOM_ACT_CKPT_SELECTIVE) {
		shared.lse = loom__fam_carve(base, &off, lse);
		shared.atty = loom__fam_carve(base, &off, NCl);
	}
	bytes->recompute = mark = off;
	for (int k = 0; k < m->f.narenas; k++) {
		arena_t *ar = base ? &m->arenas[k] : &dummy_arena;
		ar->in = loom__fam_carve(base, &off, NC);
		for (int l = m->f.lo; l < m->f.hi; l++) {
			layer_acts_t *a = base ? &ar->layers[l - m->f.lo] : &dummy_layer;
			size_t l0 = off, out = l == m->f.hi - 1 ? NC : NsC; /* the last block's output stays whole */
			if (m->f.act_ckpt == LOOM_ACT_CKPT_BLOCKS) {
				*a = shared;
				a->res3 = loom__fam_carve(base, &off, out);
				if (l == m->f.lo)
					bytes->per_layer = off - l0;
				continue;
			}
			a->ln1 = loom__fam_carve(base, &off, NsC);
			a->ln1_mean = loom__fam_carve(base, &off, Ns);
			a->ln1_rstd = loom__fam_carve(base, &off, Ns);
			a->qkv = loom__fam_carve(base, &off, N3);
			int sel = m->f.act_ckpt == LOOM_ACT_CKPT_SELECTIVE;
			a->lse = sel ? shared.lse : loom__fam_carve(base, &off, lse);
			a->atty = sel ? shared.atty : loom__fam_carve(base, &off, NCl);
			a->res2 = loom__fam_carve(base, &off, NsC);
			a->ln2 = loom__fam_carve(base, &off, NsC);
			a->ln2_mean = loom__fam_carve(base, &off, Ns);
			a->ln2_rstd = loom__fam_carve(base, &off, Ns);
			a->fch = loom__fam_carve(base, &off, N4);
			a->fch_gelu = loom__fam_carve(base, &off, N4);
			a->res3 = loom__fam_carve(base, &off, out);
			if (l == m->f.lo)
				bytes->per_layer = off - l0;
		}
		if (m->f.has_head) {
			ar->lnf = loom__fam_carve(base, &off, NC);
			ar->lnf_mean = loom__fam_carve(base, &off, N);
			ar->lnf_rstd = loom__fam_carve(base, &off, N);
			ar->losses = loom__fam_carve(base, &off, N);
		}
	}
	bytes->kept = off - mark, mark = off;
	if (m->f.has_head) {
		m->f.logits = loom__fam_carve(base, &off, loom__fam_size_mul((size_t)m->f.chunk, V));
		m->f.last_logits = loom__fam_carve(base, &off, loom__fam_size_mul((size_t)m->f.B, V));
		if (m->f.tp > 1)
			m->f.tp_stats = loom__fam_carve(base, &off, 3 * (size_t)m->f.chunk);
	}
	bytes->head = off - mark, mark = off;
	m->f.dres = loom__fam_carve(base, &off, NC);
	m->dbtc = loom__fam_carve(base, &off, NC);
	m->dqkv = loom__fam_carve(base, &off, N3);
	m->d4a = loom__fam_carve(base, &off, N4);
	m->d4b = loom__fam_carve(base, &off, N4);
	/* context parallel: the kernel's backward partials cover the whole sequence's keys, and the gathered
	 * keys and values of one layer live in cp_mem (cp_attention.c) */
	m->f.att_scratch = loom__fam_carve(base, &off, loom__attention_scratch_floats(m->f.B, m->f.T * m->f.cp, Cl, m->f.att_threads));
	if (m->f.cp > 1)
		m->f.cp_mem = loom__fam_carve(base, &off, loom__cp_scratch_floats(m->f.B, m->f.T, m->f.cp, m->NHl, m->NHl, (int)Cl / m->NHl));
	if (m->f.sp) { /* the gathers borrow d4a, free whenever a gather is live, when it is large enough */
		m->sp_gather = 4 * Cl >= C ? m->d4a : loom__fam_carve(base, &off, NC);
		m->sp_lng = loom__fam_carve(base, &off, 2 * C);
	}
	bytes->backward = off - mark;
	bytes->total = off;
	return off;
}

int loom_act_ckpt_parse(const char *name, loom_act_ckpt_t *mode)
{
	static const char *const names[] = {"none", "blocks", "selective"};
	for (int i = 0; i < (int)LOOM_ARRAY_LEN(names); i++)
		if (name && strcmp(name, names[i]) == 0) {
			*mode = (loom_act_ckpt_t)i;
			return LOOM_OK;
		}
	return loom_seterr(LOOM_EINVAL, "activation checkpointing '%s' is not one of none, blocks, selective",
	                   name ? name : "(null)");
}

const char *loom_act_ckpt_name(loom_act_ckpt_t mode)
{
	return mode == LOOM_ACT_CKPT_NONE ? "none" : mode == LOOM_ACT_CKPT_BLOCKS ? "blocks"
	       : mode == LOOM_ACT_CKPT_SELECTIVE ? "selective" : "?";
}

/* The sizes create derives from the checked options beyond the shared ones (family.c): this rank's
 * shard of the heads, the MLP and the vocabulary. */
static void setup(loom__fam_t *f, const loom_gpt2_config_t *cfg)
{
	loom_gpt2_t *m = (loom_gpt2_t *)f;
	int tp = f->tp;
	m->Cl = cfg->n_embd / tp, m->NHl = cfg->n_head / tp;
	m->Vl = (cfg->vocab_size + tp - 1) / tp, m->v0 = f->tp_rank * m->Vl;
	m->Vv = LOOM_MAX(0, LOOM_MIN(m->Vl, cfg->vocab_size - m->v0));
}

static int alloc(loom__fam_t *f)
{
	loom_gpt2_t *m = (loom_gpt2_t *)f;
	if (!(m->arenas = loom__calloc((size_t)f->narenas, sizeof *m->arenas)))
		return LOOM_ENOMEM;
	for (int k = 0; k < f->narenas; k++)
		if (!(m->arenas[k].layers = loom__calloc((size_t)LOOM_MAX(f->hi - f->lo, 1), sizeof *m->arenas[k].layers)))
			return LOOM_ENOMEM;
	return LOOM_OK;
}

static void release(loom__fam_t *f)
{
	loom_gpt2_t *m = (loom_gpt2_t *)f;
	loom__gpt2_kv_cache_free(m);
	if (m->arenas)
		for (int k = 0; k < f->narenas; k++)
			free(m->arenas[k].layers);
	free(m->arenas);
}

/* ---- the loom_gpt2_* calls of the shared state: the base's (family.c) -------------------------------- */

#define FAM(m) (&(m)->f.base)

int loom_gpt2_act_bytes(const loom_gpt2_config_t *cfg, const loom_gpt2_opts_t *o, loom_gpt2_act_bytes_t *out)
{
	return loom__fam_act_bytes(&loom__gpt2_kind, cfg, o, out);
}

int loom_gpt2_create_opts(loom_gpt2_t **out, const loom_gpt2_config_t *cfg, const loom_gpt2_opts_t *o)
{
	loom_model_t *m = NULL;
	int rc = loom__fam_create(&loom__gpt2_kind, &m, cfg, o);
	*out = (loom_gpt2_t *)m;
	return rc;
}

int loom_gpt2_create(loom_gpt2_t **out, const loom_gpt2_config_t *cfg, int B, int T)
{
	loom_gpt2_opts_t o = {.B = B, .T = T};
	return loom_gpt2_create_opts(out, cfg, &o);
}

void loom_gpt2_destroy(loom_gpt2_t *m)
{
	loom__fam_destroy(m ? FAM(m) : NULL);
}

void loom_gpt2_model_act_bytes(const loom_gpt2_t *m, loom_gpt2_act_bytes_t *out)
{
	loom__fam_model_act_bytes(FAM(m), out);
}

loom_act_ckpt_t loom_gpt2_act_ckpt(const loom_gpt2_t *m)
{
	return loom__fam_act_ckpt(FAM(m));
}

int loom_gpt2_sequence_parallel(const loom_gpt2_t *m)
{
	return loom__fam_sequence_parallel(FAM(m));
}

long long loom_gpt2_recomputes(const loom_gpt2_t *m)
{
	return loom__fam_recomputes(FAM(m));
}

void loom_gpt2_layers(const loom_gpt2_t *m, int *lo, int *hi, int *arenas)
{
	loom__fam_layers(FAM(m), lo, hi, arenas);
}

const loom_gpt2_config_t *loom_gpt2_config(const loom_gpt2_t *m)
{
	return loom__fam_config(FAM(m));
}

loom_compute_dtype_t loom_gpt2_dtype(const loom_gpt2_t *m)
{
	return loom__fam_dtype(FAM(m));
}

const loom_tensor_info_t *loom_gpt2_tensors(const loom_gpt2_t *m, int *n)
{
	return loom__fam_tensors(FAM(m), n);
}

float *loom_gpt2_params(loom_gpt2_t *m)
{
	return loom__fam_params(FAM(m));
}

float *loom_gpt2_grads(loom_gpt2_t *m)
{
	return loom__fam_grads(FAM(m));
}

int loom_gpt2_set_grad_buffer(loom_gpt2_t *m, float *grads)
{
	return loom__fam_set_grad_buffer(FAM(m), grads);
}

int loom_gpt2_own_grads(loom_gpt2_t *m)
{
	return loom__fam_own_grads(FAM(m));
}

int loom_gpt2_set_param_buffer(loom_gpt2_t *m, float *params)
{
	return loom__fam_set_param_buffer(FAM(m), params);
}

int loom_gpt2_set_tensor_view(loom_gpt2_t *m, int tensor, float *param, float *grad)
{
	return loom__fam_set_tensor_view(FAM(m), tensor, param, grad);
}

int loom_gpt2_set_unit_view(loom_gpt2_t *m, int unit, float *params, float *grads)
{
	return loom__fam_set_unit_view(FAM(m), unit, params, grads);
}

float *loom_gpt2_tensor_param(loom_gpt2_t *m, int tensor)
{
	return loom__fam_tensor_param(FAM(m), tensor);
}

float *loom_gpt2_tensor_grad(loom_gpt2_t *m, int tensor)
{
	return loom__fam_tensor_grad(FAM(m), tensor);
}

void loom_gpt2_on_grad_ready(loom_gpt2_t *m, loom_grad_ready_fn fn, void *ctx)
{
	loom__fam_on_grad_ready(FAM(m), fn, ctx);
}

void loom_gpt2_on_param_use(loom_gpt2_t *m, loom_param_use_fn fn, void *ctx)
{
	loom__fam_on_param_use(FAM(m), fn, ctx);
}

void loom_gpt2_on_tp_reduce(loom_gpt2_t *m, loom_tp_reduce_fn fn, void *ctx)
{
	loom__fam_on_tp_reduce(FAM(m), fn, ctx);
}

void loom_gpt2_on_cp_reduce(loom_gpt2_t *m, loom_tp_reduce_fn fn, void *ctx)
{
	loom__fam_on_cp_reduce(FAM(m), fn, ctx);
}

int loom_gpt2_cp_size(const loom_gpt2_t *m)
{
	return loom__fam_cp_size(FAM(m));
}

int loom_gpt2_cp_rank(const loom_gpt2_t *m)
{
	return loom__fam_cp_rank(FAM(m));
}

int loom_gpt2_tp_size(const loom_gpt2_t *m)
{
	return loom__fam_tp_size(FAM(m));
}

int loom_gpt2_tp_rank(const loom_gpt2_t *m)
{
	return loom__fam_tp_rank(FAM(m));
}

size_t loom_gpt2_param_count(const loom_gpt2_t *m)
{
	return loom__fam_param_count(FAM(m));
}

void loom_gpt2_init(loom_gpt2_t *m, uint64_t seed)
{
	/* Each tensor draws from its own stream, seeded from (seed, tensor index): a tensor's values do
	 * not depend on the sizes of the tensors before it. */
	int n = loom_gpt2_num_tensors(&m->f.cfg);
	double proj_std = 0.02 / sqrt(2.0 * m->f.cfg.n_layer);
	for (int i = 0; i < n; i++) {
		loom_tensor_info_t ti;
		rng_t r;
		loom__tp_geom_t g;
		loom_gpt2_tensor_info(&m->f.cfg, i, &ti);
		float *p = loom__gpt2_param(m, i);
		if (!p)
			continue; /* no memory behind this tensor (a view not set yet) */
		if (loom__tp_geom(&ti, m->f.tp, &g)) { /* a shard: the whole tensor's draws, keeping ours */
			double std = strstr(ti.name, "c_proj.weight") ? proj_std : 0.02;
			memset(p, 0, m->f.tensors[i].numel * sizeof(float));
			if (ti.ndim == 1)
				continue; /* split biases start at 0 */
			rng_seed(&r, seed ^ (0x9e3779b97f4a7c15ULL * (uint64_t)(i + 1)));
			for (size_t k = 0; k < ti.numel; k++) {
				float v = (float)(std * rng_normal(&r));
				long j = loom__tp_local_index(&g, m->f.tp_rank, k);
				if (j >= 0)
					p[j] = v;
			}
			continue;
		}
		size_t len = strlen(ti.name);
		if (ti.ndim == 2) {
			int is_proj = strstr(ti.name, "c_proj.weight") != NULL;
			double std = is_proj ? proj_std : 0.02;
			rng_seed(&r, seed ^ (0x9e3779b97f4a7c15ULL * (uint64_t)(i + 1)));
			for (size_t k = 0; k < ti.numel; k++)
				p[k] = (float)(std * rng_normal(&r));
		} else {
			float v = len > 7 && strcmp(ti.name + len - 7, ".weight") == 0 ? 1.0f : 0.0f; /* LayerNorm weight */
			for (size_t k = 0; k < ti.numel; k++)
				p[k] = v;
		}
	}
}

/* ---- the units' passes --------------------------------------------------------------------------
 *
 * Static versions without checks; the public calls check and call these, and the whole-model calls
 * compose them in arena 0, so there is one implementation of each pass. */

#define PROF(k, stmt) PROFF(k, 0.0, stmt)
/* ... also counting `flops` floating-point operations for the report's GFLOP/s column */
#define PROFF(k, flops, stmt)                                                                                      \
	do {                                                                                                           \
		double t0_ = m->prof_on ? loom_now() : 0.0;                                                                \
		stmt;                                                                                                      \
		if (m->prof_on)                                                                                            \
			loom__gpt2_prof_add(m, PROF_##k, t0_, (flops));                                                        \
	} while (0)

void loom__gpt2_param_use(loom_gpt2_t *m, int unit, int phase)
{
	if (m->f.on_use)
		PROF(CALLBACK, m->f.on_use(m->f.on_use_ctx, unit, phase));
}

static void ready(loom_gpt2_t *m, int i)
{
	if (m->f.on_ready)
		PROF(CALLBACK, m->f.on_ready(m->f.on_ready_ctx, i));
}

static void zero(loom_gpt2_t *m, float *p, size_t n)
{
	PROF(ZERO, loom__fam_zero(p, n));
}

/* The residual stream in front of block l, l in [lo, hi] (hi: the head's input). */
static float *stream(const loom_gpt2_t *m, const arena_t *ar, int l)
{
	return l == m->f.lo ? ar->in : ar->layers[l - 1 - m->f.lo].res3;
}

/* Block l's input and output on the rows this rank computes. With sequence parallelism block lo's
 * input and block hi-1's output are whole-sized buffers, the others hold this rank's rows only; block
 * lo's input is whole after the embedding, but a later pipeline stage receives only this rank's rows
 * of it, and block hi-1's output is gathered whole only for a head on the same stage (a next stage
 * takes this rank's rows: the pipeline passes each tp rank's rows to the same tp rank). */
static float *block_in(const loom_gpt2_t *m, const arena_t *ar, int l, int N)
{
	return l == m->f.lo ? ar->in + loom__fam_sp_row0(&m->f, N) * m->f.cfg.n_embd : stream(m, ar, l);
}

static void embed_forward(loom__fam_t *f, int mb, const int *inputs, int B, int T)
{
	loom_gpt2_t *m = G2(f);
	arena_t *ar = &m->arenas[mb];
	loom__gpt2_param_use(m, -1, 0);
	if (m->f.tp > 1) {
		loom__tp_embed_forward(m, ar->in, inputs, B, T);
		return;
	}
	if (m->f.cp > 1) { /* each of the rows' chunks of every sequence with the wpe rows of its positions */
		int C = m->f.cfg.n_embd, K = loom__fam_cp_chunks(&m->f, T), c = T / K;
		for (int b = 0; b < B; b++)
			for (int h = 0; h < K; h++) {
				size_t row = (size_t)b * T + (size_t)h * c;
				size_t p0 = (size_t)loom__cp_pos(h * c, T, m->f.cp, m->f.cp_rank, K);
				PROF(ENCODER, loom__encoder_forward(ar->in + row * C, inputs + row, loom__gpt2_param(m, 0),
				                                    loom__gpt2_param(m, 1) + p0 * C, 1, c, C));
			}
		return;
	}
	PROF(ENCODER, loom__encoder_forward(ar->in, inputs, loom__gpt2_param(m, 0), loom__gpt2_param(m, 1), B, T,
	                                    m->f.cfg.n_embd));
}

/* Tensor parallel (g in forward): out (N,C) holds this rank's part of a row-parallel product; sum the
 * parts across the group, then add the replicated bias (N,C). */
static void tp_sum_bias(loom_gpt2_t *m, float *out, const float *bias, int N, int C)
{
	loom__tp_reduce(m, out, (size_t)N * C, LOOM_TP_SUM);
	double t0 = m->prof_on ? loom_now() : 0.0;
#pragma omp parallel for schedule(static)
	for (int n = 0; n < N; n++)
		for (int c = 0; c < C; c++)
			out[(size_t)n * C + c] += bias[c];
	if (m->prof_on)
		loom__gpt2_prof_add(m, PROF_RESIDUAL, t0, 0.0);
}

/* ---- sequence parallelism ---- */

/* g-bar (forward, and again in backward for the weight gradient): x (N/tp,C), this rank's rows, copied to
 * its place in m->sp_gather and all-gathered into the whole (N,C), which is returned. */
static const float *sp_gather(loom_gpt2_t *m, const float *x, int N, int C)
{
	size_t o = loom__fam_sp_row0(&m->f, N) * C;
	memcpy(m->sp_gather + o, x, (size_t)(N / m->f.tp) * C * sizeof(float));
	loom__tp_reduce(m, m->sp_gather, (size_t)N * C, LOOM_TP_ALLGATHER);
	return m->sp_gather;
}

/* g (forward): part (N,C) this rank's part of a row-parallel product (overwritten); reduce-scatter it
 * and add the replicated bias and the residual on this rank's rows: out (N/tp,C) = res + (sum + bias). */
static void sp_scatter_bias_res(loom_gpt2_t *m, float *out, float *part, const float *bias, const float *res, int N,
                                int C)
{
	int Ns = N / m->f.tp;
	const float *p = part + loom__fam_sp_row0(&m->f, N) * C;
	loom__tp_reduce(m, part, (size_t)N * C, LOOM_TP_REDUCE_SCATTER);
	double t0 = m->prof_on ? loom_now() : 0.0;
#pragma omp parallel for schedule(static)
	for (int n = 0; n < Ns; n++)
		for (int c = 0; c < C; c++) {
			size_t i = (size_t)n * C + c;
			out[i] = res[i] + (p[i] + bias[c]);
		}
	if (m->prof_on)
		loom__gpt2_prof_add(m, PROF_RESIDUAL, t0, 0.0);
}

/* A LayerNorm's backward on the rows this rank holds: with sequence parallelism its weight and bias
 * gradients cover the local rows only, so they are computed apart (m->sp_lng), summed over the group
 * and then added to dw, db (which accumulate over micro-batches). */
static void ln_backward(loom_gpt2_t *m, float *dinp, float *dw, float *db, const float *dout, const float *inp,
                        const float *w, const float *mean, const float *rstd, int N, int C)
{
	if (!m->f.sp) {
		PROF(LAYERNORM_BWD, loom__layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C));
		return;
	}
	float *g = m->sp_lng;
	memset(g, 0, 2 * (size_t)C * sizeof(float));
	PROF(LAYERNORM_BWD, loom__layernorm_backward(dinp, g, g + C, dout, inp, w, mean, rstd, N, C));
	loom__tp_reduce(m, g, 2 * (size_t)C, LOOM_TP_SUM);
	for (int c = 0; c < C; c++)
		dw[c] += g[c], db[c] += g[C + c];
}

/* The profile's count of an attention product pass: k x B x C x the keys each query sees, summed over
 * the T queries of a sequence (causal: T (T + 1) / 2), as the kernel computes it; context parallel: over
 * the rank's chunks (loom__cp_rank_keys; every rank's share is the same under the causal mask). */
static double causal_flops(double k, int B, int T, double C, loom_gpt2_t *m)
{
	double keys = m->f.cp <= 1 ? (double)T * (T + 1) / 2.0
	                           : loom__cp_rank_keys(m->f.cp * T, m->f.cp, loom__fam_cp_chunks(&m->f, T), m->f.cp_rank, -1);
	return k * B * C * keys;
}

/* The attention of a block's rows: one process's kernel, or with context parallelism the group's (the
 * keys and values of the whole sequence gathered; a failure of the hook is the pass's error). */
static void attention_forward(loom_gpt2_t *m, layer_acts_t *a, int B, int T)
{
	loom__flash_t f = loom__attention_shape(a->qkv, B, T, m->Cl, m->NHl);
	loom__fam_attention_forward(&m->f, &f, a->atty, m->Cl, a->lse);
}

static void attention_backward(loom_gpt2_t *m, layer_acts_t *a, int B, int T)
{
	int Cl = m->Cl;
	loom__flash_t f = loom__attention_shape(a->qkv, B, T, Cl, m->NHl);
	loom__fam_attention_backward(&m->f, &f, m->dqkv, 3 * Cl, m->dqkv + Cl, m->dqkv + 2 * Cl, 3 * Cl, m->dbtc, a->atty,
	                             Cl, a->lse);
}

static float *block_out(const loom_gpt2_t *m, layer_acts_t *a, int l, int N)
{
	return l == m->f.hi - 1 ? a->res3 + loom__fam_sp_row0(&m->f, N) * m->f.cfg.n_embd : a->res3;
}

/* With tensor parallelism (tp > 1) the same pass on the local heads (Cl = C/tp channels, NHl heads)
 * and MLP columns (4 Cl): attn.c_attn and mlp.c_fc are column-parallel (local outputs), attn.c_proj
 * and mlp.c_proj row-parallel (partial sums, reduced before their bias); with tp 1, Cl = C. With
 * sequence parallelism res, out and the LayerNorms hold this rank's N/tp rows: their outputs are
 * all-gathered for the column-parallel matmuls, the row-parallel products reduce-scattered. */
static void block_forward_acts(loom_gpt2_t *m, int l, layer_acts_t *a, const float *res, float *out, int B, int T,
                               int whole)
{
	int C = m->f.cfg.n_embd, N = B * T, Cl = m->Cl, tp = m->f.tp, sp = m->f.sp, Nl = loom__fam_sp_rows(&m->f, N);
	size_t NC = (size_t)N * C;
	double fN = N, fC = C, fCl = Cl; /* for the flop counts */
	const float *x;
#define W(j) loom__gpt2_param(m, lt(l, j))
	PROF(LAYERNORM, loom__layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, res, W(LN1_W), W(LN1_B), Nl, C));
	x = sp ? sp_gather(m, a->ln1, N, C) : a->ln1;
	PROFF(MATMUL, 6 * fN * fC * fCl, loom__matmul_forward(a->qkv, x, W(QKV_W), W(QKV_B), N, C, 3 * Cl));
	PROFF(ATTENTION, causal_flops(4.0, B, T, fCl, m), attention_forward(m, a, B, T));
	PROFF(MATMUL, 2 * fN * fC * fCl, loom__matmul_forward(sp ? m->dbtc : a->res2, a->atty, W(ATTPROJ_W),
	                                                      tp > 1 ? NULL : W(ATTPROJ_B), N, Cl, C));
	if (sp) {
		sp_scatter_bias_res(m, a->res2, m->dbtc, W(ATTPROJ_B), res, N, C);
	} else {
		if (tp > 1)
			tp_sum_bias(m, a->res2, W(ATTPROJ_B), N, C);
		PROF(RESIDUAL, loom__residual_forward(a->res2, res, a->res2, NC));
	}
	PROF(LAYERNORM, loom__layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, W(LN2_W), W(LN2_B), Nl, C));
	x = sp ? sp_gather(m, a->ln2, N, C) : a->ln2;
	PROFF(MATMUL, 8 * fN * fC * fCl, loom__matmul_forward(a->fch, x, W(FC_W), W(FC_B), N, C, 4 * Cl));
	PROF(GELU, loom__gelu_forward(a->fch_gelu, a->fch, (size_t)N * 4 * Cl));
	if (!whole)
		return; /* a recompute: the rest makes the block's output, which is kept */
	PROFF(MATMUL, 8 * fN * fC * fCl, loom__matmul_forward(sp ? m->dbtc : out, a->fch_gelu, W(FCPROJ_W),
	                                                      tp > 1 ? NULL : W(FCPROJ_B), N, 4 * Cl, C));
	if (sp) {
		sp_scatter_bias_res(m, out, m->dbtc, W(FCPROJ_B), a->res2, N, C);
		return;
	}
	if (tp > 1)
		tp_sum_bias(m, out, W(FCPROJ_B), N, C);
	PROF(RESIDUAL, loom__residual_forward(out, a->res2, out, NC));
#undef W
}

void loom__gpt2_block_forward(loom_gpt2_t *m, int l, layer_acts_t *a, const float *res, int B, int T)
{
	block_forward_acts(m, l, a, res, a->res3, B, T, 1);
}

static void block_forward(loom__fam_t *f, int mb, int l, int B, int T)
{
	loom_gpt2_t *m = G2(f);
	arena_t *ar = &m->arenas[mb];
	layer_acts_t *a = &ar->layers[l - m->f.lo];
	int N = B * T;
	loom__gpt2_param_use(m, l, 0);
	block_forward_acts(m, l, a, block_in(m, ar, l, N), block_out(m, a, l, N), B, T, 1);
	if (m->f.sp && l == m->f.hi - 1 && m->f.has_head) /* the head's input is whole; a next stage's is not */
		loom__tp_reduce(m, a->res3, (size_t)N * m->f.cfg.n_embd, LOOM_TP_ALLGATHER);
}

/* A stage of the head alone (no block) under sequence parallelism receives this rank's rows of its
 * input (see block_in): gathered whole, as the head reads every row (with the head's positions shared
 * with the stage before, rows it does not compute may be stale: it never reads them). */
static void head_input(loom_gpt2_t *m, arena_t *ar, int N)
{
	if (m->f.sp && m->f.lo == m->f.hi && !m->f.has_embed)
		loom__tp_reduce(m, ar->in, (size_t)N * m->f.cfg.n_embd, LOOM_TP_ALLGATHER);
}

/* ln_f forward on rows [r0, r0 + n) of the stream. */
static void lnf_forward(loom_gpt2_t *m, arena_t *ar, int r0, int n)
{
	int nt = m->f.ntensors;
	size_t C = (size_t)m->f.cfg.n_embd, o = (size_t)r0 * C;
	PROF(LAYERNORM, loom__layernorm_forward(ar->lnf + o, ar->lnf_mean + r0, ar->lnf_rstd + r0,
	                                        stream(m, ar, m->f.hi) + o, loom__gpt2_param(m, nt - 2),
	                                        loom__gpt2_param(m, nt - 1), n, (int)C));
}

static void head_forward(loom__fam_t *f, int mb, const int *targets, int B, int T, float *loss)
{
	loom_gpt2_t *m = G2(f);
	arena_t *ar = &m->arenas[mb];
	int C = m->f.cfg.n_embd, V = m->f.cfg.vocab_size;
	loom__gpt2_param_use(m, m->f.cfg.n_layer, 0);
	head_input(m, ar, B * T);
	lnf_forward(m, ar, 0, B * T);
	const float *wte = loom__gpt2_param(m, 0);
	if (targets && m->f.tp > 1) {
		loom__tp_classifier(m, ar->losses, NULL, NULL, ar->lnf, wte, targets, 0.0f, B * T);
		if (loss)
			*loss = loom__fam_mean_loss(ar->losses, B * T, B * T);
	} else if (targets) {
		PROFF(CLASSIFIER, 2.0 * B * T * C * V,
		      loom__classifier_forward_backward(ar->losses, NULL, NULL, m->f.logits, m->f.chunk, ar->lnf, wte, targets,
		                                        0.0f, B * T, C, V));
		if (loss)
			*loss = loom__fam_mean_loss(ar->losses, B * T, B * T);
	} else {
		/* rows b*T + T-1 of lnf are T*C floats apart */
		PROFF(CLASSIFIER, 2.0 * B * C * V,
		      loom__gemm(0, 1, B, V, C, 1.0f, ar->lnf + (size_t)(T - 1) * C, T * C, wte, C, 0.0f, m->f.last_logits, V));
	}
}

/* ln_f forward, then the lm head, softmax, cross-entropy and their backward (dlnf into dbtc, wte's
 * first share), then ln_f's backward into dres, on rows [r0, r0 + n) of the N = B T positions (all of
 * them for a whole model; a part when a pipeline splits the head's positions between two stages):
 * gradients scaled by grad_scale / N, *loss the rows' summed losses / N (so the parts of a split add
 * up to the mean), dres written on those rows only. */
static void head_forward_backward(loom__fam_t *f, int mb, const int *targets, int N, int r0, int n, float grad_scale,
                                  float *loss)
{
	loom_gpt2_t *m = G2(f);
	arena_t *ar = &m->arenas[mb];
	int C = m->f.cfg.n_embd, V = m->f.cfg.vocab_size, nt = m->f.ntensors;
	size_t nC = (size_t)n * C, o = (size_t)r0 * C;
	double fn = n, fC = C; /* for the flop counts */
	loom__gpt2_param_use(m, m->f.cfg.n_layer, 0);
	loom__gpt2_param_use(m, m->f.cfg.n_layer, 1);
	head_input(m, ar, N);
	lnf_forward(m, ar, r0, n);
	zero(m, m->dbtc + o, nC);
	if (m->f.tp > 1)
		loom__tp_classifier(m, ar->losses + r0, m->dbtc + o, loom__gpt2_grad(m, 0), ar->lnf + o,
		                    loom__gpt2_param(m, 0), targets + r0, grad_scale / (float)N, n);
	else
		PROFF(CLASSIFIER, 6 * fn * fC * V,
		      loom__classifier_forward_backward(ar->losses + r0, m->dbtc + o, loom__gpt2_grad(m, 0), m->f.logits,
		                                        m->f.chunk, ar->lnf + o, loom__gpt2_param(m, 0), targets + r0,
		                                        grad_scale / (float)N, n, C, V));
	if (loss)
		*loss = loom__fam_mean_loss(ar->losses + r0, n, N);
	zero(m, m->f.dres + o, nC);
	PROF(LAYERNORM_BWD, loom__layernorm_backward(m->f.dres + o, loom__gpt2_grad(m, nt - 2), loom__gpt2_grad(m, nt - 1),
	                                             m->dbtc + o, stream(m, ar, m->f.hi) + o, loom__gpt2_param(m, nt - 2),
	                                             ar->lnf_mean + r0, ar->lnf_rstd + r0, n, C));
	ready(m, nt - 1);
	ready(m, nt - 2);
	if (!m->f.has_embed)
		ready(m, 0); /* this model adds nothing else to wte */
}

/* Activation checkpointing: refill what block l's forward left in the shared scratch (since
 * overwritten by other blocks and arenas) from what the arena kept, with the forward's own kernels,
 * so the backward reads the bits the forward computed. Runs after the block's backward param-use
 * hook: the parameters are the ones its forward used. */
static void recompute(loom_gpt2_t *m, int l, layer_acts_t *a, const float *res_in, int B, int T)
{
	if (m->f.act_ckpt == LOOM_ACT_CKPT_BLOCKS)
		block_forward_acts(m, l, a, res_in, NULL, B, T, 0);
	else if (m->f.act_ckpt == LOOM_ACT_CKPT_SELECTIVE)
		PROFF(ATTENTION_RECOMPUTE, causal_flops(4.0, B, T, m->Cl, m), attention_forward(m, a, B, T));
	else
		return;
	m->f.recomputes++;
}

/* With sequence parallelism m->f.dres is a whole (N,C) buffer of which this rank's rows are current
 * between the blocks: it is all-gathered where a row-parallel matmul's backward needs the whole
 * gradient (g's conjugate), the column-parallel matmuls' input gradients are reduce-scattered onto
 * this rank's rows (f's conjugate), and after block lo it is gathered whole for the embedding (a
 * previous pipeline stage takes this rank's rows, which are all its block hi-1 reads). */
static void block_backward(loom__fam_t *f, int mb, int l, int B, int T)
{
	loom_gpt2_t *m = G2(f);
	arena_t *ar = &m->arenas[mb];
	int C = m->f.cfg.n_embd, N = B * T, Cl = m->Cl, tp = m->f.tp, sp = m->f.sp, Nl = loom__fam_sp_rows(&m->f, N);
	size_t NC = (size_t)N * C, NCl = (size_t)N * Cl, o = loom__fam_sp_row0(&m->f, N) * C;
	double fN = N, fC = C, fCl = Cl; /* for the flop counts */
	layer_acts_t *a = &ar->layers[l - m->f.lo];
	const float *res_in = block_in(m, ar, l, N), *x;
	float *dres = m->f.dres + o, *dx; /* this rank's rows of the stream gradient */
	loom__gpt2_param_use(m, l, 1);
	recompute(m, l, a, res_in, B, T);
#define W(j) loom__gpt2_param(m, lt(l, j))
#define G(j) loom__gpt2_grad(m, lt(l, j))
	/* MLP: res3 = res2 + fc_proj(gelu(fc(ln2(res2)))); dres is d res3 and passes through to d res2 */
	if (sp)
		loom__tp_reduce(m, m->f.dres, NC, LOOM_TP_ALLGATHER);
	zero(m, m->d4a, NCl * 4);
	PROFF(MATMUL_BWD, 16 * fN * fC * fCl,
	      loom__matmul_backward(m->d4a, G(FCPROJ_W), G(FCPROJ_B), m->f.dres, a->fch_gelu, W(FCPROJ_W), N, 4 * Cl, C));
	ready(m, lt(l, FCPROJ_B));
	ready(m, lt(l, FCPROJ_W));
	zero(m, m->d4b, NCl * 4);
	PROF(GELU_BWD, loom__gelu_backward(m->d4b, a->fch, m->d4a, NCl * 4));
	x = sp ? sp_gather(m, a->ln2, N, C) : a->ln2;
	zero(m, m->dbtc, NC);
	PROFF(MATMUL_BWD, 16 * fN * fC * fCl,
	      loom__matmul_backward(m->dbtc, G(FC_W), G(FC_B), m->d4b, x, W(FC_W), N, C, 4 * Cl));
	/* f in backward: mlp.c_fc is column-parallel, its input's gradient is the ranks' sum (sequence
	 * parallel: of this rank's rows) */
	if (tp > 1)
		loom__tp_reduce(m, m->dbtc, NC, sp ? LOOM_TP_REDUCE_SCATTER : LOOM_TP_SUM);
	dx = m->dbtc + o;
	ready(m, lt(l, FC_B));
	ready(m, lt(l, FC_W));
	ln_backward(m, dres, G(LN2_W), G(LN2_B), dx, a->res2, W(LN2_W), a->ln2_mean, a->ln2_rstd, Nl, C);
	ready(m, lt(l, LN2_B));
	ready(m, lt(l, LN2_W));
	/* attention: res2 = res_in + attn_proj(attention(qkv(ln1(res_in)))) */
	if (sp)
		loom__tp_reduce(m, m->f.dres, NC, LOOM_TP_ALLGATHER);
	zero(m, m->dbtc, NCl);
	PROFF(MATMUL_BWD, 4 * fN * fC * fCl,
	      loom__matmul_backward(m->dbtc, G(ATTPROJ_W), G(ATTPROJ_B), m->f.dres, a->atty, W(ATTPROJ_W), N, Cl, C));
	ready(m, lt(l, ATTPROJ_B));
	ready(m, lt(l, ATTPROJ_W));
	zero(m, m->dqkv, NCl * 3);
	PROFF(ATTENTION_BWD, causal_flops(8.0, B, T, fCl, m), attention_backward(m, a, B, T));
	x = sp ? sp_gather(m, a->ln1, N, C) : a->ln1;
	zero(m, m->dbtc, NC);
	PROFF(MATMUL_BWD, 12 * fN * fC * fCl,
	      loom__matmul_backward(m->dbtc, G(QKV_W), G(QKV_B), m->dqkv, x, W(QKV_W), N, C, 3 * Cl));
	if (tp > 1) /* f in backward: attn.c_attn is column-parallel */
		loom__tp_reduce(m, m->dbtc, NC, sp ? LOOM_TP_REDUCE_SCATTER : LOOM_TP_SUM);
	ready(m, lt(l, QKV_B));
	ready(m, lt(l, QKV_W));
	ln_backward(m, dres, G(LN1_W), G(LN1_B), dx, res_in, W(LN1_W), a->ln1_mean, a->ln1_rstd, Nl, C);
	ready(m, lt(l, LN1_B));
	ready(m, lt(l, LN1_W));
	if (sp && l == m->f.lo && m->f.has_embed) /* the embedding's gradient is whole; a previous stage's is not */
		loom__tp_reduce(m, m->f.dres, NC, LOOM_TP_ALLGATHER);
#undef W
#undef G
}

static void embed_backward(loom__fam_t *f, int mb, const int *inputs, int B, int T)
{
	loom_gpt2_t *m = G2(f);
	(void)mb;
	loom__gpt2_param_use(m, -1, 1);
	if (m->f.tp > 1) {
		loom__tp_embed_backward(m, m->f.dres, inputs, B, T);
	} else if (m->f.cp > 1) {
		int C = m->f.cfg.n_embd, K = loom__fam_cp_chunks(&m->f, T), c = T / K;
		for (int b = 0; b < B; b++)
			for (int h = 0; h < K; h++) {
				size_t row = (size_t)b * T + (size_t)h * c;
				size_t p0 = (size_t)loom__cp_pos(h * c, T, m->f.cp, m->f.cp_rank, K);
				PROF(ENCODER_BWD, loom__encoder_backward(loom__gpt2_grad(m, 0), loom__gpt2_grad(m, 1) + p0 * C,
				                                         m->f.dres + row * C, inputs + row, 1, c, C));
			}
	} else
		PROF(ENCODER_BWD, loom__encoder_backward(loom__gpt2_grad(m, 0), loom__gpt2_grad(m, 1), m->f.dres, inputs, B,
		                                         T, m->f.cfg.n_embd));
	ready(m, 1);
	ready(m, 0);
}

/* ---- the passes on the shared base (loom__fam_kind_t): family.c checks each call, sets the gemm up
 * and reports the pass's status (its first reduction failure, else the gemm's) --------------------------- */

static float *kind_stream(loom__fam_t *f, int mb, int l)
{
	return stream(G2(f), &G2(f)->arenas[mb], l);
}

const loom__fam_kind_t loom__gpt2_kind = {
	.table = &loom__gpt2_table,
	.len_name = "seq_len",
	.layers_name = "n_layer",
	.size = sizeof(loom_gpt2_t),
	.setup = setup,
	.layout = layout_acts,
	.alloc = alloc,
	.release = release,
	.embed_forward = embed_forward,
	.block_forward = block_forward,
	.head_forward = head_forward,
	.head_forward_backward = head_forward_backward,
	.block_backward = block_backward,
	.embed_backward = embed_backward,
	.stream = kind_stream,
};

int loom_gpt2_embed_forward(loom_gpt2_t *m, int mb, const int *inputs, int B, int T)
{
	return loom__fam_embed_forward(FAM(m), mb, inputs, B, T);
}

int loom_gpt2_block_forward(loom_gpt2_t *m, int mb, int l, int B, int T)
{
	return loom__fam_block_forward(FAM(m), mb, l, B, T);
}

int loom_gpt2_head_forward(loom_gpt2_t *m, int mb, const int *targets, int B, int T, float *loss)
{
	return loom__fam_head_forward(FAM(m), mb, targets, B, T, loss);
}

int loom_gpt2_head_forward_backward(loom_gpt2_t *m, int mb, const int *targets, int B, int T, float grad_scale,
                                    float *loss)
{
	return loom__fam_head_forward_backward(FAM(m), mb, targets, B, T, grad_scale, loss);
}

int loom_gpt2_head_forward_backward_rows(loom_gpt2_t *m, int mb, const int *targets, int B, int T, int row0,
                                         int rows, float grad_scale, float *loss)
{
	return loom__fam_head_forward_backward_rows(FAM(m), mb, targets, B, T, row0, rows, grad_scale, loss);
}

int loom_gpt2_block_backward(loom_gpt2_t *m, int mb, int l, int B, int T)
{
	return loom__fam_block_backward(FAM(m), mb, l, B, T);
}

int loom_gpt2_embed_backward(loom_gpt2_t *m, int mb, const int *inputs, int B, int T)
{
	return loom__fam_embed_backward(FAM(m), mb, inputs, B, T);
}

float *loom_gpt2_block_input(loom_gpt2_t *m, int mb, int l)
{
	return loom__fam_block_input(FAM(m), mb, l);
}

float *loom_gpt2_stream_grad(loom_gpt2_t *m)
{
	return loom__fam_stream_grad(FAM(m));
}

int loom_gpt2_forward(loom_gpt2_t *m, const int *inputs, const int *targets, int B, int T, float *loss)
{
	return loom__fam_forward(FAM(m), inputs, targets, B, T, loss);
}

const float *loom_gpt2_logits(const loom_gpt2_t *m)
{
	return loom__fam_last_logits(FAM(m));
}

void loom_gpt2_zero_grad(loom_gpt2_t *m)
{
	loom__fam_zero_grad(FAM(m));
}

int loom_gpt2_forward_backward(loom_gpt2_t *m, const int *inputs, const int *targets, int B, int T,
                               float grad_scale, float *loss)
{
	return loom__fam_forward_backward(FAM(m), inputs, targets, B, T, grad_scale, loss);
}
