/* shm.c: the shared-memory transport's channels: loom_xp_sendrecv and point-to-point messages.
 *
 * Each ordered pair of ranks has one FIFO per kind (collective, point-to-point) of `nslots` slots
 * (shm_internal.h). A message is one or more chunks; every chunk's slot header repeats the message
 * size (and tag, and on the collective channel the sequence number and the call's signature: kind,
 * dtype, op, root, total count), so the receiver checks them before touching any byte and a
 * mismatch is an error on both sides naming both calls, never an overrun or a silent combination of
 * unrelated data. A send blocked on the collective channel also peeks at the peer's pending message:
 * the same sequence number with another signature means both only send (every rank a broadcast
 * root) and neither would ever receive. The sender fills a slot and
 * publishes it by storing its chunk number in the slot's `ready` word; the receiver polls that
 * word (one cache line for a small message) and frees the slot by advancing `tail`.
 *
 * Copy-in: ordinary buffers are copied into slots by the sender and out of them (or reduced) by
 * the receiver, chunk by chunk, so large messages pipeline; the sender returns once every chunk is
 * posted (eager). Single copy: a send buffer inside the shared heap (loom_comm_alloc, scratch)
 * travels as one INPLACE slot naming its world-segment offset; the receiver reads or reduces
 * straight from the sender's memory, in pieces interleaved with its own sends, and the sender
 * returns after the receiver acknowledges (tail passes the slot), because only then may the
 * buffer change. Both directions of a sendrecv progress in one loop, so rings cannot deadlock.
 *
 * Invariants: head - tail <= nslots on every channel; only the sender writes head and slot
 * headers, only the receiver writes tail and err; err, once set, stays set (the channel is
 * unusable). */
#include <string.h>

#include "comm/transport/shm_internal.h"
#include "core/util.h"

#define INPLACE_PIECE (256u << 10) /* receiver processes in-place data in pieces, between sends */
#define SMALL_MSG (64u << 10)      /* waits for messages up to this size spin longer (latency-bound) */

/* ---- channels --------------------------------------------------------------------------------- */

typedef struct {
	loom_comm_t *c;
	shm_comm_t *s; /* S(c) */
	int kind;
	/* send side */
	shm_chan_t *sch;
	const char *sbuf;
	size_t sbytes, spos;
	int stag, sinplace, sposted, sdone;
	unsigned shead; /* our next head value */
	/* receive side */
	shm_chan_t *rch;
	char *rbuf;
	const char *red;
	size_t rbytes, rpos, esize;
	int rtag, rdone, rstarted;
	loom_dtype_t dt;
	loom_op_t op;
	uint64_t seq;
	loom_xp_sig_t sig; /* collective channel: this call's signature, stamped on every chunk */
	int dst, src;
	unsigned idle; /* idle rounds, to peek at the peer's pending message now and then */
} xfer_t;

_Static_assert(sizeof(shm_slot_t) == 64, "a slot header is one cache line");

static int sig_eq(const shm_slot_t *s, const loom_xp_sig_t *g)
{
	return s->sig_shape == g->shape && s->sig_count == g->count && s->sig_root == g->root;
}

static loom_xp_sig_t slot_sig(const shm_slot_t *s)
{
	return (loom_xp_sig_t){s->sig_count, s->sig_shape, s->sig_root};
}

static int xfer_ready(void *arg)
{
	xfer_t *x = arg;
	if (!x->sdone) {
		unsigned tail = atomic_load_explicit(&x->sch->tail, memory_order_acquire);
		if (atomic_load_explicit(&x->sch->err, memory_order_relaxed))
			return 1;
		if (x->sposted ? tail == x->shead : x->shead - tail < x->s->hdr->nslots)
			return 1;
	}
	if (!x->rdone) {
		unsigned tail = atomic_load_explicit(&x->rch->tail, memory_order_relaxed);
		if (atomic_load_explicit(&x->rch->slot[tail % x->s->hdr->nslots].ready, memory_order_acquire) == tail + 1)
			return 1;
	}
	return 0;
}

