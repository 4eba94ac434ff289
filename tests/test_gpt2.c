/* test_gpt2.c: the GPT-2 model as a whole: init, loss at init, whole-model gradients against finite
 * differences, overfitting one batch, grad-ready callbacks, KV-cache generation, argument errors.
 * All on tiny configurations so that the file runs in about a second. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "loom/gpt2.h"
#include "model/model.h"
#include "model/rng.h"
#include "test.h"

static const loom_gpt2_config_t tiny_cfg = {.n_layer = 2, .n_head = 2, .n_embd = 16, .seq_len = 8, .vocab_size = 11};

static void random_tokens(int *p, int n, int V, uint64_t seed)
{
	rng_t r;
	rng_seed(&r, seed);
	for (int i = 0; i < n; i++)
		p[i] = (int)(rng_next(&r) % (uint64_t)V);
}

/* Parameters with larger random values than the init, so that every gradient is far from zero. */
static void randomize(loom_gpt2_t *m, double scale, uint64_t seed)
{
	rng_t r;
	rng_seed(&r, seed);
	float *p = loom_gpt2_params(m);
	for (size_t i = 0; i < loom_gpt2_num_params(loom_gpt2_config(m)); i++)
		p[i] = (float)(scale * rng_normal(&r));
}

TEST(gpt2_init_reproducible_and_scaled)
{
	loom_gpt2_config_t cfg = {.n_layer = 3, .n_head = 2, .n_embd = 64, .seq_len = 32, .vocab_size = 300};
	loom_gpt2_t *a, *b;
	CHECK_OK(loom_gpt2_create(&a, &cfg, 1, 8));
	CHECK_OK(loom_gpt2_create(&b, &cfg, 1, 8));
	size_t n = loom_gpt2_num_params(&cfg);
	loom_gpt2_init(a, 42);
	loom_gpt2_init(b, 42);
	CHECK(memcmp(loom_gpt2_params(a), loom_gpt2_params(b), n * sizeof(float)) == 0);
	loom_gpt2_init(b, 43);
	CHECK(memcmp(loom_gpt2_params(a), loom_gpt2_params(b), n * sizeof(float)) != 0);
	for (int i = 0; i < loom_gpt2_num_tensors(&cfg); i++) {
		loom_tensor_info_t ti;
		CHECK_OK(loom_gpt2_tensor_info(&cfg, i, &ti));
		const float *p = loom_gpt2_params(a) + ti.offset;
		double s = 0.0, s2 = 0.0;
		for (size_t k = 0; k < ti.numel; k++)
			s += p[k], s2 += (double)p[k] * p[k];
		double mean = s / ti.numel, sd = sqrt(s2 / ti.numel - mean * mean);
		if (ti.ndim == 2) {
			/* the sample sd of >= 2048 normals is within 5% of sigma with overwhelming probability */
			double want = strstr(ti.name, "c_proj.weight") ? 0.02 / sqrt(2.0 * cfg.n_layer) : 0.02;
			CHECK_MSG(fabs(sd - want) < 0.05 * want, "%s: sd %g, expected %g", ti.name, sd, want);
			CHECK_MSG(fabs(mean) < 0.1 * want, "%s: mean %g", ti.name, mean);
		} else {
			double want = strstr(ti.name, ".weight") ? 1.0 : 0.0; /* LayerNorm weight 1, biases 0 */
			for (size_t k = 0; k < ti.numel; k++)
				CHECK_MSG(p[k] == want, "%s[%zu] = %g, expected %g", ti.name, k, p[k], want);
		}
	}
	loom_gpt2_destroy(a);
	loom_gpt2_destroy(b);
	return 0;
}

