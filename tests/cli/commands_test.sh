#!/usr/bin/env bash
# The commands on the shipped model: outputs of the right shape and content.
source "$(dirname "$0")/lib.sh"
gz=$1

expect_ok logits $gz logits --ids 1,2,3,4,5 --out "$tmp/l.npy"
# 5 x 8192 float32 after a 128-byte header.
check logits-size test "$(stat -c %s "$tmp/l.npy")" -eq $((128 + 5 * 8192 * 4))
check logits-header grep -q "'shape': (5, 8192)" "$tmp/l.npy"

expect_ok info $gz info --tensors
check info-family grep -q "family       qwen3" "$tmp/out"
check info-parameters grep -qE "parameters   16\.[0-9]+ M" "$tmp/out"
check info-tensor grep -q "model.layers.7.mlp.down_proj.weight" "$tmp/out"

# A converted folder (4-bit layers, 8-bit head) loads and generates.
expect_ok convert $gz convert --from models/tiny-chat --to "$tmp/q4" --bits 4/8
expect_ok info-converted $gz info --model "$tmp/q4"
check info-converted-q4 grep -qE "format +q4 +56 tensors" "$tmp/out"
expect_ok run-converted $gz run --model "$tmp/q4" --prompt "In the beginning God created" --greedy --max-tokens 8
check run-converted-text grep -q "his own" "$tmp/out"
# --int8 (int8 activations, AVX-512 VNNI): the same greedy text where the CPU has VNNI, else one
# line that names the flag and what the CPU lacks.
if grep -qw avx512_vnni /proc/cpuinfo; then
  expect_ok run-converted-int8 $gz run --model "$tmp/q4" --int8 --prompt "In the beginning God created" --greedy --max-tokens 8
  check run-converted-int8-text grep -q "his own" "$tmp/out"
else
  expect_fail run-converted-int8-refused "avx512_vnni" \
    $gz run --model "$tmp/q4" --int8 --prompt "In the beginning God created" --greedy --max-tokens 8
fi

# A cut model (the first 2 layers, no final norm or head) loads with the layers its header says.
# gizllm's blocks (b4 layers, v_proj and head b8): loads and generates the same start.
expect_ok convert-blocks $gz convert --from models/tiny-chat --to "$tmp/b4" --bits b4/b8
check convert-blocks-summary grep -q "57 linears quantized (b4/b8 bits)" "$tmp/err"
expect_ok info-blocks $gz info --model "$tmp/b4"
check info-blocks-gz4 grep -qE "format +GZ4 +48 tensors" "$tmp/out"
check info-blocks-gz8 grep -qE "format +GZ8 +9 tensors" "$tmp/out"
expect_ok run-blocks $gz run --model "$tmp/b4" --prompt "In the beginning God created" --greedy --max-tokens 8
check run-blocks-text grep -q "his own" "$tmp/out"
expect_fail convert-blocks-mixed "do not mix" \
  $gz convert --from models/tiny-chat --to "$tmp/b4m" --bits b4/8
expect_ok convert-cut $gz convert --from models/tiny-chat --to "$tmp/cut2" --bits 8 --layers 2
expect_ok info-cut $gz info --model "$tmp/cut2" --tensors
check info-cut-layers grep -qE "layers +2" "$tmp/out"
check info-cut-no-layer-2 bash -c "! grep -q 'model.layers.2\.' '$tmp/out'"
expect_ok logits-cut $gz logits --model "$tmp/cut2" --ids 1,2,3 --out "$tmp/cut.npy"

# The same with GPTQ on a calibration file: every linear (56 and the 8-bit head) by GPTQ.
for i in 1 2 3 4 5 6; do
  echo '{"text": "In the beginning God created the heaven and the earth. And the earth was without form, and void; and darkness was upon the face of the deep."}'
done >"$tmp/calib.jsonl"
expect_ok convert-gptq $gz convert --from models/tiny-chat --to "$tmp/q4g" --bits 4/8 \
  --calibration "$tmp/calib.jsonl" --calibration-rows 256
check convert-gptq-count grep -q "57 by GPTQ" "$tmp/err"
expect_ok run-gptq $gz run --model "$tmp/q4g" --prompt "In the beginning God created" --greedy --max-tokens 8
expect_fail convert-calibration-missing "missing.jsonl" \
  $gz convert --from models/tiny-chat --to "$tmp/q4m" --calibration "$tmp/missing.jsonl"

