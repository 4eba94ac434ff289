/* comm_mpi.c: the peer of `loom bench comm`, written against MPI: the same sizes, buffer rotation,
 * timing (mean per rank over the iterations, then the maximum over ranks), columns and bus-bandwidth
 * factors, so bench/comm_vs_mpi.sh can compare the two line by line. float32 only.
 *
 * Build: mpicc -O2 -o build/bench/comm_mpi bench/comm_mpi.c
 * Run:   mpirun --allow-run-as-root -np 2 build/bench/comm_mpi [--op allreduce|allgather|reduce_scatter|
 *        broadcast|reduce] [--min-bytes 8] [--max-bytes 256M] [--iters N] [--warmup N] */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define POOL_MIN (64u << 20)

static size_t parse_size(const char *s)
{
	char *end;
	double v = strtod(s, &end);
	switch (*end) {
	case 'k': case 'K': v *= 1024; break;
	case 'm': case 'M': v *= 1024 * 1024; break;
	case 'g': case 'G': v *= 1024.0 * 1024 * 1024; break;
	default: break;
	}
	return (size_t)v;
}

static double val(int r, size_t i)
{
	return (double)((i + (size_t)r * 3) % 13);
}

/* Runs one collective; count is nccl-tests' (the whole vector). */
static int run_once(int op, const float *send, float *recv, size_t count, int n)
{
	int per = (int)(count / (size_t)n);
	switch (op) {
	case 0: return MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
	case 1: return MPI_Allgather(send, per, MPI_FLOAT, recv, per, MPI_FLOAT, MPI_COMM_WORLD);
	case 2: return MPI_Reduce_scatter_block(send, recv, per, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
	case 3: return MPI_Bcast(recv, (int)count, MPI_FLOAT, 0, MPI_COMM_WORLD);
	default: return MPI_Reduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD);
	}
}

