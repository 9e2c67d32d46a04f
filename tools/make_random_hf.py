#!/usr/bin/env python3
"""Writes a Hugging Face folder of a Qwen3-shaped model with random bf16 weights, for end-to-end
benchmarks (`gizllm bench --model DIR`) on the GPU machine, where no checkpoint can be fetched.

Default shape: Qwen3-8B (hidden 4096, 36 layers, 32 query and 8 kv heads of 128, FFN 12288, vocab
151936, untied head). Linear weights are N(0, 0.02), norms 1, made on the GPU from a fixed seed and
written in shards of at most 4 GiB with an index, as transformers saves them. The tokenizer files
come from --tokenizer (a folder with tokenizer.json and tokenizer_config.json; tokenizer.json.xz
is read too).

With --hybrid: a Qwen3.5-MoE text model (Qwen3_5MoeForCausalLM) of the Qwen3.5-35B-A3B shape
instead: hidden 2048, every fourth layer full attention (16 query heads with their output gates
over 2 kv heads of 256, partial rotary 0.25, interleaved M-RoPE sections) and the others gated
delta-rule layers (16 key and 32 value heads of 128, convolution of 4), every layer 256 experts of
512 (top 8) and a gated shared expert of 512; --layers cuts it (40 in the real model). Its
(1 + weight) norms are written as zeros, A_log as zeros and dt_bias as ones.

With --experts N: a Qwen3-MoE (Qwen3MoeForCausalLM) instead, every layer a mixture of N experts of
--moe-ffn, --experts-per-token a token, one tensor per expert (Qwen3-30B-A3B: --hidden 2048
--experts 128 --moe-ffn 768 --experts-per-token 8 --heads 32 --kv-heads 4). Random router rows
route uniformly; --router-zipf S skews the routing: in each layer the experts take the ranks
1..N in a seeded random order and expert of rank r has router row std 0.02 r^-S, so experts of
high rank win the top k more often (a hot set, as trained routers have; S = 0 is uniform). The
hit rate the skew gives an expert cache is what `gizllm bench --expert-cache` reports.

Usage: python3 tools/make_random_hf.py --out DIR --tokenizer DIR [--layers N] [--hybrid]
       [--experts N --moe-ffn F --experts-per-token K [--router-zipf S]]
"""
import argparse
import json
import lzma
import os
import shutil

