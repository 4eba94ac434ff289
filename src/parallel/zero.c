/* zero.c: the ZeRO strategies (src/parallel/strategy.h): the AdamW state (stage 1), also the gradients
 * (stage 2), also the parameters (stage 3, fully sharded data parallel) are sharded over the
 * data-parallel ranks.
 *
 * The owned-range rule. Rank q of N owns the floats [off(q), off(q+1)) of the flat parameter buffer,
 * off(q) = floor(q P / N) rounded down to a multiple of 16 floats (64 bytes: no two ranks share a
 * cache line), off(N) = P. Ranges are contiguous and in rank order, so the part of any contiguous
 * range [a, b) that each rank owns is again contiguous and in rank order: a bucket's reduce-scatter is
 * one loom_ireduce_scatterv over [a, b) whose counts are the overlaps with the ranks' ranges (zero for
 * most ranks when buckets are small), and its result lands, in place, on the slice of the rank's
 * shard that the bucket covers; the all-gather of the updated parameters is the same layout run
 * backwards (loom_iallgatherv). Uneven parts need no padding.
 *
 * Buckets are the model's units (loom/model.h; their tensors are contiguous, loom_model_unit_tensors):
 * the embedding (GPT-2: wte, wpe; nanochat: wte and the per-layer scalars), each block, the head:
 * FSDP's wrapping of one block per unit. A unit's gradient is final when its last tensor is reported
 * (grad-ready hook); the embedding's only at the end of backward, because other units read its
 * tensors too (GPT-2's tied lm head adds to wte's gradient, nanochat's blocks to the scalars').
 *
 * Stage 1 keeps a full gradient buffer (in shared memory, the model's gradient view points at it, as
 * DDP's); on the last micro-step each unit is reduce-scattered (averaged) as soon as backward
 * finishes it, earlier micro-steps accumulate locally and communicate nothing. Stage 2 keeps only the
 * rank's gradient shard (own_count floats) and small staging buffers: the embedding's (used from the
 * head to the end of backward) and ZERO_SLOTS of the largest other unit, which the param-use hook
 * lends to a unit before its backward (pointing the unit's gradient views at it) and takes back once
 * its reduce-scatter completes, adding the result into the shard. So stage 2 reduce-scatters every
 * micro-step (as DeepSpeed's stage 2 does), accumulation happening on the shard.
 *
 * Stage 3 keeps only the rank's parameter shard. The param-use hook gathers a unit's parameters
 * (loom_iallgatherv from every rank's shard) into a transient buffer and points the unit's views at
 * it just before the unit runs, and starts gathering the next unit's (forward: the next block; backward:
 * the previous one) into the other of two block buffers, so at most two blocks are gathered at once
 * and the next one's gather overlaps this one's compute. Gathered contents stay valid until the
 * parameters change (the optimizer step), so backward reuses the last forward blocks still held. The
 * embedding has its own gathered buffer, kept for the whole micro-step, because the tied lm head reads
 * wte between the last block's forward and the first block's backward and the embedding's backward
 * comes last. Gradients go as at stage 2. Every forward issues collectives, so every rank must run the
 * same passes (the trainer's evaluation runs as many forwards on every rank; sampling on one rank
 * alone is not possible at stage 3).
 *
 * With --grad-reduce-dtype bf16 a unit's gradients are rounded (loom__grad_to_bf16, DDP's) into a bf16
 * staging buffer when it is launched and reduce-scattered as LOOM_BFLOAT16 (AVG); finish_unit widens
 * the received part back to fp32 where the fp32 reduce-scatter would have left it (stage 1: in place in
 * the full buffer; stages 2, 3: the fp32 staging's slice, then added into the shard as always). Stage 1
 * keeps one bf16 buffer over everything (g16: all units are in flight until finish_grads), stages 2
 * and 3 one beside each fp32 staging buffer (a unit holds both together). Parameters travel in fp32.
 *
 * After the reduce: the global gradient norm is the square root of the sum, over ranks, of the sum of
 * squares of each shard (one all-reduce of a double); AdamW updates the owned slice
 * (loom_adamw_init_model_range: bit-identical per element to one optimizer over everything); at
 * stages 1 and 2 each unit's parameters are then all-gathered, in unit order, and the next forward's
 * param-use hook waits for each unit's gather just before the unit runs, so later units' gathers
 * overlap earlier units' compute (sync, replica check and save wait for all of them first).
 *
 * Invariant (tests/test_zero.c's zero*_invariant_*): given the averaged gradient, the parameters after
 * every step (gathered from the shards at stage 3) are bit-identical to those one optimizer over the
 * whole buffer computes, the same bits on every rank, and each rank's moments are that optimizer's
 * slice of the owned range; the averaged gradient is DDP's up to the rounding of another summation
 * order, so the per-step losses equal DDP's within 1e-5 relative over 20 steps (zero_vs_ddp_*, at 2,
 * 3 and 4 ranks, with and without accumulation). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "loom/ddp.h"
#include "parallel/strategy.h"

#define ZERO_SLOTS 2 /* stages 2, 3: gradient staging buffers for units other than the embedding */
#define ZERO_PSLOTS 2 /* stage 3: gathered-parameter buffers for units other than the embedding */
#define ZERO_BUFS (5 + 2 * ZERO_SLOTS + ZERO_PSLOTS) /* every buffer buf_alloc may hand out */

typedef struct {
	int unit;               /* -1 embedding, 0..L-1 block, L head */
	int lo, hi;             /* tensors [lo, hi) */
	size_t offset, count;   /* floats of the flat buffer */
	size_t *counts;         /* dp_size entries: each rank's part of the unit */
	size_t mine;            /* offset in the unit of this rank's part (its displacement) */
	int ready;              /* tensors reported this micro-step */
	int reduced;            /* its reduce-scatter was launched since the last finish_grads */
	int deferred;           /* reduced at finish_grads only (its gradient is summed with other pipeline
	                           stages' before: strategy.h's deferred), accumulating every micro-step */
	float *own_stage;       /* stages 2, 3, a deferred unit other than the embedding: its staging */
	uint16_t *own_stage16;
	float *stage;           /* stage 2: the staging buffer lent to the unit, or NULL */
	uint16_t *stage16;      /* with a bf16 reduce: the unit's bf16 staging (its place in g16, or a slot's) */
	loom_request_t *req;    /* its reduce-scatter, or (gathering) the all-gather of its parameters, in flight */
	int gathering;          /* stages 1, 2: req is the all-gather after the step */
} unit_t;

