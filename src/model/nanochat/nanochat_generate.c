/* nanochat_generate.c: nanochat's autoregressive sampling with a KV cache (batch 1), apart from the
 * training activations.
 *
 * The cache holds each layer's k and v rows (after the value embedding, rotary and QK-norm) of every
 * position so far, (T, NKV D) each. Each token runs the network on its single position p with the
 * training passes' kernels (rotary at position p), attending over the cached rows the layer's window
 * leaves, [max(0, p - W), p], so position p's logits are those a full forward over the context gives
 * at p (tests check every position). The prompt is fed the same way, one position at a time. The
 * cache is allocated once (first call or kv_cache_alloc) for the T given at create; generation then
 * allocates nothing. Sampling is GPT-2's (generate.c): greedy at temperature 0, else softmax of
 * logits / temperature over the top_k largest (0: all) with the model's splitmix64 stream. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "model/fastmath.h"
#include "model/nanochat/nanochat_model.h"

static size_t layout_kv(const loom__fam_t *f, void *cache, char *base)
{
	const loom_nanochat_t *m = (const loom_nanochat_t *)f;
	nc_kv_t *kv = cache;
	const nc_dims_t *d = &m->d;
	size_t off = 0, T = (size_t)m->f.T, C = (size_t)d->C, KV = (size_t)d->NKV * d->D, Q = (size_t)d->NH * d->D;
	kv->k = loom__fam_carve(base, &off, (size_t)d->L * T * KV);
	kv->v = loom__fam_carve(base, &off, (size_t)d->L * T * KV);
	kv->x = loom__fam_carve(base, &off, C);
	kv->x0 = loom__fam_carve(base, &off, C);
	kv->xin = loom__fam_carve(base, &off, C);
	kv->xn = loom__fam_carve(base, &off, C);
	kv->q = loom__fam_carve(base, &off, Q);
	kv->kk = loom__fam_carve(base, &off, KV);
	kv->vv = loom__fam_carve(base, &off, KV);
	kv->gate = loom__fam_carve(base, &off, (size_t)d->NKV);
	kv->y = loom__fam_carve(base, &off, Q);
	kv->tmp = loom__fam_carve(base, &off, C + 2 * (size_t)d->NH + (size_t)d->NKV);
	kv->fch = loom__fam_carve(base, &off, 2 * (size_t)d->H);
	kv->logits = loom__fam_carve(base, &off, (size_t)d->V);
	kv->topk = loom__fam_carve(base, &off, (size_t)d->V);
	return off;
}

int loom__nc_kv_cache_alloc(loom_model_t *mm)
{
	loom_nanochat_t *m = (loom_nanochat_t *)mm;
	void *kv;
	int rc;
	if (m->kv)
		return LOOM_OK;
	if ((rc = loom__fam_kv_alloc(&m->f, sizeof(nc_kv_t), layout_kv, &kv)) != LOOM_OK)
		return rc;
	m->kv = kv;
	m->f.kv_logits = m->kv->logits, m->f.kv_topk = m->kv->topk;
	return LOOM_OK;
}

/* Position pos with token tok through the whole network; kv->logits gets its logits. */
void loom__nc_step(loom__fam_t *f, int tok, int pos)
{
	loom_nanochat_t *m = (loom_nanochat_t *)f;
	nc_kv_t *kv = m->kv;
	const nc_dims_t *d = &m->d;
	int C = d->C, D = d->D, NH = d->NH, NKV = d->NKV, Q = NH * D, KV = NKV * D, Hd = d->H;
	int T = m->f.T;
	float scale = 1.0f / sqrtf((float)D), *rs = kv->tmp + C;
	loom__rows_gather(kv->x0, C, m->f.pview[NC_WTE], C, &tok, 0, d->Vp, 1, C);
	loom__nc_rmsnorm_forward(kv->x0, C, rs, kv->x0, C, 1, C);
	memcpy(kv->x, kv->x0, sizeof(float) * (size_t)C);
	for (int l = 0; l < d->L; l++) {
#define W(j) m->f.pview[loom__nc_lt(&m->f.cfg, l, (j))]
		float r = m->f.pview[NC_RESID][l], z = m->f.pview[NC_X0][l];
		float *kc = kv->k + (size_t)l * T * KV, *vc = kv->v + (size_t)l * T * KV;
		for (int c = 0; c < C; c++)
			kv->xin[c] = r * kv->x[c] + z * kv->x0[c];
		loom__nc_rmsnorm_forward(kv->xn, C, rs, kv->xin, C, 1, C);
		loom__gemm(0, 1, 1, Q, C, 1.0f, kv->xn, C, W(NC_Q), C, 0.0f, kv->q, Q);
		loom__gemm(0, 1, 1, KV, C, 1.0f, kv->xn, C, W(NC_K), C, 0.0f, kv->kk, KV);
		loom__gemm(0, 1, 1, KV, C, 1.0f, kv->xn, C, W(NC_V), C, 0.0f, kv->vv, KV);
		if (loom__nc_has_ve(l, d->L)) {
			loom__gemm(0, 1, 1, NKV, NC_GATE_CH, 1.0f, kv->xn, C, W(NC_GATE), NC_GATE_CH, 0.0f, kv->gate, NKV);
			const float *e = W(NC_VE) + (size_t)tok * KV;
			for (int h = 0; h < NKV; h++) {
				float g = 2.0f * (1.0f / (1.0f + expf(-kv->gate[h])));
				for (int i = 0; i < D; i++)
					kv->vv[h * D + i] += g * e[h * D + i];
			}
		}
		loom__nc_rope_forward(kv->q, m->f.cos, m->f.sin, 1, 1, pos, NH, D);
		loom__nc_rope_forward(kv->kk, m->f.cos, m->f.sin, 1, 1, pos, NKV, D);
		loom__nc_rmsnorm_forward(kv->q, D, rs, kv->q, D, NH, D);
		loom__nc_rmsnorm_forward(kv->kk, D, rs, kv->kk, D, NKV, D);
		memcpy(kc + (size_t)pos * KV, kv->kk, sizeof(float) * (size_t)KV);
		memcpy(vc + (size_t)pos * KV, kv->vv, sizeof(float) * (size_t)KV);
		/* the training's attention kernel on one query row at position pos over the cached rows */
		loom__flash_t at = {.q = kv->q, .k = kc, .v = vc, .ldq = Q, .ldk = KV, .B = 1, .Tq = 1, .Tk = pos + 1,
		                    .NH = NH, .NKV = NKV, .D = D, .W = m->window[l], .qpos = pos, .scale = scale};
		loom__flash_forward(&at, kv->y, Q, NULL);
		float *x2 = kv->tmp;
		loom__gemm(0, 1, 1, C, Q, 1.0f, kv->y, Q, W(NC_O), Q, 0.0f, x2, C);
		for (int c = 0; c < C; c++)
			x2[c] += kv->xin[c];
		loom__nc_rmsnorm_forward(kv->xn, C, rs, x2, C, 1, C);
		loom__gemm(0, 1, 1, Hd, C, 1.0f, kv->xn, C, W(NC_FC), C, 0.0f, kv->fch, Hd);
		loom__nc_relu2_forward(kv->fch + Hd, kv->fch, (size_t)Hd);
		loom__gemm(0, 1, 1, C, Hd, 1.0f, kv->fch + Hd, Hd, W(NC_P), Hd, 0.0f, kv->x, C);
		for (int c = 0; c < C; c++)
			kv->x[c] += x2[c];
#undef W
	}
	loom__nc_rmsnorm_forward(kv->xn, C, rs, kv->x, C, 1, C);
	loom__nc_logits(kv->logits, kv->xn, C, m->f.pview[m->f.ntensors - 1], 1, C, d->V);
}
