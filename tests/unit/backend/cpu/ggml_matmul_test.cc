// The CPU's matmul and Embed over weights in ggml's blocks (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, IQ4_XS,
// Q1_0) against the
// same weights dequantized (formats/ggml_blocks.h, itself checked against llama.cpp) and
// multiplied in float64: every ISA, 1 to 3 threads, decode (1 row) and batches, output counts
// that are not multiples of a task, bias, and several outputs of different types in one call.
#include "backend/cpu/ggml_matmul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "formats/ggml_blocks.h"
#include "gguf_from_hf.h"

namespace gizllm {
namespace {

struct Matrix {
  GgmlType type;
  int64_t rows = 0, cols = 0;
  std::string blocks;         // [rows, cols / block elements, block bytes]
  std::vector<float> values;  // [rows, cols], dequantized
  Weight weight;
};

Matrix MakeMatrix(GgmlType type, int64_t rows, int64_t cols, uint32_t seed) {
  Matrix m{type, rows, cols};
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.1f);
  std::vector<float> like(rows * cols);
  for (float& v : like) v = normal(rng);
  m.blocks = testing::RandomBlocks(type, like, seed);
  m.values.resize(rows * cols);
  EXPECT_TRUE(DequantizeBlocks(type, reinterpret_cast<const uint8_t*>(m.blocks.data()),
                               m.blocks.size(), rows * cols, m.values.data(), "m")
                  .ok());
  m.weight.format = Format::kGgml;
  m.weight.ggml_type = static_cast<uint32_t>(type);
  m.weight.rows = rows;
  m.weight.cols = cols;
  m.weight.data = m.blocks.data();
  return m;
}

// |got - exact| for a float32 sum of `cols` products in any order is at most about
// cols * 2^-24 * sum |w x| (plus the bias's own rounding).
void ExpectProducts(const Matrix& m, const std::vector<float>& x, int64_t rows, const float* bias,
                    const std::vector<float>& out, const std::string& what) {
  int64_t bad = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t n = 0; n < m.rows; ++n) {
      double exact = bias ? bias[n] : 0.0, magnitude = bias ? std::fabs(bias[n]) : 0.0;
      for (int64_t c = 0; c < m.cols; ++c) {
        const double p = static_cast<double>(m.values[n * m.cols + c]) * x[r * m.cols + c];
        exact += p;
        magnitude += std::fabs(p);
      }
      const double bound = (m.cols + 2) * std::ldexp(1.0, -24) * magnitude;
      const float got = out[r * m.rows + n];
      if (!(std::fabs(got - exact) <= bound) && bad++ < 5) {
        ADD_FAILURE() << what << " row " << r << " output " << n << ": " << got << " vs " << exact
                      << " (bound " << bound << ")";
      }
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

struct Case {
  GgmlType type;
  int64_t cols;
};

TEST(GgmlMatmulTest, MatchesTheDequantizedProducts) {
  const Case cases[] = {{GgmlType::kQ8_0, 96},
                        {GgmlType::kQ8_0, 288},
                        {GgmlType::kQ4_0, 32},
                        {GgmlType::kQ4_0, 416},
                        {GgmlType::kQ4_K, 256},
                        {GgmlType::kQ4_K, 768},
                        {GgmlType::kQ6_K, 256},
                        {GgmlType::kQ6_K, 512},
                        {GgmlType::kQ5_K, 256},
                        {GgmlType::kQ5_K, 768},
                        {GgmlType::kIQ4_XS, 256},
                        // Past a panel of 2,048 inputs, into a partial one.
                        {GgmlType::kIQ4_XS, 2304},
                        {GgmlType::kQ1_0, 128},
                        {GgmlType::kQ1_0, 640},
                        {GgmlType::kQ1_0, 2176},
                        {GgmlType::kGZ8, 128},
                        {GgmlType::kGZ8, 2176},
                        {GgmlType::kGZ4, 384},
                        {GgmlType::kGZ4, 2176},
                        {GgmlType::kGZ4S, 32},
                        {GgmlType::kGZ4S, 64},
                        {GgmlType::kGZ4S, 2080}};
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  uint32_t seed = 1;
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (static_cast<int>(isa) > static_cast<int>(DetectCpuIsa())) continue;
    for (int threads : {1, 3}) {
      ThreadPool pool(threads);
      CpuBackend backend(&pool, CpuOptions{.isa = isa});
      for (const Case& c : cases) {
        for (int64_t rows : {1, 3, 17}) {
          const std::string what = std::string(CpuIsaName(isa)) + "/" + std::to_string(threads) +
                                   "t " + GgmlTypeName(c.type) + " cols " + std::to_string(c.cols) +
                                   " rows " + std::to_string(rows);
          ASSERT_TRUE(backend.ReadsGgml(static_cast<uint32_t>(c.type))) << what;
          // Two outputs of 37 and 5 (not multiples of a task), the first with a bias.
          Matrix a = MakeMatrix(c.type, 37, c.cols, seed++);
          Matrix b = MakeMatrix(c.type, 5, c.cols, seed++);
          std::unique_ptr<Buffer> storage;
          auto wa = backend.PrepareWeight(a.weight, &storage);
          auto wb = backend.PrepareWeight(b.weight, &storage);
          ASSERT_TRUE(wa.ok() && wb.ok()) << what << ": " << wa.status().message();
          std::vector<float> x(rows * c.cols), bias(a.rows);
          for (float& v : x) v = uniform(rng);
          for (float& v : bias) v = uniform(rng);
          const float nan = std::numeric_limits<float>::quiet_NaN();
          std::vector<float> out_a(rows * a.rows, nan), out_b(rows * b.rows, nan);
          MatmulParams p;
          p.x = x.data();
          p.rows = rows;
          p.outputs = 2;
          p.w[0] = &*wa;
          p.w[1] = &*wb;
          p.out[0] = out_a.data();
          p.out[1] = out_b.data();
          p.bias[0] = bias.data();
          ASSERT_TRUE(p.Check().ok()) << what;
          backend.Matmul(p);
          ExpectProducts(a, x, rows, bias.data(), out_a, what + " output 0");
          ExpectProducts(b, x, rows, nullptr, out_b, what + " output 1");
        }
      }
    }
  }
}

// A plain output beside a ggml one in one call: each runs on its own kernels.
TEST(GgmlMatmulTest, RunsBesidePlainOutputs) {
  ThreadPool pool(2);
  CpuBackend backend(&pool, CpuOptions{});
  Matrix q = MakeMatrix(GgmlType::kQ4_K, 19, 256, 3);
  Matrix f = MakeMatrix(GgmlType::kQ8_0, 11, 256, 4);
  std::vector<float> plain = f.values;  // the same values as a float32 weight
  Weight fw{.format = Format::kF32, .rows = 11, .cols = 256, .data = plain.data()};
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> x(4 * 256);
  for (float& v : x) v = uniform(rng);
  std::vector<float> out_q(4 * 19, std::nanf("")), out_f(4 * 11, std::nanf(""));
  MatmulParams p;
  p.x = x.data();
  p.rows = 4;
  p.outputs = 2;
  p.w[0] = &q.weight;
  p.w[1] = &fw;
  p.out[0] = out_q.data();
  p.out[1] = out_f.data();
  backend.Matmul(p);
  ExpectProducts(q, x, 4, nullptr, out_q, "Q4_K beside f32");
  ExpectProducts(f, x, 4, nullptr, out_f, "f32 beside Q4_K");
}

// Embed decodes each token's row from its blocks: exactly the dequantized row, times the scale.
TEST(GgmlMatmulTest, EmbedReadsRowsFromBlocks) {
  for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_K, GgmlType::kQ5_K,
                        GgmlType::kQ6_K, GgmlType::kIQ4_XS, GgmlType::kQ1_0, GgmlType::kGZ8,
                        GgmlType::kGZ4, GgmlType::kGZ4S}) {
    ThreadPool pool(2);
    CpuBackend backend(&pool, CpuOptions{});
    Matrix table = MakeMatrix(type, 50, 512, 11);
    const std::vector<int32_t> tokens = {49, 0,  7,  7,  23, 1,  48, 30, 2,  5,  6,  8,
                                         9,  10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20};
    std::vector<float> out(tokens.size() * 512, std::nanf(""));
    EmbedParams p{.out = out.data(),
                  .table = &table.weight,
                  .tokens = tokens.data(),
                  .rows = static_cast<int64_t>(tokens.size()),
                  .scale = 2.0f};
    ASSERT_TRUE(p.Check().ok());
    backend.Embed(p);
    for (size_t r = 0; r < tokens.size(); ++r) {
      for (int64_t c = 0; c < 512; ++c) {
        ASSERT_EQ(out[r * 512 + c], table.values[tokens[r] * 512 + c] * 2.0f)
            << GgmlTypeName(type) << " row " << r << " col " << c;
      }
    }
  }
}

TEST(GgmlMatmulTest, RefusesWeightsItCannotRead) {
  ThreadPool pool(1);
  CpuBackend backend(&pool, CpuOptions{});
  Matrix m = MakeMatrix(GgmlType::kQ3_K, 2, 256, 1);
  EXPECT_FALSE(backend.ReadsGgml(static_cast<uint32_t>(GgmlType::kQ3_K)));
  EXPECT_FALSE(backend.PrepareWeight(m.weight, nullptr).ok());
  Matrix q = MakeMatrix(GgmlType::kQ4_K, 2, 256, 1);
  Weight w = q.weight;
  w.cols = 300;  // not whole blocks
  EXPECT_FALSE(backend.PrepareWeight(w, nullptr).ok());
  w = q.weight;
  w.data = nullptr;
  EXPECT_FALSE(backend.PrepareWeight(w, nullptr).ok());
}

}  // namespace
}  // namespace gizllm
