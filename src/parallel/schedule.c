/* schedule.c: pipeline schedules as data (GPipe, 1F1B, interleaved 1F1B), the partition of the
 * layers into stages balanced by FLOPs (with a head heavier than the blocks shared between the last
 * two stages by positions), and a discrete-event simulation of a schedule, which gives the bubble to
 * expect from the stages' times and picks the first and last micro-batch's share of a shared head.
 *
 * A schedule is a row of a table: its name, the generator of one rank's order of forwards and
 * backwards, and what it promises (the ideal bubble), so the code that runs a schedule and the text
 * that describes it cannot disagree. A rank holds V model chunks (V = 1 but for interleaved); chunk c
 * of rank s is global stage c P + s. Invariants every generator keeps (the pipeline executor relies
 * on them; tests/test_pp.c checks them and deadlock freedom by simulation): each (chunk, micro-batch)'s
 * forward comes before its backward on a rank; every rank runs its forwards in one order of
 * (chunk, mb) pairs common to all ranks, and its backwards in the same order with the chunks reversed
 * (so each link's messages arrive in the order they are sent, and the last backward, where
 * data-parallel gradient sync happens, is micro-batch M-1 of chunk 0 on every rank); with V = 1 the
 * micro-batches in flight are consecutive, so micro-batch mb may use arena mb % arenas.
 *
 * Interleaved 1F1B (Megatron-LM's forward_backward_pipelining_with_interleaving, Narayanan et al.
 * 2021): the forwards go through the micro-batches in groups of P, each group through chunk 0, then
 * chunk 1, ..., chunk V-1 (the k-th forward: chunk (k / P) % V, micro-batch (k / (P V)) P + k % P);
 * the k-th backward takes the k-th pair with the chunk reversed. Rank s first runs
 * 2 (P - s - 1) + (V - 1) P warm-up forwards (at most M V), then one forward and one backward in
 * turn, then the remaining backwards. Megatron requires M % P == 0 with groups of P (a last group of
 * fewer than P micro-batches leaves the ranks waiting: a chunk c+1 forward of it needs the chunk c
 * forward of the same micro-batch to have gone round all P ranks, which P-1 others' work no longer
 * covers); loom requires the same, and then equal stages idle exactly (P-1)/(V M + P-1). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "loom/train.h"
#include "parallel/pp.h"

/* GPipe: every forward, then every backward. */
static void plan_gpipe(int P, int V, int s, int M, loom__pp_action_t *out)
{
	(void)P, (void)V, (void)s;
	for (int j = 0; j < M; j++)
		out[j] = (loom__pp_action_t){'F', j, 0}, out[M + j] = (loom__pp_action_t){'B', j, 0};
}

/* 1F1B (PipeDream-flush, Megatron): P-s-1 warm-up forwards, then one forward and one backward in
 * turn, then the remaining backwards; a stage holds at most P-s micro-batches. */
static void plan_1f1b(int P, int V, int s, int M, loom__pp_action_t *out)
{
	int warm = LOOM_MIN(P - s - 1, M), n = 0, f = 0, b = 0;
	(void)V;
	while (f < warm)
		out[n++] = (loom__pp_action_t){'F', f++, 0};
	while (f < M) {
		out[n++] = (loom__pp_action_t){'F', f++, 0};
		out[n++] = (loom__pp_action_t){'B', b++, 0};
	}
	while (b < M)
		out[n++] = (loom__pp_action_t){'B', b++, 0};
}

/* The k-th forward (op 'F') or backward ('B') of interleaved 1F1B: micro-batches in groups of P, each
 * group through the chunks in turn (backwards: in reverse). */
static loom__pp_action_t interleaved_at(char op, int k, int P, int V)
{
	int c = k / P % V;
	return (loom__pp_action_t){op, k / (P * V) * P + k % P, op == 'F' ? c : V - 1 - c};
}

