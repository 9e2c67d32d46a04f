// convert from a GGUF file: tiny-chat (and the golden Llama, whose q/k rows the converter
// permutes) written by the tests' GGUF writer (tests/gguf_from_hf.h) in F32, Q8_0 and Q4_0 and
// converted with the block types kept gives the GGUF file's logits bit for bit, and its
// tokenizer's ids and chat template; with bits, the logits of the same conversion of the
// dequantized folder; the inputs convert refuses are named.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "core/thread_pool.h"
#include "formats/safetensors.h"
#include "gguf_from_hf.h"
#include "gguf_qwen35_from_hf.h"
#include "gguf_writer.h"
#include "jobs/convert.h"
#include "model/config.h"
#include "model/evaluate.h"
#include "model/model.h"
#include "quant/linear_io.h"
#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace gizllm::quant {
namespace {

namespace fs = std::filesystem;
using testing::GgufLinears;
using testing::GgufWriter;
using testing::WriteGgufFromHf;

class ConvertGgufTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("gizllm_convert_gguf_test_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  std::string Path(const std::string& name) const { return (root_ / name).string(); }

  // Converts `from` into `to`: its block types kept, or quantized to `bits`.
  void Convert(const std::string& from, const std::string& to, const std::string& bits = "") {
    ConvertOptions options;
    options.from = from;
    options.to = to;
    options.keep_types = bits.empty();
    if (!bits.empty()) options.bits = *ParseBits(bits);
    options.pool = &pool_;
    auto summary = quant::Convert(options);
    ASSERT_TRUE(summary.ok()) << summary.status().message();
  }

  std::unique_ptr<Model> Load(const std::string& path) {
    auto model = Model::Load(path, std::make_shared<CpuBackend>(&pool_, CpuOptions{}));
    EXPECT_TRUE(model.ok()) << model.status().message();
    return model.ok() ? std::move(*model) : nullptr;
  }

  std::vector<float> Logits(const std::string& path) {
    std::unique_ptr<Model> model = Load(path);
    if (!model) return {};
    std::mt19937 rng(5);
    std::vector<int32_t> ids(29);
    for (int32_t& id : ids) id = static_cast<int32_t>(rng() % model->arch().vocab);
    auto logits = SequenceLogits(*model, ids);
    EXPECT_TRUE(logits.ok()) << logits.status().message();
    return logits.ok() ? *logits : std::vector<float>{};
  }

  // Bit for bit.
  void ExpectSameLogits(const std::string& want_path, const std::string& got_path) {
    const std::vector<float> want = Logits(want_path);
    const std::vector<float> got = Logits(got_path);
    ASSERT_FALSE(want.empty());
    ASSERT_EQ(got.size(), want.size());
    size_t differ = 0;
    for (size_t i = 0; i < got.size(); ++i) differ += std::memcmp(&got[i], &want[i], 4) != 0;
    EXPECT_EQ(differ, 0u) << "of " << got.size() << " logits";
  }

  // The formats `info` shows for each matrix of the model at `path`, by name.
  std::map<std::string, std::string> MatrixFormats(const std::string& path) {
    std::map<std::string, std::string> formats;
    std::unique_ptr<Model> model = Load(path);
    if (!model) return formats;
    for (const WeightSummary& w : model->weights()) {
      if (w.shape.size() == 2) formats[w.name] = w.format;
    }
    return formats;
  }

  fs::path root_;
  ThreadPool pool_{2};
};

TEST_F(ConvertGgufTest, KeptBlockTypesGiveTheGgufLogits) {
  struct Case {
    const char* dir;
    GgufLinears linears;
    const char* type;  // of the matrices in the converted folder, as `info` shows it
  };
  for (const Case& c : {Case{"models/tiny-chat", GgufLinears::kF32, "f32"},
                        Case{"models/tiny-chat", GgufLinears::kQ8_0, "Q8_0"},
                        Case{"models/tiny-chat", GgufLinears::kQ4_0, "Q4_0"},
                        Case{"tests/golden/models/llama", GgufLinears::kQ8_0, "Q8_0"},
                        Case{"tests/golden/models/qwen3_moe", GgufLinears::kQ8_0, "Q8_0"},
                        // Gemma 3's norms (1 + w in the file) come back as the folder's w.
                        Case{"tests/golden/models/gemma3", GgufLinears::kQ8_0, "Q8_0"}}) {
    SCOPED_TRACE(std::string(c.dir) + " " + c.type);
    const std::string gguf = Path(std::string(c.type) + ".gguf");
    const std::string dir = Path(std::string(c.type) + "-" + fs::path(c.dir).filename().string());
    ASSERT_TRUE(WriteGgufFromHf(c.dir, gguf, c.linears).ok());
    Convert(gguf, dir);
    ExpectSameLogits(gguf, dir);
    // Every matrix of tiny-chat (rows of 384 and 1,152 inputs) holds whole blocks: all keep the
    // file's type, the embedding too, and the folder has the same matrices as the file.
    const auto want = MatrixFormats(gguf);
    const auto got = MatrixFormats(dir);
    EXPECT_EQ(got, want);
    if (std::string(c.dir) == "models/tiny-chat") {
      for (const auto& [name, format] : got) EXPECT_EQ(format, c.type) << name;
    }
    // The embedding is stored in its blocks, described as the loader reads it.
    auto ckpt = Checkpoint::Open(dir);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status().message();
    const TensorInfo* embed = ckpt->Find("model.embed_tokens.weight");
    ASSERT_NE(embed, nullptr);
    const bool blocks = c.linears != GgufLinears::kF32;
    EXPECT_EQ(embed->dtype, blocks ? DType::kU8 : DType::kF32);
    EXPECT_EQ(ckpt->metadata().count(std::string(kLinearKeyPrefix) + embed->name),
              blocks ? 1u : 0u);
  }
}

// A Qwen3.5-MoE file (the shipped tiny hybrid, written as llama.cpp's converter writes it): the
// folder keeps every block (its MTP layer's too) and gives the file's logits.
TEST_F(ConvertGgufTest, Qwen35KeepsItsBlocks) {
  const std::string gguf = Path("hybrid.gguf"), dir = Path("hybrid");
  ASSERT_TRUE(testing::WriteQwen35GgufFromHf("models/tiny-hybrid", gguf, GgufLinears::kQ8_0).ok());
  Convert(gguf, dir);
  ExpectSameLogits(gguf, dir);
  EXPECT_EQ(MatrixFormats(dir), MatrixFormats(gguf));
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().message();
  const TensorInfo* mtp_k = ckpt->Find("mtp.layers.0.self_attn.k_proj.weight");
  ASSERT_NE(mtp_k, nullptr);
  EXPECT_EQ(mtp_k->dtype, DType::kU8);
}

// A block type the CPU does not read as it is (Q5_0) stays Q5_0 in the folder and becomes F32 at
// its load, as the GGUF file's does: the same logits.
TEST_F(ConvertGgufTest, BlockTypesTheBackendConvertsAtLoad) {
  const std::string gguf = Path("q5_0.gguf");
  ASSERT_TRUE(
      WriteGgufFromHf("models/tiny-chat", gguf, GgufLinears::kBlocks, "qwen2", "", GgmlType::kQ5_0)
          .ok());
  Convert(gguf, Path("q5_0"));
  auto ckpt = Checkpoint::Open(Path("q5_0"));
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().message();
  auto desc =
      ckpt->metadata().find(std::string(kLinearKeyPrefix) + "model.layers.0.mlp.down_proj.weight");
  ASSERT_NE(desc, ckpt->metadata().end());
  EXPECT_NE(desc->second.find("\"Q5_0\""), std::string::npos) << desc->second;
  ExpectSameLogits(gguf, Path("q5_0"));
  for (const auto& [name, format] : MatrixFormats(Path("q5_0"))) EXPECT_EQ(format, "f32") << name;
}

TEST_F(ConvertGgufTest, TokenizerTemplateAndConfigComeFromTheMetadata) {
  const std::string gguf = Path("tiny-chat.gguf");
  ASSERT_TRUE(WriteGgufFromHf("models/tiny-chat", gguf, GgufLinears::kQ8_0).ok());
  Convert(gguf, Path("folder"));
  const std::string dir = Path("folder");
  for (const char* file : {"config.json", "tokenizer.json", "tokenizer_config.json"}) {
    EXPECT_TRUE(fs::exists(dir + "/" + file)) << file;
  }
  auto want = Tokenizer::Load(gguf);
  auto got = Tokenizer::Load(dir);
  ASSERT_TRUE(want.ok()) << want.status().message();
  ASSERT_TRUE(got.ok()) << got.status().message();
  for (const char* text : {"Hello, world! 12345 naïve café", "<|im_start|>user\nhi<|im_end|>\n",
                           "  spaces\tand\nlines  ", "In the beginning God created"}) {
    for (bool special : {false, true}) {
      auto a = want->Encode(text, special);
      auto b = got->Encode(text, special);
      ASSERT_TRUE(a.ok() && b.ok());
      EXPECT_EQ(*b, *a) << text;
      EXPECT_FALSE(a->empty());
    }
  }
  auto want_template = ChatTemplate::Load(gguf);
  auto got_template = ChatTemplate::Load(dir);
  ASSERT_TRUE(want_template.ok()) << want_template.status().message();
  ASSERT_TRUE(got_template.ok()) << got_template.status().message();
  EXPECT_EQ(got_template->source(), want_template->source());
  EXPECT_EQ(got_template->eos_token(), want_template->eos_token());
  EXPECT_EQ(got_template->bos_token(), want_template->bos_token());
  nlohmann::ordered_json chat = {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                                 {"add_generation_prompt", true}};
  auto a = want_template->Render(chat);
  auto b = got_template->Render(chat);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*b, *a);
  auto want_arch = ReadArch(gguf);
  auto got_arch = ReadArch(dir);
  ASSERT_TRUE(want_arch.ok() && got_arch.ok()) << got_arch.status().message();
  EXPECT_EQ(got_arch->eos, want_arch->eos);
  EXPECT_EQ(got_arch->bos, want_arch->bos);
  EXPECT_EQ(got_arch->tied_head, want_arch->tied_head);
  EXPECT_EQ(got_arch->rope.InvFreq(), want_arch->rope.InvFreq());
}

