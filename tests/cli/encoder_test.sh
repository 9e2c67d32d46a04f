#!/usr/bin/env bash
# embed and rerank on random tiny encoders (tests/cli/tiny_encoder.py): shapes, the
# sentence-transformers pooling and normalization, truncation, batching, ranking, bad input.
source "$(dirname "$0")/lib.sh"
gz=$1
here=$(dirname "$0")

python3 "$here/tiny_encoder.py" "$tmp/bert"
python3 "$here/tiny_encoder.py" "$tmp/st" --st
python3 "$here/tiny_encoder.py" "$tmp/ce" --family roberta --head
printf '"hello world"\n"The quick brown fox jumps over the lazy dog"\n\n"a"\n' >"$tmp/texts.jsonl"

expect_ok embed-help $gz embed --help
check embed-help-pooling grep -q "modules.json" "$tmp/out"
expect_ok rerank-help $gz rerank --help

# Mean pooling without modules.json: three vectors of 16 floats, not unit length.
$gz embed -m "$tmp/bert" --exact <"$tmp/texts.jsonl" >"$tmp/mean.jsonl"
check embed-mean python3 -c '
import json, sys
v = [json.loads(l) for l in open(sys.argv[1])]
assert len(v) == 3 and all(len(x) == 16 for x in v), v
assert abs(sum(x * x for x in v[0]) - 1) > 1e-3
' "$tmp/mean.jsonl"
# Batches of one give the same vectors as one batch (packed sequences do not mix).
$gz embed -m "$tmp/bert" --exact --batch 1 <"$tmp/texts.jsonl" >"$tmp/one.jsonl"
check embed-batch-equal python3 -c '
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert all(abs(x - y) < 1e-6 for u, w in zip(a, b) for x, y in zip(u, w)), (a, b)
' "$tmp/mean.jsonl" "$tmp/one.jsonl"
# sentence-transformers files: CLS pooling, unit vectors; texts cut at max_seq_length 16, so two
# texts that share their first 14 words embed alike.
words="one two three four five six seven eight nine ten eleven twelve thirteen fourteen"
printf '"%s"\n"%s fifteen"\n"%s sixteen seventeen"\n' "$words" "$words" "$words" >"$tmp/long.jsonl"
$gz embed -m "$tmp/st" --exact <"$tmp/long.jsonl" >"$tmp/st.jsonl"
check embed-st-normalized-truncated python3 -c '
import json, sys
v = [json.loads(l) for l in open(sys.argv[1])]
assert all(abs(sum(x * x for x in u) - 1) < 1e-5 for u in v)
assert v[0] == v[1] == v[2], "cut at 16 tokens"
' "$tmp/st.jsonl"

# Prompts: the default prompt ("query: ") goes before every text, as its text written out does;
# --prompt-name picks another; an unknown name fails naming the known ones.
python3 "$here/tiny_encoder.py" "$tmp/prompts" --st --prompts
echo '"the fox"' | $gz embed -m "$tmp/prompts" --exact >"$tmp/p-default.jsonl"
echo '"query: the fox"' | $gz embed -m "$tmp/prompts" --exact --prompt-name none >"$tmp/p-written.jsonl"
echo '"the fox"' | $gz embed -m "$tmp/prompts" --exact --prompt-name none >"$tmp/p-none.jsonl"
check embed-default-prompt cmp -s "$tmp/p-default.jsonl" "$tmp/p-written.jsonl"
check embed-prompt-none bash -c "! cmp -s '$tmp/p-default.jsonl' '$tmp/p-none.jsonl'"
expect_fail embed-unknown-prompt "none, query" \
  bash -c "echo '\"x\"' | $gz embed -m '$tmp/prompts' --prompt-name passage"

