#include "core/progress.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>

namespace gizllm {
namespace {

std::string Written(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  for (int c; (c = std::fgetc(f)) != EOF;) s.push_back(static_cast<char>(c));
  return s;
}

TEST(ProgressLine, LogGetsALineAtEachTenthAndTheEnd) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  ProgressLine line(f);  // a file: not a terminal
  for (int i = 0; i <= 1000; ++i) line.Update(i, 1000, std::to_string(i) + "/1000");
  line.Update(1000, 1000, "again");  // nothing after the end
  const std::string s = Written(f);
  EXPECT_EQ(std::count(s.begin(), s.end(), '\n'), 11) << s;  // 0, 100, ..., 1000
  EXPECT_EQ(s.find('\r'), std::string::npos);
  EXPECT_NE(s.find("[##############################] 1000/1000\n"), std::string::npos) << s;
  EXPECT_EQ(s.find("again"), std::string::npos);
  std::fclose(f);
}

TEST(ProgressLine, TerminalRedrawsInPlaceAndEndsTheLine) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  ProgressLine line(f, /*terminal=*/true);
  for (int i = 1; i <= 7; ++i) line.Update(i, 7, "step " + std::to_string(i));
  const std::string s = Written(f);
  EXPECT_EQ(std::count(s.begin(), s.end(), '\r'), 7);
  EXPECT_EQ(std::count(s.begin(), s.end(), '\n'), 1);
  EXPECT_EQ(s.back(), '\n');
  std::fclose(f);
}

TEST(ProgressLine, OddTotalsAndOutOfRangeCountsStayOnTheBar) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  ProgressLine line(f, /*terminal=*/false);
  line.Update(-3, 0, "none yet");  // total 0 is taken as 1, done clamped to 0
  line.Update(5, 3, "past the end");
  const std::string s = Written(f);
  EXPECT_EQ(std::count(s.begin(), s.end(), '\n'), 2) << s;
  EXPECT_NE(s.find("[..............................] none yet\n"), std::string::npos) << s;
  EXPECT_NE(s.find("[##############################] past the end\n"), std::string::npos) << s;
  std::fclose(f);
}

}  // namespace
}  // namespace gizllm
