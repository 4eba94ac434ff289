#!/usr/bin/python3
"""nanochat_train_ref.py: float64 PyTorch reference of a few nanochat training steps, for
tests/test_nanochat_e2e.c.

The model is nanochat_ref.py's (forward), the optimizer either torch.optim.AdamW itself (weight decay
on the 2-D tensors) or muon_ref.py's MuonAdamW (Muon on the blocks' matrices, setup_optimizer's AdamW
groups on the rest). The test gives the knobs, not their values: this script computes the learning
rate schedules (src/train/schedule.c's cosine, base_train's get_lr_multiplier), the batch scaling of
the rates and the horizon scaling of the weight decay from base_train's formulas, and assigns the
optimizer groups from the tensor names as setup_optimizer does, so a wrong multiplier, scale or group
in loom shows up as a difference.

usage: nanochat_train_ref.py DIR
DIR holds (written by the test):
  config.json   the model (as nanochat_ref.py's) and the run: B, T, steps, accum, grad_scale (each
                micro-batch's loss is back-propagated times it), optimizer "adamw" or "muon" and
                  adamw: lr, warmup, min_lr_frac (cosine), weight_decay, beta1, beta2, eps
                  muon:  muon (loom_muon_config_t's fields, before any scaling), schedule ("constant" or
                         "warmdown"), warmup (iterations), warmdown_frac, min_lr_frac, lr_scale ("none"
                         or "sqrt"), wd_scale (0/1), D_ref
  tensors.txt   one line per tensor: name offset dim0 [dim1]
  params.bin    float32, the flat parameter buffer before the first step
  inputs.bin    int32 (steps, accum, B, T) token ids; targets.bin likewise
Writes (float64): losses.bin (steps: each step's mean micro-batch loss, before its update),
sched.bin (steps: the learning rate, adamw, or every group's multiplier, muon), scales.bin (the rate
factor and Muon's weight decay at step 0; 1 and adamw's weight decay under adamw) and final.bin (the
flat parameters after the last step); then losses_f32.bin and final_f32.bin, the same run in float32
(torch's AdamW, muon_ref.py's MuonAdamW), the yardstick of how far float32 arithmetic alone lands."""
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import muon_ref  # noqa: E402  (sets float64 as the default dtype)
import nanochat_ref  # noqa: E402

B_REF = 2 ** 19  # nanochat's reference batch in tokens


def cosine_lr(cfg, s):
    """src/train/schedule.c's warmup + cosine at step s (from 1)."""
    P, W, N = cfg["lr"], cfg["warmup"], cfg["steps"]
    F = P * cfg["min_lr_frac"]
    if s <= W:
        return P * s / W
    q = min((s - W) / (N - W), 1.0)
    return F + (P - F) * 0.5 * (1 + math.cos(math.pi * q))


def lr_multiplier(cfg, it):
    """base_train's get_lr_multiplier at iteration it (from 0), with the warmup given in iterations."""
    if cfg["schedule"] == "constant":
        return 1.0
    N = cfg["steps"]
    warmup, warmdown = cfg["warmup"], round(cfg["warmdown_frac"] * N)
    if it < warmup:
        return (it + 1) / warmup
    if it <= N - warmdown:
        return 1.0
    progress = (N - it) / warmdown
    return progress * 1.0 + (1 - progress) * cfg["min_lr_frac"]


def group_of(name):
    """setup_optimizer's group of a tensor, by its name."""
    if name.startswith("transformer.h."):
        return muon_ref.MATRIX
    if name == "transformer.wte.weight" or name.startswith("value_embeds."):
        return muon_ref.EMBED
    if name == "lm_head.weight":
        return muon_ref.UNEMBED
    return {"resid_lambdas": muon_ref.SCALAR, "x0_lambdas": muon_ref.X0}[name]


