/* llama_model.h: the Llama / Qwen2 family (transformers' LlamaForCausalLM and Qwen2ForCausalLM): the
 * model's internal state and kernels, shared by llama.c (creation, views, hooks, the family table),
 * llama_layout.c (the configuration and the parameter table), llama_kernels.c, llama_passes.c and
 * llama_generate.c. Not public.
 *
 * The network (C channels, NH query heads and NKV key/value heads of D channels, D = head_dim or C/NH,
 * I = intermediate_size):
 *   x = embed_tokens[tok]
 *   block i: xn = rmsnorm(x) * w_in; q = xn Wq^T (+bq), k = xn Wk^T (+bk), v = xn Wv^T (+bv)
 *            q, k = rope(q, k) (rotate_half: channel j paired with j + D/2, rope_theta, llama3 scaling)
 *            y = causal GQA softmax(q k^T / sqrt(D)) v (query head h reads kv head h / (NH / NKV))
 *            x = x + y Wo^T (+bo); xn = rmsnorm(x) * w_post;
 *            x = x + (silu(xn Wg^T (+bg)) * (xn Wu^T (+bu))) Wd^T (+bd)
 *   head: logits = (rmsnorm(x) * w_norm) Wlm^T (Wlm = embed_tokens when tied); mean cross-entropy.
 * Matrices are PyTorch's [out, in] (y = x W^T). The residual stream between units is x, C floats per
 * position. rmsnorm(x) = x / sqrt(mean(x^2) + rms_norm_eps), in fp32. */
#ifndef LOOM_MODEL_LLAMA_MODEL_H
#define LOOM_MODEL_LLAMA_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "loom/model.h"
#include "model/fastmath.h"
#include "model/kernels.h"

/* Tensors of block l, in table order (those the configuration has: the biases are optional). The
 * order is the forward's: the backward finalizes each tensor's gradient before those before it. */
enum {
	LL_ATTN_NORM, LL_Q, LL_QB, LL_K, LL_KB, LL_V, LL_VB, LL_O, LL_OB,
	LL_MLP_NORM, LL_GATE, LL_GATEB, LL_UP, LL_UPB, LL_DOWN, LL_DOWNB, LL_LAYER_MAX
};

/* The derived sizes of a (checked) configuration, for a tp-way shard (tp 1: the whole model). */
typedef struct {
	int L, NH, NKV, C, D, T, V, I;
	int tp;
	int nh, nkv, il, vl; /* local: query heads, kv heads, MLP columns, vocabulary rows */
	int tied;
	int has[LL_LAYER_MAX]; /* 1 for the block tensors the configuration has */
	int idx[LL_LAYER_MAX]; /* their index within the block, -1 when absent */
	int per_layer;         /* tensors of a block */
} ll_dims_t;

/* The effective configuration: every zero field given its default (head_dim, intermediate_size,
 * rope_theta, rms_norm_eps, n_kv_head). */
void loom__ll_normalize(const loom_model_config_t *cfg, loom_model_config_t *out);
void loom__ll_dims(const loom_model_config_t *cfg, int tp, ll_dims_t *d);
/* The default intermediate_size of n_embd C: Llama's 8C/3 rounded up to a multiple of 256. */
int loom__ll_default_intermediate(int C);
/* Tensor index of block l's tensor j (LL_*), or -1 when the configuration has none. */
int loom__ll_lt(const ll_dims_t *d, int l, int j);
/* Index of the embedding (0), the final norm and the lm head (-1 when tied: the head reads tensor 0). */
int loom__ll_norm_index(const ll_dims_t *d);
int loom__ll_head_index(const ll_dims_t *d); /* the tensor the head multiplies by (lm_head or embed_tokens) */
void loom__ll_unit_range(const ll_dims_t *d, int u, int *first, int *end);
/* The rotary inverse frequencies (D/2) of a configuration, in double, llama3 scaling applied. */
void loom__ll_inv_freq(const loom_model_config_t *cfg, double *inv_freq);

