#!/usr/bin/env python3
"""Trains tiny-hybrid, the shipped Qwen3.5-MoE-style test model, with transformers' own classes.

Run on the GPU machine (torch and transformers there); about --seconds of training on one GPU.
  python3 tools/train_tiny_hybrid.py --corpus ../shared/corpus --tokenizer models/tiny-chat \
      --out OUT/tiny-hybrid [--seconds 300]

The model (Qwen3_5MoeForCausalLM, model_type qwen3_5_moe_text): tiny-chat's tokenizer (8,192
tokens) and chat template, hidden 128, tied embeddings, four layers (linear, linear, linear, full
attention: the 3:1 of Qwen3.5), every feed-forward a mixture of 8 experts of 32 with top 2 and a
sigmoid-gated shared expert of 64, gated attention of 2 query heads and 1 key-value head of 64
with partial rotary 0.5 (M-RoPE sections, text positions), recurrent layers of 2 key and 4 value
heads of 32. Plus one multi-token prediction layer trained jointly, as vLLM reads Qwen3-Next and
Qwen3.5 checkpoints: the row of position t reads
    fc(concat(pre_fc_norm_embedding(embed(token t+1)), pre_fc_norm_hidden(final-normed hidden t)))
through one full-attention decoder layer (mtp.layers.0, the model's own decoder layer class),
mtp.norm and the shared head, and predicts token t+2; its positions are t's. A chained second
draft is trained beside it (half the weight): the row at position t+1 reads token t+2 and the
first row t's output, attends to the first rows up to t and to itself (as a chained draft reads
the MTP layer's cache), and predicts token t+3.

Data: ../shared/corpus's documents after the first 300 (the first 300 are held out, as
tiny-chat's heldout.jsonl) and its chats in the ChatML template. A share of the training rows
repeat a passage of themselves later in the row (a passage, then the same passage again), so the
model learns to copy from its context.

Writes OUT: config.json (with mtp_num_hidden_layers 1), model.safetensors (bf16, the mtp.* tensors
beside the model's), generation_config.json, tokenizer.json and tokenizer_config.json (tiny-chat's),
reference.safetensors (float32, the bf16 weights upcast, run on the CPU with the torch recurrence:
for four prompts ids<i> and greedy<i> (up to 32 greedy tokens after the prompt, the stop token
included), for the first three logits<i> [tokens, vocab], for the first mtp_logits0 [tokens - 1,
vocab] (row t predicts token t+2 from token t+1 and hidden t) and mtp_chained_logits0 [tokens - 2,
vocab] (the chained second draft)),
and quality.json: held-out perplexity (the first 300 documents, each cut to its first 1,024
tokens; float32, no TF32), the MTP layer's top-1 agreement with the model's own next token there
(and its chained second draft's), and how much of a repeated held-out passage the model copies.
--measure-only rewrites reference.safetensors and quality.json of a trained folder.
"""
import argparse
import gzip
import json
import lzma
import math
import os
import random
import shutil
import sys
import time

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file, save_file

HELD_OUT = 300
HIDDEN = 128


LAYER_TYPES = "linear_attention,linear_attention,linear_attention,full_attention"


def text_config(layer_types=LAYER_TYPES):
    types = layer_types.split(",")
    return transformers.Qwen3_5MoeTextConfig(
        vocab_size=8192, hidden_size=HIDDEN, num_hidden_layers=len(types),
        layer_types=types,
        num_attention_heads=2, num_key_value_heads=1, head_dim=64,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
        linear_value_head_dim=32, linear_conv_kernel_dim=4,
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=64,
        max_position_embeddings=2048, rms_norm_eps=1e-6, tie_word_embeddings=True,
        attention_bias=False, initializer_range=0.02,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5,
                             mrope_section=[6, 5, 5], mrope_interleaved=True),
        bos_token_id=None, eos_token_id=2, pad_token_id=0)


def build_model(config):
    cls = getattr(transformers, "Qwen3_5MoeForCausalLM", None)
    if cls is not None:
        return cls._from_config(config, attn_implementation="sdpa")
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")


def modeling_module(model):
    return sys.modules[type(model).__module__]


