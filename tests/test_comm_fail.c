/* test_comm_fail.c: the communicator's failure paths, each run as forked ranks under a timeout: a
 * rank that dies (SIGKILL, exit without loom_comm_destroy) or leaves during a collective, in the
 * world and in a sub-group; the deadline (LOOM_TIMEOUT_S); mismatched collective calls with and
 * without LOOM_DEBUG (dtype, op, root, count: every message's signature), a call invalid on one
 * rank (the sequence numbers stay in step), overlapping buffers, integer sums that overflow. The
 * harness also checks that no shared-memory segment is left behind. */
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm/transport.h"
#include "core/util.h"
#include "loom/comm.h"
#include "test.h"

/* The death test. The victim rank forks: the child is the real rank and dies during the second
 * all-reduce (SIGKILL, or _exit without loom_comm_destroy); the parent reports success when its
 * child died that way, so the harness only sees failures of the survivors. Survivors must get
 * LOOM_EPEERLOST naming the victim in under 2 s, then fail fast. */
typedef struct {
	int victim, how; /* how: 0 SIGKILL, 1 _exit(0), 2 loom_comm_destroy then _exit */
} death_t;

static int rank_death(int rank, int n, void *arg)
{
	const death_t *d = arg;
	enum { N = 1 << 20 };
	loom_comm_t *c;
	float *x;
	double t0, dt;
	char want[64];
	int rc;
	(void)n;
	if (rank == d->victim) {
		int st;
		pid_t p = fork();
		if (p < 0)
			return 1;
		if (p > 0) {
			waitpid(p, &st, 0);
			if (d->how == 0)
				CHECK_MSG(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "victim status %d", st);
			else
				CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "victim status %d", st);
			return 0;
		}
	}
	CHECK_OK(loom_comm_init(&c));
	x = malloc(N * sizeof *x);
	CHECK(x != NULL);
	for (int i = 0; i < N; i++)
		x[i] = 1;
	CHECK_OK(loom_allreduce(c, x, x, N, LOOM_FLOAT32, LOOM_SUM));
	if (rank == d->victim) {
		usleep(100000); /* let the others enter the next all-reduce and sleep in it */
		if (d->how == 0)
			raise(SIGKILL);
		if (d->how == 2)
			loom_comm_destroy(c);
		_exit(0);
	}
	t0 = loom_now();
	if (d->how == 1) { /* non-blocking: the request keeps the detail, loom_wait publishes it */
		loom_request_t *req;
		CHECK_OK(loom_iallreduce(c, x, x, N, LOOM_FLOAT32, LOOM_SUM, &req));
		rc = loom_wait(req);
	} else {
		rc = loom_allreduce(c, x, x, N, LOOM_FLOAT32, LOOM_SUM);
	}
	dt = loom_now() - t0;
	CHECK_ERR(rc, LOOM_EPEERLOST);
	CHECK_MSG(dt < 2.0, "EPEERLOST took %.3f s", dt);
	snprintf(want, sizeof want, "rank %d", d->victim);
	CHECK_CONTAINS(loom_errmsg(), want);
	CHECK_CONTAINS(loom_errmsg(), "allreduce #2");
	CHECK_CONTAINS(loom_comm_errmsg(c), "allreduce #2");
	/* fail fast afterwards */
	t0 = loom_now();
	CHECK_ERR(loom_barrier(c), LOOM_EPEERLOST);
	CHECK(loom_now() - t0 < 0.1);
	CHECK_CONTAINS(loom_comm_errmsg(c), "unusable after an earlier failure");
	free(x);
	CHECK_OK(loom_comm_destroy(c));
	return 0;
}

TEST(comm_death)
{
	death_t kill9 = {1, 0}, quit = {2, 1}, leave = {0, 2};
	const char *env[] = {"LOOM_TIMEOUT_S=20", NULL};
	CHECK_EQ(test_spawn(3, rank_death, &kill9, 20, env), 0);
	CHECK_EQ(test_spawn(3, rank_death, &quit, 20, env), 0);
	CHECK_EQ(test_spawn(2, rank_death, &leave, 20, env), 0);
	return 0;
}

