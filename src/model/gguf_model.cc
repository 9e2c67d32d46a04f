#include "model/gguf_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "core/dtype.h"
#include "formats/ggml_blocks.h"
#include "model/config.h"

namespace gizllm {
namespace {

using nlohmann::json;

// Names and values come from the file: show at most 200 bytes of one.
std::string Quote(std::string_view s) {
  if (s.size() > 200) return "\"" + std::string(s.substr(0, 200)) + "...\"";
  return "\"" + std::string(s) + "\"";
}

// The families a GGUF file may name (general.architecture), by llama.cpp's names.
constexpr std::string_view kGgufFamilies[] = {"llama",  "qwen2",  "qwen3",    "qwen3moe",
                                               "gemma3", "qwen35", "qwen35moe"};

// config.json's model_type of a GGUF family.
std::string ModelType(const std::string& family) {
  if (family == "qwen3moe") return "qwen3_moe";
  if (family == "gemma3") return "gemma3_text";
  if (family == "qwen35") return "qwen3_5_text";
  if (family == "qwen35moe") return "qwen3_5_moe_text";
  return family;
}

bool IsQwen35(const std::string& family) { return family == "qwen35" || family == "qwen35moe"; }

// GGUF tensor names (llama.cpp's llama-arch.cpp) by role; a layer's are "blk.N." + suffix.
struct GgufName {
  std::string_view suffix;
  TensorRole role;
};
constexpr GgufName kLayerNames[] = {
    {"attn_norm.weight", TensorRole::kAttnNorm}, {"attn_q.weight", TensorRole::kQ},
    {"attn_k.weight", TensorRole::kK},           {"attn_v.weight", TensorRole::kV},
    {"attn_output.weight", TensorRole::kO},      {"attn_q.bias", TensorRole::kQBias},
    {"attn_k.bias", TensorRole::kKBias},         {"attn_v.bias", TensorRole::kVBias},
    {"attn_output.bias", TensorRole::kOBias},    {"attn_q_norm.weight", TensorRole::kQNorm},
    {"attn_k_norm.weight", TensorRole::kKNorm},  {"ffn_norm.weight", TensorRole::kFfnNorm},
    {"ffn_gate.weight", TensorRole::kGate},      {"ffn_up.weight", TensorRole::kUp},
    {"ffn_down.weight", TensorRole::kDown},      {"ffn_gate.bias", TensorRole::kGateBias},
    {"ffn_up.bias", TensorRole::kUpBias},        {"ffn_down.bias", TensorRole::kDownBias},
    // Gemma's norms after attention and after the feed-forward (its ffn_norm is the one before).
    {"post_attention_norm.weight", TensorRole::kAttnPostNorm},
    {"post_ffw_norm.weight", TensorRole::kFfnPostNorm},
    // Mixture-of-experts layers: the router, and every expert's gate, up and down stacked
    // [experts, rows, cols] (or gate and up in one stack, gate rows first, as the converter
    // writes them with its fused option).
    {"ffn_gate_inp.weight", TensorRole::kRouter},
    {"ffn_gate_exps.weight", TensorRole::kExpertGate},
    {"ffn_up_exps.weight", TensorRole::kExpertUp},
    {"ffn_down_exps.weight", TensorRole::kExpertDown},
    {"ffn_gate_up_exps.weight", TensorRole::kExpertsGateUp},
    // A shared expert beside the experts (Qwen3.5-MoE) and its gate.
    {"ffn_gate_shexp.weight", TensorRole::kSharedGate},
    {"ffn_up_shexp.weight", TensorRole::kSharedUp},
    {"ffn_down_shexp.weight", TensorRole::kSharedDown},
    {"ffn_gate_inp_shexp.weight", TensorRole::kSharedExpertGate},
    // Qwen3.5's recurrent layers (gated delta net).
    {"attn_qkv.weight", TensorRole::kRecurrentQkv},
    {"attn_gate.weight", TensorRole::kRecurrentZ},
    {"ssm_beta.weight", TensorRole::kRecurrentB},
    {"ssm_alpha.weight", TensorRole::kRecurrentA},
    {"ssm_conv1d.weight", TensorRole::kRecurrentConv},
    {"ssm_a", TensorRole::kRecurrentALog},
    {"ssm_dt.bias", TensorRole::kRecurrentDtBias},
    {"ssm_norm.weight", TensorRole::kRecurrentNorm},
    {"ssm_out.weight", TensorRole::kRecurrentOut},
};

// The MTP layer's own tensors (blk.N.nextn.*, N the first layer past the model's) by their
// names under Arch::mtp_prefix; empty for the converter's optional copies of the embedding and
// head, which the MTP layer does not keep (it reads the model's).
struct NextnName {
  std::string_view suffix, name;
  bool norm;
};
constexpr NextnName kNextnNames[] = {
    {"nextn.eh_proj.weight", "fc.weight", false},
    {"nextn.enorm.weight", "pre_fc_norm_embedding.weight", true},
    {"nextn.hnorm.weight", "pre_fc_norm_hidden.weight", true},
    {"nextn.shared_head_norm.weight", "norm.weight", true},
    {"nextn.embed_tokens.weight", "", false},
    {"nextn.shared_head_head.weight", "", false},
};

// Qwen3.5 files hold the value heads of a recurrent layer tiled (value head j of key head k at
// j * key heads + k) where Hugging Face groups them (at k * per key + j): `units` units of
// `unit_bytes` each from `first` on, `head_units` a head, copied from the file's order into
// Hugging Face's.
void UntileValueHeads(const uint8_t* tiled, int64_t k_heads, int64_t per_k, int64_t head_units,
                      size_t unit_bytes, uint8_t* grouped) {
  const size_t head_bytes = static_cast<size_t>(head_units) * unit_bytes;
  for (int64_t k = 0; k < k_heads; ++k) {
    for (int64_t j = 0; j < per_k; ++j) {
      std::memcpy(grouped + (k * per_k + j) * head_bytes, tiled + (j * k_heads + k) * head_bytes,
                  head_bytes);
    }
  }
}

bool IsNormRole(TensorRole role) {
  return role == TensorRole::kFinalNorm || role == TensorRole::kAttnNorm ||
         role == TensorRole::kAttnPostNorm || role == TensorRole::kFfnNorm ||
         role == TensorRole::kFfnPostNorm || role == TensorRole::kQNorm ||
         role == TensorRole::kKNorm;
}

// Whether a GGUF tensor of `role` stacks every expert's matrices.
bool IsExpertStack(TensorRole role) {
  return role == TensorRole::kExpertGate || role == TensorRole::kExpertUp ||
         role == TensorRole::kExpertDown || role == TensorRole::kExpertsGateUp;
}

// The role and layer (-1 outside the layers) of GGUF tensor `name`; false if it has none.
bool ParseTensorName(std::string_view name, TensorRole* role, int* layer) {
  *layer = -1;
  constexpr GgufName kModelNames[] = {{"token_embd.weight", TensorRole::kEmbed},
                                      {"output_norm.weight", TensorRole::kFinalNorm},
                                      {"output.weight", TensorRole::kHead}};
  for (const GgufName& g : kModelNames) {
    if (g.suffix == name) {
      *role = g.role;
      return true;
    }
  }
  if (!name.starts_with("blk.")) return false;
  name.remove_prefix(4);
  int64_t n = 0;
  size_t digits = 0;
  while (digits < name.size() && digits < 7 && name[digits] >= '0' && name[digits] <= '9') {
    n = n * 10 + (name[digits] - '0');
    ++digits;
  }
  if (digits == 0 || digits >= name.size() || name[digits] != '.') return false;
  name.remove_prefix(digits + 1);
  for (const GgufName& g : kLayerNames) {
    if (g.suffix == name) {
      *role = g.role;
      *layer = static_cast<int>(n);
      return true;
    }
  }
  return false;
}

// Hugging Face's row order of a q or k projection (or bias) from llama.cpp's: the converter
// wrote row h * head_dim + 2 * j + i for Hugging Face's h * head_dim + i * head_dim / 2 + j
// (i in {0, 1}: the two rotary halves). `rows` = heads * head_dim rows of `row_bytes` each.
void UndoRotaryPermute(const uint8_t* gguf, int64_t heads, int64_t head_dim, size_t row_bytes,
                       uint8_t* hf) {
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < 2; ++i) {
      for (int64_t j = 0; j < half; ++j) {
        const int64_t from = h * head_dim + 2 * j + i;
        const int64_t to = h * head_dim + i * half + j;
        std::memcpy(hf + to * row_bytes, gguf + from * row_bytes, row_bytes);
      }
    }
  }
}

