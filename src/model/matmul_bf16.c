/* matmul_bf16.c: the bf16 GEMM behind `--dtype bf16`: C (fp32) = alpha op(A) op(B) + beta C with the
 * operands rounded to bf16 and the products accumulated in fp32, through oneDNN's matmul primitive
 * (libdnnl; on AVX512-BF16 it runs `vdpbf16ps` kernels), and the per-thread switch that sends the
 * model's loom__gemm calls to it.
 *
 * Why this shape: the model keeps every tensor in fp32 (master weights, activations, gradients), so
 * precision changes in one place only. A bf16 GEMM converts its two fp32 operands into bf16 scratch
 * (round to nearest even, the rounding PyTorch's autocast uses) in the layout they already have,
 * and describes that layout to oneDNN with strides, so a transposed operand is never copied twice.
 * The scratch belongs to the calling model's context (loom__gemm_ctx_t), in slots: the GEMM's own
 * two conversions, and two "held" operands a kernel converts once for several GEMMs (the lm head's
 * wte, a gradient used by both backward products). Slots grow on the first step and are then
 * reused, so later steps allocate nothing. oneDNN's primitives are created once per GEMM shape and
 * kept for the life of the process in a small table (a training step uses a dozen shapes);
 * creating one costs far more than running a small product.
 *
 * Invariants: a GEMM in bf16 mode equals the fp32 GEMM of the bf16-rounded operands up to the order
 * of fp32 additions (tests/test_bf16.c checks against a double-precision reference on rounded
 * operands); with beta != 0 C is read, never with beta == 0. The first failure (no memory, oneDNN
 * refusing a shape) is kept in the context; later GEMMs of the pass are skipped and the model's
 * entry point returns the error. Thread use: oneDNN runs on the OpenMP pool (loom_set_num_threads);
 * the primitive table is shared by all threads under a mutex, executions run outside it. */
#include <dnnl.h>
#include <omp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "model/kernels.h"

/* ---- the public names ----------------------------------------------------------------------------- */

int loom_compute_dtype_parse(const char *name, loom_compute_dtype_t *dt)
{
	if (name && strcmp(name, "fp32") == 0)
		*dt = LOOM_COMPUTE_FP32;
	else if (name && strcmp(name, "bf16") == 0)
		*dt = LOOM_COMPUTE_BF16;
	else
		return loom_seterr(LOOM_EINVAL, "dtype '%s': expected fp32 or bf16", name ? name : "(null)");
	return LOOM_OK;
}

const char *loom_compute_dtype_name(loom_compute_dtype_t dt)
{
	return dt == LOOM_COMPUTE_BF16 ? "bf16" : dt == LOOM_COMPUTE_FP32 ? "fp32" : "?";
}

int loom_bf16_supported(void)
{
	return loom__bf16_supported();
}

int loom_bf16_native(void)
{
	return loom__bf16_supported();
}

const char *loom_bf16_path_name(void)
{
	return loom__bf16_supported() ? "native AVX512-BF16 (oneDNN)" : "none";
}

/* ---- CPU support and conversion ---------------------------------------------------------------- */

int loom__bf16_supported(void)
{
	int ok;
	if (loom_env_long("LOOM_NO_BF16", 0, &ok) != 0) /* tests force the path of a CPU without it */
		return 0;
	__builtin_cpu_init();
	return __builtin_cpu_supports("avx512bf16") ? 1 : 0;
}

