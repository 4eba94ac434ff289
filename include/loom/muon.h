/* loom/muon.h: nanochat's MuonAdamW optimizer (karpathy/nanochat bac5a35, nanochat/optim.py) over a
 * model's flat parameter buffer: Muon with Polar Express and NorMuon on the 2-D block matrices, AdamW
 * on the rest, the DistMuon ownership rules, and base_train.py's schedules. docs/muon.md has the
 * whole algorithm, its differences from nanochat and the numbers behind the defaults.
 *
 * Which treatment a tensor gets comes from its opt_group in the model's parameter table
 * (loom/model.h): LOOM_OPT_MATRIX tensors are Muon's, every other group is one of AdamW's. A Muon
 * matrix is seen as PyTorch's nn.Linear [out, in] = [rows, cols] (the table's rows/cols); a tensor
 * stored transposed (GPT-2's Conv1D [in, out], transposed = 1) is updated in place in its stored
 * layout as if it were that transpose, without a copy. Everything runs in fp32 (nanochat runs Muon's
 * orthogonalization and NorMuon in bf16). */
#ifndef LOOM_MUON_H
#define LOOM_MUON_H

#include <stddef.h>

#include "loom/error.h"
#include "loom/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- one Muon matrix --------------------------------------------------------------------------- */

/* Floats of scratch loom_muon_update needs for a [rows, cols] matrix (either orientation):
 * 2 rows cols + 2 min(rows, cols)^2 + 3 max(rows, cols). */
size_t loom_muon_scratch_floats(int rows, int cols);

/* One Muon update of the matrix P, seen as [rows, cols] ([out, in]). p, g and buf hold rows x cols
 * floats in the stored layout: row-major [rows, cols], or [cols, rows] when transposed = 1 (then the
 * matrix is their transpose). s holds NorMuon's second moment, max(rows, cols) floats: one per row
 * of the [rows, cols] view when rows >= cols, else one per column. buf and s start at zero. With
 * G = g * grad_scale (g is not modified):
 *   1. buf = lerp(buf, G, 1 - mu); G = lerp(G, buf, mu)                          (Nesterov)
 *   2. X = G / (|G|_F 1.02 + 1e-6), then 5 Polar Express steps, over the smaller Gram matrix
 *   3. NorMuon over the reduced dimension (columns when rows >= cols, else rows), beta2, s
 *   4. p = p - lr' X - lr' wd p [X p >= 0], lr' = lr sqrt(max(1, rows / cols))   (cautious decay)
 * scratch: loom_muon_scratch_floats(rows, cols) floats, 8-byte aligned (loom_alloc_aligned's are).
 * The products run on loom's fp32 sgemm, threaded over the OpenMP threads when called outside a
 * parallel region (inside one: on the calling thread). Not thread-safe for one matrix.
 * Returns LOOM_OK, or LOOM_EINVAL (nothing changed) for a non-positive dimension, a non-finite or
 * negative lr or wd, or mu, beta2 or grad_scale out of range (mu, beta2 in [0, 1]). */
int loom_muon_update(float *p, const float *g, float grad_scale, float *buf, float *s, int rows, int cols,
                     int transposed, float lr, float wd, float mu, float beta2, float *scratch);

/* ---- base_train.py's schedules (pure functions; step counts from 0 at the first update) ----------- */

/* Muon's momentum at `step`: 0.85 rising linearly to 0.95 at step 300, then 0.95 (get_muon_momentum). */
float loom_muon_momentum(long long step);
/* Muon's weight decay at `step` of `steps`: wd (1 - step / steps), linear to 0 (get_weight_decay). */
double loom_muon_weight_decay(double wd, long long step, long long steps);
/* The learning-rate multiplier of every group at `step` of `steps` (get_lr_multiplier): with
 * W = round(warmup_ratio steps) and D = round(warmdown_ratio steps) (Python's round: half to even),
 * (step + 1) / W for step < W; 1 up to step <= steps - D; then, with f = (steps - step) / D,
 * f + (1 - f) final_lr_frac. nanochat's defaults: warmup_ratio 0, warmdown_ratio 0.5, final 0. */
double loom_muon_lr_multiplier(long long step, long long steps, double warmup_ratio, double warmdown_ratio,
                               double final_lr_frac);
/* nanochat's reference batch, B_ref = 2^19 tokens: the default of the one B_ref that every batch
 * scaling below takes (base_train has one B_REF for the learning rate, the weight decay and the
 * automatic batch size; `loom train --ref-batch-size` sets it for both of its scalings). */
