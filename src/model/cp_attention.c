/* cp_attention.c: context-parallel attention (--cp N) on the fused kernel (flash.c), shared by both
 * families: the all-gather of keys and values of Llama 3's context parallelism.
 *
 * Layout (head-tail): a sequence of T positions is cut into 2N chunks of c = T/(2N); rank r of the
 * context-parallel group holds chunks r and 2N-1-r, so its Tl = 2c local rows of a sequence are
 * positions [r c, (r+1) c) then [(2N-1-r) c, (2N-r) c). Under the causal mask the keys a chunk sees
 * grow with its index, and every rank's pair sums to the same work.
 *
 * Forward: each rank packs the keys and values of its rows, (B, Tl, 2 KVD) as [k | v], into its part
 * of `parts`; the model's hook all-gathers the N parts (rank order); they are copied into position
 * order into `kv` (B, T, 2 KVD); then each local chunk's queries run the kernel over all T keys from
 * position 0 (qpos = the chunk's first position, kpos 0: the causal mask and the window skip every
 * key block the chunk does not see, so the work is the chunk's own, never T x T). Backward: the same
 * gather again (kv is scratch, shared by the layers), the kernel's backward gives dq for the local
 * rows (+=) and dK, dV for every key into `dkv`, which is copied back into rank order in `parts` and
 * reduce-scattered (summed): each rank adds the sum over the group of its own rows' dK, dV to dk, dv.
 *
 * Memory: the three scratch buffers are B T 2 KVD floats each (O(T), the whole sequence's keys and
 * values of one layer), plus the kernel's backward partials for T keys; nothing is kept per layer
 * beyond what the kernel keeps (out and lse of the local rows). Communication per layer: the forward
 * receives (N-1)/N of B T 2 KVD floats; the backward twice that (a gather and a reduce-scatter). */
#include <string.h>

#include "model/kernels.h"

/* The chunk of global index j (0..2N-1): its owner and its place (0 or 1) among the owner's two. */
static inline int chunk_owner(int N, int j)
{
	return j < N ? j : 2 * N - 1 - j;
}

static inline int chunk_half(int N, int j)
{
	return j < N ? 0 : 1;
}

size_t loom__cp_scratch_floats(int B, int T, int KVD)
{
	return 3 * 2 * (size_t)B * (size_t)T * (size_t)KVD;
}

void loom__cp_scratch_point(loom__cp_t *cp, float *mem, int B, int T, int KVD)
{
	size_t n = 2 * (size_t)B * (size_t)T * (size_t)KVD;
	cp->parts = mem, cp->kv = mem ? mem + n : NULL, cp->dkv = mem ? mem + 2 * n : NULL;
}

/* Copy rows between the rank-ordered parts (N of (B, Tl, w)) and position order (B, T, w): to_pos 1
 * gathers parts into pos, 0 scatters pos into parts. */
static void reorder(float *parts, float *pos, int N, int B, int Tl, size_t w, int to_pos)
{
	int c = Tl / 2, T = N * Tl;
	size_t part = (size_t)B * Tl * w;
#pragma omp parallel for collapse(2) schedule(static) if ((size_t)B * T * w >= 65536)
	for (int b = 0; b < B; b++)
		for (int j = 0; j < 2 * N; j++) {
			float *p = parts + (size_t)chunk_owner(N, j) * part + ((size_t)b * Tl + (size_t)chunk_half(N, j) * c) * w;
			float *q = pos + ((size_t)b * T + (size_t)j * c) * w;
			if (to_pos)
				memcpy(q, p, sizeof(float) * (size_t)c * w);
			else
				memcpy(p, q, sizeof(float) * (size_t)c * w);
		}
}

