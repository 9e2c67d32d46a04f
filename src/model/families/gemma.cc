// Gemma 2 and Gemma 3, text. Gemma 3: Gemma3ForCausalLM (gemma3_text) and the text model of
// Gemma3ForConditionalGeneration (gemma3, its config under text_config; the vision tower's
// tensors are not read). Sliding-window layers (the window from sliding_window, the pattern from
// layer_types or sliding_window_pattern) beside global ones, each kind with its own rotary table;
// scores scaled by query_pre_attn_scalar^-1/2; RMSNorms multiplying by (1 + weight), four a layer
// (before and after attention and the feed-forward) plus q and k norms; GeGLU with gelu-tanh;
// embeddings scaled by sqrt(hidden_size); the head tied; final_logit_softcapping when set.
// Gemma 2 (Gemma2ForCausalLM): the same without q and k norms, one rotary table for every layer,
// every other layer sliding, and soft-capped attention scores (attn_logit_softcapping) and logits.
#include <cmath>

#include "core/json_excerpt.h"
#include "model/families/family.h"

namespace gizllm {
namespace {

enum class Version { kGemma2, kGemma3 };

Status ReadGemma(const ConfigReader& config, Version version, Arch* arch) {
  const bool gemma3 = version == Version::kGemma3;
  FamilyDefaults defaults;  // Gemma3TextConfig (Gemma2Config where it differs)
  defaults.rope_theta = 1000000.0;
  defaults.context = 131072;
  defaults.norm_eps = 1e-6;
  defaults.tied_head = true;
  defaults.vocab = 262208;
  defaults.dim = 2304;
  defaults.ffn = 9216;
  defaults.layers = 26;
  defaults.heads = 8;
  defaults.kv_heads = 4;
  defaults.head_dim = 256;
  if (!gemma3) {
    defaults.rope_theta = 10000.0;
    defaults.context = 8192;
    defaults.vocab = 256000;
    defaults.ffn = 9216;
    defaults.heads = 8;
    defaults.kv_heads = 4;
  }
  GZ_RETURN_IF_ERROR(ReadDecoder(config, defaults, arch, /*checks_layers=*/false));
  // transformers reads hidden_activation (hidden_act is Gemma 1's older spelling).
  const std::string_view act_field =
      config.Has("hidden_activation") ? "hidden_activation" : "hidden_act";
  GZ_ASSIGN_OR_RETURN(std::string act, config.String(act_field, "gelu_pytorch_tanh"));
  if (act != "gelu_pytorch_tanh" && act != "gelu_tanh") {
    return config.Error(StatusCode::kUnimplemented, act_field,
                        "\"" + act + "\" is not supported (expected gelu_pytorch_tanh)");
  }
  GZ_ASSIGN_OR_RETURN(bool attention_bias, config.Bool("attention_bias", false));
  arch->qkv_bias = attention_bias;
  arch->output_bias = attention_bias;
  arch->mlp_bias = false;
  arch->qk_norm = gemma3;
  arch->norm_offset = 1.0f;
  // As transformers: hidden_size ** 0.5, a float32 tensor in a float32 model.
  arch->embed_scale = static_cast<float>(std::sqrt(static_cast<double>(arch->dim)));

  GZ_ASSIGN_OR_RETURN(double scalar, config.Double("query_pre_attn_scalar", 256.0));
  if (!(scalar > 0) || !std::isfinite(scalar)) {
    return config.Error(StatusCode::kInvalidArgument, "query_pre_attn_scalar",
                        "must be a positive number");
  }
  // A soft-capping value; null is none, absent is the class's default (Gemma 2: 50 and 30).
  auto cap = [&](std::string_view field, double fallback) -> Expected<float> {
    const auto& object = config.object();
    if (object.is_object() && object.contains(field) && object[std::string(field)].is_null())
      return 0.0f;
    GZ_ASSIGN_OR_RETURN(double v, config.Double(field, fallback));
    if (!(v >= 0) || !std::isfinite(v) || v > 1e30)
      return config.Error(StatusCode::kInvalidArgument, field, "must be a positive number");
    return static_cast<float>(v);
  };
  // transformers' Gemma 3 attention reads attn_logit_softcapping and never applies it (Gemma 3
  // replaced it by the q and k norms; released configs set it null): read, and left out alike.
  GZ_ASSIGN_OR_RETURN(float attention_cap, cap("attn_logit_softcapping", gemma3 ? 0.0 : 50.0));
  if (gemma3) attention_cap = 0.0f;
  GZ_ASSIGN_OR_RETURN(arch->logit_softcap, cap("final_logit_softcapping", gemma3 ? 0.0 : 30.0));
  GZ_ASSIGN_OR_RETURN(int64_t window, config.Int("sliding_window", 4096));
  if (window <= 0 || window > kMaxContext) {
    return config.Error(
        StatusCode::kInvalidArgument, "sliding_window",
        "must be in [1, " + std::to_string(kMaxContext) + "], got " + std::to_string(window));
  }

  // Which layers slide: layer_types, or every layer but each sliding_window_pattern-th.
  std::vector<bool> sliding(arch->layers);
  if (const nlohmann::json* types = config.Get("layer_types")) {
    if (!types->is_array() || static_cast<int64_t>(types->size()) != arch->layers) {
      return config.Error(StatusCode::kInvalidArgument, "layer_types",
                          "expected a list of " + std::to_string(arch->layers) +
                              " layer types, got " + JsonExcerpt(*types, 60));
    }
    for (int l = 0; l < arch->layers; ++l) {
      const nlohmann::json& t = (*types)[l];
      if (t == "sliding_attention") {
        sliding[l] = true;
      } else if (t != "full_attention") {
        return config.Error(StatusCode::kUnimplemented, "layer_types[" + std::to_string(l) + "]",
                            "layer type " + JsonExcerpt(t, 60) +
                                " is not supported (expected sliding_attention or "
                                "full_attention)");
      }
    }
  } else {
    // Gemma 2: every other layer, from the first; Gemma 3: 5 of every 6.
    GZ_ASSIGN_OR_RETURN(int64_t pattern, config.Int("sliding_window_pattern", gemma3 ? 6 : 2));
    if (pattern <= 0 || pattern > 100000) {
      return config.Error(StatusCode::kInvalidArgument, "sliding_window_pattern",
                          "must be a positive layer count");
    }
    for (int l = 0; l < arch->layers; ++l) sliding[l] = (l + 1) % pattern != 0;
  }

  // The global table is arch->rope (ReadDecoder: rope_parameters' full_attention entry, or
  // rope_theta and rope_scaling). The local one: rope_parameters' sliding_attention entry, or a
  // default table of rope_local_base_freq.
  Rope local = arch->rope;  // Gemma 2: one table for every layer
  const nlohmann::json* params = config.Get("rope_parameters");
  if (gemma3 && params && params->is_object() && params->contains("sliding_attention")) {
    GZ_RETURN_IF_ERROR(ReadRope(config, 10000.0, arch->head_dim, "sliding_attention", &local));
  } else if (gemma3) {
    local = Rope();
    GZ_ASSIGN_OR_RETURN(local.theta, config.Double("rope_local_base_freq", 10000.0));
    if (!(local.theta > 0) || !std::isfinite(local.theta)) {
      return config.Error(StatusCode::kInvalidArgument, "rope_local_base_freq",
                          "must be a positive number");
    }
    local.rotary_dims = arch->rope.rotary_dims;
  }

  arch->UniformLayers();
  arch->ropes = {arch->rope, local};
  for (int l = 0; l < arch->layers; ++l) {
    LayerSpec& spec = arch->layer[l];
    spec.post_norms = true;
    spec.feed_forward.act = Activation::kGeluTanh;
    spec.attention.scale = static_cast<float>(1.0 / std::sqrt(scalar));
    spec.attention.softcap = attention_cap;
    if (sliding[l]) {
      spec.attention.window = static_cast<int32_t>(window);
      spec.attention.rope = 1;
    }
  }
  static constexpr std::string_view kRead[] = {"attn_logit_softcapping", "final_logit_softcapping",
                                               "query_pre_attn_scalar"};
  return RefuseUnimplemented(config, kRead);
}

Status ReadGemma2(const ConfigReader& config, Arch* arch) {
  return ReadGemma(config, Version::kGemma2, arch);
}

Status ReadGemma3Text(const ConfigReader& config, Arch* arch) {
  return ReadGemma(config, Version::kGemma3, arch);
}

// Gemma3ForConditionalGeneration: the text model of text_config; eos ids at the top level too.
// Published checkpoints name its tensors language_model.model.*, transformers 5 saves
// model.language_model.*.
Status ReadGemma3(const ConfigReader& config, Arch* arch) {
  GZ_ASSIGN_OR_RETURN(ConfigReader text, config.Object("text_config"));
  GZ_RETURN_IF_ERROR(ReadGemma3Text(text, arch));
  GZ_RETURN_IF_ERROR(ReadTokenIds(config, "eos_token_id", &arch->eos));
  if (arch->bos < 0) {
    std::vector<int32_t> bos;
    GZ_RETURN_IF_ERROR(ReadTokenIds(config, "bos_token_id", &bos));
    if (!bos.empty()) arch->bos = bos.front();
  }
  arch->prefixes = {"language_model.model.", "model.language_model."};
  return Status::Ok();
}

// Gemma's four norms a layer (2 and 3): input_layernorm, post_attention_layernorm,
// pre_feedforward_layernorm, post_feedforward_layernorm.
std::string GemmaTensorName(const std::string& prefix, TensorRole role, int layer) {
  const std::string l = prefix + "layers." + std::to_string(layer) + ".";
  switch (role) {
    case TensorRole::kAttnPostNorm:
      return l + "post_attention_layernorm.weight";
    case TensorRole::kFfnNorm:
      return l + "pre_feedforward_layernorm.weight";
    case TensorRole::kFfnPostNorm:
      return l + "post_feedforward_layernorm.weight";
    default:
      return HfDecoderTensorName(prefix, role, layer);
  }
}

}  // namespace

const Family& Gemma2Family() {
  static constexpr Family kGemma2{"gemma2", "gemma2", "Gemma2ForCausalLM", &ReadGemma2,
                                  &GemmaTensorName};
  return kGemma2;
}

const Family& Gemma3TextFamily() {
  static constexpr Family kGemma3Text{"gemma3", "gemma3_text", "Gemma3ForCausalLM", &ReadGemma3Text,
                                      &GemmaTensorName};
  return kGemma3Text;
}

const Family& Gemma3Family() {
  static constexpr Family kGemma3{"gemma3", "gemma3", "Gemma3ForConditionalGeneration", &ReadGemma3,
                                  &GemmaTensorName};
  return kGemma3;
}

}  // namespace gizllm
