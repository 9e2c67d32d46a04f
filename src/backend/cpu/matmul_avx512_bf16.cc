// AVX-512 BF16 matmul kernels for bf16 weights: activations rounded to bf16 once, then
// vdpbf16ps multiplies 32 weight-activation pairs per instruction with float32 accumulation.
// Twice the products per instruction of the float32 kernels; the price is the activations' bf16
// rounding (an option, off by default, for steps of CpuOptions::kBf16MinRows rows and more).
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/cpu/matmul_kernels.h"

namespace gizllm {
namespace {

constexpr int kBlock = 32;

// The weights are repacked once per call, a panel of kPanelOut outputs and kPanelInputs inputs
// at a time, so that each 32-bit lane holds one output's pair of inputs (2p, 2p + 1):
// panel[p][o]. vdpbf16ps of a panel row with the activation pair (2p, 2p + 1) of one row
// broadcast to every lane then adds that pair's products to 16 outputs at once: the outputs lie
// in the lanes, so no sum is reduced across lanes at the end (dot-product tiles over the weights
// as stored spent much of their time on those reductions with inputs as short as 384: 199 against
// 235 GFLOP/s for 128 rows), and a tile of kPanelRows activation rows reuses each panel row from
// registers. CpuBackend sends steps of fewer rows to the float32 kernels.
constexpr int kPanelOut = 32;          // outputs per panel: two vectors of 16
constexpr int64_t kPanelInputs = 384;  // inputs per panel: 192 pairs x 32 outputs x 4 B = 24 KB
static_assert(kPanelInputs == kAvx512Bf16PanelInputs);
constexpr int kPanelRows = 8;  // activation rows per tile: 16 accumulators

// Transposes 16 rows of 16 32-bit lanes in place: r[i] lane j <- r[j] lane i.
GZ_TARGET_AVX512BF16 inline void Transpose16(__m512i* r) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  // Each 128-bit lane q of r[4a + b] now holds column 4q + b of rows 4a..4a+3: gather the four
  // 128-bit pieces of each column.
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_i32x4(r[i], r[4 + i], 0x88);      // lanes 0, 2 of each
    t[4 + i] = _mm512_shuffle_i32x4(r[i], r[4 + i], 0xdd);  // lanes 1, 3
    t[8 + i] = _mm512_shuffle_i32x4(r[8 + i], r[12 + i], 0x88);
    t[12 + i] = _mm512_shuffle_i32x4(r[8 + i], r[12 + i], 0xdd);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[8 + i], 0x88);            // column i
    r[8 + i] = _mm512_shuffle_i32x4(t[i], t[8 + i], 0xdd);        // column 8 + i
    r[4 + i] = _mm512_shuffle_i32x4(t[4 + i], t[12 + i], 0x88);   // column 4 + i
    r[12 + i] = _mm512_shuffle_i32x4(t[4 + i], t[12 + i], 0xdd);  // column 12 + i
  }
}

// panel[p * kPanelOut + o] = the inputs (k0 + 2p, k0 + 2p + 1) of output n + o, p < len / 2
// (len a multiple of 32; inputs past cols are zero); outputs past n1 repeat n1 - 1 (their sums
// are dropped). The next panel's rows (of `n_rows` in all) are prefetched into L2, past n1 too:
// the rows after a slice are the next slice a thread takes.
GZ_TARGET_AVX512BF16 void PackPanel(const uint16_t* w, int64_t n_rows, int64_t cols, int64_t n,
                                    int64_t n1, int64_t k0, int64_t len, uint32_t* panel) {
  for (int g = 0; g < kPanelOut / 16; ++g) {
    const uint16_t* rows[16];
    const uint16_t* next[16];
    for (int i = 0; i < 16; ++i) {
      rows[i] = w + std::min(n + 16 * g + i, n1 - 1) * cols;
      next[i] = w + std::min(n + kPanelOut + 16 * g + i, n_rows - 1) * cols;
    }
    for (int64_t k = 0; k < len; k += 32) {
      const int64_t left = cols - k0 - k;
      const __mmask32 m = left >= 32 ? ~0u : left > 0 ? _cvtu32_mask32((1u << left) - 1) : 0;
      __m512i r[16];
      for (int i = 0; i < 16; ++i) {
        r[i] = _mm512_maskz_loadu_epi16(m, rows[i] + k0 + k);
        _mm_prefetch(reinterpret_cast<const char*>(next[i] + k0 + k), _MM_HINT_T1);
      }
      Transpose16(r);
      for (int t = 0; t < 16; ++t)
        _mm512_store_si512(panel + (k / 2 + t) * kPanelOut + 16 * g, r[t]);
    }
  }
}

