// Writes a Qwen3.5 Hugging Face folder (qwen3_5_text / qwen3_5_moe_text, or the
// ForConditionalGeneration layout's text model) as a GGUF file the way llama.cpp's
// convert_hf_to_gguf.py does (its Qwen3_5TextModel / Qwen3_5MoeTextModel: Qwen3NextModel and
// _LinearAttentionVReorderBase over Qwen2MoeModel), for tests:
//   - metadata: qwen35[moe].*, block_count counting the MTP layer, nextn_predict_layers, ssm.*
//     (conv_kernel, state_size, group_count, time_step_rank, inner_size),
//     attention.recurrent_layers, full_attention_interval, rope.dimension_count (head_dim times
//     partial_rotary_factor), rope.dimension_sections, the experts' counts and widths;
//   - tensors: every (1 + w) norm written as 1 + w (not the recurrent layers' gated norm),
//     A_log as -exp(A_log), dt_bias as ssm_dt.bias, the convolution squeezed to [channels,
//     kernel], the value heads of each recurrent tensor reordered from grouped to tiled, the
//     experts stacked (gate and up apart), the MTP layer as blk.N with nextn.* for fc and its
//     three norms; 1-D tensors and the routers F32, the matrices as stored, F32 or Q8_0.
// `dequantized_dir`, if given, receives the folder of the values written (F32), in Hugging Face's
// layout, so that it and the file hold one model.
#pragma once

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gguf_from_hf.h"

