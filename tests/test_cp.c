/* test_cp.c: context parallelism (--cp N): the head-tail layout; the context-parallel attention
 * (src/model/cp_attention.c) of N forked ranks against the fused kernel over the whole sequence, forward
 * (out, lse) and every gradient, for N = 2, 3, 4, windows shorter than a chunk, of a chunk, spanning
 * chunks and none; the mesh's cp axis and dp x cp group; and training (`loom train --cp N`) against one
 * process for both families (gpt2 `tiny`, a small nanochat with a window shorter than T), with ZeRO-3
 * over dp x cp, activation checkpointing, tensor and pipeline parallel; a checkpoint written at cp 2
 * resuming at cp 1 and cp 4; a sequence length not divisible by 2 cp refused before any rank starts. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/loom.h"
#include "loom/mesh.h"
#include "model/kernels.h"
#include "parallel/strategy.h"
#include "test.h"

/* ---- the layout ---------------------------------------------------------------------------------- */

TEST(cp_layout_head_tail)
{
	/* T = 16, N = 2: chunks of 4; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2 */
	static const int want[2][8] = {{0, 1, 2, 3, 12, 13, 14, 15}, {4, 5, 6, 7, 8, 9, 10, 11}};
	int src[2 * 16], dst[2 * 8];
	for (int r = 0; r < 2; r++)
		for (int t = 0; t < 8; t++)
			CHECK_EQ(loom_cp_position(16, 2, r, t), want[r][t]);
	for (int i = 0; i < 32; i++)
		src[i] = 100 + i;
	loom_cp_take(dst, src, 2, 16, 2, 1);
	for (int b = 0; b < 2; b++)
		for (int t = 0; t < 8; t++)
			CHECK_EQ(dst[b * 8 + t], 100 + b * 16 + want[1][t]);
	/* every position is held by exactly one rank, for N = 1..4 */
	for (int N = 1; N <= 4; N++) {
		int T = 8 * N, seen[32] = {0};
		for (int r = 0; r < N; r++)
			for (int t = 0; t < T / N; t++)
				seen[loom_cp_position(T, N, r, t)]++;
		for (int p = 0; p < T; p++)
			CHECK_EQ(seen[p], 1);
	}
	CHECK_OK(loom_cp_check(16, 2));
	CHECK_OK(loom_cp_check(16, 1));
	CHECK_ERR(loom_cp_check(12, 4), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "sequence length 12 is not divisible by 2 x cp = 8");
	CHECK_ERR(loom_cp_check(4, 4), LOOM_EINVAL);
	return 0;
}

/* ---- the attention -------------------------------------------------------------------------------- */

typedef struct {
	int N, B, c, NH, NKV, D, W;
} att_case_t;

static float urnd(uint32_t *s) /* uniform in [-1, 1) */
{
	*s = *s * 1664525u + 1013904223u;
	return (float)(*s >> 8) / 8388608.0f - 1.0f;
}

static float *filled(size_t n, uint32_t seed)
{
	float *p = malloc(sizeof(float) * (n ? n : 1));
	for (size_t i = 0; i < n; i++)
		p[i] = urnd(&seed);
	return p;
}

/* dst (B, Tl, w) = rank r's rows of src (B, T, w). */
static void take_rows(float *dst, const float *src, int B, int T, int N, int r, int w)
{
	int Tl = T / N;
	for (int b = 0; b < B; b++)
		for (int t = 0; t < Tl; t++)
			memcpy(dst + ((size_t)b * Tl + t) * w, src + ((size_t)b * T + loom_cp_position(T, N, r, t)) * w,
			       sizeof(float) * (size_t)w);
}

