#include "jobs/convert.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/mapped_file.h"
#include "core/thread_pool.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "jobs/lora.h"
#include "quant/blocks.h"
#include "quant/layout.h"
#include "quant/linear_io.h"
#include "quant/quantize.h"

namespace gizllm::quant {
namespace {

namespace fs = std::filesystem;

// A two-layer Qwen3-shaped model with random bf16 weights, written as a Hugging Face folder.
class ConvertTest : public ::testing::Test {
 protected:
  static constexpr int kLayers = 2, kDim = 128, kFfn = 256, kVocab = 96, kHeadDim = 64;

  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("gizllm_convert_test_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_ / "hf");
    nlohmann::json config = {{"architectures", {"Qwen3ForCausalLM"}},
                             {"model_type", "qwen3"},
                             {"hidden_size", kDim},
                             {"intermediate_size", kFfn},
                             {"num_hidden_layers", kLayers},
                             {"num_attention_heads", 2},
                             {"num_key_value_heads", 1},
                             {"head_dim", kHeadDim},
                             {"vocab_size", kVocab},
                             {"rms_norm_eps", 1e-6},
                             {"rope_theta", 10000.0},
                             {"max_position_embeddings", 256},
                             {"tie_word_embeddings", true},
                             {"eos_token_id", 2}};
    WriteText(root_ / "hf/config.json", config.dump());
    WriteText(root_ / "hf/tokenizer.json", "{\"model\": {}}");
    std::mt19937 rng(12);
    Add("model.embed_tokens.weight", {kVocab, kDim}, rng);
    Add("model.norm.weight", {kDim}, rng);
    for (int l = 0; l < kLayers; ++l) {
      std::string p = "model.layers." + std::to_string(l) + ".";
      Add(p + "input_layernorm.weight", {kDim}, rng);
      Add(p + "post_attention_layernorm.weight", {kDim}, rng);
      Add(p + "self_attn.q_proj.weight", {2 * kHeadDim, kDim}, rng);
      Add(p + "self_attn.k_proj.weight", {kHeadDim, kDim}, rng);
      Add(p + "self_attn.v_proj.weight", {kHeadDim, kDim}, rng);
      Add(p + "self_attn.o_proj.weight", {kDim, 2 * kHeadDim}, rng);
      Add(p + "self_attn.q_norm.weight", {kHeadDim}, rng);
      Add(p + "self_attn.k_norm.weight", {kHeadDim}, rng);
      Add(p + "mlp.gate_proj.weight", {kFfn, kDim}, rng);
      Add(p + "mlp.up_proj.weight", {kFfn, kDim}, rng);
      Add(p + "mlp.down_proj.weight", {kDim, kFfn}, rng);
    }
    WriteSource();
  }

  // (Re)writes hf/model.safetensors from source_.
  void WriteSource() {
    std::vector<TensorToWrite> tensors;
    for (auto& [name, t] : source_) {
      tensors.push_back({name, DType::kBF16, t.shape, t.bf16.data(), t.bf16.size() * 2});
    }
    ASSERT_TRUE(WriteSafetensors((root_ / "hf/model.safetensors").string(), tensors, {}).ok());
  }
  void TearDown() override { fs::remove_all(root_); }

  static void WriteText(const fs::path& path, const std::string& text) {
    std::ofstream(path) << text;
  }

  void Add(const std::string& name, std::vector<int64_t> shape, std::mt19937& rng) {
    std::normal_distribution<float> dist(0.0f, 0.05f);
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    Source& s = source_[name];
    s.shape = shape;
    for (int64_t i = 0; i < n; ++i) {
      s.bf16.push_back(F32ToBf16(dist(rng)));
      s.f32.push_back(Bf16ToF32(s.bf16.back()));
    }
  }

  ConvertOptions Options(const std::string& bits, const std::string& to) {
    ConvertOptions o;
    o.from = (root_ / "hf").string();
    o.to = (root_ / to).string();
    o.bits = *ParseBits(bits);
    return o;
  }

