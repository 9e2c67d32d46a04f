#include "sampling/sampling.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "core/check.h"
#include "ops/backend.h"

namespace gizllm {

Status Sampling::Check() const {
  if (!(temperature >= 0.0f) || !std::isfinite(temperature)) {
    return InvalidArgument("sampling.temperature: expected a finite number >= 0, got " +
                           std::to_string(temperature));
  }
  if (top_k < 0) {
    return InvalidArgument("sampling.top_k: expected >= 0 (0: off), got " + std::to_string(top_k));
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return InvalidArgument("sampling.top_p: expected a number in (0, 1], got " +
                           std::to_string(top_p));
  }
  if (!(min_p >= 0.0f && min_p <= 1.0f)) {
    return InvalidArgument("sampling.min_p: expected a number in [0, 1], got " +
                           std::to_string(min_p));
  }
  if (!(presence >= -2.0f && presence <= 2.0f)) {
    return InvalidArgument("sampling.presence: expected a number in [-2, 2], got " +
                           std::to_string(presence));
  }
  if (!(frequency >= -2.0f && frequency <= 2.0f)) {
    return InvalidArgument("sampling.frequency: expected a number in [-2, 2], got " +
                           std::to_string(frequency));
  }
  if (!(repetition > 0.0f) || !std::isfinite(repetition)) {
    return InvalidArgument("sampling.repetition: expected a finite number > 0, got " +
                           std::to_string(repetition));
  }
  if (logprobs < -1) {
    return InvalidArgument("sampling.logprobs: expected -1 (off) or a count >= 0, got " +
                           std::to_string(logprobs));
  }
  if (grammar != nullptr && (grammar->grammar == nullptr || grammar->vocabulary == nullptr)) {
    return InvalidArgument("sampling.grammar: expected a grammar and the tokens' bytes");
  }
  return Status::Ok();
}

int32_t Argmax(std::span<const float> x) {
  // Chunks of 64: each chunk's largest value from eight independent running maxima (no chain of
  // dependent compares through the whole row), then its first position only when the chunk beats
  // the best so far, so that earlier positions win ties. `v > m ? v : m` never takes a NaN.
  constexpr size_t kChunk = 64;
  constexpr float kLow = -std::numeric_limits<float>::infinity();
  int32_t best = 0;
  float best_value = x.empty() ? kLow : x[0];
  for (size_t c = 0; c < x.size(); c += kChunk) {
    const size_t end = std::min(x.size(), c + kChunk);
    float m[8] = {kLow, kLow, kLow, kLow, kLow, kLow, kLow, kLow};
    size_t i = c;
    for (; i + 8 <= end; i += 8) {
      for (int k = 0; k < 8; ++k) m[k] = x[i + k] > m[k] ? x[i + k] : m[k];
    }
    for (; i < end; ++i) m[0] = x[i] > m[0] ? x[i] : m[0];
    float chunk = m[0];
    for (int k = 1; k < 8; ++k) chunk = m[k] > chunk ? m[k] : chunk;
    if (chunk > best_value) {
      i = c;
      while (x[i] != chunk) ++i;
      best = static_cast<int32_t>(i);
      best_value = chunk;
    }
  }
  return best;
}

namespace {

// Argmax over the tokens `mask` allows, read straight from the mask's bits (no masked copy of the
// row): the first of the largest, -1 when no allowed token's logit is above -inf. A word of 64
// allowed tokens is one vectorizable pass, as Argmax's chunks; others visit their set bits.
int32_t MaskedArgmax(std::span<const float> x, std::span<const uint64_t> mask) {
  constexpr float kLow = -std::numeric_limits<float>::infinity();
  int32_t best = -1;
  float best_value = kLow;
  const size_t n = x.size();
  for (size_t w = 0; w * 64 < n; ++w) {
    uint64_t bits = mask[w];
    const size_t base = w * 64;
    if (n - base < 64) bits &= (uint64_t{1} << (n - base)) - 1;
    if (bits == 0) continue;
    if (bits == ~uint64_t{0}) {
      float m[8] = {kLow, kLow, kLow, kLow, kLow, kLow, kLow, kLow};
      for (size_t i = base; i < base + 64; i += 8) {
        for (int k = 0; k < 8; ++k) m[k] = x[i + k] > m[k] ? x[i + k] : m[k];
      }
      float chunk = m[0];
      for (int k = 1; k < 8; ++k) chunk = m[k] > chunk ? m[k] : chunk;
      if (chunk > best_value) {
        size_t i = base;
        while (x[i] != chunk) ++i;
        best = static_cast<int32_t>(i);
        best_value = chunk;
      }
      continue;
    }
    while (bits != 0) {
      const size_t i = base + static_cast<size_t>(std::countr_zero(bits));
      bits &= bits - 1;
      if (x[i] > best_value) {
        best_value = x[i];
        best = static_cast<int32_t>(i);
      }
    }
  }
  return best;
}

}  // namespace

bool PickableRow(std::span<const float> logits) {
  // On the bits, so that the loop vectorizes: NaN has an all-ones exponent and a nonzero
  // mantissa, +inf is 0x7f800000, finite values have an exponent below all ones.
  uint32_t bad = 0, finite = 0;
  for (float x : logits) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    const uint32_t magnitude = u & 0x7fffffffu;
    bad |= static_cast<uint32_t>(magnitude > 0x7f800000u) | static_cast<uint32_t>(u == 0x7f800000u);
    finite |= static_cast<uint32_t>(magnitude < 0x7f800000u);
  }
  return bad == 0 && finite != 0;
}

