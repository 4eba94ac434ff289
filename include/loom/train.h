/* loom/train.h: the training loop: LR schedules, a trainer that runs optimizer steps with gradient
 * accumulation, clipping and AdamW, evaluates, logs JSONL and saves/resumes training checkpoints.
 *
 * Batch arithmetic (as llm.c and nanochat): an optimizer step is `accum` micro-steps of B x T tokens
 * on each of `world` ranks. In step i (counting from 0), micro-step j, rank r reads data window
 * k = (i*accum + j)*world + r (loom/data.h). Gradients accumulate with scale 1/accum, so the step's
 * gradient is the mean over its micro-batches; the logged loss is the mean of the micro-step losses.
 *
 * Data parallelism: with a communicator of more than one rank in the config (or a mesh whose
 * data-parallel axis has several), every rank runs the same trainer on its own windows ("world" and
 * "rank" above are the data-parallel size and coordinate). The first step broadcasts rank 0's
 * parameters (initialized, loaded or resumed) and every rank verifies their checksum; gradients are
 * averaged across ranks by the parallel strategy ("ddp": loom/ddp.h's reducer) on the last
 * micro-step of each step only (no communication before it), so the averaged gradient, its norm,
 * the clipping and the update are bit-identical on every rank. The step's loss is averaged over
 * ranks and micro-steps; global rank 0 alone writes the log and checkpoints, which hold the loader
 * states of all data-parallel ranks. N ranks with accumulation A give the same losses (up to float
 * rounding) as one rank with accumulation N x A.
 *
 * Pipeline parallelism: on a mesh with pp > 1 each rank runs a stage (a FLOP-balanced range of
 * layers; with the interleaved 1F1B, pp_virtual_stages such ranges) and a step's accum
 * micro-batches flow through the stages in a GPipe, 1F1B or interleaved 1F1B schedule
 * (pp_schedule); losses match one
 * process with the same accumulation up to float rounding, every rank reports the same metrics,
 * checkpoints hold the whole model (gathered from the stages), and a pipeline's checkpoint resumes
 * on any mesh with the same data-parallel size (docs/mesh.md).
 *
 * Context parallelism: on a mesh with cp > 1 the cp ranks of a group read the same windows (B x T, T
 * the whole sequence) and each gives its model its rows of the layout (loom_cp_chunks of the model's
 * configuration, loom_cp_take: the model is created
 * with loom_model_opts_t cp_size = cp, cp_rank = its cp coordinate and T / cp rows; LOOM_EINVAL
 * otherwise, or when T does not divide by 2 cp); the trainer gives the model the cp group's gathers
 * (loom_model_on_cp_reduce), the strategy the dp x cp group (loom_mesh_dpcp_comm), over which the loss
 * and the evaluation are averaged. Losses match one process with the same tokens per step up to float
 * rounding; checkpoints do not depend on cp (any resumes at any cp).
 *
 * A training checkpoint (DIR/step_NNNNNNNN/, written through loom/ckpt.h) holds the model, the AdamW
 * state (m, v, step) and the trainer state (step, data-loader state, seed, config). There is no other
 * random state: the shuffle order is a function of (seed, epoch), and samples printed during
 * training use seed + step. Resuming and continuing gives bit-identical losses and parameters to an
 * uninterrupted run with the same thread count (the tested case; the optimizer and the gradient norm
 * do not depend on the thread count at all). */
#ifndef LOOM_TRAIN_H
#define LOOM_TRAIN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "loom/ckpt.h"
#include "loom/comm.h"
#include "loom/error.h"
#include "loom/gpt2.h"
#include "loom/mesh.h"
#include "loom/muon.h"
#include "loom/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- learning-rate schedule -------------------------------------------------------------------- */

typedef enum { LOOM_SCHED_COSINE = 0, LOOM_SCHED_LINEAR = 1, LOOM_SCHED_CONSTANT = 2, LOOM_SCHED_WARMDOWN = 3 } loom_schedule_kind_t;

/* Steps s = 1..N; P = peak_lr, W = warmup, F = P*min_lr_frac:
 *   s <= W: P*s/W;  then q = (s-W)/(N-W) in [0,1]: cosine F + (P-F)(1+cos(pi q))/2,
 *   linear P - (P-F) q, constant P. Step W uses P, step N uses F (cosine, linear).
 * warmdown is nanochat's base_train get_lr_multiplier at it = s - 1, with D = round(warmdown_frac N)
 * (half to even, as Python): it < W: P (it+1)/W; it <= N - D: P; then f = (N - it)/D, P (f + (1-f)
 * min_lr_frac) (warmup, constant, linear warmdown to F over the last D steps). */
