/* loom/llama.h: the Llama / Qwen2 family (transformers' LlamaForCausalLM and Qwen2ForCausalLM) as a
 * model family: what is specific to it beyond the model interface (loom/model.h), through which it is
 * created and run (arch LOOM_ARCH_LLAMA; its contract is loom/gpt2.h's, units, views and hooks alike).
 *
 * Parameters (transformers' names, nn.Linear's [out, in] shapes; Q = heads x head_dim, KV = kv heads x
 * head_dim, I = intermediate_size), in the flat buffer unit by unit:
 *   unit -1: model.embed_tokens.weight [V,C] (tied: the head reads it too)
 *   block i: model.layers.i.input_layernorm.weight [C], self_attn.q_proj.weight [Q,C] (.bias [Q]),
 *            k_proj [KV,C] (.bias), v_proj [KV,C] (.bias), o_proj [C,Q] (.bias [C]: attention_bias only),
 *            post_attention_layernorm.weight [C], mlp.gate_proj [I,C], up_proj [I,C], down_proj [C,I]
 *            (each .bias with mlp_bias)
 *   unit L:  model.norm.weight [C], lm_head.weight [V,C] (untied only)
 * q, k and v carry biases with attention_bias or qkv_bias (Qwen2), o with attention_bias. The residual
 * stream between units is C floats per position. */
#ifndef LOOM_LLAMA_H
#define LOOM_LLAMA_H

#include "loom/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A named configuration: "smollm2-135m" (HuggingFaceTB/SmolLM2-135M's config.json: hidden 576, 30
 * layers, 9 heads, 3 kv heads, intermediate 1536, vocabulary 49152, tied, rope_theta 1e5, eps 1e-5,
 * 8192 positions), "smollm2-360m" (960, 32 layers, 15 heads, 5 kv heads, 2560), or "tiny" (4 layers of
 * 128, 4 heads, 2 kv heads, intermediate 384, GPT-2's vocabulary 50257, 256 positions, tied, rope_theta
 * 1e4, eps 1e-5: for tests and smoke runs). Fills *cfg; LOOM_EINVAL naming the presets otherwise. */
int loom_llama_preset(const char *name, loom_model_config_t *cfg);
/* "llama3:FACTOR:LOW:HIGH:ORIGINAL" (rope_scaling of type llama3: factor, low_freq_factor,
 * high_freq_factor, original_max_position_embeddings) or "default" into *s; LOOM_EINVAL saying what was
 * expected otherwise. */
int loom_llama_rope_scaling_parse(const char *text, loom_rope_scaling_t *s);

/* One line (no newline) of what a configuration is beyond loom/model.h's first five fields, e.g. "3 kv
 * heads, head_dim 64, intermediate 1536, rope_theta 100000, rms_norm_eps 1e-05, tied embeddings", with
 * the rope scaling and biases when set, into buf (cap bytes, truncated, NUL-terminated). */
void loom_llama_describe(const loom_model_config_t *cfg, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