// The per-dimension divisors of the rotary frequencies that llama.cpp's converter writes for
// Llama 3.1's "llama3" rope (LlamaModel.generate_extra_tensors), from its parameters.
std::vector<double> Llama3Factors(double theta, int64_t head_dim, double factor, double low,
                                  double high, double original) {
  constexpr double kPi = 3.141592653589793;
  std::vector<double> out;
  for (int64_t i = 0; i < head_dim; i += 2) {
    const float freq = 1.0f / std::pow(static_cast<float>(theta),
                                       static_cast<float>(i) / static_cast<float>(head_dim));
    const double wavelen = 2 * kPi / freq;
    if (wavelen < original / high) {
      out.push_back(1.0);
    } else if (wavelen > original / low) {
      out.push_back(factor);
    } else {
      const double smooth = (original / wavelen - low) / (high - low);
      out.push_back(1 / ((1 - smooth) / factor + smooth));
    }
  }
  return out;
}

// config.json's rope_scaling for the rope_freqs.weight tensor: the llama3 parameters whose
// factors it holds (Llama 3's low 1 and high 4; the factor its largest value; the original
// context solved from a factor between the two, or the usual ones), so that the frequencies are
// transformers' own; an error if no parameters give the file's factors.
Expected<json> Llama3Scaling(const std::string& path, const GgufTensor& t, double theta,
                             int64_t head_dim) {
  const std::string where = path + ": tensor \"rope_freqs.weight\"";
  if (t.type != GgmlType::kF32 || t.shape.size() != 1 || t.shape[0] * 2 != head_dim) {
    return DataLoss(where + " must be F32 [" + std::to_string(head_dim / 2) + "], got " +
                    GgmlTypeName(t.type) + " " + ShapeString(t.shape));
  }
  std::vector<float> stored(t.shape[0]);
  std::memcpy(stored.data(), t.data, stored.size() * sizeof(float));
  const double factor = *std::max_element(stored.begin(), stored.end());
  constexpr double kLow = 1.0, kHigh = 4.0;
  std::vector<double> originals;
  for (size_t i = 0; i < stored.size(); ++i) {
    const double f = stored[i];
    if (f <= 1.0 || f >= factor) continue;
    // 1 / f = (1 - s) / factor + s, s = (original / wavelen - low) / (high - low).
    const double s = (1 / f - 1 / factor) / (1 - 1 / factor);
    const float freq = 1.0f / std::pow(static_cast<float>(theta),
                                       static_cast<float>(2 * i) / static_cast<float>(head_dim));
    originals.push_back(std::round((s * (kHigh - kLow) + kLow) * (2 * 3.141592653589793 / freq)));
    break;
  }
  for (double o : {8192.0, 4096.0, 16384.0, 32768.0, 2048.0}) originals.push_back(o);
  for (double original : originals) {
    const std::vector<double> want = Llama3Factors(theta, head_dim, factor, kLow, kHigh, original);
    bool same = true;
    for (size_t i = 0; i < stored.size() && same; ++i) {
      same = stored[i] == static_cast<float>(want[i]) ||
             std::abs(stored[i] - want[i]) <= 1e-6 * std::abs(want[i]);
    }
    if (same) {
      return json{{"rope_type", "llama3"},
                  {"factor", factor},
                  {"low_freq_factor", kLow},
                  {"high_freq_factor", kHigh},
                  {"original_max_position_embeddings", static_cast<int64_t>(original)}};
    }
  }
  return Unimplemented(where +
                       " holds rotary factors that no llama3 scaling (low_freq_factor 1, "
                       "high_freq_factor 4) gives; such scaling is not supported");
}

