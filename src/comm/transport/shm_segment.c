/* shm_segment.c: creating, joining and leaving a communicator's shared-memory segment, and the
 * keeper thread that holds the rank's liveness mutex.
 *
 * Lifetime: nothing of a job has a name in /dev/shm (shm_rdv.c; where /dev/shm has no O_TMPFILE, for
 * the time of one system call). Rank 0 (a group's leader for sub-communicators) creates the
 * segment's memory unnamed, initializes it, publishes `ready`, and offers it on an abstract socket
 * named like the segment; the others fetch it from there, retrying within the deadline (and, for the
 * world, giving up early when rank 0's process is gone). Each rank then claims its record (one
 * process per rank: a second or late claimant is refused, naming the owner), joins and waits until
 * all have. The memory and the offer belong to the processes, so the kernel frees both when the last
 * one ends, however it ends (error exit, SIGTERM from mpirun, SIGKILL at the rendezvous): no name to
 * unlink, nothing for anyone to clean up.
 * Layout (shm_internal.h): header | rank records | channels (kind x src x dst) | heap (world only),
 * every part page aligned and the heap 2 MiB aligned. Every byte is reserved before it is written,
 * so a full /dev/shm is an error, never a SIGBUS at the first write to a page tmpfs cannot supply:
 * the header, records and channels with fallocate at creation (reserve_fixed), the heap block by
 * block as it is handed out (shm_heap.c), which keeps unused heap free. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "comm/transport/shm_internal.h"
#include "core/util.h"

/* ---- layout and segments -------------------------------------------------------------------- */

void loom__shm_layout(shm_hdr_t *h, int n, size_t heap_bytes)
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

static void nap(double seconds)
{
	struct timespec ts = {0, (long)(seconds * 1e9)};
	nanosleep(&ts, NULL);
}

/* Under `loom run`, ranks other than 0 know rank 0's pid (LOOM_RANK0_PID): 1 with the reason when
 * that process has ended (gone, or a zombie not yet reaped), so a rank waiting for rank 0 to create
 * the world segment gives up within a fraction of a second instead of at the deadline. */
static int rank0_gone(char *why, size_t cap)
{
	const char *e = getenv("LOOM_RANK0_PID");
	char path[64], buf[512], *p;
	long pid;
	int ok, fd;
	ssize_t n;
	if (!e || !*e)
		return 0;
	pid = loom_env_long("LOOM_RANK0_PID", 0, &ok);
	if (!ok || pid <= 1)
		return 0;
	if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) {
		snprintf(why, cap, "rank 0 (pid %ld) exited", pid);
		return 1;
	}
	snprintf(path, sizeof path, "/proc/%ld/stat", pid);
	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
		return 0;
	n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	p = strrchr(buf, ')'); /* "pid (comm) S ...": the state follows the last ')' */
	if (p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X')) {
		snprintf(why, cap, "rank 0 (pid %ld) died", pid);
		return 1;
	}
	return 0;
}

/* Reserve the header, rank records and channels of a new segment: the bytes written from the first
 * message on. A full /dev/shm is an error naming its free space and LOOM_SHM_MB. LOOM_TEST_SHM_FULL=1
 * is the fault-injection point for tests where no private /dev/shm can be mounted (it fails as ENOSPC). */
static int reserve_fixed(loom_comm_t *c, int fd, const char *name, const shm_hdr_t *h)
{
	size_t fixed = h->chan_off + (size_t)CHAN_KINDS * h->nranks * h->nranks * h->chan_stride;
	struct statvfs vfs;
	int e;
	if (loom_env_long("LOOM_TEST_SHM_FULL", 0, NULL) == 1)
		errno = ENOSPC;
	else if (fallocate(fd, 0, 0, (off_t)fixed) == 0 || errno == EOPNOTSUPP || errno == ENOSYS)
		return LOOM_OK;
	e = errno;
	if (statvfs("/dev/shm", &vfs) != 0)
		memset(&vfs, 0, sizeof vfs);
	return loom_comm_fail(c, e == ENOSPC ? LOOM_ENOMEM : LOOM_ESYS,
	                      "cannot reserve %.1f MiB in /dev/shm for %s (the channels of %u rank%s): %s; /dev/shm has "
	                      "%.1f MiB free of %.1f MiB. Free space there or mount it larger; the shared heap "
	                      "(LOOM_SHM_MB=%llu per rank) is reserved as it is used, and what does not fit falls back to "
	                      "private memory",
	                      fixed / 1048576.0, name, h->nranks, h->nranks > 1 ? "s" : "", strerror(e),
	                      (double)vfs.f_bavail * vfs.f_frsize / 1048576.0, (double)vfs.f_blocks * vfs.f_frsize / 1048576.0,
	                      (unsigned long long)(h->heap_bytes >> 20));
}

