// What the server asks of a model: Generator (the engine side: requests in, tokens out) and
// TextModel (the text side: tokenizer and chat template). The HTTP layer, the OpenAI
// schema and the metrics are written against these two interfaces and tested with a fake; the
// real implementation (real_generator.h) wraps the Engine on a Model.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"
#include "grammar/grammar.h"
#include "model/picture_prompt.h"
#include "ops/expert_cache.h"
#include "template/chat_prompt.h"
#include "template/output_parser.h"

namespace gizllm::server {

// How a request picks each token; the fields of the Engine's Sampling as OpenAI names them.
struct SamplingOptions {
  float temperature = 1.0f;      // 0: greedy
  int32_t top_k = 0;             // 0: all tokens
  float top_p = 1.0f;            // 1: all tokens
  float min_p = 0.0f;            // 0: off
  float presence = 0.0f;         // OpenAI presence_penalty
  float frequency = 0.0f;        // OpenAI frequency_penalty
  float repetition = 1.0f;       // vLLM repetition_penalty, 1: off
  std::optional<uint64_t> seed;  // none: a fresh seed per request
  int32_t logprobs = -1;         // -1: none; n >= 0: each token's logprob and the n most likely
  // The answer follows this grammar (response_format, grammar, guided_json, ...); none: free.
  std::shared_ptr<const Grammar> grammar;
  // A chat's answer may think first (<think> ... </think>, where the model's vocabulary has those
  // tokens): the grammar holds the text after the thinking. thinking: the prompt opened it.
  bool grammar_after_thinking = false;
  bool thinking = false;
};

struct GenerateRequest {
  std::vector<int32_t> prompt;  // [tokens]
  int32_t limit = 16;           // most new tokens
  SamplingOptions sampling;
  int32_t mark = -1;        // where a chat's messages end (-1: not a chat)
  int32_t shared = -1;      // length of a start many prompts share (-1: none)
  bool ignore_eos = false;  // run to the limit through the model's stop tokens
  // The prompt's pictures and videos, placed in `prompt` (which holds their placeholders
  // expanded); the generator runs the tower on them. Null: none.
  std::shared_ptr<const PlacedPrompt> media;
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;  // the most likely tokens, best first
};

// What one step did for one request.
struct GenerateProgress {
  int64_t id = 0;
  std::vector<int32_t> tokens;         // new tokens, without the stop token
  std::vector<TokenLogprob> logprobs;  // one per token in `tokens` when asked for
  int32_t cached = -1;                 // prompt tokens the slot already held; >= 0 once, when
                                       // the request took its slot
  std::string end;                     // "stop", "length", "error" or "" (goes on)
  Status status;                       // why it ended, when `end` is "error"
};

// One drafter's drafts (engine/engine.h DraftStats).
struct DrafterStats {
  std::string name;      // "lookup"
  int64_t drafted = 0;   // drafts read
  int64_t accepted = 0;  // drafts kept
  int64_t steps = 0;     // steps that carried any
};

// Engine-wide figures for /metrics.
struct GeneratorStats {
  int64_t kv_pages_used = 0;
  int64_t kv_pages_total = 0;
  int64_t prompt_tokens_read = 0;    // prompt tokens the model read
  int64_t prompt_tokens_cached = 0;  // prompt tokens taken from a slot or a stored prefix
  int64_t preemptions = 0;
  int32_t waiting = 0;  // requests added but not in a slot
  int32_t running = 0;  // requests in a slot
  int32_t slots = 0;
  int64_t steps = 0;                   // engine steps
  int64_t grammar_masks_shared = 0;    // masks a request took from another of its grammar
  std::vector<DrafterStats> drafters;  // per drafter
  ExpertCacheStats expert_cache;       // the model's expert cache (slots 0: none)
};

// The engine side. Not thread safe: the server calls it from its one engine thread only.
class Generator {
 public:
  virtual ~Generator() = default;
  // Queues a request; returns its id. An error names the request field at fault.
  virtual Expected<int64_t> Add(GenerateRequest request) = 0;
  // Runs one step; returns what each request got from it.
  virtual Expected<std::vector<GenerateProgress>> Advance() = 0;
  // Ends a request now; its slot is free for the next step. Unknown ids are ignored.
  virtual void Cancel(int64_t id) = 0;
  // Whether any request is waiting or running.
  virtual bool Busy() const = 0;
  virtual GeneratorStats Stats() const = 0;
};

// A tool call parsed from the model's output.
struct ToolCall {
  std::string name;
  std::string arguments;  // JSON text of the arguments object
};

// What a piece of the model's output adds to the answer.
struct OutputDelta {
  std::string reasoning;
  std::string content;
  std::vector<ToolCall> tool_calls;  // complete calls only

  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
  void Append(OutputDelta other);
};

// What the chat template reads: the request's messages and tools, as Hugging Face passes them.
struct ChatInput {
  nlohmann::json messages;  // array of {role, content, tool_calls?, tool_call_id?, ...}
  nlohmann::json tools;     // array of {type: "function", function: {...}} or null
  std::optional<bool> enable_thinking;
  bool add_generation_prompt = true;  // false: the messages alone (/tokenize)
  // Text the answer starts with, rendered after the generation prompt (a forced tool call).
  std::string answer_prefix;
};

// The text side. Thread safe: HTTP threads call it concurrently.
class TextModel {
 public:
  virtual ~TextModel() = default;
  virtual std::string Name() const = 0;
  // The most positions a request may use, prompt and answer together.
  virtual int32_t Context() const = 0;
  virtual Expected<std::vector<int32_t>> Tokenize(std::string_view text) const = 0;
  // The text of `tokens` (bytes, maybe invalid UTF-8 where a character is cut).
  virtual Expected<std::string> Detokenize(std::span<const int32_t> tokens) const = 0;
  virtual int32_t Vocab() const = 0;
  // The chat's prompt: its text and tokens, where its messages end (`mark`) and where the system
  // turn with the tools ends (`system_end`), as gizllm::ChatPrompt::Render gives them.
  virtual Expected<ChatPrompt> RenderChat(const ChatInput& input) const = 0;
  // How the chat template writes tool calls (a forced call's grammar follows it).
  virtual ToolCallSyntax ToolSyntax() const { return ToolCallSyntax::kJson; }
  // The chat template writes reasoning (<think> blocks): the model may think before its answer,
  // and a grammar holds the answer after the thinking.
  virtual bool Reasons() const { return false; }
  // What reads the model's pictures and videos (its Prepare* and Place, which are thread safe;
  // the generator runs the tower), or null for a model without a vision tower.
  virtual const PictureReader* Pictures() const { return nullptr; }
  // `prompt` with its videos written out in its text and tokenized again
  // (PictureReader::WriteVideos with the model's tokenizer). Called only where Pictures() is not
  // null.
  virtual Expected<ChatPrompt> WriteVideos(const ChatPrompt& prompt,
                                           const std::vector<VisionInput>& media) const {
    (void)media;
    if (!Pictures()) return InvalidArgument("the model reads no pictures or videos");
    return prompt;
  }
};

}  // namespace gizllm::server
