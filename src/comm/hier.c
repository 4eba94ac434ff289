/* hier.c: communicators whose ranks are on several hosts, and their hierarchical collectives.
 *
 * Such a communicator talks to its peers over MPI (its transport), and keeps two hidden
 * communicators: hlocal, the members on this host, over shared memory (3-4x faster than MPI inside
 * a machine), and hcross, the members whose index on their host equals this rank's, one per host,
 * over MPI. hcross exists only when every host holds the same number L of members; then
 *   all-reduce = with two hosts, pipelined in chunks: reduce-scatter of chunk k on hlocal, an
 *                exchange of this rank's piece with its hcross peer left in flight over MPI, and
 *                the all-gather of chunk k PIPE_DEPTH chunks later (allreduce_pipe); with more,
 *                reduce-scatter on hlocal (slice j of count/L to local rank j), all-reduce of the
 *                slice on hcross (loom's selection rule over the MPI transport), all-gather on hlocal;
 *   broadcast  = broadcast on the root's hcross (among the ranks with the root's local index), then
 *                on every hlocal from that index;
 *   reduce     = reduce on hlocal to the root's local index, then on that index's hcross to the root;
 * the other collectives run loom's algorithms directly over MPI. Invariants: hidx/hcrank describe
 * every member of c; the inner communicators run their collectives with their own sequence numbers
 * in the same order on every member, because every member of c runs the same phases in order. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "core/util.h"

#ifdef LOOM_HAVE_MPI

static int host_of(const loom_comm_t *c, int r)
{
	return c->host_of[c->world_of[r]];
}

/* A failure of an inner communicator, recorded on c, with the inner ranks translated (the inner
 * message numbers ranks within it). */
static int inner_fail(loom_comm_t *c, loom_comm_t *in, int rc)
{
	char map[256];
	size_t len = 0;
	map[0] = '\0';
	for (int r = 0; r < in->size && len + 24 < sizeof map; r++) {
		int w = -1;
		for (int q = 0; q < c->size && w < 0; q++) /* in's members are ranks of c, in order */
			if (in == c->hlocal ? host_of(c, q) == host_of(c, c->rank) && c->hidx[q] == r
			                    : c->hidx[q] == c->hidx[c->rank] && c->hcrank[q] == r)
				w = c->world_of[q];
		len += (size_t)snprintf(map + len, sizeof map - len, "%s%d", r ? ", " : "", w);
	}
	return loom_comm_fail(c, rc, "%s (in the %s group, whose ranks 0.. are world ranks %s)",
	                      loom_comm_errmsg(in)[0] ? loom_comm_errmsg(in) : loom_errmsg(),
	                      in == c->hlocal ? "same-host" : "cross-host", map);
}

/* An inner communicator of c with members m[0..n) (ranks of c), settings copied from c. */
static loom_comm_t *inner_new(loom_comm_t *c, const int *m, int n, int me, int shm)
{
	loom_comm_t *in = loom__comm_new(me, n);
	if (!in)
		return NULL;
	for (int i = 0; i < n; i++)
		in->world_of[i] = shm ? c->lrank_of[c->world_of[m[i]]] : c->world_of[m[i]];
	in->local_rank = me;
	in->timeout_s = c->timeout_s;
	in->world_gen = c->world_gen, in->world_size = c->world_size;
	in->ring_seg = c->ring_seg, in->inplace_min = c->inplace_min;
	memcpy(in->forced, c->forced, sizeof c->forced);
	memcpy(in->algo_spec, c->algo_spec, sizeof c->algo_spec);
	if (!shm) {
		in->xp.ops = &loom__xport_mpi;
		in->host_of = c->host_of, in->lrank_of = c->lrank_of;
	}
	return in;
}