Sampler::Sampler(int64_t vocab)
    : vocab_(vocab), x_(vocab), probs_(vocab), counts_(vocab, 0), seen_(vocab, 0), order_(vocab) {
  CHECK(vocab > 0);
}

std::optional<int32_t> Sampler::Shape(std::span<const float> logits, const Sampling& sampling,
                                      std::span<const int32_t> prompt,
                                      std::span<const int32_t> output) {
  DCHECK(static_cast<int64_t>(logits.size()) == vocab_);
  const bool penalize =
      sampling.repetition != 1.0f || sampling.presence != 0.0f || sampling.frequency != 0.0f;
  // Plain greedy decoding reads the logits once, without a copy.
  if (sampling.Greedy() && !penalize) return Argmax(logits);
  std::copy(logits.begin(), logits.end(), x_.begin());

  // Penalties touch only the tokens the request has seen; seen_ and counts_ are zero again after.
  if (penalize) {
    for (int32_t t : prompt) seen_[t] = 1;
    for (int32_t t : output) {
      seen_[t] = 1;
      ++counts_[t];
    }
    auto apply = [&](int32_t t) {
      if (seen_[t] != 1) return;  // not seen, or already penalized
      seen_[t] = 2;
      float& x = x_[t];
      if (sampling.repetition != 1.0f) {
        x = x > 0.0f ? x / sampling.repetition : x * sampling.repetition;
      }
      const int32_t count = counts_[t];
      x -= sampling.frequency * static_cast<float>(count);
      if (count > 0) x -= sampling.presence;
    };
    for (int32_t t : prompt) apply(t);
    for (int32_t t : output) apply(t);
    for (int32_t t : prompt) seen_[t] = 0;
    for (int32_t t : output) {
      seen_[t] = 0;
      counts_[t] = 0;
    }
  }

  if (sampling.Greedy()) return Argmax(x_);

  // Softmax without its denominator: only ratios matter until the final normalization.
  float max = -INFINITY;
  for (int64_t i = 0; i < vocab_; ++i) {
    x_[i] /= sampling.temperature;
    max = std::max(max, x_[i]);
  }
  for (int64_t i = 0; i < vocab_; ++i) probs_[i] = std::exp(static_cast<double>(x_[i] - max));

  // min-p: the most likely token has probability 1 before normalization.
  if (sampling.min_p > 0.0f) {
    const double floor = sampling.min_p;
    for (int64_t i = 0; i < vocab_; ++i) {
      if (probs_[i] < floor) probs_[i] = 0.0;
    }
  }

  // Candidates: tokens still kept, for top-k and top-p.
  auto more_likely = [&](int32_t a, int32_t b) {
    return probs_[a] != probs_[b] ? probs_[a] > probs_[b] : a < b;
  };
  int64_t kept = 0;
  if (sampling.top_k > 0 || sampling.top_p < 1.0f) {
    for (int64_t i = 0; i < vocab_; ++i) {
      if (probs_[i] > 0.0) order_[kept++] = static_cast<int32_t>(i);
    }
  }
  if (sampling.top_k > 0 && kept > sampling.top_k) {
    std::nth_element(order_.begin(), order_.begin() + sampling.top_k, order_.begin() + kept,
                     more_likely);
    for (int64_t i = sampling.top_k; i < kept; ++i) probs_[order_[i]] = 0.0;
    kept = sampling.top_k;
  }
  if (sampling.top_p < 1.0f) {
    double total = 0.0;
    for (int64_t i = 0; i < kept; ++i) total += probs_[order_[i]];
    const double limit = static_cast<double>(sampling.top_p) * total;
    // Only the head of the order is needed: sort the most likely 64, then 4 times as many, and so
    // on, until the mass before a token reaches the limit; everything after it is dropped.
    double before = 0.0;
    int64_t sorted = 0, i = 0;
    for (int64_t k = std::min<int64_t>(kept, 64);; k = std::min<int64_t>(kept, 4 * k)) {
      if (k < kept) {
        std::nth_element(order_.begin() + sorted, order_.begin() + k, order_.begin() + kept,
                         more_likely);
      }
      std::sort(order_.begin() + sorted, order_.begin() + k, more_likely);
      sorted = k;
      for (; i < sorted; ++i) {
        const double p = probs_[order_[i]];
        if (before >= limit) probs_[order_[i]] = 0.0;
        before += p;
      }
      if (before >= limit || sorted == kept) break;
    }
    for (int64_t j = sorted; j < kept; ++j) probs_[order_[j]] = 0.0;
  }
  return std::nullopt;
}

