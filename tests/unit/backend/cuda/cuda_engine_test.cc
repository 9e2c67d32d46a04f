// The Engine on the CUDA backend with tiny-chat: tokens picked on the device equal the host
// Sampler's picks from the same logits (seeded sampling under top-k, top-p, min-p and greedy;
// requests under grammars' masks beside free ones), greedy tokens equal the CPU backend's, Warm
// leaves the engine as it found it, and fp16 pages come back from host memory as they were;
// lookup drafts (verify steps of several rows a sequence, picked on the device) change no token
// in exact mode, on the golden hybrids too, where Accept brings the recurrent states back to the
// last kept row, and tiny-hybrid's MTP and DFlash drafts change none either. Skipped without a
// CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "engine/engine.h"
#include "model/dflash.h"
#include "model/evaluate.h"
#include "model/model.h"
#include "ops/device.h"
#include "unit/engine/constrained_requests.h"

namespace gizllm {
namespace {

#define GZ_SKIP_WITHOUT_CUDA()                                               \
  do {                                                                       \
    if (CudaDeviceCount() == 0)                                              \
      GTEST_SKIP() << "no CUDA device was found: CUDA engine tests skipped"; \
  } while (0)

// kv: the pages' format (none: the backend's default).
std::unique_ptr<Model> Load(const std::string& device_name, bool exact,
                            std::optional<KvFormat> kv = std::nullopt,
                            const std::string& dir = "models/tiny-chat") {
  DeviceOptions device;
  device.device = device_name;
  device.exact = exact;
  auto backend = OpenBackend(device);
  EXPECT_TRUE(backend.ok()) << backend.status().message();
  if (!backend.ok()) return nullptr;
  LoadOptions options;
  options.kv = kv;
  auto model = Model::Load(dir, *backend, options);
  EXPECT_TRUE(model.ok()) << model.status().message();
  return model.ok() ? std::move(*model) : nullptr;
}

std::vector<Request> Requests(bool sampled) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> token(10, 8000);
  std::vector<Request> out;
  for (int i = 0; i < 12; ++i) {
    Request r;
    r.prompt.resize(3 + rng() % 60);
    for (int32_t& t : r.prompt) t = token(rng);
    r.limit = 24 + i;
    r.stop = std::vector<int32_t>{};
    r.sampling.temperature = 0.0f;
    if (sampled && i % 3 != 0) {
      r.sampling.temperature = 0.7f + 0.1f * (i % 4);
      r.sampling.top_k = i % 2 ? 40 : 0;
      r.sampling.top_p = i % 4 == 1 ? 0.9f : 1.0f;
      r.sampling.min_p = i % 5 == 2 ? 0.05f : 0.0f;
      r.sampling.seed = 1000 + i;
    }
    out.push_back(r);
  }
  return out;
}

std::vector<std::vector<int32_t>> Generate(Model& model, const std::vector<Request>& requests,
                                           bool device_sampling, bool warm, int64_t* device_steps) {
  EngineOptions options;
  options.slots = 5;
  options.context = 256;
  options.rows = 64;
  options.device_sampling = device_sampling;
  auto engine = Engine::Create(&model, options);
  EXPECT_TRUE(engine.ok()) << engine.status().message();
  if (!engine.ok()) return {};
  if (warm) {
    Status st = (*engine)->Warm();
    EXPECT_TRUE(st.ok()) << st.message();
  }
  auto out = (*engine)->Generate(requests);
  EXPECT_TRUE(out.ok()) << out.status().message();
  if (device_steps) *device_steps = (*engine)->stats().device_sampled;
  return out.ok() ? *out : std::vector<std::vector<int32_t>>{};
}

TEST(CudaEngine, DevicePicksEqualHostPicks) {
  GZ_SKIP_WITHOUT_CUDA();
  auto model = Load("cuda", /*exact=*/false);
  ASSERT_TRUE(model);
  ASSERT_TRUE(model->CanSample());
  const auto requests = Requests(/*sampled=*/true);
  int64_t device_steps = 0, host_steps = 0;
  const auto device = Generate(*model, requests, true, false, &device_steps);
  const auto host = Generate(*model, requests, false, false, &host_steps);
  ASSERT_EQ(device.size(), requests.size());
  EXPECT_GT(device_steps, 20);
  EXPECT_EQ(host_steps, 0);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(device[i], host[i]) << "request " << i;
    EXPECT_EQ(static_cast<int64_t>(device[i].size()), requests[i].limit);
  }
}

