#include "sampling/sampling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "ops/backend.h"

namespace gizllm {
namespace {

std::vector<float> RandomLogits(std::mt19937& rng, int64_t vocab, float scale) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> logits(vocab);
  for (float& x : logits) x = normal(rng);
  return logits;
}

std::vector<int32_t> RandomTokens(std::mt19937& rng, int64_t vocab, int n) {
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(vocab) - 1);
  std::vector<int32_t> tokens(n);
  for (int32_t& t : tokens) t = pick(rng);
  return tokens;
}

// The straightforward reading of the definitions in sampling.h, in double where it can.
std::vector<double> ReferenceDistribution(const std::vector<float>& logits, const Sampling& s,
                                          const std::vector<int32_t>& prompt,
                                          const std::vector<int32_t>& output) {
  const int64_t vocab = logits.size();
  std::vector<float> x = logits;
  std::set<int32_t> seen(prompt.begin(), prompt.end());
  seen.insert(output.begin(), output.end());
  for (int32_t t : seen) {
    if (x[t] > 0) {
      x[t] = x[t] / s.repetition;
    } else {
      x[t] = x[t] * s.repetition;
    }
    const int count = std::count(output.begin(), output.end(), t);
    x[t] -= s.frequency * count;
    if (count > 0) x[t] -= s.presence;
  }
  std::vector<double> p(vocab, 0.0);
  if (s.temperature == 0.0f) {
    p[std::max_element(x.begin(), x.end()) - x.begin()] = 1.0;
    return p;
  }
  double max = -INFINITY;
  for (int64_t i = 0; i < vocab; ++i) max = std::max<double>(max, x[i] / s.temperature);
  double total = 0;
  for (int64_t i = 0; i < vocab; ++i) total += p[i] = std::exp(x[i] / s.temperature - max);
  for (double& v : p) v /= total;
  const double pmax = *std::max_element(p.begin(), p.end());
  for (double& v : p) {
    if (v < s.min_p * pmax) v = 0;
  }
  std::vector<std::pair<double, int32_t>> sorted;  // (-p, id): most likely first
  for (int64_t i = 0; i < vocab; ++i) {
    if (p[i] > 0) sorted.push_back({-p[i], static_cast<int32_t>(i)});
  }
  std::sort(sorted.begin(), sorted.end());
  if (s.top_k > 0 && static_cast<int64_t>(sorted.size()) > s.top_k) {
    for (size_t i = s.top_k; i < sorted.size(); ++i) p[sorted[i].second] = 0;
    sorted.resize(s.top_k);
  }
  double kept = 0;
  for (auto& [q, t] : sorted) kept += -q;
  double before = 0;
  for (auto& [q, t] : sorted) {
    if (s.top_p < 1.0f && before / kept >= s.top_p) p[t] = 0;  // top_p 1 keeps every token
    before += -q;
  }
  total = 0;
  for (double v : p) total += v;
  for (double& v : p) v /= total;
  return p;
}

// Argmax against the plain definition (the first position whose value no later value exceeds)
// on rows with many exact ties, -inf, +inf and NaN entries, and lengths around its chunks of 64.
TEST(Sampling, ArgmaxIsTheFirstLargest) {
  std::mt19937 rng(17);
  auto reference = [](const std::vector<float>& x) {
    int32_t best = 0;
    for (size_t i = 1; i < x.size(); ++i)
      if (x[i] > x[best]) best = static_cast<int32_t>(i);
    return best;
  };
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (size_t n : {1, 2, 7, 8, 63, 64, 65, 130, 8192}) {
    for (int trial = 0; trial < 60; ++trial) {
      std::vector<float> x(n);
      for (float& v : x) {
        switch (rng() % 8) {
          case 0:
            v = -inf;
            break;
          case 1:
            v = nan;
            break;
          case 2:
            v = trial % 5 == 0 ? inf : 3.0f;
            break;
          default:
            v = static_cast<float>(rng() % 7) - 3.0f;  // exact ties
        }
      }
      ASSERT_EQ(Argmax(x), reference(x)) << "n " << n << " trial " << trial;
    }
  }
}

