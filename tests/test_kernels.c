/* test_kernels.c: GPT-2's kernels: every backward against central finite differences of a
 * double-precision forward written here, and every fast kernel against its reference version.
 *
 * Each gradient check uses the scalar L = sum(out * w) with random w, so the backward's dout is w.
 * The double forwards below are the formulas again, independently of src/model (h = 1e-5 in double:
 * truncation ~1e-10, rounding ~1e-11), so the tolerances only have to absorb the float32 backward:
 * 1e-4 relative to the largest gradient of the tensor. Fast kernels run with 1 and 2 threads and
 * must match the reference to 2e-5 relative to the output's largest magnitude (float sums in a
 * different order, and a polynomial exp/tanh good to about 2 ulp). Sizes are small and odd (T=70
 * crosses the attention's 64-row blocks, the classifier's chunk does not divide N) so that every
 * path runs; the whole file takes well under a second. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "loom/gpt2.h"
#include "model/fastmath.h"
#include "model/kernels.h"
#include "model/rng.h"
#include "test.h"

/* ---- helpers ------------------------------------------------------------------------------- */

static rng_t trng;

static float *rnd(size_t n, double scale)
{
	float *p = malloc(sizeof(float) * (n ? n : 1));
	for (size_t i = 0; i < n; i++)
		p[i] = (float)(scale * rng_normal(&trng));
	return p;
}

static float *zeros(size_t n)
{
	return calloc(n ? n : 1, sizeof(float));
}

static double *to_double(const float *x, size_t n)
{
	double *d = malloc(sizeof(double) * (n ? n : 1));
	for (size_t i = 0; i < n; i++)
		d[i] = x[i];
	return d;
}

static double maxabs(const float *x, size_t n)
{
	double m = 0.0;
	for (size_t i = 0; i < n; i++)
		m = fmax(m, fabs(x[i]));
	return m;
}

/* Every |a - b| <= rel * max|b| (+ a tiny floor for all-zero tensors); prints the worst element. */
static int close_f(const char *what, const float *a, const float *b, size_t n, double rel)
{
	double tol = rel * maxabs(b, n) + 1e-30, worst = 0.0;
	size_t wi = 0;
	for (size_t i = 0; i < n; i++) {
		double d = fabs((double)a[i] - b[i]);
		if (!(d <= worst)) /* also catches NaN */
			worst = d, wi = i;
	}
	if (!(worst <= tol)) {
		fprintf(stderr, "  %s: element %zu: %.9g vs %.9g (diff %.3g > tol %.3g)\n", what, wi, a[wi], b[wi], worst,
		        tol);
		return 1;
	}
	return 0;
}

/* Gradient g (float, from a backward) against central differences of f over the double inputs x. */
static int fd_check(const char *what, double (*f)(void *), void *ctx, double *x, size_t n, const float *g)
{
	const double h = 1e-5;
	float *num = malloc(sizeof(float) * n);
	for (size_t i = 0; i < n; i++) {
		double s = x[i];
		x[i] = s + h;
		double fp = f(ctx);
		x[i] = s - h;
		double fm = f(ctx);
		x[i] = s;
		num[i] = (float)((fp - fm) / (2 * h));
	}
	int bad = close_f(what, g, num, n, 1e-4);
	free(num);
	return bad;
}

/* ---- double-precision forwards (the formulas, for finite differences) --------------------- */

typedef struct {
	int B, T, C, OC, NH, V, N;
	double *x, *w, *b, *dout; /* inputs, parameters and the loss weights */
	const int *tok;
	double dloss;
} fd_ctx_t;

static double ln_loss(void *p)
{
	fd_ctx_t *c = p;
	double L = 0.0;
	for (int i = 0; i < c->N; i++) {
		double m = 0.0, v = 0.0;
		for (int k = 0; k < c->C; k++)
			m += c->x[i * c->C + k];
		m /= c->C;
		for (int k = 0; k < c->C; k++)
			v += (c->x[i * c->C + k] - m) * (c->x[i * c->C + k] - m);
		double s = 1.0 / sqrt(v / c->C + 1e-5);
		for (int k = 0; k < c->C; k++)
			L += ((c->x[i * c->C + k] - m) * s * c->w[k] + c->b[k]) * c->dout[i * c->C + k];
	}
	return L;
}

