// Pipeline stages (model/pipeline_runner.h) on CPU backends in float32: a model cut into 2 and 3
// stages gives the logits of the whole model bit for bit on the same rows (a prompt step, then
// decode steps; picture rows with deepstack features across the stages), its hidden states and
// KV pages (a page's host copy is the whole model's, byte for byte, and comes back), and the same
// greedy tokens through the engine: on the shipped tiny-chat (dense; as a GGUF file too), the
// golden Gemma 3 (window layers, which a pipeline pages at every position) and Qwen3-MoE, and
// models/tiny-hybrid (recurrent states per stage, its MTP layer on the last stage, MTP drafts).
// On CUDA where a GPU is found: two stages on one GPU, and on two GPUs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "gguf_from_hf.h"
#include "model/model.h"
#include "model/pipeline_runner.h"
#include "ops/device.h"

namespace gizllm {
namespace {

constexpr const char* kTinyChat = "models/tiny-chat";
constexpr const char* kTinyHybrid = "models/tiny-hybrid";
constexpr const char* kGemma3 = "tests/golden/models/gemma3";

DeviceOptions Exact() {
  DeviceOptions device;
  device.device = "cpu";
  device.threads = 2;
  device.exact = true;  // float32 activations
  return device;
}

// The same on CUDA (exact mode), GPU `gpu`.
DeviceOptions ExactCuda(int gpu = 0) {
  DeviceOptions device;
  device.device = "cuda";
  device.exact = true;
  device.gpu = gpu;
  return device;
}

std::unique_ptr<Model> LoadWhole(const std::string& dir, const DeviceOptions& device = Exact()) {
  auto backend = OpenBackend(device);
  EXPECT_TRUE(backend.ok()) << backend.status().message();
  if (!backend.ok()) return nullptr;
  auto model = Model::Load(dir, *backend);
  EXPECT_TRUE(model.ok()) << model.status().message();
  return model.ok() ? std::move(*model) : nullptr;
}

// `stages` stages, on the CPU, or on CUDA on the GPUs `gpus` names.
std::unique_ptr<PipelineRunner> LoadStages(const std::string& dir, int stages,
                                           std::vector<int> cuts = {},
                                           const DeviceOptions& device = Exact(),
                                           std::vector<int> gpus = {}) {
  if (gpus.empty()) gpus.assign(stages, 0);
  auto backends = OpenStageBackends(device, gpus);
  EXPECT_TRUE(backends.ok()) << backends.status().message();
  if (!backends.ok()) return nullptr;
  auto pipeline = LoadPipeline(dir, *backends, {}, cuts);
  EXPECT_TRUE(pipeline.ok()) << pipeline.status().message();
  return pipeline.ok() ? std::move(*pipeline) : nullptr;
}

// Equal within 1e-5 of the largest reference value, and bit for bit where `bits`.
void ExpectSame(const std::vector<float>& ours, const std::vector<float>& ref,
                const std::string& what, bool bits = true) {
  ASSERT_EQ(ours.size(), ref.size()) << what;
  float max_ref = 0, max_diff = 0;
  int64_t differ = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(ref[i]));
    const float d = std::fabs(ours[i] - ref[i]);
    if (!(d <= max_diff)) max_diff = std::isnan(d) ? INFINITY : d;
    differ += std::memcmp(&ours[i], &ref[i], sizeof(float)) != 0;
  }
  EXPECT_GT(max_ref, 0.0f) << what;
  EXPECT_LE(max_diff, 1e-5f * max_ref) << what << ": max diff " << max_diff;
  if (bits) {
    EXPECT_EQ(differ, 0) << what << ": " << differ << " of " << ref.size()
                         << " values not bit-identical (max diff " << max_diff << ")";
  }
}

