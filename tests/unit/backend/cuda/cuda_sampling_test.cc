// Token picking on the device against the host Sampler: the same token for every row, over
// vocabularies of several sizes, every combination of temperature, min-p, top-k and top-p, seeds
// and counters, logits with many exact ties (where the order's id tie-break matters), and rows
// under grammars' masks of allowed tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <span>
#include <vector>

#include "cuda_test_util.h"
#include "sampling/sampling.h"

namespace gizllm::testing {
namespace {

struct Case {
  float temperature;
  int32_t top_k;
  float top_p;
  float min_p;
};

// Logits drawn as a language model's look (a few large, a long tail), optionally rounded to
// steps of 0.25 so that many are exactly equal, optionally with -inf entries.
std::vector<float> Logits(std::mt19937& rng, int64_t rows, int64_t vocab, bool ties, bool masked) {
  std::normal_distribution<float> tail(0.0f, 2.0f);
  std::uniform_int_distribution<int64_t> pick(0, vocab - 1);
  std::vector<float> x(rows * vocab);
  for (float& v : x) {
    v = tail(rng);
    if (ties) v = std::round(v * 4.0f) / 4.0f;
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int j = 0; j < 5; ++j) x[r * vocab + pick(rng)] += 6.0f + j;  // a few likely tokens
    if (masked) {
      for (int j = 0; j < vocab / 10; ++j) x[r * vocab + pick(rng)] = -INFINITY;
    }
  }
  return x;
}

TEST(CudaSample, PicksTheHostSamplersToken) {
  GZ_SKIP_WITHOUT_CUDA();
  auto backend = MakeBackend(/*exact=*/false);
  ASSERT_TRUE(backend);
  ASSERT_TRUE(backend->CanSample());
  const std::vector<Case> cases = {
      {0.0f, 0, 1.0f, 0.0f},  {1.0f, 0, 1.0f, 0.0f},  {0.7f, 40, 1.0f, 0.0f},
      {0.8f, 0, 0.9f, 0.0f},  {1.2f, 0, 1.0f, 0.05f}, {0.6f, 20, 0.95f, 0.02f},
      {1.0f, 1, 1.0f, 0.0f},  {1.0f, 0, 0.05f, 0.0f}, {2.0f, 1000, 0.5f, 0.0f},
      {0.3f, 3, 0.99f, 0.1f}, {1.0f, 0, 1.0f, 1.0f},  {0.9f, 100000, 0.8f, 0.0f},
  };
  std::mt19937 rng(20261130);
  int checked = 0, non_greedy_differs = 0;
  for (int64_t vocab : {97, 8192, 151936}) {
    for (bool ties : {false, true}) {
      for (bool masked : {false, true}) {
        const int64_t rows = static_cast<int64_t>(cases.size()) * 3;
        const std::vector<float> logits = Logits(rng, rows, vocab, ties, masked);
        std::vector<SampleRow> params(rows);
        for (int64_t r = 0; r < rows; ++r) {
          const Case& c = cases[r % cases.size()];
          params[r].temperature = c.temperature;
          params[r].top_k = c.top_k;
          params[r].top_p = c.top_p;
          params[r].min_p = c.min_p;
          params[r].seed = rng();
          params[r].index = rng() % 3000;
        }
        DeviceArray<float> x(backend.get(), logits);
        DeviceArray<SampleRow> p(backend.get(), params);
        DeviceArray<int32_t> tokens(backend.get(), std::vector<int32_t>(rows, -7));
        tokens.Poison();
        SampleParams sp{tokens.device(), x.device(), p.device(), rows, vocab};
        ASSERT_TRUE(sp.Check().ok());
        backend->Sample(sp);
        const std::vector<int32_t> got = tokens.Read();

        Sampler sampler(vocab);
        for (int64_t r = 0; r < rows; ++r) {
          Sampling s;
          s.temperature = params[r].temperature;
          s.top_k = params[r].top_k;
          s.top_p = params[r].top_p;
          s.min_p = params[r].min_p;
          const std::vector<int32_t> output(params[r].index, 0);
          const int32_t want = sampler.Sample(std::span<const float>(&logits[r * vocab], vocab), s,
                                              params[r].seed, {}, output, nullptr);
          EXPECT_EQ(got[r], want) << "vocab " << vocab << " ties " << ties << " masked " << masked
                                  << " row " << r << " (temperature " << s.temperature << ", top_k "
                                  << s.top_k << ", top_p " << s.top_p << ", min_p " << s.min_p
                                  << ")";
          ++checked;
          // Guard against a sampler that always returns the argmax.
          if (s.temperature >= 1.0f && s.top_k != 1 && s.min_p < 1.0f) {
            const float* row = &logits[r * vocab];
            non_greedy_differs += want != std::max_element(row, row + vocab) - row;
          }
        }
      }
    }
  }
  EXPECT_EQ(checked, 3 * 2 * 2 * 36);
  EXPECT_GT(non_greedy_differs, 5);
}

// Rows with a NaN or +inf anywhere, or no finite value, pick kNonFiniteToken as the host Sampler
// does (PickableRow), greedy or sampled; -inf entries alone only exclude their tokens. The rows
// beside them pick as usual.
TEST(CudaSample, NonFiniteRowsPickNoToken) {
  GZ_SKIP_WITHOUT_CUDA();
  auto backend = MakeBackend(/*exact=*/false);
  ASSERT_TRUE(backend);
  std::mt19937 rng(11);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t vocab : {97, 8192}) {
    // Kinds: 0 clean, 1 NaN, 2 +inf, 3 every entry -inf, 4 some -inf, 5 NaN at the last id.
    const int kinds = 6;
    const int64_t rows = 2 * kinds;
    std::vector<float> logits = Logits(rng, rows, vocab, false, false);
    std::uniform_int_distribution<int64_t> pick(0, vocab - 2);
    std::vector<SampleRow> params(rows);
    for (int64_t r = 0; r < rows; ++r) {
      float* row = &logits[r * vocab];
      switch (r % kinds) {
        case 1:
          row[pick(rng)] = nan;
          break;
        case 2:
          row[pick(rng)] = inf;
          break;
        case 3:
          std::fill(row, row + vocab, -inf);
          break;
        case 4:
          row[pick(rng)] = -inf, row[pick(rng)] = -inf;
          break;
        case 5:
          row[vocab - 1] = nan;
          break;
      }
      params[r].temperature = r < kinds ? 0.0f : 0.9f;
      params[r].top_p = 0.95f;
      params[r].seed = rng();
    }
    DeviceArray<float> x(backend.get(), logits);
    DeviceArray<SampleRow> p(backend.get(), params);
    DeviceArray<int32_t> tokens(backend.get(), std::vector<int32_t>(rows, 0));
    tokens.Poison();
    backend->Sample({tokens.device(), x.device(), p.device(), rows, vocab});
    const std::vector<int32_t> got = tokens.Read();
    Sampler sampler(vocab);
    for (int64_t r = 0; r < rows; ++r) {
      Sampling s;
      s.temperature = params[r].temperature;
      s.top_p = params[r].top_p;
      const int32_t want = sampler.Sample(std::span<const float>(&logits[r * vocab], vocab), s,
                                          params[r].seed, {}, {}, nullptr);
      const int kind = static_cast<int>(r % kinds);
      EXPECT_EQ(want == kNonFiniteToken, kind == 1 || kind == 2 || kind == 3 || kind == 5);
      EXPECT_EQ(got[r], want) << "vocab " << vocab << " row " << r;
    }
  }
}