static double mm_loss(void *p)
{
	fd_ctx_t *c = p;
	double L = 0.0;
	for (int i = 0; i < c->N; i++)
		for (int o = 0; o < c->OC; o++) {
			double s = c->b[o];
			for (int k = 0; k < c->C; k++)
				s += c->x[i * c->C + k] * c->w[k * c->OC + o];
			L += s * c->dout[i * c->OC + o];
		}
	return L;
}

static double gelu_loss(void *p)
{
	fd_ctx_t *c = p;
	double L = 0.0;
	for (int i = 0; i < c->N; i++) {
		double x = c->x[i];
		L += 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))) * c->dout[i];
	}
	return L;
}

static double att_loss(void *p)
{
	fd_ctx_t *c = p;
	int T = c->T, C = c->C, NH = c->NH, hs = C / NH;
	double L = 0.0, *s = malloc(sizeof(double) * T);
	for (int b = 0; b < c->B; b++)
		for (int h = 0; h < NH; h++)
			for (int t = 0; t < T; t++) {
				const double *q = c->x + ((size_t)b * T + t) * 3 * C + h * hs;
				double mx = -INFINITY, sum = 0.0;
				for (int j = 0; j <= t; j++) {
					const double *k = c->x + ((size_t)b * T + j) * 3 * C + C + h * hs;
					s[j] = 0.0;
					for (int i = 0; i < hs; i++)
						s[j] += q[i] * k[i] / sqrt((double)hs);
					mx = fmax(mx, s[j]);
				}
				for (int j = 0; j <= t; j++)
					sum += s[j] = exp(s[j] - mx);
				for (int i = 0; i < hs; i++) {
					double y = 0.0;
					for (int j = 0; j <= t; j++)
						y += s[j] / sum * c->x[((size_t)b * T + j) * 3 * C + 2 * C + h * hs + i];
					L += y * c->dout[((size_t)b * T + t) * C + h * hs + i];
				}
			}
	free(s);
	return L;
}

static double cls_loss(void *p)
{
	fd_ctx_t *c = p;
	double L = 0.0, *z = malloc(sizeof(double) * c->V);
	for (int i = 0; i < c->N; i++) {
		double mx = -INFINITY, sum = 0.0;
		for (int v = 0; v < c->V; v++) {
			z[v] = 0.0;
			for (int k = 0; k < c->C; k++)
				z[v] += c->x[i * c->C + k] * c->w[v * c->C + k];
			mx = fmax(mx, z[v]);
		}
		for (int v = 0; v < c->V; v++)
			sum += exp(z[v] - mx);
		L += c->dloss * (log(sum) + mx - z[c->tok[i]]);
	}
	free(z);
	return L;
}

static double enc_loss(void *p)
{
	fd_ctx_t *c = p; /* x = wte (V,C), w = wpe (T,C) */
	double L = 0.0;
	for (int i = 0; i < c->B * c->T; i++)
		for (int k = 0; k < c->C; k++)
			L += (c->x[c->tok[i] * c->C + k] + c->w[(i % c->T) * c->C + k]) * c->dout[i * c->C + k];
	return L;
}

/* Run fn with 1 and then 2 OpenMP threads; fail if either fails. */
#define WITH_THREADS(body)                                                                         \
	do {                                                                                           \
		int saved_ = loom_num_threads();                                                           \
		for (int nth_ = 1; nth_ <= 2; nth_++) {                                                    \
			loom_set_num_threads(nth_);                                                            \
			int bad_ = (body);                                                                     \
			if (bad_) {                                                                            \
				loom_set_num_threads(saved_);                                                      \
				TEST_FAIL_("with %d thread(s)", nth_);                                             \
			}                                                                                      \
		}                                                                                          \
		loom_set_num_threads(saved_);                                                              \
	} while (0)

/* ---- LayerNorm ------------------------------------------------------------------------------ */

