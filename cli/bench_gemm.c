/* bench_gemm.c: `loom bench gemm`: measured fp32 sgemm FLOP/s on this machine, the peak that MFU is
 * relative to (loom train --peak-flops takes the printed number). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "loom/gpt2.h"

static void usage(FILE *f)
{
	fprintf(f, "usage: loom bench gemm [--threads N] [--size M,N,K | --size N] [--seconds S]\n"
	           "  Measures row-major fp32 sgemm C(M,N) = A(M,K) B(K,N) through the model's threaded sgemm.\n"
	           "  Without --size: the peak over square 1024 and the `small` preset's MLP and lm-head shapes\n"
	           "  (the number MFU uses). --threads: 0 = one per CPU (default).\n");
}

int loom_cli_bench_gemm(int argc, char **argv)
{
	const char *v;
	int threads = 0, M = 0, N = 0, K = 0;
	double seconds = 1.0;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			usage(stdout);
			return 0;
		} else if (cli_flag(argc, argv, &i, "--threads", &v)) {
			threads = (int)cli_parse_int("bench gemm", "--threads", v);
			if (threads < 0)
				cli_die("bench gemm", "--threads: %d is negative", threads);
		} else if (cli_flag(argc, argv, &i, "--seconds", &v)) {
			seconds = cli_parse_double("bench gemm", "--seconds", v);
		} else if (cli_flag(argc, argv, &i, "--size", &v)) {
			int used = -1;
			if (sscanf(v, "%d,%d,%d%n", &M, &N, &K, &used) == 3 && v[used] == '\0')
				;
			else if (sscanf(v, "%d%n", &M, &used) == 1 && v[used] == '\0')
				N = K = M;
			else
				cli_die("bench gemm", "--size: '%s' is not N or M,N,K", v);
			if (M <= 0 || N <= 0 || K <= 0)
				cli_die("bench gemm", "--size: '%s' has a non-positive dimension", v);
		} else {
			fprintf(stderr, "loom bench gemm: unknown argument '%s'\n", argv[i]);
			usage(stderr);
			return 2;
		}
	}
	threads = loom_set_num_threads(threads);
	if (M > 0) {
		double f = loom_gemm_flops(threads, M, N, K, seconds);
		printf("sgemm %dx%dx%d, %d thread%s: %.1f GFLOP/s\n", M, N, K, threads, threads == 1 ? "" : "s", f / 1e9);
		return f > 0 ? 0 : 1;
	}
	static const int shapes[][3] = {{1024, 1024, 1024}, {1024, 1536, 384}, {256, 50257, 384}};
	double peak = 0.0;
	for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
		double f = loom_gemm_flops(threads, shapes[i][0], shapes[i][1], shapes[i][2], seconds / 2);
		printf("sgemm %5dx%5dx%4d: %7.1f GFLOP/s\n", shapes[i][0], shapes[i][1], shapes[i][2], f / 1e9);
		peak = f > peak ? f : peak;
	}
	printf("peak, %d thread%s: %.1f GFLOP/s (--peak-flops %.4g)\n", threads, threads == 1 ? "" : "s", peak / 1e9,
	       peak);
	return peak > 0 ? 0 : 1;
}
