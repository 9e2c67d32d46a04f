#!/usr/bin/env python3
"""Writes the golden cases the test suite compares against, with Hugging Face transformers.

Run where transformers and torch are (the GPU machine); everything runs on the CPU in float32,
so the references do not depend on the GPU's matmul modes. Writes:
  OUT/<family>/config.json, model.safetensors (bf16 random weights), reference.safetensors
      (ids<i> int64 [tokens], logits<i> float32 [tokens, vocab], and for case 0 the hidden
      states hidden0 float32 [layers + 1, tokens, dim] before the final norm)
  OUT/tiny_chat_greedy.json: greedy continuations of tiny-chat for a few prompts.
The hybrids (qwen3_next, qwen3_5, qwen3_5_moe) write cases of 1, 7 and 100 tokens (longer than
the delta rule's chunk of 64), hidden2 from hooks on the decoder layers.
Usage: python3 tools/make_golden.py --out DIR [--tiny-chat models/tiny-chat]

With --bf16-inputs DIR...: for each golden folder DIR (as written above), writes
DIR/reference_bf16_inputs.safetensors: the logits of the same ids with the input of every product
with a weight (q/k/v/o, gate/up/down, the MoE experts, head; not the MoE router, which runs in
float32 in every mode) rounded to bfloat16 and everything else in float32, as a backend's
bf16-activation mode computes them (the CUDA fast mode's many-row linears, the CPU's
bf16_activations). The references above stay the float32 truth.
"""
import argparse
import json
import os

import torch
from safetensors.torch import save_file
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer


def tiny_config(family):
    common = dict(vocab_size=320, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                  max_position_embeddings=512, rms_norm_eps=1e-5, initializer_range=0.2)
    if family == "llama":
        # Llama 3.1 rope scaling, with a small original context so that the scaling changes
        # most frequencies of these short sequences.
        return transformers.LlamaConfig(
            **common, tie_word_embeddings=False, attention_bias=False,
            rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0,
                                 low_freq_factor=1.0, high_freq_factor=4.0,
                                 original_max_position_embeddings=16))
    if family == "qwen2":
        return transformers.Qwen2Config(**common, tie_word_embeddings=True,
                                        rope_parameters=dict(rope_type="default",
                                                             rope_theta=10000.0))
    if family == "qwen3":
        return transformers.Qwen3Config(**common, tie_word_embeddings=False,
                                        attention_bias=False,
                                        rope_parameters=dict(rope_type="default",
                                                             rope_theta=1000000.0))
    if family == "llama_mlp_bias":
        # Biases on every linear: attention_bias and mlp_bias.
        return transformers.LlamaConfig(
            **common, tie_word_embeddings=False, attention_bias=True, mlp_bias=True,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0))
    if family == "gemma2":
        # Gemma 2: every other layer slides (window 8), one rotary table, soft-capped attention
        # scores and logits (small caps, so that they change these random models' values).
        return transformers.Gemma2Config(
            **dict(common, rms_norm_eps=1e-6, num_hidden_layers=4), query_pre_attn_scalar=24,
            sliding_window=8, attn_logit_softcapping=5.0, final_logit_softcapping=3.0,
            tie_word_embeddings=True,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0))
    if family.startswith("gemma3"):
        # Sliding-window layers (window 8, shorter than case 2's 40 tokens) beside global ones,
        # local and global rotary tables (the global one scaled), query_pre_attn_scalar other than
        # head_dim. gemma3_softcap: head_dim 256, window 5, final-logit soft-capping (and an
        # attn_logit_softcapping, which transformers' Gemma 3 does not apply). gemma3_cond: the text model of Gemma3ForConditionalGeneration.
        text = dict(common, head_dim=32, query_pre_attn_scalar=24, sliding_window=8,
                    num_hidden_layers=4, max_position_embeddings=512, tie_word_embeddings=True,
                    layer_types=["sliding_attention", "sliding_attention", "full_attention",
                                 "sliding_attention"],
                    rope_parameters=dict(
                        sliding_attention=dict(rope_type="default", rope_theta=10000.0),
                        full_attention=dict(rope_type="linear", factor=2.0,
                                            rope_theta=1000000.0)))
        text.pop("rms_norm_eps")
        text["rms_norm_eps"] = 1e-6
        if family == "gemma3_softcap":
            text.update(num_attention_heads=2, num_key_value_heads=1, head_dim=256,
                        query_pre_attn_scalar=256, sliding_window=5,
                        attn_logit_softcapping=2.0, final_logit_softcapping=3.0,
                        layer_types=["sliding_attention", "full_attention",
                                     "sliding_attention"], num_hidden_layers=3,
                        rope_parameters=dict(
                            sliding_attention=dict(rope_type="default", rope_theta=10000.0),
                            full_attention=dict(rope_type="default", rope_theta=1000000.0)))
        if family == "gemma3_cond":
            vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                          num_attention_heads=2, image_size=28, patch_size=14)
            return transformers.Gemma3Config(text_config=text, vision_config=vision,
                                             mm_tokens_per_image=4)
        return transformers.Gemma3TextConfig(**text)
    if family == "qwen3_moe":
        # Mixture-of-experts layers (8 experts, 2 a token, their weights renormalized) around a
        # dense one (mlp_only_layers=[1], intermediate_size 96). Qwen3MoeConfig may not declare
        # head_dim (the attention reads it with getattr): set it after the constructor if need
        # be; write_family checks the model's shapes and config.json.
        moe = dict(common, num_hidden_layers=4, intermediate_size=96, tie_word_embeddings=False,
                   attention_bias=False, num_experts=8, num_experts_per_tok=2,
                   moe_intermediate_size=32, norm_topk_prob=True, decoder_sparse_step=1,
                   mlp_only_layers=[1],
                   rope_parameters=dict(rope_type="default", rope_theta=1000000.0))
        try:
            config = transformers.Qwen3MoeConfig(**moe)
        except Exception:
            moe.pop("head_dim")
            config = transformers.Qwen3MoeConfig(**moe)
        if getattr(config, "head_dim", None) != 32:
            config.head_dim = 32
        return config
    if family in HYBRID_FAMILIES:
        return hybrid_config(family, common)
    raise ValueError(family)


