/* reduce.c: elementwise reduction kernels for every dtype and op, and dtype/op names.
 *
 * These run inside the transport's receive path, so they are written as simple loops the compiler
 * vectorizes. bfloat16 is widened to float32, combined, and rounded back to nearest even. */
#include <stdint.h>
#include <string.h>

#include "comm/transport.h"

size_t loom_dtype_size(loom_dtype_t dt)
{
	static const size_t sizes[LOOM_DTYPE_COUNT] = {4, 2, 8, 4, 8};
	return (unsigned)dt < LOOM_DTYPE_COUNT ? sizes[dt] : 0;
}

const char *loom_dtype_name(loom_dtype_t dt)
{
	static const char *names[LOOM_DTYPE_COUNT] = {"float32", "bfloat16", "float64", "int32", "int64"};
	return (unsigned)dt < LOOM_DTYPE_COUNT ? names[dt] : "?";
}

const char *loom_op_name(loom_op_t op)
{
	static const char *names[LOOM_OP_COUNT] = {"sum", "avg", "max", "min"};
	return (unsigned)op < LOOM_OP_COUNT ? names[op] : "?";
}

static inline float bf16_to_f32(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static inline uint16_t f32_to_bf16(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it a quiet NaN */
		return (uint16_t)((u >> 16) | 0x40);
	u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
	return (uint16_t)(u >> 16);
}

/* `#pragma omp simd` vectorizes although out may alias a or b: the contract allows only exact
 * aliasing (out == a or out == b), where every lane reads index i before writing index i. At -O2
 * GCC would otherwise keep these loops scalar (it does not version loops for aliasing). */
#define REDUCE_LOOP(T, EXPR)                                                    \
	do {                                                                        \
		T *o = out;                                                             \
		const T *x = a, *y = b;                                                 \
		_Pragma("omp simd")                                                     \
		for (size_t i = 0; i < count; i++) {                                    \
			T p = x[i], q = y[i];                                               \
			o[i] = (EXPR);                                                      \
		}                                                                       \
	} while (0)

#define REDUCE_TYPE(T)                                                          \
	do {                                                                        \
		switch (op) {                                                           \
		case LOOM_MAX: REDUCE_LOOP(T, p > q ? p : q); break;                    \
		case LOOM_MIN: REDUCE_LOOP(T, p < q ? p : q); break;                    \
		default: REDUCE_LOOP(T, p + q); break;                                  \
		}                                                                       \
	} while (0)

/* Integer sums wrap modulo 2^bits (two's complement), like MPI implementations in practice: the
 * add is done in the unsigned type (defined overflow) and converted back (implementation-defined,
 * modular in GCC), so an overflowing sum is never undefined behaviour. */
#define REDUCE_INT(T, U)                                                        \
	do {                                                                        \
		switch (op) {                                                           \
		case LOOM_MAX: REDUCE_LOOP(T, p > q ? p : q); break;                    \
		case LOOM_MIN: REDUCE_LOOP(T, p < q ? p : q); break;                    \
		default: REDUCE_LOOP(T, (T)((U)p + (U)q)); break;                       \
		}                                                                       \
	} while (0)

#define REDUCE_BF16(EXPR)                                                       \
	do {                                                                        \
		uint16_t *o = out;                                                      \
		const uint16_t *x = a, *y = b;                                          \
		_Pragma("omp simd")                                                     \
		for (size_t i = 0; i < count; i++) {                                    \
			float p = bf16_to_f32(x[i]), q = bf16_to_f32(y[i]);                 \
			o[i] = f32_to_bf16(EXPR);                                           \
		}                                                                       \
	} while (0)

void loom_reduce_local(void *out, const void *a, const void *b, size_t count, loom_dtype_t dt, loom_op_t op)
{
	switch (dt) {
	case LOOM_FLOAT32: REDUCE_TYPE(float); break;
	case LOOM_FLOAT64: REDUCE_TYPE(double); break;
	case LOOM_INT32: REDUCE_INT(int32_t, uint32_t); break;
	case LOOM_INT64: REDUCE_INT(int64_t, uint64_t); break;
	case LOOM_BFLOAT16:
		switch (op) {
		case LOOM_MAX: REDUCE_BF16(p > q ? p : q); break;
		case LOOM_MIN: REDUCE_BF16(p < q ? p : q); break;
		default: REDUCE_BF16(p + q); break;
		}
		break;
	default: break;
	}
}

void loom_scale_local(void *buf, size_t count, loom_dtype_t dt, int n)
{
	switch (dt) {
	case LOOM_FLOAT32: {
		float *x = buf, s = 1.0f / (float)n;
#pragma omp simd
		for (size_t i = 0; i < count; i++)
			x[i] *= s;
		break;
	}
	case LOOM_FLOAT64: {
		double *x = buf, s = 1.0 / (double)n;
#pragma omp simd
		for (size_t i = 0; i < count; i++)
			x[i] *= s;
		break;
	}
	case LOOM_BFLOAT16: {
		uint16_t *x = buf;
		float s = 1.0f / (float)n;
#pragma omp simd
		for (size_t i = 0; i < count; i++)
			x[i] = f32_to_bf16(bf16_to_f32(x[i]) * s);
		break;
	}
	default: break;
	}
}
