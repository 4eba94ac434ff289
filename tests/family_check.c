/* family_check.c: the model-family contract checked once for every family (family_check.h). */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/model.h"
#include "core/util.h"
#include "model/family.h"
#include "family_check.h"
#include "test.h"

uint32_t fc_lcg(uint32_t *s)
{
	*s = *s * 1664525u + 1013904223u;
	return *s >> 8;
}

float fc_urand(uint32_t *s)
{
	return (float)fc_lcg(s) / 8388608.0f - 1.0f;
}

void fc_make_tokens(int *in, int *tg, int n, int V, uint32_t seed)
{
	for (int i = 0; i < n; i++) {
		in[i] = (int)(fc_lcg(&seed) % (uint32_t)V);
		tg[i] = (int)(fc_lcg(&seed) % (uint32_t)V);
	}
}

int fc_write_file(const char *dir, const char *name, const void *p, size_t n)
{
	char path[700];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	return test_write_file(path, p, n);
}

double *fc_read_f64(const char *dir, const char *name, size_t n)
{
	char path[700];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	FILE *f = fopen(path, "rb");
	double *p = f ? malloc(n * sizeof(double)) : NULL;
	if (p && fread(p, sizeof(double), n, f) != n) {
		free(p);
		p = NULL;
	}
	if (f)
		fclose(f);
	return p;
}

int fc_views_external(const loom_model_config_t *cp, fc_params_fn test_params)
{
	loom_model_config_t c = *cp;
	enum { B = 1, T = 10 };
	int in[B * T], tg[B * T];
	loom_model_t *a = NULL, *v = NULL;
	loom_model_opts_t oa = {.B = B, .T = T}, ov = {.B = B, .T = T, .no_own_params = 1, .no_own_grads = 1};
	CHECK_OK(loom_model_create(&a, &c, &oa));
	CHECK_OK(loom_model_create(&v, &c, &ov));
	CHECK(loom_model_params(v) == NULL && loom_model_tensor_param(v, 0) == NULL);
	test_params(a, 5);
	size_t np = loom_model_param_count(a);
	float *p = malloc(np * sizeof(float)), *g = calloc(np, sizeof(float));
	CHECK(p && g);
	memcpy(p, loom_model_params(a), np * sizeof(float));
	const loom_tensor_info_t *tt = loom_model_tensors(v, NULL);
	for (int u = -1; u <= c.n_layer; u++) {
		int first, end;
		loom_model_unit_tensors(&c, u, &first, &end);
		CHECK_OK(loom_model_set_unit_view(v, u, p + tt[first].offset, g + tt[first].offset));
	}
	fc_make_tokens(in, tg, B * T, c.vocab_size, 2);
	loom_model_zero_grad(a);
	for (size_t i = 0; i < np; i++)
		g[i] = 1.0f;
	loom_model_zero_grad(v);
	for (size_t i = 0; i < np; i++)
		CHECK(g[i] == 0.0f);
	float la, lv;
	CHECK_OK(loom_model_forward_backward(a, in, tg, B, T, 1.0f, &la));
	CHECK_OK(loom_model_forward_backward(v, in, tg, B, T, 1.0f, &lv));
	CHECK_FEQ(la, lv);
	CHECK(memcmp(g, loom_model_grads(a), np * sizeof(float)) == 0);
	free(p), free(g);
	loom_model_destroy(a), loom_model_destroy(v);
	return 0;
}

typedef struct {
	loom_model_t *m;
	const loom_model_config_t *c;
	const float *master;
	float *gather;
	int uses;
} gather_t;

static void gather_unit(void *ctx, int unit, int phase)
{
	gather_t *g = ctx;
	int first, end;
	const loom_tensor_info_t *tt = loom_model_tensors(g->m, NULL);
	(void)phase;
	g->uses++;
	if (unit < 0)
		return;
	loom_model_unit_tensors(g->c, unit, &first, &end);
	size_t off = tt[first].offset, n = tt[end - 1].offset + tt[end - 1].numel - off;
	for (size_t i = 0; i < n; i++)
		g->gather[i] = NAN;
	for (int u = 0; u <= g->c->n_layer; u++) /* every other unit's views at poison */
		loom_model_set_unit_view(g->m, u, g->gather + n, NULL);
	memcpy(g->gather, g->master + off, n * sizeof(float));
	loom_model_set_unit_view(g->m, unit, g->gather, NULL);
}

