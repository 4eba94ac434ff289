/* loom/plan.h: the planner (`loom plan`): what a training configuration costs on a cluster before it
 * is launched, by the arithmetic of docs/plan.md: per-rank memory (the model states of the ZeRO stage
 * and tensor/pipeline split, the activations the model would allocate, communication buffers and the
 * process's own overhead: a total that predicts the peak resident set), FLOPs, compute time, the
 * communication of each mesh axis (hidden behind backward or exposed, by the trainer's overlap model),
 * the pipeline bubble from loom's own schedule simulation, step time, tokens/s, MFU, and for a token
 * budget the wall clock and cost; and a search over the meshes, schedules, ZeRO stages and
 * recomputation modes of a number of ranks.
 *
 * The memory model is loom's: what `loom train` would allocate for the same flags (the activation
 * bytes are loom_model_act_bytes' exact figure, the model states the strategies' own accounting), so a
 * memory check against limits calls loom_plan_estimate and compares memory.total. With impl
 * LOOM_PLAN_IDEAL a pipeline stage keeps only its own layers' states and activations (Megatron's
 * layout), which loom's pipeline does not yet do (it keeps the whole model's states on every stage).
 *
 * Thread-safe: no global state; the calls below fill caller-owned structs. */
#ifndef LOOM_PLAN_H
#define LOOM_PLAN_H

#include <stddef.h>

#include "loom/model.h"
#include "loom/train.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The peak cache's robustness (src/train/peak.c): whether the cache trusts its figure of a kind for
 * threads (a line measured quiet, share >= LOOM_CALIB_QUIET, in the last LOOM_CALIB_MAX_AGE; or
 * LOOM_CALIB_TRIES lines), and a measurement appended with its CPU share (loom_peak_cache_put_kind
 * appends share 1). Lookups (loom_peak_cache_get_kind) give the latest quiet line, else the best line. */
int loom_peak_cache_trusted(loom_peak_kind_t kind, int threads);
int loom_peak_cache_put_share(loom_peak_kind_t kind, int threads, double value, double share);

/* ---- this machine's calibration (src/train/plan_calib.c; docs/plan.md, "Calibration") ------------- */

/* The grid of the calibration: one block's matmuls at widths 64, 128, 256, 512, 768 (1024 rows), the
 * attention kernel at head sizes 64, 128 and sequences of 128, 512, 2048 positions. */
#define LOOM_CALIB_WIDTHS 5
#define LOOM_CALIB_HEAD_DIMS 2
#define LOOM_CALIB_SEQS 3
int loom_calib_width(int k);    /* the grid's values (0 out of range) */
int loom_calib_head_dim(int k);
int loom_calib_seq(int k);
/* A measurement the cache trusts: the CPU time its threads got over the wall time (share) at least
 * this (below: other work took the CPUs), taken at most LOOM_CALIB_MAX_AGE seconds ago; or, on a
 * machine never quiet, the best of LOOM_CALIB_TRIES measurements. */
#define LOOM_CALIB_QUIET 0.9
#define LOOM_CALIB_MAX_AGE (30.0 * 86400.0)
#define LOOM_CALIB_TRIES 3

/* The measured rates (0: not measured). */
typedef struct {
	double mm[2][LOOM_CALIB_WIDTHS];   /* [0 fp32, 1 bf16]: FLOP/s of one block's matmuls, forward and backward,
	                                      at width loom_calib_width(k) (the model's kernels, 1024 rows) */
	double attn[LOOM_CALIB_HEAD_DIMS][LOOM_CALIB_SEQS]; /* counted FLOP/s of the attention kernel, forward
	                                      and backward (fp32), causal, at (head size, T) of the grid */
	double adamw;                      /* parameters per second of the optimizer's step (the gradients' sum of
	                                      squares and AdamW, one rank alone) */
} loom_calib_t;

/* Key of this machine and build: /proc/cpuinfo's model name and flags, loom_build_info, the GEMM's
 * backend and the executable's size and modification time (hashed, never 0). */
unsigned long loom_calib_key(void);
/* The key of another program on this library's build (exe: its path), e.g. a test filling the cache
 * for build/loom; the executable's part is left out when it cannot be stat'ed. */
