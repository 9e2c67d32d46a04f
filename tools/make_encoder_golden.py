#!/usr/bin/env python3
"""Writes the encoder golden cases (embeddings and cross-encoder scores) with Hugging Face
transformers, and sentence-transformers where it is importable.

Run where transformers and torch are (the GPU machine); everything runs on the CPU in float32.
Random tiny models, bf16 weights (read back as float32 for the references), tiny-vocabulary
tokenizers trained here with the tokenizers library (WordPiece for BERT, byte-level BPE for
RoBERTa, Metaspace + Unigram for XLM-R), each folder well under 300 KB:

  OUT/bert_mean     BertModel, no modules.json: mean pooling, not normalized
  OUT/bert_st       BertModel + modules.json: CLS pooling, Normalize, max_seq_length 16
  OUT/roberta_st    RobertaModel + modules.json: mean pooling, Normalize
  OUT/xlmr_mean     XLMRobertaModel, no modules.json
  OUT/bert_ce       BertForSequenceClassification, one label (sigmoid scores)
  OUT/xlmr_ce       XLMRobertaForSequenceClassification, one label, activation_fn Identity
  OUT/bert_prompt   BertModel + modules.json (mean pooling, Normalize) +
                    config_sentence_transformers.json: prompts "query" ("query: ", the
                    default_prompt_name) and "document" (""); the reference is encode() of the
                    texts, which puts the default prompt before each
  OUT/qwen3_last    Qwen3Model (a decoder, as Qwen3-Embedding) + modules.json: last-token
                    pooling of the final-normed hidden states, Normalize; the tokenizer appends
                    <|endoftext|>
  OUT/qwen3_reranker  Qwen3ForCausalLM scoring pairs as Qwen3-Reranker (gizllm: a decoder asked
                    to rerank): the pair in the model card's prompt, score = softmax over the
                    last position's ["no", "yes"] logits, computed with transformers exactly as
                    the model card's code does (each pair alone, no padding); the tokenizer has
                    the chat tokens and single "yes" and "no" tokens

Each holds the model folder and reference.json:
  embedders: {"meta", "texts", "ids": [[...]], "embeddings": [[...]]}, and with prompts
             "prompt_name" (null: the default) and "prompt" (the text put before each)
  cross-encoders: {"meta", "query", "documents", "ids": [[...]], "types": [[...]],
                   "scores": [...], "order": [...]}
  qwen3_reranker: as cross-encoders, with meta.instruction and types all 0
meta.reference says where the vectors and scores come from: "sentence-transformers <version>"
(SentenceTransformer.encode, CrossEncoder.predict) where it is importable, else "by hand" (the
model run on each text alone, pooling, normalization and the activation computed here as
sentence-transformers defines them); with sentence-transformers both are computed and
meta.by_hand_max_diff holds the largest difference.

Usage: python3 tools/make_encoder_golden.py --out tests/golden/encoders [--cases NAME,...]
"""
import argparse
import json
import os
import shutil

import torch
import transformers
from tokenizers import (Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers,
                        processors, trainers)

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A journey of a thousand miles begins with a single step.",
    "Embeddings map texts to vectors; similar texts get similar vectors.",
    "Cross-encoders read the query and the document together and score the pair.",
    "In the beginning God created the heaven and the earth.",
    "Paris is the capital of France, Berlin the capital of Germany.",
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "Le renard brun rapide saute par-dessus le chien paresseux.",
    "东京是日本的首都。 Numbers: 3.14159, 2024, 42!",
    "Café, naïve, résumé — accents and dashes.",
    "How do I reset my password? Click 'Forgot password' on the sign-in page.",
    "The weather today is sunny with a light breeze from the west.",
]
TEXTS = [
    "The quick brown fox.",
    "hello world",
    "Embeddings of a longer text, which goes on and on with many words so that it passes the "
    "sixteen tokens of the sentence-transformers configuration and is cut there.",
    "Café naïve 東京",
    "a",
]
QUERY = "Where is the capital of France?"
DOCUMENTS = [
    "Paris is the capital of France.",
    "The quick brown fox jumps over the lazy dog.",
    "Berlin is the capital of Germany, and Paris the capital of France; both are large cities "
    "with long histories, many museums, parks, bridges and rivers, visited by millions every "
    "year, so this document is long enough to be cut.",
    "France",
]