int fc_param_use_gathers_units(const loom_model_config_t *cp, fc_params_fn test_params)
{
	loom_model_config_t c = *cp;
	enum { B = 2, T = 12 };
	int in[B * T], tg[B * T];
	loom_model_t *a = NULL, *z = NULL;
	loom_model_opts_t oa = {.B = B, .T = T}, oz = {.B = B, .T = T, .no_own_params = 1};
	CHECK_OK(loom_model_create(&a, &c, &oa));
	CHECK_OK(loom_model_create(&z, &c, &oz));
	test_params(a, 8);
	fc_make_tokens(in, tg, B * T, c.vocab_size, 9);
	size_t np = loom_model_param_count(a);
	gather_t g = {.m = z, .c = &c, .master = loom_model_params(a), .gather = malloc(2 * np * sizeof(float))};
	CHECK(g.gather != NULL);
	for (size_t i = 0; i < 2 * np; i++)
		g.gather[i] = NAN;
	CHECK_OK(loom_model_set_unit_view(z, -1, loom_model_params(a), NULL));
	loom_model_on_param_use(z, gather_unit, &g);
	float la, lz;
	loom_model_zero_grad(a), loom_model_zero_grad(z);
	CHECK_OK(loom_model_forward_backward(a, in, tg, B, T, 1.0f, &la));
	CHECK_OK(loom_model_forward_backward(z, in, tg, B, T, 1.0f, &lz));
	CHECK_EQ(g.uses, 2 * (c.n_layer + 2));
	CHECK_FEQ(la, lz);
	CHECK(memcmp(loom_model_grads(a), loom_model_grads(z), np * sizeof(float)) == 0);
	free(g.gather);
	loom_model_destroy(a), loom_model_destroy(z);
	return 0;
}

int fc_bf16_close_to_fp32(const loom_model_config_t *cp, fc_params_fn test_params)
{
	loom_model_config_t c = *cp;
	enum { B = 2, T = 16 };
	int in[B * T], tg[B * T];
	loom_model_t *f = NULL, *h = NULL;
	loom_model_opts_t of = {.B = B, .T = T}, oh = {.B = B, .T = T, .dtype = LOOM_COMPUTE_BF16};
	CHECK_OK(loom_model_create(&f, &c, &of));
	CHECK_OK(loom_model_create(&h, &c, &oh));
	CHECK_EQ(loom_model_dtype(h), LOOM_COMPUTE_BF16);
	test_params(f, 2);
	size_t np = loom_model_param_count(f);
	memcpy(loom_model_params(h), loom_model_params(f), np * sizeof(float));
	fc_make_tokens(in, tg, B * T, c.vocab_size, 3);
	float lf, lh;
	loom_model_zero_grad(f), loom_model_zero_grad(h);
	CHECK_OK(loom_model_forward_backward(f, in, tg, B, T, 1.0f, &lf));
	CHECK_OK(loom_model_forward_backward(h, in, tg, B, T, 1.0f, &lh));
	CHECK_MSG(fabsf(lf - lh) <= 1e-2f * lf && lf != lh, "loss fp32 %.9g, bf16 %.9g", lf, lh);
	double d2 = 0, n2 = 0;
	for (size_t i = 0; i < np; i++) {
		double d = (double)loom_model_grads(h)[i] - loom_model_grads(f)[i];
		d2 += d * d, n2 += (double)loom_model_grads(f)[i] * loom_model_grads(f)[i];
	}
	CHECK_MSG(sqrt(d2 / n2) < 5e-2, "bf16 gradients off by %.3g of their norm", sqrt(d2 / n2));
	fprintf(stderr, "  bf16: loss %.3g relative, gradients %.3g of their norm from fp32\n", fabs(lf - lh) / lf,
	        sqrt(d2 / n2));
	loom_model_destroy(f), loom_model_destroy(h);
	return 0;
}