if $gz --help | grep -q " run "; then
  expect_ok run-greedy $gz run --prompt "In the beginning God created" --greedy --max-tokens 12
  check run-greedy-text grep -q "his own righteousness" "$tmp/out"
  check run-stats grep -q "decode tokens/s\|tokens/s" "$tmp/err"
  $gz run --prompt "Tell me a fortune." --seed 7 --temperature 1 --max-tokens 20 >"$tmp/a" 2>/dev/null
  $gz run --prompt "Tell me a fortune." --seed 7 --temperature 1 --max-tokens 20 >"$tmp/b" 2>/dev/null
  check run-seed-repeats cmp -s "$tmp/a" "$tmp/b"
  echo "In the beginning" | $gz run --greedy --max-tokens 4 >"$tmp/c" 2>/dev/null
  check run-stdin test -s "$tmp/c"
  # Pipeline stages on the CPU: the same greedy text as one model, in float32; flags checked.
  $gz run --device cpu --exact --prompt "In the beginning God created" --greedy --max-tokens 16 \
    >"$tmp/whole" 2>/dev/null
  expect_ok run-pipeline $gz run --device cpu --exact --pipeline 3 \
    --prompt "In the beginning God created" --greedy --max-tokens 16
  check run-pipeline-text cmp -s "$tmp/out" "$tmp/whole"
  check run-pipeline-stages grep -q "in 3 stages: layers 0-2 on cpu" "$tmp/err"
  expect_fail run-pipeline-too-many "more stages than the 8 layers" \
    $gz run --device cpu --pipeline 9 --prompt "x" --max-tokens 2
  expect_fail run-gpus-on-cpu "--gpus: there is no GPU" \
    $gz run --device cpu --gpus 0,1 --prompt "x" --max-tokens 2
  expect_fail run-gpus-bad "expected GPU indices" $gz run --gpus 0,x --prompt "x" --max-tokens 2
fi

# The streamed text's last line ends before the figures on stderr, also through a pipe.
$gz run --greedy --prompt "The LORD is my shepherd;" --max-tokens 12 >"$tmp/both" 2>&1
check run-figures-on-their-own-line grep -q "^prompt: " "$tmp/both"


# --kv auto fits the sequences' whole contexts into the KV memory: the device's default where
# they fit, else the widest format above 4 bits where all do, else the first at 4 bits or fewer
# where one does; a format asked for stays.
kv_of() { python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])["kv"])' "$tmp/out"; }
for want in "64 f32" "8 8" "3 8/4" "1 8/2"; do
  set -- $want
  expect_ok bench-kv-auto-$1mib $gz bench --requests 4 --concurrency 4 --prompt-tokens 512 \
    --output-tokens 16 --kv-mib $1 --json
  check bench-kv-auto-$1mib-is-$2 test "$(kv_of)" = "$2"
done
expect_ok bench-kv-asked $gz bench --requests 4 --concurrency 4 --prompt-tokens 64 \
  --output-tokens 16 --kv-mib 1 --kv 16 --json
check bench-kv-asked-stays test "$(kv_of)" = f16
# Two pipeline stages on the CPU fit their pages (the stages' together) as one model does.
expect_ok bench-pipeline-kv-auto $gz bench --device cpu --pipeline 2 --requests 4 --concurrency 4 \
  --prompt-tokens 512 --output-tokens 16 --kv-mib 8 --json
check bench-pipeline-kv-auto-is-8 test "$(kv_of)" = 8
check bench-pipeline-backend grep -q '"backend":"2 stages: layers 0-3 on cpu' "$tmp/out"

# Per-op times: every step of the trace names its ops, and the totals cover matmul and attention.
expect_ok bench-trace-ops $gz bench --requests 2 --prompt-tokens 20 --output-tokens 4 \
  --trace-ops --trace "$tmp/ops.jsonl" --json
check bench-trace-ops-json python3 -c '
import json, sys
d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
ops = d["ops"]
assert ops["matmul"]["calls"] > 0 and ops["attention"]["ms"] > 0, ops
assert abs(sum(o["share"] for o in ops.values()) - 1) < 1e-6, ops
steps = [json.loads(l) for l in open(sys.argv[2])]
assert all("matmul" in s["ops"] for s in steps), steps[0]
' "$tmp/out" "$tmp/ops.jsonl"

# Constrained requests: every answer follows the schema (its masks computed beside the steps and
# applied where the backend picks the tokens), ends where its JSON is complete or at the token
# limit; a bad schema names the file.
cat > "$tmp/schema.json" <<'SCHEMA'
{"type": "object", "properties": {"n": {"type": "integer"}, "tag": {"enum": ["a", "b"]}},
 "required": ["n", "tag"]}
SCHEMA
expect_ok bench-json-schema $gz bench --requests 6 --concurrency 3 --prompt-tokens 12 \
  --output-tokens 40 --json-schema "$tmp/schema.json" --json
