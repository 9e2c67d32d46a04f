// Where each code of a quantized linear lies, and what value it stands for.
//
// A quantized Weight (ops/weight.h) with format kQ8, kQ4, kQ2 or kQ1 holds, for W [rows, cols]
// with cols a multiple of 128 and group 128:
//   data    uint8 [rows, cols / 128, GroupBytes(format)]  codes, row by row, group by group
//   scales  float [rows, cols / 128]
//   zeros   float [rows, cols / 128] or null               (kQ4 and kQ2 only)
// Within a group the codes are placed so that a SIMD kernel turns 16 consecutive bytes into
// 16 or 32 consecutive inputs with one widening load and one shift:
//   kQ8  byte e holds input e as int8.
//   kQ4  4 blocks of 16 bytes; input e lies in block e / 32, byte e % 16, the low nibble when
//        e % 32 < 16, else the high nibble.
//   kQ2  2 blocks of 16 bytes; input e lies in block e / 64, byte e % 16, bits 2 * ((e % 64) / 16).
//   kQ1  input e is bit e % 8 of byte e / 8.
// Values (s: the group's scale, z: its zero entry, c: the code):
//   kQ8  s * c                         (c in [-127, 127])
//   kQ4  s * c + z, or s * (c - 7.5)   without zeros (c in [0, 15])
//   kQ2  s * c + z, or s * (c - 1.5)   without zeros (c in [0, 3])
//   kQ1  c ? s : -s                    (the sign bit, one scale per group, as Bonsai stores it)
// Every value is thus mul * c + add with a per-group (mul, add), which is how the kernels read it.
#pragma once

#include <cstdint>

#include "ops/weight.h"

namespace gizllm::quant {

inline constexpr int kGroup = 128;

inline bool IsQuantized(Format f) {
  return f == Format::kQ8 || f == Format::kQ4 || f == Format::kQ2 || f == Format::kQ1;
}

// Bytes of codes per group of 128 inputs.
inline constexpr int GroupBytes(Format f) {
  switch (f) {
    case Format::kQ8:
      return 128;
    case Format::kQ4:
      return 64;
    case Format::kQ2:
      return 32;
    case Format::kQ1:
      return 16;
    default:
      return 0;
  }
}

// Whether the format may carry zero entries.
inline constexpr bool AllowsZeros(Format f) { return f == Format::kQ4 || f == Format::kQ2; }

// The code of input e (in [0, 128)) of a group; kQ8 codes are signed.
inline int CodeAt(Format f, const uint8_t* group, int e) {
  switch (f) {
    case Format::kQ8:
      return static_cast<int8_t>(group[e]);
    case Format::kQ4:
      return (group[(e / 32) * 16 + e % 16] >> ((e % 32) / 16 * 4)) & 15;
    case Format::kQ2:
      return (group[(e / 64) * 16 + e % 16] >> ((e % 64) / 16 * 2)) & 3;
    case Format::kQ1:
      return (group[e / 8] >> (e % 8)) & 1;
    default:
      return 0;
  }
}

// Sets the code of input e; the group's bytes must start zeroed.
inline void PutCode(Format f, uint8_t* group, int e, int code) {
  switch (f) {
    case Format::kQ8:
      group[e] = static_cast<uint8_t>(static_cast<int8_t>(code));
      break;
    case Format::kQ4:
      group[(e / 32) * 16 + e % 16] |= static_cast<uint8_t>((code & 15) << ((e % 32) / 16 * 4));
      break;
    case Format::kQ2:
      group[(e / 64) * 16 + e % 16] |= static_cast<uint8_t>((code & 3) << ((e % 64) / 16 * 2));
      break;
    case Format::kQ1:
      group[e / 8] |= static_cast<uint8_t>((code & 1) << (e % 8));
      break;
    default:
      break;
  }
}

// The group's value = mul * code + add.
struct Affine {
  float mul;
  float add;
};
inline Affine GroupAffine(Format f, float scale, const float* zero) {
  switch (f) {
    case Format::kQ8:
      return {scale, 0.0f};
    case Format::kQ4:
      return {scale, zero ? *zero : -7.5f * scale};
    case Format::kQ2:
      return {scale, zero ? *zero : -1.5f * scale};
    case Format::kQ1:
      return {2.0f * scale, -scale};
    default:
      return {0.0f, 0.0f};
  }
}

}  // namespace gizllm::quant
