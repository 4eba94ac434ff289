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
 * Precision: the products are oneDNN's sgemm on the operands in place (fp32), also under --dtype bf16.
 * With LOOM_ATTN_BF16=1 they run in the calling thread's GEMM precision (loom__gemm_current): in bf16
 * (--dtype bf16, head size up to FLASH_BF16_DMAX) the operands of every product (Q, K, V, P, dO, dS)
 * are rounded to bf16 and the products accumulate in fp32: natively with AVX512-BF16's dot-product
 * instruction (mm_bf16 below: operands packed per block into its pair layout), or on the portable
 * path, the same bf16-rounded operands on the fp32 sgemm, which is what every other bf16 matmul of loom
 * does on a CPU without it. The softmax, the running statistics and every accumulator stay fp32. */
#include <immintrin.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom/cpu.h"
#include "model/fastmath.h"
#include "model/kernels.h"

#define FLASH_BQ 128
#define FLASH_BK_MAX 256
#define FLASH_BK_MIN 64
#define FLASH_BF16_DMAX 128 /* the bf16 path's largest head (its operands live on the stack) */
#define FLASH_BF16_BK 128   /* and its key blocks */

enum { PREC_FP32 = 0, PREC_BF16 = 1, PREC_BF16_PORTABLE = 2 };

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

/* The precision of this call's products: fp32, unless LOOM_ATTN_BF16=1 and the calling thread's GEMM
 * context (read outside the parallel regions: it is thread-local) is bf16; then its path, AVX512-BF16
 * for the native one. Opt-in because the bf16 products do not pay yet: every block packs its K and V
 * operands again (per query block), which costs more than the products save (`small` in bf16 at T=256:
 * attention 3x slower than in fp32, the step 12% slower); packing each head's K and V once per call is
 * what would make it pay. */
static int precision(int D)
{
	loom__gemm_ctx_t *ctx = loom__gemm_current();
	loom_bf16_path_t path;
	const char *opt = getenv("LOOM_ATTN_BF16");
	if (!opt || strcmp(opt, "1") != 0 || !ctx || ctx->dtype != LOOM_COMPUTE_BF16 || D > FLASH_BF16_DMAX)
		return PREC_FP32;
	if (ctx->path == LOOM_BF16_PORTABLE || (ctx->path == LOOM_BF16_AUTO && loom_bf16_path(&path) == LOOM_OK &&
	                                        path == LOOM_BF16_PORTABLE))
		return PREC_BF16_PORTABLE;
	return loom_cpu()->avx512_bf16 ? PREC_BF16 : PREC_BF16_PORTABLE;
}

/* ---- bf16 operands and products ------------------------------------------------------------------ */

/* An operand in the native layouts: "A" rows of K values (K rounded up to even, the pad 0) for the
 * left factor; "B" the right factor (K, N) as pairs along K: element (k, n) at
 * [((k / 2) np + n) 2 + k % 2], np = N rounded up to 32, every pad 0. */
static inline int up2(int x)
{
	return (x + 1) & ~1;
}

static inline int up32(int x)
{
	return (x + 31) & ~31;
}

/* A (rows, cols) from src rows lds apart; with t, A = src^T (src is (cols, rows)). */
static void pack_a(uint16_t *dst, const float *src, int lds, int rows, int cols, int t)
{
	int ld = up2(cols);
	for (int r = 0; r < rows; r++) {
		uint16_t *d = dst + (size_t)r * ld;
		if (t)
			for (int c = 0; c < cols; c++)
				d[c] = loom__bf16_bits(src[(size_t)c * lds + r]);
		else
#pragma omp simd
			for (int c = 0; c < cols; c++)
				d[c] = loom__bf16_bits(src[(size_t)r * lds + c]);
		if (cols & 1)
			d[cols] = 0;
	}
}

/* B (K, N) from src rows lds apart: with t, B = src^T (src is (N, K): a K or V block for Q K^T, dO V^T);
 * else src itself (src is (K, N)). */