static inline uint16_t to_bf16(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN stays a (quiet) NaN */
		return (uint16_t)((u >> 16) | 0x40);
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float loom__bf16_round(float f)
{
	uint32_t u = (uint32_t)to_bf16(f) << 16;
	float r;
	memcpy(&r, &u, 4);
	return r;
}

/* dst (rows, cols) dense = src (rows, cols) with leading dimension ld, rounded to bf16. */
static void convert(uint16_t *dst, const float *src, int rows, int cols, int ld)
{
#pragma omp parallel for schedule(static) if ((long)rows * cols >= 65536)
	for (int r = 0; r < rows; r++) {
		const float *s = src + (size_t)r * ld;
		uint16_t *d = dst + (size_t)r * cols;
#pragma omp simd
		for (int c = 0; c < cols; c++)
			d[c] = to_bf16(s[c]);
	}
}

void loom__bf16_from_f32(uint16_t *dst, const float *src, size_t n)
{
	/* as rows of 2^20 so that the loop bound is an int */
	size_t row = (size_t)1 << 20;
	if (n >= row)
		convert(dst, src, (int)(n / row), (int)row, (int)row);
	if (n % row)
		convert(dst + n / row * row, src + n / row * row, 1, (int)(n % row), (int)(n % row));
}

/* ---- the per-thread switch --------------------------------------------------------------------- */

static _Thread_local loom__gemm_ctx_t *cur_ctx;

void loom__gemm_use(loom__gemm_ctx_t *ctx)
{
	cur_ctx = ctx && ctx->dtype == LOOM_COMPUTE_BF16 ? ctx : NULL;
}

void loom__gemm_setup(loom__gemm_ctx_t *ctx)
{
	loom__gemm_setup_threads(); /* (which switches to fp32) */
	loom__gemm_use(ctx);
}

loom__gemm_ctx_t *loom__gemm_current(void)
{
	return cur_ctx;
}

void loom__gemm_ctx_free(loom__gemm_ctx_t *ctx)
{
	if (!ctx)
		return;
	if (cur_ctx == ctx)
		cur_ctx = NULL;
	for (int k = 0; k < LOOM_BF16_SLOTS; k++) {
		loom_free_aligned(ctx->buf[k]);
		ctx->buf[k] = NULL;
		ctx->cap[k] = 0;
	}
}

int loom__gemm_status(loom__gemm_ctx_t *ctx)
{
	int rc = ctx->err;
	ctx->err = 0;
	return rc;
}

/* ---- oneDNN primitives, one per shape ------------------------------------------------------------ */

typedef struct {
	int ta, tb, M, N, K, lda, ldb, ldc, beta_nz;
	float alpha;
	dnnl_primitive_t prim;
} prim_entry_t;

#define PRIM_SLOTS 64

static pthread_mutex_t prim_lock = PTHREAD_MUTEX_INITIALIZER;
static dnnl_engine_t engine;
static prim_entry_t prims[PRIM_SLOTS];
static int nprims, next_evict;
static _Thread_local dnnl_stream_t stream;

static const char *dnnl_what(dnnl_status_t s)
{
	switch (s) {
	case dnnl_out_of_memory: return "out of memory";
	case dnnl_invalid_arguments: return "invalid arguments";
	case dnnl_unimplemented: return "no implementation for these operands";
	default: return "failure";
	}
}

/* The matmul primitive for this shape (dense bf16 operands in their stored orientation, fp32 C with
 * row stride ldc), created on first use. NULL with the error recorded on failure. */
static dnnl_primitive_t get_prim(loom__gemm_ctx_t *ctx, int ta, int tb, int M, int N, int K, float alpha,
                                 int lda, int ldb, int beta_nz, float beta, int ldc)
{
	dnnl_primitive_t p = NULL;
	dnnl_status_t s = dnnl_success;
	const char *step = "engine";
	pthread_mutex_lock(&prim_lock);
	for (int i = 0; i < nprims; i++) {
		prim_entry_t *e = &prims[i];
		if (e->ta == ta && e->tb == tb && e->M == M && e->N == N && e->K == K && e->lda == lda && e->ldb == ldb &&
		    e->ldc == ldc &&
		    e->beta_nz == beta_nz && e->alpha == alpha) {
			p = e->prim;
			goto out;
		}
	}
	if (!engine && (s = dnnl_engine_create(&engine, dnnl_cpu, 0)) != dnnl_success)
		goto out;
	dnnl_memory_desc_t a_md, b_md, c_md;
	dnnl_dims_t a_dims = {M, K}, b_dims = {K, N}, c_dims = {M, N};
	dnnl_dims_t a_str = {ta ? 1 : lda, ta ? lda : 1}, b_str = {tb ? 1 : ldb, tb ? ldb : 1}, c_str = {ldc, 1};
	dnnl_matmul_desc_t md;
	dnnl_primitive_attr_t attr = NULL;
	dnnl_post_ops_t po = NULL;
	dnnl_primitive_desc_t pd = NULL;
	step = "descriptors";
	if ((s = dnnl_memory_desc_init_by_strides(&a_md, 2, a_dims, dnnl_bf16, a_str)) != dnnl_success ||
	    (s = dnnl_memory_desc_init_by_strides(&b_md, 2, b_dims, dnnl_bf16, b_str)) != dnnl_success ||
	    (s = dnnl_memory_desc_init_by_strides(&c_md, 2, c_dims, dnnl_f32, c_str)) != dnnl_success ||
	    (s = dnnl_matmul_desc_init(&md, &a_md, &b_md, NULL, &c_md)) != dnnl_success ||
	    (s = dnnl_primitive_attr_create(&attr)) != dnnl_success)
		goto out;
	step = "attributes";
	if (alpha != 1.0f && (s = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha)) != dnnl_success)
		goto done;
	if (beta_nz) {
		if ((s = dnnl_post_ops_create(&po)) != dnnl_success ||
		    (s = dnnl_post_ops_append_sum(po, beta)) != dnnl_success ||
		    (s = dnnl_primitive_attr_set_post_ops(attr, po)) != dnnl_success)
			goto done;
	}
	step = "primitive";
	if ((s = dnnl_primitive_desc_create(&pd, &md, attr, engine, NULL)) != dnnl_success ||
	    (s = dnnl_primitive_create(&p, pd)) != dnnl_success) {
		p = NULL;
		goto done;
	}
	if (nprims < PRIM_SLOTS) {
		prims[nprims++] = (prim_entry_t){ta, tb, M, N, K, lda, ldb, ldc, beta_nz, alpha, p};
	} else { /* a full table: replace entries round-robin (not on a training step's path) */
		dnnl_primitive_destroy(prims[next_evict].prim);
		prims[next_evict] = (prim_entry_t){ta, tb, M, N, K, lda, ldb, ldc, beta_nz, alpha, p};
		next_evict = (next_evict + 1) % PRIM_SLOTS;
	}
done:
	if (pd)
		dnnl_primitive_desc_destroy(pd);
	if (po)
		dnnl_post_ops_destroy(po);
	dnnl_primitive_attr_destroy(attr);
out:
	pthread_mutex_unlock(&prim_lock);
	if (!p && !ctx->err)
		ctx->err = loom_seterr(s == dnnl_out_of_memory ? LOOM_ENOMEM : LOOM_ENOTSUP,
		                       "bf16 gemm: oneDNN %s for %s%s M %d N %d K %d (beta %g): %s", step,
		                       ta ? "A^T " : "", tb ? "B^T " : "", M, N, K, (double)beta, dnnl_what(s));
	return p;
}

