// A model folder loaded once per test binary on the CPU backend in float32 (the reference
// mode), for engine tests on real models; nullptr (and a test failure) when it does not load.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>

#include "model/model.h"
#include "ops/device.h"

namespace gizllm::testing {

inline Model* LoadExactCpu(const std::string& folder) {
  static std::map<std::string, std::unique_ptr<Model>> models;
  auto& slot = models[folder];
  if (!slot) {
    DeviceOptions device;
    device.device = "cpu";
    device.threads = 2;
    device.exact = true;
    auto backend = OpenBackend(device);
    EXPECT_TRUE(backend.ok()) << backend.status().message();
    if (!backend.ok()) return nullptr;
    auto m = Model::Load(folder, *backend);
    EXPECT_TRUE(m.ok()) << m.status().message();
    if (!m.ok()) return nullptr;
    slot = std::move(*m);
  }
  return slot.get();
}

}  // namespace gizllm::testing
