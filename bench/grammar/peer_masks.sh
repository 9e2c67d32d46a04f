#!/usr/bin/env bash
# Builds llama_grammar_peer.cpp against a CPU build of llama.cpp (../shared/peer's build.sh DIR:
# DIR/llama.cpp, DIR/build/bin), then times llama.cpp's grammar masks over grammar_bench's
# walks (`grammar_bench --dump-walks WALKS`). The program goes to $PEER_BIN (default
# build/llama_grammar_peer). Not part of gizllm's build.
#   bench/grammar/peer_masks.sh DIR VOCAB.gguf WALKS.jsonl [[--schemas] DIR | --grammar FILE]
# VOCAB.gguf: the tokenizer grammar_bench ran with, as a GGUF llama.cpp loads vocab-only
# (bench/grammar/vocab_gguf.py TOKENIZER.json OUT.gguf). Default: --schemas tests/grammar/schemas.
set -euo pipefail
D=$1 GGUF=$2 WALKS=$3
shift 3
[ $# -gt 0 ] || set -- tests/grammar/schemas
case $1 in --*) ;; *) set -- --schemas "$1" ;; esac  # a bare folder: the schemas
L=$D/llama.cpp B=$D/build/bin
src=$(dirname "$0")/llama_grammar_peer.cpp
out=${PEER_BIN:-build/llama_grammar_peer}
mkdir -p "$(dirname "$out")"
if [ ! -x "$out" ] || [ "$src" -nt "$out" ]; then
  nice -n 10 g++ -O2 -std=c++17 "$src" -o "$out" -I "$L/include" -I "$L/common" -I "$L/ggml/include" \
    -I "$L/vendor" -L "$B" -lllama-common -lllama -lggml -lggml-base -Wl,-rpath,"$B"
fi
"$out" --model "$GGUF" --walks "$WALKS" "$@"
