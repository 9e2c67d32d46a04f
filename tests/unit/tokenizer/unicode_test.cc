#include "tokenizer/unicode.h"

#include <gtest/gtest.h>

namespace gizllm::tok {
namespace {

TEST(UnicodeTest, FindInvalidUtf8) {
  EXPECT_EQ(FindInvalidUtf8("plain ascii text, long enough for words"), std::string::npos);
  EXPECT_EQ(FindInvalidUtf8("h\xC3\xA9 \xF0\x9F\x98\x80"), std::string::npos);
  EXPECT_EQ(FindInvalidUtf8("abcdefghij\x80"), 10u);
  EXPECT_EQ(FindInvalidUtf8("\xC0\x80"), 0u);            // overlong
  EXPECT_EQ(FindInvalidUtf8("a\xED\xA0\x80"), 1u);       // surrogate
  EXPECT_EQ(FindInvalidUtf8("ab\xF4\x90\x80\x80"), 2u);  // above U+10FFFF
  EXPECT_EQ(FindInvalidUtf8("\xE2\x82"), 0u);            // truncated
}

TEST(UnicodeTest, LossyReplacesMaximalSubparts) {
  // As Rust's String::from_utf8_lossy: one U+FFFD per maximal invalid subsequence.
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(Utf8Lossy("ok"), "ok");
  EXPECT_EQ(Utf8Lossy("\xF0\x9F\x98"), r);
  EXPECT_EQ(Utf8Lossy("\xF0\x9F\x98x"), r + "x");
  EXPECT_EQ(Utf8Lossy("\x80\x80"), r + r);
  EXPECT_EQ(Utf8Lossy("\xE0\x80"), r + r);  // E0 needs A0..BF next
  EXPECT_EQ(Utf8Lossy("\xED\xA0\x80"), r + r + r);
  EXPECT_EQ(Utf8Lossy("a\xC3\xA9\xFF"), "a\xC3\xA9" + r);
}

TEST(UnicodeTest, Classes) {
  EXPECT_TRUE(IsWhitespace(0x85));
  EXPECT_TRUE(IsWhitespace(0x3000));
  EXPECT_FALSE(IsWhitespace(0x180E));
  EXPECT_FALSE(IsWhitespace(0x200B));
  EXPECT_TRUE(IsWordChar('_'));
  EXPECT_TRUE(IsWordChar(0x4E2D));
  EXPECT_TRUE(IsWordChar(0x301));
  EXPECT_FALSE(IsWordChar('-'));
  EXPECT_TRUE(IsPunctuation(0x3001));
}

TEST(UnicodeTest, NormalForms) {
  EXPECT_EQ(Nfc("e\xCC\x81"), "\xC3\xA9");
  EXPECT_EQ(Nfd("\xC3\xA9"), "e\xCC\x81");
  EXPECT_EQ(Nfkc("\xEF\xAC\x81"), "fi");
  EXPECT_EQ(Nfc("plain"), "plain");
  EXPECT_EQ(Lowercase("ÀB\xCE\xA3 \xCE\xA3"), "àb\xCF\x82 \xCF\x83");  // final sigma
  EXPECT_EQ(Lowercase("A\xCE\xA3"), "a\xCF\x82");
}

}  // namespace
}  // namespace gizllm::tok