/* LOOM_TIMEOUT_S=1: rank 2 skips an all-reduce; ranks 0 and 1 time out naming it. */
static int rank_timeout(int rank, int n, void *arg)
{
	loom_comm_t *c;
	float x = 1;
	double t0;
	(void)n, (void)arg;
	CHECK_OK(loom_comm_init(&c));
	CHECK_OK(loom_allreduce(c, &x, &x, 1, LOOM_FLOAT32, LOOM_SUM));
	if (rank == 2) {
		usleep(2500000); /* well past the others' deadline, even on a loaded machine */
		CHECK_ERR(loom_allreduce(c, &x, &x, 1, LOOM_FLOAT32, LOOM_SUM), LOOM_ETIMEDOUT);
		CHECK_CONTAINS(loom_comm_errmsg(c), "unusable after an earlier failure");
	} else {
		t0 = loom_now();
		CHECK_ERR(loom_allreduce(c, &x, &x, 1, LOOM_FLOAT32, LOOM_SUM), LOOM_ETIMEDOUT);
		CHECK_MSG(loom_now() - t0 > 0.9 && loom_now() - t0 < 2.4, "took %.3f s", loom_now() - t0);
		CHECK_CONTAINS(loom_comm_errmsg(c), "allreduce #2");
		CHECK_CONTAINS(loom_comm_errmsg(c), "2 (at #1)");
	}
	CHECK_OK(loom_comm_destroy(c));
	return 0;
}

TEST(comm_timeout)
{
	const char *env[] = {"LOOM_TIMEOUT_S=1", NULL};
	CHECK_EQ(test_spawn(3, rank_timeout, NULL, 20, env), 0);
	return 0;
}

/* Mismatched calls. With LOOM_DEBUG=1 every rank fails with both signatures and the communicator
 * stays usable; without it a size mismatch is still an error on every rank, and nothing is written
 * past the smaller buffer. */
static int rank_mismatch(int rank, int n, void *arg)
{
	int debug = *(int *)arg;
	loom_comm_t *c;
	float *x = malloc(2000 * sizeof *x);
	size_t cnt = rank == 0 ? 1000 : 1001;
	(void)n;
	CHECK(x != NULL);
	for (int i = 0; i < 2000; i++)
		x[i] = -1;
	CHECK_OK(loom_comm_init(&c));
	CHECK_ERR(loom_allreduce(c, x, x, cnt, LOOM_FLOAT32, LOOM_SUM), LOOM_EMISMATCH);
	for (int i = (int)cnt; i < 2000; i++)
		if (x[i] != -1)
			TEST_FAIL_("x[%d] = %g written past count %zu", i, x[i], cnt);
	if (debug) {
		char mine[96], other[96];
		snprintf(mine, sizeof mine, "this rank called allreduce #1 (count %zu, float32, op sum, root -1)", cnt);
		snprintf(other, sizeof other, "rank %d called allreduce #1 (count %d, float32, op sum, root -1)", 1 - rank,
		         rank == 0 ? 1001 : 1000);
		CHECK_CONTAINS(loom_comm_errmsg(c), mine);
		CHECK_CONTAINS(loom_comm_errmsg(c), other);
		/* allreduce against broadcast */
		if (rank == 0)
			CHECK_ERR(loom_allreduce(c, x, x, 1000, LOOM_FLOAT32, LOOM_SUM), LOOM_EMISMATCH);
		else
			CHECK_ERR(loom_broadcast(c, x, 1000, LOOM_FLOAT32, 0), LOOM_EMISMATCH);
		CHECK_CONTAINS(loom_comm_errmsg(c), "allreduce #2 (count 1000, float32, op sum, root -1)");
		CHECK_CONTAINS(loom_comm_errmsg(c), "broadcast #2 (count 1000, float32, op -, root 0)");
		/* still usable */
		for (int i = 0; i < 1000; i++)
			x[i] = (float)rank;
		CHECK_OK(loom_allreduce(c, x, x, 1000, LOOM_FLOAT32, LOOM_SUM));
		CHECK_FEQ(x[999], 1);
	} else { /* the signature on every message names both calls without LOOM_DEBUG too */
		char mine[96], other[96];
		snprintf(mine, sizeof mine, "this rank called allreduce #1 (count %zu, float32, op sum, root -1)", cnt);
		snprintf(other, sizeof other, "rank %d called allreduce #1 (count %d, float32, op sum, root -1)", 1 - rank,
		         rank == 0 ? 1001 : 1000);
		CHECK_CONTAINS(loom_comm_errmsg(c), mine);
		CHECK_CONTAINS(loom_comm_errmsg(c), other);
	}
	CHECK_OK(loom_comm_destroy(c));
	free(x);
	return 0;
}

