#include "backend/cpu/quant_matmul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/quant_kernels.h"
#include "core/dtype.h"
#include "quant/hadamard.h"
#include "quant/layout.h"
#include "quant/quantize.h"

namespace gizllm {
namespace {

std::vector<float> Gaussian(int64_t n, std::mt19937& rng, float sigma) {
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<CpuIsa> Isas() {
  std::vector<CpuIsa> isas = {CpuIsa::kScalar};
  if (DetectCpuIsa() == CpuIsa::kAvx2 || DetectCpuIsa() == CpuIsa::kAvx512) {
    isas.push_back(CpuIsa::kAvx2);
  }
  if (DetectCpuIsa() == CpuIsa::kAvx512) isas.push_back(CpuIsa::kAvx512);
  return isas;
}

// Bound on float rounding: 1e-5 of sum |x'_k| |w'_k| in the stored basis.
std::vector<float> Tolerances(const float* x, int64_t rows, const Weight& w) {
  std::vector<float> dense(w.rows * w.cols);
  quant::DequantizeRows(w, 0, w.rows, dense.data());
  std::vector<float> xr(x, x + rows * w.cols);
  if (w.rotated) {
    for (int64_t r = 0; r < rows; ++r) quant::RotateRow(&xr[r * w.cols], w.cols, w.rotation_seed);
  }
  std::vector<float> tol(rows * w.rows);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t n = 0; n < w.rows; ++n) {
      double s = 0.0;
      for (int64_t k = 0; k < w.cols; ++k)
        s += std::fabs(xr[r * w.cols + k] * dense[n * w.cols + k]);
      tol[r * w.rows + n] = static_cast<float>(1e-5 * s + 1e-6);
    }
  }
  return tol;
}

// QuantMatmul of one weight with a bias; the output starts as NaN.
std::vector<float> RunQuantMatmul(const std::vector<float>& x, int64_t rows, const Weight& w,
                                  const std::vector<float>& bias, ThreadPool* pool, CpuIsa isa,
                                  bool bf16_activations) {
  std::vector<float> out(rows * w.rows, std::nanf(""));
  MatmulParams mp;
  mp.x = x.data();
  mp.rows = rows;
  mp.w[0] = &w;
  mp.out[0] = out.data();
  mp.bias[0] = bias.data();
  QuantMatmul(mp, pool, isa, bf16_activations);
  return out;
}

struct Case {
  Format format;
  bool zeros;
  bool rotate;
};

// A Gaussian n x cols weight quantized as `c` says (rotation seed 1234).
quant::QuantizedLinear Quantized(const Case& c, int64_t n, int64_t cols, std::mt19937& rng) {
  std::vector<float> wf = Gaussian(n * cols, rng, 0.05f);
  auto q = quant::QuantizeLinear(wf.data(), n, cols,
                                 quant::QuantizeOptions{c.format, c.zeros, c.rotate, 1234});
  EXPECT_TRUE(q.ok()) << q.status().message();
  if (!q.ok()) std::abort();
  return std::move(*q);
}

std::string Name(const Case& c, CpuIsa isa, int64_t rows, int64_t n) {
  return FormatName(c.format) + (c.zeros ? " zeros" : "") + (c.rotate ? " rotated" : "") + " " +
         CpuIsaName(isa) + " rows " + std::to_string(rows) + " n " + std::to_string(n);
}

// Every format, with and without zeros and rotation, on every instruction set this CPU has,
// against dequantize-then-matmul; odd row counts on both sides, a bias, 1 and 2 threads.
TEST(QuantMatmulTest, MatchesReferenceInEveryFormat) {
  const Case cases[] = {
      {Format::kQ8, false, true},  {Format::kQ8, false, false}, {Format::kQ4, true, true},
      {Format::kQ4, false, true},  {Format::kQ4, true, false},  {Format::kQ2, true, true},
      {Format::kQ2, false, false}, {Format::kQ1, false, true},  {Format::kQ1, false, false}};
  std::mt19937 rng(10);
  ThreadPool pool(2);
  // 2560 inputs: more than one dequantized panel (2048 inputs) per weight row.
  for (const int64_t cols : {int64_t{384}, int64_t{2560}}) {
    for (const Case& c : cases) {
      if (cols > 384 && c.format != Format::kQ4 && c.format != Format::kQ8) continue;
      for (int64_t n : {1, 13, 37}) {
        const quant::QuantizedLinear q = Quantized(c, n, cols, rng);
        Weight w = q.View();
        std::vector<float> bias = Gaussian(n, rng, 1.0f);
        // 8 rows and more: dequantized panels (AVX-512), in tiles of 6 rows and a tail.
        for (int64_t rows : {1, 3, 6, 9, 20}) {
          std::vector<float> x = Gaussian(rows * cols, rng, 1.0f);
          std::vector<float> want(rows * n);
          quant::ReferenceMatmul(x.data(), rows, w, want.data());
          std::vector<float> tol = Tolerances(x.data(), rows, w);
          for (CpuIsa isa : Isas()) {
            for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
              const std::vector<float> out = RunQuantMatmul(x, rows, w, bias, p, isa, false);
              for (int64_t i = 0; i < rows * n; ++i) {
                ASSERT_NEAR(out[i], want[i] + bias[i % n], tol[i])
                    << Name(c, isa, rows, n) << " at " << i;
              }
            }
          }
        }
      }
    }
  }
}

