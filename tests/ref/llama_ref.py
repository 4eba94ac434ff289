#!/usr/bin/python3
"""llama_ref.py: a float64 PyTorch reference of the Llama / Qwen2 family for tests/test_llama.c.

Written from the math of transformers' LlamaForCausalLM and Qwen2ForCausalLM (modeling_llama.py,
modeling_qwen2.py, modeling_rope_utils.py), in plain torch ops, with transformers' parameter names:
embedding, RMSNorm with a weight (x / sqrt(mean(x^2) + eps) times the weight), q/k/v/o projections
with optional biases, rotary embeddings in the rotate_half layout (channel j paired with j + D/2) with
rope_theta and the llama3 frequency scaling, grouped-query attention (query head h reads kv head
h // (H / KV)), causal softmax at scale head_dim^-0.5, the SwiGLU MLP down(silu(gate(x)) * up(x)) with
optional biases, the final norm, an lm head that is the embedding when tied, mean cross-entropy.
transformers itself is not installed here (no PyPI), so this is written from the math, not checked
against its classes.

usage: llama_ref.py DIR
DIR holds (written by the test):
  config.json   the model (loom_model_config_t's llama fields, transformers' names) and the run: B, T,
                steps, lr, beta1, beta2, eps, weight_decay
  tensors.txt   one line per tensor: name offset dim0 [dim1]
  params.bin    float32, the flat parameter buffer before the first step
  inputs.bin    int32 (steps, B, T) token ids; targets.bin likewise
Runs `steps` steps of torch.optim.AdamW (weight decay on the 2-D tensors only) and writes (float64):
losses.bin (steps, each before its update), logits.bin (B,T,V of step 0's batch), grads.bin (step 0's
flat gradients) and final.bin (the flat parameters after the last step); then the same run in float32
as losses_f32.bin, grads_f32.bin, final_f32.bin: how far float32 arithmetic alone lands."""
import json
import math
import os
import sys

import numpy as np
import torch

DT = torch.float64


def rmsnorm(x, w, eps):
    return w * (x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps))


def inv_freq(cfg):
    """_compute_default_rope_parameters, then _compute_llama3_parameters for rope_type llama3."""
    D, theta = cfg["head_dim"], cfg["rope_theta"]
    f = [1.0 / theta ** (2 * i / D) for i in range(D // 2)]
    rs = cfg.get("rope_scaling")
    if rs:
        factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        low_wl, high_wl = old / low, old / high
        out = []
        for x in f:
            wl = 2 * math.pi / x
            if wl < high_wl:
                out.append(x)
            elif wl > low_wl:
                out.append(x / factor)
            else:
                s = (old / wl - low) / (high - low)
                out.append((1 - s) * x / factor + s * x)
        f = out
    return torch.tensor(f, dtype=torch.float64)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def forward(P, idx, tgt, cfg):
    """Mean cross-entropy and (B,T,V) logits of parameters P (name -> tensor) on idx, tgt ((B,T) long)."""
    L, NH, NKV, C, D = cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"], \
        cfg["hidden_size"], cfg["head_dim"]
    V, eps = cfg["vocab_size"], cfg["rms_norm_eps"]
    B, T = idx.shape
    ang = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq(cfg))
    emb = torch.cat([ang, ang], dim=-1)
    cos, sin = emb.cos().to(DT)[None, :, None, :], emb.sin().to(DT)[None, :, None, :]
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))

    def lin(x, name):
        y = x @ P[name + ".weight"].T
        if name + ".bias" in P:
            y = y + P[name + ".bias"]
        return y

    x = P["model.embed_tokens.weight"][idx]
    for i in range(L):
        pre = "model.layers.%d." % i
        xn = rmsnorm(x, P[pre + "input_layernorm.weight"], eps)
        q = lin(xn, pre + "self_attn.q_proj").view(B, T, NH, D)
        k = lin(xn, pre + "self_attn.k_proj").view(B, T, NKV, D)
        v = lin(xn, pre + "self_attn.v_proj").view(B, T, NKV, D)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = NH // NKV
        k = k.repeat_interleave(rep, dim=2)
        v = v.repeat_interleave(rep, dim=2)
        s = torch.einsum("bthd,bshd->bhts", q, k) * D ** -0.5
        s = s.masked_fill(~causal, float("-inf"))
        y = torch.einsum("bhts,bshd->bthd", torch.softmax(s, dim=-1), v).reshape(B, T, NH * D)
        x = x + lin(y, pre + "self_attn.o_proj")
        xn = rmsnorm(x, P[pre + "post_attention_layernorm.weight"], eps)
        h = torch.nn.functional.silu(lin(xn, pre + "mlp.gate_proj")) * lin(xn, pre + "mlp.up_proj")
        x = x + lin(h, pre + "mlp.down_proj")
    x = rmsnorm(x, P["model.norm.weight"], eps)
    w = P["lm_head.weight"] if "lm_head.weight" in P else P["model.embed_tokens.weight"]
    z = x @ w.T
    loss = torch.nn.functional.cross_entropy(z.reshape(-1, V), tgt.reshape(-1))
    return loss, z


