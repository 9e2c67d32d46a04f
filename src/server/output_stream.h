// From a request's new tokens to the pieces of its answer: incremental decoding that never cuts a
// character, stop strings (text that may still become one is held back), then the output parser
// (reasoning, content, tool calls): gizllm::OutputParser, the one the CLI chat uses too.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "server/generator.h"
#include "template/output_parser.h"

namespace gizllm::server {

// Whether `text` ends inside a UTF-8 character (or with U+FFFD, a decoder's mark for one).
bool EndsInsideCharacter(std::string_view text);

// Decodes tokens as they come; the text of the first n tokens is emitted once it is whole.
class TokenDecoder {
 public:
  explicit TokenDecoder(const TextModel& text) : text_(text) {}
  // Adds tokens; returns the text now complete. `final`: no token follows, emit everything.
  Expected<std::string> Push(std::span<const int32_t> tokens, bool final = false);

 private:
  const TextModel& text_;
  std::vector<int32_t> tokens_;
  size_t prefix_offset_ = 0;  // decoding starts here, so that a decoder sees a token's context
  size_t read_offset_ = 0;    // text up to here has been emitted
};

// How to read the answer to a chat with `tools` (a JSON array or null) whose prompt is `prompt`:
// reasoning when the prompt opened it or the answer opens it, tool calls when there are tools.
OutputParserOptions ChatParserOptions(const nlohmann::json& tools, const ChatPrompt& prompt);

// The events of gizllm::OutputParser as one delta.
OutputDelta ToDelta(std::vector<OutputEvent> events);

class OutputStream {
 public:
  // `parser` none: the whole answer is content (completions).
  OutputStream(const TextModel& text, std::vector<std::string> stop,
               std::optional<OutputParserOptions> parser);
  // The answer starts with `start`, which the prompt already holds (a forced tool call's
  // opening): the parser reads it as if the model had written it; nothing of it is sent.
  void Assume(std::string_view start);
  // Adds tokens; returns what is ready to send. After a stop string, tokens are ignored.
  Expected<OutputDelta> Push(std::span<const int32_t> tokens);
  // At the end of the answer: everything held back.
  Expected<OutputDelta> Finish();
  // The answer ends after its `n`-th complete tool call (a request's parallel_tool_calls false):
  // what follows the call is dropped, as after a stop string.
  void LimitToolCalls(int n) { max_calls_ = n; }
  // Whether a stop string (or the call limit) ended the answer (the text from it on is dropped).
  bool stopped() const { return stopped_; }
  // Everything the decoder gave out before any stop string (the raw answer text).
  const std::string& text() const { return text_; }

 private:
  OutputDelta Parse(std::string_view text);
  // The parser's events as a delta, cut after the last tool call allowed.
  OutputDelta Limit(std::vector<OutputEvent> events);
  bool CallLimitReached() const { return max_calls_ >= 0 && calls_ >= max_calls_; }

  TokenDecoder decoder_;
  std::vector<std::string> stop_;
  std::optional<OutputParser> parser_;
  std::string held_;  // decoded text that may be the start of a stop string
  std::string text_;
  bool stopped_ = false;
  int max_calls_ = -1;  // -1: no limit
  int calls_ = 0;
};

}  // namespace gizllm::server