// want = x W^T + bias summed in double (x [rows, cols], W [n, cols]), and tol = 1e-5 of the sum
// of the products' magnitudes (float32 sums) + 1e-6.
void ProductsInDouble(const std::vector<float>& x, const std::vector<float>& w, int64_t rows,
                      int64_t n, int64_t cols, const std::vector<float>& bias,
                      std::vector<float>* want, std::vector<float>* tol) {
  want->assign(rows * n, 0.0f);
  tol->assign(rows * n, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < n; ++o) {
      double sum = 0.0, magnitude = 0.0;
      for (int64_t k = 0; k < cols; ++k) {
        const double product = static_cast<double>(x[r * cols + k]) * w[o * cols + k];
        sum += product;
        magnitude += std::fabs(product);
      }
      (*want)[r * n + o] = static_cast<float>(sum) + bias[o];
      (*tol)[r * n + o] = static_cast<float>(1e-5 * magnitude + 1e-6);
    }
  }
}

// The weights as the kernels decode them (mul * code + add, fused for q4 and q2), rounded to
// bf16 and back.
std::vector<float> DecodedAsBf16(const Weight& w) {
  const int64_t groups = w.cols / quant::kGroup;
  const int bytes = quant::GroupBytes(w.format);
  const auto* codes = static_cast<const uint8_t*>(w.data);
  const auto* scales = static_cast<const float*>(w.scales);
  const auto* zeros = static_cast<const float*>(w.zeros);
  std::vector<float> out(w.rows * w.cols);
  for (int64_t n = 0; n < w.rows; ++n) {
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t k = n * groups + g;
      const quant::Affine a = quant::GroupAffine(w.format, scales[k], zeros ? zeros + k : nullptr);
      for (int e = 0; e < quant::kGroup; ++e) {
        const float code = static_cast<float>(quant::CodeAt(w.format, codes + k * bytes, e));
        const float v = w.format == Format::kQ8   ? code * a.mul
                        : w.format == Format::kQ1 ? (code != 0.0f ? a.add + a.mul : a.add)
                                                  : std::fma(code, a.mul, a.add);
        out[n * w.cols + g * quant::kGroup + e] = Bf16ToF32(F32ToBf16(v));
      }
    }
  }
  return out;
}

// With bf16 activations, from kQuantBf16MinRows rows on AVX-512 BF16: every format against the
// products of the bf16-rounded rotated rows and the bf16-rounded decoded weights, summed in
// double; within 1e-5 of the sum of their magnitudes (float32 sums). Panels of 384 inputs: 2560
// inputs end in a shorter one; 64 outputs are two panels of 32, 37 a panel and a part.
TEST(QuantMatmulTest, Bf16ActivationsMatchRoundedReference) {
  if (DetectCpuIsa() != CpuIsa::kAvx512 || !CpuHasAvx512Bf16()) {
    GTEST_SKIP() << "this CPU has no AVX-512 BF16";
  }
  const Case cases[] = {{Format::kQ8, false, true}, {Format::kQ8, false, false},
                        {Format::kQ4, true, true},  {Format::kQ4, false, true},
                        {Format::kQ2, true, true},  {Format::kQ1, false, true}};
  std::mt19937 rng(12);
  ThreadPool pool(2);
  for (const int64_t cols : {int64_t{384}, int64_t{2560}}) {
    for (const Case& c : cases) {
      for (int64_t n : {13, 37, 64}) {
        const quant::QuantizedLinear q = Quantized(c, n, cols, rng);
        Weight w = q.View();
        const std::vector<float> dense = DecodedAsBf16(w);
        std::vector<float> bias = Gaussian(n, rng, 1.0f);
        for (int64_t rows : {kQuantBf16MinRows, kQuantBf16MinRows + 9, int64_t{100}}) {
          std::vector<float> x = Gaussian(rows * cols, rng, 1.0f);
          std::vector<float> xr = x;
          for (int64_t r = 0; r < rows; ++r) {
            if (w.rotated) quant::RotateRow(&xr[r * cols], cols, w.rotation_seed);
            for (int64_t k = 0; k < cols; ++k) {
              xr[r * cols + k] = Bf16ToF32(F32ToBf16(xr[r * cols + k]));
            }
          }
          std::vector<float> want, tol;
          ProductsInDouble(xr, dense, rows, n, cols, bias, &want, &tol);
          for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
            const std::vector<float> out =
                RunQuantMatmul(x, rows, w, bias, p, CpuIsa::kAvx512, /*bf16_activations=*/true);
            for (int64_t i = 0; i < rows * n; ++i) {
              ASSERT_NEAR(out[i], want[i], tol[i])
                  << Name(c, CpuIsa::kAvx512, rows, n) << " cols " << cols << " at " << i;
            }
          }
        }
      }
    }
  }
}