typedef struct {
	double peak_lr;
	long long warmup;      /* W >= 0 */
	long long total_steps; /* N > 0 */
	loom_schedule_kind_t kind;
	double min_lr_frac;    /* [0, 1] */
	double warmdown_frac;  /* warmdown: the fraction of the steps that decay (0: 0.5, nanochat's) */
} loom_lr_schedule_t;

/* "cosine" | "linear" | "constant" | "warmdown"; LOOM_EINVAL (listing them) otherwise. */
int loom_schedule_parse(const char *name, loom_schedule_kind_t *kind);
const char *loom_schedule_name(loom_schedule_kind_t kind);
/* LOOM_EINVAL with a message for out-of-range fields. */
int loom_schedule_check(const loom_lr_schedule_t *s);
/* The rate of optimizer step `step` (from 1). */
float loom_schedule_lr(const loom_lr_schedule_t *s, long long step);

/* ---- batch arithmetic and LR scaling ----------------------------------------------------------- */

/* The gradient accumulation that gives total_batch tokens per optimizer step with micro-batches of
 * B x T tokens on dp data-parallel ranks: *accum = total_batch / (B x T x dp). LOOM_EINVAL when a
 * value is < 1 or total_batch is not a multiple of B x T x dp; the message then names the product
 * and lists the first valid totals ("--total-batch-size 96 is not a multiple of B x T x ranks =
 * 2 x 16 x 2 = 64 tokens per micro-step; valid values: 64, 128, 192, 256, 320, ..."). */
int loom_train_accum(long long total_batch, int B, int T, int dp, int *accum);

/* Scaling a learning rate tuned for a reference batch to the batch trained with. */
typedef enum { LOOM_LR_SCALE_NONE = 0, LOOM_LR_SCALE_SQRT = 1, LOOM_LR_SCALE_LINEAR = 2 } loom_lr_scale_t;
/* "none" | "sqrt" | "linear"; LOOM_EINVAL ("'X' is not one of none, sqrt, linear") otherwise. */
int loom_lr_scale_parse(const char *name, loom_lr_scale_t *kind);
const char *loom_lr_scale_name(loom_lr_scale_t kind); /* "?" when invalid */
/* *out = lr x (tokens_per_step / ref_tokens)^p with p = 0 (none), 1/2 (sqrt), 1 (linear), in double.
 * LOOM_EINVAL for an invalid kind, or (other than none) ref_tokens or tokens_per_step <= 0. */
int loom_lr_scaled(double lr, loom_lr_scale_t kind, long long tokens_per_step, long long ref_tokens, double *out);
/* The one reference batch B_ref (tokens per step) of both batch scalings a run can ask for, the
 * learning rate's (loom_lr_scaled) and Muon's weight decay's (loom_muon_weight_decay_scaled), as
 * nanochat's base_train has one B_REF for both: `given` when > 0 (--ref-batch-size), else under
 * MuonAdamW nanochat's 2^19 (LOOM_MUON_B_REF, where its rates were tuned), else 0 (AdamW's --lr has
 * no known reference batch: an LR scaling then needs one given). *source (when not NULL) says where
 * it came from: "--ref-batch-size", "nanochat's default, 2^19" or "none". */
long long loom_ref_batch(long long given, loom_optimizer_t optimizer, const char **source);

/* ---- the sgemm peak for MFU, measured once and cached ------------------------------------------- */

/* The cache file: $XDG_CACHE_HOME/loom/gemm_peak, else $HOME/.cache/loom/gemm_peak (/tmp without
 * HOME); one "threads cpu-hash flops" line per measurement. Delete it to measure again.
 * LOOM_EINVAL when the path does not fit in cap bytes. */
int loom_peak_cache_path(char *buf, size_t cap);
/* The cached peak (FLOP/s) for `threads` threads on this CPU model: LOOM_OK, or LOOM_ENOENT when
 * there is none (measure it with loom_gemm_peak_flops, then loom_peak_cache_put). */