unsigned long loom_calib_key_of(const char *exe);
/* The cache file ($XDG_CACHE_HOME/loom/calib, beside the peak cache's). LOOM_EINVAL when too long. */
int loom_calib_cache_path(char *buf, size_t cap);
/* What the cache holds for a figure: the best value of its entries, and whether it is trusted. */
typedef struct {
	double value;     /* the latest quiet entry, else the best (highest) suspect one; 0 when none */
	double share;     /* its CPU share */
	double age_s;     /* its age */
	int entries;      /* entries for the name, threads and key */
	int quiet;        /* of them, quiet and younger than LOOM_CALIB_MAX_AGE */
	int trusted;      /* quiet > 0, or entries >= LOOM_CALIB_TRIES */
} loom_calib_entry_t;
/* Read the cache's entries of name (e.g. "mm_fp32_w256", "attn_d64_t512") for threads and key into *e
 * (zeros when there are none, or no file). LOOM_OK; LOOM_EINVAL for a path too long. */
int loom_calib_lookup(const char *name, int threads, unsigned long key, loom_calib_entry_t *e);
/* Append one measurement. LOOM_OK, LOOM_EINVAL (value or threads <= 0), LOOM_EIO. */
int loom_calib_append(const char *name, int threads, unsigned long key, double value, double share);
/* The figure for this machine (loom_calib_key): the cache's (loom_calib_entry_t value); measured first and appended
 * with measure 1 when the cache has no entry, with measure 2 also when it does not trust it (taken under load, too
 * old). LOOM_OK (trusted), LOOM_ESTATE (*value is the best but suspect: not measured again, or the measurement was
 * under load too), LOOM_ENOENT (nothing: *value 0). *measured_now (may be NULL): 1 when it was measured by this
 * call. */
int loom_calib_get(const char *name, int threads, int measure, double *value, int *measured_now);
/* The measurement hook (tests inject a deterministic one; NULL: the real kernels): the figure's value
 * and the CPU share of the measurement; LOOM_OK or an error. Process-wide; not thread-safe. */
typedef int (*loom_calib_measure_fn)(const char *name, int threads, void *ctx, double *value, double *share);
void loom_calib_set_measure(loom_calib_measure_fn fn, void *ctx);
/* How many figures of a run in dt with threads threads the cache does not trust (fp32's matmuls, bf16's
 * with dt bf16, the attention, the optimizer: "adamw"), naming them in what (may be NULL). */
int loom_calib_missing(int threads, loom_compute_dtype_t dt, char *what, size_t cap);
/* Measure the ones the cache has no entry of, with suspect also those it does not trust (about 1-3 s with
 * one thread; the buffers, under 200 MiB, in the caller's resident set). LOOM_OK, or LOOM_ENOTSUP when
 * one could not be measured. */
int loom_calib_measure(int threads, loom_compute_dtype_t dt, int suspect);
/* Every figure the cache holds for threads (trusted or suspect) into *cal; returns how many. */
int loom_calib_read(int threads, loom_calib_t *cal);
/* The block matmuls' rate at a width (interpolated in log width, clamped to the grid) in dt, and the
 * attention's at a head size and T: 0 when the figures are not all measured. */
double loom_calib_mm_rate(const loom_calib_t *cal, loom_compute_dtype_t dt, double width);
double loom_calib_attn_rate(const loom_calib_t *cal, int head_dim, int T);