TEST(gpt2_untrained_loss_near_log_vocab)
{
	/* At init the logits are lnf . wte with wte ~ N(0, 0.02^2) and lnf of unit scale, so each logit
	 * has sd about 0.02 sqrt(C) = 0.23 for C = 128, and the expected loss is about
	 * ln V + sd^2/2 = ln V + 0.026. Tolerance: [ln V - 0.02, ln V + 0.08]. */
	loom_gpt2_config_t cfg;
	loom_gpt2_t *m;
	int B = 2, T = 64, in[128], tg[128];
	float loss = 0.0f;
	CHECK_OK(loom_gpt2_preset("tiny", &cfg));
	CHECK_OK(loom_gpt2_create(&m, &cfg, B, T));
	loom_gpt2_init(m, 1);
	random_tokens(in, B * T, cfg.vocab_size, 5);
	random_tokens(tg, B * T, cfg.vocab_size, 6);
	CHECK_OK(loom_gpt2_forward(m, in, tg, B, T, &loss));
	double lnv = log((double)cfg.vocab_size);
	CHECK_MSG(loss > lnv - 0.02 && loss < lnv + 0.08, "loss %g, ln V = %g", loss, lnv);
	loom_gpt2_destroy(m);
	return 0;
}

TEST(gpt2_gradient_check)
{
	/* Whole model, L2 H2 C16 T8 V11, B=2, weights ~ N(0, 0.3^2): float32 central differences with
	 * h = 1e-3 on 3 random parameters of every tensor. The loss (~2.5) is computed in float, so a
	 * difference quotient carries ~1e-7 / 2e-3 = 5e-5 of rounding noise: tolerance 2e-4 + 2% of |g|. */
	loom_gpt2_t *m;
	const loom_gpt2_config_t *cfg = &tiny_cfg;
	int B = 2, T = 8, in[16], tg[16], nt = loom_gpt2_num_tensors(cfg);
	float loss, lp, lm;
	CHECK_OK(loom_gpt2_create(&m, cfg, B, T));
	randomize(m, 0.3, 7);
	float *p = loom_gpt2_params(m), *g = loom_gpt2_grads(m);
	for (int i = 0; i < loom_gpt2_num_tensors(cfg); i++) { /* LayerNorm weights near 1, like a real model */
		loom_tensor_info_t ti;
		loom_gpt2_tensor_info(cfg, i, &ti);
		if (ti.ndim == 1 && strstr(ti.name, "ln_") && strstr(ti.name, ".weight"))
			for (size_t k = 0; k < ti.numel; k++)
				p[ti.offset + k] += 1.0f;
	}
	random_tokens(in, B * T, cfg->vocab_size, 8);
	random_tokens(tg, B * T, cfg->vocab_size, 9);
	loom_gpt2_zero_grad(m);
	CHECK_OK(loom_gpt2_forward_backward(m, in, tg, B, T, 1.0f, &loss));
	rng_t r;
	rng_seed(&r, 10);
	int checked = 0;
	for (int i = 0; i < nt; i++) {
		loom_tensor_info_t ti;
		loom_gpt2_tensor_info(cfg, i, &ti);
		for (int s = 0; s < 3; s++) {
			size_t k = ti.offset + rng_next(&r) % ti.numel;
			float save = p[k];
			const float h = 1e-3f;
			p[k] = save + h;
			CHECK_OK(loom_gpt2_forward(m, in, tg, B, T, &lp));
			p[k] = save - h;
			CHECK_OK(loom_gpt2_forward(m, in, tg, B, T, &lm));
			p[k] = save;
			double fd = ((double)lp - lm) / (2.0 * h);
			CHECK_MSG(fabs(fd - g[k]) <= 2e-4 + 0.02 * fabs(g[k]), "%s[%zu]: backward %.6g, finite difference %.6g",
			          ti.name, k - ti.offset, g[k], fd);
			checked++;
		}
	}
	CHECK_EQ(checked, 3 * nt);
	/* a loss from forward_backward equals the forward's, and grad_scale scales, += accumulates */
	float loss2;
	CHECK_OK(loom_gpt2_forward(m, in, tg, B, T, &loss2));
	CHECK_FEQ(loss, loss2);
	size_t n = loom_gpt2_num_params(cfg);
	float *g1 = malloc(n * sizeof(float));
	memcpy(g1, g, n * sizeof(float));
	CHECK_OK(loom_gpt2_forward_backward(m, in, tg, B, T, 0.5f, &loss2));
	CHECK_FEQ(loss, loss2);
	for (size_t k = 0; k < n; k++)
		CHECK_NEAR(g[k], 1.5f * g1[k], 1e-6 + 1e-5 * fabs(g1[k]));
	free(g1);
	loom_gpt2_destroy(m);
	return 0;
}

