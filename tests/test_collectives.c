/* test_collectives.c: every collective x every algorithm that implements it x rank counts
 * {1,2,3,4,5,8} x counts {0, 1, 7, size-1, 1000003} x dtypes x ops, in place and out of place, on
 * ordinary and on loom_comm_alloc (single-copy) buffers, against a reference computed in double;
 * plus LOOM_ALGO parsing and the selection rule.
 *
 * Values are small integers (|v| <= 5, int64 also carries rank << 33), so every partial sum is
 * exact in every dtype, bfloat16 included, whatever order an algorithm adds in: results must match
 * the reference exactly. LOOM_AVG is checked against the kernel's definition (exact sum, then one
 * multiplication by 1/size rounded in the dtype). Each rank count is one spawn; the algorithm is
 * forced per call through the communicator's LOOM_ALGO choice (comm_internal.h). For allgather and
 * reduce_scatter the per-rank count of the large case is ceil(1000003 / size), so the whole vector
 * stays near 1000003 elements. The large case covers every collective x algorithm x dtype with sum,
 * every op on float32, in place and out of place; the small counts cover everything. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comm/algo/algo.h"
#include "comm/comm_internal.h"
#include "core/util.h"
#include "loom/comm.h"
#include "test.h"

#define BIG 1000003u
#define GUARD 64 /* bytes past every receive buffer that must stay untouched */

/* Element i of rank r's input: periodic in i with period 11, distinct across ranks 0..10. */
static double val(int r, size_t i, loom_dtype_t dt)
{
	double v = (double)((i * 7 + (size_t)r * 5) % 11) - 5;
	if (dt == LOOM_INT64)
		v += (double)((int64_t)r << 33);
	return v;
}

