// The uint8 antialiased bicubic resample against a plain double-precision reference that sums
// the filter over every input (no windows, no fixed point): within one unit everywhere.
#include "vision/resize.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "picture_encoders.h"

namespace gizllm::vision {
namespace {

double KeysCubic(double x) {
  x = std::abs(x);
  if (x < 1) return 1.5 * x * x * x - 2.5 * x * x + 1;
  if (x < 2) return -0.5 * x * x * x + 2.5 * x * x - 4 * x + 2;
  return 0;
}

// One axis in double: out[i] = sum_j in[j] * f((j + 0.5 - center) / s) / sum_j f(...), with
// s = max(1, in / out) and center = (i + 0.5) * in / out; rounded half up and clamped.
std::vector<uint8_t> ReferenceAxis(const std::vector<uint8_t>& in, int out_size) {
  const int n = static_cast<int>(in.size());
  const double scale = double(n) / out_size;
  const double s = std::max(1.0, scale);
  std::vector<uint8_t> out(out_size);
  for (int i = 0; i < out_size; ++i) {
    const double center = (i + 0.5) * scale;
    double sum = 0, total = 0;
    for (int j = 0; j < n; ++j) {
      const double w = KeysCubic((j + 0.5 - center) / s);
      sum += w * in[j];
      total += w;
    }
    out[i] = static_cast<uint8_t>(std::clamp(std::floor(sum / total + 0.5), 0.0, 255.0));
  }
  return out;
}

Planes Reference(const Planes& in, int height, int width) {
  Planes mid{in.channels, in.height, width,
             std::vector<uint8_t>(size_t(in.channels) * in.height * width)};
  for (int c = 0; c < in.channels; ++c) {
    for (int y = 0; y < in.height; ++y) {
      std::vector<uint8_t> row(in.width);
      for (int x = 0; x < in.width; ++x) row[x] = in.at(c, y, x);
      const std::vector<uint8_t> r = width == in.width ? row : ReferenceAxis(row, width);
      std::copy(r.begin(), r.end(), mid.data.begin() + (size_t(c) * in.height + y) * width);
    }
  }
  Planes out{in.channels, height, width,
             std::vector<uint8_t>(size_t(in.channels) * height * width)};
  for (int c = 0; c < in.channels; ++c) {
    for (int x = 0; x < width; ++x) {
      std::vector<uint8_t> column(in.height);
      for (int y = 0; y < in.height; ++y) column[y] = mid.at(c, y, x);
      const std::vector<uint8_t> r = height == in.height ? column : ReferenceAxis(column, height);
      for (int y = 0; y < height; ++y) out.data[(size_t(c) * height + y) * width + x] = r[y];
    }
  }
  return out;
}

Planes Smooth(int channels, int height, int width, int seed) {
  // Noise on a gradient: both the flat parts and the edges the filter's lobes overshoot on.
  Planes p{channels, height, width, testing::Pattern(width, height, channels, seed)};
  for (int c = 0; c < channels; ++c) {
    for (int y = 0; y < height; ++y) {
      for (int x = 0; x < width; ++x) {
        uint8_t& v = p.data[(size_t(c) * height + y) * width + x];
        v = static_cast<uint8_t>((x * 255 / std::max(1, width - 1) + (v & 31)) & 255);
      }
    }
  }
  return p;
}

TEST(Resize, MatchesTheDoubleReferenceWithinOneUnit) {
  struct Case {
    int h, w, out_h, out_w;
  };
  for (const Case& k : std::vector<Case>{{45, 67, 64, 96},     // up
                                         {200, 300, 64, 96},   // down by about 3
                                         {517, 33, 352, 32},   // down, one axis barely
                                         {7, 5, 96, 64},       // far up
                                         {480, 640, 32, 32},   // far down
                                         {30, 30, 30, 61}}) {  // one axis only
    const Planes in = Smooth(3, k.h, k.w, k.h + k.w);
    const Planes got = ResizeBicubicAntialias(in, k.out_h, k.out_w);
    const Planes want = Reference(in, k.out_h, k.out_w);
    ASSERT_EQ(got.data.size(), want.data.size());
    int worst = 0;
    size_t off_by_one = 0;
    for (size_t i = 0; i < got.data.size(); ++i) {
      const int d = std::abs(got.data[i] - want.data[i]);
      worst = std::max(worst, d);
      off_by_one += d != 0;
    }
    EXPECT_LE(worst, 1) << k.h << "x" << k.w << " to " << k.out_h << "x" << k.out_w;
    // Rounding the weights to 14 or so bits moves few values.
    EXPECT_LT(off_by_one, got.data.size() / 20 + 1) << k.h << "x" << k.w;
  }
}

TEST(Resize, SameSizeIsACopyAndWeightsSumToOne) {
  const Planes in = Smooth(3, 12, 9, 4);
  EXPECT_EQ(ResizeBicubicAntialias(in, 12, 9).data, in.data);
  for (auto [n, m] : std::vector<std::pair<int, int>>{{67, 96}, {300, 96}, {517, 32}, {5, 64}}) {
    const ResampleAxis axis = BicubicAntialiasAxis(n, m);
    EXPECT_GE(axis.precision, 13);
    EXPECT_LE(axis.precision, 22);
    for (int i = 0; i < m; ++i) {
      ASSERT_LE(axis.count[i], axis.taps);
      ASSERT_LE(axis.first[i] + axis.count[i], n);
      int sum = 0;
      for (int j = 0; j < axis.count[i]; ++j) sum += axis.weights[size_t(i) * axis.taps + j];
      // Each weight rounded on its own: the sum is 2^precision within half a unit a weight.
      EXPECT_LE(std::abs(sum - (1 << axis.precision)), axis.count[i]) << n << "->" << m;
    }
  }
  // Shrinking by 1.5: support 3, so 7 taps; the first output reads inputs 0..2.
  const ResampleAxis a = BicubicAntialiasAxis(3, 2);
  EXPECT_EQ(a.taps, 7);
  EXPECT_EQ(a.first[0], 0);
  EXPECT_EQ(a.count[0], 3);
}

}  // namespace
}  // namespace gizllm::vision
