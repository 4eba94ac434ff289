/* hf_config.c: config.json beside a model file: Hugging Face's GPT2Config for GPT-2, LlamaConfig and
 * Qwen2Config for the llama family (read and written: the second half of this file), nanochat's
 * GPTConfig fields (sequence_len, vocab_size, n_layer, n_head, n_kv_head, n_embd, window_pattern) for
 * nanochat (plus loom's short_window), which `GPTConfig(**json)` takes once model_type, short_window
 * and eos_token_id are dropped.
 *
 * With it a directory holding loom's model.safetensors loads with transformers'
 * GPT2LMHeadModel.from_pretrained(dir): the fields are GPT2Config's (architectures, model_type,
 * n_layer, n_head, n_embd, n_positions, n_ctx, vocab_size, and the settings loom's model has fixed:
 * GELU-tanh ("gelu_new"), LayerNorm epsilon 1e-5, no dropout, tied embeddings, float32). bos and eos
 * are the run's end-of-text token: HF's defaults (50256) are wrong for any vocabulary but GPT-2's,
 * e.g. out of range for the byte-level 257. The file is replaced atomically; loom's own reader uses
 * only n_head from it (model.c). */
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/json.h"
#include "ckpt/model_internal.h"
#include "core/fileio.h"
#include "core/util.h"
#include "loom/ckpt.h"

int loom_model_hf_config_path(const char *model_path, char *path, size_t cap)
{
	char dir[1024];
	if (snprintf(dir, sizeof dir, "%s", model_path) >= (int)sizeof dir ||
	    snprintf(path, cap, "%s/config.json", dirname(dir)) >= (int)cap)
		return loom_seterr(LOOM_EINVAL, "%s: path too long", model_path);
	return LOOM_OK;
}

int loom_model_write_hf_config(const char *model_path, const loom_model_config_t *cfg, int eot)
{
	atomic_file_t af;
	char path[1100];
	int rc;
	if (cfg->arch == LOOM_ARCH_LLAMA) /* transformers' LlamaConfig / Qwen2Config: the weights are F32 */
		return (rc = loom_model_hf_config_path(model_path, path, sizeof path)) != LOOM_OK
		           ? rc : loom_hf_config_write(path, cfg, "float32", eot);
	if ((rc = loom_model_config_check(cfg)) != LOOM_OK)
		return rc;
	if (eot < 0)
		eot = cfg->vocab_size - 1;
	if (eot >= cfg->vocab_size)
		return loom_seterr(LOOM_EINVAL, "%s: end-of-text token %d outside the vocabulary of %d", model_path, eot,
		                   cfg->vocab_size);
	if ((rc = loom_model_hf_config_path(model_path, path, sizeof path)) != LOOM_OK)
		return rc;
	if ((rc = loom__atomic_open(&af, path)) != LOOM_OK)
		return rc;
	if (cfg->arch == LOOM_ARCH_NANOCHAT) { /* nanochat's GPTConfig (nanochat/gpt.py), as its meta JSON has it */
		fprintf(af.f,
		        "{\n"
		        "  \"model_type\": \"nanochat\",\n"
		        "  \"sequence_len\": %d,\n"
		        "  \"vocab_size\": %d,\n"
		        "  \"n_layer\": %d,\n"
		        "  \"n_head\": %d,\n"
		        "  \"n_kv_head\": %d,\n"
		        "  \"n_embd\": %d,\n"
		        "  \"window_pattern\": \"%s\",\n"
		        "  \"short_window\": %d,\n"
		        "  \"eos_token_id\": %d\n"
		        "}\n",
		        cfg->seq_len, cfg->vocab_size, cfg->n_layer, cfg->n_head, cfg->n_kv_head ? cfg->n_kv_head : cfg->n_head,
		        cfg->n_embd, cfg->window_pattern[0] ? cfg->window_pattern : "SSSL",
		        cfg->short_window ? cfg->short_window : cfg->seq_len / 2, eot);
		return loom__atomic_commit(&af);
	}
	fprintf(af.f,
	        "{\n"
	        "  \"architectures\": [\"GPT2LMHeadModel\"],\n"
	        "  \"model_type\": \"gpt2\",\n"
	        "  \"n_layer\": %d,\n"
	        "  \"n_head\": %d,\n"
	        "  \"n_embd\": %d,\n"
	        "  \"n_positions\": %d,\n"
	        "  \"n_ctx\": %d,\n"
	        "  \"n_inner\": null,\n"
	        "  \"vocab_size\": %d,\n"
	        "  \"bos_token_id\": %d,\n"
	        "  \"eos_token_id\": %d,\n"
	        "  \"activation_function\": \"gelu_new\",\n"
	        "  \"layer_norm_epsilon\": 1e-05,\n"
	        "  \"initializer_range\": 0.02,\n"
	        "  \"resid_pdrop\": 0.0,\n"
	        "  \"embd_pdrop\": 0.0,\n"
	        "  \"attn_pdrop\": 0.0,\n"
	        "  \"scale_attn_weights\": true,\n"
	        "  \"scale_attn_by_inverse_layer_idx\": false,\n"
	        "  \"reorder_and_upcast_attn\": false,\n"
	        "  \"tie_word_embeddings\": true,\n"
	        "  \"use_cache\": true,\n"
	        "  \"torch_dtype\": \"float32\"\n"
	        "}\n",
	        cfg->n_layer, cfg->n_head, cfg->n_embd, cfg->seq_len, cfg->seq_len, cfg->vocab_size, eot, eot);
	return loom__atomic_commit(&af);
}

