/* nanochat_model.h: nanochat's GPT (karpathy/nanochat bac5a35, nanochat/gpt.py): the model's internal
 * state and the kernels, shared by nanochat.c (creation, views, passes), nanochat_layout.c (the
 * configuration and the parameter table), nanochat_kernels.c and nanochat_generate.c. Not public.
 *
 * The network (C channels, NH query heads and NKV key/value heads of D = C/NH channels, H = 4C):
 *   x0 = rmsnorm(wte[tok]); x = x0
 *   block i: x = r_i x + z_i x0 (resid_lambdas, x0_lambdas);
 *            xn = rmsnorm(x); q = xn Wq^T, k = xn Wk^T, v = xn Wv^T
 *            (value-embedding layers: v += 2 sigmoid(xn[:32] Wg^T) ve_i[tok], one gate per kv head)
 *            q, k = rmsnorm_per_head(rope(q, k)); y = causal windowed GQA softmax(q k^T / sqrt(D)) v
 *            x = x + y Wo^T; x = x + relu(rmsnorm(x) Wfc^T)^2 Wp^T
 *   head: logits = 15 tanh(rmsnorm(x) Wlm^T / 15) over the real vocabulary; mean cross-entropy.
 * Matrices are PyTorch's [out, in] (y = x W^T). The residual stream between units is 2C floats per
 * position, [x | x0], so a unit never needs anything but its input row. */
#ifndef LOOM_MODEL_NANOCHAT_MODEL_H
#define LOOM_MODEL_NANOCHAT_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "loom/model.h"
#include "loom/nanochat.h"
#include "model/fastmath.h"
#include "model/kernels.h"

#define NC_GATE_CH 32      /* channels of xn the value-embedding gate reads */
#define NC_SOFTCAP 15.0f   /* logits = 15 tanh(z / 15) */
#define NC_EPS 1.1920929e-07f /* F.rms_norm's eps for fp32: FLT_EPSILON */
#define NC_VOCAB_PAD 64    /* wte, lm_head and the value embeddings have V rounded up to this */

/* Tensors of block l, in table order (a layer without value embedding has no VE, no GATE). The order
 * is the backward's: each tensor's gradient is final before those of the tensors before it. */
enum { NC_VE, NC_GATE, NC_Q, NC_K, NC_V, NC_O, NC_FC, NC_P, NC_LAYER_MAX };
/* The embedding unit's tensors: 0 wte, 1 resid_lambdas, 2 x0_lambdas. */
enum { NC_WTE, NC_RESID, NC_X0, NC_EMBED_TENSORS };

/* The derived sizes of a (checked) configuration, for a tp-way shard (tp 1: the whole model). */
typedef struct {
	int L, NH, NKV, C, D, T, V, Vp, H;
	int tp;
	int nh, nkv, hid, vl; /* local: query heads, kv heads, MLP hidden columns, vocabulary rows */
} nc_dims_t;

int loom__nc_dims(const loom_model_config_t *cfg, int tp, nc_dims_t *d);
/* 1 when block l has a value embedding (l % 2 == (L - 1) % 2). */
static inline int loom__nc_has_ve(int l, int L)
{
	return l % 2 == (L - 1) % 2;
}
/* Block l's window W (a query sees itself and W positions before it) of a checked configuration. */
int loom__nc_window(const loom_model_config_t *cfg, int l);
/* The effective configuration: n_kv_head, short_window and window_pattern filled in (upper case). */
void loom__nc_normalize(const loom_model_config_t *cfg, loom_model_config_t *out);
/* First tensor of unit u (-1..L) and one past its last. */
void loom__nc_unit_range(const loom_model_config_t *cfg, int u, int *first, int *end);
/* Tensor index of block l's tensor j (NC_*), or -1 when the block has none. */
int loom__nc_lt(const loom_model_config_t *cfg, int l, int j);

