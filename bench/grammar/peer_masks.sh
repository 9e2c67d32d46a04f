#!/usr/bin/env bash
# Builds llama_grammar_peer.cpp against a llama.cpp build (../shared/peer's build.sh, the CPU
# build: DIR/llama.cpp and DIR/build) and runs it over grammar_bench's walks of the schemas.
#   bench/grammar/peer_masks.sh PEER_DIR VOCAB.gguf WALKS.jsonl [SCHEMAS_DIR]
# VOCAB.gguf: a GGUF of the tokenizer grammar_bench ran with (llama.cpp loads its vocabulary
# only); WALKS.jsonl: `grammar_bench --dump-walks`.
set -euo pipefail
D=$1 GGUF=$2 WALKS=$3 SCHEMAS=${4:-tests/grammar/schemas}
L=$D/llama.cpp B=$D/build/bin
out=$D/llama_grammar_peer
g++ -O2 -std=c++17 "$(dirname "$0")/llama_grammar_peer.cpp" -o "$out" -I "$L/include" -I "$L/common" \
  -I "$L/ggml/include" -I "$L/vendor" -L "$B" -lllama-common -lllama -lggml -lggml-base \
  -Wl,-rpath,"$B"
"$out" --model "$GGUF" --schemas "$SCHEMAS" --walks "$WALKS"