// acc (outputs n..n+32 of the tile's kPanelRows activation rows) += the panel's pairs times the
// rows' pairs; x: the tile's pairs, kPanelRows per pair (PackRows). PF cache lines from `pf` on
// are prefetched into L1 for each pair (the next panel, while this one's products run).
//
// F32: the activations are float32 (two per pair and row, PrepareTilesF32), and each panel row
// is widened to the float32 values of its even and odd inputs (a shift, a mask) for exact
// float32 products: acc += w[2p] * x[2p], then += w[2p + 1] * x[2p + 1], in the same order for
// every row of every tile size.
template <int MR, int PF = 0, bool F32 = false>
GZ_TARGET_AVX512BF16 inline void PanelTile(const uint32_t* panel, int64_t pairs, const void* xv,
                                           __m512* acc, const char* pf = nullptr) {
  if constexpr (F32) {
    const float* x = static_cast<const float*>(xv);
    const __m512i high = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
    for (int64_t p = 0; p < pairs; ++p) {
      const __m512i w0 = _mm512_load_si512(panel + p * kPanelOut);
      const __m512i w1 = _mm512_load_si512(panel + p * kPanelOut + 16);
      for (int l = 0; l < PF; ++l) _mm_prefetch(pf + (p * PF + l) * 64, _MM_HINT_T0);
      const __m512 e0 = _mm512_castsi512_ps(_mm512_slli_epi32(w0, 16));
      const __m512 o0 = _mm512_castsi512_ps(_mm512_and_si512(w0, high));
      const __m512 e1 = _mm512_castsi512_ps(_mm512_slli_epi32(w1, 16));
      const __m512 o1 = _mm512_castsi512_ps(_mm512_and_si512(w1, high));
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        const __m512 xe = _mm512_set1_ps(x[(p * kPanelRows + i) * 2]);
        const __m512 xo = _mm512_set1_ps(x[(p * kPanelRows + i) * 2 + 1]);
        acc[2 * i] = _mm512_fmadd_ps(o0, xo, _mm512_fmadd_ps(e0, xe, acc[2 * i]));
        acc[2 * i + 1] = _mm512_fmadd_ps(o1, xo, _mm512_fmadd_ps(e1, xe, acc[2 * i + 1]));
      }
    }
    return;
  }
  const uint32_t* x = static_cast<const uint32_t*>(xv);
  for (int64_t p = 0; p < pairs; ++p) {
    const __m512bh w0 = (__m512bh)_mm512_load_si512(panel + p * kPanelOut);
    const __m512bh w1 = (__m512bh)_mm512_load_si512(panel + p * kPanelOut + 16);
    for (int l = 0; l < PF; ++l) _mm_prefetch(pf + (p * PF + l) * 64, _MM_HINT_T0);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512bh b = (__m512bh)_mm512_set1_epi32(static_cast<int>(x[p * kPanelRows + i]));
      acc[2 * i] = _mm512_dpbf16_ps(acc[2 * i], w0, b);
      acc[2 * i + 1] = _mm512_dpbf16_ps(acc[2 * i + 1], w1, b);
    }
  }
}

// The activation pairs of rows [m, m + kPanelRows) in the order PanelTile reads them:
// out[p * kPanelRows + i] = pair p of row m + i (0 past the last row).
GZ_TARGET_AVX512BF16 void PackRows(const MatmulSlice& s, int64_t m, uint32_t* out) {
  const uint32_t* x = reinterpret_cast<const uint32_t*>(s.x);
  const int64_t pairs = s.x_stride;
  for (int i = 0; i < kPanelRows; ++i) {
    const uint32_t* row = m + i < s.rows ? x + (m + i) * pairs : nullptr;
    for (int64_t p = 0; p < pairs; ++p) out[p * kPanelRows + i] = row ? row[p] : 0u;
  }
}

