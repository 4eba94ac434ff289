/* layout.c: GPT-2 configuration presets and the parameter tensor table (names, shapes, offsets, the
 * unit that uses each tensor, weight decay, the tensor-parallel split dimension).
 *
 * The table is the one place that knows the order and shapes of GPT-2's tensors; checkpoints,
 * the optimizer (weight decay), data-parallel bucketing and the sharding strategies all read it from
 * here, so they need not know which model they train. */
#include <stdio.h>
#include <string.h>

#include "core/util.h"
#include "loom/gpt2.h"

int loom_gpt2_preset(const char *name, loom_gpt2_config_t *cfg)
{
	static const struct {
		const char *name;
		loom_gpt2_config_t cfg;
	} presets[] = {
		{"tiny", {4, 4, 128, 128, 257}},
		{"small", {6, 6, 384, 256, 50257}},
		{"gpt2", {12, 12, 768, 1024, 50257}},
	};
	for (size_t i = 0; i < LOOM_ARRAY_LEN(presets); i++) {
		if (strcmp(presets[i].name, name) == 0) {
			*cfg = presets[i].cfg;
			return LOOM_OK;
		}
	}
	return loom_seterr(LOOM_EINVAL, "unknown model preset '%s' (expected tiny, small or gpt2)", name);
}

int loom_gpt2_config_check(const loom_gpt2_config_t *cfg)
{
	if (cfg->arch != LOOM_ARCH_GPT2)
		return loom_seterr(LOOM_EINVAL, "model config: arch %s is not GPT-2's", loom_arch_name(cfg->arch));
	if (cfg->n_layer <= 0 || cfg->n_head <= 0 || cfg->n_embd <= 0 || cfg->seq_len <= 0 || cfg->vocab_size <= 0)
		return loom_seterr(LOOM_EINVAL, "model config: n_layer=%d n_head=%d n_embd=%d seq_len=%d vocab_size=%d "
		                   "(all must be positive)", cfg->n_layer, cfg->n_head, cfg->n_embd, cfg->seq_len,
		                   cfg->vocab_size);
	if (cfg->n_embd % cfg->n_head != 0)
		return loom_seterr(LOOM_EINVAL, "model config: n_embd=%d is not divisible by n_head=%d", cfg->n_embd,
		                   cfg->n_head);
	return LOOM_OK;
}

int loom_gpt2_num_tensors(const loom_gpt2_config_t *cfg)
{
	return 2 + LOOM_GPT2_LAYER_TENSORS * cfg->n_layer + 2;
}

/* Shape of layer tensor j; `kind` suffix and dims in units of C. */
static const struct {
	const char *suffix;
	int ndim;
	int rows, cols; /* multiples of C (rows only for 2-D) */
	int tp_dim;     /* Megatron split: column-parallel weights dim 1 and biases dim 0, row-parallel dim 0 */
} layer_tensors[LOOM_GPT2_LAYER_TENSORS] = {
	{"ln_1.weight", 1, 1, 0, -1},       {"ln_1.bias", 1, 1, 0, -1},
	{"attn.c_attn.weight", 2, 1, 3, 1}, {"attn.c_attn.bias", 1, 3, 0, 0},
	{"attn.c_proj.weight", 2, 1, 1, 0}, {"attn.c_proj.bias", 1, 1, 0, -1},
	{"ln_2.weight", 1, 1, 0, -1},       {"ln_2.bias", 1, 1, 0, -1},
	{"mlp.c_fc.weight", 2, 1, 4, 1},    {"mlp.c_fc.bias", 1, 4, 0, 0},
	{"mlp.c_proj.weight", 2, 4, 1, 0},  {"mlp.c_proj.bias", 1, 1, 0, -1},
};

static size_t layer_numel(size_t C)
{
	size_t n = 0;
	for (int j = 0; j < LOOM_GPT2_LAYER_TENSORS; j++)
		n += layer_tensors[j].ndim == 2 ? layer_tensors[j].rows * C * layer_tensors[j].cols * C
		                                : layer_tensors[j].rows * C;
	return n;
}

