/* pp.c: the pipeline-parallel step executor (src/parallel/pp.h): this rank is stage s of P on the
 * pipeline axis and runs the step's M micro-batches in the order of a schedule from schedule.c
 * (GPipe, 1F1B, or interleaved 1F1B with V model chunks per rank). Chunk c of the rank is global stage
 * g = c P + s of G = P V (V = 1 but for interleaved) and runs blocks [lo, hi) of it (the embedding
 * too on global stage 0; ln_f, the tied lm head and the loss on G-1).
 *
 * Each chunk's stage model is created here with its layer range, one activation arena per
 * micro-batch of it in flight, and only the tensors it uses (loom_model_opts_t keep), their values
 * copied from the caller's model. With V = 1 it has buffers of its own and is the model the strategy
 * attaches to; with V > 1 the strategy attaches to the chunks' join (src/model/join.h: one table and
 * one pair of buffers over the rank's tensors, which the chunks' views point into), so a rank's
 * table, parameters, gradients (the strategy points them at its storage) and so the strategy's
 * optimizer state are the rank's alone. The tensors a global stage owns (its blocks', the embedding's
 * on the first, the head's on the last) are one contiguous run of the caller's layout, a rank's V of
 * them; the others it holds are copies of tensors other stages own (the tied wte on the head stage,
 * nanochat's per-layer scalars, the head's on stage G-2 when it shares the head), kept equal by the
 * gradient sums below. eval runs validation windows forward through the stages (pp_eval); save
 * gathers the whole state on the first stage alone and writes it as one process's checkpoint; load
 * takes the rank's tensors from any checkpoint's whole state. The caller's model is read once, at
 * create (the initial parameters): a trainer may free its parameter buffer after that.
 *
 * Per micro-batch, a chunk's activations (B x T x C floats, block_input(hi); a part of them: edge) go to the next global
 * stage (rank s+1, or rank 0's chunk c+1 from rank P-1) with loom_isend straight from the arena
 * (waited for only before that arena is reused), and the gradient of its input goes back from a copy
 * of stream_grad (two send buffers per chunk in turn). Messages between two ranks are matched to
 * receives in posting order, so the receives from each neighbour are posted in the order its own plan
 * sends them (an inbox per neighbour; one when P = 2, where activations and gradients share each
 * direction), one message ahead of the one waited for, into buffers of a pool: transfers overlap the
 * compute around them. The tag (+ 2 x the receiving chunk) makes a crossed message a mismatch error.
 * Each chunk's stream gradient is shared by its arenas: the schedules never run two backwards at
 * once. On the last global stage the head's forward and backward run fused, at the micro-batch's
 * backward. A chunk's forwards and backwards each run in micro-batch order (loom__pp_chunk_arenas),
 * so micro-batch mb uses arena mb % arenas of its chunk.
 *
 * A head-alone last stage (a head heavier than the blocks, e.g. `small`'s) shares the head's
 * positions with global stage G-2 (rank P-2's last chunk), which holds the head's input: it runs the
 * head of positions [0, hrows) of each micro-batch (loom_pp_stages: as the FLOPs balance the two
 * stages, or the trainer's pp_head_split) at the start of that micro-batch's backward, from its own
 * last block's output, and sends only positions [hrows, B T) forward and receives only their
 * gradient back. Rank P-2 then uses wte and ln_f too: their gradients are summed over the ranks that
 * hold them (the first, P-2, the last; with P = 2 the first is P-2, whose chunks 0 and V-1 add their
 * wte shares into the one gradient of the join), and the norm counts wte on the first stage and ln_f
 * on the last only.
 *
 * With tensor parallelism (a mesh with tp > 1 and pp > 1) the caller's model is this rank's tp shard
 * and so is the stage model (the same tp_size/tp_rank, its layers only): the tensor table, the
 * stages' counts and the buffer are the shard's. The pipeline communicator joins the ranks with this
 * rank's tp (and dp) coordinate, so activations go between the same tp rank of neighbouring stages
 * (the residual stream is replicated in a tp group: each tp rank sends its own copy; with sequence
 * parallelism each holds and sends only its B T / tp rows, as Megatron's scatter-gather between
 * stages does, so a transfer is 1/tp of the stream: edge), the tied wte's
 * gradient is summed per tp rank (each holds the same vocabulary rows on the first and last stage),
 * the last stage runs the vocabulary-parallel head, and the gradient norm removes the last stage's
 * wte share summed over its tp group. The caller's model is never run (evaluation goes through the
 * stages), so it needs no tp reduction of its own.
 *
 * Invariants: after step, every rank of the pipeline holds the step's summed loss (the head stages',
 * sent to all: the other ranks add zeros), the wte gradient is the sum of the first stage's (embedding)
 * and the head stages' (lm head) shares on all of them (one all-reduce, which gives them the same bits;
 * so is ln_f's when the head is split), and each stage's other gradients are the single-process ones up
 * to float rounding, so the losses and parameters match one process with accumulation M
 * (tests/test_pp.c checks 1e-5). At most the schedule's count of (chunk, micro-batch) pairs are in
 * flight at once (counted: max_inflight). A dead neighbour is reported by the transfer waiting on it
 * (LOOM_EPEERLOST), never a hang. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/model_internal.h"
#include "core/util.h"
#include "loom/train.h"
#include "model/join.h"
#include "parallel/pp.h"

enum { TAG_ACT = 91, TAG_GRAD = 92 }; /* + 2 x the receiving chunk */
enum { TAG_EVAL = 4091 };          /* + the receiving chunk: evaluation's activations */
enum { TAG_SAVE = 5091 };          /* + 0 parameters, 1 and 2 the moments: a checkpoint's gather */

/* One model chunk of this rank: global stage g = c P + s of the G = P V. */
typedef struct {
	loom_model_t *m;              /* its stage model (owned by the join when V > 1) */
	int g, lo, hi, arenas;        /* blocks [lo, hi); arenas of its stage model */
	int head;                     /* it computes head positions: the last global stage, and G-2 when shared */
	unsigned char *used;          /* per caller's tensor: the chunk holds it */
	loom_request_t **act_sends;   /* of arena k's output, to the next global stage */
	loom_request_t *grad_sends[2];
	float *grad_sbuf[2];          /* the gradient of its input, sent from a copy (two in turn) */
	double busy[3];               /* compute time this step: forwards, head rows (stage G-2), backwards */
} chunk_t;

/* A transfer this rank receives: an activation ('A') for chunk's forward or a gradient ('G') for its
 * backward, of micro-batch mb. */
typedef struct {
	char kind;
	int chunk, mb;
	size_t count;
	float *buf;                   /* from the pool while its receive is posted and not yet consumed */
	loom_request_t *req;
} msg_t;

/* The transfers from one neighbour, in the order it sends them (its plan): receives must be posted
 * in that order (messages between a pair arrive in order, matched to receives in issue order). */
typedef struct {
	int peer, n, posted;          /* messages [0, posted) have had their receive posted */
	msg_t *q;
} inbox_t;