int main(int argc, char **argv)
{
	static const char *names[] = {"allreduce", "allgather", "reduce_scatter", "broadcast", "reduce"};
	int op = 0, rank, n;
	long iters = 0, warmup = -1;
	size_t min_bytes = 8, max_bytes = 256u << 20;
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &n);
	for (int i = 1; i + 1 < argc; i += 2) {
		if (strcmp(argv[i], "--op") == 0) {
			for (op = 0; op < 5 && strcmp(argv[i + 1], names[op]) != 0; op++)
				;
			if (op == 5) {
				fprintf(stderr, "comm_mpi: --op %s is not one of allreduce, allgather, reduce_scatter, "
				                "broadcast, reduce\n", argv[i + 1]);
				MPI_Abort(MPI_COMM_WORLD, 2);
			}
		} else if (strcmp(argv[i], "--min-bytes") == 0) {
			min_bytes = parse_size(argv[i + 1]);
		} else if (strcmp(argv[i], "--max-bytes") == 0) {
			max_bytes = parse_size(argv[i + 1]);
		} else if (strcmp(argv[i], "--iters") == 0) {
			iters = atol(argv[i + 1]);
		} else if (strcmp(argv[i], "--warmup") == 0) {
			warmup = atol(argv[i + 1]);
		} else {
			fprintf(stderr, "comm_mpi: unknown argument %s\n", argv[i]);
			MPI_Abort(MPI_COMM_WORLD, 2);
		}
	}
	size_t pool = max_bytes > POOL_MIN ? max_bytes : POOL_MIN;
	char *spool = aligned_alloc(4096, pool), *rpool = aligned_alloc(4096, pool);
	if (!spool || !rpool) {
		fprintf(stderr, "comm_mpi: out of memory\n");
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
	memset(spool, 0, pool);
	memset(rpool, 0, pool);

	/* memcpy baseline, all ranks at once, as in loom bench comm */
	size_t cb = POOL_MIN / 2;
	double best = 1e30;
	for (int k = 0; k < 5; k++) {
		MPI_Barrier(MPI_COMM_WORLD);
		double t0 = MPI_Wtime(), t, tmax;
		memcpy(rpool + (k & 1) * cb, spool + (k & 1) * cb, cb);
		t = MPI_Wtime() - t0;
		MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
		best = tmax < best ? tmax : best;
	}
	if (rank == 0) {
		printf("# comm_mpi: %d ranks, MPI %s\n", n, names[op]);
		printf("# memcpy baseline: %zu MiB per rank, %d ranks copying at once: %.2f GB/s per rank\n", cb >> 20, n,
		       (double)cb / best / 1e9);
		printf("#%11s %12s %9s %6s %5s %6s %10s %8s %8s %6s\n", "size", "count", "type", "redop", "root", "algo",
		       "time", "algbw", "busbw", "#wrong");
	}
	double factor = op == 0 ? 2.0 * (n - 1) / n : op <= 2 ? (double)(n - 1) / n : 1.0;
	for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
		size_t unit = (op == 1 || op == 2) ? 4 * (size_t)n : 4;
		size_t count = bytes / unit * unit / 4, sc = count, rc = count;
		if (op == 1)
			sc = count / (size_t)n;
		if (op == 2)
			rc = count / (size_t)n;
		size_t slot = ((sc > rc ? sc : rc) * 4 + 4095) & ~(size_t)4095;
		size_t nslots = slot ? (pool / slot ? pool / slot : 1) : 1;
		long it = iters;
		if (it <= 0) {
			double want = (double)(1u << 30) / (double)(bytes ? bytes : 1);
			it = want < 20 ? 20 : want > 10000 ? 10000 : (long)want;
		}
		long wu = warmup >= 0 ? warmup : (it / 10 > 2 ? it / 10 : 2);
		if (warmup < 0 && wu < (long)nslots) /* every slot once, as loom bench comm does */
			wu = (long)nslots < it ? (long)nslots : it;
		for (long i = 0; i < wu; i++)
			run_once(op, (float *)(spool + (size_t)i % nslots * slot), (float *)(rpool + (size_t)i % nslots * slot),
			         count, n);
		MPI_Barrier(MPI_COMM_WORLD);
		double t0 = MPI_Wtime();
		for (long i = 0; i < it; i++)
			run_once(op, (float *)(spool + (size_t)i % nslots * slot), (float *)(rpool + (size_t)i % nslots * slot),
			         count, n);
		double t = (MPI_Wtime() - t0) / (double)it, tmax;
		/* one checked run with exact values */
		float *s = (float *)spool, *r = (float *)rpool;
		for (size_t i = 0; i < sc; i++)
			s[i] = (float)val(rank, op == 1 ? (size_t)rank * sc + i : i);
		if (op == 3)
			for (size_t i = 0; i < rc; i++)
				r[i] = rank == 0 ? (float)val(0, i) : -1.0f;
		run_once(op, s, r, count, n);
		long long wrong = 0, wsum;
		size_t base = op == 2 ? (size_t)rank * rc : 0;
		for (size_t i = 0; i < rc && !(op == 4 && rank != 0); i++) {
			double w = 0;
			if (op == 1)
				w = val((int)(i / sc), i);
			else if (op == 3)
				w = val(0, i);
			else
				for (int q = 0; q < n; q++)
					w += val(q, base + i);
			wrong += r[i] != (float)w;
		}
		MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
		MPI_Allreduce(&wrong, &wsum, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
		if (rank == 0) {
			double algbw = (double)(count * 4) / tmax / 1e9;
			printf("%12zu %12zu %9s %6s %5d %6s %10.2f %8.3f %8.3f %6lld\n", count * 4, count, "float32",
			       op == 1 || op == 3 ? "none" : "sum", op >= 3 ? 0 : -1, "mpi", tmax * 1e6, algbw, algbw * factor,
			       wsum);
			fflush(stdout);
		}
		if (bytes == 0)
			break;
	}
	free(spool);
	free(rpool);
	MPI_Finalize();
	return 0;
}