void Sampler::Distribution(std::span<const float> logits, const Sampling& sampling,
                           std::span<const int32_t> prompt, std::span<const int32_t> output,
                           std::span<float> probs) {
  DCHECK(static_cast<int64_t>(probs.size()) == vocab_);
  if (std::optional<int32_t> greedy = Shape(logits, sampling, prompt, output)) {
    std::fill(probs.begin(), probs.end(), 0.0f);
    probs[*greedy] = 1.0f;
    return;
  }
  double total = 0.0;
  for (int64_t i = 0; i < vocab_; ++i) total += probs_[i];
  for (int64_t i = 0; i < vocab_; ++i) probs[i] = static_cast<float>(probs_[i] / total);
}

int32_t Sampler::Sample(std::span<const float> logits, const Sampling& sampling, uint64_t seed,
                        std::span<const int32_t> prompt, std::span<const int32_t> output,
                        Logprobs* logprobs, std::span<const uint64_t> allowed) {
  return Pick(logits, sampling, seed, output.size(), prompt, output, logprobs, allowed);
}

int32_t Sampler::Sample(std::span<const float> logits, const SampleRow& row,
                        std::span<const uint64_t> allowed) {
  Sampling sampling;
  sampling.temperature = row.temperature;
  sampling.top_k = row.top_k;
  sampling.top_p = row.top_p;
  sampling.min_p = row.min_p;
  return Pick(logits, sampling, row.seed, row.index, {}, {}, nullptr, allowed);
}

int32_t Sampler::Pick(std::span<const float> logits, const Sampling& sampling, uint64_t seed,
                      uint64_t index, std::span<const int32_t> prompt,
                      std::span<const int32_t> output, Logprobs* logprobs,
                      std::span<const uint64_t> allowed) {
  if (!PickableRow(logits)) return kNonFiniteToken;
  std::span<const float> shaped = logits;
  const bool penalize =
      sampling.repetition != 1.0f || sampling.presence != 0.0f || sampling.frequency != 0.0f;
  if (!allowed.empty() && sampling.Greedy() && !penalize) {
    // Greedy under a mask: one pass over the allowed tokens, no copy.
    DCHECK(static_cast<int64_t>(allowed.size()) * 64 >= vocab_);
    const int32_t token = MaskedArgmax(logits, allowed);
    if (token < 0) return kNoAllowedToken;
    if (logprobs != nullptr && sampling.logprobs >= 0) {
      ComputeLogprobs(logits, token, sampling.logprobs, logprobs);
    }
    return token;
  }
  if (!allowed.empty()) {
    DCHECK(static_cast<int64_t>(allowed.size()) * 64 >= vocab_);
    masked_.assign(logits.begin(), logits.end());
    ApplyMask(allowed, masked_);
    if (!PickableRow(masked_)) return kNoAllowedToken;
    shaped = masked_;
  }
  int32_t token = 0;
  if (std::optional<int32_t> greedy = Shape(shaped, sampling, prompt, output)) {
    token = *greedy;
  } else {
    double total = 0.0;
    for (int64_t i = 0; i < vocab_; ++i) total += probs_[i];
    const double target = CounterUniform(seed, index) * total;
    double sum = 0.0;
    int32_t last = -1;
    for (int64_t i = 0; i < vocab_; ++i) {
      if (probs_[i] == 0.0) continue;
      sum += probs_[i];
      last = static_cast<int32_t>(i);
      if (sum > target) break;
    }
    CHECK(last >= 0);
    token = last;
  }
  if (logprobs != nullptr && sampling.logprobs >= 0) {
    ComputeLogprobs(logits, token, sampling.logprobs, logprobs);
  }
  return token;
}

void Sampler::ComputeLogprobs(std::span<const float> logits, int32_t token, int32_t n,
                              Logprobs* out) {
  float max = -INFINITY;
  for (float x : logits) max = std::max(max, x);
  double sum = 0.0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - max);
  const double lse = max + std::log(sum);
  out->token = token;
  out->logprob = static_cast<float>(logits[token] - lse);
  out->top.clear();
  const int64_t count = std::min<int64_t>(std::max(n, 0), vocab_);
  if (count == 0) return;
  for (int64_t i = 0; i < vocab_; ++i) order_[i] = static_cast<int32_t>(i);
  std::partial_sort(
      order_.begin(), order_.begin() + count, order_.end(),
      [&](int32_t a, int32_t b) { return logits[a] != logits[b] ? logits[a] > logits[b] : a < b; });
  for (int64_t i = 0; i < count; ++i) {
    out->top.push_back({order_[i], static_cast<float>(logits[order_[i]] - lse)});
  }
}

}  // namespace gizllm
