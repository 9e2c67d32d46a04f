// Quantized matmuls of the CUDA backend (q8, q4 with and without zeros, q2, q1; rotated and not)
// against the reference dequantize-then-matmul (quant::ReferenceMatmul, double precision) on
// fresh random data: row counts around the kernel's tiles of 8 and 64 activation rows and past
// kQuantGemmRows (the cuBLASLt path), outputs that are not multiples of the 16-output tile, odd
// group counts, outputs poisoned before the run.
#include <string>
#include <tuple>

#include "backend/cpu/reference.h"
#include "cuda_test_util.h"
#include "quant/layout.h"
#include "quant/quantize.h"

namespace gizllm::testing {
namespace {

struct QuantCase {
  Format format;
  bool zeros;
  bool rotate;
};

std::string Name(const QuantCase& c) {
  return FormatName(c.format) + (c.zeros ? " zeros" : "") + (c.rotate ? " rotated" : "");
}

// `outputs` quantized linears of n + 7 i outputs over `cols` inputs (a multiple of 128), with
// `plain` more output of bf16 weights in the same matmul; out = x W^T + bias.
void CheckQuantMatmul(Backend* backend, std::mt19937& rng, const QuantCase& qc, int64_t rows,
                      int64_t n, int64_t cols, int outputs, bool bias, bool plain,
                      double tolerance) {
  SCOPED_TRACE(Name(qc) + " rows " + std::to_string(rows) + " n " + std::to_string(n) + " cols " +
               std::to_string(cols) + " outputs " + std::to_string(outputs) +
               (plain ? " + bf16" : ""));
  DeviceArray<float> x(backend, RandomFloats(rng, rows * cols));
  const int total = outputs + (plain ? 1 : 0);
  std::vector<quant::QuantizedLinear> linears(outputs);
  std::vector<uint16_t> plain_bf16;
  std::vector<Weight> host(total), dev(total);
  std::vector<std::unique_ptr<Buffer>> storage(total);
  std::vector<std::unique_ptr<DeviceArray<float>>> outs, biases;
  MatmulParams p;
  p.x = x.device();
  p.rows = rows;
  p.outputs = total;
  quant::QuantizeOptions options;
  options.format = qc.format;
  options.zeros = qc.zeros;
  options.rotate = qc.rotate;
  options.seed = rng();
  for (int i = 0; i < total; ++i) {
    const int64_t ni = n + 7 * i;
    std::vector<float> wf = RandomFloats(rng, ni * cols, 0.05f);
    if (i < outputs) {
      auto q = quant::QuantizeLinear(wf.data(), ni, cols, options);
      ASSERT_TRUE(q.ok()) << q.status().message();
      linears[i] = std::move(q).value();
      host[i] = linears[i].View();
      ASSERT_EQ(host[i].zeros != nullptr, qc.zeros && quant::AllowsZeros(qc.format));
    } else {
      plain_bf16 = ToBf16(wf);
      host[i] = Weight{Format::kBf16, ni, cols};
      host[i].data = plain_bf16.data();
    }
    auto prepared = backend->PrepareWeight(host[i], &storage[i]);
    ASSERT_TRUE(prepared.ok()) << prepared.status().message();
    dev[i] = *prepared;
    outs.push_back(std::make_unique<DeviceArray<float>>(backend, std::vector<float>(rows * ni)));
    outs.back()->Poison();
    biases.push_back(std::make_unique<DeviceArray<float>>(backend, RandomFloats(rng, ni)));
    p.w[i] = &dev[i];
    p.out[i] = outs[i]->device();
    p.bias[i] = bias ? biases[i]->device() : nullptr;
  }
  ASSERT_TRUE(p.Check().ok());
  backend->Matmul(p);
  for (int i = 0; i < total; ++i) {
    const int64_t ni = host[i].rows;
    std::vector<float>& want = outs[i]->host();
    if (i < outputs) {
      quant::ReferenceMatmul(x.host().data(), rows, host[i], want.data());
    } else {
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < ni; ++j) {
          double sum = 0.0;
          for (int64_t k = 0; k < cols; ++k)
            sum +=
                static_cast<double>(x.host()[r * cols + k]) * Bf16ToF32(plain_bf16[j * cols + k]);
          want[r * ni + j] = static_cast<float>(sum);
        }
      }
    }
    if (bias) {
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < ni; ++j) want[r * ni + j] += biases[i]->host()[j];
    }
    EXPECT_LT(RelativeError(outs[i]->Read(), want), tolerance) << "output " << i;
  }
}

const QuantCase kCases[] = {
    {Format::kQ8, false, true}, {Format::kQ4, true, true},  {Format::kQ4, false, true},
    {Format::kQ2, true, true},  {Format::kQ2, false, true}, {Format::kQ1, false, true},
};

