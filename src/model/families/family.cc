#include "model/families/family.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "core/json_excerpt.h"

namespace gizllm {

using nlohmann::json;

namespace {

std::string Shown(const json& j) { return JsonExcerpt(j, /*limit=*/60); }

// Rotary frequencies. transformers 5 writes rope_parameters {rope_theta, rope_type, factor, ...}
// (keyed by layer type in models that mix attention kinds); older configs write a top-level
// rope_theta and a rope_scaling {rope_type or type, factor, ...}, or null.
}  // namespace

Status ReadRope(const ConfigReader& config, double default_theta, int head_dim,
                std::string_view layer_type, Rope* rope, double default_partial) {
  std::optional<ConfigReader> params;
  double theta = default_theta;
  if (config.Has("rope_parameters")) {
    GZ_ASSIGN_OR_RETURN(ConfigReader p, config.Object("rope_parameters"));
    if (p.Has("full_attention") || p.Has("sliding_attention")) {
      GZ_ASSIGN_OR_RETURN(p, p.Object(layer_type));
    }
    GZ_ASSIGN_OR_RETURN(theta, config.Double("rope_theta", theta));
    GZ_ASSIGN_OR_RETURN(theta, p.Double("rope_theta", theta));
    params = p;
  } else {
    GZ_ASSIGN_OR_RETURN(theta, config.Double("rope_theta", theta));
    if (config.Has("rope_scaling")) {
      GZ_ASSIGN_OR_RETURN(params, config.Object("rope_scaling"));
    }
  }
  if (!(theta > 0) || !std::isfinite(theta)) {
    return config.Error(
        StatusCode::kInvalidArgument,
        params && params->Has("rope_theta") ? params->Path("rope_theta") : "rope_theta",
        "must be a positive number");
  }
  rope->theta = theta;

  std::string type = "default";
  std::string type_field = "rope_type";
  if (params) {
    if (!params->Has("rope_type") && params->Has("type")) type_field = "type";
    GZ_ASSIGN_OR_RETURN(type, params->String(type_field, "default"));
  }
  rope->type = type;
  if (type == "linear") {
    GZ_ASSIGN_OR_RETURN(rope->factor, params->Double("factor"));
  } else if (type == "llama3") {
    GZ_ASSIGN_OR_RETURN(rope->factor, params->Double("factor"));
    GZ_ASSIGN_OR_RETURN(rope->low_freq_factor, params->Double("low_freq_factor"));
    GZ_ASSIGN_OR_RETURN(rope->high_freq_factor, params->Double("high_freq_factor"));
    GZ_ASSIGN_OR_RETURN(rope->original_context, params->Int("original_max_position_embeddings"));
    if (!(rope->high_freq_factor > rope->low_freq_factor) || !(rope->low_freq_factor > 0)) {
      return params->Error(StatusCode::kInvalidArgument, "high_freq_factor",
                           "must exceed low_freq_factor, and both must be positive");
    }
    if (rope->original_context <= 0 || rope->original_context > kMaxContext) {
      return params->Error(StatusCode::kInvalidArgument, "original_max_position_embeddings",
                           "must be in [1, " + std::to_string(kMaxContext) + "], got " +
                               std::to_string(rope->original_context));
    }
  } else if (type != "default") {
    return params->Error(StatusCode::kUnimplemented, type_field,
                         "rope type \"" + type +
                             "\" is not supported (expected default, linear "
                             "or llama3)");
  }
  if (type != "default" && !(rope->factor > 0)) {
    return params->Error(StatusCode::kInvalidArgument, "factor", "must be positive");
  }

  // partial_rotary_factor: in rope_parameters (transformers 5) or at the top level.
  double partial = 1.0;
  std::string partial_field = "partial_rotary_factor";
  if (params && params->Has("partial_rotary_factor")) {
    GZ_ASSIGN_OR_RETURN(partial, params->Double("partial_rotary_factor"));
    partial_field = params->Path("partial_rotary_factor");
  } else {
    GZ_ASSIGN_OR_RETURN(partial, config.Double("partial_rotary_factor", default_partial));
  }
  // As transformers: int(head_dim * partial_rotary_factor).
  const int dims = static_cast<int>(head_dim * partial);
  if (!(partial > 0 && partial <= 1) || dims < 2 || dims % 2 != 0) {
    return config.Error(StatusCode::kInvalidArgument, partial_field,
                        "must be in (0, 1] and give an even number of rotary dims of head_dim " +
                            std::to_string(head_dim));
  }
  rope->rotary_dims = dims;
  return Status::Ok();
}

namespace {

// Every layer must be full attention: sliding-window layers are not supported.
Status ReadLayerKinds(const ConfigReader& config, const FamilyDefaults& defaults, Arch* arch) {
  if (const json* types = config.Get("layer_types")) {
    if (!types->is_array() || static_cast<int64_t>(types->size()) != arch->layers) {
      return config.Error(StatusCode::kInvalidArgument, "layer_types",
                          "expected a list of " + std::to_string(arch->layers) +
                              " layer types, got " + Shown(*types));
    }
    for (size_t i = 0; i < types->size(); ++i) {
      const json& t = (*types)[i];
      if (t == "full_attention") continue;
      const std::string field = "layer_types[" + std::to_string(i) + "]";
      if (t == "sliding_attention") {
        return config.Error(StatusCode::kUnimplemented, field,
                            "sliding window attention is not supported");
      }
      return config.Error(StatusCode::kUnimplemented, field,
                          "layer type " + Shown(t) + " is not supported (expected full_attention)");
    }
    return Status::Ok();
  }
  if (defaults.sliding_window_fields) {
    // As transformers' Qwen2/Qwen3 configs: layers from max_window_layers on slide when
    // use_sliding_window is set.
    GZ_ASSIGN_OR_RETURN(bool sliding, config.Bool("use_sliding_window", false));
    GZ_ASSIGN_OR_RETURN(int64_t first, config.Int("max_window_layers", defaults.max_window_layers));
    if (sliding && config.Has("sliding_window") && first < arch->layers) {
      return config.Error(StatusCode::kUnimplemented, "use_sliding_window",
                          "sliding window attention is not supported");
    }
  }
  return Status::Ok();
}

}  // namespace

ConfigReader::ConfigReader(const json& object, std::string file, std::string prefix)
    : object_(&object), file_(std::move(file)), prefix_(std::move(prefix)) {}

const json* ConfigReader::Get(std::string_view field) const {
  if (!object_->is_object()) return nullptr;
  auto it = object_->find(field);
  if (it == object_->end() || it->is_null()) return nullptr;
  return &*it;
}

bool ConfigReader::Has(std::string_view field) const { return Get(field) != nullptr; }

Status ConfigReader::Error(StatusCode code, std::string_view field, const std::string& what) const {
  return Status(code, file_ + ": field \"" + Path(field) + "\": " + what);
}

Expected<int64_t> ConfigReader::Int(std::string_view field) const {
  const json* j = Get(field);
  if (j == nullptr) {
    return Error(StatusCode::kInvalidArgument, field, "missing (expected an integer)");
  }
  if (j->is_number_integer()) return j->get<int64_t>();
  if (j->is_number_float()) {
    double d = j->get<double>();
    // Below 2^63 in magnitude, so that the conversion is exact; bounds are the caller's.
    if (std::nearbyint(d) == d && std::fabs(d) < 9.2e18) return static_cast<int64_t>(d);
  }
  return Error(StatusCode::kInvalidArgument, field, "expected an integer, got " + Shown(*j));
}

Expected<int64_t> ConfigReader::Int(std::string_view field, int64_t fallback) const {
  return Has(field) ? Int(field) : Expected<int64_t>(fallback);
}

Expected<double> ConfigReader::Double(std::string_view field) const {
  const json* j = Get(field);
  if (j == nullptr)
    return Error(StatusCode::kInvalidArgument, field, "missing (expected a number)");
  if (j->is_number()) return j->get<double>();
  return Error(StatusCode::kInvalidArgument, field, "expected a number, got " + Shown(*j));
}

Expected<double> ConfigReader::Double(std::string_view field, double fallback) const {
  return Has(field) ? Double(field) : Expected<double>(fallback);
}

Expected<bool> ConfigReader::Bool(std::string_view field, bool fallback) const {
  const json* j = Get(field);
  if (j == nullptr) return fallback;
  if (j->is_boolean()) return j->get<bool>();
  return Error(StatusCode::kInvalidArgument, field, "expected true or false, got " + Shown(*j));
}

Expected<std::string> ConfigReader::String(std::string_view field, std::string fallback) const {
  const json* j = Get(field);
  if (j == nullptr) return fallback;
  if (j->is_string()) return j->get<std::string>();
  return Error(StatusCode::kInvalidArgument, field, "expected a string, got " + Shown(*j));
}

Expected<ConfigReader> ConfigReader::Object(std::string_view field) const {
  const json* j = Get(field);
  if (j == nullptr)
    return Error(StatusCode::kInvalidArgument, field, "missing (expected an object)");
  if (!j->is_object()) {
    return Error(StatusCode::kInvalidArgument, field, "expected an object, got " + Shown(*j));
  }
  return ConfigReader(*j, file_, Path(field) + ".");
}

// An id (int), a list of ids, or null, appended to `ids` without repeats.
Status ReadTokenIds(const ConfigReader& config, std::string_view field, std::vector<int32_t>* ids) {
  const json* j = config.Get(field);
  if (j == nullptr) return Status::Ok();
  auto add = [&](const json& v) -> Status {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
        v.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      return config.Error(StatusCode::kInvalidArgument, field,
                          "expected a token id or a list of token ids, got " + Shown(*j));
    }
    int32_t id = static_cast<int32_t>(v.get<int64_t>());
    for (int32_t x : *ids) {
      if (x == id) return Status::Ok();
    }
    ids->push_back(id);
    return Status::Ok();
  };
  if (j->is_array()) {
    for (const json& v : *j) GZ_RETURN_IF_ERROR(add(v));
    return Status::Ok();
  }
  return add(*j);
}