// Rows under a grammar's mask (SampleRow::mask naming a row of SampleParams::masks, several rows
// sharing one) beside rows without: the host Sampler's token under the same mask, greedy and
// sampled, over masks that allow most tokens, a few, one, only -inf ones or none (those pick
// kNoAllowedToken); a NaN the mask leaves out still makes the row kNonFiniteToken.
TEST(CudaSample, MaskedRowsPickTheHostSamplersToken) {
  GZ_SKIP_WITHOUT_CUDA();
  auto backend = MakeBackend(/*exact=*/false);
  ASSERT_TRUE(backend);
  const std::vector<Case> cases = {
      {0.0f, 0, 1.0f, 0.0f}, {1.0f, 0, 1.0f, 0.0f},  {0.7f, 40, 1.0f, 0.0f},
      {0.8f, 0, 0.9f, 0.0f}, {1.2f, 0, 1.0f, 0.05f}, {0.6f, 20, 0.95f, 0.02f},
      {1.0f, 3, 0.5f, 0.0f},
  };
  // Kinds of mask: 0 none, 1 half the tokens, 2 one in 50, 3 one token, 4 only tokens whose logit
  // is -inf, 5 no token, 6 half the tokens and a NaN at a token left out, 7 every token but the
  // last three of each word's 64.
  const int kinds = 8;
  std::mt19937 rng(20261203);
  int checked = 0, masked_differs = 0, no_allowed = 0;
  for (int64_t vocab : {97, 8192, 151936}) {
    const int64_t words = MaskWords(vocab);
    const int64_t rows = static_cast<int64_t>(cases.size()) * kinds;
    std::vector<float> logits = Logits(rng, rows, vocab, /*ties=*/vocab == 8192, false);
    std::vector<SampleRow> params(rows);
    // Masks of the rows with one, in reverse order of the rows, so that a row's mask index is not
    // its row; kinds 1 and 2 each share one mask between two of their rows.
    std::vector<std::vector<uint64_t>> masks;
    std::uniform_int_distribution<int64_t> token(0, vocab - 1);
    for (int64_t r = rows - 1; r >= 0; --r) {
      const Case& c = cases[r % cases.size()];
      params[r] = {c.temperature, c.top_k, c.top_p, c.min_p, rng(), rng() % 3000, /*mask=*/-1};
      const int kind = static_cast<int>(r / cases.size());
      float* row = &logits[r * vocab];
      if (kind == 0) continue;
      if ((kind == 1 || kind == 2) && r % cases.size() == 1) {
        params[r].mask = params[r + 1].mask;  // the row after it, of the same kind
        continue;
      }
      std::vector<uint64_t> m(words, 0);
      auto allow = [&](int64_t t) { m[t / 64] |= uint64_t{1} << (t % 64); };
      switch (kind) {
        case 1:
        case 6:
          for (int64_t t = 0; t < vocab; ++t) {
            if (rng() % 2) allow(t);
          }
          if (kind == 6) {
            int64_t t = token(rng);
            while (m[t / 64] >> (t % 64) & 1) t = token(rng);
            row[t] = std::numeric_limits<float>::quiet_NaN();
          }
          break;
        case 2:
          for (int64_t t = 0; t < vocab; ++t) {
            if (rng() % 50 == 0) allow(t);
          }
          allow(token(rng));
          break;
        case 3:
          allow(token(rng));
          break;
        case 4:
          for (int j = 0; j < 3; ++j) {
            const int64_t t = token(rng);
            row[t] = -INFINITY;
            allow(t);
          }
          break;
        case 5:
          break;
        case 7:
          for (int64_t t = 0; t < vocab; ++t) {
            if (t % 64 < 61) allow(t);
          }
          break;
      }
      params[r].mask = static_cast<int32_t>(masks.size());
      masks.push_back(std::move(m));
    }
    std::vector<uint64_t> flat;
    for (const auto& m : masks) flat.insert(flat.end(), m.begin(), m.end());
    DeviceArray<float> x(backend.get(), logits);
    DeviceArray<SampleRow> p(backend.get(), params);
    DeviceArray<uint64_t> m(backend.get(), flat);
    DeviceArray<int32_t> tokens(backend.get(), std::vector<int32_t>(rows, -7));
    tokens.Poison();
    SampleParams sp{tokens.device(), x.device(), p.device(), rows, vocab, m.device()};
    ASSERT_TRUE(sp.Check().ok());
    backend->Sample(sp);
    const std::vector<int32_t> got = tokens.Read();

    Sampler sampler(vocab);
    for (int64_t r = 0; r < rows; ++r) {
      const SampleRow& row = params[r];
      std::span<const uint64_t> allowed;
      if (row.mask >= 0) allowed = std::span<const uint64_t>(&flat[row.mask * words], words);
      const std::span<const float> x_row(&logits[r * vocab], vocab);
      const int32_t want = sampler.Sample(x_row, row, allowed);
      const int kind = static_cast<int>(r / cases.size());
      EXPECT_EQ(want == kNoAllowedToken, kind == 4 || kind == 5) << "row " << r;
      EXPECT_EQ(want == kNonFiniteToken, kind == 6) << "row " << r;
      EXPECT_EQ(got[r], want) << "vocab " << vocab << " row " << r << " kind " << kind
                              << " (temperature " << row.temperature << ", top_k " << row.top_k
                              << ", top_p " << row.top_p << ", min_p " << row.min_p << ")";
      ++checked;
      no_allowed += want == kNoAllowedToken;
      // Guard against a mask that is not applied: the row without it picks elsewhere.
      if (want >= 0 && kind >= 1) masked_differs += want != sampler.Sample(x_row, row);
      if (want >= 0 && kind >= 1) {
        EXPECT_TRUE(allowed[want / 64] >> (want % 64) & 1) << "row " << r;
      }
    }
  }
  EXPECT_EQ(checked, 3 * kinds * 7);
  EXPECT_EQ(no_allowed, 3 * 2 * 7);
  EXPECT_GT(masked_differs, 20);
}

