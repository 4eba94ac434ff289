/* shm.c: the shared-memory transport: segments, channels, waiting, liveness and the header board.
 *
 * Channels. Each ordered pair of ranks has one FIFO per kind (collective, point-to-point) of
 * `nslots` slots (comm_internal.h). A message is one or more chunks; every chunk's slot header
 * repeats the message size (and tag, and collective sequence number), so the receiver checks them
 * before touching any byte and a mismatch is an error on both sides, never an overrun. Ordinary
 * buffers are copied into slots by the sender and out of them (or reduced) by the receiver, chunk by
 * chunk, so large messages pipeline; the sender returns once every chunk is posted (eager). A send
 * buffer inside the shared heap travels as one INPLACE slot naming its world-segment offset: the
 * receiver reads or reduces straight from the sender's memory, and the sender returns after the
 * receiver acknowledges (tail passes the slot), because only then may the buffer change.
 *
 * Waiting. A waiter spins briefly, then yields, then sleeps on its own doorbell word with futex
 * (50 ms slices). Anyone who makes progress possible for rank r bumps r's doorbell and calls
 * futex_wake only when r announced it sleeps (sleepers != 0); a full fence on both sides (Dekker)
 * rules out lost wakeups, and the 50 ms slices bound the cost of any that remained.
 *
 * Liveness. While a rank waits it periodically checks the ranks it waits on: a departure flag
 * (loom_comm_destroy), the process state in the world segment, and every 100 ms a trylock of the
 * peer's robust liveness mutex, whose EOWNERDEAD means the process died. A lost peer, a timeout or
 * a message mismatch on the collective channels is recorded in the segment (abort), so every rank of
 * the communicator fails fast with the first failure's message instead of waiting for its deadline.
 *
 * Invariants: head - tail <= nslots on every channel; only the sender writes head and slot headers,
 * only the receiver writes tail and err; a rank's record is written only by that rank, except
 * doorbell (anyone), proc = PROC_DEAD (the first rank that sees EOWNERDEAD) and board data. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm_internal.h"
#include "core/util.h"

#define INPLACE_MIN (32u << 10)   /* smaller heap sends are copied: an ack round trip costs more */
#define INPLACE_PIECE (256u << 10) /* receiver processes in-place data in pieces, between sends */
#define LOCK_CHECK_S 0.1           /* trylock a waited-on peer's liveness mutex this often */
#define SLOW_CHECK_S 0.001         /* abort flag, departures and deadline, while spinning */
#define SLEEP_SLICE_S 0.05

static size_t inplace_min(void)
{
	static size_t v;
	if (!v) {
		long e = loom_env_long("LOOM_SHM_INPLACE_MIN", 0, NULL);
		v = e > 0 ? (size_t)e : INPLACE_MIN;
	}
	return v;
}

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

static void futex_wait(atomic_uint *addr, unsigned val, double seconds)
{
	struct timespec ts;
	if (seconds <= 0)
		return;
	ts.tv_sec = (time_t)seconds;
	ts.tv_nsec = (long)((seconds - (double)ts.tv_sec) * 1e9);
	syscall(SYS_futex, (unsigned *)addr, FUTEX_WAIT, val, &ts, NULL, 0);
}

