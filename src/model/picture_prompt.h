// A prompt's pictures and videos from their bytes (or decoded frames) to what the language model
// reads: each picture decoded (vision/picture.h) and preprocessed as the folder's
// preprocessor_config.json says (vision/image_processor.h), each video's frames sampled and
// preprocessed as video_preprocessor_config.json says (vision/video.h); the prompt's
// placeholders expanded as transformers' Qwen3VLProcessor expands them, with the M-RoPE
// positions; then the tower run and its rows placed (PromptPictures) for Request::pictures.
//
// Placeholders: the chat template writes <|vision_start|><|image_pad|><|vision_end|> for a
// picture, repeated here to t * h * w / merge^2 image placeholders; and
// <|vision_start|><|video_pad|><|vision_end|> for a video, which becomes, per temporal patch,
// its timestamp text ("<0.5 seconds>"), <|vision_start|>, h * w / merge^2 video placeholders,
// <|vision_end|>. The timestamps are text: WriteVideos puts them into the rendered prompt, one
// video placeholder per temporal patch, and tokenizes it whole again (so the text before a
// video tokenizes with its first timestamp as the processor's whole-text tokenization does);
// Place then repeats each placeholder to its picture's or frame's rows.
//
// Two halves, so that a server can prepare pictures on its request threads and run the tower
// on its engine thread: Prepare*, WriteVideos and Place are const and thread safe (no backend);
// Read runs the tower.
//
//   GZ_ASSIGN_OR_RETURN(auto reader, PictureReader::Load(model.dir(), backend));
//   GZ_ASSIGN_OR_RETURN(PicturePrompt p, reader->Expand(ids, {bytes_1, bytes_2}));
// or, with videos:
//   GZ_ASSIGN_OR_RETURN(ChatPrompt written, reader->WriteVideos(tokenizer, chat, inputs));
//   GZ_ASSIGN_OR_RETURN(PlacedPrompt placed, reader->Place(written.tokens, inputs));
//   GZ_ASSIGN_OR_RETURN(PicturePrompt p, reader->Read(std::move(placed)));
//   request.prompt = p.tokens;
//   request.pictures = std::make_shared<const PromptPictures>(std::move(p.pictures));
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "model/mrope.h"
#include "model/vision_tower.h"
#include "ops/backend.h"
#include "template/chat_prompt.h"
#include "tokenizer/tokenizer.h"
#include "vision/image_processor.h"
#include "vision/picture.h"
#include "vision/video.h"

namespace gizllm {

// One picture or video, preprocessed, before the tower.
struct VisionInput {
  VisionGrid grid;            // t temporal patches (1 for a picture), h x w patches; video set
  std::vector<float> pixels;  // [grid.Patches(), PatchFloats()]
  std::vector<double> times;  // a video's: [grid.t] seconds of each temporal patch
  // What the input is, for the keys of its rows in prefix reuse: a hash of a picture's encoded
  // bytes or a video's pixels; 0: Place hashes the pixels.
  uint64_t digest = 0;
};

// A prompt with its pictures and videos placed, the tower not run yet.
struct PlacedPrompt {
  std::vector<int32_t> tokens;    // the placeholders expanded
  MropePositions positions;       // of `tokens`
  std::vector<VisionGrid> grids;  // the tower's inputs, in prompt order
  std::vector<float> pixels;      // [patches, PatchFloats()], the grids' patches in order
  std::vector<uint64_t> digests;  // [grids]: each input's digest with its grid
  // Per placeholder of the prompt given to Place, in order: its index there and the tokens it
  // added.
  std::vector<std::pair<int64_t, int64_t>> expansions;

  // Where position `position` of the prompt given to Place lies in `tokens`; -1 stays -1.
  int32_t ExpandedPosition(int32_t position) const;
};

struct PicturePrompt {
  std::vector<int32_t> tokens;  // the prompt with each picture's placeholders expanded
  PromptPictures pictures;      // their positions, rows and deepstack features
};

class PictureReader {
 public:
  // Reads dir's vision tower (config.json's vision_config, model.visual.* tensors), its
  // preprocessor_config.json and, where the folder has one, its video_preprocessor_config.json.
  // Errors: a model without a tower ("<dir>: the model has no vision tower"), a processor whose
  // patch, merge or temporal patch size is not the tower's. `limits` bound each picture and
  // video frame decoded.
  static Expected<std::unique_ptr<PictureReader>> Load(const std::string& dir,
                                                       std::shared_ptr<Backend> backend,
                                                       const vision::PictureLimits& limits = {});

  const VisionArch& arch() const { return tower_->arch(); }
  const vision::ImageProcessorConfig& processor() const { return processor_; }
  const vision::PictureLimits& limits() const { return limits_; }
  // Whether the folder has a video processor (video_preprocessor_config.json).
  bool reads_videos() const { return video_.has_value(); }

  // A picture's bytes decoded and preprocessed. Errors name the fault ("PNG truncated"); the
  // caller says which picture.
  Expected<VisionInput> PreparePicture(std::span<const uint8_t> bytes) const;
  // A video's decoded frames (in order, taken at `fps` frames a second; nullopt: unknown,
  // vision::kUnknownVideoFps assumed) sampled and preprocessed.
  Expected<VisionInput> PrepareVideo(const std::vector<vision::Picture>& frames,
                                     std::optional<double> fps) const;

  // `prompt` (rendered with one placeholder per input, in the inputs' order) with each video's
  // placeholder (<|vision_start|><|video_pad|><|vision_end|>, or a bare <|video_pad|>, the
  // processor's rule for prompts written without the template) written out as
  // Qwen3VLProcessor writes it, one video placeholder per temporal patch, and tokenized whole
  // again (ChatPrompt::Edit: its marks move with the text). The prompt as it was without videos.
  // Errors: placeholders and videos that do not pair up.
  Expected<ChatPrompt> WriteVideos(const Tokenizer& tokenizer, const ChatPrompt& prompt,
                                   const std::vector<VisionInput>& inputs) const;

  // `tokens` holds, in the inputs' order, an image placeholder per picture and, per video (as
  // WriteVideos writes it), a video placeholder per temporal patch. Errors give the counts when
  // they differ, or the input whose kind is not its placeholder's.
  Expected<PlacedPrompt> Place(std::span<const int32_t> tokens,
                               std::vector<VisionInput> inputs) const;

  // Runs the tower on a placed prompt's pictures and videos and places its rows, each keyed by
  // its input's digest and its index there (PromptPictures::keys).
  Expected<PicturePrompt> Read(PlacedPrompt placed);

  // Whether Read leaves the rows in the backend's memory (PromptPictures::device, for an Engine
  // on the same backend: no copy to the host, none a step) instead of copying them to the host
  // (PromptPictures::embeddings and deepstack, the default).
  void KeepRowsOnDevice(bool keep) { keep_on_device_ = keep; }

  // PreparePicture, Place and Read for a prompt with pictures only. Errors name the picture,
  // counting from 1 ("picture 2: PNG truncated").
  Expected<PicturePrompt> Expand(std::span<const int32_t> tokens,
                                 std::span<const std::vector<uint8_t>> pictures);

 private:
  PictureReader() = default;

  std::unique_ptr<VisionTower> tower_;
  vision::ImageProcessorConfig processor_;
  std::optional<vision::VideoProcessorConfig> video_;
  vision::PictureLimits limits_;
  bool keep_on_device_ = false;
};

}  // namespace gizllm
