// Choosing the backend a model runs on. Declared here so that model/ and the front ends never
// include a backend header; defined in backend/select.cc, which knows every backend built.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "ops/backend.h"

namespace gizllm {

struct DeviceOptions {
  std::string device = "auto";  // "auto": a CUDA GPU if one is found, else the CPU; "cpu"; "cuda"
  int threads = 0;              // CPU threads; 0: one per core
  bool exact = false;           // float32 activations on every device (CUDA's fast mode off;
                                // contradicts bf16 and int8)
  bool bf16 = false;            // CPU: activations into bf16 linears rounded to bf16 (AVX-512 BF16;
                                // the default on such CPUs unless exact)
  bool int8 = false;            // CPU: activations into q8/q4 linears as int8 (AVX-512 VNNI)
  int gpu = 0;                  // CUDA: the device's index among the visible ones
  bool bf16_copies = true;      // CUDA fast mode: bf16 copies of quantized linears (CudaOptions)
  Status Check() const;
};

// The backend, with whatever it needs kept alive (thread pool, device context).
Expected<std::shared_ptr<Backend>> OpenBackend(const DeviceOptions& options);

// A backend for each stage of a pipeline (model/pipeline_runner.h): on CUDA, stage s on GPU
// gpus[s] (a GPU may come more than once); on the CPU, `gpus.size()` backends over one thread
// pool (the indices are not read). Refuses an index no device has.
Expected<std::vector<std::shared_ptr<Backend>>> OpenStageBackends(const DeviceOptions& options,
                                                                  std::span<const int> gpus);

// The CUDA devices found (0 without CUDA in the build, a driver or a device).
int GpuCount();

// The backends this build has ("cpu", "cuda") and, for each, whether a device was found.
std::vector<std::string> BuiltBackends();

}  // namespace gizllm
