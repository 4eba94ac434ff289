/* test_sweep.c: no flag combination of `loom train` crashes, hangs or fails mid-run (issue 21).
 *
 * The matrix: --zero 0-3, --tp 1|2, --pp 1|2|4, --pp-schedule gpipe|1f1b|interleaved, --virtual-stages
 * 1|2, --sequence-parallel off|on, --activation-checkpointing none|blocks|selective, --dtype fp32|bf16,
 * --grad-accum 1|2, --arch gpt2|nanochat and 1, 2, 4 or 8 ranks (dp = ranks / (tp x pp)), on a 4-layer
 * model of width 64 with a batch of one 32-token sequence. Every run must either succeed or stop before
 * its first step with exactly one error line that names a flag (and, under --nproc, before any rank
 * starts: no launcher report of a failed rank); a signal, a timeout, a second error line or an error
 * after training started fails the test.
 *
 * Its 27,648 combinations are too many to train in CI time, so the test has two parts:
 *  - sweep_check: `loom train --check` (all validation, then the mesh, model and parallel strategy
 *    built on every rank and started from rank 0's parameters; no step) on every combination but those
 *    whose extra values change nothing or only draw a refusal: without a pipeline one schedule and one
 *    chunk; the virtual stages as the schedule has them (2 with interleaved, 1 otherwise); sequence
 *    parallelism only with --tp 2 (8,064; every fifth of them runs, every eleventh under a sanitizer, all
 *    with LOOM_SWEEP_STRIDE=1: see sweep_stride). Success is the "check: ok" line or a refusal. What it leaves out, e.g. --sequence-parallel without --tp or
 *    --virtual-stages 2 with 1f1b, sweep_pairwise has.
 *  - sweep_pairwise: a covering set of all the combinations (every pair of two flags' values that some
 *    valid mesh allows appears in at least one run) trains for 2 steps. Success is a finite loss at
 *    step 2/2 or a refusal.
 * Neither reads the refusals of cli/train.c: whether a combination trains or is refused may change as
 * support lands; the property checked here may not. Commands run two at a time (LOOM_SWEEP_JOBS). */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"

enum { F_ZERO, F_TP, F_PP, F_SCHED, F_V, F_SP, F_AC, F_DTYPE, F_ACCUM, F_ARCH, F_RANKS, NF };
static const char *const factor_flag[NF] = {"--zero", "--tp", "--pp", "--pp-schedule", "--virtual-stages",
                                            "--sequence-parallel", "--activation-checkpointing", "--dtype",
                                            "--grad-accum", "--arch", "--nproc"};
/* (a switch's values: "" off, "on" given) */
static const char *const factor_vals[NF][4] = {
	{"0", "1", "2", "3"}, {"1", "2"}, {"1", "2", "4"}, {"gpipe", "1f1b", "interleaved"}, {"1", "2"}, {"", "on"},
	{"none", "blocks", "selective"}, {"fp32", "bf16"}, {"1", "2"}, {"gpt2", "nanochat"}, {"1", "2", "4", "8"}};
static const int factor_n[NF] = {4, 2, 3, 3, 2, 2, 3, 2, 2, 2, 4};

typedef struct {
	int v[NF];  /* index into factor_vals */
	char cmd[1024];
	int status; /* test_run_cmd's */
	int bad;    /* judged a failure (printed) */
} sweep_run_t;

static char g_dir[512];

/* The combination number k (mixed radix over the factors). */
static void combination(long k, int *v)
{
	for (int f = NF - 1; f >= 0; f--)
		v[f] = (int)(k % factor_n[f]), k /= factor_n[f];
}

static long combinations(void)
{
	long n = 1;
	for (int f = 0; f < NF; f++)
		n *= factor_n[f];
	return n;
}

/* tp x pp divides the rank count: some dp makes a mesh of it (the mesh's rule, not a refusal). */
static int mesh_valid(const int *v)
{
	int tp = atoi(factor_vals[F_TP][v[F_TP]]), pp = atoi(factor_vals[F_PP][v[F_PP]]);
	return atoi(factor_vals[F_RANKS][v[F_RANKS]]) % (tp * pp) == 0;
}

