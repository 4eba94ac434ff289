/* test_hfdir.c: Hugging Face directories of the llama family (src/ckpt/hf_config.c, hf_dir.c):
 * config.json in both rope layouts and every refusal, single and sharded directories in F32, BF16 and
 * F16 read back exactly, what loom writes checked by an independent Python reader
 * (tests/ref/hf_dir_ref.py), a directory written by Python loaded with the same values, refusals of
 * malformed directories, that loading streams (no allocation as large as a tensor), and that the
 * load's threads write every parameter exactly. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/model_internal.h"
#include "core/util.h"
#include "loom/ckpt.h"
#include "loom/gpt2.h"
#include "loom/model.h"
#include "test.h"

/* SmolLM2-shaped, tiny: tied, GQA 4:2, head_dim 8 != 32 / 4... (given), theta 1e5, eps 1e-5. */
static loom_model_config_t smol(void)
{
	loom_model_config_t c = {.n_layer = 2, .n_head = 4, .n_embd = 32, .seq_len = 16, .vocab_size = 40,
	                         .arch = LOOM_ARCH_LLAMA, .n_kv_head = 2, .head_dim = 16, .intermediate_size = 24,
	                         .rope_theta = 1e5, .rms_norm_eps = 1e-5, .tie_word_embeddings = 1,
	                         .has_token_ids = 1, .bos_token_id = 1, .eos_token_id = 2};
	return c;
}

/* Untied, llama3 rope scaling, biases on attention (q, k, v, o) and MLP. */
static loom_model_config_t llama3_biased(void)
{
	loom_model_config_t c = smol();
	c.tie_word_embeddings = 0, c.attention_bias = 1, c.mlp_bias = 1, c.head_dim = 0, c.rope_theta = 500000;
	c.rope_scaling = (loom_rope_scaling_t){LOOM_ROPE_LLAMA3, 8, 1, 4, 8};
	return c;
}

static loom_model_config_t qwen2(void)
{
	loom_model_config_t c = smol();
	c.qwen2 = 1, c.qkv_bias = 1, c.tie_word_embeddings = 0, c.head_dim = 0, c.rms_norm_eps = 1e-6;
	return c;
}

static float *rand_params(const loom_model_config_t *c, uint32_t seed)
{
	size_t n = loom_model_num_params(c);
	float *p = malloc(n * sizeof *p);
	for (size_t i = 0; i < n; i++) {
		seed = seed * 1664525u + 1013904223u;
		p[i] = ((float)(seed >> 8) / (float)(1u << 24) - 0.5f) * 0.3f;
	}
	return p;
}

/* bf16 rounding to nearest even, computed another way than the writer's (in double, by comparing the
 * two neighbours). */
static float bf16_round(float x)
{
	uint32_t u, lo, hi;
	float a, b;
	memcpy(&u, &x, 4);
	lo = u & 0xffff0000u, hi = lo + 0x10000u;
	memcpy(&a, &lo, 4), memcpy(&b, &hi, 4);
	double da = fabs((double)x - a), db = fabs((double)x - b);
	if (da < db || (da == db && !(lo & 0x10000u)))
		return a;
	return b;
}

static int file_exists(const char *dir, const char *name)
{
	char p[1024];
	struct stat sb;
	snprintf(p, sizeof p, "%s/%s", dir, name);
	return stat(p, &sb) == 0;
}

/* ---- config.json --------------------------------------------------------------------------------- */

/* Llama 3.2 1B's config.json as transformers 4 writes it (eos a list), trimmed of nothing. */
static const char *llama32 =
	"{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0,"
	" \"bos_token_id\": 128000, \"eos_token_id\": [128001, 128008, 128009], \"head_dim\": 64,"
	" \"hidden_act\": \"silu\", \"hidden_size\": 2048, \"initializer_range\": 0.02, \"intermediate_size\": 8192,"
	" \"max_position_embeddings\": 131072, \"mlp_bias\": false, \"model_type\": \"llama\","
	" \"num_attention_heads\": 32, \"num_hidden_layers\": 16, \"num_key_value_heads\": 8, \"pretraining_tp\": 1,"
	" \"rms_norm_eps\": 1e-05, \"rope_scaling\": {\"factor\": 32.0, \"high_freq_factor\": 4.0,"
	" \"low_freq_factor\": 1.0, \"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"},"
	" \"rope_theta\": 500000.0, \"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\","
	" \"transformers_version\": \"4.45.0.dev0\", \"use_cache\": true, \"vocab_size\": 128256}";

/* The same model as transformers 5 writes it: rope_parameters, "dtype". */
static const char *llama32_v5 =
	"{\"architectures\": [\"LlamaForCausalLM\"], \"bos_token_id\": 128000, \"eos_token_id\": 128001,"
	" \"head_dim\": 64, \"hidden_size\": 2048, \"intermediate_size\": 8192, \"max_position_embeddings\": 131072,"
	" \"model_type\": \"llama\", \"num_attention_heads\": 32, \"num_hidden_layers\": 16, \"num_key_value_heads\": 8,"
	" \"rms_norm_eps\": 1e-05, \"rope_parameters\": {\"rope_type\": \"llama3\", \"rope_theta\": 500000.0,"
	" \"factor\": 32.0, \"high_freq_factor\": 4.0, \"low_freq_factor\": 1.0,"
	" \"original_max_position_embeddings\": 8192}, \"tie_word_embeddings\": true, \"dtype\": \"bfloat16\","
	" \"vocab_size\": 128256}";

/* Qwen2.5 0.5B's. */
static const char *qwen25 =
	"{\"architectures\": [\"Qwen2ForCausalLM\"], \"attention_dropout\": 0.0, \"bos_token_id\": 151643,"
	" \"eos_token_id\": 151643, \"hidden_act\": \"silu\", \"hidden_size\": 896, \"initializer_range\": 0.02,"
	" \"intermediate_size\": 4864, \"max_position_embeddings\": 32768, \"max_window_layers\": 24,"
	" \"model_type\": \"qwen2\", \"num_attention_heads\": 14, \"num_hidden_layers\": 24, \"num_key_value_heads\": 2,"
	" \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0, \"sliding_window\": 32768, \"tie_word_embeddings\": true,"
	" \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.43.1\", \"use_cache\": true,"
	" \"use_sliding_window\": false, \"vocab_size\": 151936}";

