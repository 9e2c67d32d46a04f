// Rows: what one step of the forward pass reads.
#pragma once

#include <cstdint>
#include <vector>

namespace gizllm {

// Rows of a step whose input is a picture's row from the vision tower instead of their token's
// embedding (Qwen3-VL: the image placeholders), with the deepstack features added to them after
// the language model's first layers. The rows come from the host (`embeddings`, `deepstack`,
// copied to the device with the step) or lie already in the runner's device memory (`sources`,
// Runner::StepBackend: the tower's rows kept there); one or the other for a whole step.
struct VisualRows {
  // A row in device memory: its embedding at `row` (dim floats), its deepstack feature l at
  // row + (l + 1) * plane for l < layers.
  struct Source {
    const float* row = nullptr;
    int64_t plane = 0;
    int32_t layers = 0;
  };
  std::vector<int32_t> rows;      // [count] row indices in the step, ascending
  std::vector<float> embeddings;  // [count, dim]
  int layers = 0;                 // deepstack features per row
  std::vector<float> deepstack;   // [layers, count, dim]: feature i is added after layer i
  std::vector<Source> sources;    // [count], or empty: the rows are `embeddings`

  int64_t size() const { return static_cast<int64_t>(rows.size()); }
  bool empty() const { return rows.empty(); }
  void Clear() {
    rows.clear();
    embeddings.clear();
    deepstack.clear();
    sources.clear();
    layers = 0;
  }
};

// One row per token read in a step. Rows of a sequence are consecutive and in position order.
struct Rows {
  std::vector<int32_t> tokens;     // [rows]
  std::vector<int32_t> slots;      // [rows] KV slot of the row's sequence
  std::vector<int32_t> positions;  // [rows] KV position
  std::vector<int32_t> rotary;     // [rows] rotary position (equals positions for text models)
  // Interleaved M-RoPE (Rope::mrope_section): each row's height and width positions, rotary
  // holding its time position. Empty: all three are rotary (text rows). Set by PushMrope.
  std::vector<int32_t> rotary_h;  // [rows] or empty
  std::vector<int32_t> rotary_w;  // [rows] or empty
  std::vector<int32_t> wanted;    // rows whose logits are wanted, ascending
  VisualRows visual;              // rows holding a picture's embeddings (none for text)

  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
  void Clear() {
    tokens.clear();
    slots.clear();
    positions.clear();
    rotary.clear();
    rotary_h.clear();
    rotary_w.clear();
    wanted.clear();
    visual.Clear();
  }
  void Push(int32_t token, int32_t slot, int32_t position, bool want) {
    if (want) wanted.push_back(static_cast<int32_t>(tokens.size()));
    tokens.push_back(token);
    slots.push_back(slot);
    positions.push_back(position);
    rotary.push_back(position);
    if (!rotary_h.empty()) {
      rotary_h.push_back(position);
      rotary_w.push_back(position);
    }
  }
  // A row with three rotary positions (time, height, width); the rows before it get theirs
  // (all equal to their rotary position) if they had none.
  void PushMrope(int32_t token, int32_t slot, int32_t position, int32_t t, int32_t h, int32_t w,
                 bool want) {
    if (rotary_h.empty()) {
      rotary_h = rotary;
      rotary_w = rotary;
    }
    if (want) wanted.push_back(static_cast<int32_t>(tokens.size()));
    tokens.push_back(token);
    slots.push_back(slot);
    positions.push_back(position);
    rotary.push_back(t);
    rotary_h.push_back(h);
    rotary_w.push_back(w);
  }
};

}  // namespace gizllm
