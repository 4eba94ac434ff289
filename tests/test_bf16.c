/* test_bf16.c: the bf16 matmul path of `--dtype bf16` (src/model/matmul_bf16.c).
 *
 * What is checked, and how tight:
 *  - rounding to bf16 is round-to-nearest-even, NaN and infinities kept (exact values);
 *  - the bf16 GEMM, every transpose combination, alpha/beta, leading dimensions wider than the
 *    matrix, odd shapes: against a double-precision product of the bf16-ROUNDED operands, to 1e-5
 *    of sum |a||b| per element (only fp32 accumulation order differs, so any operand mishandled, a
 *    wrong stride or transpose, shows as an O(1) error), and against the fp32 product of the
 *    unrounded operands within bf16's tolerance (2 x 2^-8 of sum |a||b|);
 *  - the model's three products (forward, dinp, dweight, plus dbias) and the fused classifier in
 *    bf16 mode against the fp32 reference kernels within bf16's tolerance;
 *  - a 300-step run of the `tiny` preset in bf16 ends within 2% of the fp32 run's loss, and every
 *    step's loss is finite and within 5% of fp32's (no divergence);
 *  - a CPU without AVX512-BF16 (forced by LOOM_NO_BF16=1) gets a clear error from the model and
 *    from `loom train --dtype bf16`, never a silent fp32 run;
 *  - `--grad-reduce-dtype bf16` under 2-rank DDP and ZeRO stages 1-3 keeps the replicas identical and
 *    the losses close.
 * The tests that need AVX512-BF16 report themselves skipped on a CPU without it. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "loom/gpt2.h"
#include "model/kernels.h"
#include "model/rng.h"
#include "test.h"

static rng_t brng;

static float *rnd(size_t n, double scale)
{
	float *p = malloc(sizeof(float) * (n ? n : 1));
	for (size_t i = 0; i < n; i++)
		p[i] = (float)(scale * rng_normal(&brng));
	return p;
}

static float bits(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

TEST(bf16_round_nearest_even)
{
	CHECK_FEQ(loom__bf16_round(1.0f), 1.0f);
	CHECK_FEQ(loom__bf16_round(-2.5f), -2.5f);
	/* halfway between 1 and 1 + 2^-7: to the even one (1) */
	CHECK_FEQ(loom__bf16_round(1.0f + 0x1p-8f), 1.0f);
	/* halfway between 1 + 2^-7 and 1 + 2^-6: to the even one (1 + 2^-6) */
	CHECK_FEQ(loom__bf16_round(1.0f + 3 * 0x1p-8f), 1.0f + 0x1p-6f);
	/* just above halfway: up */
	CHECK_FEQ(loom__bf16_round(bits(0x3f808001u)), 1.0f + 0x1p-7f);
	CHECK_FEQ(loom__bf16_round(bits(0x3f807fffu)), 1.0f);
	CHECK_FEQ(loom__bf16_round(INFINITY), INFINITY);
	CHECK_FEQ(loom__bf16_round(-INFINITY), -INFINITY);
	CHECK(isnan(loom__bf16_round(bits(0x7f800001u)))); /* a NaN whose payload is all in the low bits */
	CHECK_FEQ(loom__bf16_round(bits(0x7f7fffffu)), INFINITY); /* FLT_MAX rounds up to infinity */
	uint16_t h[3];
	float src[3] = {1.0f, -0.0f, 3.0f};
	loom__bf16_from_f32(h, src, 3);
	CHECK_EQ(h[0], 0x3f80);
	CHECK_EQ(h[1], 0x8000);
	CHECK_EQ(h[2], 0x4040);
	return 0;
}

/* One GEMM case: C (M,N) with row stride ldc = N + 3, A and B with leading dimensions padded by 5
 * and 2, against the double product of rounded operands and the fp32 product of the originals. */
