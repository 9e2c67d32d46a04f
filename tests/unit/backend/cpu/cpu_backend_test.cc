// The CPU backend's kernels against the scalar references: every instruction set this CPU
// has, 1, 2 and 3 threads, sizes that are not multiples of any tile, unaligned pointers,
// fresh random inputs and NaN-poisoned outputs.
#include "backend/cpu/cpu_backend.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/quant_kernels.h"
#include "backend/cpu/reference.h"
#include "core/dtype.h"
#include "ops/kv_codes.h"
#include "quant/quantize.h"

namespace gizllm {
namespace {

struct Config {
  CpuIsa isa;
  int threads;
};

std::vector<Config> Configs() {
  std::vector<Config> configs;
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (static_cast<int>(isa) > static_cast<int>(DetectCpuIsa())) continue;
    for (int threads : {1, 2, 3}) configs.push_back({isa, threads});
  }
  return configs;
}

std::string Name(const Config& c) {
  return std::string(CpuIsaName(c.isa)) + "/" + std::to_string(c.threads) + "t";
}

class CpuBackendTest : public ::testing::Test {
 protected:
  std::mt19937 rng_{12345};

  std::vector<float> Random(int64_t n, float scale = 1.0f) {
    std::uniform_real_distribution<float> d(-scale, scale);
    std::vector<float> v(n);
    for (float& f : v) f = d(rng_);
    return v;
  }
  std::vector<float> Poison(int64_t n) {
    return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN());
  }
};

// A plain weight of random values stored at an odd element offset (unaligned rows).
struct TestWeight {
  std::vector<uint8_t> bytes;
  Weight w;
  TestWeight(Format format, int64_t rows, int64_t cols, std::mt19937& rng) {
    std::uniform_real_distribution<float> d(-1.0f, 1.0f);
    const int size = format == Format::kF32 ? 4 : 2;
    bytes.resize((rows * cols + 1) * size);
    uint8_t* data = bytes.data() + size;  // one element past the start
    for (int64_t i = 0; i < rows * cols; ++i) {
      float v = d(rng);
      if (format == Format::kF32) {
        std::memcpy(data + i * 4, &v, 4);
      } else {
        uint16_t h = format == Format::kBf16 ? F32ToBf16(v) : F32ToF16(v);
        std::memcpy(data + i * 2, &h, 2);
      }
    }
    w = Weight{.format = format, .rows = rows, .cols = cols, .data = data};
  }
};

TEST_F(CpuBackendTest, MatmulMatchesReference) {
  const int64_t kRows[] = {1, 2, 3, 5, 17};
  const int64_t kCols[] = {1, 7, 31, 33, 70, 389};
  for (const Config& c : Configs()) {
    ThreadPool pool(c.threads);
    CpuBackend backend(&pool, CpuOptions{.isa = c.isa});
    for (Format format : {Format::kF32, Format::kF16, Format::kBf16}) {
      for (int64_t rows : kRows) {
        for (int64_t cols : kCols) {
          const int outputs = 1 + static_cast<int>((rows + cols) % 3);
          const int64_t n[3] = {1 + (cols * 7) % 45, 3 + rows, 19};
          std::vector<TestWeight> w;
          for (int o = 0; o < outputs; ++o) w.emplace_back(format, n[o], cols, rng_);
          // x starts one float past an aligned address.
          std::vector<float> x_storage = Random(rows * cols + 1);
          std::vector<float> bias = Random(64);
          std::vector<float> got[3], want[3];
          MatmulParams p;
          p.x = x_storage.data() + 1;
          p.rows = rows;
          p.outputs = outputs;
          MatmulParams ref = p;
          for (int o = 0; o < outputs; ++o) {
            got[o] = Poison(rows * n[o]);
            want[o] = Poison(rows * n[o]);
            p.w[o] = ref.w[o] = &w[o].w;
            p.out[o] = got[o].data();
            ref.out[o] = want[o].data();
            if (o == 1) p.bias[o] = ref.bias[o] = bias.data();
          }
          ASSERT_TRUE(p.Check().ok());
          backend.Matmul(p);
          ReferenceMatmul(ref);
          for (int o = 0; o < outputs; ++o) {
            for (int64_t r = 0; r < rows; ++r) {
              for (int64_t j = 0; j < n[o]; ++j) {
                // Tolerance: float32 rounding of a sum of `cols` products.
                double scale = 0.0;
                for (int64_t k = 0; k < cols; ++k) {
                  scale += std::abs(p.x[r * cols + k] * ReferenceWeightAt(w[o].w, j, k));
                }
                ASSERT_NEAR(got[o][r * n[o] + j], want[o][r * n[o] + j], 1e-5 * scale + 1e-7)
                    << Name(c) << " " << FormatName(format) << " rows " << rows << " cols " << cols
                    << " output " << o << " at [" << r << ", " << j << "]";
              }
            }
          }
        }
      }
    }
  }
}

TEST_F(CpuBackendTest, MatmulManyRowsAndOutputs) {
  // Sizes that cross the activation passes and several chunks per thread.
  for (const Config& c : Configs()) {
    ThreadPool pool(c.threads);
    CpuBackend backend(&pool, CpuOptions{.isa = c.isa});
    const int64_t rows = 131, cols = 517, n = 203;
    TestWeight w(Format::kBf16, n, cols, rng_);
    std::vector<float> x = Random(rows * cols);
    std::vector<float> got = Poison(rows * n), want = Poison(rows * n);
    MatmulParams p;
    p.x = x.data();
    p.rows = rows;
    p.w[0] = &w.w;
    p.out[0] = got.data();
    backend.Matmul(p);
    p.out[0] = want.data();
    ReferenceMatmul(p);
    for (int64_t i = 0; i < rows * n; ++i) {
      ASSERT_NEAR(got[i], want[i], 2e-4) << Name(c) << " at " << i;
    }
  }
}

// Every row count from 1 to 70 (one-row decode, the small-row tiles, the float32 panels with
// every remainder of their row tile, several activation passes), with rows longer than one
// panel (2100 inputs) and an output count that is not a multiple of the panel.
TEST_F(CpuBackendTest, MatmulEveryRowCount) {
  for (const Config& c : Configs()) {
    if (c.isa == CpuIsa::kScalar || c.threads == 3) continue;
    ThreadPool pool(c.threads);
    CpuBackend backend(&pool, CpuOptions{.isa = c.isa});
    for (Format format : {Format::kF32, Format::kF16, Format::kBf16}) {
      for (int64_t cols : {45, 2100}) {
        const int64_t n = cols == 45 ? 23 : 13;
        TestWeight w(format, n, cols, rng_);
        std::vector<float> bias = Random(n);
        for (int64_t rows = 1; rows <= 70; ++rows) {
          std::vector<float> x = Random(rows * cols + 1);
          std::vector<float> got = Poison(rows * n), want = Poison(rows * n);
          MatmulParams p;
          p.x = x.data() + 1;
          p.rows = rows;
          p.w[0] = &w.w;
          p.out[0] = got.data();
          p.bias[0] = rows % 2 ? bias.data() : nullptr;
          backend.Matmul(p);
          p.out[0] = want.data();
          ReferenceMatmul(p);
          for (int64_t r = 0; r < rows; ++r) {
            for (int64_t j = 0; j < n; ++j) {
              double scale = 0.0;
              for (int64_t k = 0; k < cols; ++k) {
                scale += std::abs(p.x[r * cols + k] * ReferenceWeightAt(w.w, j, k));
              }
              ASSERT_NEAR(got[r * n + j], want[r * n + j], 1e-5 * scale + 1e-7)
                  << Name(c) << " " << FormatName(format) << " rows " << rows << " cols " << cols
                  << " at [" << r << ", " << j << "]";
            }
          }
        }
      }
    }
  }
}

// One matmul on a bf16_activations backend of a bf16 weight (`run`: as given or packed) with
// an f32 weight beside it, against the reference: the bf16 output over the activations rounded
// to bf16 when `rounded`, else exact; the f32 output exact.
void CheckBf16Matmul(CpuBackend& backend, const Weight& run, const Weight& bf16, const Weight& f32,
                     int64_t rows, bool rounded, std::mt19937& rng, const std::string& what) {
  const int64_t cols = bf16.cols, n0 = bf16.rows, n1 = f32.rows;
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> x(rows * cols + 1), bias(n0);
  for (float& v : x) v = d(rng);
  for (float& v : bias) v = d(rng);
  std::vector<float> xr(x.size());
  for (size_t i = 0; i < x.size(); ++i) xr[i] = Bf16ToF32(F32ToBf16(x[i]));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> got0(rows * n0, nan), got1(rows * n1, nan);
  std::vector<float> want0(rows * n0, nan), want1(rows * n1, nan);
  MatmulParams p;
  p.x = x.data() + 1;
  p.rows = rows;
  p.outputs = 2;
  p.w[0] = &run;
  p.w[1] = &f32;
  p.out[0] = got0.data();
  p.out[1] = got1.data();
  p.bias[0] = bias.data();
  backend.Matmul(p);
  MatmulParams ref = p;
  ref.outputs = 1;
  ref.x = (rounded ? xr.data() : x.data()) + 1;
  ref.w[0] = &bf16;
  ref.out[0] = want0.data();
  ReferenceMatmul(ref);
  ref.x = x.data() + 1;
  ref.w[0] = &f32;
  ref.out[0] = want1.data();
  ref.bias[0] = nullptr;
  ReferenceMatmul(ref);
  for (size_t i = 0; i < got0.size(); ++i)
    ASSERT_NEAR(got0[i], want0[i], 1e-5 * cols) << what << " rows " << rows << " at " << i;
  for (size_t i = 0; i < got1.size(); ++i)
    ASSERT_NEAR(got1[i], want1[i], 1e-5 * cols) << what << " rows " << rows << " f32 at " << i;
}

