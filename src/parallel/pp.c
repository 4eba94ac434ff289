/* pp.c: the pipeline-parallel step executor (src/parallel/pp.h): this rank is stage s of P on the
 * pipeline axis and runs blocks [lo, hi) of the model (the embedding too on the first stage; ln_f,
 * the tied lm head and the loss on the last), the step's M micro-batches in the order of a schedule
 * from schedule.c (GPipe or 1F1B).
 *
 * The stage model is created here with the layer range and one activation arena per micro-batch in
 * flight; its parameter views point into the caller's model's buffer (so parameters keep the whole
 * model's layout and checkpoints are written as they always were), its gradients are its own
 * (whole-model sized; the strategy points them at its storage). Only the stage's tensors are used
 * and reported; the strategy's buckets cover only those (strategy.h's tensor_used), the optimizer
 * covers the whole buffer (the others have zero gradients and are never read on this rank; gather
 * makes them current before a checkpoint or a whole-model evaluation).
 *
 * Per micro-batch, activations (B x T x C floats, block_input(hi)) go to the next stage with loom_isend
 * straight from the arena (waited for only before that arena is reused), and the gradient of the
 * stage's input goes back from a copy of stream_grad (two send buffers in turn); receives are posted
 * one micro-batch ahead into their own buffers, so transfers overlap the compute around them. The
 * stream gradient is shared by the arenas: the schedules never run two backwards at once. On the
 * last stage the head's forward and backward run fused, at the micro-batch's backward.
 *
 * A head-alone last stage (a head heavier than the blocks, e.g. `small`'s) shares the head's
 * positions with stage P-2, which holds the head's input: stage P-2 runs the head of positions
 * [0, hrows) of each micro-batch (loom_pp_stages: as the FLOPs balance the two stages, or the
 * trainer's pp_head_split) at the start of that micro-batch's backward, from its own last block's
 * output, and sends only positions [hrows, B T) forward and receives only their gradient back. Stage
 * P-2 then uses wte and ln_f too: their gradients are summed over the stages that hold them (first,
 * P-2, last), and the norm counts wte on the first stage and ln_f on the last only.
 *
 * With tensor parallelism (a mesh with tp > 1 and pp > 1) the caller's model is this rank's tp shard
 * and so is the stage model (the same tp_size/tp_rank, its layers only): the tensor table, the
 * stages' counts and the buffer are the shard's. The pipeline communicator joins the ranks with this
 * rank's tp (and dp) coordinate, so activations go between the same tp rank of neighbouring stages
 * (the residual stream is replicated in a tp group: each tp rank sends its own copy), the tied wte's
 * gradient is summed per tp rank (each holds the same vocabulary rows on the first and last stage),
 * the last stage runs the vocabulary-parallel head, and the gradient norm removes the last stage's
 * wte share summed over its tp group. The caller's model, used whole by evaluation after gather, gets
 * a reduction over the tp axis from here (the strategy gives one to the stage model).
 *
 * Invariants: after step, every rank of the pipeline holds the step's summed loss (the head stages',
 * sent to all: the other ranks add zeros), the wte gradient is the sum of the first stage's
 * (embedding) and the head stages' (lm head) shares on all of them (one all-reduce, which gives them
 * the same bits; so is ln_f's when the head is split), and each stage's other gradients are the
 * single-process ones up to float rounding, so the losses and parameters match one process with
 * accumulation M (tests/test_pp.c checks 1e-5). At most `arenas` micro-batches are in flight at once
 * (counted: max_inflight). A dead neighbour is reported by the transfer waiting on it (LOOM_EPEERLOST),
 * never a hang. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "loom/train.h"
#include "parallel/pp.h"

enum { TAG_ACT = 91, TAG_GRAD = 92 };

typedef struct {
	loom_exec_t base;
	loom_exec_config_t cfg;
	loom_model_config_t mc;
	loom_model_t *stage;
	loom_comm_t *ends;            /* the stages holding wte: first, last, and P-2 when it runs head rows
	                                 (the pp comm itself when that is every stage; owned otherwise) */
	int own_ends;
	int P, s, lo, hi, M, arenas, nplan, ntensors;
	int width;                    /* floats per position of the residual stream (loom_model_stream_width) */
	int shared_blocks;            /* some tensor is read by every block (all_blocks): summed over all stages */
	int hrows;                    /* the head is shared: positions [0, rows[mb]) of micro-batch mb run
	                                 their head on stage P-2, [rows[mb], B T) on the last; hrows is
	                                 the usual rows[mb] (0: no split, the last runs them all) */
	int *rows;                    /* M (loom__pp_head_rows: the first and last may differ) */
	int head;                     /* this stage computes head positions: the last, and P-2 when shared */
	int tp_size, tp_rank;         /* the model's tensor-parallel shard (1, 0: whole) */
	int whole_reduce_set;         /* the caller's model has whole_reduce as its tp reduction */
	size_t nparams, act;          /* act: floats of one activation (B x T x C); nparams: of the (shard) buffer */
	const loom_tensor_info_t *tensors; /* the (shard) tensor table of the caller's model */
	size_t *counts;               /* floats each stage owns, in stage order (they tile the buffer) */
	unsigned char *used;          /* per tensor: this stage reports its gradient */
	loom__pp_action_t *plan;
	int *inputs, *targets;        /* M x B x T each */
	float *losses;                /* M */
	float *act_rbuf, *grad_rbuf, *grad_sbuf[2];
	loom_request_t **act_sends;   /* of arena k's output, to the next stage */
	loom_request_t *grad_sends[2], *act_recv, *grad_recv;
	int inflight;
	double wait_ms, busy_s[3], first_t, last_t; /* compute time of this step (forwards, the head rows
	                                              of stage P-2, the rest of the backwards); its first
	                                              start, last end */
	double *times;                /* 5 x P: every stage's (first_t, last_t, busy_s[0..2]); then 3 x P x M:
	                                 their forward, head rows and backward times per micro-batch */
} pp_exec_t;

