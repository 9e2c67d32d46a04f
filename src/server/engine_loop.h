// The one thread that advances the generator. HTTP threads submit requests and cancellations
// through a queue; the loop adds them, runs steps while any request is busy, and calls each
// request's function with its progress (on the loop's thread: the function must be quick).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "server/generator.h"
#include "server/metrics.h"

namespace gizllm::server {

// `status` not ok: the request failed and ends here.
using ProgressFn = std::function<void(const GenerateProgress& progress, const Status& status)>;

class EngineLoop {
 public:
  // max_pending: requests submitted and not finished beyond which Submit refuses.
  EngineLoop(Generator& generator, Metrics& metrics, int64_t max_pending);
  ~EngineLoop();
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  void Start();
  // Fails every pending request and joins the thread.
  void Stop();

  // Queues a request; returns its ticket, or ResourceExhausted when the queue is full.
  Expected<int64_t> Submit(GenerateRequest request, ProgressFn on_progress);
  // Ends a request; its function is not called again once the loop has seen the cancellation.
  void Cancel(int64_t ticket);

  LoopStats Stats() const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Command {
    int64_t ticket = 0;
    bool cancel = false;
    GenerateRequest request;
    ProgressFn on_progress;
    Clock::time_point arrival;
  };
  struct Active {
    int64_t ticket = 0;
    ProgressFn on_progress;
    Clock::time_point arrival;
    Clock::time_point last_token;
    int64_t prompt = 0;
    int64_t cached = 0;
    int64_t completion = 0;
  };

  void Run();
  void Finish(int64_t id, const std::string& reason);

  Generator& generator_;
  Metrics& metrics_;
  const int64_t max_pending_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Command> commands_;  // guarded by mutex_
  bool stop_ = false;             // guarded by mutex_
  int64_t next_ticket_ = 1;       // guarded by mutex_
  int64_t pending_ = 0;           // guarded by mutex_: submitted, not finished
  int64_t queued_ = 0;            // guarded by mutex_: submitted, not given to the generator
  GeneratorStats stats_;          // guarded by mutex_: as of the last step

  // Owned by the loop's thread.
  std::unordered_map<int64_t, Active> active_;         // generator id -> request
  std::unordered_map<int64_t, int64_t> ticket_to_id_;  // ticket -> generator id
  std::thread thread_;
};

}  // namespace gizllm::server
