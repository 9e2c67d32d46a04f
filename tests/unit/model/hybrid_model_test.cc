// Qwen3-Next and Qwen3.5 hybrids on the CPU backend, on small random models written as Hugging
// Face folders: a recurrent layer's step of the residual stream against a float64
// reimplementation (projections, convolution, L2 norms, the gated delta rule, the gated norm);
// Qwen3-Next's fused projections against Qwen3.5's separate ones; prompts read in pieces of 256,
// 5 and 1 rows (the chunked form, and the recurrence alone) against each other; the
// ForConditionalGeneration layout with its MTP layer and vision tower; refusals at load.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "formats/safetensors.h"
#include "model/evaluate.h"
#include "model/model.h"
#include "ops/device.h"
#include "tiny_hybrid.h"

namespace gizllm {
namespace {

namespace fs = std::filesystem;
using namespace tiny_hybrid;  // NOLINT: the model the tests build

class HybridModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("gizllm_hybrid_test_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  void Random(Tensors& t, const std::string& name, std::vector<int64_t> shape, float scale,
              float mean = 0.0f) {
    builder_.Random(t, name, std::move(shape), scale, mean);
  }
  Tensors Qwen3_5(const std::string& prefix, bool moe, float mlp_scale = 0.2f) {
    return builder_.Qwen3_5(prefix, moe, mlp_scale);
  }
  static Tensors Fuse(const Tensors& separate) { return Builder::Fuse(separate); }
  static nlohmann::json TextConfig(const std::string& type, bool moe) {
    return Builder::TextConfig(type, moe);
  }
  std::string Write(const std::string& folder, const nlohmann::json& config,
                    const Tensors& tensors) {
    const std::string dir = Builder::Write(root_ / folder, config, tensors);
    EXPECT_FALSE(dir.empty());
    return dir;
  }

  std::unique_ptr<Model> Load(const std::string& dir) {
    backend_ = std::make_shared<CpuBackend>(&pool_, CpuOptions{});
    auto model = Model::Load(dir, backend_);
    EXPECT_TRUE(model.ok()) << model.status().message();
    return model.ok() ? std::move(*model) : nullptr;
  }

