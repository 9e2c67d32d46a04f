// Encoders on the CPU backend, on small random BERT and RoBERTa folders written here: the
// forward pass against a plain float64 reference of BERT's computation written out in this file
// (word + position + type embeddings, post-norm layers, the classification heads), packed
// batches against sequences alone, and the configuration errors a user can cause.
#include "model/encoder.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/mapped_file.h"
#include "formats/safetensors.h"
#include "model/config.h"
#include "model/embedding_model.h"
#include "model/evaluate.h"
#include "model/model.h"
#include "ops/device.h"

namespace gizllm {
namespace {

namespace fs = std::filesystem;
constexpr int kVocab = 30, kDim = 16, kHeads = 2, kFfn = 24, kLayers = 2, kPositions = 24;

struct Tiny {
  std::string family;  // "bert" or "roberta"
  bool head = false;   // *ForSequenceClassification, one label
  int type_vocab = 2;
};

using Tensors = std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>>;

class EncoderTest : public ::testing::Test {
 protected:
  // float32 activations (exact), two threads.
  std::shared_ptr<Backend> Cpu() {
    auto be = OpenBackend(DeviceOptions{.device = "cpu", .threads = 2, .exact = true});
    EXPECT_TRUE(be.ok()) << be.status().message();
    return std::move(be).value();
  }

  void Add(const std::string& name, std::vector<int64_t> shape, float scale, float mean = 0.0f) {
    std::normal_distribution<float> d(mean, scale);
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    std::vector<float> v(n);
    for (float& f : v) f = d(rng_);
    tensors_[name] = {std::move(shape), std::move(v)};
  }

  const std::vector<float>& T(const std::string& name) { return tensors_.at(name).second; }

  // Writes the folder; the tensors stay in tensors_ for the reference.
  std::string Write(const Tiny& tiny, const std::string& name) {
    tensors_.clear();
    const bool bert = tiny.family == "bert";
    const std::string p = tiny.head ? (bert ? "bert." : "roberta.") : "";
    Add(p + "embeddings.word_embeddings.weight", {kVocab, kDim}, 1.0f);
    Add(p + "embeddings.position_embeddings.weight", {kPositions, kDim}, 0.5f);
    Add(p + "embeddings.token_type_embeddings.weight", {tiny.type_vocab, kDim}, 0.5f);
    Add(p + "embeddings.LayerNorm.weight", {kDim}, 0.2f, 1.0f);
    Add(p + "embeddings.LayerNorm.bias", {kDim}, 0.2f);
    for (int l = 0; l < kLayers; ++l) {
      const std::string x = p + "encoder.layer." + std::to_string(l) + ".";
      for (const char* lin : {"attention.self.query", "attention.self.key", "attention.self.value",
                              "attention.output.dense"}) {
        Add(x + lin + ".weight", {kDim, kDim}, 0.3f);
        Add(x + lin + ".bias", {kDim}, 0.1f);
      }
      Add(x + "attention.output.LayerNorm.weight", {kDim}, 0.2f, 1.0f);
      Add(x + "attention.output.LayerNorm.bias", {kDim}, 0.2f);
      Add(x + "intermediate.dense.weight", {kFfn, kDim}, 0.3f);
      Add(x + "intermediate.dense.bias", {kFfn}, 0.1f);
      Add(x + "output.dense.weight", {kDim, kFfn}, 0.3f);
      Add(x + "output.dense.bias", {kDim}, 0.1f);
      Add(x + "output.LayerNorm.weight", {kDim}, 0.2f, 1.0f);
      Add(x + "output.LayerNorm.bias", {kDim}, 0.2f);
    }
    if (tiny.head) {
      const std::string dense = bert ? "bert.pooler.dense" : "classifier.dense";
      const std::string out = bert ? "classifier" : "classifier.out_proj";
      Add(dense + ".weight", {kDim, kDim}, 0.4f);
      Add(dense + ".bias", {kDim}, 0.1f);
      Add(out + ".weight", {1, kDim}, 0.4f);
      Add(out + ".bias", {1}, 0.1f);
    }
    const std::string dir = (fs::path(::testing::TempDir()) / ("encoder_" + name)).string();
    fs::remove_all(dir);  // files an earlier run left (modules.json) must not count
    fs::create_directories(dir);
    std::vector<TensorToWrite> out;
    for (const auto& [n, t] : tensors_) {
      out.push_back({n, DType::kF32, t.first, t.second.data(), t.second.size() * sizeof(float)});
    }
    EXPECT_TRUE(WriteSafetensors(dir + "/model.safetensors", out, {}).ok());
    const std::string cls = bert ? "Bert" : "Roberta";
    nlohmann::json config = {
        {"model_type", tiny.family},
        {"architectures", {cls + (tiny.head ? "ForSequenceClassification" : "Model")}},
        {"vocab_size", kVocab},
        {"hidden_size", kDim},
        {"num_hidden_layers", kLayers},
        {"num_attention_heads", kHeads},
        {"intermediate_size", kFfn},
        {"hidden_act", "gelu"},
        {"max_position_embeddings", kPositions},
        {"type_vocab_size", tiny.type_vocab},
        {"layer_norm_eps", 1e-12},
        {"pad_token_id", bert ? 0 : 1}};
    if (tiny.head) config["id2label"] = {{"0", "LABEL_0"}};
    std::ofstream(dir + "/config.json") << config.dump();
    return dir;
  }

