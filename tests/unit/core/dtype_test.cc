#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

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

// Every position and kind of non-finite value in each float type, over lengths around the
// scan's chunks; finite extremes (largest, subnormal, negative zero) are not flagged.
TEST(DType, FirstNonFiniteFindsTheFirst) {
  std::mt19937 rng(3);
  for (int64_t n :
       {int64_t{1}, int64_t{7}, int64_t{1023}, int64_t{1024}, int64_t{1025}, int64_t{5000}}) {
    std::vector<float> f(n);
    for (float& x : f) x = std::uniform_real_distribution<float>(-1e38f, 1e38f)(rng);
    f[0] = -0.0f;
    f[n - 1] = std::numeric_limits<float>::denorm_min();
    std::vector<uint16_t> h(n), b(n);
    for (int64_t i = 0; i < n; ++i) {
      h[i] = F32ToF16(std::fmod(f[i], 65504.0f));
      b[i] = F32ToBf16(f[i]);
    }
    EXPECT_EQ(FirstNonFinite(f), -1);
    EXPECT_EQ(FirstNonFinite(h.data(), DType::kF16, n), -1);
    EXPECT_EQ(FirstNonFinite(b.data(), DType::kBF16, n), -1);
    for (float bad : {NAN, INFINITY, -INFINITY}) {
      for (int64_t at : {n - 1, n / 2, int64_t{0}}) {
        std::vector<float> g = f;
        g[at] = bad;
        if (at != n - 1) g[n - 1] = bad;
        EXPECT_EQ(FirstNonFinite(g), at) << n << " " << bad;
        std::vector<uint16_t> gh = h, gb = b;
        gh[at] = F32ToF16(bad);
        gb[at] = F32ToBf16(bad);
        EXPECT_EQ(FirstNonFinite(gh.data(), DType::kF16, n), at);
        EXPECT_EQ(FirstNonFinite(gb.data(), DType::kBF16, n), at);
      }
    }
  }
  const int32_t ints[] = {0x7f800000, -1};
  EXPECT_EQ(FirstNonFinite(ints, DType::kI32, 2), -1);
}

}  // namespace
}  // namespace gizllm