// A batch of requests under a JSON schema, under a GBNF grammar and free (greedy, then seeded
// sampled): the tokens picked on the device, the constrained rows under the masks the engine
// uploads once the step is issued, equal the host Sampler's from the same logits, and every
// constrained answer is text its grammar allows.
TEST(CudaEngine, DevicePicksUnderMasksEqualHostPicks) {
  GZ_SKIP_WITHOUT_CUDA();
  auto model = Load("cuda", /*exact=*/false);
  ASSERT_TRUE(model);
  const int64_t vocab = model->arch().vocab;
  auto schema = ConstrainedGrammar("models/tiny-chat", vocab, /*json_schema=*/true);
  auto gbnf = ConstrainedGrammar("models/tiny-chat", vocab, /*json_schema=*/false);
  ASSERT_TRUE(schema && gbnf);
  for (bool sampled : {false, true}) {
    SCOPED_TRACE(sampled ? "sampled" : "greedy");
    const std::vector<Request> requests = ConstrainedMix(schema, gbnf, sampled);
    std::vector<std::vector<int32_t>> out[2];
    EngineStats stats[2];
    for (bool device : {false, true}) {
      EngineOptions options;
      options.slots = 5;
      options.context = 128;
      options.rows = 64;
      options.device_sampling = device;
      auto engine = Engine::Create(model.get(), options);
      ASSERT_TRUE(engine.ok()) << engine.status().message();
      auto got = (*engine)->Generate(requests);
      ASSERT_TRUE(got.ok()) << got.status().message();
      out[device] = std::move(*got);
      stats[device] = (*engine)->stats();
    }
    EXPECT_EQ(stats[false].device_sampled, 0);
    EXPECT_EQ(stats[true].device_sampled, stats[true].steps);
    EXPECT_GT(stats[true].masks_on_device, 100);
    int64_t constrained = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
      EXPECT_EQ(out[true][i], out[false][i]) << "request " << i;
      if (requests[i].sampling.grammar) {
        EXPECT_TRUE(Allowed(*requests[i].sampling.grammar, out[true][i])) << "request " << i;
        constrained += static_cast<int64_t>(out[true][i].size());
      }
    }
    EXPECT_GT(constrained, 100);
  }
}

TEST(CudaEngine, GreedyEqualsCpuAndWarmChangesNothing) {
  GZ_SKIP_WITHOUT_CUDA();
  auto cpu = Load("cpu", true);
  auto cuda = Load("cuda", /*exact=*/true);
  ASSERT_TRUE(cpu && cuda);
  const auto requests = Requests(/*sampled=*/false);
  const auto want = Generate(*cpu, requests, true, false, nullptr);
  const auto cold = Generate(*cuda, requests, true, false, nullptr);
  const auto warmed = Generate(*cuda, requests, true, true, nullptr);
  ASSERT_EQ(want.size(), requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(cold[i], want[i]) << "request " << i;
    EXPECT_EQ(warmed[i], want[i]) << "request " << i;
  }
}

