#include "engine/engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <vector>

#include "engine/page_pool.h"
#include "fake_runner.h"
#include "ops/backend.h"

namespace gizllm {
namespace {

// What a request produces alone, computed from the fake's definition without the engine: the
// chain hash of the history gives the logits, the sampler picks from them.
std::vector<int32_t> Alone(const Request& request, uint64_t seed, int64_t context,
                           int64_t vocab = 64) {
  Sampler sampler(vocab);
  std::vector<int32_t> tokens = request.prompt;
  std::vector<float> logits(vocab);
  uint64_t h = 0x5157;
  for (size_t p = 0; p < tokens.size(); ++p) h = FakeRunner::Chain(h, tokens[p], p);
  std::vector<int32_t> out;
  const std::vector<int32_t> stop = request.stop ? *request.stop : std::vector<int32_t>{1};
  while (true) {
    for (int64_t v = 0; v < vocab; ++v) logits[v] = FakeRunner::Logit(h, v);
    std::span<const int32_t> all(tokens);
    const int32_t t =
        sampler.Sample(logits, request.sampling, seed, all.first(request.prompt.size()),
                       all.subspan(request.prompt.size()), nullptr);
    if (std::find(stop.begin(), stop.end(), t) != stop.end()) break;
    out.push_back(t);
    tokens.push_back(t);
    if ((request.limit > 0 && static_cast<int64_t>(out.size()) >= request.limit) ||
        static_cast<int64_t>(tokens.size()) > context) {
      break;
    }
    h = FakeRunner::Chain(h, t, tokens.size() - 1);
  }
  return out;
}

std::vector<int32_t> RandomPrompt(std::mt19937& rng, int n, int32_t vocab = 64) {
  std::uniform_int_distribution<int32_t> pick(2, vocab - 1);  // no eos in prompts
  std::vector<int32_t> prompt(n);
  for (int32_t& t : prompt) t = pick(rng);
  return prompt;
}

Request Greedy(std::vector<int32_t> prompt, int64_t limit) {
  Request r;
  r.prompt = std::move(prompt);
  r.limit = limit;
  r.sampling.temperature = 0.0f;
  return r;
}

std::unique_ptr<Engine> MakeEngine(FakeRunner& runner, int32_t slots, int64_t context, int64_t rows,
                                   int32_t pages) {
  EngineOptions options;
  options.slots = slots;
  options.context = context;
  options.rows = rows;
  options.kv_budget_bytes = pages * runner.PageBytes();
  auto engine = Engine::Create(&runner, options);
  EXPECT_TRUE(engine.ok()) << engine.status().message();
  return std::move(*engine);
}

TEST(PagePool, AllocatesRetainsAndReleases) {
  PagePool pool(3);
  auto a = pool.Allocate();
  auto b = pool.Allocate();
  auto c = pool.Allocate();
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(*a, 0);
  EXPECT_FALSE(pool.Allocate().has_value());
  pool.Retain(*b);
  pool.Release(*b);
  EXPECT_EQ(pool.free(), 0);
  pool.Release(*b);
  EXPECT_EQ(pool.free(), 1);
  EXPECT_EQ(*pool.Allocate(), *b);
}

TEST(Engine, CreateChecksOptions) {
  FakeRunner runner;
  EngineOptions options;
  options.slots = 4;
  options.context = 64;
  options.rows = 3;
  EXPECT_NE(Engine::Create(&runner, options).status().message().find("rows"), std::string::npos);
  options.rows = 16;
  options.kv_budget_bytes = 3 * runner.PageBytes();  // a 64-position sequence needs 4
  EXPECT_NE(Engine::Create(&runner, options).status().message().find("kv_budget_bytes"),
            std::string::npos);
  options.kv_budget_bytes = 4 * runner.PageBytes();
  EXPECT_TRUE(Engine::Create(&runner, options).ok());
}

TEST(Engine, AddChecksTheRequest) {
  FakeRunner runner;
  auto engine = MakeEngine(runner, 2, 32, 8, 8);
  EXPECT_NE(engine->Add(Greedy({}, 4)).status().message().find("prompt"), std::string::npos);
  EXPECT_NE(engine->Add(Greedy({5, 64}, 4)).status().message().find("prompt[1]"),
            std::string::npos);
  EXPECT_NE(engine->Add(Greedy(std::vector<int32_t>(33, 5), 4)).status().message().find("context"),
            std::string::npos);
  EXPECT_NE(engine->Add(Greedy({5}, 0)).status().message().find("limit"), std::string::npos);
  Request bad = Greedy({5}, 4);
  bad.sampling.top_p = 2;
  EXPECT_NE(engine->Add(bad).status().message().find("top_p"), std::string::npos);
  EXPECT_NE(engine->Add(Greedy({5}, 4), -1, 5).status().message().find("head"), std::string::npos);
  EXPECT_FALSE(engine->Busy());
}

TEST(Engine, GreedyMatchesTheDefinition) {
  FakeRunner runner;
  auto engine = MakeEngine(runner, 4, 128, 16, 32);
  std::mt19937 rng(1);
  std::vector<Request> requests;
  for (int i = 0; i < 6; ++i) requests.push_back(Greedy(RandomPrompt(rng, 5 + 9 * i), 40));
  auto out = engine->Generate(requests);
  ASSERT_TRUE(out.ok()) << out.status().message();
  int nonempty = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ((*out)[i], Alone(requests[i], 0, 128)) << "request " << i;
    nonempty += !(*out)[i].empty();
  }
  EXPECT_GT(nonempty, 3);
  EXPECT_TRUE(engine->CheckPages().ok()) << engine->CheckPages().message();
}

TEST(Engine, ProgressEndsWithoutTheStopTokenAndCarriesLogprobs) {
  FakeRunner runner;
  auto engine = MakeEngine(runner, 2, 64, 8, 8);
  std::mt19937 rng(2);
  // A prompt whose greedy answer stops before the limit, and one that hits the limit.
  Request stopping, limited;
  for (int tries = 0; tries < 1000; ++tries) {
    Request r = Greedy(RandomPrompt(rng, 6), 20);
    const auto alone = Alone(r, 0, 64);
    if (alone.size() < 20 && !alone.empty() && stopping.prompt.empty()) stopping = r;
    if (alone.size() == 20 && limited.prompt.empty()) limited = r;
  }
  ASSERT_FALSE(stopping.prompt.empty());
  ASSERT_FALSE(limited.prompt.empty());
  stopping.sampling.logprobs = 2;
  auto a = engine->Add(stopping);
  auto b = engine->Add(limited);
  ASSERT_TRUE(a.ok() && b.ok());
  std::map<int64_t, std::vector<int32_t>> got;
  std::map<int64_t, std::string> end;
  std::map<int64_t, int> ends;
  while (engine->Busy()) {
    auto progress = engine->Advance();
    ASSERT_TRUE(progress.ok()) << progress.status().message();
    for (const Progress& p : *progress) {
      ASSERT_EQ(ends[p.id], 0) << "progress after the end";
      got[p.id].insert(got[p.id].end(), p.tokens.begin(), p.tokens.end());
      if (p.id == *a) {
        ASSERT_EQ(p.logprobs.size(), p.tokens.size());
        for (size_t i = 0; i < p.tokens.size(); ++i) {
          EXPECT_EQ(p.logprobs[i].token, p.tokens[i]);
          ASSERT_EQ(p.logprobs[i].top.size(), 2u);
          EXPECT_EQ(p.logprobs[i].top[0].token, p.tokens[i]);  // greedy: the most likely
        }
      } else {
        EXPECT_TRUE(p.logprobs.empty());
      }
      if (!p.end.empty()) end[p.id] = p.end, ++ends[p.id];
    }
  }
  EXPECT_EQ(got[*a], Alone(stopping, 0, 64));
  EXPECT_EQ(got[*b], Alone(limited, 0, 64));
  EXPECT_EQ(end[*a], "stop");
  EXPECT_EQ(end[*b], "length");
}

TEST(Engine, ContextEndsWithLength) {
  FakeRunner runner;
  auto engine = MakeEngine(runner, 1, 20, 8, 2);
  Request r = Greedy(std::vector<int32_t>(15, 7), -1);
  r.stop = std::vector<int32_t>{};  // never stops on its own
  auto out = engine->Generate({r});
  ASSERT_TRUE(out.ok()) << out.status().message();
  // Positions 0..19 are read; the token after position 19 is the last.
  EXPECT_EQ((*out)[0].size(), 6u);
  EXPECT_EQ((*out)[0], Alone(r, 0, 20));
}

// 32 requests with random prompt lengths, limits, arrival times and cancellations, on a pool
// that holds a fraction of what they need: each gets the tokens it gets alone.
TEST(Engine, ConcurrentRequestsEqualAloneUnderPreemption) {
  for (bool sampled : {false, true}) {
    FakeRunner runner;
    const int64_t context = 160;
    auto engine = MakeEngine(runner, 8, context, 40, 16);
    std::mt19937 rng(sampled ? 5 : 4);
    struct Pending {
      Request request;
      int arrival;
      int cancel_at;  // step to cancel at; -1: never
    };
    std::vector<Pending> pending;
    for (int i = 0; i < 32; ++i) {
      Request r = Greedy(RandomPrompt(rng, 1 + rng() % 90), 1 + rng() % 60);
      if (sampled) {
        r.sampling.temperature = 0.8f;
        r.sampling.top_k = 20;
        r.sampling.top_p = 0.95f;
        r.sampling.repetition = 1.1f;
        r.sampling.seed = rng();
      }
      pending.push_back({r, static_cast<int>(rng() % 60), i % 5 == 0 ? int(rng() % 80) : -1});
    }
    std::map<int64_t, int> index;
    std::map<int64_t, std::vector<int32_t>> got;
    std::map<int64_t, bool> ended;
    int step = 0;
    while (step < 60 || engine->Busy()) {
      for (int i = 0; i < 32; ++i) {
        if (pending[i].arrival == step) {
          auto id = engine->Add(pending[i].request);
          ASSERT_TRUE(id.ok());
          index[*id] = i;
        }
      }
      for (auto& [id, i] : index) {
        if (pending[i].cancel_at == step && !ended[id]) {
          EXPECT_TRUE(engine->Cancel(id));
          ended[id] = true;
        }
      }
      auto progress = engine->Advance();
      ASSERT_TRUE(progress.ok()) << progress.status().message();
      for (const Progress& p : *progress) {
        ASSERT_FALSE(ended[p.id]);
        got[p.id].insert(got[p.id].end(), p.tokens.begin(), p.tokens.end());
        if (!p.end.empty()) ended[p.id] = true;
      }
      Status check = engine->CheckPages();
      ASSERT_TRUE(check.ok()) << check.message();
      ++step;
      ASSERT_LT(step, 5000);
    }
    int cancelled_early = 0;
    for (auto& [id, i] : index) {
      const auto want =
          Alone(pending[i].request, pending[i].request.sampling.seed.value_or(0), context);
      if (pending[i].cancel_at >= 0 && got[id].size() < want.size()) {
        ++cancelled_early;
        EXPECT_TRUE(std::equal(got[id].begin(), got[id].end(), want.begin())) << "request " << i;
      } else {
        EXPECT_EQ(got[id], want) << "request " << i;
      }
    }
    EXPECT_GT(cancelled_early, 0);
    EXPECT_GT(engine->stats().preemptions, 0);
    engine->DropCaches();
    EXPECT_EQ(engine->free_pages(), engine->pages());
  }
}

}  // namespace
}  // namespace gizllm
