// PictureReader on a small random Qwen3-VL with its tower (CPU backend, float32 activations):
// a prompt's placeholders expanded as transformers' Qwen3VLProcessor expands them (t * h * w /
// merge^2 per picture), its M-RoPE positions, and the tower's rows of each picture (run alone)
// in prompt order; and the errors a user can cause: a bad picture named by its number,
// placeholders and pictures that do not pair up, a model without a tower, a processor that is
// not the tower's.
#include "model/picture_prompt.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ops/device.h"
#include "tests/unit/model/tiny_vl.h"
#include "tests/unit/vision/picture_encoders.h"

namespace gizllm {
namespace {

namespace fs = std::filesystem;
using tiny_vl::kEnd;
using tiny_vl::kImage;
using tiny_vl::kStart;
using vision::testing::Bytes;

std::shared_ptr<Backend> Cpu() {
  auto be = OpenBackend(DeviceOptions{.device = "cpu", .threads = 2, .exact = true});
  EXPECT_TRUE(be.ok()) << be.status().message();
  return std::move(be).value();
}

// A PNG of width x height pixels (fresh values).
Bytes Png(int width, int height, int seed) {
  return vision::testing::EncodePng(width, height, vision::testing::Pattern(width, height, 3, seed),
                                    {});
}

class PicturePromptTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::path(::testing::TempDir()) / ("picture_prompt_" + std::to_string(::getpid())))
               .string();
    tiny_vl::Write(dir_, /*tower=*/true);
    auto reader = PictureReader::Load(dir_, Cpu());
    ASSERT_TRUE(reader.ok()) << reader.status().message();
    reader_ = std::move(*reader);
  }

  // tiny_vl::Prompt() as the chat template writes it: one placeholder per picture.
  static std::vector<int32_t> Template() {
    return {1, 2, kStart, kImage, kEnd, 7, kStart, kImage, kEnd, 9, 10};
  }

  std::string dir_;
  std::unique_ptr<PictureReader> reader_;
};

TEST_F(PicturePromptTest, ExpandsEachPlaceholderToThePicturesRows) {
  // 12 x 8 pixels: a grid of [1, 4, 6] patches, 2 x 3 merged rows; 8 x 4: [1, 2, 4], 1 x 2.
  const std::vector<Bytes> pictures = {Png(12, 8, 1), Png(8, 4, 2)};
  auto out = reader_->Expand(Template(), pictures);
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ(out->tokens, tiny_vl::Prompt());
  const PromptPictures& p = out->pictures;
  auto positions = ComputeMropePositions(tiny_vl::Vision(), tiny_vl::Prompt(), tiny_vl::Grids());
  ASSERT_TRUE(positions.ok());
  EXPECT_EQ(p.positions.t, positions->t);
  EXPECT_EQ(p.positions.h, positions->h);
  EXPECT_EQ(p.positions.w, positions->w);
  EXPECT_EQ(p.positions.next, positions->next);
  EXPECT_EQ(p.rows, (std::vector<int32_t>{3, 4, 5, 6, 7, 8, 12, 13}));
  ASSERT_EQ(p.layers, 1);
  ASSERT_EQ(p.embeddings.size(), 8u * tiny_vl::kDim);
  ASSERT_EQ(p.deepstack.size(), 8u * tiny_vl::kDim);

  // Each picture alone through the reader gives its rows of the pair, in prompt order.
  const std::vector<int32_t> one = {kStart, kImage, kEnd};
  int64_t row = 0;
  for (const Bytes& picture : pictures) {
    auto alone = reader_->Expand(one, std::vector<Bytes>{picture});
    ASSERT_TRUE(alone.ok()) << alone.status().message();
    const int64_t n = static_cast<int64_t>(alone->pictures.rows.size());
    for (int64_t i = 0; i < n * tiny_vl::kDim; ++i) {
      ASSERT_NEAR(alone->pictures.embeddings[i], p.embeddings[row * tiny_vl::kDim + i], 1e-5f);
      ASSERT_NEAR(alone->pictures.deepstack[i], p.deepstack[row * tiny_vl::kDim + i], 1e-5f);
    }
    row += n;
  }
  EXPECT_EQ(row, 8);
  // Another picture of the same size: the same tokens, other rows.
  auto other = reader_->Expand(Template(), std::vector<Bytes>{Png(12, 8, 3), Png(8, 4, 2)});
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->tokens, out->tokens);
  EXPECT_NE(other->pictures.embeddings, p.embeddings);
}

