/* nanochat_kernels.c: the kernels nanochat's GPT adds to GPT-2's: parameter-free RMSNorm, rotary
 * embeddings, relu^2, windowed causal attention with grouped kv heads and the softcapped lm head fused
 * with cross-entropy (the embedding's row gather / scatter-add are kernels.c's).
 *
 * Conventions as kernels.h: outputs first, backward kernels accumulate (+=), OpenMP over rows or
 * heads, deterministic for a given thread count, no allocation. The attention is the fused kernel
 * every family uses (flash.c), with nanochat's window and grouped kv heads. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "model/fastmath.h"
#include "model/nanochat/nanochat_model.h"

#define PAR_MIN 32768

/* ---- RMSNorm ----------------------------------------------------------------------------------- */

void loom__nc_rmsnorm_forward(float *out, int ldo, float *rstd, const float *inp, int ldi, int N, int C)
{
#pragma omp parallel for schedule(static) if ((long)N * C >= PAR_MIN)
	for (int n = 0; n < N; n++) {
		const float *x = inp + (size_t)n * ldi;
		float *o = out + (size_t)n * ldo, ss = 0.0f;
#pragma omp simd reduction(+ : ss)
		for (int c = 0; c < C; c++)
			ss += x[c] * x[c];
		float r = 1.0f / sqrtf(ss / (float)C + NC_EPS);
#pragma omp simd
		for (int c = 0; c < C; c++)
			o[c] = x[c] * r;
		rstd[n] = r;
	}
}

void loom__nc_rmsnorm_backward(float *dinp, int ldd, const float *dout, int lddo, const float *y, int ldy,
                               const float *rstd, int N, int C)
{
#pragma omp parallel for schedule(static) if ((long)N * C >= PAR_MIN)
	for (int n = 0; n < N; n++) {
		const float *dy = dout + (size_t)n * lddo, *yy = y + (size_t)n * ldy;
		float *dx = dinp + (size_t)n * ldd, dot = 0.0f;
#pragma omp simd reduction(+ : dot)
		for (int c = 0; c < C; c++)
			dot += dy[c] * yy[c];
		float r = rstd[n], m = dot / (float)C;
#pragma omp simd
		for (int c = 0; c < C; c++)
			dx[c] += r * (dy[c] - yy[c] * m);
	}
}

/* ---- rotary embeddings ---------------------------------------------------------------------------- */

void loom__nc_rope_forward(float *x, const float *cos, const float *sin, int N, int T, int pos0, int H, int D)
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
				a[i] = x1 * c[i] + x2 * s[i];
				b[i] = x2 * c[i] - x1 * s[i];
			}
		}
	}
}

void loom__nc_rope_backward(float *dx, const float *cos, const float *sin, int N, int T, int pos0, int H, int D)
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
				a[i] = d1 * c[i] - d2 * s[i];
				b[i] = d1 * s[i] + d2 * c[i];
			}
		}
	}
}

/* ---- relu^2 --------------------------------------------------------------------------------------- */

void loom__nc_relu2_forward(float *y, const float *x, size_t n)
{
#pragma omp parallel for simd schedule(static) if (n >= PAR_MIN)
	for (size_t i = 0; i < n; i++) {
		float r = x[i] > 0.0f ? x[i] : 0.0f;
		y[i] = r * r;
	}
}

void loom__nc_relu2_backward(float *dx, const float *x, const float *dy, size_t n)
{
#pragma omp parallel for simd schedule(static) if (n >= PAR_MIN)
	for (size_t i = 0; i < n; i++) {
		float r = x[i] > 0.0f ? x[i] : 0.0f;
		dx[i] += 2.0f * r * dy[i];
	}
}

/* ---- attention ------------------------------------------------------------------------------------ */

/* The windowed causal attention with grouped kv heads on the fused kernel (flash.c): q (N, NH D),
 * k, v (N, NKV D) side by side per position, a query at t sees keys [t - W, t]. */
loom__flash_t loom__nc_attention_shape(const float *q, const float *k, const float *v, int B, int T, int NH, int NKV, int D,
                              int W)
{
	loom__flash_t a = {.q = q, .k = k, .v = v, .ldq = NH * D, .ldk = NKV * D, .B = B, .Tq = T, .Tk = T, .NH = NH,
	                   .NKV = NKV, .D = D, .W = W, .scale = 1.0f / sqrtf((float)D)};
	return a;
}

void loom__nc_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v, int B, int T,
                                int NH, int NKV, int D, int W)
{
	loom__flash_t a = loom__nc_attention_shape(q, k, v, B, T, NH, NKV, D, W);
	loom__flash_forward(&a, out, NH * D, lse);
}

