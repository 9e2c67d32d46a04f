#!/usr/bin/env bash
# Quick start: installs what is missing, builds, and runs the shipped default model on a prompt.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
build/gizllm run --prompt "${1:-Recite John 3:16.}" --max-tokens 64
