// AVX-512 matmul kernels: 16 floats per vector, blocks of 32 inputs.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "backend/cpu/matmul_kernels.h"

namespace gizllm {
namespace {

constexpr int kBlock = 32;
// Decode prefetches the weights this many rows (two 8-row tiles) ahead.
constexpr int kPrefetchRows = 16;
// Activation rows of one pass over a weight tile: small enough to stay in L2.
constexpr int64_t kActivationBytes = 256 << 10;

template <Format F>
struct Load;

// bf16: a 32-bit lane holds inputs (2i, 2i+1); a shift gives the even input, a mask the odd.
template <>
struct Load<Format::kBf16> {
  using T = uint16_t;
  GZ_TARGET_AVX512 static inline void Split(__m512i v, __m512* a, __m512* b) {
    *a = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    *b = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(0xffff0000u)));
  }
  GZ_TARGET_AVX512 static inline void Full(const T* w, __m512* a, __m512* b) {
    Split(_mm512_loadu_si512(w), a, b);
  }
  GZ_TARGET_AVX512 static inline void Part(const T* w, int n, __m512* a, __m512* b) {
    Split(_mm512_maskz_loadu_epi16(_cvtu32_mask32((1u << n) - 1), w), a, b);
  }
};

template <>
struct Load<Format::kF16> {
  using T = uint16_t;
  GZ_TARGET_AVX512 static inline void Full(const T* w, __m512* a, __m512* b) {
    *a = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)));
    *b = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 16)));
  }
  GZ_TARGET_AVX512 static inline void Part(const T* w, int n, __m512* a, __m512* b) {
    __m512i v = _mm512_maskz_loadu_epi16(_cvtu32_mask32((1u << n) - 1), w);
    *a = _mm512_cvtph_ps(_mm512_castsi512_si256(v));
    *b = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(v, 1));
  }
};

template <>
struct Load<Format::kF32> {
  using T = float;
  GZ_TARGET_AVX512 static inline void Full(const T* w, __m512* a, __m512* b) {
    *a = _mm512_loadu_ps(w);
    *b = _mm512_loadu_ps(w + 16);
  }
  GZ_TARGET_AVX512 static inline void Part(const T* w, int n, __m512* a, __m512* b) {
    __mmask16 lo = n >= 16 ? 0xffff : (1u << n) - 1;
    __mmask16 hi = n > 16 ? (1u << (n - 16)) - 1 : 0;
    *a = _mm512_maskz_loadu_ps(lo, w);
    *b = _mm512_maskz_loadu_ps(hi, w + 16);
  }
};

// The four sums of a0..a3, in order.
GZ_TARGET_AVX512 inline __m128 Reduce4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
  // Per 128-bit lane: [a0 0+2, a1 0+2, a0 1+3, a1 1+3] and the same for a2, a3.
  __m512 t0 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
  __m512 t1 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
  // Per lane: [a0, a1, a2, a3] partial sums.
  __m512d d0 = _mm512_castps_pd(t0), d1 = _mm512_castps_pd(t1);
  __m512 u = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(d0, d1)),
                           _mm512_castpd_ps(_mm512_unpackhi_pd(d0, d1)));
  __m256 h = _mm256_add_ps(_mm512_castps512_ps256(u), _mm512_extractf32x8_ps(u, 1));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// sums[j * NW + i] = dot(w[i][0:cols], x[j][0:cols]) for NW weight rows and MX activation rows.
