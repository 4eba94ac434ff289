/* pp.h: what the trainer may ask of a step executor, and nothing more (internal to src/): the
 * micro-steps of one optimizer step, run on this rank's model (pp_local.c: today's loop on the whole
 * model; pp.c: a pipeline stage running GPipe, 1F1B or interleaved 1F1B over the pipeline axis), and
 * the pipeline schedules and stage partition as data (schedule.c).
 *
 * The trainer drives one step as
 *
 *     step(get_batch) -> summed loss     (zeroes the gradients, runs the step's M micro-batches with
 *                                         the strategy's set_sync/finish_grads, leaves final gradients)
 *     grad_norm(strategy)                (the strategy's norm, combined across stages)
 *     strategy optim_step
 *
 * evaluates with eval (forward only, through the stages of a pipeline) and saves and loads
 * checkpoints through it (a pipeline gathers the whole state on its first stage only). Every
 * operation is collective over the pipeline axis (a local executor has none). The strategy attaches
 * to loom__exec_model(e), which is the caller's model for the local executor and a stage model
 * (layers [lo, hi), the tensors they use) for a pipeline, or with V model chunks per rank
 * (interleaved) the join of the chunks' stage models (src/model/join.h); with tensor parallelism, this
 * rank's shard of those layers. */
#ifndef LOOM_PARALLEL_PP_H
#define LOOM_PARALLEL_PP_H

#include "loom/comm.h"
#include "loom/model.h"
#include "parallel/strategy.h"

/* ---- schedules and partition (schedule.c) ----------------------------------------------------- */

typedef enum {
	LOOM_PP_GPIPE = 0, LOOM_PP_1F1B = 1, LOOM_PP_INTERLEAVED = 2, LOOM_PP_SCHEDULES = 3
} loom_pp_schedule_t;

/* One action of a rank: forward ('F') or backward ('B') of micro-batch mb on its model chunk `chunk`
 * (0..V-1). With V chunks per rank of P, chunk c of rank s runs global stage c P + s of the P V
 * (Megatron's layout: the layers go round the ranks V times); GPipe and 1F1B have V = 1, chunk 0. */
typedef struct {
	char op;
	int mb;
	int chunk;
} loom__pp_action_t;

/* "gpipe" | "1f1b" | "interleaved"; LOOM_EINVAL naming them otherwise. */
int loom__pp_schedule_parse(const char *name, loom_pp_schedule_t *kind);
const char *loom__pp_schedule_name(loom_pp_schedule_t kind); /* "?" when invalid */
/* LOOM_OK when the schedule can run P ranks of V chunks each over M micro-batches: P, M >= 1; V = 1
 * for GPipe and 1F1B; V >= 2 and M a multiple of P for interleaved (Megatron's groups of P
 * micro-batches per chunk; a last, smaller group would stall the pipe). LOOM_EINVAL otherwise, with a
 * message naming the flags (--pp, --virtual-stages, --micro-batches) and what would work. */
int loom__pp_check(loom_pp_schedule_t kind, int P, int V, int M);
/* The actions of rank s of P with V chunks over M micro-batches (2 M V of them, into out), from the
 * schedule's row of the table. Returns the number of activation arenas the rank needs, the most
 * (chunk, micro-batch) activations it holds at once (M for GPipe, min(M, P - s) for 1F1B,
 * min(M V, 2 (P - s - 1) + (V - 1) P + 1) for interleaved), or LOOM_EINVAL as loom__pp_check.
 * Invariants (tests/test_schedule.c checks them for many P, V, M): a (chunk, micro-batch)'s forward
 * comes before its backward; every rank runs its forwards in the same order of (chunk, mb) pairs,
 * and its backwards in that order with the chunks reversed (c -> V-1-c), so the activations and
 * gradients between two ranks arrive in the order they are sent; with V = 1 the micro-batches in
 * flight are consecutive (micro-batch mb may use arena mb % arenas), with V > 1 only within a chunk
 * (see loom__pp_chunk_arenas; arenas shared by the chunks are free again after their pair's
 * backward); and the plan cannot deadlock under the executor's rule (a forward of global stage
 * g > 0 waits for stage g-1's forward of the same micro-batch, a backward of g < P V - 1 for g+1's
 * backward). The last backward is micro-batch M-1 of chunk 0; chunk c's is micro-batch M-1's. */
int loom__pp_plan_v(loom_pp_schedule_t kind, int P, int V, int s, int M, loom__pp_action_t *out);
/* Into arenas[V] the most micro-batches of each chunk whose activations rank s holds at once. Each
 * chunk's forwards run in micro-batch order and so do its backwards, so its micro-batches in flight
 * are consecutive: with a stage model per chunk, micro-batch mb of chunk c may use arena
 * mb % arenas[c] of it, as with V = 1. Returns their sum (at least loom__pp_plan_v's count, which
 * arenas shared by the chunks would need), or LOOM_EINVAL as loom__pp_check, LOOM_ENOMEM. */