int loom_peak_cache_get(int threads, double *flops);
/* Append a measurement (creating the directories); LOOM_EINVAL for values <= 0, LOOM_EIO. */
int loom_peak_cache_put(int threads, double flops);
/* The same per matmul precision: fp32 is the calls above; bf16 keeps its own file, gemm_peak_bf16. */
int loom_peak_cache_path_dtype(loom_compute_dtype_t dt, char *buf, size_t cap);
int loom_peak_cache_get_dtype(loom_compute_dtype_t dt, int threads, double *flops);
int loom_peak_cache_put_dtype(loom_compute_dtype_t dt, int threads, double flops);
/* The same for any kind of peak: the GEMMs' (the calls above) and the hardware's, fp32 and bf16
 * (loom_hw_peak_flops), each in its own file beside gemm_peak (hw_peak, hw_peak_bf16); and the memory
 * copy bandwidth the planner uses (mem_bw: bytes/s of `threads` threads copying at once, read and write
 * counted; loom/plan.h's loom_cluster_local measures it). */
typedef enum {
	LOOM_PEAK_GEMM_FP32, LOOM_PEAK_GEMM_BF16, LOOM_PEAK_HW_FP32, LOOM_PEAK_HW_BF16, LOOM_PEAK_MEM_BW
} loom_peak_kind_t;
/* The kind of the hardware's peak (hw = 1) or the GEMM's (hw = 0) for matmuls in precision dt. */
loom_peak_kind_t loom_peak_kind(int hw, loom_compute_dtype_t dt);
int loom_peak_cache_path_kind(loom_peak_kind_t kind, char *buf, size_t cap);
int loom_peak_cache_get_kind(loom_peak_kind_t kind, int threads, double *flops);
int loom_peak_cache_put_kind(loom_peak_kind_t kind, int threads, double flops);

/* ---- trainer ----------------------------------------------------------------------------------- */

