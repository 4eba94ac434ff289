/* mn_prog.c: a rank program for the multi-node tests (tests/test_multinode.c), started by mpirun
 * across the two-host cluster (scripts/netns-cluster.sh).
 *   mn_prog coll   the collective matrix: every collective, dtype and op, counts 0 to 16 MiB, in
 *                  place and not, on the world, on sub-communicators across and inside hosts, and on
 *                  the axes of a dp 2 x tp 2 mesh (tp inside a host, dp across)
 *   mn_prog die    world rank 3 kills itself after an all-reduce; the others keep reducing
 *   mn_prog loop   all-reduce every 0.1 s until killed (the test kills a whole host)
 *   mn_prog mismatch  host 0's ranks all-reduce float32, host 1's int32 of the same count (the same
 *                  bytes): on a communicator across hosts with loom's algorithms forced for the
 *                  inter-host phase (the MPI transport's sendrecv), then on the world with the
 *                  pipelined two-host exchange; each must fail with LOOM_EMISMATCH naming both
 *                  signatures
 *   mn_prog rootmismatch  broadcasts whose ranks disagree on the root and whose sends all go out
 *                  eagerly: across hosts (then destroy), and on the world (host 0 against host 1,
 *                  then a barrier); each must fail with LOOM_EMISMATCH naming both calls
 * Prints "rank R of N: ok" and exits 0, or says what differed and exits 1. Values are small
 * integers, so every dtype and op has one exact answer. */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "loom/comm.h"
#include "loom/mesh.h"

static int bad;

static double val(int r, size_t i)
{
	return (double)((i * 7 + (size_t)r * 3) % 11 + 1);
}

static void put(void *p, size_t i, loom_dtype_t dt, double v)
{
	float f = (float)v;
	uint32_t u;
	switch (dt) {
	case LOOM_FLOAT32: ((float *)p)[i] = f; break;
	case LOOM_BFLOAT16: memcpy(&u, &f, 4); ((uint16_t *)p)[i] = (uint16_t)(u >> 16); break;
	case LOOM_FLOAT64: ((double *)p)[i] = v; break;
	case LOOM_INT32: ((int32_t *)p)[i] = (int32_t)v; break;
	default: ((int64_t *)p)[i] = (int64_t)v; break;
	}
}

static double get(const void *p, size_t i, loom_dtype_t dt)
{
	float f;
	uint32_t u;
	switch (dt) {
	case LOOM_FLOAT32: return ((const float *)p)[i];
	case LOOM_BFLOAT16: u = (uint32_t)((const uint16_t *)p)[i] << 16; memcpy(&f, &u, 4); return f;
	case LOOM_FLOAT64: return ((const double *)p)[i];
	case LOOM_INT32: return ((const int32_t *)p)[i];
	default: return (double)((const int64_t *)p)[i];
	}
}

static double reduced(int n, size_t i, loom_op_t op)
{
	double s = 0, mx = -1e30, mn = 1e30;
	for (int r = 0; r < n; r++) {
		double v = val(r, i);
		s += v, mx = v > mx ? v : mx, mn = v < mn ? v : mn;
	}
	return op == LOOM_SUM ? s : op == LOOM_AVG ? s / n : op == LOOM_MAX ? mx : mn;
}

static void check(loom_comm_t *c, const char *what, const void *p, size_t i, loom_dtype_t dt, double want)
{
	double got = get(p, i, dt);
	if (got != want && bad++ < 5)
		fprintf(stderr, "rank %d of %d: %s: [%zu] = %g, expected %g\n", loom_comm_rank(c), loom_comm_size(c), what, i,
		        got, want);
}


static int fail(loom_comm_t *c, const char *what, int rc)
{
	fprintf(stderr, "rank %d: %s failed: %s: %s\n", loom_comm_rank(c), what, loom_strerror(rc), loom_comm_errmsg(c));
	return 1;
}

