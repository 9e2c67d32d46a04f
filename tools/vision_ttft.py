#!/usr/bin/env python3
"""Time to first token of a chat with one 1,024 x 1,024 picture on a Qwen3-VL-8B-shaped model with
random weights, in Hugging Face transformers (bf16, its default attention), preprocessing
included; and the FLOP floor of that first token. Run on the GPU machine.

Writes OUT/ (config.json, the bf16 weights as transformers saves them, Qwen3's tokenizer from
--tokenizer with a Qwen3-VL chat template, preprocessor_config.json) and OUT/picture.png, which
`gizllm bench --model OUT --image OUT/picture.png` reads, so both engines time the same weights,
picture and prompt.

Shape: Qwen3-VL-8B's. Language model: hidden 4096, 36 layers, 32 query and 8 kv heads of 128,
FFN 12288, vocab 151936, interleaved M-RoPE sections [24, 20, 20]. Tower: 27 blocks of hidden
1152 (16 heads, MLP 4304), patch 16, temporal patch 2, merge 2, deepstack after blocks 8, 16 and
24, a learned position table of 48 x 48. Weights N(0, 0.02) (transformers' own initialisation,
seeded), norms 1. The picture: smooth colour gradients with a few shapes and a little noise (a
photograph-like PNG, 1,024 x 1,024, which the processor keeps at its size: 64 x 64 patches, 1,024
rows for the language model).

transformers' time: from PIL opening the PNG (decoding included) through the processor (its
default image processor) to generate(max_new_tokens=1) returning, the device synchronized; two
warm-up runs, then the median of --runs.

FLOPs: the tower (patch embedding, 27 blocks with full attention over the picture's 4,096
patches, the merger and three deepstack mergers) and the language model's prompt (every linear
of every row, causal attention, the head of the last row), 2 per multiply-add. The GEMM rate is
torch's best bf16 matmul over a few large shapes in the same process; floor = FLOPs / rate.

Usage: python3 tools/vision_ttft.py --out DIR --tokenizer DIR [--runs 10] [--layers 36]
Prints one JSON line.
"""
import argparse
import json
import lzma
import os
import statistics
import time

import numpy as np
import torch
import transformers
from PIL import Image

IMAGE, VIDEO, START, END = 151655, 151656, 151652, 151653
TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n{% else %}"
    "{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
PROMPT = "Describe the picture."
PROCESSOR = dict(patch_size=16, merge_size=2, temporal_patch_size=2, image_mean=[0.5, 0.5, 0.5],
                 image_std=[0.5, 0.5, 0.5],
                 size={"shortest_edge": 65536, "longest_edge": 16777216})


def make_config(layers):
    text = dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                num_hidden_layers=layers, num_attention_heads=32, num_key_value_heads=8,
                head_dim=128, max_position_embeddings=262144, rms_norm_eps=1e-6,
                initializer_range=0.02, tie_word_embeddings=False, attention_bias=False,
                hidden_act="silu",
                rope_parameters=dict(rope_type="default", rope_theta=5000000.0,
                                     mrope_section=[24, 20, 20], mrope_interleaved=True))
    vision = dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, in_channels=3,
                  patch_size=16, spatial_merge_size=2, temporal_patch_size=2,
                  out_hidden_size=4096, num_position_embeddings=2304,
                  deepstack_visual_indexes=[8, 16, 24], hidden_act="gelu_pytorch_tanh",
                  initializer_range=0.02)
    return transformers.Qwen3VLConfig(text_config=text, vision_config=vision,
                                      tie_word_embeddings=False, image_token_id=IMAGE,
                                      video_token_id=VIDEO, vision_start_token_id=START,
                                      vision_end_token_id=END)


def write_tokenizer(src, out):
    path = os.path.join(src, "tokenizer.json")
    data = open(path, "rb").read() if os.path.exists(path) else lzma.open(path + ".xz").read()
    open(os.path.join(out, "tokenizer.json"), "wb").write(data)
    cfg = json.load(open(os.path.join(src, "tokenizer_config.json")))
    cfg["chat_template"] = TEMPLATE
    json.dump(cfg, open(os.path.join(out, "tokenizer_config.json"), "w"), indent=2)
    json.dump(dict(PROCESSOR, image_processor_type="Qwen2VLImageProcessorFast",
                   processor_class="Qwen3VLProcessor"),
              open(os.path.join(out, "preprocessor_config.json"), "w"), indent=2)