static void plan_interleaved(int P, int V, int s, int M, loom__pp_action_t *out)
{
	int total = M * V, warm = LOOM_MIN(2 * (P - s - 1) + (V - 1) * P, total), n = 0;
	for (int k = 0; k < warm; k++)
		out[n++] = interleaved_at('F', k, P, V);
	for (int k = 0; k < total - warm; k++) {
		out[n++] = interleaved_at('F', warm + k, P, V);
		out[n++] = interleaved_at('B', k, P, V);
	}
	for (int k = total - warm; k < total; k++)
		out[n++] = interleaved_at('B', k, P, V);
}

static const struct {
	const char *name;
	void (*plan)(int P, int V, int s, int M, loom__pp_action_t *out);
	int chunks;  /* V must be 1 (1), or >= 2 (2) */
	const char *what;
} schedules[LOOM_PP_SCHEDULES] = {
	[LOOM_PP_GPIPE] = {"gpipe", plan_gpipe, 1, "all M forwards, then all M backwards; M micro-batches stored"},
	[LOOM_PP_1F1B] = {"1f1b", plan_1f1b, 1, "P-s-1 warm-up forwards, then one forward and one backward in turn; "
	                                        "at most P micro-batches stored"},
	[LOOM_PP_INTERLEAVED] = {"interleaved", plan_interleaved, 2,
	                         "1f1b over V model chunks per rank (--virtual-stages V >= 2), micro-batches in groups "
	                         "of P; fill and drain 1/V of 1f1b's, up to (V-1)P + 2(P-1) + 1 chunk activations stored"},
};

int loom__pp_schedule_parse(const char *name, loom_pp_schedule_t *kind)
{
	for (int k = 0; k < LOOM_PP_SCHEDULES; k++)
		if (name && !strcmp(name, schedules[k].name)) {
			*kind = (loom_pp_schedule_t)k;
			return LOOM_OK;
		}
	return loom_seterr(LOOM_EINVAL, "pipeline schedule '%s' is not one of gpipe (%s), 1f1b (%s), interleaved (%s)",
	                   name ? name : "", schedules[LOOM_PP_GPIPE].what, schedules[LOOM_PP_1F1B].what,
	                   schedules[LOOM_PP_INTERLEAVED].what);
}

const char *loom__pp_schedule_name(loom_pp_schedule_t kind)
{
	return kind >= 0 && kind < LOOM_PP_SCHEDULES ? schedules[kind].name : "?";
}

int loom__pp_check(loom_pp_schedule_t kind, int P, int V, int M)
{
	if (kind < 0 || kind >= LOOM_PP_SCHEDULES)
		return loom_seterr(LOOM_EINVAL, "pipeline: schedule %d is not one of gpipe, 1f1b, interleaved", (int)kind);
	if (P < 1 || M < 1 || V < 1)
		return loom_seterr(LOOM_EINVAL, "pipeline: %d stages (--pp), %d virtual stages (--virtual-stages) and %d "
		                   "micro-batches (--micro-batches) must all be >= 1", P, V, M);
	if (schedules[kind].chunks == 1 && V != 1)
		return loom_seterr(LOOM_EINVAL, "pipeline: --virtual-stages %d needs --pp-schedule interleaved (schedule "
		                   "%s runs one model chunk per rank)", V, schedules[kind].name);
	if (schedules[kind].chunks == 2 && V < 2)
		return loom_seterr(LOOM_EINVAL, "pipeline: --pp-schedule interleaved needs --virtual-stages V >= 2 model "
		                   "chunks per rank (got %d; with one chunk use --pp-schedule 1f1b)", V);
	if (kind == LOOM_PP_INTERLEAVED && M % P != 0)
		return loom_seterr(LOOM_EINVAL, "pipeline: --pp-schedule interleaved runs the micro-batches in groups of "
		                   "--pp %d, so --micro-batches %d must be a multiple of %d (e.g. %d)", P, M, P,
		                   (M / P + 1) * P);
	return LOOM_OK;
}

int loom__pp_plan_v(loom_pp_schedule_t kind, int P, int V, int s, int M, loom__pp_action_t *out)
{
	int rc, held = 0, most = 0;
	if ((rc = loom__pp_check(kind, P, V, M)) != LOOM_OK)
		return rc;
	if (s < 0 || s >= P)
		return loom_seterr(LOOM_EINVAL, "pipeline: rank %d of %d stages", s, P);
	schedules[kind].plan(P, V, s, M, out);
	for (int i = 0; i < 2 * M * V; i++) {
		held += out[i].op == 'F' ? 1 : -1;
		most = LOOM_MAX(most, held);
	}
	return most;
}