Status ReadDecoder(const ConfigReader& config, const FamilyDefaults& defaults, Arch* arch,
                   bool checks_layers) {
  // A size; `fallback` (0: none, the field is required) where the family's configuration class
  // gives one.
  auto positive = [&](std::string_view field, int64_t max,
                      int64_t fallback = 0) -> Expected<int64_t> {
    int64_t v = fallback;
    if (fallback == 0 || config.Has(field)) {
      GZ_ASSIGN_OR_RETURN(v, config.Int(field));
    }
    if (v <= 0 || v > max) {
      return config.Error(StatusCode::kInvalidArgument, field,
                          "must be in [1, " + std::to_string(max) + "], got " + std::to_string(v));
    }
    return v;
  };
  constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();
  GZ_ASSIGN_OR_RETURN(arch->vocab, positive("vocab_size", kMaxInt, defaults.vocab));
  GZ_ASSIGN_OR_RETURN(arch->dim, positive("hidden_size", kMaxInt, defaults.dim));
  GZ_ASSIGN_OR_RETURN(arch->ffn, positive("intermediate_size", kMaxInt, defaults.ffn));
  GZ_ASSIGN_OR_RETURN(int64_t layers, positive("num_hidden_layers", 100000, defaults.layers));
  GZ_ASSIGN_OR_RETURN(int64_t heads, positive("num_attention_heads", 100000, defaults.heads));
  arch->layers = static_cast<int>(layers);
  arch->heads = static_cast<int>(heads);
  // transformers: None means as many as the query heads, unless the class has a default.
  int64_t kv_heads = defaults.kv_heads > 0 ? defaults.kv_heads : heads;
  if (config.Has("num_key_value_heads")) {
    GZ_ASSIGN_OR_RETURN(kv_heads, positive("num_key_value_heads", heads));
  }
  if (heads % kv_heads != 0) {
    return config.Error(
        StatusCode::kInvalidArgument, "num_key_value_heads",
        std::to_string(kv_heads) + " does not divide num_attention_heads " + std::to_string(heads));
  }
  arch->kv_heads = static_cast<int>(kv_heads);
  if (config.Has("head_dim") || defaults.head_dim > 0) {
    GZ_ASSIGN_OR_RETURN(int64_t head_dim, positive("head_dim", 65536, defaults.head_dim));
    arch->head_dim = static_cast<int>(head_dim);
  } else {
    if (arch->dim % heads != 0) {
      return config.Error(StatusCode::kInvalidArgument, "head_dim",
                          "missing, and hidden_size " + std::to_string(arch->dim) +
                              " is not a multiple of num_attention_heads " + std::to_string(heads));
    }
    arch->head_dim = static_cast<int>(arch->dim / heads);
  }

  if (checks_layers) {
    GZ_ASSIGN_OR_RETURN(std::string act, config.String("hidden_act", "silu"));
    if (act != "silu") {
      return config.Error(StatusCode::kUnimplemented, "hidden_act",
                          "\"" + act + "\" is not supported (expected silu)");
    }
    GZ_RETURN_IF_ERROR(ReadLayerKinds(config, defaults, arch));
  }
  GZ_RETURN_IF_ERROR(ReadRope(config, defaults.rope_theta, arch->head_dim, "full_attention",
                              &arch->rope, defaults.partial_rotary_factor));

  GZ_ASSIGN_OR_RETURN(arch->norm_eps, config.Double("rms_norm_eps", defaults.norm_eps));
  if (!(arch->norm_eps > 0 && arch->norm_eps < 1)) {
    return config.Error(StatusCode::kInvalidArgument, "rms_norm_eps", "must be in (0, 1)");
  }
  GZ_ASSIGN_OR_RETURN(arch->context, config.Int("max_position_embeddings", defaults.context));
  if (arch->context <= 0 || arch->context > kMaxContext) {
    return config.Error(StatusCode::kInvalidArgument, "max_position_embeddings",
                        "must be in [1, " + std::to_string(kMaxContext) + "], got " +
                            std::to_string(arch->context));
  }
  GZ_ASSIGN_OR_RETURN(arch->tied_head, config.Bool("tie_word_embeddings", defaults.tied_head));
  // transformers 5 writes "dtype", older versions "torch_dtype".
  GZ_ASSIGN_OR_RETURN(arch->torch_dtype, config.String("torch_dtype", ""));
  GZ_ASSIGN_OR_RETURN(arch->torch_dtype, config.String("dtype", arch->torch_dtype));

  arch->eos.clear();
  GZ_RETURN_IF_ERROR(ReadTokenIds(config, "eos_token_id", &arch->eos));
  std::vector<int32_t> bos;
  GZ_RETURN_IF_ERROR(ReadTokenIds(config, "bos_token_id", &bos));
  arch->bos = bos.empty() ? -1 : bos.front();
  return Status::Ok();
}