class Mtp(torch.nn.Module):
    """The multi-token prediction layer, named as the checkpoints name it (mtp.*)."""

    def __init__(self, model, config):
        super().__init__()
        mod = modeling_module(model)
        norm = getattr(mod, "Qwen3_5MoeRMSNorm")
        layer = getattr(mod, "Qwen3_5MoeDecoderLayer")
        full = config.layer_types.index("full_attention")
        self.fc = torch.nn.Linear(2 * config.hidden_size, config.hidden_size, bias=False)
        self.layers = torch.nn.ModuleList([layer(config, full)])
        self.norm = norm(config.hidden_size, eps=config.rms_norm_eps)
        self.pre_fc_norm_embedding = norm(config.hidden_size, eps=config.rms_norm_eps)
        self.pre_fc_norm_hidden = norm(config.hidden_size, eps=config.rms_norm_eps)
        torch.nn.init.normal_(self.fc.weight, std=config.initializer_range)
        for name, p in self.layers.named_parameters():
            if "norm" in name or name.endswith("A_log") or name.endswith("dt_bias"):
                continue
            if p.dim() >= 2:
                torch.nn.init.normal_(p, std=config.initializer_range)

    def inputs(self, model, tokens, hidden):
        """The decoder layer's input of rows reading `tokens` [B, T] (token t+1 of row t) and
        `hidden` [B, T, H] (final-normed: the model's, or an earlier MTP row's output)."""
        e = model.model.embed_tokens(tokens)
        return self.fc(torch.cat([self.pre_fc_norm_embedding(e), self.pre_fc_norm_hidden(hidden)],
                                 dim=-1))

    def layer(self, model, x, positions, mask=None):
        """The decoder layer and mtp.norm over rows x [B, T, H] at `positions` [T]; causal when
        mask is None, else where the boolean mask [T, T] allows (sdpa attention)."""
        b = x.shape[0]
        pos3 = positions.view(1, 1, -1).expand(3, b, -1)
        cos_sin = model.model.rotary_emb(x, pos3)
        y = self.layers[0](x, position_embeddings=cos_sin,
                           attention_mask=None if mask is None else mask[None, None],
                           position_ids=positions.view(1, -1).expand(b, -1))
        if isinstance(y, tuple):
            y = y[0]
        return self.norm(y)


def forward_all(model, mtp, ids, router=False, chained=False):
    """Logits [B, L, V]; the MTP's first rows' logits [B, L - 1, V] (row t at position t reads
    token t+1 and the model's hidden t, and predicts token t+2); with `chained`, the second draft's
    logits [B, L - 2, V] (row t at position t + 1 reads token t+2 and the first row t's output,
    predicts token t+3, and attends to the first rows at positions up to t and to itself, as a
    chained draft reads the MTP layer's cache); router logits (a list of [B*L, E])."""
    out = model.model(input_ids=ids, output_router_logits=router, use_cache=False)
    h = out.last_hidden_state
    logits = model.lm_head(h)
    n1 = ids.shape[1] - 1
    pos1 = torch.arange(n1, device=ids.device)
    x1 = mtp.inputs(model, ids[:, 1:], h[:, :-1])
    y1 = mtp.layer(model, x1, pos1)
    second = None
    if chained:
        n2 = n1 - 1
        x2 = mtp.inputs(model, ids[:, 2:], y1[:, :-1])
        pos2 = torch.arange(n2, device=ids.device) + 1
        allowed = torch.zeros(n1 + n2, n1 + n2, dtype=torch.bool, device=ids.device)
        allowed[:n1, :n1] = torch.ones(n1, n1, dtype=torch.bool, device=ids.device).tril()
        allowed[n1:, :n2] = torch.ones(n2, n2, dtype=torch.bool, device=ids.device).tril()
        allowed[n1:, n1:] = torch.eye(n2, dtype=torch.bool, device=ids.device)
        y2 = mtp.layer(model, torch.cat([x1, x2], dim=1), torch.cat([pos1, pos2]), allowed)[:, n1:]
        second = model.lm_head(y2)
    routers = getattr(out, "router_logits", None) or []
    return logits, model.lm_head(y1), second, routers


def balance_loss(routers, experts, top_k):
    """Switch-style load balance over every MoE layer: experts times the sum over experts of the
    share of picks and the mean router probability."""
    total = 0.0
    for r in routers:
        p = torch.softmax(r.float(), dim=-1)
        picks = torch.topk(p, top_k, dim=-1).indices
        share = F.one_hot(picks, experts).float().sum(1).mean(0) / top_k
        total = total + experts * (share * p.mean(0)).sum()
    return total / max(1, len(routers))