typedef struct {
	loom_exec_t base;
	loom_exec_config_t cfg;
	loom_model_config_t mc;
	loom_model_t *model;          /* the strategy's: the join of the chunks (V > 1) or chunk 0's model */
	loom_comm_t *ends;            /* the ranks holding wte: the first's, the last's, and G-2's when it runs
	                                 head rows (the pp comm itself when that is every rank; owned otherwise) */
	int own_ends;
	int P, s, V, G, M, nplan, ntensors;
	chunk_t *ch;                  /* V */
	int width;                    /* floats per position of the residual stream (loom_model_stream_width) */
	int shared_blocks;            /* some tensor is read by every block (all_blocks): summed over all stages */
	int hrows;                    /* the head is shared: positions [0, rows[mb]) of micro-batch
	                                 mb run their head on stage G-2, [rows[mb], B T) on the last; hrows is
	                                 the usual rows[mb] (0: no split, the last runs them all) */
	int *rows;                    /* M (loom__pp_head_rows: the first and last may differ) */
	int head;                     /* this rank computes head positions (one of its chunks does) */
	int tp_size, tp_rank;         /* the model's tensor-parallel shard (1, 0: whole) */
	int sp;                       /* sequence parallelism: the stream passes as each tp rank's rows (edge) */
	unsigned long long sent;      /* bytes this rank sent to its neighbours this step */
	size_t nparams, act;          /* act: floats of one activation (B x T x C); nparams: of the caller's
	                                 (whole or tp shard) buffer */
	const loom_tensor_info_t *full; /* the (shard) tensor table of the caller's model, nfull tensors */
	int nfull;
	const loom_tensor_info_t *tensors; /* the strategy model's table: the tensors the rank holds, packed */
	int *idx;                     /* ntensors: the caller's index of each of them */
	int *rev;                     /* nfull: the strategy model's index of each caller's tensor, or -1 */
	int *own_g;                   /* ntensors: the global stage (one of this rank's) owning it, or -1 for a
	                                 copy of another rank's (e.g. the tied wte on the last), kept equal by
	                                 the sums below */
	unsigned char *skip;          /* ntensors: not owned (left out of the gradient norm) */
	unsigned char *shared;        /* ntensors: its gradient is summed over stages (wte, the per-layer
	                                 scalars, a shared head's): the strategy reduces it after the sums */
	float *zeros;                 /* a rank's share of a tensor it does not hold, in the sums (zmax floats) */
	size_t zmax;
	size_t *counts;               /* G: floats each global stage owns, in stage order (they tile the buffer) */
	unsigned char *used;          /* per caller's tensor: one of the rank's chunks holds it */
	loom__pp_action_t *plan;      /* 2 M V */
	inbox_t inbox[2];             /* from the previous and the next rank (one when they are the same) */
	int ninbox;
	int *msg_box, *msg_j;         /* 2 V M: (kind, chunk, mb) -> its inbox and place there */
	float **pool;                 /* receive buffers of act floats not in use */
	int npool, cap;
	int *inputs, *targets;        /* M x B x T each */
	float *losses;                /* M */
	int inflight;
	double wait_ms, first_t, last_t; /* time waited for transfers; the first compute's start, last end */
	double *times;                /* (2 + 3 V) x P: every rank's (first_t, last_t, its chunks' busy); then
	                                 3 x G x M: the global stages' forward, head rows and backward times */
} pp_exec_t;

static void pp_destroy(loom_exec_t *ex);

/* The part of micro-batch mb's activation that global stage g sends to g+1, and of its gradient that
 * g+1 sends back: *off floats into the stream, *count of them. It is positions [lo, B T): lo = 0, or
 * with the head shared (g = G-2, mb >= 0: training, not evaluation) the rows[mb] whose head stage G-2
 * computes. With sequence parallelism only this tp rank's rows of them [R0, R0 + B T / tp) pass, to the
 * same tp rank (every block reads only its rows of the stream and of its gradient; a head-alone last
 * stage gathers its input itself). */
static void edge(const pp_exec_t *e, int g, int mb, size_t *off, size_t *count)
{
	size_t N = (size_t)e->cfg.B * e->cfg.T, lo = e->hrows && g == e->G - 2 && mb >= 0 ? (size_t)e->rows[mb] : 0;
	size_t hi = N;
	if (e->sp) {
		size_t r0 = (size_t)e->tp_rank * (N / (size_t)e->tp_size);
		lo = LOOM_MAX(lo, r0), hi = r0 + N / (size_t)e->tp_size;
		lo = LOOM_MIN(lo, hi);
	}
	*off = lo * (size_t)e->width, *count = (hi - lo) * (size_t)e->width;
}

static int prev_rank(const pp_exec_t *e)
{
	return (e->s - 1 + e->P) % e->P;
}

static int next_rank(const pp_exec_t *e)
{
	return (e->s + 1) % e->P;
}

static int msg_key(const pp_exec_t *e, char kind, int c, int mb)
{
	return ((kind == 'A' ? 0 : 1) * e->V + c) * e->M + mb;
}

/* Complete a request (NULL: nothing) of a transfer with rank `peer`, adding the time waited; keeps the
 * first error. */
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

/* A receive buffer (act floats) from the pool, or a new one; NULL when out of memory. */
static float *pool_get(pp_exec_t *e)
{
	if (e->npool > 0)
		return e->pool[--e->npool];
	float **p = realloc(e->pool, sizeof *p * (size_t)(e->cap + 1));
	if (!p)
		return NULL;
	e->pool = p, e->cap++;
	return loom__malloc(sizeof(float) * LOOM_MAX(e->act, 1));
}

static void pool_put(pp_exec_t *e, float *buf)
{
	if (buf)
		e->pool[e->npool++] = buf; /* cap counts every buffer handed out */
}

/* Post the receives of inbox b's messages up to and including j (in order). */
static int post_upto(pp_exec_t *e, inbox_t *b, int j)
{
	for (; b->posted <= j && b->posted < b->n; b->posted++) {
		msg_t *q = &b->q[b->posted];
		int rc;
		if (!(q->buf = pool_get(e)))
			return loom_seterr(LOOM_ENOMEM, "pipeline stage %d: out of memory for a receive buffer", e->s);
		if ((rc = loom_irecv(e->cfg.pp, q->buf, q->count, LOOM_FLOAT32, b->peer,
		                     (q->kind == 'A' ? TAG_ACT : TAG_GRAD) + 2 * q->chunk, &q->req)) != LOOM_OK) {
			pool_put(e, q->buf), q->buf = NULL;
			return loom_seterr(rc, "pipeline stage %d: posting a receive from stage %d: %s", e->s, b->peer,
			                   loom_comm_errmsg(e->cfg.pp));
		}
	}
	return LOOM_OK;
}

/* Chunk c's activation ('A') or gradient ('G') of micro-batch mb into dst: its receive (and the next
 * message's from that neighbour, so it overlaps what runs meanwhile) posted, waited for, copied. */
