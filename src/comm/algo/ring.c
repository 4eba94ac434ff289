/* ring.c: ring reduce-scatter, ring all-gather, and ring all-reduce (reduce-scatter, then
 * all-gather), each pipelined in segments.
 *
 * Rank r sends to r+1 and receives from r-1. The data is cut into size blocks; each block is cut
 * into segments of at most 4 MiB (LOOM_RING_SEG bytes, which must then be equal on every rank), and
 * the whole ring runs once per segment index j (segment j of every block), so a large message
 * streams through the ring in pieces that are still in cache when the all-gather forwards them, and
 * scratch stays small. Measured on 2 cores (2 ranks, 16-64 MiB): 4 MiB beats 1 MiB by 15-25% on
 * loom_comm_alloc buffers (in place, as DDP uses them, or not), where every step waits for the
 * neighbour's acknowledgement, and is within ~10% of it on ordinary buffers; 256 KiB is 1.5x slower.
 * Invariants: in the reduce-scatter, the block received at step s is one this rank has not touched
 * yet, so it is combined with this rank's original input (send), and the block sent at step s >= 1
 * is the one received at step s-1; after size-1 steps each rank holds one fully reduced block, and
 * every element was combined along one chain, so all ranks end with bit-identical results.
 * Messages are real even when empty (count 0 or count < size), so every rank takes part. */
#include <string.h>

#include "comm/algo/algo.h"
#include "comm/transport.h"

/* Elements per segment: loom_comm_ring_seg bytes (default 4 MiB, the same on every rank). */
static size_t seg_elems(loom_comm_t *c, size_t esz)
{
	size_t e = loom_comm_ring_seg(c) / esz;
	return e ? e : 1;
}

/* How a vector is cut: `balanced` splits count elements into n near-equal blocks (all-reduce);
 * with `vcount` block b has vcount[b] elements at voff[b] (the v-collectives); otherwise block b is
 * [b*count, (b+1)*count) (all-gather, reduce-scatter). Each block is cut into segments of seg
 * elements; `longest` is the longest block. */
typedef struct {
	int n, balanced;
	size_t count, seg;
	const size_t *vcount, *voff;
	size_t longest;
} layout_t;

static size_t blk_off(const layout_t *L, int b)
{
	if (L->vcount)
		return L->voff[b];
	return L->balanced ? loom_block_off(L->count, L->n, b) : (size_t)b * L->count;
}

static size_t blk_len(const layout_t *L, int b)
{
	if (L->vcount)
		return L->vcount[b];
	return L->balanced ? loom_block_len(L->count, L->n, b) : L->count;
}

static size_t num_segs(const layout_t *L)
{
	size_t longest = L->vcount ? L->longest : blk_len(L, 0); /* block 0 is never shorter than the others */
	size_t k = (longest + L->seg - 1) / L->seg;
	return k ? k : 1;
}

/* Segment j of block b: first element and length (0 past the end of the block). */
static void seg_of(const layout_t *L, int b, size_t j, size_t *off, size_t *len)
{
	size_t bl = blk_len(L, b), start = j * L->seg;
	*off = blk_off(L, b) + start;
	*len = start >= bl ? 0 : loom_zmin(bl - start, L->seg);
}

static int mod(int x, int n)
{
	return ((x % n) + n) % n;
}