// Output columns [n, n + valid) of the tile's rows over the panel of inputs [k0, k0 + len): the
// first panel of a row starts from the bias, later ones add to what is there. MR: the rows the
// products run for (kPanelRows, or fewer for a tile of fewer rows).
template <int MR = kPanelRows, int PF = 0, bool F32 = false>
GZ_TARGET_AVX512BF16 void PanelRows(const MatmulSlice& s, const uint32_t* panel, const void* rows,
                                    int64_t k0, int64_t len, int64_t m, int64_t n, int valid,
                                    const char* pf = nullptr) {
  const int64_t n_out = s.w->rows;
  const int tile_rows = static_cast<int>(std::min<int64_t>(MR, s.rows - m));
  const __mmask16 lo = static_cast<__mmask16>(valid >= 16 ? 0xffff : (1u << valid) - 1);
  const __mmask16 hi = static_cast<__mmask16>(valid >= 32  ? 0xffff
                                              : valid > 16 ? (1u << (valid - 16)) - 1
                                                           : 0);
  __m512 acc[2 * MR];
  for (int i = 0; i < MR; ++i) {
    if (i < tile_rows && k0 > 0) {
      const float* out = s.out + (m + i) * n_out + n;
      acc[2 * i] = _mm512_maskz_loadu_ps(lo, out);
      acc[2 * i + 1] = _mm512_maskz_loadu_ps(hi, out + 16);
    } else if (s.bias) {
      acc[2 * i] = _mm512_maskz_loadu_ps(lo, s.bias + n);
      acc[2 * i + 1] = _mm512_maskz_loadu_ps(hi, s.bias + n + 16);
    } else {
      acc[2 * i] = acc[2 * i + 1] = _mm512_setzero_ps();
    }
  }
  // Where the tile's pairs from input k0 start (4-byte units: 1 per pair and row, 2 with F32).
  const void* x = static_cast<const uint32_t*>(rows) + k0 / 2 * kPanelRows * (F32 ? 2 : 1);
  PanelTile<MR, PF, F32>(panel, len / 2, x, acc, pf);
  for (int i = 0; i < tile_rows; ++i) {
    float* out = s.out + (m + i) * n_out + n;
    _mm512_mask_storeu_ps(out, lo, acc[2 * i]);
    _mm512_mask_storeu_ps(out + 16, hi, acc[2 * i + 1]);
  }
}

GZ_TARGET_AVX512BF16 void SlicePanels(const MatmulSlice& s, int64_t n0, int64_t n1) {
  const uint16_t* w = static_cast<const uint16_t*>(s.w->data);  // [n, cols]
  const int64_t cols = s.w->cols;
  const int64_t padded = 2 * s.x_stride;  // inputs per activation row, a multiple of 32
  const int64_t tiles = (s.rows + kPanelRows - 1) / kPanelRows;
  // The activations of every tile in PanelTile's order (this thread's copy).
  thread_local std::vector<uint32_t> packed;
  const size_t tile_pairs = static_cast<size_t>(s.x_stride) * kPanelRows;
  if (packed.size() < tiles * tile_pairs) packed.resize(tiles * tile_pairs);
  for (int64_t t = 0; t < tiles; ++t) PackRows(s, t * kPanelRows, packed.data() + t * tile_pairs);
  alignas(64) uint32_t panel[kPanelInputs / 2 * kPanelOut];
  for (int64_t n = n0; n < n1; n += kPanelOut) {
    const int valid = static_cast<int>(std::min<int64_t>(kPanelOut, n1 - n));
    for (int64_t k0 = 0; k0 < padded; k0 += kPanelInputs) {
      const int64_t len = std::min(kPanelInputs, padded - k0);
      PackPanel(w, s.w->rows, cols, n, n1, k0, len, panel);
      for (int64_t t = 0; t < tiles; ++t) {
        PanelRows(s, panel, packed.data() + t * tile_pairs, k0, len, t * kPanelRows, n, valid);
      }
    }
  }
}

