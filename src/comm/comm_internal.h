/* comm_internal.h: the communicator's private state, shared by comm.c, request.c and the shared-memory
 * transport (transport/shm*.c). Not part of the public API; algorithms must not include it.
 *
 * Shape of a job in memory. The world communicator's segment ("/loom-<job>") holds a header, one
 * record per rank (doorbell, state, liveness mutex, a small exchange board), one channel per ordered
 * pair of ranks and kind (collective / point-to-point), and the shared heap (one region per rank)
 * behind loom_comm_alloc. A sub-communicator's segment ("/loom-<job>-<n>.<leader>") has the same
 * header, rank records and channels but no heap: buffers always come from the world's heap, so a
 * message can name sender memory by its offset in the world segment, which every rank maps.
 * Every process holds one loom_job_t per world (its mapping of the world segment and its heap
 * allocator); all communicators of that world reference it. */
#ifndef LOOM_COMM_INTERNAL_H
#define LOOM_COMM_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "comm/algo/algo.h"
#include "comm/transport.h"

/* ---- shared-memory layout (identical in every process of a job) ---------------------------- */

#define SHM_MAGIC 0x316d68736d6f6f6cull /* "loomshm1" */
#define SHM_VERSION 1u
#define SHM_READY 0x52454459u /* header->ready once the creator has initialized the segment */
#define SHM_MAX_SLOTS 16
#define SHM_BOARD_BYTES 64
#define SHM_ABORT_MSG 512

enum { CHAN_COLL = 0, CHAN_P2P = 1, CHAN_KINDS = 2 };

/* Per-segment membership of a rank. */
enum { RANK_ABSENT = 0, RANK_JOINED = 1, RANK_DEPARTED = 2 };
/* Per-process liveness, world segment only. */
enum { PROC_ABSENT = 0, PROC_ALIVE = 1, PROC_EXITED = 2, PROC_DEAD = 3 };

/* Slot flags. */
#define SLOT_INPLACE 1u /* payload is in the sender's shared heap at `off` (world-segment offset) */

typedef struct {
	/* Line 0: written by others to wake this rank; `sleepers` by this rank before it sleeps. */
	_Alignas(64) atomic_uint doorbell;
	atomic_uint sleepers;
	/* Line 1: membership and progress, read by peers when they diagnose a failure. */
	_Alignas(64) atomic_int state; /* RANK_* */
	int pid;
	atomic_ullong seq; /* sequence number of the collective this rank last entered */
	atomic_int coll;   /* its loom_coll_t */
	atomic_int cpu;    /* where this rank last started waiting (sched_getcpu), to spot shared cores */
	/* Small all-to-all exchange through the header (split, LOOM_DEBUG fingerprints), double buffered. */
	_Alignas(64) atomic_ullong board_seq[2];
	unsigned char board[2][SHM_BOARD_BYTES];
	/* World segment only: robust, process-shared, held by the rank's keeper thread for as long as the
	 * process is in the job; a peer that trylocks it and gets EOWNERDEAD knows the process died. */
	_Alignas(64) pthread_mutex_t alive;
	atomic_int proc; /* PROC_* */
} shm_rank_t;

typedef struct {
	_Alignas(64) atomic_uint ready; /* the sender's head after posting this chunk (chunk number + 1) */
	uint32_t flags;
	uint64_t total; /* bytes of the whole message */
	uint64_t bytes; /* bytes in this chunk (INPLACE: the whole message) */
	uint64_t off;   /* copy: offset of the chunk in the message; INPLACE: world offset */
	uint64_t seq;   /* collective sequence number (0 for point-to-point) */
	int32_t tag;
} shm_slot_t;

/* One direction between two ranks: a FIFO of `nslots` slots (a power of two). `head` counts chunks
 * posted (written and read by the sender only), `tail` chunks consumed (receiver); head - tail <=
 * nslots. The receiver polls the next slot's `ready` word rather than `head`, so a small message
 * costs the receiver one cache line plus its payload. The payload area follows at
 * SHM_CHAN_DATA_OFF, nslots * slot_bytes. */
typedef struct {
	_Alignas(64) atomic_uint head;
	_Alignas(64) atomic_uint tail;
	_Alignas(64) atomic_int err; /* set by the receiver after a mismatch: the channel is unusable */
	uint64_t err_sent, err_expected;
	int32_t err_tag_sent, err_tag_expected;
	shm_slot_t slot[SHM_MAX_SLOTS];
} shm_chan_t;

#define SHM_CHAN_DATA_OFF 4096

typedef struct {
	uint64_t magic;
	uint32_t version, nranks;
	uint32_t nslots, slot_bytes;
	uint64_t rank_off, chan_off, chan_stride, heap_off, heap_bytes, total_bytes;
	_Alignas(64) atomic_uint ready;
	atomic_uint attached;
	_Alignas(64) atomic_int abort_code; /* first fatal error any rank hit on this communicator */
	atomic_int abort_rank;
	atomic_int abort_claim; /* the first failing rank claims it, writes abort_msg, then the code */
	char abort_msg[SHM_ABORT_MSG];
} shm_hdr_t;