typedef struct {
	loom_strategy_t base;   /* first: a loom_strategy_t * is a zero_t * */
	int stage;
	int nunits, ntensors;
	int *kof;               /* n_layer + 2: the index in units of unit u at kof[u + 1], or -1 (a pipeline
	                           stage's model holds some units only; units[0] is the embedding's, perhaps
	                           empty) */
	const loom_tensor_info_t *ti; /* the model's table (a tensor-parallel shard's with tp > 1) */
	loom__tp_group_t tpg;   /* the tensor-parallel group whose shard this is (size 1: none) */
	unit_t *units;          /* units[u + 1] is unit u */
	size_t *off;            /* dp_size + 1 range starts: off[q] .. off[q+1] is rank q's */
	float *model_grads;     /* stage 1: the model's own gradient buffer, the view's target again at destroy */
	float *grad_shard;      /* stage 2: own_count floats (owned) */
	float *emb_stage;       /* stage 2: the embedding's staging buffer (loom_comm_alloc or aligned) */
	float *slots[ZERO_SLOTS];
	int slot_user[ZERO_SLOTS]; /* the unit index (u + 1) holding each slot, or -1 */
	/* with --grad-reduce-dtype bf16: the bf16 staging the reduce-scatters send and receive in; stage 1
	 * one for the whole buffer (every unit's reduce is in flight until finish_grads), stages 2, 3 one
	 * beside each fp32 staging buffer (emb16 for emb_stage, slots16[k] for slots[k]) */
	int bf16;
	uint16_t *g16, *emb16, *slots16[ZERO_SLOTS];
	/* stage 3 */
	float *param_shard;     /* own_count floats (owned) */
	const float *init;      /* the model's whole parameter buffer at create, until sync_params or load */
	float *emb_gather;      /* the embedding's gathered parameters */
	int emb_valid;
	loom_request_t *emb_req;
	float *pslots[ZERO_PSLOTS];
	int pslot_unit[ZERO_PSLOTS]; /* unit index (u + 1) whose parameters the slot holds (or receives), or -1 */
	loom_request_t *pslot_req[ZERO_PSLOTS];
	/* The buffers that came from the shared heap (loom_comm_alloc); every other one is private memory
	 * (the heap had no room for it), and buf_free returns each to where it came from. */
	void *shared[ZERO_BUFS];
	int nshared, fell_back;
	int gathered_now, gathered_peak; /* block units gathered (or in flight) at once: now, and the most */
	unsigned long long gathers;      /* unit gathers issued */
	int sync, launched, err;
	double hook_wait_s;     /* waited for communication inside the hooks since the last finish_grads */
	loom_comm_stats_t at_launch;
} zero_t;

size_t loom__zero_shard_offset(size_t nparams, int rank, int size)
{
	if (rank >= size)
		return nparams;
	return (size_t)(((unsigned long long)nparams * (unsigned)rank / (unsigned)size) & ~15ull);
}

/* A buffer of `bytes` in the shared heap, or in private memory when the heap has no room for it (as
 * DDP's; collectives on it then copy instead of reading in place); the first fallback is logged. A
 * heap buffer is remembered in z->shared, so buf_free frees every buffer the way it was allocated:
 * the heap may fit some buffers and not others. NULL when neither has room. */
static void *buf_alloc_bytes(zero_t *z, size_t bytes)
{
	void *p = z->nshared < ZERO_BUFS ? loom_comm_alloc(z->base.dp, bytes) : NULL;
	if (p) {
		z->shared[z->nshared++] = p;
		return p;
	}
	if (!z->fell_back) {
		z->fell_back = 1;
		fprintf(stderr, "loom: note: rank %d: zero: the shared heap has no room for a buffer of %zu bytes "
		        "(raise LOOM_SHM_MB); it and any other that does not fit use private memory\n",
		        z->base.dp_rank, bytes);
		fflush(stderr);
	}
	return loom_alloc_aligned(bytes);
}

static float *buf_alloc(zero_t *z, size_t n)
{
	return buf_alloc_bytes(z, LOOM_MAX(n, 1) * sizeof(float));
}

static uint16_t *buf16_alloc(zero_t *z, size_t n)
{
	return buf_alloc_bytes(z, LOOM_MAX(n, 1) * sizeof(uint16_t));
}

static void buf_free(zero_t *z, void *p)
{
	if (!p)
		return;
	for (int k = 0; k < z->nshared; k++)
		if (z->shared[k] == p) {
			loom_comm_free(z->base.dp, p);
			z->shared[k] = z->shared[--z->nshared];
			return;
		}
	loom_free_aligned(p);
}

/* Wait for a request, counting the time as exposed communication of the micro-step. */
static int timed_wait(zero_t *z, loom_request_t *req)
{
	double t = loom_now();
	int rc = loom_wait(req);
	z->hook_wait_s += loom_now() - t;
	return rc;
}

/* A collective of this micro-step (or of the step before, for the all-gathers after it) begins: the
 * first one marks where its communication time starts. */
static void mark_launch(zero_t *z)
{
	if (z->launched == 0)
		loom_comm_stats(z->base.dp, &z->at_launch);
	z->launched++;
}

/* ---- stage 3: gathering parameters ------------------------------------------------------------ */

/* Start the gather of unit index k into dst. */
static int start_gather(zero_t *z, int k, float *dst, loom_request_t **req)
{
	loom_strategy_t *s = &z->base;
	unit_t *u = &z->units[k];
	const float *mine = z->param_shard + (u->offset + u->mine - s->own_offset);
	mark_launch(z);
	z->gathers++;
	int rc = loom_iallgatherv(s->dp, mine, u->counts[s->dp_rank], dst, u->counts, LOOM_FLOAT32, req);
	if (rc != LOOM_OK) {
		*req = NULL;
		return loom_seterr(rc, "zero: rank %d: starting the gather of unit %d's parameters: %s", s->dp_rank, u->unit,
		                   loom_comm_errmsg(s->dp));
	}
	return LOOM_OK;
}

static int wait_gather(zero_t *z, int k, loom_request_t **req)
{
	int rc = *req ? timed_wait(z, *req) : LOOM_OK;
	*req = NULL;
	if (rc != LOOM_OK)
		return loom_seterr(rc, "zero: rank %d: gathering unit %d's parameters: %s", z->base.dp_rank,
		                   z->units[k].unit, loom_comm_errmsg(z->base.dp));
	return LOOM_OK;
}

static void count_gathered(zero_t *z)
{
	int n = 0;
	for (int i = 0; i < ZERO_PSLOTS; i++)
		n += z->pslot_unit[i] >= 0;
	z->gathered_now = n;
	z->gathered_peak = LOOM_MAX(z->gathered_peak, n);
}

