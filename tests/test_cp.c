/* test_cp.c: context parallelism (--cp N): the head-tail layout; the context-parallel attention
 * (src/model/cp_attention.c), ring and all-gather, of N forked ranks against the fused kernel over the
 * whole sequence, forward (out, lse) and every gradient, for N = 2, 3, 4, windows shorter than a chunk,
 * of a chunk, spanning chunks and none; and training (`loom train --cp N`) against one process for both
 * families (gpt2 `tiny`, a small nanochat with a window shorter than T), with ZeRO-3 over dp x cp,
 * activation checkpointing, tensor and pipeline parallel, MuonAdamW, bf16 and evaluation; a checkpoint
 * written at cp 2 resuming at cp 1 and cp 4; a sequence length not divisible by 2 cp refused before
 * any rank starts; `loom run`, `loom plan` and the trace. (The mesh's cp axis: tests/test_mesh.c.) */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/loom.h"
#include "loom/mesh.h"
#include "loom/nanochat.h"
#include "loom/plan.h"
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
			CHECK_EQ(loom_cp_position(16, 2, 2, r, t), want[r][t]);
	for (int i = 0; i < 32; i++)
		src[i] = 100 + i;
	loom_cp_take(dst, src, 2, 16, 2, 2, 1);
	for (int b = 0; b < 2; b++)
		for (int t = 0; t < 8; t++)
			CHECK_EQ(dst[b * 8 + t], 100 + b * 16 + want[1][t]);
	/* every position is held by exactly one rank, for N = 1..4 and 2, 4 or 8 chunks per rank */
	for (int N = 1; N <= 4; N++)
		for (int K = 2; K <= 8; K *= 2) {
			int T = 8 * N, seen[32] = {0};
			for (int r = 0; r < N; r++)
				for (int t = 0; t < T / N; t++)
					seen[loom_cp_position(T, N, K, r, t)]++;
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

/* Keys that rank r's queries see, counted one query at a time (query p sees keys max(0, p - W)..p; W < 0:
 * all of its prefix). */
static double keys_by_position(int T, int N, int K, int r, int W)
{
	double n = 0.0;
	for (int t = 0; t < T / N; t++) {
		int p = loom_cp_position(T, N, K, r, t);
		n += W < 0 || W >= p ? p + 1 : W + 1;
	}
	return n;
}

/* Keys of rank r over all of cfg's blocks (their windows), counted by position. */
static double model_keys(const loom_model_config_t *cfg, const int *windows, int T, int N, int K, int r)
{
	double n = 0.0;
	for (int l = 0; l < cfg->n_layer; l++)
		n += keys_by_position(T, N, K, r, windows[l]);
	return n;
}

/* Four chunks per rank: the segments of head-tail pairs; the work count against one query at a time; the
 * choice, which balances nanochat's "SSSL" windows where head-tail does not. */
TEST(cp_layout_balances_windows)
{
	/* T = 16, N = 2, K = 4: chunks of 2, segments {0..3}, {4..7}; rank 0 holds 0, 3, 4, 7, rank 1 1, 2, 5, 6 */
	static const int want[2][8] = {{0, 1, 6, 7, 8, 9, 14, 15}, {2, 3, 4, 5, 10, 11, 12, 13}};
	for (int r = 0; r < 2; r++)
		for (int t = 0; t < 8; t++)
			CHECK_EQ(loom_cp_position(16, 2, 4, r, t), want[r][t]);
	/* the exact count per chunk is the sum over the rank's queries */
	static const int Ws[] = {-1, 0, 1, 5, 16, 24, 47, 48, 95, 200};
	for (int N = 1; N <= 4; N++)
		for (int K = 2; K <= 8; K *= 2)
			for (size_t w = 0; w < sizeof Ws / sizeof *Ws; w++)
				for (int r = 0; r < N; r++)
					CHECK_NEAR(loom__cp_rank_keys(96, N, K, r, Ws[w]), keys_by_position(96, N, K, r, Ws[w]), 0.0);
	/* nanochat --depth 6 at T = 4096 (the benchmark's model): short window 2048 on blocks 0-2 and 4, the
	 * whole prefix on 3 and 5 (the last block is always long) */
	loom_model_config_t nc;
	CHECK_OK(loom_nanochat_depth_config(6, 0, 0, 4096, 257, &nc));
	int win[6];
	for (int l = 0; l < 6; l++)
		win[l] = l == 3 || l == 5 ? -1 : 2048;
	CHECK_EQ(loom_cp_chunks(&nc, 4096, 2), 4);
	/* head-tail: balanced on the long blocks, not on the windowed ones (rank 0: chunks 0 and 3, 0.5 + 2
	 * in c^2; rank 1: chunks 1 and 2, 1.5 + 2; both 4 on a long block): over the 4 windowed and 2 long
	 * blocks rank 1 does 22/18 of rank 0's work */
	double h0 = model_keys(&nc, win, 4096, 2, 2, 0), h1 = model_keys(&nc, win, 4096, 2, 2, 1);
	CHECK_NEAR(keys_by_position(4096, 2, 2, 0, -1), keys_by_position(4096, 2, 2, 1, -1), 0.0);
	CHECK_MSG(h1 > 1.22 * h0 && h1 < 1.223 * h0, "head-tail: rank 1 sees %.0f keys, rank 0 %.0f", h1, h0);
	/* four chunks: every block balanced, to the key */
	for (int l = 0; l < 6; l++)
		CHECK_NEAR(keys_by_position(4096, 2, 4, 0, win[l]), keys_by_position(4096, 2, 4, 1, win[l]), 0.0);
	CHECK_NEAR(model_keys(&nc, win, 4096, 2, 4, 0), (h0 + h1) / 2, 0.0);
	/* cp 4 as well; a sequence that does not divide into 4 N chunks keeps head-tail; GPT-2 (causal
	 * everywhere: head-tail is already exact) keeps head-tail */
	CHECK_EQ(loom_cp_chunks(&nc, 4096, 4), 4);
	for (int r = 1; r < 4; r++)
		CHECK_NEAR(model_keys(&nc, win, 4096, 4, 4, r), model_keys(&nc, win, 4096, 4, 4, 0), 0.0);
	CHECK_EQ(loom_cp_chunks(&nc, 4092, 2), 2);
	CHECK_EQ(loom_cp_chunks(&nc, 4096, 1), 1);
	loom_model_config_t g;
	CHECK_OK(loom_gpt2_preset("tiny", &g));
	CHECK_EQ(loom_cp_chunks(&g, 32, 2), 2);
	CHECK_EQ(loom_cp_chunks(&g, 128, 4), 2);
	return 0;
}

/* ---- the attention -------------------------------------------------------------------------------- */

typedef struct {
	int N, K, B, c, NH, NKV, D, W; /* K chunks of c per rank */
	int ring;                      /* the form: 1 the ring, 0 the all-gather */
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
static void take_rows(float *dst, const float *src, int B, int T, int N, int K, int r, int w)
{
	int Tl = T / N;
	for (int b = 0; b < B; b++)
		for (int t = 0; t < Tl; t++)
			memcpy(dst + ((size_t)b * Tl + t) * w, src + ((size_t)b * T + loom_cp_position(T, N, K, r, t)) * w,
			       sizeof(float) * (size_t)w);
}

/* got (B, Tl, w) against rank r's rows of want (B, T, w): within tol x the largest |want|. */
static int near_rows(const char *what, const float *got, const float *want, int B, int T, int N, int K, int r,
                     int w)
{
	int Tl = T / N;
	double mx = 0.0, worst = 0.0;
	for (size_t i = 0; i < (size_t)B * T * w; i++)
		mx = fmax(mx, fabs(want[i]));
	for (int b = 0; b < B; b++)
		for (int t = 0; t < Tl; t++)
			for (int i = 0; i < w; i++) {
				double g = got[((size_t)b * Tl + t) * w + i];
				double e = want[((size_t)b * T + loom_cp_position(T, N, K, r, t)) * w + i];
				worst = fmax(worst, fabs(g - e));
			}
	CHECK_MSG(worst <= 2e-5 * fmax(mx, 1e-3), "%s: rank %d of %d: off by %g (largest %g)", what, r, N, worst, mx);
	return 0;
}

static int att_rank(int rank, int nranks, void *arg)
{
	const att_case_t *k = arg;
	int N = nranks, K = k->K, B = k->B, c = k->c, T = K * N * c, Tl = K * c, NH = k->NH, NKV = k->NKV, D = k->D;
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
	take_rows(lq, q, B, T, N, K, rank, QD), take_rows(lk, kk, B, T, N, K, rank, KVD);
	take_rows(lv, v, B, T, N, K, rank, KVD), take_rows(ldo, dout, B, T, N, K, rank, QD);
	float *lout = calloc((size_t)B * Tl * QD, sizeof(float)), *llse = calloc((size_t)B * NH * Tl, sizeof(float));
	float *ldq = calloc((size_t)B * Tl * QD, sizeof(float)), *ldk = calloc((size_t)B * Tl * KVD, sizeof(float));
	float *ldv = calloc((size_t)B * Tl * KVD, sizeof(float));
	float *mem = calloc(loom__cp_scratch_floats(B, Tl, N, NH, NKV, D), sizeof(float));
	loom__tp_group_t g;
	loom__tp_group_init(&g, comm);
	g.name = "context parallel";
	loom__cp_t cp = {.N = N, .r = rank, .K = K, .ring = k->ring, .fn = loom__tp_group_reduce, .ctx = &g, .mem = mem,
	                 .scratch = scr, .scratch_threads = threads};
	loom__flash_t a = {.q = lq, .k = lk, .v = lv, .ldq = QD, .ldk = KVD, .B = B, .Tq = Tl, .Tk = Tl, .NH = NH,
	                   .NKV = NKV, .D = D, .W = k->W, .scale = 1.0f / sqrtf((float)D)};
	CHECK_OK(loom__cp_attention_forward(&cp, &a, lout, QD, llse));
	CHECK_OK(near_rows("out", lout, out, B, T, N, K, rank, QD));
	for (int h = 0; h < K; h++) /* lse: chunk h's block (B, NH, c) */
		for (int b = 0; b < B; b++)
			for (int hd = 0; hd < NH; hd++)
				for (int i = 0; i < c; i++) {
					float got = llse[(size_t)h * B * NH * c + ((size_t)b * NH + hd) * c + i];
					float want = lse[((size_t)b * NH + hd) * T + loom_cp_position(T, N, K, rank, h * c + i)];
					CHECK_NEAR(got, want, 2e-5 * fmax(1.0, fabs(want)));
				}
	/* the backward accumulates: start from ones, compare after taking them off */
	for (size_t i = 0; i < (size_t)B * Tl * QD; i++)
		ldq[i] = 1.0f;
	CHECK_OK(loom__cp_attention_backward(&cp, &a, ldq, QD, ldk, ldv, KVD, ldo, QD, lout, QD, llse));
	for (size_t i = 0; i < (size_t)B * Tl * QD; i++)
		ldq[i] -= 1.0f;
	CHECK_OK(near_rows("dq", ldq, dq, B, T, N, K, rank, QD));
	CHECK_OK(near_rows("dk", ldk, dk, B, T, N, K, rank, KVD));
	CHECK_OK(near_rows("dv", ldv, dv, B, T, N, K, rank, KVD));
	free(q), free(kk), free(v), free(dout), free(out), free(lse), free(dq), free(dk), free(dv), free(scr);
	free(lq), free(lk), free(lv), free(ldo), free(lout), free(llse), free(ldq), free(ldk), free(ldv), free(mem);
	loom_comm_destroy(comm);
	return 0;
}

/* Windows: none (-1), 3 (inside a chunk), a chunk, one across two chunk boundaries, half the sequence
 * (nanochat's short window), the whole sequence; both forms, the ring and the all-gather; K chunks of c
 * per rank. */
static int att_cases(int N, int c, int K)
{
	int windows[] = {-1, 3, c, 2 * c + 1, K * N * c / 2, K * N * c};
	for (int ring = 0; ring < 2; ring++)
		for (size_t w = 0; w < sizeof windows / sizeof *windows; w++) {
			att_case_t k = {.N = N, .K = K, .B = 2, .c = c, .NH = 4, .NKV = 2, .D = 8, .W = windows[w], .ring = ring};
			CHECK_MSG(test_spawn(N, att_rank, &k, 60, NULL) == 0, "cp %d (%s), %d chunks of %d, window %d", N,
			          ring ? "ring" : "all-gather", K, c, windows[w]);
		}
	return 0;
}

TEST(cp_attention_matches_whole_cp2)
{
	/* chunks of 20 (one query block each), and of 70: T = 280 spans two key blocks */
	return att_cases(2, 20, 2) || att_cases(2, 70, 2);
}

TEST(cp_attention_matches_whole_cp3)
{
	return att_cases(3, 12, 2);
}

TEST(cp_attention_matches_whole_cp4)
{
	return att_cases(4, 10, 2);
}

/* The layout of four and eight chunks per rank (two and four segments of head-tail pairs). */
TEST(cp_attention_matches_whole_more_chunks)
{
	return att_cases(2, 10, 4) || att_cases(3, 6, 4) || att_cases(2, 5, 8);
}

/* ---- training against one process, by the CLI -------------------------------------------------------- */

enum { STEPS = 8, MAXSTEPS = 64 };

/* gpt2 `tiny` (L4 H4 C128, vocabulary 257: T = 32 in chunks of 8 at cp 2, 4 at cp 4) and a small nanochat
 * (L4 C64, 4 heads on 2 kv heads, window pattern SL with a short window of 8 < T = 16: chunks of 4 at cp 2,
 * of 2 at cp 4, so the window spans chunks of other ranks), each at the same tokens per step whatever
 * the mesh; evaluation on 3 windows every 4 steps */
#define CP_GPT2                                                                                                 \
	"--model tiny --batch-size 2 --seq-len 32 --lr 3e-3 --warmup 2 --shuffle 1 --seed 7 --peak-flops 1e10 "       \
	"--total-batch-size 512 --eval-every 4 --eval-batches 3"
#define CP_NC_BASE                                                                                              \
	"--arch nanochat --n-layer 4 --n-embd 64 --n-head 4 --n-kv-head 2 --window-pattern SL --short-window 8 "    \
	"--vocab-size 64 --batch-size 2 --seq-len 16 --warmup 1 --shuffle 1 --seed 7 --peak-flops 1e10 "             \
	"--total-batch-size 256 --eval-every 4 --eval-batches 3"
#define CP_NC CP_NC_BASE " --lr 2e-3"
/* the same nanochat at T = 12: 12 does not divide into 4 x cp chunks, so head-tail (its windowed
 * layers unbalanced, still exact) */
#define CP_NC12                                                                                                 \
	"--arch nanochat --n-layer 4 --n-embd 64 --n-head 4 --n-kv-head 2 --window-pattern SL --short-window 8 "    \
	"--vocab-size 64 --batch-size 2 --seq-len 12 --warmup 1 --shuffle 1 --seed 7 --peak-flops 1e10 "             \
	"--total-batch-size 192 --eval-every 4 --eval-batches 3 --lr 2e-3"

typedef struct {
	const char *name, *flags, *want; /* want: a line the run's output must contain (or NULL) */
	const char *env;                 /* NULL, or "NAME=VALUE" for the run's environment */
} cp_run_t;

/* One process of `base` (+ `extra`, e.g. an optimizer or a dtype) on data of `vocab`, then each run (its
 * flags added): every step's loss and validation loss within tol relative of one process's. */
static int cp_runs_match(const char *base, const char *extra, int vocab, const cp_run_t *runs, size_t n, double tol)
{
	char dir[512], cmd[4096], out[32768], path[1024];
	double ref[MAXSTEPS] = {0}, got[MAXSTEPS] = {0}, rval[MAXSTEPS] = {0}, gval[MAXSTEPS] = {0};
	const char *loom = test_loom_bin();
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(test_make_token_data(dir, vocab, 20001));
	snprintf(cmd, sizeof cmd, "%s train --train-data '%s/train_*.bin' --val-data '%s/train_*.bin' %s %s --steps %d "
	         "--log %s/one.jsonl", loom, dir, dir, base, extra, STEPS, dir);
	RUN_OK(cmd, out, 180);
	snprintf(path, sizeof path, "%s/one.jsonl", dir);
	CHECK_EQ(test_read_losses(path, ref, MAXSTEPS, NULL, rval), STEPS);
	CHECK_MSG(ref[STEPS] < ref[1] - 0.05, "one process did not learn: %g .. %g", ref[1], ref[STEPS]);
	CHECK(rval[4] > 0 && rval[STEPS] > 0);
	for (size_t k = 0; k < n; k++) {
		snprintf(cmd, sizeof cmd, "%s %s train --train-data '%s/train_*.bin' --val-data '%s/train_*.bin' %s %s --steps %d "
		         "--log %s/r%zu.jsonl %s", runs[k].env ? runs[k].env : "", loom, dir, dir, base, extra, STEPS, dir, k,
		         runs[k].flags);
		RUN_OK(cmd, out, 600);
		if (runs[k].want)
			CHECK_CONTAINS(out, runs[k].want);
		snprintf(path, sizeof path, "%s/r%zu.jsonl", dir, k);
		memset(gval, 0, sizeof gval);
		CHECK_EQ(test_read_losses(path, got, MAXSTEPS, NULL, gval), STEPS);
		for (int s = 1; s <= STEPS; s++) {
			CHECK_MSG(fabs(got[s] - ref[s]) <= tol * ref[s], "%s, step %d: loss %.9g, one process %.9g",
			          runs[k].name, s, got[s], ref[s]);
			CHECK_MSG(fabs(gval[s] - rval[s]) <= tol * ref[s], "%s, step %d: validation loss %.9g, one process %.9g",
			          runs[k].name, s, gval[s], rval[s]);
		}
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
		{"cp4", "--nproc 4 --cp 4", "attention passes the keys and values around the ring of the group, "
		 "overlapped with the blocks' work (0.05 MiB received per layer forward, twice that backward); gradients "
		 "averaged over dp x cp = 4 ranks"},
		{"cp2 selective", "--nproc 2 --cp 2 --activation-checkpointing selective", NULL},
		{"cp2 x dp2 zero3", "--nproc 4 --cp 2 --zero 3", "data parallel: 4 ranks x 1 thread; ZeRO stage 3"},
		/* the all-gather form (the ring is the default) */
		{"cp2 gather", "--nproc 2 --cp 2", "attention all-gathers the keys and values", "LOOM_CP_ATTENTION=gather"},
		{"cp4 gather selective", "--nproc 4 --cp 4 --activation-checkpointing selective", NULL,
		 "LOOM_CP_ATTENTION=gather"},
	};
	return cp_runs_match(CP_GPT2, "", 257, runs, sizeof runs / sizeof *runs, 1e-5);
}

/* nanochat's window (8 of T = 16) takes the layout of 4 chunks per rank (loom_cp_chunks), at cp 2 and
 * cp 4 (chunks of one position); at T = 12, head-tail. */
TEST(cp_nanochat_matches_one_process)
{
	static const cp_run_t runs[] = {
		{"cp2", "--nproc 2 --cp 2 --check-replicas 1",
		 "each rank holds 8 of a sequence's 16 positions as 4 chunks of 2 (rank r: chunks r and 3-r of each of 2 "
		 "segments of 4 chunks, which balances the windows; rank 0: positions 0-1, 6-7, 8-9 and 14-15)"},
		{"cp4", "--nproc 4 --cp 4", "as 4 chunks of 1 (rank r: chunks r and 7-r of each of 2 segments of 8 chunks"},
		{"cp2 blocks", "--nproc 2 --cp 2 --activation-checkpointing blocks", NULL},
		{"cp2 x dp2 zero3", "--nproc 4 --cp 2 --zero 3", NULL},
		{"cp4 gather", "--nproc 4 --cp 4", NULL, "LOOM_CP_ATTENTION=gather"},
	};
	static const cp_run_t head_tail[] = {
		{"cp2 T12", "--nproc 2 --cp 2", "as 2 chunks of 3 (rank r: chunks r and 3-r of 4; rank 0: positions 0-2 and "
		 "9-11)"},
	};
	return cp_runs_match(CP_NC, "", 64, runs, sizeof runs / sizeof *runs, 1e-5) ||
	       cp_runs_match(CP_NC12, "", 64, head_tail, 1, 1e-5);
}

/* Context parallel under tensor parallel (the gathers of the local heads' keys and values; with
 * sequence parallelism on the rank's rows), pipeline parallel (each stage's blocks gather over the
 * stage's cp group; 1F1B and interleaved) and all four axes at once. */
TEST(cp_composes_with_tp_and_pp)
{
	static const cp_run_t gpt2[] = {
		{"cp2 x tp2", "--nproc 4 --cp 2 --tp 2", NULL},
		{"cp2 x tp2 sp", "--nproc 4 --cp 2 --tp 2 --sequence-parallel", NULL},
		{"cp2 x pp2", "--nproc 4 --cp 2 --pp 2", NULL},
		{"cp2 x pp2 interleaved", "--nproc 4 --cp 2 --pp 2 --pp-schedule interleaved --virtual-stages 2", NULL},
		{"cp2 x tp2 x pp2 x zero1 blocks", "--nproc 8 --cp 2 --tp 2 --pp 2 --dp 1 --zero 1 --activation-checkpointing "
		 "blocks", "context parallel: cp 2 x dp 1 x tp 2 x pp 2 = 8 ranks"},
	};
	static const cp_run_t nc[] = {
		{"cp2 x tp2", "--nproc 4 --cp 2 --tp 2", NULL},
		{"cp2 x pp2", "--nproc 4 --cp 2 --pp 2", NULL},
	};
	return cp_runs_match(CP_GPT2, "", 257, gpt2, sizeof gpt2 / sizeof *gpt2, 1e-5) ||
	       cp_runs_match(CP_NC, "", 64, nc, sizeof nc / sizeof *nc, 1e-5);
}

/* MuonAdamW (DistMuon over dp x cp) against one MuonAdamW process; bf16 matmuls against one bf16
 * process, within 2e-4 (the products' operands are rounded to bf16 in blocks of other shapes; a wrong
 * position moves the first loss by 2e-3). */
TEST(cp_muon_and_bf16_match_one_process)
{
	static const cp_run_t muon[] = {{"cp2 muon", "--nproc 2 --cp 2", NULL}};
	static const cp_run_t bf16[] = {{"cp2 bf16", "--nproc 2 --cp 2", NULL}};
	return cp_runs_match(CP_GPT2, "--optimizer muon", 257, muon, 1, 1e-5) ||
	       cp_runs_match(CP_NC_BASE, "--optimizer muon", 64, muon, 1, 1e-5) ||
	       cp_runs_match(CP_GPT2, "--dtype bf16", 257, bf16, 1, 2e-4);
}

/* A checkpoint does not depend on cp: written at cp 2 (step 4 of 8), it resumes on one process, at cp 4 and
 * at cp 2 x dp 2 under ZeRO-3 (its shards cut from the whole state), and each continues within 1e-6 of
 * the cp 2 run's own steps 5-8 (training and validation losses). For GPT-2 (head-tail) and a windowed
 * nanochat (4 chunks per rank at cp 2 and cp 4). */
static int resumes_at_any_cp(const char *flags, int vocab)
{
	static const char *const resumes[] = {"", "--nproc 4 --cp 4", "--nproc 4 --cp 2 --zero 3"};
	char dir[512], cmd[4096], out[32768], path[1024];
	double a[MAXSTEPS] = {0}, av[MAXSTEPS] = {0}, b[MAXSTEPS], bv[MAXSTEPS];
	const char *loom = test_loom_bin();
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(test_make_token_data(dir, vocab, 20001));
	snprintf(cmd, sizeof cmd, "%s train --nproc 2 --cp 2 --train-data '%s/train_*.bin' --val-data '%s/train_*.bin' "
	         "%s --steps %d --save-dir %s/ck --save-every 4 --log %s/a.jsonl", loom, dir, dir, flags, STEPS, dir, dir);
	RUN_OK(cmd, out, 300);
	snprintf(path, sizeof path, "%s/a.jsonl", dir);
	CHECK_EQ(test_read_losses(path, a, MAXSTEPS, NULL, av), STEPS);
	for (size_t k = 0; k < sizeof resumes / sizeof *resumes; k++) {
		memset(b, 0, sizeof b), memset(bv, 0, sizeof bv);
		snprintf(cmd, sizeof cmd, "%s train %s --train-data '%s/train_*.bin' --val-data '%s/train_*.bin' %s --steps %d "
		         "--resume-from %s/ck/step_00000004 --log %s/b%zu.jsonl", loom, resumes[k], dir, dir, flags, STEPS, dir,
		         dir, k);
		RUN_OK(cmd, out, 300);
		CHECK_CONTAINS(out, "resumed from");
		snprintf(path, sizeof path, "%s/b%zu.jsonl", dir, k);
		CHECK_EQ(test_read_losses(path, b, MAXSTEPS, NULL, bv), STEPS - 4);
		for (int s = 5; s <= STEPS; s++)
			CHECK_MSG(fabs(b[s] - a[s]) <= 1e-6 * a[s], "%s resumed with '%s', step %d: loss %.9g, cp 2 ran %.9g",
			          flags, resumes[k], s, b[s], a[s]);
		CHECK_MSG(fabs(bv[STEPS] - av[STEPS]) <= 1e-6 * av[STEPS], "%s resumed with '%s': validation loss %.9g, cp 2 "
		          "had %.9g", flags, resumes[k], bv[STEPS], av[STEPS]);
	}
	test_rmdir(dir);
	return 0;
}

TEST(cp_checkpoint_resumes_at_any_cp)
{
	return resumes_at_any_cp(CP_GPT2, 257) || resumes_at_any_cp(CP_NC, 64);
}

/* A sequence length that is not 2 cp chunks, and a world that is not divisible by cp: one clear message
 * before any rank starts (no "[rank" prefix, exit 2). */
TEST(cp_refuses_bad_seq_len_and_mesh)
{
	char dir[512], cmd[4096], out[8192];
	const char *loom = test_loom_bin();
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(test_make_token_data(dir, 257, 4001));
	snprintf(cmd, sizeof cmd, "%s train --nproc 2 --cp 2 --train-data '%s/train_*.bin' --model tiny --batch-size 2 "
	         "--seq-len 30 --steps 2", loom, dir);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 60), 2);
	CHECK_CONTAINS(out, "loom train: --cp 2 with --seq-len 30: context parallel: the sequence length 30 is not "
	                    "divisible by 2 x cp = 4 (each of the 2 ranks holds 2 chunks of T/(2 cp) positions: the "
	                    "head-tail layout); choose --seq-len a multiple of 4");
	CHECK_MSG(!strstr(out, "[rank"), "refused on the ranks, not before them: %s", out);
	snprintf(cmd, sizeof cmd, "%s train --nproc 3 --cp 2 --train-data '%s/train_*.bin' --model tiny --batch-size 2 "
	         "--seq-len 32 --steps 2", loom, dir);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 60), 2);
	CHECK_CONTAINS(out, "loom train: --cp 2 --tp 1 --pp 1 on 3 ranks: the world of 3 ranks is not divisible by "
	                    "cp x tp x pp = 2");
	snprintf(cmd, sizeof cmd, "LOOM_CP_ATTENTION=rings %s train --nproc 2 --cp 2 --train-data '%s/train_*.bin' "
	         "--model tiny --batch-size 2 --seq-len 32 --steps 2", loom, dir);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 60), 2);
	CHECK_CONTAINS(out, "loom train: --cp 2: LOOM_CP_ATTENTION='rings': expected ring (the default) or gather");
	snprintf(cmd, sizeof cmd, "%s plan --model tiny --seq-len 32 --cp 3 --nproc 3 --cluster cpu-node", loom);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 60), 2);
	CHECK_CONTAINS(out, "loom plan: --cp 3 with --seq-len 32: context parallel: the sequence length 32 is not "
	                    "divisible by 2 x cp = 6");
	test_rmdir(dir);
	return 0;
}

