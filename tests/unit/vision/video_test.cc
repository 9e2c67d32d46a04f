// Qwen3-VL's video arithmetic: frame sampling, the video smart_resize, timestamps and their
// text. Expected values worked out with transformers' video_processing_qwen3_vl.py and
// processing_qwen3_vl.py (numpy's linspace, Python's round and format).
#include "vision/video.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "picture_encoders.h"

namespace gizllm::vision {
namespace {

using Indices = std::vector<int64_t>;

Indices Sample(int64_t total, std::optional<double> fps, std::optional<int64_t> num = {}) {
  VideoProcessorConfig config;
  config.num_frames = num;
  Expected<Indices> got = SampleFrameIndices(total, fps, config);
  EXPECT_TRUE(got.ok()) << got.status().message();
  return got.ok() ? *got : Indices{};
}

TEST(Video, SamplesFramesAsTransformers) {
  EXPECT_EQ(Sample(100, 25), (Indices{0, 14, 28, 42, 57, 71, 85, 99}));  // 2 a second of 4 s
  EXPECT_EQ(Sample(10, 30), (Indices{0, 3, 6, 9}));                      // min_frames 4
  EXPECT_EQ(Sample(3, 24), (Indices{0, 1, 2}));                          // at most all
  EXPECT_EQ(Sample(48, std::nullopt), (Indices{0, 16, 31, 47}));         // 24 fps assumed
  EXPECT_EQ(Sample(6, 24, 5), (Indices{0, 1, 2, 4, 5}));                 // 2.5 rounds to 2
  const Indices many = Sample(100000, 1);                                // max_frames 768
  ASSERT_EQ(many.size(), 768u);
  EXPECT_EQ(many[1], 130);
  EXPECT_EQ(many[2], 261);
  EXPECT_EQ(many[766], 99869);
  EXPECT_EQ(many.back(), 99999);
  const Indices thirty = Sample(1000, 30);
  ASSERT_EQ(thirty.size(), 66u);
  EXPECT_EQ(Indices(thirty.begin(), thirty.begin() + 10),
            (Indices{0, 15, 31, 46, 61, 77, 92, 108, 123, 138}));
  EXPECT_FALSE(SampleFrameIndices(0, 30, VideoProcessorConfig{}).ok());
}

PictureSize VideoSize(int frames, int h, int w) {
  const VideoProcessorConfig config;
  Expected<PictureSize> s = VideoFrameSize(frames, h, w, config);
  EXPECT_TRUE(s.ok()) << s.status().message();
  return s.ok() ? *s : PictureSize{};
}

TEST(Video, ResizesOverAllFramesAsTransformers) {
  EXPECT_EQ(VideoSize(8, 480, 640), (PictureSize{256, 352}));
  EXPECT_EQ(VideoSize(4, 20, 300), (PictureSize{64, 704}));    // the short side scaled to 32 first
  EXPECT_EQ(VideoSize(5, 100, 100), (PictureSize{192, 192}));  // 5 frames round to 4
  EXPECT_EQ(VideoSize(2, 1080, 1920), (PictureSize{448, 832}));
  EXPECT_EQ(VideoSize(64, 1080, 1920), (PictureSize{64, 128}));
  Expected<PictureSize> one = VideoFrameSize(1, 100, 100, VideoProcessorConfig{});
  ASSERT_FALSE(one.ok());
  EXPECT_EQ(one.status().message(), "video has 1 frames, fewer than the 2 of a temporal patch");
  VideoProcessorConfig capped;
  capped.cap_pixels_per_frame = true;
  EXPECT_EQ(*VideoFrameSize(8, 480, 640, capped), (PictureSize{320, 416}));
  EXPECT_EQ(*VideoFrameSize(64, 1080, 1920, capped), (PictureSize{256, 480}));
}

TEST(Video, TimestampsAsTheProcessorWritesThem) {
  EXPECT_EQ(TemporalPatchTimes({0, 3, 6, 9}, 30, 2), (std::vector<double>{0.05, 0.25}));
  // An odd count repeats the last index.
  EXPECT_EQ(TemporalPatchTimes({0, 1, 2}, 24, 2),
            (std::vector<double>{(0.0 + 1.0 / 24) / 2, (2.0 / 24 + 2.0 / 24) / 2}));
  // Python's format: the binary value of 0.05 is above the half, 0.25 a tie to even.
  EXPECT_EQ(TimestampText(0.05), "<0.1 seconds>");
  EXPECT_EQ(TimestampText(0.25), "<0.2 seconds>");
  EXPECT_EQ(TimestampText(2.5599999999999996), "<2.6 seconds>");
  EXPECT_EQ(TimestampText(0.020833333333333332), "<0.0 seconds>");
  std::string texts;
  for (double t : TemporalPatchTimes({0, 14, 28, 42, 57, 71, 85, 99}, 25, 2)) {
    texts += TimestampText(t);
  }
  EXPECT_EQ(texts, "<0.3 seconds><1.4 seconds><2.6 seconds><3.7 seconds>");
  EXPECT_EQ(VideoPromptText({0.05, 0.25}, 2, "<s>", "<v>", "</s>"),
            "<0.1 seconds><s><v><v></s><0.2 seconds><s><v><v></s>");
}

TEST(Video, PreprocessesFramesIntoPairs) {
  // 10 frames of 40 x 60 at 30 fps: 4 sampled (0, 3, 6, 9), 2 temporal patches.
  std::vector<Picture> frames;
  for (int i = 0; i < 10; ++i) frames.push_back({60, 40, testing::Pattern(60, 40, 3, i + 1)});
  VideoProcessorConfig config;
  config.frames.min_pixels = 4 * 32 * 32;
  config.frames.max_pixels = 4 * 64 * 96;
  Expected<PreparedVideo> video = PreprocessVideo(frames, 30, config);
  ASSERT_TRUE(video.ok()) << video.status().message();
  EXPECT_EQ(video->indices, (Indices{0, 3, 6, 9}));
  EXPECT_EQ(video->times, (std::vector<double>{0.05, 0.25}));
  const Expected<PictureSize> size = VideoFrameSize(4, 40, 60, config);
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(video->pixels.grid_thw,
            (std::array<int64_t, 3>{2, size->height / 16, size->width / 16}));
  EXPECT_EQ(video->tokens_per_frame, (size->height / 16) * (size->width / 16) / 4);
  // The second temporal patch's pair is frames 6 and 9, resized: its first patch's first
  // channel holds frame 6's then frame 9's top-left 16 x 16.
  const Planes f6 = ResizeBicubicAntialias(ToPlanes(frames[6]), size->height, size->width);
  const Planes f9 = ResizeBicubicAntialias(ToPlanes(frames[9]), size->height, size->width);
  const int64_t per_t = video->pixels.grid_thw[1] * video->pixels.grid_thw[2];
  const float* patch = video->pixels.values.data() + per_t * video->pixels.patch_dim;
  EXPECT_EQ(patch[0], (float(f6.at(0, 0, 0)) - 127.5f) / 127.5f);
  EXPECT_EQ(patch[256], (float(f9.at(0, 0, 0)) - 127.5f) / 127.5f);
  EXPECT_EQ(patch[256 + 17], (float(f9.at(0, 1, 1)) - 127.5f) / 127.5f);
  frames[4] = {61, 40, testing::Pattern(61, 40, 3)};
  EXPECT_FALSE(PreprocessVideo(frames, 30, config).ok());
}

TEST(Video, ReadsQwen3VlVideoConfig) {
  const std::string text = R"({
    "size": {"longest_edge": 25165824, "shortest_edge": 4096}, "patch_size": 16,
    "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5], "fps": 2, "min_frames": 4, "max_frames": 768,
    "do_sample_frames": true, "processor_class": "Qwen3VLProcessor",
    "video_processor_type": "Qwen3VLVideoProcessor"})";
  Expected<VideoProcessorConfig> c = ParseVideoProcessorConfig(text, "v.json");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->frames.max_pixels, 25165824);
  EXPECT_EQ(c->frames.min_pixels, 4096);
  EXPECT_EQ(c->fps, 2);
  EXPECT_EQ(c->max_frames, 768);
  // Defaults are Qwen3VLVideoProcessor's, not the picture processor's.
  Expected<VideoProcessorConfig> d = ParseVideoProcessorConfig("{}", "v.json");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->frames.patch_size, 16);
  EXPECT_EQ(d->frames.min_pixels, 131072);
  EXPECT_EQ(d->frames.image_mean[0], 0.5f);
  Expected<VideoProcessorConfig> bad = ParseVideoProcessorConfig(R"({"fps": 0})", "v.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "v.json: fps: expected a positive number, got 0");
  EXPECT_FALSE(ParseVideoProcessorConfig(R"({"min_frames": 9, "max_frames": 8})", "v.json").ok());
}

