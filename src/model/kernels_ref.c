/* kernels_ref.c: plain reference versions of GPT-2's kernels, written for obviousness, not speed.
 *
 * Single-threaded loops straight from the formulas, libm's expf/tanhf, double accumulators, full
 * (B,NH,T,T) attention and full (N,V) logits. The tests compare each fast kernel against these and
 * check these against finite differences. Same conventions as kernels.h: backward accumulates. */
#include <math.h>
#include <string.h>

#include "model/kernels.h"

void loom__encoder_forward_ref(float *out, const int *inp, const float *wte, const float *wpe, int B, int T, int C)
{
	for (int b = 0; b < B; b++)
		for (int t = 0; t < T; t++)
			for (int c = 0; c < C; c++)
				out[((size_t)b * T + t) * C + c] = wte[(size_t)inp[b * T + t] * C + c] + wpe[(size_t)t * C + c];
}

void loom__encoder_backward_ref(float *dwte, float *dwpe, const float *dout, const int *inp, int B, int T, int C)
{
	for (int b = 0; b < B; b++)
		for (int t = 0; t < T; t++)
			for (int c = 0; c < C; c++) {
				float d = dout[((size_t)b * T + t) * C + c];
				dwte[(size_t)inp[b * T + t] * C + c] += d;
				dwpe[(size_t)t * C + c] += d;
			}
}

void loom__layernorm_forward_ref(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                           const float *bias, int N, int C)
{
	for (int i = 0; i < N; i++) {
		const float *x = inp + (size_t)i * C;
		double m = 0.0, v = 0.0;
		for (int c = 0; c < C; c++)
			m += x[c];
		m /= C;
		for (int c = 0; c < C; c++)
			v += (x[c] - m) * (x[c] - m);
		v /= C;
		double s = 1.0 / sqrt(v + 1e-5);
		for (int c = 0; c < C; c++)
			out[(size_t)i * C + c] = (float)((x[c] - m) * s * weight[c] + bias[c]);
		mean[i] = (float)m;
		rstd[i] = (float)s;
	}
}

void loom__layernorm_backward_ref(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                            const float *weight, const float *mean, const float *rstd, int N, int C)
{
	for (int i = 0; i < N; i++) {
		const float *x = inp + (size_t)i * C, *d = dout + (size_t)i * C;
		double dm = 0.0, dnm = 0.0;
		for (int c = 0; c < C; c++) {
			double n = (x[c] - mean[i]) * (double)rstd[i];
			dm += (double)weight[c] * d[c];
			dnm += (double)weight[c] * d[c] * n;
			dbias[c] += d[c];
			dweight[c] += (float)(n * d[c]);
		}
		dm /= C;
		dnm /= C;
		for (int c = 0; c < C; c++) {
			double n = (x[c] - mean[i]) * (double)rstd[i];
			dinp[(size_t)i * C + c] += (float)(((double)weight[c] * d[c] - dm - n * dnm) * rstd[i]);
		}
	}
}

void loom__matmul_forward_ref(float *out, const float *inp, const float *weight, const float *bias, int N, int C, int OC)
{
	for (int i = 0; i < N; i++)
		for (int o = 0; o < OC; o++) {
			double s = bias ? bias[o] : 0.0;
			for (int c = 0; c < C; c++)
				s += (double)inp[(size_t)i * C + c] * weight[(size_t)c * OC + o];
			out[(size_t)i * OC + o] = (float)s;
		}
}

void loom__matmul_backward_ref(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                         const float *weight, int N, int C, int OC)
{
	if (dinp)
		for (int i = 0; i < N; i++)
			for (int c = 0; c < C; c++) {
				double s = 0.0;
				for (int o = 0; o < OC; o++)
					s += (double)dout[(size_t)i * OC + o] * weight[(size_t)c * OC + o];
				dinp[(size_t)i * C + c] += (float)s;
			}
	if (dweight)
		for (int c = 0; c < C; c++)
			for (int o = 0; o < OC; o++) {
				double s = 0.0;
				for (int i = 0; i < N; i++)
					s += (double)inp[(size_t)i * C + c] * dout[(size_t)i * OC + o];
				dweight[(size_t)c * OC + o] += (float)s;
			}
	if (dbias)
		for (int o = 0; o < OC; o++) {
			double s = 0.0;
			for (int i = 0; i < N; i++)
				s += dout[(size_t)i * OC + o];
			dbias[o] += (float)s;
		}
}

static const double gelu_k = 0.79788456080286535588; /* sqrt(2/pi) */

void loom__gelu_forward_ref(float *out, const float *inp, size_t N)
{
	for (size_t i = 0; i < N; i++) {
		double x = inp[i];
		out[i] = (float)(0.5 * x * (1.0 + tanh(gelu_k * (x + 0.044715 * x * x * x))));
	}
}

