/* test_bf16.c: the bf16 matmul path of `--dtype bf16` (src/model/matmul_bf16.c), on both of its
 * paths: portable on every machine, and native (oneDNN on AVX512-BF16 / AMX-BF16) where this machine
 * has it. No test skips for the lack of a CPU feature.
 *
 * What is checked, and how tight:
 *  - rounding to bf16 is round-to-nearest-even, NaN and infinities kept (exact values);
 *  - the path choice: LOOM_BF16=auto|native|portable, an unknown value and native where it cannot
 *    run are errors naming what is expected or missing;
 *  - the portable GEMM IS the fp32 GEMM (loom__gemm_f32) of the operands pre-rounded with
 *    loom__bf16_round, bit for bit; on small integers and powers of two (every product and partial sum
 *    exact in fp32) both paths give the exact hand-computed values;
 *  - the bf16 GEMM, every transpose combination, alpha/beta, leading dimensions wider than the
 *    matrix, odd shapes, on each path: against a double-precision product of the bf16-ROUNDED operands,
 *    to 1e-5 of sum |a||b| per element (only fp32 accumulation order differs, so any operand
 *    mishandled, a wrong stride or transpose, shows as an O(1) error), and against the fp32 product of
 *    the unrounded operands within bf16's tolerance (2 x 2^-8 of sum |a||b|); the native result against
 *    the portable one within the bound on two fp32 summation orders (native_vs_portable below);
 *  - the model's three products (forward, dinp, dweight, plus dbias) and the fused classifier in
 *    bf16 mode, on each path, against the fp32 reference kernels within bf16's tolerance, and native
 *    against portable;
 *  - a 300-step run of the `tiny` preset in bf16 ends within 2% of the fp32 run's loss, and every
 *    step's loss is finite and within 5% of fp32's (no divergence), on each path;
 *  - `loom train --dtype bf16` and `loom bench gemm` run on the forced portable path and say so;
 *    LOOM_BF16=native where it cannot run is a clear error, never a silent fallback;
 *  - `--grad-reduce-dtype bf16` under 2-rank DDP and ZeRO stages 1-3 keeps the replicas identical and
 *    the losses close (it needs nothing of the CPU: plain C rounding). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "loom/gpt2.h"
#include "model/kernels.h"
#include "model/rng.h"
#include "test.h"

/* The paths this machine runs: portable always, native where it can. */
static int npaths(void)
{
	return loom_bf16_native() ? 2 : 1;
}
static const int path_of[2] = {LOOM_BF16_PORTABLE, LOOM_BF16_NATIVE};
static const char *path_env[2] = {"LOOM_BF16=portable", "LOOM_BF16=native"};

/* The native result against the portable one. Both sum the same products, each exact in fp32 (two
 * 8-bit significands make at most 16 bits), in different orders (and oneDNN's kernels may split K
 * over threads). Each fp32 sum of K terms is within gamma_K = K u / (1 - K u) of sum |p| of the exact
 * sum (u = 2^-24, Higham's bound for any order), and alpha's multiply and beta C's add add two more
 * roundings, so |native - portable| <= 2 (K + 2) u (|alpha| sum|a||b| + |beta c|) (1 + O(K u)); we allow
 * 2.5 (K + 2) u for the O(K u) term, plus 1e-30 absolute for vdpbf16ps flushing denormals (none in
 * these data). A wrong stride or transpose gives O(sum|a||b| / sqrt(K)), orders of magnitude more. */
static double native_vs_portable(int K, double mag)
{
	return 2.5 * (K + 2) * 0x1p-24 * mag + 1e-30;
}

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

/* One GEMM case on each path (ctx[0] portable, ctx[1] native where np == 2): C (M,N) with row stride
 * ldc = N + 3, A and B with leading dimensions padded by 5 and 2, against the double product of
 * rounded operands and the fp32 product of the originals; the portable result bit for bit against
 * loom__gemm_f32 on dense pre-rounded copies (the layout the path multiplies), the native one against
 * the portable one within native_vs_portable. */
