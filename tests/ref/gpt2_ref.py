#!/usr/bin/python3
"""gpt2_ref.py: the PyTorch reference for loom's trainer (run by tests/test_torch_ref.c).

GPT-2 written out in plain torch (embeddings, pre-LayerNorm blocks with causal self-attention and a
GELU-tanh MLP, final LayerNorm, logits tied to wte), with HF's Conv1D layout (y = x W + b, W [in, out])
and the parameter order of include/loom/gpt2.h, so that loom's flat float32 parameter buffer maps onto
it directly. Trains with torch.optim.AdamW (decay only on 2-D weights), clip_grad_norm_ and the
schedule of src/train/schedule.c, on the windows loom's loader reads (window k starts at token k*B*T
of the shard). float32, one thread.

usage: gpt2_ref.py OUTDIR  (OUTDIR/config.json, params.bin and data.bin written by the C test;
writes OUTDIR/torch_losses.txt and OUTDIR/torch_grads1.bin: step 1's gradients, loom's layout)"""
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F


def tensor_table(L, C, T, V):
    """(name, shape) in loom's order: wte, wpe, 12 per layer, ln_f."""
    t = [("wte.weight", (V, C)), ("wpe.weight", (T, C))]
    for i in range(L):
        p = "h.%d." % i
        t += [(p + "ln_1.weight", (C,)), (p + "ln_1.bias", (C,)),
              (p + "attn.c_attn.weight", (C, 3 * C)), (p + "attn.c_attn.bias", (3 * C,)),
              (p + "attn.c_proj.weight", (C, C)), (p + "attn.c_proj.bias", (C,)),
              (p + "ln_2.weight", (C,)), (p + "ln_2.bias", (C,)),
              (p + "mlp.c_fc.weight", (C, 4 * C)), (p + "mlp.c_fc.bias", (4 * C,)),
              (p + "mlp.c_proj.weight", (4 * C, C)), (p + "mlp.c_proj.bias", (C,))]
    return t + [("ln_f.weight", (C,)), ("ln_f.bias", (C,))]


def forward(P, idx, targets, L, H):
    B, T = idx.shape
    C = P["wte.weight"].shape[1]
    x = P["wte.weight"][idx] + P["wpe.weight"][:T]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(L):
        p = "h.%d." % i
        h = F.layer_norm(x, (C,), P[p + "ln_1.weight"], P[p + "ln_1.bias"], 1e-5)
        qkv = h @ P[p + "attn.c_attn.weight"] + P[p + "attn.c_attn.bias"]
        q, k, v = qkv.split(C, dim=2)
        q, k, v = (z.view(B, T, H, C // H).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // H))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + (y @ P[p + "attn.c_proj.weight"] + P[p + "attn.c_proj.bias"])
        h = F.layer_norm(x, (C,), P[p + "ln_2.weight"], P[p + "ln_2.bias"], 1e-5)
        h = F.gelu(h @ P[p + "mlp.c_fc.weight"] + P[p + "mlp.c_fc.bias"], approximate="tanh")
        x = x + (h @ P[p + "mlp.c_proj.weight"] + P[p + "mlp.c_proj.bias"])
    x = F.layer_norm(x, (C,), P["ln_f.weight"], P["ln_f.bias"], 1e-5)
    logits = x @ P["wte.weight"].t()
    return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def lr_at(s, peak, warmup, total, kind, min_frac):
    """src/train/schedule.c, step s from 1."""
    if s <= warmup:
        return peak * s / warmup
    if total <= warmup or kind == "constant":
        return peak
    q = min((s - warmup) / (total - warmup), 1.0)
    lo = peak * min_frac
    if kind == "linear":
        return peak - (peak - lo) * q
    return lo + (peak - lo) * 0.5 * (1.0 + math.cos(math.pi * q))


def main():
    out = sys.argv[1]
    torch.set_num_threads(1)
    cfg = json.load(open(os.path.join(out, "config.json")))
    L, H, C, T, V = cfg["n_layer"], cfg["n_head"], cfg["n_embd"], cfg["seq_len"], cfg["vocab_size"]
    B, Tt, steps = cfg["B"], cfg["T"], cfg["steps"]
    table = tensor_table(L, C, T, V)
    flat = np.fromfile(os.path.join(out, "params.bin"), dtype=np.float32)
    assert flat.size == sum(int(np.prod(s)) for _, s in table), "params.bin has the wrong size"
    P, off = {}, 0
    for name, shape in table:
        n = int(np.prod(shape))
        P[name] = torch.nn.Parameter(torch.from_numpy(flat[off:off + n].copy()).view(*shape))
        off += n
    raw = np.fromfile(os.path.join(out, "data.bin"), dtype=np.int32, count=256)
    # llm.c's shards: uint16 (magic 20240520, version 1) or uint32 (20240801, version 7)
    assert (int(raw[0]), int(raw[1])) in ((20240520, 1), (20240801, 7)), "data.bin is not a shard"
    width = np.uint16 if raw[0] == 20240520 else np.uint32
    tokens = np.fromfile(os.path.join(out, "data.bin"), dtype=width, offset=1024).astype(np.int64)
    assert tokens.size == raw[2]
    W = (tokens.size - 1) // (B * Tt)

    decay = [P[n] for n, s in table if len(s) == 2]
    nodecay = [P[n] for n, s in table if len(s) == 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg["weight_decay"]},
                             {"params": nodecay, "weight_decay": 0.0}],
                            lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]), eps=cfg["eps"])
    losses = []
    for s in range(1, steps + 1):
        k = (s - 1) % W
        win = torch.from_numpy(tokens[k * B * Tt: k * B * Tt + B * Tt + 1])
        x, y = win[:-1].view(B, Tt), win[1:].view(B, Tt)
        opt.zero_grad(set_to_none=True)
        loss = forward(P, x, y, L, H)
        loss.backward()
        if s == 1:
            np.concatenate([P[n].grad.detach().numpy().ravel() for n, _ in table]).astype(np.float32).tofile(
                os.path.join(out, "torch_grads1.bin"))
        norm = torch.nn.utils.clip_grad_norm_([P[n] for n, _ in table], cfg["grad_clip"])
        lr = lr_at(s, cfg["lr"], cfg["warmup"], steps, cfg["schedule"], cfg["min_lr_frac"])
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        losses.append((loss.item(), float(norm), lr))
    with open(os.path.join(out, "torch_losses.txt"), "w") as f:
        for l, n, lr in losses:
            f.write("%.9g %.9g %.9g\n" % (l, n, lr))


if __name__ == "__main__":
    main()
