/* generate.c: autoregressive sampling with a KV cache (loom_gpt2_generate) that is the model's own,
 * apart from the training activations.
 *
 * The cache holds each layer's q, k, v rows (T,3C). A forward over the prompt (batch 1, the same
 * block code as training, loom__gpt2_block_forward) leaves q, k, v of positions 0..n-1 in each
 * layer's cache, and each new token runs the network on its single row `pos`, attending over rows
 * 0..pos. Row pos then holds exactly what a full forward over the context would have computed, so
 * greedy decoding gives the tokens a full recomputation would (tests check this). Every other
 * activation is needed only while its layer runs, so one layer's worth of scratch (for up to T
 * positions, the prompt) serves all layers, and the residual stream alternates between two (T,C)
 * buffers. The cache is allocated once, at the first call (or loom_gpt2_kv_cache_alloc), for the T
 * given at create; after that generation allocates nothing. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "model/fastmath.h"
#include "model/kernels.h"
#include "model/gpt2/model.h"
#include "model/rng.h"

enum { LN1_W, LN1_B, QKV_W, QKV_B, ATTPROJ_W, ATTPROJ_B, LN2_W, LN2_B, FC_W, FC_B, FCPROJ_W, FCPROJ_B };

static float *lp(loom_gpt2_t *m, int l, int j)
{
	return loom__gpt2_param(m, 2 + LOOM_GPT2_LAYER_TENSORS * l + j);
}

/* out (C) for query row pos of qkv (rows of 3C) over key/value rows 0..pos: the training's attention
 * kernel on one query row at position pos. */
static void attend_one(float *out, const float *qkv, int pos, int C, int NH)
{
	int hs = C / NH;
	loom__flash_t a = {.q = qkv + (size_t)pos * 3 * C, .k = qkv + C, .v = qkv + 2 * C, .ldq = 3 * C, .ldk = 3 * C,
	                   .B = 1, .Tq = 1, .Tk = pos + 1, .NH = NH, .NKV = NH, .D = hs, .W = -1, .qpos = pos,
	                   .scale = 1.0f / sqrtf((float)hs)};
	loom__flash_forward(&a, out, C, NULL);
}

static size_t layout_kv(const loom_gpt2_t *m, kv_cache_t *kv, char *base)
{
	size_t off = 0, C = (size_t)m->f.cfg.n_embd, V = (size_t)m->f.cfg.vocab_size, T = (size_t)m->f.T;
	size_t NH = (size_t)m->f.cfg.n_head;
	layer_acts_t *a = &kv->scratch;
	for (int l = 0; l < m->f.cfg.n_layer; l++)
		kv->qkv[l] = loom__fam_carve(base, &off, T * 3 * C);
	a->ln1 = loom__fam_carve(base, &off, T * C);
	a->ln1_mean = loom__fam_carve(base, &off, T);
	a->ln1_rstd = loom__fam_carve(base, &off, T);
	a->lse = loom__fam_carve(base, &off, NH * T);
	a->atty = loom__fam_carve(base, &off, T * C);
	a->res2 = loom__fam_carve(base, &off, T * C);
	a->ln2 = loom__fam_carve(base, &off, T * C);
	a->ln2_mean = loom__fam_carve(base, &off, T);
	a->ln2_rstd = loom__fam_carve(base, &off, T);
	a->fch = loom__fam_carve(base, &off, T * 4 * C);
	a->fch_gelu = loom__fam_carve(base, &off, T * 4 * C);
	kv->res[0] = loom__fam_carve(base, &off, T * C);
	kv->res[1] = loom__fam_carve(base, &off, T * C);
	kv->lnf = loom__fam_carve(base, &off, T * C);
	kv->lnf_mean = loom__fam_carve(base, &off, T);
	kv->lnf_rstd = loom__fam_carve(base, &off, T);
	kv->logits = loom__fam_carve(base, &off, V);
	kv->topk = loom__fam_carve(base, &off, V);
	return off;
}

void loom__gpt2_kv_cache_free(loom_gpt2_t *m)
{
	if (!m->kv)
		return;
	loom_free_aligned(m->kv->mem);
	free(m->kv->qkv);
	free(m->kv);
	m->kv = NULL;
}

