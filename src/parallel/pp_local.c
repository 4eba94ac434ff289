/* pp_local.c: the step executor of one pipeline stage holding the whole model: the trainer's loop of
 * micro-steps as it always was (src/parallel/pp.h).
 *
 * Invariant: a step here is exactly the loop the trainer ran before executors existed (zero_grad,
 * then per micro-step set_sync(last), forward_backward with scale 1/M, finish_grads, the loss added
 * in micro-step order), on the caller's model, allocating nothing; single-process and DDP losses and
 * checkpoints are therefore bit-identical to before (tests/test_train.c and test_ddp_train.c). */
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "parallel/pp.h"

typedef struct {
	loom_exec_t base;
	loom_exec_config_t cfg;
} local_exec_t;

static int local_create(loom_exec_t **out, const loom_exec_config_t *cfg)
{
	local_exec_t *e = loom__calloc(1, sizeof *e);
	*out = NULL;
	if (!e)
		return loom_seterr(LOOM_ENOMEM, "trainer: out of memory");
	e->base.ops = loom__exec_local();
	e->cfg = *cfg;
	*out = &e->base;
	return LOOM_OK;
}

static void local_destroy(loom_exec_t *e)
{
	free(e);
}

static loom_model_t *local_model(loom_exec_t *e)
{
	return ((local_exec_t *)e)->cfg.model;
}

static void local_flags(loom_exec_t *e, const unsigned char **norm_skip, const unsigned char **deferred)
{
	(void)e;
	*norm_skip = *deferred = NULL;
}

static int local_step(loom_exec_t *ex, loom_strategy_t *s, loom__batch_fn get, void *ctx, double *loss_sum,
                      loom_exec_stats_t *st)
{
	local_exec_t *e = (local_exec_t *)ex;
	const loom_exec_config_t *c = &e->cfg;
	float scale = 1.0f / (float)c->M, loss;
	int rc, *inputs = c->inputs, *targets = c->targets;
	*loss_sum = 0.0;
	memset(st, 0, sizeof *st);
	st->max_inflight = 1;
	loom_model_zero_grad(c->model);
	for (int j = 0; j < c->M; j++) {
		loom_strategy_stats_t ss;
		if ((rc = get(ctx, j, inputs, targets)) != LOOM_OK)
			return rc;
		/* Gradients are combined across ranks on the last micro-step only (as backward produces
		 * them); the earlier ones accumulate locally and communicate nothing. */
		s->ops->set_sync(s, j == c->M - 1);
		double t0 = loom_now();
		rc = loom_model_forward_backward(c->model, inputs, targets, c->B, c->T, scale, &loss);
		if (c->on_event)
			c->on_event(c->event_ctx, LOOM_EV_FORWARD, j, -2, t0, loom_now());
		if (rc != LOOM_OK)
			return loom_seterr(rc, "micro-step %d: %s", j, loom_errmsg()); /* the data window: get's */
		if ((rc = s->ops->finish_grads(s, &ss)) != LOOM_OK)
			return rc;
		st->comm_ms += ss.comm_ms, st->exposed_comm_ms += ss.exposed_comm_ms;
		*loss_sum += loss;
	}
	return LOOM_OK;
}

static int local_grad_norm(loom_exec_t *e, loom_strategy_t *s, double *norm)
{
	(void)e;
	return s->ops->grad_norm(s, norm);
}

static int local_eval(loom_exec_t *ex, loom_strategy_t *s, loom__batch_fn get, void *ctx, int n, float *losses)
{
	local_exec_t *e = (local_exec_t *)ex;
	const loom_exec_config_t *c = &e->cfg;
	int rc = LOOM_OK;
	(void)s;
	for (int j = 0; rc == LOOM_OK && j < n; j++)
		if ((rc = get(ctx, j, c->inputs, c->targets)) == LOOM_OK)
			rc = loom_model_forward(c->model, c->inputs, c->targets, c->B, c->T, &losses[j]);
	return rc;
}

static int local_save(loom_exec_t *e, loom_strategy_t *s, const loom_ckpt_writer_t *w)
{
	(void)e;
	return s->ops->save(s, w);
}

static int local_load(loom_exec_t *e, loom_strategy_t *s, const char *dir, long long step)
{
	(void)e;
	return s->ops->load(s, dir, step);
}

static const loom_exec_ops_t local_ops = {
	.name = "local",
	.create = local_create,
	.destroy = local_destroy,
	.model = local_model,
	.stage_flags = local_flags,
	.step = local_step,
	.grad_norm = local_grad_norm,
	.eval = local_eval,
	.save = local_save,
	.load = local_load,
};

const loom_exec_ops_t *loom__exec_local(void)
{
	return &local_ops;
}
