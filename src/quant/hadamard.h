// The randomized block Hadamard rotation applied to quantized linears. Header-only, so that the
// kernels of every backend use the same definition without linking the quant library.
//
// For a linear out = x W^T with W [rows, cols], each block of 128 inputs is rotated by the
// orthogonal matrix R = D H / sqrt(128), with H the Walsh-Hadamard matrix (Sylvester order,
// symmetric) and D the diagonal of random signs of the block's columns. Since R R^T = I,
//   x W^T = sum over blocks b of x_b R R^T W_b^T = (x R) (W R)^T,
// so convert stores W' = W R (each row of W rotated like an activation row, then quantized) and at
// run time the kernels rotate each activation row the same way, x' = x R, once per matmul input.
// The rotation spreads outlier inputs over the block, which lowers the quantization error.
#pragma once

#include <cstdint>

namespace gizllm::quant {

// Inputs per rotation block, equal to the quantization group of every quantized format.
inline constexpr int kBlock = 128;

// The seed convert uses unless told otherwise; stored in each converted file's metadata.
inline constexpr uint64_t kDefaultRotationSeed = 0x67697a6c6c6d0001ull;

// Sign bits of columns [64 i, 64 i + 64): bit j set means column 64 i + j is negated.
// SplitMix64 of (seed, i): cheap, well mixed, and the same on every device.
inline uint64_t RotationSignWord(uint64_t seed, int64_t i) {
  uint64_t z = seed + (static_cast<uint64_t>(i) + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// v[0, 128) <- v H / sqrt(128), in place.
inline void Fwht128(float* v) {
  // Butterflies of span h; the inner loops are contiguous so that the compiler vectorizes them.
  for (int h = 1; h < kBlock; h *= 2) {
    for (int i = 0; i < kBlock; i += 2 * h) {
      for (int j = i; j < i + h; ++j) {
        float a = v[j];
        float b = v[j + h];
        v[j] = a + b;
        v[j + h] = a - b;
      }
    }
  }
  const float norm = 0.08838834764831845f;  // 1 / sqrt(128)
  for (int j = 0; j < kBlock; ++j) v[j] *= norm;
}

// Negates the inputs of block `b` (128 values) whose sign bit is set.
inline void ApplyRotationSigns(float* block, int64_t b, uint64_t seed) {
  for (int half = 0; half < 2; ++half) {
    uint64_t bits = RotationSignWord(seed, b * 2 + half);
    float* v = block + half * 64;
    for (int j = 0; j < 64; ++j) {
      if ((bits >> j) & 1) v[j] = -v[j];
    }
  }
}

// row[0, cols) <- row R: per block of 128, the signs, then the normalized transform.
// cols must be a multiple of 128.
inline void RotateRow(float* row, int64_t cols, uint64_t seed) {
  for (int64_t b = 0; b < cols / kBlock; ++b) {
    ApplyRotationSigns(row + b * kBlock, b, seed);
    Fwht128(row + b * kBlock);
  }
}

// row <- row R^T, the inverse of RotateRow: per block, the transform, then the signs.
inline void UnrotateRow(float* row, int64_t cols, uint64_t seed) {
  for (int64_t b = 0; b < cols / kBlock; ++b) {
    Fwht128(row + b * kBlock);
    ApplyRotationSigns(row + b * kBlock, b, seed);
  }
}

}  // namespace gizllm::quant