// The experts' counts and width of a mixture-of-experts file (keys under prefix p).
Status ReadExpertCounts(const GgufFile& f, const std::string& p, json* c) {
  const std::pair<const char*, const char*> kExperts[] = {
      {"expert_count", "num_experts"},
      {"expert_used_count", "num_experts_per_tok"},
      {"expert_feed_forward_length", "moe_intermediate_size"},
  };
  for (const auto& [key, field] : kExperts) {
    GZ_ASSIGN_OR_RETURN(uint64_t v, f.GetUint(p + key));
    (*c)[field] = v;
  }
  return Status::Ok();
}

// Gemma 3's fields as llama.cpp's gemma3 graph reads the file: the attention scale
// 1/sqrt(head_dim) (1/sqrt(hidden / heads) for its 62-layer model; the converter does not write
// query_pre_attn_scalar), sliding layers where attention.sliding_window is set (the pattern
// attention.sliding_window_pattern, a flag a layer or a period n whose last layer is global,
// default 6), their rotary base rope.freq_base_swa (default 10000, unscaled), the global layers'
// rope.freq_base with the file's linear scaling; final_logit_softcapping where the file has it.
Status ReadGemma3Config(const GgufFile& f, json* config) {
  json& c = *config;
  const std::string p = "gemma3.";
  const int64_t layers = c["num_hidden_layers"].get<int64_t>();
  const int64_t heads = std::max<int64_t>(1, c["num_attention_heads"].get<int64_t>());
  const int64_t head_dim = c.contains("head_dim") ? c["head_dim"].get<int64_t>()
                                                  : c["hidden_size"].get<int64_t>() / heads;
  c["hidden_activation"] = "gelu_pytorch_tanh";
  c["query_pre_attn_scalar"] =
      layers == 62 ? c["hidden_size"].get<int64_t>() / heads : head_dim;
  c["attn_logit_softcapping"] = nullptr;
  c["final_logit_softcapping"] = nullptr;
  if (f.Find(p + "final_logit_softcapping")) {
    GZ_ASSIGN_OR_RETURN(c["final_logit_softcapping"], f.GetFloat(p + "final_logit_softcapping"));
  }
  uint64_t window = 0;
  if (f.Find(p + "attention.sliding_window")) {
    GZ_ASSIGN_OR_RETURN(window, f.GetUint(p + "attention.sliding_window"));
  }
  json types = json::array();
  std::vector<bool> sliding(static_cast<size_t>(layers), false);
  if (window > 0) {
    c["sliding_window"] = window;
    const std::string key = p + "attention.sliding_window_pattern";
    const GgufValue* v = f.Find(key);
    if (v && v->type == GgufType::kArray) {
      if (v->element_type != GgufType::kBool || v->count != static_cast<uint64_t>(layers)) {
        return DataLoss(f.path() + ": metadata \"" + key + "\" must be " +
                        std::to_string(layers) + " bools (one a layer) or a layer count");
      }
      for (int64_t l = 0; l < layers; ++l) sliding[l] = v->elements[l] != 0;
    } else {
      uint64_t period = 6;
      if (v) {
        GZ_ASSIGN_OR_RETURN(period, f.GetUint(key));
      }
      for (int64_t l = 0; l < layers; ++l) {
        sliding[l] = period == 0 || static_cast<uint64_t>(l) % period < period - 1;
      }
    }
  }
  for (int64_t l = 0; l < layers; ++l) {
    types.push_back(sliding[l] ? "sliding_attention" : "full_attention");
  }
  c["layer_types"] = types;
  json full = {{"rope_type", "default"}, {"rope_theta", c.value("rope_theta", 10000.0)}};
  if (c.contains("rope_scaling")) {
    full["rope_type"] = c["rope_scaling"]["rope_type"];
    full["factor"] = c["rope_scaling"]["factor"];
  }
  double local_theta = 10000.0;
  if (f.Find(p + "rope.freq_base_swa")) {
    GZ_ASSIGN_OR_RETURN(local_theta, f.GetFloat(p + "rope.freq_base_swa"));
  }
  c["rope_parameters"] = {{"full_attention", full},
                          {"sliding_attention",
                           {{"rope_type", "default"}, {"rope_theta", local_theta}}}};
  c.erase("rope_theta");
  c.erase("rope_scaling");
  return Status::Ok();
}