  // Relative squared error of a converted linear against its source.
  double Error(const Checkpoint& ckpt, const std::string& name, const std::vector<float>& want) {
    auto w = ReadLinear(ckpt, name);
    EXPECT_TRUE(w.ok()) << w.status().message();
    if (!w.ok()) return 1e9;
    std::vector<float> got(w->rows * w->cols);
    if (IsQuantized(w->format)) {
      DequantizeOriginal(*w, got.data());
    } else {
      for (size_t i = 0; i < got.size(); ++i) {
        uint16_t h;
        std::memcpy(&h, static_cast<const uint8_t*>(w->data) + 2 * i, 2);
        got[i] = Bf16ToF32(h);
      }
    }
    double err = 0.0, energy = 0.0;
    for (size_t i = 0; i < got.size(); ++i) {
      err += (got[i] - want[i]) * (got[i] - want[i]);
      energy += want[i] * want[i];
    }
    return err / energy;
  }

  struct Source {
    std::vector<int64_t> shape;
    std::vector<uint16_t> bf16;
    std::vector<float> f32;
  };
  fs::path root_;
  std::map<std::string, Source> source_;
};

TEST_F(ConvertTest, QuantizesLinearsAndUntiesAQuantizedHead) {
  ConvertOptions o = Options("4/8", "out");
  int64_t calls = 0, last_total = 0;
  o.progress = [&](int64_t done, int64_t total, const std::string&) {
    ++calls;
    EXPECT_EQ(done, calls);
    last_total = total;
  };
  auto summary = Convert(o);
  ASSERT_TRUE(summary.ok()) << summary.status().message();
  EXPECT_EQ(calls, last_total);
  EXPECT_FALSE(fs::exists(o.to + ".partial"));
  EXPECT_TRUE(fs::exists(o.to + "/tokenizer.json"));
  EXPECT_EQ(summary->quantized, kLayers * 7 + 1);
  EXPECT_EQ(summary->bytes, static_cast<int64_t>(fs::file_size(o.to + "/model.safetensors") +
                                                 fs::file_size(o.to + "/tokenizer.json") +
                                                 fs::file_size(o.to + "/config.json")));

  auto ckpt = Checkpoint::Open(o.to);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().message();
  EXPECT_EQ(ckpt->metadata().at(kBitsKey), "4/8");
  EXPECT_EQ(ckpt->metadata().at(kFormatVersionKey), "1");
  auto q = ReadLinear(*ckpt, "model.layers.1.mlp.down_proj.weight");
  ASSERT_TRUE(q.ok()) << q.status().message();
  EXPECT_EQ(q->format, Format::kQ4);
  EXPECT_TRUE(q->rotated);
  EXPECT_EQ(q->rotation_seed, kDefaultRotationSeed);
  EXPECT_NE(q->zeros, nullptr);
  EXPECT_EQ(q->rows, kDim);
  EXPECT_EQ(q->cols, kFfn);
  EXPECT_LT(Error(*ckpt, "model.layers.1.mlp.down_proj.weight",
                  source_["model.layers.1.mlp.down_proj.weight"].f32),
            0.02);
  auto head = ReadLinear(*ckpt, "lm_head.weight");
  ASSERT_TRUE(head.ok()) << head.status().message();
  EXPECT_EQ(head->format, Format::kQ8);
  EXPECT_LT(Error(*ckpt, "lm_head.weight", source_["model.embed_tokens.weight"].f32), 1e-4);
  // The embedding as the source holds it; vectors as f32.
  const TensorInfo* embed = ckpt->Find("model.embed_tokens.weight");
  ASSERT_NE(embed, nullptr);
  EXPECT_EQ(embed->dtype, DType::kBF16);
  EXPECT_EQ(
      std::memcmp(embed->data, source_["model.embed_tokens.weight"].bf16.data(), embed->bytes), 0);
  const TensorInfo* norm = ckpt->Find("model.layers.0.self_attn.q_norm.weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->dtype, DType::kF32);
  auto config = nlohmann::json::parse(*ReadFile(o.to + "/config.json"));
  EXPECT_EQ(config["tie_word_embeddings"], false);
}

TEST_F(ConvertTest, RotationOffAndSixteenBits) {
  ConvertOptions o = Options("2/16", "out");
  o.rotate = false;
  ASSERT_TRUE(Convert(o).ok());
  auto ckpt = Checkpoint::Open(o.to);
  ASSERT_TRUE(ckpt.ok());
  auto q = ReadLinear(*ckpt, "model.layers.0.self_attn.q_proj.weight");
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->format, Format::kQ2);
  EXPECT_FALSE(q->rotated);
  EXPECT_EQ(ckpt->metadata().count(kRotationSeedKey), 0u);
  // A 16-bit head of a tied model stays tied.
  EXPECT_EQ(ckpt->Find("lm_head.weight"), nullptr);
  auto config = nlohmann::json::parse(*ReadFile(o.to + "/config.json"));
  EXPECT_EQ(config["tie_word_embeddings"], true);
}

// --bits b4/b8: gizllm's blocks, described as kept ggml blocks are, the v projections and the
// head in GZ8, the others GZ4, not rotated; their values those of QuantizeOwnBlocks.
TEST_F(ConvertTest, OwnBlocks) {
  ConvertOptions o = Options("b4/b8", "out");
  o.rotate = true;  // ignored: the blocks are not rotated
  auto summary = Convert(o);
  ASSERT_TRUE(summary.ok()) << summary.status().message();
  EXPECT_EQ(summary->quantized, kLayers * 7 + 1);
  auto ckpt = Checkpoint::Open(o.to);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().message();
  EXPECT_EQ(ckpt->metadata().at(kBitsKey), "b4/b8");
  EXPECT_EQ(ckpt->metadata().count(kRotationSeedKey), 0u);
  for (int l = 0; l < kLayers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    for (const char* linear : {"self_attn.q_proj.weight", "self_attn.k_proj.weight",
                               "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                               "mlp.gate_proj.weight", "mlp.up_proj.weight",
                               "mlp.down_proj.weight"}) {
      const std::string name = p + linear;
      auto w = ReadLinear(*ckpt, name);
      ASSERT_TRUE(w.ok()) << w.status().message();
      EXPECT_EQ(w->format, Format::kGgml) << name;
      const bool v = std::string(linear) == "self_attn.v_proj.weight";
      EXPECT_EQ(w->ggml_type, static_cast<uint32_t>(v ? GgmlType::kGZ8 : GgmlType::kGZ4)) << name;
      // The bytes are the quantizer's of the source values.
      const Source& src = source_[name];
      auto want = QuantizeOwnBlocks(v ? GgmlType::kGZ8 : GgmlType::kGZ4, src.f32.data(),
                                    src.shape[0], src.shape[1]);
      ASSERT_TRUE(want.ok());
      ASSERT_EQ(w->Bytes(), static_cast<int64_t>(want->size())) << name;
      EXPECT_EQ(std::memcmp(w->data, want->data(), want->size()), 0) << name;
    }
  }
  auto head = ReadLinear(*ckpt, "lm_head.weight");
  ASSERT_TRUE(head.ok()) << head.status().message();
  EXPECT_EQ(head->ggml_type, static_cast<uint32_t>(GgmlType::kGZ8));

  EXPECT_EQ(ParseBits("b8")->head, 8);
  EXPECT_TRUE(ParseBits("b8")->blocks);
  EXPECT_TRUE(ParseBits("b4/16")->blocks);
  EXPECT_EQ(BitsString(*ParseBits("b4/16")), "b4/16");
  EXPECT_FALSE(ParseBits("4/8")->blocks);
  for (const char* bad : {"b4/8", "8/b8", "b2", "b16x", "b"}) {
    auto b = ParseBits(bad);
    EXPECT_FALSE(b.ok()) << bad;
    if (!b.ok()) EXPECT_NE(b.status().message().find(bad), std::string::npos) << b.status().message();
  }
  o = Options("b4/b8", "calibrated");
  o.calibrate = true;
  auto refused = Convert(o);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("--calibration"), std::string::npos);
}

TEST_F(ConvertTest, CutModelKeepsTheFirstLayers) {
  ConvertOptions o = Options("8", "cut");
  o.layers = 1;
  ASSERT_TRUE(Convert(o).ok());
  auto ckpt = Checkpoint::Open(o.to);
  ASSERT_TRUE(ckpt.ok());
  EXPECT_NE(ckpt->Find("model.layers.0.mlp.up_proj.weight"), nullptr);
  EXPECT_EQ(ckpt->Find("model.layers.1.mlp.up_proj.weight"), nullptr);
  EXPECT_EQ(ckpt->Find("model.layers.1.input_layernorm.weight"), nullptr);
  EXPECT_EQ(ckpt->Find("model.norm.weight"), nullptr);
  EXPECT_EQ(ckpt->Find("lm_head.weight"), nullptr);
  EXPECT_EQ(ckpt->metadata().at(kLayersKey), "1");
}

TEST_F(ConvertTest, MergesLoraAdapters) {
  for (bool rslora : {false, true}) {
    const int r = 4;
    fs::path adapter = root_ / ("adapter" + std::to_string(rslora));
    fs::create_directories(adapter);
    nlohmann::json config = {{"r", r},
                             {"lora_alpha", 8},
                             {"use_rslora", rslora},
                             {"target_modules", {"q_proj", "down_proj"}}};
    WriteText(adapter / "adapter_config.json", config.dump());
    std::mt19937 rng(13);
    std::normal_distribution<float> dist(0.0f, 0.1f);
    std::vector<float> a(r * kDim), b(2 * kHeadDim * r);
    for (float& v : a) v = dist(rng);
    for (float& v : b) v = dist(rng);
    const std::string module = "base_model.model.model.layers.1.self_attn.q_proj";
    std::vector<TensorToWrite> tensors = {
        {module + ".lora_A.weight", DType::kF32, {r, kDim}, a.data(), a.size() * 4},
        {module + ".lora_B.weight", DType::kF32, {2 * kHeadDim, r}, b.data(), b.size() * 4}};
    ASSERT_TRUE(
        WriteSafetensors((adapter / "adapter_model.safetensors").string(), tensors, {}).ok());

    ConvertOptions o = Options("16", "merged" + std::to_string(rslora));
    o.lora = adapter.string();
    auto summary = Convert(o);
    ASSERT_TRUE(summary.ok()) << summary.status().message();
    EXPECT_EQ(summary->lora_merged, 1);
    const double scale = rslora ? 8.0 / 2.0 : 8.0 / r;
    const std::string name = "model.layers.1.self_attn.q_proj.weight";
    std::vector<float> want = source_[name].f32;
    for (int i = 0; i < 2 * kHeadDim; ++i) {
      for (int j = 0; j < kDim; ++j) {
        double d = 0.0;
        for (int k = 0; k < r; ++k) d += b[i * r + k] * a[k * kDim + j];
        want[i * kDim + j] += static_cast<float>(scale * d);
      }
    }
    auto ckpt = Checkpoint::Open(o.to);
    ASSERT_TRUE(ckpt.ok());
    // bf16 rounding of the merged weight only.
    EXPECT_LT(Error(*ckpt, name, want), 1e-4);
    EXPECT_GT(Error(*ckpt, name, source_[name].f32), 1e-2);
  }
}

TEST_F(ConvertTest, RejectsBadRequests) {
  EXPECT_FALSE(ParseBits("3").ok());
  EXPECT_FALSE(ParseBits("4/5").ok());
  EXPECT_EQ(ParseBits("4")->head, 4);
  ConvertOptions o = Options("4", "out");
  fs::create_directories(o.to);
  Status exists = Convert(o).status();
  EXPECT_FALSE(exists.ok());
  EXPECT_NE(exists.message().find("exists"), std::string::npos) << exists.message();
  o = Options("4", "out2");
  o.layers = 5;
  EXPECT_FALSE(Convert(o).ok());
  o.layers = -1;
  o.lora = (root_ / "missing").string();
  Status missing = Convert(o).status();
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("adapter_config.json"), std::string::npos) << missing.message();
  EXPECT_FALSE(fs::exists(o.to));
}

