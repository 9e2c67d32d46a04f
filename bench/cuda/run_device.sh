#!/bin/bash
# Runs on the GPU machine from the repository root: the CUDA op tests, compute-sanitizer on them,
# the benchmark, and the transformers peer. Binaries come prebuilt in .device/.
# Usage: bench/cuda/run_device.sh [tests] [sanitize] [bench] [bench-exact] [peer] [peer-compile]
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
for what in "$@"; do
  echo "=== $what ($(date -u +%H:%M:%S))"
  case $what in
    tests) .device/cuda_backend_test 2>&1 | tee "$OUT/tests.log" | grep -E "OK|FAILED|PASSED|error|Failure|Expected|Which is|rows|heads" ;;
    sanitize) compute-sanitizer --tool memcheck --leak-check no .device/cuda_backend_test \
                --gtest_brief=1 > "$OUT/memcheck.log" 2>&1; tail -5 "$OUT/memcheck.log" ;;
    racecheck) compute-sanitizer --tool racecheck .device/cuda_backend_test \
                --gtest_filter='CudaAttention*' --gtest_brief=1 > "$OUT/racecheck.log" 2>&1;
               tail -5 "$OUT/racecheck.log" ;;
    bench) .device/cuda_bench 2>&1 | tee "$OUT/bench.log" ;;
    bench-exact) .device/cuda_bench --exact --quick 2>&1 | tee "$OUT/bench_exact.log" ;;
    bench-cublas) .device/cuda_bench --gemv-max-rows 0 --quick 2>&1 | tee "$OUT/bench_cublas.log" ;;
    peer) timeout 240 python3 tools/hf_peer_bench.py 2>&1 | grep -v Warning | tee "$OUT/peer.log" ;;
    peer-compile) timeout 300 python3 tools/hf_peer_bench.py --compile --quick 2>&1 | tee "$OUT/peer.log" ;;
  esac
done