// fp16 pages pushed out of a full pool into host memory and copied back (Model::CopyPage, layer by
// layer, at half float32's bytes): a chat continued from the stored prefix gives the tokens a
// cold engine gives and reads only what follows the prefix. Exact mode (float32 activations), so
// that a row's logits do not depend on how many rows its step holds.
TEST(CudaEngine, F16PagesStoredOnTheHostComeBackAsTheyWere) {
  GZ_SKIP_WITHOUT_CUDA();
  auto model = Load("cuda", /*exact=*/true, KvFormat::kF16);
  ASSERT_TRUE(model);
  ASSERT_EQ(model->kv_format(), KvFormat::kF16);
  auto make = [&](int32_t slots, int64_t context, int32_t pages, bool host) {
    EngineOptions options;
    options.slots = slots;
    options.context = context;
    options.rows = 64;
    options.kv_budget_bytes = pages * model->PageBytes();
    options.host_prefix_bytes = host ? options.kv_budget_bytes : 0;
    auto engine = Engine::Create(model.get(), options);
    EXPECT_TRUE(engine.ok()) << engine.status().message();
    return engine.ok() ? std::move(*engine) : nullptr;
  };
  std::mt19937 rng(23);
  std::uniform_int_distribution<int32_t> token(10, 8000);
  auto prompt = [&](int n) {
    std::vector<int32_t> p(n);
    for (int32_t& t : p) t = token(rng);
    return p;
  };
  Request first;
  first.prompt = prompt(40);
  first.limit = 10;
  first.sampling.temperature = 0.0f;
  first.stop = std::vector<int32_t>{};
  auto engine = make(1, 80, 5, /*host=*/true);
  ASSERT_NE(engine, nullptr);
  auto a = engine->Generate({first});
  ASSERT_TRUE(a.ok()) << a.status().message();
  ASSERT_EQ((*a)[0].size(), 10u);
  Request other = first;
  other.prompt = prompt(40);
  ASSERT_TRUE(engine->Generate({other}).ok());
  EXPECT_GT(engine->stats().host_copies, 0);
  Request next = first;
  next.prompt.insert(next.prompt.end(), (*a)[0].begin(), (*a)[0].end());
  const auto more = prompt(6);
  next.prompt.insert(next.prompt.end(), more.begin(), more.end());
  next.limit = 12;
  const int64_t rows_before = engine->stats().rows;
  auto warm = engine->Generate({next});
  ASSERT_TRUE(warm.ok()) << warm.status().message();
  auto cold_engine = make(1, 128, 16, /*host=*/false);
  ASSERT_NE(cold_engine, nullptr);
  auto cold = cold_engine->Generate({next});
  ASSERT_TRUE(cold.ok());
  EXPECT_EQ((*warm)[0], (*cold)[0]);
  EXPECT_EQ(engine->stats().cached_tokens, 40 + 10 - 1);
  EXPECT_EQ(engine->stats().rows - rows_before, cold_engine->stats().rows - (40 + 10 - 1));
}

// Prompts that repeat a random piece (a passage, then its start again), greedy and seeded: with
// lookup drafts, paced drafts and none, in exact mode the tokens are the same (picked on the
// device and on the host) and drafts are kept. In the fast mode (bf16 linears for steps of more
// than one row) a verify step rounds differently from a decode step, so the agreement is
// printed, and every request still ends at its limit.
std::vector<Request> RepeatingRequests() {
  std::mt19937 rng(17);
  std::uniform_int_distribution<int32_t> token(10, 8000);
  std::vector<Request> out;
  for (int i = 0; i < 12; ++i) {
    Request r;
    std::vector<int32_t> piece(5 + rng() % 6);
    for (int32_t& t : piece) t = token(rng);
    for (size_t p = 0; p < 4 * piece.size(); ++p) r.prompt.push_back(piece[p % piece.size()]);
    r.limit = 40;
    r.stop = std::vector<int32_t>{};
    r.sampling.temperature = 0.0f;
    if (i % 2 == 1) {
      r.sampling.temperature = 0.8f;
      r.sampling.top_p = 0.95f;
      r.sampling.seed = 500 + i;
    }
    out.push_back(r);
  }
  return out;
}

struct Drafted {
  std::vector<std::vector<int32_t>> tokens;
  EngineStats stats;
};

Drafted GenerateDrafts(Model& model, const std::vector<Request>& requests, DraftMode draft,
                       bool device_sampling) {
  EngineOptions options;
  options.slots = 5;
  options.context = 256;
  options.rows = 64;
  options.device_sampling = device_sampling;
  options.draft = draft;
  auto engine = Engine::Create(&model, options);
  EXPECT_TRUE(engine.ok()) << engine.status().message();
  if (!engine.ok()) return {};
  auto out = (*engine)->Generate(requests);
  EXPECT_TRUE(out.ok()) << out.status().message();
  return {out.ok() ? *out : std::vector<std::vector<int32_t>>{}, (*engine)->stats()};
}

// The requests on 4 slots sharing 12 pages (preemption; a hybrid's states, their snapshots and
// the drafts' inputs beside), context 128, steps of 48 rows; the pages checked after.
// `block`: the block drafter of DraftMode::kBlock (its most drafts a step).
Drafted GenerateInFewPages(Model& model, const std::vector<Request>& requests, DraftMode draft,
                           bool device_sampling, BlockDrafter* block = nullptr) {
  EngineOptions options;
  options.slots = 4;
  options.context = 128;
  options.rows = 48;
  options.device_sampling = device_sampling;
  options.draft = draft;
  options.block_drafter = block;
  if (block) options.drafts = block->MostDrafts();
  options.kv_budget_bytes = 12 * model.PageBytes() + Engine::StateBytes(model.caches(), options);
  auto engine = Engine::Create(&model, options);
  EXPECT_TRUE(engine.ok()) << engine.status().message();
  if (!engine.ok()) return Drafted{};
  auto out = (*engine)->Generate(requests);
  EXPECT_TRUE(out.ok()) << out.status().message();
  EXPECT_TRUE((*engine)->CheckPages().ok());
  return Drafted{out.ok() ? *out : std::vector<std::vector<int32_t>>{}, (*engine)->stats()};
}