int loom_gpt2_kv_cache_alloc(loom_gpt2_t *m)
{
	kv_cache_t *kv;
	if (m->kv)
		return LOOM_OK;
	if (!m->f.has_embed || !m->f.has_head)
		return loom_seterr(LOOM_EINVAL, "gpt2 generate: needs every layer, the model holds blocks [%d, %d) of %d",
		                   m->f.lo, m->f.hi, m->f.cfg.n_layer);
	if (m->f.tp > 1)
		return loom_seterr(LOOM_EINVAL, "gpt2 generate: needs a whole model, this one is tensor-parallel rank %d of "
		                   "%d (load its checkpoint into a whole model to sample)", m->f.tp_rank, m->f.tp);
	if (m->f.cp > 1)
		return loom_seterr(LOOM_EINVAL, "gpt2 generate: needs a whole model, this one is context-parallel rank %d "
		                   "of %d (load its checkpoint into a whole model to sample)", m->f.cp_rank, m->f.cp);
	if (!(kv = loom__calloc(1, sizeof *kv)) || !(kv->qkv = loom__calloc((size_t)m->f.cfg.n_layer, sizeof *kv->qkv)) ||
	    !(kv->mem = loom_alloc_aligned(layout_kv(m, kv, NULL)))) {
		if (kv)
			free(kv->qkv);
		free(kv);
		return loom_seterr(LOOM_ENOMEM, "gpt2 generate: out of memory for the KV cache (L%d, T %d, C%d)",
		                   m->f.cfg.n_layer, m->f.T, m->f.cfg.n_embd);
	}
	layout_kv(m, kv, kv->mem);
	m->kv = kv;
	return LOOM_OK;
}

/* Forward over the prompt (n tokens): fills every layer's cache rows 0..n-1 and leaves the logits
 * of the last position in kv->logits. */
static void prompt_forward(loom_gpt2_t *m, kv_cache_t *kv, const int *prompt, int n)
{
	int C = m->f.cfg.n_embd, V = m->f.cfg.vocab_size, L = m->f.cfg.n_layer, nt = m->f.ntensors;
	loom__gpt2_param_use(m, -1, 0);
	loom__encoder_forward(kv->res[0], prompt, loom__gpt2_param(m, 0), loom__gpt2_param(m, 1), 1, n, C);
	for (int l = 0; l < L; l++) {
		layer_acts_t a = kv->scratch;
		a.qkv = kv->qkv[l];
		a.res3 = kv->res[(l + 1) & 1];
		loom__gpt2_param_use(m, l, 0);
		loom__gpt2_block_forward(m, l, &a, kv->res[l & 1], 1, n);
	}
	loom__gpt2_param_use(m, L, 0);
	loom__layernorm_forward(kv->lnf, kv->lnf_mean, kv->lnf_rstd, kv->res[L & 1], loom__gpt2_param(m, nt - 2),
	                        loom__gpt2_param(m, nt - 1), n, C);
	loom__gemm(0, 1, 1, V, C, 1.0f, kv->lnf + (size_t)(n - 1) * C, C, loom__gpt2_param(m, 0), C, 0.0f, kv->logits, V);
}

