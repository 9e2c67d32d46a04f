#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <span>
#include <type_traits>

#include "backend/cpu/attention_codes.h"
#include "backend/cpu/ggml_matmul.h"
#include "backend/cpu/matmul_kernels.h"
#include "backend/cpu/quant_kernels.h"
#include "backend/cpu/quant_matmul.h"
#include "backend/cpu/vec_math.h"
#include "core/check.h"
#include "core/dtype.h"
#include "sampling/sampling.h"

namespace gizllm {
namespace {

// Elementwise work below this many elements runs on the calling thread: waking the pool
// costs more than the loop.
constexpr int64_t kInlineElements = 1 << 15;

class HostBuffer : public Buffer {
 public:
  HostBuffer(void* data, size_t bytes) : data_(data), bytes_(bytes) {}
  ~HostBuffer() override { std::free(data_); }
  void* data() override { return data_; }
  size_t bytes() const override { return bytes_; }

 private:
  void* data_;
  size_t bytes_;
};

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// A weight PrepareWeight packed: its data leaves the backend's map of packed data with it (the
// buffer must not outlive the backend), so later memory at the same address is not taken for it.
class PackedBuffer : public HostBuffer {
 public:
  PackedBuffer(void* data, size_t bytes, const void* host,
               std::unordered_map<const void*, const void*>* packed)
      : HostBuffer(data, bytes), packed_(packed) {
    (*packed_)[data] = host;
  }
  ~PackedBuffer() override { packed_->erase(data()); }