// Two slots: slot 0 reads a prompt of 21 tokens in one step (every row's logits), slot 1 one of
// 9; then 6 decode steps of both, each reading the greedy pick of the step before. Returns every
// step's logits in order.
std::vector<std::vector<float>> PromptAndDecode(Runner& runner) {
  const int32_t vocab = static_cast<int32_t>(runner.arch().vocab);
  const int32_t max_pages = 4;
  const int32_t pages = 2 * max_pages;
  std::vector<int32_t> table(2 * max_pages);
  for (int32_t i = 0; i < 2 * max_pages; ++i) table[i] = (i * 5 + 3) % pages;  // shuffled
  PageTables tables{table.data(), 2, max_pages};
  std::vector<std::vector<float>> out;
  Status s = runner.AllocatePages(pages);
  EXPECT_TRUE(s.ok()) << s.message();
  if (!s.ok()) return out;
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> pick(3, vocab - 1);
  Rows rows;
  for (int p = 0; p < 21; ++p) rows.Push(pick(rng), 0, p, /*want=*/true);
  for (int p = 0; p < 9; ++p) rows.Push(pick(rng), 1, p, /*want=*/p == 8);
  int32_t length[2] = {21, 9};
  for (int step = 0; step < 7; ++step) {
    std::vector<float> logits(rows.wanted.size() * vocab);
    s = runner.Step(rows, tables, logits.data());
    EXPECT_TRUE(s.ok()) << s.message();
    if (!s.ok()) return out;
    // The greedy picks of each slot's last row.
    const size_t w = rows.wanted.size();
    int32_t next[2];
    for (int slot = 0; slot < 2; ++slot) {
      const float* row = logits.data() + (slot == 0 ? w - 2 : w - 1) * vocab;
      next[slot] = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
    }
    out.push_back(std::move(logits));
    rows.Clear();
    for (int slot = 0; slot < 2; ++slot) rows.Push(next[slot], slot, length[slot]++, true);
  }
  return out;
}

void CheckLogits(const std::string& dir, int stages, std::vector<int> cuts = {},
                 const DeviceOptions& device = Exact(), std::vector<int> gpus = {}) {
  SCOPED_TRACE(dir + ", " + std::to_string(stages) + " stages");
  auto whole = LoadWhole(dir, device);
  auto pipeline = LoadStages(dir, stages, cuts, device, gpus);
  ASSERT_NE(whole, nullptr);
  ASSERT_NE(pipeline, nullptr);
  ASSERT_EQ(pipeline->stages(), stages);
  EXPECT_EQ(pipeline->PageBytes(), whole->PageBytes());
  ASSERT_EQ(pipeline->caches().size(), whole->caches().size());
  EXPECT_EQ(pipeline->HasMtp(), whole->HasMtp());
  const auto ref = PromptAndDecode(*whole);
  const auto ours = PromptAndDecode(*pipeline);
  ASSERT_EQ(ref.size(), 7u);
  ASSERT_EQ(ours.size(), ref.size());
  for (size_t step = 0; step < ref.size(); ++step) {
    // On CUDA a stage's matmuls may take other algorithms than the whole model's.
    ExpectSame(ours[step], ref[step], "step " + std::to_string(step),
               /*bits=*/device.device == "cpu");
  }
}

TEST(Pipeline, BoundsSplitEvenlyOrAtCuts) {
  auto even = PipelineBounds(7, 3);
  ASSERT_TRUE(even.ok());
  EXPECT_EQ(*even, (std::vector<int>{0, 3, 5, 7}));
  auto one = PipelineBounds(4, 1);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(*one, (std::vector<int>{0, 4}));
  const int cuts[] = {1, 3};
  auto cut = PipelineBounds(4, 3, cuts);
  ASSERT_TRUE(cut.ok());
  EXPECT_EQ(*cut, (std::vector<int>{0, 1, 3, 4}));
  EXPECT_FALSE(PipelineBounds(3, 4).ok());  // more stages than layers
  EXPECT_FALSE(PipelineBounds(3, 0).ok());
  const int backwards[] = {3, 1};
  EXPECT_FALSE(PipelineBounds(4, 3, backwards).ok());
  const int outside[] = {4};
  EXPECT_FALSE(PipelineBounds(4, 2, outside).ok());
  const int too_few[] = {2};
  EXPECT_FALSE(PipelineBounds(4, 3, too_few).ok());
}

TEST(Pipeline, RefusesMoreStagesThanLayers) {
  auto backends = OpenStageBackends(Exact(), std::vector<int>(5, 0));
  ASSERT_TRUE(backends.ok());
  auto pipeline = LoadPipeline(kTinyHybrid, *backends);  // 4 layers
  ASSERT_FALSE(pipeline.ok());
  EXPECT_NE(pipeline.status().message().find("more stages than"), std::string::npos)
      << pipeline.status().message();
}