// Weights packed once (PackBf16Weight): block b of 32 outputs is a ready panel over all inputs,
// read straight from memory (one contiguous stream a block). Any number of rows; the activations
// come in PanelTile's order already (PrepareTiles, or PrepareTilesF32 with F32).
template <bool F32>
GZ_TARGET_AVX512BF16 void SlicePacked(const MatmulSlice& s, int64_t n0, int64_t n1) {
  const auto* packed = static_cast<const uint32_t*>(s.w->data);
  // Inputs / 2, padded as PackBf16Weight pads them (x_stride: floats per row, 2 per pair with
  // F32, 1 with bf16 pairs).
  const int64_t pairs = F32 ? s.x_stride / 2 : s.x_stride;
  const int64_t tiles = (s.rows + kPanelRows - 1) / kPanelRows;
  const int64_t tile_units = pairs * kPanelRows * (F32 ? 2 : 1);  // 4-byte units a tile
  const int64_t panel_bytes = pairs * kPanelOut * 4;
  for (int64_t n = n0; n < n1; n += kPanelOut) {
    const int valid = static_cast<int>(std::min<int64_t>(kPanelOut, n1 - n));
    const uint32_t* panel = packed + n / kPanelOut * pairs * kPanelOut;
    // With two tiles or more, the first two prefetch half of the next panel each into L1 while
    // their products run (a line a pair): the first tile of a panel then finds it there instead
    // of waiting on memory. 16 rows: 1.9 -> 1.4 ms for tiny-chat's linears. One tile reads its
    // panel once, and the hardware's prefetcher keeps up with that stream alone.
    const char* next = reinterpret_cast<const char*>(panel) + panel_bytes;
    for (int64_t t = 0; t < tiles; ++t) {
      const void* x = reinterpret_cast<const uint32_t*>(s.x) + t * tile_units;
      const int64_t m = t * kPanelRows;
      const int64_t rows = std::min<int64_t>(kPanelRows, s.rows - m);
      if (t < 2 && tiles >= 2) {
        const char* pf = next + t * panel_bytes / 2;
        if (rows > 4) {
          PanelRows<kPanelRows, 1, F32>(s, panel, x, 0, 2 * pairs, m, n, valid, pf);
        } else {
          PanelRows<4, 1, F32>(s, panel, x, 0, 2 * pairs, m, n, valid, pf);
        }
        continue;
      }
      switch (rows) {
        case 1:
          PanelRows<1, 0, F32>(s, panel, x, 0, 2 * pairs, m, n, valid);
          break;
        case 2:
          PanelRows<2, 0, F32>(s, panel, x, 0, 2 * pairs, m, n, valid);
          break;
        case 3:
        case 4:
          PanelRows<4, 0, F32>(s, panel, x, 0, 2 * pairs, m, n, valid);
          break;
        default:
          PanelRows<kPanelRows, 0, F32>(s, panel, x, 0, 2 * pairs, m, n, valid);
          break;
      }
    }
  }
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

// 16 pairs (32 inputs from `from`) of row r of x as bf16 pairs, zero past cols and for rows
// past `rows`.
GZ_TARGET_AVX512BF16 inline __m512i RowPairs(const float* x, int64_t rows, int64_t cols, int64_t r,
                                             int64_t from) {
  if (r >= rows) return _mm512_setzero_si512();
  const float* src = x + r * cols + from;
  const int64_t n = std::min<int64_t>(32, cols - from);
  const __mmask16 lo = n >= 16 ? 0xffff : static_cast<__mmask16>((1u << n) - 1);
  const __mmask16 hi =
      n > 16 ? (n >= 32 ? 0xffff : static_cast<__mmask16>((1u << (n - 16)) - 1)) : 0;
  const __m512 v0 = _mm512_maskz_loadu_ps(lo, src);
  const __m512 v1 = _mm512_maskz_loadu_ps(hi, src + 16);
  return (__m512i)_mm512_cvtne2ps_pbh(v1, v0);
}

// Rows of x rounded to bf16 in PanelTile's order: tiles of kPanelRows rows, pair p of row i of a
// tile at [p * kPanelRows + i] (32-bit), rows past `rows` and inputs past cols zero. Each block
// of 16 pairs of a tile's 8 rows is transposed in registers (8 rows x 16 pairs -> 16 pairs x 8
// rows, three rounds of two-source permutes) and stored whole.
GZ_TARGET_AVX512BF16 void PrepareTiles(Format format, const float* x, int64_t rows, int64_t cols,
                                       float* dst) {
  (void)format;
  static_assert(kPanelRows == 8);
  const int64_t pairs = PaddedCols(cols, kBlock) / 2;
  auto* out = reinterpret_cast<uint32_t*>(dst);
  // Round 1: 32-bit lanes of rows a and b interleaved (pairs 0-7, then 8-15); round 2: 64-bit
  // groups of two such (rows 0-3 of pairs 0-3, 4-7); round 3: 128-bit groups (a pair's 8 rows).
  const __m512i i32_lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i i32_hi =
      _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  const __m512i i64_lo = _mm512_setr_epi64(0, 8, 1, 9, 2, 10, 3, 11);
  const __m512i i64_hi = _mm512_setr_epi64(4, 12, 5, 13, 6, 14, 7, 15);
  const __m512i i128_lo = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
  const __m512i i128_hi = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
  // The loops over registers are unrolled whole, so that r, a and b stay in registers (not
  // spilled to the stack): 2x faster.
  for (int64_t t = 0; t < (rows + kPanelRows - 1) / kPanelRows; ++t) {
    uint32_t* tile = out + t * pairs * kPanelRows;
    for (int64_t p = 0; p < pairs; p += 16) {
      __m512i r[8];
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) r[i] = RowPairs(x, rows, cols, t * kPanelRows + i, 2 * p);
      __m512i a[8];  // a[2k]: rows 2k, 2k+1 of pairs 0-7; a[2k+1]: of pairs 8-15
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        a[2 * k] = _mm512_permutex2var_epi32(r[2 * k], i32_lo, r[2 * k + 1]);
        a[2 * k + 1] = _mm512_permutex2var_epi32(r[2 * k], i32_hi, r[2 * k + 1]);
      }
      // b[h][q]: rows 4h..4h+3 of pairs 4q..4q+3 (a pair a 128-bit lane).
      __m512i b[2][4];
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
#pragma GCC unroll 2
        for (int half = 0; half < 2; ++half) {  // pairs 0-7, 8-15
          const __m512i lo = a[4 * h + half], hi = a[4 * h + 2 + half];
          b[h][2 * half] = _mm512_permutex2var_epi64(lo, i64_lo, hi);
          b[h][2 * half + 1] = _mm512_permutex2var_epi64(lo, i64_hi, hi);
        }
      }
#pragma GCC unroll 4
      for (int q = 0; q < 4; ++q) {
        // Pairs 4q, 4q + 1 and 4q + 2, 4q + 3, each as rows 0-3 then 4-7.
        _mm512_storeu_si512(tile + (p + 4 * q) * kPanelRows,
                            _mm512_permutex2var_epi64(b[0][q], i128_lo, b[1][q]));
        _mm512_storeu_si512(tile + (p + 4 * q + 2) * kPanelRows,
                            _mm512_permutex2var_epi64(b[0][q], i128_hi, b[1][q]));
      }
    }
  }
}

