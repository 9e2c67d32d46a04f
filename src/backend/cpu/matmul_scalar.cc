// Portable matmul kernels for CPUs without AVX2: activations in natural order, four partial
// sums per dot product.
#include <algorithm>
#include <cstring>

#include "backend/cpu/matmul_kernels.h"
#include "core/dtype.h"

namespace gizllm {
namespace {

inline float ToF32(float v) { return v; }

template <typename T, float (*Convert)(T)>
void SliceRows(const MatmulSlice& s, int64_t n0, int64_t n1) {
  const T* w = static_cast<const T*>(s.w->data);  // [n, cols]
  const int64_t cols = s.w->cols;
  const int64_t n_out = s.w->rows;
  for (int64_t n = n0; n < n1; ++n) {
    const T* wr = w + n * cols;
    for (int64_t m = 0; m < s.rows; ++m) {
      const float* x = s.x + m * s.x_stride;
      float acc[4] = {0, 0, 0, 0};
      int64_t k = 0;
      for (; k + 4 <= cols; k += 4) {
        for (int u = 0; u < 4; ++u) acc[u] += Convert(wr[k + u]) * x[k + u];
      }
      for (; k < cols; ++k) acc[0] += Convert(wr[k]) * x[k];
      float sum = (acc[0] + acc[1]) + (acc[2] + acc[3]);
      s.out[m * n_out + n] = s.bias ? sum + s.bias[n] : sum;
    }
  }
}

void Prepare(Format format, const float* x, int64_t rows, int64_t cols, float* dst) {
  std::memcpy(dst, x, rows * cols * sizeof(float));
}

}  // namespace

const MatmulKernels& ScalarMatmulKernels() {
  static const MatmulKernels kernels = [] {
    MatmulKernels k;
    k.block = 1;
    k.tile_rows = 1;
    k.prepare = &Prepare;
    k.slice[static_cast<int>(Format::kF32)] = &SliceRows<float, ToF32>;
    k.slice[static_cast<int>(Format::kF16)] = &SliceRows<uint16_t, F16ToF32>;
    k.slice[static_cast<int>(Format::kBf16)] = &SliceRows<uint16_t, Bf16ToF32>;
    return k;
  }();
  return kernels;
}

const MatmulKernels& MatmulKernelsFor(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512:
      return Avx512MatmulKernels();
    case CpuIsa::kAvx2:
      return Avx2MatmulKernels();
    case CpuIsa::kScalar:
      break;
  }
  return ScalarMatmulKernels();
}

}  // namespace gizllm
