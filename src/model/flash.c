/* flash.c: the one attention kernel of every family, forward and backward, fused in the manner of
 * FlashAttention-2: causal (and optionally windowed) softmax attention with grouped-query heads,
 * which never holds a T x T matrix.
 *
 * Why this shape: the scores of a sequence are T x T, but softmax(S) V only needs, per query row, a
 * running maximum m, a running sum l and the output accumulated so far. So the queries are taken in
 * blocks of FLASH_BQ rows (128: the block products measured 10-15% faster than at 64), the keys in
 * blocks of bk rows (bk from the L2 size: the block's K, V and scores stay in cache), and each (query
 * block, key block) pair is one sgemm for S = scale Q K^T, an online-softmax update (rescale the rows'
 * output by e^(m_old - m_new), P = e^(S - m_new)) and one sgemm O += P V. Key blocks wholly above the
 * causal diagonal or before a row block's window are never visited; inside a block, entries outside a
 * row's [t - W, t] are exact zeros. What the backward needs is the output and one log-sum-exp per row
 * (lse = m + log l): it recomputes P = e^(S - lse) block by block, with D = rowsum(dO * O),
 * dS = P (dP - D), dP = dO V^T, and accumulates dV += P^T dO, dK += scale dS^T Q, dQ += scale dS K.
 *
 * Work and determinism: the forward runs tasks (batch, head, query block) on the OpenMP threads, each
 * writing only its own rows of out and lse, so its bits do not depend on the thread count. The
 * backward runs the same tasks; dQ rows belong to their task, but dK and dV rows are shared by every
 * query block (and, with grouped heads, every head of a group) that reads them. Each thread adds its
 * tasks' dK/dV into a partial of its own (thread 0 straight into the caller's dk, dv), tasks are dealt
 * to threads round-robin (schedule(static, 1): fixed for a thread count), and the partials are summed
 * in thread order at the end: results are bit-identical from run to run at a given thread count. The
 * scores and dP of a block live on the stack (FLASH_BQ x FLASH_BK_MAX floats each); the partials are the
 * caller's scratch (loom__flash_scratch_floats), proportional to B T, never to T^2.
 *
 * Positions: query row i of a sequence is at position qpos + i, key row j at kpos + j; a query at
 * position t sees the keys at positions t - W .. t (W >= the sequence: causal only). Training has
 * qpos = kpos = 0; sampling with a KV cache runs one query row at qpos = p over the cached keys; the
 * offsets are also what a context-parallel rank needs for another rank's chunk of keys.
 *
 * Precision: the products run in the calling thread's GEMM precision (loom__gemm_current). In fp32
 * they are oneDNN's sgemm on the operands in place. In bf16 (--dtype bf16, head size up to
 * FLASH_BF16_DMAX; LOOM_ATTN_BF16=0 keeps fp32) the operands of every product (Q, K, V, P, dO, dS) are
 * rounded to bf16 and the products accumulate in fp32, as every bf16 matmul of loom: natively, the
 * keys and values of each (sequence, kv head) are packed once per call into the layouts the products
 * read (the bf16 context's ATTN slot: B T NKV D values per form, never T x T), Q and dO once per task,
 * P and dS per block as the softmax writes them, and the products are AMX tiles (amx_mm: 2 x 2 tiles
 * of 16 x 16 fp32 per 32 x 32 block of C; this CPU's bf16 rate is about 4x its fp32 FMA rate) or,
 * without AMX, AVX512-BF16's vdpbf16ps (mm_bf16; about fp32's rate, so slower than fp32 there once
 * the packing is paid); on the portable path the same bf16-rounded operands go to the fp32 sgemm,
 * which is what every other bf16 matmul of loom does on a CPU without native bf16. The softmax, the
 * running statistics and every accumulator stay fp32. */
#include <immintrin.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/util.h"
#include "loom/cpu.h"
#include "model/fastmath.h"
#include "model/kernels.h"

#define FLASH_BQ 128
#define FLASH_BK_MAX 256
#define FLASH_BK_MIN 64
#define FLASH_BF16_DMAX 128 /* the bf16 path's largest head (its operands live on the stack) */
#define FLASH_BF16_BK 128   /* and its key blocks */

enum { PREC_FP32 = 0, PREC_BF16 = 1, PREC_BF16_PORTABLE = 2, PREC_AMX = 3 };

/* Key block rows: the largest power of two in [FLASH_BK_MIN, FLASH_BK_MAX] whose K and V blocks, scores
 * and dP, and the query block's Q, dO and dQ fit in 3/4 of the L2 (1 MiB when it cannot be read). */
static int key_block(int D)
{
	static int l2;
	int c = __atomic_load_n(&l2, __ATOMIC_RELAXED);
	if (!c) {
		long v = sysconf(_SC_LEVEL2_CACHE_SIZE);
		c = v > 65536 && v < (1L << 30) ? (int)v : 1 << 20;
		__atomic_store_n(&l2, c, __ATOMIC_RELAXED);
	}
	int bk = FLASH_BK_MAX;
	while (bk > FLASH_BK_MIN && 4.0 * (2.0 * bk * D + 2.0 * FLASH_BQ * bk + 3.0 * FLASH_BQ * D) > 0.75 * c)
		bk /= 2;
	return bk;
}

int loom__flash_key_block(int D)
{
	return key_block(D);
}

static int amx_ok(void);

int loom__flash_bf16_env(void)
{
	const char *e = getenv("LOOM_ATTN_BF16");
	if (!e || !*e)
		return 3;
	if (strcmp(e, "0") == 0 || strcmp(e, "1") == 0)
		return e[0] - '0';
	if (strcmp(e, "avx512") == 0)
		return 2;
	loom_seterr(LOOM_EINVAL, "LOOM_ATTN_BF16='%s': expected 1 (bf16 products on every path), 0 (fp32 products), "
	            "avx512 (AVX512-BF16 even where AMX is) or unset (bf16 on AMX tiles, else fp32)", e);
	return -1;
}

/* The precision of this call's products: the calling thread's GEMM context's (read outside the parallel
 * regions: it is thread-local). fp32 for an fp32 context, a head larger than FLASH_BF16_DMAX or
 * LOOM_ATTN_BF16=0. In bf16, by default, AMX where the CPU and the OS allow it and the context's path is
 * native, else fp32: only AMX makes the attention's bf16 products pay (without it the packing and
 * conversions cost more than vdpbf16ps or the portable rounding save: on the Sapphire Rapids VM
 * AVX512-BF16 attention ran the step at 1008 tokens/s against fp32's 1356). LOOM_ATTN_BF16=1 asks for
 * bf16 on the context's path whatever it is (portable, AMX, AVX512-BF16), avx512 for AVX512-BF16 where
 * AMX is too. */