#define LOOM_MUON_B_REF 524288.0
/* Every group's learning rate is scaled by sqrt(B / B_ref), B tokens per optimizer step (exactly 1
 * when B = B_ref). */
double loom_muon_batch_lr_scale(double tokens_per_step, double B_ref);
/* Muon's weight decay for a run: wd_ref sqrt(B / B_ref) (D_ref / D), B tokens per step, D the run's
 * token horizon and D_ref the reference one (base_train passes its target_tokens and d12's). */
double loom_muon_weight_decay_scaled(double wd_ref, double tokens_per_step, double B_ref, double D, double D_ref);
/* base_train's automatic batch size: 2^round(log2(B_ref (D / D_ref)^0.383)) tokens. */
double loom_muon_auto_batch(double D, double D_ref, double B_ref);

/* ---- DistMuon's ownership rules (pure functions over a parameter table) --------------------------- */

/* Muon's matrices (opt_group LOOM_OPT_MATRIX) form groups of equal [rows, cols], ordered by
 * (rows, cols); a group's members are in table order. Of N ranks, rank r owns the members
 * [r c, min(K, (r + 1) c)) of a group of K, c = ceil(K / N) (so with K < N the last ranks own none). */
int loom_muon_num_groups(const loom_tensor_info_t *t, int nt);
/* Group g's shape and its K members (tensor indices, table order) into members[0..min(K, cap)).
 * Returns K, or LOOM_EINVAL when g is not a group. */
int loom_muon_group(const loom_tensor_info_t *t, int nt, int g, int *rows, int *cols, int *members, int cap);
/* ceil(K / nranks): the members each rank owns (the last ones may own fewer). */
int loom_muon_chunk(int K, int nranks);
/* The rank that owns Muon matrix `tensor` among nranks; LOOM_EINVAL when it is not a Muon matrix. */
int loom_muon_owner(const loom_tensor_info_t *t, int nt, int tensor, int nranks);
/* The Muon matrices rank owns (tensor indices, in group order) into out (room for nt); returns how many. */
int loom_muon_owned(const loom_tensor_info_t *t, int nt, int rank, int nranks, int *out);
/* The floats of the state loom_muonadamw_init keeps for a table t of nt tensors (its scratch aside):
 * AdamW's m and v for the non-Muon floats inside [range[0], range[1]) (range NULL: all of them), and
 * per Muon matrix of mats[0..nmats) (tensor indices) its momentum (rows x cols) and second moment
 * (max(rows, cols)). The trainer's memory accounting and `loom plan` both count with it. */
size_t loom_muonadamw_state_floats(const loom_tensor_info_t *t, int nt, const size_t *range, const int *mats,
                                   int nmats);
/* AdamW's share of a tensor on rank of nranks: a tensor of >= 1024 elements is split by its stored
 * first dimension (rows [r S0/N, (r+1) S0/N), all columns), a smaller one is replicated (every rank
 * updates all of it and keeps all its state). Sets [*lo, *hi), floats relative to the tensor's start;
 * returns 1 when split, 0 when replicated, LOOM_EINVAL when S0 is not divisible by nranks (nanochat
 * asserts) or for a Muon matrix. */
int loom_muon_adam_share(const loom_tensor_info_t *ti, int rank, int nranks, size_t *lo, size_t *hi);

/* ---- the optimizer ------------------------------------------------------------------------------ */

/* Hyper-parameters as base_train passes them to setup_optimizer (learning rates already multiplied
 * by loom_muon_batch_lr_scale, weight decay by loom_muon_weight_decay_scaled when wanted). */
typedef struct {
	int n_embd;             /* C: AdamW's EMBED and UNEMBED rates are scaled by (C / 768)^-0.5 */
	long long total_steps;  /* the run's optimizer steps: Muon's weight decay reaches 0 there */
	float unembedding_lr;   /* 0.004 (LOOM_OPT_UNEMBED) */
	float embedding_lr;     /* 0.3 (LOOM_OPT_EMBED) */
	float matrix_lr;        /* 0.02 (Muon) */
	float scalar_lr;        /* 0.5 (SCALAR at 0.01 x, X0 and VECTOR at 1 x) */
	float adam_beta1;       /* 0.8 */
	float adam_beta2;       /* 0.95 */
	float x0_beta1;         /* 0.96: LOOM_OPT_X0's beta1 (its beta2 is 0.95, fixed as in nanochat) */
	float adam_eps;         /* 1e-10 */
	float weight_decay;     /* Muon's (cautious) weight decay at step 0; nanochat's --weight-decay 0.2 */
	float muon_beta2;       /* NorMuon's 0.95 */
	float adamw_lr;         /* LOOM_OPT_VECTOR (GPT-2's embeddings, biases, LayerNorms): AdamW at this rate,
	                           with adam_beta1/2 and adam_eps (loom train: --lr, default 6e-4) */
} loom_muon_config_t;

