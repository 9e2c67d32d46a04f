#include "grammar/token_mask.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <string>

#include "grammar/json_schema.h"
#include "tokenizer/tokenizer.h"

namespace gizllm {
namespace {

class TokenMaskTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    Expected<Tokenizer> t = Tokenizer::Load("models/tiny-chat");
    ASSERT_TRUE(t.ok()) << t.status().message();
    tokenizer_ = new Tokenizer(std::move(*t));
    vocabulary_ = std::make_shared<const TokenVocabulary>(
        TokenVocabulary::FromTokenizer(*tokenizer_, tokenizer_->vocab_size()));
  }
  static void TearDownTestSuite() { delete tokenizer_; }

  static TokenGrammar Make(const std::string& gbnf) {
    Expected<Grammar> g = ParseGbnf(gbnf);
    EXPECT_TRUE(g.ok()) << g.status().message();
    return {std::make_shared<const Grammar>(std::move(*g)), vocabulary_};
  }

  static bool Has(const std::vector<uint64_t>& mask, int32_t t) {
    return (mask[t >> 6] >> (t & 63)) & 1;
  }

  static inline Tokenizer* tokenizer_ = nullptr;
  static inline std::shared_ptr<const TokenVocabulary> vocabulary_;
};

TEST_F(TokenMaskTest, TokenBytesRebuildTheText) {
  for (const std::string text : {"{\"name\": \"Zoë\", \"n\": 42}", "  日本語 text\n\tmore", "a"}) {
    Expected<std::vector<int32_t>> ids = tokenizer_->Encode(text);
    ASSERT_TRUE(ids.ok());
    std::string bytes;
    for (int32_t id : *ids) bytes += tokenizer_->TokenBytes(id);
    EXPECT_EQ(bytes, text);
  }
  // Special tokens have no bytes in the vocabulary.
  const int32_t end = tokenizer_->TokenId("<|im_end|>");
  ASSERT_GE(end, 0);
  EXPECT_TRUE(vocabulary_->bytes(end).empty());
}

// The trie walk gives the same mask as trying every token on its own, along random paths.
// Strings bounded and not (whose plain subtrees are allowed whole), numbers, enums.
TEST_F(TokenMaskTest, MaskEqualsEveryTokenTried) {
  for (const char* schema : {R"({"type":"object","properties":{
    "name":{"type":"string","maxLength":12},"age":{"type":"integer","minimum":0,"maximum":150},
    "tags":{"type":"array","items":{"enum":["a","b\u00e9"]},"maxItems":3}},
    "required":["name","age","tags"],"additionalProperties":false})",
                             R"({"type":"object","properties":{"s":{"type":"string"},
    "t":{"type":"string","minLength":2,"maxLength":5},"p":{"type":"string","pattern":"^a[b-z ]*$"}},
    "required":["s","t","p"],"additionalProperties":false})"}) {
    Expected<std::string> gbnf = JsonSchemaToGbnf(schema);
    ASSERT_TRUE(gbnf.ok()) << gbnf.status().message();
    TokenGrammar tg = Make(*gbnf);
    const int32_t eos = tokenizer_->TokenId("<|im_end|>");
    const std::vector<int32_t> stop = {eos};
    std::mt19937 rng(7);
    for (int path = 0; path < 4; ++path) {
      TokenMatcher tm(tg);
      Matcher reference(tg.grammar);
      for (int step = 0; step < 80; ++step) {
        std::vector<uint64_t> mask;
        tm.FillMask(stop, &mask);
        std::vector<int32_t> allowed;
        for (int32_t t = 0; t < vocabulary_->size(); ++t) {
          Matcher m = reference;
          const std::string& b = vocabulary_->bytes(t);
          const bool want = t == eos ? reference.Complete() : !b.empty() && m.Accept(b);
          ASSERT_EQ(Has(mask, t), want) << "token " << t << " at step " << step;
          if (want) allowed.push_back(t);
        }
        ASSERT_FALSE(allowed.empty());
        const int32_t pick = allowed[rng() % allowed.size()];
        if (pick == eos) break;
        ASSERT_TRUE(tm.Accept(pick));
        ASSERT_TRUE(reference.Accept(vocabulary_->bytes(pick)));
      }
    }
  }
}