TEST(hfdir_config_layouts)
{
	loom_model_config_t a, b, q, back;
	loom_hf_info_t ia, ib, iq;
	char dir[256], path[512];
	CHECK_OK(loom_hf_config_parse(llama32, strlen(llama32), "a/config.json", &a, &ia));
	CHECK_EQ(a.arch, LOOM_ARCH_LLAMA);
	CHECK_EQ(a.n_layer, 16); CHECK_EQ(a.n_head, 32); CHECK_EQ(a.n_kv_head, 8); CHECK_EQ(a.n_embd, 2048);
	CHECK_EQ(a.head_dim, 64); CHECK_EQ(a.intermediate_size, 8192); CHECK_EQ(a.seq_len, 131072);
	CHECK_EQ(a.vocab_size, 128256); CHECK_FEQ(a.rms_norm_eps, 1e-5); CHECK_FEQ(a.rope_theta, 500000.0);
	CHECK_EQ(a.rope_scaling.type, LOOM_ROPE_LLAMA3); CHECK_FEQ(a.rope_scaling.factor, 32.0);
	CHECK_FEQ(a.rope_scaling.low_freq_factor, 1.0); CHECK_FEQ(a.rope_scaling.high_freq_factor, 4.0);
	CHECK_EQ(a.rope_scaling.original_max_position_embeddings, 8192);
	CHECK_EQ(a.tie_word_embeddings, 1); CHECK_EQ(a.attention_bias, 0); CHECK_EQ(a.mlp_bias, 0);
	CHECK_EQ(a.qwen2, 0); CHECK_EQ(a.qkv_bias, 0);
	CHECK_EQ(a.has_token_ids, 1); CHECK_EQ(a.bos_token_id, 128000); CHECK_EQ(a.eos_token_id, 128001); /* first */
	CHECK_STREQ(ia.model_type, "llama"); CHECK_STREQ(ia.torch_dtype, "bfloat16"); CHECK_EQ(ia.rope_parameters, 0);
	CHECK_OK(loom_model_config_check(&a));
	CHECK_EQ(loom_model_num_params(&a), 1235814400); /* Llama 3.2 1B: 1.24B with the tied head */
	CHECK_OK(loom_hf_config_parse(llama32_v5, strlen(llama32_v5), "b/config.json", &b, &ib));
	CHECK(loom_model_config_equal(&a, &b));
	CHECK_EQ(b.eos_token_id, 128001);
	CHECK_EQ(ib.rope_parameters, 1); CHECK_STREQ(ib.torch_dtype, "bfloat16");
	CHECK_OK(loom_hf_config_parse(qwen25, strlen(qwen25), "q/config.json", &q, &iq));
	CHECK_EQ(q.qwen2, 1); CHECK_EQ(q.qkv_bias, 1); CHECK_EQ(q.attention_bias, 0); CHECK_EQ(q.head_dim, 0);
	CHECK_EQ(q.n_kv_head, 2); CHECK_FEQ(q.rope_theta, 1e6); CHECK_EQ(q.rope_scaling.type, LOOM_ROPE_DEFAULT);
	CHECK_EQ(q.tie_word_embeddings, 1); CHECK_STREQ(iq.model_type, "qwen2");
	CHECK_EQ(loom_model_num_params(&q), 494032768); /* Qwen2.5 0.5B */
	/* written and read back: the same model, the same ids */
	CHECK(test_mkdtemp(dir, sizeof dir) == 0);
	snprintf(path, sizeof path, "%s/config.json", dir);
	const loom_model_config_t *all[3] = {&a, &q, NULL};
	loom_model_config_t l3 = llama3_biased();
	all[2] = &l3;
	for (int i = 0; i < 3; i++) {
		CHECK_OK(loom_hf_config_write(path, all[i], "bfloat16", -1));
		CHECK_OK(loom_hf_config_read(path, &back, &ia));
		CHECK_MSG(loom_model_config_equal(all[i], &back), "config %d changed in a round trip", i);
		CHECK_EQ(back.bos_token_id, all[i]->bos_token_id);
		CHECK_EQ(back.eos_token_id, all[i]->eos_token_id);
		CHECK_STREQ(ia.torch_dtype, "bfloat16");
	}
	/* the text for the SmolLM2-shaped one, exactly (transformers' keys, sorted; Python's float repr) */
	loom_model_config_t s = smol();
	char text[4096];
	CHECK_OK(loom_hf_config_write(path, &s, "float32", -1));
	test_read_text(path, text, sizeof text);
	CHECK_STREQ(text, "{\n  \"architectures\": [\n    \"LlamaForCausalLM\"\n  ],\n  \"attention_bias\": false,\n"
	                  "  \"attention_dropout\": 0.0,\n  \"bos_token_id\": 1,\n  \"eos_token_id\": 2,\n"
	                  "  \"head_dim\": 16,\n  \"hidden_act\": \"silu\",\n  \"hidden_size\": 32,\n"
	                  "  \"initializer_range\": 0.02,\n  \"intermediate_size\": 24,\n"
	                  "  \"max_position_embeddings\": 16,\n  \"mlp_bias\": false,\n  \"model_type\": \"llama\",\n"
	                  "  \"num_attention_heads\": 4,\n  \"num_hidden_layers\": 2,\n  \"num_key_value_heads\": 2,\n"
	                  "  \"pretraining_tp\": 1,\n  \"rms_norm_eps\": 1e-05,\n  \"rope_scaling\": null,\n"
	                  "  \"rope_theta\": 100000.0,\n  \"tie_word_embeddings\": true,\n  \"torch_dtype\": \"float32\",\n"
	                  "  \"use_cache\": true,\n  \"vocab_size\": 40\n}\n");
	/* no token ids: eot (default vocab - 1) for both */
	s.has_token_ids = 0;
	CHECK_OK(loom_hf_config_write(path, &s, "float32", 7));
	CHECK_OK(loom_hf_config_read(path, &back, NULL));
	CHECK_EQ(back.bos_token_id, 7); CHECK_EQ(back.eos_token_id, 7);
	CHECK_ERR(loom_hf_config_write(path, &s, "float32", 40), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "end-of-text token 40 outside the vocabulary of 40");
	/* what the classes cannot say */
	s = qwen2(), s.mlp_bias = 1;
	CHECK_ERR(loom_hf_config_write(path, &s, "float32", -1), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "Qwen2's config cannot express mlp_bias");
	s = smol(), s.qkv_bias = 1;
	CHECK_ERR(loom_hf_config_write(path, &s, "float32", -1), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "Llama's config cannot express biases on q, k and v only");
	test_rmdir(dir);
	return 0;
}