 private:
  std::unordered_map<const void*, const void*>* packed_;
};

// Runs fn(begin, end) over [0, n) on the pool, or inline when `work` is small.
template <typename Fn>
void Split(ThreadPool* pool, int64_t n, int64_t work, Fn&& fn) {
  if (n <= 0) return;
  if (pool->threads() == 1 || work < kInlineElements || n == 1) {
    fn(int64_t{0}, n);
    return;
  }
  pool->ParallelFor(n, 1, [&](int64_t begin, int64_t end, int) { fn(begin, end); });
}

template <class V>
void RmsNormRows(const RmsNormParams& p, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* x = p.x + r * p.dim;
    float* out = p.out + r * p.dim;
    const float* sum = x;
    float ss;
    if (p.residual) {
      float* res = p.residual + r * p.dim;
      if constexpr (requires { &V::SumThenSquares; }) {
        ss = V::SumThenSquares(res, res, x, p.dim);
      } else {
        V::Sum(res, res, x, p.dim);
        ss = V::SumSquares(res, p.dim);
      }
      sum = res;
    } else {
      ss = V::SumSquares(sum, p.dim);
    }
    float scale = 1.0f / std::sqrt(ss / static_cast<float>(p.dim) + p.eps);
    V::ScaleMul(out, sum, scale, p.weight, p.offset, p.dim);
  }
}

// table: [positions, rotary_dims] cos then sin of each frequency, per position (shared by all
// heads).
template <class V>
void RopeRows(const RopeParams& p, const float* table, int64_t r0, int64_t r1) {
  const int half = p.rotary_dims / 2;
  for (int64_t r = r0; r < r1; ++r) {
    const float* cos = table + static_cast<int64_t>(p.positions[r]) * p.rotary_dims;
    const float* sin = cos + half;
    for (int h = 0; h < p.heads; ++h) {
      float* x = p.x + (r * p.heads + h) * p.head_dim;
      if constexpr (requires { &V::NormRotate64; }) {
        if (p.norm && p.head_dim == 64 && half == 32) {
          V::NormRotate64(x, p.norm, p.norm_eps, cos, sin);
          continue;
        }
      }
      if (p.norm) {
        float ss = V::SumSquares(x, p.head_dim);
        float scale = 1.0f / std::sqrt(ss / static_cast<float>(p.head_dim) + p.norm_eps);
        V::ScaleMul(x, x, scale, p.norm, 0.0f, p.head_dim);
      }
      V::Rotate(x, cos, sin, half);
    }
  }
}

// Query heads [g_begin, g_end) (at most kMaxHeads) of kv head kvh for row r, over its slot's
// pages: online softmax a chunk of up to kChunkPages pages at a time (the chunk's scores, then
// the running max, sum and weighted values rescaled once), so no buffer grows with the context.
// acc: [g_end - g_begin, head_dim] scratch.
constexpr int kMaxHeads = 64;
constexpr int kChunkPages = vec::kScoreRows / kPage;
static_assert(vec::kScoreRows % kPage == 0);

// Prefetches kPage rows of `width` bytes, `stride` bytes apart.
inline void PrefetchPage(const void* x, int64_t stride, int64_t width) {
  for (int t = 0; t < kPage; ++t) vec::PrefetchRow(static_cast<const char*>(x) + t * stride, width);
}

// KV: float (f32 pages) or uint16_t (f16 pages, converted as the routines load them).
template <class V, typename KV>
void AttentionHeads(const AttentionParams& p, int64_t r, int kvh, int g_begin, int g_end,
                    int64_t fetch, float* acc) {
  const int group = p.heads / p.kv_heads;
  const int hd = p.head_dim;
  const int64_t stride = static_cast<int64_t>(p.kv_heads) * hd;  // elements between positions
  const int32_t last = p.positions[r];
  const int32_t first = p.window > 0 ? std::max(0, last - p.window + 1) : 0;
  const int32_t last_block = last / kPage;
  const int32_t* pages = p.table.pages + static_cast<int64_t>(p.slots[r]) * p.table.max_pages;
  const auto* keys = static_cast<const KV*>(p.cache.keys);
  const auto* values = static_cast<const KV*>(p.cache.values);
  // Where position t of block b starts (kv head kvh).
  auto at = [&](int32_t block, int32_t t) {
    return (static_cast<int64_t>(pages[block]) * kPage + t) * stride +
           static_cast<int64_t>(kvh) * hd;
  };
  float max_score[kMaxHeads], total[kMaxHeads];
  DCHECK(g_end - g_begin <= kMaxHeads);
  for (int h = 0; h < g_end - g_begin; ++h) {
    max_score[h] = -std::numeric_limits<float>::infinity();
    total[h] = 0.0f;
  }
  std::memset(acc, 0, sizeof(float) * (g_end - g_begin) * hd);
  for (int32_t block0 = first / kPage; block0 <= last_block; block0 += kChunkPages) {
    const int pages_in = std::min(kChunkPages, last_block + 1 - block0);
    const KV* k[kChunkPages];
    const KV* v[kChunkPages];
    // 8-bit pages: the scales of k[j]'s and v[j]'s positions.
    [[maybe_unused]] const float* ks[kChunkPages];
    [[maybe_unused]] const float* vs[kChunkPages];
    int count[kChunkPages];
    int positions = 0;
    for (int j = 0; j < pages_in; ++j) {
      const int32_t block = block0 + j;
      const int32_t t0 = std::max(first, block * kPage) - block * kPage;
      const int32_t t1 = std::min(last, block * kPage + kPage - 1) - block * kPage + 1;
      count[j] = t1 - t0;
      k[j] = keys + at(block, t0);  // position t0 + t at k[j] + t * stride
      v[j] = values + at(block, t0);
      if constexpr (std::is_same_v<KV, int8_t>) {
        // Position t0 + t's scales at ks[j][t * kv_heads]; fetched with the chunk.
        const int64_t i = (static_cast<int64_t>(pages[block]) * kPage + t0) * p.kv_heads + kvh;
        ks[j] = p.cache.key_scales + i;
        vs[j] = p.cache.value_scales + i;
        if (fetch > 0) {
          vec::PrefetchRow(ks[j], count[j] * p.kv_heads * sizeof(float));
          vec::PrefetchRow(vs[j], count[j] * p.kv_heads * sizeof(float));
        }
      }
      positions += count[j];
    }
    // The pages of a context are scattered in the pool, beyond the hardware prefetcher's reach,
    // and in a decode step they are not in L2 (the weights streamed through since the last
    // step): each page's rows are fetched while the page before it is read (the first keys
    // before the last chunk's values, the first values after the last keys), a few lines at
    // a time (bursts of a page or more stall on the core's outstanding misses). Rows of one
    // prompt (a slot's rows in a row) find the pages the row before them read still cached.
    const KV* after = nullptr;  // the next chunk's first keys
    if (fetch > 0) {
      if (block0 == first / kPage) PrefetchPage(k[0], stride * sizeof(KV), fetch);
      if (block0 + pages_in <= last_block) after = keys + at(block0 + pages_in, 0);
    }
    // Query heads four at a time, so that each key and value is loaded once for them.
    for (int g0 = g_begin; g0 < g_end; g0 += 4) {
      const int heads = std::min(4, g_end - g0);
      const float* q = p.q + (r * p.heads + kvh * group + g0) * hd;  // [heads, hd]
      float s[4 * vec::kScoreRows];
      float correction[4];
      for (int j = 0, offset = 0; j < pages_in; offset += count[j], ++j) {
        const KV* next = fetch == 0 ? nullptr : j + 1 < pages_in ? k[j + 1] : v[0];
        V::ScoresHeads(q, heads, k[j], stride, count[j], hd, p.scale, s + offset, next, fetch);
        if constexpr (std::is_same_v<KV, int8_t>) {
          for (int h = 0; h < heads; ++h) {
            float* sh = s + h * vec::kScoreRows + offset;
            for (int t = 0; t < count[j]; ++t) sh[t] *= ks[j][t * p.kv_heads];
          }
        }
      }
      if (p.softcap > 0) {  // Gemma 2: cap * tanh(score / cap)
        for (int h = 0; h < heads; ++h) {
          float* sh = s + h * vec::kScoreRows;
          for (int t = 0; t < positions; ++t) sh[t] = p.softcap * std::tanh(sh[t] / p.softcap);
        }
      }
      for (int h = 0; h < heads; ++h) {
        const int g = g0 - g_begin + h;
        float* sh = s + h * vec::kScoreRows;
        const float new_max = std::max(max_score[g], V::Max(sh, positions));
        correction[h] = std::exp(max_score[g] - new_max);  // 0 on the first chunk
        const float sum = V::ExpShifted(sh, positions, new_max);
        total[g] = total[g] * correction[h] + sum;
        max_score[g] = new_max;
      }
      if constexpr (std::is_same_v<KV, int8_t>) {
        // 8-bit pages: each weight times its value's scale (after the sum, which is of the
        // weights alone).
        for (int j = 0, offset = 0; j < pages_in; offset += count[j], ++j) {
          for (int h = 0; h < heads; ++h) {
            float* sh = s + h * vec::kScoreRows + offset;
            for (int t = 0; t < count[j]; ++t) sh[t] *= vs[j][t * p.kv_heads];
          }
        }
      }
      V::ScaleAddWeightedPages(acc + (g0 - g_begin) * hd, heads, correction, s, v, count, pages_in,
                               stride, hd, fetch, after);
    }
  }
  for (int g = g_begin; g < g_end; ++g) {
    float* out = p.out + (r * p.heads + kvh * group + g) * hd;
    const float* a = acc + (g - g_begin) * hd;
    const float inv = 1.0f / total[g - g_begin];
    for (int i = 0; i < hd; ++i) out[i] = a[i] * inv;
  }
}

// All query heads of kv heads [kv_begin, kv_end) of row r, kMaxHeads at a time. acc:
// [kMaxHeads, head_dim]. Where the row's pages are cold (not read by the row before it: the
// first row of a slot), the first kv head's pass fetches the whole of each position's row, every
// kv head's part of it (adjacent in a page), for the kv heads after it.
template <class V>
void AttentionTask(const AttentionParams& p, int64_t r, int kv_begin, int kv_end, float* acc) {
  const int group = p.heads / p.kv_heads;
  const bool cold = r == 0 || p.slots[r - 1] != p.slots[r];
  const int64_t row_part = static_cast<int64_t>(p.head_dim) * KvFormatBytes(p.cache.format);
  for (int kvh = kv_begin; kvh < kv_end; ++kvh) {
    for (int g = 0; g < group; g += kMaxHeads) {
      const int64_t fetch = cold && kvh == kv_begin && g == 0 ? (kv_end - kv_begin) * row_part : 0;
      if (p.cache.format == KvFormat::kF16) {
        AttentionHeads<V, uint16_t>(p, r, kvh, g, std::min(group, g + kMaxHeads), fetch, acc);
      } else if (p.cache.format == KvFormat::kQ8) {
        AttentionHeads<V, int8_t>(p, r, kvh, g, std::min(group, g + kMaxHeads), fetch, acc);
      } else {
        AttentionHeads<V, float>(p, r, kvh, g, std::min(group, g + kMaxHeads), fetch, acc);
      }
    }
  }
}

#if defined(__x86_64__)
// Prompt rows in tiles (AVX-512): rows of one slot at consecutive positions, with the query heads
// of one kv head, are the lanes of a vector (lane = row * heads + head, up to 16), so that each
// key and value loaded serves every lane and no score is summed across lanes. Keys go 16 at a
// time (one page), scores s[t] = sum_d q[d] k_t[d] and the weighted values acc[d] += w[t] v_t[d]
// are each one FMA per (key, dimension) for all lanes; the online softmax keeps a running max
// and sum per lane. Each lane sees the keys of its own row: first <= position <= its row's.
// A row alone ran at about 13% of the FMA rate over a long prompt (1,900 tokens: attention 61%
// of the prefill).
constexpr int kTileLanes = 16;
constexpr int kTileKeys = 16;
static_assert(kPage % kTileKeys == 0, "a step's keys lie in one page");

// Floats of one thread's tile scratch.
inline int64_t TileScratchFloats(int head_dim) {
  return 4 * int64_t{head_dim} * kTileLanes + kTileKeys * kTileLanes;
}

// Rows [r0, r0 + rows) of one slot (positions consecutive), query heads [g_begin, g_begin +
// heads) of kv head kvh; rows * heads <= 16, head_dim a multiple of 16.
template <typename KV>
GZ_TARGET_AVX512 void AttentionTile(const AttentionParams& p, int64_t r0, int rows, int kvh,
                                    int g_begin, int heads, float* scratch) {
  using V = vec::Avx512;
  const int group = p.heads / p.kv_heads;
  const int hd = p.head_dim;
  const int lanes = rows * heads;
  const int64_t stride = static_cast<int64_t>(p.kv_heads) * hd;
  const int32_t pos0 = p.positions[r0];
  const int32_t last = pos0 + rows - 1;
  const int32_t first = p.window > 0 ? std::max(0, pos0 - p.window + 1) : 0;
  const int32_t* pages = p.table.pages + static_cast<int64_t>(p.slots[r0]) * p.table.max_pages;
  const auto* keys = static_cast<const KV*>(p.cache.keys);
  const auto* values = static_cast<const KV*>(p.cache.values);
  float* qt = scratch;               // [hd][16]: the queries times the scale, lanes across
  float* kr = qt + hd * kTileLanes;  // [16][hd]: a step's keys as float32 (zeros past count)
  float* vr = kr + kTileKeys * hd;   // [16][hd]: its values as float32
  float* acc = vr + kTileKeys * hd;  // [hd][16]: the weighted values, lanes across
  float* w = acc + hd * kTileLanes;  // [16 keys][16 lanes]: the weights
  alignas(64) int32_t lane_last[kTileLanes], lane_first[kTileLanes];
  for (int l = 0; l < kTileLanes; ++l) {
    const int i = l < lanes ? l / heads : rows - 1;
    lane_last[l] = pos0 + i;
    lane_first[l] = p.window > 0 ? std::max(0, pos0 + i - p.window + 1) : 0;
  }
  const __m512i last_v = _mm512_load_si512(lane_last), first_v = _mm512_load_si512(lane_first);
  const __mmask16 live = static_cast<__mmask16>(lanes >= 16 ? 0xffff : (1u << lanes) - 1);
  for (int l = 0; l < kTileLanes; ++l) {
    const float* q = p.q + ((r0 + l / heads) * p.heads + kvh * group + g_begin + l % heads) * hd;
    for (int d = 0; d < hd; ++d) qt[d * kTileLanes + l] = l < lanes ? q[d] * p.scale : 0.0f;
  }
  std::memset(acc, 0, sizeof(float) * hd * kTileLanes);
  __m512 max = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 total = _mm512_setzero_ps();
  for (int32_t t0 = first / kTileKeys * kTileKeys; t0 <= last; t0 += kTileKeys) {
    const int count = std::min(kTileKeys, last + 1 - t0);
    const int64_t at =
        (static_cast<int64_t>(pages[t0 / kPage]) * kPage + t0 % kPage) * stride + kvh * hd;
    for (int t = 0; t < kTileKeys; ++t) {
      for (int d = 0; d < hd; d += 16) {
        const __m512 k =
            t < count ? V::LoadKv(keys + at + t * stride + d, 0xffff) : _mm512_setzero_ps();
        _mm512_store_ps(kr + t * hd + d, k);
      }
    }
    // Scores, one vector (all lanes) a key.
    __m512 sc[kTileKeys];
#pragma GCC unroll 16
    for (int t = 0; t < kTileKeys; ++t) sc[t] = _mm512_setzero_ps();
    for (int d = 0; d < hd; ++d) {
      const __m512 qd = _mm512_load_ps(qt + d * kTileLanes);
#pragma GCC unroll 16
      for (int t = 0; t < kTileKeys; ++t) {
        sc[t] = _mm512_fmadd_ps(qd, _mm512_set1_ps(kr[t * hd + d]), sc[t]);
      }
#pragma GCC unroll 16
      for (int t = 0; t < kTileKeys; ++t) asm("" : "+v"(sc[t]));  // sums stay in place (GCC 12)
    }
    // 8-bit pages: key t's scale on its scores, value t's on its weights.
    [[maybe_unused]] const float* scales = nullptr;
    if constexpr (std::is_same_v<KV, int8_t>) {
      scales = p.cache.key_scales +
               (static_cast<int64_t>(pages[t0 / kPage]) * kPage + t0 % kPage) * p.kv_heads + kvh;
#pragma GCC unroll 16
      for (int t = 0; t < kTileKeys; ++t) {
        if (t < count) sc[t] = _mm512_mul_ps(sc[t], _mm512_set1_ps(scales[t * p.kv_heads]));
      }
    }
    __mmask16 valid[kTileKeys];
    __m512 new_max = max;
#pragma GCC unroll 16
    for (int t = 0; t < kTileKeys; ++t) {
      const __m512i tv = _mm512_set1_epi32(t0 + t);
      valid[t] = t < count ? static_cast<__mmask16>(live & _mm512_cmple_epi32_mask(tv, last_v) &
                                                    _mm512_cmpge_epi32_mask(tv, first_v))
                           : 0;
      new_max = _mm512_mask_max_ps(new_max, valid[t], new_max, sc[t]);
    }
    // A lane with no key yet keeps -inf: its correction (and its sums, zero) stay 0.
    const __mmask16 seen = _mm512_cmp_ps_mask(new_max, new_max, _CMP_ORD_Q) &
                           _mm512_cmp_ps_mask(new_max, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ);
    const __m512 correction =
        _mm512_maskz_mov_ps(seen & _mm512_cmp_ps_mask(max, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ),
                            V::Exp(_mm512_sub_ps(max, new_max)));
    max = new_max;
    total = _mm512_mul_ps(total, correction);
    const float* vscales = nullptr;
    if constexpr (std::is_same_v<KV, int8_t>) {
      vscales = p.cache.value_scales +
                (static_cast<int64_t>(pages[t0 / kPage]) * kPage + t0 % kPage) * p.kv_heads + kvh;
    }
    // (Every loop over sc is unrolled whole: one indexed at run time puts the sums in memory.)
#pragma GCC unroll 16
    for (int t = 0; t < kTileKeys; ++t) {
      __m512 wt = _mm512_maskz_mov_ps(valid[t], V::Exp(_mm512_sub_ps(sc[t], max)));
      total = _mm512_add_ps(total, wt);
      if constexpr (std::is_same_v<KV, int8_t>) {
        if (t < count) wt = _mm512_mul_ps(wt, _mm512_set1_ps(vscales[t * p.kv_heads]));
      }
      _mm512_store_ps(w + t * kTileLanes, wt);
    }
    // The values as float32, then acc[d] = acc[d] * correction + sum_t w[t] v_t[d].
    for (int t = 0; t < count; ++t) {
      for (int d = 0; d < hd; d += 16) {
        _mm512_store_ps(vr + t * hd + d, V::LoadKv(values + at + t * stride + d, 0xffff));
      }
    }
    for (int d = 0; d < hd; d += 8) {
      __m512 a[8];
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        a[j] = _mm512_mul_ps(_mm512_load_ps(acc + (d + j) * kTileLanes), correction);
      }
      for (int t = 0; t < count; ++t) {
        const __m512 wt = _mm512_load_ps(w + t * kTileLanes);
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) {
          a[j] = _mm512_fmadd_ps(wt, _mm512_set1_ps(vr[t * hd + d + j]), a[j]);
        }
      }
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) _mm512_store_ps(acc + (d + j) * kTileLanes, a[j]);
    }
  }
  alignas(64) float inv[kTileLanes];
  _mm512_store_ps(inv, _mm512_div_ps(_mm512_set1_ps(1.0f), total));
  for (int l = 0; l < lanes; ++l) {
    float* out = p.out + ((r0 + l / heads) * p.heads + kvh * group + g_begin + l % heads) * hd;
    for (int d = 0; d < hd; ++d) out[d] = acc[d * kTileLanes + l] * inv[l];
  }
}