// Every tensor convert reads is checked: a NaN or an infinity is refused with the tensor's name
// and where in it, whatever convert would do with the tensor (quantize, keep as bf16, widen to
// float32, copy).
TEST_F(ConvertTest, RefusesNonFiniteWeights) {
  struct Case {
    std::string name;
    int64_t element;
    float value;
    std::string bits, expected;
  };
  const Case cases[] = {
      {"model.layers.1.mlp.up_proj.weight", 300, NAN, "4",
       "tensor model.layers.1.mlp.up_proj.weight holds NaN at element 300 (row 2, column 44)"},
      {"model.layers.0.self_attn.v_proj.weight", 0, INFINITY, "16", "holds +inf at element 0"},
      {"model.layers.1.self_attn.k_norm.weight", 63, -INFINITY, "8",
       "tensor model.layers.1.self_attn.k_norm.weight holds -inf at element 63"},
      {"model.embed_tokens.weight", 5, NAN, "8/16", "tensor model.embed_tokens.weight holds NaN"},
  };
  for (const Case& c : cases) {
    const uint16_t kept = source_[c.name].bf16[c.element];
    source_[c.name].bf16[c.element] = F32ToBf16(c.value);
    WriteSource();
    ConvertOptions o = Options(c.bits, "out");
    Status s = Convert(o).status();
    EXPECT_FALSE(s.ok()) << c.name;
    EXPECT_NE(s.message().find(c.expected), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("hf/model.safetensors"), std::string::npos) << s.message();
    EXPECT_FALSE(fs::exists(o.to));
    source_[c.name].bf16[c.element] = kept;
  }
  WriteSource();
  EXPECT_TRUE(Convert(Options("4", "out")).ok());
}