static void futex_wake(atomic_uint *addr)
{
	syscall(SYS_futex, (unsigned *)addr, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Wake rank r of c if it sleeps (after this thread's stores that make progress possible). */
static inline void ring(loom_comm_t *c, int r)
{
	shm_rank_t *x = rank_rec(c->hdr, r);
	atomic_thread_fence(memory_order_seq_cst);
	if (atomic_load_explicit(&x->sleepers, memory_order_relaxed)) {
		atomic_fetch_add(&x->doorbell, 1);
		futex_wake(&x->doorbell);
	}
}

static void ring_all(loom_comm_t *c)
{
	for (int r = 0; r < c->size; r++)
		if (r != c->rank)
			ring(c, r);
}

/* ---- layout and segments -------------------------------------------------------------------- */

void shm_layout(shm_hdr_t *h, int n, size_t heap_bytes)
{
	long kb = loom_env_long("LOOM_SHM_SLOT_KB", 0, NULL), ns = loom_env_long("LOOM_SHM_SLOTS", 0, NULL);
	memset(h, 0, sizeof *h);
	h->magic = SHM_MAGIC;
	h->version = SHM_VERSION;
	h->nranks = (uint32_t)n;
	h->nslots = ns >= 2 && ns <= SHM_MAX_SLOTS && (ns & (ns - 1)) == 0 ? (uint32_t)ns : 8;
	h->slot_bytes = n <= 8 ? 128u << 10 : n <= 32 ? 32u << 10 : 8u << 10;
	if (kb >= 4 && kb <= 4096)
		h->slot_bytes = (uint32_t)align_up((size_t)kb << 10, 4096);
	h->rank_off = align_up(sizeof(shm_hdr_t), 4096);
	h->chan_off = align_up(h->rank_off + (size_t)n * sizeof(shm_rank_t), 4096);
	h->chan_stride = align_up(SHM_CHAN_DATA_OFF + (size_t)h->nslots * h->slot_bytes, 4096);
	h->heap_off = align_up(h->chan_off + (size_t)CHAN_KINDS * n * n * h->chan_stride, 2u << 20);
	h->heap_bytes = align_up(heap_bytes, 2u << 20);
	h->total_bytes = h->heap_off + (size_t)n * h->heap_bytes;
}

static int init_rank_mutexes(shm_hdr_t *h)
{
	pthread_mutexattr_t a;
	int rc = 0;
	if (pthread_mutexattr_init(&a))
		return -1;
	rc |= pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
	rc |= pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
	for (uint32_t r = 0; r < h->nranks && !rc; r++)
		rc |= pthread_mutex_init(&rank_rec(h, (int)r)->alive, &a);
	pthread_mutexattr_destroy(&a);
	return rc ? -1 : 0;
}

static double op_deadline(loom_comm_t *c)
{
	if (loom_cur.c == c && loom_cur.deadline > 0)
		return loom_cur.deadline;
	return loom_now() + c->timeout_s;
}

static void nap(double seconds)
{
	struct timespec ts = {0, (long)(seconds * 1e9)};
	nanosleep(&ts, NULL);
}

static int check_peer(loom_comm_t *c, int p, int do_lock, char *why, size_t cap);

int shm_open_segment(loom_comm_t *c, const char *name, int create, size_t heap_bytes, int *fd_out)
{
	double deadline = op_deadline(c), wait = 1e-4;
	int fd = -1, rc = LOOM_OK, world = 0;
	struct stat st;
	char *base = MAP_FAILED;
	size_t bytes = 0;
	shm_hdr_t *h;
	if (create) {
		shm_hdr_t tmp;
		shm_layout(&tmp, c->size, heap_bytes);
		fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
		if (fd < 0 && errno == EEXIST)
			return loom_comm_fail(c, LOOM_ESTATE,
			                      "shared-memory segment %s already exists (left by an earlier job with the same "
			                      "LOOM_JOB_ID? remove /dev/shm%s or use another LOOM_JOB_ID)",
			                      name, name);
		if (fd < 0)
			return loom_comm_fail(c, LOOM_ESYS, "shm_open(%s): %s", name, strerror(errno));
		bytes = tmp.total_bytes;
		if (ftruncate(fd, (off_t)bytes) != 0) {
			rc = loom_comm_fail(c, LOOM_ESYS, "ftruncate(%s, %zu): %s", name, bytes, strerror(errno));
			goto fail;
		}
		base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
		if (base == MAP_FAILED) {
			rc = loom_comm_fail(c, LOOM_ESYS, "mmap(%s, %zu bytes): %s", name, bytes, strerror(errno));
			goto fail;
		}
		h = (shm_hdr_t *)base;
		memcpy(h, &tmp, sizeof tmp);
		if (heap_bytes && init_rank_mutexes(h) != 0) {
			rc = loom_comm_fail(c, LOOM_ESYS, "%s: cannot initialize robust process-shared mutexes", name);
			goto fail;
		}
		atomic_store_explicit(&h->ready, SHM_READY, memory_order_release);
	} else {
		for (;;) {
			if (fd < 0)
				fd = shm_open(name, O_RDWR, 0600);
			if (fd < 0 && errno != ENOENT)
				return loom_comm_fail(c, LOOM_ESYS, "shm_open(%s): %s", name, strerror(errno));
			if (fd >= 0 && fstat(fd, &st) == 0 && (size_t)st.st_size >= sizeof(shm_hdr_t))
				break;
			if (loom_now() > deadline) {
				rc = loom_comm_fail(c, LOOM_ETIMEDOUT,
				                    "timed out after %.3g s (LOOM_TIMEOUT_S) waiting for rank 0 to create %s",
				                    c->timeout_s, name);
				goto fail;
			}
			nap(wait);
			wait = LOOM_MIN(wait * 2, 0.01);
		}
		bytes = (size_t)st.st_size;
		base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
		if (base == MAP_FAILED) {
			rc = loom_comm_fail(c, LOOM_ESYS, "mmap(%s, %zu bytes): %s", name, bytes, strerror(errno));
			goto fail;
		}
		h = (shm_hdr_t *)base;
		while (atomic_load_explicit(&h->ready, memory_order_acquire) != SHM_READY) {
			if (loom_now() > deadline) {
				rc = loom_comm_fail(c, LOOM_ETIMEDOUT, "timed out waiting for %s to be initialized", name);
				goto fail;
			}
			nap(1e-4);
		}
		if (h->magic != SHM_MAGIC || h->version != SHM_VERSION || h->nranks != (uint32_t)c->size ||
		    h->total_bytes != bytes) {
			rc = loom_comm_fail(c, LOOM_EFORMAT,
			                    "%s is not a loom segment for %d ranks (magic %llx version %u, %u ranks, %llu bytes)",
			                    name, c->size, (unsigned long long)h->magic, h->version, h->nranks,
			                    (unsigned long long)h->total_bytes);
			goto fail;
		}
	}
	c->hdr = h;
	c->base = base;
	c->bytes = bytes;
	if (!c->job->hdr) { /* the world segment: it carries the job's heap and liveness mutexes */
		world = 1;
		c->job->hdr = h, c->job->base = base, c->job->bytes = bytes;
		if ((rc = shm_proc_start(c->job)) != LOOM_OK) {
			rc = loom_comm_fail(c, rc, "%s", loom_errmsg());
			goto fail_mapped;
		}
	}
	{
		shm_rank_t *me = rank_rec(h, c->rank);
		me->pid = (int)getpid();
		atomic_store(&me->state, RANK_JOINED);
		atomic_fetch_add(&h->attached, 1);
		ring_all(c);
	}
	/* Wait for everyone, so the name can go: from then on nothing is left behind, even after kill -9. */
	{
		double next_lock = loom_now() + LOCK_CHECK_S;
		wait = 1e-5;
		while (atomic_load(&h->attached) < h->nranks) {
			double now = loom_now();
			char why[256];
			if (now > deadline) {
				char missing[256] = "";
				size_t len = 0;
				for (int r = 0; r < c->size && len + 12 < sizeof missing; r++)
					if (atomic_load(&rank_rec(h, r)->state) == RANK_ABSENT)
						len += (size_t)snprintf(missing + len, sizeof missing - len, "%s%d", len ? ", " : "", r);
				rc = loom_comm_fail(c, LOOM_ETIMEDOUT,
				                    "timed out after %.3g s (LOOM_TIMEOUT_S) waiting for ranks to join %s; missing: %s",
				                    c->timeout_s, name, missing);
				goto fail_mapped;
			}
			for (int r = 0; r < c->size; r++) {
				if (r == c->rank || atomic_load(&rank_rec(h, r)->state) == RANK_ABSENT)
					continue;
				if (check_peer(c, r, now >= next_lock, why, sizeof why)) {
					rc = loom_comm_fail(c, LOOM_EPEERLOST, "while joining %s: %s", name, why);
					goto fail_mapped;
				}
			}
			if (now >= next_lock)
				next_lock = now + LOCK_CHECK_S;
			nap(wait);
			wait = LOOM_MIN(wait * 2, 2e-3);
		}
	}
	shm_unlink(name); /* every rank tries; all but the first get ENOENT */
	if (fd_out)
		*fd_out = fd;
	else
		close(fd);
	return LOOM_OK;
fail_mapped:
	if (world) {
		shm_proc_end(c->job);
		c->job->hdr = NULL, c->job->base = NULL, c->job->bytes = 0;
	}
	c->hdr = NULL, c->base = NULL, c->bytes = 0;
fail:
	if (base != MAP_FAILED)
		munmap(base, bytes);
	if (fd >= 0)
		close(fd);
	shm_unlink(name); /* a failed join must not leave the name behind */
	return rc;
}

void shm_close_segment(loom_comm_t *c)
{
	if (c->base)
		munmap(c->base, c->bytes);
	c->base = NULL, c->hdr = NULL, c->bytes = 0;
}

void shm_depart(loom_comm_t *c)
{
	if (!c->hdr)
		return;
	atomic_store(&rank_rec(c->hdr, c->rank)->state, RANK_DEPARTED);
	ring_all(c);
}

/* The keeper thread locks the rank's robust liveness mutex and holds it until shm_proc_end. A
 * dedicated thread (rather than the caller of loom_comm_init) because a robust mutex is owned by a
 * thread: the application's threads may come and go, the keeper ends only with the process (then
 * peers get EOWNERDEAD) or when the job is left cleanly. */
static void *keeper_main(void *arg)
{
	loom_job_t *j = arg;
	shm_rank_t *me = rank_rec(j->hdr, j->world_rank);
	int e = pthread_mutex_lock(&me->alive);
	if (e == EOWNERDEAD) /* a previous holder of this slot died: impossible in a fresh segment */
		e = pthread_mutex_consistent(&me->alive);
	if (e == 0)
		atomic_store(&me->proc, PROC_ALIVE);
	pthread_mutex_lock(&j->keeper_lock);
	j->keeper_state = e ? -e : 1;
	pthread_cond_broadcast(&j->keeper_cond);
	while (!e && j->keeper_state != 2)
		pthread_cond_wait(&j->keeper_cond, &j->keeper_lock);
	pthread_mutex_unlock(&j->keeper_lock);
	if (!e) {
		atomic_store(&me->proc, PROC_EXITED);
		pthread_mutex_unlock(&me->alive);
	}
	return NULL;
}

int shm_proc_start(loom_job_t *j)
{
	int e;
	pthread_mutex_init(&j->keeper_lock, NULL);
	pthread_cond_init(&j->keeper_cond, NULL);
	j->keeper_state = 0;
	if ((e = pthread_create(&j->keeper, NULL, keeper_main, j)) != 0)
		j->keeper_state = -e;
	else {
		pthread_mutex_lock(&j->keeper_lock);
		while (j->keeper_state == 0)
			pthread_cond_wait(&j->keeper_cond, &j->keeper_lock);
		pthread_mutex_unlock(&j->keeper_lock);
		if (j->keeper_state < 0)
			pthread_join(j->keeper, NULL);
	}
	if (j->keeper_state < 0) {
		e = -j->keeper_state;
		pthread_cond_destroy(&j->keeper_cond);
		pthread_mutex_destroy(&j->keeper_lock);
		return loom_seterr(LOOM_ESYS, "rank %d: cannot hold its liveness mutex: %s", j->world_rank, strerror(e));
	}
	return LOOM_OK;
}

void shm_proc_end(loom_job_t *j)
{
	if (j->keeper_state != 1)
		return;
	pthread_mutex_lock(&j->keeper_lock);
	j->keeper_state = 2;
	pthread_cond_broadcast(&j->keeper_cond);
	pthread_mutex_unlock(&j->keeper_lock);
	pthread_join(j->keeper, NULL);
	pthread_cond_destroy(&j->keeper_cond);
	pthread_mutex_destroy(&j->keeper_lock);
	j->keeper_state = 0;
}

/* ---- liveness and failure ---------------------------------------------------------------- */

/* 0 when rank p of c is (as far as we can tell) alive and a member; else 1 with the reason in why. */
static int check_peer(loom_comm_t *c, int p, int do_lock, char *why, size_t cap)
{
	shm_rank_t *r = rank_rec(c->hdr, p);
	int w = c->world_of[p], st;
	shm_rank_t *wr = rank_rec(c->job->hdr ? c->job->hdr : c->hdr, w);
	char who[48];
	if (w != p)
		snprintf(who, sizeof who, "rank %d (world rank %d, pid %d)", p, w, wr->pid);
	else
		snprintf(who, sizeof who, "rank %d (pid %d)", p, wr->pid);
	if (atomic_load(&r->state) == RANK_DEPARTED) {
		snprintf(why, cap, "%s left the communicator (loom_comm_destroy)", who);
		return 1;
	}
	st = atomic_load(&wr->proc);
	if (st == PROC_ALIVE && do_lock) {
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
	if (st == PROC_DEAD) {
		snprintf(why, cap, "%s died (killed, crashed or exited without loom_comm_destroy)", who);
		return 1;
	}
	if (st == PROC_EXITED) {
		snprintf(why, cap, "%s has left the job", who);
		return 1;
	}
	return 0;
}

void shm_abort(loom_comm_t *c, int code, const char *msg)
{
	int zero = 0;
	shm_hdr_t *h = c->hdr;
	if (!h || atomic_load(&h->abort_code) != 0)
		return;
	/* The message is written before the code is published; a concurrent second writer loses the CAS
	 * below but may have scribbled the text, which is harmless (both describe real failures). */
	snprintf(h->abort_msg, sizeof h->abort_msg, "%s", msg);
	atomic_store(&h->abort_rank, c->rank);
	if (atomic_compare_exchange_strong(&h->abort_code, &zero, code))
		ring_all(c);
}

void shm_publish_seq(loom_comm_t *c, uint64_t seq, int coll)
{
	shm_rank_t *me = rank_rec(c->hdr, c->rank);
	atomic_store_explicit(&me->seq, seq, memory_order_relaxed);
	atomic_store_explicit(&me->coll, coll, memory_order_relaxed);
}

/* ---- waiting -------------------------------------------------------------------------------- */

typedef int (*ready_fn)(void *arg);

typedef struct {
	loom_comm_t *c;
	double start, deadline, spin_end, yield_end, next_slow, next_lock;
	unsigned n;
	int fatal;    /* a failure aborts the communicator (collective channels, board) */
	int peers[2]; /* ranks waited on; npeers < 0: every other rank */
	int npeers;
	int dst, src; /* of a transfer, for messages */
	const char *what; /* "every rank to arrive": what a board wait waits for; NULL: see peers */
	char whatbuf[96];
	int (*waiting_on)(void *arg, int r); /* with npeers < 0: is rank r still awaited? */
} waiter_t;

static void waiter_init(waiter_t *w, loom_comm_t *c, int fatal)
{
	w->c = c;
	w->fatal = fatal;
	w->start = 0, w->next_lock = 0, w->n = 0;
	w->npeers = 0, w->dst = -1, w->src = -1;
	w->what = NULL, w->waiting_on = NULL;
	w->deadline = op_deadline(c);
}

static void waiter_reset(waiter_t *w)
{
	w->start = 0;
}

/* What the waiter waits for, in words (only built when a failure is reported). */
static const char *waiter_what(waiter_t *w)
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

static int waiter_fail(waiter_t *w, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int waiter_fail(waiter_t *w, int code, const char *fmt, ...)
{
	char detail[768];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(detail, sizeof detail, fmt, ap);
	va_end(ap);
	loom_comm_fail(w->c, code, "%s", detail);
	if (w->fatal)
		shm_abort(w->c, code, loom_errmsg());
	return code;
}

/* Ranks behind the collective this thread is in, as "1, 3 (at #4, #4)"-style text. */
static void list_behind(loom_comm_t *c, char *out, size_t cap)
{
	size_t len = 0;
	out[0] = '\0';
	if (loom_cur.c != c || loom_cur.seq == 0)
		return;
	for (int r = 0; r < c->size && len + 32 < cap; r++) {
		uint64_t s = atomic_load_explicit(&rank_rec(c->hdr, r)->seq, memory_order_relaxed);
		if (s < loom_cur.seq)
			len += (size_t)snprintf(out + len, cap - len, "%s%d (at #%llu)", len ? ", " : "", r,
			                        (unsigned long long)s);
	}
}

static int slow_checks(waiter_t *w, double now, ready_fn ready, void *arg)
{
	loom_comm_t *c = w->c;
	shm_hdr_t *h = c->hdr;
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
	for (int i = 0; w->npeers < 0 ? i < c->size : i < w->npeers; i++) {
		int p = w->npeers < 0 ? i : w->peers[i];
		if (p == c->rank || (w->waiting_on && !w->waiting_on(arg, p)) || !check_peer(c, p, do_lock, why, sizeof why))
			continue;
		if (ready(arg)) /* it finished its part before leaving */
			return LOOM_OK;
		return waiter_fail(w, LOOM_EPEERLOST, "%s; this rank was waiting for %s", why, waiter_what(w));
	}
	if (now > w->deadline) {
		char behind[256];
		list_behind(c, behind, sizeof behind);
		if (w->waiting_on) {
			size_t len = 0;
			behind[0] = '\0';
			for (int r = 0; r < c->size && len + 12 < sizeof behind; r++)
				if (r != c->rank && w->waiting_on(arg, r))
					len += (size_t)snprintf(behind + len, sizeof behind - len, "%s%d", len ? ", " : "", r);
		}
		if (ready(arg))
			return LOOM_OK;
		if (behind[0])
			return waiter_fail(w, LOOM_ETIMEDOUT,
			                   "timed out after %.3g s (LOOM_TIMEOUT_S) waiting for %s; ranks that had not arrived: %s",
			                   c->timeout_s, waiter_what(w), behind);
		return waiter_fail(w, LOOM_ETIMEDOUT, "timed out after %.3g s (LOOM_TIMEOUT_S) waiting for %s",
		                   c->timeout_s, waiter_what(w));
	}
	return LOOM_OK;
}

/* Called when no progress was possible: spin, yield or sleep a little, then check failures.
 * Returns LOOM_OK to try again, or an error already recorded. */
static int waiter_idle(waiter_t *w, ready_fn ready, void *arg)
{
	loom_comm_t *c = w->c;
	double now;
	if (w->start == 0) {
		now = loom_now();
		w->start = now;
		w->spin_end = now + c->spin_us * 1e-6;
		w->yield_end = now + c->yield_us * 1e-6;
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
	} else if (now < w->yield_end) {
		sched_yield();
	} else {
		shm_rank_t *me = rank_rec(c->hdr, c->rank);
		unsigned bell;
		atomic_fetch_add(&me->sleepers, 1);
		atomic_thread_fence(memory_order_seq_cst);
		bell = atomic_load(&me->doorbell);
		if (!ready(arg) && atomic_load(&c->hdr->abort_code) == 0) {
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

/* ---- channels --------------------------------------------------------------------------------- */

typedef struct {
	loom_comm_t *c;
	int kind;
	/* send side */
	shm_chan_t *sch;
	const char *sbuf;
	size_t sbytes, spos;
	int stag, sinplace, sposted, sdone;
	unsigned shead; /* our next head value */
	/* receive side */
	shm_chan_t *rch;
	char *rbuf;
	const char *red;
	size_t rbytes, rpos, esize;
	int rtag, rdone, rstarted;
	loom_dtype_t dt;
	loom_op_t op;
	uint64_t seq;
	int dst, src;
} xfer_t;

static int xfer_ready(void *arg)
{
	xfer_t *x = arg;
	if (!x->sdone) {
		unsigned tail = atomic_load_explicit(&x->sch->tail, memory_order_acquire);
		if (atomic_load_explicit(&x->sch->err, memory_order_relaxed))
			return 1;
		if (x->sposted ? tail == x->shead : x->shead - tail < x->c->hdr->nslots)
			return 1;
	}
	if (!x->rdone) {
		unsigned tail = atomic_load_explicit(&x->rch->tail, memory_order_relaxed);
		if (atomic_load_explicit(&x->rch->slot[tail % x->c->hdr->nslots].ready, memory_order_acquire) == tail + 1)
			return 1;
	}
	return 0;
}

static int send_rejected(xfer_t *x)
{
	shm_chan_t *ch = x->sch;
	if (ch->err_tag_sent != ch->err_tag_expected)
		return loom_comm_fail(x->c, LOOM_EMISMATCH,
		                      "rank %d rejected this rank's message: sent %llu bytes with tag %d, it expected %llu "
		                      "bytes with tag %d",
		                      x->dst, (unsigned long long)ch->err_sent, ch->err_tag_sent,
		                      (unsigned long long)ch->err_expected, ch->err_tag_expected);
	return loom_comm_fail(x->c, LOOM_EMISMATCH,
	                      "rank %d rejected this rank's message: sent %llu bytes, it expected %llu bytes", x->dst,
	                      (unsigned long long)ch->err_sent, (unsigned long long)ch->err_expected);
}

/* Post as many chunks as free slots allow. Returns >0 on progress, 0 if none, <0 on error. */
static int send_step(xfer_t *x)
{
	shm_hdr_t *h = x->c->hdr;
	shm_chan_t *ch = x->sch;
	int progress = 0;
	if (atomic_load_explicit(&ch->err, memory_order_acquire))
		return send_rejected(x);
	if (x->sposted) { /* in place: wait for the receiver's ack */
		if (atomic_load_explicit(&ch->tail, memory_order_acquire) == x->shead) {
			x->sdone = 1;
			return 1;
		}
		return 0;
	}
	for (;;) {
		unsigned tail = atomic_load_explicit(&ch->tail, memory_order_acquire), i;
		shm_slot_t *s;
		size_t n;
		if (x->shead - tail >= h->nslots)
			break;
		i = x->shead % h->nslots;
		s = &ch->slot[i];
		s->total = x->sbytes;
		s->seq = x->seq;
		s->tag = x->stag;
		if (x->sinplace) {
			s->bytes = x->sbytes;
			s->off = (uint64_t)(x->sbuf - x->c->job->base);
			s->flags = SLOT_INPLACE;
			n = x->sbytes;
		} else {
			n = LOOM_MIN(x->sbytes - x->spos, (size_t)h->slot_bytes);
			s->bytes = n;
			s->off = x->spos;
			s->flags = 0;
			if (n)
				memcpy(slot_data(h, ch, i), x->sbuf + x->spos, n);
		}
		x->spos += n;
		x->shead++;
		atomic_store_explicit(&ch->head, x->shead, memory_order_relaxed);
		atomic_store_explicit(&s->ready, x->shead, memory_order_release);
		progress = 1;
		if (x->spos >= x->sbytes) {
			x->sposted = 1;
			if (!x->sinplace)
				x->sdone = 1;
			break;
		}
	}
	if (progress)
		ring(x->c, x->dst);
	return progress;
}

static int recv_reject(xfer_t *x, const shm_slot_t *s)
{
	shm_chan_t *ch = x->rch;
	ch->err_sent = s->total;
	ch->err_expected = x->rbytes;
	ch->err_tag_sent = s->tag;
	ch->err_tag_expected = x->kind == CHAN_P2P ? x->rtag : s->tag;
	atomic_store_explicit(&ch->err, 1, memory_order_release);
	ring(x->c, x->src);
	if (x->kind == CHAN_P2P && s->tag != x->rtag)
		return loom_comm_fail(x->c, LOOM_EMISMATCH,
		                      "message from rank %d has tag %d and %llu bytes, expected tag %d and %zu bytes", x->src,
		                      s->tag, (unsigned long long)s->total, x->rtag, x->rbytes);
	return loom_comm_fail(x->c, LOOM_EMISMATCH, "message from rank %d has %llu bytes, expected %zu bytes", x->src,
	                      (unsigned long long)s->total, x->rbytes);
}

static void deliver(xfer_t *x, const char *from, size_t bytes)
{
	if (!bytes)
		return;
	if (x->red)
		loom_reduce_local(x->rbuf + x->rpos, x->red + x->rpos, from, bytes / x->esize, x->dt, x->op);
	else
		memcpy(x->rbuf + x->rpos, from, bytes);
}

/* Consume available chunks. Returns >0 on progress, 0 if none, <0 on error. */
static int recv_step(xfer_t *x)
{
	shm_hdr_t *h = x->c->hdr;
	shm_chan_t *ch = x->rch;
	int progress = 0;
	if (atomic_load_explicit(&ch->err, memory_order_acquire))
		return loom_comm_fail(x->c, LOOM_EMISMATCH,
		                      "the channel from rank %d is unusable after an earlier mismatched message", x->src);
	while (!x->rdone) {
		unsigned tail = atomic_load_explicit(&ch->tail, memory_order_relaxed), i;
		shm_slot_t *s;
		i = tail % h->nslots;
		s = &ch->slot[i];
		if (atomic_load_explicit(&s->ready, memory_order_acquire) != tail + 1)
			break;
		if (!x->rstarted) {
			if (s->total != x->rbytes || (x->kind == CHAN_P2P && s->tag != x->rtag))
				return recv_reject(x, s);
			if (x->kind == CHAN_COLL && s->seq != x->seq) {
				loom_comm_fail(x->c, LOOM_EMISMATCH,
				               "message from rank %d belongs to collective #%llu, this rank is in #%llu "
				               "(ranks called collectives in different orders)",
				               x->src, (unsigned long long)s->seq, (unsigned long long)x->seq);
				shm_abort(x->c, LOOM_EMISMATCH, loom_errmsg());
				return LOOM_EMISMATCH;
			}
			x->rstarted = 1;
		}
		if (s->flags & SLOT_INPLACE) {
			size_t n = LOOM_MIN(x->rbytes - x->rpos, (size_t)INPLACE_PIECE);
			const char *from = x->c->job->base + s->off + x->rpos;
			deliver(x, from, n);
			x->rpos += n;
			progress = 1;
			if (x->rpos < x->rbytes)
				return progress; /* let the send side run between pieces */
		} else {
			deliver(x, slot_data(h, ch, i), s->bytes);
			x->rpos += s->bytes;
		}
		atomic_store_explicit(&ch->tail, tail + 1, memory_order_release);
		ring(x->c, x->src);
		progress = 1;
		if (x->rpos >= x->rbytes)
			x->rdone = 1;
	}
	return progress;
}

static int local_copy(loom_comm_t *c, const void *sbuf, size_t sbytes, void *rbuf, size_t rbytes,
                      const void *red_local, loom_dtype_t dt, loom_op_t op)
{
	if (sbytes != rbytes)
		return loom_comm_fail(c, LOOM_EMISMATCH, "message to itself has %zu bytes, expected %zu", sbytes, rbytes);
	if (!rbytes)
		return LOOM_OK;
	if (red_local)
		loom_reduce_local(rbuf, red_local, sbuf, rbytes / loom_dtype_size(dt), dt, op);
	else
		memmove(rbuf, sbuf, rbytes);
	return LOOM_OK;
}

int shm_sendrecv(loom_comm_t *c, int kind, int dst, const void *sbuf, size_t sbytes, int stag, int src, void *rbuf,
                 size_t rbytes, int rtag, const void *red_local, loom_dtype_t dt, loom_op_t op)
{
	xfer_t x;
	waiter_t w;
	int rc;
	if (dst >= c->size || src >= c->size)
		return loom_comm_fail(c, LOOM_EINVAL, "peer rank out of range (dst %d, src %d, size %d)", dst, src, c->size);
	if ((sbytes && !sbuf && dst >= 0) || (rbytes && !rbuf && src >= 0))
		return loom_comm_fail(c, LOOM_EINVAL, "NULL buffer for a message of %zu/%zu bytes", sbytes, rbytes);
	if (red_local && src >= 0 && (loom_dtype_size(dt) == 0 || rbytes % loom_dtype_size(dt) != 0))
		return loom_comm_fail(c, LOOM_EINVAL, "reducing receive of %zu bytes is not a whole number of %s", rbytes,
		                      loom_dtype_name(dt));
	if (dst == c->rank || src == c->rank) {
		if (dst == c->rank && src == c->rank)
			return local_copy(c, sbuf, sbytes, rbuf, rbytes, red_local, dt, op);
		return loom_comm_fail(c, LOOM_EINVAL, "a message to or from itself must be a sendrecv with itself "
		                                      "(dst %d, src %d, rank %d)",
		                      dst, src, c->rank);
	}
	if (atomic_load(&c->hdr->abort_code) != 0) {
		int code = atomic_load(&c->hdr->abort_code);
		return loom_comm_fail(c, code, "communicator aborted after an earlier failure: %s", c->hdr->abort_msg);
	}
	memset(&x, 0, sizeof x);
	x.c = c, x.kind = kind, x.dt = dt, x.op = op, x.dst = dst, x.src = src;
	x.seq = kind == CHAN_COLL && loom_cur.c == c ? loom_cur.seq : 0;
	x.sdone = dst < 0, x.rdone = src < 0;
	if (dst >= 0) {
		x.sch = chan_of(c->hdr, kind, c->rank, dst);
		x.sbuf = sbuf, x.sbytes = sbytes, x.stag = stag;
		x.shead = atomic_load_explicit(&x.sch->head, memory_order_relaxed);
		x.sinplace = sbytes >= inplace_min() && heap_contains(c->job, sbuf, sbytes);
	}
	if (src >= 0) {
		x.rch = chan_of(c->hdr, kind, src, c->rank);
		x.rbuf = rbuf, x.rbytes = rbytes, x.rtag = rtag, x.red = red_local;
		x.esize = red_local ? loom_dtype_size(dt) : 1;
	}
	waiter_init(&w, c, kind == CHAN_COLL);
	if (dst >= 0)
		w.peers[w.npeers++] = dst;
	if (src >= 0 && src != dst)
		w.peers[w.npeers++] = src;
	w.dst = dst, w.src = src;
	while (!x.sdone || !x.rdone) {
		int p = 0;
		if (!x.sdone && (rc = send_step(&x)) != 0) {
			if (rc < 0)
				goto fail;
			p = 1;
		}
		if (!x.rdone && (rc = recv_step(&x)) != 0) {
			if (rc < 0)
				goto fail;
			p = 1;
		}
		if (p) {
			waiter_reset(&w);
			continue;
		}
		if ((rc = waiter_idle(&w, xfer_ready, &x)) != LOOM_OK)
			return rc;
	}
	return LOOM_OK;
fail:
	if (kind == CHAN_COLL)
		shm_abort(c, rc, loom_errmsg());
	return rc;
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
	return atomic_load_explicit(&rank_rec(b->c->hdr, r)->board_seq[b->s], memory_order_acquire) != b->k;
}

static int board_ready(void *arg)
{
	board_t *b = arg;
	for (int r = 0; r < b->c->size; r++)
		if (atomic_load_explicit(&rank_rec(b->c->hdr, r)->board_seq[b->s], memory_order_acquire) != b->k)
			return 0;
	return 1;
}

int shm_board_exchange(loom_comm_t *c, const void *mine, size_t len, void *all)
{
	board_t b = {c, ++c->board_count, 0};
	shm_rank_t *me = rank_rec(c->hdr, c->rank);
	waiter_t w;
	int rc;
	b.s = (int)(b.k & 1);
	/* Rank r can only reuse buffer s for exchange k+2 after everyone published k+1, i.e. after
	 * everyone finished reading exchange k: two buffers are enough. */
	memcpy(me->board[b.s], mine, LOOM_MIN(len, (size_t)SHM_BOARD_BYTES));
	atomic_store_explicit(&me->board_seq[b.s], b.k, memory_order_release);
	ring_all(c);
	waiter_init(&w, c, 1);
	w.npeers = -1;
	w.waiting_on = board_waiting_on;
	w.what = "every rank to arrive";
	while (!board_ready(&b))
		if ((rc = waiter_idle(&w, board_ready, &b)) != LOOM_OK)
			return rc;
	for (int r = 0; r < c->size; r++)
		memcpy((char *)all + (size_t)r * len, rank_rec(c->hdr, r)->board[b.s], len);
	return LOOM_OK;
}