/* ---- the llama family: LlamaConfig and Qwen2Config ---------------------------------------------------
 *
 * Reading is strict where a value changes the model's math (a field loom does not implement is
 * refused by name, never ignored) and lenient elsewhere: keys that only transformers' own machinery
 * reads (transformers_version, _name_or_path, use_cache, initializer_range, pretraining_tp, ...) are
 * ignored. Sizes are required: transformers' class defaults (LlamaConfig's 4096 x 32 layers) are never
 * assumed for a file that omits them. */

typedef struct {
	const char *path;
	const json_t *root;
} cfgr_t;

/* An integer field in [lo, hi]: absent or null leaves *out (LOOM_OK) unless required. */
static int get_int(const cfgr_t *r, const json_t *obj, const char *prefix, const char *key, int required, long lo,
                   long hi, int *out)
{
	const json_t *v = loom__json_get(obj, key);
	int64_t x;
	if (!v || v->type == JSON_NULL) {
		if (required)
			return loom_seterr(LOOM_EFORMAT, "%s: no \"%s%s\" (an integer is required)", r->path, prefix, key);
		return LOOM_OK;
	}
	if (v->type != JSON_NUMBER || loom__json_to_i64(v, &x))
		return loom_seterr(LOOM_EFORMAT, "%s: \"%s%s\" is %s%s, expected an integer", r->path, prefix, key,
		                   v->type == JSON_NUMBER ? "" : "a ", v->type == JSON_NUMBER ? v->s : loom__json_type_name(v->type));
	if (x < lo || x > hi)
		return loom_seterr(LOOM_EFORMAT, "%s: \"%s%s\" = %lld is outside [%ld, %ld]", r->path, prefix, key,
		                   (long long)x, lo, hi);
	*out = (int)x;
	return LOOM_OK;
}

/* A finite number > 0 (or >= 0 with zero_ok): absent or null leaves *out unless required. */
static int get_num(const cfgr_t *r, const json_t *obj, const char *prefix, const char *key, int required,
                   int zero_ok, double *out)
{
	const json_t *v = loom__json_get(obj, key);
	if (!v || v->type == JSON_NULL) {
		if (required)
			return loom_seterr(LOOM_EFORMAT, "%s: no \"%s%s\" (a number is required)", r->path, prefix, key);
		return LOOM_OK;
	}
	if (v->type != JSON_NUMBER)
		return loom_seterr(LOOM_EFORMAT, "%s: \"%s%s\" is a %s, expected a number", r->path, prefix, key,
		                   loom__json_type_name(v->type));
	if (!(v->num > 0 || (zero_ok && v->num == 0)) || v->num > 1e300)
		return loom_seterr(LOOM_EFORMAT, "%s: \"%s%s\" = %s, expected a %s number", r->path, prefix, key, v->s,
		                   zero_ok ? "non-negative" : "positive");
	*out = v->num;
	return LOOM_OK;
}

