/* kernels.c: GPT-2's fast elementwise, LayerNorm, embedding and matmul kernels, and the threaded
 * sgemm wrapper every matmul goes through.
 *
 * Threading: one OpenMP pool does everything. Loops are `omp parallel for simd`; reductions that
 * would race (LayerNorm and bias gradients, embedding gradients) are split over channels instead of
 * rows, so each output element is summed by one thread in row order: results do not depend on the
 * schedule. loom__gemm() splits a product over the threads itself and calls a single-threaded sgemm in
 * each (oneDNN's, or OpenBLAS's with LOOM_GEMM=openblas), so no library's own threads compete with the
 * OpenMP workers on a 2-core machine.
 *
 * Why oneDNN's sgemm by default: it picks its kernels from the CPU's features (its jit avx512_core,
 * avx2, ... code), where OpenBLAS picks them from a table of CPU models and falls back to its SSE3
 * kernels on a model it does not know (a cloud VM's "Intel(R) Xeon(R) Processor": 34 instead of 174
 * GFLOP/s on one core). Measured side by side in docs/model.md; it is also as fast or faster on the
 * CPUs OpenBLAS does know.
 * Nothing here allocates. */
#include <cblas.h>
#include <dnnl.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/cpu.h"

#include "model/fastmath.h"
#include "model/kernels.h"

/* Loops over fewer elements than this run on the calling thread: waking the pool costs more. */
#define PAR_MIN 32768

/* ---- BLAS ------------------------------------------------------------------------------------ */

/* LOOM_CPU_ISA caps oneDNN's kernels too. oneDNN fixes its ISA at its first use, so everything that
 * uses it (this file's sgemm, the bf16 path's probe) calls this first. */
static pthread_once_t dnnl_once = PTHREAD_ONCE_INIT;

static void dnnl_cap(void)
{
	const loom_cpu_t *cpu = loom_cpu();
	if (cpu->isa == LOOM_ISA_AVX2)
		dnnl_set_max_cpu_isa(dnnl_cpu_isa_avx2);
	else if (cpu->isa == LOOM_ISA_SCALAR)
		dnnl_set_max_cpu_isa(cpu->avx ? dnnl_cpu_isa_avx : dnnl_cpu_isa_sse41);
}

void loom__dnnl_setup(void)
{
	pthread_once(&dnnl_once, dnnl_cap);
}

/* The fp32 GEMM backend, chosen once from LOOM_GEMM (an unknown value is oneDNN here; `loom` refuses
 * it before this runs). */
static int backend = -1;
static pthread_once_t backend_once = PTHREAD_ONCE_INIT;

static void choose_backend(void)
{
	loom__dnnl_setup();
	backend = loom_gemm_backend_parse(getenv("LOOM_GEMM")) == LOOM_GEMM_OPENBLAS ? LOOM_GEMM_OPENBLAS
	                                                                             : LOOM_GEMM_ONEDNN;
}

int loom_gemm_backend_parse(const char *env)
{
	if (!env || !*env || strcmp(env, "onednn") == 0 || strcmp(env, "auto") == 0)
		return LOOM_GEMM_ONEDNN;
	if (strcmp(env, "openblas") == 0 || strcmp(env, "blas") == 0)
		return LOOM_GEMM_OPENBLAS;
	return -1;
}

int loom_gemm_backend(void)
{
	pthread_once(&backend_once, choose_backend);
	return backend;
}

const char *loom_gemm_backend_name(void)
{
	static _Thread_local char buf[96];
	if (loom_gemm_backend() == LOOM_GEMM_OPENBLAS) {
		snprintf(buf, sizeof buf, "OpenBLAS sgemm (core %s)", openblas_get_corename());
		return buf;
	}
	unsigned isa = (unsigned)dnnl_get_effective_cpu_isa(); /* each ISA's bits include those below it */
	snprintf(buf, sizeof buf, "oneDNN sgemm (jit %s)",
	         (isa & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core ? "avx512_core"
	         : (isa & dnnl_cpu_isa_avx2) == dnnl_cpu_isa_avx2             ? "avx2"
	         : (isa & dnnl_cpu_isa_avx) == dnnl_cpu_isa_avx               ? "avx"
	                                                                      : "sse41");
	return buf;
}

void loom__gemm_setup_threads(void)
{
	/* The pthreads build would otherwise start its own workers; the OpenMP build already runs
	 * single-threaded inside a parallel region, and its openblas_set_num_threads would change the
	 * OpenMP thread count, so it is left alone. */
	if (openblas_get_parallel() == 1 && openblas_get_num_threads() != 1)
		openblas_set_num_threads(1);
	loom__gemm_use(NULL);
}

void loom__sgemm1(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
                  float beta, float *C, int ldc)
{
	if (loom_gemm_backend() == LOOM_GEMM_ONEDNN &&
	    dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc) == dnnl_success)
		return;
	/* OpenBLAS, chosen or where oneDNN refused (it refuses only arguments that are invalid for
	 * OpenBLAS too, which then reports them) */
	cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A,
	            lda, B, ldb, beta, C, ldc);
}