// Fast mode: float16 activations on the tensor cores, float32 sums.
TEST(CudaQuantTest, EveryFormatAndRowCountFastMode) {
  GZ_SKIP_WITHOUT_CUDA();
  auto backend = MakeBackend(/*exact=*/false);
  std::mt19937 rng(11);
  for (const QuantCase& qc : kCases) {
    // 300: from kQuantGemmRows on, dequantized to bf16 for cuBLASLt.
    for (int64_t rows : {1, 3, 8, 17, 64, 200, 300}) {
      // 3 groups (odd: q1 reads groups in pairs), 3 outputs of 37, 44, 51.
      CheckQuantMatmul(backend.get(), rng, qc, rows, 37, 384, 3, /*bias=*/true, false, 1e-2);
      // 9 groups, one output of 100.
      CheckQuantMatmul(backend.get(), rng, qc, rows, 100, 1152, 1, false, false, 1e-2);
    }
  }
}

// Exact mode: float32 activations, values and sums, as the reference.
TEST(CudaQuantTest, EveryFormatAndRowCountExactMode) {
  GZ_SKIP_WITHOUT_CUDA();
  auto backend = MakeBackend(/*exact=*/true);
  std::mt19937 rng(12);
  for (const QuantCase& qc : kCases) {
    for (int64_t rows : {1, 3, 8, 17, 64, 200}) {
      CheckQuantMatmul(backend.get(), rng, qc, rows, 37, 384, 3, /*bias=*/true, false, 1e-4);
      CheckQuantMatmul(backend.get(), rng, qc, rows, 100, 1152, 1, false, false, 1e-4);
    }
  }
}

// Without the rotation, one group, and larger shapes with many row tiles.
TEST(CudaQuantTest, UnrotatedOneGroupAndLargerShapes) {
  GZ_SKIP_WITHOUT_CUDA();
  std::mt19937 rng(13);
  for (bool exact : {false, true}) {
    auto backend = MakeBackend(exact);
    const double tolerance = exact ? 1e-4 : 1e-2;
    for (Format format : {Format::kQ8, Format::kQ4, Format::kQ2, Format::kQ1}) {
      QuantCase qc{format, true, false};
      CheckQuantMatmul(backend.get(), rng, qc, 5, 33, 128, 2, true, false, tolerance);
      CheckQuantMatmul(backend.get(), rng, qc, 130, 260, 2048, 1, false, false, tolerance);
    }
    CheckQuantMatmul(backend.get(), rng, {Format::kQ4, true, true}, 300, 515, 4096, 1, true, false,
                     tolerance);
  }
}

// Batch-1 decode of linears large enough for each of its launch shapes (on an H200: 2 output
// tiles per warp with deep loads for 37 outputs, 2 tiles for 6000, 4 tiles for 20000).
TEST(CudaQuantTest, DecodeOfEveryLinearSize) {
  GZ_SKIP_WITHOUT_CUDA();
  auto backend = MakeBackend(/*exact=*/false);
  std::mt19937 rng(15);
  for (const QuantCase& qc : kCases) {
    for (int64_t n : {37, 6000, 20000})
      CheckQuantMatmul(backend.get(), rng, qc, 1, n, 256, 1, /*bias=*/true, false, 1e-2);
  }
}

// A matmul whose outputs mix a quantized and a plain weight: each runs on its own kernel.
TEST(CudaQuantTest, MixedQuantizedAndPlainOutputs) {
  GZ_SKIP_WITHOUT_CUDA();
  std::mt19937 rng(14);
  for (bool exact : {false, true}) {
    auto backend = MakeBackend(exact);
    for (int64_t rows : {1, 9, 70, 260}) {
      CheckQuantMatmul(backend.get(), rng, {Format::kQ4, true, true}, rows, 40, 256, 2, true,
                       /*plain=*/true, 1e-2);
    }
  }
}

