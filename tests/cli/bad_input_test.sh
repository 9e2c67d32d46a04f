#!/usr/bin/env bash
# Bad model folders and arguments: a one-line error naming the file and problem, exit code 1.
source "$(dirname "$0")/lib.sh"
gz=$1
src=models/tiny-chat

# A copy of tiny-chat whose files the cases below spoil one at a time.
fresh() {
  rm -rf "$tmp/m"; mkdir "$tmp/m"
  cp "$src"/config.json "$src"/generation_config.json "$src"/tokenizer.json \
     "$src"/tokenizer_config.json "$tmp/m/"
  ln -s "$(pwd)/$src/model.safetensors" "$tmp/m/model.safetensors"
}
# write_safetensors FILE HEADER_JSON DATA_BYTES [DECLARED_HEADER_LENGTH]
write_safetensors() {
  python3 - "$@" <<'PY'
import struct, sys
path, header, nbytes = sys.argv[1], sys.argv[2].encode(), int(sys.argv[3])
declared = int(sys.argv[4]) if len(sys.argv) > 4 else len(header)
with open(path, "wb") as f:
    f.write(struct.pack("<Q", declared)); f.write(header); f.write(b"\0" * nbytes)
PY
}

expect_fail missing-folder "no-such-model" $gz logits --model "$tmp/no-such-model" --ids 1 --out "$tmp/x.npy"

fresh; rm "$tmp/m/model.safetensors"
expect_fail missing-weights "model.safetensors" $gz logits --model "$tmp/m" --ids 1 --out "$tmp/x.npy"

fresh; rm "$tmp/m/model.safetensors"; head -c 1000000 "$src/model.safetensors" >"$tmp/m/model.safetensors"
expect_fail truncated "model.safetensors" $gz logits --model "$tmp/m" --ids 1 --out "$tmp/x.npy"

fresh; rm "$tmp/m/model.safetensors"; head -c 5 "$src/model.safetensors" >"$tmp/m/model.safetensors"
expect_fail shorter-than-header "model.safetensors" $gz info --model "$tmp/m"

fresh; rm "$tmp/m/model.safetensors"
write_safetensors "$tmp/m/model.safetensors" '{"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}' 16 100000
expect_fail header-length-lies "model.safetensors" $gz info --model "$tmp/m"

fresh; rm "$tmp/m/model.safetensors"
write_safetensors "$tmp/m/model.safetensors" '{"a": {"dtype": "F32", "shape": [100], "data_offsets": [0, 16]}}' 16
expect_fail shape-disagrees-with-offsets "model.safetensors" $gz info --model "$tmp/m"

fresh; rm "$tmp/m/model.safetensors"
write_safetensors "$tmp/m/model.safetensors" '{"a": {"dtype": "F9_E9", "shape": [4], "data_offsets": [0, 16]}}' 16
expect_fail unknown-dtype "F9_E9" $gz info --model "$tmp/m"

fresh; rm "$tmp/m/model.safetensors"
write_safetensors "$tmp/m/model.safetensors" '{"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}' 16
expect_fail missing-tensor "model.embed_tokens.weight" $gz info --model "$tmp/m"

fresh; sed -i 's/"qwen3"/"qwen9"/' "$tmp/m/config.json"
expect_fail unsupported-architecture "qwen9" $gz info --model "$tmp/m"

fresh; echo '{"model_type": ' >"$tmp/m/config.json"
expect_fail config-not-json "config.json" $gz info --model "$tmp/m"

fresh; sed -i 's/"model_type": "qwen3"/"model_type": "qwen3", "final_logit_softcapping": 30.0/' "$tmp/m/config.json"
expect_fail unimplemented-config-field "final_logit_softcapping" $gz info --model "$tmp/m"

expect_fail exact-and-bf16 "pick one" $gz run --model "$tmp/m" --exact --bf16 --prompt hi

