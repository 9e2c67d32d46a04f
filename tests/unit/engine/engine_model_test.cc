// The engine on the shipped model (models/tiny-chat, CPU backend): rows of a mixed step equal the
// same rows read one sequence at a time, concurrent greedy requests equal each request alone,
// tokens the backend picks under grammars' masks equal the host's, and a stored prefix gives the
// tokens of a cold run while reading only the rest.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "backend/cpu/cpu_isa.h"
#include "constrained_requests.h"
#include "engine/engine.h"
#include "model/evaluate.h"
#include "model/model.h"
#include "ops/device.h"

namespace gizllm {
namespace {

constexpr const char* kModel = "models/tiny-chat";

// tiny-chat on the CPU backend, loaded once for each KV page format (f32, f16, q8 and the rotated
// 8/4: 8-bit keys, 4-bit values); `bf16`: with float16 pages
// and bf16 activations (`--kv f16 --bf16`: the packed bf16 matmuls), null where the CPU lacks
// AVX-512 BF16.
Model* SharedModel(KvFormat kv = KvFormat::kF32, bool bf16 = false) {
  auto load = [](KvFormat format, bool rounded) {
    DeviceOptions device;
    device.device = "cpu";
    device.threads = 2;
    device.bf16 = rounded;
    device.exact = !rounded;  // float32 activations (the reference mode) unless rounded
    auto backend = OpenBackend(device);
    EXPECT_TRUE(backend.ok()) << backend.status().message();
    if (!backend.ok()) return std::unique_ptr<Model>();
    LoadOptions options;
    options.kv = format;
    auto m = Model::Load(kModel, *backend, options);
    EXPECT_TRUE(m.ok()) << m.status().message();
    return m.ok() ? std::move(*m) : std::unique_ptr<Model>();
  };
  if (bf16) {
    static std::unique_ptr<Model> packed =
        CpuHasAvx512Bf16() ? load(KvFormat::kF16, true) : nullptr;
    return packed.get();
  }
  static std::unique_ptr<Model> f32 = load(KvFormat::kF32, false);
  static std::unique_ptr<Model> f16 = load(KvFormat::kF16, false);
  static std::unique_ptr<Model> q8 = load(KvFormat::kQ8, false);
  static std::unique_ptr<Model> rotated = load(RotatedKv(8, 4), false);
  if (kv == RotatedKv(8, 4)) return rotated.get();
  return kv == KvFormat::kF16 ? f16.get() : kv == KvFormat::kQ8 ? q8.get() : f32.get();
}

std::unique_ptr<Engine> MakeEngine(Model* model, int32_t slots, int64_t context, int64_t rows,
                                   int32_t pages) {
  EngineOptions options;
  options.slots = slots;
  options.context = context;
  options.rows = rows;
  options.kv_budget_bytes = pages * model->PageBytes();
  // Prefixes pushed out of the pool go to host memory (which the CPU's default leaves off), so
  // that the pages' copies out and back are exercised.
  options.host_prefix_bytes = options.kv_budget_bytes;
  auto engine = Engine::Create(model, options);
  EXPECT_TRUE(engine.ok()) << engine.status().message();
  return engine.ok() ? std::move(*engine) : nullptr;
}

// Tokens past the special ones, below `vocab` (tiny-chat's 8192 unless a model has fewer).
std::vector<int32_t> RandomPrompt(std::mt19937& rng, int n, int64_t vocab = 8192) {
  std::uniform_int_distribution<int32_t> pick(10, static_cast<int32_t>(vocab) - 1);
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

// The rows of a mixed step (a decode row and prompt pieces of other slots) against the same rows
// read one sequence at a time.
void CheckMixedStep(Model* model) {
  const int64_t vocab = model->arch().vocab;
  std::mt19937 rng(21);
  // Three sequences: a, whose history is read first and then decodes one token in the mixed step;
  // b and c, whose prompts are read in pieces of the mixed step.
  const std::vector<int32_t> a = RandomPrompt(rng, 37, vocab);
  const std::vector<int32_t> b = RandomPrompt(rng, 23, vocab);
  const std::vector<int32_t> c = RandomPrompt(rng, 9, vocab);
  const int32_t next = static_cast<int32_t>(std::min<int64_t>(4242, vocab - 1));

  auto mixed = MakeEngine(model, 3, 128, 64, 32);
  ASSERT_NE(mixed, nullptr);
  std::vector<int32_t> slot0(a.size(), 0);
  ASSERT_TRUE(mixed->Step(a, slot0, {}).ok());
  // b's first 15 tokens were read in an earlier step; this step reads the rest of b.
  std::vector<int32_t> b_read(b.begin(), b.begin() + 15), b_rest(b.begin() + 15, b.end());
  ASSERT_TRUE(mixed->Step(b_read, std::vector<int32_t>(15, 1), {}).ok());
  std::vector<int32_t> tokens = {next};
  std::vector<int32_t> slots = {0};
  tokens.insert(tokens.end(), b_rest.begin(), b_rest.end());
  slots.insert(slots.end(), b_rest.size(), 1);
  tokens.insert(tokens.end(), c.begin(), c.end());
  slots.insert(slots.end(), c.size(), 2);
  // Wanted: a's decode, two rows of b's piece, and c's last row.
  const int32_t b_first = 1, c_last = static_cast<int32_t>(tokens.size()) - 1;
  std::vector<int32_t> wanted = {0, b_first, b_first + 4, c_last};
  auto logits = mixed->Step(tokens, slots, wanted);
  ASSERT_TRUE(logits.ok()) << logits.status().message();

  // The same rows, one sequence per engine, each history read in one piece.
  auto alone = [&](const std::vector<int32_t>& history, std::vector<int32_t> rows) {
    auto engine = MakeEngine(model, 1, 128, 64, 32);
    auto out = engine->Step(history, std::vector<int32_t>(history.size(), 0), rows);
    EXPECT_TRUE(out.ok()) << out.status().message();
    return out.ok() ? *out : std::vector<float>();
  };
  std::vector<int32_t> a_next = a;
  a_next.push_back(next);
  auto ra = alone(a_next, {static_cast<int32_t>(a.size())});
  auto rb = alone(b, {15, 19});
  auto rc = alone(c, {static_cast<int32_t>(c.size()) - 1});
  std::span<const float> all(*logits);
  ExpectClose(all.subspan(0, vocab), ra, "a decode");
  ExpectClose(all.subspan(vocab, vocab), std::span<const float>(rb).first(vocab), "b row 15");
  ExpectClose(all.subspan(2 * vocab, vocab), std::span<const float>(rb).subspan(vocab), "b row 19");
  ExpectClose(all.subspan(3 * vocab, vocab), rc, "c last");
}

TEST(EngineModel, MixedStepRowsEqualSingleSequenceRows) {
  for (KvFormat kv : {KvFormat::kF32, KvFormat::kQ8, RotatedKv(8, 4)}) {
    SCOPED_TRACE(KvFormatName(kv));
    Model* model = SharedModel(kv);
    ASSERT_NE(model, nullptr);
    CheckMixedStep(model);
  }
}

// The packed bf16 matmuls (tiles of 1, 2, 4 and 8 rows, several tiles a panel) and float16
// pages: a row's logits do not depend on the rows beside it either.
TEST(EngineModel, MixedStepRowsEqualSingleSequenceRowsWithBf16) {
  if (!CpuHasAvx512Bf16()) GTEST_SKIP() << "this CPU has no AVX-512 BF16";
  Model* model = SharedModel(KvFormat::kF16, /*bf16=*/true);
  ASSERT_NE(model, nullptr);
  CheckMixedStep(model);
}

// With every KV page format.
// Greedy requests arriving over several steps, 6 slots of up to 64 positions sharing 6 pages (a
// tenth of what they could use: preemption), against each request alone.
void CheckConcurrentGreedy(Model* model) {
  const int64_t vocab = model->arch().vocab;
  std::mt19937 rng(22);
  std::vector<Request> requests;
  std::vector<int> arrival;
  const int n = 10;
  for (int i = 0; i < n; ++i) {
    Request r;
    r.prompt = RandomPrompt(rng, 16 + rng() % 30, vocab);
    r.limit = 8 + rng() % 16;
    r.sampling.temperature = 0.0f;
    r.stop = std::vector<int32_t>{};
    requests.push_back(r);
    arrival.push_back(rng() % 8);
  }
  auto engine = MakeEngine(model, 6, 64, 32, 6);
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
  EXPECT_GT(engine->stats().preemptions, 0);
  auto single = MakeEngine(model, 1, 64, 64, 4);
  for (auto& [id, i] : index) {
    auto out = single->Generate({requests[i]});
    ASSERT_TRUE(out.ok());
    EXPECT_EQ(got[id], (*out)[0]) << "request " << i;
  }
}

TEST(EngineModel, ConcurrentGreedyEqualsAloneUnderPreemption) {
  for (int config = 0; config < 5; ++config) {
    // f32 pages, f16 pages, f16 pages with the packed bf16 matmuls, q8 pages, rotated 8/4 pages.
    const KvFormat kv = config == 0   ? KvFormat::kF32
                        : config == 3 ? KvFormat::kQ8
                        : config == 4 ? RotatedKv(8, 4)
                                      : KvFormat::kF16;
    const bool bf16 = config == 2;
    if (bf16 && !CpuHasAvx512Bf16()) continue;
    SCOPED_TRACE(KvFormatName(kv) + (bf16 ? " bf16" : ""));
    Model* model = SharedModel(kv, bf16);
    ASSERT_NE(model, nullptr);
    CheckConcurrentGreedy(model);
  }
}

// A batch of requests under a JSON schema, under a GBNF grammar and free: the tokens the backend
// picks (the constrained rows under the masks the engine hands it once the step is issued) are
// the host Sampler's, greedy and seeded sampled, and the constrained answers are text their
// grammar allows.
TEST(EngineModel, PicksUnderMasksEqualHostPicks) {
  Model* model = SharedModel();
  ASSERT_NE(model, nullptr);
  ASSERT_TRUE(model->CanSample());
  const int64_t vocab = model->arch().vocab;
  auto schema = ConstrainedGrammar(kModel, vocab, /*json_schema=*/true);
  auto gbnf = ConstrainedGrammar(kModel, vocab, /*json_schema=*/false);
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
      options.kv_budget_bytes = 48 * model->PageBytes();
      options.device_sampling = device;
      options.mask_threads = 2;
      auto engine = Engine::Create(model, options);
      ASSERT_TRUE(engine.ok()) << engine.status().message();
      auto got = (*engine)->Generate(requests);
      ASSERT_TRUE(got.ok()) << got.status().message();
      out[device] = std::move(*got);
      stats[device] = (*engine)->stats();
    }
    EXPECT_EQ(stats[false].device_sampled, 0);
    EXPECT_EQ(stats[true].device_sampled, stats[true].steps);
    EXPECT_GT(stats[true].masks_on_device, 100);
    EXPECT_EQ(stats[true].masks_on_device, stats[true].masks_beside_step);
    int64_t constrained = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
      EXPECT_EQ(out[true][i], out[false][i]) << "request " << i;
      EXPECT_FALSE(out[true][i].empty()) << "request " << i;
      if (requests[i].sampling.grammar) {
        EXPECT_TRUE(Allowed(*requests[i].sampling.grammar, out[true][i])) << "request " << i;
        constrained += static_cast<int64_t>(out[true][i].size());
      }
    }
    EXPECT_GT(constrained, 100);
  }
}

