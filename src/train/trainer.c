/* trainer.c: the training loop: micro-steps with gradient accumulation, global-norm clipping,
 * AdamW under an LR schedule, evaluation, and the run loop that logs and checkpoints. How the
 * training state is spread over the data-parallel ranks is the parallel strategy's business
 * (src/parallel/strategy.h): the loop calls its operations and never asks which one it has. How a
 * step's micro-batches run is the step executor's (src/parallel/pp.h): the local loop on the whole
 * model, or, on a mesh with pp > 1, this rank's pipeline stage running a GPipe or 1F1B schedule (the
 * strategy then attaches to the stage's model and covers its tensors).
 *
 * Invariants: after k calls of loom_trainer_step, tr->step == k, the optimizer has taken k steps and
 * the train loader's position is window k*accum*dp_size + dp_rank, so the whole training state is
 * (model parameters, AdamW m/v/step, loader state) and checkpoint.c saves exactly that. A step
 * allocates nothing. With several ranks, every collective call happens on every rank in the same
 * order (the steps, evaluations, replica checks and saves of the run loop depend only on the step
 * number), and the strategy keeps the replicas consistent (for DDP: the averaged gradients are
 * bit-identical on every rank, so the norm, clipping and AdamW keep the replicas identical without
 * further communication). A step that fails in a collective returns before its optimizer update
 * (with a replicated strategy every collective of a step precedes it), so the state stays that of the
 * last completed step, tr->step: what loom_trainer_save_replica writes for an elastic job's restart
 * without the disk (checkpoint.c). Data sharding, the batch and the checkpoints' loader states follow the
 * data-parallel coordinate (dp_rank of dp_size), logging and writing follow the global rank 0; with
 * tp = pp = cp = 1 both are the world rank. With context parallelism the cp ranks of a group read the
 * same windows and give the model their rows of the layout (loom_cp_chunks, loom_cp_take); the strategy, the loss and the evaluation span
 * dp x cp (tr->grad), the loader and the checkpoints' loader states the dp coordinate alone. Evaluation reads validation windows directly
 * (loom_loader_window) and does not touch the training state, so evaluating or not never changes
 * the training losses. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/util.h"
#include "loom/ckpt.h"
#include "loom/ddp.h"
#include "loom/mesh.h"
#include "train/trainer_internal.h"

loom_train_config_t loom_train_defaults(void)
{
	loom_train_config_t c;
	memset(&c, 0, sizeof c);
	c.accum = 1;
	c.seed = 1337;
	c.adamw = loom_adamw_defaults();
	c.muon = loom_muon_defaults();
	c.grad_clip = 1.0;
	c.lr.kind = LOOM_SCHED_COSINE;
	c.lr.min_lr_frac = 0.0;
	c.eval_batches = 20;
	c.bucket_mb = 25;
	return c;
}

static int dup_str(char **dst, const char *src)
{
	*dst = NULL;
	if (!src)
		return LOOM_OK;
	*dst = loom__strdup(src);
	return *dst ? LOOM_OK : loom_seterr(LOOM_ENOMEM, "trainer: out of memory");
}

/* Every token of the first windows (about 1M tokens) of a data set must be a valid id of the model,
 * checked at start; the loader (created with the model's vocab_size) checks every later window as it
 * reads it, so an id the model cannot embed is always an error naming the shard and offset. */
static int check_vocab(loom_trainer_t *tr, loom_loader_t *ld, const char *what)
{
	uint64_t W = loom_loader_windows_per_epoch(ld), bt = (uint64_t)tr->cfg.B * (uint64_t)tr->cfg.T;
	uint64_t n = LOOM_MIN(W, (1000000 + bt - 1) / bt);
	for (uint64_t k = 0; k < n; k++) {
		int rc = loom_loader_window(ld, k, tr->inputs, tr->targets);
		if (rc != LOOM_OK)
			return loom_seterr(rc, "%s data: %s", what, loom_errmsg());
	}
	return LOOM_OK;
}

