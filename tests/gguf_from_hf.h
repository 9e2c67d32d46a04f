// Writes a Hugging Face model folder (llama, qwen2, qwen3) as a GGUF file the way llama.cpp's
// convert_hf_to_gguf.py does, for tests: its metadata keys, tensor names, 1-D tensors in F32,
// Llama's q/k rows permuted for its rotary layout and Llama 3's rope_freqs.weight, the gpt2
// tokenizer (tokens, token types, merges, special ids) and the chat template. The linears and the
// embedding are written as they are stored (BF16, F16, F32), or as F32, F16 or Q8_0 (ggml's
// quantize_row_q8_0_ref), Q4_0 (quantize_row_q4_0_ref); `dequantized_dir`, if given, receives the
// same model as a Hugging Face folder whose weights are the values written (F16 as F16; the others,
// Q8_0 dequantized, as F32). With kBlocks the matrices (the embedding too) are written as blocks of
// `blocks` with random codes (RandomBlocks); a matrix whose rows are not whole blocks falls back to
// Q8_0, else F32, as llama.cpp's quantizer does. WriteWideHf writes a small random folder whose
// rows are whole 256-element blocks.
#pragma once

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/mapped_file.h"
#include "core/status.h"
#include "formats/ggml_blocks.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "gguf_writer.h"

namespace gizllm::testing {

enum class GgufLinears { kAsStored, kF32, kF16, kQ8_0, kQ4_0, kBlocks };

inline std::vector<float> ToF32(const TensorInfo& t) {
  std::vector<float> v(t.Elements());
  for (size_t i = 0; i < v.size(); ++i) {
    uint16_t h;
    switch (t.dtype) {
      case DType::kF32:
        std::memcpy(&v[i], t.data + 4 * i, 4);
        break;
      case DType::kBF16:
        std::memcpy(&h, t.data + 2 * i, 2);
        v[i] = Bf16ToF32(h);
        break;
      default:
        std::memcpy(&h, t.data + 2 * i, 2);
        v[i] = F16ToF32(h);
        break;
    }
  }
  return v;
}

// ggml's quantize_row_q8_0_ref: per block of 32, d = max|x| / 127, q = round(x / d).
inline std::string QuantizeQ8_0(const std::vector<float>& x) {
  std::string out;
  for (size_t b = 0; b < x.size() / 32; ++b) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t dh = F32ToF16(d);
    out.push_back(static_cast<char>(dh & 0xff));
    out.push_back(static_cast<char>(dh >> 8));
    for (int i = 0; i < 32; ++i) {
      out.push_back(static_cast<char>(static_cast<int8_t>(std::roundf(x[b * 32 + i] * id))));
    }
  }
  return out;
}

// Byte offsets of the f16 scale fields of a block type (ggml-common.h's structs), and the size of
// the codes' largest value, by which a block's largest weight is divided to give its scales.
inline bool BlockScales(GgmlType type, std::vector<int>* offsets, float* range) {
  switch (type) {
    case GgmlType::kQ4_0:
      *offsets = {0}, *range = 8;
      return true;
    case GgmlType::kQ4_1:
      *offsets = {0, 2}, *range = 15;
      return true;
    case GgmlType::kQ5_0:
      *offsets = {0}, *range = 16;
      return true;
    case GgmlType::kQ5_1:
      *offsets = {0, 2}, *range = 31;
      return true;
    case GgmlType::kQ8_0:
      *offsets = {0}, *range = 127;
      return true;
    case GgmlType::kQ2_K:
      *offsets = {80, 82}, *range = 3 * 15;
      return true;
    case GgmlType::kQ3_K:
      *offsets = {108}, *range = 4 * 32;
      return true;
    case GgmlType::kQ4_K:
      *offsets = {0, 2}, *range = 15 * 63;
      return true;
    case GgmlType::kQ5_K:
      *offsets = {0, 2}, *range = 31 * 63;
      return true;
    case GgmlType::kQ6_K:
      *offsets = {208}, *range = 32 * 127;
      return true;
    case GgmlType::kIQ4_NL:
      *offsets = {0}, *range = 127;
      return true;
    case GgmlType::kIQ4_XS:
      *offsets = {0}, *range = 127 * 32;
      return true;
    case GgmlType::kTQ1_0:
      *offsets = {52}, *range = 1;
      return true;
    case GgmlType::kTQ2_0:
      *offsets = {64}, *range = 2;
      return true;
    case GgmlType::kQ1_0:
      *offsets = {0}, *range = 1;
      return true;
    case GgmlType::kQ2_0:
      *offsets = {0}, *range = 2;
      return true;
    case GgmlType::kGZ8:
    case GgmlType::kGZ4:
      *offsets = {0}, *range = 127 * 255;  // d * s[g] (s random bytes) * code
      return true;
    case GgmlType::kGZ4S:
      *offsets = {0}, *range = 127;
      return true;
    default:
      return false;
  }
}