// The int8 activations as QuantizeRowsInt8 defines them, computed plainly: codes, scales and sums.
struct Int8Rows {
  std::vector<int8_t> codes;
  std::vector<float> scales, sums;
};
Int8Rows QuantizeInt8Reference(const std::vector<float>& x, int64_t rows, int64_t cols) {
  const int64_t groups = cols / quant::kGroup;
  Int8Rows q{std::vector<int8_t>(rows * cols), std::vector<float>(rows * groups),
             std::vector<float>(rows * groups)};
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const float* src = &x[r * cols + g * quant::kGroup];
      float max = 0.0f;
      bool finite = true;
      for (int e = 0; e < quant::kGroup; ++e) {
        max = std::max(max, std::fabs(src[e]));
        finite = finite && std::isfinite(src[e]);
      }
      if (!finite) max = std::nanf("");
      const float inv = max > 0.0f ? 127.0f / max : 0.0f;  // 0 for NaN: codes 0
      int sum = 0;
      for (int e = 0; e < quant::kGroup; ++e) {
        const int code = finite ? static_cast<int>(std::nearbyint(src[e] * inv)) : 0;
        q.codes[r * cols + g * quant::kGroup + e] = static_cast<int8_t>(code);
        sum += code;
      }
      q.scales[r * groups + g] = max / 127.0f;
      q.sums[r * groups + g] = q.scales[r * groups + g] * static_cast<float>(sum);
    }
  }
  return q;
}

// A weight repacked for the integer products, with its storage.
struct VnniWeight {
  Weight w;
  std::vector<uint8_t, std::allocator<uint8_t>> bytes;
};
VnniWeight PackForVnni(const Weight& w) {
  VnniWeight v;
  v.bytes.resize(VnniPackedBytes(w) + 64);
  // The kernels read the packed vectors with aligned loads.
  void* data = v.bytes.data() + (64 - reinterpret_cast<uintptr_t>(v.bytes.data()) % 64) % 64;
  PackVnniWeight(w, data);
  v.w = w;
  v.w.data = data;
  v.w.scales = nullptr;
  v.w.zeros = nullptr;
  v.w.layout = kCpuVnniLayout;
  return v;
}

bool HasVnni() { return QuantizeRowsInt8() != nullptr && CpuHasAvx512Vnni(); }

// Packing split among threads writes the same bytes as packing on one.
TEST(QuantMatmulTest, VnniPackingOnThreadsEqualsOneThread) {
  std::mt19937 rng(18);
  ThreadPool pool(2);
  for (const Case c : {Case{Format::kQ8, false, true}, Case{Format::kQ4, true, true}}) {
    const quant::QuantizedLinear q = Quantized(c, 37, 384, rng);
    const int64_t bytes = VnniPackedBytes(q.View());
    std::vector<uint8_t> one(bytes, 0xAA), two(bytes, 0x55);
    PackVnniWeight(q.View(), one.data());
    PackVnniWeight(q.View(), two.data(), &pool);
    EXPECT_EQ(one, two) << FormatName(c.format);
  }
}