static int gemm_case(loom__gemm_ctx_t *ctx, int ta, int tb, int M, int N, int K, float alpha, float beta)
{
	int lda = (ta ? M : K) + 5, ldb = (tb ? K : N) + 2, ldc = N + 3;
	size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb, nc = (size_t)M * ldc;
	float *A = rnd(na, 1.0), *B = rnd(nb, 1.0), *C = rnd(nc, 1.0), *C0 = malloc(sizeof(float) * nc);
	int bad = 0;
	memcpy(C0, C, sizeof(float) * nc);
	CHECK_OK(loom__gemm_bf16(ctx, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc));
	for (int i = 0; i < M && !bad; i++)
		for (int j = 0; j < N; j++) {
			double r = 0.0, f = 0.0, mag = 0.0;
			for (int k = 0; k < K; k++) {
				float a = ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
				float b = tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j];
				r += (double)loom__bf16_round(a) * loom__bf16_round(b);
				f += (double)a * b;
				mag += fabs((double)a * b);
			}
			double c0 = C0[(size_t)i * ldc + j], got = C[(size_t)i * ldc + j];
			double want_r = alpha * r + beta * c0, want_f = alpha * f + beta * c0;
			double scale = fabs(alpha) * mag + fabs(beta * c0) + 1e-6;
			if (fabs(got - want_r) > 1e-5 * scale || fabs(got - want_f) > 2 * 0x1p-8 * scale) {
				fprintf(stderr, "  gemm ta %d tb %d M %d N %d K %d alpha %g beta %g: C[%d,%d] = %.9g, rounded-"
				        "operand reference %.9g, fp32 reference %.9g (scale %.3g)\n", ta, tb, M, N, K, alpha, beta, i,
				        j, got, want_r, want_f, scale);
				bad = 1;
				break;
			}
		}
	/* the padding columns of C are not touched */
	for (int i = 0; i < M && !bad; i++)
		for (int j = N; j < ldc; j++)
			if (C[(size_t)i * ldc + j] != C0[(size_t)i * ldc + j]) {
				fprintf(stderr, "  gemm wrote C[%d,%d] outside the N = %d columns\n", i, j, N);
				bad = 1;
				break;
			}
	free(A), free(B), free(C), free(C0);
	return bad;
}

TEST(bf16_gemm_matches_reference)
{
	if (!loom_bf16_supported())
		return TEST_SKIP("this CPU has no AVX512-BF16");
	loom__gemm_ctx_t ctx = {.dtype = LOOM_COMPUTE_BF16};
	static const int shapes[][3] = {{1, 1, 1}, {7, 5, 9}, {33, 17, 70}, {65, 129, 31}, {130, 96, 400}};
	static const float ab[][2] = {{1.0f, 0.0f}, {1.0f, 1.0f}, {0.5f, -0.75f}};
	rng_seed(&brng, 11);
	for (int threads = 1; threads <= 2; threads++) {
		loom_set_num_threads(threads);
		for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
			for (int t = 0; t < 4; t++)
				for (size_t k = 0; k < sizeof ab / sizeof ab[0]; k++)
					CHECK_MSG(!gemm_case(&ctx, t & 1, t >> 1, shapes[s][0], shapes[s][1], shapes[s][2], ab[k][0],
					                     ab[k][1]), "with %d thread(s)", threads);
	}
	/* K = 0: C = beta C */
	float c[2] = {2.0f, -4.0f};
	CHECK_OK(loom__gemm_bf16(&ctx, 0, 0, 1, 2, 0, 1.0f, c, 1, c, 2, 0.5f, c, 2));
	CHECK_FEQ(c[0], 1.0f);
	CHECK_FEQ(c[1], -2.0f);
	loom__gemm_ctx_free(&ctx);
	loom_set_num_threads(1);
	return 0;
}

/* Every |a - b| <= rel * max|b|. */
static int close_rel(const char *what, const float *a, const float *b, size_t n, double rel)
{
	double m = 0.0;
	for (size_t i = 0; i < n; i++)
		m = fmax(m, fabs(b[i]));
	for (size_t i = 0; i < n; i++)
		if (!(fabs(a[i] - b[i]) <= rel * m + 1e-30)) {
			fprintf(stderr, "  %s[%zu]: %.9g vs reference %.9g (tolerance %.3g)\n", what, i, a[i], b[i], rel * m);
			return 1;
		}
	return 0;
}