static int layernorm_case(int N, int C)
{
	float *x = rnd((size_t)N * C, 1.5), *w = rnd(C, 1.0), *b = rnd(C, 1.0), *dout = rnd((size_t)N * C, 1.0);
	float *out = zeros((size_t)N * C), *mean = zeros(N), *rstd = zeros(N);
	float *out_r = zeros((size_t)N * C), *mean_r = zeros(N), *rstd_r = zeros(N);
	float *dx = rnd((size_t)N * C, 0.1), *dw = rnd(C, 0.1), *db = rnd(C, 0.1);
	float *dx_r = malloc(sizeof(float) * N * C), *dw_r = malloc(sizeof(float) * C), *db_r = malloc(sizeof(float) * C);
	int bad = 0;
	memcpy(dx_r, dx, sizeof(float) * N * C), memcpy(dw_r, dw, sizeof(float) * C), memcpy(db_r, db, sizeof(float) * C);
	loom__layernorm_forward(out, mean, rstd, x, w, b, N, C);
	loom__layernorm_forward_ref(out_r, mean_r, rstd_r, x, w, b, N, C);
	bad |= close_f("layernorm out", out, out_r, (size_t)N * C, 2e-5);
	bad |= close_f("layernorm rstd", rstd, rstd_r, N, 2e-5);
	loom__layernorm_backward(dx, dw, db, dout, x, w, mean, rstd, N, C);
	loom__layernorm_backward_ref(dx_r, dw_r, db_r, dout, x, w, mean_r, rstd_r, N, C);
	bad |= close_f("layernorm dinp", dx, dx_r, (size_t)N * C, 2e-5);
	bad |= close_f("layernorm dweight", dw, dw_r, C, 2e-5);
	bad |= close_f("layernorm dbias", db, db_r, C, 2e-5);
	free(x), free(w), free(b), free(dout), free(out), free(mean), free(rstd), free(out_r), free(mean_r);
	free(rstd_r), free(dx), free(dw), free(db), free(dx_r), free(dw_r), free(db_r);
	return bad;
}

TEST(kernels_layernorm_matches_ref)
{
	WITH_THREADS(layernorm_case(37, 48) || layernorm_case(3, 20));
	return 0;
}

TEST(kernels_layernorm_backward_fd)
{
	int N = 5, C = 12;
	float *x = rnd(N * C, 1.5), *w = rnd(C, 1.0), *b = rnd(C, 1.0), *dout = rnd(N * C, 1.0);
	float *out = zeros(N * C), *mean = zeros(N), *rstd = zeros(N), *dx = zeros(N * C), *dw = zeros(C), *db = zeros(C);
	fd_ctx_t c = {.N = N, .C = C, .x = to_double(x, N * C), .w = to_double(w, C), .b = to_double(b, C),
	              .dout = to_double(dout, N * C)};
	loom__layernorm_forward_ref(out, mean, rstd, x, w, b, N, C);
	loom__layernorm_backward_ref(dx, dw, db, dout, x, w, mean, rstd, N, C);
	CHECK(!fd_check("ref dinp", ln_loss, &c, c.x, N * C, dx));
	CHECK(!fd_check("ref dweight", ln_loss, &c, c.w, C, dw));
	CHECK(!fd_check("ref dbias", ln_loss, &c, c.b, C, db));
	memset(dx, 0, sizeof(float) * N * C), memset(dw, 0, sizeof(float) * C), memset(db, 0, sizeof(float) * C);
	loom__layernorm_forward(out, mean, rstd, x, w, b, N, C);
	loom__layernorm_backward(dx, dw, db, dout, x, w, mean, rstd, N, C);
	CHECK(!fd_check("fast dinp", ln_loss, &c, c.x, N * C, dx));
	CHECK(!fd_check("fast dweight", ln_loss, &c, c.w, C, dw));
	free(x), free(w), free(b), free(dout), free(out), free(mean), free(rstd), free(dx), free(dw), free(db);
	free(c.x), free(c.w), free(c.b), free(c.dout);
	return 0;
}

/* ---- matmul --------------------------------------------------------------------------------- */

