/* model.h: the GPT-2 model's internal state, shared by gpt2.c (training passes), generate.c (KV-cache
 * sampling) and profile.c (per-kernel timing). Not part of the public API.
 *
 * Kernels reach tensors only through the views pview/gview (one pointer each per tensor), which is
 * what lets a caller point them at a shard, a gathered buffer or a shared-memory bucket. */
#ifndef LOOM_MODEL_MODEL_H
#define LOOM_MODEL_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "loom/gpt2.h"
#include "model/kernels.h"

/* GPT-2's family table (gpt2_family.c). */
const loom_model_family_t *loom__gpt2_family(void);
/* The family's tp_copy_tensor (tp_model.c). */
void loom__gpt2_tp_copy_tensor(const loom_model_config_t *cfg, int tp, int r, int i, float *full, float *shard,
                               int to_shard);
/* loom_model_unit_flops' count from the parameter table (6 x the unit's matmul parameters, + for a block
 * loom_model_block_attn_flops: its causal, windowed attention), which a family's own unit_flops must
 * equal (tests/test_plan.c checks GPT-2's). */
double loom__model_unit_flops_table(const loom_model_config_t *cfg, int unit, int T);

/* Kernels timed by loom_gpt2_profile, in report order. */
#define LOOM_PROF_KERNELS(X)                                                                      \
	X(ENCODER, "encoder_forward")                                                                 \
	X(LAYERNORM, "layernorm_forward")                                                             \
	X(MATMUL, "matmul_forward")                                                                   \
	X(ATTENTION, "attention_forward")                                                             \
	X(GELU, "gelu_forward")                                                                       \
	X(RESIDUAL, "residual_forward")                                                               \
	X(CLASSIFIER, "classifier (lm head + softmax + CE, fwd+bwd)")                                 \
	X(MATMUL_BWD, "matmul_backward")                                                              \
	X(ATTENTION_BWD, "attention_backward")                                                        \
	X(ATTENTION_RECOMPUTE, "attention_forward (selective recompute)")                             \
	X(GELU_BWD, "gelu_backward")                                                                  \
	X(LAYERNORM_BWD, "layernorm_backward")                                                        \
	X(ENCODER_BWD, "encoder_backward")                                                            \
	X(ZERO, "zeroing scratch gradients")                                                          \
	X(CALLBACK, "grad-ready callbacks")                                                           \
	X(TP_REDUCE, "tensor-parallel reductions")

enum {
#define PROF_ENUM_(name, text) PROF_##name,
	LOOM_PROF_KERNELS(PROF_ENUM_)
#undef PROF_ENUM_
	PROF_COUNT
};

/* Activations of one layer kept for the backward; rows are the B*T positions of the current call. */
typedef struct {
	/* with sequence parallelism, ln1, res2, ln2 and res3 and the statistics have N/tp rows (res3 N of
	 * the last block held: the head's or the next stage's input) */
	float *ln1, *ln1_mean, *ln1_rstd; /* (N,C), (N), (N) */
	float *qkv;                       /* (N,3C) */
	float *lse;                       /* (B,NH,T) log-sum-exp of each attention row */
	float *atty;                      /* (N,C) attention output before c_proj */
	float *res2;                      /* (N,C) residual after attention */
	float *ln2, *ln2_mean, *ln2_rstd;
	float *fch, *fch_gelu; /* (N,4C) */
	float *res3;           /* (N,C) residual after the MLP: the layer's output */
} layer_acts_t;

/* One micro-batch's activations: the input of the first block held, each held block's, and the
 * head's when the model holds it. With activation checkpointing some of a layer's pointers point
 * into the model's shared recompute scratch instead of memory of their own (blocks: every field but
 * res3; selective: atty and lse), which the block's backward refills before it reads them (gpt2.c). */
typedef struct {
	float *in;                        /* (N,C) input of block lo: the embedding's output or a received one */
	layer_acts_t *layers;             /* hi - lo: block l at layers[l - lo] */
	float *lnf, *lnf_mean, *lnf_rstd; /* (N,C), (N), (N); head only */
	float *losses;                    /* (N); head only */
} arena_t;

