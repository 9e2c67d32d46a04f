#!/usr/bin/env python3
"""The encoder peer for bench/cuda/encoder_peer.sh: sentence-transformers in bf16 on a random
BERT-base-shaped model, on the GPU machine (transformers, torch, sentence-transformers, no
network).

  python3 tools/encoder_peer.py make DIR     # the model folder, made with transformers
  python3 tools/encoder_peer.py st DIR       # sentence-transformers' figures, JSON lines
  python3 tools/encoder_peer.py gemm         # torch's bf16 GEMM rate on one BERT-base FFN shape
  python3 tools/encoder_peer.py summary FILE # one line per length from the JSON lines of FILE

The folder: BertModel (hidden 768, 12 layers, 12 heads, FFN 3072, vocab 30522, 512 positions),
random weights (transformers' init) saved in bf16; a WordPiece tokenizer whose vocabulary is the
five BERT special tokens and the words w5 .. w30521, so a text of k such words is exactly k + 2
tokens ([CLS] words [SEP]); modules.json with mean pooling (sentence-transformers' Transformer
and Pooling), max_seq_length 512.

sentence-transformers' figures, per length (16, 128, 512 tokens) and batch (32 .. 1024): "encode"
is SentenceTransformer.encode of the texts (tokenization included, convert_to_tensor, the
vectors left on the GPU); "forward" is the model's forward over the same texts tokenized
beforehand (encode's work without the tokenizer). Each after a warm-up call, timed with
torch.cuda.synchronize() around calls repeated for at least SECONDS (and twice).
"""
import json
import os
import random
import sys
import time

LENGTHS = [16, 128, 512]
BATCHES = [32, 64, 128, 256, 512, 1024]
SECONDS = float(os.environ.get("SECONDS_PER_CASE", "0.5"))
VOCAB, DIM, LAYERS, HEADS, FFN, POSITIONS = 30522, 768, 12, 12, 3072, 512
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def emit(record):
    print(json.dumps(record), flush=True)


def make(out):
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    os.makedirs(out, exist_ok=True)
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=DIM, num_hidden_layers=LAYERS,
                                  num_attention_heads=HEADS, intermediate_size=FFN,
                                  max_position_embeddings=POSITIONS, type_vocab_size=2,
                                  hidden_act="gelu", layer_norm_eps=1e-12, pad_token_id=0)
    torch.manual_seed(0)
    model = transformers.BertModel(cfg)
    model.to(torch.bfloat16).save_pretrained(out)
    vocab = {t: i for i, t in enumerate(SPECIAL)}
    for i in range(len(SPECIAL), VOCAB):
        vocab[f"w{i}"] = i
    tok = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tok.decoder = decoders.WordPiece()
    tok.save(os.path.join(out, "tokenizer.json"))
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": POSITIONS,
               "pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]",
               "sep_token": "[SEP]", "mask_token": "[MASK]",
               "model_input_names": ["input_ids", "token_type_ids", "attention_mask"]},
              open(os.path.join(out, "tokenizer_config.json"), "w"), indent=2)
    json.dump([{"idx": 0, "name": "0", "path": "",
                "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling"}],
              open(os.path.join(out, "modules.json"), "w"), indent=2)
    os.makedirs(os.path.join(out, "1_Pooling"), exist_ok=True)
    json.dump({"word_embedding_dimension": DIM, "pooling_mode_cls_token": False,
               "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
               "pooling_mode_mean_sqrt_len_tokens": False,
               "pooling_mode_weightedmean_tokens": False, "pooling_mode_lasttoken": False,
               "include_prompt": True},
              open(os.path.join(out, "1_Pooling", "config.json"), "w"), indent=2)
    json.dump({"max_seq_length": POSITIONS, "do_lower_case": False},
              open(os.path.join(out, "sentence_bert_config.json"), "w"), indent=2)
    n = sum(p.numel() for p in model.parameters())
    emit({"kind": "model", "dir": out, "parameters": n, "transformers": transformers.__version__})


def texts(length, count, rng):
    return [" ".join(f"w{rng.randrange(len(SPECIAL), VOCAB)}" for _ in range(length - 2))
            for _ in range(count)]


def timed(call, seconds):
    """Seconds per call: one warm-up, then calls until `seconds` have passed (at least two)."""
    import torch
    call()
    torch.cuda.synchronize()
    start, calls = time.perf_counter(), 0
    while True:
        call()
        calls += 1
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        if calls >= 2 and elapsed >= seconds:
            return elapsed / calls, calls


