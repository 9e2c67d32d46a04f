// Qwen3 (Qwen3ForCausalLM), dense: per-head RMSNorm of q and k before the rotation;
// attention_bias puts biases on q, k, v and o.
#include "model/families/family.h"

namespace gizllm {
namespace {

Status ReadQwen3(const ConfigReader& config, Arch* arch) {
  FamilyDefaults defaults;  // Qwen3Config
  defaults.context = 32768;
  defaults.sliding_window_fields = true;
  defaults.max_window_layers = 28;
  GZ_RETURN_IF_ERROR(ReadDecoder(config, defaults, arch));
  GZ_ASSIGN_OR_RETURN(bool attention_bias, config.Bool("attention_bias", false));
  arch->qkv_bias = attention_bias;
  arch->output_bias = attention_bias;
  arch->mlp_bias = false;
  arch->qk_norm = true;
  arch->UniformLayers();
  return RefuseUnimplemented(config, {});
}

}  // namespace

const Family& Qwen3Family() {
  static constexpr Family kQwen3{"qwen3", "qwen3", "Qwen3ForCausalLM", &ReadQwen3,
                                 &HfDecoderTensorName};
  return kQwen3;
}

}  // namespace gizllm