static int gemm_case(loom__gemm_ctx_t *ctx, int np, int ta, int tb, int M, int N, int K, float alpha, float beta)
{
	int lda = (ta ? M : K) + 5, ldb = (tb ? K : N) + 2, ldc = N + 3;
	int ra = ta ? K : M, ca = ta ? M : K, rb = tb ? N : K, cb = tb ? K : N; /* stored rows and columns */
	size_t na = (size_t)ra * lda, nb = (size_t)rb * ldb, nc = (size_t)M * ldc;
	float *A = rnd(na, 1.0), *B = rnd(nb, 1.0), *C0 = rnd(nc, 1.0), *C[2] = {malloc(sizeof(float) * nc),
	                                                                          malloc(sizeof(float) * nc)};
	float *Ar = malloc(sizeof(float) * ((size_t)ra * ca + 1)), *Br = malloc(sizeof(float) * ((size_t)rb * cb + 1));
	float *Cf = malloc(sizeof(float) * nc);
	int bad = 0;
	for (int r = 0; r < ra; r++)
		for (int c = 0; c < ca; c++)
			Ar[(size_t)r * ca + c] = loom__bf16_round(A[(size_t)r * lda + c]);
	for (int r = 0; r < rb; r++)
		for (int c = 0; c < cb; c++)
			Br[(size_t)r * cb + c] = loom__bf16_round(B[(size_t)r * ldb + c]);
	for (int p = 0; p < np; p++) {
		memcpy(C[p], C0, sizeof(float) * nc);
		CHECK_OK(loom__gemm_bf16(&ctx[p], ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C[p], ldc));
	}
	memcpy(Cf, C0, sizeof(float) * nc);
	loom__gemm_f32(ta, tb, M, N, K, alpha, Ar, ca, Br, cb, beta, Cf, ldc);
	if (memcmp(Cf, C[0], sizeof(float) * nc) != 0) {
		fprintf(stderr, "  gemm ta %d tb %d M %d N %d K %d alpha %g beta %g: the portable path differs from the "
		        "fp32 GEMM of the pre-rounded operands\n", ta, tb, M, N, K, alpha, beta);
		bad = 1;
	}
	for (int i = 0; i < M && !bad; i++)
		for (int j = 0; j < N && !bad; j++) {
			double r = 0.0, f = 0.0, mag = 0.0;
			for (int k = 0; k < K; k++) {
				float a = ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
				float b = tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j];
				r += (double)loom__bf16_round(a) * loom__bf16_round(b);
				f += (double)a * b;
				mag += fabs((double)loom__bf16_round(a) * loom__bf16_round(b));
			}
			double c0 = C0[(size_t)i * ldc + j];
			double want_r = alpha * r + beta * c0, want_f = alpha * f + beta * c0;
			double scale = fabs(alpha) * mag + fabs(beta * c0) + 1e-6;
			for (int p = 0; p < np && !bad; p++) {
				double got = C[p][(size_t)i * ldc + j];
				if (fabs(got - want_r) > 1e-5 * scale || fabs(got - want_f) > 2 * 0x1p-8 * scale) {
					fprintf(stderr, "  gemm (%s) ta %d tb %d M %d N %d K %d alpha %g beta %g: C[%d,%d] = %.9g, "
					        "rounded-operand reference %.9g, fp32 reference %.9g (scale %.3g)\n",
					        p ? "native" : "portable", ta, tb, M, N, K, alpha, beta, i, j, got, want_r, want_f, scale);
					bad = 1;
				}
			}
			double tol = native_vs_portable(K, fabs(alpha) * mag + fabs(beta * c0));
			if (np == 2 && !bad && fabs((double)C[1][(size_t)i * ldc + j] - C[0][(size_t)i * ldc + j]) > tol) {
				fprintf(stderr, "  gemm ta %d tb %d M %d N %d K %d alpha %g beta %g: C[%d,%d] native %.9g vs "
				        "portable %.9g (bound %.3g)\n", ta, tb, M, N, K, alpha, beta, i, j, C[1][(size_t)i * ldc + j],
				        C[0][(size_t)i * ldc + j], tol);
				bad = 1;
			}
		}
	/* the padding columns of C are not touched */
	for (int p = 0; p < np; p++)
		for (int i = 0; i < M && !bad; i++)
			for (int j = N; j < ldc; j++)
				if (C[p][(size_t)i * ldc + j] != C0[(size_t)i * ldc + j]) {
					fprintf(stderr, "  gemm (%s) wrote C[%d,%d] outside the N = %d columns\n",
					        p ? "native" : "portable", i, j, N);
					bad = 1;
					break;
				}
	free(A), free(B), free(C0), free(C[0]), free(C[1]), free(Ar), free(Br), free(Cf);
	return bad;
}