/* The flags mean something together: the pipeline's schedule and chunks only with a pipeline, the
 * interleaved schedule with 2 chunks (groups of pp micro-batches, at least a layer per chunk), the
 * others with 1; sequence parallelism with tp; ZeRO with at least 2 data-parallel ranks (each the
 * flags' own definition, not a refusal of cli/train.c). The pairwise sweep's later rounds try such a
 * combination first, so that a pair is tried apart from the values that can only be refused. */
static int coherent(const int *v)
{
	int tp = atoi(factor_vals[F_TP][v[F_TP]]), pp = atoi(factor_vals[F_PP][v[F_PP]]);
	int ranks = atoi(factor_vals[F_RANKS][v[F_RANKS]]), accum = atoi(factor_vals[F_ACCUM][v[F_ACCUM]]);
	int il = v[F_SCHED] == 2, V = atoi(factor_vals[F_V][v[F_V]]);
	if (!mesh_valid(v) || (pp == 1 && (il || V != 1)) || (il != (V == 2)) || (v[F_SP] && tp == 1))
		return 0;
	if (il && (accum % pp != 0 || pp * V > 4)) /* the model's 4 layers */
		return 0;
	return v[F_ZERO] == 0 || ranks / (tp * pp) >= 2;
}

static void make_cmd(sweep_run_t *r, int check)
{
	int n = snprintf(r->cmd, sizeof r->cmd, "OMP_NUM_THREADS=1 %s train --train-data '%s/train_*.bin' --n-layer 4 "
	                 "--n-head 4 --n-embd 64 --vocab-size 257 --n-positions 32 --batch-size 1 --seq-len 32 --steps 2 "
	                 "--schedule constant --lr 1e-3 --peak-flops 1e10 --threads 1%s", test_loom_bin(), g_dir,
	                 check ? " --check" : "");
	for (int f = 0; f < NF; f++)
		if (f == F_SP) /* a switch */
			n += snprintf(r->cmd + n, sizeof r->cmd - (size_t)n, "%s%s", *factor_vals[f][r->v[f]] ? " " : "",
			              *factor_vals[f][r->v[f]] ? factor_flag[f] : "");
		else
			n += snprintf(r->cmd + n, sizeof r->cmd - (size_t)n, " %s %s", factor_flag[f], factor_vals[f][r->v[f]]);
	r->status = -2, r->bad = 0; /* not run yet */
}

/* The run either succeeded (the check's line, or a finite loss at the last step) or stopped before
 * training with one error line naming a flag; 0 when so, else 1 with the reason printed. */
static int judge(const sweep_run_t *r, const char *out, int check)
{
	const char *why = NULL, *s;
	char line[2048], error[2048] = "";
	int errors = 0, launcher = 0, stepped = 0;
	for (s = out; *s;) {
		size_t len = strcspn(s, "\n");
		snprintf(line, sizeof line, "%.*s", (int)(len < sizeof line ? len : sizeof line - 1), s);
		s += len + (s[len] == '\n');
		if (strstr(line, "loom train: ") && !strstr(line, "loom train: warning: "))
			errors++, memcpy(error, line, sizeof error);
		if (strstr(line, "loom run: "))
			launcher++;
		if (strstr(line, "step 1/2 | loss "))
			stepped = 1;
	}
	if (r->status == -1)
		why = "timed out (a hang)";
	else if (r->status >= 128 || strstr(out, "killed by signal"))
		why = "killed by a signal";
	else if (r->status == 0 && check && !strstr(out, "check: ok: "))
		why = "exit 0 without the check's line";
	else if (r->status == 0 && !check) {
		const char *p = strstr(out, "step 2/2 | loss ");
		double loss = p ? strtod(p + 16, NULL) : NAN;
		if (!isfinite(loss))
			why = "exit 0 without a finite loss at step 2/2";
	} else if (r->status != 0 && stepped)
		why = "an error after training started";
	else if (r->status != 0 && (errors != 1 || launcher))
		why = "a refusal must be one line \"loom train: ...\", before any rank starts";
	else if (r->status != 0 && !strstr(error, "--"))
		why = "the refusal names no flag";
	else if (r->status != 0 && strstr(error, "trainer: "))
		why = "the refusal is a library error, not the flags' check";
	if (!why)
		return 0;
	flockfile(stderr);
	fprintf(stderr, "  %s: exit %d: %s\n  output:\n%s\n", why, r->status, r->cmd, out);
	funlockfile(stderr);
	return 1;
}