  fs::path root_;
  Builder builder_{77};
  ThreadPool pool_{2};
  std::shared_ptr<Backend> backend_;
};

std::vector<int32_t> Ids(int n) {
  std::vector<int32_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = (i * 13 + 5) % kVocab;
  return ids;
}

double MaxAbs(const std::vector<float>& v) {
  double m = 0.0;
  for (float f : v) m = std::max(m, static_cast<double>(std::fabs(f)));
  return m;
}

double Silu(double x) { return x / (1.0 + std::exp(-x)); }

// x + recurrent(norm(x)) of one layer over a whole sequence, in float64, from the Qwen3.5
// tensors: what transformers' Qwen3_5GatedDeltaNet computes.
std::vector<double> RecurrentStep(const Tensors& t, int l, const float* x, int64_t n) {
  const std::string p = "model.layers." + std::to_string(l) + ".";
  const std::string a = p + "linear_attn.";
  auto v = [&](const std::string& name) { return t.at(name).values(); };
  const auto in_norm = v(p + "input_layernorm.weight"), wqkv = v(a + "in_proj_qkv.weight"),
             wz = v(a + "in_proj_z.weight"), wb = v(a + "in_proj_b.weight"),
             wa = v(a + "in_proj_a.weight"), conv = v(a + "conv1d.weight"), a_log = v(a + "A_log"),
             dt_bias = v(a + "dt_bias"), norm = v(a + "norm.weight"),
             wout = v(a + "out_proj.weight");
  std::vector<double> mixed(n * kConvDim), z(n * kValueDim), b(n * kVHeads), av(n * kVHeads);
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x + r * kDim;
    double ss = 0.0;
    for (int c = 0; c < kDim; ++c) ss += double(xr[c]) * xr[c];
    const double inv = 1.0 / std::sqrt(ss / kDim + 1e-6);
    std::vector<double> h(kDim);
    for (int c = 0; c < kDim; ++c) h[c] = xr[c] * inv * (1.0 + in_norm[c]);
    auto proj = [&](const std::vector<float>& w, int outputs, double* out) {
      for (int o = 0; o < outputs; ++o) {
        double s = 0.0;
        for (int c = 0; c < kDim; ++c) s += h[c] * w[o * kDim + c];
        out[o] = s;
      }
    };
    proj(wqkv, kConvDim, &mixed[r * kConvDim]);
    proj(wz, kValueDim, &z[r * kValueDim]);
    proj(wb, kVHeads, &b[r * kVHeads]);
    proj(wa, kVHeads, &av[r * kVHeads]);
  }
  std::vector<double> conv_out(n * kConvDim);
  for (int64_t r = 0; r < n; ++r) {
    for (int c = 0; c < kConvDim; ++c) {
      double s = 0.0;
      for (int j = 0; j < kKernel; ++j) {
        const int64_t src = r - (kKernel - 1) + j;
        if (src >= 0) s += conv[c * kKernel + j] * mixed[src * kConvDim + c];
      }
      conv_out[r * kConvDim + c] = Silu(s);
    }
  }
  std::vector<double> state(static_cast<size_t>(kVHeads) * kKDim * kVDim, 0.0);
  std::vector<double> out(x, x + n * kDim);
  for (int64_t r = 0; r < n; ++r) {
    double* m = &conv_out[r * kConvDim];
    for (int head = 0; head < 2 * kKHeads; ++head) {  // q heads, then k heads
      double ss = 0.0;
      for (int i = 0; i < kKDim; ++i) ss += m[head * kKDim + i] * m[head * kKDim + i];
      const double inv = 1.0 / std::sqrt(ss + 1e-6);
      for (int i = 0; i < kKDim; ++i) m[head * kKDim + i] *= inv;
    }
    std::vector<double> core(kValueDim);
    for (int h = 0; h < kVHeads; ++h) {
      const int kh = h / (kVHeads / kKHeads);
      const double* q = m + kh * kKDim;
      const double* k = m + kKeyDim + kh * kKDim;
      const double* vv = m + 2 * kKeyDim + h * kVDim;
      const double x_a = av[r * kVHeads + h] + dt_bias[h];
      const double softplus = x_a > 20 ? x_a : std::log1p(std::exp(x_a));
      const double g = -std::exp(double(a_log[h])) * softplus;
      const double beta = 1.0 / (1.0 + std::exp(-b[r * kVHeads + h]));
      double* s = &state[static_cast<size_t>(h) * kKDim * kVDim];
      for (int i = 0; i < kKDim * kVDim; ++i) s[i] *= std::exp(g);
      for (int j = 0; j < kVDim; ++j) {
        double kv = 0.0;
        for (int i = 0; i < kKDim; ++i) kv += s[i * kVDim + j] * k[i];
        const double delta = beta * (vv[j] - kv);
        for (int i = 0; i < kKDim; ++i) s[i * kVDim + j] += k[i] * delta;
      }
      double ss = 0.0;
      for (int j = 0; j < kVDim; ++j) {
        double o = 0.0;
        for (int i = 0; i < kKDim; ++i) o += s[i * kVDim + j] * q[i] / std::sqrt(double(kKDim));
        core[h * kVDim + j] = o;
        ss += o * o;
      }
      const double inv = 1.0 / std::sqrt(ss / kVDim + 1e-6);
      for (int j = 0; j < kVDim; ++j) {
        core[h * kVDim + j] *= inv * norm[j] * Silu(z[r * kValueDim + h * kVDim + j]);
      }
    }
    for (int c = 0; c < kDim; ++c) {
      double y = 0.0;
      for (int i = 0; i < kValueDim; ++i) y += core[i] * wout[c * kValueDim + i];
      out[r * kDim + c] += y;
    }
  }
  return out;
}

