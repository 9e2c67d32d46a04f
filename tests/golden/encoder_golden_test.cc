// Encoders against sentence-transformers and transformers (tools/make_encoder_golden.py writes
// tests/golden/encoders/ on a machine with transformers; each case skips until its folder is
// there): the tokens equal Hugging Face tokenizers', embeddings within 1e-4 and cross-encoder
// scores within 1e-4 with the same rank order, on the CPU with float32 activations (--exact);
// on CUDA (where a device is found) within 1e-3 with the same order; an encoder's embeddings in
// CUDA's fast mode (bf16 linears, fp16 tensor-core attention) within 2e-2 of their norm.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "model/embedding_model.h"
#include "ops/device.h"

namespace gizllm {
namespace {

constexpr const char* kDir = "tests/golden/encoders";

class EncoderGoldenTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    dir_ = std::string(kDir) + "/" + GetParam();
    const std::string path = dir_ + "/reference.json";
    if (!FileExists(path)) {
      GTEST_SKIP() << path << " is missing: run tools/make_encoder_golden.py where transformers is";
    }
    auto text = ReadFile(path);
    ASSERT_TRUE(text.ok());
    ref_ = nlohmann::json::parse(*text);
    auto backend = OpenBackend(DeviceOptions{.device = "cpu", .exact = true});
    ASSERT_TRUE(backend.ok()) << backend.status().message();
    auto model = EmbeddingModel::Load(dir_, *backend);
    ASSERT_TRUE(model.ok()) << model.status().message();
    model_ = std::move(model).value();
  }

  // The same folder on CUDA (exact, or the fast mode), or null where no CUDA device is found.
  std::unique_ptr<EmbeddingModel> OnCuda(bool exact = true) {
    auto backend = OpenBackend(DeviceOptions{.device = "cuda", .exact = exact});
    if (!backend.ok()) return nullptr;
    auto model = EmbeddingModel::Load(dir_, *backend);
    EXPECT_TRUE(model.ok()) << model.status().message();
    return model.ok() ? std::move(model).value() : nullptr;
  }

  std::string dir_;
  nlohmann::json ref_;
  std::unique_ptr<EmbeddingModel> model_;
};

class EmbedderGoldenTest : public EncoderGoldenTest {};
class CrossEncoderGoldenTest : public EncoderGoldenTest {};

TEST_P(EmbedderGoldenTest, TokensAndEmbeddingsMatch) {
  const auto texts = ref_["texts"].get<std::vector<std::string>>();
  const auto ids = ref_["ids"].get<std::vector<std::vector<int32_t>>>();
  const auto want = ref_["embeddings"].get<std::vector<std::vector<float>>>();
  EXPECT_EQ(model_->config().sentence_transformers, ref_["meta"]["modules_json"].get<bool>());
  EXPECT_EQ(model_->max_tokens(), ref_["meta"]["max_tokens"].get<int64_t>());
  // A case with prompts: the one named (null: the default) goes before every text.
  std::optional<std::string> prompt_name;
  if (ref_.contains("prompt_name") && !ref_["prompt_name"].is_null()) {
    prompt_name = ref_["prompt_name"].get<std::string>();
  }
  auto prompt = PromptText(model_->config(), prompt_name);
  ASSERT_TRUE(prompt.ok()) << prompt.status().message();
  EXPECT_EQ(*prompt, ref_.value("prompt", std::string()));
  std::vector<Encoding> encodings;
  for (size_t i = 0; i < texts.size(); ++i) {
    auto e = model_->Tokenize(*prompt + texts[i]);
    ASSERT_TRUE(e.ok()) << e.status().message();
    EXPECT_EQ(e->ids, ids[i]) << "text " << i << ": " << texts[i];
    encodings.push_back(std::move(e).value());
  }
  auto check = [&](EmbeddingModel& model, float tolerance, const char* device) {
    auto got = model.Embed(encodings);
    ASSERT_TRUE(got.ok()) << got.status().message();
    ASSERT_EQ(got->size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ((*got)[i].size(), want[i].size());
      float max_diff = 0;
      for (size_t j = 0; j < want[i].size(); ++j) {
        max_diff = std::max(max_diff, std::fabs((*got)[i][j] - want[i][j]));
      }
      EXPECT_LE(max_diff, tolerance)
          << device << ", text " << i << " (" << ref_["meta"]["reference"] << ")";
    }
  };
  check(*model_, 1e-4f, "cpu");
  if (auto cuda = OnCuda()) check(*cuda, 1e-3f, "cuda");
  // The fast mode of an encoder (a decoder's fast mode has golden tests of its own): each vector
  // within 2e-2 of its norm.
  auto fast = model_->is_decoder() ? nullptr : OnCuda(/*exact=*/false);
  if (!fast) return;
  auto got = fast->Embed(encodings);
  ASSERT_TRUE(got.ok()) << got.status().message();
  ASSERT_EQ(got->size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ((*got)[i].size(), want[i].size());
    double diff = 0, norm = 0;
    for (size_t j = 0; j < want[i].size(); ++j) {
      diff += std::pow(double((*got)[i][j]) - want[i][j], 2);
      norm += std::pow(double(want[i][j]), 2);
    }
    EXPECT_LE(std::sqrt(diff), 2e-2 * std::sqrt(norm))
        << "cuda fast, text " << i << " (" << ref_["meta"]["reference"] << ")";
  }
}