// Qwen3.5 (qwen35, and qwen35moe with experts) as llama.cpp's converter writes it: block_count
// counts the MTP layers after the model's (nextn_predict_layers); the recurrent layers' sizes
// are the ssm.* keys (conv_kernel, state_size: the key head size, group_count: key heads,
// time_step_rank: value heads, inner_size: value heads times their size); which layers are
// recurrent, attention.recurrent_layers (a flag a layer, the MTP layers' too) or every layer but
// each full_attention_interval-th (default 4); the rotary sections rope.dimension_sections.
Status ReadQwen35Config(const GgufFile& f, const std::string& family, json* config) {
  json& c = *config;
  const std::string p = family + ".";
  const std::string& path = f.path();
  uint64_t nextn = 0;
  if (f.Find(p + "nextn_predict_layers")) {
    GZ_ASSIGN_OR_RETURN(nextn, f.GetUint(p + "nextn_predict_layers"));
  }
  const uint64_t blocks = c["num_hidden_layers"].get<uint64_t>();
  if (nextn > 1 || nextn >= blocks) {
    return Unimplemented(path + ": " + p + "nextn_predict_layers " + std::to_string(nextn) +
                         " of " + p + "block_count " + std::to_string(blocks) +
                         " (one MTP layer after at least one layer is supported)");
  }
  const uint64_t layers = blocks - nextn;
  c["num_hidden_layers"] = layers;
  if (nextn > 0) c["mtp_num_hidden_layers"] = nextn;
  uint64_t v_heads = 0;
  const std::pair<const char*, const char*> kSsm[] = {
      {"ssm.conv_kernel", "linear_conv_kernel_dim"},
      {"ssm.state_size", "linear_key_head_dim"},
      {"ssm.group_count", "linear_num_key_heads"},
      {"ssm.time_step_rank", "linear_num_value_heads"},
  };
  for (const auto& [key, field] : kSsm) {
    GZ_ASSIGN_OR_RETURN(uint64_t v, f.GetUint(p + key));
    c[field] = v;
  }
  v_heads = c["linear_num_value_heads"].get<uint64_t>();
  GZ_ASSIGN_OR_RETURN(uint64_t inner, f.GetUint(p + "ssm.inner_size"));
  if (v_heads == 0 || inner % v_heads != 0) {
    return DataLoss(path + ": " + p + "ssm.inner_size " + std::to_string(inner) +
                    " is not a multiple of ssm.time_step_rank " + std::to_string(v_heads));
  }
  c["linear_value_head_dim"] = inner / v_heads;
  json types = json::array();
  const std::string recurrent_key = p + "attention.recurrent_layers";
  if (const GgufValue* v = f.Find(recurrent_key)) {
    if (v->type != GgufType::kArray || v->element_type != GgufType::kBool || v->count < layers) {
      return DataLoss(path + ": metadata \"" + recurrent_key + "\" must be at least " +
                      std::to_string(layers) + " bools (one a layer)");
    }
    for (uint64_t l = 0; l < layers; ++l) {
      types.push_back(v->elements[l] ? "linear_attention" : "full_attention");
    }
  } else {
    uint64_t interval = 4;
    if (f.Find(p + "full_attention_interval")) {
      GZ_ASSIGN_OR_RETURN(interval, f.GetUint(p + "full_attention_interval"));
    }
    if (interval == 0) {
      return DataLoss(path + ": metadata \"" + p + "full_attention_interval\" is 0");
    }
    for (uint64_t l = 0; l < layers; ++l) {
      types.push_back((l + 1) % interval == 0 ? "full_attention" : "linear_attention");
    }
  }
  c["layer_types"] = types;
  if (family == "qwen35moe") {
    GZ_RETURN_IF_ERROR(ReadExpertCounts(f, p, &c));
    // llama.cpp's default for the shared expert's width is feed_forward_length.
    const std::string shared = p + "expert_shared_feed_forward_length";
    if (f.Find(shared)) {
      GZ_ASSIGN_OR_RETURN(c["shared_expert_intermediate_size"], f.GetUint(shared));
    } else if (c.contains("intermediate_size")) {
      c["shared_expert_intermediate_size"] = c["intermediate_size"];
    } else {
      return NotFound(path + ": metadata \"" + shared + "\" is missing");
    }
  }
  json rope = {{"rope_type", "default"}, {"rope_theta", c.value("rope_theta", 10000.0)}};
  if (c.contains("partial_rotary_factor")) rope["partial_rotary_factor"] = c["partial_rotary_factor"];
  if (f.Find(p + "rope.dimension_sections")) {
    GZ_ASSIGN_OR_RETURN(std::vector<int64_t> sections, f.GetInts(p + "rope.dimension_sections"));
    if (sections.size() < 3) {
      return DataLoss(path + ": metadata \"" + p + "rope.dimension_sections\" has " +
                      std::to_string(sections.size()) + " sections, expected 4");
    }
    rope["mrope_section"] = {sections[0], sections[1], sections[2]};
    rope["mrope_interleaved"] = true;
  }
  c["rope_parameters"] = rope;
  c.erase("rope_theta");
  c.erase("partial_rotary_factor");
  return Status::Ok();
}

// What the Checkpoint's tensors point into: the mapped file and the tensors converted at load.
struct Held {
  GgufFile file;
  std::vector<std::vector<uint8_t>> copies;
};

