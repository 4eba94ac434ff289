/* pp.c: the pipeline-parallel step executor (src/parallel/pp.h): this rank is stage s of P on the
 * pipeline axis and runs blocks [lo, hi) of the model (the embedding too on the first stage; ln_f,
 * the tied lm head and the loss on the last), the step's M micro-batches in the order of a schedule
 * from schedule.c (GPipe or 1F1B).
 *
 * The stage model is created here with the layer range, one activation arena per micro-batch in
 * flight, and only the tensors the stage uses (loom_model_opts_t keep), packed into buffers of its
 * own with their values copied from the caller's model: its table, parameters, gradients (the
 * strategy points them at its storage) and so the strategy's optimizer state are the stage's alone.
 * The tensors it owns (its blocks', the embedding's on the first stage, the head's on the last) are
 * one contiguous run of the caller's layout; the others it holds are copies of tensors other stages
 * own (the tied wte on the head stages, nanochat's per-layer scalars, the head's on stage P-2 when it
 * shares the head), kept equal by the gradient sums below. gather writes every stage's owned tensors
 * into the caller's model (for a whole-model evaluation); save writes the whole state as one
 * process's checkpoint and load takes the stage's tensors from any checkpoint's whole state.
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
	size_t nparams, act;          /* act: floats of one activation (B x T x C); nparams: of the caller's
	                                 (whole or tp shard) buffer */
	const loom_tensor_info_t *full; /* the (shard) tensor table of the caller's model, nfull tensors */
	int nfull;
	const loom_tensor_info_t *tensors; /* the stage model's table: the tensors it holds, packed */
	int *idx;                     /* ntensors: the caller's index of each of them */
	int *rev;                     /* nfull: the stage's index of each caller's tensor, or -1 */
	unsigned char *owned;         /* ntensors: the stage owns it (else it is a copy of another stage's,
	                                 e.g. the tied wte on the last stage, kept equal by the sums below) */
	unsigned char *skip;          /* ntensors: !owned (left out of the gradient norm) */
	unsigned char *shared;        /* ntensors: its gradient is summed over stages (wte, the per-layer
	                                 scalars, a shared head's): the strategy reduces it after the sums */
	float *zeros;                 /* a stage's share of a tensor it does not hold, in the sums (zmax floats) */
	size_t zmax;
	size_t *counts;               /* floats each stage owns, in stage order (they tile the buffer) */
	unsigned char *used;          /* per caller's tensor: this stage holds it */
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
 * blocking collective over the tp axis (all-reduce; with sequence parallelism the in-place all-gather
 * and reduce-scatter of rank-ordered parts), as the tp strategy gives the stage model. */
