// The encoder ops of the CUDA backend (LayerNorm, Gelu, EncoderAttention) against the CPU
// scalar references: fresh random inputs, sizes that are not multiples of a block or a warp,
// packed batches of sequences of different lengths, outputs poisoned.
#include <cuda_runtime.h>

#include "backend/cpu/reference.h"
#include "backend/cuda/kernels.cuh"
#include "cuda_test_util.h"

namespace gizllm::testing {
namespace {

TEST(CudaEncoderTest, LayerNormWithAndWithoutResidual) {
  GZ_SKIP_WITHOUT_CUDA();
  auto backend = MakeBackend(/*exact=*/true);
  std::mt19937 rng(25);
  for (int64_t dim : {1, 33, 384, 1027}) {
    for (bool residual : {false, true}) {
      const int64_t rows = 19;
      DeviceArray<float> x(backend.get(), RandomFloats(rng, rows * dim, 3.0f));
      DeviceArray<float> res(backend.get(), RandomFloats(rng, rows * dim));
      DeviceArray<float> w(backend.get(), RandomFloats(rng, dim));
      DeviceArray<float> b(backend.get(), RandomFloats(rng, dim));
      DeviceArray<float> out(backend.get(), std::vector<float>(rows * dim));
      out.Poison();
      backend->LayerNorm({out.device(), x.device(), residual ? res.device() : nullptr, w.device(),
                          b.device(), rows, dim, 1e-12f});
      ReferenceLayerNorm({out.host().data(), x.host().data(),
                          residual ? res.host().data() : nullptr, w.host().data(), b.host().data(),
                          rows, dim, 1e-12f});
      EXPECT_LT(RelativeError(out.Read(), out.host()), 1e-6) << dim << " " << residual;
      // In place over the residual, as the encoder layers run it.
      backend->LayerNorm(
          {res.device(), x.device(), res.device(), w.device(), b.device(), rows, dim, 1e-12f});
      if (residual) EXPECT_EQ(res.Read(), out.Read()) << dim;
    }
  }
}

TEST(CudaEncoderTest, GeluOfErf) {
  GZ_SKIP_WITHOUT_CUDA();
  auto backend = MakeBackend(/*exact=*/true);
  std::mt19937 rng(26);
  DeviceArray<float> x(backend.get(), RandomFloats(rng, 5003, 3.0f));
  backend->Gelu({x.device(), 5003});
  ReferenceGelu({x.host().data(), 5003});
  EXPECT_LT(RelativeError(x.Read(), x.host()), 1e-6);
}

TEST(CudaEncoderTest, AttentionWithinEachSequence) {
  GZ_SKIP_WITHOUT_CUDA();
  auto backend = MakeBackend(/*exact=*/true);
  std::mt19937 rng(27);
  for (int head_dim : {8, 33, 64, 128, 256}) {
    const int heads = 3;
    const std::vector<int32_t> starts = {0, 1, 18, 23, 64, 200};
    const int64_t rows = starts.back(), width = heads * head_dim;
    DeviceArray<float> q(backend.get(), RandomFloats(rng, rows * width));
    DeviceArray<float> k(backend.get(), RandomFloats(rng, rows * width));
    DeviceArray<float> v(backend.get(), RandomFloats(rng, rows * width));
    DeviceArray<int32_t> d_starts(backend.get(), starts);
    DeviceArray<float> out(backend.get(), std::vector<float>(rows * width));
    out.Poison();
    const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    EncoderAttentionParams p{out.device(), q.device(), k.device(), v.device(), d_starts.device(),
                             rows,         5,          heads,      head_dim,   scale};
    ASSERT_TRUE(p.Check().ok());
    backend->EncoderAttention(p);
    ReferenceEncoderAttention({out.host().data(), q.host().data(), k.host().data(), v.host().data(),
                               starts.data(), rows, 5, heads, head_dim, scale});
    EXPECT_LT(RelativeError(out.Read(), out.host()), 1e-5) << head_dim;
  }
  EXPECT_FALSE(backend->CheckEncoderShape(257).ok());
  EXPECT_TRUE(backend->CheckEncoderShape(64).ok());
}

// Each sequence's mean row, summed in double as the CPU's.
TEST(CudaEncoderTest, MeanRowsOfEachSequence) {
  GZ_SKIP_WITHOUT_CUDA();
  auto backend = MakeBackend(/*exact=*/false);
  std::mt19937 rng(31);
  for (int64_t dim : {1, 300, 768}) {
    const std::vector<int32_t> starts = {0, 1, 18, 23, 536};
    DeviceArray<float> x(backend.get(), RandomFloats(rng, starts.back() * dim, 2.0f));
    DeviceArray<int32_t> d_starts(backend.get(), starts);
    DeviceArray<float> out(backend.get(), std::vector<float>(4 * dim));
    out.Poison();
    backend->MeanRows({out.device(), x.device(), d_starts.device(), 4, dim});
    ReferenceMeanRows({out.host().data(), x.host().data(), starts.data(), 4, dim});
    EXPECT_LT(RelativeError(out.Read(), out.host()), 1e-7) << dim;
  }
}

// Fast mode: LayerNorm, Gelu and EncoderAttention leave a bf16 copy of their output that the
// matmul right after them reads instead of converting it; the product equals the one of the same
// float32 rows converted by the matmul itself (issued after another op: no copy to take).
TEST(CudaEncoderTest, Bf16CopiesFeedTheNextMatmul) {
  GZ_SKIP_WITHOUT_CUDA();
  auto fast = MakeBackend(/*exact=*/false, /*gemv_max_rows=*/1);
  std::mt19937 rng(32);
  const int64_t rows = 70, dim = 128;
  const std::vector<int32_t> starts = {0, 30, 70};
  DeviceArray<float> x(fast.get(), RandomFloats(rng, rows * dim, 2.0f));
  DeviceArray<float> q(fast.get(), RandomFloats(rng, rows * dim));
  DeviceArray<float> w_norm(fast.get(), RandomFloats(rng, dim));
  DeviceArray<float> b_norm(fast.get(), RandomFloats(rng, dim));
  DeviceArray<int32_t> d_starts(fast.get(), starts);
  DeviceArray<float> unused(fast.get(), std::vector<float>(4));
  DeviceArray<float> h(fast.get(), std::vector<float>(rows * dim));
  DeviceArray<float> with_copy(fast.get(), std::vector<float>(rows * 96));
  DeviceArray<float> without(fast.get(), std::vector<float>(rows * 96));
  PlainWeight w;
  MakePlainWeight(fast.get(), rng, Format::kBf16, 96, dim, &w);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  MatmulParams m;
  m.x = h.device();
  m.rows = rows;
  m.w[0] = &w.device;
  for (const char* op : {"layer_norm", "gelu", "encoder_attention"}) {
    SCOPED_TRACE(op);
    with_copy.Poison();
    without.Poison();
    if (op == std::string("layer_norm")) {
      fast->LayerNorm(
          {h.device(), x.device(), nullptr, w_norm.device(), b_norm.device(), rows, dim, 1e-12f});
    } else if (op == std::string("gelu")) {
      fast->Add({h.device(), x.device(), rows * dim});  // h = LayerNorm's + x
      fast->Gelu({h.device(), rows * dim});
    } else {
      fast->EncoderAttention({h.device(), q.device(), x.device(), q.device(), d_starts.device(),
                              rows, 2, /*heads=*/2, /*head_dim=*/64, 0.125f});
    }
    m.out[0] = with_copy.device();
    fast->Matmul(m);
    fast->Gelu({unused.device(), 4});  // another op: the next matmul converts h itself
    m.out[0] = without.device();
    fast->Matmul(m);
    EXPECT_EQ(with_copy.Read(), without.Read());
  }
}

// The starts of a packed batch of sequences of these lengths.
std::vector<int32_t> Starts(const std::vector<int32_t>& lengths) {
  std::vector<int32_t> starts = {0};
  for (int32_t n : lengths) starts.push_back(starts.back() + n);
  return starts;
}

// The fast mode's tensor-core attention (fp16 queries, keys, values and probabilities, float32
// sums) against the float64 reference: within 3e-3 of the output's norm (fp16 keeps 11 bits, a
// rounding of at most 2^-11 of each operand; the sums of many keys average the roundings out).
// Lengths that are not multiples of the 64-row and 64-key tiles, alone and packed together in
// mixed orders (tiles of rows that hold the end of one sequence and the start of the next),
// head_dims of each instantiation and one padded (72 as 96), queries of random size.
TEST(CudaEncoderTest, FastAttentionOnTensorCores) {
  GZ_SKIP_WITHOUT_CUDA();
  auto backend = MakeBackend(/*exact=*/false);
  std::mt19937 rng(28);
  const std::vector<std::vector<int32_t>> batches = {
      {1}, {7}, {64}, {130}, {513}, {1, 7, 64, 130, 513}, {130, 1, 513, 7, 64, 64, 3}};
  for (int head_dim : {32, 64, 72, 76, 80, 96, 128}) {
    for (const std::vector<int32_t>& lengths : batches) {
      const int heads = 3;
      const std::vector<int32_t> starts = Starts(lengths);
      const int sequences = static_cast<int>(lengths.size());
      const int64_t rows = starts.back(), width = heads * head_dim;
      DeviceArray<float> q(backend.get(), RandomFloats(rng, rows * width, 2.0f));
      DeviceArray<float> k(backend.get(), RandomFloats(rng, rows * width));
      DeviceArray<float> v(backend.get(), RandomFloats(rng, rows * width));
      DeviceArray<int32_t> d_starts(backend.get(), starts);
      DeviceArray<float> out(backend.get(), std::vector<float>(rows * width));
      out.Poison();
      const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
      EncoderAttentionParams p{out.device(), q.device(), k.device(), v.device(), d_starts.device(),
                               rows,         sequences,  heads,      head_dim,   scale};
      ASSERT_TRUE(p.Check().ok());
      ASSERT_TRUE(cuda::EncoderAttentionMmaCovers(p)) << head_dim;
      backend->EncoderAttention(p);
      ReferenceEncoderAttention({out.host().data(), q.host().data(), k.host().data(),
                                 v.host().data(), starts.data(), rows, sequences, heads, head_dim,
                                 scale});
      const std::vector<float> got = out.Read();
      const double error = RelativeError(got, out.host());
      EXPECT_LT(error, 3e-3) << head_dim << ", " << sequences << " sequences of " << rows;
      // Not the float32 kernel: fp16 operands leave a trace.
      EXPECT_GT(error, 1e-6) << head_dim << ", " << sequences << " sequences of " << rows;
      // Each sequence alone in its rows: a row's output is its own sequence's, whatever else
      // shares its tile (a wrong bound would mix a neighbour's keys in, far past the bound).
      for (int s = 0; s < sequences; ++s) {
        std::vector<float> a(got.begin() + starts[s] * width, got.begin() + starts[s + 1] * width);
        std::vector<float> b(out.host().begin() + starts[s] * width,
                             out.host().begin() + starts[s + 1] * width);
        EXPECT_LT(RelativeError(a, b), 3e-3) << head_dim << ", sequence " << s;
      }
    }
  }
}

// The kernel's bf16 copy of its output (for the output projection) is the output rounded to the
// nearest bf16, element for element.
TEST(CudaEncoderTest, FastAttentionBf16CopyOfItsOutput) {
  GZ_SKIP_WITHOUT_CUDA();
  auto backend = MakeBackend(/*exact=*/false);
  std::mt19937 rng(29);
  const std::vector<int32_t> starts = Starts({5, 70, 1, 129});
  const int heads = 2, head_dim = 64, sequences = 4;
  const int64_t rows = starts.back(), width = heads * head_dim;
  DeviceArray<float> q(backend.get(), RandomFloats(rng, rows * width));
  DeviceArray<float> k(backend.get(), RandomFloats(rng, rows * width));
  DeviceArray<float> v(backend.get(), RandomFloats(rng, rows * width));
  DeviceArray<int32_t> d_starts(backend.get(), starts);
  DeviceArray<float> out(backend.get(), std::vector<float>(rows * width));
  DeviceArray<uint16_t> out16(backend.get(), std::vector<uint16_t>(rows * width));
  out.Poison();
  out16.Poison();
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  EncoderAttentionParams p{out.device(), q.device(), k.device(), v.device(), d_starts.device(),
                           rows,         sequences,  heads,      head_dim,   scale};
  ASSERT_TRUE(cuda::EncoderAttentionMmaCovers(p));
  DeviceArray<uint8_t> scratch(backend.get(),
                              std::vector<uint8_t>(cuda::EncoderAttentionMmaScratchBytes(p)));
  cuda::LaunchEncoderAttentionMma(p, out16.device(), scratch.device(), /*stream=*/nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(out16.Read(), ToBf16(out.Read()));
}

// Fast mode on shapes the tensor-core kernel does not cover (head_dim not a multiple of 4, or
// past 128; q not 16-byte aligned): the float32 kernel, as exact as in exact mode.
TEST(CudaEncoderTest, FastAttentionElsewhereFloat32) {
  GZ_SKIP_WITHOUT_CUDA();
  auto backend = MakeBackend(/*exact=*/false);
  std::mt19937 rng(30);
  const std::vector<int32_t> starts = Starts({1, 17, 66});
  for (auto [head_dim, offset] : {std::pair{33, 0}, std::pair{256, 0}, std::pair{64, 1}}) {
    const int heads = 2, sequences = 3;
    const int64_t rows = starts.back(), width = heads * head_dim;
    DeviceArray<float> q(backend.get(), RandomFloats(rng, rows * width + offset));
    DeviceArray<float> k(backend.get(), RandomFloats(rng, rows * width));
    DeviceArray<float> v(backend.get(), RandomFloats(rng, rows * width));
    DeviceArray<int32_t> d_starts(backend.get(), starts);
    DeviceArray<float> out(backend.get(), std::vector<float>(rows * width));
    out.Poison();
    const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    EncoderAttentionParams p{
        out.device(), q.device() + offset, k.device(), v.device(), d_starts.device(),
        rows,         sequences,           heads,      head_dim,   scale};
    EXPECT_FALSE(cuda::EncoderAttentionMmaCovers(p)) << head_dim << " " << offset;
    backend->EncoderAttention(p);
    ReferenceEncoderAttention({out.host().data(), q.host().data() + offset, k.host().data(),
                               v.host().data(), starts.data(), rows, sequences, heads, head_dim,
                               scale});
    EXPECT_LT(RelativeError(out.Read(), out.host()), 1e-5) << head_dim << " " << offset;
  }
}

}  // namespace
}  // namespace gizllm::testing
