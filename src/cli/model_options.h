// Options every command that loads a model shares: --model, --device, --threads, --exact, --kv,
// --expert-cache.
#pragma once

#include <memory>
#include <string>

#include "cli/command.h"
#include "model/embedding_model.h"
#include "model/model.h"
#include "ops/device.h"

namespace gizllm::cli {

inline constexpr const char* kDefaultModel = "models/tiny-chat";

struct ModelOptions {
  std::string model = kDefaultModel;
  DeviceOptions device;
  int layers = -1;
  std::string kv = "auto";   // --kv as ParseKvBits reads it, or auto: the backend's default
  int64_t expert_cache = 0;  // LoadOptions::expert_cache

  void Add(CLI::App* app);
  // Opens the backend and loads the model; prints the load time on stderr when `verbose`.
  Expected<std::unique_ptr<Model>> Load(bool verbose) const;
  // With --kv auto: the KV format AutoKvFormat picks for `slots` contexts of `context` positions
  // in `budget` bytes (from the device's default down: the first of more than 4 bits that holds
  // them all, else the first of 4 bits or fewer that holds one, else the smallest), set on the
  // model before its pool is allocated; a line on stderr says so when it is not the device's
  // default. An error where not even one context fits at the narrowest format. Any other --kv:
  // nothing to do.
  Status FitKv(Model* model, int32_t slots, int64_t context, int64_t budget, bool verbose) const;
  // The same for an embedder or reranker: an encoder, or a decoder that embeds (embed, rerank,
  // serve --task embed|rerank).
  Expected<std::unique_ptr<EmbeddingModel>> LoadEmbedding(bool verbose) const;
};

// The model folder: --model as given, or the default model found next to the executable's
// source tree when the working directory is elsewhere.
std::string ResolveModelDir(const std::string& model);

}  // namespace gizllm::cli
