/* loom/model.h: the model interface every strategy, the trainer, checkpoints and the CLI use.
 *
 * A model family (GPT-2, nanochat's GPT) implements one table of operations, loom_model_family_t; a
 * model is a handle whose first member points at its family's table. Everything outside src/model/
 * reaches a model through the loom_model_* calls below, which dispatch through the table, and learns
 * the model's layout from its parameter table (loom_tensor_info_t): names, shapes, offsets in the
 * flat buffer, the unit that uses each tensor, weight decay, the optimizer group, the tensor-parallel
 * split. Nothing outside src/model/ names a tensor of a family.
 *
 * The contract is the one GPT-2 has always had (loom/gpt2.h documents each call in full):
 *  - parameters and gradients in two flat float buffers, tensor after tensor in the table's order,
 *    reached by kernels only through per-tensor views that a caller may point at its own memory;
 *  - the network as a chain of units: the embedding (unit -1), blocks 0..L-1, the head (unit L: final
 *    norm, lm head, loss). The tensors of a unit are contiguous in the table and the units come in
 *    order (-1, 0, ..., L), so a unit's parameters are one contiguous range of the flat buffer;
 *  - per-micro-batch activation arenas; the residual stream between units (loom_model_block_input,
 *    loom_model_stream_width floats per position) and its gradient (loom_model_stream_grad);
 *  - hooks: param-use before a unit runs (ZeRO-3 gathers), grad-ready when a tensor's gradient is
 *    final (DDP / ZeRO buckets), a tensor-parallel reduction at Megatron's f and g points.
 *
 * Adding a family: docs/architecture.md, "Add a model family". */
#ifndef LOOM_MODEL_H
#define LOOM_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "loom/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- configuration ------------------------------------------------------------------------------ */

typedef enum { LOOM_ARCH_GPT2 = 0, LOOM_ARCH_NANOCHAT = 1, LOOM_ARCH_LLAMA = 2 } loom_arch_t;

#define LOOM_WINDOW_PATTERN_MAX 32

/* RoPE's frequency scaling (transformers' `rope_scaling` / `rope_parameters`). */
typedef enum { LOOM_ROPE_DEFAULT = 0, LOOM_ROPE_LLAMA3 = 1 } loom_rope_type_t;
typedef struct {
	loom_rope_type_t type;
	/* llama3: wavelengths below original_max_position_embeddings / high_freq_factor are kept, those
	 * above original / low_freq_factor divided by factor, those between blended */
	double factor, low_freq_factor, high_freq_factor;
	int original_max_position_embeddings;
} loom_rope_scaling_t;

/* One configuration type for every family. The first five fields are GPT-2's, in GPT-2's order (so
 * `{L, NH, C, T, V}` is a GPT-2 configuration); a zero-initialized field takes its family's default. */
typedef struct {
	int n_layer;    /* L */
	int n_head;     /* NH (query heads) */
	int n_embd;     /* C, divisible by n_head */
	int seq_len;    /* T: maximum sequence length (GPT-2: rows of wpe; nanochat: sequence_len) */
	int vocab_size; /* V (the real vocabulary; a family may pad its tables) */
	loom_arch_t arch;  /* 0: GPT-2 */
	/* nanochat only (0 / "" for GPT-2): */
	int n_kv_head;     /* key/value heads, dividing n_head (0: n_head) */
	int short_window;  /* the `S` window W: a query sees itself and W positions before it (0: seq_len / 2) */
	char window_pattern[LOOM_WINDOW_PATTERN_MAX]; /* per-layer `S`/`L`, tiled, last layer `L` ("": "SSSL") */
	/* llama only (LOOM_ARCH_LLAMA: transformers' LlamaForCausalLM and Qwen2ForCausalLM; n_kv_head
	 * above is num_key_value_heads, seq_len max_position_embeddings): */
	int head_dim;             /* 0: n_embd / n_head */
	int intermediate_size;    /* the SwiGLU MLP's width (0: the family's default) */
	double rope_theta;        /* 0: 10000 */
	double rms_norm_eps;      /* 0: 1e-6 */
	loom_rope_scaling_t rope_scaling;
	int tie_word_embeddings;  /* 1: the lm head is the embedding (no lm_head.weight) */
	int attention_bias;       /* 1: biases on q, k, v and o (Llama's attention_bias) */
	int qkv_bias;             /* 1: biases on q, k and v only (Qwen2) */
	int mlp_bias;             /* 1: biases on gate, up and down */
	int qwen2;                /* 1: model_type "qwen2" (Qwen2ForCausalLM) when written out */
	int has_token_ids;        /* 1: bos_token_id and eos_token_id below are set */
	int bos_token_id, eos_token_id;
} loom_model_config_t;