/* base with `key` replaced by (or, absent, given) `value` (NULL: removed). */
static void edit(char *out, size_t cap, const char *base, const char *key, const char *value)
{
	char pat[128];
	const char *p;
	snprintf(pat, sizeof pat, "\"%s\": ", key);
	p = strstr(base, pat);
	if (!p) {
		snprintf(out, cap, "{\"%s\": %s, %s", key, value, base + 1);
		return;
	}
	const char *v = p + strlen(pat), *e = v;
	int depth = 0;
	for (; *e; e++) { /* the value's end: a comma or brace at depth 0 */
		if (*e == '[' || *e == '{')
			depth++;
		else if ((*e == ']' || *e == '}') && depth > 0)
			depth--;
		else if ((*e == ',' || *e == '}') && depth == 0)
			break;
	}
	if (value)
		snprintf(out, cap, "%.*s%s%s", (int)(v - base), base, value, e);
	else /* drop `"key": value, ` */
		snprintf(out, cap, "%.*s%s", (int)(p - base), base, *e == ',' ? e + 2 : e);
}

TEST(hfdir_config_refusals)
{
	static const struct {
		const char *key, *value; /* on Llama 3.2's config (NULL value: removed) */
		int qwen;                /* on Qwen2.5's instead */
		int code;
		const char *msg;
	} cases[] = {
		{"model_type", "\"mistral\"", 0, LOOM_ENOTSUP, "c.json: \"model_type\" \"mistral\" is not a model loom reads (llama, qwen2)"},
		{"model_type", NULL, 0, LOOM_EFORMAT, "c.json: no \"model_type\" string"},
		{"architectures", "[\"LlamaForSequenceClassification\"]", 0, LOOM_ENOTSUP, "c.json: \"architectures\" names \"LlamaForSequenceClassification\"; loom reads LlamaForCausalLM"},
		{"architectures", "[\"LlamaForCausalLM\"]", 1, LOOM_ENOTSUP, "names \"LlamaForCausalLM\"; loom reads Qwen2ForCausalLM (a causal language model) for model_type \"qwen2\""},
		{"hidden_act", "\"gelu\"", 0, LOOM_ENOTSUP, "c.json: \"hidden_act\" \"gelu\" is not implemented by loom (its SwiGLU MLP is \"silu\")"},
		{"rope_scaling", "{\"rope_type\": \"yarn\", \"factor\": 4.0}", 0, LOOM_ENOTSUP, "c.json: \"rope_scaling.rope_type\" \"yarn\" is not implemented by loom (default, llama3)"},
		{"rope_scaling", "{\"type\": \"dynamic\", \"factor\": 2.0}", 0, LOOM_ENOTSUP, "\"rope_scaling.rope_type\" \"dynamic\" is not implemented"},
		{"rope_scaling", "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0}", 0, LOOM_EFORMAT, "c.json: no \"rope_scaling.original_max_position_embeddings\" (an integer is required)"},
		{"rope_scaling", "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 4.0, \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}", 0, LOOM_EFORMAT, "\"rope_scaling.high_freq_factor\" must exceed \"low_freq_factor\""},
		{"rope_scaling", "{\"rope_type\": \"llama3\", \"mrope_section\": [1]}", 0, LOOM_ENOTSUP, "c.json: \"rope_scaling.mrope_section\" is not implemented by loom"},
		{"rope_scaling", "\"llama3\"", 0, LOOM_EFORMAT, "c.json: \"rope_scaling\" is a string, expected an object or null"},
		{"rope_parameters", "{\"rope_type\": \"default\", \"rope_theta\": 10000.0}", 0, LOOM_EFORMAT, "c.json: \"rope_theta\" 500000 and \"rope_parameters.rope_theta\" 10000 disagree"},
		{"rope_parameters", "{\"rope_type\": \"linear\", \"rope_theta\": 500000.0, \"factor\": 2.0}", 0, LOOM_ENOTSUP, "\"rope_parameters.rope_type\" \"linear\" is not implemented by loom"},
		{"use_sliding_window", "true", 1, LOOM_ENOTSUP, "c.json: \"use_sliding_window\" is true: Qwen2's sliding-window attention is not implemented by loom"},
		{"layer_types", "[\"full_attention\", \"sliding_attention\"]", 1, LOOM_ENOTSUP, "c.json: \"layer_types\"[1] is not \"full_attention\""},
		{"attention_dropout", "0.1", 0, LOOM_ENOTSUP, "c.json: \"attention_dropout\" is not 0: dropout is not implemented by loom"},
		{"quantization_config", "{\"quant_method\": \"awq\"}", 0, LOOM_ENOTSUP, "c.json: \"quantization_config\": quantized weights are not implemented"},
		{"partial_rotary_factor", "0.5", 0, LOOM_ENOTSUP, "\"partial_rotary_factor\" is not 1"},
		{"hidden_size", NULL, 0, LOOM_EFORMAT, "c.json: no \"hidden_size\" (an integer is required)"},
		{"num_hidden_layers", "2.5", 0, LOOM_EFORMAT, "c.json: \"num_hidden_layers\" is 2.5, expected an integer"},
		{"num_attention_heads", "\"32\"", 0, LOOM_EFORMAT, "c.json: \"num_attention_heads\" is a string, expected an integer"},
		{"vocab_size", "0", 0, LOOM_EFORMAT, "c.json: \"vocab_size\" = 0 is outside [1, 16777216]"},
		{"num_key_value_heads", "5", 0, LOOM_EFORMAT, "c.json: \"num_attention_heads\" 32 is not a multiple of \"num_key_value_heads\" 5"},
		{"head_dim", "63", 0, LOOM_EFORMAT, "c.json: the head dimension 63 is odd"},
		{"rms_norm_eps", "-1e-5", 0, LOOM_EFORMAT, "c.json: \"rms_norm_eps\" = -1e-5, expected a positive number"},
		{"tie_word_embeddings", "1", 0, LOOM_EFORMAT, "c.json: \"tie_word_embeddings\" is a number, expected true or false"},
		{"bos_token_id", "128256", 0, LOOM_EFORMAT, "c.json: \"bos_token_id\" must be a token id in [0, 128256)"},
		{"eos_token_id", "[-1]", 0, LOOM_EFORMAT, "c.json: \"eos_token_id\" must be a token id"},
	};
	char text[4096];
	loom_model_config_t c;
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		edit(text, sizeof text, cases[i].qwen ? qwen25 : llama32, cases[i].key, cases[i].value);
		int rc = loom_hf_config_parse(text, strlen(text), "c.json", &c, NULL);
		CHECK_MSG(rc == cases[i].code, "case %zu (%s): rc %d, expected %d (%s)", i, cases[i].key, rc, cases[i].code,
		          rc ? loom_errmsg() : "accepted");
		CHECK_CONTAINS(loom_errmsg(), cases[i].msg);
	}
	/* malformed JSON and a non-object */
	CHECK_ERR(loom_hf_config_parse("{\"model_type\": ", 15, "c.json", &c, NULL), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "c.json: bad JSON");
	CHECK_ERR(loom_hf_config_parse("[1]", 3, "c.json", &c, NULL), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "c.json: a array, expected a JSON object");
	/* accepted variants: bos null with eos given (both eos), rope_scaling of type "default", no architectures */
	edit(text, sizeof text, llama32, "bos_token_id", "null");
	CHECK_OK(loom_hf_config_parse(text, strlen(text), "c.json", &c, NULL));
	CHECK_EQ(c.bos_token_id, 128001);
	edit(text, sizeof text, qwen25, "rope_scaling", "{\"type\": \"default\"}");
	CHECK_OK(loom_hf_config_parse(text, strlen(text), "c.json", &c, NULL));
	CHECK_EQ(c.rope_scaling.type, LOOM_ROPE_DEFAULT);
	edit(text, sizeof text, qwen25, "architectures", NULL);
	CHECK_OK(loom_hf_config_parse(text, strlen(text), "c.json", &c, NULL));
	return 0;
}

