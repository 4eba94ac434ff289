/* loom/comm.h: collectives between the processes of a job (MPI/NCCL-like).
 *
 * A communicator is joined with loom_comm_init() from the environment that `loom run` (torchrun's
 * contract), mpirun or Slurm set. Every fallible call returns LOOM_OK or a negative LOOM_E* code; the
 * detail of the last failure on a communicator (rank, operation, sequence number, what was expected)
 * is loom_comm_errmsg(). Blocking calls have a deadline (LOOM_TIMEOUT_S, default 300 s) and return
 * LOOM_EPEERLOST within 2 s when a rank they wait on has died or exited.
 *
 * Environment, in order of precedence:
 *   RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE   (loom run / torchrun)
 *   OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE   (mpirun)
 *   SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID        (srun)
 *   none of these: a job of one rank.
 * LOOM_JOB_ID names the job's communicators (loom-<LOOM_JOB_ID>@*: the abstract socket on which rank 0
 * offers each one's shared memory, which has no name in /dev/shm and ends with the job's processes);
 * `loom run` sets it, otherwise it is derived from the launcher's job id (or MASTER_ADDR/MASTER_PORT).
 * LOOM_ALGO=op:algo[,op:algo...] overrides the algorithm choice; LOOM_DEBUG=1 checks every
 * collective's signature across ranks. LOOM_TIMEOUT_S may be fractional. LOOM_SHM_MB sizes each
 * rank's shared heap (loom_comm_alloc; default 1024 MiB of address space, LOOM_SOLO_SHM_MB in a job
 * of one rank, which shares it with nobody). LOOM_RING_SEG and LOOM_SHM_INPLACE_MIN tune the transfer of
 * large messages. LOOM_ALGO, LOOM_DEBUG, LOOM_SHM_MB, LOOM_RING_SEG and LOOM_SHM_INPLACE_MIN must be
 * the same on every rank (checked at init). loom_comm_init_opts sets them in code instead.
 * RANK without WORLD_SIZE is an error; LOCAL_RANK / LOCAL_WORLD_SIZE default to RANK / WORLD_SIZE.
 * A job spanning machines (mpirun's OMPI_COMM_WORLD_LOCAL_SIZE < SIZE, Slurm with several nodes and
 * PMI) joins through MPI when loom was built with it: ranks on one host talk over shared memory,
 * hosts over MPI, collectives run hierarchically (docs/multinode.md). Without MPI, or with a
 * torchrun-style environment spanning machines (LOCAL_WORLD_SIZE < WORLD_SIZE), loom_comm_init fails
 * with LOOM_ENOTSUP. loom_comm_alloc memory is shared with the ranks on the same host.
 *
 * Failures: when a rank dies or leaves, a deadline passes, or the transport sees a message of the
 * wrong size in a collective, the communicator is unusable afterwards: every later call on it, on
 * every rank, fails at once with that error and its message. A LOOM_DEBUG signature mismatch fails
 * that call on every rank and leaves the communicator usable. Without LOOM_DEBUG, every mismatched
 * collective (kind, dtype, op, root or count) fails on every rank involved, naming both calls, at
 * its next call that waits for a peer, or once a peer found it, and at loom_comm_destroy at the
 * latest; the communicator is then unusable. No collective waits longer for these checks (a small
 * broadcast's root, which waits for nobody, may learn of a mismatch only at destroy).
 *
 * Thread-safety: a communicator is used by one application thread at a time (different
 * communicators may be used by different threads); the non-blocking calls are progressed by one
 * progress thread per process. */
#ifndef LOOM_COMM_H
#define LOOM_COMM_H

#include <stddef.h>

#include "loom/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct loom_comm loom_comm_t;
typedef struct loom_request loom_request_t;

typedef enum {
	LOOM_FLOAT32 = 0,
	LOOM_BFLOAT16, /* reduced in float32, rounded to nearest even */
	LOOM_FLOAT64,
	LOOM_INT32,
	LOOM_INT64,
	LOOM_DTYPE_COUNT
} loom_dtype_t;

typedef enum {
	LOOM_SUM = 0,
	LOOM_AVG, /* sum / size; LOOM_EINVAL for integer dtypes */
	LOOM_MAX,
	LOOM_MIN,
	LOOM_OP_COUNT
} loom_op_t;

#define LOOM_UNDEFINED (-32766) /* color for loom_comm_split: this rank joins no group */

