// Request and Progress: what a front end gives the engine and what it gets back each step.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/mrope.h"
#include "sampling/sampling.h"

namespace gizllm {

struct Request {
  std::vector<int32_t> prompt;  // token ids, at least one, at most the engine's context
  int64_t limit = -1;           // most new tokens; -1: until the context is full
  Sampling sampling;
  std::optional<std::vector<int32_t>> stop;  // stop tokens; none: the model's eos ids
  // The prompt's pictures (Qwen3-VL): every prompt row's three rotary positions, the rows that
  // read a picture's row instead of their placeholder's embedding, and the deepstack features.
  // Prefix reuse keys those rows by their inputs (the picture's rows and positions), so a held
  // prefix with another picture is never read. Requests with pictures draft nothing.
  std::shared_ptr<const PromptPictures> pictures;
};

// What one request produced in one Advance.
struct Progress {
  int64_t id = 0;
  std::vector<int32_t> tokens;  // new tokens, without the stop token
  int64_t cached = 0;           // prompt tokens the slot already held (set with the first tokens)
  std::string end;              // "stop", "length", "error", or "" while it goes on
  Status status;                // why it ended, when `end` is "error"
  std::vector<Logprobs> logprobs;  // [tokens.size()] when the request asked for them
};

}  // namespace gizllm