BERT_SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
ROBERTA_SPECIAL = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]


def wordpiece_tokenizer():
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                strip_accents=None, lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(CORPUS * 4, trainers.WordPieceTrainer(
        vocab_size=300, special_tokens=BERT_SPECIAL))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    tok.decoder = decoders.WordPiece()
    return tok


def bpe_tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(CORPUS * 4, trainers.BpeTrainer(
        vocab_size=360, special_tokens=ROBERTA_SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.RobertaProcessing(("</s>", tok.token_to_id("</s>")),
                                                      ("<s>", tok.token_to_id("<s>")))
    tok.decoder = decoders.ByteLevel()
    return tok


def unigram_tokenizer():
    tok = Tokenizer(models.Unigram())
    # XLM-R's sentencepiece normalizer is a Precompiled nmt_nfkc map; its parts here.
    tok.normalizer = normalizers.Sequence([normalizers.Nmt(), normalizers.NFKC(),
                                           normalizers.Replace(Regex(" {2,}"), " ")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.train_from_iterator(CORPUS * 4, trainers.UnigramTrainer(
        vocab_size=300, special_tokens=ROBERTA_SPECIAL, unk_token="<unk>"))
    s, e = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", s), ("</s>", e)])
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    return tok


def randomize(model, seed):
    """Weights that make every part of the model matter (the default init leaves LayerNorms at
    1 and 0 and the linears near zero)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm.weight" in name:
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif "embeddings" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))


def randomize_decoder(model, seed, embed_std):
    """The same for a Qwen3 decoder: RMSNorms near 1, embeddings of std embed_std."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_((embed_std if "embed" in name else 0.2) * torch.randn(p.shape, generator=g))


def write_st_files(out, pooling, normalize, max_seq_length, dim):
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
        os.makedirs(os.path.join(out, "2_Normalize"), exist_ok=True)
    json.dump(modules, open(os.path.join(out, "modules.json"), "w"), indent=2)
    os.makedirs(os.path.join(out, "1_Pooling"), exist_ok=True)
    json.dump({"word_embedding_dimension": dim,
               "pooling_mode_cls_token": pooling == "cls",
               "pooling_mode_mean_tokens": pooling == "mean",
               "pooling_mode_max_tokens": False,
               "pooling_mode_mean_sqrt_len_tokens": False,
               "pooling_mode_weightedmean_tokens": False,
               "pooling_mode_lasttoken": pooling == "lasttoken",
               "include_prompt": True},
              open(os.path.join(out, "1_Pooling", "config.json"), "w"), indent=2)
    json.dump({"max_seq_length": max_seq_length, "do_lower_case": False},
              open(os.path.join(out, "sentence_bert_config.json"), "w"), indent=2)


def save_folder(out, model, tok, family, max_tokens):
    if os.path.exists(out):
        shutil.rmtree(out)
    model.to(torch.bfloat16).save_pretrained(out)
    tok.save(os.path.join(out, "tokenizer.json"))
    special = BERT_SPECIAL if family == "bert" else ROBERTA_SPECIAL
    names = (["pad_token", "unk_token", "cls_token", "sep_token", "mask_token"] if family == "bert"
             else ["bos_token", "pad_token", "eos_token", "unk_token", "mask_token"])
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_tokens}
    if family == "bert":  # as BertTokenizer gives them: a pair's second text has token type 1
        config["model_input_names"] = ["input_ids", "token_type_ids", "attention_mask"]
    config.update(dict(zip(names, special)))
    if family != "bert":
        config.update(cls_token="<s>", sep_token="</s>")
    json.dump(config, open(os.path.join(out, "tokenizer_config.json"), "w"), indent=2)


# The folders hold bf16 weights, which transformers 5 loads as bf16 unless told otherwise: the
# references compute in float32 (the weights' bf16 values widened), as gizllm's --exact mode does.
F32 = {"dtype": torch.float32}


def float32_only(module):
    """Raises unless every parameter of `module` is float32."""
    kinds = {p.dtype for p in module.parameters()}
    if kinds != {torch.float32}:
        raise RuntimeError(f"reference model loaded as {kinds}, not float32")


def load_f32(cls, out):
    return cls.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()


def pool(hidden, mode, normalize):
    v = hidden[0] if mode == "cls" else hidden[-1] if mode == "lasttoken" else hidden.mean(0)
    return torch.nn.functional.normalize(v, dim=-1) if normalize else v


def st_version():
    try:
        import sentence_transformers
        return sentence_transformers.__version__
    except ImportError:
        return None


PROMPTS = {"query": "query: ", "document": ""}


def embedder(out, family, pooling, normalize, st_files, seed, prompts=None, default_prompt=None):
    tok = {"bert": wordpiece_tokenizer, "roberta": bpe_tokenizer, "xlm-roberta": unigram_tokenizer}[family]()
    common = dict(vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=2,
                  num_attention_heads=4, intermediate_size=64, max_position_embeddings=64,
                  hidden_act="gelu", layer_norm_eps=1e-12)
    if family == "bert":
        cfg = transformers.BertConfig(**common, type_vocab_size=2, pad_token_id=0)
        model = transformers.BertModel(cfg)
    elif family == "roberta":
        cfg = transformers.RobertaConfig(**common, type_vocab_size=1, pad_token_id=1)
        model = transformers.RobertaModel(cfg)
    else:
        cfg = transformers.XLMRobertaConfig(**common, type_vocab_size=1, pad_token_id=1)
        model = transformers.XLMRobertaModel(cfg)
    randomize(model, seed)
    positions = 64 if family == "bert" else 62
    max_seq = 16 if st_files and pooling == "cls" else positions
    save_folder(out, model, tok, family, positions)
    if st_files:
        write_st_files(out, pooling, normalize, max_seq, 32)
    prompt = ""
    if prompts:
        json.dump({"prompts": prompts, "default_prompt_name": default_prompt,
                   "similarity_fn_name": "cosine"},
                  open(os.path.join(out, "config_sentence_transformers.json"), "w"), indent=2)
        prompt = prompts[default_prompt] if default_prompt else ""
    model = load_f32(type(model), out)
    ids, by_hand = [], []
    tok.enable_truncation(max_length=max_seq)
    for text in TEXTS:
        e = tok.encode(prompt + text)
        ids.append(e.ids)
        with torch.no_grad():
            h = model(input_ids=torch.tensor([e.ids])).last_hidden_state[0]
        by_hand.append(pool(h, pooling, normalize))
    by_hand = torch.stack(by_hand)
    meta = {"family": family, "pooling": pooling, "normalize": normalize,
            "modules_json": st_files, "max_tokens": max_seq,
            "transformers": transformers.__version__, "torch": torch.__version__}
    if prompts:
        meta["prompts"] = prompts
    vectors, version = by_hand, st_version()
    meta["reference"] = "by hand"
    if version:
        try:
            from sentence_transformers import SentenceTransformer
            st = SentenceTransformer(out, device="cpu", model_kwargs=F32)
            float32_only(st)
            vectors = torch.tensor(st.encode(TEXTS, convert_to_numpy=True, batch_size=2))
            meta["reference"] = "sentence-transformers " + version
            meta["by_hand_max_diff"] = float((vectors - by_hand).abs().max())
        except Exception as e:  # the by-hand vectors stay the reference; say why
            vectors = by_hand
            meta["sentence_transformers_error"] = repr(e)[:300]
    reference = {"meta": meta, "texts": TEXTS, "ids": ids, "embeddings": vectors.tolist()}
    if prompts:
        reference.update(prompt_name=None, prompt=prompt)
    json.dump(reference, open(os.path.join(out, "reference.json"), "w"))
    return meta


def cross_encoder(out, family, activation, seed):
    tok = {"bert": wordpiece_tokenizer, "xlm-roberta": unigram_tokenizer}[family]()
    common = dict(vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=2,
                  num_attention_heads=4, intermediate_size=64, max_position_embeddings=48,
                  hidden_act="gelu", layer_norm_eps=1e-12, num_labels=1)
    if family == "bert":
        cfg = transformers.BertConfig(**common, type_vocab_size=2, pad_token_id=0)
        model = transformers.BertForSequenceClassification(cfg)
        positions = 48
    else:
        cfg = transformers.XLMRobertaConfig(**common, type_vocab_size=1, pad_token_id=1)
        model = transformers.XLMRobertaForSequenceClassification(cfg)
        positions = 46
    if activation:
        model.config.sentence_transformers = {"activation_fn": activation}
        model.config.sbert_ce_default_activation_function = activation
    randomize(model, seed)
    save_folder(out, model, tok, family, positions)
    model = load_f32(type(model), out)
    tok.enable_truncation(max_length=positions, strategy="longest_first")
    ids, types, logits = [], [], []
    for doc in DOCUMENTS:
        e = tok.encode(QUERY, doc)
        ids.append(e.ids)
        types.append(e.type_ids)
        kwargs = {"input_ids": torch.tensor([e.ids])}
        if family == "bert":
            kwargs["token_type_ids"] = torch.tensor([e.type_ids])
        with torch.no_grad():
            logits.append(model(**kwargs).logits[0, 0])
    logits = torch.stack(logits)
    identity = activation and activation.endswith("Identity")
    by_hand = logits if identity else torch.sigmoid(logits)
    meta = {"family": family, "activation": activation or "default (sigmoid for one label)",
            "max_tokens": positions, "transformers": transformers.__version__,
            "torch": torch.__version__, "reference": "by hand"}
    scores, version = by_hand, st_version()
    if version:
        try:
            from sentence_transformers import CrossEncoder
            ce = CrossEncoder(out, device="cpu", max_length=positions, model_kwargs=F32)
            float32_only(ce if isinstance(ce, torch.nn.Module) else ce.model)
            for doc, want_ids, want_types in zip(DOCUMENTS, ids, types):
                got = ce.tokenizer(QUERY, doc, truncation=True, max_length=positions)
                got_types = got.get("token_type_ids", [0] * len(got["input_ids"]))
                if list(got["input_ids"]) != want_ids or (family == "bert" and
                                                          list(got_types) != want_types):
                    print(f"WARNING {out}: sentence-transformers' tokenizer gives "
                          f"{list(got['input_ids'])} types {list(got_types)}, the tokenizer "
                          f"{want_ids} types {want_types}", flush=True)
            scores = torch.tensor(ce.predict([(QUERY, d) for d in DOCUMENTS], batch_size=2))
            meta["reference"] = "sentence-transformers " + version
            meta["by_hand_max_diff"] = float((scores - by_hand).abs().max())
        except Exception as e:  # the by-hand scores stay the reference; say why
            scores = by_hand
            meta["sentence_transformers_error"] = repr(e)[:300]
    order = sorted(range(len(DOCUMENTS)), key=lambda i: -float(scores[i]))
    json.dump({"meta": meta, "query": QUERY, "documents": DOCUMENTS, "ids": ids, "types": types,
               "scores": scores.tolist(), "order": order},
              open(os.path.join(out, "reference.json"), "w"))
    return meta


def decoder_embedder(out, seed):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(CORPUS * 4, trainers.BpeTrainer(
        vocab_size=360, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    eos = tok.token_to_id("<|endoftext|>")
    tok.post_processor = processors.TemplateProcessing(
        single="$A <|endoftext|>", pair="$A <|endoftext|> $B:1 <|endoftext|>:1",
        special_tokens=[("<|endoftext|>", eos)])
    tok.decoder = decoders.ByteLevel()
    cfg = transformers.Qwen3Config(vocab_size=tok.get_vocab_size(), hidden_size=32,
                                   intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                   max_position_embeddings=128, rms_norm_eps=1e-6,
                                   tie_word_embeddings=True, eos_token_id=eos)
    model = transformers.Qwen3Model(cfg)
    randomize_decoder(model, seed, embed_std=1.0)
    if os.path.exists(out):
        shutil.rmtree(out)
    model.to(torch.bfloat16).save_pretrained(out)
    tok.save(os.path.join(out, "tokenizer.json"))
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 128,
               "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "padding_side": "left"},
              open(os.path.join(out, "tokenizer_config.json"), "w"), indent=2)
    write_st_files(out, "lasttoken", True, 128, 32)
    model = load_f32(transformers.Qwen3Model, out)
    ids, by_hand = [], []
    for text in TEXTS:
        e = tok.encode(text)
        ids.append(e.ids)
        with torch.no_grad():
            h = model(input_ids=torch.tensor([e.ids])).last_hidden_state[0]
        by_hand.append(pool(h, "lasttoken", True))
    by_hand = torch.stack(by_hand)
    meta = {"family": "qwen3", "pooling": "lasttoken", "normalize": True, "modules_json": True,
            "max_tokens": 128, "transformers": transformers.__version__,
            "torch": torch.__version__, "reference": "by hand"}
    vectors, version = by_hand, st_version()
    if version:
        try:
            from sentence_transformers import SentenceTransformer
            st = SentenceTransformer(out, device="cpu", model_kwargs=F32)
            float32_only(st)
            vectors = torch.tensor(st.encode(TEXTS, convert_to_numpy=True, batch_size=2))
            meta["reference"] = "sentence-transformers " + version
            meta["by_hand_max_diff"] = float((vectors - by_hand).abs().max())
        except Exception as e:  # the by-hand vectors stay the reference; say why
            vectors = by_hand
            meta["sentence_transformers_error"] = repr(e)[:300]
    json.dump({"meta": meta, "texts": TEXTS, "ids": ids, "embeddings": vectors.tolist()},
              open(os.path.join(out, "reference.json"), "w"))
    return meta


RERANK_PREFIX = ("<|im_start|>system\nJudge whether the Document meets the requirements based on "
                 "the Query and the Instruct provided. Note that the answer can only be \"yes\" "
                 "or \"no\".<|im_end|>\n<|im_start|>user\n")
RERANK_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
RERANK_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"


def decoder_reranker(out, seed):
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    # "yes" and "no" on lines of their own, often: BPE learns them as single tokens.
    tok.train_from_iterator(CORPUS * 4 + ["yes", "no"] * 200, trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.decoder = decoders.ByteLevel()
    no, yes = tok.token_to_id("no"), tok.token_to_id("yes")
    assert no is not None and yes is not None, "the tokenizer lacks single yes and no tokens"
    positions = 512
    cfg = transformers.Qwen3Config(vocab_size=tok.get_vocab_size(), hidden_size=32,
                                   intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                   max_position_embeddings=positions, rms_norm_eps=1e-6,
                                   tie_word_embeddings=True, eos_token_id=tok.token_to_id("<|im_end|>"))
    model = transformers.Qwen3ForCausalLM(cfg)
    # Embeddings of std 0.5 (the tied head too): yes - no logit margins of a few units, so no
    # score rounds to 0 or 1 and the order has no ties.
    randomize_decoder(model, seed, embed_std=0.5)
    if os.path.exists(out):
        shutil.rmtree(out)
    model.to(torch.bfloat16).save_pretrained(out)
    tok.save(os.path.join(out, "tokenizer.json"))
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": positions,
               "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "padding_side": "left"},
              open(os.path.join(out, "tokenizer_config.json"), "w"), indent=2)
    # The model card's code (Qwen/Qwen3-Reranker-0.6B), each pair alone.
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    assert hf_tok.convert_tokens_to_ids("no") == no and hf_tok.convert_tokens_to_ids("yes") == yes
    prefix = hf_tok.encode(RERANK_PREFIX, add_special_tokens=False)
    suffix = hf_tok.encode(RERANK_SUFFIX, add_special_tokens=False)
    texts = [f"<Instruct>: {RERANK_INSTRUCTION}\n<Query>: {QUERY}\n<Document>: {doc}"
             for doc in DOCUMENTS]
    bodies = hf_tok(texts, padding=False, truncation="longest_first",
                    return_attention_mask=False,
                    max_length=positions - len(prefix) - len(suffix))["input_ids"]
    ids = [prefix + list(b) + suffix for b in bodies]
    model = load_f32(transformers.Qwen3ForCausalLM, out)
    float32_only(model)
    scores = []
    for x in ids:
        with torch.no_grad():
            last = model(input_ids=torch.tensor([x])).logits[0, -1, :]
        pair = torch.stack([last[no], last[yes]]).log_softmax(dim=0)
        scores.append(float(pair[1].exp()))
    order = sorted(range(len(DOCUMENTS)), key=lambda i: -scores[i])
    assert len(set(scores)) == len(scores) and all(0 < x < 1 for x in scores), scores
    meta = {"family": "qwen3", "yes_no": True, "instruction": RERANK_INSTRUCTION,
            "max_tokens": positions, "transformers": transformers.__version__,
            "torch": torch.__version__,
            "reference": "transformers " + transformers.__version__ + " (Qwen3-Reranker's code)"}
    json.dump({"meta": meta, "query": QUERY, "documents": DOCUMENTS, "ids": ids,
               "types": [[0] * len(x) for x in ids], "scores": scores, "order": order},
              open(os.path.join(out, "reference.json"), "w"))
    return meta


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/golden/encoders")
    ap.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    cases = [
        ("bert_mean", lambda o: embedder(o, "bert", "mean", False, False, 1)),
        ("bert_st", lambda o: embedder(o, "bert", "cls", True, True, 2)),
        ("roberta_st", lambda o: embedder(o, "roberta", "mean", True, True, 3)),
        ("xlmr_mean", lambda o: embedder(o, "xlm-roberta", "mean", False, False, 4)),
        ("bert_prompt", lambda o: embedder(o, "bert", "mean", True, True, 8, PROMPTS, "query")),
        ("bert_ce", lambda o: cross_encoder(o, "bert", None, 5)),
        ("xlmr_ce", lambda o: cross_encoder(o, "xlm-roberta",
                                            "torch.nn.modules.linear.Identity", 6)),
        ("qwen3_last", lambda o: decoder_embedder(o, 7)),
        ("qwen3_reranker", lambda o: decoder_reranker(o, 9)),
    ]
    wanted = set(filter(None, a.cases.split(",")))
    unknown = wanted - {name for name, _ in cases}
    if unknown:
        raise SystemExit(f"unknown cases: {sorted(unknown)}")
    for name, make in cases:
        if wanted and name not in wanted:
            continue
        out = os.path.join(a.out, name)
        meta = make(out)
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(out) for f in fs)
        print(f"{name}: {size / 1024:.0f} KB, reference {meta['reference']}"
              + (f", by-hand max diff {meta['by_hand_max_diff']:.2e}" if "by_hand_max_diff" in meta else ""))
        assert size < 300 * 1024, f"{out} is {size} bytes"


if __name__ == "__main__":
    main()
