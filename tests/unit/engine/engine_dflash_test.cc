// DFlash drafters (model/dflash.h) and block drafts in the engine, on the CPU in float32:
// the drafter's config and tensors checked against the model (errors name the field or tensor);
// its drafts those of a float64 reading of the same weights, whatever pieces its context was built
// in; the engine's contexts hold the model's hidden states of every kept row; and requests give
// the same tokens with and without block drafts, under preemption, on tiny-chat and the tiny
// hybrid (recurrent states restored to the last kept row).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "formats/safetensors.h"
#include "model/dflash.h"
#include "model/model.h"
#include "model/weights.h"
#include "ops/device.h"
#include "tests/dflash_util.h"
#include "tests/unit/engine/exact_cpu_model.h"
#include "tokenizer/tokenizer.h"

namespace gizllm {
namespace {

namespace fs = std::filesystem;

Model* Load(const std::string& folder) { return testing::LoadExactCpu(folder); }

std::string TempDir(const std::string& name) {
  const fs::path dir =
      fs::temp_directory_path() / ("gizllm_dflash_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  return dir.string();
}

testing::RandomDFlash DrafterFor(const Model& model) {
  testing::RandomDFlash r;
  r.dim = model.arch().dim;
  r.target_layers = model.arch().layers;
  r.target_layer_ids = {0, model.arch().layers - 1};
  return r;
}

struct TempFolder {
  std::string dir;
  ~TempFolder() { fs::remove_all(dir); }
};

// The model's hidden states after the drafter's layers for `tokens`, as the drafter reads them:
// [tokens, layers * dim].
std::vector<float> Features(Model* model, const std::vector<int32_t>& tokens,
                            std::span<const int> layers) {
  const int64_t n = static_cast<int64_t>(tokens.size()), dim = model->arch().dim;
  EXPECT_TRUE(model->AllocatePages(PagesFor(n) + 1).ok());
  EXPECT_TRUE(model->Reserve(n, 1, PagesFor(n) + 1).ok());
  std::vector<int32_t> pages(PagesFor(n) + 1);
  for (size_t i = 0; i < pages.size(); ++i) pages[i] = static_cast<int32_t>(i);
  Rows rows;
  for (int64_t i = 0; i < n; ++i) rows.Push(tokens[i], 0, i, false);
  std::vector<float> by_layer(layers.size() * n * dim);
  const PageTables tables{pages.data(), 1, static_cast<int32_t>(pages.size())};
  EXPECT_TRUE(model->Hidden(rows, tables, layers, by_layer.data()).ok());
  std::vector<float> out(n * layers.size() * dim);
  for (int64_t r = 0; r < n; ++r) {
    for (size_t l = 0; l < layers.size(); ++l) {
      std::copy_n(by_layer.data() + (l * n + r) * dim, dim,
                  out.data() + (r * layers.size() + l) * dim);
    }
  }
  return out;
}

std::vector<int32_t> RandomTokens(int n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = static_cast<int32_t>(10 + rng() % (vocab - 10));
  return t;
}

// The float64 reading of z-lab's DFlashDraftModel over the same weights (read from the file
// again), the context whole: the final-normed block rows 1 .. block - 1 [block - 1, dim].
std::vector<double> ReferenceRows(const std::string& dir, Model* model, const DFlashConfig& c,
                                  const std::vector<float>& features, int64_t ctx_len,
                                  int32_t last) {
  auto ckpt = Checkpoint::Open(dir);
  EXPECT_TRUE(ckpt.ok());
  auto w = [&](const std::string& name) {
    const TensorInfo* t = ckpt->Find(name);
    if (!t) t = ckpt->Find("model." + name);
    if (!t) ADD_FAILURE() << name;
    if (!t) return std::vector<double>{};
    auto f = ReadVector(*ckpt, dir, t->name, t->shape);  // F32, F16 or BF16
    EXPECT_TRUE(f.ok()) << name;
    return f.ok() ? std::vector<double>(f->begin(), f->end()) : std::vector<double>{};
  };
  const int dim = c.dim, hd = c.head_dim, H = c.heads, KV = c.kv_heads, B = c.block_size;
  const int64_t in = static_cast<int64_t>(c.target_layer_ids.size()) * dim;
  auto linear = [](const std::vector<double>& x, int64_t n, const std::vector<double>& m,
                   int64_t out, int64_t inputs) {
    std::vector<double> y(n * out, 0.0);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t o = 0; o < out; ++o)
        for (int64_t i = 0; i < inputs; ++i)
          y[r * out + o] += x[r * inputs + i] * m[o * inputs + i];
    return y;
  };
  auto norm = [&](std::vector<double> x, int64_t width, const std::vector<double>& g) {
    for (size_t r = 0; r < x.size() / width; ++r) {
      double s = 0;
      for (int64_t i = 0; i < width; ++i) s += x[r * width + i] * x[r * width + i];
      const double inv = 1.0 / std::sqrt(s / width + c.eps);
      for (int64_t i = 0; i < width; ++i) x[r * width + i] *= inv * g[i];
    }
    return x;
  };
  auto rope = [&](std::vector<double>& x, int64_t n, int heads, int64_t first) {
    for (int64_t r = 0; r < n; ++r)
      for (int h = 0; h < heads; ++h)
        for (int i = 0; i < hd / 2; ++i) {
          const double f = 1.0 / std::pow(c.rope_theta, 2.0 * i / hd);
          const double a = (first + r) * f;
          double* v = x.data() + (r * heads + h) * hd;
          const double p = v[i], q = v[i + hd / 2];
          v[i] = p * std::cos(a) - q * std::sin(a);
          v[i + hd / 2] = q * std::cos(a) + p * std::sin(a);
        }
  };
  std::vector<double> feats(features.begin(), features.begin() + ctx_len * in);
  const std::vector<double> ctx =
      norm(linear(feats, ctx_len, w("fc.weight"), dim, in), dim, w("hidden_norm.weight"));
  std::vector<int32_t> block(B, c.mask_token);
  block[0] = last;
  std::vector<float> embed(B * dim);
  EXPECT_TRUE(model->EmbedTokens(block, embed.data()).ok());
  std::vector<double> h(embed.begin(), embed.end());
  for (int l = 0; l < c.layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    const std::vector<double> x = norm(h, dim, w(p + "input_layernorm.weight"));
    std::vector<double> q = norm(linear(x, B, w(p + "self_attn.q_proj.weight"), H * hd, dim), hd,
                                 w(p + "self_attn.q_norm.weight"));
    // Keys and values of [context ; block], positions 0 .. ctx_len + B - 1.
    std::vector<double> both(ctx);
    both.insert(both.end(), x.begin(), x.end());
    const int64_t m = ctx_len + B;
    std::vector<double> k = norm(linear(both, m, w(p + "self_attn.k_proj.weight"), KV * hd, dim),
                                 hd, w(p + "self_attn.k_norm.weight"));
    const std::vector<double> v = linear(both, m, w(p + "self_attn.v_proj.weight"), KV * hd, dim);
    rope(q, B, H, ctx_len);
    rope(k, m, KV, 0);
    std::vector<double> attn(B * H * hd, 0.0);
    for (int j = 0; j < B; ++j)
      for (int head = 0; head < H; ++head) {
        const int g = head / (H / KV);
        std::vector<double> s(m);
        double top = -1e300, total = 0;
        for (int64_t t = 0; t < m; ++t) {
          double d = 0;
          for (int i = 0; i < hd; ++i) d += q[(j * H + head) * hd + i] * k[(t * KV + g) * hd + i];
          s[t] = d / std::sqrt(static_cast<double>(hd));
          top = std::max(top, s[t]);
        }
        for (double& e : s) total += e = std::exp(e - top);
        for (int64_t t = 0; t < m; ++t)
          for (int i = 0; i < hd; ++i)
            attn[(j * H + head) * hd + i] += s[t] / total * v[(t * KV + g) * hd + i];
      }
    const std::vector<double> o = linear(attn, B, w(p + "self_attn.o_proj.weight"), dim, H * hd);
    for (size_t i = 0; i < h.size(); ++i) h[i] += o[i];
    const std::vector<double> y = norm(h, dim, w(p + "post_attention_layernorm.weight"));
    std::vector<double> gate = linear(y, B, w(p + "mlp.gate_proj.weight"), c.ffn, dim);
    const std::vector<double> up = linear(y, B, w(p + "mlp.up_proj.weight"), c.ffn, dim);
    for (size_t i = 0; i < gate.size(); ++i) gate[i] = gate[i] / (1 + std::exp(-gate[i])) * up[i];
    const std::vector<double> down = linear(gate, B, w(p + "mlp.down_proj.weight"), dim, c.ffn);
    for (size_t i = 0; i < h.size(); ++i) h[i] += down[i];
  }
  h = norm(h, dim, w("norm.weight"));
  return std::vector<double>(h.begin() + dim, h.end());
}

TEST(DFlashDrafter, DraftsAreAFloat64ReadingsPicksWhateverPiecesItsContextCameIn) {
  Model* model = Load("models/tiny-chat");
  ASSERT_NE(model, nullptr);
  TempFolder folder{TempDir("reference")};
  testing::RandomDFlash r = DrafterFor(*model);
  r.prefixed = true;  // vLLM's names
  testing::WriteRandomDFlash(folder.dir, r);
  auto drafter = DFlashDrafter::Open(folder.dir, model, 2);
  ASSERT_TRUE(drafter.ok()) << drafter.status().message();
  const DFlashConfig& c = (*drafter)->config();
  const int64_t ctx_len = 21, vocab = model->arch().vocab;
  const std::vector<int32_t> tokens = RandomTokens(ctx_len + 1, vocab, 3);
  const std::vector<float> features = Features(model, tokens, (*drafter)->FeatureLayers());
  const int64_t width = static_cast<int64_t>(c.target_layer_ids.size()) * c.dim;
  const std::vector<double> want =
      ReferenceRows(folder.dir, model, c, features, ctx_len, tokens[ctx_len]);
  // Reference logits through the model's head, and which tokens are the largest.
  const int32_t count = (*drafter)->MostDrafts();
  std::vector<float> rows(want.begin(), want.end()), logits(count * vocab);
  ASSERT_TRUE(model->HeadLogits(rows.data(), count, logits.data()).ok());
  auto check = [&](const std::vector<int32_t>& got, const std::string& how) {
    for (int32_t k = 0; k < count; ++k) {
      const float* lk = logits.data() + k * vocab;
      const float top = *std::max_element(lk, lk + vocab);
      EXPECT_GE(lk[got[k]], top - 1e-4f * std::max(1.0f, std::fabs(top))) << how << " draft " << k;
    }
  };
  // The context whole, in pieces, and with a piece read again (as after preemption).
  std::vector<std::vector<int64_t>> cuts = {{0, ctx_len}, {0, 1, 8, ctx_len}, {0, 13, ctx_len}};
  for (size_t v = 0; v < cuts.size(); ++v) {
    auto context = (*drafter)->NewContext();
    const std::vector<int64_t>& cut = cuts[v];
    for (size_t i = 0; i + 1 < cut.size(); ++i) {
      std::vector<int64_t> positions;
      for (int64_t p = cut[i]; p < cut[i + 1]; ++p) positions.push_back(p);
      ASSERT_TRUE((*drafter)->Extend(*context, positions, features.data() + cut[i] * width).ok());
    }
    if (v == 2) {  // positions 5 .. 20 again: what the context held there is replaced
      std::vector<int64_t> positions;
      for (int64_t p = 5; p < ctx_len; ++p) positions.push_back(p);
      std::vector<float> wrong(features.begin() + 5 * width, features.begin() + ctx_len * width);
      for (float& x : wrong) x = -x;
      ASSERT_TRUE((*drafter)->Extend(*context, positions, wrong.data()).ok());
      ASSERT_TRUE((*drafter)->Extend(*context, positions, features.data() + 5 * width).ok());
    }
    std::vector<int32_t> got(count);
    BlockDrafter::Context* one[] = {context.get()};
    const int32_t last[] = {tokens[ctx_len]};
    const int64_t at[] = {ctx_len};
    ASSERT_TRUE((*drafter)->Draft(one, last, at, count, got.data()).ok());
    check(got, "cuts " + std::to_string(v));
  }
  // Two sequences at once: each its own drafts.
  auto a = (*drafter)->NewContext(), b = (*drafter)->NewContext();
  std::vector<int64_t> all(ctx_len), few = {0, 1, 2};
  for (int64_t p = 0; p < ctx_len; ++p) all[p] = p;
  ASSERT_TRUE((*drafter)->Extend(*a, all, features.data()).ok());
  ASSERT_TRUE((*drafter)->Extend(*b, few, features.data()).ok());
  std::vector<int32_t> both(2 * count);
  BlockDrafter::Context* two[] = {b.get(), a.get()};
  const int32_t last[] = {tokens[3], tokens[ctx_len]};
  const int64_t at[] = {3, ctx_len};
  ASSERT_TRUE((*drafter)->Draft(two, last, at, count, both.data()).ok());
  check(std::vector<int32_t>(both.begin() + count, both.end()), "batched");
  EXPECT_FALSE((*drafter)->Draft(two, last, at, count + 1, both.data()).ok());
}

// What the drafter's folder must hold, each refusal naming the field or the tensor.
TEST(DFlashDrafter, RefusesWhatDoesNotFitTheModel) {
  Model* model = Load("models/tiny-chat");
  ASSERT_NE(model, nullptr);
  TempFolder folder{TempDir("refusals")};
  const testing::RandomDFlash base = DrafterFor(*model);
  auto expect = [&](const testing::RandomDFlash& r, auto edit, const std::string& words) {
    fs::remove_all(folder.dir);
    testing::WriteRandomDFlash(folder.dir, r);
    nlohmann::json c = nlohmann::json::parse(std::ifstream(folder.dir + "/config.json"));
    edit(c);
    std::ofstream(folder.dir + "/config.json") << c.dump();
    auto d = DFlashDrafter::Open(folder.dir, model, 1);
    ASSERT_FALSE(d.ok()) << words;
    EXPECT_NE(d.status().message().find(words), std::string::npos) << d.status().message();
  };
  auto none = [](nlohmann::json&) {};
  expect(
      base, [](nlohmann::json& c) { c["architectures"] = {"Qwen3ForCausalLM"}; },
      "DFlashDraftModel");
  expect(
      base,
      [](nlohmann::json& c) {
        c["dflash_config"]["target_layer_ids"] = {0, 99};
      },
      "target_layer_ids[1]");
  expect(
      base, [&](nlohmann::json& c) { c["dflash_config"]["mask_token_id"] = 1 << 20; },
      "mask_token_id");
  expect(
      base, [](nlohmann::json& c) { c["num_target_layers"] = 36; }, "num_target_layers");
  expect(
      base,
      [](nlohmann::json& c) {
        c["layer_types"] = {"full_attention", "sliding_attention"};
      },
      "layer_types[1]");
  expect(
      base, [](nlohmann::json& c) { c.erase("dflash_config"); }, "dflash_config");
  testing::RandomDFlash wide = base;
  wide.dim = base.dim * 2;
  expect(wide, none, "hidden_size");
  // A tensor of another shape than config.json gives: named.
  expect(
      base, [](nlohmann::json& c) { c["intermediate_size"] = 97; }, "mlp.gate_proj.weight");
  // Without target_layer_ids, z-lab's default spread over the model's layers.
  fs::remove_all(folder.dir);
  testing::WriteRandomDFlash(folder.dir, base);
  nlohmann::json c = nlohmann::json::parse(std::ifstream(folder.dir + "/config.json"));
  c["dflash_config"].erase("target_layer_ids");
  c["num_hidden_layers"] = 1;
  std::ofstream(folder.dir + "/config.json") << c.dump();
  auto cfg = ReadDFlashConfig(folder.dir, model->arch());
  ASSERT_TRUE(cfg.ok()) << cfg.status().message();
  EXPECT_EQ(cfg->target_layer_ids, std::vector<int>{model->arch().layers / 2});
}

// A BlockDrafter that passes everything to a DFlash drafter and keeps what each context read.
class Recording : public BlockDrafter {
 public:
  // What one context read; kept by the recording after the engine drops the context.
  struct Data {
    std::vector<int64_t> positions;
    std::vector<std::vector<float>> features;
  };
  struct Log : Context {
    std::unique_ptr<Context> inner;
    std::shared_ptr<Data> data = std::make_shared<Data>();
  };
  explicit Recording(BlockDrafter* inner) : inner_(inner) {}
  std::span<const int> FeatureLayers() const override { return inner_->FeatureLayers(); }
  int32_t MostDrafts() const override { return inner_->MostDrafts(); }
  std::unique_ptr<Context> NewContext() const override {
    auto log = std::make_unique<Log>();
    log->inner = inner_->NewContext();
    logs.push_back(log->data);
    return log;
  }
  Status Extend(Context& context, std::span<const int64_t> positions,
                const float* features) override {
    auto& log = static_cast<Log&>(context);
    width = static_cast<int64_t>(FeatureLayers().size()) * dim;
    for (size_t i = 0; i < positions.size(); ++i) {
      log.data->positions.push_back(positions[i]);
      log.data->features.emplace_back(features + i * width, features + (i + 1) * width);
    }
    return inner_->Extend(*log.inner, positions, features);
  }
  Status Draft(std::span<Context* const> contexts, std::span<const int32_t> last,
               std::span<const int64_t> positions, int32_t count, int32_t* tokens) override {
    std::vector<Context*> inner;
    for (Context* c : contexts) inner.push_back(static_cast<Log*>(c)->inner.get());
    ++drafts_asked;
    return inner_->Draft(inner, last, positions, count, tokens);
  }
  BlockDrafter* inner_;
  int64_t dim = 0, width = 0, drafts_asked = 0;
  mutable std::vector<std::shared_ptr<Data>> logs;
};

struct Outcome {
  std::vector<std::vector<int32_t>> tokens;
  EngineStats stats;
};

Outcome Generate(Model* model, const std::vector<Request>& requests, BlockDrafter* drafter,
                 int32_t slots, int32_t pages) {
  EngineOptions options;
  options.slots = slots;
  options.context = 128;
  options.rows = 48;
  options.draft = drafter ? DraftMode::kBlock : DraftMode::kNone;
  options.drafts = drafter ? drafter->MostDrafts() : 3;
  options.block_drafter = drafter;
  options.kv_budget_bytes =
      pages * model->PageBytes() + Engine::StateBytes(model->caches(), options);
  auto engine = Engine::Create(model, options);
  EXPECT_TRUE(engine.ok()) << engine.status().message();
  Outcome out;
  if (!engine.ok()) return out;
  out.tokens.resize(requests.size());
  std::map<int64_t, size_t> index;
  for (size_t i = 0; i < requests.size(); ++i) index[*(*engine)->Add(requests[i])] = i;
  while ((*engine)->Busy()) {
    auto progress = (*engine)->Advance();
    EXPECT_TRUE(progress.ok()) << progress.status().message();
    if (!progress.ok()) return out;
    for (const Progress& p : *progress) {
      auto& t = out.tokens[index.at(p.id)];
      t.insert(t.end(), p.tokens.begin(), p.tokens.end());
    }
    EXPECT_TRUE((*engine)->CheckPages().ok());
  }
  out.stats = (*engine)->stats();
  return out;
}

std::vector<Request> Requests(int64_t vocab, int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<Request> requests;
  for (int i = 0; i < n; ++i) {
    Request r;
    r.prompt = RandomTokens(12 + static_cast<int>(rng() % 20), vocab, rng());
    r.limit = 20 + static_cast<int64_t>(rng() % 16);
    r.sampling.temperature = 0.0f;
    r.stop = std::vector<int32_t>{};  // to the limit: the pool runs short (preemption)
    if (i % 2 == 1) {
      r.sampling.temperature = 0.8f;
      r.sampling.seed = rng();
    }
    requests.push_back(r);
  }
  return requests;
}

// 8 requests in 4 slots of a pool that cannot hold them all (preemption), greedy and seeded:
// the same tokens with block drafts as without, and drafts were made (a random drafter's are
// mostly refused: the refusal path; the kept ones are checked alike).
void CheckSameTokens(const std::string& folder) {
  Model* model = Load(folder);
  ASSERT_NE(model, nullptr);
  TempFolder dir{TempDir("engine")};
  testing::WriteRandomDFlash(dir.dir, DrafterFor(*model));
  auto drafter = DFlashDrafter::Open(dir.dir, model, 2);
  ASSERT_TRUE(drafter.ok()) << drafter.status().message();
  const std::vector<Request> requests = Requests(model->arch().vocab, 8, 7);
  const Outcome plain = Generate(model, requests, nullptr, 4, 12);
  const Outcome block = Generate(model, requests, drafter->get(), 4, 12);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(block.tokens[i], plain.tokens[i]) << folder << " request " << i;
  }
  EXPECT_GT(block.stats.block.drafted, 0);
  EXPECT_GT(block.stats.block.steps, 0);
  EXPECT_EQ(block.stats.lookup.drafted, 0);
  EXPECT_GT(block.stats.preemptions, 0);
}

TEST(DFlashEngine, TinyChatSameTokensWithAndWithoutBlockDrafts) {
  CheckSameTokens("models/tiny-chat");
}

TEST(DFlashEngine, TinyHybridSameTokensWithAndWithoutBlockDrafts) {
  CheckSameTokens("models/tiny-hybrid");
}

// Every row a sequence keeps joins its context with the model's hidden states at that position
// (those of reading its prompt and answer whole), whatever step read it; refused drafts' rows
// never do.
TEST(DFlashEngine, ContextsHoldTheModelsHiddenStatesOfKeptRows) {
  Model* model = Load("models/tiny-hybrid");
  ASSERT_NE(model, nullptr);
  TempFolder dir{TempDir("contexts")};
  testing::WriteRandomDFlash(dir.dir, DrafterFor(*model));
  auto drafter = DFlashDrafter::Open(dir.dir, model, 2);
  ASSERT_TRUE(drafter.ok());
  Recording recording(drafter->get());
  recording.dim = model->arch().dim;
  std::vector<Request> requests = Requests(model->arch().vocab, 3, 11);
  for (Request& r : requests) {
    r.sampling = Sampling{};
    r.sampling.temperature = 0.0f;  // greedy
  }
  const Outcome out = Generate(model, requests, &recording, 3, 64);
  EXPECT_GT(recording.drafts_asked, 0);
  ASSERT_EQ(recording.logs.size(), requests.size());
  std::vector<std::vector<float>> whole;
  for (size_t i = 0; i < requests.size(); ++i) {
    std::vector<int32_t> tokens = requests[i].prompt;
    tokens.insert(tokens.end(), out.tokens[i].begin(), out.tokens[i].end());
    whole.push_back(Features(model, tokens, recording.FeatureLayers()));
  }
  for (const auto& log : recording.logs) {
    // The request it belongs to: the one whose first row it holds.
    size_t who = requests.size();
    for (size_t i = 0; i < requests.size(); ++i) {
      if (std::equal(
              log->features[0].begin(), log->features[0].end(), whole[i].begin(),
              [](float a, float b) { return std::fabs(a - b) <= 1e-4f * (1 + std::fabs(b)); }))
        who = i;
    }
    ASSERT_LT(who, requests.size());
    const int64_t total =
        static_cast<int64_t>(requests[who].prompt.size() + out.tokens[who].size());
    // Positions 0 .. m - 1 once each, in order: every prompt row, then the answer's rows up to
    // the last step's (a request's last step adds none: it drafts no more).
    ASSERT_LE(static_cast<int64_t>(log->positions.size()), total - 1) << who;
    ASSERT_GT(log->positions.size(), requests[who].prompt.size()) << who;
    for (size_t k = 0; k < log->positions.size(); ++k) {
      ASSERT_EQ(log->positions[k], static_cast<int64_t>(k));
      for (int64_t j = 0; j < recording.width; ++j) {
        const float want = whole[who][k * recording.width + j];
        ASSERT_NEAR(log->features[k][j], want, 1e-4f * (1 + std::fabs(want)))
            << "request " << who << " position " << k << " feature " << j;
      }
    }
  }
}

// The shipped drafter against z-lab's own DFlashDraftModel (dflash/model.py) over transformers'
// tiny hybrid, in float32 (models/tiny-hybrid/dflash/reference.safetensors, written by
// tools/dflash_reference.py): a chat prompt and its greedy answer as the context, the block of
// its newest token at the next position; the drafter's logits within 1e-4 of the largest and the
// float64 reading's final-normed rows within 1e-4 of z-lab's.
TEST(DFlashDrafter, ShippedDrafterEqualsZLabsModel) {
  Model* model = Load("models/tiny-hybrid");
  ASSERT_NE(model, nullptr);
  const std::string dir = "models/tiny-hybrid/dflash";
  auto drafter = DFlashDrafter::Open(dir, model, 2);
  ASSERT_TRUE(drafter.ok()) << drafter.status().message();
  auto file = SafetensorsFile::Open(dir + "/reference.safetensors");
  ASSERT_TRUE(file.ok()) << file.status().message();
  auto tensor = [&](const char* name, DType dtype) {
    const TensorInfo* t = file->Find(name);
    EXPECT_NE(t, nullptr) << name;
    if (t) EXPECT_EQ(t->dtype, dtype) << name;
    return t;
  };
  const TensorInfo *ids_t = tensor("ids", DType::kI32),
                   *normed_t = tensor("block_normed", DType::kF32),
                   *logits_t = tensor("draft_logits", DType::kF32);
  ASSERT_TRUE(ids_t && normed_t && logits_t);
  std::vector<int32_t> ids(ids_t->Elements());
  std::memcpy(ids.data(), ids_t->data, ids_t->bytes);
  const DFlashConfig& c = (*drafter)->config();
  const int32_t count = (*drafter)->MostDrafts();
  const int64_t vocab = model->arch().vocab, ctx_len = static_cast<int64_t>(ids.size()) - 1;
  ASSERT_EQ(normed_t->Elements(), count * c.dim);
  ASSERT_EQ(logits_t->Elements(), count * vocab);
  std::vector<float> want_normed(normed_t->Elements()), want_logits(logits_t->Elements());
  std::memcpy(want_normed.data(), normed_t->data, normed_t->bytes);
  std::memcpy(want_logits.data(), logits_t->data, logits_t->bytes);

  const std::vector<int32_t> context(ids.begin(), ids.end() - 1);
  const std::vector<float> features = Features(model, context, (*drafter)->FeatureLayers());
  auto ctx = (*drafter)->NewContext();
  std::vector<int64_t> positions(ctx_len);
  for (int64_t p = 0; p < ctx_len; ++p) positions[p] = p;
  ASSERT_TRUE((*drafter)->Extend(*ctx, positions, features.data()).ok());
  std::vector<int32_t> got(count);
  BlockDrafter::Context* one[] = {ctx.get()};
  const int32_t last[] = {ids.back()};
  const int64_t at[] = {ctx_len};
  ASSERT_TRUE((*drafter)->Draft(one, last, at, count, got.data()).ok());
  const std::span<const float> logits = (*drafter)->LastLogits();
  ASSERT_EQ(static_cast<int64_t>(logits.size()), count * vocab);
  for (int32_t k = 0; k < count; ++k) {
    const float* want = want_logits.data() + k * vocab;
    const float top = *std::max_element(want, want + vocab);
    float worst = 0.0f, scale = 0.0f;
    for (int64_t v = 0; v < vocab; ++v) {
      worst = std::max(worst, std::fabs(logits[k * vocab + v] - want[v]));
      scale = std::max(scale, std::fabs(want[v]));
    }
    EXPECT_LE(worst, 1e-4f * scale) << "draft " << k;
    EXPECT_GE(want[got[k]], top - 1e-4f * scale) << "draft " << k;
  }
  const std::vector<double> rows = ReferenceRows(dir, model, c, features, ctx_len, ids.back());
  ASSERT_EQ(rows.size(), want_normed.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_NEAR(rows[i], want_normed[i], 1e-4 * (1 + std::fabs(want_normed[i]))) << i;
  }
}

// The drafter shipped for the tiny hybrid (models/tiny-hybrid/dflash, trained by
// tools/train_dflash.py): on held-out chats (bench/drafts/chat_prompts.jsonl), greedy, the same
// tokens as without drafts, and a step keeps more than half a draft on average (DFlash's
// threshold: a mean acceptance length above 1.5 tokens a step; 4.47 measured, bench/RESULTS.md).
TEST(DFlashEngine, ShippedDrafterKeepsDraftsOnHeldOutChats) {
  Model* model = Load("models/tiny-hybrid");
  ASSERT_NE(model, nullptr);
  auto drafter = DFlashDrafter::Open("models/tiny-hybrid/dflash", model, 2);
  ASSERT_TRUE(drafter.ok()) << drafter.status().message();
  auto tokenizer = Tokenizer::Load("models/tiny-hybrid");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().message();
  std::ifstream prompts("bench/drafts/chat_prompts.jsonl");
  std::vector<Request> requests;
  for (std::string line; std::getline(prompts, line) && requests.size() < 8;) {
    Request r;
    auto ids = tokenizer->Encode(nlohmann::json::parse(line)["prompt"].get<std::string>());
    ASSERT_TRUE(ids.ok());
    r.prompt = *ids;
    r.limit = 48;
    r.sampling.temperature = 0.0f;
    requests.push_back(r);
  }
  ASSERT_EQ(requests.size(), 8u);
  const Outcome plain = Generate(model, requests, nullptr, 4, 64);
  const Outcome block = Generate(model, requests, drafter->get(), 4, 64);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(block.tokens[i], plain.tokens[i]) << "request " << i;
  }
  ASSERT_GT(block.stats.block.steps, 0);
  const double kept = static_cast<double>(block.stats.block.accepted) / block.stats.block.steps;
  EXPECT_GT(1.0 + kept, 1.5) << block.stats.block.accepted << " kept in " << block.stats.block.steps
                             << " steps";
}

}  // namespace
}  // namespace gizllm
