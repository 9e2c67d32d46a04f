// bitgpu folders (model/bitgpu_model.h): a Q1_0 GGUF file of tiny-chat written by the tests'
// writer (tests/gguf_from_hf.h) becomes a folder with convert's `manifest`, which loads with the
// file's logits bit for bit and its tokenizer's ids; the tables are the converter's; manifests
// with hostile fields are refused, naming manifest.json and the field.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "core/dtype.h"
#include "core/mapped_file.h"
#include "core/thread_pool.h"
#include "gguf_from_hf.h"
#include "jobs/convert.h"
#include "model/bitgpu_model.h"
#include "model/config.h"
#include "model/evaluate.h"
#include "model/model.h"
#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace gizllm::quant {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::GgufLinears;
using testing::WriteGgufFromHf;

class BitgpuFolderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("gizllm_bitgpu_folder_test_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
    gguf_ = Path("bonsai-tiny.gguf");
    ASSERT_TRUE(WriteGgufFromHf("models/tiny-chat", gguf_, GgufLinears::kBlocks, "qwen2", "",
                                GgmlType::kQ1_0)
                    .ok());
  }
  void TearDown() override { fs::remove_all(root_); }

  std::string Path(const std::string& name) const { return (root_ / name).string(); }

  Expected<ConvertSummary> WriteFolder(const std::string& to) {
    ConvertOptions options;
    options.from = gguf_;
    options.to = to;
    options.keep_types = true;
    options.manifest = true;
    return Convert(options);
  }

  Expected<std::unique_ptr<Model>> Load(const std::string& path) {
    return Model::Load(path, std::make_shared<CpuBackend>(&pool_, CpuOptions{}));
  }

  std::vector<float> Logits(const std::string& path) {
    auto model = Load(path);
    EXPECT_TRUE(model.ok()) << model.status().message();
    if (!model.ok()) return {};
    std::mt19937 rng(3);
    std::vector<int32_t> ids(23);
    for (int32_t& id : ids) id = static_cast<int32_t>(rng() % (*model)->arch().vocab);
    auto logits = SequenceLogits(**model, ids);
    EXPECT_TRUE(logits.ok()) << logits.status().message();
    return logits.ok() ? *logits : std::vector<float>{};
  }

  fs::path root_;
  std::string gguf_;
  ThreadPool pool_{2};
};

TEST_F(BitgpuFolderTest, ConvertedFolderGivesTheGgufLogits) {
  const std::string dir = Path("folder");
  auto summary = WriteFolder(dir);
  ASSERT_TRUE(summary.ok()) << summary.status().message();
  EXPECT_TRUE(IsBitgpuFolder(dir));
  // The data file is the GGUF file, byte for byte.
  auto a = ReadFile(gguf_);
  auto b = ReadFile(dir + "/bonsai-tiny.gguf");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(*a == *b);
  auto aux = ReadFile(dir + "/bonsai-tiny.aux.bin");
  ASSERT_TRUE(aux.ok());
  EXPECT_EQ(aux->size(), 512u + 1024u);

  const std::vector<float> want = Logits(gguf_);
  const std::vector<float> got = Logits(dir);
  ASSERT_FALSE(want.empty());
  ASSERT_EQ(got.size(), want.size());
  size_t differ = 0;
  for (size_t i = 0; i < got.size(); ++i) differ += std::memcmp(&got[i], &want[i], 4) != 0;
  EXPECT_EQ(differ, 0u) << "of " << got.size() << " logits";

  auto model = Load(dir);
  ASSERT_TRUE(model.ok());
  int q1 = 0;
  for (const WeightSummary& w : (*model)->weights()) q1 += w.format == "Q1_0";
  EXPECT_EQ(q1, 1 + 7 * (*model)->arch().layers) << "the embedding and every linear";

  auto want_tokens = Tokenizer::Load(gguf_);
  auto got_tokens = Tokenizer::Load(dir);
  ASSERT_TRUE(want_tokens.ok() && got_tokens.ok()) << got_tokens.status().message();
  const char* text = "Hello, world! <|im_start|>user 12345 naïve café";
  EXPECT_EQ(*got_tokens->Encode(text, true), *want_tokens->Encode(text, true));
  auto arch = ReadArch(dir);
  auto gguf_arch = ReadArch(gguf_);
  ASSERT_TRUE(arch.ok() && gguf_arch.ok()) << arch.status().message();
  EXPECT_EQ(arch->eos.front(), gguf_arch->eos.front());
  EXPECT_EQ(arch->rope.InvFreq(), gguf_arch->rope.InvFreq());
  EXPECT_EQ(arch->norm_eps, gguf_arch->norm_eps);
}

