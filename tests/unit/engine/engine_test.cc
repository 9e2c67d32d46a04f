#include "engine/engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
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
  // Prefixes pushed out of a full pool go to the host (off by default): the tests below check
  // that they come back.
  if (!runner.pages_on_host) options.host_prefix_bytes = options.kv_budget_bytes;
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

// A KV pool the runner cannot allocate: the error says which context asked for it.
TEST(Engine, PoolTooLargeNamesTheContext) {
  FakeRunner runner;
  runner.max_pool_pages = 1000;
  EngineOptions options;
  options.slots = 2;
  options.context = 4096;
  options.kv_budget_bytes = 2000 * runner.PageBytes();
  auto engine = Engine::Create(&runner, options);
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(engine.status().message().find("KV pages for a context of 4096 positions (2000 pages"),
            std::string::npos)
      << engine.status().message();
  EXPECT_NE(engine.status().message().find("fake: cannot allocate 2000 pages"), std::string::npos);
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
  EXPECT_NE(engine->Add(Greedy({5}, 4), -1, 5).status().message().find("shared start"),
            std::string::npos);
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

// A prompt alone is read in steps of up to `rows`; beside a generating sequence, prompt pieces
// and decodes share `busy_rows` (chunked prefill). The tokens are the same either way.
TEST(Engine, PromptsAloneTakeRowsAndBesideDecodesBusyRows) {
  FakeRunner runner;
  EngineOptions options;
  options.slots = 2;
  options.context = 128;
  options.rows = 64;
  options.busy_rows = 8;
  options.kv_budget_bytes = 32 * runner.PageBytes();
  auto engine = Engine::Create(&runner, options);
  ASSERT_TRUE(engine.ok()) << engine.status().message();
  std::mt19937 rng(7);
  const Request first = Greedy(RandomPrompt(rng, 60), 30);
  const Request second = Greedy(RandomPrompt(rng, 50), 10);
  std::map<int64_t, std::vector<int32_t>> out;
  auto advance = [&] {
    auto progress = (*engine)->Advance();
    ASSERT_TRUE(progress.ok()) << progress.status().message();
    for (const Progress& p : *progress)
      out[p.id].insert(out[p.id].end(), p.tokens.begin(), p.tokens.end());
  };
  auto a = (*engine)->Add(first);
  ASSERT_TRUE(a.ok());
  advance();
  ASSERT_EQ(runner.step_rows().size(), 1u);
  EXPECT_EQ(runner.step_rows()[0], 60);  // the whole prompt in one step
  const size_t before = runner.step_rows().size();
  auto b = (*engine)->Add(second);
  ASSERT_TRUE(b.ok());
  while ((*engine)->Busy()) advance();
  // While the first generates, each step reads at most busy_rows: 7 prompt rows beside its one.
  int64_t pieces = 0;
  for (size_t i = before; i < runner.step_rows().size(); ++i) {
    EXPECT_LE(runner.step_rows()[i], 8) << "step " << i;
    pieces += runner.step_rows()[i] == 8;
  }
  EXPECT_GE(pieces, 50 / 7);
  EXPECT_TRUE((*engine)->CheckPages().ok());
  // The same tokens as each alone.
  EXPECT_EQ(out[*a], Alone(first, 0, 128));
  EXPECT_EQ(out[*b], Alone(second, 0, 128));
  // busy_rows outside [slots, rows] is refused.
  options.busy_rows = 1;
  EXPECT_FALSE(Engine::Create(&runner, options).ok());
  options.busy_rows = 65;
  EXPECT_FALSE(Engine::Create(&runner, options).ok());
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
// Also under window paging (layers with a window of 20 positions in two window groups): pages of
// every block, and of the last blocks for the window layers.
TEST(Engine, ConcurrentRequestsEqualAloneUnderPreemption) {
  for (int config = 0; config < 4; ++config) {
    const bool sampled = config % 2 == 1;
    const int32_t window = config >= 2 ? 20 : 0;
    SCOPED_TRACE(std::string(sampled ? "sampled" : "greedy") + " window " + std::to_string(window));
    FakeRunner runner;
    if (window > 0) runner.SetWindow(window, 2);
    const int64_t context = 160;
    auto engine = MakeEngine(runner, 8, context, 40, window > 0 ? 32 : 16);
    EXPECT_EQ(runner.window_paging(), window > 0);
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

// A runner that picks tokens itself gets the rows whose requests use no penalties and no
// logprobs; the tokens are those of host sampling, under preemption and in any batch.
TEST(Engine, RunnerPicksTokensOnlyWithoutPenaltiesOrLogprobs) {
  for (int variant = 0; variant < 3; ++variant) {
    FakeRunner runner;
    runner.picks_tokens = true;
    const int64_t context = 160;
    auto engine = MakeEngine(runner, 6, context, 40, 14);
    std::mt19937 rng(10 + variant);
    std::vector<Request> requests;
    for (int i = 0; i < 16; ++i) {
      Request r = Greedy(RandomPrompt(rng, 1 + rng() % 70), 1 + rng() % 50);
      if (i % 4 != 0) {
        r.sampling.temperature = 0.6f + 0.1f * (i % 5);
        r.sampling.top_k = i % 3 == 0 ? 0 : 5 + i;
        r.sampling.top_p = i % 2 ? 0.9f : 1.0f;
        r.sampling.min_p = i % 5 == 1 ? 0.05f : 0.0f;
        r.sampling.seed = rng();
      }
      // variant 1: one request asks for logprobs; variant 2: one has a penalty.
      if (variant == 1 && i == 7) r.sampling.logprobs = 1;
      if (variant == 2 && i == 7) r.sampling.presence = 0.5f;
      requests.push_back(r);
    }
    auto out = engine->Generate(requests);
    ASSERT_TRUE(out.ok()) << out.status().message();
    for (size_t i = 0; i < requests.size(); ++i) {
      EXPECT_EQ((*out)[i], Alone(requests[i], requests[i].sampling.seed.value_or(0), context))
          << "variant " << variant << " request " << i;
    }
    EXPECT_GT(engine->stats().preemptions, 0);
    EXPECT_GT(engine->stats().device_sampled, 0);
    EXPECT_GT(runner.sampled_rows, 0);
    if (variant == 0) {
      // Every step with a token to pick went to the runner.
      EXPECT_LT(engine->stats().device_sampled, engine->stats().steps + 1);
      EXPECT_GT(runner.sampled_rows, 200);
    } else {
      // The steps that held request 7 came to the host.
      EXPECT_LT(engine->stats().device_sampled, engine->stats().steps);
    }
  }
}

// A request whose logits hold a NaN or an infinity ends with an error of its own; the requests
// in the same steps go on to the tokens they get alone. The same whether the host or the runner
// (as a device would) picks the tokens.
TEST(Engine, NonFiniteLogitsEndOnlyTheirRequest) {
  constexpr int32_t kPoison = 5;
  for (bool picks : {false, true}) {
    for (float poison :
         {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      FakeRunner runner;
      runner.picks_tokens = picks;
      runner.poison_token = kPoison;
      runner.poison_value = poison;
      auto engine = MakeEngine(runner, 4, 128, 32, 32);
      std::mt19937 rng(4);
      // Prompts without the poisoned token, answers that never meet it.
      std::vector<Request> clean;
      while (clean.size() < 2) {
        Request r = Greedy(RandomPrompt(rng, 6), 12);
        if (clean.size() == 1) r.sampling.temperature = 0.8f, r.sampling.seed = 99;
        std::vector<int32_t> all = r.prompt;
        const auto alone = Alone(r, r.sampling.seed.value_or(0), 128);
        all.insert(all.end(), alone.begin(), alone.end());
        if (std::find(all.begin(), all.end(), kPoison) == all.end()) clean.push_back(r);
      }
      Request bad = Greedy({9, 8, kPoison}, 12);
      auto a = engine->Add(clean[0]);
      auto b = engine->Add(bad);
      auto c = engine->Add(clean[1]);
      ASSERT_TRUE(a.ok() && b.ok() && c.ok());
      std::map<int64_t, std::vector<int32_t>> got;
      std::map<int64_t, Progress> last;
      while (engine->Busy()) {
        auto progress = engine->Advance();
        ASSERT_TRUE(progress.ok()) << progress.status().message();
        for (const Progress& p : *progress) {
          got[p.id].insert(got[p.id].end(), p.tokens.begin(), p.tokens.end());
          if (!p.end.empty()) last[p.id] = p;
        }
      }
      EXPECT_EQ(last[*b].end, "error");
      EXPECT_FALSE(last[*b].status.ok());
      EXPECT_NE(last[*b].status.message().find("NaN or infinity"), std::string::npos)
          << last[*b].status.message();
      EXPECT_TRUE(got[*b].empty());
      for (auto [id, r] : {std::pair{*a, clean[0]}, std::pair{*c, clean[1]}}) {
        EXPECT_TRUE(last[id].status.ok()) << last[id].status.message();
        EXPECT_NE(last[id].end, "error");
        EXPECT_EQ(got[id], Alone(r, r.sampling.seed.value_or(0), 128)) << picks << " " << poison;
      }
      EXPECT_TRUE(engine->CheckPages().ok()) << engine->CheckPages().message();
      // Generate returns the failed request's error.
      auto out = engine->Generate({clean[0], bad});
      ASSERT_FALSE(out.ok());
      EXPECT_NE(out.status().message().find("request 1: the logits after 3 tokens"),
                std::string::npos)
          << out.status().message();
      EXPECT_FALSE(engine->Busy());
    }
  }
}

TEST(Engine, WarmRunsEachShapeAndLeavesNothingBehind) {
  for (bool picks : {false, true}) {
    FakeRunner runner;
    runner.picks_tokens = picks;
    auto engine = MakeEngine(runner, 5, 64, 24, 16);
    ASSERT_TRUE(engine->Warm().ok());
    // A prompt step of 24 rows, then decode steps of 1..5 rows, each shape twice (a runner
    // records a shape the second time it comes).
    EXPECT_EQ(runner.steps(), 12);
    EXPECT_EQ(runner.rows_read(), 2 * (24 + 1 + 2 + 3 + 4 + 5));
    EXPECT_EQ(runner.sampled_rows, picks ? 2 * (1 + 2 + 3 + 4 + 5) : 0);
    // Every row after the first of a decode step under a mask (the masks' buffer sized).
    EXPECT_EQ(runner.masked_rows, picks ? 2 * (0 + 1 + 2 + 3 + 4) : 0);
    EXPECT_EQ(engine->free_pages(), engine->pages());
    for (int s = 0; s < 5; ++s) EXPECT_TRUE(engine->held(s).empty());
    EXPECT_EQ(engine->stats().steps, 0);
    // At most max_decode_shapes decode shapes.
    ASSERT_TRUE(engine->Warm(2).ok());
    EXPECT_EQ(runner.steps(), 12 + 6);
    // Afterwards requests run as on a fresh engine.
    std::mt19937 rng(3);
    Request r = Greedy(RandomPrompt(rng, 20), 30);
    auto out = engine->Generate({r});
    ASSERT_TRUE(out.ok()) << out.status().message();
    EXPECT_EQ((*out)[0], Alone(r, 0, 64));
    // Not while a request runs.
    ASSERT_TRUE(engine->Add(r).ok());
    ASSERT_TRUE(engine->Advance().ok());
    EXPECT_FALSE(engine->Warm().ok());
  }
}

// Runs requests one after another on `engine`; returns each one's tokens and first `cached`.
struct Outcome {
  std::vector<int32_t> tokens;
  int64_t cached = -1;
  int64_t rows = 0;  // rows the runner read for it
};
Outcome RunOne(Engine& engine, FakeRunner& runner, const Request& request, int32_t shared = 0) {
  Outcome run;
  const int64_t before = runner.rows_read();
  auto id = engine.Add(request, -1, shared);
  EXPECT_TRUE(id.ok());
  while (engine.Busy()) {
    auto progress = engine.Advance();
    EXPECT_TRUE(progress.ok()) << progress.status().message();
    if (!progress.ok()) break;
    for (const Progress& p : *progress) {
      if (run.cached < 0) run.cached = p.cached;
      run.tokens.insert(run.tokens.end(), p.tokens.begin(), p.tokens.end());
    }
    Status check = engine.CheckPages();
    EXPECT_TRUE(check.ok()) << check.message();
  }
  run.rows = runner.rows_read() - before;
  return run;
}

Outcome Cold(const Request& request, int64_t context) {
  FakeRunner runner;
  auto engine = MakeEngine(runner, 1, context, 256, 64);
  return RunOne(*engine, runner, request);
}

TEST(Engine, StoredPrefixInSlotOrOnHostReadsOnlyTheRest) {
  std::mt19937 rng(8);
  for (bool host : {false, true}) {
    FakeRunner runner;
    // One slot and a pool of one context: another request pushes the first one's KV to the host.
    auto engine = host ? MakeEngine(runner, 1, 64, 64, 4) : MakeEngine(runner, 2, 64, 64, 16);
    Request first = Greedy(RandomPrompt(rng, 30), 5);
    first.stop = std::vector<int32_t>{};
    Outcome a = RunOne(*engine, runner, first);
    ASSERT_EQ(a.tokens.size(), 5u);
    EXPECT_EQ(a.cached, 0);
    if (host) {
      Request other = Greedy(RandomPrompt(rng, 30), 5);
      other.prompt[0] = first.prompt[0] == 2 ? 3 : 2;
      RunOne(*engine, runner, other);
      EXPECT_GT(engine->stats().host_copies, 0);
    }
    // The next turn: the first prompt, its answer, and more.
    Request next = Greedy(first.prompt, 8);
    next.prompt.insert(next.prompt.end(), a.tokens.begin(), a.tokens.end());
    std::vector<int32_t> more = RandomPrompt(rng, 7);
    next.prompt.insert(next.prompt.end(), more.begin(), more.end());
    Outcome warm = RunOne(*engine, runner, next);
    Outcome cold = Cold(next, 64);
    EXPECT_EQ(warm.tokens, cold.tokens);
    // The slot held the first prompt and all but the last answer token.
    EXPECT_EQ(warm.cached, 30 + 5 - 1) << (host ? "host" : "slot");
    EXPECT_EQ(warm.rows, cold.rows - warm.cached);
  }
}

// A prefix pushed out of the pool is dropped unless host memory for prefixes is given
// explicitly, where the pool is host or device memory; either way the next turn's tokens are a
// cold run's.
TEST(Engine, PoolKeepsNoHostCopiesByDefault) {
  for (auto [pages_on_host, host_bytes] :
       {std::pair{true, int64_t{0}}, std::pair{true, int64_t{1} << 20},
        std::pair{false, int64_t{0}}, std::pair{false, int64_t{1} << 20}}) {
    SCOPED_TRACE(std::string(pages_on_host ? "host" : "device") + " pool, host bytes " +
                 std::to_string(host_bytes));
    std::mt19937 rng(8);
    FakeRunner runner;
    runner.pages_on_host = pages_on_host;
    EngineOptions options;
    options.slots = 1;
    options.context = 64;
    options.rows = 64;
    options.kv_budget_bytes = 4 * runner.PageBytes();
    if (host_bytes > 0) options.host_prefix_bytes = host_bytes;
    auto created = Engine::Create(&runner, options);
    ASSERT_TRUE(created.ok()) << created.status().message();
    Engine& engine = **created;
    Request first = Greedy(RandomPrompt(rng, 30), 5);
    first.stop = std::vector<int32_t>{};
    Outcome a = RunOne(engine, runner, first);
    Request other = Greedy(RandomPrompt(rng, 30), 5);
    other.prompt[0] = first.prompt[0] == 2 ? 3 : 2;
    RunOne(engine, runner, other);
    Request next = Greedy(first.prompt, 8);
    next.prompt.insert(next.prompt.end(), a.tokens.begin(), a.tokens.end());
    Outcome again = RunOne(engine, runner, next);
    EXPECT_EQ(again.tokens, Cold(next, 64).tokens);
    if (host_bytes == 0) {
      EXPECT_EQ(engine.stats().host_copies, 0);
      EXPECT_EQ(again.cached, 0);
    } else {
      EXPECT_GT(engine.stats().host_copies, 0);
      EXPECT_EQ(again.cached, 30 + 5 - 1);
    }
  }
}

TEST(Engine, SharedStartIsReadInPlaceBySlots) {
  std::mt19937 rng(9);
  FakeRunner runner;
  const int64_t context = 128;
  // Slots for all: no request finds another's finished slot.
  auto engine = MakeEngine(runner, 8, context, 256, 60);
  const std::vector<int32_t> start = RandomPrompt(rng, 3 * kPage + 5);  // cut to 3 pages
  std::vector<Request> requests;
  for (int i = 0; i < 5; ++i) {
    Request r = Greedy(start, 12);
    std::vector<int32_t> rest = RandomPrompt(rng, 3 + i * 4);
    r.prompt.insert(r.prompt.end(), rest.begin(), rest.end());
    requests.push_back(r);
  }
  // Exactly the shared pages: the last one is read again (it writes its own copy).
  requests.push_back(Greedy(std::vector<int32_t>(start.begin(), start.begin() + 3 * kPage), 12));
  auto first = engine->Add(requests[0], -1, static_cast<int32_t>(start.size()));
  ASSERT_TRUE(first.ok());
  std::map<int64_t, std::vector<int32_t>> got;
  auto step = engine->Advance();  // reads the first prompt, registers its shared start
  ASSERT_TRUE(step.ok());
  ASSERT_EQ(step->size(), 1u);
  got[*first] = (*step)[0].tokens;
  const int64_t before = runner.rows_read();
  std::map<int64_t, size_t> index;
  for (size_t i = 1; i < requests.size(); ++i) {
    auto id = engine->Add(requests[i], -1,
                          static_cast<int32_t>(std::min(start.size(), requests[i].prompt.size())));
    ASSERT_TRUE(id.ok());
    index[*id] = i;
  }
  std::map<int64_t, int64_t> cached;
  while (engine->Busy()) {
    auto progress = engine->Advance();
    ASSERT_TRUE(progress.ok()) << progress.status().message();
    for (const Progress& p : *progress) {
      got[p.id].insert(got[p.id].end(), p.tokens.begin(), p.tokens.end());
      if (!cached.count(p.id) && p.id != *first) cached[p.id] = p.cached;
    }
    Status check = engine->CheckPages();
    ASSERT_TRUE(check.ok()) << check.message();
  }
  EXPECT_EQ(got[*first], Alone(requests[0], 0, context));
  int64_t cold_rows = 0;
  int64_t saved = 0;
  for (auto& [id, i] : index) {
    EXPECT_EQ(got[id], Alone(requests[i], 0, context)) << "request " << i;
    const int64_t want = i + 1 < requests.size() ? 3 * kPage : 2 * kPage;
    EXPECT_EQ(cached[id], want) << "request " << i;
    saved += want;
    cold_rows += Cold(requests[i], context).rows;
  }
  // Rows after the first step: the later requests' cold rows less the shared ones, plus the
  // first request's decodes.
  const int64_t first_rows = Cold(requests[0], context).rows - requests[0].prompt.size();
  EXPECT_EQ(runner.rows_read() - before, cold_rows - saved + first_rows);
}

// 10,000 random adds, steps, cancels and cache drops on a small pool: every request's tokens
// equal its tokens alone, the page books balance after every step, nothing leaks at the end.
void CheckPageManager(int32_t window) {
  std::mt19937 rng(10);
  FakeRunner runner;
  if (window > 0) runner.SetWindow(window, 3);
  const int64_t context = 96;
  // Under window paging a block takes 4 pages while the window layers read it.
  auto engine = MakeEngine(runner, 6, context, 24, window > 0 ? 34 : 14);
  ASSERT_EQ(runner.window_paging(), window > 0);
  std::vector<std::vector<int32_t>> bases;
  for (int i = 0; i < 4; ++i) bases.push_back(RandomPrompt(rng, 64));
  std::map<int64_t, Request> requests;
  std::map<int64_t, std::vector<int32_t>> got;
  std::map<int64_t, std::string> ended;  // "stop", "length" or "cancel"
  std::vector<int64_t> live;
  auto advance = [&]() {
    auto progress = engine->Advance();
    ASSERT_TRUE(progress.ok()) << progress.status().message();
    for (const Progress& p : *progress) {
      ASSERT_FALSE(ended.count(p.id)) << "progress after the end";
      got[p.id].insert(got[p.id].end(), p.tokens.begin(), p.tokens.end());
      if (!p.end.empty()) {
        ended[p.id] = p.end;
        std::erase(live, p.id);
      }
    }
    Status check = engine->CheckPages();
    ASSERT_TRUE(check.ok()) << check.message();
  };
  for (int op = 0; op < 10000; ++op) {
    const int r = rng() % 100;
    if (r < 20 && live.size() < 30) {
      Request request;
      int32_t shared = 0;
      if (rng() % 2) {
        const auto& base = bases[rng() % bases.size()];
        const int n = 1 + rng() % 64;
        request.prompt.assign(base.begin(), base.begin() + n);
        if (n >= kPage && rng() % 2) shared = n;
      }
      const auto rest = RandomPrompt(rng, rng() % 24);
      request.prompt.insert(request.prompt.end(), rest.begin(), rest.end());
      if (request.prompt.empty()) request.prompt.push_back(5);
      request.limit = 1 + rng() % 30;
      if (rng() % 2) {
        request.sampling.temperature = 0.0f;
      } else {
        request.sampling.temperature = 1.0f;
        request.sampling.min_p = 0.02f;
        request.sampling.seed = rng();
      }
      auto id = engine->Add(request, -1, shared);
      ASSERT_TRUE(id.ok()) << id.status().message();
      requests[*id] = request;
      live.push_back(*id);
    } else if (r < 26 && !live.empty()) {
      const int64_t id = live[rng() % live.size()];
      ASSERT_TRUE(engine->Cancel(id));
      ended[id] = "cancel";
      std::erase(live, id);
    } else if (r < 27) {
      engine->DropCaches();
      Status check = engine->CheckPages();
      ASSERT_TRUE(check.ok()) << check.message();
    } else {
      advance();
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
  while (engine->Busy()) {
    advance();
    if (::testing::Test::HasFatalFailure()) return;
  }
  int64_t cancelled = 0;
  for (auto& [id, request] : requests) {
    const auto want = Alone(request, request.sampling.seed.value_or(0), context);
    if (ended[id] == "cancel") {
      ++cancelled;
      ASSERT_LE(got[id].size(), want.size());
      EXPECT_TRUE(std::equal(got[id].begin(), got[id].end(), want.begin())) << "request " << id;
    } else {
      EXPECT_EQ(got[id], want) << "request " << id;
    }
  }
  EXPECT_GT(requests.size(), 1000u);
  EXPECT_GT(cancelled, 100);
  EXPECT_GT(engine->stats().preemptions, 10);
  EXPECT_GT(engine->stats().prefix_hits, 100);
  EXPECT_GT(engine->stats().host_copies, 0);
  EXPECT_EQ(runner.rows_read(), engine->stats().rows);
  engine->DropCaches();
  ASSERT_TRUE(engine->CheckPages().ok());
  EXPECT_EQ(engine->free_pages(), engine->pages());
}

TEST(Engine, PageManagerProperty) { CheckPageManager(/*window=*/0); }

// Window layers of 6 positions (shorter than a page) in three groups: prefixes, shared starts,
// host copies and preemption with the blocks before each window released.
TEST(Engine, PageManagerPropertyUnderWindowPaging) { CheckPageManager(/*window=*/6); }

// Window paging on a sequence many windows long: the window layers' pages its slot holds stay
// within the window's blocks (PagesFor(window) + 2 a group while it decodes, WindowBlocks while
// it reads prompt pieces) where every block's would be 25 a group at the end; the tokens are the
// definition's; a prefix of 399 positions (the window is 24), kept in its slot or copied to the
// host and back, is continued reading only the rest; nothing leaks.
TEST(Engine, WindowPagesStayBoundedAndLongPrefixesResume) {
  const int32_t window = 24, groups = 2;
  const int64_t context = 512, rows = 32;
  for (bool host : {false, true}) {
    SCOPED_TRACE(host ? "host" : "slot");
    std::mt19937 rng(12);
    FakeRunner runner;
    runner.SetWindow(window, groups);
    // host: one slot and a pool of one sequence, so that the next request pushes the prefix out.
    const int32_t one = PagesFor(context) + groups * WindowBlocks(window, rows);
    auto engine = host ? MakeEngine(runner, 1, context, rows, one)
                       : MakeEngine(runner, 2, context, rows, 3 * one);
    ASSERT_TRUE(runner.window_paging());
    Request first = Greedy(RandomPrompt(rng, 100), 300);
    first.stop = std::vector<int32_t>{};
    ASSERT_TRUE(engine->Add(first).ok());
    std::vector<int32_t> got;
    int32_t most = 0;
    while (engine->Busy()) {
      auto progress = engine->Advance();
      ASSERT_TRUE(progress.ok()) << progress.status().message();
      for (const Progress& p : *progress) got.insert(got.end(), p.tokens.begin(), p.tokens.end());
      Status check = engine->CheckPages();
      ASSERT_TRUE(check.ok()) << check.message();
      const int64_t held = static_cast<int64_t>(engine->held(0).size());
      const int32_t window_pages = engine->pages() - engine->free_pages() - PagesFor(held);
      if (held > static_cast<int64_t>(first.prompt.size())) {
        ASSERT_LE(window_pages, groups * (PagesFor(window) + 2)) << "at " << held;
      } else {
        ASSERT_LE(window_pages, groups * WindowBlocks(window, rows)) << "at " << held;
      }
      most = std::max(most, window_pages);
    }
    EXPECT_EQ(got, Alone(first, 0, context));
    ASSERT_EQ(engine->held(0).size(), 399u);
    EXPECT_GT(most, 0);
    EXPECT_LE(engine->pages() - engine->free_pages() - PagesFor(399),
              groups * (PagesFor(window) + 2));
    if (host) {
      Request other = Greedy(RandomPrompt(rng, 100), 20);
      other.prompt[0] = first.prompt[0] == 2 ? 3 : 2;
      RunOne(*engine, runner, other);
      EXPECT_GT(engine->stats().host_copies, 0);
    }
    Request next = Greedy(first.prompt, 40);
    next.prompt.insert(next.prompt.end(), got.begin(), got.end());
    const std::vector<int32_t> more = RandomPrompt(rng, 7);
    next.prompt.insert(next.prompt.end(), more.begin(), more.end());
    Outcome warm = RunOne(*engine, runner, next);
    Outcome cold = Cold(next, context);
    EXPECT_EQ(warm.tokens, cold.tokens);
    EXPECT_EQ(warm.cached, 100 + 300 - 1);
    EXPECT_EQ(warm.rows, cold.rows - warm.cached);
    engine->DropCaches();
    ASSERT_TRUE(engine->CheckPages().ok());
    EXPECT_EQ(engine->free_pages(), engine->pages());
  }
}

// A start shorter than the window pages a holder kept is not taken from it: it reads from the
// start (or a longer start another holds) and gives the definition's tokens.
TEST(Engine, WindowPagingRefusesStartsBeforeTheKeptWindow) {
  std::mt19937 rng(13);
  FakeRunner runner;
  runner.SetWindow(8, 1);
  const int64_t context = 256;
  auto engine = MakeEngine(runner, 2, context, 64, 80);
  Request first = Greedy(RandomPrompt(rng, 150), 4);
  first.stop = std::vector<int32_t>{};
  Outcome a = RunOne(*engine, runner, first);
  // The first 40 tokens of that prompt: its slot keeps window pages from block 7 on only.
  Request early = Greedy(std::vector<int32_t>(first.prompt.begin(), first.prompt.begin() + 41), 6);
  Outcome b = RunOne(*engine, runner, early);
  EXPECT_EQ(b.cached, 0);
  EXPECT_EQ(b.tokens, Cold(early, context).tokens);
  // The whole first turn and more: taken from the slot.
  Request next = Greedy(first.prompt, 6);
  next.prompt.insert(next.prompt.end(), a.tokens.begin(), a.tokens.end());
  Outcome c = RunOne(*engine, runner, next);
  EXPECT_EQ(c.cached, 150 + 4 - 1);
  EXPECT_EQ(c.tokens, Cold(next, context).tokens);
  engine->DropCaches();
  EXPECT_EQ(engine->free_pages(), engine->pages());
}

// A budget that holds a whole context only with every layer's pages a block (not with the
// window layers' pages beside) runs without window paging, as before it.
TEST(Engine, WindowPagingNeedsABudgetForOneContext) {
  for (int32_t pages : {4, 12}) {
    FakeRunner runner;
    runner.SetWindow(20, 2);
    // 4 blocks of context; under window paging 4 + 2 * 4 pages.
    auto engine = MakeEngine(runner, 1, 64, 64, pages);
    ASSERT_NE(engine, nullptr);
    EXPECT_EQ(runner.window_paging(), pages == 12);
    std::mt19937 rng(15);
    Request r = Greedy(RandomPrompt(rng, 40), 20);
    r.stop = std::vector<int32_t>{};
    EXPECT_EQ(RunOne(*engine, runner, r).tokens, Alone(r, 0, 64));
  }
}

// Low-level steps under window paging: Accept drops rows of the last step (their window pages
// with them) and the slot goes on from the kept rows.
TEST(Engine, LowLevelAcceptUnderWindowPaging) {
  FakeRunner runner;
  runner.SetWindow(10, 2);
  auto engine = MakeEngine(runner, 1, 256, 40, 80);
  std::mt19937 rng(14);
  std::vector<int32_t> history;
  for (int round = 0; round < 12; ++round) {
    const std::vector<int32_t> piece = RandomPrompt(rng, 1 + rng() % 40);
    const int32_t last = static_cast<int32_t>(piece.size()) - 1;
    auto logits = engine->Step(piece, std::vector<int32_t>(piece.size(), 0),
                               std::span<const int32_t>(&last, 1));
    ASSERT_TRUE(logits.ok()) << logits.status().message();
    const int64_t kept = rng() % (piece.size() + 1);
    ASSERT_TRUE(engine->Accept(0, kept).ok());
    history.insert(history.end(), piece.begin(), piece.begin() + kept);
    ASSERT_EQ(engine->held(0), history);
    Status check = engine->CheckPages();
    ASSERT_TRUE(check.ok()) << check.message();
  }
  ASSERT_TRUE(engine->Reset(0).ok());
  EXPECT_EQ(engine->free_pages(), engine->pages());
}

TEST(Engine, LowLevelStepHiddenAndReset) {
  FakeRunner runner;
  auto engine = MakeEngine(runner, 3, 64, 16, 12);
  auto logits_after = [](std::vector<int32_t> history) {
    uint64_t h = 0x5157;
    for (size_t p = 0; p < history.size(); ++p) h = FakeRunner::Chain(h, history[p], p);
    std::vector<float> out(64);
    for (int v = 0; v < 64; ++v) out[v] = FakeRunner::Logit(h, v);
    return out;
  };
  std::vector<int32_t> tokens = {7, 8, 9, 10, 11};
  std::vector<int32_t> slots = {2, 2, 2, 0, 0};
  std::vector<int32_t> wanted = {1, 2, 4};
  auto logits = engine->Step(tokens, slots, wanted);
  ASSERT_TRUE(logits.ok()) << logits.status().message();
  ASSERT_EQ(logits->size(), 3u * 64);
  std::vector<float> row(logits->begin(), logits->begin() + 64);
  EXPECT_EQ(row, logits_after({7, 8}));
  row.assign(logits->begin() + 64, logits->begin() + 128);
  EXPECT_EQ(row, logits_after({7, 8, 9}));
  row.assign(logits->begin() + 128, logits->end());
  EXPECT_EQ(row, logits_after({10, 11}));
  EXPECT_EQ(engine->held(2), (std::vector<int32_t>{7, 8, 9}));
  // The next step continues each slot where it ended.
  std::vector<int32_t> one = {12};
  std::vector<int32_t> slot2 = {2};
  std::vector<int32_t> first = {0};
  logits = engine->Step(one, slot2, first);
  ASSERT_TRUE(logits.ok());
  EXPECT_EQ(*logits, logits_after({7, 8, 9, 12}));
  ASSERT_TRUE(engine->Reset(2).ok());
  EXPECT_TRUE(engine->held(2).empty());
  logits = engine->Step(one, slot2, first);
  ASSERT_TRUE(logits.ok());
  EXPECT_EQ(*logits, logits_after({12}));

  std::vector<int> layers = {0, 2};
  auto hidden = engine->Hidden(tokens, std::vector<int32_t>{1, 1, 1, 1, 1}, layers);
  ASSERT_TRUE(hidden.ok()) << hidden.status().message();
  EXPECT_EQ(hidden->size(), 2u * 5 * 4);
  EXPECT_EQ(engine->held(1), tokens);

  std::vector<int32_t> split = {0, 1, 0, 1, 0};
  EXPECT_NE(engine->Step(tokens, split, {}).status().message().find("consecutive"),
            std::string::npos);
  std::vector<int32_t> far = {3, 3, 3, 3, 3};
  EXPECT_NE(engine->Step(tokens, far, {}).status().message().find("slots[0]"), std::string::npos);
  std::vector<int> bad_layer = {3};
  EXPECT_NE(engine->Hidden(one, slot2, bad_layer).status().message().find("layers[0]"),
            std::string::npos);
  EXPECT_TRUE(engine->CheckPages().ok());
}

}  // namespace
}  // namespace gizllm
