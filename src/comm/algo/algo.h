/* algo.h: collective algorithms and the rule that chooses among them.
 *
 * Each algorithm is written against transport.h only. loom_algo_run() picks the algorithm for
 * (operation, rank count, bytes), or the one forced by LOOM_ALGO, and runs it. */
#ifndef LOOM_COMM_ALGO_H
#define LOOM_COMM_ALGO_H

#include <stddef.h>
#include <stdint.h>

#include "loom/comm.h"

typedef enum {
	LOOM_COLL_ALLREDUCE = 0,
	LOOM_COLL_REDUCE,
	LOOM_COLL_BROADCAST,
	LOOM_COLL_ALLGATHER,
	LOOM_COLL_REDUCE_SCATTER,
	LOOM_COLL_BARRIER,
	LOOM_COLL_ALLGATHERV,
	LOOM_COLL_REDUCE_SCATTERV,
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
	size_t count; /* per rank for allgather / reduce_scatter; this rank's for the v-collectives */
	loom_dtype_t dt;
	loom_op_t op;
	int root;
	const size_t *counts; /* v-collectives: elements of each rank's block (size entries), else NULL */
	size_t total;         /* v-collectives: the sum of counts */
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

/* ---- internal to src/comm/algo/ ------------------------------------------------------------
 * One function per (algorithm, collective). Each takes validated arguments, runs on every rank of
 * the communicator, returns LOOM_OK or the transport's negative code (already recorded with
 * loom_comm_fail), and finishes LOOM_AVG itself (sum, then one scale by 1/size of the data it
 * owns). Buffer conventions, shared by all of them:
 *   allreduce       send, recv: count elements; in place when send == recv.
 *   reduce          send: count; recv: count, used on the root only (never written elsewhere).
 *   broadcast       recv: count, the buffer on every rank (send is ignored).
 *   allgather       send: count; recv: size*count. In place when send == recv (this rank's block is
 *                   then read from recv[0..count)) or send == recv + rank*count.
 *   reduce_scatter  send: size*count; recv: count. In place when send == recv (the result goes to
 *                   recv[0..count)) or recv == send + rank*count.
 *   barrier         no data.
 *   allgatherv      like allgather with blocks of counts[q] elements, rank q's at offset
 *                   displ(q) = counts[0] + ... + counts[q-1]; send: count == counts[rank]. In place
 *                   when send == recv (read from recv[0..count)) or send == recv + displ(rank).
 *   reduce_scatterv like reduce_scatter: send holds total elements, recv gets counts[rank] elements
 *                   reduced from [displ(rank), +counts[rank]). In place when send == recv (result in
 *                   recv[0..counts[rank])) or recv == send + displ(rank).
 * Temporaries come from loom_comm_scratch (slot 0; slot 1 holds the v-collectives' block offsets). */
typedef int (*loom_algo_fn)(loom_comm_t *c, const loom_coll_args_t *a);

int loom_ring_allreduce(loom_comm_t *c, const loom_coll_args_t *a);
int loom_ring_reduce_scatter(loom_comm_t *c, const loom_coll_args_t *a);
int loom_ring_allgather(loom_comm_t *c, const loom_coll_args_t *a);
int loom_ring_allgatherv(loom_comm_t *c, const loom_coll_args_t *a);
int loom_ring_reduce_scatterv(loom_comm_t *c, const loom_coll_args_t *a);
int loom_rhd_allreduce(loom_comm_t *c, const loom_coll_args_t *a);
int loom_rhd_reduce_scatter(loom_comm_t *c, const loom_coll_args_t *a);
int loom_rd_allreduce(loom_comm_t *c, const loom_coll_args_t *a);
int loom_rd_allgather(loom_comm_t *c, const loom_coll_args_t *a);
int loom_rd_barrier(loom_comm_t *c, const loom_coll_args_t *a); /* dissemination */
int loom_tree_broadcast(loom_comm_t *c, const loom_coll_args_t *a);
int loom_tree_reduce(loom_comm_t *c, const loom_coll_args_t *a);
int loom_tree_allreduce(loom_comm_t *c, const loom_coll_args_t *a); /* reduce to 0, then broadcast */
int loom_tree_barrier(loom_comm_t *c, const loom_coll_args_t *a);

/* The implementation of (coll, algo), or NULL when that algorithm does not implement it. */
loom_algo_fn loom_algo_impl(loom_coll_t coll, loom_algo_t algo);

/* Elements of block b when n elements are split into nb nearly equal blocks (the first n % nb
 * blocks get one more), and where it starts. */
static inline size_t loom_block_len(size_t n, int nb, int b)
{
	return n / (size_t)nb + ((size_t)b < n % (size_t)nb);
}
static inline size_t loom_block_off(size_t n, int nb, int b)
{
	size_t r = n % (size_t)nb;
	return (size_t)b * (n / (size_t)nb) + ((size_t)b < r ? (size_t)b : r);
}

/* The op a transport combines with (LOOM_AVG reduces as LOOM_SUM, then is scaled). */
static inline loom_op_t loom_wire_op(loom_op_t op)
{
	return op == LOOM_AVG ? LOOM_SUM : op;
}

/* [p, p+pb) and [q, q+qb) share a byte. */
static inline int loom_overlaps(const void *p, size_t pb, const void *q, size_t qb)
{
	uintptr_t a = (uintptr_t)p, b = (uintptr_t)q;
	return pb && qb && a < b + qb && b < a + pb;
}

static inline size_t loom_zmin(size_t a, size_t b)
{
	return a < b ? a : b;
}

/* Folding a rank count that is not a power of two (MPICH's scheme, used by rhd and rd): with
 * p = the largest power of two <= n and rem = n - p, ranks r < 2*rem pair up, the even one handing
 * its data to r+1 and sitting out; the odd ones become virtual rank r/2 and ranks >= 2*rem become
 * r - rem, so p virtual ranks remain. */
static inline int loom_pow2_floor(int n)
{
	int p = 1;
	while (p * 2 <= n)
		p *= 2;
	return p;
}
static inline int loom_fold_vrank(int r, int rem) /* -1 for an even rank that sits out */
{
	return r < 2 * rem ? (r % 2 ? r / 2 : -1) : r - rem;
}
static inline int loom_fold_real(int v, int rem) /* the real rank acting as virtual rank v */
{
	return v < rem ? 2 * v + 1 : v + rem;
}
static inline int loom_fold_first_block(int v, int rem) /* first real rank that v stands for */
{
	return v < rem ? 2 * v : v + rem;
}

#endif
