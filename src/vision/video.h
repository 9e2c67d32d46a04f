// Video for Qwen3-VL (Hugging Face's Qwen3VLVideoProcessor and Qwen3VLProcessor): which frames
// are sampled, the size they are resized to, their patches (pairs of frames per temporal
// patch, as pictures are), and the timestamp text the prompt gives each pair. A video here is
// its decoded frames in order (a folder of pictures, or frames decoded elsewhere) and the rate
// they were taken at.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "vision/image_processor.h"
#include "vision/picture.h"

namespace gizllm::vision {

// video_preprocessor_config.json's fields; the defaults are Qwen3VLVideoProcessor's.
struct VideoProcessorConfig {
  // Patches, normalization and size {shortest_edge, longest_edge} (here the pixels of all
  // sampled frames together: 128 and 768 patches of 32 x 32).
  ImageProcessorConfig frames = [] {
    ImageProcessorConfig c;
    c.patch_size = 16;
    c.min_pixels = 128 * 32 * 32;
    c.max_pixels = 768 * 32 * 32;
    c.image_mean = {0.5f, 0.5f, 0.5f};
    c.image_std = {0.5f, 0.5f, 0.5f};
    return c;
  }();
  bool do_sample_frames = true;
  double fps = 2;                     // frames sampled per second of video
  std::optional<int64_t> num_frames;  // instead of fps: this many frames
  int64_t min_frames = 4;
  int64_t max_frames = 768;
  // qwen-vl-utils' cap on each frame's pixels (transformers' cap_pixels_per_frame).
  bool cap_pixels_per_frame = false;
};

// Reads `folder`/video_preprocessor_config.json (NotFound when the folder has none).
Expected<VideoProcessorConfig> ReadVideoProcessorConfig(const std::string& folder);
Expected<VideoProcessorConfig> ParseVideoProcessorConfig(const std::string& text,
                                                         const std::string& file);

// The rate assumed for frames whose video's rate is not known (transformers' 24).
inline constexpr double kUnknownVideoFps = 24;

// Which of `total_frames` frames are kept (sample_frames): num_frames, or
// total / video_fps * fps of them, within [min_frames, max_frames] and at most all of them,
// spread evenly from the first to the last (numpy's linspace, rounded half to even).
Expected<std::vector<int64_t>> SampleFrameIndices(int64_t total_frames,
                                                  std::optional<double> video_fps,
                                                  const VideoProcessorConfig& config);

// The video processor's smart_resize: like the picture's, but over all `frames` (rounded to
// the temporal patch), and a side under the factor scaled up to it first.
Expected<PictureSize> SmartResizeVideo(int frames, int height, int width, int temporal_factor,
                                       int factor, int64_t min_pixels, int64_t max_pixels);

// The size every sampled frame is resized to (cap_pixels_per_frame applied).
Expected<PictureSize> VideoFrameSize(int frames, int height, int width,
                                     const VideoProcessorConfig& config);

// The time of each temporal patch in seconds: the sampled indices padded with the last to a
// multiple of temporal_patch_size, each index / video_fps, the first and last of each group
// averaged (Qwen3VLProcessor._calculate_timestamps).
std::vector<double> TemporalPatchTimes(const std::vector<int64_t>& indices, double video_fps,
                                       int temporal_patch_size);

// "<1.5 seconds>", as the processor writes a time before each temporal patch's tokens.
std::string TimestampText(double seconds);

// What stands for the video in the prompt: per temporal patch its timestamp text, then
// `vision_start`, `video_token` once per merged patch of a frame, `vision_end`.
std::string VideoPromptText(const std::vector<double>& times, int64_t tokens_per_frame,
                            const std::string& vision_start, const std::string& video_token,
                            const std::string& vision_end);

struct PreparedVideo {
  std::vector<int64_t> indices;  // the frames sampled, into the frames given
  std::vector<double> times;     // [grid_thw[0]] seconds of each temporal patch
  PixelValues pixels;            // grid_thw {temporal patches, h, w}
  int64_t tokens_per_frame = 0;  // h * w / merge_size^2
};

// Frames of one size sampled, resized, normalized and cut into patches as the processor does.
// `video_fps` is the rate of `frames` (nullopt: unknown, kUnknownVideoFps assumed).
Expected<PreparedVideo> PreprocessVideo(const std::vector<Picture>& frames,
                                        std::optional<double> video_fps,
                                        const VideoProcessorConfig& config);

// The pictures of `folder` in name order, decoded, as a video's frames; more than `max_frames`
// files is an error.
Expected<std::vector<Picture>> ReadFrameFolder(const std::string& folder, int64_t max_frames,
                                               const PictureLimits& limits = {});

}  // namespace gizllm::vision
