// The forward pass against Hugging Face transformers' float32 references (tools/make_golden.py
// and models/tiny-chat/reference.safetensors): logits within 1e-4 of the largest reference
// logit, hidden states likewise, and greedy tokens equal token for token.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <numeric>

#include "core/mapped_file.h"
#include "formats/safetensors.h"
#include "model/evaluate.h"
#include "model/model.h"
#include "ops/device.h"

namespace gizllm {
namespace {

std::unique_ptr<Model> LoadModel(const std::string& dir, int threads = 2) {
  DeviceOptions device;
  device.device = "cpu";
  device.threads = threads;
  auto backend = OpenBackend(device);
  EXPECT_TRUE(backend.ok()) << backend.status().message();
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

// max |ours - ref| <= 1e-4 * max |ref|.
void ExpectClose(const std::vector<float>& ours, const std::vector<float>& ref,
                 const std::string& what) {
  ASSERT_EQ(ours.size(), ref.size()) << what;
  float max_ref = 0, max_diff = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(ref[i]));
    float d = std::fabs(ours[i] - ref[i]);
    if (!(d <= max_diff)) max_diff = std::isnan(d) ? INFINITY : d;
  }
  EXPECT_GT(max_ref, 0.0f) << what;
  EXPECT_LE(max_diff, 1e-4f * max_ref) << what << ": max diff " << max_diff << ", max |ref| "
                                       << max_ref;
}

void CheckReferenceLogits(const std::string& model_dir, const std::string& reference) {
  auto model = LoadModel(model_dir);
  ASSERT_TRUE(model);
  auto ref = SafetensorsFile::Open(reference);
  ASSERT_TRUE(ref.ok()) << ref.status().message();
  int cases = 0;
  for (int i = 0;; ++i) {
    const TensorInfo* ids = ref->Find("ids" + std::to_string(i));
    const TensorInfo* logits = ref->Find("logits" + std::to_string(i));
    if (!ids || !logits) break;
    auto tokens = ReadIds(*ids);
    // Read in chunks of 5 rows too: later chunks must read the keys earlier ones wrote.
    for (int64_t chunk : {int64_t{256}, int64_t{5}}) {
      auto ours = SequenceLogits(*model, tokens, chunk);
      ASSERT_TRUE(ours.ok()) << ours.status().message();
      ExpectClose(*ours, ReadFloats(*logits),
                  model_dir + " case " + std::to_string(i) + " chunk " + std::to_string(chunk));
    }
    ++cases;
  }
  EXPECT_GE(cases, 3) << reference;
}

TEST(Golden, LlamaWithLlama3RopeScaling) {
  CheckReferenceLogits("tests/golden/models/llama", "tests/golden/models/llama/reference.safetensors");
}

TEST(Golden, Qwen2WithBiasesTiedHeadOlderRopeKeys) {
  CheckReferenceLogits("tests/golden/models/qwen2", "tests/golden/models/qwen2/reference.safetensors");
}

TEST(Golden, Qwen3WithQkNorms) {
  CheckReferenceLogits("tests/golden/models/qwen3", "tests/golden/models/qwen3/reference.safetensors");
}

TEST(Golden, TinyChatReferenceLogits) {
  CheckReferenceLogits("models/tiny-chat", "models/tiny-chat/reference.safetensors");
}

TEST(Golden, TinyChatOneThreadMatchesToo) {
  auto model = LoadModel("models/tiny-chat", 1);
  ASSERT_TRUE(model);
  auto ref = SafetensorsFile::Open("models/tiny-chat/reference.safetensors");
  ASSERT_TRUE(ref.ok());
  auto ours = SequenceLogits(*model, ReadIds(*ref->Find("ids1")));
  ASSERT_TRUE(ours.ok());
  ExpectClose(*ours, ReadFloats(*ref->Find("logits1")), "tiny-chat 1 thread");
}

TEST(Golden, HiddenStatesBeforeFinalNorm) {
  for (std::string family : {"llama", "qwen2", "qwen3"}) {
    std::string dir = "tests/golden/models/" + family;
    auto model = LoadModel(dir);
    ASSERT_TRUE(model);
    auto ref = SafetensorsFile::Open(dir + "/reference.safetensors");
    ASSERT_TRUE(ref.ok());
    const TensorInfo* hidden = ref->Find("hidden2");
    ASSERT_NE(hidden, nullptr);
    ASSERT_EQ(hidden->shape.size(), 3u);
    const int layers = static_cast<int>(hidden->shape[0]);
    ASSERT_EQ(layers, model->arch().layers + 1);
    std::vector<int> all(layers);
    std::iota(all.begin(), all.end(), 0);
    auto ours = SequenceHidden(*model, ReadIds(*ref->Find("ids2")), all);
    ASSERT_TRUE(ours.ok()) << ours.status().message();
    ExpectClose(*ours, ReadFloats(*hidden), family + " hidden states");
  }
}

// Greedy decoding one token at a time, as an engine would, against transformers' generate().
TEST(Golden, TinyChatGreedyEqualsTransformers) {
  auto model = LoadModel("models/tiny-chat");
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
      int32_t next = static_cast<int32_t>(
          std::max_element(logits.begin(), logits.end()) - logits.begin());
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