static int check_config(const loom_train_config_t *c, loom_model_t *model)
{
	const loom_model_config_t *mc = loom_model_get_config(model);
	int rc;
	if (!c->train_data || !*c->train_data)
		return loom_seterr(LOOM_EINVAL, "trainer: no training data given (--train-data GLOB)");
	if (c->B <= 0 || c->T <= 0)
		return loom_seterr(LOOM_EINVAL, "trainer: batch size %d and sequence length %d must be positive", c->B, c->T);
	if (c->T > mc->seq_len)
		return loom_seterr(LOOM_EINVAL, "trainer: sequence length %d exceeds the model's maximum seq_len %d", c->T,
		                   mc->seq_len);
	if (c->accum < 1)
		return loom_seterr(LOOM_EINVAL, "trainer: gradient accumulation %d must be >= 1", c->accum);
	if ((rc = loom_schedule_check(&c->lr)) != LOOM_OK)
		return rc;
	if (c->eval_every < 0 || c->save_every < 0 || c->eval_batches < 0)
		return loom_seterr(LOOM_EINVAL, "trainer: eval-every %d, eval-batches %d and save-every %d must be >= 0",
		                   c->eval_every, c->eval_batches, c->save_every);
	if (c->val_data && c->eval_batches == 0)
		return loom_seterr(LOOM_EINVAL, "trainer: eval-batches must be > 0 to evaluate");
	if (!isfinite(c->grad_clip) || c->grad_clip < 0)
		return loom_seterr(LOOM_EINVAL, "trainer: grad clip %g must be finite and >= 0 (0 disables clipping)",
		                   c->grad_clip);
	/* eps = 0 divides 0 by 0 for a parameter whose gradient has always been 0 (NaN weights, saved) */
	if (!(c->adamw.eps > 0.0f) || !isfinite(c->adamw.eps))
		return loom_seterr(LOOM_EINVAL, "trainer: AdamW eps %g must be finite and > 0 (e.g. 1e-8)", c->adamw.eps);
	if (!(c->adamw.beta1 >= 0.0f && c->adamw.beta1 < 1.0f) || !(c->adamw.beta2 >= 0.0f && c->adamw.beta2 < 1.0f))
		return loom_seterr(LOOM_EINVAL, "trainer: AdamW betas (%g, %g) must be in [0, 1)", c->adamw.beta1,
		                   c->adamw.beta2);
	if (!(c->adamw.weight_decay >= 0.0f) || !isfinite(c->adamw.weight_decay))
		return loom_seterr(LOOM_EINVAL, "trainer: AdamW weight decay %g must be finite and >= 0",
		                   c->adamw.weight_decay);
	if (c->save_dir && (rc = loom_ckpt_check_save_dir(c->save_dir)) != LOOM_OK)
		return rc;
	if (!(c->bucket_mb > 0 && c->bucket_mb < 1e6) &&
	    ((c->comm && loom_comm_size(c->comm) > 1) || (c->mesh && loom_mesh_world_size(c->mesh) > 1)))
		return loom_seterr(LOOM_EINVAL, "trainer: bucket size %g MiB must be > 0", c->bucket_mb);
	if (c->grad_reduce_dtype != LOOM_FLOAT32 && c->grad_reduce_dtype != LOOM_BFLOAT16)
		return loom_seterr(LOOM_EINVAL, "trainer: gradients are reduced in float32 or bfloat16, not %s",
		                   loom_dtype_name(c->grad_reduce_dtype));
	if (c->check_replicas < 0)
		return loom_seterr(LOOM_EINVAL, "trainer: check-replicas %d must be >= 0", c->check_replicas);
	loom_pp_schedule_t sched = LOOM_PP_1F1B;
	if (c->pp_schedule && (rc = loom__pp_schedule_parse(c->pp_schedule, &sched)) != LOOM_OK)
		return loom_seterr(rc, "trainer: %s", loom_errmsg());
	if (!(c->pp_head_split < 1.0))
		return loom_seterr(LOOM_EINVAL, "trainer: pipeline head split %g must be < 1 (a fraction of the positions; "
		                   "0: balanced by FLOPs, negative: off)", c->pp_head_split);
	int cp = c->mesh ? loom_mesh_size(c->mesh, LOOM_MESH_CP) : 1;
	if (cp != loom_model_cp_size(model) || (c->mesh && loom_mesh_coord(c->mesh, LOOM_MESH_CP) != loom_model_cp_rank(model)))
		return loom_seterr(LOOM_EINVAL, "trainer: rank %d: the mesh puts it at context-parallel rank %d of %d, but the "
		                   "model was created as rank %d of %d (loom_model_opts_t cp_size, cp_rank)",
		                   c->mesh ? loom_mesh_world_rank(c->mesh) : 0, c->mesh ? loom_mesh_coord(c->mesh, LOOM_MESH_CP) : 0,
		                   cp, loom_model_cp_rank(model), loom_model_cp_size(model));
	if (cp > 1 && (rc = loom_cp_check(c->T, cp)) != LOOM_OK)
		return loom_seterr(rc, "trainer: --cp %d: %s", cp, loom_errmsg());
	if (c->mesh) {
		int tp = loom_mesh_size(c->mesh, LOOM_MESH_TP), pp = loom_mesh_size(c->mesh, LOOM_MESH_PP);
		if (pp > mc->n_layer)
			return loom_seterr(LOOM_EINVAL, "trainer: rank %d: a pipeline of %d stages for a model of %d layers: "
			                   "every stage needs at least one layer (pp <= %d)", loom_mesh_world_rank(c->mesh), pp,
			                   mc->n_layer, mc->n_layer);
		if (tp != loom_model_tp_size(model) || loom_mesh_coord(c->mesh, LOOM_MESH_TP) != loom_model_tp_rank(model))
			return loom_seterr(LOOM_EINVAL, "trainer: rank %d: the mesh puts it at tensor-parallel rank %d of %d, but "
			                   "the model was created as shard %d of %d (loom_model_opts_t tp_size, tp_rank)",
			                   loom_mesh_world_rank(c->mesh), loom_mesh_coord(c->mesh, LOOM_MESH_TP), tp,
			                   loom_model_tp_rank(model), loom_model_tp_size(model));
		if (c->comm && c->comm != loom_mesh_world(c->mesh))
			return loom_seterr(LOOM_EINVAL, "trainer: both a communicator and a mesh over another one were given: "
			                   "give the mesh only");
	} else if (loom_model_tp_size(model) != 1) {
		return loom_seterr(LOOM_EINVAL, "trainer: the model is tensor-parallel shard %d of %d: give a mesh with "
		                   "tp = %d", loom_model_tp_rank(model), loom_model_tp_size(model), loom_model_tp_size(model));
	}
	int pp = c->mesh ? loom_mesh_size(c->mesh, LOOM_MESH_PP) : 1;
	if ((rc = loom_pp_check(mc, c->pp_schedule, pp, c->pp_virtual_stages, c->accum)) != LOOM_OK)
		return loom_seterr(rc, "trainer: %s", loom_errmsg());
	return LOOM_OK;
}

