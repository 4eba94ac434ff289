/* loom/gpt2.h: the GPT-2 model (exactly HF/llm.c GPT-2), fp32, forward, backward, sampling.
 *
 * Parameters live in one contiguous float buffer, tensor after tensor in HF order (below), each
 * tensor in HF's layout (Conv1D weights are [in, out]: y = x W + b). Gradients have the same layout
 * in a second buffer. The model reaches each tensor through a view (a pointer) that the caller may
 * point at its own memory: a shard, a gathered buffer, a shared-memory bucket. Backward produces
 * gradients in reverse tensor order (ln_f first, wte last) and can report each tensor as soon as its
 * gradient is final (for bucketed data-parallel all-reduce).
 *
 * The network is a sequence of units: the embedding (unit -1), blocks 0..L-1, the head (unit L:
 * ln_f, the lm head tied to wte, the loss). Besides whole-model passes, each unit's forward and
 * backward can be called alone, on one of several activation arenas (one per micro-batch in
 * flight), and a model may hold only a range of blocks (a pipeline stage).
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
#include "loom/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* GPT-2's configuration is the common one (loom/model.h) with arch LOOM_ARCH_GPT2 (0): its first five
 * fields, {L, NH, C, T, V}, are GPT-2's. */
typedef loom_model_config_t loom_gpt2_config_t;

/* A model is used by one thread at a time (its calls are not thread-safe); inside a call its kernels
 * run on loom_set_num_threads threads. */
typedef struct loom_gpt2 loom_gpt2_t;
/* The same model through the model interface (loom/model.h), for the trainer and the strategies: a
 * GPT-2 model starts with its family's table, so this is a conversion, not a new object. */
static inline loom_model_t *loom_gpt2_model(loom_gpt2_t *m)
{
	return (loom_model_t *)(void *)m;
}

#define LOOM_GPT2_LAYER_TENSORS 12
/* The parameter table's entries are loom_tensor_info_t (loom/model.h). GPT-2's: decay 1 for 2-D
 * weights, 0 for biases and LayerNorm. layer: -1 for wte, wpe; the block index for a block's tensors;
 * L for ln_f (wte has head_reads: the tied lm head reads it). tp_dim: Conv1D weights are [in, out]:
 * column-parallel attn.c_attn.weight and mlp.c_fc.weight split dim 1 (their biases dim 0), row-
 * parallel attn.c_proj.weight and mlp.c_proj.weight split dim 0, wte is vocab-parallel (dim 0);
 * -1 for LayerNorms, wpe, attn.c_proj.bias, mlp.c_proj.bias. attn.c_attn (kind LOOM_TP_QKV) has three
 * output sections q | k | v of C each, split by heads within each section, rank r of p taking heads
 * [r NH/p, (r+1) NH/p) of q, of k and of v. Optimizer groups: the blocks' 2-D weights MATRIX (c_attn
 * one matrix), the rest (wte, wpe, biases, LayerNorms) VECTOR; 2-D weights are transposed ([in, out]). */

/* Presets: "tiny" (L4 H4 C128 T128 V257), "small" (L6 H6 C384 T256 V50257), "gpt2" (124M:
 * L12 H12 C768 T1024 V50257). LOOM_EINVAL for an unknown name. */
int loom_gpt2_preset(const char *name, loom_gpt2_config_t *cfg);
/* LOOM_EINVAL (with loom_errmsg) when a field is non-positive or C % NH != 0. */
int loom_gpt2_config_check(const loom_gpt2_config_t *cfg);
int loom_gpt2_num_tensors(const loom_gpt2_config_t *cfg); /* 2 + 12 L + 2 */
/* Fill *info for tensor i (0 <= i < num_tensors). LOOM_EINVAL when i is out of range. */
int loom_gpt2_tensor_info(const loom_gpt2_config_t *cfg, int i, loom_tensor_info_t *info);
/* The whole tensor table of m's configuration (loom_gpt2_num_tensors entries, in tensor order), owned
 * by the model; *n (may be NULL) receives the count. */
