/* test_gpt2.c: the GPT-2 model as a whole: init, loss at init, whole-model gradients against finite
 * differences, overfitting one batch, grad-ready callbacks, KV-cache generation, argument errors;
 * then the passes by unit (embedding, block, head) against the fused pass, bit for bit: arenas
 * interleaved, a block recomputed, views on external memory, a ZeRO-3-like gather from the param-use
 * hook, pipeline stages, and the tensor table. All on tiny configurations so that the file runs in
 * about a second. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "loom/gpt2.h"
#include "model/gpt2/model.h"
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
	CHECK_CONTAINS(loom_errmsg(), "gpt2 generate: prompt token 99 at 1 is outside the vocabulary [0, ");
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
		want[b] = m->arenas[0].losses[b * T + T - 1];
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

/* ---- passes by unit, arenas, stages, views, hooks ---------------------------------------------- */

/* Embedding and every block of m's range forward in arena mb (the embedding only if m holds it). */
static int units_forward(loom_gpt2_t *m, int mb, const int *in, int B, int T, int lo, int hi)
{
	int rc;
	if (lo == 0 && (rc = loom_gpt2_embed_forward(m, mb, in, B, T)) != LOOM_OK)
		return rc;
	for (int l = lo; l < hi; l++)
		if ((rc = loom_gpt2_block_forward(m, mb, l, B, T)) != LOOM_OK)
			return rc;
	return LOOM_OK;
}

/* Head forward+backward (when tg), blocks hi-1..lo backward, embedding backward (when lo == 0). */
static int units_backward(loom_gpt2_t *m, int mb, const int *in, const int *tg, int B, int T, int lo, int hi,
                          float scale, float *loss)
{
	int rc;
	if (tg && (rc = loom_gpt2_head_forward_backward(m, mb, tg, B, T, scale, loss)) != LOOM_OK)
		return rc;
	for (int l = hi - 1; l >= lo; l--)
		if ((rc = loom_gpt2_block_backward(m, mb, l, B, T)) != LOOM_OK)
			return rc;
	if (lo == 0 && (rc = loom_gpt2_embed_backward(m, mb, in, B, T)) != LOOM_OK)
		return rc;
	return LOOM_OK;
}

/* Two models with the same random parameters, for comparing a composed pass with the fused one. */
static int twin_models(loom_gpt2_t **a, loom_gpt2_t **b, const loom_gpt2_config_t *cfg, const loom_gpt2_opts_t *o,
                       uint64_t seed)
{
	int rc;
	if ((rc = loom_gpt2_create_opts(a, cfg, o)) != LOOM_OK || (rc = loom_gpt2_create_opts(b, cfg, o)) != LOOM_OK)
		return rc;
	randomize(*a, 0.3, seed);
	memcpy(loom_gpt2_params(*b), loom_gpt2_params(*a), loom_gpt2_num_params(cfg) * sizeof(float));
	return LOOM_OK;
}

TEST(gpt2_units_compose_to_fused_pass)
{
	/* embedding, blocks 0..L-1, head, and back, called one by one, with grad_scale 1/2 and two
	 * accumulated micro-steps (the second smaller than the capacity): the loss, every gradient and the
	 * grad-ready sequence equal the fused pass's, bit for bit */
	const loom_gpt2_config_t *cfg = &tiny_cfg;
	loom_gpt2_opts_t o = {.B = 2, .T = 8};
	loom_gpt2_t *a, *b;
	int in[32], tg[32], L = cfg->n_layer, nt = loom_gpt2_num_tensors(cfg);
	size_t n = loom_gpt2_num_params(cfg);
	float la[2], lb[2];
	ready_log_t ra = {0}, rb = {0};
	CHECK_OK(twin_models(&a, &b, cfg, &o, 41));
	random_tokens(in, 32, cfg->vocab_size, 42);
	random_tokens(tg, 32, cfg->vocab_size, 43);
	ra.m = a, rb.m = b;
	ra.snap = calloc(n, sizeof(float)), rb.snap = calloc(n, sizeof(float));
	loom_gpt2_on_grad_ready(a, on_ready, &ra);
	loom_gpt2_on_grad_ready(b, on_ready, &rb);
	loom_gpt2_zero_grad(a);
	loom_gpt2_zero_grad(b);
	CHECK_OK(loom_gpt2_forward_backward(a, in, tg, 2, 8, 0.5f, &la[0]));
	CHECK_OK(loom_gpt2_forward_backward(a, in + 16, tg + 16, 2, 5, 0.5f, &la[1]));
	CHECK_OK(units_forward(b, 0, in, 2, 8, 0, L));
	CHECK_OK(units_backward(b, 0, in, tg, 2, 8, 0, L, 0.5f, &lb[0]));
	CHECK_OK(units_forward(b, 0, in + 16, 2, 5, 0, L));
	CHECK_OK(units_backward(b, 0, in + 16, tg + 16, 2, 5, 0, L, 0.5f, &lb[1]));
	CHECK_FEQ(la[0], lb[0]);
	CHECK_FEQ(la[1], lb[1]);
	CHECK(memcmp(loom_gpt2_grads(a), loom_gpt2_grads(b), n * sizeof(float)) == 0);
	CHECK_EQ(ra.n, 2 * nt);
	CHECK_EQ(rb.n, 2 * nt);
	CHECK(memcmp(ra.order, rb.order, sizeof ra.order) == 0);
	/* the head's forward alone gives the fused forward's loss and logits */
	float f1, f2;
	CHECK_OK(loom_gpt2_forward(a, in, tg, 2, 8, &f1));
	CHECK_OK(units_forward(b, 0, in, 2, 8, 0, L));
	CHECK_OK(loom_gpt2_head_forward(b, 0, tg, 2, 8, &f2));
	CHECK_FEQ(f1, f2);
	CHECK_FEQ(f1, la[0]);
	CHECK_OK(loom_gpt2_forward(a, in, NULL, 2, 7, NULL));
	CHECK_OK(units_forward(b, 0, in, 2, 7, 0, L));
	CHECK_OK(loom_gpt2_head_forward(b, 0, NULL, 2, 7, NULL));
	CHECK(memcmp(loom_gpt2_logits(a), loom_gpt2_logits(b), 2 * (size_t)cfg->vocab_size * sizeof(float)) == 0);
	free(ra.snap), free(rb.snap);
	loom_gpt2_destroy(a);
	loom_gpt2_destroy(b);
	return 0;
}