static int receive(pp_exec_t *e, char kind, int c, int mb, float *dst)
{
	int key = msg_key(e, kind, c, mb), rc;
	inbox_t *b = &e->inbox[e->msg_box[key]];
	msg_t *q = &b->q[e->msg_j[key]];
	if ((rc = post_upto(e, b, e->msg_j[key] + 1)) != LOOM_OK)
		return rc;
	if ((rc = finish(e, &q->req, LOOM_OK, LOOM_EV_RECV, mb, b->peer)) != LOOM_OK)
		return rc;
	memcpy(dst, q->buf, q->count * sizeof(float));
	pool_put(e, q->buf), q->buf = NULL;
	return LOOM_OK;
}

/* Wait for everything still in flight (after an error too: every request must be completed; the
 * first error's message is kept, as the waits after it may set their own). */
static int drain(pp_exec_t *e, int rc)
{
	char msg[1024];
	int rc0 = rc;
	if (rc0 != LOOM_OK)
		snprintf(msg, sizeof msg, "%s", loom_errmsg());
	for (int c = 0; c < e->V && e->ch; c++) {
		chunk_t *ch = &e->ch[c];
		for (int k = 0; k < ch->arenas && ch->act_sends; k++)
			rc = finish(e, &ch->act_sends[k], rc, LOOM_EV_SEND, -1, next_rank(e));
		for (int k = 0; k < 2; k++)
			rc = finish(e, &ch->grad_sends[k], rc, LOOM_EV_SEND, -1, prev_rank(e));
	}
	for (int i = 0; i < e->ninbox; i++)
		for (int j = 0; j < e->inbox[i].posted; j++) {
			msg_t *q = &e->inbox[i].q[j];
			rc = finish(e, &q->req, rc, LOOM_EV_RECV, -1, e->inbox[i].peer);
			pool_put(e, q->buf), q->buf = NULL;
		}
	if (rc0 != LOOM_OK)
		loom_seterr(rc0, "%s", msg);
	return rc;
}

/* The messages this rank receives from neighbour `peer`, in the order the peer's plan sends them. */
static int build_inbox(pp_exec_t *e, int box, int peer)
{
	inbox_t *b = &e->inbox[box];
	int n = 2 * e->M * e->V;
	loom__pp_action_t *pl = loom__calloc((size_t)n, sizeof *pl);
	b->peer = peer;
	if (!pl || !(b->q = loom__calloc((size_t)n, sizeof *b->q))) {
		free(pl);
		return loom_seterr(LOOM_ENOMEM, "pipeline: out of memory");
	}
	if (loom__pp_plan_v(e->cfg.schedule, e->P, e->V, peer, e->M, pl) < 0) {
		free(pl);
		return loom_seterr(LOOM_EINVAL, "pipeline: %s", loom_errmsg());
	}
	for (int i = 0; i < n; i++) {
		int gp = pl[i].chunk * e->P + peer, to = pl[i].op == 'F' ? gp + 1 : gp - 1;
		if (to < 0 || to >= e->G || to % e->P != e->s)
			continue;
		msg_t *q = &b->q[b->n];
		q->kind = pl[i].op == 'F' ? 'A' : 'G', q->chunk = to / e->P, q->mb = pl[i].mb;
		size_t off;
		edge(e, q->kind == 'A' ? to - 1 : to, q->mb, &off, &q->count);
		e->msg_box[msg_key(e, q->kind, q->chunk, q->mb)] = box;
		e->msg_j[msg_key(e, q->kind, q->chunk, q->mb)] = b->n++;
	}
	free(pl);
	return LOOM_OK;
}

