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

// The search with zeros as its definition: for each of 24 scales from the whole range down to
// MinFraction of it, the codes of that scale, two least-squares refits of scale and zero to the
// codes (each rounded again), then the scale itself; the first candidate of least error wins.
// Every candidate's error is evaluated here (QuantizeGroup skips evaluations it already made).
struct FullSearch {
  int levels;
  float min_fraction;
  static float Round(float x) { return (x + 12582912.0f) - 12582912.0f; }
  float Error(const float* w, float s, float z, int* k) const {
    const float inv = s > 0.0f ? 1.0f / s : 0.0f;
    float acc[8] = {};
    for (int i = 0; i < kGroup; i += 8) {
      for (int j = 0; j < 8; ++j) {
        const float q =
            std::min(std::max(Round((w[i + j] - z) * inv), 0.0f), static_cast<float>(levels - 1));
        k[i + j] = static_cast<int>(q);
        const float d = w[i + j] - (s * q + z);
        acc[j] += d * d;
      }
    }
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  }
  // Least squares for fixed codes; the sum of w k in 8 lanes of double added in a fixed order.
  static bool Fit(const float* w, const int* k, float* s, float* z) {
    double sw = 0.0, acc[8] = {};
    int64_t sk = 0, skk = 0;
    for (int i = 0; i < kGroup; ++i) {
      sw += w[i];
      sk += k[i];
      skk += k[i] * k[i];
      acc[i % 8] += static_cast<double>(w[i]) * k[i];
    }
    const double swk =
        ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    const double n = kGroup;
    const double det = n * skk - static_cast<double>(sk) * sk;
    if (det <= 0.0) return false;
    const double ss = (n * swk - sk * sw) / det;
    if (ss <= 0.0) return false;
    *s = static_cast<float>(ss);
    *z = static_cast<float>((sw - ss * sk) / n);
    return true;
  }
  void Run(const float* w, std::vector<int>* best_k, float* scale, float* zero) const {
    const float lo = *std::min_element(w, w + kGroup), hi = *std::max_element(w, w + kGroup);
    best_k->assign(kGroup, 0);
    *scale = 0.0f;
    *zero = lo;
    float best = Error(w, 0.0f, lo, best_k->data());
    if (hi == lo) return;
    int k[kGroup], c[kGroup];
    auto consider = [&](float s, float z) {
      const float err = Error(w, s, z, c);
      if (err < best) best = err, *scale = s, *zero = z, best_k->assign(c, c + kGroup);
    };
    for (int step = 0; step < 24; ++step) {
      const float fraction = 1.0f - (1.0f - min_fraction) * step / 23;
      const float s = (hi - lo) * fraction / (levels - 1);
      const float z = lo + (hi - lo) * (1.0f - fraction) / 2.0f;
      Error(w, s, z, k);
      for (int iter = 0; iter < 2; ++iter) {
        float fs, fz;
        if (!Fit(w, k, &fs, &fz)) break;
        consider(fs, fz);
        Error(w, fs, fz, k);
      }
      consider(s, z);
    }
  }
};

TEST(QuantizeGroupTest, SearchWithZerosPicksWhatEveryCandidateWeighedPicks) {
  std::mt19937 rng(17);
  for (Format f : {Format::kQ4, Format::kQ2}) {
    const FullSearch full{f == Format::kQ4 ? 16 : 4, f == Format::kQ4 ? 0.45f : 0.25f};
    for (int trial = 0; trial < 400; ++trial) {
      std::vector<float> w = Gaussian(kGroup, rng, 0.02f);
      // Groups of few distinct values (candidates of equal error), and an outlier.
      if (trial % 4 == 1) {
        for (float& x : w) x = x > 0.0f ? 0.01f : -0.01f;
      } else if (trial % 4 == 2) {
        for (float& x : w) x = std::round(x * 100.0f) / 100.0f;
      } else if (trial % 4 == 3) {
        w[trial % kGroup] = 0.3f;
      }
      std::vector<uint8_t> codes(GroupBytes(f));
      float scale = 0.0f, zero = 0.0f;
      QuantizeGroup(f, w.data(), codes.data(), &scale, &zero);
      std::vector<int> want;
      float want_scale = 0.0f, want_zero = 0.0f;
      full.Run(w.data(), &want, &want_scale, &want_zero);
      ASSERT_EQ(scale, want_scale) << FormatName(f) << " trial " << trial;
      ASSERT_EQ(zero, want_zero) << FormatName(f) << " trial " << trial;
      for (int e = 0; e < kGroup; ++e) {
        ASSERT_EQ(CodeAt(f, codes.data(), e), want[e]) << FormatName(f) << " trial " << trial;
      }
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