/* "gpt2" | "nanochat" to the arch; LOOM_EINVAL naming the families for another name. */
int loom_arch_parse(const char *name, loom_arch_t *arch);
const char *loom_arch_name(loom_arch_t arch); /* "?" when invalid */

/* ---- the parameter table ------------------------------------------------------------------------- */

#define LOOM_TENSOR_NAME_MAX 64

/* Which optimizer treatment a tensor gets under MuonAdamW (--optimizer muon; under AdamW every tensor
 * is one group at --lr and only `decay` matters). */
typedef enum {
	LOOM_OPT_MATRIX = 0,  /* a 2-D matrix of a block: Muon */
	LOOM_OPT_EMBED = 1,   /* token (and value / position) embeddings: AdamW at --embedding-lr */
	LOOM_OPT_UNEMBED = 2, /* the lm head: AdamW at --unembedding-lr */
	LOOM_OPT_SCALAR = 3,  /* per-layer residual scalars (nanochat's resid_lambdas): AdamW at 0.01 --scalar-lr */
	LOOM_OPT_X0 = 4,      /* nanochat's x0_lambdas: AdamW at --scalar-lr, betas (0.96, 0.95) */
	LOOM_OPT_VECTOR = 5   /* GPT-2's embeddings (tied wte, wpe), biases and LayerNorms: AdamW at --lr */
} loom_opt_group_t;

/* How tensor parallelism splits a tensor (tp_dim names the dimension). */
typedef enum {
	LOOM_TP_WHOLE = 0,   /* every tp rank keeps it whole */
	LOOM_TP_SPLIT = 1,   /* one contiguous 1/tp slice of tp_dim per rank (columns, rows, heads, vocabulary) */
	LOOM_TP_QKV = 2      /* GPT-2's fused c_attn: three sections q | k | v, each split by heads */
} loom_tp_kind_t;

typedef struct {
	char name[LOOM_TENSOR_NAME_MAX]; /* the family's checkpoint name (GPT-2: HF's without "transformer.") */
	int ndim;                        /* 1 or 2 */
	size_t shape[2];                 /* as stored in the flat buffer */
	size_t offset;                   /* in floats, from the start of the parameter buffer */
	size_t numel;
	int decay; /* 1: AdamW's weight decay applies (under --optimizer adamw) */
	/* The unit that uses the tensor (and reports its gradient): -1 the embedding, 0..L-1 a block, L
	 * (n_layer) the head. */
	int layer;
	/* Where else the tensor is read: head_reads, the head also reads it (GPT-2's tied lm head reads wte,
	 * whose gradient is then final only after the head's share and the embedding's); all_blocks, every
	 * block reads it (nanochat's per-layer scalars, which live in the embedding unit). A pipeline sums
	 * such a tensor's gradient over the stages that read it; ZeRO-3 keeps it gathered meanwhile. */
	int head_reads;
	int all_blocks;
	/* Megatron's split: -1 (and kind WHOLE) when every tp rank keeps it whole, else the dimension. */
	int tp_dim;
	loom_tp_kind_t tp_kind;
	loom_opt_group_t opt_group;
	/* 1 when the tensor is stored [in, out] (GPT-2's Conv1D): Muon then treats it as the [out, in]
	 * matrix nn.Linear would hold (its transpose), so rows/cols below are PyTorch's. */
	int transposed;
	int rows, cols; /* the matrix as Muon sees it ([out, in]); 0 for 1-D tensors */
} loom_tensor_info_t;

/* ---- options shared by every family ----------------------------------------------------------------- */