TEST(bf16_gemm_matches_reference)
{
	loom__gemm_ctx_t ctx[2] = {{.dtype = LOOM_COMPUTE_BF16, .path = LOOM_BF16_PORTABLE},
	                           {.dtype = LOOM_COMPUTE_BF16, .path = LOOM_BF16_NATIVE}};
	static const int shapes[][3] = {{1, 1, 1}, {7, 5, 9}, {33, 17, 70}, {65, 129, 31}, {130, 96, 400}};
	static const float ab[][2] = {{1.0f, 0.0f}, {1.0f, 1.0f}, {0.5f, -0.75f}};
	int np = npaths();
	printf("  paths: portable%s%s\n", np == 2 ? " and " : "", np == 2 ? loom_bf16_path_name(LOOM_BF16_NATIVE) : "");
	rng_seed(&brng, 11);
	for (int threads = 1; threads <= 2; threads++) {
		loom_set_num_threads(threads);
		for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
			for (int t = 0; t < 4; t++)
				for (size_t k = 0; k < sizeof ab / sizeof ab[0]; k++)
					CHECK_MSG(!gemm_case(ctx, np, t & 1, t >> 1, shapes[s][0], shapes[s][1], shapes[s][2], ab[k][0],
					                     ab[k][1]), "with %d thread(s)", threads);
	}
	/* the bf16 GEMM of a large product (the portable path's threaded sgemm splits it) */
	loom_set_num_threads(2);
	CHECK_MSG(!gemm_case(ctx, np, 0, 1, 200, 300, 128, 1.0f, 0.0f), "large, 2 threads");
	/* K = 0: C = beta C */
	for (int p = 0; p < np; p++) {
		float c[2] = {2.0f, -4.0f};
		CHECK_OK(loom__gemm_bf16(&ctx[p], 0, 0, 1, 2, 0, 1.0f, c, 1, c, 2, 0.5f, c, 2));
		CHECK_FEQ(c[0], 1.0f);
		CHECK_FEQ(c[1], -2.0f);
		loom__gemm_ctx_free(&ctx[p]);
	}
	loom_set_num_threads(1);
	return 0;
}

/* Small integers and powers of two, and values that round: every product and every partial sum is
 * exact in fp32 (integers below 2^24 scaled by powers of two), so each path must give the
 * hand-computed value exactly, whatever its order of additions. */
TEST(bf16_gemm_exact_small)
{
	/* A (2,3): 1 + 3 x 2^-8 rounds to 1 + 2^-6 (ties to even: the odd neighbour 1 + 2^-7 is not
	 * nearer), 257 to 256 (1 + 2^-8 at exponent 8, a tie, to even), 0.75 and -2^-3 stay. */
	const float A[6] = {1.0f + 3 * 0x1p-8f, 2.0f, -3.0f, 257.0f, 0.75f, -0x1p-3f};
	/* B (3,2): 3, 4, 1, -8, 2^10, 0.5; 3 x (1 + 2^-6) = 3 + 3 x 2^-6 exactly */
	const float B[6] = {3.0f, 4.0f, 1.0f, -8.0f, 1024.0f, 0.5f};
	/* C = A B with A rounded: row 0: (1 + 2^-6) 3 + 2 x 1 - 3 x 1024, (1 + 2^-6) 4 - 16 - 1.5;
	 * row 1: 256 x 3 + 0.75 - 128, 256 x 4 - 6 - 2^-4 */
	const float want[4] = {3.0f + 3 * 0x1p-6f + 2.0f - 3072.0f, 4.0f + 0x1p-4f - 16.0f - 1.5f,
	                       768.0f + 0.75f - 128.0f, 1024.0f - 6.0f - 0x1p-4f};
	int np = npaths();
	for (int p = 0; p < np; p++) {
		loom__gemm_ctx_t ctx = {.dtype = LOOM_COMPUTE_BF16, .path = path_of[p]};
		float C[4] = {0}, Ct[4] = {0};
		CHECK_OK(loom__gemm_bf16(&ctx, 0, 0, 2, 2, 3, 1.0f, A, 3, B, 2, 0.0f, C, 2));
		/* the same as C^T = B^T A^T with both operands transposed */
		CHECK_OK(loom__gemm_bf16(&ctx, 1, 1, 2, 2, 3, 1.0f, B, 2, A, 3, 0.0f, Ct, 2));
		for (int i = 0; i < 4; i++) {
			CHECK_MSG(C[i] == want[i], "%s: C[%d] = %.9g, expected %.9g", p ? "native" : "portable", i, C[i], want[i]);
			CHECK_MSG(Ct[(i % 2) * 2 + i / 2] == want[i], "%s: C^T[%d] = %.9g, expected %.9g",
			          p ? "native" : "portable", i, Ct[(i % 2) * 2 + i / 2], want[i]);
		}
		/* alpha 2^-1 and beta 1 on an integer C: still exact */
		float D[4] = {1.0f, 2.0f, 3.0f, 4.0f};
		CHECK_OK(loom__gemm_bf16(&ctx, 0, 0, 2, 2, 3, 0.5f, A, 3, B, 2, 1.0f, D, 2));
		for (int i = 0; i < 4; i++)
			CHECK_MSG(D[i] == 0.5f * want[i] + (float)(i + 1), "%s: D[%d] = %.9g, expected %.9g",
			          p ? "native" : "portable", i, D[i], 0.5f * want[i] + (float)(i + 1));
		/* a held operand (the ctx's format) gives the same */
		const void *B16 = loom__bf16_hold(&ctx, LOOM_BF16_SLOT_HOLD0, B, 6);
		CHECK(B16 != NULL);
		float E[4] = {0};
		CHECK_OK(loom__gemm_bf16x(&ctx, 0, 0, 2, 2, 3, 1.0f, A, NULL, 3, B, B16, 2, 0.0f, E, 2));
		CHECK(memcmp(E, C, sizeof C) == 0);
		loom__gemm_ctx_free(&ctx);
	}
	return 0;
}

