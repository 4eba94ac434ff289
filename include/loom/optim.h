/* loom/optim.h: AdamW with PyTorch's exact semantics, gradient-norm clipping, learning-rate schedules.
 *
 * AdamW (torch.optim.AdamW, torch 1.13, non-fused, amsgrad off), for step t = 1, 2, ...:
 *   p <- p * (1 - lr*wd)                      (decoupled weight decay, only where decay = 1)
 *   m <- beta1*m + (1-beta1)*g ;  v <- beta2*v + (1-beta2)*g*g
 *   p <- p - (lr / (1-beta1^t)) * m / (sqrt(v) / sqrt(1-beta2^t) + eps)
 * One fused pass over all parameters (OpenMP), reading each of p, g, m, v once. The optimizer covers
 * a flat buffer of n floats described by segments (offset, numel, decay); for GPT-2 the segments are
 * the model's tensor table (decay on the 2-D weights, not on biases and LayerNorm parameters).
 *
 * Clipping follows torch.nn.utils.clip_grad_norm_: the total L2 norm over all gradients (here
 * accumulated in double), scale = max_norm / (norm + 1e-6), applied when it is < 1. The trainer fuses
 * the scale into the AdamW pass (grad_scale argument), which gives the same numbers as scaling the
 * gradients first because the scaled gradient fl(g*scale) is formed once and used everywhere. */
#ifndef LOOM_OPTIM_H
#define LOOM_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "loom/error.h"
#include "loom/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Which optimizer a run uses: AdamW over every tensor (the default), or nanochat's MuonAdamW
 * (loom/muon.h: Muon on the blocks' matrices, AdamW groups for the rest). */
typedef enum { LOOM_OPTIMIZER_ADAMW = 0, LOOM_OPTIMIZER_MUON = 1 } loom_optimizer_t;
/* "adamw" | "muon"; LOOM_EINVAL naming both for another name. */
int loom_optimizer_parse(const char *name, loom_optimizer_t *opt);
const char *loom_optimizer_name(loom_optimizer_t opt); /* "?" when invalid */

typedef struct {
	float beta1;        /* default 0.9 */
	float beta2;        /* default 0.95 (GPT-2 / nanoGPT); torch's own default is 0.999 */
	float eps;          /* default 1e-8 */
	float weight_decay; /* default 0.1 */
} loom_adamw_config_t;

/* The defaults above. */
loom_adamw_config_t loom_adamw_defaults(void);

typedef struct {
	size_t offset, numel; /* in floats, within the optimizer's buffer */
	int decay;            /* 1: weight decay applies */
} loom_optim_segment_t;

typedef struct {
	loom_adamw_config_t cfg;
	size_t n;                       /* floats covered */
	float *m, *v;                   /* first and second moments, n floats each (owned) */
	long long step;                 /* optimizer steps taken so far (t of the last update) */
	int nseg;
	loom_optim_segment_t *segs;     /* owned copy, sorted by offset */
} loom_adamw_t;

/* Initialize for a buffer of n floats; segments (nseg of them) must tile [0, n) without overlap (any
 * order). m, v start at zero and step at 0. Returns LOOM_OK, LOOM_EINVAL (bad config: beta outside
 * [0,1), eps < 0, wd < 0, or segments that do not tile) or LOOM_ENOMEM. Free with loom_adamw_free. */
int loom_adamw_init(loom_adamw_t *o, const loom_adamw_config_t *cfg, size_t n, const loom_optim_segment_t *segs,
                    int nseg);
/* The same for a model's parameter buffer (any family, loom/model.h): one segment per tensor of the
 * model's table, each with its tensor's decay. */
int loom_adamw_init_model(loom_adamw_t *o, const loom_adamw_config_t *cfg, const loom_model_config_t *model);
/* The first names of the two calls (they take any family's configuration). */
int loom_adamw_init_gpt2(loom_adamw_t *o, const loom_adamw_config_t *cfg, const loom_model_config_t *model);
/* An optimizer over part of a model's parameter buffer: floats [offset, offset + count) (a shard owned
 * by one rank; it may start and end inside tensors). Its segments are the model's tensors clipped to
 * that range and rebased to 0, each with its tensor's decay, so m and v hold count floats and a step
 * is loom_adamw_step(o, params + offset, grads + offset, ...). Updating every shard of a partition
 * of [0, n) this way gives bit-identical parameters and moments to one optimizer over all of them
 * (the update is element-wise). count may be 0 (an empty shard: steps only count). LOOM_EINVAL when
 * the range is outside the buffer, else as loom_adamw_init. */
int loom_adamw_init_model_range(loom_adamw_t *o, const loom_adamw_config_t *cfg, const loom_model_config_t *model,
                                size_t offset, size_t count);
int loom_adamw_init_gpt2_range(loom_adamw_t *o, const loom_adamw_config_t *cfg, const loom_model_config_t *model,
                               size_t offset, size_t count);
void loom_adamw_free(loom_adamw_t *o); /* safe on a zeroed or freed struct */

/* One AdamW update of params (n floats) with gradient grads * grad_scale (grad_scale = 1 for none,
 * or the clipping scale), learning rate lr. Increments o->step. grads are not modified. Runs on
 * the OpenMP thread count in effect; the result does not depend on it. Not thread-safe for one o.
 * Returns LOOM_OK, or LOOM_EINVAL (o unchanged) for a negative or non-finite lr or scale. */
int loom_adamw_step(loom_adamw_t *o, float *params, const float *grads, float lr, float grad_scale);

/* Reference (scalar, one thread, plain loop) version of loom_adamw_step; the tests compare them. */
int loom_adamw_step_ref(loom_adamw_t *o, float *params, const float *grads, float lr, float grad_scale);

/* ---- clipping ---------------------------------------------------------------------------------- */

/* L2 norm of g (n floats), accumulated in double (OpenMP): sqrt(loom_grad_sumsq(g, n)). */
double loom_grad_norm(const float *g, size_t n);
/* Sum of squares of g (n floats) in double, in a fixed order whatever the thread count: the part of
 * a squared norm that one rank adds when the gradients are split across ranks. */
double loom_grad_sumsq(const float *g, size_t n);
/* torch.nn.utils.clip_grad_norm_'s factor: max_norm / (norm + 1e-6) when that is < 1, else 1.
 * max_norm <= 0 disables clipping (returns 1). */
float loom_clip_scale(double norm, double max_norm);
/* Scale g in place as clip_grad_norm_ does; returns the norm before clipping. */
double loom_clip_grad_norm(float *g, size_t n, double max_norm);

#ifdef __cplusplus
}
#endif
#endif