  // BERT in float64, one sequence: the last hidden states [n, dim] (and the head's logit).
  std::vector<double> Reference(const Tiny& tiny, const std::vector<int32_t>& tokens,
                                const std::vector<int32_t>& types, double* logit = nullptr) {
    const bool bert = tiny.family == "bert";
    const std::string p = tiny.head ? (bert ? "bert." : "roberta.") : "";
    const int n = static_cast<int>(tokens.size());
    const int offset = bert ? 0 : 2;
    std::vector<double> x(n * kDim);
    auto norm = [&](std::vector<double>& v, const std::string& w) {
      for (int r = 0; r < n; ++r) {
        double mean = 0, var = 0;
        for (int i = 0; i < kDim; ++i) mean += v[r * kDim + i] / kDim;
        for (int i = 0; i < kDim; ++i) var += std::pow(v[r * kDim + i] - mean, 2) / kDim;
        for (int i = 0; i < kDim; ++i) {
          v[r * kDim + i] =
              (v[r * kDim + i] - mean) / std::sqrt(var + 1e-12) * T(w + ".weight")[i] +
              T(w + ".bias")[i];
        }
      }
    };
    auto linear = [&](const std::vector<double>& in, int rows, int cols, const std::string& w,
                      int outs) {
      std::vector<double> out(rows * outs);
      for (int r = 0; r < rows; ++r)
        for (int o = 0; o < outs; ++o) {
          double s = T(w + ".bias")[o];
          for (int c = 0; c < cols; ++c) s += in[r * cols + c] * T(w + ".weight")[o * cols + c];
          out[r * outs + o] = s;
        }
      return out;
    };
    for (int r = 0; r < n; ++r)
      for (int i = 0; i < kDim; ++i)
        x[r * kDim + i] = T(p + "embeddings.word_embeddings.weight")[tokens[r] * kDim + i] +
                          T(p + "embeddings.position_embeddings.weight")[(r + offset) * kDim + i] +
                          T(p + "embeddings.token_type_embeddings.weight")
                              [(bert && !types.empty() ? types[r] : 0) * kDim + i];
    norm(x, p + "embeddings.LayerNorm");
    const int hd = kDim / kHeads;
    for (int l = 0; l < kLayers; ++l) {
      const std::string L = p + "encoder.layer." + std::to_string(l) + ".";
      auto q = linear(x, n, kDim, L + "attention.self.query", kDim);
      auto k = linear(x, n, kDim, L + "attention.self.key", kDim);
      auto v = linear(x, n, kDim, L + "attention.self.value", kDim);
      std::vector<double> a(n * kDim, 0.0);
      for (int h = 0; h < kHeads; ++h)
        for (int i = 0; i < n; ++i) {
          std::vector<double> s(n);
          double max = -1e300, sum = 0;
          for (int j = 0; j < n; ++j) {
            s[j] = 0;
            for (int d = 0; d < hd; ++d)
              s[j] += q[i * kDim + h * hd + d] * k[j * kDim + h * hd + d];
            s[j] /= std::sqrt(double(hd));
            max = std::max(max, s[j]);
          }
          for (double& e : s) sum += (e = std::exp(e - max));
          for (int j = 0; j < n; ++j)
            for (int d = 0; d < hd; ++d)
              a[i * kDim + h * hd + d] += s[j] / sum * v[j * kDim + h * hd + d];
        }
      auto o = linear(a, n, kDim, L + "attention.output.dense", kDim);
      for (int i = 0; i < n * kDim; ++i) x[i] += o[i];
      norm(x, L + "attention.output.LayerNorm");
      auto f = linear(x, n, kDim, L + "intermediate.dense", kFfn);
      for (double& e : f) e = 0.5 * e * (1 + std::erf(e / std::sqrt(2.0)));
      auto down = linear(f, n, kFfn, L + "output.dense", kDim);
      for (int i = 0; i < n * kDim; ++i) x[i] += down[i];
      norm(x, L + "output.LayerNorm");
    }
    if (logit) {
      std::vector<double> first(x.begin(), x.begin() + kDim);
      auto h = linear(first, 1, kDim, bert ? "bert.pooler.dense" : "classifier.dense", kDim);
      for (double& e : h) e = std::tanh(e);
      *logit = linear(h, 1, kDim, bert ? "classifier" : "classifier.out_proj", 1)[0];
    }
    return x;
  }