// The class trie walk against every token tried on its own and against the byte trie walk, on
// grammars whose byte sets split the classes (parts of the letters, digits and punctuation, of the
// UTF-8 continuation bytes, classes read differently by two stacks at once), along random paths.
TEST_F(TokenMaskTest, ClassWalkEqualsEveryTokenTried) {
  const char* grammars[] = {
      "root ::= ([a-m]+ | [n-z0-4]+ | \"-\" [0-9]) (\" \" root)?",
      "root ::= (\"\\\"\" [^\"\\\\]{0,7} \"\\\"\" | [!-/]+ | [A-Z][a-z]*) [ \\n]? root?",
      "root ::= ([\\u00e0-\\u00ff] | [\\u4e00-\\u4e7f] | [\\u0100-\\u9fff]{2} | \"é\" [a-z]) root?",
      "root ::= \"x\" [^x]* \"x\" | \"x\" [a-z]{1,4} \"y\" [0-9]* | [^\\x00-\\x7f]{1,6}",
      "root ::= (\"true\" | \"tr\" [a-f]+ | [0-9]+ (\".\" [0-9]{1,3})? | \"{\" [a-z:,]* \"}\") ws "
      "root?\n"
      "ws ::= [ \\t]*",
  };
  const int32_t eos = tokenizer_->TokenId("<|im_end|>");
  const std::vector<int32_t> stop = {eos};
  std::mt19937 rng(11);
  int64_t checked = 0;
  for (const char* gbnf : grammars) {
    TokenGrammar tg = Make(gbnf);
    for (int path = 0; path < 6; ++path) {
      TokenMatcher tm(tg, /*cache=*/false), plain(tg, /*cache=*/false, /*classes=*/false);
      Matcher reference(tg.grammar);
      for (int step = 0; step < 30; ++step) {
        std::vector<uint64_t> mask, bytes_mask;
        tm.FillMask(stop, &mask);
        plain.FillMask(stop, &bytes_mask);
        ASSERT_EQ(mask, bytes_mask) << gbnf << " path " << path << " step " << step;
        std::vector<int32_t> allowed;
        for (int32_t t = 0; t < vocabulary_->size(); ++t) {
          Matcher m = reference;
          const std::string& b = vocabulary_->bytes(t);
          const bool want = t == eos ? reference.Complete() : !b.empty() && m.Accept(b);
          ASSERT_EQ(Has(mask, t), want) << gbnf << ": token " << t << " at step " << step;
          if (want) allowed.push_back(t);
        }
        ++checked;
        if (allowed.empty()) break;
        const int32_t pick = allowed[rng() % allowed.size()];
        if (pick == eos) break;
        ASSERT_TRUE(tm.Accept(pick));
        ASSERT_TRUE(plain.Accept(pick));
        ASSERT_TRUE(reference.Accept(vocabulary_->bytes(pick)));
      }
    }
  }
  EXPECT_GT(checked, 100);
}