// Blocks of `type` for `x` (whole blocks): random codes, and scale fields of the block's largest
// |x| / range with a random sign, so that the values are of the weights' size (not a
// quantization of them: the tests need a file's values, whatever they are).
inline std::string RandomBlocks(GgmlType type, const std::vector<float>& x, uint32_t seed) {
  GgmlBlock block;
  std::vector<int> offsets;
  float range = 1;
  if (!GgmlBlockOf(type, &block) || !BlockScales(type, &offsets, &range)) return "";
  std::mt19937 rng(seed);
  std::string out;
  for (size_t b = 0; b < x.size() / block.elements; ++b) {
    float amax = 0.0f;
    for (int64_t i = 0; i < block.elements; ++i)
      amax = std::max(amax, std::fabs(x[b * block.elements + i]));
    std::string bytes(block.bytes, '\0');
    for (char& c : bytes) c = static_cast<char>(rng() & 0xff);
    for (int off : offsets) {
      const uint16_t h = F32ToF16((rng() & 1 ? 1.0f : -1.0f) * amax / range);
      bytes[off] = static_cast<char>(h & 0xff);
      bytes[off + 1] = static_cast<char>(h >> 8);
    }
    out += bytes;
  }
  return out;
}

// ggml's quantize_row_q4_0_ref: per block of 32, d = (the value of largest magnitude) / -8,
// q = min(15, trunc(x / d + 8.5)), low nibbles the first 16.
inline std::string QuantizeQ4_0(const std::vector<float>& x) {
  std::string out;
  for (size_t b = 0; b < x.size() / 32; ++b) {
    const float* v = &x[b * 32];
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < 32; ++i) {
      if (amax < std::fabs(v[i])) {
        amax = std::fabs(v[i]);
        max = v[i];
      }
    }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t dh = F32ToF16(d);
    out.push_back(static_cast<char>(dh & 0xff));
    out.push_back(static_cast<char>(dh >> 8));
    for (int i = 0; i < 16; ++i) {
      const int lo = std::min(15, static_cast<int>(static_cast<int8_t>(v[i] * id + 8.5f)));
      const int hi = std::min(15, static_cast<int>(static_cast<int8_t>(v[16 + i] * id + 8.5f)));
      out.push_back(static_cast<char>(lo | hi << 4));
    }
  }
  return out;
}

// LlamaModel.permute: HF row h * head_dim + i * half + j goes to h * head_dim + 2 * j + i.
inline std::string PermuteRows(const std::string& bytes, int64_t heads, int64_t rows) {
  const size_t row_bytes = bytes.size() / rows;
  const int64_t head_dim = rows / heads, half = head_dim / 2;
  std::string out(bytes.size(), '\0');
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t j = 0; j < half; ++j)
        std::memcpy(&out[(h * head_dim + 2 * j + i) * row_bytes],
                    &bytes[(h * head_dim + i * half + j) * row_bytes], row_bytes);
  return out;
}

