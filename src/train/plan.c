/* plan.c: the planner's arithmetic (loom/plan.h; the formulas and their sources are in docs/plan.md).
 *
 * Memory follows loom's own accounting rather than a second formula, so the two cannot drift: the
 * activations are loom_model_act_bytes for the model a rank would create (a pipeline stage's layers
 * and arenas, a tensor-parallel shard, the checkpointing mode), the model states the table below (the
 * strategies' s->mem: DDP and tp 16 bytes per parameter of the shard; ZeRO's shards from
 * loom__zero_shard_offset), the communication buffers those strategies allocate (ZeRO's staging and
 * gather slots, bf16 staging, the pipeline's send/receive buffers). Time is one rank's step: its
 * micro-batches' compute (matmul FLOPs at the cluster's efficiency of its peak, plus the elementwise
 * kernels' and the optimizer's memory traffic), the tensor-parallel all-reduces (blocking: always
 * exposed), the pipeline schedule (loom__pp_simulate_v on the stages' costs, as the executor runs them)
 * and the data-parallel reduction, overlapped with the last backward bucket by bucket as the trainer
 * does (only what is left when backward ends is exposed).
 *
 * Invariant (checked by tests/test_plan.c): for the configurations loom runs, memory.params + grads +
 * optimizer equal the trainer's mem_model_states_bytes and memory.activations its activation_bytes
 * total, exactly. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "loom/muon.h"
#include "loom/plan.h"
#include "loom/train.h"
#include "parallel/pp.h"
#include "parallel/strategy.h"

#define MIB 1048576.0

double loom_plan_ring_allreduce_bytes(double n, int N)
{
	return N > 1 ? 2.0 * (N - 1) / N * n : 0.0;
}

double loom_plan_cp_bytes(const loom_model_config_t *cfg, int B, int T, int cp, int tp)
{
	double kv = (double)loom_model_kv_width(cfg) / LOOM_MAX(tp, 1);
	return cp > 1 ? (cp - 1.0) / cp * B * (double)T * 2.0 * kv * 4.0 : 0.0;
}

/* Seconds for a collective moving `bytes` per rank in `steps` latency-bound hops over a link. */
static double link_time(double bytes, int steps, double bw, double lat)
{
	return (bw > 0 ? bytes / bw : 0.0) + steps * lat;
}

/* Bytes of unit u's parameters (its tensors are contiguous) in the whole model (tp 1). */
static double unit_bytes(const loom_model_config_t *cfg, int u)
{
	int first, end;
	loom_tensor_info_t a, b;
	loom_model_unit_tensors(cfg, u, &first, &end);
	if (end <= first || loom_model_tensor_info(cfg, first, &a) != LOOM_OK ||
	    loom_model_tensor_info(cfg, end - 1, &b) != LOOM_OK)
		return 0.0;
	return 4.0 * (double)(b.offset + b.numel - a.offset);
}

/* The tensor table of a tp shard (tp <= 1: the whole model), read once: what the memory and the
 * buckets below need of it (a family's tensor_info formats names, too slow for a search's loops). */
typedef struct {
	int n;
	int *layer, *head_reads;
	double *numel;
	loom_tensor_info_t *info; /* the rest (MuonAdamW's groups and shapes) */
} table_t;

static void table_free(table_t *t)
{
	free(t->layer), free(t->head_reads), free(t->numel), free(t->info);
	memset(t, 0, sizeof *t);
}

static int table_read(const loom_model_config_t *cfg, int tp, table_t *t)
{
	memset(t, 0, sizeof *t);
	t->n = loom_model_num_tensors(cfg);
	t->layer = malloc(sizeof(int) * (size_t)t->n), t->head_reads = malloc(sizeof(int) * (size_t)t->n);
	t->numel = malloc(sizeof(double) * (size_t)t->n), t->info = malloc(sizeof *t->info * (size_t)t->n);
	if (!t->layer || !t->head_reads || !t->numel || !t->info) {
		table_free(t);
		return loom_seterr(LOOM_ENOMEM, "plan: out of memory");
	}
	for (int i = 0; i < t->n; i++) {
		loom_tensor_info_t *ti = &t->info[i];
		int rc = tp > 1 ? loom_model_shard_info(cfg, tp, i, ti) : loom_model_tensor_info(cfg, i, ti);
		if (rc != LOOM_OK) {
			table_free(t);
			return rc;
		}
		t->layer[i] = ti->layer, t->head_reads[i] = ti->head_reads, t->numel[i] = (double)ti->numel;
	}
	return LOOM_OK;
}

/* Parameters of a tp shard held by a stage of blocks [lo, hi) (+ the embedding on stage 0, the head
 * with hi == L), and of the tensors the head also reads (GPT-2's tied wte) when it holds the head. */
static double stage_params(const table_t *tb, int L, int lo, int hi, int first, double *tied)
{
	double sum = 0.0;
	*tied = 0.0;
	for (int i = 0; i < tb->n; i++) {
		int u = tb->layer[i], mine = (u < 0 && first) || (u >= 0 && u < L && u >= lo && u < hi) || (u >= L && hi == L);
		if (mine)
			sum += tb->numel[i];
		if (tb->head_reads[i] && hi == L)
			*tied += tb->numel[i];
	}
	return sum;
}

/* The parameters of pipeline rank s's layers: its V chunks, global stages c pp + s of lo's pp V. */
static double rank_params(const table_t *tb, int L, const int *lo, int pp, int V, int s, double *tied)
{
	double sum = 0.0, t;
	*tied = 0.0;
	for (int c = 0; c < V; c++) {
		int g = c * pp + s;
		sum += stage_params(tb, L, lo[g], lo[g + 1], g == 0, &t);
		*tied += t;
	}
	return sum;
}

/* The pipeline schedule of a configuration (loom_plan_config_t schedule_gpipe, virtual_stages). */
static loom_pp_schedule_t plan_schedule(const loom_plan_config_t *pc)
{
	return pc->schedule_gpipe ? LOOM_PP_GPIPE : pc->virtual_stages > 1 ? LOOM_PP_INTERLEAVED : LOOM_PP_1F1B;
}

/* DDP's buckets (src/parallel/ddp.c): from the last tensor backwards, the first closing at
 * first_mb, the others at mb MiB. Into sizes[] (bytes, in the order they are launched); returns the
 * count. */
static int ddp_buckets(const table_t *tb, double mb, double first_mb, double *sizes, int cap)
{
	int k = 0;
	double bytes = 0.0, limit = floor(first_mb * MIB);
	for (int t = tb->n - 1; t >= 0 && k < cap; t--) {
		bytes += 4.0 * tb->numel[t];
		if (bytes >= limit || t == 0) {
			sizes[k++] = bytes;
			bytes = 0.0, limit = floor(mb * MIB);
		}
	}
	return k;
}