// A NaN or +inf anywhere in the row, or no finite value, picks kNonFiniteToken under every way of
// sampling (greedy, penalties, top-k/p, logprobs); -inf entries only exclude their tokens.
TEST(Sampling, NonFiniteRowsPickNoToken) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t vocab : {1, 7, 64, 1000}) {
    Sampler sampler(vocab);
    std::mt19937 rng(static_cast<uint32_t>(vocab));
    std::vector<float> row(vocab);
    for (float& x : row) x = std::uniform_real_distribution<float>(-5.0f, 5.0f)(rng);
    std::vector<Sampling> ways(5);
    ways[0].temperature = 0.0f;
    ways[1].temperature = 0.0f, ways[1].repetition = 1.3f;
    ways[2].top_k = 3, ways[2].top_p = 0.9f;
    ways[3].min_p = 0.1f, ways[3].presence = 0.5f;
    ways[4].logprobs = 2;
    const std::vector<int32_t> prompt = {0}, output = {0};
    for (const Sampling& s : ways) {
      EXPECT_TRUE(PickableRow(row));
      EXPECT_GE(sampler.Sample(row, s, 3, prompt, output, nullptr), 0);
      for (int64_t at : {int64_t{0}, vocab / 2, vocab - 1}) {
        for (float bad : {nan, -nan, inf}) {
          std::vector<float> x = row;
          x[at] = bad;
          EXPECT_FALSE(PickableRow(x));
          Logprobs lp;
          EXPECT_EQ(sampler.Sample(x, s, 3, prompt, output, &lp), kNonFiniteToken)
              << vocab << " " << at << " " << bad;
        }
        if (vocab == 1) continue;  // one -inf entry is the whole row
        std::vector<float> masked = row;
        masked[at] = -inf;
        EXPECT_TRUE(PickableRow(masked));
        EXPECT_NE(sampler.Sample(masked, s, 3, prompt, output, nullptr), at);
      }
      const std::vector<float> none(vocab, -inf);
      EXPECT_FALSE(PickableRow(none));
      EXPECT_EQ(sampler.Sample(none, s, 3, prompt, output, nullptr), kNonFiniteToken);
    }
  }
}

// A grammar's mask: only the tokens it allows are picked; a mask that allows no token with a
// finite logit picks kNoAllowedToken, and a NaN is kNonFiniteToken even where the mask leaves
// it out. Sample under a SampleRow (the device's parameters, the draw's counter given as its
// index) picks what Sample under the same Sampling picks after that many output tokens.
TEST(Sampling, MasksAndSampleRows) {
  const int64_t vocab = 300;
  Sampler sampler(vocab);
  std::mt19937 rng(5);
  std::vector<float> row(vocab);
  for (float& x : row) x = std::normal_distribution<float>(0.0f, 2.0f)(rng);
  std::vector<uint64_t> mask(MaskWords(vocab), 0);
  for (int64_t t = 0; t < vocab; t += 7) mask[t / 64] |= uint64_t{1} << (t % 64);
  int differs = 0;
  for (uint64_t index = 0; index < 40; ++index) {
    SampleRow device;
    device.temperature = index % 4 == 0 ? 0.0f : 1.0f;
    device.top_k = index % 3 == 1 ? 20 : 0;
    device.top_p = index % 5 == 2 ? 0.8f : 1.0f;
    device.min_p = index % 7 == 3 ? 0.05f : 0.0f;
    device.seed = 77 + index;
    device.index = index;
    Sampling s;
    s.temperature = device.temperature;
    s.top_k = device.top_k;
    s.top_p = device.top_p;
    s.min_p = device.min_p;
    const std::vector<int32_t> output(index, 0);
    const int32_t free = sampler.Sample(row, device);
    EXPECT_EQ(free, sampler.Sample(row, s, device.seed, {}, output, nullptr));
    const int32_t masked = sampler.Sample(row, device, mask);
    EXPECT_EQ(masked, sampler.Sample(row, s, device.seed, {}, output, nullptr, mask));
    ASSERT_GE(masked, 0);
    EXPECT_EQ(masked % 7, 0) << masked;
    differs += masked != free;
  }
  EXPECT_GT(differs, 20);
  SampleRow greedy;
  std::vector<uint64_t> none(MaskWords(vocab), 0);
  EXPECT_EQ(sampler.Sample(row, greedy, none), kNoAllowedToken);
  std::vector<float> excluded = row;
  for (int64_t t = 0; t < vocab; t += 7) excluded[t] = -INFINITY;
  EXPECT_EQ(sampler.Sample(excluded, greedy, mask), kNoAllowedToken);
  std::vector<float> poisoned = row;
  poisoned[1] = std::numeric_limits<float>::quiet_NaN();  // a token the mask leaves out
  EXPECT_EQ(sampler.Sample(poisoned, greedy, mask), kNonFiniteToken);
}

