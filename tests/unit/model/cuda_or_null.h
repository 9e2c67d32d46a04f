// The CUDA backend for tests that compare it with the CPU, where the build has one and a device
// is found; else null and the reason, for GTEST_SKIP.
#pragma once

#include <algorithm>
#include <memory>
#include <string>

#include "ops/device.h"

namespace gizllm::testing {

inline std::shared_ptr<Backend> CudaOrNull(bool exact, std::string* why) {
  const std::vector<std::string> built = BuiltBackends();
  if (std::find(built.begin(), built.end(), "cuda") == built.end()) {
    *why = "this build has no CUDA backend";
    return nullptr;
  }
  DeviceOptions device;
  device.device = "cuda";
  device.exact = exact;
  auto backend = OpenBackend(device);
  if (!backend.ok()) {
    *why = "no CUDA device: " + backend.status().message();
    return nullptr;
  }
  return std::move(backend).value();
}

}  // namespace gizllm::testing
