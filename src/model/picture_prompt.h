// A prompt's pictures from their bytes to what the language model reads: each picture decoded
// (vision/picture.h), preprocessed as the folder's preprocessor_config.json says
// (vision/image_processor.h), run through the tower, and its one image placeholder in the
// prompt (Qwen3-VL's chat template writes <|vision_start|><|image_pad|><|vision_end|>)
// repeated to t * h * w / merge^2 placeholders, as transformers' Qwen3VLProcessor expands it;
// then the M-RoPE positions and the picture rows (PromptPictures) for Request::pictures.
//
//   GZ_ASSIGN_OR_RETURN(auto reader, PictureReader::Load(model.dir(), backend));
//   GZ_ASSIGN_OR_RETURN(PicturePrompt p, reader->Expand(ids, {bytes_1, bytes_2}));
//   request.prompt = p.tokens;
//   request.pictures = std::make_shared<const PromptPictures>(std::move(p.pictures));
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/mrope.h"
#include "model/vision_tower.h"
#include "ops/backend.h"
#include "vision/image_processor.h"
#include "vision/picture.h"

namespace gizllm {

struct PicturePrompt {
  std::vector<int32_t> tokens;  // the prompt with each picture's placeholders expanded
  PromptPictures pictures;      // their positions, rows and deepstack features
};

class PictureReader {
 public:
  // Reads dir's vision tower (config.json's vision_config, model.visual.* tensors) and its
  // preprocessor_config.json. Errors: a model without a tower ("<dir>: the model has no vision
  // tower"), a processor whose patch, merge or temporal patch size is not the tower's.
  static Expected<std::unique_ptr<PictureReader>> Load(const std::string& dir,
                                                       std::shared_ptr<Backend> backend,
                                                       const vision::PictureLimits& limits = {});

  const VisionArch& arch() const { return tower_->arch(); }
  const vision::ImageProcessorConfig& processor() const { return processor_; }

  // `tokens` holds one image placeholder per picture, in the pictures' order. Errors name the
  // picture, counting from 1 ("picture 2: PNG truncated"), or the count of placeholders and
  // pictures when they differ.
  Expected<PicturePrompt> Expand(std::span<const int32_t> tokens,
                                 std::span<const std::vector<uint8_t>> pictures);

 private:
  PictureReader() = default;

  std::unique_ptr<VisionTower> tower_;
  vision::ImageProcessorConfig processor_;
  vision::PictureLimits limits_;
};

}  // namespace gizllm
