/* model_flags.c: the model flags `loom train` and `loom plan` share (the family, a GPT-2 or Llama preset
 * or nanochat's sizing, the size overrides, --init-from: a model file, a checkpoint directory or a
 * --save-dir, resolved by loom_model_path as `loom sample --model` is) and their resolution into one
 * configuration, so that a train command line with `train` replaced by `plan` plans the same model.
 *
 * Each size flag overrides only the field it names. The model's positions (n_positions: GPT-2's wpe
 * rows, nanochat's sequence_len, Llama's max_position_embeddings) are --n-positions when given; else
 * GPT-2 and Llama keep the preset's (tiny's when --model is not given), and nanochat, which has no preset, takes base_train's rule:
 * sequence_len = the training length (--seq-len, else 256). --seq-len, the length trained on, is
 * never more than the positions: an error naming where they came from. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "loom/ckpt.h"
#include "loom/gpt2.h"
#include "loom/llama.h"
#include "loom/nanochat.h"

void cli_model_flags_init(cli_model_flags_t *f)
{
	memset(f, 0, sizeof *f);
	f->mc.n_layer = f->mc.n_head = f->mc.n_embd = f->mc.seq_len = f->mc.vocab_size = -1;
	f->tie = f->attention_bias = f->qkv_bias = f->mlp_bias = -1;
}

static int int_in(const char *cmd, const char *flag, const char *v, long long lo, long long hi)
{
	long long x = cli_parse_int(cmd, flag, v);
	if (x < lo || x > hi)
		cli_die(cmd, "%s: %lld is out of range [%lld, %lld]", flag, x, lo, hi);
	return (int)x;
}

int cli_model_flag(const char *cmd, int argc, char **argv, int *i, cli_model_flags_t *f)
{
	const char *v;
	loom_model_config_t *mc = &f->mc;
#define FLAG(name) cli_flag(argc, argv, i, name, &v)
	if (FLAG("--model")) {
		f->preset = v;
	} else if (FLAG("--arch")) {
		if (loom_arch_parse(v, &mc->arch) != LOOM_OK)
			cli_die(cmd, "--arch: %s", loom_errmsg());
	} else if (FLAG("--depth")) {
		f->depth = int_in(cmd, "--depth", v, 1, 1024), f->have_model_flags = 1;
	} else if (FLAG("--aspect-ratio")) {
		f->aspect = int_in(cmd, "--aspect-ratio", v, 1, 1 << 16);
	} else if (FLAG("--head-dim")) {
		f->head_dim = int_in(cmd, "--head-dim", v, 2, 1 << 16);
	} else if (FLAG("--n-kv-head")) {
		mc->n_kv_head = int_in(cmd, "--n-kv-head", v, 1, 1 << 12), f->have_model_flags = 1;
	} else if (FLAG("--window-pattern")) {
		if (strlen(v) >= sizeof mc->window_pattern || strspn(v, "SL") != strlen(v) || !*v)
			cli_die(cmd, "--window-pattern '%s': expected 1 to %zu of the letters S and L", v,
			        sizeof mc->window_pattern - 1);
		snprintf(mc->window_pattern, sizeof mc->window_pattern, "%s", v), f->have_model_flags = 1;
	} else if (FLAG("--short-window")) {
		mc->short_window = int_in(cmd, "--short-window", v, 1, 1 << 20), f->have_model_flags = 1;
	} else if (FLAG("--n-layer")) {
		mc->n_layer = int_in(cmd, "--n-layer", v, 1, 1 << 12), f->have_model_flags = 1;
	} else if (FLAG("--n-head")) {
		mc->n_head = f->n_head_flag = int_in(cmd, "--n-head", v, 1, 1 << 12), f->have_model_flags = 1;
	} else if (FLAG("--n-embd")) {
		mc->n_embd = int_in(cmd, "--n-embd", v, 1, 1 << 16), f->have_model_flags = 1;
	} else if (FLAG("--vocab-size")) {
		mc->vocab_size = int_in(cmd, "--vocab-size", v, 1, 1 << 24), f->have_model_flags = 1;
	} else if (FLAG("--n-positions")) {
		f->n_positions = int_in(cmd, "--n-positions", v, 1, 1 << 20), f->have_model_flags = 1;
	} else if (FLAG("--init-from")) {
		f->init_from = v;
	} else if (FLAG("--intermediate-size")) {
		mc->intermediate_size = int_in(cmd, "--intermediate-size", v, 1, 1 << 22), f->llama_flags = 1;
	} else if (FLAG("--rope-theta")) {
		mc->rope_theta = cli_parse_double(cmd, "--rope-theta", v), f->llama_flags = 1;
		if (!(mc->rope_theta > 0.0))
			cli_die(cmd, "--rope-theta %s: expected a positive number", v);
	} else if (FLAG("--rms-norm-eps")) {
		mc->rms_norm_eps = cli_parse_double(cmd, "--rms-norm-eps", v), f->llama_flags = 1;
		if (!(mc->rms_norm_eps > 0.0))
			cli_die(cmd, "--rms-norm-eps %s: expected a positive number", v);
	} else if (FLAG("--rope-scaling")) {
		if (loom_llama_rope_scaling_parse(v, &mc->rope_scaling) != LOOM_OK)
			cli_die(cmd, "--rope-scaling: %s", loom_errmsg());
		f->rope_scaling_given = 1, f->llama_flags = 1;
	} else if (FLAG("--tie-word-embeddings")) {
		f->tie = int_in(cmd, "--tie-word-embeddings", v, 0, 1), f->llama_flags = 1;
	} else if (FLAG("--attention-bias")) {
		f->attention_bias = int_in(cmd, "--attention-bias", v, 0, 1), f->llama_flags = 1;
	} else if (FLAG("--qkv-bias")) {
		f->qkv_bias = int_in(cmd, "--qkv-bias", v, 0, 1), f->llama_flags = 1;
	} else if (FLAG("--mlp-bias")) {
		f->mlp_bias = int_in(cmd, "--mlp-bias", v, 0, 1), f->llama_flags = 1;
	} else {
		return 0;
	}
#undef FLAG
	return 1;
}

void cli_model_flags_check(const char *cmd, cli_model_flags_t *f)
{
	const loom_model_config_t *mc = &f->mc;
	if (f->init_from && (f->preset || (f->have_model_flags && !(f->n_head_flag && mc->n_layer < 0 && mc->n_embd < 0 &&
	                                                              mc->vocab_size < 0 && f->n_positions == 0))))
		cli_die(cmd, "--init-from takes the model from the file: drop --model and the model flags "
		        "(only --n-head, when the file does not say it)");
	if (f->init_from && f->llama_flags)
		cli_die(cmd, "--init-from takes the model from the file: drop the llama size flags (--intermediate-size, "
		        "--rope-theta, --rms-norm-eps, --rope-scaling, --tie-word-embeddings, --attention-bias, --qkv-bias, "
		        "--mlp-bias)");
	if (mc->arch == LOOM_ARCH_LLAMA && (f->depth || mc->window_pattern[0] || mc->short_window > 0))
		cli_die(cmd, "--depth, --window-pattern and --short-window are nanochat's; --arch llama is sized by --model "
		        "smollm2-135m|smollm2-360m|tiny and the size flags (every layer attends over the whole prefix)");
	if (mc->arch != LOOM_ARCH_LLAMA && f->llama_flags)
		cli_die(cmd, "--intermediate-size, --rope-theta, --rms-norm-eps, --rope-scaling, --tie-word-embeddings, "
		        "--attention-bias, --qkv-bias and --mlp-bias are llama's: add --arch llama");
	if (mc->arch == LOOM_ARCH_GPT2 && (f->depth || mc->n_kv_head > 0 || mc->window_pattern[0] || mc->short_window > 0))
		cli_die(cmd, "--depth, --n-kv-head, --window-pattern and --short-window are nanochat's: add --arch nanochat "
		        "(--n-kv-head also --arch llama)");
	if (mc->arch == LOOM_ARCH_NANOCHAT && f->preset)
		cli_die(cmd, "--model %s is a GPT-2 preset; nanochat is sized by --depth D (or --n-layer, --n-embd, --n-head)",
		        f->preset);
	if (f->init_from && f->init_from != f->init_file) { /* the same resolution as loom sample --model */
		if (loom_model_path(f->init_from, f->init_file, sizeof f->init_file) != LOOM_OK)
			cli_die(cmd, "--init-from: %s", loom_errmsg());
		f->init_from = f->init_file;
	}
}

