/* test_nanochat.c: nanochat's GPT (src/model/nanochat*.c) through the model interface: against a
 * float64 PyTorch reference (tests/ref/nanochat_ref.py, /usr/bin/python3 with torch 1.13) on a small
 * configuration with grouped kv heads, value embeddings and a short window below T (logits at every
 * position, the loss, every gradient), the unit passes and hooks, the init, base_train's --depth
 * sizing, the configuration checks, KV-cache sampling, activation checkpointing and bf16. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/model.h"
#include "loom/nanochat.h"
#include "core/util.h"
#include "model/nanochat/nanochat_model.h"
#include "family_check.h"
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
				p[k] = 0.15f * fc_urand(&s);
			else if (strstr(nm, "ve_gate"))
				p[k] = 0.5f * fc_urand(&s);
			else if (strcmp(nm, "resid_lambdas") == 0)
				p[k] = 1.0f + 0.3f * fc_urand(&s);
			else if (strcmp(nm, "x0_lambdas") == 0)
				p[k] = 0.1f + 0.3f * fc_urand(&s);
			else if (strcmp(nm, "lm_head.weight") == 0)
				p[k] *= 300.0f;
		}
	}
}

enum { MAX_BT = 512 };

/* The model of configuration c on a random batch of B x T against the reference; seed picks the
 * parameters and tokens. */
