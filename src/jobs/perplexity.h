// Quality of a (quantized) model over texts: perplexity, and against a base model the mean KL
// divergence of the next-token distributions and the share of positions with the same top token.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/runner.h"

namespace gizllm::quant {

struct PerplexityOptions {
  int window = 256;       // tokens per window; each window starts a fresh context
  int max_tokens = 1024;  // read only the first N tokens of each text (0: all)
  // Positions of each window before `skip` are context only, not scored (llama-perplexity
  // scores the second half of each window: skip = window / 2).
  int skip = 0;
  // Called after each text with the texts done.
  std::function<void(size_t done, size_t total, double perplexity)> progress;
  Status Check() const;
};

struct Perplexity {
  int64_t tokens = 0;       // predictions scored
  double perplexity = 0.0;  // exp(mean negative log-likelihood) of the model
  double base_perplexity = 0.0;
  double kl = 0.0;        // mean KL(base || model) per position
  double same_top = 0.0;  // share of positions where both argmaxes agree
};

// Reads JSON lines {"text": ...}; at most `limit` texts (0: all). Errors name file and line.
Expected<std::vector<std::string>> ReadTexts(const std::string& path, int limit = 0);

// Scores `model` (and compares it with `base` when not null) over token sequences: each is cut
// to max_tokens and split into windows; window positions skip..n-2 predict tokens skip+1..n-1.
Expected<Perplexity> MeasurePerplexity(Runner& model, Runner* base,
                                       std::span<const std::vector<int32_t>> texts,
                                       const PerplexityOptions& options);

}  // namespace gizllm::quant
