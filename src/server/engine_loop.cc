#include "server/engine_loop.h"

#include <vector>

namespace gizllm::server {

namespace {

GenerateProgress Ended(int64_t id) {
  GenerateProgress p;
  p.id = id;
  return p;
}

}  // namespace

EngineLoop::EngineLoop(Generator& generator, Metrics& metrics, int64_t max_pending)
    : generator_(generator), metrics_(metrics), max_pending_(max_pending) {}

EngineLoop::~EngineLoop() { Stop(); }

void EngineLoop::Start() {
  thread_ = std::thread([this] { Run(); });
}

void EngineLoop::Stop() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Expected<int64_t> EngineLoop::Submit(GenerateRequest request, ProgressFn on_progress) {
  int64_t ticket = 0;
  {
    std::lock_guard lock(mutex_);
    if (stop_) return ResourceExhausted("the server is shutting down");
    if (pending_ >= max_pending_) {
      return ResourceExhausted("the server has " + std::to_string(pending_) +
                               " requests pending, its limit; retry later");
    }
    ticket = next_ticket_++;
    ++pending_;
    ++queued_;
    commands_.push_back(
        Command{ticket, false, std::move(request), std::move(on_progress), Clock::now()});
  }
  wake_.notify_one();
  return ticket;
}

void EngineLoop::Cancel(int64_t ticket) {
  {
    std::lock_guard lock(mutex_);
    Command c;
    c.ticket = ticket;
    c.cancel = true;
    commands_.push_back(std::move(c));
  }
  wake_.notify_one();
}

LoopStats EngineLoop::Stats() const {
  std::lock_guard lock(mutex_);
  return LoopStats{queued_, pending_ - queued_, stats_};
}

void EngineLoop::Finish(int64_t id, const std::string& reason) {
  auto it = active_.find(id);
  if (it == active_.end()) return;
  Active& a = it->second;
  metrics_.AddTokens(a.prompt, a.cached, a.completion);
  metrics_.CountFinish(reason);
  metrics_.request_latency().Observe(
      std::chrono::duration<double>(Clock::now() - a.arrival).count());
  ticket_to_id_.erase(a.ticket);
  active_.erase(it);
  std::lock_guard lock(mutex_);
  --pending_;
}

void EngineLoop::Run() {
  bool busy = false;
  for (;;) {
    std::deque<Command> commands;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || !commands_.empty() || busy; });
      if (stop_) break;
      commands.swap(commands_);
    }
    for (Command& c : commands) {
      if (c.cancel) {
        auto t = ticket_to_id_.find(c.ticket);
        if (t == ticket_to_id_.end()) continue;  // finished already
        int64_t id = t->second;
        generator_.Cancel(id);
        Finish(id, "cancelled");
        continue;
      }
      {
        std::lock_guard lock(mutex_);
        --queued_;
      }
      int64_t prompt = static_cast<int64_t>(c.request.prompt.size());
      Expected<int64_t> id = generator_.Add(std::move(c.request));
      if (!id.ok()) {
        c.on_progress(GenerateProgress{}, id.status());
        std::lock_guard lock(mutex_);
        --pending_;
        continue;
      }
      active_[*id] = Active{c.ticket, std::move(c.on_progress), c.arrival, c.arrival, prompt};
      ticket_to_id_[c.ticket] = *id;
    }
    busy = generator_.Busy();
    if (busy) {
      Expected<std::vector<GenerateProgress>> step = generator_.Advance();
      if (!step.ok()) {
        // The generator is in an unknown state: every request it holds fails.
        std::vector<int64_t> ids;
        for (auto& [id, a] : active_) ids.push_back(id);
        for (int64_t id : ids) {
          active_[id].on_progress(Ended(id), step.status());
          generator_.Cancel(id);
          Finish(id, "error");
        }
      } else {
        Clock::time_point now = Clock::now();
        for (const GenerateProgress& p : *step) {
          auto it = active_.find(p.id);
          if (it == active_.end()) continue;
          Active& a = it->second;
          if (p.cached >= 0) a.cached = p.cached;
          if (!p.tokens.empty()) {
            double since = std::chrono::duration<double>(now - a.last_token).count();
            if (a.completion == 0) {
              metrics_.time_to_first_token().Observe(since);
              for (size_t i = 1; i < p.tokens.size(); ++i)
                metrics_.inter_token_latency().Observe(0);
            } else {
              double each = since / static_cast<double>(p.tokens.size());
              for (size_t i = 0; i < p.tokens.size(); ++i) {
                metrics_.inter_token_latency().Observe(each);
              }
            }
            a.completion += static_cast<int64_t>(p.tokens.size());
            a.last_token = now;
          }
          // A request that ended in an error (non-finite logits) fails alone.
          a.on_progress(p, p.status);
          if (!p.end.empty()) Finish(p.id, p.end);
        }
      }
      busy = generator_.Busy();
    }
    std::lock_guard lock(mutex_);
    stats_ = generator_.Stats();
  }
  // Stopping: every request still held fails.
  Status stopping = ResourceExhausted("the server is shutting down");
  for (auto& [id, a] : active_) a.on_progress(Ended(id), stopping);
  std::lock_guard lock(mutex_);
  for (Command& c : commands_) {
    if (!c.cancel) c.on_progress(GenerateProgress{}, stopping);
  }
  commands_.clear();
}

}  // namespace gizllm::server