// All kv heads of rows [r0, r0 + rows) of one slot, in tiles of up to 16 lanes.
inline void AttentionRowsTiled(const AttentionParams& p, int64_t r0, int rows, float* scratch) {
  const int group = p.heads / p.kv_heads;
  const int heads = std::min(group, kTileLanes);
  for (int kvh = 0; kvh < p.kv_heads; ++kvh) {
    for (int g = 0; g < group; g += heads) {
      const int h = std::min(heads, group - g);
      switch (p.cache.format) {
        case KvFormat::kF16:
          AttentionTile<uint16_t>(p, r0, rows, kvh, g, h, scratch);
          break;
        case KvFormat::kQ8:
          AttentionTile<int8_t>(p, r0, rows, kvh, g, h, scratch);
          break;
        default:
          AttentionTile<float>(p, r0, rows, kvh, g, h, scratch);
          break;
      }
    }
  }
}
#endif

// Runs body.template operator()<V>() with the policy of the instruction set.
template <typename Body>
void WithVec(CpuIsa isa, Body&& body) {
#if defined(__x86_64__)
  if (isa == CpuIsa::kAvx512) return body.template operator()<vec::Avx512>();
  if (isa == CpuIsa::kAvx2) return body.template operator()<vec::Avx2>();
#endif
  body.template operator()<vec::Scalar>();
}

}  // namespace

Status CpuOptions::Check() const {
  if (isa && static_cast<int>(*isa) > static_cast<int>(DetectCpuIsa())) {
    return InvalidArgument(std::string("CpuOptions.isa: ") + CpuIsaName(*isa) +
                           " is not supported by this CPU (best: " + CpuIsaName(DetectCpuIsa()) +
                           ")");
  }
  if (bf16_activations && !CpuHasAvx512Bf16()) {
    return InvalidArgument("CpuOptions.bf16_activations: this CPU lacks avx512_bf16");
  }
  if (bf16_activations && isa && *isa != CpuIsa::kAvx512) {
    return InvalidArgument("CpuOptions.bf16_activations: needs isa avx512");
  }
  if (int8_activations && !CpuHasAvx512Vnni()) {
    return InvalidArgument("CpuOptions.int8_activations: this CPU lacks avx512_vnni");
  }
  if (int8_activations && isa && *isa != CpuIsa::kAvx512) {
    return InvalidArgument("CpuOptions.int8_activations: needs isa avx512");
  }
  return Status::Ok();
}

CpuBackend::Scratch::~Scratch() { std::free(data_); }

float* CpuBackend::Scratch::Get(size_t floats) {
  if (floats > size_) {
    std::free(data_);
    size_ = std::max(floats, size_ * 2);
    data_ = static_cast<float*>(std::aligned_alloc(64, RoundUp(size_ * sizeof(float), 64)));
    CHECK(data_ != nullptr);
  }
  return data_;
}

CpuBackend::CpuBackend(ThreadPool* pool, const CpuOptions& options)
    : pool_(pool),
      options_(options),
      isa_(options.isa.value_or(DetectCpuIsa())),
      matmul_(&MatmulKernelsFor(isa_)),
      bf16_matmul_(options.bf16_activations ? &Avx512Bf16MatmulKernels() : nullptr) {
  CHECK(pool_ != nullptr);
}

CpuBackend::~CpuBackend() = default;

bool CpuBackend::PacksBf16() const {
  // The packed kernels are compiled for AVX-512 BF16 CPUs (the float32 ones use no BF16
  // instruction, but share their code).
  return isa_ == CpuIsa::kAvx512 && CpuHasAvx512Bf16();
}

std::string CpuBackend::Describe() const {
  std::string s = "cpu (" + std::to_string(pool_->threads()) + " threads, " + CpuIsaName(isa_);
  if (options_.bf16_activations) s += ", bf16 activations";
  if (options_.int8_activations) s += ", int8 activations";
  return s + ")";
}

DeviceMemory CpuBackend::Memory() const {
  DeviceMemory m;
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return m;
  char line[256];
  while (std::fgets(line, sizeof(line), f)) {
    long long kib = 0;
    if (std::sscanf(line, "MemTotal: %lld kB", &kib) == 1) m.total = kib * 1024;
    if (std::sscanf(line, "MemAvailable: %lld kB", &kib) == 1) m.free = kib * 1024;
  }
  std::fclose(f);
  return m;
}

Expected<std::unique_ptr<Buffer>> CpuBackend::Allocate(size_t bytes) {
  size_t rounded = RoundUp(std::max<size_t>(bytes, 1), 64);
  void* data = std::aligned_alloc(64, rounded);
  if (!data) return ResourceExhausted("cpu: cannot allocate " + std::to_string(bytes) + " bytes");
  std::memset(data, 0, rounded);
  return std::unique_ptr<Buffer>(new HostBuffer(data, bytes));
}

void CpuBackend::CopyToDevice(void* dst, const void* src, size_t bytes) {
  std::memcpy(dst, src, bytes);
}

void CpuBackend::CopyToHost(void* dst, const void* src, size_t bytes) {
  std::memcpy(dst, src, bytes);
}

void CpuBackend::CopyOnDevice(void* dst, const void* src, size_t bytes) {
  std::memcpy(dst, src, bytes);
}

