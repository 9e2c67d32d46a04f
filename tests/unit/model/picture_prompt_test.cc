// PictureReader on a small random Qwen3-VL with its tower (CPU backend, float32 activations):
// a prompt's placeholders expanded as transformers' Qwen3VLProcessor expands them (t * h * w /
// merge^2 per picture), its M-RoPE positions, and the tower's rows of each picture (run alone)
// in prompt order; a video's timestamps written into the text and tokenized with it, as the
// processor's whole-text tokenization does; and the errors a user can cause: a bad picture named by
// its number, placeholders and pictures that do not pair up, a model without a tower, a processor
// that is not the tower's.
#include "model/picture_prompt.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ops/device.h"
#include "template/chat_template.h"
#include "tests/unit/model/tiny_vl.h"
#include "tests/unit/vision/picture_encoders.h"
#include "tokenizer/tokenizer.h"

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
    // The character tokenizer, and ":" and "<" merged (as a byte-level BPE may merge the end
    // of a text with the timestamp after it).
    tiny_vl::WriteTokenizer(dir_, {": <"});
    auto tokenizer = Tokenizer::Load(dir_);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().message();
    tokenizer_ = std::move(*tokenizer);
    auto reader = PictureReader::Load(dir_, Cpu());
    ASSERT_TRUE(reader.ok()) << reader.status().message();
    reader_ = std::move(*reader);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // tiny_vl::Prompt() as the chat template writes it: one placeholder per picture.
  static std::vector<int32_t> Template() {
    return {1, 2, kStart, kImage, kEnd, 7, kStart, kImage, kEnd, 9, 10};
  }

  // `text` as a prompt whose messages end at byte offsets `ends`.
  ChatPrompt Text(const std::string& text, std::vector<long> ends = {}) const {
    ChatPrompt p;
    p.text = text;
    p.tokens = tokenizer_.Encode(text).value();
    p.message_offsets = std::move(ends);
    return p;
  }

  // Five 8 x 8 frames taken at 1 frame a second, preprocessed: a grid of [3, 4, 4].
  VisionInput Video() const {
    std::vector<vision::Picture> frames;
    for (int i = 0; i < 5; ++i) {
      frames.push_back(vision::Picture{8, 8, vision::testing::Pattern(8, 8, 3, 20 + i)});
    }
    auto video = reader_->PrepareVideo(frames, /*fps=*/1.0);
    EXPECT_TRUE(video.ok()) << video.status().message();
    return std::move(video).value();
  }

  std::string dir_;
  Tokenizer tokenizer_;
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
  EXPECT_NE(out.status().message().find("1 pictures and 0 videos of 0 temporal patches are given"),
            std::string::npos);
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
  // b<|vision_start|><|video_pad|><|vision_end|>j: its messages end after b and before j.
  const ChatPrompt prompt = Text("b<|vision_start|><|video_pad|><|vision_end|>j", {1, 44});
  ASSERT_EQ(prompt.tokens, (std::vector<int32_t>{1, kStart, tiny_vl::kVideo, kEnd, 9}));
  auto written = reader_->WriteVideos(tokenizer_, prompt, {*video});
  ASSERT_TRUE(written.ok()) << written.status().message();
  // The template's own vision start and end stay around the frames, as the processor leaves
  // them.
  EXPECT_EQ(written->text,
            "b<|vision_start|><0.5 seconds><|vision_start|><|video_pad|><|vision_end|>"
            "<2.5 seconds><|vision_start|><|video_pad|><|vision_end|><4.0 seconds>"
            "<|vision_start|><|video_pad|><|vision_end|><|vision_end|>j");
  auto placed = reader_->Place(written->tokens, {*video});
  ASSERT_TRUE(placed.ok()) << placed.status().message();
  std::vector<int32_t> expected = {1, kStart};
  std::vector<int32_t> t = {0, 1}, h = {0, 1}, w = {0, 1};
  int32_t next = 2;
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
  expected.push_back(kEnd);
  t.push_back(next);
  h.push_back(next);
  w.push_back(next);
  ++next;
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
  ASSERT_EQ(written->message_ends.size(), 2u);
  EXPECT_EQ(placed->ExpandedPosition(written->message_ends[0]), 1);
  EXPECT_EQ(placed->ExpandedPosition(written->mark), static_cast<int32_t>(expected.size()) - 1);
  auto read = reader_->Read(*placed);
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_EQ(read->pictures.rows.size(), 12u);
  EXPECT_EQ(read->pictures.embeddings.size(), 12u * tiny_vl::kDim);

  // A picture where the video's placeholder stands; the video's placeholder not written out
  // (one for three temporal patches); two videos for one placeholder.
  auto picture = reader_->PreparePicture(Png(8, 4, 2));
  ASSERT_TRUE(picture.ok());
  auto wrong = reader_->Place(prompt.tokens, {*picture});
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("0 image placeholders"), std::string::npos)
      << wrong.status().message();
  auto unwritten = reader_->Place(prompt.tokens, {*video});
  ASSERT_FALSE(unwritten.ok());
  EXPECT_NE(unwritten.status().message().find("1 video placeholders"), std::string::npos)
      << unwritten.status().message();
  EXPECT_NE(unwritten.status().message().find("1 videos of 3 temporal patches"), std::string::npos)
      << unwritten.status().message();
  auto two = reader_->WriteVideos(tokenizer_, prompt, {*video, *video});
  ASSERT_FALSE(two.ok());
  EXPECT_NE(two.status().message().find("holds 1 video placeholders"), std::string::npos)
      << two.status().message();
  // Frames of two sizes.
  frames[3] = vision::Picture{12, 8, vision::testing::Pattern(12, 8, 3, 9)};
  auto mixed = reader_->PrepareVideo(frames, 1.0);
  ASSERT_FALSE(mixed.ok());
  EXPECT_NE(mixed.status().message().find("differ in size"), std::string::npos);
}

