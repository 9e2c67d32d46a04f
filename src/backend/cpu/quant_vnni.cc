// Integer products for 8- and 4-bit weights (CpuOptions::int8_activations): the codes repacked
// once at load so that each 32-bit lane holds four consecutive inputs of one output, and the
// rotated activations quantized to int8 per group of 128 inputs, multiplied with vpdpbusd
// (64 byte products per instruction, twice vdpbf16ps's 32 and four times a float32 FMA's 16).
//
// Per group g of row i and output o, with the activations x ~ xs * q (xs = max |x| / 127, q in
// [-127, 127]) and the weights mul * c + add:
//   sum_k (mul c_k + add) xs q_k = mul xs sum_k c_k q_k + add xs sum_k q_k,
// the first sum exact in int32 lanes, the second taken once per row and group (x_sums). q8 codes
// are stored as c + 128 (vpdpbusd multiplies unsigned by signed bytes), and their add holds
// -128 mul to take the 128 sum_k q_k back out.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <algorithm>
#include <cstring>
#include <limits>

#include "backend/cpu/quant_kernels.h"
#include "quant/layout.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace gizllm {
namespace {

constexpr int kBlockOutputs = 16;                // outputs per block: one vector of lanes
constexpr int kAffineBytes = 2 * 16 * 4;         // a block's mul[16] and add[16] for one group
constexpr int CodeBytes(Format f) {              // a block's codes for one group
  return f == Format::kQ8 ? 128 * 16 : 64 * 16;  // 32 vectors of quads, or 16 of octets
}
constexpr int UnitBytes(Format f) { return CodeBytes(f) + kAffineBytes; }

}  // namespace

bool VnniPacks(Format f) { return f == Format::kQ8 || f == Format::kQ4; }

int64_t VnniPackedBytes(const Weight& w) {
  const int64_t blocks = (w.rows + kBlockOutputs - 1) / kBlockOutputs;
  return blocks * (w.cols / quant::kGroup) * UnitBytes(w.format);
}

void PackVnniWeight(const Weight& w, void* out, ThreadPool* pool) {
  const int64_t groups = w.cols / quant::kGroup;
  const int64_t blocks = (w.rows + kBlockOutputs - 1) / kBlockOutputs;
  const int group_bytes = quant::GroupBytes(w.format);
  const int code_bytes = CodeBytes(w.format);
  const int64_t unit_bytes = UnitBytes(w.format);
  const bool q8 = w.format == Format::kQ8;
  const auto* codes = static_cast<const uint8_t*>(w.data);
  const auto* scales = static_cast<const float*>(w.scales);
  const auto* zeros = static_cast<const float*>(w.zeros);
  auto* dst = static_cast<uint8_t*>(out);
  auto pack = [&](int64_t b0, int64_t b1) {
    std::memset(dst + b0 * groups * unit_bytes, 0, (b1 - b0) * groups * unit_bytes);
    for (int64_t b = b0; b < b1; ++b) {
      for (int64_t g = 0; g < groups; ++g) {
        uint8_t* unit = dst + (b * groups + g) * unit_bytes;
        float mul[kBlockOutputs] = {}, add[kBlockOutputs] = {};  // outputs past rows: zero
        for (int j = 0; j < kBlockOutputs; ++j) {
          const int64_t o = b * kBlockOutputs + j;
          if (o >= w.rows) break;
          const int64_t k = o * groups + g;
          const quant::Affine a =
              quant::GroupAffine(w.format, scales[k], zeros ? zeros + k : nullptr);
          mul[j] = a.mul;
          add[j] = q8 ? a.add - 128.0f * a.mul : a.add;
          const uint8_t* group = codes + k * group_bytes;
          if (q8) {
            // Vector e / 4, lane j, byte e % 4: input e as c + 128.
            for (int e = 0; e < quant::kGroup; ++e) {
              unit[(e / 4) * 64 + j * 4 + e % 4] = static_cast<uint8_t>(group[e] ^ 0x80);
            }
          } else {
            // Vector e / 8, lane j, byte e % 4: inputs 8t..8t+3 in the low nibbles, 8t+4..8t+7
            // in the high ones.
            for (int e = 0; e < quant::kGroup; ++e) {
              const int c = quant::CodeAt(Format::kQ4, group, e);
              unit[(e / 8) * 64 + j * 4 + e % 4] |= static_cast<uint8_t>(c << (e % 8 / 4 * 4));
            }
          }
        }
        std::memcpy(unit + code_bytes, mul, sizeof(mul));
        std::memcpy(unit + code_bytes + sizeof(mul), add, sizeof(add));
      }
    }
  };
  if (pool && pool->threads() > 1) {
    pool->ParallelFor(blocks, 1, [&](int64_t b0, int64_t b1, int) { pack(b0, b1); });
  } else {
    pack(0, blocks);
  }
}