/* The head on parts of the positions (a pipeline sharing the head between two stages): rows [0, 5)
 * then [5, 16) of a 2 x 8 batch give the whole head's loss (the parts add up to the mean), stream
 * gradient and ln_f / wte gradients up to rounding, and so the whole backward's gradients; rows
 * outside the batch and NULL targets are errors. */
TEST(gpt2_head_rows_compose_to_whole_head)
{
	const loom_gpt2_config_t *cfg = &tiny_cfg;
	loom_gpt2_opts_t o = {.B = 2, .T = 8};
	loom_gpt2_t *a, *b;
	int in[16], tg[16], L = cfg->n_layer;
	size_t n = loom_gpt2_num_params(cfg), NC = 16 * (size_t)cfg->n_embd;
	float la, lb[2];
	CHECK_OK(twin_models(&a, &b, cfg, &o, 51));
	random_tokens(in, 16, cfg->vocab_size, 52);
	random_tokens(tg, 16, cfg->vocab_size, 53);
	loom_gpt2_zero_grad(a);
	loom_gpt2_zero_grad(b);
	CHECK_OK(units_forward(a, 0, in, 2, 8, 0, L));
	CHECK_OK(loom_gpt2_head_forward_backward(a, 0, tg, 2, 8, 0.5f, &la));
	CHECK_OK(units_forward(b, 0, in, 2, 8, 0, L));
	float *db = loom_gpt2_stream_grad(b);
	for (size_t i = 0; i < NC; i++)
		db[i] = 1e30f; /* every row is written by one of the two parts */
	CHECK_OK(loom_gpt2_head_forward_backward_rows(b, 0, tg, 2, 8, 0, 5, 0.5f, &lb[0]));
	CHECK_OK(loom_gpt2_head_forward_backward_rows(b, 0, tg, 2, 8, 5, 11, 0.5f, &lb[1]));
	CHECK_NEAR(lb[0] + lb[1], la, 1e-6 * la);
	CHECK(lb[0] > 0.1f * la && lb[1] > 0.1f * la); /* each part is its rows' share, not the mean */
	const float *da = loom_gpt2_stream_grad(a);
	for (size_t i = 0; i < NC; i++)
		CHECK_NEAR(db[i], da[i], 1e-6 * fabsf(da[i]) + 1e-9);
	for (int l = L - 1; l >= 0; l--) {
		CHECK_OK(loom_gpt2_block_backward(a, 0, l, 2, 8));
		CHECK_OK(loom_gpt2_block_backward(b, 0, l, 2, 8));
	}
	CHECK_OK(loom_gpt2_embed_backward(a, 0, in, 2, 8));
	CHECK_OK(loom_gpt2_embed_backward(b, 0, in, 2, 8));
	const float *ga = loom_gpt2_grads(a), *gb = loom_gpt2_grads(b);
	for (size_t i = 0; i < n; i++)
		CHECK_NEAR(gb[i], ga[i], 1e-5 * fabsf(ga[i]) + 1e-7);
	CHECK_ERR(loom_gpt2_head_forward_backward_rows(b, 0, tg, 2, 8, 10, 7, 0.5f, NULL), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "rows [10, 17) of a batch of 2 x 8");
	CHECK_ERR(loom_gpt2_head_forward_backward_rows(b, 0, tg, 2, 8, 3, 0, 0.5f, NULL), LOOM_EINVAL);
	CHECK_ERR(loom_gpt2_head_forward_backward_rows(b, 0, NULL, 2, 8, 0, 4, 0.5f, NULL), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "targets are NULL");
	loom_gpt2_destroy(a);
	loom_gpt2_destroy(b);
	return 0;
}

