/* shm_enter.c: the shared-memory transport's enter (transport.h): a rank entering a collective
 * publishes its signature and sequence number; mismatches of earlier calls are found lazily, where
 * the rank waits anyway, and at loom_comm_destroy, where waiting is fine.
 *
 * Why. Every message on the collective channel carries the call's sequence number and signature,
 * and the receiver checks them (shm.c), so a mismatch is caught wherever a message is received. It
 * is missed where a message is never received: two ranks that both think they are a broadcast's
 * root each only send, small sends are eager, and both calls return. What is left behind is a
 * message in a channel that nobody will read, or a receiver that waits for a message nobody sends.
 *
 * The hot path (enter of every collective) never waits and reads nothing a peer writes: it
 * publishes this call's signature into the rank's own record (a history of the last SHM_HIST,
 * plain release stores), then its sequence number (release). (Looking at the incoming channels
 * there too, for a peer's message of an earlier call, cost 5-10% of an 8-byte broadcast's samples
 * under perf: the slot line is the one the peer is writing.) Lazily, where the rank waits anyway:
 *   - a wait on a peer that lasts (shm_wait.c's slow checks, every SLOW_CHECK_S) compares the
 *     peer's recorded signatures of every call in the history that both have entered with this
 *     rank's (loom__shm_check_call): two ranks that each wait to receive from the other (every rank
 *     a reduce's root) fail at once, and a receiver that waits for a sender that disagrees on the
 *     root fails as soon as the sender moved on;
 *   - a receive that finds a peer's message of an earlier call (shm.c) is a call this rank went
 *     past: a mismatch naming both ranks' calls of that number.
 * At destroy (coll -2; waiting is fine there):
 *   - incoming: a peer's message still waiting at the tail of one of this rank's channels with a
 *     sequence number below destroy's is one this rank's calls went past;
 *   - outgoing: a message this rank sent that its peer has not consumed is waited for until the
 *     peer consumes it, publishes a later call (it went past without receiving it: a mismatch),
 *     dies or leaves, or the deadline passes;
 *   - every peer is waited for until it entered this rank's last call, and the signatures of the
 *     calls both still hold in their histories are compared.
 * So a rank that never waits (a small eager broadcast's root) learns of a mismatch of call k at a
 * later call that waits, from the communicator's abort record (which every call reads) once a peer
 * found it, or at its destroy; every rank involved fails by its destroy at the latest, with a
 * message naming both calls (the peer's from its message or its record). A rank's collective never
 * waits for a peer it would not wait for without these checks.
 *
 * Ordering: a rank publishes its sequence number with release after its last consumption of the
 * previous call, and a peer reads that number (acquire) before the tail, so "went past" is never
 * concluded from a tail read before the peer consumed. The history is a seqlock of release stores
 * and acquire loads (no fences: ThreadSanitizer has none). */
#include <stdio.h>
#include <string.h>

#include "comm/transport/shm_internal.h"
#include "core/util.h"

static void hist_put(shm_rank_t *me, uint64_t seq, const loom_xp_sig_t *sig)
{
	unsigned i = (unsigned)(seq % SHM_HIST);
	/* A seqlock without fences (ThreadSanitizer has none): release stores keep seq = 0 before the
	 * fields and the fields before the final seq; the reader's acquire loads mirror them. */
	atomic_store_explicit(&me->hist[i].seq, 0, memory_order_relaxed);
	atomic_store_explicit(&me->hist[i].count, sig->count, memory_order_release);
	atomic_store_explicit(&me->hist[i].shape, sig->shape, memory_order_release);
	atomic_store_explicit(&me->hist[i].root, sig->root, memory_order_release);
	atomic_store_explicit(&me->hist[i].seq, seq, memory_order_release);
}

/* Rank record r's signature of call seq: 1 when it still holds it. */
static int hist_get(shm_rank_t *r, uint64_t seq, loom_xp_sig_t *sig)
{
	unsigned i = (unsigned)(seq % SHM_HIST);
	if (atomic_load_explicit(&r->hist[i].seq, memory_order_acquire) != seq)
		return 0;
	sig->count = atomic_load_explicit(&r->hist[i].count, memory_order_acquire);
	sig->shape = atomic_load_explicit(&r->hist[i].shape, memory_order_acquire);
	sig->root = atomic_load_explicit(&r->hist[i].root, memory_order_acquire);
	return atomic_load_explicit(&r->hist[i].seq, memory_order_acquire) == seq;
}