/* The sampling KV cache (generate.c): each layer's q, k, v of every position so far, and scratch for
 * one layer's forward over up to T positions, reused layer after layer. */
typedef struct {
	float **qkv;          /* L of (T,3C): the cache proper */
	layer_acts_t scratch; /* every field but qkv and res3, for one layer */
	float *res[2];        /* (T,C) each: the residual stream, layer inputs and outputs alternating */
	float *lnf, *lnf_mean, *lnf_rstd;
	float *logits; /* (V) of the newest position */
	float *topk;   /* (V) scratch of top-k selection */
	void *mem;
} kv_cache_t;

struct loom_gpt2 {
	loom_model_t base; /* first: the family (loom/model.h); a loom_gpt2_t * is a loom_model_t * */
	loom_gpt2_config_t cfg;
	int B, T;   /* capacity of one arena given at create */
	int lo, hi; /* blocks held: [lo, hi) */
	int has_embed, has_head;
	int narenas;
	size_t nparams;
	int ntensors;
	loom_tensor_info_t *tensors; /* the table, ntensors entries */
	float *params;               /* the last whole parameter buffer set: params_own or the caller's */
	float *grads;                /* the same for gradients */
	float *params_own, *grads_own;
	float **pview, **gview; /* ntensors each: tensor i's parameters and gradient now */
	int grad_split;         /* some gradient view was set on its own since the last whole buffer */

	arena_t *arenas;
	float *losses; /* arena 0's losses, when the model holds the head */

	/* activation checkpointing (loom_act_ckpt_t): what the arenas keep; the recompute scratch's
	 * buffers are reached through the layers' pointers */
	int act_ckpt;
	long long recomputes;         /* recomputations run since create */
	loom_gpt2_act_bytes_t act;    /* the layout's byte counts, by role */

	/* shared by all arenas: head scratch and outputs */
	float *logits;      /* (chunk,V) scratch of the fused classifier, >= V floats */
	float *last_logits; /* (B,V) logits of the last position of each row */
	int chunk;          /* positions per classifier chunk */

	/* backward scratch, shared by all arenas (one micro-batch's backward at a time) */
	float *dres;        /* (N,C) gradient of the residual stream */
	float *dbtc;        /* (N,C) */
	float *dqkv;        /* (N,3C) */
	float *d4a, *d4b;   /* (N,4C) */
	float *att_scratch; /* the attention backward's dK/dV partials (loom__attention_scratch_floats) */
	int att_threads;    /* threads att_scratch has room for */

	/* tensor parallelism (tp_model.c): this rank's shard sizes; with tp 1 they are the whole model's */
	int tp, tp_rank;
	int Cl, NHl;          /* local channels of attention (C/tp) and heads (NH/tp); 4*Cl is the MLP's */
	int Vl, Vv, v0;       /* wte rows held (padded vocabulary / tp), of which valid, first vocab id */
	float *tp_stats;      /* (3*chunk) per-position reduction scratch of the vocab-parallel loss */
	loom_tp_reduce_fn tp_reduce;
	void *tp_ctx;
	/* sequence parallelism (Megatron-SP, gpt2.c): the residual stream between a block's tensor-parallel
	 * regions (res2, res3, ln1, ln2 and their statistics) holds this rank's rows [tp_rank N/tp,
	 * (tp_rank+1) N/tp) only; the stream at a unit boundary (block lo's input, block hi-1's output, the
	 * head and dres after the blocks) stays whole */
	int sp;
	float *sp_gather; /* (N,C) a LayerNorm output gathered for a matmul: d4a when tp <= 4 (unused then) */
	float *sp_lng;    /* (2C) one LayerNorm's weight and bias gradient of the local rows, before the sum */
	int tp_err;           /* first error of a reduction (tp or cp) in the current pass */
	/* context parallelism (cp_attention.c): this rank's place, the group's hook, the attention's gather
	 * scratch (loom__cp_t's, in the activation allocation); T above is the rank's rows of a sequence */
	int cp, cp_rank, cp_ring; /* cp_ring: the ring (1) or the all-gather (0), LOOM_CP_ATTENTION's */
	int cp_T, cp_K;           /* the layout's chunks per rank K for calls of cp_T rows (loom__cp_chunks_memo) */
	loom_tp_reduce_fn cp_fn;
	void *cp_ctx;
	float *cp_mem;

