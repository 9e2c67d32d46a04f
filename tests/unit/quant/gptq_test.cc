#include "quant/gptq.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "quant/hadamard.h"
#include "quant/layout.h"
#include "quant/quantize.h"

namespace gizllm::quant {
namespace {

constexpr Format kFormats[] = {Format::kQ8, Format::kQ4, Format::kQ2, Format::kQ1};

// A random symmetric positive definite matrix [n, n]: B B^T / n + 0.1 I, B [n, n] Gaussian.
std::vector<double> RandomSpd(int64_t n, std::mt19937& rng) {
  std::normal_distribution<double> dist;
  std::vector<double> b(n * n), a(n * n);
  for (double& x : b) x = dist(rng);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0.0;
      for (int64_t k = 0; k < n; ++k) s += b[i * n + k] * b[j * n + k];
      a[i * n + j] = s / n + (i == j ? 0.1 : 0.0);
    }
  }
  return a;
}

// x solving a x = b by Gaussian elimination with partial pivoting: the direct solve the
// factorizations are checked against.
std::vector<double> DirectSolve(std::vector<double> a, std::vector<double> b) {
  const int64_t n = static_cast<int64_t>(b.size());
  for (int64_t c = 0; c < n; ++c) {
    int64_t p = c;
    for (int64_t r = c + 1; r < n; ++r) {
      if (std::fabs(a[r * n + c]) > std::fabs(a[p * n + c])) p = r;
    }
    for (int64_t k = 0; k < n; ++k) std::swap(a[c * n + k], a[p * n + k]);
    std::swap(b[c], b[p]);
    for (int64_t r = c + 1; r < n; ++r) {
      double f = a[r * n + c] / a[c * n + c];
      for (int64_t k = c; k < n; ++k) a[r * n + k] -= f * a[c * n + k];
      b[r] -= f * b[c];
    }
  }
  std::vector<double> x(n);
  for (int64_t r = n - 1; r >= 0; --r) {
    double s = b[r];
    for (int64_t k = r + 1; k < n; ++k) s -= a[r * n + k] * x[k];
    x[r] = s / a[r * n + r];
  }
  return x;
}

double MaxAbs(const std::vector<double>& v) {
  double m = 0.0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

TEST(GptqTest, CholeskySolvesLikeADirectSolve) {
  std::mt19937 rng(1);
  ThreadPool pool(2);
  for (int64_t n : {1, 7, 64, 129}) {
    std::vector<double> a = RandomSpd(n, rng);
    std::vector<double> l(n * n, -7.0);  // poisoned
    ASSERT_TRUE(Cholesky(a.data(), n, l.data(), n > 64 ? &pool : nullptr)) << n;
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = i + 1; j < n; ++j) ASSERT_EQ(l[i * n + j], 0.0) << n;
    }
    // a x = b through l: l y = b, then l^T x = y.
    std::normal_distribution<double> dist;
    std::vector<double> b(n), y(n), x(n);
    for (double& v : b) v = dist(rng);
    for (int64_t i = 0; i < n; ++i) {
      double s = b[i];
      for (int64_t k = 0; k < i; ++k) s -= l[i * n + k] * y[k];
      y[i] = s / l[i * n + i];
    }
    for (int64_t i = n - 1; i >= 0; --i) {
      double s = y[i];
      for (int64_t k = i + 1; k < n; ++k) s -= l[k * n + i] * x[k];
      x[i] = s / l[i * n + i];
    }
    std::vector<double> direct = DirectSolve(a, b);
    for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(x[i], direct[i], 1e-9 * MaxAbs(direct)) << n;
  }
}

TEST(GptqTest, InverseCholeskyIsTheFactorOfTheInverse) {
  std::mt19937 rng(2);
  ThreadPool pool(2);
  for (int64_t n : {1, 5, 128, 200}) {
    std::vector<double> a = RandomSpd(n, rng);
    std::vector<double> u(n * n, -7.0);
    ASSERT_TRUE(InverseCholesky(a.data(), n, u.data(), n > 64 ? &pool : nullptr)) << n;
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_GT(u[i * n + i], 0.0);
      for (int64_t j = 0; j < i; ++j) ASSERT_EQ(u[i * n + j], 0.0) << n;
    }
    // a^-1 b = u^T (u b) against the direct solve of a x = b.
    std::normal_distribution<double> dist;
    std::vector<double> b(n), ub(n, 0.0), x(n, 0.0);
    for (double& v : b) v = dist(rng);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t k = i; k < n; ++k) ub[i] += u[i * n + k] * b[k];
    }
    for (int64_t k = 0; k < n; ++k) {
      for (int64_t i = 0; i <= k; ++i) x[k] += u[i * n + k] * ub[i];
    }
    std::vector<double> direct = DirectSolve(a, b);
    for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(x[i], direct[i], 1e-9 * MaxAbs(direct)) << n;
  }
}

TEST(GptqTest, FactorizationsRefuseAMatrixThatIsNotPositiveDefinite) {
  // Eigenvalues 3 and -1.
  const double a[4] = {1.0, 2.0, 2.0, 1.0};
  double out[4];
  EXPECT_FALSE(Cholesky(a, 2, out));
  EXPECT_FALSE(InverseCholesky(a, 2, out));
}