static int precision(int D)
{
	loom__gemm_ctx_t *ctx = loom__gemm_current();
	loom_bf16_path_t path;
	int opt = loom__flash_bf16_env(); /* a bad value was refused at the model's create; here the default */
	if (!ctx || ctx->dtype != LOOM_COMPUTE_BF16 || D > FLASH_BF16_DMAX || opt == 0)
		return PREC_FP32;
	int portable = ctx->path == LOOM_BF16_PORTABLE ||
	               (ctx->path == LOOM_BF16_AUTO && loom_bf16_path(&path) == LOOM_OK && path == LOOM_BF16_PORTABLE);
	if (opt == 3)
		return !portable && amx_ok() ? PREC_AMX : PREC_FP32;
	if (portable)
		return PREC_BF16_PORTABLE;
	if (opt != 2 && amx_ok())
		return PREC_AMX;
	return loom_cpu()->avx512_bf16 ? PREC_BF16 : PREC_BF16_PORTABLE;
}

/* ---- bf16 operands and products ------------------------------------------------------------------ */

static inline int up2(int x)
{
	return (x + 1) & ~1;
}

static inline int up32(int x)
{
	return (x + 31) & ~31;
}

/* As amx_mm (below), with AVX512-BF16's dot-product instruction (vdpbf16ps): tiles of 6 rows x 32
 * columns, 12 accumulators. */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) static void
mm_bf16(int M, int N, int K, float alpha, const uint16_t *A, int lda, const uint16_t *B, int ldb, int acc, float *C,
        int ldc)
{
	int K2 = up2(K) / 2, np = ldb;
	__m512 va = _mm512_set1_ps(alpha);
	for (int j0 = 0; j0 < N; j0 += 32) {
		int nj = N - j0;
		__mmask16 m0 = nj >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << nj) - 1);
		__mmask16 m1 = nj >= 32 ? (__mmask16)0xffff : nj > 16 ? (__mmask16)((1u << (nj - 16)) - 1) : 0;
		for (int i0 = 0; i0 < M; i0 += 6) {
			int mi = M - i0 < 6 ? M - i0 : 6;
			__m512 c[6][2];
#pragma GCC unroll 6
			for (int r = 0; r < 6; r++)
				c[r][0] = c[r][1] = _mm512_setzero_ps();
			const uint16_t *b = B + (size_t)j0 * 2, *a = A + (size_t)i0 * lda;
			for (int p = 0; p < K2; p++, b += (size_t)np * 2) {
				__m512bh b0 = (__m512bh)_mm512_loadu_si512(b), b1 = (__m512bh)_mm512_loadu_si512(b + 32);
#pragma GCC unroll 6
				for (int r = 0; r < 6; r++)
					if (r < mi) {
						int32_t pair;
						memcpy(&pair, a + (size_t)r * lda + 2 * p, sizeof pair);
						__m512bh x = (__m512bh)_mm512_set1_epi32(pair);
						c[r][0] = _mm512_dpbf16_ps(c[r][0], x, b0);
						c[r][1] = _mm512_dpbf16_ps(c[r][1], x, b1);
					}
			}
#pragma GCC unroll 6
			for (int r = 0; r < 6; r++)
				if (r < mi) {
					float *cr = C + (size_t)(i0 + r) * ldc + j0;
					__m512 x0 = _mm512_mul_ps(c[r][0], va), x1 = _mm512_mul_ps(c[r][1], va);
					if (acc) {
						x0 = _mm512_add_ps(x0, _mm512_maskz_loadu_ps(m0, cr));
						x1 = _mm512_add_ps(x1, _mm512_maskz_loadu_ps(m1, cr + 16));
					}
					_mm512_mask_storeu_ps(cr, m0, x0);
					_mm512_mask_storeu_ps(cr + 16, m1, x1);
				}
		}
	}
}

/* The portable path's operand: src (rows, cols) rounded to bf16, dense (rows cols apart). */
static void round_copy(float *dst, const float *src, int lds, int rows, int cols)
{
	for (int r = 0; r < rows; r++) {
		float *d = dst + (size_t)r * cols;
		const float *x = src + (size_t)r * lds;
#pragma omp simd
		for (int c = 0; c < cols; c++) {
			union {
				uint32_t u;
				float f;
			} y = {(uint32_t)loom__bf16_bits(x[c]) << 16};
			d[c] = y.f;
		}
	}
}

/* ---- AMX -------------------------------------------------------------------------------------------- */

/* Linux gives a process the tile registers only on request (arch_prctl ARCH_REQ_XCOMP_PERM for
 * XFEATURE_XTILEDATA, idempotent; oneDNN asks the same): 1 when the CPU has AMX-BF16 and the permission
 * was granted (asked once per process). */
static int amx_ok(void)
{
	static int st; /* 0 not asked, 1 yes, -1 no */
	int s = __atomic_load_n(&st, __ATOMIC_ACQUIRE);
	if (!s) {
		const loom_cpu_t *c = loom_cpu();
		s = c->amx_tile && c->amx_bf16 && syscall(SYS_arch_prctl, 0x1023, 18) == 0 ? 1 : -1;
		__atomic_store_n(&st, s, __ATOMIC_RELEASE);
	}
	return s > 0;
}

/* The tile instructions as asm with a memory clobber (GCC's _tile_* macros have none: the compiler could
 * move the stores that write an operand past the tile load that reads it). AT&T operand order. */
#define TILE_LOAD(t, base, stride) \
	__asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"(base), "r"((long)(stride)) : "memory")
#define TILE_STORE(t, base, stride) \
	__asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)" ::"r"(base), "r"((long)(stride)) : "memory")
#define TILE_ZERO(t) __asm__ volatile("tilezero %%tmm" #t ::)
#define TILE_DP(c, a, b) __asm__ volatile("tdpbf16ps %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)

/* Every tile 16 rows x 64 bytes: tmm0-3 a 32 x 32 block of C (fp32), tmm4-5 two 16 x 32 slices of A,
 * tmm6-7 two 16-column slices of B (16 pairs of K rows). Set once per thread and call. */
