// gizllm bench: offline serving benchmark. Keeps `concurrency` requests in flight on one engine
// and reports output tokens/s, time to first token and inter-token latency (p50, p99), the
// prefix hit rate and preemptions.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cli/model_options.h"
#include "core/progress.h"
#include "engine/engine.h"
#include "ops/backend.h"
#include "tokenizer/tokenizer.h"

namespace gizllm::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct BenchOptions {
  ModelOptions model;
  int64_t requests = 32;
  int64_t prompt_tokens = 128;
  int64_t output_tokens = 128;
  int32_t concurrency = 16;
  int64_t rows = 256;
  std::string prompts;  // JSONL file
  bool json = false;
  uint64_t seed = 1;
  float temperature = 0.0f;
  float top_p = 1.0f;
  bool host_sampling = false;
  bool warm = true;
};

// Prompts from a JSONL file: each line {"prompt": "text"} (tokenized) or {"tokens": [ids]}.
Expected<std::vector<std::vector<int32_t>>> ReadPrompts(const std::string& path,
                                                        const std::string& model_dir) {
  std::ifstream in(path);
  if (!in) return NotFound(path + ": cannot open");
  std::vector<std::vector<int32_t>> prompts;
  std::optional<Tokenizer> tokenizer;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(n);
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return InvalidArgument(where + ": not a JSON object");
    if (j.contains("tokens") && j["tokens"].is_array()) {
      std::vector<int32_t> ids;
      for (const auto& t : j["tokens"]) {
        if (!t.is_number_integer()) return InvalidArgument(where + ": tokens: expected integers");
        ids.push_back(t.get<int32_t>());
      }
      prompts.push_back(std::move(ids));
    } else if (j.contains("prompt") && j["prompt"].is_string()) {
      if (!tokenizer) {
        auto loaded = Tokenizer::Load(model_dir);
        if (!loaded.ok()) return loaded.status();
        tokenizer = std::move(*loaded);
      }
      auto ids = tokenizer->Encode(j["prompt"].get<std::string>());
      if (!ids.ok()) return ids.status().Annotate(where);
      prompts.push_back(std::move(*ids));
    } else {
      return InvalidArgument(where + ": expected a \"prompt\" string or a \"tokens\" array");
    }
  }
  if (prompts.empty()) return InvalidArgument(path + ": no prompts");
  return prompts;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const double rank = p / 100.0 * (v.size() - 1);
  const size_t lo = static_cast<size_t>(rank);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (rank - lo);
}

std::string BarText(int64_t done, int64_t total, int64_t tokens, double seconds) {
  char text[96];
  std::snprintf(text, sizeof(text), "%lld/%lld requests, %.1f tokens/s ",
                static_cast<long long>(done), static_cast<long long>(total),
                seconds > 0 ? tokens / seconds : 0.0);
  return text;
}

