// Qwen3-Next (Qwen3NextForCausalLM) and Qwen3.5, dense (Qwen3_5ForCausalLM) and
// mixture-of-experts (Qwen3_5MoeForCausalLM), with their ForConditionalGeneration layouts (the
// text model of text_config, tensors under model.language_model.; the vision tower's tensors,
// model.visual.*, are left in the file). Hybrids: layer_types (or every full_attention_interval-th
// layer) are full_attention, the others linear_attention, a recurrent gated delta net
// (RecurrentSpec). Attention layers: q_proj gives each head's query and an output gate, per-head
// q and k norms, partial rotary (partial_rotary_factor, 0.25 by default). Every RMSNorm
// multiplies by (1 + weight) but the recurrent layers' gated norm. Qwen3.5's M-RoPE
// (rope_parameters.mrope_section, interleaved as Qwen3-VL's) gives text rows one position in all
// three sections, so for text it is the ordinary rotation over the same frequencies. Feed-forwards:
// Qwen3-Next's are mixtures of experts with a shared expert gated by sigmoid(shared_expert_gate(x))
// (dense where mlp_only_layers or decoder_sparse_step say); Qwen3.5's dense; Qwen3.5-MoE's every
// layer a mixture of experts with the shared expert, top-k always renormalized. The MTP layer
// (mtp.*) loads with the model (Model::LoadMtp) and runs in Model::MtpStep.
#include <algorithm>

#include "core/json_excerpt.h"
#include "model/families/family.h"