int fc_alloc_failures_clean(const loom_model_config_t *cp)
{
	loom_model_config_t c = *cp;
	loom_model_opts_t o = {.B = 1, .T = 8, .arenas = 2};
	loom_model_t *m = NULL;
	int failed = 0, prompt[2] = {1, 2}, out[2], n_out;
	for (long k = 1; k < 40; k++) {
		loom__fault_alloc_set(k);
		int rc = loom_model_create(&m, &c, &o);
		int hit = loom__fault_alloc_hit();
		loom__fault_alloc_set(0);
		if (!hit) {
			CHECK_OK(rc);
			break;
		}
		CHECK_ERR(rc, LOOM_ENOMEM);
		CHECK(m == NULL);
		failed++;
	}
	CHECK(failed >= 8 && m != NULL);
	loom_model_init(m, 1);
	loom__fault_alloc_set(1);
	int rc = loom_model_generate(m, prompt, 2, 2, 0.0f, 0, 1, -1, out, &n_out, NULL, NULL);
	loom__fault_alloc_set(0);
	CHECK_ERR(rc, LOOM_ENOMEM);
	CHECK_OK(loom_model_generate(m, prompt, 2, 2, 0.0f, 0, 1, -1, out, &n_out, NULL, NULL));
	CHECK_EQ(n_out, 2);
	loom_model_destroy(m);
	return 0;
}

int fc_tp_reduce(void *ctx, float *buf, size_t n, loom_tp_op_t op)
{
	fc_tp_rank_t *r = ctx;
	fc_tp_group_t *g = r->g;
	if (n > FC_TP_SCRATCH || (op != LOOM_TP_SUM && op != LOOM_TP_MAX && op != LOOM_TP_ALLGATHER &&
	                       op != LOOM_TP_REDUCE_SCATTER))
		return LOOM_EINVAL;
	g->slot[r->rank] = buf;
	g->calls[r->rank]++;
	pthread_barrier_wait(&g->bar);
	const float *a = g->slot[0], *b = g->slot[1];
	float *s = g->scratch[r->rank];
	size_t h = n / 2;
	for (size_t i = 0; i < n; i++)
		s[i] = op == LOOM_TP_SUM ? a[i] + b[i] : op == LOOM_TP_MAX ? fmaxf(a[i], b[i])
		     : op == LOOM_TP_ALLGATHER ? (i < h ? a[i] : b[i])
		                               : ((i < h) == (r->rank == 0) ? a[i] + b[i] : buf[i]);
	pthread_barrier_wait(&g->bar);
	memcpy(buf, s, n * sizeof(float));
	return LOOM_OK;
}

void *fc_tp_run(void *arg)
{
	fc_tp_rank_t *r = arg;
	r->rc = loom_model_forward(r->m, r->in, r->tg, r->B, r->T, &r->loss_fwd);
	if (r->rc == LOOM_OK)
		r->rc = loom_model_forward_backward(r->m, r->in, r->tg, r->B, r->T, 1.0f, &r->loss);
	return NULL;
}

typedef struct {
	loom_model_t *m;
	float logits[16][128];
	int n, V;
} gen_t;

/* on_token: the KV cache's logits that chose the token (the base's kv_logits, model/family.h). */
static void keep_logits(void *ctx, int tok)
{
	gen_t *g = ctx;
	(void)tok;
	if (g->n < 16)
		memcpy(g->logits[g->n++], ((loom__fam_t *)g->m)->kv_logits, sizeof(float) * (size_t)g->V);
}

