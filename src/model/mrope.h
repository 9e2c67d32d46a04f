// The three rotary positions (time, height, width) of a prompt with pictures and videos, as
// transformers' Qwen3-VL get_rope_index gives them: text rows count on from the position after
// the row before them (all three equal); a picture's rows, t x (h / merge) x (w / merge) image
// placeholders, take the position after the text before them plus their (frame, row, column)
// in the merged grid; the text after a picture counts on from one past its largest position. A
// video's temporal patches are each a run of (h / merge) x (w / merge) video placeholders
// placed as a picture of one frame (get_rope_index splits video_grid_thw per frame: the
// timestamp text between them counts as text).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/status.h"
#include "model/vision_arch.h"
#include "ops/backend.h"

namespace gizllm {

struct MropePositions {
  std::vector<int32_t> t;  // [tokens]
  std::vector<int32_t> h;  // [tokens]
  std::vector<int32_t> w;  // [tokens]
  // The rotary position of the token after the prompt (one past the largest); a generated
  // token k places (all three) at next + k.
  int32_t next = 0;
  // Where each run of placeholders starts in the prompt (a picture, a video's temporal
  // patch), in order.
  std::vector<int64_t> picture_rows;
};

// A prompt's pictures as the language model reads them: each row's three rotary positions,
// and for the rows that hold image placeholders (in prompt order) the tower's rows and the
// deepstack features.
struct PromptPictures {
  MropePositions positions;
  std::vector<int32_t> rows;      // [count] prompt rows holding a picture's or video's row
  std::vector<float> embeddings;  // [count, dim]; empty where `device` holds the rows
  int layers = 0;
  std::vector<float> deepstack;  // [layers, count, dim]; empty where `device` holds the rows
  // The rows kept in the memory of the backend the tower ran on (PictureReader::
  // KeepRowsOnDevice, or an Engine's one upload of a request's rows): [1 + layers, count, dim]
  // floats, the embeddings then each deepstack feature. A step reads them there: no copy to the
  // host and none a step.
  std::shared_ptr<Buffer> device;
  const Backend* device_backend = nullptr;
  // Empty, or per row what it stands for in prefix reuse keys: a digest of its picture's input
  // (encoded bytes or pixels, and the grid) and the row's index in the picture. Empty: the keys
  // hash the rows themselves (host rows only).
  std::vector<uint64_t> keys;

  int64_t count() const { return static_cast<int64_t>(rows.size()); }
  bool on_device() const { return device != nullptr; }
  // Row j's embedding in `device` (dim floats); its deepstack feature l lies (l + 1) * count() *
  // dim floats on.
  const float* DeviceRow(int64_t j, int64_t dim) const {
    return static_cast<const float*>(device->data()) + j * dim;
  }
};

// `grids` are the prompt's pictures and videos in order (VisionGrid::video). An error when the
// placeholders do not match them (a picture or a video frame with too few placeholders,
// placeholders left over, grids left over, a video's placeholders where a picture's are due).
Expected<MropePositions> ComputeMropePositions(const VisionArch& arch,
                                               std::span<const int32_t> tokens,
                                               std::span<const VisionGrid> grids);

}  // namespace gizllm