Status ReadConditionalTop(const ConfigReader& config, const ConfigReader& text, Arch* arch) {
  if (!text.Has("tie_word_embeddings")) {
    GZ_ASSIGN_OR_RETURN(arch->tied_head, config.Bool("tie_word_embeddings", arch->tied_head));
  }
  GZ_RETURN_IF_ERROR(ReadTokenIds(config, "eos_token_id", &arch->eos));
  if (arch->bos < 0) {
    std::vector<int32_t> bos;
    GZ_RETURN_IF_ERROR(ReadTokenIds(config, "bos_token_id", &bos));
    if (!bos.empty()) arch->bos = bos.front();
  }
  arch->prefixes = {"model.language_model.", "language_model.model."};
  return Status::Ok();
}

Status ReadMropeSection(const ConfigReader& config, Rope* rope) {
  const char* where = config.Has("rope_parameters") ? "rope_parameters"
                      : config.Has("rope_scaling")  ? "rope_scaling"
                                                    : nullptr;
  if (where == nullptr) return Status::Ok();
  GZ_ASSIGN_OR_RETURN(ConfigReader params, config.Object(where));
  const json* section = params.Get("mrope_section");
  if (section == nullptr) return Status::Ok();
  std::vector<int> sizes;
  int64_t sum = 0;
  bool ok = section->is_array() && section->size() == 3;
  if (ok) {
    for (const json& v : *section) {
      ok = ok && v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= 1 << 16;
      if (!ok) break;
      sizes.push_back(static_cast<int>(v.get<int64_t>()));
      sum += sizes.back();
    }
  }
  if (!ok || sum > rope->rotary_dims / 2) {
    return params.Error(StatusCode::kInvalidArgument, "mrope_section",
                        "expected three section sizes (time, height, width) summing to at most " +
                            std::to_string(rope->rotary_dims / 2) +
                            " (the rotary frequencies), got " + Shown(*section));
  }
  rope->mrope_section = sizes;
  return Status::Ok();
}