int fc_generate_matches_forward(const loom_model_config_t *c, fc_params_fn test_params, float tol, int relative)
{
	enum { T = 16 };
	loom_model_t *m = NULL;
	loom_model_opts_t o = {.B = 1, .T = T};
	int prompt[3] = {5, 17, 33}, out[T], n_out = 0, ctx[T];
	gen_t g;
	memset(&g, 0, sizeof g);
	CHECK(c->vocab_size <= 128);
	CHECK_OK(loom_model_create(&m, c, &o));
	test_params(m, 12);
	g.m = m, g.V = c->vocab_size;
	CHECK_OK(loom_model_generate(m, prompt, 3, 20, 0.0f, 0, 1, -1, out, &n_out, keep_logits, &g));
	CHECK_EQ(n_out, T - 3); /* stops when the context reaches T */
	CHECK_EQ(g.n, n_out);
	memcpy(ctx, prompt, sizeof prompt);
	memcpy(ctx + 3, out, sizeof(int) * (size_t)n_out);
	double worst = 0.0;
	for (int k = 0; k < n_out; k++) {
		int t = 3 + k; /* the logits that chose out[k] are position t - 1's */
		CHECK_OK(loom_model_forward(m, ctx, NULL, 1, t, NULL));
		const float *lg = loom_model_logits(m);
		int best = 0;
		for (int v = 0; v < c->vocab_size; v++) {
			worst = fmax(worst, fabs(lg[v] - g.logits[k][v]));
			CHECK_MSG(fabsf(lg[v] - g.logits[k][v]) <= tol * (relative ? fmaxf(1.0f, fabsf(lg[v])) : 1.0f),
			          "position %d, logit %d: cache %.9g, forward %.9g", t - 1, v, g.logits[k][v], lg[v]);
			best = lg[v] > lg[best] ? v : best;
		}
		CHECK_EQ(out[k], best);
	}
	fprintf(stderr, "  KV-cache logits within %.3g of the full forward's over %d positions\n", worst, n_out);
	/* sampling: the same seed gives the same tokens; top_k 1 is greedy; a stop token ends early */
	int a[8], b[8], na, nb;
	CHECK_OK(loom_model_generate(m, prompt, 3, 8, 1.0f, 5, 99, -1, a, &na, NULL, NULL));
	CHECK_OK(loom_model_generate(m, prompt, 3, 8, 1.0f, 5, 99, -1, b, &nb, NULL, NULL));
	CHECK_EQ(na, 8);
	CHECK(memcmp(a, b, sizeof a) == 0);
	CHECK_OK(loom_model_generate(m, prompt, 3, 8, 3.0f, 1, 7, -1, b, &nb, NULL, NULL));
	CHECK(memcmp(b, out, sizeof(int) * 8) == 0);
	int first = 0;
	while (out[first] != out[4])
		first++;
	CHECK_OK(loom_model_generate(m, prompt, 3, 8, 0.0f, 0, 1, out[4], b, &nb, NULL, NULL));
	CHECK_EQ(nb, first + 1);
	CHECK_EQ(b[nb - 1], out[4]);
	CHECK_ERR(loom_model_generate(m, prompt, 0, 8, 0.0f, 0, 1, -1, b, &nb, NULL, NULL), LOOM_EINVAL);
	prompt[1] = c->vocab_size;
	CHECK_ERR(loom_model_generate(m, prompt, 3, 8, 0.0f, 0, 1, -1, b, &nb, NULL, NULL), LOOM_EINVAL);
	char want[160];
	snprintf(want, sizeof want, "%s generate: prompt token %d at 1 is outside the vocabulary [0, %d)",
	         loom_model_family(c->arch)->name, c->vocab_size, c->vocab_size);
	CHECK_CONTAINS(loom_errmsg(), want);
	loom_model_destroy(m);
	return 0;
}

void fc_on_ready(void *ctx, int i)
{
	fc_hooks_t *h = ctx;
	if (h->n < 512)
		h->order[h->n++] = i;
}

void fc_on_use(void *ctx, int unit, int phase)
{
	fc_hooks_t *h = ctx;
	if (h->nuse < 512)
		h->uses[h->nuse][0] = unit, h->uses[h->nuse++][1] = phase;
}

