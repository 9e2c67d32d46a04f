// Short vector routines the CPU ops are built from, once per instruction set (internal to
// backend/cpu). Each policy struct has the same static functions; an op is a template over the
// policy, and every function here handles a whole row so that a call amortizes over many
// elements.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_isa.h"
#include "core/dtype.h"

namespace gizllm::vec {

// Scores per head in the *Heads functions: up to kScoreRows positions (several KV pages, whose
// softmax is updated once).
inline constexpr int kScoreRows = 128;

// The largest finite float16: KV values past it are stored as it (saturated), not as infinity.
inline constexpr float kHalfMax = 65504.0f;

// The *Heads functions over float16 KV pages for a policy without fused conversions: the page's
// `count` rows of n values (`stride` apart) widened into a per-thread buffer first.
template <class V>
const float* WidenPage(const uint16_t* x, int64_t stride, int count, int64_t n) {
  thread_local std::vector<float> buffer;
  if (buffer.size() < static_cast<size_t>(count * n)) buffer.resize(count * n);
  for (int t = 0; t < count; ++t) V::HalvesToFloats(x + t * stride, n, buffer.data() + t * n);
  return buffer.data();
}

// The same over 8-bit pages (the codes as floats; the caller applies the scales).
template <class V>
const float* WidenPage(const int8_t* x, int64_t stride, int count, int64_t n) {
  thread_local std::vector<float> buffer;
  if (buffer.size() < static_cast<size_t>(count * n)) buffer.resize(count * n);
  for (int t = 0; t < count; ++t) {
    for (int64_t i = 0; i < n; ++i) buffer[t * n + i] = static_cast<float>(x[t * stride + i]);
  }
  return buffer.data();
}

// Fetches `bytes` from p into L1, a line at a time. (GCC deletes a loop whose body is only
// __builtin_prefetch, hence the asm.)
inline void PrefetchRow(const void* p, int64_t bytes) {
  for (int64_t b = 0; b < bytes; b += 64) {
#if defined(__x86_64__)
    asm volatile("prefetcht0 %0" : : "m"(static_cast<const char*>(p)[b]));
#else
    __builtin_prefetch(static_cast<const char*>(p) + b, 0, 3);
#endif
  }
}

// ScaleAddWeightedPages by one ScaleAddWeightedHeads call per page (policies without a fused
// version): page j's scores follow page j - 1's in p, and c applies before the first page only.
template <class V, typename KV>
void ScaleAddWeightedEachPage(float* acc, int heads, const float* c, const float* p,
                              const KV* const* v, const int* count, int pages, int64_t stride,
                              int64_t n) {
  static constexpr float kOnes[4] = {1.0f, 1.0f, 1.0f, 1.0f};
  for (int j = 0, offset = 0; j < pages; offset += count[j], ++j) {
    V::ScaleAddWeightedHeads(acc, heads, j == 0 ? c : kOnes, p + offset, v[j], stride, count[j], n);
  }
}

struct Scalar {
  // dst = src widened from float16.
  static void HalvesToFloats(const uint16_t* src, int64_t n, float* dst) {
    for (int64_t i = 0; i < n; ++i) dst[i] = F16ToF32(src[i]);
  }
  // dst = src rounded to the nearest float16, saturated at +-kHalfMax (a NaN stays NaN).
  static void FloatsToHalves(const float* src, int64_t n, uint16_t* dst) {
    for (int64_t i = 0; i < n; ++i) {
      const float x = src[i];
      dst[i] = F32ToF16(x > kHalfMax ? kHalfMax : x < -kHalfMax ? -kHalfMax : x);
    }
  }
  static float Dot(const float* a, const float* b, int64_t n) {
    float acc[4] = {0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
      for (int u = 0; u < 4; ++u) acc[u] += a[i + u] * b[i + u];
    }
    for (; i < n; ++i) acc[0] += a[i] * b[i];
    return (acc[0] + acc[1]) + (acc[2] + acc[3]);
  }
  static float SumSquares(const float* a, int64_t n) { return Dot(a, a, n); }
  // s[t] = scale * dot(q, k[t * stride + 0:n]) for t < count.
  static void Scores(const float* q, const float* k, int64_t stride, int count, int64_t n,
                     float scale, float* s) {
    for (int t = 0; t < count; ++t) s[t] = Dot(q, k + t * stride, n) * scale;
  }
  // Rotate-half rotary embedding: (x[i], x[i + half]) by the angle of cos[i], sin[i].
  static void Rotate(float* x, const float* cos, const float* sin, int64_t half) {
    for (int64_t i = 0; i < half; ++i) {
      const float a = x[i], b = x[i + half];
      x[i] = a * cos[i] - b * sin[i];
      x[i + half] = b * cos[i] + a * sin[i];
    }
  }
  // out = x * scale * (w + offset)
  static void ScaleMul(float* out, const float* x, float scale, const float* w, float offset,
                       int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale * (w[i] + offset);
  }
  // out = x + y
  static void Sum(float* out, const float* x, const float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] + y[i];
  }
  // x = exp(x - shift); returns the sum of the results.
  static float ExpShifted(float* x, int64_t n, float shift) {
    float sum = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
      x[i] = std::exp(x[i] - shift);
      sum += x[i];
    }
    return sum;
  }
  static void SwiGlu(float* out, const float* gate, const float* up, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
  }
  // acc = acc * c + sum_t p[t] * v[t * stride + 0:n], count terms.
  static void ScaleAddWeighted(float* acc, float c, const float* p, const float* v, int64_t stride,
                               int count, int64_t n) {
    for (int64_t i = 0; i < n; ++i) acc[i] *= c;
    for (int t = 0; t < count; ++t) {
      for (int64_t i = 0; i < n; ++i) acc[i] += p[t] * v[t * stride + i];
    }
  }
  // For `heads` (<= 4) query heads q [heads, n] at once: s[h * kScoreRows + t] as in Scores.
  // count <= 16 (a page), and each row of s has room for 16 scores: a version may write past
  // count there.
  // next: a page read after this one, or null: a version may fetch the first `fetch` bytes of
  // each of its rows meanwhile.
  static void ScoresHeads(const float* q, int heads, const float* k, int64_t stride, int count,
                          int64_t n, float scale, float* s, const void* next = nullptr,
                          int64_t fetch = 0) {
    (void)next, (void)fetch;
    for (int h = 0; h < heads; ++h)
      Scores(q + h * n, k, stride, count, n, scale, s + h * kScoreRows);
  }
  // For `heads` (<= 4) heads: acc [heads, n] as in ScaleAddWeighted, with c[h] and
  // p[h * kScoreRows + t].
  static void ScaleAddWeightedHeads(float* acc, int heads, const float* c, const float* p,
                                    const float* v, int64_t stride, int count, int64_t n) {
    for (int h = 0; h < heads; ++h) {
      ScaleAddWeighted(acc + h * n, c[h], p + h * kScoreRows, v, stride, count, n);
    }
  }
  // The same over float16 pages, or 8-bit pages (the codes' products: the caller applies the
  // scales), widened first.
  template <typename KV>
  static void ScoresHeads(const float* q, int heads, const KV* k, int64_t stride, int count,
                          int64_t n, float scale, float* s, const void* next = nullptr,
                          int64_t fetch = 0) {
    (void)next, (void)fetch;
    ScoresHeads(q, heads, WidenPage<Scalar>(k, stride, count, n), n, count, n, scale, s);
  }
  template <typename KV>
  static void ScaleAddWeightedHeads(float* acc, int heads, const float* c, const float* p,
                                    const KV* v, int64_t stride, int count, int64_t n) {
    ScaleAddWeightedHeads(acc, heads, c, p, WidenPage<Scalar>(v, stride, count, n), n, count, n);
  }
  // x [n] as 8-bit codes q[i] = round(x[i] * 127 / max|x|) (nearest, ties to even); returns the
  // scale max|x| / 127 (0 for a zero vector). With a NaN or an infinity in x: codes 0, scale NaN
  // (attention over it then gives NaN, as over float32 pages).
  static float QuantizeRow(const float* x, int64_t n, int8_t* q) {
    float top = 0.0f;
    bool finite = true;
    for (int64_t i = 0; i < n; ++i) {
      finite = finite && std::isfinite(x[i]);
      top = std::max(top, std::fabs(x[i]));
    }
    if (!finite) {
      std::memset(q, 0, n);
      return std::numeric_limits<float>::quiet_NaN();
    }
    const float inv = top > 0.0f ? 127.0f / top : 0.0f;
    for (int64_t i = 0; i < n; ++i) q[i] = static_cast<int8_t>(std::nearbyint(x[i] * inv));
    return top / 127.0f;
  }
  // The largest of x[0:n], n > 0.
  static float Max(const float* x, int64_t n) {
    float m = x[0];
    for (int64_t i = 1; i < n; ++i) m = std::max(m, x[i]);
    return m;
  }
  // ScaleAddWeightedHeads over `pages` pages at once: page j's count[j] values at v[j], its
  // scores after those of pages before it in each row of p; c applies once, before them.
  // fetch: a version may fetch the first `fetch` bytes (0: none) of each page's rows while the
  // page before it is read, and those of `after` (a page read next, or null) with the last.
  template <typename KV>
  static void ScaleAddWeightedPages(float* acc, int heads, const float* c, const float* p,
                                    const KV* const* v, const int* count, int pages, int64_t stride,
                                    int64_t n, int64_t fetch = 0, const void* after = nullptr) {
    (void)fetch, (void)after;
    ScaleAddWeightedEachPage<Scalar>(acc, heads, c, p, v, count, pages, stride, n);
  }
};

