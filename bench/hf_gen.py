"""hf_gen.py DIR [SHARDS]: write a Llama-3.2-1B-shaped Hugging Face directory (hidden 2048, 16
layers, 32 heads, 8 kv heads, head_dim 64, intermediate 8192, vocab 128256, tied: 1.236B
parameters) in BF16, in SHARDS (default 4) shards of about equal size with
model.safetensors.index.json, random N(0, 0.02) weights; safetensors written by hand (8-byte header
length, JSON, data), since the `safetensors` package is not installable here. For bench/hf_load.sh."""
import json, os, struct, sys

import torch

d, nshards = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 4
C, L, H, KV, D, I, V = 2048, 16, 32, 8, 64, 8192, 128256
cfg = {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
       "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": D, "hidden_act": "silu", "hidden_size": C,
       "initializer_range": 0.02, "intermediate_size": I, "max_position_embeddings": 131072, "mlp_bias": False,
       "model_type": "llama", "num_attention_heads": H, "num_hidden_layers": L, "num_key_value_heads": KV,
       "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                               "original_max_position_embeddings": 8192, "rope_type": "llama3"},
       "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16", "vocab_size": V}
shapes = [("model.embed_tokens.weight", [V, C])]
for l in range(L):
    p = "model.layers.%d." % l
    shapes += [(p + "input_layernorm.weight", [C]), (p + "self_attn.q_proj.weight", [H * D, C]),
               (p + "self_attn.k_proj.weight", [KV * D, C]), (p + "self_attn.v_proj.weight", [KV * D, C]),
               (p + "self_attn.o_proj.weight", [C, H * D]), (p + "post_attention_layernorm.weight", [C]),
               (p + "mlp.gate_proj.weight", [I, C]), (p + "mlp.up_proj.weight", [I, C]),
               (p + "mlp.down_proj.weight", [C, I])]
shapes.append(("model.norm.weight", [C]))
numel = lambda s: s[0] * (s[1] if len(s) > 1 else 1)
total = sum(2 * numel(s) for _, s in shapes)
per = total / nshards
groups, cur, acc = [[]], 0, 0
for name, s in shapes:
    if cur + 2 * numel(s) > per * 1.01 and groups[-1] and len(groups) < nshards:
        groups.append([])
        cur = 0
    groups[-1].append((name, s))
    cur += 2 * numel(s)
os.makedirs(d, exist_ok=True)
with open(os.path.join(d, "config.json"), "w") as f:
    json.dump(cfg, f, indent=2, sort_keys=True)
g = torch.Generator().manual_seed(0)
wm = {}
for k, grp in enumerate(groups):
    fn = "model-%05d-of-%05d.safetensors" % (k + 1, len(groups))
    hdr, off = {"__metadata__": {"format": "pt"}}, 0
    for name, s in grp:
        hdr[name] = {"dtype": "BF16", "shape": s, "data_offsets": [off, off + 2 * numel(s)]}
        off += 2 * numel(s)
        wm[name] = fn
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(os.path.join(d, fn), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for name, s in grp:
            t = (torch.randn(s, generator=g) * 0.02).to(torch.bfloat16) if len(s) == 2 else torch.ones(s, dtype=torch.bfloat16)
            f.write(t.view(torch.int16).numpy().tobytes())
with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(wm.items()))}, f, indent=2)
print("%s: %d shards, %d bytes of BF16, %d parameters" % (d, len(groups), total, total // 2))