static void pp_destroy(loom_exec_t *ex);

/* Floats of micro-batch mb's activation (and of its gradient) that stay on this stage instead of
 * passing to the next one (out) or coming from the previous one (in): the rows whose head stage P-2
 * computes. */
static size_t out_off(const pp_exec_t *e, int mb)
{
	return e->hrows && e->s == e->P - 2 ? (size_t)e->rows[mb] * e->width : 0;
}

static size_t in_off(const pp_exec_t *e, int mb)
{
	return e->hrows && e->s == e->P - 1 ? (size_t)e->rows[mb] * e->width : 0;
}

/* The caller's (whole-layer) model's tensor-parallel reduction, for evaluation after gather: a
 * blocking all-reduce over the tp axis, as the tp strategy gives the stage model. */
static int whole_reduce(void *ctx, float *buf, size_t n, loom_tp_op_t op)
{
	pp_exec_t *e = ctx;
	int rc = loom_allreduce(e->cfg.tp, buf, buf, n, LOOM_FLOAT32, op == LOOM_TP_MAX ? LOOM_MAX : LOOM_SUM);
	if (rc != LOOM_OK)
		return loom_seterr(rc, "pipeline stage %d, tensor-parallel rank %d of %d: all-reduce of %zu floats for the "
		                   "whole model: %s", e->s, e->tp_rank, e->tp_size, n, loom_comm_errmsg(e->cfg.tp));
	return LOOM_OK;
}

/* Complete a request (NULL: nothing) of a transfer with stage `peer`, adding the time waited; keeps
 * the first error. */
static int finish(pp_exec_t *e, loom_request_t **req, int rc, loom__event_kind_t kind, int mb, int peer)
{
	if (!*req)
		return rc;
	double t0 = loom_now();
	int r = loom_wait(*req);
	double t1 = loom_now();
	*req = NULL;
	e->wait_ms += 1e3 * (t1 - t0);
	if (e->cfg.on_event)
		e->cfg.on_event(e->cfg.event_ctx, kind, mb, -2, t0, t1);
	if (r != LOOM_OK && rc == LOOM_OK)
		rc = loom_seterr(r, "pipeline stage %d of %d: %s of micro-batch %d %s stage %d: %s", e->s, e->P,
		                 kind == LOOM_EV_SEND ? "sending" : "receiving", mb, kind == LOOM_EV_SEND ? "to" : "from",
		                 peer, loom_comm_errmsg(e->cfg.pp));
	return rc;
}

/* Wait for everything still in flight (after an error too: every request must be completed). */
static int drain(pp_exec_t *e, int rc)
{
	for (int k = 0; k < e->arenas; k++)
		rc = finish(e, &e->act_sends[k], rc, LOOM_EV_SEND, -1, e->s + 1);
	for (int k = 0; k < 2; k++)
		rc = finish(e, &e->grad_sends[k], rc, LOOM_EV_SEND, -1, e->s - 1);
	rc = finish(e, &e->act_recv, rc, LOOM_EV_RECV, -1, e->s - 1);
	rc = finish(e, &e->grad_recv, rc, LOOM_EV_RECV, -1, e->s + 1);
	return rc;
}