// x + attention(norm(x)) of the gated attention layer over a whole sequence, in float64:
// q_proj's per-head query and gate halves, (1 + w) q and k norms, partial rotary (the first
// rotary_dims of each head, rotate-half), causal grouped-query attention, times sigmoid(gate),
// o_proj.
std::vector<double> AttentionStep(const Tensors& t, int l, const float* x, int64_t n,
                                  int rotary_dims) {
  const std::string p = "model.layers." + std::to_string(l) + ".";
  auto v = [&](const std::string& name) { return t.at(name).values(); };
  const auto in_norm = v(p + "input_layernorm.weight"), wq = v(p + "self_attn.q_proj.weight"),
             wk = v(p + "self_attn.k_proj.weight"), wv = v(p + "self_attn.v_proj.weight"),
             wo = v(p + "self_attn.o_proj.weight"), qn = v(p + "self_attn.q_norm.weight"),
             kn = v(p + "self_attn.k_norm.weight");
  constexpr int hd = kHeadDim;
  std::vector<double> q(n * kHeads * hd), gate(n * kHeads * hd), k(n * kKvHeads * hd),
      val(n * kKvHeads * hd);
  auto head_norm = [&](double* h, const std::vector<float>& w) {
    double ss = 0.0;
    for (int i = 0; i < hd; ++i) ss += h[i] * h[i];
    const double inv = 1.0 / std::sqrt(ss / hd + 1e-6);
    for (int i = 0; i < hd; ++i) h[i] *= inv * (1.0 + w[i]);
  };
  auto rotate = [&](double* h, int64_t position) {
    const int half = rotary_dims / 2;
    for (int i = 0; i < half; ++i) {
      // As transformers: float32 inv_freq and angle.
      const float inv_freq =
          1.0f / std::pow(10000.0f, static_cast<float>(2 * i) / static_cast<float>(rotary_dims));
      const float angle = static_cast<float>(position) * inv_freq;
      const double c = std::cos(angle), s = std::sin(angle);
      const double a = h[i], b = h[i + half];
      h[i] = a * c - b * s;
      h[i + half] = b * c + a * s;
    }
  };
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x + r * kDim;
    double ss = 0.0;
    for (int c = 0; c < kDim; ++c) ss += double(xr[c]) * xr[c];
    const double inv = 1.0 / std::sqrt(ss / kDim + 1e-6);
    std::vector<double> h(kDim);
    for (int c = 0; c < kDim; ++c) h[c] = xr[c] * inv * (1.0 + in_norm[c]);
    auto dot = [&](const std::vector<float>& w, int row) {
      double s2 = 0.0;
      for (int c = 0; c < kDim; ++c) s2 += h[c] * w[row * kDim + c];
      return s2;
    };
    for (int head = 0; head < kHeads; ++head) {
      for (int i = 0; i < hd; ++i) {
        q[(r * kHeads + head) * hd + i] = dot(wq, head * 2 * hd + i);
        gate[(r * kHeads + head) * hd + i] = dot(wq, head * 2 * hd + hd + i);
      }
      head_norm(&q[(r * kHeads + head) * hd], qn);
      rotate(&q[(r * kHeads + head) * hd], r);
    }
    for (int head = 0; head < kKvHeads; ++head) {
      for (int i = 0; i < hd; ++i) {
        k[(r * kKvHeads + head) * hd + i] = dot(wk, head * hd + i);
        val[(r * kKvHeads + head) * hd + i] = dot(wv, head * hd + i);
      }
      head_norm(&k[(r * kKvHeads + head) * hd], kn);
      rotate(&k[(r * kKvHeads + head) * hd], r);
    }
  }
  std::vector<double> out(x, x + n * kDim);
  for (int64_t r = 0; r < n; ++r) {
    std::vector<double> attn(kHeads * hd, 0.0);
    for (int head = 0; head < kHeads; ++head) {
      const int kvh = head / (kHeads / kKvHeads);
      std::vector<double> score(r + 1);
      double max = -1e300;
      for (int64_t j = 0; j <= r; ++j) {
        double s2 = 0.0;
        for (int i = 0; i < hd; ++i)
          s2 += q[(r * kHeads + head) * hd + i] * k[(j * kKvHeads + kvh) * hd + i];
        score[j] = s2 / std::sqrt(double(hd));
        max = std::max(max, score[j]);
      }
      double total = 0.0;
      for (double& e : score) total += e = std::exp(e - max);
      for (int64_t j = 0; j <= r; ++j) {
        for (int i = 0; i < hd; ++i)
          attn[head * hd + i] += score[j] / total * val[(j * kKvHeads + kvh) * hd + i];
      }
      for (int i = 0; i < hd; ++i) {
        const double g = gate[(r * kHeads + head) * hd + i];
        attn[head * hd + i] *= 1.0 / (1.0 + std::exp(-g));
      }
    }
    for (int c = 0; c < kDim; ++c) {
      double y = 0.0;
      for (int i = 0; i < kHeads * hd; ++i) y += attn[i] * wo[c * kHeads * hd + i];
      out[r * kDim + c] += y;
    }
  }
  return out;
}

