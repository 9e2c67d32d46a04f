#!/usr/bin/env bash
# Runs a fuzz harness once over each file of its corpus (no fuzzing): replay.sh HARNESS DIR.
# Files named crash-*, timeout-*, oom-* or slow-unit-* reproduce open bugs and are left out.
set -euo pipefail
harness=$1
dir=$2
files=()
for f in "$dir"/*; do
  case "$(basename "$f")" in
    crash-* | timeout-* | oom-* | slow-unit-*) ;;
    *) files+=("$f") ;;
  esac
done
if ((${#files[@]} == 0)); then
  echo "replay: no corpus in $dir" >&2
  exit 1
fi
# Given files, libFuzzer runs each once; ASan and UBSan stop at the first error.
exec "$harness" -timeout=30 -rss_limit_mb=2048 "${files[@]}"
