/* cp_attention.c: context-parallel attention (--cp N) on the fused kernel (flash.c), shared by both
 * families, in two forms: the ring of Ring Attention (the default) and the all-gather of Llama 3's
 * context parallelism (LOOM_CP_ATTENTION=gather; the tests' reference beside the whole-sequence kernel).
 *
 * Layout (kernels.h, loom__cp_chunk; chosen by loom_cp_chunks in iface.c): a sequence of T positions
 * is cut into N K chunks of c = T/(N K), K even, grouped in K/2 segments of 2N; in each segment rank r
 * holds the head-tail pair, chunks r and 2N-1-r, so its Tl = K c rows are its K chunks in position
 * order. Under the causal mask the keys a chunk sees grow with its index, and every pair sums to the
 * same work (K = 2 is Megatron's head-tail layout). A window breaks that: with nanochat's short window
 * T/2, N = 2, K = 2, the chunks' work on a windowed layer (keys over queries, in c^2) is 0.5, 1.5, 2, 2,
 * so rank 0 (chunks 0, 3) does 2.5 and rank 1 (1, 2) 3.5, and rank 0 waits for rank 1 at every
 * windowed layer (measured: ~1.3x its attention time there, at T = 4096 and 8192). With K = 4 the
 * first segment lies inside the window (causal: balanced) and the second sees W keys per query
 * everywhere (balanced), so every layer is even, and every step of the ring too. loom_cp_chunks
 * counts each K the sequence allows against the model's windows and takes the one whose most loaded
 * rank does least. The layout is one for all layers (activations are sharded by position between
 * them), and the rest of the model only sees positions (loom__cp_pos).
 *
 * Ring: each rank packs its keys and values chunk-major, [chunk 0: (B, c, 2 KVD) | chunk 1: ...], as
 * [k | v] per row. In step s (0..N-1) it holds rank (r - s) mod N's pack: it starts passing it on to
 * rank r+1 (and receiving the next from rank r-1) through the model's hook, then runs the kernel for
 * each pair of its K query chunks and the K held key chunks that the causal mask and the window leave
 * any key of (qpos, kpos the chunks' positions), merging each partial output into the rows' output by the
 * log-sum-exps (out = (e^(l1-m) o1 + e^(l2-m) o2) / (e^(l1-m) + e^(l2-m)), lse = m + log(...)), and
 * waits for the transfer: the keys travel while the blocks compute. The backward passes the packs
 * around again with an accumulator of their dK, dV: in step s each rank adds the gradient its queries
 * give the held keys (the kernel's backward with the final output and lse, which is exact on any subset
 * of the keys) to the accumulator that arrived with them, and passes it on, so after N steps every
 * pack's accumulator is back at its owner with the whole group's sum; the accumulator of step s-1
 * travels while step s computes.
 *
 * All-gather: each rank's pack is all-gathered (rank order), copied into position order (B, T, 2 KVD),
 * and each local chunk's queries run the kernel over all T keys from position 0 (the causal mask and
 * the window skip every key block the chunk does not see); the backward gathers again, runs the
 * kernel's backward (dK, dV of every key), copies them back into rank order and reduce-scatters (sums)
 * them.
 *
 * Memory: the scratch is the larger of the two forms' (loom__cp_scratch_floats): the ring 5 packs of
 * B Tl 2 KVD floats (two of keys, three of their gradients) and one chunk's partial output and lse;
 * the gather 3 x B T 2 KVD. Nothing is kept per layer beyond what the kernel keeps (out and lse of the
 * local rows). Communication per layer: the forward moves (N-1)/N of B T 2 KVD floats per rank, the
 * backward twice that (the keys again and their gradients), in both forms. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "model/kernels.h"

/* The chunk of global index j (0..N K - 1): its owner and its place (0..K-1) among the owner's chunks
 * (the inverse of loom__cp_chunk). */
static inline int chunk_owner(int N, int j)
{
	int i = j % (2 * N);
	return i < N ? i : 2 * N - 1 - i;
}

static inline int chunk_local(int N, int j)
{
	return 2 * (j / (2 * N)) + (j % (2 * N) < N ? 0 : 1);
}

/* Chunks per rank: the layout's K (2, head-tail, when unset). */
static inline int chunks(const loom__cp_t *cp)
{
	return cp->K > 0 ? cp->K : 2;
}

/* Floats of one rank's pack of keys and values: B Tl 2 KVD. */
static size_t pack_floats(int B, int Tl, int KVD)
{
	return 2 * (size_t)B * (size_t)Tl * (size_t)KVD;
}

