#!/bin/sh
# Load benchmark of `gizllm serve` on tiny-chat against `gizllm bench` offline; prints a table.
#   bench/server/load.sh [build/gizllm] [load.mjs options: --clients 1,16,64,256 --window 30 ...]
# Run it on an idle machine from the repository root; see bench/server/load.mjs for what it
# measures and how.
set -e
cd "$(dirname "$0")/../.."
case "$1" in
  --*|"") ;;
  *) GIZLLM="$(realpath "$1")"; export GIZLLM; shift ;;
esac
: "${GIZLLM:=$(pwd)/build/gizllm}"
export GIZLLM
echo "gizllm: $GIZLLM (commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'))"
echo "before: $(uptime)"
node bench/server/load.mjs "$@"
echo "after: $(uptime)"
