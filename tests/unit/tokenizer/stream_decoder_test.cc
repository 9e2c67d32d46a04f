// StreamDecoder: the streamed pieces are valid UTF-8 and add up to Decode of all ids.
#include <gtest/gtest.h>

#include "golden.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/unicode.h"

namespace gizllm {
namespace {

void ExpectStreamsLikeDecode(const Tokenizer& t, const std::vector<int32_t>& ids, bool skip,
                             const std::string& where) {
  StreamDecoder stream(t, skip);
  std::string streamed;
  for (int32_t id : ids) {
    std::string piece = stream.Push(id);
    EXPECT_EQ(tok::FindInvalidUtf8(piece), std::string::npos) << where;
    streamed += piece;
  }
  streamed += stream.Flush();
  EXPECT_EQ(streamed, t.Decode(ids, skip)) << where;
}

TEST(StreamDecoderTest, MatchesDecodeOverTheCorpus) {
  for (const char* name : {"tiny-chat", "qwen3"}) {
    std::string path = testing::GoldenTokenizerPath(name);
    if (!FileExists(path)) continue;
    auto t = testing::LoadGoldenTokenizer(name);
    ASSERT_TRUE(t.ok());
    auto golden = testing::ReadGolden(name);
    ASSERT_FALSE(golden.empty());
    for (size_t i = 0; i < golden.size(); ++i) {
      ExpectStreamsLikeDecode(*t, golden[i].special, false,
                              name + std::string(" line ") + std::to_string(i + 1));
      ExpectStreamsLikeDecode(*t, golden[i].special, true, name);
    }
  }
}

TEST(StreamDecoderTest, HoldsBackPartialCharacters) {
  auto t = Tokenizer::Load("models/tiny-chat");
  ASSERT_TRUE(t.ok());
  // One byte token per byte of "é😀": nothing is emitted until a character is complete.
  std::string text = "\xC3\xA9\xF0\x9F\x98\x80";
  std::vector<int32_t> ids;
  for (unsigned char b : text) {
    ids.push_back(t->TokenId(tok::ByteLevelAlphabet::Get().Char(b)));
    ASSERT_GE(ids.back(), 0) << int(b);
  }
  StreamDecoder stream(*t);
  EXPECT_EQ(stream.Push(ids[0]), "");
  EXPECT_EQ(stream.Push(ids[1]), "\xC3\xA9");
  EXPECT_EQ(stream.Push(ids[2]), "");
  EXPECT_EQ(stream.Push(ids[3]), "");
  EXPECT_EQ(stream.Push(ids[4]), "");
  EXPECT_EQ(stream.Push(ids[5]), "\xF0\x9F\x98\x80");
  EXPECT_EQ(stream.Flush(), "");
  // A sequence cut short comes out as U+FFFD at the end.
  StreamDecoder cut(*t);
  EXPECT_EQ(cut.Push(ids[2]), "");
  EXPECT_EQ(cut.Flush(), "\xEF\xBF\xBD");
}

}  // namespace
}  // namespace gizllm
