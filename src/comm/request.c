/* request.c: non-blocking operations and the progress engine: one thread per process that runs
 * the queued requests of every communicator.
 *
 * Shape. Requests queue on lanes (comm_internal.h): a communicator's collectives form one lane,
 * because every rank must run them in issue order and the application issues them in program
 * order, so a FIFO preserves that order without cross-rank coordination; its sends to a peer and
 * its receives from a peer form one lane each (messages of a pair arrive in order). Different
 * lanes are independent: a tensor-parallel all-reduce, a data-parallel all-reduce and a pipeline
 * isend may all be in flight at once, issued in any order across communicators on different ranks.
 *
 * Why fibers. Algorithms are sequences of blocking transport calls. The engine runs each busy
 * lane's requests on a worker with a stack of its own (fiber.h); when a transport wait would block
 * while other lanes have work, the worker hands the thread back to the engine
 * (loom_xp_yield), which resumes the next lane round robin. When every worker is blocked the
 * engine spins briefly, then sleeps on the process's doorbell, which any message to this rank
 * rings. With a single busy lane (DDP's bucket all-reduces) nothing yields: the worker waits
 * exactly as a blocking call does, so latency and bandwidth are those of the blocking path.
 *
 * The thread starts with the first non-blocking call and ends when its last user communicator is
 * destroyed. Blocking calls never hop threads: they wait until the lanes they use are idle, then
 * run on the caller's thread.
 *
 * Invariants (under eng.lock): a lane is in_engine from the submit that gave it work until the
 * worker finds it empty; at most one worker runs a lane; a request's done is set once, with rc
 * and msg, and the request is freed by the loom_wait / loom_test that observes it. Each worker
 * keeps its own loom_cur (the thread-local operation context) across switches. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm_internal.h"
#include "comm/fiber.h"
#include "core/util.h"

#define WORKER_STACK (512u << 10) /* algorithms keep data in scratch buffers; frames are small */
#define ENGINE_SLEEP_S 0.05

typedef struct worker {
	loom_fiber_t *fiber;
	loom_lane_t *lane;       /* NULL: idle (in the pool) */
	loom_opctx_t cur;        /* the worker's loom_cur while switched out */
	int (*ready)(void *);    /* set when it yielded because it would block */
	void *ready_arg;
	struct worker *next;
} worker_t;

static struct {
	pthread_mutex_t lock;
	pthread_cond_t work; /* the engine waits here for lanes when it has none */
	pthread_cond_t done; /* loom_wait and drains wait here */
	int running, stop, users;
	pthread_t thread;
	loom_lane_t *in_head, *in_tail; /* lanes that got work and have no worker yet */
	atomic_int busy;                /* lanes with in_engine set */
	loom_fiber_t *self;             /* the engine thread's own context */
} eng = {.lock = PTHREAD_MUTEX_INITIALIZER, .work = PTHREAD_COND_INITIALIZER, .done = PTHREAD_COND_INITIALIZER};

static _Thread_local worker_t *cur_worker; /* the worker running on this (the engine) thread */

/* ---- running a lane ---------------------------------------------------------------------------- */

static int run_request(loom_request_t *r)
{
	loom_lane_t *l = r->lane;
	size_t bytes = r->args.count * loom_dtype_size(r->args.dt);
	if (l->kind == LANE_COLL)
		return loom__comm_exec(r->c, &r->args, r->seq);
	if (l->kind == LANE_SEND)
		return loom__comm_p2p_exec(r->c, "isend", r->peer, r->args.send, bytes, -1, NULL, 0, r->tag);
	return loom__comm_p2p_exec(r->c, "irecv", -1, NULL, 0, r->peer, r->args.recv, bytes, r->tag);
}

/* Finish a request: record its result and wake its waiters. Called with eng.lock held. */
static void complete(loom_request_t *r, int rc, const char *msg)
{
	r->rc = rc;
	if (rc != LOOM_OK)
		snprintf(r->msg, sizeof r->msg, "%s", msg);
	r->done = 1;
}

/* The lane ran dry: it leaves the engine. Called with eng.lock held. */
static void lane_idle(loom_lane_t *l)
{
	l->in_engine = 0;
	atomic_fetch_sub(&eng.busy, 1);
	pthread_cond_broadcast(&eng.done);
}

