/* shm_internal.h: what the files of the shared-memory transport share (shm.c: channels; shm_segment.c:
 * segments and the liveness keeper; shm_wait.c: waiting, liveness checks, aborts and the board).
 * Private to src/comm/transport/. */
#ifndef LOOM_SHM_INTERNAL_H
#define LOOM_SHM_INTERNAL_H

#include <stdatomic.h>

#include "comm/comm_internal.h"

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
	return c->job && c->job->hdr ? rank_rec(c->job->hdr, c->world_of[r]) : rank_rec(c->hdr, r);
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
double loom__shm_deadline(loom_comm_t *c);

/* 0 when rank p of c is (as far as can be told) alive and a member; else 1 with the reason in why.
 * do_lock: also trylock its liveness mutex (rate-limited by callers: LOCK_CHECK_S). */
int loom__shm_check_peer(loom_comm_t *c, int p, int do_lock, char *why, size_t cap);

typedef int (*ready_fn)(void *arg);

/* One blocking wait: its deadline, spin-then-sleep phase and whom it waits on. */
typedef struct {
	loom_comm_t *c;
	double start, deadline, spin_end, next_slow, next_lock;
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
} shm_waiter_t;

void loom__shm_waiter_init(shm_waiter_t *w, loom_comm_t *c, int fatal);
static inline void shm_waiter_reset(shm_waiter_t *w)
{
	w->start = 0;
}
/* Called when no progress was possible: spin or sleep a little, then check failures.
 * Returns LOOM_OK to try again, or an error already recorded (and the abort set when fatal). */
int loom__shm_waiter_idle(shm_waiter_t *w, ready_fn ready, void *arg);

#endif