/* "called broadcast #3 (...)" or "made no call #3 (...)" for rank r of c, `now` the sequence number
 * r has published (or is entering). */
static void call_of(loom_comm_t *c, int r, uint64_t seq, uint64_t now, char *out, size_t cap)
{
	loom_xp_sig_t sig;
	char d[200];
	if (hist_get(rank_rec(S(c)->hdr, r), seq, &sig) && sig.shape != 0) {
		loom_xp_sig_describe(d, sizeof d, seq, &sig);
		snprintf(out, cap, "called %s", d);
	} else if (hist_get(rank_rec(S(c)->hdr, r), seq, &sig)) {
		snprintf(out, cap, "called split #%llu", (unsigned long long)seq);
	} else if (seq >= now) {
		snprintf(out, cap, "made no call #%llu (it was at #%llu: a rank that leaves is at one past its last call)",
		         (unsigned long long)seq, (unsigned long long)now);
	} else {
		char cur[240] = "";
		if (hist_get(rank_rec(S(c)->hdr, r), now, &sig) && sig.shape != 0) {
			loom_xp_sig_describe(d, sizeof d, now, &sig);
			snprintf(cur, sizeof cur, "; it went on to %s", d);
		}
		snprintf(out, cap, "made no call #%llu that it recorded (a call that failed its argument check takes "
		         "a number too; or it is more than %d calls back)%s",
		         (unsigned long long)seq, SHM_HIST, cur);
	}
}

static int mismatch(loom_comm_t *c, int peer, const char *mine, const char *theirs, const char *why)
{
	int rc = loom_comm_fail(c, LOOM_EMISMATCH, "mismatched collective calls: this rank %s, rank %d %s (%s)", mine, peer,
	                        theirs, why);
	loom__shm_abort(c, rc, loom_errmsg());
	return rc;
}

/* Peer p's message in slot sl (of call sl->seq, below `seq`) was never received: this rank went past
 * it, to call `seq` (signature `now`; op names a call without one). Recorded and aborted. */
static int went_past(loom_comm_t *c, int p, const shm_slot_t *sl, uint64_t seq, loom_xp_sig_t now, const char *op)
{
	char mine[400], theirs[220], d[200], why[300];
	loom_xp_sig_t g = {sl->sig_count, sl->sig_shape, sl->sig_root};
	loom_xp_sig_describe(d, sizeof d, sl->seq, &g);
	snprintf(theirs, sizeof theirs, "called %s", d);
	call_of(c, S(c)->rank, sl->seq, seq, mine, sizeof mine);
	if (now.shape)
		loom_xp_sig_describe(d, sizeof d, seq, &now);
	else
		snprintf(d, sizeof d, "%s", op ? op : "?");
	snprintf(why, sizeof why, "its message to this rank was never received: this rank went past it, to %s", d);
	return mismatch(c, p, mine, theirs, why);
}

int loom__shm_went_past(loom_comm_t *c, int p, const shm_slot_t *sl, uint64_t seq, loom_xp_sig_t now)
{
	return went_past(c, p, sl, seq, now, NULL);
}

int loom__shm_peer_went_past(loom_comm_t *c, int p, uint64_t seq, loom_xp_sig_t sig)
{
	char mine[220], theirs[400], d[200];
	loom_xp_sig_describe(d, sizeof d, seq, &sig);
	snprintf(mine, sizeof mine, "called %s", d);
	call_of(c, p, seq, atomic_load_explicit(&rank_rec(S(c)->hdr, p)->seq, memory_order_acquire), theirs,
	        sizeof theirs);
	return mismatch(c, p, mine, theirs, "it went past this rank's message to it without receiving it");
}

/* A message from a peer that this rank's calls before `seq` went past: the slot at the tail of each
 * incoming channel, which a receive reads next anyway. (At destroy, a message of a later call is a
 * peer's that this rank leaves before: the peer gets LOOM_EPEERLOST.) */
