// Converted mixture-of-experts models (tests/unit/jobs/tiny_moe_folder.h: Qwen3-MoE, and
// Qwen3-Next and Qwen3.5-MoE with a gated shared expert and recurrent layers) at 8, 4, 2 and 1
// bits on the CUDA backend against the CPU backend on the same converted folder, exact mode
// (float32 activations) within 1e-3 of the largest CPU logit: whole prompts and chunks of 5 rows
// (the grouped path over experts), chunks of 3 rows and single rows (the decode kernels, which
// read only the picked experts), and through the expert cache at a quarter of the experts the
// same logits as with every expert resident. Skipped without a CUDA device.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "model/evaluate.h"
#include "model/model.h"
#include "ops/device.h"
#include "tests/golden/golden_util.h"
#include "tests/unit/backend/cuda/cuda_model_util.h"
#include "tests/unit/jobs/tiny_moe_folder.h"

namespace gizllm {
namespace {

using testing::ConvertWithCpuReference;
using testing::LoadOn;

TEST(CudaQuantMoeTest, ConvertedExpertsMatchCpu) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device was found: CUDA model tests skipped";
  const testing::ScratchFolder root("gizllm_cuda_quant_moe");
  std::vector<int32_t> tokens(23);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = (i * 37 + 5) % tiny_moe::kVocab;
  for (tiny_moe::Kind kind :
       {tiny_moe::Kind::kQwen3Moe, tiny_moe::Kind::kQwen3Next, tiny_moe::Kind::kQwen3_5Moe}) {
    const std::string name = tiny_moe::KindName(kind);
    const std::string from = tiny_moe::Builder(5).Write(root.path() / name, kind);
    ASSERT_FALSE(from.empty());
    for (const char* bits : {"8", "4", "2", "1"}) {
      SCOPED_TRACE(name + " bits " + bits);
      const std::string dir = root.Path(name + "_q" + bits);
      std::vector<float> want;  // float32 on the CPU: the reference
      ASSERT_NO_FATAL_FAILURE(
          ConvertWithCpuReference(from, dir, std::string(bits) + "/8", tokens, &want));
      auto gpu = LoadOn(dir, "cuda", /*exact=*/true);
      ASSERT_TRUE(gpu);
      // The same experts through the expert cache at a quarter of them (packed as they are read
      // into their slots): the resident logits bit for bit.
      std::unique_ptr<Model> cached;
      {
        DeviceOptions device;
        device.device = "cuda";
        device.exact = true;
        auto backend = OpenBackend(device);
        ASSERT_TRUE(backend.ok()) << backend.status().message();
        int64_t experts = 0;
        for (const LayerSpec& l : gpu->arch().layer)
          if (l.IsMoe()) experts += l.moe.experts;
        LoadOptions options;
        options.expert_cache = experts / 4;
        auto loaded = Model::Load(dir, *backend, options);
        ASSERT_TRUE(loaded.ok()) << loaded.status().message();
        cached = std::move(*loaded);
        ASSERT_EQ(cached->ExpertCache().slots, experts / 4);
      }
      for (int64_t chunk : {int64_t{256}, int64_t{5}, int64_t{3}, int64_t{1}}) {
        auto ours = SequenceLogits(*gpu, tokens, chunk);
        ASSERT_TRUE(ours.ok()) << ours.status().message();
        golden::ExpectClose(*ours, want, 1e-3f,
                            name + " q" + bits + " chunk " + std::to_string(chunk));
        auto through_cache = SequenceLogits(*cached, tokens, chunk);
        ASSERT_TRUE(through_cache.ok()) << through_cache.status().message();
        EXPECT_EQ(*through_cache, *ours) << name << " q" << bits << " chunk " << chunk
                                         << ": the expert cache changed the logits";
      }
      EXPECT_GT(cached->ExpertCache().misses, 0);
      EXPECT_GT(cached->ExpertCache().hits, 0);
    }
  }
}

}  // namespace
}  // namespace gizllm
