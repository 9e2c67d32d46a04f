#include "server/metrics.h"

#include <cstdio>

namespace gizllm::server {
namespace {

std::string Number(double x) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9g", x);
  return buf;
}

void Header(const std::string& name, const std::string& help, const char* type, std::string* out) {
  *out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void Scalar(const std::string& name, const std::string& help, const char* type, double value,
            std::string* out) {
  Header(name, help, type, out);
  *out += name + " " + Number(value) + "\n";
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double value) {
  size_t b = 0;
  while (b < bounds_.size() && value > bounds_[b]) ++b;
  std::lock_guard lock(mutex_);
  ++counts_[b];
  sum_ += value;
  ++count_;
}

int64_t Histogram::count() const {
  std::lock_guard lock(mutex_);
  return count_;
}

void Histogram::Write(const std::string& name, const std::string& help, std::string* out) const {
  Header(name, help, "histogram", out);
  std::lock_guard lock(mutex_);
  int64_t cumulative = 0;
  for (size_t b = 0; b <= bounds_.size(); ++b) {
    cumulative += counts_[b];
    std::string le = b < bounds_.size() ? Number(bounds_[b]) : "+Inf";
    *out += name + "_bucket{le=\"" + le + "\"} " + std::to_string(cumulative) + "\n";
  }
  *out += name + "_sum " + Number(sum_) + "\n";
  *out += name + "_count " + std::to_string(count_) + "\n";
}

Metrics::Metrics()
    : time_to_first_token_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                            2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}),
      inter_token_latency_({0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
                            0.075, 0.1,    0.15,  0.2,  0.3,   0.4,  0.5,   0.75, 1.0,  2.5}),
      request_latency_({0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0}) {}

void Metrics::CountRequest(const std::string& endpoint, int status) {
  std::lock_guard lock(mutex_);
  ++requests_[{endpoint, status}];
}

void Metrics::AddTokens(int64_t prompt, int64_t cached, int64_t completion) {
  prompt_tokens_ += prompt;
  cached_tokens_ += cached;
  completion_tokens_ += completion;
}

void Metrics::CountFinish(const std::string& reason) {
  std::lock_guard lock(mutex_);
  ++finishes_[reason];
}

void Metrics::CountEncoderBatch(int64_t requests, int64_t sequences, int64_t tokens) {
  ++encoder_batches_;
  encoder_batch_requests_ += requests;
  encoder_batch_sequences_ += sequences;
  encoder_batch_tokens_ += tokens;
}