/* got (B, Tl, w) against rank r's rows of want (B, T, w): within tol x the largest |want|. */
static int near_rows(const char *what, const float *got, const float *want, int B, int T, int N, int r, int w)
{
	int Tl = T / N;
	double mx = 0.0, worst = 0.0;
	for (size_t i = 0; i < (size_t)B * T * w; i++)
		mx = fmax(mx, fabs(want[i]));
	for (int b = 0; b < B; b++)
		for (int t = 0; t < Tl; t++)
			for (int i = 0; i < w; i++) {
				double g = got[((size_t)b * Tl + t) * w + i];
				double e = want[((size_t)b * T + loom_cp_position(T, N, r, t)) * w + i];
				worst = fmax(worst, fabs(g - e));
			}
	CHECK_MSG(worst <= 2e-5 * fmax(mx, 1e-3), "%s: rank %d of %d: off by %g (largest %g)", what, r, N, worst, mx);
	return 0;
}

static int att_rank(int rank, int nranks, void *arg)
{
	const att_case_t *k = arg;
	int N = nranks, B = k->B, c = k->c, T = 2 * N * c, Tl = 2 * c, NH = k->NH, NKV = k->NKV, D = k->D;
	int QD = NH * D, KVD = NKV * D, threads = 1;
	loom_comm_t *comm;
	loom_set_num_threads(threads);
	CHECK_OK(loom_comm_init(&comm));
	CHECK_EQ(loom_comm_size(comm), k->N);
	/* the whole sequences, the same on every rank, and one process's attention of them */
	float *q = filled((size_t)B * T * QD, 11), *kk = filled((size_t)B * T * KVD, 12), *v = filled((size_t)B * T * KVD, 13);
	float *dout = filled((size_t)B * T * QD, 14);
	float *out = calloc((size_t)B * T * QD, sizeof(float)), *lse = calloc((size_t)B * NH * T, sizeof(float));
	float *dq = calloc((size_t)B * T * QD, sizeof(float)), *dk = calloc((size_t)B * T * KVD, sizeof(float));
	float *dv = calloc((size_t)B * T * KVD, sizeof(float));
	float *scr = calloc(loom__flash_scratch_floats(B, T, NKV, D, threads) + 1, sizeof(float));
	loom__flash_t whole = {.q = q, .k = kk, .v = v, .ldq = QD, .ldk = KVD, .B = B, .Tq = T, .Tk = T, .NH = NH,
	                       .NKV = NKV, .D = D, .W = k->W, .scale = 1.0f / sqrtf((float)D)};
	loom__flash_forward(&whole, out, QD, lse);
	loom__flash_backward(&whole, dq, QD, dk, dv, KVD, dout, QD, out, QD, lse, scr, threads);
	/* this rank's rows, through the group */
	float *lq = malloc(sizeof(float) * (size_t)B * Tl * QD), *lk = malloc(sizeof(float) * (size_t)B * Tl * KVD);
	float *lv = malloc(sizeof(float) * (size_t)B * Tl * KVD), *ldo = malloc(sizeof(float) * (size_t)B * Tl * QD);
	take_rows(lq, q, B, T, N, rank, QD), take_rows(lk, kk, B, T, N, rank, KVD), take_rows(lv, v, B, T, N, rank, KVD);
	take_rows(ldo, dout, B, T, N, rank, QD);
	float *lout = calloc((size_t)B * Tl * QD, sizeof(float)), *llse = calloc((size_t)B * NH * Tl, sizeof(float));
	float *ldq = calloc((size_t)B * Tl * QD, sizeof(float)), *ldk = calloc((size_t)B * Tl * KVD, sizeof(float));
	float *ldv = calloc((size_t)B * Tl * KVD, sizeof(float));
	float *mem = calloc(loom__cp_scratch_floats(B, T, KVD), sizeof(float));
	loom__tp_group_t g;
	loom__tp_group_init(&g, comm);
	g.name = "context parallel";
	loom__cp_t cp = {.N = N, .r = rank, .fn = loom__tp_group_reduce, .ctx = &g, .scratch = scr,
	                 .scratch_threads = threads};
	loom__cp_scratch_point(&cp, mem, B, T, KVD);
	loom__flash_t a = {.q = lq, .k = lk, .v = lv, .ldq = QD, .ldk = KVD, .B = B, .Tq = Tl, .Tk = Tl, .NH = NH,
	                   .NKV = NKV, .D = D, .W = k->W, .scale = 1.0f / sqrtf((float)D)};
	CHECK_OK(loom__cp_attention_forward(&cp, &a, lout, QD, llse));
	CHECK_OK(near_rows("out", lout, out, B, T, N, rank, QD));
	for (int h = 0; h < 2; h++) /* lse: chunk h's block (B, NH, c) */
		for (int b = 0; b < B; b++)
			for (int hd = 0; hd < NH; hd++)
				for (int i = 0; i < c; i++) {
					float got = llse[(size_t)h * B * NH * c + ((size_t)b * NH + hd) * c + i];
					float want = lse[((size_t)b * NH + hd) * T + loom_cp_position(T, N, rank, h * c + i)];
					CHECK_NEAR(got, want, 2e-5 * fmax(1.0, fabs(want)));
				}
	/* the backward accumulates: start from ones, compare after taking them off */
	for (size_t i = 0; i < (size_t)B * Tl * QD; i++)
		ldq[i] = 1.0f;
	CHECK_OK(loom__cp_attention_backward(&cp, &a, ldq, QD, ldk, ldv, KVD, ldo, QD, lout, QD, llse));
	for (size_t i = 0; i < (size_t)B * Tl * QD; i++)
		ldq[i] -= 1.0f;
	CHECK_OK(near_rows("dq", ldq, dq, B, T, N, rank, QD));
	CHECK_OK(near_rows("dk", ldk, dk, B, T, N, rank, KVD));
	CHECK_OK(near_rows("dv", ldv, dv, B, T, N, rank, KVD));
	free(q), free(kk), free(v), free(dout), free(out), free(lse), free(dq), free(dk), free(dv), free(scr);
	free(lq), free(lk), free(lv), free(ldo), free(lout), free(llse), free(ldq), free(ldk), free(ldv), free(mem);
	loom_comm_destroy(comm);
	return 0;
}

