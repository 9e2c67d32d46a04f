// A model's chat template: read from its folder, rendered as transformers'
// apply_chat_template(tokenize=False) renders it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"
#include "template/jinja.h"

namespace gizllm {

// A rendered chat and where its parts end, as character (byte) offsets into `prompt`.
struct RenderedChat {
  std::string prompt;
  // message_ends[i]: where the render of messages[0..i] (without a generation prompt) ends, for
  // every i where that render is a prefix of `prompt`; -1 where it is not, or where it was not
  // asked for.
  std::vector<long> message_ends;
  // Where the system turn with the tools ends: the render of only the system message (or of no
  // message) with the tools, when it is a prefix of `prompt`; -1 otherwise. A start that many
  // prompts share.
  long shared_end = -1;
};

class ChatTemplate {
 public:
  // Reads tokenizer_config.json's chat_template (a string, or a list of {name, template}) or
  // chat_template.jinja, and the bos and eos tokens; or, where `model_dir` is a .gguf file, its
  // tokenizer.chat_template and the texts of tokenizer.ggml.bos/eos_token_id (a bitgpu folder
  // without either file: its GGUF data file's). Errors name the file.
  static Expected<ChatTemplate> Load(const std::string& model_dir);
  static Expected<ChatTemplate> FromString(std::string source, std::string bos = "",
                                           std::string eos = "");

  // input: {"messages": [...], "tools": [...], "add_generation_prompt": bool, ...extra
  // variables (enable_thinking, reasoning_effort, ...)}. Errors name the request part or the
  // template line at fault.
  Expected<std::string> Render(const nlohmann::ordered_json& input) const;

  // The prompt plus the offsets where its messages end and where the shared system-and-tools
  // start ends. Each offset costs a render of that prefix: `last_messages` limits the message
  // ends found to the last few messages (a chat of 250 messages renders in about 2 ms; all its
  // prefixes take 0.5 s).
  Expected<RenderedChat> RenderWithOffsets(const nlohmann::ordered_json& input,
                                           size_t last_messages = SIZE_MAX) const;

  const std::string& source() const { return source_; }
  const std::string& bos_token() const { return bos_; }
  const std::string& eos_token() const { return eos_; }

 private:
  static Expected<ChatTemplate> LoadGguf(const std::string& path);
  // The template for a request: the "tool_use" one when tools are given and there is one.
  const jinja::Template& Pick(bool has_tools) const;

  std::string source_;                    // the default template's source
  std::string origin_ = "chat template";  // the file it came from, for errors
  std::shared_ptr<const jinja::Template> default_;
  std::shared_ptr<const jinja::Template> tool_use_;
  std::string bos_;
  std::string eos_;
  bool has_bos_ = false;
  bool has_eos_ = false;
};

}  // namespace gizllm
