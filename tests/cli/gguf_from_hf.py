#!/usr/bin/env python3
"""Writes a qwen2/qwen3 Hugging Face folder as a GGUF file the way llama.cpp's converter lays it
out (metadata keys, tensor names, 1-D tensors as F32, the rest as stored), without numpy: the CLI
tests' own small writer. tests/gguf_from_hf.h is the fuller one the unit tests use.

  gguf_from_hf.py DIR OUT.gguf [q1_0 | --f32]

With q1_0 the matrices (rows of whole 128-value blocks) are Q1_0 blocks: each value's sign, and
one f16 scale a block (the block's first |value|; not a fitted quantization: the tests need a
file's values, whatever they are). With --f32 every tensor is F32, as llama.cpp's
convert_hf_to_gguf.py --outtype f32 writes them.
"""
import json
import struct
import sys

U32, F32, BOOL, STR, ARR, I32 = 4, 6, 7, 8, 9, 5
TYPES = {"F32": 0, "F16": 1, "BF16": 30, "Q1_0": 41}
LAYER = {"input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight",
         "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
         "self_attn.o_proj.weight": "attn_output.weight", "self_attn.q_proj.bias": "attn_q.bias",
         "self_attn.k_proj.bias": "attn_k.bias", "self_attn.v_proj.bias": "attn_v.bias",
         "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
         "post_attention_layernorm.weight": "ffn_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
         "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight"}
TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
       "lm_head.weight": "output.weight"}


def s(x):
    b = x.encode()
    return struct.pack("<Q", len(b)) + b


def gguf_name(name):
    if name in TOP:
        return TOP[name]
    _, _, layer, rest = name.split(".", 3)
    return f"blk.{layer}.{LAYER[rest]}"


def to_f32(dtype, raw):
    if dtype == "F32":
        return raw
    n = len(raw) // 2
    if dtype == "BF16":
        return b"".join(struct.pack("<I", h << 16) for h in struct.unpack(f"<{n}H", raw))
    return struct.pack(f"<{n}f", *struct.unpack(f"<{n}e", raw))


def q1_0(dtype, raw):
    """Q1_0 blocks of a BF16 or F32 tensor: per 128 values an f16 scale and 16 sign bytes."""
    size = 2 if dtype == "BF16" else 4
    assert dtype in ("BF16", "F32")
    # A value's sign byte -> 1 where it is >= 0; eight such bytes gather into one byte of bits, the
    # first value in the lowest (the multiply moves byte j's low bit to bit 56 + j).
    positive = raw[size - 1::size].translate(bytes(1 if b < 0x80 else 0 for b in range(256)))
    words = struct.unpack(f"<{len(positive) // 8}Q", positive)
    signs = bytes(((w * 0x0102040810204080) >> 56) & 0xFF for w in words)
    blocks = []
    for b in range(len(signs) // 16):
        first = to_f32(dtype, raw[b * 128 * size:b * 128 * size + size])
        scale = abs(struct.unpack("<f", first)[0]) or 0.01
        blocks.append(struct.pack("<e", scale) + signs[b * 16:(b + 1) * 16])
    return b"".join(blocks)


def main(src, out, blocks=None, all_f32=False):
    config = json.load(open(f"{src}/config.json"))
    tc = json.load(open(f"{src}/tokenizer_config.json"))
    tok = json.load(open(f"{src}/tokenizer.json"))
    arch = config["model_type"]
    assert arch in ("qwen2", "qwen3"), "no q/k permutation here: qwen2 and qwen3 only"
    theta = config.get("rope_theta") or (config.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    kv = []
    add = lambda key, typ, value: kv.append(s(key) + struct.pack("<I", typ) + value)
    add("general.architecture", STR, s(arch))
    for key, field in [("block_count", "num_hidden_layers"), ("context_length", "max_position_embeddings"),
                       ("embedding_length", "hidden_size"), ("feed_forward_length", "intermediate_size"),
                       ("attention.head_count", "num_attention_heads"),
                       ("attention.head_count_kv", "num_key_value_heads"), ("attention.key_length", "head_dim"),
                       ("attention.value_length", "head_dim")]:
        add(f"{arch}.{key}", U32, struct.pack("<I", config[field]))
    add(f"{arch}.rope.freq_base", F32, struct.pack("<f", theta))
    add(f"{arch}.attention.layer_norm_rms_epsilon", F32, struct.pack("<f", config["rms_norm_eps"]))
    by_id = {i: t for t, i in tok["model"]["vocab"].items()}
    types = {i: 1 for i in by_id}
    for a in tok["added_tokens"]:
        by_id[a["id"]] = a["content"]
        types[a["id"]] = 3 if a["special"] else 4
    n = config["vocab_size"]
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(n)]
    add("tokenizer.ggml.model", STR, s("gpt2"))
    add("tokenizer.ggml.pre", STR, s("qwen2"))
    add("tokenizer.ggml.tokens", ARR, struct.pack("<IQ", STR, n) + b"".join(s(t) for t in tokens))
    add("tokenizer.ggml.token_type", ARR, struct.pack("<IQ", I32, n) +
        struct.pack(f"<{n}i", *[types.get(i, 5) for i in range(n)]))
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    add("tokenizer.ggml.merges", ARR, struct.pack("<IQ", STR, len(merges)) + b"".join(s(m) for m in merges))
    add("tokenizer.ggml.eos_token_id", U32, struct.pack("<I", tokens.index(tc["eos_token"])))
    add("tokenizer.ggml.add_bos_token", BOOL, bytes([bool(tc.get("add_bos_token"))]))
    add("tokenizer.chat_template", STR, s(tc["chat_template"]))

    raw = open(f"{src}/model.safetensors", "rb").read()
    hlen = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + hlen])
    header.pop("__metadata__", None)
    infos, data, size = b"", [], 0
    for name, t in header.items():
        b, e = t["data_offsets"]
        blob = raw[8 + hlen + b:8 + hlen + e]
        dtype = t["dtype"]
        if len(t["shape"]) == 1 or all_f32:
            blob, dtype = to_f32(dtype, blob), "F32"
        elif blocks == "q1_0" and t["shape"][-1] % 128 == 0:
            blob, dtype = q1_0(dtype, blob), "Q1_0"
        data.append(b"\0" * (-size % 32))
        size += len(data[-1])
        infos += s(gguf_name(name)) + struct.pack("<I", len(t["shape"]))
        infos += struct.pack(f"<{len(t['shape'])}Q", *reversed(t["shape"]))
        infos += struct.pack("<IQ", TYPES[dtype], size)
        data.append(blob)
        size += len(blob)
    head = b"GGUF" + struct.pack("<IQQ", 3, len(header), len(kv)) + b"".join(kv) + infos
    with open(out, "wb") as f:
        f.write(head + b"\0" * (-len(head) % 32))
        f.write(b"".join(data))


if __name__ == "__main__":
    args = sys.argv[3:]
    main(sys.argv[1], sys.argv[2], blocks="q1_0" if "q1_0" in args else None,
         all_f32="--f32" in args)
