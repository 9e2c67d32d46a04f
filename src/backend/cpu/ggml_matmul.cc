#include "backend/cpu/ggml_matmul.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/cpu/matmul_kernels.h"
#include "backend/cpu/vec_math.h"
#include "core/dtype.h"
#include "formats/ggml_blocks.h"
#include "formats/gguf.h"

namespace gizllm {
namespace {

// Bytes of one row of blocks.
int64_t RowBytes(const Weight& w) {
  GgmlBlock block;
  GgmlBlockOf(static_cast<GgmlType>(w.ggml_type), &block);
  return w.cols / block.elements * block.bytes;
}

#if defined(__x86_64__)
// `elements` values of Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, IQ4_XS, Q1_0, GZ8, GZ4 or GZ4S blocks at
// `data` on AVX-512:
// 16 codes at a time widened to float32 (or looked up, or chosen by their sign bits), multiplied
// by their group's scale (and the min subtracted), rounded as
// formats/ggml_blocks.cc rounds them (this file is compiled without contraction into fused
// multiply-adds), so the same values, each vector handed to put(offset, values); false for the
// other types.
// GZ4's 16 levels as float32, for a lookup of 16 codes at a time.
GZ_TARGET_AVX512 inline __m512 Gz4LevelsAvx512() {
  alignas(64) float v[16];
  for (int j = 0; j < 16; ++j) v[j] = static_cast<float>(kGz4Levels[j]);
  return _mm512_load_ps(v);
}

template <class Put>
GZ_TARGET_AVX512 bool DecodeAvx512(GgmlType type, const uint8_t* data, int64_t elements,
                                   Put&& put) {
  // A block's f16 scale at b.
  auto scale = [](const uint8_t* b) GZ_TARGET_AVX512 {
    return _cvtsh_ss(static_cast<uint16_t>(b[0] | (b[1] << 8)));
  };
  if (type == GgmlType::kQ8_0) {
    for (int64_t i = 0; i < elements / 32; ++i) {
      const uint8_t* b = data + i * 34;
      const __m512 d = _mm512_set1_ps(scale(b));
      for (int h = 0; h < 2; ++h) {
        const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2 + 16 * h));
        const __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));
        put(32 * i + 16 * h, _mm512_mul_ps(v, d));
      }
    }
    return true;
  }
  if (type == GgmlType::kQ4_0 || type == GgmlType::kGZ4S) {
    // Blocks of 32 nibbles under an f16 d: Q4_0's codes less 8, GZ4S's GZ4 levels.
    const bool gz = type == GgmlType::kGZ4S;
    const __m512 levels = Gz4LevelsAvx512();
    const __m128i low = _mm_set1_epi8(0x0F);
    const __m512i eight = _mm512_set1_epi32(8);
    for (int64_t i = 0; i < elements / 32; ++i) {
      const uint8_t* b = data + i * 18;
      const __m512 d = _mm512_set1_ps(scale(b));
      const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2));
      const __m128i nibbles[2] = {_mm_and_si128(q, low), _mm_and_si128(_mm_srli_epi16(q, 4), low)};
      for (int h = 0; h < 2; ++h) {
        const __m512i c = _mm512_cvtepu8_epi32(nibbles[h]);
        const __m512 v = gz ? _mm512_permutexvar_ps(c, levels)
                            : _mm512_cvtepi32_ps(_mm512_sub_epi32(c, eight));
        put(32 * i + 16 * h, _mm512_mul_ps(v, d));
      }
    }
    return true;
  }
  if (type == GgmlType::kQ4_K || type == GgmlType::kQ5_K) {
    // Q5_K: Q4_K's block with group g's fifth bits in bit g of qh[32] before the codes. One loop
    // a type, so that the fifth bits' test is not made for every 16 codes.
    auto blocks = [&]<bool q5>() GZ_TARGET_AVX512 {
      constexpr int64_t block_bytes = q5 ? 176 : 144;
      constexpr int64_t codes = q5 ? 48 : 16;  // offset of qs[128]
      for (int64_t i = 0; i < elements / 256; ++i) {
        const uint8_t* b = data + i * block_bytes;
        const float d = _cvtsh_ss(static_cast<uint16_t>(b[0] | (b[1] << 8)));
        const float dmin = _cvtsh_ss(static_cast<uint16_t>(b[2] | (b[3] << 8)));
        const uint8_t* s = b + 4;
        for (int g = 0; g < 8; ++g) {
          const int sc = g < 4 ? s[g] & 63 : (s[g + 4] & 0xF) | (s[g - 4] >> 6) << 4;
          const int m = g < 4 ? s[g + 4] & 63 : (s[g + 4] >> 4) | (s[g] >> 6) << 4;
          const __m512 dl = _mm512_set1_ps(d * static_cast<float>(sc));
          const __m512 ml = _mm512_set1_ps(dmin * static_cast<float>(m));
          for (int h = 0; h < 2; ++h) {
            __m128i q = _mm_loadu_si128(
                reinterpret_cast<const __m128i*>(b + codes + 32 * (g / 2) + 16 * h));
            if (g % 2) q = _mm_srli_epi16(q, 4);
            q = _mm_and_si128(q, _mm_set1_epi8(0x0F));
            if constexpr (q5) {
              __m128i high = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 16 + 16 * h));
              high = _mm_and_si128(_mm_srli_epi16(high, g), _mm_set1_epi8(1));
              q = _mm_or_si128(q, _mm_slli_epi16(high, 4));
            }
            const __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q));
            put(256 * i + 32 * g + 16 * h, _mm512_sub_ps(_mm512_mul_ps(dl, v), ml));
          }
        }
      }
    };
    if (type == GgmlType::kQ5_K) {
      blocks.template operator()<true>();
    } else {
      blocks.template operator()<false>();
    }
    return true;
  }
  if (type == GgmlType::kQ6_K) {
    for (int64_t i = 0; i < elements / 256; ++i) {
      const uint8_t* b = data + i * 210;
      const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
      const float d = _cvtsh_ss(static_cast<uint16_t>(b[208] | (b[209] << 8)));
      for (int h = 0; h < 2; ++h) {
        for (int k = 0; k < 4; ++k) {
          for (int half = 0; half < 2; ++half) {
            const int l = 16 * half;
            __m128i low =
                _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 64 * h + 32 * (k % 2) + l));
            if (k / 2) low = _mm_srli_epi16(low, 4);
            low = _mm_and_si128(low, _mm_set1_epi8(0x0F));
            __m128i high = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 128 + 32 * h + l));
            high = _mm_and_si128(_mm_srli_epi16(high, 2 * k), _mm_set1_epi8(3));
            const __m128i code = _mm_or_si128(low, _mm_slli_epi16(high, 4));
            const __m512i v = _mm512_sub_epi32(_mm512_cvtepu8_epi32(code), _mm512_set1_epi32(32));
            const __m512 dl = _mm512_set1_ps(d * static_cast<float>(scales[8 * h + 2 * k + half]));
            put(256 * i + 128 * h + 32 * k + l,
                             _mm512_mul_ps(dl, _mm512_cvtepi32_ps(v)));
          }
        }
      }
    }
    return true;
  }
  if (type == GgmlType::kIQ4_XS) {
    // The 16 code values as float32, looked up 16 codes at a time.
    __m512 values;
    {
      alignas(64) float v[16];
      for (int j = 0; j < 16; ++j) v[j] = static_cast<float>(kIq4NlValues[j]);
      values = _mm512_load_ps(v);
    }
    for (int64_t i = 0; i < elements / 256; ++i) {
      const uint8_t* b = data + i * 136;
      const float d = _cvtsh_ss(static_cast<uint16_t>(b[0] | (b[1] << 8)));
      const int scales_h = b[2] | b[3] << 8;
      for (int g = 0; g < 8; ++g) {
        const int ls = ((b[4 + g / 2] >> (4 * (g % 2))) & 0xF) | ((scales_h >> (2 * g)) & 3) << 4;
        const __m512 dl = _mm512_set1_ps(d * static_cast<float>(ls - 32));
        const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 8 + 16 * g));
        const __m128i low = _mm_set1_epi8(0x0F);
        const __m128i nibbles[2] = {_mm_and_si128(q, low),
                                    _mm_and_si128(_mm_srli_epi16(q, 4), low)};
        for (int h = 0; h < 2; ++h) {
          const __m512 v = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(nibbles[h]), values);
          put(256 * i + 32 * g + 16 * h, _mm512_mul_ps(dl, v));
        }
      }
    }
    return true;
  }
  if (type == GgmlType::kGZ8 || type == GgmlType::kGZ4) {
    // gizllm's blocks of 128: each group of 32's scale d * kGzScales[s[g]], times its codes (GZ8)
    // or the levels its nibbles index (GZ4, looked up 16 at a time).
    const bool four = type == GgmlType::kGZ4;
    const int64_t block_bytes = four ? 70 : 134;
    const __m512 levels = Gz4LevelsAvx512();
    const __m128i low = _mm_set1_epi8(0x0F);
    for (int64_t i = 0; i < elements / 128; ++i) {
      const uint8_t* b = data + i * block_bytes;
      const float d = _cvtsh_ss(static_cast<uint16_t>(b[0] | (b[1] << 8)));
      for (int g = 0; g < 4; ++g) {
        const __m512 scale = _mm512_set1_ps(d * kGzScales[b[2 + g]]);
        if (four) {
          const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 6 + 16 * g));
          const __m128i nibbles[2] = {_mm_and_si128(q, low),
                                      _mm_and_si128(_mm_srli_epi16(q, 4), low)};
          for (int h = 0; h < 2; ++h) {
            const __m512 v = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(nibbles[h]), levels);
            put(128 * i + 32 * g + 16 * h, _mm512_mul_ps(scale, v));
          }
        } else {
          for (int h = 0; h < 2; ++h) {
            const __m128i q =
                _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 6 + 32 * g + 16 * h));
            const __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));
            put(128 * i + 32 * g + 16 * h, _mm512_mul_ps(scale, v));
          }
        }
      }
    }
    return true;
  }
  if (type == GgmlType::kQ1_0) {
    // 16 signs a mask: set bits take d, clear ones -d.
    for (int64_t i = 0; i < elements / 128; ++i) {
      const uint8_t* b = data + i * 18;
      const float d_scalar = _cvtsh_ss(static_cast<uint16_t>(b[0] | (b[1] << 8)));
      const __m512 d = _mm512_set1_ps(d_scalar), minus_d = _mm512_set1_ps(-d_scalar);
      for (int k = 0; k < 8; ++k) {
        const __mmask16 signs = static_cast<__mmask16>(b[2 + 2 * k] | b[3 + 2 * k] << 8);
        put(128 * i + 16 * k, _mm512_mask_blend_ps(signs, minus_d, d));
      }
    }
    return true;
  }
  return false;
}
#endif