int fc_hooks_order(const loom_model_config_t *c, fc_params_fn test_params, int want_tensors)
{
	enum { B = 2, T = 12 };
	int in[B * T], tg[B * T], n, L = c->n_layer;
	loom_model_t *m = NULL;
	loom_model_opts_t o = {.B = B, .T = T};
	fc_hooks_t h;
	memset(&h, 0, sizeof h);
	CHECK_OK(loom_model_create(&m, c, &o));
	test_params(m, 3);
	fc_make_tokens(in, tg, B * T, c->vocab_size, 5);
	loom_model_tensors(m, &n);
	CHECK_EQ(n, want_tensors);
	loom_model_on_grad_ready(m, fc_on_ready, &h);
	loom_model_on_param_use(m, fc_on_use, &h);
	loom_model_zero_grad(m);
	float loss;
	CHECK_OK(loom_model_forward_backward(m, in, tg, B, T, 1.0f, &loss));
	CHECK_EQ(h.n, n);
	for (int i = 0; i < n; i++)
		CHECK_EQ(h.order[i], n - 1 - i);
	/* (-1,0) (0,0) .. (L,0), then (L,1) .. (-1,1) */
	CHECK_EQ(h.nuse, 2 * (L + 2));
	for (int i = 0; i < L + 2; i++) {
		CHECK_EQ(h.uses[i][0], i - 1);
		CHECK_EQ(h.uses[i][1], 0);
		CHECK_EQ(h.uses[L + 2 + i][0], L - i);
		CHECK_EQ(h.uses[L + 2 + i][1], 1);
	}
	/* accumulation: two micro-steps of scale 1/2 equal one of scale 1 (the same batch) up to rounding:
	 * the GEMMs add their products into the gradient inside the sum */
	size_t np = loom_model_param_count(m);
	float *g1 = malloc(np * sizeof(float));
	CHECK(g1 != NULL);
	memcpy(g1, loom_model_grads(m), np * sizeof(float));
	loom_model_zero_grad(m);
	h.n = 0;
	CHECK_OK(loom_model_forward_backward(m, in, tg, B, T, 0.5f, &loss));
	CHECK_OK(loom_model_forward_backward(m, in, tg, B, T, 0.5f, &loss));
	CHECK_EQ(h.n, 2 * n);
	for (size_t i = 0; i < np; i++)
		CHECK_MSG(fabsf(loom_model_grads(m)[i] - g1[i]) <= 1e-6f * fabsf(g1[i]) + 1e-9f,
		          "gradient %zu: %.9g after two halves, %.9g in one", i, loom_model_grads(m)[i], g1[i]);
	free(g1);
	loom_model_destroy(m);
	return 0;
}

