/* loom/nanochat.h: nanochat's GPT (karpathy/nanochat, nanochat/gpt.py) as a model family: what is
 * specific to it beyond the model interface (loom/model.h), which is how it is created and run
 * (arch LOOM_ARCH_NANOCHAT; its contract is loom/gpt2.h's, units, views and hooks alike).
 *
 * Parameters (PyTorch's names and [out, in] shapes, V padded to Vp, a multiple of 64, KV = n_kv_head x
 * head_dim), in the flat buffer unit by unit:
 *   unit -1: transformer.wte.weight [Vp,C], resid_lambdas [L], x0_lambdas [L] (both read by every block)
 *   block i: value_embeds.i.weight [Vp,KV] and transformer.h.i.attn.ve_gate.weight [NKV,32] (only on
 *            layers i % 2 == (L-1) % 2), transformer.h.i.attn.c_q.weight [C,C], c_k [KV,C], c_v [KV,C],
 *            c_proj [C,C], transformer.h.i.mlp.c_fc.weight [4C,C], mlp.c_proj.weight [C,4C]
 *   unit L:  lm_head.weight [Vp,C]
 * The residual stream between units is 2C floats per position, [x | x0]. */
#ifndef LOOM_NANOCHAT_H
#define LOOM_NANOCHAT_H

#include "loom/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* nanochat's base_train sizing from --depth: C = depth x aspect_ratio rounded up to a multiple of
 * head_dim, n_head = n_kv_head = C / head_dim, n_layer = depth, window pattern "SSSL" (nanochat's
 * defaults: aspect_ratio 64, head_dim 128; 0 takes them). Fills *cfg (arch nanochat, every other
 * field zero); LOOM_EINVAL (with loom_errmsg) for a non-positive size or an odd head_dim. */
int loom_nanochat_depth_config(int depth, int aspect_ratio, int head_dim, int seq_len, int vocab_size,
                               loom_model_config_t *cfg);

#ifdef __cplusplus
}
#endif
#endif
