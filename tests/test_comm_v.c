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

/* Failures while operations of several communicators are in flight on the engine (the waits then
 * yield instead of sleeping, and must still notice a lost peer and the deadline). arg: 0 rank 2
 * exits without loom_comm_destroy, 1 rank 2 is late (LOOM_TIMEOUT_S=1). */
static int rank_engine_fail(int rank, int n, void *arg)
{
	int how = *(int *)arg;
	loom_comm_t *w, *a, *b;
	loom_request_t *ra, *rb, *rr;
	float *x = malloc(BIG * sizeof *x), *y = malloc(BIG * sizeof *y), z = 0;
	double t0, dt;
	(void)n;
	CHECK(x && y);
	CHECK_OK(loom_comm_init(&w));
	CHECK_OK(loom_comm_split(w, 0, rank, &a));
	CHECK_OK(loom_comm_split(w, 0, rank, &b));
	fill(x, BIG, rank, 1), fill(y, BIG, rank, 1);
	if (rank == 2) {
		if (how == 0) {
			usleep(200000); /* the others are waiting in the engine by now */
			_exit(0);
		}
		usleep(2500000); /* well past the others' deadline */
		CHECK_OK(loom_iallreduce(a, x, x, BIG, LOOM_FLOAT32, LOOM_SUM, &ra));
		CHECK_ERR(loom_wait(ra), LOOM_ETIMEDOUT);
		CHECK_CONTAINS(loom_errmsg(), "unusable after an earlier failure");
		goto out;
	}
	t0 = loom_now();
	CHECK_OK(loom_iallreduce(a, x, x, BIG, LOOM_FLOAT32, LOOM_SUM, &ra));
	CHECK_OK(loom_iallreduce(b, y, y, BIG, LOOM_FLOAT32, LOOM_SUM, &rb));
	CHECK_OK(loom_irecv(b, &z, 1, LOOM_FLOAT32, 2, 0, &rr));
	CHECK_ERR(loom_wait(ra), how ? LOOM_ETIMEDOUT : LOOM_EPEERLOST);
	CHECK_CONTAINS(loom_errmsg(), how ? "ranks that had not arrived: 2" : "rank 2");
	CHECK_CONTAINS(loom_errmsg(), "allreduce #");
	CHECK_ERR(loom_wait(rb), how ? LOOM_ETIMEDOUT : LOOM_EPEERLOST);
	CHECK_ERR(loom_wait(rr), how ? LOOM_ETIMEDOUT : LOOM_EPEERLOST);
	CHECK_CONTAINS(loom_errmsg(), "irecv");
	dt = loom_now() - t0;
	CHECK_MSG(how ? dt > 0.9 && dt < 2.4 : dt < 2.0, "failing took %.3f s", dt);
out:
	CHECK_OK(loom_comm_destroy(a));
	CHECK_OK(loom_comm_destroy(b));
	CHECK_OK(loom_comm_destroy(w));
	free(x);
	free(y);
	return 0;
}

TEST(comm_engine_failures)
{
	int death = 0, late = 1;
	const char *env[] = {"LOOM_TIMEOUT_S=20", NULL}, *tmo[] = {"LOOM_TIMEOUT_S=1", NULL};
	CHECK_EQ(test_spawn(3, rank_engine_fail, &death, 30, env), 0);
	CHECK_EQ(test_spawn(3, rank_engine_fail, &late, 30, tmo), 0);
	return 0;
}

/* ---- point to point: sendrecv, isend, irecv ------------------------------------------------------ */

/* Elements rank r sends to rank d in message k (int64 pattern truncated to the dtype's size). */
static size_t p2p_count(int r, int d, int k)
{
	size_t base[] = {0, 1, 37, 70001}; /* 70001 x 8 bytes: more than all slots of a channel */
	return (r + d + k) % 5 == 3 ? 0 : base[(r * 3 + d + k) % 4];
}

static unsigned char p2p_byte(int r, int d, int k, size_t b)
{
	return (unsigned char)(b * 7 + (size_t)r * 31 + (size_t)d * 5 + (size_t)k * 11 + 1);
}