// One row through a packed weight of 1100 outputs against the reference, and (with rounded
// activations, where one row runs the same panel kernel as eight) equal bit for bit to the
// same row inside a tile of 8.
void CheckWideRow(CpuBackend& backend, int64_t cols, bool rounded, std::mt19937& rng) {
  constexpr int64_t n = 1100;
  TestWeight wide(Format::kBf16, n, cols, rng);
  TestWeight small(Format::kF32, 3, cols, rng);
  std::unique_ptr<Buffer> storage;
  auto packed = backend.PrepareWeight(wide.w, &storage);
  ASSERT_TRUE(packed.ok()) << packed.status().message();
  CheckBf16Matmul(backend, *packed, wide.w, small.w, 1, rounded, rng,
                  "one row, 1100 outputs, cols " + std::to_string(cols));
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> x(8 * cols);
  for (float& v : x) v = d(rng);
  std::vector<float> one(n), eight(8 * n);
  MatmulParams p;
  p.x = x.data() + 3 * cols;  // row 3 of the eight
  p.rows = 1;
  p.w[0] = &*packed;
  p.out[0] = one.data();
  backend.Matmul(p);
  p.x = x.data();
  p.rows = 8;
  p.out[0] = eight.data();
  backend.Matmul(p);
  for (int64_t i = 0; i < n && rounded; ++i) {
    ASSERT_EQ(one[i], eight[3 * n + i]) << "cols " << cols << " output " << i;
  }
}