#if defined(__x86_64__)

struct Avx512 {
  GZ_TARGET_AVX512 static inline __mmask16 Tail(int64_t n) {
    return static_cast<__mmask16>((1u << n) - 1);
  }
  GZ_TARGET_AVX512 static void HalvesToFloats(const uint16_t* src, int64_t n, float* dst) {
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 m = Tail(std::min<int64_t>(16, n - i));
      _mm512_mask_storeu_ps(dst + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, src + i)));
    }
  }
  GZ_TARGET_AVX512 static void FloatsToHalves(const float* src, int64_t n, uint16_t* dst) {
    const __m512 hi = _mm512_set1_ps(kHalfMax), lo = _mm512_set1_ps(-kHalfMax);
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 m = Tail(std::min<int64_t>(16, n - i));
      // min/max return their second operand where either is NaN: a NaN stays NaN.
      const __m512 x = _mm512_max_ps(lo, _mm512_min_ps(hi, _mm512_maskz_loadu_ps(m, src + i)));
      _mm256_mask_storeu_epi16(dst + i, m,
                               _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
  }
  // exp(x) for x in about [-87, 88] (clamped), within 2 ulp: Cephes' polynomial.
  GZ_TARGET_AVX512 static inline __m512 Exp(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.7f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500E-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507E-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073E-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894E-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459E-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201E-1f));
    __m512 y = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(y, n);
  }
  GZ_TARGET_AVX512 static inline float Dot(const float* a, const float* b, int64_t n) {
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
      acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
      acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), acc1);
    }
    for (; i < n; i += 16) {
      __mmask16 m = Tail(std::min<int64_t>(16, n - i));
      acc0 =
          _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
  }
  GZ_TARGET_AVX512 static float SumSquares(const float* a, int64_t n) { return Dot(a, a, n); }
  // out = x + y, returning SumSquares(out, n) with Dot's order of additions, in one pass.
  GZ_TARGET_AVX512 static float SumThenSquares(float* out, const float* x, const float* y,
                                               int64_t n) {
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
      const __m512 a = _mm512_add_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i));
      const __m512 b = _mm512_add_ps(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(y + i + 16));
      _mm512_storeu_ps(out + i, a);
      _mm512_storeu_ps(out + i + 16, b);
      acc0 = _mm512_fmadd_ps(a, a, acc0);
      acc1 = _mm512_fmadd_ps(b, b, acc1);
    }
    for (; i < n; i += 16) {
      const __mmask16 m = Tail(std::min<int64_t>(16, n - i));
      const __m512 a =
          _mm512_add_ps(_mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i));
      _mm512_mask_storeu_ps(out + i, m, a);
      acc0 = _mm512_fmadd_ps(a, a, acc0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
  }
  // A head of 64 values in registers: x = rotate(x * scale * norm) with scale = 1 / sqrt(mean of
  // squares + eps), as SumSquares, ScaleMul (offset 0) and Rotate (half 32) compute it.
  GZ_TARGET_AVX512 static void NormRotate64(float* x, const float* norm, float eps,
                                            const float* cos, const float* sin) {
    const __m512 zero = _mm512_setzero_ps();
    __m512 v[4];
    for (int j = 0; j < 4; ++j) v[j] = _mm512_loadu_ps(x + 16 * j);
    const __m512 acc0 = _mm512_fmadd_ps(v[2], v[2], _mm512_fmadd_ps(v[0], v[0], zero));
    const __m512 acc1 = _mm512_fmadd_ps(v[3], v[3], _mm512_fmadd_ps(v[1], v[1], zero));
    const float ss = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
    const __m512 scale = _mm512_set1_ps(1.0f / std::sqrt(ss / 64.0f + eps));
    for (int j = 0; j < 4; ++j) {
      v[j] = _mm512_mul_ps(_mm512_mul_ps(v[j], scale),
                           _mm512_add_ps(_mm512_loadu_ps(norm + 16 * j), zero));
    }
    for (int j = 0; j < 2; ++j) {
      const __m512 c = _mm512_loadu_ps(cos + 16 * j), s = _mm512_loadu_ps(sin + 16 * j);
      _mm512_storeu_ps(x + 16 * j,
                       _mm512_sub_ps(_mm512_mul_ps(v[j], c), _mm512_mul_ps(v[j + 2], s)));
      _mm512_storeu_ps(x + 32 + 16 * j,
                       _mm512_add_ps(_mm512_mul_ps(v[j + 2], c), _mm512_mul_ps(v[j], s)));
    }
  }
  // The four sums of a0..a3, in order.
  GZ_TARGET_AVX512 static inline __m128 Reduce4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
    __m512 t0 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
    __m512 t1 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
    __m512d d0 = _mm512_castps_pd(t0), d1 = _mm512_castps_pd(t1);
    __m512 u = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(d0, d1)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(d0, d1)));
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(u), _mm512_extractf32x8_ps(u, 1));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  }
  // s[t] = scale * dot(q, k[t * stride + 0:n]) for t < count; four positions at a time, their
  // sums reduced together.
  GZ_TARGET_AVX512 static void Scores(const float* q, const float* k, int64_t stride, int count,
                                      int64_t n, float scale, float* s) {
    const __m128 sv = _mm_set1_ps(scale);
    for (int t = 0; t < count; t += 4) {
      // Past the last position, repeat it (its score is dropped).
      const float* k0 = k + t * stride;
      const float* k1 = k + std::min(t + 1, count - 1) * stride;
      const float* k2 = k + std::min(t + 2, count - 1) * stride;
      const float* k3 = k + std::min(t + 3, count - 1) * stride;
      __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = Tail(std::min<int64_t>(16, n - i));
        __m512 qv = _mm512_maskz_loadu_ps(m, q + i);
        a0 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, k0 + i), a0);
        a1 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, k1 + i), a1);
        a2 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, k2 + i), a2);
        a3 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, k3 + i), a3);
      }
      alignas(16) float r[4];
      _mm_store_ps(r, _mm_mul_ps(Reduce4(a0, a1, a2, a3), sv));
      for (int u = 0; u < 4 && t + u < count; ++u) s[t + u] = r[u];
    }
  }
  // Rotate, ScaleMul and Sum run whole vectors unmasked and the tail, if any, masked.
  GZ_TARGET_AVX512 static void Rotate(float* x, const float* cos, const float* sin, int64_t half) {
    auto piece = [&](int64_t i, __mmask16 m) GZ_TARGET_AVX512 {
      const __m512 a = _mm512_maskz_loadu_ps(m, x + i);
      const __m512 b = _mm512_maskz_loadu_ps(m, x + half + i);
      const __m512 c = _mm512_maskz_loadu_ps(m, cos + i);
      const __m512 s = _mm512_maskz_loadu_ps(m, sin + i);
      _mm512_mask_storeu_ps(x + i, m, _mm512_sub_ps(_mm512_mul_ps(a, c), _mm512_mul_ps(b, s)));
      _mm512_mask_storeu_ps(x + half + i, m,
                            _mm512_add_ps(_mm512_mul_ps(b, c), _mm512_mul_ps(a, s)));
    };
    int64_t i = 0;
    for (; i + 16 <= half; i += 16) piece(i, 0xffff);
    if (i < half) piece(i, Tail(half - i));
  }
  GZ_TARGET_AVX512 static void ScaleMul(float* out, const float* x, float scale, const float* w,
                                        float offset, int64_t n) {
    const __m512 s = _mm512_set1_ps(scale), o = _mm512_set1_ps(offset);
    auto piece = [&](int64_t i, __mmask16 m) GZ_TARGET_AVX512 {
      __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), s);
      _mm512_mask_storeu_ps(out + i, m,
                            _mm512_mul_ps(v, _mm512_add_ps(_mm512_maskz_loadu_ps(m, w + i), o)));
    };
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) piece(i, 0xffff);
    if (i < n) piece(i, Tail(n - i));
  }
  GZ_TARGET_AVX512 static void Sum(float* out, const float* x, const float* y, int64_t n) {
    auto piece = [&](int64_t i, __mmask16 m) GZ_TARGET_AVX512 {
      _mm512_mask_storeu_ps(
          out + i, m,
          _mm512_add_ps(_mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
    };
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) piece(i, 0xffff);
    if (i < n) piece(i, Tail(n - i));
  }
  GZ_TARGET_AVX512 static float ExpShifted(float* x, int64_t n, float shift) {
    const __m512 s = _mm512_set1_ps(shift);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
      __mmask16 m = Tail(std::min<int64_t>(16, n - i));
      __m512 e = Exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), s));
      _mm512_mask_storeu_ps(x + i, m, e);
      sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(m, e));
    }
    return _mm512_reduce_add_ps(sum);
  }
  GZ_TARGET_AVX512 static void SwiGlu(float* out, const float* gate, const float* up, int64_t n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
      __mmask16 m = Tail(std::min<int64_t>(16, n - i));
      __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
      __m512 e = Exp(_mm512_sub_ps(_mm512_setzero_ps(), g));
      __m512 silu = _mm512_div_ps(g, _mm512_add_ps(one, e));
      _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(m, up + i)));
    }
  }
  GZ_TARGET_AVX512 static void ScaleAddWeighted(float* acc, float c, const float* p, const float* v,
                                                int64_t stride, int count, int64_t n) {
    const __m512 cv = _mm512_set1_ps(c);
    for (int64_t i = 0; i < n; i += 16) {
      __mmask16 m = Tail(std::min<int64_t>(16, n - i));
      __m512 a = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, acc + i), cv);
      for (int t = 0; t < count; ++t) {
        a = _mm512_fmadd_ps(_mm512_set1_ps(p[t]), _mm512_maskz_loadu_ps(m, v + t * stride + i), a);
      }
      _mm512_mask_storeu_ps(acc + i, m, a);
    }
  }
  // For `heads` (<= 4) query heads q [heads, n] at once: s[h * kScoreRows + t] as in Scores.
  // Each key is loaded once for all heads.
  // Keys and values as float32, from float32 or float16 pages (converted as they are loaded).
  GZ_TARGET_AVX512 static inline __m512 LoadKv(const float* p, __mmask16 m) {
    return _mm512_maskz_loadu_ps(m, p);
  }
  GZ_TARGET_AVX512 static inline __m512 LoadKv(const uint16_t* p, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
  }
  // 8-bit pages: the codes as floats (the caller applies the scales).
  GZ_TARGET_AVX512 static inline __m512 LoadKv(const int8_t* p, __mmask16 m) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, p)));
  }
  // As Scalar::QuantizeRow (the same codes and scale: one division, products rounded to nearest
  // even by the conversion).
  GZ_TARGET_AVX512 static float QuantizeRow(const float* x, int64_t n, int8_t* q) {
    const __m512 inf = _mm512_set1_ps(std::numeric_limits<float>::infinity());
    __m512 top = _mm512_setzero_ps();
    __mmask16 bad = 0;
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 m = Tail(std::min<int64_t>(16, n - i));
      const __m512 a = _mm512_abs_ps(_mm512_maskz_loadu_ps(m, x + i));
      bad |= _mm512_mask_cmp_ps_mask(m, a, inf, _CMP_NLT_UQ);  // infinite or NaN
      top = _mm512_max_ps(top, a);
    }
    if (bad) {
      std::memset(q, 0, n);
      return std::numeric_limits<float>::quiet_NaN();
    }
    const float t = _mm512_reduce_max_ps(top);
    const __m512 inv = _mm512_set1_ps(t > 0.0f ? 127.0f / t : 0.0f);
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 m = Tail(std::min<int64_t>(16, n - i));
      const __m512i c = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), inv));
      _mm_mask_storeu_epi8(q + i, m, _mm512_cvtsepi32_epi8(c));
    }
    return t / 127.0f;
  }
  // next, fetch: as in Scalar; next's rows t..t+3 are fetched with this page's rows t..t+3.
  // N: n as a compile-time constant (head sizes 64 and 128: the masks fold away and the loop over
  // a key's pieces unrolls), or 0 for any n.
  template <int H, int N, typename KV>
  GZ_TARGET_AVX512 static inline void ScoresHeadsN(const float* q, const KV* k, int64_t stride,
                                                   int count, int64_t runtime_n, float scale,
                                                   float* s, const KV* next, int64_t fetch) {
    const int64_t n = N > 0 ? N : runtime_n;
    const __m128 sv = _mm_set1_ps(scale);
    for (int t = 0; t < count; t += 4) {
      if (next) {
        for (int u = 0; u < 4; ++u) PrefetchRow(next + (t + u) * stride, fetch);
      }
      const KV* kt[4];
      for (int u = 0; u < 4; ++u) kt[u] = k + std::min(t + u, count - 1) * stride;
      __m512 acc[H][4];
#pragma GCC unroll 4
      for (int h = 0; h < H; ++h) {
#pragma GCC unroll 4
        for (int u = 0; u < 4; ++u) acc[h][u] = _mm512_setzero_ps();
      }
#pragma GCC unroll 8
      for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = Tail(std::min<int64_t>(16, n - i));
        __m512 kv[4];
#pragma GCC unroll 4
        for (int u = 0; u < 4; ++u) kv[u] = LoadKv(kt[u] + i, m);
#pragma GCC unroll 4
        for (int h = 0; h < H; ++h) {
          const __m512 qv = _mm512_maskz_loadu_ps(m, q + h * n + i);
#pragma GCC unroll 4
          for (int u = 0; u < 4; ++u) acc[h][u] = _mm512_fmadd_ps(qv, kv[u], acc[h][u]);
        }
      }
#pragma GCC unroll 4
      for (int h = 0; h < H; ++h) {
        // All four scores at once, also past count (up to the next multiple of 4, within the
        // page's 16 and so within the row): the scores of a page after this one overwrite them.
        _mm_storeu_ps(s + h * kScoreRows + t,
                      _mm_mul_ps(Reduce4(acc[h][0], acc[h][1], acc[h][2], acc[h][3]), sv));
      }
    }
  }
  template <typename KV>
  GZ_TARGET_AVX512 static void ScoresHeads(const float* q, int heads, const KV* k, int64_t stride,
                                           int count, int64_t n, float scale, float* s,
                                           const void* next = nullptr, int64_t fetch = 0) {
    const KV* nk = static_cast<const KV*>(next);
    if (n == 64) return ScoresHeadsSized<64>(q, heads, k, stride, count, n, scale, s, nk, fetch);
    if (n == 128) return ScoresHeadsSized<128>(q, heads, k, stride, count, n, scale, s, nk, fetch);
    return ScoresHeadsSized<0>(q, heads, k, stride, count, n, scale, s, nk, fetch);
  }
  template <int N, typename KV>
  GZ_TARGET_AVX512 static void ScoresHeadsSized(const float* q, int heads, const KV* k,
                                                int64_t stride, int count, int64_t n, float scale,
                                                float* s, const KV* nk, int64_t fetch) {
    switch (heads) {
      case 1:
        return ScoresHeadsN<1, N>(q, k, stride, count, n, scale, s, nk, fetch);
      case 2:
        return ScoresHeadsN<2, N>(q, k, stride, count, n, scale, s, nk, fetch);
      case 3:
        return ScoresHeadsN<3, N>(q, k, stride, count, n, scale, s, nk, fetch);
      default:
        return ScoresHeadsN<4, N>(q, k, stride, count, n, scale, s, nk, fetch);
    }
  }
  // For `heads` (<= 4) heads: acc [heads, n] as in ScaleAddWeighted, with c[h] and
  // p[h * kScoreRows + t]; each value is loaded once for all heads.
  template <int H, typename KV>
  GZ_TARGET_AVX512 static inline void ScaleAddWeightedHeadsN(float* acc, const float* c,
                                                             const float* p, const KV* v,
                                                             int64_t stride, int count, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 m = Tail(std::min<int64_t>(16, n - i));
      __m512 a[H];
#pragma GCC unroll 4
      for (int h = 0; h < H; ++h) {
        a[h] = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, acc + h * n + i), _mm512_set1_ps(c[h]));
      }
      for (int t = 0; t < count; ++t) {
        const __m512 vv = LoadKv(v + t * stride + i, m);
#pragma GCC unroll 4
        for (int h = 0; h < H; ++h) {
          a[h] = _mm512_fmadd_ps(_mm512_set1_ps(p[h * kScoreRows + t]), vv, a[h]);
        }
      }