	loom__gemm_ctx_t gemm; /* matmul precision and its bf16 operand scratch (matmul_bf16.c) */

	kv_cache_t *kv; /* NULL until the first generate or loom_gpt2_kv_cache_alloc */

	loom_grad_ready_fn on_ready;
	void *on_ready_ctx;
	loom_param_use_fn on_use;
	void *on_use_ctx;

	int prof_on;
	double prof_s[PROF_COUNT];
	double prof_flops[PROF_COUNT];
	long prof_calls[PROF_COUNT];
	void *mem; /* the one allocation holding every activation buffer */
};

/* Pointer to tensor i's parameters / gradients (its current views). */
static inline float *loom__gpt2_param(loom_gpt2_t *m, int i)
{
	return m->pview[i];
}

static inline float *loom__gpt2_grad(loom_gpt2_t *m, int i)
{
	return m->gview[i];
}

/* Check that every token id of ids (n of them, called `what`) is in [0, V). LOOM_EINVAL otherwise. */
int loom__gpt2_check_tokens(const loom_gpt2_t *m, const int *ids, int B, int T, const char *what);
/* Block l's forward over B x T positions from res_in (N,C) into a's buffers (output: a->res3). The one
 * implementation behind loom_gpt2_block_forward and the sampling prompt. */
void loom__gpt2_block_forward(loom_gpt2_t *m, int l, layer_acts_t *a, const float *res_in, int B, int T);
/* ---- tensor parallelism (tp_model.c) ---- */

/* How a tensor splits: viewed as (outer, D, inner) around its split dimension, D in S sections
 * (3 for attn.c_attn: q, k, v), each cut into tp parts of `part` (the last part may be short: wte's
 * padding). */
typedef struct {
	size_t outer, D, inner, S, part;
} loom__tp_geom_t;
/* The geometry of full tensor `full` (whole-model info) split tp ways; 0 when it is not split. */
int loom__tp_geom(const loom_tensor_info_t *full, int tp, loom__tp_geom_t *g);
/* Index in rank r's shard of the full tensor's element k, or -1 when another rank holds it. */
long loom__tp_local_index(const loom__tp_geom_t *g, int r, size_t k);
/* Call the tensor-parallel reduction on buf (n floats); the first failure is kept in m->tp_err and
 * later reductions of the pass are skipped. */
void loom__tp_reduce(loom_gpt2_t *m, float *buf, size_t n, loom_tp_op_t op);
/* Vocab-parallel embedding: out (N,C) = sum over ranks of the local rows of wte[inp] (zero for ids
 * held elsewhere), plus wpe[t] (added by tp rank 0 before the sum). */
void loom__tp_embed_forward(loom_gpt2_t *m, float *out, const int *inp, int B, int T);
/* dwte (local rows) += dout rows of the locally held ids; dwpe += dout. */
void loom__tp_embed_backward(loom_gpt2_t *m, const float *dout, const int *inp, int B, int T);
/* The vocab-parallel classifier: as loom__classifier_forward_backward over the local rows of wte,
 * with the row maxima, sums of exponentials and target logits reduced across the group per chunk;
 * with dx, dx (N,C) += the group's sum of dlogits wte (its partial sums reduced once at the end). */
void loom__tp_classifier(loom_gpt2_t *m, float *losses, float *dx, float *dwte, const float *x, const float *wte,
                         const int *targets, float dloss, int N);

/* Free the sampling KV cache, if any (generate.c). */
void loom__gpt2_kv_cache_free(loom_gpt2_t *m);
/* Calls the param-use hook, if any, for (unit, phase). */
void loom__gpt2_param_use(loom_gpt2_t *m, int unit, int phase);
/* Add the time since t0 and `flops` operations to kernel k's counters. */
void loom__gpt2_prof_add(loom_gpt2_t *m, int k, double t0, double flops);

#endif
