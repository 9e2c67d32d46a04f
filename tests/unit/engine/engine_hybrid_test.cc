// The engine on a tiny random Qwen3.5-MoE hybrid (recurrent layers with per-slot states beside
// attention layers, CPU backend, float32 activations): a prompt read at every split equals one
// piece; concurrent greedy requests under preemption equal each alone; a chat's second turn
// reads only its new tokens from the slot's state and equals reading it whole; a slot's tokens
// taken by another request are not kept as a prefix (pages without a state cannot resume) and
// the next turn reads everything again; the states come out of the memory budget; drafts
// dropped by Accept leave the states of the last kept row, and lookup drafts give the same
// tokens.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <random>

#include "../model/tiny_hybrid.h"
#include "engine/engine.h"
#include "model/model.h"
#include "ops/device.h"

namespace gizllm {
namespace {

namespace fs = std::filesystem;
using tiny_hybrid::Builder;

// The model, written once to a temporary folder and loaded on the CPU backend.
Model* HybridModel() {
  static std::unique_ptr<Model> model = [] {
    const fs::path dir =
        fs::temp_directory_path() / ("gizllm_engine_hybrid_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    Builder builder(5);
    const std::string written =
        Builder::Write(dir, Builder::TextConfig("qwen3_5_moe_text", /*moe=*/true),
                       builder.Qwen3_5("model.", /*moe=*/true));
    EXPECT_FALSE(written.empty());
    DeviceOptions device;
    device.exact = true;  // float32 activations (the reference mode)
    device.device = "cpu";
    device.threads = 2;
    auto backend = OpenBackend(device);
    EXPECT_TRUE(backend.ok()) << backend.status().message();
    auto m = Model::Load(written, *backend);
    EXPECT_TRUE(m.ok()) << m.status().message();
    fs::remove_all(dir);  // the weights stay mapped
    return m.ok() ? std::move(*m) : std::unique_ptr<Model>();
  }();
  return model.get();
}

int64_t StateBytes(const Model& model) {
  int64_t bytes = 0;
  for (const CacheSpec& c : model.caches()) bytes += c.SlotStateBytes();
  return bytes;
}

std::unique_ptr<Engine> MakeEngine(Model* model, int32_t slots, int64_t context, int64_t rows,
                                   int32_t pages) {
  EngineOptions options;
  options.slots = slots;
  options.context = context;
  options.rows = rows;
  options.kv_budget_bytes = pages * model->PageBytes() + 2 * slots * StateBytes(*model);
  options.host_prefix_bytes = options.kv_budget_bytes;
  auto engine = Engine::Create(model, options);
  EXPECT_TRUE(engine.ok()) << engine.status().message();
  return engine.ok() ? std::move(*engine) : nullptr;
}

std::vector<int32_t> RandomPrompt(std::mt19937& rng, int n) {
  std::uniform_int_distribution<int32_t> pick(0, tiny_hybrid::kVocab - 1);
  std::vector<int32_t> prompt(n);
  for (int32_t& t : prompt) t = pick(rng);
  return prompt;
}

// max |ours - ref| <= 1e-5 * max |ref|.
void ExpectClose(std::span<const float> ours, std::span<const float> ref, const std::string& what) {
  ASSERT_EQ(ours.size(), ref.size());
  float max_ref = 0, max_diff = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(ref[i]));
    const float d = std::fabs(ours[i] - ref[i]);
    if (!(d <= max_diff)) max_diff = std::isnan(d) ? INFINITY : d;
  }
  EXPECT_GT(max_ref, 0.0f) << what;
  EXPECT_LE(max_diff, 1e-5f * max_ref) << what << ": max diff " << max_diff;
}

// A 90-token prompt (longer than the delta rule's chunk of 64) read in two pieces split at every
// position, and in pieces of 7, against one piece: the last row's logits and a decode after it.
TEST(EngineHybrid, ChunkedPrefillAtEverySplitEqualsOnePiece) {
  Model* model = HybridModel();
  ASSERT_NE(model, nullptr);
  std::mt19937 rng(31);
  const std::vector<int32_t> prompt = RandomPrompt(rng, 90);
  const int32_t next = 11;
  const int n = static_cast<int>(prompt.size());
  auto engine = MakeEngine(model, 2, 128, 128, 16);
  ASSERT_NE(engine, nullptr);
  auto whole = engine->Step(prompt, std::vector<int32_t>(n, 0), std::vector<int32_t>{n - 1});
  ASSERT_TRUE(whole.ok()) << whole.status().message();
  auto whole_next =
      engine->Step(std::vector<int32_t>{next}, std::vector<int32_t>{0}, std::vector<int32_t>{0});
  ASSERT_TRUE(whole_next.ok());
  std::vector<std::vector<int>> splits;
  for (int s = 1; s < n; ++s) splits.push_back({s, n - s});
  splits.push_back(std::vector<int>(n / 7, 7));
  splits.back().push_back(n % 7);
  for (const std::vector<int>& pieces : splits) {
    ASSERT_TRUE(engine->Reset(1).ok());
    int at = 0;
    std::vector<float> last;
    for (int size : pieces) {
      std::vector<int32_t> piece(prompt.begin() + at, prompt.begin() + at + size);
      auto out = engine->Step(piece, std::vector<int32_t>(size, 1), std::vector<int32_t>{size - 1});
      ASSERT_TRUE(out.ok()) << out.status().message();
      last = *out;
      at += size;
    }
    const std::string what = "pieces of " + std::to_string(pieces[0]) + " first";
    ExpectClose(last, *whole, what);
    auto decoded =
        engine->Step(std::vector<int32_t>{next}, std::vector<int32_t>{1}, std::vector<int32_t>{0});
    ASSERT_TRUE(decoded.ok());
    ExpectClose(*decoded, *whole_next, what + ", then a decode");
  }
}

// Greedy requests arriving over several steps, 6 slots of up to 96 positions sharing 12 pages
// (preemption), and 32 at once in 32 slots, against each request alone.
void CheckConcurrentGreedy(int32_t slots, int32_t pages, int n, bool expect_preemption) {
  Model* model = HybridModel();
  ASSERT_NE(model, nullptr);
  std::mt19937 rng(22 + n);
  std::vector<Request> requests;
  std::vector<int> arrival;
  for (int i = 0; i < n; ++i) {
    Request r;
    r.prompt = RandomPrompt(rng, 16 + rng() % 50);
    r.limit = 8 + rng() % 16;
    r.sampling.temperature = 0.0f;
    r.stop = std::vector<int32_t>{};
    requests.push_back(r);
    arrival.push_back(expect_preemption ? rng() % 8 : 0);
  }
  auto engine = MakeEngine(model, slots, 96, std::max<int64_t>(slots, 32), pages);
  ASSERT_NE(engine, nullptr);
  std::map<int64_t, int> index;
  std::map<int64_t, std::vector<int32_t>> got;
  for (int step = 0; step < 8 || engine->Busy(); ++step) {
    for (int i = 0; i < n; ++i) {
      if (arrival[i] != step) continue;
      auto id = engine->Add(requests[i]);
      ASSERT_TRUE(id.ok());
      index[*id] = i;
    }
    auto progress = engine->Advance();
    ASSERT_TRUE(progress.ok()) << progress.status().message();
    for (const Progress& p : *progress) {
      got[p.id].insert(got[p.id].end(), p.tokens.begin(), p.tokens.end());
    }
    ASSERT_TRUE(engine->CheckPages().ok());
  }
  if (expect_preemption) EXPECT_GT(engine->stats().preemptions, 0);
  EXPECT_EQ(engine->stats().host_copies, 0);
  auto single = MakeEngine(model, 1, 96, 96, 6);
  for (auto& [id, i] : index) {
    auto out = single->Generate({requests[i]});
    ASSERT_TRUE(out.ok());
    EXPECT_EQ(got[id], (*out)[0]) << "request " << i;
  }
}

TEST(EngineHybrid, ConcurrentGreedyEqualsAloneUnderPreemption) {
  CheckConcurrentGreedy(/*slots=*/6, /*pages=*/12, /*n=*/10, /*expect_preemption=*/true);
}

TEST(EngineHybrid, ThirtyTwoConcurrentEqualAlone) {
  CheckConcurrentGreedy(/*slots=*/32, /*pages=*/32 * 6, /*n=*/32, /*expect_preemption=*/false);
}

// A chat's second turn (the first turn's prompt, its answer and new tokens): the slot's state
// stands for every token it holds, so the turn reads only its new tokens, and gives what a cold
// engine gives reading it whole.
TEST(EngineHybrid, SecondTurnReadsOnlyNewTokensFromTheSlotState) {
  Model* model = HybridModel();
  ASSERT_NE(model, nullptr);
  std::mt19937 rng(23);
  Request first;
  first.prompt = RandomPrompt(rng, 40);
  first.limit = 10;
  first.sampling.temperature = 0.0f;
  first.stop = std::vector<int32_t>{};
  auto engine = MakeEngine(model, 2, 128, 64, 16);
  auto a = engine->Generate({first});
  ASSERT_TRUE(a.ok());
  ASSERT_EQ((*a)[0].size(), 10u);
  Request next = first;
  next.prompt.insert(next.prompt.end(), (*a)[0].begin(), (*a)[0].end());
  const auto more = RandomPrompt(rng, 6);
  next.prompt.insert(next.prompt.end(), more.begin(), more.end());
  next.limit = 12;
  const int64_t rows_before = engine->stats().rows;
  auto warm = engine->Generate({next});
  ASSERT_TRUE(warm.ok());
  const int64_t warm_rows = engine->stats().rows - rows_before;
  auto cold_engine = MakeEngine(model, 1, 128, 64, 16);
  auto cold = cold_engine->Generate({next});
  ASSERT_TRUE(cold.ok());
  EXPECT_EQ((*warm)[0], (*cold)[0]);
  EXPECT_EQ(engine->stats().cached_tokens, 40 + 10 - 1);
  EXPECT_EQ(warm_rows, cold_engine->stats().rows - (40 + 10 - 1));
}

// A prompt that shares only a part of what a slot holds cannot start from the slot (its state is
// at the slot's end), nor from the stored prefix a taken slot leaves (its states are at its end
// too): both read everything, and give the cold tokens.
TEST(EngineHybrid, PartialMatchesAndTakenSlotsReadEverything) {
  Model* model = HybridModel();
  ASSERT_NE(model, nullptr);
  std::mt19937 rng(24);
  Request first;
  first.prompt = RandomPrompt(rng, 40);
  first.limit = 6;
  first.sampling.temperature = 0.0f;
  first.stop = std::vector<int32_t>{};
  auto engine = MakeEngine(model, 1, 128, 64, 16);
  ASSERT_TRUE(engine->Generate({first}).ok());
  // The first 30 tokens of the first prompt, then others.
  Request partial = first;
  partial.prompt.resize(30);
  const auto more = RandomPrompt(rng, 8);
  partial.prompt.insert(partial.prompt.end(), more.begin(), more.end());
  auto got = engine->Generate({partial});
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(engine->stats().cached_tokens, 0);
  auto cold_engine = MakeEngine(model, 1, 128, 64, 16);
  auto cold = cold_engine->Generate({partial});
  ASSERT_TRUE(cold.ok());
  EXPECT_EQ((*got)[0], (*cold)[0]);
  // The first request again: its tokens were in the slot the partial request took.
  auto again = engine->Generate({first});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(engine->stats().cached_tokens, 0);
  EXPECT_EQ(engine->stats().host_copies, 0);
  ASSERT_TRUE(engine->CheckPages().ok());
}

// A slot taken by another request keeps what it held as a stored prefix, with its states on the
// host: those after its last token, and those it saved at a chat's mark. A chat's next turn then
// starts from the prefix (its whole length, or the mark where the turn shares only the first
// turn's messages), reads only what follows, and gives what a cold engine gives.
TEST(EngineHybrid, TakenSlotKeepsItsStatesWithItsStoredPrefix) {
  Model* model = HybridModel();
  ASSERT_NE(model, nullptr);
  std::mt19937 rng(26);
  Request first;
  first.prompt = RandomPrompt(rng, 40);
  first.limit = 10;
  first.sampling.temperature = 0.0f;
  first.stop = std::vector<int32_t>{};
  Request other = first;
  other.prompt = RandomPrompt(rng, 20);
  other.limit = 4;
  const int32_t mark = 33;
  for (bool marked : {false, true}) {
    SCOPED_TRACE(marked ? "from the mark" : "whole");
    // One slot: `other` takes the first request's. Rows of 16: a piece ends at the mark.
    auto engine = MakeEngine(model, 1, 128, 16, 16);
    std::vector<int32_t> answer;
    if (marked) {
      ASSERT_TRUE(engine->Add(first, mark).ok());
      while (engine->Busy()) ASSERT_TRUE(engine->Advance().ok());
    } else {
      auto a = engine->Generate({first});
      ASSERT_TRUE(a.ok());
      answer = (*a)[0];
      ASSERT_EQ(answer.size(), 10u);
    }
    ASSERT_TRUE(engine->Generate({other}).ok());
    Request next = first;
    if (marked) next.prompt.resize(mark);
    next.prompt.insert(next.prompt.end(), answer.begin(), answer.end());
    const auto more = RandomPrompt(rng, 6);
    next.prompt.insert(next.prompt.end(), more.begin(), more.end());
    next.limit = 8;
    const int64_t cached_before = engine->stats().cached_tokens;
    const int64_t rows_before = engine->stats().rows;
    auto warm = engine->Generate({next});
    ASSERT_TRUE(warm.ok());
    auto cold_engine = MakeEngine(model, 1, 128, 16, 16);
    auto cold = cold_engine->Generate({next});
    ASSERT_TRUE(cold.ok());
    EXPECT_EQ((*warm)[0], (*cold)[0]);
    const int64_t reused = marked ? mark : 40 + 10 - 1;
    EXPECT_EQ(engine->stats().cached_tokens - cached_before, reused);
    EXPECT_EQ(engine->stats().rows - rows_before, cold_engine->stats().rows - reused);
    ASSERT_TRUE(engine->CheckPages().ok());
  }
  // Without room on the host for the states, no prefix is kept: the turn reads everything.
  EngineOptions options;
  options.slots = 1;
  options.context = 128;
  options.rows = 16;
  options.kv_budget_bytes = 16 * model->PageBytes() + 2 * StateBytes(*model);
  options.prefix_state_bytes = StateBytes(*model) - 1;
  auto small = Engine::Create(model, options);
  ASSERT_TRUE(small.ok()) << small.status().message();
  auto a = (*small)->Generate({first});
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE((*small)->Generate({other}).ok());
  Request next = first;
  next.prompt.insert(next.prompt.end(), (*a)[0].begin(), (*a)[0].end());
  next.prompt.push_back(1);
  const int64_t cached_before = (*small)->stats().cached_tokens;
  ASSERT_TRUE((*small)->Generate({next}).ok());
  EXPECT_EQ((*small)->stats().cached_tokens, cached_before);
  ASSERT_TRUE((*small)->CheckPages().ok());
}

// Runs `request` (with its shared start) alone to its end: its tokens, and the prompt tokens it
// found cached.
std::pair<std::vector<int32_t>, int64_t> RunShared(Engine& engine, const Request& request,
                                                   int32_t shared) {
  std::vector<int32_t> tokens;
  int64_t cached = -1;
  auto id = engine.Add(request, -1, shared);
  EXPECT_TRUE(id.ok());
  while (engine.Busy()) {
    auto progress = engine.Advance();
    EXPECT_TRUE(progress.ok());
    if (!progress.ok()) break;
    for (const Progress& p : *progress) {
      if (p.id != *id) continue;
      tokens.insert(tokens.end(), p.tokens.begin(), p.tokens.end());
      if (cached < 0 && !p.tokens.empty()) cached = p.cached;
    }
  }
  return {tokens, cached};
}

// A shared start (a system prompt many requests share) on a model with slot states: the first
// request's piece ends at the start's end, where its states are copied out with the start; a
// later request with the same start in another slot reads the start's pages in place and its
// states, then only its own tokens, and gives what a cold engine gives.
TEST(EngineHybrid, SharedStartKeepsItsStates) {
  Model* model = HybridModel();
  ASSERT_NE(model, nullptr);
  std::mt19937 rng(27);
  const std::vector<int32_t> system = RandomPrompt(rng, 2 * kPage);
  auto with_system = [&](int n) {
    Request r;
    r.prompt = system;
    const auto own = RandomPrompt(rng, n);
    r.prompt.insert(r.prompt.end(), own.begin(), own.end());
    r.limit = 6;
    r.sampling.temperature = 0.0f;
    r.stop = std::vector<int32_t>{};
    return r;
  };
  const Request a = with_system(10), b = with_system(12);
  const int32_t shared = static_cast<int32_t>(system.size());
  auto engine = MakeEngine(model, 2, 128, 64, 24);
  auto [a_tokens, a_cached] = RunShared(*engine, a, shared);
  EXPECT_EQ(a_cached, 0);
  auto [b_tokens, b_cached] = RunShared(*engine, b, shared);
  EXPECT_EQ(b_cached, shared);
  ASSERT_TRUE(engine->CheckPages().ok());
  for (const Request* r : {&a, &b}) {
    auto cold_engine = MakeEngine(model, 1, 128, 64, 24);
    auto cold = cold_engine->Generate({*r});
    ASSERT_TRUE(cold.ok());
    EXPECT_EQ(r == &a ? a_tokens : b_tokens, (*cold)[0]);
  }
}

// A chat's next turn whose rendering of the earlier answer differs from the tokens the slot
// read: it shares the first turn's messages (up to `mark`) and nothing after. The slot saved its
// states at the mark (the first prompt's pieces end there), so the turn starts from the snapshot
// and reads only what follows the mark, and gives what a cold engine gives; twice, from the same
// snapshot. Without a mark it reads everything.
TEST(EngineHybrid, NextTurnStartsFromTheStatesSavedAtTheMark) {
  Model* model = HybridModel();
  ASSERT_NE(model, nullptr);
  std::mt19937 rng(25);
  Request first;
  first.prompt = RandomPrompt(rng, 45);
  first.limit = 6;
  first.sampling.temperature = 0.0f;
  first.stop = std::vector<int32_t>{};
  const int32_t mark = 37;
  for (bool marked : {true, false}) {
    SCOPED_TRACE(marked ? "marked" : "no mark");
    // Rows of 16: without the cut at the mark, no piece would end at 37.
    auto engine = MakeEngine(model, 1, 128, 16, 16);
    auto id = engine->Add(first, marked ? mark : -1);
    ASSERT_TRUE(id.ok());
    while (engine->Busy()) ASSERT_TRUE(engine->Advance().ok());
    for (int turn = 0; turn < 2; ++turn) {
      Request next = first;
      next.prompt.resize(mark);
      const auto more = RandomPrompt(rng, 12);
      next.prompt.insert(next.prompt.end(), more.begin(), more.end());
      const int64_t cached_before = engine->stats().cached_tokens;
      const int64_t rows_before = engine->stats().rows;
      auto warm = engine->Generate({next});
      ASSERT_TRUE(warm.ok());
      auto cold_engine = MakeEngine(model, 1, 128, 16, 16);
      auto cold = cold_engine->Generate({next});
      ASSERT_TRUE(cold.ok());
      EXPECT_EQ((*warm)[0], (*cold)[0]) << "turn " << turn;
      const int64_t reused = marked ? mark : 0;
      EXPECT_EQ(engine->stats().cached_tokens - cached_before, reused) << "turn " << turn;
      EXPECT_EQ(engine->stats().rows - rows_before, cold_engine->stats().rows - reused);
      ASSERT_TRUE(engine->CheckPages().ok());
    }
  }
}

// The slots' states and their snapshots come out of kv_budget_bytes before the pages.
TEST(EngineHybrid, StatesCountAgainstTheBudget) {
  Model* model = HybridModel();
  ASSERT_NE(model, nullptr);
  const int64_t state = StateBytes(*model);
  EXPECT_EQ(state, 3 * tiny_hybrid::Builder::StateFloats() * 4);
  EngineOptions options;
  options.slots = 4;
  options.context = 64;
  options.rows = 16;
  options.kv_budget_bytes = 4 * model->PageBytes() + 2 * 4 * state;  // states and snapshots
  auto engine = Engine::Create(model, options);
  ASSERT_TRUE(engine.ok()) << engine.status().message();
  EXPECT_EQ((*engine)->pages(), 4);
  options.kv_budget_bytes -= 1;
  auto short_budget = Engine::Create(model, options);
  ASSERT_FALSE(short_budget.ok());
  EXPECT_NE(short_budget.status().message().find("recurrent states"), std::string::npos)
      << short_budget.status().message();
}

}  // namespace
}  // namespace gizllm