namespace gizllm {
namespace {

enum class Variant { kNext, kDense, kMoe };

// Which layers are full attention: layer_types, or each full_attention_interval-th.
Expected<std::vector<bool>> ReadFullAttention(const ConfigReader& config, int layers) {
  std::vector<bool> full(layers);
  if (const nlohmann::json* types = config.Get("layer_types")) {
    if (!types->is_array() || static_cast<int64_t>(types->size()) != layers) {
      return config.Error(StatusCode::kInvalidArgument, "layer_types",
                          "expected a list of " + std::to_string(layers) + " layer types, got " +
                              JsonExcerpt(*types, 60));
    }
    for (int l = 0; l < layers; ++l) {
      const nlohmann::json& t = (*types)[l];
      if (t == "full_attention") {
        full[l] = true;
      } else if (t != "linear_attention") {
        return config.Error(StatusCode::kUnimplemented, "layer_types[" + std::to_string(l) + "]",
                            "layer type " + JsonExcerpt(t, 60) +
                                " is not supported (expected linear_attention or full_attention)");
      }
    }
    return full;
  }
  GZ_ASSIGN_OR_RETURN(int64_t interval, config.Int("full_attention_interval", 4));
  if (interval < 1 || interval > 100000) {
    return config.Error(StatusCode::kInvalidArgument, "full_attention_interval",
                        "must be a positive layer count");
  }
  for (int l = 0; l < layers; ++l) full[l] = (l + 1) % interval == 0;
  return full;
}

// A positive int field of at most `max`.
Expected<int64_t> Positive(const ConfigReader& config, std::string_view field, int64_t fallback,
                           int64_t max) {
  GZ_ASSIGN_OR_RETURN(int64_t v, config.Int(field, fallback));
  if (v < 1 || v > max) {
    return config.Error(StatusCode::kInvalidArgument, field,
                        "must be in [1, " + std::to_string(max) + "], got " + std::to_string(v));
  }
  return v;
}

Status ReadHybrid(const ConfigReader& config, Variant variant, Arch* arch) {
  FamilyDefaults defaults;  // Qwen3NextConfig, Qwen3_5TextConfig, Qwen3_5MoeTextConfig
  defaults.context = 32768;
  defaults.vocab = variant == Variant::kNext ? 151936 : 248320;
  defaults.dim = variant == Variant::kDense ? 4096 : 2048;
  defaults.ffn = variant == Variant::kDense ? 12288 : 5632;
  defaults.layers = variant == Variant::kNext ? 48 : variant == Variant::kDense ? 32 : 40;
  defaults.heads = 16;
  defaults.kv_heads = variant == Variant::kDense ? 4 : 2;
  defaults.head_dim = 256;
  defaults.partial_rotary_factor = 0.25;
  GZ_RETURN_IF_ERROR(ReadDecoder(config, defaults, arch, /*checks_layers=*/false));
  GZ_ASSIGN_OR_RETURN(std::string act, config.String("hidden_act", "silu"));
  if (act != "silu") {
    return config.Error(StatusCode::kUnimplemented, "hidden_act",
                        "\"" + act + "\" is not supported (expected silu)");
  }
  GZ_RETURN_IF_ERROR(ReadMropeSection(config, &arch->rope));
  GZ_ASSIGN_OR_RETURN(bool attention_bias, config.Bool("attention_bias", false));
  arch->qkv_bias = attention_bias;
  arch->output_bias = attention_bias;
  arch->mlp_bias = false;
  arch->qk_norm = true;
  arch->norm_offset = 1.0f;
  arch->mtp_prefix = "mtp.";
  if (variant != Variant::kNext) arch->skipped_prefixes = {"model.visual."};

  RecurrentSpec recurrent;
  recurrent.fused_projections = variant == Variant::kNext;
  GZ_ASSIGN_OR_RETURN(int64_t k_heads, Positive(config, "linear_num_key_heads", 16, 4096));
  GZ_ASSIGN_OR_RETURN(int64_t v_heads, Positive(config, "linear_num_value_heads", 32, 4096));
  GZ_ASSIGN_OR_RETURN(int64_t k_dim, Positive(config, "linear_key_head_dim", 128, 4096));
  GZ_ASSIGN_OR_RETURN(int64_t v_dim, Positive(config, "linear_value_head_dim", 128, 4096));
  GZ_ASSIGN_OR_RETURN(int64_t kernel, Positive(config, "linear_conv_kernel_dim", 4, 64));
  if (v_heads % k_heads != 0) {
    return config.Error(StatusCode::kInvalidArgument, "linear_num_value_heads",
                        std::to_string(v_heads) + " is not a multiple of linear_num_key_heads " +
                            std::to_string(k_heads));
  }
  if (kernel < 2) {
    return config.Error(StatusCode::kInvalidArgument, "linear_conv_kernel_dim",
                        "must be at least 2, got " + std::to_string(kernel));
  }
  recurrent.k_heads = static_cast<int>(k_heads);
  recurrent.v_heads = static_cast<int>(v_heads);
  recurrent.k_dim = static_cast<int>(k_dim);
  recurrent.v_dim = static_cast<int>(v_dim);
  recurrent.kernel = static_cast<int>(kernel);

  MoeSpec moe;
  std::vector<int64_t> dense_layers;
  int64_t sparse_step = 1;
  if (variant != Variant::kDense) {
    GZ_ASSIGN_OR_RETURN(int64_t experts, Positive(config, "num_experts",
                                                  variant == Variant::kNext ? 512 : 256, 65536));
    GZ_ASSIGN_OR_RETURN(int64_t per_token, Positive(config, "num_experts_per_tok",
                                                    variant == Variant::kNext ? 10 : 8, experts));
    GZ_ASSIGN_OR_RETURN(moe.ffn, Positive(config, "moe_intermediate_size", 512, (1ll << 31) - 1));
    GZ_ASSIGN_OR_RETURN(moe.shared_ffn,
                        Positive(config, "shared_expert_intermediate_size", 512, (1ll << 31) - 1));
    moe.experts = static_cast<int>(experts);
    moe.experts_per_token = static_cast<int>(per_token);
    moe.shared_gate = true;
    // Qwen3.5-MoE's router always renormalizes the top k (its config has no norm_topk_prob).
    moe.norm_topk_prob = true;
    if (variant == Variant::kNext) {
      GZ_ASSIGN_OR_RETURN(moe.norm_topk_prob, config.Bool("norm_topk_prob", true));
      GZ_ASSIGN_OR_RETURN(sparse_step, Positive(config, "decoder_sparse_step", 1, 100000));
      if (const nlohmann::json* list = config.Get("mlp_only_layers")) {
        if (!list->is_array()) {
          return config.Error(StatusCode::kInvalidArgument, "mlp_only_layers",
                              "expected a list of layer indices");
        }
        for (const nlohmann::json& v : *list) {
          if (!v.is_number_integer()) {
            return config.Error(StatusCode::kInvalidArgument, "mlp_only_layers",
                                "expected a list of layer indices");
          }
          dense_layers.push_back(v.get<int64_t>());
        }
      }
    }
  }

  GZ_ASSIGN_OR_RETURN(std::vector<bool> full, ReadFullAttention(config, arch->layers));
  arch->UniformLayers();
  // Released configs say attn_output_gate: true; transformers' classes always gate.
  GZ_ASSIGN_OR_RETURN(bool output_gate, config.Bool("attn_output_gate", true));
  for (int l = 0; l < arch->layers; ++l) {
    LayerSpec& spec = arch->layer[l];
    spec.attention.output_gate = output_gate;
    if (!full[l]) {
      spec.kind = LayerKind::kRecurrent;
      spec.recurrent = recurrent;
    }
    const bool dense =
        variant == Variant::kDense ||
        std::find(dense_layers.begin(), dense_layers.end(), l) != dense_layers.end() ||
        (l + 1) % sparse_step != 0;
    if (!dense) {
      spec.feed_forward_kind = FeedForwardKind::kMoe;
      spec.moe = moe;
    }
  }
  static constexpr std::string_view kRead[] = {"num_experts", "moe_intermediate_size"};
  return RefuseUnimplemented(config, kRead);
}

Status ReadQwen3Next(const ConfigReader& config, Arch* arch) {
  return ReadHybrid(config, Variant::kNext, arch);
}
Status ReadQwen3_5Text(const ConfigReader& config, Arch* arch) {
  return ReadHybrid(config, Variant::kDense, arch);
}
Status ReadQwen3_5MoeText(const ConfigReader& config, Arch* arch) {
  return ReadHybrid(config, Variant::kMoe, arch);
}

// *ForConditionalGeneration: the text model of text_config; eos and bos ids and
// tie_word_embeddings at the top level too. Tensors under model.language_model.
Status ReadConditional(const ConfigReader& config, Variant variant, Arch* arch) {
  GZ_ASSIGN_OR_RETURN(ConfigReader text, config.Object("text_config"));
  GZ_RETURN_IF_ERROR(ReadHybrid(text, variant, arch));
  GZ_RETURN_IF_ERROR(ReadConditionalTop(config, text, arch));
  return Status::Ok();
}

Status ReadQwen3_5(const ConfigReader& config, Arch* arch) {
  return ReadConditional(config, Variant::kDense, arch);
}
Status ReadQwen3_5Moe(const ConfigReader& config, Arch* arch) {
  return ReadConditional(config, Variant::kMoe, arch);
}

}  // namespace

const Family& Qwen3NextFamily() {
  static constexpr Family kFamily{"qwen3_next", "qwen3_next", "Qwen3NextForCausalLM",
                                  &ReadQwen3Next, &HfDecoderTensorName};
  return kFamily;
}

const Family& Qwen3_5TextFamily() {
  static constexpr Family kFamily{"qwen3_5", "qwen3_5_text", "Qwen3_5ForCausalLM", &ReadQwen3_5Text,
                                  &HfDecoderTensorName};
  return kFamily;
}

const Family& Qwen3_5Family() {
  static constexpr Family kFamily{"qwen3_5", "qwen3_5", "Qwen3_5ForConditionalGeneration",
                                  &ReadQwen3_5, &HfDecoderTensorName};
  return kFamily;
}

const Family& Qwen3_5MoeTextFamily() {
  static constexpr Family kFamily{"qwen3_5_moe", "qwen3_5_moe_text", "Qwen3_5MoeForCausalLM",
                                  &ReadQwen3_5MoeText, &HfDecoderTensorName};
  return kFamily;
}

const Family& Qwen3_5MoeFamily() {
  static constexpr Family kFamily{"qwen3_5_moe", "qwen3_5_moe",
                                  "Qwen3_5MoeForConditionalGeneration", &ReadQwen3_5Moe,
                                  &HfDecoderTensorName};
  return kFamily;
}

}  // namespace gizllm
