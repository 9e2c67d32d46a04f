// Shared draft options (not a command itself; named *_command.cc so the CLI target picks it up).
#include "cli/draft_options.h"

namespace gizllm::cli {

void DraftOptions::Add(CLI::App* app) {
  app->add_option("--draft", draft,
                  "Speculative drafts, read as extra rows of a sequence's step and kept while "
                  "they equal the tokens the request picks (the text is the same with or "
                  "without them): auto (lookup drafts where the measured step times and "
                  "acceptance say they pay), lookup (always, where the sequence's latest tokens "
                  "occurred before in its prompt or answer), none. mtp and dflash are not "
                  "built yet. Requests with penalties or a grammar make no drafts; on models "
                  "with recurrent layers a step with drafts also copies each drafting "
                  "sequence's recurrent states once")
      ->default_val("auto");
  app->add_option("--drafts", drafts, "Most drafts a sequence carries in a step (0 to 16)")
      ->default_val(3);
}

Status DraftOptions::Apply(const Model& model, EngineOptions* options) const {
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
    return Unimplemented(
        model.HasMtp()
            ? "--draft mtp: the engine does not draft with the model's MTP layer yet (it runs: "
              "gizllm logits --mtp); use --draft lookup, auto or none"
            : "--draft mtp: the model (" + model.arch().family +
                  ") has no MTP layer; use --draft lookup, auto or none");
  } else if (draft == "dflash") {
    return Unimplemented(
        "--draft dflash: DFlash drafters are not built yet; use --draft lookup, auto or none");
  } else {
    return InvalidArgument("--draft: expected auto, lookup or none, got \"" + draft + "\"");
  }
  if (drafts == 0) options->draft = DraftMode::kNone;
  return Status::Ok();
}

}  // namespace gizllm::cli
