// BlockDrafter: a drafter that proposes a block of tokens in one pass, conditioned on the target
// model's hidden states after some of its layers (DFlash, model/dflash.h). The engine keeps one
// context a sequence, feeds it the features of every row the sequence keeps (Runner::KeepFeatures)
// and asks for drafts before a step; the engine is written against this interface and tested
// with a scripted one.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "core/status.h"

namespace gizllm {

class BlockDrafter {
 public:
  // What the drafter keeps of one sequence (its context); the engine holds it with the sequence.
  class Context {
   public:
    virtual ~Context() = default;
  };

  virtual ~BlockDrafter() = default;
  // The target's hidden states the drafter reads, as Runner::Hidden numbers them (l: after layer
  // l - 1, Hugging Face's hidden_states[l]; layers + 1: the last layer's after the final norm, the
  // last entry of transformers' hidden_states), in the order Extend's features concatenate them.
  virtual std::span<const int> FeatureLayers() const = 0;
  // Most drafts one pass gives (DFlash: the block size less one).
  virtual int32_t MostDrafts() const = 0;
  virtual std::unique_ptr<Context> NewContext() const = 0;
  // The sequence's rows at `positions` (ascending) were read and kept: features [positions,
  // FeatureLayers().size() * dim] are their hidden states. What the context held at the first
  // of these positions and after is dropped first (a sequence read again after preemption).
  virtual Status Extend(Context& context, std::span<const int64_t> positions,
                        const float* features) = 0;
  // Drafts of each sequence i: its newest token last[i] (not read yet) at position
  // positions[i], and `count` drafts after it into tokens [contexts.size(), count].
  virtual Status Draft(std::span<Context* const> contexts, std::span<const int32_t> last,
                       std::span<const int64_t> positions, int32_t count, int32_t* tokens) = 0;
};

}  // namespace gizllm
