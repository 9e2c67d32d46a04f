// The three rotary positions (time, height, width) of a prompt with pictures, as transformers'
// Qwen3-VL get_rope_index gives them: text rows count on from the position after the row
// before them (all three equal); a picture's rows, t x (h / merge) x (w / merge) image
// placeholders, take the position after the text before them plus their (frame, row, column)
// in the merged grid; the text after a picture counts on from one past its largest position.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "model/vision_arch.h"

namespace gizllm {

struct MropePositions {
  std::vector<int32_t> t;  // [tokens]
  std::vector<int32_t> h;  // [tokens]
  std::vector<int32_t> w;  // [tokens]
  // The rotary position of the token after the prompt (one past the largest); a generated
  // token k places (all three) at next + k.
  int32_t next = 0;
  // Where each picture's rows start in the prompt, in order.
  std::vector<int64_t> picture_rows;
};

// A prompt's pictures as the language model reads them: each row's three rotary positions,
// and for the rows that hold image placeholders (in prompt order) the tower's rows and the
// deepstack features.
struct PromptPictures {
  MropePositions positions;
  std::vector<int32_t> rows;      // [count] prompt rows holding a picture's row
  std::vector<float> embeddings;  // [count, dim]
  int layers = 0;
  std::vector<float> deepstack;  // [layers, count, dim]
};

// `grids` are the prompt's pictures in order. An error when the image placeholders do not
// match them (a picture with too few placeholders, placeholders left over, grids left over),
// or when the prompt holds video placeholders (not read yet).
Expected<MropePositions> ComputeMropePositions(const VisionArch& arch,
                                               std::span<const int32_t> tokens,
                                               std::span<const VisionGrid> grids);

}  // namespace gizllm