static int pp_create(loom_exec_t **out, const loom_exec_config_t *cfg)
{
	pp_exec_t *e = loom__calloc(1, sizeof *e);
	loom_model_opts_t o;
	int rc, *lo = NULL;
	*out = NULL;
	if (!e)
		return loom_seterr(LOOM_ENOMEM, "pipeline: out of memory");
	e->base.ops = loom__exec_pipeline();
	e->cfg = *cfg;
	e->mc = *loom_model_get_config(cfg->model);
	e->P = loom_comm_size(cfg->pp), e->s = loom_comm_rank(cfg->pp), e->M = cfg->M;
	e->tp_size = loom_model_tp_size(cfg->model), e->tp_rank = loom_model_tp_rank(cfg->model);
	if (e->tp_size != (cfg->tp ? loom_comm_size(cfg->tp) : 1)) {
		rc = loom_seterr(LOOM_EINVAL, "pipeline stage %d: the model is tensor-parallel shard %d of %d, but the "
		                 "tensor-parallel axis has %d rank(s)", e->s, e->tp_rank, e->tp_size,
		                 cfg->tp ? loom_comm_size(cfg->tp) : 1);
		goto fail;
	}
	e->nparams = loom_model_param_count(cfg->model);
	e->tensors = loom_model_tensors(cfg->model, &e->ntensors);
	e->width = loom_model_stream_width(&e->mc);
	e->act = (size_t)cfg->B * cfg->T * e->width;
	if (!(lo = loom__malloc(sizeof(int) * (size_t)(e->P + 1)))) {
		rc = loom_seterr(LOOM_ENOMEM, "pipeline: out of memory");
		goto fail;
	}
	if ((rc = loom_pp_stages(&e->mc, cfg->B, cfg->T, e->P, cfg->head_split, lo, &e->hrows)) != LOOM_OK)
		goto fail;
	e->lo = lo[e->s], e->hi = lo[e->s + 1];
	e->head = e->s == e->P - 1 || (e->hrows && e->s == e->P - 2);
	if (!(e->rows = loom__calloc((size_t)e->M, sizeof *e->rows))) {
		rc = loom_seterr(LOOM_ENOMEM, "pipeline: out of memory");
		goto fail;
	}
	if ((rc = loom__pp_head_rows(&e->mc, cfg->schedule, cfg->T, cfg->B * cfg->T, e->P, e->M, lo, e->hrows,
	                             cfg->head_split == 0.0, e->rows)) != LOOM_OK)
		goto fail;
	e->plan = loom__calloc(2 * (size_t)e->M, sizeof *e->plan);
	e->counts = loom__calloc((size_t)e->P, sizeof *e->counts);
	e->used = loom__calloc((size_t)e->ntensors, 1);
	e->inputs = loom__malloc(sizeof(int) * (size_t)e->M * cfg->B * cfg->T);
	e->targets = loom__malloc(sizeof(int) * (size_t)e->M * cfg->B * cfg->T);
	e->losses = loom__calloc((size_t)e->M, sizeof *e->losses);
	e->times = loom__calloc((5 + 3 * (size_t)e->M) * (size_t)e->P, sizeof *e->times);
	e->act_rbuf = loom__malloc(sizeof(float) * e->act);
	e->grad_rbuf = loom__malloc(sizeof(float) * e->act);
	e->grad_sbuf[0] = loom__malloc(sizeof(float) * e->act);
	e->grad_sbuf[1] = loom__malloc(sizeof(float) * e->act);
	if (!e->plan || !e->counts || !e->used || !e->inputs || !e->targets || !e->losses || !e->times || !e->act_rbuf ||
	    !e->grad_rbuf || !e->grad_sbuf[0] || !e->grad_sbuf[1]) {
		rc = loom_seterr(LOOM_ENOMEM, "pipeline: out of memory");
		goto fail;
	}
	e->arenas = loom__pp_plan(cfg->schedule, e->P, e->s, e->M, e->plan);
	e->nplan = 2 * e->M;
	if (!(e->act_sends = loom__calloc((size_t)e->arenas, sizeof *e->act_sends))) {
		rc = loom_seterr(LOOM_ENOMEM, "pipeline: out of memory");
		goto fail;
	}
	/* Which tensors each stage owns: its blocks' (tensor table `layer`), the embedding unit's on the
	 * first, the head's on the last; they are contiguous and tile the buffer in stage order. A tensor
	 * the head also reads (head_reads: GPT-2's tied wte) is used by the head stages too but owned by
	 * the first; one every block reads (all_blocks: nanochat's per-layer scalars) by every stage that
	 * holds a block; with the head's positions split, stage P-2 uses the head's tensors too. */
	for (int t = 0; t < e->ntensors; t++) {
		const loom_tensor_info_t ti = e->tensors[t];
		int u = ti.layer, owner = u < 0 ? 0 : u >= e->mc.n_layer ? e->P - 1 : 0;
		for (int q = 0; q < e->P && u >= 0 && u < e->mc.n_layer; q++)
			if (u >= lo[q] && u < lo[q + 1])
				owner = q;
		e->counts[owner] += ti.numel;
		e->used[t] = owner == e->s || (ti.head_reads && e->head) || (e->head && u >= e->mc.n_layer) ||
		             (ti.all_blocks && e->lo < e->hi);
		e->shared_blocks |= ti.all_blocks;
	}
	/* The stage model: its layers, `arenas` arenas, parameters viewing the caller's buffer. */
	memset(&o, 0, sizeof o);
	o.B = cfg->B, o.T = cfg->T, o.arenas = e->arenas, o.layer_lo = e->lo, o.layer_hi = e->hi, o.no_own_params = 1;
	o.act_ckpt = loom_model_act_ckpt(cfg->model); /* the caller's checkpointing, per arena of the stage */
	o.dtype = loom_model_dtype(cfg->model); /* the stage computes in the whole model's precision */
	o.tp_size = e->tp_size, o.tp_rank = e->tp_rank;
	if ((rc = loom_model_create(&e->stage, &e->mc, &o)) != LOOM_OK ||
	    (rc = loom_model_set_param_buffer(e->stage, loom_model_params(cfg->model))) != LOOM_OK)
		goto fail;
	/* The stages holding wte (first, last, and P-2 when it runs head rows) sum its gradient (and ln_f's,
	 * when split): over the pipeline comm itself when they are all of it, else over a communicator of
	 * them (collective over the pipeline axis). */
	int nends = e->hrows && e->P >= 3 ? 3 : 2; /* with P = 2, stage P-2 is the first */
	if (e->P == nends) {
		e->ends = cfg->pp;
	} else if (e->P > 2) {
		int end = e->s == 0 || e->head;
		if ((rc = loom_comm_split(cfg->pp, end ? 0 : LOOM_UNDEFINED, e->s, &e->ends)) != LOOM_OK) {
			rc = loom_seterr(rc, "pipeline stage %d: the communicator of the stages holding wte: %s", e->s,
			                 loom_errmsg());
			goto fail;
		}
		e->own_ends = 1;
	}
	if (e->tp_size > 1) {
		loom_model_on_tp_reduce(cfg->model, whole_reduce, e);
		e->whole_reduce_set = 1;
	}
	free(lo);
	*out = &e->base;
	return LOOM_OK;
fail:
	free(lo);
	pp_destroy(&e->base);
	return rc;
}

