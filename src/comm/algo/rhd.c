/* rhd.c: recursive halving-doubling (Rabenseifner): all-reduce as a reduce-scatter by recursive
 * halving followed by an all-gather by recursive doubling, and the reduce-scatter alone.
 *
 * Any rank count: ranks beyond the largest power of two p are folded in first (algo.h,
 * loom_fold_*): even ranks r < 2*rem hand their whole vector to r+1 and get the result back at the
 * end. Among the p virtual ranks, the step with distance `mask` (p/2, p/4, ..., 1) splits the
 * range of virtual blocks a rank is responsible for in two, keeps the half containing its own
 * virtual rank and sends the other half to partner v ^ mask; after log2(p) steps virtual rank v holds
 * virtual block v fully reduced. Both partners of a step combine the same two partial sums, and
 * addition is commutative, so every rank ends with bit-identical results.
 * All-reduce: the p virtual blocks split the vector evenly. Reduce-scatter: virtual rank v stands
 * for the contiguous real blocks of the ranks it represents (two for a folded pair), partial sums
 * live in scratch, and the folded partner's block is handed back at the end. */
#include <string.h>

#include "comm/algo/algo.h"
#include "comm/transport.h"

int loom_rhd_allreduce(loom_comm_t *c, const loom_coll_args_t *a)
{
	int n = loom_comm_size(c), r = loom_comm_rank(c), rc;
	size_t esz = loom_dtype_size(a->dt), count = a->count, bytes = count * esz;
	const char *send = a->send, *cur = send;
	char *recv = a->recv;
	loom_op_t op = loom_wire_op(a->op);
	if (n == 1) {
		if (send != recv && bytes)
			memmove(recv, send, bytes);
		return LOOM_OK;
	}
	int p = loom_pow2_floor(n), rem = n - p, v = loom_fold_vrank(r, rem);
	if (v < 0) { /* folded out: contribute, then receive the result */
		if ((rc = loom_xp_sendrecv(c, r + 1, send, bytes, -1, NULL, 0, NULL, a->dt, op)))
			return rc;
		return loom_xp_sendrecv(c, -1, NULL, 0, r + 1, recv, bytes, NULL, a->dt, op);
	}
	if (r < 2 * rem) {
		if ((rc = loom_xp_sendrecv(c, -1, NULL, 0, r - 1, recv, bytes, send, a->dt, op)))
			return rc;
		cur = recv;
	}
	/* Recursive halving over virtual blocks [lo, hi); the data sits in cur until first written. */
	int lo = 0, hi = p;
	for (int mask = p / 2; mask >= 1; mask /= 2) {
		int partner = loom_fold_real(v ^ mask, rem), mid = lo + mask;
		int klo = (v & mask) ? mid : lo, khi = (v & mask) ? hi : mid;
		int glo = (v & mask) ? lo : mid, ghi = (v & mask) ? mid : hi;
		size_t ko = loom_block_off(count, p, klo), kl = loom_block_off(count, p, khi) - ko;
		size_t go = loom_block_off(count, p, glo), gl = loom_block_off(count, p, ghi) - go;
		rc = loom_xp_sendrecv(c, partner, cur + go * esz, gl * esz, partner, recv + ko * esz, kl * esz,
		                      cur + ko * esz, a->dt, op);
		if (rc)
			return rc;
		cur = recv;
		lo = klo, hi = khi;
	}
	if (a->op == LOOM_AVG)
		loom_scale_local(recv + loom_block_off(count, p, v) * esz, loom_block_len(count, p, v), a->dt, n);
	/* Recursive doubling: exchange the aligned ranges of size mask held by the two partners. */
	for (int mask = 1; mask < p; mask *= 2) {
		int partner_v = v ^ mask, partner = loom_fold_real(partner_v, rem);
		int mlo = v & ~(mask - 1), plo = partner_v & ~(mask - 1);
		size_t mo = loom_block_off(count, p, mlo), ml = loom_block_off(count, p, mlo + mask) - mo;
		size_t po = loom_block_off(count, p, plo), pl = loom_block_off(count, p, plo + mask) - po;
		rc = loom_xp_sendrecv(c, partner, recv + mo * esz, ml * esz, partner, recv + po * esz, pl * esz, NULL,
		                      a->dt, op);
		if (rc)
			return rc;
	}
	if (r < 2 * rem) /* hand the result to the folded-out partner */
		return loom_xp_sendrecv(c, r - 1, recv, bytes, -1, NULL, 0, NULL, a->dt, op);
	return LOOM_OK;
}

