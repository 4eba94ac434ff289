#!/usr/bin/env python3
"""nanochat_ckpt_check.py: does a loom nanochat checkpoint load into nanochat's GPT by name?

Reads MODEL.safetensors (header only, by hand) and config.json beside it, builds the state_dict keys
and shapes nanochat's GPT (bac5a35, nanochat/gpt.py) has for that GPTConfig (written here from the
architecture, not from nanochat's code), and checks load_state_dict(strict=True)'s conditions: the
same set of names, each with the same shape. With --torch it also rebuilds the tensors as a torch
state_dict (as `loom convert` would) and checks they are finite.

usage: nanochat_ckpt_check.py MODEL.safetensors [--torch]
Prints "ok: N tensors, GPTConfig(...)" and exits 0, or names the first difference and exits 1."""
import json
import os
import struct
import sys


def expected(cfg):
    L, C, H, KV = cfg["n_layer"], cfg["n_embd"], cfg["n_head"], cfg["n_kv_head"]
    Vp = (cfg["vocab_size"] + 63) // 64 * 64
    D = C // H
    keys = {"transformer.wte.weight": [Vp, C], "lm_head.weight": [Vp, C], "resid_lambdas": [L], "x0_lambdas": [L]}
    for i in range(L):
        p = f"transformer.h.{i}."
        keys[p + "attn.c_q.weight"] = [H * D, C]
        keys[p + "attn.c_k.weight"] = [KV * D, C]
        keys[p + "attn.c_v.weight"] = [KV * D, C]
        keys[p + "attn.c_proj.weight"] = [C, C]
        keys[p + "mlp.c_fc.weight"] = [4 * C, C]
        keys[p + "mlp.c_proj.weight"] = [C, 4 * C]
        if i % 2 == (L - 1) % 2:  # value embeddings on alternating layers, the last included
            keys[p + "attn.ve_gate.weight"] = [KV, 32]
            keys[f"value_embeds.{i}.weight"] = [Vp, KV * D]
    return keys


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: nanochat_ckpt_check.py MODEL.safetensors [--torch]")
    path = sys.argv[1]
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    with open(os.path.join(os.path.dirname(path), "config.json")) as f:
        cj = json.load(f)
    fields = ("sequence_len", "vocab_size", "n_layer", "n_head", "n_kv_head", "n_embd", "window_pattern")
    missing = [k for k in fields if k not in cj]
    if missing:
        print("config.json lacks GPTConfig field(s): " + ", ".join(missing))
        sys.exit(1)
    cfg = {k: cj[k] for k in fields}
    want = expected(cfg)
    got = {k: v["shape"] for k, v in header.items()}
    for k in sorted(want):
        if k not in got:
            print("missing key (strict load fails): " + k)
            sys.exit(1)
        if got[k] != want[k]:
            print(f"{k}: shape {got[k]}, nanochat's GPT has {want[k]}")
            sys.exit(1)
    extra = sorted(set(got) - set(want))
    if extra:
        print("unexpected key (strict load fails): " + extra[0])
        sys.exit(1)
    if "--torch" in sys.argv[2:]:
        import numpy as np
        import torch
        with open(path, "rb") as f:
            data = f.read()
        base = 8 + n
        for k, v in header.items():
            a, b = v["data_offsets"]
            t = torch.from_numpy(np.frombuffer(data[base + a:base + b], dtype="<f4").reshape(v["shape"]).copy())
            if not torch.isfinite(t).all():
                print(f"{k}: not finite")
                sys.exit(1)
    print("ok: %d tensors, GPTConfig(%s)" % (len(want), ", ".join("%s=%r" % (k, cfg[k]) for k in fields)))


if __name__ == "__main__":
    main()
