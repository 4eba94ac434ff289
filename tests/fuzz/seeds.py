#!/usr/bin/env python3
"""seeds.py OUTDIR: write the seed corpus of each libFuzzer harness (tests/fuzz/fuzz_*.c) into
OUTDIR/<name>/: small valid files of each format, plus a few near misses, so that fuzzing starts from
the shapes the readers accept. Standard library only."""
import json
import os
import struct
import sys

out = sys.argv[1]


def put(name, i, data):
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed%02d" % i), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def safetensors(tensors, meta=None):
    """tensors: [(name, dtype, shape, bytes)] -> a safetensors file."""
    hdr, off = {}, 0
    if meta:
        hdr["__metadata__"] = meta
    for name, dt, shape, data in tensors:
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(t[3] for t in tensors)


# GPT-2 with L=1, C=4, T=2, V=3 (n_head 2): the table's names and shapes (HF Conv1D [in, out])
L, C, T, V = 1, 4, 2, 3
layer = [("ln_1.weight", [C]), ("ln_1.bias", [C]), ("attn.c_attn.weight", [C, 3 * C]), ("attn.c_attn.bias", [3 * C]),
         ("attn.c_proj.weight", [C, C]), ("attn.c_proj.bias", [C]), ("ln_2.weight", [C]), ("ln_2.bias", [C]),
         ("mlp.c_fc.weight", [C, 4 * C]), ("mlp.c_fc.bias", [4 * C]), ("mlp.c_proj.weight", [4 * C, C]),
         ("mlp.c_proj.bias", [C])]
names = [("wte.weight", [V, C]), ("wpe.weight", [T, C])]
names += [("h.%d.%s" % (l, n), s) for l in range(L) for n, s in layer]
names += [("ln_f.weight", [C]), ("ln_f.bias", [C])]


def numel(s):
    n = 1
    for x in s:
        n *= x
    return n


def model(dt="F32", es=4, meta=True):
    return safetensors([(n, dt, s, bytes(range(7, 7 + es)) * numel(s)) for n, s in names],
                       {"n_head": "2", "format": "pt"} if meta else None)


put("safetensors", 0, model())
put("safetensors", 1, model("BF16", 2))
put("safetensors", 2, model("F16", 2, meta=False))
put("safetensors", 3, safetensors([("a", "F32", [2], b"\0" * 8), ("b", "I64", [1, 1], b"\1" * 8)], {"k": "v"}))
put("safetensors", 4, safetensors([("h.1048575.x", "F32", [1], b"\0" * 4)]))
# nanochat's GPT (arch in __metadata__): L1 C32, one head of 32, V 3 padded to 64, value embeddings on layer 0
nc = [("transformer.wte.weight", [64, 32]), ("resid_lambdas", [1]), ("x0_lambdas", [1]),
      ("value_embeds.0.weight", [64, 32]), ("transformer.h.0.attn.ve_gate.weight", [1, 32])]
nc += [("transformer.h.0.attn.%s.weight" % n, [32, 32]) for n in ("c_q", "c_k", "c_v", "c_proj")]
nc += [("transformer.h.0.mlp.c_fc.weight", [128, 32]), ("transformer.h.0.mlp.c_proj.weight", [32, 128]),
       ("lm_head.weight", [64, 32])]
put("safetensors", 5, safetensors([(n, "F32", s, b"\0\0\x80\x3f" * numel(s)) for n, s in nc],
                                  {"arch": "nanochat", "format": "pt", "n_layer": "1", "n_head": "1", "n_kv_head": "1",
                                   "n_embd": "32", "n_positions": "4", "vocab_size": "3", "window_pattern": "L"}))

# llm.c model: header [magic, version, maxT, V, L, NH, C, Vp], then the parameters
P = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
Vp = 8
for i, (ver, es) in enumerate([(3, 4), (5, 2)]):
    h = struct.pack("<8i", 20240326, ver, T, V, L, 2, C, Vp) + b"\0" * (1024 - 32)
    put("llmc", i, h + b"\x3f" * ((P + (Vp - V) * C) * es))
put("llmc", 2, struct.pack("<8i", 20240326, 3, 2**31 - 14, 2**31 - 1, 1, 1, 2**30, 2**31 - 1) + b"\0" * 992)

