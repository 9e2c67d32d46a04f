// A tiny random Qwen3.5 / Qwen3-Next hybrid written as a Hugging Face folder, for the model's
// and the engine's tests: four layers (recurrent, attention, recurrent, recurrent), bf16.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "formats/safetensors.h"

namespace gizllm::tiny_hybrid {

constexpr int kVocab = 40, kDim = 32, kHeads = 2, kKvHeads = 1, kHeadDim = 16, kLayers = 4;
constexpr int kKHeads = 2, kVHeads = 4, kKDim = 8, kVDim = 6, kKernel = 4, kFfn = 24;
constexpr int kExperts = 4, kTopK = 2, kMoeFfn = 10, kSharedFfn = 14;
constexpr int kKeyDim = kKHeads * kKDim, kValueDim = kVHeads * kVDim;
constexpr int kConvDim = 2 * kKeyDim + kValueDim;
const char* const kTypes[kLayers] = {"linear_attention", "full_attention", "linear_attention",
                                     "linear_attention"};

struct Tensor {
  std::vector<int64_t> shape;
  std::vector<uint16_t> bf16;
  std::vector<float> values() const {
    std::vector<float> v(bf16.size());
    for (size_t i = 0; i < v.size(); ++i) v[i] = Bf16ToF32(bf16[i]);
    return v;
  }
};

using Tensors = std::map<std::string, Tensor>;

// Builds the tensors of a model from a seeded generator.
class Builder {
 public:
  explicit Builder(uint32_t seed) : rng_(seed) {}

  // Floats of one recurrent layer's state a sequence.
  static constexpr int64_t StateFloats() {
    return (kKernel - 1) * kConvDim + static_cast<int64_t>(kVHeads) * kKDim * kVDim;
  }

  void Random(Tensors& t, const std::string& name, std::vector<int64_t> shape, float scale,
              float mean = 0.0f) {
    std::normal_distribution<float> d(mean, scale > 0 ? scale : 1.0f);
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    Tensor& x = t[name];
    x.shape = std::move(shape);
    x.bf16.resize(n);
    for (uint16_t& h : x.bf16) h = F32ToBf16(scale > 0 ? d(rng_) : mean);
  }

  // A Qwen3.5-layout model (separate projections) under `prefix`; `moe`: every layer a mixture
  // of experts with a shared expert; `mlp_scale` 0 zeroes the feed-forwards' down projections.
  Tensors Qwen3_5(const std::string& prefix, bool moe, float mlp_scale = 0.2f) {
    Tensors t;
    Random(t, prefix + "embed_tokens.weight", {kVocab, kDim}, 1.0f);
    Random(t, prefix + "norm.weight", {kDim}, 0.2f);  // 1 + w
    Random(t, "lm_head.weight", {kVocab, kDim}, 0.2f);
    for (int l = 0; l < kLayers; ++l) {
      const std::string p = prefix + "layers." + std::to_string(l) + ".";
      Random(t, p + "input_layernorm.weight", {kDim}, 0.2f);
      Random(t, p + "post_attention_layernorm.weight", {kDim}, 0.2f);
      if (std::string(kTypes[l]) == "full_attention") {
        Random(t, p + "self_attn.q_proj.weight", {2 * kHeads * kHeadDim, kDim}, 0.2f);
        Random(t, p + "self_attn.k_proj.weight", {kKvHeads * kHeadDim, kDim}, 0.2f);
        Random(t, p + "self_attn.v_proj.weight", {kKvHeads * kHeadDim, kDim}, 0.2f);
        Random(t, p + "self_attn.o_proj.weight", {kDim, kHeads * kHeadDim}, 0.2f);
        Random(t, p + "self_attn.q_norm.weight", {kHeadDim}, 0.2f);
        Random(t, p + "self_attn.k_norm.weight", {kHeadDim}, 0.2f);
      } else {
        const std::string a = p + "linear_attn.";
        Random(t, a + "in_proj_qkv.weight", {kConvDim, kDim}, 0.3f);
        Random(t, a + "in_proj_z.weight", {kValueDim, kDim}, 0.3f);
        Random(t, a + "in_proj_b.weight", {kVHeads, kDim}, 0.3f);
        Random(t, a + "in_proj_a.weight", {kVHeads, kDim}, 0.3f);
        Random(t, a + "conv1d.weight", {kConvDim, 1, kKernel}, 0.4f);
        Random(t, a + "A_log", {kVHeads}, 0.5f, -0.5f);
        Random(t, a + "dt_bias", {kVHeads}, 0.5f, 0.5f);
        Random(t, a + "norm.weight", {kVDim}, 0.2f, 1.0f);
        Random(t, a + "out_proj.weight", {kDim, kValueDim}, 0.3f);
      }
      const std::string m = p + "mlp.";
      if (moe) {
        Random(t, m + "gate.weight", {kExperts, kDim}, 1.0f);
        for (int e = 0; e < kExperts; ++e) {
          const std::string x = m + "experts." + std::to_string(e) + ".";
          Random(t, x + "gate_proj.weight", {kMoeFfn, kDim}, 0.2f);
          Random(t, x + "up_proj.weight", {kMoeFfn, kDim}, 0.2f);
          Random(t, x + "down_proj.weight", {kDim, kMoeFfn}, mlp_scale);
        }
        Random(t, m + "shared_expert.gate_proj.weight", {kSharedFfn, kDim}, 0.2f);
        Random(t, m + "shared_expert.up_proj.weight", {kSharedFfn, kDim}, 0.2f);
        Random(t, m + "shared_expert.down_proj.weight", {kDim, kSharedFfn}, mlp_scale);
        Random(t, m + "shared_expert_gate.weight", {1, kDim}, 0.5f);
      } else {
        Random(t, m + "gate_proj.weight", {kFfn, kDim}, 0.2f);
        Random(t, m + "up_proj.weight", {kFfn, kDim}, 0.2f);
        Random(t, m + "down_proj.weight", {kDim, kFfn}, mlp_scale);
      }
    }
    return t;
  }