/* The error of a segment that cannot be mapped: out of address space names the shared heap's part. */
static int map_failed(loom_comm_t *c, const char *name, size_t bytes, int e)
{
	if (e != ENOMEM)
		return loom_comm_fail(c, LOOM_ESYS, "mmap(%s, %zu bytes): %s", name, bytes, strerror(e));
	return loom_comm_fail(c, LOOM_ENOMEM,
	                      "mmap(%s, %.1f MiB): %s: the segment is address space for every rank's shared heap "
	                      "(LOOM_SHM_MB, default 1024 MiB per rank): under an address-space limit (prlimit --as, "
	                      "ulimit -v) set LOOM_SHM_MB lower",
	                      name, bytes / 1048576.0, strerror(e));
}

/* Take this rank of the segment at h for this process: one process per rank. Another process that
 * claims it (a rank started twice, a late arrival, a job with the same id) is refused, with the
 * process that holds the rank named; it changes nothing in the segment. */
static int claim_rank(loom_comm_t *c, shm_hdr_t *h, const char *name)
{
	shm_rank_t *me = rank_rec(h, S(c)->rank);
	unsigned joined = atomic_load(&h->attached);
	int owner = 0;
	if (atomic_compare_exchange_strong(&me->claim, &owner, (int)getpid()))
		return LOOM_OK;
	if (joined >= h->nranks)
		return loom_comm_fail(c, LOOM_ESTATE,
		                      "all %u ranks of %s have joined already (rank %d is process %d): this process (pid %d) "
		                      "arrived after the job started (a rank started twice, or a job with the same "
		                      "LOOM_JOB_ID?)",
		                      h->nranks, name, S(c)->rank, owner, (int)getpid());
	return loom_comm_fail(c, LOOM_ESTATE,
	                      "rank %d of %s is already taken by process %d: this process (pid %d) is a second rank %d "
	                      "(a rank started twice, or a job with the same LOOM_JOB_ID?)",
	                      S(c)->rank, name, owner, (int)getpid(), S(c)->rank);
}

