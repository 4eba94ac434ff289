/* request.c: non-blocking collectives: a FIFO of requests per communicator and the progress thread
 * that runs them in issue order.
 *
 * Why one thread per communicator running requests one at a time: collectives must run in the same
 * order on every rank, and the application thread issues them in program order, so a FIFO drained
 * by a single thread preserves that order without any cross-rank coordination. The thread starts
 * with the first non-blocking call. Blocking collectives drain the queue first and then run on the
 * caller's thread (no thread hop on the latency-critical path).
 *
 * Invariants (all under q_lock): a request is in the queue from submit until the thread takes it;
 * q_running is 1 while the thread executes one; done is set once, with rc and msg, and the request
 * is freed by the loom_wait / loom_test that observes done (or at destroy). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "core/util.h"

static void *progress_main(void *arg)
{
	loom_comm_t *c = arg;
	pthread_mutex_lock(&c->q_lock);
	for (;;) {
		loom_request_t *r;
		int rc;
		while (!c->q_head && !c->q_stop)
			pthread_cond_wait(&c->q_cond, &c->q_lock);
		if (!c->q_head)
			break;
		r = c->q_head;
		c->q_head = r->next;
		if (!c->q_head)
			c->q_tail = NULL;
		c->q_running = 1;
		pthread_mutex_unlock(&c->q_lock);
		rc = loom__comm_exec(c, &r->args, r->seq);
		pthread_mutex_lock(&c->q_lock);
		r->rc = rc;
		if (rc != LOOM_OK)
			snprintf(r->msg, sizeof r->msg, "%s", loom_errmsg());
		r->done = 1;
		c->q_running = 0;
		pthread_cond_broadcast(&c->q_cond);
	}
	pthread_mutex_unlock(&c->q_lock);
	return NULL;
}

void loom__comm_req_drain(loom_comm_t *c)
{
	if (!c->q_thread_started) /* set only by this (the application) thread: nothing was ever queued */
		return;
	pthread_mutex_lock(&c->q_lock);
	while (c->q_head || c->q_running)
		pthread_cond_wait(&c->q_cond, &c->q_lock);
	pthread_mutex_unlock(&c->q_lock);
}

void loom__comm_req_shutdown(loom_comm_t *c)
{
	pthread_mutex_lock(&c->q_lock);
	c->q_stop = 1;
	pthread_cond_broadcast(&c->q_cond);
	pthread_mutex_unlock(&c->q_lock);
	if (c->q_thread_started)
		pthread_join(c->q_thread, NULL);
	c->q_thread_started = 0;
}

int loom__comm_req_submit(loom_comm_t *c, const loom_coll_args_t *a, loom_request_t **req)
{
	loom_request_t *r = loom__calloc(1, sizeof *r);
	if (!r)
		return loom_comm_fail(c, LOOM_ENOMEM, "%s: out of memory for a request", loom_coll_name(a->coll));
	r->c = c;
	r->args = *a;
	pthread_mutex_lock(&c->q_lock);
	if (c->q_stop) {
		pthread_mutex_unlock(&c->q_lock);
		free(r);
		return loom_comm_fail(c, LOOM_ESTATE, "%s: the communicator is being destroyed", loom_coll_name(a->coll));
	}
	if (!c->q_thread_started) {
		if (pthread_create(&c->q_thread, NULL, progress_main, c) != 0) {
			pthread_mutex_unlock(&c->q_lock);
			free(r);
			return loom_comm_fail(c, LOOM_ESYS, "%s: cannot start the progress thread", loom_coll_name(a->coll));
		}
		c->q_thread_started = 1;
	}
	r->seq = ++c->coll_seq; /* the application thread owns coll_seq; issue order is sequence order */
	if (c->q_tail)
		c->q_tail->next = r;
	else
		c->q_head = r;
	c->q_tail = r;
	pthread_cond_broadcast(&c->q_cond);
	pthread_mutex_unlock(&c->q_lock);
	*req = r;
	return LOOM_OK;
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
	loom_comm_t *c;
	if (!req)
		return loom_seterr(LOOM_EINVAL, "loom_wait: request is NULL");
	c = req->c;
	pthread_mutex_lock(&c->q_lock);
	while (!req->done)
		pthread_cond_wait(&c->q_cond, &c->q_lock);
	pthread_mutex_unlock(&c->q_lock);
	return finish(req);
}

int loom_test(loom_request_t *req, int *done)
{
	loom_comm_t *c;
	int d;
	if (!req || !done)
		return loom_seterr(LOOM_EINVAL, "loom_test: %s is NULL", req ? "done" : "request");
	c = req->c;
	pthread_mutex_lock(&c->q_lock);
	d = req->done;
	pthread_mutex_unlock(&c->q_lock);
	*done = d;
	return d ? finish(req) : LOOM_OK;
}

static int icoll(loom_comm_t *c, loom_coll_args_t a, loom_request_t **req)
{
	int rc;
	if (!req)
		return loom_seterr(LOOM_EINVAL, "%s: req is NULL", loom_coll_name(a.coll));
	*req = NULL;
	if (!c)
		return loom_seterr(LOOM_EINVAL, "%s: communicator is NULL", loom_coll_name(a.coll));
	if ((rc = loom__comm_validate(c, &a)) != LOOM_OK)
		return rc;
	return loom__comm_req_submit(c, &a, req);
}

int loom_iallreduce(loom_comm_t *c, const void *send, void *recv, size_t count, loom_dtype_t dt, loom_op_t op,
                    loom_request_t **req)
{
	return icoll(c, (loom_coll_args_t){LOOM_COLL_ALLREDUCE, send, recv, count, dt, op, 0}, req);
}

int loom_ireduce(loom_comm_t *c, const void *send, void *recv, size_t count, loom_dtype_t dt, loom_op_t op, int root,
                 loom_request_t **req)
{
	return icoll(c, (loom_coll_args_t){LOOM_COLL_REDUCE, send, recv, count, dt, op, root}, req);
}

int loom_ibroadcast(loom_comm_t *c, void *buf, size_t count, loom_dtype_t dt, int root, loom_request_t **req)
{
	return icoll(c, (loom_coll_args_t){LOOM_COLL_BROADCAST, buf, buf, count, dt, LOOM_SUM, root}, req);
}

int loom_iallgather(loom_comm_t *c, const void *send, void *recv, size_t count_per_rank, loom_dtype_t dt,
                    loom_request_t **req)
{
	return icoll(c, (loom_coll_args_t){LOOM_COLL_ALLGATHER, send, recv, count_per_rank, dt, LOOM_SUM, 0}, req);
}

int loom_ireduce_scatter(loom_comm_t *c, const void *send, void *recv, size_t count_per_rank, loom_dtype_t dt,
                         loom_op_t op, loom_request_t **req)
{
	return icoll(c, (loom_coll_args_t){LOOM_COLL_REDUCE_SCATTER, send, recv, count_per_rank, dt, op, 0}, req);
}

int loom_ibarrier(loom_comm_t *c, loom_request_t **req)
{
	return icoll(c, (loom_coll_args_t){LOOM_COLL_BARRIER, NULL, NULL, 0, LOOM_FLOAT32, LOOM_SUM, 0}, req);
}