size_t loom_dtype_size(loom_dtype_t dt);      /* 0 for an invalid dtype */
const char *loom_dtype_name(loom_dtype_t dt); /* "float32", ...; "?" when invalid */
const char *loom_op_name(loom_op_t op);       /* "sum", ...; "?" when invalid */

/* Join the job described by the environment; collective (returns once every rank has joined).
 * On failure *comm is NULL and loom_errmsg() says why. A process that exits without
 * loom_comm_destroy counts as dead for its peers. Same as loom_comm_init_opts(comm, NULL). */
int loom_comm_init(loom_comm_t **comm);

/* Settings for programs that configure in code rather than through the environment. Every field
 * left 0 / NULL (as loom_comm_opts_default leaves them) means "from the environment variable,
 * else the default". Those marked [same] must be equal on every rank: loom_comm_init_opts checks
 * them, LOOM_EINVAL naming the setting and the ranks that differ. The rank, size and job id still
 * come from the launcher's environment. Sub-communicators inherit everything. */
typedef struct {
	const char *algo;         /* [same] LOOM_ALGO syntax, e.g. "allreduce:ring" ("" forces none) */
	double timeout_s;         /* LOOM_TIMEOUT_S: deadline of blocking calls (default 300) */
	size_t heap_bytes;        /* [same] LOOM_SHM_MB: shared heap per rank (default 1 GiB of address space,
	                           * LOOM_SOLO_SHM_MB MiB in a job of one rank) */
	int debug;                /* [same] LOOM_DEBUG: 1 checks every collective's signature, -1 off */
	size_t ring_seg_bytes;    /* [same] LOOM_RING_SEG: ring pipeline segment, >= 64 (default 4 MiB) */
	size_t inplace_min_bytes; /* [same] LOOM_SHM_INPLACE_MIN: loom_comm_alloc sends this large or
	                           * larger are read in place by the receiver (default 32 KiB) */
} loom_comm_opts_t;

/* The default shared heap of a job of one rank, in MiB (loom_comm_alloc falls back to nothing
 * there: callers use private memory when it is full). */
#define LOOM_SOLO_SHM_MB 64

/* Fill opts with "everything from the environment or default" (all zero). */
void loom_comm_opts_default(loom_comm_opts_t *opts);
/* loom_comm_init with settings (NULL: all from the environment). Collective. */
int loom_comm_init_opts(loom_comm_t **comm, const loom_comm_opts_t *opts);
/* Leave the job and free everything; safe on NULL. Not collective, but peers still waiting on this
 * rank then get LOOM_EPEERLOST. It first waits (at most LOOM_TIMEOUT_S) until the peers have
 * received this rank's messages of its last collectives, and returns LOOM_EMISMATCH (loom_errmsg()
 * naming both calls) when a peer went past one of them, or this rank never received one of a
 * peer's; the communicator is freed all the same. LOOM_OK otherwise, and after earlier failures. */
int loom_comm_destroy(loom_comm_t *comm);
int loom_comm_rank(const loom_comm_t *comm);
int loom_comm_size(const loom_comm_t *comm);
int loom_comm_local_rank(const loom_comm_t *comm);
/* The host (0, 1, ...: the job's hosts in its launcher's order) of member `member` of comm: 0 for every
 * member when the job runs on one host; -1 for a member out of range. */
int loom_comm_host(const loom_comm_t *comm, int member);
/* Detail of the last failure on this communicator ("" if none). Valid until the next failing call. */
const char *loom_comm_errmsg(const loom_comm_t *comm);

/* MPI_Comm_split: collective over `comm`. Ranks with the same color form a new communicator, ordered
 * by (key, old rank). color == LOOM_UNDEFINED gives *out = NULL; other colors must be >= 0. Parent
 * and child are independent afterwards and may be destroyed in any order. */
int loom_comm_split(loom_comm_t *comm, int color, int key, loom_comm_t **out);

/* Collectives. In place when send == recv. count is per rank for allgather/reduce_scatter
 * (recv holds size*count elements for allgather, send holds size*count for reduce_scatter).
 * reduce's recv is used on the root only (NULL is fine elsewhere). */
int loom_allreduce(loom_comm_t *c, const void *send, void *recv, size_t count, loom_dtype_t dt, loom_op_t op);
int loom_reduce(loom_comm_t *c, const void *send, void *recv, size_t count, loom_dtype_t dt, loom_op_t op,
                int root);
