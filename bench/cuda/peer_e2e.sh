#!/usr/bin/env bash
# End-to-end serving figures of `gizllm bench` beside llama.cpp's llama-bench and
# llama-batched-bench on the same weights, in the same lease (the GPU machine).
#
#   bench/cuda/peer_e2e.sh prepare PEER_DIR MODEL_DIR   # build llama.cpp, make the model
#   bench/cuda/peer_e2e.sh gizllm GIZLLM MODEL_DIR OUT_DIR      # gizllm's workloads
#   bench/cuda/peer_e2e.sh llama MODEL_DIR OUT_DIR              # llama.cpp's, same workloads
#
# prepare: builds the peer with PEER_DIR/build.sh (a copy of ../shared/peer: build.sh beside
# llama.cpp.tar.xz, carried to the GPU machine) into /tmp/llama.cpp, writes a Qwen3-8B-shaped folder of random bf16 weights (tools/make_random_hf.py,
# Qwen3's tokenizer from TOKENIZER_DIR, default .device/q3tok) to MODEL_DIR, and its bf16 GGUF to
# MODEL_DIR.gguf with the peer's converter. Each run prints one line a workload; the raw output
# goes to OUT_DIR.
#
# The workloads (the serving issue's targets):
#   b1      batch 1: 16-token prompt, 256 new tokens      | llama-bench tg256
#   ttft    one 2,048-token prompt, first token           | llama-bench pp2048
#   c64/c256  64 / 256 sequences, 64-token prompts, 128 new tokens each, output tokens/s with the
#           prompt time counted                           | llama-batched-bench -npp 64 -ntg 128
#   l64/l256  the same with 1,024-token prompts           | llama-batched-bench -npp 1024
#   d32k    batch 1 decode after a 32,768-token prompt    | llama-bench -d 32768 tg128
#   mixed   64 sequences decoding 512 tokens while 2,048-token prompts arrive once a second, and
#           the same 64 alone (gizllm only)
# ONLY="c64 mixed" runs only the gizllm workloads named; SHORT=1 runs only llama.cpp's tg256 and
# its 64 sequences of 64-token prompts.
#
#   bench/cuda/peer_e2e.sh random PEER_DIR RANDOM_GGUF DIR TYPE...   # GGUF files instead
#
# random: builds the peer as prepare does and writes random-weight Qwen3-8B-shaped GGUF files
# DIR/TYPE.gguf (bench/model/random_gguf, Qwen3's tokenizer from TOKENIZER_DIR) of each block
# type (Q4_K with a Q6_K head as llama-quantize's Q4_K_M, Q8_0, Q1_0, ...); then MODEL_DIR may
# name such a file in the gizllm and llama modes.
set -euo pipefail
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64
LLAMA=/tmp/llama.cpp

summary() {  # gizllm bench --json's last line -> one line of figures
  python3 -c '
import json, sys
d = json.loads(sys.stdin.read().strip().splitlines()[-1])
line = "out tok/s %.1f  ttft p50 %.1f p99 %.1f ms  itl p50 %.2f p99 %.2f ms" % (
    d["output_tokens_per_s"], d["ttft_p50_ms"], d["ttft_p99_ms"], d["itl_p50_ms"], d["itl_p99_ms"])
b = d.get("background")
if b: line += "  | background tok/s %.1f itl p50 %.2f p99 %.2f ms" % (
    b["output_tokens_per_s"], b["itl_p50_ms"], b["itl_p99_ms"])
print(line)'
}

