// Device helpers of the kernels that read rotated KV codes (ops/kv_codes.h) in registers: the
// split kernel (attention_codes_split.cu) and the tensor-core tile kernel's fp16 tiles
// (attention_mma.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ops/kv_codes.h"

namespace gizllm::cuda {

// N 32-bit words from shared memory (aligned to 4 N bytes).
template <int N>
__device__ __forceinline__ void LoadWords(const uint8_t* at, uint32_t* w) {
  if constexpr (N == 1) {
    w[0] = *reinterpret_cast<const uint32_t*>(at);
  } else if constexpr (N == 2) {
    uint2 t = *reinterpret_cast<const uint2*>(at);
    w[0] = t.x, w[1] = t.y;
  } else {
    static_assert(N == 4);
    uint4 t = *reinterpret_cast<const uint4*>(at);
    w[0] = t.x, w[1] = t.y, w[2] = t.z, w[3] = t.w;
  }
}

// The float of an integer c < 2^23 from its bits OR'ed into 2^23's (exact; no conversion unit).
__device__ __forceinline__ float SmallInt(uint32_t bits_of_2_23) {
  return __uint_as_float(bits_of_2_23) - 8388608.0f;
}

// Elements [piece * kDims, (piece + 1) * kDims) of a vector (4, 8 or 16 inside one group of 32;
// its codes of `bits` at `codes`, 8, 4 or 2; its {step, min} pairs at `step_min`; levels4:
// kv::kLevels4, in shared memory) read back: min + step * level. codes is aligned to the bytes
// read (kDims * bits / 8).
template <int kDims>
__device__ __forceinline__ void ReadBack(const uint8_t* codes, const float* step_min, int bits,
                                         int piece, const float* levels4, float* x) {
  float level[kDims];
  if (bits == 8) {
    uint32_t w[kDims / 4];
    LoadWords<kDims / 4>(codes + piece * kDims, w);
#pragma unroll
    for (int d = 0; d < kDims; ++d)
      level[d] = SmallInt(__byte_perm(w[d / 4], 0x4B000000u, 0x7440u + d % 4));
  } else if (bits == 4) {
    uint32_t w[(kDims + 7) / 8];
    if constexpr (kDims == 4) {
      w[0] = *reinterpret_cast<const uint16_t*>(codes + piece * 2);
    } else {
      LoadWords<kDims / 8>(codes + piece * kDims / 2, w);
    }
#pragma unroll
    for (int d = 0; d < kDims; ++d) level[d] = levels4[(w[d / 8] >> (4 * (d % 8))) & 15u];
  } else {
    uint32_t w;
    if constexpr (kDims == 4) {
      w = codes[piece];
    } else if constexpr (kDims == 8) {
      w = *reinterpret_cast<const uint16_t*>(codes + piece * 2);
    } else {
      w = *reinterpret_cast<const uint32_t*>(codes + piece * 4);
    }
#pragma unroll
    for (int d = 0; d < kDims; ++d) level[d] = SmallInt(0x4B000000u | ((w >> (2 * d)) & 3u));
  }
  const float2 sm = *reinterpret_cast<const float2*>(step_min + 2 * (piece * kDims / 32));
#pragma unroll
  for (int d = 0; d < kDims; ++d) x[d] = fmaf(sm.x, level[d], sm.y);
}

}  // namespace gizllm::cuda