int loom_gpt2_tensor_info(const loom_gpt2_config_t *cfg, int i, loom_tensor_info_t *info)
{
	size_t C = (size_t)cfg->n_embd, V = (size_t)cfg->vocab_size, T = (size_t)cfg->seq_len;
	int n = loom_gpt2_num_tensors(cfg);
	if (i < 0 || i >= n)
		return loom_seterr(LOOM_EINVAL, "tensor index %d out of range [0, %d)", i, n);
	memset(info, 0, sizeof *info);
	if (i == 0) {
		snprintf(info->name, sizeof info->name, "wte.weight");
		info->ndim = 2, info->shape[0] = V, info->shape[1] = C, info->offset = 0, info->decay = 1;
		info->layer = -1, info->tp_dim = 0; /* vocab-parallel */
	} else if (i == 1) {
		snprintf(info->name, sizeof info->name, "wpe.weight");
		info->ndim = 2, info->shape[0] = T, info->shape[1] = C, info->offset = V * C, info->decay = 1;
		info->layer = -1, info->tp_dim = -1;
	} else if (i < n - 2) {
		int l = (i - 2) / LOOM_GPT2_LAYER_TENSORS, j = (i - 2) % LOOM_GPT2_LAYER_TENSORS;
		size_t off = V * C + T * C + (size_t)l * layer_numel(C);
		for (int k = 0; k < j; k++)
			off += layer_tensors[k].ndim == 2 ? layer_tensors[k].rows * C * layer_tensors[k].cols * C
			                                  : layer_tensors[k].rows * C;
		snprintf(info->name, sizeof info->name, "h.%d.%s", l, layer_tensors[j].suffix);
		info->ndim = layer_tensors[j].ndim;
		if (info->ndim == 2)
			info->shape[0] = layer_tensors[j].rows * C, info->shape[1] = layer_tensors[j].cols * C;
		else
			info->shape[0] = layer_tensors[j].rows * C;
		info->offset = off;
		info->decay = info->ndim == 2;
		info->layer = l, info->tp_dim = layer_tensors[j].tp_dim;
	} else {
		snprintf(info->name, sizeof info->name, i == n - 2 ? "ln_f.weight" : "ln_f.bias");
		info->ndim = 1, info->shape[0] = C;
		info->offset = V * C + T * C + (size_t)cfg->n_layer * layer_numel(C) + (size_t)(i - (n - 2)) * C;
		info->layer = cfg->n_layer, info->tp_dim = -1;
	}
	info->numel = info->ndim == 2 ? info->shape[0] * info->shape[1] : info->shape[0];
	/* what the model interface adds (loom/model.h): the tie, the split's kind, the optimizer's view */
	info->head_reads = i == 0;
	info->tp_kind = info->tp_dim < 0 ? LOOM_TP_WHOLE : strstr(info->name, "c_attn") ? LOOM_TP_QKV : LOOM_TP_SPLIT;
	/* under MuonAdamW, everything but the blocks' matrices is AdamW at the AdamW rate (GPT-2's recipe):
	 * nanochat's embedding rate would be far too high for a tied head */
	info->opt_group = i >= 2 && info->ndim == 2 && info->layer < cfg->n_layer ? LOOM_OPT_MATRIX : LOOM_OPT_VECTOR;
	if (info->opt_group == LOOM_OPT_MATRIX) /* Conv1D [in, out]: Muon sees nn.Linear's [out, in] */
		info->transposed = 1, info->rows = (int)info->shape[1], info->cols = (int)info->shape[0];
	else if (info->ndim == 2)
		info->rows = (int)info->shape[0], info->cols = (int)info->shape[1];
	return LOOM_OK;
}

int loom_gpt2_tensor_index(const loom_gpt2_config_t *cfg, const char *name)
{
	loom_tensor_info_t info;
	if (strncmp(name, "transformer.", 12) == 0)
		name += 12;
	for (int i = 0; i < loom_gpt2_num_tensors(cfg); i++) {
		loom_gpt2_tensor_info(cfg, i, &info);
		if (strcmp(info.name, name) == 0)
			return i;
	}
	return -1;
}

size_t loom_gpt2_num_params(const loom_gpt2_config_t *cfg)
{
	size_t C = (size_t)cfg->n_embd;
	return (size_t)cfg->vocab_size * C + (size_t)cfg->seq_len * C + (size_t)cfg->n_layer * layer_numel(C) + 2 * C;
}

