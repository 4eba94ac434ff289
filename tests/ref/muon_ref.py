#!/usr/bin/python3
"""muon_ref.py: a float64 PyTorch reference of nanochat's MuonAdamW (bac5a35) for tests/test_muon.c.

Written from the algorithm's statement (docs/muon.md), not from nanochat's code, and in float64
throughout, so it checks loom's fp32 implementation against the mathematics rather than against one
rounding. Two modes, each reading DIR/spec.txt and raw little-endian float32 inputs written by the
test, and writing float64 outputs:

  muon_ref.py kernel DIR   one matrix per `matrix ID ROWS COLS TRANSPOSED STEPS` line, followed by one
                           `step LR WD MU BETA2 GRAD_SCALE` line per step; inputs mID_p0.bin (the
                           stored layout) and mID_g.bin (STEPS gradients); output mID_out.bin: per
                           step p, buf (stored layout) and s (max(rows, cols)).
  muon_ref.py opt DIR      a parameter table (`tensor NAME GROUP OFFSET NUMEL S0 S1 TRANSPOSED ROWS
                           COLS`), `config ...` hyper-parameters and `step K LRM GRAD_SCALE` lines;
                           inputs params0.bin (N) and grads.bin (STEPS x N); output out.bin: per step
                           the N parameters, then AdamW's m and v (N each, 0 on Muon matrices), Muon's
                           buf (N, 0 elsewhere) and every matrix's s in table order.
"""
import math
import sys

import torch

torch.set_default_dtype(torch.float64)

POLAR = [  # Polar Express, 5 iterations (Amsel et al. 2025)
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
]
MATRIX, EMBED, UNEMBED, SCALAR, X0, VECTOR = range(6)


def read_f32(path, count=None):
    with open(path, "rb") as f:
        data = f.read()
    t = torch.frombuffer(bytearray(data), dtype=torch.float32).to(torch.float64)
    return t if count is None else t[:count]


def orthogonalize(G):
    """Polar Express on G (rows, cols): the Gram matrix of the smaller side."""
    X = G / (torch.linalg.norm(G) * 1.02 + 1e-6)
    tall = X.shape[0] > X.shape[1]
    for a, b, c in POLAR:
        if tall:
            A = X.T @ X
            X = a * X + X @ (b * A + c * (A @ A))
        else:
            A = X @ X.T
            X = a * X + (b * A + c * (A @ A)) @ X
    return X


def muon_update(P, G, buf, s, lr, wd, mu, beta2):
    """One step on the [rows, cols] view; returns the new P, buf, s."""
    rows, cols = P.shape
    buf = buf + (1 - mu) * (G - buf)
    G = G + mu * (buf - G)
    X = orthogonalize(G)
    per_row = rows >= cols  # statistics per row, reduced over the columns
    n = cols if per_row else rows
    v = (X * X).mean(dim=1 if per_row else 0)
    norm = math.sqrt(n * float(v.sum()))
    s = s + (1 - beta2) * (v - s)
    k = 1.0 / torch.sqrt(torch.clamp(s, min=1e-10))
    norm2 = math.sqrt(float((n * v * k * k).sum()))
    scale = k * (norm / max(norm2, 1e-10))
    X = X * (scale[:, None] if per_row else scale[None, :])
    lr2 = lr * math.sqrt(max(1.0, rows / cols))
    mask = (X * P >= 0).to(P.dtype)
    P = P - lr2 * X - lr2 * wd * P * mask
    return P, buf, s


def view(flat, rows, cols, transposed):
    return flat.reshape(cols, rows).T if transposed else flat.reshape(rows, cols)


def stored(M, transposed):
    return (M.T if transposed else M).reshape(-1)


def kernel(d, lines):
    i = 0
    while i < len(lines):
        w = lines[i].split()
        i += 1
        if not w or w[0] != "matrix":
            continue
        mid, rows, cols, tr, steps = w[1], int(w[2]), int(w[3]), int(w[4]), int(w[5])
        n = rows * cols
        P = view(read_f32(f"{d}/m{mid}_p0.bin", n), rows, cols, tr)
        grads = read_f32(f"{d}/m{mid}_g.bin", steps * n)
        buf = torch.zeros(rows, cols)
        s = torch.zeros(max(rows, cols))
        out = []
        for k in range(steps):
            lr, wd, mu, beta2, gs = (float(x) for x in lines[i].split()[1:6])
            i += 1
            G = view(grads[k * n:(k + 1) * n], rows, cols, tr) * gs
            P, buf, s = muon_update(P, G, buf, s, lr, wd, mu, beta2)
            out += [stored(P, tr), stored(buf, tr), s]
        torch.cat(out).numpy().tofile(f"{d}/m{mid}_out.bin")


