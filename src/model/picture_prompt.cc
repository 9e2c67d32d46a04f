#include "model/picture_prompt.h"

#include <utility>

#include "model/evaluate.h"

namespace gizllm {

int32_t PlacedPrompt::ExpandedPosition(int32_t position) const {
  if (position < 0) return position;
  int64_t out = position;
  for (const auto& [at, added] : expansions) {
    if (at < position) out += added;
  }
  return static_cast<int32_t>(out);
}

Expected<std::unique_ptr<PictureReader>> PictureReader::Load(const std::string& dir,
                                                             std::shared_ptr<Backend> backend,
                                                             const vision::PictureLimits& limits) {
  GZ_RETURN_IF_ERROR(limits.Check());
  std::unique_ptr<PictureReader> reader(new PictureReader());
  reader->limits_ = limits;
  GZ_ASSIGN_OR_RETURN(reader->tower_, VisionTower::Load(dir, std::move(backend)));
  GZ_ASSIGN_OR_RETURN(reader->processor_, vision::ReadImageProcessorConfig(dir));
  const VisionArch& a = reader->tower_->arch();
  auto same = [&](const std::string& file, const vision::ImageProcessorConfig& p) -> Status {
    auto check = [&](const char* field, int processor, int tower, const char* tower_field) {
      if (processor == tower) return Status::Ok();
      return InvalidArgument(dir + "/" + file + ": " + field + ": " + std::to_string(processor) +
                             " is not the tower's " + tower_field + " " + std::to_string(tower) +
                             " (config.json vision_config)");
    };
    GZ_RETURN_IF_ERROR(check("patch_size", p.patch_size, a.patch, "patch_size"));
    GZ_RETURN_IF_ERROR(check("merge_size", p.merge_size, a.merge, "spatial_merge_size"));
    return check("temporal_patch_size", p.temporal_patch_size, a.temporal_patch,
                 "temporal_patch_size");
  };
  GZ_RETURN_IF_ERROR(same("preprocessor_config.json", reader->processor_));
  auto video = vision::ReadVideoProcessorConfig(dir);
  if (video.ok()) {
    GZ_RETURN_IF_ERROR(same("video_preprocessor_config.json", video->frames));
    reader->video_ = std::move(video).value();
  } else if (video.status().code() != StatusCode::kNotFound) {
    return video.status();
  }
  return reader;
}

Expected<VisionInput> PictureReader::PreparePicture(std::span<const uint8_t> bytes) const {
  GZ_ASSIGN_OR_RETURN(vision::Picture picture, vision::DecodePicture(bytes, limits_));
  GZ_ASSIGN_OR_RETURN(vision::PixelValues values, vision::PreprocessPicture(picture, processor_));
  VisionInput in;
  in.grid = {values.grid_thw[0], values.grid_thw[1], values.grid_thw[2]};
  GZ_RETURN_IF_ERROR(CheckVisionGrid(arch(), in.grid, 1));
  in.pixels = std::move(values.values);
  return in;
}

Expected<VisionInput> PictureReader::PrepareVideo(const std::vector<vision::Picture>& frames,
                                                  std::optional<double> fps) const {
  if (!video_) {
    return InvalidArgument(
        "the model reads no videos: its folder has no "
        "video_preprocessor_config.json");
  }
  GZ_ASSIGN_OR_RETURN(vision::PreparedVideo video, vision::PreprocessVideo(frames, fps, *video_));
  VisionInput in;
  const auto& g = video.pixels.grid_thw;
  in.grid = {g[0], g[1], g[2], /*video=*/true};
  GZ_RETURN_IF_ERROR(CheckVisionGrid(arch(), in.grid, 1));
  in.pixels = std::move(video.pixels.values);
  in.times = std::move(video.times);
  return in;
}

Expected<PlacedPrompt> PictureReader::Place(std::span<const int32_t> tokens,
                                            std::vector<VisionInput> inputs,
                                            const TimestampTokenizer& tokenize) const {
  const VisionArch& a = arch();
  int64_t images = 0, videos = 0;
  for (int32_t t : tokens) {
    images += t == a.image_token;
    videos += t == a.video_token;
  }
  int64_t given_videos = 0;
  for (const VisionInput& in : inputs) given_videos += in.grid.video;
  const int64_t given_pictures = static_cast<int64_t>(inputs.size()) - given_videos;
  if (images != given_pictures || videos != given_videos) {
    return InvalidArgument("the prompt holds " + std::to_string(images) +
                           " image placeholders (token " + std::to_string(a.image_token) +
                           ") and " + std::to_string(videos) + " video placeholders (token " +
                           std::to_string(a.video_token) + "), one per picture and video, and " +
                           std::to_string(given_pictures) + " pictures and " +
                           std::to_string(given_videos) + " videos are given");
  }
  PlacedPrompt out;
  out.tokens.reserve(tokens.size());
  size_t next = 0;
  const int64_t n = static_cast<int64_t>(tokens.size());
  for (int64_t i = 0; i < n; ++i) {
    const int32_t t = tokens[i];
    if (t != a.image_token && t != a.video_token) {
      out.tokens.push_back(t);
      continue;
    }
    VisionInput& in = inputs[next];
    const std::string which = (in.grid.video ? "video " : "picture ") + std::to_string(next + 1);
    if (in.grid.video != (t == a.video_token)) {
      return InvalidArgument(which + " stands where the prompt holds " +
                             (in.grid.video ? "an image" : "a video") + " placeholder");
    }
    // The prompt's tokens from `at` on, `replaced` of them, become the ones added from here.
    int64_t at = i, replaced = 1;
    if (!in.grid.video) {
      out.tokens.insert(out.tokens.end(), VisionTokens(a, in.grid), a.image_token);
      out.expansions.emplace_back(at, VisionTokens(a, in.grid) - replaced);
    } else {
      // <|vision_start|><|video_pad|><|vision_end|> becomes the frames' text; a bare video
      // placeholder too (the processor's rule for prompts written without the template).
      if (!tokenize) return InvalidArgument(which + ": no tokenizer for its timestamps");
      if (static_cast<int64_t>(in.times.size()) != in.grid.t) {
        return InvalidArgument(which + ": " + std::to_string(in.times.size()) + " timestamps for " +
                               std::to_string(in.grid.t) + " temporal patches");
      }
      if (i > 0 && tokens[i - 1] == a.vision_start && i + 1 < n && tokens[i + 1] == a.vision_end) {
        out.tokens.pop_back();
        at = i - 1;
        replaced = 3;
        ++i;  // the vision_end the frames' text replaces
      }
      const size_t before = out.tokens.size();
      const VisionGrid frame{1, in.grid.h, in.grid.w};
      for (double seconds : in.times) {
        auto text = tokenize(vision::TimestampText(seconds));
        if (!text.ok()) return text.status().Annotate(which);
        out.tokens.insert(out.tokens.end(), text->begin(), text->end());
        out.tokens.push_back(a.vision_start);
        out.tokens.insert(out.tokens.end(), VisionTokens(a, frame), a.video_token);
        out.tokens.push_back(a.vision_end);
      }
      out.expansions.emplace_back(at, static_cast<int64_t>(out.tokens.size() - before) - replaced);
    }
    out.grids.push_back(in.grid);
    out.pixels.insert(out.pixels.end(), in.pixels.begin(), in.pixels.end());
    ++next;
  }
  GZ_ASSIGN_OR_RETURN(out.positions, ComputeMropePositions(a, out.tokens, out.grids));
  return out;
}

Expected<PicturePrompt> PictureReader::Read(PlacedPrompt placed) {
  VisionOutput tower;
  if (!placed.grids.empty()) GZ_RETURN_IF_ERROR(tower_->Run(placed.pixels, placed.grids, &tower));
  PicturePrompt out;
  GZ_ASSIGN_OR_RETURN(out.pictures,
                      PlacePictures(arch(), placed.tokens, std::move(placed.positions), tower));
  out.tokens = std::move(placed.tokens);
  return out;
}

Expected<PicturePrompt> PictureReader::Expand(std::span<const int32_t> tokens,
                                              std::span<const std::vector<uint8_t>> pictures) {
  std::vector<VisionInput> inputs;
  for (size_t i = 0; i < pictures.size(); ++i) {
    auto in = PreparePicture(pictures[i]);
    if (!in.ok()) return in.status().Annotate("picture " + std::to_string(i + 1));
    inputs.push_back(std::move(in).value());
  }
  GZ_ASSIGN_OR_RETURN(PlacedPrompt placed, Place(tokens, std::move(inputs)));
  return Read(std::move(placed));
}

}  // namespace gizllm
