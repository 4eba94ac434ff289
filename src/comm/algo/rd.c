/* rd.c: recursive doubling all-reduce and all-gather (latency-bound, for small messages), and the
 * dissemination barrier (recursive doubling's generalization to any rank count).
 *
 * Rank counts that are not a power of two are folded (algo.h, loom_fold_*): even ranks r < 2*rem
 * hand their data to r+1 first and receive the finished result last. Among the p virtual ranks,
 * step `mask` (1, 2, 4, ...) exchanges everything a rank has with virtual partner v ^ mask, so
 * log2(p) steps suffice. In the all-reduce both partners combine the same two partial sums
 * (addition is commutative), so all ranks end bit-identical. The all-reduce ping-pongs between
 * recv and a scratch buffer, because the transport forbids receiving into the buffer being sent. */
#include <string.h>

#include "comm/algo/algo.h"
#include "comm/transport.h"

int loom_rd_allreduce(loom_comm_t *c, const loom_coll_args_t *a)
{
	int n = loom_comm_size(c), r = loom_comm_rank(c), rc;
	size_t esz = loom_dtype_size(a->dt), bytes = a->count * esz;
	const char *x = a->send; /* where the current partial sum lives */
	char *recv = a->recv;
	loom_op_t op = loom_wire_op(a->op);
	int p = loom_pow2_floor(n), rem = n - p, v = loom_fold_vrank(r, rem);
	if (v < 0) {
		if ((rc = loom_xp_sendrecv(c, r + 1, x, bytes, -1, NULL, 0, NULL, a->dt, op)))
			return rc;
		return loom_xp_sendrecv(c, -1, NULL, 0, r + 1, recv, bytes, NULL, a->dt, op);
	}
	if (r < 2 * rem) {
		if ((rc = loom_xp_sendrecv(c, -1, NULL, 0, r - 1, recv, bytes, x, a->dt, op)))
			return rc;
		x = recv;
	}
	char *tmp = NULL;
	for (int mask = 1; mask < p; mask *= 2) {
		int partner = loom_fold_real(v ^ mask, rem);
		if (x == recv && !tmp && !(tmp = loom_comm_scratch(c, 0, bytes ? bytes : 1)))
			return loom_comm_fail(c, LOOM_ENOMEM, "allreduce: no scratch memory for %zu bytes", bytes);
		char *y = x == recv ? tmp : recv;
		if ((rc = loom_xp_sendrecv(c, partner, x, bytes, partner, y, bytes, x, a->dt, op)))
			return rc;
		x = y;
	}
	if (x != recv && bytes)
		memmove(recv, x, bytes);
	if (a->op == LOOM_AVG)
		loom_scale_local(recv, a->count, a->dt, n);
	if (r < 2 * rem)
		return loom_xp_sendrecv(c, r - 1, recv, bytes, -1, NULL, 0, NULL, a->dt, op);
	return LOOM_OK;
}

int loom_rd_allgather(loom_comm_t *c, const loom_coll_args_t *a)
{
	int n = loom_comm_size(c), r = loom_comm_rank(c), rc;
	size_t esz = loom_dtype_size(a->dt), blk = a->count * esz;
	char *recv = a->recv, *mine = recv + (size_t)r * blk;
	if ((const char *)a->send != mine && blk)
		memmove(mine, a->send, blk);
	int p = loom_pow2_floor(n), rem = n - p, v = loom_fold_vrank(r, rem);
	if (v < 0) {
		if ((rc = loom_xp_sendrecv(c, r + 1, mine, blk, -1, NULL, 0, NULL, a->dt, LOOM_SUM)))
			return rc;
		return loom_xp_sendrecv(c, -1, NULL, 0, r + 1, recv, (size_t)n * blk, NULL, a->dt, LOOM_SUM);
	}
	if (r < 2 * rem && (rc = loom_xp_sendrecv(c, -1, NULL, 0, r - 1, mine - blk, blk, NULL, a->dt, LOOM_SUM)))
		return rc;
	/* Virtual rank v holds the real blocks [first_block(lo), first_block(lo + mask)) of its range. */
	for (int mask = 1; mask < p; mask *= 2) {
		int pv = v ^ mask, partner = loom_fold_real(pv, rem);
		int mlo = v & ~(mask - 1), plo = pv & ~(mask - 1);
		size_t mo = (size_t)loom_fold_first_block(mlo, rem) * blk;
		size_t ml = (size_t)loom_fold_first_block(mlo + mask, rem) * blk - mo;
		size_t po = (size_t)loom_fold_first_block(plo, rem) * blk;
		size_t pl = (size_t)loom_fold_first_block(plo + mask, rem) * blk - po;
		rc = loom_xp_sendrecv(c, partner, recv + mo, ml, partner, recv + po, pl, NULL, a->dt, LOOM_SUM);
		if (rc)
			return rc;
	}
	if (r < 2 * rem)
		return loom_xp_sendrecv(c, r - 1, recv, (size_t)n * blk, -1, NULL, 0, NULL, a->dt, LOOM_SUM);
	return LOOM_OK;
}

int loom_rd_barrier(loom_comm_t *c, const loom_coll_args_t *a)
{
	(void)a;
	int n = loom_comm_size(c), r = loom_comm_rank(c), rc;
	char token = 0, sink;
	/* Round k: signal r + k, wait for r - k. After ceil(log2 n) rounds everyone has heard
	 * (indirectly) from everyone. */
	for (int k = 1; k < n; k *= 2)
		if ((rc = loom_xp_sendrecv(c, (r + k) % n, &token, 0, (r - k + n) % n, &sink, 0, NULL, LOOM_INT32,
		                           LOOM_SUM)))
			return rc;
	return LOOM_OK;
}
