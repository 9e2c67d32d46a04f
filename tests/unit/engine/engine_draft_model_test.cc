// Drafts on real models (CPU backend, float32 activations): requests give the same tokens with
// and without lookup drafts, greedy and seeded sampling, under preemption, on the shipped
// tiny-chat, the golden dense models and the golden hybrids (recurrent states restored to the
// last kept row); on a prompt that repeats itself drafts are kept, and some refused. The shipped
// tiny hybrid drafts with its MTP layer as well.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "tests/unit/engine/exact_cpu_model.h"
#include "formats/safetensors.h"
#include "model/evaluate.h"
#include "model/model.h"
#include "ops/device.h"
#include "tests/golden/golden_util.h"

namespace gizllm {
namespace {

Model* Load(const std::string& folder) { return testing::LoadExactCpu(folder); }

struct Outcome {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::string> ends;
  EngineStats stats;
};

// The requests, all added at once, on a fresh engine of `slots` slots and `pages` pages.
Outcome Generate(Model* model, const std::vector<Request>& requests, DraftMode draft, int32_t slots,
                 int32_t pages, int32_t drafts = 3) {
  EngineOptions options;
  options.slots = slots;
  options.context = 128;
  options.rows = 48;
  options.draft = draft;
  options.drafts = drafts;
  // Pages, and on a hybrid its recurrent states (with drafts, their second snapshot and the
  // rows' kept inputs too).
  options.kv_budget_bytes =
      pages * model->PageBytes() + Engine::StateBytes(model->caches(), options);
  auto engine = Engine::Create(model, options);
  EXPECT_TRUE(engine.ok()) << engine.status().message();
  Outcome out;
  if (!engine.ok()) return out;
  out.tokens.resize(requests.size());
  out.ends.resize(requests.size());
  std::map<int64_t, size_t> index;
  for (size_t i = 0; i < requests.size(); ++i) {
    auto id = (*engine)->Add(requests[i]);
    EXPECT_TRUE(id.ok()) << id.status().message();
    index[*id] = i;
  }
  while ((*engine)->Busy()) {
    auto progress = (*engine)->Advance();
    EXPECT_TRUE(progress.ok()) << progress.status().message();
    if (!progress.ok()) return out;
    for (const Progress& p : *progress) {
      const size_t i = index.at(p.id);
      out.tokens[i].insert(out.tokens[i].end(), p.tokens.begin(), p.tokens.end());
      if (!p.end.empty()) out.ends[i] = p.end;
    }
    const Status check = (*engine)->CheckPages();
    EXPECT_TRUE(check.ok()) << check.message();
    if (!check.ok()) return out;
  }
  out.stats = (*engine)->stats();
  return out;
}

// Prompts that repeat a random piece of 5 to 9 tokens four times (a passage, then its start
// again), and random ones; half of them sampled with a seed.
std::vector<Request> Requests(int64_t vocab, int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> pick(10, static_cast<int32_t>(vocab) - 1);
  std::vector<Request> requests;
  for (int i = 0; i < n; ++i) {
    Request r;
    const int period = 5 + static_cast<int>(rng() % 5);
    std::vector<int32_t> piece(period);
    for (int32_t& t : piece) t = pick(rng);
    for (int p = 0; p < 4 * period; ++p)
      r.prompt.push_back(i % 3 == 2 ? pick(rng) : piece[p % period]);
    r.limit = 24 + static_cast<int64_t>(rng() % 24);
    r.sampling.temperature = 0.0f;
    if (i % 2 == 1) {
      r.sampling.temperature = 0.8f;
      r.sampling.top_p = 0.95f;
      r.sampling.seed = rng();
    }
    requests.push_back(r);
  }
  return requests;
}

void CheckSameTokens(const std::string& folder, int32_t slots, int32_t pages, int n) {
  Model* model = Load(folder);
  ASSERT_NE(model, nullptr);
  const std::vector<Request> requests = Requests(model->arch().vocab, n, 51);
  const Outcome plain = Generate(model, requests, DraftMode::kNone, slots, pages);
  const Outcome lookup = Generate(model, requests, DraftMode::kLookup, slots, pages);
  const Outcome paced = Generate(model, requests, DraftMode::kAuto, slots, pages);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(lookup.tokens[i], plain.tokens[i]) << folder << " request " << i;
    EXPECT_EQ(lookup.ends[i], plain.ends[i]) << folder << " request " << i;
    EXPECT_EQ(paced.tokens[i], plain.tokens[i]) << folder << " request " << i;
  }
  EXPECT_GT(lookup.stats.lookup.drafted, lookup.stats.lookup.accepted) << folder;
  EXPECT_GT(lookup.stats.lookup.accepted, 0) << folder;
  EXPECT_GT(lookup.stats.preemptions, 0) << folder;
}

// tiny-chat: 8 requests in 4 slots whose pool (12 pages) cannot hold them all: preemption.
TEST(EngineDraftModel, TinyChatSameTokensWithAndWithoutDrafts) {
  CheckSameTokens("models/tiny-chat", 4, 12, 8);
}

TEST(EngineDraftModel, GoldenDenseSameTokensWithAndWithoutDrafts) {
  for (const char* family : {"llama", "llama_mlp_bias", "qwen2", "qwen3", "gemma2", "gemma3"}) {
    SCOPED_TRACE(family);
    CheckSameTokens(std::string("tests/golden/models/") + family, 4, 12, 8);
  }
}

// The hybrids (recurrent layers beside attention): a step with drafts snapshots each drafting
// slot's states, and a refused draft brings them back to the last kept row.
TEST(EngineDraftModel, GoldenHybridSameTokensWithAndWithoutDrafts) {
  for (const char* family : {"qwen3_next", "qwen3_5", "qwen3_5_moe"}) {
    SCOPED_TRACE(family);
    CheckSameTokens(std::string("tests/golden/models/") + family, 4, 12, 8);
  }
}

// models/tiny-hybrid drafts with its MTP layer, chained: the same tokens as without drafts,
// greedy and seeded sampling, under preemption; paced (auto) too.
TEST(EngineDraftModel, TinyHybridMtpDraftsGiveTheSameTokens) {
  Model* model = Load("models/tiny-hybrid");
  ASSERT_NE(model, nullptr);
  ASSERT_TRUE(model->HasMtp());
  const std::vector<Request> requests = Requests(model->arch().vocab, 8, 51);
  const Outcome plain = Generate(model, requests, DraftMode::kNone, 4, 12);
  const Outcome mtp = Generate(model, requests, DraftMode::kMtp, 4, 12);
  const Outcome paced = Generate(model, requests, DraftMode::kAuto, 4, 12);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(mtp.tokens[i], plain.tokens[i]) << "request " << i;
    EXPECT_EQ(mtp.ends[i], plain.ends[i]) << "request " << i;
    EXPECT_EQ(paced.tokens[i], plain.tokens[i]) << "request " << i;
  }
  EXPECT_GT(mtp.stats.mtp.accepted, 0);
  EXPECT_GT(mtp.stats.mtp.drafted, mtp.stats.mtp.accepted);
  EXPECT_EQ(mtp.stats.lookup.drafted, 0);
  EXPECT_GT(mtp.stats.preemptions, 0);
}