/* ---- directories ------------------------------------------------------------------------------------- */

/* Save cfg's params as a directory (dtype, shard size), load it back through every entry point, and
 * compare: bit for bit (F32) or the bf16-rounded values exactly. */
static int roundtrip(const char *root, const char *name, const loom_model_config_t *cfg, loom_st_dtype_t dt,
                     size_t shard, int want_files)
{
	char dir[512], p[700];
	size_t n = loom_model_num_params(cfg);
	float *w = rand_params(cfg, 17), *got = calloc(n, sizeof *got);
	loom_model_config_t back;
	loom_hf_info_t info;
	loom_model_format_t fmt;
	loom_hf_save_opts_t o = {dt, shard, -1, 0};
	snprintf(dir, sizeof dir, "%s/%s", root, name);
	CHECK_OK(loom_hf_dir_save(dir, cfg, w, &o));
	CHECK(loom_hf_dir_is(dir));
	CHECK_EQ(file_exists(dir, "model.safetensors.index.json"), want_files > 1);
	CHECK_EQ(file_exists(dir, "model.safetensors"), want_files == 1);
	CHECK_OK(loom_hf_dir_config(dir, &back, &info));
	CHECK(loom_model_config_equal(cfg, &back));
	CHECK_EQ(info.n_files, want_files);
	CHECK_EQ(info.dtype, dt);
	CHECK_EQ(info.mixed_dtypes, 0);
	CHECK_STREQ(info.torch_dtype, dt == LOOM_ST_BF16 ? "bfloat16" : "float32");
	CHECK_OK(loom_hf_dir_load(dir, &back, got));
	for (size_t i = 0; i < n; i++) {
		float want = dt == LOOM_ST_BF16 ? bf16_round(w[i]) : w[i];
		CHECK_MSG(memcmp(&got[i], &want, 4) == 0, "%s: parameter %zu is %.9g, expected %.9g", name, i, got[i], want);
	}
	/* the model path and loaders take the directory (and the index) as a model */
	CHECK_OK(loom_model_path(dir, p, sizeof p));
	if (want_files > 1)
		CHECK_STREQ(p, dir);
	else
		CHECK_CONTAINS(p, "/model.safetensors");
	CHECK_OK(loom_model_config(p, 0, &back, &fmt));
	CHECK_EQ(fmt, want_files > 1 ? LOOM_MODEL_HF_SHARDED : LOOM_MODEL_SAFETENSORS);
	CHECK(loom_model_config_equal(cfg, &back));
	memset(got, 0, n * sizeof *got);
	CHECK_OK(loom_model_load(p, &back, got));
	for (size_t i = 0; i < n; i++)
		CHECK_FEQ(got[i], dt == LOOM_ST_BF16 ? bf16_round(w[i]) : w[i]);
	if (want_files > 1) {
		snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
		CHECK_OK(loom_model_config(p, 0, &back, &fmt));
		CHECK_EQ(fmt, LOOM_MODEL_HF_SHARDED);
	}
	/* an independent reader: names, shapes, dtypes, header and config.json are transformers' */
	char cmd[1200], out[2048], want[200];
	snprintf(cmd, sizeof cmd, "/usr/bin/python3 tests/ref/hf_dir_ref.py check %s", dir);
	RUN_OK(cmd, out, 120);
	snprintf(want, sizeof want, "ok %s %d tensors %d files %s index=%d", cfg->qwen2 ? "qwen2" : "llama",
	         loom_model_num_tensors(cfg), want_files, dt == LOOM_ST_BF16 ? "bfloat16" : "float32", want_files > 1);
	CHECK_CONTAINS(out, want);
	free(w), free(got);
	return 0;
}