static void p2p_fill(unsigned char *buf, size_t bytes, int r, int d, int k)
{
	for (size_t b = 0; b < bytes; b++)
		buf[b] = p2p_byte(r, d, k, b);
}

static int p2p_check(const unsigned char *buf, size_t bytes, int r, int d, int k)
{
	for (size_t b = 0; b < bytes; b++)
		if (buf[b] != p2p_byte(r, d, k, b))
			TEST_FAIL_("message %d from rank %d to %d: byte %zu is %d, expected %d", k, r, d, b, buf[b],
			           p2p_byte(r, d, k, b));
	return 0;
}

enum { NMSG = 4 };

static int rank_p2p(int rank, int n, void *arg)
{
	loom_comm_t *c, *other;
	int right = (rank + 1) % n, left = (rank + n - 1) % n;
	size_t cap = 70001 * 8;
	unsigned char *sbuf[2][NMSG], *rbuf[2][NMSG];
	int registered = *(int *)arg;
	CHECK_OK(loom_comm_init(&c));
	CHECK_OK(loom_comm_split(c, 0, 0, &other));
	for (int s = 0; s < 2; s++)
		for (int k = 0; k < NMSG; k++) {
			sbuf[s][k] = registered ? loom_comm_alloc(c, cap) : malloc(cap);
			rbuf[s][k] = registered ? loom_comm_alloc(c, cap) : malloc(cap);
			CHECK(sbuf[s][k] && rbuf[s][k]);
		}
	/* sendrecv around the ring, every dtype, uneven and zero counts; with n == 1 it is a copy */
	for (int dt = 0; dt < LOOM_DTYPE_COUNT; dt++) {
		size_t es = loom_dtype_size((loom_dtype_t)dt);
		for (int k = 0; k < NMSG; k++) {
			size_t sc = p2p_count(rank, right, k) * 8 / es, rc = p2p_count(left, rank, k) * 8 / es;
			p2p_fill(sbuf[0][k], sc * es, rank, right, k);
			memset(rbuf[0][k], 0, cap);
			CHECK_OK(loom_sendrecv(c, sbuf[0][k], sc, right, rbuf[0][k], rc, left, (loom_dtype_t)dt, 100 + k));
			if (p2p_check(rbuf[0][k], rc * es, left, rank, k))
				return 1;
		}
	}
	if (n == 1) {
		loom_request_t *r = (loom_request_t *)1;
		CHECK_ERR(loom_isend(c, sbuf[0][0], 1, LOOM_FLOAT32, 0, 0, &r), LOOM_EINVAL);
		CHECK(r == NULL);
		goto out;
	}
	/* sendrecv with one peer both ways (a pipeline neighbour) */
	if (!(n % 2 == 1 && rank == n - 1)) {
		int peer = rank ^ 1;
		int64_t mine[3] = {rank, rank * 2, rank * 3}, got[3] = {0};
		CHECK_OK(loom_sendrecv(c, mine, 3, peer, got, 3, peer, LOOM_INT64, 5));
		CHECK_EQ(got[0], peer);
		CHECK_EQ(got[2], peer * 3);
	}
	/* Several isends / irecvs in flight both ways around the ring, with a non-blocking all-reduce on
	 * this communicator and another on a second one; completed in an order unlike issue order. */
	for (int round = 0; round < 2; round++) {
		loom_request_t *rs[2][NMSG], *rr[2][NMSG], *ar, *ao;
		int64_t x = rank + 1, y = 2 * rank;
		for (int k = 0; k < NMSG; k++) {
			memset(rbuf[0][k], 0, cap);
			memset(rbuf[1][k], 0, cap);
			CHECK_OK(loom_irecv(c, rbuf[0][k], p2p_count(left, rank, k), LOOM_INT64, left, k, &rr[0][k]));
			/* with 2 ranks left == right: both directions' messages share one channel, in this order */
			CHECK_OK(loom_irecv(c, rbuf[1][k], p2p_count(right, rank, k + 1), LOOM_INT64, right, 10 + k, &rr[1][k]));
		}
		CHECK_OK(loom_iallreduce(c, &x, &x, 1, LOOM_INT64, LOOM_SUM, &ar));
		for (int k = 0; k < NMSG; k++) {
			p2p_fill(sbuf[0][k], p2p_count(rank, right, k) * 8, rank, right, k);
			p2p_fill(sbuf[1][k], p2p_count(rank, left, k + 1) * 8, rank, left, k + 1);
			CHECK_OK(loom_isend(c, sbuf[0][k], p2p_count(rank, right, k), LOOM_INT64, right, k, &rs[0][k]));
			if (k == 1)
				CHECK_OK(loom_iallreduce(other, &y, &y, 1, LOOM_INT64, LOOM_MAX, &ao));
			CHECK_OK(loom_isend(c, sbuf[1][k], p2p_count(rank, left, k + 1), LOOM_INT64, left, 10 + k, &rs[1][k]));
		}
		for (int k = NMSG - 1; k >= 0; k--) {
			CHECK_OK(loom_wait(rr[0][k]));
			CHECK_OK(loom_wait(rr[1][k]));
			if (p2p_check(rbuf[0][k], p2p_count(left, rank, k) * 8, left, rank, k) ||
			    p2p_check(rbuf[1][k], p2p_count(right, rank, k + 1) * 8, right, rank, k + 1))
				return 1;
		}
		CHECK_OK(loom_wait(ao));
		CHECK_OK(loom_wait(ar));
		for (int k = 0; k < NMSG; k++) {
			int done = 0;
			while (!done)
				CHECK_OK(loom_test(rs[k % 2][k], &done));
			CHECK_OK(loom_wait(rs[1 - k % 2][k]));
		}
		CHECK_EQ(x, n * (n + 1) / 2);
		CHECK_EQ(y, 2 * (n - 1));
	}
	/* blocking calls after non-blocking ones on the same channel keep issue order */
	{
		loom_request_t *r1, *r2;
		int32_t a = rank, b = -1, d = -1, e = -1;
		CHECK_OK(loom_irecv(c, &b, 1, LOOM_INT32, left, 1, &r1));
		CHECK_OK(loom_isend(c, &a, 1, LOOM_INT32, right, 1, &r2));
		CHECK_OK(loom_send(c, &a, 1, LOOM_INT32, right, 2));
		CHECK_OK(loom_recv(c, &d, 1, LOOM_INT32, left, 2));
		CHECK_OK(loom_sendrecv(c, &a, 1, right, &e, 1, left, LOOM_INT32, 3));
		CHECK_OK(loom_wait(r1));
		CHECK_OK(loom_wait(r2));
		CHECK_EQ(b, left);
		CHECK_EQ(d, left);
		CHECK_EQ(e, left);
	}
	/* errors: at issue, with no request */
	{
		loom_request_t *r = (loom_request_t *)1;
		float f = 0;
		CHECK_ERR(loom_isend(c, &f, 1, LOOM_FLOAT32, rank, 0, &r), LOOM_EINVAL);
		CHECK(r == NULL);
		CHECK_CONTAINS(loom_comm_errmsg(c), "peer");
		CHECK_ERR(loom_irecv(c, &f, 1, LOOM_FLOAT32, n, 0, &r), LOOM_EINVAL);
		CHECK_ERR(loom_irecv(c, NULL, 1, LOOM_FLOAT32, left, 0, &r), LOOM_EINVAL);
		CHECK_ERR(loom_isend(c, &f, 1, (loom_dtype_t)77, right, 0, &r), LOOM_EINVAL);
		CHECK_ERR(loom_isend(c, &f, 1, LOOM_FLOAT32, right, 0, NULL), LOOM_EINVAL);
		CHECK_ERR(loom_sendrecv(c, &f, 1, -1, &f, 1, left, LOOM_FLOAT32, 0), LOOM_EINVAL);
		CHECK_ERR(loom_sendrecv(c, &f, 1, right, &f, 1, rank, LOOM_FLOAT32, 0), LOOM_EINVAL);
	}
out:
	CHECK_OK(loom_barrier(c));
	for (int s = 0; s < 2; s++)
		for (int k = 0; k < NMSG; k++) {
			if (registered) {
				loom_comm_free(c, sbuf[s][k]);
				loom_comm_free(c, rbuf[s][k]);
			} else {
				free(sbuf[s][k]);
				free(rbuf[s][k]);
			}
		}
	CHECK_OK(loom_comm_destroy(other));
	CHECK_OK(loom_comm_destroy(c));
	return 0;
}