/* The slot holding (or receiving) unit index k, or -1. */
static int slot_of(const zero_t *z, int k)
{
	for (int i = 0; i < ZERO_PSLOTS; i++)
		if (z->pslot_unit[i] == k)
			return i;
	return -1;
}

/* Begin gathering unit index k (a block or the head) into the slot that does not hold `keep`. */
static int prefetch(zero_t *z, int k, int keep)
{
	if (k < 1 || k >= z->nunits || slot_of(z, k) >= 0)
		return LOOM_OK;
	int i = z->pslot_unit[0] == keep ? 1 : 0;
	if (z->pslot_req[i]) { /* still receiving another unit (not reached when units go in order) */
		int rc = wait_gather(z, z->pslot_unit[i], &z->pslot_req[i]);
		if (rc != LOOM_OK)
			return rc;
	}
	z->pslot_unit[i] = k;
	count_gathered(z);
	return start_gather(z, k, z->pslots[i], &z->pslot_req[i]);
}

/* Make unit index k's parameters present and point its views at them. On failure the views still
 * point at valid memory (whatever it holds), so the pass runs to its end and the error is reported
 * by finish_grads. */
static int ensure(zero_t *z, int k)
{
	int rc = LOOM_OK, i;
	if (k == 0) {
		if (z->units[0].count == 0)
			return LOOM_OK;
		if (!z->emb_valid) {
			if (!z->emb_req)
				rc = start_gather(z, 0, z->emb_gather, &z->emb_req);
			if (rc == LOOM_OK && (rc = wait_gather(z, 0, &z->emb_req)) == LOOM_OK)
				z->emb_valid = 1;
		}
		loom_model_set_unit_view(z->base.model, -1, z->emb_gather, NULL);
		return rc;
	}
	if ((i = slot_of(z, k)) < 0) { /* not prefetched: gather now, into the slot of the unit used longest ago */
		rc = prefetch(z, k, -2);
		i = slot_of(z, k);
	}
	if (i < 0)
		i = 0;
	else if (rc == LOOM_OK)
		rc = wait_gather(z, k, &z->pslot_req[i]);
	loom_model_set_unit_view(z->base.model, z->units[k].unit, z->pslots[i], NULL);
	return rc;
}

/* Parameters change: nothing gathered is valid any more (nothing is in flight between steps). */
static void drop_gathered(zero_t *z)
{
	z->emb_valid = 0;
	for (int i = 0; i < ZERO_PSLOTS; i++)
		z->pslot_unit[i] = -1;
	count_gathered(z);
}

/* The index in units of unit u (-1 the embedding, 0..L-1 a block, L the head), or -1 when the model
 * does not hold it. */
static int kof(const zero_t *z, int unit)
{
	return unit >= -1 && unit <= z->base.mcfg.n_layer ? z->kof[unit + 1] : -1;
}

/* The hook at stage 3: unit u is about to run (phase 0 forward, 1 backward). */
static int use_params(zero_t *z, int unit, int phase)
{
	int k = kof(z, unit), L = z->base.mcfg.n_layer, rc;
	if (k < 0)
		return LOOM_OK;
	/* the embedding's tensors are read by other units too (the tied lm head, nanochat's per-layer
	 * scalars in every block): present whenever any unit runs (a pipeline stage may run no embedding) */
	if (k > 0 && !z->emb_valid && (rc = ensure(z, 0)) != LOOM_OK)
		return rc;
	if ((rc = ensure(z, k)) != LOOM_OK)
		return rc;
	if (unit == L && phase == 0)
		return LOOM_OK; /* the head's backward (phase 1) comes next, on the same parameters */
	/* forward: the next unit (after the embedding, block 0); backward: the previous block */
	return prefetch(z, phase == 0 ? k + 1 : k - 1, k);
}

/* ---- stages 1 and 2: the all-gather after the step ------------------------------------------------ */

/* Start all-gathering every unit's parameters from their owners, in place in the replicated buffer,
 * in unit order (the embedding first, as the next forward needs it). Nothing waits here: the param-use
 * hook waits for a unit's gather just before the unit runs, so the gathers of later blocks overlap
 * the forward of earlier ones; settle_params waits for all of them (before anything else reads the
 * parameters: sync, replica check, save, the next step). */
static int start_param_gathers(zero_t *z)
{
	loom_strategy_t *s = &z->base;
	int rc = LOOM_OK;
	mark_launch(z);
	for (int k = 0; k < z->nunits; k++) {
		unit_t *u = &z->units[k];
		float *p = s->params + u->offset;
		if (u->count == 0)
			continue;
		int r = loom_iallgatherv(s->dp, p + u->mine, u->counts[s->dp_rank], p, u->counts, LOOM_FLOAT32, &u->req);
		if (r != LOOM_OK) {
			u->req = NULL;
			rc = rc ? rc : r;
		}
		u->gathering = u->req != NULL;
	}
	if (rc != LOOM_OK)
		return loom_seterr(rc, "zero: starting the all-gather of the updated parameters: %s", loom_comm_errmsg(s->dp));
	return LOOM_OK;
}

static int wait_param_gather(zero_t *z, unit_t *u)
{
	int rc;
	if (!u->gathering)
		return LOOM_OK;
	rc = timed_wait(z, u->req);
	u->req = NULL, u->gathering = 0;
	if (rc != LOOM_OK)
		return loom_seterr(rc, "zero: rank %d: all-gather of unit %d's updated parameters failed: %s", z->base.dp_rank,
		                   u->unit, loom_comm_errmsg(z->base.dp));
	return LOOM_OK;
}

static int settle_params(zero_t *z)
{
	int rc = LOOM_OK;
	for (int k = 0; k < z->nunits; k++) {
		int r = wait_param_gather(z, &z->units[k]);
		rc = rc ? rc : r;
	}
	return rc;
}

/* ---- the reduce side --------------------------------------------------------------------------- */

static void launch_rs(zero_t *z, unit_t *u, float *buf)
{
	int rc;
	mark_launch(z);
	u->ready = 0, u->reduced = 1; /* (a pipeline runs several micro-batches' backwards per finish_grads) */
	if (z->bf16) { /* the unit's final gradients rounded into its bf16 staging, reduce-scattered as bf16 */
		loom__grad_to_bf16(u->stage16, buf, u->count);
		rc = loom_ireduce_scatterv(z->base.dp, u->stage16, u->stage16 + u->mine, u->counts, LOOM_BFLOAT16, LOOM_AVG,
		                           &u->req);
	} else {
		rc = loom_ireduce_scatterv(z->base.dp, buf, buf + u->mine, u->counts, LOOM_FLOAT32, LOOM_AVG, &u->req);
	}
	if (rc != LOOM_OK)
		z->err = rc, u->req = NULL;
}

