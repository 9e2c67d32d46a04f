#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace gizllm {
namespace {

TEST(DType, Bf16RoundTripAndRounding) {
  EXPECT_EQ(Bf16ToF32(F32ToBf16(1.0f)), 1.0f);
  EXPECT_EQ(Bf16ToF32(F32ToBf16(-2.5f)), -2.5f);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties go to even (1.0).
  EXPECT_EQ(Bf16ToF32(F32ToBf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_EQ(Bf16ToF32(F32ToBf16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(NAN))));
}

TEST(DType, F16MatchesKnownValues) {
  EXPECT_EQ(F16ToF32(0x3c00), 1.0f);
  EXPECT_EQ(F16ToF32(0xc000), -2.0f);
  EXPECT_EQ(F16ToF32(0x7bff), 65504.0f);
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_TRUE(std::isinf(F16ToF32(0x7c00)));
  std::mt19937 rng(7);
  for (int i = 0; i < 100000; ++i) {
    uint16_t h = static_cast<uint16_t>(rng());
    if (((h >> 10) & 0x1f) == 0x1f) continue;  // inf/nan
    EXPECT_EQ(F32ToF16(F16ToF32(h)), h) << h;
  }
}

TEST(DType, ParseNames) {
  DType t;
  ASSERT_TRUE(ParseDType("BF16", &t));
  EXPECT_EQ(t, DType::kBF16);
  EXPECT_FALSE(ParseDType("F8_E4M3", &t));
  EXPECT_EQ(DTypeSize(DType::kI64), 8u);
}

}  // namespace
}  // namespace gizllm
