#!/usr/bin/env bash
# Runs a fuzz harness once over each file of its corpus (no fuzzing): replay.sh HARNESS NAME,
# the corpus being tests/fuzz/corpus/NAME.tar.gz (tests/fuzz/corpus.sh). Files named crash-*,
# timeout-*, oom-* or slow-unit-* reproduce open bugs and are left out.
set -euo pipefail
harness=$1
name=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$(dirname "$0")/corpus.sh" unpack "$name" "$dir" --seeds
files=("$dir"/*)
if [ ! -e "${files[0]}" ]; then
  echo "replay: no corpus for $name" >&2
  exit 1
fi
# Given files, libFuzzer runs each once; ASan and UBSan stop at the first error.
"$harness" -timeout=30 -rss_limit_mb=2048 "${files[@]}"
