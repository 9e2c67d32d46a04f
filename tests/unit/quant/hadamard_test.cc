#include "quant/hadamard.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace gizllm::quant {
namespace {

std::vector<float> RandomVector(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

TEST(HadamardTest, TransformOfFirstBasisVectorIsFlat) {
  std::vector<float> v(kBlock, 0.0f);
  v[0] = 1.0f;
  Fwht128(v.data());
  for (float x : v) EXPECT_NEAR(x, 1.0f / std::sqrt(128.0f), 1e-7f);
}

TEST(HadamardTest, TransformIsItsOwnInverse) {
  std::mt19937 rng(1);
  std::vector<float> v = RandomVector(kBlock, rng);
  std::vector<float> t = v;
  Fwht128(t.data());
  double moved = 0.0;
  for (int i = 0; i < kBlock; ++i) moved += std::fabs(t[i] - v[i]);
  EXPECT_GT(moved, 1.0);
  Fwht128(t.data());
  for (int i = 0; i < kBlock; ++i) EXPECT_NEAR(t[i], v[i], 1e-5f) << i;
}

TEST(HadamardTest, RotationIsOrthogonalAndUndone) {
  std::mt19937 rng(2);
  const int64_t cols = 3 * kBlock;
  std::vector<float> x = RandomVector(cols, rng);
  std::vector<float> w = RandomVector(cols, rng);
  std::vector<float> xr = x, wr = w;
  RotateRow(xr.data(), cols, kDefaultRotationSeed);
  RotateRow(wr.data(), cols, kDefaultRotationSeed);
  double dot = 0.0, dot_rotated = 0.0, norm = 0.0, norm_rotated = 0.0;
  for (int64_t i = 0; i < cols; ++i) {
    dot += x[i] * w[i];
    dot_rotated += xr[i] * wr[i];
    norm += x[i] * x[i];
    norm_rotated += xr[i] * xr[i];
  }
  EXPECT_NEAR(dot_rotated, dot, 1e-4 * std::sqrt(norm) * cols);
  EXPECT_NEAR(norm_rotated, norm, 1e-4 * norm);
  UnrotateRow(xr.data(), cols, kDefaultRotationSeed);
  for (int64_t i = 0; i < cols; ++i) EXPECT_NEAR(xr[i], x[i], 1e-5f) << i;
}

TEST(HadamardTest, SignsDependOnSeedAndBlock) {
  EXPECT_NE(RotationSignWord(1, 0), RotationSignWord(2, 0));
  EXPECT_NE(RotationSignWord(1, 0), RotationSignWord(1, 1));
  // About half the signs are set.
  int set = 0;
  for (int i = 0; i < 64; ++i) set += __builtin_popcountll(RotationSignWord(7, i));
  EXPECT_GT(set, 64 * 64 * 4 / 10);
  EXPECT_LT(set, 64 * 64 * 6 / 10);
}

TEST(HadamardTest, DifferentSeedsRotateDifferently) {
  std::mt19937 rng(3);
  std::vector<float> a = RandomVector(kBlock, rng);
  std::vector<float> b = a;
  RotateRow(a.data(), kBlock, 1);
  RotateRow(b.data(), kBlock, 2);
  double diff = 0.0;
  for (int i = 0; i < kBlock; ++i) diff += std::fabs(a[i] - b[i]);
  EXPECT_GT(diff, 1.0);
}

}  // namespace
}  // namespace gizllm::quant