// With the feed-forwards zeroed, a layer adds only its first block: each recurrent layer's
// and the attention layer's step of the residual stream match float64 over a sequence longer
// than a chunk.
TEST_F(HybridModelTest, EachLayerMatchesFloat64) {
  const Tensors t = Qwen3_5("model.", /*moe=*/false, /*mlp_scale=*/0.0f);
  auto model = Load(Write("dense", TextConfig("qwen3_5_text", false), t));
  ASSERT_TRUE(model);
  ASSERT_EQ(model->arch().family, "qwen3_5");
  ASSERT_TRUE(model->arch().layer[0].IsRecurrent());
  ASSERT_FALSE(model->arch().layer[1].IsRecurrent());
  EXPECT_EQ(model->arch().rope.rotary_dims, kHeadDim / 4);
  const std::vector<int32_t> ids = Ids(90);
  const int64_t n = static_cast<int64_t>(ids.size());
  const std::vector<int> layers = {0, 1, 2, 3, 4};
  auto hidden = SequenceHidden(*model, ids, layers);
  ASSERT_TRUE(hidden.ok()) << hidden.status().message();
  for (int l : {0, 2, 3}) {
    const float* in = hidden->data() + l * n * kDim;
    const float* out = hidden->data() + (l + 1) * n * kDim;
    const std::vector<double> want = RecurrentStep(t, l, in, n);
    double scale = 0.0;
    for (double w : want) scale = std::max(scale, std::fabs(w));
    for (int64_t i = 0; i < n * kDim; ++i) {
      ASSERT_NEAR(out[i], want[i], 2e-5 * scale)
          << "layer " << l << " row " << i / kDim << " column " << i % kDim;
    }
  }
  // The gated attention layer likewise.
  const float* in = hidden->data() + 1 * n * kDim;
  const float* out = hidden->data() + 2 * n * kDim;
  const std::vector<double> want = AttentionStep(t, 1, in, n, model->arch().rope.rotary_dims);
  double scale = 0.0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  for (int64_t i = 0; i < n * kDim; ++i) {
    ASSERT_NEAR(out[i], want[i], 2e-5 * scale)
        << "attention layer, row " << i / kDim << " column " << i % kDim;
  }
}

// Qwen3-Next's fused in_proj_qkvz and in_proj_ba, split at load, compute exactly what the same
// weights as Qwen3.5's four projections compute.
TEST_F(HybridModelTest, FusedProjectionsEqualSeparateOnes) {
  const Tensors t = Qwen3_5("model.", /*moe=*/false);
  nlohmann::json next = TextConfig("qwen3_next", false);
  next["mlp_only_layers"] = {0, 1, 2, 3};
  next["num_experts"] = kExperts;
  next["moe_intermediate_size"] = kMoeFfn;
  next["num_experts_per_tok"] = kTopK;
  next["shared_expert_intermediate_size"] = kSharedFfn;
  auto fused = Load(Write("next", next, Fuse(t)));
  ASSERT_TRUE(fused);
  EXPECT_TRUE(fused->arch().layer[0].recurrent.fused_projections);
  EXPECT_FALSE(fused->arch().layer[0].IsMoe());
  auto separate = Load(Write("qwen3_5", TextConfig("qwen3_5_text", false), t));
  ASSERT_TRUE(separate);
  const std::vector<int32_t> ids = Ids(70);
  auto a = SequenceLogits(*fused, ids);
  auto b = SequenceLogits(*separate, ids);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
}

// A prompt read in pieces of 256 (every row in one step: the delta rule's chunks of 64), 5 and
// 1 row (the recurrence, as decode reads it) gives the same logits up to float32 rounding, for
// each family: the states carry across steps.
TEST_F(HybridModelTest, PiecesEqualTokenByToken) {
  struct Case {
    std::string name;
    nlohmann::json config;
    Tensors tensors;
  };
  std::vector<Case> cases;
  {
    nlohmann::json next = TextConfig("qwen3_next", true);
    next["decoder_sparse_step"] = 1;
    cases.push_back({"qwen3_next", next, Fuse(Qwen3_5("model.", true))});
  }
  cases.push_back({"qwen3_5", TextConfig("qwen3_5_text", false), Qwen3_5("model.", false)});
  cases.push_back({"qwen3_5_moe", TextConfig("qwen3_5_moe_text", true), Qwen3_5("model.", true)});
  const std::vector<int32_t> ids = Ids(150);
  for (const Case& c : cases) {
    auto model = Load(Write(c.name, c.config, c.tensors));
    ASSERT_TRUE(model) << c.name;
    auto want = SequenceLogits(*model, ids, 1);
    ASSERT_TRUE(want.ok()) << want.status().message();
    const double scale = MaxAbs(*want);
    for (int64_t chunk : {256, 5, 64, 65}) {
      auto got = SequenceLogits(*model, ids, chunk);
      ASSERT_TRUE(got.ok()) << got.status().message();
      for (size_t i = 0; i < got->size(); ++i) {
        ASSERT_NEAR((*got)[i], (*want)[i], 1e-4 * scale)
            << c.name << " pieces of " << chunk << " at " << i;
      }
    }
  }
}

