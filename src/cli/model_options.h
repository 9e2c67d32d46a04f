// Options every command that loads a model shares: --model, --device, --threads, --exact, --kv,
// --expert-cache; and those that run the engine (run, chat, bench, serve): --pipeline, --gpus.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cli/command.h"
#include "model/block_drafter.h"
#include "model/embedding_model.h"
#include "model/model.h"
#include "model/pipeline_runner.h"
#include "ops/device.h"

namespace gizllm::cli {

inline constexpr const char* kDefaultModel = "models/tiny-chat";

// A model as the commands that run the engine load it: one Model, or with --pipeline its
// stages (a PipelineRunner). The engine drives runner(); the folder, the arch and the backend
// that runs beside the model (a vision tower) are the first stage's.
class LoadedModel {
 public:
  explicit LoadedModel(std::unique_ptr<Model> model) : model_(std::move(model)) {}
  LoadedModel(std::unique_ptr<PipelineRunner> pipeline, std::vector<int> devices)
      : pipeline_(std::move(pipeline)), devices_(std::move(devices)) {}

  Runner* runner() { return pipeline_ ? static_cast<Runner*>(pipeline_.get()) : model_.get(); }
  Model& first() { return pipeline_ ? pipeline_->stage(0) : *model_; }
  const Model& first() const { return pipeline_ ? pipeline_->stage(0) : *model_; }
  int stages() const { return pipeline_ ? pipeline_->stages() : 1; }
  PipelineRunner* pipeline() { return pipeline_.get(); }

  const std::string& dir() const { return first().dir(); }
  const Arch& arch() const { return first().arch(); }
  Backend& backend() { return first().backend(); }
  std::shared_ptr<Backend> shared_backend() const { return first().shared_backend(); }
  std::span<const CacheSpec> caches() const;
  int64_t PageBytes() const;
  // The caches KvBudgetFor reads: none where the runner pages every layer at every position
  // (a pipeline), so that the budget counts whole pages.
  std::span<const CacheSpec> BudgetCaches() const;
  KvFormat kv_format() const { return first().kv_format(); }
  int64_t PositionBytes(KvFormat format) const;
  Status SetKvFormat(KvFormat format);
  bool HasMtp() const;
  Status SetDraftVocab(int64_t tokens);
  ExpertCacheStats ExpertCache() const;
  int64_t Parameters() const;
  // The KV budget DefaultKvBudget gives, for the model's pages spread over its stages: each
  // device's budget over the share of a page its stages hold, the least of them.
  int64_t DefaultKvBudget();
  // The device memory to size `serve` from: one device's, or the pipeline's least device's
  // scaled up by the share of a page its stages hold.
  DeviceMemory Memory();
  // The backends' descriptions: "cpu (...)", or each stage's with its layers.
  std::string Describe();
  // A block drafter (--draft dflash) kept as long as the model.
  void SetDrafter(std::unique_ptr<BlockDrafter> drafter) { drafter_ = std::move(drafter); }

 private:
  std::unique_ptr<Model> model_;
  std::unique_ptr<BlockDrafter> drafter_;
  std::unique_ptr<PipelineRunner> pipeline_;
  std::vector<int> devices_;  // each stage's device (GPU index; 0 for every CPU stage)
};

struct ModelOptions {
  std::string model = kDefaultModel;
  DeviceOptions device;
  int layers = -1;
  std::string kv = "auto";   // --kv as ParseKvBits reads it, or auto: the backend's default
  int64_t expert_cache = 0;  // LoadOptions::expert_cache
  int pipeline = 0;          // --pipeline: stages (0: one Model)
  std::string gpus;          // --gpus: GPU indices, one a stage ("": 0, 1, ...)

  void Add(CLI::App* app);
  // --pipeline and --gpus, for the commands that run the engine (LoadRunner).
  void AddPipeline(CLI::App* app);
  // Opens the backend and loads the model; prints the load time on stderr when `verbose`.
  Expected<std::unique_ptr<Model>> Load(bool verbose) const;
  // Load, or with --pipeline (or --gpus) the stages over their backends.
  Expected<std::unique_ptr<LoadedModel>> LoadRunner(bool verbose) const;
  // The stages' GPU indices of --pipeline and --gpus (on the CPU, --pipeline zeros); empty: no
  // pipeline. `gpu_count`: the GPUs found (for the default list and the check).
  Expected<std::vector<int>> StageDevices(int gpu_count) const;
  // With --kv auto: the KV format AutoKvFormat picks for `slots` contexts of `context` positions
  // in `budget` bytes (from the device's default down: the first of more than 4 bits that holds
  // them all, else the first of 4 bits or fewer that holds one, else the smallest), set on the
  // model before its pool is allocated; a line on stderr says so when it is not the device's
  // default. An error where not even one context fits at the narrowest format. Any other --kv:
  // nothing to do.
  Status FitKv(LoadedModel* model, int32_t slots, int64_t context, int64_t budget,
               bool verbose) const;
  // The same for an embedder or reranker: an encoder, or a decoder that embeds (embed, rerank,
  // serve --task embed|rerank).
  Expected<std::unique_ptr<EmbeddingModel>> LoadEmbedding(bool verbose) const;
};

// The model folder: --model as given, or the default model found next to the executable's
// source tree when the working directory is elsewhere.
std::string ResolveModelDir(const std::string& model);

}  // namespace gizllm::cli
