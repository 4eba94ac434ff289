/* classifier.c: the tied language-model head fused with softmax, cross-entropy and their backward.
 *
 * Why chunks: the logits of a whole micro-batch are N x V floats (1024 x 50257 = 206 MB for the
 * `small` preset, 824 MB for gpt2 with B=4 T=1024). Going over the positions `chunk` at a time, one
 * sgemm makes a chunk's logits, each row (V floats, 200 KB: it stays in L2) is turned into its loss
 * and, in place, its gradient in one sweep, and the two gradient sgemms consume the chunk before the
 * next one overwrites it: the scratch is chunk x V floats whatever B x T is, and the probabilities
 * are never stored separately. The chunk should not be small: every chunk re-packs wte for its
 * logits sgemm, and dwte's sgemm has the chunk as its inner dimension. Measured on this machine (1
 * thread, `small`, N = 1024): chunks of 512 and 1024 cost the same, 256 about 60 ms more per step.
 *
 * Per row: z = logits, m = max z, s = sum exp(z - m); loss = log s + m - z[target];
 * dz = dloss * (exp(z - m) / s - onehot(target)). Targets must be in [0, V) (the model checks). */
#include <math.h>
#include <omp.h>

#include "model/fastmath.h"
#include "model/kernels.h"

void loom__classifier_forward_backward(float *losses, float *dx, float *dwte, float *logits, int chunk, const float *x,
                                 const float *wte, const int *targets, float dloss, int N, int C, int V)
{
	/* losses (N), dx (N,C), dwte (V,C), logits scratch (chunk,V), x (N,C), wte (V,C), targets (N) */
	/* bf16 (loom__gemm_setup): wte is converted once for every chunk's products, each chunk's
	 * gradient logits once for both of theirs */
	loom__gemm_ctx_t *bf = loom__gemm_current();
	const void *wte16 = bf ? loom__bf16_hold(bf, LOOM_BF16_SLOT_HOLD0, wte, (size_t)V * C) : NULL;
	void *g16 = bf && dx ? loom__bf16_slot(bf, LOOM_BF16_SLOT_HOLD1, (size_t)(N < chunk ? N : chunk) * V) : NULL;
	if (bf && (!wte16 || (dx && !g16)))
		return; /* out of memory: the error is in the ctx */
	for (int n0 = 0; n0 < N; n0 += chunk) {
		int nc = N - n0 < chunk ? N - n0 : chunk;
		const float *xc = x + (size_t)n0 * C;
		if (bf)
			loom__gemm_bf16x(bf, 0, 1, nc, V, C, 1.0f, xc, NULL, C, wte, wte16, C, 0.0f, logits, V);
		else
			loom__gemm(0, 1, nc, V, C, 1.0f, xc, C, wte, C, 0.0f, logits, V);
#pragma omp parallel for schedule(static) if ((long)nc * V >= 32768)
		for (int i = 0; i < nc; i++) {
			float *z = logits + (size_t)i * V, mx = -INFINITY, sum = 0.0f;
			int tgt = targets[n0 + i];
			float zt = z[tgt];
#pragma omp simd reduction(max : mx)
			for (int j = 0; j < V; j++)
				mx = z[j] > mx ? z[j] : mx;
			if (dx) {
#pragma omp simd reduction(+ : sum)
				for (int j = 0; j < V; j++) {
					z[j] = fast_expf(z[j] - mx);
					sum += z[j];
				}
				float g = dloss / sum;
#pragma omp simd
				for (int j = 0; j < V; j++)
					z[j] *= g;
				z[tgt] -= dloss;
				if (g16) /* bf16: the gradient row converted while it is in cache */
					loom__bf16_row(bf, g16, (size_t)i * V, z, V);
			} else {
#pragma omp simd reduction(+ : sum)
				for (int j = 0; j < V; j++)
					sum += fast_expf(z[j] - mx);
			}
			losses[n0 + i] = logf(sum) + mx - zt;
		}
		if (dx && bf) {
			loom__gemm_bf16x(bf, 0, 0, nc, C, V, 1.0f, logits, g16, V, wte, wte16, C, 1.0f, dx + (size_t)n0 * C, C);
			loom__gemm_bf16x(bf, 1, 0, V, C, nc, 1.0f, logits, g16, V, xc, NULL, C, 1.0f, dwte, C);
		} else if (dx) {
			loom__gemm(0, 0, nc, C, V, 1.0f, logits, V, wte, C, 1.0f, dx + (size_t)n0 * C, C);
			loom__gemm(1, 0, V, C, nc, 1.0f, logits, V, xc, C, 1.0f, dwte, C);
		}
	}
}
