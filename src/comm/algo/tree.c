/* tree.c: binomial-tree broadcast and reduce (any root), all-reduce as reduce-then-broadcast, and a
 * tree barrier.
 *
 * Ranks are renumbered relative to the root (v = (r - root) mod n). In the binomial tree the parent
 * of v is v without its lowest set bit, and the children of v are v + m for every power of two m
 * below v's lowest set bit (below n for the root), largest subtree first. Large buffers go through
 * the tree in segments, so a rank forwards segment k while its parent already sends segment k+1.
 * reduce assumes a commutative op (all of loom's are); its result exists on the root only, and the
 * recv buffer of other ranks is never touched (their partial sums live in scratch). */
#include <string.h>

#include "comm/algo/algo.h"
#include "comm/transport.h"

#define TREE_SEG (512u << 10) /* bytes per pipelined segment */

static int lowbit_or(int v, int n)
{
	if (v)
		return v & -v;
	int m = 1;
	while (m < n)
		m *= 2;
	return m;
}

int loom_tree_broadcast(loom_comm_t *c, const loom_coll_args_t *a)
{
	int n = loom_comm_size(c), r = loom_comm_rank(c), rc;
	int v = (r - a->root + n) % n, low = lowbit_or(v, n);
	size_t esz = loom_dtype_size(a->dt), bytes = a->count * esz;
	size_t seg = TREE_SEG / esz * esz;
	char *buf = a->recv;
	if (n == 1)
		return LOOM_OK;
	size_t off = 0;
	do {
		size_t len = loom_zmin(seg, bytes - off);
		if (v && (rc = loom_xp_sendrecv(c, -1, NULL, 0, (v - low + a->root) % n, buf + off, len, NULL, a->dt,
		                                LOOM_SUM)))
			return rc;
		for (int m = low / 2; m >= 1; m /= 2)
			if (v + m < n && (rc = loom_xp_sendrecv(c, (v + m + a->root) % n, buf + off, len, -1, NULL, 0, NULL,
			                                        a->dt, LOOM_SUM)))
				return rc;
		off += len;
	} while (off < bytes);
	return LOOM_OK;
}

int loom_tree_reduce(loom_comm_t *c, const loom_coll_args_t *a)
{
	int n = loom_comm_size(c), r = loom_comm_rank(c), rc;
	int v = (r - a->root + n) % n;
	size_t esz = loom_dtype_size(a->dt), bytes = a->count * esz;
	size_t seg = TREE_SEG / esz * esz;
	const char *send = a->send;
	char *acc = a->recv; /* the root accumulates in place; the others in scratch */
	loom_op_t op = loom_wire_op(a->op);
	if (v != 0 && v + 1 < n && (v & 1) == 0) { /* an inner node: it has children */
		if (!(acc = loom_comm_scratch(c, 0, loom_zmin(seg, bytes) + 1)))
			return loom_comm_fail(c, LOOM_ENOMEM, "reduce: no scratch memory for %zu bytes", seg);
	}
	size_t off = 0;
	do {
		size_t len = loom_zmin(seg, bytes - off);
		char *dst = v == 0 ? acc + off : acc; /* scratch holds one segment */
		const char *have = send + off;        /* the partial sum so far */
		for (int m = 1; m < n; m *= 2) {
			if (v & m) {
				if ((rc = loom_xp_sendrecv(c, (v - m + a->root) % n, have, len, -1, NULL, 0, NULL, a->dt, op)))
					return rc;
				break;
			}
			if (v + m < n) {
				if ((rc = loom_xp_sendrecv(c, -1, NULL, 0, (v + m + a->root) % n, dst, len, have, a->dt, op)))
					return rc;
				have = dst;
			}
		}
		if (v == 0) {
			if (have != dst && len)
				memmove(dst, have, len);
			if (a->op == LOOM_AVG)
				loom_scale_local(dst, len / esz, a->dt, n);
		}
		off += len;
	} while (off < bytes);
	return LOOM_OK;
}

int loom_tree_allreduce(loom_comm_t *c, const loom_coll_args_t *a)
{
	loom_coll_args_t red = *a, bc = *a;
	red.coll = LOOM_COLL_REDUCE, red.root = 0;
	bc.coll = LOOM_COLL_BROADCAST, bc.root = 0, bc.send = a->recv;
	int rc = loom_tree_reduce(c, &red);
	return rc ? rc : loom_tree_broadcast(c, &bc);
}

int loom_tree_barrier(loom_comm_t *c, const loom_coll_args_t *a)
{
	(void)a;
	int n = loom_comm_size(c), r = loom_comm_rank(c), rc;
	char token = 0, sink;
	/* Up the tree to rank 0, then back down. */
	for (int m = 1; m < n; m *= 2) {
		if (r & m) {
			if ((rc = loom_xp_sendrecv(c, r - m, &token, 0, -1, NULL, 0, NULL, LOOM_INT32, LOOM_SUM)))
				return rc;
			break;
		}
		if (r + m < n && (rc = loom_xp_sendrecv(c, -1, NULL, 0, r + m, &sink, 0, NULL, LOOM_INT32, LOOM_SUM)))
			return rc;
	}
	int low = lowbit_or(r, n);
	if (r && (rc = loom_xp_sendrecv(c, -1, NULL, 0, r - low, &sink, 0, NULL, LOOM_INT32, LOOM_SUM)))
		return rc;
	for (int m = low / 2; m >= 1; m /= 2)
		if (r + m < n && (rc = loom_xp_sendrecv(c, r + m, &token, 0, -1, NULL, 0, NULL, LOOM_INT32, LOOM_SUM)))
			return rc;
	return LOOM_OK;
}