static void pp_destroy(loom_exec_t *ex)
{
	pp_exec_t *e = (pp_exec_t *)ex;
	if (!e)
		return;
	if (e->act_sends)
		drain(e, LOOM_OK);
	if (e->whole_reduce_set)
		loom_model_on_tp_reduce(e->cfg.model, NULL, NULL);
	if (e->own_ends)
		loom_comm_destroy(e->ends);
	loom_model_destroy(e->stage);
	free(e->plan), free(e->counts), free(e->used), free(e->inputs), free(e->targets), free(e->losses), free(e->rows);
	free(e->times);
	free(e->act_rbuf), free(e->grad_rbuf), free(e->grad_sbuf[0]), free(e->grad_sbuf[1]), free(e->act_sends);
	free(e);
}

static loom_model_t *pp_model(loom_exec_t *e)
{
	return ((pp_exec_t *)e)->stage;
}

static const unsigned char *pp_used(loom_exec_t *e)
{
	return ((pp_exec_t *)e)->used;
}

/* A unit's forward or backward ran from t0 to now. */
static void event(pp_exec_t *e, loom__event_kind_t kind, int mb, int unit, double t0)
{
	double t1 = loom_now();
	if (kind == LOOM_EV_FORWARD || kind == LOOM_EV_BACKWARD) {
		e->busy_s[kind == LOOM_EV_FORWARD ? 0 : unit == -3 && e->s < e->P - 1 ? 1 : 2] += t1 - t0;
		if (e->first_t == 0.0)
			e->first_t = t0;
		e->last_t = t1;
	}
	if (e->cfg.on_event)
		e->cfg.on_event(e->cfg.event_ctx, kind, mb, unit, t0, t1);
}

/* The measured bubble: each stage's idle share of the common span of the schedule (the ranks of a
 * job share one machine's monotonic clock, or clocks close enough for a fraction of a step), and the
 * bubble the schedule should have with these stages' measured forward and backward times. */