/* Wait for unit u's reduce-scatter; at stage 2 add its result into the shard and free its slot. */
static int finish_unit(zero_t *z, unit_t *u)
{
	int rc = LOOM_OK;
	if (u->gathering) /* (a step without a forward since the last update) */
		return wait_param_gather(z, u);
	if (u->req) {
		rc = timed_wait(z, u->req);
		u->req = NULL;
		if (rc != LOOM_OK)
			return loom_seterr(rc, "zero: reduce-scatter of the gradients of unit %d failed: %s", u->unit,
			                   loom_comm_errmsg(z->base.dp));
		if (z->bf16) /* the averaged bf16 part widened back where the fp32 reduce-scatter leaves it */
			loom__grad_from_bf16((z->stage == 1 ? z->base.grads + u->offset : u->stage) + u->mine, u->stage16 + u->mine,
			                     u->counts[z->base.dp_rank]);
		if (z->stage >= 2) {
			size_t n = u->counts[z->base.dp_rank];
			float *dst = z->grad_shard + (u->offset + u->mine - z->base.own_offset), *src = u->stage + u->mine;
			for (size_t i = 0; i < n; i++)
				dst[i] += src[i];
		}
	}
	if (z->stage >= 2 && u->stage) {
		for (int k = 0; k < ZERO_SLOTS && !u->deferred && u->unit != -1; k++)
			if (z->slot_user[k] == (int)(u - z->units))
				z->slot_user[k] = -1;
		u->stage = NULL, u->stage16 = NULL;
	}
	return rc;
}

static void on_grad_ready(void *ctx, int t)
{
	zero_t *z = ctx;
	if (z->err || t < 0 || t >= z->ntensors || (z->stage == 1 && !z->sync))
		return;
	int k = kof(z, z->ti[t].layer);
	if (k < 0)
		return;
	unit_t *u = &z->units[k];
	if (++u->ready == u->hi - u->lo && !u->deferred)
		launch_rs(z, u, z->stage == 1 ? z->base.grads + u->offset : u->stage);
}

/* Stage 2: lend unit index k (u + 1) a staging buffer, zeroed, and point its gradient views at it. */
static void lend_stage(zero_t *z, int k)
{
	unit_t *u = &z->units[k];
	if (z->err)
		return;
	if (u->stage && !u->deferred && u->reduced) {
		/* a pipeline's next micro-batch reaches the unit before finish_grads: its previous gradient
		 * is reduced into the shard first, and its staging lent anew. The embedding too, when it is
		 * not deferred (an untied llama's first stage): otherwise the next micro-batch would add into
		 * emb_stage while its reduce-scatter is still in flight on it, in place, and launch another
		 * over the half-reduced buffer (losing the first request) */
		int rc = finish_unit(z, u);
		if (rc != LOOM_OK) {
			z->err = rc;
			return;
		}
	}
	if (u->stage)
		return;
	if (u->unit == -1) {
		u->stage = z->emb_stage, u->stage16 = z->emb16;
	} else if (u->deferred) {
		u->stage = u->own_stage, u->stage16 = u->own_stage16;
	} else {
		int s = (z->nunits - 1 - k) % ZERO_SLOTS; /* backward takes units from the head down */
		if (z->slot_user[s] >= 0) {
			int rc = finish_unit(z, &z->units[z->slot_user[s]]);
			if (rc != LOOM_OK) {
				z->err = rc;
				return;
			}
		}
		z->slot_user[s] = k;
		u->stage = z->slots[s], u->stage16 = z->slots16[s];
	}
	memset(u->stage, 0, u->count * sizeof(float));
	loom_model_set_unit_view(z->base.model, u->unit, NULL, u->stage);
}

static void on_param_use(void *ctx, int unit, int phase)
{
	zero_t *z = ctx;
	int k = kof(z, unit);
	if (z->err || k < 0)
		return;
	int rc = z->stage == 3 ? use_params(z, unit, phase) : wait_param_gather(z, &z->units[k]);
	if (rc == LOOM_OK && z->stage < 3 && k > 0)
		rc = wait_param_gather(z, &z->units[0]); /* the tied lm head reads wte, nanochat's blocks its scalars */
	if (rc != LOOM_OK) {
		z->err = rc;
		return;
	}
	if (phase != 1 || z->stage < 2)
		return;
	if (unit == z->base.mcfg.n_layer && z->units[0].count)
		lend_stage(z, 0); /* the tied lm head adds to wte's gradient before any block */
	lend_stage(z, k);
}

/* ---- the operations ---------------------------------------------------------------------------- */

static void zero_destroy(loom_strategy_t *s)
{
	zero_t *z = (zero_t *)s;
	if (!z)
		return;
	for (int k = 0; k < z->nunits; k++)
		if (z->units[k].req)
			loom_wait(z->units[k].req);
	if (z->emb_req)
		loom_wait(z->emb_req);
	for (int i = 0; i < ZERO_PSLOTS; i++)
		if (z->pslot_req[i])
			loom_wait(z->pslot_req[i]);
	if (s->model && z->stage == 3 && z->emb_gather)
		loom_model_set_param_buffer(s->model, NULL); /* its own buffer again (allocated if it had none) */
	if (s->model) {
		if (z->tpg.size > 1)
			loom_model_on_tp_reduce(s->model, NULL, NULL);
		loom_model_on_grad_ready(s->model, NULL, NULL);
		loom_model_on_param_use(s->model, NULL, NULL);
		if (z->stage == 1 && z->model_grads) {
			memcpy(z->model_grads, s->grads, s->nparams * sizeof(float));
			loom_model_set_grad_buffer(s->model, z->model_grads);
		} else if (z->stage >= 2 && z->emb_stage) {
			loom_model_own_grads(s->model); /* (allocated zeroed if create was told not to) */
		}
	}
	if (z->stage == 1)
		buf_free(z, s->grads);
	buf_free(z, z->emb_stage);
	for (int k = 0; k < ZERO_SLOTS; k++)
		buf_free(z, z->slots[k]);
	buf_free(z, z->g16);
	buf_free(z, z->emb16);
	for (int k = 0; k < ZERO_SLOTS; k++)
		buf_free(z, z->slots16[k]);
	loom_free_aligned(z->grad_shard);
	loom_free_aligned(z->param_shard);
	buf_free(z, z->emb_gather);
	for (int i = 0; i < ZERO_PSLOTS; i++)
		buf_free(z, z->pslots[i]);
	if (z->units)
		for (int k = 0; k < z->nunits; k++) {
			free(z->units[k].counts);
			buf_free(z, z->units[k].own_stage);
			buf_free(z, z->units[k].own_stage16);
		}
	free(z->units);
	free(z->kof);
	free(z->off);
	loom_adamw_free(&s->opt);
	loom__muon_free(s);
	free(z);
}

