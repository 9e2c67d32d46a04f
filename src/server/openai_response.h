// Building OpenAI responses and stream chunks: ids, usage, tool calls, logprobs.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "server/generator.h"

namespace gizllm::server {

// `prefix` followed by 24 random hex digits, e.g. "chatcmpl-1f0c...".
std::string NewId(std::string_view prefix);

// JSON text; invalid UTF-8 in model output becomes U+FFFD instead of an exception.
std::string Dump(const nlohmann::json& value);

struct Usage {
  int64_t prompt = 0;
  int64_t completion = 0;
  int64_t cached = 0;  // prompt tokens the slot or a stored prefix already held
  nlohmann::json ToJson() const;
};

// [{"id", "type": "function", "function": {"name", "arguments"}}], with "index" when streamed.
nlohmann::json ToolCallsJson(const std::vector<ToolCall>& calls, int first_index, bool streamed);

// Chat logprobs: [{"token", "logprob", "bytes", "top_logprobs": [...]}] per token.
nlohmann::json ChatLogprobs(const TextModel& text, std::span<const TokenLogprob> logprobs);

// Completion logprobs: {"tokens", "token_logprobs", "top_logprobs", "text_offset"}; offsets count
// from `text_offset` on.
nlohmann::json CompletionLogprobs(const TextModel& text, std::span<const TokenLogprob> logprobs,
                                  int64_t text_offset);

}  // namespace gizllm::server