# Hybrids of recurrent (gated delta net) and gated attention layers. Their prompts (case 2: 100
# tokens) are longer than transformers' chunk of 64 in the chunked gated delta rule.
HYBRID_FAMILIES = ["qwen3_next", "qwen3_5", "qwen3_5_moe"]
HYBRID_LENGTHS = [1, 7, 100]


def hybrid_config(family, common):
    """qwen3_next: Qwen3NextForCausalLM, fused projections, mixture-of-experts layers with a gated
    shared expert around a dense one (mlp_only_layers=[2]). qwen3_5: Qwen3_5ForCausalLM (the text
    class), dense. qwen3_5_moe: Qwen3_5MoeForConditionalGeneration (text_config, a tiny vision
    tower whose tensors gizllm skips), every layer a mixture of experts with the shared expert.
    Four layers: linear, full, linear, linear attention; partial rotary 0.5 (M-RoPE sections for
    Qwen3.5, one position in all three for text)."""
    text = dict(common, num_hidden_layers=4, intermediate_size=96, tie_word_embeddings=False,
                rms_norm_eps=1e-6, attention_bias=False,
                layer_types=["linear_attention", "full_attention", "linear_attention",
                             "linear_attention"],
                linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                linear_value_head_dim=12, linear_conv_kernel_dim=4)
    rope = dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5)
    moe = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
               shared_expert_intermediate_size=24)
    if family == "qwen3_next":
        return transformers.Qwen3NextConfig(**text, **moe, norm_topk_prob=True,
                                            decoder_sparse_step=1, mlp_only_layers=[2],
                                            rope_parameters=rope)
    rope = dict(rope, mrope_section=[2, 2, 4], mrope_interleaved=True)
    if family == "qwen3_5":
        return transformers.Qwen3_5TextConfig(**text, rope_parameters=rope)
    text.pop("intermediate_size")
    text_config = transformers.Qwen3_5MoeTextConfig(**text, **moe, rope_parameters=rope)
    return transformers.Qwen3_5MoeConfig(text_config=text_config.to_dict(),
                                         vision_config=tiny_vision(text["hidden_size"]),
                                         tie_word_embeddings=False)