TEST(gpt2_arenas_interleave_micro_batches)
{
	/* Two arenas hold two micro-batches at once: F0 F1 B0 B1 and F0 B0 F1 B1 give, bit for bit, the
	 * gradients and losses of two sequential fused micro-steps */
	const loom_gpt2_config_t *cfg = &tiny_cfg;
	loom_gpt2_opts_t o1 = {.B = 2, .T = 8}, o2 = {.B = 2, .T = 8, .arenas = 2};
	loom_gpt2_t *ref, *m, *tmp;
	int in[32], tg[32], L = cfg->n_layer;
	size_t n = loom_gpt2_num_params(cfg);
	float lr[2], l[2];
	CHECK_OK(twin_models(&ref, &tmp, cfg, &o1, 51));
	CHECK_OK(loom_gpt2_create_opts(&m, cfg, &o2));
	memcpy(loom_gpt2_params(m), loom_gpt2_params(ref), n * sizeof(float));
	random_tokens(in, 32, cfg->vocab_size, 52);
	random_tokens(tg, 32, cfg->vocab_size, 53);
	loom_gpt2_zero_grad(ref);
	CHECK_OK(loom_gpt2_forward_backward(ref, in, tg, 2, 8, 0.5f, &lr[0]));
	CHECK_OK(loom_gpt2_forward_backward(ref, in + 16, tg + 16, 2, 8, 0.5f, &lr[1]));
	/* F0 F1 B0 B1 */
	loom_gpt2_zero_grad(m);
	CHECK_OK(units_forward(m, 0, in, 2, 8, 0, L));
	CHECK_OK(units_forward(m, 1, in + 16, 2, 8, 0, L));
	CHECK_OK(units_backward(m, 0, in, tg, 2, 8, 0, L, 0.5f, &l[0]));
	CHECK_OK(units_backward(m, 1, in + 16, tg + 16, 2, 8, 0, L, 0.5f, &l[1]));
	CHECK_FEQ(l[0], lr[0]);
	CHECK_FEQ(l[1], lr[1]);
	CHECK(memcmp(loom_gpt2_grads(m), loom_gpt2_grads(ref), n * sizeof(float)) == 0);
	/* F0 B0 F1 B1, arenas swapped */
	loom_gpt2_zero_grad(m);
	CHECK_OK(units_forward(m, 1, in, 2, 8, 0, L));
	CHECK_OK(units_backward(m, 1, in, tg, 2, 8, 0, L, 0.5f, &l[0]));
	CHECK_OK(units_forward(m, 0, in + 16, 2, 8, 0, L));
	CHECK_OK(units_backward(m, 0, in + 16, tg + 16, 2, 8, 0, L, 0.5f, &l[1]));
	CHECK_FEQ(l[0], lr[0]);
	CHECK_FEQ(l[1], lr[1]);
	CHECK(memcmp(loom_gpt2_grads(m), loom_gpt2_grads(ref), n * sizeof(float)) == 0);
	/* the arenas are distinct memory; arena 2 does not exist */
	CHECK(loom_gpt2_block_input(m, 0, 1) != loom_gpt2_block_input(m, 1, 1));
	CHECK(loom_gpt2_block_input(m, 2, 1) == NULL);
	CHECK_ERR(loom_gpt2_block_forward(m, 2, 0, 2, 8), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "arena 2 out of range [0, 2)");
	loom_gpt2_destroy(ref);
	loom_gpt2_destroy(tmp);
	loom_gpt2_destroy(m);
	return 0;
}