/* The path choice from the environment, and a context asked for native where it cannot run. */
TEST(bf16_path_choice)
{
	const char *saved = getenv("LOOM_BF16");
	loom_bf16_path_t p = LOOM_BF16_AUTO;
	int native = loom_bf16_native();
	unsetenv("LOOM_BF16");
	CHECK_OK(loom_bf16_path(&p));
	CHECK_EQ(p, native ? LOOM_BF16_NATIVE : LOOM_BF16_PORTABLE);
	setenv("LOOM_BF16", "auto", 1);
	CHECK_OK(loom_bf16_path(&p));
	CHECK_EQ(p, native ? LOOM_BF16_NATIVE : LOOM_BF16_PORTABLE);
	setenv("LOOM_BF16", "portable", 1);
	CHECK_OK(loom_bf16_path(&p));
	CHECK_EQ(p, LOOM_BF16_PORTABLE);
	setenv("LOOM_BF16", "fast", 1);
	CHECK_ERR(loom_bf16_path(&p), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "LOOM_BF16=fast: expected auto, native or portable");
	setenv("LOOM_BF16", "native", 1);
	if (native) {
		CHECK_OK(loom_bf16_path(&p));
		CHECK_EQ(p, LOOM_BF16_NATIVE);
		CHECK_MSG(strstr(loom_bf16_path_name(p), "native AVX512-BF16 (oneDNN ") ||
		          strstr(loom_bf16_path_name(p), "native AMX-BF16 (oneDNN "), "%s", loom_bf16_path_name(p));
	} else {
		CHECK_ERR(loom_bf16_path(&p), LOOM_ENOTSUP);
		CHECK_CONTAINS(loom_errmsg(), "LOOM_BF16=native: the native bf16 GEMM needs AVX512-BF16 or AMX-BF16");
		/* a context forced onto the native path: the GEMM's error, and nothing written */
		loom__gemm_ctx_t ctx = {.dtype = LOOM_COMPUTE_BF16, .path = LOOM_BF16_NATIVE};
		float c = 7.0f, one = 1.0f;
		CHECK_ERR(loom__gemm_bf16(&ctx, 0, 0, 1, 1, 1, 1.0f, &one, 1, &one, 1, 0.0f, &c, 1), LOOM_ENOTSUP);
		CHECK_FEQ(c, 7.0f);
		CHECK_ERR(loom__gemm_status(&ctx), LOOM_ENOTSUP);
	}
	/* a model asks the same question at create */
	loom_gpt2_config_t cfg = {.n_layer = 1, .n_head = 2, .n_embd = 16, .seq_len = 8, .vocab_size = 37};
	loom_gpt2_opts_t o = {.B = 1, .T = 8, .dtype = LOOM_COMPUTE_BF16};
	loom_gpt2_t *m = NULL;
	setenv("LOOM_BF16", "fast", 1);
	CHECK_ERR(loom_gpt2_create_opts(&m, &cfg, &o), LOOM_EINVAL);
	CHECK(m == NULL);
	o.dtype = LOOM_COMPUTE_FP32; /* fp32 does not ask */
	CHECK_OK(loom_gpt2_create_opts(&m, &cfg, &o));
	loom_gpt2_destroy(m);
	setenv("LOOM_BF16", "portable", 1);
	o.dtype = LOOM_COMPUTE_BF16;
	CHECK_OK(loom_gpt2_create_opts(&m, &cfg, &o));
	CHECK_EQ(loom_gpt2_dtype(m), LOOM_COMPUTE_BF16);
	loom_gpt2_destroy(m);
	CHECK(loom_gemm_flops_dtype(LOOM_COMPUTE_BF16, 1, 32, 32, 32, 0.0) > 0.0);
	CHECK_CONTAINS(loom_bf16_path_name(LOOM_BF16_PORTABLE), "portable");
	CHECK_FEQ(strcmp(loom_bf16_path_name(LOOM_BF16_AUTO), "?"), 0);
	if (saved)
		setenv("LOOM_BF16", saved, 1);
	else
		unsetenv("LOOM_BF16");
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

/* The largest sum_k |a_ik||b_kj| over C (M,N) = A (M,K) B (K,N) on the bf16-rounded operands, both
 * dense row-major with A transposed when ta (stored (K,M)) and B when tb (stored (N,K)). */
static double max_mag(const float *A, const float *B, int ta, int tb, int M, int N, int K)
{
	double best = 0.0;
	for (int i = 0; i < M; i++)
		for (int j = 0; j < N; j++) {
			double s = 0.0;
			for (int k = 0; k < K; k++)
				s += fabs((double)loom__bf16_round(ta ? A[(size_t)k * M + i] : A[(size_t)i * K + k]) *
				          loom__bf16_round(tb ? B[(size_t)j * K + k] : B[(size_t)k * N + j]));
			best = fmax(best, s);
		}
	return best;
}

/* Every |a - b| <= tol. */
static int close_abs(const char *what, const float *a, const float *b, size_t n, double tol)
{
	for (size_t i = 0; i < n; i++)
		if (!(fabs(a[i] - b[i]) <= tol)) {
			fprintf(stderr, "  %s[%zu]: native %.9g vs portable %.9g (bound %.3g)\n", what, i, a[i], b[i], tol);
			return 1;
		}
	return 0;
}

/* The model's matmul products through loom__gemm in bf16 mode (forward, dinp, dweight, dbias) on each
 * path, against the fp32 reference kernels. Inputs are unit normal, so an element's error is about
 * 2^-8 sqrt(K) and the maximum about sqrt(K): 2e-2 relative is bf16's tolerance, and 10x below
 * what a wrong product (transpose, stride) gives. Native against portable: each output is one or two
 * GEMM results accumulated (out = bias + x w; dinp += twice), so within native_vs_portable of its K
 * and twice the largest sum |a||b| plus the largest |bias| (a bound over the whole matrix). */
static int matmul_case(int N, int C, int OC)
{
	size_t nx = (size_t)N * C, nw = (size_t)C * OC, no = (size_t)N * OC;
	float *x = rnd(nx, 1.0), *w = rnd(nw, 1.0), *b = rnd(OC, 1.0), *dout = rnd(no, 1.0);
	float *out_r = calloc(no, 4), *dx_r = calloc(nx, 4), *dw_r = calloc(nw, 4), *db_r = calloc(OC, 4);
	float *out[2], *dx[2], *dw[2], *db[2];
	int bad = 0, np = npaths();
	loom__matmul_forward_ref(out_r, x, w, b, N, C, OC);
	loom__matmul_backward_ref(dx_r, dw_r, db_r, dout, x, w, N, C, OC);
	loom__matmul_backward_ref(dx_r, NULL, NULL, dout, x, w, N, C, OC);
	for (int p = 0; p < np; p++) {
		loom__gemm_ctx_t ctx = {.dtype = LOOM_COMPUTE_BF16, .path = path_of[p]};
		out[p] = calloc(no, 4), dx[p] = calloc(nx, 4), dw[p] = calloc(nw, 4), db[p] = calloc(OC, 4);
		loom__gemm_setup(&ctx);
		loom__matmul_forward(out[p], x, w, b, N, C, OC);
		loom__matmul_backward(dx[p], dw[p], db[p], dout, x, w, N, C, OC);
		loom__matmul_backward(dx[p], NULL, NULL, dout, x, w, N, C, OC); /* dinp alone: += a second time */
		loom__gemm_setup(NULL);
		CHECK_OK(loom__gemm_status(&ctx));
		bad |= close_rel(p ? "native bf16 matmul out" : "portable bf16 matmul out", out[p], out_r, no, 2e-2);
		bad |= close_rel(p ? "native bf16 matmul dinp" : "portable bf16 matmul dinp", dx[p], dx_r, nx, 2e-2);
		bad |= close_rel(p ? "native bf16 matmul dweight" : "portable bf16 matmul dweight", dw[p], dw_r, nw, 2e-2);
		bad |= close_rel("bf16 matmul dbias (fp32)", db[p], db_r, OC, 1e-5);
		loom__gemm_ctx_free(&ctx);
	}
	if (np == 2) {
		double bmax = 0.0;
		for (int j = 0; j < OC; j++)
			bmax = fmax(bmax, fabs(b[j]));
		bad |= close_abs("bf16 matmul out", out[1], out[0], no, native_vs_portable(C, max_mag(x, w, 0, 0, N, OC, C) + bmax));
		bad |= close_abs("bf16 matmul dinp", dx[1], dx[0], nx, native_vs_portable(OC, 2 * max_mag(dout, w, 0, 1, N, C, OC)));
		bad |= close_abs("bf16 matmul dweight", dw[1], dw[0], nw, native_vs_portable(N, max_mag(x, dout, 1, 0, C, OC, N)));
		bad |= memcmp(db[1], db[0], sizeof(float) * OC) != 0; /* fp32, the same code */
	}
	for (int p = 0; p < np; p++)
		free(out[p]), free(dx[p]), free(dw[p]), free(db[p]);
	free(x), free(w), free(b), free(dout), free(out_r), free(dx_r), free(dw_r), free(db_r);
	return bad;
}

TEST(bf16_matmul_products)
{
	rng_seed(&brng, 12);
	for (int threads = 1; threads <= 2; threads++) {
		loom_set_num_threads(threads);
		CHECK_MSG(!matmul_case(7, 5, 9) && !matmul_case(33, 24, 72) && !matmul_case(130, 96, 400),
		          "with %d thread(s)", threads);
	}
	loom_set_num_threads(1);
	return 0;
}

/* The fused classifier in bf16 on each path against the fp32 reference within bf16's tolerance; native
 * against portable: the losses depend on the logits alone, each within native_vs_portable(C, sum|x||w|)
 * of the other path's, and a loss log sum exp(z - m) + m - z_t moves by at most twice its logits'
 * largest change; the gradients pass through the gradient logits rounded to bf16, where a 1e-6
 * change in a logit can flip a rounding (2^-8 of that element), so they are held to bf16's 2e-2. */
TEST(bf16_classifier)
{
	int N = 37, C = 24, V = 101, chunk = 16; /* the chunk does not divide N */
	int np = npaths();
	rng_seed(&brng, 13);
	float *x = rnd((size_t)N * C, 1.0), *wte = rnd((size_t)V * C, 0.3);
	float *loss_r = calloc(N, 4), *logits = calloc((size_t)chunk * V, 4), *logits_r = calloc((size_t)N * V, 4);
	float *dx_r = calloc((size_t)N * C, 4), *dw_r = calloc((size_t)V * C, 4);
	float *loss[2], *dx[2], *dw[2];
	int *tg = malloc(sizeof(int) * N);
	for (int i = 0; i < N; i++)
		tg[i] = (i * 7) % V;
	loom__classifier_forward_backward_ref(loss_r, dx_r, dw_r, logits_r, x, wte, tg, 1.0f / N, N, C, V);
	for (int p = 0; p < np; p++) {
		loom__gemm_ctx_t ctx = {.dtype = LOOM_COMPUTE_BF16, .path = path_of[p]};
		loss[p] = calloc(N, 4), dx[p] = calloc((size_t)N * C, 4), dw[p] = calloc((size_t)V * C, 4);
		loom__gemm_setup(&ctx);
		loom__classifier_forward_backward(loss[p], dx[p], dw[p], logits, chunk, x, wte, tg, 1.0f / N, N, C, V);
		loom__gemm_setup(NULL);
		CHECK_OK(loom__gemm_status(&ctx));
		CHECK_MSG(!close_rel("bf16 classifier losses", loss[p], loss_r, N, 2e-2), "%s", p ? "native" : "portable");
		CHECK_MSG(!close_rel("bf16 classifier dx", dx[p], dx_r, (size_t)N * C, 2e-2), "%s", p ? "native" : "portable");
		CHECK_MSG(!close_rel("bf16 classifier dwte", dw[p], dw_r, (size_t)V * C, 2e-2), "%s", p ? "native" : "portable");
		loom__gemm_ctx_free(&ctx);
	}
	if (np == 2) {
		/* plus 4e-6 for the loss's own fp32 arithmetic on either side (fast_expf's ~3e-7 relative error
		 * per term, the roundings of log s + m - z_t ~ 5 at u each) */
		double tol = 2 * native_vs_portable(C, max_mag(x, wte, 0, 1, N, V, C)) + 4e-6;
		CHECK(!close_abs("bf16 classifier losses", loss[1], loss[0], N, tol));
		CHECK(!close_rel("bf16 classifier dx, native vs portable", dx[1], dx[0], (size_t)N * C, 2e-2));
		CHECK(!close_rel("bf16 classifier dwte, native vs portable", dw[1], dw[0], (size_t)V * C, 2e-2));
	}
	for (int p = 0; p < np; p++)
		free(loss[p]), free(dx[p]), free(dw[p]);
	free(x), free(wte), free(loss_r), free(logits), free(logits_r), free(dx_r), free(dw_r), free(tg);
	return 0;
}

/* The portable path forced (LOOM_BF16=portable) through the CLI, on any machine: `loom train --dtype
 * bf16` trains and names the path at start, `loom bench gemm` measures the bf16 GEMM on it. */
TEST(bf16_portable_forced_runs)
{
	char dir[512], cmd[2048], out[8192];
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(test_make_token_data(dir, 257, 4000));
	snprintf(cmd, sizeof cmd, "LOOM_BF16=portable %s train --train-data '%s/train_*.bin' --model tiny --batch-size 1 "
	         "--seq-len 16 --steps 2 --threads 1 --peak-flops 1e10 --dtype bf16", test_loom_bin(), dir);
	int st = test_run_cmd(cmd, out, sizeof out, 60);
	CHECK_MSG(st == 0, "exit %d: %s", st, out);
	CHECK_CONTAINS(out, "matmuls in bf16 (fp32 accumulation), path portable (bf16-rounded operands, fp32 FMA)");
	CHECK_CONTAINS(out, "step 2/2");
	snprintf(cmd, sizeof cmd, "%s train --train-data '%s/train_*.bin' --steps 2 --dtype fp16", test_loom_bin(), dir);
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 60), 2);
	CHECK_CONTAINS(out, "--dtype: dtype 'fp16': expected fp32 or bf16");
	snprintf(cmd, sizeof cmd, "LOOM_BF16=portable %s bench gemm --threads 1 --size 16 --seconds 0.01", test_loom_bin());
	st = test_run_cmd(cmd, out, sizeof out, 60);
	CHECK_MSG(st == 0, "exit %d: %s", st, out);
	CHECK_CONTAINS(out, "sgemm 16x16x16, 1 thread: ");
	CHECK_CONTAINS(out, "bf16 gemm 16x16x16, 1 thread: ");
	CHECK_CONTAINS(out, "path portable (bf16-rounded operands, fp32 FMA)");
	test_rmdir(dir);
	return 0;
}

