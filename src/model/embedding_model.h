// EmbeddingModel: an encoder (or a decoder run to its last hidden state, as Qwen3-Embedding)
// with its tokenizer and sentence-transformers configuration, as the `embed` and `rerank`
// commands and the server's embeddings, rerank and score routes use it: texts to pooled
// vectors, (query, document) pairs to scores (encoders with a classification head).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "model/encoder.h"
#include "model/model.h"
#include "model/pooling.h"
#include "tokenizer/tokenizer.h"

namespace gizllm {

class EmbeddingModel {
 public:
  // The rows of one encoder run at most: batches are cut into runs of whole sequences of at most
  // this many tokens (a sequence longer than that runs alone).
  static constexpr int64_t kRunTokens = 8192;

  static Expected<std::unique_ptr<EmbeddingModel>> Load(const std::string& dir,
                                                        std::shared_ptr<Backend> backend);

  // Whether the encoder has a classification head: it scores pairs (a server's rerank task)
  // rather than embeds.
  bool reranks() const { return encoder_ && encoder_->arch().head != EncoderHead::kNone; }
  const std::string& family() const;
  int64_t vocab() const;
  const EmbeddingConfig& config() const { return config_; }
  const Tokenizer& tokenizer() const { return tokenizer_; }
  int64_t dim() const;
  // The most tokens of one text or pair: sentence_bert_config.json's max_seq_length where given,
  // never more than the model's positions.
  int64_t max_tokens() const;

  // A text's tokens with the tokenizer's special tokens, cut at `limit` tokens (0: at
  // max_tokens()).
  Expected<Encoding> Tokenize(std::string_view text, int64_t limit = 0) const;
  // A (query, document) pair's, cut as Hugging Face's longest_first truncation.
  Expected<Encoding> TokenizePair(std::string_view query, std::string_view document) const;

  // One pooled (and, as configured, normalized) vector of dim() floats a sequence.
  Expected<std::vector<std::vector<float>>> Embed(std::span<const Encoding> sequences);
  // One score a pair: the head's logit under the configured activation (a head of one label).
  Expected<std::vector<float>> Score(std::span<const Encoding> pairs);

 private:
  EmbeddingModel() = default;
  // The runs of at most kRunTokens tokens: [first, end) sequence ranges.
  static std::vector<std::pair<size_t, size_t>> Runs(std::span<const Encoding> sequences);

  std::unique_ptr<Encoder> encoder_;  // or
  std::unique_ptr<Model> decoder_;
  Tokenizer tokenizer_;
  EmbeddingConfig config_;
};

}  // namespace gizllm
