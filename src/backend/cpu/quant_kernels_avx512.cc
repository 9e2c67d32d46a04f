// AVX-512 quantized matmul: 16 weights per vector, dequantized in registers.
// GCC 12 warns about the undefined vectors inside its own AVX-512 intrinsics (a false positive).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "backend/cpu/matmul_kernels.h"
#include "backend/cpu/quant_kernels.h"
#include "quant/hadamard.h"
#include "quant/layout.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

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

// Codes [16 c, 16 c + 32) of a group (chunks c and c + 1, c even) as floats, without the group's
// (mul, add): q8 reads each chunk's 16 bytes, q4 and q2 widen the bytes once for both chunks.
template <Format F>
GZ_TARGET_AVX512 inline void Codes32(const uint8_t* group, int c, __m512* q0, __m512* q1) {
  if constexpr (F == Format::kQ8) {
    *q0 = _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(group + c * 16))));
    *q1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(group + (c + 1) * 16))));
  } else if constexpr (F == Format::kQ4) {
    __m512i b = _mm512_cvtepu8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(group + (c / 2) * 16)));
    *q0 = _mm512_cvtepi32_ps(_mm512_and_si512(b, _mm512_set1_epi32(15)));
    *q1 = _mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4));
  } else {
    static_assert(F == Format::kQ2);
    __m512i b = _mm512_cvtepu8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(group + (c / 4) * 16)));
    *q0 = _mm512_cvtepi32_ps(
        _mm512_and_si512(_mm512_srli_epi32(b, 2 * (c % 4)), _mm512_set1_epi32(3)));
    *q1 = _mm512_cvtepi32_ps(
        _mm512_and_si512(_mm512_srli_epi32(b, 2 * (c % 4 + 1)), _mm512_set1_epi32(3)));
  }
}

// One activation row (a decode step) against weight rows [n0, n0 + NW), with each group's affine
// taken out of the inner loop: dot(mul q + add, x) = mul dot(q, x) + add sum(x). The codes meet x
// as plain floats (q1: x is added where a bit is set), and per group each row takes two FMAs for
// mul and add, where Tile takes one per 16 weights.
template <Format F, int NW>
GZ_TARGET_AVX512 void Row(const QuantSlice& s, int64_t n0) {
  const Weight& w = *s.w;
  const int64_t cols = w.cols;
  const int64_t groups = cols / quant::kGroup;
  constexpr int kBytes = quant::GroupBytes(F);
  constexpr bool kAdd = F != Format::kQ8;
  const auto* codes = static_cast<const uint8_t*>(w.data);
  const auto* scales = static_cast<const float*>(w.scales);
  const auto* zeros = static_cast<const float*>(w.zeros);
  __m512 acc[NW];
#pragma GCC unroll 8
  for (int j = 0; j < NW; ++j) acc[j] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* group[NW];
    __m512 dot[NW];
#pragma GCC unroll 8
    for (int j = 0; j < NW; ++j) {
      group[j] = codes + ((n0 + j) * groups + g) * kBytes;
      dot[j] = _mm512_setzero_ps();
    }
    const float* x = s.x + g * quant::kGroup;
    __m512 sum = _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int c = 0; c < kChunks; c += 2) {
      const __m512 x0 = _mm512_loadu_ps(x + c * 16), x1 = _mm512_loadu_ps(x + c * 16 + 16);
      if constexpr (kAdd) sum = _mm512_add_ps(sum, _mm512_add_ps(x0, x1));
#pragma GCC unroll 8
      for (int j = 0; j < NW; ++j) {
        if constexpr (F == Format::kQ1) {
          uint32_t bits;
          std::memcpy(&bits, group[j] + c * 2, 4);
          dot[j] = _mm512_mask_add_ps(dot[j], static_cast<__mmask16>(bits), dot[j], x0);
          dot[j] = _mm512_mask_add_ps(dot[j], static_cast<__mmask16>(bits >> 16), dot[j], x1);
        } else {
          __m512 q0, q1;
          Codes32<F>(group[j], c, &q0, &q1);
          dot[j] = _mm512_fmadd_ps(q0, x0, dot[j]);
          dot[j] = _mm512_fmadd_ps(q1, x1, dot[j]);
        }
      }
    }
#pragma GCC unroll 8
    for (int j = 0; j < NW; ++j) {
      const int64_t k = (n0 + j) * groups + g;
      const quant::Affine a = quant::GroupAffine(F, scales[k], zeros ? zeros + k : nullptr);
      acc[j] = _mm512_fmadd_ps(dot[j], _mm512_set1_ps(a.mul), acc[j]);
      if constexpr (kAdd) acc[j] = _mm512_fmadd_ps(sum, _mm512_set1_ps(a.add), acc[j]);
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < NW; ++j) {
    const float b = s.bias ? s.bias[n0 + j] : 0.0f;
    s.out[n0 + j] = _mm512_reduce_add_ps(acc[j]) + b;
  }
}