TEST(gpt2_block_recompute_identical)
{
	/* Activation checkpointing: recomputing block 0 from its saved input gives the same output, bit
	 * for bit, and a backward after the recompute the same gradients */
	const loom_gpt2_config_t *cfg = &tiny_cfg;
	loom_gpt2_opts_t o = {.B = 2, .T = 8};
	loom_gpt2_t *a, *b;
	int in[16], tg[16], L = cfg->n_layer, C = cfg->n_embd;
	size_t n = loom_gpt2_num_params(cfg), NC = 16 * (size_t)C;
	float la, lb, *out1 = malloc(NC * sizeof(float));
	CHECK_OK(twin_models(&a, &b, cfg, &o, 61));
	random_tokens(in, 16, cfg->vocab_size, 62);
	random_tokens(tg, 16, cfg->vocab_size, 63);
	CHECK_OK(units_forward(b, 0, in, 2, 8, 0, L));
	memcpy(out1, loom_gpt2_block_input(b, 0, 1), NC * sizeof(float));
	for (int k = 0; k < 2; k++) {
		memset(loom_gpt2_block_input(b, 0, 1), 0, NC * sizeof(float));
		CHECK_OK(loom_gpt2_block_forward(b, 0, 0, 2, 8));
		CHECK(memcmp(out1, loom_gpt2_block_input(b, 0, 1), NC * sizeof(float)) == 0);
	}
	/* the output is not trivially equal: block 0 changed its input */
	CHECK(memcmp(out1, loom_gpt2_block_input(b, 0, 0), NC * sizeof(float)) != 0);
	loom_gpt2_zero_grad(a);
	loom_gpt2_zero_grad(b);
	CHECK_OK(loom_gpt2_forward_backward(a, in, tg, 2, 8, 1.0f, &la));
	CHECK_OK(units_backward(b, 0, in, tg, 2, 8, 0, L, 1.0f, &lb));
	CHECK_FEQ(la, lb);
	CHECK(memcmp(loom_gpt2_grads(a), loom_gpt2_grads(b), n * sizeof(float)) == 0);
	free(out1);
	loom_gpt2_destroy(a);
	loom_gpt2_destroy(b);
	return 0;
}

/* Plain SGD over the current whole buffers, for training comparisons. */
static void sgd(loom_gpt2_t *m, size_t n)
{
	float *p = loom_gpt2_params(m), *g = loom_gpt2_grads(m);
	for (size_t k = 0; k < n; k++)
		p[k] -= 0.1f * g[k];
}

TEST(gpt2_views_external_memory_train_identically)
{
	/* A model without buffers of its own, its views pointed at caller memory, trains bit for bit like
	 * one on its own buffers; set_param_buffer(NULL) / own_grads allocate the own ones lazily */
	const loom_gpt2_config_t *cfg = &tiny_cfg;
	loom_gpt2_opts_t o = {.B = 2, .T = 8}, ov = {.B = 2, .T = 8, .no_own_params = 1, .no_own_grads = 1};
	loom_gpt2_t *a, *v;
	int in[16], tg[16];
	size_t n = loom_gpt2_num_params(cfg);
	float la, lv, *p = malloc(n * sizeof(float)), *g = malloc(n * sizeof(float));
	CHECK_OK(loom_gpt2_create_opts(&a, cfg, &o));
	CHECK_OK(loom_gpt2_create_opts(&v, cfg, &ov));
	CHECK(loom_gpt2_params(v) == NULL && loom_gpt2_grads(v) == NULL && loom_gpt2_tensor_param(v, 3) == NULL);
	CHECK_OK(loom_gpt2_set_param_buffer(v, p));
	CHECK_OK(loom_gpt2_set_grad_buffer(v, g));
	CHECK(loom_gpt2_params(v) == p && loom_gpt2_grads(v) == g);
	CHECK(loom_gpt2_tensor_param(v, 3) == p + loom_gpt2_tensors(v, NULL)[3].offset);
	loom_gpt2_init(a, 71);
	loom_gpt2_init(v, 71); /* writes through the views */
	CHECK(memcmp(p, loom_gpt2_params(a), n * sizeof(float)) == 0);
	for (int step = 0; step < 3; step++) {
		random_tokens(in, 16, cfg->vocab_size, 72 + step);
		random_tokens(tg, 16, cfg->vocab_size, 82 + step);
		loom_gpt2_zero_grad(a);
		loom_gpt2_zero_grad(v);
		CHECK_OK(loom_gpt2_forward_backward(a, in, tg, 2, 8, 1.0f, &la));
		CHECK_OK(loom_gpt2_forward_backward(v, in, tg, 2, 8, 1.0f, &lv));
		CHECK_FEQ(la, lv);
		CHECK(memcmp(g, loom_gpt2_grads(a), n * sizeof(float)) == 0);
		sgd(a, n);
		sgd(v, n);
	}
	CHECK(memcmp(p, loom_gpt2_params(a), n * sizeof(float)) == 0);
	/* back to own buffers, allocated now, zeroed */
	CHECK_OK(loom_gpt2_set_param_buffer(v, NULL));
	CHECK_OK(loom_gpt2_own_grads(v));
	CHECK(loom_gpt2_params(v) != p && loom_gpt2_params(v) != NULL && loom_gpt2_grads(v) != g);
	CHECK_EQ(loom_gpt2_params(v)[0], 0);
	CHECK_ERR(loom_gpt2_set_tensor_view(v, loom_gpt2_num_tensors(cfg), p, g), LOOM_EINVAL);
	CHECK_ERR(loom_gpt2_set_unit_view(v, cfg->n_layer + 1, p, g), LOOM_EINVAL);
	free(p), free(g);
	loom_gpt2_destroy(a);
	loom_gpt2_destroy(v);
	return 0;
}

