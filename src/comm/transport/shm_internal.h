/* shm_internal.h: what the files of the shared-memory transport share (shm.c: channels; shm_segment.c:
 * segments and the liveness keeper; shm_rdv.c: how ranks find a segment without a name in /dev/shm;
 * shm_wait.c: waiting, liveness checks, aborts and the board).
 * Private to src/comm/transport/. */
#ifndef LOOM_SHM_INTERNAL_H
#define LOOM_SHM_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "comm/transport.h"

/* Shape of a job in memory. The world communicator's segment ("/loom-<job>@w") holds a header, one
 * record per rank (doorbell, state, liveness mutex, a small exchange board), one channel per ordered
 * pair of ranks and kind (collective / point-to-point), and the shared heap (one region per rank)
 * behind loom_comm_alloc. A sub-communicator's segment ("/loom-<job>@w-<n>.<leader>") has the same
 * header, rank records and channels but no heap: buffers always come from the world's heap, so a
 * message can name sender memory by its offset in the world segment, which every rank maps.
 * Every process holds one loom_job_t per world (its mapping of the world segment and its heap
 * allocator); all communicators of that world reference it. */

/* ---- shared-memory layout (identical in every process of a job) ---------------------------- */

#define SHM_MAGIC 0x316d68736d6f6f6cull /* "loomshm1" */
#define SHM_VERSION 4u
#define SHM_READY 0x52454459u /* header->ready once the creator has initialized the segment */
#define SHM_MAX_SLOTS 16
#define SHM_BOARD_BYTES 64
#define SHM_ABORT_MSG 512
#define SHM_HIST 8 /* signatures of a rank's last collectives kept in its record (shm_enter.c) */

enum { CHAN_COLL = LOOM_XP_COLL, CHAN_P2P = LOOM_XP_P2P, CHAN_KINDS = 2 };

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
	atomic_int claim; /* pid of the process that took this rank (0: free): one process per rank */
	atomic_ullong seq; /* sequence number of the collective this rank last entered */
	atomic_int coll;   /* its loom_coll_t */
	atomic_int cpu;    /* where this rank last started waiting (sched_getcpu), to spot shared cores */
	/* Small all-to-all exchange through the header (split, LOOM_DEBUG fingerprints), double buffered. */
	_Alignas(64) atomic_ullong board_seq[2];
	unsigned char board[2][SHM_BOARD_BYTES];
	/* The signatures of this rank's last SHM_HIST collectives, entry seq % SHM_HIST, written at enter
	 * before `seq` (seq first zeroed, then the fields, then seq): a peer whose message this rank went
	 * past without receiving names this rank's call from here (shm_enter.c). */
	_Alignas(64) struct {
		atomic_ullong seq, count;
		atomic_int shape, root;
	} hist[SHM_HIST];
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
	int32_t sig_root;   /* the collective's signature (loom_xp_sig_t; zero for point-to-point): */
	uint64_t sig_count; /* with seq, all of it fits the slot's one cache line */
	int32_t sig_shape;
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
	uint64_t err_seq_sent, err_seq_expected; /* collective channel: the two calls, for the sender's message */
	loom_xp_sig_t err_sig_sent, err_sig_expected;
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
	int refs; /* communicators using this mapping (guarded by the job list lock in shm_xport.c) */
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
	/* The world's creator with more than one rank: the keeper also answers the world's offer
	 * (shm_rdv.c) on listen_fd with the segment's descriptor `fd`, until woken on wake_fd to stop.
	 * proc_end closes both. -1 elsewhere. */
	int listen_fd, wake_fd;
} loom_job_t;

/* The shared-memory transport's state of one communicator (loom_xp_state). */
typedef struct {
	loom_job_t *job;
	shm_hdr_t *hdr; /* this communicator's segment */
	char *base;
	size_t bytes;
	int rank, size;
	int *world_of;              /* world rank of each member */
	double timeout_s;
	size_t inplace_min;
	int spin_us, spin_small_us; /* waiting policy: spin this long, then sleep (see shm_xport.c) */
	uint64_t board_count;
	char name[208];             /* "/loom-..." */
} shm_comm_t;

static inline shm_comm_t *S(const loom_comm_t *c)
{
	return (shm_comm_t *)loom_xp_state(c);
}


/* ---- shm.c ------------------------------------------------------------------------------------ */

/* Geometry of a segment for `n` ranks with `heap_bytes` per rank (0 for sub-communicators). */
void loom__shm_layout(shm_hdr_t *h, int n, size_t heap_bytes);
/* Create (create != 0: unnamed memory, initialized, offered as `name`: shm_rdv.c) or fetch and map
 * segment `name` of n ranks, then take `rank` in it and wait until all n ranks joined. Nothing is
 * ever named in /dev/shm: the memory lives exactly as long as the processes that hold it.
 * Sets S(c)->hdr/base/bytes (and *fd_out when not NULL: the open descriptor, else it is closed).
 * Returns LOOM_OK or an error recorded with loom_comm_fail. */