/* A cluster: identical ranks, ranks_per_node of them on each of nodes nodes. Figures are per rank. */
typedef struct {
	char name[64];
	int nodes, ranks_per_node;
	double peak_flops_fp32;  /* FLOP/s of one rank's matmuls in fp32 (the hardware's peak, MFU's base) */
	double peak_flops_bf16;  /* ... in bf16 (0: as fp32) */
	double efficiency;       /* the fraction of the peak training's matmuls reach (0 < e <= 1) */
	double gemm_half_size;   /* matmuls of width C' (n_embd / tp) reach C' / (C' + this) of it (0: all) */
	double corun_efficiency; /* CPUs: a rank's speed when every core of its node runs (0: 1) */
	double memory_bytes;     /* per rank (0: unknown, nothing is dropped for memory) */
	int memory_shared;       /* 1: memory_bytes is the node's, shared by the ranks on it (CPUs) */
	double memory_bw;        /* bytes/s of one rank's memory, for the optimizer's and the elementwise
	                            kernels' traffic (0: not counted) */
	double node_memory_bw;   /* bytes/s of a node's memory shared by its ranks (0: not shared) */
	double elementwise_bytes_per_act; /* memory traffic of the non-matmul kernels per byte of kept
	                            activations per micro-batch (0: not counted) */
	double intra_bw, intra_lat;  /* a rank's link to a rank of its node: bytes/s, seconds */
	double inter_bw, inter_lat;  /* to a rank of another node */
	double price_rank_hour;      /* currency per rank-hour (0: no cost) */
	double overhead_bytes;       /* resident memory of a process before the model (binary, libraries,
	                                threads, the data loader) */
	double comm_overhead_bytes;  /* more of it in a job of several ranks (the communicator's segments) */
	double thread_scratch_bytes; /* more of it for every thread of a rank beyond the first (its stack, malloc
	                                arena, the GEMM's packing buffers) */
	int cores;                   /* CPUs of a node shared by its ranks' threads (0: not shared: GPUs) */
	int threads;                 /* threads per rank (CPUs; the peaks above are for this many) */
	double background_load;      /* other work's runnable threads on a node, competing for its cores
	                                (CPUs; 0: none): the ranks' share is cores / (their threads + this) */
	char source[512];            /* where the figures come from */
	loom_calib_t calib;          /* this machine's measured kernel rates (loom_cluster_local; 0: not measured,
	                                the peak x efficiency x width factor then) */
	char figures[320];           /* which figures were measured and which assumed (loom_cluster_local) */
} loom_cluster_t;

/* The named profiles shipped with loom ("cpu-node", "a100-8x80g", "h100-8x", "mi300x-8x"; docs/plan.md
 * gives each figure's source), for nodes nodes. LOOM_ENOENT naming the profiles for another name. */
int loom_cluster_profile(const char *name, int nodes, loom_cluster_t *c);
/* The profiles' names, NULL-terminated (static). */
const char *const *loom_cluster_profiles(void);
/* Read a cluster from a JSON file (keys in docs/plan.md: nodes, ranks_per_node, peak_flops_fp32,
 * peak_flops_bf16, efficiency, memory_bytes, memory_bw, intra_bw, intra_lat, inter_bw, inter_lat,
 * price_rank_hour, ...; or "profile": NAME and overrides). LOOM_ENOENT (the file), LOOM_EFORMAT with
 * loom_errmsg naming the file, the key and what was expected. */
int loom_cluster_load(const char *path, loom_cluster_t *c);
/* This machine: one node of its CPUs (ranks share them: the planner models the share when ranks x
 * threads exceed them), the hardware's and the GEMM's fp32 peaks for `threads` threads per rank from
 * the peak cache, bf16's when cached, the memory copy bandwidth of one thread and of all CPUs from the
 * cache (missing: the cpu-node profile's), its memory shared by the ranks, the kernels' measured rates
 * (loom_calib_read: c->calib; c->figures says what was measured and what assumed), and the constants
 * calibrated on the development machine (docs/plan.md). With measure, loom_cluster_local_measure(threads,
 * fp32) first. LOOM_ENOENT when the hardware's peak is missing. */
int loom_cluster_local(int threads, int measure, loom_cluster_t *c);
/* How many of the figures loom_cluster_local reads for `threads` threads per rank and matmuls in dt are not in the
 * peak cache or the calibration's, or are not trusted there (taken under load, too old) (the hardware's and the
 * GEMM's peaks of fp32, and of bf16 with dt bf16; the copy bandwidths), naming them in what (may be NULL; cap
 * bytes, ", "-separated). */
int loom_cluster_local_missing(int threads, loom_compute_dtype_t dt, char *what, size_t cap);
/* Measure the missing ones and those the caches do not trust and cache them: seconds, and the GEMM's
 * and copies' buffers (hundreds of MiB) in the caller's resident set, so a trainer does it in another
 * process (`loom plan --measure`). LOOM_OK, or LOOM_ENOENT naming a figure that could not be measured
 * (the others are cached). */