// A Qwen3.5 recurrent layer's tensor as the Arch reads it, from llama.cpp's converter's layout:
// the value heads back in Hugging Face's grouped order (UntileValueHeads; in the rows of
// attn_qkv's values, attn_gate, ssm_beta, ssm_alpha and the convolution's value channels, in the
// columns of ssm_out, in ssm_a and ssm_dt), ssm_a (-exp(A_log)) back to A_log as log(-a), the
// convolution [channels, kernel] as [channels, 1, kernel], the shared expert's gate as [1, dim].
// The projections may be kept in blocks (rows whole blocks; out_proj only where a value head's
// columns are whole blocks).
Status UndoQwen35Layout(const Arch& arch, TensorRole role, int layer, const GgufTensor& t,
                        TensorInfo* info, Held* held) {
  const std::string where = info->file + ": tensor \"" + t.name + "\"";
  if (role == TensorRole::kSharedExpertGate && info->shape.size() == 1) {
    info->shape = {1, info->shape[0]};
  }
  if (layer < 0 || !arch.layer[layer].IsRecurrent()) return Status::Ok();
  const RecurrentSpec& r = arch.layer[layer].recurrent;
  if (role == TensorRole::kRecurrentConv && info->shape.size() == 2) {
    info->shape = {info->shape[0], 1, info->shape[1]};
  }
  if (role == TensorRole::kRecurrentALog) {
    // A copy in float32: log(-a).
    std::vector<uint8_t>& copy = held->copies.emplace_back(t.Elements() * 4);
    auto* v = reinterpret_cast<float*>(copy.data());
    GZ_RETURN_IF_ERROR(DequantizeBlocks(t.type, t.data, t.bytes, t.Elements(), v, where));
    for (int64_t i = 0; i < t.Elements(); ++i) v[i] = std::log(-v[i]);
    info->dtype = DType::kF32;
    info->data = copy.data();
    info->bytes = copy.size();
  }
  const int64_t per_k = r.v_heads / std::max(1, r.k_heads);
  constexpr TensorRole kTiled[] = {TensorRole::kRecurrentQkv,    TensorRole::kRecurrentConv,
                                   TensorRole::kRecurrentZ,      TensorRole::kRecurrentB,
                                   TensorRole::kRecurrentA,      TensorRole::kRecurrentALog,
                                   TensorRole::kRecurrentDtBias, TensorRole::kRecurrentOut};
  if (per_k <= 1 || std::find(std::begin(kTiled), std::end(kTiled), role) == std::end(kTiled)) {
    return Status::Ok();
  }
  // Kept in blocks: a row is whole blocks, and a value head of out_proj's columns too.
  GgmlBlock block{1, static_cast<int64_t>(DTypeSize(info->dtype))};
  if (info->ggml_type >= 0 && !GgmlBlockOf(static_cast<GgmlType>(info->ggml_type), &block)) {
    return Internal(where + ": unknown block type");
  }
  const size_t element = DTypeSize(info->dtype);
  const int64_t key_dim = static_cast<int64_t>(r.k_heads) * r.k_dim;
  // The shape the reorder walks, checked first (the loader checks every shape again).
  const int64_t value_dim = static_cast<int64_t>(r.v_heads) * r.v_dim;
  int64_t want_rows = 0, want_cols = -1;  // -1: any
  switch (role) {
    case TensorRole::kRecurrentQkv:
    case TensorRole::kRecurrentConv:
      want_rows = 2 * key_dim + value_dim;
      break;
    case TensorRole::kRecurrentZ:
      want_rows = value_dim;
      break;
    case TensorRole::kRecurrentOut:
      want_rows = arch.dim, want_cols = value_dim;
      break;
    default:
      want_rows = r.v_heads;
      break;
  }
  const int64_t elements = t.Elements();
  const size_t bytes = info->ggml_type >= 0
                           ? static_cast<size_t>(elements / block.elements * block.bytes)
                           : static_cast<size_t>(elements) * element;
  if (info->shape.empty() || info->shape[0] != want_rows ||
      (want_cols >= 0 && (info->shape.size() != 2 || info->shape[1] != want_cols)) ||
      info->bytes != bytes || (info->ggml_type >= 0 && role == TensorRole::kRecurrentOut &&
                               r.v_dim % block.elements != 0)) {
    return DataLoss(where + " has shape " + ShapeString(t.shape) + ", expected " +
                    std::to_string(want_rows) + " rows" +
                    (want_cols >= 0 ? " of " + std::to_string(want_cols) : std::string()) +
                    " for layer " + std::to_string(layer) + "'s recurrent sizes");
  }
  auto untile = [&](int64_t first_units, int64_t head_units, size_t unit_bytes) {
    std::vector<uint8_t> out(info->data, info->data + info->bytes);
    UntileValueHeads(info->data + first_units * unit_bytes, r.k_heads, per_k, head_units,
                     unit_bytes, out.data() + first_units * unit_bytes);
    info->data = held->copies.emplace_back(std::move(out)).data();
  };
  const int64_t rows = info->shape.empty() ? 0 : info->shape[0];
  const size_t row_bytes = rows > 0 ? info->bytes / static_cast<size_t>(rows) : 0;
  switch (role) {
    case TensorRole::kRecurrentQkv:
    case TensorRole::kRecurrentConv:
      untile(2 * key_dim, r.v_dim, row_bytes);  // rows: q, k, then the values
      break;
    case TensorRole::kRecurrentZ:
      untile(0, r.v_dim, row_bytes);
      break;
    case TensorRole::kRecurrentB:
    case TensorRole::kRecurrentA:
      untile(0, 1, row_bytes);
      break;
    case TensorRole::kRecurrentALog:
    case TensorRole::kRecurrentDtBias:
      untile(0, 1, element);
      break;
    case TensorRole::kRecurrentOut: {
      // Columns: each row's value heads.
      std::vector<uint8_t> out(info->bytes);
      // A head's columns: v_dim elements, or v_dim / block elements blocks.
      for (int64_t row = 0; row < rows; ++row) {
        UntileValueHeads(info->data + row * row_bytes, r.k_heads, per_k,
                         r.v_dim / block.elements, info->ggml_type >= 0 ? block.bytes : element,
                         out.data() + row * row_bytes);
      }
      info->data = held->copies.emplace_back(std::move(out)).data();
      break;
    }
    default:
      break;
  }
  return Status::Ok();
}

}  // namespace

bool IsGgufPath(const std::string& path) {
  std::error_code ec;
  return path.ends_with(".gguf") && !std::filesystem::is_directory(path, ec);
}