# Rerank: every document once, best first, scores in (0, 1) (sigmoid of one label).
printf '"the fox"\n"hello world"\n"a dog sleeps"\n"the quick brown fox"\n' >"$tmp/docs.jsonl"
$gz rerank -m "$tmp/ce" --exact -q "where is the fox" <"$tmp/docs.jsonl" >"$tmp/rank.jsonl"
check rerank-order python3 -c '
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])]
assert sorted(x["index"] for x in r) == [0, 1, 2, 3], r
s = [x["relevance_score"] for x in r]
assert s == sorted(s, reverse=True) and all(0 < x < 1 for x in s), s
' "$tmp/rank.jsonl"
$gz rerank -m "$tmp/ce" --exact -q "where is the fox" --top-n 2 <"$tmp/docs.jsonl" >"$tmp/top.jsonl"
check rerank-top-n bash -c "[ \$(wc -l <'$tmp/top.jsonl') -eq 2 ] && head -2 '$tmp/rank.jsonl' | cmp -s - '$tmp/top.jsonl'"

# embed --bench: one JSON line per (tokens, batch), tokens_per_s = sequences_per_s x tokens.
$gz embed -m "$tmp/bert" --bench --bench-tokens 8,40 --bench-batch 3,5 --bench-seconds 0.05 \
  >"$tmp/bench.jsonl" </dev/null
check embed-bench python3 -c '
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])]
assert [(x["tokens"], x["batch"]) for x in r] == [(8, 3), (8, 5), (40, 3), (40, 5)], r
for x in r:
    assert x["bench"] == "embed" and x["family"] == "bert" and x["dim"] == 16, x
    assert x["calls"] >= 2 and x["seconds"] >= 0.05 and x["sequences_per_s"] > 0, x
    assert abs(x["sequences_per_s"] - x["calls"] * x["batch"] / x["seconds"]) < 1e-6 * x["sequences_per_s"], x
    assert abs(x["tokens_per_s"] - x["sequences_per_s"] * x["tokens"]) < 1e-6 * x["tokens_per_s"], x
' "$tmp/bench.jsonl"
expect_fail embed-bench-too-long "expected 1 to the model's 40" \
  $gz embed -m "$tmp/bert" --bench --bench-tokens 41
expect_fail serve-batch-tokens "max-batch-tokens must be at least 1" \
  $gz serve -m "$tmp/bert" --port 0 --max-batch-tokens 0
check serve-help-batch-tokens bash -c "$gz serve --help | grep -q -- --max-batch-tokens"

expect_fail embed-not-json "stdin line 2: expected a JSON string" \
  bash -c "printf '\"ok\"\nnot json\n' | $gz embed -m '$tmp/bert'"
# A decoder embeds too (its final-normed hidden states, mean pooled without modules.json) but
# scores nothing.
echo '"In the beginning"' | $gz embed -m models/tiny-chat --exact >"$tmp/decoder.jsonl"
check embed-decoder python3 -c '
import json, sys
v = [json.loads(l) for l in open(sys.argv[1])]
assert len(v) == 1 and len(v[0]) == 384, len(v[0])
' "$tmp/decoder.jsonl"
# A decoder reranks as Qwen3-Reranker with its "yes" and "no" tokens: tiny-chat has no "yes"; with
# config.json's classifier_from_token naming two it has, it scores.
expect_fail rerank-decoder-no-yes 'no token "yes"' \
  bash -c "echo '\"x\"' | $gz rerank -m models/tiny-chat -q q"
mkdir -p "$tmp/yes-no"
for f in model.safetensors tokenizer.json tokenizer_config.json generation_config.json; do
  ln -s "$PWD/models/tiny-chat/$f" "$tmp/yes-no/$f"
done
python3 -c '
import json, sys
c = json.load(open("models/tiny-chat/config.json"))
c["classifier_from_token"] = ["no", "Yes"]
json.dump(c, open(sys.argv[1], "w"))
' "$tmp/yes-no/config.json"
$gz rerank -m "$tmp/yes-no" --exact -q "Recite John 3:16." <"$tmp/docs.jsonl" >"$tmp/yes-no.jsonl"
check rerank-decoder-yes-no python3 -c '
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])]
assert sorted(x["index"] for x in r) == [0, 1, 2, 3], r
s = [x["relevance_score"] for x in r]
assert s == sorted(s, reverse=True) and all(0 < x < 1 for x in s) and len(set(s)) > 1, s
' "$tmp/yes-no.jsonl"
expect_fail rerank-no-head "no sequence-classification head" \
  bash -c "echo '\"x\"' | $gz rerank -m '$tmp/bert' -q q"
expect_fail run-encoder "is an encoder" $gz run -m "$tmp/bert" --prompt hi

finish