/* The model's matmul products through loom__gemm in bf16 mode (forward, dinp, dweight, dbias),
 * against the fp32 reference kernels. Inputs are unit normal, so an element's error is about
 * 2^-8 sqrt(K) and the maximum about sqrt(K): 2e-2 relative is bf16's tolerance, and 10x below
 * what a wrong product (transpose, stride) gives. */
static int matmul_case(int N, int C, int OC)
{
	size_t nx = (size_t)N * C, nw = (size_t)C * OC, no = (size_t)N * OC;
	float *x = rnd(nx, 1.0), *w = rnd(nw, 1.0), *b = rnd(OC, 1.0), *dout = rnd(no, 1.0);
	float *out = calloc(no, 4), *out_r = calloc(no, 4), *dx = calloc(nx, 4), *dx_r = calloc(nx, 4);
	float *dw = calloc(nw, 4), *dw_r = calloc(nw, 4), *db = calloc(OC, 4), *db_r = calloc(OC, 4);
	loom__gemm_ctx_t ctx = {.dtype = LOOM_COMPUTE_BF16};
	int bad = 0;
	loom__gemm_setup(&ctx);
	loom__matmul_forward(out, x, w, b, N, C, OC);
	loom__matmul_backward(dx, dw, db, dout, x, w, N, C, OC);
	loom__matmul_backward(dx, NULL, NULL, dout, x, w, N, C, OC); /* dinp alone: += a second time */
	loom__gemm_setup(NULL);
	CHECK_OK(loom__gemm_status(&ctx));
	loom__matmul_forward_ref(out_r, x, w, b, N, C, OC);
	loom__matmul_backward_ref(dx_r, dw_r, db_r, dout, x, w, N, C, OC);
	loom__matmul_backward_ref(dx_r, NULL, NULL, dout, x, w, N, C, OC);
	bad |= close_rel("bf16 matmul out", out, out_r, no, 2e-2);
	bad |= close_rel("bf16 matmul dinp", dx, dx_r, nx, 2e-2);
	bad |= close_rel("bf16 matmul dweight", dw, dw_r, nw, 2e-2);
	bad |= close_rel("bf16 matmul dbias (fp32)", db, db_r, OC, 1e-5);
	loom__gemm_ctx_free(&ctx);
	free(x), free(w), free(b), free(dout), free(out), free(out_r), free(dx), free(dx_r), free(dw), free(dw_r);
	free(db), free(db_r);
	return bad;
}

TEST(bf16_matmul_products)
{
	if (!loom_bf16_supported())
		return TEST_SKIP("this CPU has no AVX512-BF16");
	rng_seed(&brng, 12);
	for (int threads = 1; threads <= 2; threads++) {
		loom_set_num_threads(threads);
		CHECK_MSG(!matmul_case(7, 5, 9) && !matmul_case(33, 24, 72) && !matmul_case(130, 96, 400),
		          "with %d thread(s)", threads);
	}
	loom_set_num_threads(1);
	return 0;
}

