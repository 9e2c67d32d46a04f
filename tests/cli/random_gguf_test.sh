#!/usr/bin/env bash
# bench/model/random_gguf's files (what the GGUF speed benchmarks run) load and run in gizllm: a
# small Qwen3 shape in Q4_K (Q6_K head) and Q8_0, with tiny-chat's tokenizer; the same seed writes
# the same bytes; bad arguments give one line.
source "$(dirname "$0")/lib.sh"
gz=$1
rg=$2
shape="--hidden 256 --layers 2 --heads 2 --kv-heads 1 --head-dim 128 --ffn 512 --vocab 8192"
for t in Q4_K Q8_0; do
  expect_ok write-$t $rg --out "$tmp/$t.gguf" --type $t $shape --tokenizer models/tiny-chat
  expect_ok info-$t $gz info --model "$tmp/$t.gguf"
  check info-$t-family grep -q "family       qwen3" "$tmp/out"
  expect_ok run-$t $gz run --model "$tmp/$t.gguf" --device cpu --prompt "In the beginning" \
    --greedy --max-tokens 8
done
check head-q6k grep -qE "tensors \(F32 [0-9]+, Q4_K 14, Q6_K 1, Q8_0 1\)" <($gz info --model "$tmp/Q4_K.gguf" 2>&1)
expect_ok write-again $rg --out "$tmp/again.gguf" --type Q4_K $shape --tokenizer models/tiny-chat
check same-bytes cmp -s "$tmp/Q4_K.gguf" "$tmp/again.gguf"
expect_fail bad-type "unknown or unsupported block type \"Q9\"" $rg --out "$tmp/x.gguf" --type Q9
expect_fail bad-shape "not whole" $rg --out "$tmp/x.gguf" --type Q4_K --hidden 200 --layers 1 \
  --heads 2 --kv-heads 1 --head-dim 100 --ffn 300 --vocab 300
finish