// The same row under the same seed and counter picks the same token whatever else is in the
// batch; another counter draws anew.
TEST(CudaSample, RowsAreIndependentOfTheBatch) {
  GZ_SKIP_WITHOUT_CUDA();
  auto backend = MakeBackend(/*exact=*/false);
  ASSERT_TRUE(backend);
  std::mt19937 rng(7);
  const int64_t vocab = 8192, rows = 64;
  const std::vector<float> one = Logits(rng, 1, vocab, false, false);
  std::vector<float> logits;
  for (int64_t r = 0; r < rows; ++r) logits.insert(logits.end(), one.begin(), one.end());
  std::vector<SampleRow> params(rows);
  for (int64_t r = 0; r < rows; ++r) {
    params[r].temperature = 1.5f;
    params[r].seed = 99;
    params[r].index = r % 2 ? 5 : static_cast<uint64_t>(r);
  }
  DeviceArray<float> x(backend.get(), logits);
  DeviceArray<SampleRow> p(backend.get(), params);
  DeviceArray<int32_t> tokens(backend.get(), std::vector<int32_t>(rows, 0));
  tokens.Poison();
  backend->Sample({tokens.device(), x.device(), p.device(), rows, vocab});
  const std::vector<int32_t> got = tokens.Read();
  std::set<int32_t> even;
  for (int64_t r = 0; r < rows; ++r) {
    if (r % 2) {
      EXPECT_EQ(got[r], got[1]) << "row " << r;
    } else {
      even.insert(got[r]);
    }
  }
  EXPECT_GT(even.size(), 3u);  // different counters, different draws
}

}  // namespace
}  // namespace gizllm::testing