typedef struct {
	const char *train_data;    /* glob of token shards (required) */
	const char *val_data;      /* glob, or NULL: no evaluation */
	int B, T;                  /* micro-batch */
	int accum;                 /* micro-steps per optimizer step (>= 1) */
	int shuffle;               /* shuffle windows per epoch */
	uint64_t seed;             /* data shuffle (and sampling) seed */
	loom_lr_schedule_t lr;     /* total_steps is the run's number of optimizer steps */
	loom_adamw_config_t adamw;
	/* The optimizer (0: AdamW with `adamw` over every tensor at lr). LOOM_OPTIMIZER_MUON: MuonAdamW
	 * with `muon` (loom/muon.h: each group's own rate), and the LR schedule (lr, with peak_lr 1) is
	 * then the multiplier of every group's rate, as base_train's get_lr_multiplier. */
	loom_optimizer_t optimizer;
	loom_muon_config_t muon;
	double grad_clip;          /* max global norm; <= 0 disables clipping */
	int eval_every;            /* with val_data: evaluate every K steps and at the last step
	                              (0: only at the last step) */
	int eval_batches;          /* micro-batches of the validation set per evaluation (windows 0..M-1) */
	const char *save_dir;      /* training checkpoints go to save_dir/step_NNNNNNNN, or NULL */
	int save_every;            /* every K steps (and at the last step); 0: only at the end */
	int keep_checkpoints;      /* after saving, delete all but the newest K checkpoints; 0: keep all */
	const char *log_path;      /* JSONL, one object per step (appended to when resuming), or NULL */
	const char *log_event;     /* one JSON object written to the log as a line of its own when the run
	                              opens it, before its first step (an elastic membership change:
	                              {"event":"elastic","step":S,...}, S the step resumed from; a resume
	                              at or after S keeps it), or NULL; borrowed */
	double peak_flops;         /* FLOP/s of one rank for MFU (against world x this); <= 0: MFU is 0 */
	const char *peak_source;   /* where peak_flops came from, for the log (e.g. "AVX-512 FMA loop,
	                              measured"), or NULL; borrowed: must outlive the trainer */
	double gemm_flops;         /* the GEMM's measured peak on one rank, logged beside peak_flops
	                              (<= 0: not known) */
	const char *tokenizer;     /* llm.c tokenizer file copied into every checkpoint (so that
	                              `loom sample` finds it beside the model), or NULL */
	/* Data parallelism (see the top of this file). */
	loom_comm_t *comm;         /* the ranks (borrowed; must outlive the trainer), or NULL: one process.
	                              A communicator of one rank is the same as NULL. */
	double bucket_mb;          /* gradient bucket size in MiB (default 25; the first bucket 1 MiB) */
	int check_replicas;        /* every K steps compare parameter checksums across ranks (0: never) */
	/* Parallel strategy: how the training state is spread over the data-parallel ranks. "ddp" (or
	   NULL); with zero = 0 plain data parallel (with one data-parallel rank it communicates nothing),
	   zero = 1, 2, 3 the ZeRO stages (docs/zero.md; several data-parallel ranks needed); any other
	   name or stage is LOOM_ENOTSUP at create. */
	const char *strategy;
	int zero;                  /* ZeRO stage 0..3 */
	int profile;               /* 1: per-kernel timing of the training steps (loom_model_profile on the
	                              model from create; evaluations are left out) */
	loom_mesh_t *mesh;         /* instead of comm: the ranks as a dp x cp x tp x pp mesh (borrowed; must
	                              outlive the trainer). The data-parallel axis carries the gradients,
	                              the data sharding and the checkpoints' loader states; global rank 0
	                              logs and saves. With tp > 1 the model must have been created as
	                              this rank's shard (loom_model_opts_t tp_size = tp, tp_rank = its tp
	                              coordinate; LOOM_EINVAL otherwise) and the "tp" strategy runs it
	                              (with pp > 1 too: each stage is then a tp shard of its layers).
	                              comm may be NULL or the mesh's world. */
	/* Pipeline parallel (a mesh with pp > 1): the layers are split into pp stages balanced by FLOPs;
	   the accum micro-batches of a step (the micro-batches M) run through them in this schedule. */
	const char *pp_schedule;   /* "gpipe" | "1f1b" | "interleaved" (NULL: 1f1b); see loom_pp_check */
	int pp_virtual_stages;     /* model chunks per pipeline rank (--virtual-stages V): 0 or 1 one (gpipe,
	                              1f1b), >= 2 with "interleaved", chunk c of stage s running the layers
	                              of global stage c pp + s of pp V */
	double pp_head_split;      /* when the last stage runs the head alone (a head heavier than the blocks,
	                              e.g. `small`'s), the fraction of each micro-batch's positions whose head
	                              (ln_f, logits, loss) stage pp-2 computes, from its own last block's
	                              output, so the two stages cost the same: 0 (default) as the FLOPs
	                              balance it, < 0 never, or a fraction in (0, 1) (see loom_pp_stages) */
	loom_dtype_t grad_reduce_dtype; /* what the data-parallel gradient all-reduces send: LOOM_FLOAT32
	                              (0, default) or LOOM_BFLOAT16 (half the bytes; reduced in float32);
	                              ddp and tp only, ZeRO is LOOM_ENOTSUP */
	const char *trace_dir;     /* write a Chrome trace of every rank's steps into this directory
	                              (DIR/trace.json, one track per rank), or NULL */
	double predicted_step_s;   /* the planner's step time and this rank's memory for the run (loom/plan.h),
	                              logged in the config record for `loom plot` (<= 0: not known) */
	double predicted_memory_bytes;
} loom_train_config_t;

/* A config with the defaults: accum 1, AdamW defaults, grad_clip 1.0, cosine, min_lr_frac 0.0,
 * warmup 0, seed 1337, eval_batches 20. Fields without a sensible default are zero/NULL. */
loom_train_config_t loom_train_defaults(void);