/* Who this rank is: global rank and size, its data-parallel axis, its context-parallel axis and the
 * data-parallel group dp x cp (each NULL when it has one rank). */
static void topology(loom_trainer_t *tr, const loom_train_config_t *c)
{
	tr->world = 1, tr->rank = 0, tr->dp = NULL, tr->tp = NULL, tr->dp_rank = 0, tr->dp_size = 1;
	tr->cp = tr->grad = NULL, tr->cp_rank = 0, tr->cp_size = 1;
	if (c->mesh) {
		tr->world = loom_mesh_world_size(c->mesh), tr->rank = loom_mesh_world_rank(c->mesh);
		tr->dp = loom_mesh_comm(c->mesh, LOOM_MESH_DP);
		tr->tp = loom_mesh_comm(c->mesh, LOOM_MESH_TP);
		tr->cp = loom_mesh_comm(c->mesh, LOOM_MESH_CP);
		tr->grad = loom_mesh_dpcp_comm(c->mesh);
	} else if (c->comm) {
		tr->world = loom_comm_size(c->comm), tr->rank = loom_comm_rank(c->comm);
		tr->dp = tr->grad = c->comm;
	}
	if (tr->dp && loom_comm_size(tr->dp) == 1)
		tr->dp = NULL; /* a communicator of one rank is the same as none */
	if (tr->grad && loom_comm_size(tr->grad) == 1)
		tr->grad = NULL;
	if (tr->dp)
		tr->dp_rank = loom_comm_rank(tr->dp), tr->dp_size = loom_comm_size(tr->dp);
	if (tr->cp)
		tr->cp_rank = loom_comm_rank(tr->cp), tr->cp_size = loom_comm_size(tr->cp);
	tr->pp = c->mesh ? loom_mesh_comm(c->mesh, LOOM_MESH_PP) : NULL, tr->pp_rank = 0, tr->pp_size = 1;
	if (tr->pp)
		tr->pp_rank = loom_comm_rank(tr->pp), tr->pp_size = loom_comm_size(tr->pp);
}

/* The model's context-parallel hook: the group's operation, and with --trace its time when it waited
 * (a gather, a reduce-scatter, the ring's wait for the keys: the ring's transfers themselves run behind
 * the blocks' work). */
static int cp_hook(void *ctx, float *buf, size_t n, loom_tp_op_t op)
{
	loom_trainer_t *tr = ctx;
	double t0 = tr->trace ? loom_now() : 0.0;
	int rc = loom__tp_group_reduce(&tr->cpg, buf, n, op);
	if (tr->trace && op != LOOM_TP_SEND_NEXT && op != LOOM_TP_RECV_PREV)
		loom__trace_event(tr->trace, LOOM_EV_CP, -1, (int)op, t0, loom_now());
	return rc;
}

/* Context parallel: this rank's rows (its chunks of the layout, loom_cp_chunks of the model's
 * configuration: the model computes the same) of the window in tr->inputs, targets. */
static void take_rows(loom_trainer_t *tr, int *inputs, int *targets)
{
	int K = loom_cp_chunks(loom_model_get_config(tr->model), tr->cfg.T, tr->cp_size);
	loom_cp_take(inputs, tr->inputs, tr->cfg.B, tr->cfg.T, tr->cp_size, K, tr->cp_rank);
	loom_cp_take(targets, tr->targets, tr->cfg.B, tr->cfg.T, tr->cp_size, K, tr->cp_rank);
}

/* The trainer's loader as the executor's source of micro-batches (with context parallelism every rank
 * of a group reads the same window and keeps its rows). */
static int next_batch(void *ctx, int j, int *inputs, int *targets)
{
	loom_trainer_t *tr = ctx;
	loom_loader_state_t st;
	int rc;
	(void)j;
	loom_loader_get_state(tr->train, &st);
	tr->window = (unsigned long long)st.next_window;
	if (tr->data_trace) /* the global position: window k, and where its tokens start */
		fprintf(tr->data_trace, "step %lld window %llu token %llu\n", tr->step + 1, tr->window,
		        (unsigned long long)loom_loader_window_start(tr->train, st.next_window) * (unsigned long long)tr->cfg.B *
		            (unsigned long long)tr->cfg.T);
	if (tr->cp_size == 1)
		return loom_loader_next(tr->train, inputs, targets);
	if ((rc = loom_loader_next(tr->train, tr->inputs, tr->targets)) == LOOM_OK)
		take_rows(tr, inputs, targets);
	return rc;
}