case "${1:-}" in
  prepare)
    peer=$2 model=$3
    bash "$peer/build.sh" "$LLAMA" > /tmp/llama-build.txt 2>&1 &
    build=$!
    python3 tools/make_random_hf.py --out "$model" --tokenizer "${TOKENIZER_DIR:-.device/q3tok}" |
      tail -1
    wait $build || { tail -20 /tmp/llama-build.txt; exit 1; }
    PYTHONPATH=$LLAMA/llama.cpp/gguf-py python3 $LLAMA/llama.cpp/convert_hf_to_gguf.py "$model" \
      --outtype bf16 --outfile "$model.gguf" > /tmp/llama-convert.txt 2>&1 ||
      { tail -20 /tmp/llama-convert.txt; exit 1; }
    ls -la "$model.gguf" ;;
  random)
    peer=$2 writer=$3 dir=$4; shift 4
    bash "$peer/build.sh" "$LLAMA" > /tmp/llama-build.txt 2>&1 &
    build=$!
    tok=${TOKENIZER_DIR:-.device/q3tok}
    if [[ -f $tok/tokenizer.json.xz && ! -f $tok/tokenizer.json ]]; then
      xz -dk "$tok/tokenizer.json.xz"
    fi
    mkdir -p "$dir"
    for type in "$@"; do
      "$writer" --out "$dir/$type.gguf" --type "$type" --tokenizer "$tok" 2>&1 | tail -1
    done
    wait $build || { tail -20 /tmp/llama-build.txt; exit 1; } ;;
  gizllm)
    g=$2 model=$3 out=$4; shift 4
    run() {  # name, bench arguments...
      local name=$1; shift
      [[ -z "${ONLY:-}" || " $ONLY " == *" $name "* ]] || return 0
      timeout 240 "$g" bench --model "$model" --device cuda --json "$@" "${EXTRA[@]}" \
        > "$out/gizllm-$name.json" 2> "$out/gizllm-$name.err" || { echo "$name: failed";
        tail -3 "$out/gizllm-$name.err"; return 0; }
      echo "$name: $(summary < "$out/gizllm-$name.json")"
    }
    EXTRA=("$@")
    run b1 -n 4 -c 1 -p 16 -o 256
    run ttft -n 4 -c 1 -p 2048 -o 2 --rows 2048
    run c64 -n 64 -c 64 -p 64 -o 128
    run c256 -n 256 -c 256 -p 64 -o 128
    run l64 -n 64 -c 64 -p 1024 -o 128
    run l256 -n 256 -c 256 -p 1024 -o 128
    run d32k -n 1 -c 1 -p 32768 -o 128 --rows 2048
    run mixed -n 8 -c 4 -p 2048 -o 16 --rate 1 --background 64 --background-tokens 512
    run alone -n 1 -c 1 -p 16 -o 1 --background 64 --background-tokens 512 ;;
  llama)
    model=$2 out=$3 bin=$LLAMA/build/bin
    [[ $model == *.gguf ]] || model=$model.gguf
    if [[ -n "${SHORT:-}" ]]; then
      timeout 240 $bin/llama-bench -m "$model" -ngl 99 -fa 1 -p 0 -n 256 -r 3 -o md \
        > "$out/llama-bench.md" 2>&1 || tail -3 "$out/llama-bench.md"
      grep -E "tg256" "$out/llama-bench.md" || true
      timeout 300 $bin/llama-batched-bench -m "$model" -ngl 99 -fa on -c 20000 -b 2048 \
        -ub 512 -npp 64 -ntg 128 -npl 64 > "$out/llama-batched-64.txt" 2>&1 ||
        tail -3 "$out/llama-batched-64.txt"
      grep -E "^\|\s+[0-9]" "$out/llama-batched-64.txt" || true
      exit 0
    fi
    timeout 240 $bin/llama-bench -m "$model" -ngl 99 -fa 1 -p 2048 -n 256 -r 3 -o md \
      > "$out/llama-bench.md" 2>&1 || tail -3 "$out/llama-bench.md"
    grep -E "pp2048|tg256" "$out/llama-bench.md" || true
    timeout 200 $bin/llama-bench -m "$model" -ngl 99 -fa 1 -p 0 -n 128 -d 32768 -r 2 -o md \
      > "$out/llama-bench-d32k.md" 2>&1 || tail -3 "$out/llama-bench-d32k.md"
    grep -E "tg128" "$out/llama-bench-d32k.md" || true
    for npp in 64 1024; do
      timeout 300 $bin/llama-batched-bench -m "$model" -ngl 99 -fa on -c 300000 -b 2048 \
        -ub 512 -npp $npp -ntg 128 -npl 64,256 > "$out/llama-batched-$npp.txt" 2>&1 ||
        tail -3 "$out/llama-batched-$npp.txt"
      grep -E "^\|\s+[0-9]" "$out/llama-batched-$npp.txt" || true
    done ;;
  *) sed -n 2,33p "$0"; exit 2 ;;
esac