/* Every collective on c for count elements of dt and op (inplace: send == recv where allowed). */
static int one(loom_comm_t *c, const char *tag, size_t count, loom_dtype_t dt, loom_op_t op, int inplace)
{
	int r = loom_comm_rank(c), n = loom_comm_size(c), rc = 0, root = n - 1;
	size_t es = loom_dtype_size(dt), tot = count * (size_t)n;
	char *a = calloc(tot + 1, es), *b = calloc(tot + 1, es), what[160];
	size_t *counts = calloc((size_t)n, sizeof *counts);
	int can_avg = dt != LOOM_INT32 && dt != LOOM_INT64;
	if (!a || !b || !counts)
		return 1;
	if (op == LOOM_AVG && !can_avg)
		goto done;
	/* all-reduce */
	snprintf(what, sizeof what, "%s allreduce %zu %s %s%s", tag, count, loom_dtype_name(dt), loom_op_name(op),
	         inplace ? " in place" : "");
	for (size_t i = 0; i < count; i++)
		put(a, i, dt, val(r, i));
	if ((rc = loom_allreduce(c, a, inplace ? a : b, count, dt, op)))
		return fail(c, what, rc);
	for (size_t i = 0; i < count; i++)
		check(c, what, inplace ? a : b, i, dt, reduced(n, i, op));
	/* reduce */
	snprintf(what, sizeof what, "%s reduce %zu %s %s", tag, count, loom_dtype_name(dt), loom_op_name(op));
	for (size_t i = 0; i < count; i++)
		put(a, i, dt, val(r, i));
	if ((rc = loom_reduce(c, a, inplace && r == root ? a : b, count, dt, op, root)))
		return fail(c, what, rc);
	for (size_t i = 0; r == root && i < count; i++)
		check(c, what, inplace ? a : b, i, dt, reduced(n, i, op));
	/* reduce-scatter: block q of rank r's input holds val(r, q*count+i) */
	snprintf(what, sizeof what, "%s reduce_scatter %zu %s %s", tag, count, loom_dtype_name(dt), loom_op_name(op));
	for (size_t i = 0; i < tot; i++)
		put(a, i, dt, val(r, i));
	if ((rc = loom_reduce_scatter(c, a, b, count, dt, op)))
		return fail(c, what, rc);
	for (size_t i = 0; i < count; i++)
		check(c, what, b, i, dt, reduced(n, (size_t)r * count + i, op));
	if (op != LOOM_SUM)
		goto done;
	/* broadcast, all-gather, v-collectives (no op) */
	snprintf(what, sizeof what, "%s broadcast %zu %s", tag, count, loom_dtype_name(dt));
	for (size_t i = 0; i < count; i++)
		put(a, i, dt, r == 1 % n ? val(7, i) : 0);
	if ((rc = loom_broadcast(c, a, count, dt, 1 % n)))
		return fail(c, what, rc);
	for (size_t i = 0; i < count; i++)
		check(c, what, a, i, dt, val(7, i));
	snprintf(what, sizeof what, "%s allgather %zu %s", tag, count, loom_dtype_name(dt));
	for (size_t i = 0; i < count; i++)
		put(a, i, dt, val(r, i));
	if ((rc = loom_allgather(c, a, b, count, dt)))
		return fail(c, what, rc);
	for (size_t i = 0; i < tot; i++)
		check(c, what, b, i, dt, val((int)(i / (count ? count : 1)), i % (count ? count : 1)));
	for (int q = 0; q < n; q++)
		counts[q] = count ? count - (size_t)q % 2 * (count / 3) : 0;
	snprintf(what, sizeof what, "%s allgatherv %zu %s", tag, count, loom_dtype_name(dt));
	for (size_t i = 0; i < counts[r]; i++)
		put(a, i, dt, val(r, i));
	if ((rc = loom_allgatherv(c, a, counts[r], b, counts, dt)))
		return fail(c, what, rc);
	for (size_t q = 0, off = 0; q < (size_t)n; off += counts[q++])
		for (size_t i = 0; i < counts[q]; i++)
			check(c, what, b, off + i, dt, val((int)q, i));
	snprintf(what, sizeof what, "%s reduce_scatterv %zu %s", tag, count, loom_dtype_name(dt));
	for (size_t i = 0; i < tot; i++)
		put(a, i, dt, val(r, i));
	if ((rc = loom_reduce_scatterv(c, a, b, counts, dt, LOOM_SUM)))
		return fail(c, what, rc);
	{
		size_t off = 0;
		for (int q = 0; q < r; q++)
			off += counts[q];
		for (size_t i = 0; i < counts[r]; i++)
			check(c, what, b, i, dt, reduced(n, off + i, LOOM_SUM));
	}
	if ((rc = loom_barrier(c)))
		return fail(c, "barrier", rc);
done:
	free(a), free(b), free(counts);
	return bad ? 1 : 0;
}