TEST(Pipeline, StageLoadsOnlyItsLayers) {
  auto backends = OpenStageBackends(Exact(), std::vector<int>(2, 0));
  ASSERT_TRUE(backends.ok());
  auto pipeline = LoadPipeline(kTinyChat, *backends);
  ASSERT_TRUE(pipeline.ok()) << pipeline.status().message();
  auto whole = LoadWhole(kTinyChat);
  ASSERT_NE(whole, nullptr);
  const Model& first = (*pipeline)->stage(0);
  const Model& last = (*pipeline)->stage(1);
  EXPECT_EQ(first.first_layer(), 0);
  EXPECT_EQ(first.end_layer(), 4);
  EXPECT_EQ(last.first_layer(), 4);
  EXPECT_EQ(last.end_layer(), whole->arch().layers);
  // Each stage's tensors: its layers', the embedding on the first, the final norm on the last
  // (tiny-chat ties its head to the embedding, so the last holds the embedding as well).
  auto names = [](const Model& m) {
    std::vector<std::string> out;
    for (const WeightSummary& w : m.weights()) out.push_back(w.name);
    return out;
  };
  auto holds = [](const std::vector<std::string>& all, const std::string& part) {
    return std::any_of(all.begin(), all.end(),
                       [&](const std::string& n) { return n.find(part) != std::string::npos; });
  };
  const auto a = names(first), b = names(last);
  for (int l = 0; l < 8; ++l) {
    const std::string layer = "layers." + std::to_string(l) + ".";
    EXPECT_EQ(holds(a, layer), l < 4) << layer;
    EXPECT_EQ(holds(b, layer), l >= 4) << layer;
  }
  EXPECT_TRUE(holds(a, "embed_tokens"));
  EXPECT_FALSE(holds(a, "model.norm"));
  EXPECT_TRUE(holds(b, "model.norm"));
  EXPECT_TRUE(holds(b, "embed_tokens"));  // the tied head
  const int64_t embedding = whole->arch().vocab * whole->arch().dim;
  EXPECT_EQ(first.Parameters() + last.Parameters(), whole->Parameters() + embedding);
}

TEST(Pipeline, DenseLogitsEqualTheWholeModel) {
  CheckLogits(kTinyChat, 1);  // one stage: the runner around a whole model
  CheckLogits(kTinyChat, 2);
  CheckLogits(kTinyChat, 3);
}

TEST(Pipeline, WindowLayersLogitsEqualTheWholeModel) { CheckLogits(kGemma3, 2); }

TEST(Pipeline, HybridLogitsEqualTheWholeModel) {
  CheckLogits(kTinyHybrid, 2);                          // [0, 2) [2, 4)
  CheckLogits(kTinyHybrid, 3, std::vector<int>{1, 2});  // a stage of the attention layer alone
  CheckLogits("tests/golden/models/qwen3_next", 2);     // mixtures with a shared expert
}

// Recurrent states saved and restored: every stage its own layers'. A slot reads a prompt, saves
// its states, reads more, restores them and reads the same rows again: the same logits, the
// whole model's.
TEST(Pipeline, SlotStatesComeBack) {
  auto whole = LoadWhole(kTinyHybrid);
  auto pipeline = LoadStages(kTinyHybrid, 2);
  ASSERT_NE(whole, nullptr);
  ASSERT_NE(pipeline, nullptr);
  std::vector<int32_t> table = {0, 1, 2, 3};
  PageTables tables{table.data(), 1, 4};
  auto run = [&](Runner& r) {
    EXPECT_TRUE(r.AllocatePages(4).ok());
    EXPECT_TRUE(r.Reserve(32, 1, 4).ok());
    Rows prompt, more;
    for (int p = 0; p < 20; ++p) prompt.Push((p * 7 + 2) % 40, 0, p, false);
    for (int p = 20; p < 26; ++p) more.Push((p * 5 + 1) % 40, 0, p, true);
    std::vector<float> first(more.wanted.size() * r.arch().vocab), again(first.size());
    EXPECT_TRUE(r.Step(prompt, tables, nullptr).ok());
    EXPECT_TRUE(r.SaveSlotState(0).ok());
    EXPECT_TRUE(r.Step(more, tables, first.data()).ok());
    EXPECT_TRUE(r.RestoreSlotState(0).ok());
    EXPECT_TRUE(r.Step(more, tables, again.data()).ok());
    EXPECT_EQ(again, first);
    return again;
  };
  ExpectSame(run(*pipeline), run(*whole), "after the restored states");
}