static int matmul_case(int N, int C, int OC)
{
	float *x = rnd((size_t)N * C, 1.0), *w = rnd((size_t)C * OC, 0.5), *b = rnd(OC, 1.0);
	float *dout = rnd((size_t)N * OC, 1.0);
	float *out = zeros((size_t)N * OC), *out_r = zeros((size_t)N * OC);
	float *dx = rnd((size_t)N * C, 0.1), *dw = rnd((size_t)C * OC, 0.1), *db = rnd(OC, 0.1);
	float *dx_r = malloc(sizeof(float) * N * C), *dw_r = malloc(sizeof(float) * C * OC);
	float *db_r = malloc(sizeof(float) * OC);
	int bad = 0;
	memcpy(dx_r, dx, sizeof(float) * N * C), memcpy(dw_r, dw, sizeof(float) * C * OC);
	memcpy(db_r, db, sizeof(float) * OC);
	loom__matmul_forward(out, x, w, b, N, C, OC);
	loom__matmul_forward_ref(out_r, x, w, b, N, C, OC);
	bad |= close_f("matmul out", out, out_r, (size_t)N * OC, 2e-5);
	loom__matmul_forward(out, x, w, NULL, N, C, OC);
	loom__matmul_forward_ref(out_r, x, w, NULL, N, C, OC);
	bad |= close_f("matmul out (no bias)", out, out_r, (size_t)N * OC, 2e-5);
	loom__matmul_backward(dx, dw, db, dout, x, w, N, C, OC);
	loom__matmul_backward_ref(dx_r, dw_r, db_r, dout, x, w, N, C, OC);
	bad |= close_f("matmul dinp", dx, dx_r, (size_t)N * C, 2e-5);
	bad |= close_f("matmul dweight", dw, dw_r, (size_t)C * OC, 2e-5);
	bad |= close_f("matmul dbias", db, db_r, OC, 2e-5);
	free(x), free(w), free(b), free(dout), free(out), free(out_r), free(dx), free(dw), free(db);
	free(dx_r), free(dw_r), free(db_r);
	return bad;
}

TEST(kernels_matmul_matches_ref)
{
	/* the last shape is large enough (> 4e6 multiply-adds) for loom__gemm() to split it over threads */
	WITH_THREADS(matmul_case(7, 5, 9) || matmul_case(33, 24, 72) || matmul_case(130, 96, 400));
	return 0;
}

TEST(kernels_matmul_backward_fd)
{
	int N = 4, C = 6, OC = 5;
	float *x = rnd(N * C, 1.0), *w = rnd(C * OC, 0.5), *b = rnd(OC, 1.0), *dout = rnd(N * OC, 1.0);
	float *dx = zeros(N * C), *dw = zeros(C * OC), *db = zeros(OC);
	fd_ctx_t c = {.N = N, .C = C, .OC = OC, .x = to_double(x, N * C), .w = to_double(w, C * OC),
	              .b = to_double(b, OC), .dout = to_double(dout, N * OC)};
	loom__matmul_backward_ref(dx, dw, db, dout, x, w, N, C, OC);
	CHECK(!fd_check("ref dinp", mm_loss, &c, c.x, N * C, dx));
	CHECK(!fd_check("ref dweight", mm_loss, &c, c.w, C * OC, dw));
	CHECK(!fd_check("ref dbias", mm_loss, &c, c.b, OC, db));
	memset(dx, 0, sizeof(float) * N * C), memset(dw, 0, sizeof(float) * C * OC), memset(db, 0, sizeof(float) * OC);
	loom__matmul_backward(dx, dw, db, dout, x, w, N, C, OC);
	CHECK(!fd_check("fast dinp", mm_loss, &c, c.x, N * C, dx));
	CHECK(!fd_check("fast dweight", mm_loss, &c, c.w, C * OC, dw));
	CHECK(!fd_check("fast dbias", mm_loss, &c, c.b, OC, db));
	free(x), free(w), free(b), free(dout), free(dx), free(dw), free(db), free(c.x), free(c.w), free(c.b), free(c.dout);
	return 0;
}

/* ---- GELU, residual, encoder ------------------------------------------------------------------ */

static int gelu_case(size_t N)
{
	float *x = rnd(N, 3.0), *dout = rnd(N, 1.0), *out = zeros(N), *out_r = zeros(N);
	float *dx = rnd(N, 0.1), *dx_r = malloc(sizeof(float) * N);
	int bad = 0;
	x[0] = 40.0f, x[1] = -40.0f, x[2] = 0.0f; /* saturated tanh both ways, and zero */
	memcpy(dx_r, dx, sizeof(float) * N);
	loom__gelu_forward(out, x, N);
	loom__gelu_forward_ref(out_r, x, N);
	bad |= close_f("gelu out", out, out_r, N, 2e-6);
	loom__gelu_backward(dx, x, dout, N);
	loom__gelu_backward_ref(dx_r, x, dout, N);
	bad |= close_f("gelu dinp", dx, dx_r, N, 2e-6);
	free(x), free(dout), free(out), free(out_r), free(dx), free(dx_r);
	return bad;
}

