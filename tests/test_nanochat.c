/* test_nanochat.c: nanochat's GPT (src/model/nanochat*.c) through the model interface: against a
 * float64 PyTorch reference (tests/ref/nanochat_ref.py, /usr/bin/python3 with torch 1.13) on a small
 * configuration with grouped kv heads, value embeddings and a short window below T (logits at every
 * position, the loss, every gradient), the unit passes and hooks, the init, base_train's --depth
 * sizing, the configuration checks, KV-cache sampling, activation checkpointing and bf16. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/model.h"
#include "loom/nanochat.h"
#include "model/nanochat_model.h"
#include "test.h"

/* L3, 4 query heads sharing 2 kv heads, head_dim 16, windows S S L with S = 8 < T = 16; layers 0 and
 * 2 have value embeddings; V 61 padded to 64. */
static loom_model_config_t small_cfg(void)
{
	loom_model_config_t c = {.n_layer = 3, .n_head = 4, .n_embd = 64, .seq_len = 16, .vocab_size = 61};
	c.arch = LOOM_ARCH_NANOCHAT;
	c.n_kv_head = 2;
	snprintf(c.window_pattern, sizeof c.window_pattern, "SSL");
	return c;
}

static uint32_t lcg(uint32_t *s)
{
	*s = *s * 1664525u + 1013904223u;
	return *s >> 8;
}

static float urand(uint32_t *s) /* uniform in [-1, 1) */
{
	return (float)lcg(s) / 8388608.0f - 1.0f;
}

/* Init, then make every tensor non-degenerate: the zero-initialized projections and gates random, the
 * scalars away from 1 and 0.1, lm_head large enough that the softcap bends the logits. */
static void test_params(loom_model_t *m, uint64_t seed)
{
	int n;
	uint32_t s = (uint32_t)seed * 2654435761u + 1;
	const loom_tensor_info_t *tt = loom_model_tensors(m, &n);
	loom_model_init(m, seed);
	for (int i = 0; i < n; i++) {
		float *p = loom_model_tensor_param(m, i);
		const char *nm = tt[i].name;
		for (size_t k = 0; k < tt[i].numel; k++) {
			if (strstr(nm, "c_proj"))
				p[k] = 0.15f * urand(&s);
			else if (strstr(nm, "ve_gate"))
				p[k] = 0.5f * urand(&s);
			else if (strcmp(nm, "resid_lambdas") == 0)
				p[k] = 1.0f + 0.3f * urand(&s);
			else if (strcmp(nm, "x0_lambdas") == 0)
				p[k] = 0.1f + 0.3f * urand(&s);
			else if (strcmp(nm, "lm_head.weight") == 0)
				p[k] *= 300.0f;
		}
	}
}

static void make_tokens(int *in, int *tg, int n, int V, uint32_t seed)
{
	for (int i = 0; i < n; i++) {
		in[i] = (int)(lcg(&seed) % (uint32_t)V);
		tg[i] = (int)(lcg(&seed) % (uint32_t)V);
	}
}

static int write_file(const char *dir, const char *name, const void *p, size_t n)
{
	char path[700];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	return test_write_file(path, p, n);
}

static double *read_f64(const char *dir, const char *name, size_t n)
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