size_t loom__cp_scratch_floats(int B, int Tl, int N, int NH, int NKV, int D)
{
	size_t pack = pack_floats(B, Tl, NKV * D), c = (size_t)Tl / 2; /* the largest chunk (K = 2) */
	size_t ring = 5 * pack + (size_t)B * Tl * (size_t)NH * D + (size_t)B * NH * c;
	size_t gather = 3 * pack * (size_t)N;
	return ring > gather ? ring : gather;
}

/* ---- the all-gather ------------------------------------------------------------------------------- */

/* Copy rows between the rank-ordered parts (N of (B, Tl, w)) and position order (B, T, w): to_pos 1
 * gathers parts into pos, 0 scatters pos into parts. */
static void reorder(float *parts, float *pos, int N, int K, int B, int Tl, size_t w, int to_pos)
{
	int c = Tl / K, T = N * Tl;
	size_t part = (size_t)B * Tl * w;
#pragma omp parallel for collapse(2) schedule(static) if ((size_t)B * T * w >= 65536)
	for (int b = 0; b < B; b++)
		for (int j = 0; j < N * K; j++) {
			float *p = parts + (size_t)chunk_owner(N, j) * part + ((size_t)b * Tl + (size_t)chunk_local(N, j) * c) * w;
			float *q = pos + ((size_t)b * T + (size_t)j * c) * w;
			if (to_pos)
				memcpy(q, p, sizeof(float) * (size_t)c * w);
			else
				memcpy(p, q, sizeof(float) * (size_t)c * w);
		}
}

/* The gather's buffers in cp->mem: the rank-ordered parts, the keys in position order, their gradients. */
typedef struct {
	float *parts, *kv, *dkv;
} gather_bufs_t;

static gather_bufs_t gather_bufs(const loom__cp_t *cp, const loom__flash_t *a)
{
	size_t n = pack_floats(a->B, a->Tq, a->NKV * a->D) * (size_t)cp->N;
	gather_bufs_t g = {cp->mem, cp->mem + n, cp->mem + 2 * n};
	return g;
}

/* Every rank's keys and values in position order into g->kv (B, T, 2 KVD). */
static int gather_kv(const loom__cp_t *cp, const loom__flash_t *a, const gather_bufs_t *g)
{
	int B = a->B, Tl = a->Tq, KVD = a->NKV * a->D;
	size_t w = 2 * (size_t)KVD, part = (size_t)B * Tl * w;
	float *mine = g->parts + (size_t)cp->r * part;
#pragma omp parallel for schedule(static) if (part >= 65536)
	for (int n = 0; n < B * Tl; n++) {
		memcpy(mine + (size_t)n * w, a->k + (size_t)n * a->ldk, sizeof(float) * (size_t)KVD);
		memcpy(mine + (size_t)n * w + KVD, a->v + (size_t)n * a->ldk, sizeof(float) * (size_t)KVD);
	}
	int rc = cp->fn(cp->ctx, g->parts, (size_t)cp->N * part, LOOM_TP_ALLGATHER);
	if (rc != 0)
		return rc;
	reorder(g->parts, g->kv, cp->N, chunks(cp), B, Tl, w, 1);
	return 0;
}

/* The kernel's operands for local chunk h (0..K-1) of a: its c queries where they lie among the Tl rows
 * of each sequence, against the T gathered keys. */
static loom__flash_t gather_shape(const loom__cp_t *cp, const loom__flash_t *a, const gather_bufs_t *g, int h)
{
	int c = a->Tq / chunks(cp), KVD = a->NKV * a->D;
	loom__flash_t f = *a;
	f.q = a->q + (size_t)h * c * a->ldq;
	f.k = g->kv, f.v = g->kv + KVD, f.ldk = 2 * KVD;
	f.Tq = c, f.qbs = a->Tq, f.Tk = cp->N * a->Tq;
	f.qpos = loom__cp_chunk(cp->N, cp->r, h) * c, f.kpos = 0;
	return f;
}

static int gather_forward(const loom__cp_t *cp, const loom__flash_t *a, float *out, int ldo, float *lse)
{
	gather_bufs_t g = gather_bufs(cp, a);
	int rc, K = chunks(cp), c = a->Tq / K;
	if ((rc = gather_kv(cp, a, &g)) != 0)
		return rc;
	for (int h = 0; h < K; h++) {
		loom__flash_t f = gather_shape(cp, a, &g, h);
		loom__flash_forward(&f, out + (size_t)h * c * ldo, ldo, lse + (size_t)h * a->B * a->NH * c);
	}
	return 0;
}