static int measure_bubble(pp_exec_t *e, double *bubble, double *expected)
{
	double mine[5] = {e->first_t, e->last_t, e->busy_s[0], e->busy_s[1], e->busy_s[2]};
	double lo = 1e300, hi = -1e300, idle = 0.0, *t = e->times;
	int rc = loom_allgather(e->cfg.pp, mine, t, 5, LOOM_FLOAT64), P = e->P;
	if (rc != LOOM_OK)
		return loom_seterr(rc, "pipeline stage %d of %d: gathering the stages' timings: %s", e->s, e->P,
		                   loom_comm_errmsg(e->cfg.pp));
	for (int q = 0; q < P; q++)
		lo = LOOM_MIN(lo, t[5 * q]), hi = LOOM_MAX(hi, t[5 * q + 1]);
	for (int q = 0; q < P && hi > lo; q++)
		idle += 1.0 - (t[5 * q + 2] + t[5 * q + 3] + t[5 * q + 4]) / (hi - lo);
	*bubble = idle / P;
	/* Per micro-batch: each stage's mean forward and backward; the head's share of stage P-2 and the
	 * last stage's backward (the head alone) per row, times each micro-batch's rows. */
	double *fhb = t + 5 * P, span, rows = 0.0;
	size_t PM = (size_t)P * e->M;
	for (int m = 0; m < e->M; m++)
		rows += e->hrows ? e->rows[m] : 0;
	for (int q = 0; q < P; q++)
		for (int m = 0; m < e->M; m++) {
			size_t k = (size_t)q * e->M + (size_t)m;
			fhb[k] = t[5 * q + 2] / e->M, fhb[PM + k] = t[5 * q + 3] / e->M, fhb[2 * PM + k] = t[5 * q + 4] / e->M;
			if (e->hrows && q == P - 2 && rows > 0)
				fhb[PM + k] = t[5 * q + 3] * e->rows[m] / rows;
			if (e->hrows && q == P - 1) /* the head alone */
				fhb[2 * PM + k] = t[5 * q + 4] * (e->cfg.B * e->cfg.T - e->rows[m]) /
				                  ((double)e->M * e->cfg.B * e->cfg.T - rows);
		}
	if (loom__pp_simulate(e->cfg.schedule, P, e->M, fhb, fhb + PM, fhb + 2 * PM, &span, expected) != LOOM_OK)
		*expected = -1.0;
	return LOOM_OK;
}

/* The forward of micro-batch mb on this stage, into arena a. */
static int forward(pp_exec_t *e, int mb)
{
	const loom_exec_config_t *c = &e->cfg;
	size_t bt = (size_t)c->B * c->T;
	int a = mb % e->arenas, rc = LOOM_OK;
	double t0;
	/* The arena's previous output may still be on its way to the next stage. */
	if ((rc = finish(e, &e->act_sends[a], rc, LOOM_EV_SEND, mb - e->arenas, e->s + 1)) != LOOM_OK)
		return rc;
	if (e->s == 0) {
		t0 = loom_now();
		if ((rc = loom_model_embed_forward(e->stage, a, e->inputs + mb * bt, c->B, c->T)) != LOOM_OK)
			return rc;
		event(e, LOOM_EV_FORWARD, mb, -1, t0);
	} else {
		/* blocks that read the tokens (nanochat's value embeddings) get them here */
		if ((rc = loom_model_set_inputs(e->stage, a, e->inputs + mb * bt, c->B, c->T)) != LOOM_OK)
			return rc;
		if ((rc = finish(e, &e->act_recv, rc, LOOM_EV_RECV, mb, e->s - 1)) != LOOM_OK)
			return rc;
		memcpy(loom_model_block_input(e->stage, a, e->lo) + in_off(e, mb), e->act_rbuf,
		       (e->act - in_off(e, mb)) * sizeof(float));
		if (mb + 1 < e->M && (rc = loom_irecv(c->pp, e->act_rbuf, e->act - in_off(e, mb + 1), LOOM_FLOAT32, e->s - 1, TAG_ACT,
		                                      &e->act_recv)) != LOOM_OK)
			return rc;
	}
	for (int l = e->lo; l < e->hi; l++) {
		t0 = loom_now();
		if ((rc = loom_model_block_forward(e->stage, a, l, c->B, c->T)) != LOOM_OK)
			return rc;
		event(e, LOOM_EV_FORWARD, mb, l, t0);
	}
	if (e->s < e->P - 1 && (rc = loom_isend(c->pp, loom_model_block_input(e->stage, a, e->hi) + out_off(e, mb),
	                                        e->act - out_off(e, mb), LOOM_FLOAT32, e->s + 1, TAG_ACT,
	                                        &e->act_sends[a])) != LOOM_OK)
		return rc;
	return LOOM_OK;
}