import torch
from safetensors.torch import save_file


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--ffn", type=int, default=12288)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--experts", type=int, default=0, help="0: a dense Qwen3")
    ap.add_argument("--moe-ffn", type=int, default=768)
    ap.add_argument("--experts-per-token", type=int, default=8)
    ap.add_argument("--router-zipf", type=float, default=0.0)
    ap.add_argument("--hybrid", action="store_true",
                    help="a Qwen3.5-35B-A3B-shaped hybrid (see above)")
    args = ap.parse_args()
    if args.hybrid:
        return hybrid(args)
    moe = args.experts > 0
    os.makedirs(args.out, exist_ok=True)
    h, f, d = args.hidden, args.ffn, args.head_dim
    config = {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": h,
        "intermediate_size": f, "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads, "num_key_value_heads": args.kv_heads, "head_dim": d,
        "vocab_size": args.vocab, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "tie_word_embeddings": False, "hidden_act": "silu",
        "attention_bias": False, "torch_dtype": "bfloat16", "bos_token_id": 151643,
        "eos_token_id": 151645, "use_sliding_window": False,
    }
    if moe:
        config.update({
            "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
            "num_experts": args.experts, "num_experts_per_tok": args.experts_per_token,
            "moe_intermediate_size": args.moe_ffn, "decoder_sparse_step": 1,
            "mlp_only_layers": [], "norm_topk_prob": True,
        })
    with open(os.path.join(args.out, "config.json"), "w") as fh:
        json.dump(config, fh, indent=2)
    with open(os.path.join(args.out, "generation_config.json"), "w") as fh:
        json.dump({"eos_token_id": [151645, 151643]}, fh)
    copy_tokenizer(args)

    gen = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape):
        t = torch.empty(*shape, device="cuda", dtype=torch.bfloat16)
        t.normal_(0.0, 0.02, generator=gen)
        return t

    def ones(n):
        return torch.ones(n, device="cuda", dtype=torch.bfloat16)

    shards, current, size = [], {}, 0

    def add(name, t):
        nonlocal current, size
        if size + t.numel() * 2 > (4 << 30) and current:
            shards.append(current)
            current, size = {}, 0
        current[name] = t.cpu()
        size += t.numel() * 2

    add("model.embed_tokens.weight", rand(args.vocab, h))
    for layer in range(args.layers):
        p = f"model.layers.{layer}."
        add(p + "input_layernorm.weight", ones(h))
        add(p + "self_attn.q_proj.weight", rand(args.heads * d, h))
        add(p + "self_attn.k_proj.weight", rand(args.kv_heads * d, h))
        add(p + "self_attn.v_proj.weight", rand(args.kv_heads * d, h))
        add(p + "self_attn.o_proj.weight", rand(h, args.heads * d))
        add(p + "self_attn.q_norm.weight", ones(d))
        add(p + "self_attn.k_norm.weight", ones(d))
        add(p + "post_attention_layernorm.weight", ones(h))
        if moe:
            router = rand(args.experts, h)
            if args.router_zipf > 0:
                order = torch.randperm(args.experts, device="cuda", generator=gen)
                rank = torch.empty(args.experts, device="cuda")
                rank[order] = torch.arange(1, args.experts + 1, device="cuda", dtype=torch.float)
                router = (router.float() * rank.pow(-args.router_zipf)[:, None]).bfloat16()
            add(p + "mlp.gate.weight", router)
            for e in range(args.experts):
                q = f"{p}mlp.experts.{e}."
                add(q + "gate_proj.weight", rand(args.moe_ffn, h))
                add(q + "up_proj.weight", rand(args.moe_ffn, h))
                add(q + "down_proj.weight", rand(h, args.moe_ffn))
        else:
            add(p + "mlp.gate_proj.weight", rand(f, h))
            add(p + "mlp.up_proj.weight", rand(f, h))
            add(p + "mlp.down_proj.weight", rand(h, f))
    add("model.norm.weight", ones(h))
    add("lm_head.weight", rand(args.vocab, h))
    shards.append(current)
    write_shards(args, shards)


def copy_tokenizer(args):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        src = os.path.join(args.tokenizer, name)
        if os.path.exists(src):
            shutil.copy(src, os.path.join(args.out, name))
        elif os.path.exists(src + ".xz"):
            with lzma.open(src + ".xz") as fin, open(os.path.join(args.out, name), "wb") as fout:
                shutil.copyfileobj(fin, fout)


