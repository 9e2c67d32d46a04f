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

}  // namespace gizllm