# token shard: [20240520, 1, N] + N uint16, or [20240801, 7, N] + N uint32 (llm.c's llama-3 shards);
# then the pairs that are refused (a uint16 magic with the uint32 version and the reverse)
for i, n in enumerate([0, 5]):
    put("shard", i, struct.pack("<3i", 20240520, 1, n) + b"\0" * (1024 - 12) + struct.pack("<%dH" % n, *range(n)))
for i, n in enumerate([0, 5]):
    put("shard", 2 + i, struct.pack("<3i", 20240801, 7, n) + b"\0" * (1024 - 12) +
        struct.pack("<%dI" % n, *[65530 + 3 * k for k in range(n)]))
put("shard", 4, struct.pack("<3i", 20240520, 7, 2) + b"\0" * (1024 - 12) + struct.pack("<2I", 1, 70000))
put("shard", 5, struct.pack("<3i", 20240801, 1, 2) + b"\0" * (1024 - 12) + struct.pack("<2H", 1, 2))
put("shard", 6, struct.pack("<3i", 20240801, 7, 3) + b"\0" * (1024 - 12) + struct.pack("<3I", 1, 2**31, 2**32 - 1))

# llm.c tokenizer v2: [20240328, 2, vocab, eot] + (len, bytes) per token
toks = [bytes([b]) for b in range(256)] + [b"<|endoftext|>"]
put("tokenizer", 0, struct.pack("<4I", 20240328, 2, len(toks), 256) + b"\0" * (1024 - 16) +
    b"".join(bytes([len(t)]) + t for t in toks))
put("tokenizer", 1, struct.pack("<4I", 20240328, 2, 3, 1) + b"\0" * (1024 - 16) + b"\1a\2bc\1d")

# BPE: vocab.json NUL merges.txt [NUL text]; tokens in GPT-2's byte-to-unicode spelling
bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b)
        cs.append(256 + n)
        n += 1
spell = {b: chr(c) for b, c in zip(bs, cs)}
vocab = {spell[b]: b for b in range(256)}
merges = [("h", "e"), ("l", "l"), ("he", "ll"), (spell[32], "w"), ("o", "r")]
for a, b in merges:
    vocab[a + b] = len(vocab)
vocab["<|endoftext|>"] = len(vocab)
mtext = "#version: 0.2\n" + "".join("%s %s\n" % m for m in merges)
put("bpe", 0, json.dumps(vocab) + "\0" + mtext)
put("bpe", 1, json.dumps(vocab) + "\0" + mtext + "\0hello world<|endoftext|> hello")
put("bpe", 2, json.dumps({spell[b]: b for b in range(256)}) + "\0")

# tokenizer.json: the same vocabulary and merges under GPT-2's, Llama 3's and SmolLM2's pre-tokenizers,
# added tokens and a BOS template; merges as strings and as pairs; a few near misses
def tokjson(pre, merges_pairs=False, post=None, added=None, extra=None):
    d = {"version": "1.0", "truncation": None, "padding": None, "normalizer": None,
         "added_tokens": added if added is not None else
         [{"id": len(vocab) - 1, "content": "<|endoftext|>", "special": True, "normalized": False}],
         "pre_tokenizer": pre, "post_processor": post, "decoder": {"type": "ByteLevel"},
         "model": {"type": "BPE", "ignore_merges": merges_pairs, "vocab": vocab,
                   "merges": [list(m) for m in merges] if merges_pairs else ["%s %s" % m for m in merges]}}
    d.update(extra or {})
    return json.dumps(d)

bl = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}
l3 = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
      "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
bos = {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                                {"Sequence": {"id": "A", "type_id": 0}}],
       "special_tokens": {"<s>": {"id": "<s>", "ids": [len(vocab)], "tokens": ["<s>"]}}}
put("tokjson", 0, tokjson({"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}))
put("tokjson", 1, tokjson({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": l3},
                                                                   "behavior": "Isolated", "invert": False}, bl]},
                          True, bos, [{"id": len(vocab) - 1, "content": "<|endoftext|>", "special": True},
                                      {"id": len(vocab), "content": "<s>", "special": True, "normalized": False},
                                      {"id": len(vocab) + 1, "content": "ll", "special": False, "normalized": True}])
    + "\0hello <s> world<|endoftext|> 1234")
put("tokjson", 2, tokjson({"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True},
                                                                   {"type": "ByteLevel", "add_prefix_space": True}]}))