// With bits the linears are quantized from the file's values, as the Hugging Face path quantizes
// a folder of those values: the same logits (the embedding keeps its Q8_0 blocks, whose rows the
// lookup reads as the same floats).
TEST_F(ConvertGgufTest, BitsQuantizeTheDequantizedWeights) {
  const std::string gguf = Path("tiny-chat.gguf");
  ASSERT_TRUE(
      WriteGgufFromHf("models/tiny-chat", gguf, GgufLinears::kQ8_0, "qwen2", Path("dequantized"))
          .ok());
  Convert(gguf, Path("from-gguf"), "8");
  Convert(Path("dequantized"), Path("from-folder"), "8");
  ExpectSameLogits(Path("from-folder"), Path("from-gguf"));
  const auto formats = MatrixFormats(Path("from-gguf"));
  EXPECT_EQ(formats.at("model.layers.0.mlp.up_proj.weight"), "q8");
  EXPECT_EQ(formats.at("lm_head.weight"), "q8");
  EXPECT_EQ(formats.at("model.embed_tokens.weight"), "Q8_0");
}

// An error naming `parts` (the file and the field).
void ExpectRefused(const ConvertOptions& options, const std::vector<std::string>& parts) {
  auto summary = Convert(options);
  ASSERT_FALSE(summary.ok()) << options.from;
  for (const std::string& p : parts) {
    EXPECT_NE(summary.status().message().find(p), std::string::npos)
        << "'" << p << "' not in: " << summary.status().message();
  }
  EXPECT_FALSE(fs::exists(options.to)) << options.to;
}

