/* llama.c: the Llama / Qwen2 family's table (loom/model.h). This commit has the configuration level
 * only (llama_layout.c: checks, the parameter table, sizes, FLOPs, tensor-parallel shards); creating
 * a model is refused until the passes land. */
#include "core/util.h"
#include "model/llama/llama.h"
#include "model/llama/llama_model.h"

static int ll_act_bytes(const loom_model_config_t *cfg, const loom_model_opts_t *o, loom_model_act_bytes_t *out)
{
	(void)cfg, (void)o, (void)out;
	return loom_seterr(LOOM_ENOTSUP, "llama: models cannot be created yet (only the parameter table exists)");
}

static int ll_create(loom_model_t **m, const loom_model_config_t *cfg, const loom_model_opts_t *o)
{
	(void)cfg, (void)o;
	*m = NULL;
	return loom_seterr(LOOM_ENOTSUP, "llama: models cannot be created yet (only the parameter table exists)");
}

static const loom_model_family_t llama_family = {
	.name = "llama",
	.arch = LOOM_ARCH_LLAMA,
	.config_check = loom__ll_config_check,
	.num_tensors = loom__ll_num_tensors,
	.tensor_info = loom__ll_tensor_info,
	.num_params = loom__ll_num_params,
	.flops_per_token = loom__ll_flops_per_token,
	.stream_width = loom__ll_stream_width,
	.kv_width = loom__ll_kv_width,
	.tp_check = loom__ll_tp_check,
	.shard_info = loom__ll_shard_info,
	.shard_params = loom__ll_shard_params,
	.tp_shard = loom__ll_tp_shard,
	.tp_unshard = loom__ll_tp_unshard,
	.tp_copy_tensor = loom__ll_tp_copy_tensor,
	.act_bytes = ll_act_bytes,
	.create = ll_create,
	.unit_flops = loom__ll_unit_flops,
};

const loom_model_family_t *loom__llama_family(void)
{
	return &llama_family;
}