static int gather_backward(const loom__cp_t *cp, const loom__flash_t *a, float *dq, int lddq, float *dk, float *dv,
                           int lddk, const float *dout, int lddo, const float *out, int ldo, const float *lse)
{
	gather_bufs_t g = gather_bufs(cp, a);
	int rc, B = a->B, Tl = a->Tq, K = chunks(cp), c = Tl / K, KVD = a->NKV * a->D, T = cp->N * Tl;
	size_t w = 2 * (size_t)KVD, part = (size_t)B * Tl * w;
	if ((rc = gather_kv(cp, a, &g)) != 0)
		return rc;
	memset(g.dkv, 0, sizeof(float) * (size_t)B * T * w);
	for (int h = 0; h < K; h++) {
		loom__flash_t f = gather_shape(cp, a, &g, h);
		size_t o = (size_t)h * c;
		loom__flash_backward(&f, dq + o * lddq, lddq, g.dkv, g.dkv + KVD, (int)w, dout + o * lddo, lddo,
		                     out + o * ldo, ldo, lse + o * B * a->NH, cp->scratch, cp->scratch_threads);
	}
	reorder(g.parts, g.dkv, cp->N, K, B, Tl, w, 0);
	if ((rc = cp->fn(cp->ctx, g.parts, (size_t)cp->N * part, LOOM_TP_REDUCE_SCATTER)) != 0)
		return rc;
	const float *mine = g.parts + (size_t)cp->r * part;
#pragma omp parallel for schedule(static) if (part >= 65536)
	for (int n = 0; n < B * Tl; n++) {
		const float *x = mine + (size_t)n * w;
		float *y = dk + (size_t)n * lddk, *z = dv + (size_t)n * lddk;
#pragma omp simd
		for (int i = 0; i < KVD; i++) {
			y[i] += x[i];
			z[i] += x[KVD + i];
		}
	}
	return 0;
}

/* ---- the ring ------------------------------------------------------------------------------------- */

/* The ring's buffers in cp->mem: two packs of keys (the held one and the next), three of their
 * gradients (the accumulator arriving, the one leaving, this step's share), a partial output laid out
 * as the rows' (B, Tl, NH D: the kernel writes a chunk where its queries lie) and a chunk's lse
 * (B, NH, c). */
typedef struct {
	float *kv[2], *dkv[3], *pout, *plse;
	size_t pack;
} ring_bufs_t;

static ring_bufs_t ring_bufs(const loom__cp_t *cp, const loom__flash_t *a)
{
	ring_bufs_t g;
	g.pack = pack_floats(a->B, a->Tq, a->NKV * a->D);
	for (int k = 0; k < 2; k++)
		g.kv[k] = cp->mem + (size_t)k * g.pack;
	for (int k = 0; k < 3; k++)
		g.dkv[k] = cp->mem + (size_t)(2 + k) * g.pack;
	g.pout = cp->mem + 5 * g.pack;
	g.plse = g.pout + (size_t)a->B * a->Tq * a->NH * a->D;
	return g;
}

/* The rank's keys and values, chunk-major: pack (K, B, c, 2 KVD) from the local rows (B, Tl). */
static void pack_kv(float *pack, const loom__flash_t *a, int K)
{
	int B = a->B, Tl = a->Tq, c = Tl / K, KVD = a->NKV * a->D;
	size_t w = 2 * (size_t)KVD;
#pragma omp parallel for collapse(2) schedule(static) if ((size_t)B * Tl * w >= 65536)
	for (int b = 0; b < B; b++)
		for (int t = 0; t < Tl; t++) {
			int h = t / c, i = t % c;
			float *p = pack + (((size_t)h * B + b) * c + i) * w;
			size_t row = (size_t)b * Tl + t;
			memcpy(p, a->k + row * a->ldk, sizeof(float) * (size_t)KVD);
			memcpy(p + KVD, a->v + row * a->ldk, sizeof(float) * (size_t)KVD);
		}
}

/* 1 when some query of chunk jq sees some key of chunk jk (chunks of c positions, window W or < 0). */
static int pair_sees(int jq, int jk, int c, int W)
{
	if (jk > jq)
		return 0; /* every key after every query */
	return W < 0 || (long)jk * c + c - 1 >= (long)jq * c - W; /* the last key inside the first query's window */
}