fresh; sed -i 's/"hidden_size": 384/"hidden_size": "wide"/' "$tmp/m/config.json"
expect_fail config-wrong-type "hidden_size" $gz info --model "$tmp/m"

# edit_json FILE PYTHON: runs PYTHON with the file's JSON as j, then writes it back.
edit_json() {
  python3 - "$1" "$2" <<'PY'
import json, sys
path = sys.argv[1]
j = json.load(open(path))
exec(sys.argv[2])
json.dump(j, open(path, "w"))
PY
}

# Token ids beyond the vocabulary: an error naming the file, the field, the token and the id, not
# a table of a billion entries.
fresh; edit_json "$tmp/m/tokenizer.json" 'j["model"]["vocab"]["the"] = 1000000005'
expect_fail tokenizer-vocab-id-huge "model.vocab[\"the\"]': token 'the' has id 1000000005" \
  timeout 60 $gz tokenize --model "$tmp/m" <<<"the end"
expect_error run-tokenizer-vocab-id-huge "tokenizer.json" \
  timeout 60 $gz run --model "$tmp/m" --prompt "the end" --max-tokens 2
fresh; edit_json "$tmp/m/tokenizer.json" 'j["added_tokens"][2]["id"] = 2147483647'
expect_fail tokenizer-added-id-huge "added_tokens[2].id': token '<|im_end|>' has id 2147483647" \
  timeout 60 $gz tokenize --model "$tmp/m" <<<"the end"
fresh; edit_json "$tmp/m/tokenizer.json" \
  'j["post_processor"] = {"type": "BertProcessing", "sep": ["<|im_end|>", 1000000005], "cls": ["<|im_start|>", 1]}'
expect_fail tokenizer-special-id-huge "post_processor.sep[1]': special token '<|im_end|>' has id 1000000005" \
  timeout 60 $gz tokenize --model "$tmp/m" --special <<<"the end"

# max_position_embeddings: an integer in [1, 2^24].
fresh; edit_json "$tmp/m/config.json" 'j["max_position_embeddings"] = 10**18'
expect_error context-huge 'field "max_position_embeddings": must be in [1, 16777216], got 1000000000000000000' \
  $gz run --model "$tmp/m" --prompt "In the beginning" --max-tokens 4
# The largest context the config may declare is not what a run allocates: --max-tokens past the
# memory of the machine (131 GB of KV pages; checked where memory and swap hold under 100 GB)
# fails to allocate its KV pages, naming the context.
if [ "$(awk '/^(MemTotal|SwapTotal):/ {s += $2} END {print s}' /proc/meminfo)" -lt 100000000 ]; then
  fresh; edit_json "$tmp/m/config.json" 'j["max_position_embeddings"] = 16777216'
  expect_error context-too-long-for-memory "KV pages for a context of 16000001 positions" \
    $gz run --model "$tmp/m" --device cpu --prompt "hi" --max-tokens 16000000
fi
fresh; edit_json "$tmp/m/config.json" 'j["max_position_embeddings"] = 1e18'
expect_fail context-huge-float "max_position_embeddings" $gz info --model "$tmp/m"
fresh; edit_json "$tmp/m/config.json" 'j["max_position_embeddings"] = -4096'
expect_fail context-negative "max_position_embeddings" $gz info --model "$tmp/m"
fresh; edit_json "$tmp/m/config.json" 'j["max_position_embeddings"] = 2048.5'
expect_fail context-fraction "max_position_embeddings" $gz info --model "$tmp/m"

# poison_tensor NAME [shape]: tiny-chat's weights, copied, with element 5 of tensor NAME set to a
# bf16 NaN, or with "shape", NAME's shape reversed (the same bytes).
poison_tensor() {
  rm -f "$tmp/m/model.safetensors"
  python3 - "$src/model.safetensors" "$tmp/m/model.safetensors" "$1" "${2:-}" <<'PY'
import json, struct, sys
source, path, name, how = sys.argv[1:5]
data = bytearray(open(source, "rb").read())
n = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + n])
t = header[name]
begin, end = (8 + n + o for o in t["data_offsets"])
if how == "shape":
    t["shape"] = t["shape"][::-1]
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (n - len(text))
    assert len(text) == n
    data[8:8 + n] = text
