/* bench_comm.c: `loom bench comm`: collective bandwidth and latency, measured and printed the way
 * nccl-tests does (size, count, type, redop, root, time, algbw, busbw, #wrong), plus the algorithm
 * each size used and a memcpy baseline.
 *
 * Run under a launcher: `loom run --nproc-per-node N loom bench comm ...`. Sizes grow by --step-factor
 * (default 2) from --min-bytes to --max-bytes (nccl-tests' -f, -b, -e; -n and -w are --iters and
 * --warmup); "size" is nccl-tests' (the whole vector; for allgather the gathered
 * result, for reduce_scatter the input). Buffers come from pools of at least 64 MiB (twice this
 * machine's last-level cache) and rotate through them, so small sizes do not run from a warm cache
 * that a training step would not have; the warm-up visits every slot once (a peer's first touch of
 * a registered page is a page fault a training loop pays once). Time per size is each rank's mean
 * over --iters (after --warmup), then the maximum over ranks; busbw = algbw x (2(n-1)/n for
 * allreduce, (n-1)/n for allgather and reduce_scatter, 1 for broadcast and reduce). #wrong counts
 * wrong elements (over all ranks) of one checked run per size with exactly representable values.
 * Only rank 0 prints; at the end, as nccl-tests does, the total of wrong values and the average busbw
 * over every size measured ("# Avg bus bandwidth"). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "loom/comm.h"
#include "loom/util.h"

#define POOL_MIN (64u << 20)

/* The benchmarked operations, in --op all order, named as loom/comm.h names them. */
typedef enum { OP_ALLREDUCE, OP_ALLGATHER, OP_REDUCE_SCATTER, OP_BROADCAST, OP_REDUCE, NOPS } op_t;
static const char *const op_names[NOPS] = {"allreduce", "allgather", "reduce_scatter", "broadcast", "reduce"};

static size_t zmax(size_t a, size_t b)
{
	return a > b ? a : b;
}

static long lmax(long a, long b)
{
	return a > b ? a : b;
}

typedef struct {
	loom_comm_t *c;
	int rank, n, registered, inplace, verbose;
	loom_dtype_t dt;
	loom_op_t redop;
	int root;
	long iters, warmup;
	size_t min_bytes, max_bytes;
	long factor;         /* sizes grow by this factor (-f) */
	char *spool, *rpool; /* rotating buffer pools */
	size_t pool;
	double busbw_sum;    /* rank 0: over every size measured, for the "Avg bus bandwidth" line */
	long measured;
	long long wrong_sum;
} bench_t;

static void usage(FILE *f)
{
	fprintf(f,
	        "usage: loom run --nproc-per-node N loom bench comm [--op allreduce|allgather|reduce_scatter|\n"
	        "         broadcast|reduce|all] [--min-bytes 8] [--max-bytes 256M] [--algo ALGO|OP:ALGO,...]\n"
	        "         [--registered 0|1] [--inplace 0|1] [--dtype float32] [--redop sum] [--root 0]\n"
	        "         [--iters N] [--warmup N] [--step-factor 2] [--verbose]\n"
	        "  nccl-tests' flags work too: -b MIN -e MAX -f FACTOR -n ITERS -w WARMUP.\n"
	        "  Prints nccl-tests' columns for sizes growing by --step-factor (-f, default 2) from --min-bytes\n"
	        "  (-b) to --max-bytes (-e) (K, M, G suffixes), then the wrong values and the average bus bandwidth\n"
	        "  over every size (\"# Avg bus bandwidth\").\n"
	        "  --algo forces an algorithm (ring, rhd, rd, tree) for the benchmarked operation(s), or takes a\n"
	        "  LOOM_ALGO value. --registered 1 uses loom_comm_alloc buffers (single-copy). --iters 0 (the\n"
	        "  default) picks the count from the size. --verbose prints the selection rule.\n");
}

static double bus_factor(op_t coll, int n)
{
	switch (coll) {
	case OP_ALLREDUCE: return 2.0 * (n - 1) / n;
	case OP_ALLGATHER:
	case OP_REDUCE_SCATTER: return (double)(n - 1) / n;
	default: return 1.0;
	}
}

/* Elements each rank sends and receives for a collective of nccl-tests size `count` (elements). */
static void coll_counts(op_t coll, size_t count, int n, size_t *scount, size_t *rcount)
{
	*scount = *rcount = count;
	if (coll == OP_ALLGATHER)
		*scount = count / (size_t)n;
	if (coll == OP_REDUCE_SCATTER)
		*rcount = count / (size_t)n;
}

