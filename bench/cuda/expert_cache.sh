#!/usr/bin/env bash
# The expert cache on the GPU machine: a random Qwen3-30B-A3B-shaped model (hidden 2048, 128
# experts of 768, top 8, 32 query and 4 kv heads of 128, vocab 151936; LAYERS layers, 12 by
# default: 14.5 GB of experts) written by tools/make_random_hf.py with its router skewed
# (--router-zipf S for each S of ZIPF), then `gizllm bench --json` with every expert on the device
# and with the cache at a quarter of the experts (--expert-cache), at 1 and 8 concurrent
# sequences (128-token random prompts, 128 tokens each).
#
#   bench/cuda/expert_cache.sh GIZLLM [OUT_DIR]    # OUT_DIR: $OUT, else /tmp/out
#   LAYERS=12 ZIPF="0 0.5 1" bench/cuda/expert_cache.sh build/gizllm
#
# Writes OUT_DIR/expert_cache.jsonl: a line per run, bench's JSON object (output_tokens_per_s,
# expert_cache: slots, hits, misses, hit_rate, read_ms over the timed run) with "zipf" and
# "cache" ("resident" or "quarter") added. The folder is written once per skew and read from the
# host page cache afterwards (the machine's memory holds it).
set -euo pipefail
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64
gizllm=$(realpath "$1")
out=${2:-${OUT:-/tmp/out}}
layers=${LAYERS:-12}
mkdir -p "$out"
log=$out/expert_cache.jsonl
: >"$log"
quarter=$((layers * 128 / 4))
for zipf in ${ZIPF:-0 0.5 1}; do
  model=/tmp/expert-cache-a3b-$layers-$zipf
  [ -f "$model/config.json" ] ||
    timeout 900 python3 tools/make_random_hf.py --out "$model" --tokenizer models/tiny-chat \
      --layers "$layers" --hidden 2048 --heads 32 --kv-heads 4 --head-dim 128 \
      --experts 128 --moe-ffn 768 --experts-per-token 8 --router-zipf "$zipf" \
      >"$out/make-$zipf.log" 2>&1 || { echo "make failed"; tail -5 "$out/make-$zipf.log"; exit 1; }
  for cache in resident quarter; do
    flag=()
    [ "$cache" = quarter ] && flag=(--expert-cache "$quarter")
    for c in 1 8; do
      timeout 300 "$gizllm" bench -m "$model" --device cuda ${flag[@]+"${flag[@]}"} --requests $((2 * c)) \
        --concurrency "$c" --prompt-tokens 128 --output-tokens 128 --json \
        2>"$out/bench-$zipf-$cache-$c.err" |
        python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    r["zipf"], r["cache"] = float(sys.argv[1]), sys.argv[2]
    print(json.dumps(r), flush=True)
    e = r["expert_cache"]
    print("zipf %s %-8s c=%d: %.1f tokens/s, hit rate %.3f, %d misses, %.0f ms reading" % (
        sys.argv[1], sys.argv[2], r["concurrency"], r["output_tokens_per_s"], e["hit_rate"],
        e["misses"], e["read_ms"]), file=sys.stderr)' \
          "$zipf" "$cache" >>"$log" ||
        { echo "bench failed"; tail -5 "$out/bench-$zipf-$cache-$c.err"; }
    done
  done
done