TEST(hfdir_roundtrip)
{
	char root[256];
	loom_model_config_t s = smol(), l = llama3_biased(), q = qwen2();
	CHECK(test_mkdtemp(root, sizeof root) == 0);
	CHECK(roundtrip(root, "smol_f32", &s, LOOM_ST_F32, 0, 1) == 0);
	CHECK(roundtrip(root, "smol_bf16", &s, LOOM_ST_BF16, 0, 1) == 0);
	/* greedy packing in table order gives 14 shards for each (the tensors' byte sizes packed by hand: the
	 * 40 x 32 embedding and lm head, 5120 bytes in F32, fill a 6000-byte shard alone) */
	CHECK(roundtrip(root, "llama3_f32_sharded", &l, LOOM_ST_F32, 6000, 14) == 0);
	CHECK(roundtrip(root, "qwen2_bf16_sharded", &q, LOOM_ST_BF16, 3000, 14) == 0);
	CHECK(roundtrip(root, "qwen2_f32", &q, LOOM_ST_F32, 0, 1) == 0);
	/* an existing directory is not replaced unless asked, and then it is, whole */
	float *w = rand_params(&s, 5), *got = malloc(loom_model_num_params(&s) * sizeof *got);
	char dir[512];
	snprintf(dir, sizeof dir, "%s/smol_f32", root);
	loom_hf_save_opts_t o = {LOOM_ST_F32, 0, -1, 0};
	CHECK_ERR(loom_hf_dir_save(dir, &s, w, &o), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "smol_f32 exists; a model directory is written whole into a new directory");
	o.replace = 1;
	snprintf(dir, sizeof dir, "%s/llama3_f32_sharded", root);
	CHECK_OK(loom_hf_dir_save(dir, &s, w, &o)); /* sharded 14 files -> one model.safetensors */
	CHECK(!file_exists(dir, "model.safetensors.index.json"));
	CHECK(!file_exists(dir, "model-00001-of-00014.safetensors"));
	CHECK_OK(loom_hf_dir_load(dir, &s, got));
	CHECK(memcmp(got, w, loom_model_num_params(&s) * sizeof *got) == 0);
	/* nothing left beside: no temporary or old directory */
	char p[600];
	snprintf(p, sizeof p, "ls -a %s | grep -c -e tmp -e old; true", root);
	char out[256];
	RUN_OK(p, out, 30);
	CHECK_STREQ(out, "0\n");
	o.dtype = LOOM_ST_F16;
	CHECK_ERR(loom_hf_dir_save(dir, &s, w, &o), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "weights are written as F32 or BF16, not F16");
	free(w), free(got);
	test_rmdir(root);
	return 0;
}

/* A directory written by Python (torch + hand-written safetensors): transformers 5's config layout,
 * two shards mixing BF16, F16 and F32, each shard's tensors in another order than the index's. */
TEST(hfdir_python_written)
{
	char root[256], dir[512], cmd[1200], out[2048], expect[600];
	loom_model_config_t cfg;
	loom_hf_info_t info;
	loom_st_t *st;
	CHECK(test_mkdtemp(root, sizeof root) == 0);
	snprintf(dir, sizeof dir, "%s/py", root);
	snprintf(cmd, sizeof cmd, "/usr/bin/python3 tests/ref/hf_dir_ref.py write %s", dir);
	RUN_OK(cmd, out, 120);
	CHECK_OK(loom_hf_dir_config(dir, &cfg, &info));
	CHECK_EQ(cfg.n_layer, 2); CHECK_EQ(cfg.n_kv_head, 2); CHECK_EQ(cfg.head_dim, 8); CHECK_EQ(cfg.tie_word_embeddings, 0);
	CHECK_EQ(cfg.rope_scaling.type, LOOM_ROPE_LLAMA3); CHECK_FEQ(cfg.rope_theta, 500000.0);
	CHECK_EQ(cfg.bos_token_id, 1); CHECK_EQ(cfg.eos_token_id, 2);
	CHECK_EQ(info.n_files, 2); CHECK_EQ(info.mixed_dtypes, 1); CHECK_EQ(info.rope_parameters, 1);
	size_t n = loom_model_num_params(&cfg);
	float *p = malloc(n * sizeof *p);
	CHECK_OK(loom_hf_dir_load(dir, &cfg, p));
	snprintf(expect, sizeof expect, "%s/expect.safetensors", root);
	CHECK_OK(loom_st_open(&st, expect));
	CHECK_EQ(loom_st_count(st), loom_model_num_tensors(&cfg));
	for (int k = 0; k < loom_model_num_tensors(&cfg); k++) {
		loom_tensor_info_t ti;
		loom_model_tensor_info(&cfg, k, &ti);
		int i = loom_st_find(st, ti.name);
		CHECK_MSG(i >= 0, "%s not in expect.safetensors", ti.name);
		float *want = malloc(ti.numel * sizeof *want);
		CHECK_OK(loom_st_read_f32(st, i, want, ti.numel));
		CHECK_MSG(memcmp(want, p + ti.offset, ti.numel * sizeof *want) == 0, "%s differs from Python's", ti.name);
		free(want);
	}
	loom_st_close(st);
	free(p);
	test_rmdir(root);
	return 0;
}

/* Write a file of tensors (name, dtype, shape) with zero data, for the refusals. */
static int write_fake(const char *path, const loom_model_config_t *cfg, const char *skip, const char *extra,
                      const char *reshape, loom_st_dtype_t dt)
{
	int nt = loom_model_num_tensors(cfg), n = 0;
	loom_st_tensor_t *t = calloc((size_t)nt + 1, sizeof *t);
	loom_tensor_info_t *info = calloc((size_t)nt + 1, sizeof *info);
	static char zeros[1 << 16];
	for (int k = 0; k < nt; k++) {
		loom_model_tensor_info(cfg, k, &info[k]);
		if (skip && strcmp(info[k].name, skip) == 0)
			continue;
		t[n].name = info[k].name, t[n].dtype = dt, t[n].ndim = info[k].ndim;
		t[n].shape[0] = info[k].shape[0], t[n].shape[1] = info[k].shape[1];
		if (reshape && strcmp(info[k].name, reshape) == 0)
			t[n].shape[0]++;
		t[n].nbytes = loom_st_dtype_size(dt) * t[n].shape[0] * (t[n].ndim == 2 ? t[n].shape[1] : 1);
		t[n].data = zeros;
		n++;
	}
	if (extra) {
		t[n].name = extra, t[n].dtype = dt, t[n].ndim = 2, t[n].shape[0] = (size_t)cfg->vocab_size;
		t[n].shape[1] = (size_t)cfg->n_embd, t[n].nbytes = loom_st_dtype_size(dt) * t[n].shape[0] * t[n].shape[1];
		t[n].data = zeros;
		n++;
	}
	const char *meta[2] = {"format", "pt"};
	int rc = loom_st_write(path, t, n, meta, 1);
	free(t), free(info);
	return rc;
}

