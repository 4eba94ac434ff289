/* flash.c: the one attention kernel of every family, forward and backward, fused in the manner of
 * FlashAttention-2: causal (and optionally windowed) softmax attention with grouped-query heads,
 * which never holds a T x T matrix.
 *
 * Why this shape: the scores of a sequence are T x T, but softmax(S) V only needs, per query row, a
 * running maximum m, a running sum l and the output accumulated so far. So the queries are taken in
 * blocks of FLASH_BQ rows, the keys in blocks of bk rows (bk from the L2 size: the block's K, V and
 * scores stay in cache), and each (query block, key block) pair is one sgemm for S = scale Q K^T, an
 * online-softmax update (rescale the rows' output by e^(m_old - m_new), P = e^(S - m_new)) and one sgemm
 * O += P V. Key blocks wholly above the causal diagonal or before a row block's window are never
 * visited; inside a block, entries outside a row's [t - W, t] are exact zeros. What the backward needs
 * is the output and one log-sum-exp per row (lse = m + log l): it recomputes P = e^(S - lse) block by
 * block, with D = rowsum(dO * O), dS = P (dP - D), dP = dO V^T, and accumulates dV += P^T dO,
 * dK += scale dS^T Q, dQ += scale dS K.
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
 * offsets are also what a context-parallel rank needs for another rank's chunk of keys. */
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <string.h>
#include <unistd.h>

#include "model/fastmath.h"
#include "model/kernels.h"

#define FLASH_BQ 64
#define FLASH_BK_MAX 256
#define FLASH_BK_MIN 64

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
	while (bk > FLASH_BK_MIN &&
	       4.0 * (2.0 * bk * D + 2.0 * FLASH_BQ * bk + 3.0 * FLASH_BQ * D) > 0.75 * c)
		bk /= 2;
	return bk;
}

int loom__flash_key_block(int D)
{
	return key_block(D);
}

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

