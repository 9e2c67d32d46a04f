// A random DFlash drafter folder (model/dflash.h's layout) for a target of `dim` and `layers`,
// for tests: config.json and model.safetensors (float32, normal weights of std 0.05, norms near
// one), the names without "model." unless `prefixed`.
#pragma once

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "formats/safetensors.h"

namespace gizllm::testing {

struct RandomDFlash {
  int dim = 0;
  int target_layers = 0;
  std::vector<int> target_layer_ids;
  int layers = 2;
  int heads = 2;
  int kv_heads = 1;
  int head_dim = 32;
  int ffn = 96;
  int block = 6;
  int mask_token = 0;
  double rope_theta = 10000.0;
  uint32_t seed = 1;
  bool prefixed = false;
};

inline void WriteRandomDFlash(const std::string& dir, const RandomDFlash& r) {
  std::filesystem::create_directories(dir);
  nlohmann::json c = {
      {"architectures", {"DFlashDraftModel"}},
      {"model_type", "qwen3"},
      {"hidden_size", r.dim},
      {"num_hidden_layers", r.layers},
      {"num_attention_heads", r.heads},
      {"num_key_value_heads", r.kv_heads},
      {"head_dim", r.head_dim},
      {"intermediate_size", r.ffn},
      {"rms_norm_eps", 1e-6},
      {"rope_theta", r.rope_theta},
      {"rope_scaling", nullptr},
      {"hidden_act", "silu"},
      {"attention_bias", false},
      {"block_size", r.block},
      {"num_target_layers", r.target_layers},
      {"dflash_config",
       {{"mask_token_id", r.mask_token}, {"target_layer_ids", r.target_layer_ids}}}};
  std::ofstream(dir + "/config.json") << c.dump(2);
  std::mt19937 rng(r.seed);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>> tensors;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, bool norm) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v(n);
    for (float& x : v) x = norm ? 1.0f + normal(rng) : normal(rng);
    tensors[(r.prefixed ? "model." : "") + name] = {shape, v};
  };
  const int64_t q = static_cast<int64_t>(r.heads) * r.head_dim,
                kv = static_cast<int64_t>(r.kv_heads) * r.head_dim;
  add("fc.weight", {r.dim, static_cast<int64_t>(r.target_layer_ids.size()) * r.dim}, false);
  add("hidden_norm.weight", {r.dim}, true);
  add("norm.weight", {r.dim}, true);
  for (int l = 0; l < r.layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {r.dim}, true);
    add(p + "post_attention_layernorm.weight", {r.dim}, true);
    add(p + "self_attn.q_proj.weight", {q, r.dim}, false);
    add(p + "self_attn.k_proj.weight", {kv, r.dim}, false);
    add(p + "self_attn.v_proj.weight", {kv, r.dim}, false);
    add(p + "self_attn.o_proj.weight", {r.dim, q}, false);
    add(p + "self_attn.q_norm.weight", {r.head_dim}, true);
    add(p + "self_attn.k_norm.weight", {r.head_dim}, true);
    add(p + "mlp.gate_proj.weight", {r.ffn, r.dim}, false);
    add(p + "mlp.up_proj.weight", {r.ffn, r.dim}, false);
    add(p + "mlp.down_proj.weight", {r.dim, r.ffn}, false);
  }
  std::vector<TensorToWrite> out;
  for (const auto& [name, t] : tensors) {
    out.push_back({name, DType::kF32, t.first, t.second.data(), t.second.size() * sizeof(float)});
  }
  (void)WriteSafetensors(dir + "/model.safetensors", out, {});
}

}  // namespace gizllm::testing