TEST(comm_mismatch)
{
	int debug = 1, plain = 0;
	const char *env[] = {"LOOM_DEBUG=1", "LOOM_TIMEOUT_S=10", NULL}, *env2[] = {"LOOM_TIMEOUT_S=10", NULL};
	CHECK_EQ(test_spawn(2, rank_mismatch, &debug, 20, env), 0);
	CHECK_EQ(test_spawn(2, rank_mismatch, &plain, 20, env2), 0);
	return 0;
}

/* A rank dies inside a sub-group: its group fails naming it (with its world rank); the other
 * group is unaffected. */
/* Mismatched calls without LOOM_DEBUG (issue 13, finding 8): the signature every message carries
 * makes each of these an error on both ranks, naming both calls, instead of wrong data or a hang. */
enum { SIG_DTYPE, SIG_OP, SIG_ROOT_BIG, SIG_ROOT_SMALL, SIG_LOCAL_EINVAL, SIG_OVERLAP, SIG_INT_WRAP, SIG_CASES };

static int rank_signature(int rank, int n, void *arg)
{
	int what = *(int *)arg;
	loom_comm_t *c;
	size_t big = 3u << 20;
	float *x = malloc(big * sizeof *x);
	(void)n;
	CHECK(x != NULL);
	for (size_t i = 0; i < big; i++)
		x[i] = (float)(rank + 1);
	CHECK_OK(loom_comm_init(&c));
	switch (what) {
	case SIG_DTYPE: /* float32 against int32: same size, so only the signature tells */
		CHECK_ERR(loom_allreduce(c, x, x, 1000, rank ? LOOM_INT32 : LOOM_FLOAT32, LOOM_SUM), LOOM_EMISMATCH);
		CHECK_CONTAINS(loom_comm_errmsg(c), rank ? "this rank called allreduce #1 (count 1000, int32, op sum"
		                                         : "this rank called allreduce #1 (count 1000, float32, op sum");
		CHECK_CONTAINS(loom_comm_errmsg(c), rank ? "rank 0 called allreduce #1 (count 1000, float32, op sum"
		                                         : "rank 1 called allreduce #1 (count 1000, int32, op sum");
		break;
	case SIG_OP:
		CHECK_ERR(loom_allreduce(c, x, x, 1000, LOOM_FLOAT32, rank ? LOOM_MAX : LOOM_SUM), LOOM_EMISMATCH);
		CHECK_CONTAINS(loom_comm_errmsg(c), "op max");
		CHECK_CONTAINS(loom_comm_errmsg(c), "op sum");
		break;
	case SIG_ROOT_BIG: { /* each rank the root: both only send; 12 MB cannot go out eagerly */
		double t0 = loom_now();
		CHECK_ERR(loom_broadcast(c, x, big, LOOM_FLOAT32, rank), LOOM_EMISMATCH);
		CHECK_MSG(loom_now() - t0 < 5, "took %.1f s (LOOM_TIMEOUT_S=30)", loom_now() - t0);
		CHECK_CONTAINS(loom_comm_errmsg(c), "root 0");
		CHECK_CONTAINS(loom_comm_errmsg(c), "root 1");
		break;
	}
	case SIG_ROOT_SMALL: /* small messages go out eagerly: the next call fails, on both ranks */
		loom_broadcast(c, x, 100, LOOM_FLOAT32, rank);
		CHECK_ERR(loom_allreduce(c, x, x, 100, LOOM_FLOAT32, LOOM_SUM), LOOM_EMISMATCH);
		CHECK_CONTAINS(loom_comm_errmsg(c), "broadcast #1 (count 100, float32, op -, root ");
		break;
	case SIG_LOCAL_EINVAL:
		/* Rank 0's broadcast fails its argument check; rank 1 (the root) sends. Rank 0's next
		 * all-reduce must not take that broadcast's data for the all-reduce's. */
		CHECK_ERR(loom_broadcast(c, x, 100, LOOM_FLOAT32, rank ? 1 : 7), rank ? LOOM_OK : LOOM_EINVAL);
		if (rank == 0) {
			CHECK_ERR(loom_allreduce(c, x, x, 100, LOOM_FLOAT32, LOOM_SUM), LOOM_EMISMATCH);
			CHECK_CONTAINS(loom_comm_errmsg(c), "broadcast #1 (count 100, float32, op -, root 1)");
			CHECK_CONTAINS(loom_comm_errmsg(c), "allreduce #2 (count 100, float32, op sum, root -1)");
		} else {
			/* Rank 1 may finish its part (rank 0's all-reduce message is the right one), then
			 * learns of the failure at its next call at the latest. */
			int rc = loom_allreduce(c, x, x, 100, LOOM_FLOAT32, LOOM_SUM);
			CHECK_MSG(rc == LOOM_OK || rc == LOOM_EMISMATCH, "allreduce returned %d", rc);
			if (rc == LOOM_OK)
				CHECK_ERR(loom_barrier(c), LOOM_EMISMATCH);
			CHECK_CONTAINS(loom_comm_errmsg(c), "broadcast #1 (count 100, float32, op -, root 1)");
		}
		break;
	case SIG_OVERLAP: /* partial overlap is EINVAL on the rank that passed it; the numbering stays in step */
		if (rank == 0) {
			CHECK_ERR(loom_allreduce(c, x, x + 1, 100, LOOM_FLOAT32, LOOM_SUM), LOOM_EINVAL);
			CHECK_CONTAINS(loom_comm_errmsg(c), "overlap");
			CHECK_ERR(loom_allgather(c, x + 3, x, 4, LOOM_FLOAT32), LOOM_EINVAL); /* block 0 is x[0..4) */
			CHECK_ERR(loom_reduce_scatter(c, x, x + 1, 4, LOOM_FLOAT32, LOOM_SUM), LOOM_EINVAL);
			CHECK_ERR(loom_reduce(c, x + 2, x, 4, LOOM_FLOAT32, LOOM_SUM, 0), LOOM_EINVAL);
		} else {
			CHECK_ERR(loom_allreduce(c, x, x + 1, 100, LOOM_FLOAT32, LOOM_SUM), LOOM_EINVAL);
			CHECK_ERR(loom_allgather(c, x + 3, x, 4, LOOM_FLOAT32), LOOM_EINVAL); /* block 1 is x[4..8) */
			CHECK_ERR(loom_reduce_scatter(c, x, x + 3, 4, LOOM_FLOAT32, LOOM_SUM), LOOM_EINVAL);
			CHECK_ERR(loom_reduce(c, x + 2, x, 4, LOOM_FLOAT32, LOOM_SUM, 1), LOOM_EINVAL);
		}
		/* the allowed in-place forms still work, in step */
		for (int i = 0; i < 8; i++)
			x[i] = (float)(10 * rank + i);
		CHECK_OK(loom_allgather(c, x + 4 * rank, x, 4, LOOM_FLOAT32));
		for (int i = 0; i < 8; i++)
			CHECK_FEQ(x[i], (float)(i < 4 ? i : 10 + i));
		CHECK_OK(loom_allreduce(c, x, x, 100, LOOM_FLOAT32, LOOM_SUM));
		CHECK_FEQ(x[0], 0 + 0);
		CHECK_FEQ(x[5], 2 * 15);
		break;
	case SIG_INT_WRAP: { /* integer sums wrap (two's complement), never undefined behaviour */
		int32_t a[2] = {INT32_MAX, INT32_MIN};
		int64_t b[2] = {INT64_MAX, INT64_MIN};
		CHECK_OK(loom_allreduce(c, a, a, 2, LOOM_INT32, LOOM_SUM));
		CHECK_EQ(a[0], -2);
		CHECK_EQ(a[1], 0);
		CHECK_OK(loom_allreduce(c, b, b, 2, LOOM_INT64, LOOM_SUM));
		CHECK_EQ(b[0], -2);
		CHECK_EQ(b[1], 0);
		break;
	}
	}
	CHECK_OK(loom_comm_destroy(c));
	free(x);
	return 0;
}

