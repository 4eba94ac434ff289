/* llama_generate.c: the Llama family's autoregressive sampling with a KV cache (batch 1), apart from
 * the training activations.
 *
 * The cache holds each layer's k (after rotary) and v rows of every position so far, (T, NKV D) each.
 * Each token runs the network on its single position p with the training passes' kernels (rotary at
 * position p), attending over the cached rows [0, p], so position p's logits are those a full forward
 * over the context gives at p (tests check every position). The prompt is fed the same way, one
 * position at a time. The cache is allocated once (first call or kv_cache_alloc) for the T given at
 * create; generation then allocates nothing. Sampling is GPT-2's (loom__sample_token): greedy at
 * temperature 0, else softmax of logits / temperature over the top_k largest (0: all). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "model/llama/llama_model.h"

static size_t layout_kv(const loom__fam_t *f, void *cache, char *base)
{
	const loom_llama_t *m = (const loom_llama_t *)f;
	ll_kv_t *kv = cache;
	const ll_dims_t *d = &m->d;
	size_t off = 0, T = (size_t)m->f.T, C = (size_t)d->C, KV = (size_t)d->NKV * d->D, Q = (size_t)d->NH * d->D;
	kv->k = loom__fam_carve(base, &off, (size_t)d->L * T * KV);
	kv->v = loom__fam_carve(base, &off, (size_t)d->L * T * KV);
	kv->x = loom__fam_carve(base, &off, C);
	kv->xn = loom__fam_carve(base, &off, C);
	kv->x2 = loom__fam_carve(base, &off, C);
	kv->q = loom__fam_carve(base, &off, Q);
	kv->kk = loom__fam_carve(base, &off, KV);
	kv->vv = loom__fam_carve(base, &off, KV);
	kv->y = loom__fam_carve(base, &off, Q);
	kv->g = loom__fam_carve(base, &off, (size_t)d->I);
	kv->u = loom__fam_carve(base, &off, 2 * (size_t)d->I);
	kv->rs = loom__fam_carve(base, &off, 1);
	kv->logits = loom__fam_carve(base, &off, (size_t)d->V);
	kv->topk = loom__fam_carve(base, &off, (size_t)d->V);
	return off;
}

int loom__ll_kv_cache_alloc(loom_model_t *mm)
{
	loom_llama_t *m = (loom_llama_t *)mm;
	void *kv;
	int rc;
	if (m->kv)
		return LOOM_OK;
	if ((rc = loom__fam_kv_alloc(&m->f, sizeof(ll_kv_t), layout_kv, &kv)) != LOOM_OK)
		return rc;
	m->kv = kv;
	m->f.kv_logits = m->kv->logits, m->f.kv_topk = m->kv->topk;
	return LOOM_OK;
}

/* y (n) = x (k) W^T (+ b), W [n, k] */
static void lin1(float *y, const float *x, const float *w, const float *b, int k, int n)
{
	loom__gemm(0, 1, 1, n, k, 1.0f, x, k, w, k, 0.0f, y, n);
	if (b)
		for (int i = 0; i < n; i++)
			y[i] += b[i];
}

/* Position pos with token tok through the whole network; kv->logits gets its logits. */
void loom__ll_step(loom__fam_t *f, int tok, int pos)
{
	loom_llama_t *m = (loom_llama_t *)f;
	ll_kv_t *kv = m->kv;
	const ll_dims_t *d = &m->d;
	int C = d->C, D = d->D, NH = d->NH, NKV = d->NKV, Q = NH * D, KV = NKV * D, I = d->I, T = m->f.T;
	float scale = (float)(1.0 / sqrt((double)D));
	loom__rows_gather(kv->x, C, m->f.pview[0], C, &tok, 0, d->V, 1, C);
	for (int l = 0; l < d->L; l++) {
#define W(j) (loom__ll_lt(d, l, (j)) >= 0 ? m->f.pview[loom__ll_lt(d, l, (j))] : NULL)
		float *kc = kv->k + (size_t)l * T * KV, *vc = kv->v + (size_t)l * T * KV;
		loom__ll_rmsnorm_forward(kv->xn, C, kv->rs, kv->x, C, W(LL_ATTN_NORM), m->eps, 1, C);
		lin1(kv->q, kv->xn, W(LL_Q), W(LL_QB), C, Q);
		lin1(kv->kk, kv->xn, W(LL_K), W(LL_KB), C, KV);
		lin1(kv->vv, kv->xn, W(LL_V), W(LL_VB), C, KV);
		loom__ll_rope_forward(kv->q, m->f.cos, m->f.sin, 1, 1, pos, NH, D);
		loom__ll_rope_forward(kv->kk, m->f.cos, m->f.sin, 1, 1, pos, NKV, D);
		memcpy(kc + (size_t)pos * KV, kv->kk, sizeof(float) * (size_t)KV);
		memcpy(vc + (size_t)pos * KV, kv->vv, sizeof(float) * (size_t)KV);
		/* the training's attention kernel on one query row at position pos over the cached rows */
		loom__flash_t at = {.q = kv->q, .k = kc, .v = vc, .ldq = Q, .ldk = KV, .B = 1, .Tq = 1, .Tk = pos + 1,
		                    .NH = NH, .NKV = NKV, .D = D, .W = -1, .qpos = pos, .scale = scale};
		loom__flash_forward(&at, kv->y, Q, NULL);
		lin1(kv->x2, kv->y, W(LL_O), W(LL_OB), Q, C);
		for (int c = 0; c < C; c++)
			kv->x2[c] += kv->x[c];
		loom__ll_rmsnorm_forward(kv->xn, C, kv->rs, kv->x2, C, W(LL_MLP_NORM), m->eps, 1, C);
		lin1(kv->g, kv->xn, W(LL_GATE), W(LL_GATEB), C, I);
		lin1(kv->u, kv->xn, W(LL_UP), W(LL_UPB), C, I);
		loom__ll_swiglu_forward(kv->u + I, kv->g, kv->u, (size_t)I);
		lin1(kv->x, kv->u + I, W(LL_DOWN), W(LL_DOWNB), I, C);
		for (int c = 0; c < C; c++)
			kv->x[c] += kv->x2[c];
#undef W
	}
	loom__ll_rmsnorm_forward(kv->xn, C, kv->rs, kv->x, C, m->f.pview[m->norm_i], m->eps, 1, C);
	lin1(kv->logits, kv->xn, m->f.pview[m->head_i], NULL, C, d->V);
}