int loom__shm_open_segment(loom_comm_t *c, const loom_xp_ctx_t *ctx, const char *name, int create, size_t heap_bytes,
                           int *fd_out);
void loom__shm_close_segment(loom_comm_t *c);
/* Leave: mark this rank departed and wake everyone. */
void loom__shm_depart(loom_comm_t *c);
/* Start the thread that holds this rank's liveness mutex in the world segment / release it at the
 * end of the job (marking the process PROC_EXITED). */
int loom__shm_proc_start(loom_job_t *j);
void loom__shm_proc_end(loom_job_t *j);

/* ---- shm_rdv.c: finding a segment without a name in /dev/shm ---------------------------------- */

/* The memory of a new segment `name`: an unnamed file on /dev/shm's tmpfs, freed with the last
 * process that holds it. Returns its descriptor (close-on-exec), or -1 with errno. */
int loom__shm_rdv_memory(const char *name);
/* Offer segment `name` on its abstract socket: *lfd is the listening socket (non-blocking). Returns
 * LOOM_OK, or an error recorded on c (LOOM_ESTATE naming the process that already offers that name:
 * a job with the same id). */
int loom__shm_rdv_offer(loom_comm_t *c, const char *name, int *lfd);
/* Hand fd to every process of this user waiting on lfd; returns when none waits. Thread-safe for
 * one caller per lfd. */
void loom__shm_rdv_serve(int lfd, int fd);
/* A rank fetching a segment's descriptor; sock < 0 between connections. */
typedef struct {
	int sock, pid; /* the connection to the offer, and the pid of the process offering */
	char shown[128]; /* "@loom-...": the abstract address, for messages */
} loom_shm_rdv_t;
/* One non-blocking step: 1 with *fd (close-on-exec) once the segment's creator answered, 0 when
 * not (yet) offered or not answered yet, or an error recorded on c (LOOM_ESTATE: offered by another
 * user's process). Call loom__shm_rdv_close when giving up. */
int loom__shm_rdv_fetch(loom_comm_t *c, const char *name, loom_shm_rdv_t *r, int *fd);
void loom__shm_rdv_close(loom_shm_rdv_t *r);

/* Blocking transfer on a channel kind; see loom_xp_sendrecv. Tags are checked on CHAN_P2P. */
int loom__shm_sendrecv(loom_comm_t *c, const loom_xp_ctx_t *ctx, int kind, int dst, const void *sbuf, size_t sbytes,
                       int stag, int src, void *rbuf, size_t rbytes, int rtag, const void *red_local, loom_dtype_t dt,
                       loom_op_t op);
/* All-to-all of a record of <= SHM_BOARD_BYTES bytes through the header: all[r*len..] gets rank
 * r's record. Collective over c; honours the deadline and liveness. */
int loom__shm_board_exchange(loom_comm_t *c, const loom_xp_ctx_t *ctx, const void *mine, size_t len, void *all);
/* ---- shm_enter.c: the transport's enter (transport.h): publish the collective this rank enters
 * with its signature (for peers' diagnostics and checks); at destroy, settle earlier calls. */
int loom__shm_enter(loom_comm_t *c, const loom_xp_ctx_t *ctx, int coll);
/* A wait in collective seq on peer p: LOOM_EMISMATCH (recorded, aborted) when a call up to seq that
 * both ranks have entered and still hold in their histories has another signature on p than on this
 * rank; LOOM_OK otherwise (also when unknown). */
int loom__shm_check_call(loom_comm_t *c, uint64_t seq, int p);
/* A receive in collective seq (signature now) found peer p's message of an earlier call in slot sl:
 * this rank went past it. LOOM_EMISMATCH naming both ranks' calls of sl->seq, recorded, aborted. */
int loom__shm_went_past(loom_comm_t *c, int p, const shm_slot_t *sl, uint64_t seq, loom_xp_sig_t now);
/* Peer p rejected this rank's message of call seq (signature sig) in a later call of its own: it went
 * past it. LOOM_EMISMATCH naming both ranks' calls of seq (p's from its record), recorded, aborted. */
int loom__shm_peer_went_past(loom_comm_t *c, int p, uint64_t seq, loom_xp_sig_t sig);
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

/* ---- shm_wait.c, for the engine ---------------------------------------------------------------- */

/* Sleep (at most max_s) until something wakes this process's doorbell in c's job (any message to
 * this rank on any communicator of the job, or loom__shm_wake_self), unless cond(arg) already holds. */
