// How a model's hidden states become one vector a text (pooling, normalization), and how a
// cross-encoder's logits become a score: read from a sentence-transformers folder
// (modules.json, 1_Pooling/config.json, sentence_bert_config.json, config.json's
// sentence_transformers.activation_fn).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace gizllm {

enum class Pooling : uint8_t {
  kCls,        // the first token's hidden state
  kMean,       // the mean over the sequence's tokens
  kLastToken,  // the last token's (decoder embedders)
};
std::string PoolingName(Pooling p);  // "cls", "mean", "lasttoken"

// A cross-encoder's score from its logits (sentence-transformers' activation_fn).
enum class ScoreActivation : uint8_t { kIdentity, kSigmoid };

struct EmbeddingConfig {
  Pooling pooling = Pooling::kMean;
  bool normalize = false;  // a Normalize module: vectors of unit L2 norm
  int64_t max_tokens = 0;  // sentence_bert_config.json max_seq_length (0: none given)
  ScoreActivation activation = ScoreActivation::kIdentity;
  bool sentence_transformers = false;  // modules.json was read
  // config_sentence_transformers.json (read beside modules.json): prompts by name, put before a
  // text as sentence-transformers does, and the name used when none is asked ("": none).
  std::map<std::string, std::string> prompts;
  std::string default_prompt;
  // Vectors cut to fewer dimensions (Matryoshka), where config.json says the model was trained
  // for them: matryoshka_dimensions (those sizes) or is_matryoshka (any size), as vLLM reads it.
  bool matryoshka = false;
  std::vector<int64_t> matryoshka_dimensions;  // empty: any from 1 to the model's
  // config.json's classifier_from_token (vLLM's field for Qwen3-Reranker): a decoder that
  // scores pairs with these two tokens' logits, [no, yes]; empty: not given.
  std::vector<std::string> score_tokens;
};

// The text put before every text: the prompt `name`, or the default prompt where `name` is
// nullopt ("" where there is none); an unknown name is an error listing the known ones.
Expected<std::string> PromptText(const EmbeddingConfig& config,
                                 const std::optional<std::string>& name);

// Ok where vectors of `dimensions` floats may be asked of a model of `dim`: dim, or fewer as
// config.matryoshka allows; else an error saying what may be asked.
Status CheckDimensions(const EmbeddingConfig& config, int64_t dim, int64_t dimensions);

// The folder's configuration. Without modules.json: mean pooling, not normalized (what
// sentence-transformers builds for a plain transformers model). The score activation: config.json
// sentence_transformers.activation_fn (or sbert_ce_default_activation_function) where given, else
// sigmoid for a head of one label and identity otherwise. A module or pooling mode that changes
// the vectors and is not implemented (Dense, max or weighted-mean pooling) is refused, naming
// the file and the field.
Expected<EmbeddingConfig> ReadEmbeddingConfig(const std::string& dir, int labels);

// out[s] = the pooled hidden states of sequence s, rows [starts[s], starts[s + 1]) of hidden
// [rows, dim]; L2-normalized where `normalize` (a zero vector stays zero).
void Pool(std::span<const float> hidden, int64_t dim, std::span<const int32_t> starts,
          Pooling pooling, bool normalize, float* out);

// v = v / max(||v||, 1e-12) (torch.nn.functional.normalize), the norm in double.
void Normalize(float* v, int64_t dim);

// The score of a logit under `activation`.
float Activate(ScoreActivation activation, float logit);

}  // namespace gizllm
