"""Writes a random tiny BERT-style encoder folder for the CLI and server tests, in pure Python
(no numpy, torch or transformers): config.json, model.safetensors (float32), the golden
bert-uncased tokenizer, and with --st the sentence-transformers files (CLS pooling, Normalize,
max_seq_length 16), with --prompts also config_sentence_transformers.json (prompts "query",
the default, and "none"), with --matryoshka config.json's matryoshka_dimensions [16, 8, 4].

  python3 tests/cli/tiny_encoder.py DIR [--family bert|roberta] [--head] [--st] [--prompts]
                                        [--matryoshka]
"""
import argparse
import json
import os
import random
import shutil
import struct

DIM, HEADS, FFN, LAYERS, POSITIONS = 16, 2, 24, 2, 40
TOKENIZER = os.path.join(os.path.dirname(__file__), "..", "golden", "tokenizer", "bert-uncased.json")


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, (shape, values) in tensors.items():
        data = struct.pack(f"<{len(values)}f", *values)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--family", default="bert", choices=["bert", "roberta"])
    ap.add_argument("--head", action="store_true")
    ap.add_argument("--st", action="store_true")
    ap.add_argument("--prompts", action="store_true")
    ap.add_argument("--matryoshka", action="store_true")
    a = ap.parse_args()
    rng = random.Random(25)
    os.makedirs(a.dir, exist_ok=True)
    tok = json.load(open(TOKENIZER))
    vocab = max(list(tok["model"]["vocab"].values()) + [t["id"] for t in tok["added_tokens"]]) + 1
    bert = a.family == "bert"
    prefix = ("bert." if bert else "roberta.") if a.head else ""
    t = {}

    def add(name, shape, scale, mean=0.0):
        n = 1
        for s in shape:
            n *= s
        t[name] = (shape, [rng.gauss(mean, scale) for _ in range(n)])

    add(prefix + "embeddings.word_embeddings.weight", [vocab, DIM], 1.0)
    add(prefix + "embeddings.position_embeddings.weight", [POSITIONS, DIM], 0.5)
    add(prefix + "embeddings.token_type_embeddings.weight", [2 if bert else 1, DIM], 0.5)
    add(prefix + "embeddings.LayerNorm.weight", [DIM], 0.2, 1.0)
    add(prefix + "embeddings.LayerNorm.bias", [DIM], 0.2)
    for l in range(LAYERS):
        p = f"{prefix}encoder.layer.{l}."
        for lin in ["attention.self.query", "attention.self.key", "attention.self.value",
                    "attention.output.dense"]:
            add(p + lin + ".weight", [DIM, DIM], 0.3)
            add(p + lin + ".bias", [DIM], 0.1)
        for norm in ["attention.output.LayerNorm", "output.LayerNorm"]:
            add(p + norm + ".weight", [DIM], 0.2, 1.0)
            add(p + norm + ".bias", [DIM], 0.2)
        add(p + "intermediate.dense.weight", [FFN, DIM], 0.3)
        add(p + "intermediate.dense.bias", [FFN], 0.1)
        add(p + "output.dense.weight", [DIM, FFN], 0.3)
        add(p + "output.dense.bias", [DIM], 0.1)
    if a.head:
        dense, out = ("bert.pooler.dense", "classifier") if bert else ("classifier.dense", "classifier.out_proj")
        add(dense + ".weight", [DIM, DIM], 0.4)
        add(dense + ".bias", [DIM], 0.1)
        add(out + ".weight", [1, DIM], 0.4)
        add(out + ".bias", [1], 0.1)
    write_safetensors(os.path.join(a.dir, "model.safetensors"), t)
    cls = "Bert" if bert else "Roberta"
    config = {"model_type": a.family,
              "architectures": [cls + ("ForSequenceClassification" if a.head else "Model")],
              "vocab_size": vocab, "hidden_size": DIM, "num_hidden_layers": LAYERS,
              "num_attention_heads": HEADS, "intermediate_size": FFN, "hidden_act": "gelu",
              "max_position_embeddings": POSITIONS, "type_vocab_size": 2 if bert else 1,
              "layer_norm_eps": 1e-12, "pad_token_id": 0 if bert else 1}
    if a.head:
        config["id2label"] = {"0": "LABEL_0"}
    if a.matryoshka:
        config["matryoshka_dimensions"] = [DIM, DIM // 2, DIM // 4]
    json.dump(config, open(os.path.join(a.dir, "config.json"), "w"))
    shutil.copy(TOKENIZER, os.path.join(a.dir, "tokenizer.json"))
    if a.st:
        json.dump([{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                   {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                   {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}],
                  open(os.path.join(a.dir, "modules.json"), "w"))
        os.makedirs(os.path.join(a.dir, "1_Pooling"), exist_ok=True)
        json.dump({"word_embedding_dimension": DIM, "pooling_mode_cls_token": True,
                   "pooling_mode_mean_tokens": False},
                  open(os.path.join(a.dir, "1_Pooling", "config.json"), "w"))
        json.dump({"max_seq_length": 16, "do_lower_case": False},
                  open(os.path.join(a.dir, "sentence_bert_config.json"), "w"))
    if a.prompts:
        json.dump({"prompts": {"query": "query: ", "none": ""}, "default_prompt_name": "query",
                   "similarity_fn_name": "cosine"},
                  open(os.path.join(a.dir, "config_sentence_transformers.json"), "w"))


if __name__ == "__main__":
    main()
