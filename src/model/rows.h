// Rows: what one step of the forward pass reads.
#pragma once

#include <cstdint>
#include <vector>

namespace gizllm {

// One row per token read in a step. Rows of a sequence are consecutive and in position order.
struct Rows {
  std::vector<int32_t> tokens;     // [rows]
  std::vector<int32_t> slots;      // [rows] KV slot of the row's sequence
  std::vector<int32_t> positions;  // [rows] KV position
  std::vector<int32_t> rotary;     // [rows] rotary position (equals positions for text models)
  std::vector<int32_t> wanted;     // rows whose logits are wanted, ascending

  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
  void Clear() {
    tokens.clear();
    slots.clear();
    positions.clear();
    rotary.clear();
    wanted.clear();
  }
  void Push(int32_t token, int32_t slot, int32_t position, bool want) {
    if (want) wanted.push_back(static_cast<int32_t>(tokens.size()));
    tokens.push_back(token);
    slots.push_back(slot);
    positions.push_back(position);
    rotary.push_back(position);
  }
};

}  // namespace gizllm