const loom_tensor_info_t *loom_gpt2_tensors(const loom_gpt2_t *m, int *n);
/* Index of the tensor called `name` (HF name, "transformer." prefix allowed), or -1. */
int loom_gpt2_tensor_index(const loom_gpt2_config_t *cfg, const char *name);
size_t loom_gpt2_num_params(const loom_gpt2_config_t *cfg);
/* FLOPs of one training token (forward + backward), as the kernels must do them: 6 x (parameters in
 * matmuls, lm head included) + 12 x L x C x (T + 1) / 2, the causal triangle's keys a query on average,
 * with T the sequence length actually trained on (loom/model.h: loom_model_attn_flops). The nominal
 * 6N + 12 L C T is loom_model_flops_per_token_nominal's. */
double loom_gpt2_flops_per_token(const loom_gpt2_config_t *cfg, int T);

/* ---- the model ------------------------------------------------------------------------------- */

/* Activation checkpointing: what a block keeps from its forward for its backward.
 *   NONE       everything (per layer and arena 16 BTC + 4 BT + B NH T^2 floats, with tp: local sizes);
 *   BLOCKS     only the block's input (the residual stream, BTC per layer and arena); every block's
 *              forward writes its other activations into ONE block's scratch shared by all layers and
 *              arenas, and block_backward recomputes the block's forward into it first (up to the MLP's
 *              c_proj input: its output is the next block's kept input, not needed);
 *   SELECTIVE  everything but the attention probabilities (B NH T^2, the O(T^2) part: Megatron's
 *              selective recomputation), which one layer's scratch holds; block_backward recomputes them
 *              from the kept q, k, v.
 * The recomputation runs the forward's own kernels on the same inputs and parameters, so gradients
 * and losses are bit-identical to NONE; it runs inside block_backward, after the block's (l, 1)
 * param-use hook, which therefore fires once per backward as without checkpointing; with tensor
 * parallelism the recomputed forward runs its all-reduce again (every tp rank the same). */
/* loom_act_ckpt_t and loom_compute_dtype_t (loom/model.h). */
/* How a bf16 GEMM runs. Both compute the fp32 GEMM of the bf16-rounded operands and differ only in
 * the order of the fp32 additions. NATIVE: oneDNN's bf16 matmul on AVX512-BF16 or AMX-BF16 (bf16
 * operands in memory, `vdpbf16ps` / AMX tiles). PORTABLE: the operands rounded to bf16 but kept as
 * fp32 values, then the fp32 sgemm; every x86-64 CPU, about as fast as fp32. AUTO: native where this
 * machine has it, else portable. */
typedef enum { LOOM_BF16_AUTO = 0, LOOM_BF16_PORTABLE = 1, LOOM_BF16_NATIVE = 2 } loom_bf16_path_t;
/* 1 when this CPU and the installed oneDNN run bf16 matmuls natively (AVX512-BF16 or AMX-BF16 as
 * oneDNN dispatches, so DNNL_MAX_CPU_ISA below AVX512_CORE_BF16 says no), else 0; whatever LOOM_BF16
 * says. Probed once per process (a small oneDNN primitive); thread-safe. */
int loom_bf16_native(void);
/* The path `--dtype bf16` takes in this process: the environment's LOOM_BF16 (auto, the default;
 * native; portable) over loom_bf16_native(). LOOM_OK with *path NATIVE or PORTABLE; LOOM_EINVAL for
 * another LOOM_BF16 value, LOOM_ENOTSUP for LOOM_BF16=native where it cannot run (the message names
 * the missing CPU feature or oneDNN's limit). Thread-safe. */
int loom_bf16_path(loom_bf16_path_t *path);
/* The path's description for start-up lines: "native AVX512-BF16 (oneDNN brg:avx512_core_bf16)",
 * "native AMX-BF16 (oneDNN ...)", "portable (bf16-rounded operands, fp32 FMA)"; "?" for AUTO or an
 * invalid value. Static storage. */
const char *loom_bf16_path_name(loom_bf16_path_t path);

