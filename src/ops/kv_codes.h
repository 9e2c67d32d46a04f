// The rotated KV pages (KvFormat RotatedKv(keys, values)): how a key or value vector of one kv
// head becomes codes, shared by every backend's KV write and attention (host and device code).
//
// A vector x of head_dim is first rotated, y = R x: each channel's sign flipped by a fixed
// pseudo-random pattern (SignFlipped), then each block of RotationBlock(head_dim) channels
// multiplied by the normalized Walsh-Hadamard matrix H / sqrt(block). R is orthogonal (R^T R = I),
// so q.k = (R q).(R k) and sum_t w_t v_t = R^T sum_t w_t (R v_t): the attention rotates each
// query, reads the codes in the rotated space and rotates its output back once. The rotation
// spreads a channel's outlier over its block, so the codes' steps are finer.
//
// Each group of GroupSize(head_dim) channels of the rotated vector is stored as codes c_i in
// [0, 2^bits) with a {step, min} pair of its own, read back as min + step * Level(bits, c_i).
// - 8 and 2 bits: even steps, Level(bits, c) = c, over a range [lo, hi]: step = (hi - lo) /
//   (2^bits - 1), c_i = round((y_i - lo) / step) clamped, min = lo. The range is the group's
//   [min, max] narrowed about its middle by the factor of kShrinks that gives the least squared
//   error (the clipped extremes cost less than the coarser steps they would need: on tiny-chat,
//   KL 3.7 -> 2.3 at 2 bits, 0.175 -> 0.161 at 4; an offset range beats one symmetric about 0:
//   0.161 against 0.180 at 4 bits).
// - 4 bits: the 16 levels of the Lloyd-Max quantizer of the unit Gaussian (kLevels4; the rotated
//   elements are near-Gaussian), c_i the level nearest (y_i - min) / step, min the group's center
//   and step its spread, fitted by least squares (Quantize4). Against even steps on tiny-chat: 19%
//   less squared error (4.5e-3 against 5.5e-3 of the elements' energy), KL 0.117 -> 0.082
//   (bench/RESULTS.md).
// The step and min are float32, beside the codes (KvLayer's scales: [..., Groups(head_dim), 2]
// step, min). A group of one value has step 0 (codes 0); one with a NaN or an infinity (every
// group of the rotation block of such an input) has codes 0 and step NaN, so that the attention
// over it is NaN, as over the float pages.
//
// Codes pack little-endian within a byte: 8 bits one a byte, 4 bits element 2j in the low nibble
// of byte j and 2j + 1 in the high one, 2 bits element 4j + i in bits [2i, 2i + 2) of byte j.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define GZ_KV_FN __host__ __device__ __forceinline__
#else
#define GZ_KV_FN inline
#endif