  std::mt19937 rng_{25};
  Tensors tensors_;
};

TEST_F(EncoderTest, ForwardMatchesFloat64ReferenceInPackedBatches) {
  for (const Tiny& tiny : {Tiny{"bert", false}, Tiny{"roberta", false, 1}, Tiny{"bert", true},
                           Tiny{"roberta", true, 1}}) {
    SCOPED_TRACE(tiny.family + (tiny.head ? " head" : ""));
    const std::string dir = Write(tiny, tiny.family + (tiny.head ? "_head" : ""));
    auto encoder = Encoder::Load(dir, Cpu());
    ASSERT_TRUE(encoder.ok()) << encoder.status().message();
    const int64_t most = tiny.family == "bert" ? kPositions : kPositions - 2;
    EXPECT_EQ((*encoder)->arch().MaxTokens(), most);
    // Lengths 1, 7, the most the positions allow, and 3; pair types on the second.
    std::vector<std::vector<int32_t>> tokens, types;
    std::uniform_int_distribution<int32_t> token(0, kVocab - 1);
    for (int64_t n : {int64_t{1}, int64_t{7}, most, int64_t{3}}) {
      tokens.emplace_back(n);
      for (int32_t& t : tokens.back()) t = token(rng_);
      types.emplace_back(n, 0);
    }
    for (int i = 4; i < 7; ++i) types[1][i] = 1;
    std::vector<EncoderInput> batch;
    for (size_t s = 0; s < tokens.size(); ++s) batch.push_back({tokens[s], types[s]});
    std::vector<float> hidden;
    ASSERT_TRUE((*encoder)->Forward(batch, &hidden).ok());
    size_t row = 0;
    for (size_t s = 0; s < tokens.size(); ++s) {
      std::vector<double> want = Reference(tiny, tokens[s], types[s]);
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_NEAR(hidden[row * kDim + i], want[i], 2e-5) << "sequence " << s << " element " << i;
      }
      // The sequence alone gives the same rows.
      std::vector<float> alone;
      const EncoderInput one[] = {batch[s]};
      ASSERT_TRUE((*encoder)->Forward(one, &alone).ok());
      for (size_t i = 0; i < alone.size(); ++i) {
        ASSERT_NEAR(alone[i], hidden[row * kDim + i], 1e-6) << "sequence " << s;
      }
      row += tokens[s].size();
    }
    // Pooled on the backend: the host's Pool of the same rows (sums in double, in row order).
    std::vector<int32_t> starts = {0};
    for (const auto& t : tokens) starts.push_back(starts.back() + static_cast<int32_t>(t.size()));
    for (Pooling pooling : {Pooling::kMean, Pooling::kCls, Pooling::kLastToken}) {
      std::vector<float> pooled, want(tokens.size() * kDim);
      ASSERT_TRUE((*encoder)->Pool(batch, pooling, &pooled).ok());
      Pool(hidden, kDim, starts, pooling, /*normalize=*/false, want.data());
      EXPECT_EQ(pooled, want) << PoolingName(pooling);
    }
    std::vector<float> logits;
    Status classified = (*encoder)->Classify(batch, &logits);
    if (!tiny.head) {
      EXPECT_FALSE(classified.ok());
      continue;
    }
    ASSERT_TRUE(classified.ok()) << classified.message();
    ASSERT_EQ(logits.size(), tokens.size());
    for (size_t s = 0; s < tokens.size(); ++s) {
      double want = 0;
      Reference(tiny, tokens[s], types[s], &want);
      EXPECT_NEAR(logits[s], want, 2e-5) << "sequence " << s;
    }
  }
}

TEST_F(EncoderTest, InputsOutsideTheModelAreErrorsNamingTheSequence) {
  const std::string dir = Write(Tiny{"bert", false}, "inputs");
  auto encoder = Encoder::Load(dir, Cpu());
  ASSERT_TRUE(encoder.ok());
  std::vector<float> hidden;
  const std::vector<int32_t> good = {1, 2}, bad_token = {1, kVocab}, bad_type = {2, 0};
  const std::vector<int32_t> too_long(kPositions + 1, 3);
  auto error = [&](const std::vector<int32_t>& tokens, const std::vector<int32_t>& types) {
    const EncoderInput batch[] = {{good, {}}, {tokens, types}};
    Status s = (*encoder)->Forward(batch, &hidden);
    EXPECT_FALSE(s.ok());
    return s.message();
  };
  EXPECT_NE(error(bad_token, {}).find("sequence 1: token 30"), std::string::npos);
  EXPECT_NE(error(good, bad_type).find("sequence 1: token type 2"), std::string::npos);
  EXPECT_NE(error(too_long, {}).find("more than the 24 positions"), std::string::npos);
  EXPECT_NE(error({}, {}).find("no tokens"), std::string::npos);
}

TEST_F(EncoderTest, ConfigRefusesWhatItDoesNotCompute) {
  const std::string dir = Write(Tiny{"bert", false}, "refused");
  auto config = nlohmann::json::parse(std::ifstream(dir + "/config.json"));
  for (const auto& [field, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"hidden_act", "gelu_new"},
           {"position_embedding_type", "relative_key"},
           {"is_decoder", true},
           {"num_attention_heads", 3}}) {
    nlohmann::json c = config;
    c[field] = value;
    auto arch = ParseEncoderArch(c, "config.json");
    ASSERT_FALSE(arch.ok()) << field;
    EXPECT_NE(arch.status().message().find(field), std::string::npos) << arch.status().message();
  }
  // The decoder path names the commands an encoder is for.
  auto decoder = ParseArch(config, "config.json");
  ASSERT_FALSE(decoder.ok());
  EXPECT_NE(decoder.status().message().find("gizllm embed"), std::string::npos);
}

