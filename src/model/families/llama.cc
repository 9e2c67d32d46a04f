// Llama (LlamaForCausalLM): Llama 2 and 3, including Llama 3.1's "llama3" rope scaling.
// attention_bias puts biases on q, k, v and o; mlp_bias on gate, up and down.
#include "model/families/family.h"

namespace gizllm {
namespace {

Status ReadLlama(const ConfigReader& config, Arch* arch) {
  FamilyDefaults defaults;  // LlamaConfig: rope_theta 1e4, 2048 positions, eps 1e-6, untied
  GZ_RETURN_IF_ERROR(ReadDecoder(config, defaults, arch));
  GZ_ASSIGN_OR_RETURN(bool attention_bias, config.Bool("attention_bias", false));
  arch->qkv_bias = attention_bias;
  arch->output_bias = attention_bias;
  GZ_ASSIGN_OR_RETURN(arch->mlp_bias, config.Bool("mlp_bias", false));
  arch->qk_norm = false;
  arch->UniformLayers();
  return RefuseUnimplemented(config, {});
}

}  // namespace

const Family& LlamaFamily() {
  static constexpr Family kLlama{"llama", "llama", "LlamaForCausalLM", &ReadLlama,
                                 &HfDecoderTensorName};
  return kLlama;
}

}  // namespace gizllm