/* The exposed time of buckets of sizes[0..n) launched as a backward of t_bwd seconds produces them
 * (bucket k is ready when backward has gone through its share of the gradient bytes) and run one after
 * the other on the link (the communicator's progress thread): what is left when backward ends. */
static double overlap(const double *sizes, int n, double t_bwd, double bw, double lat, int N, double scale,
                      double *total_s)
{
	double all = 0.0, done = 0.0, end = 0.0;
	for (int k = 0; k < n; k++)
		all += sizes[k];
	*total_s = 0.0;
	for (int k = 0; k < n; k++) {
		double t = link_time(loom_plan_ring_allreduce_bytes(sizes[k] * scale, N), 2 * (N - 1), bw, lat);
		done += sizes[k];
		double ready = all > 0 ? t_bwd * done / all : t_bwd;
		end = LOOM_MAX(end, ready) + t;
		*total_s += t;
	}
	return LOOM_MAX(0.0, end - t_bwd);
}

/* Bandwidth and latency of a group of `size` ranks `stride` apart in the world order (tp fastest, then
 * cp, dp, pp): intra-node when the group fits in a node, else the inter-node link. */
static int group_link(const loom_cluster_t *c, int size, int stride, double *bw, double *lat)
{
	int cross = size > 1 && (long)size * stride > c->ranks_per_node;
	*bw = cross ? c->inter_bw : c->intra_bw;
	*lat = cross ? c->inter_lat : c->intra_lat;
	return cross;
}

/* Tensor i of the table is held by global stage g of the npp stages (blocks [lo[g], lo[g+1])): what
 * src/parallel/pp.c keeps: its own units, the tied wte on the head stages, the head's on stage npp-2
 * when it shares the head's positions (hrows). */
static int held(const table_t *tb, int L, int npp, int g, const int *lo, int hrows, int i)
{
	int head = g == npp - 1 || (hrows && g == npp - 2), v = tb->layer[i];
	return v < 0 ? g == 0 || (tb->head_reads[i] && head) : v >= L ? head : v >= lo[g] && v < lo[g + 1];
}

/* Tensor i is held by pipeline rank s: by any of its V chunks (global stages c pp + s), once (the
 * chunks' join holds a tensor two of them use once, e.g. wte with the embedding on chunk 0 and a
 * share of the head on chunk V-1). */
static int rank_holds(const table_t *tb, int L, int pp, int V, int s, const int *lo, int hrows, int i)
{
	int any = 0;
	for (int c = 0; c < V && !any; c++)
		any = held(tb, L, pp * V, c * pp + s, lo, hrows, i);
	return any;
}

/* Floats of unit u held by pipeline rank s. */
static double rank_unit(const table_t *tb, int L, int pp, int V, int s, const int *lo, int hrows, int u)
{
	double sum = 0.0;
	for (int i = 0; i < tb->n; i++)
		sum += tb->layer[i] == u && rank_holds(tb, L, pp, V, s, lo, hrows, i) ? tb->numel[i] : 0.0;
	return sum;
}

/* MuonAdamW on pipeline rank s (its V chunks' tensors, packed in table order as the stage model
 * holds them; the whole model without a pipeline) of data-parallel rank dp_rank, as
 * src/parallel/muon_opt.c sets it up: replicated (no ZeRO) each rank keeps AdamW's m, v for every
 * non-matrix float and the state of the matrices it owns (loom_muon_owned) plus, with several ranks,
 * a staging buffer of every matrix; under ZeRO its range of the buffer (the default shard offsets
 * moved up to a tensor boundary) with the matrices starting in it. *bytes: the state's
 * (loom_muonadamw_state_floats); *own: the floats of the rank's ZeRO range; *adam: AdamW's floats;
 * *ns_flops: one step's Newton-Schulz iterations (5, each X X^T, a polynomial of it and its product
 * with X: 4 r^2 c + 2 r^3 for r <= c). tp 1 only (Muon refuses tp). */
static int muon_state(const loom_plan_config_t *pc, const table_t *tb, int pp, int V, int s, const int *lo,
                      int hrows, int dp, int dp_rank, double *bytes, double *own, double *adam, double *ns_flops,
                      double *scratch)
{
	const loom_model_config_t *cfg = &pc->model;
	int L = cfg->n_layer, n = 0, nm = 0, rc = LOOM_OK;
	loom_tensor_info_t *t = malloc(sizeof *t * (size_t)LOOM_MAX(tb->n, 1));
	int *mats = malloc(sizeof(int) * (size_t)LOOM_MAX(tb->n, 1));
	size_t P = 0, range[2], total = 0;
	if (!t || !mats) {
		rc = loom_seterr(LOOM_ENOMEM, "plan: out of memory");
		goto out;
	}
	for (int i = 0; i < tb->n; i++) {
		if (pp > 1 && !rank_holds(tb, L, pp, V, s, lo, hrows, i))
			continue;
		t[n] = tb->info[i];
		t[n].offset = P, P += t[n].numel;
		total += t[n].opt_group == LOOM_OPT_MATRIX ? t[n].numel : 0;
		n++;
	}
	range[0] = 0, range[1] = P;
	if (pc->zero > 0 && dp > 1) {
		range[0] = loom__muon_shard_offset(t, n, P, dp_rank, dp);
		range[1] = loom__muon_shard_offset(t, n, P, dp_rank + 1, dp);
		nm = loom__muon_range_matrices(t, n, range, mats);
		*bytes = 4.0 * (double)loom_muonadamw_state_floats(t, n, range, mats, nm);
	} else {
		nm = loom_muon_owned(t, n, dp > 1 ? dp_rank : 0, dp, mats);
		*bytes = 4.0 * (double)(loom_muonadamw_state_floats(t, n, NULL, mats, nm) + (dp > 1 ? total : 0));
	}
	*own = (double)(range[1] - range[0]);
	*adam = 0.0, *ns_flops = 0.0, *scratch = 0.0;
	for (int i = 0; i < n; i++)
		if (t[i].opt_group != LOOM_OPT_MATRIX) {
			size_t a = LOOM_MAX(range[0], t[i].offset), b = LOOM_MIN(range[1], t[i].offset + t[i].numel);
			*adam += a < b ? (double)(b - a) : 0.0;
		}
	for (int k = 0; k < nm; k++) {
		double r = LOOM_MIN(t[mats[k]].rows, t[mats[k]].cols), c = LOOM_MAX(t[mats[k]].rows, t[mats[k]].cols);
		*ns_flops += 5.0 * (4.0 * r * r * c + 2.0 * r * r * r);
		*scratch = LOOM_MAX(*scratch, 4.0 * (double)loom_muon_scratch_floats(t[mats[k]].rows, t[mats[k]].cols));
	}
out:
	free(t), free(mats);
	return rc;
}

