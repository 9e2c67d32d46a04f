#!/usr/bin/env bash
# A GGUF file of the shipped model (tests/cli/gguf_from_hf.py) through every command: the same
# logits (bit for bit under --exact), text and tokens as the folder; a spoiled file gives one line.
source "$(dirname "$0")/lib.sh"
gz=$1
src=models/tiny-chat
gguf="$tmp/tiny-chat.gguf"
python3 "$(dirname "$0")/gguf_from_hf.py" "$src" "$gguf"

expect_ok info $gz info --model "$gguf" --metadata
check info-family grep -q "family       qwen3" "$tmp/out"
check info-gguf grep -qE "gguf +version 3, 90 tensors \(BF16 57, F32 33\)" "$tmp/out"
check info-metadata grep -qE "tokenizer.ggml.pre +\"qwen2\"" "$tmp/out"

ids=1,20,300,4000,55,6,7000,12
expect_ok logits-folder $gz logits --model "$src" --exact --ids $ids --out "$tmp/folder.npy"
expect_ok logits-gguf $gz logits --model "$gguf" --exact --ids $ids --out "$tmp/gguf.npy"
check logits-equal cmp -s "$tmp/folder.npy" "$tmp/gguf.npy"

prompt="In the beginning God created"
expect_ok run-folder $gz run --model "$src" --exact --prompt "$prompt" --greedy --max-tokens 12
mv "$tmp/out" "$tmp/run-folder"
expect_ok run-gguf $gz run --model "$gguf" --exact --prompt "$prompt" --greedy --max-tokens 12
check run-equal cmp -s "$tmp/run-folder" "$tmp/out"

text='Hello, world! <|im_start|>user 12345 naïve café'
echo "$text" | $gz tokenize --model "$src" --special >"$tmp/tok-folder"
echo "$text" | $gz tokenize --model "$gguf" --special >"$tmp/tok-gguf"
check tokenize-equal cmp -s "$tmp/tok-folder" "$tmp/tok-gguf"
check tokenize-nonempty test -s "$tmp/tok-gguf"

expect_ok perplexity $gz perplexity --model "$gguf" --base "$src" --exact -f "$src/heldout.jsonl" \
  --limit 2 --max-tokens 128
check perplexity-kl grep -qE "^kl +0 " "$tmp/out"

expect_fail missing "no-such.gguf: cannot open" $gz run --model "$tmp/no-such.gguf" --prompt x
head -c 100000 "$gguf" >"$tmp/cut.gguf"
expect_fail truncated "cut.gguf" $gz logits --model "$tmp/cut.gguf" --ids 1 --out "$tmp/x.npy"
printf 'GGUF\3\0\0\0\377\377\377\377\377\377\377\377\0\0\0\0\0\0\0\0' >"$tmp/count.gguf"
expect_fail tensor-count "tensor count" $gz info --model "$tmp/count.gguf"

# convert: the file's types kept (BF16 linears, F32 norms), a folder that runs alone with the
# file's logits, tokens and text; with --bits, quantized as a folder is.
expect_ok convert $gz convert --from "$gguf" --to "$tmp/c"
check convert-progress grep -q "90/90" "$tmp/err"
check convert-kept-line grep -q "wrote $tmp/c: .* 90 tensors, the block types kept" "$tmp/err"
check convert-side-files test -f "$tmp/c/tokenizer.json" -a -f "$tmp/c/config.json" \
  -a -f "$tmp/c/tokenizer_config.json"
