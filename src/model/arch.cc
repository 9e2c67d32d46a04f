#include "model/arch.h"

#include <cmath>

namespace gizllm {

// Computed in float32 in the same order as transformers' rope initialisers, so that the
// rotation angles match its reference logits bit for bit where possible.
std::vector<float> Rope::InvFreq() const {
  const int half = rotary_dims / 2;
  std::vector<float> inv(half);
  const float base = static_cast<float>(theta);
  for (int i = 0; i < half; ++i) {
    float exponent = static_cast<float>(2 * i) / static_cast<float>(rotary_dims);
    inv[i] = 1.0f / std::pow(base, exponent);
  }
  if (type == "linear") {
    for (float& f : inv) f /= static_cast<float>(factor);
  } else if (type == "llama3") {
    const float old_context = static_cast<float>(original_context);
    const float low_wavelen = old_context / static_cast<float>(low_freq_factor);
    const float high_wavelen = old_context / static_cast<float>(high_freq_factor);
    const float f = static_cast<float>(factor);
    for (float& v : inv) {
      float wavelen = 2.0f * static_cast<float>(M_PI) / v;
      float scaled = wavelen > low_wavelen ? v / f : v;
      bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
      if (medium) {
        float smooth = (old_context / wavelen - static_cast<float>(low_freq_factor)) /
                       static_cast<float>(high_freq_factor - low_freq_factor);
        scaled = (1.0f - smooth) * scaled / f + smooth * scaled;
      }
      v = scaled;
    }
  }
  return inv;
}

int Rope::MropeAxis(int i) const {
  if (mrope_section.size() == 3) {
    if (i % 3 == 1 && i < 3 * mrope_section[1]) return 1;
    if (i % 3 == 2 && i < 3 * mrope_section[2]) return 2;
  }
  return 0;
}

std::vector<float> Rope::MropeInvFreq(int axis) const {
  std::vector<float> inv = InvFreq();
  for (int i = 0; i < static_cast<int>(inv.size()); ++i) {
    if (MropeAxis(i) != axis) inv[i] = 0.0f;
  }
  return inv;
}

void Arch::UniformLayers() {
  ropes = {rope};
  LayerSpec spec;
  spec.kind = LayerKind::kAttention;
  spec.attention.heads = heads;
  spec.attention.kv_heads = kv_heads;
  spec.attention.head_dim = head_dim;
  spec.attention.rope = 0;
  spec.attention.window = 0;
  spec.attention.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  spec.attention.qk_norm = qk_norm;
  spec.attention.qkv_bias = qkv_bias;
  spec.attention.output_bias = output_bias;
  spec.feed_forward.ffn = ffn;
  spec.feed_forward.act = Activation::kSilu;
  spec.feed_forward.bias = mlp_bias;
  layer.assign(layers, spec);
}

}  // namespace gizllm