TEST_P(CrossEncoderGoldenTest, TokensScoresAndOrderMatch) {
  const std::string query = ref_["query"];
  const auto documents = ref_["documents"].get<std::vector<std::string>>();
  const auto ids = ref_["ids"].get<std::vector<std::vector<int32_t>>>();
  const auto types = ref_["types"].get<std::vector<std::vector<int32_t>>>();
  const auto want = ref_["scores"].get<std::vector<float>>();
  const auto order = ref_["order"].get<std::vector<size_t>>();
  // A decoder reranker (Qwen3-Reranker) scores when asked, as `serve --task rerank` asks.
  auto ask = [&](EmbeddingModel& model) {
    if (model.is_decoder()) {
      Status s = model.RerankByYesNo(ref_["meta"].value("instruction", std::string()));
      EXPECT_TRUE(s.ok()) << s.message();
    }
  };
  ask(*model_);
  EXPECT_TRUE(model_->reranks());
  std::vector<Encoding> pairs;
  for (size_t i = 0; i < documents.size(); ++i) {
    auto e = model_->TokenizePair(query, documents[i]);
    ASSERT_TRUE(e.ok()) << e.status().message();
    EXPECT_EQ(e->ids, ids[i]) << "document " << i;
    EXPECT_EQ(e->types, types[i]) << "document " << i;
    pairs.push_back(std::move(e).value());
  }
  auto check = [&](EmbeddingModel& model, float tolerance, const char* device) {
    ask(model);
    auto got = model.Score(pairs);
    ASSERT_TRUE(got.ok()) << got.status().message();
    ASSERT_EQ(got->size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_NEAR((*got)[i], want[i], tolerance)
          << device << ", document " << i << " (" << ref_["meta"]["reference"] << ")";
    }
    std::vector<size_t> ours(got->size());
    std::iota(ours.begin(), ours.end(), size_t{0});
    std::stable_sort(ours.begin(), ours.end(),
                     [&](size_t a, size_t b) { return (*got)[a] > (*got)[b]; });
    EXPECT_EQ(ours, order) << device;
  };
  check(*model_, 1e-4f, "cpu");
  if (auto cuda = OnCuda()) check(*cuda, 1e-3f, "cuda");
}

INSTANTIATE_TEST_SUITE_P(Encoders, EmbedderGoldenTest,
                         ::testing::Values("bert_mean", "bert_st", "roberta_st", "xlmr_mean",
                                           "bert_prompt", "qwen3_last"));
INSTANTIATE_TEST_SUITE_P(Encoders, CrossEncoderGoldenTest,
                         ::testing::Values("bert_ce", "xlmr_ce", "qwen3_reranker"));

}  // namespace
}  // namespace gizllm