def tiny_vision(out_hidden_size):
    """A Qwen3.5-MoE vision config of one small block: its defaults with the sizes that exist in
    this transformers' class cut down (the weights are written and never read)."""
    config = transformers.Qwen3_5MoeVisionConfig()
    small = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, patch_size=4,
                 out_hidden_size=out_hidden_size, num_position_embeddings=16,
                 deepstack_visual_indexes=[])
    d = config.to_dict()
    for key, value in small.items():
        if key in d:
            d[key] = value
    return d


def use_torch_recurrence(model):
    """The recurrent layers' torch paths (torch_chunk_gated_delta_rule for prompts, the torch
    causal convolution), where flash-linear-attention or causal-conv1d are installed: the
    references run on the CPU in float32."""
    import importlib
    for name in ["qwen3_next", "qwen3_5", "qwen3_5_moe"]:
        try:
            mod = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
        except ImportError:
            continue
        for module in model.modules():
            if not type(module).__name__.endswith("GatedDeltaNet"):
                continue
            if hasattr(mod, "torch_chunk_gated_delta_rule") and hasattr(module,
                                                                      "chunk_gated_delta_rule"):
                module.chunk_gated_delta_rule = mod.torch_chunk_gated_delta_rule
                module.recurrent_gated_delta_rule = mod.torch_recurrent_gated_delta_rule
            if hasattr(module, "causal_conv1d_fn"):
                module.causal_conv1d_fn = None
            if hasattr(mod, "torch_causal_conv1d_update") and hasattr(module,
                                                                    "causal_conv1d_update"):
                module.causal_conv1d_update = mod.torch_causal_conv1d_update


def check_hybrid(family, folder):
    """The saved folder holds what gizllm's recipe reads: the projections by name, the layer
    types, and for the conditional model the text model under model.language_model."""
    from safetensors import safe_open
    names = set()
    for f in os.listdir(folder):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(folder, f), "pt") as st:
                names.update(st.keys())
    prefix = "model.language_model." if family == "qwen3_5_moe" else "model."
    proj = "in_proj_qkvz" if family == "qwen3_next" else "in_proj_qkv"
    for name in [f"{prefix}layers.0.linear_attn.{proj}.weight",
                 f"{prefix}layers.0.linear_attn.conv1d.weight",
                 f"{prefix}layers.0.linear_attn.A_log",
                 f"{prefix}layers.1.self_attn.q_proj.weight"]:
        assert name in names, f"{family}: {name} not saved ({sorted(names)[:8]}...)"
    if family != "qwen3_5":
        assert any("shared_expert_gate" in n for n in names), f"{family}: no shared expert gate"
    cfg = json.load(open(os.path.join(folder, "config.json")))
    text = cfg.get("text_config", cfg)
    assert text["layer_types"][1] == "full_attention", text.get("layer_types")


def capture_hidden(model, ids):
    """The residual stream before each decoder layer and after the last one, [layers + 1, tokens,
    dim] (hidden_states[l] of transformers, the last before the final norm)."""
    stack = getattr(model.model, "language_model", model.model)
    states = []
    hooks = [stack.layers[0].register_forward_pre_hook(
        lambda m, a, kw: states.append(a[0] if a else kw.get("hidden_states")), with_kwargs=True)]
    for layer in stack.layers:
        hooks.append(layer.register_forward_hook(
            lambda m, a, o: states.append(o[0] if isinstance(o, tuple) else o)))
    with torch.no_grad():
        model(ids[None])
    for h in hooks:
        h.remove()
    assert states[0] is not None, "no input of layer 0 seen"
    return torch.stack([t[0].float() for t in states]).contiguous()