static int run_once(bench_t *b, op_t coll, const void *send, void *recv, size_t count)
{
	size_t per = count / (size_t)b->n;
	const void *s = b->inplace ? recv : send;
	switch (coll) {
	case OP_ALLREDUCE: return loom_allreduce(b->c, s, recv, count, b->dt, b->redop);
	case OP_REDUCE: return loom_reduce(b->c, s, recv, count, b->dt, b->redop, b->root);
	case OP_BROADCAST: return loom_broadcast(b->c, recv, count, b->dt, b->root);
	case OP_ALLGATHER: return loom_allgather(b->c, s, recv, per, b->dt);
	case OP_REDUCE_SCATTER: return loom_reduce_scatter(b->c, s, recv, per, b->dt, b->redop);
	default: return loom_barrier(b->c);
	}
}

/* Test values: small integers, exact in every dtype and in every partial sum. */
static double val(int r, size_t i)
{
	return (double)((i + (size_t)r * 3) % 13);
}

static void put(void *p, size_t i, loom_dtype_t dt, double v)
{
	switch (dt) {
	case LOOM_FLOAT32: ((float *)p)[i] = (float)v; break;
	case LOOM_FLOAT64: ((double *)p)[i] = v; break;
	case LOOM_INT32: ((int32_t *)p)[i] = (int32_t)v; break;
	case LOOM_INT64: ((int64_t *)p)[i] = (int64_t)v; break;
	case LOOM_BFLOAT16: { /* small integers are exact: truncation is rounding here */
		float f = (float)v;
		uint32_t u;
		memcpy(&u, &f, 4);
		((uint16_t *)p)[i] = (uint16_t)(u >> 16);
		break;
	}
	default: break;
	}
}

static double get(const void *p, size_t i, loom_dtype_t dt)
{
	switch (dt) {
	case LOOM_FLOAT32: return ((const float *)p)[i];
	case LOOM_FLOAT64: return ((const double *)p)[i];
	case LOOM_INT32: return ((const int32_t *)p)[i];
	case LOOM_INT64: return (double)((const int64_t *)p)[i];
	case LOOM_BFLOAT16: {
		uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
		float f;
		memcpy(&f, &u, 4);
		return f;
	}
	default: return 0;
	}
}

/* One run with known inputs; returns the number of wrong elements on this rank (or -1 on error). */
static long long check_once(bench_t *b, op_t coll, size_t count)
{
	size_t sc, rc;
	coll_counts(coll, count, b->n, &sc, &rc);
	char *send = b->spool, *recv = b->rpool;
	int r = b->rank, n = b->n;
	for (size_t i = 0; i < sc; i++)
		put(b->inplace ? recv : send, i, b->dt, val(r, coll == OP_ALLGATHER ? r * sc + i : i));
	if (coll == OP_BROADCAST)
		for (size_t i = 0; i < rc; i++)
			put(recv, i, b->dt, r == b->root ? val(r, i) : -1);
	if (run_once(b, coll, send, recv, count))
		return -1;
	if (coll == OP_REDUCE && r != b->root)
		return 0;
	double want[13];
	for (size_t j = 0; j < 13; j++) {
		double s = val(0, j);
		for (int q = 1; q < n; q++) {
			double v = val(q, j);
			s = b->redop == LOOM_MAX ? (v > s ? v : s) : b->redop == LOOM_MIN ? (v < s ? v : s) : s + v;
		}
		if (b->redop == LOOM_AVG)
			s = b->dt == LOOM_FLOAT64 ? s * (1.0 / n) : (float)s * (1.0f / (float)n);
		want[j] = s;
	}
	long long wrong = 0;
	size_t base = coll == OP_REDUCE_SCATTER ? (size_t)r * rc : 0;
	for (size_t i = 0; i < rc; i++) {
		double w;
		if (coll == OP_ALLGATHER)
			w = val((int)(i / sc), i);
		else if (coll == OP_BROADCAST)
			w = val(b->root, i);
		else
			w = want[(base + i) % 13];
		double g = get(recv, i, b->dt);
		/* bfloat16 avg rounds 1/n products: allow its half-ulp */
		if (g != w && !(b->dt == LOOM_BFLOAT16 && b->redop == LOOM_AVG && (g - w) * (g - w) <= w * w / 65536.0))
			wrong++;
	}
	return wrong;
}

