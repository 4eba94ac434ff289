/* family.h: the part of a model that every family shares (gpt2/, nanochat/, llama/), written once in
 * family.c: the state every model holds (capacity, layer range, parameter table and views, hooks,
 * tensor- and context-parallel places, the activation allocation), creation and destruction around a
 * family's own sizes and layout, the table operations that only read or point that state, the checks
 * of the unit calls, and the helpers of the passes (hooks, reductions, sequence-parallel rows,
 * context-parallel attention and rotary positions). A family keeps only its own math: its layout of
 * activations, its kernels and its passes. Not public.
 *
 * A family's model is a struct whose first member is a loom__fam_t `f` (whose own first member is the
 * loom_model_t), so one pointer is at once a loom_model_t *, a loom__fam_t * and the family's model.
 * A family describes itself to the shared code by one loom__fam_kind_t (what creation and the unit
 * calls ask of it, and nothing more). */
#ifndef LOOM_MODEL_FAMILY_H
#define LOOM_MODEL_FAMILY_H

#include <stddef.h>
#include <stdint.h>

#include "loom/model.h"
#include "model/kernels.h"

typedef struct loom__fam_kind loom__fam_kind_t;

typedef struct loom__fam {
	loom_model_t base;            /* first: the family's table (loom/model.h) */
	const loom__fam_kind_t *kind; /* what the shared code asks of this family */
	loom_model_config_t cfg;      /* the effective configuration (the family's defaults filled in) */
	int B, T;                     /* one arena's capacity, given at create */
	int lo, hi;                   /* blocks held: [lo, hi) */
	int has_embed, has_head, narenas;
	size_t nparams;
	int ntensors;
	loom_tensor_info_t *tensors;   /* the (tp shard's) parameter table, ntensors entries */
	float *params, *grads;         /* the last whole buffers set: the owned ones or the caller's */
	float *params_own, *grads_own;
	float **pview, **gview;        /* ntensors each: tensor i's parameters and gradient now */
	int grad_split;                /* some gradient view was set on its own since the last whole buffer */
	int act_ckpt;                  /* loom_act_ckpt_t */
	long long recomputes;          /* recomputations run since create */
	loom_model_act_bytes_t act;    /* the layout's byte counts, by role */
	/* shared by all arenas: the head's scratch and outputs */
	float *logits;      /* (chunk, V or the local vocabulary rows) the classifier's scratch */
	float *last_logits; /* (B,V) logits of the last position of each row */
	float *tp_stats;    /* (3 chunk) the vocab-parallel head's per-position reductions */
	int chunk;          /* positions per classifier chunk */
	float *ftmp;        /* (N,C) forward scratch: a row-parallel product before its sum, sequence-parallel
	                     * gathers (nanochat, llama) */
	float *dres;        /* the residual stream's gradient during backward */
	float *att_scratch; /* the attention backward's partials */
	int att_threads;    /* threads att_scratch has room for */
	/* rotary tables (nanochat, llama): rot pairs per position, cos and sin (cp T, rot) each in `rope` */
	int rot;
	float *cos, *sin, *rope;
	/* tensor parallelism; sp: sequence parallelism (the residual side holds this rank's N/tp rows) */
	int tp, tp_rank, sp;
	loom_tp_reduce_fn tp_reduce;
	void *tp_ctx;
	int tp_err; /* the first error of a reduction (tp or cp) in the current pass */
	/* context parallelism (cp_attention.c): T is the rank's rows of a sequence of cp T positions */
	int cp, cp_rank, cp_ring; /* cp_ring: the ring (1) or the all-gather (0), LOOM_CP_ATTENTION's */
	int cp_T, cp_K;           /* the layout's chunks per rank K for calls of cp_T rows (loom__cp_chunks_memo) */
	loom_tp_reduce_fn cp_fn;
	void *cp_ctx;
	float *cp_mem;
	loom__gemm_ctx_t gemm; /* matmul precision and its bf16 operand scratch */
	loom_grad_ready_fn on_ready;
	void *on_ready_ctx;
	loom_param_use_fn on_use;
	void *on_use_ctx;
	void *mem; /* the one allocation holding every activation buffer */
	float *kv_logits, *kv_topk; /* the KV cache's logits of the newest position and top-k scratch (V each),
	                             * once the cache exists */
} loom__fam_t;