int loom__pp_chunk_arenas(loom_pp_schedule_t kind, int P, int V, int s, int M, int *arenas)
{
	loom__pp_action_t *plan;
	int rc, *held, sum = 0;
	if ((rc = loom__pp_check(kind, P, V, M)) != LOOM_OK)
		return rc;
	plan = loom__malloc(sizeof *plan * 2 * (size_t)M * V);
	held = loom__calloc((size_t)V, sizeof *held);
	if (!plan || !held) {
		free(plan), free(held);
		return loom_seterr(LOOM_ENOMEM, "pipeline: out of memory planning a schedule");
	}
	if ((rc = loom__pp_plan_v(kind, P, V, s, M, plan)) >= 0) {
		for (int c = 0; c < V; c++)
			arenas[c] = 0;
		for (int i = 0; i < 2 * M * V; i++) {
			int c = plan[i].chunk;
			held[c] += plan[i].op == 'F' ? 1 : -1;
			arenas[c] = LOOM_MAX(arenas[c], held[c]);
		}
		for (int c = 0; c < V; c++)
			sum += arenas[c];
		rc = sum;
	}
	free(plan), free(held);
	return rc;
}

int loom__pp_plan(loom_pp_schedule_t kind, int P, int s, int M, loom__pp_action_t *out)
{
	return loom__pp_plan_v(kind, P, 1, s, M, out);
}

double loom__pp_bubble_theory_v(loom_pp_schedule_t kind, int P, int V, int M)
{
	if (loom__pp_check(kind, P, V, M) != LOOM_OK)
		return NAN;
	/* every rank idles (P-1)/V of a micro-batch's forward and backward while the pipe fills and
	 * drains, and computes M of them: V = 1 for GPipe and 1F1B, which only store differently */
	return (double)(P - 1) / ((double)V * M + P - 1);
}

double loom__pp_bubble_theory(loom_pp_schedule_t kind, int P, int M)
{
	return loom__pp_bubble_theory_v(kind, P, 1, M);
}

int loom__pp_simulate_v(loom_pp_schedule_t kind, int P, int V, int M, const double *f, const double *h,
                        const double *b, double *span_out, double *bubble)
{
	int rc, n = 2 * M * V; /* actions per rank */
	if ((rc = loom__pp_check(kind, P, V, M)) != LOOM_OK)
		return rc;
	size_t G = (size_t)P * V, GM = G * M;
	loom__pp_action_t *plan = loom__malloc(sizeof *plan * (size_t)n * P);
	double *fdone = loom__malloc(sizeof(double) * 2 * GM), *bdone = fdone + GM;
	double *free_at = loom__calloc((size_t)P, sizeof(double)), *busy = loom__calloc((size_t)P, sizeof(double));
	int *next = loom__calloc((size_t)P, sizeof(int)), *started = loom__calloc((size_t)P, sizeof(int));
	long left = (long)n * P;
	double span = 0.0, idle = 0.0;
	if (!plan || !fdone || !free_at || !busy || !next || !started) {
		rc = loom_seterr(LOOM_ENOMEM, "pipeline: out of memory simulating a schedule");
		goto out;
	}
	for (int s = 0; s < P; s++)
		loom__pp_plan_v(kind, P, V, s, M, plan + (size_t)s * n);
	for (size_t i = 0; i < 2 * GM; i++)
		fdone[i] = -1.0;
	/* Run every rank's next action whose input is there (the previous global stage's forward of the
	 * same micro-batch, the next one's backward), until all have run; a backward's own part (h) runs
	 * while its input is awaited. The schedules' orders are deadlock-free: every sweep runs one. */
	while (left > 0) {
		int ran = 0;
		for (int s = 0; s < P; s++) {
			if (next[s] == n)
				continue;
			const loom__pp_action_t *a = &plan[(size_t)s * n + next[s]];
			size_t g = (size_t)a->chunk * P + s, k = g * M + (size_t)a->mb;
			double own = a->op == 'B' && h ? h[k] : 0.0;
			double ready = a->op == 'F' ? (g > 0 ? fdone[k - (size_t)M] : 0.0) : (g < G - 1 ? bdone[k + (size_t)M] : 0.0);
			if (ready < 0.0) {
				if (a->op == 'B' && own > 0.0 && !started[s]) {
					free_at[s] += own, started[s] = 1;
					ran = 1;
				}
				continue;
			}
			double t = LOOM_MAX(ready, free_at[s] + (started[s] ? 0.0 : own)) + (a->op == 'F' ? f[k] : b[k]);
			(a->op == 'F' ? fdone : bdone)[k] = free_at[s] = t;
			busy[s] += a->op == 'F' ? f[k] : own + b[k];
			started[s] = 0;
			next[s]++, left--, ran = 1;
		}
		if (!ran) {
			rc = loom_seterr(LOOM_EINVAL, "pipeline: the schedule's plan cannot run");
			goto out;
		}
	}
	for (int s = 0; s < P; s++)
		span = LOOM_MAX(span, free_at[s]);
	for (int s = 0; s < P && span > 0.0; s++)
		idle += 1.0 - busy[s] / span;
	*span_out = span, *bubble = idle / P;
out:
	free(plan), free(fdone), free(free_at), free(busy), free(next), free(started);
	return rc;
}

