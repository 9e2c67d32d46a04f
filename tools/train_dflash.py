#!/usr/bin/env python3
"""Trains a small DFlash drafter (block diffusion drafts, z-lab's layout) for a gizllm model.

  bench/model/dflash_data --model models/tiny-hybrid --prompts TRAIN.jsonl --layers 0,1,2,3 \
      --out TRAIN.bin --new 96
  python3 tools/train_dflash.py --data TRAIN.bin --model models/tiny-hybrid --out DIR \
      [--layers 2] [--heads 4] [--kv-heads 2] [--head-dim 32] [--ffn 256] [--block 8] \
      [--seconds 900] [--target-layers 0,1,2,3]

torch only (Debian's python3-torch runs it on the CPU; a GPU is used where torch finds one). The
drafter is z-lab's DFlashDraftModel (dflash/model.py) written out here in plain torch: the
context rows c = hidden_norm(fc(concat of the target's hidden_states[id + 1])) give each layer's
keys k_norm(k_proj(c)) and values v_proj(c); a block [token, mask x (block - 1)] at positions
i .. i + block - 1 is embedded by the target's (frozen) embedding and read by Qwen3 decoder layers
whose queries see the context before i and the whole block (no causal mask); norm(h) of block
row k goes through the target's (frozen) head and is trained to give token i + k. The training
follows DFlash's recipe (SpecForge's OnlineDFlashModel): up to --anchors anchors a sequence, all
at answer positions, each a block read beside the sequence's context in one pass with a mask;
cross-entropy of rows 1 .. block - 1 (against the target's own distribution of each label, --distill)
weighted by exp(-(k - 1) / gamma).

Data: dflash_data's file (the model's own greedy answers and its hidden states at every
position). The model's embedding (model.embed_tokens.weight, the tied head) comes from its
model.safetensors. Writes DIR/config.json (architectures DFlashDraftModel, block_size,
dflash_config {mask_token_id, target_layer_ids}, num_target_layers) and DIR/model.safetensors
(bf16), and prints the held-out acceptance: per anchor, 1 + the drafts kept before the first
wrong one (what a step that verifies block - 1 drafts gives).
"""
import argparse
import json
import math
import os
import random
import struct
import time

import numpy as np
import torch
import torch.nn.functional as F


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        raw = np.frombuffer(data[b:e], dtype=np.uint8)
        if t["dtype"] == "BF16":
            v = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif t["dtype"] == "F16":
            v = raw.view(np.float16).astype(np.float32)
        elif t["dtype"] == "F32":
            v = raw.view(np.float32)
        else:
            continue
        out[name] = torch.from_numpy(v.reshape(t["shape"]).copy())
    return out


