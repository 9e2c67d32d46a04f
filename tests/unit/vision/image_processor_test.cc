// The Qwen-VL image processor: smart_resize's arithmetic, the patch order, the float32
// normalize, the temporal pair, and preprocessor_config.json's fields and errors.
#include "vision/image_processor.h"

#include <gtest/gtest.h>

#include "picture_encoders.h"

namespace gizllm::vision {
namespace {

PictureSize Resized(int h, int w, int factor, int64_t min_pixels, int64_t max_pixels) {
  Expected<PictureSize> s = SmartResize(h, w, factor, min_pixels, max_pixels);
  EXPECT_TRUE(s.ok()) << s.status().message();
  return s.ok() ? *s : PictureSize{};
}

// Values worked out with smart_resize of transformers' image_processing_qwen2_vl.py.
TEST(ImageProcessor, SmartResizeAsTransformers) {
  EXPECT_EQ(Resized(45, 67, 32, 4096, 8192), (PictureSize{64, 96}));       // grows to min_pixels
  EXPECT_EQ(Resized(200, 300, 32, 4096, 8192), (PictureSize{64, 96}));     // shrinks, floored
  EXPECT_EQ(Resized(517, 33, 32, 4096, 8192), (PictureSize{352, 32}));     // a side floored to 0
  EXPECT_EQ(Resized(80, 112, 32, 0, 1000000000), (PictureSize{64, 128}));  // 2.5 -> 2, 3.5 -> 4
  EXPECT_EQ(Resized(1080, 1920, 32, 65536, 16777216), (PictureSize{1088, 1920}));
  EXPECT_EQ(Resized(1024, 1024, 32, 65536, 16777216), (PictureSize{1024, 1024}));
  EXPECT_EQ(Resized(10, 10, 32, 65536, 16777216), (PictureSize{256, 256}));
  EXPECT_EQ(Resized(4000, 3000, 32, 65536, 16777216), (PictureSize{4000, 3008}));
  EXPECT_EQ(Resized(28, 28, 28, 3136, 1003520), (PictureSize{56, 56}));
  EXPECT_EQ(Resized(1, 200, 32, 1, 1000000000), (PictureSize{32, 32}));
  Expected<PictureSize> wide = SmartResize(1, 201, 32, 1, 1000000000);
  ASSERT_FALSE(wide.ok());
  EXPECT_EQ(wide.status().message(),
            "picture of 1x201 (height x width) has an aspect ratio of 201.0, over 200");
  EXPECT_FALSE(SmartResize(5, 5, 32, 0, 1000).ok());  // rounds to 0 with nothing to grow to
}

// Planes whose every sample says where it is.
Planes Numbered(int height, int width, int seed) {
  Planes p{3, height, width, std::vector<uint8_t>(size_t(3) * height * width)};
  for (size_t i = 0; i < p.data.size(); ++i) p.data[i] = uint8_t(i * 7 + seed * 101);
  return p;
}

ImageProcessorConfig Raw(int patch, int merge, int temporal) {
  ImageProcessorConfig c;
  c.patch_size = patch;
  c.merge_size = merge;
  c.temporal_patch_size = temporal;
  c.do_rescale = false;
  c.do_normalize = false;
  return c;
}

TEST(ImageProcessor, PatchesInTheProcessorsOrder) {
  // 4 x 6 patches of 2 x 2 pixels, three frames (the last repeated to fill the second pair).
  const int p = 2, m = 2, t = 2, h = 4 * p, w = 6 * p;
  const std::vector<Planes> frames = {Numbered(h, w, 1), Numbered(h, w, 2), Numbered(h, w, 3)};
  Expected<PixelValues> got = Patchify(frames, Raw(p, m, t));
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(got->grid_thw, (std::array<int64_t, 3>{2, 4, 6}));  // 3 frames padded to 4
  EXPECT_EQ(got->patches, 2 * 4 * 6);
  EXPECT_EQ(got->patch_dim, 3 * t * p * p);
  // The processor views [T', t, C, H/p/m, m, p, W/p/m, m, p], permutes to
  // [T', H/p/m, W/p/m, m, m, C, t, p, p] and flattens: decompose each index that way.
  for (int64_t row = 0; row < got->patches; ++row) {
    int64_t r = row;
    const int mw = r % m;
    r /= m;
    const int mh = r % m;
    r /= m;
    const int bw = r % (w / p / m);
    r /= w / p / m;
    const int bh = r % (h / p / m);
    r /= h / p / m;
    const int gt = static_cast<int>(r);
    for (int64_t col = 0; col < got->patch_dim; ++col) {
      int64_t k = col;
      const int px = k % p;
      k /= p;
      const int py = k % p;
      k /= p;
      const int tp = k % t;
      k /= t;
      const int c = static_cast<int>(k);
      const int frame = std::min(gt * t + tp, 2);
      const uint8_t want = frames[frame].at(c, (bh * m + mh) * p + py, (bw * m + mw) * p + px);
      ASSERT_EQ(got->values[row * got->patch_dim + col], float(want))
          << "patch " << row << " element " << col;
    }
  }
  // A single picture fills the temporal pair with itself.
  Expected<PixelValues> one = Patchify({frames[0]}, Raw(p, m, t));
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->grid_thw[0], 1);
  for (int64_t row = 0; row < one->patches; ++row) {
    const float* v = one->values.data() + row * one->patch_dim;
    for (int c = 0; c < 3; ++c) {
      for (int i = 0; i < p * p; ++i)
        ASSERT_EQ(v[(c * t + 0) * p * p + i], v[(c * t + 1) * p * p + i]);
    }
  }
  EXPECT_FALSE(Patchify({Numbered(h + 1, w, 1)}, Raw(p, m, t)).ok());
}

TEST(ImageProcessor, NormalizesAsTheFusedFloat32Step) {
  ImageProcessorConfig c;
  c.patch_size = 1;
  c.merge_size = 1;
  c.temporal_patch_size = 1;
  c.image_mean = {0.5f, 0.5f, 0.5f};
  c.image_std = {0.5f, 0.5f, 0.5f};
  Planes one{3, 1, 3, {0, 128, 255, 1, 2, 3, 254, 127, 64}};
  Expected<PixelValues> v = Patchify({one}, c);
  ASSERT_TRUE(v.ok());
  ASSERT_EQ(v->values.size(), 9u);
  // Pixel 0 is (0, 1, 254): (x - 127.5f) / 127.5f in float32.
  EXPECT_EQ(v->values[0], -1.0f);
  EXPECT_EQ(v->values[1], (1.0f - 127.5f) / 127.5f);
  EXPECT_EQ(v->values[2], (254.0f - 127.5f) / 127.5f);
  EXPECT_EQ(v->values[7], (3.0f - 127.5f) / 127.5f);  // pixel 2, blue
  // CLIP's mean and std: scaled by 255 in float32 first, then (x - mean') / std'.
  ImageProcessorConfig clip = c;
  clip.image_mean = ImageProcessorConfig{}.image_mean;
  clip.image_std = ImageProcessorConfig{}.image_std;
  Expected<PixelValues> w = Patchify({one}, clip);
  ASSERT_TRUE(w.ok());
  const float mean_g = 0.4578275f * 255.0f, std_g = 0.26130258f * 255.0f;
  EXPECT_EQ(w->values[1], (1.0f - mean_g) / std_g);
}

TEST(ImageProcessor, ReadsQwen3VlConfig) {
  const std::string qwen3_vl = R"({
    "size": {"longest_edge": 16777216, "shortest_edge": 65536},
    "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
    "processor_class": "Qwen3VLProcessor", "image_processor_type": "Qwen2VLImageProcessorFast"})";
  Expected<ImageProcessorConfig> c = ParseImageProcessorConfig(qwen3_vl, "p.json");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->patch_size, 16);
  EXPECT_EQ(c->factor(), 32);
  EXPECT_EQ(c->min_pixels, 65536);
  EXPECT_EQ(c->max_pixels, 16777216);
  EXPECT_EQ(c->image_mean[1], 0.5f);
  // min_pixels and max_pixels override size (Qwen2-VL's older files).
  Expected<ImageProcessorConfig> old = ParseImageProcessorConfig(
      R"({"min_pixels": 3136, "max_pixels": 12845056, "image_std": 0.25})", "p.json");
  ASSERT_TRUE(old.ok());
  EXPECT_EQ(old->min_pixels, 3136);
  EXPECT_EQ(old->max_pixels, 12845056);
  EXPECT_EQ(old->patch_size, 14);
  EXPECT_EQ(old->image_std[2], 0.25f);
}

