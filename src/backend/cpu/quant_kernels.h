// The per-instruction-set kernels behind QuantMatmul (internal to backend/cpu).
//
// A kernel computes dot products of NW quantized weight rows with MX rotated activation rows at a
// time: each group of 128 codes is widened in registers, turned into floats by the group's
// (mul, add) of quant/layout.h, and used for all MX activation rows before the next is read.
#pragma once

#include <cstdint>

#include "backend/cpu/cpu_isa.h"
#include "ops/weight.h"

namespace gizllm {

// One quantized weight's share of a matmul.
struct QuantSlice {
  const Weight* w = nullptr;  // [n, cols], kQ8..kQ1, group 128
  const float* x = nullptr;   // [rows, cols] activations, rotated when w->rotated
  int64_t rows = 0;
  float* out = nullptr;         // [rows, n]
  const float* bias = nullptr;  // [n] or null
  // The rows of x rounded to bf16, as Avx512Bf16MatmulKernels' prepare writes them
  // (x_bf16_stride floats a row), for the kernels of QuantSliceAvx512Bf16.
  const float* x_bf16 = nullptr;
  int64_t x_bf16_stride = 0;
};

// Computes out[:, n0:n1] of a slice; n0 and n1 need not be multiples of anything.
using QuantSliceFn = void (*)(const QuantSlice& s, int64_t n0, int64_t n1);

// The kernel for `format` (kQ8..kQ1) on `isa`.
QuantSliceFn QuantSliceScalar(Format format);
QuantSliceFn QuantSliceAvx2(Format format);
QuantSliceFn QuantSliceAvx512(Format format);
// Many rows with bf16 activations (CPUs with avx512_bf16): each panel of 32 weight rows decoded
// and rounded to bf16, then multiplied with vdpbf16ps (AVX-512 BF16 panel product).
QuantSliceFn QuantSliceAvx512Bf16(Format format);

// quant::RotateRow (row <- row R, cols a multiple of 128) with each block of 128 in AVX-512
// registers: the same additions in the same order, so bit for bit the same result. Null where
// AVX-512 is not compiled in.
using RotateRowFn = void (*)(float* row, int64_t cols, uint64_t seed);
RotateRowFn RotateRowAvx512();

}  // namespace gizllm
