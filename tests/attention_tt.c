/* attention_tt.c: the attention kernels loom had before the fused one (src/model/flash.c), kept as
 * test references: per (batch, head), blocks of TT_BLOCK query rows against every key column the causal
 * mask (and nanochat's window) leaves, storing the whole (B,NH,T,T) probabilities and using a T x T
 * scratch per thread in the backward. GPT-2's (tt_attention_*) reads q, k, v from qkv (B,T,3C);
 * nanochat's (tt_nc_attention_*) from separate q (N,NH D), k, v (N,NKV D) with a window W (keys
 * [t - W, t]) and grouped kv heads, its backward writing dk, dv per query head into dkh, dvh (N,NH D)
 * and summing each group after. Scratch: T*T floats per thread. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "attention_tt.h"
#include "model/fastmath.h"
#include "model/kernels.h"

#define ATT_BLOCK 64

static void g_probs_rows(float *P, const float *q, const float *k, int r0, int r1, int T, int C3, int hs, float scale)
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

void tt_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH)
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
			g_probs_rows(P, q, k, r0, r1, T, C3, hs, scale);
			loom__sgemm1(0, 0, r1 - r0, hs, r1, 1.0f, P + (size_t)r0 * T, T, v, C3, 0.0f, o + (size_t)r0 * C, C);
		}
	}
}

void tt_attention_probs(float *att, const float *qkv, int B, int T, int C, int NH)
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
			g_probs_rows(P, q, k, r0, r0 + ATT_BLOCK < T ? r0 + ATT_BLOCK : T, T, C3, hs, scale);
	}
}

void tt_attention_backward(float *dqkv, float *scratch, int scratch_threads, const float *dout, const float *qkv,
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

/* Rows [r0, r1) of one head's probabilities P (T,T): scores over key columns [c0, r1), the windowed
 * causal softmax, zeros elsewhere in the rows. q rows ldq apart, k rows ldk apart. */
static void n_probs_rows(float *P, const float *q, int ldq, const float *k, int ldk, int r0, int r1, int T, int D, int W,
                       float scale)
{
	int c0 = r0 - W > 0 ? r0 - W : 0;
	loom__sgemm1(0, 1, r1 - r0, r1 - c0, D, scale, q + (size_t)r0 * ldq, ldq, k + (size_t)c0 * ldk, ldk, 0.0f,
	             P + (size_t)r0 * T + c0, T);
	for (int t = r0; t < r1; t++) {
		float *p = P + (size_t)t * T, mx = -INFINITY, sum = 0.0f;
		int j0 = t - W > 0 ? t - W : 0;
#pragma omp simd reduction(max : mx)
		for (int j = j0; j <= t; j++)
			mx = p[j] > mx ? p[j] : mx;
#pragma omp simd reduction(+ : sum)
		for (int j = j0; j <= t; j++) {
			p[j] = fast_expf(p[j] - mx);
			sum += p[j];
		}
		float inv = 1.0f / sum;
#pragma omp simd
		for (int j = j0; j <= t; j++)
			p[j] *= inv;
		memset(p, 0, sizeof(float) * (size_t)j0);
		memset(p + t + 1, 0, sizeof(float) * (size_t)(T - t - 1));
	}
}

static void n_attention(float *out, float *att, const float *q, const float *k, const float *v, int B, int T, int NH,
                      int NKV, int D, int W)
{
	int G = NH / NKV, ldq = NH * D, ldk = NKV * D;
	float scale = 1.0f / sqrtf((float)D);
#pragma omp parallel for schedule(dynamic, 1) if ((double)B * T * T * NH * D >= 1e6)
	for (int bh = 0; bh < B * NH; bh++) {
		int b = bh / NH, h = bh % NH, g = h / G;
		const float *qb = q + (size_t)b * T * ldq + (size_t)h * D, *kb = k + (size_t)b * T * ldk + (size_t)g * D;
		const float *vb = v + (size_t)b * T * ldk + (size_t)g * D;
		float *P = att + (size_t)bh * T * T;
		for (int r0 = 0; r0 < T; r0 += ATT_BLOCK) {
			int r1 = r0 + ATT_BLOCK < T ? r0 + ATT_BLOCK : T, c0 = r0 - W > 0 ? r0 - W : 0;
			n_probs_rows(P, qb, ldq, kb, ldk, r0, r1, T, D, W, scale);
			if (out)
				loom__sgemm1(0, 0, r1 - r0, D, r1 - c0, 1.0f, P + (size_t)r0 * T + c0, T, vb + (size_t)c0 * ldk, ldk,
				             0.0f, out + ((size_t)b * T + r0) * ldq + (size_t)h * D, ldq);
		}
	}
}

void tt_nc_attention_forward(float *out, float *att, const float *q, const float *k, const float *v, int B, int T,
                                int NH, int NKV, int D, int W)
{
	n_attention(out, att, q, k, v, B, T, NH, NKV, D, W);
}

