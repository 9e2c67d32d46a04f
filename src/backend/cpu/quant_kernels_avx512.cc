// AVX-512 quantized matmul: 16 weights per vector, dequantized in registers.
// GCC 12 warns about the undefined vectors inside its own AVX-512 intrinsics (a false positive).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "backend/cpu/quant_kernels.h"
#include "quant/layout.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstring>

namespace gizllm {
namespace {

constexpr int kChunks = quant::kGroup / 16;  // vectors per group

// Weights [16 c, 16 c + 16) of a group as floats, mul * code + add.
template <Format F>
GZ_TARGET_AVX512 inline __m512 Decode16(const uint8_t* group, int c, __m512 mul, __m512 add) {
  if constexpr (F == Format::kQ8) {
    __m512i q =
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(group + c * 16)));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(q), mul);
  } else if constexpr (F == Format::kQ4) {
    __m512i b = _mm512_cvtepu8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(group + (c / 2) * 16)));
    __m512i q = (c % 2) ? _mm512_srli_epi32(b, 4) : _mm512_and_si512(b, _mm512_set1_epi32(15));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), mul, add);
  } else if constexpr (F == Format::kQ2) {
    __m512i b = _mm512_cvtepu8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(group + (c / 4) * 16)));
    __m512i q = _mm512_and_si512(_mm512_srli_epi32(b, 2 * (c % 4)), _mm512_set1_epi32(3));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), mul, add);
  } else {
    uint16_t bits;
    std::memcpy(&bits, group + c * 2, 2);
    return _mm512_mask_add_ps(add, static_cast<__mmask16>(bits), add, mul);
  }
}

// out[r0 : r0 + MX, n0 : n0 + NW] of a slice. Every loop over MX and NW is unrolled so that the
// accumulators, scales and offsets stay in registers (GCC otherwise keeps the arrays in memory).
template <Format F, int MX, int NW>
GZ_TARGET_AVX512 void Tile(const QuantSlice& s, int64_t r0, int64_t n0) {
  const Weight& w = *s.w;
  const int64_t cols = w.cols;
  const int64_t groups = cols / quant::kGroup;
  constexpr int kBytes = quant::GroupBytes(F);
  const auto* codes = static_cast<const uint8_t*>(w.data);
  const auto* scales = static_cast<const float*>(w.scales);
  const auto* zeros = static_cast<const float*>(w.zeros);
  __m512 acc[MX][NW];
#pragma GCC unroll 8
  for (int i = 0; i < MX; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NW; ++j) acc[i][j] = _mm512_setzero_ps();
  }
  for (int64_t g = 0; g < groups; ++g) {
    __m512 mul[NW], add[NW];
    const uint8_t* group[NW];
#pragma GCC unroll 8
    for (int j = 0; j < NW; ++j) {
      const int64_t k = (n0 + j) * groups + g;
      quant::Affine a = quant::GroupAffine(F, scales[k], zeros ? zeros + k : nullptr);
      mul[j] = _mm512_set1_ps(a.mul);
      add[j] = _mm512_set1_ps(a.add);
      group[j] = codes + k * kBytes;
    }
    const float* x = s.x + r0 * cols + g * quant::kGroup;
#pragma GCC unroll 8
    for (int c = 0; c < kChunks; ++c) {
      __m512 xv[MX];
#pragma GCC unroll 8
      for (int i = 0; i < MX; ++i) xv[i] = _mm512_loadu_ps(x + i * cols + c * 16);
#pragma GCC unroll 8
      for (int j = 0; j < NW; ++j) {
        __m512 wv = Decode16<F>(group[j], c, mul[j], add[j]);
#pragma GCC unroll 8
        for (int i = 0; i < MX; ++i) acc[i][j] = _mm512_fmadd_ps(wv, xv[i], acc[i][j]);
      }
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MX; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NW; ++j) {
      float b = s.bias ? s.bias[n0 + j] : 0.0f;
      s.out[(r0 + i) * w.rows + n0 + j] = _mm512_reduce_add_ps(acc[i][j]) + b;
    }
  }
}

// Every activation row against weight rows [n, n + NW).
template <Format F, int NW>
GZ_TARGET_AVX512 void Column(const QuantSlice& s, int64_t n) {
  int64_t r = 0;
  for (; r + 4 <= s.rows; r += 4) Tile<F, 4, NW>(s, r, n);
  switch (s.rows - r) {
    case 3:
      Tile<F, 3, NW>(s, r, n);
      break;
    case 2:
      Tile<F, 2, NW>(s, r, n);
      break;
    case 1:
      Tile<F, 1, NW>(s, r, n);
      break;
    default:
      break;
  }
}

template <Format F>
GZ_TARGET_AVX512 void Slice(const QuantSlice& s, int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) Column<F, 4>(s, n);
  for (; n < n1; ++n) Column<F, 1>(s, n);
}

}  // namespace

QuantSliceFn QuantSliceAvx512(Format format) {
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
QuantSliceFn QuantSliceAvx512(Format) { return nullptr; }
}  // namespace gizllm

#endif
