/* adamw.c: AdamW (torch.optim.AdamW semantics) in one fused OpenMP pass, and its reference version.
 *
 * Invariants: the segments tile [0, n) exactly (checked at init, stored sorted by offset), so every
 * float gets exactly one update per step, with decay applied where its segment says so. The scalar
 * factors are formed as PyTorch forms them: bias corrections and step size in double, then each
 * factor rounded to float once; the per-element arithmetic is float. The fast and reference versions
 * evaluate the same expression in the same order (and -std=c11 disables FMA contraction), so they
 * agree bit for bit; the fast one only splits [0, n) into one contiguous chunk per thread. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "loom/optim.h"

loom_adamw_config_t loom_adamw_defaults(void)
{
	loom_adamw_config_t c = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
	return c;
}

static int seg_cmp(const void *a, const void *b)
{
	const loom_optim_segment_t *x = a, *y = b;
	return x->offset < y->offset ? -1 : x->offset > y->offset;
}

int loom_adamw_init(loom_adamw_t *o, const loom_adamw_config_t *cfg, size_t n, const loom_optim_segment_t *segs,
                    int nseg)
{
	memset(o, 0, sizeof *o);
	if (!(cfg->beta1 >= 0.0f && cfg->beta1 < 1.0f) || !(cfg->beta2 >= 0.0f && cfg->beta2 < 1.0f))
		return loom_seterr(LOOM_EINVAL, "adamw: betas (%g, %g) must be in [0, 1)", cfg->beta1, cfg->beta2);
	if (!(cfg->eps >= 0.0f) || !(cfg->weight_decay >= 0.0f) || !isfinite(cfg->eps) || !isfinite(cfg->weight_decay))
		return loom_seterr(LOOM_EINVAL, "adamw: eps %g and weight decay %g must be finite and >= 0", cfg->eps,
		                   cfg->weight_decay);
	if (nseg <= 0 || !segs)
		return loom_seterr(LOOM_EINVAL, "adamw: no parameter segments given");
	o->segs = loom__malloc((size_t)nseg * sizeof *o->segs);
	if (!o->segs)
		return loom_seterr(LOOM_ENOMEM, "adamw: out of memory for %d segments", nseg);
	memcpy(o->segs, segs, (size_t)nseg * sizeof *segs);
	qsort(o->segs, (size_t)nseg, sizeof *o->segs, seg_cmp);
	size_t end = 0;
	for (int i = 0; i < nseg; i++) {
		if (o->segs[i].offset != end) {
			size_t off = o->segs[i].offset;
			free(o->segs), o->segs = NULL;
			return loom_seterr(LOOM_EINVAL, "adamw: segments do not tile the buffer: a segment starts at %zu, "
			                   "expected %zu (gap or overlap)", off, end);
		}
		end += o->segs[i].numel;
	}
	if (end != n) {
		free(o->segs), o->segs = NULL;
		return loom_seterr(LOOM_EINVAL, "adamw: segments cover %zu floats, the buffer has %zu", end, n);
	}
	o->m = loom_alloc_aligned(n * sizeof(float));
	o->v = loom_alloc_aligned(n * sizeof(float));
	if (!o->m || !o->v) {
		loom_adamw_free(o);
		return loom_seterr(LOOM_ENOMEM, "adamw: out of memory for the moments of %zu parameters", n);
	}
	o->cfg = *cfg;
	o->n = n;
	o->nseg = nseg;
	o->step = 0;
	return LOOM_OK;
}

int loom_adamw_init_model(loom_adamw_t *o, const loom_adamw_config_t *cfg, const loom_model_config_t *model)
{
	int rc;
	memset(o, 0, sizeof *o);
	if ((rc = loom_model_config_check(model)) != LOOM_OK)
		return rc;
	return loom_adamw_init_model_range(o, cfg, model, 0, loom_model_num_params(model));
}

int loom_adamw_init_model_range(loom_adamw_t *o, const loom_adamw_config_t *cfg, const loom_model_config_t *model,
                               size_t offset, size_t count)
{
	int nt, rc;
	loom_tensor_info_t *ti;
	memset(o, 0, sizeof *o);
	if ((rc = loom_model_config_check(model)) != LOOM_OK)
		return rc;
	nt = loom_model_num_tensors(model);
	if (!(ti = loom__malloc((size_t)nt * sizeof *ti)))
		return loom_seterr(LOOM_ENOMEM, "adamw: out of memory");
	for (int i = 0; i < nt; i++)
		loom_model_tensor_info(model, i, &ti[i]);
	rc = loom_adamw_init_table_range(o, cfg, ti, nt, loom_model_num_params(model), offset, count);
	free(ti);
	return rc;
}

int loom_adamw_init_table_range(loom_adamw_t *o, const loom_adamw_config_t *cfg, const loom_tensor_info_t *ti, int nt,
                                size_t n, size_t offset, size_t count)
{
	int nseg = 0, rc;
	size_t hi = offset + count;
	loom_optim_segment_t *segs;
	memset(o, 0, sizeof *o);
	if (offset > n || count > n - offset)
		return loom_seterr(LOOM_EINVAL, "adamw: range [%zu, %zu) is outside the model's %zu parameters", offset,
		                   offset + count, n);
	segs = loom__malloc((size_t)LOOM_MAX(nt, 1) * sizeof *segs);
	if (!segs)
		return loom_seterr(LOOM_ENOMEM, "adamw: out of memory");
	for (int i = 0; i < nt; i++) { /* tensors clipped to [offset, hi), rebased to 0 */
		size_t a = LOOM_MAX(ti[i].offset, offset), b = LOOM_MIN(ti[i].offset + ti[i].numel, hi);
		if (a < b)
			segs[nseg].offset = a - offset, segs[nseg].numel = b - a, segs[nseg++].decay = ti[i].decay;
	}
	if (nseg == 0) /* an empty shard: one empty segment keeps the optimizer valid */
		segs[nseg].offset = 0, segs[nseg].numel = 0, segs[nseg++].decay = 0;
	rc = loom_adamw_init(o, cfg, count, segs, nseg);
	free(segs);
	return rc;
}

