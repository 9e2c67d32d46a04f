// Token picking on the CPU backend (Backend::Sample): each row the host Sampler's token from the
// same logits, parameters and mask, on 1 and 3 threads, rows with and without masks (several
// sharing one, in another order than the rows), tokens poisoned before the call.
#include <gtest/gtest.h>

#include <random>
#include <span>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "sampling/sampling.h"

namespace gizllm {
namespace {

TEST(CpuSample, PicksTheHostSamplersTokenUnderMasks) {
  std::mt19937 rng(31);
  for (int threads : {1, 3}) {
    ThreadPool pool(threads);
    CpuBackend backend(&pool, CpuOptions{});
    ASSERT_TRUE(backend.CanSample());
    for (int64_t vocab : {5, 97, 1000}) {
      const int64_t rows = 23, words = MaskWords(vocab);
      std::vector<float> logits(rows * vocab);
      for (float& x : logits) x = std::normal_distribution<float>(0.0f, 2.0f)(rng);
      // Masks 0..4, each allowing about a third of the tokens; row r without one when r % 4 == 0,
      // else mask (rows - r) % 5.
      std::vector<uint64_t> masks(5 * words, 0);
      for (int64_t m = 0; m < 5; ++m) {
        for (int64_t t = 0; t < vocab; ++t) {
          if (rng() % 3 == 0 || t == m) masks[m * words + t / 64] |= uint64_t{1} << (t % 64);
        }
      }
      std::vector<SampleRow> params(rows);
      for (int64_t r = 0; r < rows; ++r) {
        params[r].temperature = r % 3 == 0 ? 0.0f : 0.9f;
        params[r].top_k = r % 5 == 1 ? 4 : 0;
        params[r].top_p = r % 7 == 2 ? 0.8f : 1.0f;
        params[r].seed = rng();
        params[r].index = rng() % 100;
        params[r].mask = r % 4 == 0 ? -1 : static_cast<int32_t>((rows - r) % 5);
      }
      std::vector<int32_t> tokens(rows, -7);
      SampleParams p{tokens.data(), logits.data(), params.data(), rows, vocab, masks.data()};
      ASSERT_TRUE(p.Check().ok());
      backend.Sample(p);
      Sampler sampler(vocab);
      int masked_differs = 0;
      for (int64_t r = 0; r < rows; ++r) {
        const std::span<const float> row(&logits[r * vocab], vocab);
        std::span<const uint64_t> allowed;
        if (params[r].mask >= 0) allowed = {&masks[params[r].mask * words], size_t(words)};
        const int32_t want = sampler.Sample(row, params[r], allowed);
        ASSERT_GE(want, 0);
        EXPECT_EQ(tokens[r], want) << "threads " << threads << " vocab " << vocab << " row " << r;
        if (!allowed.empty()) masked_differs += want != sampler.Sample(row, params[r]);
      }
      if (vocab > 5) {
        EXPECT_GT(masked_differs, 3) << "vocab " << vocab;
      }
    }
  }
}

}  // namespace
}  // namespace gizllm