/* Index of block l's j-th tensor. */
static int lt_index(int l, int j)
{
	return 2 + LOOM_GPT2_LAYER_TENSORS * l + j;
}

/* ZeRO-3 in miniature: a block's parameters are copied ("gathered") from the master copy into one
 * transient buffer just before the block uses them, from the param-use hook. */
typedef struct {
	loom_gpt2_t *m;
	const float *master;
	float *gathered; /* one block's parameters */
	int log[128][2], n;
} gather_t;

static void gather_block(void *ctx, int unit, int phase)
{
	gather_t *z = ctx;
	const loom_gpt2_config_t *cfg = loom_gpt2_config(z->m);
	if (z->n < 128)
		z->log[z->n][0] = unit, z->log[z->n][1] = phase;
	z->n++;
	if (unit < 0 || unit >= cfg->n_layer)
		return;
	const loom_tensor_info_t *t = loom_gpt2_tensors(z->m, NULL);
	int first = 2 + LOOM_GPT2_LAYER_TENSORS * unit;
	size_t numel = t[first + LOOM_GPT2_LAYER_TENSORS].offset - t[first].offset;
	memcpy(z->gathered, z->master + t[first].offset, numel * sizeof(float));
	loom_gpt2_set_unit_view(z->m, unit, z->gathered, NULL);
}

TEST(gpt2_param_use_hook_gathers_blocks)
{
	/* The hook runs before each unit uses its parameters, in order; pointing each block at a
	 * transient buffer from the hook gives the fused pass's gradients bit for bit */
	const loom_gpt2_config_t *cfg = &tiny_cfg;
	loom_gpt2_opts_t o = {.B = 2, .T = 8}, oz = {.B = 2, .T = 8, .no_own_params = 1, .no_own_grads = 1};
	loom_gpt2_t *a, *z;
	int in[16], tg[16], L = cfg->n_layer, nt = loom_gpt2_num_tensors(cfg);
	size_t n = loom_gpt2_num_params(cfg);
	float la, lz, *master = malloc(n * sizeof(float)), *grads = calloc(n, sizeof(float));
	gather_t g = {0};
	CHECK_OK(loom_gpt2_create_opts(&a, cfg, &o));
	CHECK_OK(loom_gpt2_create_opts(&z, cfg, &oz));
	randomize(a, 0.3, 91);
	memcpy(master, loom_gpt2_params(a), n * sizeof(float));
	const loom_tensor_info_t *t = loom_gpt2_tensors(z, NULL);
	g.m = z, g.master = master;
	g.gathered = malloc((t[lt_index(1, 0)].offset - t[lt_index(0, 0)].offset) * sizeof(float));
	/* embeddings and ln_f stay on the master copy; gradients all go to one caller buffer, tensor by tensor */
	CHECK_OK(loom_gpt2_set_unit_view(z, -1, master, NULL));
	CHECK_OK(loom_gpt2_set_unit_view(z, L, master + t[nt - 2].offset, NULL));
	for (int i = 0; i < nt; i++)
		CHECK_OK(loom_gpt2_set_tensor_view(z, i, NULL, grads + t[i].offset));
	loom_gpt2_on_param_use(z, gather_block, &g);
	loom_gpt2_zero_grad(a);
	for (size_t k = 0; k < n; k++)
		grads[k] = 1.0f;
	loom_gpt2_zero_grad(z); /* through the views */
	for (size_t k = 0; k < n; k++)
		CHECK_FEQ(grads[k], 0.0f);
	random_tokens(in, 16, cfg->vocab_size, 92);
	random_tokens(tg, 16, cfg->vocab_size, 93);
	CHECK_OK(loom_gpt2_forward_backward(a, in, tg, 2, 8, 1.0f, &la));
	CHECK_OK(loom_gpt2_forward_backward(z, in, tg, 2, 8, 1.0f, &lz));
	CHECK_FEQ(la, lz);
	CHECK(memcmp(grads, loom_gpt2_grads(a), n * sizeof(float)) == 0);
	/* order: forward -1, 0..L-1, L; the fused head L forward and backward; backward L-1..0, -1 */
	int want[][2] = {{-1, 0}, {0, 0}, {1, 0}, {2, 0}, {2, 1}, {1, 1}, {0, 1}, {-1, 1}};
	CHECK_EQ(g.n, 8);
	for (int k = 0; k < 8; k++)
		CHECK_MSG(g.log[k][0] == want[k][0] && g.log[k][1] == want[k][1], "call %d: unit %d phase %d", k,
		          g.log[k][0], g.log[k][1]);
	/* a forward alone: -1, 0..L-1, L in phase 0; generation: the same for the prompt and each step */
	g.n = 0;
	CHECK_OK(loom_gpt2_forward(z, in, tg, 2, 8, &lz));
	CHECK_FEQ(la, lz);
	CHECK_EQ(g.n, L + 2);
	for (int k = 0; k < L + 2; k++)
		CHECK(g.log[k][0] == k - 1 && g.log[k][1] == 0);
	int out[8], n_out;
	g.n = 0;
	CHECK_OK(loom_gpt2_generate(z, in, 2, 5, 0.0f, 0, 1, -1, out, &n_out, NULL, NULL));
	CHECK_EQ(n_out, 5);
	CHECK_EQ(g.n, 5 * (L + 2)); /* the prompt, then 4 steps (the last token needs no step) */
	int out_a[8], n_a;
	CHECK_OK(loom_gpt2_generate(a, in, 2, 5, 0.0f, 0, 1, -1, out_a, &n_a, NULL, NULL));
	CHECK(n_a == 5 && memcmp(out, out_a, sizeof(int) * 5) == 0);
	loom_gpt2_on_param_use(z, NULL, NULL);
	free(master), free(grads), free(g.gathered);
	loom_gpt2_destroy(a);
	loom_gpt2_destroy(z);
	return 0;
}