int loom__ll_config_check(const loom_model_config_t *cfg);
int loom__ll_num_tensors(const loom_model_config_t *cfg);
int loom__ll_tensor_info(const loom_model_config_t *cfg, int i, loom_tensor_info_t *info);
size_t loom__ll_num_params(const loom_model_config_t *cfg);
double loom__ll_flops_per_token(const loom_model_config_t *cfg, int T);
double loom__ll_unit_flops(const loom_model_config_t *cfg, int unit, int T);
int loom__ll_stream_width(const loom_model_config_t *cfg);
int loom__ll_kv_width(const loom_model_config_t *cfg);
int loom__ll_tp_check(const loom_model_config_t *cfg, int tp);
int loom__ll_shard_info(const loom_model_config_t *cfg, int tp, int i, loom_tensor_info_t *info);
size_t loom__ll_shard_params(const loom_model_config_t *cfg, int tp);
void loom__ll_tp_shard(const loom_model_config_t *cfg, int tp, int r, const float *full, float *shard);
void loom__ll_tp_unshard(const loom_model_config_t *cfg, int tp, int r, const float *shard, float *full);
void loom__ll_tp_copy_tensor(const loom_model_config_t *cfg, int tp, int r, int i, float *full, float *shard,
                             int to_shard);

/* ---- the model ---------------------------------------------------------------------------------- */

/* One block's activations kept for its backward (N = B T rows; local sizes with tp; with sequence
 * parallelism xn1, rstd1, x2, xn2, rstd2 and out have N/tp rows, out N for block hi-1). The block's
 * input is the stream before it (the arena's input or the previous block's out). */
typedef struct {
	float *xn1, *rstd1;  /* (N,C), (N) the attention's normed input (times input_layernorm's weight) */
	float *q, *k, *v;    /* (N,nh D), (N,nkv D), (N,nkv D): q and k after rotary */
	float *lse;          /* (B,nh,T) the attention rows' log-sum-exp */
	float *atty;         /* (N,nh D) */
	float *x2;           /* (N,C) after the attention's residual */
	float *xn2, *rstd2;  /* (N,C), (N) */
	float *g, *u, *act;  /* (N,il) gate's and up's outputs, silu(g) u */
	float *out;          /* (N,C) the block's output stream */
} ll_layer_t;

typedef struct {
	float *in;      /* (N,C) input stream of block lo */
	ll_layer_t *layers;
	float *xf, *rstdf, *losses; /* head: (N,C), (N), (N) */
} ll_arena_t;

typedef struct {
	float *k, *v;  /* L of (T, nkv D) each */
	float *x, *xn, *q, *kk, *vv, *y, *x2, *g, *u, *rs;
	float *logits, *topk;
	void *mem;
} ll_kv_t;

typedef struct loom_llama {
	loom_model_t base;
	loom_model_config_t cfg; /* normalized */
	ll_dims_t d;
	int B, T, lo, hi, has_embed, has_head, narenas, act_ckpt;
	float eps;
	size_t nparams;
	int ntensors;
	int norm_i, head_i; /* the final norm's tensor, the one the head multiplies by */
	loom_tensor_info_t *tensors;
	float *params, *grads, *params_own, *grads_own;
	float **pview, **gview;
	int grad_split;
	ll_arena_t *arenas;
	long long recomputes;
	loom_model_act_bytes_t act;
	float *cos, *sin; /* (cp T, D/2) rotary tables */
	float *rope;
	/* head scratch */
	float *logits, *last_logits;
	float *tp_stats;
	int chunk;
	float *ftmp; /* (N,C) forward scratch: a row-parallel product before its sum, sequence-parallel gathers */
	/* backward scratch (one micro-batch's backward at a time) */
	float *dres;             /* (N,C) stream gradient */
	float *dx2, *dxn;        /* (N,C) */
	float *dq, *dk, *dv;     /* (N,nh D), (N,nkv D), (N,nkv D) */
	float *datty;            /* (N,nh D) */
	float *dact, *dg, *du;   /* (N,il) */
	float *dnw;              /* (C) a norm weight's gradient of this call, before it is summed in */
	float *att_scratch;
	int att_threads;
	int tp, tp_rank, sp;
	loom_tp_reduce_fn tp_reduce;
	void *tp_ctx;
	int tp_err;
	int cp, cp_rank, cp_ring;
	int cp_T, cp_K; /* the layout's chunks per rank K for calls of cp_T rows (loom__cp_chunks_memo) */
	loom_tp_reduce_fn cp_fn;
	void *cp_ctx;
	float *cp_mem;
	loom__gemm_ctx_t gemm;
	ll_kv_t *kv;
	loom_grad_ready_fn on_ready;
	void *on_ready_ctx;
	loom_param_use_fn on_use;
	void *on_use_ctx;
	void *mem;
} loom_llama_t;

