#!/usr/bin/env python3
"""Writes the Qwen3-VL, Qwen3-VL-MoE and Qwen3.5 golden cases the vision tests compare against, with Hugging
Face transformers.

Run where transformers and torch are (the GPU machine); everything runs on the CPU in float32.
Random tiny models (bf16 weights, seeded), each with a tower of 3 blocks (hidden 16, 2 heads,
patch 4, merge 2, a learned position table of 5 x 5 interpolated to each grid) and a byte-level
tokenizer whose special tokens hold the image, video and vision start/end ids:
  qwen3_vl: Qwen3VLForConditionalGeneration, deepstack after blocks 0 and 2, a Qwen3 text model
      of 3 layers (hidden 64, 2 heads of 32 over 1 kv head, the head_dim the CUDA attention
      takes; interleaved M-RoPE sections [4, 6, 6]);
  qwen3_vl_moe: Qwen3VLMoeForConditionalGeneration, the same tower and text model with mixtures
      of experts (4 experts of width 48, 2 a token) on layers 0 and 2 and a dense layer 1
      (mlp_only_layers); its stacked experts are stored transposed, as the released checkpoints
      store them (gate_up_proj [experts, hidden, 2 * 48], down_proj [experts, 48, hidden]), once
      transformers is seen to read them back so;
  qwen3_5: Qwen3_5ForConditionalGeneration (no deepstack), a hybrid text model of 4 layers
      (linear, full, linear, full attention; head_dim 32, partial rotary 0.5, M-RoPE sections
      [2, 2, 4]).
Two pictures of random pixel values with grids [1, 4, 6] and [1, 6, 4] (6 rows each for the
language model) in one prompt. Writes OUT/<family>/:
  config.json, generation_config.json, model.safetensors, tokenizer.json, tokenizer_config.json
  reference.safetensors:
    pixel_values float32 [48, 96]   the pictures' patches, as the image processor lays them out
    grid_thw     int64 [2, 3]
    ids          int64 [tokens]     the prompt
    tower        float32 [12, 64]   the merger's rows (the language model's picture rows)
    deepstack    float32 [2, 12, 64] the deepstack mergers' rows (qwen3_vl, qwen3_vl_moe)
    positions    int64 [3, tokens]  get_rope_index's time, height and width positions
    logits       float32 [tokens, vocab]
  preprocessor_config.json, video_preprocessor_config.json  the tiny processors (patch 4,
      merge 2, temporal patch 2; videos sampled at 2 frames a second, 4 to 16 frames)
  video/frame_0.png .. frame_7.png  a short video: 8 random 40 x 24 frames taken at 4 frames a
      second, which the video processor samples to frames 0, 2, 5 and 7 (two temporal patches)
  reference_video.safetensors: a chat with that video, the same decoded frames fed to
      transformers' processor and model:
    pixel_values float32 [120, 96]  the sampled frames' patches (grid [2, 6, 10])
    grid_thw     int64 [1, 3]
    ids          int64 [tokens]     the chat's prompt, each temporal patch after its timestamp
                                    ("<0.2 seconds>"), as Qwen3VLProcessor expands the video
    processor_ids int64 [tokens]    the same from Qwen3VLProcessor itself, where it runs
    tower, deepstack, positions, logits   as above, for the video
Usage: python3 tools/make_vision_golden.py --out tests/golden/vision
    [--families qwen3_vl qwen3_vl_moe qwen3_5]

With --video DIR...: for each folder DIR written above (its model as saved), writes the video
case alone (the processor configs, video/ and reference_video.safetensors).
With --fast DIR...: for each folder DIR written above, writes DIR/reference_fast.safetensors: the
picture case computed as the CUDA fast mode computes it (tools/make_golden.py's --bf16-inputs
--fast rules): the input of every product with a weight rounded to bf16 (the tower's patch
embedding, q/k/v, projections and MLPs, the mergers, the language model's linears and head),
the attention operands of the language model and of the tower rounded to fp16 as the
tensor-core kernels round them (the decoder's tile kernel, the encoder attention's), everything
else float32:
    tower     float32 [12, 64]
    deepstack float32 [2, 12, 64]  (qwen3_vl, qwen3_vl_moe)
    logits    float32 [tokens, vocab]
The float32 references stay the truth.
"""
import argparse
import inspect
import json
import os
import sys