TEST_F(EncoderTest, SentenceTransformersConfiguration) {
  const std::string dir = Write(Tiny{"bert", false}, "st");
  auto plain = ReadEmbeddingConfig(dir, 0);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->pooling, Pooling::kMean);
  EXPECT_FALSE(plain->normalize);
  EXPECT_FALSE(plain->sentence_transformers);
  auto write = [&](const std::string& file, const nlohmann::json& j) {
    fs::create_directories(fs::path(dir + "/" + file).parent_path());
    std::ofstream(dir + "/" + file) << j.dump();
  };
  write("modules.json", nlohmann::json::parse(R"([
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
  ])"));
  write("1_Pooling/config.json", {{"word_embedding_dimension", kDim},
                                  {"pooling_mode_cls_token", true},
                                  {"pooling_mode_mean_tokens", false}});
  write("sentence_bert_config.json", {{"max_seq_length", 8}, {"do_lower_case", false}});
  auto st = ReadEmbeddingConfig(dir, 0);
  ASSERT_TRUE(st.ok()) << st.status().message();
  EXPECT_EQ(st->pooling, Pooling::kCls);
  EXPECT_TRUE(st->normalize);
  EXPECT_EQ(st->max_tokens, 8);
  write("1_Pooling/config.json", {{"pooling_mode_max_tokens", true}});
  auto max = ReadEmbeddingConfig(dir, 0);
  ASSERT_FALSE(max.ok());
  EXPECT_NE(max.status().message().find("pooling_mode_max_tokens"), std::string::npos);
  // Scores: sigmoid for one label by default, as config.json's activation_fn says otherwise.
  EXPECT_EQ(ReadEmbeddingConfig(dir + "/1_Pooling", 1)->activation, ScoreActivation::kSigmoid);
  EXPECT_EQ(ReadEmbeddingConfig(dir + "/1_Pooling", 2)->activation, ScoreActivation::kIdentity);
}

