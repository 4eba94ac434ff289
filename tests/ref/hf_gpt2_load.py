#!/usr/bin/python3
"""hf_gpt2_load.py: load a loom checkpoint directory the way transformers' GPT2LMHeadModel.from_pretrained
does, without transformers (Debian has no package), and write the logits (run by tests/test_eco.c).

The module tree and parameter names are HF's (transformer.wte, transformer.h.N.attn.c_attn with the
Conv1D layout W [in, out], lm_head tied to wte); the hyper-parameters come only from DIR/config.json's
GPT2Config fields; model.safetensors is parsed from its header (8-byte length, JSON, raw data) and
loaded with HF's rule for a head model: keys without the "transformer." prefix get it. Every
parameter must be loaded (strict), as from_pretrained would warn otherwise.

usage: hf_gpt2_load.py DIR IDS OUT  (IDS: int32 token ids, one row of T; OUT: float32 logits [T, V])"""
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class Conv1D(nn.Module):
    def __init__(self, nf, nx):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.empty(nf))

    def forward(self, x):
        return x @ self.weight + self.bias


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


ACT = {"gelu_new": gelu_new, "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"), "gelu": F.gelu}


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C, eps = cfg["n_embd"], cfg["layer_norm_epsilon"]
        inner = cfg.get("n_inner") or 4 * C
        self.n_head = cfg["n_head"]
        self.act = ACT[cfg["activation_function"]]
        self.ln_1 = nn.LayerNorm(C, eps=eps)
        self.attn = nn.Module()
        self.attn.c_attn = Conv1D(3 * C, C)
        self.attn.c_proj = Conv1D(C, C)
        self.ln_2 = nn.LayerNorm(C, eps=eps)
        self.mlp = nn.Module()
        self.mlp.c_fc = Conv1D(inner, C)
        self.mlp.c_proj = Conv1D(C, inner)

    def forward(self, x):
        B, T, C = x.shape
        H = self.n_head
        q, k, v = self.attn.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (z.view(B, T, H, C // H).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // H)
        att = att.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf")).softmax(dim=-1)
        x = x + self.attn.c_proj((att @ v).transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp.c_proj(self.act(self.mlp.c_fc(self.ln_2(x))))


class GPT2LMHeadModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        assert cfg["model_type"] == "gpt2" and cfg["architectures"] == ["GPT2LMHeadModel"], cfg
        assert cfg.get("tie_word_embeddings", True)
        C = cfg["n_embd"]
        self.transformer = nn.Module()
        self.transformer.wte = nn.Embedding(cfg["vocab_size"], C)
        self.transformer.wpe = nn.Embedding(cfg["n_positions"], C)
        self.transformer.h = nn.ModuleList([Block(cfg) for _ in range(cfg["n_layer"])])
        self.transformer.ln_f = nn.LayerNorm(C, eps=cfg["layer_norm_epsilon"])

    def forward(self, idx):
        t = self.transformer
        x = t.wte(idx) + t.wpe(torch.arange(idx.shape[1]))
        for block in t.h:
            x = block(x)
        return t.ln_f(x) @ t.wte.weight.t()  # lm_head, tied


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    assert meta.get("format") == "pt", meta  # from_pretrained refuses other formats
    out = {}
    for name, t in header.items():
        assert t["dtype"] == "F32", (name, t["dtype"])
        a, b = t["data_offsets"]
        out[name] = torch.from_numpy(np.frombuffer(data[8 + n + a:8 + n + b], dtype=np.float32).copy()
                                     .reshape(t["shape"]))
    return out


def main():
    d, ids_path, out_path = sys.argv[1:4]
    torch.set_num_threads(1)
    cfg = json.load(open(os.path.join(d, "config.json")))
    for k in ("bos_token_id", "eos_token_id"):
        assert 0 <= cfg[k] < cfg["vocab_size"], (k, cfg[k], cfg["vocab_size"])
    model = GPT2LMHeadModel(cfg)
    sd = {k if k.startswith("transformer.") or k.startswith("lm_head.") else "transformer." + k: v
          for k, v in read_safetensors(os.path.join(d, "model.safetensors")).items()}
    model.load_state_dict(sd, strict=True)
    ids = torch.from_numpy(np.fromfile(ids_path, dtype=np.int32).astype(np.int64)).view(1, -1)
    with torch.no_grad():
        logits = model(ids)[0]
    logits.numpy().astype(np.float32).tofile(out_path)
    print("bos %d eos %d vocab %d" % (cfg["bos_token_id"], cfg["eos_token_id"], cfg["vocab_size"]))


if __name__ == "__main__":
    main()
