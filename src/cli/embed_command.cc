// gizllm embed: one vector a text, from an encoder (BERT, RoBERTa, XLM-R) or a decoder's final
// hidden states (Qwen3-Embedding), pooled as its sentence-transformers files say.
//   stdin: JSON lines, each a text (a JSON string); stdout: JSON lines, each the array of its
//   vector's floats, in the order read.
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli/model_options.h"
#include "cli/text_lines.h"

namespace gizllm::cli {

void AddEmbedCommand(CLI::App& app, CommandContext& ctx) {
  auto* cmd = app.add_subcommand(
      "embed",
      "Print one embedding a text from an encoder, or a decoder's final-normed hidden states "
      "(Qwen3-Embedding): stdin holds JSON lines of texts (JSON strings), stdout gets "
      "JSON lines of float arrays. Pooling and normalization follow the model's "
      "sentence-transformers files (modules.json, 1_Pooling/config.json; without them mean "
      "pooling, not normalized); a text longer than sentence_bert_config.json's max_seq_length "
      "or the model's positions is cut at its end, as sentence-transformers does. A prompt of "
      "config_sentence_transformers.json (--prompt-name, else its default_prompt_name) is put "
      "before every text");
  struct Options {
    ModelOptions model;
    int64_t batch = 256;
    std::optional<std::string> prompt_name;
    bool verbose = false;
  };
  auto o = std::make_shared<Options>();
  o->model.Add(cmd);
  cmd->add_option("--batch", o->batch, "Texts embedded together (packed, no padding)")
      ->default_val(256)
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--prompt-name", o->prompt_name,
                  "The prompt of config_sentence_transformers.json put before every text "
                  "(default: its default_prompt_name, if any)");
  cmd->add_flag("--verbose,-v", o->verbose, "Print what was loaded on stderr");
  cmd->callback([&ctx, o] {
    auto model = o->model.LoadEmbedding(o->verbose);
    if (!model.ok()) return void(ctx.exit_code = Fail(model.status().message()));
    auto prompt = PromptText((*model)->config(), o->prompt_name);
    if (!prompt.ok()) {
      return void(ctx.exit_code = Fail("--prompt-name: " + prompt.status().message()));
    }
    std::vector<Encoding> batch;
    std::string out;
    auto flush = [&]() -> Status {
      GZ_ASSIGN_OR_RETURN(auto vectors, (*model)->Embed(batch));
      for (const auto& v : vectors) AppendFloats(v, &out);
      std::fwrite(out.data(), 1, out.size(), stdout);
      out.clear();
      batch.clear();
      return Status::Ok();
    };
    Status read = ForEachTextLine(std::cin, [&](const std::string& text) -> Status {
      GZ_ASSIGN_OR_RETURN(Encoding e, (*model)->Tokenize(*prompt + text));
      batch.push_back(std::move(e));
      if (static_cast<int64_t>(batch.size()) >= o->batch) return flush();
      return Status::Ok();
    });
    if (read.ok()) read = flush();
    if (!read.ok()) ctx.exit_code = Fail(read.message());
  });
}

}  // namespace gizllm::cli