TEST(comm_p2p_nonblocking)
{
	int plain = 0, registered = 1;
	for (int n = 1; n <= 5; n++)
		CHECK_EQ(test_spawn(n, rank_p2p, n % 2 ? &plain : &registered, 60, NULL), 0);
	CHECK_EQ(test_spawn(2, rank_p2p, &plain, 60, NULL), 0);
	CHECK_EQ(test_spawn(3, rank_p2p, &registered, 60, NULL), 0);
	return 0;
}

/* ---- v-collectives ----------------------------------------------------------------------------- */

/* The v-collectives' values and layouts for every dtype and op are in test_collectives.c's matrix
 * (send == recv in place, ordinary and shared-heap buffers). Here: the other in-place form, several
 * in flight at once with other non-blocking operations, large shared-heap messages and errors. */

static size_t v_count(int q, int n, size_t big)
{
	(void)n;
	return q % 3 == 1 ? 0 : q % 3 == 2 ? big / 3 + 1 : big + (size_t)q;
}

static int64_t v_val(int r, size_t i)
{
	return (int64_t)(i % 1009) * 3 + r;
}

static int rank_v(int rank, int n, void *arg)
{
	loom_comm_t *c, *other;
	size_t big = *(size_t *)arg, counts[8], displ[9] = {0};
	int64_t *a, *b, *g, *s;
	float f[4] = {0};
	CHECK_OK(loom_comm_init(&c));
	CHECK_OK(loom_comm_split(c, 0, -rank, &other)); /* reversed ranks */
	for (int q = 0; q < n; q++) {
		counts[q] = v_count(q, n, big);
		displ[q + 1] = displ[q] + counts[q];
	}
	size_t total = displ[n], mine = counts[rank];
	a = loom_comm_alloc(c, total * 8 + 8);
	b = loom_comm_alloc(c, total * 8 + 8);
	g = malloc(total * 8 + 8);
	s = malloc(total * 8 + 8);
	CHECK(a && b && g && s);
	for (int round = 0; round < 2; round++) {
		loom_request_t *ra, *rb, *rg, *rx;
		double x = rank;
		/* allgatherv in place (send == recv + displ) and reduce_scatterv in place (recv == send + displ),
		 * both on shared-heap buffers, with a plain allgatherv and an all-reduce on another communicator */
		for (size_t i = 0; i < total; i++) {
			a[i] = i >= displ[rank] && i < displ[rank] + mine ? v_val(rank, i) : -1;
			b[i] = v_val(rank, i);
		}
		for (size_t i = 0; i < mine; i++)
			s[i] = v_val(rank, displ[rank] + i);
		memset(g, 0, total * 8);
		CHECK_OK(loom_iallgatherv(c, a + displ[rank], mine, a, counts, LOOM_INT64, &ra));
		CHECK_OK(loom_iallreduce(other, &x, &x, 1, LOOM_FLOAT64, round ? LOOM_AVG : LOOM_SUM, &rx));
		CHECK_OK(loom_ireduce_scatterv(c, b, b + displ[rank], counts, LOOM_INT64, round ? LOOM_MAX : LOOM_SUM, &rb));
		CHECK_OK(loom_iallgatherv(c, s, mine, g, counts, LOOM_INT64, &rg));
		counts[0] = 12345; /* the non-blocking calls copied the counts */
		CHECK_OK(loom_wait(rg));
		CHECK_OK(loom_wait(rx));
		CHECK_OK(loom_wait(rb));
		CHECK_OK(loom_wait(ra));
		counts[0] = v_count(0, n, big);
		for (int q = 0; q < n; q++)
			for (size_t i = displ[q]; i < displ[q + 1]; i++) {
				if (a[i] != v_val(q, i) || g[i] != v_val(q, i))
					TEST_FAIL_("allgatherv [%zu] (rank %d's block): %lld, %lld, expected %lld", i, q,
					           (long long)a[i], (long long)g[i], (long long)v_val(q, i));
			}
		for (size_t i = 0; i < mine; i++) {
			size_t e = displ[rank] + i;
			int64_t want = round ? v_val(n - 1, e) : (int64_t)(e % 1009) * 3 * n + n * (n - 1) / 2;
			if (b[e] != want)
				TEST_FAIL_("reduce_scatterv [%zu]: %lld, expected %lld", e, (long long)b[e], (long long)want);
		}
		CHECK_FEQ(x, round ? n * (n - 1) / 2.0 * (1.0 / n) : n * (n - 1) / 2.0);
	}
	/* reduce_scatterv with AVG on floats, send == recv (the result goes to the front) */
	{
		float *v = (float *)s;
		for (size_t i = 0; i < total; i++)
			v[i] = (float)(i % 7) + (float)rank;
		CHECK_OK(loom_reduce_scatterv(c, v, v, counts, LOOM_FLOAT32, LOOM_AVG));
		for (size_t i = 0; i < mine; i++) {
			float sum = (float)(n * (int)((displ[rank] + i) % 7) + n * (n - 1) / 2);
			CHECK_FEQ(v[i], sum * (1.0f / (float)n));
		}
	}
	/* errors */
	{
		loom_request_t *r = (loom_request_t *)1;
		CHECK_ERR(loom_allgatherv(c, s, mine + 1, g, counts, LOOM_INT64), LOOM_EINVAL);
		CHECK_CONTAINS(loom_comm_errmsg(c), "sendcount");
		CHECK_CONTAINS(loom_comm_errmsg(c), "recvcounts[");
		CHECK_ERR(loom_iallgatherv(c, s, mine + 1, g, counts, LOOM_INT64, &r), LOOM_EINVAL);
		CHECK(r == NULL);
		CHECK_ERR(loom_reduce_scatterv(c, s, g, NULL, LOOM_INT64, LOOM_SUM), LOOM_EINVAL);
		CHECK_CONTAINS(loom_comm_errmsg(c), "recvcounts is NULL");
		CHECK_ERR(loom_reduce_scatterv(c, s, g, counts, LOOM_INT64, LOOM_AVG), LOOM_EINVAL);
		CHECK_ERR(loom_reduce_scatterv(c, NULL, g, counts, LOOM_INT64, LOOM_SUM), total ? LOOM_EINVAL : LOOM_OK);
		CHECK_ERR(loom_allgatherv(c, f, 1, f, NULL, LOOM_FLOAT32), LOOM_EINVAL);
	}
	/* all counts zero, NULL buffers */
	{
		size_t zero[8] = {0};
		CHECK_OK(loom_allgatherv(c, NULL, 0, NULL, zero, LOOM_FLOAT32));
		CHECK_OK(loom_reduce_scatterv(c, NULL, NULL, zero, LOOM_BFLOAT16, LOOM_MIN));
	}
	loom_comm_free(c, a);
	loom_comm_free(c, b);
	free(g);
	free(s);
	CHECK_OK(loom_comm_destroy(other));
	CHECK_OK(loom_comm_destroy(c));
	return 0;
}

