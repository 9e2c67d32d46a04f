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

// A tokenizer.json with one field replaced.
std::string FileWith(const std::string& file, const std::string& pointer,
                     const nlohmann::json& value) {
  auto text = ReadFile(file);
  auto j = nlohmann::json::parse(*text);
  j[nlohmann::json::json_pointer(pointer)] = value;
  return j.dump();
}

// tiny-chat's JSON with one field replaced.
std::string TinyWith(const std::string& pointer, const nlohmann::json& value) {
  return FileWith(kTiny, pointer, value);
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

// An id far beyond the vocabulary is an error naming the file, the field, the token and the id,
// not a table of a billion entries.
TEST(TokenizerTest, IdBeyondTheVocabIsAnError) {
  const std::string golden = testing::kGoldenDir;
  struct Case {
    std::string file, pointer;
    nlohmann::json value;
    std::string expected;
  };
  const Case cases[] = {
      // tiny-chat: BPE of 8192 ids and 7 added tokens.
      {kTiny, "/model/vocab/the", 1000000005,
       "model.vocab[\"the\"]': token 'the' has id 1000000005"},
      {kTiny, "/model/vocab/the", 9223, "has id 9223"},
      {golden + "/word-level.json", "/model/vocab/the", 1000000005,
       "model.vocab[\"the\"]': token 'the' has id 1000000005"},
      {golden + "/bert-uncased.json", "/model/vocab/the", 1073741824,
       "model.vocab[\"the\"]': token 'the' has id 1073741824"},
      {kTiny, "/added_tokens/1/id", 1000000005,
       "added_tokens[1].id': token '<|im_start|>' has id 1000000005"},
      {kTiny, "/added_tokens/1/id", 2147483647, "has id 2147483647"},
      {kTiny, "/added_tokens/1/id", 1000000000000, "has id 1000000000000"},
      {kTiny, "/added_tokens/1/id", 18446744073709551615u, "has id 18446744073709551615"},
      {kTiny, "/added_tokens/1/id", -1, "added_tokens[1].id': expected a non-negative id"},
      {kTiny,
       "/post_processor",
       {{"type", "BertProcessing"}, {"sep", {"<|im_end|>", 8192}}, {"cls", {"<|im_start|>", 1}}},
       "post_processor.sep[1]': special token '<|im_end|>' has id 8192, outside the vocab of 8192"},
      {kTiny,
       "/post_processor",
       {{"type", "BertProcessing"}, {"sep", {"<|im_end|>", 2}}, {"cls", {"<|im_start|>", -1}}},
       "post_processor.cls[1]': special token '<|im_start|>' has id -1"},
      {kTiny,
       "/post_processor",
       {{"type", "TemplateProcessing"},
        {"single",
         {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
          {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"pair", nlohmann::json::array()},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1, 1000000005}}}}}}},
       "post_processor.special_tokens.<s>.ids[1]': special token '<s>' has id 1000000005"},
  };
  for (const Case& c : cases) {
    auto t = Tokenizer::FromJson(FileWith(c.file, c.pointer, c.value), "bad/tokenizer.json");
    ASSERT_FALSE(t.ok()) << c.file << c.pointer << " = " << c.value;
    EXPECT_NE(t.status().message().find(c.expected), std::string::npos) << t.status().message();
    EXPECT_EQ(t.status().message().rfind("bad/tokenizer.json: ", 0), 0u) << t.status().message();
  }
}

// A few ids past the dense range (holes) are allowed; special tokens of the post-processor may
// be added tokens.
TEST(TokenizerTest, IdsWithHolesLoad) {
  for (auto [pointer, value] :
       {std::pair{"/model/vocab/the", 9222}, std::pair{"/added_tokens/1/id", 9222}}) {
    auto t = Tokenizer::FromJson(TinyWith(pointer, value), "tiny.json");
    ASSERT_TRUE(t.ok()) << pointer << ": " << t.status().message();
    EXPECT_EQ(t->vocab_size(), 9223);
  }
  auto t = Tokenizer::FromJson(TinyWith("/post_processor", {{"type", "BertProcessing"},
                                                            {"sep", {"<|im_end|>", 2}},
                                                            {"cls", {"<|im_start|>", 1}}}),
                               "tiny.json");
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(*t->Encode("x", /*add_special=*/true), (std::vector<int32_t>{1, t->TokenId("x"), 2}));
}

// `leaf` inside `depth` Sequences of a component whose parts are in `list`.
nlohmann::json NestedSequences(int depth, const char* list, const nlohmann::json& leaf) {
  nlohmann::json j = leaf;
  for (int i = 0; i < depth; ++i) j = {{"type", "Sequence"}, {list, {j}}};
  return j;
}

