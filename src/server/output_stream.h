// From a request's new tokens to the pieces of its answer: incremental decoding that never cuts a
// character, stop strings (text that may still become one is held back), then the output parser
// (reasoning, content, tool calls).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "server/generator.h"

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

// Qwen3-style tags: <think>...</think> reasoning, <tool_call>{"name", "arguments"}</tool_call>.
class TaggedOutputParser : public OutputParser {
 public:
  explicit TaggedOutputParser(bool thinking) : state_(thinking ? kReasoning : kContent) {}
  OutputDelta Feed(std::string_view text) override;
  OutputDelta Finish() override;

 private:
  enum State { kContent, kReasoning, kToolCall };
  void Run(bool final, OutputDelta* out);
  void Emit(std::string_view text, OutputDelta* out);

  State state_;
  std::string pending_;           // text not yet given out: maybe the start of a tag
  std::string call_;              // text of the tool call being read
  bool after_reasoning_ = false;  // strip the blank lines after </think>
  bool after_call_ = false;       // hold blank text after </tool_call>
};

class OutputStream {
 public:
  // `parser` null: the whole answer is content.
  OutputStream(const TextModel& text, std::vector<std::string> stop,
               std::unique_ptr<OutputParser> parser);
  // Adds tokens; returns what is ready to send. After a stop string, tokens are ignored.
  Expected<OutputDelta> Push(std::span<const int32_t> tokens);
  // At the end of the answer: everything held back.
  Expected<OutputDelta> Finish();
  // Whether a stop string ended the answer (the text from it on is dropped).
  bool stopped() const { return stopped_; }
  // Everything the decoder gave out before any stop string (the raw answer text).
  const std::string& text() const { return text_; }

 private:
  OutputDelta Parse(std::string_view text);

  TokenDecoder decoder_;
  std::vector<std::string> stop_;
  std::unique_ptr<OutputParser> parser_;
  std::string held_;  // decoded text that may be the start of a stop string
  std::string text_;
  bool stopped_ = false;
};

}  // namespace gizllm::server
