// The per-instruction-set kernels behind QuantMatmul (internal to backend/cpu).
//
// A kernel computes dot products of NW quantized weight rows with MX rotated activation rows at a
// time: each group of 128 codes is widened in registers, turned into floats by the group's
// (mul, add) of quant/layout.h, and used for all MX activation rows before the next is read.
#pragma once

#include <cstdint>

#include "backend/cpu/cpu_isa.h"
#include "core/thread_pool.h"
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
  // The rows of x quantized to int8 by QuantizeRowsInt8, for the kernels of QuantSliceAvx512Vnni:
  // codes [rows, cols], and per row and group of 128 the scale and the scale times the codes' sum.
  const int8_t* x_i8 = nullptr;
  const float* x_scales = nullptr;
  const float* x_sums = nullptr;
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

// The CPU's layout for integer products (Weight::layout = kCpuVnniLayout), for kQ8 and kQ4: blocks
// of 16 outputs (the last padded with zero codes and affines), each group by group
// [block][group]: the codes as 64-byte vectors, one 32-bit lane per output, then the group's
// mul[16] and add[16] (float32; quant/layout.h's affine, with -128 mul added for q8).
//   kQ8  32 vectors; vector t, lane j: inputs 4t..4t+3 of output j as c + 128 (unsigned).
//   kQ4  16 vectors; vector t, lane j, byte e: input 8t + e in the low nibble, 8t + 4 + e in the
//        high one.
// The packed weight keeps format, shape, group and rotation; data points at the packed bytes,
// and scales and zeros are null (folded in).
inline constexpr uint8_t kCpuVnniLayout = 1;
bool VnniPacks(Format format);  // kQ8 and kQ4
int64_t VnniPackedBytes(const Weight& w);
// w: the standard layout; blocks split among the pool's threads when one is given.
void PackVnniWeight(const Weight& w, void* out, ThreadPool* pool = nullptr);
// Products of int8 activations with weights in that layout (CPUs with avx512_vnni; null
// elsewhere): vpdpbusd sums per group in int32, scaled into float32 sums once per group.
QuantSliceFn QuantSliceAvx512Vnni(Format format);
// Rows of x [rows, cols] (cols a multiple of 128) as int8 codes q = round(x * 127 / max |x|)
// (nearest, ties to even; 0 where the group is all zero) with, per row and group, scale =
// max |x| / 127 and sum = scale * the codes' sum. A group holding a NaN or an infinity gets
// codes 0 and a NaN scale and sum, so that its outputs are NaN as float32 products' would be.
// Null where AVX-512 VNNI is not compiled in.
using QuantizeRowsInt8Fn = void (*)(const float* x, int64_t rows, int64_t cols, int8_t* q,
                                    float* scales, float* sums);
QuantizeRowsInt8Fn QuantizeRowsInt8();

// quant::RotateRow (row <- row R, cols a multiple of 128) with each block of 128 in AVX-512
// registers: the same additions in the same order, so bit for bit the same result. Null where
// AVX-512 is not compiled in.
using RotateRowFn = void (*)(float* row, int64_t cols, uint64_t seed);
RotateRowFn RotateRowAvx512();

}  // namespace gizllm