TEST(comm_mismatch_signature)
{
	const char *env[] = {"LOOM_TIMEOUT_S=30", NULL};
	for (int k = 0; k < SIG_CASES; k++) {
		int rc = test_spawn(2, rank_signature, &k, 60, env);
		CHECK_MSG(rc == 0, "case %d failed", k);
	}
	return 0;
}

static int rank_split_death(int rank, int n, void *arg)
{
	loom_comm_t *c, *g;
	float x = 1;
	(void)n, (void)arg;
	if (rank == 3) {
		int st;
		pid_t p = fork();
		if (p < 0)
			return 1;
		if (p > 0) {
			waitpid(p, &st, 0);
			CHECK_MSG(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "victim status %d", st);
			return 0;
		}
	}
	CHECK_OK(loom_comm_init(&c));
	CHECK_OK(loom_comm_split(c, rank % 2, 0, &g));
	CHECK_OK(loom_allreduce(g, &x, &x, 1, LOOM_FLOAT32, LOOM_SUM));
	CHECK_FEQ(x, 2);
	if (rank == 3) {
		usleep(100000);
		raise(SIGKILL);
	}
	if (rank == 1) {
		CHECK_ERR(loom_allreduce(g, &x, &x, 1, LOOM_FLOAT32, LOOM_SUM), LOOM_EPEERLOST);
		CHECK_CONTAINS(loom_comm_errmsg(g), "rank 1 (world rank 3, pid");
		CHECK_CONTAINS(loom_comm_errmsg(g), "died");
	} else {
		for (int i = 0; i < 5; i++) {
			usleep(40000);
			CHECK_OK(loom_allreduce(g, &x, &x, 1, LOOM_FLOAT32, LOOM_SUM));
		}
		CHECK_FEQ(x, 64);
	}
	CHECK_OK(loom_comm_destroy(g));
	CHECK_OK(loom_comm_destroy(c));
	return 0;
}