static int get_bool(const cfgr_t *r, const char *key, int *out)
{
	const json_t *v = loom__json_get(r->root, key);
	if (!v || v->type == JSON_NULL)
		return LOOM_OK;
	if (v->type != JSON_BOOL)
		return loom_seterr(LOOM_EFORMAT, "%s: \"%s\" is a %s, expected true or false", r->path, key,
		                   loom__json_type_name(v->type));
	*out = v->boolean;
	return LOOM_OK;
}

/* A token id: an integer, a list of integers (the first is taken: Llama 3 Instruct lists several
 * end tokens, and the first is the end-of-text one), or null / absent (*set stays 0). */
static int get_token(const cfgr_t *r, const char *key, int vocab, int *out, int *set)
{
	const json_t *v = loom__json_get(r->root, key);
	int64_t x;
	if (!v || v->type == JSON_NULL)
		return LOOM_OK;
	if (v->type == JSON_ARRAY) {
		if (v->n == 0)
			return LOOM_OK;
		v = &v->kids[0];
	}
	if (v->type != JSON_NUMBER || loom__json_to_i64(v, &x) || x < 0 || x >= vocab)
		return loom_seterr(LOOM_EFORMAT, "%s: \"%s\" must be a token id in [0, %d) (or a list of them, or null)",
		                   r->path, key, vocab);
	*out = (int)x, *set = 1;
	return LOOM_OK;
}

/* rope_scaling (transformers 4) or rope_parameters (transformers 5): object `o` named `field`. */
static int parse_rope(const cfgr_t *r, const json_t *o, const char *field, loom_model_config_t *cfg)
{
	static const char *const known[] = {"rope_type", "type", "factor", "low_freq_factor", "high_freq_factor",
	                                    "original_max_position_embeddings", "rope_theta"};
	char prefix[40];
	const json_t *t;
	const char *type;
	int rc, params = strcmp(field, "rope_parameters") == 0;
	if (o->type != JSON_OBJECT)
		return loom_seterr(LOOM_EFORMAT, "%s: \"%s\" is a %s, expected an object or null", r->path, field,
		                   loom__json_type_name(o->type));
	for (int i = 0; i < o->n; i++) {
		size_t k = 0;
		while (k < LOOM_ARRAY_LEN(known) && strcmp(o->kids[i].key, known[k]) != 0)
			k++;
		if (k == LOOM_ARRAY_LEN(known) || (!params && k == 6))
			return loom_seterr(LOOM_ENOTSUP, "%s: \"%s.%.40s\" is not implemented by loom (it reads rope_type, "
			                   "factor, low_freq_factor, high_freq_factor, original_max_position_embeddings%s)",
			                   r->path, field, o->kids[i].key, params ? ", rope_theta" : "");
	}
	snprintf(prefix, sizeof prefix, "%s.", field);
	if (params && (rc = get_num(r, o, prefix, "rope_theta", 1, 0, &cfg->rope_theta)) != LOOM_OK)
		return rc;
	t = loom__json_get(o, "rope_type");
	if (!t)
		t = loom__json_get(o, "type");
	if (t && t->type != JSON_STRING)
		return loom_seterr(LOOM_EFORMAT, "%s: \"%srope_type\" is a %s, expected a string", r->path, prefix,
		                   loom__json_type_name(t->type));
	type = t ? t->s : "default";
	if (strcmp(type, "default") == 0) {
		cfg->rope_scaling.type = LOOM_ROPE_DEFAULT;
		return LOOM_OK;
	}
	if (strcmp(type, "llama3") != 0)
		return loom_seterr(LOOM_ENOTSUP, "%s: \"%srope_type\" \"%.40s\" is not implemented by loom (default, llama3)",
		                   r->path, prefix, type);
	cfg->rope_scaling.type = LOOM_ROPE_LLAMA3;
	if ((rc = get_num(r, o, prefix, "factor", 1, 0, &cfg->rope_scaling.factor)) ||
	    (rc = get_num(r, o, prefix, "low_freq_factor", 1, 0, &cfg->rope_scaling.low_freq_factor)) ||
	    (rc = get_num(r, o, prefix, "high_freq_factor", 1, 0, &cfg->rope_scaling.high_freq_factor)) ||
	    (rc = get_int(r, o, prefix, "original_max_position_embeddings", 1, 1, LOOM_MODEL_MAX_SEQ,
	                  &cfg->rope_scaling.original_max_position_embeddings)))
		return rc;
	if (!(cfg->rope_scaling.high_freq_factor > cfg->rope_scaling.low_freq_factor))
		return loom_seterr(LOOM_EFORMAT, "%s: \"%shigh_freq_factor\" must exceed \"low_freq_factor\" (llama3's blend "
		                   "divides by their difference)", r->path, prefix);
	return LOOM_OK;
}

