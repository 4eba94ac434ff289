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

#endif