/* Rank r's query chunk hq against chunk hk of the pack held (rank src's): the kernel's operands. */
static loom__flash_t ring_shape(const loom__cp_t *cp, const loom__flash_t *a, const float *pack, int src, int hq,
                                int hk)
{
	int c = a->Tq / chunks(cp), KVD = a->NKV * a->D;
	loom__flash_t f = *a;
	f.q = a->q + (size_t)hq * c * a->ldq;
	f.Tq = c, f.qbs = a->Tq, f.qpos = loom__cp_chunk(cp->N, cp->r, hq) * c;
	f.k = pack + (size_t)hk * a->B * c * 2 * KVD, f.v = f.k + KVD, f.ldk = 2 * KVD;
	f.Tk = c, f.kpos = loom__cp_chunk(cp->N, src, hk) * c;
	return f;
}

/* out (B, c rows ldo apart, each sequence's qbs rows apart), lse (B, NH, c) merged with a partial result
 * po (laid out as out, rows ldp apart), pl (B, NH, c) of the same queries over other keys, by their
 * log-sum-exps. */
static void merge(float *out, int ldo, int qbs, float *lse, const float *po, int ldp, const float *pl, int B, int c,
                  int NH, int D)
{
#pragma omp parallel for collapse(2) schedule(static) if ((long)B * NH * c * D >= 65536)
	for (int b = 0; b < B; b++)
		for (int h = 0; h < NH; h++)
			for (int i = 0; i < c; i++) {
				float *l = lse + ((size_t)b * NH + h) * c + i, l2 = pl[((size_t)b * NH + h) * c + i];
				if (l2 == -INFINITY)
					continue; /* the partial saw no key: nothing to add */
				float m = *l > l2 ? *l : l2, w1 = *l == -INFINITY ? 0.0f : expf(*l - m), w2 = expf(l2 - m);
				float s = w1 + w2, inv = 1.0f / s;
				float *o = out + ((size_t)b * qbs + i) * ldo + (size_t)h * D;
				const float *p = po + ((size_t)b * qbs + i) * ldp + (size_t)h * D;
#pragma omp simd
				for (int d = 0; d < D; d++)
					o[d] = (w1 * o[d] + w2 * p[d]) * inv;
				*l = m + logf(s);
			}
}

/* Start passing buf (n floats) to the next rank and receiving the previous rank's into into. */
static int shift(const loom__cp_t *cp, float *buf, float *into, size_t n)
{
	int rc = cp->fn(cp->ctx, into, n, LOOM_TP_RECV_PREV);
	return rc ? rc : cp->fn(cp->ctx, buf, n, LOOM_TP_SEND_NEXT);
}

/* Wait for the transfers started; with an error already, still wait (no transfer outlives the call). */
static int wait_all(const loom__cp_t *cp, int rc)
{
	int w = cp->fn(cp->ctx, NULL, 0, LOOM_TP_WAIT);
	return rc ? rc : w;
}

static int ring_forward(const loom__cp_t *cp, const loom__flash_t *a, float *out, int ldo, float *lse)
{
	ring_bufs_t g = ring_bufs(cp, a);
	int rc = 0, N = cp->N, K = chunks(cp), B = a->B, c = a->Tq / K, NH = a->NH, D = a->D;
	unsigned have = 0; /* bit hq: query chunk hq's rows hold a result */
	pack_kv(g.kv[0], a, K);
	for (int s = 0; s < N && rc == 0; s++) {
		int src = (cp->r - s + N) % N;
		float *held = g.kv[s % 2];
		if (s < N - 1 && (rc = shift(cp, held, g.kv[(s + 1) % 2], g.pack)) != 0)
			break;
		for (int hq = 0; hq < K; hq++)
			for (int hk = 0; hk < K; hk++) {
				if (!pair_sees(loom__cp_chunk(N, cp->r, hq), loom__cp_chunk(N, src, hk), c, a->W))
					continue;
				loom__flash_t f = ring_shape(cp, a, held, src, hq, hk);
				float *o = out + (size_t)hq * c * ldo, *l = lse + (size_t)hq * B * NH * c;
				if (!(have >> hq & 1)) { /* the first keys (at s = 0; its own chunk's at the latest): straight
				                          * into the rows */
					loom__flash_forward(&f, o, ldo, l);
					have |= 1u << hq;
					continue;
				}
				float *po = g.pout + (size_t)hq * c * NH * D;
				loom__flash_forward(&f, po, NH * D, g.plse);
				merge(o, ldo, a->Tq, l, po, NH * D, g.plse, B, c, NH, D);
			}
		if (s < N - 1)
			rc = wait_all(cp, rc);
	}
	return rc ? wait_all(cp, rc) : 0;
}