static void worker_main(void *arg)
{
	worker_t *w = arg;
	for (;;) {
		loom_lane_t *l = w->lane;
		pthread_mutex_lock(&eng.lock);
		while (l->head) {
			loom_request_t *r = l->head;
			int rc;
			l->head = r->next;
			if (!l->head)
				l->tail = NULL;
			l->cur = r;
			pthread_mutex_unlock(&eng.lock);
			rc = run_request(r);
			pthread_mutex_lock(&eng.lock);
			complete(r, rc, loom_errmsg());
			l->cur = NULL;
			pthread_cond_broadcast(&eng.done);
		}
		lane_idle(l); /* after this, l may be freed by its communicator's destroy */
		pthread_mutex_unlock(&eng.lock);
		w->lane = NULL;
		loom__fiber_switch(w->fiber, eng.self);
	}
}

static void resume(worker_t *w)
{
	cur_worker = w;
	loom_cur = w->cur;
	loom__fiber_switch(eng.self, w->fiber);
	w->cur = loom_cur;
	memset(&loom_cur, 0, sizeof loom_cur);
	cur_worker = NULL;
}

int loom_xp_should_yield(void)
{
	return cur_worker && atomic_load(&eng.busy) > 1; /* seq_cst: ordered after the waiter's sleepers increment */
}

void loom_xp_yield(int (*ready)(void *), void *arg)
{
	worker_t *w = cur_worker;
	if (!w)
		return;
	w->ready = ready, w->ready_arg = arg;
	loom__fiber_switch(w->fiber, eng.self);
}

/* ---- the engine thread ------------------------------------------------------------------------- */

typedef struct {
	worker_t *active;
	int nactive;
} idle_t;

static int any_ready(void *arg)
{
	idle_t *s = arg;
	if (atomic_load_explicit(&eng.busy, memory_order_acquire) > s->nactive)
		return 1; /* a lane got work */
	for (worker_t *w = s->active; w; w = w->next)
		if (!w->ready || w->ready(w->ready_arg))
			return 1;
	return 0;
}

/* Every worker is blocked: spin a little (as a blocking wait would, unless ranks outnumber cores),
 * then sleep in the transport until a message or a submission arrives. */
static void engine_idle(idle_t *s, double *idle_since)
{
	static long ncpu;
	double now = loom_now(), spin = 50e-6;
	loom_comm_t *first = s->active->lane->c;
	int jobs = 1;
	if (any_ready(s)) {
		*idle_since = 0;
		return;
	}
	if (!ncpu)
		ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	for (worker_t *w = s->active; w; w = w->next) {
		if (ncpu > 0 && w->lane->c->world_size > ncpu)
			spin = 0;
		jobs += w->lane->c->world_gen != first->world_gen;
	}
	if (*idle_since == 0)
		*idle_since = now;
	if (now - *idle_since < spin)
		return;
	/* Lanes of several jobs (several loom_comm_init alive at once) wake different doorbells: poll. */
	first->xp.ops->idle_wait(first, any_ready, s, jobs > 1 ? 1e-3 : ENGINE_SLEEP_S);
}

static worker_t *worker_new(void)
{
	worker_t *w = loom__calloc(1, sizeof *w);
	if (!w)
		return NULL;
	w->fiber = loom__fiber_create(WORKER_STACK, worker_main, w);
	if (!w->fiber) {
		free(w);
		return NULL;
	}
	return w;
}

/* No worker for lane l (out of memory): fail its queued requests. Called with eng.lock held. */
static void lane_fail(loom_lane_t *l)
{
	char msg[256];
	snprintf(msg, sizeof msg, "rank %d: out of memory for the progress engine's worker", l->c->rank);
	while (l->head) {
		loom_request_t *r = l->head;
		l->head = r->next;
		complete(r, LOOM_ENOMEM, msg);
	}
	l->tail = NULL;
	lane_idle(l);
}