#if defined(__x86_64__)
namespace {

GZ_TARGET_AVX512VNNI inline __m512i Broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// out[m : m + MR, blocks b0 .. b0 + NB) of a slice (only the columns in [n0, n1) are written;
// blocks past the weight's last reuse it and are not written). The int32 sums of a group stay
// in registers and are scaled into float32 sums once per group.
template <Format F, int MR, int NB>
GZ_TARGET_AVX512VNNI void VnniTile(const QuantSlice& s, int64_t m, int64_t b0, int64_t n0,
                                   int64_t n1) {
  const Weight& w = *s.w;
  const int64_t cols = w.cols;
  const int64_t groups = cols / quant::kGroup;
  const int64_t last_block = (w.rows - 1) / kBlockOutputs;
  constexpr int kCode = CodeBytes(F);
  constexpr int kUnit = UnitBytes(F);
  const auto* packed = static_cast<const uint8_t*>(w.data);
  const uint8_t* block[NB];
#pragma GCC unroll 8
  for (int j = 0; j < NB; ++j) block[j] = packed + std::min(b0 + j, last_block) * groups * kUnit;
  const int8_t* xr[MR];
  const float* xs[MR];
  const float* xsum[MR];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
    const int64_t row = std::min(m + i, s.rows - 1);
    xr[i] = s.x_i8 + row * cols;
    xs[i] = s.x_scales + row * groups;
    xsum[i] = s.x_sums + row * groups;
  }
  __m512 facc[MR][NB];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) facc[i][j] = _mm512_setzero_ps();
  }
  const __m512i low = _mm512_set1_epi8(0x0f);
  for (int64_t g = 0; g < groups; ++g) {
    __m512i acc[MR][NB];
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
      for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_setzero_si512();
    }
    const uint8_t* unit[NB];
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) unit[j] = block[j] + g * kUnit;
    const int64_t x0 = g * quant::kGroup;
    if constexpr (F == Format::kQ8) {
#pragma GCC unroll 4
      for (int t = 0; t < 32; ++t) {
        __m512i wv[NB];
#pragma GCC unroll 8
        for (int j = 0; j < NB; ++j) wv[j] = _mm512_load_si512(unit[j] + t * 64);
#pragma GCC unroll 4
        for (int i = 0; i < MR; ++i) {
          const __m512i xq = Broadcast4(xr[i] + x0 + 4 * t);
#pragma GCC unroll 8
          for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], wv[j], xq);
        }
      }
    } else {
      static_assert(F == Format::kQ4);
#pragma GCC unroll 2
      for (int t = 0; t < 16; ++t) {
        __m512i lo[NB], hi[NB];
#pragma GCC unroll 8
        for (int j = 0; j < NB; ++j) {
          const __m512i v = _mm512_load_si512(unit[j] + t * 64);
          lo[j] = _mm512_and_si512(v, low);
          hi[j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
        }
#pragma GCC unroll 4
        for (int i = 0; i < MR; ++i) {
          const __m512i xa = Broadcast4(xr[i] + x0 + 8 * t);
          const __m512i xb = Broadcast4(xr[i] + x0 + 8 * t + 4);
#pragma GCC unroll 8
          for (int j = 0; j < NB; ++j) {
            acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], lo[j], xa);
            acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], hi[j], xb);
          }
        }
      }
    }
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) {
      const __m512 mul = _mm512_load_ps(unit[j] + kCode);
      const __m512 add = _mm512_load_ps(unit[j] + kCode + 64);
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        const __m512 scale = _mm512_mul_ps(mul, _mm512_set1_ps(xs[i][g]));
        facc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[i][j]), scale, facc[i][j]);
        facc[i][j] = _mm512_fmadd_ps(add, _mm512_set1_ps(xsum[i][g]), facc[i][j]);
      }
    }
  }
  const int rows = static_cast<int>(std::min<int64_t>(MR, s.rows - m));