static void pack_b(uint16_t *dst, const float *src, int lds, int K, int N, int t)
{
	int np = up32(N), K2 = up2(K) / 2;
	memset(dst, 0, sizeof(uint16_t) * (size_t)K2 * np * 2);
	if (t)
		for (int n = 0; n < N; n++)
			for (int k = 0; k < K; k++)
				dst[((size_t)(k >> 1) * np + n) * 2 + (k & 1)] = loom__bf16_bits(src[(size_t)n * lds + k]);
	else
		for (int k = 0; k < K; k++) {
			uint16_t *d = dst + (size_t)(k >> 1) * np * 2 + (k & 1);
			const float *x = src + (size_t)k * lds;
			for (int n = 0; n < N; n++)
				d[2 * n] = loom__bf16_bits(x[n]);
		}
}

/* C (M, N), rows ldc apart, = alpha A B (+ C when acc): A and B packed as above, fp32 accumulation of
 * the bf16 products (vdpbf16ps). Tiles of 6 rows x 32 columns: 12 accumulators. */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) static void
mm_bf16(int M, int N, int K, float alpha, const uint16_t *A, const uint16_t *B, int acc, float *C, int ldc)
{
	int lda = up2(K), K2 = lda / 2, np = up32(N);
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

/* The bf16 operands of a task, on its stack: room for the native packings (A and B forms of Q and dO,
 * both forms of a K and a V block, P's and dS's) or the portable path's rounded copies, whichever is
 * larger (the portable one: fp32 copies of Q, dO, K, V). */
#define BF16_QF (FLASH_BQ * FLASH_BF16_DMAX)
#define BF16_KF (FLASH_BF16_BK * FLASH_BF16_DMAX)
typedef struct {
	_Alignas(64) float q[BF16_QF], dy[BF16_QF], k[BF16_KF], v[BF16_KF];
	_Alignas(64) uint16_t p[FLASH_BQ * FLASH_BF16_BK], pt[FLASH_BQ * FLASH_BF16_BK];
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
	uint16_t *qa = NULL, *kt = NULL, *vb = NULL;
	if (prec == PREC_BF16)
		qa = (uint16_t *)ops->q, kt = (uint16_t *)ops->k, vb = (uint16_t *)ops->v, pack_a(qa, q, a->ldq, nq, D, 0);
	else if (prec == PREC_BF16_PORTABLE)
		round_copy(ops->q, q, a->ldq, nq, D);
	if (block_keys(a, t->r0, t->r1, &c0, &c1)) {
		for (int j0 = c0; j0 < c1; j0 += bk) {
			int nk = c1 - j0 < bk ? c1 - j0 : bk;
			const float *kj = t->k + (size_t)j0 * a->ldk, *vj = t->v + (size_t)j0 * a->ldk;
			/* S = scale Q K^T */
			if (prec == PREC_FP32) {
				loom__sgemm1(0, 1, nq, nk, D, a->scale, q, a->ldq, kj, a->ldk, 0.0f, S, nk);
			} else if (prec == PREC_BF16) {
				pack_b(kt, kj, a->ldk, D, nk, 1);
				pack_b(vb, vj, a->ldk, nk, D, 0);
				mm_bf16(nq, nk, D, a->scale, qa, kt, 0, S, nk);
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
			} else if (prec == PREC_BF16) {
				pack_a(ops->p, S, nk, nq, nk, 0);
				mm_bf16(nq, D, nk, 1.0f, ops->p, vb, 1, o, ldo);
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

void loom__flash_forward(const loom__flash_t *a, float *out, int ldo, float *lse)
{
	int nqb, n = ntasks_of(a, &nqb), prec = precision(a->D);
	int bk = prec == PREC_FP32 ? key_block(a->D) : FLASH_BF16_BK;
	/* the longest query blocks (the last of each head under the causal mask) first */
#pragma omp parallel if (parallel(a))
	{
		bf16_ops_t ops_, *ops = prec == PREC_FP32 ? NULL : &ops_;
#pragma omp for schedule(dynamic, 1)
		for (int i = 0; i < n; i++) {
			task_t t;
			int bh = i % (a->B * a->NH), qb = nqb - 1 - i / (a->B * a->NH);
			task_of(a, nqb, bh * nqb + qb, &t);
			forward_task(a, &t, out, ldo, lse, bk, prec, ops);
		}
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
	/* bf16: the native packings of Q and dO (A forms and, for dK and dV, B forms), or their rounded copies;
	 * per key block both forms of K and V (native) or their rounded copies (portable) */
	uint16_t *qa = NULL, *qb = NULL, *da = NULL, *db = NULL, *kt = NULL, *kb = NULL, *vt = NULL, *vb = NULL;
	if (prec == PREC_BF16) {
		size_t qa_n = (size_t)FLASH_BQ * up2(D), kb_n = (size_t)up2(FLASH_BF16_BK) * up32(D);
		qa = (uint16_t *)ops->q, qb = qa + qa_n, da = (uint16_t *)ops->dy, db = da + qa_n;
		kt = (uint16_t *)ops->k, kb = kt + kb_n, vt = (uint16_t *)ops->v, vb = vt + kb_n;
		pack_a(qa, q, a->ldq, nq, D, 0), pack_b(qb, q, a->ldq, nq, D, 0);
		pack_a(da, dy, lddo, nq, D, 0), pack_b(db, dy, lddo, nq, D, 0);
	} else if (prec == PREC_BF16_PORTABLE) {
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
		} else if (prec == PREC_BF16) {
			pack_b(kt, kj, a->ldk, D, nk, 1), pack_b(kb, kj, a->ldk, nk, D, 0);
			pack_b(vt, vj, a->ldk, D, nk, 1), pack_b(vb, vj, a->ldk, nk, D, 0);
			mm_bf16(nq, nk, D, a->scale, qa, kt, 0, P, nk);
			mm_bf16(nq, nk, D, 1.0f, da, vt, 0, dP, nk);
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
		} else if (prec == PREC_BF16) {
			pack_a(ops->pt, P, nk, nk, nq, 1);
			mm_bf16(nk, D, nq, 1.0f, ops->pt, db, 1, dvb + (size_t)j0 * ldkv, ldkv);
			pack_a(ops->pt, dP, nk, nk, nq, 1);
			mm_bf16(nk, D, nq, a->scale, ops->pt, qb, 1, dkb + (size_t)j0 * ldkv, ldkv);
			pack_a(ops->p, dP, nk, nq, nk, 0);
			mm_bf16(nq, D, nk, a->scale, ops->p, kb, 1, dqb, lddq);
		} else {
			round_copy(P, P, nk, nq, nk);
			round_copy(dP, dP, nk, nq, nk);
			loom__sgemm1(1, 0, nk, D, nq, 1.0f, P, nk, ops->dy, D, 1.0f, dvb + (size_t)j0 * ldkv, ldkv);
			loom__sgemm1(1, 0, nk, D, nq, a->scale, dP, nk, ops->q, D, 1.0f, dkb + (size_t)j0 * ldkv, ldkv);
			loom__sgemm1(0, 0, nq, D, nk, a->scale, dP, nk, ops->k, D, 1.0f, dqb, lddq);
		}
	}
}

void loom__flash_backward(const loom__flash_t *a, float *dq, int lddq, float *dk, float *dv, int lddk,
                          const float *dout, int lddo, const float *out, int ldo, const float *lse, float *scratch,
                          int scratch_threads)
{
	int nqb, n = ntasks_of(a, &nqb), KVD = a->NKV * a->D, prec = precision(a->D);
	int bk = prec == PREC_FP32 ? key_block(a->D) : FLASH_BF16_BK;
	int nt = omp_get_max_threads() < scratch_threads ? omp_get_max_threads() : scratch_threads;
	if (nt < 1 || !parallel(a))
		nt = 1;
	size_t part = (size_t)a->B * a->Tk * KVD; /* floats of one partial dk (and as many of dv) */
#pragma omp parallel num_threads(nt) if (nt > 1)
	{
		int tid = omp_get_thread_num(), T = omp_get_num_threads();
		bf16_ops_t ops_, *ops = prec == PREC_FP32 ? NULL : &ops_;
		float *pk = dk, *pv = dv;
		int ld = lddk;
		if (tid > 0) {
			pk = scratch + (size_t)(tid - 1) * 2 * part, pv = pk + part, ld = KVD;
			memset(pk, 0, sizeof(float) * 2 * part);
		}
		/* round-robin: fixed for a thread count; consecutive query blocks of a head on different threads */
#pragma omp for schedule(static, 1)
		for (int i = 0; i < n; i++) {
			task_t t;
			task_of(a, nqb, i, &t);
			backward_task(a, &t, dq, lddq, pk, pv, ld, dout, lddo, out, ldo, lse, bk, prec, ops);
		}
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
