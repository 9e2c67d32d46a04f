#!/usr/bin/env bash
# Builds gizllm and runs the whole test suite (unit, golden, e2e) with ctest, then the parsers of
# outside input again under ASan and UBSan with their fuzz corpora (build-fuzz/, docs/FUZZING.md).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
(cd build && ctest --output-on-failure -j "$(nproc)" --timeout 900)
scripts/fuzz.sh test