static void *engine_main(void *arg)
{
	worker_t *pool = NULL;
	idle_t s = {NULL, 0};
	double idle_since = 0;
	(void)arg;
	eng.self = loom__fiber_self();
	pthread_mutex_lock(&eng.lock);
	for (;;) {
		worker_t **pp;
		int blocked = 0;
		while (eng.in_head) {
			loom_lane_t *l = eng.in_head;
			worker_t *w = pool;
			eng.in_head = l->next_in;
			if (!eng.in_head)
				eng.in_tail = NULL;
			if (w)
				pool = w->next;
			else if (!(w = worker_new())) {
				lane_fail(l);
				continue;
			}
			w->lane = l;
			memset(&w->cur, 0, sizeof w->cur);
			w->next = s.active;
			s.active = w;
			s.nactive++;
		}
		if (!s.active) {
			if (eng.stop)
				break;
			pthread_cond_wait(&eng.work, &eng.lock);
			continue;
		}
		pthread_mutex_unlock(&eng.lock);
		/* One round: resume every busy lane once. */
		for (pp = &s.active; *pp;) {
			worker_t *w = *pp;
			w->ready = NULL;
			resume(w);
			if (!w->lane) { /* its lane ran dry */
				*pp = w->next;
				s.nactive--;
				w->next = pool;
				pool = w;
				continue;
			}
			blocked += w->ready != NULL;
			pp = &w->next;
		}
		if (s.active && blocked == s.nactive)
			engine_idle(&s, &idle_since);
		else
			idle_since = 0;
		pthread_mutex_lock(&eng.lock);
	}
	eng.running = 0;
	pthread_mutex_unlock(&eng.lock);
	while (pool) {
		worker_t *w = pool;
		pool = w->next;
		loom__fiber_destroy(w->fiber);
		free(w);
	}
	return NULL;
}

/* ---- submitting and waiting -------------------------------------------------------------------- */

/* Queue r on its lane and make sure the engine runs. Called by the application thread. */
static int submit(loom_comm_t *c, loom_request_t *r, const char *op)
{
	loom_lane_t *l = r->lane;
	int wake = 0;
	pthread_mutex_lock(&eng.lock);
	if (!eng.running) {
		eng.stop = 0;
		int e = loom__thread_start(&eng.thread, NULL, engine_main, NULL, "progress");
		if (e != 0) {
			pthread_mutex_unlock(&eng.lock);
			free(r);
			return loom_comm_fail(c, LOOM_ESYS, "%s: cannot start the progress thread (non-blocking operations "
			                      "run on it): pthread_create: %s%s", op, strerror(e),
			                      e == EAGAIN ? " (a limit on threads or processes: ulimit -u, the cgroup's pids.max)" : "");
		}
		eng.running = 1;
	}
	if (!c->engine_user) {
		c->engine_user = 1;
		eng.users++;
	}
	if (l->kind == LANE_COLL)
		r->seq = ++c->coll_seq; /* the application thread owns coll_seq; issue order is sequence order */
	if (l->tail)
		l->tail->next = r;
	else
		l->head = r;
	l->tail = r;
	if (!l->in_engine) {
		l->in_engine = 1;
		l->next_in = NULL;
		if (eng.in_tail)
			eng.in_tail->next_in = l;
		else
			eng.in_head = l;
		eng.in_tail = l;
		atomic_fetch_add(&eng.busy, 1);
		pthread_cond_signal(&eng.work);
		wake = 1;
	}
	pthread_mutex_unlock(&eng.lock);
	if (wake) /* the engine may sleep inside a worker's wait or its own idle wait */
		c->xp.ops->wake_self(c);
	return LOOM_OK;
}

void loom__comm_lane_drain(loom_comm_t *c, loom_lane_t *l)
{
	if (!l || !c->engine_user) /* engine_user is set by this (the application) thread only */
		return;
	pthread_mutex_lock(&eng.lock);
	while (l->in_engine)
		pthread_cond_wait(&eng.done, &eng.lock);
	pthread_mutex_unlock(&eng.lock);
}

void loom__comm_req_drain(loom_comm_t *c)
{
	loom__comm_lane_drain(c, &c->coll_lane);
}