/* The backward of micro-batch mb (the head's forward and backward first on the last stage). */
static int backward(pp_exec_t *e, loom_strategy_t *st, int mb)
{
	const loom_exec_config_t *c = &e->cfg;
	size_t bt = (size_t)c->B * c->T;
	int a = mb % e->arenas, rc = LOOM_OK, k = mb % 2;
	float *dstream = loom_model_stream_grad(e->stage);
	double t0;
	/* Data-parallel gradient sync on the step's last backward only (as the local loop does). */
	st->ops->set_sync(st, mb == e->M - 1);
	/* The head's positions: all of them on the last stage, or [rows, B T) there and [0, rows) on stage
	 * P-2, which runs them first (from its own activations) and then takes the others' gradient. */
	if (e->head) {
		int r = e->rows[mb], r0 = e->s == e->P - 1 ? r : 0, n = e->s == e->P - 1 ? (int)bt - r : r;
		t0 = loom_now();
		if ((rc = loom_model_head_forward_backward_rows(e->stage, a, e->targets + mb * bt, c->B, c->T, r0, n,
		                                               1.0f / (float)e->M, &e->losses[mb])) != LOOM_OK)
			return rc;
		event(e, LOOM_EV_BACKWARD, mb, -3, t0); /* the head: its forward and backward */
	}
	if (e->s < e->P - 1) {
		if ((rc = finish(e, &e->grad_recv, rc, LOOM_EV_RECV, mb, e->s + 1)) != LOOM_OK)
			return rc;
		memcpy(dstream + out_off(e, mb), e->grad_rbuf, (e->act - out_off(e, mb)) * sizeof(float));
		if (mb + 1 < e->M && (rc = loom_irecv(c->pp, e->grad_rbuf, e->act - out_off(e, mb + 1), LOOM_FLOAT32, e->s + 1,
		                                      TAG_GRAD,
		                                      &e->grad_recv)) != LOOM_OK)
			return rc;
	}
	for (int l = e->hi - 1; l >= e->lo; l--) {
		t0 = loom_now();
		if ((rc = loom_model_block_backward(e->stage, a, l, c->B, c->T)) != LOOM_OK)
			return rc;
		event(e, LOOM_EV_BACKWARD, mb, l, t0);
	}
	if (e->s == 0) {
		t0 = loom_now();
		if ((rc = loom_model_embed_backward(e->stage, a, e->inputs + mb * bt, c->B, c->T)) != LOOM_OK)
			return rc;
		event(e, LOOM_EV_BACKWARD, mb, -1, t0);
	} else {
		if ((rc = finish(e, &e->grad_sends[k], rc, LOOM_EV_SEND, mb - 2, e->s - 1)) != LOOM_OK)
			return rc;
		memcpy(e->grad_sbuf[k], dstream + in_off(e, mb), (e->act - in_off(e, mb)) * sizeof(float));
		if ((rc = loom_isend(c->pp, e->grad_sbuf[k], e->act - in_off(e, mb), LOOM_FLOAT32, e->s - 1, TAG_GRAD,
		                     &e->grad_sends[k])) != LOOM_OK)
			return rc;
	}
	return LOOM_OK;
}