// Tokens of `ours` before its first difference from `plain`, summed over the requests.
int64_t TokensBeforeTheFirstDifference(const Drafted& ours, const Drafted& plain) {
  int64_t same = 0;
  for (size_t i = 0; i < plain.tokens.size() && i < ours.tokens.size(); ++i) {
    size_t n = 0;
    while (n < plain.tokens[i].size() && n < ours.tokens[i].size() &&
           ours.tokens[i][n] == plain.tokens[i][n])
      ++n;
    same += static_cast<int64_t>(n);
  }
  return same;
}

TEST(CudaEngine, DraftsChangeNoTokens) {
  GZ_SKIP_WITHOUT_CUDA();
  const auto requests = RepeatingRequests();
  for (bool exact : {true, false}) {
    auto model = Load("cuda", exact);
    ASSERT_TRUE(model);
    for (bool device : {true, false}) {
      SCOPED_TRACE(std::string(exact ? "exact" : "fast") + (device ? " device" : " host"));
      const Drafted plain = GenerateDrafts(*model, requests, DraftMode::kNone, device);
      const Drafted lookup = GenerateDrafts(*model, requests, DraftMode::kLookup, device);
      const Drafted paced = GenerateDrafts(*model, requests, DraftMode::kAuto, device);
      ASSERT_EQ(plain.tokens.size(), requests.size());
      ASSERT_EQ(lookup.tokens.size(), requests.size());
      ASSERT_EQ(paced.tokens.size(), requests.size());
      EXPECT_GT(lookup.stats.lookup.accepted, 0);
      if (device) {
        EXPECT_GT(lookup.stats.device_sampled, 0);
      }
      int64_t all = 0;
      for (size_t i = 0; i < requests.size(); ++i) {
        ASSERT_EQ(static_cast<int64_t>(lookup.tokens[i].size()), requests[i].limit);
        ASSERT_EQ(static_cast<int64_t>(paced.tokens[i].size()), requests[i].limit);
        if (exact) {
          EXPECT_EQ(lookup.tokens[i], plain.tokens[i]) << "request " << i;
          EXPECT_EQ(paced.tokens[i], plain.tokens[i]) << "request " << i;
        }
        all += static_cast<int64_t>(plain.tokens[i].size());
      }
      const int64_t same = TokensBeforeTheFirstDifference(lookup, plain);
      std::printf(
          "%s, %s picks: lookup drafts %lld, kept %lld; tokens before the first "
          "difference %lld of %lld\n",
          exact ? "exact" : "fast", device ? "device" : "host",
          static_cast<long long>(lookup.stats.lookup.drafted),
          static_cast<long long>(lookup.stats.lookup.accepted), static_cast<long long>(same),
          static_cast<long long>(all));
    }
  }
}

