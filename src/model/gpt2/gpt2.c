/* gpt2.c: the GPT-2 model: creation, parameter/gradient views, initialization, the passes of each
 * unit (embedding, block, head) forward and backward, the whole-model passes composed of them, and
 * the grad-ready and param-use callbacks.
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
 * (the layout of kernels.h's loom__cp_chunk; head-tail for GPT-2, whose attention is causal only): the embedding adds their positions' wpe rows, the attention runs over the group
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

/* Positions per chunk of the fused classifier (override: LOOM_CLS_CHUNK). See classifier.c. */
#define DEFAULT_CHUNK 512

/* Tensor index of layer l's j-th tensor (j in the order of gpt2.h). */
static int lt(int l, int j)
{
	return 2 + LOOM_GPT2_LAYER_TENSORS * l + j;
}

enum { LN1_W, LN1_B, QKV_W, QKV_B, ATTPROJ_W, ATTPROJ_B, LN2_W, LN2_B, FC_W, FC_B, FCPROJ_W, FCPROJ_B };

/* Bump allocation inside m->mem: with base NULL it only measures. Offsets stay 64-byte aligned. */
/* a * b, or SIZE_MAX when that does not fit: the layout's sizes saturate instead of wrapping, so a
 * batch too large for the address space is refused as such, never allocated by a wrapped count. */
static size_t size_mul(size_t a, size_t b)
{
	return b && a > SIZE_MAX / b ? SIZE_MAX : a * b;
}

