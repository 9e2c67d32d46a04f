#!/usr/bin/env bash
# Quick start: installs what is missing, builds, and runs the shipped default model on a prompt.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
build/gizllm run --prompt "${1:-In the beginning God created}" --max-tokens 64