int loom_trainer_create(loom_trainer_t **out, const loom_train_config_t *cfg, loom_model_t *model)
{
	loom_trainer_t *tr;
	loom_loader_opts_t lo;
	int rc;
	*out = NULL;
	if (!model)
		return loom_seterr(LOOM_EINVAL, "trainer: no model");
	if ((rc = check_config(cfg, model)) != LOOM_OK)
		return rc;
	tr = loom__calloc(1, sizeof *tr);
	if (!tr)
		return loom_seterr(LOOM_ENOMEM, "trainer: out of memory");
	tr->cfg = *cfg;
	tr->model = model;
	tr->mcfg = *loom_model_get_config(model);
	topology(tr, cfg);
	if ((rc = dup_str(&tr->train_data, cfg->train_data)) || (rc = dup_str(&tr->val_data, cfg->val_data)) ||
	    (rc = dup_str(&tr->save_dir, cfg->save_dir)) || (rc = dup_str(&tr->log_path, cfg->log_path)) ||
	    (rc = dup_str(&tr->tokenizer, cfg->tokenizer)) || (rc = dup_str(&tr->strategy_name, cfg->strategy)) ||
	    (rc = dup_str(&tr->pp_schedule, cfg->pp_schedule)) || (rc = dup_str(&tr->trace_dir, cfg->trace_dir)))
		goto fail;
	tr->cfg.train_data = tr->train_data, tr->cfg.val_data = tr->val_data;
	tr->cfg.save_dir = tr->save_dir, tr->cfg.log_path = tr->log_path, tr->cfg.tokenizer = tr->tokenizer;
	tr->cfg.strategy = tr->strategy_name, tr->cfg.pp_schedule = tr->pp_schedule, tr->cfg.trace_dir = tr->trace_dir;
	tr->inputs = loom__malloc((size_t)cfg->B * cfg->T * sizeof(int));
	tr->targets = loom__malloc((size_t)cfg->B * cfg->T * sizeof(int));
	if (tr->cp_size > 1) {
		tr->cp_inputs = loom__malloc((size_t)cfg->B * (cfg->T / tr->cp_size) * sizeof(int));
		tr->cp_targets = loom__malloc((size_t)cfg->B * (cfg->T / tr->cp_size) * sizeof(int));
	}
	if (!tr->inputs || !tr->targets || (tr->cp_size > 1 && (!tr->cp_inputs || !tr->cp_targets))) {
		rc = loom_seterr(LOOM_ENOMEM, "trainer: out of memory for a batch of %d x %d (2 x %zu bytes)", cfg->B, cfg->T,
		                 (size_t)cfg->B * cfg->T * sizeof(int));
		goto fail;
	}
	if (cfg->trace_dir && (rc = loom__trace_open(&tr->trace, cfg->trace_dir, tr->rank)) != LOOM_OK)
		goto fail;
	/* The executor (with a pipeline axis: this rank's stage, a model of its layers; collective over
	 * the axis), then the strategy (an unsupported one fails before the data is read), which attaches
	 * to the executor's model: its gradient view points at the strategy's storage until destroy. */
	/* With context parallelism the model (and so the executor) holds the rank's T/cp rows of each
	 * sequence: the executor reads them from next_batch and never sees a whole window. */
	loom_exec_config_t ec = {.model = model, .seed = cfg->seed, .pp = tr->pp, .tp = tr->tp, .B = cfg->B,
	                         .T = cfg->T / tr->cp_size, .M = cfg->accum, .schedule = LOOM_PP_1F1B,
	                         .inputs = tr->cp_size > 1 ? tr->cp_inputs : tr->inputs,
	                         .targets = tr->cp_size > 1 ? tr->cp_targets : tr->targets,
	                         .on_event = tr->trace ? loom__trace_event : NULL, .event_ctx = tr->trace};
	if (cfg->pp_schedule)
		loom__pp_schedule_parse(cfg->pp_schedule, &ec.schedule); /* checked above */
	ec.head_split = cfg->pp_head_split;
	ec.V = cfg->pp_virtual_stages;
	const loom_exec_ops_t *eo = tr->pp ? loom__exec_pipeline() : loom__exec_local();
	if ((rc = eo->create(&tr->exec, &ec)) != LOOM_OK)
		goto fail;
	if (tr->cp_size > 1) { /* the attention's gathers over the context-parallel group */
		loom__tp_group_init(&tr->cpg, tr->cp);
		tr->cpg.name = "context parallel";
		loom_model_on_cp_reduce(eo->model(tr->exec), cp_hook, tr);
	}
	/* The strategy spans the ranks holding the same model shard: dp x cp (a context-parallel rank's
	 * gradient is of its share of the positions; their average is the whole batch's). */
	loom_strategy_config_t sc = {.name = cfg->strategy, .zero = cfg->zero, .model = eo->model(tr->exec),
	                             .dp = tr->grad, .tp = tr->tp, .writer = tr->rank == 0, .adamw = cfg->adamw,
	                             .bucket_mb = cfg->bucket_mb,
	                             .grad_reduce_dtype = cfg->grad_reduce_dtype, .optimizer = cfg->optimizer,
	                             .muon = cfg->muon};
	eo->stage_flags(tr->exec, &sc.norm_skip, &sc.deferred);
	if ((rc = loom__strategy_create(&tr->strategy, &sc)) != LOOM_OK)
		goto fail;
	memset(&lo, 0, sizeof lo);
	lo.B = cfg->B, lo.T = cfg->T, lo.shuffle = cfg->shuffle, lo.seed = cfg->seed;
	lo.rank = tr->dp_rank, lo.world = tr->dp_size;
	lo.vocab_size = tr->mcfg.vocab_size;
	if ((rc = loom_loader_create(&tr->train, cfg->train_data, &lo)) != LOOM_OK)
		goto fail;
	if ((rc = check_vocab(tr, tr->train, "training")) != LOOM_OK)
		goto fail;
	{ /* LOOM_DATA_TRACE=DIR: "step S window K token OFFSET" per window read, to DIR/data.rR.pPID (audits the
	   * global data order across restarts and mesh changes: docs/launcher.md) */
		const char *dt = getenv("LOOM_DATA_TRACE");
		if (dt && *dt) {
			char path[4096];
			snprintf(path, sizeof path, "%s/data.r%d.p%d", dt, tr->rank, (int)getpid());
			if (!(tr->data_trace = fopen(path, "a"))) {
				rc = loom_seterr(LOOM_ESYS, "rank %d: LOOM_DATA_TRACE: cannot create %s", tr->rank, path);
				goto fail;
			}
			setvbuf(tr->data_trace, NULL, _IOLBF, 0);
		}
	}
	if (cfg->val_data && *cfg->val_data) {
		lo.shuffle = 0, lo.rank = 0, lo.world = 1;
		if ((rc = loom_loader_create(&tr->val, cfg->val_data, &lo)) != LOOM_OK)
			goto fail;
		if ((rc = check_vocab(tr, tr->val, "validation")) != LOOM_OK)
			goto fail;
		if (loom_loader_token_bytes(tr->val) != loom_loader_token_bytes(tr->train)) { /* one tokenizer, one width */
			rc = loom_seterr(LOOM_EINVAL, "trainer: the training data '%s' holds uint%d tokens but the validation "
			                 "data '%s' uint%d (one tokenizer writes one width: the data of two tokenizers?)", cfg->train_data,
			                 8 * loom_loader_token_bytes(tr->train), cfg->val_data, 8 * loom_loader_token_bytes(tr->val));
			goto fail;
		}
	}
	if (tr->val && !(tr->val_losses = loom__calloc((size_t)LOOM_MIN((uint64_t)cfg->eval_batches,
	                                                          loom_loader_windows_per_epoch(tr->val)), sizeof(double)))) {
		rc = loom_seterr(LOOM_ENOMEM, "trainer: out of memory");
		goto fail;
	}
	tr->flops_per_token = loom_model_flops_per_token(&tr->mcfg, cfg->T);
	tr->flops_nominal = loom_model_flops_per_token_nominal(&tr->mcfg, cfg->T);
	if (cfg->profile)
		loom_model_profile(model, 1);
	*out = tr;
	return LOOM_OK;
fail:
	loom_trainer_destroy(tr);
	return rc;
}

