#!/usr/bin/python3
"""torch_gpt2.py: PyTorch 1.13 training throughput of the same GPT-2 that `loom train` trains, for
bench/train_vs_torch.sh.

Same model (pre-LN GPT-2, GELU tanh, tied lm head, HF Conv1D layout through addmm), same data (an
llm.c token shard: window k starts at token k*B*T), AdamW with decay on 2-D weights (foreach
implementation, the fastest in 1.13 on CPU) and clip_grad_norm_, fp32; with --dtype bf16 the forward
and loss run under torch.autocast("cpu", dtype=torch.bfloat16) (bf16 matmuls through oneDNN, fp32
master weights and optimizer), the counterpart of `loom train --dtype bf16`. Thread counts are set by
the caller: torch.set_num_threads(--threads) here, OPENBLAS_NUM_THREADS / OMP_NUM_THREADS in the
environment (torch.set_num_threads alone does not limit Debian's OpenBLAS).

Prints one line: "tokens_per_s X" (mean over the steps after --warmup), and per-step times on stderr."""
import argparse
import math
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

PRESETS = {"tiny": (4, 4, 128, 128, 257), "small": (6, 6, 384, 256, 50257), "gpt2": (12, 12, 768, 1024, 50257)}


class Conv1D(nn.Module):
    """HF's Conv1D: y = x W + b with W [in, out]."""

    def __init__(self, nin, nout, std):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(nin, nout) * std)
        self.bias = nn.Parameter(torch.zeros(nout))

    def forward(self, x):
        shape = x.shape[:-1] + (self.weight.shape[1],)
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(shape)


class Block(nn.Module):
    def __init__(self, C, H, L):
        super().__init__()
        self.H = H
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.c_attn = Conv1D(C, 3 * C, 0.02)
        self.c_proj = Conv1D(C, C, 0.02 / math.sqrt(2 * L))
        self.c_fc = Conv1D(C, 4 * C, 0.02)
        self.mlp_proj = Conv1D(4 * C, C, 0.02 / math.sqrt(2 * L))

    def forward(self, x, mask):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (z.view(B, T, self.H, C // self.H).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // self.H))
        att = att.masked_fill(mask[:T, :T], float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, L, H, C, T, V):
        super().__init__()
        self.wte = nn.Parameter(torch.randn(V, C) * 0.02)
        self.wpe = nn.Parameter(torch.randn(T, C) * 0.02)
        self.h = nn.ModuleList(Block(C, H, L) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        self.register_buffer("mask", ~torch.ones(T, T, dtype=torch.bool).tril())

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte[idx] + self.wpe[:T]
        for b in self.h:
            x = b(x, self.mask)
        logits = self.ln_f(x) @ self.wte.t()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--model", default="small")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2, help="untimed first steps")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1337)
    L, H, C, T, V = PRESETS[a.model]
    B, Tt = a.batch_size, a.seq_len
    hdr = np.fromfile(a.data, dtype=np.int32, count=256)
    assert hdr[0] == 20240520, "not a token shard"
    tokens = np.fromfile(a.data, dtype=np.uint16, offset=1024).astype(np.int64)
    W = (tokens.size - 1) // (B * Tt)
    model = GPT2(L, H, C, T, V)
    decay = [p for p in model.parameters() if p.dim() == 2]
    nodecay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8, foreach=True)
    times = []
    for s in range(a.steps):
        k = s % W
        win = torch.from_numpy(tokens[k * B * Tt: k * B * Tt + B * Tt + 1])
        x, y = win[:-1].view(B, Tt), win[1:].view(B, Tt)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
            loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        times.append(dt)
        print("torch step %d: loss %.4f, %.1f ms" % (s + 1, loss.item(), dt * 1e3), file=sys.stderr)
    timed = times[a.warmup:]
    print("tokens_per_s %.1f" % (B * Tt * len(timed) / sum(timed)))


if __name__ == "__main__":
    main()