void tt_nc_attention_probs(float *att, const float *q, const float *k, int B, int T, int NH, int NKV, int D, int W)
{
	n_attention(NULL, att, q, k, NULL, B, T, NH, NKV, D, W);
}

void tt_nc_attention_backward(float *dq, float *dk, float *dv, float *dkh, float *dvh, float *scratch,
                                 int scratch_threads, const float *dout, const float *q, const float *k,
                                 const float *v, const float *att, int B, int T, int NH, int NKV, int D, int W)
{
	int G = NH / NKV, ldq = NH * D, ldk = NKV * D, N = B * T;
	float scale = 1.0f / sqrtf((float)D);
	int nt = omp_get_max_threads() < scratch_threads ? omp_get_max_threads() : scratch_threads;
#pragma omp parallel num_threads(nt) if ((double)B * T * T * NH * D >= 1e6)
	{
		float *dS = scratch + (size_t)omp_get_thread_num() * T * T;
#pragma omp for schedule(dynamic, 1)
		for (int bh = 0; bh < B * NH; bh++) {
			int b = bh / NH, h = bh % NH, g = h / G;
			size_t qo = (size_t)b * T * ldq + (size_t)h * D, ko = (size_t)b * T * ldk + (size_t)g * D;
			const float *qb = q + qo, *kb = k + ko, *vb = v + ko, *dy = dout + qo;
			const float *P = att + (size_t)bh * T * T;
			float *dqb = dq + qo, *dkb = dkh + qo, *dvb = dvh + qo;
			/* dP = dY V^T over each row block's columns, then dS = P (dP - rowsum(P dP)), zero outside */
			for (int r0 = 0; r0 < T; r0 += ATT_BLOCK) {
				int r1 = r0 + ATT_BLOCK < T ? r0 + ATT_BLOCK : T, c0 = r0 - W > 0 ? r0 - W : 0;
				loom__sgemm1(0, 1, r1 - r0, r1 - c0, D, 1.0f, dy + (size_t)r0 * ldq, ldq, vb + (size_t)c0 * ldk, ldk,
				             0.0f, dS + (size_t)r0 * T + c0, T);
				for (int t = r0; t < r1; t++) {
					float *d = dS + (size_t)t * T, dot = 0.0f;
					const float *p = P + (size_t)t * T;
					int j0 = t - W > 0 ? t - W : 0;
#pragma omp simd reduction(+ : dot)
					for (int j = j0; j <= t; j++)
						dot += p[j] * d[j];
#pragma omp simd
					for (int j = j0; j <= t; j++)
						d[j] = p[j] * (d[j] - dot);
					memset(d, 0, sizeof(float) * (size_t)j0);
					memset(d + t + 1, 0, sizeof(float) * (size_t)(T - t - 1));
				}
				loom__sgemm1(0, 0, r1 - r0, D, r1 - c0, scale, dS + (size_t)r0 * T + c0, T, kb + (size_t)c0 * ldk, ldk,
				             1.0f, dqb + (size_t)r0 * ldq, ldq);
			}
			/* this head's dK, dV rows [j0, j1) = scale dS^T Q, P^T dY over the rows t in [j0, j1 + W) */
			for (int j0 = 0; j0 < T; j0 += ATT_BLOCK) {
				int j1 = j0 + ATT_BLOCK < T ? j0 + ATT_BLOCK : T;
				int t1 = (long)j1 + W < T ? j1 + W : T;
				loom__sgemm1(1, 0, j1 - j0, D, t1 - j0, scale, dS + (size_t)j0 * T + j0, T, qb + (size_t)j0 * ldq, ldq,
				             0.0f, dkb + (size_t)j0 * ldq, ldq);
				loom__sgemm1(1, 0, j1 - j0, D, t1 - j0, 1.0f, P + (size_t)j0 * T + j0, T, dy + (size_t)j0 * ldq, ldq,
				             0.0f, dvb + (size_t)j0 * ldq, ldq);
			}
		}
	}
	/* dk, dv of kv head g += the sums over its G query heads, in head order */
#pragma omp parallel for schedule(static) if ((long)N * ldq >= 32768)
	for (int n = 0; n < N; n++)
		for (int g = 0; g < NKV; g++)
			for (int j = 0; j < G; j++) {
				const float *a = dkh + (size_t)n * ldq + (size_t)(g * G + j) * D;
				const float *c = dvh + (size_t)n * ldq + (size_t)(g * G + j) * D;
				float *x = dk + (size_t)n * ldk + (size_t)g * D, *y = dv + (size_t)n * ldk + (size_t)g * D;
#pragma omp simd
				for (int i = 0; i < D; i++) {
					x[i] += a[i];
					y[i] += c[i];
				}
			}
}
