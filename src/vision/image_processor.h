// The Qwen-VL image processor (Hugging Face's Qwen2VLImageProcessor, torchvision backend, which
// Qwen2-VL, Qwen2.5-VL, Qwen3-VL and Qwen3.5 use): a picture resized to multiples of
// patch_size * merge_size within [min_pixels, max_pixels] (SmartResize), resized as torchvision
// does on uint8 (resize.h), rescaled and normalized in float32 as the processor's fused step
// does, and cut into patches of temporal_patch_size copies of the picture, in the processor's
// order: pixel_values [patches, channels * temporal_patch_size * patch_size * patch_size] and
// grid_thw.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "vision/picture.h"
#include "vision/resize.h"

namespace gizllm::vision {

// preprocessor_config.json's fields; the defaults are the processor class's own.
struct ImageProcessorConfig {
  int patch_size = 14;
  int merge_size = 2;
  int temporal_patch_size = 2;
  int64_t min_pixels = 56 * 56;         // size.shortest_edge, or min_pixels
  int64_t max_pixels = 28 * 28 * 1280;  // size.longest_edge, or max_pixels
  bool do_resize = true;
  bool do_rescale = true;
  bool do_normalize = true;
  double rescale_factor = 1.0 / 255;
  std::array<float, 3> image_mean = {0.48145466f, 0.4578275f, 0.40821073f};  // OpenAI CLIP's
  std::array<float, 3> image_std = {0.26862954f, 0.26130258f, 0.27577711f};

  int factor() const { return patch_size * merge_size; }
  Status Check() const;
};

// Reads `folder`/preprocessor_config.json (NotFound when the folder has none). Fields it lacks
// keep the defaults; errors name the file and the field ("<folder>/preprocessor_config.json:
// size.longest_edge: expected a positive integer, got \"x\"").
Expected<ImageProcessorConfig> ReadImageProcessorConfig(const std::string& folder);

// The same fields from JSON text; `file` names it in errors; fields it lacks keep `defaults`.
Expected<ImageProcessorConfig> ParseImageProcessorConfig(const std::string& text,
                                                         const std::string& file,
                                                         const ImageProcessorConfig& defaults = {});

struct PictureSize {
  int height = 0;
  int width = 0;
  bool operator==(const PictureSize&) const = default;
};

// Qwen's smart_resize: each side rounded (half to even) to a multiple of `factor`; if the area
// is over max_pixels both shrink by sqrt(area / max_pixels), floored to the factor (at least
// one factor); if under min_pixels both grow by sqrt(min_pixels / area), ceiled. An aspect
// ratio over 200 is an error, as is a side that comes out 0.
Expected<PictureSize> SmartResize(int height, int width, int factor, int64_t min_pixels,
                                  int64_t max_pixels);

// Patches of one picture or video and where they lie: grid_thw = {t, h, w} in patches.
struct PixelValues {
  int64_t patches = 0;    // t * h * w
  int64_t patch_dim = 0;  // channels * temporal_patch_size * patch_size * patch_size
  std::array<int64_t, 3> grid_thw = {0, 0, 0};
  std::vector<float> values;  // [patches, patch_dim]
};

// The resized uint8 planes the processor normalizes next: `picture` at SmartResize's size (or
// as it is, when do_resize is false).
Expected<Planes> ResizeForProcessor(const Picture& picture, const ImageProcessorConfig& config);

// Frames of one size (a picture is one frame) normalized and cut into patches; the last frame is
// repeated until their count is a multiple of temporal_patch_size. Each frame's sides must be
// multiples of patch_size * merge_size.
Expected<PixelValues> Patchify(const std::vector<Planes>& frames,
                               const ImageProcessorConfig& config);

// A decoded picture all the way to pixel_values and grid_thw, as the processor makes them.
Expected<PixelValues> PreprocessPicture(const Picture& picture, const ImageProcessorConfig& config);

}  // namespace gizllm::vision
