#include "grammar/regex.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "grammar/matcher.h"

namespace gizllm {
namespace {

std::shared_ptr<const Grammar> Compile(const std::string& regex) {
  Expected<std::string> gbnf = RegexToGbnf(regex);
  EXPECT_TRUE(gbnf.ok()) << regex << ": " << gbnf.status().message();
  if (!gbnf.ok()) return nullptr;
  Expected<Grammar> g = ParseGbnf(*gbnf);
  EXPECT_TRUE(g.ok()) << regex << ": " << g.status().message() << "\n" << *gbnf;
  if (!g.ok()) return nullptr;
  return std::make_shared<const Grammar>(std::move(*g));
}

bool Matches(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  if (g == nullptr) return false;
  Matcher m(g);
  return m.Accept(text) && m.Complete();
}

std::string Refusal(const std::string& regex) {
  Expected<std::string> gbnf = RegexToGbnf(regex);
  return gbnf.ok() ? "" : gbnf.status().message();
}

TEST(RegexTest, LiteralsAndEscapesMatchInFull) {
  auto g = Compile(R"(a\.b\\c)");
  EXPECT_TRUE(Matches(g, R"(a.b\c)"));
  EXPECT_FALSE(Matches(g, R"(axb\c)"));
  EXPECT_FALSE(Matches(g, R"(a.b\cd)"));  // a full match: nothing after
  EXPECT_FALSE(Matches(g, R"(xa.b\c)"));
  auto q = Compile(R"(say "hi"\n\tbye)");
  EXPECT_TRUE(Matches(q, "say \"hi\"\n\tbye"));
  auto u = Compile(R"(\u00e9t\u00E9 \x41)");
  EXPECT_TRUE(Matches(u, "\xC3\xA9t\xC3\xA9 A"));
  EXPECT_FALSE(Matches(u, "ete A"));
  auto utf8 = Compile("caf\xC3\xA9");
  EXPECT_TRUE(Matches(utf8, "caf\xC3\xA9"));
  auto punct = Compile(R"(\(\)\[\]\{\}\*\+\?\|\^\$\/)");
  EXPECT_TRUE(Matches(punct, "()[]{}*+?|^$/"));
  auto empty = Compile("");
  EXPECT_TRUE(Matches(empty, ""));
  EXPECT_FALSE(Matches(empty, "a"));
}

TEST(RegexTest, AnchorsAtTheEndsChangeNothing) {
  for (const char* r : {"abc", "^abc", "abc$", "^abc$"}) {
    auto g = Compile(r);
    EXPECT_TRUE(Matches(g, "abc")) << r;
    EXPECT_FALSE(Matches(g, "xabc")) << r;
    EXPECT_FALSE(Matches(g, "abcx")) << r;
  }
  auto dollar = Compile(R"(cost \$)");
  EXPECT_TRUE(Matches(dollar, "cost $"));
  auto alt = Compile("^a|b$");
  EXPECT_TRUE(Matches(alt, "a"));
  EXPECT_TRUE(Matches(alt, "b"));
}

TEST(RegexTest, ShortClassesAndDot) {
  auto d = Compile(R"(\d\D\w\W\s\S)");
  EXPECT_TRUE(Matches(d, "1x_-\tz"));
  EXPECT_TRUE(Matches(d, "9 a.\n\xC3\xA9"));
  EXPECT_FALSE(Matches(d, "x1_-\tz"));
  EXPECT_FALSE(Matches(d, "11_-\tz"));
  EXPECT_FALSE(Matches(d, "1x_a\tz"));
  EXPECT_FALSE(Matches(d, "1x_- z "));
  EXPECT_FALSE(Matches(d, "1x_-x z"));
  auto dot = Compile("a.c");
  EXPECT_TRUE(Matches(dot, "abc"));
  EXPECT_TRUE(Matches(dot, "a\"c"));
  EXPECT_TRUE(Matches(dot,
                      "a\xE2\x82\xAC"
                      "c"));  // one character, three bytes
  EXPECT_FALSE(Matches(dot, "a\nc"));
  EXPECT_FALSE(Matches(dot, "ac"));
}

TEST(RegexTest, CharacterClasses) {
  auto g = Compile(R"([a-cX-Z_\d\-\]]+)");
  EXPECT_TRUE(Matches(g, "abcXYZ_09-]"));
  EXPECT_FALSE(Matches(g, "abd"));
  EXPECT_FALSE(Matches(g, ""));
  auto n = Compile(R"([^"\\\n]*)");
  EXPECT_TRUE(Matches(n, "plain text \xC3\xA9"));
  EXPECT_FALSE(Matches(n, "a\"b"));
  EXPECT_FALSE(Matches(n, "a\\b"));
  EXPECT_FALSE(Matches(n, "a\nb"));
  auto ws = Compile(R"([\s,]+)");
  EXPECT_TRUE(Matches(ws, " \t\n,\r"));
  EXPECT_FALSE(Matches(ws, "a"));
  auto bracket = Compile("[]a]");  // a leading ] is a member
  EXPECT_TRUE(Matches(bracket, "]"));
  auto dash = Compile("[a-]");  // a trailing - is a member
  EXPECT_TRUE(Matches(dash, "-"));
  auto uni = Compile(R"([\u00e0-\u00ff])");
  EXPECT_TRUE(Matches(uni, "\xC3\xA9"));
  EXPECT_FALSE(Matches(uni, "e"));
}

TEST(RegexTest, GroupsAlternationAndQuantifiers) {
  auto g = Compile(R"((?:ab|c)+(x|yz)?)");
  EXPECT_TRUE(Matches(g, "abcab"));
  EXPECT_TRUE(Matches(g, "cyz"));
  EXPECT_TRUE(Matches(g, "abx"));
  EXPECT_FALSE(Matches(g, "x"));
  EXPECT_FALSE(Matches(g, "aby"));
  auto named = Compile(R"((?P<year>\d{4})-(?<month>\d{2}))");
  EXPECT_TRUE(Matches(named, "2024-01"));
  EXPECT_FALSE(Matches(named, "2024-1"));
  auto counts = Compile(R"(a{2}b{1,}c{1,3}d{,2}e*f?)");
  EXPECT_TRUE(Matches(counts, "aabccc"));
  EXPECT_TRUE(Matches(counts, "aabbbcddeeef"));
  EXPECT_FALSE(Matches(counts, "abc"));
  EXPECT_FALSE(Matches(counts, "aacccc"));
  EXPECT_FALSE(Matches(counts, "aabccccc"));
  EXPECT_FALSE(Matches(counts, "aabcddd"));
  auto lazy = Compile(R"(a*?b+?c??d{1,2}?)");
  EXPECT_TRUE(Matches(lazy, "aabbd"));
  EXPECT_TRUE(Matches(lazy, "bcdd"));
  EXPECT_FALSE(Matches(lazy, "ad"));
  auto empty_branch = Compile("a(|b)c");
  EXPECT_TRUE(Matches(empty_branch, "ac"));
  EXPECT_TRUE(Matches(empty_branch, "abc"));
  // What vLLM's users send: a phone number, an answer among choices.
  auto phone = Compile(R"(^\(\d{3}\) \d{3}-\d{4}$)");
  EXPECT_TRUE(Matches(phone, "(555) 123-4567"));
  EXPECT_FALSE(Matches(phone, "555-123-4567"));
  auto choice = Compile("(yes|no|maybe)");
  EXPECT_TRUE(Matches(choice, "maybe"));
  EXPECT_FALSE(Matches(choice, "yesno"));
}

TEST(RegexTest, RefusalsNameThePosition) {
  auto has = [](const std::string& regex, const std::string& what) {
    const std::string m = Refusal(regex);
    EXPECT_NE(m.find(what), std::string::npos) << regex << " -> " << m;
  };
  has("(a)\\1", "regex: at position 3: the escape \\1 (a backreference)");
  has("(?P<x>a)(?P=x)", "at position 8: a backreference");
  has("a(?=b)", "at position 1: a lookaround");
  has("a(?!b)", "at position 1: a lookaround");
  has("(?<=a)b", "at position 0: a lookaround");
  has("(?<!a)b", "at position 0: a lookaround");
  has("(?i)abc", "at position 0: the group (?i");
  has("a\\bc", "at position 1: the escape \\b (a word boundary)");
  has("a^b", "at position 1: an anchor inside the pattern");
  has("^a$b", "at position 2: an anchor inside the pattern");
  has("a{1001}", "at position 1: the quantifier {1001} (counts up to 1000");
  has("a{3,2}", "at position 1: the quantifier {3,2}");
  has("a{x}", "at position 1: the quantifier {x}");
  has("a**", "at position 2: a quantifier after a quantifier");
  has("a*+", "at position 2: a quantifier after a quantifier");
  has("*a", "at position 0: '*' after nothing");
  has("ab(c", "at position 2: an unclosed group");
  has("ab)c", "at position 2: unexpected ')'");
  has("a[bc", "at position 1: an unterminated class");
  has("[z-a]", "at position 0: a class range out of order");
  has("ab\\", "at position 2: an escape at the end");
  has("\\u12G4", "at position 0: a bad hex digit");
  has("\\uD800", "at position 0: a surrogate escape");
  has("\\q", "at position 0: the escape \\q");
  has(std::string(65, '(') + "a" + std::string(65, ')'), "nesting deeper than 64");
  EXPECT_EQ(Refusal(std::string(64, '(') + "a" + std::string(64, ')')), "");
  EXPECT_TRUE(RegexGrammar("[a-z]{1,1000}").ok());
  Expected<Grammar> bad = RegexGrammar("(?=a)");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "regex: at position 0: a lookaround is not supported");
}

}  // namespace
}  // namespace gizllm
