// AVX-512 BF16 matmul kernels for bf16 weights: activations rounded to bf16 once, then
// vdpbf16ps multiplies 32 weight-activation pairs per instruction with float32 accumulation.
// Twice the products per instruction of the float32 kernels and no widening of the weights;
// the price is the activations' bf16 rounding (an option, off by default).
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "backend/cpu/matmul_kernels.h"

namespace gizllm {
namespace {

constexpr int kBlock = 32;
constexpr int64_t kActivationBytes = 256 << 10;

GZ_TARGET_AVX512BF16 inline __m128 Reduce4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
  __m512 t0 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
  __m512 t1 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
  __m512d d0 = _mm512_castps_pd(t0), d1 = _mm512_castps_pd(t1);
  __m512 u = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(d0, d1)),
                           _mm512_castpd_ps(_mm512_unpackhi_pd(d0, d1)));
  __m256 h = _mm256_add_ps(_mm512_castps512_ps256(u), _mm512_extractf32x8_ps(u, 1));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// sums[j * NW + i] = dot(w[i][0:cols], x[j][0:cols]), x in bf16 zero-padded to the block.
template <int NW, int MX>
GZ_TARGET_AVX512BF16 inline void Tile(const uint16_t* const* w, const uint16_t* const* x,
                                      int64_t cols, float* sums) {
  __m512 acc[MX][NW];
#pragma GCC unroll 8
  for (int j = 0; j < MX; ++j) {
#pragma GCC unroll 8
    for (int i = 0; i < NW; ++i) acc[j][i] = _mm512_setzero_ps();
  }
  for (int64_t k = 0; k < cols; k += kBlock) {
    __m512i a[NW];
    if (k + kBlock <= cols) {
#pragma GCC unroll 8
      for (int i = 0; i < NW; ++i) a[i] = _mm512_loadu_si512(w[i] + k);
    } else {
      const __mmask32 m = _cvtu32_mask32((1u << (cols - k)) - 1);
#pragma GCC unroll 8
      for (int i = 0; i < NW; ++i) a[i] = _mm512_maskz_loadu_epi16(m, w[i] + k);
    }
#pragma GCC unroll 8
    for (int j = 0; j < MX; ++j) {
      __m512bh xv = (__m512bh)_mm512_loadu_si512(x[j] + k);
#pragma GCC unroll 8
      for (int i = 0; i < NW; ++i) acc[j][i] = _mm512_dpbf16_ps(acc[j][i], (__m512bh)a[i], xv);
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < MX; ++j) {
#pragma GCC unroll 8
    for (int i = 0; i < NW; i += 4) {
      _mm_storeu_ps(sums + j * NW + i,
                    Reduce4(acc[j][i], acc[j][i + 1], acc[j][i + 2], acc[j][i + 3]));
    }
  }
}

template <int NW, int MX>
GZ_TARGET_AVX512BF16 void SliceTiles(const MatmulSlice& s, int64_t n0, int64_t n1) {
  const uint16_t* w = static_cast<const uint16_t*>(s.w->data);  // [n, cols]
  const uint16_t* x = reinterpret_cast<const uint16_t*>(s.x);   // [rows, 2 * x_stride]
  const int64_t x_stride = 2 * s.x_stride;
  const int64_t cols = s.w->cols;
  const int64_t n_out = s.w->rows;
  const int64_t pass = std::max<int64_t>(MX, kActivationBytes / (x_stride * 2) / MX * MX);
  for (int64_t m0 = 0; m0 < s.rows; m0 += pass) {
    const int64_t m1 = std::min(s.rows, m0 + pass);
    for (int64_t n = n0; n < n1; n += NW) {
      const uint16_t* wr[NW];
      for (int i = 0; i < NW; ++i) wr[i] = w + std::min(n + i, n1 - 1) * cols;
      const int valid_n = static_cast<int>(std::min<int64_t>(NW, n1 - n));
      for (int64_t m = m0; m < m1; m += MX) {
        const uint16_t* xr[MX];
        for (int j = 0; j < MX; ++j) xr[j] = x + std::min(m + j, m1 - 1) * x_stride;
        alignas(64) float sums[MX * NW];
        Tile<NW, MX>(wr, xr, cols, sums);
        const int valid_m = static_cast<int>(std::min<int64_t>(MX, m1 - m));
        for (int j = 0; j < valid_m; ++j) {
          float* out = s.out + (m + j) * n_out + n;
          for (int i = 0; i < valid_n; ++i) {
            out[i] = s.bias ? sums[j * NW + i] + s.bias[n + i] : sums[j * NW + i];
          }
        }
      }
    }
  }
}

// 4x6 tile: 24 accumulators, 4 weight registers, one activation register.
GZ_TARGET_AVX512BF16 void Slice(const MatmulSlice& s, int64_t n0, int64_t n1) {
  if (s.rows == 1) return SliceTiles<8, 1>(s, n0, n1);
  if (s.rows == 2) return SliceTiles<8, 2>(s, n0, n1);
  return SliceTiles<4, 6>(s, n0, n1);
}

// Rows of x rounded to bf16 (nearest even), zero-padded to the block.
GZ_TARGET_AVX512BF16 void Prepare(Format format, const float* x, int64_t rows, int64_t cols,
                                  float* dst) {
  const int64_t stride = PaddedCols(cols, kBlock);  // bf16 per row
  uint16_t* out = reinterpret_cast<uint16_t*>(dst);
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = x + r * cols;
    for (int64_t k = 0; k < stride; k += kBlock) {
      const int64_t n = std::min<int64_t>(kBlock, cols - k);
      __mmask16 lo = n >= 16 ? 0xffff : (1u << n) - 1;
      __mmask16 hi = n > 16 ? (n >= 32 ? 0xffff : (1u << (n - 16)) - 1) : 0;
      __m512 v0 = _mm512_maskz_loadu_ps(lo, src + k);
      __m512 v1 = _mm512_maskz_loadu_ps(hi, src + k + 16);
      _mm512_storeu_si512(out + r * stride + k, (__m512i)_mm512_cvtne2ps_pbh(v1, v0));
    }
  }
}

}  // namespace

const MatmulKernels& Avx512Bf16MatmulKernels() {
  static const MatmulKernels kernels = [] {
    MatmulKernels k;
    k.block = kBlock;
    k.tile_rows = 8;
    k.bf16_activations = true;
    k.prepare = &Prepare;
    k.slice[static_cast<int>(Format::kBf16)] = &Slice;
    return k;
  }();
  return kernels;
}

}  // namespace gizllm
