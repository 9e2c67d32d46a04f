#!/usr/bin/env bash
# Builds gizllm and runs the whole test suite (unit, golden, e2e) with ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
cd build
ctest --output-on-failure -j "$(nproc)" --timeout 900
