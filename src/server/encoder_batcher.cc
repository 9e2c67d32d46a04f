#include "server/encoder_batcher.h"

#include <algorithm>

namespace gizllm::server {

EncoderBatcher::EncoderBatcher(EncoderModel& model, Metrics& metrics, int64_t batch_tokens)
    : model_(model), metrics_(metrics), batch_tokens_(std::max<int64_t>(1, batch_tokens)) {}

EncoderBatcher::~EncoderBatcher() { Stop(); }

void EncoderBatcher::Start() {
  std::lock_guard lock(mutex_);
  if (thread_.joinable() || stopping_) return;
  thread_ = std::thread([this] { Loop(); });
}

void EncoderBatcher::Stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::deque<std::shared_ptr<Pending>> left;
  {
    std::lock_guard lock(mutex_);
    left.swap(queue_);
    metrics_.SetEncoderQueued(0);
  }
  for (auto& job : left) job->done(ResourceExhausted("the server is stopping"));
}

void EncoderBatcher::Submit(std::vector<Encoding> sequences, Done done) {
  auto job = std::make_shared<Pending>();
  job->sequences = std::move(sequences);
  job->done = std::move(done);
  {
    std::lock_guard lock(mutex_);
    if (stopping_) {
      job->done(ResourceExhausted("the server is stopping"));
      return;
    }
    queue_.push_back(std::move(job));
    metrics_.SetEncoderQueued(static_cast<int64_t>(queue_.size()));
  }
  wake_.notify_one();
}

std::vector<EncoderBatcher::Part> EncoderBatcher::Take() {
  std::vector<Part> parts;
  int64_t tokens = 0;
  while (!queue_.empty()) {
    std::shared_ptr<Pending>& job = queue_.front();
    Part part{job, job->next, job->next};
    while (part.end < job->sequences.size()) {
      const int64_t n = static_cast<int64_t>(job->sequences[part.end].ids.size());
      if (tokens > 0 && tokens + n > batch_tokens_) break;
      tokens += n;
      ++part.end;
    }
    if (part.end > part.first) parts.push_back(part);
    job->next = part.end;
    if (job->next < job->sequences.size()) break;  // the budget is spent
    queue_.pop_front();
  }
  metrics_.SetEncoderQueued(static_cast<int64_t>(queue_.size()));
  return parts;
}

void EncoderBatcher::Loop() {
  for (;;) {
    std::vector<Part> parts;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      parts = Take();
    }
    Run(parts);
  }
}

void EncoderBatcher::Run(const std::vector<Part>& parts) {
  std::vector<Encoding> batch;
  int64_t tokens = 0;
  for (const Part& p : parts) {
    for (size_t i = p.first; i < p.end; ++i) {
      batch.push_back(p.job->sequences[i]);
      tokens += static_cast<int64_t>(batch.back().ids.size());
    }
  }
  metrics_.CountEncoderBatch(static_cast<int64_t>(parts.size()), static_cast<int64_t>(batch.size()),
                             tokens);
  Expected<EncoderResults> results = RunEncoder(model_, batch);
  if (!results.ok() && parts.size() > 1) {
    for (const Part& p : parts) {
      std::span<const Encoding> own(p.job->sequences.data() + p.first, p.end - p.first);
      Deliver(p, RunEncoder(model_, own));
    }
    return;
  }
  if (!results.ok()) {
    Deliver(parts[0], results.status());
    return;
  }
  // Each part's slice of the batch's results.
  size_t at = 0;
  for (const Part& p : parts) {
    const size_t n = p.end - p.first;
    EncoderResults own;
    if (!results->vectors.empty()) {
      own.vectors.assign(std::make_move_iterator(results->vectors.begin() + at),
                         std::make_move_iterator(results->vectors.begin() + at + n));
    }
    if (!results->scores.empty()) {
      own.scores.assign(results->scores.begin() + at, results->scores.begin() + at + n);
    }
    at += n;
    Deliver(p, std::move(own));
  }
}

void EncoderBatcher::Deliver(const Part& part, Expected<EncoderResults> results) {
  Pending& job = *part.job;
  const size_t n = part.end - part.first;
  if (job.failed) return;
  if (!results.ok()) {
    job.failed = true;
    job.done(results.status());
    return;
  }
  const bool vectors = model_.task() == Task::kEmbed;
  if ((vectors ? results->vectors.size() : results->scores.size()) != n) {
    job.failed = true;
    job.done(Internal("the encoder gave " +
                      std::to_string(vectors ? results->vectors.size() : results->scores.size()) +
                      " results for " + std::to_string(n) + " sequences"));
    return;
  }
  if (vectors) {
    job.results.vectors.resize(job.sequences.size());
    for (size_t i = 0; i < n; ++i)
      job.results.vectors[part.first + i] = std::move(results->vectors[i]);
  } else {
    job.results.scores.resize(job.sequences.size());
    for (size_t i = 0; i < n; ++i) job.results.scores[part.first + i] = results->scores[i];
  }
  job.finished += n;
  if (job.finished == job.sequences.size()) job.done(std::move(job.results));
}

}  // namespace gizllm::server
