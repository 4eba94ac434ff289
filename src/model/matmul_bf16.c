/* matmul_bf16.c: the bf16 GEMM behind `--dtype bf16`: C (fp32) = alpha op(A) op(B) + beta C with the
 * operands rounded to bf16 and the products accumulated in fp32, on one of two paths, and the
 * per-thread switch that sends the model's loom__gemm calls to it.
 *
 *  - native: oneDNN's matmul primitive (libdnnl) on bf16 operands, where oneDNN dispatches to
 *    AVX512-BF16 (`vdpbf16ps`, brg:avx512_core_bf16) or AMX-BF16 (brg:avx512_core_amx);
 *  - portable: the operands rounded to bf16 but kept as fp32 values, then the fp32 sgemm
 *    (loom__gemm_f32). Every x86-64 CPU; oneDNN's own bf16 fallback is slower (gemm:jit emulation,
 *    measured at 38 GFLOP/s against the sgemm's 100 on an AVX-512 CPU) or absent (AVX2).
 * A product of two bf16 values (8-bit significands) is exact in fp32, so both paths compute the fp32
 * sum of the same exact products and differ only in the order of the additions: `--dtype bf16` means
 * the same on every machine, and its checkpoints (fp32 master weights) move between them. The path is
 * chosen once per process (loom_bf16_path: LOOM_BF16=auto|native|portable) and kept per context.
 *
 * Why this shape: the model keeps every tensor in fp32 (master weights, activations, gradients), so
 * precision changes in one place only. A bf16 GEMM converts its two fp32 operands into scratch (round
 * to nearest even, the rounding PyTorch's autocast uses) in the layout they already have, and
 * describes that layout with strides, so a transposed operand is never copied twice. The scratch
 * belongs to the calling model's context (loom__gemm_ctx_t), in slots: the GEMM's own two conversions,
 * and two "held" operands a kernel converts once for several GEMMs (the lm head's wte, a gradient used
 * by both backward products). Slots hold the path's format (2 bytes a value native, 4 portable: the
 * portable held wte of `small` is 50257 x 384 x 4 = 77 MB, the same as the model's own wte), grow on
 * the first step and are then reused, so later steps allocate nothing. oneDNN's primitives are
 * created once per GEMM shape and kept for the life of the process in a small table (a training step
 * uses a dozen shapes); creating one costs far more than running a small product.
 *
 * Invariants: a GEMM in bf16 mode equals the fp32 GEMM of the bf16-rounded operands up to the order
 * of fp32 additions; on the portable path it IS loom__gemm_f32 on the rounded operands, bit for bit
 * (tests/test_bf16.c checks both); with beta != 0 C is read, never with beta == 0. The first failure
 * (no memory, oneDNN refusing a shape, a path that cannot run) is kept in the context; later GEMMs of
 * the pass are skipped and the model's entry point returns the error. Thread use: both paths run on
 * the OpenMP pool (loom_set_num_threads); the primitive table and the native probe are shared by all
 * threads under a mutex, executions run outside it. */
#include <dnnl.h>
#include <dnnl_debug.h>
#include <omp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "loom/cpu.h"
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

/* ---- conversion -------------------------------------------------------------------------------- */

static inline uint16_t to_bf16(float f)
{
	return loom__bf16_bits(f);
}

float loom__bf16_round(float f)
{
	uint32_t u = (uint32_t)to_bf16(f) << 16;
	float r;
	memcpy(&r, &u, 4);
	return r;
}

/* n values of src rounded to bf16 into dst, in a path's format: bf16 values (uint16_t) when native,
 * bf16-rounded fp32 values (float) when portable. The loops differ only in the store. */
static inline void round_row(int native, void *dst, const float *src, int n)
{
	if (native) {
		uint16_t *d = dst;
#pragma omp simd
		for (int i = 0; i < n; i++)
			d[i] = to_bf16(src[i]);
	} else {
		float *d = dst;
#pragma omp simd
		for (int i = 0; i < n; i++) {
			uint32_t u = (uint32_t)to_bf16(src[i]) << 16;
			memcpy(&d[i], &u, 4);
		}
	}
}

