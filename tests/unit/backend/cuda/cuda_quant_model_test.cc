// tiny-chat converted to gizllm's format (quantized linears) on the CUDA backend against the CPU
// backend on the same converted folder: exact mode within 1e-3 of the largest CPU logit, fast mode
// (float16 activations on the tensor cores) within 2e-2, for whole prompts, chunks of 5 rows and
// single rows (the batch-1 decode kernel). Skipped without a CUDA device.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "formats/safetensors.h"
#include "model/evaluate.h"
#include "model/model.h"
#include "tests/golden/golden_util.h"
#include "tests/unit/backend/cuda/cuda_model_util.h"

namespace gizllm {
namespace {

using testing::ConvertWithCpuReference;
using testing::LoadOn;

TEST(CudaQuantModelTest, ConvertedTinyChatMatchesCpu) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device was found: CUDA model tests skipped";
  const testing::ScratchFolder root("gizllm_cuda_quant_model");
  auto ref = SafetensorsFile::Open("models/tiny-chat/reference.safetensors");
  ASSERT_TRUE(ref.ok()) << ref.status().message();
  const TensorInfo* ids = ref->Find("ids0");
  ASSERT_NE(ids, nullptr);
  const std::vector<int32_t> tokens = golden::ReadIds(*ids);
  for (const char* bits : {"4/8", "8"}) {
    SCOPED_TRACE(std::string("bits ") + bits);
    const std::string dir = root.Path(std::string("q") + bits[0]);
    std::vector<float> want;  // float32 on the CPU: the reference
    ASSERT_NO_FATAL_FAILURE(ConvertWithCpuReference("models/tiny-chat", dir, bits, tokens, &want));
    for (bool exact : {true, false}) {
      auto gpu = LoadOn(dir, "cuda", exact);
      ASSERT_TRUE(gpu);
      for (int64_t chunk : {int64_t{256}, int64_t{5}, int64_t{1}}) {
        auto ours = SequenceLogits(*gpu, tokens, chunk);
        ASSERT_TRUE(ours.ok()) << ours.status().message();
        golden::ExpectClose(
            *ours, want, exact ? 1e-3f : 2e-2f,
            std::string(exact ? "exact" : "fast") + " chunk " + std::to_string(chunk));
      }
    }
  }
}

}  // namespace
}  // namespace gizllm