void loom_trainer_destroy(loom_trainer_t *tr)
{
	if (!tr)
		return;
	loom__strategy_destroy(tr->strategy); /* points the model's gradient view back at its own buffer */
	if (tr->exec && tr->cp_size > 1)
		loom_model_on_cp_reduce(tr->exec->ops->model(tr->exec), NULL, NULL);
	if (tr->exec)
		tr->exec->ops->destroy(tr->exec);
	if (tr->trace) /* not closed by a finished run: this rank's events (merged only in a 1-rank job) */
		loom__trace_close(tr->trace, NULL, tr->rank, tr->world);
	loom__trace_free(tr->trace);
	if (tr->data_trace)
		fclose(tr->data_trace);
	free(tr->val_losses);
	free(tr->samples), free(tr->plan_json);
	loom_train_log_close(tr);
	loom_loader_destroy(tr->train);
	loom_loader_destroy(tr->val);
	free(tr->inputs), free(tr->targets), free(tr->cp_inputs), free(tr->cp_targets);
	free(tr->train_data), free(tr->val_data), free(tr->save_dir), free(tr->log_path);
	free(tr->tokenizer), free(tr->strategy_name), free(tr->pp_schedule), free(tr->trace_dir);
	free(tr);
}

/* Rank 0's parameters to every rank, verified there by checksum: before the first step, and again
 * after a resume. */
int loom_trainer_sync_params(loom_trainer_t *tr, uint64_t *checksum)
{
	int rc;
	if ((rc = tr->strategy->ops->sync_params(tr->strategy)) != LOOM_OK)
		return loom_seterr(rc, "rank %d of %d: starting from rank 0's parameters: %s", tr->rank, tr->world,
		                   loom_errmsg());
	tr->synced = 1;
	if (checksum) { /* the caller's parameters, or a pipeline stage's where it has none (0: neither) */
		loom_model_t *m = loom_model_params(tr->model) ? tr->model : tr->exec->ops->model(tr->exec);
		*checksum = loom_model_params(m) ? loom_checksum_f32(loom_model_params(m), loom_model_param_count(m)) : 0;
	}
	return LOOM_OK;
}