int loom__hier_build(loom_comm_t *c, loom_comm_t *plocal, size_t heap_bytes, const loom_xp_ctx_t *ctx)
{
	int n = c->size, myhost = host_of(c, c->rank), *m = NULL, nl = 0, me = 0, rc = LOOM_OK, uniform = 1;
	int *per = NULL, nh = 0;
	char name[sizeof c->name];
	loom_opctx_t saved = loom_cur;
	c->hidx = loom__calloc((size_t)n, sizeof *c->hidx);
	c->hcrank = loom__calloc((size_t)n, sizeof *c->hcrank);
	m = loom__calloc((size_t)n, sizeof *m);
	per = loom__calloc((size_t)c->world_size, sizeof *per); /* members per host (hosts < world size) */
	if (!c->hidx || !c->hcrank || !m || !per) {
		rc = loom_comm_fail(c, LOOM_ENOMEM, "out of memory");
		goto done;
	}
	for (int r = 0; r < n; r++) {
		int h = host_of(c, r);
		c->hidx[r] = per[h]++;
		if (h == myhost) {
			if (r == c->rank)
				me = nl;
			m[nl++] = r;
		}
	}
	for (int h = 0; h < c->world_size; h++) {
		if (per[h] && per[h] != nl)
			uniform = 0;
		nh += per[h] > 0;
	}
	/* hlocal: this host's members, on shared memory. */
	if (!(c->hlocal = inner_new(c, m, nl, me, 1))) {
		rc = loom_comm_fail(c, LOOM_ENOMEM, "out of memory");
		goto done;
	}
	snprintf(name, sizeof name, "%.180s-h%d", c->name, myhost);
	snprintf(c->hlocal->name, sizeof c->hlocal->name, "%s", name);
	loom_cur.c = c->hlocal;
	rc = c->hlocal->xp.ops->open(c->hlocal, plocal, name, plocal ? 0 : heap_bytes, ctx);
	loom_cur = saved;
	if (rc != LOOM_OK) {
		rc = inner_fail(c, c->hlocal, rc);
		goto done;
	}
	if (!uniform || nh < 2)
		goto done;
	/* hcross: the members with our index on their host, in rank order. */
	nl = 0;
	for (int r = 0; r < n; r++) {
		int j = c->hidx[r], k = 0;
		for (int q = 0; q < r; q++)
			k += c->hidx[q] == j;
		c->hcrank[r] = k;
		if (j == c->hidx[c->rank])
			m[nl++] = r;
	}
	if (!(c->hcross = inner_new(c, m, nl, c->hcrank[c->rank], 0))) {
		rc = loom_comm_fail(c, LOOM_ENOMEM, "out of memory");
		goto done;
	}
	snprintf(name, sizeof name, "%.180s-x%d", c->name, c->hidx[c->rank]);
	snprintf(c->hcross->name, sizeof c->hcross->name, "%s", name);
	loom_cur.c = c->hcross;
	rc = c->hcross->xp.ops->open(c->hcross, c, name, 0, ctx);
	loom_cur = saved;
	if (rc != LOOM_OK) {
		rc = inner_fail(c, c->hcross, rc);
		goto done;
	}
	c->hL = nl ? n / nl : 0, c->hH = nl;
done:
	if (rc != LOOM_OK)
		loom__hier_free(c);
	free(m);
	free(per);
	return rc;
}

void loom__hier_free(loom_comm_t *c)
{
	if (c->hcross) {
		c->hcross->xp.ops->depart(c->hcross);
		loom__comm_free(c->hcross);
	}
	if (c->hlocal) {
		c->hlocal->xp.ops->depart(c->hlocal);
		loom__comm_free(c->hlocal);
	}
	c->hcross = c->hlocal = NULL;
	free(c->hidx);
	free(c->hcrank);
	c->hidx = c->hcrank = NULL;
}