// The golden hybrids (recurrent layers with per-slot states): prompts that repeat a piece,
// greedy and seeded, 4 slots sharing 12 pages (preemption). With lookup drafts the states are
// snapshotted before each step with drafts and brought back to the last kept row by a replay
// of the kept rows: in exact mode the tokens equal those without drafts (picked on the device
// and on the host), with drafts both kept and refused. In the fast mode the agreement is printed.
TEST(CudaEngine, HybridDraftsChangeNoTokens) {
  GZ_SKIP_WITHOUT_CUDA();
  for (const char* name : {"qwen3_next", "qwen3_5", "qwen3_5_moe"}) {
    const std::string dir = std::string("tests/golden/models/") + name;
    for (bool exact : {true, false}) {
      auto model = Load("cuda", exact, std::nullopt, dir);
      ASSERT_TRUE(model);
      const int64_t vocab = model->arch().vocab;
      // As the CPU engine's draft test (engine_draft_model_test.cc): a piece of 5 to 9 tokens
      // four times, or random tokens; every other request sampled with a seed.
      std::mt19937 rng(51);
      std::uniform_int_distribution<int32_t> token(10, static_cast<int32_t>(vocab) - 1);
      std::vector<Request> requests;
      for (int i = 0; i < 8; ++i) {
        Request r;
        const int period = 5 + static_cast<int>(rng() % 5);
        std::vector<int32_t> piece(period);
        for (int32_t& t : piece) t = token(rng);
        for (int p = 0; p < 4 * period; ++p)
          r.prompt.push_back(i % 3 == 2 ? token(rng) : piece[p % period]);
        r.limit = 24 + static_cast<int64_t>(rng() % 24);
        r.stop = std::vector<int32_t>{};
        r.sampling.temperature = 0.0f;
        if (i % 2 == 1) {
          r.sampling.temperature = 0.8f;
          r.sampling.top_p = 0.95f;
          r.sampling.seed = rng();
        }
        requests.push_back(r);
      }
      for (bool device : {true, false}) {
        SCOPED_TRACE(std::string(name) + (exact ? " exact" : " fast") +
                     (device ? " device" : " host"));
        auto run = [&](DraftMode draft) {
          return GenerateInFewPages(*model, requests, draft, device);
        };
        const Drafted plain = run(DraftMode::kNone);
        const Drafted lookup = run(DraftMode::kLookup);
        ASSERT_EQ(plain.tokens.size(), requests.size());
        ASSERT_EQ(lookup.tokens.size(), requests.size());
        // Drafts kept and refused (a random model keeps few: counted in exact mode, whose
        // tokens are the CPU's).
        if (exact) {
          EXPECT_GT(lookup.stats.lookup.accepted, 0);
        }
        EXPECT_GT(lookup.stats.lookup.drafted, lookup.stats.lookup.accepted);
        EXPECT_GT(lookup.stats.preemptions, 0);
        if (device) {
          EXPECT_GT(lookup.stats.device_sampled, 0);
        }
        int64_t all = 0;
        for (size_t i = 0; i < requests.size(); ++i) {
          ASSERT_EQ(static_cast<int64_t>(lookup.tokens[i].size()), requests[i].limit);
          if (exact) {
            EXPECT_EQ(lookup.tokens[i], plain.tokens[i]) << "request " << i;
          }
          all += static_cast<int64_t>(plain.tokens[i].size());
        }
        const int64_t same = TokensBeforeTheFirstDifference(lookup, plain);
        std::printf(
            "%s %s, %s picks: lookup drafts %lld, kept %lld; tokens before the first "
            "difference %lld of %lld\n",
            name, exact ? "exact" : "fast", device ? "device" : "host",
            static_cast<long long>(lookup.stats.lookup.drafted),
            static_cast<long long>(lookup.stats.lookup.accepted), static_cast<long long>(same),
            static_cast<long long>(all));
      }
    }
  }
}

// 8 requests of random tokens for models/tiny-hybrid, each to its limit (24 to 47 tokens): the
// even ones greedy, the odd ones seeded at temperature 0.8 with `top_p`.
std::vector<Request> TinyHybridRequests(uint32_t seed, float top_p) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> token(10, 4000);
  std::vector<Request> requests;
  for (int i = 0; i < 8; ++i) {
    Request r;
    r.prompt.resize(4 + rng() % 40);
    for (int32_t& t : r.prompt) t = token(rng);
    r.limit = 24 + static_cast<int64_t>(rng() % 24);
    r.stop = std::vector<int32_t>{};
    if (i % 2 == 1) {
      r.sampling.temperature = 0.8f;
      r.sampling.top_p = top_p;
      r.sampling.seed = rng();
    }
    requests.push_back(r);
  }
  return requests;
}

