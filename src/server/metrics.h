// Server metrics in Prometheus' text format (/metrics): requests by endpoint and status, tokens
// in and out, time to first token and inter-token latency histograms, and the engine's figures.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "server/generator.h"

namespace gizllm::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);  // upper bounds of the buckets, ascending
  void Observe(double value);
  // Appends the metric `name` (buckets, sum, count) to `out`.
  void Write(const std::string& name, const std::string& help, std::string* out) const;
  int64_t count() const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mutex_;
  std::vector<int64_t> counts_;  // [bounds + 1]: the last one is +Inf
  double sum_ = 0;
  int64_t count_ = 0;
};

// What the engine loop knows beyond the generator's figures.
struct LoopStats {
  int64_t queued = 0;  // submitted, not yet given to the generator
  int64_t active = 0;  // given to the generator, not finished
  GeneratorStats generator;
};

class Metrics {
 public:
  Metrics();
  void CountRequest(const std::string& endpoint, int status);
  void AddTokens(int64_t prompt, int64_t cached, int64_t completion);
  void CountFinish(const std::string& reason);
  // The embed and rerank tasks (server/encoder_batcher.h): one encoder batch of the sequences of
  // `requests` requests, and the requests waiting for a batch.
  void CountEncoderBatch(int64_t requests, int64_t sequences, int64_t tokens);
  void SetEncoderQueued(int64_t requests) { encoder_queued_ = requests; }

  Histogram& time_to_first_token() { return time_to_first_token_; }
  Histogram& inter_token_latency() { return inter_token_latency_; }
  Histogram& request_latency() { return request_latency_; }

  std::string Render(const LoopStats& loop) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, int64_t> requests_;  // (endpoint, status) -> count
  std::map<std::string, int64_t> finishes_;                  // finish reason -> count
  std::atomic<int64_t> prompt_tokens_{0};
  std::atomic<int64_t> cached_tokens_{0};
  std::atomic<int64_t> completion_tokens_{0};
  std::atomic<int64_t> encoder_batches_{0};
  std::atomic<int64_t> encoder_batch_requests_{0};
  std::atomic<int64_t> encoder_batch_sequences_{0};
  std::atomic<int64_t> encoder_batch_tokens_{0};
  std::atomic<int64_t> encoder_queued_{0};
  Histogram time_to_first_token_;
  Histogram inter_token_latency_;
  Histogram request_latency_;
};

}  // namespace gizllm::server
