#include "model/picture_prompt.h"

#include <utility>

#include "model/evaluate.h"

namespace gizllm {

Expected<std::unique_ptr<PictureReader>> PictureReader::Load(const std::string& dir,
                                                             std::shared_ptr<Backend> backend,
                                                             const vision::PictureLimits& limits) {
  GZ_RETURN_IF_ERROR(limits.Check());
  std::unique_ptr<PictureReader> reader(new PictureReader());
  reader->limits_ = limits;
  GZ_ASSIGN_OR_RETURN(reader->tower_, VisionTower::Load(dir, std::move(backend)));
  GZ_ASSIGN_OR_RETURN(reader->processor_, vision::ReadImageProcessorConfig(dir));
  const VisionArch& a = reader->tower_->arch();
  const vision::ImageProcessorConfig& p = reader->processor_;
  auto same = [&](const char* field, int processor, int tower, const char* tower_field) -> Status {
    if (processor == tower) return Status::Ok();
    return InvalidArgument(dir + "/preprocessor_config.json: " + field + ": " +
                           std::to_string(processor) + " is not the tower's " + tower_field + " " +
                           std::to_string(tower) + " (config.json vision_config)");
  };
  GZ_RETURN_IF_ERROR(same("patch_size", p.patch_size, a.patch, "patch_size"));
  GZ_RETURN_IF_ERROR(same("merge_size", p.merge_size, a.merge, "spatial_merge_size"));
  GZ_RETURN_IF_ERROR(
      same("temporal_patch_size", p.temporal_patch_size, a.temporal_patch, "temporal_patch_size"));
  return reader;
}

Expected<PicturePrompt> PictureReader::Expand(std::span<const int32_t> tokens,
                                              std::span<const std::vector<uint8_t>> pictures) {
  const VisionArch& a = tower_->arch();
  int64_t placeholders = 0;
  for (int32_t t : tokens) placeholders += t == a.image_token;
  if (placeholders != static_cast<int64_t>(pictures.size())) {
    return InvalidArgument("the prompt holds " + std::to_string(placeholders) +
                           " image placeholders (token " + std::to_string(a.image_token) +
                           "), one per picture, and " + std::to_string(pictures.size()) +
                           " pictures are given");
  }
  // Every picture's patches one after another, as the tower reads them in one run.
  std::vector<VisionGrid> grids;
  std::vector<float> pixels;
  for (size_t i = 0; i < pictures.size(); ++i) {
    const std::string which = "picture " + std::to_string(i + 1);
    auto picture = vision::DecodePicture(pictures[i], limits_);
    if (!picture.ok()) return picture.status().Annotate(which);
    auto values = vision::PreprocessPicture(*picture, processor_);
    if (!values.ok()) return values.status().Annotate(which);
    const VisionGrid grid{values->grid_thw[0], values->grid_thw[1], values->grid_thw[2]};
    GZ_RETURN_IF_ERROR(CheckVisionGrid(a, grid, static_cast<int>(i + 1)));
    grids.push_back(grid);
    pixels.insert(pixels.end(), values->values.begin(), values->values.end());
  }
  PicturePrompt out;
  out.tokens.reserve(tokens.size());
  size_t next = 0;
  for (int32_t t : tokens) {
    if (t != a.image_token) {
      out.tokens.push_back(t);
      continue;
    }
    out.tokens.insert(out.tokens.end(), VisionTokens(a, grids[next++]), a.image_token);
  }
  VisionOutput tower;
  if (!grids.empty()) GZ_RETURN_IF_ERROR(tower_->Run(pixels, grids, &tower));
  GZ_ASSIGN_OR_RETURN(MropePositions positions, ComputeMropePositions(a, out.tokens, grids));
  GZ_ASSIGN_OR_RETURN(out.pictures, PlacePictures(a, out.tokens, std::move(positions), tower));
  return out;
}

}  // namespace gizllm
