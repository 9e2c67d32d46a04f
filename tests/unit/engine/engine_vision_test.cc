// The engine with pictures on a tiny random Qwen3-VL (CPU backend, float32 activations): greedy
// tokens equal the argmax of the model's logits over the prompt and the answer so far (the
// answer's rotary positions counting on from the prompt's `next`); steps of few rows (prompt
// pieces ending inside a picture) and concurrent requests under preemption give the same
// tokens; a held prefix is reused for the same pictures and never past the first picture row
// for other pictures behind the same placeholder tokens; pictures given as PNG bytes
// (PictureReader: decoded, preprocessed, through the tower) give the model's argmax too.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <memory>

#include "../model/tiny_vl.h"
#include "../vision/picture_encoders.h"
#include "engine/engine.h"
#include "model/evaluate.h"
#include "model/model.h"
#include "model/picture_prompt.h"
#include "ops/device.h"
#include "tests/unit/model/cuda_or_null.h"

namespace gizllm {
namespace {

namespace fs = std::filesystem;

Model* VlModel() {
  static std::unique_ptr<Model> model = [] {
    const fs::path dir =
        fs::temp_directory_path() / ("gizllm_engine_vision_" + std::to_string(::getpid()));
    tiny_vl::Write(dir.string());
    DeviceOptions device;
    device.exact = true;
    device.device = "cpu";
    device.threads = 2;
    auto backend = OpenBackend(device);
    EXPECT_TRUE(backend.ok()) << backend.status().message();
    auto m = Model::Load(dir.string(), *backend);
    EXPECT_TRUE(m.ok()) << m.status().message();
    fs::remove_all(dir);
    return m.ok() ? std::move(*m) : nullptr;
  }();
  return model.get();
}

std::unique_ptr<Engine> MakeEngine(int32_t slots, int64_t rows, int32_t pages) {
  EngineOptions options;
  options.slots = slots;
  options.context = 64;
  options.rows = rows;
  options.kv_budget_bytes = pages * VlModel()->PageBytes();
  auto engine = Engine::Create(VlModel(), options);
  EXPECT_TRUE(engine.ok()) << engine.status().message();
  return engine.ok() ? std::move(*engine) : nullptr;
}

Request WithPictures(std::shared_ptr<const PromptPictures> pictures, int64_t limit) {
  Request r;
  r.prompt = tiny_vl::Prompt();
  r.limit = limit;
  r.sampling.temperature = 0.0f;
  r.stop = std::vector<int32_t>{};
  r.pictures = std::move(pictures);
  return r;
}

// Greedy tokens from the model's logits alone: the prompt and the answer so far read whole,
// the answer's rows at rotary positions next, next + 1, ...
std::vector<int32_t> ManualGreedy(const PromptPictures& pictures, int count,
                                  Model* model = VlModel(),
                                  std::vector<int32_t> ids = tiny_vl::Prompt()) {
  PromptPictures p = pictures;
  std::vector<int32_t> out;
  for (int k = 0; k < count; ++k) {
    auto logits = SequenceLogits(*model, ids, p);
    EXPECT_TRUE(logits.ok()) << logits.status().message();
    if (!logits.ok()) return out;
    const int64_t vocab = model->arch().vocab;
    const float* last = logits->data() + (ids.size() - 1) * vocab;
    const int32_t token = static_cast<int32_t>(std::max_element(last, last + vocab) - last);
    out.push_back(token);
    ids.push_back(token);
    const int32_t r = p.positions.next + k;
    p.positions.t.push_back(r);
    p.positions.h.push_back(r);
    p.positions.w.push_back(r);
  }
  return out;
}

TEST(EngineVision, GreedyEqualsTheModelsArgmax) {
  ASSERT_NE(VlModel(), nullptr);
  auto pictures = std::make_shared<PromptPictures>(tiny_vl::Pictures(/*layers=*/1));
  const std::vector<int32_t> expected = ManualGreedy(*pictures, 6);
  for (int64_t rows : {256, 5, 1}) {
    auto engine = MakeEngine(1, rows, 8);
    ASSERT_NE(engine, nullptr);
    auto out = engine->Generate({WithPictures(pictures, 6)});
    ASSERT_TRUE(out.ok()) << out.status().message();
    ASSERT_EQ(expected.size(), 6u);
    EXPECT_EQ((*out)[0], expected) << "rows " << rows;
  }
}

// Two PNG pictures behind one placeholder each, read by PictureReader on a model with its tower:
// the engine's greedy tokens are the model's argmax over the expanded prompt.
TEST(EngineVision, PicturesFromBytesGiveTheModelsArgmax) {
  const fs::path dir =
      fs::temp_directory_path() / ("gizllm_engine_pictures_" + std::to_string(::getpid()));
  tiny_vl::Write(dir.string(), /*tower=*/true);
  auto backend = OpenBackend(DeviceOptions{.device = "cpu", .threads = 2, .exact = true});
  ASSERT_TRUE(backend.ok()) << backend.status().message();
  auto model = Model::Load(dir.string(), *backend);
  ASSERT_TRUE(model.ok()) << model.status().message();
  auto reader = PictureReader::Load(dir.string(), *backend);
  ASSERT_TRUE(reader.ok()) << reader.status().message();
  fs::remove_all(dir);
  using vision::testing::EncodePng;
  using vision::testing::Pattern;
  const std::vector<std::vector<uint8_t>> pngs = {EncodePng(12, 8, Pattern(12, 8, 3, 1), {}),
                                                  EncodePng(8, 4, Pattern(8, 4, 3, 2), {})};
  const std::vector<int32_t> ids = {1,
                                    2,
                                    tiny_vl::kStart,
                                    tiny_vl::kImage,
                                    tiny_vl::kEnd,
                                    7,
                                    tiny_vl::kStart,
                                    tiny_vl::kImage,
                                    tiny_vl::kEnd,
                                    9,
                                    10};
  auto expanded = (*reader)->Expand(ids, pngs);
  ASSERT_TRUE(expanded.ok()) << expanded.status().message();
  ASSERT_EQ(expanded->tokens, tiny_vl::Prompt());
  const std::vector<int32_t> expected =
      ManualGreedy(expanded->pictures, 6, model->get(), expanded->tokens);
  ASSERT_EQ(expected.size(), 6u);
  // Rows 256: the whole prompt in one step; 5: pieces that end inside the pictures.
  for (int64_t rows : {256, 5}) {
    EngineOptions options;
    options.slots = 1;
    options.context = 64;
    options.rows = rows;
    options.kv_budget_bytes = 8 * (*model)->PageBytes();
    auto engine = Engine::Create(model->get(), options);
    ASSERT_TRUE(engine.ok()) << engine.status().message();
    Request r = WithPictures(std::make_shared<const PromptPictures>(expanded->pictures), 6);
    r.prompt = expanded->tokens;
    auto out = (*engine)->Generate({r});
    ASSERT_TRUE(out.ok()) << out.status().message();
    EXPECT_EQ((*out)[0], expected) << "rows " << rows;
  }
}

// The tower's rows left in the backend's memory (PictureReader::KeepRowsOnDevice) give what
// the rows copied to the host give, bit for bit: the model's logits over the prompt, the
// engine's tokens (whole prompt and pieces ending inside a picture) and hidden states; prefix
// reuse keys them by the pictures' bytes; rows in another backend's memory are refused. On the
// CPU the rows are compared too, and the tokens with the model's argmax.
void ExpectKeptRowsGiveWhatHostRowsGive(std::shared_ptr<Backend> backend) {
  const bool cpu = backend->kind() == DeviceKind::kCpu;
  const fs::path dir = fs::temp_directory_path() /
                       ("gizllm_engine_kept_" + std::to_string(::getpid()) + (cpu ? "c" : "g"));
  tiny_vl::Write(dir.string(), /*tower=*/true);
  auto model = Model::Load(dir.string(), backend);
  ASSERT_TRUE(model.ok()) << model.status().message();
  auto reader = PictureReader::Load(dir.string(), backend);
  ASSERT_TRUE(reader.ok()) << reader.status().message();
  fs::remove_all(dir);
  using vision::testing::EncodePng;
  using vision::testing::Pattern;
  const std::vector<std::vector<uint8_t>> pngs = {EncodePng(12, 8, Pattern(12, 8, 3, 1), {}),
                                                  EncodePng(8, 4, Pattern(8, 4, 3, 2), {})};
  const std::vector<int32_t> ids = {1, 2, tiny_vl::kStart, tiny_vl::kImage, tiny_vl::kEnd, 7,
                                    tiny_vl::kStart, tiny_vl::kImage, tiny_vl::kEnd, 9, 10};
  auto host = (*reader)->Expand(ids, pngs);
  ASSERT_TRUE(host.ok()) << host.status().message();
  (*reader)->KeepRowsOnDevice(true);
  auto kept = (*reader)->Expand(ids, pngs);
  ASSERT_TRUE(kept.ok()) << kept.status().message();
  ASSERT_FALSE(host->pictures.on_device());
  ASSERT_TRUE(kept->pictures.on_device());
  EXPECT_TRUE(kept->pictures.embeddings.empty());
  EXPECT_EQ(kept->pictures.device_backend, backend.get());
  EXPECT_EQ(kept->pictures.layers, host->pictures.layers);
  ASSERT_EQ(kept->pictures.keys.size(), kept->pictures.rows.size());
  EXPECT_EQ(kept->pictures.keys, host->pictures.keys);
  EXPECT_EQ(kept->tokens, host->tokens);
  const int64_t dim = tiny_vl::kDim, count = kept->pictures.count();
  const int layers = host->pictures.layers;
  {
    std::vector<float> rows((1 + layers) * count * dim);
    backend->CopyToHost(rows.data(), kept->pictures.DeviceRow(0, dim), rows.size() * 4);
    EXPECT_TRUE(std::equal(rows.begin(), rows.begin() + count * dim,
                           host->pictures.embeddings.begin()));
    EXPECT_TRUE(std::equal(rows.begin() + count * dim, rows.end(),
                           host->pictures.deepstack.begin()));
  }

  auto host_logits = SequenceLogits(**model, host->tokens, host->pictures, 4);
  auto kept_logits = SequenceLogits(**model, kept->tokens, kept->pictures, 4);
  ASSERT_TRUE(host_logits.ok() && kept_logits.ok());
  EXPECT_EQ(*host_logits, *kept_logits);

  auto engine_for = [&](int64_t rows) {
    EngineOptions options;
    options.slots = 2;
    options.context = 64;
    options.rows = rows;
    options.kv_budget_bytes = 16 * (*model)->PageBytes();
    auto engine = Engine::Create(model->get(), options);
    EXPECT_TRUE(engine.ok()) << engine.status().message();
    return engine.ok() ? std::move(*engine) : nullptr;
  };
  auto request = [&](const PicturePrompt& p) {
    Request r = WithPictures(std::make_shared<const PromptPictures>(p.pictures), 6);
    r.prompt = p.tokens;
    return r;
  };
  for (int64_t rows : {256, 5}) {
    auto engine = engine_for(rows);
    ASSERT_NE(engine, nullptr);
    auto from_host = engine_for(rows)->Generate({request(*host)});
    ASSERT_TRUE(from_host.ok()) << from_host.status().message();
    if (cpu) {
      EXPECT_EQ((*from_host)[0], ManualGreedy(host->pictures, 6, model->get(), host->tokens));
    }
    auto out = engine->Generate({request(*kept)});
    ASSERT_TRUE(out.ok()) << out.status().message();
    EXPECT_EQ((*out)[0], (*from_host)[0]) << "rows " << rows;
    // The same pictures again, read anew: the prompt is reused past its pictures.
    auto again_read = (*reader)->Expand(ids, pngs);
    ASSERT_TRUE(again_read.ok());
    const int64_t before = engine->stats().cached_tokens;
    auto again = engine->Generate({request(*again_read)});
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(engine->stats().cached_tokens - before,
              static_cast<int64_t>(kept->tokens.size()) - 1)
        << "rows " << rows;
    EXPECT_EQ((*again)[0], (*from_host)[0]);
  }
  // Other bytes behind the same placeholders: nothing reused from the first picture row on.
  {
    const std::vector<std::vector<uint8_t>> others = {
        EncodePng(12, 8, Pattern(12, 8, 3, 5), {}), EncodePng(8, 4, Pattern(8, 4, 3, 2), {})};
    auto other = (*reader)->Expand(ids, others);
    ASSERT_TRUE(other.ok());
    auto engine = engine_for(256);
    ASSERT_TRUE(engine->Generate({request(*kept)}).ok());
    const int64_t before = engine->stats().cached_tokens;
    ASSERT_TRUE(engine->Generate({request(*other)}).ok());
    EXPECT_EQ(engine->stats().cached_tokens - before, other->pictures.rows[0]);
  }
  // Hidden states.
  const std::vector<int> hidden_layers = {0, 1, tiny_vl::kLayers};
  auto engine = engine_for(64);
  auto hidden_host = engine->Hidden(host->tokens, 0, host->pictures, hidden_layers);
  auto hidden_kept = engine->Hidden(kept->tokens, 1, kept->pictures, hidden_layers);
  ASSERT_TRUE(hidden_host.ok() && hidden_kept.ok()) << hidden_kept.status().message();
  EXPECT_EQ(*hidden_host, *hidden_kept);
  // Rows in another backend's memory.
  auto other_backend = OpenBackend(DeviceOptions{.device = "cpu", .threads = 1, .exact = true});
  ASSERT_TRUE(other_backend.ok());
  PromptPictures elsewhere = kept->pictures;
  elsewhere.device_backend = other_backend->get();
  auto id = engine->Add(request(PicturePrompt{kept->tokens, elsewhere}));
  ASSERT_FALSE(id.ok());
  EXPECT_NE(id.status().message().find("another device"), std::string::npos);
}

TEST(EngineVision, RowsKeptOnTheDeviceGiveWhatHostRowsGive) {
  auto backend = OpenBackend(DeviceOptions{.device = "cpu", .threads = 2, .exact = true});
  ASSERT_TRUE(backend.ok()) << backend.status().message();
  ExpectKeptRowsGiveWhatHostRowsGive(*backend);
}

TEST(EngineVision, CudaRowsKeptOnTheDeviceGiveWhatHostRowsGive) {
  for (bool exact : {true, false}) {
    std::string why;
    std::shared_ptr<Backend> cuda = testing::CudaOrNull(exact, &why);
    if (!cuda) GTEST_SKIP() << why;
    SCOPED_TRACE(exact ? "exact" : "fast");
    ExpectKeptRowsGiveWhatHostRowsGive(cuda);
  }
}

TEST(EngineVision, ConcurrentRequestsWithAndWithoutPicturesEqualAlone) {
  ASSERT_NE(VlModel(), nullptr);
  std::vector<Request> requests;
  for (uint32_t seed : {5u, 6u, 7u}) {
    requests.push_back(
        WithPictures(std::make_shared<PromptPictures>(tiny_vl::Pictures(1, 0.5f, seed)), 8 + seed));
  }
  Request text = WithPictures(nullptr, 9);
  text.prompt = {3, 4, 5, 6, 7, 8, 9, 11, 12, 13};
  requests.push_back(text);
  // Few pages: requests wait and are preempted; steps of 7 rows mix prompt pieces and decodes.
  auto engine = MakeEngine(4, 7, 5);
  ASSERT_NE(engine, nullptr);
  auto together = engine->Generate(requests);
  ASSERT_TRUE(together.ok()) << together.status().message();
  EXPECT_GT(engine->stats().preemptions, 0);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(static_cast<int64_t>((*together)[i].size()), requests[i].limit) << i;
    auto alone = MakeEngine(1, 64, 8)->Generate({requests[i]});
    ASSERT_TRUE(alone.ok()) << alone.status().message();
    EXPECT_EQ((*together)[i], (*alone)[0]) << "request " << i;
  }
}

TEST(EngineVision, PrefixReuseKeysPicturesByTheirRows) {
  ASSERT_NE(VlModel(), nullptr);
  auto same = std::make_shared<PromptPictures>(tiny_vl::Pictures(1, 0.5f, 5));
  auto other = std::make_shared<PromptPictures>(tiny_vl::Pictures(1, 0.5f, 9));
  auto engine = MakeEngine(1, 64, 8);
  ASSERT_NE(engine, nullptr);
  auto first = engine->Generate({WithPictures(same, 4)});
  ASSERT_TRUE(first.ok());
  // The same pictures: the slot's tokens are reused past the pictures.
  int64_t before = engine->stats().cached_tokens;
  auto again = engine->Generate({WithPictures(same, 4)});
  ASSERT_TRUE(again.ok());
  const int64_t n = static_cast<int64_t>(tiny_vl::Prompt().size());
  EXPECT_EQ(engine->stats().cached_tokens - before, n - 1);
  EXPECT_EQ(*again, *first);
  // Other pictures behind the same placeholders: nothing from the first picture row on.
  before = engine->stats().cached_tokens;
  auto changed = engine->Generate({WithPictures(other, 4)});
  ASSERT_TRUE(changed.ok());
  EXPECT_EQ(engine->stats().cached_tokens - before, other->rows[0]);
  auto cold = MakeEngine(1, 64, 8)->Generate({WithPictures(other, 4)});
  ASSERT_TRUE(cold.ok());
  EXPECT_EQ(*changed, *cold);
}

// Engine::Hidden on a prompt with pictures: the residual stream of every row (picture rows
// included) equals the model's own forward pass over the same prompt and pictures; at layer 0
// a picture row is its picture's embedding; without the pictures the picture rows differ. The
// slot then holds the prompt with its picture rows keyed, as a request's.
TEST(EngineVision, HiddenOfPictureRowsEqualsTheModelsForward) {
  ASSERT_NE(VlModel(), nullptr);
  const PromptPictures pictures = tiny_vl::Pictures(/*layers=*/1);
  const std::vector<int32_t> prompt = tiny_vl::Prompt();
  const std::vector<int> layers = {0, 1, 2, tiny_vl::kLayers};
  auto direct = SequenceHidden(*VlModel(), prompt, pictures, layers);
  ASSERT_TRUE(direct.ok()) << direct.status().message();
  auto engine = MakeEngine(2, 64, 8);
  ASSERT_NE(engine, nullptr);
  auto hidden = engine->Hidden(prompt, /*slot=*/1, pictures, layers);
  ASSERT_TRUE(hidden.ok()) << hidden.status().message();
  ASSERT_EQ(hidden->size(), direct->size());
  EXPECT_EQ(*hidden, *direct);
  const int64_t n = static_cast<int64_t>(prompt.size()), dim = tiny_vl::kDim;
  for (size_t j = 0; j < pictures.rows.size(); ++j) {
    const float* row = hidden->data() + pictures.rows[j] * dim;  // layer 0
    EXPECT_TRUE(std::equal(row, row + dim, pictures.embeddings.begin() + j * dim)) << "row " << j;
  }
  // The same tokens as text (each picture row its placeholder's embedding, text positions).
  auto text = engine->Hidden(prompt, std::vector<int32_t>(n, 0), layers);
  ASSERT_TRUE(text.ok()) << text.status().message();
  const int64_t last = (layers.size() - 1) * n * dim;
  for (int32_t r : pictures.rows) {
    EXPECT_FALSE(std::equal(text->begin() + last + r * dim, text->begin() + last + (r + 1) * dim,
                            hidden->begin() + last + r * dim))
        << "row " << r;
  }
  const std::vector<int32_t>& held = engine->held(1);
  ASSERT_EQ(static_cast<int64_t>(held.size()), n);
  for (int64_t i = 0; i < n; ++i) {
    const bool picture =
        std::find(pictures.rows.begin(), pictures.rows.end(), i) != pictures.rows.end();
    if (picture) {
      EXPECT_LT(held[i], 0) << i;
    } else {
      EXPECT_EQ(held[i], prompt[i]) << i;
    }
  }
  // A slot that holds something, and pictures that are not the prompt's.
  auto again = engine->Hidden(prompt, 1, pictures, layers);
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.status().message().find("hold nothing"), std::string::npos);
  ASSERT_TRUE(engine->Reset(1).ok());
  PromptPictures bad = pictures;
  bad.embeddings.pop_back();
  again = engine->Hidden(prompt, 1, bad, layers);
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.status().message().find("embeddings"), std::string::npos);
  ASSERT_TRUE(engine->Hidden(prompt, 1, pictures, layers).ok());
}

