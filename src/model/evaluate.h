// One sequence through a Runner outside any engine: logits of every position, for `gizllm
// logits`, perplexity and the golden tests.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "model/runner.h"

namespace gizllm {

// Logits [ids.size(), vocab] of every position of one sequence, read in chunks of at most
// `chunk` rows. (Re)allocates the runner's KV pool for the sequence: not for use while an
// engine drives the runner. A NaN or infinite logit is an error naming its position.
Expected<std::vector<float>> SequenceLogits(Runner& runner, std::span<const int32_t> ids,
                                            int64_t chunk = 256);

// The residual stream after each of `layers` for every position: [layers.size(), ids, dim].
Expected<std::vector<float>> SequenceHidden(Runner& runner, std::span<const int32_t> ids,
                                            std::span<const int> layers);

}  // namespace gizllm