typedef struct {
	sweep_run_t *runs;
	long n;
	atomic_long next;
	double timeout_s;
	int check;
} sweep_pool_t;

/* Runs and judges the pool's next commands until none is left. */
static void *sweep_worker(void *arg)
{
	sweep_pool_t *p = arg;
	char *out = malloc(1 << 16);
	long k;
	while (out && (k = atomic_fetch_add(&p->next, 1)) < p->n) {
		sweep_run_t *r = &p->runs[k];
		r->status = test_run_cmd(r->cmd, out, 1 << 16, p->timeout_s);
		r->bad = judge(r, out, p->check);
	}
	free(out);
	return NULL;
}

/* Run every command, LOOM_SWEEP_JOBS (default 2) at a time; returns the failures judged. */
static int sweep_run(sweep_run_t *runs, long n, int check, double timeout_s, int *trained)
{
	const char *e = getenv("LOOM_SWEEP_JOBS");
	int jobs = e && atoi(e) > 0 ? atoi(e) : 2, failed = 0;
	pthread_t th[16];
	sweep_pool_t p = {.runs = runs, .n = n, .timeout_s = timeout_s, .check = check};
	atomic_init(&p.next, 0);
	jobs = jobs > 16 ? 16 : jobs;
	for (int j = 0; j < jobs; j++)
		if (pthread_create(&th[j], NULL, sweep_worker, &p) != 0)
			jobs = j;
	sweep_worker(&p);
	for (int j = 0; j < jobs; j++)
		pthread_join(th[j], NULL);
	*trained = 0;
	for (long k = 0; k < n; k++) {
		failed += runs[k].bad || runs[k].status == -2; /* -2: never run (out of memory) */
		*trained += runs[k].status == 0 && !runs[k].bad;
	}
	return failed;
}

static int make_data(void)
{
	if (test_mkdtemp(g_dir, sizeof g_dir) != 0)
		return 1;
	return test_make_token_data(g_dir, 257, 4096) != LOOM_OK;
}

/* The check runs every stride-th of its 8,064 combinations: 5 in a plain build (1,613 runs, about 50 s
 * on 2 cores), 11 under a sanitizer (734; every process several times slower), any with
 * LOOM_SWEEP_STRIDE (1: all of them, about 4 min). Both strides are prime to 96, the count of the
 * five fastest-varying factors' values (checkpointing, dtype, accumulation, arch, ranks), which
 * follow each other unfiltered: each (tp, pp, schedule, chunks, sp, zero) combination gets another
 * offset, so every (zero, tp, pp, schedule, chunks, sp) combination, every mesh with every ZeRO
 * stage and every pair of two factors' values is still run. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define DEFAULT_STRIDE 11
#else
#define DEFAULT_STRIDE 5
#endif

static long sweep_stride(void)
{
	const char *e = getenv("LOOM_SWEEP_STRIDE");
	long v = e && *e ? atol(e) : DEFAULT_STRIDE;
	return v >= 1 ? v : DEFAULT_STRIDE;
}

TEST(sweep_check)
{
	long n = combinations(), m = 0, stride = sweep_stride();
	int trained, failed;
	sweep_run_t *runs = calloc((size_t)n, sizeof *runs);
	CHECK(runs != NULL);
	CHECK_EQ(n, 27648);
	CHECK_EQ(make_data(), 0);
	for (long k = 0, j = 0; k < n; k++) {
		sweep_run_t *r = &runs[m];
		combination(k, r->v);
		/* the pipeline's schedule and chunks do nothing without a pipeline: one value of each there; the
		 * chunks as the schedule has them; sequence parallelism with tp only */
		if ((r->v[F_PP] == 0 && (r->v[F_SCHED] != 0 || r->v[F_V] != 0)) ||
		    (r->v[F_PP] > 0 && r->v[F_V] != (r->v[F_SCHED] == 2)) || (r->v[F_TP] == 0 && r->v[F_SP] != 0))
			continue;
		if (j++ % stride == 0) {
			make_cmd(r, 1);
			m++;
		}
	}
	failed = sweep_run(runs, m, 1, 120, &trained);
	printf("  %ld combinations checked (every %ld%s of 8,064): %d built, %ld refused, %d failed\n", m, stride,
	       stride == 1 ? "st" : "th", trained, m - trained - failed, failed);
	test_rmdir(g_dir);
	CHECK_EQ(failed, 0);
	/* 384 of the other flags' values x 21 of (tp, pp, schedule, chunks, sp): 1 without tp or pp, 2 with
	 * tp alone (sp off, on), 3 with pp alone at each of pp 2 and 4, 6 with both at each */
	CHECK_EQ(m, (384 * 21 + stride - 1) / stride);
	/* not all refused: plain data parallel (no ZeRO, tp or pp) builds with every other flag's value */
	int plain = 0;
	for (long k = 0; k < m; k++)
		if (runs[k].v[F_ZERO] == 0 && runs[k].v[F_TP] == 0 && runs[k].v[F_PP] == 0) {
			CHECK_MSG(runs[k].status == 0, "%s exited %d", runs[k].cmd, runs[k].status);
			plain++;
		}
	CHECK(plain > 0);
	free(runs);
	return 0;
}

