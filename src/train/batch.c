/* batch.c: the batch arithmetic a training program needs before it builds a trainer (loom/train.h):
 * the gradient accumulation that gives a total batch, and the scaling of the learning rate with the
 * batch.
 *
 * An optimizer step is accum micro-steps of B x T tokens on each of dp data-parallel ranks, so a
 * total of N tokens per step needs N to be a multiple of B x T x dp, and accum = N / (B x T x dp).
 * The LR rules (Goyal et al. for linear, Krizhevsky / Hoffer et al. for sqrt) scale a rate tuned for
 * a reference batch R to the batch N: lr x (N / R)^p, p = 0, 1/2 or 1; computed in double. R is the
 * run's one B_ref, which Muon's weight-decay scaling uses too (loom_ref_batch). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/util.h"
#include "loom/muon.h"
#include "loom/train.h"

int loom_train_accum(long long total_batch, int B, int T, int dp, int *accum)
{
	long long micro = (long long)B * T * dp;
	char valid[256], what[128];
	int n = 0;
	if (B < 1 || T < 1 || dp < 1 || total_batch < 1)
		return loom_seterr(LOOM_EINVAL, "total batch size %lld, B %d, T %d and %d data-parallel ranks must be >= 1",
		                   total_batch, B, T, dp);
	if (total_batch % micro == 0 && total_batch / micro <= (1 << 30)) {
		*accum = (int)(total_batch / micro);
		return LOOM_OK;
	}
	if (total_batch % micro == 0)
		return loom_seterr(LOOM_EINVAL, "--total-batch-size %lld needs %lld micro-steps of %lld tokens: too many",
		                   total_batch, total_batch / micro, micro);
	for (int k = 1; k <= 5; k++)
		n += snprintf(valid + n, sizeof valid - (size_t)n, "%s%lld", k > 1 ? ", " : "", micro * k);
	if (dp > 1)
		snprintf(what, sizeof what, "B x T x ranks = %d x %d x %d = %lld tokens per micro-step", B, T, dp, micro);
	else
		snprintf(what, sizeof what, "B x T = %d x %d = %lld tokens per micro-batch", B, T, micro);
	return loom_seterr(LOOM_EINVAL, "--total-batch-size %lld is not a multiple of %s; valid values: %s, ...",
	                   total_batch, what, valid);
}

static const char *const scale_names[] = {"none", "sqrt", "linear"};

int loom_lr_scale_parse(const char *name, loom_lr_scale_t *kind)
{
	for (int i = 0; i < (int)LOOM_ARRAY_LEN(scale_names); i++)
		if (!strcmp(name, scale_names[i])) {
			*kind = (loom_lr_scale_t)i;
			return LOOM_OK;
		}
	return loom_seterr(LOOM_EINVAL, "'%s' is not one of none, sqrt, linear", name);
}

const char *loom_lr_scale_name(loom_lr_scale_t kind)
{
	return (int)kind >= 0 && (int)kind < (int)LOOM_ARRAY_LEN(scale_names) ? scale_names[kind] : "?";
}

int loom_lr_scaled(double lr, loom_lr_scale_t kind, long long tokens_per_step, long long ref_tokens, double *out)
{
	double ratio;
	if ((int)kind < 0 || (int)kind >= (int)LOOM_ARRAY_LEN(scale_names))
		return loom_seterr(LOOM_EINVAL, "LR scaling %d is not one of none, sqrt, linear", (int)kind);
	if (kind == LOOM_LR_SCALE_NONE) {
		*out = lr;
		return LOOM_OK;
	}
	if (ref_tokens <= 0)
		return loom_seterr(LOOM_EINVAL, "--lr-scale %s needs --ref-batch-size TOKENS (the batch --lr was tuned "
		                   "for)", scale_names[kind]);
	if (tokens_per_step <= 0)
		return loom_seterr(LOOM_EINVAL, "LR scaling: %lld tokens per step must be > 0", tokens_per_step);
	ratio = (double)tokens_per_step / (double)ref_tokens;
	*out = lr * (kind == LOOM_LR_SCALE_SQRT ? sqrt(ratio) : ratio);
	return LOOM_OK;
}

long long loom_ref_batch(long long given, loom_optimizer_t optimizer, const char **source)
{
	const char *src = "none";
	long long B_ref = 0;
	if (given > 0)
		src = "--ref-batch-size", B_ref = given;
	else if (optimizer == LOOM_OPTIMIZER_MUON)
		src = "nanochat's default, 2^19", B_ref = (long long)LOOM_MUON_B_REF;
	if (source)
		*source = src;
	return B_ref;
}