// A made vocabulary where class nodes hold 512 tokens and more (every two and three lower case
// letters: their dense masks), beside random tokens of quotes, escapes, digits, upper case,
// punctuation, whole and cut UTF-8 characters and stray bytes; random paths through grammars
// that read those classes whole and apart, each mask against every token tried.
TEST(TokenMaskVocabularyTest, DenseClassNodesEqualEveryTokenTried) {
  std::mt19937 rng(5);
  std::vector<std::string> bytes = {""};  // id 0: a special token (no bytes)
  for (char a = 'a'; a <= 'z'; ++a) {
    for (char b = 'a'; b <= 'z'; ++b) {
      bytes.push_back({a, b});
      bytes.push_back({a, b, static_cast<char>('a' + rng() % 26)});
    }
  }
  const std::vector<std::string> pieces = {"\"",
                                           "\\",
                                           " ",
                                           "\n",
                                           "0",
                                           "7",
                                           "A",
                                           "Z",
                                           "q",
                                           "-",
                                           ".",
                                           "{",
                                           "}",
                                           ":",
                                           ",",
                                           "[",
                                           "\xC3\xA9",
                                           "\xE6\x97\xA5",
                                           "\xF0\x9F\x98\x80",
                                           "\xC3",
                                           "\xA9",
                                           "\xE6",
                                           "\x97\xA5",
                                           "\xED\x9F\xBF",
                                           "\xEE\x80\x80",
                                           "\x7F",
                                           "\x01"};
  for (int t = 0; t < 1500; ++t) {
    std::string token;
    for (int n = 1 + rng() % 4; n > 0; --n) token += pieces[rng() % pieces.size()];
    bytes.push_back(token);
  }
  auto vocabulary = std::make_shared<const TokenVocabulary>(bytes);
  const char* grammars[] = {
      "root ::= \"\\\"\" [^\"\\\\\\x00-\\x1f]{0,9} \"\\\"\" (\" \" root)?",
      "root ::= ([a-m]+ | [n-z]{2,3} | \"\\\"\" [a-z]* \"\\\"\" | [0-9]+ | \"A\" [a-zA-Z]*) ([ ,] "
      "root)?",
      "root ::= \"{\" ([a-z]{1,5} \":\" (\"true\" | [0-9]{1,3} | \"\\\"\" [^\"]* \"\\\"\"))? \"}\"",
      "root ::= ([\\u00e0-\\u00ff] | [\\u6000-\\u6fff] | [\\U0001F600-\\U0001F64F] | [a-z]) root?",
  };
  for (const char* gbnf : grammars) {
    Expected<Grammar> g = ParseGbnf(gbnf);
    ASSERT_TRUE(g.ok()) << g.status().message();
    TokenGrammar tg{std::make_shared<const Grammar>(std::move(*g)), vocabulary};
    for (int path = 0; path < 8; ++path) {
      TokenMatcher tm(tg, /*cache=*/false);
      Matcher reference(tg.grammar);
      for (int step = 0; step < 30; ++step) {
        std::vector<uint64_t> mask;
        tm.FillMask({}, &mask);
        std::vector<int32_t> allowed;
        for (int32_t t = 0; t < vocabulary->size(); ++t) {
          Matcher m = reference;
          const std::string& b = vocabulary->bytes(t);
          const bool want = !b.empty() && m.Accept(b);
          ASSERT_EQ(((mask[t >> 6] >> (t & 63)) & 1) != 0, want)
              << gbnf << ": token " << t << " at step " << step;
          if (want) allowed.push_back(t);
        }
        if (allowed.empty()) break;
        const int32_t pick = allowed[rng() % allowed.size()];
        ASSERT_TRUE(tm.Accept(pick));
        ASSERT_TRUE(reference.Accept(vocabulary->bytes(pick)));
      }
    }
  }
}

TEST_F(TokenMaskTest, StopOnlyWhereComplete) {
  TokenGrammar tg = Make("root ::= \"ab\" \"c\"?");
  const int32_t eos = tokenizer_->TokenId("<|im_end|>");
  TokenMatcher tm(tg);
  std::vector<uint64_t> mask;
  tm.FillMask(std::vector<int32_t>{eos}, &mask);
  EXPECT_FALSE(Has(mask, eos));
  Expected<std::vector<int32_t>> ab = tokenizer_->Encode("ab");
  ASSERT_TRUE(ab.ok());
  for (int32_t t : *ab) ASSERT_TRUE(tm.Accept(t));
  tm.FillMask(std::vector<int32_t>{eos}, &mask);
  EXPECT_TRUE(Has(mask, eos));
  EXPECT_TRUE(Has(mask, tokenizer_->TokenId("c")));
  EXPECT_FALSE(Has(mask, tokenizer_->TokenId("a")));
}