#if defined(__x86_64__)
// Dot products of one activation row x [cols] with weight rows [n, n + kRows) of Q8_0, Q4_0 or
// GZ4S (AVX-512), each block's codes widened to float32 (GZ4S: its levels looked up) in registers
// and never stored: per block the codes' products with x are summed, then scaled by the block's d
// (F16C) into the row's sum. The same values as DecodeAvx512's, summed in another order.
constexpr int kFusedRows = 4;
GZ_TARGET_AVX512 void FusedRowsAvx512(GgmlType type, const uint8_t* const* rows, const float* x,
                                      int64_t cols, float* sums) {
  const bool q8 = type == GgmlType::kQ8_0, gz = type == GgmlType::kGZ4S;
  const int64_t block_bytes = q8 ? 34 : 18;
  __m512 acc[kFusedRows];
  for (int j = 0; j < kFusedRows; ++j) acc[j] = _mm512_setzero_ps();
  const __m128i low = _mm_set1_epi8(0x0F);
  const __m512i eight = _mm512_set1_epi32(8);
  const __m512 levels = Gz4LevelsAvx512();
  for (int64_t b = 0; b < cols / 32; ++b) {
    const __m512 x0 = _mm512_loadu_ps(x + 32 * b);
    const __m512 x1 = _mm512_loadu_ps(x + 32 * b + 16);
#pragma GCC unroll 4
    for (int j = 0; j < kFusedRows; ++j) {
      const uint8_t* block = rows[j] + b * block_bytes;
      uint16_t h;
      std::memcpy(&h, block, 2);
      const __m512 d = _mm512_set1_ps(_cvtsh_ss(h));
      __m512 c0, c1;
      if (q8) {
        c0 = _mm512_cvtepi32_ps(
            _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2))));
        c1 = _mm512_cvtepi32_ps(
            _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 18))));
      } else if (gz) {
        const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2));
        c0 = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_and_si128(q, low)), levels);
        c1 = _mm512_permutexvar_ps(
            _mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(q, 4), low)), levels);
      } else {
        const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2));
        c0 = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_and_si128(q, low)), eight));
        c1 = _mm512_cvtepi32_ps(
            _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(q, 4), low)), eight));
      }
      const __m512 t = _mm512_fmadd_ps(c1, x1, _mm512_mul_ps(c0, x0));
      acc[j] = _mm512_fmadd_ps(t, d, acc[j]);
    }
  }
  for (int j = 0; j < kFusedRows; ++j) sums[j] = _mm512_reduce_add_ps(acc[j]);
}
#endif

