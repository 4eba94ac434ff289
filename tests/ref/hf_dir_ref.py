"""hf_dir_ref.py: an independent writer and checker of Hugging Face model directories for
tests/test_hfdir.c, in plain Python + torch (the `safetensors` package is not installable here, so
files are written and read by hand: 8-byte little-endian header length, JSON header, data).

  hf_dir_ref.py write DIR   a Llama directory as transformers 5 writes it (rope_parameters with llama3
                            scaling, eos_token_id a list, untied head, GQA 4:2), two shards listed in
                            model.safetensors.index.json: shard 1 BF16, shard 2 F16 with the final norm
                            F32; and DIR/../expect.safetensors, every tensor's values as float32.
  hf_dir_ref.py check DIR   a directory loom wrote: config.json's keys and values are LlamaConfig's
                            (or Qwen2Config's), every file's header is valid safetensors with
                            {"format": "pt"} (a training checkpoint's model.safetensors: plus loom's
                            keys), names and shapes are those transformers derives from the config,
                            the index (if any) matches the shards; prints one summary line.
"""
import json, os, struct, sys

LLAMA_KEYS = {"architectures", "attention_bias", "attention_dropout", "bos_token_id", "eos_token_id", "head_dim",
              "hidden_act", "hidden_size", "initializer_range", "intermediate_size", "max_position_embeddings",
              "mlp_bias", "model_type", "num_attention_heads", "num_hidden_layers", "num_key_value_heads",
              "pretraining_tp", "rms_norm_eps", "rope_scaling", "rope_theta", "tie_word_embeddings", "torch_dtype",
              "use_cache", "vocab_size"}
QWEN2_KEYS = {"architectures", "attention_dropout", "bos_token_id", "eos_token_id", "hidden_act", "hidden_size",
              "initializer_range", "intermediate_size", "max_position_embeddings", "max_window_layers", "model_type",
              "num_attention_heads", "num_hidden_layers", "num_key_value_heads", "rms_norm_eps", "rope_scaling",
              "rope_theta", "sliding_window", "tie_word_embeddings", "torch_dtype", "use_cache", "use_sliding_window",
              "vocab_size"}


def write_st(path, tensors):
    """tensors: list of (name, tensor) in file order."""
    import torch
    DT = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors:
        b = t.contiguous().view(torch.uint8).numpy().tobytes() if t.dtype != torch.float32 else \
            t.contiguous().numpy().tobytes()
        header[name] = {"dtype": DT[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_header(path):
    with open(path, "rb") as f:
        b = f.read()
    n = struct.unpack("<Q", b[:8])[0]
    assert (8 + n) % 8 == 0, path + ": header not padded to 8"
    h = json.loads(b[8:8 + n])
    return h, len(b) - 8 - n


def expected_shapes(c):
    C, L, H = c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"]
    KV, V, I = c.get("num_key_value_heads", H), c["vocab_size"], c["intermediate_size"]
    D = c.get("head_dim") or C // H
    qwen2 = c["model_type"] == "qwen2"
    qkv_b, o_b, mlp_b = qwen2 or c.get("attention_bias", False), c.get("attention_bias", False) and not qwen2, \
        c.get("mlp_bias", False) and not qwen2
    s = {"model.embed_tokens.weight": [V, C], "model.norm.weight": [C]}
    if not c.get("tie_word_embeddings", False):
        s["lm_head.weight"] = [V, C]
    for l in range(L):
        p = "model.layers.%d." % l
        s[p + "input_layernorm.weight"] = [C]
        s[p + "post_attention_layernorm.weight"] = [C]
        for n, o, i in (("q", H * D, C), ("k", KV * D, C), ("v", KV * D, C)):
            s[p + "self_attn.%s_proj.weight" % n] = [o, i]
            if qkv_b:
                s[p + "self_attn.%s_proj.bias" % n] = [o]
        s[p + "self_attn.o_proj.weight"] = [C, H * D]
        if o_b:
            s[p + "self_attn.o_proj.bias"] = [C]
        for n, o, i in (("gate", I, C), ("up", I, C), ("down", C, I)):
            s[p + "mlp.%s_proj.weight" % n] = [o, i]
            if mlp_b:
                s[p + "mlp.%s_proj.bias" % n] = [o]
    return s


def write(d):
    import torch
    cfg = {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
           "bos_token_id": 1, "eos_token_id": [2, 5], "head_dim": 8, "hidden_act": "silu", "hidden_size": 32,
           "initializer_range": 0.02, "intermediate_size": 48, "max_position_embeddings": 32, "mlp_bias": False,
           "model_type": "llama", "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
           "rms_norm_eps": 1e-05, "tie_word_embeddings": False, "dtype": "bfloat16", "transformers_version": "5.0.0",
           "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
           "use_cache": True, "vocab_size": 64}
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    g = torch.Generator().manual_seed(1234)
    names = sorted(expected_shapes(cfg).items())
    shard1, shard2, expect = [], [], []
    for i, (name, shape) in enumerate(names):
        x = torch.randn(shape, generator=g, dtype=torch.float64) * 0.5
        if name == "model.norm.weight":
            t = x.float()
        elif i % 2 == 0:
            t = x.to(torch.bfloat16)
        else:
            t = x.to(torch.float16)
        (shard1 if t.dtype == torch.bfloat16 else shard2).append((name, t))
        expect.append((name, t.float()))
    files = {"model-00001-of-00002.safetensors": shard1, "model-00002-of-00002.safetensors": shard2}
    wm, total = {}, 0
    for fn, ts in files.items():
        write_st(os.path.join(d, fn), ts[::-1])  # a shard's tensors in another order than the index's
        for n, t in ts:
            wm[n] = fn
            total += t.numel() * t.element_size()
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(wm.items()))}, f, indent=2)
    write_st(os.path.join(os.path.dirname(os.path.abspath(d)), "expect.safetensors"), expect)
    print("wrote", len(names), "tensors")


