// An explicit pool of worker threads, passed to whatever needs it (no global pool).
// Workers spin briefly between jobs: a decode step issues dozens of short parallel loops, and
// waking sleeping threads for each would cost more than the loops themselves. The caller takes
// tasks too and waits only for tasks a worker has claimed, so a worker the OS has not scheduled
// (a loaded machine) delays nothing.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
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
  // are done. `thread` is in [0, threads()) and names a per-thread scratch area. Call from one
  // thread at a time.
  void Run(int64_t tasks, const std::function<void(int64_t task, int thread)>& fn);

  // Splits [0, n) into contiguous ranges of multiples of `grain`, up to four per thread, which
  // the threads take as they finish (uneven ranges, such as rows of attention over contexts of
  // different lengths, even out).
  void ParallelFor(int64_t n, int64_t grain,
                   const std::function<void(int64_t begin, int64_t end, int thread)>& fn);

  // Runs fn(i, thread) for each i in [0, n), once, with the same items on the same threads from
  // call to call where the threads keep up: thread t takes the items of its share (the t-th of
  // threads() equal parts of [0, n)) front to back, then those left in other shares from their
  // backs. Calls that split the same n alike (a step's matmuls over the same weights, its
  // attention over the same sequences) then find their data in the caches of the core that read
  // it last time.
  void ForEachAffine(int64_t n, const std::function<void(int64_t i, int thread)>& fn);

 private:
  // A job's description; two alternate so that a late worker never reads a job being written.
  struct Job {
    std::atomic<int64_t> tasks{0};
    std::atomic<const std::function<void(int64_t, int)>*> fn{nullptr};
  };
  void Worker(int thread);
  // Claims and runs tasks of job `generation` while any remain.
  void Work(uint32_t generation, int thread);

  // ForEachAffine's shares: the items of share t not taken yet, [front, back), as the high and
  // low 32 bits of one word, each word on a cache line of its own (the threads take from their
  // own shares without moving each other's lines).
  struct alignas(64) Share {
    std::atomic<uint64_t> left{0};
  };

  int threads_;
  std::unique_ptr<Share[]> shares_;
  std::vector<std::thread> workers_;
  Job jobs_[2];
  // High 32 bits: the job's generation; low 32 bits: the next task to claim.
  std::atomic<uint64_t> claim_{0};
  std::atomic<int64_t> done_{0};
  std::atomic<uint32_t> generation_{0};
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::condition_variable wake_;
  std::atomic<int> sleepers_{0};
};

}  // namespace gizllm
