// ExpertSlots: the expert cache's slots, least recently used evicted, the experts of a group
// pinned, against a plain list model of the policy over random traffic; CopyOnThreads over sizes
// below, at and between its pieces.
#include "ops/expert_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <list>
#include <random>
#include <set>
#include <vector>

namespace gizllm {
namespace {

TEST(ExpertSlotsTest, MissThenHit) {
  ExpertSlots cache(2);
  cache.Begin();
  auto a = cache.Acquire(10);
  ASSERT_TRUE(a);
  EXPECT_FALSE(a->hit);
  EXPECT_EQ(a->slot, 0);
  auto b = cache.Acquire(11);
  ASSERT_TRUE(b);
  EXPECT_FALSE(b->hit);
  EXPECT_EQ(b->slot, 1);
  cache.Begin();
  auto again = cache.Acquire(10);
  ASSERT_TRUE(again);
  EXPECT_TRUE(again->hit);
  EXPECT_EQ(again->slot, 0);
  EXPECT_EQ(cache.hits(), 1);
  EXPECT_EQ(cache.misses(), 2);
}

TEST(ExpertSlotsTest, EvictsLeastRecentlyUsed) {
  ExpertSlots cache(3);
  for (uint64_t key : {1, 2, 3}) {
    cache.Begin();
    ASSERT_TRUE(cache.Acquire(key));
  }
  cache.Begin();
  ASSERT_TRUE(cache.Acquire(1)->hit);  // 2 is now the least recently used
  cache.Begin();
  auto p = cache.Acquire(4);
  ASSERT_TRUE(p);
  EXPECT_FALSE(p->hit);
  EXPECT_EQ(p->slot, 1);  // 2's slot
  EXPECT_FALSE(cache.Holds(2));
  EXPECT_TRUE(cache.Holds(1));
  EXPECT_TRUE(cache.Holds(3));
  EXPECT_TRUE(cache.Holds(4));
}

TEST(ExpertSlotsTest, PinsTheGroup) {
  ExpertSlots cache(2);
  cache.Begin();
  ASSERT_TRUE(cache.Acquire(1));
  ASSERT_TRUE(cache.Acquire(2));
  // Both slots hold this group's experts: a third cannot evict either.
  EXPECT_FALSE(cache.Acquire(3));
  EXPECT_TRUE(cache.Holds(1));
  EXPECT_TRUE(cache.Holds(2));
  EXPECT_EQ(cache.misses(), 2);
  // In a new group the least recently used of them goes.
  cache.Begin();
  auto p = cache.Acquire(3);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->slot, 0);
  EXPECT_FALSE(cache.Holds(1));
  // Re-acquiring a hit pins it: 2 was acquired before 3 but is now the newest.
  ASSERT_TRUE(cache.Acquire(2)->hit);
  EXPECT_FALSE(cache.Acquire(4));
}

// The policy as a list, most recently used first, over random groups of random keys.
TEST(ExpertSlotsTest, MatchesListModel) {
  std::mt19937 rng(7);
  for (int slots : {1, 3, 8}) {
    ExpertSlots cache(slots);
    std::list<uint64_t> order;  // held keys, most recently used first
    int64_t hits = 0, misses = 0;
    for (int g = 0; g < 2000; ++g) {
      cache.Begin();
      std::set<uint64_t> group;
      const int n = 1 + static_cast<int>(rng() % std::min(slots, 4));
      while (static_cast<int>(group.size()) < n) group.insert(rng() % 20);
      std::vector<uint64_t> keys(group.begin(), group.end());
      std::shuffle(keys.begin(), keys.end(), rng);
      std::set<uint64_t> pinned;
      for (uint64_t key : keys) {
        auto place = cache.Acquire(key);
        ASSERT_TRUE(place);
        auto it = std::find(order.begin(), order.end(), key);
        const bool held = it != order.end();
        EXPECT_EQ(place->hit, held) << "slots " << slots << " group " << g << " key " << key;
        if (held) {
          order.erase(it);
          ++hits;
        } else {
          ++misses;
          if (static_cast<int>(order.size()) == slots) {
            // The least recently used key outside this group goes.
            auto victim = std::find_if(order.rbegin(), order.rend(),
                                       [&](uint64_t k) { return !pinned.count(k); });
            ASSERT_NE(victim, order.rend());
            EXPECT_FALSE(cache.Holds(*victim));
            order.erase(std::next(victim).base());
          }
        }
        order.push_front(key);
        pinned.insert(key);
      }
      for (uint64_t key : order) EXPECT_TRUE(cache.Holds(key));
    }
    EXPECT_EQ(cache.hits(), hits);
    EXPECT_EQ(cache.misses(), misses);
    EXPECT_GT(hits, 0);
    EXPECT_GT(misses, 0);
  }
}

TEST(CopyOnThreadsTest, CopiesEveryByteAndNoMore) {
  std::mt19937 rng(5);
  std::vector<size_t> sizes = {0,
                               1,
                               4095,
                               kCopyPiece - 1,
                               kCopyPiece,
                               2 * kCopyPiece,
                               3 * kCopyPiece + 1,
                               4 * kCopyPiece + 4097,
                               9437184};
  for (int i = 0; i < 20; ++i) sizes.push_back(rng() % (12 * kCopyPiece));
  for (size_t bytes : sizes) {
    std::vector<uint8_t> from(bytes), to(bytes + 64, 0xab);
    for (uint8_t& b : from) b = static_cast<uint8_t>(rng());
    CopyOnThreads(to.data(), from.data(), bytes);
    EXPECT_TRUE(std::equal(from.begin(), from.end(), to.begin())) << bytes << " bytes";
    for (size_t i = bytes; i < to.size(); ++i) ASSERT_EQ(to[i], 0xab) << bytes << " bytes";
  }
}

}  // namespace
}  // namespace gizllm