static int zero_create(loom_strategy_t **out, const loom_strategy_config_t *cfg)
{
	zero_t *z = loom__calloc(1, sizeof *z);
	loom_strategy_t *s = &z->base;
	int rc, N, L;
	size_t largest = 0;
	*out = NULL;
	if (!z)
		return loom_seterr(LOOM_ENOMEM, "zero: out of memory");
	if (cfg->grad_reduce_dtype != LOOM_FLOAT32 && cfg->grad_reduce_dtype != LOOM_BFLOAT16) {
		free(z);
		return loom_seterr(LOOM_EINVAL, "zero: gradients are reduce-scattered in float32 or bfloat16, not %s",
		                   loom_dtype_name(cfg->grad_reduce_dtype));
	}
	z->bf16 = cfg->grad_reduce_dtype == LOOM_BFLOAT16;
	s->ops = cfg->zero == 1 ? loom__zero1_strategy() : cfg->zero == 2 ? loom__zero2_strategy() : loom__zero3_strategy();
	z->stage = cfg->zero;
	s->model = cfg->model;
	s->mcfg = *loom_model_get_config(cfg->model);
	s->dp = cfg->dp;
	s->dp_rank = loom_comm_rank(cfg->dp), s->dp_size = N = loom_comm_size(cfg->dp);
	s->writer = cfg->writer;
	s->params = loom_model_params(cfg->model);
	/* the model's own table: the whole model's, or with tensor parallelism this rank's shard's (the
	 * same tensors and units, each its shard's size), which ZeRO shards further over dp */
	s->nparams = loom_model_param_count(cfg->model);
	z->ti = loom_model_tensors(cfg->model, &z->ntensors);
	loom__tp_group_init(&z->tpg, cfg->tp);
	if (loom_model_tp_size(cfg->model) != z->tpg.size) {
		rc = loom_seterr(LOOM_EINVAL, "zero: the model is tensor-parallel shard %d of %d, but the tensor-parallel "
		                 "axis has %d rank(s)", loom_model_tp_rank(cfg->model), loom_model_tp_size(cfg->model),
		                 z->tpg.size);
		goto fail;
	}
	L = s->mcfg.n_layer;
	/* the units the model holds: the embedding's first (empty when it holds none of its tensors), then
	 * each other unit's run of tensors in table order */
	z->nunits = 1;
	for (int t = 0; t < z->ntensors; t++)
		if (z->ti[t].layer >= 0 && (t == 0 || z->ti[t - 1].layer != z->ti[t].layer))
			z->nunits++;
	s->norm_skip = cfg->norm_skip;
	z->sync = 1;
	for (int k = 0; k < ZERO_SLOTS; k++)
		z->slot_user[k] = -1;
	for (int i = 0; i < ZERO_PSLOTS; i++)
		z->pslot_unit[i] = -1;
	if (!s->params) {
		rc = loom_seterr(LOOM_EINVAL, "zero: stage %d takes the initial parameters from the model's whole "
		                 "parameter buffer, and the model has none (loom_model_set_param_buffer)", z->stage);
		goto fail;
	}
	if (!(z->off = loom__calloc((size_t)N + 1, sizeof *z->off)) ||
	    !(z->units = loom__calloc((size_t)z->nunits, sizeof *z->units)) ||
	    !(z->kof = loom__malloc((size_t)(L + 2) * sizeof *z->kof)))
		goto oom;
	int nt;
	const loom_tensor_info_t *tt = loom_model_tensors(cfg->model, &nt);
	for (int q = 0; q <= N; q++)
		z->off[q] = cfg->optimizer == LOOM_OPTIMIZER_MUON ? loom__muon_shard_offset(tt, nt, s->nparams, q, N)
		                                                  : loom__zero_shard_offset(s->nparams, q, N);
	s->shard_off = z->off;
	s->own_offset = z->off[s->dp_rank], s->own_count = z->off[s->dp_rank + 1] - z->off[s->dp_rank];

	/* The units and each rank's part of them. */
	const loom_tensor_info_t *ti = z->ti;
	for (int u = 0; u < L + 2; u++)
		z->kof[u] = -1;
	for (int k = 0, t = 0; k < z->nunits; k++) {
		unit_t *u = &z->units[k];
		u->unit = k == 0 ? -1 : ti[t].layer;
		u->lo = t;
		while (t < z->ntensors && ti[t].layer == u->unit)
			t++;
		u->hi = t;
		if (u->unit < -1 || u->unit > L || z->kof[u->unit + 1] >= 0) {
			rc = loom_seterr(LOOM_EINVAL, "zero: the %s model's tensors are not in unit order (unit %d at tensor %d)",
			                 loom_arch_name(s->mcfg.arch), u->unit, u->lo);
			goto fail;
		}
		z->kof[u->unit + 1] = k;
		u->offset = u->hi > u->lo ? ti[u->lo].offset : 0;
		u->count = u->hi > u->lo ? ti[u->hi - 1].offset + ti[u->hi - 1].numel - u->offset : 0;
		for (int i = u->lo; i < u->hi && cfg->deferred; i++)
			u->deferred |= cfg->deferred[i] != 0;
		if (!(u->counts = loom__calloc((size_t)N, sizeof *u->counts)))
			goto oom;
		size_t a = u->offset, b = u->offset + u->count, displ = 0;
		for (int q = 0; q < N; q++) {
			size_t lo = LOOM_MAX(a, z->off[q]), hi = LOOM_MIN(b, z->off[q + 1]);
			u->counts[q] = hi > lo ? hi - lo : 0;
			if (q == s->dp_rank)
				u->mine = displ;
			displ += u->counts[q];
		}
		if (k > 0)
			largest = LOOM_MAX(largest, u->count);
	}

	if (z->stage == 1) { /* a full gradient buffer in shared memory, as DDP's */
		if (!(s->grads = buf_alloc(z, s->nparams)))
			goto oom;
		z->model_grads = loom_model_grads(cfg->model);
		if (z->model_grads)
			memcpy(s->grads, z->model_grads, s->nparams * sizeof(float));
		else
			memset(s->grads, 0, s->nparams * sizeof(float));
		loom_model_set_grad_buffer(cfg->model, s->grads);
		s->own_grads = s->grads + s->own_offset;
		loom_model_on_param_use(cfg->model, on_param_use, z);
	} else { /* the shard, and staging buffers lent to units by the param-use hook */
		if (!(z->grad_shard = loom_alloc_aligned(LOOM_MAX(s->own_count, 1) * sizeof(float))) ||
		    !(z->emb_stage = buf_alloc(z, z->units[0].count)))
			goto oom;
		for (int k = 0; k < ZERO_SLOTS; k++)
			if (!(z->slots[k] = buf_alloc(z, largest)))
				goto oom;
		memset(z->grad_shard, 0, LOOM_MAX(s->own_count, 1) * sizeof(float));
		s->grads = NULL; /* no full gradient exists */
		s->own_grads = z->grad_shard;
		loom_model_on_param_use(cfg->model, on_param_use, z);
	}
	s->own_params = s->params + s->own_offset;
	if (z->stage == 3) { /* the parameter shard, and the buffers units are gathered into */
		if (!(z->param_shard = loom_alloc_aligned(LOOM_MAX(s->own_count, 1) * sizeof(float))) ||
		    !(z->emb_gather = buf_alloc(z, z->units[0].count)))
			goto oom;
		for (int i = 0; i < ZERO_PSLOTS; i++)
			if (!(z->pslots[i] = buf_alloc(z, largest)))
				goto oom;
		memcpy(z->param_shard, s->params + s->own_offset, s->own_count * sizeof(float));
		z->init = s->params; /* rank 0's is broadcast by sync_params, unless a checkpoint is loaded first */
		s->params = NULL;    /* no whole parameter buffer is kept */
		s->own_params = z->param_shard;
		s->collective_forward = 1;
	}
	if (z->bf16) { /* the bf16 staging, beside the fp32 gradients (stage 1) or staging buffers */
		if (z->stage == 1) {
			if (!(z->g16 = buf16_alloc(z, s->nparams)))
				goto oom;
			for (int k = 0; k < z->nunits; k++)
				z->units[k].stage16 = z->g16 + z->units[k].offset;
		} else {
			if (!(z->emb16 = buf16_alloc(z, z->units[0].count)))
				goto oom;
			for (int k = 0; k < ZERO_SLOTS; k++)
				if (!(z->slots16[k] = buf16_alloc(z, largest)))
					goto oom;
		}
	}
	/* stages 2, 3: a deferred unit keeps its staging over the step's micro-steps (the embedding's is
	 * emb_stage), lent from the start */
	size_t deferred_floats = 0;
	for (int k = 1; k < z->nunits && z->stage >= 2; k++) {
		unit_t *u = &z->units[k];
		if (!u->deferred)
			continue;
		if (!(u->own_stage = buf_alloc(z, u->count)) || (z->bf16 && !(u->own_stage16 = buf16_alloc(z, u->count))))
			goto oom;
		deferred_floats += u->count;
	}
	for (int k = 0; k < z->nunits && z->stage >= 2; k++)
		if (z->units[k].deferred && z->units[k].count)
			lend_stage(z, k);
	s->mem.params = (z->stage == 3 ? s->own_count : s->nparams) * sizeof(float);
	s->mem.grads = (z->stage == 1 ? s->nparams : s->own_count) * sizeof(float);
	s->mem.optim = 2 * s->own_count * sizeof(float);
	s->mem.comm = z->stage == 1 ? 0 : (z->units[0].count + ZERO_SLOTS * largest) * sizeof(float);
	if (z->stage == 3)
		s->mem.comm += (z->units[0].count + ZERO_PSLOTS * largest) * sizeof(float);
	if (z->bf16)
		s->mem.comm += (z->stage == 1 ? s->nparams : z->units[0].count + ZERO_SLOTS * largest) * sizeof(uint16_t);
	s->mem.comm += deferred_floats * (sizeof(float) + (z->bf16 ? sizeof(uint16_t) : 0));
	if (cfg->optimizer == LOOM_OPTIMIZER_MUON) {
		if ((rc = loom__muon_init_range(s, cfg)) != LOOM_OK)
			goto fail;
	} else if ((rc = loom_adamw_init_table_range(&s->opt, &cfg->adamw, z->ti, z->ntensors, s->nparams, s->own_offset,
	                                             s->own_count)) != LOOM_OK) {
		goto fail;
	}
	loom_model_on_grad_ready(cfg->model, on_grad_ready, z);
	if (z->tpg.size > 1)
		loom_model_on_tp_reduce(cfg->model, loom__tp_group_reduce, &z->tpg);
	*out = s;
	return LOOM_OK;
oom:
	rc = loom_seterr(LOOM_ENOMEM, "zero: rank %d: out of memory for stage %d's buffers (%zu parameters)", s->dp_rank,
	                 z->stage, s->nparams);
fail:
	zero_destroy(s);
	return rc;
}