/* Options of loom_gpt2_create_opts (loom_model_opts_t); zero-initialize and set what differs.
 *   B, T: capacity of one micro-batch: up to B x T tokens, T <= cfg->seq_len.
 *   arenas: activation arenas, i.e. micro-batches whose activations are kept at once (0: 1).
 *   layer_lo, layer_hi: the blocks this model runs, [layer_lo, layer_hi) (layer_hi 0: n_layer;
 *     layer_lo = layer_hi = n_layer: no block, the head alone), for a pipeline stage: activations
 *     exist only for these blocks; the embedding is held iff layer_lo == 0 and the head (ln_f, lm
 *     head, loss) iff layer_hi == n_layer. Parameters keep the whole model's layout.
 *   no_own_params, no_own_grads: 1: allocate no parameter (gradient) buffer, e.g. for ZeRO-3, which
 *     would not use it; every view is then NULL until the caller sets it, and must be set before the
 *     unit using it runs (a pass over a NULL view is a caller error: it crashes). loom_gpt2_init
 *     skips NULL views.
 *   tp_size, tp_rank: tensor parallelism (Megatron): this model is rank tp_rank of tp_size (0: 1, no
 *     parallelism) and holds only its shards (loom_gpt2_shard_info): attention heads [r NH/p,
 *     (r+1) NH/p), MLP columns [r 4C/p, (r+1) 4C/p) and vocabulary rows [r Vp/p, (r+1) Vp/p) of wte,
 *     where Vp is V rounded up to a multiple of p (the padding rows are zero, never trained and never
 *     written to checkpoints); LayerNorms, wpe and the row-parallel biases are whole on every rank.
 *     Such a model needs a reduction (loom_gpt2_on_tp_reduce) before any pass. n_head must be
 *     divisible by tp_size.
 *   act_ckpt: activation checkpointing (above); 0: none.
 *   sequence_parallel: 1 with tp_size > 1: Megatron sequence parallelism (Korthikanti et al. 2022).
 *     Between the tensor-parallel regions (the LayerNorms, the residual adds) each rank keeps only its
 *     rows [r N/p, (r+1) N/p) of the N = B x T positions; the f/g points become an all-gather before
 *     the column-parallel matmuls and a reduce-scatter after the row-parallel ones (the reduction's
 *     LOOM_TP_ALLGATHER and LOOM_TP_REDUCE_SCATTER), and the LayerNorms' gradients of the local rows
 *     are summed over the group. The stream at a unit boundary stays whole (block lo's input, block
 *     hi-1's output, so a pipeline stage sends the same activation as without it; the head and the
 *     stream gradient leaving block lo). B x T must be divisible by tp_size.
 *   dtype: matmul precision (0: fp32). LOOM_COMPUTE_BF16 runs on loom_bf16_path()'s path; its errors
 *     (LOOM_BF16=native where impossible) are create's.
 *   cp_size, cp_rank: context parallelism (loom/model.h): T is this rank's rows of each sequence of
 *     cp_size x T positions (the chunks of loom_cp_chunks' layout: for GPT-2, causal only, the
 *     head-tail chunks cp_rank and 2 cp_size - 1 - cp_rank), T even; the
 *     embedding adds the rows' wpe positions, the attention reaches the group's keys and values
 *     (loom_gpt2_on_cp_reduce, needed before any pass). */
typedef loom_model_opts_t loom_gpt2_opts_t;

/* Bytes of a model's activation buffers (the one allocation create makes for them), by role:
 *   kept: every arena's activations kept from forward to backward: block lo's input, each held
 *     block's kept buffers, the head's ln_f output and losses;
 *   recompute: the shared scratch the checkpointed activations live in (blocks: one block's,
 *     selective: one layer's attention probabilities; 0 for none);
 *   per_layer: of kept, one block of one arena (for none: 16 BTC + 4 BT + B NH T^2 floats);
 *   head: shared head scratch: classifier chunk logits, last-position logits;
 *   backward: shared backward scratch (residual-stream gradients, attention dS per thread);
 *   total: the sum: the bytes allocated. */
typedef loom_model_act_bytes_t loom_gpt2_act_bytes_t;
/* The activation bytes a model created with cfg and opts allocates (no allocation is made: this is
 * the layout's arithmetic, the same code create uses). LOOM_EINVAL as loom_gpt2_create_opts. */