/* Activation checkpointing: what a block keeps from its forward for its backward (loom/gpt2.h). */
typedef enum { LOOM_ACT_CKPT_NONE = 0, LOOM_ACT_CKPT_BLOCKS = 1, LOOM_ACT_CKPT_SELECTIVE = 2 } loom_act_ckpt_t;
/* "none" | "blocks" | "selective"; LOOM_EINVAL ("'X' is not one of none, blocks, selective"). */
int loom_act_ckpt_parse(const char *name, loom_act_ckpt_t *mode);
const char *loom_act_ckpt_name(loom_act_ckpt_t mode); /* "?" when invalid */
/* Precision of the model's matmuls (loom/gpt2.h). */
typedef enum { LOOM_COMPUTE_FP32 = 0, LOOM_COMPUTE_BF16 = 1 } loom_compute_dtype_t;
int loom_compute_dtype_parse(const char *name, loom_compute_dtype_t *dt);
const char *loom_compute_dtype_name(loom_compute_dtype_t dt);

/* Options of create; zero-initialize and set what differs (loom/gpt2.h documents each). */
typedef struct {
	int B, T;   /* capacity of one micro-batch: up to B x T tokens, T <= cfg->seq_len */
	int arenas; /* activation arenas (0: 1) */
	int layer_lo, layer_hi; /* the blocks held, [lo, hi) (hi 0: n_layer): a pipeline stage */
	int no_own_params;
	int no_own_grads;
	int tp_size, tp_rank;     /* tensor parallelism (0: none) */
	loom_act_ckpt_t act_ckpt; /* 0: none */
	loom_compute_dtype_t dtype;
	int sequence_parallel; /* 1: Megatron sequence parallelism over the tp ranks (needs tp_size > 1) */
	/* Context parallelism (0: none): this model is rank cp_rank of cp_size N. It holds T rows of each
	 * sequence of N T positions (T even, N T <= seq_len): its K chunks of the layout (loom_cp_position,
	 * K = loom_cp_chunks(cfg, N T, N); K = 2: the chunks cp_rank and 2N-1-cp_rank of the sequence cut
	 * into 2N), for which the calls pass its rows (inputs, targets: B x T of them, loom_cp_take). Everything but attention is position-wise and runs on those rows; the
	 * attention reaches the group's keys and values through the hook (loom_model_on_cp_reduce), needed
	 * before any pass. The loss is the mean over the rank's rows: the group's mean is the average of its
	 * ranks', and so is the gradient, which the data-parallel strategy averages over dp x cp. Training
	 * passes only: sampling (logits of the last position, generate) refuses such a model. */
	int cp_size, cp_rank;
	/* NULL, or per tensor of the family's (shard) table: 1 for the tensors this model holds (a
	 * pipeline stage's: its blocks', and whatever else its units read). The model's table, parameter
	 * and gradient buffers and tensor indices are then those tensors only, in table order and packed
	 * (loom_model_tensors gives their offsets in the packed buffer, layer and flags as the family's),
	 * so a stage keeps only its own; the others are never read (no unit of the model reads them).
	 * loom_model_init gives the tensors it holds the whole model's initial values (each tensor draws
	 * from a stream of its own), or its parameters are copied in. */
	const unsigned char *keep;
} loom_model_opts_t;

/* Bytes of a model's activation buffers, by role (loom/gpt2.h). */
typedef struct {
	size_t kept, recompute, per_layer, head, backward, total;
} loom_model_act_bytes_t;

/* The tensor-parallel hook's operations, all collective over the tp group and in place on buf (n
 * floats, the same n on every rank): SUM and MAX all-reduce; with sequence parallelism, n divisible by
 * the group size p and rank r's part the floats [r n/p, (r+1) n/p): ALLGATHER fills all of buf from
 * every rank's part (on entry only the own part is read), REDUCE_SCATTER leaves in the own part the
 * group's sum of that part (the other parts are then undefined). */
/* The context-parallel hook also passes buffers around the group's ring (ranks in group order, each to
 * the next): SEND_NEXT starts sending buf (n floats) to rank (r+1) mod p, RECV_PREV starts receiving n
 * floats from rank (r-1) mod p into buf, WAIT completes every transfer started (buffers untouched until
 * then; on every rank in the same order, sends and receives of a step paired). */