TEST(gpt2_stages_match_whole_model)
{
	/* A 3-layer model cut into stages [0,1) and [1,3) sharing one parameter and one gradient buffer:
	 * stage 1 fed stage 0's output computes the same head input and loss, stage 0 fed stage 1's input
	 * gradient the same gradients as the whole model, bit for bit */
	loom_gpt2_config_t cfg = {.n_layer = 3, .n_head = 2, .n_embd = 16, .seq_len = 8, .vocab_size = 11};
	loom_gpt2_opts_t ow = {.B = 2, .T = 8};
	loom_gpt2_opts_t o0 = {.B = 2, .T = 8, .layer_hi = 1, .no_own_params = 1, .no_own_grads = 1};
	loom_gpt2_opts_t o1 = {.B = 2, .T = 8, .layer_lo = 1, .no_own_params = 1, .no_own_grads = 1};
	loom_gpt2_t *w, *s0, *s1;
	int in[16], tg[16], nt = loom_gpt2_num_tensors(&cfg), C = cfg.n_embd;
	size_t n = loom_gpt2_num_params(&cfg), NC = 16 * (size_t)C;
	float lw, ls, *g = calloc(n, sizeof(float));
	ready_log_t r = {0};
	CHECK_OK(loom_gpt2_create_opts(&w, &cfg, &ow));
	CHECK_OK(loom_gpt2_create_opts(&s0, &cfg, &o0));
	CHECK_OK(loom_gpt2_create_opts(&s1, &cfg, &o1));
	randomize(w, 0.3, 101);
	CHECK_OK(loom_gpt2_set_param_buffer(s0, loom_gpt2_params(w)));
	CHECK_OK(loom_gpt2_set_param_buffer(s1, loom_gpt2_params(w)));
	CHECK_OK(loom_gpt2_set_grad_buffer(s0, g));
	CHECK_OK(loom_gpt2_set_grad_buffer(s1, g));
	random_tokens(in, 16, cfg.vocab_size, 102);
	random_tokens(tg, 16, cfg.vocab_size, 103);
	loom_gpt2_zero_grad(w);
	CHECK_OK(loom_gpt2_forward_backward(w, in, tg, 2, 8, 0.5f, &lw));

	CHECK_OK(units_forward(s0, 0, in, 2, 8, 0, 1));
	memcpy(loom_gpt2_block_input(s1, 0, 1), loom_gpt2_block_input(s0, 0, 1), NC * sizeof(float)); /* "send" */
	CHECK_OK(units_forward(s1, 0, NULL, 2, 8, 1, 3));
	CHECK(memcmp(loom_gpt2_block_input(s1, 0, 3), loom_gpt2_block_input(w, 0, 3), NC * sizeof(float)) == 0);
	r.m = s1;
	r.snap = calloc(n, sizeof(float));
	loom_gpt2_on_grad_ready(s1, on_ready, &r);
	CHECK_OK(units_backward(s1, 0, NULL, tg, 2, 8, 1, 3, 0.5f, &ls));
	CHECK_FEQ(lw, ls);
	/* stage 1 reports ln_f, then wte (its share is final there), then blocks 2 and 1 */
	CHECK_EQ(r.n, 3 + 2 * LOOM_GPT2_LAYER_TENSORS);
	CHECK(r.order[0] == nt - 1 && r.order[1] == nt - 2 && r.order[2] == 0);
	for (int k = 3; k < r.n; k++)
		CHECK_EQ(r.order[k], nt - k);
	memcpy(loom_gpt2_stream_grad(s0), loom_gpt2_stream_grad(s1), NC * sizeof(float)); /* "send" back */
	CHECK_OK(units_backward(s0, 0, in, NULL, 2, 8, 0, 1, 0.5f, NULL));
	CHECK(memcmp(loom_gpt2_stream_grad(s0), loom_gpt2_stream_grad(w), NC * sizeof(float)) == 0);
	CHECK(memcmp(g, loom_gpt2_grads(w), n * sizeof(float)) == 0);
	/* what a stage does not hold */
	CHECK_ERR(loom_gpt2_embed_forward(s1, 0, in, 2, 8), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "does not hold the embedding");
	CHECK_ERR(loom_gpt2_block_forward(s1, 0, 0, 2, 8), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "block 0 is not held (blocks [1, 3))");
	CHECK_ERR(loom_gpt2_head_forward(s0, 0, tg, 2, 8, &ls), LOOM_EINVAL);
	CHECK_ERR(loom_gpt2_forward(s1, in, tg, 2, 8, &ls), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "needs every layer");
	CHECK_ERR(loom_gpt2_forward_backward(s0, in, tg, 2, 8, 1.0f, &ls), LOOM_EINVAL);
	CHECK_ERR(loom_gpt2_kv_cache_alloc(s0), LOOM_EINVAL);
	CHECK(loom_gpt2_block_input(s1, 0, 0) == NULL && loom_gpt2_block_input(s1, 0, 4) == NULL);
	loom_gpt2_opts_t bad = {.B = 2, .T = 8, .layer_lo = 2, .layer_hi = 2};
	loom_gpt2_t *none;
	CHECK_ERR(loom_gpt2_create_opts(&none, &cfg, &bad), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "layers [2, 2)");
	CHECK(none == NULL);
	free(g), free(r.snap);
	loom_gpt2_destroy(w);
	loom_gpt2_destroy(s0);
	loom_gpt2_destroy(s1);
	return 0;
}

