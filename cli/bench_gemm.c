/* bench_gemm.c: `loom bench gemm`: this CPU's features, the options loom was built with, and hardware peaks (loom's FMA and bf16
 * dot-product loops: what MFU is relative to; loom train --peak-flops takes the printed number of the
 * --dtype it trains in), and the fp32 and bf16 GEMMs' FLOP/s as fractions of them (the bf16 one on the
 * path `--dtype bf16` takes here, named), with a warning when the GEMM is far below what the CPU can do. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "cli.h"
#include "loom/cpu.h"
#include "loom/gpt2.h"
#include "loom/util.h"

static void usage(FILE *f)
{
	fprintf(f, "usage: loom bench gemm [--threads N] [--size M,N,K | --size N] [--seconds S]\n"
	           "  Prints the CPU's features and the GEMMs in use, then measures row-major C(M,N) = A(M,K) B(K,N)\n"
	           "  through the model's GEMMs: fp32 sgemm, and the bf16 GEMM of --dtype bf16 (bf16 operands, fp32\n"
	           "  accumulation) on the path it takes here: native (oneDNN on AVX512-BF16 / AMX-BF16) or portable\n"
	           "  (LOOM_BF16=auto|native|portable chooses). Without --size: the hardware's fp32 and bf16 peaks\n"
	           "  (loom's throughput loops: what MFU is against) and each GEMM over square 1024 and the `small`\n"
	           "  preset's MLP and lm-head shapes as a fraction of them. --threads: 0 = one per CPU (default).\n");
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
	const char *bf16_name = bf16_ok ? loom_bf16_path_name(path) : "unavailable (see below)";
	char bf16_err[512] = "";
	if (!bf16_ok) /* LOOM_BF16 asks for a path this machine cannot run */
		snprintf(bf16_err, sizeof bf16_err, "%s", loom_errmsg());
	static const char *names[] = {"sgemm", "bf16 gemm"};
	const loom_cpu_t *cpu = loom_cpu();
	loom_blas_plan_t plan;
	loom_blas_plan(cpu, openblas_get_corename(), getenv("OPENBLAS_CORETYPE"), &plan);
	printf("cpu: %s, family %u model %u: %s\n", cpu->brand[0] ? cpu->brand : cpu->vendor, cpu->family, cpu->model,
	       loom_cpu_features_str(cpu));
	printf("fp32 GEMM: %s; bf16 GEMM: %s\n", loom_gemm_backend_name(), bf16_name);
	printf("OpenBLAS (LOOM_GEMM=openblas): %s\n", plan.why);
	printf("loom %s (git %s), built with:\n", loom_version(), loom_git_describe());
	loom_build_info_print(stdout, "  ");
	if (M > 0) {
		double f = 0.0;
		for (int d = 0; d < nd; d++) {
			f = loom_gemm_flops_dtype((loom_compute_dtype_t)d, threads, M, N, K, seconds);
			printf("%s %dx%dx%d, %d thread%s: %.1f GFLOP/s%s%s\n", names[d], M, N, K, threads,
			       threads == 1 ? "" : "s", f / 1e9, d ? ", path " : "", d ? bf16_name : "");
		}
		if (!bf16_ok)
			printf("bf16: %s\n", bf16_err);
		return f > 0 && bf16_ok ? 0 : 1;
	}
	/* the hardware first: what the GEMMs are measured against */
	double hw[2] = {0.0, 0.0};
	const char *src[2] = {"", ""};
	for (int d = 0; d < nd; d++)
		hw[d] = loom_hw_peak_flops((loom_compute_dtype_t)d, threads, &src[d]);
	static const int shapes[][3] = {{1024, 1024, 1024}, {1024, 1536, 384}, {256, 50257, 384}};
	double peak[2] = {0.0, 0.0};
	for (int d = 0; d < nd; d++)
		for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
			double f = loom_gemm_flops_dtype((loom_compute_dtype_t)d, threads, shapes[i][0], shapes[i][1],
			                                 shapes[i][2], seconds / 2);
			printf("%-9s %5dx%5dx%4d: %7.1f GFLOP/s, %3.0f%% of the hardware peak\n", names[d], shapes[i][0],
			       shapes[i][1], shapes[i][2], f / 1e9, hw[d] > 0 ? 100.0 * f / hw[d] : 0.0);
			peak[d] = f > peak[d] ? f : peak[d];
		}
	const char *s = threads == 1 ? "" : "s";
	/* scripts read the --peak-flops of these two lines: MFU is against the hardware */
	printf("hardware peak, %d thread%s: %.1f GFLOP/s (%s; --peak-flops %.4g)\n", threads, s, hw[0] / 1e9, src[0],
	       hw[0]);
	if (bf16_ok)
		printf("bf16 hardware peak, %d thread%s: %.1f GFLOP/s (%s; --peak-flops %.4g with --dtype bf16)\n", threads,
		       s, hw[1] / 1e9, src[1], hw[1]);
	for (int d = 0; d < nd; d++)
		printf("%s peak, %d thread%s: %.1f GFLOP/s, %.0f%% of the hardware peak%s%s\n", names[d], threads, s,
		       peak[d] / 1e9, hw[d] > 0 ? 100.0 * peak[d] / hw[d] : 0.0, d ? ", path " : "", d ? bf16_name : "");
	if (!bf16_ok)
		printf("bf16: %s\n", bf16_err);
	/* A GEMM well below the unit it runs on: say why and what to do. 0.6 is far below what a
	 * kernel for the right ISA reaches on any machine measured (0.8-0.95), and far above a wrong
	 * one (OpenBLAS's SSE3 kernels: 0.18 of an AVX-512 core). */
	if (hw[0] > 0 && peak[0] < 0.6 * hw[0]) {
		if (loom_gemm_backend() == LOOM_GEMM_OPENBLAS)
			printf("warning: the fp32 GEMM reaches only %.0f%% of this CPU's FMA peak: %s%s; unset LOOM_GEMM to "
			       "use oneDNN's sgemm, which picks its kernels by the CPU's features%s%s\n",
			       100.0 * peak[0] / hw[0], plan.why, plan.force ? " (loom sets it itself unless run as a library)" : "",
			       plan.coretype ? ", or set OPENBLAS_CORETYPE=" : "", plan.coretype ? plan.coretype : "");
		else
			printf("warning: the fp32 GEMM (%s) reaches only %.0f%% of this CPU's FMA peak: the machine may be "
			       "busy (measure again on an idle one), or oneDNN has no kernel for this CPU: try "
			       "LOOM_GEMM=openblas\n", loom_gemm_backend_name(), 100.0 * peak[0] / hw[0]);
	}
	return peak[0] > 0 && bf16_ok && peak[1] > 0 ? 0 : 1;
}