TEST(bf16_classifier)
{
	if (!loom_bf16_supported())
		return TEST_SKIP("this CPU has no AVX512-BF16");
	int N = 37, C = 24, V = 101, chunk = 16; /* the chunk does not divide N */
	rng_seed(&brng, 13);
	float *x = rnd((size_t)N * C, 1.0), *wte = rnd((size_t)V * C, 0.3);
	float *loss = calloc(N, 4), *loss_r = calloc(N, 4), *logits = calloc((size_t)chunk * V, 4);
	float *logits_r = calloc((size_t)N * V, 4), *dx = calloc((size_t)N * C, 4), *dx_r = calloc((size_t)N * C, 4);
	float *dw = calloc((size_t)V * C, 4), *dw_r = calloc((size_t)V * C, 4);
	int *tg = malloc(sizeof(int) * N);
	for (int i = 0; i < N; i++)
		tg[i] = (i * 7) % V;
	loom__gemm_ctx_t ctx = {.dtype = LOOM_COMPUTE_BF16};
	loom__gemm_setup(&ctx);
	loom__classifier_forward_backward(loss, dx, dw, logits, chunk, x, wte, tg, 1.0f / N, N, C, V);
	loom__gemm_setup(NULL);
	CHECK_OK(loom__gemm_status(&ctx));
	loom__classifier_forward_backward_ref(loss_r, dx_r, dw_r, logits_r, x, wte, tg, 1.0f / N, N, C, V);
	CHECK(!close_rel("bf16 classifier losses", loss, loss_r, N, 2e-2));
	CHECK(!close_rel("bf16 classifier dx", dx, dx_r, (size_t)N * C, 2e-2));
	CHECK(!close_rel("bf16 classifier dwte", dw, dw_r, (size_t)V * C, 2e-2));
	loom__gemm_ctx_free(&ctx);
	free(x), free(wte), free(loss), free(loss_r), free(logits), free(logits_r), free(dx), free(dx_r), free(dw);
	free(dw_r), free(tg);
	return 0;
}

/* A model with dtype bf16 on a CPU without AVX512-BF16 (forced) is an error, from the library and
 * from the CLI; the GEMM benchmark reports fp32 only. */
TEST(bf16_unsupported_is_error)
{
	char dir[512], cmd[2048], out[8192];
	const char *saved = getenv("LOOM_NO_BF16");
	loom_gpt2_config_t cfg = {.n_layer = 1, .n_head = 2, .n_embd = 16, .seq_len = 8, .vocab_size = 37};
	loom_gpt2_opts_t o = {.B = 1, .T = 8, .dtype = LOOM_COMPUTE_BF16};
	loom_gpt2_t *m = NULL;
	setenv("LOOM_NO_BF16", "1", 1);
	CHECK_EQ(loom_bf16_supported(), 0);
	int rc = loom_gpt2_create_opts(&m, &cfg, &o);
	CHECK_ERR(rc, LOOM_ENOTSUP);
	CHECK(m == NULL);
	CHECK_CONTAINS(loom_errmsg(), "dtype bf16 needs a CPU with AVX512-BF16");
	CHECK_FEQ(loom_gemm_flops_dtype(LOOM_COMPUTE_BF16, 1, 8, 8, 8, 0.0), 0.0);
	o.dtype = LOOM_COMPUTE_FP32; /* fp32 is unaffected */
	CHECK_OK(loom_gpt2_create_opts(&m, &cfg, &o));
	CHECK_EQ(loom_gpt2_dtype(m), LOOM_COMPUTE_FP32);
	loom_gpt2_destroy(m);
	if (saved)
		setenv("LOOM_NO_BF16", saved, 1);
	else
		unsetenv("LOOM_NO_BF16");

	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(test_make_token_data(dir, 257, 4000));
	snprintf(cmd, sizeof cmd, "LOOM_NO_BF16=1 %s train --train-data '%s/train_*.bin' --model tiny --batch-size 1 "
	         "--seq-len 16 --steps 2 --threads 1 --peak-flops 1e10 --dtype bf16", test_loom_bin(), dir);
	int st = test_run_cmd(cmd, out, sizeof out, 60);
	CHECK_MSG(st == 1, "exit %d: %s", st, out);
	CHECK_CONTAINS(out, "dtype bf16 needs a CPU with AVX512-BF16");
	CHECK_MSG(!strstr(out, "step 1/2"), "a step ran: %s", out);
	snprintf(cmd, sizeof cmd, "%s train --train-data '%s/train_*.bin' --steps 2 --dtype fp16", test_loom_bin(), dir);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 60), 2);
	CHECK_CONTAINS(out, "--dtype: dtype 'fp16': expected fp32 or bf16");
	snprintf(cmd, sizeof cmd, "LOOM_NO_BF16=1 %s bench gemm --threads 1 --size 16 --seconds 0.01", test_loom_bin());
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 60), 0);
	CHECK_CONTAINS(out, "sgemm 16x16x16, 1 thread: ");
	CHECK_MSG(!strstr(out, "bf16 gemm"), "bf16 measured without AVX512-BF16: %s", out);
	test_rmdir(dir);
	return 0;
}