import torch
from safetensors.torch import save_file
import transformers

# The tokenizer's special tokens, after the 256 byte tokens: their ids are the config's.
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
            "<|image_pad|>", "<|video_pad|>", "<|endoftext|>"]
VOCAB = 264  # the 256 byte tokens and the special ones
GRIDS = [[1, 4, 6], [1, 6, 4]]


def special_id(name):
    return 256 + SPECIALS.index(name)


FAMILIES = ["qwen3_vl", "qwen3_5", "qwen3_vl_moe"]
DEEPSTACK = ("qwen3_vl", "qwen3_vl_moe")  # the families whose tower has deepstack mergers


def model_class(family):
    return {"qwen3_vl": transformers.Qwen3VLForConditionalGeneration,
            "qwen3_vl_moe": transformers.Qwen3VLMoeForConditionalGeneration,
            "qwen3_5": transformers.Qwen3_5ForConditionalGeneration}[family]


def eager_experts(model):
    """Experts the eager way: a loop over the experts through F.linear (the default backends,
    grouped_mm and batched_mm, multiply otherwise, and --fast's rounding hook would miss them)."""
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_experts_implementation"):
            config._experts_implementation = "eager"


def tiny_vision(family):
    vision = dict(depth=3, hidden_size=16, intermediate_size=32, num_heads=2, in_channels=3,
                  patch_size=4, spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=64,
                  num_position_embeddings=25, hidden_act="gelu_pytorch_tanh",
                  initializer_range=0.2)
    if family in DEEPSTACK:
        vision["deepstack_visual_indexes"] = [0, 2]
    return vision


def token_ids():
    return dict(image_token_id=special_id("<|image_pad|>"),
                video_token_id=special_id("<|video_pad|>"),
                vision_start_token_id=special_id("<|vision_start|>"),
                vision_end_token_id=special_id("<|vision_end|>"))


def tiny_config(family):
    if family == "qwen3_5":
        text = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=48, num_hidden_layers=4,
                    num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                    max_position_embeddings=512, rms_norm_eps=1e-6, initializer_range=0.2,
                    tie_word_embeddings=False, attention_bias=False,
                    layer_types=["linear_attention", "full_attention", "linear_attention",
                                 "full_attention"],
                    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                    linear_value_head_dim=12, linear_conv_kernel_dim=4,
                    rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                         partial_rotary_factor=0.5, mrope_section=[2, 2, 4],
                                         mrope_interleaved=True))
        return transformers.Qwen3_5Config(text_config=text, vision_config=tiny_vision(family),
                                          tie_word_embeddings=False, **token_ids())
    text = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=48, num_hidden_layers=3,
                num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                max_position_embeddings=512, rms_norm_eps=1e-6, initializer_range=0.2,
                tie_word_embeddings=False, attention_bias=False,
                rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                     mrope_section=[4, 6, 6], mrope_interleaved=True))
    if family == "qwen3_vl_moe":
        # hidden 64 and expert width 48: neither stacked tensor's shape reads both ways.
        text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48,
                    decoder_sparse_step=1, mlp_only_layers=[1])
        return transformers.Qwen3VLMoeConfig(text_config=text, vision_config=tiny_vision(family),
                                             tie_word_embeddings=False, **token_ids())
    return transformers.Qwen3VLConfig(text_config=text, vision_config=tiny_vision(family),
                                      tie_word_embeddings=False, **token_ids())