// One draft a step, one greedy sequence at a time, on the reference's chats: each step's draft
// is the MTP layer's pick for the token after the newest (the largest logit of
// SequenceMtpLogits over the answer's text at the row before the newest token), so the drafts
// made and kept are those that reading the answer with that layer gives: a draft at the newest
// token's position P, kept when it is the token at P + 1; the next draft at P + 2 if kept, else
// at P + 1. With three chained drafts the tokens are the same too.
TEST(EngineDraftModel, TinyHybridMtpDraftsAreTheLayersPicks) {
  Model* model = Load("models/tiny-hybrid");
  ASSERT_NE(model, nullptr);
  auto ref = SafetensorsFile::Open("models/tiny-hybrid/reference.safetensors");
  ASSERT_TRUE(ref.ok()) << ref.status().message();
  const int64_t vocab = model->arch().vocab;
  int64_t kept_in_all = 0;
  for (int i = 0; ref->Find("ids" + std::to_string(i)); ++i) {
    SCOPED_TRACE("ids" + std::to_string(i));
    Request r;
    r.prompt = golden::ReadIds(*ref->Find("ids" + std::to_string(i)));
    r.limit = 48;
    r.stop = std::vector<int32_t>{};
    const Outcome plain = Generate(model, {r}, DraftMode::kNone, 1, 64);
    const Outcome one = Generate(model, {r}, DraftMode::kMtp, 1, 64, 1);
    const Outcome three = Generate(model, {r}, DraftMode::kMtp, 1, 64, 3);
    ASSERT_EQ(plain.tokens.size(), 1u);
    EXPECT_EQ(one.tokens[0], plain.tokens[0]);
    EXPECT_EQ(three.tokens[0], plain.tokens[0]);
    std::vector<int32_t> text = r.prompt;
    text.insert(text.end(), plain.tokens[0].begin(), plain.tokens[0].end());
    auto logits = SequenceMtpLogits(*model, text);
    ASSERT_TRUE(logits.ok()) << logits.status().message();
    // The answer's first token comes from the prompt's step; then one draft a step while the
    // request has room for a token after it (a draft is never made past the limit).
    int64_t drafted = 0, kept = 0;
    const int64_t end = static_cast<int64_t>(text.size());
    for (int64_t p = static_cast<int64_t>(r.prompt.size()); p + 2 < end;) {
      const float* row = logits->data() + (p - 1) * vocab;
      const int32_t draft = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
      ++drafted;
      const bool keep = draft == text[p + 1];
      kept += keep;
      p += keep ? 2 : 1;
    }
    EXPECT_EQ(one.stats.mtp.drafted, drafted);
    EXPECT_EQ(one.stats.mtp.accepted, kept);
    EXPECT_GT(three.stats.mtp.accepted, 0);
    kept_in_all += kept;
  }
  EXPECT_GT(kept_in_all, 0);
}

}  // namespace
}  // namespace gizllm