typedef enum {
	LOOM_TP_SUM = 0, LOOM_TP_MAX = 1, LOOM_TP_ALLGATHER = 2, LOOM_TP_REDUCE_SCATTER = 3,
	LOOM_TP_SEND_NEXT = 4, LOOM_TP_RECV_PREV = 5, LOOM_TP_WAIT = 6
} loom_tp_op_t;
typedef int (*loom_tp_reduce_fn)(void *ctx, float *buf, size_t n, loom_tp_op_t op);
typedef void (*loom_grad_ready_fn)(void *ctx, int tensor_index);
typedef void (*loom_param_use_fn)(void *ctx, int unit, int phase);

/* ---- the family table ------------------------------------------------------------------------------- */

typedef struct loom_model loom_model_t;

typedef struct {
	const char *name; /* "gpt2", "nanochat" */
	loom_arch_t arch;
	/* configuration level */
	int (*config_check)(const loom_model_config_t *cfg);
	int (*num_tensors)(const loom_model_config_t *cfg);
	int (*tensor_info)(const loom_model_config_t *cfg, int i, loom_tensor_info_t *info);
	size_t (*num_params)(const loom_model_config_t *cfg);
	/* loom_model_flops_per_token's count; at T = 0 (no query sees a key) its 6N alone, to which
	 * loom_model_flops_per_token_nominal adds the reference's attention */
	double (*flops_per_token)(const loom_model_config_t *cfg, int T);
	int (*stream_width)(const loom_model_config_t *cfg);
	int (*kv_width)(const loom_model_config_t *cfg); /* floats of a position's keys (kv heads x head dim) */
	int (*tp_check)(const loom_model_config_t *cfg, int tp);
	int (*shard_info)(const loom_model_config_t *cfg, int tp, int i, loom_tensor_info_t *info);
	size_t (*shard_params)(const loom_model_config_t *cfg, int tp);
	void (*tp_shard)(const loom_model_config_t *cfg, int tp, int r, const float *full, float *shard);
	void (*tp_unshard)(const loom_model_config_t *cfg, int tp, int r, const float *shard, float *full);
	/* tp_shard / tp_unshard of tensor i alone, between its whole values (full) and rank r's shard of it */
	void (*tp_copy_tensor)(const loom_model_config_t *cfg, int tp, int r, int i, float *full, float *shard,
	                       int to_shard);
	int (*act_bytes)(const loom_model_config_t *cfg, const loom_model_opts_t *opts, loom_model_act_bytes_t *out);
	int (*create)(loom_model_t **m, const loom_model_config_t *cfg, const loom_model_opts_t *opts);
	/* instance level */
	void (*destroy)(loom_model_t *m);
	const loom_model_config_t *(*config)(const loom_model_t *m);
	loom_compute_dtype_t (*dtype)(const loom_model_t *m);
	const loom_tensor_info_t *(*tensors)(const loom_model_t *m, int *n);
	size_t (*param_count)(const loom_model_t *m);
	float *(*params)(loom_model_t *m);
	float *(*grads)(loom_model_t *m);
	int (*set_grad_buffer)(loom_model_t *m, float *grads);
	int (*set_param_buffer)(loom_model_t *m, float *params);
	int (*own_grads)(loom_model_t *m);
	int (*set_tensor_view)(loom_model_t *m, int tensor, float *param, float *grad);
	int (*set_unit_view)(loom_model_t *m, int unit, float *params, float *grads);
	float *(*tensor_param)(loom_model_t *m, int tensor);
	float *(*tensor_grad)(loom_model_t *m, int tensor);
	void (*init)(loom_model_t *m, uint64_t seed);
	void (*layers)(const loom_model_t *m, int *lo, int *hi, int *arenas);
	loom_act_ckpt_t (*act_ckpt)(const loom_model_t *m);
	int (*sequence_parallel)(const loom_model_t *m); /* NULL: never */
	long long (*recomputes)(const loom_model_t *m);
	void (*model_act_bytes)(const loom_model_t *m, loom_model_act_bytes_t *out);
	int (*forward)(loom_model_t *m, const int *inputs, const int *targets, int B, int T, float *loss);
	const float *(*logits)(const loom_model_t *m);
	void (*zero_grad)(loom_model_t *m);
	int (*forward_backward)(loom_model_t *m, const int *inputs, const int *targets, int B, int T, float grad_scale,
	                        float *loss);
	void (*on_grad_ready)(loom_model_t *m, loom_grad_ready_fn fn, void *ctx);
	void (*on_param_use)(loom_model_t *m, loom_param_use_fn fn, void *ctx);
	void (*on_tp_reduce)(loom_model_t *m, loom_tp_reduce_fn fn, void *ctx);
	int (*set_inputs)(loom_model_t *m, int mb, const int *inputs, int B, int T); /* NULL: not needed */
	int (*embed_forward)(loom_model_t *m, int mb, const int *inputs, int B, int T);
	int (*block_forward)(loom_model_t *m, int mb, int l, int B, int T);
	int (*head_forward)(loom_model_t *m, int mb, const int *targets, int B, int T, float *loss);
	int (*head_forward_backward)(loom_model_t *m, int mb, const int *targets, int B, int T, float grad_scale,
	                             float *loss);
	int (*head_forward_backward_rows)(loom_model_t *m, int mb, const int *targets, int B, int T, int row0, int rows,
	                                  float grad_scale, float *loss);
	int (*block_backward)(loom_model_t *m, int mb, int l, int B, int T);
	int (*embed_backward)(loom_model_t *m, int mb, const int *inputs, int B, int T);
	float *(*block_input)(loom_model_t *m, int mb, int l);
	float *(*stream_grad)(loom_model_t *m);
	int (*tp_size)(const loom_model_t *m);
	int (*tp_rank)(const loom_model_t *m);
	/* context parallelism (loom_model_opts_t cp_size, cp_rank): the group's hook, this model's place */
	void (*on_cp_reduce)(loom_model_t *m, loom_tp_reduce_fn fn, void *ctx);
	int (*cp_size)(const loom_model_t *m);
	int (*cp_rank)(const loom_model_t *m);
	int (*kv_cache_alloc)(loom_model_t *m);
	int (*generate)(loom_model_t *m, const int *prompt, int n_prompt, int max_new, float temperature, int top_k,
	                uint64_t seed, int stop_token, int *out, int *n_out, void (*on_token)(void *ctx, int token),
	                void *ctx);
	void (*profile)(loom_model_t *m, int enable);
	void (*profile_report)(loom_model_t *m, void *file, int steps);
	/* optional: FLOPs per token (forward + backward) of unit u at sequence length T, attention counted
	 * as loom_model_block_attn_flops; NULL takes loom_model_unit_flops' count from the parameter table */
	double (*unit_flops)(const loom_model_config_t *cfg, int unit, int T);
	/* optional: the activation bytes by the family's written formula, for a run of B x T micro-batches
	 * (a cross-check of act_bytes' allocation, printed beside it), and the formula (static text) */
	size_t (*act_formula)(const loom_model_t *m, int B, int T, const char **text);
} loom_model_family_t;