/* What the shared code asks of a family. The passes run on a checked call (arena, unit, sizes, token
 * ids) and leave their errors in f->tp_err and the gemm context; the entry points of family.c check,
 * set the gemm up, run the pass and report the status. */
struct loom__fam_kind {
	const loom_model_family_t *table;
	const char *len_name, *layers_name; /* the configuration's names of seq_len and n_layer, for messages */
	size_t size;                        /* of the family's model struct */
	/* Create: after the shared sizes (f->cfg is the configuration given), the family's own (the
	 * effective configuration, its dimensions, f->rot). */
	void (*setup)(loom__fam_t *f, const loom_model_config_t *cfg);
	/* Every activation buffer in one allocation, base NULL: measure only; the byte count (SIZE_MAX when it
	 * overflows). */
	size_t (*layout)(loom__fam_t *f, char *base, loom_model_act_bytes_t *bytes);
	/* The family's own allocations (its arenas, ...): LOOM_OK, or nonzero when out of memory; undone by
	 * release, which also frees the KV cache, and must accept a partial alloc. */
	int (*alloc)(loom__fam_t *f);
	void (*release)(loom__fam_t *f);
	/* The rotary tables' values (f->rot > 0): cos and sin of every position of a sequence (cp T). */
	void (*rotary)(loom__fam_t *f);
	/* The passes. */
	void (*embed_forward)(loom__fam_t *f, int mb, const int *inputs, int B, int T);
	void (*block_forward)(loom__fam_t *f, int mb, int l, int B, int T);
	void (*head_forward)(loom__fam_t *f, int mb, const int *targets, int B, int T, float *loss);
	/* rows [r0, r0 + n) of the N positions */
	void (*head_forward_backward)(loom__fam_t *f, int mb, const int *targets, int N, int r0, int n,
	                              float grad_scale, float *loss);
	void (*block_backward)(loom__fam_t *f, int mb, int l, int B, int T);
	void (*embed_backward)(loom__fam_t *f, int mb, const int *inputs, int B, int T);
	/* The residual stream in front of block l of arena mb (l = hi: the head's input). */
	float *(*stream)(loom__fam_t *f, int mb, int l);
	/* A block call's further check (NULL: none), e.g. that the arena has its token ids. */
	int (*block_check)(const loom__fam_t *f, int mb, const char *op);
	/* Sampling (loom__fam_generate): the KV cache's allocation (the table's kv_cache_alloc; it sets
	 * f->kv_logits and f->kv_topk), and one position's forward with it. */
	int (*kv_cache_alloc)(loom_model_t *m);
	void (*step)(loom__fam_t *f, int token, int pos);
};

#define LOOM__FAM(m) ((loom__fam_t *)(m))
#define LOOM__CFAM(m) ((const loom__fam_t *)(m))

/* ---- creation --------------------------------------------------------------------------------------- */

/* The family's create and act_bytes (loom/model.h's contract): the options checked (LOOM_EINVAL naming
 * the family, the option and what was expected), every buffer allocated, the rotary tables filled. */
int loom__fam_create(const loom__fam_kind_t *k, loom_model_t **out, const loom_model_config_t *cfg,
                     const loom_model_opts_t *o);
int loom__fam_act_bytes(const loom__fam_kind_t *k, const loom_model_config_t *cfg, const loom_model_opts_t *o,
                        loom_model_act_bytes_t *out);
void loom__fam_destroy(loom_model_t *m);
/* The layouts' bump allocation: nfloats at base + *off (base NULL: measure only), offsets 64-byte aligned;
 * *off saturates at SIZE_MAX instead of wrapping, so a batch too large for the address space is refused
 * as such (create's LOOM_ENOMEM "larger than the address space"), never allocated by a wrapped count. */
float *loom__fam_carve(char *base, size_t *off, size_t nfloats);
/* a * b, or SIZE_MAX when that does not fit. */
static inline size_t loom__fam_size_mul(size_t a, size_t b)
{
	return b && a > SIZE_MAX / b ? SIZE_MAX : a * b;
}

/* ---- tensor-parallel shards (the table's tp_shard, tp_unshard, tp_copy_tensor) ------------------------ */

