/* clip.c: global gradient-norm clipping with torch.nn.utils.clip_grad_norm_ semantics.
 *
 * The norm is the L2 norm over every gradient, accumulated in double (64 fixed chunks summed in
 * order, each in 16 interleaved lanes, so the result depends neither on the thread count nor on
 * the ISA). The scale is max_norm / (norm + 1e-6), applied only when it is < 1. */
#include <math.h>

#include "core/util.h"
#include "loom/optim.h"

/* Sum of squares of g[0..n) in LANES interleaved double partial sums (lane k takes the elements
 * k, k + LANES, ...), added in lane order at the end, then the tail in order. One running sum would
 * be a chain of dependent adds (latency-bound: 25 ms for `small`'s 30M floats); the lanes are
 * independent, so GCC vectorizes them on every ISA (2, 4 or 8 doubles a vector) and the sum becomes
 * memory-bound. The order is the source's, not the vector width's: the same bits on every ISA. */
#define LANES 16
static double sumsq_chunk(const float *g, size_t n)
{
	double acc[LANES] = {0.0}, s = 0.0;
	size_t i = 0;
	for (; i + LANES <= n; i += LANES)
		for (int k = 0; k < LANES; k++)
			acc[k] += (double)g[i + k] * (double)g[i + k];
	for (int k = 0; k < LANES; k++)
		s += acc[k];
	for (; i < n; i++)
		s += (double)g[i] * (double)g[i];
	return s;
}

double loom_grad_sumsq(const float *g, size_t n)
{
	/* A fixed number of chunks, whatever the thread count, summed in chunk order: the norm is the
	 * same bits with 1 or N threads. */
	enum { NCHUNK = 64 };
	double part[NCHUNK], total = 0.0;
	size_t chunk = (n + NCHUNK - 1) / NCHUNK;
#pragma omp parallel for schedule(static)
	for (int c = 0; c < NCHUNK; c++) {
		size_t lo = LOOM_MIN((size_t)c * chunk, n), hi = LOOM_MIN(lo + chunk, n);
		part[c] = sumsq_chunk(g + lo, hi - lo);
	}
	for (int c = 0; c < NCHUNK; c++)
		total += part[c];
	return total;
}

double loom_grad_norm(const float *g, size_t n)
{
	return sqrt(loom_grad_sumsq(g, n));
}

float loom_clip_scale(double norm, double max_norm)
{
	if (!(max_norm > 0.0))
		return 1.0f;
	double s = max_norm / (norm + 1e-6);
	return s < 1.0 ? (float)s : 1.0f;
}

double loom_clip_grad_norm(float *g, size_t n, double max_norm)
{
	double norm = loom_grad_norm(g, n);
	float s = loom_clip_scale(norm, max_norm);
	if (s != 1.0f) {
#pragma omp parallel for schedule(static)
		for (size_t i = 0; i < n; i++)
			g[i] *= s;
	}
	return norm;
}
