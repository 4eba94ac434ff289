/* trainer_internal.h: the trainer's state, shared by trainer.c (the loop), checkpoint.c (save and
 * resume) and log.c (JSONL) (internal to src/train). */
#ifndef LOOM_TRAIN_TRAINER_INTERNAL_H
#define LOOM_TRAIN_TRAINER_INTERNAL_H

#include <stdio.h>

#include "loom/data.h"
#include "loom/ddp.h"
#include "loom/train.h"

struct loom_trainer {
	loom_train_config_t cfg;        /* string fields point at the owned copies below */
	char *train_data, *val_data, *save_dir, *log_path, *tokenizer;
	loom_gpt2_t *model;             /* borrowed */
	loom_gpt2_config_t mcfg;
	loom_loader_t *train, *val;     /* val may be NULL */
	loom_adamw_t opt;
	int *inputs, *targets;          /* B*T each */
	int world, rank;                /* 1 and 0 in the single-process trainer */
	loom_comm_t *comm;              /* borrowed; NULL with one rank */
	loom_ddp_t *ddp;                /* gradient averaging; NULL with one rank */
	int synced;                     /* rank 0's parameters were broadcast since the last init/resume */
	double *val_losses;             /* eval_batches per-window losses, reduced across ranks */
	long long step;                 /* optimizer steps done */
	int resumed;                    /* state came from a checkpoint (the log is appended to) */
	double flops_per_token;
	double time_sum;                /* seconds of the steps timed so far (the first one excluded) */
	long long timed;
	int seen_first;
	FILE *log;                      /* opened at the first logged step */
};

/* log.c: open the JSONL log (truncating it, or when resuming at step S keeping only its lines of
 * steps <= S), append one step's object, close. */
int loom_train_log_open(loom_trainer_t *tr);
int loom_train_log_write(loom_trainer_t *tr, const loom_step_metrics_t *m);
void loom_train_log_close(loom_trainer_t *tr);

#endif