/* What one optimizer step did. */
typedef struct {
	long long step;       /* optimizer steps done, counting from 1 */
	long long total;      /* steps of the run */
	float loss;           /* mean loss of the step's micro-batches, before its update */
	double loss_ema;      /* the losses' moving average (beta 0.9), debiased: ema / (1 - 0.9^step), as
	                         nanochat's base_train prints it; resumed from the checkpoint */
	float lr;
	double grad_norm;     /* global norm before clipping */
	double dt_ms;         /* wall time of the step (micro-steps, clipping, AdamW) */
	double optim_ms;      /* of which the gradient norm and the AdamW update */
	double tokens_per_s;  /* B*T*accum*world / dt */
	double mfu;           /* tokens_per_s * flops_per_token / (world * peak_flops) (0 without a peak), at
	                         loom_model_flops_per_token: attention as the kernels do it */
	double mfu_nominal;   /* the same at loom_model_flops_per_token_nominal, the family's reference
	                         implementation's count (nanochat's estimate_flops; GPT-2: 6N + 12 L C T) */
	double comm_ms;       /* all-reduce time of the step: gradient buckets (on the communicator's
	                         thread, overlapping backward) and the loss (0 with one rank) */
	double exposed_comm_ms; /* of which the training thread waited for: not hidden behind backward;
	                           <= comm_ms */
	double eta_s;         /* remaining steps x a moving average of the step time (from the second step
	                         of this process); -1 at its first step, when it is not known yet */
	int has_val;
	float val_loss;       /* mean loss over eval_batches validation windows, after this step's update */
	int saved;            /* 1 when a checkpoint of this step was written */
	double bubble;        /* pipeline: the stages' mean idle fraction of the step's schedule (0 without) */
	double bubble_theory; /* (P-1)/(M+P-1) */
	double bubble_expected; /* the theory for these stages' measured compute times t_s (unequal when
	                           the layers do not split evenly): 1 - M mean(t) / (sum(t) + (M-1) max(t)) */
	int max_inflight;     /* the most micro-batches whose activations this rank held at once (1 without
	                         a pipeline; at most P with 1F1B, M with GPipe) */
	unsigned long long p2p_bytes; /* pipeline: bytes this rank sent to its neighbouring stages in the step
	                                 (activations and their gradients; 0 without a pipeline) */
	double wait_ms;       /* time the training thread waited for the gradients beyond comm_ms: for a
	                         slower rank (straggler) or the progress thread to be scheduled; not in
	                         exposed_comm_ms, which is therefore <= comm_ms */
} loom_step_metrics_t;

/* The run so far, as the summary at its end reports it (loom_trainer_summary). Times and rates
 * count this process's steps: after a resume, those since the resume. */
typedef struct {
	long long first_step, last_step; /* first and last step this process ran (0, 0: none) */
	long long steps;          /* steps run */
	long long tokens;         /* tokens trained on in them (all ranks) */
	double wall_s;            /* from the start of the first step to the end of the last one, with
	                             evaluations and checkpoints */
	double step_s;            /* sum of the steps' times */
	double mean_tokens_per_s; /* tokens / step_s */
	double best_tokens_per_s; /* the fastest step's */
	double mean_mfu;          /* mean over the steps (0 without a peak) */
	double mean_mfu_nominal;  /* ... of mfu_nominal */
	double comm_ms, exposed_comm_ms, wait_ms; /* totals over the steps */
	float final_loss;
	int has_val;
	float best_val_loss;      /* the lowest validation loss, and the step after which it was measured */
	long long best_val_step;
	char checkpoint[1100];    /* the last checkpoint written, "" when none */
	/* Medians over this process's steps after the first `warmup` (LOOM_TRAIN_WARMUP, fewer in a run of
	 * fewer steps: 0 when it ran at most that many), the steps that `loom plan`'s step time predicts;
	 * over an even sample of them in a run of more than a few thousand steps. */
	int warmup;               /* steps left out */
	long long median_steps;   /* steps the medians are of */
	double median_step_s;     /* the step */
	double median_optim_s;    /* its optimizer (gradient norm and update) */
	double median_comm_s;     /* its exposed communication and straggler wait */
	double median_bubble;     /* a pipeline's idle fraction */
} loom_train_summary_t;

/* Steps of a process left out of the summary's medians: the first ones run colder (caches, page
 * faults of the arenas, the communicator's first exchanges). */
#define LOOM_TRAIN_WARMUP 2


typedef struct loom_trainer loom_trainer_t;

/* Fill *s with the run so far; at the end of loom_trainer_run, rank 0 also appends it to the
 * JSONL log as {"summary":{...}}. LOOM_OK. */
int loom_trainer_summary(const loom_trainer_t *tr, loom_train_summary_t *s);

/* Build a trainer for `model` (borrowed: the caller keeps ownership and must keep it alive; its B
 * and T given at create must be >= cfg->B, cfg->T, but under a pipeline, which runs stage models of
 * its own and never the caller's: loom_train_model_opts). Under a pipeline the stages start from the
 * model's parameter buffer, or without one from loom_model_init(cfg->seed)'s values, made on each
 * stage for its tensors alone. Opens the loaders and allocates the optimizer; strings in cfg are
 * copied. It attaches the parallel strategy to the model (with several ranks,
 * DDP: the model's gradient view points at the strategy's shared-memory storage until
 * loom_trainer_destroy, which points it back at the model's own buffer; destroy the trainer before
 * the model, the mesh and the communicator); not collective. Returns LOOM_EINVAL (bad settings, T
 * beyond the model's seq_len, a token id in the data >= the model's vocabulary: the first 1M tokens
 * of each set are checked), LOOM_ENOTSUP (a strategy or ZeRO stage that does not exist, a mesh with
 * tp > 1), LOOM_ENOENT / LOOM_EFORMAT from the data, or LOOM_ENOMEM; the detail is in
 * loom_errmsg(). */