TEST(comm_split_death)
{
	CHECK_EQ(test_spawn(4, rank_split_death, NULL, 20, NULL), 0);
	return 0;
}


/* A rank that finished its part may leave: its last (eager) message is still delivered, and only
 * waiting for more from it is an error. Rank 1's sendrecv sends to rank 0 and receives from rank 2;
 * rank 0 leaves as soon as it has taken its message, while rank 1 still waits for rank 2. */
static int rank_left(int rank, int n, void *arg)
{
	loom_comm_t *c;
	int32_t a = 10 + rank, b = 0;
	(void)n, (void)arg;
	CHECK_OK(loom_comm_init(&c));
	if (rank == 0) {
		CHECK_OK(loom_xp_send(c, 1, &a, sizeof a));
		CHECK_OK(loom_xp_recv(c, 1, &b, sizeof b));
		CHECK_EQ(b, 11);
	} else if (rank == 1) {
		usleep(200000); /* rank 0 has sent and is waiting for our message */
		CHECK_OK(loom_xp_sendrecv(c, 0, &a, sizeof a, 2, &b, sizeof b, NULL, LOOM_INT32, LOOM_SUM));
		CHECK_EQ(b, 12);
		CHECK_OK(loom_xp_recv(c, 0, &b, sizeof b)); /* sent before rank 0 left */
		CHECK_EQ(b, 10);
		CHECK_ERR(loom_xp_recv(c, 0, &b, sizeof b), LOOM_EPEERLOST);
		CHECK_CONTAINS(loom_comm_errmsg(c), "rank 0 (pid");
		CHECK_CONTAINS(loom_comm_errmsg(c), "left the communicator (loom_comm_destroy)");
	} else {
		usleep(400000); /* after rank 0 left */
		CHECK_OK(loom_xp_send(c, 1, &a, sizeof a));
	}
	CHECK_OK(loom_comm_destroy(c));
	return 0;
}

TEST(comm_peer_left_after_its_part)
{
	const char *env[] = {"LOOM_TIMEOUT_S=20", NULL};
	CHECK_EQ(test_spawn(3, rank_left, NULL, 20, env), 0);
	return 0;
}

