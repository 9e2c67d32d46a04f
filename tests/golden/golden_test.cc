// The forward pass against Hugging Face transformers' float32 references (tools/make_golden.py
// and models/tiny-chat/reference.safetensors): logits within 1e-4 of the largest reference
// logit, hidden states likewise, and greedy tokens equal token for token.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <numeric>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_isa.h"
#include "core/mapped_file.h"
#include "core/thread_pool.h"
#include "formats/safetensors.h"
#include "model/evaluate.h"
#include "model/model.h"
#include "ops/device.h"
#include "tests/golden/golden_util.h"

namespace gizllm {
namespace {

std::unique_ptr<Model> LoadModel(const std::string& dir, int threads = 2, bool exact = true) {
  DeviceOptions device;
  device.exact = exact;  // float32 activations (the reference mode) unless the default is tested
  device.device = "cpu";
  device.threads = threads;
  auto backend = OpenBackend(device);
  EXPECT_TRUE(backend.ok()) << backend.status().message();
  auto model = Model::Load(dir, *backend);
  EXPECT_TRUE(model.ok()) << model.status().message();
  return model.ok() ? std::move(*model) : nullptr;
}

using golden::ReadFloats;
using golden::ReadIds;

void ExpectClose(const std::vector<float>& ours, const std::vector<float>& ref,
                 const std::string& what) {
  golden::ExpectClose(ours, ref, 1e-4f, what);
}

// Every case of `reference` (ids<i>, logits<i>), read in steps of each of `chunks` rows (later
// steps must read the keys earlier ones wrote), within `tolerance` of the largest logit.
void CheckLogits(Model& model, const std::string& what, const std::string& reference,
                 float tolerance, std::initializer_list<int64_t> chunks, float uncap = 0) {
  auto ref = SafetensorsFile::Open(reference);
  ASSERT_TRUE(ref.ok()) << ref.status().message();
  int cases = 0;
  for (int i = 0;; ++i) {
    const TensorInfo* ids = ref->Find("ids" + std::to_string(i));
    const TensorInfo* logits = ref->Find("logits" + std::to_string(i));
    if (!ids || !logits) break;
    auto tokens = ReadIds(*ids);
    for (int64_t chunk : chunks) {
      auto ours = SequenceLogits(model, tokens, chunk);
      ASSERT_TRUE(ours.ok()) << ours.status().message();
      const std::string where = what + " case " + std::to_string(i) + " chunk " +
                                std::to_string(chunk);
      if (uncap > 0) {
        golden::ExpectClose(golden::Uncapped(*ours, uncap),
                            golden::Uncapped(ReadFloats(*logits), uncap), tolerance,
                            where + " (before the final cap)");
      } else {
        golden::ExpectClose(*ours, ReadFloats(*logits), tolerance, where);
      }
    }
    ++cases;
  }
  EXPECT_GE(cases, 3) << reference;
}

void CheckReferenceLogits(const std::string& model_dir, const std::string& reference) {
  auto model = LoadModel(model_dir);
  ASSERT_TRUE(model);
  CheckLogits(*model, model_dir, reference, 1e-4f, {256, 5});
}

TEST(Golden, LlamaWithLlama3RopeScaling) {
  CheckReferenceLogits("tests/golden/models/llama",
                       "tests/golden/models/llama/reference.safetensors");
}

TEST(Golden, Qwen2WithBiasesTiedHeadOlderRopeKeys) {
  CheckReferenceLogits("tests/golden/models/qwen2",
                       "tests/golden/models/qwen2/reference.safetensors");
}

TEST(Golden, Qwen3WithQkNorms) {
  CheckReferenceLogits("tests/golden/models/qwen3",
                       "tests/golden/models/qwen3/reference.safetensors");
}

TEST(Golden, LlamaWithMlpAndAttentionBiases) {
  CheckReferenceLogits("tests/golden/models/llama_mlp_bias",
                       "tests/golden/models/llama_mlp_bias/reference.safetensors");
}

// Gemma 3: sliding-window layers (window 8) beside global ones with their own rotary tables, read
// in whole prompts and in steps of 5 and 1 rows that cross the window's edge.
TEST(Golden, Gemma3SlidingAndGlobalLayers) {
  auto model = LoadModel("tests/golden/models/gemma3");
  ASSERT_TRUE(model);
  CheckLogits(*model, "gemma3", "tests/golden/models/gemma3/reference.safetensors", 1e-4f,
              {256, 5, 1});
}

// Head dim 256, window 5, final-logit soft-capping; its config's attn_logit_softcapping is one
// transformers' Gemma 3 does not apply, and neither does the recipe.
TEST(Golden, Gemma3LogitSoftCappingAndHeadDim256) {
  auto model = LoadModel("tests/golden/models/gemma3_softcap");
  ASSERT_TRUE(model);
  CheckLogits(*model, "gemma3_softcap", "tests/golden/models/gemma3_softcap/reference.safetensors",
              1e-4f, {256, 5, 1});
}

// The text model of Gemma3ForConditionalGeneration (config under text_config, tensors under
// model.language_model.); the vision tower's tensors are there and not read.
TEST(Golden, Gemma3ConditionalGenerationTextModel) {
  CheckReferenceLogits("tests/golden/models/gemma3_cond",
                       "tests/golden/models/gemma3_cond/reference.safetensors");
}

// Gemma 2: soft-capped attention scores and logits, every other layer sliding (window 8).
TEST(Golden, Gemma2SoftCappedAttention) {
  auto model = LoadModel("tests/golden/models/gemma2");
  ASSERT_TRUE(model);
  CheckLogits(*model, "gemma2", "tests/golden/models/gemma2/reference.safetensors", 1e-4f,
              {256, 5, 1});
}

// Qwen3-MoE: mixture-of-experts layers (8 experts, 2 a token, renormalized weights) around a
// dense one (mlp_only_layers), read in whole prompts and in steps of 5 and 1 rows. The reference
// is written by tools/make_golden.py on a machine with transformers; until then these skip.
constexpr char kQwen3Moe[] = "tests/golden/models/qwen3_moe";

bool HaveQwen3MoeReference() {
  return std::filesystem::exists(std::string(kQwen3Moe) + "/reference.safetensors");
}

constexpr char kNoQwen3MoeReference[] =
    "tests/golden/models/qwen3_moe is absent: write it with "
    "python3 tools/make_golden.py --out tests/golden/models --families qwen3_moe";

TEST(Golden, Qwen3MoeExpertsAndADenseLayer) {
  if (!HaveQwen3MoeReference()) GTEST_SKIP() << kNoQwen3MoeReference;
  auto model = LoadModel(kQwen3Moe);
  ASSERT_TRUE(model);
  ASSERT_TRUE(model->arch().layer[0].IsMoe());
  ASSERT_FALSE(model->arch().layer[1].IsMoe());
  CheckLogits(*model, "qwen3_moe", std::string(kQwen3Moe) + "/reference.safetensors", 1e-4f,
              {256, 5, 1});
}

TEST(Golden, Qwen3MoeHiddenStatesBeforeFinalNorm) {
  if (!HaveQwen3MoeReference()) GTEST_SKIP() << kNoQwen3MoeReference;
  auto model = LoadModel(kQwen3Moe);
  ASSERT_TRUE(model);
  auto ref = SafetensorsFile::Open(std::string(kQwen3Moe) + "/reference.safetensors");
  ASSERT_TRUE(ref.ok()) << ref.status().message();
  const TensorInfo* hidden = ref->Find("hidden2");
  ASSERT_NE(hidden, nullptr);
  ASSERT_EQ(hidden->shape.size(), 3u);
  const int layers = static_cast<int>(hidden->shape[0]);
  ASSERT_EQ(layers, model->arch().layers + 1);
  std::vector<int> all(layers);
  std::iota(all.begin(), all.end(), 0);
  auto ours = SequenceHidden(*model, ReadIds(*ref->Find("ids2")), all);
  ASSERT_TRUE(ours.ok()) << ours.status().message();
  ExpectClose(*ours, ReadFloats(*hidden), "qwen3_moe hidden states");
}

TEST(Golden, TinyChatReferenceLogits) {
  CheckReferenceLogits("models/tiny-chat", "models/tiny-chat/reference.safetensors");
}

// The CPU's default (its fast path: bf16 activations on AVX-512 BF16, else float32) on the
// shipped model: within 2% of the largest float32 reference logit, in whole prompts and steps of
// 5 and 1 rows.
TEST(Golden, TinyChatDefaultModeWithinTwoPercent) {
  auto model = LoadModel("models/tiny-chat", 2, /*exact=*/false);
  ASSERT_TRUE(model);
  CheckLogits(*model, "tiny-chat default mode", "models/tiny-chat/reference.safetensors", 2e-2f,
              {256, 5, 1});
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
  for (std::string family :
       {"llama", "qwen2", "qwen3", "llama_mlp_bias", "gemma3", "gemma3_softcap", "gemma2"}) {
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

// CpuOptions::bf16_activations: the model's bf16 weights are packed when they load
// (PrepareWeight), and every linear of a step of any size rounds its input to bf16 and multiplies
// exactly (bf16 products, float32 sums), against transformers with each linear's input rounded
// the same way (tools/make_golden.py --bf16-inputs): within 1e-2 of the largest logit. Not 1e-4
// as in float32: two float32 computations that differ in their last bits round a few inputs to
// the neighbouring bf16 value, 2^-8 of it, and these models' initializer range (0.2) amplifies
// each such flip. Measured: at most 0.39%, 0.06% and 0.04% of the largest logit for llama, qwen2
// and qwen3 (0.58%, 0.61% and 0.04% with the earlier dot-product kernels, whose sums ran in
// another order), and inputs perturbed by a few float32 ulps before rounding move qwen2 between
// 0.06% and 0.6% and qwen3 between 0.04% and 0.28%. Unrounded float32 lies 3.5%, 1.5% and 1.2%
// from this reference, so a path that skips or misplaces the rounding fails.
TEST(Golden, Bf16ActivationsMatchTheRoundedReference) {
  if (!CpuHasAvx512Bf16()) GTEST_SKIP() << "this CPU lacks avx512_bf16";
  ThreadPool pool(2);
  // Gemma 3 with soft-capping (head_dim 256, window 5) lands 1.2% from its rounded reference,
  // which itself lies 2.4% from float32: checked at the fast mode's 2e-2, which a path that skips
  // the rounding misses. Soft-capped models compare their logits before the final cap (Uncapped).
  const std::pair<const char*, float> families[] = {
      {"llama", 1e-2f},  {"qwen2", 1e-2f},          {"qwen3", 1e-2f},          {"gemma3", 1e-2f},
      {"gemma2", 1e-2f}, {"gemma3_softcap", 2e-2f}, {"llama_mlp_bias", 1e-2f}};
  for (auto [family, tolerance] : families) {
    std::string dir = std::string("tests/golden/models/") + family;
    auto backend = MakeCpuBackend(&pool, CpuOptions{.isa = std::nullopt, .bf16_activations = true});
    ASSERT_TRUE(backend.ok()) << backend.status().message();
    auto model = Model::Load(dir, std::shared_ptr<Backend>(std::move(*backend)));
    ASSERT_TRUE(model.ok()) << model.status().message();
    CheckLogits(**model, dir + " bf16 activations", dir + "/reference_bf16_inputs.safetensors",
                tolerance, {256, 5, 1}, (*model)->arch().logit_softcap);
  }
}

// dir's model on a CPU backend of 2 threads with KV pages of `kv`.
Expected<std::unique_ptr<Model>> LoadWithKv(const std::string& dir, KvFormat kv) {
  DeviceOptions device;
  device.exact = true;  // float32 activations (the reference mode)
  device.device = "cpu";
  device.threads = 2;
  GZ_ASSIGN_OR_RETURN(std::shared_ptr<Backend> backend, OpenBackend(device));
  LoadOptions options;
  options.kv = kv;
  return Model::Load(dir, backend, options);
}

// Float16 KV pages (LoadOptions::kv): keys and values rounded to float16 as they are written,
// everything else float32, against transformers' float32 logits: within 5e-3 of the largest
// logit. Float16 moves each key and value by up to 2^-11 of itself; measured: 0.04-0.17% of the
// largest logit on the three golden models (their initializer range 0.2 amplifies it) and
// 0.03-0.06% on tiny-chat, the same for every chunking (a step's own rows read their keys back
// from the float16 pages too). The logits must also differ from the float32 pages' ones, so the
// rounding does happen; KvWriteMatchesReference checks it bit for bit.
TEST(Golden, F16KvPagesStayCloseToTheReference) {
  for (std::string dir : {"tests/golden/models/llama", "tests/golden/models/qwen2",
                          "tests/golden/models/qwen3", "models/tiny-chat"}) {
    auto model = LoadWithKv(dir, KvFormat::kF16);
    ASSERT_TRUE(model.ok()) << model.status().message();
    EXPECT_EQ((*model)->PageBytes() * 2, LoadModel(dir)->PageBytes());
    CheckLogits(**model, dir + " f16 KV", dir + "/reference.safetensors", 5e-3f, {256, 5, 1});
    auto ref = SafetensorsFile::Open(dir + "/reference.safetensors");
    ASSERT_TRUE(ref.ok());
    auto f16 = SequenceLogits(**model, ReadIds(*ref->Find("ids1")));
    auto f32 = SequenceLogits(*LoadModel(dir), ReadIds(*ref->Find("ids1")));
    ASSERT_TRUE(f16.ok() && f32.ok());
    EXPECT_NE(*f16, *f32) << dir;
  }
}

// 8-bit pages: each key and value vector in steps of its largest magnitude / 127, so each element
// is up to half a step off. Measured against transformers' float32 logits: 4.5% (llama), 3.5%
// (qwen2), 2.3% (qwen3) of the largest logit on the golden models, whose initializer range 0.2
// amplifies every rounding, and 1.8% on tiny-chat; 1.3-2.9% in norm. Held to 5% and 4%. On
// tiny-chat, a trained model, what decides is the token picked: teacher-forced along
// transformers' greedy answers, the 8-bit pages' top token is transformers' at 162 of 163 steps,
// and the other one 0.12% of the largest logit below it; every step is held to 0.5%.
TEST(Golden, Q8KvPagesStayCloseToTheReference) {
  for (std::string dir : {"tests/golden/models/llama", "tests/golden/models/qwen2",
                          "tests/golden/models/qwen3", "models/tiny-chat"}) {
    auto model = LoadWithKv(dir, KvFormat::kQ8);
    ASSERT_TRUE(model.ok()) << model.status().message();
    // A quarter of float32's bytes, plus a float32 scale per position and kv head.
    const Arch& a = (*model)->arch();
    EXPECT_EQ((*model)->PageBytes() * 4,
              LoadModel(dir)->PageBytes() + 4 * a.layers * 2 * kPage * a.kv_heads * 4);
    CheckLogits(**model, dir + " q8 KV", dir + "/reference.safetensors", 5e-2f, {256, 5, 1});
    auto ref = SafetensorsFile::Open(dir + "/reference.safetensors");
    ASSERT_TRUE(ref.ok());
    for (int i = 0; i < 3; ++i) {
      const std::string n = std::to_string(i);
      auto ours = SequenceLogits(**model, ReadIds(*ref->Find("ids" + n)));
      ASSERT_TRUE(ours.ok());
      golden::ExpectCloseInNorm(*ours, ReadFloats(*ref->Find("logits" + n)), 4e-2,
                                dir + " q8 KV case " + n);
    }
    auto q8 = SequenceLogits(**model, ReadIds(*ref->Find("ids1")));
    auto f32 = SequenceLogits(*LoadModel(dir), ReadIds(*ref->Find("ids1")));
    ASSERT_TRUE(q8.ok() && f32.ok());
    EXPECT_NE(*q8, *f32) << dir;
  }
  // tiny-chat: transformers' greedy answers, teacher-forced; each step's token near the top.
  auto model = LoadWithKv("models/tiny-chat", KvFormat::kQ8);
  ASSERT_TRUE(model.ok()) << model.status().message();
  auto text = ReadFile("tests/golden/tiny_chat_greedy.json");
  ASSERT_TRUE(text.ok());
  const auto cases = nlohmann::json::parse(*text);
  for (const auto& c : cases["cases"]) {
    std::vector<int32_t> prompt = c["prompt_ids"].get<std::vector<int32_t>>();
    std::vector<int32_t> expected = c["output_ids"].get<std::vector<int32_t>>();
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), expected.begin(), expected.end() - 1);
    auto logits = SequenceLogits(**model, all, 256);
    ASSERT_TRUE(logits.ok());
    const int64_t vocab = (*model)->arch().vocab;
    for (size_t i = 0; i < expected.size(); ++i) {
      const float* row = logits->data() + (prompt.size() - 1 + i) * vocab;
      const float best = *std::max_element(row, row + vocab);
      float big = 0;
      for (int64_t v = 0; v < vocab; ++v) big = std::max(big, std::fabs(row[v]));
      EXPECT_LE(best - row[expected[i]], 5e-3f * big)
          << c["prompt"].get<std::string>() << " answer token " << i;
    }
  }
}

// int8 activations (CpuOptions::int8_activations) on tiny-chat converted to 8 bits and to 4/8
// bits, against the same converted folder with float32 activations: the activations into each
// q8 or q4 linear quantized in steps of their group's largest magnitude / 127, half a step off
// at most. Measured (three reference prompts): 1.3-2.5% of the largest logit and 0.8-1.3% in
// norm for 8 bits, 1.6-2.3% and 0.9-1.2% for 4/8. Held to 4% and 2%, for whole prompts, chunks of
// 5 rows and single rows (one-row tiles of eight blocks). (The int8 linears give the same bits
// however rows are batched, Int8ActivationsDoNotDependOnTheBatch; prompt rows' attention, in
// tiles of rows, does not.)
TEST(Golden, ConvertedInt8ActivationsStayCloseToFloat) {
  if (!CpuHasAvx512Vnni()) GTEST_SKIP() << "this CPU lacks avx512_vnni";
  namespace fs = std::filesystem;
  const fs::path root =
      fs::temp_directory_path() / ("gizllm_golden_int8_" + std::to_string(getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  auto ref = SafetensorsFile::Open("models/tiny-chat/reference.safetensors");
  ASSERT_TRUE(ref.ok()) << ref.status().message();
  ThreadPool pool(2);
  for (const char* bits : {"8", "4/8"}) {
    const std::string dir = (root / (std::string("q") + bits[0])).string();
    ASSERT_NO_FATAL_FAILURE(golden::Convert("models/tiny-chat", dir, bits));
    auto float_model = LoadModel(dir);
    ASSERT_TRUE(float_model);
    auto backend = MakeCpuBackend(&pool, CpuOptions{.isa = std::nullopt, .int8_activations = true});
    ASSERT_TRUE(backend.ok()) << backend.status().message();
    auto model = Model::Load(dir, std::shared_ptr<Backend>(std::move(*backend)));
    ASSERT_TRUE(model.ok()) << model.status().message();
    for (int i = 0; i < 3; ++i) {
      const std::vector<int32_t> tokens = ReadIds(*ref->Find("ids" + std::to_string(i)));
      auto want = SequenceLogits(*float_model, tokens);
      ASSERT_TRUE(want.ok());
      for (int64_t chunk : {int64_t{256}, int64_t{5}, int64_t{1}}) {
        auto ours = SequenceLogits(**model, tokens, chunk);
        ASSERT_TRUE(ours.ok()) << ours.status().message();
        const std::string what = std::string("bits ") + bits + " case " + std::to_string(i) +
                                 " chunk " + std::to_string(chunk);
        golden::ExpectClose(*ours, *want, 4e-2f, what);
        golden::ExpectCloseInNorm(*ours, *want, 2e-2, what);
        EXPECT_NE(*ours, *want) << what;  // the activations were quantized
      }
    }
  }
  fs::remove_all(root);
}

// Greedy decoding one token at a time, as an engine would, against transformers' generate().
TEST(Golden, TinyChatGreedyEqualsTransformers) {
  auto model = LoadModel("models/tiny-chat");
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

namespace gizllm {
namespace {

// The hybrids of recurrent (gated delta net) and gated attention layers: qwen3_next (fused
// projections, experts with a gated shared expert around a dense layer), qwen3_5 (the text class,
// dense) and qwen3_5_moe (Qwen3_5MoeForConditionalGeneration: text_config, the vision tower's
// tensors skipped). Prompts of 1, 7 and 100 tokens (longer than the delta rule's chunk of 64),
// read whole and in steps of 5 and 1 rows (the recurrence alone), and the hidden states of the
// 100-token case. The references are written by tools/make_golden.py on a machine with
// transformers; until then these skip.
std::string HybridDir(const std::string& family) { return "tests/golden/models/" + family; }

bool SkipHybrid(const std::string& family) {
  return !std::filesystem::exists(HybridDir(family) + "/reference.safetensors");
}

std::string NoHybridReference(const std::string& family) {
  return HybridDir(family) +
         "/reference.safetensors is absent: write it with python3 tools/make_golden.py --out "
         "tests/golden/models --families qwen3_next qwen3_5 qwen3_5_moe";
}

void CheckHybrid(const std::string& family) {
  auto model = LoadModel(HybridDir(family));
  ASSERT_TRUE(model);
  const Arch& arch = model->arch();
  ASSERT_EQ(arch.layers, 4);
  EXPECT_TRUE(arch.layer[0].IsRecurrent());
  EXPECT_FALSE(arch.layer[1].IsRecurrent());
  EXPECT_TRUE(arch.layer[1].attention.output_gate);
  const std::string reference = HybridDir(family) + "/reference.safetensors";
  CheckLogits(*model, family, reference, 1e-4f, {256, 5, 1});
  auto ref = SafetensorsFile::Open(reference);
  ASSERT_TRUE(ref.ok()) << ref.status().message();
  const TensorInfo* hidden = ref->Find("hidden2");
  ASSERT_NE(hidden, nullptr);
  ASSERT_EQ(hidden->shape.size(), 3u);
  const int layers = static_cast<int>(hidden->shape[0]);
  ASSERT_EQ(layers, arch.layers + 1);
  std::vector<int> all(layers);
  std::iota(all.begin(), all.end(), 0);
  auto ours = SequenceHidden(*model, ReadIds(*ref->Find("ids2")), all);
  ASSERT_TRUE(ours.ok()) << ours.status().message();
  ExpectClose(*ours, ReadFloats(*hidden), family + " hidden states");
}

TEST(Golden, Qwen3NextFusedProjectionsAndSharedExperts) {
  if (SkipHybrid("qwen3_next")) GTEST_SKIP() << NoHybridReference("qwen3_next");
  CheckHybrid("qwen3_next");
}

TEST(Golden, Qwen3_5Dense) {
  if (SkipHybrid("qwen3_5")) GTEST_SKIP() << NoHybridReference("qwen3_5");
  CheckHybrid("qwen3_5");
}

TEST(Golden, Qwen3_5MoeConditionalGenerationTextModel) {
  if (SkipHybrid("qwen3_5_moe")) GTEST_SKIP() << NoHybridReference("qwen3_5_moe");
  CheckHybrid("qwen3_5_moe");
  auto model = LoadModel(HybridDir("qwen3_5_moe"));
  ASSERT_TRUE(model);
  EXPECT_EQ(model->arch().prefixes[0], "model.language_model.");
  EXPECT_GT(model->SkippedTensors(), 0) << "the vision tower's tensors";
}

// models/tiny-hybrid's multi-token prediction layer against transformers' (mtp_logits0 of
// tools/train_tiny_hybrid.py: row t reads token t + 1 and the model's final-normed hidden state
// at t), the whole prompt in one step and row by row (each MTP row then attends to the keys the
// MTP rows before it wrote into the MTP layer's own pages).
constexpr char kTinyHybrid[] = "models/tiny-hybrid";

bool HasMtpReference() {
  auto ref = SafetensorsFile::Open(std::string(kTinyHybrid) + "/reference.safetensors");
  return ref.ok() && ref->Find("mtp_logits0") != nullptr;
}

TEST(Golden, TinyHybridMtpLogitsEqualTransformers) {
  if (!HasMtpReference())
    GTEST_SKIP() << kTinyHybrid << "/reference.safetensors with mtp_logits0 is missing "
                 << "(tools/train_tiny_hybrid.py --measure-only writes it)";
  auto model = LoadModel(kTinyHybrid);
  ASSERT_TRUE(model);
  ASSERT_TRUE(model->HasMtp());
  // The MTP layer's KV pages are one more attention layer's.
  const std::span<const CacheSpec> caches = model->caches();
  ASSERT_EQ(static_cast<int>(caches.size()), model->arch().layers + 1);
  EXPECT_EQ(caches.back().kind, LayerKind::kAttention);
  EXPECT_EQ(model->PageBytes(), 2 * caches.back().PageBytes()) << "two attention layers";
  auto ref = SafetensorsFile::Open(std::string(kTinyHybrid) + "/reference.safetensors");
  ASSERT_TRUE(ref.ok());
  const std::vector<int32_t> ids = ReadIds(*ref->Find("ids0"));
  const std::vector<float> expected = ReadFloats(*ref->Find("mtp_logits0"));
  ASSERT_EQ(expected.size(), (ids.size() - 1) * model->arch().vocab);
  for (int64_t chunk : {256, 1, 2}) {
    auto ours = SequenceMtpLogits(*model, ids, chunk);
    ASSERT_TRUE(ours.ok()) << ours.status().message();
    ExpectClose(*ours, expected, "tiny-hybrid MTP chunk " + std::to_string(chunk));
  }
}

// The chained second draft (tools/train_tiny_hybrid.py's `second`): the row at position t + 1
// reads token t + 2 and the normed output of the MTP row at t, and attends to the MTP rows at
// positions up to t and to itself, as a drafter chains it. Its logits [tokens - 2, vocab] for
// prompt 0, against mtp_chained_logits0 where the reference holds it.
Expected<std::vector<float>> ChainedMtpLogits(Model& model, const std::vector<int32_t>& ids) {
  const int64_t n = static_cast<int64_t>(ids.size());
  const int64_t vocab = model.arch().vocab, dim = model.arch().dim;
  std::vector<int32_t> pages((n + kPage - 1) / kPage);
  std::iota(pages.begin(), pages.end(), 0);
  const PageTables tables{pages.data(), 1, static_cast<int32_t>(pages.size())};
  GZ_RETURN_IF_ERROR(model.AllocatePages(tables.max_pages));
  GZ_RETURN_IF_ERROR(model.Reserve(n, 1, tables.max_pages));
  std::vector<float> hidden(n * dim), normed((n - 1) * dim), logits((n - 2) * vocab);
  Rows rows;
  for (int64_t p = 0; p < n; ++p) rows.Push(ids[p], 0, static_cast<int32_t>(p), false);
  GZ_RETURN_IF_ERROR(model.StepHidden(rows, tables, nullptr, hidden.data()));
  auto first = [&](int64_t begin, int64_t end) {  // the MTP rows at [begin, end)
    rows.Clear();
    for (int64_t p = begin; p < end; ++p) rows.Push(ids[p + 1], 0, static_cast<int32_t>(p), false);
    return model.MtpStep(rows, tables, hidden.data() + begin * dim, normed.data() + begin * dim,
                         nullptr);
  };
  GZ_RETURN_IF_ERROR(first(0, n - 1));
  for (int64_t t = 0; t + 2 < n; ++t) {
    rows.Clear();
    rows.Push(ids[t + 2], 0, static_cast<int32_t>(t + 1), true);
    GZ_RETURN_IF_ERROR(
        model.MtpStep(rows, tables, normed.data() + t * dim, nullptr, logits.data() + t * vocab));
    // The draft's keys at t + 1 give way to the MTP row of the verified position again.
    GZ_RETURN_IF_ERROR(first(t + 1, t + 2));
  }
  return logits;
}

TEST(Golden, TinyHybridChainedMtpDraftEqualsTransformers) {
  auto ref = SafetensorsFile::Open(std::string(kTinyHybrid) + "/reference.safetensors");
  if (!ref.ok() || !ref->Find("mtp_chained_logits0"))
    GTEST_SKIP() << kTinyHybrid << "/reference.safetensors with mtp_chained_logits0 is missing";
  auto model = LoadModel(kTinyHybrid);
  ASSERT_TRUE(model);
  auto ours = ChainedMtpLogits(*model, ReadIds(*ref->Find("ids0")));
  ASSERT_TRUE(ours.ok()) << ours.status().message();
  ExpectClose(*ours, ReadFloats(*ref->Find("mtp_chained_logits0")), "tiny-hybrid chained MTP");
}

// MtpDraft, which reads the hidden states the model kept where it computed them (KeepHidden),
// picks the largest logit of what MtpStep gives from host hidden states: the MTP rows of a
// prompt (each reading its position's hidden state and the next token), then each chained
// draft (reading the MTP row before it).
TEST(Golden, TinyHybridMtpDraftPicksMtpStepsLargestLogits) {
  auto ref = SafetensorsFile::Open(std::string(kTinyHybrid) + "/reference.safetensors");
  ASSERT_TRUE(ref.ok()) << ref.status().message();
  // A chat and transformers' greedy answer to it.
  std::vector<int32_t> ids = ReadIds(*ref->Find("ids0"));
  const std::vector<int32_t> answer = ReadIds(*ref->Find("greedy0"));
  ids.insert(ids.end(), answer.begin(), answer.end());
  auto model = LoadModel(kTinyHybrid);
  ASSERT_TRUE(model);
  const int64_t n = static_cast<int64_t>(ids.size());
  const int64_t vocab = model->arch().vocab;
  auto argmax = [&](const std::vector<float>& logits, int64_t row) {
    const float* r = logits.data() + row * vocab;
    return static_cast<int32_t>(std::max_element(r, r + vocab) - r);
  };
  auto whole = SequenceMtpLogits(*model, ids);
  ASSERT_TRUE(whole.ok()) << whole.status().message();
  auto chained = ChainedMtpLogits(*model, ids);
  ASSERT_TRUE(chained.ok()) << chained.status().message();

  EXPECT_FALSE(model->MtpDraft(Rows{}, PageTables{}, {}, 0, nullptr).ok());  // no KeepHidden
  ASSERT_TRUE(model->KeepHidden().ok());
  std::vector<int32_t> pages((n + kPage - 1) / kPage);
  std::iota(pages.begin(), pages.end(), 0);
  const PageTables tables{pages.data(), 1, static_cast<int32_t>(pages.size())};
  ASSERT_TRUE(model->AllocatePages(tables.max_pages).ok());
  ASSERT_TRUE(model->Reserve(n, 1, tables.max_pages).ok());
  Rows rows;
  for (int64_t p = 0; p < n; ++p) rows.Push(ids[p], 0, static_cast<int32_t>(p), false);
  ASSERT_TRUE(model->Step(rows, tables, nullptr).ok());
  // The prompt's MTP rows, every one wanted (one slot: a wanted row a call).
  auto mtp_rows = [&](int64_t last, Rows* out, std::vector<int32_t>* sources) {
    out->Clear();
    sources->clear();
    for (int64_t p = 0; p <= last; ++p) {
      out->Push(ids[p + 1], 0, static_cast<int32_t>(p), p == last);
      sources->push_back(static_cast<int32_t>(p));
    }
  };
  std::vector<int32_t> sources;
  for (int64_t p = 0; p + 1 < n; ++p) {
    mtp_rows(p, &rows, &sources);
    int32_t pick = -1;
    ASSERT_TRUE(model->MtpDraft(rows, tables, sources, 0, &pick).ok());
    EXPECT_EQ(pick, argmax(*whole, p)) << "row " << p;
  }
  // A source outside the rows the last step read is refused, naming it.
  sources[0] = static_cast<int32_t>(n);
  int32_t pick = -1;
  const Status bad = model->MtpDraft(rows, tables, sources, 0, &pick);
  EXPECT_NE(bad.message().find("source"), std::string::npos) << bad.message();
  // Chained: the row at t + 1 reads token t + 2 and the MTP row at t. Its draft is the token
  // after t + 2 the MTP layer guesses; the chained reference reads the true token t + 2, which
  // a chained draft reads where the first draft was right.
  int64_t compared = 0;
  for (int64_t t = 0; t + 2 < n; ++t) {
    mtp_rows(t, &rows, &sources);
    int32_t two[2] = {-1, -1};
    ASSERT_TRUE(model->MtpDraft(rows, tables, sources, 1, two).ok());
    EXPECT_EQ(two[0], argmax(*whole, t)) << "row " << t;
    if (two[0] != ids[t + 2]) continue;
    EXPECT_EQ(two[1], argmax(*chained, t)) << "chained row " << t;
    ++compared;
  }
  EXPECT_GT(compared, 0);
  // FR-Spec: over the first 1,024 token ids only, the largest of those logits.
  EXPECT_FALSE(model->SetDraftVocab(0).ok());
  EXPECT_FALSE(model->SetDraftVocab(vocab + 1).ok());
  ASSERT_TRUE(model->SetDraftVocab(1024).ok());
  int64_t outside = 0;  // rows whose largest logit is not among the first 1,024 ids
  for (int64_t p = 0; p + 1 < n; ++p) {
    mtp_rows(p, &rows, &sources);
    ASSERT_TRUE(model->MtpDraft(rows, tables, sources, 0, &pick).ok());
    const float* r = whole->data() + p * vocab;
    EXPECT_EQ(pick, static_cast<int32_t>(std::max_element(r, r + 1024) - r)) << "row " << p;
    outside += argmax(*whole, p) >= 1024;
  }
  EXPECT_GT(outside, 0);  // the restriction changes some drafts
  ASSERT_TRUE(model->SetDraftVocab(vocab).ok());  // the whole head again
  mtp_rows(0, &rows, &sources);
  ASSERT_TRUE(model->MtpDraft(rows, tables, sources, 0, &pick).ok());
  EXPECT_EQ(pick, argmax(*whole, 0));
}

// A model cut to its first layers (--layers) has no MTP layer to run.
TEST(Golden, TinyHybridCutToItsFirstLayersLoadsNoMtp) {
  if (!std::filesystem::exists(std::string(kTinyHybrid) + "/model.safetensors"))
    GTEST_SKIP() << kTinyHybrid << " is missing";
  DeviceOptions device;
  device.device = "cpu";
  device.exact = true;
  auto backend = OpenBackend(device);
  ASSERT_TRUE(backend.ok());
  LoadOptions options;
  options.layers = 2;
  auto model = Model::Load(kTinyHybrid, *backend, options);
  ASSERT_TRUE(model.ok()) << model.status().message();
  EXPECT_FALSE((*model)->HasMtp());
  EXPECT_EQ(static_cast<int>((*model)->caches().size()), 2);
  auto logits = SequenceMtpLogits(**model, std::vector<int32_t>{1, 2, 3});
  EXPECT_FALSE(logits.ok());
}

// models/tiny-hybrid, the shipped hybrid (tools/train_tiny_hybrid.py: Qwen3_5MoeForCausalLM,
// three recurrent layers and one gated attention layer, experts with a shared expert, tied head,
// an MTP layer), against transformers' float32 logits of its bf16 weights: within 1e-4, whole and
// in steps of 5 and 1 rows; its greedy answers token for token; the MTP layer loads.
TEST(Golden, TinyHybridReferenceLogits) {
  auto model = LoadModel("models/tiny-hybrid");
  ASSERT_TRUE(model);
  const Arch& arch = model->arch();
  ASSERT_EQ(arch.layers, 4);
  EXPECT_TRUE(arch.layer[0].IsRecurrent());
  EXPECT_FALSE(arch.layer[3].IsRecurrent());
  EXPECT_GT(model->MtpTensors(), 0);
  CheckLogits(*model, "tiny-hybrid", "models/tiny-hybrid/reference.safetensors", 1e-4f,
              {256, 5, 1});
}

TEST(Golden, TinyHybridGreedyEqualsTransformers) {
  auto model = LoadModel("models/tiny-hybrid");
  ASSERT_TRUE(model);
  auto ref = SafetensorsFile::Open("models/tiny-hybrid/reference.safetensors");
  ASSERT_TRUE(ref.ok()) << ref.status().message();
  int cases = 0;
  for (int i = 0; ref->Find("greedy" + std::to_string(i)); ++i, ++cases) {
    const std::vector<int32_t> prompt = ReadIds(*ref->Find("ids" + std::to_string(i)));
    const std::vector<int32_t> expected = ReadIds(*ref->Find("greedy" + std::to_string(i)));
    auto out = golden::GreedyTokens(*model, prompt, expected.size(), {0, 2});
    ASSERT_TRUE(out.ok()) << out.status().message();
    EXPECT_EQ(*out, expected) << "case " << i;
  }
  EXPECT_GE(cases, 3);
}

}  // namespace
}  // namespace gizllm