/* Every model starts with this: its family, and (NULL unless created with opts.keep) the packed table
 * and buffers of the tensors it holds (src/model/iface.c; the family never looks at it). */
struct loom__model_local;
struct loom_model {
	const loom_model_family_t *family;
	struct loom__model_local *local;
};

/* The family of an arch; NULL for an invalid one. */
const loom_model_family_t *loom_model_family(loom_arch_t arch);

/* ---- configuration-level calls (dispatch on cfg->arch) ---------------------------------------------- */

/* 1 when a and b describe the same model (a field left 0 counts as its family's default), else 0. */
int loom_model_config_equal(const loom_model_config_t *a, const loom_model_config_t *b);

/* LOOM_EINVAL (with loom_errmsg) for an unknown arch or a configuration the family refuses. */
int loom_model_config_check(const loom_model_config_t *cfg);
int loom_model_num_tensors(const loom_model_config_t *cfg);
int loom_model_tensor_info(const loom_model_config_t *cfg, int i, loom_tensor_info_t *info);
/* Index of the tensor called `name` (the family's name; GPT-2 also accepts "transformer."), or -1. */
int loom_model_tensor_index(const loom_model_config_t *cfg, const char *name);
size_t loom_model_num_params(const loom_model_config_t *cfg);
/* FLOPs of one training token (forward + backward) at sequence length T, as the kernels must do them:
 * 6 x matmul parameters plus, per block, loom_model_block_attn_flops (the keys inside the causal mask
 * and the block's window). What MFU, `loom plan` and the pipeline balance count (docs/model.md). */
