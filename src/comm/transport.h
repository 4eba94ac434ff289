/* transport.h: what algorithms may ask of a communicator's transport, and what a transport must
 * implement.
 *
 * Two audiences. Algorithms (src/comm/algo/) are written only against part 1 of this header and
 * the public loom_comm_rank / loom_comm_size, so a transport plugs in without touching them.
 * Transports (src/comm/transport/: shared memory, and MPI between hosts) implement part 2, the table
 * loom_xport_ops_t, which comm.c and request.c call and nothing else; a transport includes no other
 * loom header than this one, loom/comm.h and core/util.h, and keeps all of its state behind
 * loom_xp_state(c).
 *
 * Writing a transport: fill a loom_xport_ops_t with every entry below, declare it next to
 * loom__xport_shm at the end of this file and choose it where a communicator is made: comm.c
 * (loom__comm_new's default and loom_comm_init_opts: MPI when the job spans hosts; sub-communicators
 * inherit their parent's) and hier.c (the groups of a communicator spanning hosts, and its
 * sub-communicators: shared memory when they lie on one host). The rules every entry obeys:
 *   - Blocking. Every call returns when its part is done or failed. Waits honour ctx->deadline
 *     (0: now + loom_xp_timeout(c)) with LOOM_ETIMEDOUT, and notice within 2 s a peer that died or
 *     left (LOOM_EPEERLOST), except where the peer had already done its part.
 *   - Failures are recorded with loom_comm_fail(c, code, ...) before returning the negative code.
 *     On collective channels, in allgather_small, and on timeouts or lost peers, the transport
 *     also aborts (ops->abort): every rank's later calls on the communicator then fail fast with the
 *     first failure's message, which `aborted` returns.
 *   - The progress engine. Non-blocking operations run on one thread per process that interleaves
 *     several communicators' operations. A wait that cannot progress must therefore first ask
 *     loom_xp_should_yield() and, when it says so, call loom_xp_yield(ready, arg) instead of
 *     blocking (ready(arg): could this wait progress now?), then re-check and repeat. It must never
 *     block the thread while loom_xp_should_yield() holds. `idle_wait` is how the engine sleeps
 *     when every operation waits: until any message for this rank arrives on any communicator of
 *     the job, or wake_self is called. (MPI: MPI_Test-style polling with a short sleep, for example.)
 *   - Threads. Different threads may call into one communicator's transport at once for
 *     different channels: the collective channel (one operation at a time) and the point-to-point
 *     channels to and from each peer (one operation per direction and peer at a time). alloc and
 *     free are thread-safe.
 *   - Messages. Between two ranks, each channel (collective; point to point) is a FIFO. The size
 *     (and tag on point-to-point channels, and ctx->seq and the collective's signature on the collective channel)
 *     travels with the message: a receive that does not match is LOOM_EMISMATCH on both sides,
 *     never an overrun, and the message names both signatures. A wait blocked on a send should
 *     also notice a message from its peer with the same sequence number but another signature
 *     (every rank a broadcast root, each only sending). Zero-byte messages are real messages. */
#ifndef LOOM_COMM_TRANSPORT_H
#define LOOM_COMM_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "loom/comm.h"

/* ============ Part 1: what algorithms may call ============ */

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
 * once the receiver no longer needs sbuf. Runs on the communicator's collective channel, within
 * the collective being run (its sequence number and deadline; outside one: sequence 0 and a
 * deadline of LOOM_TIMEOUT_S from the call). */
int loom_xp_sendrecv(loom_comm_t *c, int dst, const void *sbuf, size_t sbytes, int src, void *rbuf, size_t rbytes,
                     const void *red_local, loom_dtype_t dt, loom_op_t op);

/* Convenience forms of loom_xp_sendrecv. */
int loom_xp_send(loom_comm_t *c, int dst, const void *buf, size_t bytes);
int loom_xp_recv(loom_comm_t *c, int src, void *buf, size_t bytes);

/* Per-communicator scratch buffer `slot` (0 or 1) of at least `bytes`, in the shared segment when
 * possible (so sends from it are single-copy). Grows as needed and stays valid until the next call
 * with the same slot; NULL when memory is exhausted. Only the thread running a collective uses it. */
