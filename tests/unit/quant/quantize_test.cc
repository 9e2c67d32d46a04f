#include "quant/quantize.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "quant/layout.h"

namespace gizllm::quant {
namespace {

constexpr Format kFormats[] = {Format::kQ8, Format::kQ4, Format::kQ2, Format::kQ1};

std::vector<float> Gaussian(int64_t n, std::mt19937& rng, float sigma = 1.0f) {
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Squared error of a group quantized and decoded again.
double GroupError(Format f, const float* w, const uint8_t* codes, float scale, const float* zero) {
  Affine a = GroupAffine(f, scale, zero);
  double err = 0.0;
  for (int e = 0; e < kGroup; ++e) {
    double d = w[e] - (a.mul * CodeAt(f, codes, e) + a.add);
    err += d * d;
  }
  return err;
}

// The error of plain rounding with the scale from the group's largest magnitude (or range).
double PlainRoundingError(Format f, const float* w, bool zeros) {
  float lo = *std::min_element(w, w + kGroup), hi = *std::max_element(w, w + kGroup);
  float amax = std::max(-lo, hi);
  int levels = f == Format::kQ8 ? 255 : f == Format::kQ4 ? 16 : 4;
  double err = 0.0;
  for (int e = 0; e < kGroup; ++e) {
    double v;
    if (zeros) {
      double s = (hi - lo) / (levels - 1);
      v = std::nearbyint((w[e] - lo) / s) * s + lo;
    } else {
      double half = (levels - 1) / 2.0, s = amax / half;
      v = (std::nearbyint(w[e] / s + half) - half) * s;
    }
    err += (w[e] - v) * (w[e] - v);
  }
  return err;
}

TEST(LayoutTest, CodesRoundTripInEveryFormat) {
  std::mt19937 rng(4);
  for (Format f : kFormats) {
    int bits = FormatBits(f);
    std::uniform_int_distribution<int> dist(f == Format::kQ8 ? -127 : 0,
                                            f == Format::kQ8 ? 127 : (1 << bits) - 1);
    std::vector<int> codes(kGroup);
    for (int& c : codes) c = dist(rng);
    std::vector<uint8_t> group(GroupBytes(f), 0);
    EXPECT_EQ(GroupBytes(f) * 8, kGroup * bits);
    for (int e = 0; e < kGroup; ++e) PutCode(f, group.data(), e, codes[e]);
    for (int e = 0; e < kGroup; ++e) EXPECT_EQ(CodeAt(f, group.data(), e), codes[e]) << e;
  }
}

TEST(LayoutTest, PositionsAreTheDocumentedOnes) {
  std::vector<uint8_t> g(64, 0);
  PutCode(Format::kQ4, g.data(), 16, 9);  // block 0, byte 0, high nibble
  PutCode(Format::kQ4, g.data(), 33, 5);  // block 1, byte 1, low nibble
  EXPECT_EQ(g[0], 0x90);
  EXPECT_EQ(g[17], 0x05);
  std::vector<uint8_t> q2(32, 0);
  PutCode(Format::kQ2, q2.data(), 48 + 3, 2);   // block 0, byte 3, bits 6-7
  PutCode(Format::kQ2, q2.data(), 64 + 20, 3);  // block 1, byte 4, bits 2-3
  EXPECT_EQ(q2[3], 0x80);
  EXPECT_EQ(q2[16 + 4], 0x0c);
  std::vector<uint8_t> q1(16, 0);
  PutCode(Format::kQ1, q1.data(), 13, 1);
  EXPECT_EQ(q1[1], 0x20);
}

TEST(QuantizeGroupTest, SignsTakeTheMeanMagnitude) {
  std::mt19937 rng(5);
  std::vector<float> w = Gaussian(kGroup, rng);
  std::vector<uint8_t> codes(16);
  float scale = -1.0f;
  QuantizeGroup(Format::kQ1, w.data(), codes.data(), &scale, nullptr);
  double mean = 0.0;
  for (float x : w) mean += std::fabs(x) / kGroup;
  EXPECT_NEAR(scale, mean, 1e-5);
  for (int e = 0; e < kGroup; ++e) EXPECT_EQ(CodeAt(Format::kQ1, codes.data(), e), w[e] >= 0);
}

TEST(QuantizeGroupTest, SearchBeatsPlainRounding) {
  std::mt19937 rng(6);
  for (Format f : {Format::kQ8, Format::kQ4, Format::kQ2}) {
    for (bool zeros : {false, true}) {
      if (zeros && !AllowsZeros(f)) continue;
      double searched = 0.0, plain = 0.0;
      for (int trial = 0; trial < 50; ++trial) {
        std::vector<float> w = Gaussian(kGroup, rng, 0.02f);
        std::vector<uint8_t> codes(GroupBytes(f));
        float scale = 0.0f, zero = 0.0f;
        float err = QuantizeGroup(f, w.data(), codes.data(), &scale, zeros ? &zero : nullptr);
        double check = GroupError(f, w.data(), codes.data(), scale, zeros ? &zero : nullptr);
        EXPECT_NEAR(err, check, 1e-3 * check + 1e-12);
        double base = PlainRoundingError(f, w.data(), zeros);
        EXPECT_LE(check, base * (1.0 + 1e-5)) << FormatName(f) << " zeros " << zeros;
        searched += check;
        plain += base;
      }
      // At 8 bits the rounding error is near uniform and clipping gains little; with fewer
      // levels the best scale clips much more.
      const double gain = f == Format::kQ8 ? 0.99 : f == Format::kQ4 ? 0.9 : 0.6;
      EXPECT_LT(searched, gain * plain) << FormatName(f) << " zeros " << zeros;
    }
  }
}

// Relative squared error of Gaussian weights, near what an optimal uniform quantizer reaches.
TEST(QuantizeLinearTest, ErrorOfGaussianWeights) {
  struct Case {
    Format f;
    bool zeros;
    double bound;
  } cases[] = {{Format::kQ8, false, 6e-5}, {Format::kQ4, false, 0.014}, {Format::kQ4, true, 0.014},
               {Format::kQ2, false, 0.13}, {Format::kQ2, true, 0.13},   {Format::kQ1, false, 0.37}};
  std::mt19937 rng(7);
  const int64_t rows = 33, cols = 256;
  std::vector<float> w = Gaussian(rows * cols, rng, 0.05f);
  for (const Case& c : cases) {
    QuantizeOptions options{c.f, c.zeros, /*rotate=*/true};
    auto q = QuantizeLinear(w.data(), rows, cols, options);
    ASSERT_TRUE(q.ok()) << q.status().message();
    EXPECT_EQ(q->zeros.empty(), !c.zeros);
    Weight view = q->View();
    ASSERT_TRUE(CheckQuantized(view).ok());
    EXPECT_EQ(view.Bytes(),
              static_cast<int64_t>(q->codes.size() + 4 * q->scales.size() + 4 * q->zeros.size()));
    std::vector<float> back(rows * cols);
    DequantizeOriginal(view, back.data());
    double err = 0.0, energy = 0.0;
    for (int64_t i = 0; i < rows * cols; ++i) {
      err += (back[i] - w[i]) * (back[i] - w[i]);
      energy += w[i] * w[i];
    }
    EXPECT_LT(err / energy, c.bound) << FormatName(c.f) << " zeros " << c.zeros;
    EXPECT_GT(err / energy, c.bound / 20) << FormatName(c.f) << " zeros " << c.zeros;
  }
}

// Weights with a few outlier input channels, as trained models have: the rotation spreads them.
TEST(QuantizeLinearTest, RotationLowersTheErrorOfOutlierChannels) {
  std::mt19937 rng(8);
  const int64_t rows = 64, cols = 384;
  std::vector<float> w = Gaussian(rows * cols, rng, 0.02f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c : {5, 130, 300}) w[r * cols + c] *= 25.0f;
  }
  for (Format f : {Format::kQ4, Format::kQ2}) {
    double err[2];
    for (bool rotate : {false, true}) {
      auto q = QuantizeLinear(w.data(), rows, cols, QuantizeOptions{f, true, rotate});
      ASSERT_TRUE(q.ok());
      std::vector<float> back(rows * cols);
      DequantizeOriginal(q->View(), back.data());
      err[rotate] = 0.0;
      for (int64_t i = 0; i < rows * cols; ++i) err[rotate] += (back[i] - w[i]) * (back[i] - w[i]);
    }
    EXPECT_LT(err[1], 0.7 * err[0]) << FormatName(f);
  }
}

// The reference rotates x and multiplies by the stored (rotated) weights: the same product as x
// times the dequantized weights in the original basis, which checks (x R)(W R)^T = x W^T.
TEST(QuantizeLinearTest, ReferenceMatmulEqualsProductInTheOriginalBasis) {
  std::mt19937 rng(9);
  const int64_t rows = 17, cols = 256, n = 5;
  std::vector<float> w = Gaussian(rows * cols, rng, 0.05f);
  std::vector<float> x = Gaussian(n * cols, rng);
  for (Format f : kFormats) {
    auto q = QuantizeLinear(w.data(), rows, cols, QuantizeOptions{f, true, true});
    ASSERT_TRUE(q.ok());
    std::vector<float> original(rows * cols);
    DequantizeOriginal(q->View(), original.data());
    std::vector<float> out(n * rows, std::nanf(""));
    ReferenceMatmul(x.data(), n, q->View(), out.data());
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t o = 0; o < rows; ++o) {
        double want = 0.0;
        for (int64_t k = 0; k < cols; ++k) want += x[r * cols + k] * original[o * cols + k];
        EXPECT_NEAR(out[r * rows + o], want, 1e-4) << FormatName(f) << " " << r << " " << o;
      }
    }
  }
}

TEST(QuantizeLinearTest, RejectsBadShapesAndFormats) {
  std::vector<float> w(3 * 100, 1.0f);
  EXPECT_FALSE(QuantizeLinear(w.data(), 3, 100, QuantizeOptions{}).ok());
  EXPECT_FALSE(QuantizeLinear(w.data(), 1, 128, QuantizeOptions{Format::kBf16}).ok());
  Weight bad;
  bad.format = Format::kQ8;
  bad.rows = 2;
  bad.cols = 128;
  bad.group = 64;
  EXPECT_FALSE(CheckQuantized(bad).ok());
}

}  // namespace
}  // namespace gizllm::quant
