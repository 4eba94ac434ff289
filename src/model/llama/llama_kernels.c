/* llama_kernels.c: the kernels the Llama family adds to the shared ones: RMSNorm with a weight (in
 * fp32, as LlamaRMSNorm computes it), rotary embeddings in transformers' rotate_half layout, the
 * SwiGLU activation and bias rows (the row gather / scatter-add of the embedding are kernels.c's).
 *
 * Conventions as kernels.h: outputs first, backward kernels accumulate (+=), OpenMP over rows (or
 * columns, for sums over rows, so that they are deterministic for a thread count), no allocation. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "model/fastmath.h"
#include "model/llama/llama_model.h"

#define PAR_MIN 32768
#define COLS 64 /* columns a thread sums over every row at a time */

/* ---- RMSNorm with a weight ------------------------------------------------------------------------ */

void loom__ll_rmsnorm_forward(float *out, int ldo, float *rstd, const float *inp, int ldi, const float *w, float eps,
                              int N, int C)
{
#pragma omp parallel for schedule(static) if ((long)N * C >= PAR_MIN)
	for (int n = 0; n < N; n++) {
		const float *x = inp + (size_t)n * ldi;
		float *o = out + (size_t)n * ldo, ss = 0.0f;
#pragma omp simd reduction(+ : ss)
		for (int c = 0; c < C; c++)
			ss += x[c] * x[c];
		float r = 1.0f / sqrtf(ss / (float)C + eps);
#pragma omp simd
		for (int c = 0; c < C; c++)
			o[c] = w[c] * (x[c] * r);
		rstd[n] = r;
	}
}

/* y = w xhat, xhat = x r: dxhat = dy w, dx = r (dxhat - xhat mean(dxhat xhat)), dw = sum_n dy xhat. */
void loom__ll_rmsnorm_backward(float *dinp, int ldd, float *dw, const float *dout, int lddo, const float *inp, int ldi,
                               const float *w, const float *rstd, int N, int C)
{
#pragma omp parallel for schedule(static) if ((long)N * C >= PAR_MIN)
	for (int n = 0; n < N; n++) {
		const float *dy = dout + (size_t)n * lddo, *x = inp + (size_t)n * ldi;
		float *dx = dinp + (size_t)n * ldd, r = rstd[n], dot = 0.0f;
#pragma omp simd reduction(+ : dot)
		for (int c = 0; c < C; c++)
			dot += dy[c] * w[c] * x[c];
		float m = dot * r * r / (float)C;
#pragma omp simd
		for (int c = 0; c < C; c++)
			dx[c] += r * (dy[c] * w[c] - x[c] * m);
	}
	if (!dw)
		return;
#pragma omp parallel for schedule(static) if ((long)N * C >= PAR_MIN)
	for (int c0 = 0; c0 < C; c0 += COLS) {
		int c1 = c0 + COLS < C ? c0 + COLS : C;
		float acc[COLS] = {0};
		for (int n = 0; n < N; n++) {
			const float *dy = dout + (size_t)n * lddo, *x = inp + (size_t)n * ldi;
			float r = rstd[n];
#pragma omp simd
			for (int c = c0; c < c1; c++)
				acc[c - c0] += dy[c] * x[c] * r;
		}
		for (int c = c0; c < c1; c++)
			dw[c] += acc[c - c0];
	}
}

/* ---- rotary embeddings (rotate_half) ------------------------------------------------------------ */

void loom__ll_rope_forward(float *x, const float *cos, const float *sin, int N, int T, int pos0, int H, int D)
{
	int h2 = D / 2;
#pragma omp parallel for schedule(static) if ((long)N * H * D >= PAR_MIN)
	for (int n = 0; n < N; n++) {
		const float *c = cos + (size_t)(pos0 + n % T) * h2, *s = sin + (size_t)(pos0 + n % T) * h2;
		for (int h = 0; h < H; h++) {
			float *a = x + ((size_t)n * H + h) * D, *b = a + h2;
#pragma omp simd
			for (int i = 0; i < h2; i++) {
				float x1 = a[i], x2 = b[i];
				a[i] = x1 * c[i] - x2 * s[i];
				b[i] = x2 * c[i] + x1 * s[i];
			}
		}
	}
}

void loom__ll_rope_backward(float *dx, const float *cos, const float *sin, int N, int T, int pos0, int H, int D)
{
	int h2 = D / 2;
#pragma omp parallel for schedule(static) if ((long)N * H * D >= PAR_MIN)
	for (int n = 0; n < N; n++) {
		const float *c = cos + (size_t)(pos0 + n % T) * h2, *s = sin + (size_t)(pos0 + n % T) * h2;
		for (int h = 0; h < H; h++) {
			float *a = dx + ((size_t)n * H + h) * D, *b = a + h2;
#pragma omp simd
			for (int i = 0; i < h2; i++) {
				float d1 = a[i], d2 = b[i];
				a[i] = d1 * c[i] + d2 * s[i];
				b[i] = d2 * c[i] - d1 * s[i];
			}
		}
	}
}

/* ---- SwiGLU ---------------------------------------------------------------------------------------- */

void loom__ll_swiglu_forward(float *act, const float *g, const float *u, size_t n)
{
#pragma omp parallel for simd schedule(static) if (n >= PAR_MIN)
	for (size_t i = 0; i < n; i++)
		act[i] = g[i] / (1.0f + fast_expf(-g[i])) * u[i];
}

/* silu(g) = g s, s = sigmoid(g); silu'(g) = s (1 + g (1 - s)). */
void loom__ll_swiglu_backward(float *dg, float *du, const float *dact, const float *g, const float *u, size_t n)
{
#pragma omp parallel for simd schedule(static) if (n >= PAR_MIN)
	for (size_t i = 0; i < n; i++) {
		float s = 1.0f / (1.0f + fast_expf(-g[i]));
		dg[i] += dact[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
		du[i] += dact[i] * g[i] * s;
	}
}

/* ---- biases ---------------------------------------------------------------------------------------- */

void loom__ll_bias_forward(float *y, int ldy, const float *b, int N, int n)
{
#pragma omp parallel for schedule(static) if ((long)N * n >= PAR_MIN)
	for (int r = 0; r < N; r++) {
		float *o = y + (size_t)r * ldy;
#pragma omp simd
		for (int c = 0; c < n; c++)
			o[c] += b[c];
	}
}

void loom__ll_bias_backward(float *db, const float *dy, int lddy, int N, int n)
{
#pragma omp parallel for schedule(static) if ((long)N * n >= PAR_MIN)
	for (int c0 = 0; c0 < n; c0 += COLS) {
		int c1 = c0 + COLS < n ? c0 + COLS : n;
		float acc[COLS] = {0};
		for (int r = 0; r < N; r++) {
			const float *d = dy + (size_t)r * lddy;
#pragma omp simd
			for (int c = c0; c < c1; c++)
				acc[c - c0] += d[c];
		}
		for (int c = c0; c < c1; c++)
			db[c] += acc[c - c0];
	}
}
