#!/bin/bash
# Runs on the GPU machine from the repository root: the CUDA op tests, compute-sanitizer on them,
# the benchmark, and the transformers peer. Binaries come prebuilt in .device/ (copy
# build-cuda/bench/cuda/cuda_bench and build-cuda/tests/unit/backend/cuda/cuda_*_test
# there and carry it). Every step has its own time limit, so one hang cannot eat the call.
# Usage: bench/cuda/run_device.sh STEP... with STEP one of tests model sampling engine sanitize
#        racecheck bench bits engine-bench
#        bench-exact bench-cublas bench-gemv8 bench-nographs ncu-attention ncu-quant
#        golden-refs peer peer-compile
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
for what in "$@"; do
  echo "=== $what ($(date -u +%H:%M:%S))"
  case $what in
    tests) timeout 200 .device/cuda_backend_test > "$OUT/tests.log" 2>&1
           echo "rc=$?"; grep -E "^\[  (FAILED|PASSED|  OK) |Failure|Expected|Which is|trace" \
             "$OUT/tests.log" | head -60 ;;
    model) timeout 120 .device/cuda_model_test > "$OUT/model.log" 2>&1
           echo "rc=$?"; grep -E "^\[  (FAILED|PASSED|  OK) |Failure|Expected|Which is|max diff" \
             "$OUT/model.log" | head -40 ;;
    sampling) timeout 90 .device/cuda_sampling_test > "$OUT/sampling.log" 2>&1
              echo "rc=$?"; grep -E "^\[  (FAILED|PASSED|  OK) |Failure|Expected|Which is" \
                "$OUT/sampling.log" | head -30 ;;
    engine) timeout 120 .device/cuda_engine_test > "$OUT/engine.log" 2>&1
            echo "rc=$?"; grep -E "^\[  (FAILED|PASSED|  OK) |Failure|Expected|Which is" \
              "$OUT/engine.log" | head -30 ;;
    sanitize) timeout 240 compute-sanitizer --tool memcheck --leak-check no \
                .device/cuda_backend_test --gtest_brief=1 > "$OUT/memcheck.log" 2>&1
              echo "rc=$?"; tail -6 "$OUT/memcheck.log"
              timeout 60 compute-sanitizer --tool memcheck --leak-check no \
                .device/cuda_sampling_test --gtest_brief=1 > "$OUT/memcheck_sampling.log" 2>&1
              echo "rc=$?"; tail -4 "$OUT/memcheck_sampling.log" ;;
    bits) for b in 8/8 4/8; do
            timeout 150 .device/cuda_bench --bits $b 2>&1 | tee "$OUT/bench_q${b%%/*}.log"
          done ;;
    engine-bench) (for c in 1 16 64 256; do
                     for how in "" "--host-sampling" "--temperature 0.8 --top-p 0.9" \
                                "--temperature 0.8 --top-p 0.9 --host-sampling"; do
                       echo "--- concurrency $c $how"
                       timeout 60 .device/gizllm bench --device cuda -n 256 -p 64 -o 128 -c $c \
                         $how 2>/dev/null | grep -E "output|first|between"
                     done
                   done) 2>&1 | tee "$OUT/engine_bench.log" ;;
    racecheck) timeout 200 compute-sanitizer --tool racecheck .device/cuda_backend_test \
                 --gtest_filter='CudaAttention*:CudaQuant*:CudaFusedTest.GemvRunsTheEndsExactly:CudaFusedTest.RopeKv*' --gtest_brief=1 > "$OUT/racecheck.log" 2>&1
               echo "rc=$?"; tail -6 "$OUT/racecheck.log"
               timeout 60 compute-sanitizer --tool racecheck .device/cuda_sampling_test \
                 --gtest_filter='*RowsAreIndependent*' > "$OUT/racecheck_sampling.log" 2>&1
               echo "rc=$?"; tail -4 "$OUT/racecheck_sampling.log" ;;
    bench) timeout 180 .device/cuda_bench 2>&1 | tee "$OUT/bench.log" ;;
    bench-exact) timeout 120 .device/cuda_bench --exact --quick 2>&1 | tee "$OUT/bench_exact.log" ;;
    bench-cublas) timeout 120 .device/cuda_bench --gemv-max-rows 0 --quick 2>&1 |
                    tee "$OUT/bench_cublas.log" ;;
    bench-gemv8) timeout 120 .device/cuda_bench --gemv-max-rows 8 --quick 2>&1 |
                   tee "$OUT/bench_gemv8.log" ;;
    ncu-attention) ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
                   timeout 200 "$ncu" --clock-control none --kernel-name regex:MmaTileKernel --launch-count 1 \
                     --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
                     --section Occupancy --section MemoryWorkloadAnalysis \
                     .device/cuda_bench --quick --prefill-only > "$OUT/ncu_attention.log" 2>&1
                   echo "rc=$?"; grep -v "^==PROF==\|^  *$" "$OUT/ncu_attention.log" |
                     grep -A200 "MmaTileKernel" | head -120 ;;
    ncu-quant) # the batch-1 quantized decode kernels of one layer (q/k/v, o, gate/up, down), 4-bit
               ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
               timeout 240 "$ncu" --clock-control none --kernel-name regex:QuantDecodeKernel --launch-count 4 \
                 --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
                 --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis \
                 --section MemoryWorkloadAnalysis \
                 .device/cuda_bench --quick --decode-only --bits 4/8 > "$OUT/ncu_quant.log" 2>&1
               echo "rc=$?"; grep -v "^==PROF==\|^  *$" "$OUT/ncu_quant.log" |
                 grep -E "QuantDecodeKernel|Duration|Throughput|Registers|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|Eligible Warps|No Eligible|Warp Cycles Per Issued|Block Limit|Waves Per SM|Grid Size|Executed Ipc A|Stall|DRAM" | head -120 ;;
    golden-refs) # transformers' logits with bf16-rounded linear inputs (tools/make_golden.py)
                 timeout 200 python3 tools/make_golden.py --bf16-inputs tests/golden/models/llama \
                   tests/golden/models/qwen2 tests/golden/models/qwen3 2>&1 |
                   grep -v -i warn | tee "$OUT/golden_refs.log"
                 for f in llama qwen2 qwen3; do
                   mkdir -p "$OUT/refs/$f"
                   cp tests/golden/models/$f/reference_bf16_inputs.safetensors "$OUT/refs/$f/"
                 done
                 if [ -x .device/golden_test ]; then
                   timeout 60 .device/golden_test --gtest_filter='*Bf16*' 2>&1 |
                     grep -E "^\[  (FAILED|PASSED|  OK|SKIPPED) |Failure|max diff|lacks" | head -20
                 fi ;;
    bench-nographs) timeout 120 .device/cuda_bench --no-graphs --quick 2>&1 |
                      tee "$OUT/bench_nographs.log" ;;
    peer) timeout 200 python3 tools/hf_peer_bench.py --quick --group-timeout 90 2>&1 |
            grep -v -i warn | tee "$OUT/peer.log" ;;
    peer-compile) timeout 300 python3 tools/hf_peer_bench.py --compile --quick 2>&1 |
                    tee "$OUT/peer.log" ;;
  esac
done
