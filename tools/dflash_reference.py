#!/usr/bin/env python3
"""The reference for gizllm's DFlash drafter: z-lab's own DFlashDraftModel (dflash/model.py) over
a drafter folder and its target, on a prompt, in float32.

Run where torch, transformers and z-lab's dflash package are (the GPU machine; its image has
transformers 5.x, and z-lab's package can travel as its dflash/ folder on PYTHONPATH):
  pip install git+https://github.com/z-lab/dflash   # or PYTHONPATH=folder/holding/dflash
  python3 tools/dflash_reference.py --target models/tiny-hybrid --drafter models/tiny-hybrid/dflash \
      --out models/tiny-hybrid/dflash/reference.safetensors
models/tiny-hybrid/dflash/reference.safetensors was written so (z-lab/dflash at 44947fb,
transformers 5.17, on the CPU in float32); tests/unit/engine/engine_dflash_test.cc reads it.

Writes ids [tokens] (a ChatML prompt and the target's greedy answer; the drafter's context is
the target's features of positions 0 .. tokens - 2), block_normed
[block - 1, dim] (the drafter's final-normed rows 1 .. block - 1 for the block [ids[-1], mask x
(block - 1)] at position tokens - 1) and draft_logits [block - 1, vocab] (those rows through the
target's head), the tensors gizllm's DFlashDrafter computes.
"""
import argparse

import torch
import transformers
from safetensors.torch import save_file

from dflash.model import DFlashDraftModel, extract_context_feature


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--prompt", default="<|im_start|>user\nRecite Luke 1:54.<|im_end|>\n"
                                        "<|im_start|>assistant\n")
    ap.add_argument("--new", type=int, default=12)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    tok = transformers.AutoTokenizer.from_pretrained(args.target)
    target = transformers.AutoModelForCausalLM.from_pretrained(
        args.target, dtype=torch.float32).eval()
    drafter = DFlashDraftModel.from_pretrained(args.drafter, dtype=torch.float32).eval()
    ids = tok(args.prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        ids = target.generate(ids, max_new_tokens=args.new, do_sample=False)
        n = ids.shape[1]
        out = target(ids[:, :-1], output_hidden_states=True)
        context = extract_context_feature(out.hidden_states, drafter.target_layer_ids)
        block = torch.full((1, drafter.block_size), drafter.mask_token_id, dtype=torch.long)
        block[0, 0] = ids[0, -1]
        noise = target.model.embed_tokens(block)
        positions = torch.arange(n - 1 + drafter.block_size).unsqueeze(0)
        normed = drafter(target_hidden=context, noise_embedding=noise, position_ids=positions,
                         use_cache=False, is_causal=False)[0, 1:]
        logits = target.lm_head(normed)
    save_file({"ids": ids[0].to(torch.int32).contiguous(),
               "block_normed": normed.contiguous(),
               "draft_logits": logits.contiguous()}, args.out)


if __name__ == "__main__":
    main()