Expected<Weight> CpuBackend::PrepareWeight(const Weight& host, std::unique_ptr<Buffer>* storage) {
  if (storage) storage->reset();
  switch (host.format) {
    case Format::kF32:
    case Format::kF16:
    case Format::kBf16: {
      if (host.empty() || host.rows <= 0 || host.cols <= 0) {
        return InvalidArgument("cpu: weight of format " + FormatName(host.format) +
                               " has no data or an empty shape");
      }
      if (host.format != Format::kBf16 || !PacksBf16() || !storage) return host;
      // Packed once for the kernels over panels of 32 outputs (matmul_kernels.h): vdpbf16ps with
      // bf16 activations, widened float32 products without.
      const size_t bytes = RoundUp(PackedBf16Bytes(host.rows, host.cols), 64);
      void* data = std::aligned_alloc(64, bytes);
      if (!data)
        return ResourceExhausted("cpu: cannot allocate " + std::to_string(bytes) + " bytes");
      PackBf16Weight(static_cast<const uint16_t*>(host.data), host.rows, host.cols, data);
      *storage = std::make_unique<PackedBuffer>(data, bytes, host.data, &packed_);
      Weight w = host;
      w.data = data;
      return w;
    }
    case Format::kQ8:
    case Format::kQ4:
    case Format::kQ2:
    case Format::kQ1: {
      // Quantized weights are read in place (quant_matmul.h), or with int8 activations repacked
      // for the integer products (q8 and q4).
      Status s = CheckQuantWeight(host);
      if (!s.ok()) return s.Annotate("cpu");
      if (!options_.int8_activations || !VnniPacks(host.format) || !storage) return host;
      const size_t bytes = RoundUp(VnniPackedBytes(host), 64);
      void* data = std::aligned_alloc(64, bytes);
      if (!data)
        return ResourceExhausted("cpu: cannot allocate " + std::to_string(bytes) + " bytes");
      PackVnniWeight(host, data, pool_);
      *storage = std::make_unique<HostBuffer>(data, bytes);
      Weight w = host;
      w.data = data;
      w.scales = nullptr;
      w.zeros = nullptr;
      w.layout = kCpuVnniLayout;
      return w;
    }
    case Format::kGgml: {
      // ggml's blocks are read in place (ggml_matmul.h).
      Status s = CheckGgmlWeight(host);
      if (!s.ok()) return s.Annotate("cpu");
      return host;
    }
    default:
      break;
  }
  return Unimplemented("cpu: weight format " + FormatName(host.format) +
                       " is not supported by the CPU backend yet");
}

// GeGLU's gate, gelu_pytorch_tanh, in float32 as PyTorch computes it: scalar (Gemma's
// feed-forward is a small part of its step; tanh has no vector routine here).
static void GeluTanhGlu(float* out, const float* gate, const float* up, int64_t n) {
  constexpr float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
  constexpr float kKappa = 0.044715f;
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    const float inner = kBeta * (g + kKappa * g * g * g);
    out[i] = 0.5f * g * (1.0f + std::tanh(inner)) * up[i];
  }
}

bool CpuBackend::ReadsGgml(uint32_t ggml_type) const { return GgmlMatmulReads(ggml_type); }

void CpuBackend::Embed(const EmbedParams& p) {
  auto trace = Trace("embed");
  const Weight& t = *p.table;
  const int64_t dim = t.cols;
  // A table packed by PrepareWeight (a tied head): its row, one 32-bit lane every 128 bytes
  // there, is read from the host data it was packed from, where it is contiguous.
  const void* data = t.data;
  if (t.format == Format::kBf16) {
    if (const auto packed = packed_.find(t.data); packed != packed_.end()) data = packed->second;
  }
  const int64_t row_bytes =
      t.format == Format::kGgml ? t.Bytes() / t.rows : dim * FormatBits(t.format) / 8;
  // The rows of a step's tokens are in no cache: each is fetched 16 rows before it is read, so
  // that their misses overlap (tiny-chat's bf16 table, cold, 2 threads: 16 rows 13-14 -> 5-8
  // us, 256 rows 148-181 -> 115-145 us).
  constexpr int64_t kAhead = 16;
  Split(pool_, p.rows, p.rows * dim, [&](int64_t r0, int64_t r1) {
    auto fetch = [&](int64_t r) {
      if (r < r1)
        vec::PrefetchRow(static_cast<const char*>(data) + p.tokens[r] * row_bytes, row_bytes);
    };
    for (int64_t r = r0; r < r0 + kAhead; ++r) fetch(r);
    for (int64_t r = r0; r < r1; ++r) {
      fetch(r + kAhead);
      const int64_t token = p.tokens[r];
      DCHECK(token >= 0 && token < t.rows);
      float* out = p.out + r * dim;
      switch (t.format) {
        case Format::kF32:
          std::memcpy(out, static_cast<const float*>(t.data) + token * dim, dim * sizeof(float));
          break;
        case Format::kF16: {
          const uint16_t* row = static_cast<const uint16_t*>(t.data) + token * dim;
          for (int64_t i = 0; i < dim; ++i) out[i] = F16ToF32(row[i]);
          break;
        }
        case Format::kBf16: {
          const uint16_t* row = static_cast<const uint16_t*>(data) + token * dim;
          for (int64_t i = 0; i < dim; ++i) out[i] = Bf16ToF32(row[i]);
          break;
        }
        case Format::kGgml:  // the token's row decoded from its blocks
          GgmlRow(t, token, out, isa_);
          break;
        default:
          CHECK(false && "Embed: the table's format is not plain or ggml");
      }
      if (p.scale != 1.0f) {
        for (int64_t i = 0; i < dim; ++i) out[i] *= p.scale;
      }
    }
  });
}

void CpuBackend::RmsNorm(const RmsNormParams& p) {
  auto trace = Trace("rms_norm");
  WithVec(isa_, [&]<class V>() {
    Split(pool_, p.rows, p.rows * p.dim,
          [&](int64_t r0, int64_t r1) { RmsNormRows<V>(p, r0, r1); });
  });
}

void CpuBackend::Matmul(const MatmulParams& p) {
  auto trace = Trace("matmul");
  if (p.rows <= 0) return;
  if (p.norm || p.accumulate) {
    // FusesMatmul() is false: the model issues RmsNorm and Add instead.
    std::fprintf(stderr, "cpu Matmul: the fused norm and accumulate are not supported\n");
    std::abort();
  }
  // Quantized outputs run on their own kernels (quant_matmul.h); the plain ones below.
  if (HasQuantizedOutput(p)) QuantMatmul(p, pool_, isa_, options_.bf16_activations);
  if (HasGgmlOutput(p)) GgmlMatmul(p, pool_, isa_);
  const int64_t cols = p.w[0]->cols;
  // Each plain output's kernels, and the activations in the order they read, prepared once
  // per distinct order: [0] bf16 activations for bf16 weights not packed (bf16_activations, steps
  // of kBf16MinRows rows and more), [1] float32 in the order the float32 kernels read bf16
  // weights, [2] f16 and f32 weights, [3] bf16 activations in tiles for packed bf16 weights,
  // [4] float32 activations in tiles for packed bf16 weights.
  const MatmulKernels* kernels[MatmulParams::kMaxOutputs] = {};
  const float* x[5] = {nullptr, nullptr, nullptr, nullptr, nullptr};
  MatmulSlice slices[MatmulParams::kMaxOutputs];
  Weight hosts[MatmulParams::kMaxOutputs];  // packed weights read from their host data
  int64_t total_n = 0;
  int tile_rows = 1;
  for (int o = 0; o < p.outputs; ++o) {
    const Format f = p.w[o]->format;
    if (f != Format::kF32 && f != Format::kF16 && f != Format::kBf16) continue;
    const Weight* w = p.w[o];
    const auto found = f == Format::kBf16 ? packed_.find(w->data) : packed_.end();
    bool packed = found != packed_.end();
    if (packed && !options_.bf16_activations && p.rows < kPackedMinRows) {
      // Float32 activations, a few rows: the dot-product tiles over the rows as stored (8 weight
      // rows in flight) were measured faster than one row's panel, whose two accumulators wait
      // on their dependent products.
      hosts[o] = *w;
      hosts[o].data = found->second;
      w = &hosts[o];
      packed = false;
    }
    const bool rounded =
        packed ? options_.bf16_activations
               : f == Format::kBf16 && bf16_matmul_ && p.rows >= CpuOptions::kBf16MinRows;
    const int order = packed ? (rounded ? 3 : 4) : rounded ? 0 : f == Format::kBf16 ? 1 : 2;
    const MatmulKernels& k =
        packed    ? (rounded ? Avx512Bf16PackedMatmulKernels() : Avx512PackedMatmulKernels())
        : rounded ? *bf16_matmul_
                  : *matmul_;
    const int64_t stride = ActivationStride(k, cols);
    if (!x[order]) {
      // In units of k.prepare_rows rows (whole tiles).
      const int64_t unit = k.prepare_rows;
      const int64_t units = (p.rows + unit - 1) / unit;
      float* dst = activations_[order].Get(units * unit * stride);
      Split(pool_, units, p.rows * cols, [&](int64_t u0, int64_t u1) {
        const int64_t r0 = u0 * unit, r1 = std::min(p.rows, u1 * unit);
        k.prepare(f, p.x + r0 * cols, r1 - r0, cols, dst + r0 * stride);
      });
      x[order] = dst;
    }
    kernels[o] = &k;
    slices[o] = MatmulSlice{.w = w,
                            .x = x[order],
                            .x_stride = stride,
                            .rows = p.rows,
                            .out = p.out[o],
                            .bias = p.bias[o]};
    total_n += p.w[o]->rows;
    tile_rows = std::max(tile_rows, k.tile_rows);
  }
  // swiglu with both outputs on the kernels below: a task computes the same columns of both and
  // then out[0] = silu(out[0]) * out[1] over them, while they are in its core's L1 (the same
  // elementwise function as the SwiGlu op, so the same values). With a quantized output, the
  // SwiGlu op runs over the whole outputs after them.
  const bool fused_swiglu = p.swiglu && kernels[0] && kernels[1];
  if (total_n > 0) {
    // Output rows in chunks (multiples of the tile), about four per thread so that threads that
    // finish early take more; one dispatch covers every output (every pair of gate and up
    // columns with the fused swiglu).
    const int threads = pool_->threads();
    const int outputs = fused_swiglu ? 1 : p.outputs;
    const int64_t task_n = fused_swiglu ? p.w[0]->rows : total_n;
    int64_t chunk = (task_n + 4 * threads - 1) / (4 * threads);
    chunk = std::max<int64_t>(tile_rows, (chunk + tile_rows - 1) / tile_rows * tile_rows);
    int64_t first_task[MatmulParams::kMaxOutputs + 1] = {0};
    for (int o = 0; o < outputs; ++o) {
      const int64_t n = kernels[o] ? p.w[o]->rows : 0;
      first_task[o + 1] = first_task[o] + (n + chunk - 1) / chunk;
    }
    const int64_t tasks = first_task[outputs];
    WithVec(isa_, [&]<class V>() {
      auto run = [&](int64_t task, int) {
        int o = 0;
        while (task >= first_task[o + 1]) ++o;
        const int64_t n0 = (task - first_task[o]) * chunk;
        const int64_t n1 = std::min(p.w[o]->rows, n0 + chunk);
        kernels[o]->slice[static_cast<int>(p.w[o]->format)](slices[o], n0, n1);
        if (fused_swiglu) {
          kernels[1]->slice[static_cast<int>(p.w[1]->format)](slices[1], n0, n1);
          const int64_t n = p.w[0]->rows;
          for (int64_t r = 0; r < p.rows; ++r) {
            float* gate = p.out[0] + r * n + n0;
            V::SwiGlu(gate, gate, p.out[1] + r * n + n0, n1 - n0);
          }
        }
      };
      if (threads == 1) {
        for (int64_t t = 0; t < tasks; ++t) run(t, 0);
      } else {
        // The same outputs on the same thread each step where it keeps up: its share of the
        // weights stays in its core's caches.
        pool_->ForEachAffine(tasks, run);
      }
    });
  }
  if (p.swiglu && !fused_swiglu) Glu({p.out[0], p.out[0], p.out[1], p.rows * p.w[0]->rows});
}