/* The defaults above (n_embd 768, total_steps 1: set both). */
loom_muon_config_t loom_muon_defaults(void);

/* What one optimizer object updates. NULL (or a NULL member) means everything of that kind. */
typedef struct {
	const size_t (*ranges)[2]; /* AdamW floats owned: [lo, hi) of the flat buffer, non-overlapping */
	int nranges;
	const int *matrices;       /* Muon matrices owned (tensor indices) */
	int nmatrices;
} loom_muon_owned_t;

/* One AdamW piece: an owned part of a non-Muon tensor. */
typedef struct {
	int tensor;            /* index in the parameter table */
	size_t offset, numel;  /* floats [offset, offset + numel) of the flat buffer */
	size_t state;          /* its moments are m[state ...], v[state ...] */
	double lr;             /* before the schedule's multiplier */
	float beta1, beta2;
} loom_muon_adam_piece_t;

/* One owned Muon matrix and its state. */
typedef struct {
	int tensor;
	size_t offset;         /* in the flat buffer; rows x cols floats */
	int rows, cols, transposed;
	float *buf;            /* Nesterov momentum, rows x cols floats in the stored layout */
	float *s;              /* NorMuon's second moment, max(rows, cols) floats (see loom_muon_update) */
} loom_muon_matrix_t;

/* The optimizer. Its state, for checkpoints, is step plus, in this simple form:
 *  - AdamW: m and v, adam_n floats each; piece k's moments at [pieces[k].state, + pieces[k].numel),
 *    pieces in flat-buffer order (so m, v are the owned floats' moments in buffer order);
 *  - Muon: per owned matrix, buf and s (matrices in group order, as loom_muon_owned lists them).
 * All owned by the object; a checkpoint reader writes into them after init. */
typedef struct {
	loom_muon_config_t cfg;
	long long step;        /* optimizer steps taken: the next update is step `step` (0-based) */
	size_t adam_n;
	float *m, *v;
	int npieces;
	loom_muon_adam_piece_t *pieces;
	int nmat;
	loom_muon_matrix_t *mats;
	float *scratch;        /* loom_muon_update's, for the largest owned matrix */
} loom_muonadamw_t;

/* Build the optimizer for a parameter table (tensors[0..ntensors), from loom_model_tensors) under
 * cfg, owning what own says (NULL: every tensor: one process). State starts at zero, step at 0.
 * Returns LOOM_OK; LOOM_EINVAL (detail in loom_errmsg) for a bad config, a Muon tensor that is not
 * a rows x cols matrix, a range outside the table's tensors or overlapping another, a matrix index
 * that is not a Muon matrix; LOOM_ENOMEM. Free with loom_muonadamw_free. */
int loom_muonadamw_init(loom_muonadamw_t *o, const loom_tensor_info_t *tensors, int ntensors,
                        const loom_muon_config_t *cfg, const loom_muon_owned_t *own);
void loom_muonadamw_free(loom_muonadamw_t *o); /* safe on a zeroed or freed struct */

/* One step (number o->step): every group's rate is its base rate x lr_multiplier (the schedule's,
 * loom_muon_lr_multiplier), Muon's momentum loom_muon_momentum(step) and weight decay
 * loom_muon_weight_decay(cfg.weight_decay, step, cfg.total_steps); gradients are grads x grad_scale.
 * params and grads are the whole flat buffers, indexed by the table's offsets; only what o owns is
 * read (grads) or written (params). Increments o->step. Not thread-safe for one o.
 * Returns LOOM_OK, or LOOM_EINVAL (nothing changed) for a negative or non-finite multiplier or scale. */
int loom_muonadamw_step(loom_muonadamw_t *o, float *params, const float *grads, float lr_multiplier,
                        float grad_scale);
/* The same on buffers that start at float `base` of the flat layout (params[0] is float base): a ZeRO
 * shard of [base, base + count) that holds everything o owns. LOOM_EINVAL for an owned part below base. */
int loom_muonadamw_step_at(loom_muonadamw_t *o, float *params, const float *grads, size_t base,
                           float lr_multiplier, float grad_scale);

#ifdef __cplusplus
}
#endif
#endif
