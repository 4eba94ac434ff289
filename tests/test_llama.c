/* test_llama.c: the Llama / Qwen2 family (src/model/llama/): configuration checks, the parameter
 * table in transformers' names and shapes, FLOPs, tensor-parallel shards. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/model.h"
#include "model/llama/llama_model.h"
#include "test.h"

/* SmolLM2-shaped and tiny: tied embeddings, GQA 4:2, head_dim 16 != 48 / 4, rope_theta 1e5, eps 1e-5. */
static loom_model_config_t smol_cfg(void)
{
	loom_model_config_t c = {.n_layer = 2, .n_head = 4, .n_embd = 48, .seq_len = 16, .vocab_size = 96,
	                         .arch = LOOM_ARCH_LLAMA, .n_kv_head = 2, .head_dim = 16, .intermediate_size = 64,
	                         .rope_theta = 1e5, .rms_norm_eps = 1e-5, .tie_word_embeddings = 1};
	return c;
}

TEST(llama_config_checks)
{
	loom_model_config_t c = smol_cfg(), b;
	loom_arch_t a;
	CHECK_OK(loom_arch_parse("llama", &a));
	CHECK_EQ(a, LOOM_ARCH_LLAMA);
	CHECK_STREQ(loom_arch_name(LOOM_ARCH_LLAMA), "llama");
	CHECK_ERR(loom_arch_parse("mistral", &a), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "not one of gpt2, nanochat, llama");
	CHECK_OK(loom_model_config_check(&c));
	b = c, b.n_kv_head = 3;
	CHECK_ERR(loom_model_config_check(&b), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "num_attention_heads 4 is not divisible by num_key_value_heads 3");
	b = c, b.head_dim = 0, b.n_embd = 50;
	CHECK_ERR(loom_model_config_check(&b), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "hidden_size 50 is not divisible by num_attention_heads 4 (give head_dim)");
	b = c, b.head_dim = 7;
	CHECK_ERR(loom_model_config_check(&b), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "head_dim 7 must be positive and even");
	b = c, b.rope_theta = -1;
	CHECK_ERR(loom_model_config_check(&b), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "rope_theta -1 must be positive");
	b = c, b.rms_norm_eps = -1e-5;
	CHECK_ERR(loom_model_config_check(&b), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "rms_norm_eps");
	b = c, b.short_window = 4;
	CHECK_ERR(loom_model_config_check(&b), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "are nanochat's");
	b = c, b.rope_scaling.type = LOOM_ROPE_LLAMA3, b.rope_scaling.factor = 8, b.rope_scaling.low_freq_factor = 4,
	b.rope_scaling.high_freq_factor = 1, b.rope_scaling.original_max_position_embeddings = 8;
	CHECK_ERR(loom_model_config_check(&b), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "rope_scaling llama3 with factor 8, low_freq_factor 4, high_freq_factor 1");
	b = c, b.n_layer = 0;
	CHECK_ERR(loom_model_config_check(&b), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "num_hidden_layers 0");
	/* defaults: head_dim C / NH, intermediate 8C/3 rounded up to 256, theta 1e4, eps 1e-6, kv = heads */
	loom_model_config_t d = {.n_layer = 1, .n_head = 32, .n_embd = 4096, .seq_len = 8, .vocab_size = 8,
	                         .arch = LOOM_ARCH_LLAMA}, e;
	loom__ll_normalize(&d, &e);
	CHECK_EQ(e.head_dim, 128); CHECK_EQ(e.intermediate_size, 11008); CHECK_EQ(e.n_kv_head, 32);
	CHECK_FEQ(e.rope_theta, 10000.0); CHECK_FEQ(e.rms_norm_eps, 1e-6);
	/* equality counts defaults and the llama fields */
	b = c, b.intermediate_size = 0;
	CHECK(!loom_model_config_equal(&b, &c));
	b = c, b.head_dim = 0, b.n_embd = 64;
	loom_model_config_t b2 = b;
	b2.head_dim = 16;
	CHECK(loom_model_config_equal(&b, &b2));
	b2.qkv_bias = 1;
	CHECK(!loom_model_config_equal(&b, &b2));
	/* tensor parallelism by kv-head groups */
	CHECK_OK(loom_model_tp_check(&c, 2));
	CHECK_ERR(loom_model_tp_check(&c, 4), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "num_key_value_heads 2 is not divisible by tp 4");
	return 0;
}

