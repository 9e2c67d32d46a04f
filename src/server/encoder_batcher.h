// EncoderBatcher: runs the encoder requests of a server (the embed and rerank tasks) on its own
// thread, gathering the sequences of every request waiting into shared batches of at most a
// token budget.
//
// Why: an encoder's matmuls are cheap per row only when they see many rows; requests of a few
// short texts each, run one by one, leave the device idle. No request is held back to wait for
// others: while a batch runs, the requests that arrive queue, and the next batch takes them (in
// the order they came, whole sequences, as many as the budget holds; a request may span
// batches). Packed batches (model/encoder.h) compute each sequence as it would be alone, so an
// answer does not depend on its neighbours (bit for bit on the CPU; on CUDA the matmul library
// may pick another algorithm for another row count).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "server/embedding_request.h"
#include "server/encoder_model.h"
#include "server/metrics.h"

namespace gizllm::server {

class EncoderBatcher {
 public:
  // Called once a job's sequences all have results, or with the error of its batch; on the
  // batcher's thread.
  using Done = std::function<void(Expected<EncoderResults>)>;

  // `model` and `metrics` must outlive the batcher. A batch holds at most `batch_tokens` tokens
  // (a single longer sequence runs alone).
  EncoderBatcher(EncoderModel& model, Metrics& metrics, int64_t batch_tokens);
  ~EncoderBatcher();  // Stop()

  void Start();
  // Finishes the batch that runs and ends the thread; jobs still queued hear an error.
  void Stop();
  // Queues a job's sequences (at least one).
  void Submit(std::vector<Encoding> sequences, Done done);

 private:
  struct Pending {
    std::vector<Encoding> sequences;
    size_t next = 0;      // the first sequence not yet in a batch
    size_t finished = 0;  // sequences with results
    EncoderResults results;
    bool failed = false;
    Done done;
  };
  // One job's sequences [first, end) in a batch.
  struct Part {
    std::shared_ptr<Pending> job;
    size_t first = 0, end = 0;
  };
  void Loop();
  // Takes the next batch's parts from the queue (the lock held).
  std::vector<Part> Take();
  // Runs the parts as one batch; where it fails and holds parts of several jobs, each part is
  // run alone so that one request's error stays its own.
  void Run(const std::vector<Part>& parts);
  // Stores a part's results (or error); calls the job's Done once it is complete.
  void Deliver(const Part& part, Expected<EncoderResults> results);

  EncoderModel& model_;
  Metrics& metrics_;
  const int64_t batch_tokens_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Pending>> queue_;  // guarded by mutex_
  bool stopping_ = false;                       // guarded by mutex_
  std::thread thread_;
};

}  // namespace gizllm::server
