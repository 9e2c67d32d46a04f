// The image processor against transformers' (tools/make_picture_refs.py, run where
// transformers is; its output committed in tests/golden/pictures): each picture decoded here
// and preprocessed with the same config must give the processor's pixel_values and grid_thw,
// every float equal for PNG and lossless WebP, each 8-bit step within one for JPEG and lossy
// WebP. Pillow's RGB, where stored, is compared first, so a decoder difference is told apart
// from a resize one.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "vision/image_processor.h"
#include "vision/picture.h"
#include "vision/video.h"

namespace gizllm::vision {
namespace {

const std::string kRefs = GIZLLM_PICTURE_REFS;

std::vector<uint8_t> Bytes(const std::string& text) { return {text.begin(), text.end()}; }

std::vector<uint8_t> Inflate(const std::string& path, size_t size) {
  Expected<std::string> z = ReadFile(path);
  EXPECT_TRUE(z.ok()) << path;
  if (!z.ok()) return {};
  std::vector<uint8_t> out(size);
  uLongf n = size;
  const int rc = uncompress(out.data(), &n, reinterpret_cast<const Bytef*>(z->data()), z->size());
  EXPECT_EQ(rc, Z_OK) << path;
  EXPECT_EQ(n, size) << path;
  return out;
}

TEST(ProcessorGolden, MatchesTransformers) {
  const std::string cases_path = kRefs + "/cases.json";
  if (!std::filesystem::exists(cases_path)) {
    GTEST_SKIP() << kRefs << " is missing: make it with `python3 tools/make_picture_refs.py "
                 << "--out tests/golden/pictures` where transformers is";
  }
  Expected<std::string> text = ReadFile(cases_path);
  ASSERT_TRUE(text.ok());
  const nlohmann::json refs = nlohmann::json::parse(*text);
  Expected<ImageProcessorConfig> config =
      ParseImageProcessorConfig(refs["meta"]["config"].dump(), cases_path);
  ASSERT_TRUE(config.ok()) << config.status().message();
  ASSERT_EQ(config->image_mean, (std::array<float, 3>{0.5f, 0.5f, 0.5f}));  // what codes mean
  ASSERT_EQ(config->image_std, (std::array<float, 3>{0.5f, 0.5f, 0.5f}));
  ASSERT_GE(refs["cases"].size(), 9u);
  for (const nlohmann::json& c : refs["cases"]) {
    const std::string name = c["name"];
    SCOPED_TRACE(name + " (" + c["mode"].get<std::string>() + ")");
    const bool exact = c["compare"] == "exact";
    Expected<std::string> file = ReadFile(kRefs + "/" + c["file"].get<std::string>());
    ASSERT_TRUE(file.ok());
    Expected<Picture> picture = DecodePicture(Bytes(*file));
    ASSERT_TRUE(picture.ok()) << picture.status().message();
    ASSERT_EQ(picture->width, c["width"].get<int>());
    ASSERT_EQ(picture->height, c["height"].get<int>());
    if (!c["rgb"].is_null()) {
      const std::vector<uint8_t> rgb =
          Inflate(kRefs + "/" + c["rgb"].get<std::string>(), picture->rgb.size());
      size_t different = 0;
      int worst = 0;
      for (size_t i = 0; i < rgb.size(); ++i) {
        const int d = std::abs(int(rgb[i]) - int(picture->rgb[i]));
        different += d != 0;
        worst = std::max(worst, d);
      }
      EXPECT_LE(worst, exact ? 0 : 1) << different << " of " << rgb.size() << " samples differ";
    }

    Expected<PixelValues> values = PreprocessPicture(*picture, *config);
    ASSERT_TRUE(values.ok()) << values.status().message();
    const std::vector<int64_t> grid = c["grid_thw"];
    EXPECT_EQ(values->grid_thw, (std::array<int64_t, 3>{grid[0], grid[1], grid[2]}));
    ASSERT_EQ(values->patches, c["patches"].get<int64_t>());
    ASSERT_EQ(values->patch_dim, c["patch_dim"].get<int64_t>());
    const std::vector<uint8_t> codes =
        Inflate(kRefs + "/" + name + ".codes.zlib", size_t(values->patches * values->patch_dim));
    ASSERT_EQ(codes.size(), values->values.size());
    size_t different = 0, first = codes.size();
    int worst = 0;
    for (size_t i = 0; i < codes.size(); ++i) {
      // transformers' float32 value of this element, exactly.
      const float want = (static_cast<float>(codes[i]) - 127.5f) / 127.5f;
      const float got = values->values[i];
      if (got == want) continue;
      const int step = static_cast<int>(std::lround(std::abs(got - want) * 127.5f));
      worst = std::max(worst, std::max(step, 1));
      if (first == codes.size()) first = i;
      ++different;
    }
    if (exact) {
      EXPECT_EQ(different, 0u) << "first at patch " << first / values->patch_dim << " element "
                               << first % values->patch_dim << ", worst " << worst << " steps";
    } else {
      EXPECT_LE(worst, 1) << different << " of " << codes.size() << " differ";
    }
  }
}

// cases.json's "video": sample_frames' indices, the timestamps and their text, and the
// patches of five frames given as one video.
TEST(ProcessorGolden, VideoMatchesTransformers) {
  const std::string cases_path = kRefs + "/cases.json";
  if (!std::filesystem::exists(cases_path)) {
    GTEST_SKIP() << kRefs << " is missing: make it with `python3 tools/make_picture_refs.py "
                 << "--out tests/golden/pictures` where transformers is";
  }
  Expected<std::string> text = ReadFile(cases_path);
  ASSERT_TRUE(text.ok());
  const nlohmann::json refs = nlohmann::json::parse(*text);
  ASSERT_TRUE(refs.contains("video"));
  const nlohmann::json& video = refs["video"];
  for (const char* part : {"sampling", "timestamps", "frames"}) {
    EXPECT_FALSE(video[part].contains("error")) << "tools/make_picture_refs.py could not make the "
                                                << part << " reference: " << video[part]["error"];
  }

  if (!video["sampling"].contains("error")) {
    VideoProcessorConfig config;
    config.fps = video["sampling"]["config"]["fps"];
    config.min_frames = video["sampling"]["config"]["min_frames"];
    config.max_frames = video["sampling"]["config"]["max_frames"];
    for (const nlohmann::json& c : video["sampling"]["cases"]) {
      std::optional<double> fps;
      if (!c["fps"].is_null()) fps = c["fps"].get<double>();
      Expected<std::vector<int64_t>> got = SampleFrameIndices(c["total"], fps, config);
      ASSERT_TRUE(got.ok()) << got.status().message();
      EXPECT_EQ(*got, c["indices"].get<std::vector<int64_t>>()) << "total " << c["total"];
    }
  }
  if (!video["timestamps"].contains("error")) {
    for (const nlohmann::json& c : video["timestamps"]["cases"]) {
      const std::vector<double> times =
          TemporalPatchTimes(c["indices"].get<std::vector<int64_t>>(), c["fps"], 2);
      EXPECT_EQ(times, c["times"].get<std::vector<double>>());
      std::vector<std::string> texts;
      for (double t : times) texts.push_back(TimestampText(t));
      EXPECT_EQ(texts, c["texts"].get<std::vector<std::string>>());
    }
  }
  if (!video["frames"].contains("error")) {
    const nlohmann::json& f = video["frames"];
    Expected<VideoProcessorConfig> config =
        ParseVideoProcessorConfig(f["config"].dump(), cases_path + " (video)");
    ASSERT_TRUE(config.ok()) << config.status().message();
    std::vector<Picture> frames;
    for (const std::string file : f["files"]) {
      Expected<std::string> bytes = ReadFile(kRefs + "/" + file);
      ASSERT_TRUE(bytes.ok());
      Expected<Picture> picture = DecodePicture(Bytes(*bytes));
      ASSERT_TRUE(picture.ok()) << picture.status().message();
      frames.push_back(std::move(picture).value());
    }
    Expected<PreparedVideo> got = PreprocessVideo(frames, std::nullopt, *config);
    ASSERT_TRUE(got.ok()) << got.status().message();
    const std::vector<int64_t> grid = f["grid_thw"];
    EXPECT_EQ(got->pixels.grid_thw, (std::array<int64_t, 3>{grid[0], grid[1], grid[2]}));
    ASSERT_EQ(got->pixels.patches, f["patches"].get<int64_t>());
    ASSERT_EQ(got->pixels.patch_dim, f["patch_dim"].get<int64_t>());
    const std::vector<uint8_t> codes =
        Inflate(kRefs + "/video.codes.zlib", got->pixels.values.size());
    size_t different = 0;
    for (size_t i = 0; i < codes.size(); ++i) {
      different += got->pixels.values[i] != (static_cast<float>(codes[i]) - 127.5f) / 127.5f;
    }
    EXPECT_EQ(different, 0u);
  }
}

}  // namespace
}  // namespace gizllm::vision
