/* trainer_internal.h: the trainer's state, shared by trainer.c (the loop), checkpoint.c (save and
 * resume) and log.c (JSONL) (internal to src/train). */
#ifndef LOOM_TRAIN_TRAINER_INTERNAL_H
#define LOOM_TRAIN_TRAINER_INTERNAL_H

#include <stdio.h>

#include "loom/data.h"
#include "loom/train.h"
#include "parallel/pp.h"
#include "parallel/strategy.h"

struct loom_trainer {
	loom_train_config_t cfg;        /* string fields point at the owned copies below */
	char *train_data, *val_data, *save_dir, *log_path, *tokenizer, *strategy_name;
	loom_model_t *model;             /* borrowed */
	loom_model_config_t mcfg;
	loom_loader_t *train, *val;     /* val may be NULL */
	int *inputs, *targets;          /* B*T each */
	int world, rank;                /* global: all ranks of the job (1 and 0 in one process); rank 0 logs
	                                   and writes checkpoints */
	loom_comm_t *dp;                /* the data-parallel axis (borrowed); NULL with one data-parallel rank */
	loom_comm_t *tp;                /* the tensor-parallel axis (borrowed); NULL with one tensor-parallel rank */
	int dp_rank, dp_size;           /* this rank's data-parallel coordinate and the axis size: the data
	                                   sharding, the batch and the checkpoints' loader states use these */
	loom_comm_t *cp;                /* the context-parallel axis (borrowed); NULL with one rank */
	int cp_rank, cp_size;
	loom_comm_t *grad;              /* the data-parallel group dp x cp (borrowed): what the strategy reduces
	                                   and shards over and the loss is averaged over; NULL with one rank */
	int *cp_inputs, *cp_targets;    /* cp > 1: this rank's B x T/cp rows of the window read (the model's) */
	loom__tp_group_t cpg;           /* the model's context-parallel hook (cp > 1) */
	loom_strategy_t *strategy;      /* the parallel strategy: gradients, norm, optimizer, parameter sync */
	loom_exec_t *exec;              /* runs a step's micro-batches: the local loop or a pipeline stage */
	loom_comm_t *pp;                /* the pipeline axis (borrowed); NULL with one stage */
	int pp_rank, pp_size;
	char *pp_schedule, *trace_dir;
	unsigned long long window;      /* the data window of the micro-batch read last (for messages) */
	struct loom_trace *trace;       /* --trace: this rank's events (trace.c), or NULL */
	int synced;                     /* rank 0's parameters were broadcast since the last init/resume */
	double *val_losses;             /* eval_batches per-window losses, reduced across ranks */
	long long step;                 /* optimizer steps done */
	int resumed;                    /* state came from a checkpoint (the log is appended to) */
	char resumed_from[1100];        /* that checkpoint's directory ("" when none) */
	long long base_step;            /* the step the state came from: the checkpoint's, or 0 (lineage) */
	int save_dir_ready;             /* loom_trainer_prepare_save_dir has run */
	double flops_per_token;
	double time_sum;                /* seconds of the steps timed so far (the first one excluded) */
	long long timed;
	int seen_first;
	double step_ema;                /* moving average of the step time (seconds), from the second step */
	double flops_nominal;           /* loom_model_flops_per_token_nominal at T (flops_per_token: MFU's
	                                   loom_model_flops_per_token): mfu_nominal's count */
	double loss_ema;                /* the losses' moving average before debiasing (checkpoint loop state) */
	loom_train_summary_t sum;       /* the run so far (log.c) */
	float *samples;                 /* the steps after warm-up for the summary's medians (log.c): dt, optim,
	                                   comm, bubble per kept step, every `stride`-th step once full */
	int nsamples, sample_cap;
	float first_steps[4 * LOOM_TRAIN_WARMUP]; /* the warm-up's own, for a run of no more steps */
	long long sample_stride, sample_seen;
	char *plan_json;                /* the planner's prediction, logged in the config record (or NULL) */
	double t_begin;                 /* loom_now() at the start of the first step of this process */
	FILE *log;                      /* opened at the first logged step */
	FILE *data_trace;               /* LOOM_DATA_TRACE=DIR: the windows this rank reads, or NULL */
};

/* trace.c: record this rank's timed events (the executor's, the optimizer's) and write them as a
 * Chrome trace: every rank writes DIR/rank_R.json, then rank 0 merges them into DIR/trace.json (one
 * track per rank). loom__trace_close is collective over world (a barrier before the merge); once
 * closed, further events are ignored. */
int loom__trace_open(struct loom_trace **t, const char *dir, int rank);
void loom__trace_event(void *t, loom__event_kind_t kind, int mb, int unit, double t0, double t1);
void loom__trace_step(struct loom_trace *t, long long step, double t0, double t1);
int loom__trace_close(struct loom_trace *t, loom_comm_t *world, int rank, int size);
void loom__trace_free(struct loom_trace *t); /* safe on NULL */

/* log.c: open the JSONL log (truncating it, or when resuming at step S keeping only its lines of
 * steps <= S), append one step's object, close. */
int loom_train_log_open(loom_trainer_t *tr);
int loom_train_log_write(loom_trainer_t *tr, const loom_step_metrics_t *m);
void loom_train_log_close(loom_trainer_t *tr);
/* log.c: the run summary: add a finished step (on every rank), and at the end of the run append the
 * summary to the log (rank 0). */
void loom__train_summary_add(loom_trainer_t *tr, const loom_step_metrics_t *m);
int loom__train_log_summary(loom_trainer_t *tr);
/* fsync the log: the lines written so far survive a crash (before a checkpoint is committed). */
int loom__train_log_sync(loom_trainer_t *tr);

#endif