def check(d):
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    keys = QWEN2_KEYS if cfg["model_type"] == "qwen2" else LLAMA_KEYS
    if cfg["model_type"] == "qwen2" and "head_dim" in cfg:
        keys = keys | {"head_dim"}
    assert set(cfg) == keys, "config.json keys: extra %s missing %s" % (sorted(set(cfg) - keys), sorted(keys - set(cfg)))
    with open(os.path.join(d, "config.json")) as f:
        text = f.read()
    assert text == json.dumps(cfg, indent=2, sort_keys=True) + "\n", "config.json is not json.dumps(indent=2, sort_keys)"
    assert cfg["hidden_act"] == "silu" and cfg["architectures"] == [
        "Qwen2ForCausalLM" if cfg["model_type"] == "qwen2" else "LlamaForCausalLM"]
    want = expected_shapes(cfg)
    idx = os.path.join(d, "model.safetensors.index.json")
    files = sorted(f for f in os.listdir(d) if f.startswith("model") and f.endswith(".safetensors"))
    got, dtypes, total = {}, set(), 0
    for fn in files:
        h, nbytes = read_header(os.path.join(d, fn))
        meta = h.pop("__metadata__")
        assert meta["format"] == "pt" and (meta == {"format": "pt"} or "hf_config" in meta), fn  # loom's own adds keys
        end = 0
        for name, v in sorted(h.items(), key=lambda kv: kv[1]["data_offsets"][0]):
            a, e = v["data_offsets"]
            assert a == end, (fn, name)
            end = e
            cnt = 1
            for s in v["shape"]:
                cnt *= s
            es = {"F32": 4, "BF16": 2, "F16": 2}[v["dtype"]]
            assert e - a == es * cnt, (fn, name)
            assert name not in got, name
            got[name] = (v["shape"], fn)
            dtypes.add(v["dtype"])
            total += e - a
        assert end == nbytes, fn
    assert {n: s for n, (s, _) in got.items()} == want, "names/shapes differ: extra %s missing %s" % (
        sorted(set(got) - set(want)), sorted(set(want) - set(got)))
    if os.path.exists(idx):
        with open(idx) as f:
            ix = json.load(f)
        assert ix["metadata"]["total_size"] == total
        assert ix["weight_map"] == {n: fn for n, (_, fn) in got.items()}
        assert list(ix["weight_map"]) == sorted(ix["weight_map"])
        n = len(files)
        assert files == ["model-%05d-of-%05d.safetensors" % (i + 1, n) for i in range(n)], files
    else:
        assert files == ["model.safetensors"], files
    dt = {"F32": "float32", "BF16": "bfloat16"}[dtypes.pop()]
    assert not dtypes and cfg["torch_dtype"] == dt
    print("ok %s %d tensors %d files %s index=%d" % (cfg["model_type"], len(got), len(files), dt, os.path.exists(idx)))


if __name__ == "__main__":
    {"write": write, "check": check}[sys.argv[1]](sys.argv[2])