int loom__pp_simulate(loom_pp_schedule_t kind, int P, int M, const double *f, const double *h, const double *b,
                      double *span, double *bubble)
{
	return loom__pp_simulate_v(kind, P, 1, M, f, h, b, span, bubble);
}

/* FLOPs per token, forward + backward, of a block (the model's unit count, loom_model_unit_flops: the
 * partition below assumes the blocks cost the same, so the heaviest is taken) and of the head. */
static double block_flops(const loom_model_config_t *c, int T)
{
	double most = 0.0;
	for (int l = 0; l < c->n_layer; l++)
		most = LOOM_MAX(most, loom_model_unit_flops(c, l, T));
	return most;
}

static double head_flops(const loom_model_config_t *c, int T)
{
	return loom_model_unit_flops(c, c->n_layer, T);
}

int loom__pp_partition(const loom_model_config_t *cfg, int T, int P, int *lo, double *head_split)
{
	enum { MAXL = 4096 };
	int L = cfg->n_layer;
	if (head_split)
		*head_split = 0.0;
	if (P < 1 || P > L)
		return loom_seterr(LOOM_EINVAL, "pipeline: %d stages for a model of %d layers: every stage needs at "
		                   "least one layer (--pp must be <= %d)", P, L, L);
	if (L > MAXL)
		return loom_seterr(LOOM_EINVAL, "pipeline: %d layers (at most %d)", L, MAXL);
	double blk = block_flops(cfg, T), head = head_flops(cfg, T);
	/* best[s][l]: the least possible maximum stage cost when stages 0..s-1 run blocks [0, l); the
	 * costs are multiples of blk plus the head, so a small table of (P+1) x (L+1) doubles suffices. */
	double *best = loom__malloc(sizeof(double) * (size_t)(P + 1) * (size_t)(L + 1));
	int *cut = loom__malloc(sizeof(int) * (size_t)(P + 1) * (size_t)(L + 1));
	if (!best || !cut) {
		free(best), free(cut);
		return loom_seterr(LOOM_ENOMEM, "pipeline: out of memory");
	}
#define AT(a, s, l) a[(size_t)(s) * (size_t)(L + 1) + (size_t)(l)]
	for (int s = 0; s <= P; s++)
		for (int l = 0; l <= L; l++)
			AT(best, s, l) = 1e300, AT(cut, s, l) = 0;
	AT(best, 0, 0) = 0;
	/* Stages before the last hold at least one block. */
	for (int s = 1; s < P; s++)
		for (int l = s; l <= L; l++)
			for (int k = s - 1; k < l; k++) {
				double m = LOOM_MAX(AT(best, s - 1, k), (l - k) * blk);
				if (m < AT(best, s, l))
					AT(best, s, l) = m, AT(cut, s, l) = k;
			}
	/* The last stage: blocks [k, L) and the head, ... */
	for (int k = P - 1; k < L; k++) {
		double m = LOOM_MAX(AT(best, P - 1, k), (L - k) * blk + head);
		if (m < AT(best, P, L))
			AT(best, P, L) = m, AT(cut, P, L) = k;
	}
	lo[P] = L;
	for (int s = P; s >= 1; s--)
		lo[s - 1] = AT(cut, s, lo[s]);
	/* ... or the head alone, its positions shared with the stage before, which holds the last block
	 * and so the head's input (e.g. `small`'s 50257-row lm head, ten blocks' worth, against its six
	 * blocks): with blocks [k, L) of cost c there, the two stages cost max(c, (c + head) / 2) when the
	 * stage before takes (head - c) / (2 head) of the positions. */
	int split_k = -1;
	double split_cost = AT(best, P, L);
	for (int k = P - 2; P >= 2 && k < L; k++) {
		double c = (L - k) * blk, m = LOOM_MAX(AT(best, P - 2, k), LOOM_MAX(c, 0.5 * (c + head)));
		if (m < split_cost)
			split_cost = m, split_k = k;
	}
	if (split_k >= 0) {
		double c = (L - split_k) * blk;
		lo[P] = lo[P - 1] = L, lo[P - 2] = split_k;
		for (int s = P - 2; s >= 1; s--)
			lo[s - 1] = AT(cut, s, lo[s]);
		if (head_split)
			*head_split = head > c ? (head - c) / (2.0 * head) : 0.0;
	}
#undef AT
	free(best), free(cut);
	return LOOM_OK;
}

