#include "jobs/perplexity.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/evaluate.h"

namespace gizllm::quant {
namespace {

// log-softmax of one row of logits, in double.
void LogSoftmax(const float* logits, int64_t vocab, std::vector<double>& out) {
  out.resize(vocab);
  double max = *std::max_element(logits, logits + vocab);
  double sum = 0.0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(logits[i] - max);
  const double log_sum = max + std::log(sum);
  for (int64_t i = 0; i < vocab; ++i) out[i] = logits[i] - log_sum;
}

}  // namespace

Status PerplexityOptions::Check() const {
  if (window < 2) return InvalidArgument("perplexity: window must be at least 2");
  if (max_tokens < 0) return InvalidArgument("perplexity: max_tokens must be >= 0");
  if (skip < 0 || skip > window - 2) {
    return InvalidArgument("perplexity: skip must be at least 0 and at most window - 2");
  }
  return Status::Ok();
}

Expected<std::vector<std::string>> ReadTexts(const std::string& path, int limit) {
  std::ifstream in(path);
  if (!in) return NotFound(path + ": cannot open");
  std::vector<std::string> texts;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("text") || !j["text"].is_string()) {
      return InvalidArgument(path + ":" + std::to_string(number) +
                             ": expected a JSON object with a string field \"text\"");
    }
    texts.push_back(j["text"].get<std::string>());
    if (limit > 0 && static_cast<int>(texts.size()) >= limit) break;
  }
  if (texts.empty()) return InvalidArgument(path + ": no texts");
  return texts;
}

Expected<Perplexity> MeasurePerplexity(Runner& model, Runner* base,
                                       std::span<const std::vector<int32_t>> texts,
                                       const PerplexityOptions& options) {
  GZ_RETURN_IF_ERROR(options.Check());
  const int64_t vocab = model.arch().vocab;
  if (base && base->arch().vocab != vocab) {
    return InvalidArgument("perplexity: the base model's vocabulary has " +
                           std::to_string(base->arch().vocab) + " tokens, the model's " +
                           std::to_string(vocab));
  }
  double nll = 0.0, base_nll = 0.0, kl = 0.0;
  int64_t tokens = 0, same_top = 0;
  std::vector<double> lp, lb;
  for (size_t doc = 0; doc < texts.size(); ++doc) {
    std::span<const int32_t> ids(texts[doc]);
    if (options.max_tokens > 0 && ids.size() > static_cast<size_t>(options.max_tokens)) {
      ids = ids.first(options.max_tokens);
    }
    for (size_t begin = 0; begin + 1 < ids.size(); begin += options.window) {
      auto window = ids.subspan(begin, std::min<size_t>(options.window, ids.size() - begin));
      if (window.size() < 2) break;
      GZ_ASSIGN_OR_RETURN(std::vector<float> logits, SequenceLogits(model, window, options.window));
      std::vector<float> base_logits;
      if (base) {
        GZ_ASSIGN_OR_RETURN(base_logits, SequenceLogits(*base, window, options.window));
      }
      for (size_t p = options.skip; p + 1 < window.size(); ++p) {
        const float* row = logits.data() + p * vocab;
        LogSoftmax(row, vocab, lp);
        nll -= lp[window[p + 1]];
        ++tokens;
        if (!base) continue;
        const float* brow = base_logits.data() + p * vocab;
        LogSoftmax(brow, vocab, lb);
        base_nll -= lb[window[p + 1]];
        double d = 0.0;
        for (int64_t i = 0; i < vocab; ++i) d += std::exp(lb[i]) * (lb[i] - lp[i]);
        kl += d;
        same_top += (std::max_element(row, row + vocab) - row) ==
                    (std::max_element(brow, brow + vocab) - brow);
      }
    }
    if (options.progress) {
      options.progress(doc + 1, texts.size(), std::exp(nll / std::max<int64_t>(1, tokens)));
    }
  }
  if (tokens == 0) return InvalidArgument("perplexity: no window has a position to score");
  Perplexity r;
  r.tokens = tokens;
  r.perplexity = std::exp(nll / tokens);
  if (base) {
    r.base_perplexity = std::exp(base_nll / tokens);
    r.kl = kl / tokens;
    r.same_top = static_cast<double>(same_top) / tokens;
  }
  return r;
}

}  // namespace gizllm::quant