Expected<json> ReadGgufConfig(const GgufFile& f) {
  const std::string& path = f.path();
  GZ_ASSIGN_OR_RETURN(std::string family, f.GetString("general.architecture"));
  if (std::find(std::begin(kGgufFamilies), std::end(kGgufFamilies), family) ==
      std::end(kGgufFamilies)) {
    return Unimplemented(path + ": general.architecture " + Quote(family) +
                         " is not supported (expected llama, qwen2, qwen3, qwen3moe, gemma3, "
                         "qwen35 or qwen35moe)");
  }
  const std::string p = family + ".";
  json c = json::object();
  c["model_type"] = ModelType(family);
  // Required fields, then those with llama.cpp's defaults.
  const std::pair<const char*, const char*> kRequired[] = {
      {"embedding_length", "hidden_size"},
      {"block_count", "num_hidden_layers"},
      {"feed_forward_length", "intermediate_size"},
      {"attention.head_count", "num_attention_heads"},
      {"context_length", "max_position_embeddings"},
  };
  for (const auto& [key, field] : kRequired) {
    // A mixture-of-experts file needs the dense width only for layers without experts.
    if ((family == "qwen3moe" || family == "qwen35moe") &&
        std::string_view(key) == "feed_forward_length" && !f.Find(p + key)) {
      continue;
    }
    GZ_ASSIGN_OR_RETURN(uint64_t v, f.GetUint(p + key));
    c[field] = v;
  }
  if (family == "qwen3moe") {
    GZ_RETURN_IF_ERROR(ReadExpertCounts(f, p, &c));
    // llama.cpp's qwen3moe renormalizes the chosen experts' weights always; a file may say so.
    c["norm_topk_prob"] = true;
    if (f.Find(p + "expert_weights_norm")) {
      GZ_ASSIGN_OR_RETURN(c["norm_topk_prob"], f.GetBool(p + "expert_weights_norm"));
    }
    // Layers without a router are dense (transformers' mlp_only_layers).
    GZ_ASSIGN_OR_RETURN(uint64_t layers, f.GetUint(p + "block_count"));
    json dense = json::array();
    for (uint64_t l = 0; l < layers && l < (uint64_t{1} << 20); ++l) {
      if (!f.FindTensor("blk." + std::to_string(l) + ".ffn_gate_inp.weight")) dense.push_back(l);
    }
    if (!dense.empty()) c["mlp_only_layers"] = dense;
  }
  GZ_ASSIGN_OR_RETURN(c["rms_norm_eps"], f.GetFloat(p + "attention.layer_norm_rms_epsilon"));
  if (f.Find(p + "attention.head_count_kv")) {
    GZ_ASSIGN_OR_RETURN(c["num_key_value_heads"], f.GetUint(p + "attention.head_count_kv"));
  }
  if (f.Find(p + "attention.key_length")) {
    GZ_ASSIGN_OR_RETURN(uint64_t key_length, f.GetUint(p + "attention.key_length"));
    if (f.Find(p + "attention.value_length")) {
      GZ_ASSIGN_OR_RETURN(uint64_t value_length, f.GetUint(p + "attention.value_length"));
      if (value_length != key_length) {
        return Unimplemented(path + ": " + p + "attention.value_length " +
                             std::to_string(value_length) + " differs from key_length " +
                             std::to_string(key_length) + "; heads of two sizes are not supported");
      }
    }
    c["head_dim"] = key_length;
  }
  if (f.Find(p + "rope.freq_base")) {
    GZ_ASSIGN_OR_RETURN(c["rope_theta"], f.GetFloat(p + "rope.freq_base"));
  }
  if (f.Find(p + "rope.dimension_count")) {
    GZ_ASSIGN_OR_RETURN(uint64_t rotary, f.GetUint(p + "rope.dimension_count"));
    const uint64_t head_dim =
        c.contains("head_dim")
            ? c["head_dim"].get<uint64_t>()
            : c["hidden_size"].get<uint64_t>() /
                  std::max<uint64_t>(1, c["num_attention_heads"].get<uint64_t>());
    if (rotary != head_dim) {
      c["partial_rotary_factor"] = static_cast<double>(rotary) / static_cast<double>(head_dim);
    }
  }
  if (f.Find(p + "rope.scaling.type")) {
    GZ_ASSIGN_OR_RETURN(std::string type, f.GetString(p + "rope.scaling.type"));
    if (type == "linear") {
      GZ_ASSIGN_OR_RETURN(double factor, f.GetFloat(p + "rope.scaling.factor"));
      c["rope_scaling"] = {{"rope_type", "linear"}, {"factor", factor}};
    } else if (type != "none") {
      return Unimplemented(path + ": " + p + "rope.scaling.type " + Quote(type) +
                           " is not supported (expected none or linear)");
    }
  }
  if (const GgufTensor* factors = f.FindTensor("rope_freqs.weight")) {
    const double theta = c.value("rope_theta", 10000.0);
    const int64_t head_dim =
        c.contains("head_dim") ? c["head_dim"].get<int64_t>()
                               : c["hidden_size"].get<int64_t>() /
                                     std::max<int64_t>(1, c["num_attention_heads"].get<int64_t>());
    GZ_ASSIGN_OR_RETURN(c["rope_scaling"], Llama3Scaling(path, *factors, theta, head_dim));
  }
  if (family == "gemma3") GZ_RETURN_IF_ERROR(ReadGemma3Config(f, &c));
  if (IsQwen35(family)) GZ_RETURN_IF_ERROR(ReadQwen35Config(f, family, &c));
  const GgufTensor* embed = f.FindTensor("token_embd.weight");
  if (!embed || embed->shape.size() != 2) {
    return DataLoss(path + ": tensor \"token_embd.weight\" is missing or not a matrix");
  }
  c["vocab_size"] = embed->shape[0];
  c["tie_word_embeddings"] = f.FindTensor("output.weight") == nullptr;
  if (family != "qwen2") c["attention_bias"] = f.FindTensor("blk.0.attn_q.bias") != nullptr;
  if (family == "llama") c["mlp_bias"] = f.FindTensor("blk.0.ffn_up.bias") != nullptr;
  // Stop tokens: the end of text, of a turn and of a message, where the file names them.
  json eos = json::array();
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                          "tokenizer.ggml.eom_token_id"}) {
    if (!f.Find(key)) continue;
    GZ_ASSIGN_OR_RETURN(uint64_t id, f.GetUint(key));
    if (std::find(eos.begin(), eos.end(), json(id)) == eos.end()) eos.push_back(id);
  }
  if (!eos.empty()) c["eos_token_id"] = eos;
  if (f.Find("tokenizer.ggml.bos_token_id")) {
    GZ_ASSIGN_OR_RETURN(c["bos_token_id"], f.GetUint("tokenizer.ggml.bos_token_id"));
  }
  return c;
}

