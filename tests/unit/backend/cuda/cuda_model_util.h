// Helpers of the CUDA model tests (cuda_model_test.cc, cuda_quant_model_test.cc,
// cuda_quant_moe_test.cc): a model loaded on a backend of a device, and converted folders with
// the CPU backend's logits over them, the reference the CUDA backend is held to.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/model.h"

namespace gizllm::testing {

// The model in `dir` on a backend of `device` ("cpu", "cuda"), exact (float32 activations) or
// fast mode; null, with a test failure, where the backend or the model does not load.
std::unique_ptr<Model> LoadOn(const std::string& dir, const std::string& device, bool exact);

// A folder under the system's temporary directory, named by `name` and this process's id:
// emptied when made, removed with what it holds when it goes.
class ScratchFolder {
 public:
  explicit ScratchFolder(const std::string& name);
  ~ScratchFolder();
  ScratchFolder(const ScratchFolder&) = delete;
  ScratchFolder& operator=(const ScratchFolder&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // The path of `name` inside the folder.
  std::string Path(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// Converts `from` with `bits` ("4/8", "8"; as --bits) into `dir` and writes to `want` the logits
// [tokens, vocab] of `tokens` over the converted model on the CPU backend in float32. Call it
// inside ASSERT_NO_FATAL_FAILURE: a failed conversion, load or run is a fatal failure.
void ConvertWithCpuReference(const std::string& from, const std::string& dir,
                             const std::string& bits, std::span<const int32_t> tokens,
                             std::vector<float>* want);

}  // namespace gizllm::testing