TEST(gpt2_overfits_one_batch)
{
	/* 150 steps of Adam (lr 1e-2, no weight decay) on one fixed batch of 2 x 16 random tokens from a
	 * vocabulary of 32: a model of 27k parameters memorizes it, the loss going from ln 32 = 3.47 to
	 * below 0.05. */
	loom_gpt2_config_t cfg = {.n_layer = 2, .n_head = 2, .n_embd = 32, .seq_len = 16, .vocab_size = 32};
	loom_gpt2_t *m;
	int B = 2, T = 16, in[32], tg[32];
	float loss = 0.0f, first = 0.0f;
	CHECK_OK(loom_gpt2_create(&m, &cfg, B, T));
	loom_gpt2_init(m, 3);
	random_tokens(in, B * T, cfg.vocab_size, 11);
	random_tokens(tg, B * T, cfg.vocab_size, 12);
	size_t n = loom_gpt2_num_params(&cfg);
	float *mom = calloc(n, sizeof(float)), *var = calloc(n, sizeof(float));
	float *p = loom_gpt2_params(m), *g = loom_gpt2_grads(m);
	for (int step = 1; step <= 150; step++) {
		loom_gpt2_zero_grad(m);
		CHECK_OK(loom_gpt2_forward_backward(m, in, tg, B, T, 1.0f, &loss));
		if (step == 1)
			first = loss;
		double c1 = 1.0 - pow(0.9, step), c2 = 1.0 - pow(0.999, step);
		for (size_t k = 0; k < n; k++) {
			mom[k] = 0.9f * mom[k] + 0.1f * g[k];
			var[k] = 0.999f * var[k] + 0.001f * g[k] * g[k];
			p[k] -= (float)(1e-2 * (mom[k] / c1) / (sqrt(var[k] / c2) + 1e-8));
		}
	}
	CHECK_NEAR(first, log(32.0), 0.05);
	CHECK_MSG(loss < 0.05f, "loss after 150 steps: %g", loss);
	free(mom), free(var);
	loom_gpt2_destroy(m);
	return 0;
}

/* ---- grad-ready callbacks ---------------------------------------------------------------------- */

typedef struct {
	loom_gpt2_t *m;
	int order[64], n;
	float *snap; /* each tensor's gradient as it was when reported */
} ready_log_t;

static void on_ready(void *ctx, int i)
{
	ready_log_t *r = ctx;
	loom_tensor_info_t ti;
	if (r->n < 64)
		r->order[r->n] = i;
	r->n++;
	loom_gpt2_tensor_info(loom_gpt2_config(r->m), i, &ti);
	memcpy(r->snap + ti.offset, loom_gpt2_grads(r->m) + ti.offset, ti.numel * sizeof(float));
}

TEST(gpt2_grad_ready_order)
{
	loom_gpt2_t *m;
	const loom_gpt2_config_t *cfg = &tiny_cfg;
	int B = 2, T = 8, in[16], tg[16], nt = loom_gpt2_num_tensors(cfg);
	size_t n = loom_gpt2_num_params(cfg);
	float loss;
	ready_log_t r = {0};
	CHECK_OK(loom_gpt2_create(&m, cfg, B, T));
	loom_gpt2_init(m, 5);
	random_tokens(in, B * T, cfg->vocab_size, 13);
	random_tokens(tg, B * T, cfg->vocab_size, 14);
	r.m = m;
	r.snap = calloc(n, sizeof(float));
	loom_gpt2_zero_grad(m);
	CHECK_OK(loom_gpt2_forward_backward(m, in, tg, B, T, 1.0f, &loss)); /* accumulate onto non-zero grads */
	loom_gpt2_on_grad_ready(m, on_ready, &r);
	CHECK_OK(loom_gpt2_forward_backward(m, in, tg, B, T, 1.0f, &loss));
	CHECK_EQ(r.n, nt);
	for (int k = 0; k < nt; k++)
		CHECK_EQ(r.order[k], nt - 1 - k);
	/* what the callback saw is final: nothing changed afterwards */
	CHECK(memcmp(r.snap, loom_gpt2_grads(m), n * sizeof(float)) == 0);
	loom_gpt2_on_grad_ready(m, NULL, NULL);
	CHECK_OK(loom_gpt2_forward_backward(m, in, tg, B, T, 1.0f, &loss));
	CHECK_EQ(r.n, nt);
	free(r.snap);
	loom_gpt2_destroy(m);
	return 0;
}