int loom_trainer_create(loom_trainer_t **tr, const loom_train_config_t *cfg, loom_model_t *model);
/* Set mo's no_own_grads / no_own_params as the parallel strategy cfg picks on dp data-parallel (with
 * context parallelism: dp x cp) and tp tensor-parallel ranks needs them (ZeRO-2 keeps the gradients,
 * ZeRO-3 also the parameters, as shards; a pipeline's stages hold both: the model then allocates no
 * whole buffer for them); the rest of mo is left alone, but for a pipeline, whose whole model is never
 * run: B 1 and T tp (2 tp with cp) there, for an arena of the fewest positions. With no_own_params the
 * caller gives the model a buffer of the initial parameters (loom_model_set_param_buffer), which it may
 * free after loom_trainer_sync_params. */
void loom_train_model_opts(const loom_train_config_t *cfg, int dp, int tp, loom_model_opts_t *mo);
void loom_trainer_destroy(loom_trainer_t *tr); /* safe on NULL; closes the log */

/* Restore model, optimizer and trainer state from a training checkpoint directory (or, when `path`
 * is a directory of checkpoints, from the newest one in it), whichever parallel strategy wrote it (a
 * ZeRO checkpoint's shards are resliced for this rank). The checkpoint is verified first
 * (loom_ckpt_verify: checksums, and the step of its name, MANIFEST and state.json agree). LOOM_ENOENT
 * only when `path` holds no checkpoint at all; LOOM_EFORMAT for a damaged checkpoint (the newest one
 * of a directory: the message lists the older ones that verify, to resume from one explicitly),
 * including a missing key or file; LOOM_EMISMATCH when it was written with another model config,
 * B, T or data, or another number of tokens per step (accum x data-parallel ranks; another world
 * size at the same tokens per step resumes, each rank taking rank 0's data position in the new world).
 * After a failure other than LOOM_ENOENT the trainer's state may be partly restored: destroy it.
 * With several ranks every rank calls it (each reads its own loader state) and the next step
 * broadcasts rank 0's parameters; not collective itself. */
int loom_trainer_resume(loom_trainer_t *tr, const char *path);
/* Make cfg->save_dir this run's, once the state it starts from is known (after the resume decision,
 * before the first step): finish what a kill interrupted there (loom_ckpt_recover), then move every
 * checkpoint newer than the step the state came from (the resumed checkpoint's, else 0) aside
 * (loom_ckpt_set_aside): they belong to a branch the run abandons (a resume from an older step, or a
 * fresh start in a directory holding an earlier run's checkpoints), which --keep-checkpoints would
 * otherwise keep over the run's own and a resume would take for the newest. So pruning keeps the
 * newest checkpoints of this run's lineage, and the last one the run writes is the newest in the
 * directory. Rank 0 does it (the others return LOOM_OK with nothing moved); *aside (may be NULL)
 * says what moved. loom_trainer_run (and loom_trainer_save) call it when the program has not; call
 * it before them to report what moved. LOOM_ESYS naming the path. */
int loom_trainer_prepare_save_dir(loom_trainer_t *tr, loom_ckpt_aside_t *aside);
/* Write a training checkpoint of the current state to cfg->save_dir/step_NNNNNNNN (atomically).
 * Collective with several ranks: the loader states are gathered, then rank 0 writes. */
int loom_trainer_save(loom_trainer_t *tr);

/* NULL when this rank holds the whole training state (parameters and optimizer state: pure data
 * parallel, tp = pp = cp = 1, no ZeRO, AdamW), so that loom_trainer_save_replica can write it alone;
 * otherwise why not (a static sentence). Thread-safe. */
const char *loom_trainer_replica_why(const loom_trainer_t *tr);
/* Write the training state of the last completed step (loom_trainer_steps_done) as a complete
 * single-process checkpoint dir/step_NNNNNNNN (atomically, as loom_trainer_save), with every
 * data-parallel rank's loader position, without any communication: what an elastic job's survivors
 * keep in memory when a peer is lost during the next step (cli/run_elastic.c). Valid after a step
 * failed in a collective, before its update ran (the trainer's state is then still the last step's).
 * LOOM_ENOTSUP with loom_trainer_replica_why's reason; the writer's errors naming dir. */