static void amx_begin(void)
{
	_Alignas(64) struct {
		uint8_t palette, start_row, rsv[14];
		uint16_t colsb[16];
		uint8_t rows[16];
	} cfg;
	memset(&cfg, 0, sizeof cfg);
	cfg.palette = 1;
	for (int t = 0; t < 8; t++)
		cfg.colsb[t] = 64, cfg.rows[t] = 16;
	__asm__ volatile("ldtilecfg %0" ::"m"(cfg));
}

static void amx_end(void)
{
	__asm__ volatile("tilerelease" ::);
}

/* C (M, N) fp32, rows ldc apart, = alpha A B (+ C when acc), the bf16 products accumulated in fp32 by AMX:
 * A (M, K) bf16 rows lda apart, B in pairs along K: element (k, n) at [((k / 2) ldb + n) 2 + k % 2].
 * K is a multiple of 32; A has readable rows up to M rounded up to 32 and B columns up to N rounded
 * up to 32 (what those make is thrown away), and A's columns and B's rows up to K are the operands' own
 * or zero (a pad times anything finite adds nothing). With alpha 1, 32 x 32 blocks of C wholly inside
 * go straight from and to C, the others through a block on the stack (and every block when alpha is
 * not 1: alpha multiplies the fp32 sums, as the sgemm's alpha does). */
static void amx_mm(int M, int N, int K, float alpha, const uint16_t *A, int lda, const uint16_t *B, int ldb, int acc,
                   float *C, int ldc)
{
	_Alignas(64) float tmp[32 * 32];
	for (int i0 = 0; i0 < M; i0 += 32)
		for (int j0 = 0; j0 < N; j0 += 32) {
			int mi = M - i0 < 32 ? M - i0 : 32, nj = N - j0 < 32 ? N - j0 : 32;
			int full = mi == 32 && nj == 32 && alpha == 1.0f, cacc = acc && alpha == 1.0f;
			float *c = full ? C + (size_t)i0 * ldc + j0 : tmp;
			long ld = full ? (long)ldc : 32;
			if (!full && cacc)
				for (int i = 0; i < 32; i++)
					for (int j = 0; j < 32; j++)
						tmp[i * 32 + j] = i < mi && j < nj ? C[(size_t)(i0 + i) * ldc + j0 + j] : 0.0f;
			if (cacc) {
				TILE_LOAD(0, c, ld * 4);
				TILE_LOAD(1, c + 16, ld * 4);
				TILE_LOAD(2, c + 16 * ld, ld * 4);
				TILE_LOAD(3, c + 16 * ld + 16, ld * 4);
			} else {
				TILE_ZERO(0);
				TILE_ZERO(1);
				TILE_ZERO(2);
				TILE_ZERO(3);
			}
			const uint16_t *a = A + (size_t)i0 * lda, *b = B + (size_t)j0 * 2;
			for (int k0 = 0; k0 < K; k0 += 32) {
				TILE_LOAD(4, a + k0, (long)lda * 2);
				TILE_LOAD(5, a + (size_t)16 * lda + k0, (long)lda * 2);
				TILE_LOAD(6, b + (size_t)k0 * ldb, (long)ldb * 4);
				TILE_LOAD(7, b + (size_t)k0 * ldb + 32, (long)ldb * 4);
				TILE_DP(0, 4, 6);
				TILE_DP(1, 4, 7);
				TILE_DP(2, 5, 6);
				TILE_DP(3, 5, 7);
			}
			TILE_STORE(0, c, ld * 4);
			TILE_STORE(1, c + 16, ld * 4);
			TILE_STORE(2, c + 16 * ld, ld * 4);
			TILE_STORE(3, c + 16 * ld + 16, ld * 4);
			if (!full && alpha == 1.0f)
				for (int i = 0; i < mi; i++)
					memcpy(C + (size_t)(i0 + i) * ldc + j0, tmp + i * 32, sizeof(float) * (size_t)nj);
			else if (!full)
				for (int i = 0; i < mi; i++) {
					float *ci = C + (size_t)(i0 + i) * ldc + j0;
					const float *x = tmp + i * 32;
#pragma omp simd
					for (int j = 0; j < nj; j++)
						ci[j] = acc ? ci[j] + alpha * x[j] : alpha * x[j];
				}
		}
}

/* A bf16 value pair as one 32-bit word (the first in the low half). */
static inline uint32_t bf16_pair(float lo, float hi)
{
	return (uint32_t)loom__bf16_bits(lo) | (uint32_t)loom__bf16_bits(hi) << 16;
}

/* dst (rows, ldd) = src (rows, cols; rows lds apart) in bf16, columns cols..ldd zero. */
static void rows_bf16(uint16_t *dst, int ldd, const float *src, int lds, int rows, int cols)
{
	for (int r = 0; r < rows; r++) {
		uint16_t *d = dst + (size_t)r * ldd;
		const float *x = src + (size_t)r * lds;
#pragma omp simd
		for (int c = 0; c < cols; c++)
			d[c] = loom__bf16_bits(x[c]);
		memset(d + cols, 0, sizeof(uint16_t) * (size_t)(ldd - cols));
	}
}

/* src (rows, cols; rows lds apart) as amx_mm's B operand (K = rows, N = cols) in pairs: rows [r0, r1)
 * of it (r0, r1 even; rows from `rows` on and columns from cols to ldp zero), pairs ldp apart. */
static void pairs_k(uint16_t *dst, int ldp, const float *src, int lds, int rows, int cols, int r0, int r1)
{
	for (int r = r0; r < r1; r += 2) {
		uint32_t *d = (uint32_t *)(dst + (size_t)r * ldp);
		const float *x = src + (size_t)r * lds, *y = x + lds;
		int n = r < rows ? cols : 0;
		if (r + 1 < rows)
#pragma omp simd
			for (int c = 0; c < n; c++)
				d[c] = bf16_pair(x[c], y[c]);
		else
			for (int c = 0; c < n; c++)
				d[c] = bf16_pair(x[c], 0.0f);
		memset(d + n, 0, sizeof(uint32_t) * (size_t)(ldp - n));
	}
}

/* src^T as amx_mm's B operand (K = cols of src, N = rows of src: a K or V block for Q K^T, dO V^T):
 * columns [c0, c1) of it (src's rows; from `rows` on zero), pairs ldp apart, pair rows up to kp / 2
 * (from cols / 2 on zero). */
