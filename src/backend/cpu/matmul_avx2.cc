// AVX2 matmul kernels: 8 floats per vector, blocks of 16 inputs, 16 registers.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "backend/cpu/matmul_kernels.h"

namespace gizllm {
namespace {

constexpr int kBlock = 16;
constexpr int64_t kActivationBytes = 256 << 10;

template <Format F>
struct Load;

// bf16: a 32-bit lane holds inputs (2i, 2i+1); a shift gives the even input, a mask the odd.
template <>
struct Load<Format::kBf16> {
  using T = uint16_t;
  GZ_TARGET_AVX2 static inline void Full(const T* w, __m256* a, __m256* b) {
    __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
    *a = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    *b = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(0xffff0000u)));
  }
};

template <>
struct Load<Format::kF16> {
  using T = uint16_t;
  GZ_TARGET_AVX2 static inline void Full(const T* w, __m256* a, __m256* b) {
    *a = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
    *b = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 8)));
  }
};

template <>
struct Load<Format::kF32> {
  using T = float;
  GZ_TARGET_AVX2 static inline void Full(const T* w, __m256* a, __m256* b) {
    *a = _mm256_loadu_ps(w);
    *b = _mm256_loadu_ps(w + 8);
  }
};

GZ_TARGET_AVX2 inline float Sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <Format F, int NW, int MX>
GZ_TARGET_AVX2 inline void Accumulate(const typename Load<F>::T* const* w, int64_t wk,
                                      const float* const* x, int64_t k, __m256 (&acc)[MX][NW]) {
  __m256 a[NW], b[NW];
#pragma GCC unroll 8
  for (int i = 0; i < NW; ++i) Load<F>::Full(w[i] + wk, &a[i], &b[i]);
#pragma GCC unroll 8
  for (int j = 0; j < MX; ++j) {
    __m256 xa = _mm256_loadu_ps(x[j] + k);
    __m256 xb = _mm256_loadu_ps(x[j] + k + 8);
#pragma GCC unroll 8
    for (int i = 0; i < NW; ++i) {
      acc[j][i] = _mm256_fmadd_ps(a[i], xa, acc[j][i]);
      acc[j][i] = _mm256_fmadd_ps(b[i], xb, acc[j][i]);
    }
  }
}

// sums[j * NW + i] = dot(w[i][0:cols], x[j][0:cols]).
template <Format F, int NW, int MX>
GZ_TARGET_AVX2 inline void Tile(const typename Load<F>::T* const* w, const float* const* x,
                                int64_t cols, float* sums) {
  using T = typename Load<F>::T;
  __m256 acc[MX][NW];
#pragma GCC unroll 8
  for (int j = 0; j < MX; ++j) {
#pragma GCC unroll 8
    for (int i = 0; i < NW; ++i) acc[j][i] = _mm256_setzero_ps();
  }
  const int64_t full = cols / kBlock * kBlock;
  for (int64_t k = 0; k < full; k += kBlock) Accumulate<F, NW, MX>(w, k, x, k, acc);
  if (full < cols) {
    // The last partial block, copied zero-padded (activations are padded already).
    T tail[NW][kBlock];
    const T* tail_rows[NW];
    for (int i = 0; i < NW; ++i) {
      std::memset(tail[i], 0, sizeof(tail[i]));
      std::memcpy(tail[i], w[i] + full, (cols - full) * sizeof(T));
      tail_rows[i] = tail[i];
    }
    Accumulate<F, NW, MX>(tail_rows, 0, x, full, acc);
  }
  for (int j = 0; j < MX; ++j) {
    for (int i = 0; i < NW; ++i) sums[j * NW + i] = Sum(acc[j][i]);
  }
}

template <Format F, int NW, int MX>
GZ_TARGET_AVX2 void SliceTiles(const MatmulSlice& s, int64_t n0, int64_t n1) {
  using T = typename Load<F>::T;
  const T* w = static_cast<const T*>(s.w->data);  // [n, cols]
  const int64_t cols = s.w->cols;
  const int64_t n_out = s.w->rows;
  const int64_t pass = std::max<int64_t>(MX, kActivationBytes / (s.x_stride * 4) / MX * MX);
  for (int64_t m0 = 0; m0 < s.rows; m0 += pass) {
    const int64_t m1 = std::min(s.rows, m0 + pass);
    for (int64_t n = n0; n < n1; n += NW) {
      const T* wr[NW];
      for (int i = 0; i < NW; ++i) wr[i] = w + std::min(n + i, n1 - 1) * cols;
      const int valid_n = static_cast<int>(std::min<int64_t>(NW, n1 - n));
      for (int64_t m = m0; m < m1; m += MX) {
        const float* xr[MX];
        for (int j = 0; j < MX; ++j) xr[j] = s.x + std::min(m + j, m1 - 1) * s.x_stride;
        float sums[MX * NW];
        Tile<F, NW, MX>(wr, xr, cols, sums);
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

// Decode streams 4 weight rows at a time; more rows share each weight load among 4 rows
// (2x4 tile: 8 accumulators, 4 weight and 2 activation registers).
template <Format F>
GZ_TARGET_AVX2 void Slice(const MatmulSlice& s, int64_t n0, int64_t n1) {
  if (s.rows == 1) return SliceTiles<F, 4, 1>(s, n0, n1);
  return SliceTiles<F, 2, 4>(s, n0, n1);
}

void Prepare(Format format, const float* x, int64_t rows, int64_t cols, float* dst) {
  const int64_t stride = PaddedCols(cols, kBlock);
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = x + r * cols;
    float* out = dst + r * stride;
    std::memset(out, 0, stride * sizeof(float));
    if (format != Format::kBf16) {
      std::memcpy(out, src, cols * sizeof(float));
      continue;
    }
    for (int64_t k = 0; k < cols; ++k) {
      const int64_t base = k / kBlock * kBlock, i = k - base;
      out[base + (i % 2) * (kBlock / 2) + i / 2] = src[k];
    }
  }
}

}  // namespace

const MatmulKernels& Avx2MatmulKernels() {
  static const MatmulKernels kernels = [] {
    MatmulKernels k;
    k.block = kBlock;
    k.tile_rows = 4;
    k.prepare = &Prepare;
    k.slice[static_cast<int>(Format::kF32)] = &Slice<Format::kF32>;
    k.slice[static_cast<int>(Format::kF16)] = &Slice<Format::kF16>;
    k.slice[static_cast<int>(Format::kBf16)] = &Slice<Format::kBf16>;
    return k;
  }();
  return kernels;
}

}  // namespace gizllm
