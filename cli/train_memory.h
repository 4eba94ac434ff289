/* train_memory.h: `loom train`'s memory check before it allocates (the model is loom/limits.h's). */
#ifndef LOOM_CLI_TRAIN_MEMORY_H
#define LOOM_CLI_TRAIN_MEMORY_H

#include "loom/model.h"

/* What the check needs of a run. */
typedef struct {
	const loom_model_config_t *mc;
	int B, T, accum, act_ckpt, zero, dp, tp, pp, threads, dtype;
	int rank, world;
	int sp; /* --sequence-parallel */
	int cp; /* --cp: the model holds T/cp rows of each sequence; the strategy spans dp x cp */
} cli_memcheck_t;

/* --memory-check refuse|warn (refuse, the default: a run that does not fit stops before it allocates;
 * warn: it is said and the run goes on). Exits 2 on another value. */
void cli_memcheck_mode(const char *v);

/* Estimate the run's memory, compare it with the limits the process runs under, and tell `loom run`
 * the estimate (for its out-of-memory diagnosis). 0: go on; 1: refused, the message printed (once
 * per host: by the first local rank). */
int cli_train_memory_check(const cli_memcheck_t *m);

#endif