const float* CpuBackend::RopeTable(const RopeParams& p) {
  const int half = p.rotary_dims / 2;
  RopeCache* cache = nullptr;
  for (RopeCache& c : rope_tables_) {
    if (static_cast<int>(c.inv_freq.size()) == half &&
        std::equal(c.inv_freq.begin(), c.inv_freq.end(), p.inv_freq)) {
      cache = &c;
      break;
    }
  }
  if (cache == nullptr) {
    // A handful of tables a model; a backend shared by models that keep changing starts over.
    if (rope_tables_.size() >= 8) rope_tables_.clear();
    rope_tables_.push_back({std::vector<float>(p.inv_freq, p.inv_freq + half), {}});
    cache = &rope_tables_.back();
  }
  std::vector<float>& table = cache->table;
  int32_t top = 0;
  for (int64_t r = 0; r < p.rows; ++r) top = std::max(top, p.positions[r]);
  const int64_t cached = static_cast<int64_t>(table.size()) / p.rotary_dims;
  if (top >= cached) {
    table.resize(static_cast<size_t>(top + 1) * p.rotary_dims);
    for (int64_t position = cached; position <= top; ++position) {
      float* row = table.data() + position * p.rotary_dims;
      for (int i = 0; i < half; ++i) {
        // As transformers computes it: a float32 angle, then float32 cos and sin.
        const float angle = static_cast<float>(position) * p.inv_freq[i];
        row[i] = std::cos(angle);
        row[half + i] = std::sin(angle);
      }
    }
  }
  return table.data();
}

void CpuBackend::Rope(const RopeParams& p) {
  auto trace = Trace("rope");
  if (p.rows <= 0) return;
  const float* table = p.rotary_dims > 0 ? RopeTable(p) : nullptr;
  WithVec(isa_, [&]<class V>() {
    Split(pool_, p.rows, p.rows * p.heads * p.head_dim * 4,
          [&](int64_t r0, int64_t r1) { RopeRows<V>(p, table, r0, r1); });
  });
}

void CpuBackend::KvWrite(const KvWriteParams& p) {
  auto trace = Trace("kv_write");
  if (IsRotatedKv(p.cache.format)) {
    // (Rows write disjoint positions.)
    Split(pool_, p.rows, p.rows * p.kv_heads * p.head_dim * 16,
          [&](int64_t r0, int64_t r1) { RotatedKvWriteRows(p, r0, r1); });
    return;
  }
  const int64_t width = static_cast<int64_t>(p.kv_heads) * p.head_dim;
  WithVec(isa_, [&]<class V>() {
    for (int64_t r = 0; r < p.rows; ++r) {
      const int32_t position = p.positions[r];
      const int32_t block = position / kPage;
      DCHECK(block < p.table.max_pages);
      const int64_t page =
          p.table.pages[static_cast<int64_t>(p.slots[r]) * p.table.max_pages + block];
      DCHECK(page >= 0);
      const int64_t at = (page * kPage + position % kPage) * width;
      if (p.cache.format == KvFormat::kQ8) {
        auto* keys = static_cast<int8_t*>(p.cache.keys) + at;
        auto* values = static_cast<int8_t*>(p.cache.values) + at;
        const int64_t scale_at = (page * kPage + position % kPage) * p.kv_heads;
        for (int h = 0; h < p.kv_heads; ++h) {
          const int64_t i = static_cast<int64_t>(h) * p.head_dim;
          p.cache.key_scales[scale_at + h] =
              V::QuantizeRow(p.k + r * width + i, p.head_dim, keys + i);
          p.cache.value_scales[scale_at + h] =
              V::QuantizeRow(p.v + r * width + i, p.head_dim, values + i);
        }
      } else if (p.cache.format == KvFormat::kF16) {
        V::FloatsToHalves(p.k + r * width, width, static_cast<uint16_t*>(p.cache.keys) + at);
        V::FloatsToHalves(p.v + r * width, width, static_cast<uint16_t*>(p.cache.values) + at);
      } else {
        std::memcpy(p.cache.keys_f32() + at, p.k + r * width, width * sizeof(float));
        std::memcpy(p.cache.values_f32() + at, p.v + r * width, width * sizeof(float));
      }
    }
  });
}

void CpuBackend::Attention(const AttentionParams& p) {
  auto trace = Trace("attention");
  if (p.rows <= 0) return;
  if (IsRotatedKv(p.cache.format)) return RotatedAttention(p, pool_);
  const int group = p.heads / p.kv_heads;
  const int threads = pool_->threads();
#if defined(__x86_64__)
  // Runs of a slot's rows at consecutive positions (prompts) in tiles of 16 lanes (AVX-512,
  // head_dim a multiple of 16, at most 8 query heads a kv head); other rows alone, below.
  const int tile_rows = kTileLanes / std::min(group, kTileLanes);
  // (The tiles have no soft-capping: Gemma 2's capped scores take the rows alone.)
  if (isa_ == CpuIsa::kAvx512 && p.head_dim % 16 == 0 && tile_rows >= 2 && p.rows >= 2 &&
      p.softcap == 0) {
    tiles_.clear();  // (first row, rows)
    for (int64_t r = 0; r < p.rows;) {
      int64_t n = 1;
      while (r + n < p.rows && n < tile_rows && p.slots[r + n] == p.slots[r] &&
             p.positions[r + n] == p.positions[r] + n) {
        ++n;
      }
      tiles_.push_back({r, n});
      r += n;
    }
    if (tiles_.size() < static_cast<size_t>(p.rows)) {
      const int64_t per_thread =
          std::max(TileScratchFloats(p.head_dim), int64_t{std::min(group, kMaxHeads)} * p.head_dim);
      float* scratch = tile_attention_.Get(static_cast<size_t>(threads) * per_thread);
      auto run = [&](int64_t i, int thread) {
        const auto [r0, n] = tiles_[i];
        float* mine = scratch + thread * per_thread;
        if (n >= 2) return AttentionRowsTiled(p, r0, static_cast<int>(n), mine);
        WithVec(isa_, [&]<class V>() { AttentionTask<V>(p, r0, 0, p.kv_heads, mine); });
      };
      const int64_t count = static_cast<int64_t>(tiles_.size());
      if (threads == 1 || count == 1) {
        for (int64_t i = 0; i < count; ++i) run(i, 0);
      } else {
        pool_->ForEachAffine(count, run);
      }
      return;
    }
  }
#endif
  const int per_thread = std::min(group, kMaxHeads) * p.head_dim;
  float* scratch = attention_.Get(static_cast<size_t>(threads) * per_thread);
  // Work: every query head reads its context once for scores and once for values.
  int64_t work = 0;
  for (int64_t r = 0; r < p.rows; ++r) {
    int64_t context =
        p.window > 0 ? std::min<int64_t>(p.window, p.positions[r] + 1) : p.positions[r] + 1;
    work += context * p.heads * p.head_dim * 2;
  }
  // A task a row (all its kv heads, the first fetching for the rest) where the calling thread
  // runs them all or the rows are enough to share among the threads; else a task a kv head of a
  // row (one decoding sequence's heads on both threads).
  const bool inline_tasks = threads == 1 || work < kInlineElements;
  const bool whole_rows = inline_tasks || p.rows >= 2 * threads;
  const int per_task = whole_rows ? p.kv_heads : 1;
  const int64_t tasks = p.rows * (p.kv_heads / per_task);
  WithVec(isa_, [&]<class V>() {
    auto run = [&](int64_t task, int thread) {
      const int64_t unit = task * per_task;  // row * kv_heads + first kv head
      const int kvh = static_cast<int>(unit % p.kv_heads);
      AttentionTask<V>(p, unit / p.kv_heads, kvh, kvh + per_task,
                       scratch + static_cast<int64_t>(thread) * per_thread);
    };
    if (inline_tasks || tasks == 1) {
      for (int64_t t = 0; t < tasks; ++t) run(t, 0);
    } else {
      // The same rows on the same thread each step where it keeps up: their KV pages stay in
      // its core's caches.
      pool_->ForEachAffine(tasks, run);
    }
  });
}

