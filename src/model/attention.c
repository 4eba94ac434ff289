/* attention.c: causal multi-head self-attention, forward and backward, by sgemm per (batch, head).
 *
 * Why this shape: per (b, h) the scores S = Q K^T / sqrt(hs) are a (T,T) product of two strided views
 * of qkv (leading dimension 3C), so no copy is needed. The causal mask is exploited by rows blocks
 * of ATT_BLOCK: the rows of block [r0, r1) only need key columns [0, r1), which cuts the score and
 * value products to about (1/2 + ATT_BLOCK/2T) of their full size. The softmax is fused: one pass
 * per row for the max, one for exp and sum, one to normalize, and the entries above the diagonal are
 * stored as exact zeros. Pairs (b, h) are spread over the OpenMP threads; each writes only its own
 * head's columns, so there are no races and results do not depend on the thread count. The
 * probabilities alone (loom__attention_probs, for selective activation checkpointing) are the same
 * per-row-block code, so a recomputation reproduces the forward's bits exactly. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "model/fastmath.h"
#include "model/kernels.h"

#ifndef ATT_BLOCK
#define ATT_BLOCK 64
#endif

size_t loom__attention_scratch_floats(int T, int nthreads)
{
	return (size_t)T * T * (size_t)(nthreads > 0 ? nthreads : 1);
}

/* Rows [r0, r1) of one head's probabilities P (T,T): the scores scale q k^T over key columns [0, r1),
 * the causal softmax, zeros above the diagonal. The one implementation behind the forward and the
 * recomputation (loom__attention_probs), so both give the same bits. */
static void probs_rows(float *P, const float *q, const float *k, int r0, int r1, int T, int C3, int hs, float scale)
{
	loom__sgemm1(0, 1, r1 - r0, r1, hs, scale, q + (size_t)r0 * C3, C3, k, C3, 0.0f, P + (size_t)r0 * T, T);
	for (int t = r0; t < r1; t++) {
		float *p = P + (size_t)t * T, mx = -INFINITY, sum = 0.0f;
#pragma omp simd reduction(max : mx)
		for (int j = 0; j <= t; j++)
			mx = p[j] > mx ? p[j] : mx;
#pragma omp simd reduction(+ : sum)
		for (int j = 0; j <= t; j++) {
			p[j] = fast_expf(p[j] - mx);
			sum += p[j];
		}
		float inv = 1.0f / sum;
#pragma omp simd
		for (int j = 0; j <= t; j++)
			p[j] *= inv;
		memset(p + t + 1, 0, sizeof(float) * (size_t)(T - t - 1));
	}
}

void loom__attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH)
{
	/* qkv (B,T,3C), out (B,T,C), att (B,NH,T,T) */
	int hs = C / NH, C3 = 3 * C;
	float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for schedule(dynamic, 1) if ((double)B * T * T * C >= 1e6)
	for (int bh = 0; bh < B * NH; bh++) {
		int b = bh / NH, h = bh % NH;
		const float *q = qkv + (size_t)b * T * C3 + (size_t)h * hs, *k = q + C, *v = q + 2 * C;
		float *P = att + (size_t)bh * T * T, *o = out + (size_t)b * T * C + (size_t)h * hs;
		for (int r0 = 0; r0 < T; r0 += ATT_BLOCK) {
			int r1 = r0 + ATT_BLOCK < T ? r0 + ATT_BLOCK : T;
			probs_rows(P, q, k, r0, r1, T, C3, hs, scale);
			loom__sgemm1(0, 0, r1 - r0, hs, r1, 1.0f, P + (size_t)r0 * T, T, v, C3, 0.0f, o + (size_t)r0 * C, C);
		}
	}
}