// Rows of x (float32) in PanelTile<F32>'s order: tiles of kPanelRows rows, inputs (2p, 2p + 1)
// of row i of a tile at [(p * kPanelRows + i) * 2], rows past `rows` and inputs past cols zero.
// Each block of 8 pairs of a tile's 8 rows is an 8 x 8 transpose of 64-bit lanes (a pair each)
// in registers: 32-bit copies only, so the same bits as copying each pair.
GZ_TARGET_AVX512BF16 void PrepareTilesF32(Format format, const float* x, int64_t rows, int64_t cols,
                                          float* dst) {
  (void)format;
  static_assert(kPanelRows == 8);
  const int64_t pairs = PaddedCols(cols, kBlock) / 2;  // a multiple of 16
  // Round 2: 128-bit groups of two rows' pairs (rows 0-3 of pairs e and e + 4).
  const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
  const __m512i hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
  for (int64_t t = 0; t < (rows + kPanelRows - 1) / kPanelRows; ++t) {
    float* tile = dst + t * pairs * kPanelRows * 2;
    for (int64_t p = 0; p < pairs; p += 8) {
      const int64_t n = std::clamp<int64_t>(cols - 2 * p, 0, 16);  // inputs of the block
      const __mmask16 m = static_cast<__mmask16>((1u << n) - 1);
      __m512d r[8];  // pairs p..p+7 of each row (e0..e7)
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) {
        const int64_t row = t * kPanelRows + i;
        r[i] = row < rows ? _mm512_castps_pd(_mm512_maskz_loadu_ps(m, x + row * cols + 2 * p))
                          : _mm512_setzero_pd();
      }
      // Round 1: rows 2k and 2k + 1 of the even pairs, then of the odd ones.
      __m512d a[8];
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        a[2 * k] = _mm512_unpacklo_pd(r[2 * k], r[2 * k + 1]);
        a[2 * k + 1] = _mm512_unpackhi_pd(r[2 * k], r[2 * k + 1]);
      }
      // u[h][j]: rows 4h..4h+3 of pairs (e0, e4), (e2, e6), (e1, e5), (e3, e7) for j = 0..3.
      __m512d u[2][4];
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        u[h][0] = _mm512_permutex2var_pd(a[4 * h], lo, a[4 * h + 2]);
        u[h][1] = _mm512_permutex2var_pd(a[4 * h], hi, a[4 * h + 2]);
        u[h][2] = _mm512_permutex2var_pd(a[4 * h + 1], lo, a[4 * h + 3]);
        u[h][3] = _mm512_permutex2var_pd(a[4 * h + 1], hi, a[4 * h + 3]);
      }
      // Round 3: a pair's 8 rows, the low halves of u[0] and u[1] (pair e) or the high (e + 4).
      constexpr int kPair[4] = {0, 2, 1, 3};
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        float* out = tile + (p + kPair[j]) * kPanelRows * 2;
        _mm512_storeu_pd(reinterpret_cast<double*>(out),
                         _mm512_shuffle_f64x2(u[0][j], u[1][j], 0x44));
        _mm512_storeu_pd(reinterpret_cast<double*>(out + 4 * kPanelRows * 2),
                         _mm512_shuffle_f64x2(u[0][j], u[1][j], 0xee));
      }
    }
  }
}