int loom_pp_stages(const loom_model_config_t *cfg, int B, int T, int P, double head_split, int *lo, int *head_rows)
{
	double split;
	int rc, n = B * T;
	*head_rows = 0;
	if (!(head_split < 1.0))
		return loom_seterr(LOOM_EINVAL, "pipeline: head split %g must be < 1 (a fraction of the positions; 0: "
		                   "balanced by FLOPs, negative: off)", head_split);
	if (B < 1 || T < 1)
		return loom_seterr(LOOM_EINVAL, "pipeline: batch %d x %d", B, T);
	if ((rc = loom__pp_partition(cfg, T, P, lo, &split)) != LOOM_OK)
		return rc;
	if (P < 2 || head_split < 0.0 || lo[P - 1] < cfg->n_layer)
		return LOOM_OK; /* off, or no head-alone last stage to share with */
	if (head_split > 0.0)
		split = head_split;
	*head_rows = (int)LOOM_MIN(lround(split * n), (long)n - 1);
	return LOOM_OK;
}

/* The stages' costs per micro-batch in FLOPs with stage P-2 computing the head of rows[m] of the N
 * positions of micro-batch m (the head's stages' backwards as the executor runs them: stage P-2 its
 * rows first, then its blocks' backward once the last stage's gradient is there). */
void loom__pp_head_costs(const loom_model_config_t *cfg, int T, int N, int P, int M, const int *lo, const int *rows,
                       double *f, double *h, double *b)
{
	double blk = block_flops(cfg, T) * N, head = head_flops(cfg, T);
	for (int s = 0; s < P; s++)
		for (int m = 0; m < M; m++) {
			size_t k = (size_t)s * M + (size_t)m;
			double blocks = (lo[s + 1] - lo[s]) * blk;
			f[k] = blocks / 3.0, h[k] = 0.0, b[k] = 2.0 * blocks / 3.0;
			if (s == P - 2)
				h[k] = head * rows[m];
			else if (s == P - 1)
				b[k] += head * (N - rows[m]);
		}
}