static int check_incoming(loom_comm_t *c, const loom_xp_ctx_t *ctx)
{
	shm_comm_t *s = S(c);
	shm_hdr_t *h = s->hdr;
	for (int p = 0; p < s->size; p++) {
		shm_chan_t *ch;
		shm_slot_t *sl;
		unsigned tail;
		if (p == s->rank)
			continue;
		ch = chan_of(h, CHAN_COLL, p, s->rank);
		tail = atomic_load_explicit(&ch->tail, memory_order_relaxed);
		sl = &ch->slot[tail % h->nslots];
		if (atomic_load_explicit(&sl->ready, memory_order_acquire) != tail + 1 || sl->seq == 0 || sl->seq >= ctx->seq)
			continue;
		return went_past(c, p, sl, ctx->seq, loom_xp_coll_sig(c, ctx), ctx->op);
	}
	return LOOM_OK;
}

int loom__shm_check_call(loom_comm_t *c, uint64_t seq, int p)
{
	shm_comm_t *s = S(c);
	uint64_t ps = atomic_load_explicit(&rank_rec(s->hdr, p)->seq, memory_order_acquire);
	if (ps < seq)
		seq = ps; /* the calls p has entered */
	/* Oldest first: the first call that differs is the one to name. */
	for (uint64_t k = seq > SHM_HIST ? seq - SHM_HIST + 1 : 1; k && k <= seq; k++) {
		loom_xp_sig_t mine, theirs;
		char a[220], b[220], d[200];
		if (!hist_get(rank_rec(s->hdr, s->rank), k, &mine) || !hist_get(rank_rec(s->hdr, p), k, &theirs) ||
		    (mine.shape == theirs.shape && mine.count == theirs.count && mine.root == theirs.root))
			continue;
		loom_xp_sig_describe(d, sizeof d, k, &mine);
		snprintf(a, sizeof a, "called %s", d);
		call_of(c, p, k, k, b, sizeof b);
		return mismatch(c, p, a, b, "seen while this rank waited for it");
	}
	return LOOM_OK;
}

typedef struct {
	shm_chan_t *ch;
	shm_rank_t *peer; /* its record in this communicator's segment */
	unsigned head;
	unsigned tail; /* the channel's tail when k was read */
	uint64_t k;    /* sequence number of this rank's oldest message the peer has not consumed */
} out_t;

/* Consumed (the tail moved on), rejected, or the peer went past call k. The peer's seq is read
 * before the tail: a peer past call k has consumed what it would of k's messages. */
static int out_settled(void *arg)
{
	out_t *o = arg;
	uint64_t ps = atomic_load_explicit(&o->peer->seq, memory_order_acquire);
	if (atomic_load_explicit(&o->ch->tail, memory_order_acquire) != o->tail)
		return 1;
	return atomic_load_explicit(&o->ch->err, memory_order_acquire) || ps > o->k;
}

/* Every message of this rank's to p consumed, or the oldest one that is not named. The oldest is
 * looked at again whenever the tail moves: a peer past call k while a message of k+1 waits (it
 * consumed k's while this rank watched) is a peer still in k+1, not one that went past it. */
static int settle_outgoing(loom_comm_t *c, const loom_xp_ctx_t *ctx, int p)
{
	shm_comm_t *s = S(c);
	shm_hdr_t *h = s->hdr;
	out_t o;
	shm_slot_t *sl;
	loom_xp_sig_t g;
	char mine[220], theirs[400], d[200];
	int rc;
	o.ch = chan_of(h, CHAN_COLL, s->rank, p);
	o.peer = rank_rec(h, p);
	o.head = atomic_load_explicit(&o.ch->head, memory_order_relaxed);
	for (;;) {
		o.tail = atomic_load_explicit(&o.ch->tail, memory_order_acquire);
		if (o.tail == o.head)
			return LOOM_OK;
		o.k = o.ch->slot[o.tail % h->nslots].seq;
		if (!out_settled(&o)) {
			shm_waiter_t w;
			loom__shm_waiter_init(&w, c, ctx, 1);
			w.npeers = 1, w.peers[0] = p, w.dst = p, w.small = 1;
			while (!out_settled(&o))
				if ((rc = loom__shm_waiter_idle(&w, out_settled, &o)) != LOOM_OK)
					return rc;
		}
		if (atomic_load_explicit(&o.ch->tail, memory_order_acquire) == o.tail)
			break;
	}
	if (atomic_load_explicit(&o.ch->err, memory_order_acquire)) { /* the peer failed, naming both calls */
		char msg[SHM_ABORT_MSG];
		int code = atomic_load(&h->abort_code);
		snprintf(msg, sizeof msg, "%s", code ? h->abort_msg : "");
		return loom_comm_fail(c, code ? code : LOOM_EMISMATCH, "rank %d rejected this rank's message: %s", p,
		                      code ? msg : "(no detail)");
	}
	sl = &o.ch->slot[o.tail % h->nslots];
	g = (loom_xp_sig_t){sl->sig_count, sl->sig_shape, sl->sig_root};
	loom_xp_sig_describe(d, sizeof d, sl->seq, &g);
	snprintf(mine, sizeof mine, "called %s", d);
	call_of(c, p, sl->seq, atomic_load(&o.peer->seq), theirs, sizeof theirs);
	return mismatch(c, p, mine, theirs, "it went past this rank's message to it without receiving it");
}

