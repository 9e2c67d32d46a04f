// Reading and checking OpenAI requests (/v1/chat/completions, /v1/completions, /tokenize,
// /detokenize): every field's type and range, so that a bad request is a 400 that names the
// field, never a crash or a silent default.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/status.h"
#include "server/api_error.h"
#include "server/generator.h"
#include "server/media.h"
#include "template/output_parser.h"

namespace gizllm::server {

// The most messages and tools one request may hold (OpenAI allows 128 tools). Each message and
// tool goes through the chat template, whose work grows with them.
inline constexpr size_t kMaxMessages = 4096;
inline constexpr size_t kMaxTools = 128;

// Parses a request body: JSON nested at most kMaxJsonNesting levels (checked before parsing, so
// that nothing after it recurses deeper), valid UTF-8.
std::optional<ApiError> ParseBody(std::string_view text, nlohmann::json* out);

// What chat and completion requests share.
struct GenerationParams {
  std::string model;                  // empty: the served model
  std::optional<int32_t> max_tokens;  // none: up to the context
  SamplingOptions sampling;
  std::vector<std::string> stop;  // stop strings, at most 4
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool logprobs = false;
  int32_t top_logprobs = 0;
  bool ignore_eos = false;  // vLLM's extension: generate through stop tokens (benchmarks)
  // What the request asked for and does not get, said in the response's "warnings" (a
  // response_format schema without strict that does not compile: the answer runs unconstrained).
  std::vector<std::string> warnings;
};

struct ChatRequest {
  GenerationParams params;
  ChatInput input;                   // messages and tools, normalized for the chat template
  nlohmann::json tools;              // the request's tools (array) or null
  std::string tool_choice = "auto";  // "none", "auto", "required" or "function"
  std::string forced_tool;           // the function's name when tool_choice names one
  // parallel_tool_calls (OpenAI's default true): a forced call may be followed by more; false:
  // the answer holds at most one call, forced or not.
  bool parallel_tool_calls = true;
  // The image_url and video_url parts of the user messages, in prompt order; their messages'
  // content is then a list of parts ({"type": "image"}, {"type": "video"}, text).
  std::vector<MediaPart> media;
};

// The GBNF of a forced tool call's text after "<tool_call>\n" in Qwen's syntax: the call
// object ({"name": ..., "arguments": ...}, the arguments following the tool's parameters schema)
// of the function `forced` names, or of any of `tools` when it is empty, then "\n</tool_call>";
// with `parallel` (the request's parallel_tool_calls) any number of further calls follow, each
// as "\n<tool_call>\n" CALL "\n</tool_call>".
// A parameters schema the JSON Schema compiler refuses is an error naming its path.
Expected<std::string> ToolCallGbnf(const nlohmann::json& tools, const std::string& forced,
                                   bool parallel = false);
// The same in the XML form (ToolCallSyntax::kXml), after "<tool_call>\n":
//   <function=NAME>\n(<parameter=KEY>\nVALUE\n</parameter>\n)*</function>\n</tool_call>
// NAME the forced function's or any tool's; the parameters those its schema lists, in the
// order of the request's properties (by name, as the prompt shows them), each at most once and
// the required ones always (a schema that lists none:
// any names). A value the output parser keeps as text (ArgumentIsText) is any text without
// "</parameter>", or one of a string enum's words; any other is a JSON value of its schema.
Expected<std::string> ToolCallXmlGbnf(const nlohmann::json& tools, const std::string& forced,
                                      bool parallel = false);
// `gbnf` with the rule name `from` written `to` wherever it stands as a name (not in literals,
// classes or comments).
std::string RenameGbnfRule(std::string_view gbnf, std::string_view from, std::string_view to);
// `gbnf` with every rule name prefixed by `prefix`.
std::string PrefixGbnfRules(std::string_view gbnf, std::string_view prefix);

struct CompletionRequest {
  GenerationParams params;
  std::string prompt_text;             // when the prompt is text
  std::vector<int32_t> prompt_tokens;  // when the prompt is token ids
  bool prompt_is_tokens = false;
  bool echo = false;
};

struct TokenizeRequest {
  std::string model;
  std::optional<ChatInput> chat;  // messages given: the rendered chat
  std::string prompt;
  bool add_generation_prompt = true;
};

struct DetokenizeRequest {
  std::string model;
  std::vector<int32_t> tokens;
};

// Each returns the error that the request's first bad field makes, or nothing.
// `syntax`: how the model writes tool calls (TextModel::ToolSyntax), which a forced call's
// grammar follows.
std::optional<ApiError> ParseChatRequest(const nlohmann::json& body, int32_t vocab,
                                         ChatRequest* out,
                                         ToolCallSyntax syntax = ToolCallSyntax::kJson);
std::optional<ApiError> ParseCompletionRequest(const nlohmann::json& body, int32_t vocab,
                                               CompletionRequest* out);
std::optional<ApiError> ParseTokenizeRequest(const nlohmann::json& body, TokenizeRequest* out);
std::optional<ApiError> ParseDetokenizeRequest(const nlohmann::json& body, int32_t vocab,
                                               DetokenizeRequest* out);

}  // namespace gizllm::server
