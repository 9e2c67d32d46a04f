// The forward pass on the CUDA backend against transformers' float32 references (the golden
// models and tiny-chat): exact mode (float32 activations everywhere) within 1e-3 of the largest
// reference logit, fast mode (bf16 activations into many-row linears) within 2e-2, and greedy
// tokens of tiny-chat equal to transformers'. Skipped without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <numeric>

#include "backend/cuda/cuda_backend.h"
#include "core/mapped_file.h"
#include "formats/safetensors.h"
#include "model/evaluate.h"
#include "model/model.h"
#include "ops/device.h"
#include "tests/golden/golden_util.h"

namespace gizllm {
namespace {

#define GZ_SKIP_WITHOUT_CUDA()                                              \
  do {                                                                      \
    if (CudaDeviceCount() == 0)                                             \
      GTEST_SKIP() << "no CUDA device was found: CUDA model tests skipped"; \
  } while (0)

std::unique_ptr<Model> LoadOnCuda(const std::string& dir, bool exact) {
  DeviceOptions device;
  device.device = "cuda";
  device.exact = exact;
  auto backend = OpenBackend(device);
  EXPECT_TRUE(backend.ok()) << backend.status().message();
  if (!backend.ok()) return nullptr;
  auto model = Model::Load(dir, *backend);
  EXPECT_TRUE(model.ok()) << model.status().message();
  return model.ok() ? std::move(*model) : nullptr;
}

using golden::ExpectClose;
using golden::ReadFloats;
using golden::ReadIds;

void CheckReferenceLogits(const std::string& dir, bool exact) {
  SCOPED_TRACE(dir + (exact ? " exact" : " fast"));
  auto model = LoadOnCuda(dir, exact);
  ASSERT_TRUE(model);
  auto ref = SafetensorsFile::Open(dir + "/reference.safetensors");
  ASSERT_TRUE(ref.ok()) << ref.status().message();
  int cases = 0;
  for (int i = 0;; ++i) {
    const TensorInfo* ids = ref->Find("ids" + std::to_string(i));
    const TensorInfo* logits = ref->Find("logits" + std::to_string(i));
    if (!ids || !logits) break;
    auto tokens = ReadIds(*ids);
    // Whole prompts (tile kernel, many-row linears) and chunks of 5 rows, and single rows
    // (decode kernel, GEMV) reading the keys earlier steps wrote.
    for (int64_t chunk : {int64_t{256}, int64_t{5}, int64_t{1}}) {
      auto ours = SequenceLogits(*model, tokens, chunk);
      ASSERT_TRUE(ours.ok()) << ours.status().message();
      ExpectClose(*ours, ReadFloats(*logits), exact ? 1e-3f : 2e-2f,
                  "case " + std::to_string(i) + " chunk " + std::to_string(chunk));
    }
    ++cases;
  }
  EXPECT_GE(cases, 3);
}

TEST(CudaModelTest, GoldenModelsExactMode) {
  GZ_SKIP_WITHOUT_CUDA();
  for (const char* dir : {"tests/golden/models/llama", "tests/golden/models/qwen2",
                          "tests/golden/models/qwen3", "models/tiny-chat"}) {
    CheckReferenceLogits(dir, /*exact=*/true);
  }
}

TEST(CudaModelTest, GoldenModelsFastMode) {
  GZ_SKIP_WITHOUT_CUDA();
  for (const char* dir : {"tests/golden/models/llama", "tests/golden/models/qwen2",
                          "tests/golden/models/qwen3", "models/tiny-chat"}) {
    CheckReferenceLogits(dir, /*exact=*/false);
  }
}

// Greedy decoding one token at a time against transformers' generate().
TEST(CudaModelTest, TinyChatGreedyEqualsTransformers) {
  GZ_SKIP_WITHOUT_CUDA();
  auto model = LoadOnCuda("models/tiny-chat", /*exact=*/true);
  ASSERT_TRUE(model);
  auto text = ReadFile("tests/golden/tiny_chat_greedy.json");
  ASSERT_TRUE(text.ok());
  auto cases = nlohmann::json::parse(*text);
  for (const auto& c : cases["cases"]) {
    std::vector<int32_t> prompt = c["prompt_ids"].get<std::vector<int32_t>>();
    std::vector<int32_t> expected = c["output_ids"].get<std::vector<int32_t>>();
    auto out = golden::GreedyTokens(*model, prompt, expected.size(), {0, 2});
    ASSERT_TRUE(out.ok()) << out.status().message();
    EXPECT_EQ(*out, expected) << c["prompt"].get<std::string>();
  }
}

}  // namespace
}  // namespace gizllm