static float *carve(char *base, size_t *off, size_t nfloats)
{
	float *p = base ? (float *)(base + *off) : NULL;
	size_t b = size_mul(nfloats, sizeof(float));
	*off = b > SIZE_MAX - 63 || *off > SIZE_MAX - 63 - b ? SIZE_MAX : *off + (b + 63) / 64 * 64;
	return p;
}

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
static size_t layout_acts(loom_gpt2_t *m, char *base, loom_gpt2_act_bytes_t *bytes)
{
	/* with tensor parallelism the per-head and per-MLP-column buffers are the local shards'; with
	 * sequence parallelism the stream-sized ones between the tensor-parallel regions hold Ns = N/tp rows */
	size_t off = 0, C = (size_t)m->cfg.n_embd, V = (size_t)m->Vl, N = (size_t)m->B * m->T;
	size_t NH = (size_t)m->NHl, T = (size_t)m->T, Cl = (size_t)m->Cl, mark;
	size_t Ns = m->sp ? N / (size_t)m->tp : N;
	size_t lse = size_mul(size_mul((size_t)m->B, NH), T);
	size_t NC = size_mul(N, C), NCl = size_mul(N, Cl), N3 = size_mul(N, 3 * Cl), N4 = size_mul(N, 4 * Cl);
	size_t NsC = size_mul(Ns, C);
	layer_acts_t shared = {0}, dummy_layer;
	arena_t dummy_arena;
	memset(bytes, 0, sizeof *bytes);
	if (m->act_ckpt == LOOM_ACT_CKPT_BLOCKS) {
		shared.ln1 = carve(base, &off, NsC);
		shared.ln1_mean = carve(base, &off, Ns);
		shared.ln1_rstd = carve(base, &off, Ns);
		shared.qkv = carve(base, &off, N3);
		shared.lse = carve(base, &off, lse);
		shared.atty = carve(base, &off, NCl);
		shared.res2 = carve(base, &off, NsC);
		shared.ln2 = carve(base, &off, NsC);
		shared.ln2_mean = carve(base, &off, Ns);
		shared.ln2_rstd = carve(base, &off, Ns);
		shared.fch = carve(base, &off, N4);
		shared.fch_gelu = carve(base, &off, N4);
	} else if (m->act_ckpt == LOOM_ACT_CKPT_SELECTIVE) {
		shared.lse = carve(base, &off, lse);
		shared.atty = carve(base, &off, NCl);
	}
	bytes->recompute = mark = off;
	for (int k = 0; k < m->narenas; k++) {
		arena_t *ar = base ? &m->arenas[k] : &dummy_arena;
		ar->in = carve(base, &off, NC);
		for (int l = m->lo; l < m->hi; l++) {
			layer_acts_t *a = base ? &ar->layers[l - m->lo] : &dummy_layer;
			size_t l0 = off, out = l == m->hi - 1 ? NC : NsC; /* the last block's output stays whole */
			if (m->act_ckpt == LOOM_ACT_CKPT_BLOCKS) {
				*a = shared;
				a->res3 = carve(base, &off, out);
				if (l == m->lo)
					bytes->per_layer = off - l0;
				continue;
			}
			a->ln1 = carve(base, &off, NsC);
			a->ln1_mean = carve(base, &off, Ns);
			a->ln1_rstd = carve(base, &off, Ns);
			a->qkv = carve(base, &off, N3);
			int sel = m->act_ckpt == LOOM_ACT_CKPT_SELECTIVE;
			a->lse = sel ? shared.lse : carve(base, &off, lse);
			a->atty = sel ? shared.atty : carve(base, &off, NCl);
			a->res2 = carve(base, &off, NsC);
			a->ln2 = carve(base, &off, NsC);
			a->ln2_mean = carve(base, &off, Ns);
			a->ln2_rstd = carve(base, &off, Ns);
			a->fch = carve(base, &off, N4);
			a->fch_gelu = carve(base, &off, N4);
			a->res3 = carve(base, &off, out);
			if (l == m->lo)
				bytes->per_layer = off - l0;
		}
		if (m->has_head) {
			ar->lnf = carve(base, &off, NC);
			ar->lnf_mean = carve(base, &off, N);
			ar->lnf_rstd = carve(base, &off, N);
			ar->losses = carve(base, &off, N);
		}
	}
	bytes->kept = off - mark, mark = off;
	if (m->has_head) {
		m->logits = carve(base, &off, size_mul((size_t)m->chunk, V));
		m->last_logits = carve(base, &off, size_mul((size_t)m->B, V));
		if (m->tp > 1)
			m->tp_stats = carve(base, &off, 3 * (size_t)m->chunk);
	}
	bytes->head = off - mark, mark = off;
	m->dres = carve(base, &off, NC);
	m->dbtc = carve(base, &off, NC);
	m->dqkv = carve(base, &off, N3);
	m->d4a = carve(base, &off, N4);
	m->d4b = carve(base, &off, N4);
	/* context parallel: the kernel's backward partials cover the whole sequence's keys, and the gathered
	 * keys and values of one layer live in cp_mem (cp_attention.c) */
	m->att_scratch = carve(base, &off, loom__attention_scratch_floats(m->B, m->T * m->cp, Cl, m->att_threads));
	if (m->cp > 1)
		m->cp_mem = carve(base, &off, loom__cp_scratch_floats(m->B, m->T, m->cp, m->NHl, m->NHl, (int)Cl / m->NHl));
	if (m->sp) { /* the gathers borrow d4a, free whenever a gather is live, when it is large enough */
		m->sp_gather = 4 * Cl >= C ? m->d4a : carve(base, &off, NC);
		m->sp_lng = carve(base, &off, 2 * C);
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

static void point_params(loom_gpt2_t *m, float *params)
{
	m->params = params;
	for (int i = 0; i < m->ntensors; i++)
		m->pview[i] = params ? params + m->tensors[i].offset : NULL;
}

static void point_grads(loom_gpt2_t *m, float *grads)
{
	m->grads = grads;
	m->grad_split = 0;
	for (int i = 0; i < m->ntensors; i++)
		m->gview[i] = grads ? grads + m->tensors[i].offset : NULL;
}

/* The options' checks of create (LOOM_EINVAL with the detail). */
static int check_opts(const loom_gpt2_config_t *cfg, const loom_gpt2_opts_t *o)
{
	int rc, L = cfg->n_layer;
	if ((rc = loom_gpt2_config_check(cfg)) != LOOM_OK)
		return rc;
	if (o->B <= 0 || o->T <= 0 || o->T > cfg->seq_len)
		return loom_seterr(LOOM_EINVAL, "gpt2 create: batch %d x %d tokens (expected B >= 1 and 1 <= T <= seq_len %d)",
		                   o->B, o->T, cfg->seq_len);
	int lo = o->layer_lo, hi = o->layer_hi ? o->layer_hi : L;
	/* lo == hi == L: the head alone (a last pipeline stage whose head outweighs the blocks) */
	if (lo < 0 || (lo >= hi && !(lo == hi && hi == L)) || hi > L || o->arenas < 0)
		return loom_seterr(LOOM_EINVAL, "gpt2 create: layers [%d, %d) with %d arenas (expected 0 <= lo < hi <= "
		                   "n_layer %d, or lo = hi = n_layer for the head alone, and arenas >= 1)", o->layer_lo,
		                   o->layer_hi, o->arenas, L);
	int tp = o->tp_size ? o->tp_size : 1;
	if (tp < 1 || o->tp_rank < 0 || o->tp_rank >= tp)
		return loom_seterr(LOOM_EINVAL, "gpt2 create: tensor-parallel rank %d of %d (expected 0 <= rank < size)",
		                   o->tp_rank, tp);
	if ((int)o->act_ckpt < LOOM_ACT_CKPT_NONE || (int)o->act_ckpt > LOOM_ACT_CKPT_SELECTIVE)
		return loom_seterr(LOOM_EINVAL, "gpt2 create: activation checkpointing mode %d (expected 0 none, 1 blocks, "
		                   "2 selective)", (int)o->act_ckpt);
	if (o->dtype != LOOM_COMPUTE_FP32 && o->dtype != LOOM_COMPUTE_BF16)
		return loom_seterr(LOOM_EINVAL, "gpt2 create: dtype %d (expected fp32 or bf16)", (int)o->dtype);
	if (o->sequence_parallel && tp < 2)
		return loom_seterr(LOOM_EINVAL, "gpt2 create: sequence parallelism shards the sequence over the "
		                   "tensor-parallel ranks and needs tp > 1 (tp_size %d)", o->tp_size);
	if (o->sequence_parallel && ((long)o->B * o->T) % tp != 0)
		return loom_seterr(LOOM_EINVAL, "gpt2 create: sequence parallelism: the %d x %d = %ld positions of a "
		                   "micro-batch are not divisible by tp = %d (each rank holds an equal share)", o->B, o->T,
		                   (long)o->B * o->T, tp);
	if ((rc = loom__cp_opts_check("gpt2", "seq_len", cfg, o)) != LOOM_OK)
		return rc;
	loom_bf16_path_t path;
	if (o->dtype == LOOM_COMPUTE_BF16 && (rc = loom_bf16_path(&path)) != LOOM_OK)
		return rc; /* LOOM_BF16 asks for what cannot run: its message says what is missing */
	return loom_gpt2_tp_check(cfg, tp);
}

/* The sizes create derives from the checked options: everything layout_acts reads. */
static void setup(loom_gpt2_t *m, const loom_gpt2_config_t *cfg, const loom_gpt2_opts_t *o)
{
	int L = cfg->n_layer, tp = o->tp_size ? o->tp_size : 1;
	m->cfg = *cfg;
	m->B = o->B;
	m->T = o->T;
	m->lo = o->layer_lo;
	m->hi = o->layer_hi ? o->layer_hi : L;
	m->has_embed = m->lo == 0;
	m->has_head = m->hi == L;
	m->narenas = o->arenas ? o->arenas : 1;
	m->gemm.dtype = o->dtype;
	if (o->dtype == LOOM_COMPUTE_BF16) { /* the path is the model's for its life (create checked it can run) */
		loom_bf16_path_t path = LOOM_BF16_AUTO; /* (AUTO again: chosen at the first GEMM, errors there) */
		(void)loom_bf16_path(&path);
		m->gemm.path = (int)path;
	}
	m->tp = tp, m->tp_rank = tp > 1 ? o->tp_rank : 0;
	m->Cl = cfg->n_embd / tp, m->NHl = cfg->n_head / tp;
	m->Vl = (cfg->vocab_size + tp - 1) / tp, m->v0 = m->tp_rank * m->Vl;
	m->Vv = LOOM_MAX(0, LOOM_MIN(m->Vl, cfg->vocab_size - m->v0));
	m->nparams = loom_gpt2_shard_params(cfg, tp);
	m->ntensors = loom_gpt2_num_tensors(cfg);
	long chunk = loom_env_long("LOOM_CLS_CHUNK", DEFAULT_CHUNK, NULL);
	m->chunk = (int)LOOM_MAX(1, LOOM_MIN(chunk, (long)o->B * o->T));
	m->att_threads = LOOM_MAX(omp_get_max_threads(), omp_get_num_procs());
	m->act_ckpt = (int)o->act_ckpt;
	m->sp = o->sequence_parallel && tp > 1;
	m->cp = o->cp_size > 1 ? o->cp_size : 1, m->cp_rank = m->cp > 1 ? o->cp_rank : 0;
	m->cp_ring = m->cp > 1 && loom__cp_ring_env() == 1;
	m->cp_T = -1, m->cp_K = 2; /* the layout's K, computed at the first pass (loom__cp_chunks_memo) */
}

/* The activations of a batch whose size does not fit in size_t. */
static int too_large(const loom_gpt2_config_t *cfg, const loom_gpt2_opts_t *o)
{
	return loom_seterr(LOOM_ENOMEM, "gpt2 create: the activations of batch %d x %d (L%d C%d H%d V%d) are larger than "
	                   "the address space (their byte count overflows); lower --batch-size or --seq-len", o->B, o->T,
	                   cfg->n_layer, cfg->n_embd, cfg->n_head, cfg->vocab_size);
}

int loom_gpt2_act_bytes(const loom_gpt2_config_t *cfg, const loom_gpt2_opts_t *o, loom_gpt2_act_bytes_t *out)
{
	loom_gpt2_t m;
	int rc;
	memset(out, 0, sizeof *out);
	if ((rc = check_opts(cfg, o)) != LOOM_OK)
		return rc;
	memset(&m, 0, sizeof m);
	setup(&m, cfg, o);
	if (layout_acts(&m, NULL, out) == SIZE_MAX)
		return too_large(cfg, o);
	return LOOM_OK;
}

void loom_gpt2_model_act_bytes(const loom_gpt2_t *m, loom_gpt2_act_bytes_t *out)
{
	*out = m->act;
}

loom_act_ckpt_t loom_gpt2_act_ckpt(const loom_gpt2_t *m)
{
	return (loom_act_ckpt_t)m->act_ckpt;
}

int loom_gpt2_sequence_parallel(const loom_gpt2_t *m)
{
	return m->sp;
}

long long loom_gpt2_recomputes(const loom_gpt2_t *m)
{
	return m->recomputes;
}

void loom_gpt2_layers(const loom_gpt2_t *m, int *lo, int *hi, int *arenas)
{
	if (lo)
		*lo = m->lo;
	if (hi)
		*hi = m->hi;
	if (arenas)
		*arenas = m->narenas;
}

int loom_gpt2_create_opts(loom_gpt2_t **out, const loom_gpt2_config_t *cfg, const loom_gpt2_opts_t *o)
{
	loom_gpt2_t *m = NULL;
	int rc, B = o->B, T = o->T, tp = o->tp_size ? o->tp_size : 1;
	*out = NULL;
	if ((rc = check_opts(cfg, o)) != LOOM_OK)
		return rc;
	size_t want = sizeof *m; /* the allocation being attempted, for the message */
	if (!(m = loom__calloc(1, sizeof *m)))
		goto nomem;
	m->base.family = loom__gpt2_family();
	setup(m, cfg, o);
	int narenas = m->narenas, lo = m->lo, hi = m->hi;
	want = (size_t)m->ntensors * sizeof *m->tensors;
	if (!(m->tensors = loom__calloc((size_t)m->ntensors, sizeof *m->tensors)) ||
	    !(m->pview = loom__calloc((size_t)m->ntensors, sizeof *m->pview)) ||
	    !(m->gview = loom__calloc((size_t)m->ntensors, sizeof *m->gview)) ||
	    !(m->arenas = loom__calloc((size_t)narenas, sizeof *m->arenas)))
		goto nomem;
	for (int k = 0; k < narenas; k++)
		if (!(m->arenas[k].layers = loom__calloc((size_t)LOOM_MAX(hi - lo, 1), sizeof *m->arenas[k].layers)))
			goto nomem;
	for (int i = 0; i < m->ntensors; i++)
		loom_gpt2_shard_info(cfg, tp, i, &m->tensors[i]);
	want = m->nparams * sizeof(float);
	if ((!o->no_own_params && !(m->params_own = loom_alloc_aligned(m->nparams * sizeof(float)))) ||
	    (!o->no_own_grads && !(m->grads_own = loom_alloc_aligned(m->nparams * sizeof(float)))))
		goto nomem;
	point_params(m, m->params_own);
	point_grads(m, m->grads_own);
	size_t bytes = layout_acts(m, NULL, &m->act);
	want = bytes;
	if (bytes == SIZE_MAX) {
		loom_gpt2_destroy(m);
		return too_large(cfg, o);
	}
	if (!(m->mem = loom_alloc_aligned(bytes)))
		goto nomem;
	layout_acts(m, m->mem, &m->act);
	m->losses = m->has_head ? m->arenas[0].losses : NULL;
	loom__gemm_setup_threads();
	*out = m;
	return LOOM_OK;
nomem:
	loom_gpt2_destroy(m);
	return loom_seterr(LOOM_ENOMEM, "gpt2 create: out of memory for L%d C%d V%d with batch %d x %d, layers [%d, %d), "
	                   "%d arenas, activation checkpointing %s (%zu bytes requested; parameters and gradients take "
	                   "%zu bytes each)", cfg->n_layer, cfg->n_embd, cfg->vocab_size, B, T, o->layer_lo,
	                   o->layer_hi ? o->layer_hi : cfg->n_layer, o->arenas ? o->arenas : 1,
	                   loom_act_ckpt_name(o->act_ckpt), want, loom_gpt2_shard_params(cfg, tp) * sizeof(float));
}

int loom_gpt2_create(loom_gpt2_t **out, const loom_gpt2_config_t *cfg, int B, int T)
{
	loom_gpt2_opts_t o = {.B = B, .T = T};
	return loom_gpt2_create_opts(out, cfg, &o);
}

void loom_gpt2_destroy(loom_gpt2_t *m)
{
	if (!m)
		return;
	loom__gpt2_kv_cache_free(m);
	loom__gemm_ctx_free(&m->gemm);
	loom_free_aligned(m->mem);
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

const loom_gpt2_config_t *loom_gpt2_config(const loom_gpt2_t *m)
{
	return &m->cfg;
}

loom_compute_dtype_t loom_gpt2_dtype(const loom_gpt2_t *m)
{
	return (loom_compute_dtype_t)m->gemm.dtype;
}

const loom_tensor_info_t *loom_gpt2_tensors(const loom_gpt2_t *m, int *n)
{
	if (n)
		*n = m->ntensors;
	return m->tensors;
}

float *loom_gpt2_params(loom_gpt2_t *m)
{
	return m->params;
}

float *loom_gpt2_grads(loom_gpt2_t *m)
{
	return m->grads;
}

/* ---- views ------------------------------------------------------------------------------------- */

int loom_gpt2_set_grad_buffer(loom_gpt2_t *m, float *grads)
{
	if (!grads)
		return loom_seterr(LOOM_EINVAL, "gpt2 set_grad_buffer: NULL buffer");
	point_grads(m, grads);
	return LOOM_OK;
}

int loom_gpt2_own_grads(loom_gpt2_t *m)
{
	if (!m->grads_own && !(m->grads_own = loom_alloc_aligned(m->nparams * sizeof(float))))
		return loom_seterr(LOOM_ENOMEM, "gpt2 own_grads: out of memory for %zu gradients", m->nparams);
	point_grads(m, m->grads_own);
	return LOOM_OK;
}

int loom_gpt2_set_param_buffer(loom_gpt2_t *m, float *params)
{
	if (!params && !m->params_own && !(m->params_own = loom_alloc_aligned(m->nparams * sizeof(float))))
		return loom_seterr(LOOM_ENOMEM, "gpt2 set_param_buffer: out of memory for %zu parameters", m->nparams);
	point_params(m, params ? params : m->params_own);
	return LOOM_OK;
}

int loom_gpt2_set_tensor_view(loom_gpt2_t *m, int tensor, float *param, float *grad)
{
	if (tensor < 0 || tensor >= m->ntensors)
		return loom_seterr(LOOM_EINVAL, "gpt2 set_tensor_view: tensor %d out of range [0, %d)", tensor, m->ntensors);
	if (param)
		m->pview[tensor] = param;
	if (grad) {
		m->gview[tensor] = grad;
		m->grad_split = 1;
	}
	return LOOM_OK;
}

/* First and one-past-last tensor of unit u (-1 embeddings, 0..L-1 a block, L ln_f). */
static void unit_tensors(const loom_gpt2_t *m, int u, int *first, int *end)
{
	*first = u < 0 ? 0 : u < m->cfg.n_layer ? lt(u, 0) : m->ntensors - 2;
	*end = u < 0 ? 2 : u < m->cfg.n_layer ? lt(u + 1, 0) : m->ntensors;
}

int loom_gpt2_set_unit_view(loom_gpt2_t *m, int unit, float *params, float *grads)
{
	int first, end;
	if (unit < -1 || unit > m->cfg.n_layer)
		return loom_seterr(LOOM_EINVAL, "gpt2 set_unit_view: unit %d out of range [-1, %d]", unit, m->cfg.n_layer);
	unit_tensors(m, unit, &first, &end);
	size_t base = m->tensors[first].offset;
	for (int i = first; i < end; i++)
		loom_gpt2_set_tensor_view(m, i, params ? params + (m->tensors[i].offset - base) : NULL,
		                          grads ? grads + (m->tensors[i].offset - base) : NULL);
	return LOOM_OK;
}

float *loom_gpt2_tensor_param(loom_gpt2_t *m, int tensor)
{
	return tensor >= 0 && tensor < m->ntensors ? m->pview[tensor] : NULL;
}

float *loom_gpt2_tensor_grad(loom_gpt2_t *m, int tensor)
{
	return tensor >= 0 && tensor < m->ntensors ? m->gview[tensor] : NULL;
}

void loom_gpt2_on_grad_ready(loom_gpt2_t *m, loom_grad_ready_fn fn, void *ctx)
{
	m->on_ready = fn;
	m->on_ready_ctx = ctx;
}

void loom_gpt2_on_tp_reduce(loom_gpt2_t *m, loom_tp_reduce_fn fn, void *ctx)
{
	m->tp_reduce = fn;
	m->tp_ctx = ctx;
}

void loom_gpt2_on_cp_reduce(loom_gpt2_t *m, loom_tp_reduce_fn fn, void *ctx)
{
	m->cp_fn = fn;
	m->cp_ctx = ctx;
}

int loom_gpt2_cp_size(const loom_gpt2_t *m)
{
	return m->cp;
}

int loom_gpt2_cp_rank(const loom_gpt2_t *m)
{
	return m->cp_rank;
}

int loom_gpt2_tp_size(const loom_gpt2_t *m)
{
	return m->tp;
}

int loom_gpt2_tp_rank(const loom_gpt2_t *m)
{
	return m->tp_rank;
}

size_t loom_gpt2_param_count(const loom_gpt2_t *m)
{
	return m->nparams;
}

void loom_gpt2_on_param_use(loom_gpt2_t *m, loom_param_use_fn fn, void *ctx)
{
	m->on_use = fn;
	m->on_use_ctx = ctx;
}

void loom_gpt2_init(loom_gpt2_t *m, uint64_t seed)
{
	/* Each tensor draws from its own stream, seeded from (seed, tensor index): a tensor's values do
	 * not depend on the sizes of the tensors before it. */
	int n = loom_gpt2_num_tensors(&m->cfg);
	double proj_std = 0.02 / sqrt(2.0 * m->cfg.n_layer);
	for (int i = 0; i < n; i++) {
		loom_tensor_info_t ti;
		rng_t r;
		loom__tp_geom_t g;
		loom_gpt2_tensor_info(&m->cfg, i, &ti);
		float *p = loom__gpt2_param(m, i);
		if (!p)
			continue; /* no memory behind this tensor (a view not set yet) */
		if (loom__tp_geom(&ti, m->tp, &g)) { /* a shard: the whole tensor's draws, keeping ours */
			double std = strstr(ti.name, "c_proj.weight") ? proj_std : 0.02;
			memset(p, 0, m->tensors[i].numel * sizeof(float));
			if (ti.ndim == 1)
				continue; /* split biases start at 0 */
			rng_seed(&r, seed ^ (0x9e3779b97f4a7c15ULL * (uint64_t)(i + 1)));
			for (size_t k = 0; k < ti.numel; k++) {
				float v = (float)(std * rng_normal(&r));
				long j = loom__tp_local_index(&g, m->tp_rank, k);
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

/* ---- checks ------------------------------------------------------------------------------------ */

int loom__gpt2_check_tokens(const loom_gpt2_t *m, const int *ids, int B, int T, const char *what)
{
	int V = m->cfg.vocab_size;
	if (!ids)
		return loom_seterr(LOOM_EINVAL, "gpt2: %s is NULL", what);
	for (int i = 0; i < B * T; i++)
		if (ids[i] < 0 || ids[i] >= V)
			return loom_seterr(LOOM_EINVAL, "gpt2: token id %d at %s[b=%d][t=%d] is outside the vocabulary [0, %d)",
			                   ids[i], what, i / T, i % T, V);
	return LOOM_OK;
}

static int check_size(const loom_gpt2_t *m, int B, int T, const char *op)
{
	if (B <= 0 || T <= 0 || B > m->B || T > m->T)
		return loom_seterr(LOOM_EINVAL, "gpt2 %s: batch %d x %d tokens does not fit the model's %d x %d (from create)",
		                   op, B, T, m->B, m->T);
	if (m->sp && (B * T) % m->tp != 0)
		return loom_seterr(LOOM_EINVAL, "gpt2 %s: sequence parallelism: the %d x %d positions are not divisible by "
		                   "tp = %d", op, B, T, m->tp);
	if (m->cp > 1 && T % 2 != 0)
		return loom_seterr(LOOM_EINVAL, "gpt2 %s: context parallel: %d rows of each sequence are not two equal "
		                   "chunks (an even number is needed)", op, T);
	return LOOM_OK;
}

static int check_whole(const loom_gpt2_t *m, const char *op)
{
	if (!m->has_embed || !m->has_head)
		return loom_seterr(LOOM_EINVAL, "gpt2 %s: needs every layer, the model holds blocks [%d, %d) of %d", op, m->lo,
		                   m->hi, m->cfg.n_layer);
	return LOOM_OK;
}


static int check_block(const loom_gpt2_t *m, int l, const char *op)
{
	if (l < m->lo || l >= m->hi)
		return loom_seterr(LOOM_EINVAL, "gpt2 %s: block %d is not held (blocks [%d, %d))", op, l, m->lo, m->hi);
	return LOOM_OK;
}

/* Arena mb, unit (-1 embedding, a held block, L head) and size of a unit call. */
static int check_unit(const loom_gpt2_t *m, int mb, int unit, int B, int T, const char *op)
{
	int L = m->cfg.n_layer;
	if (mb < 0 || mb >= m->narenas)
		return loom_seterr(LOOM_EINVAL, "gpt2 %s: arena %d out of range [0, %d)", op, mb, m->narenas);
	if (unit < 0 && !m->has_embed)
		return loom_seterr(LOOM_EINVAL, "gpt2 %s: the model does not hold the embedding (blocks [%d, %d))", op, m->lo,
		                   m->hi);
	if (unit >= L && !m->has_head)
		return loom_seterr(LOOM_EINVAL, "gpt2 %s: the model does not hold the head (blocks [%d, %d) of %d)", op,
		                   m->lo, m->hi, L);
	if (m->tp > 1 && !m->tp_reduce)
		return loom_seterr(LOOM_EINVAL, "gpt2 %s: tensor-parallel rank %d of %d has no reduction "
		                   "(loom_gpt2_on_tp_reduce)", op, m->tp_rank, m->tp);
	if (m->cp > 1 && !m->cp_fn)
		return loom_seterr(LOOM_EINVAL, "gpt2 %s: context-parallel rank %d of %d has no gather "
		                   "(loom_gpt2_on_cp_reduce)", op, m->cp_rank, m->cp);
	return check_size(m, B, T, op);
}

static int check_call(const loom_gpt2_t *m, const int *inputs, const int *targets, int B, int T, const char *op)
{
	int rc;
	if ((rc = check_whole(m, op)) != LOOM_OK || (rc = check_unit(m, 0, 0, B, T, op)) != LOOM_OK)
		return rc;
	if (m->tp > 1 && !targets)
		return loom_seterr(LOOM_EINVAL, "gpt2 %s: a tensor-parallel model computes losses only (its logits are split "
		                   "across ranks); load the checkpoint into a whole model to sample", op);
	if (m->cp > 1 && !targets)
		return loom_seterr(LOOM_EINVAL, "gpt2 %s: a context-parallel model computes losses only (it holds chunks "
		                   "of each sequence); load the checkpoint into a whole model to sample", op);
	if ((rc = loom__gpt2_check_tokens(m, inputs, B, T, "inputs")) != LOOM_OK)
		return rc;
	if (targets && (rc = loom__gpt2_check_tokens(m, targets, B, T, "targets")) != LOOM_OK)
		return rc;
	return LOOM_OK;
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
	if (m->on_use)
		PROF(CALLBACK, m->on_use(m->on_use_ctx, unit, phase));
}

static void ready(loom_gpt2_t *m, int i)
{
	if (m->on_ready)
		PROF(CALLBACK, m->on_ready(m->on_ready_ctx, i));
}

static void zero_par(float *p, size_t n)
{
	const size_t block = 16384;
#pragma omp parallel for schedule(static) if (n >= 4 * block)
	for (size_t i = 0; i < n; i += block)
		memset(p + i, 0, sizeof(float) * (n - i < block ? n - i : block));
}

static void zero(loom_gpt2_t *m, float *p, size_t n)
{
	PROF(ZERO, zero_par(p, n));
}

/* The residual stream in front of block l, l in [lo, hi] (hi: the head's input). */
static float *stream(const loom_gpt2_t *m, const arena_t *ar, int l)
{
	return l == m->lo ? ar->in : ar->layers[l - 1 - m->lo].res3;
}

/* Sequence parallelism: between the tensor-parallel regions a rank computes on rows [row0, row0 + N/tp)
 * of the N positions (all of them without it: row0 0). */
static size_t sp_row0(const loom_gpt2_t *m, int N)
{
	return m->sp ? (size_t)m->tp_rank * (size_t)(N / m->tp) : 0;
}

/* The rows of the N this rank's LayerNorms and residual adds run on. */
static int sp_rows(const loom_gpt2_t *m, int N)
{
	return m->sp ? N / m->tp : N;
}

/* Block l's input and output on the rows this rank computes. With sequence parallelism block lo's
 * input and block hi-1's output are whole-sized buffers, the others hold this rank's rows only; block
 * lo's input is whole after the embedding, but a later pipeline stage receives only this rank's rows
 * of it, and block hi-1's output is gathered whole only for a head on the same stage (a next stage
 * takes this rank's rows: the pipeline passes each tp rank's rows to the same tp rank). */
static float *block_in(const loom_gpt2_t *m, const arena_t *ar, int l, int N)
{
	return l == m->lo ? ar->in + sp_row0(m, N) * m->cfg.n_embd : stream(m, ar, l);
}

/* The summed losses of n positions over all N of the batch (n = N: the mean). */
static float mean_loss(const float *losses, int n, int N)
{
	double s = 0.0;
	for (int i = 0; i < n; i++)
		s += losses[i];
	return (float)(s / N);
}

static void embed_forward(loom_gpt2_t *m, arena_t *ar, const int *inputs, int B, int T)
{
	loom__gpt2_param_use(m, -1, 0);
	if (m->tp > 1) {
		loom__tp_embed_forward(m, ar->in, inputs, B, T);
		return;
	}
	if (m->cp > 1) { /* each of the rows' chunks of every sequence with the wpe rows of its positions */
		int C = m->cfg.n_embd, K = loom__cp_chunks_memo(&m->cfg, m->cp, T, &m->cp_T, &m->cp_K), c = T / K;
		for (int b = 0; b < B; b++)
			for (int h = 0; h < K; h++) {
				size_t row = (size_t)b * T + (size_t)h * c;
				size_t p0 = (size_t)loom__cp_pos(h * c, T, m->cp, m->cp_rank, K);
				PROF(ENCODER, loom__encoder_forward(ar->in + row * C, inputs + row, loom__gpt2_param(m, 0),
				                                    loom__gpt2_param(m, 1) + p0 * C, 1, c, C));
			}
		return;
	}
	PROF(ENCODER, loom__encoder_forward(ar->in, inputs, loom__gpt2_param(m, 0), loom__gpt2_param(m, 1), B, T,
	                                    m->cfg.n_embd));
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
	size_t o = sp_row0(m, N) * C;
	memcpy(m->sp_gather + o, x, (size_t)(N / m->tp) * C * sizeof(float));
	loom__tp_reduce(m, m->sp_gather, (size_t)N * C, LOOM_TP_ALLGATHER);
	return m->sp_gather;
}

/* g (forward): part (N,C) this rank's part of a row-parallel product (overwritten); reduce-scatter it
 * and add the replicated bias and the residual on this rank's rows: out (N/tp,C) = res + (sum + bias). */
static void sp_scatter_bias_res(loom_gpt2_t *m, float *out, float *part, const float *bias, const float *res, int N,
                                int C)
{
	int Ns = N / m->tp;
	const float *p = part + sp_row0(m, N) * C;
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
	if (!m->sp) {
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
	double keys = m->cp <= 1 ? (double)T * (T + 1) / 2.0
	                         : loom__cp_rank_keys(m->cp * T, m->cp, loom__cp_chunks_memo(&m->cfg, m->cp, T, &m->cp_T,
	                                                                                    &m->cp_K), m->cp_rank, -1);
	return k * B * C * keys;
}

/* Context parallel: the attention's group, form, hook and scratch. */
static loom__cp_t cp_of(loom_gpt2_t *m, int T)
{
	loom__cp_t cp = {.N = m->cp, .r = m->cp_rank, .K = loom__cp_chunks_memo(&m->cfg, m->cp, T, &m->cp_T, &m->cp_K),
	                 .ring = m->cp_ring, .fn = m->cp_fn, .ctx = m->cp_ctx, .mem = m->cp_mem, .scratch = m->att_scratch,
	                 .scratch_threads = m->att_threads};
	return cp;
}

/* The attention of a block's rows: one process's kernel, or with context parallelism the group's (the
 * keys and values of the whole sequence gathered; a failure of the hook is the pass's error). */
static void attention_forward(loom_gpt2_t *m, layer_acts_t *a, int B, int T)
{
	if (m->cp <= 1) {
		loom__attention_forward(a->atty, a->lse, a->qkv, B, T, m->Cl, m->NHl);
		return;
	}
	if (m->tp_err)
		return;
	loom__cp_t cp = cp_of(m, T);
	loom__flash_t f = loom__attention_shape(a->qkv, B, T, m->Cl, m->NHl);
	m->tp_err = loom__cp_attention_forward(&cp, &f, a->atty, m->Cl, a->lse);
}

static void attention_backward(loom_gpt2_t *m, layer_acts_t *a, int B, int T)
{
	int Cl = m->Cl;
	if (m->cp <= 1) {
		loom__attention_backward(m->dqkv, m->att_scratch, m->att_threads, m->dbtc, a->qkv, a->atty, a->lse, B, T, Cl,
		                         m->NHl);
		return;
	}
	if (m->tp_err)
		return;
	loom__cp_t cp = cp_of(m, T);
	loom__flash_t f = loom__attention_shape(a->qkv, B, T, Cl, m->NHl);
	m->tp_err = loom__cp_attention_backward(&cp, &f, m->dqkv, 3 * Cl, m->dqkv + Cl, m->dqkv + 2 * Cl, 3 * Cl, m->dbtc,
	                                        Cl, a->atty, Cl, a->lse);
}

static float *block_out(const loom_gpt2_t *m, layer_acts_t *a, int l, int N)
{
	return l == m->hi - 1 ? a->res3 + sp_row0(m, N) * m->cfg.n_embd : a->res3;
}

/* With tensor parallelism (tp > 1) the same pass on the local heads (Cl = C/tp channels, NHl heads)
 * and MLP columns (4 Cl): attn.c_attn and mlp.c_fc are column-parallel (local outputs), attn.c_proj
 * and mlp.c_proj row-parallel (partial sums, reduced before their bias); with tp 1, Cl = C. With
 * sequence parallelism res, out and the LayerNorms hold this rank's N/tp rows: their outputs are
 * all-gathered for the column-parallel matmuls, the row-parallel products reduce-scattered. */
static void block_forward_acts(loom_gpt2_t *m, int l, layer_acts_t *a, const float *res, float *out, int B, int T,
                               int whole)
{
	int C = m->cfg.n_embd, N = B * T, Cl = m->Cl, tp = m->tp, sp = m->sp, Nl = sp_rows(m, N);
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

static void block_forward(loom_gpt2_t *m, arena_t *ar, int l, int B, int T)
{
	layer_acts_t *a = &ar->layers[l - m->lo];
	int N = B * T;
	loom__gpt2_param_use(m, l, 0);
	block_forward_acts(m, l, a, block_in(m, ar, l, N), block_out(m, a, l, N), B, T, 1);
	if (m->sp && l == m->hi - 1 && m->has_head) /* the head's input is whole; a next stage's is not */
		loom__tp_reduce(m, a->res3, (size_t)N * m->cfg.n_embd, LOOM_TP_ALLGATHER);
}

/* A stage of the head alone (no block) under sequence parallelism receives this rank's rows of its
 * input (see block_in): gathered whole, as the head reads every row (with the head's positions shared
 * with the stage before, rows it does not compute may be stale: it never reads them). */
static void head_input(loom_gpt2_t *m, arena_t *ar, int N)
{
	if (m->sp && m->lo == m->hi && !m->has_embed)
		loom__tp_reduce(m, ar->in, (size_t)N * m->cfg.n_embd, LOOM_TP_ALLGATHER);
}

/* ln_f forward on rows [r0, r0 + n) of the stream. */
static void lnf_forward(loom_gpt2_t *m, arena_t *ar, int r0, int n)
{
	int nt = m->ntensors;
	size_t C = (size_t)m->cfg.n_embd, o = (size_t)r0 * C;
	PROF(LAYERNORM, loom__layernorm_forward(ar->lnf + o, ar->lnf_mean + r0, ar->lnf_rstd + r0,
	                                        stream(m, ar, m->hi) + o, loom__gpt2_param(m, nt - 2),
	                                        loom__gpt2_param(m, nt - 1), n, (int)C));
}

static void head_forward(loom_gpt2_t *m, arena_t *ar, const int *targets, int B, int T, float *loss)
{
	int C = m->cfg.n_embd, V = m->cfg.vocab_size;
	loom__gpt2_param_use(m, m->cfg.n_layer, 0);
	head_input(m, ar, B * T);
	lnf_forward(m, ar, 0, B * T);
	const float *wte = loom__gpt2_param(m, 0);
	if (targets && m->tp > 1) {
		loom__tp_classifier(m, ar->losses, NULL, NULL, ar->lnf, wte, targets, 0.0f, B * T);
		if (loss)
			*loss = mean_loss(ar->losses, B * T, B * T);
	} else if (targets) {
		PROFF(CLASSIFIER, 2.0 * B * T * C * V,
		      loom__classifier_forward_backward(ar->losses, NULL, NULL, m->logits, m->chunk, ar->lnf, wte, targets,
		                                        0.0f, B * T, C, V));
		if (loss)
			*loss = mean_loss(ar->losses, B * T, B * T);
	} else {
		/* rows b*T + T-1 of lnf are T*C floats apart */
		PROFF(CLASSIFIER, 2.0 * B * C * V,
		      loom__gemm(0, 1, B, V, C, 1.0f, ar->lnf + (size_t)(T - 1) * C, T * C, wte, C, 0.0f, m->last_logits, V));
	}
}

/* ln_f forward, then the lm head, softmax, cross-entropy and their backward (dlnf into dbtc, wte's
 * first share), then ln_f's backward into dres, on rows [r0, r0 + n) of the N = B T positions (all of
 * them for a whole model; a part when a pipeline splits the head's positions between two stages):
 * gradients scaled by grad_scale / N, *loss the rows' summed losses / N (so the parts of a split add
 * up to the mean), dres written on those rows only. */
static void head_forward_backward(loom_gpt2_t *m, arena_t *ar, const int *targets, int N, int r0, int n,
                                  float grad_scale, float *loss)
{
	int C = m->cfg.n_embd, V = m->cfg.vocab_size, nt = m->ntensors;
	size_t nC = (size_t)n * C, o = (size_t)r0 * C;
	double fn = n, fC = C; /* for the flop counts */
	loom__gpt2_param_use(m, m->cfg.n_layer, 0);
	loom__gpt2_param_use(m, m->cfg.n_layer, 1);
	head_input(m, ar, N);
	lnf_forward(m, ar, r0, n);
	zero(m, m->dbtc + o, nC);
	if (m->tp > 1)
		loom__tp_classifier(m, ar->losses + r0, m->dbtc + o, loom__gpt2_grad(m, 0), ar->lnf + o,
		                    loom__gpt2_param(m, 0), targets + r0, grad_scale / (float)N, n);
	else
		PROFF(CLASSIFIER, 6 * fn * fC * V,
		      loom__classifier_forward_backward(ar->losses + r0, m->dbtc + o, loom__gpt2_grad(m, 0), m->logits,
		                                        m->chunk, ar->lnf + o, loom__gpt2_param(m, 0), targets + r0,
		                                        grad_scale / (float)N, n, C, V));
	if (loss)
		*loss = mean_loss(ar->losses + r0, n, N);
	zero(m, m->dres + o, nC);
	PROF(LAYERNORM_BWD, loom__layernorm_backward(m->dres + o, loom__gpt2_grad(m, nt - 2), loom__gpt2_grad(m, nt - 1),
	                                             m->dbtc + o, stream(m, ar, m->hi) + o, loom__gpt2_param(m, nt - 2),
	                                             ar->lnf_mean + r0, ar->lnf_rstd + r0, n, C));
	ready(m, nt - 1);
	ready(m, nt - 2);
	if (!m->has_embed)
		ready(m, 0); /* this model adds nothing else to wte */
}

/* Activation checkpointing: refill what block l's forward left in the shared scratch (since
 * overwritten by other blocks and arenas) from what the arena kept, with the forward's own kernels,
 * so the backward reads the bits the forward computed. Runs after the block's backward param-use
 * hook: the parameters are the ones its forward used. */
static void recompute(loom_gpt2_t *m, int l, layer_acts_t *a, const float *res_in, int B, int T)
{
	if (m->act_ckpt == LOOM_ACT_CKPT_BLOCKS)
		block_forward_acts(m, l, a, res_in, NULL, B, T, 0);
	else if (m->act_ckpt == LOOM_ACT_CKPT_SELECTIVE)
		PROFF(ATTENTION_RECOMPUTE, causal_flops(4.0, B, T, m->Cl, m), attention_forward(m, a, B, T));
	else
		return;
	m->recomputes++;
}

/* With sequence parallelism m->dres is a whole (N,C) buffer of which this rank's rows are current
 * between the blocks: it is all-gathered where a row-parallel matmul's backward needs the whole
 * gradient (g's conjugate), the column-parallel matmuls' input gradients are reduce-scattered onto
 * this rank's rows (f's conjugate), and after block lo it is gathered whole for the embedding (a
 * previous pipeline stage takes this rank's rows, which are all its block hi-1 reads). */
static void block_backward(loom_gpt2_t *m, arena_t *ar, int l, int B, int T)
{
	int C = m->cfg.n_embd, N = B * T, Cl = m->Cl, tp = m->tp, sp = m->sp, Nl = sp_rows(m, N);
	size_t NC = (size_t)N * C, NCl = (size_t)N * Cl, o = sp_row0(m, N) * C;
	double fN = N, fC = C, fCl = Cl; /* for the flop counts */
	layer_acts_t *a = &ar->layers[l - m->lo];
	const float *res_in = block_in(m, ar, l, N), *x;
	float *dres = m->dres + o, *dx; /* this rank's rows of the stream gradient */
	loom__gpt2_param_use(m, l, 1);
	recompute(m, l, a, res_in, B, T);
#define W(j) loom__gpt2_param(m, lt(l, j))
#define G(j) loom__gpt2_grad(m, lt(l, j))
	/* MLP: res3 = res2 + fc_proj(gelu(fc(ln2(res2)))); dres is d res3 and passes through to d res2 */
	if (sp)
		loom__tp_reduce(m, m->dres, NC, LOOM_TP_ALLGATHER);
	zero(m, m->d4a, NCl * 4);
	PROFF(MATMUL_BWD, 16 * fN * fC * fCl,
	      loom__matmul_backward(m->d4a, G(FCPROJ_W), G(FCPROJ_B), m->dres, a->fch_gelu, W(FCPROJ_W), N, 4 * Cl, C));
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
		loom__tp_reduce(m, m->dres, NC, LOOM_TP_ALLGATHER);
	zero(m, m->dbtc, NCl);
	PROFF(MATMUL_BWD, 4 * fN * fC * fCl,
	      loom__matmul_backward(m->dbtc, G(ATTPROJ_W), G(ATTPROJ_B), m->dres, a->atty, W(ATTPROJ_W), N, Cl, C));
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
	if (sp && l == m->lo && m->has_embed) /* the embedding's gradient is whole; a previous stage's is not */
		loom__tp_reduce(m, m->dres, NC, LOOM_TP_ALLGATHER);
#undef W
#undef G
}

static void embed_backward(loom_gpt2_t *m, const int *inputs, int B, int T)
{
	loom__gpt2_param_use(m, -1, 1);
	if (m->tp > 1) {
		loom__tp_embed_backward(m, m->dres, inputs, B, T);
	} else if (m->cp > 1) {
		int C = m->cfg.n_embd, K = loom__cp_chunks_memo(&m->cfg, m->cp, T, &m->cp_T, &m->cp_K), c = T / K;
		for (int b = 0; b < B; b++)
			for (int h = 0; h < K; h++) {
				size_t row = (size_t)b * T + (size_t)h * c;
				size_t p0 = (size_t)loom__cp_pos(h * c, T, m->cp, m->cp_rank, K);
				PROF(ENCODER_BWD, loom__encoder_backward(loom__gpt2_grad(m, 0), loom__gpt2_grad(m, 1) + p0 * C,
				                                         m->dres + row * C, inputs + row, 1, c, C));
			}
	} else
		PROF(ENCODER_BWD, loom__encoder_backward(loom__gpt2_grad(m, 0), loom__gpt2_grad(m, 1), m->dres, inputs, B,
		                                         T, m->cfg.n_embd));
	ready(m, 1);
	ready(m, 0);
}

/* ---- public unit calls ------------------------------------------------------------------------- */

/* LOOM_OK, or the first failure of a tensor-parallel reduction during the pass (then cleared; its
 * message is the reduction's). */
static int tp_status(loom_gpt2_t *m)
{
	int rc = m->tp_err, grc = loom__gemm_status(&m->gemm); /* and the first bf16 GEMM failure */
	m->tp_err = 0;
	return rc ? rc : grc;
}

int loom_gpt2_embed_forward(loom_gpt2_t *m, int mb, const int *inputs, int B, int T)
{
	int rc;
	if ((rc = check_unit(m, mb, -1, B, T, "embed_forward")) != LOOM_OK ||
	    (rc = loom__gpt2_check_tokens(m, inputs, B, T, "inputs")) != LOOM_OK)
		return rc;
	loom__gemm_setup(&m->gemm);
	embed_forward(m, &m->arenas[mb], inputs, B, T);
	return tp_status(m);
}

int loom_gpt2_block_forward(loom_gpt2_t *m, int mb, int l, int B, int T)
{
	int rc;
	if ((rc = check_block(m, l, "block_forward")) != LOOM_OK ||
	    (rc = check_unit(m, mb, l, B, T, "block_forward")) != LOOM_OK)
		return rc;
	loom__gemm_setup(&m->gemm);
	block_forward(m, &m->arenas[mb], l, B, T);
	return tp_status(m);
}

int loom_gpt2_head_forward(loom_gpt2_t *m, int mb, const int *targets, int B, int T, float *loss)
{
	int rc;
	if ((rc = check_unit(m, mb, m->cfg.n_layer, B, T, "head_forward")) != LOOM_OK ||
	    (targets && (rc = loom__gpt2_check_tokens(m, targets, B, T, "targets")) != LOOM_OK))
		return rc;
	if ((m->tp > 1 || m->cp > 1) && !targets)
		return loom_seterr(LOOM_EINVAL, "gpt2 head_forward: a %s-parallel model computes losses only",
		                   m->tp > 1 ? "tensor" : "context");
	loom__gemm_setup(&m->gemm);
	head_forward(m, &m->arenas[mb], targets, B, T, loss);
	return tp_status(m);
}

int loom_gpt2_head_forward_backward(loom_gpt2_t *m, int mb, const int *targets, int B, int T, float grad_scale,
                                    float *loss)
{
	int rc;
	if ((rc = check_unit(m, mb, m->cfg.n_layer, B, T, "head_forward_backward")) != LOOM_OK ||
	    (rc = loom__gpt2_check_tokens(m, targets, B, T, "targets")) != LOOM_OK)
		return rc;
	loom__gemm_setup(&m->gemm);
	head_forward_backward(m, &m->arenas[mb], targets, B * T, 0, B * T, grad_scale, loss);
	return tp_status(m);
}

int loom_gpt2_head_forward_backward_rows(loom_gpt2_t *m, int mb, const int *targets, int B, int T, int row0,
                                         int rows, float grad_scale, float *loss)
{
	int rc;
	if ((rc = check_unit(m, mb, m->cfg.n_layer, B, T, "head_forward_backward_rows")) != LOOM_OK)
		return rc;
	if (row0 < 0 || rows < 1 || row0 > B * T - rows)
		return loom_seterr(LOOM_EINVAL, "gpt2 head_forward_backward_rows: rows [%d, %d) of a batch of %d x %d "
		                   "positions (expected 0 <= row0 < row0 + rows <= %d)", row0, row0 + rows, B, T, B * T);
	if (!targets)
		return loom_seterr(LOOM_EINVAL, "gpt2 head_forward_backward_rows: targets are NULL");
	if ((rc = loom__gpt2_check_tokens(m, targets + row0, 1, rows, "targets")) != LOOM_OK)
		return rc;
	loom__gemm_setup(&m->gemm);
	head_forward_backward(m, &m->arenas[mb], targets, B * T, row0, rows, grad_scale, loss);
	return tp_status(m);
}

int loom_gpt2_block_backward(loom_gpt2_t *m, int mb, int l, int B, int T)
{
	int rc;
	if ((rc = check_block(m, l, "block_backward")) != LOOM_OK ||
	    (rc = check_unit(m, mb, l, B, T, "block_backward")) != LOOM_OK)
		return rc;
	loom__gemm_setup(&m->gemm);
	block_backward(m, &m->arenas[mb], l, B, T);
	return tp_status(m);
}

int loom_gpt2_embed_backward(loom_gpt2_t *m, int mb, const int *inputs, int B, int T)
{
	int rc;
	if ((rc = check_unit(m, mb, -1, B, T, "embed_backward")) != LOOM_OK ||
	    (rc = loom__gpt2_check_tokens(m, inputs, B, T, "inputs")) != LOOM_OK)
		return rc;
	loom__gemm_setup(&m->gemm);
	embed_backward(m, inputs, B, T);
	return tp_status(m);
}

float *loom_gpt2_block_input(loom_gpt2_t *m, int mb, int l)
{
	if (mb < 0 || mb >= m->narenas || l < m->lo || l > m->hi)
		return NULL;
	return stream(m, &m->arenas[mb], l);
}

float *loom_gpt2_stream_grad(loom_gpt2_t *m)
{
	return m->dres;
}

/* ---- the whole model ----------------------------------------------------------------------------- */

int loom_gpt2_forward(loom_gpt2_t *m, const int *inputs, const int *targets, int B, int T, float *loss)
{
	int rc;
	arena_t *ar = &m->arenas[0];
	if ((rc = check_call(m, inputs, targets, B, T, "forward")) != LOOM_OK)
		return rc;
	loom__gemm_setup(&m->gemm);
	embed_forward(m, ar, inputs, B, T);
	for (int l = 0; l < m->cfg.n_layer; l++)
		block_forward(m, ar, l, B, T);
	head_forward(m, ar, targets, B, T, loss);
	return tp_status(m);
}

const float *loom_gpt2_logits(const loom_gpt2_t *m)
{
	return m->last_logits;
}

void loom_gpt2_zero_grad(loom_gpt2_t *m)
{
	if (!m->grad_split) {
		if (m->grads)
			zero_par(m->grads, m->nparams);
		return;
	}
	for (int i = 0; i < m->ntensors; i++)
		if (m->gview[i])
			zero_par(m->gview[i], m->tensors[i].numel);
}

int loom_gpt2_forward_backward(loom_gpt2_t *m, const int *inputs, const int *targets, int B, int T,
                               float grad_scale, float *loss)
{
	int rc, L = m->cfg.n_layer;
	arena_t *ar = &m->arenas[0];
	if (!targets)
		return loom_seterr(LOOM_EINVAL, "gpt2 forward_backward: targets are NULL");
	if ((rc = check_call(m, inputs, targets, B, T, "forward_backward")) != LOOM_OK)
		return rc;
	loom__gemm_setup(&m->gemm);
	embed_forward(m, ar, inputs, B, T);
	for (int l = 0; l < L; l++)
		block_forward(m, ar, l, B, T);
	head_forward_backward(m, ar, targets, B * T, 0, B * T, grad_scale, loss);
	for (int l = L - 1; l >= 0; l--)
		block_backward(m, ar, l, B, T);
	embed_backward(m, inputs, B, T);
	return tp_status(m);
}