Status RefuseUnimplemented(const ConfigReader& config, std::span<const std::string_view> read) {
  // Each field and whether a value is neutral (computes what a plain decoder computes).
  struct Field {
    std::string_view name;
    bool (*neutral)(const json& v);
  };
  auto falsy = [](const json& v) { return v.is_boolean() && !v.get<bool>(); };
  auto zero = [](const json& v) { return v.is_number() && v.get<double>() == 0; };
  auto one = [](const json& v) { return v.is_number() && v.get<double>() == 1; };
  static const Field kFields[] = {
      {"attn_logit_softcapping", +[](const json&) { return false; }},
      {"final_logit_softcapping", +[](const json&) { return false; }},
      {"query_pre_attn_scalar", +[](const json&) { return false; }},
      {"use_bidirectional_attention", +falsy},
      {"embedding_multiplier", +one},
      {"residual_multiplier", +one},
      {"attention_multiplier", +[](const json&) { return false; }},
      {"logits_scaling", +one},
      {"num_experts", +zero},
      {"num_local_experts", +zero},
      {"n_routed_experts", +zero},
      {"moe_intermediate_size", +zero},
      {"layer_norm_type", +[](const json&) { return false; }},
      {"use_qk_norm", +falsy},
  };
  for (const Field& f : kFields) {
    if (std::find(read.begin(), read.end(), f.name) != read.end()) continue;
    const json* v = config.Get(f.name);
    if (v == nullptr || f.neutral(*v)) continue;
    return config.Error(StatusCode::kUnimplemented, f.name,
                        Shown(*v) + " changes what the model computes, and the " +
                            "recipe of this family does not implement it");
  }
  return Status::Ok();
}