void loom__comm_req_shutdown(loom_comm_t *c)
{
	int join = 0;
	pthread_t t;
	if (!c->engine_user)
		return;
	pthread_mutex_lock(&eng.lock);
	while (c->coll_lane.in_engine)
		pthread_cond_wait(&eng.done, &eng.lock);
	for (int i = 0; c->p2p_lanes && i < 2 * c->size; i++)
		while (c->p2p_lanes[i].in_engine)
			pthread_cond_wait(&eng.done, &eng.lock);
	c->engine_user = 0;
	if (--eng.users == 0 && eng.running) {
		eng.stop = 1;
		pthread_cond_signal(&eng.work);
		t = eng.thread;
		join = 1;
	}
	pthread_mutex_unlock(&eng.lock);
	if (join)
		pthread_join(t, NULL);
}

int loom__comm_req_submit(loom_comm_t *c, const loom_coll_args_t *a, loom_request_t **req)
{
	/* The v-collectives' counts are copied behind the request: the caller's array may go. */
	size_t extra = a->counts ? (size_t)c->size * sizeof *a->counts : 0;
	loom_request_t *r = loom__calloc(1, sizeof *r + extra);
	int rc;
	if (!r)
		return loom_comm_fail(c, LOOM_ENOMEM, "%s: out of memory for a request", loom_coll_name(a->coll));
	r->c = c;
	r->lane = &c->coll_lane;
	r->args = *a;
	if (extra) {
		memcpy(r + 1, a->counts, extra);
		r->args.counts = (const size_t *)(r + 1);
	}
	if ((rc = submit(c, r, loom_coll_name(a->coll))) != LOOM_OK)
		return rc;
	*req = r;
	return LOOM_OK;
}

loom_lane_t *loom__comm_p2p_lane(loom_comm_t *c, int send, int peer)
{
	return c->p2p_lanes ? &c->p2p_lanes[(send ? 0 : c->size) + peer] : NULL;
}

/* Finish a completed request: publish its error detail on this thread and free it. */
static int finish(loom_request_t *r)
{
	int rc = r->rc;
	if (rc != LOOM_OK)
		loom_seterr(rc, "%s", r->msg);
	free(r);
	return rc;
}

int loom_wait(loom_request_t *req)
{
	if (!req)
		return loom_seterr(LOOM_EINVAL, "loom_wait: request is NULL");
	pthread_mutex_lock(&eng.lock);
	while (!req->done)
		pthread_cond_wait(&eng.done, &eng.lock);
	pthread_mutex_unlock(&eng.lock);
	return finish(req);
}

int loom_test(loom_request_t *req, int *done)
{
	int d;
	if (!req || !done)
		return loom_seterr(LOOM_EINVAL, "loom_test: %s is NULL", req ? "done" : "request");
	pthread_mutex_lock(&eng.lock);
	d = req->done;
	pthread_mutex_unlock(&eng.lock);
	*done = d;
	return d ? finish(req) : LOOM_OK;
}

/* ---- the public non-blocking calls --------------------------------------------------------------- */

static int icoll(loom_comm_t *c, loom_coll_args_t a, loom_request_t **req)
{
	int rc;
	if (!req)
		return loom_seterr(LOOM_EINVAL, "%s: req is NULL", loom_coll_name(a.coll));
	*req = NULL;
	if (!c)
		return loom_seterr(LOOM_EINVAL, "%s: communicator is NULL", loom_coll_name(a.coll));
	if ((rc = loom__comm_validate(c, &a)) != LOOM_OK) {
		loom__comm_skip_seq(c);
		return rc;
	}
	return loom__comm_req_submit(c, &a, req);
}

int loom_iallreduce(loom_comm_t *c, const void *send, void *recv, size_t count, loom_dtype_t dt, loom_op_t op,
                    loom_request_t **req)
{
	return icoll(c, (loom_coll_args_t){LOOM_COLL_ALLREDUCE, send, recv, count, dt, op, 0, NULL, 0}, req);
}

int loom_ireduce(loom_comm_t *c, const void *send, void *recv, size_t count, loom_dtype_t dt, loom_op_t op, int root,
                 loom_request_t **req)
{
	return icoll(c, (loom_coll_args_t){LOOM_COLL_REDUCE, send, recv, count, dt, op, root, NULL, 0}, req);
}

int loom_ibroadcast(loom_comm_t *c, void *buf, size_t count, loom_dtype_t dt, int root, loom_request_t **req)
{
	return icoll(c, (loom_coll_args_t){LOOM_COLL_BROADCAST, buf, buf, count, dt, LOOM_SUM, root, NULL, 0}, req);
}