/* 300 steps of the `tiny` preset (L4 H4 C128, vocabulary 257) in fp32 and in bf16 from the same
 * initialization and data: the bf16 run ends within 2% of the fp32 run's loss and follows it. */
TEST(bf16_tiny_training_tracks_fp32)
{
	enum { STEPS = 300 };
	char dir[512], cmd[2048], out[16384], log[600];
	static double loss[2][STEPS + 1];
	static const char *dt[2] = {"fp32", "bf16"};
	if (!loom_bf16_supported())
		return TEST_SKIP("this CPU has no AVX512-BF16");
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(test_make_token_data(dir, 257, 40000));
	for (int d = 0; d < 2; d++) {
		snprintf(log, sizeof log, "%s/%s.jsonl", dir, dt[d]);
		snprintf(cmd, sizeof cmd, "%s train --train-data '%s/train_*.bin' --model tiny --batch-size 2 --seq-len 64 "
		         "--steps %d --lr 3e-3 --warmup 20 --threads 1 --peak-flops 1e10 --print-every 100 --dtype %s "
		         "--log %s", test_loom_bin(), dir, STEPS, dt[d], log);
		int st = test_run_cmd(cmd, out, sizeof out, 300);
		CHECK_MSG(st == 0, "%s: exit %d: %s", dt[d], st, out);
		CHECK_CONTAINS(out, d ? "matmuls in bf16" : "matmuls in fp32");
		CHECK_EQ(test_read_losses(log, loss[d], STEPS + 1, NULL, NULL), STEPS);
		char first[4096] = "";
		FILE *f = fopen(log, "r");
		CHECK(f != NULL);
		CHECK(fgets(first, sizeof first, f) != NULL);
		fclose(f);
		CHECK_CONTAINS(first, d ? "\"dtype\":\"bf16\"" : "\"dtype\":\"fp32\""); /* the log's config record */
	}
	for (int s = 1; s <= STEPS; s++) {
		CHECK_MSG(isfinite(loss[1][s]), "bf16 step %d: loss %g", s, loss[1][s]);
		CHECK_MSG(fabs(loss[1][s] - loss[0][s]) <= 0.05 * loss[0][s], "step %d: bf16 %.6f vs fp32 %.6f", s,
		          loss[1][s], loss[0][s]);
	}
	/* it learned (the data has structure), and ends where fp32 ends */
	CHECK_MSG(loss[0][STEPS] < loss[0][1] - 0.4, "fp32 %.4f -> %.4f", loss[0][1], loss[0][STEPS]);
	double worst = 0.0;
	for (int s = 1; s <= STEPS; s++)
		worst = fmax(worst, fabs(loss[1][s] - loss[0][s]) / loss[0][s]);
	printf("  fp32 %.4f -> %.4f, bf16 -> %.4f; largest step difference %.2f%%\n", loss[0][1], loss[0][STEPS],
	       loss[1][STEPS], 100 * worst);
	CHECK_MSG(fabs(loss[1][STEPS] - loss[0][STEPS]) <= 0.02 * loss[0][STEPS], "final loss: bf16 %.6f vs fp32 %.6f",
	          loss[1][STEPS], loss[0][STEPS]);
	test_rmdir(dir);
	return 0;
}

/* --grad-reduce-dtype bf16 under 2-rank DDP: the replicas stay bit-identical (--check-replicas 1
 * every step), the losses follow the fp32 reduction's (step 1, before any update, is the same bits;
 * later steps differ, so the option acted, by under 1%). */
