// The CUDA backend: every op of ops/backend.h on one NVIDIA GPU. Plain C++ (no CUDA headers), so
// code built without CUDA can include it; defined only where the build has CUDA.
#pragma once

#include <memory>

#include "core/status.h"
#include "ops/backend.h"

namespace gizllm {

struct CudaOptions {
  int device = 0;      // index among the visible CUDA devices
  bool exact = false;  // float32 activations into every linear (for comparison with the CPU);
                       // else matmuls of many rows read bf16 activations (cuBLASLt)
  // Matmuls of at most this many rows stream the weights through the GEMV kernel (float32
  // activations, exact in either mode); more rows go to the GEMM path. -1: 1 in fast mode
  // (cuBLASLt reads the weights once for any rows, the GEMV re-reads each row's activations per
  // weight and fell to a third of the batch-1 rate at 8 rows), 8 in exact mode.
  int gemv_max_rows = -1;
  // Record each step shape once as a CUDA graph and replay it (Backend::BeginStep/ReplayStep).
  bool graphs = true;
  int max_graphs = 64;  // recorded steps kept; the least recently used is dropped
  // Fast mode: beside each quantized or GGUF linear (of at most kQuantGemmMaxElements values), a
  // bf16 copy of its values made at load while the device keeps half its memory free; products
  // of many rows read it through cuBLASLt instead of decoding the weight into bf16 each time
  // (the 8B shape's linears: 14 GB decoded every step at 64 sequences). Batch-1 products read
  // the quantized blocks as before. The same for quantized experts placed on the device (not
  // those an expert cache reads): the grouped path of many rows multiplies the copies.
  bool bf16_copies = true;
  Status Check() const;
};

// Number of CUDA devices; 0 when there is no driver or no device (never fails).
int CudaDeviceCount();

// A backend on device `options.device`. Fails (a Status) without a device or driver.
Expected<std::unique_ptr<Backend>> MakeCudaBackend(const CudaOptions& options);

}  // namespace gizllm