/* Run token `tok` at position pos (rows 0..pos-1 already cached) and leave its logits in kv->logits. */
static void step(loom__fam_t *f, int tok, int pos)
{
	loom_gpt2_t *m = (loom_gpt2_t *)f;
	kv_cache_t *kv = m->kv;
	int C = m->f.cfg.n_embd, NH = m->f.cfg.n_head, V = m->f.cfg.vocab_size, L = m->f.cfg.n_layer, nt = m->f.ntensors;
	size_t r = (size_t)pos * C;
	layer_acts_t *a = &kv->scratch;
	loom__gpt2_param_use(m, -1, 0);
	loom__encoder_forward(kv->res[0] + r, &tok, loom__gpt2_param(m, 0), loom__gpt2_param(m, 1) + r, 1, 1, C);
	for (int l = 0; l < L; l++) {
		const float *res = kv->res[l & 1];
		float *out = kv->res[(l + 1) & 1], *qkv = kv->qkv[l];
		loom__gpt2_param_use(m, l, 0);
		loom__layernorm_forward(a->ln1 + r, a->ln1_mean + pos, a->ln1_rstd + pos, res + r, lp(m, l, LN1_W),
		                        lp(m, l, LN1_B), 1, C);
		loom__matmul_forward(qkv + 3 * r, a->ln1 + r, lp(m, l, QKV_W), lp(m, l, QKV_B), 1, C, 3 * C);
		attend_one(a->atty + r, qkv, pos, C, NH);
		loom__matmul_forward(a->res2 + r, a->atty + r, lp(m, l, ATTPROJ_W), lp(m, l, ATTPROJ_B), 1, C, C);
		loom__residual_forward(a->res2 + r, res + r, a->res2 + r, (size_t)C);
		loom__layernorm_forward(a->ln2 + r, a->ln2_mean + pos, a->ln2_rstd + pos, a->res2 + r, lp(m, l, LN2_W),
		                        lp(m, l, LN2_B), 1, C);
		loom__matmul_forward(a->fch + 4 * r, a->ln2 + r, lp(m, l, FC_W), lp(m, l, FC_B), 1, C, 4 * C);
		loom__gelu_forward(a->fch_gelu + 4 * r, a->fch + 4 * r, 4 * (size_t)C);
		loom__matmul_forward(out + r, a->fch_gelu + 4 * r, lp(m, l, FCPROJ_W), lp(m, l, FCPROJ_B), 1, 4 * C, C);
		loom__residual_forward(out + r, a->res2 + r, out + r, (size_t)C);
	}
	loom__gpt2_param_use(m, L, 0);
	loom__layernorm_forward(kv->lnf + r, kv->lnf_mean + pos, kv->lnf_rstd + pos, kv->res[L & 1] + r,
	                        loom__gpt2_param(m, nt - 2), loom__gpt2_param(m, nt - 1), 1, C);
	loom__gemm(0, 1, 1, V, C, 1.0f, kv->lnf + r, C, loom__gpt2_param(m, 0), C, 0.0f, kv->logits, V);
}

/* The k-th largest value (1 <= k <= n) of a[0..n), which is reordered (quickselect). */
static float kth_largest(float *a, int n, int k)
{
	int lo = 0, hi = n - 1, want = k - 1;
	while (lo < hi) {
		float pivot = a[lo + (hi - lo) / 2];
		int i = lo, j = hi;
		while (i <= j) {
			while (a[i] > pivot)
				i++;
			while (a[j] < pivot)
				j--;
			if (i <= j) {
				float t = a[i];
				a[i++] = a[j];
				a[j--] = t;
			}
		}
		if (want <= j)
			hi = j;
		else if (want >= i)
			lo = i;
		else
			break;
	}
	return a[want];
}

int loom__sample_token(const float *z, int V, float temperature, int top_k, float *scratch, rng_t *r)
{
	int best = 0;
	for (int i = 1; i < V; i++)
		if (z[i] > z[best])
			best = i;
	if (temperature <= 0.0f)
		return best;
	float thresh = -INFINITY;
	if (top_k > 0 && top_k < V) {
		memcpy(scratch, z, sizeof(float) * (size_t)V);
		thresh = kth_largest(scratch, V, top_k);
	}
	double sum = 0.0, mx = z[best];
	for (int i = 0; i < V; i++)
		if (z[i] >= thresh)
			sum += exp((z[i] - mx) / temperature);
	double u = rng_uniform(r) * sum, acc = 0.0;
	int last = best;
	for (int i = 0; i < V; i++)
		if (z[i] >= thresh) {
			acc += exp((z[i] - mx) / temperature);
			last = i;
			if (acc > u)
				return i;
		}
	return last; /* rounding left u just above the total */
}

int loom_gpt2_generate(loom_gpt2_t *m, const int *prompt, int n_prompt, int max_new, float temperature, int top_k,
                       uint64_t seed, int stop_token, int *out, int *n_out, void (*on_token)(void *ctx, int token),
                       void *ctx)
{
	int rc;
	if ((rc = loom__fam_generate_check(&m->f, prompt, n_prompt, max_new, temperature, top_k, out, n_out)) != LOOM_OK ||
	    (rc = loom_gpt2_kv_cache_alloc(m)) != LOOM_OK)
		return rc;
	loom__gemm_setup_threads(); /* sampling runs in fp32 */
	prompt_forward(m, m->kv, prompt, n_prompt);
	loom__fam_sample(&m->f, step, m->kv->logits, m->kv->topk, n_prompt, max_new, temperature, top_k, seed, stop_token,
	                 out, n_out, on_token, ctx);
	return LOOM_OK;
}