int loom_cluster_local_measure(int threads, loom_compute_dtype_t dt);
/* The same with suspect 0: only what the caches hold no entry of (a suspect figure stays as it is, so
 * that two plans made one after the other read the same figures: `loom plan` after `loom train`). */
int loom_cluster_local_fill(int threads, loom_compute_dtype_t dt, int suspect);
/* The other work on this machine now, as runnable threads competing with one more: one thread's FMA
 * loop for `seconds` against the cached peak f gives C / f - 1 for C CPUs (0 when idle), rounded to a
 * thousandth (the plan's JSON's precision: --load with the printed figure plans the same). */
double loom_cluster_measure_load(int cores, double seconds);

typedef enum { LOOM_PLAN_LOOM = 0, LOOM_PLAN_IDEAL = 1 } loom_plan_impl_t;

/* One configuration, as `loom train`'s flags give it. Zero-initialize, then set. */
typedef struct {
	loom_model_config_t model;
	int B, T;                  /* micro-batch */
	int M;                     /* micro-batches (gradient accumulation) per step and data-parallel rank */
	int dp, tp, pp;            /* mesh (0: 1) */
	int cp;                    /* context-parallel ranks per sequence (0: 1; loom train --cp): T / cp positions
	                              of each sequence per rank, the strategy over dp x cp */
	int cp_gather;             /* 1: cp's attention all-gathers (LOOM_CP_ATTENTION=gather); 0: the ring */
	int zero;                  /* ZeRO stage 0..3 */
	loom_act_ckpt_t act_ckpt;
	int sequence_parallel;     /* --sequence-parallel (where tp > 1 and B T divides by tp) */
	loom_compute_dtype_t dtype;
	int grad_reduce_bf16;      /* gradients reduced in bf16 (half the bytes) */
	int schedule_gpipe;        /* pipeline schedule: 1 GPipe, 0 1F1B (or interleaved, below) */
	int virtual_stages;        /* model chunks per pipeline rank: 0 or 1 one; >= 2 the interleaved 1F1B
	                              (loom_train_config_t pp_virtual_stages; loom_pp_check's conditions) */
	double bucket_mb;          /* DDP buckets (0: 25, the first 1) */
	double pp_head_split;      /* as loom_train_config_t's */
	double tokens;             /* token budget for wall clock and cost (0: none) */
	loom_plan_impl_t impl;
	int optimizer;             /* loom_optimizer_t: AdamW (0) or MuonAdamW (LOOM_OPTIMIZER_MUON: its state and
	                              Newton-Schulz iterations; not with tp, nor with ZeRO on a pipeline) */
	/* What a run holds beside its steps (memory only; all 0: none of it): */
	long long steps;           /* the run's optimizer steps (the data it reads) */
	int shuffle;               /* the training windows are read in shuffled order (--shuffle 1) */
	double train_bytes;        /* bytes of the training shards (0: not known) */
	double val_bytes;          /* bytes of the validation shards (0: no evaluation) */
	int eval_batches;          /* validation micro-batches per evaluation (with val_bytes) */
	int token_bytes;           /* bytes per token of the shards: 2 (uint16; 0 means 2) or 4 (uint32) */
} loom_plan_config_t;

/* Bytes per rank. */
typedef struct {
	double params, grads, optimizer; /* model states kept by the rank */
	double activations;  /* the training model's activation buffers (loom_model_act_bytes' total) */
	double comm;         /* communication buffers: ZeRO staging and gather buffers, bf16 staging, the
	                        model's own gradient buffer idle under DDP, pipeline send/receive buffers */
	double other;        /* loom's pipeline: the whole model's arena (never run), and under ZeRO-3 the
	                        stage model's own parameter buffer (at start-up) */
	double data;         /* the data loader's batch buffers and the shards' pages the rank maps (file pages:
	                        resident, but reclaimable, so not counted against the memory limit) */
	double eval;         /* evaluation's buffers: the per-window losses and the validation shards' pages */
	double scratch;      /* the threads beyond the first (stacks, malloc arenas, GEMM packing) and the optimizer's
	                        work buffer (MuonAdamW's Newton-Schulz iterations) */
	double overhead;     /* the process's baseline (one thread) */
	double total;        /* the sum: the predicted peak resident set */
} loom_plan_memory_t;