/* The library refuses what the CLI would: a model whose rows are not two chunks, a trainer whose mesh
 * and model disagree on cp, a sequence length the trainer cannot cut (every rank, before any work). */
static int refuse_rank(int rank, int nranks, void *arg)
{
	char *glob = arg;
	loom_comm_t *comm;
	loom_mesh_t *mesh;
	loom_model_config_t mc;
	loom_model_t *m = NULL;
	loom_trainer_t *tr = NULL;
	(void)nranks;
	loom_set_num_threads(1);
	CHECK_OK(loom_comm_init(&comm));
	CHECK_OK(loom_mesh_create4(&mesh, comm, 1, 2, 1, 1));
	CHECK_OK(loom_gpt2_preset("tiny", &mc));
	loom_model_opts_t o = {.B = 2, .T = 15, .cp_size = 2, .cp_rank = rank};
	CHECK_ERR(loom_model_create(&m, &mc, &o), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "context parallel over 2 ranks: each holds 15 rows of a sequence of 30 positions");
	o.T = 16, o.cp_size = 0, o.cp_rank = 0; /* a whole model on a cp mesh */
	CHECK_OK(loom_model_create(&m, &mc, &o));
	loom_train_config_t tc = loom_train_defaults();
	tc.train_data = glob, tc.B = 2, tc.T = 32, tc.mesh = mesh;
	tc.lr = (loom_lr_schedule_t){.peak_lr = 1e-3, .total_steps = 1};
	CHECK_ERR(loom_trainer_create(&tr, &tc, m), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "the mesh puts it at context-parallel rank");
	loom_model_destroy(m);
	o.cp_size = 2, o.cp_rank = rank;
	CHECK_OK(loom_model_create(&m, &mc, &o));
	tc.T = 30; /* not 4 chunks */
	CHECK_ERR(loom_trainer_create(&tr, &tc, m), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "trainer: --cp 2: context parallel: the sequence length 30 is not divisible by 2 x cp = 4");
	loom_model_destroy(m);
	loom_mesh_destroy(mesh);
	loom_comm_destroy(comm);
	return 0;
}