int loom_gpt2_act_bytes(const loom_gpt2_config_t *cfg, const loom_gpt2_opts_t *opts, loom_gpt2_act_bytes_t *out);
/* The same for a model that exists: what its create allocated. */
void loom_gpt2_model_act_bytes(const loom_gpt2_t *m, loom_gpt2_act_bytes_t *out);
loom_act_ckpt_t loom_gpt2_act_ckpt(const loom_gpt2_t *m);
/* 1 when created with sequence_parallel (and tp > 1), else 0. */
int loom_gpt2_sequence_parallel(const loom_gpt2_t *m);
/* Recomputations since create: block forwards (blocks) or attention probabilities (selective) rerun
 * by block_backward, one per block backward. 0 for none. */
long long loom_gpt2_recomputes(const loom_gpt2_t *m);
/* Blocks this model holds: [*lo, *hi) (a pipeline stage's range; 0, n_layer for a whole model), and
 * its activation arenas. */
void loom_gpt2_layers(const loom_gpt2_t *m, int *lo, int *hi, int *arenas);

/* Create a model for micro-batches of up to B x T tokens (T <= cfg->seq_len). Parameters, gradients
 * and every activation buffer are allocated here, once; training steps allocate nothing (only the
 * sampling KV cache is allocated later, see loom_gpt2_generate). Parameters
 * start at zero: call loom_gpt2_init or copy weights into loom_gpt2_params. LOOM_EINVAL for a bad
 * config or size, LOOM_ENOMEM; *m is NULL on failure. The model owns all its buffers (but not the
 * memory views are pointed at). */
int loom_gpt2_create(loom_gpt2_t **m, const loom_gpt2_config_t *cfg, int B, int T);
/* The same with options: loom_gpt2_create(m, cfg, B, T) is opts {B, T} (1 arena, every layer, own
 * buffers). LOOM_EINVAL (with loom_errmsg) for a bad config, size or layer range, LOOM_ENOMEM. */
int loom_gpt2_create_opts(loom_gpt2_t **m, const loom_gpt2_config_t *cfg, const loom_gpt2_opts_t *opts);
void loom_gpt2_destroy(loom_gpt2_t *m); /* safe on NULL */
const loom_gpt2_config_t *loom_gpt2_config(const loom_gpt2_t *m);
loom_compute_dtype_t loom_gpt2_dtype(const loom_gpt2_t *m); /* the matmul precision given at create */
float *loom_gpt2_params(loom_gpt2_t *m); /* loom_gpt2_num_params floats, layout above */
float *loom_gpt2_grads(loom_gpt2_t *m);  /* same layout */
/* Use caller-owned memory (num_params floats, e.g. from loom_comm_alloc) for the gradients from now
 * on; its contents are kept as they are. The caller keeps ownership. LOOM_EINVAL for NULL. */
int loom_gpt2_set_grad_buffer(loom_gpt2_t *m, float *grads);

/* ---- parameter and gradient views ---------------------------------------------------------------
 *
 * Every kernel reads tensor i's parameters and accumulates its gradient through two pointers, the
 * tensor's views. By default they point into the model's own buffers (num_params floats each, the
 * layout above). The calls below point them at the caller's memory instead: contents are neither
 * copied nor cleared, the caller keeps ownership and must keep the memory alive while the views
 * point at it. loom_gpt2_params / loom_gpt2_grads return the last whole buffer set (or the own one),
 * even when single tensors were pointed elsewhere since. Views may change between any two calls,
 * including from inside a param-use hook (below), which is how ZeRO-3 points a block's tensors at
 * a buffer gathered just before the block runs. */

/* Point every parameter view into params (num_params floats, the layout above); NULL points them
 * back at the model's own buffer, allocating it (zeroed) if create was told not to. LOOM_ENOMEM. */
int loom_gpt2_set_param_buffer(loom_gpt2_t *m, float *params);
/* Point every gradient view back at the model's own buffer, allocating it (zeroed) if create was
 * told not to (loom_gpt2_set_grad_buffer keeps refusing NULL, as it always did). LOOM_ENOMEM. */