void loom__shm_idle_wait(loom_comm_t *c, int (*cond)(void *), void *arg, double max_s);
/* Wake whatever sleeps on this process's doorbell in c's job. */
void loom__shm_wake_self(loom_comm_t *c);

#define LOCK_CHECK_S 0.1   /* trylock a waited-on peer's liveness mutex this often */
#define SLOW_CHECK_S 0.001 /* abort flag, departures and deadline, while spinning */
#define SLEEP_SLICE_S 0.05

static inline size_t align_up(size_t x, size_t a)
{
	return (x + a - 1) / a * a;
}

static inline shm_rank_t *rank_rec(const shm_hdr_t *h, int r)
{
	return (shm_rank_t *)((char *)h + h->rank_off) + r;
}

static inline shm_chan_t *chan_of(const shm_hdr_t *h, int kind, int src, int dst)
{
	size_t i = ((size_t)kind * h->nranks + (size_t)src) * h->nranks + (size_t)dst;
	return (shm_chan_t *)((char *)h + h->chan_off + i * h->chan_stride);
}

static inline char *slot_data(const shm_hdr_t *h, shm_chan_t *ch, unsigned i)
{
	return (char *)ch + SHM_CHAN_DATA_OFF + (size_t)i * h->slot_bytes;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}

void loom__shm_futex_wake(atomic_uint *addr);

/* The record holding rank r's doorbell: one per process and job, in the world segment, so that a
 * thread waiting on several communicators (the progress engine) sleeps on one futex word and a
 * message on any communicator wakes it. Before the world segment is mapped: c's own record. */
static inline shm_rank_t *bell_rec(const loom_comm_t *c, int r)
{
	return S(c)->job && S(c)->job->hdr ? rank_rec(S(c)->job->hdr, S(c)->world_of[r]) : rank_rec(S(c)->hdr, r);
}

/* Wake rank r of c if it sleeps (after this thread's stores that make progress possible). */
static inline void shm_ring(loom_comm_t *c, int r)
{
	shm_rank_t *x = bell_rec(c, r);
	/* A read-modify-write, not a load: it orders our earlier stores before the read of sleepers
	 * (see shm_wait.c), like a fence, and ThreadSanitizer understands it. */
	if (atomic_fetch_add_explicit(&x->sleepers, 0, memory_order_seq_cst)) {
		atomic_fetch_add(&x->doorbell, 1);
		loom__shm_futex_wake(&x->doorbell);
	}
}

void loom__shm_ring_all(loom_comm_t *c);

/* The deadline of the operation the calling thread runs on c (or now + LOOM_TIMEOUT_S). */
double loom__shm_deadline(loom_comm_t *c, const loom_xp_ctx_t *ctx);

/* 0 when rank p of c is (as far as can be told) alive and a member; else 1 with the reason in why.
 * do_lock: also trylock its liveness mutex (rate-limited by callers: LOCK_CHECK_S). */
int loom__shm_check_peer(loom_comm_t *c, int p, int do_lock, char *why, size_t cap);

typedef int (*ready_fn)(void *arg);

/* One blocking wait: its deadline, spin-then-sleep phase and whom it waits on. */
typedef struct {
	loom_comm_t *c;
	double start, deadline, spin_end, next_slow, next_lock;
	uint64_t seq; /* of the collective waited in (0: none), to list the ranks behind it */
	int small;  /* waiting for small messages only: spin longer (latency) */
	int coloc;  /* an awaited rank last started waiting on this core */
	double yield_end;
	unsigned n;
	int fatal;    /* a failure aborts the communicator (collective channels, board) */
	int peers[2]; /* ranks waited on; npeers < 0: every other rank */
	int npeers;
	int dst, src; /* of a transfer, for messages */
	const char *what; /* "every rank to arrive": what a board wait waits for; NULL: see peers */
	char whatbuf[96];
	int (*waiting_on)(void *arg, int r); /* with npeers < 0: is rank r still awaited? */
	const char *op; /* the operation waited in (ctx->op), for the stall warning */
	int stalled;    /* the LOOM_STALL_S warning was printed for this wait */
} shm_waiter_t;

void loom__shm_waiter_init(shm_waiter_t *w, loom_comm_t *c, const loom_xp_ctx_t *ctx, int fatal);
static inline void shm_waiter_reset(shm_waiter_t *w)
{
	w->start = 0;
}
/* Called when no progress was possible: spin or sleep a little, then check failures.
 * Returns LOOM_OK to try again, or an error already recorded (and the abort set when fatal). */
int loom__shm_waiter_idle(shm_waiter_t *w, ready_fn ready, void *arg);

#endif