double loom_model_flops_per_token(const loom_model_config_t *cfg, int T);
/* The family's reference implementation's own count, which takes each block's attention as the whole
 * T x min(W, T) rectangle: 6 x matmul parameters + 12 NH D min(W, T) per block (nanochat's
 * estimate_flops; for GPT-2, W >= T, nanoGPT's and PaLM's appendix B 6N + 12 L C T), for comparing
 * with that implementation's logs. Above loom_model_flops_per_token but for windows W with
 * W (W + 1) < 2T (the rectangle has W keys a query, the kernel W + 1: the query's own). 0 for a
 * configuration its family refuses. */
double loom_model_flops_per_token_nominal(const loom_model_config_t *cfg, int T);
/* Keys that the T queries of a sequence see in all under a causal mask with window W (query t, from 0,
 * sees keys max(0, t - W)..t): sum over t < T of min(t, W) + 1, exact (closed form, no loop): W >= T - 1
 * gives the causal triangle T (T + 1) / 2, W = 0 gives T. 0 when T <= 0 or W < 0. */
double loom_model_attn_keys(int T, int W);
/* FLOPs per token, forward + backward, of one causal attention of `width` = query heads x head_dim
 * channels over sequences of T with window W: 12 width loom_model_attn_keys(T, W) / T (forward Q K^T
 * and P V, 2 each per key and channel; backward dP, dS^T Q, P^T dO, dS K; a flash backward's
 * recomputed scores are not counted). 0 when T <= 0. */
double loom_model_attn_flops(int width, int T, int W);
/* loom_model_attn_flops of block l (0..L-1) of cfg at sequence length T: its query heads x head_dim
 * and window (GPT-2: the whole causal prefix; nanochat: its window pattern's W for the block); 0 for
 * another l. The whole model's heads: a tensor-parallel rank does 1/tp of it, as of the rest. */
double loom_model_block_attn_flops(const loom_model_config_t *cfg, int l, int T);
/* Floats per position of the residual stream passed between units (GPT-2: C; nanochat: 2C, the
 * stream x and the normalized embedding x0 every block reads). */
int loom_model_stream_width(const loom_model_config_t *cfg);
/* Floats of one position's keys in a layer (as many for its values): kv heads x head dim (GPT-2: n_embd).
 * What context parallelism gathers per layer (of a tensor-parallel shard: / tp). 0 for an invalid arch. */
int loom_model_kv_width(const loom_model_config_t *cfg);
int loom_model_tp_check(const loom_model_config_t *cfg, int tp);
int loom_model_shard_info(const loom_model_config_t *cfg, int tp, int i, loom_tensor_info_t *info);
size_t loom_model_shard_params(const loom_model_config_t *cfg, int tp);
void loom_model_tp_shard(const loom_model_config_t *cfg, int tp, int r, const float *full, float *shard);
void loom_model_tp_unshard(const loom_model_config_t *cfg, int tp, int r, const float *shard, float *full);
/* The two for tensor i alone: its whole values (the table's numel floats) and rank r's shard of it (the
 * shard table's numel floats), as the whole-buffer calls copy them. */
void loom_model_tp_shard_tensor(const loom_model_config_t *cfg, int tp, int r, int i, const float *full, float *shard);
void loom_model_tp_unshard_tensor(const loom_model_config_t *cfg, int tp, int r, int i, const float *shard, float *full);
int loom_model_act_bytes(const loom_model_config_t *cfg, const loom_model_opts_t *opts, loom_model_act_bytes_t *out);
/* FLOPs per token, forward + backward, of unit u (-1..L) at sequence length T, for balancing pipeline
 * stages and the planner: the family's own count, or 6 x the unit's matmul parameters (its 2-D tensors
 * but the embeddings, plus for the head the tensors it reads from the embedding: GPT-2's tied lm head)
 * and, for a block, loom_model_block_attn_flops. */