// A tensor with the right number of elements but the wrong shape: convert refuses it with the
// loader's message (model/config.h's CheckTensorShape).
TEST_F(ConvertTest, RefusesAWrongShape) {
  source_["model.layers.1.self_attn.k_proj.weight"].shape = {kDim, kHeadDim};
  WriteSource();
  Status s = Convert(Options("4", "out")).status();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("hf/model.safetensors: tensor model.layers.1.self_attn.k_proj.weight "
                             "has shape [128, 64], expected [64, 128]"),
            std::string::npos)
      << s.message();
  source_["model.layers.1.self_attn.k_proj.weight"].shape = {kHeadDim, kDim};
  source_["model.norm.weight"].shape = {1, kDim};
  WriteSource();
  s = Convert(Options("16", "out")).status();
  EXPECT_NE(s.message().find("tensor model.norm.weight has shape [1, 128], expected [128]"),
            std::string::npos)
      << s.message();
}

TEST_F(ConvertTest, ReadLinearRejectsMismatchedDescriptions) {
  std::vector<uint8_t> codes(4 * 64, 0);
  std::vector<float> scales(4, 1.0f);
  std::vector<TensorToWrite> tensors = {
      {"w", DType::kU8, {4, 64}, codes.data(), codes.size()},
      {"w.scales", DType::kF32, {4, 1}, scales.data(), scales.size() * 4}};
  const std::string path = (root_ / "q.safetensors").string();
  auto write = [&](const std::string& desc) {
    ASSERT_TRUE(
        WriteSafetensors(path, tensors, {{"gizllm.linear:w", desc}, {kRotationSeedKey, "7"}}).ok());
  };
  write(R"({"format": "q4", "rows": 4, "cols": 128, "group": 128, "rotated": true})");
  auto ok = ReadLinear(*Checkpoint::Open(path), "w");
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->rotation_seed, 7u);
  write(R"({"format": "q8", "rows": 4, "cols": 128, "group": 128, "rotated": true})");
  EXPECT_FALSE(ReadLinear(*Checkpoint::Open(path), "w").ok());
  write(R"({"format": "q4", "rows": 4, "cols": 128, "group": 64, "rotated": true})");
  EXPECT_FALSE(ReadLinear(*Checkpoint::Open(path), "w").ok());
  write(R"({"format": "q4", "rows": 4})");
  EXPECT_FALSE(ReadLinear(*Checkpoint::Open(path), "w").ok());
  EXPECT_FALSE(ReadLinear(*Checkpoint::Open(path), "absent").ok());
}

}  // namespace
}  // namespace gizllm::quant

