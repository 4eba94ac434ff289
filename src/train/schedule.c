/* schedule.c: learning-rate schedules: linear warmup, then cosine, linear or constant decay, or
 * nanochat's warmup / constant / linear warmdown (base_train's get_lr_multiplier; loom/train.h).
 *
 * Optimizer steps are counted from 1 to N (the step whose update uses the rate). With peak rate P,
 * warmup W and floor F = P x min_lr_frac:
 *   s <= W:  lr = P x s / W                              (so step W uses exactly P)
 *   s >  W:  q = (s - W) / (N - W), clamped to [0, 1]     (so step N uses exactly F)
 *            cosine:   lr = F + (P - F) x (1 + cos(pi q)) / 2
 *            linear:   lr = P - (P - F) x q
 *            constant: lr = P
 * When N <= W there is no decay phase (after warmup, lr = P). Computed in double, rounded once. */
#include <math.h>
#include <string.h>

#include "core/util.h"
#include "loom/train.h"

static const char *const names[] = {"cosine", "linear", "constant", "warmdown"};

int loom_schedule_parse(const char *name, loom_schedule_kind_t *kind)
{
	for (int i = 0; i < (int)LOOM_ARRAY_LEN(names); i++) {
		if (strcmp(name, names[i]) == 0) {
			*kind = (loom_schedule_kind_t)i;
			return LOOM_OK;
		}
	}
	return loom_seterr(LOOM_EINVAL, "unknown LR schedule '%s' (expected cosine, linear, constant or warmdown)", name);
}

const char *loom_schedule_name(loom_schedule_kind_t kind)
{
	return (unsigned)kind < LOOM_ARRAY_LEN(names) ? names[kind] : "?";
}

int loom_schedule_check(const loom_lr_schedule_t *s)
{
	if (!(s->peak_lr >= 0.0) || !isfinite(s->peak_lr))
		return loom_seterr(LOOM_EINVAL, "learning rate %g must be finite and >= 0", s->peak_lr);
	if (s->warmup < 0)
		return loom_seterr(LOOM_EINVAL, "warmup %lld must be >= 0", s->warmup);
	if (s->total_steps <= 0)
		return loom_seterr(LOOM_EINVAL, "steps %lld must be > 0", s->total_steps);
	if (!(s->min_lr_frac >= 0.0 && s->min_lr_frac <= 1.0))
		return loom_seterr(LOOM_EINVAL, "min-lr-frac %g must be in [0, 1]", s->min_lr_frac);
	if (!(s->warmdown_frac >= 0.0 && s->warmdown_frac <= 1.0))
		return loom_seterr(LOOM_EINVAL, "warmdown-frac %g must be in [0, 1]", s->warmdown_frac);
	if ((unsigned)s->kind >= LOOM_ARRAY_LEN(names))
		return loom_seterr(LOOM_EINVAL, "invalid LR schedule kind %d", (int)s->kind);
	return LOOM_OK;
}

float loom_schedule_lr(const loom_lr_schedule_t *s, long long step)
{
	double P = s->peak_lr, F = s->peak_lr * s->min_lr_frac;
	long long W = s->warmup, N = s->total_steps;
	if (s->kind == LOOM_SCHED_WARMDOWN) { /* base_train's get_lr_multiplier at it = step - 1 */
		double frac = s->warmdown_frac > 0.0 ? s->warmdown_frac : 0.5, x = frac * (double)N, D = nearbyint(x);
		long long it = step - 1;
		if (it < W)
			return (float)(P * (double)(it + 1) / (double)W);
		if ((double)it <= (double)N - D || D <= 0.0)
			return (float)P;
		double f = ((double)N - (double)it) / D;
		return (float)(P * (f + (1.0 - f) * s->min_lr_frac));
	}
	if (step <= W)
		return (float)(P * (double)LOOM_MAX(step, 0) / (double)W);
	if (N <= W || s->kind == LOOM_SCHED_CONSTANT)
		return (float)P;
	double q = (double)(step - W) / (double)(N - W);
	q = q > 1.0 ? 1.0 : q;
	if (s->kind == LOOM_SCHED_LINEAR)
		return (float)(P - (P - F) * q);
	return (float)(F + (P - F) * 0.5 * (1.0 + cos(M_PI * q)));
}