#pragma GCC unroll 4
      for (int h = 0; h < H; ++h) _mm512_mask_storeu_ps(acc + h * n + i, m, a[h]);
    }
  }
  template <typename KV>
  GZ_TARGET_AVX512 static void ScaleAddWeightedHeads(float* acc, int heads, const float* c,
                                                     const float* p, const KV* v, int64_t stride,
                                                     int count, int64_t n) {
    switch (heads) {
      case 1:
        return ScaleAddWeightedHeadsN<1>(acc, c, p, v, stride, count, n);
      case 2:
        return ScaleAddWeightedHeadsN<2>(acc, c, p, v, stride, count, n);
      case 3:
        return ScaleAddWeightedHeadsN<3>(acc, c, p, v, stride, count, n);
      default:
        return ScaleAddWeightedHeadsN<4>(acc, c, p, v, stride, count, n);
    }
  }
  GZ_TARGET_AVX512 static float Max(const float* x, int64_t n) {
    const __m512 low = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    __m512 m = low;
    for (int64_t i = 0; i < n; i += 16) {
      m = _mm512_max_ps(m, _mm512_mask_loadu_ps(low, Tail(std::min<int64_t>(16, n - i)), x + i));
    }
    return _mm512_reduce_max_ps(m);
  }
  // As ScaleAddWeightedHeadsN over several pages: the accumulators of 64 values of every head
  // stay in registers across all the pages' positions (one load and store of acc per call).
  // With fetch, row t of the page after page j (of `after` after the last) is fetched with
  // page j's row t (its first `fetch` bytes).
  template <int H, typename KV>
  GZ_TARGET_AVX512 static inline void ScaleAddWeightedPagesN(float* acc, const float* c,
                                                             const float* p, const KV* const* v,
                                                             const int* count, int pages,
                                                             int64_t stride, int64_t n,
                                                             int64_t fetch, const KV* after) {
    for (int64_t i = 0; i < n; i += 64) {
      __mmask16 m[4];
      for (int u = 0; u < 4; ++u) m[u] = Tail(std::clamp<int64_t>(n - i - 16 * u, 0, 16));
      __m512 a[H][4];
#pragma GCC unroll 4
      for (int h = 0; h < H; ++h) {
        const __m512 ch = _mm512_set1_ps(c[h]);
#pragma GCC unroll 4
        for (int u = 0; u < 4; ++u) {
          a[h][u] = _mm512_mul_ps(_mm512_maskz_loadu_ps(m[u], acc + h * n + i + 16 * u), ch);
        }
      }
      for (int j = 0, offset = 0; j < pages; offset += count[j], ++j) {
        const KV* vj = v[j] + i;
        const float* pj = p + offset;
        const KV* next = !fetch || i > 0 ? nullptr : j + 1 < pages ? v[j + 1] : after;
        for (int t = 0; t < count[j]; ++t) {
          if (next) PrefetchRow(next + t * stride, fetch);
          __m512 vv[4];
#pragma GCC unroll 4
          for (int u = 0; u < 4; ++u) vv[u] = LoadKv(vj + t * stride + 16 * u, m[u]);
#pragma GCC unroll 4
          for (int h = 0; h < H; ++h) {
            const __m512 w = _mm512_set1_ps(pj[h * kScoreRows + t]);
#pragma GCC unroll 4
            for (int u = 0; u < 4; ++u) a[h][u] = _mm512_fmadd_ps(w, vv[u], a[h][u]);
          }
        }
      }
#pragma GCC unroll 4
      for (int h = 0; h < H; ++h) {
#pragma GCC unroll 4
        for (int u = 0; u < 4; ++u) _mm512_mask_storeu_ps(acc + h * n + i + 16 * u, m[u], a[h][u]);
      }
    }
  }
  template <typename KV>
  GZ_TARGET_AVX512 static void ScaleAddWeightedPages(float* acc, int heads, const float* c,
                                                     const float* p, const KV* const* v,
                                                     const int* count, int pages, int64_t stride,
                                                     int64_t n, int64_t fetch = 0,
                                                     const void* after = nullptr) {
    const KV* a = static_cast<const KV*>(after);
    switch (heads) {
      case 1:
        return ScaleAddWeightedPagesN<1>(acc, c, p, v, count, pages, stride, n, fetch, a);
      case 2:
        return ScaleAddWeightedPagesN<2>(acc, c, p, v, count, pages, stride, n, fetch, a);
      case 3:
        return ScaleAddWeightedPagesN<3>(acc, c, p, v, count, pages, stride, n, fetch, a);
      default:
        return ScaleAddWeightedPagesN<4>(acc, c, p, v, count, pages, stride, n, fetch, a);
    }
  }
};

