#include "model/picture_prompt.h"

#include "core/word_hash.h"

#include <utility>

#include "core/word_hash.h"
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
  WordHash h;
  h.Mix(bytes.data(), bytes.size());
  in.digest = h.Final();
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
  WordHash h;
  h.Mix(in.pixels.data(), in.pixels.size() * sizeof(float));
  h.Mix(in.times.data(), in.times.size() * sizeof(double));
  in.digest = h.Final();
  return in;
}

Expected<ChatPrompt> PictureReader::WriteVideos(const Tokenizer& tokenizer,
                                                const ChatPrompt& prompt,
                                                const std::vector<VisionInput>& inputs) const {
  const VisionArch& a = arch();
  const std::string start = tokenizer.TokenText(a.vision_start);
  const std::string video = tokenizer.TokenText(a.video_token);
  const std::string end = tokenizer.TokenText(a.vision_end);
  std::vector<const VisionInput*> videos;
  for (const VisionInput& in : inputs) {
    if (in.grid.video) videos.push_back(&in);
  }
  if (videos.empty()) return prompt;
  if (video.empty() || start.empty() || end.empty()) {
    return InvalidArgument("the tokenizer has no text for the video tokens " +
                           std::to_string(a.vision_start) + ", " + std::to_string(a.video_token) +
                           " and " + std::to_string(a.vision_end));
  }
  const std::string_view text = prompt.text;
  std::vector<size_t> found;  // byte offsets of the video placeholders
  for (size_t at = text.find(video); at != std::string_view::npos;
       at = text.find(video, at + video.size())) {
    found.push_back(at);
  }
  if (found.size() != videos.size()) {
    return InvalidArgument("the prompt holds " + std::to_string(found.size()) +
                           " video placeholders (" + video + "), one per video, and " +
                           std::to_string(videos.size()) + " videos are given");
  }
  std::vector<TextEdit> edits;
  for (size_t i = 0; i < videos.size(); ++i) {
    const VisionInput& in = *videos[i];
    if (static_cast<int64_t>(in.times.size()) != in.grid.t) {
      return InvalidArgument("video " + std::to_string(i + 1) + ": " +
                             std::to_string(in.times.size()) + " timestamps for " +
                             std::to_string(in.grid.t) + " temporal patches");
    }
    // The placeholder becomes the frames' text (each frame's timestamp, vision start, pads and
    // vision end); the template's own <|vision_start|> and <|vision_end|> around it stay, as
    // Qwen3VLProcessor leaves them.
    TextEdit e{static_cast<long>(found[i]), static_cast<long>(video.size()),
               vision::VideoPromptText(in.times, /*tokens_per_frame=*/1, start, video, end)};
    edits.push_back(std::move(e));
  }
  return prompt.Edit(tokenizer, edits);
}

Expected<PlacedPrompt> PictureReader::Place(std::span<const int32_t> tokens,
                                            std::vector<VisionInput> inputs) const {
  const VisionArch& a = arch();
  int64_t images = 0, videos = 0;
  for (int32_t t : tokens) {
    images += t == a.image_token;
    videos += t == a.video_token;
  }
  int64_t given_videos = 0, given_patches = 0;
  for (const VisionInput& in : inputs) {
    given_videos += in.grid.video;
    if (in.grid.video) given_patches += in.grid.t;
  }
  const int64_t given_pictures = static_cast<int64_t>(inputs.size()) - given_videos;
  if (images != given_pictures || videos != given_patches) {
    return InvalidArgument(
        "the prompt holds " + std::to_string(images) + " image placeholders (token " +
        std::to_string(a.image_token) + ") and " + std::to_string(videos) +
        " video placeholders (token " + std::to_string(a.video_token) +
        "), one per picture and one per temporal patch of each video, and " +
        std::to_string(given_pictures) + " pictures and " + std::to_string(given_videos) +
        " videos of " + std::to_string(given_patches) + " temporal patches are given");
  }
  PlacedPrompt out;
  out.tokens.reserve(tokens.size());
  size_t next = 0;    // the input placed now
  int64_t frame = 0;  // of the video placed now, the temporal patches placed
  const int64_t n = static_cast<int64_t>(tokens.size());
  for (int64_t i = 0; i < n; ++i) {
    const int32_t t = tokens[i];
    if (t != a.image_token && t != a.video_token) {
      out.tokens.push_back(t);
      continue;
    }
    VisionInput& in = inputs[next];
    if (in.grid.video != (t == a.video_token)) {
      return InvalidArgument((in.grid.video ? "video " : "picture ") + std::to_string(next + 1) +
                             " stands where the prompt holds " +
                             (in.grid.video ? "an image" : "a video") + " placeholder");
    }
    // A picture's placeholder becomes its rows; a video's, one per temporal patch, the frame's.
    const VisionGrid rows = in.grid.video ? VisionGrid{1, in.grid.h, in.grid.w} : in.grid;
    out.tokens.insert(out.tokens.end(), VisionTokens(a, rows), t);
    out.expansions.emplace_back(i, VisionTokens(a, rows) - 1);
    if (!in.grid.video || ++frame == in.grid.t) {
      out.grids.push_back(in.grid);
      WordHash h;
      if (in.digest != 0) {
        h.Mix(in.digest);
      } else {
        h.Mix(in.pixels.data(), in.pixels.size() * sizeof(float));
      }
      const int64_t grid[4] = {in.grid.t, in.grid.h, in.grid.w, in.grid.video};
      h.Mix(grid, sizeof(grid));
      out.digests.push_back(h.Final());
      if (out.pixels.empty()) {
        out.pixels = std::move(in.pixels);  // the first input's, without a copy
      } else {
        out.pixels.insert(out.pixels.end(), in.pixels.begin(), in.pixels.end());
      }
      ++next;
      frame = 0;
    }
  }
  GZ_ASSIGN_OR_RETURN(out.positions, ComputeMropePositions(a, out.tokens, out.grids));
  return out;
}

Expected<PicturePrompt> PictureReader::Read(PlacedPrompt placed) {
  if (placed.digests.size() != placed.grids.size()) {
    return InvalidArgument("placed pictures: " + std::to_string(placed.grids.size()) +
                           " grids and " + std::to_string(placed.digests.size()) + " digests");
  }
  VisionOutput tower;
  if (!placed.grids.empty()) {
    GZ_RETURN_IF_ERROR(tower_->Run(placed.pixels, placed.grids, &tower, keep_on_device_));
  }
  PicturePrompt out;
  GZ_ASSIGN_OR_RETURN(out.pictures,
                      PlacePictures(arch(), placed.tokens, std::move(placed.positions), tower));
  if (out.pictures.on_device()) out.pictures.device_backend = &tower_->backend();
  // Row k of input g stands for (g's digest, k): the tower's rows of a picture depend on it
  // alone (each frame attends within itself).
  PromptPictures& p = out.pictures;
  p.keys.reserve(p.count());
  for (size_t g = 0; g < placed.grids.size(); ++g) {
    const int64_t rows = VisionTokens(arch(), placed.grids[g]);
    for (int64_t k = 0; k < rows; ++k) {
      WordHash h;
      h.Mix(placed.digests[g]);
      h.Mix(static_cast<uint64_t>(k));
      p.keys.push_back(h.Final());
    }
  }
  if (p.count() != static_cast<int64_t>(p.keys.size())) {
    return Internal("placed pictures: " + std::to_string(p.count()) + " rows and " +
                    std::to_string(p.keys.size()) + " keys");
  }
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
