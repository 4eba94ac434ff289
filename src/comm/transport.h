/* transport.h: what algorithms may ask of a communicator's transport, and nothing more.
 *
 * Algorithms (src/comm/algo/) are written only against this header and the public loom_comm_rank /
 * loom_comm_size, so a transport (shared memory now, MPI later, both composed hierarchically) plugs
 * in without touching them. All calls are blocking, honour the communicator's deadline, and return
 * LOOM_EPEERLOST within 2 s when the peer they wait on has died or exited. On failure they have
 * already recorded the detail with loom_comm_fail(). */
#ifndef LOOM_COMM_TRANSPORT_H
#define LOOM_COMM_TRANSPORT_H

#include <stddef.h>

#include "loom/comm.h"

/* The transport's operations (one table per transport kind). */
typedef struct loom_xport_ops {
	const char *name; /* "shm", "mpi" */
	/* See loom_xp_sendrecv. */
	int (*sendrecv)(loom_comm_t *c, int dst, const void *sbuf, size_t sbytes, int src, void *rbuf, size_t rbytes,
	                const void *red_local, loom_dtype_t dt, loom_op_t op);
} loom_xport_ops_t;

/* Send sbytes from sbuf to rank dst and receive rbytes from rank src into rbuf, progressing both at
 * once so that rings and exchanges of such calls cannot deadlock. dst < 0: nothing is sent;
 * src < 0: nothing is received. Either peer may be this rank's neighbour in both directions
 * (dst == src). Zero-byte messages are real messages (they synchronize).
 *
 * When red_local is not NULL the incoming data is combined instead of stored as is:
 *   rbuf[i] = red_local[i] OP incoming[i], for i < rbytes / loom_dtype_size(dt),
 * with op one of LOOM_SUM, LOOM_MAX, LOOM_MIN (LOOM_AVG is finished by the algorithm with
 * loom_scale_local). red_local may equal rbuf; sbuf must not overlap rbuf.
 *
 * The message size is part of the message: a receive of a different size than was sent is
 * LOOM_EMISMATCH on both sides, never an overrun. When sbuf lies in memory from loom_comm_alloc
 * (or the communicator's scratch), the receiver reads it in place (single copy); the call returns
 * once the receiver no longer needs sbuf. */
int loom_xp_sendrecv(loom_comm_t *c, int dst, const void *sbuf, size_t sbytes, int src, void *rbuf, size_t rbytes,
                     const void *red_local, loom_dtype_t dt, loom_op_t op);

/* Convenience forms of loom_xp_sendrecv. */
int loom_xp_send(loom_comm_t *c, int dst, const void *buf, size_t bytes);
int loom_xp_recv(loom_comm_t *c, int src, void *buf, size_t bytes);

/* Bytes per segment of pipelined algorithms (LOOM_RING_SEG or loom_comm_opts_t.ring_seg_bytes,
 * default 4 MiB): the same on every rank (checked at init). */
size_t loom_comm_ring_seg(const loom_comm_t *c);

/* Per-communicator scratch buffer `slot` (0 or 1) of at least `bytes`, in the shared segment when
 * possible (so sends from it are single-copy). Grows as needed and stays valid until the next call
 * with the same slot; NULL when memory is exhausted. Only the thread running a collective uses it. */
void *loom_comm_scratch(loom_comm_t *c, int slot, size_t bytes);

/* Record the detail of a failure on the communicator, prefixed with the rank, the running operation
 * and its sequence number, and return `code`. */
int loom_comm_fail(loom_comm_t *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Elementwise reductions used by transports and algorithms (src/comm/reduce.c).
 * out[i] = a[i] OP b[i]; out may alias a or b. op: SUM, MAX, MIN (AVG reduces as SUM).
 * bfloat16 is combined in float32 and rounded to nearest even. */
void loom_reduce_local(void *out, const void *a, const void *b, size_t count, loom_dtype_t dt, loom_op_t op);
/* buf[i] *= 1/n for floating types (the final step of LOOM_AVG). */
void loom_scale_local(void *buf, size_t count, loom_dtype_t dt, int n);

#endif