TEST(bf16_grad_reduce_ddp)
{
	enum { STEPS = 8 };
	char dir[512], cmd[2048], out[16384], log[600];
	static double loss[2][STEPS + 1];
	static const char *dt[2] = {"fp32", "bf16"};
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(test_make_token_data(dir, 257, 20000));
	for (int d = 0; d < 2; d++) {
		snprintf(log, sizeof log, "%s/%s.jsonl", dir, dt[d]);
		snprintf(cmd, sizeof cmd, "%s train --nproc 2 --train-data '%s/train_*.bin' --model tiny --batch-size 2 "
		         "--seq-len 32 --steps %d --lr 3e-3 --threads 1 --peak-flops 1e10 --check-replicas 1 "
		         "--grad-reduce-dtype %s --log %s", test_loom_bin(), dir, STEPS, dt[d], log);
		int st = test_run_cmd(cmd, out, sizeof out, 120);
		CHECK_MSG(st == 0, "%s: exit %d: %s", dt[d], st, out);
		CHECK_CONTAINS(out, d ? "gradients averaged in bf16" : "gradients averaged in fp32");
		CHECK_EQ(test_read_losses(log, loss[d], STEPS + 1, NULL, NULL), STEPS);
	}
	CHECK_FEQ(loss[1][1], loss[0][1]);
	int differ = 0;
	for (int s = 2; s <= STEPS; s++) {
		differ |= loss[1][s] != loss[0][s];
		CHECK_MSG(fabs(loss[1][s] - loss[0][s]) <= 0.01 * loss[0][s], "step %d: %.6f vs %.6f", s, loss[1][s],
		          loss[0][s]);
	}
	CHECK_MSG(differ, "bf16 gradient reduction gave the fp32 losses bit for bit");
	test_rmdir(dir);
	return 0;
}

/* The "communication buffers X MiB" figure of `loom train`'s memory line, or -1. */
static double comm_mib(const char *out)
{
	const char *p = strstr(out, "communication buffers ");
	return p ? atof(p + strlen("communication buffers ")) : -1.0;
}

/* --grad-reduce-dtype bf16 under ZeRO stages 1, 2, 3 at 2 ranks with 2 micro-steps: the reduce-scatters
 * send bf16 (step 1, before any update, is the same bits as the fp32 reduction; later steps differ, by
 * under 1%), the replicas stay bit-identical at stages 1 and 2 (--check-replicas 1), and the memory
 * report counts the bf16 staging: 2P bytes at stage 1 (P = 842624), half the fp32 gradient staging at
 * stages 2 and 3 (there 1.5x and 1.25x the fp32 run's communication buffers). */