int loom__nc_config_check(const loom_model_config_t *cfg);
int loom__nc_num_tensors(const loom_model_config_t *cfg);
int loom__nc_tensor_info(const loom_model_config_t *cfg, int i, loom_tensor_info_t *info);
size_t loom__nc_num_params(const loom_model_config_t *cfg);
double loom__nc_flops_per_token(const loom_model_config_t *cfg, int T);
int loom__nc_stream_width(const loom_model_config_t *cfg);
int loom__nc_tp_check(const loom_model_config_t *cfg, int tp);
int loom__nc_shard_info(const loom_model_config_t *cfg, int tp, int i, loom_tensor_info_t *info);
size_t loom__nc_shard_params(const loom_model_config_t *cfg, int tp);
void loom__nc_tp_shard(const loom_model_config_t *cfg, int tp, int r, const float *full, float *shard);
void loom__nc_tp_unshard(const loom_model_config_t *cfg, int tp, int r, const float *shard, float *full);
void loom__nc_tp_copy_tensor(const loom_model_config_t *cfg, int tp, int r, int i, float *full, float *shard,
                             int to_shard);

/* ---- the model ---------------------------------------------------------------------------------- */

/* One block's activations kept for its backward (N = B T rows; local sizes with tp; with sequence
 * parallelism xin, xn1, rstd1, x2, xn2, rstd2 and out have N/tp rows, out N for block hi-1). */
typedef struct {
	float *xin;          /* (N,C) r x + z x0: the block's residual input */
	float *xn1, *rstd1;  /* (N,C), (N) attention's normed input */
	float *q, *qrstd;    /* (N,nh D) after rope and QK-norm, (N nh) */
	float *k, *krstd;    /* (N,nkv D), (N nkv) */
	float *v;            /* (N,nkv D) with the value embedding mixed in */
	float *gate;         /* (N,nkv) sigmoid of the gate's logits (value-embedding layers) */
	float *lse;          /* (B,nh,T) the attention rows' log-sum-exp */
	float *atty;         /* (N,nh D) */
	float *x2;           /* (N,C) after attention's residual */
	float *xn2, *rstd2;  /* (N,C), (N) */
	float *fch, *act;    /* (N,hid) c_fc's output, relu^2 of it */
	float *out;          /* (N,2C) the block's output stream [x | x0] */
} nc_layer_t;

typedef struct {
	float *in;      /* (N,2C) input stream of block lo */
	int *tok;       /* (N) token ids (embed_forward / set_inputs) */
	int has_tok;
	float *rstd0;   /* (N) the embedding's rmsnorm */
	nc_layer_t *layers;
	float *xf, *rstdf, *losses; /* head: (N,C), (N), (N) */
} nc_arena_t;

typedef struct {
	float *k, *v;  /* L of (T, nkv D) each */
	float *x, *x0, *xin, *xn, *q, *kk, *vv, *gate, *y, *tmp, *fch; /* one position's scratch */
	float *logits, *topk;
	void *mem;
} nc_kv_t;