double loom_model_unit_flops(const loom_model_config_t *cfg, int unit, int T);
/* The tensors of unit u (-1..L) are [*first, *end) of the table. */
void loom_model_unit_tensors(const loom_model_config_t *cfg, int unit, int *first, int *end);

/* ---- context parallelism's layout ------------------------------------------------------------------- */

/* The layout: a sequence of T positions is cut into N K chunks of T/(N K), K even (the chunks per
 * rank), taken as K/2 segments of 2N chunks; in each segment rank r of N holds the head-tail pair
 * (Megatron, torchtitan, Llama 3), the segment's chunks r and 2N-1-r, so rank r's chunks are 2N s + r
 * and 2N s + 2N-1-r for s < K/2, in that order, as its T/N rows. K = 2 is the head-tail layout, which
 * balances the causal mask; a window (nanochat's short window T/2) needs more segments to be balanced
 * too (loom_cp_chunks). LOOM_OK when T divides by 2N (N >= 1), else LOOM_EINVAL saying so (the
 * message names T and N). */
int loom_cp_check(int T, int N);
/* The chunks per rank K of cfg's layout over N ranks at sequence length T (which passes loom_cp_check):
 * of K = 2, 4, 8 (those that divide T by N K), the one whose most loaded rank sees the fewest keys over
 * all blocks (their causal masks and windows: loom_model_attn_keys per chunk), a larger K only when it
 * lightens that rank by more than 1%. 2 for any causal model without windows (GPT-2); 4 for nanochat's
 * "SSSL" at N = 2 and T a multiple of 8. 1 when N <= 1. Every rank and the model compute it from the same
 * cfg, T and N, so they agree; models created with cp_size > 1 take theirs from it at create. */
int loom_cp_chunks(const loom_model_config_t *cfg, int T, int N);
/* The absolute position of rank r's row t (0 <= t < T/N) of a sequence of T positions, K chunks per rank. */
int loom_cp_position(int T, int N, int K, int r, int t);
/* dst (B, T/N) = rank r's rows of each of the B sequences of src (B, T), in its row order (K chunks per
 * rank). */
void loom_cp_take(int *dst, const int *src, int B, int T, int N, int K, int r);
/* The form of context-parallel attention models created now run, from the environment's
 * LOOM_CP_ATTENTION: 1 the ring (unset or "ring": keys and values passed around the group, overlapped
 * with the blocks' work), 0 the all-gather ("gather"); -1 with loom_errmsg for another value (a model
 * with cp_size > 1 is then refused at create). */
int loom_cp_attention_ring(void);

/* ---- instance-level calls ------------------------------------------------------------------------------ */

int loom_model_create(loom_model_t **m, const loom_model_config_t *cfg, const loom_model_opts_t *opts);
void loom_model_destroy(loom_model_t *m); /* safe on NULL */
const loom_model_config_t *loom_model_get_config(const loom_model_t *m);
loom_compute_dtype_t loom_model_dtype(const loom_model_t *m);
const loom_tensor_info_t *loom_model_tensors(const loom_model_t *m, int *n);
size_t loom_model_param_count(const loom_model_t *m);
float *loom_model_params(loom_model_t *m);
float *loom_model_grads(loom_model_t *m);
int loom_model_set_grad_buffer(loom_model_t *m, float *grads);
int loom_model_set_param_buffer(loom_model_t *m, float *params);
/* Frees the parameter buffer a model created with opts.keep (or a join) allocated itself, once a
 * strategy keeps the parameters elsewhere (ZeRO-3: shards, gathered into unit views before each use):
 * loom_model_params is NULL after it and the tensor views are left to be set before their next use;
 * loom_model_set_param_buffer(m, NULL) allocates a new one. No effect on another model. */