void CpuBackend::Glu(const GluParams& p) {
  auto trace = Trace("glu");
  WithVec(isa_, [&]<class V>() {
    Split(pool_, (p.n + 1023) / 1024, p.n * 8, [&](int64_t b0, int64_t b1) {
      const int64_t i0 = b0 * 1024, i1 = std::min(p.n, b1 * 1024);
      if (p.act == Activation::kSilu) {
        V::SwiGlu(p.out + i0, p.gate + i0, p.up + i0, i1 - i0);
      } else if (p.act == Activation::kSigmoid) {
        for (int64_t i = i0; i < i1; ++i) p.out[i] = p.up[i] / (1.0f + std::exp(-p.gate[i]));
      } else {
        GeluTanhGlu(p.out + i0, p.gate + i0, p.up + i0, i1 - i0);
      }
    });
  });
}

void CpuBackend::Softcap(const SoftcapParams& p) {
  auto trace = Trace("softcap");
  Split(pool_, (p.n + 1023) / 1024, p.n * 8, [&](int64_t b0, int64_t b1) {
    const int64_t i1 = std::min(p.n, b1 * 1024);
    for (int64_t i = b0 * 1024; i < i1; ++i) p.x[i] = p.cap * std::tanh(p.x[i] / p.cap);
  });
}

void CpuBackend::Add(const AddParams& p) {
  auto trace = Trace("add");
  WithVec(isa_, [&]<class V>() {
    Split(pool_, (p.n + 1023) / 1024, p.n, [&](int64_t b0, int64_t b1) {
      const int64_t i0 = b0 * 1024, i1 = std::min(p.n, b1 * 1024);
      V::Sum(p.out + i0, p.out + i0, p.x + i0, i1 - i0);
    });
  });
}

void CpuBackend::GatherRows(const GatherRowsParams& p) {
  auto trace = Trace("gather_rows");
  for (int64_t i = 0; i < p.count; ++i) {
    std::memcpy(p.out + i * p.dim, p.x + static_cast<int64_t>(p.index[i]) * p.dim,
                sizeof(float) * p.dim);
  }
}

void CpuBackend::MoeFeedForward(const MoeFeedForwardParams& p) {
  auto trace = Trace("moe");
  if (p.rows <= 0) return;
  const int64_t n = p.rows, dim = p.dim, ffn = p.ffn;
  const int experts = p.experts, k = p.top_k;
  MoeScratch& m = moe_;
  m.logits.resize(n * experts);
  MatmulParams router;
  router.x = p.x;
  router.rows = n;
  router.w[0] = p.router;
  router.out[0] = m.logits.data();
  Matmul(router);
  // Routing, per row: softmax in float32, the top k (lowest index first among equals).
  m.by_expert.resize(experts);
  for (auto& rows : m.by_expert) rows.clear();
  m.weights.resize(k);
  m.picked.resize(k);
  for (int64_t r = 0; r < n; ++r) {
    float* z = m.logits.data() + r * experts;
    float max = z[0];
    for (int e = 1; e < experts; ++e) max = std::max(max, z[e]);
    float total = 0.0f;
    for (int e = 0; e < experts; ++e) {
      z[e] = std::exp(z[e] - max);
      total += z[e];
    }
    for (int e = 0; e < experts; ++e) z[e] /= total;
    for (int j = 0; j < k; ++j) {
      int best = -1;
      for (int e = 0; e < experts; ++e) {
        if (std::find(m.picked.begin(), m.picked.begin() + j, e) != m.picked.begin() + j) continue;
        if (best < 0 || z[e] > z[best]) best = e;
      }
      m.picked[j] = best;
      m.weights[j] = z[best];
    }
    if (p.norm_topk_prob) {
      float sum = 0.0f;
      for (int j = 0; j < k; ++j) sum += m.weights[j];
      for (int j = 0; j < k; ++j) m.weights[j] /= sum;
    }
    for (int j = 0; j < k; ++j) {
      m.by_expert[m.picked[j]].push_back({static_cast<int32_t>(r), m.weights[j]});
    }
  }
  // Each expert's rows together, the experts in index order; sum[r] gathers row r's weighted
  // outputs in that order.
  m.sum.assign(n * dim, 0.0f);
  for (int e = 0; e < experts; ++e) {
    const auto& rows = m.by_expert[e];
    const int64_t count = static_cast<int64_t>(rows.size());
    if (count == 0) continue;
    m.rows_in.resize(count * dim);
    m.gate.resize(count * ffn);
    m.up.resize(count * ffn);
    m.rows_out.resize(count * dim);
    for (int64_t i = 0; i < count; ++i) {
      std::memcpy(m.rows_in.data() + i * dim, p.x + static_cast<int64_t>(rows[i].first) * dim,
                  sizeof(float) * dim);
    }
    MatmulParams gate_up;
    gate_up.x = m.rows_in.data();
    gate_up.rows = count;
    gate_up.outputs = 2;
    gate_up.w[0] = &p.gate[e], gate_up.w[1] = &p.up[e];
    gate_up.out[0] = m.gate.data(), gate_up.out[1] = m.up.data();
    gate_up.swiglu = true;
    Matmul(gate_up);
    MatmulParams down;
    down.x = m.gate.data();
    down.rows = count;
    down.w[0] = &p.down[e];
    down.out[0] = m.rows_out.data();
    Matmul(down);
    for (int64_t i = 0; i < count; ++i) {
      float* to = m.sum.data() + static_cast<int64_t>(rows[i].first) * dim;
      const float* y = m.rows_out.data() + i * dim;
      const float w = rows[i].second;
      for (int64_t c = 0; c < dim; ++c) to[c] += y[c] * w;
    }
  }
  if (p.shared_ffn > 0) {
    // The shared expert over every row, gated per row by sigmoid(x G^T), after the routed sum.
    const int64_t sf = p.shared_ffn;
    m.gate.resize(n * sf);
    m.up.resize(n * sf);
    m.rows_out.resize(n * dim);
    MatmulParams gate_up;
    gate_up.x = p.x;
    gate_up.rows = n;
    gate_up.outputs = 2;
    gate_up.w[0] = p.shared_gate, gate_up.w[1] = p.shared_up;
    gate_up.out[0] = m.gate.data(), gate_up.out[1] = m.up.data();
    gate_up.swiglu = true;
    Matmul(gate_up);
    MatmulParams down;
    down.x = m.gate.data();
    down.rows = n;
    down.w[0] = p.shared_down;
    down.out[0] = m.rows_out.data();
    Matmul(down);
    m.weights.assign(n, 1.0f);
    if (p.shared_scale) {
      MatmulParams scale;
      scale.x = p.x;
      scale.rows = n;
      scale.w[0] = p.shared_scale;
      scale.out[0] = m.weights.data();
      Matmul(scale);
      for (int64_t r = 0; r < n; ++r) m.weights[r] = 1.0f / (1.0f + std::exp(-m.weights[r]));
    }
    for (int64_t r = 0; r < n; ++r) {
      float* to = m.sum.data() + r * dim;
      const float* y = m.rows_out.data() + r * dim;
      const float w = m.weights[r];
      for (int64_t c = 0; c < dim; ++c) to[c] += w * y[c];
    }
  }
  if (p.accumulate) {
    Add({p.out, m.sum.data(), n * dim});
  } else {
    std::memcpy(p.out, m.sum.data(), sizeof(float) * n * dim);
  }
}