int loom_adamw_init_gpt2(loom_adamw_t *o, const loom_adamw_config_t *cfg, const loom_model_config_t *model)
{
	return loom_adamw_init_model(o, cfg, model);
}

int loom_adamw_init_gpt2_range(loom_adamw_t *o, const loom_adamw_config_t *cfg, const loom_model_config_t *model,
                               size_t offset, size_t count)
{
	return loom_adamw_init_model_range(o, cfg, model, offset, count);
}

void loom_adamw_free(loom_adamw_t *o)
{
	loom_free_aligned(o->m);
	loom_free_aligned(o->v);
	free(o->segs);
	o->m = o->v = NULL;
	o->segs = NULL;
	o->n = 0;
	o->nseg = 0;
}

/* The float factors of one step, formed as torch 1.13's _single_tensor_adamw forms them. */
typedef struct {
	float decay;      /* 1 - lr*wd */
	float b1, a1;     /* beta1, 1 - beta1 */
	float b2, a2;     /* beta2, 1 - beta2 */
	float bc2_sqrt;   /* sqrt(1 - beta2^t) */
	float eps;
	float neg_step;   /* -lr / (1 - beta1^t) */
	float gs;         /* gradient scale (clipping) */
} factors_t;

static int factors(loom_adamw_t *o, float lr, float grad_scale, factors_t *f)
{
	if (!(lr >= 0.0f) || !isfinite(lr) || !isfinite(grad_scale))
		return loom_seterr(LOOM_EINVAL, "adamw: learning rate %g and gradient scale %g must be finite, lr >= 0", lr,
		                   grad_scale);
	if (!o->m)
		return loom_seterr(LOOM_ESTATE, "adamw: optimizer not initialized");
	double t = (double)(o->step + 1), b1 = o->cfg.beta1, b2 = o->cfg.beta2;
	f->decay = (float)(1.0 - (double)lr * (double)o->cfg.weight_decay);
	f->b1 = o->cfg.beta1, f->a1 = (float)(1.0 - b1);
	f->b2 = o->cfg.beta2, f->a2 = (float)(1.0 - b2);
	f->bc2_sqrt = (float)sqrt(1.0 - pow(b2, t));
	f->eps = o->cfg.eps;
	f->neg_step = (float)(-(double)lr / (1.0 - pow(b1, t)));
	f->gs = grad_scale;
	return LOOM_OK;
}