int loom__shm_open_segment(loom_comm_t *c, const loom_xp_ctx_t *ctx, const char *name, int create, size_t heap_bytes,
                           int *fd_out)
{
	double deadline = loom__shm_deadline(c, ctx), wait = 1e-4, next_rank0_check = 0;
	int fd = -1, lfd = -1, rc = LOOM_OK, world = 0;
	loom_shm_peers_t peers; /* the world's ranks on this host that have not joined (shm_peers.c) */
	loom_shm_rdv_t rdv = {.sock = -1};
	struct stat st = {0};
	char *base = MAP_FAILED;
	size_t bytes = 0;
	shm_hdr_t *h;
	memset(&peers, 0, sizeof peers); /* scanned from the first wait on (the world only) */
	if (create) {
		shm_hdr_t tmp;
		loom__shm_layout(&tmp, S(c)->size, heap_bytes);
		/* The offer first: a name in use (a job with the same id) fails before any memory is made. */
		if (S(c)->size > 1 && (rc = loom__shm_rdv_offer(c, name, &lfd)) != LOOM_OK)
			return rc;
		if ((fd = loom__shm_rdv_memory(name)) < 0) {
			rc = loom_comm_fail(c, LOOM_ESYS, "cannot create the shared memory of %s in /dev/shm: %s", name,
			                    strerror(errno));
			goto fail;
		}
		bytes = tmp.total_bytes;
		if (ftruncate(fd, (off_t)bytes) != 0) {
			rc = loom_comm_fail(c, LOOM_ESYS, "ftruncate(%s, %zu): %s", name, bytes, strerror(errno));
			goto fail;
		}
		if ((rc = reserve_fixed(c, fd, name, &tmp)) != LOOM_OK)
			goto fail;
		base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
		if (base == MAP_FAILED) {
			rc = map_failed(c, name, bytes, errno);
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
			int got = loom__shm_rdv_fetch(c, name, &rdv, &fd);
			if (got < 0) {
				rc = got;
				goto fail;
			}
			if (got)
				break;
			if (heap_bytes && loom_now() >= next_rank0_check) {
				char why[160];
				if (!peers.n)
					loom__shm_peers_init(&peers, S(c)->size);
				next_rank0_check = loom_now() + 0.1;
				if (rank0_gone(why, sizeof why) || loom__shm_peers_gone(&peers, 0, why, sizeof why)) {
					rc = loom_comm_fail(c, LOOM_EPEERLOST, "%s before creating %s", why, name);
					goto fail;
				}
			}
			if (loom_now() > deadline) {
				rc = loom_comm_fail(c, LOOM_ETIMEDOUT,
				                    "timed out after %.3g s (LOOM_TIMEOUT_S) waiting for rank 0 to create %s (and "
				                    "offer it on the abstract socket %s)",
				                    S(c)->timeout_s, name, rdv.shown);
				goto fail;
			}
			nap(wait);
			wait = LOOM_MIN(wait * 2, 0.01);
		}
		if (fstat(fd, &st) != 0 || (size_t)st.st_size < sizeof(shm_hdr_t)) {
			rc = loom_comm_fail(c, LOOM_EFORMAT, "%s, offered on %s by process %d, is not a loom segment (%lld bytes)",
			                    name, rdv.shown, rdv.pid, (long long)st.st_size);
			goto fail;
		}
		bytes = (size_t)st.st_size;
		base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
		if (base == MAP_FAILED) {
			rc = map_failed(c, name, bytes, errno);
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
		if (h->magic != SHM_MAGIC || h->version != SHM_VERSION || h->nranks != (uint32_t)S(c)->size ||
		    h->total_bytes != bytes) {
			rc = loom_comm_fail(c, LOOM_EFORMAT,
			                    "%s is not a loom segment for %d ranks (magic %llx version %u, %u ranks, %llu bytes; "
			                    "offered by process %d: a job with the same LOOM_JOB_ID, or another loom version?)",
			                    name, S(c)->size, (unsigned long long)h->magic, h->version, h->nranks,
			                    (unsigned long long)h->total_bytes, rdv.pid);
			goto fail;
		}
	}
	if ((rc = claim_rank(c, h, name)) != LOOM_OK)
		goto fail;
	S(c)->hdr = h;
	S(c)->base = base;
	S(c)->bytes = bytes;
	if (!S(c)->job->hdr) { /* the world segment: it carries the job's heap and liveness mutexes */
		loom_job_t *j = S(c)->job;
		world = 1;
		j->hdr = h, j->base = base, j->bytes = bytes, j->fd = fd;
		j->listen_fd = lfd; /* the keeper answers the world's offer from now on, for the job's lifetime */
		lfd = -1;
		if ((rc = loom__shm_proc_start(j)) != LOOM_OK) {
			rc = loom_comm_fail(c, rc, "%s", loom_errmsg());
			goto fail_mapped;
		}
	}
	{
		shm_rank_t *me = rank_rec(h, S(c)->rank);
		me->pid = (int)getpid();
		atomic_store(&me->cpu, -1);
		atomic_store(&me->state, RANK_JOINED);
		atomic_fetch_add(&h->attached, 1);
		loom__shm_ring_all(c);
	}
	/* Wait for everyone (a sub-group's leader answering its offer meanwhile). LOOM_TEST_JOIN_PAUSE_S, for
	 * tests: this process sleeps that long once, after finding a rank missing and answering the offer
	 * (comm_join_then_quick_leave). */
	{
		double next_lock = loom_now() + LOCK_CHECK_S;
		const char *pause = getenv("LOOM_TEST_JOIN_PAUSE_S");
		double pause_s = pause ? atof(pause) : 0.0;
		wait = 1e-5;
		while (atomic_load(&h->attached) < h->nranks) {
			double now = loom_now();
			char why[256];
			int code;
			if (lfd >= 0)
				loom__shm_rdv_serve(lfd, fd);
			if (pause_s > 0)
				nap(pause_s), pause_s = 0, now = loom_now();
			code = atomic_load(&h->abort_code);
			if (code != 0) { /* another rank gave up joining: report its reason */
				rc = loom_comm_fail(c, code, "joining failed on another rank: %s", h->abort_msg);
				goto fail_mapped;
			}
			if (now > deadline) {
				char missing[256] = "";
				size_t len = 0;
				for (int r = 0; r < S(c)->size && len + 12 < sizeof missing; r++)
					if (atomic_load(&rank_rec(h, r)->state) == RANK_ABSENT)
						len += (size_t)snprintf(missing + len, sizeof missing - len, "%s%d", len ? ", " : "", r);
				rc = loom_comm_fail(c, LOOM_ETIMEDOUT,
				                    "timed out after %.3g s (LOOM_TIMEOUT_S) waiting for ranks to join %s; missing: %s",
				                    S(c)->timeout_s, name, missing);
				loom__shm_abort(c, rc, loom_errmsg());
				goto fail_mapped;
			}
			for (int r = 0; r < S(c)->size; r++) {
				if (r == S(c)->rank)
					continue;
				/* Not joined: in the world, ask the launcher's process table; in a sub-group, the
				 * world's liveness record tells. */
				if (atomic_load(&rank_rec(h, r)->state) == RANK_ABSENT && world) {
					if (!peers.n)
						loom__shm_peers_init(&peers, S(c)->size);
					if (loom__shm_peers_gone(&peers, r, why, sizeof why)) {
						rc = loom_comm_fail(c, LOOM_EPEERLOST, "while joining %s: %s", name, why);
						loom__shm_abort(c, rc, loom_errmsg());
						goto fail_mapped;
					}
					continue;
				}
				if (loom__shm_check_peer(c, r, now >= next_lock, why, sizeof why)) {
					/* everyone joined since the loop's test: a peer that has left did so after joining
					 * (a quick rank's loom_comm_destroy), which is no failure of the join */
					if (atomic_load(&h->attached) >= h->nranks)
						break;
					rc = loom_comm_fail(c, LOOM_EPEERLOST, "while joining %s: %s", name, why);
					loom__shm_abort(c, rc, loom_errmsg());
					goto fail_mapped;
				}
			}
			if (now >= next_lock)
				next_lock = now + LOCK_CHECK_S;
			nap(wait);
			wait = LOOM_MIN(wait * 2, 2e-3);
		}
	}
	if (lfd >= 0) /* a sub-group's offer ends with its rendezvous */
		close(lfd);
	loom__shm_peers_free(&peers);
	if (fd_out)
		*fd_out = fd;
	else
		close(fd);
	return LOOM_OK;
fail_mapped:
	if (world) { /* the keeper withdraws the world's offer */
		loom__shm_proc_end(S(c)->job);
		S(c)->job->hdr = NULL, S(c)->job->base = NULL, S(c)->job->bytes = 0, S(c)->job->fd = -1;
	}
	S(c)->hdr = NULL, S(c)->base = NULL, S(c)->bytes = 0;
fail:
	/* Nothing to remove: closing the offer and the memory is all, and the kernel does it for a
	 * process that dies instead. */
	if (lfd >= 0)
		close(lfd);
	loom__shm_rdv_close(&rdv);
	if (base != MAP_FAILED)
		munmap(base, bytes);
	if (fd >= 0)
		close(fd);
	loom__shm_peers_free(&peers);
	return rc;
}

void loom__shm_close_segment(loom_comm_t *c)
{
	if (S(c)->base)
		munmap(S(c)->base, S(c)->bytes);
	S(c)->base = NULL, S(c)->hdr = NULL, S(c)->bytes = 0;
}

void loom__shm_depart(loom_comm_t *c)
{
	if (!S(c)->hdr)
		return;
	atomic_store(&rank_rec(S(c)->hdr, S(c)->rank)->state, RANK_DEPARTED);
	loom__shm_ring_all(c);
}

/* The keeper thread locks the rank's robust liveness mutex and holds it until shm_proc_end. A
 * dedicated thread (rather than the caller of loom_comm_init) because a robust mutex is owned by a
 * thread: the application's threads may come and go, the keeper ends only with the process (then
 * peers get EOWNERDEAD) or when the job is left cleanly. On the world's creator it also answers the
 * world's offer (shm_rdv.c) for as long as it runs: the other ranks fetch the segment from it, and
 * a late one is refused by the segment's claims instead of waiting for a segment nobody offers. */
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
	for (int serving = j->listen_fd >= 0; !e && serving && j->keeper_state != 2;) {
		struct pollfd p[2] = {{.fd = j->listen_fd, .events = POLLIN}, {.fd = j->wake_fd, .events = POLLIN}};
		pthread_mutex_unlock(&j->keeper_lock);
		if (poll(p, 2, -1) > 0 && (p[0].revents & POLLIN))
			loom__shm_rdv_serve(j->listen_fd, j->fd);
		serving = !(p[0].revents & (POLLERR | POLLHUP | POLLNVAL)); /* (never, short of a kernel surprise) */
		pthread_mutex_lock(&j->keeper_lock);
	}
	while (!e && j->keeper_state != 2)
		pthread_cond_wait(&j->keeper_cond, &j->keeper_lock);
	pthread_mutex_unlock(&j->keeper_lock);
	if (!e) {
		atomic_store(&me->proc, PROC_EXITED);
		pthread_mutex_unlock(&me->alive);
	}
	return NULL;
}

