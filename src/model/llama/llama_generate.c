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
#include "model/rng.h"

static float *carve(char *base, size_t *off, size_t nfloats)
{
	float *p = base ? (float *)(base + *off) : NULL;
	*off += (nfloats * sizeof(float) + 63) / 64 * 64;
	return p;
}

static size_t layout_kv(const loom_llama_t *m, ll_kv_t *kv, char *base)
{
	const ll_dims_t *d = &m->d;
	size_t off = 0, T = (size_t)m->T, C = (size_t)d->C, KV = (size_t)d->NKV * d->D, Q = (size_t)d->NH * d->D;
	kv->k = carve(base, &off, (size_t)d->L * T * KV);
	kv->v = carve(base, &off, (size_t)d->L * T * KV);
	kv->x = carve(base, &off, C);
	kv->xn = carve(base, &off, C);
	kv->x2 = carve(base, &off, C);
	kv->q = carve(base, &off, Q);
	kv->kk = carve(base, &off, KV);
	kv->vv = carve(base, &off, KV);
	kv->y = carve(base, &off, Q);
	kv->g = carve(base, &off, (size_t)d->I);
	kv->u = carve(base, &off, 2 * (size_t)d->I);
	kv->rs = carve(base, &off, 1);
	kv->logits = carve(base, &off, (size_t)d->V);
	kv->topk = carve(base, &off, (size_t)d->V);
	return off;
}

void loom__ll_kv_free(loom_llama_t *m)
{
	if (m->kv) {
		loom_free_aligned(m->kv->mem);
		free(m->kv);
		m->kv = NULL;
	}
}

int loom__ll_kv_alloc(loom_llama_t *m)
{
	if (m->kv)
		return LOOM_OK;
	if (!m->has_embed || !m->has_head || m->tp > 1 || m->cp > 1)
		return loom_seterr(LOOM_EINVAL, "llama generate: needs the whole model (blocks [%d, %d) of %d held, tp %d, "
		                   "cp %d)", m->lo, m->hi, m->d.L, m->tp, m->cp);
	ll_kv_t *kv = loom__calloc(1, sizeof *kv);
	size_t bytes = layout_kv(m, kv ? kv : &(ll_kv_t){0}, NULL);
	if (!kv || !(kv->mem = loom_alloc_aligned(bytes))) {
		free(kv);
		return loom_seterr(LOOM_ENOMEM, "llama generate: out of memory for the KV cache (%zu bytes)", bytes);
	}
	layout_kv(m, kv, kv->mem);
	m->kv = kv;
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
static void step(loom_llama_t *m, ll_kv_t *kv, int tok, int pos)
{
	const ll_dims_t *d = &m->d;
	int C = d->C, D = d->D, NH = d->NH, NKV = d->NKV, Q = NH * D, KV = NKV * D, I = d->I, T = m->T;
	float scale = (float)(1.0 / sqrt((double)D));
	loom__ll_gather(kv->x, m->pview[0], &tok, 0, d->V, 1, C);
	for (int l = 0; l < d->L; l++) {
#define W(j) (loom__ll_lt(d, l, (j)) >= 0 ? m->pview[loom__ll_lt(d, l, (j))] : NULL)
		float *kc = kv->k + (size_t)l * T * KV, *vc = kv->v + (size_t)l * T * KV;
		loom__ll_rmsnorm_forward(kv->xn, C, kv->rs, kv->x, C, W(LL_ATTN_NORM), m->eps, 1, C);
		lin1(kv->q, kv->xn, W(LL_Q), W(LL_QB), C, Q);
		lin1(kv->kk, kv->xn, W(LL_K), W(LL_KB), C, KV);
		lin1(kv->vv, kv->xn, W(LL_V), W(LL_VB), C, KV);
		loom__ll_rope_forward(kv->q, m->cos, m->sin, 1, 1, pos, NH, D);
		loom__ll_rope_forward(kv->kk, m->cos, m->sin, 1, 1, pos, NKV, D);
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
	loom__ll_rmsnorm_forward(kv->xn, C, kv->rs, kv->x, C, m->pview[m->norm_i], m->eps, 1, C);
	lin1(kv->logits, kv->xn, m->pview[m->head_i], NULL, C, d->V);
}

int loom__ll_generate(loom_llama_t *m, const int *prompt, int n_prompt, int max_new, float temperature, int top_k,
                      uint64_t seed, int stop_token, int *out, int *n_out, void (*on_token)(void *ctx, int token),
                      void *ctx)
{
	int rc;
	rng_t r;
	if (n_out)
		*n_out = 0;
	if (!n_out || (max_new > 0 && !out) || max_new < 0)
		return loom_seterr(LOOM_EINVAL, "llama generate: max_new %d with out %s and n_out %s", max_new,
		                   out ? "given" : "NULL", n_out ? "given" : "NULL");
	if (!prompt || n_prompt < 1 || n_prompt > m->T)
		return loom_seterr(LOOM_EINVAL, "llama generate: prompt of %d tokens (expected 1 to %d, the model's T)",
		                   n_prompt, m->T);
	if (!(temperature >= 0.0f) || !isfinite(temperature) || top_k < 0)
		return loom_seterr(LOOM_EINVAL, "llama generate: temperature %g, top_k %d (expected >= 0 each)",
		                   (double)temperature, top_k);
	for (int i = 0; i < n_prompt; i++)
		if (prompt[i] < 0 || prompt[i] >= m->d.V)
			return loom_seterr(LOOM_EINVAL, "llama generate: prompt token %d at %d is outside the vocabulary [0, %d)",
			                   prompt[i], i, m->d.V);
	if ((rc = loom__ll_kv_alloc(m)) != LOOM_OK)
		return rc;
	loom__gemm_setup(&m->gemm);
	rng_seed(&r, seed);
	for (int p = 0; p < n_prompt; p++)
		step(m, m->kv, prompt[p], p);
	for (int pos = n_prompt; *n_out < max_new && pos < m->T; pos++) {
		int tok = loom__sample_token(m->kv->logits, m->d.V, temperature, top_k, m->kv->topk, &r);
		out[(*n_out)++] = tok;
		if (on_token)
			on_token(ctx, tok);
		if (tok == stop_token || *n_out == max_new || pos + 1 == m->T)
			break;
		step(m, m->kv, tok, pos);
	}
	return loom__gemm_status(&m->gemm);
}