def hybrid(args):
    os.makedirs(args.out, exist_ok=True)
    h, layers, vocab = 2048, args.layers, args.vocab
    heads, kv_heads, d = 16, 2, 256
    lk, lv, ld, conv = 16, 32, 128, 4
    experts, moe_ffn, top, shared = 256, 512, 8, 512
    types = ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(layers)]
    config = {
        "architectures": ["Qwen3_5MoeForCausalLM"], "model_type": "qwen3_5_moe_text",
        "hidden_size": h, "num_hidden_layers": layers, "layer_types": types,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": d,
        "linear_num_key_heads": lk, "linear_num_value_heads": lv, "linear_key_head_dim": ld,
        "linear_value_head_dim": ld, "linear_conv_kernel_dim": conv,
        "num_experts": experts, "num_experts_per_tok": top, "moe_intermediate_size": moe_ffn,
        "shared_expert_intermediate_size": shared, "vocab_size": vocab,
        "max_position_embeddings": 262144, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
        "hidden_act": "silu", "attention_bias": False, "torch_dtype": "bfloat16",
        "full_attention_interval": 4, "partial_rotary_factor": 0.25,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0,
                            "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10],
                            "mrope_interleaved": True},
        "bos_token_id": 151643, "eos_token_id": 151645,
    }
    with open(os.path.join(args.out, "config.json"), "w") as fh:
        json.dump(config, fh, indent=2)
    with open(os.path.join(args.out, "generation_config.json"), "w") as fh:
        json.dump({"eos_token_id": [151645, 151643]}, fh)
    copy_tokenizer(args)
    gen = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape):
        t = torch.empty(*shape, device="cuda", dtype=torch.bfloat16)
        t.normal_(0.0, 0.02, generator=gen)
        return t

    def full(n, value):
        return torch.full((n,), value, device="cuda", dtype=torch.bfloat16)

    shards, current, size = [], {}, 0

    def add(name, t):
        nonlocal current, size
        if size + t.numel() * 2 > (4 << 30) and current:
            shards.append(current)
            current, size = {}, 0
        current[name] = t.cpu()
        size += t.numel() * 2

    add("model.embed_tokens.weight", rand(vocab, h))
    qkv = 2 * lk * ld + lv * ld
    for layer in range(layers):
        p = f"model.layers.{layer}."
        add(p + "input_layernorm.weight", full(h, 0.0))
        add(p + "post_attention_layernorm.weight", full(h, 0.0))
        if types[layer] == "full_attention":
            add(p + "self_attn.q_proj.weight", rand(2 * heads * d, h))
            add(p + "self_attn.k_proj.weight", rand(kv_heads * d, h))
            add(p + "self_attn.v_proj.weight", rand(kv_heads * d, h))
            add(p + "self_attn.o_proj.weight", rand(h, heads * d))
            add(p + "self_attn.q_norm.weight", full(d, 0.0))
            add(p + "self_attn.k_norm.weight", full(d, 0.0))
        else:
            q = p + "linear_attn."
            add(q + "in_proj_qkv.weight", rand(qkv, h))
            add(q + "in_proj_z.weight", rand(lv * ld, h))
            add(q + "in_proj_b.weight", rand(lv, h))
            add(q + "in_proj_a.weight", rand(lv, h))
            add(q + "conv1d.weight", rand(qkv, 1, conv))
            add(q + "dt_bias", full(lv, 1.0))
            add(q + "A_log", full(lv, 0.0))
            add(q + "norm.weight", full(ld, 1.0))
            add(q + "out_proj.weight", rand(h, lv * ld))
        add(p + "mlp.gate.weight", rand(experts, h))
        for e in range(experts):
            q = f"{p}mlp.experts.{e}."
            add(q + "gate_proj.weight", rand(moe_ffn, h))
            add(q + "up_proj.weight", rand(moe_ffn, h))
            add(q + "down_proj.weight", rand(h, moe_ffn))
        add(p + "mlp.shared_expert.gate_proj.weight", rand(shared, h))
        add(p + "mlp.shared_expert.up_proj.weight", rand(shared, h))
        add(p + "mlp.shared_expert.down_proj.weight", rand(h, shared))
        add(p + "mlp.shared_expert_gate.weight", rand(1, h))
    add("model.norm.weight", full(h, 0.0))
    add("lm_head.weight", rand(vocab, h))
    shards.append(current)
    write_shards(args, shards)


def write_shards(args, shards):
    index = {"metadata": {"total_size": 0}, "weight_map": {}}
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, os.path.join(args.out, name), metadata={"format": "pt"})
        for k, t in shard.items():
            index["weight_map"][k] = name
            index["metadata"]["total_size"] += t.numel() * 2
    with open(os.path.join(args.out, "model.safetensors.index.json"), "w") as fh:
        json.dump(index, fh, indent=2)
    print(f"wrote {args.out}: {len(shards)} shards, {index['metadata']['total_size'] / 1e9:.2f} GB")


if __name__ == "__main__":
    main()