// With bf16_activations, bf16 weights as given (not prepared) multiply activations rounded to
// bf16 from kBf16MinRows rows (repacked per call into panels of 32 outputs and 384 inputs, tiles
// of 8 rows, with tails of rows, outputs and inputs); fewer rows stay float32.
TEST_F(CpuBackendTest, MatmulBf16ActivationsMatchRoundedReference) {
  if (!CpuHasAvx512Bf16()) GTEST_SKIP() << "no avx512_bf16";
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    CpuBackend backend(&pool, CpuOptions{.isa = std::nullopt, .bf16_activations = true});
    for (int64_t rows : {1, 2, 7, 16, 32, 45, 64}) {
      for (int64_t cols : {1, 31, 33, 389, 1200}) {
        TestWeight w0(Format::kBf16, 77, cols, rng_);
        TestWeight w1(Format::kF32, 11, cols, rng_);
        CheckBf16Matmul(backend, w0.w, w0.w, w1.w, rows, rows >= CpuOptions::kBf16MinRows, rng_,
                        std::to_string(threads) + "t cols " + std::to_string(cols));
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
}

// A backend that packs bf16 weights (blocks of 32 rows, pairs of inputs per lane): matmuls of
// every row count over the packed weight (partial blocks of rows and of inputs included) against
// the reference, with activations rounded to bf16 where `rounded`; Embed reads a packed table (a
// tied head) as the rows it was packed from.
void CheckPackedWeights(const CpuOptions& options, bool rounded, std::mt19937& rng) {
  for (int threads : {1, 2}) {
    ThreadPool pool(threads);
    CpuBackend backend(&pool, options);
    ASSERT_TRUE(backend.PacksBf16());
    for (int64_t cols : {1, 31, 33, 389, 1200}) {
      TestWeight w0(Format::kBf16, 77, cols, rng);
      TestWeight w1(Format::kF32, 11, cols, rng);
      std::unique_ptr<Buffer> storage;
      auto packed = backend.PrepareWeight(w0.w, &storage);
      ASSERT_TRUE(packed.ok()) << packed.status().message();
      ASSERT_NE(packed->data, w0.w.data);
      const std::string what = std::to_string(threads) + "t packed cols " + std::to_string(cols);
      for (int64_t rows : {1, 2, 3, 4, 5, 8, 10, 13, 16, 17, 18, 40}) {
        CheckBf16Matmul(backend, *packed, w0.w, w1.w, rows, rounded, rng, what);
        if (::testing::Test::HasFatalFailure()) return;
      }
      CheckWideRow(backend, cols, rounded, rng);
      if (::testing::Test::HasFatalFailure()) return;
      std::vector<int32_t> tokens = {0, 76, 31, 32, 5};
      const float nan = std::numeric_limits<float>::quiet_NaN();
      std::vector<float> got(tokens.size() * cols, nan), want(tokens.size() * cols, nan);
      backend.Embed({got.data(), &*packed, tokens.data(), static_cast<int64_t>(tokens.size())});
      backend.Embed({want.data(), &w0.w, tokens.data(), static_cast<int64_t>(tokens.size())});
      EXPECT_EQ(got, want) << what;
    }
  }
}

// With bf16_activations every row count rounds the activations to bf16 over the packed weights.
TEST_F(CpuBackendTest, PackedBf16WeightsMatchRoundedReference) {
  if (!CpuHasAvx512Bf16()) GTEST_SKIP() << "no avx512_bf16";
  CheckPackedWeights(CpuOptions{.isa = std::nullopt, .bf16_activations = true}, true, rng_);
}

// Without it the backend packs bf16 weights too (CPUs with AVX-512 BF16): from
// CpuBackend::kPackedMinRows rows the float32 kernels read the packed panels, each pair widened
// to float32 (exact products and float32 sums); fewer rows read the host data.
TEST_F(CpuBackendTest, PackedWeightsWithFloatActivationsMatchReference) {
  if (!CpuHasAvx512Bf16()) GTEST_SKIP() << "no avx512_bf16";
  CheckPackedWeights(CpuOptions{}, false, rng_);
}

// The swiglu end of a gate/up matmul (CpuBackend::FusesSwiGlu) gives the bits of the matmul
// followed by the SwiGlu op: fused in each task where both outputs are plain (float32, bf16 as
// stored and packed, with float32 and bf16 activations), after the matmul with a quantized one.
TEST_F(CpuBackendTest, MatmulSwiGluEqualsMatmulThenSwiGlu) {
  const int64_t n = 77;
  std::vector<float> wq = Random(n * 384, 0.05f);  // quantized rows: groups of 128 inputs
  auto q8 = quant::QuantizeLinear(wq.data(), n, 384, {Format::kQ8, false, true});
  auto q4 = quant::QuantizeLinear(wq.data(), n, 384, {Format::kQ4, true, true});
  ASSERT_TRUE(q8.ok() && q4.ok());
  const Weight q8w = q8->View(), q4w = q4->View();
  std::vector<CpuOptions> options;
  for (const Config& c : Configs()) options.push_back({.isa = c.isa});
  if (CpuHasAvx512Bf16()) options.push_back({.isa = std::nullopt, .bf16_activations = true});
  if (CpuHasAvx512Vnni()) options.push_back({.isa = std::nullopt, .int8_activations = true});
  for (const CpuOptions& o : options) {
    for (int threads : {1, 2, 3}) {
      ThreadPool pool(threads);
      CpuBackend backend(&pool, o);
      // Prepared: repacked for the integer products with int8_activations.
      std::unique_ptr<Buffer> s8, s4;
      auto pq8 = backend.PrepareWeight(q8w, &s8);
      auto pq4 = backend.PrepareWeight(q4w, &s4);
      ASSERT_TRUE(pq8.ok() && pq4.ok());
      EXPECT_EQ(pq8->layout == kCpuVnniLayout, o.int8_activations);
      for (int64_t cols : {389, 384}) {
        TestWeight f0(Format::kF32, n, cols, rng_), f1(Format::kF32, n, cols, rng_);
        TestWeight b0(Format::kBf16, n, cols, rng_), b1(Format::kBf16, n, cols, rng_);
        std::unique_ptr<Buffer> s0, s1;
        auto p0 = backend.PrepareWeight(b0.w, &s0);
        auto p1 = backend.PrepareWeight(b1.w, &s1);
        ASSERT_TRUE(p0.ok() && p1.ok());
        std::vector<std::pair<const Weight*, const Weight*>> pairs = {
            {&f0.w, &f1.w}, {&b0.w, &b1.w}, {&*p0, &*p1}};
        if (cols == 384) {
          pairs.insert(pairs.end(), {{&q8w, &b1.w}, {&q8w, &q4w}, {&*pq8, &*p1}, {&*pq8, &*pq4}});
        }
        const std::vector<float> bias0 = Random(n), bias1 = Random(n);
        for (const auto& [gate, up] : pairs) {
          for (int64_t rows : {1, 4, 5, 16, 17, 40}) {
            const std::string what =
                std::string(CpuIsaName(backend.isa())) + (o.bf16_activations ? " bf16" : "") +
                (o.int8_activations ? " int8" : "") + " " + std::to_string(threads) + "t " +
                FormatName(gate->format) + "/" + FormatName(up->format) + " cols " +
                std::to_string(cols) + " rows " + std::to_string(rows);
            std::vector<float> x = Random(rows * cols);
            std::vector<float> got = Poison(rows * n), scratch = Poison(rows * n);
            std::vector<float> want = Poison(rows * n), want_up = Poison(rows * n);
            MatmulParams p;
            p.x = x.data();
            p.rows = rows;
            p.outputs = 2;
            p.w[0] = gate;
            p.w[1] = up;
            p.bias[0] = bias0.data();
            p.bias[1] = bias1.data();
            p.out[0] = want.data();
            p.out[1] = want_up.data();
            backend.Matmul(p);
            backend.Glu({want.data(), want.data(), want_up.data(), rows * n});
            p.out[0] = got.data();
            p.out[1] = scratch.data();
            p.swiglu = true;
            backend.Matmul(p);
            for (int64_t i = 0; i < rows * n; ++i) {
              ASSERT_FALSE(std::isnan(want[i])) << what << " at " << i;
              ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0)
                  << what << " at " << i << ": " << got[i] << " vs " << want[i];
            }
          }
        }
      }
    }
  }
}

TEST_F(CpuBackendTest, RmsNormMatchesReference) {
  for (const Config& c : Configs()) {
    ThreadPool pool(c.threads);
    CpuBackend backend(&pool, CpuOptions{.isa = c.isa});
    for (int64_t dim : {1, 15, 384, 1001}) {
      for (int64_t rows : {1, 3, 130}) {
        for (bool residual : {false, true}) {
          for (bool in_place : {false, true}) {
            std::vector<float> x = Random(rows * dim + 1, 3.0f);
            std::vector<float> res = Random(rows * dim + 1);
            std::vector<float> weight = Random(dim);
            std::vector<float> x2 = x, res2 = res;
            std::vector<float> got = Poison(rows * dim), want = Poison(rows * dim);
            RmsNormParams p{.out = in_place ? x.data() + 1 : got.data(),
                            .x = x.data() + 1,
                            .residual = residual ? res.data() + 1 : nullptr,
                            .weight = weight.data(),
                            .rows = rows,
                            .dim = dim,
                            .eps = 1e-6f,
                            .offset = residual ? 1.0f : 0.0f};
            RmsNormParams ref = p;
            ref.out = want.data();
            ref.x = x2.data() + 1;
            ref.residual = residual ? res2.data() + 1 : nullptr;
            backend.RmsNorm(p);
            ReferenceRmsNorm(ref);
            const float* out = in_place ? x.data() + 1 : got.data();
            for (int64_t i = 0; i < rows * dim; ++i) {
              ASSERT_NEAR(out[i], want[i], 1e-5 * (1 + std::abs(want[i])))
                  << Name(c) << " dim " << dim << " rows " << rows << " at " << i;
              if (residual) {
                ASSERT_EQ(res[i + 1], res2[i + 1]);
              }
            }
          }
        }
      }
    }
  }
}

TEST_F(CpuBackendTest, RopeMatchesReference) {
  for (const Config& c : Configs()) {
    ThreadPool pool(c.threads);
    CpuBackend backend(&pool, CpuOptions{.isa = c.isa});
    struct Shape {
      int heads, head_dim, rotary_dims;
      bool norm;
    };
    // Two bases in turn for each shape: the backend's table of angles follows the frequencies.
    for (Shape s : {Shape{6, 64, 64, true}, Shape{3, 10, 6, false}, Shape{2, 33, 32, true}}) {
      for (int64_t rows : {1, 7, 300, 5}) {
        const float base = rows == 5 ? 1e4f : 1e6f;
        std::vector<float> x = Random(rows * s.heads * s.head_dim + 1, 2.0f);
        std::vector<float> want = x;
        std::vector<int32_t> positions(rows);
        for (auto& pos : positions) pos = std::uniform_int_distribution<int>(0, 40000)(rng_);
        std::vector<float> inv_freq(s.rotary_dims / 2);
        for (size_t i = 0; i < inv_freq.size(); ++i) {
          inv_freq[i] = std::pow(base, -2.0f * i / s.rotary_dims);
        }
        std::vector<float> norm = Random(s.head_dim);
        RopeParams p{.x = x.data() + 1,
                     .rows = rows,
                     .heads = s.heads,
                     .head_dim = s.head_dim,
                     .rotary_dims = s.rotary_dims,
                     .positions = positions.data(),
                     .inv_freq = inv_freq.data(),
                     .norm = s.norm ? norm.data() : nullptr};
        ASSERT_TRUE(p.Check().ok());
        RopeParams ref = p;
        ref.x = want.data() + 1;
        backend.Rope(p);
        ReferenceRope(ref);
        for (size_t i = 1; i < x.size(); ++i) {
          ASSERT_NEAR(x[i], want[i], 2e-5 * (1 + std::abs(want[i]))) << Name(c) << " at " << i;
        }
        // The same positions again (as k after q), then one position changed.
        for (int round = 0; round < 2; ++round) {
          if (round == 1) positions[rows / 2] += 1;
          x = Random(x.size(), 2.0f);
          want = x;
          p.x = x.data() + 1;
          ref.x = want.data() + 1;
          backend.Rope(p);
          ReferenceRope(ref);
          for (size_t i = 1; i < x.size(); ++i) {
            ASSERT_NEAR(x[i], want[i], 2e-5 * (1 + std::abs(want[i])))
                << Name(c) << " round " << round << " at " << i;
          }
        }
      }
    }
  }
}

// A KV cache of random contents with pages assigned to slots in shuffled order; f16 pages
// hold the float16 roundings of the same random values, q8 and rotated pages random codes and
// scales (rotated: a step and a min per vector).
struct TestCache {
  int kv_heads, head_dim, slots, max_pages;
  KvFormat format;
  std::vector<float> keys, values;
  std::vector<uint16_t> keys16, values16;
  std::vector<int8_t> keys8, values8;
  std::vector<uint8_t> key_codes, value_codes;  // rotated
  std::vector<float> key_scales, value_scales;
  std::vector<int32_t> pages;
  TestCache(int kv_heads, int head_dim, int slots, int max_pages, std::mt19937& rng,
            KvFormat format = KvFormat::kF32)
      : kv_heads(kv_heads), head_dim(head_dim), slots(slots), max_pages(max_pages), format(format) {
    const int total = slots * max_pages + 1;
    std::uniform_real_distribution<float> d(-1.0f, 1.0f);
    keys.resize(static_cast<size_t>(total) * kPage * kv_heads * head_dim);
    values.resize(keys.size());
    for (auto& v : keys) v = 2.0f * d(rng);
    for (auto& v : values) v = d(rng);
    if (format == KvFormat::kF16) {
      for (float v : keys) keys16.push_back(F32ToF16(v));
      for (float v : values) values16.push_back(F32ToF16(v));
    }
    if (format == KvFormat::kQ8) {
      std::uniform_int_distribution<int> code(-127, 127);
      std::uniform_real_distribution<float> scale(0.5f / 127, 2.0f / 127);
      for (size_t i = 0; i < keys.size(); ++i) {
        keys8.push_back(static_cast<int8_t>(code(rng)));
        values8.push_back(static_cast<int8_t>(code(rng)));
      }
      for (size_t i = 0; i < keys.size() / head_dim; ++i) {
        key_scales.push_back(2.0f * scale(rng));
        value_scales.push_back(scale(rng));
      }
    }
    if (IsRotatedKv(format)) {
      const size_t vectors = keys.size() / head_dim;
      std::uniform_int_distribution<int> byte(0, 255);
      key_codes.resize(vectors * KvKeyBytes(format, head_dim));
      value_codes.resize(vectors * KvValueBytes(format, head_dim));
      for (auto& b : key_codes) b = static_cast<uint8_t>(byte(rng));
      for (auto& b : value_codes) b = static_cast<uint8_t>(byte(rng));
      // Steps that span about [-2, 2] (keys) and [-1, 1] (values) in 2^bits codes (4 bits: the
      // levels of kv::kLevels4 about a min of 0, which reads them back centered).
      auto pair = [](int bits, float span) -> std::pair<float, float> {
        if (bits == 4) return {span / (2.0f * kv::kLevels4[15]), 0.0f};
        return {span / ((1 << bits) - 1.0f), -0.5f * span};
      };
      std::uniform_real_distribution<float> span(0.5f, 1.5f);
      for (size_t i = 0; i < vectors * kv::Groups(head_dim); ++i) {  // a pair a code group
        const auto [key_step, key_min] = pair(KvKeyBits(format), 4.0f * span(rng));
        const auto [value_step, value_min] = pair(KvValueBits(format), 2.0f * span(rng));
        key_scales.insert(key_scales.end(), {key_step, key_min});
        value_scales.insert(value_scales.end(), {value_step, value_min});
      }
    }
    std::vector<int32_t> order(total);
    for (int i = 0; i < total; ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    pages.assign(order.begin(), order.begin() + slots * max_pages);
  }
  KvLayer layer() {
    if (format == KvFormat::kF16) return {keys16.data(), values16.data(), format};
    if (IsRotatedKv(format)) {
      return {key_codes.data(), value_codes.data(), format, key_scales.data(), value_scales.data()};
    }
    if (format == KvFormat::kQ8) {
      return {keys8.data(), values8.data(), format, key_scales.data(), value_scales.data()};
    }
    return {keys.data(), values.data(), format};
  }
  PageTable table() const { return {pages.data(), max_pages}; }
};

// f16 pages: every value rounded as F32ToF16 rounds it (the vector conversions bit for bit),
// values past float16's range saturated to +-65504, a NaN kept.
TEST_F(CpuBackendTest, KvWriteMatchesReference) {
  for (const Config& c : Configs()) {
    for (KvFormat format : {KvFormat::kF32, KvFormat::kF16, KvFormat::kQ8}) {
      SCOPED_TRACE(KvFormatName(format));
      ThreadPool pool(c.threads);
      CpuBackend backend(&pool, CpuOptions{.isa = c.isa});
      TestCache cache(2, 24, 3, 4, rng_, format);
      TestCache want = cache;
      const int64_t rows = 9;
      std::vector<float> k = Random(rows * 2 * 24, 3.0f), v = Random(rows * 2 * 24);
      k[5] = 1e6f;
      k[30] = -70000.0f;
      v[7] = 65519.0f;  // rounds to infinity unsaturated
      v[40] = std::numeric_limits<float>::quiet_NaN();
      k[50] = 1e-7f;  // subnormal in float16
      std::vector<int32_t> slots(rows), positions(rows);
      for (int64_t r = 0; r < rows; ++r) {
        slots[r] = r % 3;
        positions[r] = static_cast<int32_t>(r * 7 % (4 * kPage));
      }
      KvWriteParams p{.cache = cache.layer(),
                      .table = cache.table(),
                      .k = k.data(),
                      .v = v.data(),
                      .slots = slots.data(),
                      .positions = positions.data(),
                      .rows = rows,
                      .kv_heads = 2,
                      .head_dim = 24};
      ASSERT_TRUE(p.Check().ok());
      backend.KvWrite(p);
      p.cache = want.layer();
      ReferenceKvWrite(p);
      if (format == KvFormat::kQ8) {
        EXPECT_EQ(cache.keys8, want.keys8) << Name(c);
        EXPECT_EQ(cache.values8, want.values8) << Name(c);
        // Bit for bit (a NaN scale equals itself this way).
        EXPECT_EQ(0, std::memcmp(cache.key_scales.data(), want.key_scales.data(),
                                 cache.key_scales.size() * 4))
            << Name(c);
        EXPECT_EQ(0, std::memcmp(cache.value_scales.data(), want.value_scales.data(),
                                 cache.value_scales.size() * 4))
            << Name(c);
      } else if (format == KvFormat::kF16) {
        EXPECT_EQ(cache.keys16, want.keys16) << Name(c);
        EXPECT_EQ(cache.values16, want.values16) << Name(c);
        const int64_t at = (cache.pages[0] * kPage) * 2 * 24;  // slot 0, position 0: row 0
        EXPECT_EQ(cache.keys16[at + 5], 0x7bffu);              // 65504
        EXPECT_EQ(cache.keys16[at + 30], 0xfbffu);             // -65504
        EXPECT_EQ(cache.values16[at + 7], 0x7bffu);
      } else {
        EXPECT_EQ(0, std::memcmp(cache.keys.data(), want.keys.data(), cache.keys.size() * 4));
        EXPECT_EQ(0, std::memcmp(cache.values.data(), want.values.data(), cache.values.size() * 4));
      }
    }
  }
}

// 4-bit codes (a least-squares fit from several starts, ops/kv_codes.h Quantize4) against the
// reference's: every group not written the same bit for bit; every written group's squared
// error (read back against the input rotated) within 0.1% of the reference's fit (float32 and
// double may settle on different fits of about the same error where an element lies within
// rounding of a boundary between two levels: up to 0.02% apart on these inputs); a group with a
// NaN a NaN step and min in both.
void CheckFourBitFits(const std::vector<uint8_t>& got_codes, const std::vector<float>& got_scales,
                      const std::vector<uint8_t>& want_codes, const std::vector<float>& want_scales,
                      const std::map<int64_t, std::pair<int64_t, int>>& written,
                      const std::vector<float>& x, int head_dim, const std::string& what) {
  const int part = kv::GroupSize(head_dim), parts = kv::Groups(head_dim);
  const int64_t bytes = kv::CodeBytes(4, head_dim);
  for (size_t vec = 0; vec < got_scales.size() / (2 * parts); ++vec) {
    auto it = written.find(static_cast<int64_t>(vec));
    if (it == written.end()) {
      for (int j = 0; j < 2 * parts; ++j)
        ASSERT_EQ(got_scales[2 * parts * vec + j], want_scales[2 * parts * vec + j]) << what;
      for (int64_t b = 0; b < bytes; ++b)
        ASSERT_EQ(got_codes[vec * bytes + b], want_codes[vec * bytes + b]) << what;
      continue;
    }
    const auto [row, h] = it->second;
    std::vector<float> y(x.begin() + (row * 2 + h) * head_dim,
                         x.begin() + (row * 2 + h + 1) * head_dim);
    kv::Rotate(y.data(), head_dim);
    for (int g = 0; g < parts; ++g) {
      const float* got_pair = &got_scales[2 * (vec * parts + g)];
      const float* want_pair = &want_scales[2 * (vec * parts + g)];
      if (std::isnan(want_pair[0])) {
        EXPECT_TRUE(std::isnan(got_pair[0]) && std::isnan(got_pair[1])) << what;
        continue;
      }
      double got_error = 0.0, want_error = 0.0;
      for (int i = g * part; i < (g + 1) * part; ++i) {
        const double gy =
            got_pair[1] + double{got_pair[0]} * kv::Level4(kv::Code(&got_codes[vec * bytes], i, 4));
        const double wy = want_pair[1] + double{want_pair[0]} *
                                             kv::Level4(kv::Code(&want_codes[vec * bytes], i, 4));
        got_error += (gy - y[i]) * (gy - y[i]);
        want_error += (wy - y[i]) * (wy - y[i]);
      }
      ASSERT_LE(got_error, 1.001 * want_error) << what << " vector " << vec << " group " << g;
    }
  }
}

// The rotated pages of every bit width: every key and value vector rotated and coded as the
// reference does it in double. The fast path rotates in float32, so a code may differ by one where
// the rotated element lies within float32 rounding of a midpoint between two steps, and the step
// and min by 1e-5 of the vector's largest magnitude; a vector with a NaN codes a NaN step and min
// in both.
TEST_F(CpuBackendTest, KvWriteOfRotatedPagesMatchesReference) {
  for (const Config& c : Configs()) {
    for (KvFormat format : {RotatedKv(8, 8), RotatedKv(4, 4), RotatedKv(2, 2), RotatedKv(8, 4),
                            RotatedKv(4, 2), RotatedKv(2, 8)}) {
      SCOPED_TRACE(KvFormatName(format));
      for (int head_dim : {24, 64, 256}) {
        ThreadPool pool(c.threads);
        CpuBackend backend(&pool, CpuOptions{.isa = c.isa});
        TestCache cache(2, head_dim, 3, 4, rng_, format);
        TestCache want = cache;
        const int64_t rows = 9;
        std::vector<float> k = Random(rows * 2 * head_dim, 3.0f), v = Random(rows * 2 * head_dim);
        k[5] = 1e6f;
        v[head_dim + 3] = std::numeric_limits<float>::quiet_NaN();  // row 0, kv head 1
        std::vector<int32_t> slots(rows), positions(rows);
        for (int64_t r = 0; r < rows; ++r) {
          slots[r] = r % 3;
          positions[r] = static_cast<int32_t>(r * 7 % (4 * kPage));
        }
        KvWriteParams p{.cache = cache.layer(),
                        .table = cache.table(),
                        .k = k.data(),
                        .v = v.data(),
                        .slots = slots.data(),
                        .positions = positions.data(),
                        .rows = rows,
                        .kv_heads = 2,
                        .head_dim = head_dim};
        ASSERT_TRUE(p.Check().ok());
        backend.KvWrite(p);
        p.cache = want.layer();
        ReferenceKvWrite(p);
        // The input vector of each written vector index (row's key or value of kv head h).
        std::map<int64_t, std::pair<int64_t, int>> written;  // vector -> {row, kv head}
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t page = cache.pages[slots[r] * 4 + positions[r] / kPage];
          for (int h = 0; h < 2; ++h)
            written[(page * kPage + positions[r] % kPage) * 2 + h] = {r, h};
        }
        for (bool keys : {true, false}) {
          const int bits = keys ? KvKeyBits(format) : KvValueBits(format);
          const int64_t bytes =
              keys ? KvKeyBytes(format, head_dim) : KvValueBytes(format, head_dim);
          if (bits == 4) {
            CheckFourBitFits(keys ? cache.key_codes : cache.value_codes,
                             keys ? cache.key_scales : cache.value_scales,
                             keys ? want.key_codes : want.value_codes,
                             keys ? want.key_scales : want.value_scales, written, keys ? k : v,
                             head_dim, Name(c) + (keys ? " keys" : " values"));
            continue;
          }
          const auto& got_codes = keys ? cache.key_codes : cache.value_codes;
          const auto& want_codes = keys ? want.key_codes : want.value_codes;
          const auto& got_scales = keys ? cache.key_scales : cache.value_scales;
          const auto& want_scales = keys ? want.key_scales : want.value_scales;
          // A {step, min} pair a code group of a vector.
          const int part = kv::GroupSize(head_dim), parts = kv::Groups(head_dim);
          int nan_groups = 0;
          for (size_t j = 0; j < got_scales.size() / 2; ++j) {
            const size_t vec = j / parts;
            const float step = want_scales[2 * j], min = want_scales[2 * j + 1];
            if (std::isnan(step)) {
              ++nan_groups;
              EXPECT_TRUE(std::isnan(got_scales[2 * j]) && std::isnan(got_scales[2 * j + 1]));
              continue;
            }
            const float top = std::max(std::fabs(min + step * kv::Level(bits, 0)),
                                       std::fabs(min + step * kv::Level(bits, (1 << bits) - 1)));
            ASSERT_NEAR(got_scales[2 * j], step, 1e-5f * top) << Name(c) << " group " << j;
            ASSERT_NEAR(got_scales[2 * j + 1], min, 1e-5f * top) << Name(c) << " group " << j;
            for (int i = static_cast<int>(j % parts) * part;
                 i < static_cast<int>(j % parts + 1) * part; ++i) {
              ASSERT_LE(std::abs(kv::Code(got_codes.data() + vec * bytes, i, bits) -
                                 kv::Code(want_codes.data() + vec * bytes, i, bits)),
                        1)
                  << Name(c) << (keys ? " keys" : " values") << " vector " << vec << " at " << i;
            }
          }
          // Every group of the rotation block with the NaN.
          const int block = kv::RotationBlock(head_dim);
          EXPECT_EQ(nan_groups, keys ? 0 : block >= part ? block / part : 1);
        }
      }
    }
  }
}

struct AttentionShape {
  int heads, kv_heads, head_dim, window;
  float softcap = 0.0f;
};

// The backend's attention of rows (their slots and positions) over `cache` against the reference,
// within 2e-6; over rotated pages within 4e-6 (the query rotated and the output rotated back in
// float32 besides: up to log2(128) = 7 more roundings of elements of about 1).
// The queries start one float past an aligned buffer.
void CheckAttention(CpuBackend& backend, TestCache& cache, const AttentionShape& s,
                    const std::vector<int32_t>& row_slots, const std::vector<int32_t>& positions,
                    const std::vector<float>& q, const std::string& what) {
  const int64_t rows = static_cast<int64_t>(row_slots.size());
  std::vector<float> got(rows * s.heads * s.head_dim, std::nanf(""));
  std::vector<float> want(rows * s.heads * s.head_dim, std::nanf(""));
  AttentionParams p{.out = got.data(),
                    .q = q.data() + 1,
                    .cache = cache.layer(),
                    .table = cache.table(),
                    .slots = row_slots.data(),
                    .positions = positions.data(),
                    .rows = rows,
                    .heads = s.heads,
                    .kv_heads = s.kv_heads,
                    .head_dim = s.head_dim,
                    .scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim)),
                    .window = s.window,
                    .softcap = s.softcap};
  ASSERT_TRUE(p.Check().ok());
  backend.Attention(p);
  p.out = want.data();
  ReferenceAttention(p);
  const double tolerance = IsRotatedKv(cache.format) ? 4e-6 : 2e-6;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tolerance)
        << what << " heads " << s.heads << " head_dim " << s.head_dim << " window " << s.window
        << " rows " << rows << " at " << i;
  }
}