def write_hybrid(family, out, seed):
    torch.manual_seed(seed)
    config = tiny_config(family)
    if family == "qwen3_5_moe":
        model = transformers.Qwen3_5MoeForConditionalGeneration._from_config(
            config, dtype=torch.bfloat16, attn_implementation="eager")
    else:
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16,
                                                 attn_implementation="eager")
    # Norms, biases (dt_bias) random. A_log from log of [0.02, 0.25]: with its initialization's
    # A of up to 16 the decay exp(-A softplus(a + dt_bias)) clears a head's state within a token
    # or two, so the recurrence carries little across the 64-row chunks, and a head's output is
    # nearly one term q.k v, which q.k near zero leaves a tiny difference of rounded products
    # that the gated RMSNorm then scales up (float32 noise past 1e-4 of the logits).
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.copy_(torch.randn_like(p, dtype=torch.float32).mul(0.3).add(
                    1.0 if name.endswith("linear_attn.norm.weight") else 0.0).to(p.dtype))
            if name.endswith("linear_attn.A_log"):
                p.copy_(torch.empty_like(p, dtype=torch.float32).uniform_(0.02, 0.25).log()
                        .to(p.dtype))
    folder = os.path.join(out, family)
    model.save_pretrained(folder)
    check_hybrid(family, folder)
    model = model.float().eval()
    use_torch_recurrence(model)
    g = torch.Generator().manual_seed(seed + 1)
    vocab = config.get_text_config().vocab_size
    tensors = {}
    for i, length in enumerate(HYBRID_LENGTHS):
        ids = torch.randint(0, vocab, (length,), generator=g)
        with torch.no_grad():
            res = model(ids[None])
        tensors[f"ids{i}"] = ids.to(torch.int64).contiguous()
        tensors[f"logits{i}"] = res.logits[0].float().contiguous()
        if i == 2:
            tensors["hidden2"] = capture_hidden(model, ids)
    save_file(tensors, os.path.join(folder, "reference.safetensors"))
    print(family, "written", flush=True)


def write_family(family, out, seed):
    if family in HYBRID_FAMILIES:
        return write_hybrid(family, out, seed)
    torch.manual_seed(seed)
    config = tiny_config(family)
    if family == "gemma3_cond":
        model = transformers.Gemma3ForConditionalGeneration._from_config(
            config, dtype=torch.bfloat16, attn_implementation="eager")
    elif family.startswith("gemma"):
        model = AutoModelForCausalLM.from_config(
            config, dtype=torch.bfloat16, attn_implementation="eager")
    else:
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    # Biases start at zero; make them random so that a missing bias shows.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.copy_(torch.randn_like(p, dtype=torch.float32).mul(0.3).add(
                    1.0 if "norm" in name else 0.0).to(p.dtype))
    folder = os.path.join(out, family)
    if family == "qwen3_moe":
        attn = model.model.layers[0].self_attn
        assert attn.q_proj.weight.shape == (4 * 32, 64), attn.q_proj.weight.shape
        assert hasattr(model.model.layers[0].mlp, "experts"), "layer 0 is not a mixture"
        assert not hasattr(model.model.layers[1].mlp, "experts"), "layer 1 is not dense"
    model.save_pretrained(folder)
    if family == "qwen3_moe":
        # head_dim in config.json, whether or not the configuration class declares it.
        path = os.path.join(folder, "config.json")
        cfg = json.load(open(path))
        if cfg.get("head_dim") != 32:
            cfg["head_dim"] = 32
            json.dump(cfg, open(path, "w"), indent=2)
    if family == "qwen2":
        # The older config spelling: top-level rope_theta and rope_scaling.
        path = os.path.join(folder, "config.json")
        cfg = json.load(open(path))
        rp = cfg.pop("rope_parameters")
        cfg["rope_theta"] = rp["rope_theta"]
        cfg["rope_scaling"] = None
        json.dump(cfg, open(path, "w"), indent=2)
    model = model.float().eval()
    g = torch.Generator().manual_seed(seed + 1)
    tensors = {}
    hidden = family != "gemma3_cond"  # its logits only
    for i, length in enumerate([1, 7, 40]):
        ids = torch.randint(0, config.get_text_config().vocab_size, (length,), generator=g)
        with torch.no_grad():
            res = model(ids[None], output_hidden_states=(i == 2 and hidden))
        tensors[f"ids{i}"] = ids.to(torch.int64).contiguous()
        tensors[f"logits{i}"] = res.logits[0].float().contiguous()
        if i == 2 and hidden:
            # hidden_states[0..L-1] are before the final norm; the last one is after it, so
            # take the last layer's output from a hook instead.
            hs = list(res.hidden_states[:-1])
            last = {}
            stack = getattr(model.model, "language_model", model.model)
            h = stack.layers[-1].register_forward_hook(
                lambda m, a, o: last.__setitem__("x", o[0] if isinstance(o, tuple) else o))
            with torch.no_grad():
                model(ids[None])
            h.remove()
            hs.append(last["x"])
            tensors["hidden2"] = torch.stack([t[0].float() for t in hs]).contiguous()
    save_file(tensors, os.path.join(folder, "reference.safetensors"))
    print(family, "written", flush=True)