static int matrix(loom_comm_t *c, const char *tag, int big)
{
	static const size_t counts[] = {0, 1, 3, 1000, 65537};
	for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++)
		for (int dt = 0; dt < LOOM_DTYPE_COUNT; dt++)
			for (int op = 0; op < LOOM_OP_COUNT; op++)
				if (one(c, tag, counts[k], (loom_dtype_t)dt, (loom_op_t)op, (int)(k + dt + op) % 2))
					return 1;
	/* 16 MiB of float32: the sizes where the hierarchy's phases are pipelined */
	if (big && (one(c, tag, 4u << 20, LOOM_FLOAT32, LOOM_SUM, 1) || one(c, tag, 4u << 20, LOOM_FLOAT32, LOOM_AVG, 0)))
		return 1;
	return 0;
}

/* One all-reduce of 1000 elements, float32 on host 0 (world ranks 0, 1) and int32 on host 1: it must
 * fail with LOOM_EMISMATCH and a message naming both calls. */
static int mismatch_on(loom_comm_t *c, int world_rank, const char *what, int pipe)
{
	static char buf[4000];
	loom_dtype_t dt = world_rank < 2 ? LOOM_FLOAT32 : LOOM_INT32;
	const char *msg, *algo = loom_comm_algo(c, "allreduce", sizeof buf);
	int rc;
	if (!algo || (strcmp(algo, "h-pipe") == 0) != pipe || strcmp(algo, "h-mpi") == 0) {
		fprintf(stderr, "rank %d: %s: the all-reduce would run as %s\n", world_rank, what, algo ? algo : "?");
		return 1;
	}
	rc = loom_allreduce(c, buf, buf, 1000, dt, LOOM_SUM);
	msg = loom_comm_errmsg(c);
	printf("rank %d: %s (%s): %s: %s\n", world_rank, what, algo, loom_strerror(rc), msg ? msg : "");
	if (rc != LOOM_EMISMATCH || !msg || !strstr(msg, "allreduce") || !strstr(msg, "count 1000, float32, op sum") ||
	    !strstr(msg, "count 1000, int32, op sum")) {
		fprintf(stderr, "rank %d: %s: expected LOOM_EMISMATCH naming both signatures, got %d\n", world_rank, what, rc);
		return 1;
	}
	return 0;
}

static int mismatch(loom_comm_t *c)
{
	loom_comm_t *cross;
	int r = loom_comm_rank(c), rc;
	if ((rc = loom_comm_split(c, loom_comm_local_rank(c), r, &cross)))
		return fail(c, "split across hosts", rc);
	setenv("LOOM_HIER_ALLREDUCE", "loom", 1); /* the same on every rank */
	if (mismatch_on(cross, r, "cross", 0))
		return 1;
	unsetenv("LOOM_HIER_ALLREDUCE");
	if (mismatch_on(c, r, "world", 1))
		return 1;
	fflush(stderr);
	printf("rank %d of %d: ok\n", r, loom_comm_size(c));
	fflush(stdout);
	return 0;
}

/* "<kind> #" twice (both calls named) and root values a and b. */
static int names_both(const char *msg, const char *kind, int a, int b)
{
	char ra[32], rb[32];
	const char *p = msg ? strstr(msg, kind) : NULL;
	snprintf(ra, sizeof ra, "root %d)", a);
	snprintf(rb, sizeof rb, "root %d)", b);
	return p && strstr(p + 1, kind) && strstr(msg, "mismatched collective calls") && strstr(msg, ra) && strstr(msg, rb);
}

/* Root mismatches that leave no message received: across hosts, two ranks (one per host) each the
 * root of a small broadcast, then destroy; on the world, host 0's ranks say root 0 and host 1's
 * root 2 (the same-host groups agree; the cross-host exchange does not), then a barrier. */