/* One task of the forward: rows [r0, r1) of head h, out rows accumulated in place. */
static void forward_task(const loom__flash_t *a, const task_t *t, float *out, int ldo, float *lse, int bk)
{
	float S[FLASH_BQ * FLASH_BK_MAX], m[FLASH_BQ], l[FLASH_BQ];
	int D = a->D, nq = t->r1 - t->r0, c0, c1;
	float *o = out + ((size_t)t->b * qstride(a) + t->r0) * ldo + (size_t)t->h * D;
	for (int i = 0; i < nq; i++) {
		memset(o + (size_t)i * ldo, 0, sizeof(float) * (size_t)D);
		m[i] = -INFINITY, l[i] = 0.0f;
	}
	const float *q = t->q + (size_t)t->r0 * a->ldq;
	if (block_keys(a, t->r0, t->r1, &c0, &c1)) {
		for (int j0 = c0; j0 < c1; j0 += bk) {
			int nk = c1 - j0 < bk ? c1 - j0 : bk;
			loom__sgemm1(0, 1, nq, nk, D, a->scale, q, a->ldq, t->k + (size_t)j0 * a->ldk, a->ldk, 0.0f, S, nk);
			for (int i = 0; i < nq; i++) {
				float *s = S + (size_t)i * nk, mx = -INFINITY, sum = 0.0f;
				long lo, hi;
				key_range(a, (long)a->qpos + t->r0 + i, &lo, &hi);
				int jl = lo > j0 ? (int)(lo - j0) : 0, jh = hi < j0 + nk - 1 ? (int)(hi - j0) : nk - 1;
				if (jl > jh) { /* no key of this block in the row's range */
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
				memset(s, 0, sizeof(float) * (size_t)jl);
				memset(s + jh + 1, 0, sizeof(float) * (size_t)(nk - 1 - jh));
				m[i] = mn;
				l[i] = l[i] * alpha + sum;
				if (alpha != 1.0f) {
					float *oi = o + (size_t)i * ldo;
#pragma omp simd
					for (int d = 0; d < D; d++)
						oi[d] *= alpha;
				}
			}
			loom__sgemm1(0, 0, nq, D, nk, 1.0f, S, nk, t->v + (size_t)j0 * a->ldk, a->ldk, 1.0f, o, ldo);
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
	int nqb, n = ntasks_of(a, &nqb), bk = key_block(a->D);
	/* the longest query blocks (the last of each head under the causal mask) first */
#pragma omp parallel for schedule(dynamic, 1) if (parallel(a))
	for (int i = 0; i < n; i++) {
		task_t t;
		int bh = i % (a->B * a->NH), qb = nqb - 1 - i / (a->B * a->NH);
		task_of(a, nqb, bh * nqb + qb, &t);
		forward_task(a, &t, out, ldo, lse, bk);
	}
}

size_t loom__flash_scratch_floats(int B, int Tk, int NKV, int D, int nthreads)
{
	return nthreads > 1 ? (size_t)(nthreads - 1) * 2 * (size_t)B * Tk * NKV * D : 0;
}

/* One task of the backward: dq rows [r0, r1) of head h (+=), dk, dv rows of kv head g (+=, rows ldkv apart). */
static void backward_task(const loom__flash_t *a, const task_t *t, float *dq, int lddq, float *dk, float *dv,
                          int ldkv, const float *dout, int lddo, const float *out, int ldo, const float *lse, int bk)
{
	float P[FLASH_BQ * FLASH_BK_MAX], dP[FLASH_BQ * FLASH_BK_MAX], Dr[FLASH_BQ];
	int D = a->D, nq = t->r1 - t->r0, c0, c1;
	if (!block_keys(a, t->r0, t->r1, &c0, &c1))
		return;
	size_t qrow = (size_t)t->b * qstride(a) + t->r0;
	const float *q = t->q + (size_t)t->r0 * a->ldq, *dy = dout + qrow * lddo + (size_t)t->h * D;
	const float *y = out + qrow * ldo + (size_t)t->h * D;
	const float *ls = lse + ((size_t)t->b * a->NH + t->h) * a->Tq + t->r0;
	float *dqb = dq + qrow * lddq + (size_t)t->h * D;
	float *dkb = dk + (size_t)t->b * a->Tk * ldkv + (size_t)t->g * D, *dvb = dv + (size_t)t->b * a->Tk * ldkv + (size_t)t->g * D;
	for (int i = 0; i < nq; i++) {
		const float *x = dy + (size_t)i * lddo, *z = y + (size_t)i * ldo;
		float s = 0.0f;
#pragma omp simd reduction(+ : s)
		for (int d = 0; d < D; d++)
			s += x[d] * z[d];
		Dr[i] = s;
	}
	for (int j0 = c0; j0 < c1; j0 += bk) {
		int nk = c1 - j0 < bk ? c1 - j0 : bk;
		const float *kj = t->k + (size_t)j0 * a->ldk, *vj = t->v + (size_t)j0 * a->ldk;
		loom__sgemm1(0, 1, nq, nk, D, a->scale, q, a->ldq, kj, a->ldk, 0.0f, P, nk);
		loom__sgemm1(0, 1, nq, nk, D, 1.0f, dy, lddo, vj, a->ldk, 0.0f, dP, nk);
		for (int i = 0; i < nq; i++) {
			float *p = P + (size_t)i * nk, *g = dP + (size_t)i * nk, li = ls[i], di = Dr[i];
			long lo, hi;
			key_range(a, (long)a->qpos + t->r0 + i, &lo, &hi);
			int jl = lo > j0 ? (int)(lo - j0) : 0, jh = hi < j0 + nk - 1 ? (int)(hi - j0) : nk - 1;
			if (jl > jh) {
				memset(p, 0, sizeof(float) * (size_t)nk);
				memset(g, 0, sizeof(float) * (size_t)nk);
				continue;
			}
#pragma omp simd
			for (int j = jl; j <= jh; j++) {
				p[j] = fast_expf(p[j] - li);
				g[j] = p[j] * (g[j] - di);
			}
			memset(p, 0, sizeof(float) * (size_t)jl);
			memset(p + jh + 1, 0, sizeof(float) * (size_t)(nk - 1 - jh));
			memset(g, 0, sizeof(float) * (size_t)jl);
			memset(g + jh + 1, 0, sizeof(float) * (size_t)(nk - 1 - jh));
		}
		/* dV += P^T dO, dK += scale dS^T Q, dQ += scale dS K */
		loom__sgemm1(1, 0, nk, D, nq, 1.0f, P, nk, dy, lddo, 1.0f, dvb + (size_t)j0 * ldkv, ldkv);
		loom__sgemm1(1, 0, nk, D, nq, a->scale, dP, nk, q, a->ldq, 1.0f, dkb + (size_t)j0 * ldkv, ldkv);
		loom__sgemm1(0, 0, nq, D, nk, a->scale, dP, nk, kj, a->ldk, 1.0f, dqb, lddq);
	}
}

void loom__flash_backward(const loom__flash_t *a, float *dq, int lddq, float *dk, float *dv, int lddk,
                          const float *dout, int lddo, const float *out, int ldo, const float *lse, float *scratch,
                          int scratch_threads)
{
	int nqb, n = ntasks_of(a, &nqb), bk = key_block(a->D), KVD = a->NKV * a->D;
	int nt = omp_get_max_threads() < scratch_threads ? omp_get_max_threads() : scratch_threads;
	if (nt < 1 || !parallel(a))
		nt = 1;
	size_t part = (size_t)a->B * a->Tk * KVD; /* floats of one partial dk (and as many of dv) */
#pragma omp parallel num_threads(nt) if (nt > 1)
	{
		int tid = omp_get_thread_num(), T = omp_get_num_threads();
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
			backward_task(a, &t, dq, lddq, pk, pv, ld, dout, lddo, out, ldo, lse, bk);
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