namespace gizllm::testing {

// Value head j of key head k between Hugging Face's grouped order (k * per_k + j) and the
// file's tiled one (j * k_heads + k), along `unit` floats a unit from `first`, `head` units a
// head: grouped to tiled, or back with `untile`.
inline void ReorderValueHeads(std::vector<float>* v, int64_t first, int64_t k_heads, int64_t per_k,
                              int64_t head, int64_t unit, bool untile = false) {
  const std::vector<float> in = *v;
  const int64_t head_floats = head * unit;
  for (int64_t k = 0; k < k_heads; ++k) {
    for (int64_t j = 0; j < per_k; ++j) {
      int64_t from = k * per_k + j, to = j * k_heads + k;
      if (untile) std::swap(from, to);
      std::copy(in.begin() + first + from * head_floats,
                in.begin() + first + (from + 1) * head_floats,
                v->begin() + first + to * head_floats);
    }
  }
}
inline void TileValueHeads(std::vector<float>* v, int64_t first, int64_t k_heads, int64_t per_k,
                           int64_t head, int64_t unit) {
  ReorderValueHeads(v, first, k_heads, per_k, head, unit);
}
inline void UntileValueHeads(std::vector<float>* v, int64_t first, int64_t k_heads, int64_t per_k,
                             int64_t head, int64_t unit) {
  ReorderValueHeads(v, first, k_heads, per_k, head, unit, /*untile=*/true);
}

inline Status WriteQwen35GgufFromHf(const std::string& dir, const std::string& out,
                                    GgufLinears linears, const std::string& dequantized_dir = "",
                                    const std::string& pre = "qwen2") {
  const nlohmann::json top = ReadJsonFile(dir + "/config.json");
  const nlohmann::json config = top.contains("text_config") ? top["text_config"] : top;
  const std::string model_type = config["model_type"].get<std::string>();
  const bool moe = model_type == "qwen3_5_moe_text";
  if (!moe && model_type != "qwen3_5_text") return InvalidArgument(model_type + ": not Qwen3.5");
  const std::string arch = moe ? "qwen35moe" : "qwen35";
  const std::string p = arch + ".";
  auto ckpt = Checkpoint::Open(dir);
  if (!ckpt.ok()) return ckpt.status();
  const int64_t layers = config["num_hidden_layers"].get<int64_t>();
  const int64_t nextn = config.value("mtp_num_hidden_layers", 0);
  const int64_t hidden = config["hidden_size"].get<int64_t>();
  const int64_t heads = config["num_attention_heads"].get<int64_t>();
  const int64_t head_dim = config.value("head_dim", hidden / heads);
  const int64_t k_heads = config["linear_num_key_heads"].get<int64_t>();
  const int64_t v_heads = config["linear_num_value_heads"].get<int64_t>();
  const int64_t k_dim = config["linear_key_head_dim"].get<int64_t>();
  const int64_t v_dim = config["linear_value_head_dim"].get<int64_t>();
  const int64_t per_k = v_heads / k_heads;
  const nlohmann::json rope = config.value("rope_parameters", nlohmann::json::object());
  const double partial = rope.value("partial_rotary_factor", config.value("partial_rotary_factor", 0.25));

  GgufWriter w;
  w.String("general.architecture", arch);
  w.Uint32(p + "block_count", static_cast<uint32_t>(layers + nextn));
  w.Uint32(p + "context_length", config["max_position_embeddings"].get<uint32_t>());
  w.Uint32(p + "embedding_length", static_cast<uint32_t>(hidden));
  if (config.contains("intermediate_size")) {
    w.Uint32(p + "feed_forward_length", config["intermediate_size"].get<uint32_t>());
  }
  w.Uint32(p + "attention.head_count", static_cast<uint32_t>(heads));
  w.Uint32(p + "attention.head_count_kv", config["num_key_value_heads"].get<uint32_t>());
  w.Uint32(p + "attention.key_length", static_cast<uint32_t>(head_dim));
  w.Uint32(p + "attention.value_length", static_cast<uint32_t>(head_dim));
  w.Float32(p + "rope.freq_base", rope.value("rope_theta", 10000.0f));
  w.Float32(p + "attention.layer_norm_rms_epsilon", config["rms_norm_eps"].get<float>());
  w.Uint32(p + "rope.dimension_count", static_cast<uint32_t>(head_dim * partial));
  std::vector<int32_t> sections = {11, 11, 10, 0};
  if (rope.contains("mrope_section")) {
    sections.assign(4, 0);
    for (size_t i = 0; i < rope["mrope_section"].size() && i < 4; ++i)
      sections[i] = rope["mrope_section"][i].get<int32_t>();
  }
  w.Int32s(p + "rope.dimension_sections", sections);
  if (moe) {
    w.Uint32(p + "expert_count", config["num_experts"].get<uint32_t>());
    w.Uint32(p + "expert_used_count", config["num_experts_per_tok"].get<uint32_t>());
    w.Uint32(p + "expert_feed_forward_length", config["moe_intermediate_size"].get<uint32_t>());
    w.Uint32(p + "expert_shared_feed_forward_length",
             config["shared_expert_intermediate_size"].get<uint32_t>());
  }
  w.Uint32(p + "ssm.conv_kernel", config["linear_conv_kernel_dim"].get<uint32_t>());
  w.Uint32(p + "ssm.state_size", static_cast<uint32_t>(k_dim));
  w.Uint32(p + "ssm.group_count", static_cast<uint32_t>(k_heads));
  w.Uint32(p + "ssm.time_step_rank", static_cast<uint32_t>(v_heads));
  w.Uint32(p + "ssm.inner_size", static_cast<uint32_t>(v_dim * v_heads));
  std::vector<bool> recurrent;
  for (const auto& t : config["layer_types"]) recurrent.push_back(t == "linear_attention");
  for (int64_t i = 0; i < nextn; ++i) recurrent.push_back(false);
  w.Bools(p + "attention.recurrent_layers", recurrent);
  w.Uint32(p + "full_attention_interval", config.value("full_attention_interval", 4));
  if (nextn > 0) w.Uint32(p + "nextn_predict_layers", static_cast<uint32_t>(nextn));
  nlohmann::json tok_config = top;
  WriteTokenizerMetadata(dir, pre, tok_config, &w);

  // Hugging Face name (the text model's, "model." prefix) -> GGUF suffix of a layer.
  static const std::map<std::string, std::string> kLayer = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"post_attention_layernorm.weight", "post_attention_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"self_attn.q_norm.weight", "attn_q_norm.weight"},
      {"self_attn.k_norm.weight", "attn_k_norm.weight"},
      {"linear_attn.in_proj_qkv.weight", "attn_qkv.weight"},
      {"linear_attn.in_proj_z.weight", "attn_gate.weight"},
      {"linear_attn.in_proj_b.weight", "ssm_beta.weight"},
      {"linear_attn.in_proj_a.weight", "ssm_alpha.weight"},
      {"linear_attn.conv1d.weight", "ssm_conv1d.weight"},
      {"linear_attn.A_log", "ssm_a"},
      {"linear_attn.dt_bias", "ssm_dt.bias"},
      {"linear_attn.norm.weight", "ssm_norm.weight"},
      {"linear_attn.out_proj.weight", "ssm_out.weight"},
      {"mlp.gate.weight", "ffn_gate_inp.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},
      {"mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight"},
      {"mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight"},
      {"mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight"},
      {"mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight"}};
  static const std::map<std::string, std::string> kMtp = {
      {"mtp.fc.weight", "nextn.eh_proj.weight"},
      {"mtp.pre_fc_norm_embedding.weight", "nextn.enorm.weight"},
      {"mtp.pre_fc_norm_hidden.weight", "nextn.hnorm.weight"},
      {"mtp.norm.weight", "nextn.shared_head_norm.weight"}};

  struct Out {
    std::string gguf;                 // GGUF name
    std::vector<int64_t> shape;       // GGUF shape, outermost first
    std::vector<float> values;        // in the file's layout
    std::vector<std::string> hf;      // the Hugging Face tensors it holds (experts: several)
    std::vector<std::vector<int64_t>> hf_shapes;
    bool matrix = false;              // a linear (as stored, F32 or Q8_0); else F32
    std::string role;                 // the layer suffix ("attn_qkv.weight", ...)
    bool stored_half = false;
    DType dtype = DType::kF32;
  };
  std::vector<Out> outs;
  // Experts: per expert tensors gathered into stacks, fused stacks split.
  std::map<std::string, Out> stacks;  // GGUF name -> stack being built
  for (const TensorInfo* t : ckpt->All()) {
    std::string name = t->name;
    if (name.rfind("model.visual.", 0) == 0) continue;
    std::string text = name;
    if (text.rfind("model.language_model.", 0) == 0) text = "model." + text.substr(21);
    std::string layer, suffix;
    if (text == "model.embed_tokens.weight") {
      suffix = "token_embd.weight";
    } else if (text == "model.norm.weight") {
      suffix = "output_norm.weight";
    } else if (text == "lm_head.weight") {
      suffix = "output.weight";
    } else if (auto it = kMtp.find(text); it != kMtp.end()) {
      layer = std::to_string(layers), suffix = it->second;
    } else {
      std::string rest;
      if (text.rfind("model.layers.", 0) == 0) {
        rest = text.substr(13);
      } else if (text.rfind("mtp.layers.0.", 0) == 0) {
        rest = std::to_string(layers) + "." + text.substr(13);
      } else {
        return InvalidArgument(name + ": no GGUF name");
      }
      layer = rest.substr(0, rest.find('.'));
      suffix = rest.substr(rest.find('.') + 1);
    }
    std::vector<float> v = ToF32(*t);
    std::vector<int64_t> shape = t->shape;
    const bool half = t->dtype == DType::kBF16 || t->dtype == DType::kF16;
    // Experts.
    if (suffix.rfind("mlp.experts.", 0) == 0) {
      const std::string rest = suffix.substr(12);
      std::vector<std::pair<std::string, int64_t>> parts;  // (kind, expert) of each row block
      if (rest == "gate_up_proj" || rest == "down_proj") {
        // Stacked [E, rows, cols]: gate_up split into gate and up.
        const int64_t e = shape[0], rows = shape[1], cols = shape[2];
        const std::vector<std::string> kinds =
            rest == "down_proj" ? std::vector<std::string>{"down"}
                                : std::vector<std::string>{"gate", "up"};
        const int64_t part_rows = rows / static_cast<int64_t>(kinds.size());
        for (size_t k = 0; k < kinds.size(); ++k) {
          Out& o = stacks["blk." + layer + ".ffn_" + kinds[k] + "_exps.weight"];
          o.shape = {e, part_rows, cols};
          o.matrix = true;
          o.stored_half = half;
          o.dtype = t->dtype;
          o.values.resize(e * part_rows * cols);
          for (int64_t x = 0; x < e; ++x) {
            std::copy(v.begin() + (x * rows + k * part_rows) * cols,
                      v.begin() + (x * rows + (k + 1) * part_rows) * cols,
                      o.values.begin() + x * part_rows * cols);
          }
          o.hf = {name};
          o.hf_shapes = {shape};
          o.role = kinds.size() == 2 ? "fused:" + std::to_string(k) : "stacked";
        }
        continue;
      }
      const std::string id = rest.substr(0, rest.find('.'));
      const std::string kind = rest.substr(rest.find('.') + 1);  // gate_proj.weight
      const int64_t experts = config["num_experts"].get<int64_t>();
      Out& o = stacks["blk." + layer + ".ffn_" + kind.substr(0, kind.find('_')) + "_exps.weight"];
      if (o.values.empty()) {
        o.shape = {experts, shape[0], shape[1]};
        o.values.resize(experts * shape[0] * shape[1]);
        o.hf.resize(experts);
        o.hf_shapes.assign(experts, shape);
        o.matrix = true;
        o.stored_half = half;
        o.dtype = t->dtype;
        o.role = "experts";
      }
      const int64_t x = std::stoll(id);
      std::copy(v.begin(), v.end(), o.values.begin() + x * shape[0] * shape[1]);
      o.hf[x] = name;
      continue;
    }
    std::string gguf;
    if (layer.empty()) {
      gguf = suffix;
    } else if (suffix.rfind("nextn.", 0) == 0) {
      gguf = "blk." + layer + "." + suffix;
    } else {
      auto it = kLayer.find(suffix);
      if (it == kLayer.end()) return InvalidArgument(name + ": no GGUF name for " + suffix);
      gguf = "blk." + layer + "." + it->second;
      suffix = it->second;
    }
    // Qwen3NextModel.modify_tensors and the value heads' reorder.
    const bool recurrent = suffix.rfind("attn_qkv", 0) == 0 || suffix.rfind("attn_gate", 0) == 0 ||
                           suffix.rfind("ssm_", 0) == 0;
    if (suffix == "ssm_a") {
      for (float& x : v) x = -std::exp(x);
    } else if (suffix == "ssm_conv1d.weight") {
      shape = {shape[0], shape[2]};
    } else if (gguf.ends_with("norm.weight") && suffix != "ssm_norm.weight") {
      for (float& x : v) x += 1.0f;
    }
    const int64_t key_dim = k_heads * k_dim;
    if (recurrent && per_k > 1) {
      if (suffix == "attn_qkv.weight" || suffix == "ssm_conv1d.weight") {
        TileValueHeads(&v, 2 * key_dim * shape[1], k_heads, per_k, v_dim, shape[1]);
      } else if (suffix == "attn_gate.weight") {
        TileValueHeads(&v, 0, k_heads, per_k, v_dim, shape[1]);
      } else if (suffix == "ssm_beta.weight" || suffix == "ssm_alpha.weight") {
        TileValueHeads(&v, 0, k_heads, per_k, 1, shape[1]);
      } else if (suffix == "ssm_a" || suffix == "ssm_dt.bias") {
        TileValueHeads(&v, 0, k_heads, per_k, 1, 1);
      } else if (suffix == "ssm_out.weight") {
        for (int64_t r = 0; r < shape[0]; ++r) {
          std::vector<float> row(v.begin() + r * shape[1], v.begin() + (r + 1) * shape[1]);
          TileValueHeads(&row, 0, k_heads, per_k, v_dim, 1);
          std::copy(row.begin(), row.end(), v.begin() + r * shape[1]);
        }
      }
    }
    Out o;
    o.gguf = gguf;
    o.shape = shape;
    o.values = std::move(v);
    o.hf = {name};
    o.hf_shapes = {t->shape};
    o.matrix = t->shape.size() == 2 && suffix != "ffn_gate_inp.weight" &&
               suffix != "ssm_conv1d.weight" && suffix != "ffn_gate_inp_shexp.weight";
    o.stored_half = half;
    o.dtype = t->dtype;
    o.role = suffix;
    outs.push_back(std::move(o));
  }
  for (auto& [gguf, o] : stacks) {
    o.gguf = gguf;
    outs.push_back(std::move(o));
  }

  std::vector<TensorToWrite> folder;
  std::vector<std::vector<float>> folder_data;
  folder_data.reserve(outs.size() * 8 + 16);
  std::map<std::string, std::vector<float>> fused;  // gate_up stacks rebuilt from their halves
  for (Out& o : outs) {
    std::string bytes;
    GgmlType type = GgmlType::kF32;
    const int64_t cols = o.shape.back();
    if (o.matrix && linears == GgufLinears::kAsStored && o.stored_half) {
      type = o.dtype == DType::kBF16 ? GgmlType::kBF16 : GgmlType::kF16;
      std::vector<uint16_t> h(o.values.size());
      for (size_t i = 0; i < h.size(); ++i)
        h[i] = type == GgmlType::kBF16 ? F32ToBf16(o.values[i]) : F32ToF16(o.values[i]);
      bytes.assign(reinterpret_cast<const char*>(h.data()), h.size() * 2);
    } else if (o.matrix && linears == GgufLinears::kQ8_0 && cols % 32 == 0) {
      type = GgmlType::kQ8_0;
      bytes = QuantizeQ8_0(o.values);
      GZ_RETURN_IF_ERROR(DequantizeBlocks(type, reinterpret_cast<const uint8_t*>(bytes.data()),
                                          bytes.size(), static_cast<int64_t>(o.values.size()),
                                          o.values.data(), o.gguf));
    } else {
      bytes.assign(reinterpret_cast<const char*>(o.values.data()), o.values.size() * 4);
    }
    w.Tensor(o.gguf, type, o.shape, bytes);
    // The folder: the values written, back in Hugging Face's layout.
    std::vector<float> v = o.values;
    if (o.role == "ssm_a") {
      for (float& x : v) x = std::log(-x);
    } else if (o.gguf.ends_with("norm.weight") && o.role != "ssm_norm.weight") {
      for (float& x : v) x -= 1.0f;
    }
    if (per_k > 1) {
      const int64_t key_dim = k_heads * k_dim;
      const int64_t c = o.shape.size() > 1 ? o.shape[1] : 1;
      if (o.role == "attn_qkv.weight" || o.role == "ssm_conv1d.weight") {
        UntileValueHeads(&v, 2 * key_dim * c, k_heads, per_k, v_dim, c);
      } else if (o.role == "attn_gate.weight") {
        UntileValueHeads(&v, 0, k_heads, per_k, v_dim, c);
      } else if (o.role == "ssm_beta.weight" || o.role == "ssm_alpha.weight") {
        UntileValueHeads(&v, 0, k_heads, per_k, 1, c);
      } else if (o.role == "ssm_a" || o.role == "ssm_dt.bias") {
        UntileValueHeads(&v, 0, k_heads, per_k, 1, 1);
      } else if (o.role == "ssm_out.weight") {
        for (int64_t r = 0; r < o.shape[0]; ++r) {
          std::vector<float> row(v.begin() + r * c, v.begin() + (r + 1) * c);
          UntileValueHeads(&row, 0, k_heads, per_k, v_dim, 1);
          std::copy(row.begin(), row.end(), v.begin() + r * c);
        }
      }
    }
    if (o.role.rfind("fused:", 0) == 0) {
      // Half k of the stack [E, 2F, H] it came from.
      const int64_t e = o.shape[0], f = o.shape[1], h = o.shape[2];
      std::vector<float>& whole = fused[o.hf[0]];
      whole.resize(e * 2 * f * h);
      const int64_t k = std::stoll(o.role.substr(6));
      for (int64_t x = 0; x < e; ++x) {
        std::copy(v.begin() + x * f * h, v.begin() + (x + 1) * f * h,
                  whole.begin() + (x * 2 * f + k * f) * h);
      }
      continue;
    }
    if (o.role == "experts") {
      const int64_t per = o.shape[1] * o.shape[2];
      for (size_t x = 0; x < o.hf.size(); ++x) {
        std::vector<float>& held = folder_data.emplace_back(v.begin() + x * per,
                                                            v.begin() + (x + 1) * per);
        folder.push_back({o.hf[x], DType::kF32, o.hf_shapes[x], held.data(), held.size() * 4});
      }
      continue;
    }
    std::vector<float>& held = folder_data.emplace_back(std::move(v));
    folder.push_back({o.hf[0], DType::kF32, o.hf_shapes[0], held.data(), held.size() * 4});
  }
  for (auto& [name, v] : fused) {
    const TensorInfo* t = ckpt->Find(name);
    std::vector<float>& held = folder_data.emplace_back(std::move(v));
    folder.push_back({name, DType::kF32, t->shape, held.data(), held.size() * 4});
  }
  if (!w.Write(out)) return Internal(out + ": cannot write");
  if (!dequantized_dir.empty()) {
    CopySideFiles(dir, dequantized_dir);
    GZ_RETURN_IF_ERROR(WriteSafetensors(dequantized_dir + "/model.safetensors", folder, {}));
  }
  return Status::Ok();
}

}  // namespace gizllm::testing
