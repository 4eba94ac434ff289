/* loom/gpt2.h: the GPT-2 model (exactly HF/llm.c GPT-2), fp32, forward, backward, sampling.
 *
 * Parameters live in one contiguous float buffer, tensor after tensor in HF order (below), each
 * tensor in HF's layout (Conv1D weights are [in, out]: y = x W + b). Gradients have the same layout
 * in a second buffer. Backward produces gradients in reverse tensor order (ln_f first, wte last) and
 * can report each tensor as soon as its gradient is final (for bucketed data-parallel all-reduce).
 *
 * Tensor order: wte [V,C], wpe [T,C], then for each layer i:
 *   h.i.ln_1.weight [C], h.i.ln_1.bias [C], h.i.attn.c_attn.weight [C,3C], h.i.attn.c_attn.bias [3C],
 *   h.i.attn.c_proj.weight [C,C], h.i.attn.c_proj.bias [C], h.i.ln_2.weight [C], h.i.ln_2.bias [C],
 *   h.i.mlp.c_fc.weight [C,4C], h.i.mlp.c_fc.bias [4C], h.i.mlp.c_proj.weight [4C,C], h.i.mlp.c_proj.bias [C]
 * then ln_f.weight [C], ln_f.bias [C]. */
#ifndef LOOM_GPT2_H
#define LOOM_GPT2_H

#include <stddef.h>
#include <stdint.h>

#include "loom/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
	int n_layer;    /* L */
	int n_head;     /* NH */
	int n_embd;     /* C, divisible by n_head */
	int seq_len;    /* T: maximum sequence length (n_positions, rows of wpe) */
	int vocab_size; /* V */
} loom_gpt2_config_t;

#define LOOM_GPT2_LAYER_TENSORS 12
#define LOOM_TENSOR_NAME_MAX 64

typedef struct {
	char name[LOOM_TENSOR_NAME_MAX]; /* HF name without the "transformer." prefix */
	int ndim;                        /* 1 or 2 */
	size_t shape[2];
	size_t offset; /* in floats, from the start of the parameter buffer */
	size_t numel;
	int decay; /* 1 for 2-D weights (AdamW weight decay applies), 0 for biases and LayerNorm */
} loom_tensor_info_t;

/* Presets: "tiny" (L4 H4 C128 T128 V257), "small" (L6 H6 C384 T256 V50257), "gpt2" (124M:
 * L12 H12 C768 T1024 V50257). LOOM_EINVAL for an unknown name. */
int loom_gpt2_preset(const char *name, loom_gpt2_config_t *cfg);
/* LOOM_EINVAL (with loom_errmsg) when a field is non-positive or C % NH != 0. */
int loom_gpt2_config_check(const loom_gpt2_config_t *cfg);
int loom_gpt2_num_tensors(const loom_gpt2_config_t *cfg); /* 2 + 12 L + 2 */
/* Fill *info for tensor i (0 <= i < num_tensors). LOOM_EINVAL when i is out of range. */
int loom_gpt2_tensor_info(const loom_gpt2_config_t *cfg, int i, loom_tensor_info_t *info);
/* Index of the tensor called `name` (HF name, "transformer." prefix allowed), or -1. */
int loom_gpt2_tensor_index(const loom_gpt2_config_t *cfg, const char *name);
size_t loom_gpt2_num_params(const loom_gpt2_config_t *cfg);
/* FLOPs of one training token (forward + backward): 6 x (parameters in matmuls, lm head included)
 * + 12 x L x C x T, with T the sequence length actually trained on. */
double loom_gpt2_flops_per_token(const loom_gpt2_config_t *cfg, int T);

#ifdef __cplusplus
}
#endif
#endif