void loom__attention_probs(float *att, const float *qkv, int B, int T, int C, int NH)
{
	/* qkv (B,T,3C), att (B,NH,T,T): the same pairs, blocks and calls as loom__attention_forward */
	int hs = C / NH, C3 = 3 * C;
	float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for schedule(dynamic, 1) if ((double)B * T * T * C >= 1e6)
	for (int bh = 0; bh < B * NH; bh++) {
		int b = bh / NH, h = bh % NH;
		const float *q = qkv + (size_t)b * T * C3 + (size_t)h * hs, *k = q + C;
		float *P = att + (size_t)bh * T * T;
		for (int r0 = 0; r0 < T; r0 += ATT_BLOCK)
			probs_rows(P, q, k, r0, r0 + ATT_BLOCK < T ? r0 + ATT_BLOCK : T, T, C3, hs, scale);
	}
}

void loom__attention_backward(float *dqkv, float *scratch, int scratch_threads, const float *dout, const float *qkv,
                        const float *att, int B, int T, int C, int NH)
{
	/* dqkv (B,T,3C) +=; dout (B,T,C); scratch: T*T floats per thread for dP, turned into dS in place */
	int hs = C / NH, C3 = 3 * C;
	float scale = 1.0f / sqrtf((float)hs);
	int nt = omp_get_max_threads() < scratch_threads ? omp_get_max_threads() : scratch_threads;
#pragma omp parallel num_threads(nt) if ((double)B * T * T * C >= 1e6)
	{
		float *dS = scratch + (size_t)omp_get_thread_num() * T * T;
#pragma omp for schedule(dynamic, 1)
		for (int bh = 0; bh < B * NH; bh++) {
			int b = bh / NH, h = bh % NH;
			size_t qoff = (size_t)b * T * C3 + (size_t)h * hs;
			const float *q = qkv + qoff, *k = q + C, *v = q + 2 * C;
			float *dq = dqkv + qoff, *dk = dq + C, *dv = dq + 2 * C;
			const float *P = att + (size_t)bh * T * T, *dy = dout + (size_t)b * T * C + (size_t)h * hs;
			/* dP = dY V^T on the causal blocks, then dS = P * (dP - rowsum(P * dP)), zero above the diagonal */
			for (int r0 = 0; r0 < T; r0 += ATT_BLOCK) {
				int r1 = r0 + ATT_BLOCK < T ? r0 + ATT_BLOCK : T;
				loom__sgemm1(0, 1, r1 - r0, r1, hs, 1.0f, dy + (size_t)r0 * C, C, v, C3, 0.0f, dS + (size_t)r0 * T, T);
				for (int t = r0; t < r1; t++) {
					float *d = dS + (size_t)t * T, dot = 0.0f;
					const float *p = P + (size_t)t * T;
#pragma omp simd reduction(+ : dot)
					for (int j = 0; j <= t; j++)
						dot += p[j] * d[j];
#pragma omp simd
					for (int j = 0; j <= t; j++)
						d[j] = p[j] * (d[j] - dot);
					for (int j = t + 1; j < r1; j++)
						d[j] = 0.0f;
				}
				/* dQ rows of this block += scale dS K */
				loom__sgemm1(0, 0, r1 - r0, hs, r1, scale, dS + (size_t)r0 * T, T, k, C3, 1.0f, dq + (size_t)r0 * C3, C3);
			}
			/* dK rows [j0,j1) += scale dS^T Q and dV rows += P^T dY, over the rows t >= j0 only */
			for (int j0 = 0; j0 < T; j0 += ATT_BLOCK) {
				int j1 = j0 + ATT_BLOCK < T ? j0 + ATT_BLOCK : T;
				loom__sgemm1(1, 0, j1 - j0, hs, T - j0, scale, dS + (size_t)j0 * T + j0, T, q + (size_t)j0 * C3, C3, 1.0f,
				       dk + (size_t)j0 * C3, C3);
				loom__sgemm1(1, 0, j1 - j0, hs, T - j0, 1.0f, P + (size_t)j0 * T + j0, T, dy + (size_t)j0 * C, C, 1.0f,
				       dv + (size_t)j0 * C3, C3);
			}
		}
	}
}