/* By the family's shard table (cfg->arch's shard_info at 1 and at tp): a tensor split on dimension 0 is
 * rank r's rows (a vector: its elements), on dimension 1 its columns; to_shard 1 copies full -> shard,
 * else back. nanochat and llama (GPT-2's fused qkv splits in sections: its own, tp_model.c). */
void loom__fam_tp_copy_tensor(const loom_model_config_t *cfg, int tp, int r, int i, float *full, float *shard,
                              int to_shard);
void loom__fam_tp_shard(const loom_model_config_t *cfg, int tp, int r, const float *full, float *shard);
void loom__fam_tp_unshard(const loom_model_config_t *cfg, int tp, int r, const float *shard, float *full);

/* ---- table operations on the shared state (loom/model.h's of the same names) -------------------------- */

const loom_model_config_t *loom__fam_config(const loom_model_t *m);
loom_compute_dtype_t loom__fam_dtype(const loom_model_t *m);
const loom_tensor_info_t *loom__fam_tensors(const loom_model_t *m, int *n);
size_t loom__fam_param_count(const loom_model_t *m);
float *loom__fam_params(loom_model_t *m);
float *loom__fam_grads(loom_model_t *m);
int loom__fam_set_grad_buffer(loom_model_t *m, float *grads);
int loom__fam_set_param_buffer(loom_model_t *m, float *params);
int loom__fam_own_grads(loom_model_t *m);
int loom__fam_set_tensor_view(loom_model_t *m, int tensor, float *param, float *grad);
int loom__fam_set_unit_view(loom_model_t *m, int unit, float *params, float *grads);
float *loom__fam_tensor_param(loom_model_t *m, int tensor);
float *loom__fam_tensor_grad(loom_model_t *m, int tensor);
void loom__fam_layers(const loom_model_t *m, int *lo, int *hi, int *arenas);
loom_act_ckpt_t loom__fam_act_ckpt(const loom_model_t *m);
int loom__fam_sequence_parallel(const loom_model_t *m);
long long loom__fam_recomputes(const loom_model_t *m);
void loom__fam_model_act_bytes(const loom_model_t *m, loom_model_act_bytes_t *out);
void loom__fam_on_grad_ready(loom_model_t *m, loom_grad_ready_fn fn, void *ctx);
void loom__fam_on_param_use(loom_model_t *m, loom_param_use_fn fn, void *ctx);
void loom__fam_on_tp_reduce(loom_model_t *m, loom_tp_reduce_fn fn, void *ctx);
void loom__fam_on_cp_reduce(loom_model_t *m, loom_tp_reduce_fn fn, void *ctx);
int loom__fam_tp_size(const loom_model_t *m);
int loom__fam_tp_rank(const loom_model_t *m);
int loom__fam_cp_size(const loom_model_t *m);
int loom__fam_cp_rank(const loom_model_t *m);
const float *loom__fam_last_logits(const loom_model_t *m);
void loom__fam_zero_grad(loom_model_t *m);
float *loom__fam_stream_grad(loom_model_t *m);
/* A family without per-kernel timing (all but GPT-2): profile does nothing, the report says so. */
void loom__fam_profile(loom_model_t *m, int enable);
void loom__fam_profile_report(loom_model_t *m, void *file, int steps);

/* The unit calls and the whole-model passes on the kind's passes (loom/gpt2.h's contract). */
int loom__fam_embed_forward(loom_model_t *m, int mb, const int *inputs, int B, int T);
int loom__fam_block_forward(loom_model_t *m, int mb, int l, int B, int T);
int loom__fam_head_forward(loom_model_t *m, int mb, const int *targets, int B, int T, float *loss);
int loom__fam_head_forward_backward(loom_model_t *m, int mb, const int *targets, int B, int T, float grad_scale,
                                    float *loss);
int loom__fam_head_forward_backward_rows(loom_model_t *m, int mb, const int *targets, int B, int T, int row0,
                                         int rows, float grad_scale, float *loss);
int loom__fam_block_backward(loom_model_t *m, int mb, int l, int B, int T);
int loom__fam_embed_backward(loom_model_t *m, int mb, const int *inputs, int B, int T);
float *loom__fam_block_input(loom_model_t *m, int mb, int l);
int loom__fam_forward(loom_model_t *m, const int *inputs, const int *targets, int B, int T, float *loss);
int loom__fam_forward_backward(loom_model_t *m, const int *inputs, const int *targets, int B, int T,
                               float grad_scale, float *loss);

