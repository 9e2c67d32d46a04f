// Tiny random mixture-of-experts models written as Hugging Face folders, with every linear's
// inputs a multiple of 128 so that convert quantizes all of them (bf16 weights):
//   kQwen3Moe    Qwen3MoeForCausalLM: layers MoE, dense (mlp_only_layers), MoE; one tensor per
//                expert.
//   kQwen3Next   Qwen3NextForCausalLM: layers recurrent (fused in_proj_qkvz and in_proj_ba),
//                attention, recurrent; MoE with a gated shared expert, layer 2 dense; one tensor
//                per expert.
//   kQwen3_5Moe  Qwen3_5MoeForCausalLM (the text class): recurrent, attention, recurrent, every
//                layer MoE with a gated shared expert; experts stacked as transformers 5 writes
//                them (gate_up_proj [experts, 2 ffn, dim], down_proj [experts, dim, ffn]).
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

namespace gizllm::tiny_moe {

constexpr int kVocab = 96, kDim = 128, kHeads = 2, kKvHeads = 1, kHeadDim = 64, kLayers = 3;
constexpr int kExperts = 8, kTopK = 2, kMoeFfn = 128, kSharedFfn = 128, kFfn = 256;
constexpr int kKHeads = 2, kVHeads = 4, kKDim = 32, kVDim = 32, kKernel = 4;
constexpr int kKeyDim = kKHeads * kKDim, kValueDim = kVHeads * kVDim;
constexpr int kConvDim = 2 * kKeyDim + kValueDim;

enum class Kind { kQwen3Moe, kQwen3Next, kQwen3_5Moe };

inline const char* KindName(Kind kind) {
  return kind == Kind::kQwen3Moe    ? "qwen3_moe"
         : kind == Kind::kQwen3Next ? "qwen3_next"
                                    : "qwen3_5_moe";
}

struct Tensor {
  std::vector<int64_t> shape;
  std::vector<uint16_t> bf16;
};

class Builder {
 public:
  explicit Builder(uint32_t seed) : rng_(seed) {}

  // Writes config.json and model.safetensors of a `kind` model into `dir` (created); returns
  // `dir`, or "" where the file could not be written.
  std::string Write(const std::filesystem::path& dir, Kind kind) {
    const bool hybrid = kind != Kind::kQwen3Moe;
    const bool stacked = kind == Kind::kQwen3_5Moe;
    std::map<std::string, Tensor> t;
    Random(t, "model.embed_tokens.weight", {kVocab, kDim}, 1.0f);
    // Qwen3-Next's and Qwen3.5's norms multiply by (1 + weight).
    const float norm_mean = hybrid ? 0.0f : 1.0f;
    Random(t, "model.norm.weight", {kDim}, 0.1f, norm_mean);
    Random(t, "lm_head.weight", {kVocab, kDim}, 0.1f);
    for (int l = 0; l < kLayers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      Random(t, p + "input_layernorm.weight", {kDim}, 0.1f, norm_mean);
      Random(t, p + "post_attention_layernorm.weight", {kDim}, 0.1f, norm_mean);
      if (hybrid && l != 1) {
        const std::string a = p + "linear_attn.";
        if (kind == Kind::kQwen3Next) {
          Random(t, a + "in_proj_qkvz.weight", {2 * kKeyDim + 2 * kValueDim, kDim}, 0.1f);
          Random(t, a + "in_proj_ba.weight", {2 * kVHeads, kDim}, 0.1f);
        } else {
          Random(t, a + "in_proj_qkv.weight", {kConvDim, kDim}, 0.1f);
          Random(t, a + "in_proj_z.weight", {kValueDim, kDim}, 0.1f);
          Random(t, a + "in_proj_b.weight", {kVHeads, kDim}, 0.1f);
          Random(t, a + "in_proj_a.weight", {kVHeads, kDim}, 0.1f);
        }
        Random(t, a + "conv1d.weight", {kConvDim, 1, kKernel}, 0.4f);
        Random(t, a + "A_log", {kVHeads}, 0.5f, -0.5f);
        Random(t, a + "dt_bias", {kVHeads}, 0.5f, 0.5f);
        Random(t, a + "norm.weight", {kVDim}, 0.1f, 1.0f);
        Random(t, a + "out_proj.weight", {kDim, kValueDim}, 0.1f);
      } else {
        const int q_rows = (hybrid ? 2 : 1) * kHeads * kHeadDim;  // hybrids: an output gate
        Random(t, p + "self_attn.q_proj.weight", {q_rows, kDim}, 0.1f);
        Random(t, p + "self_attn.k_proj.weight", {kKvHeads * kHeadDim, kDim}, 0.1f);
        Random(t, p + "self_attn.v_proj.weight", {kKvHeads * kHeadDim, kDim}, 0.1f);
        Random(t, p + "self_attn.o_proj.weight", {kDim, kHeads * kHeadDim}, 0.1f);
        Random(t, p + "self_attn.q_norm.weight", {kHeadDim}, 0.1f, norm_mean);
        Random(t, p + "self_attn.k_norm.weight", {kHeadDim}, 0.1f, norm_mean);
      }
      const std::string m = p + "mlp.";
      const bool dense =
          (kind == Kind::kQwen3Moe && l == 1) || (kind == Kind::kQwen3Next && l == 2);
      if (dense) {
        Random(t, m + "gate_proj.weight", {kFfn, kDim}, 0.1f);
        Random(t, m + "up_proj.weight", {kFfn, kDim}, 0.1f);
        Random(t, m + "down_proj.weight", {kDim, kFfn}, 0.1f);
        continue;
      }
      Random(t, m + "gate.weight", {kExperts, kDim}, 0.5f);
      if (stacked) {
        Random(t, m + "experts.gate_up_proj", {kExperts, 2 * kMoeFfn, kDim}, 0.1f);
        Random(t, m + "experts.down_proj", {kExperts, kDim, kMoeFfn}, 0.1f);
      } else {
        for (int e = 0; e < kExperts; ++e) {
          const std::string x = m + "experts." + std::to_string(e) + ".";
          Random(t, x + "gate_proj.weight", {kMoeFfn, kDim}, 0.1f);
          Random(t, x + "up_proj.weight", {kMoeFfn, kDim}, 0.1f);
          Random(t, x + "down_proj.weight", {kDim, kMoeFfn}, 0.1f);
        }
      }
      if (hybrid) {
        Random(t, m + "shared_expert.gate_proj.weight", {kSharedFfn, kDim}, 0.1f);
        Random(t, m + "shared_expert.up_proj.weight", {kSharedFfn, kDim}, 0.1f);
        Random(t, m + "shared_expert.down_proj.weight", {kDim, kSharedFfn}, 0.1f);
        Random(t, m + "shared_expert_gate.weight", {1, kDim}, 0.3f);
      }
    }
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "config.json") << Config(kind).dump();
    std::vector<TensorToWrite> list;
    for (const auto& [name, x] : t) {
      list.push_back({name, DType::kBF16, x.shape, x.bf16.data(), x.bf16.size() * 2});
    }
    if (!WriteSafetensors((dir / "model.safetensors").string(), list, {}).ok()) return "";
    return dir.string();
  }

