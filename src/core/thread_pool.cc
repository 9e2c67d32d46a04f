#include "core/thread_pool.h"

#include <algorithm>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace gizllm {
namespace {
inline void Pause() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}
constexpr int kSpins = 1 << 14;
}  // namespace

ThreadPool::ThreadPool(int threads)
    : threads_(std::max(1, threads)), shares_(std::make_unique<Share[]>(threads_)) {
  for (int t = 1; t < threads_; ++t) workers_.emplace_back([this, t] { Worker(t); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_.store(true);
    generation_.fetch_add(1);
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::Work(uint32_t generation, int thread) {
  const Job& job = jobs_[generation & 1];
  uint64_t v = claim_.load(std::memory_order_acquire);
  for (;;) {
    // The claim succeeds only while the job is still `generation`: a late worker whose job has
    // ended (and whose slot may be rewritten) fails the compare and reads nothing further.
    if (static_cast<uint32_t>(v >> 32) != generation) return;
    int64_t task = static_cast<int64_t>(v & 0xffffffffu);
    if (task >= job.tasks.load(std::memory_order_relaxed)) return;
    if (!claim_.compare_exchange_weak(v, v + 1, std::memory_order_acq_rel)) continue;
    (*job.fn.load(std::memory_order_relaxed))(task, thread);
    done_.fetch_add(1, std::memory_order_acq_rel);
    v = claim_.load(std::memory_order_acquire);
  }
}

void ThreadPool::Worker(int thread) {
  uint32_t seen = 0;
  for (;;) {
    uint32_t gen = generation_.load(std::memory_order_acquire);
    int spins = 0;
    while (gen == seen) {
      if (++spins < kSpins) {
        Pause();
      } else {
        std::unique_lock<std::mutex> lock(mutex_);
        sleepers_.fetch_add(1);
        wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
        sleepers_.fetch_sub(1);
        spins = 0;
      }
      gen = generation_.load(std::memory_order_acquire);
    }
    seen = gen;
    if (stop_.load()) return;
    Work(gen, thread);
  }
}

void ThreadPool::Run(int64_t tasks, const std::function<void(int64_t, int)>& fn) {
  if (tasks <= 0) return;
  if (threads_ == 1 || tasks == 1) {
    for (int64_t t = 0; t < tasks; ++t) fn(t, 0);
    return;
  }
  const uint32_t generation = generation_.load(std::memory_order_relaxed) + 1;
  Job& job = jobs_[generation & 1];
  job.tasks.store(tasks, std::memory_order_relaxed);
  job.fn.store(&fn, std::memory_order_relaxed);
  done_.store(0, std::memory_order_relaxed);
  claim_.store(static_cast<uint64_t>(generation) << 32, std::memory_order_release);
  {
    // The lock orders the publication against a worker that is about to sleep.
    std::lock_guard<std::mutex> lock(mutex_);
    generation_.store(generation, std::memory_order_release);
  }
  if (sleepers_.load() > 0) wake_.notify_all();
  Work(generation, 0);
  while (done_.load(std::memory_order_acquire) != tasks) Pause();
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t, int)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  int64_t units = (n + grain - 1) / grain;
  int64_t parts = std::min<int64_t>(units, threads_ == 1 ? 1 : 4 * threads_);
  int64_t per = (units + parts - 1) / parts;
  Run(parts, [&](int64_t part, int thread) {
    int64_t begin = part * per * grain;
    int64_t end = std::min(n, (part + 1) * per * grain);
    if (begin < end) fn(begin, end, thread);
  });
}

void ThreadPool::ForEachAffine(int64_t n, const std::function<void(int64_t, int)>& fn) {
  if (n <= 0) return;
  if (threads_ == 1 || n == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i, 0);
    return;
  }
  // Each share's items not taken yet, [front, back): high and low 32 bits of one word, so that
  // its owner (front) and the others (back) never take the same item. (Run publishes these
  // stores to the workers.)
  const int shares = threads_;
  for (int t = 0; t < shares; ++t) {
    const uint64_t begin = static_cast<uint64_t>(n * t / shares);
    const uint64_t end = static_cast<uint64_t>(n * (t + 1) / shares);
    shares_[t].left.store(begin << 32 | end, std::memory_order_relaxed);
  }
  auto take = [&](int share, bool front) -> int64_t {
    std::atomic<uint64_t>& left = shares_[share].left;
    uint64_t v = left.load(std::memory_order_relaxed);
    for (;;) {
      const uint64_t begin = v >> 32, end = v & 0xffffffffu;
      if (begin >= end) return -1;
      const uint64_t next = front ? (begin + 1) << 32 | end : begin << 32 | (end - 1);
      if (left.compare_exchange_weak(v, next, std::memory_order_relaxed)) {
        return static_cast<int64_t>(front ? begin : end - 1);
      }
    }
  };
  // One task per thread; a thread that runs a second one (its peer was late) only helps.
  Run(shares, [&](int64_t, int thread) {
    for (int64_t i; (i = take(thread, true)) >= 0;) fn(i, thread);
    for (int k = 1; k < shares; ++k) {
      const int other = (thread + k) % shares;
      for (int64_t i; (i = take(other, false)) >= 0;) fn(i, thread);
    }
  });
}

}  // namespace gizllm