/* Update floats [lo, hi) of one segment. Same expression as the reference, element by element, so
 * the vectorized loop gives the reference's bits: each operation is one IEEE operation in the same
 * order (-std=c11 forbids FMA contraction) and the vector square root is correctly rounded like
 * sqrtf. The loop vectorizes on every ISA because the Makefile builds with -fno-math-errno (with
 * errno, sqrtf keeps a call to libm for negative inputs and the loop stays scalar). */
static void update(float *restrict p, const float *restrict g, float *restrict m, float *restrict v, size_t lo,
                   size_t hi, int decay, const factors_t *f)
{
	const float dec = decay ? f->decay : 1.0f, b1 = f->b1, a1 = f->a1, b2 = f->b2, a2 = f->a2;
	const float bc2 = f->bc2_sqrt, eps = f->eps, ns = f->neg_step, gs = f->gs;
#pragma omp simd
	for (size_t i = lo; i < hi; i++) {
		float gi = g[i] * gs;
		float mi = m[i] * b1 + a1 * gi;
		float vi = v[i] * b2 + a2 * gi * gi;
		float denom = sqrtf(vi) / bc2 + eps;
		m[i] = mi;
		v[i] = vi;
		p[i] = p[i] * dec + ns * mi / denom;
	}
}

/* Walk the segments overlapping [lo, hi). */
static void update_range(loom_adamw_t *o, float *p, const float *g, size_t lo, size_t hi, const factors_t *f)
{
	for (int s = 0; s < o->nseg && lo < hi; s++) {
		size_t a = o->segs[s].offset, b = a + o->segs[s].numel;
		if (b <= lo)
			continue;
		if (a >= hi)
			break;
		update(p, g, o->m, o->v, LOOM_MAX(a, lo), LOOM_MIN(b, hi), o->segs[s].decay, f);
	}
}

int loom_adamw_step(loom_adamw_t *o, float *params, const float *grads, float lr, float grad_scale)
{
	factors_t f = {0}; /* (set by factors; zeroed for -O3's uninitialized-use analysis) */
	int rc = factors(o, lr, grad_scale, &f);
	if (rc != LOOM_OK)
		return rc;
#pragma omp parallel
	{
		size_t nt = (size_t)omp_get_num_threads(), t = (size_t)omp_get_thread_num();
		/* chunks are multiples of 16 floats (a cache line) so threads never share a line */
		size_t chunk = ((o->n + nt - 1) / nt + 15) / 16 * 16;
		size_t lo = LOOM_MIN(t * chunk, o->n), hi = LOOM_MIN(lo + chunk, o->n);
		update_range(o, params, grads, lo, hi, &f);
	}
	o->step++;
	return LOOM_OK;
}

int loom_adamw_step_ref(loom_adamw_t *o, float *params, const float *grads, float lr, float grad_scale)
{
	factors_t f = {0}; /* (set by factors; zeroed for -O3's uninitialized-use analysis) */
	int rc = factors(o, lr, grad_scale, &f);
	if (rc != LOOM_OK)
		return rc;
	for (int s = 0; s < o->nseg; s++) {
		float dec = o->segs[s].decay ? f.decay : 1.0f;
		for (size_t i = o->segs[s].offset; i < o->segs[s].offset + o->segs[s].numel; i++) {
			float gi = grads[i] * f.gs;
			o->m[i] = o->m[i] * f.b1 + f.a1 * gi;
			o->v[i] = o->v[i] * f.b2 + f.a2 * gi * gi;
			params[i] = params[i] * dec + f.neg_step * o->m[i] / (sqrtf(o->v[i]) / f.bc2_sqrt + f.eps);
		}
	}
	o->step++;
	return LOOM_OK;
}

int loom_optimizer_parse(const char *name, loom_optimizer_t *opt)
{
	if (name && strcmp(name, "adamw") == 0)
		return *opt = LOOM_OPTIMIZER_ADAMW, LOOM_OK;
	if (name && strcmp(name, "muon") == 0)
		return *opt = LOOM_OPTIMIZER_MUON, LOOM_OK;
	return loom_seterr(LOOM_EINVAL, "optimizer '%s' is not one of adamw, muon", name ? name : "(null)");
}

const char *loom_optimizer_name(loom_optimizer_t opt)
{
	return opt == LOOM_OPTIMIZER_ADAMW ? "adamw" : opt == LOOM_OPTIMIZER_MUON ? "muon" : "?";
}