int loom_trainer_save_replica(loom_trainer_t *tr, const char *dir);

/* Remove dir and everything in it (the replica checkpoints written there): LOOM_OK when it does not
 * exist, LOOM_ESYS naming the path otherwise. */
int loom_trainer_remove_replica(const char *dir);

/* One optimizer step (accum micro-steps, clipping, AdamW); fills *m (without val_loss/saved).
 * Collective with several ranks. */
int loom_trainer_step(loom_trainer_t *tr, loom_step_metrics_t *m);
/* Mean loss over the first cfg->eval_batches windows of the validation data (no gradients). With
 * several ranks, collective: each rank evaluates a share of the windows and every rank gets the
 * same value, summed in window order as one process would. */
int loom_trainer_eval(loom_trainer_t *tr, float *val_loss);
/* Compare the parameters of all ranks (checksums); LOOM_EMISMATCH naming the ranks that differ.
 * Collective; LOOM_OK at once with one rank. */
int loom_trainer_check_replicas(loom_trainer_t *tr);
/* Broadcast rank 0's parameters to every rank and verify them there by checksum (LOOM_EMISMATCH
 * naming the ranks whose copy differs); *checksum (may be NULL) gets the parameters' checksum
 * (loom_checksum_f32). Collective. The first step after create or resume does it by itself when
 * it has not been done; call it earlier to report it. With one rank it only computes the checksum. */
int loom_trainer_sync_params(loom_trainer_t *tr, uint64_t *checksum);

/* Called after every step of loom_trainer_run (e.g. to print); a non-zero return stops the run. */
typedef int (*loom_train_step_fn)(void *ctx, loom_trainer_t *tr, const loom_step_metrics_t *m);
/* Run steps until lr.total_steps, evaluating, checking replicas, logging and saving as configured;
 * calls fn (may be NULL) after each step (on every rank: fn decides who prints). Returns LOOM_OK,
 * the first error, or LOOM_ESTATE when fn stopped it (with several ranks, fn must then stop every
 * rank at the same step) or the loss or gradient norm became non-finite (that step is logged but not
 * checkpointed; the loss and norm are the same on every rank, so every rank stops). */
int loom_trainer_run(loom_trainer_t *tr, loom_train_step_fn fn, void *ctx);

/* Set the FLOP/s that MFU is relative to (<= 0: MFU is reported as 0). */
void loom_trainer_set_peak_flops(loom_trainer_t *tr, double flops);
/* The same with the peak's source and the GEMM's measured peak (both as in loom_train_config_t), for
 * a program that measures them after creating the trainer; before the first step. */
void loom_trainer_set_peak(loom_trainer_t *tr, double flops, const char *source, double gemm_flops);
/* The planner's predicted step time and memory, logged with the config (before the first step). */
void loom_trainer_set_prediction(loom_trainer_t *tr, double step_s, double memory_bytes);
/* The planner's whole prediction as a JSON object (loom/plan.h's loom_plan_json, copied), logged in
 * the config record as "plan" beside predicted_step_s and predicted_memory_bytes (before the first
 * step). LOOM_ENOMEM. */
int loom_trainer_set_plan_json(loom_trainer_t *tr, const char *json);
/* An event row for the log (loom_train_config_t's log_event; borrowed: it must outlive the run), before
 * the first step. */
void loom_trainer_set_log_event(loom_trainer_t *tr, const char *json);
long long loom_trainer_steps_done(const loom_trainer_t *tr);
int loom_trainer_rank(const loom_trainer_t *tr);  /* global rank; 0 with one process */
int loom_trainer_world(const loom_trainer_t *tr); /* all ranks of the job; 1 with one process */
loom_model_t *loom_trainer_model(loom_trainer_t *tr);
const loom_adamw_t *loom_trainer_optimizer(const loom_trainer_t *tr);
/* Tokens per optimizer step: B*T*accum*(data-parallel ranks). */
long long loom_trainer_tokens_per_step(const loom_trainer_t *tr);