static int parse_llama(const cfgr_t *r, loom_model_config_t *cfg, loom_hf_info_t *info)
{
	const json_t *root = r->root, *v, *rs, *rp;
	const char *arch_want;
	int rc, qwen2, bos_set = 0, eos_set = 0;
	double dropout = 0, partial = 1;
	memset(cfg, 0, sizeof *cfg);
	if (root->type != JSON_OBJECT)
		return loom_seterr(LOOM_EFORMAT, "%s: a %s, expected a JSON object", r->path, loom__json_type_name(root->type));
	v = loom__json_get(root, "model_type");
	if (!v || v->type != JSON_STRING)
		return loom_seterr(LOOM_EFORMAT, "%s: no \"model_type\" string (loom reads \"llama\" and \"qwen2\")", r->path);
	if (strcmp(v->s, "llama") == 0)
		qwen2 = 0, arch_want = "LlamaForCausalLM";
	else if (strcmp(v->s, "qwen2") == 0)
		qwen2 = 1, arch_want = "Qwen2ForCausalLM";
	else
		return loom_seterr(LOOM_ENOTSUP, "%s: \"model_type\" \"%.40s\" is not a model loom reads (llama, qwen2)",
		                   r->path, v->s);
	if (info) {
		memset(info, 0, sizeof *info);
		snprintf(info->model_type, sizeof info->model_type, "%s", v->s);
	}
	if ((v = loom__json_get(root, "architectures")) && v->type != JSON_NULL) {
		int found = 0;
		if (v->type != JSON_ARRAY)
			return loom_seterr(LOOM_EFORMAT, "%s: \"architectures\" is a %s, expected a list of strings", r->path,
			                   loom__json_type_name(v->type));
		for (int i = 0; i < v->n; i++) {
			if (v->kids[i].type != JSON_STRING)
				return loom_seterr(LOOM_EFORMAT, "%s: \"architectures\" holds a %s, expected strings", r->path,
				                   loom__json_type_name(v->kids[i].type));
			if (strcmp(v->kids[i].s, arch_want) == 0)
				found = 1;
			else
				return loom_seterr(LOOM_ENOTSUP, "%s: \"architectures\" names \"%.60s\"; loom reads %s (a causal "
				                   "language model) for model_type \"%s\"", r->path, v->kids[i].s, arch_want,
				                   qwen2 ? "qwen2" : "llama");
		}
		if (!found && v->n > 0)
			return loom_seterr(LOOM_ENOTSUP, "%s: \"architectures\" does not name %s", r->path, arch_want);
	}
	if ((v = loom__json_get(root, "hidden_act")) && !(v->type == JSON_STRING && strcmp(v->s, "silu") == 0))
		return loom_seterr(LOOM_ENOTSUP, "%s: \"hidden_act\" %s%.40s%s is not implemented by loom (its SwiGLU MLP is "
		                   "\"silu\")", r->path, v->type == JSON_STRING ? "\"" : "",
		                   v->type == JSON_STRING ? v->s : loom__json_type_name(v->type),
		                   v->type == JSON_STRING ? "\"" : "");
	if ((v = loom__json_get(root, "quantization_config")) && v->type != JSON_NULL)
		return loom_seterr(LOOM_ENOTSUP, "%s: \"quantization_config\": quantized weights are not implemented by loom "
		                   "(it reads F32, BF16 and F16)", r->path);
	cfg->arch = LOOM_ARCH_LLAMA;
	cfg->qwen2 = qwen2;
	cfg->qkv_bias = qwen2;
	if ((rc = get_int(r, root, "", "hidden_size", 1, 1, LOOM_MODEL_MAX_EMBD, &cfg->n_embd)) ||
	    (rc = get_int(r, root, "", "num_hidden_layers", 1, 1, LOOM_MODEL_MAX_LAYERS, &cfg->n_layer)) ||
	    (rc = get_int(r, root, "", "num_attention_heads", 1, 1, LOOM_MODEL_MAX_EMBD, &cfg->n_head)) ||
	    (rc = get_int(r, root, "", "num_key_value_heads", 0, 1, LOOM_MODEL_MAX_EMBD, &cfg->n_kv_head)) ||
	    (rc = get_int(r, root, "", "head_dim", 0, 1, LOOM_MODEL_MAX_EMBD, &cfg->head_dim)) ||
	    (rc = get_int(r, root, "", "intermediate_size", 1, 1, 4 * LOOM_MODEL_MAX_EMBD, &cfg->intermediate_size)) ||
	    (rc = get_int(r, root, "", "vocab_size", 1, 1, LOOM_MODEL_MAX_VOCAB, &cfg->vocab_size)))
		return rc;
	cfg->seq_len = qwen2 ? 32768 : 2048; /* the classes' defaults: the only size a config may omit */
	cfg->rope_theta = 10000;
	cfg->rms_norm_eps = 1e-6;
	if ((rc = get_int(r, root, "", "max_position_embeddings", 0, 1, LOOM_MODEL_MAX_SEQ, &cfg->seq_len)) ||
	    (rc = get_num(r, root, "", "rms_norm_eps", 0, 0, &cfg->rms_norm_eps)) ||
	    (rc = get_bool(r, "tie_word_embeddings", &cfg->tie_word_embeddings)) ||
	    (rc = get_num(r, root, "", "attention_dropout", 0, 1, &dropout)) ||
	    (rc = get_num(r, root, "", "partial_rotary_factor", 0, 0, &partial)))
		return rc;
	if (dropout != 0)
		return loom_seterr(LOOM_ENOTSUP, "%s: \"attention_dropout\" is not 0: dropout is not implemented by loom",
		                   r->path);
	if (partial != 1)
		return loom_seterr(LOOM_ENOTSUP, "%s: \"partial_rotary_factor\" is not 1: a partial rotary embedding is not "
		                   "implemented by loom", r->path);
	if (!qwen2 && ((rc = get_bool(r, "attention_bias", &cfg->attention_bias)) ||
	               (rc = get_bool(r, "mlp_bias", &cfg->mlp_bias))))
		return rc;
	if (qwen2) {
		int sliding = 0;
		if ((rc = get_bool(r, "use_sliding_window", &sliding)) != LOOM_OK)
			return rc;
		if (sliding)
			return loom_seterr(LOOM_ENOTSUP, "%s: \"use_sliding_window\" is true: Qwen2's sliding-window attention "
			                   "is not implemented by loom", r->path);
	}
	if ((v = loom__json_get(root, "layer_types")) && v->type != JSON_NULL) {
		if (v->type != JSON_ARRAY)
			return loom_seterr(LOOM_EFORMAT, "%s: \"layer_types\" is a %s, expected a list", r->path,
			                   loom__json_type_name(v->type));
		for (int i = 0; i < v->n; i++)
			if (v->kids[i].type != JSON_STRING || strcmp(v->kids[i].s, "full_attention") != 0)
				return loom_seterr(LOOM_ENOTSUP, "%s: \"layer_types\"[%d] is not \"full_attention\": other attention "
				                   "types are not implemented by loom", r->path, i);
	}
	/* the rope: rope_theta + rope_scaling, or rope_parameters (transformers 5), not both disagreeing */
	rs = loom__json_get(root, "rope_scaling");
	rp = loom__json_get(root, "rope_parameters");
	if (rp && rp->type != JSON_NULL) {
		double theta_top = 0;
		if ((rc = parse_rope(r, rp, "rope_parameters", cfg)) != LOOM_OK)
			return rc;
		if ((rc = get_num(r, root, "", "rope_theta", 0, 0, &theta_top)) != LOOM_OK)
			return rc;
		if (theta_top != 0 && theta_top != cfg->rope_theta)
			return loom_seterr(LOOM_EFORMAT, "%s: \"rope_theta\" %.17g and \"rope_parameters.rope_theta\" %.17g "
			                   "disagree", r->path, theta_top, cfg->rope_theta);
		if (rs && rs->type != JSON_NULL)
			return loom_seterr(LOOM_EFORMAT, "%s: both \"rope_scaling\" and \"rope_parameters\" are given; give "
			                   "one", r->path);
		if (info)
			info->rope_parameters = 1;
	} else {
		if ((rc = get_num(r, root, "", "rope_theta", 0, 0, &cfg->rope_theta)) != LOOM_OK)
			return rc;
		if (rs && rs->type != JSON_NULL && (rc = parse_rope(r, rs, "rope_scaling", cfg)) != LOOM_OK)
			return rc;
	}
	if ((rc = get_token(r, "bos_token_id", cfg->vocab_size, &cfg->bos_token_id, &bos_set)) ||
	    (rc = get_token(r, "eos_token_id", cfg->vocab_size, &cfg->eos_token_id, &eos_set)))
		return rc;
	if (bos_set || eos_set) { /* one given: it stands for both */
		cfg->has_token_ids = 1;
		if (!bos_set)
			cfg->bos_token_id = cfg->eos_token_id;
		if (!eos_set)
			cfg->eos_token_id = cfg->bos_token_id;
	}
	if (info) {
		v = loom__json_get(root, "torch_dtype");
		if (!v || v->type != JSON_STRING)
			v = loom__json_get(root, "dtype");
		if (v && v->type == JSON_STRING)
			snprintf(info->torch_dtype, sizeof info->torch_dtype, "%s", v->s);
	}
	/* the shapes' consistency, which the parameter table relies on */
	if (cfg->n_kv_head == 0)
		cfg->n_kv_head = cfg->n_head;
	if (cfg->n_head % cfg->n_kv_head != 0)
		return loom_seterr(LOOM_EFORMAT, "%s: \"num_attention_heads\" %d is not a multiple of \"num_key_value_heads\" "
		                   "%d", r->path, cfg->n_head, cfg->n_kv_head);
	if (cfg->head_dim == 0 && cfg->n_embd % cfg->n_head != 0)
		return loom_seterr(LOOM_EFORMAT, "%s: \"hidden_size\" %d is not a multiple of \"num_attention_heads\" %d (and "
		                   "no \"head_dim\")", r->path, cfg->n_embd, cfg->n_head);
	if ((cfg->head_dim ? cfg->head_dim : cfg->n_embd / cfg->n_head) % 2 != 0)
		return loom_seterr(LOOM_EFORMAT, "%s: the head dimension %d is odd (the rotary embedding pairs dimensions)",
		                   r->path, cfg->head_dim ? cfg->head_dim : cfg->n_embd / cfg->n_head);
	if ((long)cfg->n_head * (cfg->head_dim ? cfg->head_dim : cfg->n_embd / cfg->n_head) > 4L * LOOM_MODEL_MAX_EMBD)
		return loom_seterr(LOOM_EFORMAT, "%s: num_attention_heads x head_dim is outside loom's limit %d", r->path,
		                   4 * LOOM_MODEL_MAX_EMBD);
	return LOOM_OK;
}