def tiny_chat_greedy(path, out):
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = [
        "In the beginning God created",
        "<|im_start|>user\nRecite John 3:16.<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>user\nTell me a fortune.<|im_end|>\n<|im_start|>assistant\n",
        "import os\nprint(",
        "The LORD is my shepherd;",
    ]
    cases = []
    for p in prompts:
        ids = tok(p, return_tensors="pt").input_ids
        with torch.no_grad():
            gen = model.generate(ids, max_new_tokens=48, do_sample=False,
                                 eos_token_id=[0, 2], pad_token_id=0)
        new = gen[0, ids.shape[1]:].tolist()
        cases.append({"prompt": p, "prompt_ids": ids[0].tolist(), "output_ids": new,
                      "text": tok.decode(new)})
    json.dump({"transformers": transformers.__version__, "torch": torch.__version__,
               "max_new_tokens": 48, "cases": cases},
              open(os.path.join(out, "tiny_chat_greedy.json"), "w"), indent=1)
    print("tiny-chat greedy written", flush=True)


def fp16_attention(module, query, key, value, attention_mask, scaling, dropout=0.0,
                   softcap=None, **kwargs):
    """Eager attention with its operands rounded as CUDA's fast-mode tensor-core kernel rounds
    them: the rotated queries, the keys and the values to float16, scores summed in float32 (and
    soft-capped), the softmax's probabilities to float16 before they weigh the values."""
    groups = query.shape[1] // key.shape[1]
    key = key.repeat_interleave(groups, dim=1)
    value = value.repeat_interleave(groups, dim=1)
    q, k, v = (t.to(torch.float16).to(torch.float32) for t in (query, key, value))
    weights = torch.matmul(q, k.transpose(2, 3)) * scaling
    if softcap is not None:
        weights = torch.tanh(weights / softcap) * softcap
    if attention_mask is not None:
        mask = attention_mask[:, :, :, : k.shape[-2]]
        if mask.dtype == torch.bool:
            weights = weights.masked_fill(~mask, float("-inf"))
        else:
            weights = weights + mask
    weights = torch.softmax(weights, dim=-1, dtype=torch.float32)
    weights = weights.to(torch.float16).to(torch.float32)
    out = torch.matmul(weights, v).transpose(1, 2).contiguous()
    return out, weights