def open_lines(corpus, name):
    """NAME.jsonl.gz or NAME.jsonl.xz in the corpus folder."""
    path = os.path.join(corpus, name + ".jsonl")
    if os.path.exists(path + ".gz"):
        return gzip.open(path + ".gz", "rt")
    return lzma.open(path + ".xz", "rt")


def read_corpus(corpus, tok, cache):
    if cache and os.path.exists(cache):
        return torch.load(cache)
    docs = [json.loads(line)["text"] for line in open_lines(corpus, "docs")]
    chats = []
    for line in open_lines(corpus, "chats"):
        msgs = json.loads(line)["messages"]
        chats.append("".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n"
                             for m in msgs))
    held, train = docs[:HELD_OUT], docs[HELD_OUT:]
    eot = tok.convert_tokens_to_ids("<|endoftext|>")
    stream = []
    texts = train + chats
    random.Random(1).shuffle(texts)
    for start in range(0, len(texts), 2048):
        for ids in tok(texts[start:start + 2048], add_special_tokens=False)["input_ids"]:
            stream.extend(ids)
            stream.append(eot)
    held_ids = [ids[:1024] for ids in tok(held, add_special_tokens=False)["input_ids"]]
    out = (torch.tensor(stream, dtype=torch.int64), held_ids)
    if cache:
        torch.save(out, cache)
    return out


def batch(stream, rows, length, rng, copy_share):
    """Rows of `length` tokens; a copy_share of them repeat a passage of themselves."""
    out = torch.empty(rows, length, dtype=torch.int64)
    for i in range(rows):
        s = rng.randrange(0, len(stream) - length - 1)
        row = stream[s:s + length]
        if rng.random() < copy_share:
            m = rng.randrange(16, 96)
            a = rng.randrange(0, length // 2 - m)
            b = rng.randrange(a + m, length - m)
            row = torch.cat([row[:b], row[a:a + m], row[b:length - m]])
        out[i] = row
    return out


@torch.no_grad()
def held_out_quality(model, mtp, held, device):
    """Perplexity; the MTP's first draft's top-1 agreement with the model's own pick for the same
    token (the argmax at t+1 given the true token t+1), and the chained second draft's."""
    nll, count, agree, judged, agree2, judged2 = 0.0, 0, 0, 0, 0, 0
    for ids in held:
        if len(ids) < 4:
            continue
        x = torch.tensor([ids], device=device)
        logits, mtp_logits, second, _ = forward_all(model, mtp, x, chained=True)
        logits, mtp_logits, second = logits.float()[0], mtp_logits.float()[0], second.float()[0]
        nll += F.cross_entropy(logits[:-1], x[0, 1:], reduction="sum").item()
        count += len(ids) - 1
        own = logits.argmax(-1)
        agree += (mtp_logits[:-1].argmax(-1) == own[1:-1]).sum().item()
        judged += len(ids) - 2
        agree2 += (second[:-1].argmax(-1) == own[2:-1]).sum().item()
        judged2 += len(ids) - 3
    return math.exp(nll / count), agree / judged, agree2 / judged2, count


def use_torch_recurrence(model):
    mod = modeling_module(model)
    for module in model.modules():
        if not type(module).__name__.endswith("GatedDeltaNet"):
            continue
        if hasattr(mod, "torch_chunk_gated_delta_rule"):
            module.chunk_gated_delta_rule = mod.torch_chunk_gated_delta_rule
            module.recurrent_gated_delta_rule = mod.torch_recurrent_gated_delta_rule
        if hasattr(module, "causal_conv1d_fn"):
            module.causal_conv1d_fn = None
        if hasattr(mod, "torch_causal_conv1d_update") and hasattr(module, "causal_conv1d_update"):
            module.causal_conv1d_update = mod.torch_causal_conv1d_update


@torch.no_grad()
def greedy(model, ids, n, device="cpu"):
    out = list(ids)
    for _ in range(n):
        logits = model(torch.tensor([out], device=device)).logits[0, -1]
        nxt = int(logits.argmax())
        out.append(nxt)
        if nxt in (0, 2):  # <|endoftext|>, <|im_end|>
            break
    return out[len(ids):]


@torch.no_grad()
def copy_rate(model, held, device, docs=30):
    """How well the model copies from its context: for held-out passages of 64 tokens, the prompt
    is the passage then its first 16 tokens again; the share of the 32 greedy tokens after it that
    equal the passage's tokens 16..47."""
    same, total = 0, 0
    for ids in [h for h in held if len(h) >= 64][:docs]:
        passage = ids[:64]
        out = greedy(model, passage + passage[:16], 32, device)
        same += sum(int(a == b) for a, b in zip(out, passage[16:48]))
        total += 32
    return same / total


def read_held_out(path, tok, docs):
    """The held-out documents (tiny-chat's heldout.jsonl: the corpus's first 300), each cut to
    its first 1,024 tokens."""
    texts = [json.loads(line)["text"] for line in open(path)][:docs]
    return [ids[:1024] for ids in tok(texts, add_special_tokens=False)["input_ids"]]


def load_trained(folder):
    """The saved folder as a user loads it (float32, the rotary tables computed afresh: a model
    cast to bf16 and back would keep bf16-rounded inverse frequencies), with its MTP layer from
    the mtp.* tensors."""
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="sdpa").eval()
    mtp = Mtp(model, model.config)
    tensors = load_file(os.path.join(folder, "model.safetensors"))
    state = {k[len("mtp."):]: v.float() for k, v in tensors.items() if k.startswith("mtp.")}
    mtp.load_state_dict(state, strict=True)
    for module in list(model.modules()) + list(mtp.modules()):
        c = getattr(module, "config", None)
        if c is not None and hasattr(c, "_experts_implementation"):
            c._experts_implementation = "eager"
    use_torch_recurrence(model)
    return model, mtp.eval()