def train(d, cfg, dtype):
    """The run in dtype: (losses, schedule values, [rate factor, weight decay], final flat parameters)."""
    torch.set_default_dtype(dtype)
    nanochat_ref.DT = dtype
    B, T, steps, accum, gs = cfg["B"], cfg["T"], cfg["steps"], cfg["accum"], cfg["grad_scale"]
    layout = nanochat_ref.read_layout(d)
    flat0 = np.fromfile(os.path.join(d, "params.bin"), dtype=np.float32).astype(np.float64)
    N = flat0.shape[0]
    P = {}
    for name, off, shape in layout:
        n = int(np.prod(shape))
        P[name] = torch.tensor(flat0[off:off + n].reshape(shape), dtype=dtype, requires_grad=True)
    idx = torch.tensor(np.fromfile(os.path.join(d, "inputs.bin"), dtype=np.int32)).long().view(steps, accum, B, T)
    tgt = torch.tensor(np.fromfile(os.path.join(d, "targets.bin"), dtype=np.int32)).long().view(steps, accum, B, T)

    if cfg["optimizer"] == "adamw":
        decay = [P[n] for n, _, shape in layout if len(shape) == 2]
        rest = [P[n] for n, _, shape in layout if len(shape) != 2]
        opt = torch.optim.AdamW([dict(params=decay, weight_decay=cfg["weight_decay"]),
                                 dict(params=rest, weight_decay=0.0)],
                                lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]), eps=cfg["eps"])
        scales = [1.0, cfg["weight_decay"]]
    else:
        mc = dict(cfg["muon"])
        tokens = B * T * accum
        f = math.sqrt(tokens / B_REF) if cfg["lr_scale"] == "sqrt" else 1.0
        for key in ("matrix_lr", "embedding_lr", "unembedding_lr", "scalar_lr", "adamw_lr"):
            mc[key] *= f
        if cfg["wd_scale"]:  # base_train: wd sqrt(B / B_ref) (D_ref / D), D = the run's tokens
            mc["weight_decay"] *= math.sqrt(tokens / B_REF) * (cfg["D_ref"] / (steps * tokens))
        mc["total_steps"] = steps
        tensors = []
        for name, off, shape in layout:
            rows, cols = (shape[0], shape[1]) if len(shape) == 2 else (0, 0)
            tensors.append(dict(name=name, group=group_of(name), offset=off, numel=int(np.prod(shape)),
                                rows=rows, cols=cols, transposed=0))
        opt = muon_ref.MuonAdamW(tensors, mc, N)
        scales = [f, mc["weight_decay"]]

    losses, sched = [], []
    for k in range(steps):
        for p in P.values():
            p.grad = None
        total = 0.0
        for j in range(accum):
            loss, _ = nanochat_ref.forward(P, idx[k, j], tgt[k, j], cfg)
            (loss * gs).backward()
            total += loss.item()
        losses.append(total / accum)
        if cfg["optimizer"] == "adamw":
            lr = cosine_lr(cfg, k + 1)
            for g in opt.param_groups:
                g["lr"] = lr
            opt.step()
            sched.append(lr)
        else:
            lrm = lr_multiplier(cfg, k)
            flat, G = torch.zeros(N), torch.zeros(N)
            for name, off, shape in layout:
                n = int(np.prod(shape))
                flat[off:off + n] = P[name].detach().reshape(-1)
                if P[name].grad is not None:
                    G[off:off + n] = P[name].grad.reshape(-1)
            opt.step(flat, G, k, lrm)
            with torch.no_grad():
                for name, off, shape in layout:
                    P[name].copy_(flat[off:off + int(np.prod(shape))].view(shape))
            sched.append(lrm)

    final = np.zeros(N, dtype=np.float64)
    for name, off, shape in layout:
        final[off:off + int(np.prod(shape))] = P[name].detach().double().numpy().reshape(-1)
    return losses, sched, scales, final


def main():
    d = sys.argv[1]
    cfg = json.load(open(os.path.join(d, "config.json")))
    losses, sched, scales, final = train(d, cfg, torch.float64)
    np.array(losses, dtype=np.float64).tofile(os.path.join(d, "losses.bin"))
    np.array(sched, dtype=np.float64).tofile(os.path.join(d, "sched.bin"))
    np.array(scales, dtype=np.float64).tofile(os.path.join(d, "scales.bin"))
    final.tofile(os.path.join(d, "final.bin"))
    # the same run in float32: how far float32 arithmetic alone lands from float64, the test's yardstick
    losses32, _, _, final32 = train(d, cfg, torch.float32)
    np.array(losses32, dtype=np.float64).tofile(os.path.join(d, "losses_f32.bin"))
    final32.tofile(os.path.join(d, "final_f32.bin"))


if __name__ == "__main__":
    main()
