/* attention.c: GPT-2's causal multi-head self-attention on the fused kernel (flash.c).
 *
 * GPT-2 keeps q, k and v of a position side by side in qkv (B,T,3C), head h at columns h*hs of each
 * third: three strided views with leading dimension 3C, so the kernel reads them in place, no copy.
 * No window (W = -1: causal only), as many kv heads as query heads, scale 1/sqrt(hs). What a layer
 * keeps for its backward is its output and lse (B,NH,T), never a (T,T) matrix. */
#include <math.h>

#include "model/kernels.h"

loom__flash_t loom__attention_shape(const float *qkv, int B, int T, int C, int NH)
{
	int hs = C / NH;
	loom__flash_t a = {.q = qkv, .k = qkv + C, .v = qkv + 2 * C, .ldq = 3 * C, .ldk = 3 * C, .B = B, .Tq = T,
	                   .Tk = T, .NH = NH, .NKV = NH, .D = hs, .W = -1, .scale = 1.0f / sqrtf((float)hs)};
	return a;
}

void loom__attention_forward(float *out, float *lse, const float *qkv, int B, int T, int C, int NH)
{
	loom__flash_t a = loom__attention_shape(qkv, B, T, C, NH);
	loom__flash_forward(&a, out, C, lse);
}

size_t loom__attention_scratch_floats(int B, int T, int C, int nthreads)
{
	return loom__flash_scratch_floats(B, T, 1, C, nthreads);
}

void loom__attention_backward(float *dqkv, float *scratch, int scratch_threads, const float *dout, const float *qkv,
                              const float *out, const float *lse, int B, int T, int C, int NH)
{
	loom__flash_t a = loom__attention_shape(qkv, B, T, C, NH);
	loom__flash_backward(&a, dqkv, 3 * C, dqkv + C, dqkv + 2 * C, 3 * C, dout, C, out, C, lse, scratch,
	                     scratch_threads);
}