int loom_gpt2_own_grads(loom_gpt2_t *m);
/* Point tensor i's views at param and grad (numel floats each); a NULL pointer leaves that view as it
 * is. LOOM_EINVAL for an index out of range. */
int loom_gpt2_set_tensor_view(loom_gpt2_t *m, int tensor, float *param, float *grad);
/* The same for all tensors of one unit at once (-1 embeddings wte and wpe, 0..L-1 a block, L ln_f):
 * they are contiguous in the layout, so params/grads hold them in that order, packed
 * (e.g. LOOM_GPT2_LAYER_TENSORS tensors of a block, from h.l.ln_1.weight on). LOOM_EINVAL. */
int loom_gpt2_set_unit_view(loom_gpt2_t *m, int unit, float *params, float *grads);
/* Tensor i's current views (NULL when nothing backs them yet). */
float *loom_gpt2_tensor_param(loom_gpt2_t *m, int tensor);
float *loom_gpt2_tensor_grad(loom_gpt2_t *m, int tensor);

/* GPT-2 initialization, reproducible from seed: weights normal(0, 0.02), the residual projections
 * (attn.c_proj.weight, mlp.c_proj.weight) normal(0, 0.02/sqrt(2L)), biases 0, LayerNorm weight 1.
 * Tensor i draws from its own splitmix64 stream seeded with seed ^ (0x9e3779b97f4a7c15 * (i + 1)),
 * normals by Box-Muller (src/model/rng.h), so its values do not depend on the other tensors. A
 * tensor-parallel shard gets exactly the whole model's values at its positions (padding rows 0). */
void loom_gpt2_init(loom_gpt2_t *m, uint64_t seed);

/* Forward pass over inputs (B,T) token ids with B, T within the sizes given at create. With targets
 * (B,T), *loss is the mean cross-entropy over all B*T positions. Without targets (NULL), only the
 * logits of the last position of each row are computed (loom_gpt2_logits). LOOM_EINVAL (with
 * loom_errmsg) for a token id outside [0, V), sizes beyond those of create or a model that does not
 * hold every layer. Runs in arena 0, whose activations it overwrites. */
int loom_gpt2_forward(loom_gpt2_t *m, const int *inputs, const int *targets, int B, int T, float *loss);
/* Logits (B, V) of the last position of each row after a forward without targets; owned by the
 * model, valid until its next call. */
const float *loom_gpt2_logits(const loom_gpt2_t *m);

/* Sets the gradients to 0: the whole current gradient buffer, or each tensor's view when single
 * views point elsewhere (views that are NULL are skipped). */
void loom_gpt2_zero_grad(loom_gpt2_t *m);
/* Training micro-step: forward with targets, then backward of (loss * grad_scale); gradients
 * accumulate (+=) into the gradient buffer, so grad_scale = 1/accum gives gradient accumulation.
 * *loss is the unscaled mean loss. When a grad-ready callback is set, it is called once per tensor,
 * in reverse tensor order, as soon as that tensor's gradient for this micro-step is final (on the
 * calling thread, between kernels). LOOM_EINVAL as for loom_gpt2_forward, or for NULL targets. It is
 * exactly embed_forward, block_forward 0..L-1, head_forward_backward, block_backward L-1..0 and
 * embed_backward in arena 0 (below). */
int loom_gpt2_forward_backward(loom_gpt2_t *m, const int *inputs, const int *targets, int B, int T,
                               float grad_scale, float *loss);
void loom_gpt2_on_grad_ready(loom_gpt2_t *m, loom_grad_ready_fn fn, void *ctx);