// Greedy under a mask reads the mask's bits (no masked copy): the same token as the argmax of a
// copy with the disallowed logits at -inf, over sparse, dense and full mask words, ties (the
// first wins) and a vocabulary that ends inside a word (bits past it ignored).
TEST(Sampling, GreedyUnderAMaskIsTheArgmaxOfTheMaskedRow) {
  std::mt19937 rng(11);
  for (int64_t vocab : {1, 63, 64, 65, 200, 1000}) {
    Sampler sampler(vocab);
    for (int trial = 0; trial < 60; ++trial) {
      std::vector<float> row(vocab);
      // Few distinct values: ties are common.
      for (float& x : row) x = static_cast<float>(std::uniform_int_distribution<int>(-4, 4)(rng));
      if (trial % 5 == 0 && vocab > 1) row[rng() % vocab] = -INFINITY;
      std::vector<uint64_t> mask(MaskWords(vocab), 0);
      const int density = trial % 4;  // none, sparse, dense, all
      for (int64_t t = 0; t < vocab; ++t) {
        const bool on = density == 3 || (density == 2 && rng() % 8 != 0) ||
                        (density == 1 && rng() % 16 == 0);
        if (on) mask[t / 64] |= uint64_t{1} << (t % 64);
      }
      for (uint64_t& w : mask) {
        if (density == 3) w = ~uint64_t{0};  // bits past the vocabulary too
      }
      std::vector<float> masked = row;
      bool any = false;
      for (int64_t t = 0; t < vocab; ++t) {
        if (!((mask[t / 64] >> (t % 64)) & 1)) masked[t] = -INFINITY;
        any |= masked[t] > -INFINITY;
      }
      const int32_t want = any ? Argmax(masked) : kNoAllowedToken;
      SampleRow greedy;
      EXPECT_EQ(sampler.Sample(row, greedy, mask), want) << vocab << " " << trial;
      Sampling s;
      s.temperature = 0.0f;
      s.logprobs = 2;
      Logprobs lp;
      EXPECT_EQ(sampler.Sample(row, s, 1, {}, {}, &lp, mask), want);
      if (want >= 0) {
        EXPECT_EQ(lp.token, want);  // logprobs of the logits before the mask
      }
    }
  }
}

TEST(Sampling, PenaltiesKnownAnswer) {
  // Token 0 (logit 2, prompt only), 1 (-1, output twice), 2 (0.5, never seen).
  Sampler sampler(3);
  Sampling s;
  s.temperature = 0.0f;
  s.repetition = 2.0f;
  s.frequency = 0.5f;
  s.presence = 0.25f;
  std::vector<float> logits = {2.0f, -1.0f, 0.5f};
  std::vector<int32_t> prompt = {0};
  std::vector<int32_t> output = {1, 1};
  // Shaped: 0 -> 2 / 2 = 1; 1 -> -1 * 2 - 0.5 * 2 - 0.25 = -3.25; 2 -> 0.5. Greedy: token 0.
  EXPECT_EQ(sampler.Sample(logits, s, 1, prompt, output, nullptr), 0);
  s.temperature = 1.0f;
  std::vector<float> probs(3);
  sampler.Distribution(logits, s, prompt, output, probs);
  const double z = std::exp(1.0) + std::exp(-3.25) + std::exp(0.5);
  EXPECT_NEAR(probs[0], std::exp(1.0) / z, 1e-6);
  EXPECT_NEAR(probs[1], std::exp(-3.25) / z, 1e-6);
  EXPECT_NEAR(probs[2], std::exp(0.5) / z, 1e-6);
}

