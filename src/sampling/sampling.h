// Sampling: how one request turns a row of logits into its next token, on the host.
//
// The order of operations (the CUDA backend must follow it to pick the same tokens):
//   1. logprobs (if asked) from the raw logits: log_softmax, before any shaping.
//   2. penalties, as vLLM applies them: repetition over prompt and output tokens
//      (logit > 0 ? logit / r : logit * r), then frequency (logit -= f * count) and presence
//      (logit -= p if count > 0) over output tokens only.
//   3. temperature 0: the largest logit (the lowest id among equals); no random number.
//   4. logits / temperature, softmax, then min-p (keep p >= min_p * max p), top-k (the k most
//      likely, ties to the lower id), top-p (in order of probability, keep a token while the mass
//      before it is below top_p, renormalized over what min-p and top-k kept).
//   2b. a grammar (if any): tokens it does not allow next get -inf (grammar/token_mask.h); stop
//      tokens only where the text is complete. Logprobs stay those of step 1.
//   5. u = CounterUniform(seed, index), index = the number of output tokens so far; the token is
//      the first, in id order, at which the running sum of the kept probabilities (divided by
//      their total) exceeds u. The random number depends only on (seed, index), never on what
//      else runs in the batch, so a request repeats its tokens under any schedule.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "core/counter_random.h"
#include "core/status.h"
#include "grammar/token_mask.h"
#include "ops/backend.h"

namespace gizllm {

struct Sampling {
  float temperature = 1.0f;      // 0: greedy
  int32_t top_k = 0;             // 0: every token
  float top_p = 1.0f;            // 1: every token
  float min_p = 0.0f;            // 0: every token
  std::optional<uint64_t> seed;  // none: the engine derives one from the request id
  float presence = 0.0f;         // OpenAI presence_penalty, [-2, 2]
  float frequency = 0.0f;        // OpenAI frequency_penalty, [-2, 2]
  float repetition = 1.0f;       // vLLM/HF repetition_penalty, > 0; 1: none
  int32_t logprobs = -1;         // -1: none; 0: the chosen token's; n: also the n most likely
  // Only the tokens this grammar allows, over the model's vocabulary; none: any token.
  std::shared_ptr<const TokenGrammar> grammar;
  // A reasoning model's thinking before the grammar (-1: none): think_open as the answer's first
  // token opens a block the grammar leaves free, think_close ends it, and the grammar holds the
  // text after it; thinking: the prompt opened the block (the answer starts inside it). Without
  // think_open first, the grammar holds the answer from its first token.
  int32_t think_open = -1;
  int32_t think_close = -1;
  bool thinking = false;

  // Names the bad field and what was expected.
  Status Check() const;
  bool Greedy() const { return temperature == 0.0f; }
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

// The chosen token's log probability and the n most likely tokens, from the raw logits.
struct Logprobs {
  int32_t token = 0;
  float logprob = 0.0f;
  std::vector<TokenLogprob> top;  // [n], most likely first, ties to the lower id
};

// The position of the largest value, the lowest among equals; a NaN is never picked over a
// number (position 0 when it is NaN or nothing exceeds it). Greedy decoding's pick.
int32_t Argmax(std::span<const float> x);

// Whether a row of logits can pick a token: no NaN, no +inf, and at least one finite value (-inf
// excludes a token). A row that cannot picks kNonFiniteToken (ops/backend.h).
bool PickableRow(std::span<const float> logits);

// Picks tokens from logits. Owns scratch buffers sized for the vocabulary once; not thread safe
// (one per thread).
class Sampler {
 public:
  explicit Sampler(int64_t vocab);

  int64_t vocab() const { return vocab_; }

  // The probabilities after steps 2 and 4 (or a one-hot for temperature 0): probs [vocab], zero
  // for tokens removed, summing to 1. prompt and output: the request's tokens so far.
  void Distribution(std::span<const float> logits, const Sampling& sampling,
                    std::span<const int32_t> prompt, std::span<const int32_t> output,
                    std::span<float> probs);

  // The next token (steps 1-5); kNonFiniteToken (ops/backend.h) when !PickableRow(logits),
  // kNoAllowedToken when the mask leaves no token with a finite logit. logprobs: filled when
  // sampling.logprobs >= 0 and a token is picked, may be null. allowed: a grammar's mask
  // (TokenMatcher::FillMask), empty: none.
  int32_t Sample(std::span<const float> logits, const Sampling& sampling, uint64_t seed,
                 std::span<const int32_t> prompt, std::span<const int32_t> output,
                 Logprobs* logprobs, std::span<const uint64_t> allowed = {});
  // Steps 2b to 5 under a device's parameters (ops/backend.h SampleRow; the draw's counter is
  // row.index): what Backend::Sample picks for the row, and the CPU backend's Sample.
  int32_t Sample(std::span<const float> logits, const SampleRow& row,
                 std::span<const uint64_t> allowed = {});

  // Step 1 alone: the chosen token's log probability and the n most likely.
  void ComputeLogprobs(std::span<const float> logits, int32_t token, int32_t n, Logprobs* out);

 private:
  // Sample with the draw's counter given apart from the output.
  int32_t Pick(std::span<const float> logits, const Sampling& sampling, uint64_t seed,
               uint64_t index, std::span<const int32_t> prompt, std::span<const int32_t> output,
               Logprobs* logprobs, std::span<const uint64_t> allowed);
  // Writes penalized logits into x_; returns the kept tokens' probabilities in probs_ (zero
  // elsewhere) unless greedy, in which case it returns the argmax.
  std::optional<int32_t> Shape(std::span<const float> logits, const Sampling& sampling,
                               std::span<const int32_t> prompt, std::span<const int32_t> output);

  int64_t vocab_;
  std::vector<float> x_;         // [vocab] shaped logits
  std::vector<float> masked_;    // [vocab] logits with a grammar's mask applied
  std::vector<double> probs_;    // [vocab] kept probabilities, unnormalized
  std::vector<int32_t> counts_;  // [vocab] output counts (zero between calls)
  std::vector<uint8_t> seen_;    // [vocab] prompt or output token (zero between calls)
  std::vector<int32_t> order_;   // [vocab] token ids, for selection and sorting
};

}  // namespace gizllm
