// The device layout of quantized linears (quant/layout.h's formats as PackQuantWeight arranges
// them, quant_matmul.cu) and the rotation of activations, shared by the kernels that read them
// (quant_matmul.cu's matmuls, moe.cu's experts).
//
// A weight [n, cols] is stored in tiles of 16 outputs; each tile in steps of kGroupsPerStep groups
// of 128 inputs; each step as kLoads 16-byte words per lane of a warp, lane l's words holding the
// codes of its mma.sync A fragments (rows l / 4 and l / 4 + 8, inputs 2 (l % 4) + {0, 1, 8, 9} of
// each 16), pairs of codes (inputs k, k + 1) in the low and high half-words. After the codes,
// (mul, add) float2 pairs [PaddedGroups(cols), PaddedRows(n)]: value = mul * code + add.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "ops/weight.h"
#include "quant/layout.h"

namespace gizllm::cuda {

// Per-format constants of the device layout.
template <Format F>
struct QuantTraits {
  static constexpr int kBits = F == Format::kQ8   ? 8
                               : F == Format::kQ4 ? 4
                               : F == Format::kQ2 ? 2
                                                  : 1;
  // Groups per step: a step gives each lane whole 16-byte words.
  static constexpr int kGroupsPerStep = F == Format::kQ1 ? 2 : 1;
  // 16-byte words per lane per step: 64 codes per lane per group.
  static constexpr int kLoads = kBits * kGroupsPerStep / 2;
  // Codes stored unsigned: kQ8 codes are stored as c + 128.
  static constexpr int kOffset = F == Format::kQ8 ? 128 : 0;
  // Pairs of codes per 32-bit word; each half-word holds one code of each pair, in its low and
  // high byte, kBits apart.
  static constexpr int kPairsPerWord = 16 / kBits;
  static constexpr int kPairsPerByte = 8 / kBits;
};

// Groups padded to the step of the format (and of the activation layout, shared by all formats).
__host__ __device__ inline int64_t PaddedGroups(int64_t cols) {
  return (cols / quant::kGroup + 1) / 2 * 2;
}
__host__ __device__ inline int64_t PaddedRows(int64_t rows) { return (rows + 15) / 16 * 16; }

__device__ __forceinline__ uint32_t HalfBits(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }

// Pair t of a lane's step words as float16 codes (c_k, c_k+1), exact: the code's bits are placed
// in the mantissa of 1024 (0x6400) and the offset is taken off by one fused multiply-add. Called
// from fully unrolled loops, so t and everything derived from it are constants. Pair t of a
// lane's step: group t / 32 of the step, inputs 16 ((t % 32) / 4) + 2 (lane % 4) + 8 (t % 4 / 2)
// and the next, output row lane / 4 + 8 (t % 2) of the tile.
template <Format F>
__device__ __forceinline__ __half2 CodePairAt(const uint32_t* words, int t) {
  using Q = QuantTraits<F>;
  const int word = t / Q::kPairsPerWord;
  const int slot = t % Q::kPairsPerWord;
  const int byte = slot / Q::kPairsPerByte;
  const int shift = (slot % Q::kPairsPerByte) * Q::kBits;
  const uint32_t mask = ((1u << Q::kBits) - 1) << shift;
  const uint32_t v = byte ? words[word] >> 8 : words[word];
  uint32_t h = (v & (mask | mask << 16)) | 0x64006400u;
  // (1024 + c 2^s) 2^-s - (1024 2^-s + offset) = c - offset.
  const float scale = 1.0f / static_cast<float>(1 << shift);
  const float bias = -(1024.0f * scale + Q::kOffset);
  __half2 hv = *reinterpret_cast<__half2*>(&h);
  return __hfma2(hv, __float2half2_rn(scale), __float2half2_rn(bias));
}

// The value of W[j, c] (j < n, c < cols) of a weight in this layout: one element found by its
// place (CodePairAt's inverse), for kernels that read weights in another order than the mma
// fragments.
template <Format F>
__device__ __forceinline__ float QuantValueAt(const uint4* __restrict__ codes,
                                              const float2* __restrict__ affine, int64_t n,
                                              int64_t cols, int64_t j, int64_t c) {
  using Q = QuantTraits<F>;
  const int64_t steps = PaddedGroups(cols) / Q::kGroupsPerStep;
  const int64_t g = c / quant::kGroup, st = g / Q::kGroupsPerStep;
  const int gs = static_cast<int>(g % Q::kGroupsPerStep), kk = static_cast<int>(c % quant::kGroup);
  const int r = static_cast<int>(j % 16), within = kk % 16;
  const int f = r / 8 + 2 * (within / 8), e = within % 2;
  const int lane = (r % 8) * 4 + (within % 8) / 2;
  const int t = (gs * 8 + kk / 16) * 4 + f;
  const int word = t / Q::kPairsPerWord, slot = t % Q::kPairsPerWord;
  const int shift = 16 * e + 8 * (slot / Q::kPairsPerByte) + (slot % Q::kPairsPerByte) * Q::kBits;
  const uint32_t* words = reinterpret_cast<const uint32_t*>(
      codes + (((j / 16) * steps + st) * Q::kLoads + word / 4) * 32 + lane);
  const int code =
      static_cast<int>((__ldg(words + word % 4) >> shift) & ((1u << Q::kBits) - 1)) - Q::kOffset;
  const float2 a = __ldg(affine + g * PaddedRows(n) + j);
  return a.x * static_cast<float>(code) + a.y;
}

// quant::RotationSignWord on the device.
__device__ __forceinline__ uint64_t RotationSignWord(uint64_t seed, int64_t i) {
  uint64_t z = seed + (static_cast<uint64_t>(i) + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Rotates 128 activations held 4 per lane (lane l: inputs 4l..4l+3) as quant::RotateRow does
// for block g: the signs, then the normalized Walsh-Hadamard transform.
__device__ __forceinline__ void RotateBlock(float* v, int lane, int64_t g, uint64_t seed) {
  const uint64_t signs = RotationSignWord(seed, g * 2 + lane / 16);
#pragma unroll
  for (int i = 0; i < 4; ++i)
    if ((signs >> ((lane % 16) * 4 + i)) & 1) v[i] = -v[i];
  float a0 = v[0] + v[1], a1 = v[0] - v[1], a2 = v[2] + v[3], a3 = v[2] - v[3];
  v[0] = a0 + a2, v[1] = a1 + a3, v[2] = a0 - a2, v[3] = a1 - a3;
#pragma unroll
  for (int m = 1; m < 32; m *= 2) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float other = __shfl_xor_sync(0xffffffffu, v[i], m);
      v[i] = (lane & m) ? other - v[i] : v[i] + other;
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] *= 0.08838834764831845f;  // 1 / sqrt(128)
}

}  // namespace gizllm::cuda
