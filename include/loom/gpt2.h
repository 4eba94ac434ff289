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

/* ---- the model ------------------------------------------------------------------------------- */

/* A model is used by one thread at a time (its calls are not thread-safe); inside a call its kernels
 * run on loom_set_num_threads threads. */
typedef struct loom_gpt2 loom_gpt2_t;

/* Create a model for micro-batches of up to B x T tokens (T <= cfg->seq_len). Parameters, gradients
 * and every activation buffer are allocated here, once; training steps allocate nothing. Parameters
 * start at zero: call loom_gpt2_init or copy weights into loom_gpt2_params. LOOM_EINVAL for a bad
 * config or size, LOOM_ENOMEM; *m is NULL on failure. The model owns all its buffers. */
int loom_gpt2_create(loom_gpt2_t **m, const loom_gpt2_config_t *cfg, int B, int T);
void loom_gpt2_destroy(loom_gpt2_t *m); /* safe on NULL */
const loom_gpt2_config_t *loom_gpt2_config(const loom_gpt2_t *m);
float *loom_gpt2_params(loom_gpt2_t *m); /* loom_gpt2_num_params floats, layout above */
float *loom_gpt2_grads(loom_gpt2_t *m);  /* same layout */
/* Use caller-owned memory (num_params floats, e.g. from loom_comm_alloc) for the gradients from now
 * on; its contents are kept as they are. The caller keeps ownership. */
int loom_gpt2_set_grad_buffer(loom_gpt2_t *m, float *grads);

/* GPT-2 initialization, reproducible from seed: weights normal(0, 0.02), the residual projections
 * (attn.c_proj.weight, mlp.c_proj.weight) normal(0, 0.02/sqrt(2L)), biases 0, LayerNorm weight 1.
 * Tensor i draws from its own splitmix64 stream seeded with seed ^ (0x9e3779b97f4a7c15 * (i + 1)),
 * normals by Box-Muller (src/model/rng.h), so its values do not depend on the other tensors. */
void loom_gpt2_init(loom_gpt2_t *m, uint64_t seed);

/* Forward pass over inputs (B,T) token ids with B, T within the sizes given at create. With targets
 * (B,T), *loss is the mean cross-entropy over all B*T positions. Without targets (NULL), only the
 * logits of the last position of each row are computed (loom_gpt2_logits). LOOM_EINVAL (with
 * loom_errmsg) for a token id outside [0, V) or sizes beyond those of create. */
int loom_gpt2_forward(loom_gpt2_t *m, const int *inputs, const int *targets, int B, int T, float *loss);
/* Logits (B, V) of the last position of each row after a forward without targets; owned by the
 * model, valid until its next call. */
const float *loom_gpt2_logits(const loom_gpt2_t *m);

void loom_gpt2_zero_grad(loom_gpt2_t *m); /* sets the current gradient buffer to 0 */
/* Training micro-step: forward with targets, then backward of (loss * grad_scale); gradients
 * accumulate (+=) into the gradient buffer, so grad_scale = 1/accum gives gradient accumulation.
 * *loss is the unscaled mean loss. When a grad-ready callback is set, it is called once per tensor,
 * in reverse tensor order, as soon as that tensor's gradient for this micro-step is final (on the
 * calling thread, between kernels). LOOM_EINVAL as for loom_gpt2_forward, or for NULL targets. */
int loom_gpt2_forward_backward(loom_gpt2_t *m, const int *inputs, const int *targets, int B, int T,
                               float grad_scale, float *loss);
typedef void (*loom_grad_ready_fn)(void *ctx, int tensor_index);
void loom_gpt2_on_grad_ready(loom_gpt2_t *m, loom_grad_ready_fn fn, void *ctx);

/* Autoregressive generation with a KV cache: feeds prompt (n_prompt >= 1 tokens), then samples up to
 * max_new tokens (temperature 0: greedy; top_k 0: whole vocabulary), stopping early after
 * stop_token (>= 0) or when the context (prompt + generated) reaches the T given at create (at most
 * cfg.seq_len; create with B = 1, T = seq_len for sampling). Generated tokens go to out (capacity
 * max_new), their number to *n_out, and each one to on_token (may be NULL) as soon as it exists.
 * The same seed gives the same tokens. The cache lives in the model's activation buffers: nothing
 * is allocated, and the activations of a previous forward are overwritten. LOOM_EINVAL for a prompt
 * that is empty, longer than T or has a token outside [0, V), or a negative temperature or top_k. */
int loom_gpt2_generate(loom_gpt2_t *m, const int *prompt, int n_prompt, int max_new, float temperature, int top_k,
                       uint64_t seed, int stop_token, int *out, int *n_out, void (*on_token)(void *ctx, int token),
                       void *ctx);

/* Per-kernel timing: when enabled, every forward/backward adds its kernels' wall time; the report
 * prints milliseconds per call of each kernel and its share, then resets the counters. */
void loom_gpt2_profile(loom_gpt2_t *m, int enable);
void loom_gpt2_profile_report(loom_gpt2_t *m, void *file /* FILE* */, int steps);

/* ---- threads and the sgemm peak ---------------------------------------------------------------- */

/* Run the model's kernels (loops and sgemm alike) on n threads of one OpenMP pool; n <= 0 means one
 * per online CPU. Whichever OpenBLAS build is loaded (pthreads or OpenMP), BLAS then never starts
 * threads of its own, so n threads in total are busy. Process-wide; call it before creating models,
 * not while a forward or backward runs. Returns the thread count now in effect. */
int loom_set_num_threads(int n);
int loom_num_threads(void); /* the thread count kernels use now */

/* Measured sgemm throughput in FLOP/s of C (M,N) = A (M,K) B (K,N), row-major, fp32, through the
 * model's threaded sgemm on `threads` threads (<= 0: the current count, which is restored after):
 * best of repeated runs lasting about `seconds` in all. 0 if the buffers cannot be allocated. */
double loom_gemm_flops(int threads, int M, int N, int K, double seconds);
/* Peak sgemm FLOP/s on this machine with `threads` threads, for MFU: the best of a few large shapes
 * (square 1024 and the GPT-2 `small` preset's lm-head and MLP products), about 2 s in all. */
double loom_gemm_peak_flops(int threads);

#ifdef __cplusplus
}
#endif
#endif