/* LOOM_BF16=native where it cannot run is an error naming what is missing, from `loom train` (before
 * any step) and from `loom bench gemm`, never a silent fallback. oneDNN capped at AVX2
 * (DNNL_MAX_CPU_ISA) makes it impossible on every machine; an unknown LOOM_BF16 is an error too. */
TEST(bf16_native_unavailable_is_error)
{
	char dir[512], cmd[2048], out[8192];
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(test_make_token_data(dir, 257, 4000));
	snprintf(cmd, sizeof cmd, "DNNL_MAX_CPU_ISA=AVX2 LOOM_BF16=native %s train --train-data '%s/train_*.bin' --model "
	         "tiny --batch-size 1 --seq-len 16 --steps 2 --threads 1 --peak-flops 1e10 --dtype bf16", test_loom_bin(),
	         dir);
	int st = test_run_cmd(cmd, out, sizeof out, 60);
	CHECK_MSG(st == 1, "exit %d: %s", st, out);
	CHECK_CONTAINS(out, "LOOM_BF16=native: the native bf16 GEMM needs AVX512-BF16 or AMX-BF16 through oneDNN, and ");
	CHECK_CONTAINS(out, "unset LOOM_BF16 (or set it to portable) for the portable path");
	CHECK_MSG(!strstr(out, "step 1/2"), "a step ran: %s", out);
	snprintf(cmd, sizeof cmd, "DNNL_MAX_CPU_ISA=AVX2 LOOM_BF16=native %s bench gemm --threads 1 --size 16 --seconds "
	         "0.01", test_loom_bin());
	st = test_run_cmd(cmd, out, sizeof out, 60);
	CHECK_MSG(st == 1, "exit %d: %s", st, out);
	CHECK_CONTAINS(out, "sgemm 16x16x16, 1 thread: "); /* fp32 is unaffected */
	CHECK_CONTAINS(out, "bf16: LOOM_BF16=native: the native bf16 GEMM needs AVX512-BF16 or AMX-BF16");
	CHECK_MSG(!strstr(out, "bf16 gemm"), "bf16 measured on an impossible path: %s", out);
	snprintf(cmd, sizeof cmd, "LOOM_BF16=fastest %s train --train-data '%s/train_*.bin' --model tiny --steps 2 "
	         "--threads 1 --peak-flops 1e10 --dtype bf16", test_loom_bin(), dir);
	st = test_run_cmd(cmd, out, sizeof out, 60);
	CHECK_MSG(st == 1, "exit %d: %s", st, out);
	CHECK_CONTAINS(out, "LOOM_BF16=fastest: expected auto, native or portable");
	test_rmdir(dir);
	return 0;
}