static void pairs_t(uint16_t *dst, int ldp, int kp, const float *src, int lds, int rows, int cols, int c0, int c1)
{
	uint32_t *d = (uint32_t *)dst;
	for (int n = c0; n < c1; n++) {
		const float *x = src + (size_t)n * lds;
		for (int p = 0; p < kp / 2; p++) {
			int k = 2 * p;
			d[(size_t)p * ldp + n] =
			    n < rows && k < cols ? bf16_pair(x[k], k + 1 < cols ? x[k + 1] : 0.0f) : 0u;
		}
	}
}

/* dst (cols, ldd) = src^T in bf16: src (rows, cols) rows lds apart, dst's columns rows..ldd zero (ldd
 * even). Two source rows at a time make one 32-bit pair of each destination row; 16 destination rows
 * at a time stay in the L1. */
static void transpose_bf16(uint16_t *dst, int ldd, const float *src, int lds, int rows, int cols)
{
	uint32_t *d = (uint32_t *)dst;
	size_t h = (size_t)ldd / 2;
	for (int c0 = 0; c0 < cols; c0 += 16) {
		int nc = cols - c0 < 16 ? cols - c0 : 16;
		for (int r = 0; r < ldd; r += 2) {
			const float *x = src + (size_t)r * lds + c0, *y = x + lds;
			uint32_t *dr = d + (size_t)c0 * h + (size_t)r / 2;
			if (r + 1 < rows)
				for (int c = 0; c < nc; c++)
					dr[(size_t)c * h] = bf16_pair(x[c], y[c]);
			else if (r < rows)
				for (int c = 0; c < nc; c++)
					dr[(size_t)c * h] = bf16_pair(x[c], 0.0f);
			else
				for (int c = 0; c < nc; c++)
					dr[(size_t)c * h] = 0u;
		}
	}
}

/* A call's bf16 operands for AMX, in the bf16 context's attention slot: per (sequence, kv head) the
 * keys and values packed once for every query block (not once per block: that was the cost which
 * kept the bf16 products slower than fp32's), in the forms the products read (KT: K^T, pairs along D,
 * for S = Q K^T; VN: V, pairs along the keys, for O += P V; VT: V^T for dP = dO V^T; KN: K for
 * dQ += dS K), B Tk NKV D values each (rounded up to 32 rows and columns); then each thread's
 * per-task operands (Q and dO as A and in pairs, P and dS as A and transposed). Nothing is T x T. */
enum { FORM_KT, FORM_VN, FORM_VT, FORM_KN, FORMS };
typedef void mm_fn(int M, int N, int K, float alpha, const uint16_t *A, int lda, const uint16_t *B, int ldb, int acc,
                   float *C, int ldc);
typedef struct {
	uint16_t *form[FORMS];
	uint16_t *thr;      /* per-thread areas, thr_n values apart */
	mm_fn *mm;          /* the products: amx_mm or mm_bf16 */
	int tiles;          /* 1: amx_mm (each thread configures its tiles) */
	size_t head, thr_n; /* values of one (sequence, kv head) of a form; of a thread's area */
	int Tkp, Dp, bk;
} packs_t;

static int amx_bk(int D)
{
	return key_block(D); /* 64..256: a multiple of 32 */
}

/* The slot for a, nthreads threads, and the products of prec (PREC_AMX or PREC_BF16); 0, or -1
 * (ctx->err set) when the memory cannot be had. */
static int packs_setup(const loom__flash_t *a, packs_t *c, int nthreads, int prec)
{
	c->tiles = prec == PREC_AMX;
	c->mm = c->tiles ? amx_mm : mm_bf16;
	c->Tkp = up32(a->Tk), c->Dp = up32(a->D), c->bk = amx_bk(a->D);
	c->head = (size_t)c->Tkp * c->Dp;
	c->thr_n = 4 * (size_t)FLASH_BQ * c->Dp + 4 * (size_t)FLASH_BQ * FLASH_BK_MAX;
	size_t forms = (size_t)a->B * a->NKV * c->head;
	uint16_t *m = loom__bf16_slot(loom__gemm_current(), LOOM_BF16_SLOT_ATTN, FORMS * forms + nthreads * c->thr_n);
	if (!m)
		return -1;
	for (int f = 0; f < FORMS; f++)
		c->form[f] = m + (size_t)f * forms;
	c->thr = m + FORMS * forms;
	return 0;
}

/* The forms in `want` (bits 1 << FORM_*) packed from a's keys and values, on the threads of the
 * enclosing parallel region (an orphaned for: its barrier ends the packing). */
static void packs_fill(const loom__flash_t *a, const packs_t *c, int want)
{
	int nb = c->Tkp / 32, units = FORMS * a->B * a->NKV * nb;
#pragma omp for schedule(static)
	for (int u = 0; u < units; u++) {
		int f = u / (a->B * a->NKV * nb), bg = u / nb % (a->B * a->NKV), r0 = u % nb * 32;
		if (!(want & 1 << f))
			continue;
		int b = bg / a->NKV, g = bg % a->NKV;
		const float *src = (f == FORM_KT || f == FORM_KN ? a->k : a->v) + (size_t)b * a->Tk * a->ldk + (size_t)g * a->D;
		uint16_t *d = c->form[f] + (size_t)bg * c->head;
		if (f == FORM_KT || f == FORM_VT)
			pairs_t(d, c->Tkp, c->Dp, src, a->ldk, a->Tk, a->D, r0, r0 + 32);
		else
			pairs_k(d, c->Dp, src, a->ldk, a->Tk, a->D, r0, r0 + 32);
	}
}

/* ---- tasks ------------------------------------------------------------------------------------------- */

/* Keys of query position p (local key indices, [lo, hi] inclusive, possibly empty) for a->W and a->kpos. */
static inline void key_range(const loom__flash_t *a, long p, long *lo, long *hi)
{
	long w = a->W >= 0 ? a->W : LONG_MAX / 4;
	long first = p - w - a->kpos, last = p - a->kpos;
	*lo = first > 0 ? first : 0;
	*hi = last < a->Tk - 1 ? last : a->Tk - 1;
}

/* The key rows [*c0, *c1) that some row of the query block [r0, r1) sees. */
static inline int block_keys(const loom__flash_t *a, int r0, int r1, int *c0, int *c1)
{
	long lo, hi, lo2, hi2;
	key_range(a, (long)a->qpos + r0, &lo, &hi);
	key_range(a, (long)a->qpos + r1 - 1, &lo2, &hi2);
	*c0 = (int)lo;
	*c1 = (int)(hi2 + 1);
	return *c1 > *c0;
}