check bench-json-schema-masks python3 -c '
import json, sys
d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
assert d["grammar_masks_beside_step"] >= d["generated_tokens"] > 0, d
assert d["grammar_masks_on_device"] == d["grammar_masks_beside_step"], d  # picked by the backend
' "$tmp/out"
echo '{"type": "object", "patternProperties": {"a": {}}}' > "$tmp/bad_schema.json"
expect_fail bench-json-schema-bad "bad_schema.json" $gz bench --requests 1 --prompt-tokens 4 \
  --output-tokens 2 --json-schema "$tmp/bad_schema.json" --json
# A regex holds the whole answer; what it cannot express is refused with its position.
expect_ok run-regex $gz run --model models/tiny-chat --prompt "Phone:" --seed 1 --max-tokens 40 \
  --regex '\(\d{3}\) \d{3}-\d{4}'
check run-regex-text grep -qxE '\([0-9]{3}\) [0-9]{3}-[0-9]{4}' "$tmp/out"
expect_error run-regex-bad "position 1: a lookaround" $gz run --model models/tiny-chat --prompt "x" \
  --regex 'a(?=b)'

# The KL divergence a KV format costs: the same model with float32 pages as the base. Float16
# pages stay far closer to it than 8-bit ones, each of the rotated formats costs more as it has
# fewer bits, and none is zero (the rounding happens).
head -n 8 models/tiny-chat/heldout.jsonl > "$tmp/held.jsonl"
for kv in f16 8 8/4 4 2; do
  name=${kv/\//-}
  expect_ok perplexity-kv-$name $gz perplexity --exact --kv $kv --base-kv f32 \
    -f "$tmp/held.jsonl" --max-tokens 128
  grep -oE "^kl +[0-9.e-]+" "$tmp/out" | awk '{print $2}' > "$tmp/kl-$name"
done
check perplexity-kv-order python3 -c '
import sys
f16, k8, k84, k4, k2 = (float(open(p).read()) for p in sys.argv[1:])
assert 0 < f16 < k8 / 20 and k8 < 0.01, (f16, k8)
assert k8 < k84 < k4 < k2, (k8, k84, k4, k2)
' "$tmp/kl-f16" "$tmp/kl-8" "$tmp/kl-8-4" "$tmp/kl-4" "$tmp/kl-2"
# --skip: each window's first positions are context only (llama-perplexity scores the second
# half of each window): fewer positions scored, each with more context before it.
expect_ok perplexity-all $gz perplexity -f "$tmp/held.jsonl" --max-tokens 128 --window 64
grep -oE "^tokens +[0-9]+" "$tmp/out" | awk '{print $2}' > "$tmp/tokens-all"
expect_ok perplexity-skip $gz perplexity -f "$tmp/held.jsonl" --max-tokens 128 --window 64 --skip 32
check perplexity-skip-line grep -q "windows of 64 tokens scored from position 32" "$tmp/out"
grep -oE "^tokens +[0-9]+" "$tmp/out" | awk '{print $2}' > "$tmp/tokens-skip"
check perplexity-skip-fewer python3 -c '
import sys
a, s = (int(open(p).read()) for p in sys.argv[1:])
assert 0 < s < a, (a, s)
' "$tmp/tokens-all" "$tmp/tokens-skip"
expect_fail perplexity-bad-skip "skip must be at least 0 and at most window - 2" \
  $gz perplexity -f "$tmp/held.jsonl" --window 64 --skip 63
expect_fail perplexity-bad-base-kv "--base-kv: f8 is not a KV format" \
  $gz perplexity --base-kv f8 -f "$tmp/held.jsonl"

# bench with arrivals, background sequences and a step trace: every request and background
# sequence completes, the trace has a line a step whose rows add up.
expect_ok bench-mixed $gz bench --requests 4 --prompt-tokens 40 --output-tokens 8 --rate 50 \
  --background 3 --background-tokens 24 --trace "$tmp/trace.jsonl" --json
check bench-mixed-json python3 -c '
import json, sys
d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
assert d["generated_tokens"] == 4 * 8 and d["rate"] == 50, d
b = d["background"]
assert b["sequences"] == 3 and b["output_tokens_per_s"] > 0, b
' "$tmp/out"
check bench-mixed-trace python3 -c '
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
accepted = sum(l["accepted"] for l in lines)  # drafts kept: tokens that took no row of their own
assert len(lines) + accepted >= 24, len(lines)
assert all(l["rows"] == l["decode_rows"] + l["prompt_rows"] and l["runner_ms"] > 0 for l in lines)
assert sum(l["prompt_rows"] for l in lines) == 4 * 40 + 3 * 16
assert sum(l["decode_rows"] - l["drafted"] for l in lines) + accepted == 4 * (8 - 1) + 3 * (24 - 1)
assert all(0 <= l["accepted"] <= l["drafted"] for l in lines)
' "$tmp/trace.jsonl"

# Drafts change no text: a passage read again, continued greedily and sampled with a seed, with
# lookup drafts, paced ones and none; bench reports the drafts made and kept.
passage="The cat sat on the mat. The dog sat on the log. The cat sat on the mat. The dog sat on the log. The cat sat"
for d in none lookup auto; do
  $gz run --exact --greedy --draft $d --prompt "$passage" --max-tokens 40 >"$tmp/greedy-$d" 2>/dev/null
  $gz run --exact --seed 5 --temperature 0.8 --draft $d --drafts 4 --prompt "$passage" \
    --max-tokens 40 >"$tmp/sampled-$d" 2>/dev/null
done
check draft-lookup-greedy-same cmp -s "$tmp/greedy-none" "$tmp/greedy-lookup"
check draft-auto-greedy-same cmp -s "$tmp/greedy-none" "$tmp/greedy-auto"
check draft-lookup-sampled-same cmp -s "$tmp/sampled-none" "$tmp/sampled-lookup"
check draft-auto-sampled-same cmp -s "$tmp/sampled-none" "$tmp/sampled-auto"
printf '{"prompt": "%s"}\n' "$passage" > "$tmp/passage.jsonl"
expect_ok bench-draft-lookup $gz bench --prompts "$tmp/passage.jsonl" --requests 2 \
  --concurrency 1 --output-tokens 24 --draft lookup --json
check bench-draft-json python3 -c '
import json, sys
d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
l = d["drafts"]["lookup"]
assert d["draft"] == "lookup" and d["generated_tokens"] == 2 * 24, d
assert l["drafted"] > 0 and 0 <= l["accepted"] <= l["drafted"] and l["steps"] > 0, l
' "$tmp/out"
expect_error draft-mtp-refused "has no MTP layer" $gz run --draft mtp --prompt hi
expect_error draft-dflash-needs-drafter "with --drafter DIR" $gz run --draft dflash --prompt hi
expect_error draft-dflash-other-model "made for another model" $gz run --draft dflash \
  --drafter models/tiny-hybrid/dflash --prompt hi
# A DFlash drafter trained for the shipped tiny hybrid: the same text as without drafts, and
# drafts kept.
$gz run --model models/tiny-hybrid --temperature 0 -n 48 --draft none \
  --prompt "$(printf '<|im_start|>user\nRecite Luke 1:54.<|im_end|>\n<|im_start|>assistant\n')" \
  > "$tmp/dflash-none" 2>/dev/null
$gz run --model models/tiny-hybrid --temperature 0 -n 48 --draft dflash \
  --drafter models/tiny-hybrid/dflash \
  --prompt "$(printf '<|im_start|>user\nRecite Luke 1:54.<|im_end|>\n<|im_start|>assistant\n')" \
  > "$tmp/dflash-block" 2>/dev/null
check draft-dflash-same-text cmp -s "$tmp/dflash-none" "$tmp/dflash-block"
$gz bench --model models/tiny-hybrid -n 2 -c 1 -p 8 -o 24 --draft dflash \
  --drafter models/tiny-hybrid/dflash --json > "$tmp/out" 2>/dev/null
check bench-dflash-json python3 -c '
import json, sys
d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
m = d["drafts"]["dflash"]
assert d["draft"] == "dflash" and d["generated_tokens"] == 2 * 24, d
assert m["drafted"] > 0 and 0 <= m["accepted"] <= m["drafted"] and m["steps"] > 0, m
' "$tmp/out"
expect_error draft-vocab-needs-mtp "only MTP drafts" $gz run --draft-vocab 100 --prompt hi
# MTP drafts on the shipped tiny hybrid, over the first 2,048 token ids (FR-Spec).
$gz bench --model models/tiny-hybrid -n 2 -c 1 -p 8 -o 24 --draft mtp --draft-vocab 2048 --json \
  > "$tmp/out" 2>/dev/null
check bench-mtp-json python3 -c '
import json, sys
d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
m = d["drafts"]["mtp"]
assert d["draft"] == "mtp" and d["generated_tokens"] == 2 * 24, d
assert m["drafted"] > 0 and 0 <= m["accepted"] <= m["drafted"] and m["steps"] > 0, m
' "$tmp/out"
expect_error draft-vocab-range "expected 1 to 8192" $gz run --model models/tiny-hybrid --draft mtp --draft-vocab 9000 --prompt hi
expect_error drafts-out-of-range "--drafts: expected 0 to 16" $gz bench --drafts 17

finish
