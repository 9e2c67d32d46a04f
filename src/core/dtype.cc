#include "core/dtype.h"

#include <algorithm>

namespace gizllm {

size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kI8: return 1;
    case DType::kU8: return 1;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kU32: return 4;
  }
  return 0;
}

std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kI8: return "I8";
    case DType::kU8: return "U8";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
    case DType::kU32: return "U32";
  }
  return "?";
}

bool ParseDType(std::string_view name, DType* out) {
  static constexpr struct {
    std::string_view name;
    DType type;
  } kNames[] = {{"F32", DType::kF32}, {"F16", DType::kF16}, {"BF16", DType::kBF16},
                {"I8", DType::kI8},   {"U8", DType::kU8},   {"I32", DType::kI32},
                {"I64", DType::kI64}, {"U32", DType::kU32}};
  for (const auto& n : kNames) {
    if (n.name == name) {
      *out = n.type;
      return true;
    }
  }
  return false;
}

float F16ToF32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t F32ToF16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  uint32_t sign = (bits >> 16) & 0x8000u;
  int32_t exp = static_cast<int32_t>((bits >> 23) & 0xffu) - 127 + 15;
  uint32_t mant = bits & 0x7fffffu;
  if (((bits >> 23) & 0xffu) == 0xffu) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0));
  if (exp >= 0x1f) return static_cast<uint16_t>(sign | 0x7c00u);
  if (exp <= 0) {
    if (exp < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    uint32_t shift = static_cast<uint32_t>(14 - exp);
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;
  return static_cast<uint16_t>(half);
}

namespace {

// NaN and infinity are the values whose exponent bits are all ones.
template <typename T>
int64_t FirstAllOnesExponent(const uint8_t* data, int64_t count, T exponent) {
  constexpr int64_t kChunk = 1024;
  auto bad = [&](int64_t i) {
    T v;
    std::memcpy(&v, data + i * sizeof(T), sizeof(T));
    return static_cast<uint32_t>((v & exponent) == exponent);
  };
  for (int64_t c = 0; c < count; c += kChunk) {
    const int64_t end = std::min(count, c + kChunk);
    uint32_t any = 0;
    for (int64_t i = c; i < end; ++i) any |= bad(i);
    if (any == 0) continue;
    for (int64_t i = c; i < end; ++i) {
      if (bad(i)) return i;
    }
  }
  return -1;
}

}  // namespace

int64_t FirstNonFinite(const void* data, DType type, int64_t count) {
  const uint8_t* bytes = static_cast<const uint8_t*>(data);
  switch (type) {
    case DType::kF32:
      return FirstAllOnesExponent<uint32_t>(bytes, count, 0x7f800000u);
    case DType::kF16:
      return FirstAllOnesExponent<uint16_t>(bytes, count, 0x7c00u);
    case DType::kBF16:
      return FirstAllOnesExponent<uint16_t>(bytes, count, 0x7f80u);
    default:
      return -1;
  }
}

}  // namespace gizllm
