#!/usr/bin/env bash
# What each KV cache format costs in quality, gizllm and llama.cpp side by side: the mean KL
# divergence of the next-token distributions from those over float32 KV (and how often both pick
# the same top token), on tiny-chat's held-out text (bench/RESULTS.md "KV formats against
# llama.cpp's").
#
#   bench/kv_quality.sh GIZLLM LLAMA_BIN [WORK]
#
# GIZLLM: the gizllm binary; LLAMA_BIN: llama.cpp's build/bin (../shared/peer/build.sh DIR builds
# DIR/build/bin; it builds with CUDA wherever nvcc is installed: for a CPU build there, run a copy
# of it whose "cuda=OFF; command -v nvcc ..." line is just cuda=OFF); WORK: a scratch folder
# (default /tmp/kv_quality).
#
# Both engines read the same text and score the same positions: the 300 held-out documents joined
# by blank lines, tokenized whole, cut into windows of CTX tokens (default 1,024), the first CHUNKS
# windows (default 20), each a fresh context, scored on its second half (llama-perplexity's
# way; gizllm perplexity --skip CTX/2): CHUNKS * (CTX/2 - 1) positions. Float32 weights on both
# (gizllm --exact on the Hugging Face folder; llama.cpp a float32 GGUF of it written by
# tests/cli/gguf_from_hf.py --f32), THREADS CPU threads (default 2). gizllm's base is the same
# model over float32 pages (--base-kv f32); llama.cpp's is a first run with -ctk f32 -ctv f32 that
# saves its log-probabilities (--kl-divergence-base), flash attention on in every run (llama.cpp
# needs it for quantized values). The base perplexities of the two engines agree when both read
# the same tokens.
set -euo pipefail
gz=$(realpath "$1")
bin=$(realpath "$2")
work=${3:-/tmp/kv_quality}
ctx=${CTX:-1024}
chunks=${CHUNKS:-20}
threads=${THREADS:-2}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$work"
cd "$root"

python3 - models/tiny-chat/heldout.jsonl "$work" <<'PY'
import json, sys
texts = [json.loads(line)["text"] for line in open(sys.argv[1]) if line.strip()]
joined = "\n\n".join(texts)
open(sys.argv[2] + "/heldout.txt", "w").write(joined)
open(sys.argv[2] + "/heldout-joined.jsonl", "w").write(json.dumps({"text": joined}) + "\n")
PY
python3 tests/cli/gguf_from_hf.py models/tiny-chat "$work/tiny-chat-f32.gguf" --f32

# One table row: engine, KV, bits per stored value (codes and scales), KL, same top, perplexity,
# base perplexity, positions.
row() { printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$@"; }
echo "| engine | KV | bits/value | KL | same top | perplexity | base | positions |"
echo "|---|---|---|---|---|---|---|---|"

for kv in ${GIZLLM_KV:-16 8 8/4 4/8 4 2}; do
  out="$work/gizllm-${kv/\//-}.txt"
  "$gz" perplexity --device cpu -t "$threads" --exact --kv "$kv" --base-kv f32 \
    -f "$work/heldout-joined.jsonl" --max-tokens $((ctx * chunks)) --window "$ctx" \
    --skip $((ctx / 2)) >"$out" 2>/dev/null
  # Bits per value: 16; rotated: codes plus a float32 step and min per group of 32.
  bits=$(python3 -c "
k, _, v = '$kv'.partition('/'); v = v or k
b = lambda x: 16 if x == '16' else int(x) + 2
print((b(k) + b(v)) / 2)")
  row gizllm "$kv" "$bits" "$(awk '/^kl /{print $2}' "$out")" "$(awk '/^same top/{print $3}' "$out")" \
    "$(awk '/^perplexity/{print $2}' "$out")" "$(awk '/^base /{print $2}' "$out")" \
    "$(awk '/^tokens/{print $2}' "$out")"
done

llama() {
  "$bin/llama-perplexity" -m "$work/tiny-chat-f32.gguf" -c "$ctx" -b "$ctx" --chunks "$chunks" \
    -t "$threads" -fa on "$@"
}
llama -f "$work/heldout.txt" -ctk f32 -ctv f32 --kl-divergence-base "$work/base.kld" \
  >"$work/llama-f32.txt" 2>&1
base=$(grep -oE "Final estimate: PPL = [0-9.]+" "$work/llama-f32.txt" | awk '{print $5}')
for t in ${LLAMA_KV:-f16 q8_0 q4_0}; do
  out="$work/llama-$t.txt"
  llama --kl-divergence-base "$work/base.kld" --kl-divergence -ctk "$t" -ctv "$t" >"$out" 2>&1
  bits=$(case $t in f16) echo 16 ;; q8_0) echo 8.5 ;; q4_0) echo 4.5 ;; *) echo "?" ;; esac)
  row llama.cpp "$t" "$bits" "$(awk '/^Mean    KLD:/{print $3}' "$out")" \
    "$(awk '/^Same top p:/{print $4}' "$out")" "$(awk '/^Mean PPL\(Q\) /{print $4; exit}' "$out")" \
    "$base" "$(( chunks * (ctx - 1 - ctx / 2) ))"
done