int loom__pp_chunk_arenas(loom_pp_schedule_t kind, int P, int V, int s, int M, int *arenas);
/* loom__pp_plan_v with V = 1 (GPipe, 1F1B: no error). */
int loom__pp_plan(loom_pp_schedule_t kind, int P, int s, int M, loom__pp_action_t *out);
/* The ideal bubble of the schedule with equal stages: the ranks' mean idle fraction over the span
 * (first forward to last backward), as the executor measures it and loom__pp_simulate_v computes:
 * (P-1)/(M+P-1) for GPipe and 1F1B, (P-1)/(V M+P-1) for interleaved (the fill and drain take (P-1)/V
 * of a micro-batch's time per rank instead of P-1). Against the compute alone it is Megatron's
 * (P-1)/(V M). NaN for a combination loom__pp_check refuses. */
double loom__pp_bubble_theory_v(loom_pp_schedule_t kind, int P, int V, int M);
double loom__pp_bubble_theory(loom_pp_schedule_t kind, int P, int M); /* V = 1 */
/* The schedule as a discrete-event simulation: global stage g's (g = chunk P + rank, of P V)
 * forward and backward of micro-batch m take f[g M + m] and h[g M + m] + b[g M + m], of which h (may
 * be NULL: none) needs no input from the next stage (stage P V - 2's share of a split head) and runs
 * first; transfers take no time. Into *span the time from the first forward to the last backward,
 * into *bubble the ranks' mean idle fraction of it, as the executor measures it. Equal stages give
 * loom__pp_bubble_theory_v; unequal ones more, and a last stage without a forward (the head alone,
 * fused into its backward) or an h less. LOOM_ENOMEM, or LOOM_EINVAL as loom__pp_check or for a plan
 * that cannot run (none of the table's). */
int loom__pp_simulate_v(loom_pp_schedule_t kind, int P, int V, int M, const double *f, const double *h,
                        const double *b, double *span, double *bubble);
/* loom__pp_simulate_v with V = 1: stage s's costs at s M + m. */
int loom__pp_simulate(loom_pp_schedule_t kind, int P, int M, const double *f, const double *h, const double *b,
                      double *span, double *bubble);
/* The head's positions global stage G-2 computes in each of the M micro-batches of N positions
 * (rows[M]), for the G = P V global stages lo (loom__pp_partition; V chunks per rank, V = 1 but for
 * interleaved) sharing the head: base (loom_pp_stages' head rows) in every micro-batch, and with
 * tune, the first and last micro-batch's share set to what shortens the step most in a simulation of
 * the schedule with the stages' FLOPs (there a stage would wait while the pipe fills or drains).
 * base 0: no split, all 0. */
int loom__pp_head_rows(const loom_model_config_t *cfg, loom_pp_schedule_t kind, int T, int N, int P, int V, int M,
                       const int *lo, int base, int tune, int *rows);
/* The stages' costs per micro-batch in FLOPs (into f, h, b as loom__pp_simulate takes them) for stages
 * lo of micro-batches of N positions at sequence length T, stage P-2 computing the head of rows[m]
 * positions of micro-batch m (all 0: no split): what the executor runs, for the simulation. */
void loom__pp_head_costs(const loom_model_config_t *cfg, int T, int N, int P, int M, const int *lo, const int *rows,
                         double *f, double *h, double *b);
/* Layers of the P stages balanced by FLOPs (forward + backward per token, the embedding on the first
 * stage, ln_f + lm head + loss on the last): stage s runs blocks [lo[s], lo[s+1]), lo[0] = 0,
 * lo[P] = L, at least one block each but the last, which may run the head alone (lo[P-1] = L) when
 * that is cheaper; the head's positions are then shared with stage P-2, which holds the head's input
 * (its last block's output): *head_split (may be NULL; 0 when there is no split) is the fraction of
 * every micro-batch's positions whose head stage P-2 computes, so that the two stages cost the same.
 * P <= L; LOOM_EINVAL naming both otherwise. Minimizes the most expensive stage; ties go to the
 * earlier split, and to no split of the head. */
int loom__pp_partition(const loom_model_config_t *cfg, int T, int P, int *lo, double *head_split);

/* ---- the executor ------------------------------------------------------------------------------ */

/* A timed span for the trace (src/train/trace.c): what ran, on which micro-batch (-1: none) and unit
 * (a block 0..L-1, -1 the embedding, -3 the head's fused forward and backward, -2 none or the whole
 * model). */
typedef enum {
	LOOM_EV_FORWARD = 0, LOOM_EV_BACKWARD, LOOM_EV_SEND, LOOM_EV_RECV, LOOM_EV_ALLREDUCE, LOOM_EV_OPTIM,
	LOOM_EV_CP, /* the context-parallel attention's wait for keys (unit: the hook's loom_tp_op_t) */
	LOOM_EV_KINDS
} loom__event_kind_t;
typedef void (*loom__event_fn)(void *ctx, loom__event_kind_t kind, int mb, int unit, double t0, double t1);