TEST(gpt2_generate_keeps_training_activations)
{
	/* generate between a forward and its backward changes nothing the backward reads: the gradients
	 * equal the fused pass's bit for bit; the tokens equal those of a model that never trained, and
	 * loom_gpt2_logits is left as the last forward made it */
	const loom_gpt2_config_t *cfg = &tiny_cfg;
	loom_gpt2_opts_t o = {.B = 2, .T = 8};
	loom_gpt2_t *a, *b;
	int in[16], tg[16], L = cfg->n_layer, prompt[2] = {3, 4}, ta[8] = {0}, tb[8] = {0}, na, nb;
	size_t n = loom_gpt2_num_params(cfg), V = (size_t)cfg->vocab_size;
	float la, lb, z[22];
	CHECK_OK(twin_models(&a, &b, cfg, &o, 111));
	random_tokens(in, 16, cfg->vocab_size, 112);
	random_tokens(tg, 16, cfg->vocab_size, 113);
	CHECK_OK(loom_gpt2_generate(a, prompt, 2, 6, 1.0f, 5, 7, -1, ta, &na, NULL, NULL));
	CHECK_OK(loom_gpt2_forward(b, in, NULL, 2, 8, NULL));
	memcpy(z, loom_gpt2_logits(b), 2 * V * sizeof(float));
	loom_gpt2_zero_grad(a);
	loom_gpt2_zero_grad(b);
	CHECK_OK(loom_gpt2_forward_backward(a, in, tg, 2, 8, 1.0f, &la));
	CHECK_OK(units_forward(b, 0, in, 2, 8, 0, L));
	CHECK(b->kv == NULL);
	CHECK_OK(loom_gpt2_generate(b, prompt, 2, 6, 1.0f, 5, 7, -1, tb, &nb, NULL, NULL));
	CHECK(b->kv != NULL);
	kv_cache_t *kv = b->kv;
	CHECK_OK(units_backward(b, 0, in, tg, 2, 8, 0, L, 1.0f, &lb));
	CHECK_FEQ(la, lb);
	CHECK(memcmp(loom_gpt2_grads(a), loom_gpt2_grads(b), n * sizeof(float)) == 0);
	CHECK(na == 6 && nb == 6 && memcmp(ta, tb, sizeof ta) == 0);
	CHECK(memcmp(z, loom_gpt2_logits(b), 2 * V * sizeof(float)) == 0);
	/* the cache is allocated once */
	CHECK_OK(loom_gpt2_kv_cache_alloc(b));
	CHECK_OK(loom_gpt2_generate(b, prompt, 2, 6, 1.0f, 5, 7, -1, tb, &nb, NULL, NULL));
	CHECK(b->kv == kv && memcmp(ta, tb, sizeof ta) == 0);
	loom_gpt2_destroy(a);
	loom_gpt2_destroy(b);
	return 0;
}