/* Row i's keys inside the key block [j0, j0 + nk), as block columns [*jl, *jh]; 0 when none. */
static inline int row_keys(const loom__flash_t *a, int row, int j0, int nk, int *jl, int *jh)
{
	long lo, hi;
	key_range(a, (long)a->qpos + row, &lo, &hi);
	*jl = lo > j0 ? (int)(lo - j0) : 0;
	*jh = hi < j0 + nk - 1 ? (int)(hi - j0) : nk - 1;
	return *jl <= *jh;
}

static inline void zero_outside(float *x, int jl, int jh, int nk)
{
	memset(x, 0, sizeof(float) * (size_t)jl);
	memset(x + jh + 1, 0, sizeof(float) * (size_t)(nk - 1 - jh));
}

static int ntasks_of(const loom__flash_t *a, int *nqb)
{
	*nqb = (a->Tq + FLASH_BQ - 1) / FLASH_BQ;
	return a->B * a->NH * *nqb;
}

/* The sizes at which the kernel spreads its tasks over the threads (below: one thread). */
static int parallel(const loom__flash_t *a)
{
	double keys = a->W >= 0 && a->W < a->Tk ? (double)a->W + 1 : (double)a->Tk;
	return (double)a->B * a->Tq * keys * a->NH * a->D >= 1e6;
}

/* Query rows from one sequence to the next (qbs, or Tq: back to back). */
static inline size_t qstride(const loom__flash_t *a)
{
	return a->qbs > 0 ? (size_t)a->qbs : (size_t)a->Tq;
}

/* Task `task` (query blocks of a head last, so consecutive tasks share K and V) -> pointers. */
typedef struct {
	int b, h, g, r0, r1;
	const float *q, *k, *v;
} task_t;

static void task_of(const loom__flash_t *a, int nqb, int task, task_t *t)
{
	int bh = task / nqb, qb = task % nqb;
	t->b = bh / a->NH, t->h = bh % a->NH, t->g = t->h / (a->NH / a->NKV);
	t->r0 = qb * FLASH_BQ;
	t->r1 = t->r0 + FLASH_BQ < a->Tq ? t->r0 + FLASH_BQ : a->Tq;
	t->q = a->q + ((size_t)t->b * qstride(a)) * a->ldq + (size_t)t->h * a->D;
	t->k = a->k + ((size_t)t->b * a->Tk) * a->ldk + (size_t)t->g * a->D;
	t->v = a->v + ((size_t)t->b * a->Tk) * a->ldk + (size_t)t->g * a->D;
}

/* The portable path's operands of a task, on its stack: fp32 copies of Q, dO and a K and a V block,
 * rounded to bf16. */
#define BF16_QF (FLASH_BQ * FLASH_BF16_DMAX)
#define BF16_KF (FLASH_BF16_BK * FLASH_BF16_DMAX)
typedef struct {
	_Alignas(64) float q[BF16_QF], dy[BF16_QF], k[BF16_KF], v[BF16_KF];
} bf16_ops_t;

/* One task of the forward: rows [r0, r1) of head h, out rows accumulated in place. */
static void forward_task(const loom__flash_t *a, const task_t *t, float *out, int ldo, float *lse, int bk, int prec,
                         bf16_ops_t *ops)
{
	_Alignas(64) float S[FLASH_BQ * FLASH_BK_MAX];
	float m[FLASH_BQ], l[FLASH_BQ];
	int D = a->D, nq = t->r1 - t->r0, c0, c1;
	float *o = out + ((size_t)t->b * qstride(a) + t->r0) * ldo + (size_t)t->h * D;
	for (int i = 0; i < nq; i++) {
		memset(o + (size_t)i * ldo, 0, sizeof(float) * (size_t)D);
		m[i] = -INFINITY, l[i] = 0.0f;
	}
	const float *q = t->q + (size_t)t->r0 * a->ldq;
	if (prec == PREC_BF16_PORTABLE)
		round_copy(ops->q, q, a->ldq, nq, D);
	if (block_keys(a, t->r0, t->r1, &c0, &c1)) {
		for (int j0 = c0; j0 < c1; j0 += bk) {
			int nk = c1 - j0 < bk ? c1 - j0 : bk;
			const float *kj = t->k + (size_t)j0 * a->ldk, *vj = t->v + (size_t)j0 * a->ldk;
			/* S = scale Q K^T */
			if (prec == PREC_FP32) {
				loom__sgemm1(0, 1, nq, nk, D, a->scale, q, a->ldq, kj, a->ldk, 0.0f, S, nk);
			} else {
				round_copy(ops->k, kj, a->ldk, nk, D);
				round_copy(ops->v, vj, a->ldk, nk, D);
				loom__sgemm1(0, 1, nq, nk, D, a->scale, ops->q, D, ops->k, D, 0.0f, S, nk);
			}
			/* the online softmax: P = e^(S - m_new), each row's output so far rescaled */
			for (int i = 0; i < nq; i++) {
				float *s = S + (size_t)i * nk, mx = -INFINITY, sum = 0.0f;
				int jl, jh;
				if (!row_keys(a, t->r0 + i, j0, nk, &jl, &jh)) {
					memset(s, 0, sizeof(float) * (size_t)nk);
					continue;
				}
#pragma omp simd reduction(max : mx)
				for (int j = jl; j <= jh; j++)
					mx = s[j] > mx ? s[j] : mx;
				float mn = mx > m[i] ? mx : m[i];
				float alpha = m[i] == -INFINITY ? 0.0f : fast_expf(m[i] - mn);
#pragma omp simd reduction(+ : sum)
				for (int j = jl; j <= jh; j++) {
					s[j] = fast_expf(s[j] - mn);
					sum += s[j];
				}
				zero_outside(s, jl, jh, nk);
				m[i] = mn;
				l[i] = l[i] * alpha + sum;
				if (alpha != 1.0f) {
					float *oi = o + (size_t)i * ldo;
#pragma omp simd
					for (int d = 0; d < D; d++)
						oi[d] *= alpha;
				}
			}
			/* O += P V */
			if (prec == PREC_FP32) {
				loom__sgemm1(0, 0, nq, D, nk, 1.0f, S, nk, vj, a->ldk, 1.0f, o, ldo);
			} else {
				round_copy(S, S, nk, nq, nk);
				loom__sgemm1(0, 0, nq, D, nk, 1.0f, S, nk, ops->v, D, 1.0f, o, ldo);
			}
		}
	}
	float *ls = lse ? lse + ((size_t)t->b * a->NH + t->h) * a->Tq + t->r0 : NULL;
	for (int i = 0; i < nq; i++) {
		float *oi = o + (size_t)i * ldo, inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
#pragma omp simd
		for (int d = 0; d < D; d++)
			oi[d] *= inv;
		if (ls)
			ls[i] = l[i] > 0.0f ? m[i] + logf(l[i]) : -INFINITY;
	}
}

