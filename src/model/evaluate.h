// One sequence through a Runner outside any engine: logits of every position, for `gizllm
// logits`, perplexity and the golden tests.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "model/mrope.h"
#include "model/runner.h"
#include "model/vision_tower.h"

namespace gizllm {

// Logits [ids.size(), vocab] of every position of one sequence, read in chunks of at most
// `chunk` rows. (Re)allocates the runner's KV pool for the sequence: not for use while an
// engine drives the runner. A NaN or infinite logit is an error naming its position.
Expected<std::vector<float>> SequenceLogits(Runner& runner, std::span<const int32_t> ids,
                                            int64_t chunk = 256);

// The MTP layer's logits [ids.size() - 1, vocab] over one sequence (Runner::MtpStep): row t
// reads token t + 1 and the model's final-normed hidden state at t, and predicts token t + 2.
// Each chunk of at most `chunk` rows goes through the model (StepHidden), then its rows through
// the MTP layer. Same preconditions as SequenceLogits.
Expected<std::vector<float>> SequenceMtpLogits(Runner& runner, std::span<const int32_t> ids,
                                               int64_t chunk = 256);

// Logits [vocab] of the last position of one sequence only (a reranker's yes/no scores): the
// others are read in chunks of at most `chunk` rows without their logits. Same preconditions
// as SequenceLogits.
Expected<std::vector<float>> LastLogits(Runner& runner, std::span<const int32_t> ids,
                                        int64_t chunk = 256);

// The tower's output for the prompt's pictures placed at its image placeholders (`positions`
// from ComputeMropePositions over the same prompt and grids).
Expected<PromptPictures> PlacePictures(const VisionArch& arch, std::span<const int32_t> ids,
                                       MropePositions positions, const VisionOutput& tower);

// SequenceLogits of a prompt with pictures; a chunk may end inside a picture's rows.
Expected<std::vector<float>> SequenceLogits(Runner& runner, std::span<const int32_t> ids,
                                            const PromptPictures& pictures, int64_t chunk = 256);

// The residual stream after each of `layers` for every position: [layers.size(), ids, dim].
Expected<std::vector<float>> SequenceHidden(Runner& runner, std::span<const int32_t> ids,
                                            std::span<const int> layers);

// SequenceHidden of a prompt with pictures, read in one step.
Expected<std::vector<float>> SequenceHidden(Runner& runner, std::span<const int32_t> ids,
                                            const PromptPictures& pictures,
                                            std::span<const int> layers);

}  // namespace gizllm