static int pp_create(loom_exec_t **out, const loom_exec_config_t *cfg)
{
	pp_exec_t *e = loom__calloc(1, sizeof *e);
	loom_model_opts_t o;
	loom_model_t **models = NULL;
	int rc, *lo = NULL;
	*out = NULL;
	if (!e)
		return loom_seterr(LOOM_ENOMEM, "pipeline: out of memory");
	e->base.ops = loom__exec_pipeline();
	e->cfg = *cfg;
	e->mc = *loom_model_get_config(cfg->model);
	e->P = loom_comm_size(cfg->pp), e->s = loom_comm_rank(cfg->pp), e->M = cfg->M;
	e->V = cfg->V < 1 ? 1 : cfg->V, e->G = e->P * e->V;
	e->tp_size = loom_model_tp_size(cfg->model), e->tp_rank = loom_model_tp_rank(cfg->model);
	e->sp = e->tp_size > 1 && loom_model_sequence_parallel(cfg->model);
	if (e->tp_size != (cfg->tp ? loom_comm_size(cfg->tp) : 1)) {
		rc = loom_seterr(LOOM_EINVAL, "pipeline stage %d: the model is tensor-parallel shard %d of %d, but the "
		                 "tensor-parallel axis has %d rank(s)", e->s, e->tp_rank, e->tp_size,
		                 cfg->tp ? loom_comm_size(cfg->tp) : 1);
		goto fail;
	}
	if ((rc = loom__pp_check(cfg->schedule, e->P, e->V, e->M)) != LOOM_OK)
		goto fail;
	e->nparams = loom_model_param_count(cfg->model);
	e->full = loom_model_tensors(cfg->model, &e->nfull);
	e->width = loom_model_stream_width(&e->mc);
	e->act = (size_t)cfg->B * cfg->T * e->width;
	e->nplan = 2 * e->M * e->V;
	if (!(lo = loom__malloc(sizeof(int) * (size_t)(e->G + 1))) || !(e->ch = loom__calloc((size_t)e->V, sizeof *e->ch)) ||
	    !(models = loom__calloc((size_t)e->V, sizeof *models))) {
		rc = loom_seterr(LOOM_ENOMEM, "pipeline: out of memory");
		goto fail;
	}
	/* The G global stages (a head-alone last one shares its positions with global stage G-2, which
	 * with V > 1 is rank P-2's last chunk). */
	if ((rc = loom_pp_stages(&e->mc, cfg->B, cfg->T, e->G, cfg->head_split, lo, &e->hrows)) != LOOM_OK)
		goto fail;
	if (!(e->rows = loom__calloc((size_t)e->M, sizeof *e->rows))) {
		rc = loom_seterr(LOOM_ENOMEM, "pipeline: out of memory");
		goto fail;
	}
	if ((rc = loom__pp_head_rows(&e->mc, cfg->schedule, cfg->T, cfg->B * cfg->T, e->P, e->V, e->M, lo, e->hrows,
	                             cfg->head_split == 0.0, e->rows)) != LOOM_OK)
		goto fail;
	e->plan = loom__calloc((size_t)e->nplan, sizeof *e->plan);
	e->counts = loom__calloc((size_t)e->G, sizeof *e->counts);
	e->used = loom__calloc((size_t)e->nfull, 1);
	e->rev = loom__calloc((size_t)e->nfull, sizeof *e->rev);
	e->inputs = loom__malloc(sizeof(int) * (size_t)e->M * cfg->B * cfg->T);
	e->targets = loom__malloc(sizeof(int) * (size_t)e->M * cfg->B * cfg->T);
	e->losses = loom__calloc((size_t)e->M, sizeof *e->losses);
	e->times = loom__calloc((2 + 3 * (size_t)e->V) * (size_t)e->P + 3 * (size_t)e->G * e->M, sizeof *e->times);
	e->msg_box = loom__calloc(2 * (size_t)e->V * e->M, sizeof *e->msg_box);
	e->msg_j = loom__calloc(2 * (size_t)e->V * e->M, sizeof *e->msg_j);
	if (!e->plan || !e->counts || !e->used || !e->rev || !e->inputs || !e->targets || !e->losses || !e->times ||
	    !e->msg_box || !e->msg_j) {
		rc = loom_seterr(LOOM_ENOMEM, "pipeline: out of memory");
		goto fail;
	}
	if (loom__pp_plan_v(cfg->schedule, e->P, e->V, e->s, e->M, e->plan) < 0) {
		rc = LOOM_EINVAL;
		goto fail;
	}
	{ /* each chunk's arenas: its micro-batches in flight at once (consecutive ones) */
		int arenas[e->V];
		if (e->V == 1)
			arenas[0] = loom__pp_plan(cfg->schedule, e->P, e->s, e->M, e->plan);
		else if ((rc = loom__pp_chunk_arenas(cfg->schedule, e->P, e->V, e->s, e->M, arenas)) < 0)
			goto fail;
		for (int c = 0; c < e->V; c++) {
			chunk_t *ch = &e->ch[c];
			ch->g = c * e->P + e->s, ch->lo = lo[ch->g], ch->hi = lo[ch->g + 1], ch->arenas = LOOM_MAX(arenas[c], 1);
			ch->head = ch->g == e->G - 1 || (e->hrows && ch->g == e->G - 2);
			e->head |= ch->head;
			ch->act_sends = loom__calloc((size_t)ch->arenas, sizeof *ch->act_sends);
			ch->used = loom__calloc((size_t)e->nfull, 1);
			ch->grad_sbuf[0] = loom__malloc(sizeof(float) * LOOM_MAX(e->act, 1));
			ch->grad_sbuf[1] = loom__malloc(sizeof(float) * LOOM_MAX(e->act, 1));
			if (!ch->act_sends || !ch->used || !ch->grad_sbuf[0] || !ch->grad_sbuf[1]) {
				rc = loom_seterr(LOOM_ENOMEM, "pipeline: out of memory");
				goto fail;
			}
		}
	}
	/* Which tensors each global stage owns: its blocks' (tensor table `layer`), the embedding unit's
	 * on the first, the head's on the last; they are contiguous and tile the buffer in stage order. A
	 * tensor the head also reads (head_reads: GPT-2's tied wte) is used by the head stages too but
	 * owned by the first; one every block reads (all_blocks: nanochat's per-layer scalars) by every
	 * stage that holds a block; with the head's positions split, stage G-2 uses the head's tensors too.
	 * A chunk holds the tensors its stage uses; the rank those of its chunks. */
	for (int t = 0; t < e->nfull; t++) {
		const loom_tensor_info_t ti = e->full[t];
		int u = ti.layer, owner = u < 0 ? 0 : u >= e->mc.n_layer ? e->G - 1 : 0;
		for (int q = 0; q < e->G && u >= 0 && u < e->mc.n_layer; q++)
			if (u >= lo[q] && u < lo[q + 1])
				owner = q;
		e->counts[owner] += ti.numel;
		for (int c = 0; c < e->V; c++) {
			chunk_t *ch = &e->ch[c];
			ch->used[t] = owner == ch->g || (ti.head_reads && ch->head) || (ch->head && u >= e->mc.n_layer) ||
			              (ti.all_blocks && ch->lo < ch->hi);
			e->used[t] |= ch->used[t];
		}
		e->shared_blocks |= ti.all_blocks;
		if (!e->used[t] && (ti.all_blocks || ti.layer >= e->mc.n_layer)) /* summed here as zeros */
			e->zmax = LOOM_MAX(e->zmax, ti.numel);
	}
	/* The chunks' stage models: their layers, arenas, and only the tensors they use, packed into
	 * buffers of their own (opts.keep); with V > 1 the strategy's model is their join, whose buffers
	 * they then view. Their values are copied from the caller's model. */
	for (int c = 0; c < e->V; c++) {
		memset(&o, 0, sizeof o);
		o.B = cfg->B, o.T = cfg->T, o.arenas = e->ch[c].arenas, o.keep = e->ch[c].used;
		o.layer_lo = e->ch[c].lo, o.layer_hi = e->ch[c].hi;
		o.act_ckpt = loom_model_act_ckpt(cfg->model); /* the caller's checkpointing, per arena of the stage */
		o.dtype = loom_model_dtype(cfg->model); /* the stage computes in the whole model's precision */
		o.tp_size = e->tp_size, o.tp_rank = e->tp_rank;
		o.sequence_parallel = loom_model_sequence_parallel(cfg->model);
		/* context parallel: the stage holds the caller's rows of each sequence (cfg->T of them); the
		 * trainer gives the stage models the group's hook */
		o.cp_size = loom_model_cp_size(cfg->model), o.cp_rank = loom_model_cp_rank(cfg->model);
		o.no_own_params = o.no_own_grads = e->V > 1; /* the join's buffers */
		if ((rc = loom_model_create(&models[c], &e->mc, &o)) != LOOM_OK)
			goto fail;
		e->ch[c].m = models[c];
	}
	if (e->V == 1) {
		e->model = models[0];
	} else if ((rc = loom__model_join(&e->model, models, e->V)) != LOOM_OK) {
		goto fail;
	}
	free(models), models = NULL; /* owned by e->model from here on */
	e->tensors = loom_model_tensors(e->model, &e->ntensors);
	e->idx = loom__calloc((size_t)LOOM_MAX(e->ntensors, 1), sizeof *e->idx);
	e->own_g = loom__calloc((size_t)LOOM_MAX(e->ntensors, 1), sizeof *e->own_g);
	e->skip = loom__calloc((size_t)LOOM_MAX(e->ntensors, 1), 1);
	e->shared = loom__calloc((size_t)LOOM_MAX(e->ntensors, 1), 1);
	e->zeros = e->zmax ? loom__calloc(e->zmax, sizeof(float)) : NULL;
	if (!e->idx || !e->own_g || !e->skip || !e->shared || (e->zmax && !e->zeros)) {
		rc = loom_seterr(LOOM_ENOMEM, "pipeline: out of memory");
		goto fail;
	}
	const float *init = loom_model_params(cfg->model); /* NULL: the stages initialize their own */
	for (int t = 0, k = 0; t < e->nfull; t++) {
		e->rev[t] = e->used[t] ? k : -1;
		if (!e->used[t])
			continue;
		e->idx[k] = t;
		if (init)
			memcpy(loom_model_tensor_param(e->model, k), init + e->full[t].offset, e->full[t].numel * sizeof(float));
		k++;
	}
	if (!init)
		loom_model_init(e->model, cfg->seed);
	{ /* the tensors each global stage owns: a contiguous run of the caller's buffer, counts[g] floats */
		size_t off = 0;
		for (int g = 0; g < e->G; g++) {
			size_t end = off + e->counts[g];
			for (int k = 0; g % e->P == e->s && k < e->ntensors; k++)
				if (e->full[e->idx[k]].offset >= off && e->full[e->idx[k]].offset < end)
					e->own_g[k] = g + 1; /* (+1: 0 is none, made -1 below) */
			off = end;
		}
		for (int k = 0; k < e->ntensors; k++) {
			const loom_tensor_info_t *ti = &e->full[e->idx[k]];
			e->own_g[k]--;
			e->skip[k] = e->own_g[k] < 0;
			e->shared[k] = ti->head_reads || ti->all_blocks || (e->hrows && ti->layer >= e->mc.n_layer);
		}
	}
	/* The receives, in each neighbour's sending order. */
	e->ninbox = e->P == 2 ? 1 : 2;
	if ((rc = build_inbox(e, 0, prev_rank(e))) != LOOM_OK ||
	    (e->ninbox == 2 && (rc = build_inbox(e, 1, next_rank(e))) != LOOM_OK))
		goto fail;
	/* The ranks holding wte (first, last, and G-2's when it runs head rows) sum its gradient (and
	 * ln_f's, when split): over the pipeline comm itself when they are all of it, else over a
	 * communicator of them (collective over the pipeline axis). */
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
	free(lo);
	*out = &e->base;
	return LOOM_OK;
fail:
	for (int c = 0; models && c < e->V; c++) /* not joined yet: still ours */
		loom_model_destroy(models[c]);
	free(models);
	free(lo);
	pp_destroy(&e->base);
	return rc;
}