def write_safetensors(path, tensors):
    """bf16 (round to nearest even) safetensors, names sorted."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        v = tensors[name].detach().float().contiguous().numpy().astype(np.float32)
        u = v.view(np.uint32)
        bf = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16).tobytes()
        header[name] = {"dtype": "BF16", "shape": list(v.shape),
                        "data_offsets": [offset, offset + len(bf)]}
        blobs.append(bf)
        offset += len(bf)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_data(path):
    with open(path, "rb") as f:
        assert f.read(4) == b"DFD1", path + ": not dflash_data's file"
        layers, dim, count = struct.unpack("<iii", f.read(12))
        seqs = []
        for _ in range(count):
            n, prompt = struct.unpack("<ii", f.read(8))
            ids = np.frombuffer(f.read(4 * n), dtype=np.int32).copy()
            feats = np.frombuffer(f.read(2 * n * layers * dim), dtype=np.float16).reshape(n, -1)
            seqs.append((ids, prompt, feats.copy()))
    return layers, dim, seqs


def rms_norm(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, pos, theta):
    """rotate_half rotary over the last dim of x [..., n, hd] at positions pos [n]."""
    hd = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    freqs = pos.float()[:, None] * inv[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos(), emb.sin()
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    rot = torch.cat([-x2, x1], dim=-1)
    return x * cos + rot * sin


class Drafter(torch.nn.Module):
    def __init__(self, dim, features, layers, heads, kv_heads, head_dim, ffn):
        super().__init__()
        self.dim, self.heads, self.kv, self.hd = dim, heads, kv_heads, head_dim
        P = torch.nn.Parameter
        self.fc = torch.nn.Linear(features * dim, dim, bias=False)
        self.hidden_norm = P(torch.ones(dim))
        self.norm = P(torch.ones(dim))
        self.layers = torch.nn.ModuleList()
        for _ in range(layers):
            m = torch.nn.Module()
            m.input_layernorm = P(torch.ones(dim))
            m.post_attention_layernorm = P(torch.ones(dim))
            m.q_proj = torch.nn.Linear(dim, heads * head_dim, bias=False)
            m.k_proj = torch.nn.Linear(dim, kv_heads * head_dim, bias=False)
            m.v_proj = torch.nn.Linear(dim, kv_heads * head_dim, bias=False)
            m.o_proj = torch.nn.Linear(heads * head_dim, dim, bias=False)
            m.q_norm = P(torch.ones(head_dim))
            m.k_norm = P(torch.ones(head_dim))
            m.gate_proj = torch.nn.Linear(dim, ffn, bias=False)
            m.up_proj = torch.nn.Linear(dim, ffn, bias=False)
            m.down_proj = torch.nn.Linear(ffn, dim, bias=False)
            self.layers.append(m)
        for p in self.parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=0.02)

    def forward(self, feats, ctx_pos, h, blk_pos, mask, theta):
        """feats [T, F*D], h [N, D] (block rows), mask [N, T + N] (True: may attend)."""
        c = rms_norm(self.fc(feats), self.hidden_norm)
        T, N = c.shape[0], h.shape[0]
        rep = self.heads // self.kv
        bias = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
        for m in self.layers:
            x = rms_norm(h, m.input_layernorm)
            q = rms_norm(m.q_proj(x).view(N, self.heads, self.hd), m.q_norm).transpose(0, 1)
            both = torch.cat([c, x], 0)
            k = rms_norm(m.k_proj(both).view(T + N, self.kv, self.hd), m.k_norm).transpose(0, 1)
            v = m.v_proj(both).view(T + N, self.kv, self.hd).transpose(0, 1)
            q = rope(q, blk_pos, theta)
            k = rope(k, torch.cat([ctx_pos, blk_pos]), theta)
            k = k.repeat_interleave(rep, 0)
            v = v.repeat_interleave(rep, 0)
            s = q @ k.transpose(1, 2) / math.sqrt(self.hd) + bias
            o = (s.softmax(-1) @ v).transpose(0, 1).reshape(N, -1)
            h = h + m.o_proj(o)
            y = rms_norm(h, m.post_attention_layernorm)
            h = h + m.down_proj(F.silu(m.gate_proj(y)) * m.up_proj(y))
        return rms_norm(h, self.norm)

    def state(self):
        out = {"fc.weight": self.fc.weight, "hidden_norm.weight": self.hidden_norm,
               "norm.weight": self.norm}
        for l, m in enumerate(self.layers):
            p = f"layers.{l}."
            out[p + "input_layernorm.weight"] = m.input_layernorm
            out[p + "post_attention_layernorm.weight"] = m.post_attention_layernorm
            for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
                out[p + f"self_attn.{n}.weight"] = getattr(m, n).weight
            out[p + "self_attn.q_norm.weight"] = m.q_norm
            out[p + "self_attn.k_norm.weight"] = m.k_norm
            for n in ("gate_proj", "up_proj", "down_proj"):
                out[p + f"mlp.{n}.weight"] = getattr(m, n).weight
        return out


def blocks(batch, block, anchors, mask_id, rng):
    """Sequences' anchors packed into one pass: the contexts one after another, then every
    block's rows; a block row sees its own sequence's context before its anchor and its own block.
    Returns features, context positions, block tokens, block positions, the mask and the labels
    (-100: no loss)."""
    feats, ctx_pos, toks, poss, labs, spans, src = [], [], [], [], [], [], []
    t_off = 0
    for ids, prompt, f in batch:
        T = len(ids)
        cand = list(range(max(prompt, 1), T - 1))
        if not cand:
            continue
        pick = sorted(rng.sample(cand, min(anchors, len(cand))))
        for i in pick:
            toks.append([int(ids[i])] + [mask_id] * (block - 1))
            poss.append([i + k for k in range(block)])
            labs.append([-100] + [int(ids[i + k]) if i + k < T else -100
                                  for k in range(1, block)])
            # The packed row whose features gave the target's own distribution of the label.
            src.append([0] + [t_off + min(i + k - 1, T - 1) for k in range(1, block)])
            spans.append((t_off, t_off + i))
        feats.append(torch.from_numpy(f.astype(np.float32)))
        ctx_pos.append(torch.arange(T))
        t_off += T
    if not toks:
        return None
    A, T = len(toks), t_off
    N = A * block
    mask = torch.zeros((N, T + N), dtype=torch.bool)
    for a, (b, e) in enumerate(spans):
        mask[a * block:(a + 1) * block, b:e] = True
        mask[a * block:(a + 1) * block, T + a * block:T + (a + 1) * block] = True
    return (torch.cat(feats), torch.cat(ctx_pos), torch.tensor(toks).view(-1),
            torch.tensor(poss).view(-1), mask, torch.tensor(labs).view(-1),
            torch.tensor(src).view(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--model", required=True, help="the target's folder (its embedding)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--target-layers", default="0,1,2,3",
                    help="the target layers dflash_data read (--layers there)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--ffn", type=int, default=256)
    ap.add_argument("--block", type=int, default=8)
    ap.add_argument("--anchors", type=int, default=16)
    ap.add_argument("--gamma", type=float, default=4.0)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch", type=int, default=8, help="sequences a step")
    ap.add_argument("--seconds", type=float, default=900)
    ap.add_argument("--held-out", type=int, default=200, help="sequences kept for the measure")
    ap.add_argument("--mask-token", type=int, default=0)
    ap.add_argument("--theta", type=float, default=10000.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--distill", type=int, default=1,
                    help="learn the target's distributions (1) or its greedy tokens (0)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    rng = random.Random(args.seed)
    layers, dim, seqs = read_data(args.data)
    target_ids = [int(x) for x in args.target_layers.split(",")]
    assert len(target_ids) == layers, "--target-layers must name the data's layers"
    weights = read_safetensors(os.path.join(args.model, "model.safetensors"))
    embed = weights.get("model.embed_tokens.weight")
    if embed is None:
        embed = weights["model.language_model.embed_tokens.weight"]
    head = weights.get("lm_head.weight", embed)
    cfg = json.load(open(os.path.join(args.model, "config.json")))
    cfg = cfg.get("text_config", cfg)
    target_layers = cfg["num_hidden_layers"]
    # Distillation from the target's distributions where the data holds its last layer's output.
    teacher = target_ids.index(target_layers - 1) \
        if args.distill and target_layers - 1 in target_ids else None
    rng.shuffle(seqs)
    held, train = seqs[:args.held_out], seqs[args.held_out:]
    model = Drafter(dim, layers, args.layers, args.heads, args.kv_heads, args.head_dim, args.ffn)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    w = torch.tensor([0.0] + [math.exp(-(k - 1) / args.gamma) for k in range(1, args.block)])

    def loss_of(batch, r):
        b = blocks(batch, args.block, args.anchors, args.mask_token, r)
        if b is None:
            return None, None
        feats, ctx_pos, tok, pos, mask, lab, src = b
        out = model(feats, ctx_pos, embed[tok], pos, mask, args.theta)
        keep = lab >= 0
        logits = out[keep] @ head.T
        if teacher is None:
            ce = F.cross_entropy(logits, lab[keep], reduction="none")
        else:
            # The target's own distribution of each label (its last layer's output at the row
            # before, which the data holds after the final norm, through its head): more to
            # learn from than the argmax.
            with torch.no_grad():
                last = feats[src[keep], teacher * dim:(teacher + 1) * dim]
                p = (last @ head.T).softmax(-1)
            ce = -(p * logits.log_softmax(-1)).sum(-1)
        slot = torch.arange(len(lab)) % args.block
        return (ce * w[slot[keep]]).sum(), w[slot[keep]].sum()

    def measure():
        model.eval()
        lengths = []
        r = random.Random(7)
        with torch.no_grad():
            for at in range(0, len(held), 8):
                b = blocks(held[at:at + 8], args.block, args.anchors, args.mask_token, r)
                if b is None:
                    continue
                feats, ctx_pos, tok, pos, mask, lab, _ = b
                out = model(feats, ctx_pos, embed[tok], pos, mask, args.theta)
                pred = (out @ head.T).argmax(-1).view(-1, args.block)
                lab = lab.view(-1, args.block)
                for a in range(lab.shape[0]):
                    n = 1
                    for k in range(1, args.block):
                        if lab[a, k] < 0 or pred[a, k] != lab[a, k]:
                            break
                        n += 1
                    lengths.append(n)
        model.train()
        return sum(lengths) / max(1, len(lengths))

    began = time.time()
    step, total = 0, args.seconds
    print(f"{len(train)} training sequences, {len(held)} held out; "
          f"{sum(p.numel() for p in model.parameters())} parameters", flush=True)
    while time.time() - began < total:
        frac = (time.time() - began) / total
        lr = args.lr * min(1.0, frac / 0.04) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad()
        num, den = loss_of([train[rng.randrange(len(train))] for _ in range(args.batch)], rng)
        if num is None:
            continue
        loss = num / den
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 200 == 0:
            print(f"step {step} {time.time() - began:.0f}s loss {loss.item():.3f} lr {lr:.2e} "
                  f"acceptance {measure():.3f}", flush=True)
    acceptance = measure()
    print(f"done: {step} steps, held-out acceptance length {acceptance:.3f}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    config = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3",
        "hidden_size": dim, "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads, "num_key_value_heads": args.kv_heads,
        "head_dim": args.head_dim, "intermediate_size": args.ffn, "hidden_act": "silu",
        "rms_norm_eps": 1e-6, "rope_theta": args.theta, "rope_scaling": None,
        "attention_bias": False, "tie_word_embeddings": False,
        "vocab_size": int(embed.shape[0]), "max_position_embeddings": 2048,
        "layer_types": ["full_attention"] * args.layers,
        "block_size": args.block, "num_target_layers": target_layers,
        "dflash_config": {"mask_token_id": args.mask_token, "target_layer_ids": target_ids},
        "torch_dtype": "bfloat16",
        "training": {"steps": step, "seconds": round(time.time() - began),
                     "sequences": len(train), "anchors": args.anchors, "gamma": args.gamma,
                     "held_out_acceptance_length": round(acceptance, 4)},
    }
    json.dump(config, open(os.path.join(args.out, "config.json"), "w"), indent=2)
    write_safetensors(os.path.join(args.out, "model.safetensors"), model.state())


if __name__ == "__main__":
    main()