TEST(hfdir_refusals)
{
	char root[256], dir[512], p[700], q[700], text[2048];
	loom_model_config_t s = smol(), u = llama3_biased(), cfg;
	float *w = rand_params(&s, 3);
	CHECK(test_mkdtemp(root, sizeof root) == 0);
	snprintf(dir, sizeof dir, "%s/d", root);
	mkdir(dir, 0755);
	snprintf(p, sizeof p, "%s/config.json", dir);
	CHECK_OK(loom_hf_config_write(p, &u, "float32", -1));
	snprintf(p, sizeof p, "%s/model.safetensors", dir);
	CHECK_OK(write_fake(p, &u, "lm_head.weight", NULL, NULL, LOOM_ST_BF16));
	CHECK_ERR(loom_hf_dir_config(dir, &cfg, NULL), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "/d/model.safetensors: missing tensor 'lm_head.weight' (config.json's "
	                              "tie_word_embeddings is false: the head is its own)");
	CHECK_OK(write_fake(p, &u, NULL, "model.extra.weight", NULL, LOOM_ST_BF16));
	CHECK_ERR(loom_hf_dir_config(dir, &cfg, NULL), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "/d/model.safetensors: unexpected tensor 'model.extra.weight' (not part of the "
	                              "llama model of config.json, 2 layers)");
	CHECK_OK(write_fake(p, &u, NULL, NULL, "model.layers.1.mlp.up_proj.weight", LOOM_ST_F32));
	CHECK_ERR(loom_hf_dir_config(dir, &cfg, NULL), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "tensor 'model.layers.1.mlp.up_proj.weight' has shape [25,32], config.json's model "
	                              "has [24,32]");
	CHECK_OK(write_fake(p, &u, NULL, NULL, NULL, LOOM_ST_I32));
	CHECK_ERR(loom_hf_dir_config(dir, &cfg, NULL), LOOM_EFORMAT);
	CHECK_CONTAINS(loom_errmsg(), "has dtype I32, expected F32, BF16 or F16");
	CHECK_OK(write_fake(p, &u, NULL, "model.layers.1.self_attn.rotary_emb.inv_freq", NULL, LOOM_ST_F32));
	CHECK_OK(loom_hf_dir_config(dir, &cfg, NULL)); /* transformers 4's buffer: ignored */
	/* tied: lm_head.weight may be there, equal to the embedding; a different one is refused on load */
	snprintf(p, sizeof p, "%s/config.json", dir);
	CHECK_OK(loom_hf_config_write(p, &s, "float32", -1));
	snprintf(p, sizeof p, "%s/model.safetensors", dir);
	CHECK_OK(write_fake(p, &s, NULL, "lm_head.weight", NULL, LOOM_ST_F32));
	CHECK_OK(loom_hf_dir_config(dir, &cfg, NULL));
	CHECK_OK(loom_hf_dir_load(dir, &cfg, w)); /* zeros equal zeros */
	{
		float *w2 = rand_params(&s, 99); /* w was zeroed by the load above */
		loom_st_tensor_t head = {"lm_head.weight", LOOM_ST_F32, 2, {40, 32}, w2 + 1, 40 * 32 * 4};
		/* the rest from a save, then the file replaced by one with a shifted head */
		loom_hf_save_opts_t o = {LOOM_ST_F32, 0, -1, 1};
		CHECK_OK(loom_hf_dir_save(dir, &s, w2, &o));
		loom_st_t *st;
		CHECK_OK(loom_st_open(&st, p));
		int nt = loom_st_count(st);
		loom_st_tensor_t *all = calloc((size_t)nt + 1, sizeof *all);
		for (int i = 0; i < nt; i++)
			all[i] = *loom_st_get(st, i);
		all[nt] = head;
		const char *meta[2] = {"format", "pt"};
		snprintf(q, sizeof q, "%s/x.safetensors", root);
		CHECK_OK(loom_st_write(q, all, nt + 1, meta, 1));
		loom_st_close(st);
		free(all);
		CHECK(rename(q, p) == 0);
		CHECK_OK(loom_hf_dir_config(dir, &cfg, NULL));
		CHECK_ERR(loom_hf_dir_load(dir, &cfg, w), LOOM_EFORMAT);
		CHECK_CONTAINS(loom_errmsg(), "lm_head.weight differs from model.embed_tokens.weight, but config.json's "
		                              "tie_word_embeddings is true");
		free(w2);
	}
	/* the index: a missing shard, a tensor in another shard than it says, an unlisted tensor, a path */
	snprintf(dir, sizeof dir, "%s/sh", root);
	loom_hf_save_opts_t o = {LOOM_ST_F32, 4000, -1, 0};
	CHECK_OK(loom_hf_dir_save(dir, &s, w, &o));
	snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
	char orig[16384];
	test_read_text(p, orig, sizeof orig);
	CHECK_CONTAINS(orig, "\"model.embed_tokens.weight\": \"model-00001-of-00016.safetensors\"");
	snprintf(q, sizeof q, "%s/model-00016-of-00016.safetensors", dir);
	snprintf(text, sizeof text, "%s/m6", root);
	CHECK(rename(q, text) == 0);
	CHECK_ERR(loom_model_config(dir, 0, &cfg, NULL), LOOM_ENOENT);
	CHECK_CONTAINS(loom_errmsg(), "shard model-00016-of-00016.safetensors (listed in");
	CHECK(rename(text, q) == 0);
	static const struct {
		const char *from, *to, *msg;
	} idx[] = {
		{"\"model.embed_tokens.weight\": \"model-00001", "\"model.embed_tokens.weight\": \"model-00002",
		 "weight_map puts tensor 'model.embed_tokens.weight' in model-00002-of-00016.safetensors, which does not hold it"},
		{"\"model.embed_tokens.weight\": \"model-00001-of-00016.safetensors\",", "",
		 "model.safetensors.index.json: missing tensor 'model.embed_tokens.weight'"}, /* its shard is unlisted */
		/* greedy packing put post_attention_layernorm (128 bytes) with gate_proj (3072) in shard 7 */
		{"\"model.layers.0.post_attention_layernorm.weight\": \"model-00007-of-00016.safetensors\",", "",
		 "tensor 'model.layers.0.post_attention_layernorm.weight' is in model-00007-of-00016.safetensors but "
		 "weight_map does not list it"},
		{"\"model.embed_tokens.weight\": \"model-00001-of-00016.safetensors\"",
		 "\"model.embed_tokens.weight\": \"../x/model-00001-of-00016.safetensors\"",
		 "weight_map[\"model.embed_tokens.weight\"] must be the name of a .safetensors file in the directory"},
		{"\"weight_map\"", "\"weights\"", "no \"weight_map\" object"},
	};
	for (size_t i = 0; i < sizeof idx / sizeof idx[0]; i++) {
		char *at = strstr(orig, idx[i].from);
		CHECK(at != NULL);
		snprintf(text, sizeof text, "%.*s%s%s", (int)(at - orig), orig, idx[i].to, at + strlen(idx[i].from));
		CHECK(test_write_file(p, text, strlen(text)) == 0);
		CHECK_ERR(loom_hf_dir_config(dir, &cfg, NULL), LOOM_EFORMAT);
		CHECK_CONTAINS(loom_errmsg(), idx[i].msg);
	}
	/* no config.json */
	CHECK(test_write_file(p, orig, strlen(orig)) == 0);
	snprintf(p, sizeof p, "%s/config.json", dir);
	CHECK(unlink(p) == 0);
	CHECK_ERR(loom_hf_dir_config(dir, &cfg, NULL), LOOM_ENOENT);
	CHECK_CONTAINS(loom_errmsg(), "/sh/config.json: no config.json");
	free(w);
	test_rmdir(root);
	return 0;
}

