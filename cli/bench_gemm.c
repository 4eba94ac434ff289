/* bench_gemm.c: `loom bench gemm`: measured fp32 sgemm and bf16 GEMM FLOP/s on this machine (the bf16
 * one on the path `--dtype bf16` takes here, named), the peaks that MFU is relative to (loom train
 * --peak-flops takes the printed number of the --dtype it trains in). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "loom/gpt2.h"

static void usage(FILE *f)
{
	fprintf(f, "usage: loom bench gemm [--threads N] [--size M,N,K | --size N] [--seconds S]\n"
	           "  Measures row-major C(M,N) = A(M,K) B(K,N) through the model's GEMM: fp32 sgemm, and the bf16\n"
	           "  GEMM of --dtype bf16 (bf16 operands, fp32 accumulation) on the path it takes here: native\n"
	           "  (oneDNN on AVX512-BF16 / AMX-BF16) or portable (LOOM_BF16=auto|native|portable chooses).\n"
	           "  Without --size: the peaks over square 1024 and the `small` preset's MLP and lm-head shapes\n"
	           "  (the numbers MFU uses). --threads: 0 = one per CPU (default).\n");
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
	loom_bf16_path_t path;
	int bf16_ok = loom_bf16_path(&path) == LOOM_OK, nd = bf16_ok ? 2 : 1; /* fp32, and bf16 (any CPU) */
	char bf16_err[512] = "";
	if (!bf16_ok) /* LOOM_BF16 asks for a path this machine cannot run */
		snprintf(bf16_err, sizeof bf16_err, "%s", loom_errmsg());
	static const char *names[] = {"sgemm", "bf16 gemm"};
	if (M > 0) {
		double f = 0.0;
		for (int d = 0; d < nd; d++) {
			f = loom_gemm_flops_dtype((loom_compute_dtype_t)d, threads, M, N, K, seconds);
			printf("%s %dx%dx%d, %d thread%s: %.1f GFLOP/s%s%s\n", names[d], M, N, K, threads,
			       threads == 1 ? "" : "s", f / 1e9, d ? ", path " : "", d ? loom_bf16_path_name(path) : "");
		}
		if (!bf16_ok)
			printf("bf16: %s\n", bf16_err);
		return f > 0 && bf16_ok ? 0 : 1;
	}
	static const int shapes[][3] = {{1024, 1024, 1024}, {1024, 1536, 384}, {256, 50257, 384}};
	double peak[2] = {0.0, 0.0};
	for (int d = 0; d < nd; d++)
		for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
			double f = loom_gemm_flops_dtype((loom_compute_dtype_t)d, threads, shapes[i][0], shapes[i][1],
			                                 shapes[i][2], seconds / 2);
			printf("%-9s %5dx%5dx%4d: %7.1f GFLOP/s\n", names[d], shapes[i][0], shapes[i][1], shapes[i][2], f / 1e9);
			peak[d] = f > peak[d] ? f : peak[d];
		}
	/* the fp32 line first and unchanged: scripts read its --peak-flops */
	printf("peak, %d thread%s: %.1f GFLOP/s (--peak-flops %.4g)\n", threads, threads == 1 ? "" : "s", peak[0] / 1e9,
	       peak[0]);
	if (nd == 2)
		printf("bf16 peak, %d thread%s: %.1f GFLOP/s (--peak-flops %.4g with --dtype bf16), path %s\n", threads,
		       threads == 1 ? "" : "s", peak[1] / 1e9, peak[1], loom_bf16_path_name(path));
	else
		printf("bf16: %s\n", bf16_err);
	return peak[0] > 0 && bf16_ok && peak[1] > 0 ? 0 : 1;
}