TEST(gpt2_grad_buffer_external)
{
	loom_gpt2_t *m;
	int in[16], tg[16];
	float loss;
	size_t n = loom_gpt2_num_params(&tiny_cfg);
	float *ext = calloc(n, sizeof(float));
	CHECK_OK(loom_gpt2_create(&m, &tiny_cfg, 2, 8));
	loom_gpt2_init(m, 5);
	random_tokens(in, 16, 11, 15);
	random_tokens(tg, 16, 11, 16);
	loom_gpt2_zero_grad(m);
	CHECK_OK(loom_gpt2_forward_backward(m, in, tg, 2, 8, 1.0f, &loss));
	float *own = loom_gpt2_grads(m);
	CHECK_ERR(loom_gpt2_set_grad_buffer(m, NULL), LOOM_EINVAL);
	CHECK_OK(loom_gpt2_set_grad_buffer(m, ext));
	CHECK(loom_gpt2_grads(m) == ext);
	CHECK_OK(loom_gpt2_forward_backward(m, in, tg, 2, 8, 1.0f, &loss));
	CHECK(memcmp(ext, own, n * sizeof(float)) == 0);
	loom_gpt2_destroy(m);
	free(ext);
	return 0;
}

/* ---- generation -------------------------------------------------------------------------------- */

static int argmax(const float *z, int n)
{
	int b = 0;
	for (int i = 1; i < n; i++)
		if (z[i] > z[b])
			b = i;
	return b;
}

TEST(gpt2_generate_kv_cache_matches_full_forward)
{
	loom_gpt2_config_t cfg = {.n_layer = 2, .n_head = 2, .n_embd = 32, .seq_len = 24, .vocab_size = 40};
	loom_gpt2_t *m;
	int prompt[3] = {5, 17, 2}, out[32], n_out = -1, ctx[24];
	CHECK_OK(loom_gpt2_create(&m, &cfg, 1, 24));
	/* larger weights than the init give distinct logits; position embeddings larger than the token
	 * embeddings keep greedy decoding from repeating the token it just read (tied lm head) */
	randomize(m, 0.2, 21);
	float *wpe = loom_gpt2_params(m) + (size_t)cfg.vocab_size * cfg.n_embd;
	for (int k = 0; k < cfg.seq_len * cfg.n_embd; k++)
		wpe[k] *= 5.0f;
	CHECK_OK(loom_gpt2_generate(m, prompt, 3, 15, 0.0f, 0, 1, -1, out, &n_out, NULL, NULL));
	CHECK_EQ(n_out, 15);
	memcpy(ctx, prompt, sizeof prompt);
	int distinct = 0;
	for (int i = 0; i < 15; i++) {
		CHECK_OK(loom_gpt2_forward(m, ctx, NULL, 1, 3 + i, NULL));
		int want = argmax(loom_gpt2_logits(m), cfg.vocab_size);
		CHECK_MSG(out[i] == want, "token %d: KV cache gives %d, full forward %d", i, out[i], want);
		distinct += i > 0 && out[i] != out[i - 1];
		ctx[3 + i] = want;
	}
	CHECK_MSG(distinct >= 3, "%d %d %d %d %d %d %d %d", out[0], out[1], out[2], out[3], out[4], out[5], out[6], out[7]);
	/* the context ends at T: 24 - 3 tokens at most */
	CHECK_OK(loom_gpt2_generate(m, prompt, 3, 30, 0.0f, 0, 1, -1, out, &n_out, NULL, NULL));
	CHECK_EQ(n_out, 21);
	/* stop token: generation ends right after it */
	int stop = ctx[3 + 4], first = 0;
	while (ctx[3 + first] != stop)
		first++;
	CHECK_OK(loom_gpt2_generate(m, prompt, 3, 15, 0.0f, 0, 1, stop, out, &n_out, NULL, NULL));
	CHECK_EQ(n_out, first + 1);
	CHECK_EQ(out[first], stop);
	loom_gpt2_destroy(m);
	return 0;
}

static void collect(void *ctx, int tok)
{
	int *buf = ctx;
	buf[1 + buf[0]++] = tok;
}

