/* main.c: the `loom` command: dispatches to its subcommands and holds the shared flag parser. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cblas.h>

#include "cli.h"
#include "loom/cpu.h"
#include "loom/gpt2.h"
#include "loom/util.h"

static const struct {
	const char *name;
	int (*fn)(int, char **);
	const char *help;
} commands[] = {
	{"run", loom_cli_run, "launch N processes of a program as one job (torchrun's flags and environment)"},
	{"train", loom_cli_train, "train a GPT-2 model on token shards"},
	{"plan", loom_cli_plan, "predict a run's memory, step time, MFU and cost on a cluster; --search the best mesh"},
	{"sample", loom_cli_sample, "generate text from a checkpoint"},
	{"data", loom_cli_data, "prepare token shards from text (data prepare)"},
	{"tokenizer", loom_cli_tokenizer, "byte-level BPE tokenizers: train, encode, decode, info (GPT-2's files)"},
	{"bench", loom_cli_bench, "benchmarks: comm (collectives, nccl-tests' flags), gemm (peak FLOP/s), model (a "
	                          "training step)"},
	{"convert", loom_cli_convert, "convert checkpoints between safetensors and llm.c .bin"},
	{"info", loom_cli_info, "print what a file or directory holds: model, checkpoint, shard, tokenizer"},
	{"plot", loom_cli_plot, "draw loss, val loss and tokens/s of training logs (SVG, or PNG via gnuplot)"},
};

static void usage(FILE *f)
{
	fprintf(f, "usage: loom COMMAND [ARGS]\n       loom --version\n\ncommands:\n");
	for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
		fprintf(f, "  %-9s %s\n", commands[i].name, commands[i].help);
	fprintf(f, "\nloom COMMAND --help shows a command's flags; docs/ has the manual.\n");
}

void cli_die(const char *cmd, const char *fmt, ...)
{
	va_list ap;
	fprintf(stderr, "loom %s: ", cmd);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(2);
}

int cli_flag(int argc, char **argv, int *i, const char *name, const char **val)
{
	const char *a = argv[*i];
	size_t n = strlen(name);
	if (strncmp(a, name, n) != 0)
		return 0;
	if (a[n] == '=') {
		*val = a + n + 1;
		return 1;
	}
	if (a[n] != '\0')
		return 0;
	if (*i + 1 >= argc)
		cli_die(argv[0], "%s needs a value", name);
	*val = argv[++*i];
	return 1;
}

long long cli_parse_int(const char *cmd, const char *flag, const char *s)
{
	char *end;
	long long v;
	errno = 0;
	v = strtoll(s, &end, 10);
	if (errno || end == s || *end)
		cli_die(cmd, "%s: '%s' is not an integer", flag, s);
	return v;
}

double cli_parse_double(const char *cmd, const char *flag, const char *s)
{
	char *end;
	double v;
	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || *end)
		cli_die(cmd, "%s: '%s' is not a number", flag, s);
	return v;
}

size_t cli_parse_size(const char *cmd, const char *flag, const char *s)
{
	char *end;
	unsigned long long v;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s || s[0] == '-')
		cli_die(cmd, "%s: '%s' is not a size (e.g. 8, 4K, 16M, 1G)", flag, s);
	switch (*end) {
	case 'K': case 'k': v <<= 10, end++; break;
	case 'M': case 'm': v <<= 20, end++; break;
	case 'G': case 'g': v <<= 30, end++; break;
	}
	if (*end == 'B' || *end == 'b')
		end++;
	if (*end)
		cli_die(cmd, "%s: '%s' is not a size (e.g. 8, 4K, 16M, 1G)", flag, s);
	return (size_t)v;
}

/* LOOM_GEMM=openblas: OpenBLAS chose its kernels by the CPU's model when it loaded; where that is
 * below what the CPU's features allow and the user set no OPENBLAS_CORETYPE, run this same command
 * again with the right core type (once: LOOM_BLAS_REEXEC marks the second run). Ranks that `loom run`
 * starts inherit the variable. A LOOM_GEMM that is neither backend is an error. */
