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

std::vector<int32_t> ReadIds(const TensorInfo& t) {
  std::vector<int32_t> ids(t.Elements());
  for (size_t i = 0; i < ids.size(); ++i) {
    int64_t v;
    std::memcpy(&v, t.data + 8 * i, 8);
    ids[i] = static_cast<int32_t>(v);
  }
  return ids;
}

std::vector<float> ReadFloats(const TensorInfo& t) {
  std::vector<float> v(t.Elements());
  std::memcpy(v.data(), t.data, v.size() * 4);
  return v;
}

// max |ours - ref| <= tolerance * max |ref|.
void ExpectClose(const std::vector<float>& ours, const std::vector<float>& ref, float tolerance,
                 const std::string& what) {
  ASSERT_EQ(ours.size(), ref.size()) << what;
  float max_ref = 0, max_diff = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(ref[i]));
    float d = std::fabs(ours[i] - ref[i]);
    if (!(d <= max_diff)) max_diff = std::isnan(d) ? INFINITY : d;
  }
  EXPECT_GT(max_ref, 0.0f) << what;
  EXPECT_LE(max_diff, tolerance * max_ref)
      << what << ": max diff " << max_diff << ", max |ref| " << max_ref;
}

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
  auto golden = nlohmann::json::parse(*text);
  const int64_t vocab = model->arch().vocab;
  for (const auto& c : golden["cases"]) {
    std::vector<int32_t> prompt = c["prompt_ids"].get<std::vector<int32_t>>();
    std::vector<int32_t> expected = c["output_ids"].get<std::vector<int32_t>>();
    const int32_t max_pages = 16;
    std::vector<int32_t> pages(max_pages);
    std::iota(pages.begin(), pages.end(), 0);
    PageTables tables{pages.data(), 1, max_pages};
    ASSERT_TRUE(model->AllocatePages(max_pages).ok());
    Rows rows;
    for (size_t p = 0; p < prompt.size(); ++p)
      rows.Push(prompt[p], 0, static_cast<int32_t>(p), p + 1 == prompt.size());
    std::vector<float> logits(vocab);
    std::vector<int32_t> out;
    int32_t position = static_cast<int32_t>(prompt.size());
    while (out.size() < expected.size()) {
      ASSERT_TRUE(model->Step(rows, tables, logits.data()).ok());
      int32_t next =
          static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      out.push_back(next);
      if (next == 0 || next == 2) break;
      rows.Clear();
      rows.Push(next, 0, position++, true);
    }
    EXPECT_EQ(out, expected) << c["prompt"].get<std::string>();
  }
}

}  // namespace
}  // namespace gizllm
