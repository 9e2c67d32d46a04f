// Shared draft options (not a command itself; named *_command.cc so the CLI target picks it up).
#include "cli/draft_options.h"

#include <algorithm>

#include "model/dflash.h"

namespace gizllm::cli {

void DraftOptions::Add(CLI::App* app) {
  app->add_option("--draft", draft,
                  "Speculative drafts, read as extra rows of a sequence's step and kept while "
                  "they equal the tokens the request picks (the text is the same with or "
                  "without them): auto (the model's MTP layer where it has one, else lookup, "
                  "only where the measured step times and acceptance say drafts pay), mtp "
                  "(always, with the model's multi-token prediction layer, chained for each "
                  "further draft), lookup (always, where the sequence's latest tokens occurred "
                  "before in its prompt or answer), dflash (always, with the DFlash drafter of "
                  "--drafter: a block of drafts in one pass of its layers over the model's "
                  "hidden states), none. Requests with "
                  "penalties, a grammar or pictures make no drafts; on models with recurrent "
                  "layers a step with drafts also copies each drafting sequence's recurrent "
                  "states once")
      ->default_val("auto");
  drafts_option = app->add_option("--drafts", drafts,
                                  "Most drafts a sequence carries in a step (0 to 16; default 3, "
                                  "with --draft dflash the drafter's block size less one)")
                      ->default_val(3);
  app->add_option("--drafter", drafter,
                  "A DFlash drafter's folder for --draft dflash (z-lab's layout: config.json "
                  "with architectures DFlashDraftModel, block_size and dflash_config, and its "
                  "safetensors), made for this model: it reads the model's hidden states, "
                  "embedding and head");
  app->add_option("--draft-vocab", draft_vocab,
                  "MTP drafts pick among the first N token ids only (FR-Spec: a BPE vocabulary's "
                  "first ids are its most frequent tokens), so the MTP layer's head computes N "
                  "logits a draft instead of the whole vocabulary's; 0: all")
      ->default_val(0);
}

Status DraftOptions::Apply(LoadedModel& model, EngineOptions* options, int threads) const {
  if (drafts < 0 || drafts > EngineOptions::kMaxDrafts) {
    return InvalidArgument("--drafts: expected 0 to " + std::to_string(EngineOptions::kMaxDrafts) +
                           ", got " + std::to_string(drafts));
  }
  options->drafts = drafts;
  if (draft == "auto") {
    options->draft = DraftMode::kAuto;
  } else if (draft == "lookup") {
    options->draft = DraftMode::kLookup;
  } else if (draft == "none") {
    options->draft = DraftMode::kNone;
  } else if (draft == "mtp") {
    if (!model.HasMtp()) {
      return InvalidArgument("--draft mtp: the model (" + model.arch().family +
                             ") has no MTP layer; use --draft lookup, auto or none");
    }
    options->draft = DraftMode::kMtp;
  } else if (draft == "dflash") {
    if (drafter.empty()) {
      return InvalidArgument("--draft dflash: name the drafter's folder with --drafter DIR");
    }
    if (model.pipeline()) {
      return Unimplemented("--draft dflash: not with --pipeline (the stages keep no hidden states "
                           "for the drafter)");
    }
    auto loaded = DFlashDrafter::Open(drafter, model.runner(), threads);
    if (!loaded.ok()) return loaded.status().Annotate("--drafter");
    options->draft = DraftMode::kBlock;
    if (!drafts_option || drafts_option->count() == 0) {
      options->drafts = std::min<int32_t>((*loaded)->MostDrafts(), EngineOptions::kMaxDrafts);
    } else if (drafts > (*loaded)->MostDrafts()) {
      return InvalidArgument("--drafts " + std::to_string(drafts) + ": the drafter's block of " +
                             std::to_string((*loaded)->MostDrafts() + 1) + " gives at most " +
                             std::to_string((*loaded)->MostDrafts()));
    }
    options->block_drafter = loaded->get();
    model.SetDrafter(std::move(*loaded));
  } else {
    return InvalidArgument("--draft: expected auto, mtp, lookup, dflash or none, got \"" + draft +
                           "\"");
  }
  if (!drafter.empty() && draft != "dflash") {
    return InvalidArgument("--drafter: only --draft dflash reads a drafter");
  }
  if (drafts == 0) options->draft = DraftMode::kNone;
  if (draft_vocab != 0) {
    if (!model.HasMtp() || options->draft == DraftMode::kNone ||
        options->draft == DraftMode::kLookup) {
      return InvalidArgument("--draft-vocab: only MTP drafts (--draft mtp or auto on a model with "
                             "an MTP layer) pick from a vocabulary");
    }
    if (Status s = model.SetDraftVocab(draft_vocab); !s.ok()) return s.Annotate("--draft-vocab");
  }
  return Status::Ok();
}

}  // namespace gizllm::cli
