/* gpt2.c: the GPT-2 model: creation, initialization, forward, backward and the grad-ready callbacks.
 *
 * Invariants: every buffer (parameters, gradients, activations, backward scratch) is allocated and
 * touched once in loom_gpt2_create, so a training step allocates nothing and takes no page faults.
 * Activations are laid out for the capacity B x T given at create; a call with smaller b x t packs
 * its b*t rows at the start of each buffer. The backward walks the network in exact reverse, and
 * reports tensor i to the grad-ready callback as soon as nothing later in this backward adds to it:
 * tensor indices therefore arrive strictly decreasing, each once, with wte (whose gradient also
 * gets the embedding's share) last. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "model/kernels.h"
#include "model/model.h"
#include "model/rng.h"

/* Positions per chunk of the fused classifier (override: LOOM_CLS_CHUNK). See classifier.c. */
#define DEFAULT_CHUNK 512

float *loom__gpt2_param(loom_gpt2_t *m, int i)
{
	return m->params + m->offset[i];
}

float *loom__gpt2_grad(loom_gpt2_t *m, int i)
{
	return m->grads + m->offset[i];
}

/* Tensor index of layer l's j-th tensor (j in the order of gpt2.h). */
static int lt(int l, int j)
{
	return 2 + LOOM_GPT2_LAYER_TENSORS * l + j;
}

enum { LN1_W, LN1_B, QKV_W, QKV_B, ATTPROJ_W, ATTPROJ_B, LN2_W, LN2_B, FC_W, FC_B, FCPROJ_W, FCPROJ_B };

/* Bump allocation inside m->mem: with base NULL it only measures. Offsets stay 64-byte aligned. */
static float *carve(char *base, size_t *off, size_t nfloats)
{
	float *p = base ? (float *)(base + *off) : NULL;
	*off += (nfloats * sizeof(float) + 63) / 64 * 64;
	return p;
}

static size_t layout_acts(loom_gpt2_t *m, char *base)
{
	size_t off = 0, C = (size_t)m->cfg.n_embd, V = (size_t)m->cfg.vocab_size, N = (size_t)m->B * m->T;
	size_t NH = (size_t)m->cfg.n_head, T = (size_t)m->T;
	m->encoded = carve(base, &off, N * C);
	for (int l = 0; l < m->cfg.n_layer; l++) {
		layer_acts_t *a = &m->layers[l];
		a->ln1 = carve(base, &off, N * C);
		a->ln1_mean = carve(base, &off, N);
		a->ln1_rstd = carve(base, &off, N);
		a->qkv = carve(base, &off, N * 3 * C);
		a->att = carve(base, &off, (size_t)m->B * NH * T * T);
		a->atty = carve(base, &off, N * C);
		a->res2 = carve(base, &off, N * C);
		a->ln2 = carve(base, &off, N * C);
		a->ln2_mean = carve(base, &off, N);
		a->ln2_rstd = carve(base, &off, N);
		a->fch = carve(base, &off, N * 4 * C);
		a->fch_gelu = carve(base, &off, N * 4 * C);
		a->res3 = carve(base, &off, N * C);
	}
	m->lnf = carve(base, &off, N * C);
	m->lnf_mean = carve(base, &off, N);
	m->lnf_rstd = carve(base, &off, N);
	m->losses = carve(base, &off, N);
	m->logits = carve(base, &off, (size_t)m->chunk * V);
	m->last_logits = carve(base, &off, (size_t)m->B * V);
	m->dres = carve(base, &off, N * C);
	m->dbtc = carve(base, &off, N * C);
	m->dqkv = carve(base, &off, N * 3 * C);
	m->d4a = carve(base, &off, N * 4 * C);
	m->d4b = carve(base, &off, N * 4 * C);
	m->att_scratch = carve(base, &off, loom__attention_scratch_floats(m->T, m->att_threads));
	return off;
}