/* Windows: none (-1), 3 (inside a chunk), a chunk, one across two chunk boundaries, the whole sequence. */
static int att_cases(int N, int c)
{
	int windows[] = {-1, 3, c, 2 * c + 1, 2 * N * c};
	for (size_t w = 0; w < sizeof windows / sizeof *windows; w++) {
		att_case_t k = {.N = N, .B = 2, .c = c, .NH = 4, .NKV = 2, .D = 8, .W = windows[w]};
		CHECK_MSG(test_spawn(N, att_rank, &k, 60, NULL) == 0, "cp %d, chunks of %d, window %d", N, c, windows[w]);
	}
	return 0;
}

TEST(cp_attention_matches_whole_cp2)
{
	/* chunks of 20 (one query block each), and of 70: T = 280 spans two key blocks */
	return att_cases(2, 20) || att_cases(2, 70);
}

TEST(cp_attention_matches_whole_cp3)
{
	return att_cases(3, 12);
}

TEST(cp_attention_matches_whole_cp4)
{
	return att_cases(4, 10);
}

/* ---- training against one process, by the CLI -------------------------------------------------------- */

enum { STEPS = 8, MAXSTEPS = 64 };

/* gpt2 `tiny` (L4 H4 C128, vocabulary 257) and a small nanochat (L4 C64, 4 heads on 2 kv heads, window
 * pattern SL with a short window of 8 < T = 16), each at 256 tokens per step whatever the mesh */
#define CP_GPT2                                                                                                 \
	"--model tiny --batch-size 2 --seq-len 32 --lr 3e-3 --warmup 2 --shuffle 1 --seed 7 --peak-flops 1e10 "       \
	"--total-batch-size 512"