static int send_rejected(xfer_t *x)
{
	shm_chan_t *ch = x->sch;
	if (x->kind == CHAN_COLL && ch->err_seq_sent && ch->err_seq_sent < ch->err_seq_expected)
		return loom__shm_peer_went_past(x->c, x->dst, ch->err_seq_sent, ch->err_sig_sent);
	if (x->kind == CHAN_COLL && (ch->err_seq_sent != ch->err_seq_expected ||
	                             memcmp(&ch->err_sig_sent, &ch->err_sig_expected, sizeof ch->err_sig_sent) != 0)) {
		char mine[160], theirs[160];
		loom_xp_sig_describe(mine, sizeof mine, ch->err_seq_sent, &ch->err_sig_sent);
		loom_xp_sig_describe(theirs, sizeof theirs, ch->err_seq_expected, &ch->err_sig_expected);
		return loom_comm_fail(x->c, LOOM_EMISMATCH,
		                      "mismatched collective calls: this rank called %s, rank %d called %s (it rejected "
		                      "this rank's message)",
		                      mine, x->dst, theirs);
	}
	if (ch->err_tag_sent != ch->err_tag_expected)
		return loom_comm_fail(x->c, LOOM_EMISMATCH,
		                      "rank %d rejected this rank's message: sent %llu bytes with tag %d, it expected %llu "
		                      "bytes with tag %d",
		                      x->dst, (unsigned long long)ch->err_sent, ch->err_tag_sent,
		                      (unsigned long long)ch->err_expected, ch->err_tag_expected);
	return loom_comm_fail(x->c, LOOM_EMISMATCH,
	                      "rank %d rejected this rank's message: sent %llu bytes, it expected %llu bytes", x->dst,
	                      (unsigned long long)ch->err_sent, (unsigned long long)ch->err_expected);
}

/* Post as many chunks as free slots allow. Returns >0 on progress, 0 if none, <0 on error. */
static int send_step(xfer_t *x)
{
	shm_hdr_t *h = x->s->hdr;
	shm_chan_t *ch = x->sch;
	int progress = 0;
	if (atomic_load_explicit(&ch->err, memory_order_acquire))
		return send_rejected(x);
	if (x->sposted) { /* in place: wait for the receiver's ack */
		if (atomic_load_explicit(&ch->tail, memory_order_acquire) == x->shead) {
			x->sdone = 1;
			return 1;
		}
		return 0;
	}
	for (;;) {
		unsigned tail = atomic_load_explicit(&ch->tail, memory_order_acquire), i;
		shm_slot_t *s;
		size_t n;
		if (x->shead - tail >= h->nslots)
			break;
		i = x->shead % h->nslots;
		s = &ch->slot[i];
		s->total = x->sbytes;
		s->seq = x->seq;
		s->tag = x->stag;
		s->sig_count = x->sig.count;
		s->sig_shape = x->sig.shape;
		s->sig_root = x->sig.root;
		if (x->sinplace) {
			s->bytes = x->sbytes;
			s->off = (uint64_t)(x->sbuf - x->s->job->base);
			s->flags = SLOT_INPLACE;
			n = x->sbytes;
		} else {
			n = LOOM_MIN(x->sbytes - x->spos, (size_t)h->slot_bytes);
			s->bytes = n;
			s->off = x->spos;
			s->flags = 0;
			if (n)
				memcpy(slot_data(h, ch, i), x->sbuf + x->spos, n);
		}
		x->spos += n;
		x->shead++;
		atomic_store_explicit(&ch->head, x->shead, memory_order_relaxed);
		atomic_store_explicit(&s->ready, x->shead, memory_order_release);
		progress = 1;
		if (x->spos >= x->sbytes) {
			x->sposted = 1;
			if (!x->sinplace)
				x->sdone = 1;
			break;
		}
	}
	if (progress)
		shm_ring(x->c, x->dst);
	return progress;
}