int loom_gpt2_create(loom_gpt2_t **out, const loom_gpt2_config_t *cfg, int B, int T)
{
	loom_gpt2_t *m = NULL;
	int rc;
	*out = NULL;
	if ((rc = loom_gpt2_config_check(cfg)) != LOOM_OK)
		return rc;
	if (B <= 0 || T <= 0 || T > cfg->seq_len)
		return loom_seterr(LOOM_EINVAL, "gpt2 create: batch %d x %d tokens (expected B >= 1 and 1 <= T <= seq_len %d)",
		                   B, T, cfg->seq_len);
	if (!(m = loom__calloc(1, sizeof *m)))
		goto nomem;
	m->cfg = *cfg;
	m->B = B;
	m->T = T;
	m->nparams = loom_gpt2_num_params(cfg);
	long chunk = loom_env_long("LOOM_CLS_CHUNK", DEFAULT_CHUNK, NULL);
	m->chunk = (int)LOOM_MAX(1, LOOM_MIN(chunk, (long)B * T));
	m->att_threads = LOOM_MAX(omp_get_max_threads(), omp_get_num_procs());
	if (!(m->layers = loom__calloc((size_t)cfg->n_layer, sizeof *m->layers)) ||
	    !(m->offset = loom__calloc((size_t)loom_gpt2_num_tensors(cfg), sizeof *m->offset)))
		goto nomem;
	for (int i = 0; i < loom_gpt2_num_tensors(cfg); i++) {
		loom_tensor_info_t ti;
		loom_gpt2_tensor_info(cfg, i, &ti);
		m->offset[i] = ti.offset;
	}
	if (!(m->params = loom_alloc_aligned(m->nparams * sizeof(float))) ||
	    !(m->grads_own = loom_alloc_aligned(m->nparams * sizeof(float))))
		goto nomem;
	m->grads = m->grads_own;
	size_t bytes = layout_acts(m, NULL);
	if (!(m->mem = loom_alloc_aligned(bytes)))
		goto nomem;
	layout_acts(m, m->mem);
	loom__gemm_setup_threads();
	*out = m;
	return LOOM_OK;
nomem:
	loom_gpt2_destroy(m);
	return loom_seterr(LOOM_ENOMEM, "gpt2 create: out of memory for L%d C%d V%d with batch %d x %d", cfg->n_layer,
	                   cfg->n_embd, cfg->vocab_size, B, T);
}

void loom_gpt2_destroy(loom_gpt2_t *m)
{
	if (!m)
		return;
	loom_free_aligned(m->mem);
	loom_free_aligned(m->params);
	loom_free_aligned(m->grads_own);
	free(m->layers);
	free(m->offset);
	free(m);
}

const loom_gpt2_config_t *loom_gpt2_config(const loom_gpt2_t *m)
{
	return &m->cfg;
}

float *loom_gpt2_params(loom_gpt2_t *m)
{
	return m->params;
}

float *loom_gpt2_grads(loom_gpt2_t *m)
{
	return m->grads;
}

int loom_gpt2_set_grad_buffer(loom_gpt2_t *m, float *grads)
{
	if (!grads)
		return loom_seterr(LOOM_EINVAL, "gpt2 set_grad_buffer: NULL buffer");
	m->grads = grads;
	return LOOM_OK;
}

void loom_gpt2_on_grad_ready(loom_gpt2_t *m, loom_grad_ready_fn fn, void *ctx)
{
	m->on_ready = fn;
	m->on_ready_ctx = ctx;
}


void loom_gpt2_init(loom_gpt2_t *m, uint64_t seed)
{
	/* Each tensor draws from its own stream, seeded from (seed, tensor index): a tensor's values do
	 * not depend on the sizes of the tensors before it. */
	int n = loom_gpt2_num_tensors(&m->cfg);
	double proj_std = 0.02 / sqrt(2.0 * m->cfg.n_layer);
	for (int i = 0; i < n; i++) {
		loom_tensor_info_t ti;
		rng_t r;
		loom_gpt2_tensor_info(&m->cfg, i, &ti);
		float *p = m->params + ti.offset;
		size_t len = strlen(ti.name);
		if (ti.ndim == 2) {
			int is_proj = strstr(ti.name, "c_proj.weight") != NULL;
			double std = is_proj ? proj_std : 0.02;
			rng_seed(&r, seed ^ (0x9e3779b97f4a7c15ULL * (uint64_t)(i + 1)));
			for (size_t k = 0; k < ti.numel; k++)
				p[k] = (float)(std * rng_normal(&r));
		} else {
			float v = len > 7 && strcmp(ti.name + len - 7, ".weight") == 0 ? 1.0f : 0.0f; /* LayerNorm weight */
			for (size_t k = 0; k < ti.numel; k++)
				p[k] = v;
		}
	}
}