// Every activation row against weight rows [n, n + NW).
template <Format F, int NW>
GZ_TARGET_AVX512 void Column(const QuantSlice& s, int64_t n) {
  if (s.rows == 1) return Row<F, NW>(s, n);
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

// Inputs [k0, k0 + len) (whole groups) of weight row `row` decoded into dst: float32, or bf16
// rounded to nearest even (uint16_t); the codes of row `ahead`'s same groups are fetched
// meanwhile. (Compiled for AVX-512 BF16 for the second; the float32 one uses no BF16
// instruction and runs on any AVX-512 CPU.)
template <Format F, typename T>
GZ_TARGET_AVX512BF16 void DecodeInputs(const Weight& w, int64_t row, int64_t ahead, int64_t k0,
                                       int64_t len, T* dst) {
  const int64_t groups = w.cols / quant::kGroup;
  constexpr int kBytes = quant::GroupBytes(F);
  const auto* codes = static_cast<const uint8_t*>(w.data);
  const auto* scales = static_cast<const float*>(w.scales);
  const auto* zeros = static_cast<const float*>(w.zeros);
  for (int64_t g = k0 / quant::kGroup; g < (k0 + len) / quant::kGroup; ++g) {
    const int64_t k = row * groups + g;
    const quant::Affine a = quant::GroupAffine(F, scales[k], zeros ? zeros + k : nullptr);
    const __m512 mul = _mm512_set1_ps(a.mul), add = _mm512_set1_ps(a.add);
    const uint8_t* group = codes + k * kBytes;
    for (int b = 0; b < kBytes; b += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(codes + (ahead * groups + g) * kBytes + b),
                   _MM_HINT_T0);
    }
    T* out = dst + g * quant::kGroup - k0;
#pragma GCC unroll 8
    for (int c = 0; c < kChunks; ++c) {
      const __m512 v = Decode16<F>(group, c, mul, add);
      if constexpr (std::is_same_v<T, float>) {
        _mm512_storeu_ps(out + 16 * c, v);
      } else {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 16 * c),
                            (__m256i)_mm512_cvtneps_pbh(v));
      }
    }
  }
}

// Many rows: kAvx512PanelRows weight rows at a time are dequantized once into a float32 panel
// (in L1) that the float32 panel product then uses for every activation row, instead of every
// tile of Tile's four rows decoding the codes again. Inputs per panel: a multiple of the group.
constexpr int64_t kPanelInputs = 2048;
// The panel fill prefetches the codes of the weight rows this many rows ahead.
constexpr int kPanelPrefetchRows = 8;
// From this many rows the panels are faster than Tile.
constexpr int64_t kPanelMinRows = 8;

template <Format F>
GZ_TARGET_AVX512 void Panels(const QuantSlice& s, int64_t n0, int64_t n1) {
  const Weight& w = *s.w;
  const int64_t cols = w.cols;
  const MatmulSlice slice{
      .w = &w, .x = s.x, .x_stride = cols, .rows = s.rows, .out = s.out, .bias = s.bias};
  alignas(64) float panel[kAvx512PanelRows * kPanelInputs];
  for (int64_t n = n0; n < n1; n += kAvx512PanelRows) {
    const int valid = static_cast<int>(std::min<int64_t>(kAvx512PanelRows, n1 - n));
    for (int64_t k0 = 0; k0 < cols; k0 += kPanelInputs) {
      const int64_t len = std::min(kPanelInputs, cols - k0);
      for (int j = 0; j < kAvx512PanelRows; ++j) {
        const int64_t row = std::min<int64_t>(n + j, n1 - 1);  // past n1: dropped sums
        const int64_t ahead = std::min<int64_t>(row + kPanelPrefetchRows, w.rows - 1);
        DecodeInputs<F>(w, row, ahead, k0, len, panel + j * len);
      }
      Avx512PanelRows(slice, panel, k0, len, 0, s.rows, n, valid);
    }
  }
}