#if defined(__x86_64__)
// FusedRowsAvx512 for gizllm's GZ8 and GZ4 blocks: per group of 32, the codes' (or levels')
// products with x summed, then scaled by the group's d * kGzScales[s] into the row's sum.
GZ_TARGET_AVX512 void FusedGzRowsAvx512(bool four, const uint8_t* const* rows, const float* x,
                                        int64_t cols, float* sums) {
  const int64_t block_bytes = four ? 70 : 134;
  __m512 acc[kFusedRows];
  for (int j = 0; j < kFusedRows; ++j) acc[j] = _mm512_setzero_ps();
  const __m512 levels = Gz4LevelsAvx512();
  const __m128i low = _mm_set1_epi8(0x0F);
  for (int64_t b = 0; b < cols / 128; ++b) {
    float d[kFusedRows];
    for (int j = 0; j < kFusedRows; ++j) {
      uint16_t h;
      std::memcpy(&h, rows[j] + b * block_bytes, 2);
      d[j] = _cvtsh_ss(h);
    }
    for (int g = 0; g < 4; ++g) {
      const __m512 x0 = _mm512_loadu_ps(x + 128 * b + 32 * g);
      const __m512 x1 = _mm512_loadu_ps(x + 128 * b + 32 * g + 16);
#pragma GCC unroll 4
      for (int j = 0; j < kFusedRows; ++j) {
        const uint8_t* block = rows[j] + b * block_bytes;
        const __m512 scale = _mm512_set1_ps(d[j] * kGzScales[block[2 + g]]);
        __m512 c0, c1;
        if (four) {
          const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 6 + 16 * g));
          c0 = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_and_si128(q, low)), levels);
          c1 = _mm512_permutexvar_ps(
              _mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(q, 4), low)), levels);
        } else {
          const uint8_t* q = block + 6 + 32 * g;
          c0 = _mm512_cvtepi32_ps(
              _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))));
          c1 = _mm512_cvtepi32_ps(
              _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16))));
        }
        const __m512 t = _mm512_fmadd_ps(c1, x1, _mm512_mul_ps(c0, x0));
        acc[j] = _mm512_fmadd_ps(t, scale, acc[j]);
      }
    }
  }
  for (int j = 0; j < kFusedRows; ++j) sums[j] = _mm512_reduce_add_ps(acc[j]);
}
#endif