std::string Metrics::Render(const LoopStats& loop) const {
  std::string out;
  Header("gizllm_requests_total", "HTTP requests by endpoint and status.", "counter", &out);
  {
    std::lock_guard lock(mutex_);
    for (const auto& [key, count] : requests_) {
      out += "gizllm_requests_total{endpoint=\"" + key.first + "\",status=\"" +
             std::to_string(key.second) + "\"} " + std::to_string(count) + "\n";
    }
    Header("gizllm_request_finish_total", "Generations by finish reason.", "counter", &out);
    for (const auto& [reason, count] : finishes_) {
      out +=
          "gizllm_request_finish_total{reason=\"" + reason + "\"} " + std::to_string(count) + "\n";
    }
  }
  Scalar("gizllm_prompt_tokens_total", "Prompt tokens of finished requests.", "counter",
         prompt_tokens_, &out);
  Scalar("gizllm_cached_prompt_tokens_total",
         "Prompt tokens of finished requests that a slot or stored prefix already held.", "counter",
         cached_tokens_, &out);
  Scalar("gizllm_generation_tokens_total", "Tokens generated.", "counter", completion_tokens_,
         &out);
  Scalar("gizllm_encoder_batches_total", "Encoder batches run (embed and rerank tasks).", "counter",
         static_cast<double>(encoder_batches_), &out);
  Scalar("gizllm_encoder_batch_requests_total",
         "Requests in encoder batches, summed over batches (a request that spans batches counts "
         "in each).",
         "counter", static_cast<double>(encoder_batch_requests_), &out);
  Scalar("gizllm_encoder_batch_sequences_total", "Texts or pairs in encoder batches.", "counter",
         static_cast<double>(encoder_batch_sequences_), &out);
  Scalar("gizllm_encoder_batch_tokens_total", "Tokens in encoder batches.", "counter",
         static_cast<double>(encoder_batch_tokens_), &out);
  Scalar("gizllm_encoder_queue_length", "Encoder requests waiting for a batch.", "gauge",
         static_cast<double>(encoder_queued_), &out);
  time_to_first_token_.Write("gizllm_time_to_first_token_seconds",
                             "Time from a request's arrival to its first token.", &out);
  inter_token_latency_.Write("gizllm_inter_token_latency_seconds",
                             "Time between consecutive tokens of a request.", &out);
  request_latency_.Write("gizllm_request_duration_seconds",
                         "Time from a request's arrival to its last token.", &out);
  const GeneratorStats& g = loop.generator;
  Scalar("gizllm_queue_length", "Requests waiting: not yet in a slot.", "gauge",
         static_cast<double>(loop.queued + g.waiting), &out);
  Scalar("gizllm_requests_running", "Requests in a slot.", "gauge", g.running, &out);
  Scalar("gizllm_slots", "Slots of the engine.", "gauge", g.slots, &out);
  Scalar("gizllm_kv_pages_used", "KV pages in use.", "gauge", static_cast<double>(g.kv_pages_used),
         &out);
  Scalar("gizllm_kv_pages_total", "KV pages in the pool.", "gauge",
         static_cast<double>(g.kv_pages_total), &out);
  int64_t prompt = g.prompt_tokens_read + g.prompt_tokens_cached;
  Scalar("gizllm_prefix_hit_rate",
         "Share of prompt tokens taken from a slot or stored prefix instead of read.", "gauge",
         prompt > 0 ? static_cast<double>(g.prompt_tokens_cached) / prompt : 0.0, &out);
  Scalar("gizllm_engine_prompt_tokens_read_total", "Prompt tokens the model read.", "counter",
         static_cast<double>(g.prompt_tokens_read), &out);
  Scalar("gizllm_engine_prompt_tokens_cached_total",
         "Prompt tokens taken from a slot or stored prefix.", "counter",
         static_cast<double>(g.prompt_tokens_cached), &out);
  Scalar("gizllm_preemptions_total", "Requests sent back to wait for want of KV pages.", "counter",
         static_cast<double>(g.preemptions), &out);
  Scalar("gizllm_engine_steps_total", "Steps the engine ran.", "counter",
         static_cast<double>(g.steps), &out);
  Scalar("gizllm_grammar_masks_shared_total",
         "Token masks a constrained request took from another request of the same grammar in "
         "the same parse state instead of computing them.",
         "counter", static_cast<double>(g.grammar_masks_shared), &out);
  // The expert cache (a mixture-of-experts model whose experts do not all fit the device).
  const ExpertCacheStats& cache = g.expert_cache;
  Scalar("gizllm_expert_cache_slots",
         "Expert slots of the device's expert cache (0: every expert on the device).", "gauge",
         static_cast<double>(cache.slots), &out);
  Scalar("gizllm_expert_cache_hits_total", "Experts a step picked that a slot held.", "counter",
         static_cast<double>(cache.hits), &out);
  Scalar("gizllm_expert_cache_misses_total",
         "Experts a step picked that were read from the file into a slot.", "counter",
         static_cast<double>(cache.misses), &out);
  Scalar("gizllm_expert_cache_read_seconds_total",
         "Time spent reading missed experts from the file into staging for their slots.", "counter",
         cache.read_ms / 1e3, &out);
  // Per drafter: drafts read as extra rows, drafts kept, the steps that carried any, and the
  // drafts kept per step (of all steps): the tokens a step gains from drafting.
  struct Family {
    const char* name;
    const char* help;
    const char* type;
    double (*value)(const DrafterStats&, int64_t steps);
  };
  const Family families[] = {
      {"gizllm_drafts_total", "Drafts read as extra rows of a step.", "counter",
       [](const DrafterStats& d, int64_t) { return static_cast<double>(d.drafted); }},
      {"gizllm_drafts_accepted_total", "Drafts kept: tokens gained beyond one a step.", "counter",
       [](const DrafterStats& d, int64_t) { return static_cast<double>(d.accepted); }},
      {"gizllm_draft_steps_total", "Steps that carried drafts.", "counter",
       [](const DrafterStats& d, int64_t) { return static_cast<double>(d.steps); }},
      {"gizllm_drafts_accepted_per_step", "Drafts kept per engine step, since the start.", "gauge",
       [](const DrafterStats& d, int64_t steps) {
         return steps > 0 ? static_cast<double>(d.accepted) / steps : 0.0;
       }},
  };
  for (const Family& f : families) {
    if (g.drafters.empty()) break;
    Header(f.name, f.help, f.type, &out);
    for (const DrafterStats& d : g.drafters) {
      out += std::string(f.name) + "{drafter=\"" + d.name + "\"} " + Number(f.value(d, g.steps)) +
             "\n";
    }
  }
  return out;
}

}  // namespace gizllm::server