def measure(folder, tok, held, device, extra):
    """Held-out quality in float32 on `device` (no TF32); the references on the CPU."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model, mtp = load_trained(folder)
    model, mtp = model.to(device), mtp.to(device)
    ppl, agreement, agreement2, scored = held_out_quality(model, mtp, held, device)
    copied = copy_rate(model, held, device)
    model, mtp = model.to("cpu"), mtp.to("cpu")
    print(f"held-out perplexity {ppl:.2f} over {scored} tokens; MTP top-1 agreement "
          f"{agreement:.4f} (chained second draft {agreement2:.4f}); copies {copied:.3f} of a "
          "repeated passage", flush=True)
    prompts = ["In the beginning God created",
               "<|im_start|>user\nRecite Psalms 23:1.<|im_end|>\n<|im_start|>assistant\n",
               "import os\nprint(os.getcwd())",
               "The LORD is my shepherd; I shall not want. He maketh me to lie down in green "
               "pastures. The LORD is my shepherd; I shall"]
    ref = {}
    with torch.no_grad():
        for i, p in enumerate(prompts):
            ids = tok(p, add_special_tokens=False)["input_ids"]
            x = torch.tensor([ids])
            logits, mtp_logits, second, _ = forward_all(model, mtp, x, chained=True)
            ref[f"ids{i}"] = x[0].to(torch.int64).contiguous()
            # Logits of the first three prompts, the MTP's (first and chained second draft) of
            # the first (the file ships).
            if i < 3:
                ref[f"logits{i}"] = logits[0].float().contiguous()
            if i == 0:
                ref[f"mtp_logits{i}"] = mtp_logits[0].float().contiguous()
                ref[f"mtp_chained_logits{i}"] = second[0].float().contiguous()
            ref[f"greedy{i}"] = torch.tensor(greedy(model, ids, 32), dtype=torch.int64)
            print(f"prompt {i}: {len(ids)} tokens, greedy {tok.decode(ref[f'greedy{i}'])!r}",
                  flush=True)
    save_file(ref, os.path.join(folder, "reference.safetensors"))
    quality = {"heldout_perplexity": ppl, "heldout_tokens": scored,
               "mtp_top1_agreement": agreement, "mtp_second_draft_agreement": agreement2,
               "copy_rate": copied,
               "parameters": sum(p.numel() for p in model.parameters()),
               "mtp_parameters": sum(p.numel() for p in mtp.parameters())}
    path = os.path.join(folder, "quality.json")
    if os.path.exists(path):
        quality = dict(json.load(open(path)), **quality)
    json.dump(dict(quality, **extra), open(path, "w"), indent=2)
    print("wrote", folder, flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", help="../shared/corpus (docs and chats .jsonl.gz or .xz)")
    ap.add_argument("--tokenizer", required=True, help="tiny-chat's folder")
    ap.add_argument("--out", required=True)
    ap.add_argument("--measure-only", action="store_true",
                    help="no training: measure the model in --out and rewrite its references")
    ap.add_argument("--heldout", default="models/tiny-chat/heldout.jsonl")
    ap.add_argument("--seconds", type=float, default=300.0, help="training time")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--copy-share", type=float, default=0.6,
                    help="share of training rows that repeat a passage of themselves")
    ap.add_argument("--mtp-weight", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layer-types", default=LAYER_TYPES,
                    help="comma-separated linear_attention / full_attention, one a layer")
    ap.add_argument("--held-out-docs", type=int, default=HELD_OUT,
                    help="held-out documents measured (fewer for a quick check of the script)")
    ap.add_argument("--cache", default="", help="file keeping the tokenized corpus between runs")
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tok = transformers.AutoTokenizer.from_pretrained(args.tokenizer)
    held = read_held_out(args.heldout, tok, args.held_out_docs)
    if args.measure_only:
        measure(args.out, tok, held, device, {})
        return
    t0 = time.time()
    stream, _ = read_corpus(args.corpus, tok, args.cache)
    print(f"corpus: {len(stream)} training tokens, {len(held)} held-out documents "
          f"({time.time() - t0:.1f} s)", flush=True)
    config = text_config(args.layer_types)
    model = build_model(config).to(device)
    mtp = Mtp(model, config).to(device)
    # Experts the eager way (a loop through F.linear, which autocast covers; the grouped_mm and
    # batched_mm backends want operands of one dtype).
    for module in list(model.modules()) + list(mtp.modules()):
        c = getattr(module, "config", None)
        if c is not None and hasattr(c, "_experts_implementation"):
            c._experts_implementation = "eager"
    params = [p for p in list(model.parameters()) + list(mtp.parameters())]
    n_model = sum(p.numel() for p in model.parameters())
    n_mtp = sum(p.numel() for p in mtp.parameters())
    print(f"{type(model).__name__}: {n_model} parameters, MTP {n_mtp}", flush=True)
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.05)
    warm = 100
    step, start = 0, time.time()
    est_steps = None
    model.train()
    mtp.train()
    while True:
        elapsed = time.time() - start
        if elapsed > args.seconds:
            break
        if step == 20:
            est_steps = int(args.seconds / (elapsed / 20))
        total = est_steps or 10 ** 9
        lr = args.lr * min(1.0, (step + 1) / warm) * (
            0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, step / total))))
        for g in opt.param_groups:
            g["lr"] = lr
        x = batch(stream, args.rows, args.length, rng, args.copy_share).to(device)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
            logits, mtp_logits, second, routers = forward_all(model, mtp, x, router=True,
                                                              chained=True)
            main_loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), x[:, 1:].flatten())
            mtp_loss = F.cross_entropy(mtp_logits[:, :-1].flatten(0, 1).float(),
                                       x[:, 2:].flatten())
            second_loss = F.cross_entropy(second[:, :-1].flatten(0, 1).float(),
                                          x[:, 3:].flatten())
            aux = balance_loss(routers, config.num_experts, config.num_experts_per_tok)
            loss = (main_loss + args.mtp_weight * (mtp_loss + 0.5 * second_loss) +
                    0.01 * aux)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 100 == 0:
            print(f"step {step} {elapsed:.0f} s lr {lr:.2e} loss {main_loss.item():.3f} "
                  f"mtp {mtp_loss.item():.3f} second {second_loss.item():.3f} "
                  f"balance {float(aux):.3f}", flush=True)
        step += 1
    print(f"trained {step} steps, {step * args.rows * args.length} tokens, "
          f"{time.time() - start:.0f} s", flush=True)

    # Saved in bf16, then measured as loaded from the folder.
    model = model.to(torch.bfloat16)
    mtp = mtp.to(torch.bfloat16)
    os.makedirs(args.out, exist_ok=True)
    model.save_pretrained(args.out)
    st = os.path.join(args.out, "model.safetensors")
    tensors = load_file(st)
    for name, p in mtp.state_dict().items():
        tensors["mtp." + name] = p.detach().to("cpu", torch.bfloat16).contiguous()
    save_file(tensors, st, metadata={"format": "pt"})
    cfg = json.load(open(os.path.join(args.out, "config.json")))
    cfg["mtp_num_hidden_layers"] = 1
    json.dump(cfg, open(os.path.join(args.out, "config.json"), "w"), indent=2)
    for f in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"]:
        shutil.copy(os.path.join(args.tokenizer, f), os.path.join(args.out, f))

    measure(args.out, tok, held, device,
            {"steps": step, "tokens": step * args.rows * args.length, "seconds": args.seconds,
             "copy_share": args.copy_share, "layer_types": args.layer_types})


if __name__ == "__main__":
    main()