// Text right before a video in its message ("look:" then the video): Qwen3VLProcessor writes
// the timestamps into the text inside the template's own <|vision_start|> ... <|vision_end|>
// and tokenizes it whole. The placed prompt's tokens are the whole text's, the video
// placeholder repeated to each frame's rows; the chat's mark moves with the text.
TEST_F(PicturePromptTest, TextBeforeAVideoTokenizesWithItsTimestamps) {
  auto chat_template = ChatTemplate::Load(dir_);
  ASSERT_TRUE(chat_template.ok()) << chat_template.status().message();
  nlohmann::ordered_json input = {{"messages",
                                   {{{"role", "user"},
                                     {"content",
                                      {{{"type", "text"}, {"text", "look:"}},
                                       {{"type", "video"}},
                                       {{"type", "text"}, {"text", "what is it?"}}}}}}},
                                  {"add_generation_prompt", true}};
  auto chat = ChatPrompt::Render(*chat_template, tokenizer_, input);
  ASSERT_TRUE(chat.ok()) << chat.status().message();
  const VisionInput video = Video();
  auto written = reader_->WriteVideos(tokenizer_, *chat, {video});
  ASSERT_TRUE(written.ok()) << written.status().message();
  auto placed = reader_->Place(written->tokens, {video});
  ASSERT_TRUE(placed.ok()) << placed.status().message();

  // The processor's text: each pair's timestamp, then its 2 x 2 rows between vision start
  // and end, tokenized whole.
  std::string frames;
  for (const char* time : {"<0.5 seconds>", "<2.5 seconds>", "<4.0 seconds>"}) {
    frames += std::string(time) + "<|vision_start|>";
    for (int i = 0; i < 4; ++i) frames += "<|video_pad|>";
    frames += "<|vision_end|>";
  }
  frames = "<|vision_start|>" + frames + "<|vision_end|>";
  const std::string head = "<|im_start|>user\nlook:" + frames + "what is it?<|im_end|>\n";
  const std::string text = head + "<|im_start|>assistant\n";
  auto expected = tokenizer_.Encode(text);
  ASSERT_TRUE(expected.ok());
  EXPECT_EQ(placed->tokens, *expected);
  // Where the messages end: the whole text's tokens of its messages.
  EXPECT_EQ(placed->ExpandedPosition(written->mark),
            static_cast<int32_t>(tokenizer_.Encode(head).value().size()));
  EXPECT_EQ(placed->positions.t.size(), expected->size());

  // The same with a newline after the text.
  input["messages"][0]["content"][0]["text"] = "look:\n";
  chat = ChatPrompt::Render(*chat_template, tokenizer_, input);
  ASSERT_TRUE(chat.ok());
  written = reader_->WriteVideos(tokenizer_, *chat, {video});
  ASSERT_TRUE(written.ok());
  placed = reader_->Place(written->tokens, {video});
  ASSERT_TRUE(placed.ok());
  EXPECT_EQ(placed->tokens, tokenizer_
                                .Encode("<|im_start|>user\nlook:\n" + frames +
                                        "what is it?<|im_end|>\n<|im_start|>assistant\n")
                                .value());
}

// A bare <|video_pad|> (a prompt written without the template) becomes the frames' text too.
TEST_F(PicturePromptTest, ABareVideoPlaceholderIsWrittenOut) {
  const VisionInput video = Video();
  auto written = reader_->WriteVideos(tokenizer_, Text("ab<|video_pad|>c"), {video});
  ASSERT_TRUE(written.ok()) << written.status().message();
  EXPECT_EQ(written->text,
            "ab<0.5 seconds><|vision_start|><|video_pad|><|vision_end|><2.5 seconds>"
            "<|vision_start|><|video_pad|><|vision_end|><4.0 seconds><|vision_start|>"
            "<|video_pad|><|vision_end|>c");
  EXPECT_EQ(written->tokens, tokenizer_.Encode(written->text).value());
  // Without videos the prompt is as it was.
  auto same = reader_->WriteVideos(tokenizer_, Text("ab"), {});
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->text, "ab");
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