// A folder as bitgpu's own converter leaves it (manifest, aux file and the GGUF file alone) reads
// its tokenizer and chat template from the data file's metadata.
TEST_F(BitgpuFolderTest, TokenizerFromTheDataFile) {
  const std::string dir = Path("bare");
  ASSERT_TRUE(WriteFolder(dir).ok());
  fs::remove(dir + "/tokenizer.json");
  fs::remove(dir + "/tokenizer_config.json");
  auto want = Tokenizer::Load(gguf_);
  auto got = Tokenizer::Load(dir);
  ASSERT_TRUE(want.ok()) << want.status().message();
  ASSERT_TRUE(got.ok()) << got.status().message();
  const char* text = "<|im_start|>user\nHello, world! 12345<|im_end|>";
  EXPECT_EQ(*got->Encode(text, true), *want->Encode(text, true));
  auto want_template = ChatTemplate::Load(gguf_);
  auto got_template = ChatTemplate::Load(dir);
  ASSERT_TRUE(want_template.ok() && got_template.ok()) << got_template.status().message();
  EXPECT_EQ(got_template->source(), want_template->source());
  EXPECT_FALSE(got_template->source().empty());
}

// A version-1 folder of the same model with every quantized tensor planar, as ONNX exports hold
// them (sign bytes, f32 scales, zero points at the midpoints), in a data file of its own: the
// linears and the head load as unrotated q1 linears, the embedding as float32, the same values as
// the file's Q1_0 blocks; the CPU's q1 kernels sum in another order than its Q1_0 kernels.
TEST_F(BitgpuFolderTest, PlanarVersion1FolderGivesTheSameValues) {
  const std::string v2 = Path("v2");
  ASSERT_TRUE(WriteFolder(v2).ok());
  auto text = ReadFile(v2 + "/manifest.json");
  auto gguf = ReadFile(gguf_);
  ASSERT_TRUE(text.ok() && gguf.ok());
  json manifest = json::parse(*text);
  std::string data;
  auto append = [&](const std::string& bytes, const char* dtype, std::vector<int64_t> shape) {
    while (data.size() % 8 != 0) data.push_back('\0');
    json ref = {{"dtype", dtype},
                {"shape", shape},
                {"src", "data"},
                {"off", data.size()},
                {"len", bytes.size()}};
    data += bytes;
    return ref;
  };
  json planar = json::object();
  json embed_weight, embed_scales;
  for (auto& [name, t] : manifest["tensors"].items()) {
    const json& w = t["weight"];
    const std::string region = gguf->substr(w["off"].get<size_t>(), w["len"].get<size_t>());
    if (t["kind"] == "f32") {
      planar[name] = {{"kind", "f32"}, {"weight", append(region, "FLOAT", w["shape"])}};
      continue;
    }
    const bool q4 = t["kind"] == "q4";
    const int64_t rows = q4 ? t["rows"].get<int64_t>() : t["N"].get<int64_t>();
    const int64_t cols = q4 ? t["cols"].get<int64_t>() : t["K"].get<int64_t>();
    std::string signs, scales;
    for (size_t b = 0; b < region.size(); b += 18) {
      uint16_t h;
      std::memcpy(&h, region.data() + b, 2);
      const float f = F16ToF32(h);
      scales.append(reinterpret_cast<const char*>(&f), 4);
      signs.append(region, b + 2, 16);
    }
    json entry = t;
    entry.erase("container");
    const int64_t groups = rows * (cols / 128);
    if (name == "lm_head") {  // the embedding's sign bytes and scales, zero points of its own
      entry["weight"] = embed_weight;
      entry["scales"] = embed_scales;
      entry["zp"] = append(std::string(groups / 4, '\xaa'), "UINT8", {groups / 4});
    } else {
      entry["weight"] = append(signs, "UINT8", {rows, cols / 8});
      entry["scales"] = append(scales, "FLOAT", {rows, cols / 128});
      if (q4) {
        entry["zp"] = append(std::string(groups / 2, '\x88'), "UINT8", {groups / 2});
        embed_weight = entry["weight"];
        embed_scales = entry["scales"];
      }
    }
    planar[name] = entry;
  }
  const std::string dir = Path("v1");
  fs::create_directories(dir);
  fs::copy_file(v2 + "/bonsai-tiny.aux.bin", dir + "/bonsai-tiny.aux.bin");
  std::ofstream(dir + "/planar.bin", std::ios::binary) << data;
  manifest["version"] = 1;
  manifest["data_file"] = "planar.bin";
  manifest["tensors"] = planar;
  std::ofstream(dir + "/manifest.json") << manifest.dump(1);

  auto model = Load(dir);
  ASSERT_TRUE(model.ok()) << model.status().message();
  std::map<std::string, int> formats;
  for (const WeightSummary& w : (*model)->weights()) ++formats[w.format];
  EXPECT_EQ(formats["q1"], 7 * (*model)->arch().layers + 1) << "the linears and the head";
  EXPECT_FALSE((*model)->arch().tied_head);
  const std::vector<float> want = Logits(gguf_);
  const std::vector<float> got = Logits(dir);
  ASSERT_FALSE(want.empty());
  ASSERT_EQ(got.size(), want.size());
  float most = 0.0f;
  for (size_t i = 0; i < got.size(); ++i) most = std::max(most, std::fabs(got[i] - want[i]));
  EXPECT_LE(most, 1e-4f);

  // Zero points away from the midpoint are refused, naming the field.
  const json& zp = planar["embed_tokens"]["zp"];
  data[zp["off"].get<size_t>() + 5] = '\x89';
  std::ofstream(dir + "/planar.bin", std::ios::binary) << data;
  auto refused = Load(dir);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("tensors.embed_tokens.zp"), std::string::npos)
      << refused.status().message();
}