int loom_hf_config_parse(const char *text, size_t len, const char *what, loom_model_config_t *cfg,
                         loom_hf_info_t *info)
{
	json_t root;
	char err[200];
	int rc = loom__json_parse_max(text, len, 1L << 16, &root, err, sizeof err);
	if (rc != 0) {
		loom__json_free(&root);
		return loom_seterr(rc == LOOM_ENOMEM ? rc : LOOM_EFORMAT, "%s: bad JSON: %s", what, err);
	}
	cfgr_t r = {what, &root};
	rc = parse_llama(&r, cfg, info);
	loom__json_free(&root);
	return rc;
}

int loom_hf_config_read(const char *path, loom_model_config_t *cfg, loom_hf_info_t *info)
{
	char *text;
	size_t len;
	int rc = loom__read_file_max(path, LOOM_MODEL_CONFIG_JSON_MAX, &text, &len);
	if (rc != LOOM_OK)
		return rc;
	rc = loom_hf_config_parse(text, len, path, cfg, info);
	free(text);
	return rc;
}

/* x as Python's repr(float) writes it (json.dumps uses it): the shortest digits that read back as x,
 * positional for exponents in [-4, 16) with at least one decimal, else d.ddde-XX. */
static void py_float(FILE *f, double x)
{
	char buf[40];
	int p, e;
	for (p = 1; p < 17; p++) {
		snprintf(buf, sizeof buf, "%.*e", p - 1, x);
		if (strtod(buf, NULL) == x)
			break;
	}
	snprintf(buf, sizeof buf, "%.*e", p - 1, x);
	e = atoi(strchr(buf, 'e') + 1);
	if (e >= -4 && e < 16) {
		int dec = p - 1 - e > 0 ? p - 1 - e : 0;
		fprintf(f, dec ? "%.*f" : "%.*f.0", dec, x);
	} else {
		fputs(buf, f);
	}
}