OpScope CpuBackend::Trace(const char* op) {
  if (op_trace_ && op_depth_ == 0) {
    const auto now = std::chrono::steady_clock::now();
    if (op_name_) {
      op_totals_.Add(op_name_, std::chrono::duration<double, std::milli>(now - op_start_).count());
    }
    op_name_ = op;
    op_start_ = now;
  }
  return OpScope(&op_depth_);
}

bool CpuBackend::SetOpTrace(bool on) {
  op_trace_ = on;
  op_name_ = nullptr;
  op_totals_.Take();
  return true;
}

std::vector<OpTime> CpuBackend::TakeOpTrace() {
  if (op_name_) {
    const auto now = std::chrono::steady_clock::now();
    op_totals_.Add(op_name_, std::chrono::duration<double, std::milli>(now - op_start_).count());
    op_name_ = nullptr;
  }
  return op_totals_.Take();
}

void CpuBackend::CausalConv(const CausalConvParams& p) {
  auto trace = Trace("causal_conv");
  if (p.rows <= 0) return;
  const int64_t channels = p.channels;
  const int tail = p.kernel - 1;
  // Channels in blocks of 64 a task; each task walks the rows in order, so a slot's state
  // advances row by row within the task's channels.
  constexpr int64_t kBlock = 64;
  Split(pool_, (channels + kBlock - 1) / kBlock, p.rows * channels * p.kernel,
        [&](int64_t b0, int64_t b1) {
          const int64_t c0 = b0 * kBlock, c1 = std::min(channels, b1 * kBlock);
          for (int64_t r = 0; r < p.rows; ++r) {
            float* state = p.states + static_cast<int64_t>(p.slots[r]) * tail * channels;
            if (p.positions[r] == 0) {
              for (int j = 0; j < tail; ++j)
                std::fill(state + j * channels + c0, state + j * channels + c1, 0.0f);
            }
            float* x = p.x + r * p.row_stride;
            for (int64_t c = c0; c < c1; ++c) {
              const float* w = p.weight + c * p.kernel;
              const float now = x[c];
              float sum = 0.0f;
              for (int j = 0; j < tail; ++j) sum += w[j] * state[j * channels + c];
              sum += w[tail] * now;
              x[c] = sum / (1.0f + std::exp(-sum));
              for (int j = 0; j + 1 < tail; ++j)
                state[j * channels + c] = state[(j + 1) * channels + c];
              state[(tail - 1) * channels + c] = now;
            }
          }
        });
}

void CpuBackend::L2Norm(const L2NormParams& p) {
  auto trace = Trace("l2_norm");
  Split(pool_, p.rows, p.rows * p.heads * p.dim, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int h = 0; h < p.heads; ++h) {
        float* x = p.x + r * p.row_stride + static_cast<int64_t>(h) * p.dim;
        float ss = 0.0f;
        for (int i = 0; i < p.dim; ++i) ss += x[i] * x[i];
        const float inv = 1.0f / std::sqrt(ss + p.eps);
        for (int i = 0; i < p.dim; ++i) x[i] *= inv;
      }
    }
  });
}

namespace {

float Softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// One value head of one run of a slot's rows: rows [r0, r0 + n), state st [k_dim, v_dim].
void DeltaRuleRun(const GatedDeltaRuleParams& p, int64_t r0, int64_t n, int h, float* st) {
  const int64_t kd = p.k_dim, vd = p.v_dim;
  const int group = p.v_heads / p.k_heads;
  const int64_t kh = h / group;
  auto q_of = [&](int64_t r) { return p.q + r * p.qk_stride + kh * kd; };
  auto k_of = [&](int64_t r) { return p.k + r * p.qk_stride + kh * kd; };
  auto v_of = [&](int64_t r) { return p.v + r * p.v_stride + static_cast<int64_t>(h) * vd; };
  auto out_of = [&](int64_t r) { return p.out + (r * p.v_heads + h) * vd; };
  auto gate = [&](int64_t r) {
    return -std::exp(p.a_log[h]) * Softplus(p.a[r * p.ab_stride + h] + p.dt_bias[h]);
  };
  auto beta_of = [&](int64_t r) { return 1.0f / (1.0f + std::exp(-p.b[r * p.ab_stride + h])); };
  if (n == 1) {
    // The recurrence: kv = (decay S)^T k; delta = beta (v - kv); S = decay S + k delta^T;
    // out = S^T (scale q). Two passes over S.
    const float decay = std::exp(gate(r0)), beta = beta_of(r0);
    const float *q = q_of(r0), *k = k_of(r0), *v = v_of(r0);
    float* out = out_of(r0);
    std::vector<float> delta(vd, 0.0f);
    for (int64_t i = 0; i < kd; ++i) {
      const float* s = st + i * vd;
      for (int64_t j = 0; j < vd; ++j) delta[j] += s[j] * k[i];
    }
    for (int64_t j = 0; j < vd; ++j) delta[j] = beta * (v[j] - decay * delta[j]);
    std::fill(out, out + vd, 0.0f);
    for (int64_t i = 0; i < kd; ++i) {
      float* s = st + i * vd;
      const float ki = k[i], qi = p.scale * q[i];
      for (int64_t j = 0; j < vd; ++j) {
        s[j] = decay * s[j] + ki * delta[j];
        out[j] += qi * s[j];
      }
    }
    return;
  }
  // Chunks of c rows from state S0: with G the running sum of g within the chunk,
  //   delta_t = beta_t (v_t - e^G_t S0^T k_t - sum_{s<t} e^(G_t - G_s) (k_s.k_t) delta_s)
  //   out_t = e^G_t S0^T q_t + sum_{s<=t} e^(G_t - G_s) (k_s.q_t) delta_s   (q scaled)
  //   S = e^G_last S0 + sum_s e^(G_last - G_s) k_s delta_s^T
  // so S is read for all the chunk's rows at once and written once.
  const int64_t chunk = std::min<int64_t>(p.chunk, n);
  std::vector<float> g(chunk), beta(chunk), kk(chunk * chunk), kq(chunk * chunk);
  std::vector<float> sk(chunk * vd), sq(chunk * vd), delta(chunk * vd), qs(chunk * kd);
  for (int64_t c0 = 0; c0 < n; c0 += chunk) {
    const int64_t c = std::min(chunk, n - c0);
    float total = 0.0f;
    for (int64_t t = 0; t < c; ++t) {
      total += gate(r0 + c0 + t);
      g[t] = total;
      beta[t] = beta_of(r0 + c0 + t);
      const float* q = q_of(r0 + c0 + t);
      for (int64_t i = 0; i < kd; ++i) qs[t * kd + i] = p.scale * q[i];
    }
    // k_s.k_t (s < t) and k_s.q_t (s <= t).
    for (int64_t t = 0; t < c; ++t) {
      const float* kt = k_of(r0 + c0 + t);
      const float* qt = qs.data() + t * kd;
      for (int64_t s2 = 0; s2 <= t; ++s2) {
        const float* ks = k_of(r0 + c0 + s2);
        float dk = 0.0f, dq = 0.0f;
        for (int64_t i = 0; i < kd; ++i) {
          dk += ks[i] * kt[i];
          dq += ks[i] * qt[i];
        }
        kk[t * chunk + s2] = dk;
        kq[t * chunk + s2] = dq;
      }
    }
    // S0^T k_t and S0^T q_t, S0's rows read once for the chunk.
    std::fill(sk.begin(), sk.begin() + c * vd, 0.0f);
    std::fill(sq.begin(), sq.begin() + c * vd, 0.0f);
    for (int64_t i = 0; i < kd; ++i) {
      const float* s = st + i * vd;
      for (int64_t t = 0; t < c; ++t) {
        const float ki = k_of(r0 + c0 + t)[i], qi = qs[t * kd + i];
        float* a = sk.data() + t * vd;
        float* b = sq.data() + t * vd;
        for (int64_t j = 0; j < vd; ++j) {
          a[j] += ki * s[j];
          b[j] += qi * s[j];
        }
      }
    }
    for (int64_t t = 0; t < c; ++t) {
      float* d = delta.data() + t * vd;
      const float* v = v_of(r0 + c0 + t);
      const float et = std::exp(g[t]);
      for (int64_t j = 0; j < vd; ++j) d[j] = v[j] - et * sk[t * vd + j];
      for (int64_t s2 = 0; s2 < t; ++s2) {
        const float w = std::exp(g[t] - g[s2]) * kk[t * chunk + s2];
        const float* ds = delta.data() + s2 * vd;
        for (int64_t j = 0; j < vd; ++j) d[j] -= w * ds[j];
      }
      for (int64_t j = 0; j < vd; ++j) d[j] *= beta[t];
      float* out = out_of(r0 + c0 + t);
      for (int64_t j = 0; j < vd; ++j) out[j] = et * sq[t * vd + j];
      for (int64_t s2 = 0; s2 <= t; ++s2) {
        const float w = std::exp(g[t] - g[s2]) * kq[t * chunk + s2];
        const float* ds = delta.data() + s2 * vd;
        for (int64_t j = 0; j < vd; ++j) out[j] += w * ds[j];
      }
    }
    const float last = g[c - 1];
    const float e_last = std::exp(last);
    for (int64_t t = 0; t < c; ++t) {
      float* d = delta.data() + t * vd;
      const float w = std::exp(last - g[t]);
      for (int64_t j = 0; j < vd; ++j) d[j] *= w;
    }
    for (int64_t i = 0; i < kd; ++i) {
      float* s = st + i * vd;
      for (int64_t j = 0; j < vd; ++j) s[j] *= e_last;
      for (int64_t t = 0; t < c; ++t) {
        const float ki = k_of(r0 + c0 + t)[i];
        const float* d = delta.data() + t * vd;
        for (int64_t j = 0; j < vd; ++j) s[j] += ki * d[j];
      }
    }
  }
}

}  // namespace