TEST(gpt2_generate_sampling)
{
	loom_gpt2_config_t cfg = {.n_layer = 1, .n_head = 2, .n_embd = 16, .seq_len = 32, .vocab_size = 50};
	loom_gpt2_t *m;
	int prompt[2] = {1, 2}, a[20], b[20], g[20], seen[21] = {0}, na, nb, ng;
	CHECK_OK(loom_gpt2_create(&m, &cfg, 1, 32));
	randomize(m, 0.2, 22);
	CHECK_OK(loom_gpt2_generate(m, prompt, 2, 20, 1.0f, 10, 99, -1, a, &na, collect, seen));
	CHECK_OK(loom_gpt2_generate(m, prompt, 2, 20, 1.0f, 10, 99, -1, b, &nb, NULL, NULL));
	CHECK_EQ(na, 20);
	CHECK_EQ(nb, 20);
	CHECK(memcmp(a, b, sizeof a) == 0); /* same seed, same tokens */
	CHECK_EQ(seen[0], 20);
	CHECK(memcmp(seen + 1, a, sizeof a) == 0); /* on_token saw each, in order */
	CHECK_OK(loom_gpt2_generate(m, prompt, 2, 20, 1.0f, 10, 100, -1, b, &nb, NULL, NULL));
	CHECK(memcmp(a, b, sizeof a) != 0); /* another seed, (almost surely) other tokens */
	/* with top_k = 3 every token is one of the 3 most likely after its context */
	int ctx[32] = {1, 2};
	CHECK_OK(loom_gpt2_generate(m, prompt, 2, 20, 2.0f, 3, 5, -1, b, &nb, NULL, NULL));
	CHECK_EQ(nb, 20);
	int off_top1 = 0;
	for (int i = 0; i < nb; i++) {
		CHECK_OK(loom_gpt2_forward(m, ctx, NULL, 1, 2 + i, NULL));
		const float *z = loom_gpt2_logits(m);
		int above = 0; /* logits strictly larger than the sampled token's */
		for (int v = 0; v < cfg.vocab_size; v++)
			above += z[v] > z[b[i]];
		CHECK_MSG(above < 3, "token %d (%d) has %d larger logits", i, b[i], above);
		off_top1 += above > 0;
		ctx[2 + i] = b[i];
	}
	CHECK(off_top1 > 0); /* temperature 2 does not always pick the top token */
	/* top_k = 1 is greedy whatever the temperature */
	CHECK_OK(loom_gpt2_generate(m, prompt, 2, 20, 0.0f, 0, 1, -1, g, &ng, NULL, NULL));
	CHECK_OK(loom_gpt2_generate(m, prompt, 2, 20, 5.0f, 1, 7, -1, b, &nb, NULL, NULL));
	CHECK(memcmp(g, b, sizeof g) == 0);
	loom_gpt2_destroy(m);
	return 0;
}

/* ---- errors ------------------------------------------------------------------------------------ */

