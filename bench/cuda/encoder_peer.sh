#!/usr/bin/env bash
# Encoder throughput on the GPU machine: gizllm against sentence-transformers (bf16) on the same
# random BERT-base-shaped folder (tools/encoder_peer.py make), texts of 16, 128 and 512 tokens,
# batches of 32 to 1,024, and torch's bf16 GEMM rate on the model's FFN shape, in one call.
#
#   bench/cuda/encoder_peer.sh GIZLLM [OUT_DIR]    # OUT_DIR: $OUT, else /tmp/out
#
# Writes OUT_DIR/encoder_peer.jsonl: one JSON object a line: the model, the GEMM rate, gizllm's
# `embed --bench` lines (kind "gizllm": random token ids, --device cuda, one warm-up call, then
# at least 0.5 s a case), sentence-transformers' (kind "sentence-transformers", modes encode and
# forward, tools/encoder_peer.py says how), and per length a summary (the best batch of each,
# gizllm's sequences/s over the peer's best, its TFLOP/s over the GEMM rate). Each step has its
# own time limit (60 + 20 + 70 + 85 s: under 4 minutes in all); a step cut short keeps the lines
# it wrote.
set -euo pipefail
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
gizllm=$(realpath "$1")
out=${2:-${OUT:-/tmp/out}}
mkdir -p "$out"
model=/tmp/encoder-peer-bert
log=$out/encoder_peer.jsonl
: >"$log"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader |
  python3 -c 'import json,sys; print(json.dumps({"kind": "gpu", "nvidia_smi": sys.stdin.read().strip()}))' >>"$log"

timeout 60 python3 tools/encoder_peer.py make "$model" >>"$log" 2>"$out/make.err" ||
  { echo "make failed"; tail -5 "$out/make.err"; exit 1; }
timeout 20 python3 tools/encoder_peer.py gemm >>"$log" 2>"$out/gemm.err" || tail -3 "$out/gemm.err"

# gizllm: one process, every length and batch.
timeout 70 "$gizllm" embed -m "$model" --device cuda --bench --bench-tokens 16,128,512 \
  --bench-batch 32,64,128,256,512,1024 --bench-seconds 0.5 2>"$out/gizllm.err" |
  python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    r["kind"] = "gizllm"
    print(json.dumps(r), flush=True)' >>"$log" || { echo "gizllm failed"; tail -5 "$out/gizllm.err"; }

timeout 85 python3 tools/encoder_peer.py st "$model" >>"$log" 2>"$out/st.err" ||
  { echo "sentence-transformers failed"; tail -5 "$out/st.err"; }

python3 tools/encoder_peer.py summary "$log" | tee -a "$log"