void loom__nc_attention_backward(float *dq, float *dk, float *dv, float *scratch, int scratch_threads,
                                 const float *dout, const float *q, const float *k, const float *v, const float *out,
                                 const float *lse, int B, int T, int NH, int NKV, int D, int W)
{
	loom__flash_t a = loom__nc_attention_shape(q, k, v, B, T, NH, NKV, D, W);
	loom__flash_backward(&a, dq, NH * D, dk, dv, NKV * D, dout, NH * D, out, NH * D, lse, scratch, scratch_threads);
}

/* ---- the softcapped head ---------------------------------------------------------------------------- */

void loom__nc_logits(float *out, const float *x, int ldx, const float *w, int N, int C, int V)
{
	loom__gemm(0, 1, N, V, C, 1.0f, x, ldx, w, C, 0.0f, out, V);
	const float inv = 1.0f / NC_SOFTCAP;
#pragma omp parallel for simd schedule(static) if ((long)N * V >= PAR_MIN)
	for (size_t i = 0; i < (size_t)N * V; i++)
		out[i] = NC_SOFTCAP * loom__nc_tanhf(out[i] * inv);
}

/* Per row: z = x w^T, c = 15 tanh(z / 15), m = max c, s = sum exp(c - m), loss = log s + m - c[target];
 * dc = dloss (exp(c - m) / s - onehot), dz = dc (1 - (c / 15)^2). */
void loom__nc_classifier(float *losses, float *dx, float *dw, float *logits, int chunk, const float *x, const float *w,
                         const int *targets, float dloss, int N, int C, int V)
{
	const float inv = 1.0f / NC_SOFTCAP;
	/* bf16 (loom__gemm_setup): w converted once for every chunk's products, each chunk's gradient
	 * logits once for both of theirs, as GPT-2's classifier */
	loom__gemm_ctx_t *bf = loom__gemm_current();
	const void *w16 = bf ? loom__bf16_hold(bf, LOOM_BF16_SLOT_HOLD0, w, (size_t)V * C) : NULL;
	void *g16 = bf && dx ? loom__bf16_slot(bf, LOOM_BF16_SLOT_HOLD1, (size_t)(N < chunk ? N : chunk) * V) : NULL;
	if (bf && (!w16 || (dx && !g16)))
		return; /* out of memory: the error is in the ctx */
	for (int n0 = 0; n0 < N; n0 += chunk) {
		int nc = N - n0 < chunk ? N - n0 : chunk;
		const float *xc = x + (size_t)n0 * C;
		if (bf)
			loom__gemm_bf16x(bf, 0, 1, nc, V, C, 1.0f, xc, NULL, C, w, w16, C, 0.0f, logits, V);
		else
			loom__gemm(0, 1, nc, V, C, 1.0f, xc, C, w, C, 0.0f, logits, V);
#pragma omp parallel for schedule(static) if ((long)nc * V >= PAR_MIN)
		for (int i = 0; i < nc; i++) {
			float *z = logits + (size_t)i * V, mx = -INFINITY, sum = 0.0f;
			int tgt = targets[n0 + i];
#pragma omp simd
			for (int j = 0; j < V; j++)
				z[j] = NC_SOFTCAP * loom__nc_tanhf(z[j] * inv);
			float ct = z[tgt];
#pragma omp simd reduction(max : mx)
			for (int j = 0; j < V; j++)
				mx = z[j] > mx ? z[j] : mx;
#pragma omp simd reduction(+ : sum)
			for (int j = 0; j < V; j++)
				sum += fast_expf(z[j] - mx);
			losses[n0 + i] = logf(sum) + mx - ct;
			if (!dx)
				continue;
			float g = dloss / sum;
#pragma omp simd
			for (int j = 0; j < V; j++) {
				float c = z[j], t = c * inv;
				float dc = g * fast_expf(c - mx) - (j == tgt ? dloss : 0.0f);
				z[j] = dc * (1.0f - t * t);
			}
			if (g16) /* bf16: the gradient row converted while it is in cache */
				loom__bf16_row(bf, g16, (size_t)i * V, z, V);
		}
		if (dx && bf) {
			loom__gemm_bf16x(bf, 0, 0, nc, C, V, 1.0f, logits, g16, V, w, w16, C, 1.0f, dx + (size_t)n0 * C, C);
			loom__gemm_bf16x(bf, 1, 0, V, C, nc, 1.0f, logits, g16, V, xc, NULL, C, 1.0f, dw, C);
		} else if (dx) {
			loom__gemm(0, 0, nc, C, V, 1.0f, logits, V, w, C, 1.0f, dx + (size_t)n0 * C, C);
			loom__gemm(1, 0, V, C, nc, 1.0f, logits, V, xc, C, 1.0f, dw, C);
		}
	}
}