#if defined(__x86_64__)
// dot(row's values, x) for a row of the other block types DecodeAvx512 reads, each vector of
// values multiplied into the sums as it is decoded (never stored).
GZ_TARGET_AVX512 float DotAvx512(GgmlType type, const uint8_t* row, const float* x, int64_t cols) {
  // One sum in a register (an array indexed by the offset would live in memory).
  __m512 acc = _mm512_setzero_ps();
  DecodeAvx512(type, row, cols, [&](int64_t at, __m512 v) GZ_TARGET_AVX512 {
    acc = _mm512_fmadd_ps(v, _mm512_loadu_ps(x + at), acc);
  });
  return _mm512_reduce_add_ps(acc);
}
#endif

// Elements [k0, k0 + len) of weight row `row` (block-aligned) as float32: out [len].
void DecodeRange(const Weight& w, int64_t row, int64_t k0, int64_t len, float* out, CpuIsa isa) {
  const GgmlType type = static_cast<GgmlType>(w.ggml_type);
  GgmlBlock block;
  GgmlBlockOf(type, &block);
  const uint8_t* data =
      static_cast<const uint8_t*>(w.data) + row * RowBytes(w) + k0 / block.elements * block.bytes;
#if defined(__x86_64__)
  if (isa == CpuIsa::kAvx512 &&
      DecodeAvx512(type, data, len,
                   [out](int64_t at, __m512 v) GZ_TARGET_AVX512 { _mm512_storeu_ps(out + at, v); })) {
    return;
  }
#endif
  const GgmlBlockFn decode = GgmlBlockDecoder(type);
  for (int64_t b = 0; b < len / block.elements; ++b) {
    decode(data + b * block.bytes, out + b * block.elements);
  }
}