TEST(kernels_gelu_residual_match_ref)
{
	WITH_THREADS(gelu_case(1001));
	float *a = rnd(99, 1.0), *b = rnd(99, 1.0), *o = zeros(99), *o_r = zeros(99);
	loom__residual_forward(o, a, b, 99);
	loom__residual_forward_ref(o_r, a, b, 99);
	for (int i = 0; i < 99; i++)
		CHECK_FEQ(o[i], o_r[i]);
	CHECK_FEQ(o[5], a[5] + b[5]);
	free(a), free(b), free(o), free(o_r);
	return 0;
}

/* ---- the vectorized fast paths, bit for bit ----------------------------------------------------
 * fast_expf's clamps are compares and selects that the compiler turns into blends (or AVX-512
 * masks) inside vector loops. These check that the vector code gives exactly the scalar,
 * branchy code's bits, the clamps included: the scalar side calls the function through a noinline
 * wrapper, a call the vectorizer leaves alone. */

/* the same bits, or both NaN (GELU of -inf: -inf * 0) */
static int same_bits(float a, float b)
{
	return (isnan(a) && isnan(b)) || memcmp(&a, &b, sizeof a) == 0;
}

static __attribute__((noinline)) float scalar_expf(float x)
{
	return fast_expf(x);
}

static __attribute__((noinline)) float scalar_tanhf(float x)
{
	return fast_tanhf(x);
}

/* inputs across the clamps (-87, 88), infinities, huge and denormal values, round-half cases of n */
static float *fastmath_inputs(size_t n)
{
	static const float edge[] = {-INFINITY, -1e30f, -200.0f, -88.5f, -87.5f, -87.0f, -86.99999f, -43.5f, -0.0f,
	                             0.0f, 1e-40f, 0.34657359f, 0.5f * 0.69314718f, 1.0f, 44.0f, 87.99999f, 88.0f,
	                             88.00001f, 88.7f, 89.0f, 1e30f, INFINITY};
	float *x = rnd(n, 40.0);
	for (size_t i = 0; i < sizeof edge / sizeof edge[0] && i < n; i++)
		x[i * 7 % n] = edge[i];
	return x;
}

TEST(kernels_fastmath_vector_bits)
{
	enum { N = 1003 };
	float *x = fastmath_inputs(N), *e = zeros(N), *th = zeros(N);
#pragma omp simd
	for (int i = 0; i < N; i++)
		e[i] = fast_expf(x[i]);
#pragma omp simd
	for (int i = 0; i < N; i++)
		th[i] = fast_tanhf(x[i]);
	for (int i = 0; i < N; i++) {
		float es = scalar_expf(x[i]), ts = scalar_tanhf(x[i]);
		CHECK_MSG(same_bits(e[i], es), "expf(%.9g): vector %.9g, scalar %.9g", x[i], e[i], es);
		CHECK_MSG(same_bits(th[i], ts), "tanhf(%.9g): vector %.9g, scalar %.9g", x[i], th[i], ts);
	}
	/* the clamps: below -87 the result is e^-87, above 88 e^88, always finite */
	CHECK_FEQ(scalar_expf(-INFINITY), scalar_expf(-87.0f));
	CHECK_FEQ(scalar_expf(INFINITY), scalar_expf(88.0f));
	CHECK(isfinite(scalar_expf(INFINITY)) && scalar_expf(-INFINITY) > 0.0f);
	CHECK_FEQ(scalar_tanhf(INFINITY), 1.0f);
	CHECK_FEQ(scalar_tanhf(-INFINITY), -1.0f);
	free(x), free(e), free(th);
	return 0;
}

/* loom__gelu_forward/backward (vectorized, threaded above PAR_MIN) against kernels.c's formula
 * element by element with the scalar tanh: the same bits, tails and thread splits included. */
static int gelu_bits_case(size_t N)
{
	const float k = 0.7978845608028654f; /* kernels.c's GELU_K */
	float *x = fastmath_inputs(N), *dout = rnd(N, 1.0), *out = zeros(N), *dx = rnd(N, 0.1);
	float *dx0 = malloc(sizeof(float) * N);
	int bad = 0;
	memcpy(dx0, dx, sizeof(float) * N);
	loom__gelu_forward(out, x, N);
	loom__gelu_backward(dx, x, dout, N);
	for (size_t i = 0; i < N && !bad; i++) {
		float xi = x[i], t = scalar_tanhf(k * (xi + 0.044715f * xi * xi * xi));
		float o = 0.5f * xi * (1.0f + t);
		float local = 0.5f * (1.0f + t) + 0.5f * xi * (1.0f - t * t) * k * (1.0f + 3.0f * 0.044715f * xi * xi);
		float d = dx0[i] + local * dout[i];
		if (!same_bits(o, out[i]) || !same_bits(d, dx[i])) {
			fprintf(stderr, "  gelu(%.9g): out %.9g vs %.9g, dinp %.9g vs %.9g\n", xi, out[i], o, dx[i], d);
			bad = 1;
		}
	}
	free(x), free(dout), free(out), free(dx), free(dx0);
	return bad;
}

