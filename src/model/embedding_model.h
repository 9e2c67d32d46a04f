// EmbeddingModel: an encoder (or a decoder run to its last hidden state, as Qwen3-Embedding)
// with its tokenizer and sentence-transformers configuration, as the `embed` and `rerank`
// commands and the server's embeddings, rerank and score routes use it: texts to pooled
// vectors, (query, document) pairs to scores (encoders with a classification head, or a decoder
// reading the pair in Qwen3-Reranker's prompt and answering with its "yes" and "no" logits).
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

  // The instruction of Qwen3-Reranker's prompt where none is given (its model card's).
  static constexpr const char* kRerankInstruction =
      "Given a web search query, retrieve relevant passages that answer the query";

  // Whether the model scores pairs (a server's rerank task) rather than embeds: an encoder with a
  // classification head, or a decoder made a reranker (RerankByYesNo).
  bool reranks() const {
    return (encoder_ && encoder_->arch().head != EncoderHead::kNone) || yes_no_.has_value();
  }
  bool is_decoder() const { return decoder_ != nullptr; }
  // Makes a decoder score pairs as Qwen3-Reranker does. A pair becomes the prompt
  //   <|im_start|>system\nJudge whether the Document meets the requirements based on the Query
  //   and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n
  //   <|im_start|>user\n<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}
  //   <|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n
  // (the middle part tokenized on its own and cut at its end to fit max_tokens()), and its
  // score is softmax([no, yes] logits of the last position))[yes]. The tokens: "no" and "yes",
  // or the two config.json's classifier_from_token names (vLLM's field); an error names a token
  // the tokenizer lacks. Load does this itself where classifier_from_token is given.
  Status RerankByYesNo(std::string instruction = kRerankInstruction);
  const std::string& family() const;
  std::string device() const;  // the backend's description
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

  // A decoder reranker's prompt around a pair, its tokens and its instruction.
  struct YesNo {
    std::vector<int32_t> prefix, suffix;  // the prompt before and after the pair's text
    int32_t no = -1, yes = -1;
    std::string instruction;
  };
  Expected<std::vector<float>> ScoreByYesNo(std::span<const Encoding> pairs);

  std::unique_ptr<Encoder> encoder_;  // or
  std::unique_ptr<Model> decoder_;
  std::optional<YesNo> yes_no_;
  Tokenizer tokenizer_;
  EmbeddingConfig config_;
};

}  // namespace gizllm