void *loom_comm_scratch(loom_comm_t *c, int slot, size_t bytes);

/* Bytes per segment of pipelined algorithms (LOOM_RING_SEG or loom_comm_opts_t.ring_seg_bytes,
 * default 4 MiB): the same on every rank (checked at init). */
size_t loom_comm_ring_seg(const loom_comm_t *c);

/* Record the detail of a failure on the communicator, prefixed with the rank, the running operation
 * and its sequence number, and return `code`. */
int loom_comm_fail(loom_comm_t *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Elementwise reductions used by transports and algorithms (src/comm/reduce.c).
 * out[i] = a[i] OP b[i]; out may alias a or b. op: SUM, MAX, MIN (AVG reduces as SUM).
 * bfloat16 is combined in float32 and rounded to nearest even. */
void loom_reduce_local(void *out, const void *a, const void *b, size_t count, loom_dtype_t dt, loom_op_t op);
/* buf[i] *= 1/n for floating types (the final step of LOOM_AVG). */
void loom_scale_local(void *buf, size_t count, loom_dtype_t dt, int n);

/* ============ Part 2: what a transport implements, and what it may call ============ */

/* The signature of a collective call: what every rank must agree on. It travels with every message
 * on the collective channel (with the sequence number) and the receiver compares it with its own, so
 * a call whose kind, dtype, op, root or total count differs between ranks fails on the ranks that
 * receive (and, through the abort, on every rank) instead of combining unrelated data. Zero outside
 * collectives. */
typedef struct {
	uint64_t count; /* total elements of the call (v-collectives: a digest of recvcounts) */
	int32_t shape;  /* (kind + 1) | dtype << 8 | (op + 1) << 16 (op -1: none); 0: no signature */
	int32_t root;   /* -1 when the call has no root */
} loom_xp_sig_t;

/* The operation a transport call belongs to, passed explicitly to every call that waits. */
typedef struct {
	const char *op;  /* "allreduce", "isend", "split", ... (for messages) */
	uint64_t seq;    /* collective sequence number (the same on every rank); 0 outside collectives */
	double deadline; /* loom_now() time after which waits fail with LOOM_ETIMEDOUT; 0: now + timeout */
} loom_xp_ctx_t;

/* The signature of the collective that ctx belongs to: the running collective's when ctx is the
 * context of an algorithm's calls on c, else zero (board exchanges, a transport's own operations). */
loom_xp_sig_t loom_xp_coll_sig(const loom_comm_t *c, const loom_xp_ctx_t *ctx);

/* "allreduce #5 (count 1000, float32, op sum, root -1)": a signature in words, for messages. */
void loom_xp_sig_describe(char *out, size_t cap, uint64_t seq, const loom_xp_sig_t *sig);
/* LOOM_STALL_S (default 60; 0 disables): seconds a collective may wait without progress before the
 * transport warns on stderr, naming the ranks it waits for. */
double loom_xp_stall_s(void);
/* Tell the launcher (`loom run`, through LOOM_RUN_REPORT_FD="FD:INODE" of a pipe) that world rank `reporter` suspects world rank
 * `suspect` of being stuck or dead; `why` is one line. Does nothing without a launcher. */
void loom_xp_report_suspect(int reporter, int suspect, const char *why);

/* Channels between each ordered pair of ranks. */
enum { LOOM_XP_COLL = 0, LOOM_XP_P2P = 1 };

typedef struct loom_xport_ops {
	const char *name; /* "shm", "mpi" */
	/* Join. parent == NULL: c is the job's world communicator (rank and size from the launcher);
	 * set up whatever the job shares (for shm: the world segment, liveness, the shared heap of
	 * heap_bytes per rank). Otherwise c is a new sub-group of parent (c->rank, size and world ranks
	 * set; loom_xp_world_rank), created collectively by its members. `name` is unique in the job and
	 * the same on every member. Waits until every member joined; sets loom_xp_state(c). */
	int (*open)(loom_comm_t *c, loom_comm_t *parent, const char *name, size_t heap_bytes,
	            const loom_xp_ctx_t *ctx);
	/* Leave: peers still waiting on this rank get LOOM_EPEERLOST (not an error for work it did). */
	void (*depart)(loom_comm_t *c);
	/* Free the communicator's transport state (after depart, or after a failed open). */
	void (*close)(loom_comm_t *c);
	/* See loom_xp_sendrecv; chan is LOOM_XP_COLL (tags ignored, ctx->seq checked) or LOOM_XP_P2P
	 * (stag/rtag checked, seq 0). */
	int (*sendrecv)(loom_comm_t *c, const loom_xp_ctx_t *ctx, int chan, int dst, const void *sbuf, size_t sbytes,
	                int stag, int src, void *rbuf, size_t rbytes, int rtag, const void *red_local, loom_dtype_t dt,
	                loom_op_t op);
	/* All-to-all of a record of len <= 64 bytes: all[r*len..] gets rank r's (configuration check,
	 * split colors, LOOM_DEBUG fingerprints). Collective; failures abort. */
	int (*allgather_small)(loom_comm_t *c, const loom_xp_ctx_t *ctx, const void *mine, size_t len, void *all);
	/* Record a fatal error for every rank of c (the first one recorded wins). */
	void (*abort)(loom_comm_t *c, int code, const char *msg);
	/* The recorded fatal error's code (0: none) and its message into msg. */
	int (*aborted)(loom_comm_t *c, char *msg, size_t cap);
	/* This rank enters collective ctx->seq (coll: its loom_coll_t; -1 a split; -2 loom_comm_destroy,
	 * with ctx->seq one past the last call). Publish it (for the diagnostics of peers that wait) with
	 * its signature (loom_xp_coll_sig), without waiting for anyone: a transport checks earlier calls
	 * where it waits anyway. At destroy, settle the calls before it: every message of this rank's
	 * must have been received by its peer, and none of a peer's may wait unreceived for this rank.
	 * A message a peer went past without receiving, or one this rank's calls never received, is a
	 * mismatch the sending rank's eager send could not see (every rank a broadcast root):
	 * LOOM_EMISMATCH naming both calls, and an abort. Waits (a peer that has not yet received)
	 * honour ctx->deadline and liveness. Returns LOOM_OK at once when the communicator is already
	 * aborted (the caller reports that). */
	int (*enter)(loom_comm_t *c, const loom_xp_ctx_t *ctx, int coll);
	/* Memory every rank can read in place (loom_comm_alloc): NULL with loom_seterr when exhausted.
	 * free returns 1 when p was such memory (and is freed), 0 otherwise. Thread-safe. */
	void *(*alloc)(loom_comm_t *c, size_t bytes);
	int (*free)(loom_comm_t *c, void *p);
	/* The progress engine's sleep and wake-up (see the top of this file). */
	void (*idle_wait)(loom_comm_t *c, int (*cond)(void *), void *arg, double max_s);
	void (*wake_self)(loom_comm_t *c);
	/* Optional (NULL: none): the transport's own all-reduce on the collective channel (MPI's), which
	 * hier.c may choose for the inter-host phase instead of loom's algorithms. op SUM, MAX or MIN;
	 * LOOM_ENOTSUP (recorded, not fatal) for a dtype it cannot reduce. */
	int (*allreduce)(loom_comm_t *c, const loom_xp_ctx_t *ctx, const void *send, void *recv, size_t count,
	                 loom_dtype_t dt, loom_op_t op);
} loom_xport_ops_t;

/* Every communicator starts with this (struct loom_comm's first member), so that a transport
 * reaches its state with one load. */
typedef struct {
	const loom_xport_ops_t *ops;
	void *state; /* the transport's, set by its open */
} loom_xp_head_t;

/* What a transport may ask of the communicator. */
static inline void *loom_xp_state(const loom_comm_t *c)
{
	return ((const loom_xp_head_t *)(const void *)c)->state;
}
static inline void loom_xp_set_state(loom_comm_t *c, void *state)
{
	((loom_xp_head_t *)(void *)c)->state = state;
}
int loom_xp_world_rank(const loom_comm_t *c, int r); /* world rank of member r */
double loom_xp_timeout(const loom_comm_t *c);        /* seconds (LOOM_TIMEOUT_S) */
size_t loom_xp_inplace_min(const loom_comm_t *c);    /* single-copy threshold (LOOM_SHM_INPLACE_MIN) */
/* The progress engine (request.c): see "The progress engine" above. */
int loom_xp_should_yield(void);
void loom_xp_yield(int (*ready)(void *), void *arg);

/* Ranks that exit before joining (transport/shm_peers.c): the ranks a launcher starts on a host are
 * children of one process, exec'd with their rank in the environment; a rank waiting for others to
 * join scans its siblings. */
typedef struct {
	const char *var; /* the launcher's rank variable; NULL: the scan is off */
	int ppid, n;     /* n: ranks; -1 once tried and off, 0 not tried */
	int *pid;        /* per rank: its process (> 0), gone since seen (< 0), never seen (0) */
	char *buf;       /* a process's environment */
	int unnamed;     /* siblings naming no rank, first seen < 1 s ago (between fork and exec?) */
	int nu;          /* siblings naming no rank in the last scan: pids and first seen */
	int upid[32];
	double useen[32];
	int scans;
	double first, next;
	const char *mark;       /* when set: a sibling whose process name (comm) is this is marked */
	unsigned char *marked;  /* per rank: seen with that name (allocated by init when mark is set) */
} loom_shm_peers_t;

/* Set up the scan of this host's n ranks, numbered by the launcher's rank variable (RANK,
 * OMPI_COMM_WORLD_RANK, SLURM_PROCID, whose size variable must equal n); _vars: by rank_var, whose
 * size is size_var (e.g. OMPI_COMM_WORLD_LOCAL_RANK / _LOCAL_SIZE). 0 when the scan cannot be
 * trusted here (then loom__shm_peers_gone always says no). */
int loom__shm_peers_init(loom_shm_peers_t *p, int n);
int loom__shm_peers_init_vars(loom_shm_peers_t *p, int n, const char *rank_var, const char *size_var,
                              const char *mark);
void loom__shm_peers_free(loom_shm_peers_t *p);
/* 1 with the reason when rank r (not yet joined) has exited or died; scans at most every 100 ms.
 * p->pid[r] > 0 afterwards: the last scan found r alive. */
int loom__shm_peers_gone(loom_shm_peers_t *p, int r, char *why, size_t cap);

/* The transports. */
extern const loom_xport_ops_t loom__xport_shm;
#ifdef LOOM_HAVE_MPI
/* MPI (transport/mpi_xport.c), for communicators spanning hosts; built when MPI is found. Before
 * its first open, loom__mpi_layout initializes MPI (once per process, finalized at exit) and
 * returns this rank, the job's size, and for every world rank its host (numbered 0..nhosts-1 in
 * order of the hosts' lowest ranks) and its rank on that host. The arrays are the transport's
 * (valid until exit). Returns LOOM_OK or a negative LOOM_E* with loom_seterr. */
extern const loom_xport_ops_t loom__xport_mpi;
int loom__mpi_layout(int *rank, int *size, const int **host_of, const int **lrank_of, int *nhosts);
const char *loom__mpi_hostname(int host); /* the hostname of host h ("?" if unknown) */
/* An exchange with one peer of c (an MPI communicator) left in flight: bytes from sbuf to peer and
 * bytes from peer into rbuf, on the collective channel at ctx->seq (both sides post the same seq),
 * each preceded by ctx->seq and sig (the signature of the collective the exchange belongs to), which
 * the peer compares with its own (LOOM_EMISMATCH naming both).
 * post returns LOOM_OK and the exchange in *out, or a failure recorded on c; wait polls as every MPI wait does (yielding to the
 * progress engine), checks the size received (LOOM_EMISMATCH) and releases the exchange, done or
 * not; drop abandons one (after a failure: c is being aborted, the buffers must outlive it). */
typedef struct loom_mpi_xchg loom_mpi_xchg_t;
int loom__mpi_xchg_post(loom_comm_t *c, const loom_xp_ctx_t *ctx, const loom_xp_sig_t *sig, int peer, const void *sbuf,
                        void *rbuf, size_t bytes, loom_mpi_xchg_t **out);
int loom__mpi_xchg_wait(loom_comm_t *c, const loom_xp_ctx_t *ctx, loom_mpi_xchg_t *x);
void loom__mpi_xchg_drop(loom_mpi_xchg_t *x);
#endif

#endif
