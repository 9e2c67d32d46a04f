#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace gizllm {
namespace {

TEST(ThreadPool, EveryTaskRunsOnce) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int round = 0; round < 200; ++round) {
      int64_t n = 1 + round * 7 % 97;
      std::vector<std::atomic<int>> hits(n);
      pool.Run(n, [&](int64_t task, int thread) {
        ASSERT_GE(thread, 0);
        ASSERT_LT(thread, threads);
        hits[task].fetch_add(1);
      });
      for (auto& h : hits) ASSERT_EQ(h.load(), 1);
    }
  }
}

TEST(ThreadPool, ParallelForCoversRangeInGrains) {
  ThreadPool pool(2);
  for (int64_t n : {1, 5, 16, 17, 1000}) {
    std::vector<std::atomic<int>> hits(n);
    pool.ParallelFor(n, 4, [&](int64_t b, int64_t e, int) {
      EXPECT_EQ(b % 4, 0);
      for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
    });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1);
  }
}

TEST(ThreadPool, ForEachAffineRunsEachItemOnce) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int64_t n : {1, 2, 5, 16, 17, 1000}) {
      std::vector<std::atomic<int>> hits(n);
      std::vector<int> ran_on(n, -1);
      pool.ForEachAffine(n, [&](int64_t i, int thread) {
        ASSERT_GE(thread, 0);
        ASSERT_LT(thread, threads);
        hits[i].fetch_add(1);
        ran_on[i] = thread;
      });
      for (auto& h : hits) ASSERT_EQ(h.load(), 1);
      if (threads == 1) {
        for (int t : ran_on) ASSERT_EQ(t, 0);
      }
    }
  }
}

TEST(ThreadPool, ForEachAffineFinishesWhenAThreadIsSlow) {
  ThreadPool pool(2);
  for (int round = 0; round < 20; ++round) {
    std::atomic<int64_t> sum{0};
    pool.ForEachAffine(64, [&](int64_t i, int thread) {
      // The worker is slow on every item it takes: the caller takes the rest of its share.
      if (thread == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      sum.fetch_add(i);
    });
    ASSERT_EQ(sum.load(), 64 * 63 / 2);
  }
}

}  // namespace
}  // namespace gizllm
