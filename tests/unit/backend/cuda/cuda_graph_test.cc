// Recorded steps (CUDA graphs) on the CUDA backend: a step recorded once and replayed reads the
// inputs written into its buffers since, gives what the ops issued directly give, and the least
// recently used recording is dropped past the bound.
#include "backend/cpu/reference.h"
#include "cuda_test_util.h"

namespace gizllm::testing {
namespace {

// RMSNorm with the fused residual, then a GEMV (1 row) or cuBLASLt (many rows) matmul of three
// outputs: the ops of a layer's start, on `rows` rows.
class Step {
 public:
  Step(Backend* backend, std::mt19937& rng, int64_t rows)
      : rows_(rows),
        x_(backend, RandomFloats(rng, rows * kDim)),
        residual_(backend, RandomFloats(rng, rows * kDim)),
        norm_weight_(backend, RandomFloats(rng, kDim)),
        h_(backend, std::vector<float>(rows * kDim)),
        out_(backend, std::vector<float>(rows * kOut)),
        backend_(backend) {
    weight_host_ = ToBf16(RandomFloats(rng, kOut * kDim, 0.05f));
    Weight host{Format::kBf16, kOut, kDim};
    host.data = weight_host_.data();
    auto prepared = backend->PrepareWeight(host, &storage_);
    EXPECT_TRUE(prepared.ok());
    weight_ = *prepared;
  }
  void Issue() {
    backend_->RmsNorm(
        {h_.device(), x_.device(), residual_.device(), norm_weight_.device(), rows_, kDim, 1e-6f});
    MatmulParams p;
    p.x = h_.device();
    p.rows = rows_;
    p.w[0] = &weight_;
    p.out[0] = out_.device();
    backend_->Matmul(p);
  }
  // New random inputs (the residual too: the norm adds into it).
  void NewInputs(std::mt19937& rng) {
    x_.host() = RandomFloats(rng, x_.size());
    residual_.host() = RandomFloats(rng, residual_.size());
    backend_->CopyToDevice(x_.device(), x_.host().data(), x_.size() * 4);
    backend_->CopyToDevice(residual_.device(), residual_.host().data(), residual_.size() * 4);
    out_.Poison();
  }
  std::vector<float> Output() { return out_.Read(); }

  static constexpr int64_t kDim = 1024, kOut = 1536;

 private:
  int64_t rows_;
  DeviceArray<float> x_, residual_, norm_weight_, h_, out_;
  Backend* backend_;
  std::vector<uint16_t> weight_host_;
  std::unique_ptr<Buffer> storage_;
  Weight weight_;
};

TEST(CudaGraphTest, ReplayReadsNewInputsAndMatchesDirectIssue) {
  GZ_SKIP_WITHOUT_CUDA();
  for (int64_t rows : {1, 37}) {
    SCOPED_TRACE("rows " + std::to_string(rows));
    auto backend = MakeBackend(false, /*gemv_max_rows=*/1);
    std::mt19937 rng(static_cast<uint32_t>(rows));
    Step step(backend.get(), rng, rows);
    EXPECT_FALSE(backend->ReplayStep(7));
    backend->BeginStep(7);
    step.Issue();
    backend->EndStep();
    std::vector<float> recorded = step.Output();
    for (int round = 0; round < 3; ++round) {
      std::mt19937 same = rng;
      step.NewInputs(rng);
      ASSERT_TRUE(backend->ReplayStep(7));
      std::vector<float> replayed = step.Output();
      EXPECT_GT(RelativeError(replayed, recorded), 1e-2) << "the replay read the old inputs";
      // The same inputs through the ops issued directly.
      step.NewInputs(same);
      step.Issue();
      EXPECT_LT(RelativeError(step.Output(), replayed), 1e-6) << "round " << round;
    }
  }
}

TEST(CudaGraphTest, LeastRecentlyUsedIsDropped) {
  GZ_SKIP_WITHOUT_CUDA();
  CudaOptions options;
  options.max_graphs = 2;
  auto made = MakeCudaBackend(options);
  ASSERT_TRUE(made.ok());
  Backend* backend = made->get();
  std::mt19937 rng(3);
  Step step(backend, rng, 4);
  for (uint64_t key : {1, 2}) {
    backend->BeginStep(key);
    step.Issue();
    backend->EndStep();
  }
  EXPECT_TRUE(backend->ReplayStep(1));  // 2 is now the least recently used
  backend->BeginStep(3);
  step.Issue();
  backend->EndStep();
  EXPECT_TRUE(backend->ReplayStep(1));
  EXPECT_TRUE(backend->ReplayStep(3));
  EXPECT_FALSE(backend->ReplayStep(2));
  backend->Synchronize();
}

TEST(CudaGraphTest, DisabledRecordsNothing) {
  GZ_SKIP_WITHOUT_CUDA();
  CudaOptions options;
  options.graphs = false;
  auto made = MakeCudaBackend(options);
  ASSERT_TRUE(made.ok());
  Backend* backend = made->get();
  std::mt19937 rng(4);
  Step step(backend, rng, 1);
  backend->BeginStep(5);
  step.Issue();  // runs directly
  backend->EndStep();
  EXPECT_TRUE(std::isfinite(step.Output()[0]));
  EXPECT_FALSE(backend->ReplayStep(5));
}

}  // namespace
}  // namespace gizllm::testing
