/* schedule.c: pipeline schedules as data (GPipe, 1F1B) and the partition of the layers into stages
 * balanced by FLOPs.
 *
 * A schedule is a row of a table: its name, the generator of one stage's order of forwards and
 * backwards, and what it promises (arenas needed, the ideal bubble), so the code that runs a
 * schedule and the text that describes it cannot disagree. Invariants every generator keeps (the
 * pipeline executor relies on them): each micro-batch's forward comes before its backward on a stage;
 * forwards run in micro-batch order and so do backwards (so neighbours' messages match in order, and
 * the last backward, where data-parallel gradient sync happens, is micro-batch M-1 on every stage);
 * and the micro-batches in flight (forward done, backward not) are consecutive, at most `arenas` of
 * them, so micro-batch mb may use arena mb % arenas. */
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
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

/* FLOPs per token, forward + backward, of block costs and of the head (as loom_gpt2_flops_per_token
 * counts them: 6 x matmul parameters, 12 x C x T per block for attention; the lm head's matmul over
 * the vocabulary is 2 V C forward and 4 V C backward). */
static double block_flops(const loom_gpt2_config_t *c, int T)
{
	double C = c->n_embd;
	return 6.0 * 12.0 * C * C + 12.0 * C * T;
}

int loom__pp_partition(const loom_gpt2_config_t *cfg, int T, int P, int *lo)
{
	enum { MAXL = 4096 };
	int L = cfg->n_layer;
	if (P < 1 || P > L)
		return loom_seterr(LOOM_EINVAL, "pipeline: %d stages for a model of %d layers: every stage needs at "
		                   "least one layer (--pp must be <= %d)", P, L, L);
	if (L > MAXL)
		return loom_seterr(LOOM_EINVAL, "pipeline: %d layers (at most %d)", L, MAXL);
	double blk = block_flops(cfg, T), head = 6.0 * (double)cfg->vocab_size * cfg->n_embd;
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
	/* Stages before the last hold at least one block; the last may hold the head alone (k = L) when
	 * the head outweighs what a block would add to the other stages (e.g. `small`'s 50257-row lm
	 * head, ten blocks' worth). */
	for (int s = 1; s < P; s++)
		for (int l = s; l <= L; l++)
			for (int k = s - 1; k < l; k++) {
				double m = LOOM_MAX(AT(best, s - 1, k), (l - k) * blk);
				if (m < AT(best, s, l))
					AT(best, s, l) = m, AT(cut, s, l) = k;
			}
	for (int k = P - 1; k <= L; k++) {
		double m = LOOM_MAX(AT(best, P - 1, k), (L - k) * blk + head);
		if (m < AT(best, P, L))
			AT(best, P, L) = m, AT(cut, P, L) = k;
	}
	lo[P] = L;
	for (int s = P; s >= 1; s--)
		lo[s - 1] = AT(cut, s, lo[s]);
#undef AT
	free(best), free(cut);
	return LOOM_OK;
}