/* The llama family's config.json into f (transformers' keys, sorted as its to_json_string sorts them). */
static int write_llama(FILE *f, const char *path, const loom_model_config_t *c, const char *torch_dtype, int eot)
{
	int hd = c->head_dim ? c->head_dim : c->n_embd / c->n_head, kv = c->n_kv_head ? c->n_kv_head : c->n_head;
	int bos = c->has_token_ids ? c->bos_token_id : eot, eos = c->has_token_ids ? c->eos_token_id : eot;
	double eps = c->rms_norm_eps > 0 ? c->rms_norm_eps : 1e-6, theta = c->rope_theta > 0 ? c->rope_theta : 10000;
	if (c->qwen2 && (c->attention_bias || c->mlp_bias))
		return loom_seterr(LOOM_EINVAL, "%s: Qwen2's config cannot express %s (Qwen2 has biases on q, k and v only)",
		                   path, c->attention_bias ? "attention_bias (a bias on o)" : "mlp_bias");
	if (!c->qwen2 && c->qkv_bias && !c->attention_bias)
		return loom_seterr(LOOM_EINVAL, "%s: Llama's config cannot express biases on q, k and v only (attention_bias "
		                   "puts one on o too; that is Qwen2's layout: set qwen2)", path);
	fprintf(f, "{\n  \"architectures\": [\n    \"%s\"\n  ],\n", c->qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM");
	if (!c->qwen2)
		fprintf(f, "  \"attention_bias\": %s,\n", c->attention_bias ? "true" : "false");
	fprintf(f, "  \"attention_dropout\": 0.0,\n  \"bos_token_id\": %d,\n  \"eos_token_id\": %d,\n", bos, eos);
	if (!c->qwen2 || c->head_dim)
		fprintf(f, "  \"head_dim\": %d,\n", hd);
	fprintf(f, "  \"hidden_act\": \"silu\",\n  \"hidden_size\": %d,\n  \"initializer_range\": 0.02,\n"
	           "  \"intermediate_size\": %d,\n  \"max_position_embeddings\": %d,\n",
	        c->n_embd, c->intermediate_size, c->seq_len);
	if (c->qwen2)
		fprintf(f, "  \"max_window_layers\": %d,\n", c->n_layer);
	else
		fprintf(f, "  \"mlp_bias\": %s,\n", c->mlp_bias ? "true" : "false");
	fprintf(f, "  \"model_type\": \"%s\",\n  \"num_attention_heads\": %d,\n  \"num_hidden_layers\": %d,\n"
	           "  \"num_key_value_heads\": %d,\n", c->qwen2 ? "qwen2" : "llama", c->n_head, c->n_layer, kv);
	if (!c->qwen2)
		fputs("  \"pretraining_tp\": 1,\n", f);
	fputs("  \"rms_norm_eps\": ", f);
	py_float(f, eps);
	fputs(",\n  \"rope_scaling\": ", f);
	if (c->rope_scaling.type == LOOM_ROPE_LLAMA3) {
		fputs("{\n    \"factor\": ", f);
		py_float(f, c->rope_scaling.factor);
		fputs(",\n    \"high_freq_factor\": ", f);
		py_float(f, c->rope_scaling.high_freq_factor);
		fputs(",\n    \"low_freq_factor\": ", f);
		py_float(f, c->rope_scaling.low_freq_factor);
		fprintf(f, ",\n    \"original_max_position_embeddings\": %d,\n    \"rope_type\": \"llama3\"\n  }",
		        c->rope_scaling.original_max_position_embeddings);
	} else {
		fputs("null", f);
	}
	fputs(",\n  \"rope_theta\": ", f);
	py_float(f, theta);
	fputs(",\n", f);
	if (c->qwen2)
		fputs("  \"sliding_window\": null,\n", f);
	fprintf(f, "  \"tie_word_embeddings\": %s,\n  \"torch_dtype\": \"%s\",\n  \"use_cache\": true,\n",
	        c->tie_word_embeddings ? "true" : "false", torch_dtype);
	if (c->qwen2)
		fputs("  \"use_sliding_window\": false,\n", f);
	fprintf(f, "  \"vocab_size\": %d\n}\n", c->vocab_size);
	return LOOM_OK;
}

static int llama_eot(const char *path, const loom_model_config_t *cfg, int *eot)
{
	if (cfg->arch != LOOM_ARCH_LLAMA || cfg->n_embd <= 0 || cfg->n_head <= 0 || cfg->n_layer <= 0 ||
	    cfg->vocab_size <= 0 || cfg->seq_len <= 0 || cfg->intermediate_size <= 0)
		return loom_seterr(LOOM_EINVAL, "%s: not a complete llama configuration (sizes, intermediate_size)", path);
	if (*eot < 0)
		*eot = cfg->vocab_size - 1;
	if (*eot >= cfg->vocab_size)
		return loom_seterr(LOOM_EINVAL, "%s: end-of-text token %d outside the vocabulary of %d", path, *eot,
		                   cfg->vocab_size);
	return LOOM_OK;
}

int loom_hf_config_write(const char *path, const loom_model_config_t *cfg, const char *torch_dtype, int eot)
{
	atomic_file_t af;
	int rc;
	if ((rc = llama_eot(path, cfg, &eot)) != LOOM_OK || (rc = loom__atomic_open(&af, path)) != LOOM_OK)
		return rc;
	if ((rc = write_llama(af.f, path, cfg, torch_dtype ? torch_dtype : "float32", eot)) != LOOM_OK) {
		loom__atomic_abort(&af);
		return rc;
	}
	return loom__atomic_commit(&af);
}

int loom__hf_config_text(const loom_model_config_t *cfg, const char *torch_dtype, int eot, char **text)
{
	size_t len;
	FILE *f;
	int rc;
	*text = NULL;
	if ((rc = llama_eot("config", cfg, &eot)) != LOOM_OK)
		return rc;
	if (!(f = open_memstream(text, &len)))
		return loom_seterr(LOOM_ENOMEM, "config.json text: out of memory");
	rc = write_llama(f, "config", cfg, torch_dtype, eot);
	if (fclose(f) != 0 && rc == LOOM_OK)
		rc = loom_seterr(LOOM_ENOMEM, "config.json text: out of memory");
	if (rc != LOOM_OK) {
		free(*text);
		*text = NULL;
	}
	return rc;
}