// Qwen3_5MoeForConditionalGeneration: the text model under model.language_model., the vision
// tower's tensors skipped, the MTP layer loaded (its cache one more attention layer's); the text
// model alone computes the same logits.
TEST_F(HybridModelTest, ConditionalGenerationLayout) {
  const Tensors text = Qwen3_5("model.", true);
  Tensors full;
  for (const auto& [name, t] : text) {
    const bool decoder = name.rfind("model.", 0) == 0;
    full[decoder ? "model.language_model." + name.substr(6) : name] = t;
  }
  Random(full, "model.visual.patch_embed.proj.weight", {8, 3}, 0.1f);
  // The MTP layer: a full-attention layer (layer 1's kind) under mtp.layers.0., fc and norms.
  for (const auto& [name, t] : Qwen3_5("x.", true)) {
    if (name.rfind("x.layers.1.", 0) == 0) full["mtp.layers.0." + name.substr(11)] = t;
  }
  Random(full, "mtp.fc.weight", {kDim, 2 * kDim}, 0.1f);
  Random(full, "mtp.norm.weight", {kDim}, 0.1f);
  Random(full, "mtp.pre_fc_norm_embedding.weight", {kDim}, 0.1f);
  Random(full, "mtp.pre_fc_norm_hidden.weight", {kDim}, 0.1f);
  int64_t mtp_tensors = 0, mtp_parameters = 0;
  for (const auto& [name, t] : full) {
    if (name.rfind("mtp.", 0) != 0) continue;
    ++mtp_tensors;
    mtp_parameters += static_cast<int64_t>(t.bf16.size());
  }
  nlohmann::json config = {{"model_type", "qwen3_5_moe"},
                           {"architectures", {"Qwen3_5MoeForConditionalGeneration"}},
                           {"text_config", TextConfig("qwen3_5_moe_text", true)},
                           {"vision_config", {{"depth", 1}}},
                           {"eos_token_id", 7}};
  auto model = Load(Write("conditional", config, full));
  ASSERT_TRUE(model);
  EXPECT_EQ(model->arch().family, "qwen3_5_moe");
  EXPECT_EQ(model->arch().prefixes[0], "model.language_model.");
  EXPECT_TRUE(model->HasMtp());
  EXPECT_EQ(model->MtpTensors(), mtp_tensors);
  EXPECT_EQ(model->MtpParameters(), mtp_parameters);
  EXPECT_EQ(model->SkippedTensors(), 1);
  EXPECT_EQ(model->arch().eos, std::vector<int32_t>{7});
  ASSERT_EQ(static_cast<int>(model->caches().size()), kLayers + 1);
  auto alone = Load(Write("text", TextConfig("qwen3_5_moe_text", true), text));
  ASSERT_TRUE(alone);
  EXPECT_EQ(alone->MtpTensors(), 0);
  EXPECT_FALSE(alone->HasMtp());
  EXPECT_EQ(model->PageBytes(), 2 * alone->PageBytes()) << "one attention layer, and the MTP's";
  const std::vector<int32_t> ids = Ids(40);
  auto a = SequenceLogits(*model, ids);
  auto b = SequenceLogits(*alone, ids);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
  // The MTP rows of 40 positions (three pages) in one step, in steps of 7 and row by row: each
  // MTP row attends to the MTP keys the rows before it wrote, whichever step wrote them.
  auto whole = SequenceMtpLogits(*model, ids);
  ASSERT_TRUE(whole.ok()) << whole.status().message();
  ASSERT_EQ(whole->size(), (ids.size() - 1) * kVocab);
  for (int64_t chunk : {7, 1}) {
    auto parts = SequenceMtpLogits(*model, ids, chunk);
    ASSERT_TRUE(parts.ok()) << parts.status().message();
    float max_diff = 0, max_ref = 0;
    for (size_t i = 0; i < whole->size(); ++i) {
      max_diff = std::max(max_diff, std::fabs((*parts)[i] - (*whole)[i]));
      max_ref = std::max(max_ref, std::fabs((*whole)[i]));
    }
    EXPECT_LE(max_diff, 1e-4f * max_ref) << "chunk " << chunk;
  }
  EXPECT_FALSE(SequenceMtpLogits(*alone, ids).ok()) << "no MTP layer";
  // An MTP layer short of a tensor is refused, naming it.
  full.erase("mtp.pre_fc_norm_hidden.weight");
  auto partial = Model::Load(Write("partial", config, full), backend_);
  ASSERT_FALSE(partial.ok());
  EXPECT_NE(partial.status().message().find("mtp.pre_fc_norm_hidden.weight"), std::string::npos)
      << partial.status().message();
}