void cli_model_resolve(const char *cmd, const cli_model_flags_t *f, int *T, loom_model_config_t *out)
{
	const loom_model_config_t *mc = &f->mc;
	loom_model_config_t c;
	if (f->init_from) {
		if (loom_model_config(f->init_from, f->n_head_flag, &c, NULL) != LOOM_OK)
			cli_die(cmd, "--init-from: %s", loom_errmsg());
	} else if (mc->arch == LOOM_ARCH_NANOCHAT) {
		int len = f->n_positions > 0 ? f->n_positions : *T > 0 ? *T : 256;
		if (!f->depth && (mc->n_layer <= 0 || mc->n_embd <= 0 || mc->n_head <= 0))
			cli_die(cmd, "--arch nanochat: give --depth D (nanochat's sizing) or --n-layer, --n-embd and --n-head");
		if (mc->vocab_size <= 0)
			cli_die(cmd, "--arch nanochat: give --vocab-size V (the tokenizer's vocabulary; it is padded to a "
			        "multiple of 64 inside the model)");
		if (f->depth) {
			if (loom_nanochat_depth_config(f->depth, f->aspect ? f->aspect : 64, f->head_dim ? f->head_dim : 128, len,
			                               mc->vocab_size, &c) != LOOM_OK)
				cli_die(cmd, "--depth %d: %s", f->depth, loom_errmsg());
		} else {
			memset(&c, 0, sizeof c);
			c.arch = LOOM_ARCH_NANOCHAT, c.seq_len = len, c.vocab_size = mc->vocab_size;
		}
		if (mc->n_layer > 0) c.n_layer = mc->n_layer;
		if (mc->n_head > 0) c.n_head = mc->n_head;
		if (mc->n_embd > 0) c.n_embd = mc->n_embd;
		c.n_kv_head = mc->n_kv_head > 0 ? mc->n_kv_head : c.n_kv_head > 0 ? c.n_kv_head : c.n_head;
		c.short_window = mc->short_window > 0 ? mc->short_window : c.seq_len / 2;
		if (mc->window_pattern[0])
			snprintf(c.window_pattern, sizeof c.window_pattern, "%s", mc->window_pattern);
		else if (!c.window_pattern[0])
			snprintf(c.window_pattern, sizeof c.window_pattern, "SSSL");
	} else if (mc->arch == LOOM_ARCH_LLAMA) {
		if (loom_llama_preset(f->preset ? f->preset : "tiny", &c) != LOOM_OK)
			cli_die(cmd, "--model: %s", loom_errmsg());
		if (mc->n_layer > 0) c.n_layer = mc->n_layer;
		if (mc->n_head > 0) c.n_head = mc->n_head;
		if (mc->n_embd > 0) c.n_embd = mc->n_embd;
		if (mc->vocab_size > 0) c.vocab_size = mc->vocab_size;
		if (f->n_positions > 0) c.seq_len = f->n_positions;
		if (mc->n_kv_head > 0) c.n_kv_head = mc->n_kv_head;
		if (f->head_dim > 0) c.head_dim = f->head_dim;
		if (mc->intermediate_size > 0) c.intermediate_size = mc->intermediate_size;
		else if (mc->n_embd > 0) c.intermediate_size = 0; /* Llama's 8C/3 rule for the new width */
		if (mc->rope_theta > 0) c.rope_theta = mc->rope_theta;
		if (mc->rms_norm_eps > 0) c.rms_norm_eps = mc->rms_norm_eps;
		if (f->rope_scaling_given) c.rope_scaling = mc->rope_scaling;
		if (f->tie >= 0) c.tie_word_embeddings = f->tie;
		if (f->attention_bias >= 0) c.attention_bias = f->attention_bias;
		if (f->qkv_bias >= 0) c.qkv_bias = c.qwen2 = f->qkv_bias;
		if (f->mlp_bias >= 0) c.mlp_bias = f->mlp_bias;
	} else {
		if (loom_gpt2_preset(f->preset ? f->preset : "tiny", &c) != LOOM_OK)
			cli_die(cmd, "--model: %s", loom_errmsg());
		if (mc->n_layer > 0) c.n_layer = mc->n_layer;
		if (mc->n_head > 0) c.n_head = mc->n_head;
		if (mc->n_embd > 0) c.n_embd = mc->n_embd;
		if (mc->vocab_size > 0) c.vocab_size = mc->vocab_size;
		if (f->n_positions > 0) c.seq_len = f->n_positions; /* nothing else moves the positions */
	}
	if (loom_model_config_check(&c) != LOOM_OK)
		cli_die(cmd, "%s", loom_errmsg());
	if (*T < 0)
		*T = c.seq_len;
	if (*T > c.seq_len) {
		char from[200];
		if (f->init_from)
			snprintf(from, sizeof from, "the n_positions of --init-from %s", f->init_from);
		else if (f->n_positions > 0)
			snprintf(from, sizeof from, "--n-positions %d", f->n_positions);
		else
			snprintf(from, sizeof from, "the %s preset's n_positions; give --n-positions %d for a model of %d "
			         "positions", f->preset ? f->preset : "tiny", *T, *T);
		cli_die(cmd, "--seq-len %d exceeds the model's maximum sequence length %d (%s)", *T, c.seq_len, from);
	}
	*out = c;
}
