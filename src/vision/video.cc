// Qwen3-VL's video processing: frame sampling, the video smart_resize, patches and timestamps.
#include "vision/video.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "core/mapped_file.h"
#include "vision/config_reader.h"

namespace gizllm::vision {

Expected<VideoProcessorConfig> ParseVideoProcessorConfig(const std::string& text,
                                                         const std::string& file) {
  VideoProcessorConfig config;
  GZ_ASSIGN_OR_RETURN(config.frames, ParseImageProcessorConfig(text, file, config.frames));
  const nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  ConfigReader r(json, file);
  constexpr int64_t kMaxFrames = int64_t{1} << 20;
  GZ_RETURN_IF_ERROR(r.Bool("do_sample_frames", &config.do_sample_frames));
  GZ_RETURN_IF_ERROR(r.Bool("cap_pixels_per_frame", &config.cap_pixels_per_frame));
  GZ_RETURN_IF_ERROR(r.PositiveNumber("fps", &config.fps));
  GZ_RETURN_IF_ERROR(
      r.PositiveInt(json, "min_frames", "min_frames", kMaxFrames, &config.min_frames));
  GZ_RETURN_IF_ERROR(
      r.PositiveInt(json, "max_frames", "max_frames", kMaxFrames, &config.max_frames));
  int64_t num_frames = 0;
  GZ_RETURN_IF_ERROR(r.PositiveInt(json, "num_frames", "num_frames", kMaxFrames, &num_frames));
  if (num_frames > 0) config.num_frames = num_frames;
  if (config.min_frames > config.max_frames) {
    return InvalidArgument(file + ": min_frames (" + std::to_string(config.min_frames) +
                           ") is over max_frames (" + std::to_string(config.max_frames) + ")");
  }
  return config;
}

Expected<VideoProcessorConfig> ReadVideoProcessorConfig(const std::string& folder) {
  const std::string path = folder + "/video_preprocessor_config.json";
  Expected<std::string> text = ReadFile(path);
  if (!text.ok()) return NotFound(path + ": missing (a video model's folder has one)");
  return ParseVideoProcessorConfig(*text, path);
}

Expected<std::vector<int64_t>> SampleFrameIndices(int64_t total_frames,
                                                  std::optional<double> video_fps,
                                                  const VideoProcessorConfig& config) {
  if (total_frames <= 0) return InvalidArgument("video has no frames");
  int64_t count = 0;
  if (config.num_frames) {
    count = *config.num_frames;
  } else {
    const double rate = video_fps.value_or(kUnknownVideoFps);
    if (!(rate > 0)) return InvalidArgument("video frame rate must be positive");
    // Python's int(): toward zero.
    count = static_cast<int64_t>(double(total_frames) / rate * config.fps);
    count = std::min({std::max(count, config.min_frames), config.max_frames, total_frames});
  }
  // numpy.linspace(0, total - 1, count): i * step, the last exactly total - 1; then round().
  std::vector<int64_t> indices(count);
  const double step = count > 1 ? double(total_frames - 1) / double(count - 1) : 0.0;
  for (int64_t i = 0; i < count; ++i) {
    const double at = i + 1 == count && count > 1 ? double(total_frames - 1) : double(i) * step;
    indices[i] = static_cast<int64_t>(std::nearbyint(at));
  }
  return indices;
}

Expected<PictureSize> SmartResizeVideo(int frames, int height, int width, int temporal_factor,
                                       int factor, int64_t min_pixels, int64_t max_pixels) {
  const std::string size = std::to_string(height) + "x" + std::to_string(width);
  if (height <= 0 || width <= 0 || factor <= 0 || temporal_factor <= 0) {
    return InvalidArgument("video of " + size + " cannot be resized");
  }
  if (frames < temporal_factor) {
    return InvalidArgument("video has " + std::to_string(frames) + " frames, fewer than the " +
                           std::to_string(temporal_factor) + " of a temporal patch");
  }
  int64_t h = height, w = width;
  if (h < factor || w < factor) {  // the short side scaled up to the factor first
    const double scale = std::max(double(factor) / h, double(factor) / w);
    h = static_cast<int64_t>(h * scale);
    w = static_cast<int64_t>(w * scale);
  }
  const double ratio = double(std::max(h, w)) / double(std::min(h, w));
  if (ratio > 200) {
    char text[64];
    std::snprintf(text, sizeof(text), "%.1f", ratio);
    return InvalidArgument("video of " + size + " (height x width) has an aspect ratio of " + text +
                           ", over 200");
  }
  int64_t h_bar = static_cast<int64_t>(std::nearbyint(double(h) / factor)) * factor;
  int64_t w_bar = static_cast<int64_t>(std::nearbyint(double(w) / factor)) * factor;
  const int64_t t_bar =
      static_cast<int64_t>(std::nearbyint(double(frames) / temporal_factor)) * temporal_factor;
  const double volume = double(frames) * double(h) * double(w);
  if (t_bar * h_bar * w_bar > max_pixels) {
    const double beta = std::sqrt(volume / double(max_pixels));
    h_bar = std::max<int64_t>(factor, static_cast<int64_t>(std::floor(h / beta / factor)) * factor);
    w_bar = std::max<int64_t>(factor, static_cast<int64_t>(std::floor(w / beta / factor)) * factor);
  } else if (t_bar * h_bar * w_bar < min_pixels) {
    const double beta = std::sqrt(double(min_pixels) / volume);
    h_bar = static_cast<int64_t>(std::ceil(h * beta / factor)) * factor;
    w_bar = static_cast<int64_t>(std::ceil(w * beta / factor)) * factor;
  }
  if (h_bar <= 0 || w_bar <= 0 || h_bar > (1 << 20) || w_bar > (1 << 20)) {
    return InvalidArgument("video of " + size + " resizes to " + std::to_string(h_bar) + "x" +
                           std::to_string(w_bar));
  }
  return PictureSize{static_cast<int>(h_bar), static_cast<int>(w_bar)};
}

Expected<PictureSize> VideoFrameSize(int frames, int height, int width,
                                     const VideoProcessorConfig& config) {
  const ImageProcessorConfig& c = config.frames;
  int64_t max_pixels = c.max_pixels;
  if (config.cap_pixels_per_frame && frames > 0) {
    // At most 768 merged patches a frame or an even share of the budget, at least 1.05 times
    // the minimum (qwen-vl-utils' VIDEO_FRAME_MAX_PIXELS).
    const int64_t frame_cap = int64_t{768} * c.factor() * c.factor();
    const int64_t per_frame = std::max(std::min(frame_cap, c.max_pixels / frames),
                                       static_cast<int64_t>(double(c.min_pixels) * 1.05));
    max_pixels = per_frame * frames;
  }
  return SmartResizeVideo(frames, height, width, c.temporal_patch_size, c.factor(), c.min_pixels,
                          max_pixels);
}

std::vector<double> TemporalPatchTimes(const std::vector<int64_t>& indices, double video_fps,
                                       int temporal_patch_size) {
  std::vector<int64_t> padded = indices;
  while (!padded.empty() && padded.size() % temporal_patch_size != 0) {
    padded.push_back(padded.back());
  }
  std::vector<double> times;
  for (size_t i = 0; i < padded.size(); i += temporal_patch_size) {
    const double first = double(padded[i]) / video_fps;
    const double last = double(padded[i + temporal_patch_size - 1]) / video_fps;
    times.push_back((first + last) / 2);
  }
  return times;
}

std::string TimestampText(double seconds) {
  // Python's f"{x:.1f}" and printf's %.1f both round the exact binary value half to even.
  char text[64];
  std::snprintf(text, sizeof(text), "<%.1f seconds>", seconds);
  return text;
}

std::string VideoPromptText(const std::vector<double>& times, int64_t tokens_per_frame,
                            const std::string& vision_start, const std::string& video_token,
                            const std::string& vision_end) {
  std::string text;
  for (double t : times) {
    text += TimestampText(t);
    text += vision_start;
    for (int64_t i = 0; i < tokens_per_frame; ++i) text += video_token;
    text += vision_end;
  }
  return text;
}

Expected<PreparedVideo> PreprocessVideo(const std::vector<Picture>& frames,
                                        std::optional<double> video_fps,
                                        const VideoProcessorConfig& config) {
  GZ_RETURN_IF_ERROR(config.frames.Check());
  if (frames.empty()) return InvalidArgument("video has no frames");
  PreparedVideo video;
  if (config.do_sample_frames) {
    GZ_ASSIGN_OR_RETURN(video.indices,
                        SampleFrameIndices(int64_t(frames.size()), video_fps, config));
  } else {
    for (size_t i = 0; i < frames.size(); ++i) video.indices.push_back(int64_t(i));
  }
  const int height = frames[0].height, width = frames[0].width;
  for (const Picture& f : frames) {
    if (f.height != height || f.width != width) {
      return InvalidArgument("video frames differ in size (" + std::to_string(f.width) + "x" +
                             std::to_string(f.height) + " and " + std::to_string(width) + "x" +
                             std::to_string(height) + ")");
    }
  }
  PictureSize size{height, width};
  if (config.frames.do_resize) {
    GZ_ASSIGN_OR_RETURN(size, VideoFrameSize(int(video.indices.size()), height, width, config));
  }
  std::vector<Planes> planes;
  planes.reserve(video.indices.size());
  for (int64_t i : video.indices) {
    planes.push_back(ResizeBicubicAntialias(ToPlanes(frames[i]), size.height, size.width));
  }
  GZ_ASSIGN_OR_RETURN(video.pixels, Patchify(planes, config.frames));
  video.times = TemporalPatchTimes(video.indices, video_fps.value_or(kUnknownVideoFps),
                                   config.frames.temporal_patch_size);
  const int64_t merge = config.frames.merge_size;
  video.tokens_per_frame = video.pixels.grid_thw[1] * video.pixels.grid_thw[2] / (merge * merge);
  return video;
}

Expected<std::vector<Picture>> ReadFrameFolder(const std::string& folder, int64_t max_frames,
                                               const PictureLimits& limits) {
  std::error_code error;
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(folder, error)) {
    if (entry.is_regular_file()) names.push_back(entry.path().filename().string());
  }
  if (error) return NotFound(folder + ": cannot list the video's frames: " + error.message());
  if (names.empty()) return InvalidArgument(folder + ": no frames");
  if (int64_t(names.size()) > max_frames) {
    return InvalidArgument(folder + ": " + std::to_string(names.size()) +
                           " frames, over the limit of " + std::to_string(max_frames));
  }
  std::sort(names.begin(), names.end());
  std::vector<Picture> frames;
  for (const std::string& name : names) {
    const std::string path = folder + "/" + name;
    GZ_ASSIGN_OR_RETURN(const std::string bytes, ReadFile(path));
    Expected<Picture> picture = DecodePicture(
        std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), limits);
    if (!picture.ok()) return picture.status().Annotate(path);
    frames.push_back(std::move(picture).value());
  }
  return frames;
}

}  // namespace gizllm::vision