static int bench_size(bench_t *b, op_t coll, size_t bytes)
{
	size_t esz = loom_dtype_size(b->dt), unit = esz;
	if (coll == OP_ALLGATHER || coll == OP_REDUCE_SCATTER)
		unit *= (size_t)b->n;
	size_t count = bytes / unit * unit / esz, sc, rc;
	bytes = count * esz;
	coll_counts(coll, count, b->n, &sc, &rc);
	/* Rotate through page-aligned slots of the pools. */
	size_t slot = (zmax(sc, rc) * esz + 4095) & ~(size_t)4095;
	size_t nslots = slot ? zmax(1, b->pool / slot) : 1;
	long iters = b->iters;
	if (iters <= 0) {
		double want = (double)(1u << 30) / (double)(bytes ? bytes : 1);
		iters = want < 20 ? 20 : want > 10000 ? 10000 : (long)want;
	}
	long warmup = b->warmup >= 0 ? b->warmup : lmax(2, iters / 10);
	/* Warm up on every slot of the pools once: a peer's first read of a registered page costs it a
	 * page fault, which a training loop reusing its buffers pays once, not every step. */
	if (b->warmup < 0)
		warmup = lmax(warmup, nslots < (size_t)iters ? (long)nslots : iters);
	int rc_ = 0;
	for (long i = 0; i < warmup && !rc_; i++)
		rc_ = run_once(b, coll, b->spool + (size_t)i % nslots * slot, b->rpool + (size_t)i % nslots * slot, count);
	if (!rc_)
		rc_ = loom_barrier(b->c);
	double t0 = loom_now();
	for (long i = 0; i < iters && !rc_; i++)
		rc_ = run_once(b, coll, b->spool + (size_t)i % nslots * slot, b->rpool + (size_t)i % nslots * slot, count);
	double t = (loom_now() - t0) / (double)iters, tmax = 0;
	long long wrong = rc_ ? -1 : check_once(b, coll, count), wsum = 0;
	if (rc_ || wrong < 0 || loom_allreduce(b->c, &t, &tmax, 1, LOOM_FLOAT64, LOOM_MAX) ||
	    loom_allreduce(b->c, &wrong, &wsum, 1, LOOM_INT64, LOOM_SUM)) {
		fprintf(stderr, "loom bench comm: rank %d: %s of %zu bytes failed: %s\n", b->rank, op_names[coll],
		        bytes, loom_comm_errmsg(b->c));
		return 1;
	}
	if (b->rank == 0) {
		double algbw = (double)bytes / tmax / 1e9;
		const char *algo = loom_comm_algo(b->c, op_names[coll], bytes);
		int rooted = coll == OP_BROADCAST || coll == OP_REDUCE;
		printf("%12zu %12zu %9s %6s %5d %6s %10.2f %8.3f %8.3f %6lld\n", bytes, count, loom_dtype_name(b->dt),
		       coll == OP_ALLGATHER || coll == OP_BROADCAST ? "none" : loom_op_name(b->redop),
		       rooted ? b->root : -1, algo ? algo : "?", tmax * 1e6, algbw, algbw * bus_factor(coll, b->n),
		       wsum);
		fflush(stdout);
		b->busbw_sum += algbw * bus_factor(coll, b->n), b->measured++, b->wrong_sum += wsum;
	}
	return 0;
}

/* All ranks copy 32 MiB (source and destination together exceed the LLC) at once, as they would
 * during a collective; best of 5, GB/s per rank. */
static int memcpy_baseline(bench_t *b)
{
	size_t bytes = POOL_MIN / 2;
	double best = 1e30, tmax;
	for (int k = 0; k < 5; k++) {
		if (loom_barrier(b->c))
			return 1;
		double t0 = loom_now();
		memcpy(b->rpool + (k & 1) * bytes, b->spool + (k & 1) * bytes, bytes);
		double t = loom_now() - t0;
		if (loom_allreduce(b->c, &t, &tmax, 1, LOOM_FLOAT64, LOOM_MAX))
			return 1;
		best = tmax < best ? tmax : best;
	}
	if (b->rank == 0)
		printf("# memcpy baseline: %zu MiB per rank, %d rank%s copying at once: %.2f GB/s per rank\n", bytes >> 20,
		       b->n, b->n == 1 ? "" : "s", (double)bytes / best / 1e9);
	return 0;
}

static void *pool_alloc(bench_t *b, size_t bytes)
{
	void *p = b->registered ? loom_comm_alloc(b->c, bytes) : loom_alloc_aligned(bytes);
	if (p)
		memset(p, 0, bytes); /* fault the pages in before timing */
	return p;
}

static void pool_free(bench_t *b, void *p)
{
	if (b->registered)
		loom_comm_free(b->c, p);
	else
		loom_free_aligned(p);
}

