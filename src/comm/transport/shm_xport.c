/* shm_xport.c: the shared-memory transport's table (loom__xport_shm): joining and leaving a
 * communicator, its per-communicator state, the job shared by all communicators of a world, and the
 * entries that forward to shm.c (messages), shm_wait.c (waits, aborts, board) and shm_heap.c.
 *
 * Ownership: each communicator's shm_comm_t is created by open and freed by close. The loom_job_t
 * (world mapping, heap, liveness keeper) is created by the world's open and shared by every
 * sub-communicator split from it; the last close releases it, whatever the order of destroys.
 * Invariant: job->refs counts the communicators whose state points at the job (under jobs_lock). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "comm/transport/shm_internal.h"
#include "core/util.h"

static pthread_mutex_t jobs_lock = PTHREAD_MUTEX_INITIALIZER;

static void job_release(loom_job_t *j)
{
	int last;
	pthread_mutex_lock(&jobs_lock);
	last = --j->refs == 0;
	pthread_mutex_unlock(&jobs_lock);
	if (!last)
		return;
	if (j->hdr) {
		loom__shm_heap_free_all(j);
		loom__shm_proc_end(j);
		munmap(j->base, j->bytes);
	}
	if (j->fd >= 0)
		close(j->fd);
	free(j);
}

/* Waiting: spin, then futex sleep. Spinning only pays when the awaited rank runs on another core
 * and answers soon. With more ranks than cores it only steals the time the awaited rank needs
 * (8 ranks on 2 cores: large all-reduces ran 2x faster sleeping at once). With fewer, small
 * messages spin up to 50 us (latency), while waits for large transfers sleep after 5 us: on a
 * busy machine two ranks often share a core, and long spins starve the peer (16 MiB all-reduce
 * 2x faster than with 50 us spins). LOOM_SPIN_US / LOOM_SPIN_SMALL_US override, for tuning. */
static void wait_policy(shm_comm_t *s)
{
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	if (ncpu > 0 && s->size > ncpu)
		s->spin_us = 0, s->spin_small_us = 0;
	else
		s->spin_us = 5, s->spin_small_us = 50;
	s->spin_us = (int)loom_env_long("LOOM_SPIN_US", s->spin_us, NULL);
	s->spin_small_us = (int)loom_env_long("LOOM_SPIN_SMALL_US", s->spin_small_us, NULL);
}

static int shm_open_comm(loom_comm_t *c, loom_comm_t *parent, const char *name, size_t heap_bytes,
                         const loom_xp_ctx_t *ctx)
{
	shm_comm_t *s = loom__calloc(1, sizeof *s);
	int rc;
	if (!s || !(s->world_of = loom__calloc((size_t)loom_comm_size(c), sizeof *s->world_of))) {
		free(s);
		return loom_comm_fail(c, LOOM_ENOMEM, "out of memory");
	}
	loom_xp_set_state(c, s);
	s->rank = loom_comm_rank(c), s->size = loom_comm_size(c);
	for (int r = 0; r < s->size; r++)
		s->world_of[r] = loom_xp_world_rank(c, r);
	s->timeout_s = loom_xp_timeout(c);
	s->inplace_min = loom_xp_inplace_min(c);
	snprintf(s->name, sizeof s->name, "/%s", name);
	if (parent) {
		shm_comm_t *ps = S(parent);
		s->spin_us = ps->spin_us, s->spin_small_us = ps->spin_small_us;
		pthread_mutex_lock(&jobs_lock);
		ps->job->refs++;
		pthread_mutex_unlock(&jobs_lock);
		s->job = ps->job;
		return loom__shm_open_segment(c, ctx, s->name, s->rank == 0, 0, NULL);
	}
	wait_policy(s);
	if (!(s->job = loom__calloc(1, sizeof *s->job)))
		return loom_comm_fail(c, LOOM_ENOMEM, "out of memory");
	s->job->fd = -1, s->job->listen_fd = -1, s->job->wake_fd = -1, s->job->refs = 1, s->job->world_rank = s->rank, s->job->world_size = s->size;
	rc = loom__shm_open_segment(c, ctx, s->name, s->rank == 0, heap_bytes, &s->job->fd);
	if (rc == LOOM_OK && (rc = loom__shm_heap_init(s->job)) != LOOM_OK)
		loom_comm_fail(c, rc, "%s", loom_errmsg());
	return rc;
}

static void shm_close_comm(loom_comm_t *c)
{
	shm_comm_t *s = S(c);
	if (!s)
		return;
	if (s->job && s->base && s->base != s->job->base)
		loom__shm_close_segment(c);
	if (s->job)
		job_release(s->job);
	free(s->world_of);
	free(s);
	loom_xp_set_state(c, NULL);
}

static void shm_depart(loom_comm_t *c)
{
	if (S(c))
		loom__shm_depart(c);
}

static int shm_xsendrecv(loom_comm_t *c, const loom_xp_ctx_t *ctx, int chan, int dst, const void *sbuf, size_t sbytes,
                         int stag, int src, void *rbuf, size_t rbytes, int rtag, const void *red_local, loom_dtype_t dt,
                         loom_op_t op)
{
	return loom__shm_sendrecv(c, ctx, chan, dst, sbuf, sbytes, stag, src, rbuf, rbytes, rtag, red_local, dt, op);
}

static int shm_allgather_small(loom_comm_t *c, const loom_xp_ctx_t *ctx, const void *mine, size_t len, void *all)
{
	if (len > SHM_BOARD_BYTES)
		return loom_comm_fail(c, LOOM_EINVAL, "small all-gather of %zu bytes (at most %d)", len, SHM_BOARD_BYTES);
	return loom__shm_board_exchange(c, ctx, mine, len, all);
}

static int shm_aborted(loom_comm_t *c, char *msg, size_t cap)
{
	shm_comm_t *s = S(c);
	int code;
	if (!s || !s->hdr) {
		snprintf(msg, cap, "the communicator's shared memory is not mapped");
		return LOOM_ESTATE;
	}
	code = atomic_load(&s->hdr->abort_code);
	if (code)
		snprintf(msg, cap, "%s", s->hdr->abort_msg);
	return code;
}

static void *shm_alloc(loom_comm_t *c, size_t bytes)
{
	return loom__shm_heap_alloc(S(c) ? S(c)->job : NULL, bytes);
}

static int shm_free(loom_comm_t *c, void *p)
{
	return S(c) ? loom__shm_heap_free(S(c)->job, p) : 0;
}

const loom_xport_ops_t loom__xport_shm = {
	.name = "shm",
	.open = shm_open_comm,
	.depart = shm_depart,
	.close = shm_close_comm,
	.sendrecv = shm_xsendrecv,
	.allgather_small = shm_allgather_small,
	.abort = loom__shm_abort,
	.aborted = shm_aborted,
	.enter = loom__shm_enter,
	.alloc = shm_alloc,
	.free = shm_free,
	.idle_wait = loom__shm_idle_wait,
	.wake_self = loom__shm_wake_self,
};