int loom_ring_allreduce(loom_comm_t *c, const loom_coll_args_t *a)
{
	int n = loom_comm_size(c), r = loom_comm_rank(c);
	size_t esz = loom_dtype_size(a->dt);
	const char *send = a->send;
	char *recv = a->recv;
	loom_op_t op = loom_wire_op(a->op);
	if (n == 1) {
		if (send != recv && a->count)
			memmove(recv, send, a->count * esz);
		return LOOM_OK;
	}
	layout_t L = {n, 1, a->count, seg_elems(c, esz), NULL, NULL, 0};
	int right = mod(r + 1, n), left = mod(r - 1, n), rc;
	size_t segs = num_segs(&L), so, sl, ro, rl;
	for (size_t j = 0; j < segs; j++) {
		/* Reduce-scatter: afterwards this rank holds block r+1 fully reduced. */
		for (int s = 0; s < n - 1; s++) {
			seg_of(&L, mod(r - s, n), j, &so, &sl);
			seg_of(&L, mod(r - s - 1, n), j, &ro, &rl);
			const char *sp = (s == 0 ? send : recv) + so * esz;
			rc = loom_xp_sendrecv(c, right, sp, sl * esz, left, recv + ro * esz, rl * esz, send + ro * esz,
			                      a->dt, op);
			if (rc)
				return rc;
		}
		if (a->op == LOOM_AVG) {
			seg_of(&L, mod(r + 1, n), j, &so, &sl);
			loom_scale_local(recv + so * esz, sl, a->dt, n);
		}
		/* All-gather: pass the reduced blocks around. */
		for (int s = 0; s < n - 1; s++) {
			seg_of(&L, mod(r + 1 - s, n), j, &so, &sl);
			seg_of(&L, mod(r - s, n), j, &ro, &rl);
			rc = loom_xp_sendrecv(c, right, recv + so * esz, sl * esz, left, recv + ro * esz, rl * esz, NULL,
			                      a->dt, op);
			if (rc)
				return rc;
		}
	}
	return LOOM_OK;
}

/* Reduce-scatter over layout L (equal or v blocks); this rank's block lands at recv. */
static int reduce_scatter(loom_comm_t *c, const loom_coll_args_t *a, layout_t *L)
{
	int n = L->n, r = loom_comm_rank(c);
	size_t esz = loom_dtype_size(a->dt), mine = blk_off(L, r), longest = L->vcount ? L->longest : L->count;
	const char *send = a->send;
	char *recv = a->recv;
	loom_op_t op = loom_wire_op(a->op);
	size_t seg = loom_zmin(L->seg, longest ? longest : 1);
	/* tmp[0], tmp[1]: partial sums in flight (ping-pong); tmp[2]: landing place for the last step
	 * when it would overwrite the block this rank is sending (in place, 2 ranks), or partly overlap
	 * its own input (in place with uneven blocks). */
	char *tmp = loom_comm_scratch(c, 0, 3 * seg * esz);
	if (!tmp)
		return loom_comm_fail(c, LOOM_ENOMEM, "reduce_scatter: no scratch memory for %zu bytes", 3 * seg * esz);
	int right = mod(r + 1, n), left = mod(r - 1, n), rc;
	size_t segs = num_segs(L), so, sl, ro, rl;
	for (size_t j = 0; j < segs; j++) {
		for (int s = 0; s < n - 1; s++) {
			int last = s == n - 2;
			seg_of(L, mod(r - s - 1, n), j, &so, &sl);
			seg_of(L, mod(r - s - 2, n), j, &ro, &rl);
			const char *sp = s == 0 ? send + so * esz : tmp + (size_t)((s - 1) % 2) * seg * esz;
			const char *red = send + ro * esz;
			char *out = last ? recv + (ro - mine) * esz : NULL;
			char *dst = last ? out : tmp + (size_t)(s % 2) * seg * esz;
			if (last && (loom_overlaps(dst, rl * esz, sp, sl * esz) ||
			             (dst != red && loom_overlaps(dst, rl * esz, red, rl * esz))))
				dst = tmp + 2 * seg * esz;
			rc = loom_xp_sendrecv(c, right, sp, sl * esz, left, dst, rl * esz, red, a->dt, op);
			if (rc)
				return rc;
			if (last && dst != out && rl)
				memcpy(out, dst, rl * esz);
			if (last && a->op == LOOM_AVG)
				loom_scale_local(out, rl, a->dt, n);
		}
	}
	return LOOM_OK;
}