def write_bf16_inputs(folder, fast=False):
    """reference_bf16_inputs.safetensors: each linear's input rounded to bf16. With `fast`,
    reference_fast.safetensors: that and attention's operands rounded as fp16_attention does (the
    CUDA fast mode's many-row steps)."""
    from safetensors.torch import load_file
    import importlib
    patched = []
    if fast:
        for name in ["llama", "qwen2", "qwen3", "qwen3_moe", "gemma2", "gemma3", "qwen3_next",
                     "qwen3_5", "qwen3_5_moe"]:
            mod = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
            if not hasattr(mod, "eager_attention_forward"):
                continue
            patched.append((mod, mod.eager_attention_forward))
            mod.eager_attention_forward = fp16_attention
    try:
        _write_rounded(folder, fast, load_file)
    finally:
        for mod, original in patched:
            mod.eager_attention_forward = original


def _write_rounded(folder, fast, load_file):
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    # Experts the eager way: a loop over the experts through F.linear (the default backends,
    # grouped_mm and batched_mm, multiply with torch._grouped_mm and torch.bmm, which the hook
    # below would not round).
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_experts_implementation"):
            config._experts_implementation = "eager"
    # Every product with a weight then goes through F.linear: nn.Linear's, and the MoE router's
    # and experts' (transformers 5 keeps those as plain parameters), so rounding F.linear's input
    # rounds them all, as the backends round each matmul's input; except the MoE router's
    # (mlp.gate), which the backends run in float32 in every mode.
    linear = torch.nn.functional.linear
    calls = [0]
    routers = {id(m.weight) for name, m in model.named_modules()
               if name.endswith("mlp.gate") and isinstance(getattr(m, "weight", None), torch.Tensor)}

    def rounded_linear(x, weight, bias=None):
        if id(weight) in routers:
            return linear(x, weight, bias)
        calls[0] += 1
        return linear(x.to(torch.bfloat16).to(torch.float32), weight, bias)

    ref = load_file(os.path.join(folder, "reference.safetensors"))
    tensors = {}
    for i in range(len([k for k in ref if k.startswith("ids")])):
        ids = ref[f"ids{i}"]
        calls[0] = 0
        torch.nn.functional.linear = rounded_linear
        try:
            with torch.no_grad():
                logits = model(ids[None]).logits[0].float()
        finally:
            torch.nn.functional.linear = linear
        rounded = calls[0]
        tensors[f"ids{i}"] = ids.contiguous()
        tensors[f"logits{i}"] = logits.contiguous()
        full = ref[f"logits{i}"]
        print(f"{folder} case {i}: {rounded} products rounded{', fp16 attention' if fast else ''}; "
              f"max |rounded - float32| {(logits - full).abs().max().item():.4g} of max "
              f"|float32| {full.abs().max().item():.4g}", flush=True)
    name = "reference_fast.safetensors" if fast else "reference_bf16_inputs.safetensors"
    save_file(tensors, os.path.join(folder, name))


ALL_FAMILIES = ["llama", "qwen2", "qwen3", "llama_mlp_bias", "gemma3", "gemma3_softcap",
                "gemma3_cond", "gemma2", "qwen3_moe"] + HYBRID_FAMILIES


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--tiny-chat", default="models/tiny-chat")
    ap.add_argument("--bf16-inputs", nargs="+", metavar="DIR")
    ap.add_argument("--fast", action="store_true",
                    help="with --bf16-inputs: write reference_fast.safetensors instead (attention's "
                         "operands rounded to fp16 too)")
    ap.add_argument("--families", nargs="+", choices=ALL_FAMILIES,
                    help="write only these (seeds as in the full run)")
    args = ap.parse_args()
    if args.bf16_inputs:
        torch.set_num_threads(8)
        for folder in args.bf16_inputs:
            write_bf16_inputs(folder, fast=args.fast)
        return
    if not args.out:
        ap.error("--out is required (or --bf16-inputs DIR...)")
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(8)
    for family in args.families or ALL_FAMILIES:
        try:
            write_family(family, args.out, 100 + ALL_FAMILIES.index(family))
        except Exception as e:  # the others are still written
            print(f"{family}: FAILED: {type(e).__name__}: {e}", flush=True)
    if not args.families:
        tiny_chat_greedy(args.tiny_chat, args.out)


if __name__ == "__main__":
    main()
