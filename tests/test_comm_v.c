/* test_comm_v.c: the progress engine (one thread per process, communicators progressing
 * independently), point to point beyond send/recv (sendrecv, isend, irecv) and the v-collectives
 * (allgatherv, reduce_scatterv, blocking and not), each run as forked ranks under a timeout, with
 * exact expected values. */
#include <dirent.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/util.h"
#include "loom/comm.h"
#include "test.h"

/* Threads of this process (entries of /proc/self/task). */
static int thread_count(void)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;
	int n = 0;
	if (!d)
		return -1;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

/* ---- the progress engine --------------------------------------------------------------------- */

enum { BIG = 300007 }; /* several ring segments with LOOM_RING_SEG small, many transport steps */

static int check_sum(const float *x, size_t n, int ranks, float scale)
{
	for (size_t i = 0; i < n; i++) {
		float want = scale * (float)(ranks * (int)(i % 101) + ranks * (ranks - 1) / 2);
		if (x[i] != want)
			TEST_FAIL_("x[%zu] = %g, expected %g", i, x[i], want);
	}
	return 0;
}

static void fill(float *x, size_t n, int rank, float scale)
{
	for (size_t i = 0; i < n; i++)
		x[i] = scale * (float)((int)(i % 101) + rank);
}

/* Three communicators over the same ranks; non-blocking collectives on A and B issued in opposite
 * orders on even and odd ranks, isend/irecv on C in flight meanwhile. One progress thread runs all
 * of them: the thread count grows by exactly one, and shrinks back when the communicators go. */
static int rank_engine(int rank, int n, void *arg)
{
	loom_comm_t *w, *a, *b, *p;
	loom_request_t *ra, *rb, *rs, *rr, *rs2, *rr2;
	float *xa = malloc(BIG * sizeof *xa), *xb = malloc(BIG * sizeof *xb);
	int64_t out[2] = {rank, rank * 10}, in[2] = {-1, -1}, out2 = rank + 100, in2 = -1;
	int t0, t1, right = (rank + 1) % n, left = (rank + n - 1) % n;
	(void)arg;
	CHECK(xa && xb);
	CHECK_EQ(thread_count(), 1);
	CHECK_OK(loom_comm_init(&w));
	CHECK_OK(loom_comm_split(w, 0, rank, &a));
	CHECK_OK(loom_comm_split(w, 0, rank, &b));
	CHECK_OK(loom_comm_split(w, 0, rank, &p));
	t0 = thread_count(); /* main + the liveness keeper */
	CHECK_EQ(t0, 2);
	for (int round = 0; round < 3; round++) {
		fill(xa, BIG, rank, 1), fill(xb, BIG, rank, 2);
		if (rank % 2 == 0) {
			CHECK_OK(loom_iallreduce(a, xa, xa, BIG, LOOM_FLOAT32, LOOM_SUM, &ra));
			CHECK_OK(loom_iallreduce(b, xb, xb, BIG, LOOM_FLOAT32, LOOM_SUM, &rb));
		} else {
			usleep(20000); /* the even ranks' A and B are then surely waiting */
			CHECK_OK(loom_iallreduce(b, xb, xb, BIG, LOOM_FLOAT32, LOOM_SUM, &rb));
			CHECK_OK(loom_iallreduce(a, xa, xa, BIG, LOOM_FLOAT32, LOOM_SUM, &ra));
		}
		CHECK_OK(loom_irecv(p, in, 2, LOOM_INT64, left, 7, &rr));
		CHECK_OK(loom_irecv(p, &in2, 1, LOOM_INT64, left, 8, &rr2));
		CHECK_OK(loom_isend(p, out, 2, LOOM_INT64, right, 7, &rs));
		CHECK_OK(loom_isend(p, &out2, 1, LOOM_INT64, right, 8, &rs2));
		t1 = thread_count();
		CHECK_EQ(t1, t0 + 1);
		if (rank % 2) { /* complete in yet another order */
			CHECK_OK(loom_wait(rs2));
			CHECK_OK(loom_wait(rr2));
			CHECK_OK(loom_wait(ra));
			CHECK_OK(loom_wait(rb));
		} else {
			CHECK_OK(loom_wait(rb));
			CHECK_OK(loom_wait(ra));
			CHECK_OK(loom_wait(rr2));
			CHECK_OK(loom_wait(rs2));
		}
		CHECK_OK(loom_wait(rr));
		CHECK_OK(loom_wait(rs));
		CHECK_EQ(in[0], left);
		CHECK_EQ(in[1], left * 10);
		CHECK_EQ(in2, left + 100);
		if (check_sum(xa, BIG, n, 1) || check_sum(xb, BIG, n, 2))
			return 1;
	}
	/* a blocking collective on A while B's non-blocking one is in flight, issued in different orders */
	{
		int64_t s = rank, v = rank;
		if (rank % 2 == 0) {
			CHECK_OK(loom_iallreduce(b, &v, &v, 1, LOOM_INT64, LOOM_SUM, &rb));
			CHECK_OK(loom_allreduce(a, &s, &s, 1, LOOM_INT64, LOOM_SUM));
		} else {
			CHECK_OK(loom_allreduce(a, &s, &s, 1, LOOM_INT64, LOOM_SUM));
			CHECK_OK(loom_iallreduce(b, &v, &v, 1, LOOM_INT64, LOOM_SUM, &rb));
		}
		CHECK_OK(loom_wait(rb));
		CHECK_EQ(s, n * (n - 1) / 2);
		CHECK_EQ(v, n * (n - 1) / 2);
	}
	CHECK_OK(loom_comm_destroy(a));
	CHECK_OK(loom_comm_destroy(b));
	CHECK_EQ(thread_count(), t0 + 1); /* p and w may still use it */
	CHECK_OK(loom_comm_destroy(p));
	CHECK_OK(loom_comm_destroy(w));
	CHECK_EQ(thread_count(), 1);
	free(xa);
	free(xb);
	return 0;
}

TEST(comm_engine_cross_order)
{
	const char *seg[] = {"LOOM_RING_SEG=65536", NULL};
	CHECK_EQ(test_spawn(2, rank_engine, NULL, 60, NULL), 0);
	CHECK_EQ(test_spawn(3, rank_engine, NULL, 60, seg), 0);
	return 0;
}