TEST(nanochat_vs_torch)
{
	loom_model_config_t c = small_cfg();
	enum { B = 2, T = 16 };
	int in[B * T], tg[B * T], n;
	char dir[512], path[700], cmd[1400], out[8192];
	loom_model_t *m = NULL;
	loom_model_opts_t o = {.B = B, .T = T};
	CHECK_OK(loom_model_create(&m, &c, &o));
	test_params(m, 7);
	make_tokens(in, tg, B * T, c.vocab_size, 11);
	size_t np = loom_model_num_params(&c);
	const loom_tensor_info_t *tt = loom_model_tensors(m, &n);

	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK(write_file(dir, "params.bin", loom_model_params(m), np * sizeof(float)) == 0);
	CHECK(write_file(dir, "inputs.bin", in, sizeof in) == 0);
	CHECK(write_file(dir, "targets.bin", tg, sizeof tg) == 0);
	snprintf(path, sizeof path, "%s/tensors.txt", dir);
	FILE *f = fopen(path, "w");
	CHECK(f != NULL);
	for (int i = 0; i < n; i++) {
		fprintf(f, "%s %zu %zu", tt[i].name, tt[i].offset, tt[i].shape[0]);
		if (tt[i].ndim == 2)
			fprintf(f, " %zu", tt[i].shape[1]);
		fprintf(f, "\n");
	}
	CHECK(fclose(f) == 0);
	snprintf(path, sizeof path, "%s/config.json", dir);
	f = fopen(path, "w");
	CHECK(f != NULL);
	fprintf(f, "{\"n_layer\": %d, \"n_head\": %d, \"n_kv_head\": %d, \"n_embd\": %d, \"sequence_len\": %d, "
	        "\"vocab_size\": %d, \"B\": %d, \"T\": %d, \"window_pattern\": \"%s\", \"short_window\": %d}\n",
	        c.n_layer, c.n_head, c.n_kv_head, c.n_embd, c.seq_len, c.vocab_size, B, T, c.window_pattern, c.short_window);
	CHECK(fclose(f) == 0);
	
	CHECK_EQ(loom__nc_window(&c, 0), 8); /* shorter than T: the window is exercised */
	CHECK_EQ(loom__nc_window(&c, 1), 8);
	CHECK_EQ(loom__nc_window(&c, 2), 16);

	snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=1 /usr/bin/python3 tests/ref/nanochat_ref.py %s", dir);
	int st = test_run_cmd(cmd, out, sizeof out, 120);
	CHECK_MSG(st == 0, "'%s' exited with %d (run from the source root; needs python3-torch):\n%s", cmd, st, out);
	size_t nl = (size_t)B * T * c.vocab_size;
	double *rloss = read_f64(dir, "loss.bin", 1), *rlog = read_f64(dir, "logits.bin", nl), *rg = read_f64(dir, "grads.bin", np);
	double *rloss32 = read_f64(dir, "loss_f32.bin", 1), *rlog32 = read_f64(dir, "logits_f32.bin", nl);
	double *rg32 = read_f64(dir, "grads_f32.bin", np);
	CHECK(rloss && rlog && rg && rloss32 && rlog32 && rg32);
	/* The yardstick: float64 is the truth; each comparison allows 1e-6 relative, or twice what float32
	 * arithmetic alone (the same reference run in float32) misses by where that is more: a float32
	 * model cannot be closer than float32 rounding allows (this configuration's resid_lambdas gradient,
	 * a sum over every position and channel, is ~3e-6 off in float32 torch). */
	double l32 = 0.0;
	for (size_t i = 0; i < nl; i++)
		l32 = fmax(l32, fabs(rlog32[i] - rlog[i]));
	double tol_logit = fmax(1e-6 * 15.0, 2.0 * l32);

	/* the logits of every position: a forward over each prefix gives its last position's */
	double worst_logit = 0.0;
	for (int t = 1; t <= T; t++) {
		int pin[B * T];
		for (int b = 0; b < B; b++)
			memcpy(pin + b * t, in + b * T, sizeof(int) * (size_t)t);
		CHECK_OK(loom_model_forward(m, pin, NULL, B, t, NULL));
		const float *lg = loom_model_logits(m);
		for (int b = 0; b < B; b++)
			for (int v = 0; v < c.vocab_size; v++) {
				double r = rlog[((size_t)b * T + t - 1) * c.vocab_size + v], e = fabs(lg[b * c.vocab_size + v] - r);
				worst_logit = fmax(worst_logit, e);
				CHECK_MSG(e <= tol_logit, "logit b%d t%d v%d: loom %.9g, torch %.9g (diff %.3g > %.3g)", b, t - 1, v,
				          lg[b * c.vocab_size + v], r, e, tol_logit);
			}
	}
	/* the loss, by forward and by forward_backward; the gradients */
	float loss = 0.0f, loss2 = 0.0f;
	CHECK_OK(loom_model_forward(m, in, tg, B, T, &loss));
	loom_model_zero_grad(m);
	CHECK_OK(loom_model_forward_backward(m, in, tg, B, T, 1.0f, &loss2));
	CHECK_FEQ(loss, loss2);
	double tol_loss = fmax(1e-6 * rloss[0], 2.0 * fabs(rloss32[0] - rloss[0]));
	CHECK_MSG(fabs(loss - rloss[0]) <= tol_loss, "loss: loom %.9g, torch %.12g (tolerance %.3g)", loss, rloss[0],
	          tol_loss);
	/* the softcap must matter: some logits beyond +-5, where 15 tanh(z/15) bends z by more than 3% */
	double big = 0.0;
	for (size_t i = 0; i < nl; i++)
		big = fmax(big, fabs(rlog[i]));
	CHECK_MSG(big > 5.0, "the largest logit is %.3g: the softcap is not exercised", big);
	/* float32's worst gradient error, relative to each tensor's largest, over the whole model (per
	 * tensor it is noisy: layer 0's resid_lambdas and x0_lambdas gradients are the same sum, since x = x0
	 * there, and float32 torch misses one by 3e-6, the other by 2e-7, only by summing in another order) */
	double worst = 0.0, worst32 = 0.0;
	for (int i = 0; i < n; i++) {
		double mx = 0.0, w32 = 0.0;
		for (size_t k = tt[i].offset; k < tt[i].offset + tt[i].numel; k++) {
			mx = fmax(mx, fabs(rg[k]));
			w32 = fmax(w32, fabs(rg32[k] - rg[k]));
		}
		CHECK_MSG(mx > 0.0, "%s: torch's gradient is all zero", tt[i].name);
		worst32 = fmax(worst32, w32 / mx);
	}
	double tol_rel = fmax(1e-6, 2.0 * worst32);
	for (int i = 0; i < n; i++) {
		const float *g = loom_model_tensor_grad(m, i);
		double mx = 0.0, w = 0.0;
		size_t wi = 0, o = tt[i].offset;
		for (size_t k = 0; k < tt[i].numel; k++)
			mx = fmax(mx, fabs(rg[o + k]));
		for (size_t k = 0; k < tt[i].numel; k++)
			if (fabs(g[k] - rg[o + k]) > w)
				w = fabs(g[k] - rg[o + k]), wi = k;
		worst = fmax(worst, w / mx);
		CHECK_MSG(w <= tol_rel * mx, "%s[%zu]: loom %.9g, torch %.9g (diff %.3g > %.3g x max %.3g)", tt[i].name, wi,
		          g[wi], rg[o + wi], w, tol_rel, mx);
	}
	fprintf(stderr, "  vs torch float64: loss %.3g relative (float32 torch %.3g), logits %.3g absolute (float32 torch "
	        "%.3g), gradients %.3g of each tensor's max (float32 torch %.3g)\n", fabs(loss - rloss[0]) / rloss[0],
	        fabs(rloss32[0] - rloss[0]) / rloss[0], worst_logit, l32, worst, worst32);
	free(rloss32);
	free(rlog32);
	free(rg32);
	free(rloss);
	free(rlog);
	free(rg);
	loom_model_destroy(m);
	if (!getenv("LOOM_TEST_KEEP"))
		test_rmdir(dir);
	return 0;
}