// Kernels of bf16 weights with bf16 activations, in slices of whole panels.
MatmulKernels Bf16Kernels(MatmulSliceFn slice,
                          void (*prepare)(Format, const float*, int64_t, int64_t, float*),
                          int prepare_rows) {
  MatmulKernels k;
  k.block = kBlock;
  k.tile_rows = kPanelOut;
  k.bf16_activations = true;
  k.prepare = prepare;
  k.prepare_rows = prepare_rows;
  k.slice[static_cast<int>(Format::kBf16)] = slice;
  return k;
}

}  // namespace

const MatmulKernels& Avx512Bf16MatmulKernels() {
  static const MatmulKernels kernels = Bf16Kernels(&SlicePanels, &Prepare, 1);
  return kernels;
}

const MatmulKernels& Avx512Bf16PackedMatmulKernels() {
  static const MatmulKernels kernels = Bf16Kernels(&SlicePacked<false>, &PrepareTiles, kPanelRows);
  return kernels;
}

const MatmulKernels& Avx512PackedMatmulKernels() {
  static const MatmulKernels kernels = [] {
    MatmulKernels k = Bf16Kernels(&SlicePacked<true>, &PrepareTilesF32, kPanelRows);
    k.bf16_activations = false;  // float32 activations, two floats a pair
    return k;
  }();
  return kernels;
}

GZ_TARGET_AVX512BF16 void Avx512Bf16Tiles(const MatmulSlice& s, std::vector<uint32_t>* tiles) {
  const int64_t count = (s.rows + kPanelRows - 1) / kPanelRows;
  const size_t tile_pairs = static_cast<size_t>(s.x_stride) * kPanelRows;
  if (tiles->size() < count * tile_pairs) tiles->resize(count * tile_pairs);
  for (int64_t t = 0; t < count; ++t) PackRows(s, t * kPanelRows, tiles->data() + t * tile_pairs);
}

GZ_TARGET_AVX512BF16 void Avx512Bf16RowsPanel(const MatmulSlice& s, const uint32_t* tiles,
                                              const uint16_t* w32, int64_t k0, int64_t len,
                                              int64_t n, int valid_n) {
  alignas(64) uint32_t panel[kPanelInputs / 2 * kPanelOut];
  PackPanel(w32, kPanelOut, len, 0, valid_n, 0, len, panel);
  const int64_t count = (s.rows + kPanelRows - 1) / kPanelRows;
  const int64_t tile_pairs = s.x_stride * kPanelRows;
  for (int64_t t = 0; t < count; ++t) {
    PanelRows(s, panel, tiles + t * tile_pairs, k0, len, t * kPanelRows, n, valid_n);
  }
}

int64_t PackedBf16Bytes(int64_t rows, int64_t cols) {
  return (rows + kPanelOut - 1) / kPanelOut * kPanelOut * PaddedCols(cols, kBlock) * 2;
}

void PackBf16Weight(const uint16_t* w, int64_t rows, int64_t cols, void* out) {
  const int64_t pairs = PaddedCols(cols, kBlock) / 2;
  auto* dst = static_cast<uint32_t*>(out);
  for (int64_t b = 0; b < (rows + kPanelOut - 1) / kPanelOut; ++b) {
    for (int64_t p = 0; p < pairs; ++p) {
      for (int o = 0; o < kPanelOut; ++o) {
        const int64_t r = b * kPanelOut + o;
        uint32_t v = 0;
        if (r < rows) {
          const int64_t k = 2 * p;
          const uint32_t lo = k < cols ? w[r * cols + k] : 0;
          const uint32_t hi = k + 1 < cols ? w[r * cols + k + 1] : 0;
          v = lo | hi << 16;
        }
        dst[(b * pairs + p) * kPanelOut + o] = v;
      }
    }
  }
}

}  // namespace gizllm