TEST(kernels_gelu_vector_bits)
{
	WITH_THREADS(gelu_bits_case(1001) || gelu_bits_case(70001));
	return 0;
}

TEST(kernels_gelu_backward_fd)
{
	int N = 40;
	float *x = rnd(N, 2.0), *dout = rnd(N, 1.0), *dx = zeros(N), *dx_r = zeros(N);
	fd_ctx_t c = {.N = N, .x = to_double(x, N), .dout = to_double(dout, N)};
	loom__gelu_backward(dx, x, dout, N);
	loom__gelu_backward_ref(dx_r, x, dout, N);
	CHECK(!fd_check("fast dinp", gelu_loss, &c, c.x, N, dx));
	CHECK(!fd_check("ref dinp", gelu_loss, &c, c.x, N, dx_r));
	free(x), free(dout), free(dx), free(dx_r), free(c.x), free(c.dout);
	return 0;
}

TEST(kernels_encoder)
{
	int B = 3, T = 5, C = 20, V = 7;
	int tok[15] = {1, 2, 1, 6, 0, 6, 6, 6, 3, 1, 0, 0, 5, 4, 2}; /* repeats: concurrent dwte rows */
	float *wte = rnd(V * C, 1.0), *wpe = rnd(T * C, 1.0), *dout = rnd(B * T * C, 1.0);
	float *out = zeros(B * T * C), *out_r = zeros(B * T * C);
	float *dwte = zeros(V * C), *dwpe = zeros(T * C), *dwte_r = zeros(V * C), *dwpe_r = zeros(T * C);
	loom__encoder_forward_ref(out_r, tok, wte, wpe, B, T, C);
	CHECK_FEQ(out_r[(1 * T + 2) * C + 3], wte[6 * C + 3] + wpe[2 * C + 3]);
	loom__encoder_backward_ref(dwte_r, dwpe_r, dout, tok, B, T, C);
	fd_ctx_t c = {.B = B, .T = T, .C = C, .x = to_double(wte, V * C), .w = to_double(wpe, T * C),
	              .dout = to_double(dout, B * T * C), .tok = tok};
	CHECK(!fd_check("ref dwte", enc_loss, &c, c.x, V * C, dwte_r));
	CHECK(!fd_check("ref dwpe", enc_loss, &c, c.w, T * C, dwpe_r));
	int saved = loom_num_threads();
	for (int nth = 1; nth <= 2; nth++) {
		loom_set_num_threads(nth);
		memset(dwte, 0, sizeof(float) * V * C), memset(dwpe, 0, sizeof(float) * T * C);
		loom__encoder_forward(out, tok, wte, wpe, B, T, C);
		loom__encoder_backward(dwte, dwpe, dout, tok, B, T, C);
		for (int i = 0; i < B * T * C; i++)
			CHECK_FEQ(out[i], out_r[i]);
		for (int i = 0; i < V * C; i++) /* same additions in the same (row) order: exact */
			CHECK_FEQ(dwte[i], dwte_r[i]);
		for (int i = 0; i < T * C; i++)
			CHECK_FEQ(dwpe[i], dwpe_r[i]);
	}
	loom_set_num_threads(saved);
	free(wte), free(wpe), free(dout), free(out), free(out_r), free(dwte), free(dwpe), free(dwte_r), free(dwpe_r);
	free(c.x), free(c.w), free(c.dout);
	return 0;
}

/* ---- attention -------------------------------------------------------------------------------- */