int loom_rhd_reduce_scatter(loom_comm_t *c, const loom_coll_args_t *a)
{
	int n = loom_comm_size(c), r = loom_comm_rank(c), rc;
	size_t esz = loom_dtype_size(a->dt), count = a->count, blk = count * esz;
	const char *send = a->send, *cur = send;
	char *recv = a->recv;
	loom_op_t op = loom_wire_op(a->op);
	if (n == 1) {
		if (send != recv && blk)
			memmove(recv, send, blk);
		return LOOM_OK;
	}
	int p = loom_pow2_floor(n), rem = n - p, v = loom_fold_vrank(r, rem);
	if (v < 0) {
		if ((rc = loom_xp_sendrecv(c, r + 1, send, (size_t)n * blk, -1, NULL, 0, NULL, a->dt, op)))
			return rc;
		return loom_xp_sendrecv(c, -1, NULL, 0, r + 1, recv, blk, NULL, a->dt, op);
	}
	/* Partial sums live in w, indexed like send (block b at b*count). */
	size_t wbytes = (size_t)n * blk;
	char *w = loom_comm_scratch(c, 0, wbytes ? wbytes : 1);
	if (!w)
		return loom_comm_fail(c, LOOM_ENOMEM, "reduce_scatter: no scratch memory for %zu bytes", wbytes);
	if (r < 2 * rem) {
		if ((rc = loom_xp_sendrecv(c, -1, NULL, 0, r - 1, w, (size_t)n * blk, send, a->dt, op)))
			return rc;
		cur = w;
	}
	/* Where this rank's block ends up: straight in recv when the last step keeps only that block
	 * and recv overlaps neither what is sent nor (unless equal) the local operand; else in w. */
	char *mine = w + (size_t)r * blk;
	int lo = 0, hi = p;
	for (int mask = p / 2; mask >= 1; mask /= 2) {
		int partner = loom_fold_real(v ^ mask, rem), mid = lo + mask;
		int klo = (v & mask) ? mid : lo, khi = (v & mask) ? hi : mid;
		int glo = (v & mask) ? lo : mid, ghi = (v & mask) ? mid : hi;
		size_t ko = (size_t)loom_fold_first_block(klo, rem) * blk;
		size_t kl = (size_t)loom_fold_first_block(khi, rem) * blk - ko;
		size_t go = (size_t)loom_fold_first_block(glo, rem) * blk;
		size_t gl = (size_t)loom_fold_first_block(ghi, rem) * blk - go;
		char *dst = w + ko;
		if (mask == 1 && kl == blk && !loom_overlaps(recv, blk, cur + go, gl) &&
		    (recv == cur + ko || !loom_overlaps(recv, blk, cur + ko, kl)))
			dst = mine = recv;
		rc = loom_xp_sendrecv(c, partner, cur + go, gl, partner, dst, kl, cur + ko, a->dt, op);
		if (rc)
			return rc;
		cur = w;
		lo = klo, hi = khi;
	}
	if (a->op == LOOM_AVG) { /* this rank's block, and the folded-out partner's */
		loom_scale_local(mine, count, a->dt, n);
		if (r < 2 * rem)
			loom_scale_local(w + (size_t)(r - 1) * blk, count, a->dt, n);
	}
	if (r < 2 * rem) {
		if ((rc = loom_xp_sendrecv(c, r - 1, w + (size_t)(r - 1) * blk, blk, -1, NULL, 0, NULL, a->dt, op)))
			return rc;
	}
	if (mine != recv && blk)
		memcpy(recv, mine, blk);
	return LOOM_OK;
}
