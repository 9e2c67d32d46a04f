// Drafts, shared by run, chat, bench and serve: --draft and --drafts.
#pragma once

#include <cstdint>
#include <string>

#include "cli/command.h"
#include "engine/engine.h"
#include "cli/model_options.h"

namespace gizllm::cli {

struct DraftOptions {
  std::string draft = "auto";  // auto, mtp, lookup, dflash, none
  int32_t drafts = 3;          // dflash without --drafts: the drafter's block less one
  int64_t draft_vocab = 0;  // MTP drafts over the first N token ids only (FR-Spec); 0: all
  std::string drafter;      // --drafter: a DFlash drafter's folder (--draft dflash)
  CLI::Option* drafts_option = nullptr;

  void Add(CLI::App* app);
  // Sets the engine's draft mode and count for `model`; a drafter the model has no part for is
  // refused, naming it. --draft dflash loads the drafter (kept by `model`).
  // `threads`: the drafter's matmul threads (the command's --threads; 0: one a core).
  Status Apply(LoadedModel& model, EngineOptions* options, int threads = 0) const;
};

}  // namespace gizllm::cli
