// Qwen2 (Qwen2ForCausalLM), Qwen2.5: biases on q, k and v (never on o or the MLP).
#include "model/families/family.h"

namespace gizllm {
namespace {

Status ReadQwen2(const ConfigReader& config, Arch* arch) {
  FamilyDefaults defaults;  // Qwen2Config
  defaults.context = 32768;
  defaults.sliding_window_fields = true;
  defaults.max_window_layers = 28;
  GZ_RETURN_IF_ERROR(ReadDecoder(config, defaults, arch));
  arch->qkv_bias = true;
  arch->output_bias = false;
  arch->mlp_bias = false;
  arch->qk_norm = false;
  arch->UniformLayers();
  return RefuseUnimplemented(config, {});
}

}  // namespace

const Family& Qwen2Family() {
  static constexpr Family kQwen2{"qwen2", "qwen2", "Qwen2ForCausalLM", &ReadQwen2,
                                 &HfDecoderTensorName};
  return kQwen2;
}

}  // namespace gizllm