/* dst (rows, cols) dense = src (rows, cols) with leading dimension ld, rounded to bf16 in a path's
 * format (round_row). */
static void convert(int native, void *dst, const float *src, int rows, int cols, int ld)
{
	size_t w = native ? sizeof(uint16_t) : sizeof(float);
#pragma omp parallel for schedule(static) if ((long)rows * cols >= 65536)
	for (int r = 0; r < rows; r++)
		round_row(native, (char *)dst + (size_t)r * cols * w, src + (size_t)r * ld, cols);
}

/* n values, as rows of 2^20 so that the loop bounds are ints. */
static void convert_n(int native, void *dst, const float *src, size_t n)
{
	size_t row = (size_t)1 << 20, full = n / row * row, w = native ? sizeof(uint16_t) : sizeof(float);
	if (n >= row)
		convert(native, dst, src, (int)(n / row), (int)row, (int)row);
	if (n % row)
		convert(native, (char *)dst + full * w, src + full, 1, (int)(n % row), (int)(n % row));
}

void loom__bf16_from_f32(uint16_t *dst, const float *src, size_t n)
{
	convert_n(1, dst, src, n);
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

/* ---- the two paths ------------------------------------------------------------------------------ */

/* What the probe found: whether the native path runs here, its name, or why not. */
static struct {
	int native;
	char name[128];
	char why[256];
} hw;
static pthread_once_t hw_once = PTHREAD_ONCE_INIT;

/* Native needs oneDNN to dispatch to AVX512-BF16 or AMX (its effective ISA, which DNNL_MAX_CPU_ISA
 * lowers), the CPU to say so too, and a bf16 matmul primitive to exist; the primitive's
 * implementation string names the kernel family in the path's name. oneDNN's bf16 matmul below that
 * ISA is an emulation slower than the portable path (or absent), so it never counts as native. */
static void probe(void)
{
	loom__dnnl_setup(); /* LOOM_CPU_ISA's cap, before oneDNN fixes its ISA */
	dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
	int amx = ((unsigned)isa & dnnl_cpu_isa_avx512_core_amx) == dnnl_cpu_isa_avx512_core_amx;
	int bf = ((unsigned)isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16;
	const char *max = getenv("DNNL_MAX_CPU_ISA");
	const loom_cpu_t *cpu = loom_cpu();
	if (!cpu->avx512_bf16 && !cpu->amx_bf16) {
		snprintf(hw.why, sizeof hw.why, "this CPU has neither AVX512-BF16 nor AMX-BF16 (avx512_bf16, amx_bf16 in "
		         "/proc/cpuinfo)%s", getenv("LOOM_CPU_ISA") ? ", or LOOM_CPU_ISA caps its features" : "");
		return;
	}
	if (!bf) {
		snprintf(hw.why, sizeof hw.why, "the CPU has AVX512-BF16 but oneDNN dispatches up to %s only%s%s%s",
		         dnnl_cpu_isa2str(isa), max ? " (DNNL_MAX_CPU_ISA=" : "", max ? max : "", max ? ")" : "");
		return;
	}
	dnnl_memory_desc_t a_md, b_md, c_md;
	dnnl_dims_t dims = {64, 64};
	dnnl_matmul_desc_t md;
	dnnl_primitive_desc_t pd = NULL;
	const char *impl = NULL;
	dnnl_status_t s = dnnl_success;
	pthread_mutex_lock(&prim_lock);
	if ((engine || (s = dnnl_engine_create(&engine, dnnl_cpu, 0)) == dnnl_success) &&
	    (s = dnnl_memory_desc_init_by_tag(&a_md, 2, dims, dnnl_bf16, dnnl_ab)) == dnnl_success &&
	    (s = dnnl_memory_desc_init_by_tag(&b_md, 2, dims, dnnl_bf16, dnnl_ab)) == dnnl_success &&
	    (s = dnnl_memory_desc_init_by_tag(&c_md, 2, dims, dnnl_f32, dnnl_ab)) == dnnl_success &&
	    (s = dnnl_matmul_desc_init(&md, &a_md, &b_md, NULL, &c_md)) == dnnl_success &&
	    (s = dnnl_primitive_desc_create(&pd, &md, NULL, engine, NULL)) == dnnl_success &&
	    (s = dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl)) == dnnl_success && impl) {
		hw.native = 1;
		snprintf(hw.name, sizeof hw.name, "native %s (oneDNN %s)", amx ? "AMX-BF16" : "AVX512-BF16", impl);
	} else {
		snprintf(hw.why, sizeof hw.why, "oneDNN (%s) has no bf16 matmul here: %s", dnnl_cpu_isa2str(isa),
		         dnnl_what(s));
	}
	if (pd)
		dnnl_primitive_desc_destroy(pd);
	pthread_mutex_unlock(&prim_lock);
}

int loom_bf16_native(void)
{
	pthread_once(&hw_once, probe);
	return hw.native;
}

int loom_bf16_path(loom_bf16_path_t *path)
{
	const char *v = getenv("LOOM_BF16");
	loom_bf16_path_t want;
	if (!v || !*v || strcmp(v, "auto") == 0)
		want = LOOM_BF16_AUTO;
	else if (strcmp(v, "native") == 0)
		want = LOOM_BF16_NATIVE;
	else if (strcmp(v, "portable") == 0)
		want = LOOM_BF16_PORTABLE;
	else
		return loom_seterr(LOOM_EINVAL, "LOOM_BF16=%s: expected auto, native or portable", v);
	if (want == LOOM_BF16_PORTABLE) { /* no probe: the portable path needs nothing of oneDNN */
		*path = want;
		return LOOM_OK;
	}
	int native = loom_bf16_native();
	if (want == LOOM_BF16_NATIVE && !native)
		return loom_seterr(LOOM_ENOTSUP, "LOOM_BF16=native: the native bf16 GEMM needs AVX512-BF16 or AMX-BF16 "
		                   "through oneDNN, and %s; unset LOOM_BF16 (or set it to portable) for the portable path",
		                   hw.why);
	*path = native ? LOOM_BF16_NATIVE : LOOM_BF16_PORTABLE;
	return LOOM_OK;
}

const char *loom_bf16_path_name(loom_bf16_path_t path)
{
	if (path == LOOM_BF16_PORTABLE)
		return "portable (bf16-rounded operands, fp32 FMA)";
	if (path == LOOM_BF16_NATIVE)
		return loom_bf16_native() ? hw.name : "native (not available on this machine)";
	return "?";
}

/* ctx's path chosen (on its first call) and runnable: LOOM_OK or the error, kept in ctx->err. */
static int ready(loom__gemm_ctx_t *ctx)
{
	if (ctx->err)
		return ctx->err;
	if (ctx->path == LOOM_BF16_AUTO) {
		loom_bf16_path_t p;
		int rc = loom_bf16_path(&p);
		if (rc != LOOM_OK)
			return ctx->err = rc;
		ctx->path = (int)p;
	} else if (ctx->path == LOOM_BF16_NATIVE && !loom_bf16_native()) {
		return ctx->err = loom_seterr(LOOM_ENOTSUP, "bf16 gemm: the native path was asked for, but %s", hw.why);
	} else if (ctx->path != LOOM_BF16_NATIVE && ctx->path != LOOM_BF16_PORTABLE) {
		return ctx->err = loom_seterr(LOOM_EINVAL, "bf16 gemm: path %d (expected 0 auto, 1 portable, 2 native)",
		                              ctx->path);
	}
	return LOOM_OK;
}

/* ---- the GEMM ---------------------------------------------------------------------------------- */

/* Room for n values of ctx's format in scratch slot k, growing it (the first step only). */
static void *scratch(loom__gemm_ctx_t *ctx, int k, size_t n)
{
	size_t bytes = n * (ctx->path == LOOM_BF16_NATIVE ? sizeof(uint16_t) : sizeof(float));
	if (bytes > ctx->cap[k]) {
		size_t cap = bytes + bytes / 8;
		void *b = loom_alloc_aligned(cap);
		if (!b) {
			ctx->err = loom_seterr(LOOM_ENOMEM, "bf16 gemm: out of memory for %zu bytes of operand scratch", cap);
			return NULL;
		}
		loom_free_aligned(ctx->buf[k]);
		ctx->buf[k] = b;
		ctx->cap[k] = cap;
	}
	return ctx->buf[k];
}

void *loom__bf16_slot(loom__gemm_ctx_t *ctx, int slot, size_t n)
{
	if (ready(ctx) != LOOM_OK || slot < LOOM_BF16_SLOT_HOLD0 || slot >= LOOM_BF16_SLOTS)
		return NULL;
	return scratch(ctx, slot, n);
}

void loom__bf16_row(const loom__gemm_ctx_t *ctx, void *slot, size_t at, const float *src, int n)
{
	int native = ctx->path == LOOM_BF16_NATIVE;
	round_row(native, (char *)slot + at * (native ? sizeof(uint16_t) : sizeof(float)), src, n);
}

const void *loom__bf16_hold(loom__gemm_ctx_t *ctx, int slot, const float *src, size_t n)
{
	void *d;
	if (!(d = loom__bf16_slot(ctx, slot, n)))
		return NULL;
	convert_n(ctx->path == LOOM_BF16_NATIVE, d, src, n);
	return d;
}

/* A dense copy of src (rows, cols; leading dimension *ld) in ctx's format in scratch slot k; *ld
 * becomes its width. NULL (ctx->err set) when out of memory. */
static const void *operand(loom__gemm_ctx_t *ctx, int k, const float *src, int rows, int cols, int *ld)
{
	void *d = scratch(ctx, k, (size_t)rows * cols);
	if (!d)
		return NULL;
	convert(ctx->path == LOOM_BF16_NATIVE, d, src, rows, cols, *ld);
	*ld = cols;
	return d;
}

/* The native path: oneDNN's matmul on bf16 operands a, b (in their stored orientation). */
static int gemm_native(loom__gemm_ctx_t *ctx, int ta, int tb, int M, int N, int K, float alpha, const void *a,
                       int lda, const void *b, int ldb, float beta, float *C, int ldc)
{
	dnnl_primitive_t p = get_prim(ctx, ta, tb, M, N, K, alpha, lda, ldb, beta != 0.0f, beta, ldc);
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
	if ((s = dnnl_memory_create(&ma, a_md, engine, (void *)a)) != dnnl_success ||
	    (s = dnnl_memory_create(&mb, b_md, engine, (void *)b)) != dnnl_success ||
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

int loom__gemm_bf16(loom__gemm_ctx_t *ctx, int ta, int tb, int M, int N, int K, float alpha, const float *A,
                    int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
	return loom__gemm_bf16x(ctx, ta, tb, M, N, K, alpha, A, NULL, lda, B, NULL, ldb, beta, C, ldc);
}

int loom__gemm_bf16x(loom__gemm_ctx_t *ctx, int ta, int tb, int M, int N, int K, float alpha, const float *A,
                     const void *A16, int lda, const float *B, const void *B16, int ldb, float beta, float *C,
                     int ldc)
{
	if (ready(ctx) != LOOM_OK)
		return ctx->err;
	if (M <= 0 || N <= 0)
		return LOOM_OK;
	if (K <= 0) { /* no products: C = beta C */
		for (int i = 0; i < M; i++)
			for (int j = 0; j < N; j++)
				C[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[(size_t)i * ldc + j];
		return LOOM_OK;
	}
	/* an operand not given in the ctx's format is converted into a dense scratch slot: its ld is
	 * then its width */
	const void *a = A16, *b = B16;
	if (!a && !(a = operand(ctx, LOOM_BF16_SLOT_A, A, ta ? K : M, ta ? M : K, &lda)))
		return ctx->err;
	if (!b && !(b = operand(ctx, LOOM_BF16_SLOT_B, B, tb ? N : K, tb ? K : N, &ldb)))
		return ctx->err;
	if (ctx->path == LOOM_BF16_NATIVE)
		return gemm_native(ctx, ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, C, ldc);
	loom__gemm_f32(ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, C, ldc); /* the rounded values in fp32 */
	return LOOM_OK;
}