static int vs_torch(loom_model_config_t c, int B, int T, uint64_t seed)
{
	int in[MAX_BT], tg[MAX_BT], n;
	char dir[512], path[700], cmd[1400], out[8192];
	loom_model_t *m = NULL;
	loom_model_opts_t o = {.B = B, .T = T};
	CHECK(B * T <= MAX_BT);
	CHECK_OK(loom_model_create(&m, &c, &o));
	test_params(m, seed);
	fc_make_tokens(in, tg, B * T, c.vocab_size, (uint32_t)seed + 4);
	size_t np = loom_model_num_params(&c);
	const loom_tensor_info_t *tt = loom_model_tensors(m, &n);

	CHECK_OK(test_mkdtemp(dir, sizeof dir));
	CHECK(fc_write_file(dir, "params.bin", loom_model_params(m), np * sizeof(float)) == 0);
	CHECK(fc_write_file(dir, "inputs.bin", in, sizeof(int) * (size_t)B * T) == 0);
	CHECK(fc_write_file(dir, "targets.bin", tg, sizeof(int) * (size_t)B * T) == 0);
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

	snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=1 /usr/bin/python3 tests/ref/nanochat_ref.py %s", dir);
	int st = test_run_cmd(cmd, out, sizeof out, 120);
	CHECK_MSG(st == 0, "'%s' exited with %d (run from the source root; needs python3-torch):\n%s", cmd, st, out);
	size_t nl = (size_t)B * T * c.vocab_size;
	double *rloss = fc_read_f64(dir, "loss.bin", 1), *rlog = fc_read_f64(dir, "logits.bin", nl), *rg = fc_read_f64(dir, "grads.bin", np);
	double *rloss32 = fc_read_f64(dir, "loss_f32.bin", 1), *rlog32 = fc_read_f64(dir, "logits_f32.bin", nl);
	double *rg32 = fc_read_f64(dir, "grads_f32.bin", np);
	CHECK(rloss && rlog && rg && rloss32 && rlog32 && rg32);
	/* The yardstick: float64 is the truth; each comparison allows 1e-6 relative, or 4 x what float32
	 * arithmetic alone (the same reference run in float32) misses by where that is more: a float32
	 * model cannot be closer than float32 rounding allows (this configuration's resid_lambdas gradient,
	 * a sum over every position and channel, is ~3e-6 off in float32 torch; loom lands at 1-1.5 x
	 * torch's distance, depending on the build's summation orders). A real error is far beyond: a
	 * window one position too wide moves logits by 0.07. */
	double l32 = 0.0;
	for (size_t i = 0; i < nl; i++)
		l32 = fmax(l32, fabs(rlog32[i] - rlog[i]));
	double tol_logit = fmax(1e-6 * 15.0, 4.0 * l32);

	/* the logits of every position: a forward over each prefix gives its last position's */
	double worst_logit = 0.0;
	for (int t = 1; t <= T; t++) {
		int pin[MAX_BT];
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
	double tol_loss = fmax(1e-6 * rloss[0], 4.0 * fabs(rloss32[0] - rloss[0]));
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
	double tol_rel = fmax(1e-6, 4.0 * worst32);
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

/* L3 with GQA (4 query heads on 2 kv heads), windows S S L with S = 8 < T = 16, value embeddings on
 * layers 0 and 2 */
TEST(nanochat_vs_torch)
{
	loom_model_config_t c = small_cfg();
	CHECK_EQ(loom__nc_window(&c, 0), 8); /* shorter than T: the window is exercised */
	CHECK_EQ(loom__nc_window(&c, 1), 8);
	CHECK_EQ(loom__nc_window(&c, 2), 16);
	return vs_torch(c, 2, 16, 7);
}

/* L4 with one kv head for 4 query heads (MQA), C = 32 (the gate reads every channel), head_dim 8,
 * T = 80 across the attention's 64-row blocks with a short window of 20 ("SL": layers 0, 2 short),
 * value embeddings on layers 1 and 3, T below sequence_len */
TEST(nanochat_vs_torch_long_mqa)
{
	loom_model_config_t c = {.n_layer = 4, .n_head = 4, .n_embd = 32, .seq_len = 96, .vocab_size = 100};
	c.arch = LOOM_ARCH_NANOCHAT;
	c.n_kv_head = 1;
	c.short_window = 20;
	snprintf(c.window_pattern, sizeof c.window_pattern, "SL");
	CHECK_EQ(loom__nc_window(&c, 0), 20);
	CHECK_EQ(loom__nc_window(&c, 3), 96);
	return vs_torch(c, 2, 80, 23);
}

/* ---- hooks, units, arenas, stages, views ------------------------------------------------------------ */

/* Grad-ready fires once per tensor, in strictly decreasing order (wte last), param-use (unit, phase) as
 * GPT-2's; a second micro-step fires them all again and accumulates. */
TEST(nanochat_hooks_order)
{
	loom_model_config_t c = small_cfg();
	return fc_hooks_order(&c, test_params, 3 + 8 + 6 + 8 + 1);
}

/* The unit calls on two interleaved arenas, and the head split in two row ranges, give the whole-model
 * pass's losses and gradients bit for bit. */
TEST(nanochat_units_arenas_rows)
{
	loom_model_config_t c = small_cfg();
	return fc_units_arenas_rows(&c, test_params);
}

/* Two pipeline stages (blocks [0,2) with the embedding, [2,3) with the head) passing the 2C-wide stream
 * and its gradient, the second told the tokens by set_inputs, equal the whole model: each tensor's
 * gradient is one stage's, the scalars' (read by every block) the sum of both stages' shares. Each
 * stage reports what it adds to: the second stage the scalars after its first block, the first
 * after the embedding. */
TEST(nanochat_stages_match_whole)
{
	loom_model_config_t c = small_cfg();
	enum { B = 2, T = 12 };
	int in[B * T], tg[B * T], n, C = c.n_embd;
	loom_model_t *w = NULL, *s0 = NULL, *s1 = NULL;
	loom_model_opts_t ow = {.B = B, .T = T}, o0 = {.B = B, .T = T, .layer_hi = 2}, o1 = {.B = B, .T = T, .layer_lo = 2};
	CHECK_OK(loom_model_create(&w, &c, &ow));
	CHECK_OK(loom_model_create(&s0, &c, &o0));
	CHECK_OK(loom_model_create(&s1, &c, &o1));
	CHECK_EQ(loom_model_stream_width(&c), 2 * C);
	test_params(w, 4);
	size_t np = loom_model_param_count(w);
	memcpy(loom_model_params(s0), loom_model_params(w), np * sizeof(float));
	memcpy(loom_model_params(s1), loom_model_params(w), np * sizeof(float));
	fc_make_tokens(in, tg, B * T, c.vocab_size, 8);
	loom_model_zero_grad(w), loom_model_zero_grad(s0), loom_model_zero_grad(s1);
	fc_hooks_t h0, h1;
	memset(&h0, 0, sizeof h0), memset(&h1, 0, sizeof h1);
	loom_model_on_grad_ready(s0, fc_on_ready, &h0);
	loom_model_on_grad_ready(s1, fc_on_ready, &h1);
	float lw, ls;
	CHECK_OK(loom_model_forward_backward(w, in, tg, B, T, 1.0f, &lw));
	CHECK_OK(loom_model_embed_forward(s0, 0, in, B, T));
	CHECK_OK(loom_model_block_forward(s0, 0, 0, B, T));
	CHECK_OK(loom_model_block_forward(s0, 0, 1, B, T));
	memcpy(loom_model_block_input(s1, 0, 2), loom_model_block_input(s0, 0, 2), sizeof(float) * B * T * 2 * C);
	CHECK_ERR(loom_model_block_forward(s1, 0, 2, B, T), LOOM_EINVAL); /* no tokens yet: the value embeddings */
	CHECK_OK(loom_model_set_inputs(s1, 0, in, B, T));
	CHECK_OK(loom_model_block_forward(s1, 0, 2, B, T));
	CHECK_OK(loom_model_head_forward_backward(s1, 0, tg, B, T, 1.0f, &ls));
	CHECK_OK(loom_model_block_backward(s1, 0, 2, B, T));
	memcpy(loom_model_stream_grad(s0), loom_model_stream_grad(s1), sizeof(float) * B * T * 2 * C);
	CHECK_OK(loom_model_block_backward(s0, 0, 1, B, T));
	CHECK_OK(loom_model_block_backward(s0, 0, 0, B, T));
	CHECK_OK(loom_model_embed_backward(s0, 0, in, B, T));
	CHECK_FEQ(lw, ls);
	const loom_tensor_info_t *tt = loom_model_tensors(w, &n);
	for (int i = 0; i < n; i++) {
		const float *gw = loom_model_tensor_grad(w, i), *g0 = loom_model_tensor_grad(s0, i);
		const float *g1 = loom_model_tensor_grad(s1, i);
		for (size_t k = 0; k < tt[i].numel; k++) {
			float sum = tt[i].all_blocks ? g0[k] + g1[k] : tt[i].layer >= 2 ? g1[k] : g0[k];
			CHECK_MSG(tt[i].all_blocks ? fabsf(sum - gw[k]) <= 1e-6f * fabsf(gw[k]) + 1e-9f : sum == gw[k],
			          "%s[%zu]: whole %.9g, stages %.9g", tt[i].name, k, gw[k], sum);
		}
	}
	/* stage 1 reports lm_head, block 2's tensors, then the scalars (its share is final after block 2) */
	int f2, e2;
	loom_model_unit_tensors(&c, 2, &f2, &e2);
	CHECK_EQ(h1.n, 1 + (e2 - f2) + 2);
	CHECK_EQ(h1.order[0], n - 1);
	CHECK_EQ(h1.order[h1.n - 2], 2);
	CHECK_EQ(h1.order[h1.n - 1], 1);
	CHECK_EQ(h0.n, f2);
	for (int i = 0; i < h0.n; i++)
		CHECK_EQ(h0.order[i], f2 - 1 - i);
	loom_model_destroy(w), loom_model_destroy(s0), loom_model_destroy(s1);
	return 0;
}

/* Views: a model with no buffers of its own, every unit pointed at caller memory, trains exactly as
 * one with its own; zero_grad clears split views. */
TEST(nanochat_views_external)
{
	loom_model_config_t c = small_cfg();
	return fc_views_external(&c, test_params);
}

/* ---- configuration, sizing, init ----------------------------------------------------------------------- */

TEST(nanochat_config_checks)
{
	loom_model_config_t c = small_cfg(), b;
	CHECK_OK(loom_model_config_check(&c));
	b = c, b.n_embd = 66;
	CHECK_ERR(loom_model_config_check(&b), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "n_embd 66 is not divisible by n_head 4");
	b = c, b.n_kv_head = 3;
	CHECK_ERR(loom_model_config_check(&b), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "n_head 4 is not divisible by n_kv_head 3");
	b = c;
	snprintf(b.window_pattern, sizeof b.window_pattern, "SLX");
	CHECK_ERR(loom_model_config_check(&b), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "window_pattern 'SLX' has 'X' (only S, short, and L, long, are allowed)");
	b = c, b.n_head = 8, b.n_kv_head = 8, b.n_embd = 40;
	CHECK_ERR(loom_model_config_check(&b), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "head_dim 5 (n_embd / n_head) is odd");
	b = c, b.n_head = 2, b.n_kv_head = 1, b.n_embd = 16;
	CHECK_ERR(loom_model_config_check(&b), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "n_embd 16 is below the 32 channels the value-embedding gate reads");
	b = c, b.n_layer = 0;
	CHECK_ERR(loom_model_config_check(&b), LOOM_EINVAL);
	/* defaults: n_kv_head = n_head, short window = sequence_len / 2, pattern SSSL (lower case accepted) */
	b = c, b.n_kv_head = 0, b.window_pattern[0] = '\0', b.n_layer = 6;
	loom_model_t *m = NULL;
	loom_model_opts_t o = {.B = 1, .T = 4};
	CHECK_OK(loom_model_create(&m, &b, &o));
	const loom_model_config_t *e = loom_model_get_config(m);
	CHECK_EQ(e->n_kv_head, 4);
	CHECK_EQ(e->short_window, 8);
	CHECK_STREQ(e->window_pattern, "SSSL");
	int want[6] = {8, 8, 8, 16, 8, 16}; /* S S S L S, the last layer long */
	for (int l = 0; l < 6; l++)
		CHECK_EQ(loom__nc_window(&b, l), want[l]);
	loom_model_destroy(m);
	snprintf(b.window_pattern, sizeof b.window_pattern, "sl");
	b.short_window = 3;
	CHECK_OK(loom_model_config_check(&b));
	CHECK_EQ(loom__nc_window(&b, 0), 3);
	CHECK_EQ(loom__nc_window(&b, 1), 16);
	CHECK_EQ(loom__nc_window(&b, 4), 3);
	CHECK_EQ(loom__nc_window(&b, 5), 16);
	/* sizes beyond the configuration */
	o.T = 17;
	CHECK_ERR(loom_model_create(&m, &c, &o), LOOM_EINVAL);
	CHECK(m == NULL);
	return 0;
}

/* The parameter table: names, shapes, units, groups, splits, and nanochat's parameter count. */
TEST(nanochat_tensor_table)
{
	loom_model_config_t c = small_cfg();
	int n = loom_model_num_tensors(&c);
	loom_tensor_info_t t;
	CHECK_EQ(n, 26);
	CHECK_OK(loom_model_tensor_info(&c, 0, &t));
	CHECK_STREQ(t.name, "transformer.wte.weight");
	CHECK_EQ(t.shape[0], 64); CHECK_EQ(t.shape[1], 64); CHECK_EQ(t.layer, -1); CHECK_EQ(t.opt_group, LOOM_OPT_EMBED);
	CHECK_EQ(t.tp_dim, 0); CHECK_EQ(t.tp_kind, LOOM_TP_SPLIT); CHECK_EQ(t.decay, 1);
	CHECK_OK(loom_model_tensor_info(&c, 1, &t));
	CHECK_STREQ(t.name, "resid_lambdas");
	CHECK_EQ(t.ndim, 1); CHECK_EQ(t.numel, 3); CHECK_EQ(t.all_blocks, 1); CHECK_EQ(t.opt_group, LOOM_OPT_SCALAR);
	CHECK_EQ(t.decay, 0); CHECK_EQ(t.tp_dim, -1); CHECK_EQ(t.offset, 64 * 64);
	CHECK_OK(loom_model_tensor_info(&c, 2, &t));
	CHECK_STREQ(t.name, "x0_lambdas");
	CHECK_EQ(t.opt_group, LOOM_OPT_X0); CHECK_EQ(t.all_blocks, 1);
	const char *blk0[8] = {"value_embeds.0.weight", "transformer.h.0.attn.ve_gate.weight",
	                       "transformer.h.0.attn.c_q.weight", "transformer.h.0.attn.c_k.weight",
	                       "transformer.h.0.attn.c_v.weight", "transformer.h.0.attn.c_proj.weight",
	                       "transformer.h.0.mlp.c_fc.weight", "transformer.h.0.mlp.c_proj.weight"};
	size_t shp[8][2] = {{64, 32}, {2, 32}, {64, 64}, {32, 64}, {32, 64}, {64, 64}, {256, 64}, {64, 256}};
	int tpd[8] = {1, 0, 0, 0, 0, 1, 0, 1};
	for (int j = 0; j < 8; j++) {
		CHECK_OK(loom_model_tensor_info(&c, 3 + j, &t));
		CHECK_STREQ(t.name, blk0[j]);
		CHECK_EQ(t.shape[0], shp[j][0]); CHECK_EQ(t.shape[1], shp[j][1]); CHECK_EQ(t.layer, 0);
		CHECK_EQ(t.rows, (int)shp[j][0]); CHECK_EQ(t.cols, (int)shp[j][1]); CHECK_EQ(t.transposed, 0);
		CHECK_EQ(t.opt_group, j == 0 ? LOOM_OPT_EMBED : LOOM_OPT_MATRIX); CHECK_EQ(t.tp_dim, tpd[j]);
	}
	CHECK_OK(loom_model_tensor_info(&c, 11, &t)); /* block 1 has no value embedding */
	CHECK_STREQ(t.name, "transformer.h.1.attn.c_q.weight");
	CHECK_EQ(loom_model_tensor_index(&c, "value_embeds.2.weight"), 17);
	CHECK_EQ(loom_model_tensor_index(&c, "value_embeds.1.weight"), -1);
	CHECK_OK(loom_model_tensor_info(&c, n - 1, &t));
	CHECK_STREQ(t.name, "lm_head.weight");
	CHECK_EQ(t.layer, 3); CHECK_EQ(t.opt_group, LOOM_OPT_UNEMBED); CHECK_EQ(t.tp_dim, 0);
	/* nanochat's count: wte + lm_head (padded) 2 Vp C, 2 value embeddings Vp KV, 2 gates, 3 blocks of
	 * 12 C^2 minus c_k and c_v's halves (GQA), 2 L scalars */
	size_t C = 64, Vp = 64;
	size_t want = 2 * Vp * C + 2 * Vp * 32 + 2 * 2 * 32 + 3 * (10 * C * C + 2 * C * 32) + 6;
	CHECK_EQ(loom_model_num_params(&c), want);
	CHECK_EQ(t.offset + t.numel, want);
	/* nanochat's own estimate_flops() for this configuration (gpt.py at bac5a35, run once by hand): 6N =
	 * 836352 and 12 C min(W, T) for the windows 8, 8, 16 */
	CHECK_FEQ(loom_model_flops_per_token_nominal(&c, 16), 860928.0);
	/* as the kernel does them: 108, 108 and 136 keys over the 16 queries, 12 C keys / T each */
	CHECK_FEQ(loom_model_flops_per_token(&c, 16), 836352.0 + 12.0 * 64 * (108 + 108 + 136) / 16);
	int first, end;
	loom_model_unit_tensors(&c, -1, &first, &end);
	CHECK_EQ(first, 0); CHECK_EQ(end, 3);
	loom_model_unit_tensors(&c, 1, &first, &end);
	CHECK_EQ(first, 11); CHECK_EQ(end, 17);
	loom_model_unit_tensors(&c, 3, &first, &end);
	CHECK_EQ(first, 25); CHECK_EQ(end, 26);
	return 0;
}

/* FLOPs as the kernel must do them: a query at t sees min(t, W) + 1 keys (t - W..t), 12 per key and
 * channel of the query heads (fwd + bwd), averaged over T; nanochat's estimate_flops (12 C min(W, T) a
 * layer) stays the nominal count. small_cfg: L3 C64 (4 query heads of 16), windows S 8, S 8, L 16,
 * 6N = 836352. */
TEST(nanochat_flops_causal_and_windowed)
{
	loom_model_config_t c = small_cfg();
	/* T = 16: the short windows' band, 1 + 2 + ... + 9 + 7 x 9 = 108 keys; the long one's triangle 136 */
	CHECK_FEQ(loom_model_block_attn_flops(&c, 0, 16), 5184.0); /* 12 x 64 x 108 / 16 */
	CHECK_FEQ(loom_model_block_attn_flops(&c, 1, 16), 5184.0);
	CHECK_FEQ(loom_model_block_attn_flops(&c, 2, 16), 6528.0); /* 12 x 64 x 136 / 16 */
	CHECK_FEQ(loom_model_flops_per_token(&c, 16), 853248.0);
	CHECK_FEQ(loom_model_flops_per_token_nominal(&c, 16), 860928.0); /* + 12 x 64 x (8 + 8 + 16) */
	/* T = 8 <= every window: the triangle, 36 keys, in every layer */
	CHECK_FEQ(loom_model_flops_per_token(&c, 8), 836352.0 + 3 * 12.0 * 64 * 36 / 8);
	CHECK_FEQ(loom_model_flops_per_token_nominal(&c, 8), 836352.0 + 3 * 12.0 * 64 * 8);
	/* T = 1: one key, itself, in both counts */
	CHECK_FEQ(loom_model_flops_per_token(&c, 1), 838656.0);
	CHECK_FEQ(loom_model_flops_per_token_nominal(&c, 1), 838656.0);
	/* the units (embedding, blocks, head) add up to the whole: blocks 0 and 2 hold a value embedding's
	 * gate (6 x 45120 = 270720), block 1 not (270336), the head 6 Vp C = 24576 */
	CHECK_FEQ(loom_model_unit_flops(&c, -1, 16), 0.0);
	CHECK_FEQ(loom_model_unit_flops(&c, 0, 16), 270720.0 + 5184.0);
	CHECK_FEQ(loom_model_unit_flops(&c, 1, 16), 270336.0 + 5184.0);
	CHECK_FEQ(loom_model_unit_flops(&c, 2, 16), 270720.0 + 6528.0);
	CHECK_FEQ(loom_model_unit_flops(&c, 3, 16), 24576.0);
	double sum = 0;
	for (int u = -1; u <= 3; u++)
		sum += loom_model_unit_flops(&c, u, 16);
	CHECK_FEQ(sum, loom_model_flops_per_token(&c, 16));
	/* a window of 1 (W (W + 1) < 2T): 2 keys a query but the first, 31 over 16 queries, more than the
	 * nominal count's 1 */
	c.short_window = 1;
	CHECK_FEQ(loom_model_block_attn_flops(&c, 0, 16), 1488.0); /* 12 x 64 x 31 / 16 */
	CHECK_FEQ(loom_model_flops_per_token(&c, 16), 836352.0 + 2 * 1488.0 + 6528.0);
	CHECK_FEQ(loom_model_flops_per_token_nominal(&c, 16), 836352.0 + 12.0 * 64 * (1 + 1 + 16));
	/* sequence_len 1: the short window is 1 / 2 = 0, a query sees itself only (nominal: nothing) */
	c = small_cfg();
	c.seq_len = 1;
	CHECK_OK(loom_model_config_check(&c));
	CHECK_EQ(loom__nc_window(&c, 0), 0);
	CHECK_FEQ(loom_model_block_attn_flops(&c, 0, 1), 768.0);
	CHECK_FEQ(loom_model_flops_per_token(&c, 1), 838656.0);
	CHECK_FEQ(loom_model_flops_per_token_nominal(&c, 1), 836352.0 + 768.0);
	/* a refused configuration counts nothing */
	c.n_head = 3;
	CHECK_FEQ(loom_model_flops_per_token_nominal(&c, 1), 0.0);
	return 0;
}

/* base_train's sizing and nanochat's estimate_flops. */
TEST(nanochat_depth_sizing)
{
	loom_model_config_t c;
	CHECK_OK(loom_nanochat_depth_config(20, 0, 0, 2048, 32768, &c));
	CHECK_EQ(c.arch, LOOM_ARCH_NANOCHAT);
	CHECK_EQ(c.n_layer, 20); CHECK_EQ(c.n_embd, 1280); CHECK_EQ(c.n_head, 10); CHECK_EQ(c.n_kv_head, 10);
	CHECK_EQ(c.seq_len, 2048); CHECK_EQ(c.vocab_size, 32768);
	CHECK_STREQ(c.window_pattern, "SSSL");
	CHECK_OK(loom_model_config_check(&c));
	/* 12 C^2 per block, gates on the 10 odd layers, lm_head; estimate_flops' attention 12 NH D min(W, T):
	 * 5 long, 15 short */
	double C = 1280, mat = 20 * 12 * C * C + 10 * 10 * 32 + 32768 * C;
	double att = 12.0 * 10 * 128 * (5 * 2048 + 15 * 1024);
	CHECK_FEQ(loom_model_flops_per_token_nominal(&c, 2048), 6 * mat + att);
	/* at T = 512 every window covers the sequence */
	CHECK_FEQ(loom_model_flops_per_token_nominal(&c, 512), 6 * mat + 12.0 * 10 * 128 * 20 * 512);
	/* the kernel's: the long layers' triangle 2048 x 2049 / 2 = 2098176 keys, the short ones' band
	 * 1025 x 3072 / 2 = 1574400 (queries 0..1024 see t + 1 keys, the rest 1025), counted query by query */
	double keys_long = 0, keys_short = 0;
	for (int t = 0; t < 2048; t++)
		keys_long += t + 1, keys_short += (t < 1024 ? t : 1024) + 1;
	CHECK_FEQ(keys_long, 2098176.0);
	CHECK_FEQ(keys_short, 1574400.0);
	CHECK_FEQ(loom_model_flops_per_token(&c, 2048), 6 * mat + 12.0 * 10 * 128 * (5 * keys_long + 15 * keys_short) / 2048);
	CHECK_FEQ(loom_model_flops_per_token(&c, 2048), 6 * mat + 255801600.0); /* against the nominal 393216000 */
	CHECK_FEQ(loom_model_flops_per_token(&c, 512), 6 * mat + 12.0 * 10 * 128 * 20 * 513 / 2);
	CHECK_OK(loom_nanochat_depth_config(3, 64, 128, 256, 1000, &c)); /* 192 rounds up to 256 */
	CHECK_EQ(c.n_embd, 256); CHECK_EQ(c.n_head, 2);
	CHECK_OK(loom_nanochat_depth_config(12, 64, 128, 256, 1000, &c));
	CHECK_EQ(c.n_embd, 768); CHECK_EQ(c.n_head, 6);
	CHECK_OK(loom_nanochat_depth_config(3, 64, 64, 256, 1000, &c));
	CHECK_EQ(c.n_embd, 192); CHECK_EQ(c.n_head, 3);
	CHECK_ERR(loom_nanochat_depth_config(0, 64, 128, 256, 1000, &c), LOOM_EINVAL);
	CHECK_ERR(loom_nanochat_depth_config(4, 64, 127, 256, 1000, &c), LOOM_EINVAL);
	return 0;
}

static void moments(const float *p, size_t n, double *mean, double *std, double *amax)
{
	double s = 0, s2 = 0, mx = 0;
	for (size_t i = 0; i < n; i++)
		s += p[i], s2 += (double)p[i] * p[i], mx = fmax(mx, fabs(p[i]));
	*mean = s / n, *std = sqrt(s2 / n - *mean * *mean), *amax = mx;
}

TEST(nanochat_init_values)
{
	loom_model_config_t c = small_cfg(), c4 = small_cfg();
	c4.n_layer = 4;
	loom_model_t *m = NULL, *m2 = NULL, *m4 = NULL;
	loom_model_opts_t o = {.B = 1, .T = 4};
	int n;
	CHECK_OK(loom_model_create(&m, &c, &o));
	CHECK_OK(loom_model_create(&m2, &c, &o));
	CHECK_OK(loom_model_create(&m4, &c4, &o));
	loom_model_init(m, 42);
	loom_model_init(m2, 42);
	loom_model_init(m4, 42);
	size_t np = loom_model_param_count(m);
	CHECK(memcmp(loom_model_params(m), loom_model_params(m2), np * sizeof(float)) == 0);
	/* wte is tensor 0 in both: its draws do not depend on the rest of the model */
	CHECK(memcmp(loom_model_params(m), loom_model_params(m4), 64 * 64 * sizeof(float)) == 0);
	loom_model_init(m2, 43);
	CHECK(memcmp(loom_model_params(m), loom_model_params(m2), np * sizeof(float)) != 0);
	const loom_tensor_info_t *tt = loom_model_tensors(m, &n);
	double s = sqrt(3.0 / 64);
	for (int i = 0; i < n; i++) {
		const float *p = loom_model_tensor_param(m, i);
		const char *nm = tt[i].name;
		double mean, std, amax;
		if (strcmp(nm, "resid_lambdas") == 0 || strcmp(nm, "x0_lambdas") == 0) {
			for (size_t k = 0; k < tt[i].numel; k++)
				CHECK_FEQ(p[k], nm[0] == 'r' ? 1.0f : 0.1f);
			continue;
		}
		if (strstr(nm, "c_proj") || strstr(nm, "ve_gate")) {
			for (size_t k = 0; k < tt[i].numel; k++)
				CHECK_FEQ(p[k], 0.0f);
			continue;
		}
		size_t real = tt[i].numel;
		if (tt[i].shape[0] == 64 && (i == 0 || i == n - 1 || strncmp(nm, "value_embeds", 12) == 0)) {
			real = 61 * tt[i].shape[1]; /* vocabulary padding rows 61..63 are zero */
			for (size_t k = real; k < tt[i].numel; k++)
				CHECK_FEQ(p[k], 0.0f);
		}
		moments(p, real, &mean, &std, &amax);
		double want = i == 0 ? 1.0 : i == n - 1 ? 0.001 : s / sqrt(3.0);
		CHECK_MSG(fabs(std / want - 1) < 0.06 && fabs(mean) < 5 * want / sqrt((double)real),
		          "%s: mean %.4g std %.4g (want 0, %.4g)", nm, mean, std, want);
		if (i != 0 && i != n - 1) /* uniform in [-s, s), reaching close to its ends */
			CHECK_MSG(amax < s && amax > 0.97 * s, "%s: max |w| %.6g, bound %.6g", nm, amax, s);
	}
	loom_model_destroy(m), loom_model_destroy(m2), loom_model_destroy(m4);
	return 0;
}

/* ---- sampling, activation checkpointing, bf16 ----------------------------------------------------------- */

/* The KV cache's logits at every generated position equal a full forward's over the context there,
 * the short windows included (positions past 8 attend over a window); greedy tokens are the argmax;
 * sampling is reproducible and its errors are clear (family_check.c). */
TEST(nanochat_generate_kv_cache_matches_forward)
{
	loom_model_config_t c = small_cfg();
	return fc_generate_matches_forward(&c, test_params, 2e-5f, 0);
}

/* blocks and selective checkpointing: losses and gradients bit-identical to none (whole passes and
 * units on two arenas), one recompute per block backward, fewer bytes kept. */
TEST(nanochat_act_ckpt_bit_identical)
{
	loom_model_config_t c = small_cfg(); /* the stream is [x | x0]: 2 C per position */
	return fc_act_ckpt_bit_identical(&c, test_params);
}

/* bf16 matmuls (loom's bf16 GEMM path): the loss and gradients near fp32's (family_check.c). */
TEST(nanochat_bf16_close_to_fp32)
{
	loom_model_config_t c = small_cfg();
	return fc_bf16_close_to_fp32(&c, test_params);
}

/* ---- tensor parallelism: two ranks as two threads of this process -------------------------------------- */

/* Split by kv-head groups (rank r: kv head r, query heads 2r, 2r+1), MLP columns, vocabulary rows:
 * the loss and every gradient (the ranks' shards put back together) equal one process's within 1e-5;
 * a shard's init is the whole model's at its positions; blocks checkpointing changes no bit. */
TEST(nanochat_tp2_matches_one_process)
{
	loom_model_config_t c = small_cfg();
	loom_tensor_info_t si;
	CHECK_OK(loom_model_tp_check(&c, 2));
	CHECK_ERR(loom_model_tp_check(&c, 4), LOOM_EINVAL); /* 2 kv heads */
	CHECK_CONTAINS(loom_errmsg(), "n_kv_head 2 is not divisible by tp 4");
	CHECK_EQ(2 * loom_model_shard_params(&c, 2), loom_model_num_params(&c) + 2 * 3); /* all split but 2 x L scalars */
	CHECK_OK(loom_model_shard_info(&c, 2, 3, &si)); /* value_embeds.0: kv head r's 16 columns */
	CHECK_EQ(si.shape[0], 64); CHECK_EQ(si.shape[1], 16);
	CHECK_OK(loom_model_shard_info(&c, 2, 4, &si)); /* its gate: kv head r's row */
	CHECK_EQ(si.shape[0], 1); CHECK_EQ(si.shape[1], 32);
	return fc_tp2_matches_one_process(&c, test_params, 0);
}

/* Every allocation of create and of the KV cache failing in turn (family_check.c). */
TEST(nanochat_alloc_failures_clean)
{
	loom_model_config_t c = small_cfg();
	return fc_alloc_failures_clean(&c);
}

/* ZeRO-3's use of the hooks (family_check.c): the embedding unit (wte and the scalars every block reads)
 * stays pointed at the master copy. */
TEST(nanochat_param_use_hook_gathers_units)
{
	loom_model_config_t c = small_cfg();
	return fc_param_use_gathers_units(&c, test_params);
}