/* Model states, comm buffers and activations of pipeline rank s (its V chunks' blocks, global stages
 * c pp + s of lo, each a stage model with the arenas its chunk's micro-batches in flight need) of
 * data-parallel rank dp_rank of dp (the strategy's group: dp x cp); with context parallelism the model
 * holds T / cp positions of each sequence and the attention's gather scratch (its activation bytes). */
static int stage_memory(const loom_plan_config_t *pc, const loom_cluster_t *c, const table_t *tb, int dp, int tp, int pp, int s, const int *lo, int hrows, int dp_rank,
                        loom_plan_memory_t *m)
{
	const loom_model_config_t *cfg = &pc->model;
	int L = cfg->n_layer, M = pc->M, V = LOOM_MAX(pc->virtual_stages, 1), rc;
	double P = 0.0, tied, emb, largest = 0.0;
	for (int i = 0; i < tb->n; i++) /* the shard's (tp > 1: the padded vocabulary's), or the model's */
		P += tb->numel[i];
	/* the units this rank's model holds (a stage's only, with pp) */
	emb = rank_unit(tb, L, pp, V, s, lo, hrows, -1);
	for (int u = 0; u <= L; u++)
		largest = LOOM_MAX(largest, rank_unit(tb, L, pp, V, s, lo, hrows, u));
	if (pc->impl == LOOM_PLAN_LOOM && pp > 1) { /* the stage's model holds its tensors alone */
		P = 0.0;
		for (int u = -1; u <= L; u++)
			P += rank_unit(tb, L, pp, V, s, lo, hrows, u);
	}
	/* loom's layout (the model's idle gradient buffer under DDP, a pipeline rank's whole model); a
	 * shared-memory node (CPUs): a peer's shared buffers in this rank's resident set */
	int loom = pc->impl == LOOM_PLAN_LOOM, peer = c->cores > 0;
	memset(m, 0, sizeof *m);
	if (pc->impl == LOOM_PLAN_IDEAL && pp > 1)
		P = rank_params(tb, L, lo, pp, V, s, &tied);
	if (pc->zero > 0 && dp > 1 && (tp > 1 || pp > 1) && pc->impl == LOOM_PLAN_IDEAL) { /* the stage's shard's states split over dp */
		double own = ceil(P / dp);
		m->params = 4.0 * (pc->zero == 3 ? own : P);
		m->grads = 4.0 * (pc->zero == 1 ? P : own);
		m->optimizer = 8.0 * own;
	} else if (pc->zero == 0 || dp == 1) {
		m->params = m->grads = 4.0 * P, m->optimizer = 8.0 * P;
		if (dp > 1) /* DDP's gradients live in shared memory, and the reduction reads a peer's (ring: one
		             * neighbour's; measured: one peer's pages count in this rank's resident set); the
		             * model's own buffer stays, idle */
			m->comm = (loom ? 4.0 * P : 0.0) + peer * 4.0 * P + (pc->grad_reduce_bf16 ? (1 + peer) * 2.0 * P : 0.0);
	} else {
		size_t nP = (size_t)P; /* the model's, a tp shard's or a pipeline stage's (zero.c shards what it holds) */
		double own = (double)(loom__zero_shard_offset(nP, dp_rank + 1, dp) - loom__zero_shard_offset(nP, dp_rank, dp));
		m->params = 4.0 * (pc->zero == 3 ? own : P);
		m->grads = 4.0 * (pc->zero == 1 ? P : own);
		m->optimizer = 8.0 * own;
		/* shared-memory buffers a reduction reads: a peer's pages count here too, as for DDP */
		m->comm = pc->zero == 1 ? peer * 4.0 * P : (1 + peer) * 4.0 * (emb + 2.0 * largest); /* ZERO_SLOTS */
		if (pc->zero == 3) /* the gather buffers: written by the peers, read by this rank alone */
			m->comm += 4.0 * (emb + 2.0 * largest); /* ZERO_PSLOTS */
		if (pc->grad_reduce_bf16)
			m->comm += (1 + peer) * 2.0 * (pc->zero == 1 ? P : emb + 2.0 * largest);
		if (pp > 1 && pc->zero >= 2 && hrows && s >= pp - 2) /* the shared head's staging of its own */
			m->comm += (1 + peer) * 4.0 * rank_unit(tb, L, pp, V, s, lo, hrows, L);
		if (pp > 1 && pc->zero == 3) /* the stage model's own parameter buffer: freed once sharded
		                              * (loom_model_drop_params), but the start-up's peak has it */
			m->other += 4.0 * P;
	}
	if (pc->optimizer == LOOM_OPTIMIZER_MUON) { /* its state instead of AdamW's (and its own ZeRO ranges) */
		double bytes, own, adam, ns, work;
		if ((rc = muon_state(pc, tb, pp, V, s, lo, hrows, dp, dp_rank, &bytes, &own, &adam, &ns, &work)) != LOOM_OK)
			return rc;
		m->optimizer = bytes;
		m->scratch = work; /* the Newton-Schulz iterations' work buffer (the largest owned matrix's) */
		if (pc->zero > 0 && dp > 1)
			m->params = 4.0 * (pc->zero == 3 ? own : P), m->grads = 4.0 * (pc->zero == 1 ? P : own);
	}
	int cp = LOOM_MAX(pc->cp, 1), T = pc->T / cp; /* the rank's positions of a sequence */
	loom_model_opts_t o = {.B = pc->B, .T = T, .arenas = 1, .tp_size = tp > 1 ? tp : 0, .act_ckpt = pc->act_ckpt,
	                       .dtype = pc->dtype, .cp_size = cp,
	                       .sequence_parallel = pc->sequence_parallel && tp > 1 && ((long)pc->B * T) % tp == 0};
	loom_model_act_bytes_t a;
	if (pp > 1) {
		int *arenas = malloc(sizeof(int) * (size_t)V);
		if (!arenas)
			return loom_seterr(LOOM_ENOMEM, "plan: out of memory");
		if ((rc = loom__pp_chunk_arenas(plan_schedule(pc), pp, V, s, M, arenas)) < 0 ||
		    (pc->impl == LOOM_PLAN_LOOM && (rc = loom_model_act_bytes(cfg, &o, &a)) != LOOM_OK)) {
			free(arenas);
			return rc;
		}
		if (pc->impl == LOOM_PLAN_LOOM) { /* the whole model every rank creates beside its stages: an
		                                   * arena of tp positions (loom_train_model_opts: it is never
		                                   * run), no parameter or gradient buffer (the stages initialize
		                                   * their own tensors) */
			loom_model_opts_t ow = o;
			loom_model_act_bytes_t aw;
			ow.B = 1, ow.T = LOOM_MAX(tp, 1) * (cp > 1 ? 2 : 1), ow.arenas = 1;
			if ((rc = loom_model_act_bytes(cfg, &ow, &aw)) != LOOM_OK) {
				free(arenas);
				return rc;
			}
			m->other += (double)aw.total;
		}
		/* a step's tokens; per chunk (a stage model), its receive and send buffers (pp.c: 4 of B T
		 * width floats) and its activations */
		m->comm += 2.0 * 4.0 * M * pc->B * T;
		for (int c = 0; c < V; c++) {
			int g = c * pp + s;
			o.arenas = arenas[c], o.layer_lo = lo[g], o.layer_hi = lo[g + 1];
			m->comm += 4.0 * 4.0 * pc->B * T * loom_model_stream_width(cfg);
			if ((rc = loom_model_act_bytes(cfg, &o, &a)) != LOOM_OK)
				break;
			m->activations += (double)a.total;
		}
		free(arenas);
		return rc;
	}
	if ((rc = loom_model_act_bytes(cfg, &o, &a)) != LOOM_OK)
		return rc;
	m->activations = (double)a.total;
	return LOOM_OK;
}