TEST_F(ConvertGgufTest, RefusesBadInputs) {
  ConvertOptions options;
  options.keep_types = true;
  options.to = Path("out");
  {
    options.from = Path("text.gguf");
    std::ofstream(options.from) << "not a model\n";
    ExpectRefused(options, {options.from});
  }
  {
    options.from = Path("model.bin");
    std::ofstream(options.from) << "GGUF";
    ExpectRefused(options, {options.from, ".gguf"});
  }
  {
    GgufWriter w;
    w.String("general.architecture", "phi3");
    w.Uint32("phi3.block_count", 1);
    options.from = Path("phi3.gguf");
    ASSERT_TRUE(w.Write(options.from));
    ExpectRefused(options, {options.from, "general.architecture", "\"phi3\""});
  }
  {
    options.from = Path("tiny-chat.gguf");
    ASSERT_TRUE(WriteGgufFromHf("models/tiny-chat", options.from, GgufLinears::kQ8_0).ok());
    const std::string file = Path("a-file");
    std::ofstream(file) << "x";
    ConvertOptions to_file = options;
    to_file.to = file;
    auto summary = quant::Convert(to_file);
    ASSERT_FALSE(summary.ok());
    EXPECT_NE(summary.status().message().find(file + " exists and is a file"), std::string::npos)
        << summary.status().message();
    ConvertOptions lora = options;
    lora.lora = Path("adapter");
    ExpectRefused(lora, {"--lora", options.from, "--bits"});
  }
  {
    options.from = "models/tiny-chat";  // a folder: no block types to keep
    ExpectRefused(options, {"models/tiny-chat", "--bits"});
  }
}

}  // namespace
}  // namespace gizllm::quant
