// GGUF files loaded as models: Hugging Face folders written as llama.cpp's converter writes them
// (tests/gguf_from_hf.h), then the GGUF model's logits against the folder's, bit for bit in
// float32 (the Llama q/k permutation undone, Llama 3's rope factors read back), and the files the
// loader refuses.
#include "model/gguf_model.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <iterator>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "formats/safetensors.h"
#include "gguf_from_hf.h"
#include "gguf_qwen35_from_hf.h"
#include "gguf_writer.h"
#include "model/config.h"
#include "model/evaluate.h"
#include "model/model.h"

namespace gizllm {
namespace {

namespace fs = std::filesystem;
using testing::GgufLinears;
using testing::GgufWriter;
using testing::WriteGgufFromHf;

class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = fs::temp_directory_path() /
            ("gizllm_gguf_model_" + std::to_string(::getpid()) + "_" + std::to_string(rd()));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string File(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

// The block type of the linears a GgufLinears writes (F32 for the float ones).
GgmlType GgufBlockType(GgufLinears linears, GgmlType blocks) {
  if (linears == GgufLinears::kBlocks) return blocks;
  if (linears == GgufLinears::kQ4_0) return GgmlType::kQ4_0;
  return linears == GgufLinears::kQ8_0 ? GgmlType::kQ8_0 : GgmlType::kF32;
}

class GgufModelTest : public ::testing::Test {
 protected:
  std::unique_ptr<Model> Load(const std::string& path) {
    auto model = Model::Load(path, std::make_shared<CpuBackend>(&pool_, CpuOptions{}));
    EXPECT_TRUE(model.ok()) << model.status().message();
    return model.ok() ? std::move(*model) : nullptr;
  }

  std::vector<float> Logits(const std::string& path, std::span<const int32_t> ids) {
    std::unique_ptr<Model> model = Load(path);
    if (!model) return {};
    auto logits = SequenceLogits(*model, ids);
    EXPECT_TRUE(logits.ok()) << logits.status().message();
    return logits.ok() ? *logits : std::vector<float>{};
  }

  // The GGUF of `dir` (written with `linears`) gives the same float32 logits as the folder.
  void ExpectSameLogits(const std::string& dir, GgufLinears linears,
                        GgmlType blocks = GgmlType::kQ8_0, bool fuse_gate_up = false) {
    SCOPED_TRACE(dir + (linears == GgufLinears::kBlocks ? " " + GgmlTypeName(blocks) : "") +
                 " linears " + std::to_string(static_cast<int>(linears)) +
                 (fuse_gate_up ? " fused" : ""));
    TempDir tmp;
    const std::string gguf = tmp.File("model.gguf");
    const std::string dequantized = tmp.File("dequantized");
    // As stored: against the folder itself; F32, F16 and Q8_0: against the same weights in a
    // folder of that type (F32 for Q8_0; the CPU's matmuls of each type sum in their own order).
    // A mixture of experts' router is F32 in the file whatever the folder holds (as the
    // converter writes it): against the values written there too.
    const nlohmann::json config = testing::ReadJsonFile(dir + "/config.json");
    // Gemma 3's file leaves out query_pre_attn_scalar (llama.cpp's scale from head_dim): against
    // the folder whose config says what the file does.
    const bool as_stored = linears == GgufLinears::kAsStored && !config.contains("num_experts") &&
                           !config.contains("num_local_experts") &&
                           config["model_type"] != "gemma3_text";
    const Status written = WriteGgufFromHf(dir, gguf, linears, "qwen2", dequantized, blocks,
                                           fuse_gate_up);
    ASSERT_TRUE(written.ok()) << written.message();
    const std::string reference = as_stored ? dir : dequantized;
    auto arch = ReadArch(reference);
    ASSERT_TRUE(arch.ok()) << arch.status().message();
    std::mt19937 rng(11);
    std::vector<int32_t> ids(37);
    for (int32_t& id : ids) id = static_cast<int32_t>(rng() % arch->vocab);
    const std::vector<float> want = Logits(reference, ids);
    const std::vector<float> got = Logits(gguf, ids);
    ASSERT_EQ(got.size(), want.size());
    ASSERT_FALSE(want.empty());
    size_t differ = 0, finite = 0;
    float most = 0.0f, largest = 0.0f;
    for (size_t i = 0; i < got.size(); ++i) {
      differ += std::memcmp(&got[i], &want[i], 4) != 0;
      finite += std::isfinite(want[i]);
      most = std::max(most, std::fabs(got[i] - want[i]));
      largest = std::max(largest, std::fabs(want[i]));
    }
    EXPECT_EQ(finite, want.size());
    const bool native = linears != GgufLinears::kAsStored &&
                        CpuBackend(&pool_, CpuOptions{})
                            .ReadsGgml(static_cast<uint32_t>(GgufBlockType(linears, blocks)));
    if (native) {
      // Kept in its blocks: the CPU's ggml kernels multiply the same values, summed in another
      // order than the float32 matmuls.
      EXPECT_LE(most, 1e-4f) << "largest logit " << largest;
    } else {
      EXPECT_EQ(differ, 0u) << "of " << got.size() << " logits, most " << most;
    }
  }

  ThreadPool pool_{2};
};

TEST_F(GgufModelTest, ArchOfTinyChat) {
  TempDir tmp;
  const std::string gguf = tmp.File("tiny-chat.gguf");
  ASSERT_TRUE(WriteGgufFromHf("models/tiny-chat", gguf, GgufLinears::kAsStored).ok());
  auto want = ReadArch("models/tiny-chat");
  auto got = ReadArch(gguf);
  ASSERT_TRUE(want.ok() && got.ok()) << got.status().message();
  EXPECT_EQ(got->family, "qwen3");
  EXPECT_EQ(got->vocab, want->vocab);
  EXPECT_EQ(got->dim, want->dim);
  EXPECT_EQ(got->layers, want->layers);
  EXPECT_EQ(got->context, want->context);
  EXPECT_EQ(got->tied_head, want->tied_head);
  EXPECT_EQ(got->eos, want->eos);
  EXPECT_EQ(got->bos, want->bos);
  EXPECT_EQ(got->rope.theta, want->rope.theta);
  const AttentionSpec& a = got->layer[0].attention;
  const AttentionSpec& b = want->layer[0].attention;
  EXPECT_EQ(a.heads, b.heads);
  EXPECT_EQ(a.kv_heads, b.kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.qk_norm, b.qk_norm);
  EXPECT_EQ(got->layer[0].feed_forward.ffn, want->layer[0].feed_forward.ffn);
}

TEST_F(GgufModelTest, TinyChatLogitsEqualTheFolders) {
  ExpectSameLogits("models/tiny-chat", GgufLinears::kAsStored);
}

TEST_F(GgufModelTest, TinyChatF32AndF16LogitsEqualTheFolders) {
  ExpectSameLogits("models/tiny-chat", GgufLinears::kF32);
  ExpectSameLogits("models/tiny-chat", GgufLinears::kF16);
}

// Quantized as llama.cpp quantizes (the embedding too), read in their blocks by the CPU's ggml
// kernels: within 1e-4 of the dequantized folders' logits.
TEST_F(GgufModelTest, Q8_0AndQ4_0LogitsMatchTheDequantizedFolders) {
  for (GgufLinears linears : {GgufLinears::kQ8_0, GgufLinears::kQ4_0}) {
    ExpectSameLogits("models/tiny-chat", linears);
    ExpectSameLogits("tests/golden/models/llama", linears);
  }
}

// Every other block type whose blocks tiny-chat's rows (384 and 1,152 inputs) hold: the file's
// values, converted to F32 at load, give the logits of the same values in a float32 folder (bit
// for bit), or within 1e-4 where the CPU reads the blocks as they are (Q1_0).
TEST_F(GgufModelTest, TinyChatInBlockTypesLogitsEqualTheDequantizedFolders) {
  for (GgmlType t : {GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kIQ4_NL,
                     GgmlType::kQ1_0, GgmlType::kQ2_0}) {
    ExpectSameLogits("models/tiny-chat", GgufLinears::kBlocks, t);
  }
}

void WriteWide(const std::string& dir, const std::string& family) {
  const Status s = testing::WriteWideHf(dir, family);
  ASSERT_TRUE(s.ok()) << s.message();
}

// The 256-element block types (and Q8_0 and Q4_0 with random codes), in a Qwen3 (tied head, q/k
// norms) and a Llama (q/k rows permuted by the converter, its own head): bit for bit where they
// are converted to F32, within 1e-4 where the CPU reads them as they are.
TEST_F(GgufModelTest, WideModelsInKBlockTypesLogitsEqualTheDequantizedFolders) {
  TempDir tmp;
  for (const char* family : {"qwen3", "llama"}) {
    const std::string dir = tmp.File(family);
    WriteWide(dir, family);
    for (GgmlType t : {GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ4_K, GgmlType::kQ5_K,
                       GgmlType::kQ6_K, GgmlType::kIQ4_XS, GgmlType::kTQ1_0, GgmlType::kTQ2_0,
                       GgmlType::kQ8_0, GgmlType::kQ4_0}) {
      ExpectSameLogits(dir, GgufLinears::kBlocks, t);
    }
  }
}

// On the CPU, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, IQ4_XS and Q1_0 matrices (the embedding too) stay in
// their blocks; other types become F32; the norms stay F32.
TEST_F(GgufModelTest, CpuKeepsTheBlockTypesItReads) {
  TempDir tmp;
  const std::string dir = tmp.File("qwen3");
  WriteWide(dir, "qwen3");
  for (GgmlType t :
       {GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kIQ4_XS, GgmlType::kQ1_0, GgmlType::kQ3_K}) {
    const std::string gguf = tmp.File(GgmlTypeName(t) + ".gguf");
    ASSERT_TRUE(WriteGgufFromHf(dir, gguf, GgufLinears::kBlocks, "qwen2", "", t).ok());
    std::unique_ptr<Model> model = Load(gguf);
    ASSERT_NE(model, nullptr);
    const bool kept = t != GgmlType::kQ3_K;
    GgmlBlock block;
    ASSERT_TRUE(GgmlBlockOf(t, &block));
    int matrices = 0;
    for (const WeightSummary& w : model->weights()) {
      if (w.shape.size() != 2) continue;
      ++matrices;
      EXPECT_EQ(w.format, kept ? GgmlTypeName(t) : "f32") << w.name;
      // The file's blocks (144 bytes a block of 256 for Q4_K, 18 a block of 128 for Q1_0), or 4
      // bytes a weight.
      EXPECT_EQ(w.bytes, kept ? w.shape[0] * w.shape[1] / block.elements * block.bytes
                              : w.shape[0] * w.shape[1] * 4)
          << GgmlTypeName(t) << " " << w.name;
    }
    EXPECT_EQ(matrices, 1 + 2 * 7) << "the embedding (the tied head) and 7 linears a layer";
  }
}

// convert drops each tensor's pages once read (Checkpoint::Release): a GGUF model's tensors read
// in place from the mapped file (here Q8_0 linears and F32 norms) read back the same after it
// (faulted in from the file again), and those converted into copies at load (the Q3_K linears,
// made F32) are left as they are.
TEST_F(GgufModelTest, ReleasedTensorsReadBackTheSame) {
  TempDir tmp;
  const std::string dir = tmp.File("qwen3");
  WriteWide(dir, "qwen3");
  for (GgmlType t : {GgmlType::kQ8_0, GgmlType::kQ3_K}) {
    const std::string gguf = tmp.File(GgmlTypeName(t) + ".gguf");
    ASSERT_TRUE(WriteGgufFromHf(dir, gguf, GgufLinears::kBlocks, "qwen2", "", t).ok());
    auto keep = [](GgmlType type) { return type == GgmlType::kQ8_0; };
    auto released = OpenGgufModel(gguf, keep);
    auto kept = OpenGgufModel(gguf, keep);
    ASSERT_TRUE(released.ok() && kept.ok()) << released.status().message();
    int tensors = 0;
    for (const TensorInfo* info : released->checkpoint.All()) {
      const TensorInfo* same = kept->checkpoint.Find(info->name);
      ASSERT_NE(same, nullptr) << info->name;
      ASSERT_EQ(info->bytes, same->bytes) << info->name;
      released->checkpoint.Release(*info);
      EXPECT_EQ(std::memcmp(info->data, same->data, info->bytes), 0)
          << GgmlTypeName(t) << " " << info->name;
      ++tensors;
    }
    EXPECT_GT(tensors, 10) << GgmlTypeName(t);
  }
}

// Llama: q/k rows permuted by the converter, Llama 3's rope as rope_freqs.weight; biases.
TEST_F(GgufModelTest, GoldenFamiliesLogitsEqualTheFolders) {
  for (const char* m : {"llama", "llama_mlp_bias", "qwen2", "qwen3"}) {
    ExpectSameLogits(std::string("tests/golden/models/") + m, GgufLinears::kAsStored);
  }
}

// Qwen3-MoE (qwen3moe): the router, each layer's experts in stacks (gate and up apart, or in
// one stack as the converter's fused option writes them), a dense layer between (layer 1, no
// router). As stored (BF16) bit for bit; Q8_0 and Q4_0 experts read in their blocks by the CPU
// within 1e-4 of the dequantized folder; F32 bit for bit.
TEST_F(GgufModelTest, Qwen3MoeLogitsEqualTheFolders) {
  const std::string dir = "tests/golden/models/qwen3_moe";
  ExpectSameLogits(dir, GgufLinears::kAsStored);
  ExpectSameLogits(dir, GgufLinears::kAsStored, GgmlType::kQ8_0, /*fuse_gate_up=*/true);
  ExpectSameLogits(dir, GgufLinears::kF32);
  ExpectSameLogits(dir, GgufLinears::kQ8_0);
  ExpectSameLogits(dir, GgufLinears::kQ4_0, GgmlType::kQ8_0, /*fuse_gate_up=*/true);
}

TEST_F(GgufModelTest, ArchOfQwen3Moe) {
  TempDir tmp;
  const std::string dir = "tests/golden/models/qwen3_moe";
  const std::string gguf = tmp.File("moe.gguf");
  ASSERT_TRUE(WriteGgufFromHf(dir, gguf, GgufLinears::kQ8_0).ok());
  auto want = ReadArch(dir);
  auto got = ReadArch(gguf);
  ASSERT_TRUE(want.ok() && got.ok()) << got.status().message();
  EXPECT_EQ(got->family, "qwen3_moe");
  ASSERT_EQ(got->layers, want->layers);
  for (int l = 0; l < got->layers; ++l) {
    SCOPED_TRACE(l);
    EXPECT_EQ(got->layer[l].IsMoe(), want->layer[l].IsMoe());
    EXPECT_EQ(got->layer[l].IsMoe(), l != 1);
    EXPECT_EQ(got->layer[l].moe.experts, want->layer[l].moe.experts);
    EXPECT_EQ(got->layer[l].moe.experts_per_token, want->layer[l].moe.experts_per_token);
    EXPECT_EQ(got->layer[l].moe.ffn, want->layer[l].moe.ffn);
    EXPECT_EQ(got->layer[l].moe.norm_topk_prob, want->layer[l].moe.norm_topk_prob);
    EXPECT_EQ(got->layer[l].feed_forward.ffn, want->layer[l].feed_forward.ffn);
  }
  // The experts stay in their blocks on the CPU; the router is float32.
  std::unique_ptr<Model> model = Load(gguf);
  ASSERT_TRUE(model);
  int q8 = 0;
  for (const WeightSummary& w : model->weights()) {
    if (w.name.find(".mlp.gate.weight") != std::string::npos) {
      EXPECT_EQ(w.format, "f32") << w.name;
    }
    q8 += w.name.find(".experts.") != std::string::npos && w.format == "Q8_0";
  }
  EXPECT_EQ(q8, 3 * 8 * 3) << "three layers of 8 experts' gate, up and down";
}

// Gemma 3 (gemma3): its four norms a layer written as 1 + w, q and k norms, sliding layers
// (golden's layer_types as a flag a layer), two rotary tables (linear scaling on the global
// one), the embedding scaled, a final soft-capping in the second folder.
TEST_F(GgufModelTest, Gemma3LogitsEqualTheFolders) {
  for (const char* dir : {"tests/golden/models/gemma3", "tests/golden/models/gemma3_softcap"}) {
    ExpectSameLogits(dir, GgufLinears::kAsStored);
    ExpectSameLogits(dir, GgufLinears::kF32);
    ExpectSameLogits(dir, GgufLinears::kQ8_0);
  }
}

TEST_F(GgufModelTest, ArchOfGemma3) {
  TempDir tmp;
  const std::string dir = "tests/golden/models/gemma3";
  const std::string gguf = tmp.File("gemma3.gguf");
  ASSERT_TRUE(WriteGgufFromHf(dir, gguf, GgufLinears::kAsStored).ok());
  auto want = ReadArch(dir);
  auto got = ReadArch(gguf);
  ASSERT_TRUE(want.ok() && got.ok()) << got.status().message();
  EXPECT_EQ(got->family, "gemma3");
  EXPECT_EQ(got->norm_offset, 1.0f);
  EXPECT_EQ(got->embed_scale, want->embed_scale);
  ASSERT_EQ(got->layers, want->layers);
  ASSERT_EQ(got->ropes.size(), 2u);
  EXPECT_EQ(got->ropes[0].InvFreq(), want->ropes[0].InvFreq());
  EXPECT_EQ(got->ropes[1].InvFreq(), want->ropes[1].InvFreq());
  EXPECT_EQ(got->ropes[0].type, "linear");
  for (int l = 0; l < got->layers; ++l) {
    SCOPED_TRACE(l);
    const AttentionSpec& g = got->layer[l].attention;
    EXPECT_EQ(g.window, want->layer[l].attention.window);
    EXPECT_EQ(g.rope, want->layer[l].attention.rope);
    EXPECT_EQ(g.window > 0, l != 2) << "golden's layer_types: layer 2 is global";
    // llama.cpp's scale: 1/sqrt(head_dim) = 1/sqrt(32) (the folder's query_pre_attn_scalar 24
    // is not in the file).
    EXPECT_FLOAT_EQ(g.scale, 1.0f / std::sqrt(32.0f));
    EXPECT_TRUE(got->layer[l].post_norms);
  }
  // The norms come back as the folder's w (the file's 1 + w less 1), so the loader's 1 + w is
  // the file's value.
  auto m = OpenGgufModel(gguf);
  auto folder = Checkpoint::Open(dir);
  ASSERT_TRUE(m.ok() && folder.ok()) << m.status().message();
  const std::string norm = "model.layers.1.post_feedforward_layernorm.weight";
  const TensorInfo* a = m->checkpoint.Find(norm);
  const TensorInfo* b = folder->Find(norm);
  ASSERT_TRUE(a && b);
  const std::vector<float> va = testing::ToF32(*a), vb = testing::ToF32(*b);
  ASSERT_EQ(va.size(), vb.size());
  for (size_t i = 0; i < va.size(); ++i) EXPECT_EQ(va[i], vb[i]) << i;
}

TEST_F(GgufModelTest, ReadsLlama3RopeFactorsBack) {
  TempDir tmp;
  const std::string gguf = tmp.File("llama.gguf");
  ASSERT_TRUE(WriteGgufFromHf("tests/golden/models/llama", gguf, GgufLinears::kAsStored).ok());
  auto want = ReadArch("tests/golden/models/llama");
  auto got = ReadArch(gguf);
  ASSERT_TRUE(want.ok() && got.ok()) << got.status().message();
  EXPECT_EQ(got->rope.type, "llama3");
  EXPECT_EQ(got->rope.factor, want->rope.factor);
  EXPECT_EQ(got->rope.original_context, want->rope.original_context);
  EXPECT_EQ(got->rope.InvFreq(), want->rope.InvFreq());
}

// A small qwen3 file whose metadata and tensors a test changes.
GgufWriter SmallQwen3(const std::string& architecture = "qwen3", uint32_t layers = 1) {
  GgufWriter w;
  w.String("general.architecture", architecture);
  const std::string p = architecture + ".";
  w.Uint32(p + "block_count", layers);
  w.Uint32(p + "context_length", 64);
  w.Uint32(p + "embedding_length", 32);
  w.Uint32(p + "feed_forward_length", 64);
  w.Uint32(p + "attention.head_count", 2);
  w.Float32(p + "attention.layer_norm_rms_epsilon", 1e-6f);
  w.Tensor("token_embd.weight", GgmlType::kF32, {10, 32}, std::string(10 * 32 * 4, '\0'));
  return w;
}

void ExpectLoadRefused(const GgufWriter& w, StatusCode code,
                       const std::vector<std::string>& parts) {
  TempDir tmp;
  const std::string path = tmp.File("m.gguf");
  ASSERT_TRUE(w.Write(path));
  auto m = OpenGgufModel(path);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), code) << m.status().message();
  EXPECT_NE(m.status().message().find(path), std::string::npos) << m.status().message();
  for (const std::string& p : parts) {
    EXPECT_NE(m.status().message().find(p), std::string::npos)
        << "'" << p << "' not in: " << m.status().message();
  }
}

// Qwen3.5 (qwen35, qwen35moe) as llama.cpp's converter writes it (tests/gguf_qwen35_from_hf.h):
// the value heads tiled, A_log as -exp(A_log), norms as 1 + w, the MTP layer as blk.N with
// nextn.*; against the folder of the values written, within 1e-4 of the largest logit (A_log is
// read back as log(-a), not bit for bit). The shipped tiny hybrid (experts, a shared expert, an
// MTP layer, 2 key and 4 value heads), the golden Qwen3.5-MoE and dense Qwen3.5 (their
// ForConditionalGeneration layouts, value heads of another size than the key heads).
TEST_F(GgufModelTest, Qwen35LogitsEqualTheFolders) {
  for (const char* dir : {"models/tiny-hybrid", "tests/golden/models/qwen3_5_moe",
                          "tests/golden/models/qwen3_5"}) {
    for (GgufLinears linears : {GgufLinears::kAsStored, GgufLinears::kQ8_0}) {
      SCOPED_TRACE(std::string(dir) + " linears " + std::to_string(static_cast<int>(linears)));
      TempDir tmp;
      const std::string gguf = tmp.File("model.gguf"), folder = tmp.File("folder");
      const Status written = testing::WriteQwen35GgufFromHf(dir, gguf, linears, folder);
      ASSERT_TRUE(written.ok()) << written.message();
      auto want_arch = ReadArch(folder);
      auto got_arch = ReadArch(gguf);
      ASSERT_TRUE(want_arch.ok() && got_arch.ok()) << got_arch.status().message();
      ASSERT_EQ(got_arch->layers, want_arch->layers);
      for (int l = 0; l < got_arch->layers; ++l) {
        const LayerSpec& g = got_arch->layer[l];
        const LayerSpec& w = want_arch->layer[l];
        EXPECT_EQ(g.IsRecurrent(), w.IsRecurrent()) << l;
        EXPECT_EQ(g.IsMoe(), w.IsMoe()) << l;
        EXPECT_EQ(g.recurrent.v_dim, w.recurrent.v_dim) << l;
        EXPECT_EQ(g.moe.shared_ffn, w.moe.shared_ffn) << l;
      }
      EXPECT_EQ(got_arch->rope.rotary_dims, want_arch->rope.rotary_dims);
      EXPECT_EQ(got_arch->rope.mrope_section, want_arch->rope.mrope_section);
      std::mt19937 rng(5);
      std::vector<int32_t> ids(29);
      for (int32_t& id : ids) id = static_cast<int32_t>(rng() % want_arch->vocab);
      const std::vector<float> want = Logits(folder, ids);
      const std::vector<float> got = Logits(gguf, ids);
      ASSERT_EQ(got.size(), want.size());
      ASSERT_FALSE(want.empty());
      float most = 0.0f, largest = 0.0f;
      for (size_t i = 0; i < got.size(); ++i) {
        most = std::max(most, std::fabs(got[i] - want[i]));
        largest = std::max(largest, std::fabs(want[i]));
      }
      EXPECT_LE(most, 1e-4f * std::max(1.0f, largest)) << "largest logit " << largest;
      std::unique_ptr<Model> a = Load(gguf), b = Load(folder);
      ASSERT_TRUE(a && b);
      EXPECT_EQ(a->HasMtp(), b->HasMtp());
      EXPECT_EQ(a->MtpParameters(), b->MtpParameters());
      EXPECT_EQ(a->HasMtp(), std::string(dir) == "models/tiny-hybrid");
    }
  }
}

// A Qwen3.5 file whose recurrent tensor has another shape than the layer's sizes is refused
// naming the tensor (the value heads' reorder walks the shape), never read past its bytes.
TEST_F(GgufModelTest, Qwen35RefusesARecurrentTensorOfAnotherShape) {
  TempDir tmp;
  const std::string gguf = tmp.File("model.gguf");
  ASSERT_TRUE(testing::WriteQwen35GgufFromHf("models/tiny-hybrid", gguf, GgufLinears::kAsStored,
                                             "")
                  .ok());
  std::string bytes;
  {
    std::ifstream in(gguf, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  // The tensor info: name, dims (u32), then its dims innermost first: 128 inputs -> 64.
  const std::string name = "blk.0.ssm_out.weight";
  const size_t at = bytes.find(name);
  ASSERT_NE(at, std::string::npos);
  const size_t dim0 = at + name.size() + 4;
  uint64_t cols;
  std::memcpy(&cols, bytes.data() + dim0, 8);
  ASSERT_EQ(cols, 128u);
  cols = 64;
  std::memcpy(bytes.data() + dim0, &cols, 8);
  std::ofstream(gguf, std::ios::binary | std::ios::trunc) << bytes;
  auto m = OpenGgufModel(gguf);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kDataLoss) << m.status().message();
  EXPECT_NE(m.status().message().find(name), std::string::npos) << m.status().message();
}

// What a gemma3 file's metadata makes of its config: the written golden's (layer 2 global,
// llama.cpp's scale from head_dim, the two rotary tables); without a sliding window every layer
// is global; a period of 3 makes every third layer global (llama.cpp's set_swa_pattern), the
// default period 6; a flag list of the wrong length is an error naming the key.
TEST_F(GgufModelTest, Gemma3SlidingPatterns) {
  TempDir tmp;
  const std::string gguf = tmp.File("gemma3.gguf");
  ASSERT_TRUE(WriteGgufFromHf("tests/golden/models/gemma3", gguf, GgufLinears::kAsStored).ok());
  auto config = [](const GgufWriter& w, const std::string& path) -> Expected<nlohmann::json> {
    if (!w.Write(path)) return Internal("cannot write " + path);
    GZ_ASSIGN_OR_RETURN(GgufFile f, GgufFile::Open(path));
    return ReadGgufConfig(f);
  };
  {
    auto file = GgufFile::Open(gguf);
    ASSERT_TRUE(file.ok());
    auto c = ReadGgufConfig(*file);
    ASSERT_TRUE(c.ok()) << c.status().message();
    EXPECT_EQ((*c)["layer_types"], nlohmann::json({"sliding_attention", "sliding_attention",
                                                   "full_attention", "sliding_attention"}));
    EXPECT_EQ((*c)["query_pre_attn_scalar"], 32);
    EXPECT_EQ((*c)["rope_parameters"]["sliding_attention"]["rope_theta"], 10000.0);
    EXPECT_EQ((*c)["rope_parameters"]["full_attention"]["factor"], 2.0);
  }
  const std::string path = tmp.File("small.gguf");
  auto types = [](const std::string& pattern) {  // 'S' sliding, 'F' full
    nlohmann::json t = nlohmann::json::array();
    for (char ch : pattern) t.push_back(ch == 'S' ? "sliding_attention" : "full_attention");
    return t;
  };
  {
    auto c = config(SmallQwen3("gemma3", 7), path);
    ASSERT_TRUE(c.ok()) << c.status().message();
    EXPECT_EQ((*c)["layer_types"], types("FFFFFFF"));
  }
  {
    GgufWriter w = SmallQwen3("gemma3", 7);
    w.Uint32("gemma3.attention.sliding_window", 16);
    auto c = config(w, path);
    ASSERT_TRUE(c.ok()) << c.status().message();
    EXPECT_EQ((*c)["layer_types"], types("SSSSSFS"));
    EXPECT_EQ((*c)["sliding_window"], 16);
  }
  {
    GgufWriter w = SmallQwen3("gemma3", 7);
    w.Uint32("gemma3.attention.sliding_window", 16);
    w.Uint32("gemma3.attention.sliding_window_pattern", 3);
    w.Float32("gemma3.rope.freq_base_swa", 5000.0f);
    auto c = config(w, path);
    ASSERT_TRUE(c.ok()) << c.status().message();
    EXPECT_EQ((*c)["layer_types"], types("SSFSSFS"));
    EXPECT_EQ((*c)["rope_parameters"]["sliding_attention"]["rope_theta"], 5000.0);
  }
  {
    GgufWriter w = SmallQwen3("gemma3", 7);
    w.Uint32("gemma3.attention.sliding_window", 16);
    w.Bools("gemma3.attention.sliding_window_pattern", {true, false});
    auto c = config(w, path);
    ASSERT_FALSE(c.ok());
    EXPECT_NE(c.status().message().find("gemma3.attention.sliding_window_pattern"),
              std::string::npos)
        << c.status().message();
  }
}

TEST_F(GgufModelTest, RefusesWhatItCannotRead) {
  ExpectLoadRefused(SmallQwen3("phi3"), StatusCode::kUnimplemented,
                    {"general.architecture", "\"phi3\""});
  {
    GgufWriter w = SmallQwen3();
    w.Tensor("blk.0.attn_q.weight", GgmlType::kIQ2_XXS, {64, 256}, std::string(64 * 66, '\0'));
    ExpectLoadRefused(w, StatusCode::kUnimplemented, {"blk.0.attn_q.weight", "IQ2_XXS"});
  }
  {
    GgufWriter w = SmallQwen3();
    w.Tensor("blk.0.ffn_gate_exps.weight", GgmlType::kF32, {2}, std::string(8, '\0'));
    ExpectLoadRefused(w, StatusCode::kUnimplemented, {"blk.0.ffn_gate_exps.weight"});
  }
  {
    GgufWriter w = SmallQwen3();
    w.Tensor("blk.1.attn_norm.weight", GgmlType::kF32, {32}, std::string(32 * 4, '\0'));
    ExpectLoadRefused(w, StatusCode::kDataLoss, {"blk.1.attn_norm.weight", "1 layers"});
  }
  {
    GgufWriter w;  // no block count
    w.String("general.architecture", "llama");
    ExpectLoadRefused(w, StatusCode::kNotFound, {"llama.embedding_length"});
  }
  {
    GgufWriter w = SmallQwen3();
    w.String("qwen3.rope.scaling.type", "yarn");
    ExpectLoadRefused(w, StatusCode::kUnimplemented, {"rope.scaling.type", "yarn"});
  }
}

}  // namespace
}  // namespace gizllm
