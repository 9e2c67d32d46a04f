#!/usr/bin/env python3
"""The peer for bench/cuda: transformers on the same GPU and the same Qwen3-8B-shaped model.

Random bf16 weights (std 0.02) made on the GPU from a config (hidden 4096, 36 layers, 32 query and
8 kv heads of 128, FFN 12288, vocab 151936, untied head, every layer full attention). Measures, as
bench/cuda/cuda_bench does: batch-1 decode tokens/s at context 512 and 8192, decode at 8..256
sequences at context 192, and the time to first token of a 2,048-token prompt. Static cache;
--compile adds torch.compile of the decode step (mode "reduce-overhead") for batch 1.

Each group of workloads runs in its own process, so a failure in one (a device-side assert ends
the CUDA context) still leaves the others' figures.

Usage: python3 tools/hf_peer_bench.py [--compile] [--quick] [--group decode1|batched|prefill]
"""
import argparse
import subprocess
import sys
import time

import torch
import transformers
from transformers import Qwen3Config, Qwen3ForCausalLM, StaticCache

LAYERS = 36


def make_model():
    config = Qwen3Config(
        hidden_size=4096, num_hidden_layers=LAYERS, num_attention_heads=32, num_key_value_heads=8,
        head_dim=128, intermediate_size=12288, vocab_size=151936, tie_word_embeddings=False,
        max_position_embeddings=16384, rms_norm_eps=1e-6, use_sliding_window=False,
        sliding_window=None, layer_types=["full_attention"] * LAYERS)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = Qwen3ForCausalLM(config)
    torch.set_default_dtype(torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    return model.eval(), config


def make_cache(config, batch, positions):
    """A static cache that holds `positions` positions (0 .. positions-1) of `batch` sequences."""
    # Room rounded up to a multiple of 256 (the cache length is the attention's key count).
    length = (positions + 255) // 256 * 256
    cache = StaticCache(config=config, max_batch_size=batch, max_cache_len=length,
                        device="cuda", dtype=torch.bfloat16)
    held = cache.get_max_cache_shape() if hasattr(cache, "get_max_cache_shape") else length
    if held is not None and held < positions:
        raise RuntimeError(f"static cache holds {held} positions, the benchmark uses {positions}")
    return cache


def timed(fn, reps):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


@torch.no_grad()
def decode_time(model, config, batch, context, reps, compiled=None):
    # The prompt fills positions 0 .. context-1; the step writes position `context`.
    cache = make_cache(config, batch, context + 1)
    prompt = torch.randint(0, config.vocab_size, (batch, context), device="cuda")
    model(input_ids=prompt, past_key_values=cache, use_cache=True,
          cache_position=torch.arange(context, device="cuda"), logits_to_keep=1)
    token = torch.randint(0, config.vocab_size, (batch, 1), device="cuda")
    position = torch.tensor([context], device="cuda")
    step = compiled if compiled is not None else model

    def run():
        # The same position each time: the step re-writes one cache entry, as a decode does.
        step(input_ids=token, past_key_values=cache, use_cache=True, cache_position=position)

    return timed(run, reps)


@torch.no_grad()
def prefill_time(model, config, n, reps):
    prompt = torch.randint(0, config.vocab_size, (1, n), device="cuda")

    def run():
        cache = make_cache(config, 1, n)
        out = model(input_ids=prompt, past_key_values=cache, use_cache=True,
                    cache_position=torch.arange(n, device="cuda"), logits_to_keep=1)
        out.logits.float().argmax()

    return timed(run, reps)


def run_group(group, args):
    reps = 3 if args.quick else 10
    model, config = make_model()
    if group == "decode1":
        for context in (512, 8192):
            t = decode_time(model, config, 1, context, reps)
            print(f"hf eager decode batch 1, context {context}: {t * 1e3:.2f} ms, "
                  f"{1 / t:.1f} tokens/s", flush=True)
        if args.compile:
            compiled = torch.compile(model, mode="reduce-overhead", fullgraph=False)
            t0 = time.perf_counter()
            for context in (512, 8192):
                t = decode_time(model, config, 1, context, reps, compiled=compiled)
                print(f"hf compiled decode batch 1, context {context}: {t * 1e3:.2f} ms, "
                      f"{1 / t:.1f} tokens/s (compile and run {time.perf_counter() - t0:.0f} s)",
                      flush=True)
    elif group == "batched":
        for batch in (8, 32, 64, 128, 256):
            t = decode_time(model, config, batch, 192, reps)
            print(f"hf eager decode {batch} sequences, context 192: {t * 1e3:.2f} ms, "
                  f"{batch / t:.1f} tokens/s", flush=True)
    elif group == "prefill":
        t = prefill_time(model, config, 2048, 3 if args.quick else 5)
        print(f"hf prefill 2048 tokens: {t * 1e3:.2f} ms, {2048 / t:.0f} tokens/s", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--group", choices=["decode1", "batched", "prefill"])
    parser.add_argument("--group-timeout", type=float, default=120.0)
    args = parser.parse_args()
    if args.group:
        run_group(args.group, args)
        return
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name()}", flush=True)
    flags = (["--compile"] if args.compile else []) + (["--quick"] if args.quick else [])
    for group in ("decode1", "batched", "prefill"):
        t0 = time.perf_counter()
        try:
            rc = subprocess.run([sys.executable, __file__, "--group", group] + flags,
                                timeout=args.group_timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        print(f"group {group}: rc {rc}, {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