// Prompts (config_sentence_transformers.json, read beside modules.json) and Matryoshka sizes
// (config.json).
TEST_F(EncoderTest, PromptsAndMatryoshkaConfiguration) {
  const std::string dir = Write(Tiny{"bert", false}, "prompts");
  auto write = [&](const std::string& file, const nlohmann::json& j) {
    fs::create_directories(fs::path(dir + "/" + file).parent_path());
    std::ofstream(dir + "/" + file) << j.dump();
  };
  const nlohmann::json prompts = {
      {"prompts", {{"query", "Instruct: find\nQuery:"}, {"document", ""}}},
      {"default_prompt_name", "query"}};
  write("config_sentence_transformers.json", prompts);
  // Without modules.json the folder is not a sentence-transformers model: no prompts.
  auto plain = ReadEmbeddingConfig(dir, 0);
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(plain->prompts.empty());
  EXPECT_EQ(*PromptText(*plain, std::nullopt), "");
  EXPECT_FALSE(PromptText(*plain, "query").ok());
  EXPECT_FALSE(plain->matryoshka);
  Status refused = CheckDimensions(*plain, 16, 8);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("is_matryoshka"), std::string::npos);
  EXPECT_TRUE(CheckDimensions(*plain, 16, 16).ok());

  write("modules.json", nlohmann::json::parse(R"([
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}
  ])"));
  write("1_Pooling/config.json", {{"pooling_mode_mean_tokens", true}});
  auto st = ReadEmbeddingConfig(dir, 0);
  ASSERT_TRUE(st.ok()) << st.status().message();
  EXPECT_EQ(*PromptText(*st, std::nullopt), "Instruct: find\nQuery:");
  EXPECT_EQ(*PromptText(*st, "document"), "");
  auto unknown = PromptText(*st, "passage");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("document, query"), std::string::npos);
  write("config_sentence_transformers.json",
        {{"prompts", {{"query", "q: "}}}, {"default_prompt_name", nullptr}});
  EXPECT_EQ(*PromptText(*ReadEmbeddingConfig(dir, 0), std::nullopt), "");
  write("config_sentence_transformers.json",
        {{"prompts", {{"query", "q: "}}}, {"default_prompt_name", "passage"}});
  auto bad = ReadEmbeddingConfig(dir, 0);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("default_prompt_name"), std::string::npos);
  write("config_sentence_transformers.json", prompts);

  // Matryoshka: is_matryoshka allows any size, matryoshka_dimensions those listed.
  auto config = nlohmann::json::parse(*ReadFile(dir + "/config.json"));
  config["is_matryoshka"] = true;
  write("config.json", config);
  auto any = ReadEmbeddingConfig(dir, 0);
  ASSERT_TRUE(any.ok()) << any.status().message();
  EXPECT_TRUE(CheckDimensions(*any, 16, 3).ok());
  EXPECT_FALSE(CheckDimensions(*any, 16, 0).ok());
  EXPECT_FALSE(CheckDimensions(*any, 16, 17).ok());
  config["matryoshka_dimensions"] = {16, 8, 4};
  write("config.json", config);
  auto listed = ReadEmbeddingConfig(dir, 0);
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(CheckDimensions(*listed, 16, 8).ok());
  Status three = CheckDimensions(*listed, 16, 3);
  ASSERT_FALSE(three.ok());
  EXPECT_NE(three.message().find("16, 8, 4"), std::string::npos);
  config["matryoshka_dimensions"] = "8";
  write("config.json", config);
  EXPECT_FALSE(ReadEmbeddingConfig(dir, 0).ok());
}