TEST(gpt2_invalid_arguments)
{
	loom_gpt2_t *m;
	loom_gpt2_config_t bad = tiny_cfg;
	int in[16], tg[16], out[4], n_out;
	float loss;
	bad.n_head = 3;
	CHECK_ERR(loom_gpt2_create(&m, &bad, 1, 8), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "not divisible");
	CHECK_ERR(loom_gpt2_create(&m, &tiny_cfg, 1, 9), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "seq_len 8");
	CHECK_ERR(loom_gpt2_create(&m, &tiny_cfg, 0, 8), LOOM_EINVAL);
	CHECK_OK(loom_gpt2_create(&m, &tiny_cfg, 2, 8));
	loom_gpt2_init(m, 1);
	random_tokens(in, 16, 11, 1);
	random_tokens(tg, 16, 11, 2);
	in[11] = 11; /* b=1, t=3 */
	CHECK_ERR(loom_gpt2_forward(m, in, tg, 2, 8, &loss), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "token id 11 at inputs[b=1][t=3] is outside the vocabulary [0, 11)");
	CHECK_ERR(loom_gpt2_forward_backward(m, in, tg, 2, 8, 1.0f, &loss), LOOM_EINVAL);
	in[11] = 0;
	tg[0] = -1;
	CHECK_ERR(loom_gpt2_forward_backward(m, in, tg, 2, 8, 1.0f, &loss), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "token id -1 at targets[b=0][t=0]");
	tg[0] = 0;
	CHECK_ERR(loom_gpt2_forward_backward(m, in, NULL, 2, 8, 1.0f, &loss), LOOM_EINVAL);
	CHECK_ERR(loom_gpt2_forward(m, in, tg, 3, 8, &loss), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "batch 3 x 8 tokens does not fit the model's 2 x 8");
	CHECK_ERR(loom_gpt2_forward(m, in, tg, 2, 9, &loss), LOOM_EINVAL);
	CHECK_ERR(loom_gpt2_forward(m, in, tg, 2, 0, &loss), LOOM_EINVAL);
	CHECK_ERR(loom_gpt2_generate(m, in, 0, 4, 0.0f, 0, 1, -1, out, &n_out, NULL, NULL), LOOM_EINVAL);
	CHECK_ERR(loom_gpt2_generate(m, in, 9, 4, 0.0f, 0, 1, -1, out, &n_out, NULL, NULL), LOOM_EINVAL);
	CHECK_ERR(loom_gpt2_generate(m, in, 2, 4, -1.0f, 0, 1, -1, out, &n_out, NULL, NULL), LOOM_EINVAL);
	in[1] = 99;
	CHECK_ERR(loom_gpt2_generate(m, in, 2, 4, 0.0f, 0, 1, -1, out, &n_out, NULL, NULL), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "token id 99 at prompt[b=0][t=1]");
	/* a smaller batch than the capacity works and agrees with itself */
	in[1] = 3;
	float l1, l2;
	CHECK_OK(loom_gpt2_forward(m, in, tg, 1, 5, &l1));
	CHECK_OK(loom_gpt2_forward_backward(m, in, tg, 1, 5, 1.0f, &l2));
	CHECK_FEQ(l1, l2);
	loom_gpt2_destroy(m);
	loom_gpt2_destroy(NULL);
	return 0;
}

TEST(gpt2_threads_agree)
{
	/* 1 and 2 threads: the same loss and gradients up to float summation order */
	loom_gpt2_config_t cfg = {.n_layer = 2, .n_head = 4, .n_embd = 64, .seq_len = 80, .vocab_size = 300};
	loom_gpt2_t *m;
	int B = 2, T = 80, in[160], tg[160], saved = loom_num_threads();
	float l1, l2;
	size_t n = loom_gpt2_num_params(&cfg);
	CHECK_OK(loom_gpt2_create(&m, &cfg, B, T));
	loom_gpt2_init(m, 9);
	random_tokens(in, B * T, cfg.vocab_size, 17);
	random_tokens(tg, B * T, cfg.vocab_size, 18);
	float *g1 = malloc(n * sizeof(float));
	loom_set_num_threads(1);
	loom_gpt2_zero_grad(m);
	CHECK_OK(loom_gpt2_forward_backward(m, in, tg, B, T, 1.0f, &l1));
	memcpy(g1, loom_gpt2_grads(m), n * sizeof(float));
	loom_set_num_threads(2);
	loom_gpt2_zero_grad(m);
	CHECK_OK(loom_gpt2_forward_backward(m, in, tg, B, T, 1.0f, &l2));
	loom_set_num_threads(saved);
	CHECK_NEAR(l1, l2, 1e-6);
	double gmax = 0.0;
	for (size_t k = 0; k < n; k++)
		gmax = fmax(gmax, fabs(g1[k]));
	for (size_t k = 0; k < n; k++)
		CHECK_NEAR(loom_gpt2_grads(m)[k], g1[k], 1e-5 * gmax);
	free(g1);
	loom_gpt2_destroy(m);
	return 0;
}