static int attention_case(int B, int T, int C, int NH)
{
	size_t nq = (size_t)B * T * 3 * C, ny = (size_t)B * T * C, na = (size_t)B * NH * T * T;
	float *qkv = rnd(nq, 1.0), *dout = rnd(ny, 1.0), *out = zeros(ny), *out_r = zeros(ny);
	float *lse = zeros((size_t)B * NH * T), *att_r = zeros(na), *dqkv = rnd(nq, 0.1);
	float *dqkv_r = malloc(sizeof(float) * nq), *scratch = zeros(loom__attention_scratch_floats(B, T, C, 2));
	int bad = 0;
	memcpy(dqkv_r, dqkv, sizeof(float) * nq);
	loom__attention_forward(out, lse, qkv, B, T, C, NH);
	loom__attention_forward_ref(out_r, att_r, qkv, B, T, C, NH);
	bad |= close_f("attention out", out, out_r, ny, 2e-5);
	loom__attention_backward(dqkv, scratch, 2, dout, qkv, out, lse, B, T, C, NH);
	loom__attention_backward_ref(dqkv_r, dout, qkv, att_r, B, T, C, NH);
	bad |= close_f("attention dqkv", dqkv, dqkv_r, nq, 2e-5);
	free(qkv), free(dout), free(out), free(out_r), free(lse), free(att_r), free(dqkv), free(dqkv_r), free(scratch);
	return bad;
}

TEST(kernels_attention_matches_ref)
{
	WITH_THREADS(attention_case(2, 70, 24, 3) || attention_case(1, 1, 8, 2) || attention_case(3, 64, 16, 4) ||
	             attention_case(1, 300, 16, 2));
	return 0;
}

TEST(kernels_attention_backward_fd)
{
	int B = 2, T = 5, C = 8, NH = 2;
	size_t nq = (size_t)B * T * 3 * C, ny = (size_t)B * T * C;
	float *qkv = rnd(nq, 1.0), *dout = rnd(ny, 1.0), *out = zeros(ny), *att = zeros((size_t)B * NH * T * T);
	float *lse = zeros((size_t)B * NH * T);
	float *dqkv = zeros(nq), *dqkv_r = zeros(nq), *scratch = zeros(loom__attention_scratch_floats(B, T, C, 2));
	fd_ctx_t c = {.B = B, .T = T, .C = C, .NH = NH, .x = to_double(qkv, nq), .dout = to_double(dout, ny)};
	loom__attention_forward_ref(out, att, qkv, B, T, C, NH);
	loom__attention_backward_ref(dqkv_r, dout, qkv, att, B, T, C, NH);
	CHECK(!fd_check("ref dqkv", att_loss, &c, c.x, nq, dqkv_r));
	loom__attention_forward(out, lse, qkv, B, T, C, NH);
	loom__attention_backward(dqkv, scratch, 2, dout, qkv, out, lse, B, T, C, NH);
	CHECK(!fd_check("fast dqkv", att_loss, &c, c.x, nq, dqkv));
	free(qkv), free(dout), free(out), free(att), free(lse), free(dqkv), free(dqkv_r), free(scratch), free(c.x),
	    free(c.dout);
	return 0;
}

/* ---- classifier -------------------------------------------------------------------------------- */

static int classifier_case(int N, int C, int V, int chunk)
{
	int *tg = malloc(sizeof(int) * N);
	for (int i = 0; i < N; i++)
		tg[i] = (int)(rng_next(&trng) % (uint64_t)V);
	float *x = rnd((size_t)N * C, 1.0), *wte = rnd((size_t)V * C, 0.5);
	float *loss = zeros(N), *loss_r = zeros(N), *loss_f = zeros(N), *logits = zeros((size_t)chunk * V);
	float *logits_r = zeros((size_t)N * V), *dx = rnd((size_t)N * C, 0.1), *dw = rnd((size_t)V * C, 0.1);
	float *dx_r = malloc(sizeof(float) * N * C), *dw_r = malloc(sizeof(float) * V * C);
	int bad = 0;
	memcpy(dx_r, dx, sizeof(float) * N * C), memcpy(dw_r, dw, sizeof(float) * V * C);
	loom__classifier_forward_backward(loss_f, NULL, NULL, logits, chunk, x, wte, tg, 0.0f, N, C, V);
	loom__classifier_forward_backward(loss, dx, dw, logits, chunk, x, wte, tg, 0.37f, N, C, V);
	loom__classifier_forward_backward_ref(loss_r, dx_r, dw_r, logits_r, x, wte, tg, 0.37f, N, C, V);
	bad |= close_f("classifier losses", loss, loss_r, N, 2e-6);
	bad |= close_f("classifier losses (forward only)", loss_f, loss_r, N, 2e-6);
	bad |= close_f("classifier dx", dx, dx_r, (size_t)N * C, 2e-5);
	bad |= close_f("classifier dwte", dw, dw_r, (size_t)V * C, 2e-5);
	free(tg), free(x), free(wte), free(loss), free(loss_r), free(loss_f), free(logits), free(logits_r);
	free(dx), free(dw), free(dx_r), free(dw_r);
	return bad;
}