// Panels of 32 weight rows over kAvx512Bf16PanelInputs inputs: decoded as above, rounded to bf16
// (nearest even) into rows that the AVX-512 BF16 panel product packs and multiplies with the
// activations' bf16 tiles.
template <Format F>
GZ_TARGET_AVX512BF16 void PanelsBf16(const QuantSlice& s, int64_t n0, int64_t n1) {
  const Weight& w = *s.w;
  const int64_t cols = w.cols;
  constexpr int64_t kInputs = kAvx512Bf16PanelInputs;
  static_assert(kInputs % quant::kGroup == 0);
  const MatmulSlice slice{.w = &w,
                          .x = s.x_bf16,
                          .x_stride = s.x_bf16_stride,
                          .rows = s.rows,
                          .out = s.out,
                          .bias = s.bias};
  thread_local std::vector<uint32_t> tiles;
  Avx512Bf16Tiles(slice, &tiles);
  alignas(64) uint16_t rows32[32 * kInputs];
  for (int64_t n = n0; n < n1; n += 32) {
    const int valid = static_cast<int>(std::min<int64_t>(32, n1 - n));
    for (int64_t k0 = 0; k0 < cols; k0 += kInputs) {
      const int64_t len = std::min(kInputs, cols - k0);
      for (int j = 0; j < valid; ++j) {
        const int64_t row = n + j;
        DecodeInputs<F>(w, row, std::min<int64_t>(row + 32, w.rows - 1), k0, len, rows32 + j * len);
      }
      Avx512Bf16RowsPanel(slice, tiles.data(), rows32, k0, len, n, valid);
    }
  }
}

template <Format F>
GZ_TARGET_AVX512 void Slice(const QuantSlice& s, int64_t n0, int64_t n1) {
  if (s.rows >= kPanelMinRows) return Panels<F>(s, n0, n1);
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) Column<F, 4>(s, n);
  for (; n < n1; ++n) Column<F, 1>(s, n);
}

// One butterfly stage of span h < 16 inside each vector: lane j pairs with lane j ^ h (`swap`
// brings the partner); the lower lane of a pair keeps a + b, the upper one a - b.
GZ_TARGET_AVX512 inline __m512 InLane(__m512 v, __m512 swap, __mmask16 upper) {
  return _mm512_mask_sub_ps(_mm512_add_ps(v, swap), upper, swap, v);
}

GZ_TARGET_AVX512 void RotateRowKernel(float* row, int64_t cols, uint64_t seed) {
  const __m512i sign = _mm512_set1_epi32(static_cast<int>(0x80000000u));
  const __m512 norm = _mm512_set1_ps(0.08838834764831845f);  // 1 / sqrt(128), as Fwht128
  for (int64_t b = 0; b < cols / quant::kBlock; ++b) {
    float* block = row + b * quant::kBlock;
    __m512 v[8];
    for (int half = 0; half < 2; ++half) {
      const uint64_t bits = quant::RotationSignWord(seed, b * 2 + half);
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        __m512i x = _mm512_castps_si512(_mm512_loadu_ps(block + half * 64 + i * 16));
        x = _mm512_mask_xor_epi32(x, static_cast<__mmask16>(bits >> (16 * i)), x, sign);
        v[half * 4 + i] = _mm512_castsi512_ps(x);
      }
    }
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      v[i] = InLane(v[i], _mm512_permute_ps(v[i], 0xB1), 0xAAAA);           // h = 1
      v[i] = InLane(v[i], _mm512_permute_ps(v[i], 0x4E), 0xCCCC);           // h = 2
      v[i] = InLane(v[i], _mm512_shuffle_f32x4(v[i], v[i], 0xB1), 0xF0F0);  // h = 4
      v[i] = InLane(v[i], _mm512_shuffle_f32x4(v[i], v[i], 0x4E), 0xFF00);  // h = 8
    }
#pragma GCC unroll 3
    for (int span = 1; span < 8; span *= 2) {  // h = 16, 32, 64: whole vectors
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) {
        if (i & span) continue;
        const __m512 a = v[i], c = v[i + span];
        v[i] = _mm512_add_ps(a, c);
        v[i + span] = _mm512_sub_ps(a, c);
      }
    }
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) _mm512_storeu_ps(block + i * 16, _mm512_mul_ps(v[i], norm));
  }
}

}  // namespace

RotateRowFn RotateRowAvx512() { return RotateRowKernel; }

QuantSliceFn QuantSliceAvx512Bf16(Format format) {
  switch (format) {
    case Format::kQ8:
      return PanelsBf16<Format::kQ8>;
    case Format::kQ4:
      return PanelsBf16<Format::kQ4>;
    case Format::kQ2:
      return PanelsBf16<Format::kQ2>;
    case Format::kQ1:
      return PanelsBf16<Format::kQ1>;
    default:
      return nullptr;
  }
}

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
QuantSliceFn QuantSliceAvx512Bf16(Format) { return nullptr; }
RotateRowFn RotateRowAvx512() { return nullptr; }
}  // namespace gizllm

#endif
