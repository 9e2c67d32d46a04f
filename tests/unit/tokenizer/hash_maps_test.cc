#include "tokenizer/hash_maps.h"

#include <gtest/gtest.h>

#include <random>
#include <unordered_map>

namespace gizllm::tok {
namespace {

TEST(HashMapsTest, StringIdMapAgreesWithStdMap) {
  std::mt19937 rng(7);
  StringIdMap map;
  std::unordered_map<std::string, int32_t> reference;
  for (int i = 0; i < 20000; ++i) {
    std::string key(rng() % 12, ' ');
    for (char& c : key) c = static_cast<char>('a' + rng() % 4);
    int32_t id = static_cast<int32_t>(rng() % 100000);
    map.Set(key, id);
    reference[key] = id;
  }
  EXPECT_EQ(map.size(), reference.size());
  for (const auto& [k, v] : reference) EXPECT_EQ(map.Get(k), v) << k;
  EXPECT_EQ(map.Get("zzz"), -1);
  size_t seen = 0;
  map.ForEach([&](std::string_view k, int32_t id) {
    EXPECT_EQ(reference.at(std::string(k)), id);
    ++seen;
  });
  EXPECT_EQ(seen, reference.size());
}

TEST(HashMapsTest, PairMap) {
  PairMap map;
  for (int32_t i = 0; i < 5000; ++i) map.Set(i, i * 7 % 13, {i, i + 1});
  for (int32_t i = 0; i < 5000; ++i) {
    const PairMap::Value* v = map.Get(i, i * 7 % 13);
    ASSERT_NE(v, nullptr);
    EXPECT_EQ(v->rank, i);
    EXPECT_EQ(v->id, i + 1);
  }
  EXPECT_EQ(map.Get(3, 4), nullptr);
}

TEST(HashMapsTest, CountByte) {
  std::mt19937 rng(3);
  for (int n = 0; n < 100; ++n) {
    std::string s(rng() % 70, 'x');
    size_t expected = 0;
    for (char& c : s) {
      c = static_cast<char>(rng() % 256);
      expected += c == '"';
    }
    EXPECT_EQ(CountByte(s, '"'), expected);
  }
  EXPECT_EQ(CountByte(std::string(17, '"'), '"'), 17u);
  EXPECT_EQ(CountByte("\xa2\x22\x00\xff", '"'), 1u);
}

}  // namespace
}  // namespace gizllm::tok
