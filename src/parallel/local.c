/* local.c: the parallel strategy of one data-parallel rank: the model keeps its own gradient buffer,
 * one AdamW covers every parameter, and nothing is communicated.
 *
 * Invariant: a step through this strategy is exactly the single-process step (loom_grad_norm and
 * loom_adamw_step over the model's own buffers), with no communication and no allocation; the
 * trainer's single-process losses and checkpoints are therefore those it had before strategies
 * existed (tests/test_train.c's bit-identical resume and accumulation tests check it). */
#include <stdlib.h>

#include "core/util.h"
#include "parallel/strategy.h"

static void local_destroy(loom_strategy_t *s)
{
	loom__replica_free(s);
	free(s);
}

static int local_create(loom_strategy_t **out, const loom_strategy_config_t *cfg)
{
	loom_strategy_t *s = loom__calloc(1, sizeof *s);
	int rc;
	*out = NULL;
	if (!s)
		return loom_seterr(LOOM_ENOMEM, "trainer: out of memory");
	s->ops = loom__local_strategy();
	if ((rc = loom__replica_init(s, cfg, loom_model_grads(cfg->model))) != LOOM_OK) {
		local_destroy(s);
		return rc;
	}
	*out = s;
	return LOOM_OK;
}

static void local_set_sync(loom_strategy_t *s, int sync)
{
	(void)s, (void)sync;
}

static int local_finish_grads(loom_strategy_t *s, loom_strategy_stats_t *st)
{
	(void)s;
	st->comm_ms = st->exposed_comm_ms = 0.0;
	return LOOM_OK;
}

static int local_nothing(loom_strategy_t *s)
{
	(void)s;
	return LOOM_OK;
}

static const loom_strategy_ops_t local_ops = {
	.name = "local",
	.create = local_create,
	.destroy = local_destroy,
	.set_sync = local_set_sync,
	.finish_grads = local_finish_grads,
	.grad_norm = loom__replica_grad_norm,
	.optim_step = loom__replica_optim_step,
	.sync_params = local_nothing,
	.check_replicas = local_nothing,
	.save = loom__replica_save,
	.load = loom__replica_load,
};

const loom_strategy_ops_t *loom__local_strategy(void)
{
	return &local_ops;
}