// The recurrent ops carry a slot's state from row to row: a step whose rows of one slot are
// apart or skip a position is refused.
TEST_F(HybridModelTest, RowsOfASlotMustBeAdjacentAndConsecutive) {
  auto model = Load(Write("dense", TextConfig("qwen3_5_text", false), Qwen3_5("model.", false)));
  ASSERT_TRUE(model);
  ASSERT_TRUE(model->AllocatePages(4).ok());
  const int32_t pages[] = {0, 1, 2, 3};
  const PageTables tables{pages, 2, 2};
  std::vector<float> logits(kVocab);
  Rows apart;
  apart.Push(1, 0, 0, false);
  apart.Push(2, 1, 0, false);
  apart.Push(3, 0, 1, true);
  Status s = model->Step(apart, tables, logits.data());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("not adjacent"), std::string::npos) << s.message();
  Rows skipping;
  skipping.Push(1, 0, 0, false);
  skipping.Push(2, 0, 2, true);
  s = model->Step(skipping, tables, logits.data());
  EXPECT_NE(s.message().find("consecutive"), std::string::npos) << s.message();
  Rows fine;
  fine.Push(1, 1, 0, false);
  fine.Push(2, 1, 1, false);
  fine.Push(3, 0, 0, true);
  EXPECT_TRUE(model->Step(fine, tables, logits.data()).ok());
}