int loom_trainer_step(loom_trainer_t *tr, loom_step_metrics_t *m)
{
	const loom_train_config_t *c = &tr->cfg;
	loom_strategy_t *s = tr->strategy;
	double t0, loss_sum = 0.0, comm_ms = 0.0, exposed_ms = 0.0;
	int rc;
	memset(m, 0, sizeof *m);
	if (!tr->synced && (rc = loom_trainer_sync_params(tr, NULL)) != LOOM_OK)
		return rc;
	t0 = loom_now();
	loom_exec_stats_t es = {0};
	if ((rc = tr->exec->ops->step(tr->exec, s, next_batch, tr, &loss_sum, &es)) != LOOM_OK)
		return loom_seterr(rc, "rank %d: step %lld (data window %llu of '%s'): %s", tr->rank, tr->step + 1,
		                   tr->window, c->train_data, loom_errmsg());
	comm_ms += es.comm_ms, exposed_ms += es.exposed_comm_ms;
	if (tr->cp_size > 1) { /* the attention's gathers: blocking, on the training thread */
		double ms = loom__tp_group_take_ms(&tr->cpg);
		comm_ms += ms, exposed_ms += ms;
	}
	m->bubble = es.bubble, m->bubble_expected = es.bubble_expected, m->max_inflight = es.max_inflight;
	m->p2p_bytes = es.p2p_bytes;
	m->bubble_theory = tr->pp ? loom_pp_bubble_ideal(c->pp_schedule, tr->pp_size, c->pp_virtual_stages, c->accum)
	                          : 0.0;
	/* the loss of all data-parallel ranks (dp x cp: a context-parallel rank's is the mean over its share of
	 * the positions, all shares equal): a blocking all-reduce of one double */
	if (tr->grad) {
		double ta = loom_now();
		if ((rc = loom_allreduce(tr->grad, &loss_sum, &loss_sum, 1, LOOM_FLOAT64, LOOM_AVG)) != LOOM_OK)
			return loom_seterr(rc, "rank %d: step %lld: averaging the loss across ranks: %s", tr->rank, tr->step + 1,
			                   loom_comm_errmsg(tr->grad));
		ta = 1e3 * (loom_now() - ta);
		comm_ms += ta, exposed_ms += ta;
	}
	double t1 = loom_now();
	if ((rc = tr->exec->ops->grad_norm(tr->exec, s, &m->grad_norm)) != LOOM_OK)
		return loom_seterr(rc, "rank %d: step %lld: gradient norm: %s", tr->rank, tr->step + 1, loom_errmsg());
	m->lr = loom_schedule_lr(&c->lr, tr->step + 1);
	if ((rc = s->ops->optim_step(s, m->lr, loom_clip_scale(m->grad_norm, c->grad_clip))) != LOOM_OK)
		return rc;
	tr->step++;
	double t2 = loom_now(), dt = t2 - t0;
	if (tr->trace) {
		loom__trace_event(tr->trace, LOOM_EV_OPTIM, -1, -2, t1, t2);
		loom__trace_step(tr->trace, tr->step, t0, t2);
	}
	m->optim_ms = (t2 - t1) * 1e3;
	m->step = tr->step;
	m->total = c->lr.total_steps;
	m->loss = (float)(loss_sum / c->accum);
	tr->loss_ema = 0.9 * tr->loss_ema + 0.1 * (double)m->loss;
	m->loss_ema = tr->loss_ema / (1.0 - pow(0.9, (double)tr->step));
	m->dt_ms = dt * 1e3;
	m->tokens_per_s = (double)loom_trainer_tokens_per_step(tr) / dt;
	m->mfu = c->peak_flops > 0 ? m->tokens_per_s * tr->flops_per_token / (c->peak_flops * tr->world) : 0.0;
	m->mfu_nominal = c->peak_flops > 0 ? m->tokens_per_s * tr->flops_nominal / (c->peak_flops * tr->world) : 0.0;
	/* Exposed communication is at most the communication itself: the rest of the training thread's
	 * wait is for a slower rank (or for the progress thread to be scheduled), reported apart. */
	m->wait_ms = exposed_ms > comm_ms ? exposed_ms - comm_ms : 0.0;
	m->comm_ms = comm_ms, m->exposed_comm_ms = exposed_ms - m->wait_ms;
	/* ETA from a moving average of the step time; the first step of a process (page faults, BLAS
	 * warm-up) is left out, so its ETA is unknown (-1). */
	if (tr->seen_first) {
		tr->time_sum += dt, tr->timed++;
		tr->step_ema = tr->timed == 1 ? dt : 0.9 * tr->step_ema + 0.1 * dt;
	}
	tr->seen_first = 1;
	m->eta_s = tr->timed > 0 ? tr->step_ema * (double)LOOM_MAX(m->total - m->step, 0) : -1.0;
	return LOOM_OK;
}

/* Window j of this data-parallel rank's share of an evaluation: k = dp_rank + j dp (window 0 again
 * for the padding a communicating forward needs). */
typedef struct {
	loom_trainer_t *tr;
	uint64_t n;
} eval_ctx_t;