else:
    data[begin + 10:begin + 12] = b"\xc0\x7f"
open(path, "wb").write(data)
PY
}

# A tensor of the right size but the wrong shape: load and convert refuse it with one message.
shape_error="tensor model.layers.0.self_attn.k_proj.weight has shape [384, 128], expected [128, 384]"
fresh; poison_tensor model.layers.0.self_attn.k_proj.weight shape
expect_fail wrong-shape-load "$shape_error" $gz logits --model "$tmp/m" --ids 1 --out "$tmp/x.npy"
expect_fail wrong-shape-convert "$shape_error" $gz convert --from "$tmp/m" --to "$tmp/shape-q8" --bits 8

# Non-finite weights: a norm (read whole at load) is refused at load and by convert, naming it.
fresh; poison_tensor model.layers.3.post_attention_layernorm.weight
expect_fail nan-norm-load "model.layers.3.post_attention_layernorm.weight holds NaN at element 5" \
  $gz logits --model "$tmp/m" --ids 1,2 --out "$tmp/x.npy"
expect_fail nan-norm-convert "model.layers.3.post_attention_layernorm.weight holds NaN at element 5" \
  $gz convert --from "$tmp/m" --to "$tmp/nan-q8" --bits 8
check nan-norm-convert-no-output test ! -e "$tmp/nan-q8"
# A linear (not scanned at load): convert refuses it.
fresh; poison_tensor model.layers.2.mlp.down_proj.weight
expect_fail nan-linear-convert "model.layers.2.mlp.down_proj.weight holds NaN at element 5 (row 0, column 5)" \
  $gz convert --from "$tmp/m" --to "$tmp/nan-q8" --bits 8

# The same linear at run time: the commands that run the model stop at the first non-finite
# logits with an error, not text or a perplexity of nan.
fresh; poison_tensor model.layers.2.mlp.down_proj.weight
expect_error nan-linear-run "hold NaN or infinity" \
  $gz run --model "$tmp/m" --prompt "In the beginning" --max-tokens 4
expect_error nan-linear-run-greedy "non-finite values" \
  $gz run --model "$tmp/m" --prompt "In the beginning" --max-tokens 4 --greedy
expect_fail nan-linear-logits "hold NaN or infinity" \
  $gz logits --model "$tmp/m" --ids 1,2,3 --out "$tmp/x.npy"
head -n 2 "$src/heldout.jsonl" >"$tmp/texts.jsonl"
expect_error nan-linear-perplexity "hold NaN or infinity" \
  $gz perplexity --model "$tmp/m" --file "$tmp/texts.jsonl" --max-tokens 32
expect_error nan-linear-chat "hold NaN or infinity" \
  $gz chat --model "$tmp/m" --max-tokens 4 <<<"hello"
expect_error nan-linear-bench "hold NaN or infinity" \
  $gz bench --model "$tmp/m" --requests 2 --prompt-tokens 8 --output-tokens 4 --json

expect_fail id-out-of-range "8192" $gz logits --ids 1,8192 --out "$tmp/x.npy"
expect_fail id-not-a-number "--ids" $gz logits --ids 1,x --out "$tmp/x.npy"
expect_fail bad-device "--device" $gz logits --device tpu --ids 1 --out "$tmp/x.npy"
expect_fail unwritable-output "$tmp/none/x.npy" $gz logits --ids 1 --out "$tmp/none/x.npy"

# A chat template of a loop inside a loop of 100,000 each fails within its work bound.
fresh; printf '%s' '{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}' \
  >"$tmp/m/chat_template.jinja"
expect_fail template-work-bound "bound of 2000000 steps" bash -c \
  "echo '{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}' | timeout 60 $gz template --model $tmp/m"

finish