// The tables from their defining property, as bitgpu's converter writes them: a sign byte's bit j
// is the code of weight j.
TEST(BitgpuTables, CodesOfEachBit) {
  const auto tgt2 = BitgpuTgt2();
  const auto tgt4 = BitgpuTgt4();
  for (int b = 0; b < 256; ++b) {
    for (int j = 0; j < 8; ++j) {
      const int bit = (b >> j) & 1;
      EXPECT_EQ((tgt2[2 * b + j / 4] >> (2 * (j % 4))) & 3, bit ? 3 : 1);
      EXPECT_EQ((tgt4[4 * b + j / 2] >> (4 * (j % 2))) & 15, bit ? 9 : 7);
    }
  }
  EXPECT_EQ(tgt2[2 * 0xff], 0xff);
  EXPECT_EQ(tgt4[0], 0x77);
}

// A manifest changed by `edit` is refused at load with a message holding `parts`.
class HostileManifestTest : public BitgpuFolderTest {
 protected:
  void ExpectRefused(const std::function<void(json&)>& edit,
                     const std::vector<std::string>& parts) {
    const std::string dir = Path("hostile" + std::to_string(++count_));
    auto summary = WriteFolder(dir);
    ASSERT_TRUE(summary.ok()) << summary.status().message();
    auto text = ReadFile(dir + "/manifest.json");
    ASSERT_TRUE(text.ok());
    json manifest = json::parse(*text);
    edit(manifest);
    std::ofstream(dir + "/manifest.json") << manifest.dump();
    auto model = Load(dir);
    ASSERT_FALSE(model.ok()) << parts.front();
    const std::string message = model.status().message();
    EXPECT_NE(message.find(dir), std::string::npos) << message;
    for (const std::string& p : parts) {
      EXPECT_NE(message.find(p), std::string::npos) << "'" << p << "' not in: " << message;
    }
  }
  int count_ = 0;
};