/* ---- the GEMM ---------------------------------------------------------------------------------- */

/* Room for n bf16 values in scratch slot k, growing it (the first step only). */
static uint16_t *scratch(loom__gemm_ctx_t *ctx, int k, size_t n)
{
	if (n > ctx->cap[k]) {
		size_t cap = n + n / 8;
		uint16_t *b = loom_alloc_aligned(cap * sizeof(uint16_t));
		if (!b) {
			ctx->err = loom_seterr(LOOM_ENOMEM, "bf16 gemm: out of memory for %zu bytes of operand scratch",
			                       cap * sizeof(uint16_t));
			return NULL;
		}
		loom_free_aligned(ctx->buf[k]);
		ctx->buf[k] = b;
		ctx->cap[k] = cap;
	}
	return ctx->buf[k];
}

uint16_t *loom__bf16_slot(loom__gemm_ctx_t *ctx, int slot, size_t n)
{
	if (ctx->err || slot < LOOM_BF16_SLOT_HOLD0 || slot >= LOOM_BF16_SLOTS)
		return NULL;
	return scratch(ctx, slot, n);
}

void loom__bf16_row(uint16_t *dst, const float *src, int n)
{
#pragma omp simd
	for (int i = 0; i < n; i++)
		dst[i] = to_bf16(src[i]);
}

