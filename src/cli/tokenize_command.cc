// gizllm tokenize: token ids of text, as the model's tokenizer reads it.
//   --jsonl: each stdin line is a JSON string; each output line is the JSON array of its ids.
//   Without it, all of stdin is one text and the output is one array.
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/command.h"
#include "tokenizer/tokenizer.h"

namespace gizllm::cli {
namespace {

void AppendIds(const std::vector<int32_t>& ids, std::string* out) {
  out->push_back('[');
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) out->push_back(',');
    *out += std::to_string(ids[i]);
  }
  out->append("]\n");
}

}  // namespace

void AddTokenizeCommand(CLI::App& app, CommandContext& ctx) {
  auto* cmd = app.add_subcommand("tokenize", "Print the token ids of text read from stdin");
  struct Options {
    std::string model = "models/tiny-chat";
    bool jsonl = false;
    bool special = false;
  };
  auto o = std::make_shared<Options>();
  cmd->add_option("--model", o->model, "Model folder or tokenizer.json")->capture_default_str();
  cmd->add_flag("--jsonl", o->jsonl, "Each stdin line is a JSON string; print one array per line");
  cmd->add_flag("--special", o->special, "Add the special tokens the post-processor adds (BOS)");
  cmd->callback([&ctx, o] {
    auto tokenizer = Tokenizer::Load(o->model);
    if (!tokenizer.ok()) return void(ctx.exit_code = Fail(tokenizer.status().message()));
    std::string out;
    if (!o->jsonl) {
      std::string text((std::istreambuf_iterator<char>(std::cin)),
                       std::istreambuf_iterator<char>());
      auto ids = tokenizer->Encode(text, o->special);
      if (!ids.ok()) return void(ctx.exit_code = Fail("stdin: " + ids.status().message()));
      AppendIds(*ids, &out);
      std::fwrite(out.data(), 1, out.size(), stdout);
      return;
    }
    std::string line;
    for (int64_t number = 1; std::getline(std::cin, line); ++number) {
      nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      std::string where = "stdin line " + std::to_string(number);
      if (j.is_discarded() || !j.is_string()) {
        std::fwrite(out.data(), 1, out.size(), stdout);
        return void(ctx.exit_code = Fail(where + ": expected a JSON string"));
      }
      auto ids = tokenizer->Encode(j.get_ref<const std::string&>(), o->special);
      if (!ids.ok()) {
        std::fwrite(out.data(), 1, out.size(), stdout);
        return void(ctx.exit_code = Fail(where + ": " + ids.status().message()));
      }
      AppendIds(*ids, &out);
      if (out.size() > (1 << 16)) {
        std::fwrite(out.data(), 1, out.size(), stdout);
        out.clear();
      }
    }
    std::fwrite(out.data(), 1, out.size(), stdout);
  });
}

}  // namespace gizllm::cli