static int rootmismatch(loom_comm_t *c)
{
	static float buf[1000];
	loom_comm_t *cross;
	int r = loom_comm_rank(c), rc, rc2;
	const char *msg;
	if ((rc = loom_comm_split(c, loom_comm_local_rank(c), r, &cross)))
		return fail(c, "split across hosts", rc);
	rc = loom_broadcast(cross, buf, 1000, LOOM_FLOAT32, loom_comm_rank(cross));
	msg = loom_comm_errmsg(cross);
	rc2 = loom_comm_destroy(cross);
	if (rc == LOOM_OK)
		msg = loom_errmsg(), rc = rc2;
	printf("rank %d: cross broadcast, then destroy: %s: %s\n", r, loom_strerror(rc), msg);
	if (rc != LOOM_EMISMATCH || !names_both(msg, "broadcast #", 0, 1)) {
		fprintf(stderr, "rank %d: cross: expected LOOM_EMISMATCH naming both broadcasts\n", r);
		return 1;
	}
	rc = loom_broadcast(c, buf, 1000, LOOM_FLOAT32, r < 2 ? 0 : 2);
	if (rc == LOOM_OK)
		rc = loom_barrier(c);
	msg = loom_comm_errmsg(c);
	printf("rank %d: world broadcast, then barrier: %s: %s\n", r, loom_strerror(rc), msg);
	if (rc != LOOM_EMISMATCH || !strstr(msg, "broadcast #") || !strstr(msg, "mismatched collective calls")) {
		fprintf(stderr, "rank %d: world: expected LOOM_EMISMATCH naming the broadcast\n", r);
		return 1;
	}
	fflush(stderr);
	printf("rank %d of %d: ok\n", r, loom_comm_size(c));
	fflush(stdout);
	return 0;
}

int main(int argc, char **argv)
{
	loom_comm_t *c, *cross = NULL, *local = NULL;
	int rc, r, n;
	const char *mode = argc > 1 ? argv[1] : "coll";
	if ((rc = loom_comm_init(&c)) != LOOM_OK) {
		fprintf(stderr, "loom_comm_init failed: %s\n", loom_errmsg());
		return 1;
	}
	r = loom_comm_rank(c), n = loom_comm_size(c);
	if (strcmp(mode, "steps") == 0) { /* 50 all-reduces 0.1 s apart, then "ok" (link faults ride through) */
		float x[1000] = {0};
		double t0 = 0;
		for (int step = 0; step < 50; step++) {
			struct timespec ts;
			clock_gettime(CLOCK_MONOTONIC, &ts);
			t0 = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
			if ((rc = loom_allreduce(c, x, x, 1000, LOOM_FLOAT32, LOOM_SUM))) {
				clock_gettime(CLOCK_MONOTONIC, &ts);
				fprintf(stderr, "rank %d: step %d failed after %.1f s\n", r, step,
				        (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec - t0);
				return fail(c, "allreduce", rc);
			}
			usleep(100000);
		}
		loom_comm_destroy(c);
		printf("rank %d of %d: ok\n", r, n);
		return 0;
	}
	if (strcmp(mode, "die") == 0 || strcmp(mode, "loop") == 0) {
		float x[1000] = {0};
		for (int step = 0;; step++) {
			if (step == 3 && r == 3 && mode[0] == 'd')
				raise(SIGKILL);
			if ((rc = loom_allreduce(c, x, x, 1000, LOOM_FLOAT32, LOOM_SUM)))
				return fail(c, "allreduce", rc);
			usleep(100000);
		}
	}
	if (strcmp(mode, "mismatch") == 0)
		return mismatch(c);
	if (strcmp(mode, "rootmismatch") == 0)
		return rootmismatch(c);
	if (matrix(c, "world", 1))
		return 1;
	/* Sub-communicators: across hosts (same local rank) and inside a host (the mesh's axes). */
	if ((rc = loom_comm_split(c, loom_comm_local_rank(c), r, &cross)))
		return fail(c, "split across hosts", rc);
	if ((rc = loom_comm_split(c, r / 2, r, &local)))
		return fail(c, "split inside hosts", rc);
	if (matrix(cross, "cross", 0) || matrix(local, "local", 0))
		return 1;
	loom_comm_destroy(local);
	loom_comm_destroy(cross);
	/* A mesh dp 2 x tp 2: tp inside a host (consecutive ranks), dp across the hosts. */
	{
		loom_mesh_t *m;
		if ((rc = loom_mesh_create(&m, c, 2, 2, 1)))
			return fail(c, "loom_mesh_create", rc);
		for (int ax = LOOM_MESH_DP; ax <= LOOM_MESH_TP; ax++) {
			loom_comm_t *a = loom_mesh_comm(m, (loom_mesh_axis_t)ax);
			if (!a || one(a, loom_mesh_axis_name((loom_mesh_axis_t)ax), 65537, LOOM_FLOAT32, LOOM_AVG, 0) ||
			    one(a, loom_mesh_axis_name((loom_mesh_axis_t)ax), 1000, LOOM_INT64, LOOM_SUM, 1))
				return 1;
		}
		loom_mesh_destroy(m);
	}
	loom_comm_destroy(c);
	printf("rank %d of %d: ok\n", r, n);
	return 0;
}