/* The pipeline's stages for P stages of micro-batches B x T (what a trainer with pp = P runs): stage s
 * runs blocks [lo[s], lo[s+1]) (lo has P + 1 entries, balanced by FLOPs: the embedding on the first
 * stage, ln_f, the tied lm head and the loss on the last); *head_rows > 0 when the last stage runs
 * the head alone and shares it: stage P-2 then computes the head of positions [0, *head_rows) of
 * every micro-batch (row b T + t), the last stage the rest. head_split as pp_head_split above.
 * LOOM_EINVAL for P > n_layer or a head_split >= 1. */
int loom_pp_stages(const loom_model_config_t *cfg, int B, int T, int P, double head_split, int *lo, int *head_rows);
/* LOOM_OK when a pipeline of P ranks (1: none) can run `schedule` ("gpipe" | "1f1b" | "interleaved",
 * NULL: 1f1b) with V model chunks per rank (0 or 1: one) over M micro-batches of the model cfg (may be
 * NULL: no layer count check): V >= 2 exactly with "interleaved", which needs P >= 2, M a multiple of
 * P (Megatron's groups of P micro-batches) and P V <= n_layer (a layer per chunk at least).
 * LOOM_EINVAL otherwise, the message naming the flags (--pp-schedule, --virtual-stages, --pp,
 * --micro-batches) and what would work. */
int loom_pp_check(const loom_model_config_t *cfg, const char *schedule, int P, int V, int M);
/* The schedule's ideal bubble for P ranks, V chunks each (0 or 1: one) and M micro-batches: the ranks'
 * mean idle fraction over the step's span when every stage costs the same, (P-1)/(V M + P-1) (V = 1
 * for gpipe and 1f1b), which is what the trainer's bubble measures; NaN when loom_pp_check refuses
 * (without the layer count). Against the compute alone it is Megatron's (P-1)/(V M). */
double loom_pp_bubble_ideal(const char *schedule, int P, int V, int M);
/* The positions global stage G-2 computes the head of in each of the M micro-batches of a step on P
 * ranks under the schedule ("gpipe" | "1f1b" | "interleaved" with V chunks per rank, G = P V; V is
 * ignored by the others; NULL: 1f1b), into rows[M]: loom_pp_stages' head rows (for G stages) in each,
 * except that with head_split 0 the first and last micro-batch's shares are what shortens the step
 * most in a simulation of the schedule with the stages' FLOPs (the pipe filling and draining leaves a
 * stage time to spare there). All 0 without a shared head. LOOM_EINVAL as loom_pp_stages, or for a
 * schedule, V < 1 or M < 1. */
int loom_pp_head_rows(const loom_model_config_t *cfg, const char *schedule, int B, int T, int P, int V, int M,
                      double head_split, int *rows);

/* Memory of this rank (bytes). The model states are what the parallel strategy keeps; the theory is
 * the ZeRO stage's formula for them (P parameters, N data-parallel ranks, fp32): DDP 16P, ZeRO-1
 * 8P + 8P/N, ZeRO-2 4P + 12P/N, ZeRO-3 16P/N (+ largest_unit gathered at once, counted in comm). */
typedef struct {
	size_t params, grads, optim; /* kept by this rank */
	size_t model_states;         /* their sum */
	size_t activations;          /* the training model's activation buffers as allocated (measured: the
	                                layout's bytes, loom_model_model_act_bytes; a pipeline stage's model) */
	loom_model_act_bytes_t act;   /* the same by role: kept, recompute scratch, head and backward scratch */
	size_t act_formula;          /* kept + recompute by act_formula_text (no alignment padding: the
	                                measured figure is within 64 bytes per buffer of it) */
	const char *act_formula_text; /* (static) */
	loom_act_ckpt_t act_ckpt;    /* the model's activation checkpointing */
	size_t comm;                 /* the strategy's staging and gathered-parameter buffers */
	size_t theory;               /* the formula's model states */
	const char *formula;         /* "8P + 8P/N", ... (static) */
	size_t nparams;              /* P of the formula: the parameters this rank's strategy covers (the
	                                model's, a tensor-parallel shard's, a pipeline stage's) */
	size_t largest_unit;         /* ZeRO-3: bytes of the largest unit's parameters, else 0 */
	int zero, dp;                /* the ZeRO stage in effect (0 with one rank) and N */
} loom_train_memory_t;
/* Fill *m; LOOM_OK. Not collective. */
int loom_trainer_memory(const loom_trainer_t *tr, loom_train_memory_t *m);
/* The process's peak resident set size (VmHWM of /proc/self/status), 0 when unknown. */
size_t loom_peak_rss_bytes(void);

#ifdef __cplusplus
}
#endif
#endif