/* [lo, hi) of part i of n items in `parts` parts, boundaries on multiples of `align`. */
static void split_range(int n, int parts, int i, int align, int *lo, int *hi)
{
	long per = ((long)n + parts - 1) / parts;
	per = (per + align - 1) / align * align;
	long a = per * i, b = per * (i + 1);
	*lo = (int)(a < n ? a : n);
	*hi = (int)(b < n ? b : n);
}

void loom__gemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
          float beta, float *C, int ldc)
{
	loom__gemm_ctx_t *bf = loom__gemm_current();
	if (bf && M > 0 && N > 0) /* errors stay in the ctx; the model's entry point returns them */
		loom__gemm_bf16(bf, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
	else
		loom__gemm_f32(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void loom__gemm_f32(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                    int ldb, float beta, float *C, int ldc)
{
	int nt = omp_get_max_threads();
	if (M <= 0 || N <= 0)
		return;
	if (nt <= 1 || omp_in_parallel() || (double)M * N * K < 4e6) {
		loom__sgemm1(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
		return;
	}
	int split_n = N >= M;
#pragma omp parallel num_threads(nt)
	{
		int lo, hi, t = omp_get_thread_num(), n = omp_get_num_threads();
		split_range(split_n ? N : M, n, t, 16, &lo, &hi);
		if (hi > lo) {
			if (split_n)
				loom__sgemm1(ta, tb, M, hi - lo, K, alpha, A, lda, tb ? B + (size_t)lo * ldb : B + lo, ldb, beta,
				       C + lo, ldc);
			else
				loom__sgemm1(ta, tb, hi - lo, N, K, alpha, ta ? A + lo : A + (size_t)lo * lda, lda, B, ldb, beta,
				       C + (size_t)lo * ldc, ldc);
		}
	}
}

/* ---- embedding ------------------------------------------------------------------------------- */

void loom__encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B, int T, int C)
{
	/* out is (B,T,C), inp (B,T), wte (V,C), wpe (maxT,C) */
#pragma omp parallel for if ((long)B * T * C >= PAR_MIN)
	for (int bt = 0; bt < B * T; bt++) {
		float *o = out + (size_t)bt * C;
		const float *e = wte + (size_t)inp[bt] * C, *p = wpe + (size_t)(bt % T) * C;
#pragma omp simd
		for (int c = 0; c < C; c++)
			o[c] = e[c] + p[c];
	}
}

void loom__encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B, int T, int C)
{
	/* Channels are split over threads: a token repeated in the batch is accumulated by one thread. */
#pragma omp parallel if ((long)B * T * C >= PAR_MIN)
	{
		int c0, c1;
		split_range(C, omp_get_num_threads(), omp_get_thread_num(), 16, &c0, &c1);
		for (int bt = 0; bt < B * T; bt++) {
			const float *d = dout + (size_t)bt * C;
			float *we = dwte + (size_t)inp[bt] * C, *wp = dwpe + (size_t)(bt % T) * C;
#pragma omp simd
			for (int c = c0; c < c1; c++) {
				we[c] += d[c];
				wp[c] += d[c];
			}
		}
	}
}

void loom__rows_gather(float *out, int ldo, const float *table, int ld, const int *ids, int v0, int nrows, int N,
                       int cols)
{
#pragma omp parallel for schedule(static) if ((long)N * cols >= PAR_MIN)
	for (int n = 0; n < N; n++) {
		int r = ids[n] - v0;
		if (r >= 0 && r < nrows)
			memcpy(out + (size_t)n * ldo, table + (size_t)r * ld, sizeof(float) * (size_t)cols);
		else
			memset(out + (size_t)n * ldo, 0, sizeof(float) * (size_t)cols);
	}
}

void loom__rows_scatter_add(float *dtable, int ld, const float *d, int ldd, const int *ids, int v0, int nrows, int N,
                            int cols)
{
	/* columns split over threads: a repeated id is accumulated by one thread, in row order */
#pragma omp parallel if ((long)N * cols >= PAR_MIN)
	{
		int c0, c1;
		split_range(cols, omp_get_num_threads(), omp_get_thread_num(), 16, &c0, &c1);
		for (int n = 0; n < N; n++) {
			int r = ids[n] - v0;
			if (r < 0 || r >= nrows)
				continue;
			const float *s = d + (size_t)n * ldd;
			float *w = dtable + (size_t)r * ld;
#pragma omp simd
			for (int c = c0; c < c1; c++)
				w[c] += s[c];
		}
	}
}

/* ---- LayerNorm ------------------------------------------------------------------------------- */

void loom__layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                       const float *bias, int N, int C)
{
#pragma omp parallel for if ((long)N * C >= PAR_MIN)
	for (int i = 0; i < N; i++) {
		const float *x = inp + (size_t)i * C;
		float *o = out + (size_t)i * C;
		float m = 0.0f, v = 0.0f;
#pragma omp simd reduction(+ : m)
		for (int c = 0; c < C; c++)
			m += x[c];
		m /= C;
#pragma omp simd reduction(+ : v)
		for (int c = 0; c < C; c++)
			v += (x[c] - m) * (x[c] - m);
		float s = 1.0f / sqrtf(v / C + 1e-5f);
#pragma omp simd
		for (int c = 0; c < C; c++)
			o[c] = (x[c] - m) * s * weight[c] + bias[c];
		mean[i] = m;
		rstd[i] = s;
	}
}

void loom__layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                        const float *weight, const float *mean, const float *rstd, int N, int C)
{
#pragma omp parallel if ((long)N * C >= PAR_MIN)
	{
		/* pass 1, rows: dinp needs two row means of the normalized gradient */
#pragma omp for
		for (int i = 0; i < N; i++) {
			const float *x = inp + (size_t)i * C, *d = dout + (size_t)i * C;
			float *di = dinp + (size_t)i * C;
			float m = mean[i], s = rstd[i], dm = 0.0f, dnm = 0.0f;
#pragma omp simd reduction(+ : dm, dnm)
			for (int c = 0; c < C; c++) {
				float dn = weight[c] * d[c];
				dm += dn;
				dnm += dn * (x[c] - m) * s;
			}
			dm /= C;
			dnm /= C;
#pragma omp simd
			for (int c = 0; c < C; c++)
				di[c] += (weight[c] * d[c] - dm - (x[c] - m) * s * dnm) * s;
		}
		/* pass 2, channels (after the implicit barrier): parameter gradients summed in row order */
		int c0, c1;
		split_range(C, omp_get_num_threads(), omp_get_thread_num(), 16, &c0, &c1);
		for (int i = 0; i < N; i++) {
			const float *x = inp + (size_t)i * C, *d = dout + (size_t)i * C;
			float m = mean[i], s = rstd[i];
#pragma omp simd
			for (int c = c0; c < c1; c++) {
				dbias[c] += d[c];
				dweight[c] += (x[c] - m) * s * d[c];
			}
		}
	}
}