/* The forward's task on AMX: as forward_task, with Q packed once per task, the keys and values read
 * from the call's packs, P written in bf16 by the softmax itself. The key blocks start at a multiple of
 * 32 (the packs' pairs; keys before a row's first are zeros of P as any masked key). */
static void forward_task_packed(const loom__flash_t *a, const task_t *t, float *out, int ldo, float *lse,
                             const packs_t *c, uint16_t *w)
{
	_Alignas(64) float S[FLASH_BQ * FLASH_BK_MAX];
	float m[FLASH_BQ], l[FLASH_BQ];
	int D = a->D, Dp = c->Dp, nq = t->r1 - t->r0, c0, c1;
	float *o = out + ((size_t)t->b * qstride(a) + t->r0) * ldo + (size_t)t->h * D;
	for (int i = 0; i < nq; i++) {
		memset(o + (size_t)i * ldo, 0, sizeof(float) * (size_t)D);
		m[i] = -INFINITY, l[i] = 0.0f;
	}
	if (block_keys(a, t->r0, t->r1, &c0, &c1)) {
		uint16_t *qa = w, *pa = w + (size_t)FLASH_BQ * Dp;
		size_t head = (size_t)(t->b * a->NKV + t->g) * c->head;
		const uint16_t *kt = c->form[FORM_KT] + head, *vn = c->form[FORM_VN] + head;
		rows_bf16(qa, Dp, t->q + (size_t)t->r0 * a->ldq, a->ldq, nq, D);
		for (int j0 = c0 & ~31; j0 < c1; j0 += c->bk) {
			int nk = c1 - j0 < c->bk ? c1 - j0 : c->bk, nkp = up32(nk);
			c->mm(nq, nkp, Dp, 1.0f, qa, Dp, kt + (size_t)j0 * 2, c->Tkp, 0, S, nkp); /* S = Q K^T */
			for (int i = 0; i < nq; i++) {
				float *s = S + (size_t)i * nkp, mx = -INFINITY, sum = 0.0f, sc = a->scale;
				uint16_t *p = pa + (size_t)i * nkp;
				int jl, jh;
				if (!row_keys(a, t->r0 + i, j0, nk, &jl, &jh)) {
					memset(p, 0, sizeof(uint16_t) * (size_t)nkp);
					continue;
				}
#pragma omp simd reduction(max : mx)
				for (int j = jl; j <= jh; j++)
					mx = s[j] * sc > mx ? s[j] * sc : mx;
				float mn = mx > m[i] ? mx : m[i];
				float alpha = m[i] == -INFINITY ? 0.0f : fast_expf(m[i] - mn);
				memset(p, 0, sizeof(uint16_t) * (size_t)jl);
#pragma omp simd reduction(+ : sum)
				for (int j = jl; j <= jh; j++) {
					float e = fast_expf(s[j] * sc - mn);
					sum += e;
					p[j] = loom__bf16_bits(e);
				}
				memset(p + jh + 1, 0, sizeof(uint16_t) * (size_t)(nkp - 1 - jh));
				m[i] = mn;
				l[i] = l[i] * alpha + sum;
				if (alpha != 1.0f) {
					float *oi = o + (size_t)i * ldo;
#pragma omp simd
					for (int d = 0; d < D; d++)
						oi[d] *= alpha;
				}
			}
			c->mm(nq, D, nkp, 1.0f, pa, nkp, vn + (size_t)j0 * Dp, Dp, 1, o, ldo); /* O += P V */
		}
	}
	float *ls = lse ? lse + ((size_t)t->b * a->NH + t->h) * a->Tq + t->r0 : NULL;
	for (int i = 0; i < nq; i++) {
		float *oi = o + (size_t)i * ldo, inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
#pragma omp simd
		for (int d = 0; d < D; d++)
			oi[d] *= inv;
		if (ls)
			ls[i] = l[i] > 0.0f ? m[i] + logf(l[i]) : -INFINITY;
	}
}

void loom__flash_forward(const loom__flash_t *a, float *out, int ldo, float *lse)
{
	int nqb, n = ntasks_of(a, &nqb), prec = precision(a->D), par = parallel(a);
	int bk = prec == PREC_FP32 ? key_block(a->D) : FLASH_BF16_BK, packed = prec == PREC_AMX || prec == PREC_BF16;
	packs_t c;
	if (packed && packs_setup(a, &c, par ? omp_get_max_threads() : 1, prec) != 0)
		packed = 0,
		prec = PREC_FP32; /* no memory: the context keeps the error, which the model's pass returns */
	/* the longest query blocks (the last of each head under the causal mask) first */
#pragma omp parallel if (par)
	{
		bf16_ops_t ops_, *ops = prec == PREC_BF16_PORTABLE ? &ops_ : NULL;
		if (packed)
			packs_fill(a, &c, 1 << FORM_KT | 1 << FORM_VN);
		if (packed && c.tiles)
			amx_begin();
#pragma omp for schedule(dynamic, 1)
		for (int i = 0; i < n; i++) {
			task_t t;
			int bh = i % (a->B * a->NH), qb = nqb - 1 - i / (a->B * a->NH);
			task_of(a, nqb, bh * nqb + qb, &t);
			if (packed)
				forward_task_packed(a, &t, out, ldo, lse, &c, c.thr + (size_t)omp_get_thread_num() * c.thr_n);
			else
				forward_task(a, &t, out, ldo, lse, bk, prec, ops);
		}
		if (packed && c.tiles)
			amx_end();
	}
}

size_t loom__flash_scratch_floats(int B, int Tk, int NKV, int D, int nthreads)
{
	return nthreads > 1 ? (size_t)(nthreads - 1) * 2 * (size_t)B * Tk * NKV * D : 0;
}

