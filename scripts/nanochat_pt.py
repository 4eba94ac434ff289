#!/usr/bin/env python3
"""nanochat_pt.py: nanochat checkpoints <-> loom's safetensors (run by `loom convert`; needs torch).

nanochat (karpathy/nanochat, base_train.py) saves model_NNNNNN.pt (torch.save of the model's
state_dict) and meta_NNNNNN.json beside it ("model_config": GPTConfig's fields). loom's nanochat
files are safetensors with the same parameter names and shapes (the padded vocabulary included) and
the configuration in __metadata__ (arch "nanochat").

  nanochat_pt.py to-loom   MODEL.pt OUT.safetensors   (meta_NNNNNN.json is found beside MODEL.pt)
  nanochat_pt.py to-nanochat IN.safetensors OUT.pt    (writes meta_NNNNNN.json beside OUT.pt)

Exit status 0 on success; 1 with one line on stderr naming the file and what was wrong.
"""
import json
import os
import re
import struct
import sys


def die(msg):
    sys.stderr.write(msg + "\n")
    sys.exit(1)


def meta_path_for(pt_path):
    d, base = os.path.split(pt_path)
    m = re.match(r"model_(\d+)\.pt$", base)
    if not m:
        die(f"{pt_path}: expected a nanochat model file named model_NNNNNN.pt (its meta_NNNNNN.json beside it)")
    return os.path.join(d, f"meta_{m.group(1)}.json"), m.group(1)


def write_safetensors(path, tensors, metadata):
    header, offset, blobs = {}, 0, []
    for name, arr in tensors:
        raw = arr.astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def read_safetensors(path):
    import numpy as np
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        die(f"{path}: not a safetensors file (shorter than 8 bytes)")
    n = struct.unpack("<Q", data[:8])[0]
    if n > len(data) - 8:
        die(f"{path}: header length {n} beyond the file's {len(data)} bytes")
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    out = {}
    for name, t in header.items():
        if t["dtype"] != "F32":
            die(f"{path}: tensor {name} is {t['dtype']}, expected F32 (loom writes F32)")
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(data[base + a:base + b], dtype="<f4").reshape(t["shape"]).copy()
    return out, meta


def need_torch():
    try:
        import torch  # noqa: F401
    except ImportError:
        die(f"{sys.executable}: no torch module (nanochat's .pt files are torch's pickles): install torch, or "
            "point LOOM_PYTHON at a python3 that has it")


def to_loom(pt_path, out_path):
    need_torch()
    import torch
    meta_path, _ = meta_path_for(pt_path)
    try:
        with open(meta_path) as f:
            meta = json.load(f)
    except OSError as e:
        die(f"{meta_path}: {e.strerror} (nanochat writes it beside {os.path.basename(pt_path)})")
    mc = meta.get("model_config")
    if not isinstance(mc, dict):
        die(f"{meta_path}: no model_config object")
    for k in ("sequence_len", "vocab_size", "n_layer", "n_head", "n_kv_head", "n_embd"):
        if not isinstance(mc.get(k), int) or mc[k] <= 0:
            die(f"{meta_path}: model_config.{k} missing or not a positive integer")
    sd = torch.load(pt_path, map_location="cpu")
    if not isinstance(sd, dict):
        die(f"{pt_path}: not a state_dict (a dict of tensors)")
    tensors = []
    for k, v in sd.items():
        k = k[len("_orig_mod."):] if k.startswith("_orig_mod.") else k
        if not hasattr(v, "float"):
            die(f"{pt_path}: entry {k} is not a tensor")
        tensors.append((k, v.detach().float().cpu().numpy()))
    md = {"arch": "nanochat", "format": "pt", "loom": "nanochat", "n_layer": mc["n_layer"], "n_head": mc["n_head"],
          "n_kv_head": mc["n_kv_head"], "n_embd": mc["n_embd"], "n_positions": mc["sequence_len"],
          "vocab_size": mc["vocab_size"], "window_pattern": mc.get("window_pattern", "L")}
    write_safetensors(out_path, tensors, md)


def to_nanochat(st_path, out_path):
    need_torch()
    import torch
    tensors, meta = read_safetensors(st_path)
    if meta.get("arch") != "nanochat":
        die(f"{st_path}: __metadata__ arch is {meta.get('arch')!r}, expected 'nanochat'")
    _, step = meta_path_for(out_path)
    sd = {k: torch.from_numpy(v) for k, v in tensors.items()}
    torch.save(sd, out_path)
    mc = {"sequence_len": int(meta["n_positions"]), "vocab_size": int(meta["vocab_size"]),
          "n_layer": int(meta["n_layer"]), "n_head": int(meta["n_head"]),
          "n_kv_head": int(meta.get("n_kv_head", meta["n_head"])), "n_embd": int(meta["n_embd"]),
          "window_pattern": meta.get("window_pattern", "SSSL")}
    with open(os.path.join(os.path.dirname(out_path), f"meta_{step}.json"), "w") as f:
        json.dump({"step": int(step), "model_config": mc, "converted_by": "loom convert"}, f, indent=2)


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in ("to-loom", "to-nanochat"):
        die("usage: nanochat_pt.py to-loom MODEL.pt OUT.safetensors | to-nanochat IN.safetensors OUT.pt")
    (to_loom if sys.argv[1] == "to-loom" else to_nanochat)(sys.argv[2], sys.argv[3])


if __name__ == "__main__":
    main()