// Kept in a slot, or (one slot, a pool of 5 pages of 16 positions) pushed to host memory by another
// request and copied back: every page format's keys, values and scales come back as they were.
// A 40-token prompt and its 10 tokens, kept in a slot or (`host`: one slot, a pool of 5 pages)
// pushed to host memory by another request and copied back, then extended: the warm request
// reads only the new tokens and gives the cold request's tokens.
void CheckStoredPrefix(Model* model, bool host) {
  const int64_t vocab = model->arch().vocab;
  std::mt19937 rng(23);
  Request first;
  first.prompt = RandomPrompt(rng, 40, vocab);
  first.limit = 10;
  first.sampling.temperature = 0.0f;
  first.stop = std::vector<int32_t>{};
  auto engine = host ? MakeEngine(model, 1, 80, 64, 5) : MakeEngine(model, 2, 128, 64, 16);
  auto a = engine->Generate({first});
  ASSERT_TRUE(a.ok());
  ASSERT_EQ((*a)[0].size(), 10u);
  if (host) {
    Request other = first;
    other.prompt = RandomPrompt(rng, 40, vocab);
    ASSERT_TRUE(engine->Generate({other}).ok());
    EXPECT_GT(engine->stats().host_copies, 0);
  }
  Request next = first;
  next.prompt.insert(next.prompt.end(), (*a)[0].begin(), (*a)[0].end());
  const auto more = RandomPrompt(rng, 6, vocab);
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

// Kept in a slot, or pushed to host memory and copied back: every page format's keys, values and
// scales come back as they were.
TEST(EngineModel, StoredPrefixGivesColdTokensAndReadsOnlyTheRest) {
  for (KvFormat kv : {KvFormat::kF32, KvFormat::kF16, KvFormat::kQ8, RotatedKv(8, 4)}) {
    for (bool host : {false, true}) {
      SCOPED_TRACE(KvFormatName(kv) + (host ? " host" : " slot"));
      Model* model = SharedModel(kv);
      ASSERT_NE(model, nullptr);
      CheckStoredPrefix(model, host);
    }
  }
}

// Gemma 3's golden model (tests/golden/models/gemma3: sliding-window layers of 8 positions beside
// global ones, 4 layers): mixed steps, preemption, chunked prompts and reused prefixes all cross
// the window's edge, and give what one sequence read alone gives.
Model* GemmaModel() {
  static std::unique_ptr<Model> model = [] {
    DeviceOptions device;
    device.exact = true;  // float32 activations (the reference mode)
    device.device = "cpu";
    device.threads = 2;
    auto backend = OpenBackend(device);
    EXPECT_TRUE(backend.ok()) << backend.status().message();
    auto m = Model::Load("tests/golden/models/gemma3", *backend);
    EXPECT_TRUE(m.ok()) << m.status().message();
    return m.ok() ? std::move(*m) : std::unique_ptr<Model>();
  }();
  return model.get();
}

TEST(EngineModel, Gemma3MixedStepsPreemptionAndStoredPrefixes) {
  Model* model = GemmaModel();
  ASSERT_NE(model, nullptr);
  ASSERT_EQ(model->arch().layer[0].attention.window, 8);
  {
    SCOPED_TRACE("mixed step");
    CheckMixedStep(model);
  }
  {
    SCOPED_TRACE("preemption");
    CheckConcurrentGreedy(model);
  }
  for (bool host : {false, true}) {
    SCOPED_TRACE(host ? "stored prefix, host" : "stored prefix, slot");
    CheckStoredPrefix(model, host);
  }
}

// A copy of tiny-chat in a temporary folder whose tensor `name` holds a bf16 NaN at element 5.
class PoisonedModel {
 public:
  explicit PoisonedModel(const std::string& name) {
    dir_ = std::filesystem::temp_directory_path() /
           ("gizllm_poisoned_" + std::to_string(::getpid()) + "_" + name);
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    for (const char* file :
         {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"}) {
      std::filesystem::copy_file(std::string(kModel) + "/" + file, dir_ / file);
    }
    std::ifstream in(std::string(kModel) + "/model.safetensors", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    const auto header = nlohmann::json::parse(bytes.substr(8, n));
    const size_t at = 8 + n + header.at(name).at("data_offsets")[0].get<size_t>() + 2 * 5;
    bytes[at] = '\xc0';  // bf16 0x7fc0, little-endian: a quiet NaN
    bytes[at + 1] = '\x7f';
    std::ofstream(dir_ / "model.safetensors", std::ios::binary) << bytes;
  }
  ~PoisonedModel() { std::filesystem::remove_all(dir_); }
  std::string dir() const { return dir_.string(); }

 private:
  std::filesystem::path dir_;
};

std::unique_ptr<Model> LoadOnCpu(const std::string& dir, Status* status) {
  DeviceOptions device;
  device.exact = true;  // float32 activations (the reference mode)
  device.device = "cpu";
  device.threads = 2;
  auto backend = OpenBackend(device);
  EXPECT_TRUE(backend.ok()) << backend.status().message();
  auto m = Model::Load(dir, *backend, LoadOptions{});
  *status = m.status();
  return m.ok() ? std::move(*m) : nullptr;
}

// The golden Gemma models (sliding windows of 8 or 5 positions: Gemma 3's three window layers
// beside one global one, three window groups of one region; Gemma 2's alternating ones, one group
// of two regions) under window paging, against the pool laid out as before it (every layer a page
// of every position, SequenceLogits): prompt pieces of 24 rows crossing the windows' and pages'
// edges give the same logits bit for bit; a greedy answer several windows long gives the tokens
// of those logits' argmax, while the window layers' pages of its slot stay within the window's
// blocks; every page is free at the end.
TEST(EngineModel, GemmaWindowPagingEqualsEveryPositionPages) {
  for (const char* name : {"gemma3", "gemma3_softcap", "gemma2"}) {
    SCOPED_TRACE(name);
    Status status;
    std::unique_ptr<Model> model = LoadOnCpu(std::string("tests/golden/models/") + name, &status);
    ASSERT_NE(model, nullptr) << status.message();
    const KvPaging paging = KvPagingOf(model->caches());
    ASSERT_TRUE(paging.enabled());
    ASSERT_LE(paging.window, 8);  // prompts and answers many windows long
    const int64_t vocab = model->arch().vocab;
    std::mt19937 rng(24);
    const std::vector<int32_t> prompt = RandomPrompt(rng, 200, vocab);
    auto reference = SequenceLogits(*model, prompt, /*chunk=*/24);
    ASSERT_TRUE(reference.ok()) << reference.status().message();

    const int32_t pages = 40;  // of every layer: 40 * (layers / regions) pool pages
    auto engine = MakeEngine(model.get(), 2, 400, 24, pages);
    ASSERT_NE(engine, nullptr);
    EXPECT_EQ(engine->pages(), pages * model->PageBytes() / paging.page_bytes);
    std::vector<float> logits;
    for (size_t begin = 0; begin < prompt.size(); begin += 24) {
      const size_t end = std::min(prompt.size(), begin + 24);
      std::vector<int32_t> piece(prompt.begin() + begin, prompt.begin() + end), wanted;
      for (size_t r = 0; r < piece.size(); ++r) wanted.push_back(static_cast<int32_t>(r));
      auto out = engine->Step(piece, std::vector<int32_t>(piece.size(), 1), wanted);
      ASSERT_TRUE(out.ok()) << out.status().message();
      logits.insert(logits.end(), out->begin(), out->end());
      Status check = engine->CheckPages();
      ASSERT_TRUE(check.ok()) << check.message();
    }
    EXPECT_EQ(logits, *reference);
    ASSERT_TRUE(engine->Reset(1).ok());

    Request r;
    r.prompt = std::vector<int32_t>(prompt.begin(), prompt.begin() + 30);
    r.limit = 120;
    r.sampling.temperature = 0.0f;
    r.stop = std::vector<int32_t>{};
    ASSERT_TRUE(engine->Add(r).ok());
    std::vector<int32_t> answer;
    while (engine->Busy()) {
      auto progress = engine->Advance();
      ASSERT_TRUE(progress.ok()) << progress.status().message();
      for (const Progress& p : *progress) {
        answer.insert(answer.end(), p.tokens.begin(), p.tokens.end());
      }
      Status check = engine->CheckPages();
      ASSERT_TRUE(check.ok()) << check.message();
      const int64_t held = static_cast<int64_t>(engine->held(0).size());
      if (held > 30) {
        EXPECT_LE(engine->pages() - engine->free_pages() - PagesFor(held),
                  paging.window_groups * (PagesFor(paging.window) + 2))
            << "at " << held;
      }
    }
    ASSERT_EQ(answer.size(), 120u);
    std::vector<int32_t> all = r.prompt;
    all.insert(all.end(), answer.begin(), answer.end());
    auto full = SequenceLogits(*model, all);
    ASSERT_TRUE(full.ok()) << full.status().message();
    for (size_t i = 0; i < answer.size(); ++i) {
      const float* row = full->data() + (r.prompt.size() - 1 + i) * vocab;
      EXPECT_EQ(answer[i], std::max_element(row, row + vocab) - row) << "answer token " << i;
    }
    engine->DropCaches();
    EXPECT_EQ(engine->free_pages(), engine->pages());
  }
}

// A NaN weight in a linear (not scanned at load) makes every logit NaN: a request ends with an
// error, not with text, and SequenceLogits fails naming the position.
// A format set after load (what --kv auto does once it knows the budget) is the one the pages
// hold: the logits equal those of a model loaded with it; once the pool exists it stays.
TEST(EngineModel, KvFormatSetAfterLoadIsThePagesFormat) {
  DeviceOptions device;
  device.device = "cpu";
  device.threads = 2;
  device.exact = true;
  auto backend = OpenBackend(device);
  ASSERT_TRUE(backend.ok());
  auto loaded = Model::Load(kModel, *backend);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  Model& model = **loaded;
  ASSERT_EQ(model.kv_format(), KvFormat::kF32);
  EXPECT_EQ(model.PositionBytes(KvFormat::kF32) * kPage, model.PageBytes());
  EXPECT_LT(model.PositionBytes(RotatedKv(8, 4)), model.PositionBytes(KvFormat::kF16));
  ASSERT_TRUE(model.SetKvFormat(RotatedKv(8, 4)).ok());
  EXPECT_EQ(model.kv_format(), RotatedKv(8, 4));
  EXPECT_EQ(model.PositionBytes(RotatedKv(8, 4)) * kPage, model.PageBytes());

  std::mt19937 rng(5);
  const std::vector<int32_t> prompt = RandomPrompt(rng, 40);
  std::vector<int32_t> rows(prompt.size());
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int32_t>(i);
  auto logits = [&](Model* m) {
    auto engine = MakeEngine(m, 1, 64, 64, 8);
    auto out = engine->Step(prompt, std::vector<int32_t>(prompt.size(), 0), rows);
    EXPECT_TRUE(out.ok()) << out.status().message();
    return out.ok() ? *out : std::vector<float>();
  };
  const std::vector<float> set = logits(&model);
  const std::vector<float> at_load = logits(SharedModel(RotatedKv(8, 4)));
  EXPECT_EQ(set, at_load);
  EXPECT_NE(set, logits(SharedModel(KvFormat::kF32)));
  const Status again = model.SetKvFormat(KvFormat::kF16);
  EXPECT_FALSE(again.ok());
  EXPECT_NE(again.message().find("allocated"), std::string::npos) << again.message();
  EXPECT_EQ(model.kv_format(), RotatedKv(8, 4));
}

TEST(EngineModel, NanWeightEndsTheRequestWithAnError) {
  PoisonedModel poisoned("model.layers.2.mlp.down_proj.weight");
  Status status;
  std::unique_ptr<Model> model = LoadOnCpu(poisoned.dir(), &status);
  ASSERT_NE(model, nullptr) << status.message();
  for (float temperature : {0.0f, 0.8f}) {
    auto engine = MakeEngine(model.get(), 2, 64, 32, 16);
    ASSERT_NE(engine, nullptr);
    Request r;
    r.prompt = {100, 200, 300};
    r.limit = 8;
    r.sampling.temperature = temperature;
    auto id = engine->Add(r);
    ASSERT_TRUE(id.ok());
    auto progress = engine->Advance();
    ASSERT_TRUE(progress.ok()) << progress.status().message();
    ASSERT_EQ(progress->size(), 1u);
    EXPECT_EQ((*progress)[0].end, "error");
    EXPECT_TRUE((*progress)[0].tokens.empty());
    EXPECT_NE((*progress)[0].status.message().find("NaN or infinity"), std::string::npos)
        << (*progress)[0].status.message();
    EXPECT_FALSE(engine->Busy());
  }
  const std::vector<int32_t> ids = {100, 200, 300};
  auto logits = SequenceLogits(*model, ids);
  ASSERT_FALSE(logits.ok());
  EXPECT_NE(logits.status().message().find("logits at position 0 hold NaN or infinity"),
            std::string::npos)
      << logits.status().message();
}

// A NaN in a norm (small tensors, scanned at every load) stops the load, naming the tensor.
TEST(EngineModel, NanNormIsRefusedAtLoad) {
  PoisonedModel poisoned("model.layers.4.input_layernorm.weight");
  Status status;
  EXPECT_EQ(LoadOnCpu(poisoned.dir(), &status), nullptr);
  EXPECT_NE(status.message().find("tensor model.layers.4.input_layernorm.weight holds NaN at "
                                  "element 5"),
            std::string::npos)
      << status.message();
}

}  // namespace
}  // namespace gizllm