/* loom's own model file of the family carries config.json in __metadata__: alone, without config.json
 * beside it, it still loads; with one beside, that one is read. */
TEST(hfdir_loom_file)
{
	char root[256], p[600], q[600];
	loom_model_config_t c = llama3_biased(), back;
	float *w = rand_params(&c, 11), *got;
	CHECK(test_mkdtemp(root, sizeof root) == 0);
	snprintf(p, sizeof p, "%s/a/m.safetensors", root);
	snprintf(q, sizeof q, "%s/a", root);
	mkdir(q, 0755);
	CHECK_OK(loom_model_save(p, &c, w));
	snprintf(q, sizeof q, "%s/a/config.json", root);
	CHECK(file_exists(root, "a/config.json"));
	CHECK_OK(loom_model_load_alloc(p, 0, &back, &got));
	CHECK(loom_model_config_equal(&c, &back));
	CHECK(memcmp(got, w, loom_model_num_params(&c) * sizeof *got) == 0);
	free(got);
	CHECK(unlink(q) == 0);
	CHECK_OK(loom_model_load_alloc(p, 0, &back, &got));
	CHECK(loom_model_config_equal(&c, &back));
	CHECK(memcmp(got, w, loom_model_num_params(&c) * sizeof *got) == 0);
	free(got), free(w);
	test_rmdir(root);
	return 0;
}

/* Loading streams: no allocation during the load is as large as a tensor (the embedding is 16 MB in
 * fp32, 8 MB in BF16); the largest is the 256 KB read buffer (headers' parsing aside, far smaller). */
TEST(hfdir_load_streams)
{
	char root[256], dir[512];
	loom_model_config_t c = smol();
	c.vocab_size = 8192, c.n_embd = 512, c.n_head = 8, c.n_kv_head = 2, c.head_dim = 64, c.intermediate_size = 64;
	c.n_layer = 1, c.has_token_ids = 0;
	size_t n = loom_model_num_params(&c), embed = (size_t)c.vocab_size * (size_t)c.n_embd;
	float *w = rand_params(&c, 23), *got = loom_alloc_aligned(n * sizeof *got);
	CHECK(test_mkdtemp(root, sizeof root) == 0);
	for (int bf = 0; bf < 2; bf++) {
		loom_hf_save_opts_t o = {bf ? LOOM_ST_BF16 : LOOM_ST_F32, embed * 2 + 1, -1, 0};
		loom_model_config_t back;
		snprintf(dir, sizeof dir, "%s/%s", root, bf ? "bf16" : "f32");
		CHECK_OK(loom_hf_dir_save(dir, &c, w, &o));
		loom__alloc_largest(1);
		CHECK_OK(loom_model_config(dir, 0, &back, NULL));
		CHECK_OK(loom_model_load(dir, &back, got));
		size_t largest = loom__alloc_largest(0);
		CHECK_MSG(largest <= (256u << 10) && largest < embed * 2, "largest allocation of the load %zu bytes", largest);
		for (size_t i = 0; i < n; i += 997)
			CHECK_FEQ(got[i], bf ? bf16_round(w[i]) : w[i]);
	}
	free(w), free(got);
	test_rmdir(root);
	return 0;
}

/* The first parameter where got and want differ (as bits), -1 when none. */
static long first_diff(const float *got, const float *want, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (memcmp(&got[i], &want[i], sizeof *got) != 0)
			return (long)i;
	return -1;
}

/* The load's threads: a directory whose embedding spans several of the 8 MB pieces the threads claim,
 * each read in 256 KB chunks, neither size dividing the tensor (V = 9001), loaded on 1, 2 and 3
 * threads into a buffer of NaNs, gives every parameter bit for bit (F32 in shards, BF16 in one file),
 * and so does loom_model_load_alloc (whose buffer is not zeroed). Every other format's loader writes
 * every float too (GPT-2's .bin and .safetensors, nanochat's .safetensors), so none needs a zeroed
 * buffer. */