TEST_F(CpuBackendTest, AttentionMatchesReference) {
  for (const Config& c : Configs()) {
    for (KvFormat format : {KvFormat::kF32, KvFormat::kF16, KvFormat::kQ8, RotatedKv(8, 8),
                            RotatedKv(4, 4), RotatedKv(2, 2), RotatedKv(8, 4)}) {
      SCOPED_TRACE(KvFormatName(format));
      ThreadPool pool(c.threads);
      CpuBackend backend(&pool, CpuOptions{.isa = c.isa});
      for (AttentionShape s :
           {AttentionShape{6, 2, 64, 0}, AttentionShape{4, 4, 37, 0}, AttentionShape{3, 1, 16, 21},
            AttentionShape{8, 2, 128, 0}, AttentionShape{10, 2, 24, 0}, AttentionShape{67, 1, 8, 0},
            AttentionShape{8, 4, 256, 0}, AttentionShape{4, 2, 32, 0, 0.5f},
            AttentionShape{4, 1, 64, 9, 0.2f}}) {
        if (IsRotatedKv(format) && s.head_dim % 8 != 0) continue;  // (Check refuses them)
        // Contexts up to 19 pages: the online softmax runs over several chunks of pages.
        const int slots = 3, max_pages = 19;
        TestCache cache(s.kv_heads, s.head_dim, slots, max_pages, rng_, format);
        for (int64_t rows : {1, 2, 40}) {
          std::vector<int32_t> row_slots(rows), positions(rows);
          for (int64_t r = 0; r < rows; ++r) {
            row_slots[r] = std::uniform_int_distribution<int>(0, slots - 1)(rng_);
            positions[r] = std::uniform_int_distribution<int>(0, max_pages * kPage - 1)(rng_);
          }
          positions[0] = 0;  // a row that sees only itself
          CheckAttention(backend, cache, s, row_slots, positions,
                         Random(rows * s.heads * s.head_dim + 1), Name(c));
        }
      }
    }
  }
}

