// Qwen3-MoE (Qwen3MoeForCausalLM): Qwen3's attention (per-head q and k norms) with
// mixture-of-experts feed-forwards. A layer l is a mixture of experts when l is not in
// mlp_only_layers, num_experts > 0 and (l + 1) % decoder_sparse_step == 0; the others are dense
// of intermediate_size. No shared expert; router_aux_loss_coef and output_router_logits are for
// training and change nothing here.
#include <algorithm>

#include "model/families/family.h"

namespace gizllm {

Status ReadSparseFeedForwards(const ConfigReader& config, const MoeDefaults& defaults, Arch* arch) {
  // transformers 5 may write num_experts as num_local_experts (its attribute map).
  const std::string_view experts_field =
      config.Has("num_experts") || !config.Has("num_local_experts") ? "num_experts"
                                                                    : "num_local_experts";
  GZ_ASSIGN_OR_RETURN(int64_t experts, config.Int(experts_field, defaults.experts));
  GZ_ASSIGN_OR_RETURN(int64_t per_token,
                      config.Int("num_experts_per_tok", defaults.experts_per_token));
  GZ_ASSIGN_OR_RETURN(int64_t moe_ffn, config.Int("moe_intermediate_size", defaults.ffn));
  bool norm_topk_prob = true;
  if (!defaults.always_normalizes) {
    GZ_ASSIGN_OR_RETURN(norm_topk_prob, config.Bool("norm_topk_prob", false));
  }
  GZ_ASSIGN_OR_RETURN(int64_t sparse_step, config.Int("decoder_sparse_step", 1));
  if (experts < 0 || experts > 65536) {
    return config.Error(StatusCode::kInvalidArgument, experts_field,
                        "must be in [0, 65536], got " + std::to_string(experts));
  }
  if (sparse_step < 1) {
    return config.Error(StatusCode::kInvalidArgument, "decoder_sparse_step",
                        "must be positive, got " + std::to_string(sparse_step));
  }
  std::vector<int64_t> dense_layers;
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
  for (int l = 0; l < arch->layers; ++l) {
    const bool dense = std::find(dense_layers.begin(), dense_layers.end(), l) != dense_layers.end();
    if (dense || experts == 0 || (l + 1) % sparse_step != 0) continue;
    if (per_token < 1 || per_token > experts) {
      return config.Error(StatusCode::kInvalidArgument, "num_experts_per_tok",
                          "must be in [1, num_experts " + std::to_string(experts) + "], got " +
                              std::to_string(per_token));
    }
    if (moe_ffn < 1 || moe_ffn > (int64_t{1} << 31) - 1) {
      return config.Error(StatusCode::kInvalidArgument, "moe_intermediate_size",
                          "must be positive, got " + std::to_string(moe_ffn));
    }
    LayerSpec& spec = arch->layer[l];
    spec.feed_forward_kind = FeedForwardKind::kMoe;
    spec.moe.experts = static_cast<int>(experts);
    spec.moe.experts_per_token = static_cast<int>(per_token);
    spec.moe.ffn = moe_ffn;
    spec.moe.norm_topk_prob = norm_topk_prob;
    spec.moe.transposed_stacks = defaults.transposed_stacks;
  }
  return Status::Ok();
}

namespace {

Status ReadQwen3Moe(const ConfigReader& config, Arch* arch) {
  FamilyDefaults defaults;  // Qwen3MoeConfig
  defaults.context = 32768;
  defaults.vocab = 151936;
  defaults.dim = 2048;
  defaults.ffn = 6144;
  defaults.layers = 24;
  defaults.heads = 32;
  defaults.kv_heads = 4;
  // Qwen3MoeConfig has no max_window_layers: use_sliding_window makes every layer slide.
  GZ_ASSIGN_OR_RETURN(bool sliding, config.Bool("use_sliding_window", false));
  if (sliding && config.Has("sliding_window")) {
    return config.Error(StatusCode::kUnimplemented, "use_sliding_window",
                        "sliding window attention is not supported");
  }
  GZ_RETURN_IF_ERROR(ReadDecoder(config, defaults, arch));
  GZ_ASSIGN_OR_RETURN(bool attention_bias, config.Bool("attention_bias", false));
  arch->qkv_bias = attention_bias;
  arch->output_bias = attention_bias;
  arch->mlp_bias = false;
  arch->qk_norm = true;
  arch->UniformLayers();

  MoeDefaults moe;  // Qwen3MoeConfig
  moe.experts = 128;
  moe.experts_per_token = 8;
  moe.ffn = 768;
  GZ_RETURN_IF_ERROR(ReadSparseFeedForwards(config, moe, arch));
  // Qwen2-MoE's shared expert is not part of Qwen3-MoE; a config that asks for one is refused.
  for (std::string_view field : {"shared_expert_intermediate_size"}) {
    GZ_ASSIGN_OR_RETURN(int64_t shared, config.Int(field, 0));
    if (shared != 0) {
      return config.Error(StatusCode::kUnimplemented, field,
                          "a shared expert is not supported (Qwen3-MoE has none)");
    }
  }
  static constexpr std::string_view kRead[] = {"num_experts", "num_local_experts",
                                               "moe_intermediate_size"};
  return RefuseUnimplemented(config, kRead);
}

}  // namespace

const Family& Qwen3MoeFamily() {
  static constexpr Family kQwen3Moe{"qwen3_moe", "qwen3_moe", "Qwen3MoeForCausalLM", &ReadQwen3Moe,
                                    &HfDecoderTensorName};
  return kQwen3Moe;
}

}  // namespace gizllm
