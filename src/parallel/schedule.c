/* schedule.c: pipeline schedules as data (GPipe, 1F1B), the partition of the layers into stages
 * balanced by FLOPs (with a head heavier than the blocks shared between the last two stages by
 * positions), and a discrete-event simulation of a schedule, which gives the bubble to expect from
 * the stages' times and picks the first and last micro-batch's share of a shared head.
 *
 * A schedule is a row of a table: its name, the generator of one stage's order of forwards and
 * backwards, and what it promises (arenas needed, the ideal bubble), so the code that runs a
 * schedule and the text that describes it cannot disagree. Invariants every generator keeps (the
 * pipeline executor relies on them): each micro-batch's forward comes before its backward on a stage;
 * forwards run in micro-batch order and so do backwards (so neighbours' messages match in order, and
 * the last backward, where data-parallel gradient sync happens, is micro-batch M-1 on every stage);
 * and the micro-batches in flight (forward done, backward not) are consecutive, at most `arenas` of
 * them, so micro-batch mb may use arena mb % arenas. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "loom/train.h"
#include "parallel/pp.h"

/* GPipe: every forward, then every backward. */
static int plan_gpipe(int P, int s, int M, loom__pp_action_t *out)
{
	(void)P, (void)s;
	for (int j = 0; j < M; j++)
		out[j] = (loom__pp_action_t){'F', j}, out[M + j] = (loom__pp_action_t){'B', j};
	return M;
}

/* 1F1B (PipeDream-flush, Megatron): P-s-1 warm-up forwards, then one forward and one backward in
 * turn, then the remaining backwards; a stage holds at most P-s micro-batches. */
static int plan_1f1b(int P, int s, int M, loom__pp_action_t *out)
{
	int warm = LOOM_MIN(P - s - 1, M), n = 0, f = 0, b = 0;
	while (f < warm)
		out[n++] = (loom__pp_action_t){'F', f++};
	while (f < M) {
		out[n++] = (loom__pp_action_t){'F', f++};
		out[n++] = (loom__pp_action_t){'B', b++};
	}
	while (b < M)
		out[n++] = (loom__pp_action_t){'B', b++};
	return LOOM_MIN(M, P - s);
}

static const struct {
	const char *name;
	int (*plan)(int P, int s, int M, loom__pp_action_t *out);
	const char *what;
} schedules[LOOM_PP_SCHEDULES] = {
	[LOOM_PP_GPIPE] = {"gpipe", plan_gpipe, "all M forwards, then all M backwards; M micro-batches stored"},
	[LOOM_PP_1F1B] = {"1f1b", plan_1f1b, "P-s-1 warm-up forwards, then one forward and one backward in turn; "
	                                     "at most P micro-batches stored"},
};

int loom__pp_schedule_parse(const char *name, loom_pp_schedule_t *kind)
{
	for (int k = 0; k < LOOM_PP_SCHEDULES; k++)
		if (name && !strcmp(name, schedules[k].name)) {
			*kind = (loom_pp_schedule_t)k;
			return LOOM_OK;
		}
	return loom_seterr(LOOM_EINVAL, "pipeline schedule '%s' is not one of gpipe (%s), 1f1b (%s)", name ? name : "",
	                   schedules[LOOM_PP_GPIPE].what, schedules[LOOM_PP_1F1B].what);
}

const char *loom__pp_schedule_name(loom_pp_schedule_t kind)
{
	return kind >= 0 && kind < LOOM_PP_SCHEDULES ? schedules[kind].name : "?";
}

int loom__pp_plan(loom_pp_schedule_t kind, int P, int s, int M, loom__pp_action_t *out)
{
	return schedules[kind].plan(P, s, M, out);
}

double loom__pp_bubble_theory(loom_pp_schedule_t kind, int P, int M)
{
	(void)kind; /* both schedules idle for P-1 of M+P-1 slots; 1F1B only stores less */
	return (double)(P - 1) / (double)(M + P - 1);
}

