/* bench_model.c: `loom bench model`: tokens/s of the GPT-2 training micro-step (forward + backward,
 * no optimizer) on random tokens, with an optional per-kernel profile. The model's own speed,
 * apart from data loading and the optimizer that `loom train` adds. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "cli.h"
#include "loom/gpt2.h"
#include "loom/util.h"

/* CPU seconds used by the whole process (all threads): on a shared machine, with one thread, the
 * cost of a step apart from the time other processes took the core. */
static double cpu_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static long minor_faults(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_minflt;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: loom bench model [--model tiny|small|gpt2] [--batch B] [--seq-len T] [--threads N]\n"
	           "                        [--steps S] [--profile] [--peak-flops F]\n"
	           "  Times S forward_backward steps (after one warm-up) and prints the best and mean tokens/s,\n"
	           "  and MFU against --peak-flops (default: measured now, like `loom bench gemm`).\n"
	           "  --profile: the per-kernel times of the fastest step.\n");
}

int loom_cli_bench_model(int argc, char **argv)
{
	const char *v, *preset = "small";
	int B = 4, T = 0, threads = 0, steps = 5, profile = 0, rc;
	double peak = 0.0;
	loom_model_config_t cfg;
	loom_model_t *m = NULL;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			usage(stdout);
			return 0;
		} else if (cli_flag(argc, argv, &i, "--model", &v)) {
			preset = v;
		} else if (cli_flag(argc, argv, &i, "--batch", &v)) {
			B = (int)cli_parse_int("bench model", "--batch", v);
		} else if (cli_flag(argc, argv, &i, "--seq-len", &v)) {
			T = (int)cli_parse_int("bench model", "--seq-len", v);
		} else if (cli_flag(argc, argv, &i, "--threads", &v)) {
			threads = (int)cli_parse_int("bench model", "--threads", v);
		} else if (cli_flag(argc, argv, &i, "--steps", &v)) {
			steps = (int)cli_parse_int("bench model", "--steps", v);
		} else if (cli_flag(argc, argv, &i, "--peak-flops", &v)) {
			peak = cli_parse_double("bench model", "--peak-flops", v);
		} else if (strcmp(argv[i], "--profile") == 0) {
			profile = 1;
		} else {
			fprintf(stderr, "loom bench model: unknown argument '%s'\n", argv[i]);
			usage(stderr);
			return 2;
		}
	}
	if (loom_gpt2_preset(preset, &cfg) != LOOM_OK)
		cli_die("bench model", "%s", loom_errmsg());
	if (T <= 0)
		T = cfg.seq_len;
	if (steps < 1)
		cli_die("bench model", "--steps: %d (expected >= 1)", steps);
	threads = loom_set_num_threads(threads);
	if ((rc = loom_model_create(&m, &cfg, &(loom_model_opts_t){.B = B, .T = T})) != LOOM_OK)
		cli_die("bench model", "%s", loom_errmsg());
	loom_model_init(m, 1);
	int *in = malloc(sizeof(int) * (size_t)B * T), *tg = malloc(sizeof(int) * (size_t)B * T);
	for (int i = 0; i < B * T; i++) { /* arbitrary but fixed tokens */
		in[i] = (int)(((unsigned)i * 7919u + 13u) % (unsigned)cfg.vocab_size);
		tg[i] = (int)(((unsigned)i * 104729u + 1u) % (unsigned)cfg.vocab_size);
	}
	float loss;
	double best = 1e30, total = 0.0, best_cpu = 1e30;
	char *best_profile = NULL;
	loom_model_zero_grad(m);
	loom_model_forward_backward(m, in, tg, B, T, 1.0f, &loss); /* warm-up */
	loom_model_profile(m, profile);
	long faults0 = minor_faults();
	for (int s = 0; s < steps; s++) {
		double t0 = loom_now(), c0 = cpu_now();
		loom_model_forward_backward(m, in, tg, B, T, 1.0f, &loss);
		double dt = loom_now() - t0, dc = cpu_now() - c0;
		if (profile) { /* keep the profile of the fastest step: on a shared machine the others are disturbed */
			char *text = NULL;
			size_t len = 0;
			FILE *f = open_memstream(&text, &len);
			if (f) {
				loom_model_profile_report(m, f, 1);
				fclose(f);
				if (dt < best) {
					free(best_profile);
					best_profile = text;
				} else {
					free(text);
				}
			}
		}
		best = dt < best ? dt : best;
		best_cpu = dc < best_cpu ? dc : best_cpu;
		total += dt;
		printf("step %d: loss %.4f, %.1f ms, %.1f tokens/s (cpu %.1f ms)\n", s + 1, loss, 1e3 * dt, B * T / dt,
		       1e3 * dc);
	}
	long faults = minor_faults() - faults0;
	if (best_profile) {
		printf("profile of the fastest step:\n%s", best_profile);
		free(best_profile);
	}
	if (peak <= 0)
		peak = loom_gemm_peak_flops(threads);
	double fpt = loom_model_flops_per_token(&cfg, T);
	printf("%s B=%d T=%d, %d thread%s: best %.1f tokens/s (%.1f ms), mean %.1f tokens/s; MFU %.1f%% of %.1f GFLOP/s\n",
	       preset, B, T, threads, threads == 1 ? "" : "s", B * T / best, 1e3 * best, B * T * steps / total,
	       100.0 * B * T / best * fpt / peak, peak / 1e9);
	printf("cpu time: best %.1f ms per step (%.1f tokens per cpu-second); %.1f page faults per step\n",
	       1e3 * best_cpu, B * T / best_cpu, (double)faults / steps);
	free(in);
	free(tg);
	loom_model_destroy(m);
	return 0;
}