int loom__hier_open_sub(loom_comm_t *c, loom_comm_t *sub, const char *name, const loom_xp_ctx_t *ctx)
{
	int one_host = 1, rc;
	for (int r = 0; r < sub->size; r++)
		one_host &= c->host_of[sub->world_of[r]] == c->host_of[sub->world_of[sub->rank]];
	if (one_host) { /* entirely on this host: a plain shared-memory communicator */
		for (int r = 0; r < sub->size; r++)
			sub->world_of[r] = c->lrank_of[sub->world_of[r]];
		sub->xp.ops = &loom__xport_shm;
		return sub->xp.ops->open(sub, c->hlocal, name, 0, ctx);
	}
	sub->xp.ops = &loom__xport_mpi;
	sub->host_of = c->host_of, sub->lrank_of = c->lrank_of;
	if ((rc = sub->xp.ops->open(sub, c, name, 0, ctx)) != LOOM_OK)
		return rc;
	return loom__hier_build(sub, c->hlocal, 0, ctx);
}

int loom__hier_handles(const loom_comm_t *c, loom_coll_t k)
{
	return c->hcross && (k == LOOM_COLL_ALLREDUCE || k == LOOM_COLL_BROADCAST || k == LOOM_COLL_REDUCE);
}

/* The inter-host phase of the all-reduce: with two hosts, the pipelined exchange of allreduce_pipe
 * below; else loom's algorithms (the selection rule of algo/select.c over the MPI transport) or MPI's
 * own MPI_Iallreduce, one after the reduce-scatter and before the all-gather. The choice is data,
 * first match wins, keyed on the hosts and the bytes of the slice each cross group reduces;
 * LOOM_HIER_ALLREDUCE=pipe|loom|mpi forces one (it must be the same on every rank; pipe needs two
 * hosts). Measured on the two-host cluster (2 hosts x 2 ranks, 2 Gbit/s tbf link, `loom bench comm`):
 * unpipelined, loom's rd/ring over the MPI transport beat MPI_Iallreduce at every size from 64 KiB to
 * 64 MiB of the whole vector (16 MiB: 112-114 ms against 125-136 ms; 64 MiB: 376-419 against
 * 627-633 ms; a tie near 1 MiB); the pipelined exchange beats both (docs/multinode.md). */
enum { CROSS_LOOM, CROSS_MPI, CROSS_PIPE };

typedef struct {
	int min_hosts, max_hosts;
	size_t max_bytes;
	int kind;
} cross_rule_t;

static const cross_rule_t cross_rule[] = {
	{2, 2, SIZE_MAX, CROSS_PIPE},
	{1, 1 << 30, SIZE_MAX, CROSS_LOOM},
};

static int cross_kind(const loom_comm_t *c, size_t bytes)
{
	const char *e = getenv("LOOM_HIER_ALLREDUCE");
	if (e && strcmp(e, "mpi") == 0)
		return CROSS_MPI;
	if (e && strcmp(e, "loom") == 0)
		return CROSS_LOOM;
	if (e && strcmp(e, "pipe") == 0 && c->hH == 2)
		return CROSS_PIPE;
	for (size_t i = 0; i < LOOM_ARRAY_LEN(cross_rule); i++)
		if (c->hH >= cross_rule[i].min_hosts && c->hH <= cross_rule[i].max_hosts && bytes <= cross_rule[i].max_bytes)
			return cross_rule[i].kind;
	return CROSS_LOOM;
}

int loom__hier_cross_mpi(const loom_comm_t *c, size_t bytes)
{
	return cross_kind(c, bytes) == CROSS_MPI;
}

int loom__hier_cross_pipe(const loom_comm_t *c, size_t bytes)
{
	return cross_kind(c, bytes) == CROSS_PIPE;
}

static int cross_allreduce(loom_comm_t *c, void *slice, size_t count, loom_dtype_t dt, loom_op_t op)
{
	loom_comm_t *x = c->hcross;
	int rc;
	if (x->xp.ops->allreduce && loom__hier_cross_mpi(c, count * loom_dtype_size(dt))) {
		loom_xp_ctx_t ctx = {"allreduce", ++x->coll_seq, loom_now() + x->timeout_s};
		rc = x->xp.ops->allreduce(x, &ctx, slice, slice, count, dt, op);
		if (rc != LOOM_ENOTSUP)
			return rc == LOOM_OK ? LOOM_OK : inner_fail(c, x, rc);
	}
	if ((rc = loom_allreduce(x, slice, slice, count, dt, op)) != LOOM_OK)
		return inner_fail(c, x, rc);
	return LOOM_OK;
}