// The codes, scales and sums of QuantizeRowsInt8 equal the plain computation's bit for bit:
// ties to even (a group whose largest magnitude is 127 quantizes x itself), an all-zero group,
// signs, tiny values beside large ones.
TEST(QuantMatmulTest, Int8RowsAreTheDefinedCodes) {
  if (!HasVnni()) GTEST_SKIP() << "this CPU has no AVX-512 VNNI";
  std::mt19937 rng(13);
  const int64_t rows = 3, cols = 384;
  std::vector<float> x = Gaussian(rows * cols, rng, 2.0f);
  for (int e = 0; e < quant::kGroup; ++e) x[e] = 0.0f;  // row 0, group 0: zeros
  // Row 0, group 1: largest 127, so x * 127 / max = x; halves round to even.
  const float ties[] = {127.0f, 2.5f, -2.5f, 3.5f, -3.5f, 0.5f, -0.5f, 126.5f, -127.0f, 1e-30f};
  for (int e = 0; e < quant::kGroup; ++e) x[128 + e] = ties[e % 10];
  for (int64_t i = 256; i < rows * cols; i += 5) x[i] *= 1e-7f;
  const Int8Rows want = QuantizeInt8Reference(x, rows, cols);
  EXPECT_EQ(want.codes[129], 2);
  EXPECT_EQ(want.codes[130], -2);
  EXPECT_EQ(want.codes[131], 4);
  std::vector<int8_t> codes(rows * cols, 99);
  std::vector<float> scales(rows * 3, -1.0f), sums(rows * 3, -1.0f);
  QuantizeRowsInt8()(x.data(), rows, cols, codes.data(), scales.data(), sums.data());
  EXPECT_EQ(codes, want.codes);
  for (size_t i = 0; i < scales.size(); ++i) {
    EXPECT_EQ(std::memcmp(&scales[i], &want.scales[i], 4), 0) << i;
    EXPECT_EQ(std::memcmp(&sums[i], &want.sums[i], 4), 0) << i;
  }
  EXPECT_EQ(scales[0], 0.0f);
  // A NaN or an infinity anywhere in a group: codes 0, scale and sum NaN; the other groups as
  // before.
  for (const float bad : {std::nanf(""), INFINITY, -INFINITY}) {
    std::vector<float> y = x;
    y[2 * cols + 128 + 77] = bad;  // row 2, group 1
    QuantizeRowsInt8()(y.data(), rows, cols, codes.data(), scales.data(), sums.data());
    for (int e = 0; e < quant::kGroup; ++e) ASSERT_EQ(codes[2 * cols + 128 + e], 0) << e;
    EXPECT_TRUE(std::isnan(scales[2 * 3 + 1]) && std::isnan(sums[2 * 3 + 1])) << bad;
    EXPECT_EQ(std::memcmp(&scales[2 * 3], &want.scales[2 * 3], 4), 0) << bad;
    EXPECT_EQ(std::memcmp(&scales[2 * 3 + 2], &want.scales[2 * 3 + 2], 4), 0) << bad;
  }
}

// A row holding a NaN gives NaN outputs (as float32 products would); the other rows are exact.
TEST(QuantMatmulTest, Int8ActivationsPassNaNOn) {
  if (!HasVnni()) GTEST_SKIP() << "this CPU has no AVX-512 VNNI";
  std::mt19937 rng(16);
  const quant::QuantizedLinear q = Quantized({Format::kQ4, true, true}, 37, 384, rng);
  const VnniWeight packed = PackForVnni(q.View());
  const int64_t rows = 5;
  std::vector<float> x = Gaussian(rows * 384, rng, 1.0f), bias(37, 0.0f);
  const std::vector<float> clean =
      RunQuantMatmul(x, rows, packed.w, bias, nullptr, CpuIsa::kAvx512, false);
  x[3 * 384 + 200] = std::nanf("");
  const std::vector<float> out =
      RunQuantMatmul(x, rows, packed.w, bias, nullptr, CpuIsa::kAvx512, false);
  for (int64_t i = 0; i < rows * 37; ++i) {
    if (i / 37 == 3) {
      EXPECT_TRUE(std::isnan(out[i])) << i;
    } else {
      EXPECT_EQ(out[i], clean[i]) << i;
    }
  }
}