// models/tiny-hybrid's MTP drafts on the device (hidden states kept there, chained drafts picked
// there, the MTP runs recorded and replayed as steps): greedy and seeded requests in 4 slots of
// 12 pages (preemption). In exact mode the tokens equal those without drafts and the CPU
// engine's, picked on the device and on the host; in the fast mode the agreement is printed.
TEST(CudaEngine, TinyHybridMtpDraftsChangeNoTokens) {
  GZ_SKIP_WITHOUT_CUDA();
  const std::string dir = "models/tiny-hybrid";
  const std::vector<Request> requests = TinyHybridRequests(5, 0.95f);
  auto run = [&](Model& model, DraftMode draft, bool device) {
    return GenerateInFewPages(model, requests, draft, device);
  };
  auto cpu = Load("cpu", /*exact=*/true, std::nullopt, dir);
  ASSERT_TRUE(cpu);
  const Drafted reference = run(*cpu, DraftMode::kNone, false);
  ASSERT_EQ(reference.tokens.size(), requests.size());
  for (bool exact : {true, false}) {
    auto model = Load("cuda", exact, std::nullopt, dir);
    ASSERT_TRUE(model);
    for (bool device : {true, false}) {
      SCOPED_TRACE(std::string(exact ? "exact" : "fast") + (device ? " device" : " host"));
      const Drafted plain = run(*model, DraftMode::kNone, device);
      const Drafted mtp = run(*model, DraftMode::kMtp, device);
      ASSERT_EQ(plain.tokens.size(), requests.size());
      ASSERT_EQ(mtp.tokens.size(), requests.size());
      EXPECT_GT(mtp.stats.mtp.accepted, 0);
      EXPECT_GT(mtp.stats.mtp.drafted, mtp.stats.mtp.accepted);
      EXPECT_GT(mtp.stats.preemptions, 0);
      int64_t all = 0;
      for (size_t i = 0; i < requests.size(); ++i) {
        ASSERT_EQ(static_cast<int64_t>(mtp.tokens[i].size()), requests[i].limit);
        if (exact) {
          EXPECT_EQ(mtp.tokens[i], plain.tokens[i]) << "request " << i;
          EXPECT_EQ(mtp.tokens[i], reference.tokens[i]) << "request " << i;
        }
        all += static_cast<int64_t>(plain.tokens[i].size());
      }
      const int64_t same = TokensBeforeTheFirstDifference(mtp, plain);
      std::printf(
          "tiny-hybrid %s, %s picks: MTP drafts %lld, kept %lld; tokens before the first "
          "difference %lld of %lld\n",
          exact ? "exact" : "fast", device ? "device" : "host",
          static_cast<long long>(mtp.stats.mtp.drafted),
          static_cast<long long>(mtp.stats.mtp.accepted), static_cast<long long>(same),
          static_cast<long long>(all));
    }
  }
}

// models/tiny-hybrid/dflash's block drafts on CUDA (the target's hidden states after the chosen
// layers copied to the host drafter, its blocks embedded and read through the target's head on
// the device): greedy and seeded requests in 4 slots of 12 pages (preemption). In exact mode the
// tokens equal those without drafts and the CPU engine's, picked on the device and on the host;
// in the fast mode the agreement is printed.
TEST(CudaEngine, TinyHybridDFlashDraftsChangeNoTokens) {
  GZ_SKIP_WITHOUT_CUDA();
  const std::string dir = "models/tiny-hybrid";
  const std::vector<Request> requests = TinyHybridRequests(9, 1.0f);
  auto cpu = Load("cpu", /*exact=*/true, std::nullopt, dir);
  ASSERT_TRUE(cpu);
  const Drafted reference = GenerateInFewPages(*cpu, requests, DraftMode::kNone, false);
  ASSERT_EQ(reference.tokens.size(), requests.size());
  for (bool exact : {true, false}) {
    auto model = Load("cuda", exact, std::nullopt, dir);
    ASSERT_TRUE(model);
    auto drafter = DFlashDrafter::Open(dir + "/dflash", model.get(), 2);
    ASSERT_TRUE(drafter.ok()) << drafter.status().message();
    for (bool device : {true, false}) {
      SCOPED_TRACE(std::string(exact ? "exact" : "fast") + (device ? " device" : " host"));
      const Drafted plain = GenerateInFewPages(*model, requests, DraftMode::kNone, device);
      const Drafted block =
          GenerateInFewPages(*model, requests, DraftMode::kBlock, device, drafter->get());
      ASSERT_EQ(block.tokens.size(), requests.size());
      EXPECT_GT(block.stats.block.accepted, 0);
      EXPECT_GT(block.stats.block.drafted, block.stats.block.accepted);
      EXPECT_GT(block.stats.preemptions, 0);
      int64_t all = 0;
      for (size_t i = 0; i < requests.size(); ++i) {
        ASSERT_EQ(static_cast<int64_t>(block.tokens[i].size()), requests[i].limit);
        if (exact) {
          EXPECT_EQ(block.tokens[i], plain.tokens[i]) << "request " << i;
          EXPECT_EQ(block.tokens[i], reference.tokens[i]) << "request " << i;
        }
        all += static_cast<int64_t>(plain.tokens[i].size());
      }
      std::printf(
          "tiny-hybrid dflash %s, %s picks: drafts %lld, kept %lld; tokens before the first "
          "difference %lld of %lld\n",
          exact ? "exact" : "fast", device ? "device" : "host",
          static_cast<long long>(block.stats.block.drafted),
          static_cast<long long>(block.stats.block.accepted),
          static_cast<long long>(TokensBeforeTheFirstDifference(block, plain)),
          static_cast<long long>(all));
    }
  }
}