def read_layout(d):
    layout = []
    for line in open(os.path.join(d, "tensors.txt")):
        f = line.split()
        layout.append((f[0], int(f[1]), [int(x) for x in f[2:]]))
    return layout


def run(d, dtype):
    global DT
    DT = dtype
    cfg = json.load(open(os.path.join(d, "config.json")))
    B, T, steps = cfg["B"], cfg["T"], cfg["steps"]
    flat = np.fromfile(os.path.join(d, "params.bin"), dtype=np.float32).astype(np.float64)
    P, layout = {}, []
    for name, off, shape in read_layout(d):
        n = int(np.prod(shape))
        P[name] = torch.tensor(flat[off:off + n].reshape(shape), dtype=DT, requires_grad=True)
        layout.append((name, off, n))
    idx = torch.tensor(np.fromfile(os.path.join(d, "inputs.bin"), dtype=np.int32).reshape(steps, B, T)).long()
    tgt = torch.tensor(np.fromfile(os.path.join(d, "targets.bin"), dtype=np.int32).reshape(steps, B, T)).long()
    decay = [P[n] for n, _, _ in layout if P[n].dim() == 2]
    nodecay = [P[n] for n, _, _ in layout if P[n].dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg["weight_decay"]},
                             {"params": nodecay, "weight_decay": 0.0}], lr=cfg["lr"],
                            betas=(cfg["beta1"], cfg["beta2"]), eps=cfg["eps"])
    losses, g0, z0 = [], None, None
    for s in range(steps):
        opt.zero_grad()
        loss, z = forward(P, idx[s], tgt[s], cfg)
        loss.backward()
        losses.append(loss.item())
        if s == 0:
            z0 = z.detach().double().numpy()
            g0 = np.zeros(flat.shape[0], dtype=np.float64)
            for name, off, n in layout:
                g0[off:off + n] = P[name].grad.double().numpy().reshape(-1)
        opt.step()
    final = np.zeros(flat.shape[0], dtype=np.float64)
    for name, off, n in layout:
        final[off:off + n] = P[name].detach().double().numpy().reshape(-1)
    return np.array(losses, dtype=np.float64), z0, g0, final


def main():
    d = sys.argv[1]
    torch.set_num_threads(1)
    losses, z, g, final = run(d, torch.float64)
    losses.tofile(os.path.join(d, "losses.bin"))
    z.tofile(os.path.join(d, "logits.bin"))
    g.tofile(os.path.join(d, "grads.bin"))
    final.tofile(os.path.join(d, "final.bin"))
    losses, z, g, final = run(d, torch.float32)
    losses.tofile(os.path.join(d, "losses_f32.bin"))
    g.tofile(os.path.join(d, "grads_f32.bin"))
    final.tofile(os.path.join(d, "final_f32.bin"))


if __name__ == "__main__":
    main()