// A decoder's last hidden state for embeddings (Runner::Hidden's layers + 1) is the one its head
// reads: the tied head over it gives the logits.
TEST_F(EncoderTest, DecoderFinalNormedHiddenFeedsTheHead) {
  auto model = Model::Load("models/tiny-chat", Cpu());
  ASSERT_TRUE(model.ok()) << model.status().message();
  const Arch& a = (*model)->arch();
  ASSERT_TRUE(a.tied_head);
  const std::vector<int32_t> ids = {5, 900, 31, 4000, 77};
  const int final_normed[] = {a.layers + 1};
  auto hidden = SequenceHidden(**model, ids, final_normed);
  ASSERT_TRUE(hidden.ok()) << hidden.status().message();
  auto logits = SequenceLogits(**model, ids);
  ASSERT_TRUE(logits.ok());
  auto checkpoint = Checkpoint::Open("models/tiny-chat");
  ASSERT_TRUE(checkpoint.ok());
  const TensorInfo* table = checkpoint->Find("model.embed_tokens.weight");
  ASSERT_NE(table, nullptr);
  const int64_t n = static_cast<int64_t>(ids.size());
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t v : {int64_t{0}, int64_t{17}, int64_t{5000}, a.vocab - 1}) {
      double dot = 0;
      for (int64_t i = 0; i < a.dim; ++i) {
        uint16_t h;
        std::memcpy(&h, table->data + 2 * (v * a.dim + i), 2);
        dot += static_cast<double>((*hidden)[r * a.dim + i]) * Bf16ToF32(h);
      }
      EXPECT_NEAR(dot, (*logits)[r * a.vocab + v], 1e-3 * (1 + std::fabs(dot))) << r << " " << v;
    }
  }
  // Without the final norm (layers) the same dot products differ.
  const int last[] = {a.layers};
  auto raw = SequenceHidden(**model, ids, last);
  ASSERT_TRUE(raw.ok());
  EXPECT_NE(*raw, *hidden);
  const int beyond[] = {a.layers + 2};
  EXPECT_FALSE(SequenceHidden(**model, ids, beyond).ok());
}