// The attention over rotated pages that KvWrite filled against the float32 attention over the
// keys and values as given, within a bound the codes' steps give. Each rotated element reads back
// within step / 2, or within what its range clipped (an element past [lo, lo + step * levels]),
// so (R orthogonal) a vector within e = sqrt(head_dim) * that in L2. A
// score then moves by at most d = scale * |q| * e_k, each softmax weight by a factor within
// [exp(-2d), exp(2d)], and the output (per head, L2) by at most
//   max_t e_v(t) + (exp(2 d_max) - 1) * max_t |v_t|.
TEST_F(CpuBackendTest, AttentionOverRotatedPagesIsWithinTheirSteps) {
  ThreadPool pool(2);
  CpuBackend backend(&pool, CpuOptions{});
  for (KvFormat format :
       {RotatedKv(8, 8), RotatedKv(8, 4), RotatedKv(4, 4), RotatedKv(4, 2), RotatedKv(2, 2)}) {
    for (AttentionShape s : {AttentionShape{8, 2, 128, 0}, AttentionShape{4, 1, 64, 0},
                             AttentionShape{4, 2, 256, 0}}) {
      SCOPED_TRACE(KvFormatName(format) + " head_dim " + std::to_string(s.head_dim));
      const int slots = 2, max_pages = 5, context = max_pages * kPage;
      TestCache floats(s.kv_heads, s.head_dim, slots, max_pages, rng_, KvFormat::kF32);
      TestCache codes(s.kv_heads, s.head_dim, slots, max_pages, rng_, format);
      codes.pages = floats.pages;
      // Keys with channel offsets (as a model's keys have) and every position of both slots.
      const int64_t width = static_cast<int64_t>(s.kv_heads) * s.head_dim;
      const int64_t rows = slots * context;
      std::vector<float> k = Random(rows * width, 1.0f), v = Random(rows * width, 1.0f);
      for (int64_t i = 0; i < rows * width; ++i) k[i] += (i % s.head_dim) % 7 == 0 ? 3.0f : 0.0f;
      std::vector<int32_t> slot_of(rows), position_of(rows);
      for (int64_t r = 0; r < rows; ++r) {
        slot_of[r] = static_cast<int32_t>(r / context);
        position_of[r] = static_cast<int32_t>(r % context);
      }
      KvWriteParams write{.cache = codes.layer(),
                          .table = codes.table(),
                          .k = k.data(),
                          .v = v.data(),
                          .slots = slot_of.data(),
                          .positions = position_of.data(),
                          .rows = rows,
                          .kv_heads = s.kv_heads,
                          .head_dim = s.head_dim};
      ASSERT_TRUE(write.Check().ok());
      backend.KvWrite(write);
      write.cache = floats.layer();
      ReferenceKvWrite(write);
      // Queries: the last position of each slot, and one mid-context.
      const std::vector<int32_t> q_slots = {0, 1, 1}, q_positions = {context - 1, context - 1, 37};
      const int64_t q_rows = 3;
      const std::vector<float> q = Random(q_rows * s.heads * s.head_dim, 2.0f);
      std::vector<float> got(q.size(), std::nanf("")), want(q.size(), std::nanf(""));
      AttentionParams p{.out = got.data(),
                        .q = q.data(),
                        .cache = codes.layer(),
                        .table = codes.table(),
                        .slots = q_slots.data(),
                        .positions = q_positions.data(),
                        .rows = q_rows,
                        .heads = s.heads,
                        .kv_heads = s.kv_heads,
                        .head_dim = s.head_dim,
                        .scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim))};
      ASSERT_TRUE(p.Check().ok());
      backend.Attention(p);
      p.cache = floats.layer();
      p.out = want.data();
      ReferenceAttention(p);
      const int group = s.heads / s.kv_heads;
      double worst = 0.0;
      for (int64_t r = 0; r < q_rows; ++r) {
        for (int h = 0; h < s.heads; ++h) {
          const int kvh = h / group;
          double q_norm = 0.0;
          const float* qh = q.data() + (r * s.heads + h) * s.head_dim;
          for (int i = 0; i < s.head_dim; ++i) q_norm += double{qh[i]} * qh[i];
          q_norm = std::sqrt(q_norm);
          double key_error = 0.0, value_error = 0.0, value_norm = 0.0;
          for (int32_t pos = 0; pos <= q_positions[r]; ++pos) {
            const int64_t vec =
                (int64_t{codes.pages[q_slots[r] * max_pages + pos / kPage]} * kPage + pos % kPage) *
                    s.kv_heads +
                kvh;
            const int64_t row = (q_slots[r] * context + pos) * width + kvh * s.head_dim;
            // The largest error of an element of the rotated vector x, from its code group's
            // step and range: half the widest gap between two levels within the range (half a
            // step; 4 bits: half the gap of the outermost levels of kv::kLevels4), else the
            // distance to the range's end.
            auto element_error = [&](const float* x, const float* step_mins, int bits) {
              std::vector<float> y(x, x + s.head_dim);
              kv::Rotate(y.data(), s.head_dim);
              const int top = (1 << bits) - 1;
              double gap = 0.0;
              for (int c = 0; c < top; ++c)
                gap = std::max(gap, double{kv::Level(bits, c + 1)} - kv::Level(bits, c));
              double e = 0.0;
              for (int i = 0; i < s.head_dim; ++i) {
                const float* sm = step_mins + 2 * (i / kv::GroupSize(s.head_dim));
                const double lo = sm[1] + double{sm[0]} * kv::Level(bits, 0),
                             hi = sm[1] + double{sm[0]} * kv::Level(bits, top);
                e = std::max({e, sm[0] * gap / 2.0, lo - y[i], y[i] - hi});
              }
              return e * 1.0001;  // (y rotated in float32)
            };
            const double root = std::sqrt(static_cast<double>(s.head_dim));
            key_error = std::max(
                key_error, root * element_error(k.data() + row,
                                                &codes.key_scales[2 * kv::Groups(s.head_dim) * vec],
                                                KvKeyBits(format)));
            value_error =
                std::max(value_error,
                         root * element_error(v.data() + row,
                                              &codes.value_scales[2 * kv::Groups(s.head_dim) * vec],
                                              KvValueBits(format)));
            double norm = 0.0;
            const float* vv = v.data() + row;
            for (int i = 0; i < s.head_dim; ++i) norm += double{vv[i]} * vv[i];
            value_norm = std::max(value_norm, std::sqrt(norm));
          }
          const double d = p.scale * q_norm * key_error;
          const double bound = value_error + std::expm1(2 * d) * value_norm;
          double error = 0.0;
          for (int i = 0; i < s.head_dim; ++i) {
            const int64_t at = (r * s.heads + h) * s.head_dim + i;
            error += (double{got[at]} - want[at]) * (double{got[at]} - want[at]);
          }
          error = std::sqrt(error);
          ASSERT_LE(error, bound) << "row " << r << " head " << h;
          worst = std::max(worst, error / bound);
        }
      }
      // The bound is not vacuous at 8-bit keys: the error is a sizable part of it somewhere. (At 4
      // and 2 bits its key term, every score moved by its largest shift, is far above the
      // typical error.)
      if (KvKeyBits(format) == 8) EXPECT_GT(worst, 1e-3);
    }
  }
}