// A GGUF file (tiny-chat's, its linears as stored): the stages count its layers as Load does.
TEST(Pipeline, GgufLogitsEqualTheWholeModel) {
  const std::string gguf = (std::filesystem::temp_directory_path() /
                            ("gizllm_pipeline_test_" + std::to_string(::getpid()) + ".gguf"))
                               .string();
  ASSERT_TRUE(testing::WriteGgufFromHf(kTinyChat, gguf, testing::GgufLinears::kAsStored).ok());
  CheckLogits(gguf, 3);
  std::filesystem::remove(gguf);
}

TEST(Pipeline, MoeLogitsEqualTheWholeModel) { CheckLogits("tests/golden/models/qwen3_moe", 2); }

// Picture rows on a text model: the tower's rows in place of their placeholders' embeddings (the
// first stage's) and deepstack features added after layers 0 to 5 (both stages' layers).
TEST(Pipeline, PictureRowsEqualTheWholeModel) {
  auto whole = LoadWhole(kTinyChat);
  auto pipeline = LoadStages(kTinyChat, 2);
  ASSERT_NE(whole, nullptr);
  ASSERT_NE(pipeline, nullptr);
  const int64_t dim = whole->arch().dim;
  std::mt19937 rng(3);
  std::normal_distribution<float> value(0.0f, 0.05f);
  Rows rows;
  for (int p = 0; p < 12; ++p) rows.Push(100 + p, 0, p, true);
  rows.visual.rows = {3, 4, 5, 6};
  rows.visual.layers = 6;
  rows.visual.embeddings.resize(4 * dim);
  rows.visual.deepstack.resize(6 * 4 * dim);
  for (float& v : rows.visual.embeddings) v = value(rng);
  for (float& v : rows.visual.deepstack) v = value(rng);
  std::vector<int32_t> table = {0};
  PageTables tables{table.data(), 1, 1};
  auto logits = [&](Runner& r, const Rows& step) {
    std::vector<float> out(step.wanted.size() * r.arch().vocab);
    EXPECT_TRUE(r.AllocatePages(1).ok());
    const Status s = r.Step(step, tables, out.data());
    EXPECT_TRUE(s.ok()) << s.message();
    return out;
  };
  const std::vector<float> ref = logits(*whole, rows);
  ExpectSame(logits(*pipeline, rows), ref, "picture rows");
  // And they are read: the text rows alone give other logits.
  Rows text = rows;
  text.visual.Clear();
  EXPECT_NE(logits(*pipeline, text), ref);
}

// Hidden states: each index from the stage that writes it, in the order asked.
TEST(Pipeline, HiddenStatesEqualTheWholeModel) {
  auto whole = LoadWhole(kTinyHybrid);
  auto pipeline = LoadStages(kTinyHybrid, 3);
  ASSERT_NE(whole, nullptr);
  ASSERT_NE(pipeline, nullptr);
  const int layers = whole->arch().layers;
  const std::vector<int> asked = {layers + 1, 0, 2, 1, layers, 3, 0};
  Rows rows;
  for (int p = 0; p < 11; ++p) rows.Push((p * 7 + 3) % 40, 0, p, false);
  std::vector<int32_t> table = {1, 0};
  PageTables tables{table.data(), 1, 2};
  auto hidden = [&](Runner& r) {
    std::vector<float> out(asked.size() * rows.size() * r.arch().dim);
    EXPECT_TRUE(r.AllocatePages(2).ok());
    Status s = r.Hidden(rows, tables, asked, out.data());
    EXPECT_TRUE(s.ok()) << s.message();
    return out;
  };
  ExpectSame(hidden(*pipeline), hidden(*whole), "hidden states");
  std::vector<float> out(rows.size() * whole->arch().dim);
  const int outside[] = {layers + 2};
  EXPECT_FALSE(pipeline->Hidden(rows, tables, outside, out.data()).ok());
}