int fc_units_arenas_rows(const loom_model_config_t *cp, fc_params_fn test_params)
{
	loom_model_config_t c = *cp;
	enum { B = 2, T = 13 };
	int in[2][B * T], tg[2][B * T], L = c.n_layer;
	loom_model_t *a = NULL, *u = NULL;
	loom_model_opts_t o1 = {.B = B, .T = T}, o2 = {.B = B, .T = T, .arenas = 2};
	CHECK_OK(loom_model_create(&a, &c, &o1));
	CHECK_OK(loom_model_create(&u, &c, &o2));
	test_params(a, 9);
	memcpy(loom_model_params(u), loom_model_params(a), loom_model_param_count(a) * sizeof(float));
	fc_make_tokens(in[0], tg[0], B * T, c.vocab_size, 21);
	fc_make_tokens(in[1], tg[1], B * T, c.vocab_size, 22);
	float la[2], lu[2], part;
	loom_model_zero_grad(a);
	loom_model_zero_grad(u);
	for (int k = 0; k < 2; k++)
		CHECK_OK(loom_model_forward_backward(a, in[k], tg[k], B, T, 0.5f, &la[k]));
	for (int k = 0; k < 2; k++) {
		CHECK_OK(loom_model_embed_forward(u, k, in[k], B, T));
		for (int l = 0; l < L; l++)
			CHECK_OK(loom_model_block_forward(u, k, l, B, T));
	}
	for (int k = 1; k >= 0; k--) {
		int split = 7;
		CHECK_OK(loom_model_head_forward_backward_rows(u, k, tg[k], B, T, 0, split, 0.5f, &lu[k]));
		CHECK_OK(loom_model_head_forward_backward_rows(u, k, tg[k], B, T, split, B * T - split, 0.5f, &part));
		lu[k] += part;
		for (int l = L - 1; l >= 0; l--)
			CHECK_OK(loom_model_block_backward(u, k, l, B, T));
		CHECK_OK(loom_model_embed_backward(u, k, in[k], B, T));
	}
	for (int k = 0; k < 2; k++)
		CHECK_MSG(fabsf(la[k] - lu[k]) <= 1e-6f * la[k], "arena %d: loss %.9g whole, %.9g by units", k, la[k], lu[k]);
	size_t np = loom_model_param_count(a);
	double worst = 0.0;
	for (size_t i = 0; i < np; i++)
		worst = fmax(worst, fabs(loom_model_grads(a)[i] - loom_model_grads(u)[i]));
	CHECK_MSG(worst <= 1e-6, "gradients differ by %.3g between the whole pass and the unit calls", worst);
	/* errors name the call */
	CHECK_ERR(loom_model_block_forward(u, 2, 0, B, T), LOOM_EINVAL);
	char want[160];
	snprintf(want, sizeof want, "%s block_forward: arena 2 out of range [0, 2)", loom_model_family(c.arch)->name);
	CHECK_CONTAINS(loom_errmsg(), want);
	in[0][3] = c.vocab_size;
	CHECK_ERR(loom_model_embed_forward(u, 0, in[0], B, T), LOOM_EINVAL);
	snprintf(want, sizeof want, "token id %d at inputs[b=0][t=3] is outside the vocabulary [0, %d)", c.vocab_size,
	         c.vocab_size);
	CHECK_CONTAINS(loom_errmsg(), want);
	loom_model_destroy(a);
	loom_model_destroy(u);
	return 0;
}

int fc_act_ckpt_bit_identical(const loom_model_config_t *cp, fc_params_fn test_params)
{
	loom_model_config_t c = *cp;
	enum { B = 2, T = 16 };
	int in[2][B * T], tg[2][B * T], L = c.n_layer;
	loom_model_t *m[3] = {NULL, NULL, NULL};
	loom_act_ckpt_t modes[3] = {LOOM_ACT_CKPT_NONE, LOOM_ACT_CKPT_BLOCKS, LOOM_ACT_CKPT_SELECTIVE};
	float loss[3][2];
	fc_make_tokens(in[0], tg[0], B * T, c.vocab_size, 31);
	fc_make_tokens(in[1], tg[1], B * T, c.vocab_size, 32);
	for (int k = 0; k < 3; k++) {
		loom_model_opts_t o = {.B = B, .T = T, .arenas = 2, .act_ckpt = modes[k]};
		loom_model_act_bytes_t want, got;
		CHECK_OK(loom_model_create(&m[k], &c, &o));
		CHECK_OK(loom_model_act_bytes(&c, &o, &want));
		loom_model_model_act_bytes(m[k], &got);
		CHECK(memcmp(&want, &got, sizeof want) == 0);
		CHECK_EQ(want.total, want.kept + want.recompute + want.head + want.backward);
		test_params(m[k], 6);
		loom_model_zero_grad(m[k]);
		CHECK_OK(loom_model_forward_backward(m[k], in[0], tg[0], B, T, 0.5f, &loss[k][0]));
		for (int a = 0; a < 2; a++) {
			CHECK_OK(loom_model_embed_forward(m[k], a, in[a], B, T));
			for (int l = 0; l < L; l++)
				CHECK_OK(loom_model_block_forward(m[k], a, l, B, T));
		}
		for (int a = 1; a >= 0; a--) {
			CHECK_OK(loom_model_head_forward_backward(m[k], a, tg[a], B, T, 0.25f, &loss[k][a]));
			for (int l = L - 1; l >= 0; l--)
				CHECK_OK(loom_model_block_backward(m[k], a, l, B, T));
			CHECK_OK(loom_model_embed_backward(m[k], a, in[a], B, T));
		}
		CHECK_EQ(loom_model_recomputes(m[k]), k == 0 ? 0 : 3 * L);
	}
	size_t np = loom_model_param_count(m[0]);
	for (int k = 1; k < 3; k++) {
		CHECK_FEQ(loss[k][0], loss[0][0]);
		CHECK_FEQ(loss[k][1], loss[0][1]);
		CHECK_MSG(memcmp(loom_model_grads(m[k]), loom_model_grads(m[0]), np * sizeof(float)) == 0,
		          "%s: gradients differ from none", loom_act_ckpt_name(modes[k]));
	}
	loom_model_act_bytes_t none, blocks, sel;
	loom_model_model_act_bytes(m[0], &none);
	loom_model_model_act_bytes(m[1], &blocks);
	loom_model_model_act_bytes(m[2], &sel);
	/* blocks keeps only each block's output (the stream: C or 2 C per position) */
	CHECK_EQ(blocks.per_layer, (size_t)B * T * loom_model_stream_width(&c) * sizeof(float));
	CHECK(blocks.kept < none.kept && sel.kept < none.kept);
	/* selective recomputes the attention's output (N, NH D) and lse (B, NH, T): 2 arenas x L layers of them,
	 * each buffer rounded up to 64 bytes */
	size_t NH = (size_t)c.n_head, D = (size_t)(c.head_dim ? c.head_dim : c.n_embd / c.n_head);
	size_t lse = ((size_t)B * NH * T * sizeof(float) + 63) / 64 * 64;
	size_t atty = ((size_t)B * T * NH * D * sizeof(float) + 63) / 64 * 64;
	CHECK_EQ(none.kept - sel.kept, 2 * (size_t)L * (lse + atty));
	for (int k = 0; k < 3; k++)
		loom_model_destroy(m[k]);
	return 0;
}