// A decoder reranker (Qwen3-Reranker): the pair in its prompt, then softmax over the last
// position's [no, yes] logits, against the same logits from SequenceLogits by hand. The model:
// the random tiny Qwen3 of tests/golden/encoders/qwen3_last, whose vocabulary has no "yes" and
// "no": config.json's classifier_from_token names two of its tokens instead.
TEST_F(EncoderTest, DecoderRerankerScoresWithItsYesNoLogits) {
  const std::string from = "tests/golden/encoders/qwen3_last";
  const std::string dir = (fs::path(::testing::TempDir()) / "decoder_reranker").string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const char* f : {"model.safetensors", "tokenizer.json", "tokenizer_config.json"}) {
    fs::copy_file(from + "/" + f, dir + "/" + f);
  }
  // Its tokenizer has no chat tokens: the prompt takes 184 tokens, so more positions.
  auto config = nlohmann::json::parse(*ReadFile(from + "/config.json"));
  config["max_position_embeddings"] = 512;
  std::ofstream(dir + "/config.json") << config.dump();
  {
    // Without classifier_from_token: embeds, and cannot rerank without "yes" and "no".
    auto plain = EmbeddingModel::Load(dir, Cpu());
    ASSERT_TRUE(plain.ok()) << plain.status().message();
    EXPECT_FALSE((*plain)->reranks());
    Status s = (*plain)->RerankByYesNo();
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("no token \"no\""), std::string::npos) << s.message();
  }
  config["classifier_from_token"] = {"Ġthe", "Ġand"};
  std::ofstream(dir + "/config.json") << config.dump();
  auto model = EmbeddingModel::Load(dir, Cpu());
  ASSERT_TRUE(model.ok()) << model.status().message();
  ASSERT_TRUE((*model)->reranks());
  auto decoder = Model::Load(dir, Cpu());
  ASSERT_TRUE(decoder.ok());
  const Tokenizer& tok = (*model)->tokenizer();
  const int32_t no = tok.TokenId("Ġthe"), yes = tok.TokenId("Ġand");
  ASSERT_GE(no, 0);
  ASSERT_GE(yes, 0);
  const std::string query = "Where is the capital of France?";
  const std::vector<std::string> documents = {"Paris is the capital of France.",
                                              "The quick brown fox.", "a"};
  // The prompt, as Qwen3-Reranker's model card builds it.
  auto prefix = tok.Encode(
      "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
      "and the Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>"
      "\n<|im_start|>user\n");
  auto suffix = tok.Encode("<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  ASSERT_TRUE(prefix.ok() && suffix.ok());
  std::vector<Encoding> pairs;
  std::vector<float> want;
  for (const std::string& d : documents) {
    auto body = tok.Encode("<Instruct>: " + std::string(EmbeddingModel::kRerankInstruction) +
                               "\n<Query>: " + query + "\n<Document>: " + d,
                           /*add_special=*/true);
    ASSERT_TRUE(body.ok());
    std::vector<int32_t> ids = *prefix;
    ids.insert(ids.end(), body->begin(), body->end());
    ids.insert(ids.end(), suffix->begin(), suffix->end());
    auto e = (*model)->TokenizePair(query, d);
    ASSERT_TRUE(e.ok()) << e.status().message();
    EXPECT_EQ(e->ids, ids) << d;
    EXPECT_EQ(e->types, std::vector<int32_t>(ids.size(), 0));
    pairs.push_back(std::move(e).value());
    // By hand: every position's logits, the last row's [no, yes] under a softmax.
    auto logits = SequenceLogits(**decoder, ids);
    ASSERT_TRUE(logits.ok());
    const float* last = logits->data() + (ids.size() - 1) * (*decoder)->arch().vocab;
    const double e_no = std::exp(static_cast<double>(last[no]));
    const double e_yes = std::exp(static_cast<double>(last[yes]));
    want.push_back(static_cast<float>(e_yes / (e_no + e_yes)));
  }
  auto got = (*model)->Score(pairs);
  ASSERT_TRUE(got.ok()) << got.status().message();
  ASSERT_EQ(got->size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR((*got)[i], want[i], 1e-6) << i;
  EXPECT_NE((*got)[0], (*got)[1]);
  // A document longer than the model's 512 positions is cut at its end; the prompt's end stays.
  std::string long_document;
  for (int i = 0; i < 200; ++i) long_document += " the capital of France";
  auto cut = (*model)->TokenizePair(query, long_document);
  ASSERT_TRUE(cut.ok());
  EXPECT_EQ(static_cast<int64_t>(cut->ids.size()), (*model)->max_tokens());
  EXPECT_TRUE(std::equal(suffix->rbegin(), suffix->rend(), cut->ids.rbegin()));
  auto long_score = (*model)->Score(std::span<const Encoding>(&*cut, 1));
  ASSERT_TRUE(long_score.ok()) << long_score.status().message();
}

TEST(PoolTest, ClsMeanLastTokenAndNormalize) {
  // Two sequences of dim 2: rows {1,2},{3,4},{5,6} and {0,0}.
  const std::vector<float> hidden = {1, 2, 3, 4, 5, 6, 0, 0};
  const std::vector<int32_t> starts = {0, 3, 4};
  std::vector<float> out(4);
  Pool(hidden, 2, starts, Pooling::kCls, false, out.data());
  EXPECT_EQ(out, (std::vector<float>{1, 2, 0, 0}));
  Pool(hidden, 2, starts, Pooling::kMean, false, out.data());
  EXPECT_EQ(out, (std::vector<float>{3, 4, 0, 0}));
  Pool(hidden, 2, starts, Pooling::kLastToken, false, out.data());
  EXPECT_EQ(out, (std::vector<float>{5, 6, 0, 0}));
  Pool(hidden, 2, starts, Pooling::kMean, true, out.data());
  EXPECT_FLOAT_EQ(out[0], 0.6f);
  EXPECT_FLOAT_EQ(out[1], 0.8f);
  EXPECT_EQ(out[2], 0.0f);  // a zero vector stays zero
}

}  // namespace
}  // namespace gizllm