TEST(Sampling, DistributionMatchesReference) {
  std::mt19937 rng(7);
  const int64_t vocab = 1000;
  Sampler sampler(vocab);
  std::vector<Sampling> configs;
  for (float temperature : {0.0f, 0.3f, 1.0f, 1.7f}) {
    for (int top_k : {0, 1, 5, 200}) {
      for (float top_p : {1.0f, 0.9f, 0.3f}) {
        for (float min_p : {0.0f, 0.05f}) {
          Sampling s;
          s.temperature = temperature;
          s.top_k = top_k;
          s.top_p = top_p;
          s.min_p = min_p;
          configs.push_back(s);
        }
      }
    }
  }
  for (size_t c = 0; c < configs.size(); ++c) {
    Sampling s = configs[c];
    if (c % 3 == 1) {
      s.repetition = 1.3f;
      s.frequency = 0.4f;
      s.presence = -0.6f;
    } else if (c % 3 == 2) {
      s.repetition = 0.8f;
      s.frequency = -0.3f;
      s.presence = 1.1f;
    }
    std::vector<float> logits = RandomLogits(rng, vocab, 3.0f);
    // Every fourth case on a coarse grid: many exactly equal logits, where the order's tie-break
    // (the lower id first) decides which tokens top-k and top-p keep.
    if (c % 4 == 3) {
      for (float& x : logits) x = std::round(x * 2.0f) / 2.0f;
    }
    std::vector<int32_t> prompt = RandomTokens(rng, vocab, 40);
    std::vector<int32_t> output = RandomTokens(rng, vocab, 25);
    output.push_back(output[0]);  // a token counted twice
    std::vector<float> probs(vocab, -1.0f);
    sampler.Distribution(logits, s, prompt, output, probs);
    std::vector<double> want = ReferenceDistribution(logits, s, prompt, output);
    for (int64_t i = 0; i < vocab; ++i) {
      ASSERT_NEAR(probs[i], want[i], 1e-6) << "config " << c << " token " << i;
      ASSERT_EQ(probs[i] == 0.0f, want[i] == 0.0) << "config " << c << " token " << i;
    }
    // The sampled token is the inverse CDF, in id order, of the reference at the counter's u.
    for (uint64_t seed : {1ull, 99ull}) {
      const int32_t token = sampler.Sample(logits, s, seed, prompt, output, nullptr);
      const double u = CounterUniform(seed, output.size());
      double sum = 0;
      int32_t expected = -1;
      for (int64_t i = 0; i < vocab && expected < 0; ++i) {
        sum += want[i];
        if (want[i] > 0 && sum > u) expected = static_cast<int32_t>(i);
      }
      EXPECT_EQ(token, expected) << "config " << c << " seed " << seed;
    }
  }
}