int loom__pp_simulate(loom_pp_schedule_t kind, int P, int M, const double *f, const double *h, const double *b,
                    double *span_out, double *bubble)
{
	size_t PM = (size_t)P * M;
	loom__pp_action_t *plan = loom__malloc(sizeof *plan * 2 * PM);
	double *fdone = loom__malloc(sizeof(double) * 2 * PM), *bdone = fdone + PM;
	double *free_at = loom__calloc((size_t)P, sizeof(double)), *busy = loom__calloc((size_t)P, sizeof(double));
	int *next = loom__calloc((size_t)P, sizeof(int)), *started = loom__calloc((size_t)P, sizeof(int));
	int left = 2 * M * P, rc = LOOM_OK;
	double span = 0.0, idle = 0.0;
	if (!plan || !fdone || !free_at || !busy || !next || !started) {
		rc = loom_seterr(LOOM_ENOMEM, "pipeline: out of memory simulating a schedule");
		goto out;
	}
	for (int s = 0; s < P; s++)
		loom__pp_plan(kind, P, s, M, plan + (size_t)s * 2 * M);
	for (size_t i = 0; i < 2 * PM; i++)
		fdone[i] = -1.0;
	/* Run every stage's next action whose input is there (the previous stage's forward of the same
	 * micro-batch, the next stage's backward), until all have run; a backward's own part (h) runs
	 * while its input is awaited. The schedules' orders are deadlock-free: every sweep runs one. */
	while (left > 0) {
		int ran = 0;
		for (int s = 0; s < P; s++) {
			if (next[s] == 2 * M)
				continue;
			const loom__pp_action_t *a = &plan[(size_t)s * 2 * M + next[s]];
			size_t k = (size_t)s * M + (size_t)a->mb;
			double own = a->op == 'B' && h ? h[k] : 0.0;
			double ready = a->op == 'F' ? (s > 0 ? fdone[k - (size_t)M] : 0.0) : (s < P - 1 ? bdone[k + (size_t)M] : 0.0);
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

int loom__pp_head_rows(const loom_model_config_t *cfg, loom_pp_schedule_t kind, int T, int N, int P, int M,
                       const int *lo, int base, int tune, int *rows)
{
	size_t PM = (size_t)P * M;
	double *c, best, span, bubble;
	int rc;
	for (int m = 0; m < M; m++)
		rows[m] = base;
	if (!base || !tune || N < 2)
		return LOOM_OK;
	if (!(c = loom__malloc(sizeof(double) * 3 * PM)))
		return loom_seterr(LOOM_ENOMEM, "pipeline: out of memory planning the head's rows");
	loom__pp_head_costs(cfg, T, N, P, M, lo, rows, c, c + PM, c + 2 * PM);
	if ((rc = loom__pp_simulate(kind, P, M, c, c + PM, c + 2 * PM, &best, &bubble)) != LOOM_OK)
		goto out;
	/* The first and the last micro-batch meet a stage with time to spare (the pipe filling and
	 * draining): try every share of their positions (in steps of N/64), keep what shortens the step. */
	for (int pass = 0; pass < 2; pass++)
		for (int e = 0; e < 2; e++) {
			int m = e ? M - 1 : 0, keep = rows[m], step = LOOM_MAX(1, N / 64);
			for (int r = 1; r < N; r += step) {
				rows[m] = r;
				loom__pp_head_costs(cfg, T, N, P, M, lo, rows, c, c + PM, c + 2 * PM);
				if ((rc = loom__pp_simulate(kind, P, M, c, c + PM, c + 2 * PM, &span, &bubble)) != LOOM_OK)
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

int loom_pp_head_rows(const loom_model_config_t *cfg, const char *schedule, int B, int T, int P, int M,
                      double head_split, int *rows)
{
	loom_pp_schedule_t kind = LOOM_PP_1F1B;
	int rc, base, *lo;
	if (M < 1)
		return loom_seterr(LOOM_EINVAL, "pipeline: %d micro-batches (expected >= 1)", M);
	if (schedule && (rc = loom__pp_schedule_parse(schedule, &kind)) != LOOM_OK)
		return rc;
	if (P < 1 || !(lo = loom__malloc(sizeof(int) * ((size_t)P + 1))))
		return P < 1 ? loom_seterr(LOOM_EINVAL, "pipeline: %d stages", P)
		             : loom_seterr(LOOM_ENOMEM, "pipeline: out of memory");
	if ((rc = loom_pp_stages(cfg, B, T, P, head_split, lo, &base)) == LOOM_OK)
		rc = loom__pp_head_rows(cfg, kind, T, B * T, P, M, lo, base, head_split == 0.0, rows);
	free(lo);
	return rc;
}