static int ring_backward(const loom__cp_t *cp, const loom__flash_t *a, float *dq, int lddq, float *dk, float *dv,
                         int lddk, const float *dout, int lddo, const float *out, int ldo, const float *lse)
{
	ring_bufs_t g = ring_bufs(cp, a);
	int rc = 0, N = cp->N, K = chunks(cp), B = a->B, Tl = a->Tq, c = Tl / K, NH = a->NH, KVD = a->NKV * a->D;
	int cur = 0;
	/* acc[cur]: the accumulator of the keys held (arrived with them; at step 0 this rank's share alone),
	 * acc[1 - cur] the one leaving; dkv[2] this step's share from step 1 on */
	float *acc[2] = {g.dkv[0], g.dkv[1]};
	pack_kv(g.kv[0], a, K);
	for (int s = 0; s < N && rc == 0; s++) {
		int src = (cp->r - s + N) % N;
		float *held = g.kv[s % 2], *share = s == 0 ? acc[cur] : g.dkv[2];
		if (s < N - 1 && (rc = shift(cp, held, g.kv[(s + 1) % 2], g.pack)) != 0)
			break;
		memset(share, 0, sizeof(float) * g.pack);
		for (int hq = 0; hq < K; hq++)
			for (int hk = 0; hk < K; hk++) {
				if (!pair_sees(loom__cp_chunk(N, cp->r, hq), loom__cp_chunk(N, src, hk), c, a->W))
					continue;
				loom__flash_t f = ring_shape(cp, a, held, src, hq, hk);
				float *pk = share + (size_t)hk * B * c * 2 * KVD;
				size_t o = (size_t)hq * c;
				loom__flash_backward(&f, dq + o * lddq, lddq, pk, pk + KVD, 2 * KVD, dout + o * lddo, lddo,
				                     out + o * ldo, ldo, lse + o * B * NH, cp->scratch, cp->scratch_threads);
			}
		/* the keys' transfer and the accumulator of step s-1: both ran while this step computed */
		if ((rc = wait_all(cp, 0)) != 0)
			break;
		if (s > 0) {
			float *x = acc[cur];
#pragma omp parallel for simd schedule(static) if (g.pack >= 65536)
			for (size_t i = 0; i < g.pack; i++)
				x[i] += share[i];
		}
		/* pass the accumulator on to the next rank (the keys' next holder) and take the previous one's */
		if ((rc = shift(cp, acc[cur], acc[1 - cur], g.pack)) != 0)
			break;
		cur = 1 - cur;
	}
	if ((rc = wait_all(cp, rc)) != 0)
		return rc;
	/* acc[cur]: this rank's own keys' accumulator, home after N steps, in pack order */
	const float *own = acc[cur];
#pragma omp parallel for collapse(2) schedule(static) if (g.pack >= 65536)
	for (int b = 0; b < B; b++)
		for (int t = 0; t < Tl; t++) {
			int h = t / c, i = t % c;
			const float *x = own + (((size_t)h * B + b) * c + i) * 2 * KVD;
			float *y = dk + ((size_t)b * Tl + t) * lddk, *z = dv + ((size_t)b * Tl + t) * lddk;
#pragma omp simd
			for (int d = 0; d < KVD; d++) {
				y[d] += x[d];
				z[d] += x[KVD + d];
			}
		}
	return 0;
}

/* ---- the entry points ------------------------------------------------------------------------------ */

int loom__cp_ring_env(void)
{
	const char *e = getenv("LOOM_CP_ATTENTION");
	if (!e || !*e || strcmp(e, "ring") == 0)
		return 1;
	if (strcmp(e, "gather") == 0)
		return 0;
	loom_seterr(LOOM_EINVAL, "LOOM_CP_ATTENTION='%s': expected ring (the default) or gather", e);
	return -1;
}

int loom__cp_attention_forward(const loom__cp_t *cp, const loom__flash_t *a, float *out, int ldo, float *lse)
{
	return cp->ring ? ring_forward(cp, a, out, ldo, lse) : gather_forward(cp, a, out, ldo, lse);
}

int loom__cp_attention_backward(const loom__cp_t *cp, const loom__flash_t *a, float *dq, int lddq, float *dk,
                                float *dv, int lddk, const float *dout, int lddo, const float *out, int ldo,
                                const float *lse)
{
	return cp->ring ? ring_backward(cp, a, dq, lddq, dk, dv, lddk, dout, lddo, out, ldo, lse)
	                : gather_backward(cp, a, dq, lddq, dk, dv, lddk, dout, lddo, out, ldo, lse);
}