#define CP_NC                                                                                                   \
	"--arch nanochat --n-layer 4 --n-embd 64 --n-head 4 --n-kv-head 2 --window-pattern SL --short-window 8 "    \
	"--vocab-size 64 --batch-size 2 --seq-len 16 --warmup 1 --shuffle 1 --seed 7 --peak-flops 1e10 "             \
	"--total-batch-size 256 --lr 2e-3"

#define RUN_OK(cmd, out, timeout)                                                                                \
	do {                                                                                                         \
		int st_ = test_run_cmd(cmd, out, sizeof out, timeout);                                                   \
		CHECK_MSG(st_ == 0, "`%s` exited %d:\n%s", cmd, st_, out);                                               \
	} while (0)

typedef struct {
	const char *name, *flags, *want; /* want: a line the run's output must contain (or NULL) */
} cp_run_t;

/* One process of `base` on data of `vocab`, then each run (its flags added): every step's loss within
 * 1e-5 relative of one process's. */
static int cp_runs_match(const char *base, int vocab, const cp_run_t *runs, size_t n)
{
	char dir[512], cmd[4096], out[32768], path[1024];
	double ref[MAXSTEPS] = {0}, got[MAXSTEPS] = {0};
	const char *loom = test_loom_bin();
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(test_make_token_data(dir, vocab, 20001));
	snprintf(cmd, sizeof cmd, "%s train --train-data '%s/train_*.bin' %s --steps %d --log %s/one.jsonl", loom, dir,
	         base, STEPS, dir);
	RUN_OK(cmd, out, 180);
	snprintf(path, sizeof path, "%s/one.jsonl", dir);
	CHECK_EQ(test_read_losses(path, ref, MAXSTEPS, NULL, NULL), STEPS);
	CHECK_MSG(ref[STEPS] < ref[1] - 0.05, "one process did not learn: %g .. %g", ref[1], ref[STEPS]);
	for (size_t k = 0; k < n; k++) {
		snprintf(cmd, sizeof cmd, "%s train --train-data '%s/train_*.bin' %s --steps %d --log %s/r%zu.jsonl %s", loom,
		         dir, base, STEPS, dir, k, runs[k].flags);
		RUN_OK(cmd, out, 300);
		if (runs[k].want)
			CHECK_CONTAINS(out, runs[k].want);
		snprintf(path, sizeof path, "%s/r%zu.jsonl", dir, k);
		CHECK_EQ(test_read_losses(path, got, MAXSTEPS, NULL, NULL), STEPS);
		for (int s = 1; s <= STEPS; s++)
			CHECK_MSG(fabs(got[s] - ref[s]) <= 1e-5 * ref[s], "%s, step %d: loss %.9g, one process %.9g",
			          runs[k].name, s, got[s], ref[s]);
	}
	test_rmdir(dir);
	return 0;
}

TEST(cp_gpt2_matches_one_process)
{
	static const cp_run_t runs[] = {
		{"cp2", "--nproc 2 --cp 2 --check-replicas 1",
		 "context parallel: cp 2 x dp 1 x tp 1 x pp 1 = 2 ranks; each rank holds 16 of a sequence's 32 positions "
		 "as 2 chunks of 8 (rank r: chunks r and 3-r of 4; rank 0: positions 0-7 and 24-31)"},
		{"cp4", "--nproc 4 --cp 4", "gradients averaged over dp x cp = 4 ranks"},
		{"cp2 selective", "--nproc 2 --cp 2 --activation-checkpointing selective", NULL},
	};
	return cp_runs_match(CP_GPT2, 257, runs, sizeof runs / sizeof *runs);
}

TEST(cp_nanochat_matches_one_process)
{
	static const cp_run_t runs[] = {
		{"cp2", "--nproc 2 --cp 2 --check-replicas 1", NULL},
		{"cp4", "--nproc 4 --cp 4", NULL},
		{"cp2 blocks", "--nproc 2 --cp 2 --activation-checkpointing blocks", NULL},
	};
	return cp_runs_match(CP_NC, 64, runs, sizeof runs / sizeof *runs);
}
