#!/usr/bin/env bash
# A mixture-of-experts model (Qwen3-30B-A3B shape) or a hybrid (Qwen3.5-35B-A3B shape), cut to 8
# layers, end to end on the GPU machine: `gizllm bench` beside llama.cpp's llama-bench and
# llama-batched-bench on the same random weights (tools/make_random_hf.py, its bf16 GGUF from the
# peer's converter), in the same lease.
#
#   bench/cuda/moe_peer.sh moe|hybrid GIZLLM PEER_DIR TOKENIZER_DIR OUT_DIR [BITS]
#
# BITS 4: both engines at 4 bits from the same weights: gizllm's `convert --bits 4/8` (timed, its
# peak memory kept) against llama.cpp's Q4_K_M (llama-quantize of the bf16 GGUF); default 16: the
# bf16 weights in both.
#
# PEER_DIR holds ../shared/peer's build.sh and llama.cpp.tar.xz (carried); the peer is built into
# /tmp/llama.cpp once per machine, beside the first model's writing. Workloads: batch 1 (16-token
# prompt, 256 new | tg256), 64 sequences (64-token prompts, 128 new | batched-bench -npp 64 -ntg
# 128 -npl 64), one prompt's first token (2,048 tokens for the MoE model, 8,192 for the hybrid |
# pp2048 / pp8192). The raw outputs go to OUT_DIR/moe or OUT_DIR/hybrid.
set -uo pipefail
which=$1 G=$2 PEER=$3 TOK=$4 OUT_DIR=$5 BITS=${6:-16}
R=$OUT_DIR/$which$([ $BITS = 16 ] || echo -q$BITS); mkdir -p $R
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
# Runs a command; its peak resident memory (KiB) goes to the file $1.
peak_rss() { local f=$1; shift
  python3 -c 'import resource, subprocess, sys
rc = subprocess.run(sys.argv[2:]).returncode
open(sys.argv[1], "w").write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
sys.exit(rc)' "$f" "$@"; }
if [ ! -x /tmp/llama.cpp/build/bin/llama-bench ] && [ ! -f /tmp/llama_building ]; then
  touch /tmp/llama_building
  ( bash $PEER/build.sh /tmp/llama.cpp > $OUT_DIR/llama_build.txt 2>&1; echo $? > /tmp/llama_built ) &
fi
M=/tmp/$which
rm -rf /tmp/moe.gguf /tmp/hybrid.gguf
if [ -f $M/config.json ]; then echo "model kept" > $R/make.txt
elif [ $which = moe ]; then
  python3 tools/make_random_hf.py --out $M --tokenizer $TOK --layers 8 --hidden 2048 \
    --experts 128 --moe-ffn 768 --experts-per-token 8 --heads 32 --kv-heads 4 > $R/make.txt 2>&1
else
  python3 tools/make_random_hf.py --out $M --tokenizer $TOK --layers 8 --hybrid > $R/make.txt 2>&1
fi
t "made: $(tail -1 $R/make.txt)"
while [ ! -f /tmp/llama.cpp/llama.cpp/convert_hf_to_gguf.py ]; do sleep 1; done
( PYTHONPATH=/tmp/llama.cpp/llama.cpp/gguf-py timeout 300 python3 /tmp/llama.cpp/llama.cpp/convert_hf_to_gguf.py $M \
    --outtype bf16 --outfile $M.gguf $([ $which = hybrid ] && echo --no-mtp) > $R/convert.txt 2>&1; echo $? > $R/convert.rc ) &
conv=$!
$G info --model $M > $R/info.txt 2>&1; t "info rc=$? $(grep -i -m3 'param\|layers\|expert' $R/info.txt | tr '\n' ' ')"
GM=$M GGUF=$M.gguf
if [ $BITS = 4 ]; then
  GM=$M-q4; rm -rf $GM
  peak_rss $R/g-convert.rss $G convert --from $M --to $GM --bits 4/8 > $R/g-convert.txt 2> $R/g-convert.err
  t "gizllm convert 4/8 rc=$? $(grep -E 'wrote' $R/g-convert.txt) peak RSS $(cat $R/g-convert.rss) KiB"
fi
wait $conv; t "convert rc=$(cat $R/convert.rc) $(ls -la $M.gguf 2>/dev/null | awk '{print $5}')"; tail -2 $R/convert.txt
while [ ! -f /tmp/llama_built ]; do sleep 2; done; t "llama built rc=$(cat /tmp/llama_built)"
if [ $BITS = 4 ]; then
  GGUF=$M-q4km.gguf
  /tmp/llama.cpp/build/bin/llama-quantize $M.gguf $GGUF Q4_K_M $(nproc) > $R/l-quantize.txt 2>&1
  t "llama-quantize Q4_K_M rc=$? $(ls -la $GGUF 2>/dev/null | awk '{print $5}')"; rm -f $M.gguf
fi
run() { local name=$1; shift
  timeout 150 $G bench --model $GM --device cuda --json --draft none "$@" > $R/g-$name.json 2> $R/g-$name.err
  t "g-$name rc=$? $(python3 -c 'import json,sys; d=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); print("tok/s %.1f ttft p50 %.1f itl p50 %.2f p99 %.2f" % (d["output_tokens_per_s"], d["ttft_p50_ms"], d["itl_p50_ms"], d["itl_p99_ms"]))' $R/g-$name.json 2>&1 | tail -1)"; }
run b1 -n 4 -c 1 -p 16 -o 256
run c64 -n 64 -c 64 -p 64 -o 128
if [ $which = moe ]; then run ttft -n 4 -c 1 -p 2048 -o 2 --rows 2048; P=2048
else run ttft -n 2 -c 1 -p 8192 -o 2 --rows 2048; P=8192; fi
B=/tmp/llama.cpp/build/bin
timeout 200 $B/llama-bench -m $GGUF -ngl 99 -fa 1 -p $P -n 256 -r 3 -o md > $R/l-bench.md 2>&1; t "llama-bench rc=$?"
grep -E "pp$P|tg256" $R/l-bench.md; tail -2 $R/l-bench.md | head -1
timeout 200 $B/llama-batched-bench -m $GGUF -ngl 99 -fa on -c 20000 -b 2048 -ub 512 -npp 64 -ntg 128 -npl 64 > $R/l-batched.txt 2>&1; t "batched rc=$?"
grep -E "^\|\s+[0-9]" $R/l-batched.txt; tail -2 $R/l-batched.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
rm -f $M.gguf $M-q4km.gguf
t done