/* A kernel maps up to this much of a file's cached pages around a page fault (fault_around_bytes). */
#define FAULT_AROUND 65536.0
/* The trainer reads about this many tokens' windows of each data set when it starts (its vocabulary
 * check, src/train/trainer.c check_vocab). */
#define CHECK_TOKENS 1000000.0

/* Bytes of shards of F bytes a rank has mapped after reading windows of wb bytes: n_check windows
 * from the start of the (shuffled or not) order that every rank reads alike, then n_rank of its own
 * of the job's n_job. In order, the span they cover, of which a rank maps its neighbours' windows too
 * while a window is smaller than what a fault maps; shuffled, the expected cover of that many random
 * windows of a fault's size each. */
static double shard_pages(double F, double wb, double n_check, double n_rank, double n_job, int shuffled)
{
	double fault = LOOM_MAX(wb, FAULT_AROUND);
	if (!(F > 0))
		return 0.0;
	if (shuffled)
		return F * (1.0 - exp(-(n_check + n_rank) * fault / F));
	return LOOM_MIN(F, LOOM_MAX(n_check * wb, LOOM_MIN(n_job * wb, n_rank * fault)));
}

/* What the run holds beside its steps: the loader's batch and the shards' pages it maps, evaluation's
 * losses and the validation shards' pages, the threads' scratch; then the process and the total. */
static void mem_total(loom_plan_memory_t *m, const loom_plan_config_t *pc, const loom_cluster_t *c, int world)
{
	double tb = pc->token_bytes == 4 ? 4.0 : 2.0;            /* bytes per token: uint16 or uint32 shards */
	double BT = (double)pc->B * pc->T, wb = tb * (BT + 1.0); /* a window: B T + 1 tokens */
	double check = ceil(CHECK_TOKENS / BT), steps = (double)LOOM_MAX(pc->steps, 0), M = LOOM_MAX(pc->M, 1);
	double dp = LOOM_MAX(pc->dp, 1);
	m->data = 2.0 * 4.0 * BT; /* the trainer's inputs and targets */
	if (pc->train_bytes > 0) {
		double W = LOOM_MAX(1.0, floor((pc->train_bytes / tb - 1.0) / BT)); /* windows per epoch */
		m->data += shard_pages(pc->train_bytes, wb, LOOM_MIN(W, check), steps * M, steps * M * dp, pc->shuffle);
	}
	m->eval = 0.0;
	if (pc->val_bytes > 0 && pc->eval_batches > 0) {
		double W = LOOM_MAX(1.0, floor((pc->val_bytes / tb - 1.0) / BT)), n = LOOM_MIN(W, pc->eval_batches);
		m->eval = 8.0 * n + 4.0 * ceil(n / dp) + shard_pages(pc->val_bytes, wb, LOOM_MIN(W, check), n, n, 0);
	}
	m->scratch += (double)LOOM_MAX(c->threads - 1, 0) * c->thread_scratch_bytes; /* (+ the optimizer's work) */
	m->overhead = c->overhead_bytes + (world > 1 ? c->comm_overhead_bytes : 0.0);
	m->total = m->params + m->grads + m->optimizer + m->activations + m->comm + m->other + m->data + m->eval +
	           m->scratch + m->overhead;
}