// Drafts on many slots at once: one snapshot call for every drafting slot and one call that
// brings each slot back to its kept rows (KeepDraftRowsOf: the snapshots of adjacent slots
// copied together, every slot's kept rows replayed in one pass) leave each slot's states as the
// same calls slot by slot do (a snapshot and a replay of that slot's rows alone), bit for bit;
// a slot that keeps no row holds its states from before the step. A slot listed twice, or one
// whose snapshot was read, is refused.
TEST_F(HybridModelTest, KeptRowsOfManySlotsEqualThoseOfEachSlotAlone) {
  const std::string dir =
      Write("moe", TextConfig("qwen3_5_moe_text", true), Qwen3_5("model.", true));
  auto together = Load(dir);
  auto alone = Load(dir);
  ASSERT_TRUE(together && alone);
  constexpr int32_t kSlots = 4;
  std::vector<int32_t> pages(kSlots * 2);
  for (int32_t i = 0; i < kSlots * 2; ++i) pages[i] = i;
  const PageTables tables{pages.data(), kSlots, 2};
  for (Model* m : {together.get(), alone.get()}) {
    ASSERT_TRUE(m->ReserveDrafts().ok());
    ASSERT_TRUE(m->AllocatePages(kSlots * 2).ok());
    ASSERT_TRUE(m->Reserve(32, kSlots, 2).ok());
  }
  std::vector<float> logits(kVocab * 32);
  std::mt19937 rng(5);
  auto token = [&] { return static_cast<int32_t>(rng() % kVocab); };
  // Prompts of 3 to 6 rows in each slot.
  std::vector<int64_t> held(kSlots);
  Rows prompts;
  for (int32_t s = 0; s < kSlots; ++s) {
    held[s] = 3 + s;
    for (int64_t p = 0; p < held[s]; ++p) prompts.Push(token(), s, p, p + 1 == held[s]);
  }
  for (Model* m : {together.get(), alone.get()}) {
    ASSERT_TRUE(m->Step(prompts, tables, logits.data()).ok());
  }
  auto states = [&](Model& m, int32_t slot) {
    std::vector<uint8_t> bytes(m.SlotStatesBytes());
    EXPECT_TRUE(m.CopySlotStatesToHost(slot, false, bytes.data()).ok());
    return bytes;
  };
  // Round 1 keeps 1, 4 (all), 0 and 2 of 4 rows in slots 0-3 (slots 0, 2 and 3 go back: two
  // runs of adjacent slots); round 2 has slot 1 alone go back.
  const std::vector<std::vector<int64_t>> rounds = {{1, 4, 0, 2}, {4, 2, 4, 4}};
  for (const std::vector<int64_t>& kept : rounds) {
    std::vector<int32_t> slots;
    Rows step;
    std::vector<KeptDraftRows> keep;
    for (int32_t s = 0; s < kSlots; ++s) {
      slots.push_back(s);
      for (int64_t j = 0; j < 4; ++j) step.Push(token(), s, held[s] + j, true);
      keep.push_back({s, kept[s]});
    }
    std::vector<std::vector<uint8_t>> before;
    for (int32_t s = 0; s < kSlots; ++s) before.push_back(states(*together, s));
    ASSERT_TRUE(together->SnapshotDraftStates(slots).ok());
    for (int32_t s = 0; s < kSlots; ++s) ASSERT_TRUE(alone->SnapshotDraftState(s).ok());
    for (Model* m : {together.get(), alone.get()}) {
      ASSERT_TRUE(m->Step(step, tables, logits.data()).ok());
    }
    ASSERT_TRUE(together->KeepDraftRowsOf(keep).ok());
    for (int32_t s = 0; s < kSlots; ++s) ASSERT_TRUE(alone->KeepDraftRows(s, kept[s]).ok());
    for (int32_t s = 0; s < kSlots; ++s) {
      const std::vector<uint8_t> got = states(*together, s);
      EXPECT_EQ(got, states(*alone, s)) << "slot " << s << " keeping " << kept[s] << " of 4";
      if (kept[s] == 0) EXPECT_EQ(got, before[s]) << "slot " << s;
      if (kept[s] == 4) EXPECT_NE(got, before[s]) << "slot " << s;
      held[s] += kept[s];
    }
  }
  // Refusals: a slot twice; a slot whose snapshot was read already (slot 1 in round 2).
  const int32_t twice[] = {1, 1};
  EXPECT_NE(together->SnapshotDraftStates(twice).message().find("listed twice"), std::string::npos);
  const KeptDraftRows again[] = {{1, 0}};
  EXPECT_NE(together->KeepDraftRowsOf(again).message().find("no draft snapshot"),
            std::string::npos);
}

class NoRecurrentBackend : public CpuBackend {
 public:
  using CpuBackend::CpuBackend;
  bool SupportsRecurrent() const override { return false; }
};

// A backend without the recurrent ops refuses the model when it loads, naming the folder.
TEST_F(HybridModelTest, BackendWithoutRecurrentOpsRefusesAtLoad) {
  const std::string dir =
      Write("dense", TextConfig("qwen3_5_text", false), Qwen3_5("model.", false));
  auto model = Model::Load(dir, std::make_shared<NoRecurrentBackend>(&pool_, CpuOptions{}));
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(model.status().message().find("recurrent layers"), std::string::npos)
      << model.status().message();
  EXPECT_NE(model.status().message().find(dir), std::string::npos) << model.status().message();
}

// The CUDA backend's recurrent kernels take key heads of 16 to 128: it refuses this model's 8
// when it loads, naming the layer (cuda_model_test runs the golden hybrids). Skips where no CUDA
// backend can be opened.
TEST_F(HybridModelTest, CudaRefusesAtLoad) {
  DeviceOptions device;
  device.device = "cuda";
  auto backend = OpenBackend(device);
  if (!backend.ok()) GTEST_SKIP() << "no CUDA backend: " << backend.status().message();
  const std::string dir =
      Write("dense", TextConfig("qwen3_5_text", false), Qwen3_5("model.", false));
  auto model = Model::Load(dir, *backend);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(model.status().message().find("recurrent layers with a key head of 8"),
            std::string::npos)
      << model.status().message();
}

}  // namespace
}  // namespace gizllm
