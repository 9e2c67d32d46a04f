// Scalar quantized matmul: the plain reference beside the SIMD kernels, and the fallback.
#include "backend/cpu/quant_kernels.h"
#include "quant/layout.h"

namespace gizllm {
namespace {

template <Format F>
void SliceScalar(const QuantSlice& s, int64_t n0, int64_t n1) {
  const Weight& w = *s.w;
  const int64_t groups = w.cols / quant::kGroup;
  constexpr int kBytes = quant::GroupBytes(F);
  const auto* codes = static_cast<const uint8_t*>(w.data);
  const auto* scales = static_cast<const float*>(w.scales);
  const auto* zeros = static_cast<const float*>(w.zeros);
  float deq[quant::kGroup];
  for (int64_t r = 0; r < s.rows; ++r) {
    const float* x = s.x + r * w.cols;
    for (int64_t n = n0; n < n1; ++n) {
      float sum = 0.0f;
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t i = n * groups + g;
        quant::Affine a = quant::GroupAffine(F, scales[i], zeros ? zeros + i : nullptr);
        const uint8_t* group = codes + i * kBytes;
        for (int e = 0; e < quant::kGroup; ++e) {
          deq[e] = a.mul * quant::CodeAt(F, group, e) + a.add;
        }
        const float* xg = x + g * quant::kGroup;
        for (int e = 0; e < quant::kGroup; ++e) sum += deq[e] * xg[e];
      }
      s.out[r * w.rows + n] = sum + (s.bias ? s.bias[n] : 0.0f);
    }
  }
}

}  // namespace

QuantSliceFn QuantSliceScalar(Format format) {
  switch (format) {
    case Format::kQ8:
      return SliceScalar<Format::kQ8>;
    case Format::kQ4:
      return SliceScalar<Format::kQ4>;
    case Format::kQ2:
      return SliceScalar<Format::kQ2>;
    case Format::kQ1:
      return SliceScalar<Format::kQ1>;
    default:
      return nullptr;
  }
}

}  // namespace gizllm