class MuonAdamW:
    """setup_optimizer's groups over a flat float64 parameter buffer of N floats. tensors: dicts with
    group, offset, numel, rows, cols, transposed (a Muon matrix is seen as [rows, cols]); cfg: the
    hyper-parameters of loom_muon_config_t by name. step() is optimizer step k (from 0)."""

    def __init__(self, tensors, cfg, N):
        self.tensors, self.cfg = tensors, cfg
        dscale = (cfg["n_embd"] / 768) ** -0.5
        b1, b2 = cfg["adam_beta1"], cfg["adam_beta2"]
        # base rate and betas by opt_group
        self.base = {EMBED: (cfg["embedding_lr"] * dscale, b1, b2),
                     UNEMBED: (cfg["unembedding_lr"] * dscale, b1, b2),
                     SCALAR: (cfg["scalar_lr"] * 0.01, b1, b2), X0: (cfg["scalar_lr"], cfg["x0_beta1"], 0.95),
                     VECTOR: (cfg["adamw_lr"], b1, b2)}
        self.m, self.v, self.buf = torch.zeros(N), torch.zeros(N), torch.zeros(N)
        self.svec = {i: torch.zeros(max(t["rows"], t["cols"])) for i, t in enumerate(tensors) if t["group"] == MATRIX}

    def step(self, params, G, k, lrm):
        """Update params (N floats, in place) with the gradient G at step k, every rate times lrm."""
        cfg, m, v, buf = self.cfg, self.m, self.v, self.buf
        frac = min(k / 300, 1)
        mu = (1 - frac) * 0.85 + frac * 0.95
        wd = cfg["weight_decay"] * (1 - k / cfg["total_steps"])
        for i, t in enumerate(self.tensors):
            a, b = t["offset"], t["offset"] + t["numel"]
            if t["group"] == MATRIX:
                r, c, tr = t["rows"], t["cols"], t["transposed"]
                P, B, S = muon_update(view(params[a:b], r, c, tr), view(G[a:b], r, c, tr), view(buf[a:b], r, c, tr),
                                      self.svec[i], cfg["matrix_lr"] * lrm, wd, mu, cfg["muon_beta2"])
                params[a:b], buf[a:b], self.svec[i] = stored(P, tr), stored(B, tr), S
            else:
                lr0, be1, be2 = self.base[t["group"]]
                lr, step = lr0 * lrm, k + 1
                g = G[a:b]
                m[a:b] += (1 - be1) * (g - m[a:b])
                v[a:b] += (1 - be2) * (g * g - v[a:b])
                denom = torch.sqrt(v[a:b] / (1 - be2 ** step)) + cfg["adam_eps"]
                params[a:b] -= lr / (1 - be1 ** step) * m[a:b] / denom


def optimizer(d, lines):
    tensors, steps, cfg = [], [], {}
    for line in lines:
        w = line.split()
        if not w:
            continue
        if w[0] == "tensor":
            tensors.append(dict(name=w[1], group=int(w[2]), offset=int(w[3]), numel=int(w[4]),
                                transposed=int(w[7]), rows=int(w[8]), cols=int(w[9])))
        elif w[0] == "config":
            for kv in w[1:]:
                key, val = kv.split("=")
                cfg[key] = float(val)
        elif w[0] == "step":
            steps.append((float(w[2]), float(w[3])))
    N = max(t["offset"] + t["numel"] for t in tensors)
    params = read_f32(f"{d}/params0.bin", N)
    grads = read_f32(f"{d}/grads.bin", len(steps) * N)
    opt = MuonAdamW(tensors, cfg, N)
    out = []
    for k, (lrm, gs) in enumerate(steps):
        opt.step(params, grads[k * N:(k + 1) * N] * gs, k, lrm)
        out.append(params.clone())
    out += [opt.m, opt.v, opt.buf] + [opt.svec[i] for i in sorted(opt.svec)]
    torch.cat(out).numpy().tofile(f"{d}/out.bin")


def main():
    mode, d = sys.argv[1], sys.argv[2]
    with open(f"{d}/spec.txt") as f:
        lines = f.read().splitlines()
    {"kernel": kernel, "opt": optimizer}[mode](d, lines)


if __name__ == "__main__":
    main()