/* ---- kernels (llama_kernels.c); backward kernels accumulate (+=) -------------------------------- */

/* out (N,C) (row stride ldo) = w * x / sqrt(mean(x^2) + eps), rstd (N) the 1/sqrt; inp row stride ldi. */
void loom__ll_rmsnorm_forward(float *out, int ldo, float *rstd, const float *inp, int ldi, const float *w, float eps,
                              int N, int C);
/* dinp (ldd) += the input's gradient given dout (lddo); dw (C) += sum over rows of dout x rstd. */
void loom__ll_rmsnorm_backward(float *dinp, int ldd, float *dw, const float *dout, int lddo, const float *inp, int ldi,
                               const float *w, const float *rstd, int N, int C);
/* rotate_half rotary embeddings in place on x (N rows of H heads of D): row n at position pos0 + n % T,
 * channel i paired with i + D/2: (a, b) -> (a cos - b sin, b cos + a sin). */
void loom__ll_rope_forward(float *x, const float *cos, const float *sin, int N, int T, int pos0, int H, int D);
/* Its transpose, in place on the gradient. */
void loom__ll_rope_backward(float *dx, const float *cos, const float *sin, int N, int T, int pos0, int H, int D);
/* act = silu(g) u; and dg += dact u silu'(g), du += dact silu(g). */
void loom__ll_swiglu_forward(float *act, const float *g, const float *u, size_t n);
void loom__ll_swiglu_backward(float *dg, float *du, const float *dact, const float *g, const float *u, size_t n);
/* y (N,n) rows ldy apart += b (n) on each row; db (n) += the column sums of dy. */
void loom__ll_bias_forward(float *y, int ldy, const float *b, int N, int n);
void loom__ll_bias_backward(float *db, const float *dy, int lddy, int N, int n);
/* Rows of a table holding ids [v0, v0 + nrows): out (N, cols) = table[ids - v0], zero rows elsewhere;
 * and dtable[ids[n] - v0] += d[n] for the ids held, deterministic. */
void loom__ll_gather(float *out, const float *table, const int *ids, int v0, int nrows, int N, int cols);
void loom__ll_scatter_add(float *dtable, const float *d, const int *ids, int v0, int nrows, int N, int cols);

/* ---- the passes (llama_passes.c), the family table's entries of the same names ---- */
int loom__ll_embed_forward(loom_model_t *m, int mb, const int *inputs, int B, int T);
int loom__ll_block_forward(loom_model_t *m, int mb, int l, int B, int T);
int loom__ll_head_forward(loom_model_t *m, int mb, const int *targets, int B, int T, float *loss);
int loom__ll_head_forward_backward(loom_model_t *m, int mb, const int *targets, int B, int T, float grad_scale,
                                   float *loss);
int loom__ll_head_forward_backward_rows(loom_model_t *m, int mb, const int *targets, int B, int T, int row0, int rows,
                                        float grad_scale, float *loss);
int loom__ll_block_backward(loom_model_t *m, int mb, int l, int B, int T);
int loom__ll_embed_backward(loom_model_t *m, int mb, const int *inputs, int B, int T);
float *loom__ll_block_input(loom_model_t *m, int mb, int l);
float *loom__ll_stream_grad(loom_model_t *m);
int loom__ll_forward(loom_model_t *m, const int *inputs, const int *targets, int B, int T, float *loss);
const float *loom__ll_last_logits(const loom_model_t *m);
void loom__ll_zero_grad(loom_model_t *m);
int loom__ll_forward_backward(loom_model_t *m, const int *inputs, const int *targets, int B, int T, float grad_scale,
                              float *loss);

/* ---- shared by llama.c, llama_passes.c and llama_generate.c ---- */
void loom__ll_kv_free(loom_llama_t *m);
int loom__ll_kv_alloc(loom_llama_t *m);
int loom__ll_generate(loom_llama_t *m, const int *prompt, int n_prompt, int max_new, float temperature, int top_k,
                      uint64_t seed, int stop_token, int *out, int *n_out, void (*on_token)(void *ctx, int token),
                      void *ctx);

#endif
