// Element types of stored tensors and the conversions between them.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

namespace gizllm {

enum class DType : uint8_t { kF32, kF16, kBF16, kI8, kU8, kI32, kI64, kU32 };

size_t DTypeSize(DType t);
std::string_view DTypeName(DType t);  // "F32", "BF16", ... as safetensors spells them
bool ParseDType(std::string_view name, DType* out);

inline float Bf16ToF32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even, as torch does; NaN stays NaN.
inline uint16_t F32ToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float F16ToF32(uint16_t h);
uint16_t F32ToF16(float f);

// The index of the first NaN or infinity among `count` values of type `type` at `data`, or -1
// when every value is finite (always -1 for the integer types). Reads memory at about its
// bandwidth: a chunk's flags are or-ed first and only a chunk with one is searched.
int64_t FirstNonFinite(const void* data, DType type, int64_t count);
inline int64_t FirstNonFinite(std::span<const float> x) {
  return FirstNonFinite(x.data(), DType::kF32, static_cast<int64_t>(x.size()));
}

}  // namespace gizllm