// Output rows [n0, n1) of one weight for every activation row: out[r, n] = dot(W[n], x[r]) (+
// bias[n]). `row` is the thread's float32 row [w.cols].
template <class V>
void Slice(const MatmulParams& p, int o, int64_t n0, int64_t n1, float* row, CpuIsa isa) {
  const Weight& w = *p.w[o];
  const int64_t cols = w.cols, n_all = w.rows;
#if defined(__x86_64__)
  // Q8_0, Q4_0, GZ8, GZ4 and GZ4S on AVX-512: kFusedRows weight rows at a time against each
  // activation row, the codes never written out (the rows past n1 repeat the last; their sums are
  // dropped).
  const GgmlType type = static_cast<GgmlType>(w.ggml_type);
  const bool gz = type == GgmlType::kGZ8 || type == GgmlType::kGZ4;
  if (isa == CpuIsa::kAvx512 && (type == GgmlType::kQ8_0 || type == GgmlType::kQ4_0 ||
                                 type == GgmlType::kGZ4S || gz)) {
    const auto* data = static_cast<const uint8_t*>(w.data);
    const int64_t row_bytes = RowBytes(w);
    for (int64_t n = n0; n < n1; n += kFusedRows) {
      const uint8_t* rows[kFusedRows];
      for (int j = 0; j < kFusedRows; ++j) rows[j] = data + std::min(n + j, n1 - 1) * row_bytes;
      for (int64_t r = 0; r < p.rows; ++r) {
        float sums[kFusedRows];
        if (gz) {
          FusedGzRowsAvx512(type == GgmlType::kGZ4, rows, p.x + r * cols, cols, sums);
        } else {
          FusedRowsAvx512(type, rows, p.x + r * cols, cols, sums);
        }
        for (int j = 0; j < kFusedRows && n + j < n1; ++j) {
          p.out[o][r * n_all + n + j] = sums[j] + (p.bias[o] ? p.bias[o][n + j] : 0.0f);
        }
      }
    }
    return;
  }
  // The other types on AVX-512: each weight row decoded into the products as it is read.
  if (isa == CpuIsa::kAvx512) {
    const auto* data = static_cast<const uint8_t*>(w.data);
    const int64_t row_bytes = RowBytes(w);
    for (int64_t n = n0; n < n1; ++n) {
      const float b = p.bias[o] ? p.bias[o][n] : 0.0f;
      for (int64_t r = 0; r < p.rows; ++r) {
        p.out[o][r * n_all + n] = DotAvx512(type, data + n * row_bytes, p.x + r * cols, cols) + b;
      }
    }
    return;
  }
#endif
  for (int64_t n = n0; n < n1; ++n) {
    GgmlRow(w, n, row, isa);
    const float b = p.bias[o] ? p.bias[o][n] : 0.0f;
    for (int64_t r = 0; r < p.rows; ++r) {
      p.out[o][r * n_all + n] = V::Dot(row, p.x + r * cols, cols) + b;
    }
  }
}

// Inputs a panel holds: a multiple of every block size (32, 128, 256).
constexpr int64_t kPanelInputs = 2048;
// From this many activation rows (AVX-512), kAvx512PanelRows weight rows are decoded at a time
// into a float32 panel that the float32 panel product uses for every row.
constexpr int64_t kPanelMinRows = 4;

// Output rows [n0, n1) of one weight by float32 panels (AVX-512, many activation rows).
void SlicePanels(const MatmulParams& p, int o, int64_t n0, int64_t n1) {
  const Weight& w = *p.w[o];
  alignas(64) float panel[kAvx512PanelRows * kPanelInputs];  // [4, len], aligned loads
  const MatmulSlice slice{
      .w = &w, .x = p.x, .x_stride = w.cols, .rows = p.rows, .out = p.out[o], .bias = p.bias[o]};
  for (int64_t n = n0; n < n1; n += kAvx512PanelRows) {
    const int valid = static_cast<int>(std::min<int64_t>(kAvx512PanelRows, n1 - n));
    for (int64_t k0 = 0; k0 < w.cols; k0 += kPanelInputs) {
      const int64_t len = std::min(kPanelInputs, w.cols - k0);
      for (int j = 0; j < kAvx512PanelRows; ++j) {
        // Rows past n1 repeat the last one; their sums are dropped (valid).
        DecodeRange(w, std::min<int64_t>(n + j, n1 - 1), k0, len, panel + j * len, CpuIsa::kAvx512);
      }
      Avx512PanelRows(slice, panel, k0, len, 0, p.rows, n, valid);
    }
  }
}