/* Joining has a deadline too: a rank that never calls loom_comm_init is named. */
static int rank_join_timeout(int rank, int n, void *arg)
{
	int absent = *(int *)arg;
	loom_comm_t *c = NULL;
	double t0 = loom_now();
	(void)n;
	if (rank == absent)
		return 0; /* never joins */
	CHECK_ERR(loom_comm_init(&c), LOOM_ETIMEDOUT);
	CHECK(c == NULL);
	CHECK_MSG(loom_now() - t0 < 2.0, "took %.3f s with LOOM_TIMEOUT_S=0.3", loom_now() - t0);
	if (absent == 0)
		CHECK_CONTAINS(loom_errmsg(), "waiting for rank 0 to create /loom-");
	else
		CHECK_CONTAINS(loom_errmsg(), "waiting for ranks to join /loom-");
	if (absent == 2)
		CHECK_CONTAINS(loom_errmsg(), "missing: 2");
	return 0;
}

/* A file in /dev/shm named like a segment (left by a loom that named its segments) is neither used
 * nor in the way: segments have no name there any more. */
static int rank_stale_segment(int rank, int n, void *arg)
{
	char id[64], path[96];
	loom_comm_t *c = NULL;
	int64_t x = 1;
	(void)arg;
	snprintf(id, sizeof id, "%s-stale", getenv("LOOM_JOB_ID"));
	snprintf(path, sizeof path, "/dev/shm/loom-%s@w", id);
	if (rank == 0)
		CHECK_EQ(test_write_file(path, "old", 3), 0);
	setenv("LOOM_JOB_ID", id, 1);
	CHECK_OK(loom_comm_init(&c));
	CHECK_OK(loom_allreduce(c, &x, &x, 1, LOOM_INT64, LOOM_SUM));
	CHECK_EQ(x, n);
	CHECK_OK(loom_comm_destroy(c));
	if (rank == 0) {
		struct stat st;
		CHECK_MSG(stat(path, &st) == 0 && st.st_size == 3, "%s was changed or removed", path);
		unlink(path);
	}
	return 0;
}

TEST(comm_join_failures)
{
	int first = 0, last = 2;
	const char *env[] = {"LOOM_TIMEOUT_S=0.3", NULL};
	CHECK_EQ(test_spawn(2, rank_join_timeout, &first, 20, env), 0);
	CHECK_EQ(test_spawn(3, rank_join_timeout, &last, 20, env), 0);
	CHECK_EQ(test_spawn(2, rank_stale_segment, NULL, 20, NULL), 0);
	return 0;
}

/* Two jobs with one id on this host: processes 0 and 1 are job A; 2 and 3 are job B (ranks 0 and 1,
 * the same LOOM_JOB_ID), which starts once A has joined. B's rank 0 is refused at once, naming A's
 * rank 0; B's rank 1 reaches A's segment and is refused as a late rank, naming A's rank 1: neither
 * waits for its deadline (20 s). A waits for both refusals (files in dir), then finishes. */
static int rank_same_id(int proc, int n, void *arg)
{
	const char *dir = arg;
	char path[600], v[16];
	loom_comm_t *c = NULL;
	int rank = proc % 2, rc;
	double t0;
	(void)n;
	snprintf(v, sizeof v, "%d", rank);
	setenv("RANK", v, 1), setenv("LOCAL_RANK", v, 1), setenv("WORLD_SIZE", "2", 1), setenv("LOCAL_WORLD_SIZE", "2", 1);
	if (proc < 2) {
		int64_t x = 1;
		CHECK_OK(loom_comm_init(&c));
		snprintf(path, sizeof path, "%s/a%d", dir, rank);
		snprintf(v, sizeof v, "%d", (int)getpid());
		CHECK_EQ(test_write_file(path, v, strlen(v)), 0);
		for (int k = 0; k < 2; k++) { /* B's refusals */
			snprintf(path, sizeof path, "%s/b%d", dir, k);
			for (t0 = loom_now(); access(path, F_OK) != 0 && loom_now() - t0 < 15;)
				usleep(10000);
		}
		CHECK_OK(loom_allreduce(c, &x, &x, 1, LOOM_INT64, LOOM_SUM));
		CHECK_EQ(x, 2);
		CHECK_OK(loom_comm_destroy(c));
		return 0;
	} else {
		char owner[32] = "", want[160];
		FILE *f;
		for (int k = 0; k < 2; k++) { /* A has joined: both wrote their pid */
			snprintf(path, sizeof path, "%s/a%d", dir, k);
			for (t0 = loom_now(); access(path, F_OK) != 0 && loom_now() - t0 < 15;)
				usleep(10000);
		}
		snprintf(path, sizeof path, "%s/a%d", dir, rank);
		CHECK((f = fopen(path, "r")) != NULL);
		CHECK(fgets(owner, sizeof owner, f) != NULL);
		fclose(f);
		t0 = loom_now();
		rc = loom_comm_init(&c);
		CHECK_MSG(loom_now() - t0 < 2.0, "refused after %.2f s", loom_now() - t0);
		CHECK_ERR(rc, LOOM_ESTATE);
		CHECK(c == NULL);
		if (rank == 0) {
			snprintf(want, sizeof want, "is in use on this host: process %s (uid %u) offers it on @loom-", owner,
			         (unsigned)geteuid());
			CHECK_CONTAINS(loom_errmsg(), want);
			CHECK_CONTAINS(loom_errmsg(), "use another LOOM_JOB_ID");
		} else {
			snprintf(want, sizeof want, "all 2 ranks of /loom-%s@w have joined already (rank 1 is process %s): "
			         "this process (pid %d) arrived after the job started", getenv("LOOM_JOB_ID"), owner, (int)getpid());
			CHECK_CONTAINS(loom_errmsg(), want);
		}
		snprintf(path, sizeof path, "%s/b%d", dir, rank);
		CHECK_EQ(test_write_file(path, "", 0), 0);
		return 0;
	}
}