// A page's host copy: each stage's part in stage order, which is the whole model's layout
// (its layers' regions in layer order, the MTP layer's last); back into another page it reads
// the same.
TEST(Pipeline, PageCopiesAreTheWholeModelsAndComeBack) {
  for (const char* dir : {kTinyChat, kTinyHybrid}) {
    SCOPED_TRACE(dir);
    auto whole = LoadWhole(dir);
    auto pipeline = LoadStages(dir, 2);
    ASSERT_NE(whole, nullptr);
    ASSERT_NE(pipeline, nullptr);
    const int64_t bytes = whole->PageBytes();
    ASSERT_EQ(pipeline->PageBytes(), bytes);
    Rows rows;
    for (int p = 0; p < 20; ++p) rows.Push((p * 11 + 4) % 40, 0, p, p == 19);
    std::vector<int32_t> table = {2, 0};
    PageTables tables{table.data(), 1, 2};
    auto fill = [&](Runner& r) {
      EXPECT_TRUE(r.AllocatePages(4).ok());
      std::vector<float> logits(r.arch().vocab);
      Status s = r.Step(rows, tables, logits.data());
      EXPECT_TRUE(s.ok()) << s.message();
      std::vector<uint8_t> host(2 * bytes);
      EXPECT_TRUE(r.CopyPageToHost(2, host.data()).ok());
      EXPECT_TRUE(r.CopyPageToHost(0, host.data() + bytes).ok());
      return host;
    };
    const std::vector<uint8_t> ref = fill(*whole);
    const std::vector<uint8_t> ours = fill(*pipeline);
    EXPECT_TRUE(ours == ref) << "the pipeline's page copies differ from the whole model's";
    // Page 2 into page 3 and back out.
    ASSERT_TRUE(pipeline->CopyPageFromHost(3, ours.data()).ok());
    std::vector<uint8_t> back(bytes);
    ASSERT_TRUE(pipeline->CopyPageToHost(3, back.data()).ok());
    EXPECT_EQ(0, std::memcmp(back.data(), ours.data(), bytes));
    EXPECT_FALSE(pipeline->CopyPageToHost(4, back.data()).ok());
  }
}

struct Outcome {
  std::vector<std::vector<int32_t>> tokens;
  EngineStats stats;
};

// Greedy requests arriving together on `slots` slots of `pages` pages (few: preemption and
// prefixes stored in host memory), drafts as asked.
Outcome Generate(Runner* runner, int n, int32_t slots, int32_t pages,
                 DraftMode draft = DraftMode::kNone) {
  const int64_t vocab = runner->arch().vocab;
  std::mt19937 rng(9);
  std::uniform_int_distribution<int32_t> pick(10, static_cast<int32_t>(vocab) - 1);
  EngineOptions options;
  options.slots = slots;
  options.context = 96;
  options.rows = 40;
  options.draft = draft;
  options.drafts = 3;
  options.kv_budget_bytes =
      pages * runner->PageBytes() + Engine::StateBytes(runner->caches(), options);
  options.host_prefix_bytes = options.kv_budget_bytes;
  auto engine = Engine::Create(runner, options);
  EXPECT_TRUE(engine.ok()) << engine.status().message();
  Outcome out;
  if (!engine.ok()) return out;
  out.tokens.resize(n);
  std::map<int64_t, int> index;
  for (int i = 0; i < n; ++i) {
    Request r;
    const int period = 4 + i % 5;
    std::vector<int32_t> piece(period);
    for (int32_t& t : piece) t = pick(rng);
    for (int p = 0; p < 3 * period + i; ++p) r.prompt.push_back(piece[p % period]);
    r.limit = 24 + i % 9;
    r.sampling.temperature = 0.0f;
    r.stop = std::vector<int32_t>{};
    auto id = (*engine)->Add(r);
    EXPECT_TRUE(id.ok()) << id.status().message();
    if (!id.ok()) return out;
    index[*id] = i;
  }
  while ((*engine)->Busy()) {
    auto progress = (*engine)->Advance();
    EXPECT_TRUE(progress.ok()) << progress.status().message();
    if (!progress.ok()) return out;
    for (const Progress& p : *progress) {
      std::vector<int32_t>& t = out.tokens[index.at(p.id)];
      t.insert(t.end(), p.tokens.begin(), p.tokens.end());
    }
  }
  out.stats = (*engine)->stats();
  return out;
}