static int whole_reduce(void *ctx, float *buf, size_t n, loom_tp_op_t op)
{
	pp_exec_t *e = ctx;
	size_t part = n / (size_t)e->tp_size;
	int rc = op == LOOM_TP_ALLGATHER ? loom_allgather(e->cfg.tp, buf + (size_t)e->tp_rank * part, buf, part,
	                                                  LOOM_FLOAT32)
	       : op == LOOM_TP_REDUCE_SCATTER
	           ? loom_reduce_scatter(e->cfg.tp, buf, buf + (size_t)e->tp_rank * part, part, LOOM_FLOAT32, LOOM_SUM)
	           : loom_allreduce(e->cfg.tp, buf, buf, n, LOOM_FLOAT32, op == LOOM_TP_MAX ? LOOM_MAX : LOOM_SUM);
	if (rc != LOOM_OK)
		return loom_seterr(rc, "pipeline stage %d, tensor-parallel rank %d of %d: %s of %zu floats for the "
		                   "whole model: %s", e->s, e->tp_rank, e->tp_size,
		                   op == LOOM_TP_ALLGATHER ? "all-gather" : op == LOOM_TP_REDUCE_SCATTER ? "reduce-scatter"
		                                                                                        : "all-reduce",
		                   n, loom_comm_errmsg(e->cfg.tp));
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
	e->full = loom_model_tensors(cfg->model, &e->nfull);
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
	e->used = loom__calloc((size_t)e->nfull, 1);
	e->rev = loom__calloc((size_t)e->nfull, sizeof *e->rev);
	e->inputs = loom__malloc(sizeof(int) * (size_t)e->M * cfg->B * cfg->T);
	e->targets = loom__malloc(sizeof(int) * (size_t)e->M * cfg->B * cfg->T);
	e->losses = loom__calloc((size_t)e->M, sizeof *e->losses);
	e->times = loom__calloc((5 + 3 * (size_t)e->M) * (size_t)e->P, sizeof *e->times);
	e->act_rbuf = loom__malloc(sizeof(float) * e->act);
	e->grad_rbuf = loom__malloc(sizeof(float) * e->act);
	e->grad_sbuf[0] = loom__malloc(sizeof(float) * e->act);
	e->grad_sbuf[1] = loom__malloc(sizeof(float) * e->act);
	if (!e->plan || !e->counts || !e->used || !e->rev || !e->inputs || !e->targets || !e->losses || !e->times || !e->act_rbuf ||
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
	for (int t = 0; t < e->nfull; t++) {
		const loom_tensor_info_t ti = e->full[t];
		int u = ti.layer, owner = u < 0 ? 0 : u >= e->mc.n_layer ? e->P - 1 : 0;
		for (int q = 0; q < e->P && u >= 0 && u < e->mc.n_layer; q++)
			if (u >= lo[q] && u < lo[q + 1])
				owner = q;
		e->counts[owner] += ti.numel;
		e->used[t] = owner == e->s || (ti.head_reads && e->head) || (e->head && u >= e->mc.n_layer) ||
		             (ti.all_blocks && e->lo < e->hi);
		e->shared_blocks |= ti.all_blocks;
		if (!e->used[t] && (ti.all_blocks || ti.layer >= e->mc.n_layer)) /* summed here as zeros */
			e->zmax = LOOM_MAX(e->zmax, ti.numel);
	}
	/* The stage model: its layers, `arenas` arenas, and only the tensors it uses, packed into its own
	 * buffers (opts.keep), their values copied from the caller's model. */
	memset(&o, 0, sizeof o);
	o.B = cfg->B, o.T = cfg->T, o.arenas = e->arenas, o.layer_lo = e->lo, o.layer_hi = e->hi, o.keep = e->used;
	o.act_ckpt = loom_model_act_ckpt(cfg->model); /* the caller's checkpointing, per arena of the stage */
	o.dtype = loom_model_dtype(cfg->model); /* the stage computes in the whole model's precision */
	o.tp_size = e->tp_size, o.tp_rank = e->tp_rank;
	o.sequence_parallel = loom_model_sequence_parallel(cfg->model);
	if ((rc = loom_model_create(&e->stage, &e->mc, &o)) != LOOM_OK)
		goto fail;
	e->tensors = loom_model_tensors(e->stage, &e->ntensors);
	e->idx = loom__calloc((size_t)LOOM_MAX(e->ntensors, 1), sizeof *e->idx);
	e->owned = loom__calloc((size_t)LOOM_MAX(e->ntensors, 1), 1);
	e->skip = loom__calloc((size_t)LOOM_MAX(e->ntensors, 1), 1);
	e->shared = loom__calloc((size_t)LOOM_MAX(e->ntensors, 1), 1);
	e->zeros = e->zmax ? loom__calloc(e->zmax, sizeof(float)) : NULL;
	if (!e->idx || !e->owned || !e->skip || !e->shared || (e->zmax && !e->zeros)) {
		rc = loom_seterr(LOOM_ENOMEM, "pipeline: out of memory");
		goto fail;
	}
	for (int t = 0, k = 0; t < e->nfull; t++) {
		e->rev[t] = e->used[t] ? k : -1;
		if (!e->used[t])
			continue;
		e->idx[k] = t;
		memcpy(loom_model_tensor_param(e->stage, k), loom_model_params(cfg->model) + e->full[t].offset,
		       e->full[t].numel * sizeof(float));
		k++;
	}
	{ /* the tensors this stage owns: a contiguous run of the caller's buffer, counts[s] floats */
		size_t off = 0, end;
		for (int q = 0; q < e->s; q++)
			off += e->counts[q];
		end = off + e->counts[e->s];
		for (int k = 0; k < e->ntensors; k++) {
			const loom_tensor_info_t *ti = &e->full[e->idx[k]];
			e->owned[k] = ti->offset >= off && ti->offset < end;
			e->skip[k] = !e->owned[k];
			e->shared[k] = ti->head_reads || ti->all_blocks || (e->hrows && ti->layer >= e->mc.n_layer);
		}
	}
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
	free(e->idx), free(e->rev), free(e->owned), free(e->skip), free(e->shared), free(e->zeros);
	free(e->plan), free(e->counts), free(e->used), free(e->inputs), free(e->targets), free(e->losses), free(e->rows);
	free(e->times);
	free(e->act_rbuf), free(e->grad_rbuf), free(e->grad_sbuf[0]), free(e->grad_sbuf[1]), free(e->act_sends);
	free(e);
}

static loom_model_t *pp_model(loom_exec_t *e)
{
	return ((pp_exec_t *)e)->stage;
}

static void pp_flags(loom_exec_t *ex, const unsigned char **norm_skip, const unsigned char **deferred)
{
	pp_exec_t *e = (pp_exec_t *)ex;
	*norm_skip = e->skip, *deferred = e->shared;
}

/* The gradient of the caller's tensor t on this stage, or zeros when the stage does not hold it (it
 * still takes part in the sums over the stages that do). */
static float *grad_or_zeros(pp_exec_t *e, int t)
{
	if (e->rev[t] >= 0)
		return loom_model_tensor_grad(e->stage, e->rev[t]);
	memset(e->zeros, 0, e->full[t].numel * sizeof(float));
	return e->zeros;
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

/* The gradients of the tensors several stages hold, summed over them: the tied wte (the embedding's
 * share on the first stage plus the lm head's on the head stages), nanochat's per-layer scalars
 * (every stage's), a shared head's tensors (stage P-2's and the last's). Collective over the pipeline. */
static int sum_shared(pp_exec_t *e)
{
	const loom_exec_config_t *c = &e->cfg;
	int rc = LOOM_OK;
	for (int t = 0; e->ends && (e->s == 0 || e->head) && t < e->ntensors; t++) {
		if (!e->tensors[t].head_reads)
			continue;
		float *g = loom_model_tensor_grad(e->stage, t);
		if ((rc = loom_allreduce(e->ends, g, g, e->tensors[t].numel, LOOM_FLOAT32, LOOM_SUM)) != LOOM_OK) {
			rc = loom_seterr(rc, "pipeline stage %d of %d: summing %s's gradient between the stages that hold it: "
			                 "%s", e->s, e->P, e->tensors[t].name, loom_comm_errmsg(e->ends));
			return rc;
		}
	}
	/* Tensors every block reads (nanochat's per-layer scalars): the sum of every stage's share. */
	for (int t = 0; e->shared_blocks && t < e->nfull; t++) {
		if (!e->full[t].all_blocks)
			continue;
		float *g = grad_or_zeros(e, t); /* a head-alone stage holds none: it adds zeros */
		if ((rc = loom_allreduce(c->pp, g, g, e->full[t].numel, LOOM_FLOAT32, LOOM_SUM)) != LOOM_OK) {
			rc = loom_seterr(rc, "pipeline stage %d of %d: summing %s's gradient over the stages: %s", e->s, e->P,
			                 e->full[t].name, loom_comm_errmsg(c->pp));
			return rc;
		}
	}
	if (e->ends && (e->s == 0 || e->head)) {
		for (int t = 0; e->hrows && t < e->nfull; t++) {
			if (e->full[t].layer < e->mc.n_layer)
				continue;
			float *gl = grad_or_zeros(e, t); /* the first stage (P > 2) holds no head tensor: it adds zeros */
			if ((rc = loom_allreduce(e->ends, gl, gl, e->full[t].numel, LOOM_FLOAT32, LOOM_SUM)) != LOOM_OK) {
				rc = loom_seterr(rc, "pipeline stage %d of %d: summing %s's gradient between the stages that "
				                 "share the head: %s", e->s, e->P, e->full[t].name, loom_comm_errmsg(e->ends));
				return rc;
			}
		}
	}
	return rc;
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
	/* The tensors several stages hold are summed over them: after the strategy's reduction when it
	 * keeps the whole gradient (DDP: a sum of averages is the average of the sums), before it when it
	 * reduces them into shards (ZeRO holds those units back until finish_grads: strategy.h deferred). */
	loom_strategy_stats_t ss;
	int sharded = s->own_count < loom_model_param_count(e->stage);
	double ts = loom_now(), tsum = 0.0; /* the sums' time, the pipeline's own communication */
	if (sharded && (rc = sum_shared(e)) != LOOM_OK)
		goto out;
	tsum += loom_now() - ts;
	if ((rc = s->ops->finish_grads(s, &ss)) != LOOM_OK)
		goto out;
	st->comm_ms = ss.comm_ms, st->exposed_comm_ms = ss.exposed_comm_ms;
	t0 = loom_now();
	if (!sharded && (rc = sum_shared(e)) != LOOM_OK)
		goto out;
	if (e->head)
		for (int j = 0; j < e->M; j++)
			*loss_sum += e->losses[j];
	if ((rc = loom_allreduce(c->pp, loss_sum, loss_sum, 1, LOOM_FLOAT64, LOOM_SUM)) != LOOM_OK) {
		rc = loom_seterr(rc, "pipeline stage %d of %d: the loss from the last stage: %s", e->s, e->P,
		                 loom_comm_errmsg(c->pp));
		goto out;
	}
	event(e, LOOM_EV_ALLREDUCE, -1, -2, t0);
	double ta = 1e3 * (loom_now() - t0 + tsum);
	st->comm_ms += ta, st->exposed_comm_ms += ta;
out:
	rc = drain(e, rc);
	st->p2p_wait_ms = e->wait_ms;
	return rc;
}

/* The strategy's norm of this stage (each tensor once: the copies of tensors other stages own are
 * left out, strategy.h's norm_skip; tensor-parallel shards summed over their group inside it), summed
 * over the stages. */
static int pp_grad_norm(loom_exec_t *ex, loom_strategy_t *s, double *norm)
{
	pp_exec_t *e = (pp_exec_t *)ex;
	double sq;
	int rc;
	if ((rc = s->ops->grad_norm(s, norm)) != LOOM_OK)
		return rc;
	sq = *norm * *norm;
	if ((rc = loom_allreduce(e->cfg.pp, &sq, &sq, 1, LOOM_FLOAT64, LOOM_SUM)) != LOOM_OK)
		return loom_seterr(rc, "pipeline stage %d of %d: the gradient norm: %s", e->s, e->P,
		                   loom_comm_errmsg(e->cfg.pp));
	*norm = sqrt(LOOM_MAX(sq, 0.0));
	return LOOM_OK;
}

/* This stage's owned tensors of src (a buffer in the stage model's packed layout) in the caller's
 * order, which is one contiguous run of the caller's layout (counts[s] floats), into dst. */
static void pack_owned(const pp_exec_t *e, const float *src, float *dst)
{
	for (int k = 0; k < e->ntensors; k++)
		if (e->owned[k]) {
			memcpy(dst, src + e->tensors[k].offset, e->tensors[k].numel * sizeof(float));
			dst += e->tensors[k].numel;
		}
}

/* Every stage's owned part of a packed buffer (src) into full, the caller's whole layout, on every
 * rank of the pipeline. Collective over it. */
static int gather_owned(pp_exec_t *e, const float *src, float *full, const char *what)
{
	size_t off = 0;
	for (int q = 0; q < e->s; q++)
		off += e->counts[q];
	pack_owned(e, src, full + off);
	int rc = loom_allgatherv(e->cfg.pp, full + off, e->counts[e->s], full, e->counts, LOOM_FLOAT32);
	if (rc != LOOM_OK)
		return loom_seterr(rc, "pipeline stage %d of %d: gathering the stages' %s: %s", e->s, e->P, what,
		                   loom_comm_errmsg(e->cfg.pp));
	return LOOM_OK;
}

/* The stage's current parameters (and AdamW moments: m, v non-NULL) gathered from its data-parallel
 * ranks (loom__strategy_export, collective over dp), then every stage's owned tensors of them into
 * the caller's layout on every rank of the pipeline: the parameters into the caller's model, the
 * moments into m, v (e->nparams floats each). */
static int gather_state(pp_exec_t *e, loom_strategy_t *s, float *m, float *v)
{
	size_t n = loom_model_param_count(e->stage), bytes = LOOM_MAX(n, 1) * sizeof(float);
	float *lp = loom_alloc_aligned(bytes), *lm = m ? loom_alloc_aligned(bytes) : NULL;
	float *lv = v ? loom_alloc_aligned(bytes) : NULL;
	int rc;
	if (!lp || (m && !lm) || (v && !lv))
		rc = loom_seterr(LOOM_ENOMEM, "pipeline stage %d: out of memory for gathering the stage's state", e->s);
	else if ((rc = loom__strategy_export(s, lp, lm, lv)) == LOOM_OK &&
	         (rc = gather_owned(e, lp, loom_model_params(e->cfg.model), "parameters")) == LOOM_OK && m &&
	         (rc = gather_owned(e, lm, m, "AdamW moments")) == LOOM_OK)
		rc = gather_owned(e, lv, v, "AdamW moments");
	loom_free_aligned(lp), loom_free_aligned(lm), loom_free_aligned(lv);
	return rc;
}

/* The caller's model gets every stage's current parameters (for an evaluation of the whole model). */
static int pp_gather(loom_exec_t *ex, loom_strategy_t *s)
{
	return gather_state((pp_exec_t *)ex, s, NULL, NULL);
}

/* A checkpoint as one process's: the parameters gathered into the caller's model (gather), the AdamW
 * moments into whole buffers the same way; the writer writes them as DDP does, or with tensor
 * parallelism the tp group of pipeline stage 0 and data-parallel rank 0 unshards and writes them. */
static int pp_save(loom_exec_t *ex, loom_strategy_t *s, const loom_ckpt_writer_t *w)
{
	pp_exec_t *e = (pp_exec_t *)ex;
	float *p = loom_model_params(e->cfg.model), *m = NULL, *v = NULL;
	char path[1200];
	int rc;
	if (s->muon)
		return loom_seterr(LOOM_ENOTSUP, "pipeline stage %d: checkpoints of MuonAdamW under pipeline parallel are "
		                   "not written (its state is per rank)", e->s);
	m = loom_alloc_aligned(LOOM_MAX(e->nparams, 1) * sizeof(float));
	v = loom_alloc_aligned(LOOM_MAX(e->nparams, 1) * sizeof(float));
	if (!m || !v) {
		rc = loom_seterr(LOOM_ENOMEM, "pipeline stage %d: out of memory for a checkpoint's moments", e->s);
		goto out;
	}
	if ((rc = gather_state(e, s, m, v)) != LOOM_OK)
		goto out;
	if (e->tp_size > 1) {
		loom__tp_group_t g;
		loom__tp_group_init(&g, e->cfg.tp);
		if (e->s == 0 && s->dp_rank == 0)
			rc = loom__tp_write_whole(&g, &e->mc, e->nparams, p, m, v, w);
	} else if (w && w->active) {
		if (!(rc = loom_ckpt_file(w, "model.safetensors", path, sizeof path)) &&
		    !(rc = loom_model_save_safetensors(path, &e->mc, p)) &&
		    !(rc = loom_ckpt_file(w, "optim.safetensors", path, sizeof path)))
			rc = loom_optim_save(path, &e->mc, m, v);
	}
out:
	loom_free_aligned(m), loom_free_aligned(v);
	return rc;
}

/* Any checkpoint (any strategy, mesh or stage count wrote it): the whole state, of which the stage
 * keeps its tensors (and the caller's model all the parameters), and the strategy its part of those.
 * Not collective. */
static int pp_load(loom_exec_t *ex, loom_strategy_t *s, const char *dir, long long step)
{
	pp_exec_t *e = (pp_exec_t *)ex;
	size_t n = loom_model_param_count(e->stage), bytes = LOOM_MAX(n, 1) * sizeof(float);
	float *p = loom_model_params(e->cfg.model), *m = NULL, *v = NULL, *lp = NULL, *lm = NULL, *lv = NULL;
	int rc;
	if (s->muon)
		return loom_seterr(LOOM_ENOTSUP, "pipeline stage %d: resuming MuonAdamW under pipeline parallel is not "
		                   "supported (its checkpoints are not written)", e->s);
	m = loom_alloc_aligned(LOOM_MAX(e->nparams, 1) * sizeof(float));
	v = loom_alloc_aligned(LOOM_MAX(e->nparams, 1) * sizeof(float));
	lp = loom_alloc_aligned(bytes), lm = loom_alloc_aligned(bytes), lv = loom_alloc_aligned(bytes);
	if (!m || !v || !lp || !lm || !lv) {
		rc = loom_seterr(LOOM_ENOMEM, "pipeline stage %d: out of memory to read a checkpoint", e->s);
		goto out;
	}
	if (e->tp_size > 1) {
		loom__tp_group_t g;
		loom__tp_group_init(&g, e->cfg.tp);
		rc = loom__tp_read_shard(&g, dir, &e->mc, e->nparams, p, m, v);
	} else {
		rc = loom__read_whole_state(dir, &e->mc, p, m, v);
	}
	if (rc != LOOM_OK)
		goto out;
	for (int k = 0; k < e->ntensors; k++) {
		size_t from = e->full[e->idx[k]].offset, to = e->tensors[k].offset, cnt = e->tensors[k].numel;
		memcpy(lp + to, p + from, cnt * sizeof(float));
		memcpy(lm + to, m + from, cnt * sizeof(float));
		memcpy(lv + to, v + from, cnt * sizeof(float));
	}
	rc = loom__strategy_import(s, lp, lm, lv, step);
out:
	loom_free_aligned(m), loom_free_aligned(v), loom_free_aligned(lp), loom_free_aligned(lm), loom_free_aligned(lv);
	return rc;
}

static const loom_exec_ops_t pp_ops = {
	.name = "pipeline",
	.create = pp_create,
	.destroy = pp_destroy,
	.model = pp_model,
	.stage_flags = pp_flags,
	.step = pp_step,
	.grad_norm = pp_grad_norm,
	.gather = pp_gather,
	.save = pp_save,
	.load = pp_load,
};

const loom_exec_ops_t *loom__exec_pipeline(void)
{
	return &pp_ops;
}