TEST(comm_v_collectives)
{
	size_t small = 5, large = 400000; /* large: several ring segments (LOOM_RING_SEG below) */
	const char *seg[] = {"LOOM_RING_SEG=262144", NULL}, *debug[] = {"LOOM_DEBUG=1", NULL};
	for (int n = 1; n <= 5; n++)
		CHECK_EQ(test_spawn(n, rank_v, &small, 60, NULL), 0);
	CHECK_EQ(test_spawn(3, rank_v, &small, 60, debug), 0); /* fingerprints of v-collectives agree */
	CHECK_EQ(test_spawn(2, rank_v, &large, 60, seg), 0);
	CHECK_EQ(test_spawn(4, rank_v, &large, 90, seg), 0);
	return 0;
}

/* ---- settings: loom_comm_init_opts and knobs that must agree -------------------------------------- */

/* arg names a knob that rank 1 sets differently; every rank's init fails naming it and the ranks. */
static int rank_knob_mismatch(int rank, int n, void *arg)
{
	const char *knob = arg;
	loom_comm_t *c = (loom_comm_t *)1;
	loom_comm_opts_t o;
	(void)n;
	loom_comm_opts_default(&o);
	if (rank == 1 && strcmp(knob, "ring_seg_bytes") == 0)
		o.ring_seg_bytes = 1 << 20; /* through the options instead of the environment */
	else if (rank == 1)
		setenv(knob, strcmp(knob, "LOOM_SHM_MB") == 0 ? "64" : "65536", 1);
	CHECK_ERR(loom_comm_init_opts(&c, &o), LOOM_EINVAL);
	CHECK(c == NULL);
	CHECK_CONTAINS(loom_errmsg(), strcmp(knob, "ring_seg_bytes") == 0 ? "LOOM_RING_SEG" : knob);
	CHECK_CONTAINS(loom_errmsg(), "differs between ranks");
	CHECK_CONTAINS(loom_errmsg(), rank == 1 ? "rank(s) 0, 2" : "rank(s) 1;");
	return 0;
}