int loom_plan_estimate(const loom_plan_config_t *pcfg, const loom_cluster_t *c, loom_plan_t *p)
{
	loom_plan_config_t pc = *pcfg;
	const loom_model_config_t *cfg = &pc.model;
	int rc = LOOM_OK, *lo = NULL, *rows = NULL;
	double *cost = NULL;
	table_t tb_ = {0};
	const table_t *tb = &tb_;
	memset(p, 0, sizeof *p);
	pc.dp = LOOM_MAX(pc.dp, 1), pc.tp = LOOM_MAX(pc.tp, 1), pc.pp = LOOM_MAX(pc.pp, 1), pc.M = LOOM_MAX(pc.M, 1);
	pc.cp = LOOM_MAX(pc.cp, 1);
	if (!(pc.bucket_mb > 0))
		pc.bucket_mb = 25.0;
	/* N: a micro-batch's positions; with context parallelism a rank computes Nr = N / cp of them (Tl of
	 * each sequence), and the strategy's group is dg = dp x cp */
	int dp = pc.dp, tp = pc.tp, pp = pc.pp, M = pc.M, L = cfg->n_layer, N = pc.B * pc.T, cp = pc.cp;
	int Tl = pc.T / cp, Nr = pc.B * Tl, dg = dp * cp;
	int V = LOOM_MAX(pc.virtual_stages, 1), G = pp * V; /* global pipeline stages */
	loom_pp_schedule_t kind = plan_schedule(&pc);
	p->cfg = pc;
	p->world = dp * cp * tp * pp;
	if ((rc = loom_model_config_check(cfg)) != LOOM_OK)
		return rc;
	if (pc.B < 1 || pc.T < 1 || pc.T > cfg->seq_len)
		return loom_seterr(LOOM_EINVAL, "plan: batch %d x %d (T must be 1..%d, the model's maximum)", pc.B, pc.T,
		                   cfg->seq_len);
	if (tp > 1 && (rc = loom_model_tp_check(cfg, tp)) != LOOM_OK)
		return rc;
	if (cp > 1 && (rc = loom_cp_check(pc.T, cp)) != LOOM_OK)
		return loom_seterr(rc, "plan: --cp %d: %s", cp, loom_errmsg());
	if (pp > L)
		return loom_seterr(LOOM_EINVAL, "plan: --pp %d for a model of %d layers (every stage needs a layer)", pp, L);
	if ((pp > 1 || V > 1) && (rc = loom_pp_check(cfg, loom__pp_schedule_name(kind), pp, V, M)) != LOOM_OK)
		return loom_seterr(rc, "plan: %s", loom_errmsg());
	if (pc.zero < 0 || pc.zero > 3)
		return loom_seterr(LOOM_EINVAL, "plan: ZeRO stage %d (0..3)", pc.zero);
	if (pc.zero > 0 && dg < 2)
		return loom_seterr(LOOM_EINVAL, "plan: ZeRO %d needs more than one data-parallel rank (dp x cp)", pc.zero);
	if (pc.optimizer == LOOM_OPTIMIZER_MUON && tp > 1) /* as loom train refuses them */
		return loom_seterr(LOOM_EINVAL, "plan: --optimizer muon with --tp %d: a tensor-parallel shard of a matrix "
		                   "cannot be orthogonalized alone", tp);
	if (pc.optimizer == LOOM_OPTIMIZER_MUON && pc.zero > 0 && pp > 1)
		return loom_seterr(LOOM_EINVAL, "plan: --optimizer muon with --zero %d and --pp %d: MuonAdamW's matrices "
		                   "are not sharded over a pipeline stage's data-parallel ranks yet", pc.zero, pp);
	if (pc.optimizer != LOOM_OPTIMIZER_ADAMW && pc.optimizer != LOOM_OPTIMIZER_MUON)
		return loom_seterr(LOOM_EINVAL, "plan: optimizer %d (adamw or muon)", pc.optimizer);
	if (c->nodes > 0 && c->ranks_per_node > 0 && p->world > c->nodes * c->ranks_per_node)
		return loom_seterr(LOOM_EINVAL, "plan: %d ranks (dp %d x cp %d x tp %d x pp %d) on a cluster of %d x %d",
		                   p->world, dp, cp, tp, pp, c->nodes, c->ranks_per_node);
	if (!(c->peak_flops_fp32 > 0) || !(c->efficiency > 0))
		return loom_seterr(LOOM_EINVAL, "plan: the cluster has no peak FLOP/s or efficiency");

	p->params = (double)loom_model_num_params(cfg);
	p->flops_per_token = loom_model_flops_per_token(cfg, pc.T);
	p->tokens_per_step = (double)N * M * dp;
	p->flops_per_step = p->flops_per_token * p->tokens_per_step;
	p->peak_flops = pc.dtype == LOOM_COMPUTE_BF16 && c->peak_flops_bf16 > 0 ? c->peak_flops_bf16 : c->peak_flops_fp32;

	/* The rate of one rank: its peak at the efficiency, its share of the node's cores when the ranks'
	 * threads are more than the cores (CPUs). */
	double share = 1.0;
	if (c->cores > 0) {
		int local = LOOM_MIN(p->world, c->ranks_per_node > 0 ? c->ranks_per_node : p->world);
		double want = (double)local * LOOM_MAX(c->threads, 1);
		if (want > c->cores)
			p->oversubscribed = 1;
		if (want + c->background_load > c->cores)
			share = c->cores / (want + c->background_load);
	}
	p->cpu_share = share;
	/* small matrices reach less of the GEMM's peak: C' / (C' + gemm_half_size), C' = C / tp; on a CPU
	 * node, ranks running at once share its memory bus and caches (corun_efficiency when every core
	 * runs one, in proportion between) */
	double Cs = (double)cfg->n_embd / tp, size = c->gemm_half_size > 0 ? Cs / (Cs + c->gemm_half_size) : 1.0;
	if (c->corun_efficiency > 0 && c->cores > 1) {
		int local = LOOM_MIN(p->world, c->ranks_per_node > 0 ? c->ranks_per_node : p->world);
		double busy = LOOM_MIN((double)c->cores, local * (double)LOOM_MAX(c->threads, 1) + c->background_load);
		share *= 1.0 - (1.0 - c->corun_efficiency) * LOOM_MAX(0.0, busy - 1.0) / (c->cores - 1.0);
	}
	double rate = p->peak_flops * c->efficiency * size * share, mem_bw = c->memory_bw * share;
	/* measured on this machine (plan_calib.c): the block's matmuls at width C' and the attention kernel
	 * at the model's head size and T, instead of the peak's efficiency and width factor */
	int hd = cfg->head_dim > 0 ? cfg->head_dim : cfg->n_embd / LOOM_MAX(cfg->n_head, 1);
	double mm_meas = loom_calib_mm_rate(&c->calib, pc.dtype, Cs);
	/* (a context-parallel rank runs the kernel on its chunks of T / cp rows: the rate of that length) */
	double att_meas = loom_calib_attn_rate(&c->calib, hd, pc.T / LOOM_MAX(pc.cp, 1));
	if (mm_meas > 0)
		rate = mm_meas * share;
	double att_rate = att_meas > 0 ? att_meas * share : 0.0;
	if (c->node_memory_bw > 0) { /* the node's memory bus, shared by its ranks */
		int local = LOOM_MIN(p->world, c->ranks_per_node > 0 ? c->ranks_per_node : p->world);
		mem_bw = LOOM_MIN(mem_bw, c->node_memory_bw / local);
	}

	if ((rc = table_read(cfg, tp, &tb_)) != LOOM_OK)
		goto out;
	for (int i = 0; i < tb->n; i++)
		p->shard_params += tb->numel[i];
	/* Stages (one with pp 1) and the head's shares, as the executor splits them. */
	if (!(lo = malloc(sizeof(int) * (size_t)(G + 1))) || !(rows = calloc((size_t)M, sizeof(int))) ||
	    !(cost = malloc(sizeof(double) * 3 * (size_t)G * M))) {
		rc = loom_seterr(LOOM_ENOMEM, "plan: out of memory");
		goto out;
	}
	int hrows = 0;
	if (pp > 1) {
		/* as the executor: on the rank's Tl positions of each sequence */
		if ((rc = loom_pp_stages(cfg, pc.B, Tl, G, pc.pp_head_split, lo, &hrows)) != LOOM_OK ||
		    (rc = loom__pp_head_rows(cfg, kind, Tl, Nr, pp, V, M, lo, hrows,
		                             pc.pp_head_split == 0.0 && (long)G * M <= 512, rows)) != LOOM_OK)
			goto out;
	} else {
		lo[0] = 0, lo[1] = L;
	}

	/* Memory: every stage (the largest is reported), and global rank 0's (stage 0, dp rank 0). */
	for (int s = 0; s < pp; s++) {
		loom_plan_memory_t m;
		if ((rc = stage_memory(&pc, c, &tb_, dg, tp, pp, s, lo, hrows, dg - 1, &m)) != LOOM_OK)
			goto out;
		mem_total(&m, &pc, c, p->world);
		if (s == 0 || m.total > p->memory.total)
			p->memory = m, p->stage = s;
	}
	if ((rc = stage_memory(&pc, c, &tb_, dg, tp, pp, 0, lo, hrows, 0, &p->memory_rank0)) != LOOM_OK)
		goto out;
	mem_total(&p->memory_rank0, &pc, c, p->world);

	/* Compute per micro-batch: the model's FLOPs per position of the whole model (with recomputation),
	 * split over tp; the elementwise kernels' traffic in proportion to the kept activations. */
	double C = cfg->n_embd, fpt = p->flops_per_token, extra = 0.0, fatt = 0.0, xmm = 0.0, xatt = 0.0;
	for (int l = 0; l < L; l++) {
		double attn = loom_model_block_attn_flops(cfg, l, pc.T);
		fatt += attn;
		extra += attn / 6.0; /* the fused attention's backward makes the scores again: Q K^T, 2 of 12 */
		if (pc.act_ckpt == LOOM_ACT_CKPT_BLOCKS) /* every block's forward again */
			xmm += (loom_model_unit_flops(cfg, l, pc.T) - attn) / 3.0, xatt += attn / 3.0;
		else if (pc.act_ckpt == LOOM_ACT_CKPT_SELECTIVE) /* the attention's forward again: 4 of 12 */
			xatt += attn / 3.0;
	}
	extra += xmm + xatt;
	double recompute = 1.0 + extra / fpt;
	/* (the elementwise kernels run over every activation whatever is kept: the traffic of a run without
	 * checkpointing, times the recomputation) */
	loom_model_opts_t o1 = {.B = pc.B, .T = Tl, .arenas = 1, .tp_size = tp > 1 ? tp : 0, .dtype = pc.dtype,
	                        .cp_size = cp};
	loom_model_act_bytes_t a1;
	if ((rc = loom_model_act_bytes(cfg, &o1, &a1)) != LOOM_OK)
		goto out;
	/* (a context-parallel rank's Nr positions cost the sequence's mean per token: the layout,
	 * loom_cp_chunks, gives every rank the same share of the attention, windows included when the
	 * sequence divides into enough chunks) */
	double mm_mb = fpt * Nr * recompute / tp / rate; /* seconds of matmuls per micro-batch, whole model */
	if (att_rate > 0) /* the attention at its own measured rate (its backward's scores included) */
		mm_mb = (fpt - fatt + xmm) * Nr / tp / rate + (fatt + xatt) * Nr / tp / att_rate;
	double el_mb = mem_bw > 0 ? c->elementwise_bytes_per_act * (double)(a1.kept + a1.head) * recompute / mem_bw : 0.0;
	double slow = (mm_mb + el_mb) / (fpt * Nr / tp); /* seconds per model FLOP of a micro-batch */

	/* tp: Megatron's f and g, two all-reduces of B T C floats per block in forward and two in backward
	 * (and the forward's two again when blocks are recomputed), the embedding's and the head's one each;
	 * on the training thread, so all exposed. With sequence parallelism, in all-reduces' bytes (one is a
	 * reduce-scatter and an all-gather): 2 forward, 3 backward (4 all-gathers, 2 reduce-scatters), 1.5
	 * for a recompute (2 all-gathers, 1 reduce-scatter). */
	double tp_bw, tp_lat, tp_mb = 0.0;
	int Ls = 0; /* the most blocks a rank runs */
	for (int s = 0; s < pp; s++) {
		int n = 0;
		for (int c = 0; c < V; c++)
			n += lo[c * pp + s + 1] - lo[c * pp + s];
		Ls = LOOM_MAX(Ls, n);
	}
	p->cross_node_tp = group_link(c, tp, 1, &tp_bw, &tp_lat);
	if (tp > 1) { /* per micro-batch on the whole model (tp_mb), and on this rank: its stage's blocks */
		int sp = pc.sequence_parallel && Nr % tp == 0;
		double ck = pc.act_ckpt == LOOM_ACT_CKPT_BLOCKS ? (sp ? 1.5 : 2.0) : 0.0, n = 4.0 * Nr * C;
		double one = link_time(loom_plan_ring_allreduce_bytes(n, tp), 2 * (tp - 1), tp_bw, tp_lat);
		double blk = sp ? 5.0 : 4.0, count = (blk + ck) * Ls + 2;
		tp_mb = ((blk + ck) * L + 2) * one;
		p->tp.bytes = M * count * loom_plan_ring_allreduce_bytes(n, tp);
		p->tp.time_s = p->tp.exposed_s = M * count * one;
	}
	/* cp: per block the keys and values of the sequence reach every rank in the forward, again in the
	 * backward with their gradients going back (the same bytes), once more where the attention is
	 * recomputed (blocks, selective). The all-gather form (cp_gather) runs them as blocking collectives
	 * on the training thread: all exposed. The ring passes one rank's pack (B T/cp 2 KV floats) per step
	 * (cp - 1 steps forward; backward the keys again and their gradients, 2 cp - 1 packs) while the step's
	 * share of the layer's attention (1/cp of it) computes: a step exposes what its transfers take beyond
	 * that, and the gradients' last trip home is exposed. The group is cp ranks tp apart. cp_mb: the
	 * exposed time of a micro-batch through the whole model, cp_fwd its forward's. */
	double cp_bw, cp_lat, cp_mb = 0.0, cp_fwd = 0.0;
	group_link(c, cp, tp, &cp_bw, &cp_lat);
	if (cp > 1) {
		double g = loom_plan_cp_bytes(cfg, pc.B, pc.T, cp, tp), ck = pc.act_ckpt != LOOM_ACT_CKPT_NONE;
		double one = link_time(g, cp - 1, cp_bw, cp_lat), pack = link_time(g / (cp - 1), 1, cp_bw, cp_lat), link;
		if (pc.cp_gather) {
			cp_mb = (3.0 + ck) * L * one, cp_fwd = L * one, link = (3.0 + ck) * one;
		} else {
			for (int l = 0; l < L; l++) { /* the layer's attention products on this rank, forward */
				double att = (loom_model_unit_flops(cfg, l, pc.T) - loom_model_unit_flops(cfg, l, 0)) * Nr / 3.0 / tp * slow;
				double f = (cp - 1) * LOOM_MAX(0.0, pack - att / cp);
				cp_fwd += f;
				cp_mb += f * (1.0 + ck) + (cp - 1) * LOOM_MAX(0.0, 2.0 * pack - 2.0 * att / cp) + pack;
			}
			link = ((cp - 1) * (1.0 + ck) + (2.0 * cp - 1)) * pack;
		}
		p->cp.bytes = M * (3.0 + ck) * Ls * g;
		p->cp.time_s = M * Ls * link;
		p->cp.exposed_s = M * cp_mb * Ls / L;
	}

	/* The step's compute and pipeline: stage costs in FLOPs to seconds, simulated. */
	double span, t_bwd_last;
	if (pp > 1) {
		size_t PM = (size_t)G * M; /* per global stage and micro-batch */
		double pp_bw, pp_lat, send;
		loom__pp_head_costs(cfg, Tl, Nr, G, M, lo, rows, cost, cost + PM, cost + 2 * PM);
		for (int g = 0; g < G; g++) {
			double blocks = (double)(lo[g + 1] - lo[g]) / L;
			for (int m = 0; m < M; m++) {
				size_t k = (size_t)g * M + m;
				cost[k] *= slow / tp, cost[PM + k] *= slow / tp, cost[2 * PM + k] *= slow / tp;
				cost[k] += tp_mb * blocks / 2, cost[2 * PM + k] += tp_mb * blocks / 2;
				cost[k] += cp_fwd * blocks, cost[2 * PM + k] += (cp_mb - cp_fwd) * blocks;
			}
		}
		if ((rc = loom__pp_simulate_v(kind, pp, V, M, cost, cost + PM, cost + 2 * PM, &span, &p->bubble)) != LOOM_OK)
			goto out;
		p->bubble_theory = loom__pp_bubble_theory_v(kind, pp, V, M);
		/* sends: one activation forward and one gradient back per micro-batch and boundary, posted ahead
		 * and overlapped, but the pipe's fill and drain wait for 2 (P-1) of them */
		group_link(c, 2, tp * cp * dp, &pp_bw, &pp_lat);
		double act = 4.0 * Nr * loom_model_stream_width(cfg);
		if (tp > 1 && pc.sequence_parallel && Nr % tp == 0)
			act /= tp; /* each tp rank sends its rows only */
		send = link_time(act, 1, pp_bw, pp_lat);
		p->pp.bytes = 2.0 * M * V * act; /* interleaved: every chunk's boundary */
		p->pp.time_s = 2.0 * M * V * send;
		p->pp.exposed_s = 2.0 * (pp - 1) * send;
		/* the tied embedding's two shares summed by the first and last stage after backward */
		double tied;
		stage_params(tb, L, lo[G - 1], L, 0, &tied);
		if (tied > 0) {
			double t = link_time(loom_plan_ring_allreduce_bytes(4.0 * tied, 2), 2, pp_bw, pp_lat);
			p->pp.bytes += loom_plan_ring_allreduce_bytes(4.0 * tied, 2), p->pp.time_s += t, p->pp.exposed_s += t;
		}
		t_bwd_last = cost[2 * PM + (size_t)M - 1]; /* global stage 0's last backward (M-1) ends the step */
	} else {
		span = M * ((mm_mb + el_mb) + tp_mb + cp_mb);
		t_bwd_last = 2.0 / 3.0 * (mm_mb + el_mb) + (cp_mb - cp_fwd);
	}
	p->flops_per_rank_step = p->flops_per_step * recompute / (dp * cp * tp * pp);

	/* The optimizer: AdamW reads parameters, gradients, m, v and writes three of them (28 bytes a
	 * parameter it owns), the gradient norm reads the gradients once more. MuonAdamW: that for its AdamW
	 * floats; per owned matrix float the momentum's traffic (about as much) and the Newton-Schulz
	 * iterations' matmuls at the GEMM's rate. */
	double owned = pc.zero > 0 ? p->memory.optimizer / 8.0 : p->memory.params / 4.0;
	p->optimizer_s = mem_bw > 0 ? 32.0 * owned / mem_bw : 0.0;
	if (c->calib.adamw > 0) /* measured alone; ranks that share the memory bus as the bandwidth says */
		p->optimizer_s = owned / c->calib.adamw * (mem_bw > 0 && c->memory_bw > 0 ? c->memory_bw / mem_bw : 1.0);
	if (pc.optimizer == LOOM_OPTIMIZER_MUON) {
		double bytes, own, adam, ns, work;
		if ((rc = muon_state(&pc, tb, pp, V, p->stage, lo, hrows, dg, 0, &bytes, &own, &adam, &ns, &work)) != LOOM_OK)
			goto out;
		p->optimizer_s = (mem_bw > 0 ? 32.0 * (bytes / 4.0 - adam) / mem_bw : 0.0) + ns / rate;
	}

	/* dp: DDP averages the gradient buckets during the last micro-batch's backward; ZeRO reduce-scatters
	 * per unit (stage 1 on the last micro-step, 2 and 3 on every one), gathers the updated parameters
	 * after the step (1, 2) or every unit before use (3, prefetching the next: the first one exposed). */
	double dp_bw, dp_lat, gb = pc.grad_reduce_bf16 ? 0.5 : 1.0;
	p->cross_node_dp = group_link(c, dg, tp, &dp_bw, &dp_lat); /* the dp x cp group: cp, then dp, from tp up */
	if (dg > 1) {
		int dp = dg; /* the strategy's group (dp x cp) below */
		enum { MAXB = 4096 };
		double sizes[MAXB], total;
		if (pc.zero == 0) {
			int nb;
			if (pp > 1 || tp > 1) { /* the stage's (shard's) gradients, in buckets */
				double g = 4.0 * (pp > 1 ? rank_params(tb, L, lo, pp, V, p->stage, &total) : p->shard_params);
				nb = 0;
				for (double left = g, lim = LOOM_MIN(1.0, pc.bucket_mb) * MIB; left > 0 && nb < MAXB;
				     lim = pc.bucket_mb * MIB)
					sizes[nb++] = LOOM_MIN(left, lim), left -= LOOM_MIN(left, lim);
			} else {
				nb = ddp_buckets(tb, pc.bucket_mb, LOOM_MIN(1.0, pc.bucket_mb), sizes, MAXB);
			}
			/* GPT-2's tied wte is final only after the embedding's backward: the last bucket waits */
			p->dp.exposed_s = overlap(sizes, nb, t_bwd_last, dp_bw, dp_lat, dp, gb, &p->dp.time_s);
			for (int k = 0; k < nb; k++)
				p->dp.bytes += loom_plan_ring_allreduce_bytes(sizes[k] * gb, dp);
		} else {
			double Pb = 4.0 * (tp > 1 || pp > 1 ? rank_params(tb, L, lo, pp, V, p->stage, &total) : p->params);
			double rs = (dp - 1.0) / dp * Pb * gb, ag = (dp - 1.0) / dp * Pb;
			double t_rs = link_time(rs, dp - 1, dp_bw, dp_lat), t_ag = link_time(ag, dp - 1, dp_bw, dp_lat);
			double emb = unit_bytes(cfg, -1) / Pb, n_rs = pc.zero == 1 ? 1 : M;
			sizes[0] = 0;
			p->dp.bytes = n_rs * rs + (pc.zero == 3 ? 2.0 * M * ag : ag);
			p->dp.time_s = n_rs * t_rs + (pc.zero == 3 ? 2.0 * M * t_ag : t_ag);
			/* per micro-step: the embedding unit's reduce-scatter comes last; stage 3's first gather of
			 * forward and backward wait; everything else overlaps unless it outlasts the compute */
			double exp = n_rs * emb * t_rs + (pc.zero == 3 ? 2.0 * M * t_ag / (L + 2) : t_ag);
			double hide = span - exp;
			p->dp.exposed_s = LOOM_MAX(exp, p->dp.time_s - LOOM_MAX(hide, 0.0));
		}
	}
	/* Oversubscribed (more ranks' threads than cores): a rank idle in the pipeline's bubble leaves its
	 * core to the others, so the step is the larger of a rank's busy time and the schedule's span at a
	 * whole core's speed (a work-conserving scheduler's two bounds), not the span at the shared speed. */
	double span_step = span;
	if (pp > 1 && p->cpu_share < 1.0)
		span_step = LOOM_MAX(span * (1.0 - p->bubble), span * p->cpu_share);
	p->step_time_s = span_step + p->optimizer_s + p->dp.exposed_s + p->pp.exposed_s;
	/* one rank's busy time: the span without its tp all-reduces and its share of the bubble */
	p->compute_s = LOOM_MAX(0.0, span * (1.0 - p->bubble) - p->tp.exposed_s - p->cp.exposed_s) + p->optimizer_s;
	p->tokens_per_s = p->tokens_per_step / p->step_time_s;
	p->mfu = p->flops_per_step / (p->step_time_s * p->world * p->peak_flops);
	if (pc.tokens > 0) {
		p->steps = ceil(pc.tokens / p->tokens_per_step);
		p->wall_s = p->steps * p->step_time_s;
		p->cost = p->wall_s / 3600.0 * p->world * c->price_rank_hour;
	}
	double limit = c->memory_bytes;
	if (c->memory_shared) /* the node's memory, shared by the ranks on it */
		limit /= LOOM_MIN(p->world, c->ranks_per_node > 0 ? c->ranks_per_node : p->world);
	p->memory_limit = limit;
	p->fits = !(limit > 0) || p->memory.total - p->memory.data <= limit; /* file pages are reclaimable */
	p->headroom = limit > 0 ? 1.0 - (p->memory.total - p->memory.data) / limit : 0.0;
out:
	free(lo), free(rows), free(cost);
	table_free(&tb_);
	return rc;
}