TEST(hfdir_load_threads)
{
	char root[256], dir[512];
	loom_model_config_t c = smol(), back;
	c.vocab_size = 9001, c.n_embd = 512, c.n_head = 8, c.n_kv_head = 2, c.head_dim = 64, c.intermediate_size = 64;
	c.n_layer = 1, c.has_token_ids = 0;
	size_t n = loom_model_num_params(&c), embed = (size_t)c.vocab_size * (size_t)c.n_embd;
	float *w = rand_params(&c, 29), *want = malloc(n * sizeof *want), *got = malloc(n * sizeof *got), *alloc;
	int saved = loom_num_threads();
	long d;
	CHECK(want && got && test_mkdtemp(root, sizeof root) == 0);
	for (int bf = 0; bf < 2; bf++) {
		loom_hf_save_opts_t o = {bf ? LOOM_ST_BF16 : LOOM_ST_F32, bf ? 0 : embed * 4 + 1, -1, 0};
		snprintf(dir, sizeof dir, "%s/%s", root, bf ? "bf16" : "f32");
		CHECK_OK(loom_hf_dir_save(dir, &c, w, &o));
		CHECK_EQ(file_exists(dir, "model.safetensors.index.json"), !bf);
		for (size_t i = 0; i < n; i++)
			want[i] = bf ? bf16_round(w[i]) : w[i];
		CHECK_OK(loom_model_config(dir, 0, &back, NULL));
		for (int t = 1; t <= 3; t++) {
			loom_set_num_threads(t);
			memset(got, 0xff, n * sizeof *got);
			int rc = loom_model_load(dir, &back, got);
			loom_set_num_threads(saved);
			CHECK_OK(rc);
			d = first_diff(got, want, n);
			CHECK_MSG(d < 0, "%s on %d threads: parameter %ld is %.9g, expected %.9g", dir, t, d, got[d], want[d]);
		}
		CHECK_OK(loom_model_load_alloc(dir, 0, &back, &alloc));
		d = first_diff(alloc, want, n);
		CHECK_MSG(d < 0, "%s by loom_model_load_alloc: parameter %ld is %.9g, expected %.9g", dir, d, alloc[d], want[d]);
		free(alloc);
	}
	free(w), free(want), free(got);
	/* the other families' files */
	loom_model_config_t g = {.n_layer = 2, .n_head = 4, .n_embd = 32, .seq_len = 16, .vocab_size = 40};
	loom_model_config_t nc = {.n_layer = 3, .n_head = 4, .n_embd = 64, .seq_len = 16, .vocab_size = 61,
	                          .arch = LOOM_ARCH_NANOCHAT, .n_kv_head = 2};
	snprintf(nc.window_pattern, sizeof nc.window_pattern, "SSL");
	const struct {
		const loom_model_config_t *cfg;
		const char *name;
	} files[] = {{&g, "gpt2.bin"}, {&g, "gpt2.safetensors"}, {&nc, "nanochat.safetensors"}};
	for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
		n = loom_model_num_params(files[f].cfg);
		w = rand_params(files[f].cfg, 31 + (uint32_t)f), got = malloc(n * sizeof *got);
		snprintf(dir, sizeof dir, "%s/%s", root, files[f].name);
		CHECK_OK(loom_model_save(dir, files[f].cfg, w));
		CHECK_OK(loom_model_config(dir, files[f].cfg->n_head, &back, NULL));
		memset(got, 0xff, n * sizeof *got);
		CHECK_OK(loom_model_load(dir, &back, got));
		d = first_diff(got, w, n);
		CHECK_MSG(d < 0, "%s: parameter %ld is %.9g, expected %.9g", dir, d, got[d], w[d]);
		free(w), free(got);
	}
	test_rmdir(root);
	return 0;
}

/* End to end: `loom train --init-from DIR` on a directory written by Python (BF16/F16/F32 shards, no
 * --arch or size flags) trains exactly as from the same weights converted to loom's file, and its
 * checkpoint directory is a Hugging Face directory (transformers' names, config.json) with the same
 * configuration and token ids. */
TEST(hfdir_train_from_dir)
{
	char root[256], cmd[4096], out[16384], want[1024], path[700];
	static char lines[2][16][160];
	double loss[2][16];
	const char *loom = test_loom_bin();
	loom_model_config_t py, ck;
	CHECK(test_mkdtemp(root, sizeof root) == 0);
	snprintf(cmd, sizeof cmd, "/usr/bin/python3 tests/ref/hf_dir_ref.py write %s/py", root);
	RUN_OK(cmd, out, 120);
	CHECK_OK(test_make_token_data(root, 64, 4000));
	snprintf(cmd, sizeof cmd, "mkdir %s/m && %s convert %s/py %s/m/model.safetensors", root, loom, root, root);
	RUN_OK(cmd, out, 60);
	static const char *const from[2] = {"py", "m/model.safetensors"};
	for (int k = 0; k < 2; k++) {
		snprintf(cmd, sizeof cmd, "%s train --train-data '%s/train_*.bin' --init-from %s/%s --batch-size 2 --seq-len 16 "
		         "--steps 8 --lr 1e-3 --threads 1 --peak-flops 1e10 --log %s/%d.jsonl%s%s%s", loom, root, root, from[k],
		         root, k, k ? "" : " --save-dir ", k ? "" : root, k ? "" : "/ck --save-every 8");
		RUN_OK(cmd, out, 120);
		snprintf(want, sizeof want, ", from %s/%s\n", root, from[k]);
		CHECK_CONTAINS(out, want);
		snprintf(path, sizeof path, "%s/%d.jsonl", root, k);
		CHECK_EQ(test_read_losses(path, loss[k], 16, lines[k], NULL), 8);
	}
	for (int s = 1; s <= 8; s++)
		CHECK_STREQ(lines[0][s], lines[1][s]);
	CHECK(loss[0][8] < loss[0][1]);
	snprintf(path, sizeof path, "%s/ck/step_00000008", root);
	snprintf(cmd, sizeof cmd, "/usr/bin/python3 tests/ref/hf_dir_ref.py check %s", path);
	RUN_OK(cmd, out, 120);
	CHECK_CONTAINS(out, "ok llama 21 tensors 1 files float32 index=0");
	snprintf(cmd, sizeof cmd, "%s/py", root);
	CHECK_OK(loom_hf_dir_config(cmd, &py, NULL));
	CHECK_OK(loom_hf_dir_config(path, &ck, NULL));
	CHECK(loom_model_config_equal(&py, &ck));
	CHECK_EQ(ck.bos_token_id, 1);
	CHECK_EQ(ck.eos_token_id, 2);
	test_rmdir(root);
	return 0;
}