// Prompt rows: runs of a slot's rows at consecutive positions (AVX-512 takes them in tiles of 16
// lanes, a lane a row and query head), beside single rows; contexts that start mid-page, windows
// shorter than the run, and query heads a kv head of 1 (16 rows a tile), 3, 4 and 8 (2 rows).
TEST_F(CpuBackendTest, AttentionOverPromptRunsMatchesReference) {
  for (const Config& c : Configs()) {
    for (KvFormat format : {KvFormat::kF32, KvFormat::kF16, KvFormat::kQ8, RotatedKv(4, 2)}) {
      SCOPED_TRACE(KvFormatName(format));
      ThreadPool pool(c.threads);
      CpuBackend backend(&pool, CpuOptions{.isa = c.isa});
      for (AttentionShape s :
           {AttentionShape{6, 2, 64, 0}, AttentionShape{4, 4, 32, 0}, AttentionShape{8, 2, 128, 0},
            AttentionShape{16, 2, 16, 0}, AttentionShape{6, 2, 48, 21}, AttentionShape{4, 1, 16, 5},
            AttentionShape{4, 2, 256, 40}, AttentionShape{4, 1, 16, 5, 0.3f}}) {
        const int slots = 4, max_pages = 12;
        TestCache cache(s.kv_heads, s.head_dim, slots, max_pages, rng_, format);
        // Runs (slot, first position, rows): one row, a run shorter than a tile, runs of many
        // tiles starting mid-page and at 0.
        const struct {
          int slot, first, rows;
        } runs[] = {{0, 37, 1}, {1, 5, 7}, {2, 0, 45}, {3, 100, 60}, {0, 38, 1}};
        std::vector<int32_t> row_slots, positions;
        for (const auto& run : runs) {
          for (int i = 0; i < run.rows; ++i) {
            row_slots.push_back(run.slot);
            positions.push_back(run.first + i);
          }
        }
        const int64_t rows = static_cast<int64_t>(row_slots.size());
        CheckAttention(backend, cache, s, row_slots, positions,
                       Random(rows * s.heads * s.head_dim + 1), Name(c));
      }
    }
  }
}

// Window paging (model/runner.h KvPaging) leaves a window layer's page table without pages for
// the blocks before the window of the slot's earliest row in the step. Here those blocks point
// at the one page no table holds, made NaN: a kernel that read one (a row, a chunk of pages, a
// tile of 16 keys starting before the window) would put NaN in the output. Windows shorter than
// a page and across pages; runs starting mid-page; single rows.
TEST_F(CpuBackendTest, AttentionReadsNoBlockBeforeTheWindow) {
  for (const Config& c : Configs()) {
    for (KvFormat format : {KvFormat::kF32, KvFormat::kF16, KvFormat::kQ8, RotatedKv(4, 2)}) {
      SCOPED_TRACE(KvFormatName(format));
      ThreadPool pool(c.threads);
      CpuBackend backend(&pool, CpuOptions{.isa = c.isa});
      for (AttentionShape s :
           {AttentionShape{4, 2, 32, 8}, AttentionShape{6, 2, 64, 37}, AttentionShape{4, 1, 16, 5},
            AttentionShape{4, 2, 256, 40}, AttentionShape{4, 1, 16, 21, 0.3f}}) {
        const int slots = 4, max_pages = 12;
        TestCache cache(s.kv_heads, s.head_dim, slots, max_pages, rng_, format);
        const struct {
          int slot, first, rows;
        } runs[] = {{0, 137, 1}, {1, 50, 7}, {2, 64, 45}, {3, 100, 60}, {0, 138, 1}};
        std::vector<int32_t> row_slots, positions;
        std::vector<int32_t> first(slots, INT32_MAX);
        for (const auto& run : runs) {
          for (int i = 0; i < run.rows; ++i) {
            row_slots.push_back(run.slot);
            positions.push_back(run.first + i);
            first[run.slot] = std::min(first[run.slot], std::max(0, run.first + i - s.window + 1));
          }
        }
        // The page no table holds, NaN in every element.
        std::vector<bool> held(slots * max_pages + 1, false);
        for (int32_t page : cache.pages) held[page] = true;
        const int32_t spare =
            static_cast<int32_t>(std::find(held.begin(), held.end(), false) - held.begin());
        const size_t page_elements = static_cast<size_t>(kPage) * s.kv_heads * s.head_dim;
        for (size_t i = spare * page_elements; i < (spare + 1) * page_elements; ++i) {
          if (format == KvFormat::kF16) {
            cache.keys16[i] = cache.values16[i] = F32ToF16(std::nanf(""));
          } else {
            cache.keys[i] = cache.values[i] = std::nanf("");
          }
        }
        // Codes: the page's scales (one a vector, or a step and a min a code group).
        const size_t vector_scales = format == KvFormat::kQ8 ? 1
                                     : IsRotatedKv(format)   ? 2 * kv::Groups(s.head_dim)
                                                             : 0;
        const size_t page_scales = page_elements / s.head_dim * vector_scales;
        for (size_t i = spare * page_scales; i < (spare + 1) * page_scales; ++i) {
          cache.key_scales[i] = cache.value_scales[i] = std::nanf("");
        }
        std::vector<int32_t> holes = cache.pages;
        int dropped = 0;
        for (int32_t slot = 0; slot < slots; ++slot) {
          for (int32_t b = 0; first[slot] != INT32_MAX && b < first[slot] / kPage; ++b) {
            holes[slot * max_pages + b] = spare;
            ++dropped;
          }
        }
        ASSERT_GT(dropped, 0);
        const int64_t rows = static_cast<int64_t>(row_slots.size());
        const std::vector<float> q = Random(rows * s.heads * s.head_dim);
        std::vector<float> got(q.size(), std::nanf("")), want(q.size(), std::nanf(""));
        AttentionParams p{.out = got.data(),
                          .q = q.data(),
                          .cache = cache.layer(),
                          .table = {holes.data(), max_pages},
                          .slots = row_slots.data(),
                          .positions = positions.data(),
                          .rows = rows,
                          .heads = s.heads,
                          .kv_heads = s.kv_heads,
                          .head_dim = s.head_dim,
                          .scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim)),
                          .window = s.window,
                          .softcap = s.softcap};
        ASSERT_TRUE(p.Check().ok());
        backend.Attention(p);
        p.out = want.data();
        p.table = cache.table();
        ReferenceAttention(p);
        const double tolerance = IsRotatedKv(format) ? 4e-6 : 2e-6;
        for (size_t i = 0; i < got.size(); ++i) {
          ASSERT_NEAR(got[i], want[i], tolerance)
              << Name(c) << " head_dim " << s.head_dim << " window " << s.window << " at " << i;
        }
      }
    }
  }
}

