// Drafts: the lookup drafter, the pacer, and the engine's draft rows over the fake runner. With
// drafts a request gives the tokens it gives without them (greedy and seeded sampling, on the
// host and where the runner picks), under preemption, with stops and limits inside kept drafts.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "engine/draft_pacer.h"
#include "engine/engine.h"
#include "engine/lookup_drafter.h"
#include "fake_runner.h"

namespace gizllm {
namespace {

std::vector<int32_t> Lookup(std::vector<int32_t> tokens, int32_t count, LookupParams params = {}) {
  std::vector<int32_t> drafts = {99};  // cleared by the call
  LookupDraft(tokens, count, &drafts, params);
  return drafts;
}

TEST(LookupDraft, LongestMatchMostRecentFirst) {
  // Suffix "3 4": occurs at 2-3 (followed by 9 7) and, longer, "2 3 4" at 1-3 only.
  EXPECT_EQ(Lookup({1, 2, 3, 4, 9, 7, 5, 3, 4, 8, 8, 2, 3, 4}, 3), (std::vector<int32_t>{9, 7, 5}));
  // The most recent of equal matches: "5" is followed by 6 at 1, by 7 at 3.
  EXPECT_EQ(Lookup({5, 6, 0, 5, 7, 5}, 2), (std::vector<int32_t>{7, 5}));
  // Drafts end where the tokens end.
  EXPECT_EQ(Lookup({1, 2, 3, 1, 2}, 5), (std::vector<int32_t>{3, 1, 2}));
  // A run of one token continues it.
  EXPECT_EQ(Lookup({4, 4, 4, 4, 4}, 3), (std::vector<int32_t>{4}));
  // No earlier occurrence, or shorter than min_ngram: none.
  EXPECT_TRUE(Lookup({1, 2, 3, 4}, 3).empty());
  EXPECT_TRUE(Lookup({1, 2, 3, 2}, 3, {.max_ngram = 4, .min_ngram = 2}).empty());
  EXPECT_EQ(Lookup({1, 2, 3, 1, 2}, 2, {.max_ngram = 4, .min_ngram = 2}),
            (std::vector<int32_t>{3, 1}));
  EXPECT_TRUE(Lookup({7}, 3).empty());
  EXPECT_TRUE(Lookup({1, 2, 1}, 0).empty());
}

// A step's row count without drafts is measured before drafts are weighed against it: only
// larger counts measured (drafted steps, prompt steps) would otherwise lend it their time, and
// drafting would look free.
TEST(DraftPacer, MeasuresTheStepWithoutDraftsFirst) {
  DraftPacer pacer(64, 3);
  pacer.RecordStep(16, 10.0);  // a prompt piece
  pacer.RecordStep(64, 11.0);  // a step with drafts
  pacer.RecordJudged(10, 0);
  EXPECT_EQ(pacer.Choose(8, 8, 8), 0);  // 8 rows never measured: this step measures them
  pacer.RecordStep(8, 2.0);
  EXPECT_EQ(pacer.Choose(8, 8, 8), 0);  // 3.6 tokens a sequence at 5.5x the time: no drafts
  pacer.RecordStep(8, 9.0);             // the lowest measurement stands
  EXPECT_EQ(pacer.Choose(8, 8, 8), 0);
  DraftPacer cheap(64, 3);
  cheap.RecordStep(8, 9.0);
  cheap.RecordStep(32, 11.0);
  cheap.RecordJudged(10, 0);
  EXPECT_EQ(cheap.Choose(8, 8, 8), 3);  // drafts nearly free where the 8-row step was measured
}

TEST(DraftPacer, DraftsOnlyWhereTheyPay) {
  // Steps whose time barely grows with rows (memory bound): drafts pay even at modest
  // acceptance.
  DraftPacer flat(64, 3);
  EXPECT_EQ(flat.Choose(1, 1, 1), 0);  // nothing measured: this step measures 1 row
  flat.RecordStep(1, 10.0);
  EXPECT_EQ(flat.Choose(1, 1, 1), 3);  // 4 rows not measured: tried
  flat.RecordStep(4, 10.5);
  flat.RecordJudged(6, 4);
  EXPECT_EQ(flat.Choose(1, 1, 1), 3);
  // Rejected drafts bring the acceptance down, and drafting stops.
  flat.RecordStep(2, 10.4);
  for (int i = 0; i < 200; ++i) flat.RecordJudged(0, 1);
  EXPECT_LT(flat.acceptance(), 0.05);
  EXPECT_EQ(flat.Choose(1, 1, 1), 0);
  // After kProbeAfter steps without drafts (the Choose above was the first) one draft is tried
  // again, then after twice as many, up to kMaxProbeAfter.
  std::vector<int64_t> probes;
  for (int64_t i = 1; i <= 4096; ++i) {
    const bool drafted = flat.Choose(1, 1, 1) > 0;
    EXPECT_EQ(flat.probing(), drafted) << i;
    if (drafted) probes.push_back(i);
  }
  EXPECT_EQ(probes, (std::vector<int64_t>{63, 191, 447, 959, 1983, 3007, 4031}));
  // A probe at 60 candidates in a step of 64 rows at most: a few of them draft (probing), so
  // it fits where the candidates' rows would not.
  DraftPacer many(64, 3);
  many.RecordStep(60, 10.0);
  for (int i = 0; i < 200; ++i) many.RecordJudged(0, 1);
  int64_t probed = 0;
  for (int64_t i = 1; i <= 70; ++i) {
    if (many.Choose(60, 60, 60) > 0) {
      ++probed;
      EXPECT_TRUE(many.probing());
    }
  }
  EXPECT_EQ(probed, 1);
  EXPECT_FALSE(many.probing());

  // A gain within the noise of measured times (here 3% at no cost) is not taken; 10% is.
  DraftPacer margin(16, 1);
  margin.RecordStep(1, 10.0);
  margin.RecordStep(2, 10.0);
  margin.RecordJudged(2, 98);
  // The prior (0.9 of 3) faded once, as the judged drafts before would.
  EXPECT_NEAR(margin.acceptance(), (0.95 * 0.9 + 2.0) / (0.95 * 3.0 + 100.0), 1e-12);
  EXPECT_EQ(margin.Choose(1, 1, 1), 0);
  margin.RecordJudged(10, 0);
  EXPECT_GT(margin.acceptance(), 0.1);
  EXPECT_EQ(margin.Choose(1, 1, 1), 1);

  // The prior fades with the drafts judged: drafts kept 90% of the time are estimated at 90%
  // after a while (a prior that stayed, worth three judged drafts, would hold the estimate at
  // 0.87 and, at a few judged a step, near 0.75, where three drafts do not pay).
  DraftPacer kept(16, 3);
  for (int i = 0; i < 300; ++i) kept.RecordJudged(9, 1);
  EXPECT_NEAR(kept.acceptance(), 0.9, 1e-3);

  // Drafts made by a run of their own (MTP): before the run is measured it counts as a plain
  // step of the rows without drafts, so steps that cost the same at 1 and 4 rows and drafts at
  // 0.5 acceptance (1.875 tokens a step against twice the time) do not draft; measured cheaper,
  // they do.
  DraftPacer runs(64, 3);
  runs.SetDraftRuns(true);
  runs.RecordStep(1, 10.0);
  runs.RecordStep(4, 10.0);
  for (int i = 0; i < 20; ++i) runs.RecordJudged(5, 5);
  EXPECT_NEAR(runs.DraftRunMs(1, 1), 10.0, 0.05);
  EXPECT_EQ(runs.Choose(1, 1, 1), 0);
  runs.RecordDraftRun(1, 2.0);
  EXPECT_NEAR(runs.DraftRunMs(1, 1), 2.0, 0.01);
  // Above the largest measured count: its time, at least a plain step of the rows.
  EXPECT_NEAR(runs.DraftRunMs(3, 1), 10.0, 0.05);
  runs.RecordDraftRun(4, 3.0);
  EXPECT_NEAR(runs.DraftRunMs(3, 1), 2.0 + 2.0 / 3.0, 0.01);  // between measured counts
  EXPECT_EQ(runs.Choose(1, 1, 1), 3);
  // Without runs (lookup) the same pacer drafts at once.
  DraftPacer free_drafts(64, 3);
  free_drafts.RecordStep(1, 10.0);
  free_drafts.RecordStep(4, 10.0);
  for (int i = 0; i < 20; ++i) free_drafts.RecordJudged(5, 5);
  EXPECT_EQ(free_drafts.DraftRunMs(1, 1), 0.0);
  EXPECT_EQ(free_drafts.Choose(1, 1, 1), 3);

  // Steps whose time grows with rows (compute bound): even well-accepted drafts cost more than
  // they give, and could not pay were every draft kept.
  DraftPacer linear(64, 3);
  for (int64_t r = 1; r <= 64; ++r) linear.RecordStep(r, 1.0 * r);
  linear.RecordJudged(70, 30);
  EXPECT_EQ(linear.Choose(32, 32, 32), 0);
  EXPECT_FALSE(linear.CouldPay(16, 0));
  EXPECT_TRUE(flat.CouldPay(1, 0));
  DraftPacer unmeasured(64, 3);
  unmeasured.RecordStep(16, 16.0);
  EXPECT_TRUE(unmeasured.CouldPay(16, 0));  // 64 rows not measured: they could
  unmeasured.RecordStep(64, 64.0);
  EXPECT_FALSE(unmeasured.CouldPay(16, 0));
  EXPECT_FALSE(unmeasured.CouldPay(40, 0));  // no room for a draft each
  EXPECT_NEAR(DraftPacer::ExpectedGain(0.5, 3), 0.875, 1e-12);
  EXPECT_NEAR(linear.StepMs(10), 10.0 * std::pow(1.001, 54), 1e-9);  // measured 54 steps ago
  DraftPacer sparse(16, 3);
  sparse.RecordStep(2, 2.0);
  sparse.RecordStep(6, 4.0);
  EXPECT_NEAR(sparse.StepMs(4), 3.0, 0.01);
  EXPECT_NEAR(sparse.StepMs(1), 2.0, 0.01);
  EXPECT_NEAR(sparse.StepMs(10), 6.0, 0.01);  // the slope of 2 and 6 rows, 0.5 ms a row
  // A row count's time is its lowest measurement, and every count's time grows 0.1% a step
  // until a lower one is measured: a count measured long ago looks dearer.
  DraftPacer envelope(16, 3);
  envelope.RecordStep(2, 10.0);
  envelope.RecordStep(2, 30.0);
  EXPECT_NEAR(envelope.StepMs(2), 10.0 * 1.001, 1e-9);
  envelope.RecordStep(2, 8.0);
  EXPECT_NEAR(envelope.StepMs(2), 8.0, 1e-9);
  envelope.RecordStep(4, 9.0);
  for (int i = 0; i < 999; ++i) envelope.RecordStep(2, 8.5);
  EXPECT_NEAR(envelope.StepMs(2), 8.5, 1e-9);
  EXPECT_NEAR(envelope.StepMs(4), 9.0 * std::pow(1.001, 999), 1e-6);
  DraftPacer one(16, 3);
  one.RecordStep(3, 5.0);
  EXPECT_NEAR(one.StepMs(9), 5.0, 0.01);  // one count measured: its time
  one.RecordStep(5, 4.0);
  EXPECT_NEAR(one.StepMs(9), 4.0, 0.01);  // never below flat
}

// A model with an MTP layer, paced, weighs lookup beside it, each drafter with its own
// acceptance: kept alike, lookup's drafts need no run and are chosen; refused, the MTP layer's
// are; both refused, none, and the probes take turns between the two.
TEST(DraftPacer, WeighsLookupBesideTheRunDrafter) {
  DraftPacer both(64, 3);
  both.SetDraftRuns(true);
  both.AddLookup();
  both.RecordStep(1, 10.0);
  both.RecordStep(2, 10.4);
  both.RecordStep(4, 10.5);
  both.RecordDraftRun(1, 5.0);
  for (int i = 0; i < 20; ++i) {
    both.RecordJudged(8, 2, 0);
    both.RecordJudged(8, 2, DraftPacer::kLookup);
  }
  EXPECT_EQ(both.Choose(1, 1, 1), 3);
  EXPECT_EQ(both.drafter(), DraftPacer::kLookup);
  for (int i = 0; i < 200; ++i) both.RecordJudged(0, 1, DraftPacer::kLookup);
  EXPECT_LT(both.acceptance(DraftPacer::kLookup), 0.1);
  EXPECT_GT(both.acceptance(0), 0.7);
  EXPECT_EQ(both.Choose(1, 1, 1), 3);  // 3 tokens at 15.5 ms against 1 at 10
  EXPECT_EQ(both.drafter(), 0);
  for (int i = 0; i < 200; ++i) both.RecordJudged(0, 1, 0);
  EXPECT_EQ(both.Choose(1, 1, 1), 0);
  std::vector<int32_t> probed;
  for (int i = 0; i < 1000; ++i) {
    if (both.Choose(1, 1, 1) > 0) probed.push_back(both.drafter());
  }
  EXPECT_EQ(probed, (std::vector<int32_t>{0, 1, 0, 1}));
  // Lookup judged without drafts (the engine's proposed, unread lookup drafts): probes only try
  // the other drafter, and a pacer whose one drafter is so judged never probes.
  both.JudgedWithoutDrafts(DraftPacer::kLookup);
  probed.clear();
  for (int i = 0; i < 3000; ++i) {
    if (both.Choose(1, 1, 1) > 0) probed.push_back(both.drafter());
  }
  EXPECT_EQ(probed, (std::vector<int32_t>{0, 0}));  // every 1,024 steps by now
  DraftPacer judged(64, 3);
  judged.JudgedWithoutDrafts(0);
  judged.RecordStep(1, 10.0);
  judged.RecordStep(2, 10.4);
  judged.RecordStep(4, 10.5);
  for (int i = 0; i < 200; ++i) judged.RecordJudged(0, 1);
  for (int i = 0; i < 3000; ++i) EXPECT_EQ(judged.Choose(1, 1, 1), 0);
  EXPECT_FALSE(judged.probing());
  // One drafter: lookup's judgements are not its own, and it is always drafter 0.
  DraftPacer one(64, 3);
  one.RecordStep(1, 10.0);
  one.RecordStep(4, 10.0);
  for (int i = 0; i < 200; ++i) one.RecordJudged(0, 1, DraftPacer::kLookup);
  EXPECT_NEAR(one.acceptance(), 0.3, 1e-12);
  EXPECT_EQ(one.Choose(1, 1, 1), 3);
  EXPECT_EQ(one.drafter(), 0);
}

struct Outcome {
  std::vector<std::vector<int32_t>> tokens;  // per request
  std::vector<std::string> ends;
  EngineStats stats;
};

// Runs `requests` arriving over the first steps on a fresh engine, checking the pages each step.
Outcome Generate(FakeRunner& runner, const std::vector<Request>& requests, DraftMode draft,
                 int32_t slots, int32_t pages, int32_t drafts = 3, int64_t rows = 40) {
  EngineOptions options;
  options.slots = slots;
  options.context = 160;
  options.rows = rows;
  options.kv_budget_bytes = pages * runner.PageBytes();
  options.draft = draft;
  options.drafts = drafts;
  auto engine = Engine::Create(&runner, options);
  EXPECT_TRUE(engine.ok()) << engine.status().message();
  Outcome run;
  if (!engine.ok()) return run;
  run.tokens.resize(requests.size());
  run.ends.resize(requests.size());
  std::map<int64_t, size_t> index;
  size_t added = 0;
  for (int step = 0; added < requests.size() || (*engine)->Busy(); ++step) {
    // Two requests arrive each step.
    for (int i = 0; i < 2 && added < requests.size(); ++i, ++added) {
      auto id = (*engine)->Add(requests[added]);
      EXPECT_TRUE(id.ok()) << id.status().message();
      index[*id] = added;
    }
    auto progress = (*engine)->Advance();
    EXPECT_TRUE(progress.ok()) << progress.status().message();
    if (!progress.ok()) return run;
    for (const Progress& p : *progress) {
      const size_t i = index.at(p.id);
      run.tokens[i].insert(run.tokens[i].end(), p.tokens.begin(), p.tokens.end());
      if (!p.end.empty()) run.ends[i] = p.end;
    }
    const Status check = (*engine)->CheckPages();
    EXPECT_TRUE(check.ok()) << check.message();
    if (!check.ok() || step > 5000) return run;
  }
  run.stats = (*engine)->stats();
  return run;
}

// Prompts that repeat a random piece of `period` tokens (no eos): the copying fake continues
// them, so lookup drafts are kept; every fourth prompt is random, where drafts mostly fail.
std::vector<Request> RepeatingRequests(std::mt19937& rng, int n, int32_t period, bool sampled) {
  std::uniform_int_distribution<int32_t> pick(2, 63);
  std::vector<Request> requests;
  for (int i = 0; i < n; ++i) {
    Request r;
    std::vector<int32_t> piece(period);
    for (int32_t& t : piece) t = pick(rng);
    const int length = 4 + static_cast<int>(rng() % 50);
    for (int p = 0; p < length; ++p) {
      r.prompt.push_back(i % 4 == 3 ? pick(rng) : piece[p % period]);
    }
    r.limit = 1 + static_cast<int64_t>(rng() % 70);
    r.sampling.temperature = 0.0f;
    if (sampled && i % 2 == 0) {
      r.sampling.temperature = 0.5f + 0.1f * (i % 6);
      r.sampling.top_k = i % 3 == 0 ? 0 : 10;
      r.sampling.top_p = i % 4 == 0 ? 0.9f : 1.0f;
      r.sampling.seed = rng();
    }
    if (i % 7 == 5) r.sampling.logprobs = 2;
    requests.push_back(r);
  }
  return requests;
}

TEST(EngineDraft, SameTokensWithAndWithoutDrafts) {
  for (bool sampled : {false, true}) {
    for (bool picks : {false, true}) {
      SCOPED_TRACE(std::string(sampled ? "sampled" : "greedy") + (picks ? " runner picks" : ""));
      std::mt19937 rng(sampled ? 31 : 30);
      const std::vector<Request> requests = RepeatingRequests(rng, 24, 7, sampled);
      FakeRunner plain_runner, lookup_runner, auto_runner;
      for (FakeRunner* r : {&plain_runner, &lookup_runner, &auto_runner}) {
        r->copy_period = 7;
        r->picks_tokens = picks;
      }
      // 6 slots and 14 pages of 16 positions: preemption, with and without drafts.
      const Outcome plain = Generate(plain_runner, requests, DraftMode::kNone, 6, 14);
      const Outcome lookup = Generate(lookup_runner, requests, DraftMode::kLookup, 6, 14);
      const Outcome paced = Generate(auto_runner, requests, DraftMode::kAuto, 6, 14);
      for (size_t i = 0; i < requests.size(); ++i) {
        EXPECT_EQ(lookup.tokens[i], plain.tokens[i]) << "request " << i;
        EXPECT_EQ(lookup.ends[i], plain.ends[i]) << "request " << i;
        EXPECT_EQ(paced.tokens[i], plain.tokens[i]) << "request " << i;
        EXPECT_EQ(paced.ends[i], plain.ends[i]) << "request " << i;
      }
      EXPECT_EQ(plain.stats.lookup.drafted, 0);
      EXPECT_GT(paced.stats.lookup.drafted, 0);
      EXPECT_GT(lookup.stats.lookup.accepted, 100);
      EXPECT_LT(lookup.stats.lookup.accepted, lookup.stats.lookup.drafted);
      EXPECT_LT(lookup.stats.steps, plain.stats.steps);
      EXPECT_GT(lookup.stats.preemptions, 0);
      EXPECT_GT(plain.stats.preemptions, 0);
    }
  }
}

// Under window paging (window layers of 12 positions, two groups): refused drafts drop their
// rows' window pages and the tokens are those without drafts.
TEST(EngineDraft, SameTokensWithDraftsUnderWindowPaging) {
  std::mt19937 rng(33);
  const std::vector<Request> requests = RepeatingRequests(rng, 24, 7, /*sampled=*/true);
  FakeRunner plain_runner, lookup_runner;
  for (FakeRunner* r : {&plain_runner, &lookup_runner}) {
    r->copy_period = 7;
    r->SetWindow(12, 2);
  }
  // 6 slots and 42 pages of 16 positions (a block takes 3 while the window layers read it).
  const Outcome plain = Generate(plain_runner, requests, DraftMode::kNone, 6, 42);
  const Outcome lookup = Generate(lookup_runner, requests, DraftMode::kLookup, 6, 42);
  ASSERT_TRUE(lookup_runner.window_paging());
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(lookup.tokens[i], plain.tokens[i]) << "request " << i;
    EXPECT_EQ(lookup.ends[i], plain.ends[i]) << "request " << i;
  }
  EXPECT_GT(lookup.stats.lookup.accepted, 100);
  EXPECT_LT(lookup.stats.lookup.accepted, lookup.stats.lookup.drafted);
  EXPECT_GT(lookup.stats.preemptions, 0);
}

// A stop token or the limit reached inside kept drafts ends the request there.
TEST(EngineDraft, StopAndLimitInsideKeptDrafts) {
  // The prompt repeats 5 9 20 12 13 and the fake copies with period 5 (a boost no other logit
  // reaches), so the answer continues the cycle: the prompt's step picks 9, then lookup drafts
  // 20 12 13; 20 is kept and the row after it picks 12, the stop token.
  FakeRunner runner;
  runner.copy_period = 5;
  runner.copy_boost = 100.0f;
  Request r;
  r.prompt = {5, 9, 20, 12, 13, 5, 9, 20, 12, 13, 5, 9, 20, 12, 13, 5};
  r.limit = 50;
  r.sampling.temperature = 0.0f;
  r.stop = std::vector<int32_t>{12};
  const Outcome plain = Generate(runner, {r}, DraftMode::kNone, 1, 12);
  FakeRunner lookup_runner;
  lookup_runner.copy_period = 5;
  lookup_runner.copy_boost = 100.0f;
  const Outcome lookup = Generate(lookup_runner, {r}, DraftMode::kLookup, 1, 12);
  EXPECT_EQ(plain.tokens[0], (std::vector<int32_t>{9, 20}));
  EXPECT_EQ(lookup.tokens[0], plain.tokens[0]);
  EXPECT_EQ(lookup.ends[0], "stop");
  EXPECT_EQ(lookup.stats.lookup.drafted, 3);
  EXPECT_EQ(lookup.stats.lookup.accepted, 1);
  EXPECT_EQ(lookup.stats.steps, 2);  // the prompt, then one step of drafts
  // The limit: 3 tokens, the second a kept draft, the third the pick after it.
  r.stop = std::vector<int32_t>{};
  r.limit = 3;
  FakeRunner limit_runner;
  limit_runner.copy_period = 5;
  limit_runner.copy_boost = 100.0f;
  const Outcome limited = Generate(limit_runner, {r}, DraftMode::kLookup, 1, 12);
  EXPECT_EQ(limited.tokens[0], (std::vector<int32_t>{9, 20, 12}));
  EXPECT_EQ(limited.ends[0], "length");
  EXPECT_EQ(limited.stats.lookup.drafted, 1);  // no draft past the limit
  EXPECT_EQ(limited.stats.lookup.accepted, 1);
  EXPECT_EQ(limited.stats.steps, 2);
}

// Requests with penalties or a grammar make no drafts; the others of the same steps do.
TEST(EngineDraft, PenaltiesMakeNoDrafts) {
  std::mt19937 rng(33);
  std::vector<Request> requests = RepeatingRequests(rng, 2, 4, false);
  for (Request& r : requests) r.limit = 30, r.sampling.logprobs = -1;
  requests[0].sampling.frequency = 0.5f;
  FakeRunner plain_runner, lookup_runner;
  plain_runner.copy_period = lookup_runner.copy_period = 4;
  const Outcome plain = Generate(plain_runner, {requests[0]}, DraftMode::kNone, 2, 20);
  const Outcome penalized = Generate(lookup_runner, {requests[0]}, DraftMode::kLookup, 2, 20);
  EXPECT_EQ(penalized.tokens[0], plain.tokens[0]);
  EXPECT_EQ(penalized.stats.lookup.drafted, 0);
  FakeRunner both_runner;
  both_runner.copy_period = 4;
  const Outcome both = Generate(both_runner, requests, DraftMode::kLookup, 2, 20);
  EXPECT_EQ(both.tokens[0], plain.tokens[0]);
  EXPECT_GT(both.stats.lookup.drafted, 0);
}

// The low-level Step and Accept: rows past the kept ones leave the slot, and the next step
// reads as if they had never been there.
TEST(EngineDraft, AcceptDropsTheRejectedRows) {
  FakeRunner runner;
  EngineOptions options;
  options.slots = 2;
  options.context = 64;
  options.rows = 24;
  options.kv_budget_bytes = 10 * runner.PageBytes();
  auto created = Engine::Create(&runner, options);
  ASSERT_TRUE(created.ok());
  std::unique_ptr<Engine> engine = std::move(*created);
  std::vector<int32_t> prompt(14);
  for (int i = 0; i < 14; ++i) prompt[i] = 2 + i;
  ASSERT_TRUE(engine->Step(prompt, std::vector<int32_t>(14, 0), {}).ok());
  // Four rows crossing a page's end; keep two.
  std::vector<int32_t> rows = {40, 41, 42, 43};
  ASSERT_TRUE(engine->Step(rows, std::vector<int32_t>(4, 0), {}).ok());
  EXPECT_EQ(engine->held(0).size(), 18u);
  const int32_t free_before = engine->free_pages();
  ASSERT_TRUE(engine->Accept(0, 2).ok());
  EXPECT_EQ(engine->held(0).size(), 16u);
  EXPECT_EQ(engine->free_pages(), free_before + 1);  // the page of positions 16-17 went back
  EXPECT_FALSE(engine->Accept(0, 3).ok());           // only the two kept remain
  EXPECT_FALSE(engine->Accept(1, 1).ok());           // slot 1 got no rows
  std::vector<int32_t> next = {50};
  std::vector<int32_t> wanted = {0};
  auto logits = engine->Step(next, std::vector<int32_t>{0}, wanted);
  ASSERT_TRUE(logits.ok());
  std::vector<int32_t> history = prompt;
  history.insert(history.end(), {40, 41, 50});
  uint64_t h = 0x5157;
  for (size_t p = 0; p < history.size(); ++p) h = FakeRunner::Chain(h, history[p], p);
  for (int v = 0; v < 64; ++v) EXPECT_EQ((*logits)[v], FakeRunner::Logit(h, v));
  EXPECT_TRUE(engine->CheckPages().ok());
}

TEST(EngineDraft, OptionsAreChecked) {
  FakeRunner runner;
  EngineOptions options;
  options.drafts = EngineOptions::kMaxDrafts + 1;
  EXPECT_NE(Engine::Create(&runner, options).status().message().find("drafts"), std::string::npos);
}

}  // namespace
}  // namespace gizllm