/* ---- passes by unit: embedding, blocks, head ------------------------------------------------------
 *
 * The whole-model calls above are compositions of these; a caller runs them to execute a range of
 * blocks (a pipeline stage), recompute a block (activation checkpointing) or interleave micro-
 * batches. `mb` names an activation arena (0 <= mb < arenas), which holds the activations of one
 * micro-batch of B x T tokens (within create's sizes; every call for one micro-batch must use the
 * same B, T). A block l reads its input from the residual stream buffer loom_gpt2_block_input(m,
 * mb, l) and its output is loom_gpt2_block_input(m, mb, l + 1), which is also what the head reads
 * (l + 1 = n_layer). Backward: the gradient of the residual stream is one (B*T, C) buffer,
 * loom_gpt2_stream_grad, shared by all arenas: one micro-batch's backward, from the head (or from
 * the gradient injected into that buffer) down to the first block of the range (or the embedding),
 * must finish before another's begins; forwards may be interleaved with it freely. Backward reads
 * the arena's activations as the last forward of each unit left them; every backward accumulates
 * (+=) into the gradient views and reports tensors to the grad-ready callback when final. Each call
 * returns LOOM_EINVAL (with loom_errmsg) for an arena, block or size out of range, a token id
 * outside [0, V), or a unit this model does not hold. */

/* Embedding forward: block_input(layer_lo = 0) = wte[inputs] + wpe[t]. inputs (B,T). */
int loom_gpt2_embed_forward(loom_gpt2_t *m, int mb, const int *inputs, int B, int T);
/* Block l's forward: reads block_input(l), writes the block's activations and block_input(l + 1). */
int loom_gpt2_block_forward(loom_gpt2_t *m, int mb, int l, int B, int T);
/* Head forward (ln_f, logits, loss): reads block_input(n_layer). With targets (B,T), *loss (may be
 * NULL) is the mean cross-entropy; without (NULL), the last position of each row gets its logits
 * (loom_gpt2_logits, shared by all arenas). Leaves nothing for a backward. */
int loom_gpt2_head_forward(loom_gpt2_t *m, int mb, const int *targets, int B, int T, float *loss);
/* Head forward and backward fused (the fast path: the chunked classifier never stores the logits):
 * *loss as above; the gradients of ln_f and wte's lm-head share accumulate (scaled by grad_scale),
 * and stream_grad is SET to d(loss * grad_scale) / d block_input(n_layer). Reports ln_f's tensors
 * (and wte, when the model does not hold the embedding: its share here is then final). */
int loom_gpt2_head_forward_backward(loom_gpt2_t *m, int mb, const int *targets, int B, int T, float grad_scale,
                                    float *loss);
/* The same on positions [row0, row0 + rows) of the B x T (row b T + t) only, for a pipeline that
 * splits the head's positions between two stages: targets is the whole (B,T) array; the gradients
 * are scaled by grad_scale / (B T) and *loss is those rows' summed loss / (B T), so the parts of a
 * split add up to the whole call's; stream_grad is set on those rows only (the others untouched).
 * LOOM_EINVAL for rows outside [0, B T) or empty. */
int loom_gpt2_head_forward_backward_rows(loom_gpt2_t *m, int mb, const int *targets, int B, int T, int row0,
                                         int rows, float grad_scale, float *loss);
/* Block l's backward: stream_grad holds d block_input(l + 1) on entry and d block_input(l) on return
 * (a pipeline stage writes the gradient it receives into stream_grad before its last block's
 * backward, and sends stream_grad after its first block's). Reports block l's tensors. */
int loom_gpt2_block_backward(loom_gpt2_t *m, int mb, int l, int B, int T);
/* Embedding backward from stream_grad = d block_input(0); inputs as given to the forward. Reports
 * wpe, then wte. */
int loom_gpt2_embed_backward(loom_gpt2_t *m, int mb, const int *inputs, int B, int T);

/* The residual stream buffer in front of block l (l in [layer_lo, layer_hi]; layer_hi: the head's
 * input, the output of the range's last block), rows of C floats packed for B x T: writable, so a
 * pipeline stage receives its input straight into block_input(layer_lo). Owned by the model; NULL
 * for an arena or block out of range. */
float *loom_gpt2_block_input(loom_gpt2_t *m, int mb, int l);
/* The gradient of the residual stream (B*T rows of C floats), shared by all arenas; see above. */
float *loom_gpt2_stream_grad(loom_gpt2_t *m);

/* Called before a unit uses its parameters: unit -1 the embedding, 0..L-1 a block, L the head (which
 * also reads wte); phase 0 in a forward, 1 in a backward. The fused head calls (L, 0) then (L, 1)
 * before it starts. A hook may change views (above); it must not call back into the model. */