/* ---- forward ----------------------------------------------------------------------------------- */

int loom__gpt2_check_tokens(const loom_gpt2_t *m, const int *ids, int B, int T, const char *what)
{
	int V = m->cfg.vocab_size;
	if (!ids)
		return loom_seterr(LOOM_EINVAL, "gpt2: %s is NULL", what);
	for (int i = 0; i < B * T; i++)
		if (ids[i] < 0 || ids[i] >= V)
			return loom_seterr(LOOM_EINVAL, "gpt2: token id %d at %s[b=%d][t=%d] is outside the vocabulary [0, %d)",
			                   ids[i], what, i / T, i % T, V);
	return LOOM_OK;
}

static int check_call(const loom_gpt2_t *m, const int *inputs, const int *targets, int B, int T, const char *op)
{
	int rc;
	if (B <= 0 || T <= 0 || B > m->B || T > m->T)
		return loom_seterr(LOOM_EINVAL, "gpt2 %s: batch %d x %d tokens does not fit the model's %d x %d (from create)",
		                   op, B, T, m->B, m->T);
	if ((rc = loom__gpt2_check_tokens(m, inputs, B, T, "inputs")) != LOOM_OK)
		return rc;
	if (targets && (rc = loom__gpt2_check_tokens(m, targets, B, T, "targets")) != LOOM_OK)
		return rc;
	return LOOM_OK;
}

#define PROF(k, stmt) PROFF(k, 0.0, stmt)
/* ... also counting `flops` floating-point operations for the report's GFLOP/s column */
#define PROFF(k, flops, stmt)                                                                                      \
	do {                                                                                                           \
		double t0_ = m->prof_on ? loom_now() : 0.0;                                                                \
		stmt;                                                                                                      \
		if (m->prof_on)                                                                                            \
			loom__gpt2_prof_add(m, PROF_##k, t0_, (flops));                                                              \
	} while (0)

void loom__gpt2_forward_body(loom_gpt2_t *m, const int *inputs, int B, int T)
{
	int C = m->cfg.n_embd, NH = m->cfg.n_head, N = B * T, nt = loom_gpt2_num_tensors(&m->cfg);
	size_t NC = (size_t)N * C;
	double fN = N, fC = C; /* for the flop counts */
	PROF(ENCODER, loom__encoder_forward(m->encoded, inputs, loom__gpt2_param(m, 0), loom__gpt2_param(m, 1), B, T, C));
	const float *res = m->encoded;
	for (int l = 0; l < m->cfg.n_layer; l++) {
		layer_acts_t *a = &m->layers[l];
#define W(j) loom__gpt2_param(m, lt(l, j))
		PROF(LAYERNORM, loom__layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, res, W(LN1_W), W(LN1_B), N, C));
		PROFF(MATMUL, 6 * fN * fC * fC, loom__matmul_forward(a->qkv, a->ln1, W(QKV_W), W(QKV_B), N, C, 3 * C));
		PROFF(ATTENTION, 4.0 * B * T * T * fC, loom__attention_forward(a->atty, a->att, a->qkv, B, T, C, NH));
		PROFF(MATMUL, 2 * fN * fC * fC, loom__matmul_forward(a->res2, a->atty, W(ATTPROJ_W), W(ATTPROJ_B), N, C, C));
		PROF(RESIDUAL, loom__residual_forward(a->res2, res, a->res2, NC));
		PROF(LAYERNORM, loom__layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, W(LN2_W), W(LN2_B), N, C));
		PROFF(MATMUL, 8 * fN * fC * fC, loom__matmul_forward(a->fch, a->ln2, W(FC_W), W(FC_B), N, C, 4 * C));
		PROF(GELU, loom__gelu_forward(a->fch_gelu, a->fch, NC * 4));
		PROFF(MATMUL, 8 * fN * fC * fC, loom__matmul_forward(a->res3, a->fch_gelu, W(FCPROJ_W), W(FCPROJ_B), N, 4 * C, C));
		PROF(RESIDUAL, loom__residual_forward(a->res3, a->res2, a->res3, NC));
#undef W
		res = a->res3;
	}
	PROF(LAYERNORM, loom__layernorm_forward(m->lnf, m->lnf_mean, m->lnf_rstd, res, loom__gpt2_param(m, nt - 2),
	                                  loom__gpt2_param(m, nt - 1), N, C));
}