def write_tokenizer(folder):
    """Byte-level BPE without merges (one token a byte, ids 0..255 in the byte-level alphabet's
    order) and the special tokens at 256 and after."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    for s in SPECIALS:
        assert tok.token_to_id(s) == special_id(s), (s, tok.token_to_id(s))
    tok.save(os.path.join(folder, "tokenizer.json"))
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 512,
               "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
              open(os.path.join(folder, "tokenizer_config.json"), "w"), indent=2)
    return tok


def check_saved(family, folder):
    """The saved folder holds what gizllm's recipe reads, by name."""
    from safetensors import safe_open
    names = set()
    for f in os.listdir(folder):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(folder, f), "pt") as st:
                names.update(st.keys())
    expected = ["model.visual.patch_embed.proj.weight", "model.visual.pos_embed.weight",
                "model.visual.blocks.0.attn.qkv.weight", "model.visual.merger.linear_fc2.weight",
                "model.language_model.layers.1.self_attn.q_proj.weight",
                "model.language_model.embed_tokens.weight", "lm_head.weight"]
    if family in DEEPSTACK:
        expected.append("model.visual.deepstack_merger_list.1.norm.weight")
    if family == "qwen3_vl_moe":
        expected += ["model.language_model.layers.0.mlp.gate.weight",
                     "model.language_model.layers.0.mlp.experts.gate_up_proj",
                     "model.language_model.layers.2.mlp.experts.down_proj",
                     "model.language_model.layers.1.mlp.gate_proj.weight"]
    else:
        expected.append("model.language_model.layers.0.linear_attn.in_proj_qkv.weight")
    for name in expected:
        assert name in names, f"{name} not saved ({sorted(names)[:8]}...)"


def store_experts_transposed(folder, model):
    """Rewrites the saved stacked experts as Qwen3-VL-MoE's released checkpoints hold them
    (gate_up_proj [experts, hidden, 2 * ffn], down_proj [experts, ffn, hidden]) and checks that
    transformers reads them back as the model's own; where it does not, the folder keeps the
    layout save_pretrained wrote (and says so)."""
    from safetensors.torch import load_file
    path = os.path.join(folder, "model.safetensors")
    saved = load_file(path)
    params = dict(model.named_parameters())
    stored = dict(saved)
    for name, t in saved.items():
        if name.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")):
            own = params[name].shape
            if t.shape == own:  # as transformers 5 holds it
                stored[name] = t.transpose(1, 2).contiguous()
            else:  # already as the released checkpoints hold it
                assert t.shape == (own[0], own[2], own[1]), (name, t.shape, own)
    save_file(stored, path, metadata={"format": "pt"})
    try:
        back = model_class("qwen3_vl_moe").from_pretrained(folder, dtype=torch.bfloat16)
        ok = all(torch.equal(p, params[n]) for n, p in back.named_parameters())
    except Exception as e:
        print(f"qwen3_vl_moe: reading the transposed experts failed: {type(e).__name__}: {e}",
              flush=True)
        ok = False
    if not ok:
        save_file(saved, path, metadata={"format": "pt"})
        print("qwen3_vl_moe: transformers does not read the transposed experts back; the folder "
              "keeps the layout save_pretrained wrote", flush=True)
    else:
        print("qwen3_vl_moe: experts stored transposed, read back equal", flush=True)


def call_with(fn, args, optional, through_kwargs):
    """fn(**args) plus those of `optional` its signature names (or, with through_kwargs, takes
    through **kwargs: a method that hands them on to its parent class's)."""
    params = inspect.signature(fn).parameters
    var_keyword = any(p.kind == p.VAR_KEYWORD for p in params.values())
    kwargs = dict(args)
    for k, v in optional.items():
        if k in params or (through_kwargs and var_keyword):
            kwargs[k] = v
    return fn(**kwargs)