static float bf16_to_f32(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static uint16_t f32_to_bf16(float f) /* round to nearest even; test values are never NaN */
{
	uint32_t u;
	memcpy(&u, &f, 4);
	u += 0x7fffu + ((u >> 16) & 1u);
	return (uint16_t)(u >> 16);
}

static void put(void *b, size_t i, loom_dtype_t dt, double v)
{
	switch (dt) {
	case LOOM_FLOAT32: ((float *)b)[i] = (float)v; break;
	case LOOM_FLOAT64: ((double *)b)[i] = v; break;
	case LOOM_BFLOAT16: ((uint16_t *)b)[i] = f32_to_bf16((float)v); break;
	case LOOM_INT32: ((int32_t *)b)[i] = (int32_t)v; break;
	case LOOM_INT64: ((int64_t *)b)[i] = (int64_t)v; break;
	default: break;
	}
}

static double get(const void *b, size_t i, loom_dtype_t dt)
{
	switch (dt) {
	case LOOM_FLOAT32: return ((const float *)b)[i];
	case LOOM_FLOAT64: return ((const double *)b)[i];
	case LOOM_BFLOAT16: return bf16_to_f32(((const uint16_t *)b)[i]);
	case LOOM_INT32: return ((const int32_t *)b)[i];
	case LOOM_INT64: return (double)((const int64_t *)b)[i];
	default: return 0;
	}
}

/* The reduction over ranks of element i, as loom defines it. */
static double expect(int n, size_t i, loom_dtype_t dt, loom_op_t op)
{
	double s = val(0, i, dt);
	for (int r = 1; r < n; r++) {
		double v = val(r, i, dt);
		s = op == LOOM_MAX ? (v > s ? v : s) : op == LOOM_MIN ? (v < s ? v : s) : s + v;
	}
	if (op != LOOM_AVG)
		return s;
	if (dt == LOOM_FLOAT32)
		return (float)s * (1.0f / (float)n);
	if (dt == LOOM_BFLOAT16)
		return bf16_to_f32(f32_to_bf16((float)s * (1.0f / (float)n)));
	return s * (1.0 / n);
}

typedef struct {
	loom_coll_t coll;
	loom_algo_t algo;
	size_t count;
	loom_dtype_t dt;
	loom_op_t op;
	int inplace, registered, root;
} case_t;

/* Buffers reused by every case of one rank (the large case would otherwise spend its time in page
 * faults): ordinary and shared-heap pairs, each big enough for the largest vector plus GUARD. */
typedef struct {
	char *buf[2][2]; /* [registered][send, recv] */
	size_t cap;
} bufs_t;

static int fail_case(loom_comm_t *c, const case_t *k, const char *what, size_t i, double got, double want)
{
	fprintf(stderr, "  rank %d/%d %s algo=%s count=%zu %s %s %s %s root=%d: %s [%zu] got %.17g want %.17g\n",
	        loom_comm_rank(c), loom_comm_size(c), loom_coll_name(k->coll), loom_algo_name(k->algo), k->count,
	        loom_dtype_name(k->dt), loom_op_name(k->op), k->inplace ? "in-place" : "out-of-place",
	        k->registered ? "registered" : "malloc", k->root, what, i, got, want);
	return 1;
}

static int run_case(loom_comm_t *c, bufs_t *B, const case_t *k)
{
	int r = loom_comm_rank(c), n = loom_comm_size(c);
	size_t cnt = k->count, esz = loom_dtype_size(k->dt);
	size_t sn = k->coll == LOOM_COLL_REDUCE_SCATTER ? (size_t)n * cnt : cnt; /* send elements */
	size_t rn = k->coll == LOOM_COLL_ALLGATHER ? (size_t)n * cnt : cnt;      /* recv elements */
	/* The v-collectives: uneven blocks (cnt, 0, cnt/2, cnt, 0, ...) at offsets displ. */
	size_t vc[16], displ[17] = {0};
	for (int q = 0; q < n && q < 16; q++) {
		vc[q] = q % 3 == 1 ? 0 : q % 3 == 2 ? cnt / 2 : cnt;
		displ[q + 1] = displ[q] + vc[q];
	}
	if (k->coll == LOOM_COLL_ALLGATHERV)
		sn = vc[r], rn = displ[n];
	if (k->coll == LOOM_COLL_REDUCE_SCATTERV)
		sn = displ[n], rn = vc[r];
	size_t bbytes = (k->inplace && sn > rn ? sn : rn) * esz; /* bytes of the receive buffer */
	char *sb = B->buf[k->registered][0], *rb = B->buf[k->registered][1];
	if ((sn > rn ? sn : rn) * esz + GUARD > B->cap)
		return fail_case(c, k, "test buffers too small", 0, 0, 0);
	memset(rb, 0xA5, bbytes + GUARD);
	/* Inputs: element i of this rank's contribution is val(r, global index). */
	size_t sfirst = k->coll == LOOM_COLL_ALLGATHER ? (size_t)r * cnt : k->coll == LOOM_COLL_ALLGATHERV ? displ[r] : 0;
	for (size_t i = 0; i < sn; i++)
		put(sb, i, k->dt, val(r, sfirst + i, k->dt));
	if (k->coll == LOOM_COLL_BROADCAST && r == k->root)
		for (size_t i = 0; i < cnt; i++)
			put(rb, i, k->dt, val(r, i, k->dt));
	const void *send = sb;
	void *recv = rb;
	if (k->inplace) {
		memcpy(rb, sb, sn * esz);
		send = rb;
	}
	c->forced[k->coll] = k->algo;
	int rc;
	switch (k->coll) {
	case LOOM_COLL_ALLREDUCE: rc = loom_allreduce(c, send, recv, cnt, k->dt, k->op); break;
	case LOOM_COLL_REDUCE: rc = loom_reduce(c, send, recv, cnt, k->dt, k->op, k->root); break;
	case LOOM_COLL_BROADCAST: rc = loom_broadcast(c, recv, cnt, k->dt, k->root); break;
	case LOOM_COLL_ALLGATHER: rc = loom_allgather(c, send, recv, cnt, k->dt); break;
	case LOOM_COLL_REDUCE_SCATTER: rc = loom_reduce_scatter(c, send, recv, cnt, k->dt, k->op); break;
	case LOOM_COLL_ALLGATHERV: rc = loom_allgatherv(c, send, vc[r], recv, vc, k->dt); break;
	case LOOM_COLL_REDUCE_SCATTERV: rc = loom_reduce_scatterv(c, send, recv, vc, k->dt, k->op); break;
	default: rc = loom_barrier(c); break;
	}
	c->forced[k->coll] = LOOM_ALGO_AUTO;
	if (rc != LOOM_OK) {
		fprintf(stderr, "  error %d (%s): %s\n", rc, loom_strerror(rc), loom_comm_errmsg(c));
		return fail_case(c, k, "call failed", 0, rc, 0);
	}
	if (k->coll == LOOM_COLL_BARRIER)
		return 0;
	int nonroot = k->coll == LOOM_COLL_REDUCE && r != k->root;
	double reduced[11]; /* val() has period 11 in i, so the reference does too */
	for (size_t j = 0; j < 11; j++)
		reduced[j] = expect(n, j, k->dt, k->op);
	for (size_t i = 0; i < rn; i++) {
		double want, got = get(rb, i, k->dt);
		switch (k->coll) {
		case LOOM_COLL_ALLGATHER: want = val((int)(i / cnt), i, k->dt); break;
		case LOOM_COLL_BROADCAST: want = val(k->root, i, k->dt); break;
		case LOOM_COLL_REDUCE_SCATTER: want = reduced[((size_t)r * cnt + i) % 11]; break;
		case LOOM_COLL_ALLGATHERV: {
			int q = 0;
			while (i >= displ[q + 1])
				q++;
			want = val(q, i, k->dt);
			break;
		}
		case LOOM_COLL_REDUCE_SCATTERV: want = reduced[(displ[r] + i) % 11]; break;
		default: want = reduced[i % 11]; break;
		}
		if (nonroot && k->inplace)
			want = val(r, i, k->dt); /* a non-root's input must be left alone */
		if (nonroot && !k->inplace)
			break; /* checked below: not one byte written */
		if (got != want)
			return fail_case(c, k, nonroot ? "non-root input modified" : "result", i, got, want);
	}
	for (size_t i = nonroot && !k->inplace ? 0 : bbytes; i < bbytes + GUARD; i++)
		if ((unsigned char)rb[i] != 0xA5)
			return fail_case(c, k, nonroot ? "non-root recv written" : "byte past the buffer written", i,
			                 (unsigned char)rb[i], 0xA5);
	for (size_t i = 0; !k->inplace && k->coll != LOOM_COLL_BROADCAST && i < sn; i++) {
		double want = val(r, sfirst + i, k->dt);
		if (get(sb, i, k->dt) != want)
			return fail_case(c, k, "send buffer modified", i, get(sb, i, k->dt), want);
	}
	return 0;
}

/* arg: NULL for every algorithm, or a loom_algo_t * to run only that one. */
static int matrix_rank(int rank, int n, void *arg)
{
	(void)rank;
	const loom_algo_t *only = arg;
	loom_comm_t *c;
	bufs_t B = {.cap = ((size_t)BIG + (size_t)n) * 8 + GUARD};
	int fails = 0;
	CHECK_OK(loom_comm_init(&c));
	for (int i = 0; i < 2; i++) {
		B.buf[0][i] = malloc(B.cap);
		B.buf[1][i] = loom_comm_alloc(c, B.cap);
		CHECK(B.buf[0][i] && B.buf[1][i]);
	}
	size_t counts[] = {0, 1, 7, (size_t)n - 1, BIG};
	int iter = 0;
	for (int coll = 0; coll < LOOM_COLL_COUNT; coll++) {
		for (int algo = 1; algo < LOOM_ALGO_COUNT; algo++) {
			if (!loom_algo_impl((loom_coll_t)coll, (loom_algo_t)algo) || (only && *only != (loom_algo_t)algo))
				continue;
			int rooted = coll == LOOM_COLL_REDUCE || coll == LOOM_COLL_BROADCAST;
			int data = coll != LOOM_COLL_BARRIER;
			for (size_t ci = 0; ci < LOOM_ARRAY_LEN(counts); ci++) {
				int big = counts[ci] == BIG;
				if (!data && ci > 0)
					break; /* a barrier has no count */
				size_t cnt = counts[ci];
				if (big && (coll == LOOM_COLL_ALLGATHER || coll == LOOM_COLL_REDUCE_SCATTER ||
				            coll == LOOM_COLL_ALLGATHERV || coll == LOOM_COLL_REDUCE_SCATTERV))
					cnt = (BIG + (size_t)n - 1) / (size_t)n;
				for (int dt = 0; dt < (data ? LOOM_DTYPE_COUNT : 1); dt++) {
					for (int op = 0; op < (data ? LOOM_OP_COUNT : 1); op++) {
						if (op == LOOM_AVG && dt >= LOOM_INT32)
							continue;
						if (big && op != LOOM_SUM && dt != LOOM_FLOAT32)
							continue;
						for (int inplace = 0; inplace < (data && coll != LOOM_COLL_BROADCAST ? 2 : 1); inplace++) {
							case_t k = {(loom_coll_t)coll, (loom_algo_t)algo, cnt, (loom_dtype_t)dt,
							            (loom_op_t)op, inplace, 0, rooted ? iter % n : 0};
							/* Registered buffers: always for small counts, every other case when large. */
							for (int reg = 0; reg < 2; reg++) {
								if (big && reg != (iter & 1))
									continue;
								k.registered = reg;
								fails += run_case(c, &B, &k);
								if (fails)
									goto out;
							}
							iter++;
						}
					}
				}
			}
		}
	}
out:
	for (int i = 0; i < 2; i++) {
		free(B.buf[0][i]);
		loom_comm_free(c, B.buf[1][i]);
	}
	CHECK_OK(loom_comm_destroy(c));
	return fails;
}

TEST(collectives_matrix_1) { return test_spawn(1, matrix_rank, NULL, 60, NULL); }
TEST(collectives_matrix_2) { return test_spawn(2, matrix_rank, NULL, 60, NULL); }
TEST(collectives_matrix_3) { return test_spawn(3, matrix_rank, NULL, 60, NULL); }
TEST(collectives_matrix_4) { return test_spawn(4, matrix_rank, NULL, 90, NULL); }
TEST(collectives_matrix_5) { return test_spawn(5, matrix_rank, NULL, 90, NULL); }
TEST(collectives_matrix_8) { return test_spawn(8, matrix_rank, NULL, 120, NULL); }

/* The ring's segment boundaries, which the default 4 MiB segments never reach at these counts:
 * 666668-byte segments make the 1000003-element vector's blocks at 3 ranks end in a segment of one
 * element (float32: 166667 + 166667 + 1) or an empty one (the shorter blocks, 2 x 166667); 4000
 * bytes give hundreds of segments at 2 ranks. */
TEST(collectives_ring_segments)
{
	static const loom_algo_t ring = LOOM_ALGO_RING;
	const char *odd[] = {"LOOM_RING_SEG=666668", NULL}, *many[] = {"LOOM_RING_SEG=4000", NULL};
	CHECK_EQ(test_spawn(3, matrix_rank, (void *)&ring, 60, odd), 0);
	CHECK_EQ(test_spawn(2, matrix_rank, (void *)&ring, 60, many), 0);
	return 0;
}

/* Every algorithm on sub-communicators: 5 ranks split into {0,2,4} (reversed by key) and {1,3}, both
 * groups running at once, small and medium counts, every op on float32 and sum on the rest. */
static int split_rank(int rank, int n, void *arg)
{
	(void)n, (void)arg;
	loom_comm_t *world, *c;
	bufs_t B = {.cap = 3 * 4099 * 8 + GUARD};
	int fails = 0, iter = 0;
	CHECK_OK(loom_comm_init(&world));
	CHECK_OK(loom_comm_split(world, rank % 2, -rank, &c));
	CHECK(c != NULL);
	CHECK_EQ(loom_comm_size(c), rank % 2 ? 2 : 3);
	for (int i = 0; i < 2; i++) {
		B.buf[0][i] = malloc(B.cap);
		B.buf[1][i] = loom_comm_alloc(c, B.cap);
		CHECK(B.buf[0][i] && B.buf[1][i]);
	}
	size_t counts[] = {7, 4099};
	for (int coll = 0; coll < LOOM_COLL_COUNT && !fails; coll++)
		for (int algo = 1; algo < LOOM_ALGO_COUNT && !fails; algo++) {
			if (!loom_algo_impl((loom_coll_t)coll, (loom_algo_t)algo))
				continue;
			for (size_t ci = 0; ci < 2 && !fails; ci++)
				for (int dt = 0; dt < LOOM_DTYPE_COUNT && !fails; dt++)
					for (int op = 0; op < LOOM_OP_COUNT && !fails; op++, iter++) {
						if ((op != LOOM_SUM && dt != LOOM_FLOAT32) || (coll == LOOM_COLL_BARRIER && (dt || op)))
							continue;
						case_t k = {(loom_coll_t)coll, (loom_algo_t)algo, counts[ci], (loom_dtype_t)dt,
						            (loom_op_t)op, iter & 1, (iter >> 1) & 1, iter % loom_comm_size(c)};
						if (coll == LOOM_COLL_BROADCAST)
							k.inplace = 0;
						fails += run_case(c, &B, &k);
					}
		}
	for (int i = 0; i < 2; i++) {
		free(B.buf[0][i]);
		loom_comm_free(c, B.buf[1][i]);
	}
	CHECK_OK(loom_comm_destroy(c));
	CHECK_OK(loom_comm_destroy(world));
	return fails;
}

TEST(collectives_split) { return test_spawn(5, split_rank, NULL, 60, NULL); }

/* The reduction kernels against a scalar reference, for every dtype and op, out of place and with
 * out aliasing either input (they are vectorized with `omp simd`), and bfloat16 rounding. */
TEST(reduce_kernels)
{
	enum { N = 1003 };
	static double ra[N], rb[N];
	static char a[N * 8], b[N * 8], out[N * 8 + 8];
	for (size_t i = 0; i < N; i++) {
		ra[i] = (double)((int)(i * 37 % 201) - 100) / 4.0; /* quarters: exact in every float type */
		rb[i] = (double)((int)(i * 53 % 197) - 98) * 3.0;
	}
	for (int dt = 0; dt < LOOM_DTYPE_COUNT; dt++) {
		size_t esz = loom_dtype_size((loom_dtype_t)dt);
		for (int op = 0; op < LOOM_OP_COUNT; op++) {
			for (int alias = 0; alias < 3; alias++) { /* out separate, out == a, out == b */
				size_t n = alias == 0 ? N : N - (size_t)dt; /* odd lengths exercise the loop tails */
				for (size_t i = 0; i < n; i++) {
					put(a, i, (loom_dtype_t)dt, dt >= LOOM_INT32 ? floor(ra[i]) : ra[i]);
					put(b, i, (loom_dtype_t)dt, rb[i]);
				}
				memset(out, 0x5A, sizeof out);
				void *o = alias == 0 ? (void *)out : alias == 1 ? (void *)a : (void *)b;
				loom_reduce_local(o, a, b, n, (loom_dtype_t)dt, (loom_op_t)op);
				for (size_t i = 0; i < n; i++) {
					double x = dt >= LOOM_INT32 ? floor(ra[i]) : ra[i], y = rb[i];
					double want = op == LOOM_MAX ? (x > y ? x : y) : op == LOOM_MIN ? (x < y ? x : y) : x + y;
					if (dt == LOOM_BFLOAT16) /* inputs rounded to bfloat16, sum in float, rounded back */
						want = op == LOOM_MAX || op == LOOM_MIN
						               ? bf16_to_f32(f32_to_bf16((float)want))
						               : bf16_to_f32(f32_to_bf16(bf16_to_f32(f32_to_bf16((float)x)) +
						                                         bf16_to_f32(f32_to_bf16((float)y))));
					double got = get(o, i, (loom_dtype_t)dt);
					CHECK_MSG(got == want, "%s %s alias %d [%zu]: %.9g op %.9g = %.9g, want %.9g",
					          loom_dtype_name((loom_dtype_t)dt), loom_op_name((loom_op_t)op), alias, i, x, y, got,
					          want);
				}
				if (alias == 0)
					CHECK_EQ((unsigned char)out[n * esz], 0x5A);
			}
		}
	}
	/* scale: buf *= 1/n in the dtype */
	float f[5] = {3, -6, 9, 1, 0};
	loom_scale_local(f, 5, LOOM_FLOAT32, 3);
	CHECK_FEQ(f[0], 3.0f * (1.0f / 3.0f));
	CHECK_FEQ(f[1], -6.0f * (1.0f / 3.0f));
	CHECK_FEQ(f[4], 0);
	uint16_t h[2] = {f32_to_bf16(3.0f), f32_to_bf16(-1.0f)};
	loom_scale_local(h, 2, LOOM_BFLOAT16, 3);
	CHECK_FEQ(bf16_to_f32(h[0]), bf16_to_f32(f32_to_bf16(3.0f * (1.0f / 3.0f))));
	CHECK_FEQ(bf16_to_f32(h[1]), bf16_to_f32(f32_to_bf16(-1.0f / 3.0f)));
	int32_t iv[2] = {7, -7};
	loom_scale_local(iv, 2, LOOM_INT32, 2); /* integers are never scaled (avg is an error for them) */
	CHECK_EQ(iv[0], 7);
	return 0;
}

TEST(algo_parse)
{
	loom_algo_t ch[LOOM_COLL_COUNT];
	char err[256];
	CHECK_OK(loom_algo_parse("allreduce:ring,allgather:rd", ch, err, sizeof err));
	CHECK_EQ(ch[LOOM_COLL_ALLREDUCE], LOOM_ALGO_RING);
	CHECK_EQ(ch[LOOM_COLL_ALLGATHER], LOOM_ALGO_RD);
	CHECK_EQ(ch[LOOM_COLL_REDUCE], LOOM_ALGO_AUTO);
	CHECK_EQ(ch[LOOM_COLL_BARRIER], LOOM_ALGO_AUTO);
	CHECK_OK(loom_algo_parse("reduce_scatter:rhd,barrier:tree,broadcast:auto,", ch, err, sizeof err));
	CHECK_EQ(ch[LOOM_COLL_REDUCE_SCATTER], LOOM_ALGO_RHD);
	CHECK_EQ(ch[LOOM_COLL_BARRIER], LOOM_ALGO_TREE);
	CHECK_EQ(ch[LOOM_COLL_BROADCAST], LOOM_ALGO_AUTO);
	CHECK_EQ(ch[LOOM_COLL_ALLREDUCE], LOOM_ALGO_AUTO);
	CHECK_OK(loom_algo_parse("", ch, err, sizeof err));
	CHECK_OK(loom_algo_parse(NULL, ch, err, sizeof err));

	CHECK_ERR(loom_algo_parse("allreduce:ring,allgathr:rd", ch, err, sizeof err), LOOM_EINVAL);
	CHECK_CONTAINS(err, "unknown operation \"allgathr\"");
	CHECK_CONTAINS(err, "allreduce, reduce, broadcast, allgather, reduce_scatter, barrier");
	CHECK_ERR(loom_algo_parse("allreduce:fast", ch, err, sizeof err), LOOM_EINVAL);
	CHECK_CONTAINS(err, "unknown algorithm \"fast\" for allreduce");
	CHECK_CONTAINS(err, "auto, ring, rhd, rd, tree");
	CHECK_ERR(loom_algo_parse("allgather:tree", ch, err, sizeof err), LOOM_EINVAL);
	CHECK_CONTAINS(err, "\"tree\" does not implement allgather");
	CHECK_CONTAINS(err, "auto, ring, rd");
	CHECK_ERR(loom_algo_parse("reduce:ring", ch, err, sizeof err), LOOM_EINVAL);
	CHECK_CONTAINS(err, "auto, tree");
	CHECK_ERR(loom_algo_parse("allreduce", ch, err, sizeof err), LOOM_EINVAL);
	CHECK_CONTAINS(err, "not OP:ALGO");
	CHECK_ERR(loom_algo_parse("allreduce:", ch, err, sizeof err), LOOM_EINVAL);
	CHECK_ERR(loom_algo_parse("allreduce:ring,allreduce:ringringringringringringringringringringringringringringring",
	                          ch, err, sizeof err), LOOM_EINVAL);
	CHECK_CONTAINS(err, "is too long");
	return 0;
}

TEST(algo_select_rule)
{
	/* A forced algorithm wins when it implements the operation. */
	CHECK_EQ(loom_algo_select(LOOM_COLL_ALLREDUCE, 2, 8, LOOM_ALGO_TREE), LOOM_ALGO_TREE);
	CHECK_EQ(loom_algo_select(LOOM_COLL_ALLREDUCE, 8, 64 << 20, LOOM_ALGO_RD), LOOM_ALGO_RD);
	/* The rule never answers AUTO and only names algorithms that implement the operation. */
	size_t sizes[] = {0, 8, 4096, 65536, 1 << 20, 16u << 20, 256u << 20};
	for (int coll = 0; coll < LOOM_COLL_COUNT; coll++)
		for (int n = 1; n <= 16; n++)
			for (size_t s = 0; s < LOOM_ARRAY_LEN(sizes); s++) {
				loom_algo_t a = loom_algo_select((loom_coll_t)coll, n, sizes[s], LOOM_ALGO_AUTO);
				CHECK_MSG(a != LOOM_ALGO_AUTO && loom_algo_impl((loom_coll_t)coll, a), "%s n=%d bytes=%zu -> %s",
				          loom_coll_name((loom_coll_t)coll), n, sizes[s], loom_algo_name(a));
			}
	/* Small all-reduces are latency-bound (recursive doubling); large ones at 2 ranks use the ring. */
	CHECK_EQ(loom_algo_select(LOOM_COLL_ALLREDUCE, 2, 8, LOOM_ALGO_AUTO), LOOM_ALGO_RD);
	CHECK_EQ(loom_algo_select(LOOM_COLL_ALLREDUCE, 2, 64u << 20, LOOM_ALGO_AUTO), LOOM_ALGO_RING);
	CHECK_STREQ(loom_coll_name(LOOM_COLL_REDUCE_SCATTER), "reduce_scatter");
	CHECK_STREQ(loom_algo_name(LOOM_ALGO_RHD), "rhd");
	return 0;
}

/* LOOM_ALGO from the environment reaches the communicator; a bad value makes init fail. */
static int env_algo_rank(int rank, int n, void *arg)
{
	(void)rank, (void)n, (void)arg;
	loom_comm_t *c;
	CHECK_OK(loom_comm_init(&c));
	CHECK_EQ(c->forced[LOOM_COLL_ALLREDUCE], LOOM_ALGO_TREE);
	CHECK_EQ(c->forced[LOOM_COLL_ALLGATHER], LOOM_ALGO_RD);
	CHECK_EQ(c->forced[LOOM_COLL_BROADCAST], LOOM_ALGO_AUTO);
	float x[3] = {1, 2, 3}, y[3];
	CHECK_OK(loom_allreduce(c, x, y, 3, LOOM_FLOAT32, LOOM_SUM));
	CHECK_FEQ(y[2], 3 * n);
	CHECK_OK(loom_comm_destroy(c));
	return 0;
}

static int env_bad_rank(int rank, int n, void *arg)
{
	(void)rank, (void)n, (void)arg;
	loom_comm_t *c = (loom_comm_t *)1;
	CHECK_ERR(loom_comm_init(&c), LOOM_EINVAL);
	CHECK(c == NULL);
	CHECK_CONTAINS(loom_errmsg(), "does not implement allgather");
	return 0;
}

TEST(algo_env)
{
	const char *good[] = {"LOOM_ALGO=allreduce:tree,allgather:rd", NULL};
	const char *bad[] = {"LOOM_ALGO=allreduce:ring,allgather:tree", NULL};
	CHECK_EQ(test_spawn(2, env_algo_rank, NULL, 30, good), 0);
	CHECK_EQ(test_spawn(2, env_bad_rank, NULL, 30, bad), 0);
	return 0;
}

/* Every data line of `loom bench comm` output ends in a #wrong of 0; returns how many lines. */
static int bench_lines_ok(const char *out, int *wrong_lines)
{
	int lines = 0;
	*wrong_lines = 0;
	for (const char *p = out; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
		const char *q = p;
		if (strncmp(q, "[rank 0] ", 9) == 0)
			q += 9;
		while (*q == ' ')
			q++;
		if (*q < '0' || *q > '9')
			continue;
		const char *end = strchr(q, '\n'), *last = end ? end : q + strlen(q);
		while (last > q && last[-1] == ' ')
			last--;
		const char *tok = last;
		while (tok > q && tok[-1] != ' ')
			tok--;
		lines++;
		if (!(last - tok == 1 && *tok == '0'))
			(*wrong_lines)++;
	}
	return lines;
}

TEST(bench_comm_smoke)
{
	static char out[1 << 16];
	char cmd[512];
	int wrong;
	snprintf(cmd, sizeof cmd,
	         "%s run --nproc-per-node 3 --ranks 0 %s bench comm --op all --min-bytes 8 --max-bytes 64K --iters 3 "
	         "--registered 1 --verbose",
	         test_loom_bin(), test_loom_bin());
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 60), 0);
	CHECK_CONTAINS(out, "memcpy baseline");
	CHECK_CONTAINS(out, "# allreduce      rd if ");
	CHECK_CONTAINS(out, "busbw");
	CHECK_CONTAINS(out, "# reduce_scatter\n");
	CHECK_CONTAINS(out, "   tree ");
	/* 14 sizes (8 B .. 64 KiB) x 5 operations, all correct */
	CHECK_EQ(bench_lines_ok(out, &wrong), 14 * 5);
	CHECK_EQ(wrong, 0);

	snprintf(cmd, sizeof cmd, "%s bench comm --algo tree --op allgather", test_loom_bin());
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 30), 2);
	CHECK_CONTAINS(out, "\"tree\" does not implement allgather");
	snprintf(cmd, sizeof cmd, "%s bench comm --op alltoall", test_loom_bin());
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 30), 2);
	CHECK_CONTAINS(out, "--op: 'alltoall' is not");
	return 0;
}