TEST_F(PicturePromptTest, ALargerPictureIsResizedAsTheProcessorSays) {
  // 30 x 17 pixels: smart_resize rounds each side (half to even) to a multiple of patch x
  // merge = 4: 32 x 16, a grid of [1, 8, 16] patches, 4 x 8 merged rows.
  auto out = reader_->Expand(std::vector<int32_t>{kStart, kImage, kEnd},
                             std::vector<Bytes>{Png(30, 17, 4)});
  ASSERT_TRUE(out.ok()) << out.status().message();
  auto size = vision::SmartResize(17, 30, 4, 16, 4096);
  ASSERT_TRUE(size.ok());
  ASSERT_EQ(size->height, 16);
  ASSERT_EQ(size->width, 32);
  EXPECT_EQ(static_cast<int64_t>(out->tokens.size()), 4 * 8 + 2);
  // The picture from position 1, its last column at 1 + 7, the end token after it.
  EXPECT_EQ(out->pictures.positions.next, 10);
}

TEST_F(PicturePromptTest, BadPicturesAreNamedByTheirNumber) {
  Bytes cut = Png(12, 8, 2);
  cut.resize(cut.size() / 2);
  auto out = reader_->Expand(Template(), std::vector<Bytes>{Png(12, 8, 1), cut});
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().message(), "picture 2: PNG truncated");
  out = reader_->Expand(Template(), std::vector<Bytes>{Bytes{'G', 'I', 'F', '8'}, Png(8, 4, 2)});
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().message().rfind("picture 1: ", 0), 0u) << out.status().message();
}

TEST_F(PicturePromptTest, PlaceholdersAndPicturesMustPairUp) {
  auto out = reader_->Expand(Template(), std::vector<Bytes>{Png(12, 8, 1)});
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("holds 2 image placeholders"), std::string::npos)
      << out.status().message();
  EXPECT_NE(out.status().message().find("1 pictures and 0 videos are given"), std::string::npos);
  out = reader_->Expand(std::vector<int32_t>{1, 2, 3},
                        std::vector<Bytes>{Png(12, 8, 1), Png(8, 4, 2)});
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("holds 0 image placeholders"), std::string::npos);
  // No pictures, no placeholders: the prompt as it was, text positions.
  out = reader_->Expand(std::vector<int32_t>{1, 2, 3}, std::vector<Bytes>{});
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ(out->tokens, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(out->pictures.positions.next, 3);
}

