#include "grammar/grammar.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "grammar/matcher.h"

namespace gizllm {
namespace {

std::shared_ptr<const Grammar> Parse(const std::string& text) {
  Expected<Grammar> g = ParseGbnf(text);
  EXPECT_TRUE(g.ok()) << g.status().message();
  if (!g.ok()) return nullptr;
  return std::make_shared<const Grammar>(std::move(*g));
}

// Whether the whole text is a sentence of the grammar.
bool Matches(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  Matcher m(g);
  return m.Accept(text) && m.Complete();
}

// Whether the text is a prefix of some sentence.
bool Prefix(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  Matcher m(g);
  return m.Accept(text);
}

std::string ErrorOf(const std::string& text) {
  Expected<Grammar> g = ParseGbnf(text);
  return g.ok() ? "" : g.status().message();
}

TEST(GbnfTest, LiteralsAlternativesAndGroups) {
  auto g = Parse("root ::= \"ab\" (\"c\" | \"de\") x\nx ::= \"!\" | \"\"\n");
  EXPECT_TRUE(Matches(g, "abc!"));
  EXPECT_TRUE(Matches(g, "abde"));
  EXPECT_FALSE(Matches(g, "abd"));
  EXPECT_TRUE(Prefix(g, "abd"));
  EXPECT_FALSE(Prefix(g, "abx"));
  EXPECT_FALSE(Matches(g, "abc!!"));
  EXPECT_FALSE(Matches(g, ""));
}

TEST(GbnfTest, Repetitions) {
  auto g = Parse("root ::= \"a\"* \"b\"+ \"c\"? [0-9]{2} [x]{1,3} [y]{2,}");
  EXPECT_TRUE(Matches(g, "b12xyy"));
  EXPECT_TRUE(Matches(g, "aaabbc34xxxyyyyy"));
  EXPECT_FALSE(Matches(g, "b1xyy"));
  EXPECT_FALSE(Matches(g, "b12xxxxyy"));
  EXPECT_FALSE(Matches(g, "b12xy"));
  EXPECT_FALSE(Matches(g, "12xyy"));
}

TEST(GbnfTest, ClassesWithRangesNegationAndEscapes) {
  auto g = Parse(R"(root ::= [a-cx\-] [^"\\\n] [\x41-\x43] [\u00e9] "\t\"\\")");
  EXPECT_TRUE(Matches(g, "b!B\xC3\xA9\t\"\\"));
  EXPECT_TRUE(Matches(g, "-zA\xC3\xA9\t\"\\"));
  EXPECT_FALSE(Matches(g, "d!B\xC3\xA9\t\"\\"));
  EXPECT_FALSE(Matches(g, "a\"B\xC3\xA9\t\"\\"));
  EXPECT_FALSE(Matches(g, "a\nB\xC3\xA9\t\"\\"));
  EXPECT_FALSE(Matches(g, "a!D\xC3\xA9\t\"\\"));
}

TEST(GbnfTest, Utf8ByteByByte) {
  // [^a] holds every character but 'a', of every length; surrogates and bad bytes never match.
  auto g = Parse("root ::= [^a]+ | [\\u0100-\\U0001F600]");
  EXPECT_TRUE(Matches(g, "\xE2\x82\xAC"));               // U+20AC
  EXPECT_TRUE(Matches(g, "\xF0\x9F\x98\x80"));           // U+1F600
  EXPECT_TRUE(Matches(g, "z\xDF\xBF\xF4\x8F\xBF\xBF"));  // U+07FF, U+10FFFF
  EXPECT_FALSE(Matches(g, "a"));
  EXPECT_FALSE(Prefix(g, "\xED\xA0\x80"));  // a surrogate
  EXPECT_FALSE(Prefix(g, "\xC0\x80"));      // overlong
  EXPECT_FALSE(Prefix(g, "\xF4\x90"));      // above U+10FFFF
  EXPECT_FALSE(Prefix(g, "\x80"));
  Matcher m(g);
  EXPECT_TRUE(m.Accept(static_cast<uint8_t>(0xE2)));
  EXPECT_FALSE(m.Complete());  // inside a character
  EXPECT_TRUE(m.Accept(static_cast<uint8_t>(0x82)));
  EXPECT_TRUE(m.Accept(static_cast<uint8_t>(0xAC)));
  EXPECT_TRUE(m.Complete());
  // Every code point of a range, at its edges.
  auto r = Parse("root ::= [\\u0800-\\uFFFF]");
  EXPECT_TRUE(Matches(r, "\xE0\xA0\x80"));
  EXPECT_TRUE(Matches(r, "\xEF\xBF\xBF"));
  EXPECT_FALSE(Matches(r, "\xDF\xBF"));
  EXPECT_FALSE(Prefix(r, "\xED\xA0"));
}

TEST(GbnfTest, CommentsNewlinesAndDot) {
  auto g = Parse(
      "# a comment\n"
      "root ::= item (\n"
      "  \",\" item # inside a group\n"
      ")*\n"
      "\n"
      "item ::= \"x\" |\n"
      "  .\n");
  EXPECT_TRUE(Matches(g, "x,\xC3\xA9,y"));
  EXPECT_FALSE(Matches(g, "x,"));
}

TEST(GbnfTest, RecursionKeepsStacksShallow) {
  auto g = Parse("root ::= \"[\" (root (\",\" root)*)? \"]\"");
  EXPECT_TRUE(Matches(g, "[[],[[]]]"));
  EXPECT_FALSE(Matches(g, "[[],[[]]"));
  // A long right-recursive repetition does not grow the frames with the text.
  auto s = Parse("root ::= [a-z]*");
  Matcher m(s);
  ASSERT_TRUE(m.Accept(std::string(10000, 'q')));
  EXPECT_LT(m.frames(), 16u);
  EXPECT_TRUE(m.Complete());
}

TEST(GbnfTest, ErrorsNameLineAndColumn) {
  EXPECT_EQ(ErrorOf("root ::= \"a\"\nx ::= [b"), "grammar:2:7: an unterminated character class");
  EXPECT_EQ(ErrorOf("root ::= y"), "grammar:1:10: rule y is used but not defined");
  EXPECT_EQ(ErrorOf("x ::= \"a\""), "grammar: no rule named root");
  EXPECT_EQ(ErrorOf("root ::= \"a\" )"), "grammar:1:14: unexpected ')'");
  EXPECT_EQ(ErrorOf("root ::= \"\\q\""), "grammar:1:11: unknown escape \\q");
  EXPECT_EQ(ErrorOf("root ::= * \"a\""), "grammar:1:10: '*' follows nothing");
  EXPECT_EQ(ErrorOf("root ::= \"a\"{3,2}"),
            "grammar:1:13: a repetition whose maximum is below its minimum");
  EXPECT_EQ(ErrorOf("root ::= \"a\"\nroot ::= \"b\""), "grammar:2:1: rule root is defined twice");
  EXPECT_EQ(ErrorOf("root ::= [z-a]"), "grammar:1:13: a range whose end is below its start");
}

TEST(GbnfTest, LeftRecursionIsRefused) {
  EXPECT_NE(ErrorOf("root ::= root \"a\" | \"b\"").find("left recursion: root -> root"),
            std::string::npos);
  EXPECT_NE(ErrorOf("root ::= a \"x\"\na ::= b? root\nb ::= \"b\"").find("left recursion"),
            std::string::npos);
  // A repetition of something that may be empty loops the same way.
  EXPECT_NE(ErrorOf("root ::= (\"a\"?)*").find("left recursion"), std::string::npos);
}

TEST(GbnfTest, HostileInputsAreBounded) {
  EXPECT_NE(ErrorOf("root ::= " + std::string(2000, '(') + "\"a\"" + std::string(2000, ')'))
                .find("nested deeper"),
            std::string::npos);
  // Groups repeat by reference; a literal repeats by copy.
  EXPECT_EQ(ErrorOf("root ::= ((\"a\"{60000}){60000}){60000}"), "");
  EXPECT_NE(
      ErrorOf("root ::= \"" + std::string(100, 'a') + "\"{60000}").find("expands to more than"),
      std::string::npos);
  EXPECT_NE(ErrorOf("root ::= \"a\"{99999999999}").find("repetition count"), std::string::npos);
  // An ambiguous grammar stops at the bounds with an error instead of slowing down.
  auto g =
      Parse("root ::= x*\nx ::= \"a\" | \"a\" \"a\" | \"a\" \"a\" \"a\" | \"a\" \"a\" \"a\" \"a\"");
  Matcher m(g);
  for (int i = 0; i < 10000 && m.Accept(static_cast<uint8_t>('a')); ++i) {
  }
  // Either it stays within the bounds (interning merges the equal stacks) or it says why not.
  if (!m.status().ok()) {
    EXPECT_NE(m.status().message().find("bounds"), std::string::npos);
  }
  EXPECT_TRUE(m.status().ok() ? m.Complete() : true);
}

TEST(GbnfTest, AcceptIsAllOrNothing) {
  auto g = Parse("root ::= \"abc\"");
  Matcher m(g);
  EXPECT_FALSE(m.Accept(std::string("abx")));
  EXPECT_TRUE(m.Accept(std::string("abc")));
  EXPECT_TRUE(m.Complete());
  EXPECT_FALSE(m.CanContinue());
}

// Long runs of one item map their early copies onto the copy kCanonicalDepth + 1 before the end;
// items that may read nothing, short runs and runs across alternatives keep their elements.
TEST(GbnfTest, LongRunsHaveCanonicalElements) {
  constexpr int32_t kDepth = Grammar::kCanonicalDepth;
  auto g = Parse("root ::= \"<\" [a-z]{600} \">\"");
  ASSERT_EQ(g->elements.size(), 603u);  // "<", 600 copies, ">", end
  ASSERT_FALSE(g->canonical.empty());
  const int32_t kept = 1 + (600 - 1 - (kDepth + 1));
  EXPECT_EQ(g->Canonical(0), 0);
  EXPECT_EQ(g->Canonical(1), kept);
  EXPECT_EQ(g->Canonical(kept - 1), kept);
  for (int32_t e = kept; e < 603; ++e) EXPECT_EQ(g->Canonical(e), e) << e;

  // A block of two elements ("ab" x 400): each offset maps to its own place in the kept copy.
  g = Parse("root ::= \"ab\"{400} [0-9]");
  ASSERT_FALSE(g->canonical.empty());
  const int32_t kept2 = 2 * (400 - 1 - (kDepth + 1));
  EXPECT_EQ(g->Canonical(0), kept2);
  EXPECT_EQ(g->Canonical(1), kept2 + 1);
  EXPECT_EQ(g->Canonical(2), kept2);
  EXPECT_EQ(g->Canonical(kept2 + 2), kept2 + 2);

  // Nothing to map: copies that may read nothing, runs too short for the depth.
  EXPECT_TRUE(Parse("root ::= (\"a\"?){600}")->canonical.empty());
  EXPECT_TRUE(Parse("root ::= [a-z]{200}")->canonical.empty());
  g = Parse("root ::= x{600}\nx ::= [a-z] | \"\"");
  EXPECT_TRUE(g->canonical.empty());

  // A chain of optional copies: places in rules that allow more than kDepth + 2 copies share
  // their keys; closer to the chain's end they part.
  g = Parse("root ::= \"<\" [a-z]{0,600} \">\"");
  ASSERT_FALSE(g->canonical.empty());
  {
    Matcher a(g), b(g), c(g);
    ASSERT_TRUE(a.Accept("<" + std::string(10, 'a')));
    ASSERT_TRUE(b.Accept("<" + std::string(300, 'b')));
    ASSERT_TRUE(c.Accept("<" + std::string(600 - kDepth, 'c')));
    EXPECT_NE(a.Key(a.state()), b.Key(b.state()));
    EXPECT_EQ(a.Key(a.state(), /*canonical=*/true), b.Key(b.state(), /*canonical=*/true));
    EXPECT_NE(a.Key(a.state(), true), c.Key(c.state(), true));
    // The rule they map onto: the one that allows kDepth + 2 more copies.
    Matcher d(g);
    ASSERT_TRUE(d.Accept("<" + std::string(600 - (kDepth + 2), 'd')));
    EXPECT_EQ(a.Key(a.state(), true), d.Key(d.state()));
    EXPECT_TRUE(Matches(g, "<" + std::string(600, 'q') + ">"));
    EXPECT_FALSE(Prefix(g, "<" + std::string(601, 'q')));
  }
  EXPECT_TRUE(Parse("root ::= [a-z]{0,200}")->canonical.empty());

  // The language is the grammar's: a run's end still counts every copy.
  g = Parse("root ::= \"<\" [a-z]{600} \">\"");
  EXPECT_TRUE(Matches(g, "<" + std::string(600, 'q') + ">"));
  EXPECT_FALSE(Matches(g, "<" + std::string(599, 'q') + ">"));
  EXPECT_FALSE(Prefix(g, "<" + std::string(601, 'q')));
}

// States along a long run share a canonical key once they are more than kCanonicalDepth + 1
// copies from its end, and a canonical state reads on as the state itself would, up to that depth.
TEST(GbnfTest, CanonicalStatesReadOnAlike) {
  constexpr int32_t kDepth = Grammar::kCanonicalDepth;
  auto g = Parse("root ::= \"<\" ([a-z] | \"%\" [0-9]){500,} \">\"");
  ASSERT_FALSE(g->canonical.empty());
  Matcher a(g), b(g);
  ASSERT_TRUE(a.Accept(std::string("<ab")));
  ASSERT_TRUE(b.Accept("<" + std::string(100, 'z') + "%7"));
  EXPECT_NE(a.Key(a.state()), b.Key(b.state()));
  EXPECT_EQ(a.Key(a.state(), /*canonical=*/true), b.Key(b.state(), /*canonical=*/true));
  // Close to the end the keys part again.
  Matcher c(g);
  ASSERT_TRUE(c.Accept("<" + std::string(500 - kDepth, 'x')));
  EXPECT_NE(a.Key(a.state(), true), c.Key(c.state(), true));

  // From the canonical state, every text of up to kCanonicalDepth bytes goes as from the state.
  MatchState canonical;
  ASSERT_TRUE(a.Canonical(a.state(), &canonical));
  EXPECT_EQ(a.Key(canonical), a.Key(a.state(), true));
  for (const std::string& text : {std::string(kDepth, 'k'), std::string("%1%2%") + "x",
                                  std::string("%x"), std::string(">")}) {
    MatchState from = a.state(), to;
    MatchState from_c = canonical, to_c;
    bool alive = true, alive_c = true;
    for (char ch : text) {
      alive = alive && a.Advance(from, static_cast<uint8_t>(ch), &to);
      alive_c = alive_c && a.Advance(from_c, static_cast<uint8_t>(ch), &to_c);
      ASSERT_EQ(alive, alive_c) << text;
      if (!alive) break;
      EXPECT_EQ(to.complete, to_c.complete);
      from = to;
      from_c = to_c;
    }
  }
}

}  // namespace
}  // namespace gizllm
