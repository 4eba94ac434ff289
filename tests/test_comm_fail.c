/* test_comm_fail.c: the communicator's failure paths, each run as forked ranks under a timeout: a
 * rank that dies (SIGKILL, exit without loom_comm_destroy) or leaves during a collective, in the
 * world and in a sub-group; the deadline (LOOM_TIMEOUT_S); mismatched collective calls with and
 * without LOOM_DEBUG. The harness also checks that no shared-memory segment is left behind. */
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
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
	} else {
		CHECK_CONTAINS(loom_comm_errmsg(c), "allreduce #1");
		CHECK_CONTAINS(loom_comm_errmsg(c), "bytes");
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

/* A segment left by an earlier job with the same id is refused with advice, not reused. */
static int rank_stale_segment(int rank, int n, void *arg)
{
	char id[64], path[96];
	loom_comm_t *c = NULL;
	FILE *f;
	(void)rank, (void)n, (void)arg;
	snprintf(id, sizeof id, "%s-stale", getenv("LOOM_JOB_ID"));
	snprintf(path, sizeof path, "/dev/shm/loom-%s", id);
	f = fopen(path, "w");
	CHECK(f != NULL);
	fclose(f);
	setenv("LOOM_JOB_ID", id, 1);
	CHECK_ERR(loom_comm_init(&c), LOOM_ESTATE);
	CHECK_CONTAINS(loom_errmsg(), "already exists");
	CHECK_CONTAINS(loom_errmsg(), path);
	unlink(path);
	return 0;
}

TEST(comm_join_failures)
{
	int first = 0, last = 2;
	const char *env[] = {"LOOM_TIMEOUT_S=0.3", NULL};
	CHECK_EQ(test_spawn(2, rank_join_timeout, &first, 20, env), 0);
	CHECK_EQ(test_spawn(3, rank_join_timeout, &last, 20, env), 0);
	CHECK_EQ(test_spawn(1, rank_stale_segment, NULL, 20, NULL), 0);
	return 0;
}
