// VisionTower: the Qwen3-VL vision transformer (and Qwen3.5's, without deepstack), run on the
// ops of src/ops/backend.h. Pixels in (pixel_values rows and each picture's grid, as the image
// processor gives them), the language model's picture rows out, with the deepstack features.
//
// The forward pass, as transformers' Qwen3VLVisionModel:
//   patch embedding: the Conv3d whose kernel equals its stride is a linear over each patch's
//     channels * temporal_patch * patch * patch floats (a Matmul with bias);
//   + the learned position table, interpolated bilinearly to each picture's h x w grid
//     (corners aligned) and laid out in merge-window order (VisionPositionTaps);
//   blocks: x += proj(attention(LayerNorm(x))), x += fc2(act(fc1(LayerNorm(x)))); the attention
//     with qkv bias, a 2-D rotation of q and k (a quarter of each head's pairs by the patch's
//     row, a quarter by its column: VisionRotaryPositions) and each frame of each picture
//     attending within its own rows only (EncoderAttention over one sequence a frame);
//   the merger: LayerNorm, merge x merge adjacent rows (one merge window) as one row, fc1, GELU
//     (erf), fc2 to the language model's width; after the blocks `deepstack` names, a
//     deepstack merger (LayerNorm over the merged row instead) gives feature i.
//
// The 2-D rotation runs on the Rope op: at load, the rows of each q and k head are reordered
// so that its height pairs come first and its width pairs second (q.k is unchanged by one
// permutation of both), and each half of a head rotates as a head of its own with the row's
// height or width position.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/vision_arch.h"
#include "model/weights.h"
#include "ops/backend.h"

namespace gizllm {

// What the tower gives for a run of pictures: their rows for the language model, in order.
struct VisionOutput {
  int64_t rows = 0;               // sum over pictures of t * h * w / merge^2
  std::vector<float> embeddings;  // [rows, out_dim]
  // One per VisionArch::deepstack entry: [rows, out_dim], added after LM layer i.
  std::vector<std::vector<float>> deepstack;
  // Run(..., keep_on_device): the rows left in the backend's memory instead, [1 + deepstack
  // entries, rows, out_dim] floats (the embeddings, then each feature); the vectors above empty.
  std::shared_ptr<Buffer> device;
};

// The bilinear taps of the position table for every patch, in the order of the tower's rows
// (per picture: frames, then merge windows row by row, then the window's patches row by row):
// row r's embedding is sum over j of weight[r, j] * table[index[r, j]], summed j = 0..3.
struct PositionTaps {
  std::vector<int32_t> index;  // [patches, 4]
  std::vector<float> weight;   // [patches, 4]
};
PositionTaps VisionPositionTaps(const VisionArch& arch, std::span<const VisionGrid> grids);

// Each patch's (row, column) in its picture's grid, in the order of the tower's rows:
// [patches, 2].
std::vector<int32_t> VisionRotaryPositions(const VisionArch& arch,
                                           std::span<const VisionGrid> grids);

// Rows of the language model a picture takes: t * (h / merge) * (w / merge).
int64_t VisionTokens(const VisionArch& arch, const VisionGrid& grid);

class VisionTower {
 public:
  // Reads dir's config.json vision_config and its model.visual.* tensors onto `backend`: from
  // the checkpoint, or from kVisionTowerFile where the folder has one (a converted folder).
  static Expected<std::unique_ptr<VisionTower>> Load(const std::string& dir,
                                                     std::shared_ptr<Backend> backend);
  ~VisionTower();

  const VisionArch& arch() const { return arch_; }
  Backend& backend() const { return *backend_; }
  int64_t Parameters() const;

  // pixels: [patches, PatchFloats()], the pictures' patches one after another (each in the
  // order above), patches = sum of grids' t * h * w. An error names a bad grid or a size that
  // does not match. keep_on_device: the rows stay in the backend's memory (VisionOutput::device),
  // the run issued but not waited for (the backend's later ops see its results).
  Status Run(std::span<const float> pixels, std::span<const VisionGrid> grids, VisionOutput* out,
             bool keep_on_device = false);

 private:
  struct Impl;
  VisionTower() = default;
  Status Reserve(int64_t patches, int frames);

  VisionArch arch_;
  std::shared_ptr<Backend> backend_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gizllm