static int eval_window(void *ctx, int j, int *inputs, int *targets)
{
	eval_ctx_t *ec = ctx;
	loom_trainer_t *tr = ec->tr;
	uint64_t k = (uint64_t)tr->dp_rank + (uint64_t)j * (uint64_t)tr->dp_size;
	int rc;
	if (tr->cp_size == 1)
		return loom_loader_window(tr->val, k < ec->n ? k : 0, inputs, targets);
	if ((rc = loom_loader_window(tr->val, k < ec->n ? k : 0, tr->inputs, tr->targets)) == LOOM_OK)
		take_rows(tr, inputs, targets);
	return rc;
}

int loom_trainer_eval(loom_trainer_t *tr, float *val_loss)
{
	const loom_train_config_t *c = &tr->cfg;
	double sum = 0.0;
	float *losses;
	int rc, count;
	uint64_t n;
	if (!tr->val)
		return loom_seterr(LOOM_ESTATE, "trainer: no validation data (--val-data)");
	/* Rank r evaluates windows r, r + dp, ... (every stage of a pipeline the same ones, through the
	 * stages); the per-window losses are then summed across ranks (each slot has one non-zero term, so
	 * exactly) and added up in window order by every rank. */
	n = LOOM_MIN((uint64_t)c->eval_batches, loom_loader_windows_per_epoch(tr->val));
	memset(tr->val_losses, 0, (size_t)n * sizeof(double));
	/* A strategy whose forwards communicate (ZeRO-3) needs as many on every rank: the ranks with a
	 * window fewer run a discarded forward of window 0. */
	uint64_t end = tr->strategy->collective_forward ? (n + tr->dp_size - 1) / tr->dp_size * tr->dp_size : n;
	count = (uint64_t)tr->dp_rank < end ? (int)((end - (uint64_t)tr->dp_rank + (uint64_t)tr->dp_size - 1) /
	                                            (uint64_t)tr->dp_size) : 0;
	if (!(losses = loom__calloc((size_t)LOOM_MAX(count, 1), sizeof *losses)))
		return loom_seterr(LOOM_ENOMEM, "rank %d: evaluation after step %lld: out of memory", tr->rank, tr->step);
	if (c->profile) /* the profile is of training steps */
		loom_model_profile(tr->model, 0);
	rc = tr->exec->ops->eval(tr->exec, tr->strategy, eval_window, &(eval_ctx_t){tr, n}, count, losses);
	if (c->profile)
		loom_model_profile(tr->model, 1);
	/* context parallel: a window's loss is the mean of its ranks' (each over T/cp of its positions) */
	if (rc == LOOM_OK && tr->cp && count > 0 &&
	    (rc = loom_allreduce(tr->cp, losses, losses, (size_t)count, LOOM_FLOAT32, LOOM_AVG)) != LOOM_OK)
		rc = loom_seterr(rc, "rank %d: evaluation after step %lld: averaging over the context-parallel group: %s",
		                 tr->rank, tr->step, loom_comm_errmsg(tr->cp));
	for (int j = 0; rc == LOOM_OK && j < count; j++) {
		uint64_t k = (uint64_t)tr->dp_rank + (uint64_t)j * (uint64_t)tr->dp_size;
		if (k < n)
			tr->val_losses[k] = losses[j];
	}
	free(losses);
	if (rc != LOOM_OK)
		return rc;
	if (tr->dp && (rc = loom_allreduce(tr->dp, tr->val_losses, tr->val_losses, (size_t)n, LOOM_FLOAT64,
	                                   LOOM_SUM)) != LOOM_OK)
		return loom_seterr(rc, "rank %d: evaluation after step %lld: %s", tr->rank, tr->step,
		                   loom_comm_errmsg(tr->dp));
	for (uint64_t k = 0; k < n; k++)
		sum += tr->val_losses[k];
	*val_loss = (float)(sum / (double)n);
	return LOOM_OK;
}

int loom_trainer_check_replicas(loom_trainer_t *tr)
{
	int rc;
	if ((rc = tr->strategy->ops->check_replicas(tr->strategy)) != LOOM_OK)
		return loom_seterr(rc, "after step %lld: %s", tr->step, loom_errmsg());
	return LOOM_OK;
}