/* ---- the search ----------------------------------------------------------------------------------- */

static int by_time(const void *a, const void *b)
{
	const loom_plan_t *x = a, *y = b;
	if (x->fits != y->fits)
		return y->fits - x->fits;
	return x->step_time_s < y->step_time_s ? -1 : x->step_time_s > y->step_time_s;
}

int loom_plan_search(const loom_plan_config_t *base, const loom_cluster_t *c, int ranks, loom_plan_t *out, int cap,
                     int *n, int *total)
{
	const loom_model_config_t *cfg = &base->model;
	long long rows = (long long)LOOM_MAX(base->M, 1) * LOOM_MAX(base->dp, 1); /* micro-batches per step, all dp */
	int count = 0, fit = 0, rpn = c->ranks_per_node > 0 ? c->ranks_per_node : ranks;
	loom_plan_t *all = NULL;
	size_t have = 0;
	*n = *total = 0;
	for (int tp = 1; tp <= ranks; tp++) {
		if (ranks % tp || (tp > 1 && loom_model_tp_check(cfg, tp) != LOOM_OK) || tp > rpn)
			continue;
		for (int pp = 1; pp <= ranks / tp; pp++) {
			if ((ranks / tp) % pp || pp > cfg->n_layer)
				continue;
			/* context parallel: any cp the sequence length divides into 2 cp chunks */
			for (int cp = 1; cp <= ranks / tp / pp; cp++) {
				if ((ranks / tp / pp) % cp || (cp > 1 && loom_cp_check(base->T, cp) != LOOM_OK))
					continue;
				int dp = ranks / tp / pp / cp;
				if (rows % dp)
					continue; /* the step's micro-batches do not divide over dp */
				for (int zero = 0; zero <= 3; zero++) {
					if (zero > 0 && dp * cp < 2)
						continue;
					/* the pipeline's schedules (sc): 0 1F1B, 1 GPipe, 2-4 interleaved with V = sc chunks per
					 * rank (the estimate refuses what the schedule cannot run: pp V > layers, M not a multiple
					 * of pp); sequence parallelism with tp, when it divides a micro-batch's positions */
					for (int ck = 0; ck <= 2; ck++)
						for (int sc = 0; sc <= (pp > 1 ? 4 : 0); sc++)
							for (int sp = 0; sp <= (tp > 1 && ((long)base->B * (base->T / cp)) % tp == 0); sp++) {
								loom_plan_config_t pc = *base;
								loom_plan_t p;
								pc.dp = dp, pc.tp = tp, pc.pp = pp, pc.zero = zero, pc.M = (int)(rows / dp);
								pc.cp = cp;
								pc.act_ckpt = (loom_act_ckpt_t)ck, pc.schedule_gpipe = sc == 1;
								pc.virtual_stages = sc >= 2 ? sc : 0, pc.sequence_parallel = sp;
								if (loom_plan_estimate(&pc, c, &p) != LOOM_OK)
									continue;
								if ((size_t)count == have) {
									size_t want = have ? 2 * have : 64;
									loom_plan_t *g = realloc(all, want * sizeof *g);
									if (!g) {
										free(all);
										return loom_seterr(LOOM_ENOMEM, "plan: out of memory");
									}
									all = g, have = want;
								}
								all[count++] = p;
								fit += p.fits;
							}
				}
			}
		}
	}
	if (count)
		qsort(all, (size_t)count, sizeof *all, by_time);
	for (int k = 0; k < count && k < cap; k++)
		out[k] = all[k];
	free(all);
	*n = fit, *total = count;
	return LOOM_OK;
}
