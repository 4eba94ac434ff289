/* perf.c: the kernels' thread count, measured GEMM FLOP/s in fp32 or bf16, and the hardware peak of
 * each precision that MFU is relative to (loom/cpu.h's throughput loops).
 *
 * Threads: the model's loops and its sgemm calls share one OpenMP pool (see loom__gemm() in kernels.c);
 * loom_set_num_threads sets its size and keeps OpenBLAS from starting threads of its own. The peak
 * is measured, not assumed: the best throughput of a few large products of the shapes GPT-2
 * training runs, through the same threaded sgemm the model uses. */
#include <omp.h>
#include <stdlib.h>

#include "core/util.h"
#include "loom/cpu.h"
#include "loom/gpt2.h"
#include "model/kernels.h"

int loom_set_num_threads(int n)
{
	if (n <= 0)
		n = omp_get_num_procs();
	omp_set_num_threads(n);
	loom__gemm_setup_threads();
	return omp_get_max_threads();
}

int loom_num_threads(void)
{
	return omp_get_max_threads();
}

double loom_gemm_flops(int threads, int M, int N, int K, double seconds)
{
	return loom_gemm_flops_dtype(LOOM_COMPUTE_FP32, threads, M, N, K, seconds);
}

double loom_gemm_flops_dtype(loom_compute_dtype_t dt, int threads, int M, int N, int K, double seconds)
{
	int saved = omp_get_max_threads();
	double best = 0.0, start;
	float *A = NULL, *B = NULL, *C = NULL;
	loom__gemm_ctx_t ctx = {.dtype = dt};
	if (M <= 0 || N <= 0 || K <= 0)
		return 0.0;
	if (threads > 0)
		loom_set_num_threads(threads);
	loom__gemm_setup(&ctx); /* bf16: as the model runs it, operand conversion included */
	A = loom_alloc_aligned(sizeof(float) * (size_t)M * K);
	B = loom_alloc_aligned(sizeof(float) * (size_t)K * N);
	C = loom_alloc_aligned(sizeof(float) * (size_t)M * N);
	if (!A || !B || !C)
		goto done;
	for (size_t i = 0; i < (size_t)M * K; i++)
		A[i] = (float)(i % 13) * 0.01f - 0.06f;
	for (size_t i = 0; i < (size_t)K * N; i++)
		B[i] = (float)(i % 7) * 0.01f - 0.03f;
	loom__gemm(0, 0, M, N, K, 1.0f, A, K, B, N, 0.0f, C, N); /* warm-up: packing buffers, thread start */
	start = loom_now();
	for (int rep = 0; rep < 3 || loom_now() - start < seconds; rep++) {
		double t0 = loom_now();
		loom__gemm(0, 0, M, N, K, 1.0f, A, K, B, N, 0.0f, C, N);
		double dt = loom_now() - t0, f = 2.0 * M * N * K / dt;
		best = f > best ? f : best;
		if (rep >= 1000)
			break;
	}
done:
	if (ctx.err)
		best = 0.0;
	loom__gemm_setup_threads();
	loom__gemm_ctx_free(&ctx);
	loom_free_aligned(A);
	loom_free_aligned(B);
	loom_free_aligned(C);
	loom_set_num_threads(saved);
	return best;
}

double loom_gemm_peak_flops(int threads)
{
	return loom_gemm_peak_flops_dtype(LOOM_COMPUTE_FP32, threads);
}

double loom_gemm_peak_flops_dtype(loom_compute_dtype_t dt, int threads)
{
	static const int shapes[][3] = {{1024, 1024, 1024}, {1024, 1536, 384}, {256, 50257, 384}};
	double best = 0.0;
	for (size_t i = 0; i < LOOM_ARRAY_LEN(shapes); i++) {
		double f = loom_gemm_flops_dtype(dt, threads, shapes[i][0], shapes[i][1], shapes[i][2], 0.6);
		best = f > best ? f : best;
	}
	return best;
}

/* What the hardware peak of precision dt is on this CPU: 0 the fp32 FMA loop, 1 the bf16 dot loop,
 * 2 the bf16 GEMM on AMX tiles; *source its description. */
static int hw_peak_kind(loom_compute_dtype_t dt, const char **source)
{
	const loom_cpu_t *cpu = loom_cpu();
	static const char *fma_src[] = {"SSE2 mul+add loop, 8 xmm accumulators, measured",
	                                "AVX2 FMA loop, 12 ymm accumulators, measured",
	                                "AVX-512 FMA loop, 16 zmm accumulators, measured"};
	static const char *portable_src[] = {"portable bf16 multiplies in fp32: SSE2 mul+add loop, measured",
	                                     "portable bf16 multiplies in fp32: AVX2 FMA loop, measured",
	                                     "portable bf16 multiplies in fp32: AVX-512 FMA loop, measured"};
	int kind = 0;
	const char *src = fma_src[cpu->isa];
	loom_bf16_path_t path = LOOM_BF16_PORTABLE;
	if (dt == LOOM_COMPUTE_BF16 && (loom_bf16_path(&path) != LOOM_OK || path != LOOM_BF16_NATIVE))
		src = portable_src[cpu->isa];
	else if (dt == LOOM_COMPUTE_BF16 && cpu->amx_bf16)
		kind = 2, src = "AMX-BF16: no loop of loom's drives the tiles, so the bf16 GEMM's measured peak";
	else if (dt == LOOM_COMPUTE_BF16)
		kind = 1, src = "AVX512-BF16 vdpbf16ps loop, 16 zmm accumulators, measured";
	if (source)
		*source = src;
	return kind;
}

void loom_hw_peak_source(loom_compute_dtype_t dt, const char **source)
{
	hw_peak_kind(dt, source);
}

double loom_hw_peak_flops(loom_compute_dtype_t dt, int threads, const char **source)
{
	int kind = hw_peak_kind(dt, source);
	if (threads <= 0)
		threads = omp_get_max_threads();
	if (kind == 2) {
		double gemm = loom_gemm_peak_flops_dtype(dt, threads), dot = loom_bf16_dot_peak_flops(threads, 0.5);
		return gemm > dot ? gemm : dot;
	}
	return kind == 1 ? loom_bf16_dot_peak_flops(threads, 0.5) : loom_fma_peak_flops(threads, 0.5);
}