std::string ConfigError(const std::string& text) {
  Expected<ImageProcessorConfig> c = ParseImageProcessorConfig(text, "p.json");
  EXPECT_FALSE(c.ok());
  return c.ok() ? "" : c.status().message();
}

TEST(ImageProcessor, ConfigErrorsNameTheField) {
  EXPECT_EQ(ConfigError(R"({"patch_size": "16"})"),
            "p.json: patch_size: expected a positive integer of at most 4096, got \"16\"");
  EXPECT_EQ(ConfigError(R"({"size": {"shortest_edge": 10}})"),
            "p.json: size: expected an object with shortest_edge and longest_edge, got "
            "{\"shortest_edge\":10}");
  EXPECT_EQ(ConfigError(R"({"size": {"shortest_edge": 10, "longest_edge": -1}})"),
            "p.json: size.longest_edge: expected a positive integer of at most 4294967296, got -1");
  EXPECT_EQ(ConfigError(R"({"image_mean": [0.5, 0.5]})"),
            "p.json: image_mean: expected 3 numbers (R, G, B), got [0.5,0.5]");
  EXPECT_EQ(ConfigError(R"({"resample": 2})"),
            "p.json: resample: only 3 (bicubic) is supported, got 2");
  EXPECT_EQ(ConfigError(R"({"min_pixels": 100, "max_pixels": 10})"),
            "p.json: image processor: pixels must satisfy 0 <= min_pixels (100) <= max_pixels "
            "(10) <= 4294967296");
  EXPECT_EQ(ConfigError("[1]"), "p.json: expected a JSON object");
  EXPECT_EQ(ConfigError("{"), "p.json: not valid JSON");
  Expected<ImageProcessorConfig> missing = ReadImageProcessorConfig("/nonexistent");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().message(),
            "/nonexistent/preprocessor_config.json: missing (a vision model's folder has one)");
}

TEST(ImageProcessor, PreprocessesAPicture) {
  ImageProcessorConfig c;
  c.patch_size = 16;
  c.min_pixels = 4096;
  c.max_pixels = 8192;
  Picture picture{67, 45, testing::Pattern(67, 45, 3)};
  Expected<PixelValues> v = PreprocessPicture(picture, c);
  ASSERT_TRUE(v.ok()) << v.status().message();
  EXPECT_EQ(v->grid_thw, (std::array<int64_t, 3>{1, 4, 6}));  // 64 x 96
  EXPECT_EQ(v->values.size(), size_t(24 * 3 * 2 * 16 * 16));
}

}  // namespace
}  // namespace gizllm::vision