#pragma GCC unroll 8
  for (int j = 0; j < NB; ++j) {
    const int64_t b = b0 + j;
    if (b > last_block) break;
    const int64_t first = b * kBlockOutputs;
    const int64_t lo_col = std::max(n0, first), hi_col = std::min(n1, first + kBlockOutputs);
    if (lo_col >= hi_col) continue;
    const __mmask16 mask =
        static_cast<__mmask16>(((1u << (hi_col - first)) - 1) & ~((1u << (lo_col - first)) - 1));
    const __m512 bias = s.bias ? _mm512_maskz_loadu_ps(mask, s.bias + first) : _mm512_setzero_ps();
    for (int i = 0; i < rows; ++i) {
      _mm512_mask_storeu_ps(s.out + (m + i) * w.rows + first, mask,
                            _mm512_add_ps(facc[i][j], bias));
    }
  }
}

template <Format F>
GZ_TARGET_AVX512VNNI void VnniSlice(const QuantSlice& s, int64_t n0, int64_t n1) {
  int64_t b = n0 / kBlockOutputs;
  const int64_t end = (n1 + kBlockOutputs - 1) / kBlockOutputs;
  if (s.rows == 1) {
    // One row: eight blocks at a time, so that eight chains of products are in flight.
    for (; b + 8 <= end; b += 8) VnniTile<F, 1, 8>(s, 0, b, n0, n1);
    for (; b < end; b += 2) VnniTile<F, 1, 2>(s, 0, b, n0, n1);
    return;
  }
  // Two blocks (32 outputs) at a time for every tile of four rows: each block's codes are read
  // from memory by the first tile and from the cache by the others.
  for (; b < end; b += 2) {
    int64_t m = 0;
    for (; m + 4 <= s.rows; m += 4) VnniTile<F, 4, 2>(s, m, b, n0, n1);
    switch (s.rows - m) {
      case 3:
        VnniTile<F, 3, 2>(s, m, b, n0, n1);
        break;
      case 2:
        VnniTile<F, 2, 2>(s, m, b, n0, n1);
        break;
      case 1:
        VnniTile<F, 1, 2>(s, m, b, n0, n1);
        break;
      default:
        break;
    }
  }
}

GZ_TARGET_AVX512VNNI void QuantizeRowsInt8Avx512(const float* x, int64_t rows, int64_t cols,
                                                 int8_t* q, float* scales, float* sums) {
  const int64_t groups = cols / quant::kGroup;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const float* src = x + r * cols + g * quant::kGroup;
      __m512 v[8];
      __m512 largest = _mm512_setzero_ps();
      __mmask16 nonfinite = 0;  // NaN or infinity (fpclass: QNaN, +inf, -inf, SNaN)
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) {
        v[c] = _mm512_loadu_ps(src + 16 * c);
        largest = _mm512_max_ps(largest, _mm512_abs_ps(v[c]));
        nonfinite |= _mm512_fpclass_ps_mask(v[c], 0x01 | 0x08 | 0x10 | 0x80);
      }
      int8_t* dst = q + r * cols + g * quant::kGroup;
      if (nonfinite) {
        std::memset(dst, 0, quant::kGroup);
        scales[r * groups + g] = sums[r * groups + g] = std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      const float max = _mm512_reduce_max_ps(largest);
      const __m512 inv = _mm512_set1_ps(max > 0.0f ? 127.0f / max : 0.0f);
      __m512i sum = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) {
        const __m512i code = _mm512_cvtps_epi32(_mm512_mul_ps(v[c], inv));  // nearest, even
        sum = _mm512_add_epi32(sum, code);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 16 * c), _mm512_cvtsepi32_epi8(code));
      }
      const float scale = max / 127.0f;
      scales[r * groups + g] = scale;
      sums[r * groups + g] = scale * static_cast<float>(_mm512_reduce_add_epi32(sum));
    }
  }
}

}  // namespace

QuantSliceFn QuantSliceAvx512Vnni(Format format) {
  switch (format) {
    case Format::kQ8:
      return VnniSlice<Format::kQ8>;
    case Format::kQ4:
      return VnniSlice<Format::kQ4>;
    default:
      return nullptr;
  }
}

QuantizeRowsInt8Fn QuantizeRowsInt8() { return QuantizeRowsInt8Avx512; }

#else

QuantSliceFn QuantSliceAvx512Vnni(Format) { return nullptr; }
QuantizeRowsInt8Fn QuantizeRowsInt8() { return nullptr; }

#endif

}  // namespace gizllm