/* The table: transformers' names and [out, in] shapes, biases as configured, units, groups, decay,
 * splits; offsets contiguous; the parameter count by hand. */
TEST(llama_tensor_table)
{
	loom_model_config_t c = smol_cfg();
	loom_tensor_info_t t;
	int n = loom_model_num_tensors(&c);
	CHECK_EQ(n, 1 + 2 * 9 + 1); /* tied: no lm_head */
	CHECK_OK(loom_model_tensor_info(&c, 0, &t));
	CHECK_STREQ(t.name, "model.embed_tokens.weight");
	CHECK_EQ(t.shape[0], 96); CHECK_EQ(t.shape[1], 48); CHECK_EQ(t.layer, -1); CHECK_EQ(t.head_reads, 1);
	CHECK_EQ(t.decay, 1); CHECK_EQ(t.tp_dim, 0); CHECK_EQ(t.opt_group, LOOM_OPT_VECTOR);
	const char *blk[9] = {"input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
	                      "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
	                      "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"};
	size_t shp[9][2] = {{48, 0}, {64, 48}, {32, 48}, {32, 48}, {48, 64}, {48, 0}, {64, 48}, {64, 48}, {48, 64}};
	int tpd[9] = {-1, 0, 0, 0, 1, -1, 0, 0, 1};
	size_t off = 96 * 48;
	for (int l = 0; l < 2; l++)
		for (int j = 0; j < 9; j++) {
			char name[64];
			snprintf(name, sizeof name, "model.layers.%d.%s", l, blk[j]);
			CHECK_OK(loom_model_tensor_info(&c, 1 + 9 * l + j, &t));
			CHECK_STREQ(t.name, name);
			CHECK_EQ(t.layer, l); CHECK_EQ(t.offset, off); CHECK_EQ(t.tp_dim, tpd[j]);
			CHECK_EQ(t.shape[0], shp[j][0]); CHECK_EQ(t.ndim, shp[j][1] ? 2 : 1);
			if (shp[j][1]) {
				CHECK_EQ(t.shape[1], shp[j][1]); CHECK_EQ(t.decay, 1); CHECK_EQ(t.opt_group, LOOM_OPT_MATRIX);
				CHECK_EQ(t.rows, (int)shp[j][0]); CHECK_EQ(t.cols, (int)shp[j][1]);
			} else {
				CHECK_EQ(t.decay, 0); CHECK_EQ(t.opt_group, LOOM_OPT_VECTOR); CHECK_EQ(t.all_blocks, 0);
			}
			off += t.numel;
		}
	CHECK_OK(loom_model_tensor_info(&c, n - 1, &t));
	CHECK_STREQ(t.name, "model.norm.weight");
	CHECK_EQ(t.layer, 2); CHECK_EQ(t.offset, off); CHECK_EQ(t.decay, 0);
	size_t block = 48 + 64 * 48 + 2 * 32 * 48 + 48 * 64 + 48 + 3 * 64 * 48;
	CHECK_EQ(loom_model_num_params(&c), 96 * 48 + 2 * block + 48);
	/* untied, with Llama's attention_bias and mlp_bias */
	c.tie_word_embeddings = 0, c.attention_bias = 1, c.mlp_bias = 1;
	n = loom_model_num_tensors(&c);
	CHECK_EQ(n, 1 + 2 * 16 + 2);
	CHECK_OK(loom_model_tensor_info(&c, 0, &t));
	CHECK_EQ(t.head_reads, 0); CHECK_EQ(t.opt_group, LOOM_OPT_EMBED);
	CHECK_EQ(loom_model_tensor_index(&c, "model.layers.1.self_attn.o_proj.bias"), 1 + 16 + 8);
	CHECK_OK(loom_model_tensor_info(&c, 1 + 16 + 8, &t));
	CHECK_EQ(t.tp_dim, -1); CHECK_EQ(t.decay, 0); CHECK_EQ(t.numel, 48);
	CHECK_OK(loom_model_tensor_info(&c, loom_model_tensor_index(&c, "model.layers.0.self_attn.k_proj.bias"), &t));
	CHECK_EQ(t.tp_dim, 0); CHECK_EQ(t.numel, 32);
	CHECK_OK(loom_model_tensor_info(&c, loom_model_tensor_index(&c, "model.layers.0.mlp.up_proj.bias"), &t));
	CHECK_EQ(t.tp_dim, 0); CHECK_EQ(t.numel, 64);
	CHECK_OK(loom_model_tensor_info(&c, loom_model_tensor_index(&c, "model.layers.0.mlp.down_proj.bias"), &t));
	CHECK_EQ(t.tp_dim, -1);
	CHECK_OK(loom_model_tensor_info(&c, n - 1, &t));
	CHECK_STREQ(t.name, "lm_head.weight");
	CHECK_EQ(t.layer, 2); CHECK_EQ(t.opt_group, LOOM_OPT_UNEMBED); CHECK_EQ(t.tp_dim, 0);
	CHECK_EQ(t.offset + t.numel, loom_model_num_params(&c));
	int first, end;
	loom_model_unit_tensors(&c, 2, &first, &end);
	CHECK_EQ(first, n - 2); CHECK_EQ(end, n);
	/* Qwen2: biases on q, k, v only */
	c.attention_bias = 0, c.mlp_bias = 0, c.qkv_bias = 1;
	CHECK_EQ(loom_model_num_tensors(&c), 1 + 2 * 12 + 2);
	CHECK_EQ(loom_model_tensor_index(&c, "model.layers.0.self_attn.o_proj.bias"), -1);
	CHECK(loom_model_tensor_index(&c, "model.layers.0.self_attn.v_proj.bias") > 0);
	return 0;
}