/* The designated initializers of every table entry above, for a family's loom_model_family_t. */
#define LOOM__FAM_TABLE_OPS                                                                                        \
	.destroy = loom__fam_destroy, .config = loom__fam_config, .dtype = loom__fam_dtype,                        \
	.tensors = loom__fam_tensors, .param_count = loom__fam_param_count, .params = loom__fam_params,            \
	.grads = loom__fam_grads, .set_grad_buffer = loom__fam_set_grad_buffer,                                    \
	.set_param_buffer = loom__fam_set_param_buffer, .own_grads = loom__fam_own_grads,                          \
	.set_tensor_view = loom__fam_set_tensor_view, .set_unit_view = loom__fam_set_unit_view,                    \
	.tensor_param = loom__fam_tensor_param, .tensor_grad = loom__fam_tensor_grad, .layers = loom__fam_layers,  \
	.act_ckpt = loom__fam_act_ckpt, .sequence_parallel = loom__fam_sequence_parallel,                          \
	.recomputes = loom__fam_recomputes, .model_act_bytes = loom__fam_model_act_bytes,                          \
	.on_grad_ready = loom__fam_on_grad_ready, .on_param_use = loom__fam_on_param_use,                          \
	.on_tp_reduce = loom__fam_on_tp_reduce, .on_cp_reduce = loom__fam_on_cp_reduce,                           \
	.tp_size = loom__fam_tp_size, .tp_rank = loom__fam_tp_rank, .cp_size = loom__fam_cp_size,                  \
	.cp_rank = loom__fam_cp_rank, .logits = loom__fam_last_logits, .zero_grad = loom__fam_zero_grad,           \
	.stream_grad = loom__fam_stream_grad, .embed_forward = loom__fam_embed_forward,                            \
	.block_forward = loom__fam_block_forward, .head_forward = loom__fam_head_forward,                          \
	.head_forward_backward = loom__fam_head_forward_backward,                                                  \
	.head_forward_backward_rows = loom__fam_head_forward_backward_rows,                                        \
	.block_backward = loom__fam_block_backward, .embed_backward = loom__fam_embed_backward,                    \
	.block_input = loom__fam_block_input, .forward = loom__fam_forward,                                        \
	.forward_backward = loom__fam_forward_backward

/* ---- checks ------------------------------------------------------------------------------------------ */

/* Every one of the n ids (called `what`, rows of T) in [0, V); LOOM_EINVAL naming the first that is not. */
int loom__fam_check_tokens(const loom__fam_t *f, const int *ids, int n, int T, const char *what);

/* ---- helpers of the passes -------------------------------------------------------------------------- */

/* The param-use hook for (unit, phase) and the grad-ready hook for tensor i (i < 0: none), if set. */
void loom__fam_param_use(loom__fam_t *f, int unit, int phase);
void loom__fam_ready(loom__fam_t *f, int i);
/* The tensor-parallel reduction on buf (n floats); the first failure is kept in f->tp_err and the
 * pass's later reductions are skipped. */
void loom__fam_tp_reduce(loom__fam_t *f, float *buf, size_t n, loom_tp_op_t op);
/* p[0..n) = 0, in parallel for a large n. */
void loom__fam_zero(float *p, size_t n);
/* The losses of n positions summed, over all N of the batch (n = N: the mean), in double. */
float loom__fam_mean_loss(const float *losses, int n, int N);
/* Sequence parallelism: the first of the rows [row0, row0 + N/tp) this rank's residual-side buffers hold
 * (0 without it), and their count. */
static inline size_t loom__fam_sp_row0(const loom__fam_t *f, int N)
{
	return f->sp ? (size_t)f->tp_rank * (size_t)(N / f->tp) : 0;
}

static inline int loom__fam_sp_rows(const loom__fam_t *f, int N)
{
	return f->sp ? N / f->tp : N;
}

/* x (N/tp,C) this rank's rows all-gathered into f->ftmp (N,C), which is returned; without sequence
 * parallelism x itself. */