/* Pairs (f, a) x (g, b), f < g, as one index into a table of NF x 4 x NF x 4 bits. */
#define PAIR(f, a, g, b) ((((f) * 4 + (a)) * NF + (g)) * 4 + (b))

/* New pairs row v would cover. */
static int new_pairs(const int *v, const unsigned char *covered)
{
	int n = 0;
	for (int f = 0; f < NF; f++)
		for (int g = f + 1; g < NF; g++)
			n += !covered[PAIR(f, v[f], g, v[g])];
	return n;
}

TEST(sweep_pairwise)
{
	enum { MAXRUNS = 200 };
	static unsigned char possible[NF * 4 * NF * 4], covered[NF * 4 * NF * 4], picked[NF * 4 * NF * 4];
	long n = combinations();
	int nruns = 0, trained, failed, npairs = 0;
	int v[NF];
	sweep_run_t *runs = calloc(MAXRUNS, sizeof *runs);
	CHECK(runs != NULL);
	memset(possible, 0, sizeof possible), memset(covered, 0, sizeof covered);
	/* the pairs some valid mesh allows ((tp 2, pp 4) needs 8 ranks; pp 4 never runs on 2) */
	for (long k = 0; k < n; k++) {
		combination(k, v);
		if (mesh_valid(v))
			for (int f = 0; f < NF; f++)
				for (int g = f + 1; g < NF; g++)
					possible[PAIR(f, v[f], g, v[g])] = 1;
	}
	for (size_t i = 0; i < sizeof possible; i++)
		covered[i] = !possible[i], npairs += possible[i];
	/* greedy covering (AETG-like): the valid combination covering the most new pairs, the first on ties */
	for (;;) {
		long best = -1;
		int best_new = 0;
		for (long k = 0; k < n; k++) {
			int m;
			combination(k, v);
			if (mesh_valid(v) && (m = new_pairs(v, covered)) > best_new)
				best = k, best_new = m;
		}
		if (best < 0)
			break;
		CHECK(nruns < MAXRUNS);
		combination(best, runs[nruns].v);
		for (int f = 0; f < NF; f++)
			for (int g = f + 1; g < NF; g++)
				covered[PAIR(f, runs[nruns].v[f], g, runs[nruns].v[g])] = 1;
		nruns++;
	}
	CHECK_EQ(npairs, 375); /* 379 pairs less (tp 2 | pp 2 | pp 4, 1 rank) and (pp 4, 2 ranks) */
	CHECK(nruns >= 16); /* zero x ranks alone has 16 pairs */
	CHECK_EQ(make_data(), 0);
	for (int k = 0; k < nruns; k++)
		make_cmd(&runs[k], 0);
	failed = sweep_run(runs, nruns, 0, 180, &trained);
	/* Then rounds for the pairs no run trained (their run was refused, maybe for another pair in it):
	 * each gets the run with the fewest other untrained pairs, so that what trains is tried apart from
	 * what does not; until a round adds no run (judged by the outcomes so far, not by cli/train.c). */
	int first2 = nruns, trained2 = 0;
	for (int round = 0, added = 1; added; round++) {
		int start = nruns, t;
		memset(covered, 0, sizeof covered);
		for (int k = 0; k < nruns; k++)
			for (int f = 0; f < NF && runs[k].status == 0 && !runs[k].bad; f++)
				for (int g = f + 1; g < NF; g++)
					covered[PAIR(f, runs[k].v[f], g, runs[k].v[g])] = 1; /* trained */
		memset(picked, 0, sizeof picked);
		for (int f = 0; f < NF; f++)
			for (int a = 0; a < factor_n[f]; a++)
				for (int g = f + 1; g < NF; g++)
					for (int b = 0; b < factor_n[g]; b++) {
						long best = -1;
						int best_new = NF * NF, p = PAIR(f, a, g, b), dup = 0;
						if (!possible[p] || covered[p] || picked[p]) /* picked: in a run of this round */
							continue;
						/* a coherent combination with the pair if there is one, else any valid one */
						for (int any = 0; any < 2 && best < 0; any++)
							for (long k = 0; k < n; k++) {
								int m;
								combination(k, v);
								if (v[f] == a && v[g] == b && (any ? mesh_valid(v) : coherent(v)) &&
								    (m = new_pairs(v, covered)) < best_new)
									best = k, best_new = m;
							}
						CHECK(best >= 0);
						combination(best, v);
						for (int k = 0; k < nruns && !dup; k++)
							dup = !memcmp(runs[k].v, v, sizeof v);
						if (dup)
							continue;
						CHECK(nruns < MAXRUNS);
						memcpy(runs[nruns].v, v, sizeof v);
						for (int f2 = 0; f2 < NF; f2++)
							for (int g2 = f2 + 1; g2 < NF; g2++)
								picked[PAIR(f2, v[f2], g2, v[g2])] = 1;
						make_cmd(&runs[nruns], 0);
						nruns++;
					}
		added = nruns > start;
		failed += sweep_run(runs + start, nruns - start, 0, 180, &t);
		trained2 += t;
	}
	printf("  %d runs cover the %d pairs, then %d more for the pairs no run trained: %d trained, %d refused, "
	       "%d failed\n", first2, npairs, nruns - first2, trained + trained2, nruns - trained - trained2 - failed,
	       failed);
	memset(covered, 0, sizeof covered);
	for (int k = 0; k < nruns; k++)
		for (int f = 0; f < NF && runs[k].status == 0 && !runs[k].bad; f++)
			for (int g = f + 1; g < NF; g++)
				covered[PAIR(f, runs[k].v[f], g, runs[k].v[g])] = 1;
	printf("  pairs no run trained (refused in every run that had them):");
	for (int f = 0; f < NF; f++)
		for (int a = 0; a < factor_n[f]; a++)
			for (int g = f + 1; g < NF; g++)
				for (int b = 0; b < factor_n[g]; b++)
					if (possible[PAIR(f, a, g, b)] && !covered[PAIR(f, a, g, b)])
						printf(" %s %s & %s %s;", factor_flag[f], factor_vals[f][a], factor_flag[g],
						       factor_vals[g][b]);
	printf("\n");
	/* not all refused: plain data parallel (no ZeRO) trained with every value of every other flag */
	for (int g = 1; g < NF; g++)
		for (int b = 0; b < factor_n[g]; b++)
			CHECK_MSG(!possible[PAIR(F_ZERO, 0, g, b)] || covered[PAIR(F_ZERO, 0, g, b)], "--zero 0 with %s %s",
			          factor_flag[g], factor_vals[g][b]);
	free(runs);
	test_rmdir(g_dir);
	CHECK_EQ(failed, 0);
	return 0;
}