static int recv_reject(xfer_t *x, const shm_slot_t *s)
{
	shm_chan_t *ch = x->rch;
	ch->err_seq_sent = s->seq, ch->err_seq_expected = x->seq;
	ch->err_sig_sent = slot_sig(s), ch->err_sig_expected = x->sig;
	ch->err_sent = s->total;
	ch->err_expected = x->rbytes;
	ch->err_tag_sent = s->tag;
	ch->err_tag_expected = x->kind == CHAN_P2P ? x->rtag : s->tag;
	atomic_store_explicit(&ch->err, 1, memory_order_release);
	shm_ring(x->c, x->src);
	if (x->kind == CHAN_COLL && s->seq && s->seq < x->seq) /* name this rank's call of that number too */
		return loom__shm_went_past(x->c, x->src, s, x->seq, x->sig);
	if (x->kind == CHAN_COLL && (s->seq != x->seq || !sig_eq(s, &x->sig))) {
		char mine[160], theirs[160];
		loom_xp_sig_t g = slot_sig(s);
		loom_xp_sig_describe(mine, sizeof mine, x->seq, &x->sig);
		loom_xp_sig_describe(theirs, sizeof theirs, s->seq, &g);
		return loom_comm_fail(x->c, LOOM_EMISMATCH,
		                      "mismatched collective calls: this rank called %s, rank %d called %s%s", mine, x->src,
		                      theirs,
		                      s->seq != x->seq ? " (ranks called collectives in different orders, or one "
		                                         "rank's call failed before it sent anything)"
		                                       : "");
	}
	if (x->kind == CHAN_P2P && s->tag != x->rtag)
		return loom_comm_fail(x->c, LOOM_EMISMATCH,
		                      "message from rank %d has tag %d and %llu bytes, expected tag %d and %zu bytes", x->src,
		                      s->tag, (unsigned long long)s->total, x->rtag, x->rbytes);
	return loom_comm_fail(x->c, LOOM_EMISMATCH, "message from rank %d has %llu bytes, expected %zu bytes", x->src,
	                      (unsigned long long)s->total, x->rbytes);
}

static void deliver(xfer_t *x, const char *from, size_t bytes)
{
	if (!bytes)
		return;
	if (x->red)
		loom_reduce_local(x->rbuf + x->rpos, x->red + x->rpos, from, bytes / x->esize, x->dt, x->op);
	else
		memcpy(x->rbuf + x->rpos, from, bytes);
}

/* Consume available chunks. Returns >0 on progress, 0 if none, <0 on error. */
static int recv_step(xfer_t *x)
{
	shm_hdr_t *h = x->s->hdr;
	shm_chan_t *ch = x->rch;
	int progress = 0;
	if (atomic_load_explicit(&ch->err, memory_order_acquire))
		return loom_comm_fail(x->c, LOOM_EMISMATCH,
		                      "the channel from rank %d is unusable after an earlier mismatched message", x->src);
	while (!x->rdone) {
		unsigned tail = atomic_load_explicit(&ch->tail, memory_order_relaxed), i;
		shm_slot_t *s;
		i = tail % h->nslots;
		s = &ch->slot[i];
		if (atomic_load_explicit(&s->ready, memory_order_acquire) != tail + 1)
			break;
		if (!x->rstarted) {
			/* The collective's sequence number and signature first: a call of another shape
			 * usually has another size too, and the message should say which calls differ. */
			if (s->total != x->rbytes || (x->kind == CHAN_P2P && s->tag != x->rtag) ||
			    (x->kind == CHAN_COLL && (s->seq != x->seq || !sig_eq(s, &x->sig))))
				return recv_reject(x, s);
			if ((s->flags & SLOT_INPLACE) &&
			    (s->off < x->s->job->hdr->heap_off || s->off > x->s->job->bytes || s->total > x->s->job->bytes - s->off))
				return loom_comm_fail(x->c, LOOM_EFORMAT,
				                      "in-place message from rank %d names bytes [%llu, +%llu) outside the shared heap",
				                      x->src, (unsigned long long)s->off, (unsigned long long)s->total);
			x->rstarted = 1;
		}
		if (s->flags & SLOT_INPLACE) {
			size_t n = LOOM_MIN(x->rbytes - x->rpos, (size_t)INPLACE_PIECE);
			const char *from = x->s->job->base + s->off + x->rpos;
			deliver(x, from, n);
			x->rpos += n;
			progress = 1;
			if (x->rpos < x->rbytes)
				return progress; /* let the send side run between pieces */
		} else {
			deliver(x, slot_data(h, ch, i), s->bytes);
			x->rpos += s->bytes;
		}
		atomic_store_explicit(&ch->tail, tail + 1, memory_order_release);
		shm_ring(x->c, x->src);
		progress = 1;
		if (x->rpos >= x->rbytes)
			x->rdone = 1;
	}
	return progress;
}

