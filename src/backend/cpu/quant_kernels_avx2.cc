// AVX2 quantized matmul: 8 weights per vector, dequantized in registers.
#include "backend/cpu/quant_kernels.h"
#include "quant/layout.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstring>

namespace gizllm {
namespace {

constexpr int kChunks = quant::kGroup / 8;  // vectors per group

// Weights [8 c, 8 c + 8) of a group as floats, mul * code + add.
template <Format F>
GZ_TARGET_AVX2 inline __m256 Decode8(const uint8_t* group, int c, __m256 mul, __m256 add) {
  if constexpr (F == Format::kQ8) {
    __m256i q =
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(group + c * 8)));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(q), mul);
  } else if constexpr (F == Format::kQ4) {
    // Inputs 8c.. lie in block c / 4, bytes (c % 2) * 8.., high nibbles when (c / 2) % 2.
    __m256i b = _mm256_cvtepu8_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(group + (c / 4) * 16 + (c % 2) * 8)));
    __m256i q =
        ((c / 2) % 2) ? _mm256_srli_epi32(b, 4) : _mm256_and_si256(b, _mm256_set1_epi32(15));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), mul, add);
  } else if constexpr (F == Format::kQ2) {
    // Inputs 8c.. lie in block c / 8, bytes (c % 2) * 8.., bits 2 * ((c % 8) / 2).
    __m256i b = _mm256_cvtepu8_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(group + (c / 8) * 16 + (c % 2) * 8)));
    __m256i q = _mm256_and_si256(_mm256_srli_epi32(b, 2 * ((c % 8) / 2)), _mm256_set1_epi32(3));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), mul, add);
  } else {
    const __m256i lanes = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    __m256i b = _mm256_and_si256(_mm256_set1_epi32(group[c]), lanes);
    __m256 set = _mm256_castsi256_ps(_mm256_cmpeq_epi32(b, lanes));
    return _mm256_blendv_ps(add, _mm256_add_ps(add, mul), set);
  }
}

GZ_TARGET_AVX2 inline float Sum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// out[r0 : r0 + MX, n0 : n0 + NW] of a slice. Every loop over MX and NW is unrolled so that the
// accumulators, scales and offsets stay in registers (GCC otherwise keeps the arrays in memory).
template <Format F, int MX, int NW>
GZ_TARGET_AVX2 void Tile(const QuantSlice& s, int64_t r0, int64_t n0) {
  const Weight& w = *s.w;
  const int64_t cols = w.cols;
  const int64_t groups = cols / quant::kGroup;
  constexpr int kBytes = quant::GroupBytes(F);
  const auto* codes = static_cast<const uint8_t*>(w.data);
  const auto* scales = static_cast<const float*>(w.scales);
  const auto* zeros = static_cast<const float*>(w.zeros);
  __m256 acc[MX][NW];
#pragma GCC unroll 8
  for (int i = 0; i < MX; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NW; ++j) acc[i][j] = _mm256_setzero_ps();
  }
  for (int64_t g = 0; g < groups; ++g) {
    __m256 mul[NW], add[NW];
    const uint8_t* group[NW];
#pragma GCC unroll 8
    for (int j = 0; j < NW; ++j) {
      const int64_t k = (n0 + j) * groups + g;
      quant::Affine a = quant::GroupAffine(F, scales[k], zeros ? zeros + k : nullptr);
      mul[j] = _mm256_set1_ps(a.mul);
      add[j] = _mm256_set1_ps(a.add);
      group[j] = codes + k * kBytes;
    }
    const float* x = s.x + r0 * cols + g * quant::kGroup;
#pragma GCC unroll 16
    for (int c = 0; c < kChunks; ++c) {
      __m256 xv[MX];
#pragma GCC unroll 8
      for (int i = 0; i < MX; ++i) xv[i] = _mm256_loadu_ps(x + i * cols + c * 8);
#pragma GCC unroll 8
      for (int j = 0; j < NW; ++j) {
        __m256 wv = Decode8<F>(group[j], c, mul[j], add[j]);
#pragma GCC unroll 8
        for (int i = 0; i < MX; ++i) acc[i][j] = _mm256_fmadd_ps(wv, xv[i], acc[i][j]);
      }
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MX; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NW; ++j) {
      float b = s.bias ? s.bias[n0 + j] : 0.0f;
      s.out[(r0 + i) * w.rows + n0 + j] = Sum8(acc[i][j]) + b;
    }
  }
}

template <Format F, int NW>
GZ_TARGET_AVX2 void Column(const QuantSlice& s, int64_t n) {
  int64_t r = 0;
  for (; r + 2 <= s.rows; r += 2) Tile<F, 2, NW>(s, r, n);
  if (r < s.rows) Tile<F, 1, NW>(s, r, n);
}

template <Format F>
GZ_TARGET_AVX2 void Slice(const QuantSlice& s, int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) Column<F, 4>(s, n);
  for (; n < n1; ++n) Column<F, 1>(s, n);
}

}  // namespace

QuantSliceFn QuantSliceAvx2(Format format) {
  switch (format) {
    case Format::kQ8:
      return Slice<Format::kQ8>;
    case Format::kQ4:
      return Slice<Format::kQ4>;
    case Format::kQ2:
      return Slice<Format::kQ2>;
    case Format::kQ1:
      return Slice<Format::kQ1>;
    default:
      return nullptr;
  }
}

}  // namespace gizllm

#else

namespace gizllm {
QuantSliceFn QuantSliceAvx2(Format) { return nullptr; }
}  // namespace gizllm

#endif
