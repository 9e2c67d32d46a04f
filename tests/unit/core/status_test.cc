#include "core/status.h"

#include <gtest/gtest.h>

namespace gizllm {
namespace {

Expected<int> Half(int x) {
  if (x % 2) return InvalidArgument("odd: " + std::to_string(x));
  return x / 2;
}

Expected<int> Quarter(int x) {
  GZ_ASSIGN_OR_RETURN(int h, Half(x));
  GZ_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

TEST(Status, PropagatesFirstError) {
  EXPECT_EQ(*Quarter(8), 2);
  auto bad = Quarter(6);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "odd: 3");
  EXPECT_EQ(bad.status().Annotate("f.json").message(), "f.json: odd: 3");
}

}  // namespace
}  // namespace gizllm