std::string HfDecoderTensorName(const std::string& prefix, TensorRole role, int layer) {
  const std::string l = prefix + "layers." + std::to_string(layer) + ".";
  switch (role) {
    case TensorRole::kEmbed:
      return prefix + "embed_tokens.weight";
    case TensorRole::kFinalNorm:
      return prefix + "norm.weight";
    case TensorRole::kHead:
      return "lm_head.weight";
    case TensorRole::kAttnNorm:
      return l + "input_layernorm.weight";
    case TensorRole::kQ:
      return l + "self_attn.q_proj.weight";
    case TensorRole::kK:
      return l + "self_attn.k_proj.weight";
    case TensorRole::kV:
      return l + "self_attn.v_proj.weight";
    case TensorRole::kO:
      return l + "self_attn.o_proj.weight";
    case TensorRole::kQBias:
      return l + "self_attn.q_proj.bias";
    case TensorRole::kKBias:
      return l + "self_attn.k_proj.bias";
    case TensorRole::kVBias:
      return l + "self_attn.v_proj.bias";
    case TensorRole::kOBias:
      return l + "self_attn.o_proj.bias";
    case TensorRole::kQNorm:
      return l + "self_attn.q_norm.weight";
    case TensorRole::kKNorm:
      return l + "self_attn.k_norm.weight";
    case TensorRole::kFfnNorm:
      return l + "post_attention_layernorm.weight";
    case TensorRole::kAttnPostNorm:
      return l + "post_attention_norm.weight";  // no Llama-style checkpoint has one
    case TensorRole::kFfnPostNorm:
      return l + "post_feedforward_layernorm.weight";
    case TensorRole::kGate:
      return l + "mlp.gate_proj.weight";
    case TensorRole::kUp:
      return l + "mlp.up_proj.weight";
    case TensorRole::kDown:
      return l + "mlp.down_proj.weight";
    case TensorRole::kGateBias:
      return l + "mlp.gate_proj.bias";
    case TensorRole::kUpBias:
      return l + "mlp.up_proj.bias";
    case TensorRole::kDownBias:
      return l + "mlp.down_proj.bias";
    case TensorRole::kRouter:
      return l + "mlp.gate.weight";
    case TensorRole::kExpertGate:
      return l + "mlp.experts.0.gate_proj.weight";
    case TensorRole::kExpertUp:
      return l + "mlp.experts.0.up_proj.weight";
    case TensorRole::kExpertDown:
      return l + "mlp.experts.0.down_proj.weight";
    case TensorRole::kExpertsGateUp:
      return l + "mlp.experts.gate_up_proj";
    case TensorRole::kExpertsDown:
      return l + "mlp.experts.down_proj";
    case TensorRole::kSharedGate:
      return l + "mlp.shared_expert.gate_proj.weight";
    case TensorRole::kSharedUp:
      return l + "mlp.shared_expert.up_proj.weight";
    case TensorRole::kSharedDown:
      return l + "mlp.shared_expert.down_proj.weight";
    case TensorRole::kSharedExpertGate:
      return l + "mlp.shared_expert_gate.weight";
    case TensorRole::kRecurrentQkv:
      return l + "linear_attn.in_proj_qkv.weight";
    case TensorRole::kRecurrentZ:
      return l + "linear_attn.in_proj_z.weight";
    case TensorRole::kRecurrentB:
      return l + "linear_attn.in_proj_b.weight";
    case TensorRole::kRecurrentA:
      return l + "linear_attn.in_proj_a.weight";
    case TensorRole::kRecurrentQkvz:
      return l + "linear_attn.in_proj_qkvz.weight";
    case TensorRole::kRecurrentBa:
      return l + "linear_attn.in_proj_ba.weight";
    case TensorRole::kRecurrentConv:
      return l + "linear_attn.conv1d.weight";
    case TensorRole::kRecurrentALog:
      return l + "linear_attn.A_log";
    case TensorRole::kRecurrentDtBias:
      return l + "linear_attn.dt_bias";
    case TensorRole::kRecurrentNorm:
      return l + "linear_attn.norm.weight";
    case TensorRole::kRecurrentOut:
      return l + "linear_attn.out_proj.weight";
  }
  return "";
}

}  // namespace gizllm