static void pp_destroy(loom_exec_t *ex)
{
	pp_exec_t *e = (pp_exec_t *)ex;
	if (!e)
		return;
	drain(e, LOOM_OK);
	if (e->own_ends)
		loom_comm_destroy(e->ends);
	loom_model_destroy(e->model); /* the chunks' models with it */
	for (int c = 0; e->ch && c < e->V; c++) {
		free(e->ch[c].act_sends), free(e->ch[c].used);
		free(e->ch[c].grad_sbuf[0]), free(e->ch[c].grad_sbuf[1]);
	}
	for (int i = 0; i < 2; i++)
		free(e->inbox[i].q);
	for (int i = 0; i < e->npool; i++)
		free(e->pool[i]);
	free(e->pool), free(e->ch), free(e->msg_box), free(e->msg_j);
	free(e->idx), free(e->rev), free(e->own_g), free(e->skip), free(e->shared), free(e->zeros);
	free(e->plan), free(e->counts), free(e->used), free(e->inputs), free(e->targets), free(e->losses), free(e->rows);
	free(e->times);
	free(e);
}

static loom_model_t *pp_model(loom_exec_t *e)
{
	return ((pp_exec_t *)e)->model;
}

static void pp_flags(loom_exec_t *ex, const unsigned char **norm_skip, const unsigned char **deferred)
{
	pp_exec_t *e = (pp_exec_t *)ex;
	*norm_skip = e->skip, *deferred = e->shared;
}

/* The gradient of the caller's tensor t on this rank, or zeros when the rank does not hold it (it
 * still takes part in the sums over the ranks that do). */
static float *grad_or_zeros(pp_exec_t *e, int t)
{
	if (e->rev[t] >= 0)
		return loom_model_tensor_grad(e->model, e->rev[t]);
	memset(e->zeros, 0, e->full[t].numel * sizeof(float));
	return e->zeros;
}

/* A unit's forward or backward on chunk c ran from t0 to now. */
static void event(pp_exec_t *e, int c, loom__event_kind_t kind, int mb, int unit, double t0)
{
	double t1 = loom_now();
	if (kind == LOOM_EV_FORWARD || kind == LOOM_EV_BACKWARD) {
		e->ch[c].busy[kind == LOOM_EV_FORWARD ? 0 : unit == -3 && e->ch[c].g < e->G - 1 ? 1 : 2] += t1 - t0;
		if (e->first_t == 0.0)
			e->first_t = t0;
		e->last_t = t1;
	}
	if (e->cfg.on_event)
		e->cfg.on_event(e->cfg.event_ctx, kind, mb, unit, t0, t1);
}

/* The measured bubble: each rank's idle share of the common span of the schedule (the ranks of a job
 * share one machine's monotonic clock, or clocks close enough for a fraction of a step), and the
 * bubble the schedule should have with these global stages' measured forward and backward times. */
static int measure_bubble(pp_exec_t *e, double *bubble, double *expected)
{
	int P = e->P, V = e->V, G = e->G, w = 2 + 3 * V;
	double mine[w], lo = 1e300, hi = -1e300, idle = 0.0, *t = e->times;
	mine[0] = e->first_t, mine[1] = e->last_t;
	for (int c = 0; c < V; c++)
		for (int j = 0; j < 3; j++)
			mine[2 + 3 * c + j] = e->ch[c].busy[j];
	int rc = loom_allgather(e->cfg.pp, mine, t, (size_t)w, LOOM_FLOAT64);
	if (rc != LOOM_OK)
		return loom_seterr(rc, "pipeline stage %d of %d: gathering the stages' timings: %s", e->s, e->P,
		                   loom_comm_errmsg(e->cfg.pp));
	for (int q = 0; q < P; q++)
		lo = LOOM_MIN(lo, t[w * q]), hi = LOOM_MAX(hi, t[w * q + 1]);
	for (int q = 0; q < P && hi > lo; q++) {
		double busy = 0.0;
		for (int j = 2; j < w; j++)
			busy += t[w * q + j];
		idle += 1.0 - busy / (hi - lo);
	}
	*bubble = idle / P;
	/* Per micro-batch: each global stage's mean forward and backward; the head's share of stage G-2
	 * and the last stage's backward (the head alone) per row, times each micro-batch's rows. */
	double *fhb = t + w * P, span, rows = 0.0;
	size_t GM = (size_t)G * e->M;
	for (int m = 0; m < e->M; m++)
		rows += e->hrows ? e->rows[m] : 0;
	for (int g = 0; g < G; g++) {
		const double *b = t + w * (g % P) + 2 + 3 * (g / P);
		for (int m = 0; m < e->M; m++) {
			size_t k = (size_t)g * e->M + (size_t)m;
			fhb[k] = b[0] / e->M, fhb[GM + k] = b[1] / e->M, fhb[2 * GM + k] = b[2] / e->M;
			if (e->hrows && g == G - 2 && rows > 0)
				fhb[GM + k] = b[1] * e->rows[m] / rows;
			if (e->hrows && g == G - 1) /* the head alone */
				fhb[2 * GM + k] = b[2] * (e->cfg.B * e->cfg.T - e->rows[m]) /
				                  ((double)e->M * e->cfg.B * e->cfg.T - rows);
		}
	}
	if (loom__pp_simulate_v(e->cfg.schedule, P, V, e->M, fhb, fhb + GM, fhb + 2 * GM, &span, expected) != LOOM_OK)
		*expected = -1.0;
	return LOOM_OK;
}