// A quantized matmul with the norm, accumulate and swiglu ends of a model layer against the
// reference ops it stands for: RmsNorm, dequantize-then-matmul, then Add or SwiGlu. One row runs
// the ends inside the decode kernel (each of its launch shapes: 37, 6000 and 20000 outputs on an
// H200), three rows run them after the product.
void CheckQuantEnds(Backend* backend, std::mt19937& rng, const QuantCase& qc, bool swiglu,
                    bool norm, int64_t rows, int64_t n, int64_t cols, bool bias) {
  SCOPED_TRACE(Name(qc) + (swiglu ? " swiglu" : " accumulate") + (norm ? " norm" : "") + " rows " +
               std::to_string(rows) + " n " + std::to_string(n) + (bias ? " bias" : ""));
  const int outputs = swiglu ? 2 : 1;
  DeviceArray<float> x(backend, RandomFloats(rng, rows * cols, 2.0f));
  DeviceArray<float> gamma(backend, RandomFloats(rng, cols));
  quant::QuantizeOptions options;
  options.format = qc.format;
  options.zeros = qc.zeros;
  options.rotate = qc.rotate;
  options.seed = rng();
  std::vector<quant::QuantizedLinear> linears(outputs);
  std::vector<Weight> host(outputs), dev(outputs);
  std::vector<std::unique_ptr<Buffer>> storage(outputs);
  std::vector<std::unique_ptr<DeviceArray<float>>> biases;
  // The residual stream (accumulate) starts from random values; SwiGLU's output is poisoned.
  DeviceArray<float> out(backend, RandomFloats(rng, rows * n));
  DeviceArray<float> up(backend, std::vector<float>(rows * n));
  if (swiglu) out.Poison();
  up.Poison();
  MatmulParams p;
  p.x = x.device();
  p.rows = rows;
  p.outputs = outputs;
  p.accumulate = !swiglu;
  p.swiglu = swiglu;
  if (norm) {
    p.norm = gamma.device();
    p.norm_eps = 1e-5f;
  }
  for (int i = 0; i < outputs; ++i) {
    auto q = quant::QuantizeLinear(RandomFloats(rng, n * cols, 0.05f).data(), n, cols, options);
    ASSERT_TRUE(q.ok()) << q.status().message();
    linears[i] = std::move(q).value();
    host[i] = linears[i].View();
    auto prepared = backend->PrepareWeight(host[i], &storage[i]);
    ASSERT_TRUE(prepared.ok()) << prepared.status().message();
    dev[i] = *prepared;
    biases.push_back(std::make_unique<DeviceArray<float>>(backend, RandomFloats(rng, n)));
    p.w[i] = &dev[i];
    p.out[i] = i == 0 ? out.device() : up.device();
    p.bias[i] = bias ? biases[i]->device() : nullptr;
  }
  ASSERT_TRUE(p.Check().ok()) << p.Check().message();
  backend->Matmul(p);

  std::vector<float> xn = x.host();
  if (norm) {
    ReferenceRmsNorm(
        RmsNormParams{xn.data(), x.host().data(), nullptr, gamma.host().data(), rows, cols, 1e-5f});
  }
  std::vector<std::vector<float>> products(outputs, std::vector<float>(rows * n));
  for (int i = 0; i < outputs; ++i) {
    quant::ReferenceMatmul(xn.data(), rows, host[i], products[i].data());
    if (bias) {
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < n; ++j) products[i][r * n + j] += biases[i]->host()[j];
    }
  }
  std::vector<float> want = out.host();
  if (swiglu) {
    ReferenceGlu(GluParams{want.data(), products[0].data(), products[1].data(), rows * n});
  } else {
    ReferenceAdd(AddParams{want.data(), products[0].data(), rows * n});
  }
  EXPECT_LT(RelativeError(out.Read(), want), 1e-2);
}

TEST(CudaQuantTest, DecodeRunsTheEndsOfALayer) {
  GZ_SKIP_WITHOUT_CUDA();
  auto backend = MakeBackend(/*exact=*/false);
  std::mt19937 rng(16);
  for (const QuantCase& qc : kCases) {
    for (bool swiglu : {false, true}) {
      for (int64_t rows : {1, 3}) {
        CheckQuantEnds(backend.get(), rng, qc, swiglu, /*norm=*/true, rows, 37, 256, true);
        CheckQuantEnds(backend.get(), rng, qc, swiglu, false, rows, 6000, 384, false);
      }
      CheckQuantEnds(backend.get(), rng, qc, swiglu, true, 1, 20000, 256, true);
    }
  }
}

TEST(CudaQuantTest, RefusesBadQuantizedWeights) {
  GZ_SKIP_WITHOUT_CUDA();
  auto backend = MakeBackend(false);
  std::vector<uint8_t> codes(64 * 64);
  std::vector<float> scales(64), zeros(64);
  std::unique_ptr<Buffer> storage;
  Weight w{Format::kQ4, 64, 128};
  w.data = codes.data();
  w.scales = scales.data();
  w.group = 128;
  EXPECT_TRUE(backend->PrepareWeight(w, &storage).ok());
  Weight bad_group = w;
  bad_group.group = 64;
  EXPECT_FALSE(backend->PrepareWeight(bad_group, &storage).ok());
  Weight bad_cols = w;
  bad_cols.cols = 100;
  EXPECT_FALSE(backend->PrepareWeight(bad_cols, &storage).ok());
  Weight no_scales = w;
  no_scales.scales = nullptr;
  EXPECT_FALSE(backend->PrepareWeight(no_scales, &storage).ok());
  Weight q1_zeros = w;
  q1_zeros.format = Format::kQ1;
  q1_zeros.zeros = zeros.data();
  EXPECT_FALSE(backend->PrepareWeight(q1_zeros, &storage).ok());
}

}  // namespace
}  // namespace gizllm::testing
