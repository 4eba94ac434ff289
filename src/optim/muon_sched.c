/* muon_sched.c: nanochat's base_train.py schedules for MuonAdamW as pure functions: the learning-rate
 * multiplier (warmup, constant, linear warmdown), Muon's momentum warmup and weight-decay decay, and
 * the batch-size scalings of learning rate and weight decay, all against one reference batch B_ref
 * that the caller gives (nanochat's is LOOM_MUON_B_REF, 2^19 tokens). Steps count from 0 at the
 * first update, as base_train's `step` does; each function evaluates base_train's expression in
 * double, in its order, so the values are Python's. */
#include <math.h>

#include "loom/muon.h"

float loom_muon_momentum(long long step)
{
	double frac = fmin((double)step / 300.0, 1.0);
	return (float)((1.0 - frac) * 0.85 + frac * 0.95);
}

double loom_muon_weight_decay(double wd, long long step, long long steps)
{
	return steps > 0 ? wd * (1.0 - (double)step / (double)steps) : wd;
}

double loom_muon_lr_multiplier(long long step, long long steps, double warmup_ratio, double warmdown_ratio,
                               double final_lr_frac)
{
	/* Python's round() rounds half to even, as rint does in the default rounding mode */
	double warmup = rint(warmup_ratio * (double)steps), warmdown = rint(warmdown_ratio * (double)steps);
	double it = (double)step;
	if (it < warmup)
		return (it + 1.0) / warmup;
	if (it <= (double)steps - warmdown)
		return 1.0;
	double progress = ((double)steps - it) / warmdown;
	return progress * 1.0 + (1.0 - progress) * final_lr_frac;
}

double loom_muon_batch_lr_scale(double tokens_per_step, double B_ref)
{
	double ratio = tokens_per_step / B_ref;
	return ratio == 1.0 ? 1.0 : pow(ratio, 0.5);
}

double loom_muon_weight_decay_scaled(double wd_ref, double tokens_per_step, double B_ref, double D, double D_ref)
{
	return wd_ref * sqrt(tokens_per_step / B_ref) * (D_ref / D);
}

double loom_muon_auto_batch(double D, double D_ref, double B_ref)
{
	double predicted = B_ref * pow(D / D_ref, 0.383);
	return pow(2.0, rint(log2(predicted)));
}