int loom_ring_reduce_scatter(loom_comm_t *c, const loom_coll_args_t *a)
{
	int n = loom_comm_size(c);
	size_t esz = loom_dtype_size(a->dt);
	if (n == 1) {
		if (a->send != a->recv && a->count)
			memmove(a->recv, a->send, a->count * esz);
		return LOOM_OK;
	}
	layout_t L = {n, 0, a->count, seg_elems(c, esz), NULL, NULL, 0};
	return reduce_scatter(c, a, &L);
}

/* All-gather over layout L; this rank's block is already in place in recv. */
static int allgather(loom_comm_t *c, const loom_coll_args_t *a, const layout_t *L)
{
	int n = L->n, r = loom_comm_rank(c);
	size_t esz = loom_dtype_size(a->dt);
	char *recv = a->recv;
	int right = mod(r + 1, n), left = mod(r - 1, n), rc;
	size_t segs = num_segs(L), so, sl, ro, rl;
	for (size_t j = 0; j < segs; j++) {
		for (int s = 0; s < n - 1; s++) {
			seg_of(L, mod(r - s, n), j, &so, &sl);
			seg_of(L, mod(r - s - 1, n), j, &ro, &rl);
			rc = loom_xp_sendrecv(c, right, recv + so * esz, sl * esz, left, recv + ro * esz, rl * esz, NULL,
			                      a->dt, LOOM_SUM);
			if (rc)
				return rc;
		}
	}
	return LOOM_OK;
}

int loom_ring_allgather(loom_comm_t *c, const loom_coll_args_t *a)
{
	int n = loom_comm_size(c), r = loom_comm_rank(c);
	size_t esz = loom_dtype_size(a->dt), count = a->count;
	char *mine = (char *)a->recv + (size_t)r * count * esz;
	if ((const char *)a->send != mine && count)
		memmove(mine, a->send, count * esz);
	if (n == 1)
		return LOOM_OK;
	layout_t L = {n, 0, count, seg_elems(c, esz), NULL, NULL, 0};
	return allgather(c, a, &L);
}

/* The v-layout: offsets are prefix sums of the counts (scratch slot 1 holds them). */
static int v_layout(loom_comm_t *c, const loom_coll_args_t *a, layout_t *L)
{
	int n = loom_comm_size(c);
	size_t *off = loom_comm_scratch(c, 1, (size_t)n * sizeof *off), sum = 0, longest = 0;
	if (!off)
		return loom_comm_fail(c, LOOM_ENOMEM, "%s: no scratch memory for %d offsets", loom_coll_name(a->coll), n);
	for (int q = 0; q < n; q++) {
		off[q] = sum;
		sum += a->counts[q];
		longest = a->counts[q] > longest ? a->counts[q] : longest;
	}
	*L = (layout_t){n, 0, 0, seg_elems(c, loom_dtype_size(a->dt)), a->counts, off, longest};
	return LOOM_OK;
}

int loom_ring_allgatherv(loom_comm_t *c, const loom_coll_args_t *a)
{
	int r = loom_comm_rank(c), rc;
	size_t esz = loom_dtype_size(a->dt);
	layout_t L;
	char *mine;
	if ((rc = v_layout(c, a, &L)) != LOOM_OK)
		return rc;
	mine = (char *)a->recv + L.voff[r] * esz;
	if ((const char *)a->send != mine && a->counts[r])
		memmove(mine, a->send, a->counts[r] * esz);
	return L.n == 1 ? LOOM_OK : allgather(c, a, &L);
}

int loom_ring_reduce_scatterv(loom_comm_t *c, const loom_coll_args_t *a)
{
	int rc;
	size_t esz = loom_dtype_size(a->dt);
	layout_t L;
	if ((rc = v_layout(c, a, &L)) != LOOM_OK)
		return rc;
	if (L.n == 1) {
		if (a->send != a->recv && a->counts[0])
			memmove(a->recv, a->send, a->counts[0] * esz);
		return LOOM_OK;
	}
	return reduce_scatter(c, a, &L);
}