void loom_gpt2_on_param_use(loom_gpt2_t *m, loom_param_use_fn fn, void *ctx);

/* ---- tensor parallelism ---------------------------------------------------------------------------
 *
 * The model stays ignorant of communicators: at Megatron's f and g points it calls a reduction that
 * the caller (the tensor-parallel strategy, src/parallel/tp.c) provides, on every rank of the tensor-
 * parallel group in the same order. Per block, forward: one sum after attn.c_proj and one after
 * mlp.c_proj (before their replicated biases are added); backward: one sum of the gradient of the
 * input of attn.c_attn and one of mlp.c_fc. The embedding sums its vocab-parallel lookups; the vocab-
 * parallel cross-entropy reduces per chunk of positions the row maxima (max), then the sums of
 * exponentials and target logits (sum), and in backward the gradient of ln_f's output (sum); the full
 * logits never exist. With tp_size 1 none of this runs. */

/* Reduce buf (n floats) in place across the tensor-parallel group with op; every rank must get the
 * same bits. Returns LOOM_OK or a negative LOOM_E* (with loom_errmsg), which the model's pass then
 * returns (the pass's results are undefined). */
void loom_gpt2_on_tp_reduce(loom_gpt2_t *m, loom_tp_reduce_fn fn, void *ctx);
int loom_gpt2_tp_size(const loom_gpt2_t *m); /* 1 without tensor parallelism */
int loom_gpt2_tp_rank(const loom_gpt2_t *m);
/* Context parallelism (opts cp_size > 1): the group's hook (loom/model.h's loom_model_on_cp_reduce):
 * the ring's transfers and waits in every block's attention forward and backward (and recomputed
 * attention), or with LOOM_CP_ATTENTION=gather an all-gather per forward and an all-gather and a
 * reduce-scatter per backward. */
void loom_gpt2_on_cp_reduce(loom_gpt2_t *m, loom_tp_reduce_fn fn, void *ctx);
int loom_gpt2_cp_size(const loom_gpt2_t *m); /* 1 without context parallelism */
int loom_gpt2_cp_rank(const loom_gpt2_t *m);
/* LOOM_EINVAL (with loom_errmsg naming what is not divisible) when cfg cannot be split tp ways:
 * n_head (and with it n_embd and 4 n_embd) must be divisible by tp. The vocabulary never needs to be:
 * it is padded. LOOM_OK for tp 1. */
int loom_gpt2_tp_check(const loom_gpt2_config_t *cfg, int tp);
/* Tensor i of one shard of a tp-way split: its shape along tp_dim divided by tp (wte's rows: the
 * padded vocabulary's), offsets in the shard's own flat buffer (same tensor order). With tp 1 it is
 * loom_gpt2_tensor_info. LOOM_EINVAL for a bad index. */
int loom_gpt2_shard_info(const loom_gpt2_config_t *cfg, int tp, int i, loom_tensor_info_t *info);
/* Floats in one shard's flat buffer (every rank's is the same size); loom_gpt2_num_params for tp 1. */
size_t loom_gpt2_shard_params(const loom_gpt2_config_t *cfg, int tp);
/* Floats in m's parameter (and gradient) buffer: loom_gpt2_shard_params(cfg, its tp size). */
size_t loom_gpt2_param_count(const loom_gpt2_t *m);
/* Between the full HF layout (loom_gpt2_num_params floats) and rank r's shard of a tp-way split:
 * _shard copies r's part of full into shard (padding rows set to 0); _unshard writes r's part of full
 * from shard (whole tensors too; padding rows are dropped), leaving the other ranks' parts as they
 * are, so unsharding every rank's shard into one buffer rebuilds the full tensors. */
void loom_gpt2_tp_shard(const loom_gpt2_config_t *cfg, int tp, int r, const float *full, float *shard);
void loom_gpt2_tp_unshard(const loom_gpt2_config_t *cfg, int tp, int r, const float *shard, float *full);

/* ---- sampling ---------------------------------------------------------------------------------- */

/* Allocate the KV cache of loom_gpt2_generate now rather than at its first call (for a context of
 * the T given at create): L x T x 3C floats plus one layer's forward over T positions. Idempotent.
 * LOOM_ENOMEM; LOOM_EINVAL for a model that does not hold every layer. */
