// gizllm template: chats rendered with the model's chat template, as transformers'
// apply_chat_template(tokenize=False) renders them.
//   --jsonl: each stdin line is a JSON object {"messages": [...], "tools": [...],
//   "add_generation_prompt": true, ...extra template variables}; each output line is the
//   rendered prompt as a JSON string. Without it, all of stdin is one such object and the
//   prompt is printed as it is.
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/command.h"
#include "template/chat_template.h"

namespace gizllm::cli {

void AddTemplateCommand(CLI::App& app, CommandContext& ctx) {
  auto* cmd = app.add_subcommand("template", "Render chats read from stdin with the chat template");
  struct Options {
    std::string model = "models/tiny-chat";
    bool jsonl = false;
  };
  auto o = std::make_shared<Options>();
  cmd->add_option("--model", o->model,
                  "Model folder (tokenizer_config.json or chat_template.jinja)")
      ->capture_default_str();
  cmd->add_flag("--jsonl", o->jsonl, "Each stdin line is a chat; print one JSON string per line");
  cmd->callback([&ctx, o] {
    Expected<ChatTemplate> chat_template = ChatTemplate::Load(o->model);
    if (!chat_template.ok()) return void(ctx.exit_code = Fail(chat_template.status().message()));
    auto render = [&](const std::string& text, const std::string& where) -> Expected<std::string> {
      nlohmann::ordered_json chat =
          nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (chat.is_discarded() || !chat.is_object()) {
        return InvalidArgument(where + ": expected a JSON object {\"messages\": [...], ...}");
      }
      Expected<std::string> prompt = chat_template->Render(chat);
      if (!prompt.ok()) return prompt.status().Annotate(where);
      return prompt;
    };
    if (!o->jsonl) {
      std::string text((std::istreambuf_iterator<char>(std::cin)),
                       std::istreambuf_iterator<char>());
      Expected<std::string> prompt = render(text, "stdin");
      if (!prompt.ok()) return void(ctx.exit_code = Fail(prompt.status().message()));
      std::fwrite(prompt->data(), 1, prompt->size(), stdout);
      return;
    }
    std::string out;
    std::string line;
    for (int64_t number = 1; std::getline(std::cin, line); ++number) {
      if (line.empty()) continue;
      Expected<std::string> prompt = render(line, "stdin line " + std::to_string(number));
      if (!prompt.ok()) {
        std::fwrite(out.data(), 1, out.size(), stdout);
        return void(ctx.exit_code = Fail(prompt.status().message()));
      }
      out += nlohmann::json(*prompt).dump(-1, ' ', /*ensure_ascii=*/false,
                                          nlohmann::json::error_handler_t::replace);
      out += '\n';
      if (out.size() > (1 << 16)) {
        std::fwrite(out.data(), 1, out.size(), stdout);
        out.clear();
      }
    }
    std::fwrite(out.data(), 1, out.size(), stdout);
  });
}

}  // namespace gizllm::cli