TEST(kernels_classifier_matches_ref)
{
	/* chunks that do not divide N, one chunk for all, and a vocabulary wide enough to split */
	WITH_THREADS(classifier_case(10, 16, 37, 4) || classifier_case(9, 8, 11, 9) ||
	             classifier_case(40, 64, 2100, 16));
	return 0;
}

TEST(kernels_classifier_backward_fd)
{
	int N = 6, C = 5, V = 9;
	int tg[6] = {0, 8, 3, 3, 5, 1};
	float *x = rnd(N * C, 1.0), *wte = rnd(V * C, 1.0), *loss = zeros(N), *logits = zeros(N * V);
	float *dx = zeros(N * C), *dw = zeros(V * C), *dx_r = zeros(N * C), *dw_r = zeros(V * C);
	fd_ctx_t c = {.N = N, .C = C, .V = V, .x = to_double(x, N * C), .w = to_double(wte, V * C), .tok = tg,
	              .dloss = 0.37f};
	loom__classifier_forward_backward_ref(loss, dx_r, dw_r, logits, x, wte, tg, 0.37f, N, C, V);
	CHECK(!fd_check("ref dx", cls_loss, &c, c.x, N * C, dx_r));
	CHECK(!fd_check("ref dwte", cls_loss, &c, c.w, V * C, dw_r));
	loom__classifier_forward_backward(loss, dx, dw, logits, 4, x, wte, tg, 0.37f, N, C, V);
	CHECK(!fd_check("fast dx", cls_loss, &c, c.x, N * C, dx));
	CHECK(!fd_check("fast dwte", cls_loss, &c, c.w, V * C, dw));
	/* the losses themselves: their sum against the double formula */
	double sum = 0.0;
	for (int i = 0; i < N; i++)
		sum += loss[i];
	c.dloss = 1.0;
	CHECK_NEAR(sum, cls_loss(&c), 1e-5 * fabs(sum));
	free(x), free(wte), free(loss), free(logits), free(dx), free(dw), free(dx_r), free(dw_r), free(c.x), free(c.w);
	return 0;
}

/* ---- threads, measured sgemm throughput, `loom bench gemm` ------------------------------------ */

TEST(kernels_threads_and_gemm_flops)
{
	int saved = loom_num_threads();
	CHECK_EQ(loom_set_num_threads(1), 1);
	CHECK_EQ(loom_num_threads(), 1);
	CHECK_EQ(loom_set_num_threads(0), omp_get_num_procs());
	CHECK_EQ(loom_set_num_threads(2), 2);
	/* a measurement restores the thread count; bad shapes measure nothing */
	double f = loom_gemm_flops(1, 64, 48, 32, 0.0);
	CHECK_MSG(f > 1e6 && f < 1e13, "%g FLOP/s", f);
	CHECK_EQ(loom_num_threads(), 2);
	CHECK_FEQ(loom_gemm_flops(1, 0, 48, 32, 0.0), 0.0);
	loom_set_num_threads(saved);
	return 0;
}

TEST(kernels_bench_gemm_cli)
{
	char cmd[512], out[4096];
	snprintf(cmd, sizeof cmd, "%s bench gemm --threads 1 --size 96,64,32 --seconds 0.01", test_loom_bin());
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 60), 0);
	CHECK_CONTAINS(out, "sgemm 96x64x32, 1 thread: ");
	CHECK_CONTAINS(out, " GFLOP/s");
	snprintf(cmd, sizeof cmd, "%s bench gemm --size 0,4,4", test_loom_bin());
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 60), 2);
	CHECK_CONTAINS(out, "--size: '0,4,4' has a non-positive dimension");
	snprintf(cmd, sizeof cmd, "%s bench gemm --size 7,x", test_loom_bin());
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 60), 2);
	CHECK_CONTAINS(out, "is not N or M,N,K");
	return 0;
}
