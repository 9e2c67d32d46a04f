// The Qwen-VL image processor: smart_resize, the uint8 resize, the fused rescale and normalize,
// and the patches in the processor's order.
#include "vision/image_processor.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/mapped_file.h"
#include "vision/config_reader.h"

namespace gizllm::vision {
namespace {

// The pixel counts a config may ask for: far above any model's (Qwen3-VL's 16,777,216).
constexpr int64_t kMaxConfigPixels = int64_t{1} << 32;

}  // namespace

Status ImageProcessorConfig::Check() const {
  if (patch_size <= 0 || merge_size <= 0 || temporal_patch_size <= 0) {
    return InvalidArgument(
        "image processor: patch_size, merge_size and temporal_patch_size "
        "must be positive");
  }
  if (min_pixels < 0 || max_pixels <= 0 || min_pixels > max_pixels ||
      max_pixels > kMaxConfigPixels) {
    return InvalidArgument("image processor: pixels must satisfy 0 <= min_pixels (" +
                           std::to_string(min_pixels) + ") <= max_pixels (" +
                           std::to_string(max_pixels) + ") <= " + std::to_string(kMaxConfigPixels));
  }
  if (!(rescale_factor > 0) || !std::isfinite(rescale_factor)) {
    return InvalidArgument("image processor: rescale_factor must be positive");
  }
  for (int c = 0; c < 3; ++c) {
    if (!(image_std[c] != 0) || !std::isfinite(image_std[c]) || !std::isfinite(image_mean[c])) {
      return InvalidArgument("image processor: image_std must be nonzero and finite");
    }
  }
  return Status::Ok();
}

Expected<ImageProcessorConfig> ParseImageProcessorConfig(const std::string& text,
                                                         const std::string& file,
                                                         const ImageProcessorConfig& defaults) {
  nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return DataLoss(file + ": not valid JSON");
  if (!json.is_object()) return InvalidArgument(file + ": expected a JSON object");
  ConfigReader r(json, file);
  ImageProcessorConfig config = defaults;
  GZ_RETURN_IF_ERROR(r.Int("patch_size", &config.patch_size));
  GZ_RETURN_IF_ERROR(r.Int("merge_size", &config.merge_size));
  GZ_RETURN_IF_ERROR(r.Int("temporal_patch_size", &config.temporal_patch_size));
  GZ_RETURN_IF_ERROR(r.Bool("do_resize", &config.do_resize));
  GZ_RETURN_IF_ERROR(r.Bool("do_rescale", &config.do_rescale));
  GZ_RETURN_IF_ERROR(r.Bool("do_normalize", &config.do_normalize));
  GZ_RETURN_IF_ERROR(r.Channels("image_mean", &config.image_mean));
  GZ_RETURN_IF_ERROR(r.Channels("image_std", &config.image_std));
  if (const auto it = json.find("rescale_factor"); it != json.end() && !it->is_null()) {
    if (!it->is_number() || !(it->get<double>() > 0)) {
      return r.Error("rescale_factor", "a positive number", *it);
    }
    config.rescale_factor = it->get<double>();
  }
  // The processor resamples bicubic (PIL's 3) unless told otherwise; nothing else is built.
  if (const auto it = json.find("resample"); it != json.end() && !it->is_null() && *it != 3) {
    return Unimplemented(file + ": resample: only 3 (bicubic) is supported, got " + Shown(*it));
  }
  // size {shortest_edge, longest_edge}, which min_pixels and max_pixels override.
  if (const auto it = json.find("size"); it != json.end() && !it->is_null()) {
    if (!it->is_object() || !it->contains("shortest_edge") || !it->contains("longest_edge")) {
      return r.Error("size", "an object with shortest_edge and longest_edge", *it);
    }
    GZ_RETURN_IF_ERROR(r.PositiveInt(*it, "shortest_edge", "size.shortest_edge", kMaxConfigPixels,
                                     &config.min_pixels));
    GZ_RETURN_IF_ERROR(r.PositiveInt(*it, "longest_edge", "size.longest_edge", kMaxConfigPixels,
                                     &config.max_pixels));
  }
  GZ_RETURN_IF_ERROR(
      r.PositiveInt(json, "min_pixels", "min_pixels", kMaxConfigPixels, &config.min_pixels));
  GZ_RETURN_IF_ERROR(
      r.PositiveInt(json, "max_pixels", "max_pixels", kMaxConfigPixels, &config.max_pixels));
  GZ_RETURN_IF_ERROR(config.Check().Annotate(file));
  return config;
}

Expected<ImageProcessorConfig> ReadImageProcessorConfig(const std::string& folder) {
  const std::string path = folder + "/preprocessor_config.json";
  Expected<std::string> text = ReadFile(path);
  if (!text.ok()) return NotFound(path + ": missing (a vision model's folder has one)");
  return ParseImageProcessorConfig(*text, path);
}

Expected<PictureSize> SmartResize(int height, int width, int factor, int64_t min_pixels,
                                  int64_t max_pixels) {
  const std::string size = std::to_string(height) + "x" + std::to_string(width);
  if (height <= 0 || width <= 0 || factor <= 0) {
    return InvalidArgument("picture of " + size + " cannot be resized");
  }
  const double ratio = double(std::max(height, width)) / std::min(height, width);
  if (ratio > 200) {
    char text[64];
    std::snprintf(text, sizeof(text), "%.1f", ratio);
    return InvalidArgument("picture of " + size + " (height x width) has an aspect ratio of " +
                           text + ", over 200");
  }
  // Python's round() is half to even, as nearbyint in the default rounding mode.
  int64_t h = static_cast<int64_t>(std::nearbyint(double(height) / factor)) * factor;
  int64_t w = static_cast<int64_t>(std::nearbyint(double(width) / factor)) * factor;
  const int64_t area = int64_t{height} * width;
  if (h * w > max_pixels) {
    const double beta = std::sqrt(double(area) / double(max_pixels));
    h = std::max<int64_t>(factor,
                          static_cast<int64_t>(std::floor(height / beta / factor)) * factor);
    w = std::max<int64_t>(factor, static_cast<int64_t>(std::floor(width / beta / factor)) * factor);
  } else if (h * w < min_pixels) {
    const double beta = std::sqrt(double(min_pixels) / double(area));
    h = static_cast<int64_t>(std::ceil(height * beta / factor)) * factor;
    w = static_cast<int64_t>(std::ceil(width * beta / factor)) * factor;
  }
  if (h <= 0 || w <= 0 || h > (1 << 20) || w > (1 << 20)) {
    return InvalidArgument("picture of " + size + " resizes to " + std::to_string(h) + "x" +
                           std::to_string(w) + " (min_pixels " + std::to_string(min_pixels) + ")");
  }
  return PictureSize{static_cast<int>(h), static_cast<int>(w)};
}

Expected<Planes> ResizeForProcessor(const Picture& picture, const ImageProcessorConfig& config) {
  GZ_RETURN_IF_ERROR(config.Check());
  Planes planes = ToPlanes(picture);
  if (!config.do_resize) return planes;
  GZ_ASSIGN_OR_RETURN(const PictureSize size,
                      SmartResize(picture.height, picture.width, config.factor(), config.min_pixels,
                                  config.max_pixels));
  return ResizeBicubicAntialias(planes, size.height, size.width);
}

Expected<PixelValues> Patchify(const std::vector<Planes>& frames,
                               const ImageProcessorConfig& config) {
  GZ_RETURN_IF_ERROR(config.Check());
  if (frames.empty()) return InvalidArgument("no frames to cut into patches");
  const int channels = frames[0].channels, height = frames[0].height, width = frames[0].width;
  for (const Planes& f : frames) {
    if (f.channels != 3 || f.height != height || f.width != width) {
      return InvalidArgument("frames must all be RGB of one size");
    }
  }
  const int factor = config.factor();
  if (height % factor != 0 || width % factor != 0) {
    return InvalidArgument("frames of " + std::to_string(height) + "x" + std::to_string(width) +
                           " are not multiples of patch_size * merge_size (" +
                           std::to_string(factor) + ")");
  }
  // The processor's fused rescale and normalize, in float32: mean and std scaled by
  // 1 / rescale_factor, then (x - mean) / std.
  std::array<float, 3> mean{}, std{};
  for (int c = 0; c < 3; ++c) {
    const float unscale = static_cast<float>(1.0 / config.rescale_factor);
    mean[c] = config.do_rescale ? config.image_mean[c] * unscale : config.image_mean[c];
    std[c] = config.do_rescale ? config.image_std[c] * unscale : config.image_std[c];
  }
  const float rescale = static_cast<float>(config.rescale_factor);
  auto value = [&](uint8_t u, int c) -> float {
    const float x = static_cast<float>(u);
    if (config.do_normalize) return (x - mean[c]) / std[c];
    return config.do_rescale ? x * rescale : x;
  };

  const int p = config.patch_size, m = config.merge_size, t = config.temporal_patch_size;
  const int64_t frame_count = (int64_t(frames.size()) + t - 1) / t * t;  // last one repeated
  PixelValues out;
  out.grid_thw = {frame_count / t, height / p, width / p};
  out.patches = out.grid_thw[0] * out.grid_thw[1] * out.grid_thw[2];
  out.patch_dim = int64_t{channels} * t * p * p;
  out.values.resize(size_t(out.patches * out.patch_dim));
  // Patches go by time, then by merge blocks (rows of blocks, blocks of a row), then the
  // merge_size x merge_size patches of a block; inside one: channel, frame of the pair, row,
  // column (the processor's permute(0, 1, 4, 7, 5, 8, 3, 2, 6, 9)).
  float* dst = out.values.data();
  for (int64_t gt = 0; gt < out.grid_thw[0]; ++gt) {
    for (int bh = 0; bh < height / factor; ++bh) {
      for (int bw = 0; bw < width / factor; ++bw) {
        for (int mh = 0; mh < m; ++mh) {
          for (int mw = 0; mw < m; ++mw) {
            const int y0 = (bh * m + mh) * p, x0 = (bw * m + mw) * p;
            for (int c = 0; c < channels; ++c) {
              for (int tp = 0; tp < t; ++tp) {
                const size_t f = std::min<size_t>(size_t(gt * t + tp), frames.size() - 1);
                for (int py = 0; py < p; ++py) {
                  for (int px = 0; px < p; ++px)
                    *dst++ = value(frames[f].at(c, y0 + py, x0 + px), c);
                }
              }
            }
          }
        }
      }
    }
  }
  return out;
}

Expected<PixelValues> PreprocessPicture(const Picture& picture,
                                        const ImageProcessorConfig& config) {
  GZ_ASSIGN_OR_RETURN(Planes planes, ResizeForProcessor(picture, config));
  return Patchify({std::move(planes)}, config);
}

}  // namespace gizllm::vision
