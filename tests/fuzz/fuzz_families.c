/* fuzz_families.c: the model families' configuration-level operations only (what the file readers
 * use: checks, parameter tables, sizes), for the fuzzers, which link the readers without the model's
 * kernels (no BLAS, oneDNN or OpenMP). The library's own tables (gpt2_family.c, nanochat.c, llama.c) hold the
 * same functions and the model's instance operations besides. */
#include "loom/gpt2.h"
#include "model/llama/llama.h"
#include "model/llama/llama_model.h"
#include "model/nanochat/nanochat.h"
#include "model/nanochat/nanochat_model.h"

static int g_width(const loom_model_config_t *cfg)
{
	return cfg->n_embd;
}

static const loom_model_family_t gpt2 = {
	.name = "gpt2", .arch = LOOM_ARCH_GPT2, .config_check = loom_gpt2_config_check,
	.num_tensors = loom_gpt2_num_tensors, .tensor_info = loom_gpt2_tensor_info, .num_params = loom_gpt2_num_params,
	.flops_per_token = loom_gpt2_flops_per_token, .stream_width = g_width, .tp_check = loom_gpt2_tp_check,
	.shard_info = loom_gpt2_shard_info, .shard_params = loom_gpt2_shard_params,
};

static const loom_model_family_t nanochat = {
	.name = "nanochat", .arch = LOOM_ARCH_NANOCHAT, .config_check = loom__nc_config_check,
	.num_tensors = loom__nc_num_tensors, .tensor_info = loom__nc_tensor_info, .num_params = loom__nc_num_params,
	.flops_per_token = loom__nc_flops_per_token, .stream_width = loom__nc_stream_width, .tp_check = loom__nc_tp_check,
	.shard_info = loom__nc_shard_info, .shard_params = loom__nc_shard_params,
};

static const loom_model_family_t llama = {
	.name = "llama", .arch = LOOM_ARCH_LLAMA, .config_check = loom__ll_config_check,
	.num_tensors = loom__ll_num_tensors, .tensor_info = loom__ll_tensor_info, .num_params = loom__ll_num_params,
	.flops_per_token = loom__ll_flops_per_token, .stream_width = loom__ll_stream_width, .kv_width = loom__ll_kv_width,
	.tp_check = loom__ll_tp_check, .shard_info = loom__ll_shard_info, .shard_params = loom__ll_shard_params,
	.unit_flops = loom__ll_unit_flops,
};

const loom_model_family_t *loom__llama_family(void)
{
	return &llama;
}

const loom_model_family_t *loom__gpt2_family(void)
{
	return &gpt2;
}

const loom_model_family_t *loom__nanochat_family(void)
{
	return &nanochat;
}

/* Context parallelism's choice of form lives with its kernels (cp_attention.c), which the fuzzers do not
 * link; iface.c's loom_cp_attention_ring asks it, and no file reader calls that. */
int loom__cp_ring_env(void)
{
	return 1;
}

/* Likewise the attention kernel's precision option (flash.c), which iface.c's create check asks. */
int loom__flash_bf16_env(void)
{
	return 1;
}