/* ---- process-local state -------------------------------------------------------------------- */

typedef struct heap_block heap_block_t;

/* One per world per process: the mapping of the world segment and this rank's heap allocator. */
typedef struct loom_job {
	char *base; /* world segment mapping */
	size_t bytes;
	int fd;
	int refs; /* communicators using this mapping (guarded by the job list lock in comm.c) */
	int world_rank, world_size;
	shm_hdr_t *hdr;
	pthread_mutex_t heap_lock;
	heap_block_t *blocks; /* this rank's heap region, in offset order */
	char *heap_lo, *heap_hi; /* all ranks' heaps: [heap_lo, heap_hi) */
	/* The thread that holds this rank's liveness mutex for the job's lifetime (shm_proc_start). */
	pthread_t keeper;
	pthread_mutex_t keeper_lock;
	pthread_cond_t keeper_cond;
	int keeper_state; /* 0 starting, 1 holding, 2 asked to stop, <0 failed (-errno) */
} loom_job_t;

/* A lane is a FIFO of non-blocking requests that must run one after another: a communicator's
 * collectives (one lane: every rank runs them in issue order), its sends to one peer, its receives
 * from one peer (messages of a pair arrive in order). Lanes progress independently of each other.
 * All fields are guarded by the engine's lock (request.c). */
enum { LANE_COLL = 0, LANE_SEND, LANE_RECV };

typedef struct loom_lane {
	loom_comm_t *c;
	int kind, peer;                    /* LANE_*; peer -1 for LANE_COLL */
	struct loom_request *head, *tail;  /* queued, not started */
	struct loom_request *cur;          /* running */
	int in_engine;                     /* has work: queued in the engine or being run by it */
	struct loom_lane *next_in;         /* the engine's list of lanes that got work */
} loom_lane_t;

struct loom_request {
	loom_comm_t *c;
	loom_lane_t *lane;
	loom_coll_args_t args; /* collectives; point to point: send (isend) or recv (irecv), count, dt */
	int peer, tag;         /* point to point */
	uint64_t seq;
	int done, rc;
	char msg[1024];
	struct loom_request *next; /* queue link */
};

struct loom_comm {
	loom_job_t *job;
	shm_hdr_t *hdr; /* this communicator's segment */
	char *base;
	size_t bytes;
	char name[200]; /* shared-memory name, "/loom-..." */
	int rank, size, local_rank;
	int *world_of; /* world rank of each member */
	double timeout_s;
	int debug;
	int spin_us, spin_small_us; /* waiting policy: spin this long, then sleep (see parse_config) */
	loom_algo_t forced[LOOM_COLL_COUNT];
	char algo_spec[256];        /* LOOM_ALGO or opts.algo, as given (compared across ranks at init) */
	size_t ring_seg;            /* bytes per ring segment (LOOM_RING_SEG) */
	size_t inplace_min;         /* heap sends at least this large travel single-copy (LOOM_SHM_INPLACE_MIN) */
	uint64_t coll_seq, p2p_seq, board_count, split_count;
	atomic_ullong st_colls, st_bytes, st_ns; /* loom_comm_stats (updated by whichever thread ran it) */

	pthread_mutex_t err_lock;
	char errmsg[1024];

	void *scratch[2];
	size_t scratch_bytes[2];
	int scratch_heap[2];

	/* non-blocking requests (request.c) */
	loom_lane_t coll_lane;
	loom_lane_t *p2p_lanes; /* 2*size, allocated at the first isend/irecv: sends to r, then receives from r */
	int engine_user;        /* counted among the progress engine's users */
};

/* What the calling thread is doing: used to prefix error messages and to bound waits. */
typedef struct {
	loom_comm_t *c;
	const char *op;
	uint64_t seq;
	double deadline; /* 0: none (each transport call then gets its own) */
} loom_opctx_t;

extern _Thread_local loom_opctx_t loom_cur;

/* ---- shm.c ------------------------------------------------------------------------------------ */

/* Geometry of a segment for `n` ranks with `heap_bytes` per rank (0 for sub-communicators). */
void loom__shm_layout(shm_hdr_t *h, int n, size_t heap_bytes);
/* Create (create != 0: O_EXCL, initialize, publish) or attach to segment `name` of n ranks, then
 * join it as `rank` and wait until all n ranks joined; the name is unlinked once all have attached.
 * Sets c->hdr/base/bytes (and *fd_out when not NULL: the open descriptor, else it is closed).
 * Returns LOOM_OK or an error recorded with loom_comm_fail. */
int loom__shm_open_segment(loom_comm_t *c, const char *name, int create, size_t heap_bytes, int *fd_out);
void loom__shm_close_segment(loom_comm_t *c);
/* Leave: mark this rank departed and wake everyone. */
void loom__shm_depart(loom_comm_t *c);
/* Start the thread that holds this rank's liveness mutex in the world segment / release it at the
 * end of the job (marking the process PROC_EXITED). */
int loom__shm_proc_start(loom_job_t *j);
void loom__shm_proc_end(loom_job_t *j);