/* Bytes of the whole vector per chunk of the pipelined all-reduce (LOOM_HIER_CHUNK, K/M suffixes;
 * the same on every rank), and how many chunks' exchanges are in flight while the next chunk is
 * reduce-scattered. Measured on the two-host cluster (2 x 2 ranks, 2 Gbit/s, a loaded 2-core
 * machine; 16 / 64 MiB all-reduce, ms): depth 2 with 4 MiB chunks 85-95 / 339-342, 2 MiB 79-80 /
 * 310-320, 1 MiB 87-104 / 329-359, 512 KiB 79-82 / 313-329; depth 4 with 512 KiB 79-90 / 309-312,
 * 256 KiB 75 / 301-305 (the link-rate bound is 67 / 268). */
#define PIPE_CHUNK_DEFAULT (256u << 10)
#define PIPE_DEPTH 4

static size_t pipe_chunk_bytes(void)
{
	const char *e = getenv("LOOM_HIER_CHUNK");
	char *end;
	double v;
	if (!e || !*e)
		return PIPE_CHUNK_DEFAULT;
	v = strtod(e, &end);
	v *= *end == 'k' || *end == 'K' ? 1024.0 : *end == 'm' || *end == 'M' ? 1048576.0 : 1.0;
	return v >= 4096 ? (size_t)v : PIPE_CHUNK_DEFAULT;
}

/* Two hosts: the all-reduce in chunks of the vector, pipelined. Chunk k is reduce-scattered on
 * hlocal into this rank's piece, which is then exchanged whole with the one peer on the other host
 * (MPI_Isend/MPI_Irecv left in flight: both directions of the link at once, no step boundaries) and
 * combined; the all-gather of chunk k on hlocal comes PIPE_DEPTH chunks later, so while it and the
 * next reduce-scatters run over shared memory, the link carries the exchanges of the chunks between.
 * Every rank of a host runs the same sequence of hlocal collectives (RS 0..D-1, then RS k, AG k-D),
 * whatever the timing of the exchanges. Both hosts compute `mine OP theirs` with the operands in
 * the other order, which is the same value (SUM, MAX, MIN are commutative), so every rank ends with
 * the same bits. */