/* One task of the backward: dq rows [r0, r1) of head h (+=), dk, dv rows of kv head g (+=, rows ldkv apart). */
static void backward_task(const loom__flash_t *a, const task_t *t, float *dq, int lddq, float *dk, float *dv,
                          int ldkv, const float *dout, int lddo, const float *out, int ldo, const float *lse, int bk,
                          int prec, bf16_ops_t *ops)
{
	_Alignas(64) float P[FLASH_BQ * FLASH_BK_MAX], dP[FLASH_BQ * FLASH_BK_MAX];
	float Dr[FLASH_BQ];
	int D = a->D, nq = t->r1 - t->r0, c0, c1;
	if (!block_keys(a, t->r0, t->r1, &c0, &c1))
		return;
	size_t qrow = (size_t)t->b * qstride(a) + t->r0;
	const float *q = t->q + (size_t)t->r0 * a->ldq, *dy = dout + qrow * lddo + (size_t)t->h * D;
	const float *y = out + qrow * ldo + (size_t)t->h * D;
	const float *ls = lse + ((size_t)t->b * a->NH + t->h) * a->Tq + t->r0;
	float *dqb = dq + qrow * lddq + (size_t)t->h * D;
	size_t kvo = (size_t)t->b * a->Tk * ldkv + (size_t)t->g * D;
	float *dkb = dk + kvo, *dvb = dv + kvo;
	for (int i = 0; i < nq; i++) {
		const float *x = dy + (size_t)i * lddo, *z = y + (size_t)i * ldo;
		float s = 0.0f;
#pragma omp simd reduction(+ : s)
		for (int d = 0; d < D; d++)
			s += x[d] * z[d];
		Dr[i] = s;
	}
	/* bf16 (portable): Q and dO rounded once, each key block's K and V per block */
	if (prec == PREC_BF16_PORTABLE) {
		round_copy(ops->q, q, a->ldq, nq, D);
		round_copy(ops->dy, dy, lddo, nq, D);
	}
	for (int j0 = c0; j0 < c1; j0 += bk) {
		int nk = c1 - j0 < bk ? c1 - j0 : bk;
		const float *kj = t->k + (size_t)j0 * a->ldk, *vj = t->v + (size_t)j0 * a->ldk;
		/* S = scale Q K^T (into P) and dP = dO V^T */
		if (prec == PREC_FP32) {
			loom__sgemm1(0, 1, nq, nk, D, a->scale, q, a->ldq, kj, a->ldk, 0.0f, P, nk);
			loom__sgemm1(0, 1, nq, nk, D, 1.0f, dy, lddo, vj, a->ldk, 0.0f, dP, nk);
		} else {
			round_copy(ops->k, kj, a->ldk, nk, D);
			round_copy(ops->v, vj, a->ldk, nk, D);
			loom__sgemm1(0, 1, nq, nk, D, a->scale, ops->q, D, ops->k, D, 0.0f, P, nk);
			loom__sgemm1(0, 1, nq, nk, D, 1.0f, ops->dy, D, ops->v, D, 0.0f, dP, nk);
		}
		/* P = e^(S - lse), dS = P (dP - D), exact zeros outside each row's keys */
		for (int i = 0; i < nq; i++) {
			float *p = P + (size_t)i * nk, *g = dP + (size_t)i * nk, li = ls[i], di = Dr[i];
			int jl, jh;
			if (!row_keys(a, t->r0 + i, j0, nk, &jl, &jh)) {
				memset(p, 0, sizeof(float) * (size_t)nk);
				memset(g, 0, sizeof(float) * (size_t)nk);
				continue;
			}
#pragma omp simd
			for (int j = jl; j <= jh; j++) {
				p[j] = fast_expf(p[j] - li);
				g[j] = p[j] * (g[j] - di);
			}
			zero_outside(p, jl, jh, nk);
			zero_outside(g, jl, jh, nk);
		}
		/* dV += P^T dO, dK += scale dS^T Q, dQ += scale dS K */
		if (prec == PREC_FP32) {
			loom__sgemm1(1, 0, nk, D, nq, 1.0f, P, nk, dy, lddo, 1.0f, dvb + (size_t)j0 * ldkv, ldkv);
			loom__sgemm1(1, 0, nk, D, nq, a->scale, dP, nk, q, a->ldq, 1.0f, dkb + (size_t)j0 * ldkv, ldkv);
			loom__sgemm1(0, 0, nq, D, nk, a->scale, dP, nk, kj, a->ldk, 1.0f, dqb, lddq);
		} else {
			round_copy(P, P, nk, nq, nk);
			round_copy(dP, dP, nk, nq, nk);
			loom__sgemm1(1, 0, nk, D, nq, 1.0f, P, nk, ops->dy, D, 1.0f, dvb + (size_t)j0 * ldkv, ldkv);
			loom__sgemm1(1, 0, nk, D, nq, a->scale, dP, nk, ops->q, D, 1.0f, dkb + (size_t)j0 * ldkv, ldkv);
			loom__sgemm1(0, 0, nq, D, nk, a->scale, dP, nk, ops->k, D, 1.0f, dqb, lddq);
		}
	}
}

/* The backward's task on AMX: Q and dO packed once per task (as A, and in pairs for dK and dV), the
 * keys and values from the call's packs; P and dS rounded to bf16 as A and transposed (the scale
 * multiplies dS's products, as on the other paths). Key blocks from a multiple of 32 as in the forward. */