/* Blocking transfer on a channel kind; see loom_xp_sendrecv. Tags are checked on CHAN_P2P. */
int loom__shm_sendrecv(loom_comm_t *c, int kind, int dst, const void *sbuf, size_t sbytes, int stag, int src, void *rbuf,
                 size_t rbytes, int rtag, const void *red_local, loom_dtype_t dt, loom_op_t op);
/* All-to-all of a record of <= SHM_BOARD_BYTES bytes through the header: all[r*len..] gets rank
 * r's record. Collective over c; honours the deadline and liveness. */
int loom__shm_board_exchange(loom_comm_t *c, const void *mine, size_t len, void *all);
/* Publish the collective this rank is entering (for diagnostics of peers). */
void loom__shm_publish_seq(loom_comm_t *c, uint64_t seq, int coll);
/* Record a fatal error in the segment so that every rank's waits fail fast with it. */
void loom__shm_abort(loom_comm_t *c, int code, const char *msg);

/* ---- shm_heap.c ------------------------------------------------------------------------------ */

int loom__shm_heap_init(loom_job_t *j);
void loom__shm_heap_free_all(loom_job_t *j);
void *loom__shm_heap_alloc(loom_job_t *j, size_t bytes);
/* Returns 1 when p was a heap block (and was freed), 0 when p is not from the heap. */
int loom__shm_heap_free(loom_job_t *j, void *p);
/* 1 when [p, p+bytes) lies in the shared heaps of the job. */
static inline int shm_heap_contains(const loom_job_t *j, const void *p, size_t bytes)
{
	const char *q = p;
	return j && q >= j->heap_lo && q < j->heap_hi && bytes <= (size_t)(j->heap_hi - q);
}

/* ---- comm.c ---------------------------------------------------------------------------------- */

/* Run one validated collective on the calling thread (sequence number already assigned). */
int loom__comm_exec(loom_comm_t *c, const loom_coll_args_t *a, uint64_t seq);
/* Validate a collective's arguments: LOOM_OK or LOOM_EINVAL recorded on c. For the v-collectives
 * it also sets a->total, and a->count to this rank's count. */
int loom__comm_validate(loom_comm_t *c, loom_coll_args_t *a);
/* Fail fast when the communicator is unusable after an earlier fatal error; LOOM_OK otherwise. */
int loom__comm_check_usable(loom_comm_t *c, const char *op);

/* ---- request.c: the progress engine ----------------------------------------------------------- */

/* Wait until the lane has no queued or running request (blocking calls use the lanes they touch
 * only after that). */
void loom__comm_lane_drain(loom_comm_t *c, loom_lane_t *l);
/* Wait until no non-blocking collective is queued or running (called by blocking collectives). */
void loom__comm_req_drain(loom_comm_t *c);
/* Run every queued request of c, then stop counting c among the engine's users (the engine thread
 * ends with its last user). */
void loom__comm_req_shutdown(loom_comm_t *c);
/* Queue a validated collective; *req receives the request. */
int loom__comm_req_submit(loom_comm_t *c, const loom_coll_args_t *a, loom_request_t **req);
/* The lane of point-to-point messages to (send != 0) or from peer, or NULL before the first
 * isend/irecv on c. */
loom_lane_t *loom__comm_p2p_lane(loom_comm_t *c, int send, int peer);

/* For the transport's waits. 1 when the calling thread is the engine running a request and other
 * lanes have work: the wait must then hand the thread back (loom__engine_yield) instead of
 * sleeping. */
int loom__engine_should_yield(void);
/* Hand the engine thread to other lanes; returns when the engine resumes this request, which then
 * re-checks its condition. ready(arg) tells the engine, without resuming it, whether it could
 * progress. */
void loom__engine_yield(int (*ready)(void *), void *arg);

/* ---- comm.c, point to point ------------------------------------------------------------------- */

/* Check a point-to-point call's arguments (peer another rank of c); LOOM_OK or LOOM_EINVAL recorded
 * on c, the message prefixed with op. */
int loom__comm_p2p_check(loom_comm_t *c, const char *op, const void *buf, size_t count, loom_dtype_t dt, int peer);
/* Run one validated point-to-point transfer on the calling thread: sbytes to dst and rbytes from
 * src (-1: that direction is unused), both with `tag`; `op` names it in errors. */
int loom__comm_p2p_exec(loom_comm_t *c, const char *op, int dst, const void *sbuf, size_t sbytes, int src,
                        void *rbuf, size_t rbytes, int tag);

/* ---- shm_wait.c, for the engine ---------------------------------------------------------------- */

/* Sleep (at most max_s) until something wakes this process's doorbell in c's job (any message to
 * this rank on any communicator of the job, or loom__shm_wake_self), unless cond(arg) already holds. */
void loom__shm_idle_wait(loom_comm_t *c, int (*cond)(void *), void *arg, double max_s);
/* Wake whatever sleeps on this process's doorbell in c's job. */
void loom__shm_wake_self(loom_comm_t *c);

#endif