def st(folder):
    import torch
    import sentence_transformers
    from sentence_transformers import SentenceTransformer

    # transformers 5 reads `dtype`; `torch_dtype` is its older name.
    model, how = None, None
    for key in ("dtype", "torch_dtype"):
        try:
            model = SentenceTransformer(folder, device="cuda",
                                        model_kwargs={key: torch.bfloat16})
        except Exception as e:  # a name this transformers does not take
            print(f"model_kwargs {key}: {e!r}", file=sys.stderr)
            continue
        how = f"model_kwargs {key}=bfloat16"
        if {p.dtype for p in model.parameters()} == {torch.bfloat16}:
            break
    if model is None or {p.dtype for p in model.parameters()} != {torch.bfloat16}:
        raise SystemExit(f"sentence-transformers did not load the model in bf16 ({how})")
    model.eval()
    try:
        attention = model[0].auto_model.config._attn_implementation
    except Exception:
        attention = None
    common = {"kind": "sentence-transformers", "version": sentence_transformers.__version__,
              "torch": torch.__version__, "device": torch.cuda.get_device_name(), "dtype": how,
              "attention": attention}
    # Tokenization: preprocess in newer sentence-transformers, tokenize before.
    tokenize = getattr(model, "preprocess", None) or model.tokenize
    rng = random.Random(1)
    for length in LENGTHS:
        pool = texts(length, max(BATCHES), rng)
        check = tokenize(pool[:2])["input_ids"]
        assert check.shape[1] == length, f"texts of {check.shape[1]} tokens, not {length}"
        for batch in BATCHES:
            chunk = pool[:batch]
            features = {k: v.to("cuda") if hasattr(v, "to") else v
                        for k, v in tokenize(chunk).items()}
            for mode in ("encode", "forward"):
                try:
                    if mode == "encode":
                        def call():
                            model.encode(chunk, batch_size=batch, convert_to_tensor=True,
                                         show_progress_bar=False)
                    else:
                        def call():
                            with torch.inference_mode():
                                model.forward(dict(features))["sentence_embedding"]
                    per_call, calls = timed(call, SECONDS)
                    emit({**common, "mode": mode, "tokens": length, "batch": batch,
                          "calls": calls, "seconds_per_call": per_call,
                          "sequences_per_s": batch / per_call,
                          "tokens_per_s": batch * length / per_call})
                except Exception as e:  # out of memory at the largest batches: say so, go on
                    emit({**common, "mode": mode, "tokens": length, "batch": batch,
                          "error": repr(e)[:300]})
                    torch.cuda.empty_cache()


def gemm():
    """torch's bf16 matmul rate on BERT-base's FFN shape at 8,192 rows: the GEMM rate the
    encoders' figures are read against."""
    import torch
    a = torch.randn(8192, DIM, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(DIM, FFN, device="cuda", dtype=torch.bfloat16)
    per_call, calls = timed(lambda: a @ w, 0.5)
    emit({"kind": "gemm", "shape": [8192, DIM, FFN], "calls": calls,
          "tflops": 2 * 8192 * DIM * FFN / per_call / 1e12, "device": torch.cuda.get_device_name()})


def flops_per_token(length):
    """BERT-base forward FLOPs per token: the linears (2 a weight) and attention's two products."""
    linears = LAYERS * (4 * DIM * DIM + 2 * DIM * FFN)
    return 2 * linears + LAYERS * 4 * length * DIM


def summary(path):
    rows = [json.loads(l) for l in open(path) if l.strip().startswith("{")]
    gemm_rows = [r for r in rows if r.get("kind") == "gemm"]
    gemm_rate = gemm_rows[0]["tflops"] if gemm_rows else None
    for length in LENGTHS:
        def best(kind, mode=None):
            c = [r for r in rows if r.get("kind") == kind and r.get("tokens") == length
                 and "sequences_per_s" in r and (mode is None or r.get("mode") == mode)]
            return max(c, key=lambda r: r["sequences_per_s"]) if c else None
        g, enc, fwd = best("gizllm"), best("sentence-transformers", "encode"), \
            best("sentence-transformers", "forward")
        peer = max([r for r in (enc, fwd) if r], key=lambda r: r["sequences_per_s"], default=None)
        record = {"kind": "summary", "tokens": length}
        if g:
            record.update(gizllm_sequences_per_s=g["sequences_per_s"], gizllm_batch=g["batch"],
                          gizllm_tflops=g["sequences_per_s"] * length * flops_per_token(length) / 1e12)
        if enc:
            record.update(st_encode_sequences_per_s=enc["sequences_per_s"], st_encode_batch=enc["batch"])
        if fwd:
            record.update(st_forward_sequences_per_s=fwd["sequences_per_s"], st_forward_batch=fwd["batch"])
        if g and peer:
            record["ratio_to_st_best"] = g["sequences_per_s"] / peer["sequences_per_s"]
        if g and gemm_rate:
            record["gizllm_share_of_gemm_rate"] = record["gizllm_tflops"] / gemm_rate
        emit(record)


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    if what == "make":
        make(sys.argv[2])
    elif what == "st":
        st(sys.argv[2])
    elif what == "gemm":
        gemm()
    elif what == "summary":
        summary(sys.argv[2])
    else:
        raise SystemExit(__doc__)
