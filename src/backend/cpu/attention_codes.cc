#include "backend/cpu/attention_codes.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/check.h"
#include "ops/kv_codes.h"

namespace gizllm {
namespace {

// The codes are read centered, c - 2^(B-1) (exact in float32; 4 bits: kv::kLevels4[c], centered
// already), with the vector's mid value min + step * 2^(B-1) (4 bits: min) beside them: both sums
// then are of terms as large as the values themselves, not of codes times the step that cancel
// against the min.
template <int B>
constexpr float kCenter = B == 4 ? 0.0f : static_cast<float>(1 << (B - 1));

// sum_i q[i] * (c_i - center) over the n codes of a vector of B bits (n a multiple of 8).
template <int B>
float DotCodes(const float* q, const uint8_t* codes, int n) {
  constexpr float c0 = kCenter<B>;
  float sum[8] = {};
  if constexpr (B == 8) {
    for (int i = 0; i < n; i += 8)
      for (int j = 0; j < 8; ++j) sum[j] += q[i + j] * (static_cast<float>(codes[i + j]) - c0);
  } else if constexpr (B == 4) {
    for (int i = 0; i < n; i += 8)
      for (int j = 0; j < 4; ++j) {
        const uint8_t b = codes[(i >> 1) + j];
        sum[2 * j] += q[i + 2 * j] * kv::kLevels4[b & 15];
        sum[2 * j + 1] += q[i + 2 * j + 1] * kv::kLevels4[b >> 4];
      }
  } else {
    for (int i = 0; i < n; i += 8)
      for (int j = 0; j < 2; ++j) {
        const uint8_t b = codes[(i >> 2) + j];
        for (int k = 0; k < 4; ++k)
          sum[4 * j + k] += q[i + 4 * j + k] * (static_cast<float>((b >> (2 * k)) & 3) - c0);
      }
  }
  return ((sum[0] + sum[1]) + (sum[2] + sum[3])) + ((sum[4] + sum[5]) + (sum[6] + sum[7]));
}

// acc[i] += w * (c_i - center) over the n codes of a vector of B bits.
template <int B>
void AddCodes(float* acc, float w, const uint8_t* codes, int n) {
  constexpr float c0 = kCenter<B>;
  if constexpr (B == 8) {
    for (int i = 0; i < n; ++i) acc[i] += w * (static_cast<float>(codes[i]) - c0);
  } else if constexpr (B == 4) {
    for (int i = 0; i < n; i += 2) {
      const uint8_t b = codes[i >> 1];
      acc[i] += w * kv::kLevels4[b & 15];
      acc[i + 1] += w * kv::kLevels4[b >> 4];
    }
  } else {
    for (int i = 0; i < n; i += 4) {
      const uint8_t b = codes[i >> 2];
      for (int k = 0; k < 4; ++k) acc[i + k] += w * (static_cast<float>((b >> (2 * k)) & 3) - c0);
    }
  }
}

// All query heads of kv head kvh of row r.
template <int KB, int VB>
void AttentionTask(const AttentionParams& p, int64_t r, int kvh, std::vector<float>& scratch) {
  const int group = p.heads / p.kv_heads;
  const int hd = p.head_dim;
  const int64_t key_bytes = KvKeyBytes(p.cache.format, hd);
  const int64_t value_bytes = KvValueBytes(p.cache.format, hd);
  // Code groups of a vector: `parts` of `part` channels, each with its step and min.
  const int part = kv::GroupSize(hd), parts = kv::Groups(hd);
  scratch.resize(static_cast<size_t>(group) * (2 * hd + kPage + 2 + 2 * parts));
  float* q = scratch.data();                   // [group, hd]: rotated, times the scale
  float* acc = q + group * hd;                 // [group, hd]: sum of w * step * centered codes
  float* s = acc + group * hd;                 // [group, kPage]: a page's scores, then weights
  float* q_sum = s + group * kPage;            // [group, parts]: sums of q over each part
  float* mid_sum = q_sum + group * parts;      // [group, parts]: sum of w * mid
  float* max_score = mid_sum + group * parts;  // [group]
  float* total = max_score + group;            // [group]
  for (int g = 0; g < group; ++g) {
    float* qg = q + g * hd;
    std::memcpy(qg, p.q + (r * p.heads + kvh * group + g) * hd, sizeof(float) * hd);
    kv::Rotate(qg, hd);
    for (int c = 0; c < parts; ++c) {
      float sum = 0.0f;
      for (int i = c * part; i < (c + 1) * part; ++i) sum += (qg[i] *= p.scale);
      q_sum[g * parts + c] = sum;
      mid_sum[g * parts + c] = 0.0f;
    }
    max_score[g] = -std::numeric_limits<float>::infinity();
    total[g] = 0.0f;
  }
  std::memset(acc, 0, sizeof(float) * group * hd);
  const int32_t last = p.positions[r];
  const int32_t first = p.window > 0 ? std::max(0, last - p.window + 1) : 0;
  const int32_t* pages = p.table.pages + static_cast<int64_t>(p.slots[r]) * p.table.max_pages;
  const auto* keys = static_cast<const uint8_t*>(p.cache.keys);
  const auto* values = static_cast<const uint8_t*>(p.cache.values);
  for (int32_t block = first / kPage; block <= last / kPage; ++block) {
    const int32_t t0 = std::max(first, block * kPage) - block * kPage;
    const int32_t t1 = std::min(last, block * kPage + kPage - 1) - block * kPage + 1;
    const int count = t1 - t0;
    // Vector index of position t0 of this page, kv head kvh; a position steps kv_heads.
    const int64_t v0 = (static_cast<int64_t>(pages[block]) * kPage + t0) * p.kv_heads + kvh;
    for (int t = 0; t < count; ++t) {
      const int64_t v = v0 + static_cast<int64_t>(t) * p.kv_heads;
      const float* scales = p.cache.key_scales + 2 * parts * v;  // [parts, 2]
      const uint8_t* codes = keys + v * key_bytes;
      for (int g = 0; g < group; ++g) {
        float score = 0.0f;
        for (int c = 0; c < parts; ++c) {
          const float step = scales[2 * c], mid = scales[2 * c + 1] + step * kCenter<KB>;
          score += step * DotCodes<KB>(q + g * hd + c * part, codes + c * part * KB / 8, part) +
                   mid * q_sum[g * parts + c];
        }
        if (p.softcap > 0) score = p.softcap * std::tanh(score / p.softcap);
        s[g * kPage + t] = score;
      }
    }
    for (int g = 0; g < group; ++g) {
      float* sg = s + g * kPage;
      float new_max = max_score[g];
      for (int t = 0; t < count; ++t) new_max = std::max(new_max, sg[t]);
      // exp(-inf) on the first page: 0.
      const float correction = std::exp(max_score[g] - new_max);
      float sum = 0.0f;
      for (int t = 0; t < count; ++t) sum += (sg[t] = std::exp(sg[t] - new_max));
      total[g] = total[g] * correction + sum;
      for (int c = 0; c < parts; ++c) mid_sum[g * parts + c] *= correction;
      if (correction != 1.0f) {
        for (int i = 0; i < hd; ++i) acc[g * hd + i] *= correction;
      }
      max_score[g] = new_max;
    }
    for (int t = 0; t < count; ++t) {
      const int64_t v = v0 + static_cast<int64_t>(t) * p.kv_heads;
      const float* scales = p.cache.value_scales + 2 * parts * v;  // [parts, 2]
      const uint8_t* codes = values + v * value_bytes;
      for (int g = 0; g < group; ++g) {
        const float w = s[g * kPage + t];
        for (int c = 0; c < parts; ++c) {
          const float step = scales[2 * c], mid = scales[2 * c + 1] + step * kCenter<VB>;
          AddCodes<VB>(acc + g * hd + c * part, w * step, codes + c * part * VB / 8, part);
          mid_sum[g * parts + c] += w * mid;
        }
      }
    }
  }
  for (int g = 0; g < group; ++g) {
    float* a = acc + g * hd;
    const float inv = 1.0f / total[g];
    for (int i = 0; i < hd; ++i) a[i] = (a[i] + mid_sum[g * parts + i / part]) * inv;
    kv::Unrotate(a, hd);
    std::memcpy(p.out + (r * p.heads + kvh * group + g) * hd, a, sizeof(float) * hd);
  }
}

using TaskFn = void (*)(const AttentionParams&, int64_t, int, std::vector<float>&);

template <int KB>
TaskFn TaskFor(int value_bits) {
  return value_bits == 8   ? AttentionTask<KB, 8>
         : value_bits == 4 ? AttentionTask<KB, 4>
                           : AttentionTask<KB, 2>;
}

}  // namespace

void RotatedKvWriteRows(const KvWriteParams& p, int64_t r0, int64_t r1) {
  const int hd = p.head_dim;
  const int64_t width = static_cast<int64_t>(p.kv_heads) * hd;
  const int key_bits = KvKeyBits(p.cache.format), value_bits = KvValueBits(p.cache.format);
  const int64_t key_bytes = KvKeyBytes(p.cache.format, hd);
  const int64_t value_bytes = KvValueBytes(p.cache.format, hd);
  const int parts = kv::Groups(hd);
  std::vector<float> y(hd);
  for (int64_t r = r0; r < r1; ++r) {
    const int32_t position = p.positions[r];
    DCHECK(position / kPage < p.table.max_pages);
    const int64_t page =
        p.table.pages[static_cast<int64_t>(p.slots[r]) * p.table.max_pages + position / kPage];
    DCHECK(page >= 0);
    const int64_t v0 = (page * kPage + position % kPage) * p.kv_heads;
    for (int h = 0; h < p.kv_heads; ++h) {
      const int64_t v = v0 + h;
      std::memcpy(y.data(), p.k + r * width + h * hd, sizeof(float) * hd);
      kv::Rotate(y.data(), hd);
      kv::QuantizeVector(y.data(), hd, key_bits,
                         static_cast<uint8_t*>(p.cache.keys) + v * key_bytes,
                         p.cache.key_scales + 2 * parts * v);
      std::memcpy(y.data(), p.v + r * width + h * hd, sizeof(float) * hd);
      kv::Rotate(y.data(), hd);
      kv::QuantizeVector(y.data(), hd, value_bits,
                         static_cast<uint8_t*>(p.cache.values) + v * value_bytes,
                         p.cache.value_scales + 2 * parts * v);
    }
  }
}

void RotatedAttention(const AttentionParams& p, ThreadPool* pool) {
  const int key_bits = KvKeyBits(p.cache.format), value_bits = KvValueBits(p.cache.format);
  const TaskFn task = key_bits == 8   ? TaskFor<8>(value_bits)
                      : key_bits == 4 ? TaskFor<4>(value_bits)
                                      : TaskFor<2>(value_bits);
  const int64_t tasks = p.rows * p.kv_heads;
  auto run = [&](int64_t begin, int64_t end) {
    std::vector<float> scratch;
    for (int64_t i = begin; i < end; ++i)
      task(p, i / p.kv_heads, static_cast<int>(i % p.kv_heads), scratch);
  };
  if (pool->threads() == 1 || tasks == 1) {
    run(0, tasks);
  } else {
    pool->ParallelFor(tasks, 1, [&](int64_t begin, int64_t end, int) { run(begin, end); });
  }
}

}  // namespace gizllm