/* The world's offer ends with the keeper: after it stopped, or when it could not start. */
static void close_offer(loom_job_t *j)
{
	if (j->listen_fd >= 0)
		close(j->listen_fd);
	if (j->wake_fd >= 0)
		close(j->wake_fd);
	j->listen_fd = j->wake_fd = -1;
}

int loom__shm_proc_start(loom_job_t *j)
{
	int e;
	pthread_mutex_init(&j->keeper_lock, NULL);
	pthread_cond_init(&j->keeper_cond, NULL);
	j->keeper_state = 0;
	if (j->listen_fd >= 0 && (j->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0) {
		e = errno;
		close_offer(j);
		pthread_cond_destroy(&j->keeper_cond);
		pthread_mutex_destroy(&j->keeper_lock);
		return loom_seterr(LOOM_ESYS, "rank %d: eventfd for its keeper thread: %s", j->world_rank, strerror(e));
	}
	if ((e = loom__thread_start(&j->keeper, NULL, keeper_main, j, "keeper")) != 0)
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
		int started = e == 0;
		e = -j->keeper_state;
		close_offer(j);
		pthread_cond_destroy(&j->keeper_cond);
		pthread_mutex_destroy(&j->keeper_lock);
		if (!started)
			return loom_seterr(LOOM_ESYS, "rank %d: cannot start its keeper thread (it holds the rank's liveness "
			                   "mutex): pthread_create: %s%s", j->world_rank, strerror(e),
			                   e == EAGAIN ? " (a limit on threads or processes: ulimit -u, the cgroup's pids.max)" : "");
		return loom_seterr(LOOM_ESYS, "rank %d: cannot hold its liveness mutex: %s", j->world_rank, strerror(e));
	}
	return LOOM_OK;
}

void loom__shm_proc_end(loom_job_t *j)
{
	if (j->keeper_state != 1)
		return;
	pthread_mutex_lock(&j->keeper_lock);
	j->keeper_state = 2;
	pthread_cond_broadcast(&j->keeper_cond);
	pthread_mutex_unlock(&j->keeper_lock);
	if (j->wake_fd >= 0) {
		uint64_t one = 1;
		(void)!write(j->wake_fd, &one, sizeof one);
	}
	pthread_join(j->keeper, NULL);
	close_offer(j);
	pthread_cond_destroy(&j->keeper_cond);
	pthread_mutex_destroy(&j->keeper_lock);
	j->keeper_state = 0;
}