template <class V>
void Run(const MatmulParams& p, ThreadPool* pool, CpuIsa isa) {
  // Tasks of up to 16 output rows over every kGgml output, taken as threads finish.
  constexpr int64_t kChunk = 16;
  int64_t first_task[MatmulParams::kMaxOutputs + 1] = {0};
  for (int o = 0; o < p.outputs; ++o) {
    const int64_t n = p.w[o]->format == Format::kGgml ? p.w[o]->rows : 0;
    first_task[o + 1] = first_task[o] + (n + kChunk - 1) / kChunk;
  }
  const int64_t tasks = first_task[p.outputs];
  const int64_t cols = p.w[0]->cols;
  const bool panels = isa == CpuIsa::kAvx512 && p.rows >= kPanelMinRows;
  auto run = [&](int64_t t0, int64_t t1, int) {
    thread_local std::vector<float> row;
    if (!panels && row.size() < static_cast<size_t>(cols)) row.resize(cols);
    for (int64_t task = t0; task < t1; ++task) {
      int o = 0;
      while (task >= first_task[o + 1]) ++o;
      const int64_t n0 = (task - first_task[o]) * kChunk;
      const int64_t n1 = std::min(p.w[o]->rows, n0 + kChunk);
      if (panels) {
        SlicePanels(p, o, n0, n1);
      } else {
        Slice<V>(p, o, n0, n1, row.data(), isa);
      }
    }
  };
  if (!pool || pool->threads() == 1) {
    run(0, tasks, 0);
  } else {
    pool->ParallelFor(tasks, 1, run);
  }
}

}  // namespace

bool GgmlMatmulReads(uint32_t ggml_type) {
  switch (static_cast<GgmlType>(ggml_type)) {
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
    case GgmlType::kIQ4_XS:
    case GgmlType::kQ1_0:
    case GgmlType::kGZ8:
    case GgmlType::kGZ4:
    case GgmlType::kGZ4S:
      return true;
    default:
      return false;
  }
}

Status CheckGgmlWeight(const Weight& w) {
  const GgmlType type = static_cast<GgmlType>(w.ggml_type);
  GgmlBlock block;
  if (w.format != Format::kGgml || !GgmlMatmulReads(w.ggml_type) || !GgmlBlockOf(type, &block)) {
    return InvalidArgument("weight of format " + FormatName(w.format) + " and block type " +
                           GgmlTypeName(type) + " is not read by the ggml kernels (Q8_0, Q4_0, " +
                           "Q4_K, Q5_K, Q6_K, IQ4_XS, Q1_0, GZ8, GZ4, GZ4S)");
  }
  if (w.empty() || w.rows <= 0 || w.cols <= 0) {
    return InvalidArgument("ggml weight has no data or an empty shape");
  }
  if (w.cols % block.elements != 0) {
    return InvalidArgument("ggml weight's rows of " + std::to_string(w.cols) + " are not whole " +
                           GgmlTypeName(type) + " blocks of " + std::to_string(block.elements));
  }
  return Status::Ok();
}

bool HasGgmlOutput(const MatmulParams& p) {
  for (int i = 0; i < p.outputs; ++i) {
    if (p.w[i] && p.w[i]->format == Format::kGgml) return true;
  }
  return false;
}

void GgmlRow(const Weight& w, int64_t row, float* out, CpuIsa isa) {
  DecodeRange(w, row, 0, w.cols, out, isa);
}

void GgmlMatmul(const MatmulParams& p, ThreadPool* pool, CpuIsa isa) {
#if defined(__x86_64__)
  if (isa == CpuIsa::kAvx512) return Run<vec::Avx512>(p, pool, isa);
  if (isa == CpuIsa::kAvx2) return Run<vec::Avx2>(p, pool, isa);
#endif
  Run<vec::Scalar>(p, pool, isa);
}

}  // namespace gizllm
