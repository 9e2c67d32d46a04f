#include "core/json_nesting.h"

#include <gtest/gtest.h>

#include <string>

namespace gizllm {
namespace {

std::string Nested(int levels, char open, char close) {
  return std::string(levels, open) + std::string(levels, close);
}

TEST(JsonNestingTest, CountsArraysAndObjects) {
  EXPECT_EQ(JsonNesting("1"), 0);
  EXPECT_EQ(JsonNesting("\"text\""), 0);
  EXPECT_EQ(JsonNesting("[]"), 1);
  EXPECT_EQ(JsonNesting("{\"a\": [1, {\"b\": []}], \"c\": {}}"), 4);
  EXPECT_EQ(JsonNesting("[[], [], [[]]]"), 3);
}

TEST(JsonNestingTest, IgnoresBracketsInStrings) {
  EXPECT_EQ(JsonNesting("[\"[[[{{{\"]"), 1);
  EXPECT_EQ(JsonNesting("{\"a\\\"[[[\": \"\\\\\", \"b\": [\"]]]\"]}"), 2);
}

TEST(JsonNestingTest, StopsPastTheBound) {
  EXPECT_EQ(JsonNesting(Nested(kMaxJsonNesting, '[', ']')), kMaxJsonNesting);
  EXPECT_FALSE(JsonTooDeep(Nested(kMaxJsonNesting, '{', '}')));
  EXPECT_TRUE(JsonTooDeep(Nested(kMaxJsonNesting + 1, '[', ']')));
  EXPECT_EQ(JsonNesting(Nested(20000, '[', ']'), 10), 11);
  EXPECT_EQ(JsonNesting(std::string(20000, '{')), kMaxJsonNesting + 1);
}

}  // namespace
}  // namespace gizllm