namespace gizllm::kv {

// The ranges Quantize tries at 8 and 2 bits: [min, max] narrowed about its middle by 1, 0.95, ...,
// 0.55.
inline constexpr int kShrinks = 10;
inline constexpr float kShrinkStep = 0.05f;

// Channels of a rotation block of a head of head_dim: the largest power of two that divides it,
// at most 128 (64 -> 64, 128 -> 128, 256 -> two of 128, 96 -> three of 32).
GZ_KV_FN int RotationBlock(int head_dim) {
  const int b = head_dim & -head_dim;
  return b < 128 ? b : 128;
}

// Whether channel i's sign is flipped before the transform: a fixed hash of i.
GZ_KV_FN bool SignFlipped(int i) {
  uint32_t h = static_cast<uint32_t>(i) * 0x9e3779b1u + 0x7f4a7c15u;
  h ^= h >> 15;
  h *= 0x85ebca77u;
  h ^= h >> 13;
  h *= 0xc2b2ae3du;
  h ^= h >> 16;
  return h & 1u;
}

// v[0, n) <- H v / sqrt(n) per block of `block` (a power of two), in place.
GZ_KV_FN void Hadamard(float* v, int n, int block) {
  for (int b0 = 0; b0 < n; b0 += block) {
    for (int h = 1; h < block; h *= 2) {
      for (int i = b0; i < b0 + block; i += 2 * h) {
        for (int j = i; j < i + h; ++j) {
          const float a = v[j], c = v[j + h];
          v[j] = a + c;
          v[j + h] = a - c;
        }
      }
    }
  }
  const float norm = 1.0f / sqrtf(static_cast<float>(block));
  for (int i = 0; i < n; ++i) v[i] *= norm;
}

// v <- R v (the signs, then the transform), in place.
GZ_KV_FN void Rotate(float* v, int head_dim) {
  for (int i = 0; i < head_dim; ++i) {
    if (SignFlipped(i)) v[i] = -v[i];
  }
  Hadamard(v, head_dim, RotationBlock(head_dim));
}

// v <- R^T v (the transform, then the signs), in place: Rotate's inverse.
GZ_KV_FN void Unrotate(float* v, int head_dim) {
  Hadamard(v, head_dim, RotationBlock(head_dim));
  for (int i = 0; i < head_dim; ++i) {
    if (SignFlipped(i)) v[i] = -v[i];
  }
}

// Channels of a code group (each with its own step and min): 32 where head_dim is a multiple
// of 32, else the whole vector. A step per 32 channels instead of per vector (64 on tiny-chat):
// KL 0.054 -> 0.043 at 8/4, 0.161 -> 0.117 at 4 bits (bench/RESULTS.md).
GZ_KV_FN int GroupSize(int head_dim) { return head_dim % 32 == 0 ? 32 : head_dim; }
GZ_KV_FN int Groups(int head_dim) { return head_dim / GroupSize(head_dim); }

// Bytes of a vector of n codes of `bits`.
GZ_KV_FN int64_t CodeBytes(int bits, int n) { return (static_cast<int64_t>(n) * bits + 7) / 8; }

// Whether x is neither NaN nor an infinity (IEEE arithmetic, on the host and the device).
GZ_KV_FN bool Finite(float x) { return x - x == 0.0f; }

// A rotated vector y [head_dim] as the codes and {step, min} pairs of its groups.
GZ_KV_FN void QuantizeVector(const float* y, int head_dim, int bits, uint8_t* codes,
                             float* step_mins);

// Code i of a vector of `bits` codes.
GZ_KV_FN int Code(const uint8_t* codes, int i, int bits) {
  if (bits == 8) return codes[i];
  const int per_byte = 8 / bits;
  return (codes[i / per_byte] >> ((i % per_byte) * bits)) & ((1 << bits) - 1);
}

// The 16 levels of 4-bit codes: the Lloyd-Max quantizer of the unit Gaussian (Max 1960), symmetric
// about 0; and the midpoints between the positive ones, where the nearest level changes.
inline constexpr float kLevels4[16] = {-2.7326f, -2.0690f, -1.6181f, -1.2562f, -0.9424f, -0.6568f,
                                       -0.3881f, -0.1284f, 0.1284f,  0.3881f,  0.6568f,  0.9424f,
                                       1.2562f,  1.6181f,  2.0690f,  2.7326f};

// Level c of 4-bit codes, kLevels4[c] (also in device code, where a table indexed at run time
// would be read from local memory).
GZ_KV_FN float Level4(int c) {
  const int k = c < 8 ? 7 - c : c - 8;  // |level| rank
  const float a = k == 0   ? 0.1284f
                  : k == 1 ? 0.3881f
                  : k == 2 ? 0.6568f
                  : k == 3 ? 0.9424f
                  : k == 4 ? 1.2562f
                  : k == 5 ? 1.6181f
                  : k == 6 ? 2.0690f
                           : 2.7326f;
  return c < 8 ? -a : a;
}

// Code c read back in steps from the min: c (8 and 2 bits) or Level4(c) (4 bits).
GZ_KV_FN float Level(int bits, int c) { return bits == 4 ? Level4(c) : static_cast<float>(c); }

// The 4-bit code whose level is nearest t.
GZ_KV_FN int Nearest4(float t) {
  const float a = t < 0.0f ? -t : t;
  const int k = (a > 0.25825f) + (a > 0.52245f) + (a > 0.7996f) + (a > 1.0993f) + (a > 1.43715f) +
                (a > 1.84355f) + (a > 2.4008f);
  return t < 0.0f ? 7 - k : 8 + k;
}

// Quantize4's fit: its starts, how much each narrows the step of the one before, and the
// least-squares rounds from each (on tiny-chat, 2 starts of 4 rounds code as well as 10: KL
// 0.082-0.083 per text, 0.122-0.123 on longer windows, bench/RESULTS.md; one start 0.088, 2
// rounds 0.094), at the cost of the even steps' range search.
inline constexpr int kStarts4 = 2;
inline constexpr float kStartStep4 = 0.1f;
inline constexpr int kFitRounds = 4;

// One group y [n] (finite, not all equal; lo and hi its extremes) as 4-bit codes and the
// {step, min} of least squared error found from kStarts4 starts: min the middle of [lo, hi],
// step (hi - lo) / 2 / kLevels4[15] narrowed by 1, 0.9, ...; each start then takes kFitRounds
// rounds of (codes nearest; step and min of least squares for those codes).
GZ_KV_FN void Quantize4(const float* y, int n, float lo, float hi, float* step_min) {
  const float middle = 0.5f * (lo + hi), half = 0.5f * (hi - lo) / 2.7326f;
  float best_error = 0.0f, best_step = half, best_min = middle;
  for (int k = 0; k < kStarts4; ++k) {
    float step = half * (1.0f - kStartStep4 * k), min = middle;
    for (int round = 0; round < kFitRounds; ++round) {
      float sl = 0.0f, sll = 0.0f, sy = 0.0f, syl = 0.0f;
      const float inv = 1.0f / step;
      for (int i = 0; i < n; ++i) {
        const float l = Level4(Nearest4((y[i] - min) * inv));
        sl += l;
        sll += l * l;
        sy += y[i];
        syl += y[i] * l;
      }
      const float det = static_cast<float>(n) * sll - sl * sl;
      const float s = (static_cast<float>(n) * syl - sl * sy) / det;
      if (!(det > 0.0f) || !(s > 0.0f)) break;  // (one level for all: keep the start)
      step = s;
      min = (sy - s * sl) / static_cast<float>(n);
    }
    const float inv = 1.0f / step;
    float error = 0.0f;
    for (int i = 0; i < n; ++i) {
      const float e = min + step * Level4(Nearest4((y[i] - min) * inv)) - y[i];
      error += e * e;
    }
    if (k == 0 || error < best_error) {
      best_error = error;
      best_step = step;
      best_min = min;
    }
  }
  step_min[0] = best_step;
  step_min[1] = best_min;
}

// One group y [n] of a rotated vector as codes (bytes: n * bits / 8, rounded up) and its
// {step, min}.
GZ_KV_FN void Quantize(const float* y, int n, int bits, uint8_t* codes, float* step_min) {
  float lo = y[0], hi = y[0];
  bool finite = true;
  for (int i = 0; i < n; ++i) {
    finite = finite && Finite(y[i]);
    lo = y[i] < lo ? y[i] : lo;
    hi = y[i] > hi ? y[i] : hi;
  }
  const int bytes = (n * bits + 7) / 8;
  if (bits == 4 && finite && hi > lo) {
    Quantize4(y, n, lo, hi, step_min);
    const float inv = 1.0f / step_min[0];
    for (int j = 0; j < bytes; ++j) codes[j] = 0;
    for (int i = 0; i < n; ++i) {
      codes[i / 2] |= static_cast<uint8_t>(Nearest4((y[i] - step_min[1]) * inv) << ((i % 2) * 4));
    }
    return;
  }
  const int levels = (1 << bits) - 1;
  // The range: [lo, hi] narrowed about its middle by the factor of least squared error.
  const float middle = 0.5f * (lo + hi), half = 0.5f * (hi - lo);
  float best_error = 0.0f, best_shrink = 1.0f;
  for (int k = 0; k < kShrinks; ++k) {
    const float shrink = 1.0f - kShrinkStep * k;
    const float a = middle - shrink * half;
    const float step = 2.0f * shrink * half / static_cast<float>(levels);
    const float inv = step > 0.0f ? 1.0f / step : 0.0f;
    float error = 0.0f;
    for (int i = 0; i < n; ++i) {
      float c = nearbyintf((y[i] - a) * inv);
      c = c < 0.0f ? 0.0f : c > static_cast<float>(levels) ? static_cast<float>(levels) : c;
      const float e = a + step * c - y[i];
      error += e * e;
    }
    if (k == 0 || error < best_error) {
      best_error = error;
      best_shrink = shrink;
    }
  }
  lo = middle - best_shrink * half;
  const float step = finite ? 2.0f * best_shrink * half / static_cast<float>(levels) : nanf("");
  const float inv = finite && step > 0.0f ? 1.0f / step : 0.0f;
  for (int j = 0; j < bytes; ++j) codes[j] = 0;
  for (int i = 0; i < n; ++i) {
    int c = finite ? static_cast<int>(nearbyintf((y[i] - lo) * inv)) : 0;
    c = c < 0 ? 0 : c > levels ? levels : c;
    if (bits == 8) {
      codes[i] = static_cast<uint8_t>(c);
    } else {
      const int per_byte = 8 / bits;
      codes[i / per_byte] |= static_cast<uint8_t>(c << ((i % per_byte) * bits));
    }
  }
  step_min[0] = step;
  step_min[1] = finite ? lo : nanf("");
}

GZ_KV_FN void QuantizeVector(const float* y, int head_dim, int bits, uint8_t* codes,
                             float* step_mins) {
  const int n = GroupSize(head_dim);
  for (int g = 0; g < head_dim / n; ++g) {
    Quantize(y + g * n, n, bits, codes + g * n * bits / 8, step_mins + 2 * g);
  }
}

}  // namespace gizllm::kv