/* Every rank's keys and values in position order into cp->kv (B, T, 2 KVD). */
static int gather_kv(const loom__cp_t *cp, const loom__flash_t *a)
{
	int B = a->B, Tl = a->Tq, KVD = a->NKV * a->D;
	size_t w = 2 * (size_t)KVD, part = (size_t)B * Tl * w;
	float *mine = cp->parts + (size_t)cp->r * part;
#pragma omp parallel for schedule(static) if (part >= 65536)
	for (int n = 0; n < B * Tl; n++) {
		memcpy(mine + (size_t)n * w, a->k + (size_t)n * a->ldk, sizeof(float) * (size_t)KVD);
		memcpy(mine + (size_t)n * w + KVD, a->v + (size_t)n * a->ldk, sizeof(float) * (size_t)KVD);
	}
	int rc = cp->fn(cp->ctx, cp->parts, (size_t)cp->N * part, LOOM_TP_ALLGATHER);
	if (rc != 0)
		return rc;
	reorder(cp->parts, cp->kv, cp->N, B, Tl, w, 1);
	return 0;
}

/* The kernel's operands for local chunk h (0, 1) of a: its c queries where they lie among the Tl rows
 * of each sequence, against the T gathered keys. */
static loom__flash_t chunk_shape(const loom__cp_t *cp, const loom__flash_t *a, int h)
{
	int c = a->Tq / 2, KVD = a->NKV * a->D, j = h == 0 ? cp->r : 2 * cp->N - 1 - cp->r;
	loom__flash_t f = *a;
	f.q = a->q + (size_t)h * c * a->ldq;
	f.k = cp->kv, f.v = cp->kv + KVD, f.ldk = 2 * KVD;
	f.Tq = c, f.qbs = a->Tq, f.Tk = cp->N * a->Tq;
	f.qpos = j * c, f.kpos = 0;
	return f;
}

int loom__cp_attention_forward(const loom__cp_t *cp, const loom__flash_t *a, float *out, int ldo, float *lse)
{
	int rc, c = a->Tq / 2;
	if ((rc = gather_kv(cp, a)) != 0)
		return rc;
	for (int h = 0; h < 2; h++) {
		loom__flash_t f = chunk_shape(cp, a, h);
		loom__flash_forward(&f, out + (size_t)h * c * ldo, ldo, lse + (size_t)h * a->B * a->NH * c);
	}
	return 0;
}

int loom__cp_attention_backward(const loom__cp_t *cp, const loom__flash_t *a, float *dq, int lddq, float *dk,
                                float *dv, int lddk, const float *dout, int lddo, const float *out, int ldo,
                                const float *lse)
{
	int rc, B = a->B, Tl = a->Tq, c = Tl / 2, KVD = a->NKV * a->D, T = cp->N * Tl;
	size_t w = 2 * (size_t)KVD, part = (size_t)B * Tl * w;
	if ((rc = gather_kv(cp, a)) != 0)
		return rc;
	memset(cp->dkv, 0, sizeof(float) * (size_t)B * T * w);
	for (int h = 0; h < 2; h++) {
		loom__flash_t f = chunk_shape(cp, a, h);
		size_t o = (size_t)h * c;
		loom__flash_backward(&f, dq + o * lddq, lddq, cp->dkv, cp->dkv + KVD, (int)w, dout + o * lddo, lddo,
		                     out + o * ldo, ldo, lse + o * B * a->NH, cp->scratch, cp->scratch_threads);
	}
	reorder(cp->parts, cp->dkv, cp->N, B, Tl, w, 0);
	if ((rc = cp->fn(cp->ctx, cp->parts, (size_t)cp->N * part, LOOM_TP_REDUCE_SCATTER)) != 0)
		return rc;
	const float *mine = cp->parts + (size_t)cp->r * part;
#pragma omp parallel for schedule(static) if (part >= 65536)
	for (int n = 0; n < B * Tl; n++) {
		const float *g = mine + (size_t)n * w;
		float *x = dk + (size_t)n * lddk, *y = dv + (size_t)n * lddk;
#pragma omp simd
		for (int i = 0; i < KVD; i++) {
			x[i] += g[i];
			y[i] += g[KVD + i];
		}
	}
	return 0;
}