static void zero_set_sync(loom_strategy_t *s, int sync)
{
	((zero_t *)s)->sync = sync != 0;
}

static int zero_finish_grads(loom_strategy_t *s, loom_strategy_stats_t *st)
{
	zero_t *z = (zero_t *)s;
	loom_comm_stats_t now;
	double t0 = loom_now(), in_hooks = z->hook_wait_s;
	int rc = z->err, expect = z->stage >= 2 || z->sync;
	/* the deferred units: complete now (the executor has summed them with the other stages') */
	for (int k = 0; k < z->nunits && expect && rc == LOOM_OK; k++) {
		unit_t *u = &z->units[k];
		if (u->deferred && u->count && !u->req && (z->stage == 1 || u->stage))
			launch_rs(z, u, z->stage == 1 ? s->grads + u->offset : u->stage);
	}
	rc = rc ? rc : z->err;
	int launched = z->launched;
	for (int k = 0; k < z->nunits; k++) {
		unit_t *u = &z->units[k];
		int had = u->req != NULL;
		int r = finish_unit(z, u);
		if (r != LOOM_OK && rc == LOOM_OK)
			rc = r;
		else if (!had && expect && rc == LOOM_OK && !u->reduced && !u->deferred && u->hi > u->lo)
			rc = loom_seterr(LOOM_ESTATE, "zero: the gradients of unit %d (tensors %d..%d) were never complete: "
			                 "%d of %d reported", u->unit, u->lo, u->hi - 1, u->ready, u->hi - u->lo);
		u->ready = 0, u->reduced = 0;
	}
	for (int k = 0; k < z->nunits && z->stage >= 2; k++) /* lent again for the next step */
		if (z->units[k].deferred && z->units[k].count)
			lend_stage(z, k);
	loom_comm_stats(s->dp, &now);
	/* exposed: the waits here and those inside the hooks during the micro-step (gathers, slots) */
	st->exposed_comm_ms = 1e3 * (loom_now() - t0 + in_hooks);
	st->comm_ms = launched ? 1e3 * (now.busy_s - z->at_launch.busy_s) : 0.0;
	/* the tensor-parallel all-reduces of the passes block the training thread: all of it exposed */
	double tp_ms = loom__tp_group_take_ms(&z->tpg);
	st->comm_ms += tp_ms, st->exposed_comm_ms += tp_ms;
	z->launched = 0, z->err = LOOM_OK, z->sync = 1, z->hook_wait_s = 0.0;
	return rc;
}

