// ggml's block types as float32: the layout of each block (llama.cpp's ggml-common.h) and the
// value of each of its elements, equal bit for bit to llama.cpp's dequantize_row_* (every
// element is one or two float32 operations in the order ggml does them; this file is compiled
// without contraction into fused multiply-adds, so the rounding is the same everywhere).
//
// Block layouts (little-endian; f16 is IEEE half; K-quants hold 256 elements):
//   Q4_0   f16 d, u8 qs[16]                       x = d * (nibble - 8); low nibbles first
//   Q4_1   f16 d, f16 m, u8 qs[16]                x = d * nibble + m
//   Q5_0   f16 d, u32 qh, u8 qs[16]               x = d * ((nibble | bit << 4) - 16)
//   Q5_1   f16 d, f16 m, u32 qh, u8 qs[16]        x = d * (nibble | bit << 4) + m
//   Q8_0   f16 d, i8 qs[32]                       x = d * q
//   Q2_K   u8 scales[16], u8 qs[64], f16 d, f16 dmin      16 groups of 16, 4-bit scale and min
//   Q3_K   u8 hmask[32], u8 qs[64], u8 scales[12], f16 d  16 groups of 16, 6-bit signed scales
//   Q4_K   f16 d, f16 dmin, u8 scales[12], u8 qs[128]     8 groups of 32, 6-bit scale and min
//   Q5_K   f16 d, f16 dmin, u8 scales[12], u8 qh[32], u8 qs[128]
//   Q6_K   u8 ql[128], u8 qh[64], i8 scales[16], f16 d    16 groups of 16
//   IQ4_NL f16 d, u8 qs[16]                       x = d * kIq4NlValues[nibble]
//   IQ4_XS f16 d, u16 scales_h, u8 scales_l[4], u8 qs[128]  8 groups of 32, 6-bit scales
//   TQ1_0  u8 qs[48], u8 qh[4], f16 d             ternary digits, 5 (qs) or 4 (qh) per byte
//   TQ2_0  u8 qs[64], f16 d                       x = d * (2 bits - 1)
//   Q1_0   f16 d, u8 qs[16] (128 elements)        x = bit ? d : -d
//   Q2_0   f16 d, u8 qs[16] (64 elements)         x = d * (2 bits - 1)
// gizllm's own types (never in a GGUF file; `convert --bits b8` / `b4`), 128 elements in 4
// groups of 32, an 8-bit scale a group under the block's f16 scale:
//   GZ8    f16 d, u8 s[4], i8 qs[128]                  x = (d * s[e / 32]) * q       8.375 bits
//   GZ4    f16 d, u8 s[4], u8 qs[64]                   x = (d * s[e / 32]) * kGz4Levels[nibble]
//          group g's codes in qs[16 g .. 16 g + 16): element 32 g + i (i < 16) in the low
//          nibble of qs[16 g + i], 32 g + 16 + i in its high nibble                  4.375 bits
// F32, F16 and BF16 are read as single-element blocks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/status.h"
#include "formats/gguf.h"

namespace gizllm {

// The 16 values of IQ4_NL and IQ4_XS codes (ggml's kvalues_iq4nl).
inline constexpr int8_t kIq4NlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

// GZ4's 16 levels: a unit Gaussian's Lloyd-Max levels for 16 levels (Max 1960; +-0.1284,
// 0.3881, 0.6568, 0.9424, 1.256, 1.618, 2.069, 2.733) times 127 / 2.733, rounded.
inline constexpr int8_t kGz4Levels[16] = {-127, -96, -75, -58, -44, -31, -18, -6,
                                          6,    18,  31,  44,  58,  75,  96,  127};

// True for the block types DequantizeBlocks reads.
bool CanDequantize(GgmlType type);

// The values of one block of a type: reads GgmlBlockOf(type).bytes at `block`, writes its
// .elements values to `out`. No checks: for kernels that walk blocks they have checked.
using GgmlBlockFn = void (*)(const uint8_t* block, float* out);
GgmlBlockFn GgmlBlockDecoder(GgmlType type);  // null where CanDequantize is false

// `elements` values of `type` from `bytes` bytes at `blocks` into `out` [elements]. An error
// naming `what` (a tensor, "file: tensor \"name\"") if the type is not read here, if `elements`
// is not whole blocks or if `bytes` is not exactly the bytes of those blocks; nothing is read
// then.
Status DequantizeBlocks(GgmlType type, const uint8_t* blocks, size_t bytes, int64_t elements,
                        float* out, const std::string& what);

}  // namespace gizllm