void loom_model_drop_params(loom_model_t *m);
int loom_model_own_grads(loom_model_t *m);
int loom_model_set_tensor_view(loom_model_t *m, int tensor, float *param, float *grad);
int loom_model_set_unit_view(loom_model_t *m, int unit, float *params, float *grads);
float *loom_model_tensor_param(loom_model_t *m, int tensor);
float *loom_model_tensor_grad(loom_model_t *m, int tensor);
void loom_model_init(loom_model_t *m, uint64_t seed);
void loom_model_layers(const loom_model_t *m, int *lo, int *hi, int *arenas);
loom_act_ckpt_t loom_model_act_ckpt(const loom_model_t *m);
/* 1 when the model was created with sequence_parallel (loom_model_opts_t), else 0. */
int loom_model_sequence_parallel(const loom_model_t *m);
long long loom_model_recomputes(const loom_model_t *m);
void loom_model_model_act_bytes(const loom_model_t *m, loom_model_act_bytes_t *out);
int loom_model_forward(loom_model_t *m, const int *inputs, const int *targets, int B, int T, float *loss);
const float *loom_model_logits(const loom_model_t *m);
void loom_model_zero_grad(loom_model_t *m);
int loom_model_forward_backward(loom_model_t *m, const int *inputs, const int *targets, int B, int T,
                                float grad_scale, float *loss);
void loom_model_on_grad_ready(loom_model_t *m, loom_grad_ready_fn fn, void *ctx);
void loom_model_on_param_use(loom_model_t *m, loom_param_use_fn fn, void *ctx);
void loom_model_on_tp_reduce(loom_model_t *m, loom_tp_reduce_fn fn, void *ctx);
/* The context-parallel group's hook (a model created with cp_size > 1 needs it before any pass): fn is
 * called with LOOM_TP_ALLGATHER and LOOM_TP_REDUCE_SCATTER, collective over the group, as the
 * tensor-parallel hook's operations of those names (rank-ordered parts of buf, in place), and (ring
 * attention) LOOM_TP_SEND_NEXT, LOOM_TP_RECV_PREV and LOOM_TP_WAIT. */
void loom_model_on_cp_reduce(loom_model_t *m, loom_tp_reduce_fn fn, void *ctx);
int loom_model_cp_size(const loom_model_t *m); /* 1 without context parallelism */
int loom_model_cp_rank(const loom_model_t *m);
/* Give arena mb the micro-batch's token ids (B,T) without running the embedding: a pipeline stage
 * that does not hold the embedding calls it before the micro-batch's first block, for families whose
 * blocks read the tokens (nanochat's value embeddings). A no-op for the others. LOOM_EINVAL as
 * embed_forward. */
int loom_model_set_inputs(loom_model_t *m, int mb, const int *inputs, int B, int T);
int loom_model_embed_forward(loom_model_t *m, int mb, const int *inputs, int B, int T);
int loom_model_block_forward(loom_model_t *m, int mb, int l, int B, int T);
int loom_model_head_forward(loom_model_t *m, int mb, const int *targets, int B, int T, float *loss);
int loom_model_head_forward_backward(loom_model_t *m, int mb, const int *targets, int B, int T, float grad_scale,
                                     float *loss);
int loom_model_head_forward_backward_rows(loom_model_t *m, int mb, const int *targets, int B, int T, int row0,
                                          int rows, float grad_scale, float *loss);
int loom_model_block_backward(loom_model_t *m, int mb, int l, int B, int T);
int loom_model_embed_backward(loom_model_t *m, int mb, const int *inputs, int B, int T);
float *loom_model_block_input(loom_model_t *m, int mb, int l);
float *loom_model_stream_grad(loom_model_t *m);
int loom_model_tp_size(const loom_model_t *m);
int loom_model_tp_rank(const loom_model_t *m);
int loom_model_kv_cache_alloc(loom_model_t *m);
int loom_model_generate(loom_model_t *m, const int *prompt, int n_prompt, int max_new, float temperature, int top_k,
                        uint64_t seed, int stop_token, int *out, int *n_out, void (*on_token)(void *ctx, int token),
                        void *ctx);
/* The family's activation formula (above); 0 and "(no formula)" for a family without one. */
size_t loom_model_act_formula(const loom_model_t *m, int B, int T, const char **text);
void loom_model_profile(loom_model_t *m, int enable);
void loom_model_profile_report(loom_model_t *m, void *file, int steps);

#ifdef __cplusplus
}
#endif
#endif