/* The sum of squares of the owned gradients, over the data-parallel ranks' disjoint ranges; with
 * tensor parallelism then over the group: a split tensor's shards are disjoint, a whole one (the
 * same on every tp rank) is counted by tp rank 0 alone. */
static int zero_grad_norm(loom_strategy_t *s, double *norm)
{
	zero_t *z = (zero_t *)s;
	double sq = 0.0;
	int rc;
	if (z->tpg.size == 1 && !s->norm_skip) {
		sq = loom_grad_sumsq(s->own_grads, s->own_count);
	} else { /* tensor by tensor: a copy another stage owns is left out */
		size_t a = s->own_offset, b = s->own_offset + s->own_count;
		for (int t = 0; t < z->ntensors; t++) {
			size_t lo = LOOM_MAX(a, z->ti[t].offset), hi = LOOM_MIN(b, z->ti[t].offset + z->ti[t].numel);
			if (hi > lo && (z->ti[t].tp_dim >= 0 || z->tpg.rank == 0) && !(s->norm_skip && s->norm_skip[t]))
				sq += loom_grad_sumsq(s->own_grads + (lo - a), hi - lo);
		}
	}
	if ((rc = loom_allreduce(s->dp, &sq, &sq, 1, LOOM_FLOAT64, LOOM_SUM)) != LOOM_OK)
		return loom_seterr(rc, "zero: summing the squared gradient norms of the shards: %s", loom_comm_errmsg(s->dp));
	if (z->tpg.size > 1 && (rc = loom_allreduce(z->tpg.comm, &sq, &sq, 1, LOOM_FLOAT64, LOOM_SUM)) != LOOM_OK)
		return loom_seterr(rc, "zero: tensor-parallel rank %d: summing the squared gradient norm over the group: %s",
		                   z->tpg.rank, loom_comm_errmsg(z->tpg.comm));
	*norm = sqrt(sq);
	return LOOM_OK;
}

/* Wait for gathers still in flight (a forward that prefetched a unit it did not reach). */
static int settle_gathers(zero_t *z)
{
	int rc = LOOM_OK, r;
	if (z->emb_req && (r = wait_gather(z, 0, &z->emb_req)) != LOOM_OK)
		rc = r;
	for (int i = 0; i < ZERO_PSLOTS; i++)
		if (z->pslot_req[i] && (r = wait_gather(z, z->pslot_unit[i], &z->pslot_req[i])) != LOOM_OK && rc == LOOM_OK)
			rc = r;
	return rc;
}

static int zero_optim_step(loom_strategy_t *s, float lr, float grad_scale)
{
	zero_t *z = (zero_t *)s;
	int rc;
	if ((rc = z->stage == 3 ? settle_gathers(z) : settle_params(z)) != LOOM_OK)
		return rc;
	if (s->muon) /* the shard holds whole matrices: buffers indexed from its first float */
		rc = loom_muonadamw_step_at(s->muon, s->own_params, s->own_grads, s->own_offset, lr, grad_scale);
	else
		rc = loom_adamw_step(&s->opt, s->own_params, s->own_grads, lr, grad_scale);
	if (rc != LOOM_OK)
		return rc;
	if (z->stage >= 2) /* the shard accumulates the next step's micro-steps */
		memset(z->grad_shard, 0, s->own_count * sizeof(float));
	if (z->stage == 3) {
		drop_gathered(z);
		return LOOM_OK;
	}
	return start_param_gathers(z);
}

static int compare_checksums(loom_strategy_t *s, const char *what)
{
	int size = s->dp_size, rc, bad = 0;
	uint64_t mine = loom_checksum_f32(s->params, s->nparams), all[64];
	uint64_t *a = size <= 64 ? all : loom__calloc((size_t)size, sizeof *a);
	char list[512] = "";
	size_t len = 0;
	if (!a)
		return loom_seterr(LOOM_ENOMEM, "zero: out of memory");
	if ((rc = loom_allgather(s->dp, &mine, a, 1, LOOM_INT64)) != LOOM_OK) {
		rc = loom_seterr(rc, "zero: %s: gathering parameter checksums failed: %s", what, loom_comm_errmsg(s->dp));
		goto out;
	}
	for (int r = 1; r < size; r++)
		if (a[r] != a[0]) {
			bad++;
			if (len + 32 < sizeof list)
				len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", bad > 1 ? ", " : "", r);
		}
	if (bad)
		rc = loom_seterr(LOOM_EMISMATCH, "zero: %s: parameters of rank(s) %s differ from rank 0's (checksum of rank 0 "
		                 "%016llx, of rank %d %016llx)", what, list, (unsigned long long)a[0], s->dp_rank,
		                 (unsigned long long)mine);
out:
	if (a != all)
		free(a);
	return rc;
}

/* Stage 3: rank 0's initial parameters (the model's whole buffer at create) to every rank, each
 * keeping its shard; once loaded from a checkpoint or done once, the shards are the parameters and
 * there is nothing to do. */