static int allreduce_pipe(loom_comm_t *c, const loom_coll_args_t *a)
{
	enum { SLOTS = PIPE_DEPTH + 1 };
	loom_comm_t *x = c->hcross, *h = c->hlocal;
	size_t es = loom_dtype_size(a->dt), per = pipe_chunk_bytes() / es, nch, piece, counts[64], *cnt = counts;
	int L = h->size, j = h->rank, peer = 1 - x->rank, rc = LOOM_OK;
	loom_op_t op = a->op == LOOM_AVG ? LOOM_SUM : a->op;
	loom_mpi_xchg_t *pend[SLOTS] = {0};
	char *scratch;
	if (per < (size_t)L)
		per = (size_t)L;
	nch = (a->count + per - 1) / per;
	piece = (per / (size_t)L + 1) * es; /* the largest piece of a chunk, rounded up */
	piece = (piece + 63) & ~(size_t)63;
	if (L > 64 && !(cnt = loom__calloc((size_t)L, sizeof *cnt)))
		return loom_comm_fail(c, LOOM_ENOMEM, "out of memory");
	if (!(scratch = loom_comm_scratch(c, 0, SLOTS * 2 * piece))) {
		rc = loom_comm_fail(c, LOOM_ENOMEM, "out of memory for %zu bytes of pipeline buffers", SLOTS * 2 * piece);
		goto done;
	}
	for (size_t k = 0; k < nch + PIPE_DEPTH && rc == LOOM_OK; k++) {
		if (k < nch) { /* reduce-scatter chunk k, start its exchange */
			size_t off = k * per, len = a->count - off < per ? a->count - off : per;
			char *mine = scratch + (k % SLOTS) * 2 * piece;
			loom_xp_ctx_t ctx = {"allreduce", ++x->coll_seq, loom_now() + x->timeout_s};
			for (int q = 0; q < L; q++)
				cnt[q] = len / (size_t)L + ((size_t)q < len % (size_t)L);
			if ((rc = loom_reduce_scatterv(h, (const char *)a->send + off * es, mine, cnt, a->dt, op))) {
				rc = inner_fail(c, h, rc);
				break;
			}
			if ((rc = loom__mpi_xchg_post(x, &ctx, &c->coll_sig, peer, mine, mine + piece, cnt[j] * es, &pend[k % SLOTS]))) {
				rc = inner_fail(c, x, rc);
				break;
			}
		}
		if (k >= PIPE_DEPTH && k - PIPE_DEPTH < nch) { /* finish chunk k - D: combine, all-gather */
			size_t kk = k - PIPE_DEPTH, off = kk * per, len = a->count - off < per ? a->count - off : per;
			char *mine = scratch + (kk % SLOTS) * 2 * piece;
			loom_xp_ctx_t ctx = {"allreduce", 0, loom_now() + x->timeout_s};
			loom_mpi_xchg_t *p = pend[kk % SLOTS];
			pend[kk % SLOTS] = NULL;
			for (int q = 0; q < L; q++)
				cnt[q] = len / (size_t)L + ((size_t)q < len % (size_t)L);
			if ((rc = loom__mpi_xchg_wait(x, &ctx, p)) != LOOM_OK) {
				rc = inner_fail(c, x, rc);
				break;
			}
			loom_reduce_local(mine, mine, mine + piece, cnt[j], a->dt, op);
			if (a->op == LOOM_AVG)
				loom_scale_local(mine, cnt[j], a->dt, c->size);
			if ((rc = loom_allgatherv(h, mine, cnt[j], (char *)a->recv + off * es, cnt, a->dt)) != LOOM_OK)
				rc = inner_fail(c, h, rc);
		}
	}
	for (int s = 0; s < SLOTS; s++) /* after a failure: abandon the exchanges still in flight */
		loom__mpi_xchg_drop(pend[s]);
done:
	if (cnt != counts)
		free(cnt);
	return rc;
}

static int allreduce(loom_comm_t *c, const loom_coll_args_t *a)
{
	size_t es = loom_dtype_size(a->dt), counts[64], *cnt = counts;
	int L = c->hlocal->size, j = c->hlocal->rank, rc;
	loom_op_t op = a->op == LOOM_AVG ? LOOM_SUM : a->op;
	void *slice;
	if (L > 64 && !(cnt = loom__calloc((size_t)L, sizeof *cnt)))
		return loom_comm_fail(c, LOOM_ENOMEM, "out of memory");
	for (int q = 0; q < L; q++)
		cnt[q] = a->count / (size_t)L + ((size_t)q < a->count % (size_t)L);
	slice = loom_comm_scratch(c, 0, cnt[j] * es);
	if (!slice) {
		rc = loom_comm_fail(c, LOOM_ENOMEM, "out of memory for a slice of %zu bytes", cnt[j] * es);
		goto done;
	}
	if ((rc = loom_reduce_scatterv(c->hlocal, a->send, slice, cnt, a->dt, op)) != LOOM_OK) {
		rc = inner_fail(c, c->hlocal, rc);
		goto done;
	}
	if ((rc = cross_allreduce(c, slice, cnt[j], a->dt, op)) != LOOM_OK)
		goto done;
	if (a->op == LOOM_AVG)
		loom_scale_local(slice, cnt[j], a->dt, c->size);
	if ((rc = loom_allgatherv(c->hlocal, slice, cnt[j], a->recv, cnt, a->dt)) != LOOM_OK)
		rc = inner_fail(c, c->hlocal, rc);
done:
	if (cnt != counts)
		free(cnt);
	return rc;
}