def write_picture(path, size=1024):
    rng = np.random.default_rng(7)
    y, x = np.mgrid[0:size, 0:size].astype(np.float32) / size
    rgb = np.stack([0.5 + 0.5 * np.sin(6 * x + 2 * y), 0.5 + 0.5 * np.cos(4 * y - 3 * x),
                    x * y], axis=-1)
    for _ in range(12):  # discs of flat colour
        cx, cy, r = rng.uniform(0, 1), rng.uniform(0, 1), rng.uniform(0.03, 0.15)
        rgb[(x - cx) ** 2 + (y - cy) ** 2 < r * r] = rng.uniform(0, 1, 3)
    pixels = np.clip(rgb * 255 + rng.normal(0, 4, rgb.shape), 0, 255).astype(np.uint8)
    Image.fromarray(pixels).save(path)


def gemm_tflops():
    best = 0.0
    for m, k, n in ((8192, 4096, 12288), (4096, 4096, 4096), (8192, 8192, 8192)):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        for _ in range(3):
            a @ b
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(20):
            a @ b
        torch.cuda.synchronize()
        best = max(best, 2 * m * k * n * 20 / (time.perf_counter() - t) / 1e12)
    return best


def flops(config, patches, tokens):
    v, t = config.vision_config, config.text_config
    d, f, p = v.hidden_size, v.intermediate_size, patches
    patch_in = v.in_channels * v.temporal_patch_size * v.patch_size ** 2
    tower = 2 * p * patch_in * d
    tower += v.depth * (2 * p * (4 * d * d + 2 * d * f) + 4 * p * p * d)
    merged, wide = p // v.spatial_merge_size ** 2, d * v.spatial_merge_size ** 2
    tower += (1 + len(v.deepstack_visual_indexes)) * 2 * merged * (wide * wide +
                                                                    wide * v.out_hidden_size)
    h, q = t.hidden_size, t.num_attention_heads * t.head_dim
    kv = t.num_key_value_heads * t.head_dim
    per_row = 2 * (h * (q + 2 * kv) + q * h + 3 * h * t.intermediate_size)
    prompt = t.num_hidden_layers * (tokens * per_row + 2 * tokens * tokens * q)
    head = 2 * h * t.vocab_size
    return tower, prompt + head


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--layers", type=int, default=36)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    config = make_config(args.layers)
    torch.manual_seed(0)
    t = time.perf_counter()
    with torch.device("cuda"):
        model = transformers.Qwen3VLForConditionalGeneration._from_config(
            config, dtype=torch.bfloat16)
    model.eval()
    model.save_pretrained(args.out)
    write_tokenizer(args.tokenizer, args.out)
    picture = os.path.join(args.out, "picture.png")
    write_picture(picture)
    made_s = time.perf_counter() - t

    tok = transformers.AutoTokenizer.from_pretrained(args.out)
    fast = getattr(transformers, "Qwen2VLImageProcessorFast", None)
    image_processor = (fast or transformers.Qwen2VLImageProcessor)(**PROCESSOR)
    processor = transformers.Qwen3VLProcessor(
        image_processor=image_processor, tokenizer=tok,
        video_processor=transformers.Qwen3VLVideoProcessor(), chat_template=TEMPLATE)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PROMPT}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def once():
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        image = Image.open(picture).convert("RGB")
        inputs = processor(text=[text], images=[image], return_tensors="pt").to("cuda")
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(**inputs, max_new_tokens=1, do_sample=False)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        assert out.shape[1] == inputs["input_ids"].shape[1] + 1
        return t2 - t0, t1 - t0, inputs

    for _ in range(2):
        once()
    runs = [once() for _ in range(args.runs)]
    inputs = runs[-1][2]
    tokens = int(inputs["input_ids"].shape[1])
    grid = [int(v) for v in inputs["image_grid_thw"].reshape(-1)]
    patches = grid[0] * grid[1] * grid[2]
    del model
    torch.cuda.empty_cache()
    rate = gemm_tflops()
    tower, prompt = flops(config, patches, tokens)
    print(json.dumps({
        "model": args.out, "picture": picture, "prompt_tokens": tokens, "grid_thw": grid,
        "image_processor": type(image_processor).__name__,
        "attention": config._attn_implementation if hasattr(config, "_attn_implementation") else "",
        "transformers": transformers.__version__, "torch": torch.__version__,
        "hf_ttft_ms": 1e3 * statistics.median(r[0] for r in runs),
        "hf_ttft_min_ms": 1e3 * min(r[0] for r in runs),
        "hf_preprocess_ms": 1e3 * statistics.median(r[1] for r in runs),
        "tower_gflop": tower / 1e9, "prompt_gflop": prompt / 1e9,
        "gemm_tflops": rate, "floor_ms": (tower + prompt) / (rate * 1e12) * 1e3,
        "made_s": made_s}), flush=True)


if __name__ == "__main__":
    main()