TEST(Video, ReadsBothConfigsFromAModelFolder) {
  const std::string dir = ::testing::TempDir() + "/gizllm_vl_model";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  EXPECT_EQ(ReadVideoProcessorConfig(dir).status().message(),
            dir + "/video_preprocessor_config.json: missing (a video model's folder has one)");
  std::ofstream(dir + "/preprocessor_config.json")
      << R"({"size": {"longest_edge": 16777216, "shortest_edge": 65536}, "patch_size": 16})";
  std::ofstream(dir + "/video_preprocessor_config.json")
      << R"({"size": {"longest_edge": 25165824, "shortest_edge": 4096}, "fps": 1.5})";
  Expected<ImageProcessorConfig> image = ReadImageProcessorConfig(dir);
  ASSERT_TRUE(image.ok()) << image.status().message();
  EXPECT_EQ(image->max_pixels, 16777216);
  Expected<VideoProcessorConfig> video = ReadVideoProcessorConfig(dir);
  ASSERT_TRUE(video.ok()) << video.status().message();
  EXPECT_EQ(video->frames.min_pixels, 4096);
  EXPECT_EQ(video->fps, 1.5);
  std::ofstream(dir + "/video_preprocessor_config.json") << R"({"max_frames": "many"})";
  EXPECT_EQ(ReadVideoProcessorConfig(dir).status().message(),
            dir +
                "/video_preprocessor_config.json: max_frames: expected a positive integer of "
                "at most 1048576, got \"many\"");
  std::filesystem::remove_all(dir);
}

TEST(Video, ReadsAFolderOfFramesInNameOrder) {
  const std::string dir = ::testing::TempDir() + "/gizllm_frames";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  for (int i : {2, 0, 1}) {
    const testing::Bytes png = testing::EncodePng(4, 3, testing::Pattern(4, 3, 3, i + 1), {});
    std::ofstream(dir + "/frame_" + std::to_string(i) + ".png", std::ios::binary)
        .write(reinterpret_cast<const char*>(png.data()), png.size());
  }
  Expected<std::vector<Picture>> frames = ReadFrameFolder(dir, 10);
  ASSERT_TRUE(frames.ok()) << frames.status().message();
  ASSERT_EQ(frames->size(), 3u);
  EXPECT_EQ((*frames)[1].rgb, testing::Pattern(4, 3, 3, 2));
  EXPECT_EQ(ReadFrameFolder(dir, 2).status().message(), dir + ": 3 frames, over the limit of 2");
  std::ofstream(dir + "/notes.txt") << "not a picture";
  EXPECT_EQ(ReadFrameFolder(dir, 10).status().message(),
            dir + "/notes.txt: not a PNG, JPEG or WebP picture (it starts with bytes 6e 6f 74 20)");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace gizllm::vision