/* The forward of micro-batch mb on chunk c, into arena mb % arenas of its stage model. */
static int forward(pp_exec_t *e, int c, int mb)
{
	const loom_exec_config_t *cf = &e->cfg;
	chunk_t *ch = &e->ch[c];
	size_t bt = (size_t)cf->B * cf->T, off, n;
	int a = mb % ch->arenas, rc = LOOM_OK;
	double t0;
	/* The arena's previous output may still be on its way to the next stage. */
	if ((rc = finish(e, &ch->act_sends[a], rc, LOOM_EV_SEND, mb - ch->arenas, next_rank(e))) != LOOM_OK)
		return rc;
	if (ch->g == 0) {
		t0 = loom_now();
		if ((rc = loom_model_embed_forward(ch->m, a, e->inputs + mb * bt, cf->B, cf->T)) != LOOM_OK)
			return rc;
		event(e, c, LOOM_EV_FORWARD, mb, -1, t0);
	} else {
		/* blocks that read the tokens (nanochat's value embeddings) get them here */
		if ((rc = loom_model_set_inputs(ch->m, a, e->inputs + mb * bt, cf->B, cf->T)) != LOOM_OK)
			return rc;
		edge(e, ch->g - 1, mb, &off, &n);
		if ((rc = receive(e, 'A', c, mb, loom_model_block_input(ch->m, a, ch->lo) + off)) != LOOM_OK)
			return rc;
	}
	for (int l = ch->lo; l < ch->hi; l++) {
		t0 = loom_now();
		if ((rc = loom_model_block_forward(ch->m, a, l, cf->B, cf->T)) != LOOM_OK)
			return rc;
		event(e, c, LOOM_EV_FORWARD, mb, l, t0);
	}
	if (ch->g == e->G - 1)
		return LOOM_OK;
	edge(e, ch->g, mb, &off, &n);
	e->sent += n * sizeof(float);
	return loom_isend(cf->pp, loom_model_block_input(ch->m, a, ch->hi) + off, n, LOOM_FLOAT32, next_rank(e),
	                  TAG_ACT + 2 * ((ch->g + 1) / e->P), &ch->act_sends[a]);
}

/* The backward of micro-batch mb on chunk c (the head's forward and backward first on the head's). */
static int backward(pp_exec_t *e, loom_strategy_t *st, int c, int mb)
{
	const loom_exec_config_t *cf = &e->cfg;
	chunk_t *ch = &e->ch[c];
	size_t bt = (size_t)cf->B * cf->T, off, n;
	int a = mb % ch->arenas, rc = LOOM_OK, k = mb % 2;
	float *dstream = loom_model_stream_grad(ch->m);
	double t0;
	/* Data-parallel gradient sync on each chunk's last backward only (as the local loop does). */
	st->ops->set_sync(st, mb == e->M - 1);
	/* The head's positions: all of them on the last stage, or [rows, B T) there and [0, rows) on stage
	 * G-2, which runs them first (from its own activations) and then takes the others' gradient. */
	if (ch->head) {
		int last = ch->g == e->G - 1, r = e->rows[mb], r0 = last ? r : 0, n = last ? (int)bt - r : r;
		t0 = loom_now();
		if ((rc = loom_model_head_forward_backward_rows(ch->m, a, e->targets + mb * bt, cf->B, cf->T, r0, n,
		                                               1.0f / (float)e->M, &e->losses[mb])) != LOOM_OK)
			return rc;
		event(e, c, LOOM_EV_BACKWARD, mb, -3, t0); /* the head: its forward and backward */
	}
	edge(e, ch->g, mb, &off, &n);
	if (ch->g < e->G - 1 && (rc = receive(e, 'G', c, mb, dstream + off)) != LOOM_OK)
		return rc;
	for (int l = ch->hi - 1; l >= ch->lo; l--) {
		t0 = loom_now();
		if ((rc = loom_model_block_backward(ch->m, a, l, cf->B, cf->T)) != LOOM_OK)
			return rc;
		event(e, c, LOOM_EV_BACKWARD, mb, l, t0);
	}
	if (ch->g == 0) {
		t0 = loom_now();
		if ((rc = loom_model_embed_backward(ch->m, a, e->inputs + mb * bt, cf->B, cf->T)) != LOOM_OK)
			return rc;
		event(e, c, LOOM_EV_BACKWARD, mb, -1, t0);
	} else {
		if ((rc = finish(e, &ch->grad_sends[k], rc, LOOM_EV_SEND, mb - 2, prev_rank(e))) != LOOM_OK)
			return rc;
		edge(e, ch->g - 1, mb, &off, &n);
		memcpy(ch->grad_sbuf[k], dstream + off, n * sizeof(float));
		e->sent += n * sizeof(float);
		if ((rc = loom_isend(cf->pp, ch->grad_sbuf[k], n, LOOM_FLOAT32, prev_rank(e),
		                     TAG_GRAD + 2 * ((ch->g - 1) / e->P), &ch->grad_sends[k])) != LOOM_OK)
			return rc;
	}
	return LOOM_OK;
}

/* The gradients of the tensors several stages hold, summed over them: the tied wte (the embedding's
 * share on the first stage plus the lm head's on the head stages), nanochat's per-layer scalars
 * (every stage's), a shared head's tensors (stage G-2's and the last's). Collective over the pipeline. */