TEST(gpt2_tensor_table_layer_and_tp_dim)
{
	loom_gpt2_t *m;
	int n = 0;
	CHECK_OK(loom_gpt2_create(&m, &tiny_cfg, 1, 8));
	const loom_tensor_info_t *t = loom_gpt2_tensors(m, &n);
	CHECK_EQ(n, loom_gpt2_num_tensors(&tiny_cfg));
	for (int i = 0; i < n; i++) {
		loom_tensor_info_t ti;
		CHECK_OK(loom_gpt2_tensor_info(&tiny_cfg, i, &ti));
		CHECK(memcmp(&ti, &t[i], sizeof ti) == 0);
	}
	static const struct {
		const char *name;
		int layer, tp_dim, decay;
	} want[] = {
		{"wte.weight", -1, 0, 1},           {"wpe.weight", -1, -1, 1},         {"h.0.ln_1.weight", 0, -1, 0},
		{"h.0.ln_1.bias", 0, -1, 0},        {"h.0.attn.c_attn.weight", 0, 1, 1}, {"h.0.attn.c_attn.bias", 0, 0, 0},
		{"h.0.attn.c_proj.weight", 0, 0, 1}, {"h.0.attn.c_proj.bias", 0, -1, 0}, {"h.1.ln_2.weight", 1, -1, 0},
		{"h.1.ln_2.bias", 1, -1, 0},        {"h.1.mlp.c_fc.weight", 1, 1, 1},   {"h.1.mlp.c_fc.bias", 1, 0, 0},
		{"h.1.mlp.c_proj.weight", 1, 0, 1}, {"h.1.mlp.c_proj.bias", 1, -1, 0},  {"ln_f.weight", 2, -1, 0},
		{"ln_f.bias", 2, -1, 0},
	};
	for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
		int i = loom_gpt2_tensor_index(&tiny_cfg, want[k].name);
		CHECK_MSG(i >= 0, "%s", want[k].name);
		CHECK_MSG(t[i].layer == want[k].layer && t[i].tp_dim == want[k].tp_dim && t[i].decay == want[k].decay,
		          "%s: layer %d tp_dim %d decay %d", want[k].name, t[i].layer, t[i].tp_dim, t[i].decay);
	}
	loom_gpt2_destroy(m);
	return 0;
}

TEST(gpt2_alloc_failures_clean)
{
	/* Fail the n-th allocation of create (2 arenas, a stage), of the KV cache and of the lazily
	 * allocated own buffers, for every n: each fails cleanly with LOOM_ENOMEM (ASan checks for leaks),
	 * and once n is past the last allocation the call succeeds */
	loom_gpt2_config_t cfg = {.n_layer = 3, .n_head = 2, .n_embd = 16, .seq_len = 8, .vocab_size = 11};
	loom_gpt2_opts_t o = {.B = 2, .T = 8, .arenas = 2, .layer_lo = 1, .no_own_grads = 1};
	loom_gpt2_t *m = NULL;
	int rc = LOOM_ENOMEM, n = 0, prompt[2] = {1, 2}, out[4], n_out;
	for (n = 1; n < 100 && rc == LOOM_ENOMEM; n++) {
		loom__fault_alloc_set(n);
		rc = loom_gpt2_create_opts(&m, &cfg, &o);
		CHECK(rc == LOOM_OK || (rc == LOOM_ENOMEM && m == NULL));
		if (rc == LOOM_ENOMEM) /* the message gives the byte counts */
			CHECK_CONTAINS(loom_errmsg(), " bytes requested; parameters and gradients take ");
	}
	loom__fault_alloc_set(0);
	CHECK_OK(rc);
	CHECK_MSG(n > 4, "create made %d allocations", n - 1);
	loom__fault_alloc_set(1);
	CHECK_ERR(loom_gpt2_own_grads(m), LOOM_ENOMEM);
	CHECK(loom_gpt2_grads(m) == NULL);
	loom__fault_alloc_set(0);
	CHECK_OK(loom_gpt2_own_grads(m));
	CHECK(loom_gpt2_grads(m) != NULL);
	loom_gpt2_destroy(m);
	CHECK_OK(loom_gpt2_create(&m, &cfg, 1, 8));
	for (rc = LOOM_ENOMEM, n = 1; n < 100 && rc == LOOM_ENOMEM; n++) {
		loom__fault_alloc_set(n);
		rc = loom_gpt2_generate(m, prompt, 2, 2, 0.0f, 0, 1, -1, out, &n_out, NULL, NULL);
		CHECK(rc == LOOM_OK || (rc == LOOM_ENOMEM && m->kv == NULL));
	}
	loom__fault_alloc_set(0);
	CHECK_OK(rc);
	CHECK_EQ(n_out, 2);
	CHECK_EQ(n, 5); /* three allocations: the cache, its layer table, its memory */
	loom_gpt2_destroy(m);
	return 0;
}
