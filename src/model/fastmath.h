/* fastmath.h: branch-free expf and tanhf that the compiler vectorizes inside `#pragma omp simd`
 * loops (libm's calls do not vectorize without -ffast-math, which loom does not use). The clamps are
 * compares and selects that GCC if-converts only when FP compares may not trap: the Makefile's
 * -fno-trapping-math. Without it these loops stay scalar on SSE2 and AVX2 (GCC 12: "control flow in
 * loop"), and vectorize only on AVX-512, whose masks do the if-conversion.
 *
 * exp: x = n ln2 + r with |r| <= ln2/2, e^r by its degree-6 Taylor polynomial (relative error
 * below 2e-7, about 2 ulp), times 2^n built in the exponent bits. Inputs are clamped to
 * [-87, 88], so the result is always a finite normal float: callers (softmax after subtracting the
 * row max, GELU's tanh) never need exp of anything smaller than e^-87 ~ 1.6e-38 to be exact. */
#ifndef LOOM_MODEL_FASTMATH_H
#define LOOM_MODEL_FASTMATH_H

#include <stdint.h>

static inline float fast_expf(float x)
{
	union {
		uint32_t u;
		float f;
	} s;
	x = x < -87.0f ? -87.0f : x;
	x = x > 88.0f ? 88.0f : x;
	/* round to nearest with the 1.5 * 2^23 trick (exact in round-to-nearest, no libm call) */
	float t = x * 1.44269504088896341f + 12582912.0f;
	float n = t - 12582912.0f;
	float r = x - n * 0.693145751953125f; /* ln2 split in a high part exact in float ... */
	r = r - n * 1.428606765330187045e-06f; /* ... and the rest */
	float p = 1.0f / 720.0f;
	p = p * r + 1.0f / 120.0f;
	p = p * r + 1.0f / 24.0f;
	p = p * r + 1.0f / 6.0f;
	p = p * r + 0.5f;
	p = p * r + 1.0f;
	p = p * r + 1.0f;
	s.u = (uint32_t)((int32_t)n + 127) << 23;
	return p * s.f;
}

/* tanh(z) = 1 - 2 / (1 + e^(2z)); absolute error about 2e-7 (exact limits +-1 for large |z|). */
static inline float fast_tanhf(float z)
{
	return 1.0f - 2.0f / (1.0f + fast_expf(2.0f * z));
}

#endif