TEST_F(CpuBackendTest, ElementwiseMatchReference) {
  for (const Config& c : Configs()) {
    ThreadPool pool(c.threads);
    CpuBackend backend(&pool, CpuOptions{.isa = c.isa});
    for (int64_t n : {1, 13, 1152, 100003}) {
      std::vector<float> gate = Random(n + 1, 12.0f), up = Random(n + 1, 3.0f);
      gate[1] = -100.0f;  // silu's far tails
      gate[n] = 100.0f;
      std::vector<float> got = Poison(n + 1), want = Poison(n + 1);
      for (Activation act : {Activation::kSilu, Activation::kGeluTanh}) {
        GluParams p{.out = got.data() + 1,
                    .gate = gate.data() + 1,
                    .up = up.data() + 1,
                    .n = n,
                    .act = act};
        backend.Glu(p);
        p.out = want.data() + 1;
        ReferenceGlu(p);
        for (int64_t i = 1; i <= n; ++i) {
          ASSERT_NEAR(got[i], want[i], 2e-6 * (1 + std::abs(want[i])))
              << Name(c) << " act " << static_cast<int>(act) << " at " << i;
        }
        ASSERT_TRUE(std::isnan(got[0])) << "wrote before out";
      }
      std::vector<float> capped = Random(n + 1, 80.0f), capped2 = capped;
      backend.Softcap({.x = capped.data() + 1, .n = n, .cap = 30.0f});
      ReferenceSoftcap({.x = capped2.data() + 1, .n = n, .cap = 30.0f});
      for (int64_t i = 0; i <= n; ++i) {
        ASSERT_NEAR(capped[i], capped2[i], 4e-6 * 30) << Name(c) << " softcap at " << i;
        ASSERT_LE(std::abs(capped[i]), i == 0 ? 80.0f : 30.0f);
      }
      std::vector<float> a = Random(n + 1), b = Random(n + 1), a2 = a;
      backend.Add({.out = a.data() + 1, .x = b.data() + 1, .n = n});
      ReferenceAdd({.out = a2.data() + 1, .x = b.data() + 1, .n = n});
      ASSERT_EQ(a, a2) << Name(c);
    }
    for (Format format : {Format::kF32, Format::kF16, Format::kBf16}) {
      TestWeight table(format, 50, 77, rng_);
      std::vector<int32_t> tokens = {3, 49, 0, 3, 17};
      std::vector<float> got = Poison(5 * 77), want = Poison(5 * 77);
      EmbedParams p{.out = got.data(), .table = &table.w, .tokens = tokens.data(), .rows = 5};
      ASSERT_TRUE(p.Check().ok());
      backend.Embed(p);
      p.out = want.data();
      ReferenceEmbed(p);
      ASSERT_EQ(got, want) << Name(c) << " " << FormatName(format);
      // Scaled (Gemma's sqrt(dim)): the same rows times the scale.
      p.scale = 8.0f;
      p.out = got.data();
      backend.Embed(p);
      for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i] * 8.0f) << i;
    }
    std::vector<float> x = Random(9 * 33);
    std::vector<int32_t> index = {8, 0, 4, 4};
    std::vector<float> got = Poison(4 * 33), want = Poison(4 * 33);
    GatherRowsParams p{
        .out = got.data(), .x = x.data(), .index = index.data(), .count = 4, .dim = 33};
    backend.GatherRows(p);
    p.out = want.data();
    ReferenceGatherRows(p);
    ASSERT_EQ(got, want) << Name(c);
  }
}

TEST_F(CpuBackendTest, AllocateAndPrepareWeight) {
  ThreadPool pool(2);
  std::unique_ptr<Backend> backend = MakeCpuBackend(&pool);
  EXPECT_EQ(backend->kind(), DeviceKind::kCpu);
  auto buffer = backend->Allocate(1000);
  ASSERT_TRUE(buffer.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*buffer)->data()) % 64, 0u);
  for (size_t i = 0; i < 1000; ++i) ASSERT_EQ((*buffer)->as<uint8_t>()[i], 0);

  TestWeight plain(Format::kF32, 4, 8, rng_);
  std::unique_ptr<Buffer> storage;
  auto prepared = backend->PrepareWeight(plain.w, &storage);
  ASSERT_TRUE(prepared.ok());
  EXPECT_EQ(prepared->data, plain.w.data);  // used in place
  EXPECT_EQ(storage, nullptr);
  // bf16: packed into panels where the CPU has AVX-512 BF16, else used in place.
  TestWeight half(Format::kBf16, 4, 8, rng_);
  auto packed = backend->PrepareWeight(half.w, &storage);
  ASSERT_TRUE(packed.ok());
  const bool packs = DetectCpuIsa() == CpuIsa::kAvx512 && CpuHasAvx512Bf16();
  EXPECT_EQ(packed->data != half.w.data, packs);
  EXPECT_EQ(storage != nullptr, packs);

  // A quantized weight without its scales is refused, naming the format's problem.
  Weight q4 = half.w;
  q4.format = Format::kQ4;
  auto refused = backend->PrepareWeight(q4, &storage);
  ASSERT_FALSE(refused.ok());
  EXPECT_FALSE(refused.status().message().empty());
}

TEST_F(CpuBackendTest, OptionsCheck) {
  ThreadPool pool(1);
  EXPECT_TRUE(MakeCpuBackend(&pool, CpuOptions{.isa = CpuIsa::kScalar}).ok());
  auto bf16 = MakeCpuBackend(&pool, CpuOptions{.isa = std::nullopt, .bf16_activations = true});
  EXPECT_EQ(bf16.ok(), CpuHasAvx512Bf16());
  auto int8 = MakeCpuBackend(&pool, CpuOptions{.isa = std::nullopt, .int8_activations = true});
  EXPECT_EQ(int8.ok(), CpuHasAvx512Vnni());
  auto int8_avx2 =
      MakeCpuBackend(&pool, CpuOptions{.isa = CpuIsa::kAvx2, .int8_activations = true});
  ASSERT_FALSE(int8_avx2.ok());
  EXPECT_NE(int8_avx2.status().message().find("int8_activations"), std::string::npos)
      << int8_avx2.status().message();
}

// With int8_activations, PrepareWeight repacks q8 and q4 weights (a copy it owns; scales and
// zeros folded in) and leaves q2 and plain formats as they are.
TEST_F(CpuBackendTest, Int8ActivationsRepackEightAndFourBitWeights) {
  if (!CpuHasAvx512Vnni()) GTEST_SKIP() << "no avx512_vnni";
  ThreadPool pool(2);
  CpuBackend backend(&pool, CpuOptions{.isa = std::nullopt, .int8_activations = true});
  EXPECT_NE(backend.Describe().find("int8 activations"), std::string::npos);
  const int64_t n = 20;
  std::vector<float> wq = Random(n * 256, 0.05f);
  for (Format f : {Format::kQ8, Format::kQ4, Format::kQ2}) {
    auto q = quant::QuantizeLinear(wq.data(), n, 256, {f, f != Format::kQ8, true});
    ASSERT_TRUE(q.ok());
    std::unique_ptr<Buffer> storage;
    auto prepared = backend.PrepareWeight(q->View(), &storage);
    ASSERT_TRUE(prepared.ok()) << prepared.status().message();
    const bool packs = f != Format::kQ2;
    EXPECT_EQ(prepared->layout == kCpuVnniLayout, packs) << FormatName(f);
    EXPECT_EQ(storage != nullptr, packs) << FormatName(f);
    EXPECT_EQ(prepared->data != q->View().data, packs) << FormatName(f);
    EXPECT_EQ(prepared->scales == nullptr, packs) << FormatName(f);
    if (packs) {
      EXPECT_GE(storage->bytes(), static_cast<size_t>(VnniPackedBytes(q->View())));
    }
  }
}

}  // namespace
}  // namespace gizllm

