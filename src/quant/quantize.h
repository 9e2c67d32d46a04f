// Quantizers of linears into the formats of quant/layout.h, and the reference dequantization.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "ops/weight.h"
#include "quant/hadamard.h"

namespace gizllm::quant {

struct QuantizeOptions {
  Format format = Format::kQ4;
  bool zeros = true;   // kQ4, kQ2: a zero entry per group (asymmetric); ignored otherwise
  bool rotate = true;  // rotate each block of 128 inputs before quantizing
  uint64_t seed = kDefaultRotationSeed;
  Status Check() const;  // format must be kQ8, kQ4, kQ2 or kQ1
};

// A quantized linear that owns its arrays (convert writes them; tests run kernels on them).
struct QuantizedLinear {
  Format format = Format::kQ4;
  int64_t rows = 0;
  int64_t cols = 0;
  bool rotated = false;
  uint64_t seed = 0;
  std::vector<uint8_t> codes;  // [rows, cols / 128, GroupBytes(format)]
  std::vector<float> scales;   // [rows, cols / 128]
  std::vector<float> zeros;    // [rows, cols / 128] or empty

  Weight View() const;  // points into this object

  // A linear of rows x cols in options' format, its arrays sized and zero: what the
  // quantizers fill in.
  static QuantizedLinear Empty(const QuantizeOptions& options, int64_t rows, int64_t cols);
};

// Quantizes one group of 128 values: picks the codes, scale and zero (when `zero` is not null
// and the format allows one) that minimize the squared error, by a search over the scale (and
// for zeros, the clipped range) followed by least-squares refits of scale and zero to the codes.
// Returns the squared error. `codes` [GroupBytes(format)] is overwritten.
float QuantizeGroup(Format format, const float* w, uint8_t* codes, float* scale, float* zero);

// Quantizes W [rows, cols] (float32, row-major); cols must be a multiple of 128. Rotates each
// row first when options.rotate. Runs on `pool` when given.
Expected<QuantizedLinear> QuantizeLinear(const float* w, int64_t rows, int64_t cols,
                                         const QuantizeOptions& options,
                                         ThreadPool* pool = nullptr);
// The same into `*q`, whose arrays keep their memory from call to call: a conversion that
// quantizes one linear after another then maps fresh pages (the kernel's zeroing, on one thread)
// only where a linear is larger than those before it.
Status QuantizeLinearInto(const float* w, int64_t rows, int64_t cols,
                          const QuantizeOptions& options, ThreadPool* pool, QuantizedLinear* q);

// Checks that `w` is a quantized weight the kernels can read (format, group 128, cols a
// multiple of 128, codes and scales present, zeros only where the format allows them).
Status CheckQuantized(const Weight& w);

// out [end - begin, cols] <- rows [begin, end) of a quantized W as float, in the stored
// (rotated, when w.rotated) basis: the reference the kernels are tested against.
void DequantizeRows(const Weight& w, int64_t begin, int64_t end, float* out);

// out [rows, cols] <- W as float in the original basis (the rotation undone).
void DequantizeOriginal(const Weight& w, float* out);

// out [rows, w.rows] <- x [rows, w.cols] W^T, by dequantize-then-matmul in double precision
// (x rotated first when w.rotated). The reference for every quantized matmul kernel.
void ReferenceMatmul(const float* x, int64_t rows, const Weight& w, float* out);

}  // namespace gizllm::quant