/* FLOPs: 6 x the matmul parameters (the lm head's V C counted once, tied or not; the embedding's lookup
 * none) plus the causal attention's 12 NH D keys / T per block. */
TEST(llama_flops)
{
	loom_model_config_t c = smol_cfg();
	double block = 64 * 48 + 2 * 32 * 48 + 48 * 64 + 3 * 64 * 48;
	double att = 12.0 * 64 * 136 / 16; /* 1 + ... + 16 keys over 16 queries */
	CHECK_FEQ(loom_model_flops_per_token(&c, 16), 6.0 * (2 * block + 96 * 48) + 2 * att);
	CHECK_FEQ(loom_model_block_attn_flops(&c, 1, 16), att);
	CHECK_FEQ(loom_model_unit_flops(&c, -1, 16), 0.0);
	CHECK_FEQ(loom_model_unit_flops(&c, 0, 16), 6.0 * block + att);
	CHECK_FEQ(loom_model_unit_flops(&c, 2, 16), 6.0 * 96 * 48);
	c.tie_word_embeddings = 0;
	CHECK_FEQ(loom_model_flops_per_token(&c, 16), 6.0 * (2 * block + 96 * 48) + 2 * att);
	return 0;
}

/* tp shards: q/k/v/gate/up by rows (and their biases), o/down by columns, the embedding by vocabulary
 * rows, norms and o/down biases whole; shard then unshard gives back every value. */