/* A blocked send on the collective channel: has dst sent this rank a message of the same collective
 * with another signature? Then neither will ever receive the other's (every rank a broadcast root,
 * say) and waiting would last until the timeout. Messages of this call with the same signature
 * (an exchange in progress) are normal. Returns LOOM_OK or the mismatch, recorded. */
static int peek_peer(xfer_t *x)
{
	shm_hdr_t *h = x->s->hdr;
	shm_chan_t *ch;
	shm_slot_t *s;
	unsigned tail;
	if (!x->rdone && x->src == x->dst)
		return LOOM_OK; /* recv_step checks that message */
	ch = chan_of(h, CHAN_COLL, x->dst, x->s->rank);
	tail = atomic_load_explicit(&ch->tail, memory_order_relaxed);
	s = &ch->slot[tail % h->nslots];
	if (atomic_load_explicit(&s->ready, memory_order_acquire) != tail + 1 || s->seq != x->seq || sig_eq(s, &x->sig))
		return LOOM_OK;
	char mine[160], theirs[160];
	loom_xp_sig_t g = slot_sig(s);
	loom_xp_sig_describe(mine, sizeof mine, x->seq, &x->sig);
	loom_xp_sig_describe(theirs, sizeof theirs, s->seq, &g);
	return loom_comm_fail(x->c, LOOM_EMISMATCH,
	                      "mismatched collective calls: this rank called %s, rank %d called %s (both were sending "
	                      "to each other)",
	                      mine, x->dst, theirs);
}

static int local_copy(loom_comm_t *c, const void *sbuf, size_t sbytes, void *rbuf, size_t rbytes,
                      const void *red_local, loom_dtype_t dt, loom_op_t op)
{
	if (sbytes != rbytes)
		return loom_comm_fail(c, LOOM_EMISMATCH, "message to itself has %zu bytes, expected %zu", sbytes, rbytes);
	if (!rbytes)
		return LOOM_OK;
	if (red_local)
		loom_reduce_local(rbuf, red_local, sbuf, rbytes / loom_dtype_size(dt), dt, op);
	else
		memmove(rbuf, sbuf, rbytes);
	return LOOM_OK;
}

