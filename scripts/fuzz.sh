#!/usr/bin/env bash
# The parsers of outside input under ASan/UBSan and libFuzzer, in build-fuzz/ (docs/FUZZING.md).
#
#   scripts/fuzz.sh build                 configures (clang, GIZLLM_FUZZ) and builds build-fuzz/
#   scripts/fuzz.sh test                  builds, then runs its ctest: the parsers' unit tests and
#                                         each harness once over its corpus (what CI runs)
#   scripts/fuzz.sh run NAME [SECONDS] [libFuzzer flags]
#                                         fuzzes harness NAME (default 600 s) from its corpus;
#                                         new inputs go to build-fuzz/corpus/NAME, crashes to
#                                         build-fuzz/artifacts/NAME/
#   scripts/fuzz.sh merge NAME            adds to tests/fuzz/corpus/NAME.tar.gz the inputs of
#                                         build-fuzz/corpus/NAME that reach new code (-merge=1)
#
# Harnesses: safetensors gguf config bitgpu_manifest tokenizer template chat_request http_request.
set -euo pipefail
cd "$(dirname "$0")/.."

# Longest input each harness is given: its seeds' size and a little more.
max_len() {
  case "$1" in
    tokenizer | bitgpu_manifest) echo 16384 ;;
    template) echo 8192 ;;
    *) echo 4096 ;;
  esac
}

# Copies the corpus of tests/fuzz/corpus/$1.tar.gz into $2, but for the reproducers of open
# bugs (crash-*, timeout-*, oom-*, slow-unit-*), which stay out of fuzzing as out of the replay.
copy_seeds() {
  tests/fuzz/corpus.sh unpack "$1" "$2" --seeds
}

build() {
  if [ ! -f build-fuzz/build.ninja ]; then
    CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DGIZLLM_FUZZ=ON >/dev/null
  fi
  cmake --build build-fuzz -j "$(nproc)"
}

command=${1:-test}
case "$command" in
  build) build ;;
  test)
    build
    cd build-fuzz
    ctest --output-on-failure -j "$(nproc)" --timeout 900
    ;;
  run)
    name=$2
    seconds=${3:-600}
    shift $(($# < 3 ? $# : 3))
    build
    copy_seeds "$name" "build-fuzz/corpus/$name"
    mkdir -p "build-fuzz/artifacts/$name"
    exec "build-fuzz/tests/fuzz/${name}_fuzz" "build-fuzz/corpus/$name" \
      -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len="$(max_len "$name")" \
      -artifact_prefix="build-fuzz/artifacts/$name/" -print_final_stats=1 "$@"
    ;;
  merge)
    name=$2
    build
    # Into a fresh copy of the seeds, so that only what reaches new code is added; edges alone
    # (no hit counts), which keeps the committed corpus small.
    rm -rf "build-fuzz/merge/$name"
    copy_seeds "$name" "build-fuzz/merge/$name"
    "build-fuzz/tests/fuzz/${name}_fuzz" -merge=1 -use_counters=0 -timeout=10 -rss_limit_mb=2048 \
      -max_len="$(max_len "$name")" "build-fuzz/merge/$name" "build-fuzz/corpus/$name"
    tests/fuzz/corpus.sh add "$name" "build-fuzz/merge/$name"/*
    ;;
  *)
    echo "usage: scripts/fuzz.sh build | test | run NAME [SECONDS] [flags] | merge NAME" >&2
    exit 2
    ;;
esac