// Low level on the golden hybrids in exact mode: a step of a token and three drafts (beside
// another slot's row), of which Accept keeps 0 to 3; the next step's logits equal those of an
// engine that never read the drafts, within 1e-4 of the largest (the kept rows' updates run
// again from their kept inputs, in a step of other rows than the reference's).
TEST(CudaEngine, HybridAcceptRestoresTheStatesOfTheLastKeptRow) {
  GZ_SKIP_WITHOUT_CUDA();
  for (const char* name : {"qwen3_next", "qwen3_5", "qwen3_5_moe"}) {
    SCOPED_TRACE(name);
    auto model =
        Load("cuda", /*exact=*/true, std::nullopt, std::string("tests/golden/models/") + name);
    ASSERT_TRUE(model);
    const int64_t vocab = model->arch().vocab;
    auto make = [&](DraftMode draft) {
      EngineOptions options;
      options.slots = 2;
      options.context = 128;
      options.rows = 80;
      options.draft = draft;
      auto engine = Engine::Create(model.get(), options);
      EXPECT_TRUE(engine.ok()) << engine.status().message();
      return engine.ok() ? std::move(*engine) : nullptr;
    };
    auto drafting = make(DraftMode::kLookup);
    auto plain = make(DraftMode::kNone);
    ASSERT_TRUE(drafting && plain);
    std::mt19937 rng(43);
    std::uniform_int_distribution<int32_t> token(3, static_cast<int32_t>(vocab) - 1);
    std::vector<int32_t> prompt(70), step(4);  // past the delta rule's chunk of 64
    for (int32_t& t : prompt) t = token(rng);
    for (int32_t& t : step) t = token(rng);
    const int n = static_cast<int>(prompt.size());
    auto close = [](std::span<const float> ours, std::span<const float> ref,
                    const std::string& what) {
      ASSERT_EQ(ours.size(), ref.size());
      float max_ref = 0, max_diff = 0;
      for (size_t i = 0; i < ref.size(); ++i) {
        max_ref = std::max(max_ref, std::fabs(ref[i]));
        const float d = std::fabs(ours[i] - ref[i]);
        if (!(d <= max_diff)) max_diff = std::isnan(d) ? INFINITY : d;
      }
      EXPECT_GT(max_ref, 0.0f) << what;
      EXPECT_LE(max_diff, 1e-4f * max_ref) << what << ": max diff " << max_diff;
    };
    for (int kept = 0; kept <= 3; ++kept) {
      SCOPED_TRACE("kept " + std::to_string(kept));
      ASSERT_TRUE(drafting->Reset(0).ok() && drafting->Reset(1).ok() && plain->Reset(1).ok());
      ASSERT_TRUE(
          drafting->Step(prompt, std::vector<int32_t>(n, 1), std::vector<int32_t>{n - 1}).ok());
      const std::vector<int32_t> tokens = {5, step[0], step[1], step[2], step[3]};
      const std::vector<int32_t> slots = {0, 1, 1, 1, 1};
      auto verify = drafting->Step(tokens, slots, std::vector<int32_t>{1, 2, 3, 4},
                                   std::vector<int32_t>{0, 3});
      ASSERT_TRUE(verify.ok()) << verify.status().message();
      ASSERT_TRUE(drafting->Accept(1, 1 + kept).ok());
      auto after = drafting->Step(std::vector<int32_t>{17}, std::vector<int32_t>{1},
                                  std::vector<int32_t>{0});
      ASSERT_TRUE(after.ok()) << after.status().message();
      std::vector<int32_t> read = prompt;
      read.insert(read.end(), step.begin(), step.begin() + 1 + kept);
      const int m = static_cast<int>(read.size());
      ASSERT_TRUE(plain->Step(read, std::vector<int32_t>(m, 1), std::vector<int32_t>{m - 1}).ok());
      auto want =
          plain->Step(std::vector<int32_t>{17}, std::vector<int32_t>{1}, std::vector<int32_t>{0});
      ASSERT_TRUE(want.ok());
      close(*after, *want, "the step after Accept");
    }
  }
}

