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

fresh; sed -i 's/"hidden_size": 384/"hidden_size": "wide"/' "$tmp/m/config.json"
expect_fail config-wrong-type "hidden_size" $gz info --model "$tmp/m"

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
