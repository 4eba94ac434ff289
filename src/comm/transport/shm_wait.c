/* shm_wait.c: how the shared-memory transport waits and notices failures: spin briefly, then futex
 * sleep on the rank's doorbell; liveness of the ranks waited on (departure flag, process state,
 * robust-mutex trylock); deadlines; the communicator-wide abort record; and the header board.
 *
 * Spinning. Only worth it when the awaited rank runs on another core and answers soon: waits for
 * small messages spin up to spin_small_us, others spin_us (comm.c sets both from the rank and core
 * counts), and none when an awaited rank last started waiting on this very core; then a wait for
 * small messages yields the core to it for up to 200 us (while it is runnable) before sleeping.
 *
 * Waking. Anyone who makes progress possible for rank r bumps r's doorbell and calls futex_wake
 * only when r announced that it sleeps (sleepers != 0). Both sides touch `sleepers` with a seq_cst
 * read-modify-write (the sleeper increments it, then reads the doorbell, then re-checks its
 * condition; the waker publishes, then reads sleepers with fetch_add 0): the RMWs are totally
 * ordered, so either the waker sees the sleeper or the sleeper's re-check sees the waker's data.
 * If the sleeper read a doorbell value the waker already bumped, its re-check sees the data too,
 * so futex_wait never waits for a wake that already happened. 50 ms sleep slices bound the cost of
 * any mistake in this reasoning.
 *
 * Liveness. While a rank waits it periodically checks the ranks it waits on: a departure flag
 * (loom_comm_destroy), the process state in the world segment, and every 100 ms a trylock of the
 * peer's robust liveness mutex, whose EOWNERDEAD means the process died. A lost peer, a timeout or
 * a message mismatch on the collective channels is recorded in the segment (abort), so every rank of
 * the communicator fails fast with the first failure's message instead of waiting for its deadline.
 * Before reporting a lost peer the waiter re-checks its condition: a rank that finished its part
 * and then left is not an error.
 *
 * Stalls. A collective wait without progress for LOOM_STALL_S (default 60) warns once on stderr,
 * naming whom it waits for and the ranks behind in the sequence; that warning and a timeout are
 * also reported to `loom run` (loom_xp_report_suspect), naming the rank most likely holding the
 * wait up, so the launcher can name a wedged rank rather than the first rank that gave up.
 *
 * Invariants: a rank's record is written only by that rank, except doorbell (anyone), proc =
 * PROC_DEAD (the first rank that sees EOWNERDEAD) and nothing else; board buffer s is reused for
 * exchange k+2 only after every rank published k+1. */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "comm/transport/shm_internal.h"
#include "core/util.h"

static void futex_wait(atomic_uint *addr, unsigned val, double seconds)
{
	struct timespec ts;
	if (seconds <= 0)
		return;
	ts.tv_sec = (time_t)seconds;
	ts.tv_nsec = (long)((seconds - (double)ts.tv_sec) * 1e9);
	syscall(SYS_futex, (unsigned *)addr, FUTEX_WAIT, val, &ts, NULL, 0);
}