TEST_F(HostileManifestTest, RefusesWhatDoesNotHold) {
  const std::string q = "layers.0.attn.q_proj";
  ExpectRefused([](json& m) { m["version"] = 3; }, {"manifest.json", "version"});
  ExpectRefused([](json& m) { m["data_file"] = "../bonsai-tiny.gguf"; }, {"data_file"});
  ExpectRefused([](json& m) { m["aux_file"] = "missing.bin"; }, {"missing.bin"});
  ExpectRefused([&](json& m) { m["tensors"][q]["weight"]["off"] = uint64_t{1} << 40; },
                {"tensors." + q + ".weight", "past the end"});
  ExpectRefused([&](json& m) { m["tensors"][q]["weight"]["off"] = -5; },
                {"tensors." + q + ".weight.off"});
  ExpectRefused([&](json& m) { m["tensors"][q]["weight"]["len"] = 18; },
                {"tensors." + q + ".weight.len"});
  ExpectRefused(
      [&](json& m) {
        m["tensors"][q]["weight"]["shape"] = {1, 18};
        m["tensors"][q]["weight"]["len"] = 18;
      },
      {"tensors." + q + ".weight", "Q1_0 blocks"});
  ExpectRefused([&](json& m) { m["tensors"][q]["N"] = 7; }, {"tensors." + q, "the arch says"});
  ExpectRefused([&](json& m) { m["tensors"][q]["block"] = 64; }, {"tensors." + q + ".block"});
  ExpectRefused([&](json& m) { m["tensors"][q]["lut"] = "tgt4"; }, {"tensors." + q + ".lut"});
  ExpectRefused([&](json& m) { m["tensors"][q]["kind"] = "q4"; }, {"tensors." + q + ".kind"});
  ExpectRefused([&](json& m) { m["tensors"][q].erase("container"); }, {"tensors." + q, "planar"});
  ExpectRefused([&](json& m) { m["version"] = 1; }, {"tensors.", "container", "version 2"});
  ExpectRefused([&](json& m) { m["tensors"].erase("layers.1.mlp.down_proj"); },
                {"tensors.layers.1.mlp.down_proj", "missing"});
  ExpectRefused([&](json& m) { m["tensors"]["layers.99.attn.q_proj"] = m["tensors"][q]; },
                {"layers.99.attn.q_proj"});
  // A q_proj range that starts inside k_proj's.
  ExpectRefused(
      [&](json& m) {
        auto& k = m["tensors"]["layers.0.attn.k_proj"]["weight"];
        m["tensors"][q]["weight"]["off"] = k["off"].get<uint64_t>() + 18;
      },
      {"overlaps"});
  ExpectRefused([](json& m) { m["tensors"]["lm_head"]["weight"]["off"] = 0; }, {"lm_head"});
  ExpectRefused([](json& m) { m["luts"]["tgt2"]["off"] = 2; }, {"luts.tgt2"});
  ExpectRefused([](json& m) { m["luts"]["tgt4"]["src"] = "data"; }, {"luts.tgt4.src"});
  ExpectRefused([](json& m) { m["arch"]["act"] = "gelu"; }, {"arch.act", "gelu"});
  ExpectRefused([](json& m) { m["arch"]["head_dim"] = 256; }, {"arch.head_dim", "128"});
  ExpectRefused([](json& m) { m["arch"]["layers"] = "two"; }, {"arch.layers"});
  ExpectRefused([](json& m) { m["arch"]["rope"]["rope_type"] = "yarn"; },
                {"arch.rope.rope_type", "yarn"});
  ExpectRefused([](json& m) { m["arch"].erase("rope"); }, {"arch.rope"});
  ExpectRefused(
      [](json& m) {
        auto& w = m["tensors"]["layers.0.input_layernorm"]["weight"];
        w["dtype"] = "UINT8";
        w["len"] = w["len"].get<uint64_t>() / 4;
      },
      {"tensors.layers.0.input_layernorm.weight", "FLOAT"});
}

TEST_F(BitgpuFolderTest, ConvertRefusesWhatIsNotQ1_0) {
  const std::string bf16 = Path("tiny-chat.gguf");
  ASSERT_TRUE(WriteGgufFromHf("models/tiny-chat", bf16, GgufLinears::kAsStored).ok());
  ConvertOptions options;
  options.from = bf16;
  options.to = Path("out");
  options.keep_types = true;
  options.manifest = true;
  auto summary = Convert(options);
  ASSERT_FALSE(summary.ok());
  EXPECT_NE(summary.status().message().find(bf16), std::string::npos);
  EXPECT_NE(summary.status().message().find("blk.0.attn_q.weight"), std::string::npos)
      << summary.status().message();
  EXPECT_NE(summary.status().message().find("Q1_0"), std::string::npos);
  EXPECT_FALSE(fs::exists(options.to));
}

}  // namespace
}  // namespace gizllm::quant
