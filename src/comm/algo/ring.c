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
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "comm/algo/algo.h"
#include "comm/transport.h"

/* Default segment size; LOOM_RING_SEG (bytes, for tuning; the same on every rank) overrides it. */
#define RING_SEG_DEFAULT (4u << 20)

static size_t seg_elems(size_t esz)
{
	static _Atomic size_t seg_bytes; /* read once; every thread computes the same value */
	size_t b = atomic_load_explicit(&seg_bytes, memory_order_relaxed);
	if (!b) {
		const char *s = getenv("LOOM_RING_SEG");
		long v = s ? atol(s) : 0;
		b = v >= 64 ? (size_t)v : RING_SEG_DEFAULT;
		atomic_store_explicit(&seg_bytes, b, memory_order_relaxed);
	}
	size_t e = b / esz;
	return e ? e : 1;
}

/* How a vector is cut: `balanced` splits count elements into n near-equal blocks (all-reduce);
 * otherwise block b is [b*count, (b+1)*count) (all-gather, reduce-scatter). Each block is cut
 * into segments of seg elements. */
typedef struct {
	int n, balanced;
	size_t count, seg;
} layout_t;

static size_t blk_off(const layout_t *L, int b)
{
	return L->balanced ? loom_block_off(L->count, L->n, b) : (size_t)b * L->count;
}

static size_t blk_len(const layout_t *L, int b)
{
	return L->balanced ? loom_block_len(L->count, L->n, b) : L->count;
}

static size_t num_segs(const layout_t *L)
{
	size_t longest = blk_len(L, 0); /* block 0 is never shorter than the others */
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
	layout_t L = {n, 1, a->count, seg_elems(esz)};
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

int loom_ring_reduce_scatter(loom_comm_t *c, const loom_coll_args_t *a)
{
	int n = loom_comm_size(c), r = loom_comm_rank(c);
	size_t esz = loom_dtype_size(a->dt), count = a->count;
	const char *send = a->send;
	char *recv = a->recv;
	loom_op_t op = loom_wire_op(a->op);
	if (n == 1) {
		if (send != recv && count)
			memmove(recv, send, count * esz);
		return LOOM_OK;
	}
	layout_t L = {n, 0, count, seg_elems(esz)};
	size_t seg = loom_zmin(L.seg, count ? count : 1);
	/* tmp[0], tmp[1]: partial sums in flight (ping-pong); tmp[2]: landing place for the last step
	 * when it would overwrite the block this rank is sending (in place, 2 ranks). */
	char *tmp = loom_comm_scratch(c, 0, 3 * seg * esz);
	if (!tmp)
		return loom_comm_fail(c, LOOM_ENOMEM, "reduce_scatter: no scratch memory for %zu bytes", 3 * seg * esz);
	int right = mod(r + 1, n), left = mod(r - 1, n), rc;
	size_t segs = num_segs(&L), so, sl, ro, rl;
	for (size_t j = 0; j < segs; j++) {
		for (int s = 0; s < n - 1; s++) {
			int last = s == n - 2;
			seg_of(&L, mod(r - s - 1, n), j, &so, &sl);
			seg_of(&L, mod(r - s - 2, n), j, &ro, &rl);
			const char *sp = s == 0 ? send + so * esz : tmp + (size_t)((s - 1) % 2) * seg * esz;
			char *dst = last ? recv + (ro - (size_t)r * count) * esz : tmp + (size_t)(s % 2) * seg * esz;
			if (last && loom_overlaps(dst, rl * esz, sp, sl * esz))
				dst = tmp + 2 * seg * esz;
			rc = loom_xp_sendrecv(c, right, sp, sl * esz, left, dst, rl * esz, send + ro * esz, a->dt, op);
			if (rc)
				return rc;
			if (last && dst == tmp + 2 * seg * esz)
				memcpy(recv + (ro - (size_t)r * count) * esz, dst, rl * esz);
			if (last && a->op == LOOM_AVG)
				loom_scale_local(recv + (ro - (size_t)r * count) * esz, rl, a->dt, n);
		}
	}
	return LOOM_OK;
}

int loom_ring_allgather(loom_comm_t *c, const loom_coll_args_t *a)
{
	int n = loom_comm_size(c), r = loom_comm_rank(c);
	size_t esz = loom_dtype_size(a->dt), count = a->count;
	char *recv = a->recv;
	char *mine = recv + (size_t)r * count * esz;
	if ((const char *)a->send != mine && count)
		memmove(mine, a->send, count * esz);
	if (n == 1)
		return LOOM_OK;
	layout_t L = {n, 0, count, seg_elems(esz)};
	int right = mod(r + 1, n), left = mod(r - 1, n), rc;
	size_t segs = num_segs(&L), so, sl, ro, rl;
	for (size_t j = 0; j < segs; j++) {
		for (int s = 0; s < n - 1; s++) {
			seg_of(&L, mod(r - s, n), j, &so, &sl);
			seg_of(&L, mod(r - s - 1, n), j, &ro, &rl);
			rc = loom_xp_sendrecv(c, right, recv + so * esz, sl * esz, left, recv + ro * esz, rl * esz, NULL,
			                      a->dt, LOOM_SUM);
			if (rc)
				return rc;
		}
	}
	return LOOM_OK;
}