int loom_cli_bench_comm(int argc, char **argv)
{
	const char *v, *ops = "allreduce", *algo = NULL;
	bench_t b = {.dt = LOOM_FLOAT32, .redop = LOOM_SUM, .warmup = -1, .min_bytes = 8, .max_bytes = 256u << 20,
	             .factor = 2};
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			usage(stdout);
			return 0;
		} else if (strcmp(argv[i], "--verbose") == 0 || strcmp(argv[i], "-v") == 0) {
			b.verbose = 1;
		} else if (cli_flag(argc, argv, &i, "--op", &v)) {
			ops = v;
		} else if (cli_flag(argc, argv, &i, "--algo", &v)) {
			algo = v;
		} else if (cli_flag(argc, argv, &i, "--min-bytes", &v) || cli_flag(argc, argv, &i, "-b", &v) ||
		           cli_flag(argc, argv, &i, "--minbytes", &v)) {
			b.min_bytes = cli_parse_size("bench comm", "--min-bytes", v);
		} else if (cli_flag(argc, argv, &i, "--max-bytes", &v) || cli_flag(argc, argv, &i, "-e", &v) ||
		           cli_flag(argc, argv, &i, "--maxbytes", &v)) {
			b.max_bytes = cli_parse_size("bench comm", "--max-bytes", v);
		} else if (cli_flag(argc, argv, &i, "--step-factor", &v) || cli_flag(argc, argv, &i, "-f", &v) ||
		           cli_flag(argc, argv, &i, "--stepfactor", &v)) {
			b.factor = cli_parse_int("bench comm", "--step-factor", v);
			if (b.factor < 2 || b.factor > 1024)
				cli_die("bench comm", "--step-factor (-f) %ld: expected 2..1024", b.factor);
		} else if (cli_flag(argc, argv, &i, "--registered", &v)) {
			b.registered = cli_parse_int("bench comm", "--registered", v) != 0;
		} else if (cli_flag(argc, argv, &i, "--inplace", &v)) {
			b.inplace = cli_parse_int("bench comm", "--inplace", v) != 0;
		} else if (cli_flag(argc, argv, &i, "--iters", &v) || cli_flag(argc, argv, &i, "-n", &v)) {
			b.iters = cli_parse_int("bench comm", "--iters", v);
		} else if (cli_flag(argc, argv, &i, "--warmup", &v) || cli_flag(argc, argv, &i, "-w", &v)) {
			b.warmup = cli_parse_int("bench comm", "--warmup", v);
		} else if (cli_flag(argc, argv, &i, "--root", &v)) {
			b.root = (int)cli_parse_int("bench comm", "--root", v);
		} else if (cli_flag(argc, argv, &i, "--dtype", &v)) {
			int d = 0;
			while (d < LOOM_DTYPE_COUNT && strcmp(v, loom_dtype_name((loom_dtype_t)d)) != 0)
				d++;
			if (d == LOOM_DTYPE_COUNT)
				cli_die("bench comm", "--dtype: '%s' is not float32, bfloat16, float64, int32 or int64", v);
			b.dt = (loom_dtype_t)d;
		} else if (cli_flag(argc, argv, &i, "--redop", &v)) {
			int o = 0;
			while (o < LOOM_OP_COUNT && strcmp(v, loom_op_name((loom_op_t)o)) != 0)
				o++;
			if (o == LOOM_OP_COUNT)
				cli_die("bench comm", "--redop: '%s' is not sum, avg, max or min", v);
			b.redop = (loom_op_t)o;
		} else {
			fprintf(stderr, "loom bench comm: unknown argument '%s'\n", argv[i]);
			usage(stderr);
			return 2;
		}
	}
	int run[NOPS] = {0}, any = 0;
	for (int k = 0; k < NOPS; k++)
		any |= run[k] = strcmp(ops, "all") == 0 || strcmp(ops, op_names[k]) == 0;
	if (!any)
		cli_die("bench comm", "--op: '%s' is not allreduce, allgather, reduce_scatter, broadcast, reduce or all", ops);
	if (b.min_bytes > b.max_bytes)
		cli_die("bench comm", "--min-bytes %zu is larger than --max-bytes %zu", b.min_bytes, b.max_bytes);
	if (b.redop == LOOM_AVG && b.dt >= LOOM_INT32)
		cli_die("bench comm", "--redop avg needs a floating-point --dtype");

	/* --algo becomes LOOM_ALGO, which the communicator parses at init (a bare name applies to every
	 * benchmarked operation that implements it). */
	char spec[256] = "";
	if (algo && strchr(algo, ':')) {
		snprintf(spec, sizeof spec, "%s", algo);
	} else if (algo) {
		size_t len = 0;
		for (int k = 0; k < NOPS; k++) {
			char entry[64];
			snprintf(entry, sizeof entry, "%s:%s", op_names[k], algo);
			if (run[k] && loom_comm_algo_check(entry) == LOOM_OK)
				len += (size_t)snprintf(spec + len, sizeof spec - len, "%s%s", len ? "," : "", entry);
			else if (run[k] && strcmp(ops, "all") != 0)
				cli_die("bench comm", "--algo: %s", loom_errmsg());
		}
		if (!len)
			cli_die("bench comm", "--algo: no benchmarked operation implements '%s'", algo);
	}
	if (algo)
		setenv("LOOM_ALGO", spec, 1);
	if (loom_comm_algo_check(getenv("LOOM_ALGO")) != LOOM_OK)
		cli_die("bench comm", "%s", loom_errmsg());

	if (loom_comm_init(&b.c)) {
		fprintf(stderr, "loom bench comm: %s\n", loom_errmsg());
		return 1;
	}
	b.rank = loom_comm_rank(b.c), b.n = loom_comm_size(b.c);
	if (b.root < 0 || b.root >= b.n)
		cli_die("bench comm", "--root %d is not a rank of this job of %d", b.root, b.n);
	b.pool = zmax(POOL_MIN, b.max_bytes);
	b.spool = pool_alloc(&b, b.pool);
	b.rpool = pool_alloc(&b, b.pool);
	int status = 0;
	if (!b.spool || !b.rpool) {
		fprintf(stderr, "loom bench comm: rank %d: cannot allocate 2 x %zu MiB of %s buffers%s%s\n", b.rank,
		        b.pool >> 20, b.registered ? "registered" : "", b.registered ? ": " : "",
		        b.registered ? loom_errmsg() : "");
		status = 1;
		goto out;
	}
	if (b.rank == 0) {
		printf("# loom bench comm: %d rank%s, %s buffers%s, %s, iters %s, pool %zu MiB per buffer\n", b.n,
		       b.n == 1 ? "" : "s", b.registered ? "registered (loom_comm_alloc)" : "ordinary (malloc)",
		       b.inplace ? ", in place" : "", loom_dtype_name(b.dt), b.iters > 0 ? "fixed" : "auto",
		       b.pool >> 20);
		if (getenv("LOOM_ALGO") && *getenv("LOOM_ALGO"))
			printf("# LOOM_ALGO=%s\n", getenv("LOOM_ALGO"));
		if (b.verbose) {
			printf("# selection rule (first match; bytes as in the size column):\n");
			loom_comm_algo_rule(stdout);
			if (strncmp(loom_comm_algo(b.c, "allreduce", 1u << 20), "h-", 2) == 0)
				printf("# across hosts, h-ALGO: reduce-scatter on shared memory inside each host, ALGO (the rule "
				       "above, at 1/L of the size) between hosts over MPI, all-gather inside each host\n");
		}
	}
	if ((status = memcpy_baseline(&b)))
		goto out;
	for (int k = 0; k < NOPS && !status; k++) {
		if (!run[k])
			continue;
		if (b.rank == 0)
			printf("# %s\n#%11s %12s %9s %6s %5s %6s %10s %8s %8s %6s\n#%11s %12s %9s %6s %5s %6s %10s %8s %8s %6s\n",
			       op_names[k], "size", "count", "type", "redop", "root", "algo", "time", "algbw", "busbw", "#wrong",
			       "(B)", "(elements)", "", "", "", "", "(us)", "(GB/s)", "(GB/s)", "");
		for (size_t bytes = b.min_bytes; bytes <= b.max_bytes && !status; bytes *= (size_t)b.factor) {
			status = bench_size(&b, (op_t)k, bytes);
			if (bytes == 0 || bytes > SIZE_MAX / (size_t)b.factor)
				break;
		}
	}
	if (!status && b.rank == 0 && b.measured > 0) {
		printf("# Out of bounds values : %lld %s\n", b.wrong_sum, b.wrong_sum ? "FAILED" : "OK");
		printf("# Avg bus bandwidth    : %g \n#\n", b.busbw_sum / (double)b.measured);
		if (b.wrong_sum)
			status = 1;
	}
out:
	if (b.spool)
		pool_free(&b, b.spool);
	if (b.rpool)
		pool_free(&b, b.rpool);
	loom_comm_destroy(b.c);
	return status;
}