static void backward_task_packed(const loom__flash_t *a, const task_t *t, float *dq, int lddq, float *dk, float *dv,
                              int ldkv, const float *dout, int lddo, const float *out, int ldo, const float *lse,
                              const packs_t *c, uint16_t *w)
{
	_Alignas(64) float P[FLASH_BQ * FLASH_BK_MAX], dP[FLASH_BQ * FLASH_BK_MAX];
	float Dr[FLASH_BQ];
	int D = a->D, Dp = c->Dp, nq = t->r1 - t->r0, nqp = up32(nq), c0, c1;
	if (!block_keys(a, t->r0, t->r1, &c0, &c1))
		return;
	size_t qrow = (size_t)t->b * qstride(a) + t->r0;
	const float *q = t->q + (size_t)t->r0 * a->ldq, *dy = dout + qrow * lddo + (size_t)t->h * D;
	const float *y = out + qrow * ldo + (size_t)t->h * D;
	const float *ls = lse + ((size_t)t->b * a->NH + t->h) * a->Tq + t->r0;
	float *dqb = dq + qrow * lddq + (size_t)t->h * D;
	size_t kvo = (size_t)t->b * a->Tk * ldkv + (size_t)t->g * D;
	float *dkb = dk + kvo, *dvb = dv + kvo;
	for (int i = 0; i < nq; i++) {
		const float *x = dy + (size_t)i * lddo, *z = y + (size_t)i * ldo;
		float s = 0.0f;
#pragma omp simd reduction(+ : s)
		for (int d = 0; d < D; d++)
			s += x[d] * z[d];
		Dr[i] = s;
	}
	size_t qn = (size_t)FLASH_BQ * Dp, bn = (size_t)FLASH_BQ * FLASH_BK_MAX;
	uint16_t *qa = w, *qk = qa + qn, *da = qk + qn, *dk2 = da + qn;
	uint16_t *pt = dk2 + qn, *sa = pt + bn, *st = sa + bn;
	size_t head = (size_t)(t->b * a->NKV + t->g) * c->head;
	const uint16_t *kt = c->form[FORM_KT] + head, *vt = c->form[FORM_VT] + head, *kn = c->form[FORM_KN] + head;
	rows_bf16(qa, Dp, q, a->ldq, nq, D);
	rows_bf16(da, Dp, dy, lddo, nq, D);
	pairs_k(qk, Dp, q, a->ldq, nq, D, 0, nqp);
	pairs_k(dk2, Dp, dy, lddo, nq, D, 0, nqp);
	for (int j0 = c0 & ~31; j0 < c1; j0 += c->bk) {
		int nk = c1 - j0 < c->bk ? c1 - j0 : c->bk, nkp = up32(nk);
		c->mm(nq, nkp, Dp, 1.0f, qa, Dp, kt + (size_t)j0 * 2, c->Tkp, 0, P, nkp); /* S = Q K^T */
		c->mm(nq, nkp, Dp, 1.0f, da, Dp, vt + (size_t)j0 * 2, c->Tkp, 0, dP, nkp); /* dP = dO V^T */
		/* P = e^(scale S - lse), dS = P (dP - D), exact zeros outside each row's keys */
		for (int i = 0; i < nq; i++) {
			float *p = P + (size_t)i * nkp, *g = dP + (size_t)i * nkp, li = ls[i], di = Dr[i], sc = a->scale;
			int jl, jh;
			if (!row_keys(a, t->r0 + i, j0, nk, &jl, &jh)) {
				memset(p, 0, sizeof(float) * (size_t)nkp);
				memset(g, 0, sizeof(float) * (size_t)nkp);
				continue;
			}
#pragma omp simd
			for (int j = jl; j <= jh; j++) {
				p[j] = fast_expf(p[j] * sc - li);
				g[j] = p[j] * (g[j] - di);
			}
			zero_outside(p, jl, jh, nkp);
			zero_outside(g, jl, jh, nkp);
		}
		rows_bf16(sa, nkp, dP, nkp, nq, nkp);
		transpose_bf16(pt, nqp, P, nkp, nq, nkp);
		transpose_bf16(st, nqp, dP, nkp, nq, nkp);
		c->mm(nk, D, nqp, 1.0f, pt, nqp, dk2, Dp, 1, dvb + (size_t)j0 * ldkv, ldkv);        /* dV += P^T dO */
		c->mm(nk, D, nqp, a->scale, st, nqp, qk, Dp, 1, dkb + (size_t)j0 * ldkv, ldkv);         /* dK += dS^T Q */
		c->mm(nq, D, nkp, a->scale, sa, nkp, kn + (size_t)j0 * Dp, Dp, 1, dqb, lddq);           /* dQ += dS K */
	}
}

void loom__flash_backward(const loom__flash_t *a, float *dq, int lddq, float *dk, float *dv, int lddk,
                          const float *dout, int lddo, const float *out, int ldo, const float *lse, float *scratch,
                          int scratch_threads)
{
	int nqb, n = ntasks_of(a, &nqb), KVD = a->NKV * a->D, prec = precision(a->D);
	int bk = prec == PREC_FP32 ? key_block(a->D) : FLASH_BF16_BK, packed = prec == PREC_AMX || prec == PREC_BF16;
	int nt = omp_get_max_threads() < scratch_threads ? omp_get_max_threads() : scratch_threads;
	if (nt < 1 || !parallel(a))
		nt = 1;
	packs_t c;
	if (packed && packs_setup(a, &c, nt, prec) != 0)
		packed = 0,
		prec = PREC_FP32; /* no memory: the context keeps the error, which the model's pass returns */
	size_t part = (size_t)a->B * a->Tk * KVD; /* floats of one partial dk (and as many of dv) */
#pragma omp parallel num_threads(nt) if (nt > 1)
	{
		int tid = omp_get_thread_num(), T = omp_get_num_threads();
		bf16_ops_t ops_, *ops = prec == PREC_BF16_PORTABLE ? &ops_ : NULL;
		float *pk = dk, *pv = dv;
		int ld = lddk;
		if (tid > 0) {
			pk = scratch + (size_t)(tid - 1) * 2 * part, pv = pk + part, ld = KVD;
			memset(pk, 0, sizeof(float) * 2 * part);
		}
		if (packed)
			packs_fill(a, &c, 1 << FORM_KT | 1 << FORM_VT | 1 << FORM_KN);
		if (packed && c.tiles)
			amx_begin();
		/* round-robin: fixed for a thread count; consecutive query blocks of a head on different threads */
#pragma omp for schedule(static, 1)
		for (int i = 0; i < n; i++) {
			task_t t;
			task_of(a, nqb, i, &t);
			if (packed)
				backward_task_packed(a, &t, dq, lddq, pk, pv, ld, dout, lddo, out, ldo, lse, &c,
				                     c.thr + (size_t)tid * c.thr_n);
			else
				backward_task(a, &t, dq, lddq, pk, pv, ld, dout, lddo, out, ldo, lse, bk, prec, ops);
		}
		if (packed && c.tiles)
			amx_end();
		/* the partials added to dk, dv in thread order (the for's barrier has passed) */
		if (T > 1) {
			size_t rows = (size_t)a->B * a->Tk;
#pragma omp for schedule(static)
			for (size_t r = 0; r < rows; r++) {
				float *x = dk + r * lddk, *y = dv + r * lddk;
				for (int s = 1; s < T; s++) {
					const float *sk = scratch + (size_t)(s - 1) * 2 * part + r * KVD, *sv = sk + part;
#pragma omp simd
					for (int c = 0; c < KVD; c++) {
						x[c] += sk[c];
						y[c] += sv[c];
					}
				}
			}
		}
	}
}
