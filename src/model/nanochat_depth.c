/* nanochat_depth.c: base_train's --depth sizing (TEMPORARY: the nanochat family's own file replaces it). */
#include <string.h>

#include "core/util.h"
#include "loom/nanochat.h"

int loom_nanochat_depth_config(int depth, int aspect_ratio, int head_dim, int seq_len, int vocab_size,
                               loom_model_config_t *cfg)
{
	aspect_ratio = aspect_ratio ? aspect_ratio : 64, head_dim = head_dim ? head_dim : 128;
	if (depth <= 0 || aspect_ratio <= 0 || head_dim <= 0 || head_dim % 2 || seq_len <= 0 || vocab_size <= 0)
		return loom_seterr(LOOM_EINVAL, "nanochat sizing: depth %d, aspect ratio %d, head dim %d (even), T %d, V %d "
		                   "must be positive", depth, aspect_ratio, head_dim, seq_len, vocab_size);
	memset(cfg, 0, sizeof *cfg);
	cfg->arch = LOOM_ARCH_NANOCHAT;
	cfg->n_layer = depth;
	cfg->n_embd = (depth * aspect_ratio + head_dim - 1) / head_dim * head_dim;
	cfg->n_head = cfg->n_kv_head = cfg->n_embd / head_dim;
	cfg->seq_len = seq_len, cfg->vocab_size = vocab_size;
	return LOOM_OK;
}
