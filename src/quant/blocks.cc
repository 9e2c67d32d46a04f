#include "quant/blocks.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "core/dtype.h"
#include "formats/ggml_blocks.h"

namespace gizllm::quant {
namespace {

constexpr int kBlock = 128, kGroupSize = 32;

// The code of the level nearest t (in units of the scale): GZ8 the integer (ties to even,
// clamped to +-127), GZ4 the index into kGz4Levels (ties to the lower level).
template <bool kFour>
inline int Nearest(float t) {
  if constexpr (kFour) {
    int q = 0;
    // Midpoints between neighbouring levels: code q for t above the first q midpoints.
    for (int i = 0; i < 15; ++i) {
      q += t > 0.5f * (static_cast<float>(kGz4Levels[i]) + static_cast<float>(kGz4Levels[i + 1]));
    }
    return q;
  } else {
    const float r = std::nearbyint(std::clamp(t, -127.0f, 127.0f));
    return static_cast<int>(r);
  }
}

template <bool kFour>
inline float Level(int q) {
  if constexpr (kFour) {
    return static_cast<float>(kGz4Levels[q]);
  } else {
    return static_cast<float>(q);
  }
}

// Squared error of x [n] at scale s (each value its nearest level times s); codes into q when
// given.
template <bool kFour>
float Error(const float* x, int n, float s, int* q) {
  float err = 0.0f;
  const float inv = 1.0f / s;
  for (int i = 0; i < n; ++i) {
    const int c = Nearest<kFour>(x[i] * inv);
    if (q) q[i] = c;
    const float e = x[i] - s * Level<kFour>(c);
    err += e * e;
  }
  return err;
}

// The group's best scale on its own (see blocks.h); 0 for a group of zeros.
template <bool kFour>
float GroupScale(const float* x) {
  float amax = 0.0f;
  for (int i = 0; i < kGroupSize; ++i) amax = std::max(amax, std::fabs(x[i]));
  if (!(amax > 0.0f)) return 0.0f;
  const float base = amax / 127.0f;
  float best = base, best_err = Error<kFour>(x, kGroupSize, base, nullptr);
  int q[kGroupSize];
  for (int k = -16; k <= 16; ++k) {
    const float s = base * (1.0f + 0.02f * static_cast<float>(k));
    const float e = Error<kFour>(x, kGroupSize, s, q);
    if (e < best_err) best_err = e, best = s;
    // The least-squares scale for these codes.
    float num = 0.0f, den = 0.0f;
    for (int i = 0; i < kGroupSize; ++i) {
      const float c = Level<kFour>(q[i]);
      num += x[i] * c;
      den += c * c;
    }
    if (den > 0.0f && num > 0.0f) {
      const float refit = num / den;
      const float e2 = Error<kFour>(x, kGroupSize, refit, nullptr);
      if (e2 < best_err) best_err = e2, best = refit;
    }
  }
  return best;
}

template <bool kFour>
void Block(const float* x, uint8_t* out) {
  constexpr int kBytes = kFour ? 70 : 134;
  std::memset(out, 0, kBytes);
  float scales[4], smax = 0.0f;
  for (int g = 0; g < 4; ++g) {
    scales[g] = GroupScale<kFour>(x + kGroupSize * g);
    smax = std::max(smax, scales[g]);
  }
  // d: the largest scale rounded up to an f16 (every group's factor kGzScales[s] <= 1).
  uint16_t d_bits = F32ToF16(smax);
  if (F16ToF32(d_bits) < smax && (d_bits & 0x7FFF) < 0x7BFF) ++d_bits;
  const float d = F16ToF32(d_bits);
  if (!(smax > 0.0f) || !(d > 0.0f) || !std::isfinite(d)) return;  // zeros (or beyond f16)
  out[0] = static_cast<uint8_t>(d_bits & 0xFF);
  out[1] = static_cast<uint8_t>(d_bits >> 8);
  for (int g = 0; g < 4; ++g) {
    const float* v = x + kGroupSize * g;
    int best_m = 0, q[kGroupSize], best_q[kGroupSize] = {};
    if (scales[g] > 0.0f) {
      const long m0 =
          std::clamp(255 + std::lround(32.0 * std::log2(static_cast<double>(scales[g]) / d)), 1L,
                     255L);
      float best_err = 0.0f;
      for (long m = std::max(1L, m0 - 2); m <= std::min(255L, m0 + 2); ++m) {
        const float s = d * kGzScales[m];  // the decoder's scale, rounded the same
        const float e = Error<kFour>(v, kGroupSize, s, q);
        if (best_m == 0 || e < best_err) {
          best_err = e;
          best_m = static_cast<int>(m);
          std::copy(q, q + kGroupSize, best_q);
        }
      }
    }
    out[2 + g] = static_cast<uint8_t>(best_m);
    if (best_m == 0) {
      // A group of zeros: scale 0 (GZ4 has no zero level; any code gives 0).
      continue;
    }
    for (int i = 0; i < kGroupSize; ++i) {
      if constexpr (kFour) {
        const int at = 6 + 16 * g + i % 16;
        out[at] |= static_cast<uint8_t>(best_q[i] << (i < 16 ? 0 : 4));
      } else {
        out[6 + 32 * g + i] = static_cast<uint8_t>(static_cast<int8_t>(best_q[i]));
      }
    }
  }
}

// GZ4S: the group's best scale on its own, then, of it rounded to an f16 and that f16's two
// neighbours, the one whose codes give the least squared error.
void Gz4SBlock(const float* x, uint8_t* out) {
  std::memset(out, 0, 18);
  const float s = GroupScale<true>(x);
  const uint16_t h = F32ToF16(s);
  if (!(s > 0.0f) || !std::isfinite(F16ToF32(h)) || (h & 0x7FFF) == 0) return;  // zeros
  int q[kGroupSize], best_q[kGroupSize] = {};
  uint16_t best_h = h;
  float best_err = -1.0f;
  for (int k = -1; k <= 1; ++k) {
    const uint16_t c = static_cast<uint16_t>(h + k);
    const float d = F16ToF32(c);
    if (!(d > 0.0f) || !std::isfinite(d)) continue;
    const float e = Error<true>(x, kGroupSize, d, q);
    if (best_err < 0.0f || e < best_err) {
      best_err = e;
      best_h = c;
      std::copy(q, q + kGroupSize, best_q);
    }
  }
  out[0] = static_cast<uint8_t>(best_h & 0xFF);
  out[1] = static_cast<uint8_t>(best_h >> 8);
  for (int i = 0; i < 16; ++i) {
    out[2 + i] = static_cast<uint8_t>(best_q[i] | best_q[16 + i] << 4);
  }
}

// ggml's quantize_row_q8_0_ref: d = max |x| / 127 (f16), q = round(x / d).
void Q8_0Block(const float* x, uint8_t* out) {
  float amax = 0.0f;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const uint16_t h = F32ToF16(d);
  out[0] = static_cast<uint8_t>(h & 0xFF);
  out[1] = static_cast<uint8_t>(h >> 8);
  for (int i = 0; i < 32; ++i) {
    out[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(std::lround(x[i] * id)));
  }
}

}  // namespace

void QuantizeOwnBlock(GgmlType type, const float* x, uint8_t* out) {
  if (type == GgmlType::kGZ4S) {
    Gz4SBlock(x, out);
  } else if (type == GgmlType::kGZ4) {
    Block<true>(x, out);
  } else {
    Block<false>(x, out);
  }
}


Expected<std::vector<uint8_t>> QuantizeOwnBlocks(GgmlType type, const float* w, int64_t rows,
                                                 int64_t cols, ThreadPool* pool) {
  GgmlBlock block;
  if ((!IsOwnBlockType(type) && type != GgmlType::kQ8_0) || !GgmlBlockOf(type, &block)) {
    return InvalidArgument("block type " + GgmlTypeName(type) +
                           " has no quantizer here (GZ8, GZ4, GZ4S and Q8_0 have)");
  }
  if (rows <= 0 || cols <= 0 || cols % block.elements != 0) {
    return InvalidArgument(GgmlTypeName(type) + ": a matrix of " + std::to_string(rows) + " x " +
                           std::to_string(cols) + " is not rows of whole blocks of " +
                           std::to_string(block.elements));
  }
  const int64_t per_row = cols / block.elements;
  std::vector<uint8_t> out(static_cast<size_t>(rows * per_row * block.bytes));
  auto run = [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t b = 0; b < per_row; ++b) {
        const float* x = w + r * cols + b * block.elements;
        uint8_t* o = out.data() + (r * per_row + b) * block.bytes;
        if (type == GgmlType::kQ8_0) {
          Q8_0Block(x, o);
        } else {
          QuantizeOwnBlock(type, x, o);
        }
      }
    }
  };
  if (pool && pool->threads() > 1) {
    pool->ParallelFor(rows, 1, run);
  } else {
    run(0, rows, 0);
  }
  return out;
}

}  // namespace gizllm::quant
