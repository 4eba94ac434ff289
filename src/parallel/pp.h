/* pp.h: what the trainer may ask of a step executor, and nothing more (internal to src/): the
 * micro-steps of one optimizer step, run on this rank's model (pp_local.c: today's loop on the whole
 * model; pp.c: a pipeline stage running GPipe or 1F1B over the pipeline axis), and the pipeline
 * schedules and stage partition as data (schedule.c).
 *
 * The trainer drives one step as
 *
 *     step(get_batch) -> summed loss     (zeroes the gradients, runs the step's M micro-batches with
 *                                         the strategy's set_sync/finish_grads, leaves final gradients)
 *     grad_norm(strategy)                (the strategy's norm, combined across stages)
 *     strategy optim_step
 *
 * and calls gather before a checkpoint is saved or the whole model is evaluated (every stage's
 * tensors to every rank of the pipeline axis). Every operation is collective over the pipeline axis
 * (a local executor has none). The strategy attaches to loom__exec_model(e), which is the caller's
 * model for the local executor and a stage model (layers [lo, hi), parameters viewing the caller's
 * buffer) for a pipeline; with tensor parallelism, the stage model is this rank's shard of those
 * layers. */
#ifndef LOOM_PARALLEL_PP_H
#define LOOM_PARALLEL_PP_H

#include "loom/comm.h"
#include "loom/model.h"
#include "parallel/strategy.h"

/* ---- schedules and partition (schedule.c) ----------------------------------------------------- */

typedef enum { LOOM_PP_GPIPE = 0, LOOM_PP_1F1B = 1, LOOM_PP_SCHEDULES = 2 } loom_pp_schedule_t;

/* One action of a stage: forward ('F') or backward ('B') of micro-batch mb. */
typedef struct {
	char op;
	int mb;
} loom__pp_action_t;

/* "gpipe" | "1f1b"; LOOM_EINVAL naming both otherwise. */
int loom__pp_schedule_parse(const char *name, loom_pp_schedule_t *kind);
const char *loom__pp_schedule_name(loom_pp_schedule_t kind); /* "?" when invalid */
/* The actions of stage s of P over M micro-batches (2M of them, into out), from the schedule's row
 * of the table; backwards run in micro-batch order on every stage. Returns the number of arenas the
 * stage needs (the most micro-batches whose activations it holds at once: M for GPipe,
 * min(M, P - s) for 1F1B). */
int loom__pp_plan(loom_pp_schedule_t kind, int P, int s, int M, loom__pp_action_t *out);
/* The ideal bubble fraction of the schedule, (P-1)/(M+P-1) for both. */
double loom__pp_bubble_theory(loom_pp_schedule_t kind, int P, int M);
/* The schedule as a discrete-event simulation: stage s's forward and backward of micro-batch m take
 * f[s M + m] and h[s M + m] + b[s M + m], of which h (may be NULL: none) needs no input from the next
 * stage (stage P-2's share of a split head) and runs first; transfers take no time. Into *span the
 * time from the first forward to the last backward, into *bubble the stages' mean idle fraction of
 * it, as the executor measures it. Equal stages give loom__pp_bubble_theory; unequal ones more, and
 * a last stage without a forward (the head alone, fused into its backward) or an h less. LOOM_ENOMEM,
 * or LOOM_EINVAL for a plan that cannot run (none of the table's). */
int loom__pp_simulate(loom_pp_schedule_t kind, int P, int M, const double *f, const double *h, const double *b,
                      double *span, double *bubble);
/* The head's positions stage P-2 computes in each of the M micro-batches of N positions (rows[M]),
 * for stages lo (loom__pp_partition) sharing the head: base (loom_pp_stages' head rows) in every
 * micro-batch, and with tune, the first and last micro-batch's share set to what shortens the step
 * most in a simulation of the schedule with the stages' FLOPs (there a stage would wait while the
 * pipe fills or drains). base 0: no split, all 0. */
int loom__pp_head_rows(const loom_model_config_t *cfg, loom_pp_schedule_t kind, int T, int N, int P, int M,
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
	LOOM_EV_KINDS
} loom__event_kind_t;
typedef void (*loom__event_fn)(void *ctx, loom__event_kind_t kind, int mb, int unit, double t0, double t1);

typedef struct loom_exec loom_exec_t;

typedef struct {
	loom_model_t *model;          /* the caller's whole model (borrowed) */
	loom_comm_t *pp;             /* the pipeline axis, NULL for one stage (the local executor) */
	loom_comm_t *tp;             /* the tensor-parallel axis, NULL for one rank; with tp > 1 the model is
	                                that rank's shard (loom_model_opts_t tp_size, tp_rank) */
	int B, T, M;                 /* micro-batch and micro-batches per step (the accumulation) */
	loom_pp_schedule_t schedule;
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
	/* 1 per tensor that this rank's model reports gradients for, or NULL for all. */
	const unsigned char *(*tensor_used)(loom_exec_t *e);
	/* Zero the gradients and run the step's M micro-batches (grad scale 1/M) through strategy s;
	 * *loss_sum is the sum of the micro-batch losses, on every rank of the pipeline. */
	int (*step)(loom_exec_t *e, loom_strategy_t *s, loom__batch_fn get, void *ctx, double *loss_sum,
	            loom_exec_stats_t *st);
	/* The global gradient norm (the strategy's, combined across stages). */
	int (*grad_norm)(loom_exec_t *e, loom_strategy_t *s, double *norm);
	/* Every stage's parameters (and AdamW moments) to every rank of the pipeline, so the caller's
	 * model and the strategy's optimizer hold the whole current state. */
	int (*gather)(loom_exec_t *e, loom_strategy_t *s);
} loom_exec_ops_t;

struct loom_exec {
	const loom_exec_ops_t *ops;
};

const loom_exec_ops_t *loom__exec_local(void);    /* pp_local.c */
const loom_exec_ops_t *loom__exec_pipeline(void); /* pp.c */

#endif