int RunBench(const BenchOptions& o) {
  if (o.requests < 1) return Fail("bench --requests: expected >= 1");
  if (o.output_tokens < 1) return Fail("bench --output-tokens: expected >= 1");
  if (o.concurrency < 1) return Fail("bench --concurrency: expected >= 1");
  if (o.prompts.empty() && o.prompt_tokens < 1) return Fail("bench --prompt-tokens: expected >= 1");
  auto loaded = o.model.Load(!o.json);
  if (!loaded.ok()) return Fail(loaded.status().message());
  Model& model = **loaded;

  std::vector<std::vector<int32_t>> prompts;
  if (!o.prompts.empty()) {
    auto read = ReadPrompts(o.prompts, ResolveModelDir(o.model.model));
    if (!read.ok()) return Fail(read.status().message());
    prompts = std::move(*read);
  } else {
    // Random tokens past the first 16 ids (special tokens in most vocabularies).
    std::mt19937_64 rng(o.seed);
    const int64_t vocab = model.arch().vocab;
    for (int64_t i = 0; i < o.requests; ++i) {
      std::vector<int32_t> p(o.prompt_tokens);
      for (int32_t& t : p) t = static_cast<int32_t>(16 + rng() % (vocab - 16));
      prompts.push_back(std::move(p));
    }
  }
  int64_t longest = 0;
  for (const auto& p : prompts) longest = std::max<int64_t>(longest, p.size());

  EngineOptions options;
  options.slots = o.concurrency;
  options.context = longest + o.output_tokens;
  options.rows = std::max<int64_t>(o.rows, o.concurrency);
  // Room for every slot's full context.
  options.kv_budget_bytes = static_cast<int64_t>(o.concurrency) *
                            ((options.context + kPage - 1) / kPage) * model.PageBytes();
  options.device_sampling = !o.host_sampling;
  auto created = Engine::Create(&model, options);
  if (!created.ok()) return Fail(created.status().message());
  Engine& engine = **created;
  if (o.warm) {
    Status warm = engine.Warm();
    if (!warm.ok()) return Fail("warm-up: " + warm.message());
  }

  struct Timing {
    Clock::time_point added;
    Clock::time_point last;
    bool first = false;
  };
  std::map<int64_t, Timing> timing;
  std::vector<double> ttft, itl;  // seconds
  int64_t next = 0, done = 0, tokens = 0;
  const auto start = Clock::now();
  auto drawn = start;
  ProgressLine bar(stderr);
  auto add = [&]() -> Status {
    Request r;
    r.prompt = prompts[next % prompts.size()];
    r.limit = o.output_tokens;
    r.sampling.temperature = o.temperature;
    r.sampling.top_p = o.top_p;
    r.sampling.seed = static_cast<uint64_t>(next);
    r.stop = std::vector<int32_t>{};  // every request produces exactly output_tokens
    ++next;
    GZ_ASSIGN_OR_RETURN(int64_t id, engine.Add(std::move(r)));
    timing[id].added = Clock::now();
    return Status::Ok();
  };
  while (done < o.requests) {
    while (next < o.requests && next - done < o.concurrency) {
      Status s = add();
      if (!s.ok()) return Fail(s.message());
    }
    auto progress = engine.Advance();
    if (!progress.ok()) return Fail(progress.status().message());
    const auto now = Clock::now();
    for (const Progress& p : *progress) {
      if (!p.status.ok())
        return Fail("bench: request " + std::to_string(p.id) + ": " + p.status.message());
      Timing& t = timing[p.id];
      if (!p.tokens.empty()) {
        if (!t.first) {
          t.first = true;
          ttft.push_back(std::chrono::duration<double>(now - t.added).count());
        } else {
          itl.push_back(std::chrono::duration<double>(now - t.last).count());
        }
        t.last = now;
        tokens += static_cast<int64_t>(p.tokens.size());
      }
      if (!p.end.empty()) {
        ++done;
        timing.erase(p.id);
      }
    }
    // The bar redraws at most ten times a second.
    if (!o.json && (now - drawn > std::chrono::milliseconds(100) || done == o.requests)) {
      drawn = now;
      bar.Update(
          done, o.requests,
          BarText(done, o.requests, tokens, std::chrono::duration<double>(now - start).count()));
    }
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const EngineStats& stats = engine.stats();
  const double hit_rate =
      stats.prompt_tokens > 0 ? static_cast<double>(stats.cached_tokens) / stats.prompt_tokens : 0;
  nlohmann::json out = {
      {"model", model.dir()},
      {"backend", model.backend().Describe()},
      {"requests", o.requests},
      {"concurrency", o.concurrency},
      {"prompt_tokens", o.prompts.empty() ? o.prompt_tokens : -1},
      {"output_tokens", o.output_tokens},
      {"seconds", seconds},
      {"generated_tokens", tokens},
      {"output_tokens_per_s", tokens / seconds},
      {"ttft_p50_ms", 1e3 * Percentile(ttft, 50)},
      {"ttft_p99_ms", 1e3 * Percentile(ttft, 99)},
      {"itl_p50_ms", 1e3 * Percentile(itl, 50)},
      {"itl_p99_ms", 1e3 * Percentile(itl, 99)},
      {"prefix_hit_rate", hit_rate},
      {"preemptions", stats.preemptions},
      {"steps", stats.steps},
      {"rows", stats.rows},
  };
  if (o.json) {
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf("model            %s on %s\n", model.dir().c_str(),
                model.backend().Describe().c_str());
    std::printf("requests         %lld at concurrency %d, %lld output tokens each\n",
                static_cast<long long>(o.requests), o.concurrency,
                static_cast<long long>(o.output_tokens));
    std::printf("output           %.1f tokens/s (%lld tokens in %.2f s)\n", tokens / seconds,
                static_cast<long long>(tokens), seconds);
    std::printf("first token      p50 %.1f ms, p99 %.1f ms\n", 1e3 * Percentile(ttft, 50),
                1e3 * Percentile(ttft, 99));
    std::printf("between tokens   p50 %.1f ms, p99 %.1f ms\n", 1e3 * Percentile(itl, 50),
                1e3 * Percentile(itl, 99));
    std::printf("prefix hits      %.1f%% of prompt tokens\n", 100 * hit_rate);
    std::printf("preemptions      %lld\n", static_cast<long long>(stats.preemptions));
  }
  return 0;
}

}  // namespace

void AddBenchCommand(CLI::App& app, CommandContext& ctx) {
  auto* cmd = app.add_subcommand("bench", "Offline serving benchmark: throughput and latencies");
  auto o = std::make_shared<BenchOptions>();
  o->model.Add(cmd);
  cmd->add_option("--requests,-n", o->requests, "Requests in all")->default_val(32);
  cmd->add_option("--prompt-tokens,-p", o->prompt_tokens, "Tokens of each random prompt")
      ->default_val(128);
  cmd->add_option("--output-tokens,-o", o->output_tokens, "Tokens each request generates")
      ->default_val(128);
  cmd->add_option("--concurrency,-c", o->concurrency, "Requests in flight (the engine's slots)")
      ->default_val(16);
  cmd->add_option("--rows", o->rows, "Most rows one step reads")->default_val(256);
  cmd->add_option("--prompts", o->prompts,
                  "JSONL file of prompts: {\"prompt\": text} or {\"tokens\": [ids]} per line");
  cmd->add_option("--seed", o->seed, "Seed of the random prompts")->default_val(1);
  cmd->add_option("--temperature", o->temperature, "Sampling temperature (0: greedy)")
      ->default_val(0.0f)
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--top-p", o->top_p, "Nucleus sampling mass")
      ->default_val(1.0f)
      ->check(CLI::Range(0.0f, 1.0f));
  cmd->add_flag("--host-sampling", o->host_sampling,
                "Pick tokens on the host from copied logits, even where the device can");
  cmd->add_flag("!--no-warm", o->warm, "Skip Engine::Warm before the timed run");
  cmd->add_flag("--json", o->json, "One JSON object on stdout");
  cmd->callback([&ctx, o] { ctx.exit_code = RunBench(*o); });
}

}  // namespace gizllm::cli