// The weight vectors of a block are loaded once and used for all MX rows.
template <Format F, int NW, int MX, bool kPrefetch>
GZ_TARGET_AVX512 inline void Tile(const typename Load<F>::T* const* w, const float* const* x,
                                  int64_t cols, float* sums) {
  static_assert(NW % 4 == 0);
  __m512 acc[MX][NW];
#pragma GCC unroll 8
  for (int j = 0; j < MX; ++j) {
#pragma GCC unroll 8
    for (int i = 0; i < NW; ++i) acc[j][i] = _mm512_setzero_ps();
  }
  const int64_t full = cols / kBlock * kBlock;
  int64_t k = 0;
  for (; k < full; k += kBlock) {
    __m512 a[NW], b[NW];
#pragma GCC unroll 8
    for (int i = 0; i < NW; ++i) Load<F>::Full(w[i] + k, &a[i], &b[i]);
    if constexpr (kPrefetch) {
      // Decode streams the weights: fetch the same block of the next tile's rows ahead.
#pragma GCC unroll 8
      for (int i = 0; i < NW; ++i) {
        _mm_prefetch(reinterpret_cast<const char*>(w[i] + k + kPrefetchRows * cols), _MM_HINT_T0);
      }
    }
#pragma GCC unroll 8
    for (int j = 0; j < MX; ++j) {
      __m512 xa = _mm512_loadu_ps(x[j] + k);
      __m512 xb = _mm512_loadu_ps(x[j] + k + 16);
#pragma GCC unroll 8
      for (int i = 0; i < NW; ++i) {
        acc[j][i] = _mm512_fmadd_ps(a[i], xa, acc[j][i]);
        acc[j][i] = _mm512_fmadd_ps(b[i], xb, acc[j][i]);
      }
    }
  }
  if (k < cols) {
    const int n = static_cast<int>(cols - k);
    __m512 a[NW], b[NW];
#pragma GCC unroll 8
    for (int i = 0; i < NW; ++i) Load<F>::Part(w[i] + k, n, &a[i], &b[i]);
#pragma GCC unroll 8
    for (int j = 0; j < MX; ++j) {
      // Activations are zero-padded to the block.
      __m512 xa = _mm512_loadu_ps(x[j] + k);
      __m512 xb = _mm512_loadu_ps(x[j] + k + 16);
#pragma GCC unroll 8
      for (int i = 0; i < NW; ++i) {
        acc[j][i] = _mm512_fmadd_ps(a[i], xa, acc[j][i]);
        acc[j][i] = _mm512_fmadd_ps(b[i], xb, acc[j][i]);
      }
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

// out[:, n0:n1] with tiles of NW weight rows by MX activation rows. Tiles past the last row
// repeat it (their sums are dropped), so any n0, n1 and rows work.
template <Format F, int NW, int MX, bool kPrefetch = false>
GZ_TARGET_AVX512 void SliceTiles(const MatmulSlice& s, int64_t n0, int64_t n1) {
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
        alignas(64) float sums[MX * NW];
        Tile<F, NW, MX, kPrefetch>(wr, xr, cols, sums);
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

// Many rows (prefill, batched decode): the weights are widened to float32 once per call into a
// panel of kPanelRows rows (on the stack, in L1), which every activation row then reuses; the
// inline widening of SliceTiles would repeat for every group of activation rows and occupy the
// vector pipes beside the FMAs. A panel holds the blocks as Load<F> returns them (bf16: even
// inputs, then odd), the order PrepareActivations wrote x in, zero-padded to the block.
constexpr int kPanelRows = 4;
static_assert(kPanelRows == kAvx512PanelRows);
// Inputs per panel row: longer rows are summed over several panels, [0, kPanelCols) first.
constexpr int64_t kPanelCols = 2048;
// Activation rows per register tile: 4 x 6 = 24 accumulators, 4 weight and 1 activation
// registers.
constexpr int kPanelTileRows = 6;
// The panel fill prefetches the weights of the panel this many rows ahead.
constexpr int kPanelPrefetchRows = 16;

// panel[i][0:len] = the weight rows w[i] over inputs [k0, k0 + len), widened; len is a multiple
// of the block; inputs past cols are zero. The same inputs kPanelPrefetchRows rows further are
// prefetched (the caller's next panels).
template <Format F>
GZ_TARGET_AVX512 inline void FillPanel(const typename Load<F>::T* const* w, int64_t cols,
                                       int64_t k0, int64_t len, float* panel) {
#pragma GCC unroll 4
  for (int i = 0; i < kPanelRows; ++i) {
    const typename Load<F>::T* row = w[i] + k0;
    float* dst = panel + i * len;
    const int64_t full = std::clamp<int64_t>((cols - k0) / kBlock * kBlock, 0, len);
    int64_t k = 0;
    for (; k < full; k += kBlock) {
      __m512 a, b;
      Load<F>::Full(row + k, &a, &b);
      _mm_prefetch(reinterpret_cast<const char*>(row + k + kPanelPrefetchRows * cols), _MM_HINT_T0);
      _mm512_store_ps(dst + k, a);
      _mm512_store_ps(dst + k + 16, b);
    }
    for (; k < len; k += kBlock) {
      __m512 a = _mm512_setzero_ps(), b = a;
      const int64_t n = cols - k0 - k;
      if (n > 0) Load<F>::Part(row + k, static_cast<int>(n), &a, &b);
      _mm512_store_ps(dst + k, a);
      _mm512_store_ps(dst + k + 16, b);
    }
  }
}

// out[m + j, n:n + valid_n] (+)= dot(panel[i][0:len], x row m + j from input k0) for MX
// activation rows: the first panel of a row writes (with the bias), later ones add.
template <int MX>
GZ_TARGET_AVX512 inline void PanelRows(const MatmulSlice& s, const float* panel, int64_t k0,
                                       int64_t len, int64_t m, int64_t n, int valid_n) {
  constexpr int NW = kPanelRows;
  static_assert(NW == 4);
  const float* x[MX];
  for (int j = 0; j < MX; ++j) x[j] = s.x + (m + j) * s.x_stride + k0;
  __m512 acc[MX][NW];
#pragma GCC unroll 8
  for (int j = 0; j < MX; ++j) {
#pragma GCC unroll 8
    for (int i = 0; i < NW; ++i) acc[j][i] = _mm512_setzero_ps();
  }
  for (int64_t k = 0; k < len; k += 16) {
    __m512 w[NW];
#pragma GCC unroll 8
    for (int i = 0; i < NW; ++i) w[i] = _mm512_load_ps(panel + i * len + k);
#pragma GCC unroll 8
    for (int j = 0; j < MX; ++j) {
      const __m512 xv = _mm512_loadu_ps(x[j] + k);
#pragma GCC unroll 8
      for (int i = 0; i < NW; ++i) acc[j][i] = _mm512_fmadd_ps(w[i], xv, acc[j][i]);
    }
  }
  const int64_t n_out = s.w->rows;
  const __mmask8 valid = static_cast<__mmask8>((1u << valid_n) - 1);
  __m128 add = _mm_setzero_ps();
  if (k0 == 0 && s.bias) add = _mm_maskz_loadu_ps(valid, s.bias + n);
#pragma GCC unroll 8
  for (int j = 0; j < MX; ++j) {
    float* out = s.out + (m + j) * n_out + n;
    __m128 sum = _mm_add_ps(Reduce4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]),
                            k0 > 0 ? _mm_maskz_loadu_ps(valid, out) : add);
    _mm_mask_storeu_ps(out, valid, sum);
  }
}

// Rows [m0, m1) of out[:, n:n + valid_n] over a panel of inputs [k0, k0 + len).
GZ_TARGET_AVX512 void PanelAllRows(const MatmulSlice& s, const float* panel, int64_t k0,
                                   int64_t len, int64_t m0, int64_t m1, int64_t n, int valid_n) {
  int64_t m = m0;
  for (; m + kPanelTileRows <= m1; m += kPanelTileRows) {
    PanelRows<kPanelTileRows>(s, panel, k0, len, m, n, valid_n);
  }
  switch (m1 - m) {
    case 5:
      PanelRows<5>(s, panel, k0, len, m, n, valid_n);
      break;
    case 4:
      PanelRows<4>(s, panel, k0, len, m, n, valid_n);
      break;
    case 3:
      PanelRows<3>(s, panel, k0, len, m, n, valid_n);
      break;
    case 2:
      PanelRows<2>(s, panel, k0, len, m, n, valid_n);
      break;
    case 1:
      PanelRows<1>(s, panel, k0, len, m, n, valid_n);
      break;
    default:
      break;
  }
}

template <Format F>
GZ_TARGET_AVX512 void SlicePanels(const MatmulSlice& s, int64_t n0, int64_t n1) {
  using T = typename Load<F>::T;
  const T* w = static_cast<const T*>(s.w->data);  // [n, cols]
  const int64_t cols = s.w->cols;
  alignas(64) float panel[kPanelRows * kPanelCols];  // [kPanelRows, len]
  // Rows of x per pass over the weights: their activations stay in L2.
  const int64_t pass = std::max<int64_t>(
      kPanelTileRows, kActivationBytes / (s.x_stride * 4) / kPanelTileRows * kPanelTileRows);
  for (int64_t m0 = 0; m0 < s.rows; m0 += pass) {
    const int64_t m1 = std::min(s.rows, m0 + pass);
    for (int64_t n = n0; n < n1; n += kPanelRows) {
      // Past n1, repeat its last row (the sums are dropped).
      const T* wr[kPanelRows];
      for (int i = 0; i < kPanelRows; ++i) wr[i] = w + std::min(n + i, n1 - 1) * cols;
      const int valid_n = static_cast<int>(std::min<int64_t>(kPanelRows, n1 - n));
      for (int64_t k0 = 0; k0 < s.x_stride; k0 += kPanelCols) {
        const int64_t len = std::min(kPanelCols, s.x_stride - k0);
        FillPanel<F>(wr, cols, k0, len, panel);
        PanelAllRows(s, panel, k0, len, m0, m1, n, valid_n);
      }
    }
  }
}

// Decode (one row) streams the weights with 8 rows in flight; two to four rows share each
// weight load among them (the weights still come from memory once per call, so they are
// prefetched); more rows go through the float32 panels.
template <Format F>
GZ_TARGET_AVX512 void Slice(const MatmulSlice& s, int64_t n0, int64_t n1) {
  if (s.rows == 1) return SliceTiles<F, 8, 1, true>(s, n0, n1);
  if (s.rows == 2) return SliceTiles<F, 4, 2, true>(s, n0, n1);
  if (s.rows <= 4) return SliceTiles<F, 4, 4, true>(s, n0, n1);
  return SlicePanels<F>(s, n0, n1);
}

GZ_TARGET_AVX512 void Prepare(Format format, const float* x, int64_t rows, int64_t cols,
                              float* dst) {
  const int64_t stride = PaddedCols(cols, kBlock);
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = x + r * cols;
    float* out = dst + r * stride;
    for (int64_t k = 0; k < stride; k += kBlock) {
      const int64_t n = std::min<int64_t>(kBlock, cols - k);
      __mmask16 lo = n >= 16 ? 0xffff : (1u << n) - 1;
      __mmask16 hi = n > 16 ? (n >= 32 ? 0xffff : (1u << (n - 16)) - 1) : 0;
      __m512 v0 = _mm512_maskz_loadu_ps(lo, src + k);
      __m512 v1 = _mm512_maskz_loadu_ps(hi, src + k + 16);
      if (format == Format::kBf16) {
        _mm512_storeu_ps(out + k, _mm512_permutex2var_ps(v0, even, v1));
        _mm512_storeu_ps(out + k + 16, _mm512_permutex2var_ps(v0, odd, v1));
      } else {
        _mm512_storeu_ps(out + k, v0);
        _mm512_storeu_ps(out + k + 16, v1);
      }
    }
  }
}

}  // namespace

void Avx512PanelRows(const MatmulSlice& s, const float* panel, int64_t k0, int64_t len, int64_t m0,
                     int64_t m1, int64_t n, int valid_n) {
  PanelAllRows(s, panel, k0, len, m0, m1, n, valid_n);
}

const MatmulKernels& Avx512MatmulKernels() {
  static const MatmulKernels kernels = [] {
    MatmulKernels k;
    k.block = kBlock;
    k.tile_rows = 8;
    k.prepare = &Prepare;
    k.slice[static_cast<int>(Format::kF32)] = &Slice<Format::kF32>;
    k.slice[static_cast<int>(Format::kF16)] = &Slice<Format::kF16>;
    k.slice[static_cast<int>(Format::kBf16)] = &Slice<Format::kBf16>;
    return k;
  }();
  return kernels;
}

}  // namespace gizllm