  // The same weights in Qwen3-Next's fused layout: in_proj_qkvz and in_proj_ba grouped by key
  // head.
  static Tensors Fuse(const Tensors& separate) {
    Tensors out;
    for (const auto& [name, t] : separate) {
      if (name.find(".in_proj_") == std::string::npos) out[name] = t;
    }
    constexpr int per = kVHeads / kKHeads;
    for (int l = 0; l < kLayers; ++l) {
      const std::string a = "model.layers." + std::to_string(l) + ".linear_attn.";
      if (!separate.count(a + "in_proj_qkv.weight")) continue;
      const auto& qkv = separate.at(a + "in_proj_qkv.weight").bf16;
      const auto& z = separate.at(a + "in_proj_z.weight").bf16;
      const auto& b = separate.at(a + "in_proj_b.weight").bf16;
      const auto& av = separate.at(a + "in_proj_a.weight").bf16;
      Tensor& qkvz = out[a + "in_proj_qkvz.weight"];
      Tensor& ba = out[a + "in_proj_ba.weight"];
      qkvz.shape = {2 * kKeyDim + 2 * kValueDim, kDim};
      ba.shape = {2 * kVHeads, kDim};
      auto rows = [&](std::vector<uint16_t>& to, const std::vector<uint16_t>& from, int first,
                      int count) {
        to.insert(to.end(), from.begin() + first * kDim, from.begin() + (first + count) * kDim);
      };
      for (int g = 0; g < kKHeads; ++g) {
        rows(qkvz.bf16, qkv, g * kKDim, kKDim);                            // q
        rows(qkvz.bf16, qkv, kKeyDim + g * kKDim, kKDim);                  // k
        rows(qkvz.bf16, qkv, 2 * kKeyDim + g * per * kVDim, per * kVDim);  // v
        rows(qkvz.bf16, z, g * per * kVDim, per * kVDim);                  // z
        rows(ba.bf16, b, g * per, per);
        rows(ba.bf16, av, g * per, per);
      }
    }
    return out;
  }

  static nlohmann::json TextConfig(const std::string& type, bool moe) {
    nlohmann::json c = {{"model_type", type},
                        {"vocab_size", kVocab},
                        {"hidden_size", kDim},
                        {"intermediate_size", kFfn},
                        {"num_hidden_layers", kLayers},
                        {"num_attention_heads", kHeads},
                        {"num_key_value_heads", kKvHeads},
                        {"head_dim", kHeadDim},
                        {"rms_norm_eps", 1e-6},
                        {"max_position_embeddings", 512},
                        {"tie_word_embeddings", false},
                        {"linear_num_key_heads", kKHeads},
                        {"linear_num_value_heads", kVHeads},
                        {"linear_key_head_dim", kKDim},
                        {"linear_value_head_dim", kVDim},
                        {"linear_conv_kernel_dim", kKernel},
                        {"layer_types", kTypes},
                        {"rope_parameters",
                         {{"rope_type", "default"},
                          {"rope_theta", 10000.0},
                          {"partial_rotary_factor", 0.25},
                          {"mrope_section", {1, 1, 0}},
                          {"mrope_interleaved", true}}}};
    if (moe) {
      c["num_experts"] = kExperts;
      c["num_experts_per_tok"] = kTopK;
      c["moe_intermediate_size"] = kMoeFfn;
      c["shared_expert_intermediate_size"] = kSharedFfn;
    }
    return c;
  }

  // Writes config.json and model.safetensors into `dir` (created).
  static std::string Write(const std::filesystem::path& dir, const nlohmann::json& config,
                           const Tensors& tensors) {
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "config.json") << config.dump();
    std::vector<TensorToWrite> list;
    for (const auto& [name, t] : tensors) {
      list.push_back({name, DType::kBF16, t.shape, t.bf16.data(), t.bf16.size() * 2});
    }
    if (!WriteSafetensors((dir / "model.safetensors").string(), list, {}).ok()) return "";
    return dir.string();
  }

 private:
  std::mt19937 rng_;
};

}  // namespace gizllm::tiny_hybrid