void CpuBackend::GatedDeltaRule(const GatedDeltaRuleParams& p) {
  auto trace = Trace("gated_delta_rule");
  if (p.rows <= 0) return;
  // Runs of adjacent rows of one slot; a task is one value head of one run.
  std::vector<std::pair<int64_t, int64_t>> runs;  // (first row, rows)
  for (int64_t r = 0; r < p.rows; ++r) {
    if (!runs.empty() && p.slots[r] == p.slots[runs.back().first] &&
        p.positions[r] == p.positions[r - 1] + 1) {
      ++runs.back().second;
    } else {
      runs.push_back({r, 1});
    }
  }
  const int64_t head_state = static_cast<int64_t>(p.k_dim) * p.v_dim;
  const int64_t tasks = static_cast<int64_t>(runs.size()) * p.v_heads;
  auto run = [&](int64_t task) {
    const auto [r0, n] = runs[task / p.v_heads];
    const int h = static_cast<int>(task % p.v_heads);
    float* st = p.states + (static_cast<int64_t>(p.slots[r0]) * p.v_heads + h) * head_state;
    if (p.positions[r0] == 0) std::fill(st, st + head_state, 0.0f);
    DeltaRuleRun(p, r0, n, h, st);
  };
  Split(pool_, tasks, p.rows * p.v_heads * head_state * 3, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) run(t);
  });
}

void CpuBackend::GatedRmsNorm(const GatedRmsNormParams& p) {
  auto trace = Trace("gated_rms_norm");
  Split(pool_, p.groups, p.groups * p.dim, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      const float* x = p.x + g * p.dim;
      const float* z = p.z + g * p.dim;
      float* out = p.out + g * p.dim;
      float ss = 0.0f;
      for (int64_t i = 0; i < p.dim; ++i) ss += x[i] * x[i];
      const float inv = 1.0f / std::sqrt(ss / static_cast<float>(p.dim) + p.eps);
      for (int64_t i = 0; i < p.dim; ++i) {
        const float zi = z[i];
        out[i] = p.weight[i] * (x[i] * inv) * (zi / (1.0f + std::exp(-zi)));
      }
    }
  });
}

void CpuBackend::LayerNorm(const LayerNormParams& p) {
  auto trace = Trace("layer_norm");
  Split(pool_, p.rows, p.rows * p.dim, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* x = p.x + r * p.dim;
      const float* res = p.residual ? p.residual + r * p.dim : nullptr;
      float* out = p.out + r * p.dim;
      // Two passes over the row, as torch's layer_norm: the mean, then the centred squares.
      float mean = 0.0f;
      for (int64_t i = 0; i < p.dim; ++i) {
        const float y = res ? x[i] + res[i] : x[i];
        out[i] = y;
        mean += y;
      }
      mean /= static_cast<float>(p.dim);
      float var = 0.0f;
      for (int64_t i = 0; i < p.dim; ++i) var += (out[i] - mean) * (out[i] - mean);
      const float inv = 1.0f / std::sqrt(var / static_cast<float>(p.dim) + p.eps);
      for (int64_t i = 0; i < p.dim; ++i) out[i] = (out[i] - mean) * inv * p.weight[i] + p.bias[i];
    }
  });
}

void CpuBackend::Gelu(const GeluParams& p) {
  auto trace = Trace("gelu");
  Split(pool_, (p.n + 1023) / 1024, p.n * 8, [&](int64_t b0, int64_t b1) {
    const int64_t i1 = std::min(p.n, b1 * 1024);
    for (int64_t i = b0 * 1024; i < i1; ++i) {
      p.x[i] = 0.5f * p.x[i] * (1.0f + std::erf(p.x[i] * 0.70710678118654752f));
    }
  });
}

void CpuBackend::MeanRows(const MeanRowsParams& p) {
  auto trace = Trace("mean_rows");
  if (p.sequences <= 0) return;
  Split(pool_, p.sequences, p.starts[p.sequences] * p.dim, [&](int64_t s0, int64_t s1) {
    std::vector<double> sum(p.dim);
    for (int64_t s = s0; s < s1; ++s) {
      const int64_t first = p.starts[s], end = p.starts[s + 1];
      std::fill(sum.begin(), sum.end(), 0.0);
      for (int64_t r = first; r < end; ++r) {
        const float* x = p.x + r * p.dim;
        for (int64_t i = 0; i < p.dim; ++i) sum[i] += x[i];
      }
      float* out = p.out + s * p.dim;
      for (int64_t i = 0; i < p.dim; ++i)
        out[i] = static_cast<float>(sum[i] / static_cast<double>(end - first));
    }
  });
}

void CpuBackend::Sample(const SampleParams& p) {
  auto trace = Trace("sample");
  if (p.rows <= 0) return;
  if (samplers_.size() != static_cast<size_t>(pool_->threads())) samplers_.resize(pool_->threads());
  const int64_t words = MaskWords(p.vocab);
  auto pick = [&](int64_t r, int thread) {
    std::unique_ptr<Sampler>& sampler = samplers_[thread];
    if (!sampler || sampler->vocab() != p.vocab) sampler = std::make_unique<Sampler>(p.vocab);
    const SampleRow& row = p.params[r];
    std::span<const uint64_t> allowed;
    if (row.mask >= 0) allowed = {p.masks + row.mask * words, static_cast<size_t>(words)};
    p.tokens[r] =
        sampler->Sample({p.logits + r * p.vocab, static_cast<size_t>(p.vocab)}, row, allowed);
  };
  if (pool_->threads() == 1 || p.rows == 1) {
    for (int64_t r = 0; r < p.rows; ++r) pick(r, 0);
    return;
  }
  pool_->ParallelFor(p.rows, 1, [&](int64_t begin, int64_t end, int thread) {
    for (int64_t r = begin; r < end; ++r) pick(r, thread);
  });
}

void CpuBackend::EncoderAttention(const EncoderAttentionParams& p) {
  auto trace = Trace("encoder_attention");
  if (p.rows <= 0) return;
  const int64_t width = static_cast<int64_t>(p.heads) * p.head_dim;
  int64_t longest = 0;
  for (int s = 0; s < p.sequences; ++s)
    longest = std::max<int64_t>(longest, p.starts[s + 1] - p.starts[s]);
  Split(pool_, p.rows * p.heads, p.rows * longest * width, [&](int64_t t0, int64_t t1) {
    std::vector<float> scores(longest);  // one a task range: a few a step
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t r = t / p.heads;
      const int h = static_cast<int>(t % p.heads);
      // The row's sequence: the last start at or before r.
      const int s =
          static_cast<int>(std::upper_bound(p.starts, p.starts + p.sequences + 1, r) - p.starts) -
          1;
      const int64_t first = p.starts[s], end = p.starts[s + 1];
      const float* q = p.q + r * width + h * p.head_dim;
      float max = -std::numeric_limits<float>::infinity();
      for (int64_t j = first; j < end; ++j) {
        const float* k = p.k + j * width + h * p.head_dim;
        float dot = 0.0f;
        for (int d = 0; d < p.head_dim; ++d) dot += q[d] * k[d];
        scores[j - first] = p.scale * dot;
        max = std::max(max, scores[j - first]);
      }
      float sum = 0.0f;
      for (int64_t j = first; j < end; ++j)
        sum += (scores[j - first] = std::exp(scores[j - first] - max));
      float* out = p.out + r * width + h * p.head_dim;
      std::fill(out, out + p.head_dim, 0.0f);
      for (int64_t j = first; j < end; ++j) {
        const float w = scores[j - first] / sum;
        const float* v = p.v + j * width + h * p.head_dim;
        for (int d = 0; d < p.head_dim; ++d) out[d] += w * v[d];
      }
    }
  });
}

std::unique_ptr<Backend> MakeCpuBackend(ThreadPool* pool) {
  return std::make_unique<CpuBackend>(pool, CpuOptions{});
}

Expected<std::unique_ptr<Backend>> MakeCpuBackend(ThreadPool* pool, const CpuOptions& options) {
  GZ_RETURN_IF_ERROR(options.Check());
  return std::unique_ptr<Backend>(std::make_unique<CpuBackend>(pool, options));
}

}  // namespace gizllm