static int sync_shards(zero_t *z)
{
	loom_strategy_t *s = &z->base;
	int rc, have = z->init != NULL, all = 0;
	if ((rc = loom_allreduce(s->dp, &have, &all, 1, LOOM_INT32, LOOM_MIN)) != LOOM_OK)
		return loom_seterr(rc, "zero: agreeing on the initial parameters: %s", loom_comm_errmsg(s->dp));
	if (!all) {
		z->init = NULL;
		loom_model_drop_params(s->model);
		return LOOM_OK;
	}
	/* in pieces of one unit, through the first gathered buffer (no whole-buffer copy is allocated) */
	for (int k = 0; k < z->nunits; k++) {
		unit_t *u = &z->units[k];
		float *tmp = k == 0 ? z->emb_gather : z->pslots[0];
		if (u->count == 0)
			continue;
		if (s->dp_rank == 0)
			memcpy(tmp, z->init + u->offset, u->count * sizeof(float));
		if ((rc = loom_broadcast(s->dp, tmp, u->count, LOOM_FLOAT32, 0)) != LOOM_OK)
			return loom_seterr(rc, "zero: broadcasting rank 0's parameters of unit %d: %s", u->unit,
			                   loom_comm_errmsg(s->dp));
		memcpy(z->param_shard + (u->offset + u->mine - s->own_offset), tmp + u->mine,
		       u->counts[s->dp_rank] * sizeof(float));
	}
	z->init = NULL;
	drop_gathered(z);
	loom_model_drop_params(s->model); /* a pipeline stage model's own buffer, idle from here on */
	return LOOM_OK;
}

static int zero_sync_params(loom_strategy_t *s)
{
	if (((zero_t *)s)->stage == 3)
		return sync_shards((zero_t *)s);
	int rc = settle_params((zero_t *)s);
	if (rc != LOOM_OK)
		return rc;
	rc = loom_broadcast(s->dp, s->params, s->nparams, LOOM_FLOAT32, 0);
	if (rc != LOOM_OK)
		return loom_seterr(rc, "zero: broadcasting parameters from rank 0 failed: %s", loom_comm_errmsg(s->dp));
	return compare_checksums(s, "after broadcast");
}

static int zero_check_replicas(loom_strategy_t *s)
{
	zero_t *z = (zero_t *)s;
	if (z->stage == 3)
		return LOOM_OK; /* nothing is replicated */
	int rc = settle_params(z);
	if (rc == LOOM_OK)
		rc = compare_checksums(s, "replica check");
	return rc ? rc : loom__tp_check_whole(&z->tpg, z->ti, z->ntensors, s->params);
}

static int zero_export(loom_strategy_t *s, float *p, float *m, float *v)
{
	zero_t *z = (zero_t *)s;
	int rc = z->stage == 3 ? settle_gathers(z) : settle_params(z);
	return rc ? rc : loom__strategy_export_owned(s, p, m, v);
}

static int zero_import(loom_strategy_t *s, const float *p, const float *m, const float *v, long long step)
{
	int rc = loom__strategy_import_owned(s, p, m, v, step);
	if (rc == LOOM_OK && p && !s->params)
		loom__zero_set_loaded(s); /* stage 3: the shard holds the parameters now */
	return rc;
}

static int zero_save(loom_strategy_t *s, const loom_ckpt_writer_t *w)
{
	zero_t *z = (zero_t *)s;
	float *p = NULL, *m = NULL, *v = NULL;
	int rc;
	if (z->tpg.size == 1) {
		rc = z->stage == 3 ? settle_gathers(z) : settle_params(z);
		return rc ? rc : loom__sharded_save(s, w, z->stage);
	}
	/* a tensor-parallel shard: the group's whole state, written by the writer as DDP's (the state
	 * gathered over dp first, then unsharded over tp by data-parallel rank 0's group) */
	size_t bytes = LOOM_MAX(s->nparams, 1) * sizeof(float);
	if (!(p = loom_alloc_aligned(bytes)) || !(m = loom_alloc_aligned(bytes)) || !(v = loom_alloc_aligned(bytes)))
		rc = loom_seterr(LOOM_ENOMEM, "zero: rank %d: out of memory for gathering %zu parameters to save them",
		                 s->dp_rank, s->nparams);
	else
		rc = zero_export(s, p, m, v);
	if (rc == LOOM_OK && s->dp_rank == 0)
		rc = loom__tp_write_whole(&z->tpg, &s->mcfg, p, m, v, w);
	loom_free_aligned(p), loom_free_aligned(m), loom_free_aligned(v);
	return rc;
}

static int zero_load(loom_strategy_t *s, const char *dir, long long step)
{
	zero_t *z = (zero_t *)s;
	float *p = NULL, *m = NULL, *v = NULL;
	int rc;
	if (z->tpg.size == 1)
		return loom__sharded_load(s, dir, step);
	/* a tensor-parallel shard: this tp rank's shard of the whole state, then the owned range */
	size_t bytes = LOOM_MAX(s->nparams, 1) * sizeof(float);
	if (!(p = loom_alloc_aligned(bytes)) || !(m = loom_alloc_aligned(bytes)) || !(v = loom_alloc_aligned(bytes)))
		rc = loom_seterr(LOOM_ENOMEM, "zero: rank %d: out of memory to read a checkpoint", s->dp_rank);
	else if ((rc = loom__tp_read_shard(&z->tpg, dir, &s->mcfg, p, m, v)) == LOOM_OK)
		rc = zero_import(s, p, m, v, step);
	loom_free_aligned(p), loom_free_aligned(m), loom_free_aligned(v);
	return rc;
}

/* The three stages share every operation; the stage is the trainer's `zero` setting (cfg->zero). */
#define ZERO_OPS(k)                                                                                               \
	static const loom_strategy_ops_t zero##k##_ops = {                                                            \
		.name = "zero" #k,                                                                                        \
		.create = zero_create,                                                                                    \
		.destroy = zero_destroy,                                                                                  \
		.set_sync = zero_set_sync,                                                                                \
		.finish_grads = zero_finish_grads,                                                                        \
		.grad_norm = zero_grad_norm,                                                                              \
		.optim_step = zero_optim_step,                                                                            \
		.sync_params = zero_sync_params,                                                                          \
		.check_replicas = zero_check_replicas,                                                                    \
		.save = zero_save,                                                                                        \
		.load = zero_load,                                                                                        \
		.export_state = zero_export,                                                                              \
		.import_state = zero_import,                                                                               \
	}
ZERO_OPS(1);
ZERO_OPS(2);
ZERO_OPS(3);

const loom_strategy_ops_t *loom__zero3_strategy(void)
{
	return &zero3_ops;
}

int loom__zero_gathered_peak(const loom_strategy_t *s, unsigned long long *gathers)
{
	const zero_t *z = (const zero_t *)s;
	if (gathers)
		*gathers = z->gathers;
	return z->gathered_peak;
}

void loom__zero_set_loaded(loom_strategy_t *s)
{
	zero_t *z = (zero_t *)s;
	z->init = NULL;
	drop_gathered(z);
	if (z->stage == 3)
		loom_model_drop_params(s->model);
}

const loom_strategy_ops_t *loom__zero1_strategy(void)
{
	return &zero1_ops;
}

const loom_strategy_ops_t *loom__zero2_strategy(void)
{
	return &zero2_ops;
}
