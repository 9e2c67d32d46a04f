// The encoder ops of the CUDA backend (LayerNorm, Gelu, EncoderAttention) against the CPU
// scalar references: fresh random inputs, sizes that are not multiples of a block or a warp,
// packed batches of sequences of different lengths, outputs poisoned.
#include "backend/cpu/reference.h"
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

}  // namespace
}  // namespace gizllm::testing