static int sum_shared(pp_exec_t *e)
{
	const loom_exec_config_t *c = &e->cfg;
	int rc = LOOM_OK;
	for (int t = 0; e->ends && (e->s == 0 || e->head) && t < e->ntensors; t++) {
		if (!e->tensors[t].head_reads)
			continue;
		float *g = loom_model_tensor_grad(e->model, t);
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
	e->wait_ms = 0.0, e->inflight = 0, e->first_t = e->last_t = 0.0, e->sent = 0;
	for (int k = 0; k < e->V; k++)
		e->ch[k].busy[0] = e->ch[k].busy[1] = e->ch[k].busy[2] = 0.0;
	loom_model_zero_grad(e->model);
	/* Every stage reads every micro-batch (the loaders stay in step); the first uses the inputs, the
	 * last the targets. */
	for (int j = 0; j < e->M; j++)
		if ((rc = get(ctx, j, e->inputs + j * bt, e->targets + j * bt)) != LOOM_OK)
			return rc;
	/* Each neighbour's first message is received ahead; receive() keeps one more posted. */
	for (int i = 0; i < e->ninbox; i++) {
		e->inbox[i].posted = 0;
		if ((rc = post_upto(e, &e->inbox[i], 0)) != LOOM_OK)
			goto out;
	}
	for (int i = 0; i < e->nplan; i++) {
		const loom__pp_action_t *p = &e->plan[i];
		if (p->op == 'F') {
			if ((rc = forward(e, p->chunk, p->mb)) != LOOM_OK)
				goto out;
			e->inflight++;
			st->max_inflight = LOOM_MAX(st->max_inflight, e->inflight);
		} else {
			if ((rc = backward(e, s, p->chunk, p->mb)) != LOOM_OK)
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
	int sharded = s->own_count < loom_model_param_count(e->model);
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
	if (e->cfg.on_event)
		e->cfg.on_event(e->cfg.event_ctx, LOOM_EV_ALLREDUCE, -1, -2, t0, loom_now());
	double ta = 1e3 * (loom_now() - t0 + tsum);
	st->comm_ms += ta, st->exposed_comm_ms += ta;
out:
	rc = drain(e, rc);
	st->p2p_wait_ms = e->wait_ms, st->p2p_bytes = e->sent;
	return rc;
}

/* Evaluation through the stages, forward only: every window's activations go through the global
 * stages in order (chunk c of rank s is global stage c P + s), in arena 0 of each chunk's stage model,
 * all positions (a shared head is not split: the last stage computes the loss of every position; with
 * sequence parallelism each tp rank's rows, as in training: edge); sends
 * complete before the rank goes on, so its transfers follow its loop of (window, chunk), the same on
 * every rank, and no message crosses another. The last stage's losses reach every rank of the
 * pipeline in one sum (the others add 0). */
static int pp_eval(loom_exec_t *ex, loom_strategy_t *s, loom__batch_fn get, void *ctx, int n, float *losses)
{
	pp_exec_t *e = (pp_exec_t *)ex;
	const loom_exec_config_t *cf = &e->cfg;
	int rc = LOOM_OK;
	(void)s;
	for (int j = 0; j < n; j++) {
		losses[j] = 0.0f;
		if ((rc = get(ctx, j, e->inputs, e->targets)) != LOOM_OK)
			return rc;
		for (int c = 0; c < e->V; c++) {
			chunk_t *ch = &e->ch[c];
			size_t off, cnt;
			edge(e, ch->g - 1, -1, &off, &cnt);
			if (ch->g == 0)
				rc = loom_model_embed_forward(ch->m, 0, e->inputs, cf->B, cf->T);
			else if ((rc = loom_model_set_inputs(ch->m, 0, e->inputs, cf->B, cf->T)) == LOOM_OK &&
			         (rc = loom_recv(cf->pp, loom_model_block_input(ch->m, 0, ch->lo) + off, cnt, LOOM_FLOAT32,
			                         prev_rank(e), TAG_EVAL + c)) != LOOM_OK)
				rc = loom_seterr(rc, "pipeline stage %d of %d: evaluation window %d: receiving from stage %d: %s",
				                 e->s, e->P, j, prev_rank(e), loom_comm_errmsg(cf->pp));
			for (int l = ch->lo; rc == LOOM_OK && l < ch->hi; l++)
				rc = loom_model_block_forward(ch->m, 0, l, cf->B, cf->T);
			if (rc != LOOM_OK)
				return rc;
			if (ch->g == e->G - 1) {
				if ((rc = loom_model_head_forward(ch->m, 0, e->targets, cf->B, cf->T, &losses[j])) != LOOM_OK)
					return rc;
				continue;
			}
			edge(e, ch->g, -1, &off, &cnt);
			if ((rc = loom_send(cf->pp, loom_model_block_input(ch->m, 0, ch->hi) + off, cnt, LOOM_FLOAT32,
			                    next_rank(e), TAG_EVAL + (ch->g + 1) / e->P)) != LOOM_OK)
				return loom_seterr(rc, "pipeline stage %d of %d: evaluation window %d: sending to stage %d: %s", e->s,
				                   e->P, j, next_rank(e), loom_comm_errmsg(cf->pp));
		}
	}
	if (n > 0 && (rc = loom_allreduce(cf->pp, losses, losses, (size_t)n, LOOM_FLOAT32, LOOM_SUM)) != LOOM_OK)
		return loom_seterr(rc, "pipeline stage %d of %d: the evaluation losses from the last stage: %s", e->s, e->P,
		                   loom_comm_errmsg(cf->pp));
	return LOOM_OK;
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

/* The rank of the pipeline owning caller's tensor t: the one running the global stage whose run of
 * the caller's layout holds it (the runs tile the layout in global-stage order). */
static int owner_rank(const pp_exec_t *e, int t)
{
	size_t off = 0, at = e->full[t].offset;
	for (int g = 0; g < e->G; g++) {
		if (at < off + e->counts[g])
			return g % e->P;
		off += e->counts[g];
	}
	return 0;
}

/* A checkpoint's tensors as the first stage takes them: its own stage state, or one tensor received
 * from the stage owning it. */
typedef struct {
	pp_exec_t *e;
	float *loc[3]; /* this rank's stage state: parameters, m, v (the strategy model's packed layout) */
	float *bounce; /* one tensor received */
} stream_t;

/* This rank's (tp shard of the) caller's tensor t of state `which`, as loom__tp_write_stream asks for
 * them in file order: from loc when this rank owns it, else received from its owner, which sends its
 * tensors in that order (stream_save). */
static int stage_tensor(void *ctx, int which, int t, const float **data)
{
	stream_t *st = ctx;
	pp_exec_t *e = st->e;
	int q = owner_rank(e, t), rc;
	if (q == 0) {
		*data = st->loc[which] + e->tensors[e->rev[t]].offset;
		return LOOM_OK;
	}
	if ((rc = loom_recv(e->cfg.pp, st->bounce, e->full[t].numel, LOOM_FLOAT32, q, TAG_SAVE + which)) != LOOM_OK)
		return loom_seterr(rc, "pipeline stage 0: receiving %s of %s from stage %d for a checkpoint: %s",
		                   which == 0 ? "the parameters" : "the AdamW moments", e->full[t].name, q,
		                   loom_comm_errmsg(e->cfg.pp));
	*data = st->bounce;
	return LOOM_OK;
}

/* A checkpoint as one process's, streamed: the first stage of data-parallel rank 0's pipeline writes
 * model.safetensors and optim.safetensors tensor by tensor in file order through
 * loom__tp_write_stream (its tp group, of one rank without tensor parallelism, unsharding as it
 * writes), each tensor from its own state or received from the stage owning it, which sends its
 * tensors in that order; no rank holds more than its stage's state and a tensor. Collective over the
 * pipeline (dp rank 0's) once every rank has its stage's state (loc). */
static int stream_save(pp_exec_t *e, float *const loc[3], const loom_ckpt_writer_t *w)
{
	stream_t st = {.e = e, .loc = {loc[0], loc[1], loc[2]}};
	loom__tp_group_t g;
	int rc = LOOM_OK;
	if (e->s != 0) { /* an owner: its tensors, in the writers' order */
		for (int kind = 0; kind < 2 && rc == LOOM_OK; kind++)
			for (int i = 0; i < loom__ckpt_count(e->nfull, kind) && rc == LOOM_OK; i++) {
				int t, which;
				loom__ckpt_item(e->nfull, kind, i, &t, &which);
				if (owner_rank(e, t) != e->s)
					continue;
				rc = loom_send(e->cfg.pp, loc[which] + e->tensors[e->rev[t]].offset, e->full[t].numel, LOOM_FLOAT32,
				               0, TAG_SAVE + which);
				if (rc != LOOM_OK)
					rc = loom_seterr(rc, "pipeline stage %d: sending %s for a checkpoint to stage 0: %s", e->s,
					                 e->full[t].name, loom_comm_errmsg(e->cfg.pp));
			}
		return rc;
	}
	size_t most = 1; /* the largest tensor another stage owns */
	for (int t = 0; t < e->nfull; t++)
		if (owner_rank(e, t) != 0)
			most = LOOM_MAX(most, e->full[t].numel);
	if (!(st.bounce = loom_alloc_aligned(most * sizeof(float))))
		return loom_seterr(LOOM_ENOMEM, "pipeline stage 0: out of memory for receiving a checkpoint's tensor");
	loom__tp_group_init(&g, e->cfg.tp);
	rc = loom__tp_write_stream(&g, &e->mc, stage_tensor, &st, w);
	loom_free_aligned(st.bounce);
	return rc;
}

/* A checkpoint as one process's, streamed from the stages' states (stream_save). */
static int pp_save(loom_exec_t *ex, loom_strategy_t *s, const loom_ckpt_writer_t *w)
{
	pp_exec_t *e = (pp_exec_t *)ex;
	int rc = LOOM_OK, bad;
	if (s->muon)
		return loom_seterr(LOOM_ENOTSUP, "pipeline stage %d: checkpoints of MuonAdamW under pipeline parallel are "
		                   "not written (its state is per rank)", e->s);
	/* the stage's state: the strategy's own buffers where it holds it whole (DDP), else gathered over
	 * dp (ZeRO: collective, every rank) into buffers of the call */
	size_t n = loom_model_param_count(e->model), bytes = LOOM_MAX(n, 1) * sizeof(float);
	float *view[3], *loc[3] = {NULL, NULL, NULL};
	int copy = loom__strategy_state_views(s, &view[0], &view[1], &view[2]) != LOOM_OK;
	if (copy) {
		for (int i = 0; i < 3; i++)
			if (!(loc[i] = loom_alloc_aligned(bytes)))
				rc = loom_seterr(LOOM_ENOMEM, "pipeline stage %d: out of memory for the stage's state", e->s);
		int erc = loom__strategy_export(s, loc[0], loc[1], loc[2]); /* collective over dp: every rank */
		rc = rc != LOOM_OK ? rc : erc;
	} else {
		for (int i = 0; i < 3; i++)
			loc[i] = view[i]; /* read only */
	}
	if (s->dp_rank == 0) { /* this pipeline writes; every rank of it agrees first */
		bad = rc != LOOM_OK;
		int arc = loom_allreduce(e->cfg.pp, &bad, &bad, 1, LOOM_INT32, LOOM_MAX);
		if (arc != LOOM_OK)
			rc = loom_seterr(arc, "pipeline stage %d of %d: agreeing on a checkpoint: %s", e->s, e->P,
			                 loom_comm_errmsg(e->cfg.pp));
		else if (bad && rc == LOOM_OK)
			rc = loom_seterr(LOOM_ENOMEM, "pipeline stage %d of %d: another stage could not gather its state "
			                 "for a checkpoint", e->s, e->P);
		else if (!bad)
			rc = stream_save(e, loc, w);
	}
	for (int i = 0; i < 3 && copy; i++)
		loom_free_aligned(loc[i]);
	return rc;
}

/* The tensors this rank holds of a checkpoint's whole state (tp 1) into p, m, v (the packed layout):
 * each run of them contiguous in the whole layout is contiguous there too, one range read each. */
static int read_held(pp_exec_t *e, const char *dir, float *p, float *m, float *v)
{
	int rc = LOOM_OK;
	for (int k = 0, k1; k < e->ntensors && rc == LOOM_OK; k = k1) {
		size_t from = e->full[e->idx[k]].offset, to = e->tensors[k].offset, cnt = e->tensors[k].numel;
		for (k1 = k + 1; k1 < e->ntensors && e->full[e->idx[k1]].offset == from + cnt; k1++)
			cnt += e->tensors[k1].numel;
		rc = loom__read_state_range(dir, &e->mc, from, cnt, p + to, m + to, v + to);
	}
	return rc;
}

/* Any checkpoint (any strategy, mesh or stage count wrote it): the tensors this rank holds (tp 1:
 * read_held, straight into the strategy's buffers where it holds the stage's state whole; with tensor
 * parallelism each held tensor's shard from its full tensor, loom__tp_read_tensors), and the strategy
 * its part of those. Not collective. */
static int pp_load(loom_exec_t *ex, loom_strategy_t *s, const char *dir, long long step)
{
	pp_exec_t *e = (pp_exec_t *)ex;
	size_t n = loom_model_param_count(e->model), bytes = LOOM_MAX(n, 1) * sizeof(float);
	float *lp = NULL, *lm = NULL, *lv = NULL, *view[3];
	int rc = LOOM_OK, direct;
	if (s->muon)
		return loom_seterr(LOOM_ENOTSUP, "pipeline stage %d: resuming MuonAdamW under pipeline parallel is not "
		                   "supported (its checkpoints are not written)", e->s);
	/* where the strategy holds the whole stage state (DDP), the ranges go straight into its buffers */
	direct = e->tp_size == 1 && loom__strategy_state_views(s, &view[0], &view[1], &view[2]) == LOOM_OK;
	if (direct)
		return (rc = read_held(e, dir, view[0], view[1], view[2])) != LOOM_OK
		           ? rc : loom__strategy_import(s, NULL, NULL, NULL, step);
	lp = loom_alloc_aligned(bytes), lm = loom_alloc_aligned(bytes), lv = loom_alloc_aligned(bytes);
	if (!lp || !lm || !lv) {
		rc = loom_seterr(LOOM_ENOMEM, "pipeline stage %d: out of memory to read a checkpoint", e->s);
		goto out;
	}
	if (e->tp_size > 1) { /* each held tensor's shard, from its full tensor */
		loom__tp_group_t g;
		loom__tp_group_init(&g, e->cfg.tp);
		if ((rc = loom__tp_read_tensors(&g, dir, &e->mc, e->ntensors, e->idx, e->tensors, lp, lm, lv)) != LOOM_OK)
			goto out;
	} else if ((rc = read_held(e, dir, lp, lm, lv)) != LOOM_OK) {
		goto out;
	}
	rc = loom__strategy_import(s, lp, lm, lv, step);
out:
	loom_free_aligned(lp), loom_free_aligned(lm), loom_free_aligned(lv);
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
	.eval = pp_eval,
	.save = pp_save,
	.load = pp_load,
};

const loom_exec_ops_t *loom__exec_pipeline(void)
{
	return &pp_ops;
}
