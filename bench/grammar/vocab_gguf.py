#!/usr/bin/env python3
"""Writes a vocabulary-only GGUF of a byte-level BPE tokenizer.json with Qwen's split pattern (Qwen3's,
tiny-chat's): the tokenizer.ggml.* keys as llama.cpp's convert_hf_to_gguf.py --vocab-only writes
them (model gpt2, pre qwen2, tokens, token types, merges, eos) under general.architecture qwen3,
and no tensors: what llama.cpp loads with llama_model_params.vocab_only (llama_grammar_peer.cpp).
No numpy.

  vocab_gguf.py TOKENIZER.json OUT.gguf   (tokenizer_config.json beside it names the eos token)
"""
import json
import os
import struct
import sys

U32, BOOL, STR, ARR, I32 = 4, 7, 8, 9, 5
QWEN2_SPLIT = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
               "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")


def s(x):
    b = x.encode()
    return struct.pack("<Q", len(b)) + b


def main(path, out):
    tok = json.load(open(path))
    assert tok["model"]["type"] == "BPE", "byte-level BPE only"
    splits = [p for p in tok["pre_tokenizer"].get("pretokenizers", [tok["pre_tokenizer"]])
              if p["type"] == "Split"]
    assert splits and splits[0]["pattern"].get("Regex") == QWEN2_SPLIT, "not Qwen's split pattern"
    config_path = os.path.join(os.path.dirname(path), "tokenizer_config.json")
    tc = json.load(open(config_path)) if os.path.exists(config_path) else {}
    by_id = {i: t for t, i in tok["model"]["vocab"].items()}
    types = {i: 1 for i in by_id}  # NORMAL
    for a in tok["added_tokens"]:
        by_id[a["id"]] = a["content"]
        types[a["id"]] = 3 if a["special"] else 4  # CONTROL, USER_DEFINED
    n = max(by_id) + 1
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(n)]
    kv = []
    add = lambda key, typ, value: kv.append(s(key) + struct.pack("<I", typ) + value)
    add("general.architecture", STR, s("qwen3"))
    add("general.name", STR, s(os.path.basename(os.path.dirname(os.path.abspath(path)))))
    add("tokenizer.ggml.model", STR, s("gpt2"))
    add("tokenizer.ggml.pre", STR, s("qwen2"))
    add("tokenizer.ggml.tokens", ARR, struct.pack("<IQ", STR, n) + b"".join(s(t) for t in tokens))
    add("tokenizer.ggml.token_type", ARR, struct.pack("<IQ", I32, n) +
        struct.pack(f"<{n}i", *[types.get(i, 5) for i in range(n)]))
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    add("tokenizer.ggml.merges", ARR, struct.pack("<IQ", STR, len(merges)) + b"".join(s(m) for m in merges))
    eos = tc.get("eos_token")
    if isinstance(eos, dict):
        eos = eos.get("content")
    if eos in tokens:
        add("tokenizer.ggml.eos_token_id", U32, struct.pack("<I", tokens.index(eos)))
    add("tokenizer.ggml.add_bos_token", BOOL, bytes([bool(tc.get("add_bos_token"))]))
    head = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kv)) + b"".join(kv)
    with open(out, "wb") as f:
        f.write(head + b"\0" * (-len(head) % 32))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