namespace gizllm {
namespace {

// MoeFeedForward against the float64 reference: rows grouped by expert, one expert per row up to
// all of them, with and without renormalization and accumulation, and a zero router (every
// probability equal: the lowest indices win).
TEST_F(CpuBackendTest, MoeFeedForwardMatchesReference) {
  constexpr int kExperts = 7;
  constexpr int64_t kDim = 37, kFfn = 21;
  const std::vector<float> zeros(kExperts * kDim, 0.0f);
  const Weight zero_router{
      .format = Format::kF32, .rows = kExperts, .cols = kDim, .data = zeros.data()};
  for (const Config& c : Configs()) {
    ThreadPool pool(c.threads);
    CpuBackend backend(&pool, CpuOptions{.isa = c.isa});
    for (Format format : {Format::kF32, Format::kBf16}) {
      TestWeight router(format, kExperts, kDim, rng_);
      std::vector<TestWeight> experts;
      for (int e = 0; e < kExperts; ++e) {
        experts.emplace_back(format, kFfn, kDim, rng_);
        experts.emplace_back(format, kFfn, kDim, rng_);
        experts.emplace_back(format, kDim, kFfn, rng_);
      }
      std::vector<Weight> gate, up, down;
      for (int e = 0; e < kExperts; ++e) {
        gate.push_back(experts[3 * e].w);
        up.push_back(experts[3 * e + 1].w);
        down.push_back(experts[3 * e + 2].w);
      }
      for (int64_t rows : {1, 3, 17, 40}) {
        for (int top_k : {1, 2, kExperts}) {
          for (int variant = 0; variant < 4; ++variant) {
            const bool norm = variant & 1, accumulate = variant & 2;
            const bool zero = rows == 3 && top_k == 2;
            std::vector<float> x = Random(rows * kDim);
            std::vector<float> got = accumulate ? Random(rows * kDim) : Poison(rows * kDim);
            std::vector<float> want = got;
            MoeFeedForwardParams p;
            p.out = got.data();
            p.x = x.data();
            p.rows = rows;
            p.dim = kDim;
            p.ffn = kFfn;
            p.experts = kExperts;
            p.top_k = top_k;
            p.norm_topk_prob = norm;
            p.accumulate = accumulate;
            p.router = zero ? &zero_router : &router.w;
            p.gate = gate.data();
            p.up = up.data();
            p.down = down.data();
            ASSERT_TRUE(p.Check().ok()) << p.Check().message();
            MoeFeedForwardParams ref = p;
            ref.out = want.data();
            backend.MoeFeedForward(p);
            ReferenceMoeFeedForward(ref);
            double scale = 0.0;
            for (float v : want) scale = std::max(scale, std::fabs(static_cast<double>(v)));
            for (int64_t i = 0; i < rows * kDim; ++i) {
              ASSERT_NEAR(got[i], want[i], 2e-5 * scale)
                  << Name(c) << " " << FormatName(format) << " rows " << rows << " top_k " << top_k
                  << " norm " << norm << " accumulate " << accumulate << " zero router " << zero
                  << " at " << i;
            }
          }
        }
      }
    }
  }
}

// A shared expert (Qwen3-Next, Qwen3.5-MoE) beside the routed ones, gated by sigmoid(x G^T) or
// ungated, against the reference.
TEST_F(CpuBackendTest, MoeSharedExpertMatchesReference) {
  constexpr int kExperts = 5;
  constexpr int64_t kDim = 29, kFfn = 11, kShared = 19;
  for (const Config& c : Configs()) {
    ThreadPool pool(c.threads);
    CpuBackend backend(&pool, CpuOptions{.isa = c.isa});
    TestWeight router(Format::kF32, kExperts, kDim, rng_);
    std::vector<TestWeight> experts;
    std::vector<Weight> gate, up, down;
    for (int e = 0; e < kExperts; ++e) {
      experts.emplace_back(Format::kBf16, kFfn, kDim, rng_);
      experts.emplace_back(Format::kBf16, kFfn, kDim, rng_);
      experts.emplace_back(Format::kBf16, kDim, kFfn, rng_);
    }
    for (int e = 0; e < kExperts; ++e) {
      gate.push_back(experts[3 * e].w);
      up.push_back(experts[3 * e + 1].w);
      down.push_back(experts[3 * e + 2].w);
    }
    TestWeight shared_gate(Format::kBf16, kShared, kDim, rng_);
    TestWeight shared_up(Format::kBf16, kShared, kDim, rng_);
    TestWeight shared_down(Format::kBf16, kDim, kShared, rng_);
    TestWeight scale(Format::kF32, 1, kDim, rng_);
    for (int64_t rows : {1, 6, 23}) {
      for (bool gated : {false, true}) {
        std::vector<float> x = Random(rows * kDim);
        std::vector<float> got = Poison(rows * kDim), want = got;
        MoeFeedForwardParams p;
        p.out = got.data();
        p.x = x.data();
        p.rows = rows;
        p.dim = kDim;
        p.ffn = kFfn;
        p.experts = kExperts;
        p.top_k = 2;
        p.norm_topk_prob = true;
        p.router = &router.w;
        p.gate = gate.data();
        p.up = up.data();
        p.down = down.data();
        p.shared_ffn = kShared;
        p.shared_gate = &shared_gate.w;
        p.shared_up = &shared_up.w;
        p.shared_down = &shared_down.w;
        p.shared_scale = gated ? &scale.w : nullptr;
        ASSERT_TRUE(p.Check().ok()) << p.Check().message();
        MoeFeedForwardParams ref = p;
        ref.out = want.data();
        backend.MoeFeedForward(p);
        ReferenceMoeFeedForward(ref);
        double top = 0.0;
        for (float v : want) top = std::max(top, std::fabs(static_cast<double>(v)));
        for (int64_t i = 0; i < rows * kDim; ++i) {
          ASSERT_NEAR(got[i], want[i], 2e-5 * top)
              << Name(c) << " rows " << rows << " gated " << gated << " at " << i;
        }
      }
    }
  }
}

// The reference itself: a zero router gives every expert the same probability, so the lowest
// indices are picked, each with weight 1/experts, or 1/top_k renormalized.
TEST_F(CpuBackendTest, MoeReferencePicksLowestIndicesOnTies) {
  constexpr int kExperts = 4;
  constexpr int64_t kDim = 3, kFfn = 2;
  const std::vector<float> zeros(kExperts * kDim, 0.0f);
  // Expert e: gate and up rows all ones, down = (e + 1) on every entry.
  std::vector<std::vector<float>> downs;
  const std::vector<float> ones(kFfn * kDim, 1.0f);
  std::vector<Weight> gate, up, down;
  for (int e = 0; e < kExperts; ++e) downs.emplace_back(kDim * kFfn, static_cast<float>(e + 1));
  for (int e = 0; e < kExperts; ++e) {
    gate.push_back({.format = Format::kF32, .rows = kFfn, .cols = kDim, .data = ones.data()});
    up.push_back(gate.back());
    down.push_back({.format = Format::kF32, .rows = kDim, .cols = kFfn, .data = downs[e].data()});
  }
  const Weight router{.format = Format::kF32, .rows = kExperts, .cols = kDim, .data = zeros.data()};
  const std::vector<float> x = {1.0f, 0.0f, 0.0f};
  // gate = up = 1 for every hidden unit: silu(1) * 1, summed over kFfn, times (e + 1).
  const double unit = kFfn * (1.0 / (1.0 + std::exp(-1.0)));
  for (bool norm : {false, true}) {
    for (bool cpu : {false, true}) {
      std::vector<float> out(kDim);
      MoeFeedForwardParams p;
      p.out = out.data();
      p.x = x.data();
      p.rows = 1;
      p.dim = kDim;
      p.ffn = kFfn;
      p.experts = kExperts;
      p.top_k = 2;
      p.norm_topk_prob = norm;
      p.router = &router;
      p.gate = gate.data();
      p.up = up.data();
      p.down = down.data();
      ThreadPool pool(1);
      CpuBackend backend(&pool, CpuOptions{});
      if (cpu) {
        backend.MoeFeedForward(p);
      } else {
        ReferenceMoeFeedForward(p);
      }
      // Experts 0 and 1: (1 + 2) * unit * weight.
      const double weight = norm ? 0.5 : 0.25;
      for (float v : out) EXPECT_NEAR(v, 3.0 * unit * weight, 1e-5) << norm << cpu;
    }
  }
}

}  // namespace
}  // namespace gizllm