namespace gizllm {
namespace {

// An engine that reads drafts on the hybrid: the budget holds a second snapshot a slot and the
// rows' kept inputs beside the states and their snapshots.
std::unique_ptr<Engine> MakeDraftingEngine(Model* model, int32_t slots, int64_t context,
                                           int64_t rows, int32_t pages) {
  int64_t row_inputs = 0;
  for (const CacheSpec& c : model->caches()) row_inputs += c.RowInputBytes();
  EXPECT_GT(row_inputs, 0);
  EngineOptions options;
  options.slots = slots;
  options.context = context;
  options.rows = rows;
  options.draft = DraftMode::kLookup;
  options.kv_budget_bytes =
      pages * model->PageBytes() + 3 * slots * StateBytes(*model) + rows * row_inputs;
  auto engine = Engine::Create(model, options);
  EXPECT_TRUE(engine.ok()) << engine.status().message();
  if (engine.ok()) {
    EXPECT_EQ((*engine)->pages(), pages);
  }
  options.kv_budget_bytes -= pages * model->PageBytes() - 1;  // the states fit, no page does
  EXPECT_FALSE(Engine::Create(model, options).ok());
  return engine.ok() ? std::move(*engine) : nullptr;
}

// Low level: a step of a token and three drafts, of which Accept keeps `kept` (0 to 3): the
// slot's states go back to its last kept row (the snapshot before the step and a replay of the
// kept rows), so the next step's logits equal those of an engine that never read the drafts.
TEST(EngineHybrid, AcceptRestoresTheStatesOfTheLastKeptRow) {
  Model* model = HybridModel();
  ASSERT_NE(model, nullptr);
  std::mt19937 rng(43);
  const std::vector<int32_t> prompt = RandomPrompt(rng, 70);  // past the rule's chunk of 64
  const std::vector<int32_t> step = RandomPrompt(rng, 4);     // a token, then three drafts
  const int32_t next = 17;
  const int n = static_cast<int>(prompt.size());
  auto drafting = MakeDraftingEngine(model, 2, 128, 80, 8);
  auto plain = MakeEngine(model, 2, 128, 80, 8);
  ASSERT_NE(drafting, nullptr);
  ASSERT_NE(plain, nullptr);
  const std::vector<int32_t> one_slot(n, 1), wanted_last{n - 1};
  for (int kept = 0; kept <= 3; ++kept) {
    SCOPED_TRACE("kept " + std::to_string(kept));
    ASSERT_TRUE(drafting->Reset(1).ok());
    ASSERT_TRUE(plain->Reset(1).ok());
    ASSERT_TRUE(drafting->Step(prompt, one_slot, wanted_last).ok());
    // Slot 1's last three rows are drafts; slot 0 reads a row beside them.
    const std::vector<int32_t> tokens = {5, step[0], step[1], step[2], step[3]};
    const std::vector<int32_t> slots = {0, 1, 1, 1, 1};
    const std::vector<int32_t> drafts = {0, 3};
    auto verify = drafting->Step(tokens, slots, std::vector<int32_t>{1, 2, 3, 4}, drafts);
    ASSERT_TRUE(verify.ok()) << verify.status().message();
    ASSERT_TRUE(drafting->Accept(1, 1 + kept).ok());
    ASSERT_EQ(drafting->held(1).size(), static_cast<size_t>(n + 1 + kept));
    auto after = drafting->Step(std::vector<int32_t>{next}, std::vector<int32_t>{1},
                                std::vector<int32_t>{0});
    ASSERT_TRUE(after.ok()) << after.status().message();

    std::vector<int32_t> read = prompt;
    read.insert(read.end(), step.begin(), step.begin() + 1 + kept);
    const int m = static_cast<int>(read.size());
    auto want_verify = plain->Step(read, std::vector<int32_t>(m, 1), std::vector<int32_t>{m - 1});
    ASSERT_TRUE(want_verify.ok());
    // The kept rows' own logits are the plain run's too.
    ExpectClose(
        std::span<const float>(*verify).subspan(kept * tiny_hybrid::kVocab, tiny_hybrid::kVocab),
        *want_verify, "the last kept row");
    auto want =
        plain->Step(std::vector<int32_t>{next}, std::vector<int32_t>{1}, std::vector<int32_t>{0});
    ASSERT_TRUE(want.ok());
    ExpectClose(*after, *want, "the step after Accept");
    ASSERT_TRUE(drafting->Reset(0).ok());
  }
}

// Accept drops no more rows than the step called drafts, and an engine made without drafts
// takes none on a hybrid (it keeps no snapshot for them).
TEST(EngineHybrid, AcceptDropsOnlyDrafts) {
  Model* model = HybridModel();
  ASSERT_NE(model, nullptr);
  auto drafting = MakeDraftingEngine(model, 2, 64, 16, 4);
  ASSERT_NE(drafting, nullptr);
  const std::vector<int32_t> rows = {3, 4, 5};
  ASSERT_TRUE(drafting->Step(rows, std::vector<int32_t>(3, 1), {}).ok());
  EXPECT_EQ(drafting->Accept(1, 2).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(drafting->Accept(1, 3).ok());
  ASSERT_TRUE(
      drafting->Step(rows, std::vector<int32_t>(3, 1), {}, std::vector<int32_t>{0, 1}).ok());
  EXPECT_EQ(drafting->Accept(1, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(drafting->Accept(1, 2).ok());
  EXPECT_EQ(drafting->held(1).size(), 5u);
  EXPECT_FALSE(drafting->Step(rows, std::vector<int32_t>(3, 1), {}, std::vector<int32_t>{4}).ok());

  auto plain = MakeEngine(model, 2, 64, 16, 4);
  ASSERT_NE(plain, nullptr);
  EXPECT_EQ(
      plain->Step(rows, std::vector<int32_t>(3, 1), {}, std::vector<int32_t>{0, 1}).status().code(),
      StatusCode::kInvalidArgument);
}

// Requests on prompts that repeat themselves, greedy and seeded, 3 slots sharing 7 pages
// (preemption): lookup drafts give the same tokens as none, some drafts kept and some refused.
TEST(EngineHybrid, LookupDraftsGiveTheSameTokens) {
  Model* model = HybridModel();
  ASSERT_NE(model, nullptr);
  std::mt19937 rng(41);
  std::vector<Request> requests;
  for (int i = 0; i < 6; ++i) {
    Request r;
    const std::vector<int32_t> piece = RandomPrompt(rng, 5 + i % 3);
    for (int j = 0; j < 30; ++j) r.prompt.push_back(piece[j % piece.size()]);
    r.limit = 16 + i;
    r.sampling.temperature = 0.0f;
    if (i % 2 == 1) {
      r.sampling.temperature = 0.8f;
      r.sampling.seed = rng();
    }
    r.stop = std::vector<int32_t>{};
    requests.push_back(r);
  }
  auto drafting = MakeDraftingEngine(model, 3, 96, 48, 7);
  auto plain = MakeEngine(model, 3, 96, 48, 7);
  ASSERT_NE(drafting, nullptr);
  ASSERT_NE(plain, nullptr);
  auto out = drafting->Generate(requests);
  ASSERT_TRUE(out.ok()) << out.status().message();
  auto want = plain->Generate(requests);
  ASSERT_TRUE(want.ok()) << want.status().message();
  for (size_t i = 0; i < requests.size(); ++i) EXPECT_EQ((*out)[i], (*want)[i]) << "request " << i;
  const DraftStats& lookup = drafting->stats().lookup;
  EXPECT_GT(lookup.accepted, 0);
  EXPECT_GT(lookup.drafted, lookup.accepted);
  EXPECT_GT(drafting->stats().preemptions, 0);
  EXPECT_TRUE(drafting->CheckPages().ok());
}

}  // namespace
}  // namespace gizllm