def write(out, family, seed):
    torch.manual_seed(seed)
    config = tiny_config(family)
    model = model_class(family)._from_config(config, dtype=torch.bfloat16,
                                             attn_implementation="eager")
    # Norm weights random around what they multiply by (1 for the tower's LayerNorms and
    # Qwen3-VL's RMSNorms, 0 for Qwen3.5's (1 + weight) RMSNorms, 1 for its gated norm) and
    # biases random, so that a missing or misplaced one shows. Qwen3.5's A_log from the log of
    # [0.02, 0.25], as tools/make_golden.py does (a slow decay, the recurrence carried on).
    with torch.no_grad():
        for name, p in model.named_parameters():
            one = (name.startswith("model.visual.") or family in DEEPSTACK
                   or name.endswith("linear_attn.norm.weight"))
            if name.endswith("bias"):
                p.copy_(torch.randn_like(p, dtype=torch.float32).mul(0.3).to(p.dtype))
            elif "norm" in name:
                p.copy_(torch.randn_like(p, dtype=torch.float32).mul(0.3)
                        .add(1.0 if one else 0.0).to(p.dtype))
            if name.endswith("linear_attn.A_log"):
                p.copy_(torch.empty_like(p, dtype=torch.float32).uniform_(0.02, 0.25).log()
                        .to(p.dtype))
    folder = os.path.join(out, family)
    os.makedirs(folder, exist_ok=True)
    model.save_pretrained(folder)
    check_saved(family, folder)
    if family == "qwen3_vl_moe":
        store_experts_transposed(folder, model)
    tok = write_tokenizer(folder)
    model = model.float().eval()
    eager_experts(model)
    if family == "qwen3_5":
        # The recurrent layers' torch paths (no flash-linear-attention or causal-conv1d kernels).
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from make_golden import use_torch_recurrence
        use_torch_recurrence(model)

    g = torch.Generator().manual_seed(seed + 1)
    vc = config.vision_config
    patch_floats = vc.in_channels * vc.temporal_patch_size * vc.patch_size ** 2
    grid_thw = torch.tensor(GRIDS, dtype=torch.int64)
    patches = int(grid_thw.prod(-1).sum())
    pixel_values = torch.randn(patches, patch_floats, generator=g, dtype=torch.float32)
    rows = [t * h * w // vc.spatial_merge_size ** 2 for t, h, w in GRIDS]
    picture = lambda n: "<|vision_start|>" + "<|image_pad|>" * n + "<|vision_end|>"
    text = f"Two: {picture(rows[0])} then {picture(rows[1])}, which?"
    ids = torch.tensor(tok.encode(text).ids, dtype=torch.int64)
    image = config.image_token_id
    assert int((ids == image).sum()) == sum(rows), ids.tolist()
    mm_token_type_ids = (ids == image).to(torch.int32)[None]
    attention_mask = torch.ones_like(ids)[None]

    with torch.no_grad():
        tower, deepstack = run_tower(model, pixel_values, grid_thw)
        assert tower.shape == (sum(rows), config.text_config.hidden_size), tower.shape
        expected = vc.deepstack_visual_indexes if family in DEEPSTACK else []
        assert len(deepstack) == len(expected), len(deepstack)
        # mm_token_type_ids (0 text, 1 image) where this transformers' version takes them.
        positions, _ = call_with(
            model.model.get_rope_index,
            dict(input_ids=ids[None], image_grid_thw=grid_thw, attention_mask=attention_mask),
            dict(mm_token_type_ids=mm_token_type_ids), through_kwargs=True)
        res = call_with(
            model.forward,
            dict(input_ids=ids[None], pixel_values=pixel_values, image_grid_thw=grid_thw,
                 attention_mask=attention_mask),
            dict(mm_token_type_ids=mm_token_type_ids), through_kwargs=False)
    positions = positions.reshape(-1, positions.shape[-1])[-3:]  # (3, tokens); a text row first
    tensors = {
        "pixel_values": pixel_values.contiguous(),
        "grid_thw": grid_thw.contiguous(),
        "ids": ids.contiguous(),
        "tower": tower.float().contiguous(),
        "positions": positions.to(torch.int64).contiguous(),
        "logits": res.logits[0].float().contiguous(),
    }
    if deepstack:
        tensors["deepstack"] = torch.stack([d.float() for d in deepstack]).contiguous()
    save_file(tensors, os.path.join(folder, "reference.safetensors"))
    total = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
    print(family, "written:", len(ids), "tokens,", total // 1024, "KiB", flush=True)
    try:
        write_video(folder, family, config, model, seed)
    except Exception as e:  # the pictures' reference is written
        print(f"{family} video: FAILED: {type(e).__name__}: {e}", flush=True)


VIDEO_FRAMES, VIDEO_FPS, VIDEO_HEIGHT, VIDEO_WIDTH = 8, 4.0, 24, 40
PROCESSOR = dict(patch_size=4, merge_size=2, temporal_patch_size=2, image_mean=[0.5, 0.5, 0.5],
                 image_std=[0.5, 0.5, 0.5])
VIDEO_PROCESSOR = dict(PROCESSOR, size={"shortest_edge": 1024, "longest_edge": 65536}, fps=2,
                       min_frames=4, max_frames=16, do_sample_frames=True)


def run_tower(model, pixel_values, grid_thw):
    """The vision tower's rows and deepstack features, whatever shape this transformers returns."""
    vis = model.model.visual(pixel_values, grid_thw=grid_thw)
    if isinstance(vis, tuple):
        return vis[0], (vis[1] if len(vis) > 1 else [])
    if isinstance(vis, torch.Tensor):
        return vis, []
    return vis.pooler_output, getattr(vis, "deepstack_features", None) or []


def write_video(folder, family, config, model, seed):
    """reference_video.safetensors: a chat with a short video, its frames saved as PNG (lossless:
    the C++ test decodes the same frames) and sampled, resized and cut by transformers' video
    processor, its prompt expanded as Qwen3VLProcessor expands it."""
    import numpy as np
    from PIL import Image
    from transformers.video_utils import VideoMetadata
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor

    json.dump(dict(PROCESSOR, size={"shortest_edge": 64, "longest_edge": 65536}),
              open(os.path.join(folder, "preprocessor_config.json"), "w"), indent=2)
    json.dump(VIDEO_PROCESSOR, open(os.path.join(folder, "video_preprocessor_config.json"), "w"),
              indent=2)
    g = torch.Generator().manual_seed(seed + 2)
    os.makedirs(os.path.join(folder, "video"), exist_ok=True)
    frames = []
    for i in range(VIDEO_FRAMES):
        pixels = torch.randint(0, 256, (VIDEO_HEIGHT, VIDEO_WIDTH, 3), generator=g,
                               dtype=torch.uint8).numpy()
        path = os.path.join(folder, "video", f"frame_{i}.png")
        Image.fromarray(pixels).save(path)
        frames.append(np.asarray(Image.open(path).convert("RGB")))
    frames = np.stack(frames)

    kwargs = {k: v for k, v in VIDEO_PROCESSOR.items() if k != "do_sample_frames"}
    vp = transformers.Qwen3VLVideoProcessor(**kwargs)
    indices = [int(i) for i in vp.sample_frames(VideoMetadata(total_num_frames=VIDEO_FRAMES,
                                                              fps=VIDEO_FPS))]
    assert indices == [0, 2, 5, 7], indices
    try:
        out_v = vp([frames[indices]], do_sample_frames=False, cap_pixels_per_frame=False,
                   return_tensors="pt")
    except (TypeError, ValueError):  # a transformers without cap_pixels_per_frame
        out_v = vp([frames[indices]], do_sample_frames=False, return_tensors="pt")
    pixel_values = out_v["pixel_values_videos"]
    if pixel_values.ndim == 3:  # [videos, patches, dim]
        pixel_values = pixel_values[0]
    pixel_values = pixel_values.float().contiguous()
    grid_thw = out_v["video_grid_thw"].reshape(-1, 3).to(torch.int64)
    t, h, w = (int(v) for v in grid_thw[0])
    times = Qwen3VLProcessor._calculate_timestamps(None, list(indices), VIDEO_FPS,
                                                   VIDEO_PROCESSOR["temporal_patch_size"])
    rows = h * w // config.vision_config.spatial_merge_size ** 2
    # The template's <|vision_start|><|video_pad|><|vision_end|>: the processor replaces the
    # placeholder only, so the pair stays around the frames.
    video = "<|vision_start|>" + "".join(f"<{s:.1f} seconds><|vision_start|>" +
                                         "<|video_pad|>" * rows + "<|vision_end|>"
                                         for s in times) + "<|vision_end|>"
    chat = ("<|im_start|>user\n{}What happens?<|im_end|>\n<|im_start|>assistant\n")
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    ids = torch.tensor(tok(chat.format(video), add_special_tokens=False)["input_ids"],
                       dtype=torch.int64)
    video_token = config.video_token_id
    assert int((ids == video_token).sum()) == t * rows, ids.tolist()

    tensors = {}
    mm_token_type_ids = ((ids == config.image_token_id).to(torch.int32) +
                         2 * (ids == video_token).to(torch.int32))[None]
    try:  # the processor itself, from all the frames and their rate
        proc = Qwen3VLProcessor(
            image_processor=transformers.Qwen2VLImageProcessor(**PROCESSOR), tokenizer=tok,
            video_processor=vp)
        chat_text = chat.format("<|vision_start|><|video_pad|><|vision_end|>")
        got = call_with(proc, dict(text=[chat_text], videos=[frames],
                                   video_metadata=[VideoMetadata(total_num_frames=VIDEO_FRAMES,
                                                                 fps=VIDEO_FPS)],
                                   do_sample_frames=True, return_tensors="pt"),
                        dict(cap_pixels_per_frame=False), through_kwargs=True)
        tensors["processor_ids"] = got["input_ids"][0].to(torch.int64).contiguous()
        got_pixels = got["pixel_values_videos"].reshape(pixel_values.shape)
        assert torch.equal(got_pixels.float(), pixel_values), "processor pixel values differ"
        if not torch.equal(tensors["processor_ids"], ids):
            # The processor is the reference: its ids stand (the C++ test then compares to them),
            # and both texts are printed to show where the script's expansion differs.
            print(f"{family} video: Qwen3VLProcessor's ids differ from the script's expansion;"
                  " the processor's are used", flush=True)
            print("  script:   ", repr(tok.decode(ids.tolist())), flush=True)
            print("  processor:", repr(tok.decode(tensors["processor_ids"].tolist())), flush=True)
            ids = tensors["processor_ids"].clone()
            mm_token_type_ids = ((ids == config.image_token_id).to(torch.int32) +
                                 2 * (ids == video_token).to(torch.int32))[None]
        if "mm_token_type_ids" in got:
            mm_token_type_ids = got["mm_token_type_ids"].to(torch.int32)
    except Exception as e:  # the script's expansion stands; the C++ test compares to it
        print(f"{family} video: Qwen3VLProcessor did not run ({type(e).__name__}: {e})",
              flush=True)
    attention_mask = torch.ones_like(ids)[None]
    with torch.no_grad():
        tower, deepstack = run_tower(model, pixel_values, grid_thw)
        positions, _ = call_with(
            model.model.get_rope_index,
            dict(input_ids=ids[None], video_grid_thw=grid_thw, attention_mask=attention_mask),
            dict(mm_token_type_ids=mm_token_type_ids), through_kwargs=True)
        res = call_with(
            model.forward,
            dict(input_ids=ids[None], pixel_values_videos=pixel_values, video_grid_thw=grid_thw,
                 attention_mask=attention_mask),
            dict(mm_token_type_ids=mm_token_type_ids), through_kwargs=False)
    positions = positions.reshape(-1, positions.shape[-1])[-3:]
    tensors.update({
        "pixel_values": pixel_values,
        "grid_thw": grid_thw.contiguous(),
        "ids": ids.contiguous(),
        "tower": tower.float().contiguous(),
        "positions": positions.to(torch.int64).contiguous(),
        "logits": res.logits[0].float().contiguous(),
    })
    if deepstack:
        tensors["deepstack"] = torch.stack([d.float() for d in deepstack]).contiguous()
    save_file(tensors, os.path.join(folder, "reference_video.safetensors"))
    print(family, "video written:", len(ids), "tokens, grid", [t, h, w], "times",
          [f"{s:.1f}" for s in times], flush=True)


def load_folder(folder):
    """A folder written above, loaded in float32 as write() runs it: (family, config, model)."""
    config = transformers.AutoConfig.from_pretrained(folder)
    family = config.model_type
    model = model_class(family).from_pretrained(folder, dtype=torch.float32,
                                                attn_implementation="eager").eval()
    eager_experts(model)
    if family == "qwen3_5":
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from make_golden import use_torch_recurrence
        use_torch_recurrence(model)
    return family, config, model


def write_video_for(folder):
    """The video case of a folder written before (its model as saved)."""
    family, config, model = load_folder(folder)
    write_video(folder, family, config, model, seed=300 + FAMILIES.index(family))


def write_fast(folder):
    """reference_fast.safetensors for the picture case of `folder` (see the module's doc)."""
    import importlib
    from safetensors.torch import load_file
    family, config, model = load_folder(folder)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from make_golden import fp16_attention
    ref = load_file(os.path.join(folder, "reference.safetensors"))
    ids, grid_thw = ref["ids"], ref["grid_thw"]
    # The patch embedding (a Conv3d, a product with a weight) reads pixel_values rounded.
    pixel_values = ref["pixel_values"].to(torch.bfloat16).to(torch.float32)
    image = config.image_token_id
    mm_token_type_ids = (ids == image).to(torch.int32)[None]
    attention_mask = torch.ones_like(ids)[None]

    patched = []
    mod = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    if hasattr(mod, "eager_attention_forward"):
        patched.append((mod, mod.eager_attention_forward))
        mod.eager_attention_forward = fp16_attention
    linear = torch.nn.functional.linear
    calls = [0]
    # The MoE router (mlp.gate) runs in float32 in every mode, as the backends run it.
    routers = {id(m.weight) for name, m in model.named_modules()
               if name.endswith("mlp.gate") and isinstance(getattr(m, "weight", None), torch.Tensor)}

    def rounded_linear(x, weight, bias=None):
        if id(weight) in routers:
            return linear(x, weight, bias)
        calls[0] += 1
        return linear(x.to(torch.bfloat16).to(torch.float32), weight, bias)

    torch.nn.functional.linear = rounded_linear
    try:
        with torch.no_grad():
            vis = model.model.visual(pixel_values, grid_thw=grid_thw)
            if isinstance(vis, tuple):
                tower, deepstack = vis[0], (vis[1] if len(vis) > 1 else [])
            elif isinstance(vis, torch.Tensor):
                tower, deepstack = vis, []
            else:
                tower = vis.pooler_output
                deepstack = getattr(vis, "deepstack_features", None) or []
            res = call_with(
                model.forward,
                dict(input_ids=ids[None], pixel_values=pixel_values, image_grid_thw=grid_thw,
                     attention_mask=attention_mask),
                dict(mm_token_type_ids=mm_token_type_ids), through_kwargs=False)
    finally:
        torch.nn.functional.linear = linear
        for m, original in patched:
            m.eager_attention_forward = original
    logits = res.logits[0].float().contiguous()
    tensors = {"tower": tower.float().contiguous(), "logits": logits}
    if deepstack:
        tensors["deepstack"] = torch.stack([d.float() for d in deepstack]).contiguous()
    save_file(tensors, os.path.join(folder, "reference_fast.safetensors"))
    full = ref["logits"]
    print(f"{folder}: {calls[0]} products rounded, fp16 attention in the language model; "
          f"max |rounded - float32| {(logits - full).abs().max().item():.4g} of max "
          f"|float32| {full.abs().max().item():.4g}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--families", nargs="+", choices=FAMILIES, default=FAMILIES)
    ap.add_argument("--fast", nargs="+", metavar="DIR",
                    help="write DIR/reference_fast.safetensors for each folder written before")
    ap.add_argument("--video", nargs="+", metavar="DIR",
                    help="write the video case (frames, processor configs, "
                         "reference_video.safetensors) of each folder written before")
    args = ap.parse_args()
    torch.set_num_threads(8)
    if args.fast or args.video:
        for folder in args.video or []:
            try:
                write_video_for(folder)
            except Exception as e:
                print(f"{folder} video: FAILED: {type(e).__name__}: {e}", flush=True)
        for folder in args.fast or []:
            try:
                write_fast(folder)
            except Exception as e:
                print(f"{folder}: FAILED: {type(e).__name__}: {e}", flush=True)
        return
    if not args.out:
        ap.error("--out is required (or --video DIR... / --fast DIR...)")
    for family in args.families:
        try:
            write(args.out, family, seed=300 + FAMILIES.index(family))
        except Exception as e:  # the others are still written
            print(f"{family}: FAILED: {type(e).__name__}: {e}", flush=True)


if __name__ == "__main__":
    main()
