/* algo.h: collective algorithms and the rule that chooses among them.
 *
 * Each algorithm is written against transport.h only. loom_algo_run() picks the algorithm for
 * (operation, rank count, bytes), or the one forced by LOOM_ALGO, and runs it. */
#ifndef LOOM_COMM_ALGO_H
#define LOOM_COMM_ALGO_H

#include <stddef.h>

#include "loom/comm.h"

typedef enum {
	LOOM_COLL_ALLREDUCE = 0,
	LOOM_COLL_REDUCE,
	LOOM_COLL_BROADCAST,
	LOOM_COLL_ALLGATHER,
	LOOM_COLL_REDUCE_SCATTER,
	LOOM_COLL_BARRIER,
	LOOM_COLL_COUNT
} loom_coll_t;

typedef enum {
	LOOM_ALGO_AUTO = 0,
	LOOM_ALGO_RING, /* "ring": reduce-scatter + all-gather in a ring, pipelined in segments */
	LOOM_ALGO_RHD,  /* "rhd": recursive halving-doubling (Rabenseifner), any rank count */
	LOOM_ALGO_RD,   /* "rd": recursive doubling, for small messages */
	LOOM_ALGO_TREE, /* "tree": binomial tree (broadcast, reduce) */
	LOOM_ALGO_COUNT
} loom_algo_t;

typedef struct {
	loom_coll_t coll;
	const void *send;
	void *recv; /* broadcast: the buffer */
	size_t count; /* per rank for allgather / reduce_scatter */
	loom_dtype_t dt;
	loom_op_t op;
	int root;
} loom_coll_args_t;

const char *loom_coll_name(loom_coll_t coll); /* "allreduce", "reduce", ... */
const char *loom_algo_name(loom_algo_t algo); /* "auto", "ring", "rhd", "rd", "tree" */

/* Parse a LOOM_ALGO value ("allreduce:ring,allgather:rd"): fills choice[coll] (LOOM_ALGO_AUTO where
 * not given). Returns LOOM_EINVAL with err naming the bad entry and the valid names for an unknown
 * operation, an unknown algorithm or an algorithm that does not implement that operation. */
int loom_algo_parse(const char *spec, loom_algo_t choice[LOOM_COLL_COUNT], char *err, size_t cap);

/* The algorithm the selection rule picks (never AUTO), honouring `forced` unless it is AUTO. */
loom_algo_t loom_algo_select(loom_coll_t coll, int nranks, size_t bytes, loom_algo_t forced);

/* Print the selection rule, one line per operation (for `loom bench comm --verbose`). */
void loom_algo_print_rule(void *file /* FILE* */);

/* Run one collective with the algorithm selected for it (forced: from the communicator's LOOM_ALGO,
 * or AUTO). Arguments are already validated by the caller (comm.c). */
int loom_algo_run(loom_comm_t *c, const loom_coll_args_t *a, loom_algo_t forced);

#endif
