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
  // activations, exact in either mode); more rows go to the GEMM path.
  int gemv_max_rows = 8;
  Status Check() const;
};

// Number of CUDA devices; 0 when there is no driver or no device (never fails).
int CudaDeviceCount();

// A backend on device `options.device`. Fails (a Status) without a device or driver.
Expected<std::unique_ptr<Backend>> MakeCudaBackend(const CudaOptions& options);

}  // namespace gizllm
