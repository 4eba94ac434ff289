/* classifier.c: the tied language-model head fused with softmax, cross-entropy and their backward.
 *
 * Why chunks: the logits of a whole micro-batch are N x V floats (1024 x 50257 = 206 MB for the
 * `small` preset). Going over the positions `chunk` at a time, the logits of a chunk are produced by
 * one sgemm, turned into probabilities, losses and (in place) their gradient while still in cache,
 * and consumed by the two gradient sgemms before the next chunk overwrites them. The scratch buffer
 * is chunk x V floats and the N x V logits never exist in memory.
 *
 * Per row: z = logits, m = max z, s = sum exp(z - m); loss = log s + m - z[target];
 * dz = dloss * (exp(z - m) / s - onehot(target)). Targets must be in [0, V) (the model checks). */
#include <math.h>
#include <omp.h>

#include "model/fastmath.h"
#include "model/kernels.h"

void classifier_forward_backward(float *losses, float *dx, float *dwte, float *logits, int chunk, const float *x,
                                 const float *wte, const int *targets, float dloss, int N, int C, int V)
{
	/* losses (N), dx (N,C), dwte (V,C), logits scratch (chunk,V), x (N,C), wte (V,C), targets (N) */
	for (int n0 = 0; n0 < N; n0 += chunk) {
		int nc = N - n0 < chunk ? N - n0 : chunk;
		const float *xc = x + (size_t)n0 * C;
		gemm(0, 1, nc, V, C, 1.0f, xc, C, wte, C, 0.0f, logits, V);
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
			} else {
#pragma omp simd reduction(+ : sum)
				for (int j = 0; j < V; j++)
					sum += fast_expf(z[j] - mx);
			}
			losses[n0 + i] = logf(sum) + mx - zt;
		}
		if (dx) {
			gemm(0, 0, nc, C, V, 1.0f, logits, V, wte, C, 1.0f, dx + (size_t)n0 * C, C);
			gemm(1, 0, V, C, nc, 1.0f, logits, V, xc, C, 1.0f, dwte, C);
		}
	}
}
