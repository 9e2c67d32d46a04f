// A scripted model for testing the server without weights: bytes are tokens, answers are a
// function of the prompt, one token (or `tokens_per_step`) per request per step in at most `slots`
// slots.
//
// Answers: a prompt that contains "CALL" gets a tool call to get_weather (in the XML form when
// the prompt's tools line is "<|tools:xml|>", as FakeTextModel of that syntax writes it); "THINK"
// gets reasoning then content; "FOREVER" never stops by itself (up to its limit); "CRASH" makes the
// step that runs it fail (as a broken device would), failing every request in flight; any other
// prompt gets "Hello! You said <the prompt's last 8 bytes>." With temperature > 0, the bytes of the
// answer are drawn from the seed (a fresh one when none is given). A request with a grammar gets
// the scripted answer up to the first byte the grammar refuses, as a constrained model could write
// no more of it.
#pragma once

#include <chrono>
#include <deque>
#include <map>
#include <random>
#include <vector>

#include "server/generator.h"

namespace gizllm::server {

class FakeTextModel : public TextModel {
 public:
  static constexpr int32_t kEnd = 256;  // the end-of-turn token; vocab is 257

  explicit FakeTextModel(int32_t context = 4096, ToolCallSyntax syntax = ToolCallSyntax::kJson)
      : context_(context), syntax_(syntax) {}
  std::string Name() const override { return "fake"; }
  int32_t Context() const override { return context_; }
  int32_t Vocab() const override { return 257; }
  Expected<std::vector<int32_t>> Tokenize(std::string_view text) const override;
  Expected<std::string> Detokenize(std::span<const int32_t> tokens) const override;
  // "<|tools|>TOOLS\n" ("<|tools:xml|>" for the XML syntax) when there are tools,
  // "<|role|>content\n" per message, then (with the generation prompt) "<|assistant|>", "<think>\n"
  // when enable_thinking is true, and the answer's prefix.
  Expected<ChatPrompt> RenderChat(const ChatInput& input) const override;
  ToolCallSyntax ToolSyntax() const override { return syntax_; }

 private:
  int32_t context_;
  ToolCallSyntax syntax_;
};

class FakeGenerator : public Generator {
 public:
  // step_time: how long each Advance takes, like a model's step.
  explicit FakeGenerator(int32_t slots = 4,
                         std::chrono::microseconds step_time = std::chrono::microseconds(0))
      : slots_(slots), step_time_(step_time) {}
  Expected<int64_t> Add(GenerateRequest request) override;
  Expected<std::vector<GenerateProgress>> Advance() override;
  void Cancel(int64_t id) override;
  bool Busy() const override { return !waiting_.empty() || !running_.empty(); }
  GeneratorStats Stats() const override;

  // Tokens a request gets in one step, as an engine's kept drafts give several.
  int32_t tokens_per_step = 1;
  // The answer the script gives a prompt (greedy), without the end token.
  static std::string Answer(std::string_view prompt);
  int64_t steps() const { return steps_; }

 private:
  struct Sequence {
    int64_t id = 0;
    GenerateRequest request;
    std::string answer;  // scripted bytes
    size_t produced = 0;
    std::mt19937_64 random;
    int32_t slot = -1;
    int32_t cached = -1;  // reported with the first progress
    bool crash = false;   // the step that runs it fails
  };

  int32_t slots_;
  std::chrono::microseconds step_time_;
  int64_t next_id_ = 1;
  int64_t steps_ = 0;
  std::deque<Sequence> waiting_;
  std::map<int64_t, Sequence> running_;
  std::vector<std::vector<int32_t>> held_;  // [slots]: what each slot held last (prompt+answer)
  int64_t prompt_read_ = 0;
  int64_t prompt_cached_ = 0;
};

}  // namespace gizllm::server
