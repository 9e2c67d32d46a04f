// Exactness against Hugging Face tokenizers: ids (with and without special tokens) and decoded
// text for every corpus line, as tools/tokenizer_refs.mjs recorded them.
#include "golden.h"

#include <gtest/gtest.h>

namespace gizllm {
namespace {

using testing::GoldenLine;

class GoldenTest : public ::testing::TestWithParam<std::string> {};

std::string Show(const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s + "]";
}

TEST_P(GoldenTest, MatchesHuggingFace) {
  const std::string name = GetParam();
  std::string path = testing::GoldenTokenizerPath(name);
  if (!path.empty() && !FileExists(path)) {
    GTEST_SKIP() << path << " is missing (run scripts/setup.sh)";
  }
  auto tokenizer = testing::LoadGoldenTokenizer(name);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().message();
  std::vector<GoldenLine> golden = testing::ReadGolden(name);
  ASSERT_GE(golden.size(), 500u) << "missing " << testing::kRefsDir << "/" << name
                                 << ".jsonl (the build writes it: tools/tokenizer_refs.mjs)";
  int failures = 0;
  for (size_t i = 0; i < golden.size() && failures < 10; ++i) {
    const GoldenLine& g = golden[i];
    auto ids = tokenizer->Encode(g.text, /*add_special=*/false);
    ASSERT_TRUE(ids.ok()) << "line " << i + 1 << ": " << ids.status().message();
    auto special = tokenizer->Encode(g.text, /*add_special=*/true);
    ASSERT_TRUE(special.ok());
    bool ok = *ids == g.ids && *special == g.special;
    EXPECT_EQ(*ids, g.ids) << "line " << i + 1 << " " << nlohmann::json(g.text).dump() << "\n ours "
                           << Show(*ids) << "\n hf   " << Show(g.ids);
    EXPECT_EQ(*special, g.special) << "line " << i + 1;
    const std::string& other = golden[(i + 7) % golden.size()].text;
    auto pair = tokenizer->EncodePair(g.text, other, /*add_special=*/true);
    ASSERT_TRUE(pair.ok());
    EXPECT_EQ(*pair, g.pair) << "line " << i + 1 << " paired with line "
                             << (i + 7) % golden.size() + 1;
    ok = ok && *pair == g.pair;
    auto typed = tokenizer->EncodeTyped(g.text, other, /*add_special=*/true);
    ASSERT_TRUE(typed.ok());
    EXPECT_EQ(typed->ids, g.pair) << "line " << i + 1;
    EXPECT_EQ(typed->types, g.pair_types)
        << "line " << i + 1 << " paired with line " << (i + 7) % golden.size() + 1;
    ok = ok && typed->types == g.pair_types;
    std::string decoded = tokenizer->Decode(g.special);
    std::string decoded_skip = tokenizer->Decode(g.special, /*skip_special=*/true);
    ok = ok && decoded == g.decoded && decoded_skip == g.decoded_skip;
    EXPECT_EQ(decoded, g.decoded) << "line " << i + 1;
    EXPECT_EQ(decoded_skip, g.decoded_skip) << "line " << i + 1;
    if (!ok) ++failures;
  }
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, GoldenTest,
                         ::testing::Values("tiny-chat", "tiny-flags", "qwen3", "llama3", "llama2",
                                           "gemma3", "bert-uncased", "bert-cased",
                                           "wordpiece-mixed", "unigram", "unigram-bytes",
                                           "unigram-first", "unigram-precompiled", "word-level",
                                           "split-behaviors"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n) {
                             if (c == '-') c = '_';
                           }
                           return n;
                         });

}  // namespace
}  // namespace gizllm