double loom_gpt2_flops_per_token(const loom_gpt2_config_t *cfg, int T)
{
	double C = cfg->n_embd, L = cfg->n_layer, V = cfg->vocab_size;
	/* matmul weights per layer: qkv 3C^2 + proj C^2 + fc 4C^2 + proj 4C^2 = 12 C^2; plus lm head V C */
	double matmul_params = L * 12.0 * C * C + V * C;
	/* attention over the causal triangle only (W = seq_len >= T): 12 C (T + 1) / 2 a layer */
	return 6.0 * matmul_params + L * loom_model_attn_flops(cfg->n_embd, T, cfg->seq_len);
}

/* ---- tensor-parallel shards ---------------------------------------------------------------------- */

int loom_gpt2_tp_check(const loom_gpt2_config_t *cfg, int tp)
{
	int rc;
	if ((rc = loom_gpt2_config_check(cfg)) != LOOM_OK)
		return rc;
	if (tp < 1)
		return loom_seterr(LOOM_EINVAL, "tensor parallel: tp = %d must be >= 1", tp);
	if (cfg->n_head % tp != 0)
		return loom_seterr(LOOM_EINVAL, "tensor parallel: the model's %d attention heads are not divisible by tp = %d "
		                   "(attention is split by heads, and with them n_embd %d and the MLP's 4 x n_embd = %d); "
		                   "choose tp among the divisors of %d", cfg->n_head, tp, cfg->n_embd, 4 * cfg->n_embd,
		                   cfg->n_head);
	return LOOM_OK;
}

/* Tensor k of the table as tp ranks hold it (shape and numel of one rank's part; offset unset). */
static int shard_one(const loom_gpt2_config_t *cfg, int tp, int k, loom_tensor_info_t *info)
{
	int rc = loom_gpt2_tensor_info(cfg, k, info);
	if (rc != LOOM_OK)
		return rc;
	if (tp > 1 && info->tp_dim >= 0) {
		size_t S = strstr(info->name, "c_attn") ? 3 : 1, D = info->shape[info->tp_dim];
		info->shape[info->tp_dim] = S * ((D / S + (size_t)tp - 1) / (size_t)tp);
		info->numel = info->ndim == 2 ? info->shape[0] * info->shape[1] : info->shape[0];
	}
	return LOOM_OK;
}

/* The offset is the shard sizes of the tensors before i, in closed form: the two embeddings, whole
 * layers (every layer's tensors have layer 0's sizes), then the tensors before i in its layer or in the
 * tail. A per-tensor walk over everything before i made a caller's loop over the table quadratic (a
 * 96-layer `loom plan --search` spent 10 s here). */
int loom_gpt2_shard_info(const loom_gpt2_config_t *cfg, int tp, int i, loom_tensor_info_t *info)
{
	int rc, n = loom_gpt2_num_tensors(cfg), LT = LOOM_GPT2_LAYER_TENSORS;
	size_t off = 0, layer = 0;
	if (tp < 1)
		tp = 1;
	if (i < 0 || i >= n)
		return loom_seterr(LOOM_EINVAL, "tensor index %d out of range [0, %d)", i, n);
	for (int k = 0; k < 2 && k < i; k++) {
		if ((rc = shard_one(cfg, tp, k, info)) != LOOM_OK)
			return rc;
		off += info->numel;
	}
	if (i > 2) {
		int in_layers = i < n - 2, full = in_layers ? (i - 2) / LT : cfg->n_layer;
		int part = in_layers ? (i - 2) % LT : 0;
		for (int j = 0; j < LT; j++) {
			if ((rc = shard_one(cfg, tp, 2 + j, info)) != LOOM_OK)
				return rc;
			layer += info->numel;
			if (j < part)
				off += info->numel;
		}
		off += (size_t)full * layer;
		for (int k = n - 2; k < i; k++) {
			if ((rc = shard_one(cfg, tp, k, info)) != LOOM_OK)
				return rc;
			off += info->numel;
		}
	}
	if ((rc = shard_one(cfg, tp, i, info)) != LOOM_OK)
		return rc;
	info->offset = off;
	return LOOM_OK;
}

size_t loom_gpt2_shard_params(const loom_gpt2_config_t *cfg, int tp)
{
	loom_tensor_info_t info;
	if (tp <= 1)
		return loom_gpt2_num_params(cfg);
	loom_gpt2_shard_info(cfg, tp, loom_gpt2_num_tensors(cfg) - 1, &info);
	return info.offset + info.numel;
}