namespace gizllm::quant {
namespace {

// A mixture-of-experts config over a checkpoint without its experts is refused, naming the first
// missing expert (convert_moe_test converts real ones).
TEST_F(ConvertTest, MissingExpertsAreNamed) {
  nlohmann::json config = nlohmann::json::parse(*ReadFile((root_ / "hf/config.json").string()));
  config["architectures"] = {"Qwen3MoeForCausalLM"};
  config["model_type"] = "qwen3_moe";
  config["num_experts"] = 4;
  config["num_experts_per_tok"] = 2;
  config["moe_intermediate_size"] = 64;
  WriteText(root_ / "hf/config.json", config.dump());
  Status s = Convert(Options("4", "out")).status();
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.message();
  EXPECT_NE(s.message().find("tensor model.layers.0.mlp.experts.0.down_proj.weight is missing"),
            std::string::npos)
      << s.message();
  EXPECT_FALSE(fs::exists(root_ / "out"));
}

// A config with recurrent layers (Qwen3.5) over a checkpoint without them is refused, naming the
// first missing projection.
TEST_F(ConvertTest, MissingRecurrentProjectionsAreNamed) {
  nlohmann::json config = nlohmann::json::parse(*ReadFile((root_ / "hf/config.json").string()));
  config["architectures"] = {"Qwen3_5ForCausalLM"};
  config["model_type"] = "qwen3_5_text";
  config["full_attention_interval"] = 2;
  WriteText(root_ / "hf/config.json", config.dump());
  Status s = Convert(Options("4", "out")).status();
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.message();
  EXPECT_NE(s.message().find("tensor model.layers.0.linear_attn."), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("is missing"), std::string::npos) << s.message();
  EXPECT_FALSE(fs::exists(root_ / "out"));
}

// Reading and checking a tensor split over threads gives what one thread gives: the same floats
// of each dtype and of ggml blocks, and the same first bad element named.
TEST(ConvertReadTest, SplitReadsAndChecksEqualOneThreads) {
  ThreadPool pool(4);
  const int64_t rows = 1024, cols = 1152;  // 1.2 M elements: split
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  std::vector<float> w(rows * cols);
  for (float& x : w) x = dist(rng);
  std::vector<uint16_t> bf16(w.size()), f16(w.size());
  for (size_t i = 0; i < w.size(); ++i) bf16[i] = F32ToBf16(w[i]), f16[i] = F32ToF16(w[i]);
  auto q8_or = QuantizeOwnBlocks(GgmlType::kQ8_0, w.data(), rows, cols, nullptr);
  ASSERT_TRUE(q8_or.ok()) << q8_or.status().message();
  const std::vector<uint8_t>& q8 = *q8_or;
  struct Case {
    DType dtype;
    const void* data;
    size_t bytes;
    int32_t ggml;
  };
  const Case cases[] = {{DType::kF32, w.data(), w.size() * 4, -1},
                        {DType::kBF16, bf16.data(), bf16.size() * 2, -1},
                        {DType::kF16, f16.data(), f16.size() * 2, -1},
                        {DType::kU8, q8.data(), q8.size(), static_cast<int32_t>(GgmlType::kQ8_0)}};
  for (const Case& c : cases) {
    TensorInfo t;
    t.file = "f";
    t.name = "t";
    t.dtype = c.dtype;
    t.shape = {rows, cols};
    t.data = static_cast<const uint8_t*>(c.data);
    t.bytes = c.bytes;
    t.ggml_type = c.ggml;
    std::vector<float> one(w.size()), split(w.size());
    ASSERT_TRUE(ReadFloatsInto(t, one.data()).ok());
    ASSERT_TRUE(ReadFloatsInto(t, split.data(), &pool).ok());
    EXPECT_EQ(std::memcmp(one.data(), split.data(), one.size() * 4), 0) << DTypeName(c.dtype);
    if (c.ggml >= 0) {
      t.bytes -= 1;  // not whole blocks: the one-thread read's error
      EXPECT_EQ(ReadFloatsInto(t, split.data(), &pool).message(),
                ReadFloatsInto(t, one.data()).message());
      continue;
    }
    EXPECT_TRUE(CheckFinite(t, &pool).ok());
  }
  // Bad elements in several of the threads' ranges: the first is named.
  for (int64_t first : {int64_t{7}, int64_t{600000}, rows * cols - 1}) {
    std::vector<float> bad = w;
    bad[first] = NAN;
    if (first + 1000 < rows * cols) bad[first + 1000] = INFINITY;
    bad[rows * cols - 1] = -INFINITY;
    TensorInfo t;
    t.file = "f";
    t.name = "t";
    t.dtype = DType::kF32;
    t.shape = {rows, cols};
    t.data = reinterpret_cast<const uint8_t*>(bad.data());
    t.bytes = bad.size() * 4;
    const Status one = CheckFinite(t), split = CheckFinite(t, &pool);
    EXPECT_FALSE(split.ok());
    EXPECT_EQ(split.message(), one.message());
    EXPECT_NE(split.message().find("at element " + std::to_string(first)), std::string::npos)
        << split.message();
  }
}

}  // namespace
}  // namespace gizllm::quant