typedef struct {
	loom_comm_t *c;
	uint64_t k;
} entered_t;

static int entered_waiting_on(void *arg, int r)
{
	entered_t *e = arg;
	return atomic_load_explicit(&rank_rec(S(e->c)->hdr, r)->seq, memory_order_acquire) < e->k;
}

static int entered_all(void *arg)
{
	entered_t *e = arg;
	for (int r = 0; r < S(e->c)->size; r++)
		if (r != S(e->c)->rank && entered_waiting_on(arg, r))
			return 0;
	return 1;
}

/* At destroy: wait until every peer entered call k, this rank's last (or went past it), then compare
 * its signatures of the calls both still hold with this rank's: the only way to tell every rank of
 * a mismatch that left no message behind and no rank waiting. */
static int settle_call(loom_comm_t *c, const loom_xp_ctx_t *ctx, uint64_t k)
{
	entered_t e = {c, k};
	shm_waiter_t w;
	int rc;
	if (!entered_all(&e)) {
		loom__shm_waiter_init(&w, c, ctx, 1);
		w.npeers = -1, w.small = 1;
		w.waiting_on = entered_waiting_on;
		snprintf(w.whatbuf, sizeof w.whatbuf, "every rank to reach call #%llu", (unsigned long long)k);
		w.what = w.whatbuf;
		while (!entered_all(&e))
			if ((rc = loom__shm_waiter_idle(&w, entered_all, &e)) != LOOM_OK)
				return rc;
	}
	for (int p = 0; p < S(c)->size; p++)
		if (p != S(c)->rank && (rc = loom__shm_check_call(c, k, p)) != LOOM_OK)
			return rc;
	return LOOM_OK;
}

int loom__shm_enter(loom_comm_t *c, const loom_xp_ctx_t *ctx, int coll)
{
	shm_comm_t *s = S(c);
	shm_rank_t *me = rank_rec(s->hdr, s->rank);
	int rc;
	if (coll != -2) {
		loom_xp_sig_t sig = loom_xp_coll_sig(c, ctx);
		hist_put(me, ctx->seq, &sig);
	}
	/* Published with release: this rank's consumptions (tails) are visible before its seq. */
	atomic_store_explicit(&me->coll, coll, memory_order_relaxed);
	atomic_store_explicit(&me->seq, ctx->seq, memory_order_release);
	if (coll != -2 || atomic_load_explicit(&s->hdr->abort_code, memory_order_relaxed) != 0)
		return LOOM_OK; /* a collective: nothing more here; earlier calls are checked where it waits */
	if ((rc = check_incoming(c, ctx)) != LOOM_OK)
		return rc;
	/* Destroy: every message of this rank's consumed or gone past, every peer at its last call. */
	for (int p = 0; p < s->size; p++)
		if (p != s->rank && (rc = settle_outgoing(c, ctx, p)) != LOOM_OK)
			return rc;
	if (ctx->seq > 1 && (rc = settle_call(c, ctx, ctx->seq - 1)) != LOOM_OK)
		return rc;
	/* A peer may have sent while this rank waited above: one more look. */
	return check_incoming(c, ctx);
}
