#include "server/metrics.h"

#include <gtest/gtest.h>

namespace gizllm::server {
namespace {

TEST(Metrics, PrometheusText) {
  Metrics m;
  m.CountRequest("/v1/completions", 200);
  m.CountRequest("/v1/completions", 200);
  m.CountRequest("/v1/completions", 400);
  m.AddTokens(10, 4, 7);
  m.time_to_first_token().Observe(0.003);
  m.time_to_first_token().Observe(100);
  LoopStats loop;
  loop.queued = 2;
  loop.generator.waiting = 1;
  loop.generator.kv_pages_used = 5;
  loop.generator.prompt_tokens_read = 30;
  loop.generator.prompt_tokens_cached = 10;
  loop.generator.steps = 8;
  loop.generator.drafters.push_back({"lookup", 12, 6, 4});
  loop.generator.expert_cache = {/*slots=*/96, /*hits=*/300, /*misses=*/20, /*read_ms=*/1500};
  std::string text = m.Render(loop);
  EXPECT_NE(text.find("gizllm_expert_cache_slots 96\n"), std::string::npos);
  EXPECT_NE(text.find("gizllm_expert_cache_hits_total 300\n"), std::string::npos);
  EXPECT_NE(text.find("gizllm_expert_cache_misses_total 20\n"), std::string::npos);
  EXPECT_NE(text.find("gizllm_expert_cache_read_seconds_total 1.5\n"), std::string::npos);
  EXPECT_NE(text.find("gizllm_engine_steps_total 8\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE gizllm_drafts_total counter\n"), std::string::npos);
  EXPECT_NE(text.find("gizllm_drafts_total{drafter=\"lookup\"} 12\n"), std::string::npos);
  EXPECT_NE(text.find("gizllm_drafts_accepted_total{drafter=\"lookup\"} 6\n"), std::string::npos);
  EXPECT_NE(text.find("gizllm_draft_steps_total{drafter=\"lookup\"} 4\n"), std::string::npos);
  EXPECT_NE(text.find("gizllm_drafts_accepted_per_step{drafter=\"lookup\"} 0.75\n"),
            std::string::npos);
  EXPECT_NE(text.find("gizllm_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 2\n"),
            std::string::npos);
  EXPECT_NE(text.find("gizllm_requests_total{endpoint=\"/v1/completions\",status=\"400\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("gizllm_prompt_tokens_total 10\n"), std::string::npos);
  EXPECT_NE(text.find("gizllm_cached_prompt_tokens_total 4\n"), std::string::npos);
  EXPECT_NE(text.find("gizllm_generation_tokens_total 7\n"), std::string::npos);
  EXPECT_NE(text.find("gizllm_time_to_first_token_seconds_bucket{le=\"0.001\"} 0\n"),
            std::string::npos);
  EXPECT_NE(text.find("gizllm_time_to_first_token_seconds_bucket{le=\"0.005\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("gizllm_time_to_first_token_seconds_bucket{le=\"80\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("gizllm_time_to_first_token_seconds_bucket{le=\"+Inf\"} 2\n"),
            std::string::npos);
  EXPECT_NE(text.find("gizllm_time_to_first_token_seconds_count 2\n"), std::string::npos);
  EXPECT_NE(text.find("gizllm_queue_length 3\n"), std::string::npos);
  EXPECT_NE(text.find("gizllm_kv_pages_used 5\n"), std::string::npos);
  EXPECT_NE(text.find("gizllm_prefix_hit_rate 0.25\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE gizllm_inter_token_latency_seconds histogram\n"), std::string::npos);
}

}  // namespace
}  // namespace gizllm::server