int loom_broadcast(loom_comm_t *c, void *buf, size_t count, loom_dtype_t dt, int root);
int loom_allgather(loom_comm_t *c, const void *send, void *recv, size_t count_per_rank, loom_dtype_t dt);
int loom_reduce_scatter(loom_comm_t *c, const void *send, void *recv, size_t count_per_rank, loom_dtype_t dt,
                        loom_op_t op);
int loom_barrier(loom_comm_t *c);

/* Collectives over blocks of different sizes (ZeRO / FSDP shards): recvcounts has size entries,
 * the same on every rank, and rank q's block starts at displ(q) = recvcounts[0] + ... +
 * recvcounts[q-1]. Counts of zero are fine (a rank may own nothing).
 * allgatherv: this rank's sendcount elements (sendcount must equal recvcounts[rank], else
 * LOOM_EINVAL) land at recv + displ(rank); recv holds sum(recvcounts) elements. In place when
 * send == recv + displ(rank), or send == recv (this rank's block is then read from recv[0..sendcount)).
 * reduce_scatterv: send holds sum(recvcounts) elements; recv receives the recvcounts[rank] reduced
 * elements [displ(rank), +recvcounts[rank]). In place when recv == send + displ(rank), or send ==
 * recv (the result then goes to recv[0..recvcounts[rank]), as with loom_reduce_scatter). LOOM_AVG
 * divides by the size. Large messages run the pipelined ring, single-copy from loom_comm_alloc
 * memory, like allgather / reduce_scatter. */
int loom_allgatherv(loom_comm_t *c, const void *send, size_t sendcount, void *recv, const size_t *recvcounts,
                    loom_dtype_t dt);
int loom_reduce_scatterv(loom_comm_t *c, const void *send, void *recv, const size_t *recvcounts, loom_dtype_t dt,
                         loom_op_t op);

/* Point to point. Messages between a pair arrive in order; a recv whose tag or size differs from
 * the next message's is LOOM_EMISMATCH. A send returns once its data is staged (small messages
 * do not wait for the recv; buffers from loom_comm_alloc are read in place, so such a send returns
 * after the recv). After a mismatch the channel from that sender is unusable: the receiver's
 * further recvs from it and the sender's further sends to it fail with LOOM_EMISMATCH.
 * Counts of zero are real (empty) messages. Point-to-point calls, blocking and not, may overlap each
 * other and non-blocking collectives on any communicator: a blocking send (recv) first waits for
 * this rank's earlier isends to (irecvs from) the same peer, so issue order is message order. */
int loom_send(loom_comm_t *c, const void *buf, size_t count, loom_dtype_t dt, int peer, int tag);
int loom_recv(loom_comm_t *c, void *buf, size_t count, loom_dtype_t dt, int peer, int tag);
/* Send sendcount elements to dst and receive recvcount from src, both progressing at once (so a
 * ring or an exchange of sendrecvs cannot deadlock), both with `tag`. dst == src is fine (a
 * pipeline neighbour); dst == src == this rank copies. */
int loom_sendrecv(loom_comm_t *c, const void *sendbuf, size_t sendcount, int dst, void *recvbuf, size_t recvcount,
                  int src, loom_dtype_t dt, int tag);
/* Non-blocking send / receive, completed with loom_wait or loom_test; the buffer must stay untouched
 * until then. Several may be in flight to and from the same or different peers; those on one
 * channel (to a peer, from a peer) run in issue order. Argument errors are returned at once (with
 * *req NULL); transfer errors by loom_wait / loom_test. */
int loom_isend(loom_comm_t *c, const void *buf, size_t count, loom_dtype_t dt, int peer, int tag, loom_request_t **req);
int loom_irecv(loom_comm_t *c, void *buf, size_t count, loom_dtype_t dt, int peer, int tag, loom_request_t **req);

/* Non-blocking collectives: queued and run in issue order by the process's progress thread (one
 * per process, shared by all communicators, started by the first non-blocking call and ended with
 * the last communicator that used it). Buffers must stay untouched until loom_wait returns or
 * loom_test reports done. Several may be in flight; they may be completed in any order. Those of
 * different communicators progress independently, so ranks may issue them in different orders
 * across communicators (rank 0: A then B, rank 1: B then A). A blocking collective first waits for
 * the communicator's queued ones, then runs on the calling thread. */
