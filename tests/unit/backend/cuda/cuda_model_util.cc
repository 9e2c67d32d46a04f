#include "tests/unit/backend/cuda/cuda_model_util.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <system_error>
#include <utility>

#include "model/evaluate.h"
#include "ops/device.h"
#include "tests/golden/golden_util.h"

namespace gizllm::testing {

std::unique_ptr<Model> LoadOn(const std::string& dir, const std::string& device, bool exact) {
  DeviceOptions options;
  options.device = device;
  options.exact = exact;
  auto backend = OpenBackend(options);
  EXPECT_TRUE(backend.ok()) << backend.status().message();
  if (!backend.ok()) return nullptr;
  auto model = Model::Load(dir, *backend);
  EXPECT_TRUE(model.ok()) << model.status().message();
  return model.ok() ? std::move(*model) : nullptr;
}

ScratchFolder::ScratchFolder(const std::string& name)
    : path_(std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()))) {
  std::filesystem::remove_all(path_);
  std::filesystem::create_directories(path_);
}

ScratchFolder::~ScratchFolder() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

void ConvertWithCpuReference(const std::string& from, const std::string& dir,
                             const std::string& bits, std::span<const int32_t> tokens,
                             std::vector<float>* want) {
  ASSERT_NO_FATAL_FAILURE(golden::Convert(from, dir, bits));
  auto cpu = LoadOn(dir, "cpu", /*exact=*/true);
  ASSERT_TRUE(cpu);
  auto logits = SequenceLogits(*cpu, tokens);
  ASSERT_TRUE(logits.ok()) << logits.status().message();
  *want = std::move(*logits);
}

}  // namespace gizllm::testing