TEST(EngineVision, BadPicturesAreRefused) {
  ASSERT_NE(VlModel(), nullptr);
  auto engine = MakeEngine(1, 64, 8);
  ASSERT_NE(engine, nullptr);
  PromptPictures p = tiny_vl::Pictures(1);
  p.positions.t.pop_back();
  auto id = engine->Add(WithPictures(std::make_shared<PromptPictures>(p), 4));
  ASSERT_FALSE(id.ok());
  EXPECT_NE(id.status().message().find("three rotary positions"), std::string::npos);
  p = tiny_vl::Pictures(1);
  p.embeddings.pop_back();
  id = engine->Add(WithPictures(std::make_shared<PromptPictures>(p), 4));
  ASSERT_FALSE(id.ok());
  EXPECT_NE(id.status().message().find("embeddings"), std::string::npos);
  p = tiny_vl::Pictures(tiny_vl::kLayers + 1);
  id = engine->Add(WithPictures(std::make_shared<PromptPictures>(p), 4));
  ASSERT_FALSE(id.ok());
  EXPECT_NE(id.status().message().find("deepstack"), std::string::npos);
  p = tiny_vl::Pictures(1);
  std::swap(p.rows[0], p.rows[1]);
  id = engine->Add(WithPictures(std::make_shared<PromptPictures>(p), 4));
  ASSERT_FALSE(id.ok());
  EXPECT_NE(id.status().message().find("ascending"), std::string::npos);
}

}  // namespace
}  // namespace gizllm