put("tokjson", 3, tokjson({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"String": "o"},
                                                                   "behavior": "Isolated", "invert": True}, bl]}))
put("tokjson", 4, tokjson(bl, extra={"normalizer": {"type": "NFC"}}))
put("tokjson", 5, tokjson({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "\\s"},
                                                                   "behavior": "Removed"}, bl]}))

# JSON: a state file, a config.json, a MANIFEST-like state, odd JSON
put("state", 0, json.dumps({"format": "loom-state", "version": 1, "values": {"step": 10, "lr": 0.0003, "name": "x",
                                                                         "nan": "nan", "big": 18446744073709551615}}))
put("state", 1, json.dumps({"architectures": ["GPT2LMHeadModel"], "n_layer": 1, "n_head": 2, "n_embd": 4,
                            "n_positions": 2, "vocab_size": 3, "layer_norm_epsilon": 1e-05, "n_inner": None}))
put("state", 2, '{"a": "\\u00e9\\ud83d\\ude00\\n", "b": [1, -2.5e3, true, false, null, {}], "c": {"d": []}}')

put("manifest", 0, json.dumps({"format": "loom-state", "version": 1,
                               "values": {"step": 1, "files": 1, "size:model.safetensors": 10}}))
put("manifest", 1, json.dumps({"format": "loom-state", "version": 1,
                               "values": {"step": 1, "files": 2, "size:model.safetensors": 11, "size:../x": 1}}))


def crc32c(data):
    """CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), bit by bit: the seeds are tiny."""
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283
put("manifest", 2, json.dumps({"format": "loom-state", "version": 1,
                               "values": {"step": 1, "files": 1, "checksum": "crc32c",
                                          "size:model.safetensors": 10,
                                          "crc32c:model.safetensors": crc32c(b"0123456789")}}))

# shards.index: a whole set, and a near miss (a file listed twice, a set without its files)
put("index", 0, "loom-shards 1\nset train 1 121773\nset val 1 6411\n"
                "file train_000000.bin 244570\nfile val_000000.bin 13846\n")
put("index", 1, "loom-shards 1\nset train 2 5\nfile train_000000.bin 1034\nfile train_000000.bin 1034\n")


# cluster files (loom plan --cluster): a whole description, one from a profile, and near misses
put("cluster", 0, json.dumps({"nodes": 2, "ranks_per_node": 2, "peak_flops_fp32": 1e11, "memory_bytes": 2.4e10,
                              "intra_bw": 1e10, "intra_lat": 1e-6, "inter_bw": 1e9, "inter_lat": 5e-5}))
put("cluster", 1, json.dumps({"profile": "a100-8x80g", "nodes": 4, "price_per_rank_hour": 2.5}))
put("cluster", 2, json.dumps({"profile": "cpu-node", "ranks_per_node": 0}))
put("cluster", 3, '{"nodes": 1, "ranks_per_node": 2, "peak_flops_fp32": -1}')

# Hugging Face config.json / model.safetensors.index.json (fuzz_hfconfig): the config of the harness's
# tiny model (transformers 4's layout, then 5's), Qwen2's, near misses, and an index
tiny = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 8, "vocab_size": 4,
        "max_position_embeddings": 4, "tie_word_embeddings": True, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 2}, "bos_token_id": 1, "eos_token_id": [2, 3],
        "hidden_act": "silu", "torch_dtype": "bfloat16"}
put("hfconfig", 0, json.dumps(tiny, indent=2))
v5 = dict(tiny, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, dtype="float32")
del v5["rope_scaling"], v5["rope_theta"]
put("hfconfig", 1, json.dumps(v5))
put("hfconfig", 2, json.dumps(dict(tiny, model_type="qwen2", architectures=["Qwen2ForCausalLM"],
                                   use_sliding_window=False, tie_word_embeddings=False)))
put("hfconfig", 3, json.dumps(dict(tiny, num_key_value_heads=3, head_dim=7)))
put("hfconfig", 4, json.dumps({"metadata": {"total_size": 1024},
                               "weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
                                              "model.norm.weight": "model-00002-of-00002.safetensors"}}))