/* ---- matmul (Conv1D layout) -------------------------------------------------------------------- */

void loom__matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N, int C, int OC)
{
	/* out (N,OC) = bias broadcast, then += inp (N,C) weight (C,OC) */
	if (bias) {
#pragma omp parallel for if ((long)N * OC >= PAR_MIN)
		for (int i = 0; i < N; i++)
			memcpy(out + (size_t)i * OC, bias, sizeof(float) * (size_t)OC);
	}
	loom__gemm(0, 0, N, OC, C, 1.0f, inp, C, weight, OC, bias ? 1.0f : 0.0f, out, OC);
}

void loom__matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                     const float *weight, int N, int C, int OC)
{
	loom__gemm_ctx_t *bf = loom__gemm_current();
	const void *dout16 = NULL;
	if (bf && dinp && dweight && !(dout16 = loom__bf16_hold(bf, LOOM_BF16_SLOT_HOLD1, dout, (size_t)N * OC)))
		return; /* bf16 out of memory: the error is in the ctx */
	if (dout16) { /* bf16: dout converted once for both products */
		loom__gemm_bf16x(bf, 0, 1, N, C, OC, 1.0f, dout, dout16, OC, weight, NULL, OC, 1.0f, dinp, C);
		loom__gemm_bf16x(bf, 1, 0, C, OC, N, 1.0f, inp, NULL, C, dout, dout16, OC, 1.0f, dweight, OC);
	} else {
		if (dinp)
			loom__gemm(0, 1, N, C, OC, 1.0f, dout, OC, weight, OC, 1.0f, dinp, C);
		if (dweight)
			loom__gemm(1, 0, C, OC, N, 1.0f, inp, C, dout, OC, 1.0f, dweight, OC);
	}
	if (dbias) {
#pragma omp parallel if ((long)N * OC >= PAR_MIN)
		{
			int c0, c1;
			split_range(OC, omp_get_num_threads(), omp_get_thread_num(), 16, &c0, &c1);
			for (int i = 0; i < N; i++) {
				const float *d = dout + (size_t)i * OC;
#pragma omp simd
				for (int c = c0; c < c1; c++)
					dbias[c] += d[c];
			}
		}
	}
}

/* ---- GELU and residual ------------------------------------------------------------------------ */

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */

void loom__gelu_forward(float *out, const float *inp, size_t N)
{
#pragma omp parallel for simd schedule(static) if (N >= PAR_MIN)
	for (size_t i = 0; i < N; i++) {
		float x = inp[i];
		out[i] = 0.5f * x * (1.0f + fast_tanhf(GELU_K * (x + 0.044715f * x * x * x)));
	}
}

void loom__gelu_backward(float *dinp, const float *inp, const float *dout, size_t N)
{
#pragma omp parallel for simd schedule(static) if (N >= PAR_MIN)
	for (size_t i = 0; i < N; i++) {
		float x = inp[i];
		float th = fast_tanhf(GELU_K * (x + 0.044715f * x * x * x));
		float sech2 = 1.0f - th * th;
		float local = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
		dinp[i] += local * dout[i];
	}
}

void loom__residual_forward(float *out, const float *inp1, const float *inp2, size_t N)
{
#pragma omp parallel for simd schedule(static) if (N >= PAR_MIN)
	for (size_t i = 0; i < N; i++)
		out[i] = inp1[i] + inp2[i];
}