// Five 8 x 8 frames taken at 1 frame a second: the tiny processor (2 frames sampled a second,
// at least 4, at most all) keeps all five, pads them to three pairs, and resizes nothing (4 x 8
// x 8 pixels lie within its bounds): a grid of [3, 4, 4], 4 rows a pair. Qwen3VLProcessor writes
// each pair as "<t seconds>" (the mean of its first and last frame's times: 0.5, 2.5, 4.0)
// then <|vision_start|>, its rows, <|vision_end|>; get_rope_index places each pair as a picture
// of one frame, the timestamps' tokens counting as text.
TEST_F(PicturePromptTest, AVideoBecomesTimestampedPairsOfFrames) {
  std::vector<vision::Picture> frames;
  for (int i = 0; i < 5; ++i) {
    vision::Picture f{8, 8, vision::testing::Pattern(8, 8, 3, 20 + i)};
    frames.push_back(f);
  }
  ASSERT_TRUE(reader_->reads_videos());
  auto video = reader_->PrepareVideo(frames, /*fps=*/1.0);
  ASSERT_TRUE(video.ok()) << video.status().message();
  EXPECT_TRUE(video->grid.video);
  EXPECT_EQ(video->grid.t, 3);
  EXPECT_EQ(video->grid.h, 4);
  EXPECT_EQ(video->grid.w, 4);
  EXPECT_EQ(video->times, (std::vector<double>{0.5, 2.5, 4.0}));
  auto chars = [](const std::string& text) -> Expected<std::vector<int32_t>> {
    std::vector<int32_t> ids;
    tiny_vl::Append(&ids, text);
    return ids;
  };
  const std::vector<int32_t> prompt = {1, kStart, tiny_vl::kVideo, kEnd, 9};
  auto placed = reader_->Place(prompt, {*video}, chars);
  ASSERT_TRUE(placed.ok()) << placed.status().message();
  std::vector<int32_t> expected = {1};
  std::vector<int32_t> t = {0}, h = {0}, w = {0};
  int32_t next = 1;
  for (const char* time : {"<0.5 seconds>", "<2.5 seconds>", "<4.0 seconds>"}) {
    const size_t before = expected.size();
    tiny_vl::Append(&expected, time);
    expected.push_back(kStart);
    for (size_t i = before; i < expected.size(); ++i, ++next) {
      t.push_back(next);
      h.push_back(next);
      w.push_back(next);
    }
    for (int y = 0; y < 2; ++y) {
      for (int x = 0; x < 2; ++x) {
        expected.push_back(tiny_vl::kVideo);
        t.push_back(next);
        h.push_back(next + y);
        w.push_back(next + x);
      }
    }
    next += 2;
    expected.push_back(kEnd);
    t.push_back(next);
    h.push_back(next);
    w.push_back(next);
    ++next;
  }
  expected.push_back(9);
  t.push_back(next);
  h.push_back(next);
  w.push_back(next);
  EXPECT_EQ(placed->tokens, expected);
  EXPECT_EQ(placed->positions.t, t);
  EXPECT_EQ(placed->positions.h, h);
  EXPECT_EQ(placed->positions.w, w);
  EXPECT_EQ(placed->positions.next, next + 1);
  // The text after the video moves by what it added; the text before it stays.
  EXPECT_EQ(placed->ExpandedPosition(1), 1);
  EXPECT_EQ(placed->ExpandedPosition(4), static_cast<int32_t>(expected.size()) - 1);
  auto read = reader_->Read(*placed);
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_EQ(read->pictures.rows.size(), 12u);
  EXPECT_EQ(read->pictures.embeddings.size(), 12u * tiny_vl::kDim);

  // A picture where the video's placeholder stands, and no tokenizer for the timestamps.
  auto picture = reader_->PreparePicture(Png(8, 4, 2));
  ASSERT_TRUE(picture.ok());
  auto wrong = reader_->Place(prompt, {*picture}, chars);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("0 image placeholders"), std::string::npos)
      << wrong.status().message();
  auto untokenized = reader_->Place(prompt, {*video});
  ASSERT_FALSE(untokenized.ok());
  EXPECT_NE(untokenized.status().message().find("no tokenizer"), std::string::npos);
  // Frames of two sizes.
  frames[3] = vision::Picture{12, 8, vision::testing::Pattern(12, 8, 3, 9)};
  auto mixed = reader_->PrepareVideo(frames, 1.0);
  ASSERT_FALSE(mixed.ok());
  EXPECT_NE(mixed.status().message().find("differ in size"), std::string::npos);
}

TEST_F(PicturePromptTest, AModelWithoutATowerIsRefused) {
  nlohmann::json config = nlohmann::json::parse(std::ifstream(dir_ + "/config.json"));
  config.erase("vision_config");
  std::ofstream(dir_ + "/config.json") << config.dump();
  auto reader = PictureReader::Load(dir_, Cpu());
  ASSERT_FALSE(reader.ok());
  EXPECT_NE(reader.status().message().find("no vision tower"), std::string::npos)
      << reader.status().message();
}

TEST_F(PicturePromptTest, TheProcessorMustBeTheTowers) {
  std::ofstream(dir_ + "/preprocessor_config.json") << R"({"patch_size": 14, "merge_size": 2})";
  auto reader = PictureReader::Load(dir_, Cpu());
  ASSERT_FALSE(reader.ok());
  EXPECT_NE(reader.status().message().find("patch_size: 14 is not the tower's"), std::string::npos)
      << reader.status().message();
  fs::remove(dir_ + "/preprocessor_config.json");
  reader = PictureReader::Load(dir_, Cpu());
  ASSERT_FALSE(reader.ok());
  EXPECT_NE(reader.status().message().find("preprocessor_config.json"), std::string::npos)
      << reader.status().message();
}

}  // namespace
}  // namespace gizllm