int loom_trainer_run(loom_trainer_t *tr, loom_train_step_fn fn, void *ctx)
{
	const loom_train_config_t *c = &tr->cfg;
	loom_step_metrics_t m;
	int rc;
	/* Past the resume decision: finish what a kill interrupted in the checkpoint directory and move an
	 * abandoned branch aside (rank 0 writes it; nothing else writes there before the first save),
	 * unless the program did it already, then open the log. */
	if (!tr->save_dir_ready && (rc = loom_trainer_prepare_save_dir(tr, NULL)) != LOOM_OK)
		return rc;
	if (c->log_path && tr->rank == 0 && (rc = loom_train_log_open(tr)) != LOOM_OK)
		return rc;
	if (tr->log && c->log_event && (fprintf(tr->log, "%s\n", c->log_event) < 0 || fflush(tr->log) != 0))
		return loom_seterr(LOOM_EIO, "log %s: cannot write the event row", c->log_path);
	while (tr->step < c->lr.total_steps) {
		if ((rc = loom_trainer_step(tr, &m)) != LOOM_OK)
			return rc;
		if (!isfinite(m.loss) || !isfinite(m.grad_norm)) { /* stop before a checkpoint saves it */
			if (tr->log)
				loom_train_log_write(tr, &m);
			return loom_seterr(LOOM_ESTATE, "step %lld: loss %g, gradient norm %g: training diverged (lower --lr, "
			                   "raise --warmup or clip harder)", m.step, m.loss, m.grad_norm);
		}
		int last = m.step == c->lr.total_steps;
		if (c->check_replicas > 0 && m.step % c->check_replicas == 0 &&
		    (rc = loom_trainer_check_replicas(tr)) != LOOM_OK)
			return rc;
		if (tr->val && ((c->eval_every > 0 && m.step % c->eval_every == 0) || last)) {
			if ((rc = loom_trainer_eval(tr, &m.val_loss)) != LOOM_OK)
				return rc;
			m.has_val = 1;
		}
		/* The step's log line is on disk (fsync'ed) before its checkpoint is committed: a kill at any
		 * point never leaves a checkpoint whose steps the log lacks (a resume drops lines past it). */
		m.saved = c->save_dir && ((c->save_every > 0 && m.step % c->save_every == 0) || last);
		loom__train_summary_add(tr, &m);
		if (tr->log && (rc = loom_train_log_write(tr, &m)) != LOOM_OK)
			return rc;
		if (m.saved) {
			if (tr->log && (rc = loom__train_log_sync(tr)) != LOOM_OK)
				return rc;
			if ((rc = loom_trainer_save(tr)) != LOOM_OK)
				return rc;
		}
		if (fn && fn(ctx, tr, &m) != 0)
			return loom_seterr(LOOM_ESTATE, "training stopped at step %lld", m.step);
	}
	if (tr->trace) { /* every rank's file, then rank 0 merges them (collective over the job) */
		loom_comm_t *world = c->mesh ? loom_mesh_world(c->mesh) : c->comm;
		if ((rc = loom__trace_close(tr->trace, world, tr->rank, tr->world)) != LOOM_OK)
			return rc;
	}
	return loom__train_log_summary(tr);
}

void loom_trainer_set_peak_flops(loom_trainer_t *tr, double flops)
{
	tr->cfg.peak_flops = flops > 0 ? flops : 0.0;
}

void loom_trainer_set_peak(loom_trainer_t *tr, double flops, const char *source, double gemm_flops)
{
	loom_trainer_set_peak_flops(tr, flops);
	tr->cfg.peak_source = source;
	tr->cfg.gemm_flops = gemm_flops > 0 ? gemm_flops : 0.0;
}

void loom_trainer_set_prediction(loom_trainer_t *tr, double step_s, double memory_bytes)
{
	tr->cfg.predicted_step_s = step_s > 0 ? step_s : 0.0;
	tr->cfg.predicted_memory_bytes = memory_bytes > 0 ? memory_bytes : 0.0;
}

int loom_trainer_set_plan_json(loom_trainer_t *tr, const char *json)
{
	char *copy = NULL;
	if (json && !(copy = strdup(json)))
		return loom_seterr(LOOM_ENOMEM, "trainer: out of memory for the plan");
	free(tr->plan_json);
	tr->plan_json = copy;
	return LOOM_OK;
}

void loom_trainer_set_log_event(loom_trainer_t *tr, const char *json)
{
	tr->cfg.log_event = json;
}

long long loom_trainer_steps_done(const loom_trainer_t *tr)
{
	return tr->step;
}

int loom_trainer_rank(const loom_trainer_t *tr)
{
	return tr->rank;
}

int loom_trainer_world(const loom_trainer_t *tr)
{
	return tr->world;
}

loom_model_t *loom_trainer_model(loom_trainer_t *tr)
{
	return tr->model;
}

const loom_adamw_t *loom_trainer_optimizer(const loom_trainer_t *tr)
{
	return &tr->strategy->opt;
}

long long loom_trainer_tokens_per_step(const loom_trainer_t *tr)
{
	return (long long)tr->cfg.B * tr->cfg.T * tr->cfg.accum * tr->dp_size;
}

void loom_train_model_opts(const loom_train_config_t *cfg, int dp, int tp, loom_model_opts_t *mo)
{
	loom__strategy_model_opts(cfg->strategy, cfg->zero, dp, tp, &mo->no_own_grads, &mo->no_own_params);
	/* with a pipeline the steps run on stage models holding their own tensors, evaluation and
	 * checkpoints too (pp.c): the whole model is never run and only hands them its initial
	 * parameters, from a buffer the caller frees once the ranks have started from them
	 * (loom_trainer_sync_params); its one activation arena holds tp positions (the fewest sequence
	 * parallelism allows), not a micro-batch */
	if (cfg->mesh && loom_mesh_size(cfg->mesh, LOOM_MESH_PP) > 1) {
		mo->no_own_grads = mo->no_own_params = 1;
		mo->B = 1, mo->T = LOOM_MAX(tp, 1) * (mo->cp_size > 1 ? 2 : 1), mo->arenas = 1; /* cp: two chunks */
	}
}