static float mean_loss(const float *losses, int N)
{
	double s = 0.0;
	for (int i = 0; i < N; i++)
		s += losses[i];
	return (float)(s / N);
}

int loom_gpt2_forward(loom_gpt2_t *m, const int *inputs, const int *targets, int B, int T, float *loss)
{
	int rc, C = m->cfg.n_embd, V = m->cfg.vocab_size;
	if ((rc = check_call(m, inputs, targets, B, T, "forward")) != LOOM_OK)
		return rc;
	loom__gemm_setup_threads();
	loom__gpt2_forward_body(m, inputs, B, T);
	const float *wte = loom__gpt2_param(m, 0);
	if (targets) {
		PROFF(CLASSIFIER, 2.0 * B * T * C * V,
		      loom__classifier_forward_backward(m->losses, NULL, NULL, m->logits, m->chunk, m->lnf, wte, targets, 0.0f, B * T,
		                                  C, V));
		if (loss)
			*loss = mean_loss(m->losses, B * T);
	} else {
		/* rows b*T + T-1 of lnf are T*C floats apart */
		PROFF(CLASSIFIER, 2.0 * B * C * V,
		      loom__gemm(0, 1, B, V, C, 1.0f, m->lnf + (size_t)(T - 1) * C, T * C, wte, C, 0.0f, m->last_logits, V));
	}
	return LOOM_OK;
}

const float *loom_gpt2_logits(const loom_gpt2_t *m)
{
	return m->last_logits;
}

/* ---- backward ---------------------------------------------------------------------------------- */

static void ready(loom_gpt2_t *m, int i)
{
	if (m->on_ready)
		PROF(CALLBACK, m->on_ready(m->on_ready_ctx, i));
}

static void zero_par(float *p, size_t n)
{
	const size_t block = 16384;
#pragma omp parallel for schedule(static) if (n >= 4 * block)
	for (size_t i = 0; i < n; i += block)
		memset(p + i, 0, sizeof(float) * (n - i < block ? n - i : block));
}

static void zero(loom_gpt2_t *m, float *p, size_t n)
{
	PROF(ZERO, zero_par(p, n));
}

void loom_gpt2_zero_grad(loom_gpt2_t *m)
{
	zero_par(m->grads, m->nparams);
}

