// What the server asks of an encoder (the embed and rerank tasks): tokens in, vectors or scores
// out. The HTTP layer is written against this interface and tested with a fake; the real
// implementation (real_encoder_model.h) wraps model/embedding_model.h.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

namespace gizllm::server {

// What a server does with its model: generate text (chat and completions), embed texts
// (/v1/embeddings) or score pairs (/v1/rerank, /v1/score).
enum class Task : uint8_t { kGenerate, kEmbed, kRerank };
std::string TaskName(Task t);                     // "generate", "embed", "rerank"
Expected<Task> ParseTask(std::string_view text);  // an error names --task and its values

// Thread safe: HTTP threads call it concurrently.
class EncoderModel {
 public:
  virtual ~EncoderModel() = default;
  virtual std::string Name() const = 0;
  virtual Task task() const = 0;  // kEmbed or kRerank
  virtual int32_t MaxTokens() const = 0;
  virtual int32_t Vocab() const = 0;
  virtual int64_t Dim() const = 0;  // of an embedding
  // A text's tokens with the tokenizer's special tokens, cut at `limit` tokens.
  virtual Expected<Encoding> Tokenize(std::string_view text, int64_t limit) const = 0;
  // A pair's, cut at MaxTokens() as Hugging Face's longest_first truncation.
  virtual Expected<Encoding> TokenizePair(std::string_view first,
                                          std::string_view second) const = 0;
  // Whether vectors have unit L2 norm (a Normalize module): cut to fewer dimensions, they are
  // normalized again.
  virtual bool Normalizes() const { return false; }
  // Ok where vectors of `dimensions` floats may be asked for: Dim(), or fewer where the model's
  // config says it was trained for them (Matryoshka); else an error saying which are allowed.
  virtual Status CheckDimensions(int64_t dimensions) const {
    if (dimensions == Dim()) return Status::Ok();
    return InvalidArgument("must be " + std::to_string(Dim()) +
                           ": this model was not trained for shorter (Matryoshka) embeddings");
  }
  // The text put before every text of a request: the prompt named `name`, or the default
  // prompt where `name` is nullopt ("" where the model has none). An unknown name is an error
  // listing the known ones.
  virtual Expected<std::string> Prompt(const std::optional<std::string>& name) const {
    if (!name) return std::string();
    return InvalidArgument("this model has no prompts (config_sentence_transformers.json)");
  }
  // One pooled vector of Dim() floats a sequence (kEmbed).
  virtual Expected<std::vector<std::vector<float>>> Embed(std::span<const Encoding> sequences) = 0;
  // One score a pair (kRerank).
  virtual Expected<std::vector<float>> Score(std::span<const Encoding> pairs) = 0;
};

}  // namespace gizllm::server