TEST(gpt2_profile_report)
{
	loom_gpt2_t *m;
	int in[16], tg[16];
	float loss;
	char text[4096] = {0};
	CHECK_OK(loom_gpt2_create(&m, &tiny_cfg, 2, 8));
	loom_gpt2_init(m, 1);
	random_tokens(in, 16, 11, 3);
	random_tokens(tg, 16, 11, 4);
	loom_gpt2_profile(m, 1);
	CHECK_OK(loom_gpt2_forward_backward(m, in, tg, 2, 8, 1.0f, &loss));
	CHECK_OK(loom_gpt2_forward_backward(m, in, tg, 2, 8, 1.0f, &loss));
	FILE *f = tmpfile();
	CHECK(f != NULL);
	loom_gpt2_profile_report(m, f, 2);
	rewind(f);
	size_t n = fread(text, 1, sizeof text - 1, f);
	fclose(f);
	CHECK(n > 0);
	/* per step: 2 layers x 4 matmuls forward and backward, 2 x 2 + 1 LayerNorms */
	CHECK_CONTAINS(text, "matmul_forward");
	CHECK_CONTAINS(text, "matmul_backward");
	CHECK_CONTAINS(text, "attention_backward");
	CHECK_CONTAINS(text, "total (timed kernels)");
	const char *line = strstr(text, "matmul_forward");
	double ms, calls;
	CHECK_EQ(sscanf(line + strlen("matmul_forward"), "%lf %lf", &ms, &calls), 2);
	CHECK_FEQ(calls, 8.0);
	line = strstr(text, "layernorm_forward");
	CHECK_EQ(sscanf(line + strlen("layernorm_forward"), "%lf %lf", &ms, &calls), 2);
	CHECK_FEQ(calls, 5.0);
	/* the report reset the counters; with profiling off nothing is counted */
	loom_gpt2_profile(m, 0);
	CHECK_OK(loom_gpt2_forward_backward(m, in, tg, 2, 8, 1.0f, &loss));
	f = tmpfile();
	loom_gpt2_profile_report(m, f, 1);
	rewind(f);
	memset(text, 0, sizeof text);
	CHECK(fread(text, 1, sizeof text - 1, f) > 0);
	fclose(f);
	CHECK(strstr(text, "matmul_forward") == NULL);
	loom_gpt2_destroy(m);
	return 0;
}

TEST(gpt2_last_logits_match_loss)
{
	/* logits of the last position of each row (forward without targets) give, through log-softmax,
	 * the same per-position losses as the fused classifier of a forward with targets */
	loom_gpt2_t *m;
	int B = 3, T = 7, in[21], tg[21], V = tiny_cfg.vocab_size;
	float loss;
	CHECK_OK(loom_gpt2_create(&m, &tiny_cfg, 4, 8));
	randomize(m, 0.3, 31);
	random_tokens(in, B * T, V, 32);
	random_tokens(tg, B * T, V, 33);
	CHECK_OK(loom_gpt2_forward(m, in, tg, B, T, &loss));
	float want[3];
	for (int b = 0; b < B; b++)
		want[b] = m->losses[b * T + T - 1];
	CHECK_OK(loom_gpt2_forward(m, in, NULL, B, T, NULL));
	const float *z = loom_gpt2_logits(m);
	for (int b = 0; b < B; b++) {
		double mx = -INFINITY, s = 0.0;
		for (int v = 0; v < V; v++)
			mx = fmax(mx, z[b * V + v]);
		for (int v = 0; v < V; v++)
			s += exp(z[b * V + v] - mx);
		double got = log(s) + mx - z[b * V + tg[b * T + T - 1]];
		CHECK_NEAR(got, want[b], 1e-5 * fabs(want[b]) + 1e-6);
	}
	loom_gpt2_destroy(m);
	return 0;
}

TEST(gpt2_bench_model_cli)
{
	char cmd[512], out[8192];
	snprintf(cmd, sizeof cmd, "%s bench model --model tiny --batch 1 --seq-len 16 --threads 1 --steps 2 --profile "
	         "--peak-flops 1e11", test_loom_bin());
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 120), 0);
	CHECK_CONTAINS(out, "step 2: loss ");
	CHECK_CONTAINS(out, "profile of the fastest step:");
	CHECK_CONTAINS(out, "classifier (lm head + softmax + CE, fwd+bwd)");
	CHECK_CONTAINS(out, "tiny B=1 T=16, 1 thread: best ");
	snprintf(cmd, sizeof cmd, "%s bench model --model huge", test_loom_bin());
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 60), 2);
	CHECK_CONTAINS(out, "unknown model preset 'huge'");
	snprintf(cmd, sizeof cmd, "%s bench model --model tiny --seq-len 129", test_loom_bin());
	CHECK_EQ(test_run_cmd(cmd, out, sizeof out, 60), 2);
	CHECK_CONTAINS(out, "1 <= T <= seq_len 128");
	return 0;
}