typedef struct loom_exec loom_exec_t;

typedef struct {
	loom_model_t *model;          /* the caller's whole model (borrowed): a pipeline copies its stages'
	                                 initial parameters from its buffer, or without one (NULL params)
	                                 initializes them as loom_model_init(seed) would */
	uint64_t seed;
	loom_comm_t *pp;             /* the pipeline axis, NULL for one stage (the local executor) */
	loom_comm_t *tp;             /* the tensor-parallel axis, NULL for one rank; with tp > 1 the model is
	                                that rank's shard (loom_model_opts_t tp_size, tp_rank) */
	int B, T, M;                 /* micro-batch and micro-batches per step (the accumulation) */
	loom_pp_schedule_t schedule;
	int V;                       /* model chunks per rank (interleaved; 0 or 1: one), loom__pp_check's */
	double head_split;           /* loom_train_config_t pp_head_split: 0 balanced, < 0 off, else the fraction */
	int *inputs, *targets;       /* B x T each (borrowed): where the local executor reads a micro-batch */
	loom__event_fn on_event;     /* may be NULL */
	void *event_ctx;
} loom_exec_config_t;

/* Reads micro-batch j of the step into inputs and targets (B x T each). */
typedef int (*loom__batch_fn)(void *ctx, int j, int *inputs, int *targets);

typedef struct {
	double comm_ms, exposed_comm_ms; /* the strategy's gradient communication (as its stats) */
	double p2p_wait_ms;              /* time the training thread waited for pipeline transfers */
	unsigned long long p2p_bytes;    /* bytes this rank sent to its pipeline neighbours (activations and
	                                    gradients) */
	int max_inflight;                /* the most micro-batches whose activations were held at once */
	double bubble;                   /* the stages' mean idle fraction over the schedule's common span
	                                    (first forward of any stage to last backward of any), from the
	                                    same timestamps as the trace; 0 for the local executor */
	double bubble_expected;          /* what the schedule idles with these stages' measured compute
	                                    times per forward and backward (loom__pp_simulate), which is
	                                    (P-1)/(M+P-1) when the stages are balanced */
} loom_exec_stats_t;

typedef struct {
	const char *name;
	int (*create)(loom_exec_t **e, const loom_exec_config_t *cfg);
	void (*destroy)(loom_exec_t *e);
	/* The model the strategy attaches to; owned by the executor or the caller's. */
	loom_model_t *(*model)(loom_exec_t *e);
	/* Per tensor of the model: 1 for a copy of a tensor another stage owns, left out of the gradient
	 * norm (strategy.h's norm_skip), and 1 for a tensor whose gradient the executor sums with other
	 * stages' before the strategy's finish_grads (deferred); NULL: none. */
	void (*stage_flags)(loom_exec_t *e, const unsigned char **norm_skip, const unsigned char **deferred);
	/* Zero the gradients and run the step's M micro-batches (grad scale 1/M) through strategy s;
	 * *loss_sum is the sum of the micro-batch losses, on every rank of the pipeline. */
	int (*step)(loom_exec_t *e, loom_strategy_t *s, loom__batch_fn get, void *ctx, double *loss_sum,
	            loom_exec_stats_t *st);
	/* The global gradient norm (the strategy's, combined across stages). */
	int (*grad_norm)(loom_exec_t *e, loom_strategy_t *s, double *norm);
	/* Forward only, gradients untouched: window j of n (read by get(ctx, j, ...), B x T each) through
	 * the model (a pipeline: through its stages, the last computing the loss), its mean loss into
	 * losses[j] on every rank of the pipeline. Collective over the pipeline; under a strategy whose
	 * forwards communicate (ZeRO-3) its data-parallel ranks must run as many windows. */
	int (*eval)(loom_exec_t *e, loom_strategy_t *s, loom__batch_fn get, void *ctx, int n, float *losses);
	/* The checkpoint's model and optimizer state (the strategy's save for the local executor; a
	 * pipeline writes the whole model as one process's from its stages), and reading any checkpoint
	 * back into this rank's part (the strategy's load; a stage's tensors). As the strategy's save and
	 * load: save collective, load not. */
	int (*save)(loom_exec_t *e, loom_strategy_t *s, const loom_ckpt_writer_t *w);
	int (*load)(loom_exec_t *e, loom_strategy_t *s, const char *dir, long long step);
} loom_exec_ops_t;

struct loom_exec {
	const loom_exec_ops_t *ops;
};

const loom_exec_ops_t *loom__exec_local(void);    /* pp_local.c */
const loom_exec_ops_t *loom__exec_pipeline(void); /* pp.c */

#endif