typedef struct {
	double bytes;        /* sent per rank per step on this axis */
	double time_s;       /* its time on the links */
	double exposed_s;    /* of it, not hidden behind compute */
} loom_plan_comm_t;

typedef struct {
	loom_plan_config_t cfg;
	int world, stage;          /* ranks; the stage the memory figures are for (the largest) */
	double params;             /* the model's parameter count */
	double shard_params;       /* per tensor-parallel shard */
	loom_plan_memory_t memory; /* of the rank that needs the most */
	loom_plan_memory_t memory_rank0; /* of global rank 0 (stage 0): what its peak_rss_bytes measures */
	double flops_per_token;    /* forward + backward, 6N + attention as the kernels do it: the causal,
	                              windowed keys (loom_model_flops_per_token) */
	double flops_per_step;     /* all ranks, model FLOPs (recomputation not counted) */
	double flops_per_rank_step; /* executed on one rank, with recomputation */
	double tokens_per_step;
	double compute_s;          /* one rank's matmuls, elementwise and optimizer time per step */
	double optimizer_s;        /* of it the optimizer */
	loom_plan_comm_t dp, tp, pp; /* dp: the data-parallel group's (dp x cp with context parallelism) */
	loom_plan_comm_t cp;       /* the context-parallel attention's transfers (the ring's partly hidden) */
	double bubble;             /* pipeline: the stages' mean idle fraction (simulated) */
	double bubble_theory;      /* (P-1)/(V M+P-1), V = 1 but for interleaved (loom_pp_bubble_ideal) */
	double step_time_s, tokens_per_s, mfu;
	double peak_flops;         /* per rank, of the dtype */
	double steps, wall_s, cost; /* for cfg.tokens (0 without) */
	double memory_limit;       /* a rank's memory on the cluster (0: unknown) */
	int fits;                  /* memory.total - memory.data <= memory_limit (1 when unknown; the shards' file
	                              pages are reclaimable) */
	double headroom;           /* 1 - total / memory (0 when unknown) */
	int cross_node_tp;         /* the tp group spans nodes */
	int cross_node_dp;         /* the dp group spans nodes */
	int oversubscribed;        /* more threads than the node's cores */
	double cpu_share;          /* the fraction of a core each thread gets (1 without sharing) */
} loom_plan_t;

/* Estimate cfg on cluster c into *p. LOOM_EINVAL with loom_errmsg for a configuration loom cannot run
 * (the model refuses it, tp does not divide the heads, pp above the layers, ZeRO with tp or pp or one
 * data-parallel rank, more ranks than the cluster has). */
int loom_plan_estimate(const loom_plan_config_t *cfg, const loom_cluster_t *c, loom_plan_t *p);

/* Ring all-reduce bytes a rank sends for n bytes on N ranks: 2 (N-1)/N n (reduce-scatter and
 * all-gather each (N-1)/N n). */
double loom_plan_ring_allreduce_bytes(double n, int N);
/* Bytes a context-parallel rank receives in one layer's forward: the other ranks' keys and values (T the
 * whole sequence, cp ranks, a tp shard's kv heads), (cp-1)/cp x B T 2 KV x 4 bytes, KV =
 * loom_model_kv_width / tp, in the ring as in the all-gather. The backward moves twice that (the keys
 * again, and their gradients), a recomputation of the attention (activation checkpointing) once more.
 * 0 for cp <= 1. */
double loom_plan_cp_bytes(const loom_model_config_t *cfg, int B, int T, int cp, int tp);

/* The search: every dp x tp x pp = ranks (tp dividing the heads and at most a node, pp at most the
 * layers), ZeRO stage, recomputation mode and schedule loom can run, at base's B, T and tokens per
 * step (M = the base's M x dp_base / dp when that divides; base's dp x M is kept constant), sorted
 * fastest first. Fills out[0..cap) and *n with how many fit in memory, *total with how many were
 * estimated. LOOM_OK (also when none fits: *n = 0); LOOM_ENOMEM. */
int loom_plan_search(const loom_plan_config_t *base, const loom_cluster_t *c, int ranks, loom_plan_t *out, int cap,
                     int *n, int *total);

/* ---- one prediction for a run: the planner on this machine, as `loom plan` and `loom train` call it -- */