expect_ok logits-converted $gz logits --model "$tmp/c" --exact --ids $ids --out "$tmp/c.npy"
check logits-converted-equal cmp -s "$tmp/gguf.npy" "$tmp/c.npy"
echo "$text" | $gz tokenize --model "$tmp/c" --special >"$tmp/tok-converted"
check tokenize-converted-equal cmp -s "$tmp/tok-gguf" "$tmp/tok-converted"
expect_ok run-converted $gz run --model "$tmp/c" --exact --prompt "$prompt" --greedy --max-tokens 12
check run-converted-equal cmp -s "$tmp/run-folder" "$tmp/out"
chat='{"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": true}'
echo "$chat" | $gz template --model "$tmp/c" >"$tmp/template-converted"
echo "$chat" | $gz template --model "$gguf" >"$tmp/template-gguf"
check template-converted-equal cmp -s "$tmp/template-gguf" "$tmp/template-converted"
check template-nonempty test -s "$tmp/template-gguf"
expect_ok convert-bits $gz convert --from "$gguf" --to "$tmp/c8" --bits 8 --threads 2
check convert-bits-line grep -q "linears quantized (8/8 bits, rotated)" "$tmp/err"
expect_ok run-bits $gz run --model "$tmp/c8" --prompt "$prompt" --greedy --max-tokens 4
expect_fail convert-to-file "$tmp/cut.gguf exists and is a file" \
  $gz convert --from "$gguf" --to "$tmp/cut.gguf"
printf 'not a model' >"$tmp/spoiled.gguf"
expect_fail convert-not-gguf "spoiled.gguf" $gz convert --from "$tmp/spoiled.gguf" --to "$tmp/d"
check convert-not-gguf-no-output test ! -e "$tmp/d"
expect_fail convert-manifest-not-q1 "a bitgpu folder needs Q1_0" \
  $gz convert --from "$gguf" --to "$tmp/b" --manifest

# A Q1_0 file (1-bit, Bonsai's format): its types kept, and a bitgpu folder (convert --manifest)
# over the file unchanged, each with the file's logits, text and tokens.
q1="$tmp/bonsai-tiny.gguf"
python3 "$(dirname "$0")/gguf_from_hf.py" "$src" "$q1" q1_0
expect_ok logits-q1 $gz logits --model "$q1" --exact --ids $ids --out "$tmp/q1.npy"
expect_ok run-q1 $gz run --model "$q1" --exact --prompt "$prompt" --greedy --max-tokens 12
mv "$tmp/out" "$tmp/run-q1"
expect_ok convert-q1 $gz convert --from "$q1" --to "$tmp/q1-own"
check convert-q1-types grep -q "ggml blocks as the GGUF file holds them: Q1_0 57" "$tmp/err"
expect_ok logits-q1-own $gz logits --model "$tmp/q1-own" --exact --ids $ids --out "$tmp/q1-own.npy"
check logits-q1-own-equal cmp -s "$tmp/q1.npy" "$tmp/q1-own.npy"
expect_ok convert-manifest $gz convert --from "$q1" --to "$tmp/bitgpu" --manifest
check convert-manifest-line grep -q "wrote $tmp/bitgpu: a bitgpu folder" "$tmp/err"
check bitgpu-files test -f "$tmp/bitgpu/manifest.json" -a -f "$tmp/bitgpu/bonsai-tiny.aux.bin"
check bitgpu-data-unchanged cmp -s "$q1" "$tmp/bitgpu/bonsai-tiny.gguf"
expect_ok info-bitgpu $gz info --model "$tmp/bitgpu"
check info-bitgpu-family grep -q "family       qwen3" "$tmp/out"
expect_ok logits-bitgpu $gz logits --model "$tmp/bitgpu" --exact --ids $ids --out "$tmp/bitgpu.npy"
check logits-bitgpu-equal cmp -s "$tmp/q1.npy" "$tmp/bitgpu.npy"
expect_ok run-bitgpu $gz run --model "$tmp/bitgpu" --exact --prompt "$prompt" --greedy --max-tokens 12
check run-bitgpu-equal cmp -s "$tmp/run-q1" "$tmp/out"
# As bitgpu's own converter leaves a folder: the tokenizer from the data file.
rm "$tmp/bitgpu/tokenizer.json" "$tmp/bitgpu/tokenizer_config.json"
echo "$text" | $gz tokenize --model "$tmp/bitgpu" --special >"$tmp/tok-bitgpu"
check tokenize-bitgpu-equal cmp -s "$tmp/tok-gguf" "$tmp/tok-bitgpu"
mkdir "$tmp/hostile" && printf '{"version": 2, "arch": {"layers": -1}}' >"$tmp/hostile/manifest.json"
expect_fail bitgpu-hostile "hostile/manifest.json: arch.layers -1 is outside" \
  $gz logits --model "$tmp/hostile" --ids 1 --out "$tmp/x.npy"

finish