/* 300 steps of the `tiny` preset (L4 H4 C128, vocabulary 257) in fp32 and in bf16 on each path from the
 * same initialization and data: each bf16 run ends within 2% of the fp32 run's loss and follows it.
 * (The two bf16 paths differ by summation order only, but 300 steps amplify that chaotically, so they
 * are held to fp32's tolerance, not to each other's bits.) */
TEST(bf16_tiny_training_tracks_fp32)
{
	enum { STEPS = 300 };
	char dir[512], cmd[4096], out[16384], log[600];
	static double loss[3][STEPS + 1];
	static const char *dt[3] = {"fp32", "bf16", "bf16"}, *env[3] = {"", "LOOM_BF16=portable", "LOOM_BF16=native"};
	static const char *said[3] = {"matmuls in fp32", "matmuls in bf16 (fp32 accumulation), path portable",
	                              "matmuls in bf16 (fp32 accumulation), path native"};
	int runs = 1 + npaths();
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(test_make_token_data(dir, 257, 40000));
	/* the runs are single-threaded and independent: all at once (their outputs in run<d>.out) */
	size_t len = 0;
	for (int d = 0; d < runs; d++)
		len += (size_t)snprintf(cmd + len, sizeof cmd - len,
		                        "%s %s train --train-data '%s/train_*.bin' --model tiny --batch-size 2 --seq-len 64 "
		                        "--steps %d --lr 3e-3 --warmup 20 --threads 1 --peak-flops 1e10 --print-every 100 "
		                        "--dtype %s --log %s/run%d.jsonl > %s/run%d.out 2>&1 & p%d=$!; ",
		                        env[d], test_loom_bin(), dir, STEPS, dt[d], dir, d, dir, d, d);
	for (int d = 0; d < runs; d++)
		len += (size_t)snprintf(cmd + len, sizeof cmd - len, "wait $p%d || { echo run %d failed; st=1; }; ", d, d);
	snprintf(cmd + len, sizeof cmd - len, "exit ${st:-0}");
	CHECK(len < sizeof cmd - 16);
	int st_all = test_run_cmd(cmd, out, sizeof out, 600);
	for (int d = 0; d < runs; d++) {
		char path[600];
		snprintf(log, sizeof log, "%s/run%d.jsonl", dir, d);
		snprintf(path, sizeof path, "%s/run%d.out", dir, d);
		static char text[16384];
		const char *t = test_read_text(path, text, sizeof text);
		CHECK_MSG(st_all == 0 && t != NULL, "%s %s: %s; %s", env[d], dt[d], out, t ? t : "(no output)");
		CHECK_CONTAINS(t, said[d]);
		CHECK_EQ(test_read_losses(log, loss[d], STEPS + 1, NULL, NULL), STEPS);
		char first[4096] = "";
		FILE *f = fopen(log, "r");
		CHECK(f != NULL);
		CHECK(fgets(first, sizeof first, f) != NULL);
		fclose(f);
		CHECK_CONTAINS(first, d ? "\"dtype\":\"bf16\"" : "\"dtype\":\"fp32\""); /* the log's config record */
	}
	/* it learned (the data has structure) */
	CHECK_MSG(loss[0][STEPS] < loss[0][1] - 0.4, "fp32 %.4f -> %.4f", loss[0][1], loss[0][STEPS]);
	for (int d = 1; d < runs; d++) {
		const char *path = d == 1 ? "portable" : "native";
		for (int s = 1; s <= STEPS; s++) {
			CHECK_MSG(isfinite(loss[d][s]), "bf16 %s step %d: loss %g", path, s, loss[d][s]);
			CHECK_MSG(fabs(loss[d][s] - loss[0][s]) <= 0.05 * loss[0][s], "step %d: bf16 %s %.6f vs fp32 %.6f", s,
			          path, loss[d][s], loss[0][s]);
		}
		double worst = 0.0;
		for (int s = 1; s <= STEPS; s++)
			worst = fmax(worst, fabs(loss[d][s] - loss[0][s]) / loss[0][s]);
		printf("  fp32 %.4f -> %.4f, bf16 %s -> %.4f; largest step difference %.2f%%\n", loss[0][1], loss[0][STEPS],
		       path, loss[d][STEPS], 100 * worst);
		/* and ends where fp32 ends */
		CHECK_MSG(fabs(loss[d][STEPS] - loss[0][STEPS]) <= 0.02 * loss[0][STEPS], "final loss: bf16 %s %.6f vs fp32 "
		          "%.6f", path, loss[d][STEPS], loss[0][STEPS]);
	}
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

/* bf16 through a tensor-parallel shard (--tp 2: its vocab-parallel classifier; and with sequence
 * parallelism) and pipeline stages (--pp 2): the losses follow the single-process bf16 run's within 1% (the products are split
 * differently, so the bits differ). */
TEST(bf16_tp_and_pp_track_single)
{
	enum { STEPS = 5 };
	char dir[512], cmd[2048], out[16384], log[600];
	static double loss[4][STEPS + 1];
	static const char *how[4] = {"", "--nproc 2 --tp 2", "--nproc 2 --pp 2", "--nproc 2 --tp 2 --sequence-parallel"};
	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK_OK(test_make_token_data(dir, 257, 20000));
	for (int p = 0; p < npaths(); p++) {
		for (int k = 0; k < 4; k++) {
			snprintf(log, sizeof log, "%s/run%d%d.jsonl", dir, p, k);
			snprintf(cmd, sizeof cmd, "%s %s train %s --train-data '%s/train_*.bin' --model tiny --batch-size 2 "
			         "--seq-len 32 --steps %d --lr 3e-3 --threads 1 --peak-flops 1e10 --dtype bf16 --log %s",
			         path_env[p], test_loom_bin(), how[k], dir, STEPS, log);
			int st = test_run_cmd(cmd, out, sizeof out, 120);
			CHECK_MSG(st == 0, "%s '%s': exit %d: %s", path_env[p], how[k], st, out);
			CHECK_CONTAINS(out, p ? "matmuls in bf16 (fp32 accumulation), path native" :
			                        "matmuls in bf16 (fp32 accumulation), path portable");
			CHECK_EQ(test_read_losses(log, loss[k], STEPS + 1, NULL, NULL), STEPS);
		}
		for (int k = 1; k < 4; k++)
			for (int s = 1; s <= STEPS; s++)
				CHECK_MSG(fabs(loss[k][s] - loss[0][s]) <= 0.01 * loss[0][s], "%s '%s' step %d: %.6f vs %.6f",
				          path_env[p], how[k], s, loss[k][s], loss[0][s]);
	}
	test_rmdir(dir);
	return 0;
}
