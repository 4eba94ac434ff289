/* hf_config.c: config.json beside a model file: Hugging Face's GPT2Config for GPT-2, nanochat's
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
#include <string.h>

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
