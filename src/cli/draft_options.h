// Drafts, shared by run, chat, bench and serve: --draft and --drafts.
#pragma once

#include <cstdint>
#include <string>

#include "cli/command.h"
#include "engine/engine.h"
#include "cli/model_options.h"

namespace gizllm::cli {

struct DraftOptions {
  std::string draft = "auto";  // auto, mtp, lookup, none; dflash is refused for now
  int32_t drafts = 3;
  int64_t draft_vocab = 0;  // MTP drafts over the first N token ids only (FR-Spec); 0: all

  void Add(CLI::App* app);
  // Sets the engine's draft mode and count for `model`; a drafter the model has no part for or
  // that is not built yet is refused, naming it.
  Status Apply(LoadedModel& model, EngineOptions* options) const;
};

}  // namespace gizllm::cli