const float *loom__fam_sp_gather(loom__fam_t *f, const float *x, int N, int C);
/* A head's logits kernel: out (N,V) from x (N,C; rows ldx apart) and w (V,C). */
typedef void (*loom__fam_logits_fn)(float *out, const float *x, int ldx, const float *w, int N, int C, int V);
/* The vocab-parallel head (tp > 1): this rank's rows of the head's matrix w hold ids [v0, v0 + Vv). Per
 * chunk of positions (f->chunk) the local logits (x w^T, or logits' when given: softcap > 0 is its cap
 * for the gradient), the group's row maxima, then the sums of exponentials and the target logits (one
 * reduction of both) give losses (N); with dx, dx (N,C) += the local dlogits w (partial sums, reduced
 * once at the end) and dw += dlogits^T x, dlogits of dloss x each loss. The full logits never exist on
 * one rank; f->logits and f->tp_stats are the scratch. */
void loom__fam_tp_classifier(loom__fam_t *f, float *losses, float *dx, float *dw, const float *x, const float *w,
                             const int *targets, float dloss, int N, int C, int v0, int Vv, loom__fam_logits_fn logits,
                             float softcap);
/* A rotary kernel: in place on n rows (of H heads of D) at positions pos0 + i % Tseq. */
typedef void (*loom__fam_rope_fn)(float *x, const float *cos, const float *sin, int n, int Tseq, int pos0, int H,
                                  int D);
/* fn over B x T rows of H heads, in place: row t of a sequence at position t, or with context parallelism
 * at its chunk's (the rows' two chunks, each contiguous). */
/* Context parallel: the layout's chunks per rank for passes of T local rows (kernels.h, loom__cp_chunk). */
int loom__fam_cp_chunks(loom__fam_t *f, int T);
void loom__fam_rope(loom__fam_t *f, loom__fam_rope_fn fn, float *x, int B, int T, int H, int D);
/* The attention a describes (the local rows), out (ldo) and lse: one process's kernel, or the
 * context-parallel group's (a failure of the hook is the pass's error); and its backward (dq ldq, dk
 * and dv ldk, dout/out ldo; the scratch is f's). */
void loom__fam_attention_forward(loom__fam_t *f, const loom__flash_t *a, float *out, int ldo, float *lse);
void loom__fam_attention_backward(loom__fam_t *f, const loom__flash_t *a, float *dq, int ldq, float *dk, float *dv,
                                  int ldk, const float *dout, const float *out, int ldo, const float *lse);

/* ---- sampling ---------------------------------------------------------------------------------------- */

/* The table's generate on the kind's KV cache and step (loom/gpt2.h's contract): the arguments checked,
 * the prompt run position by position in the model's precision, then loom__fam_sample; the gemm status. */
int loom__fam_generate(loom_model_t *m, const int *prompt, int n_prompt, int max_new, float temperature, int top_k,
                       uint64_t seed, int stop_token, int *out, int *n_out, void (*on_token)(void *ctx, int token),
                       void *ctx);

/* generate's argument checks (loom/gpt2.h's contract: *n_out = 0 first), LOOM_EINVAL naming the family
 * and the argument. */
int loom__fam_generate_check(const loom__fam_t *f, const int *prompt, int n_prompt, int max_new, float temperature,
                             int top_k, const int *out, int *n_out);
/* A KV cache: a struct of `size` bytes whose first member is its buffers' allocation (void *mem), the
 * buffers carved by layout (base NULL: count only), into *kv; for the whole model only: LOOM_EINVAL or
 * LOOM_ENOMEM naming the family. kv_free frees one (NULL: nothing). */
int loom__fam_kv_alloc(loom__fam_t *f, size_t size, size_t (*layout)(const loom__fam_t *f, void *kv, char *base),
                       void **kv);
void loom__fam_kv_free(void *kv);
/* One position's forward with the KV cache, its logits left where the sampling loop reads them. */
typedef void (*loom__fam_step_fn)(loom__fam_t *f, int token, int pos);
/* The sampling loop of a checked generate whose prompt (n_prompt tokens) has run: up to max_new tokens
 * sampled from logits (V of them; topk V floats of scratch) at temperature and top_k (loom__sample_token,
 * seeded with seed), each given to on_token and run through step, until stop_token or the model's T. */
void loom__fam_sample(loom__fam_t *f, loom__fam_step_fn step, const float *logits, float *topk, int n_prompt,
                      int max_new, float temperature, int top_k, uint64_t seed, int stop_token, int *out, int *n_out,
                      void (*on_token)(void *ctx, int token), void *ctx);

#endif
