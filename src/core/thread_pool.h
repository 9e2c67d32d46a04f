// An explicit pool of worker threads, passed to whatever needs it (no global pool).
// Workers spin briefly between jobs: a decode step issues dozens of short parallel loops, and
// waking sleeping threads for each would cost more than the loops themselves.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace gizllm {

class ThreadPool {
 public:
  // threads: total threads that run a job, the caller included (1 = run inline).
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return threads_; }

  // Runs fn(task, thread) for task in [0, tasks); each task runs exactly once; returns when all
  // are done. `thread` is in [0, threads()) and names a per-thread scratch area.
  void Run(int64_t tasks, const std::function<void(int64_t task, int thread)>& fn);

  // Splits [0, n) into about threads() contiguous ranges of multiples of `grain`.
  void ParallelFor(int64_t n, int64_t grain,
                   const std::function<void(int64_t begin, int64_t end, int thread)>& fn);

 private:
  void Worker(int thread);
  void Work(int thread);

  int threads_;
  std::vector<std::thread> workers_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int64_t> next_task_{0};
  std::atomic<int> pending_{0};
  int64_t tasks_ = 0;
  const std::function<void(int64_t, int)>* fn_ = nullptr;
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::condition_variable wake_;
  std::atomic<int> sleepers_{0};
};

}  // namespace gizllm