static int rank_opts(int rank, int n, void *arg)
{
	loom_comm_t *c = NULL;
	loom_comm_opts_t o;
	float x[3] = {1, 2, (float)rank};
	void *p;
	(void)arg;
	loom_comm_opts_default(&o);
	o.ring_seg_bytes = 10;
	CHECK_ERR(loom_comm_init_opts(&c, &o), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "ring_seg_bytes");
	loom_comm_opts_default(&o);
	o.algo = "allreduce:nonsense";
	CHECK_ERR(loom_comm_init_opts(&c, &o), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "opts.algo");
	/* the environment says otherwise on rank 1; the options, equal everywhere, win */
	if (rank == 1)
		setenv("LOOM_ALGO", "allreduce:rd", 1);
	loom_comm_opts_default(&o);
	o.algo = "allreduce:ring";
	o.heap_bytes = 4 << 20;
	o.ring_seg_bytes = 4096;
	o.debug = 1;
	o.timeout_s = 20;
	CHECK_OK(loom_comm_init_opts(&c, &o));
	CHECK(loom_comm_alloc(c, 8 << 20) == NULL); /* the heap is 4 MiB */
	p = loom_comm_alloc(c, 1 << 20);
	CHECK(p != NULL);
	CHECK_OK(loom_allreduce(c, x, x, 3, LOOM_FLOAT32, LOOM_SUM));
	CHECK_FEQ(x[0], n);
	CHECK_FEQ(x[2], n * (n - 1) / 2);
	loom_comm_free(c, p);
	CHECK_OK(loom_comm_destroy(c));
	return 0;
}

TEST(comm_init_opts)
{
	CHECK_EQ(test_spawn(3, rank_knob_mismatch, "LOOM_RING_SEG", 20, NULL), 0);
	CHECK_EQ(test_spawn(3, rank_knob_mismatch, "LOOM_SHM_INPLACE_MIN", 20, NULL), 0);
	CHECK_EQ(test_spawn(3, rank_knob_mismatch, "LOOM_SHM_MB", 20, NULL), 0);
	CHECK_EQ(test_spawn(3, rank_knob_mismatch, "ring_seg_bytes", 20, NULL), 0);
	CHECK_EQ(test_spawn(2, rank_opts, NULL, 20, NULL), 0);
	return 0;
}