/* A second process claiming a rank while the job gathers: refused at once, naming the first; the
 * job itself then misses its rank 2 (LOOM_TIMEOUT_S=1). */
static int rank_twice(int proc, int n, void *arg)
{
	loom_comm_t *c = NULL;
	double t0;
	int rc;
	(void)n, (void)arg;
	if (proc == 2) {
		usleep(300000); /* after the first rank 1 */
		setenv("RANK", "1", 1), setenv("LOCAL_RANK", "1", 1);
	}
	t0 = loom_now();
	rc = loom_comm_init(&c);
	CHECK(c == NULL);
	if (proc == 2) {
		CHECK_ERR(rc, LOOM_ESTATE);
		CHECK_MSG(loom_now() - t0 < 0.9, "refused after %.2f s", loom_now() - t0);
		CHECK_CONTAINS(loom_errmsg(), "rank 1 of /loom-");
		CHECK_CONTAINS(loom_errmsg(), "is already taken by process ");
		CHECK_CONTAINS(loom_errmsg(), "is a second rank 1");
	} else {
		CHECK_ERR(rc, LOOM_ETIMEDOUT);
		CHECK_CONTAINS(loom_errmsg(), "missing: 2");
	}
	return 0;
}

TEST(comm_rank_claimed_twice)
{
	char dir[512];
	const char *env[] = {"LOOM_TIMEOUT_S=20", NULL}, *env1[] = {"LOOM_TIMEOUT_S=1", NULL};
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_EQ(test_spawn(4, rank_same_id, dir, 30, env), 0);
	test_rmdir(dir);
	CHECK_EQ(test_spawn(3, rank_twice, NULL, 20, env1), 0);
	return 0;
}

/* A rank that joins and leaves at once (loom_comm_destroy right after init, as `loom train --check`'s
 * quick ranks do with their sub-communicators) while another is still in its join: the join succeeds
 * on both. LOOM_TEST_JOIN_PAUSE_S holds rank 0, the sub-group's leader, for 0.5 s after it has found
 * rank 1 missing and handed it the segment, so rank 1 has joined and left before rank 0 looks at it
 * again. */
static int rank_quick_leave(int rank, int n, void *arg)
{
	loom_comm_t *c, *sub;
	(void)n, (void)arg;
	CHECK_OK(loom_comm_init(&c));
	if (rank == 0) { /* the sub-group's leader: rank 1 is already asking for its offer */
		usleep(300000);
		setenv("LOOM_TEST_JOIN_PAUSE_S", "0.5", 1);
	}
	CHECK_OK(loom_comm_split(c, 0, rank, &sub));
	unsetenv("LOOM_TEST_JOIN_PAUSE_S");
	CHECK_OK(loom_comm_destroy(sub));
	CHECK_OK(loom_comm_destroy(c));
	return 0;
}

TEST(comm_join_then_quick_leave)
{
	const char *env[] = {"LOOM_TIMEOUT_S=20", NULL};
	CHECK_EQ(test_spawn(2, rank_quick_leave, NULL, 30, env), 0);
	return 0;
}