TEST(TokenizerTest, NestedSequencesAreBounded) {
  struct Case {
    const char* pointer;
    const char* list;
    nlohmann::json leaf;
  };
  const Case cases[] = {
      {"/normalizer", "normalizers", {{"type", "NFC"}}},
      {"/pre_tokenizer", "pretokenizers", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
      {"/decoder", "decoders", {{"type", "Fuse"}}},
      {"/post_processor", "processors", {{"type", "ByteLevel"}}},
  };
  for (const Case& c : cases) {
    auto ok = Tokenizer::FromJson(TinyWith(c.pointer, NestedSequences(32, c.list, c.leaf)), "t");
    EXPECT_TRUE(ok.ok()) << c.pointer << ": " << ok.status().message();
    auto deep = Tokenizer::FromJson(TinyWith(c.pointer, NestedSequences(33, c.list, c.leaf)), "t");
    ASSERT_FALSE(deep.ok()) << c.pointer;
    EXPECT_NE(deep.status().message().find("Sequences nested more than 32 deep"), std::string::npos)
        << deep.status().message();
  }
  // A million levels (a few megabytes of a hostile file) is the same error, not a stack overflow.
  std::string text = TinyWith("/normalizer", nullptr);
  const std::string null_field = "\"normalizer\":null";
  const size_t at = text.find(null_field);
  ASSERT_NE(at, std::string::npos);
  std::string deep;
  for (int i = 0; i < 1000000; ++i) deep += R"({"type":"Sequence","normalizers":[)";
  deep += R"({"type":"NFC"})";
  for (int i = 0; i < 1000000; ++i) deep += "]}";
  text.replace(at, null_field.size(), "\"normalizer\":" + deep);
  auto t = Tokenizer::FromJson(text, "t");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("Sequences nested more than 32 deep"), std::string::npos)
      << t.status().message();
}

TEST(TokenizerTest, InvalidUtf8FileIsAnError) {
  // A vocabulary entry that is not UTF-8 (read by the fast scanner, not nlohmann-json): with a
  // Strip decoder, decoding it read past the token's end.
  auto text = ReadFile(kTiny);
  ASSERT_TRUE(text.ok());
  const size_t vocab = text->find("\"vocab\"");
  ASSERT_NE(vocab, std::string::npos);
  const size_t entry = text->find('"', text->find('{', vocab)) + 1;
  text->insert(entry, "\xe2\x96");
  auto t = Tokenizer::FromJson(*text, "bad.json");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("bad.json: not valid UTF-8 at byte " + std::to_string(entry)),
            std::string::npos)
      << t.status().message();
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

namespace gizllm {
namespace {

// EncodeTyped's truncation: one text cut at its end, a pair as longest_first (the shorter keeps
// its length while it fits in half the budget), special tokens counted.
TEST(TokenizerTest, EncodeTypedTruncates) {
  auto t = Tokenizer::Load("tests/golden/tokenizer/bert-uncased.json");
  ASSERT_TRUE(t.ok()) << t.status().message();
  const std::string a = "one two three four five six seven eight nine ten";
  const std::string b = "red green blue";
  auto plain_a = t->Encode(a);
  auto plain_b = t->Encode(b);
  ASSERT_TRUE(plain_a.ok() && plain_b.ok());
  const int64_t na = plain_a->size(), nb = plain_b->size();
  ASSERT_GT(na, nb + 2);
  const int32_t cls = t->TokenId("[CLS]"), sep = t->TokenId("[SEP]");

  auto whole = t->EncodeTyped(a, std::nullopt, /*add_special=*/true);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(static_cast<int64_t>(whole->ids.size()), na + 2);
  auto cut = t->EncodeTyped(a, std::nullopt, /*add_special=*/true, /*max_tokens=*/5);
  ASSERT_TRUE(cut.ok());
  EXPECT_EQ(cut->ids,
            (std::vector<int32_t>{cls, (*plain_a)[0], (*plain_a)[1], (*plain_a)[2], sep}));
  EXPECT_EQ(cut->types, std::vector<int32_t>(5, 0));

  // The budget after [CLS] A [SEP] B [SEP] is max - 3 = 2 nb + 1: the short b keeps its nb
  // tokens, a gets the rest.
  const int64_t max_tokens = 3 + 2 * nb + 1;
  auto pair = t->EncodeTyped(a, b, /*add_special=*/true, max_tokens);
  ASSERT_TRUE(pair.ok());
  ASSERT_EQ(static_cast<int64_t>(pair->ids.size()), max_tokens);
  EXPECT_EQ(pair->ids[nb + 2], sep);
  EXPECT_EQ(std::vector<int32_t>(pair->ids.begin() + nb + 3, pair->ids.end() - 1), *plain_b);
  std::vector<int32_t> want_types(nb + 3, 0);
  want_types.resize(pair->ids.size(), 1);
  EXPECT_EQ(pair->types, want_types);
  // Too tight for either to keep its length: half each, the longer text the odd one.
  auto halves = t->EncodeTyped(a, b, /*add_special=*/true, /*max_tokens=*/3 + 5);
  ASSERT_TRUE(halves.ok());
  EXPECT_EQ(halves->ids[4], sep);  // [CLS] + 3 of a
  EXPECT_EQ(halves->ids.size(), 8u);

  auto below = t->EncodeTyped(a, b, /*add_special=*/true, /*max_tokens=*/2);
  ASSERT_FALSE(below.ok());
  EXPECT_NE(below.status().message().find("special tokens"), std::string::npos);
}

}  // namespace
}  // namespace gizllm