TEST(Sampling, SeededRunsRepeatAndFollowTheDistribution) {
  std::mt19937 rng(11);
  const int64_t vocab = 8;
  Sampler sampler(vocab);
  Sampling s;
  s.temperature = 0.9f;
  std::vector<float> logits = RandomLogits(rng, vocab, 1.0f);
  std::vector<float> probs(vocab);
  sampler.Distribution(logits, s, {}, {}, probs);
  // Each output index draws its own number: sample position i with an output of length i.
  const int n = 20000;
  std::vector<int32_t> output;
  std::vector<int> hits(vocab, 0);
  std::vector<int32_t> first, second;
  std::vector<int32_t> empty;
  for (int i = 0; i < n; ++i) {
    output.resize(i, 0);  // contents do not matter without penalties
    const int32_t t = sampler.Sample(logits, s, 1234, empty, output, nullptr);
    first.push_back(t);
    ++hits[t];
  }
  for (int i = 0; i < n; ++i) {
    output.resize(i, 0);
    second.push_back(sampler.Sample(logits, s, 1234, empty, output, nullptr));
  }
  EXPECT_EQ(first, second);
  for (int64_t t = 0; t < vocab; ++t) {
    // Binomial standard deviation is at most 0.0036 here; 5 of them.
    EXPECT_NEAR(hits[t] / static_cast<double>(n), probs[t], 0.018) << "token " << t;
  }
  // Another seed gives another sequence.
  int differ = 0;
  for (int i = 0; i < 200; ++i) {
    output.resize(i, 0);
    differ += sampler.Sample(logits, s, 4321, empty, output, nullptr) != first[i];
  }
  EXPECT_GT(differ, 50);
}

TEST(Sampling, CounterHashIsAPureFunction) {
  // Known values of the SplitMix64 finalizer (seed 0: the reference SplitMix64 stream).
  EXPECT_EQ(CounterHash(0, 0), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(CounterHash(0, 1), 0x6E789E6AA1B965F4ull);
  for (uint64_t c = 0; c < 1000; ++c) {
    const double u = CounterUniform(42, c);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
  }
}

TEST(Sampling, LogprobsMatchLogSoftmaxOfRawLogits) {
  std::mt19937 rng(3);
  const int64_t vocab = 500;
  Sampler sampler(vocab);
  Sampling s;
  s.temperature = 0.7f;
  s.repetition = 1.5f;  // shaping must not change the logprobs
  s.top_k = 3;
  s.logprobs = 5;
  std::vector<float> logits = RandomLogits(rng, vocab, 4.0f);
  std::vector<int32_t> prompt = RandomTokens(rng, vocab, 30);
  Logprobs lp;
  const int32_t token = sampler.Sample(logits, s, 5, prompt, {}, &lp);
  double max = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float x : logits) sum += std::exp(x - max);
  auto logprob = [&](int32_t t) { return logits[t] - max - std::log(sum); };
  EXPECT_EQ(lp.token, token);
  EXPECT_NEAR(lp.logprob, logprob(token), 1e-5);
  ASSERT_EQ(lp.top.size(), 5u);
  std::vector<int32_t> ids(vocab);
  for (int i = 0; i < vocab; ++i) ids[i] = i;
  std::sort(ids.begin(), ids.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(lp.top[i].token, ids[i]);
    EXPECT_NEAR(lp.top[i].logprob, logprob(ids[i]), 1e-5);
  }
  s.logprobs = -1;
  Logprobs untouched;
  untouched.token = -7;
  sampler.Sample(logits, s, 5, prompt, {}, &untouched);
  EXPECT_EQ(untouched.token, -7);
}

TEST(Sampling, CheckNamesTheField) {
  auto message = [](auto edit) {
    Sampling s;
    edit(s);
    return s.Check().message();
  };
  EXPECT_TRUE(Sampling{}.Check().ok());
  EXPECT_NE(message([](Sampling& s) { s.temperature = -1; }).find("temperature"),
            std::string::npos);
  EXPECT_NE(message([](Sampling& s) { s.top_k = -2; }).find("top_k"), std::string::npos);
  EXPECT_NE(message([](Sampling& s) { s.top_p = 0; }).find("top_p"), std::string::npos);
  EXPECT_NE(message([](Sampling& s) { s.min_p = 1.5f; }).find("min_p"), std::string::npos);
  EXPECT_NE(message([](Sampling& s) { s.presence = 3; }).find("presence"), std::string::npos);
  EXPECT_NE(message([](Sampling& s) { s.frequency = -3; }).find("frequency"), std::string::npos);
  EXPECT_NE(message([](Sampling& s) { s.repetition = 0; }).find("repetition"), std::string::npos);
  EXPECT_NE(message([](Sampling& s) { s.logprobs = -2; }).find("logprobs"), std::string::npos);
}

}  // namespace
}  // namespace gizllm
