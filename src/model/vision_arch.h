// VisionArch: a Qwen3-VL-style vision tower (Qwen3-VL and Qwen3-VL-MoE, and the towers inside
// Qwen3.5 and Qwen3.5-MoE conditional-generation checkpoints), as config.json's vision_config
// describes it, with the token ids that place its rows in a prompt.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "core/status.h"

namespace gizllm {

// A converted folder's tower (`gizllm convert`): the tensors as the source holds them, apart from
// the quantized language model's model.safetensors. A Hugging Face folder has none: its tower
// is in its checkpoint.
inline constexpr const char* kVisionTowerFile = "vision.safetensors";

// The tower's MLP activation (vision_config.hidden_act).
enum class VisionAct : uint8_t {
  kGeluTanh,  // gelu_pytorch_tanh (Qwen3-VL, Qwen3.5)
  kGelu,      // gelu (erf)
};

struct VisionArch {
  std::string family;      // the model_type whose tower it is: "qwen3_vl", "qwen3_vl_moe",
                           // "qwen3_5", "qwen3_5_moe"
  int depth = 0;           // blocks
  int64_t dim = 0;         // hidden_size
  int64_t ffn = 0;         // intermediate_size
  int heads = 0;           // num_heads
  int head_dim = 0;        // dim / heads
  int patch = 0;           // patch_size: a patch is patch x patch pixels
  int merge = 0;           // spatial_merge_size: merge x merge patches make one row of the LM
  int temporal_patch = 0;  // temporal_patch_size: frames in one patch
  int channels = 0;        // in_channels
  int64_t out_dim = 0;     // out_hidden_size: the language model's hidden size
  int64_t positions = 0;   // num_position_embeddings, a square: the learned table's side^2
  int grid_side = 0;       // sqrt(positions)
  VisionAct act = VisionAct::kGeluTanh;
  double rope_theta = 10000.0;  // of the 2-D rotation (vision_config.rope_parameters)
  // The blocks after which a deepstack merger reads the hidden states; feature i is added to
  // the picture rows after the language model's layer i.
  std::vector<int> deepstack;
  // Prompt tokens: each picture's rows are image_token (video_token for a video) placeholders,
  // between a vision_start and a vision_end token.
  int32_t image_token = -1;
  int32_t video_token = -1;
  int32_t vision_start = -1;
  int32_t vision_end = -1;
  std::string prefix = "model.visual.";  // where its tensors are named

  // Floats of one patch: channels * temporal_patch * patch * patch (a row of pixel_values).
  int64_t PatchFloats() const {
    return static_cast<int64_t>(channels) * temporal_patch * patch * patch;
  }
  // Input width of the mergers: merge * merge patches' hidden states.
  int64_t MergedDim() const { return dim * merge * merge; }
};

// One picture's (or video's) grid of patches, as the image processor gives image_grid_thw:
// t temporal patches (1 for a picture), h by w patches.
struct VisionGrid {
  int64_t t = 0;
  int64_t h = 0;
  int64_t w = 0;
  // A video's grid: in the prompt each temporal patch is a run of video placeholders of its
  // own (after its timestamp text), placed as a picture of one frame.
  bool video = false;
  int64_t Patches() const { return t * h * w; }
};

// Reads dir/config.json's vision tower; an error names the field, or says the model has none.
Expected<VisionArch> ReadVisionArch(const std::string& dir);
// config.json alone (model_type qwen3_vl, qwen3_5 or qwen3_5_moe with a vision_config).
Expected<VisionArch> ParseVisionArch(const nlohmann::json& config, const std::string& file);

// Whether `grid` can run through `arch`'s tower: each side a positive multiple of the merge
// size, and at most 1 << 14 patches a side. The error names the picture by `index`.
Status CheckVisionGrid(const VisionArch& arch, const VisionGrid& grid, int index);

}  // namespace gizllm