// With weights in the VNNI layout, q8 and q4 (with and without zeros and rotation) against the
// products of the int8-quantized rotated rows (scale * code) and the decoded weights (mul * code
// + add), summed in double: within 1e-5 of the sum of their magnitudes. Outputs that are not
// multiples of the blocks (13, 37), tiles of 4 rows with every tail, one row (blocks of 8), 2
// threads splitting the outputs, and from kQuantParallelPrepareRows rows (70) the rows prepared
// by both threads.
TEST(QuantMatmulTest, Int8ActivationsMatchQuantizedReference) {
  if (!HasVnni()) GTEST_SKIP() << "this CPU has no AVX-512 VNNI";
  const Case cases[] = {{Format::kQ8, false, true},
                        {Format::kQ8, false, false},
                        {Format::kQ4, true, true},
                        {Format::kQ4, false, true},
                        {Format::kQ4, true, false}};
  std::mt19937 rng(14);
  ThreadPool pool(2);
  for (const int64_t cols : {int64_t{384}, int64_t{1152}}) {
    for (const Case& c : cases) {
      for (int64_t n : {13, 37, 160}) {
        const quant::QuantizedLinear q = Quantized(c, n, cols, rng);
        const Weight w = q.View();
        std::vector<float> dense(n * cols);
        quant::DequantizeRows(w, 0, n, dense.data());
        const VnniWeight packed = PackForVnni(w);
        std::vector<float> bias = Gaussian(n, rng, 1.0f);
        for (int64_t rows : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{4}, int64_t{7},
                             int64_t{16}, kQuantParallelPrepareRows + 6}) {
          std::vector<float> x = Gaussian(rows * cols, rng, 1.0f);
          std::vector<float> xr = x;
          if (w.rotated) {
            for (int64_t r = 0; r < rows; ++r) quant::RotateRow(&xr[r * cols], cols, 1234);
          }
          const Int8Rows xq = QuantizeInt8Reference(xr, rows, cols);
          std::vector<float> dequantized(rows * cols);  // scale * code
          for (int64_t k = 0; k < rows * cols; ++k) {
            dequantized[k] = xq.scales[k / quant::kGroup] * xq.codes[k];
          }
          std::vector<float> want, tol;
          ProductsInDouble(dequantized, dense, rows, n, cols, bias, &want, &tol);
          for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
            const std::vector<float> out =
                RunQuantMatmul(x, rows, packed.w, bias, p, CpuIsa::kAvx512, false);
            for (int64_t i = 0; i < rows * n; ++i) {
              ASSERT_NEAR(out[i], want[i], tol[i])
                  << Name(c, CpuIsa::kAvx512, rows, n) << " cols " << cols << " at " << i;
            }
          }
        }
      }
    }
  }
}

// Each row is quantized alone and its sums are exact integers: 20 rows together (tiles of 4
// rows, both threads) give the same bits as each row alone (one-row tiles of 8 blocks).
TEST(QuantMatmulTest, Int8ActivationsDoNotDependOnTheBatch) {
  if (!HasVnni()) GTEST_SKIP() << "this CPU has no AVX-512 VNNI";
  std::mt19937 rng(17);
  ThreadPool pool(2);
  for (const Case c : {Case{Format::kQ8, false, true}, Case{Format::kQ4, true, true}}) {
    const quant::QuantizedLinear q = Quantized(c, 200, 384, rng);
    const VnniWeight packed = PackForVnni(q.View());
    const int64_t rows = 20;
    std::vector<float> x = Gaussian(rows * 384, rng, 1.0f), bias = Gaussian(200, rng, 1.0f);
    const std::vector<float> all =
        RunQuantMatmul(x, rows, packed.w, bias, &pool, CpuIsa::kAvx512, false);
    for (int64_t r = 0; r < rows; ++r) {
      const std::vector<float> one(x.begin() + r * 384, x.begin() + (r + 1) * 384);
      const std::vector<float> alone =
          RunQuantMatmul(one, 1, packed.w, bias, nullptr, CpuIsa::kAvx512, false);
      ASSERT_EQ(std::memcmp(alone.data(), all.data() + r * 200, 200 * sizeof(float)), 0)
          << FormatName(c.format) << " row " << r;
    }
  }
}