/* The plan configuration of a training run from what `loom train` parses (tc: B, T, accum, zero,
 * optimizer, the pipeline's schedule, chunks and head split, buckets, the gradients' dtype, steps,
 * shuffle, the data globs, evaluation), the model (mc) and the options it is created with (mo: tp_size,
 * act_ckpt, dtype, sequence_parallel, cp_size; T is tc's, the whole sequence), and the mesh's
 * data-parallel and pipeline sizes. The shards'
 * sizes come from tc's globs (stat; 0 when nothing matches); the validation set counts only when
 * evaluation is on (val_data with eval_batches > 0). ZeRO is 0 with one data-parallel rank (dp x cp). Both CLIs
 * fill tc and mo from the same flags and call this, so the plans cannot differ by their flags. */
void loom_plan_config_of_run(const loom_train_config_t *tc, const loom_model_config_t *mc, const loom_model_opts_t *mo,
                             int dp, int pp, loom_plan_config_t *pc);

/* How a run on this machine is planned. */
typedef struct {
	int threads;   /* threads per rank (<= 0: 1) */
	double load;   /* other work's runnable threads on the machine; < 0: measured now (loom_cluster_measure_load,
	                  0.5 s) */
	int measure;   /* 1: first measure and cache what the peak cache lacks for threads and the run's dtype
	                  (loom_cluster_local_measure); 0: what is missing stays missing */
} loom_plan_local_t;

/* This machine as the cluster of a plan: loom_cluster_local for how->threads (after
 * loom_cluster_local_measure(threads, dt) with how->measure) and the other work how->load says.
 * LOOM_ENOENT when the hardware's peak is not cached (and not measured). */
int loom_cluster_this_machine(const loom_plan_local_t *how, loom_compute_dtype_t dt, loom_cluster_t *c);
/* The one prediction of a run on this machine: loom_cluster_this_machine, then loom_plan_estimate.
 * `loom plan --cluster local` and `loom train`'s start-up line and summary call exactly this. *c gets
 * the cluster. Errors as the two. */
int loom_plan_local(const loom_plan_config_t *cfg, const loom_plan_local_t *how, loom_cluster_t *c, loom_plan_t *p);

/* The plan as one JSON object (docs/plan.md, "JSON"): what `loom plan --json` prints and `loom train`
 * logs in its config record ("plan"), byte for byte. Writes at most cap bytes (NUL-terminated) and
 * returns the length of the whole object, as snprintf. */
int loom_plan_json(const loom_plan_t *p, const loom_cluster_t *c, char *buf, size_t cap);

/* What a run measured, for loom_plan_compare. Times are medians over the steps after warm-up. */
typedef struct {
	double step_s;        /* the step */
	double optimizer_s;   /* the optimizer (gradient norm and update) */
	double comm_s;        /* exposed communication and waits for other ranks */
	double bubble;        /* the pipeline's idle fraction of the step (0 without) */
	double peak_rss;      /* the process's peak resident set (bytes) */
	double states;        /* the model states it holds (parameters, gradients, optimizer) */
	double activations;   /* the model's activation buffers */
} loom_plan_measured_t;

/* The prediction against the measurement, part by part. The step is split the same way on both sides:
 * optimizer, communication (dp, tp and pp exposed), bubble (its fraction of what is left) and compute
 * (the rest); the memory into parameters (the model states), activations, and "buffers and process":
 * the rest of the peak resident set (communication buffers, data, evaluation, threads, the process),
 * which the resident set does not split further. */
typedef struct {
	double time_error;      /* predicted / measured - 1 */
	double memory_error;
	const char *time_part;  /* when |time_error| > 0.15: the part whose prediction missed the most
	                           ("compute", "communication", "optimizer", "bubble"), else NULL (static) */
	double time_part_pred, time_part_meas;     /* its seconds */
	const char *memory_part; /* when |memory_error| > 0.10: "parameters", "activations" or "buffers and
	                            process", else NULL (static) */
	double memory_part_pred, memory_part_meas; /* its bytes */
} loom_plan_verdict_t;

/* Compare plan p (memory: its memory_rank0, what rank 0 measures) with m. */
void loom_plan_compare(const loom_plan_t *p, const loom_plan_measured_t *m, loom_plan_verdict_t *v);

#ifdef __cplusplus
}
#endif
#endif
