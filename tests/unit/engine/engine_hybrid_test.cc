// The engine on a tiny random Qwen3.5-MoE hybrid (recurrent layers with per-slot states beside
// attention layers, CPU backend, float32 activations): a prompt read at every split equals one
// piece; concurrent greedy requests under preemption equal each alone; a chat's second turn
// reads only its new tokens from the slot's state and equals reading it whole; a slot's tokens
// taken by another request are not kept as a prefix (pages without a state cannot resume) and
// the next turn reads everything again; the states come out of the memory budget.
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
// at the slot's end), and a slot taken by another request keeps no prefix: both read everything,
// and give the cold tokens.
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

// Recurrent states cannot go back to a row inside a step (no per-row snapshots yet): with
// lookup drafts asked for, a hybrid model drafts nothing and gives the same tokens, and the
// low-level Accept refuses to drop rows.
TEST(EngineHybrid, DraftsNothingAndAcceptRefusesToCutBack) {
  Model* model = HybridModel();
  ASSERT_NE(model, nullptr);
  std::mt19937 rng(41);
  Request r;
  const std::vector<int32_t> piece = RandomPrompt(rng, 6);
  for (int i = 0; i < 30; ++i) r.prompt.push_back(piece[i % 6]);
  r.limit = 12;
  r.sampling.temperature = 0.0f;
  r.stop = std::vector<int32_t>{};
  EngineOptions options;
  options.slots = 2;
  options.context = 96;
  options.rows = 64;
  options.kv_budget_bytes = 12 * model->PageBytes() + 2 * 2 * StateBytes(*model);
  options.draft = DraftMode::kLookup;
  auto drafting = Engine::Create(model, options);
  ASSERT_TRUE(drafting.ok()) << drafting.status().message();
  auto out = (*drafting)->Generate({r});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ((*drafting)->stats().lookup.drafted, 0);
  auto plain = MakeEngine(model, 1, 96, 64, 12);
  auto want = plain->Generate({r});
  ASSERT_TRUE(want.ok());
  EXPECT_EQ((*out)[0], (*want)[0]);

  std::vector<int32_t> rows = {3, 4, 5};
  ASSERT_TRUE((*drafting)->Step(rows, std::vector<int32_t>(3, 1), {}).ok());
  EXPECT_EQ((*drafting)->Accept(1, 2).code(), StatusCode::kUnimplemented);
  EXPECT_TRUE((*drafting)->Accept(1, 3).ok());
}

}  // namespace
}  // namespace gizllm