TEST_F(TokenMaskTest, PartialUtf8Tokens) {
  // "é" is C3 A9: the byte token for C3 alone is allowed first, and then only A9.
  TokenGrammar tg = Make("root ::= \"\\u00e9\"");
  int32_t c3 = -1, a9 = -1;
  for (int32_t t = 0; t < vocabulary_->size(); ++t) {
    if (vocabulary_->bytes(t) == "\xC3") c3 = t;
    if (vocabulary_->bytes(t) == "\xA9") a9 = t;
  }
  ASSERT_GE(c3, 0);
  ASSERT_GE(a9, 0);
  TokenMatcher tm(tg);
  std::vector<uint64_t> mask;
  tm.FillMask({}, &mask);
  EXPECT_TRUE(Has(mask, c3));
  EXPECT_FALSE(Has(mask, a9));
  ASSERT_TRUE(tm.Accept(c3));
  tm.FillMask({}, &mask);
  EXPECT_TRUE(Has(mask, a9));
  EXPECT_FALSE(Has(mask, c3));
  EXPECT_FALSE(tm.Complete());
  ASSERT_TRUE(tm.Accept(a9));
  EXPECT_TRUE(tm.Complete());
}

TEST_F(TokenMaskTest, RepeatedStatesHitTheCache) {
  TokenGrammar tg = Make("root ::= \"\\\"\" [a-z]* \"\\\"\"");
  TokenMatcher tm(tg);
  std::vector<uint64_t> first, again;
  ASSERT_TRUE(tm.Accept(tokenizer_->TokenId("\"")));
  tm.FillMask({}, &first);
  ASSERT_TRUE(tm.Accept(tokenizer_->TokenId("a")));
  tm.FillMask({}, &again);
  EXPECT_EQ(first, again);
  EXPECT_EQ(tm.cache_hits(), 1);
}

// Requests of one grammar share masks by parse state: matchers on random paths of their own
// (each interning its own frames) always get the mask a matcher that shares nothing walks, and
// states reached by several of them are walked once.
TEST_F(TokenMaskTest, RequestsOfOneGrammarShareMasksByState) {
  Expected<std::string> gbnf = JsonSchemaToGbnf(R"({"type":"object","properties":{
    "name":{"type":"string","maxLength":6},"n":{"type":"integer","minimum":0,"maximum":99}},
    "required":["name","n"],"additionalProperties":false})");
  ASSERT_TRUE(gbnf.ok()) << gbnf.status().message();
  TokenGrammar tg = Make(*gbnf);
  const int32_t eos = tokenizer_->TokenId("<|im_end|>");
  const std::vector<int32_t> stop = {eos};
  std::mt19937 rng(3);
  for (int path = 0; path < 6; ++path) {
    TokenMatcher shared(tg), alone(tg, /*cache=*/false);
    for (int step = 0; step < 40; ++step) {
      std::vector<uint64_t> got, want;
      shared.FillMask(stop, &got);
      alone.FillMask(stop, &want);
      ASSERT_EQ(got, want) << "path " << path << " step " << step;
      std::vector<int32_t> allowed;
      for (int32_t t = 0; t < vocabulary_->size(); ++t) {
        if (Has(want, t)) allowed.push_back(t);
      }
      ASSERT_FALSE(allowed.empty());
      // Short tokens first, so that paths meet in the same states.
      std::shuffle(allowed.begin(), allowed.end(), rng);
      std::stable_sort(allowed.begin(), allowed.end(), [&](int32_t a, int32_t b) {
        return vocabulary_->bytes(a).size() < vocabulary_->bytes(b).size();
      });
      const int32_t pick = allowed[rng() % std::min<size_t>(allowed.size(), 3)];
      if (pick == eos) break;
      ASSERT_TRUE(shared.Accept(pick));
      ASSERT_TRUE(alone.Accept(pick));
    }
  }
  EXPECT_GT(tg.masks->hits(), 10);
  // The same text in other tokens: the same state key, whatever frames each matcher interned.
  TokenMatcher one(tg), two(tg);
  Expected<std::vector<int32_t>> ids = tokenizer_->Encode("{\"name\":\"ab");
  ASSERT_TRUE(ids.ok());
  ASSERT_LT(ids->size(), 11u);  // some token holds several characters
  for (int32_t t : *ids) ASSERT_TRUE(one.Accept(t));
  for (char c : std::string("{\"name\":\"ab")) {
    ASSERT_TRUE(two.Accept(tokenizer_->TokenId(std::string(1, c)))) << c;
  }
  EXPECT_EQ(one.StateKey(), two.StateKey());
  ASSERT_TRUE(two.Accept(tokenizer_->TokenId("c")));
  EXPECT_NE(one.StateKey(), two.StateKey());
}