void CheckGreedy(const std::string& dir, int stages, int32_t pages,
                 DraftMode draft = DraftMode::kNone, const DeviceOptions& device = Exact(),
                 std::vector<int> gpus = {}) {
  SCOPED_TRACE(dir + ", " + std::to_string(stages) + " stages");
  auto whole = LoadWhole(dir, device);
  auto pipeline = LoadStages(dir, stages, {}, device, gpus);
  ASSERT_NE(whole, nullptr);
  ASSERT_NE(pipeline, nullptr);
  const Outcome ref = Generate(whole.get(), 6, 3, pages, draft);
  const Outcome ours = Generate(pipeline.get(), 6, 3, pages, draft);
  ASSERT_EQ(ours.tokens.size(), ref.tokens.size());
  for (size_t i = 0; i < ref.tokens.size(); ++i) {
    EXPECT_FALSE(ref.tokens[i].empty());
    EXPECT_EQ(ours.tokens[i], ref.tokens[i]) << "request " << i;
  }
  EXPECT_EQ(ours.stats.preemptions, ref.stats.preemptions);
  EXPECT_EQ(ours.stats.host_copies, ref.stats.host_copies);
  if (dir != kGemma3) {
    EXPECT_GT(ref.stats.preemptions, 0);
  }
  if (dir == kTinyChat) {
    EXPECT_GT(ref.stats.host_copies, 0);  // pages of stored prefixes
  }
  if (draft == DraftMode::kMtp) {
    EXPECT_GT(ref.stats.mtp.accepted, 0);
  }
  EXPECT_EQ(ours.stats.mtp.drafted, ref.stats.mtp.drafted);
  EXPECT_EQ(ours.stats.mtp.accepted, ref.stats.mtp.accepted);
}

TEST(Pipeline, EngineGreedyTokensEqualTheWholeModel) {
  CheckGreedy(kTinyChat, 2, 6);
  CheckGreedy(kTinyChat, 3, 6);
}

TEST(Pipeline, EngineGreedyTokensEqualTheWholeModelWithWindowLayers) {
  // The whole model pages its window layers apart, the pipeline every layer at every position.
  CheckGreedy(kGemma3, 2, 24);
}

TEST(Pipeline, EngineHybridTokensEqualTheWholeModel) {
  CheckGreedy(kTinyHybrid, 2, 6);
  CheckGreedy(kTinyHybrid, 3, 6);
}

TEST(Pipeline, EngineMtpDraftsEqualTheWholeModel) {
  CheckGreedy(kTinyHybrid, 2, 6, DraftMode::kMtp);
}

// On CUDA (exact mode), where a GPU is found: two stages on one GPU (each its own backend), and
// on two GPUs where there are two; the logits within 1e-5 and the same greedy tokens.
TEST(Pipeline, CudaStagesEqualTheWholeModel) {
  if (GpuCount() == 0) GTEST_SKIP() << "no CUDA device";
  CheckLogits(kTinyChat, 2, {}, ExactCuda(), {0, 0});
  CheckLogits(kGemma3, 2, {}, ExactCuda(), {0, 0});
  CheckGreedy(kTinyChat, 2, 6, DraftMode::kNone, ExactCuda(), {0, 0});
  if (GpuCount() < 2) return;
  CheckLogits(kTinyChat, 2, {}, ExactCuda(), {0, 1});
  CheckLogits(kTinyChat, 3, {}, ExactCuda(), {1, 0, 1});
  CheckGreedy(kTinyChat, 2, 6, DraftMode::kNone, ExactCuda(), {0, 1});
}

TEST(Pipeline, CudaRefusesAGpuItDoesNotHave) {
  if (GpuCount() == 0) GTEST_SKIP() << "no CUDA device";
  const int gpus[] = {0, GpuCount()};
  auto backends = OpenStageBackends(ExactCuda(), gpus);
  ASSERT_FALSE(backends.ok());
  EXPECT_NE(backends.status().message().find("no GPU"), std::string::npos);
}

}  // namespace
}  // namespace gizllm