int loom__pp_head_rows(const loom_model_config_t *cfg, loom_pp_schedule_t kind, int T, int N, int P, int V, int M,
                       const int *lo, int base, int tune, int *rows)
{
	int G = P * V;
	size_t GM = (size_t)G * M;
	double *c, best, span, bubble;
	int rc;
	for (int m = 0; m < M; m++)
		rows[m] = base;
	if (!base || !tune || N < 2)
		return LOOM_OK;
	if (!(c = loom__malloc(sizeof(double) * 3 * GM)))
		return loom_seterr(LOOM_ENOMEM, "pipeline: out of memory planning the head's rows");
	loom__pp_head_costs(cfg, T, N, G, M, lo, rows, c, c + GM, c + 2 * GM);
	if ((rc = loom__pp_simulate_v(kind, P, V, M, c, c + GM, c + 2 * GM, &best, &bubble)) != LOOM_OK)
		goto out;
	/* The first and the last micro-batch meet a stage with time to spare (the pipe filling and
	 * draining): try every share of their positions (in steps of N/64), keep what shortens the step. */
	for (int pass = 0; pass < 2; pass++)
		for (int e = 0; e < 2; e++) {
			int m = e ? M - 1 : 0, keep = rows[m], step = LOOM_MAX(1, N / 64);
			for (int r = 1; r < N; r += step) {
				rows[m] = r;
				loom__pp_head_costs(cfg, T, N, G, M, lo, rows, c, c + GM, c + 2 * GM);
				if ((rc = loom__pp_simulate_v(kind, P, V, M, c, c + GM, c + 2 * GM, &span, &bubble)) != LOOM_OK)
					goto out;
				if (span < best * (1.0 - 1e-9))
					best = span, keep = r;
			}
			rows[m] = keep;
		}
out:
	free(c);
	return rc;
}

int loom_pp_head_rows(const loom_model_config_t *cfg, const char *schedule, int B, int T, int P, int V, int M,
                      double head_split, int *rows)
{
	loom_pp_schedule_t kind = LOOM_PP_1F1B;
	int rc, base, *lo;
	if (M < 1)
		return loom_seterr(LOOM_EINVAL, "pipeline: %d micro-batches (expected >= 1)", M);
	if (schedule && (rc = loom__pp_schedule_parse(schedule, &kind)) != LOOM_OK)
		return rc;
	V = kind == LOOM_PP_INTERLEAVED ? V : 1;
	if (P < 1 || V < 1 || !(lo = loom__malloc(sizeof(int) * ((size_t)P * V + 1))))
		return P < 1 || V < 1 ? loom_seterr(LOOM_EINVAL, "pipeline: %d stages x %d chunks", P, V)
		                      : loom_seterr(LOOM_ENOMEM, "pipeline: out of memory");
	if ((rc = loom_pp_stages(cfg, B, T, P * V, head_split, lo, &base)) == LOOM_OK)
		rc = loom__pp_head_rows(cfg, kind, T, B * T, P, V, M, lo, base, head_split == 0.0, rows);
	free(lo);
	return rc;
}

int loom_pp_check(const loom_model_config_t *cfg, const char *schedule, int P, int V, int M)
{
	loom_pp_schedule_t kind = LOOM_PP_1F1B;
	int rc;
	if (schedule && (rc = loom__pp_schedule_parse(schedule, &kind)) != LOOM_OK)
		return loom_seterr(rc, "--pp-schedule: %s", loom_errmsg());
	V = V < 1 ? 1 : V;
	if ((rc = loom__pp_check(kind, P, V, M)) != LOOM_OK)
		return rc;
	if (kind == LOOM_PP_INTERLEAVED && P < 2)
		return loom_seterr(LOOM_EINVAL, "pipeline: --pp-schedule interleaved needs a pipeline: --pp >= 2 (got %d)", P);
	if (cfg && (long)P * V > cfg->n_layer)
		return loom_seterr(LOOM_EINVAL, "pipeline: --pp %d x --virtual-stages %d = %d model chunks for a model of %d "
		                   "layers: every chunk needs at least one layer (--pp x --virtual-stages <= %d)", P, V, P * V,
		                   cfg->n_layer, cfg->n_layer);
	return LOOM_OK;
}

double loom_pp_bubble_ideal(const char *schedule, int P, int V, int M)
{
	loom_pp_schedule_t kind = LOOM_PP_1F1B;
	if (schedule && loom__pp_schedule_parse(schedule, &kind) != LOOM_OK)
		return NAN;
	return loom__pp_bubble_theory_v(kind, P, V < 1 ? 1 : V, M);
}