static void blas_setup(char **argv)
{
	const char *g = getenv("LOOM_GEMM");
	if (loom_gemm_backend_parse(g) < 0) {
		fprintf(stderr, "loom: LOOM_GEMM=%s: expected onednn (the default) or openblas\n", g);
		exit(2);
	}
	if (loom_gemm_backend() != LOOM_GEMM_OPENBLAS || getenv("LOOM_BLAS_REEXEC"))
		return;
	loom_blas_plan_t plan;
	loom_blas_plan(loom_cpu(), openblas_get_corename(), getenv("OPENBLAS_CORETYPE"), &plan);
	if (!plan.force)
		return;
	setenv("OPENBLAS_CORETYPE", plan.coretype, 1);
	setenv("LOOM_BLAS_REEXEC", "1", 1);
	execv("/proc/self/exe", argv);
	fprintf(stderr, "loom: warning: %s, but re-running with it failed (%s); OpenBLAS stays on its core\n", plan.why,
	        strerror(errno));
}

/* OpenBLAS's pthreads build starts its worker threads (one per core but one) when the library loads,
 * before main, and each worker's first act is to take a buffer of BUFFER_SIZE (128 MiB of address space
 * on its AVX-512 kernels, 32 MiB on the others). Under an address-space or data limit (prlimit --as,
 * ulimit -v) that allocation is refused and the worker retries it forever at 100% CPU; exit() and
 * fork() (OpenBLAS's atfork handler) then join it and hang, with every signal blocked in fork's case.
 * loom never uses OpenBLAS's own threads (its OpenMP threads call a single-threaded sgemm), so under
 * such a limit the command runs again, before anything else, with OPENBLAS_NUM_THREADS=1: OpenBLAS then
 * starts no thread at all. The user's value is kept in LOOM_OPENBLAS_NUM_THREADS_WAS ("" when unset)
 * for `loom run` to hand back to its ranks. Without a limit nothing happens (no second exec). */
static void blas_threads_setup(char **argv)
{
	struct rlimit as, data;
	const char *v = getenv("OPENBLAS_NUM_THREADS");
	if (getenv("LOOM_OPENBLAS_NUM_THREADS_WAS") || (v && strcmp(v, "1") == 0))
		return;
	if (getrlimit(RLIMIT_AS, &as) != 0 || getrlimit(RLIMIT_DATA, &data) != 0 ||
	    (as.rlim_cur == RLIM_INFINITY && data.rlim_cur == RLIM_INFINITY))
		return;
	setenv("LOOM_OPENBLAS_NUM_THREADS_WAS", v ? v : "", 1);
	setenv("OPENBLAS_NUM_THREADS", "1", 1);
	fflush(NULL);
	execv("/proc/self/exe", argv);
	fprintf(stderr, "loom: warning: under a memory limit, re-running with OPENBLAS_NUM_THREADS=1 failed (%s); "
	        "OpenBLAS's threads may hang if the limit refuses their buffers\n", strerror(errno));
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0); /* lines reach `loom run`'s prefixing pipe as they are written */
	blas_threads_setup(argv);
	blas_setup(argv);
	if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
		usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0 || strcmp(argv[1], "-V") == 0) {
		loom_bf16_path_t path;
		printf("loom %s (git %s)\n", loom_version(), loom_git_describe());
		loom_build_info_print(stdout, NULL);
		if (loom_bf16_path(&path) == LOOM_OK)
			printf("bf16 GEMM: %s\n", loom_bf16_path_name(path));
		else
			printf("bf16 GEMM: unavailable: %s\n", loom_errmsg());
		return 0;
	}
	for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
		if (strcmp(argv[1], commands[i].name) == 0)
			return commands[i].fn(argc - 1, argv + 1);
	fprintf(stderr, "loom: unknown command '%s'\n\n", argv[1]);
	usage(stderr);
	return 2;
}