TEST(llama_tp_shards)
{
	loom_model_config_t c = smol_cfg();
	c.tie_word_embeddings = 0, c.attention_bias = 1, c.mlp_bias = 1;
	size_t n = loom_model_num_params(&c), s = loom_model_shard_params(&c, 2);
	float *full = malloc(n * sizeof(float)), *back = calloc(n, sizeof(float)), *sh = malloc(s * sizeof(float));
	CHECK(full && back && sh);
	for (size_t i = 0; i < n; i++)
		full[i] = (float)i;
	loom_tensor_info_t f, t;
	int k = loom_model_tensor_index(&c, "model.layers.0.self_attn.k_proj.weight");
	int o = loom_model_tensor_index(&c, "model.layers.0.self_attn.o_proj.weight");
	int kb = loom_model_tensor_index(&c, "model.layers.0.self_attn.k_proj.bias");
	int ob = loom_model_tensor_index(&c, "model.layers.0.self_attn.o_proj.bias");
	for (int r = 0; r < 2; r++) {
		loom_model_tp_shard(&c, 2, r, full, sh);
		/* k: rows [16 r, 16 r + 16) of [32, 48] */
		loom_model_tensor_info(&c, k, &f), loom_model_shard_info(&c, 2, k, &t);
		CHECK_EQ(t.shape[0], 16); CHECK_EQ(t.shape[1], 48);
		CHECK_FEQ(sh[t.offset + 48 + 1], full[f.offset + (16 * r + 1) * 48 + 1]);
		/* o: columns [32 r, 32 r + 32) of [48, 64] */
		loom_model_tensor_info(&c, o, &f), loom_model_shard_info(&c, 2, o, &t);
		CHECK_EQ(t.shape[0], 48); CHECK_EQ(t.shape[1], 32);
		CHECK_FEQ(sh[t.offset + 2 * 32 + 3], full[f.offset + 2 * 64 + 32 * r + 3]);
		/* k's bias: [16 r, 16 r + 16); o's bias whole */
		loom_model_tensor_info(&c, kb, &f), loom_model_shard_info(&c, 2, kb, &t);
		CHECK_EQ(t.numel, 16);
		CHECK_FEQ(sh[t.offset + 5], full[f.offset + 16 * r + 5]);
		loom_model_tensor_info(&c, ob, &f), loom_model_shard_info(&c, 2, ob, &t);
		CHECK_EQ(t.numel, 48);
		CHECK_FEQ(sh[t.offset + 47], full[f.offset + 47]);
		loom_model_tp_unshard(&c, 2, r, sh, back);
	}
	for (size_t i = 0; i < n; i++)
		CHECK_FEQ(back[i], full[i]);
	free(full), free(back), free(sh);
	return 0;
}

/* The rotary frequencies: theta^(-2i/D), and llama3's scaling (transformers' _compute_llama3_parameters:
 * wavelengths below original / high kept, above original / low divided by factor, blended between). */
TEST(llama_rope_frequencies)
{
	loom_model_config_t c = smol_cfg();
	double f[8];
	loom__ll_inv_freq(&c, f);
	for (int i = 0; i < 8; i++)
		CHECK_NEAR(f[i], pow(1e5, -(2.0 * i) / 16.0), 1e-15);
	c.rope_scaling.type = LOOM_ROPE_LLAMA3, c.rope_scaling.factor = 8, c.rope_scaling.low_freq_factor = 1;
	c.rope_scaling.high_freq_factor = 4, c.rope_scaling.original_max_position_embeddings = 64;
	loom__ll_inv_freq(&c, f);
	/* wavelengths 2 pi / f: low wavelength 64, high 16 */
	for (int i = 0; i < 8; i++) {
		double f0 = pow(1e5, -(2.0 * i) / 16.0), wl = 2 * M_PI / f0, want;
		if (wl < 16)
			want = f0;
		else if (wl > 64)
			want = f0 / 8;
		else {
			double s = (64 / wl - 1) / 3;
			want = (1 - s) * f0 / 8 + s * f0;
		}
		CHECK_NEAR(f[i], want, 1e-15);
	}
	CHECK_FEQ(f[0], 1.0);          /* wavelength 2 pi: kept */
	CHECK_NEAR(f[7], pow(1e5, -14.0 / 16) / 8, 1e-18); /* the longest: divided */
	return 0;
}
