// The encoder ops (LayerNorm, Gelu, EncoderAttention, MeanRows) on the CPU backend against their
// float64 references: fresh random inputs, NaN-poisoned outputs, 1 and 3 threads, sizes that are
// not multiples of anything, and packed batches of sequences of different lengths.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/reference.h"

namespace gizllm {
namespace {

class EncoderOpsTest : public ::testing::Test {
 protected:
  std::mt19937 rng_{25};
  std::vector<float> Random(int64_t n, float lo = -1.0f, float hi = 1.0f) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (float& f : v) f = d(rng_);
    return v;
  }
  static std::vector<float> Poison(int64_t n) {
    return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN());
  }
};

TEST_F(EncoderOpsTest, LayerNormMatchesReference) {
  for (int threads : {1, 3}) {
    ThreadPool pool(threads);
    CpuBackend backend(&pool, CpuOptions{});
    for (int64_t dim : {1, 7, 64, 333}) {
      for (bool residual : {false, true}) {
        const int64_t rows = 37;
        std::vector<float> x = Random(rows * dim, -4, 4), res = Random(rows * dim, -2, 2);
        std::vector<float> w = Random(dim, 0.5f, 1.5f), b = Random(dim);
        std::vector<float> got = Poison(rows * dim), want = got;
        LayerNormParams p{got.data(), x.data(), residual ? res.data() : nullptr,
                          w.data(),   b.data(), rows,
                          dim,        1e-12f};
        ASSERT_TRUE(p.Check().ok());
        LayerNormParams ref = p;
        ref.out = want.data();
        backend.LayerNorm(p);
        ReferenceLayerNorm(ref);
        for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 2e-5) << i;
        // In place.
        p.out = x.data();
        backend.LayerNorm(p);
        for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(x[i], got[i]) << i;
      }
    }
  }
}

TEST_F(EncoderOpsTest, GeluMatchesReference) {
  ThreadPool pool(3);
  CpuBackend backend(&pool, CpuOptions{});
  std::vector<float> x = Random(5003, -6, 6), want = x;
  backend.Gelu({x.data(), 5003});
  ReferenceGelu({want.data(), 5003});
  for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(x[i], want[i], 1e-6) << i;
  // gelu(-inf side) goes to 0, gelu(x) ~ x for large x: the erf form, not tanh's.
  std::vector<float> ends = {-10.0f, 0.0f, 1.0f, 10.0f};
  backend.Gelu({ends.data(), 4});
  EXPECT_NEAR(ends[0], 0.0f, 1e-6);
  EXPECT_EQ(ends[1], 0.0f);
  EXPECT_NEAR(ends[2], 0.8413447f, 1e-6);  // Phi(1)
  EXPECT_NEAR(ends[3], 10.0f, 1e-6);
}

TEST_F(EncoderOpsTest, EncoderAttentionMatchesReferenceWithinEachSequence) {
  for (int threads : {1, 3}) {
    ThreadPool pool(threads);
    CpuBackend backend(&pool, CpuOptions{});
    for (int head_dim : {8, 13}) {
      const int heads = 3;
      const std::vector<int32_t> starts = {0, 1, 18, 23, 64};  // lengths 1, 17, 5, 41
      const int64_t rows = starts.back(), width = heads * head_dim;
      std::vector<float> q = Random(rows * width, -2, 2), k = Random(rows * width, -2, 2);
      std::vector<float> v = Random(rows * width);
      std::vector<float> got = Poison(rows * width), want = got;
      EncoderAttentionParams p{
          got.data(), q.data(), k.data(), v.data(), starts.data(),
          rows,       4,        heads,    head_dim, 1.0f / std::sqrt(float(head_dim))};
      ASSERT_TRUE(p.Check().ok());
      EncoderAttentionParams ref = p;
      ref.out = want.data();
      backend.EncoderAttention(p);
      ReferenceEncoderAttention(ref);
      for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 2e-6) << i;
      // A sequence alone gives the same rows: nothing leaks across sequences.
      const std::vector<int32_t> alone = {0, 5};
      std::vector<float> one = Poison(5 * width);
      EncoderAttentionParams single{one.data(),
                                    q.data() + 18 * width,
                                    k.data() + 18 * width,
                                    v.data() + 18 * width,
                                    alone.data(),
                                    5,
                                    1,
                                    heads,
                                    head_dim,
                                    p.scale};
      backend.EncoderAttention(single);
      for (int64_t i = 0; i < 5 * width; ++i) ASSERT_EQ(one[i], got[18 * width + i]) << i;
    }
  }
}

TEST_F(EncoderOpsTest, MeanRowsMatchesReference) {
  for (int threads : {1, 3}) {
    ThreadPool pool(threads);
    CpuBackend backend(&pool, CpuOptions{});
    for (int64_t dim : {1, 7, 333}) {
      const std::vector<int32_t> starts = {0, 1, 18, 23, 64, 65};  // lengths 1, 17, 5, 41, 1
      const int sequences = 5;
      std::vector<float> x = Random(starts.back() * dim, -3, 3);
      std::vector<float> got = Poison(sequences * dim), want = got;
      MeanRowsParams p{got.data(), x.data(), starts.data(), sequences, dim};
      ASSERT_TRUE(p.Check().ok());
      backend.MeanRows(p);
      MeanRowsParams ref = p;
      ref.out = want.data();
      ReferenceMeanRows(ref);
      EXPECT_EQ(got, want) << dim;  // both sum in double, rows in order
      // A sequence of one row is that row.
      for (int64_t i = 0; i < dim; ++i) EXPECT_EQ(got[i], x[i]);
    }
  }
}

TEST(EncoderOpsCheck, ChecksNameTheField) {
  LayerNormParams ln;
  ln.rows = 1;
  ln.dim = 0;
  EXPECT_NE(ln.Check().message().find("LayerNorm.dim"), std::string::npos);
  EncoderAttentionParams a;
  a.heads = 1;
  a.head_dim = 4;
  a.scale = 0.5f;
  a.rows = 3;
  EXPECT_NE(a.Check().message().find("EncoderAttention.out"), std::string::npos);
}

}  // namespace
}  // namespace gizllm
