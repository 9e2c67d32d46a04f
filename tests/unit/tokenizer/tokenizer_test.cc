// Loading, errors, lookups and thread safety of Tokenizer.
#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "golden.h"

namespace gizllm {
namespace {

constexpr const char* kTiny = "models/tiny-chat/tokenizer.json";

TEST(TokenizerTest, LoadsFolderOrFile) {
  auto from_folder = Tokenizer::Load("models/tiny-chat");
  ASSERT_TRUE(from_folder.ok()) << from_folder.status().message();
  auto from_file = Tokenizer::Load(kTiny);
  ASSERT_TRUE(from_file.ok());
  EXPECT_EQ(*from_folder->Encode("Hello world"), *from_file->Encode("Hello world"));
}

TEST(TokenizerTest, MissingFileNamesIt) {
  auto t = Tokenizer::Load("no/such/folder");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("no/such/folder/tokenizer.json"), std::string::npos)
      << t.status().message();
}

TEST(TokenizerTest, BadJsonNamesTheFile) {
  auto t = Tokenizer::FromJson("{\"model\": ", "x/tokenizer.json");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("x/tokenizer.json"), std::string::npos);
}

// tiny-chat's JSON with one field replaced.
std::string TinyWith(const std::string& pointer, const nlohmann::json& value) {
  auto text = ReadFile(kTiny);
  auto j = nlohmann::json::parse(*text);
  j[nlohmann::json::json_pointer(pointer)] = value;
  return j.dump();
}

TEST(TokenizerTest, UnknownComponentNamesItsType) {
  struct Case {
    const char* pointer;
    nlohmann::json value;
    const char* expected;
  };
  const Case cases[] = {
      {"/normalizer", {{"type", "Fancy"}}, "normalizer.type': unknown normalizer type 'Fancy'"},
      {"/pre_tokenizer/pretokenizers/1",
       {{"type", "Oops"}},
       "pre_tokenizer.pretokenizers[1].type': unknown pre-tokenizer type 'Oops'"},
      {"/decoder", {{"type", "Magic"}}, "unknown decoder type 'Magic'"},
      {"/post_processor", {{"type", "Extra"}}, "unknown post-processor type 'Extra'"},
      {"/model/type", "WordLevelX", "unknown model type 'WordLevelX'"},
      {"/model/merges/3", 17, "model.merges[3]'"},
      {"/pre_tokenizer/pretokenizers/0/pattern", {{"Regex", "(unclosed"}}, "bad regex"},
      {"/added_tokens/0/id", "zero", "added_tokens[0].id'"},
  };
  for (const Case& c : cases) {
    auto t = Tokenizer::FromJson(TinyWith(c.pointer, c.value), "tiny.json");
    ASSERT_FALSE(t.ok()) << c.pointer;
    EXPECT_NE(t.status().message().find(c.expected), std::string::npos) << t.status().message();
    EXPECT_EQ(t.status().message().rfind("tiny.json: ", 0), 0u) << t.status().message();
  }
}

TEST(TokenizerTest, EmptyTokenizerFailsCleanly) {
  Tokenizer empty;
  EXPECT_FALSE(empty.Encode("x").ok());
  EXPECT_FALSE(empty.EncodePair("x", "y").ok());
  EXPECT_EQ(empty.Decode(std::vector<int32_t>{1, 2}), "");
  EXPECT_EQ(empty.vocab_size(), 0);
  EXPECT_EQ(empty.TokenId("x"), -1);
  EXPECT_FALSE(empty.IsSpecial(0));
}

TEST(TokenizerTest, InvalidUtf8IsAnError) {
  auto t = Tokenizer::Load(kTiny);
  ASSERT_TRUE(t.ok());
  for (std::string bad : {std::string("abc\xff"), std::string("\xc3"), std::string("\xed\xa0\x80"),
                          std::string("ok \xe2\x82"), std::string("\xc0\xaf")}) {
    auto ids = t->Encode(bad);
    EXPECT_FALSE(ids.ok()) << bad;
    EXPECT_NE(ids.status().message().find("UTF-8"), std::string::npos);
  }
  EXPECT_TRUE(t->Encode(std::string("nul\0inside", 10)).ok());
}

TEST(TokenizerTest, Lookups) {
  auto t = Tokenizer::Load(kTiny);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->vocab_size(), 8192);
  EXPECT_EQ(t->TokenId("<|im_end|>"), 2);
  EXPECT_EQ(t->TokenText(2), "<|im_end|>");
  EXPECT_TRUE(t->IsSpecial(2));
  EXPECT_FALSE(t->IsSpecial(100));
  EXPECT_EQ(t->TokenId("no such token"), -1);
  EXPECT_EQ(t->TokenText(-1), "");
  EXPECT_EQ(t->TokenText(1 << 20), "");
  int32_t space_the = t->TokenId("Ġthe");
  ASSERT_GE(space_the, 0);
  EXPECT_EQ(t->TokenText(space_the), "Ġthe");
  EXPECT_EQ(t->Decode(std::vector<int32_t>{space_the}), " the");
  // Ids outside the vocabulary are left out of the text.
  EXPECT_EQ(t->Decode(std::vector<int32_t>{space_the, 99999, -5}), " the");
}

TEST(TokenizerTest, SpecialTokensInText) {
  auto t = Tokenizer::Load(kTiny);
  ASSERT_TRUE(t.ok());
  auto ids = t->Encode("<|im_start|>user\nhi<|im_end|>");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->front(), 1);
  EXPECT_EQ(ids->back(), 2);
  EXPECT_EQ(t->Decode(*ids), "<|im_start|>user\nhi<|im_end|>");
  EXPECT_EQ(t->Decode(*ids, /*skip_special=*/true), "user\nhi");
}

TEST(TokenizerTest, CopiesShareAndOutliveTheOriginal) {
  std::vector<int32_t> expected;
  Tokenizer copy = [&] {
    auto t = Tokenizer::Load(kTiny);
    expected = *t->Encode("In the beginning");
    Tokenizer moved = std::move(t).value();
    return moved;
  }();
  EXPECT_EQ(*copy.Encode("In the beginning"), expected);
}

// Several threads encode different texts at once and get what one thread gets.
TEST(TokenizerTest, ThreadSafe) {
  auto t = Tokenizer::Load(kTiny);
  ASSERT_TRUE(t.ok());
  std::vector<std::string> corpus = testing::ReadCorpus();
  ASSERT_FALSE(corpus.empty());
  std::vector<std::vector<int32_t>> expected;
  for (const auto& s : corpus) expected.push_back(*t->Encode(s));
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      std::mt19937 rng(k);
      for (int n = 0; n < 400; ++n) {
        size_t i = rng() % corpus.size();
        auto ids = t->Encode(corpus[i]);
        if (!ids.ok() || *ids != expected[i]) ++mismatches[k];
        if (t->Decode(expected[i]).empty() != corpus[i].empty()) ++mismatches[k];
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int m : mismatches) EXPECT_EQ(m, 0);
}

TEST(TokenizerTest, LongRunsDoNotOverflowTheRegexStack) {
  auto t = Tokenizer::Load(kTiny);
  ASSERT_TRUE(t.ok());
  std::string text = std::string(200000, ' ') + "x" + std::string(100000, '\n') + "y";
  auto ids = t->Encode(text);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(t->Decode(*ids), text);
}

}  // namespace
}  // namespace gizllm
