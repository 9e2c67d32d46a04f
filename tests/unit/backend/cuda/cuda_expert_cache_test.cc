// The CUDA backend's expert cache (LoadOptions::expert_cache) on the tiny random mixture-of-experts
// models (tests/unit/jobs/tiny_moe_folder.h: Qwen3-MoE, and Qwen3-Next and Qwen3.5-MoE with a
// gated shared expert): with slots for a quarter of the model's experts, the logits (whole
// prompts and chunks of 5 rows through the grouped kernels, where a step's experts outnumber the
// slots and run in runs of rows; chunks of 3 and 1 rows through the decode kernels) and the
// engine's greedy tokens are those of the run with every expert on the device, bit for bit, in
// both modes, and the cache both hit and missed. Too few slots are refused at load, naming the
// least. Skipped without a CUDA device.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "engine/engine.h"
#include "model/evaluate.h"
#include "model/model.h"
#include "ops/device.h"
#include "unit/jobs/tiny_moe_folder.h"

namespace gizllm {
namespace {

#define GZ_SKIP_WITHOUT_CUDA()                                                     \
  do {                                                                             \
    if (CudaDeviceCount() == 0)                                                    \
      GTEST_SKIP() << "no CUDA device was found: CUDA expert cache tests skipped"; \
  } while (0)

// A folder under the system's temporary directory, removed with what it holds when it goes.
class Scratch {
 public:
  explicit Scratch(const std::string& name)
      : path_(std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~Scratch() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

Expected<std::unique_ptr<Model>> LoadCuda(const std::string& dir, bool exact,
                                          int64_t expert_cache) {
  DeviceOptions device;
  device.device = "cuda";
  device.exact = exact;
  GZ_ASSIGN_OR_RETURN(std::shared_ptr<Backend> backend, OpenBackend(device));
  LoadOptions options;
  options.expert_cache = expert_cache;
  return Model::Load(dir, backend, options);
}

int64_t Experts(const Arch& arch) {
  int64_t n = 0;
  for (const LayerSpec& l : arch.layer)
    if (l.IsMoe()) n += l.moe.experts;
  return n;
}

std::vector<std::vector<int32_t>> Greedy(Model& model) {
  std::mt19937 rng(3);
  std::vector<Request> requests;
  for (int i = 0; i < 6; ++i) {
    Request r;
    r.prompt.resize(2 + rng() % 20);
    for (int32_t& t : r.prompt) t = static_cast<int32_t>(rng() % tiny_moe::kVocab);
    r.limit = 12 + i;
    r.stop = std::vector<int32_t>{};
    r.sampling.temperature = 0.0f;
    requests.push_back(r);
  }
  EngineOptions options;
  options.slots = 4;
  options.context = 64;
  options.rows = 32;
  auto engine = Engine::Create(&model, options);
  EXPECT_TRUE(engine.ok()) << engine.status().message();
  if (!engine.ok()) return {};
  auto out = (*engine)->Generate(requests);
  EXPECT_TRUE(out.ok()) << out.status().message();
  return out.ok() ? *out : std::vector<std::vector<int32_t>>{};
}

TEST(CudaExpertCache, QuarterOfTheExpertsGivesTheResidentOutputs) {
  GZ_SKIP_WITHOUT_CUDA();
  const Scratch root("gizllm_cuda_expert_cache");
  std::vector<int32_t> tokens(23);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = (i * 37 + 5) % tiny_moe::kVocab;
  for (tiny_moe::Kind kind :
       {tiny_moe::Kind::kQwen3Moe, tiny_moe::Kind::kQwen3Next, tiny_moe::Kind::kQwen3_5Moe}) {
    const std::string name = tiny_moe::KindName(kind);
    const std::string dir = tiny_moe::Builder(9).Write(root.path() / name, kind);
    ASSERT_FALSE(dir.empty());
    for (bool exact : {true, false}) {
      SCOPED_TRACE(name + (exact ? " exact" : " fast"));
      auto resident = LoadCuda(dir, exact, /*expert_cache=*/0);
      ASSERT_TRUE(resident.ok()) << resident.status().message();
      EXPECT_EQ((*resident)->ExpertCache().slots, 0);  // they fit: every expert placed
      const int64_t quarter = Experts((*resident)->arch()) / 4;
      ASSERT_GE(quarter, tiny_moe::kTopK);
      auto cached = LoadCuda(dir, exact, quarter);
      ASSERT_TRUE(cached.ok()) << cached.status().message();
      ASSERT_EQ((*cached)->ExpertCache().slots, quarter);
      for (int64_t chunk : {int64_t{256}, int64_t{5}, int64_t{3}, int64_t{1}}) {
        auto want = SequenceLogits(**resident, tokens, chunk);
        ASSERT_TRUE(want.ok()) << want.status().message();
        auto got = SequenceLogits(**cached, tokens, chunk);
        ASSERT_TRUE(got.ok()) << got.status().message();
        ASSERT_EQ(got->size(), want->size());
        size_t differ = 0;
        for (size_t i = 0; i < want->size(); ++i)
          differ += std::memcmp(&(*got)[i], &(*want)[i], sizeof(float)) != 0;
        EXPECT_EQ(differ, 0u) << "chunk " << chunk << ": logits that differ from the resident run";
      }
      const auto want = Greedy(**resident);
      const auto got = Greedy(**cached);
      ASSERT_EQ(want.size(), 6u);
      EXPECT_EQ(got, want);
      const ExpertCacheStats stats = (*cached)->ExpertCache();
      EXPECT_GT(stats.misses, 0);
      EXPECT_GT(stats.hits, 0);
      EXPECT_GE(stats.read_ms, 0.0);
    }
  }
}

TEST(CudaExpertCache, TooFewSlotsAreRefused) {
  GZ_SKIP_WITHOUT_CUDA();
  const Scratch root("gizllm_cuda_expert_cache_few");
  const std::string dir =
      tiny_moe::Builder(9).Write(root.path() / "moe", tiny_moe::Kind::kQwen3Moe);
  ASSERT_FALSE(dir.empty());
  auto model = LoadCuda(dir, /*exact=*/true, /*expert_cache=*/tiny_moe::kTopK - 1);
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("at least " + std::to_string(tiny_moe::kTopK)),
            std::string::npos)
      << model.status().message();
  // As many slots as experts: every expert placed, no cache.
  auto all = LoadCuda(dir, /*exact=*/true, /*expert_cache=*/1000);
  ASSERT_TRUE(all.ok()) << all.status().message();
  EXPECT_EQ((*all)->ExpertCache().slots, 0);
}

}  // namespace
}  // namespace gizllm