int fc_tp2_matches_one_process(const loom_model_config_t *cp, fc_params_fn test_params, int sp)
{
	loom_model_config_t c = *cp;
	enum { B = 2, T = 16 };
	int in[B * T], tg[B * T], n;
	loom_model_t *one = NULL, *rk[2] = {NULL, NULL};
	loom_model_opts_t o1 = {.B = B, .T = T};
	fc_tp_group_t g;
	fc_tp_rank_t r[2];
	pthread_t th[2];
	memset(&g, 0, sizeof g);
	CHECK_OK(loom_model_create(&one, &c, &o1));
	test_params(one, 17);
	fc_make_tokens(in, tg, B * T, c.vocab_size, 19);
	size_t np = loom_model_num_params(&c), ns = loom_model_shard_params(&c, 2);
	float *full = calloc(np, sizeof(float)), *full2 = calloc(np, sizeof(float));
	CHECK(full && full2);
	CHECK(pthread_barrier_init(&g.bar, NULL, 2) == 0);
	for (int k = 0; k < 2; k++) {
		loom_model_opts_t o = {.B = B, .T = T, .tp_size = 2, .tp_rank = k, .sequence_parallel = sp};
		CHECK_OK(loom_model_create(&rk[k], &c, &o));
		CHECK_EQ(loom_model_param_count(rk[k]), ns);
		CHECK_EQ(loom_model_sequence_parallel(rk[k]), sp);
		/* init of a shard = the shard of the whole init */
		loom_model_t *w = NULL;
		float *shard = malloc(ns * sizeof(float));
		CHECK(shard != NULL);
		CHECK_OK(loom_model_create(&w, &c, &o1));
		loom_model_init(w, 77);
		loom_model_init(rk[k], 77);
		loom_model_tp_shard(&c, 2, k, loom_model_params(w), shard);
		CHECK(memcmp(shard, loom_model_params(rk[k]), ns * sizeof(float)) == 0);
		loom_model_destroy(w), free(shard);
		loom_model_tp_shard(&c, 2, k, loom_model_params(one), loom_model_params(rk[k]));
		loom_model_zero_grad(rk[k]);
		g.scratch[k] = malloc(FC_TP_SCRATCH * sizeof(float));
		CHECK(g.scratch[k] != NULL);
		r[k] = (fc_tp_rank_t){.g = &g, .rank = k, .m = rk[k], .in = in, .tg = tg, .B = B, .T = T};
		loom_model_on_tp_reduce(rk[k], fc_tp_reduce, &r[k]);
	}
	float l1, lf1;
	loom_model_zero_grad(one);
	CHECK_OK(loom_model_forward(one, in, tg, B, T, &lf1));
	CHECK_OK(loom_model_forward_backward(one, in, tg, B, T, 1.0f, &l1));
	for (int k = 0; k < 2; k++)
		CHECK(pthread_create(&th[k], NULL, fc_tp_run, &r[k]) == 0);
	for (int k = 0; k < 2; k++)
		pthread_join(th[k], NULL);
	for (int k = 0; k < 2; k++) {
		CHECK_OK(r[k].rc);
		CHECK_FEQ(r[k].loss, r[0].loss);
		CHECK_MSG(fabsf(r[k].loss - l1) <= 1e-5f * l1 && fabsf(r[k].loss_fwd - lf1) <= 1e-5f * lf1,
		          "rank %d: loss %.9g (forward %.9g), one process %.9g", k, r[k].loss, r[k].loss_fwd, l1);
		loom_model_tp_unshard(&c, 2, k, loom_model_grads(rk[k]), full);
	}
	CHECK_EQ(g.calls[0], g.calls[1]);
	const loom_tensor_info_t *tt = loom_model_tensors(one, &n);
	double worst = 0.0;
	for (int i = 0; i < n; i++) {
		const float *g1 = loom_model_tensor_grad(one, i), *gt = full + tt[i].offset;
		double mx = 0.0, w = 0.0;
		for (size_t k = 0; k < tt[i].numel; k++)
			mx = fmax(mx, fabs(g1[k])), w = fmax(w, fabs(g1[k] - gt[k]));
		worst = fmax(worst, w / mx);
		CHECK_MSG(mx > 0.0 && w <= 1e-5 * mx, "%s: tp 2 gradient off by %.3g (max %.3g)", tt[i].name, w, mx);
	}
	fprintf(stderr, "  tp 2%s%s: loss %.3g relative, gradients %.3g of each tensor's max from one process; %ld "
	        "group operations per rank\n", sp ? " + sequence parallel" : "", c.tie_word_embeddings ? " (tied)" : "",
	        fabs(r[0].loss - l1) / l1, worst, g.calls[0]);
	for (int k = 0; k < 2; k++) {
		loom_model_opts_t o = {.B = B, .T = T, .tp_size = 2, .tp_rank = k, .sequence_parallel = sp,
		                       .act_ckpt = LOOM_ACT_CKPT_BLOCKS};
		loom_model_destroy(rk[k]);
		CHECK_OK(loom_model_create(&rk[k], &c, &o));
		loom_model_tp_shard(&c, 2, k, loom_model_params(one), loom_model_params(rk[k]));
		loom_model_zero_grad(rk[k]);
		r[k].m = rk[k];
		loom_model_on_tp_reduce(rk[k], fc_tp_reduce, &r[k]);
	}
	for (int k = 0; k < 2; k++)
		CHECK(pthread_create(&th[k], NULL, fc_tp_run, &r[k]) == 0);
	for (int k = 0; k < 2; k++)
		pthread_join(th[k], NULL);
	for (int k = 0; k < 2; k++) {
		CHECK_OK(r[k].rc);
		loom_model_tp_unshard(&c, 2, k, loom_model_grads(rk[k]), full2);
		CHECK_EQ(loom_model_recomputes(rk[k]), c.n_layer);
	}
	CHECK(memcmp(full, full2, np * sizeof(float)) == 0);
	for (int k = 0; k < 2; k++)
		loom_model_destroy(rk[k]), free(g.scratch[k]);
	pthread_barrier_destroy(&g.bar);
	free(full), free(full2);
	loom_model_destroy(one);
	return 0;
}