static int broadcast(loom_comm_t *c, const loom_coll_args_t *a)
{
	int lr = c->hidx[a->root], rc;
	if (c->hidx[c->rank] == lr && (rc = loom_broadcast(c->hcross, a->recv, a->count, a->dt, c->hcrank[a->root])))
		return inner_fail(c, c->hcross, rc);
	if ((rc = loom_broadcast(c->hlocal, a->recv, a->count, a->dt, lr)) != LOOM_OK)
		return inner_fail(c, c->hlocal, rc);
	return LOOM_OK;
}

static int reduce(loom_comm_t *c, const loom_coll_args_t *a)
{
	size_t bytes = a->count * loom_dtype_size(a->dt);
	int lr = c->hidx[a->root], rc;
	loom_op_t op = a->op == LOOM_AVG ? LOOM_SUM : a->op;
	void *tmp = loom_comm_scratch(c, 0, bytes);
	if (!tmp)
		return loom_comm_fail(c, LOOM_ENOMEM, "out of memory for %zu bytes", bytes);
	if ((rc = loom_reduce(c->hlocal, a->send, tmp, a->count, a->dt, op, lr)) != LOOM_OK)
		return inner_fail(c, c->hlocal, rc);
	if (c->hidx[c->rank] != lr)
		return LOOM_OK;
	if ((rc = loom_reduce(c->hcross, tmp, c->rank == a->root ? a->recv : tmp, a->count, a->dt, op,
	                      c->hcrank[a->root])) != LOOM_OK)
		return inner_fail(c, c->hcross, rc);
	if (c->rank == a->root && a->op == LOOM_AVG)
		loom_scale_local(a->recv, a->count, a->dt, c->size);
	return LOOM_OK;
}

int loom__hier_run(loom_comm_t *c, const loom_coll_args_t *a)
{
	switch (a->coll) {
	case LOOM_COLL_ALLREDUCE:
		return loom__hier_cross_pipe(c, a->count * loom_dtype_size(a->dt) / (size_t)c->hL) ? allreduce_pipe(c, a)
		                                                                                   : allreduce(c, a);
	case LOOM_COLL_BROADCAST:
		return broadcast(c, a);
	case LOOM_COLL_REDUCE:
		return reduce(c, a);
	default:
		return loom_comm_fail(c, LOOM_ENOTSUP, "%s is not hierarchical", loom_coll_name(a->coll));
	}
}

#else /* built without MPI: no communicator spans hosts */

int loom__hier_build(loom_comm_t *c, loom_comm_t *plocal, size_t heap_bytes, const loom_xp_ctx_t *ctx)
{
	(void)plocal, (void)heap_bytes, (void)ctx;
	return loom_comm_fail(c, LOOM_ENOTSUP, "built without MPI");
}

void loom__hier_free(loom_comm_t *c)
{
	(void)c;
}

int loom__hier_open_sub(loom_comm_t *c, loom_comm_t *sub, const char *name, const loom_xp_ctx_t *ctx)
{
	(void)sub, (void)name, (void)ctx;
	return loom_comm_fail(c, LOOM_ENOTSUP, "built without MPI");
}

int loom__hier_handles(const loom_comm_t *c, loom_coll_t k)
{
	(void)c, (void)k;
	return 0;
}

int loom__hier_cross_mpi(const loom_comm_t *c, size_t bytes)
{
	(void)c, (void)bytes;
	return 0;
}

int loom__hier_cross_pipe(const loom_comm_t *c, size_t bytes)
{
	(void)c, (void)bytes;
	return 0;
}

int loom__hier_run(loom_comm_t *c, const loom_coll_args_t *a)
{
	(void)a;
	return loom_comm_fail(c, LOOM_ENOTSUP, "built without MPI");
}

#endif