// Inputs X [n, cols] with correlated columns of unequal size, as a layer's activations are.
std::vector<float> CorrelatedInputs(int64_t n, int64_t cols, std::mt19937& rng) {
  std::normal_distribution<float> dist;
  const int64_t factors = cols / 4;
  std::vector<float> mix(factors * cols), scale(cols), x(n * cols);
  for (float& v : mix) v = dist(rng);
  for (int64_t c = 0; c < cols; ++c) scale[c] = std::exp(0.5f * dist(rng));
  std::vector<float> z(factors);
  for (int64_t r = 0; r < n; ++r) {
    for (float& v : z) v = dist(rng);
    for (int64_t c = 0; c < cols; ++c) {
      float s = 0.3f * dist(rng);  // each input's own noise
      for (int64_t f = 0; f < factors; ++f) s += z[f] * mix[f * cols + c] / std::sqrt(factors);
      x[r * cols + c] = s * scale[c];
    }
  }
  return x;
}

std::vector<float> Gram(const std::vector<float>& x, int64_t n, int64_t cols) {
  std::vector<float> h(cols * cols);
  for (int64_t i = 0; i < cols; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      double s = 0.0;
      for (int64_t r = 0; r < n; ++r) s += double(x[r * cols + i]) * x[r * cols + j];
      h[i * cols + j] = static_cast<float>(s);
    }
  }
  return h;
}

// ||X W^T - X Q^T||^2 with Q the dequantized weights in the original basis.
double OutputError(const std::vector<float>& x, int64_t n, const std::vector<float>& w,
                   const QuantizedLinear& q) {
  std::vector<float> dq(q.rows * q.cols);
  DequantizeOriginal(q.View(), dq.data());
  double err = 0.0;
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t o = 0; o < q.rows; ++o) {
      double d = 0.0;
      for (int64_t c = 0; c < q.cols; ++c) d += double(x[r * q.cols + c]) * (w[o * q.cols + c] - dq[o * q.cols + c]);
      err += d * d;
    }
  }
  return err;
}

TEST(GptqTest, RotateGramIsTheGramOfRotatedInputs) {
  std::mt19937 rng(3);
  const int64_t n = 50, cols = 256;
  std::vector<float> x = CorrelatedInputs(n, cols, rng);
  std::vector<float> h = Gram(x, n, cols);
  RotateGram(h.data(), cols, kDefaultRotationSeed);
  for (int64_t r = 0; r < n; ++r) RotateRow(x.data() + r * cols, cols, kDefaultRotationSeed);
  std::vector<float> expected = Gram(x, n, cols);
  float scale = 0.0f;
  for (float v : expected) scale = std::max(scale, std::fabs(v));
  for (int64_t i = 0; i < cols * cols; ++i) ASSERT_NEAR(h[i], expected[i], 1e-4f * scale) << i;
}

// GPTQ's reason to exist: on correlated inputs its outputs are closer to the original's than
// those of the round-to-nearest quantizer (the same format, groups and scale search), in every
// format, with and without the rotation.
TEST(GptqTest, OutputErrorIsBelowRoundToNearest) {
  std::mt19937 rng(5);
  ThreadPool pool(2);
  const int64_t n = 1024, cols = 256, rows = 48;
  std::vector<float> x = CorrelatedInputs(n, cols, rng);
  std::vector<float> h = Gram(x, n, cols);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  std::vector<float> w(rows * cols);
  for (float& v : w) v = dist(rng);
  for (Format f : kFormats) {
    for (bool rotate : {false, true}) {
      QuantizeOptions o{f, /*zeros=*/true, rotate};
      auto rtn = QuantizeLinear(w.data(), rows, cols, o);
      auto gptq = GptqQuantizeLinear(w.data(), rows, cols, h.data(), o, GptqOptions{}, &pool);
      ASSERT_TRUE(rtn.ok() && gptq.ok());
      ASSERT_TRUE(CheckQuantized(gptq->View()).ok());
      double e_rtn = OutputError(x, n, w, *rtn), e_gptq = OutputError(x, n, w, *gptq);
      std::printf("%s rotate %d: output error rtn %.4g gptq %.4g (%.2fx)\n",
                  FormatName(f).c_str(), rotate, e_rtn, e_gptq, e_rtn / e_gptq);
      EXPECT_LT(e_gptq, 0.8 * e_rtn) << FormatName(f) << " rotate " << rotate;
    }
  }
}

// With uncorrelated inputs of equal size (H a multiple of the identity) no error can be made up
// for: GPTQ rounds like round-to-nearest, to the same weight error.
TEST(GptqTest, IdentityGramGivesRoundToNearest) {
  std::mt19937 rng(6);
  const int64_t cols = 256, rows = 16;
  std::vector<float> h(cols * cols, 0.0f);
  for (int64_t i = 0; i < cols; ++i) h[i * cols + i] = 3.0f;
  std::normal_distribution<float> dist;
  std::vector<float> w(rows * cols);
  for (float& v : w) v = dist(rng);
  for (Format f : kFormats) {
    QuantizeOptions o{f, /*zeros=*/true, /*rotate=*/true};
    auto rtn = QuantizeLinear(w.data(), rows, cols, o);
    auto gptq = GptqQuantizeLinear(w.data(), rows, cols, h.data(), o, GptqOptions{});
    ASSERT_TRUE(rtn.ok() && gptq.ok());
    std::vector<float> a(rows * cols), b(rows * cols);
    DequantizeOriginal(rtn->View(), a.data());
    DequantizeOriginal(gptq->View(), b.data());
    for (int64_t i = 0; i < rows * cols; ++i) {
      ASSERT_NEAR(a[i], b[i], 1e-4f) << FormatName(f) << " " << i;
    }
  }
}

}  // namespace
}  // namespace gizllm::quant