static int pp_step(loom_exec_t *ex, loom_strategy_t *s, loom__batch_fn get, void *ctx, double *loss_sum,
                   loom_exec_stats_t *st)
{
	pp_exec_t *e = (pp_exec_t *)ex;
	const loom_exec_config_t *c = &e->cfg;
	size_t bt = (size_t)c->B * c->T;
	int rc = LOOM_OK;
	double t0;
	*loss_sum = 0.0;
	memset(st, 0, sizeof *st);
	e->wait_ms = 0.0, e->inflight = 0, e->first_t = e->last_t = 0.0;
	e->busy_s[0] = e->busy_s[1] = e->busy_s[2] = 0.0;
	loom_model_zero_grad(e->stage);
	/* Every stage reads every micro-batch (the loaders stay in step); the first uses the inputs, the
	 * last the targets. */
	for (int j = 0; j < e->M; j++)
		if ((rc = get(ctx, j, e->inputs + j * bt, e->targets + j * bt)) != LOOM_OK)
			return rc;
	if (e->s > 0 &&
	    (rc = loom_irecv(c->pp, e->act_rbuf, e->act - in_off(e, 0), LOOM_FLOAT32, e->s - 1, TAG_ACT, &e->act_recv)))
		goto out;
	if (e->s < e->P - 1 &&
	    (rc = loom_irecv(c->pp, e->grad_rbuf, e->act - out_off(e, 0), LOOM_FLOAT32, e->s + 1, TAG_GRAD, &e->grad_recv)))
		goto out;
	for (int i = 0; i < e->nplan; i++) {
		const loom__pp_action_t *p = &e->plan[i];
		if (p->op == 'F') {
			if ((rc = forward(e, p->mb)) != LOOM_OK)
				goto out;
			e->inflight++;
			st->max_inflight = LOOM_MAX(st->max_inflight, e->inflight);
		} else {
			if ((rc = backward(e, s, p->mb)) != LOOM_OK)
				goto out;
			e->inflight--;
		}
	}
	if ((rc = drain(e, LOOM_OK)) != LOOM_OK || (rc = measure_bubble(e, &st->bubble, &st->bubble_expected)) != LOOM_OK)
		goto out;
	loom_strategy_stats_t ss;
	if ((rc = s->ops->finish_grads(s, &ss)) != LOOM_OK)
		goto out;
	st->comm_ms = ss.comm_ms, st->exposed_comm_ms = ss.exposed_comm_ms;
	/* The tied wte: the embedding's share (first stage) plus the lm head's (last, and P-2 when it runs
	 * head rows); with the head split, ln_f's two shares too (a member without ln_f adds zeros). */
	t0 = loom_now();
	for (int t = 0; e->ends && (e->s == 0 || e->head) && t < e->ntensors; t++) {
		if (!e->tensors[t].head_reads)
			continue;
		float *g = loom_model_tensor_grad(e->stage, t);
		if ((rc = loom_allreduce(e->ends, g, g, e->tensors[t].numel, LOOM_FLOAT32, LOOM_SUM)) != LOOM_OK) {
			rc = loom_seterr(rc, "pipeline stage %d of %d: summing %s's gradient between the stages that hold it: "
			                 "%s", e->s, e->P, e->tensors[t].name, loom_comm_errmsg(e->ends));
			goto out;
		}
	}
	/* Tensors every block reads (nanochat's per-layer scalars): the sum of every stage's share. */
	for (int t = 0; e->shared_blocks && t < e->ntensors; t++) {
		if (!e->tensors[t].all_blocks)
			continue;
		float *g = loom_model_tensor_grad(e->stage, t);
		if ((rc = loom_allreduce(c->pp, g, g, e->tensors[t].numel, LOOM_FLOAT32, LOOM_SUM)) != LOOM_OK) {
			rc = loom_seterr(rc, "pipeline stage %d of %d: summing %s's gradient over the stages: %s", e->s, e->P,
			                 e->tensors[t].name, loom_comm_errmsg(c->pp));
			goto out;
		}
	}
	if (e->ends && (e->s == 0 || e->head)) {
		for (int t = 0; e->hrows && t < e->ntensors; t++) {
			if (e->tensors[t].layer < e->mc.n_layer)
				continue;
			float *gl = loom_model_tensor_grad(e->stage, t); /* zero on the first stage (zero_grad) */
			if ((rc = loom_allreduce(e->ends, gl, gl, e->tensors[t].numel, LOOM_FLOAT32, LOOM_SUM)) != LOOM_OK) {
				rc = loom_seterr(rc, "pipeline stage %d of %d: summing %s's gradient between the stages that "
				                 "share the head: %s", e->s, e->P, e->tensors[t].name, loom_comm_errmsg(e->ends));
				goto out;
			}
			if (!e->head) /* the first stage keeps no share of the head's (nor counts it in the norm) */
				memset(gl, 0, e->tensors[t].numel * sizeof(float));
		}
	}
	if (e->head)
		for (int j = 0; j < e->M; j++)
			*loss_sum += e->losses[j];
	if ((rc = loom_allreduce(c->pp, loss_sum, loss_sum, 1, LOOM_FLOAT64, LOOM_SUM)) != LOOM_OK) {
		rc = loom_seterr(rc, "pipeline stage %d of %d: the loss from the last stage: %s", e->s, e->P,
		                 loom_comm_errmsg(c->pp));
		goto out;
	}
	event(e, LOOM_EV_ALLREDUCE, -1, -2, t0);
	double ta = 1e3 * (loom_now() - t0);
	st->comm_ms += ta, st->exposed_comm_ms += ta;
out:
	rc = drain(e, rc);
	st->p2p_wait_ms = e->wait_ms;
	return rc;
}