int loom_iallreduce(loom_comm_t *c, const void *send, void *recv, size_t count, loom_dtype_t dt, loom_op_t op,
                    loom_request_t **req);
int loom_ireduce(loom_comm_t *c, const void *send, void *recv, size_t count, loom_dtype_t dt, loom_op_t op,
                 int root, loom_request_t **req);
int loom_ibroadcast(loom_comm_t *c, void *buf, size_t count, loom_dtype_t dt, int root, loom_request_t **req);
int loom_iallgather(loom_comm_t *c, const void *send, void *recv, size_t count_per_rank, loom_dtype_t dt,
                    loom_request_t **req);
int loom_ireduce_scatter(loom_comm_t *c, const void *send, void *recv, size_t count_per_rank, loom_dtype_t dt,
                         loom_op_t op, loom_request_t **req);
int loom_ibarrier(loom_comm_t *c, loom_request_t **req);
/* recvcounts is copied: the array may be reused once the call returns (the buffers may not). */
int loom_iallgatherv(loom_comm_t *c, const void *send, size_t sendcount, void *recv, const size_t *recvcounts,
                     loom_dtype_t dt, loom_request_t **req);
int loom_ireduce_scatterv(loom_comm_t *c, const void *send, void *recv, const size_t *recvcounts, loom_dtype_t dt,
                          loom_op_t op, loom_request_t **req);
/* Wait for completion, free the request, return the operation's result (its detail in
 * loom_errmsg()). Every request must be completed with loom_wait or loom_test before
 * loom_comm_destroy, which runs queued requests first. */
int loom_wait(loom_request_t *req);
/* *done = 1 when complete (the request is then freed and the result returned), else 0 and LOOM_OK. */
int loom_test(loom_request_t *req, int *done);

/* Counters of a communicator, cumulative since init: collectives completed (blocking and
 * non-blocking, barriers included), their payload bytes on this rank (count x dtype size; per rank
 * count for allgather/reduce_scatter, this rank's count for the v-collectives), and the wall time
 * spent running them on any thread (from start to end; non-blocking ones interleaved on the
 * progress thread count the whole span). */
typedef struct {
	unsigned long long collectives;
	unsigned long long bytes;
	double busy_s;
} loom_comm_stats_t;
void loom_comm_stats(const loom_comm_t *c, loom_comm_stats_t *st);

/* Memory in the job's shared segment: collectives on it are single-copy (zero-copy staging).
 * NULL when the segment is exhausted (size: LOOM_SHM_MB, default 1024 MiB of address space per rank),
 * with loom_errmsg() saying so. Page-aligned, contents unspecified; usable with every communicator
 * of the job; valid until freed or until the job's last communicator is destroyed. Thread-safe. */
void *loom_comm_alloc(loom_comm_t *c, size_t bytes);
/* Free memory from loom_comm_alloc. NULL and pointers that loom_comm_alloc did not return are
 * ignored (no crash). */
void loom_comm_free(loom_comm_t *c, void *p);

/* Collective algorithms, for tools (`loom bench comm --verbose`). Operations are named "allreduce",
 * "reduce", "broadcast", "allgather", "reduce_scatter" and "barrier"; algorithms "ring", "rhd"
 * (recursive halving-doubling), "rd" (recursive doubling) and "tree". All three are thread-safe. */
/* The algorithm communicator c runs operation `op` with for `bytes` bytes (nccl-tests' size: the
 * whole vector; for allgather and reduce_scatter all ranks' parts together), honouring the LOOM_ALGO
 * it was created with. NULL for a NULL c or an unknown op. On a communicator spanning hosts, the
 * hierarchical collectives are "h-ALGO", ALGO being the algorithm between hosts (docs/multinode.md). */
const char *loom_comm_algo(const loom_comm_t *c, const char *op, size_t bytes);
/* Check a LOOM_ALGO value ("allreduce:ring,allgather:rd"; NULL and "" are valid) without a
 * communicator: LOOM_OK, or LOOM_EINVAL with loom_errmsg() naming the bad entry and the valid names. */
int loom_comm_algo_check(const char *spec);
/* Print the selection rule (FILE *), one line per operation: which algorithm runs for which rank
 * counts and sizes (first match wins), and the LOOM_ALGO values that operation accepts. */
void loom_comm_algo_rule(void *file);

#ifdef __cplusplus
}
#endif
#endif
