#!/usr/bin/env python3
"""nanochat_ref.py: a float64 PyTorch reference of nanochat's GPT for tests/test_nanochat.c.

Written from the architecture's description (plain torch ops, no nanochat code): token embedding,
parameter-free RMSNorm, per-layer x / x0 mixing, attention with rotary embeddings (bf16-rounded
tables), QK-norm, grouped kv heads, per-layer sliding windows and gated value embeddings, a relu^2
MLP, an untied lm head with vocabulary padding, softcapped logits and mean cross-entropy.

usage: nanochat_ref.py DIR
DIR holds (written by the test):
  config.json   n_layer, n_head, n_kv_head, n_embd, sequence_len, vocab_size, window_pattern,
                short_window (0: sequence_len / 2), B, T
  tensors.txt   one line per tensor: name offset dim0 [dim1]
  params.bin    float32, the flat parameter buffer
  inputs.bin    int32 (B,T) token ids; targets.bin likewise
Writes (float64 files): loss.bin (1), logits.bin (B,T,V), grads.bin (the flat layout) computed in
float64, and loss_f32.bin, logits_f32.bin, grads_f32.bin, the same computed in float32.
nanochat_train_ref.py imports forward() and read_layout()."""
import json
import math
import os
import sys

import numpy as np
import torch

DT = torch.float64  # the precision of the pass being run (run() sets it)


def rmsnorm(x, eps=1.1920929e-07):
    return x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps)


def rotary_tables(T, D):
    # as nanochat computes them: float32 frequencies and angles, then rounded to bfloat16
    i = torch.arange(0, D, 2, dtype=torch.float32)
    inv = 1.0 / (10000 ** (i / D))
    ang = torch.outer(torch.arange(T, dtype=torch.float32), inv)
    return ang.cos().bfloat16().to(DT), ang.sin().bfloat16().to(DT)


def rotate(x, cos, sin):
    # x (B,T,H,D); cos, sin (T, D/2)
    h = x.shape[-1] // 2
    a, b = x[..., :h], x[..., h:]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat([a * c + b * s, b * c - a * s], dim=-1)


def windows_of(cfg):
    """Per-layer windows: the pattern tiled, the last layer long; S = short_window (0: sequence_len // 2)."""
    L = cfg["n_layer"]
    pattern, S = cfg["window_pattern"].upper(), cfg["short_window"] or cfg["sequence_len"] // 2
    windows = [S if pattern[i % len(pattern)] == "S" else cfg["sequence_len"] for i in range(L)]
    windows[-1] = cfg["sequence_len"]
    return windows


def forward(P, idx, tgt, cfg):
    """The mean cross-entropy loss and the (B,T,V) logits of the model whose parameters are P (name ->
    tensor of dtype DT) on the tokens idx, targets tgt ((B,T) long tensors)."""
    L, NH, NKV, C = cfg["n_layer"], cfg["n_head"], cfg["n_kv_head"], cfg["n_embd"]
    V = cfg["vocab_size"]
    B, T = idx.shape
    windows = windows_of(cfg)
    D = C // NH
    cos, sin = rotary_tables(T, D)
    pos = torch.arange(T)
    diff = pos[:, None] - pos[None, :]  # query t minus key s

    x = rmsnorm(P["transformer.wte.weight"][idx])
    x0 = x
    for i in range(L):
        pre = "transformer.h.%d." % i
        x = P["resid_lambdas"][i] * x + P["x0_lambdas"][i] * x0
        xn = rmsnorm(x)
        q = (xn @ P[pre + "attn.c_q.weight"].T).view(B, T, NH, D)
        k = (xn @ P[pre + "attn.c_k.weight"].T).view(B, T, NKV, D)
        v = (xn @ P[pre + "attn.c_v.weight"].T).view(B, T, NKV, D)
        ve_name = "value_embeds.%d.weight" % i
        if ve_name in P:
            gate = 2 * torch.sigmoid(xn[..., :32] @ P[pre + "attn.ve_gate.weight"].T)  # (B,T,NKV)
            v = v + gate[..., None] * P[ve_name][idx].view(B, T, NKV, D)
        q, k = rmsnorm(rotate(q, cos, sin)), rmsnorm(rotate(k, cos, sin))
        rep = NH // NKV
        k = k.repeat_interleave(rep, dim=2)
        v = v.repeat_interleave(rep, dim=2)
        s = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(D)
        allowed = (diff >= 0) & (diff <= windows[i])
        s = s.masked_fill(~allowed, float("-inf"))
        y = torch.einsum("bhts,bshd->bthd", torch.softmax(s, dim=-1), v).reshape(B, T, NH * D)
        x = x + y @ P[pre + "attn.c_proj.weight"].T
        h = torch.relu(rmsnorm(x) @ P[pre + "mlp.c_fc.weight"].T) ** 2
        x = x + h @ P[pre + "mlp.c_proj.weight"].T
    z = rmsnorm(x) @ P["lm_head.weight"].T
    z = z[..., :V]
    z = 15 * torch.tanh(z / 15)
    loss = torch.nn.functional.cross_entropy(z.reshape(-1, V), tgt.reshape(-1))
    return loss, z


def read_layout(d):
    """DIR/tensors.txt as (name, offset, shape) tuples, in the flat buffer's order."""
    layout = []
    for line in open(os.path.join(d, "tensors.txt")):
        f = line.split()
        layout.append((f[0], int(f[1]), [int(x) for x in f[2:]]))
    return layout


def run(d, dtype):
    """The loss, logits and flat gradients of DIR's model and batch, computed in dtype."""
    global DT
    DT = dtype
    torch.set_default_dtype(dtype)
    cfg = json.load(open(os.path.join(d, "config.json")))
    B, T = cfg["B"], cfg["T"]
    flat = np.fromfile(os.path.join(d, "params.bin"), dtype=np.float32).astype(np.float64)
    P = {}
    layout = []
    for name, off, shape in read_layout(d):
        n = int(np.prod(shape))
        P[name] = torch.tensor(flat[off:off + n].reshape(shape), dtype=DT, requires_grad=True)
        layout.append((name, off, n))
    idx = torch.tensor(np.fromfile(os.path.join(d, "inputs.bin"), dtype=np.int32).reshape(B, T)).long()
    tgt = torch.tensor(np.fromfile(os.path.join(d, "targets.bin"), dtype=np.int32).reshape(B, T)).long()
    loss, z = forward(P, idx, tgt, cfg)
    loss.backward()

    g = np.zeros(flat.shape[0], dtype=np.float64)
    for name, off, n in layout:
        gr = P[name].grad
        if gr is not None:
            g[off:off + n] = gr.double().numpy().reshape(-1)
    return loss.item(), z.detach().double().numpy(), g


def main():
    d = sys.argv[1]
    loss, logits, g = run(d, torch.float64)
    np.array([loss], dtype=np.float64).tofile(os.path.join(d, "loss.bin"))
    logits.tofile(os.path.join(d, "logits.bin"))
    g.tofile(os.path.join(d, "grads.bin"))
    # the same in float32: how far float32 arithmetic alone lands from float64, the test's yardstick
    loss32, logits32, g32 = run(d, torch.float32)
    np.array([loss32], dtype=np.float64).tofile(os.path.join(d, "loss_f32.bin"))
    logits32.tofile(os.path.join(d, "logits_f32.bin"))
    g32.tofile(os.path.join(d, "grads_f32.bin"))


if __name__ == "__main__":
    main()