static int pp_grad_norm(loom_exec_t *ex, loom_strategy_t *s, double *norm)
{
	pp_exec_t *e = (pp_exec_t *)ex;
	double sq;
	int rc;
	if ((rc = s->ops->grad_norm(s, norm)) != LOOM_OK)
		return rc;
	sq = *norm * *norm;
	for (int t = 0; e->hrows && e->s == e->P - 2 && t < e->ntensors; t++) { /* the head's: once, on the last */
		if (e->tensors[t].layer < e->mc.n_layer)
			continue;
		double w = loom_grad_sumsq(loom_model_tensor_grad(e->stage, t), e->tensors[t].numel);
		/* a tp-split tensor (nanochat's lm head): the strategy's norm has the group's sum of its shards;
		 * a whole one (GPT-2's ln_f, replicated in the tp group) is counted by each rank as it is */
		if (e->tp_size > 1 && e->tensors[t].tp_kind != LOOM_TP_WHOLE &&
		    (rc = loom_allreduce(e->cfg.tp, &w, &w, 1, LOOM_FLOAT64, LOOM_SUM)) != LOOM_OK)
			return loom_seterr(rc, "pipeline stage %d, tensor-parallel rank %d: %s's share of the gradient norm: "
			                   "%s", e->s, e->tp_rank, e->tensors[t].name, loom_comm_errmsg(e->cfg.tp));
		sq -= w;
	}
	for (int t = 0; e->s > 0 && t < e->ntensors; t++) /* every block's scalars: once, on the first stage */
		if (e->tensors[t].all_blocks) /* whole on every tp rank */
			sq -= loom_grad_sumsq(loom_model_tensor_grad(e->stage, t), e->tensors[t].numel);
	for (int t = 0; e->s > 0 && e->head && t < e->ntensors; t++) { /* the tied wte: once, on the first stage */
		if (!e->tensors[t].head_reads)
			continue;
		double w = loom_grad_sumsq(loom_model_tensor_grad(e->stage, t), e->tensors[t].numel);
		/* a tp shard holds some of wte's rows: the strategy's norm has the group's sum of them */
		if (e->tp_size > 1 && (rc = loom_allreduce(e->cfg.tp, &w, &w, 1, LOOM_FLOAT64, LOOM_SUM)) != LOOM_OK)
			return loom_seterr(rc, "pipeline stage %d, tensor-parallel rank %d: wte's share of the gradient norm: "
			                   "%s", e->s, e->tp_rank, loom_comm_errmsg(e->cfg.tp));
		sq -= w;
	}
	if ((rc = loom_allreduce(e->cfg.pp, &sq, &sq, 1, LOOM_FLOAT64, LOOM_SUM)) != LOOM_OK)
		return loom_seterr(rc, "pipeline stage %d of %d: the gradient norm: %s", e->s, e->P,
		                   loom_comm_errmsg(e->cfg.pp));
	*norm = sqrt(LOOM_MAX(sq, 0.0));
	return LOOM_OK;
}

static int pp_gather(loom_exec_t *ex, loom_strategy_t *s)
{
	pp_exec_t *e = (pp_exec_t *)ex;
	size_t off = 0;
	float *bufs[3] = {loom_model_params(e->cfg.model), s->opt.m, s->opt.v};
	int rc;
	if (s->own_offset != 0 || s->own_count != e->nparams)
		return loom_seterr(LOOM_ENOTSUP, "pipeline stage %d: the strategy '%s' owns a part of the state; pipeline "
		                   "parallel composes with whole-state strategies (ddp, zero 0) only", e->s, s->ops->name);
	for (int q = 0; q < e->s; q++)
		off += e->counts[q];
	/* MuonAdamW's state is not laid out by the flat buffer: the parameters only (evaluation) */
	for (int k = 0; k < (s->muon ? 1 : 3); k++)
		if ((rc = loom_allgatherv(e->cfg.pp, bufs[k] + off, e->counts[e->s], bufs[k], e->counts, LOOM_FLOAT32)) !=
		    LOOM_OK)
			return loom_seterr(rc, "pipeline stage %d of %d: gathering the stages' state: %s", e->s, e->P,
			                   loom_comm_errmsg(e->cfg.pp));
	return LOOM_OK;
}

static const loom_exec_ops_t pp_ops = {
	.name = "pipeline",
	.create = pp_create,
	.destroy = pp_destroy,
	.model = pp_model,
	.tensor_used = pp_used,
	.step = pp_step,
	.grad_norm = pp_grad_norm,
	.gather = pp_gather,
};

const loom_exec_ops_t *loom__exec_pipeline(void)
{
	return &pp_ops;
}