// Masks keyed by canonical states (Grammar::canonical) equal the plain walk from the state
// itself at every step of paths along long runs (strings of a schema with a minLength and with a
// maxLength, GBNF runs of
// one and several elements), to their ends; and the run's early steps reuse one mask.
TEST_F(TokenMaskTest, CanonicalStatesGiveTheStatesMasks) {
  Expected<std::string> schema = JsonSchemaToGbnf(R"({"type":"object","properties":{
    "body":{"type":"string","minLength":300,"maxLength":320},"n":{"type":"integer"}},
    "required":["body","n"],"additionalProperties":false})");
  ASSERT_TRUE(schema.ok()) << schema.status().message();
  Expected<std::string> bounded = JsonSchemaToGbnf(R"({"type":"object","properties":{
    "title":{"type":"string","maxLength":700}},"required":["title"],"additionalProperties":false})");
  ASSERT_TRUE(bounded.ok()) << bounded.status().message();
  const std::string grammars[] = {
      *schema,
      *bounded,
      "root ::= \"<\" [a-z ]{400} \">\"",
      "root ::= (\"ab\" | [0-9]){300,} \".\"",
  };
  const int32_t eos = tokenizer_->TokenId("<|im_end|>");
  const std::vector<int32_t> stop = {eos};
  std::mt19937 rng(5);
  for (const std::string& gbnf : grammars) {
    TokenGrammar tg = Make(gbnf);
    ASSERT_FALSE(tg.grammar->canonical.empty()) << gbnf;
    int64_t hits = 0;  // the request's own cache's
    for (int path = 0; path < 3; ++path) {
      TokenMatcher tm(tg), plain(tg, /*cache=*/false, /*classes=*/false, /*canonical=*/false);
      bool ended = false;
      for (int step = 0; step < 600 && !ended; ++step) {
        std::vector<uint64_t> mask, want;
        tm.FillMask(stop, &mask);
        plain.FillMask(stop, &want);
        ASSERT_EQ(mask, want) << gbnf << " path " << path << " step " << step;
        std::vector<int32_t> allowed;
        for (int32_t t = 0; t < vocabulary_->size(); ++t) {
          if (Has(want, t)) allowed.push_back(t);
        }
        ASSERT_FALSE(allowed.empty()) << gbnf << " step " << step;
        // Longer tokens first (the run's end comes sooner), a stop where it is allowed.
        std::shuffle(allowed.begin(), allowed.end(), rng);
        std::stable_sort(allowed.begin(), allowed.end(), [&](int32_t a, int32_t b) {
          return vocabulary_->bytes(a).size() > vocabulary_->bytes(b).size();
        });
        const int32_t pick = Has(want, eos) ? eos : allowed[rng() % std::min<size_t>(allowed.size(), 8)];
        if (pick == eos) {
          ended = true;
          break;
        }
        ASSERT_TRUE(tm.Accept(pick));
        ASSERT_TRUE(plain.Accept(pick));
      }
      EXPECT_TRUE(ended) << gbnf << " path " << path;
      hits += tm.cache_hits();
    }
    // Two or more steps of a path in the run's early copies: one walk for all of them.
    EXPECT_GT(hits + tg.masks->hits(), 5) << gbnf;
  }
}

TEST(ApplyMaskTest, LeavesAllowedLogits) {
  std::vector<float> logits = {1, 2, 3, 4, 5};
  std::vector<uint64_t> mask = {0b10110};
  ApplyMask(mask, logits);
  EXPECT_EQ(logits[0], -INFINITY);
  EXPECT_EQ(logits[1], 2);
  EXPECT_EQ(logits[2], 3);
  EXPECT_EQ(logits[3], -INFINITY);
  EXPECT_EQ(logits[4], 5);
}

}  // namespace
}  // namespace gizllm
