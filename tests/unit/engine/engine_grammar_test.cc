// Requests with a grammar in the engine: only allowed tokens, a stop only where the text is
// complete, beside free requests in the same steps, under preemption and cancellation; a
// reasoning model's thinking left free before the grammar.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "fake_runner.h"
#include "grammar/matcher.h"

namespace gizllm {
namespace {

constexpr int64_t kVocab = 64;
constexpr int32_t kEos = 1;
// A reasoning model's special tokens (no bytes: never a grammar's).
constexpr int32_t kThinkOpen = 40, kThinkClose = 41;

// Tokens 2.. spell pieces of small JSON objects (several pieces span grammar symbols).
std::shared_ptr<const TokenVocabulary> Vocabulary() {
  std::vector<std::string> bytes(kVocab);
  const char* pieces[] = {"{",    "}",    "\"",       "a",   "b",   ":",   ",",   "0",
                          "1",    "2",    "7",        "9",   "\"a", "b\"", "\":", "ab",
                          "ba",   "{\"",  "\",",      ",\"", "}}",  "12",  "x",   " ",
                          "\xC3", "\xA9", "\xC3\xA9", "aa",  "bb",  "\"}", "0}",  "9,"};
  for (size_t i = 0; i < std::size(pieces); ++i) bytes[2 + i] = pieces[i];
  return std::make_shared<const TokenVocabulary>(std::move(bytes));
}

std::shared_ptr<const TokenGrammar> Grammar() {
  Expected<gizllm::Grammar> g = ParseGbnf(
      "root ::= \"{\" pair (\",\" pair){0,2} \"}\"\n"
      "pair ::= \"\\\"\" ([ab] | \"\\u00e9\"){1,3} \"\\\":\" [0-9]{1,2}\n");
  EXPECT_TRUE(g.ok()) << g.status().message();
  return std::make_shared<const TokenGrammar>(
      TokenGrammar{std::make_shared<const gizllm::Grammar>(std::move(*g)), Vocabulary()});
}

std::string Text(const TokenVocabulary& v, const std::vector<int32_t>& tokens) {
  std::string out;
  for (int32_t t : tokens) out += v.bytes(t);
  return out;
}

// What a request produces alone: the fake's logits, masked by the grammar, sampled.
std::vector<int32_t> Alone(const Request& request, uint64_t seed) {
  Sampler sampler(kVocab);
  std::vector<int32_t> tokens = request.prompt;
  std::vector<float> logits(kVocab);
  uint64_t h = 0x5157;
  for (size_t p = 0; p < tokens.size(); ++p) h = FakeRunner::Chain(h, tokens[p], p);
  std::unique_ptr<TokenMatcher> matcher;
  if (request.sampling.grammar) matcher = std::make_unique<TokenMatcher>(*request.sampling.grammar);
  // Thinking before the grammar: open allowed as the first token, nothing masked until close.
  const Sampling& s = request.sampling;
  const bool thinks = s.think_open >= 0;
  bool thinking = thinks && s.thinking, first = true;
  std::vector<uint64_t> mask;
  const std::vector<int32_t> stop = {kEos};
  std::vector<int32_t> out;
  while (true) {
    for (int64_t v = 0; v < kVocab; ++v) logits[v] = FakeRunner::Logit(h, v);
    const bool masked = matcher && !thinking;
    if (masked) matcher->FillMask(stop, &mask);
    if (masked && thinks && first) mask[s.think_open / 64] |= uint64_t{1} << (s.think_open % 64);
    std::span<const int32_t> all(tokens);
    const int32_t t =
        sampler.Sample(logits, request.sampling, seed, all.first(request.prompt.size()),
                       all.subspan(request.prompt.size()), nullptr,
                       masked ? std::span<const uint64_t>(mask) : std::span<const uint64_t>());
    if (t == kEos) break;
    if (thinking) {
      thinking = t != s.think_close;
    } else if (thinks && first && t == s.think_open) {
      thinking = true;
    } else if (matcher) {
      EXPECT_TRUE(matcher->Accept(t));
    }
    first = false;
    out.push_back(t);
    tokens.push_back(t);
    if (request.limit > 0 && static_cast<int64_t>(out.size()) >= request.limit) break;
    h = FakeRunner::Chain(h, t, tokens.size() - 1);
  }
  return out;
}

// The tokens the grammar holds: after a thinking block where the request has one.
std::vector<int32_t> GrammarPart(const Request& r, const std::vector<int32_t>& tokens) {
  const Sampling& s = r.sampling;
  if (s.think_open < 0) return tokens;
  if (!s.thinking && (tokens.empty() || tokens[0] != s.think_open)) return tokens;
  auto close = std::find(tokens.begin(), tokens.end(), s.think_close);
  if (close == tokens.end()) return {};
  return std::vector<int32_t>(close + 1, tokens.end());
}

// picks: the runner picks the tokens (as a device does), the constrained rows under the masks the
// engine hands it once it has stepped.
void MixedBatchesUnderPreemptionAndCancellation(bool picks) {
  FakeRunner runner(kVocab);
  runner.picks_tokens = picks;
  EngineOptions options;
  options.slots = 6;
  options.context = 160;
  options.rows = 40;
  options.kv_budget_bytes = 14 * runner.PageBytes();
  options.mask_threads = 3;  // the masks of a step on several threads while the runner steps
  auto engine = Engine::Create(&runner, options);
  ASSERT_TRUE(engine.ok()) << engine.status().message();
  auto grammar = Grammar();
  std::mt19937 rng(11);
  struct Pending {
    Request request;
    int arrival, cancel_at;
  };
  std::vector<Pending> pending;
  for (int i = 0; i < 30; ++i) {
    Request r;
    r.prompt.resize(1 + rng() % 70);
    for (int32_t& t : r.prompt) t = 2 + rng() % (kVocab - 2);
    r.limit = 40;
    r.sampling.temperature = 1.0f;
    r.sampling.seed = rng();
    if (i % 3 != 2) r.sampling.grammar = grammar;
    if (i % 3 == 1) {  // a reasoning model's: thinking first, or the prompt opened it
      r.sampling.think_open = kThinkOpen;
      r.sampling.think_close = kThinkClose;
      r.sampling.thinking = i % 2 == 0;
    }
    pending.push_back({r, static_cast<int>(rng() % 30), i % 7 == 0 ? int(rng() % 40) : -1});
  }
  std::map<int64_t, int> index;
  std::map<int64_t, std::vector<int32_t>> got;
  std::map<int64_t, std::string> end;
  for (int step = 0; step < 30 || (*engine)->Busy(); ++step) {
    ASSERT_LT(step, 5000);
    for (int i = 0; i < 30; ++i) {
      if (pending[i].arrival != step) continue;
      auto id = (*engine)->Add(pending[i].request);
      ASSERT_TRUE(id.ok()) << id.status().message();
      index[*id] = i;
    }
    for (auto& [id, i] : index) {
      if (pending[i].cancel_at == step && end[id].empty()) {
        EXPECT_TRUE((*engine)->Cancel(id));
        end[id] = "cancelled";
      }
    }
    auto progress = (*engine)->Advance();
    ASSERT_TRUE(progress.ok()) << progress.status().message();
    for (const Progress& p : *progress) {
      ASSERT_TRUE(p.status.ok()) << p.status.message();
      got[p.id].insert(got[p.id].end(), p.tokens.begin(), p.tokens.end());
      if (!p.end.empty()) end[p.id] = p.end;
    }
  }
  EXPECT_GT((*engine)->stats().preemptions, 0);
  EXPECT_GT((*engine)->stats().masks_beside_step, 100);
  if (picks) {
    // Every step picked on the runner, every mask applied there.
    EXPECT_EQ((*engine)->stats().device_sampled, (*engine)->stats().steps);
    EXPECT_EQ((*engine)->stats().masks_on_device, (*engine)->stats().masks_beside_step);
    EXPECT_EQ(runner.masked_rows, (*engine)->stats().masks_on_device);
  } else {
    EXPECT_EQ((*engine)->stats().device_sampled, 0);
    EXPECT_EQ((*engine)->stats().masks_on_device, 0);
  }
  int complete = 0, thought = 0;
  for (auto& [id, i] : index) {
    const Request& r = pending[i].request;
    const std::vector<int32_t> want = Alone(r, *r.sampling.seed);
    if (end[id] == "cancelled") {
      EXPECT_TRUE(std::equal(got[id].begin(), got[id].end(), want.begin())) << "request " << i;
      continue;
    }
    EXPECT_EQ(got[id], want) << "request " << i;
    if (!r.sampling.grammar) continue;
    Matcher m(grammar->grammar);
    const std::vector<int32_t> held = GrammarPart(r, got[id]);
    if (r.sampling.think_open >= 0) {
      const bool opened = r.sampling.thinking || (!got[id].empty() && got[id][0] == kThinkOpen);
      thought += opened && held.size() + 2 < got[id].size();
      if (opened && std::find(got[id].begin(), got[id].end(), kThinkClose) == got[id].end()) {
        continue;  // ended inside its thinking
      }
    }
    const std::string text = Text(*grammar->vocabulary, held);
    EXPECT_TRUE(m.Accept(text)) << text;
    if (end[id] == "stop") {
      EXPECT_TRUE(m.Complete()) << text;
      ++complete;
    }
  }
  EXPECT_GT(complete, 5);
  EXPECT_GT(thought, 1);  // requests that thought, then followed the grammar
}

TEST(EngineGrammar, MixedBatchesUnderPreemptionAndCancellation) {
  MixedBatchesUnderPreemptionAndCancellation(/*picks=*/false);
}

TEST(EngineGrammar, MixedBatchesPickedByTheRunner) {
  MixedBatchesUnderPreemptionAndCancellation(/*picks=*/true);
}

// A grammar that needs a byte no token holds ends its request with an error after the tokens it
// allowed, on either path, and the free request beside it goes on.
TEST(EngineGrammar, NoAllowedTokenEndsOnlyItsRequest) {
  for (bool picks : {false, true}) {
    FakeRunner runner(kVocab);
    runner.picks_tokens = picks;
    EngineOptions options;
    options.slots = 2;
    options.context = 64;
    options.rows = 16;
    options.kv_budget_bytes = 16 * runner.PageBytes();
    auto engine = Engine::Create(&runner, options);
    ASSERT_TRUE(engine.ok()) << engine.status().message();
    Expected<gizllm::Grammar> g = ParseGbnf("root ::= \"{\" \"q\"\n");
    ASSERT_TRUE(g.ok()) << g.status().message();
    Request constrained;
    constrained.prompt = {3, 4};
    constrained.limit = 8;
    constrained.sampling.grammar = std::make_shared<const TokenGrammar>(
        TokenGrammar{std::make_shared<const gizllm::Grammar>(std::move(*g)), Vocabulary()});
    Request free;
    free.prompt = {5};
    free.limit = 6;
    free.stop = std::vector<int32_t>{};
    ASSERT_TRUE((*engine)->Add(constrained).ok());
    ASSERT_TRUE((*engine)->Add(free).ok());
    std::map<int64_t, std::vector<int32_t>> got;
    std::map<int64_t, Progress> last;
    while ((*engine)->Busy()) {
      auto progress = (*engine)->Advance();
      ASSERT_TRUE(progress.ok()) << progress.status().message();
      for (const Progress& p : *progress) {
        got[p.id].insert(got[p.id].end(), p.tokens.begin(), p.tokens.end());
        if (!p.end.empty()) last[p.id] = p;
      }
    }
    EXPECT_EQ(got[0], std::vector<int32_t>{2}) << "picks " << picks;  // "{"
    EXPECT_EQ(last[0].end, "error");
    EXPECT_EQ(last[0].status.message(), "the grammar allows no token after 1 tokens of the answer")
        << "picks " << picks;
    EXPECT_EQ(last[1].end, "length");
    EXPECT_EQ(got[1].size(), 6u);
    EXPECT_EQ(runner.masked_rows > 0, picks);
  }
}

TEST(EngineGrammar, VocabularyMustCoverTheModel) {
  FakeRunner runner(kVocab);
  EngineOptions options;
  options.slots = 1;
  options.context = 64;
  options.rows = 8;
  options.kv_budget_bytes = 8 * runner.PageBytes();
  auto engine = Engine::Create(&runner, options);
  ASSERT_TRUE(engine.ok());
  Request r;
  r.prompt = {3};
  r.sampling.grammar = std::make_shared<const TokenGrammar>(
      TokenGrammar{Grammar()->grammar,
                   std::make_shared<const TokenVocabulary>(std::vector<std::string>(10, "a"))});
  auto id = (*engine)->Add(r);
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().message(),
            "request.sampling.grammar: the tokens' bytes cover 10 tokens, the model has 64");
}

}  // namespace
}  // namespace gizllm