// convert_hf_to_gguf.py's tensor names.
inline std::string GgufTensorName(const std::string& hf, bool gemma = false) {
  static const std::map<std::string, std::string> kTop = {
      {"model.embed_tokens.weight", "token_embd.weight"},
      {"model.norm.weight", "output_norm.weight"},
      {"lm_head.weight", "output.weight"}};
  if (auto it = kTop.find(hf); it != kTop.end()) return it->second;
  static const std::map<std::string, std::string> kLayer = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"self_attn.q_proj.bias", "attn_q.bias"},
      {"self_attn.k_proj.bias", "attn_k.bias"},
      {"self_attn.v_proj.bias", "attn_v.bias"},
      {"self_attn.o_proj.bias", "attn_output.bias"},
      {"self_attn.q_norm.weight", "attn_q_norm.weight"},
      {"self_attn.k_norm.weight", "attn_k_norm.weight"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},
      {"mlp.gate_proj.bias", "ffn_gate.bias"},
      {"mlp.up_proj.bias", "ffn_up.bias"},
      {"mlp.down_proj.bias", "ffn_down.bias"},
      {"mlp.gate.weight", "ffn_gate_inp.weight"}};
  // Gemma's four norms a layer (its post_attention_layernorm comes after attention, not before
  // the feed-forward).
  static const std::map<std::string, std::string> kGemma = {
      {"post_attention_layernorm.weight", "post_attention_norm.weight"},
      {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
      {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"}};
  const std::string prefix = "model.layers.";
  if (hf.rfind(prefix, 0) != 0) return "";
  const size_t dot = hf.find('.', prefix.size());
  const auto& table = gemma ? kGemma : kLayer;
  auto it = table.find(hf.substr(dot + 1));
  if (gemma && it == table.end()) it = kLayer.find(hf.substr(dot + 1));
  if (it == kLayer.end()) return "";
  return "blk." + hf.substr(prefix.size(), dot - prefix.size()) + "." + it->second;
}

// A folder's files beside its weights (config, generation config, tokenizer), into `to`.
inline void CopySideFiles(const std::string& dir, const std::string& to) {
  namespace fs = std::filesystem;
  fs::create_directories(to);
  for (const char* f :
       {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"}) {
    if (fs::exists(dir + "/" + f))
      fs::copy_file(dir + "/" + f, to + "/" + f, fs::copy_options::overwrite_existing);
  }
}

inline nlohmann::json ReadJsonFile(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

inline void WriteTokenizerMetadata(const std::string& dir, const std::string& pre,
                                   const nlohmann::json& config, GgufWriter* w) {
  namespace fs = std::filesystem;
  if (!fs::exists(dir + "/tokenizer.json")) return;
  const nlohmann::json tok = ReadJsonFile(dir + "/tokenizer.json");
  const nlohmann::json tc = fs::exists(dir + "/tokenizer_config.json")
                                ? ReadJsonFile(dir + "/tokenizer_config.json")
                                : nlohmann::json::object();
  std::map<int64_t, std::string> by_id;
  for (auto it = tok["model"]["vocab"].begin(); it != tok["model"]["vocab"].end(); ++it)
    by_id[it.value().get<int64_t>()] = it.key();
  std::map<int64_t, bool> added;  // id -> special
  for (const auto& a : tok["added_tokens"]) {
    by_id[a["id"].get<int64_t>()] = a["content"].get<std::string>();
    added[a["id"].get<int64_t>()] = a["special"].get<bool>();
  }
  const int64_t vocab = config.value("vocab_size", static_cast<int64_t>(by_id.size()));
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  for (int64_t i = 0; i < vocab; ++i) {
    auto it = by_id.find(i);
    if (it == by_id.end()) {
      tokens.push_back("[PAD" + std::to_string(i) + "]");
      types.push_back(5);  // UNUSED
    } else {
      tokens.push_back(it->second);
      types.push_back(added.count(i) ? (added[i] ? 3 : 4) : 1);  // CONTROL, USER_DEFINED, NORMAL
    }
  }
  std::vector<std::string> merges;
  for (const auto& m : tok["model"]["merges"]) {
    merges.push_back(m.is_string() ? m.get<std::string>()
                                   : m[0].get<std::string>() + " " + m[1].get<std::string>());
  }
  w->String("tokenizer.ggml.model", "gpt2");
  w->String("tokenizer.ggml.pre", pre);
  w->Strings("tokenizer.ggml.tokens", tokens);
  w->Int32s("tokenizer.ggml.token_type", types);
  w->Strings("tokenizer.ggml.merges", merges);
  // SpecialVocab: ids from tokenizer_config.json's tokens, else config.json's ids.
  auto id_of = [&](const char* token_key, const char* id_key) -> int64_t {
    if (tc.contains(token_key) && tc[token_key].is_string()) {
      for (const auto& [id, text] : by_id)
        if (text == tc[token_key].get<std::string>()) return id;
    }
    if (config.contains(id_key) && config[id_key].is_number_integer())
      return config[id_key].get<int64_t>();
    return -1;
  };
  if (int64_t id = id_of("bos_token", "bos_token_id"); id >= 0)
    w->Uint32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(id));
  if (int64_t id = id_of("eos_token", "eos_token_id"); id >= 0)
    w->Uint32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(id));
  if (int64_t id = id_of("pad_token", "pad_token_id"); id >= 0)
    w->Uint32("tokenizer.ggml.padding_token_id", static_cast<uint32_t>(id));
  if (tc.contains("add_bos_token") && tc["add_bos_token"].is_boolean())
    w->Bool("tokenizer.ggml.add_bos_token", tc["add_bos_token"].get<bool>());
  if (tc.contains("chat_template") && tc["chat_template"].is_string())
    w->String("tokenizer.chat_template", tc["chat_template"].get<std::string>());
}

// `pre`: the tokenizer.ggml.pre the converter would pick (it names the pre-tokenizer by a hash of
// its output; a test says which one its tokenizer is).
// Qwen3-MoE (model_type qwen3_moe, GGUF's qwen3moe): the router as ffn_gate_inp, each layer's
// experts stacked [experts, rows, cols] as ffn_gate_exps, ffn_up_exps and ffn_down_exps, or with
// `fuse_gate_up` gate and up in one ffn_gate_up_exps (the converter's fused option).
inline Status WriteGgufFromHf(const std::string& dir, const std::string& out, GgufLinears linears,
                              const std::string& pre = "qwen2",
                              const std::string& dequantized_dir = "",
                              GgmlType blocks = GgmlType::kQ8_0, bool fuse_gate_up = false) {
  const nlohmann::json config = ReadJsonFile(dir + "/config.json");
  const std::string model_type = config["model_type"].get<std::string>();
  const std::string arch = model_type == "qwen3_moe"     ? "qwen3moe"
                           : model_type == "gemma3_text" ? "gemma3"
                                                         : model_type;
  const bool gemma = arch == "gemma3";
  auto ckpt = Checkpoint::Open(dir);
  if (!ckpt.ok()) return ckpt.status();
  const std::string p = arch + ".";
  const int64_t heads = config["num_attention_heads"].get<int64_t>();
  const int64_t kv_heads = config.value("num_key_value_heads", heads);
  const int64_t hidden = config["hidden_size"].get<int64_t>();
  const int64_t head_dim = config.contains("head_dim") && config["head_dim"].is_number_integer()
                               ? config["head_dim"].get<int64_t>()
                               : hidden / heads;
  nlohmann::json rope = nlohmann::json::object();
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (config.contains(key) && config[key].is_object()) rope = config[key];
  }
  if (rope.contains("full_attention")) rope = rope["full_attention"];  // Gemma 3's global layers
  const double theta = rope.value("rope_theta", config.value("rope_theta", 10000.0));

  GgufWriter w;
  w.String("general.architecture", arch);
  w.String("general.name", std::filesystem::path(dir).filename().string());
  w.Uint32(p + "block_count", config["num_hidden_layers"].get<uint32_t>());
  w.Uint32(p + "context_length", config["max_position_embeddings"].get<uint32_t>());
  w.Uint32(p + "embedding_length", static_cast<uint32_t>(hidden));
  w.Uint32(p + "feed_forward_length", config["intermediate_size"].get<uint32_t>());
  w.Uint32(p + "attention.head_count", static_cast<uint32_t>(heads));
  w.Uint32(p + "attention.head_count_kv", static_cast<uint32_t>(kv_heads));
  w.Float32(p + "rope.freq_base", static_cast<float>(theta));
  w.Float32(p + "attention.layer_norm_rms_epsilon", config["rms_norm_eps"].get<float>());
  if (config.contains("head_dim")) {
    w.Uint32(p + "attention.key_length", static_cast<uint32_t>(head_dim));
    w.Uint32(p + "attention.value_length", static_cast<uint32_t>(head_dim));
  }
  w.Uint32(p + "rope.dimension_count", static_cast<uint32_t>(head_dim));
  if (rope.value("rope_type", "") == "linear") {
    w.String(p + "rope.scaling.type", "linear");
    w.Float32(p + "rope.scaling.factor", rope["factor"].get<float>());
  }
  if (gemma) {
    // Gemma3Model.set_gguf_parameters: the sliding window (the converter leaves the pattern to
    // llama.cpp's default of 6; layer_types that differ from it are written as a flag a layer,
    // which llama.cpp reads too) and the final soft-capping where the model has one.
    w.Uint32(p + "attention.sliding_window", config["sliding_window"].get<uint32_t>());
    if (config.contains("layer_types")) {
      std::vector<bool> flags;
      bool pattern6 = true;
      for (size_t l = 0; l < config["layer_types"].size(); ++l) {
        flags.push_back(config["layer_types"][l] == "sliding_attention");
        pattern6 = pattern6 && flags.back() == (l % 6 < 5);
      }
      if (!pattern6) w.Bools(p + "attention.sliding_window_pattern", flags);
    }
    if (config.contains("final_logit_softcapping") &&
        config["final_logit_softcapping"].is_number()) {
      w.Float32(p + "final_logit_softcapping", config["final_logit_softcapping"].get<float>());
    }
  }
  w.Uint32("general.file_type", linears == GgufLinears::kQ8_0 ? 7 : 1);
  const int64_t experts = config.value("num_experts", config.value("num_local_experts", 0));
  if (experts > 0) {
    w.Uint32(p + "expert_count", static_cast<uint32_t>(experts));
    w.Uint32(p + "expert_used_count", config["num_experts_per_tok"].get<uint32_t>());
    w.Uint32(p + "expert_feed_forward_length", config["moe_intermediate_size"].get<uint32_t>());
  }
  GgmlBlock block;
  if (linears == GgufLinears::kBlocks && !GgmlBlockOf(blocks, &block)) {
    return InvalidArgument("no block type " + GgmlTypeName(blocks));
  }
  WriteTokenizerMetadata(dir, pre, config, &w);

  std::vector<TensorToWrite> dequantized;
  std::vector<std::vector<float>> dequantized_data;
  dequantized_data.reserve(ckpt->All().size());
  std::vector<std::string> stack_bytes;
  stack_bytes.reserve(ckpt->All().size());
  for (const TensorInfo* t : ckpt->All()) {
    std::string name = GgufTensorName(t->name, gemma);
    // An expert's matrix: expert 0's gate (and up, down) stands for the layer's stack.
    std::vector<std::string> parts;  // the Hugging Face names the stack holds, in order
    TensorInfo stacked;
    const size_t experts_at = t->name.find(".mlp.experts.");
    if (name.empty() && experts_at != std::string::npos) {
      const std::string layer = t->name.substr(13, t->name.find('.', 13) - 13);
      const size_t id_at = experts_at + 13;
      const std::string kind = t->name.substr(t->name.find('.', id_at) + 1);  // gate_proj.weight
      if (t->name.substr(id_at, t->name.find('.', id_at) - id_at) != "0") continue;
      const bool fused = fuse_gate_up && kind == "gate_proj.weight";
      if (fuse_gate_up && kind == "up_proj.weight") continue;
      const std::string head = t->name.substr(0, id_at);
      std::string& held = stack_bytes.emplace_back();
      for (int64_t e = 0; e < experts; ++e) {
        for (const std::string& k : fused ? std::vector<std::string>{"gate_proj.weight",
                                                                     "up_proj.weight"}
                                          : std::vector<std::string>{kind}) {
          const std::string one = head + std::to_string(e) + "." + k;
          const TensorInfo* part = ckpt->Find(one);
          if (!part || part->dtype != t->dtype || part->shape != t->shape)
            return InvalidArgument(one + ": missing, or not like expert 0's");
          held.append(reinterpret_cast<const char*>(part->data), part->bytes);
          parts.push_back(one);
        }
      }
      stacked = *t;
      stacked.shape = {experts, (fused ? 2 : 1) * t->shape[0], t->shape[1]};
      stacked.data = reinterpret_cast<const uint8_t*>(held.data());
      stacked.bytes = held.size();
      t = &stacked;
      name = "blk." + layer + "." +
             (fused ? "ffn_gate_up" : "ffn_" + kind.substr(0, kind.find('_'))) + "_exps.weight";
    }
    if (name.empty()) return InvalidArgument(t->name + ": no GGUF name");
    std::string bytes(reinterpret_cast<const char*>(t->data), t->bytes);
    GgmlType type = t->dtype == DType::kF32   ? GgmlType::kF32
                    : t->dtype == DType::kF16 ? GgmlType::kF16
                                              : GgmlType::kBF16;
    std::vector<float> values = ToF32(*t);
    // The router stays F32, as llama-quantize leaves it.
    const bool router = name.ends_with("ffn_gate_inp.weight");
    if (linears == GgufLinears::kBlocks && t->shape.size() >= 2 && !router &&
        t->shape.back() % block.elements == 0) {
      type = blocks;
      bytes = RandomBlocks(type, values, static_cast<uint32_t>(dequantized_data.size()));
      if (bytes.empty()) return InvalidArgument("no random blocks of " + GgmlTypeName(type));
      GZ_RETURN_IF_ERROR(DequantizeBlocks(type, reinterpret_cast<const uint8_t*>(bytes.data()),
                                          bytes.size(), static_cast<int64_t>(values.size()),
                                          values.data(), name));
    } else if (t->shape.size() == 1 || linears == GgufLinears::kF32 || router ||
               (linears != GgufLinears::kF16 && t->shape.back() % 32 != 0)) {
      type = GgmlType::kF32;
      bytes.assign(reinterpret_cast<const char*>(values.data()), values.size() * 4);
    } else if (linears == GgufLinears::kF16) {
      type = GgmlType::kF16;
      std::vector<uint16_t> halves(values.size());
      for (size_t i = 0; i < values.size(); ++i) halves[i] = F32ToF16(values[i]);
      bytes.assign(reinterpret_cast<const char*>(halves.data()), halves.size() * 2);
    } else if (linears == GgufLinears::kQ4_0) {
      type = GgmlType::kQ4_0;
      bytes = QuantizeQ4_0(values);
      GZ_RETURN_IF_ERROR(DequantizeBlocks(type, reinterpret_cast<const uint8_t*>(bytes.data()),
                                          bytes.size(), static_cast<int64_t>(values.size()),
                                          values.data(), name));
    } else if (linears == GgufLinears::kQ8_0 || linears == GgufLinears::kBlocks) {
      type = GgmlType::kQ8_0;
      bytes = QuantizeQ8_0(values);
      GZ_RETURN_IF_ERROR(DequantizeBlocks(type, reinterpret_cast<const uint8_t*>(bytes.data()),
                                          bytes.size(), static_cast<int64_t>(values.size()),
                                          values.data(), name));
    }
    // The folder holds the values written: F16 and BF16 as the same halves, the others as
    // float32; a stack's experts each under its own name.
    const bool halves = type == GgmlType::kF16 || type == GgmlType::kBF16;
    const DType folder_type = type == GgmlType::kF16    ? DType::kF16
                              : type == GgmlType::kBF16 ? DType::kBF16
                                                        : DType::kF32;
    std::vector<std::string> names = parts;
    if (names.empty()) names.push_back(t->name);
    const size_t count = values.size() / names.size();
    const size_t size = halves ? 2 : 4;
    for (size_t i = 0; i < names.size(); ++i) {
      std::vector<float>& held = dequantized_data.emplace_back((count * size + 3) / 4);
      std::memcpy(held.data(),
                  halves ? static_cast<const void*>(bytes.data() + i * count * 2)
                         : static_cast<const void*>(values.data() + i * count),
                  count * size);
      std::vector<int64_t> shape = t->shape;
      if (!parts.empty()) {
        shape = {t->shape[1] / static_cast<int64_t>(parts.size() / experts), t->shape[2]};
      }
      dequantized.push_back({names[i], folder_type, shape, held.data(), count * size});
    }
    if (gemma && t->name.ends_with("norm.weight")) {
      // Gemma3Model.modify_tensors: its norms multiply by 1 + w, written as 1 + w (float32).
      std::vector<float> shifted = values;
      for (float& v : shifted) v += 1.0f;
      bytes.assign(reinterpret_cast<const char*>(shifted.data()), shifted.size() * 4);
    }
    if (arch == "llama") {
      const bool q = name.find(".attn_q.") != std::string::npos;
      const bool k = name.find(".attn_k.") != std::string::npos;
      if (q || k) bytes = PermuteRows(bytes, q ? heads : kv_heads, t->shape[0]);
    }
    w.Tensor(name, type, t->shape, bytes);
  }
  if (rope.value("rope_type", "") == "llama3") {
    const double factor = rope.value("factor", 8.0), low = rope.value("low_freq_factor", 1.0),
                 high = rope.value("high_freq_factor", 4.0);
    const double original = rope.value("original_max_position_embeddings", 8192.0);
    std::vector<float> factors;
    for (int64_t i = 0; i < head_dim; i += 2) {
      const float freq = 1.0f / std::pow(static_cast<float>(theta),
                                         static_cast<float>(i) / static_cast<float>(head_dim));
      const double wavelen = 2 * M_PI / freq;
      if (wavelen < original / high) {
        factors.push_back(1.0f);
      } else if (wavelen > original / low) {
        factors.push_back(static_cast<float>(factor));
      } else {
        const double smooth = (original / wavelen - low) / (high - low);
        factors.push_back(static_cast<float>(1 / ((1 - smooth) / factor + smooth)));
      }
    }
    w.Tensor("rope_freqs.weight", GgmlType::kF32, {static_cast<int64_t>(factors.size())},
             std::string(reinterpret_cast<const char*>(factors.data()), factors.size() * 4));
  }
  if (!w.Write(out)) return Internal(out + ": cannot write");
  if (!dequantized_dir.empty()) {
    CopySideFiles(dir, dequantized_dir);
    if (gemma) {
      // The file does not say query_pre_attn_scalar: llama.cpp scales by 1/sqrt(head_dim) (by
      // hidden / heads for the 62-layer model), and so does the folder of the values written.
      nlohmann::json c = config;
      c["query_pre_attn_scalar"] =
          config["num_hidden_layers"].get<int64_t>() == 62 ? hidden / heads : head_dim;
      std::ofstream(dequantized_dir + "/config.json") << c.dump(2) << "\n";
    }
    GZ_RETURN_IF_ERROR(WriteSafetensors(dequantized_dir + "/model.safetensors", dequantized, {}));
  }
  return Status::Ok();
}

// A random Hugging Face folder of `family` (qwen3 or llama) whose linears take 256 inputs or a
// multiple, for the 256-element block types: hidden 256, 2 heads of 128, 1 kv head, ffn 512.
inline Status WriteWideHf(const std::string& dir, const std::string& family) {
  std::filesystem::create_directories(dir);
  nlohmann::json c = {{"model_type", family},
                      {"hidden_size", 256},
                      {"intermediate_size", 512},
                      {"num_hidden_layers", 2},
                      {"num_attention_heads", 2},
                      {"num_key_value_heads", 1},
                      {"head_dim", 128},
                      {"vocab_size", 96},
                      {"max_position_embeddings", 128},
                      {"rms_norm_eps", 1e-6},
                      {"rope_theta", 10000.0},
                      {"tie_word_embeddings", family == "qwen3"},
                      {"eos_token_id", 2}};
  std::ofstream(dir + "/config.json") << c.dump();
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {
      {"model.embed_tokens.weight", {96, 256}}, {"model.norm.weight", {256}}};
  if (family == "llama") shapes.push_back({"lm_head.weight", {96, 256}});
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    for (const auto& [name, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
             {"input_layernorm.weight", {256}},
             {"post_attention_layernorm.weight", {256}},
             {"self_attn.q_proj.weight", {256, 256}},
             {"self_attn.k_proj.weight", {128, 256}},
             {"self_attn.v_proj.weight", {128, 256}},
             {"self_attn.o_proj.weight", {256, 256}},
             {"mlp.gate_proj.weight", {512, 256}},
             {"mlp.up_proj.weight", {512, 256}},
             {"mlp.down_proj.weight", {256, 512}}}) {
      shapes.push_back({p + name, shape});
    }
    if (family == "qwen3") {
      shapes.push_back({p + "self_attn.q_norm.weight", {128}});
      shapes.push_back({p + "self_attn.k_norm.weight", {128}});
    }
  }
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::vector<std::vector<uint16_t>> data;
  data.reserve(shapes.size());
  std::vector<TensorToWrite> tensors;
  for (const auto& [name, shape] : shapes) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<uint16_t>& v = data.emplace_back(n);
    for (uint16_t& h : v) h = F32ToBf16(shape.size() == 1 ? 1.0f + normal(rng) : normal(rng));
    tensors.push_back({name, DType::kBF16, shape, v.data(), v.size() * 2});
  }
  return WriteSafetensors(dir + "/model.safetensors", tensors, {});
}

}  // namespace gizllm::testing
