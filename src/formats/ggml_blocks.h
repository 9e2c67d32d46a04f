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
//   GZ8    f16 d, u8 s[4], i8 qs[128]             x = (d * kGzScales[s[e / 32]]) * q   8.375 bits
//   GZ4    f16 d, u8 s[4], u8 qs[64]              x = (d * kGzScales[s[e / 32]]) *
//                                                       kGz4Levels[nibble]
//          group g's codes in qs[16 g .. 16 g + 16): element 32 g + i (i < 16) in the low
//          nibble of qs[16 g + i], 32 g + 16 + i in its high nibble                  4.375 bits
//   GZ4S   f16 d, u8 qs[16] (32 elements)         x = d * kGz4Levels[nibble]; low nibbles
//          first (rows of 32 or 64 inputs, which GZ4's blocks of 128 do not fit)   4.5 bits
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

// A GZ group's scale byte s as a factor of the block's d: 2^((s - 255) / 32) (steps of 2.2%,
// down to 1/250 of d; s = 0 is a group of zeros), float32-rounded once here so that every
// decoder multiplies by the same values.
inline constexpr float kGzScales[256] = {
    0.0f, 0x1.0b5586p-8f, 0x1.11301ep-8f, 0x1.172b84p-8f,
    0x1.1d4874p-8f, 0x1.2387a6p-8f, 0x1.29e9e0p-8f, 0x1.306fe0p-8f,
    0x1.371a74p-8f, 0x1.3dea64p-8f, 0x1.44e086p-8f, 0x1.4bfdaep-8f,
    0x1.5342b6p-8f, 0x1.5ab07ep-8f, 0x1.6247ecp-8f, 0x1.6a09e6p-8f,
    0x1.71f75ep-8f, 0x1.7a1148p-8f, 0x1.82589ap-8f, 0x1.8ace54p-8f,
    0x1.93737cp-8f, 0x1.9c4918p-8f, 0x1.a5503cp-8f, 0x1.ae89fap-8f,
    0x1.b7f770p-8f, 0x1.c199bep-8f, 0x1.cb720ep-8f, 0x1.d5818ep-8f,
    0x1.dfc974p-8f, 0x1.ea4afap-8f, 0x1.f50766p-8f, 0x1p-7f,
    0x1.059b0ep-7f, 0x1.0b5586p-7f, 0x1.11301ep-7f, 0x1.172b84p-7f,
    0x1.1d4874p-7f, 0x1.2387a6p-7f, 0x1.29e9e0p-7f, 0x1.306fe0p-7f,
    0x1.371a74p-7f, 0x1.3dea64p-7f, 0x1.44e086p-7f, 0x1.4bfdaep-7f,
    0x1.5342b6p-7f, 0x1.5ab07ep-7f, 0x1.6247ecp-7f, 0x1.6a09e6p-7f,
    0x1.71f75ep-7f, 0x1.7a1148p-7f, 0x1.82589ap-7f, 0x1.8ace54p-7f,
    0x1.93737cp-7f, 0x1.9c4918p-7f, 0x1.a5503cp-7f, 0x1.ae89fap-7f,
    0x1.b7f770p-7f, 0x1.c199bep-7f, 0x1.cb720ep-7f, 0x1.d5818ep-7f,
    0x1.dfc974p-7f, 0x1.ea4afap-7f, 0x1.f50766p-7f, 0x1p-6f,
    0x1.059b0ep-6f, 0x1.0b5586p-6f, 0x1.11301ep-6f, 0x1.172b84p-6f,
    0x1.1d4874p-6f, 0x1.2387a6p-6f, 0x1.29e9e0p-6f, 0x1.306fe0p-6f,
    0x1.371a74p-6f, 0x1.3dea64p-6f, 0x1.44e086p-6f, 0x1.4bfdaep-6f,
    0x1.5342b6p-6f, 0x1.5ab07ep-6f, 0x1.6247ecp-6f, 0x1.6a09e6p-6f,
    0x1.71f75ep-6f, 0x1.7a1148p-6f, 0x1.82589ap-6f, 0x1.8ace54p-6f,
    0x1.93737cp-6f, 0x1.9c4918p-6f, 0x1.a5503cp-6f, 0x1.ae89fap-6f,
    0x1.b7f770p-6f, 0x1.c199bep-6f, 0x1.cb720ep-6f, 0x1.d5818ep-6f,
    0x1.dfc974p-6f, 0x1.ea4afap-6f, 0x1.f50766p-6f, 0x1p-5f,
    0x1.059b0ep-5f, 0x1.0b5586p-5f, 0x1.11301ep-5f, 0x1.172b84p-5f,
    0x1.1d4874p-5f, 0x1.2387a6p-5f, 0x1.29e9e0p-5f, 0x1.306fe0p-5f,
    0x1.371a74p-5f, 0x1.3dea64p-5f, 0x1.44e086p-5f, 0x1.4bfdaep-5f,
    0x1.5342b6p-5f, 0x1.5ab07ep-5f, 0x1.6247ecp-5f, 0x1.6a09e6p-5f,
    0x1.71f75ep-5f, 0x1.7a1148p-5f, 0x1.82589ap-5f, 0x1.8ace54p-5f,
    0x1.93737cp-5f, 0x1.9c4918p-5f, 0x1.a5503cp-5f, 0x1.ae89fap-5f,
    0x1.b7f770p-5f, 0x1.c199bep-5f, 0x1.cb720ep-5f, 0x1.d5818ep-5f,
    0x1.dfc974p-5f, 0x1.ea4afap-5f, 0x1.f50766p-5f, 0x1p-4f,
    0x1.059b0ep-4f, 0x1.0b5586p-4f, 0x1.11301ep-4f, 0x1.172b84p-4f,
    0x1.1d4874p-4f, 0x1.2387a6p-4f, 0x1.29e9e0p-4f, 0x1.306fe0p-4f,
    0x1.371a74p-4f, 0x1.3dea64p-4f, 0x1.44e086p-4f, 0x1.4bfdaep-4f,
    0x1.5342b6p-4f, 0x1.5ab07ep-4f, 0x1.6247ecp-4f, 0x1.6a09e6p-4f,
    0x1.71f75ep-4f, 0x1.7a1148p-4f, 0x1.82589ap-4f, 0x1.8ace54p-4f,
    0x1.93737cp-4f, 0x1.9c4918p-4f, 0x1.a5503cp-4f, 0x1.ae89fap-4f,
    0x1.b7f770p-4f, 0x1.c199bep-4f, 0x1.cb720ep-4f, 0x1.d5818ep-4f,
    0x1.dfc974p-4f, 0x1.ea4afap-4f, 0x1.f50766p-4f, 0x1p-3f,
    0x1.059b0ep-3f, 0x1.0b5586p-3f, 0x1.11301ep-3f, 0x1.172b84p-3f,
    0x1.1d4874p-3f, 0x1.2387a6p-3f, 0x1.29e9e0p-3f, 0x1.306fe0p-3f,
    0x1.371a74p-3f, 0x1.3dea64p-3f, 0x1.44e086p-3f, 0x1.4bfdaep-3f,
    0x1.5342b6p-3f, 0x1.5ab07ep-3f, 0x1.6247ecp-3f, 0x1.6a09e6p-3f,
    0x1.71f75ep-3f, 0x1.7a1148p-3f, 0x1.82589ap-3f, 0x1.8ace54p-3f,
    0x1.93737cp-3f, 0x1.9c4918p-3f, 0x1.a5503cp-3f, 0x1.ae89fap-3f,
    0x1.b7f770p-3f, 0x1.c199bep-3f, 0x1.cb720ep-3f, 0x1.d5818ep-3f,
    0x1.dfc974p-3f, 0x1.ea4afap-3f, 0x1.f50766p-3f, 0x1p-2f,
    0x1.059b0ep-2f, 0x1.0b5586p-2f, 0x1.11301ep-2f, 0x1.172b84p-2f,
    0x1.1d4874p-2f, 0x1.2387a6p-2f, 0x1.29e9e0p-2f, 0x1.306fe0p-2f,
    0x1.371a74p-2f, 0x1.3dea64p-2f, 0x1.44e086p-2f, 0x1.4bfdaep-2f,
    0x1.5342b6p-2f, 0x1.5ab07ep-2f, 0x1.6247ecp-2f, 0x1.6a09e6p-2f,
    0x1.71f75ep-2f, 0x1.7a1148p-2f, 0x1.82589ap-2f, 0x1.8ace54p-2f,
    0x1.93737cp-2f, 0x1.9c4918p-2f, 0x1.a5503cp-2f, 0x1.ae89fap-2f,
    0x1.b7f770p-2f, 0x1.c199bep-2f, 0x1.cb720ep-2f, 0x1.d5818ep-2f,
    0x1.dfc974p-2f, 0x1.ea4afap-2f, 0x1.f50766p-2f, 0x1p-1f,
    0x1.059b0ep-1f, 0x1.0b5586p-1f, 0x1.11301ep-1f, 0x1.172b84p-1f,
    0x1.1d4874p-1f, 0x1.2387a6p-1f, 0x1.29e9e0p-1f, 0x1.306fe0p-1f,
    0x1.371a74p-1f, 0x1.3dea64p-1f, 0x1.44e086p-1f, 0x1.4bfdaep-1f,
    0x1.5342b6p-1f, 0x1.5ab07ep-1f, 0x1.6247ecp-1f, 0x1.6a09e6p-1f,
    0x1.71f75ep-1f, 0x1.7a1148p-1f, 0x1.82589ap-1f, 0x1.8ace54p-1f,
    0x1.93737cp-1f, 0x1.9c4918p-1f, 0x1.a5503cp-1f, 0x1.ae89fap-1f,
    0x1.b7f770p-1f, 0x1.c199bep-1f, 0x1.cb720ep-1f, 0x1.d5818ep-1f,
    0x1.dfc974p-1f, 0x1.ea4afap-1f, 0x1.f50766p-1f, 0x1p+0f,
};

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