void loom__shm_futex_wake(atomic_uint *addr)
{
	syscall(SYS_futex, (unsigned *)addr, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

void loom__shm_ring_all(loom_comm_t *c)
{
	for (int r = 0; r < S(c)->size; r++)
		if (r != S(c)->rank)
			shm_ring(c, r);
}

double loom__shm_deadline(loom_comm_t *c, const loom_xp_ctx_t *ctx)
{
	if (ctx && ctx->deadline > 0)
		return ctx->deadline;
	return loom_now() + S(c)->timeout_s;
}

/* ---- liveness and failure ---------------------------------------------------------------- */

/* 0 when rank p of c is (as far as we can tell) alive and a member; else 1 with the reason in why. */
int loom__shm_check_peer(loom_comm_t *c, int p, int do_lock, char *why, size_t cap)
{
	shm_rank_t *r = rank_rec(S(c)->hdr, p);
	int w = S(c)->world_of[p], st, departed = atomic_load(&r->state) == RANK_DEPARTED;
	shm_rank_t *wr = rank_rec(S(c)->job->hdr ? S(c)->job->hdr : S(c)->hdr, w);
	char who[64];
	st = atomic_load(&wr->proc);
	if (!departed && st == PROC_ALIVE && do_lock) {
		int e = pthread_mutex_trylock(&wr->alive);
		if (e == EOWNERDEAD) {
			atomic_store(&wr->proc, PROC_DEAD); /* keep the mutex: it marks nothing any more */
			st = PROC_DEAD;
		} else if (e == 0) {
			pthread_mutex_unlock(&wr->alive);
			st = atomic_load(&wr->proc);
		} else if (e == ENOTRECOVERABLE) {
			st = PROC_DEAD;
		}
	}
	if (!departed && st != PROC_DEAD && st != PROC_EXITED)
		return 0;
	if (w != p)
		snprintf(who, sizeof who, "rank %d (world rank %d, pid %d)", p, w, wr->pid);
	else
		snprintf(who, sizeof who, "rank %d (pid %d)", p, wr->pid);
	if (departed)
		snprintf(why, cap, "%s left the communicator (loom_comm_destroy)", who);
	else if (st == PROC_DEAD)
		snprintf(why, cap, "%s died (killed, crashed or exited without loom_comm_destroy)", who);
	else
		snprintf(why, cap, "%s has left the job", who);
	return 1;
}

void loom__shm_abort(loom_comm_t *c, int code, const char *msg)
{
	int zero = 0;
	shm_hdr_t *h = S(c)->hdr;
	if (!h || !atomic_compare_exchange_strong(&h->abort_claim, &zero, 1))
		return; /* someone failed first; theirs is the message everyone reports */
	snprintf(h->abort_msg, sizeof h->abort_msg, "%s", msg);
	atomic_store(&h->abort_rank, S(c)->rank);
	atomic_store(&h->abort_code, code); /* publishes the message */
	loom__shm_ring_all(c);
}

/* ---- waiting -------------------------------------------------------------------------------- */

void loom__shm_waiter_init(shm_waiter_t *w, loom_comm_t *c, const loom_xp_ctx_t *ctx, int fatal)
{
	w->seq = ctx ? ctx->seq : 0;
	w->c = c;
	w->fatal = fatal;
	w->start = 0, w->next_lock = 0, w->n = 0;
	w->npeers = 0, w->dst = -1, w->src = -1, w->small = 0;
	w->what = NULL, w->waiting_on = NULL;
	w->op = ctx ? ctx->op : NULL, w->stalled = 0;
	w->deadline = loom__shm_deadline(c, ctx);
}

/* What the waiter waits for, in words (only built when a failure is reported). */
static const char *waiter_what(shm_waiter_t *w)
{
	if (w->what)
		return w->what;
	if (w->dst >= 0 && w->src >= 0 && w->dst != w->src)
		snprintf(w->whatbuf, sizeof w->whatbuf, "rank %d (receiving from it) and rank %d (sending to it)", w->src,
		         w->dst);
	else if (w->dst >= 0 && w->src >= 0)
		snprintf(w->whatbuf, sizeof w->whatbuf, "rank %d (exchanging messages with it)", w->src);
	else if (w->src >= 0)
		snprintf(w->whatbuf, sizeof w->whatbuf, "rank %d (receiving from it)", w->src);
	else
		snprintf(w->whatbuf, sizeof w->whatbuf, "rank %d (sending to it)", w->dst);
	return w->whatbuf;
}

static int waiter_fail(shm_waiter_t *w, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int waiter_fail(shm_waiter_t *w, int code, const char *fmt, ...)
{
	char detail[768];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(detail, sizeof detail, fmt, ap);
	va_end(ap);
	loom_comm_fail(w->c, code, "%s", detail);
	if (w->fatal)
		loom__shm_abort(w->c, code, loom_errmsg());
	return code;
}

/* Ranks behind the collective this thread is in, as "1, 3 (at #4, #4)"-style text. */
static void list_behind(loom_comm_t *c, uint64_t seq, char *out, size_t cap)
{
	size_t len = 0;
	out[0] = '\0';
	if (seq == 0)
		return;
	for (int r = 0; r < S(c)->size && len + 32 < cap; r++) {
		uint64_t s = atomic_load_explicit(&rank_rec(S(c)->hdr, r)->seq, memory_order_relaxed);
		if (s < seq)
			len += (size_t)snprintf(out + len, cap - len, "%s%d (at #%llu)", len ? ", " : "", r,
			                        (unsigned long long)s);
	}
}

/* The rank most likely holding this wait up: a rank behind in the collective sequence (the one
 * furthest behind), else the rank waited on (board: the first that has not arrived). -1: none. */
static int suspect_of(shm_waiter_t *w, void *arg)
{
	loom_comm_t *c = w->c;
	int best = -1;
	uint64_t best_seq = w->seq;
	for (int r = 0; w->seq && r < S(c)->size; r++) {
		uint64_t s = atomic_load_explicit(&rank_rec(S(c)->hdr, r)->seq, memory_order_relaxed);
		if (r != S(c)->rank && s < best_seq)
			best = r, best_seq = s;
	}
	if (best >= 0)
		return best;
	if (w->waiting_on) {
		for (int r = 0; r < S(c)->size; r++)
			if (r != S(c)->rank && w->waiting_on(arg, r))
				return r;
		return -1;
	}
	return w->src >= 0 ? w->src : w->dst;
}

/* Tell `loom run` whom this wait suspects (world ranks), with the detail. */
static void report_suspect(shm_waiter_t *w, void *arg, const char *why)
{
	int p = suspect_of(w, arg);
	if (p >= 0)
		loom_xp_report_suspect(S(w->c)->world_of[S(w->c)->rank], S(w->c)->world_of[p], why);
}

/* The ranks this wait is behind: the peers it waits on when the waiter knows them, else those that
 * have not reached its sequence number (list_behind). */
static void waiting_for(shm_waiter_t *w, void *arg, char *behind, size_t cap)
{
	loom_comm_t *c = w->c;
	list_behind(c, w->seq, behind, cap);
	if (w->waiting_on) {
		size_t len = 0;
		behind[0] = '\0';
		for (int r = 0; r < S(c)->size && len + 12 < cap; r++)
			if (r != S(c)->rank && w->waiting_on(arg, r))
				len += (size_t)snprintf(behind + len, cap - len, "%s%d", len ? ", " : "", r);
	}
}

/* LOOM_STALL_S: a collective wait that made no progress for that long says so once on stderr, naming
 * whom it waits for (the job may still recover: a slow rank, a debugger). */
static void stall_warning(shm_waiter_t *w, double now, void *arg)
{
	loom_comm_t *c = w->c;
	char behind[256], msg[900];
	double stall = loom_xp_stall_s();
	if (w->stalled || stall <= 0 || !w->fatal || w->start == 0 || now - w->start < stall)
		return;
	w->stalled = 1;
	waiting_for(w, arg, behind, sizeof behind);
	snprintf(msg, sizeof msg, "%s #%llu has not progressed for %.0f s (LOOM_STALL_S); waiting for %s%s%s",
	         w->op ? w->op : "collective", (unsigned long long)w->seq, now - w->start, waiter_what(w),
	         behind[0] ? "; ranks that have not arrived: " : "", behind);
	fprintf(stderr, "loom: warning: rank %d (pid %d): %s\n", S(c)->rank, (int)getpid(), msg);
	fflush(stderr);
	report_suspect(w, arg, msg);
}

static int slow_checks(shm_waiter_t *w, double now, ready_fn ready, void *arg)
{
	loom_comm_t *c = w->c;
	shm_hdr_t *h = S(c)->hdr;
	int code = atomic_load(&h->abort_code), do_lock = now >= w->next_lock;
	char why[256];
	if (code != 0) {
		if (ready(arg))
			return LOOM_OK;
		loom_comm_fail(c, code, "communicator aborted after a failure on another rank: %s", h->abort_msg);
		return code;
	}
	if (do_lock)
		w->next_lock = now + LOCK_CHECK_S;
	for (int i = 0; w->fatal && !w->what && i < w->npeers; i++) /* a channel wait: the peer's call (shm_enter.c) */
		if ((code = loom__shm_check_call(c, w->seq, w->peers[i])) != LOOM_OK)
			return code;
	for (int i = 0; w->npeers < 0 ? i < S(c)->size : i < w->npeers; i++) {
		int p = w->npeers < 0 ? i : w->peers[i];
		if (p == S(c)->rank || (w->waiting_on && !w->waiting_on(arg, p)) ||
		    !loom__shm_check_peer(c, p, do_lock, why, sizeof why))
			continue;
		if (ready(arg)) /* it finished its part before leaving */
			return LOOM_OK;
		return waiter_fail(w, LOOM_EPEERLOST, "%s; this rank was waiting for %s", why, waiter_what(w));
	}
	stall_warning(w, now, arg);
	if (now > w->deadline) {
		char behind[256];
		waiting_for(w, arg, behind, sizeof behind);
		if (ready(arg))
			return LOOM_OK;
		report_suspect(w, arg, "timed out (LOOM_TIMEOUT_S) waiting for it");
		if (behind[0])
			return waiter_fail(w, LOOM_ETIMEDOUT,
			                   "timed out after %.3g s (LOOM_TIMEOUT_S) waiting for %s; ranks that had not arrived: %s",
			                   S(c)->timeout_s, waiter_what(w), behind);
		return waiter_fail(w, LOOM_ETIMEDOUT, "timed out after %.3g s (LOOM_TIMEOUT_S) waiting for %s",
		                   S(c)->timeout_s, waiter_what(w));
	}
	return LOOM_OK;
}

/* 1 when some awaited rank sleeps (then yielding to it is pointless). */
static int peers_sleep(const shm_waiter_t *w)
{
	for (int i = 0; i < w->npeers; i++)
		if (atomic_load_explicit(&bell_rec(w->c, w->peers[i])->sleepers, memory_order_relaxed))
			return 1;
	return 0;
}

int loom__shm_waiter_idle(shm_waiter_t *w, ready_fn ready, void *arg)
{
	loom_comm_t *c = w->c;
	double now;
	if (loom_xp_should_yield()) {
		/* On the progress engine with other lanes busy: never block the thread, hand it back. */
		now = loom_now();
		if (w->start == 0) {
			w->start = now, w->spin_end = now, w->yield_end = now, w->coloc = 0, w->n = 0;
			w->next_slow = now + SLOW_CHECK_S;
			if (w->next_lock == 0)
				w->next_lock = now + LOCK_CHECK_S;
		}
		if (now >= w->next_slow) {
			int rc;
			w->next_slow = now + SLOW_CHECK_S;
			if ((rc = slow_checks(w, now, ready, arg)) != LOOM_OK)
				return rc;
		}
		loom_xp_yield(ready, arg);
		return LOOM_OK;
	}
	if (w->start == 0) {
		int cpu = sched_getcpu(), spin_us = w->small ? S(c)->spin_small_us : S(c)->spin_us;
		now = loom_now();
		w->start = now;
		atomic_store_explicit(&rank_rec(S(c)->hdr, S(c)->rank)->cpu, cpu, memory_order_relaxed);
		/* An awaited rank last seen on this core cannot run while we spin here: hand it the core. */
		w->coloc = 0;
		for (int i = 0; i < w->npeers; i++)
			if (atomic_load_explicit(&rank_rec(S(c)->hdr, w->peers[i])->cpu, memory_order_relaxed) == cpu)
				w->coloc = 1;
		if (w->coloc)
			spin_us = 0;
		w->spin_end = now + spin_us * 1e-6;
		/* Small messages: yield to it (measured: 8 B-4 KiB all-reduce latency halved on a busy
		 * machine); large ones: sleep (yielding measured no better there). */
		w->yield_end = w->coloc && w->small ? now + 200e-6 : now;
		w->next_slow = now + SLOW_CHECK_S;
		if (w->next_lock == 0)
			w->next_lock = now + LOCK_CHECK_S;
		w->n = 0;
	}
	w->n++;
	if ((w->n & 31) != 0 && w->n < 100000) {
		cpu_relax();
		return LOOM_OK;
	}
	now = loom_now();
	if (now < w->spin_end) {
		cpu_relax();
	} else if (now < w->yield_end && !peers_sleep(w)) {
		sched_yield(); /* the peer is runnable on our core: let it run, without a futex round trip */
	} else {
		shm_rank_t *me = bell_rec(c, S(c)->rank);
		unsigned bell;
		atomic_fetch_add(&me->sleepers, 1);
		bell = atomic_load(&me->doorbell);
		if (!ready(arg) && atomic_load(&S(c)->hdr->abort_code) == 0 && !loom_xp_should_yield()) {
			double left = LOOM_MIN(SLEEP_SLICE_S, w->deadline - now + 1e-3);
			left = LOOM_MIN(left, LOOM_MAX(w->next_lock - now, 1e-3));
			futex_wait(&me->doorbell, bell, left);
		}
		atomic_fetch_sub(&me->sleepers, 1);
		now = loom_now();
		w->next_slow = 0;
	}
	if (now >= w->next_slow) {
		w->next_slow = now + SLOW_CHECK_S;
		return slow_checks(w, now, ready, arg);
	}
	return LOOM_OK;
}

void loom__shm_idle_wait(loom_comm_t *c, int (*cond)(void *), void *arg, double max_s)
{
	shm_rank_t *me = bell_rec(c, S(c)->rank);
	unsigned bell;
	atomic_fetch_add(&me->sleepers, 1);
	bell = atomic_load(&me->doorbell);
	if (!cond(arg))
		futex_wait(&me->doorbell, bell, max_s);
	atomic_fetch_sub(&me->sleepers, 1);
}

void loom__shm_wake_self(loom_comm_t *c)
{
	if (S(c)->hdr)
		shm_ring(c, S(c)->rank);
}

/* ---- header board ----------------------------------------------------------------------------- */

typedef struct {
	loom_comm_t *c;
	uint64_t k;
	int s;
} board_t;

static int board_waiting_on(void *arg, int r)
{
	board_t *b = arg;
	return atomic_load_explicit(&rank_rec(S(b->c)->hdr, r)->board_seq[b->s], memory_order_acquire) != b->k;
}

static int board_ready(void *arg)
{
	board_t *b = arg;
	for (int r = 0; r < S(b->c)->size; r++)
		if (atomic_load_explicit(&rank_rec(S(b->c)->hdr, r)->board_seq[b->s], memory_order_acquire) != b->k)
			return 0;
	return 1;
}

int loom__shm_board_exchange(loom_comm_t *c, const loom_xp_ctx_t *ctx, const void *mine, size_t len, void *all)
{
	board_t b = {c, ++S(c)->board_count, 0};
	shm_rank_t *me = rank_rec(S(c)->hdr, S(c)->rank);
	shm_waiter_t w;
	int rc;
	b.s = (int)(b.k & 1);
	/* Rank r can only reuse buffer s for exchange k+2 after everyone published k+1, i.e. after
	 * everyone finished reading exchange k: two buffers are enough. */
	memcpy(me->board[b.s], mine, LOOM_MIN(len, (size_t)SHM_BOARD_BYTES));
	atomic_store_explicit(&me->board_seq[b.s], b.k, memory_order_release);
	loom__shm_ring_all(c);
	loom__shm_waiter_init(&w, c, ctx, 1);
	w.npeers = -1;
	w.small = 1;
	w.waiting_on = board_waiting_on;
	w.what = "every rank to arrive";
	while (!board_ready(&b))
		if ((rc = loom__shm_waiter_idle(&w, board_ready, &b)) != LOOM_OK)
			return rc;
	for (int r = 0; r < S(c)->size; r++)
		memcpy((char *)all + (size_t)r * len, rank_rec(S(c)->hdr, r)->board[b.s], len);
	return LOOM_OK;
}