TEST(bf16_grad_reduce_zero)
{
	enum { STEPS = 10 };
	char dir[512], cmd[2048], out[16384], log[600], want[200];
	static double loss[2][STEPS + 1];
	static const char *dt[2] = {"fp32", "bf16"};
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(test_make_token_data(dir, 257, 20000));
	for (int stage = 1; stage <= 3; stage++) {
		double comm[2];
		for (int d = 0; d < 2; d++) {
			snprintf(log, sizeof log, "%s/z%d%s.jsonl", dir, stage, dt[d]);
			snprintf(cmd, sizeof cmd, "%s train --nproc 2 --train-data '%s/train_*.bin' --model tiny --batch-size 2 "
			         "--seq-len 32 --steps %d --grad-accum 2 --lr 3e-3 --threads 1 --peak-flops 1e10 --zero %d "
			         "--check-replicas 1 --grad-reduce-dtype %s --log %s", test_loom_bin(), dir, STEPS, stage, dt[d],
			         log);
			int st = test_run_cmd(cmd, out, sizeof out, 180);
			CHECK_MSG(st == 0, "zero %d %s: exit %d: %s", stage, dt[d], st, out);
			snprintf(want, sizeof want, "ZeRO stage %d: ", stage);
			CHECK_CONTAINS(out, want);
			CHECK_CONTAINS(out, d ? "gradients reduce-scattered in bf16" : "gradients reduce-scattered in fp32");
			CHECK_EQ(test_read_losses(log, loss[d], STEPS + 1, NULL, NULL), STEPS);
			comm[d] = comm_mib(out);
		}
		CHECK_MSG(loss[1][1] == loss[0][1], "zero %d step 1: %.9f vs %.9f", stage, loss[1][1], loss[0][1]);
		int differ = 0;
		for (int s = 2; s <= STEPS; s++) {
			differ |= loss[1][s] != loss[0][s];
			CHECK_MSG(fabs(loss[1][s] - loss[0][s]) <= 0.01 * loss[0][s], "zero %d step %d: %.6f vs %.6f", stage, s,
			          loss[1][s], loss[0][s]);
		}
		CHECK_MSG(differ, "zero %d: bf16 gradient reduction gave the fp32 losses bit for bit", stage);
		double worst = 0.0;
		for (int s = 1; s <= STEPS; s++)
			worst = fmax(worst, fabs(loss[1][s] - loss[0][s]) / loss[0][s]);
		printf("  zero %d: fp32 %.4f -> %.4f, bf16 -> %.4f; largest step difference %.3f%%; communication buffers "
		       "%.1f -> %.1f MiB\n", stage, loss[0][1], loss[0][STEPS], loss[1][STEPS], 100 * worst, comm[0], comm[1]);
		CHECK_MSG(loss[1][STEPS] < loss[1][1] - 0.05, "zero %d bf16: %.4f -> %.4f", stage, loss[1][1], loss[1][STEPS]);
		double expect = stage == 1 ? comm[0] + 2.0 * 842624 / 1048576 : comm[0] * (stage == 2 ? 1.5 : 1.25);
		CHECK_MSG(comm[0] >= 0 && fabs(comm[1] - expect) <= 0.1, "zero %d: communication buffers %.1f MiB (fp32 %.1f), "
		          "expected %.2f", stage, comm[1], comm[0], expect);
	}
	test_rmdir(dir);
	return 0;
}

/* bf16 through a tensor-parallel shard (--tp 2: its vocab-parallel classifier) and pipeline stages
 * (--pp 2): the losses follow the single-process bf16 run's within 1% (the products are split
 * differently, so the bits differ). */
TEST(bf16_tp_and_pp_track_single)
{
	enum { STEPS = 5 };
	char dir[512], cmd[2048], out[16384], log[600];
	static double loss[3][STEPS + 1];
	static const char *how[3] = {"", "--nproc 2 --tp 2", "--nproc 2 --pp 2"};
	if (!loom_bf16_supported())
		return TEST_SKIP("this CPU has no AVX512-BF16");
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(test_make_token_data(dir, 257, 20000));
	for (int k = 0; k < 3; k++) {
		snprintf(log, sizeof log, "%s/run%d.jsonl", dir, k);
		snprintf(cmd, sizeof cmd, "%s train %s --train-data '%s/train_*.bin' --model tiny --batch-size 2 --seq-len 32 "
		         "--steps %d --lr 3e-3 --threads 1 --peak-flops 1e10 --dtype bf16 --log %s", test_loom_bin(), how[k], dir,
		         STEPS, log);
		int st = test_run_cmd(cmd, out, sizeof out, 120);
		CHECK_MSG(st == 0, "'%s': exit %d: %s", how[k], st, out);
		CHECK_CONTAINS(out, "matmuls in bf16");
		CHECK_EQ(test_read_losses(log, loss[k], STEPS + 1, NULL, NULL), STEPS);
	}
	for (int k = 1; k < 3; k++)
		for (int s = 1; s <= STEPS; s++)
			CHECK_MSG(fabs(loss[k][s] - loss[0][s]) <= 0.01 * loss[0][s], "'%s' step %d: %.6f vs %.6f", how[k], s,
			          loss[k][s], loss[0][s]);
	test_rmdir(dir);
	return 0;
}