void loom__gelu_backward_ref(float *dinp, const float *inp, const float *dout, size_t N)
{
	for (size_t i = 0; i < N; i++) {
		double x = inp[i];
		double u = gelu_k * (x + 0.044715 * x * x * x), th = tanh(u);
		double du = gelu_k * (1.0 + 3.0 * 0.044715 * x * x);
		dinp[i] += (float)((0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * du) * dout[i]);
	}
}

void loom__residual_forward_ref(float *out, const float *inp1, const float *inp2, size_t N)
{
	for (size_t i = 0; i < N; i++)
		out[i] = inp1[i] + inp2[i];
}

void loom__attention_forward_ref(float *out, float *att, const float *qkv, int B, int T, int C, int NH)
{
	int hs = C / NH;
	double scale = 1.0 / sqrt((double)hs);
	for (int b = 0; b < B; b++)
		for (int h = 0; h < NH; h++)
			for (int t = 0; t < T; t++) {
				const float *q = qkv + ((size_t)b * T + t) * 3 * C + (size_t)h * hs;
				float *p = att + (((size_t)b * NH + h) * T + t) * T;
				double mx = -INFINITY, sum = 0.0;
				for (int j = 0; j <= t; j++) {
					const float *k = qkv + ((size_t)b * T + j) * 3 * C + C + (size_t)h * hs;
					double s = 0.0;
					for (int i = 0; i < hs; i++)
						s += (double)q[i] * k[i];
					p[j] = (float)(s * scale);
					mx = p[j] > mx ? p[j] : mx;
				}
				double e[T];
				for (int j = 0; j <= t; j++)
					sum += e[j] = exp(p[j] - mx);
				for (int j = 0; j < T; j++)
					p[j] = j <= t ? (float)(e[j] / sum) : 0.0f;
				float *o = out + ((size_t)b * T + t) * C + (size_t)h * hs;
				for (int i = 0; i < hs; i++) {
					double s = 0.0;
					for (int j = 0; j <= t; j++)
						s += (double)p[j] * qkv[((size_t)b * T + j) * 3 * C + 2 * C + (size_t)h * hs + i];
					o[i] = (float)s;
				}
			}
}

void loom__attention_backward_ref(float *dqkv, const float *dout, const float *qkv, const float *att, int B, int T, int C,
                            int NH)
{
	int hs = C / NH;
	double scale = 1.0 / sqrt((double)hs);
	for (int b = 0; b < B; b++)
		for (int h = 0; h < NH; h++)
			for (int t = 0; t < T; t++) {
				const float *p = att + (((size_t)b * NH + h) * T + t) * T;
				const float *dy = dout + ((size_t)b * T + t) * C + (size_t)h * hs;
				size_t qo = ((size_t)b * T + t) * 3 * C + (size_t)h * hs;
				double dp[T], dot = 0.0;
				for (int j = 0; j <= t; j++) {
					size_t vo = ((size_t)b * T + j) * 3 * C + 2 * C + (size_t)h * hs;
					dp[j] = 0.0;
					for (int i = 0; i < hs; i++) {
						dp[j] += (double)dy[i] * qkv[vo + i];
						dqkv[vo + i] += p[j] * dy[i]; /* dV += P^T dY */
					}
					dot += p[j] * dp[j];
				}
				for (int j = 0; j <= t; j++) {
					double ds = p[j] * (dp[j] - dot) * scale;
					size_t ko = ((size_t)b * T + j) * 3 * C + C + (size_t)h * hs;
					for (int i = 0; i < hs; i++) {
						dqkv[qo + i] += (float)(ds * qkv[ko + i]);
						dqkv[ko + i] += (float)(ds * qkv[qo + i]);
					}
				}
			}
}

void loom__classifier_forward_backward_ref(float *losses, float *dx, float *dwte, float *logits, const float *x,
                                     const float *wte, const int *targets, float dloss, int N, int C, int V)
{
	for (int i = 0; i < N; i++) {
		float *z = logits + (size_t)i * V;
		double mx = -INFINITY, sum = 0.0;
		for (int v = 0; v < V; v++) {
			double s = 0.0;
			for (int c = 0; c < C; c++)
				s += (double)x[(size_t)i * C + c] * wte[(size_t)v * C + c];
			z[v] = (float)s;
			mx = z[v] > mx ? z[v] : mx;
		}
		for (int v = 0; v < V; v++)
			sum += exp(z[v] - mx);
		losses[i] = (float)(log(sum) + mx - z[targets[i]]);
		if (!dx)
			continue;
		for (int v = 0; v < V; v++)
			z[v] = (float)(dloss * (exp(z[v] - mx) / sum - (v == targets[i])));
		for (int v = 0; v < V; v++)
			for (int c = 0; c < C; c++) {
				dx[(size_t)i * C + c] += z[v] * wte[(size_t)v * C + c];
				dwte[(size_t)v * C + c] += z[v] * x[(size_t)i * C + c];
			}
	}
}