int loom_iallgather(loom_comm_t *c, const void *send, void *recv, size_t count_per_rank, loom_dtype_t dt,
                    loom_request_t **req)
{
	return icoll(c, (loom_coll_args_t){LOOM_COLL_ALLGATHER, send, recv, count_per_rank, dt, LOOM_SUM, 0,
	             NULL, 0}, req);
}

int loom_ireduce_scatter(loom_comm_t *c, const void *send, void *recv, size_t count_per_rank, loom_dtype_t dt,
                         loom_op_t op, loom_request_t **req)
{
	return icoll(c, (loom_coll_args_t){LOOM_COLL_REDUCE_SCATTER, send, recv, count_per_rank, dt, op, 0,
	             NULL, 0}, req);
}

int loom_ibarrier(loom_comm_t *c, loom_request_t **req)
{
	return icoll(c, (loom_coll_args_t){LOOM_COLL_BARRIER, NULL, NULL, 0, LOOM_FLOAT32, LOOM_SUM, 0, NULL, 0}, req);
}

int loom_iallgatherv(loom_comm_t *c, const void *send, size_t sendcount, void *recv, const size_t *recvcounts,
                     loom_dtype_t dt, loom_request_t **req)
{
	return icoll(c, (loom_coll_args_t){LOOM_COLL_ALLGATHERV, send, recv, sendcount, dt, LOOM_SUM, 0, recvcounts, 0},
	             req);
}

int loom_ireduce_scatterv(loom_comm_t *c, const void *send, void *recv, const size_t *recvcounts, loom_dtype_t dt,
                          loom_op_t op, loom_request_t **req)
{
	return icoll(c, (loom_coll_args_t){LOOM_COLL_REDUCE_SCATTERV, send, recv, 0, dt, op, 0, recvcounts, 0}, req);
}

/* Point to point: validated like loom_send / loom_recv, then queued on the peer's lane. */
static int ip2p(loom_comm_t *c, int send, void *buf, size_t count, loom_dtype_t dt, int peer, int tag,
                loom_request_t **req)
{
	const char *op = send ? "loom_isend" : "loom_irecv";
	loom_request_t *r;
	int rc;
	if (!req)
		return loom_seterr(LOOM_EINVAL, "%s: req is NULL", op);
	*req = NULL;
	if (!c)
		return loom_seterr(LOOM_EINVAL, "%s: communicator is NULL", op);
	if ((rc = loom__comm_p2p_check(c, op + 5, buf, count, dt, peer)) != LOOM_OK)
		return rc;
	if (!c->p2p_lanes) {
		c->p2p_lanes = loom__calloc(2 * (size_t)c->size, sizeof *c->p2p_lanes);
		if (!c->p2p_lanes)
			return loom_comm_fail(c, LOOM_ENOMEM, "%s: out of memory", op + 5);
		for (int i = 0; i < 2 * c->size; i++)
			c->p2p_lanes[i] = (loom_lane_t){.c = c, .kind = i < c->size ? LANE_SEND : LANE_RECV, .peer = i % c->size};
	}
	if (!(r = loom__calloc(1, sizeof *r)))
		return loom_comm_fail(c, LOOM_ENOMEM, "%s: out of memory for a request", op + 5);
	r->c = c;
	r->lane = loom__comm_p2p_lane(c, send, peer);
	r->args = (loom_coll_args_t){LOOM_COLL_BARRIER, send ? buf : NULL, send ? NULL : buf, count, dt, LOOM_SUM, 0,
	           NULL, 0};
	r->peer = peer, r->tag = tag;
	if ((rc = submit(c, r, op + 5)) != LOOM_OK)
		return rc;
	*req = r;
	return LOOM_OK;
}

int loom_isend(loom_comm_t *c, const void *buf, size_t count, loom_dtype_t dt, int peer, int tag, loom_request_t **req)
{
	return ip2p(c, 1, (void *)buf, count, dt, peer, tag, req);
}

int loom_irecv(loom_comm_t *c, void *buf, size_t count, loom_dtype_t dt, int peer, int tag, loom_request_t **req)
{
	return ip2p(c, 0, buf, count, dt, peer, tag, req);
}