// Window paging on the golden Gemma models (window layers keep only their window's pages; holes
// before it in their page tables): prompt pieces of 24 rows crossing the windows' and pages'
// edges give the logits of the pool laid out as before (SequenceLogits: every layer a page of
// every position) within 1e-4 of the largest in exact mode, 1e-2 in the fast mode (fp16 pages,
// tensor-core prompt tiles); and in exact mode greedy requests several windows long, read in
// pieces beside each other under preemption, give the CPU engine's tokens.
TEST(CudaEngine, GemmaWindowPagingEqualsEveryPositionPagesAndTheCpu) {
  GZ_SKIP_WITHOUT_CUDA();
  for (const char* name : {"gemma3", "gemma3_softcap", "gemma2"}) {
    const std::string dir = std::string("tests/golden/models/") + name;
    for (bool exact : {true, false}) {
      SCOPED_TRACE(std::string(name) + (exact ? " exact" : " fast"));
      auto model = Load("cuda", exact, std::nullopt, dir);
      ASSERT_TRUE(model);
      ASSERT_TRUE(KvPagingOf(model->caches()).enabled());
      const int64_t vocab = model->arch().vocab;
      std::mt19937 rng(41);
      std::uniform_int_distribution<int32_t> token(3, static_cast<int32_t>(vocab) - 1);
      std::vector<int32_t> prompt(200);
      for (int32_t& t : prompt) t = token(rng);
      auto reference = SequenceLogits(*model, prompt, /*chunk=*/24);
      ASSERT_TRUE(reference.ok()) << reference.status().message();
      EngineOptions options;
      options.slots = 2;
      options.context = 400;
      options.rows = 24;
      options.kv_budget_bytes = 40 * model->PageBytes();
      auto engine = Engine::Create(model.get(), options);
      ASSERT_TRUE(engine.ok()) << engine.status().message();
      std::vector<float> logits;
      for (size_t begin = 0; begin < prompt.size(); begin += 24) {
        const size_t end = std::min(prompt.size(), begin + 24);
        std::vector<int32_t> piece(prompt.begin() + begin, prompt.begin() + end), wanted;
        for (size_t r = 0; r < piece.size(); ++r) wanted.push_back(static_cast<int32_t>(r));
        auto out = (*engine)->Step(piece, std::vector<int32_t>(piece.size(), 1), wanted);
        ASSERT_TRUE(out.ok()) << out.status().message();
        logits.insert(logits.end(), out->begin(), out->end());
      }
      ASSERT_EQ(logits.size(), reference->size());
      float max_ref = 0, max_diff = 0;
      for (size_t i = 0; i < logits.size(); ++i) {
        max_ref = std::max(max_ref, std::fabs((*reference)[i]));
        const float d = std::fabs(logits[i] - (*reference)[i]);
        if (!(d <= max_diff)) max_diff = std::isnan(d) ? INFINITY : d;
      }
      EXPECT_LE(max_diff, (exact ? 1e-4f : 1e-2f) * max_ref) << "max diff " << max_diff;
      if (!exact) continue;
      // Greedy requests on both backends: 5 slots, 24 rows a step, pages of one context.
      auto cpu = Load("cpu", /*exact=*/true, std::nullopt, dir);
      ASSERT_TRUE(cpu);
      std::vector<Request> requests;
      for (int i = 0; i < 8; ++i) {
        Request r;
        r.prompt.resize(5 + rng() % 90);
        for (int32_t& t : r.prompt) t = token(rng);
        r.limit = 40 + 10 * i;
        r.stop = std::vector<int32_t>{};
        r.sampling.temperature = 0.0f;
        requests.push_back(r);
      }
      auto generate = [&](Model& m, int64_t* preemptions) {
        EngineOptions o;
        o.slots = 5;
        o.context = 256;
        o.rows = 24;
        o.kv_budget_bytes = 16 * m.PageBytes();
        auto e = Engine::Create(&m, o);
        EXPECT_TRUE(e.ok()) << e.status().message();
        if (!e.ok()) return std::vector<std::vector<int32_t>>{};
        auto out = (*e)->Generate(requests);
        EXPECT_TRUE(out.ok()) << out.status().message();
        *preemptions = (*e)->stats().preemptions;
        return out.ok() ? *out : std::vector<std::vector<int32_t>>{};
      };
      int64_t cuda_preemptions = 0, cpu_preemptions = 0;
      const auto got = generate(*model, &cuda_preemptions);
      const auto want = generate(*cpu, &cpu_preemptions);
      ASSERT_EQ(got.size(), requests.size());
      EXPECT_GT(cuda_preemptions, 0);
      for (size_t i = 0; i < requests.size(); ++i) EXPECT_EQ(got[i], want[i]) << "request " << i;
    }
  }
}

}  // namespace
}  // namespace gizllm
