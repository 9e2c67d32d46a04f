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
// [0, 2^bits) of even steps over a range [lo, hi] of its own:
// step = (hi - lo) / (2^bits - 1), c_i = round((y_i - lo) / step) clamped, read back as
// lo + step * c_i. The range is the vector's [min, max] narrowed about its middle by the factor of
// kShrinks that gives the least squared error (the clipped extremes cost less than the coarser
// steps they would need: on tiny-chat, KL 3.7 -> 2.3 at 2 bits, 0.175 -> 0.161 at 4; an offset
// range beats one symmetric about 0: 0.161 against 0.180 at 4 bits). The step and lo are float32,
// beside the codes (KvLayer's scales: [..., Groups(head_dim), 2] step, min). A group of one
// value has step 0
// (codes 0); one with a NaN or an infinity (every group of the rotation block of such an input)
// has codes 0 and step NaN, so that the attention over it is NaN, as over the float pages.
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

// The ranges Quantize tries: [min, max] narrowed about its middle by 1, 0.95, ..., 0.55.
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
  const int bytes = (n * bits + 7) / 8;
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