TEST(cp_library_refusals)
{
	char dir[512], glob[600];
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(test_make_token_data(dir, 257, 4001));
	snprintf(glob, sizeof glob, "%s/train_*.bin", dir);
	int rc = test_spawn(2, refuse_rank, glob, 60, NULL);
	test_rmdir(dir);
	return rc;
}

/* `loom run` passes --cp through to its ranks; `loom plan --cp` counts the gathers: 3 per layer (forward,
 * and backward's gather and reduce-scatter) of (cp-1)/cp x B T 2 C x 4 bytes (tiny: C = 128, B = 2,
 * T = 32: 32768 bytes), 4 per layer with recomputation; --search plans cp too. */
TEST(cp_cli_run_and_plan)
{
	char dir[512], cmd[4096], out[65536];
	const char *loom = test_loom_bin();
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(test_make_token_data(dir, 257, 4001));
	snprintf(cmd, sizeof cmd, "%s run --nproc-per-node 2 %s train --cp 2 --train-data '%s/train_*.bin' --model tiny "
	         "--batch-size 2 --seq-len 32 --steps 2 --peak-flops 1e10 --trace %s/tr", loom, loom, dir, dir);
	RUN_OK(cmd, out, 120);
	CHECK_CONTAINS(out, "context parallel: cp 2 x dp 1 x tp 1 x pp 1 = 2 ranks");
	CHECK_CONTAINS(out, "step 2/2");
	/* the trace shows the ring's waits: per layer and step one forward, three backward (cp 2), per rank */
	char path[700];
	snprintf(path, sizeof path, "%s/tr/trace.json", dir);
	FILE *f = fopen(path, "r");
	CHECK(f != NULL);
	size_t len = fread(out, 1, sizeof out - 1, f);
	fclose(f);
	out[len] = 0;
	int waits = 0;
	for (const char *p = out; (p = strstr(p, "\"name\":\"cp ring wait\"")) != NULL; p++)
		waits++;
	CHECK_EQ(waits, 2 * 2 * 4 * 4);
	CHECK_EQ(loom_plan_cp_bytes(&(loom_model_config_t){.n_layer = 4, .n_head = 4, .n_embd = 128, .seq_len = 128,
	                                                   .vocab_size = 257}, 2, 32, 2, 1), 32768.0);
	snprintf(cmd, sizeof cmd, "%s plan --model tiny --batch-size 2 --seq-len 32 --cp 2 --nproc 2 --cluster cpu-node "
	         "--json", loom);
	RUN_OK(cmd, out, 60);
	CHECK_CONTAINS(out, "\"cp\":2,\"world\":2");
	CHECK_CONTAINS(out, "\"pp\":0,\"cp\":393216}"); /* 1 micro-batch x 4 layers x 3 x 32768 */
	snprintf(cmd, sizeof cmd, "%s plan --model tiny --batch-size 2 --seq-len 32 --cp 2 --nproc 2 --cluster cpu-node "
	         "--json --activation-checkpointing selective", loom);
	RUN_OK(cmd, out, 60);
	CHECK_CONTAINS(out, "\"pp\":0,\"cp\":524288}"); /* the recomputed attention gathers again */
	snprintf(cmd, sizeof cmd, "%s plan --model tiny --batch-size 2 --seq-len 32 --cp 2 --nproc 2 --cluster cpu-node", loom);
	RUN_OK(cmd, out, 60);
	CHECK_CONTAINS(out, "mesh: dp 1 x cp 2 x tp 1 x pp 1 = 2 ranks");
	CHECK_CONTAINS(out, "communication cp: ");
	snprintf(cmd, sizeof cmd, "%s plan --model tiny --batch-size 2 --seq-len 32 --search --ranks 4 --cluster cpu-node "
	         "--json --top 100000", loom);
	RUN_OK(cmd, out, 120);
	CHECK_CONTAINS(out, "\"cp\":2,");
	CHECK_CONTAINS(out, "\"cp\":4,");
	test_rmdir(dir);
	return 0;
}