struct Avx2 {
  GZ_TARGET_AVX2 static inline __m256i Tail(int64_t n) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), idx);
  }
  GZ_TARGET_AVX2 static void HalvesToFloats(const uint16_t* src, int64_t n, float* dst) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      _mm256_storeu_ps(dst + i,
                       _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
    }
    Scalar::HalvesToFloats(src + i, n - i, dst + i);
  }
  GZ_TARGET_AVX2 static void FloatsToHalves(const float* src, int64_t n, uint16_t* dst) {
    const __m256 hi = _mm256_set1_ps(kHalfMax), lo = _mm256_set1_ps(-kHalfMax);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      // min/max return their second operand where either is NaN: a NaN stays NaN.
      const __m256 x = _mm256_max_ps(lo, _mm256_min_ps(hi, _mm256_loadu_ps(src + i)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                       _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    Scalar::FloatsToHalves(src + i, n - i, dst + i);
  }
  GZ_TARGET_AVX2 static inline __m256 Load(const float* p, __m256i m) {
    return _mm256_maskload_ps(p, m);
  }
  GZ_TARGET_AVX2 static inline float Reduce(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  GZ_TARGET_AVX2 static inline __m256 Exp(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.7f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500E-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507E-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073E-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894E-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459E-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201E-1f));
    __m256 y = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    // 2^n from the exponent bits; n is in [-126, 128] after the clamp.
    __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
  }
  GZ_TARGET_AVX2 static inline float Dot(const float* a, const float* b, int64_t n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
      acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    }
    for (; i < n; i += 8) {
      __m256i m = Tail(n - i);
      acc0 = _mm256_fmadd_ps(Load(a + i, m), Load(b + i, m), acc0);
    }
    return Reduce(_mm256_add_ps(acc0, acc1));
  }
  GZ_TARGET_AVX2 static float SumSquares(const float* a, int64_t n) { return Dot(a, a, n); }
  GZ_TARGET_AVX2 static void Scores(const float* q, const float* k, int64_t stride, int count,
                                    int64_t n, float scale, float* s) {
    for (int t = 0; t < count; ++t) s[t] = Dot(q, k + t * stride, n) * scale;
  }
  GZ_TARGET_AVX2 static void Rotate(float* x, const float* cos, const float* sin, int64_t half) {
    for (int64_t i = 0; i < half; i += 8) {
      const __m256i m = Tail(half - i);
      const __m256 a = Load(x + i, m), b = Load(x + half + i, m);
      const __m256 c = Load(cos + i, m), s = Load(sin + i, m);
      _mm256_maskstore_ps(x + i, m, _mm256_sub_ps(_mm256_mul_ps(a, c), _mm256_mul_ps(b, s)));
      _mm256_maskstore_ps(x + half + i, m, _mm256_add_ps(_mm256_mul_ps(b, c), _mm256_mul_ps(a, s)));
    }
  }
  GZ_TARGET_AVX2 static void ScaleMul(float* out, const float* x, float scale, const float* w,
                                      float offset, int64_t n) {
    const __m256 s = _mm256_set1_ps(scale), o = _mm256_set1_ps(offset);
    for (int64_t i = 0; i < n; i += 8) {
      __m256i m = Tail(n - i);
      __m256 v = _mm256_mul_ps(Load(x + i, m), s);
      _mm256_maskstore_ps(out + i, m, _mm256_mul_ps(v, _mm256_add_ps(Load(w + i, m), o)));
    }
  }
  GZ_TARGET_AVX2 static void Sum(float* out, const float* x, const float* y, int64_t n) {
    for (int64_t i = 0; i < n; i += 8) {
      __m256i m = Tail(n - i);
      _mm256_maskstore_ps(out + i, m, _mm256_add_ps(Load(x + i, m), Load(y + i, m)));
    }
  }
  GZ_TARGET_AVX2 static float ExpShifted(float* x, int64_t n, float shift) {
    const __m256 s = _mm256_set1_ps(shift);
    __m256 sum = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8) {
      __m256i m = Tail(n - i);
      __m256 e = _mm256_and_ps(Exp(_mm256_sub_ps(Load(x + i, m), s)), _mm256_castsi256_ps(m));
      _mm256_maskstore_ps(x + i, m, e);
      sum = _mm256_add_ps(sum, e);
    }
    return Reduce(sum);
  }
  GZ_TARGET_AVX2 static void SwiGlu(float* out, const float* gate, const float* up, int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 8) {
      __m256i m = Tail(n - i);
      __m256 g = Load(gate + i, m);
      __m256 e = Exp(_mm256_sub_ps(_mm256_setzero_ps(), g));
      __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, e));
      _mm256_maskstore_ps(out + i, m, _mm256_mul_ps(silu, Load(up + i, m)));
    }
  }
  GZ_TARGET_AVX2 static void ScaleAddWeighted(float* acc, float c, const float* p, const float* v,
                                              int64_t stride, int count, int64_t n) {
    const __m256 cv = _mm256_set1_ps(c);
    for (int64_t i = 0; i < n; i += 8) {
      __m256i m = Tail(n - i);
      __m256 a = _mm256_mul_ps(Load(acc + i, m), cv);
      for (int t = 0; t < count; ++t) {
        a = _mm256_fmadd_ps(_mm256_set1_ps(p[t]), Load(v + t * stride + i, m), a);
      }
      _mm256_maskstore_ps(acc + i, m, a);
    }
  }
  // For `heads` (<= 4) query heads q [heads, n] at once: s[h * kScoreRows + t] as in Scores.
  GZ_TARGET_AVX2 static void ScoresHeads(const float* q, int heads, const float* k, int64_t stride,
                                         int count, int64_t n, float scale, float* s,
                                         const void* next = nullptr, int64_t fetch = 0) {
    (void)next, (void)fetch;
    for (int h = 0; h < heads; ++h)
      Scores(q + h * n, k, stride, count, n, scale, s + h * kScoreRows);
  }
  // For `heads` (<= 4) heads: acc [heads, n] as in ScaleAddWeighted, with c[h] and
  // p[h * kScoreRows + t].
  GZ_TARGET_AVX2 static void ScaleAddWeightedHeads(float* acc, int heads, const float* c,
                                                   const float* p, const float* v, int64_t stride,
                                                   int count, int64_t n) {
    for (int h = 0; h < heads; ++h) {
      ScaleAddWeighted(acc + h * n, c[h], p + h * kScoreRows, v, stride, count, n);
    }
  }
  // The same over float16 or 8-bit pages (the caller applies the scales), widened first.
  template <typename KV>
  GZ_TARGET_AVX2 static void ScoresHeads(const float* q, int heads, const KV* k, int64_t stride,
                                         int count, int64_t n, float scale, float* s,
                                         const void* next = nullptr, int64_t fetch = 0) {
    (void)next, (void)fetch;
    ScoresHeads(q, heads, WidenPage<Avx2>(k, stride, count, n), n, count, n, scale, s);
  }
  template <typename KV>
  GZ_TARGET_AVX2 static void ScaleAddWeightedHeads(float* acc, int heads, const float* c,
                                                   const float* p, const KV* v, int64_t stride,
                                                   int count, int64_t n) {
    ScaleAddWeightedHeads(acc, heads, c, p, WidenPage<Avx2>(v, stride, count, n), n, count, n);
  }
  static float QuantizeRow(const float* x, int64_t n, int8_t* q) {
    return Scalar::QuantizeRow(x, n, q);
  }
  GZ_TARGET_AVX2 static float Max(const float* x, int64_t n) {
    __m256 m = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(x + i));
    __m128 r = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    r = _mm_max_ps(r, _mm_movehl_ps(r, r));
    r = _mm_max_ss(r, _mm_movehdup_ps(r));
    float best = _mm_cvtss_f32(r);
    for (; i < n; ++i) best = std::max(best, x[i]);
    return best;
  }
  template <typename KV>
  GZ_TARGET_AVX2 static void ScaleAddWeightedPages(float* acc, int heads, const float* c,
                                                   const float* p, const KV* const* v,
                                                   const int* count, int pages, int64_t stride,
                                                   int64_t n, int64_t fetch = 0,
                                                   const void* after = nullptr) {
    (void)fetch, (void)after;
    ScaleAddWeightedEachPage<Avx2>(acc, heads, c, p, v, count, pages, stride, n);
  }
};

#endif  // __x86_64__

}  // namespace gizllm::vec