int loom__shm_sendrecv(loom_comm_t *c, const loom_xp_ctx_t *ctx, int kind, int dst, const void *sbuf, size_t sbytes,
                       int stag, int src, void *rbuf, size_t rbytes, int rtag, const void *red_local, loom_dtype_t dt,
                       loom_op_t op)
{
	xfer_t x;
	shm_waiter_t w;
	int rc;
	if (dst >= S(c)->size || src >= S(c)->size)
		return loom_comm_fail(c, LOOM_EINVAL, "peer rank out of range (dst %d, src %d, size %d)", dst, src, S(c)->size);
	if ((sbytes && !sbuf && dst >= 0) || (rbytes && !rbuf && src >= 0))
		return loom_comm_fail(c, LOOM_EINVAL, "NULL buffer for a message of %zu/%zu bytes", sbytes, rbytes);
	if (red_local && src >= 0 && (loom_dtype_size(dt) == 0 || rbytes % loom_dtype_size(dt) != 0))
		return loom_comm_fail(c, LOOM_EINVAL, "reducing receive of %zu bytes is not a whole number of %s", rbytes,
		                      loom_dtype_name(dt));
	if (dst == S(c)->rank || src == S(c)->rank) {
		if (dst == S(c)->rank && src == S(c)->rank)
			return local_copy(c, sbuf, sbytes, rbuf, rbytes, red_local, dt, op);
		return loom_comm_fail(c, LOOM_EINVAL, "a message to or from itself must be a sendrecv with itself "
		                                      "(dst %d, src %d, rank %d)",
		                      dst, src, S(c)->rank);
	}
	if (atomic_load(&S(c)->hdr->abort_code) != 0) {
		int code = atomic_load(&S(c)->hdr->abort_code);
		return loom_comm_fail(c, code, "communicator aborted after an earlier failure: %s", S(c)->hdr->abort_msg);
	}
	memset(&x, 0, sizeof x);
	x.c = c, x.s = S(c), x.kind = kind, x.dt = dt, x.op = op, x.dst = dst, x.src = src;
	x.seq = kind == CHAN_COLL ? ctx->seq : 0;
	if (kind == CHAN_COLL)
		x.sig = loom_xp_coll_sig(c, ctx);
	x.sdone = dst < 0, x.rdone = src < 0;
	if (dst >= 0) {
		x.sch = chan_of(S(c)->hdr, kind, S(c)->rank, dst);
		x.sbuf = sbuf, x.sbytes = sbytes, x.stag = stag;
		x.shead = atomic_load_explicit(&x.sch->head, memory_order_relaxed);
		x.sinplace = sbytes >= S(c)->inplace_min && shm_heap_contains(S(c)->job, sbuf, sbytes);
	}
	if (src >= 0) {
		x.rch = chan_of(S(c)->hdr, kind, src, S(c)->rank);
		x.rbuf = rbuf, x.rbytes = rbytes, x.rtag = rtag, x.red = red_local;
		x.esize = red_local ? loom_dtype_size(dt) : 1;
	}
	loom__shm_waiter_init(&w, c, ctx, kind == CHAN_COLL);
	w.small = (dst < 0 || sbytes <= SMALL_MSG) && (src < 0 || rbytes <= SMALL_MSG);
	while (!x.sdone || !x.rdone) {
		int p = 0;
		if (!x.sdone && (rc = send_step(&x)) != 0) {
			if (rc < 0)
				goto fail;
			p = 1;
		}
		if (!x.rdone && (rc = recv_step(&x)) != 0) {
			if (rc < 0)
				goto fail;
			p = 1;
		}
		if (p) {
			shm_waiter_reset(&w);
			continue;
		}
		/* Wait only on the sides still open: a peer that finished its part may leave. */
		w.dst = x.sdone ? -1 : dst, w.src = x.rdone ? -1 : src, w.npeers = 0;
		if (w.dst >= 0)
			w.peers[w.npeers++] = w.dst;
		if (w.src >= 0 && w.src != w.dst)
			w.peers[w.npeers++] = w.src;
		if ((rc = loom__shm_waiter_idle(&w, xfer_ready, &x)) != LOOM_OK)
			return rc;
		if (kind == CHAN_COLL && !x.sdone && (++x.idle & 63) == 0 && (rc = peek_peer(&x)) != LOOM_OK)
			goto fail;
	}
	return LOOM_OK;
fail:
	if (kind == CHAN_COLL)
		loom__shm_abort(c, rc, loom_errmsg());
	return rc;
}