// The int8 activations cost little against the float32 products: q8 weights, Gaussian rows,
// rotated; the error's norm under 1% of the outputs'.
TEST(QuantMatmulTest, Int8ActivationsStayCloseToFloat) {
  if (!HasVnni()) GTEST_SKIP() << "this CPU has no AVX-512 VNNI";
  std::mt19937 rng(15);
  const int64_t n = 64, cols = 1152, rows = 16;
  std::vector<float> wf = Gaussian(n * cols, rng, 0.05f);
  auto q = quant::QuantizeLinear(wf.data(), n, cols, {Format::kQ8, false, true, 1234});
  ASSERT_TRUE(q.ok());
  const VnniWeight packed = PackForVnni(q->View());
  std::vector<float> x = Gaussian(rows * cols, rng, 1.0f), bias(n, 0.0f);
  std::vector<float> want(rows * n);
  quant::ReferenceMatmul(x.data(), rows, q->View(), want.data());
  const std::vector<float> out =
      RunQuantMatmul(x, rows, packed.w, bias, nullptr, CpuIsa::kAvx512, false);
  double err = 0.0, energy = 0.0;
  for (int64_t i = 0; i < rows * n; ++i) {
    err += (out[i] - want[i]) * (out[i] - want[i]);
    energy += want[i] * want[i];
  }
  EXPECT_LT(std::sqrt(err / energy), 0.01);
  EXPECT_GT(std::sqrt(err / energy), 0.0);  // the activations were quantized
}

// Three outputs sharing x: two quantized with the same rotation (one rotated copy of x), one
// plain, which QuantMatmul must leave to the caller.
// The AVX-512 rotation of activations does the reference's additions in the same order: the same
// bits, for values of every magnitude and both signs.
TEST(QuantMatmulTest, Avx512RotationEqualsReferenceBitForBit) {
  if (DetectCpuIsa() != CpuIsa::kAvx512) GTEST_SKIP() << "this CPU has no AVX-512";
  RotateRowFn rotate = RotateRowAvx512();
  ASSERT_NE(rotate, nullptr);
  std::mt19937 rng(11);
  for (int64_t cols : {128, 384, 1152}) {
    for (uint64_t seed : {uint64_t{1}, quant::kDefaultRotationSeed}) {
      std::vector<float> row = Gaussian(cols, rng, 3.0f);
      for (int64_t i = 0; i < cols; i += 7) row[i] *= 1e-6f;  // small values beside large ones
      std::vector<float> want = row, got = row;
      quant::RotateRow(want.data(), cols, seed);
      rotate(got.data(), cols, seed);
      for (int64_t i = 0; i < cols; ++i) {
        ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0)
            << "cols " << cols << " index " << i << ": " << got[i] << " vs " << want[i];
      }
    }
  }
}

TEST(QuantMatmulTest, RunsOnlyTheQuantizedOutputs) {
  std::mt19937 rng(11);
  const int64_t cols = 256, rows = 5;
  std::vector<float> w0 = Gaussian(24 * cols, rng, 0.05f), w2 = Gaussian(11 * cols, rng, 0.05f);
  auto q0 = quant::QuantizeLinear(w0.data(), 24, cols, {Format::kQ4, true, true});
  auto q2 = quant::QuantizeLinear(w2.data(), 11, cols, {Format::kQ8, false, true});
  ASSERT_TRUE(q0.ok() && q2.ok());
  std::vector<uint16_t> plain(7 * cols, F32ToBf16(0.5f));
  Weight a = q0->View(), c = q2->View(), b;
  b.format = Format::kBf16;
  b.rows = 7;
  b.cols = cols;
  b.data = plain.data();
  std::vector<float> x = Gaussian(rows * cols, rng, 1.0f);
  std::vector<float> out0(rows * 24, std::nanf("")), out1(rows * 7, -7.0f),
      out2(rows * 11, std::nanf(""));
  MatmulParams mp;
  mp.x = x.data();
  mp.rows = rows;
  mp.outputs = 3;
  mp.w[0] = &a;
  mp.w[1] = &b;
  mp.w[2] = &c;
  mp.out[0] = out0.data();
  mp.out[1] = out1.data();
  mp.out[2] = out2.data();
  EXPECT_TRUE(HasQuantizedOutput(mp));
  ThreadPool pool(2);
  QuantMatmul(mp, &pool);
  std::vector<float> want0(rows * 24), want2(rows * 11);
  quant::ReferenceMatmul(x.data(), rows, a, want0.data());
  quant::ReferenceMatmul(x.data(), rows, c, want2.data());
  for (size_t i = 0; i < want0.size(); ++i) EXPECT_NEAR(out0[i], want0[i], 1e-3) << i;
  for (size_t i = 0; i < want2.size(); ++i) EXPECT_NEAR(out2[i], want2[i], 1e-3) << i;
  for (float v : out1) EXPECT_EQ(v, -7.0f);
  mp.outputs = 2;
  mp.w[0] = &b;
  EXPECT_FALSE(HasQuantizedOutput(mp));
}

}  // namespace
}  // namespace gizllm