const uint16_t *loom__bf16_hold(loom__gemm_ctx_t *ctx, int slot, const float *src, size_t n)
{
	uint16_t *d;
	if (ctx->err || slot < LOOM_BF16_SLOT_HOLD0 || slot >= LOOM_BF16_SLOTS || !(d = scratch(ctx, slot, n)))
		return NULL;
	loom__bf16_from_f32(d, src, n);
	return d;
}

int loom__gemm_bf16(loom__gemm_ctx_t *ctx, int ta, int tb, int M, int N, int K, float alpha, const float *A,
                    int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
	return loom__gemm_bf16x(ctx, ta, tb, M, N, K, alpha, A, NULL, lda, B, NULL, ldb, beta, C, ldc);
}

int loom__gemm_bf16x(loom__gemm_ctx_t *ctx, int ta, int tb, int M, int N, int K, float alpha, const float *A,
                     const uint16_t *A16, int lda, const float *B, const uint16_t *B16, int ldb, float beta, float *C,
                     int ldc)
{
	if (ctx->err)
		return ctx->err;
	if (M <= 0 || N <= 0)
		return LOOM_OK;
	if (K <= 0) { /* no products: C = beta C */
		for (int i = 0; i < M; i++)
			for (int j = 0; j < N; j++)
				C[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[(size_t)i * ldc + j];
		return LOOM_OK;
	}
	/* an operand not given in bf16 is converted into a dense scratch slot: its ld is then its width */
	const uint16_t *a16 = A16, *b16 = B16;
	int lda16 = lda, ldb16 = ldb;
	if (!a16) {
		uint16_t *d = scratch(ctx, LOOM_BF16_SLOT_A, (size_t)M * K);
		if (!d)
			return ctx->err;
		convert(d, A, ta ? K : M, ta ? M : K, lda);
		a16 = d, lda16 = ta ? M : K;
	}
	if (!b16) {
		uint16_t *d = scratch(ctx, LOOM_BF16_SLOT_B, (size_t)K * N);
		if (!d)
			return ctx->err;
		convert(d, B, tb ? N : K, tb ? K : N, ldb);
		b16 = d, ldb16 = tb ? K : N;
	}
	dnnl_primitive_t p = get_prim(ctx, ta, tb, M, N, K, alpha, lda16, ldb16, beta != 0.0f, beta, ldc);
	if (!p)
		return ctx->err;

	dnnl_status_t s;
	const_dnnl_primitive_desc_t pd;
	const dnnl_memory_desc_t *a_md, *b_md, *c_md;
	dnnl_memory_t ma = NULL, mb = NULL, mc = NULL;
	const char *step = "stream";
	if (!stream && (s = dnnl_stream_create(&stream, engine, dnnl_stream_default_flags)) != dnnl_success)
		goto fail;
	step = "memory";
	if ((s = dnnl_primitive_get_primitive_desc(p, &pd)) != dnnl_success)
		goto fail;
	a_md = dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0);
	b_md = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
	c_md = dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0);
	if ((s = dnnl_memory_create(&ma, a_md, engine, (void *)a16)) != dnnl_success ||
	    (s = dnnl_memory_create(&mb, b_md, engine, (void *)b16)) != dnnl_success ||
	    (s = dnnl_memory_create(&mc, c_md, engine, C)) != dnnl_success)
		goto fail;
	dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}};
	step = "execute";
	if ((s = dnnl_primitive_execute(p, stream, 3, args)) != dnnl_success ||
	    (s = dnnl_stream_wait(stream)) != dnnl_success)
		goto fail;
	dnnl_memory_destroy(ma);
	dnnl_memory_destroy(mb);
	dnnl_memory_destroy(mc);
	return LOOM_OK;
fail:
	if (ma)
		dnnl_memory_destroy(ma);
	if (mb)
		dnnl_memory_destroy(mb);
	if (mc)
		dnnl_memory_destroy(mc);
	ctx->err = loom_seterr(s == dnnl_out_of_memory ? LOOM_ENOMEM : LOOM_ENOTSUP,
	                       "bf16 gemm: oneDNN %s for M %d N %d K %d: %s", step, M, N, K, dnnl_what(s));
	return ctx->err;
}