int loom_gpt2_forward_backward(loom_gpt2_t *m, const int *inputs, const int *targets, int B, int T,
                               float grad_scale, float *loss)
{
	int rc, C = m->cfg.n_embd, NH = m->cfg.n_head, V = m->cfg.vocab_size, N = B * T, L = m->cfg.n_layer;
	int nt = loom_gpt2_num_tensors(&m->cfg);
	size_t NC = (size_t)N * C;
	if (!targets)
		return loom_seterr(LOOM_EINVAL, "gpt2 forward_backward: targets are NULL");
	if ((rc = check_call(m, inputs, targets, B, T, "forward_backward")) != LOOM_OK)
		return rc;
	loom__gemm_setup_threads();
	loom__gpt2_forward_body(m, inputs, B, T);

	/* lm head, softmax, cross-entropy and their backward: dlnf into dbtc, wte's first share */
	double fN = N, fC = C; /* for the flop counts */
	zero(m, m->dbtc, NC);
	PROFF(CLASSIFIER, 6 * fN * fC * V,
	      loom__classifier_forward_backward(m->losses, m->dbtc, loom__gpt2_grad(m, 0), m->logits, m->chunk, m->lnf, loom__gpt2_param(m, 0),
	                                  targets, grad_scale / (float)N, N, C, V));
	if (loss)
		*loss = mean_loss(m->losses, N);
	zero(m, m->dres, NC);
	const float *res_last = L > 0 ? m->layers[L - 1].res3 : m->encoded;
	PROF(LAYERNORM_BWD, loom__layernorm_backward(m->dres, loom__gpt2_grad(m, nt - 2), loom__gpt2_grad(m, nt - 1), m->dbtc, res_last,
	                                       loom__gpt2_param(m, nt - 2), m->lnf_mean, m->lnf_rstd, N, C));
	ready(m, nt - 1);
	ready(m, nt - 2);

	for (int l = L - 1; l >= 0; l--) {
		layer_acts_t *a = &m->layers[l];
		const float *res_in = l > 0 ? m->layers[l - 1].res3 : m->encoded;
#define W(j) loom__gpt2_param(m, lt(l, j))
#define G(j) loom__gpt2_grad(m, lt(l, j))
		/* MLP: res3 = res2 + fc_proj(gelu(fc(ln2(res2)))); dres is d res3 and passes through to d res2 */
		zero(m, m->d4a, NC * 4);
		PROFF(MATMUL_BWD, 16 * fN * fC * fC,
		      loom__matmul_backward(m->d4a, G(FCPROJ_W), G(FCPROJ_B), m->dres, a->fch_gelu, W(FCPROJ_W), N, 4 * C, C));
		ready(m, lt(l, FCPROJ_B));
		ready(m, lt(l, FCPROJ_W));
		zero(m, m->d4b, NC * 4);
		PROF(GELU_BWD, loom__gelu_backward(m->d4b, a->fch, m->d4a, NC * 4));
		zero(m, m->dbtc, NC);
		PROFF(MATMUL_BWD, 16 * fN * fC * fC,
		      loom__matmul_backward(m->dbtc, G(FC_W), G(FC_B), m->d4b, a->ln2, W(FC_W), N, C, 4 * C));
		ready(m, lt(l, FC_B));
		ready(m, lt(l, FC_W));
		PROF(LAYERNORM_BWD, loom__layernorm_backward(m->dres, G(LN2_W), G(LN2_B), m->dbtc, a->res2, W(LN2_W), a->ln2_mean,
		                                       a->ln2_rstd, N, C));
		ready(m, lt(l, LN2_B));
		ready(m, lt(l, LN2_W));
		/* attention: res2 = res_in + attn_proj(attention(qkv(ln1(res_in)))) */
		zero(m, m->dbtc, NC);
		PROFF(MATMUL_BWD, 4 * fN * fC * fC,
		      loom__matmul_backward(m->dbtc, G(ATTPROJ_W), G(ATTPROJ_B), m->dres, a->atty, W(ATTPROJ_W), N, C, C));
		ready(m, lt(l, ATTPROJ_B));
		ready(m, lt(l, ATTPROJ_W));
		zero(m, m->dqkv, NC * 3);
		PROFF(ATTENTION_BWD, 8.0 * B * T * T * fC,
		      loom__attention_backward(m->dqkv, m->att_scratch, m->att_threads, m->dbtc, a->qkv, a->att, B, T, C, NH));
		zero(m, m->dbtc, NC);
		PROFF(MATMUL_BWD, 12 * fN * fC * fC,
		      loom__matmul_backward(m->dbtc, G(QKV_W), G(QKV_B), m->dqkv, a->ln1, W(QKV_W), N, C, 3 * C));
		ready(m, lt(l, QKV_B));
		ready(m, lt(l, QKV_W));
		PROF(LAYERNORM_BWD, loom__layernorm_backward(m->dres, G(LN1_W), G(LN1_B), m->dbtc, res_in, W(LN1_W), a->ln1_mean,
		                                       a->ln1_rstd, N, C));
		ready(m, lt(l, LN1_B));
		ready(m, lt(l, LN1_W));
#undef W
#undef G
	}
	PROF(ENCODER_BWD, loom__encoder_backward(loom__gpt2_grad(m, 0), loom__gpt2_grad(m, 1), m->dres, inputs, B, T, C));
	ready(m, 1);
	ready(m, 0);
	return LOOM_OK;
}