int loom_gpt2_kv_cache_alloc(loom_gpt2_t *m);

/* Autoregressive generation with a KV cache: feeds prompt (n_prompt >= 1 tokens), then samples up to
 * max_new tokens (temperature 0: greedy; top_k 0: whole vocabulary), stopping early after
 * stop_token (>= 0) or when the context (prompt + generated) reaches the T given at create (at most
 * cfg.seq_len; create with B = 1, T = seq_len for sampling). Generated tokens go to out (capacity
 * max_new), their number to *n_out, and each one to on_token (may be NULL) as soon as it exists.
 * The same seed gives the same tokens. The cache is the model's own (loom_gpt2_kv_cache_alloc,
 * allocated at the first call if not before): the training activations, the arenas and
 * loom_gpt2_logits are left as they are. LOOM_EINVAL for a prompt that is empty, longer than T or has
 * a token outside [0, V), a negative temperature or top_k, or a model without every layer;
 * LOOM_ENOMEM when the cache cannot be allocated. */
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

/* The fp32 GEMM every matmul runs on: oneDNN's sgemm (LOOM_GEMM_ONEDNN, the default: its kernels are
 * chosen by the CPU's features) or OpenBLAS's (LOOM_GEMM_OPENBLAS, with LOOM_GEMM=openblas in the
 * environment; OpenBLAS chooses its kernels by the CPU's model, see loom_blas_plan in loom/cpu.h).
 * Chosen once per process. The name says which kernels run, e.g. "oneDNN sgemm (jit avx512_core)". */
enum { LOOM_GEMM_ONEDNN = 0, LOOM_GEMM_OPENBLAS = 1 };
int loom_gemm_backend(void);
/* LOOM_GEMM's value as a backend: NULL, "", "onednn" or "auto" LOOM_GEMM_ONEDNN, "openblas" (or
 * "blas") LOOM_GEMM_OPENBLAS, anything else -1 (loom_gemm_backend then takes oneDNN; `loom` refuses it). */
int loom_gemm_backend_parse(const char *env);
const char *loom_gemm_backend_name(void); /* a per-thread static buffer */

/* Measured sgemm throughput in FLOP/s of C (M,N) = A (M,K) B (K,N), row-major, fp32, through the
 * model's threaded sgemm on `threads` threads (<= 0: the current count, which is restored after):
 * best of repeated runs lasting about `seconds` in all. 0 if the buffers cannot be allocated. */
double loom_gemm_flops(int threads, int M, int N, int K, double seconds);
/* Peak sgemm FLOP/s on this machine with `threads` threads, for MFU: the best of a few large shapes
 * (square 1024 and the GPT-2 `small` preset's lm-head and MLP products), about 2 s in all. */
double loom_gemm_peak_flops(int threads);
/* The same in either matmul precision (bf16: the model's bf16 GEMM on loom_bf16_path()'s path, operand
 * conversion included); 0 when the GEMM fails (e.g. LOOM_BF16=native where it cannot run). */
double loom_gemm_flops_dtype(loom_compute_dtype_t dt, int threads, int M, int N, int K, double seconds);
double loom_gemm_peak_flops_dtype(loom_compute_dtype_t dt, int threads);
/* The hardware's peak FLOP/s for matmuls in precision dt on `threads` threads (<= 0: the current
 * count), what MFU is relative to: fp32, the FMA throughput loop of the widest unit (loom/cpu.h);
 * bf16, AVX512-BF16's dot-product loop on the native path, the bf16 GEMM's own peak where it runs on
 * AMX tiles (no loop of loom's drives them), the fp32 FMA loop on the portable path (it multiplies in
 * fp32). *source (may be NULL) gets a static description of what was measured. About 0.5 s. */
double loom_hw_peak_flops(loom_compute_dtype_t dt, int threads, const char **source);
/* The description loom_hw_peak_flops would give, without measuring. */
void loom_hw_peak_source(loom_compute_dtype_t dt, const char **source);

#ifdef __cplusplus
}
#endif
#endif