  static nlohmann::json Config(Kind kind) {
    nlohmann::json c = {{"vocab_size", kVocab},
                        {"hidden_size", kDim},
                        {"intermediate_size", kFfn},
                        {"num_hidden_layers", kLayers},
                        {"num_attention_heads", kHeads},
                        {"num_key_value_heads", kKvHeads},
                        {"head_dim", kHeadDim},
                        {"rms_norm_eps", 1e-6},
                        {"max_position_embeddings", 512},
                        {"tie_word_embeddings", false},
                        {"num_experts", kExperts},
                        {"num_experts_per_tok", kTopK},
                        {"moe_intermediate_size", kMoeFfn}};
    if (kind == Kind::kQwen3Moe) {
      c["architectures"] = {"Qwen3MoeForCausalLM"};
      c["model_type"] = "qwen3_moe";
      c["rope_theta"] = 10000.0;
      c["decoder_sparse_step"] = 1;
      c["mlp_only_layers"] = {1};
      c["norm_topk_prob"] = true;
      return c;
    }
    c["architectures"] = {kind == Kind::kQwen3Next ? "Qwen3NextForCausalLM"
                                                   : "Qwen3_5MoeForCausalLM"};
    c["model_type"] = kind == Kind::kQwen3Next ? "qwen3_next" : "qwen3_5_moe_text";
    c["shared_expert_intermediate_size"] = kSharedFfn;
    c["linear_num_key_heads"] = kKHeads;
    c["linear_num_value_heads"] = kVHeads;
    c["linear_key_head_dim"] = kKDim;
    c["linear_value_head_dim"] = kVDim;
    c["linear_conv_kernel_dim"] = kKernel;
    c["layer_types"] = {"linear_attention", "full_attention", "linear_attention"};
    c["rope_parameters"] = {
        {"rope_type", "default"}, {"rope_theta", 10000.0}, {"partial_rotary_factor", 0.25}};
    if (kind == Kind::kQwen3Next) {
      c["decoder_sparse_step"] = 1;
      c["mlp_only_layers"] = {2};
      c["norm_topk_prob"] = true;
    }
    return c;
  }

 private:
  // Random values: normal(mean, scale), rounded to bf16.
  void Random(std::map<std::string, Tensor>& t, const std::string& name, std::vector<int64_t> shape,
              float scale, float mean = 0.0f) {
    std::normal_distribution<float> d(mean, scale);
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    Tensor& x = t[name];
    x.shape = std::move(shape);
    x.bf16.resize(n);
    for (uint16_t& h : x.bf16) h = F32ToBf16(d(rng_));
  }

  std::mt19937 rng_;
};

}  // namespace gizllm::tiny_moe