typedef struct loom_nanochat {
	loom_model_t base;
	loom_model_config_t cfg; /* normalized */
	nc_dims_t d;
	int B, T, lo, hi, has_embed, has_head, narenas, act_ckpt;
	int *window; /* L */
	size_t nparams;
	int ntensors;
	loom_tensor_info_t *tensors;
	float *params, *grads, *params_own, *grads_own;
	float **pview, **gview;
	int grad_split;
	nc_arena_t *arenas;
	long long recomputes;
	loom_model_act_bytes_t act;
	float *cos, *sin; /* (T, D/2) rotary tables, bf16-rounded as gpt.py keeps them (in `rope`) */
	float *rope;
	/* head scratch */
	float *logits, *last_logits;
	float *tp_stats; /* (3 chunk) the vocab-parallel head's per-position reductions */
	int chunk;
	/* forward scratch (one forward at a time, any arena) */
	float *ftmp; /* (N,C) */
	/* backward scratch (one micro-batch's backward at a time) */
	float *dres;          /* (N,2C) stream gradient [dx | dx0] */
	float *dx2, *dxin, *dxn; /* (N,C) */
	float *dq, *dk, *dv;  /* (N,nh D), (N,nkv D), (N,nkv D) */
	float *dkh;           /* (N,nh D) scratch of the QK-norm backward */
	float *datty;         /* (N,nh D) */
	float *dh1, *dh2;     /* (N,hid) */
	float *dgate;         /* (N,nkv) */
	float *dscal;         /* (N) per-row partial sums of the scalars' gradients */
	float *att_scratch;
	int att_threads;
	/* tensor parallelism; sp: sequence parallelism (nanochat_passes.c): xin, xn1, x2, xn2, their rstd
	 * and a block's output hold the rank's rows [tp_rank N/tp, (tp_rank+1) N/tp) only (the output of
	 * block hi-1 stays whole), ftmp doubles as the buffer of the gathers */
	int tp, tp_rank, sp;
	loom_tp_reduce_fn tp_reduce;
	void *tp_ctx;
	int tp_err; /* the first error of a reduction (tp or cp) in the current pass */
	/* context parallelism (loom_model_opts_t cp_size, cp_rank; cp_attention.c): T above is the rank's rows
	 * of a sequence of cp T positions, cos and sin cover all of them, cp_mem is the attention's gather
	 * scratch */
	int cp, cp_rank, cp_ring; /* cp_ring: the ring (1) or the all-gather (0), LOOM_CP_ATTENTION's */
	int cp_T, cp_K;           /* the layout's chunks per rank K for calls of cp_T rows (loom__cp_chunks_memo) */
	loom_tp_reduce_fn cp_fn;
	void *cp_ctx;
	float *cp_mem;
	loom__gemm_ctx_t gemm;
	nc_kv_t *kv;
	loom_grad_ready_fn on_ready;
	void *on_ready_ctx;
	loom_param_use_fn on_use;
	void *on_use_ctx;
	void *mem;
} loom_nanochat_t;

/* ---- kernels (nanochat_kernels.c); backward kernels accumulate (+=) ------------------------------ */

/* out (N,C) (row stride ldo) = x / sqrt(mean(x^2) + eps), rstd (N) the 1/sqrt; inp row stride ldi. */
void loom__nc_rmsnorm_forward(float *out, int ldo, float *rstd, const float *inp, int ldi, int N, int C);
/* dinp (ldd) += rstd (dout - y mean(dout y)) with y the forward's output (ldy). */
void loom__nc_rmsnorm_backward(float *dinp, int ldd, const float *dout, int lddo, const float *y, int ldy,
                               const float *rstd, int N, int C);
/* In place on x (N rows of H heads of D): the rotation of position t = pos0 + n % T. */
void loom__nc_rope_forward(float *x, const float *cos, const float *sin, int N, int T, int pos0, int H, int D);
/* Its transpose, in place on the gradient. */
void loom__nc_rope_backward(float *dx, const float *cos, const float *sin, int N, int T, int pos0, int H, int D);
/* y = relu(x)^2 and dx += 2 relu(x) dy. */
void loom__nc_relu2_forward(float *y, const float *x, size_t n);
void loom__nc_relu2_backward(float *dx, const float *x, const float *dy, size_t n);
/* Windowed causal GQA attention on the fused kernel (flash.c): q (N,NH D), k, v (N,NKV D), out (N,NH D),
 * lse (B,NH,T) each row's log-sum-exp; a query at t sees keys [t - W, t]; query head h reads kv head
 * h / (NH / NKV). */
void loom__nc_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v, int B, int T,
                                int NH, int NKV, int D, int W);
/* Those operands as the kernel takes them, for a caller that runs it itself (context parallelism). */
loom__flash_t loom__nc_attention_shape(const float *q, const float *k, const float *v, int B, int T, int NH, int NKV,
                                       int D, int W);
/* dq (N,NH D), dk, dv (N,NKV D) +=; scratch: loom__flash_scratch_floats(B, T, NKV, D, scratch_threads). */
void loom__nc_attention_backward(float *dq, float *dk, float *dv, float *scratch, int scratch_threads,
                                 const float *dout, const float *q, const float *k, const float *v, const float *out,
                                 const float *lse, int B, int T, int NH, int NKV, int D, int W);
/* Rows of a table holding ids [v0, v0 + nrows) (a vocab-parallel shard; v0 0 for a whole one): out (N,
 * cols) = table[ids - v0], zero rows for ids held elsewhere. */