Expected<Arch> ReadGgufArch(const GgufFile& f) {
  GZ_ASSIGN_OR_RETURN(json config, ReadGgufConfig(f));
  return ParseArch(config, f.path());
}

Expected<GgufModel> OpenGgufModel(const std::string& path,
                                  const std::function<bool(GgmlType)>& keep) {
  auto held = std::make_shared<Held>();
  GZ_ASSIGN_OR_RETURN(held->file, GgufFile::Open(path));
  GgufModel m;
  GZ_ASSIGN_OR_RETURN(m.arch, ReadGgufArch(held->file));
  const Arch& arch = m.arch;
  std::vector<TensorInfo> tensors;
  std::set<GgmlType> noticed;
  // Qwen3.5's MTP layer (blk.N for N = arch.layers): a decoder layer named as a model of one
  // layer under Arch::mtp_prefix, of the spec of the first full-attention layer (Model::LoadMtp).
  const bool qwen35 = arch.family == "qwen3_5" || arch.family == "qwen3_5_moe";
  Arch mtp_arch;
  if (qwen35 && !arch.mtp_prefix.empty()) {
    auto attention = std::find_if(arch.layer.begin(), arch.layer.end(),
                                  [](const LayerSpec& l) { return !l.IsRecurrent(); });
    if (attention != arch.layer.end()) {
      mtp_arch = arch;
      mtp_arch.prefixes = {arch.mtp_prefix};
      mtp_arch.layers = 1;
      mtp_arch.layer = {*attention};
    }
  }
  bool has_mtp = false;
  if (mtp_arch.layers == 1) {
    GZ_ASSIGN_OR_RETURN(std::string family, held->file.GetString("general.architecture"));
    if (held->file.Find(family + ".nextn_predict_layers")) {
      GZ_ASSIGN_OR_RETURN(uint64_t nextn, held->file.GetUint(family + ".nextn_predict_layers"));
      has_mtp = nextn > 0;
    }
  }
  for (const GgufTensor& t : held->file.tensors()) {
    TensorRole role = TensorRole::kEmbed;
    int layer = -1;
    if (t.name == "rope_freqs.weight") continue;  // read into the Arch's rope
    // The MTP layer's own tensors.
    const std::string mtp_layer = "blk." + std::to_string(arch.layers) + ".";
    const NextnName* nextn = nullptr;
    if (has_mtp && t.name.starts_with(mtp_layer)) {
      for (const NextnName& n : kNextnNames) {
        if (t.name.substr(mtp_layer.size()) == n.suffix) nextn = &n;
      }
      if (nextn && nextn->name.empty()) continue;
    }
    if (!nextn && !ParseTensorName(t.name, &role, &layer)) {
      return Unimplemented(path + ": tensor " + Quote(t.name) + " has no place in a " +
                           arch.family + " model here");
    }
    const bool mtp = nextn || (has_mtp && layer == arch.layers);
    if (layer >= arch.layers && !mtp) {
      return DataLoss(path + ": tensor " + Quote(t.name) + " is past the " +
                      std::to_string(arch.layers) + " layers of " + arch.family + ".block_count");
    }
    // Qwen3.5's post_attention_norm is the norm before the feed-forward (Gemma's is after
    // attention).
    if (qwen35 && role == TensorRole::kAttnPostNorm) role = TensorRole::kFfnNorm;
    const Arch& la = mtp ? mtp_arch : arch;  // the layer's arch and index in it
    if (mtp) layer = nextn ? -1 : 0;
    TensorInfo info;
    info.name = nextn ? arch.mtp_prefix + std::string(nextn->name) : TensorName(la, role, layer);
    info.shape = t.shape;
    info.file = path;
    const int64_t elements = t.Elements();
    // Qwen3.5's recurrent projections too (their value heads reordered as whole rows, or, for
    // out_proj's columns, whole blocks where a head is whole blocks).
    constexpr TensorRole kMatrices[] = {
        TensorRole::kEmbed,        TensorRole::kQ,          TensorRole::kK,
        TensorRole::kV,            TensorRole::kO,          TensorRole::kGate,
        TensorRole::kUp,           TensorRole::kDown,       TensorRole::kHead,
        TensorRole::kRecurrentQkv, TensorRole::kRecurrentZ, TensorRole::kRecurrentB,
        TensorRole::kRecurrentA,   TensorRole::kRecurrentOut};
    // The router is not among them: it is read in float32 on every backend.
    const bool stack = !nextn && IsExpertStack(role);
    if ((stack || role == TensorRole::kRouter) && !la.layer[layer].IsMoe()) {
      return Unimplemented(path + ": tensor " + Quote(t.name) + " has no place in layer " +
                           std::to_string(layer) + " of this " + arch.family +
                           " model (a layer of experts has a router, blk.N.ffn_gate_inp.weight)");
    }
    if (stack && (t.shape.size() != 3 || t.shape[0] != la.layer[layer].moe.experts)) {
      return DataLoss(path + ": tensor " + Quote(t.name) + " has shape " + ShapeString(t.shape) +
                      ", expected [" + std::to_string(la.layer[layer].moe.experts) +
                      ", rows, cols] (expert_count experts)");
    }
    const bool matrix = (!nextn && t.shape.size() == 2 &&
                         std::find(std::begin(kMatrices), std::end(kMatrices), role) !=
                             std::end(kMatrices)) ||
                        stack;
    // out_proj's value heads are its columns: kept where a head is whole blocks.
    GgmlBlock type_block;
    const bool split_blocks =
        role == TensorRole::kRecurrentOut && layer >= 0 && la.layer[layer].IsRecurrent() &&
        GgmlBlockOf(t.type, &type_block) &&
        la.layer[layer].recurrent.v_dim % type_block.elements != 0;
    const bool kept = matrix && !split_blocks && keep && CanDequantize(t.type) &&
                      t.type != GgmlType::kF32 && t.type != GgmlType::kF16 &&
                      t.type != GgmlType::kBF16 && keep(t.type);
    if (kept) {  // read as it is by the backend's kernels
      info.dtype = DType::kU8;
      info.ggml_type = static_cast<int32_t>(t.type);
    } else {
      switch (t.type) {
        case GgmlType::kF32:
          info.dtype = DType::kF32;
          break;
        case GgmlType::kF16:
          info.dtype = DType::kF16;
          break;
        case GgmlType::kBF16:
          info.dtype = DType::kBF16;
          break;
        default: {
          if (!CanDequantize(t.type)) {
            return Unimplemented(path + ": tensor " + Quote(t.name) + " has block type " +
                                 GgmlTypeName(t.type) +
                                 ", which is not read (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, "
                                 "Q8_0, Q2_K to Q6_K, IQ4_NL, IQ4_XS, TQ1_0, TQ2_0, Q1_0 and Q2_0 "
                                 "are)");
          }
          // A type the backend does not read as it is: float32 holds each value exactly.
          info.dtype = DType::kF32;
          if (noticed.insert(t.type).second) {
            std::fprintf(stderr, "%s: %s tensors are converted to F32 at load (exactly)\n",
                         path.c_str(), GgmlTypeName(t.type).c_str());
          }
          std::vector<uint8_t>& copy = held->copies.emplace_back(elements * sizeof(float));
          GZ_RETURN_IF_ERROR(DequantizeBlocks(t.type, t.data, t.bytes, elements,
                                              reinterpret_cast<float*>(copy.data()),
                                              path + ": tensor " + Quote(t.name)));
          break;
        }
      }
    }
    const bool converted =
        !kept && t.type != GgmlType::kF32 && t.type != GgmlType::kF16 && t.type != GgmlType::kBF16;
    info.data = converted ? held->copies.back().data() : t.data;
    info.bytes = kept ? t.bytes : static_cast<size_t>(elements) * DTypeSize(info.dtype);
    if (arch.norm_offset != 0.0f && (nextn ? nextn->norm : IsNormRole(role))) {
      // llama.cpp's converter writes Gemma's norms as 1 + w; the Arch's weights are w (the
      // loader adds the offset back: (1 + w) - 1 + 1 is 1 + w again in float32, since the
      // subtraction is exact for norms from 0.5 up).
      std::vector<uint8_t>& w = held->copies.emplace_back(elements * sizeof(float));
      auto* v = reinterpret_cast<float*>(w.data());
      GZ_RETURN_IF_ERROR(DequantizeBlocks(t.type, t.data, t.bytes, elements, v,
                                          path + ": tensor " + Quote(t.name)));
      for (int64_t i = 0; i < elements; ++i) v[i] -= arch.norm_offset;
      info.dtype = DType::kF32;
      info.data = w.data();
      info.bytes = w.size();
    }
    if (qwen35 && !nextn) GZ_RETURN_IF_ERROR(UndoQwen35Layout(la, role, layer, t, &info, held.get()));
    // Llama's q and k (and their biases) carry the converter's rotary permutation.
    const bool q = role == TensorRole::kQ || role == TensorRole::kQBias;
    const bool k = role == TensorRole::kK || role == TensorRole::kKBias;
    if (arch.family == "llama" && (q || k)) {
      const AttentionSpec& a = arch.layer[layer].attention;
      const int64_t heads = q ? a.heads : a.kv_heads;
      if (!info.shape.empty() && info.shape[0] == heads * a.head_dim && a.head_dim % 2 == 0) {
        std::vector<uint8_t> hf(info.bytes);
        UndoRotaryPermute(info.data, heads, a.head_dim, info.bytes / info.shape[0], hf.data());
        info.data = held->copies.emplace_back(std::move(hf)).data();
      }  // else the loader's shape check names the tensor and the shapes
    }
    if (stack) {
      // Each expert's matrices under their own names, pointing into the stack (no copy).
      const MoeSpec& moe = la.layer[layer].moe;
      const int64_t experts = t.shape[0], rows = t.shape[1], cols = t.shape[2];
      const size_t row_bytes = info.bytes / static_cast<size_t>(experts * rows);
      struct Part {
        TensorRole role;
        int64_t first, rows;
      };
      std::vector<Part> parts = {{role, 0, rows}};
      if (role == TensorRole::kExpertsGateUp) {
        if (rows != 2 * moe.ffn) {
          return DataLoss(path + ": tensor " + Quote(t.name) + " has shape " +
                          ShapeString(t.shape) + ", expected [" + std::to_string(experts) + ", " +
                          std::to_string(2 * moe.ffn) + ", " + std::to_string(cols) + "]");
        }
        parts = {{TensorRole::kExpertGate, 0, moe.ffn}, {TensorRole::kExpertUp, moe.ffn, moe.ffn}};
      }
      for (int64_t e = 0; e < experts; ++e) {
        for (const Part& part : parts) {
          TensorInfo one = info;
          one.name = ExpertTensorName(la, part.role, layer, static_cast<int>(e));
          one.shape = {part.rows, cols};
          one.data = info.data + (e * rows + part.first) * row_bytes;
          one.bytes = static_cast<size_t>(part.rows) * row_bytes;
          tensors.push_back(std::move(one));
        }
      }
      continue;
    }
    tensors.push_back(std::move(info));
  }
  const MappedFile* mapping = &held->file.mapped();
  GZ_ASSIGN_OR_RETURN(m.checkpoint,
                      Checkpoint::FromTensors(std::move(tensors), held, path, {}, mapping));
  return m;
}

}  // namespace gizllm