void loom__nc_gather(float *out, int ldo, const float *table, int ld, const int *ids, int v0, int nrows, int N,
                     int cols);
/* dtable[ids[n] - v0] += d[n] for the ids held, deterministic (columns split over threads). */
void loom__nc_scatter_add(float *dtable, int ld, const float *d, int ldd, const int *ids, int v0, int nrows, int N,
                          int cols);
/* Softcapped lm head + cross-entropy over N rows in chunks (x (N,C), w (V,C) the real vocabulary's
 * rows of lm_head): losses (N); with dx, dx (N,C) += and dw (V,C) += the gradient of dloss * losses. */
void loom__nc_classifier(float *losses, float *dx, float *dw, float *logits, int chunk, const float *x, const float *w,
                         const int *targets, float dloss, int N, int C, int V);
/* out (N,V) = 15 tanh(x w^T / 15), x rows ldx apart. */
void loom__nc_logits(float *out, const float *x, int ldx, const float *w, int N, int C, int V);
/* tanh for the softcap, vectorizable inside `omp simd` loops: the [7/6] Padé approximant (the
 * continued fraction's 7th convergent; relative error below 1e-9 for |x| <= 1) near zero, where
 * 1 - 2/(1 + e^2x) would cancel; that formula beyond, where tanh >= 0.76 keeps fast_expf's 2e-7
 * relative error. Branch-free: both are computed, one selected. */
static inline float loom__nc_tanhf(float x)
{
	float x2 = x * x;
	float p = x * (135135.0f + x2 * (17325.0f + x2 * (378.0f + x2)));
	float q = 135135.0f + x2 * (62370.0f + x2 * (3150.0f + 28.0f * x2));
	float ax = x < 0 ? -x : x;
	float far = 1.0f - 2.0f / (1.0f + fast_expf(2.0f * ax));
	far = x < 0 ? -far : far;
	return x2 <= 1.0f ? p / q : far;
}

/* ---- the passes (nanochat_passes.c), the family table's entries of the same names ---- */
int loom__nc_set_inputs(loom_model_t *m, int mb, const int *inputs, int B, int T);
int loom__nc_embed_forward(loom_model_t *m, int mb, const int *inputs, int B, int T);
int loom__nc_block_forward(loom_model_t *m, int mb, int l, int B, int T);
int loom__nc_head_forward(loom_model_t *m, int mb, const int *targets, int B, int T, float *loss);
int loom__nc_head_forward_backward(loom_model_t *m, int mb, const int *targets, int B, int T, float grad_scale,
                                   float *loss);
int loom__nc_head_forward_backward_rows(loom_model_t *m, int mb, const int *targets, int B, int T, int row0, int rows,
                                        float grad_scale, float *loss);
int loom__nc_block_backward(loom_model_t *m, int mb, int l, int B, int T);
int loom__nc_embed_backward(loom_model_t *m, int mb, const int *inputs, int B, int T);
float *loom__nc_block_input(loom_model_t *m, int mb, int l);
float *loom__nc_stream_grad(loom_model_t *m);
int loom__nc_forward(loom_model_t *m, const int *inputs, const int *targets, int B, int T, float *loss);
const float *loom__nc_last_logits(const loom_model_t *m);
void loom__nc_zero_grad(loom_model_t *m);
int loom__nc_forward_backward(loom_model_t *m, const int *inputs, const int *targets, int B, int T, float grad_scale,
                              float *loss);

/* ---- shared by nanochat.c, nanochat_passes.c and nanochat_generate.c ---- */
void loom__nc_param_use(loom_nanochat_t *m, int unit, int phase);
void loom__nc_kv_free(loom_nanochat_t *m);
int loom__nc_kv_alloc(loom_nanochat_t *m);
int loom__nc_generate(loom_nanochat_t *m, const int *prompt, int n_prompt, int max_new, float temperature, int top_k,
                      uint64_t seed, int stop_token, int *out, int *n_out, void (*on_token)(void *ctx, int token),
                      void *ctx);
void loom__nc_tp_reduce(loom_nanochat_t *m, float *buf, size_t n, loom_tp_op_t op);

#endif
