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
#include <thread>
#include <vector>

#include "cli/draft_options.h"
#include "cli/grammar_file.h"
#include "cli/model_options.h"
#include "cli/pictures.h"
#include "core/progress.h"
#include "engine/engine.h"
#include "engine/kv_sizing.h"
#include "ops/backend.h"
#include "tokenizer/tokenizer.h"

namespace gizllm::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct BenchOptions {
  ModelOptions model;
  DraftOptions draft;
  int64_t requests = 32;
  int64_t prompt_tokens = 128;
  int64_t output_tokens = 128;
  int32_t concurrency = 16;
  int64_t rows = 0;  // 0: StepRows' default
  int64_t kv_mib = 0;  // 0: DefaultKvBudget
  std::string prompts;  // JSONL file
  bool json = false;
  uint64_t seed = 1;
  float temperature = 0.0f;
  float top_p = 1.0f;
  bool host_sampling = false;
  bool warm = true;
  double rate = 0.0;       // arrivals a second (0: keep `concurrency` in flight)
  int32_t background = 0;  // sequences decoding from the start, beside the requests
  int64_t background_tokens = 512;
  std::string trace;       // JSON lines, one a step
  bool trace_ops = false;  // per-op times (Backend::SetOpTrace)
  std::string json_schema;  // every request's answer follows this JSON Schema file
  std::string grammar;      // or this GBNF file
  std::vector<std::string> images;  // every request is a chat with these pictures
  std::string image_prompt = "Describe the picture.";
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
  if (!o.images.empty() &&
      (!o.prompts.empty() || o.rate > 0 || o.background > 0 || o.concurrency != 1))
    return Fail("bench --image: runs one request at a time (--concurrency 1), without "
                "--prompts, --rate or --background");
  auto loaded = o.model.LoadRunner(!o.json);
  if (!loaded.ok()) return Fail(loaded.status().message());
  LoadedModel& model = **loaded;

  // --image: each request's prompt is made inside its timed span (files read, pictures decoded
  // and preprocessed, the tower run), from a tower loaded once; one made here sizes the engine.
  std::unique_ptr<PictureReader> pictures;
  std::optional<Tokenizer> picture_tokenizer;
  std::vector<double> picture_s;  // seconds from the files to the request's prompt, each request
  std::vector<double> prepare_s, decode_s, tower_s, add_s;  // its parts, and Engine::Add's time
  auto picture_prompt = [&]() -> Expected<PicturePrompt> {
    PictureTimes times;
    auto p = PicturePromptTokens(*pictures, model.first(), *picture_tokenizer, o.image_prompt, o.images,
                                 {}, &times);
    prepare_s.push_back(times.prepare);
    decode_s.push_back(times.decode);
    tower_s.push_back(times.tower);
    return p;
  };
  std::vector<std::vector<int32_t>> prompts;
  if (!o.images.empty()) {
    auto reader = PictureReader::Load(model.dir(), model.shared_backend());
    if (!reader.ok()) return Fail("bench --image: " + reader.status().message());
    pictures = std::move(*reader);
    pictures->KeepRowsOnDevice(model.stages() == 1);  // a pipeline's stages read host rows
    auto tokenizer = Tokenizer::Load(ResolveModelDir(o.model.model));
    if (!tokenizer.ok()) return Fail("bench --image: " + tokenizer.status().message());
    picture_tokenizer = std::move(*tokenizer);
    auto first = picture_prompt();
    if (!first.ok()) return Fail("bench --image: " + first.status().message());
    prompts.push_back(first->tokens);
  } else if (!o.prompts.empty()) {
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
  std::shared_ptr<const TokenGrammar> grammar;
  if (!o.json_schema.empty() || !o.grammar.empty()) {
    auto tokenizer = Tokenizer::Load(ResolveModelDir(o.model.model));
    if (!tokenizer.ok()) return Fail("bench: a grammar needs the model's tokenizer: " + tokenizer.status().message());
    auto g = LoadGrammarFile("bench", o.json_schema, o.grammar, *tokenizer, model.arch().vocab);
    if (!g.ok()) return Fail(g.status().message());
    grammar = *g;
  }

  if (o.rate < 0) return Fail("bench --rate: expected >= 0");
  if (o.background < 0 || o.background_tokens < 1)
    return Fail("bench --background, --background-tokens: expected >= 0 and >= 1");
  constexpr int64_t kBackgroundPrompt = 16;
  EngineOptions options;
  options.slots = o.concurrency + o.background;
  options.context = longest + o.output_tokens;
  if (o.background > 0)
    options.context = std::max(options.context, kBackgroundPrompt + o.background_tokens);
  options.rows = StepRows(model.backend().kind(), options.slots, o.rows);
  options.busy_rows = BusyStepRows(model.backend().kind(), options.slots, o.rows);
  if (o.kv_mib < 0) return Fail("bench --kv-mib: expected >= 0");
  const int64_t budget =
      o.kv_mib > 0 ? o.kv_mib << 20
                   : model.DefaultKvBudget();
  if (Status s = o.model.FitKv(&model, options.slots, options.context, budget, !o.json); !s.ok())
    return Fail(s.message());
  // Room for every slot's full context.
  options.kv_budget_bytes = KvBudgetFor(model.BudgetCaches(), model.PageBytes(), options.slots,
                                        PagesFor(options.context), options.rows);
  options.device_sampling = !o.host_sampling;
  if (Status s = o.draft.Apply(model, &options, o.model.device.threads); !s.ok()) return Fail(s.message());
  // Recurrent layers' states come out of the budget before the pages.
  options.kv_budget_bytes += Engine::StateBytes(model.caches(), options);
  auto created = Engine::Create(model.runner(), options);
  if (!created.ok()) return Fail(created.status().message());
  Engine& engine = **created;
  if (o.warm) {
    Status warm = engine.Warm();
    if (!warm.ok()) return Fail("warm-up: " + warm.message());
  }
  if (o.warm && pictures) {
    // Two picture requests before the timed run: a step shape is recorded the second time it
    // comes, and the tower's first run pays for its own start.
    for (int k = 0; k < 2; ++k) {
      engine.DropCaches();
      auto p = picture_prompt();
      if (!p.ok()) return Fail("warm-up: " + p.status().message());
      Request r;
      r.prompt = std::move(p->tokens);
      r.pictures = std::make_shared<const PromptPictures>(std::move(p->pictures));
      r.limit = o.output_tokens;
      r.stop = std::vector<int32_t>{};
      if (auto id = engine.Add(std::move(r)); !id.ok())
        return Fail("warm-up: " + id.status().message());
      while (engine.Busy()) {
        auto progress = engine.Advance();
        if (!progress.ok()) return Fail("warm-up: " + progress.status().message());
        for (const Progress& q : *progress)
          if (!q.status.ok()) return Fail("warm-up: " + q.status.message());
      }
    }
  }
  if (o.trace_ops && !model.backend().SetOpTrace(true))
    return Fail("bench --trace-ops: " + model.backend().Describe() + " keeps no op times");
  std::vector<OpTime> op_totals;  // --trace-ops: the whole run's

  std::ofstream trace;
  if (!o.trace.empty()) {
    trace.open(o.trace);
    if (!trace) return Fail("bench --trace: cannot write " + o.trace);
  }
  struct Timing {
    Clock::time_point added;  // its arrival
    Clock::time_point last;
    bool first = false;
    bool background = false;
  };
  std::map<int64_t, Timing> timing;
  std::vector<double> ttft, itl;       // seconds, the requests
  std::vector<double> background_itl;  // seconds, the background sequences
  int64_t next = 0, done = 0, tokens = 0, background_done = 0, background_tokens = 0;
  const ExpertCacheStats cache_before = model.ExpertCache();  // the warm-up's left out
  const auto start = Clock::now();
  auto drawn = start;
  ProgressLine bar(stderr);
  // Arrival times (--rate): exponential gaps of mean 1/rate from the start, seeded.
  std::mt19937_64 arrivals(o.seed ^ 0x9e3779b97f4a7c15ull);
  std::exponential_distribution<double> gap(o.rate > 0 ? o.rate : 1.0);
  Clock::time_point next_arrival = start;
  auto add = [&](bool background, Clock::time_point arrived) -> Status {
    Request r;
    if (background) {
      std::mt19937_64 rng(o.seed + 1000003 * static_cast<uint64_t>(background_done + 1));
      r.prompt.resize(kBackgroundPrompt);
      for (int32_t& t : r.prompt) t = static_cast<int32_t>(16 + rng() % (model.arch().vocab - 16));
      r.limit = o.background_tokens;
    } else if (pictures) {
      // The clock runs from before the files are read; nothing held from an earlier request
      // (the same picture's rows) is reused.
      engine.DropCaches();
      arrived = Clock::now();
      GZ_ASSIGN_OR_RETURN(PicturePrompt p, picture_prompt());
      picture_s.push_back(std::chrono::duration<double>(Clock::now() - arrived).count());
      r.prompt = std::move(p.tokens);
      r.pictures = std::make_shared<const PromptPictures>(std::move(p.pictures));
      r.limit = o.output_tokens;
      ++next;
    } else {
      r.prompt = prompts[next % prompts.size()];
      r.limit = o.output_tokens;
      ++next;
    }
    r.sampling.temperature = o.temperature;
    r.sampling.top_p = o.top_p;
    r.sampling.seed = static_cast<uint64_t>(next);
    if (grammar && !background) {
      // The model's stop tokens end an answer where the grammar's text is complete.
      r.sampling.grammar = grammar;
    } else {
      r.stop = std::vector<int32_t>{};  // every request produces exactly its token count
    }
    const auto adding = Clock::now();
    GZ_ASSIGN_OR_RETURN(int64_t id, engine.Add(std::move(r)));
    if (pictures && !background)
      add_s.push_back(std::chrono::duration<double>(Clock::now() - adding).count());
    timing[id].added = arrived;
    timing[id].background = background;
    return Status::Ok();
  };
  for (int32_t b = 0; b < o.background; ++b) {
    Status s = add(true, start);
    if (!s.ok()) return Fail(s.message());
  }
  int64_t step = 0;
  Clock::time_point background_end = start;  // when the last background sequence ended
  while (done < o.requests || background_done < o.background) {
    if (o.rate > 0) {
      // Every request whose arrival time has passed joins the engine's queue; with nothing to
      // do before the next one, wait for it.
      if (next < o.requests && timing.empty()) std::this_thread::sleep_until(next_arrival);
      while (next < o.requests && Clock::now() >= next_arrival) {
        Status s = add(false, next_arrival);
        if (!s.ok()) return Fail(s.message());
        next_arrival += std::chrono::duration_cast<Clock::duration>(
            std::chrono::duration<double>(gap(arrivals)));
      }
    } else {
      while (next < o.requests && next - done < o.concurrency) {
        Status s = add(false, Clock::now());
        if (!s.ok()) return Fail(s.message());
      }
    }
    if (timing.empty()) continue;  // waiting for the next arrival
    const auto began = Clock::now();
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
          if (!t.background) ttft.push_back(std::chrono::duration<double>(now - t.added).count());
        } else {
          (t.background ? background_itl : itl)
              .push_back(std::chrono::duration<double>(now - t.last).count());
        }
        t.last = now;
        (t.background ? background_tokens : tokens) += static_cast<int64_t>(p.tokens.size());
      }
      if (!p.end.empty()) {
        ++(t.background ? background_done : done);
        if (t.background && background_done == o.background) background_end = now;
        timing.erase(p.id);
      }
    }
    std::vector<OpTime> ops;
    if (o.trace_ops) {
      ops = model.backend().TakeOpTrace();
      for (const OpTime& t : ops) {
        auto it = std::find_if(op_totals.begin(), op_totals.end(),
                               [&](const OpTime& u) { return u.op == t.op; });
        if (it == op_totals.end()) {
          op_totals.push_back(t);
        } else {
          it->calls += t.calls;
          it->ms += t.ms;
        }
      }
    }
    if (trace.is_open()) {
      const StepTrace& st = engine.last_step();
      nlohmann::json line = {
          {"step", step},
          {"t_ms", std::chrono::duration<double, std::milli>(began - start).count()},
          {"ms", std::chrono::duration<double, std::milli>(now - began).count()},
          {"runner_ms", st.runner_ms},
          {"draft_ms", st.draft_ms},
          {"rows", st.rows},
          {"decode_rows", st.decode_rows},
          {"prompt_rows", st.prompt_rows},
          {"sequences", st.sequences},
          {"waiting", st.waiting},
          {"free_pages", engine.free_pages()},
          {"device_sampled", st.device_sampled},
          {"drafted", st.drafted},
          {"accepted", st.accepted}};
      for (const OpTime& t : ops) line["ops"][t.op] = {{"calls", t.calls}, {"ms", t.ms}};
      trace << line.dump() << '\n';
    }
    ++step;
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
      {"backend", model.Describe()},
      {"kv", KvFormatName(model.kv_format())},
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
      {"grammar_masks_beside_step", stats.masks_beside_step},
      {"grammar_masks_on_device", stats.masks_on_device},
      {"device_sampled_steps", stats.device_sampled},
      {"steps", stats.steps},
      {"rows", stats.rows},
  };
  if (o.rate > 0) out["rate"] = o.rate;
  // The expert cache over the timed run (slots 0: every expert resident).
  ExpertCacheStats cache = model.ExpertCache();
  cache.hits -= cache_before.hits;
  cache.misses -= cache_before.misses;
  cache.read_ms -= cache_before.read_ms;
  out["expert_cache"] = {{"slots", cache.slots},
                         {"hits", cache.hits},
                         {"misses", cache.misses},
                         {"hit_rate", cache.HitRate()},
                         {"read_ms", cache.read_ms}};
  if (pictures) {
    out["images"] = o.images;
    out["prompt_tokens"] = prompts[0].size();
    out["picture_ms_p50"] = 1e3 * Percentile(picture_s, 50);
    out["picture_ms_p99"] = 1e3 * Percentile(picture_s, 99);
    // The warm-up requests' parts are left out.
    const size_t warm = prepare_s.size() - picture_s.size();
    prepare_s.erase(prepare_s.begin(), prepare_s.begin() + warm);
    tower_s.erase(tower_s.begin(), tower_s.begin() + warm);
    decode_s.erase(decode_s.begin(), decode_s.begin() + warm);
    out["picture_decode_ms_p50"] = 1e3 * Percentile(decode_s, 50);
    out["picture_prepare_ms_p50"] = 1e3 * Percentile(prepare_s, 50);
    out["picture_tower_ms_p50"] = 1e3 * Percentile(tower_s, 50);
    out["add_ms_p50"] = 1e3 * Percentile(add_s, 50);
  }
  // Drafts per drafter: made, kept, and kept per step (of all steps, and of those with drafts).
  out["draft"] = o.draft.draft;
  const std::pair<const char*, const DraftStats*> drafters[] = {
      {"lookup", &stats.lookup}, {"mtp", &stats.mtp}, {"dflash", &stats.block}};
  for (const auto& [name, d] : drafters) {
    out["drafts"][name] = {
        {"drafted", d->drafted},
        {"accepted", d->accepted},
        {"steps", d->steps},
        {"acceptance", d->drafted > 0 ? static_cast<double>(d->accepted) / d->drafted : 0.0},
        {"accepted_per_step",
         stats.steps > 0 ? static_cast<double>(d->accepted) / stats.steps : 0.0},
        {"accepted_per_draft_step",
         d->steps > 0 ? static_cast<double>(d->accepted) / d->steps : 0.0}};
  }
  double ops_ms = 0;
  for (const OpTime& t : op_totals) ops_ms += t.ms;
  for (const OpTime& t : op_totals)
    out["ops"][t.op] = {{"calls", t.calls}, {"ms", t.ms}, {"share", t.ms / ops_ms}};
  if (o.background > 0) {
    // Over the background's own time: the requests may arrive for longer.
    const double background_seconds =
        std::chrono::duration<double>(background_end - start).count();
    out["background"] = {{"sequences", o.background},
                         {"output_tokens", o.background_tokens},
                         {"seconds", background_seconds},
                         {"output_tokens_per_s", background_tokens / background_seconds},
                         {"itl_p50_ms", 1e3 * Percentile(background_itl, 50)},
                         {"itl_p99_ms", 1e3 * Percentile(background_itl, 99)}};
  }
  if (o.json) {
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf("model            %s on %s\n", model.dir().c_str(),
                model.Describe().c_str());
    std::printf("requests         %lld at concurrency %d, %lld output tokens each\n",
                static_cast<long long>(o.requests), o.concurrency,
                static_cast<long long>(o.output_tokens));
    std::printf("output           %.1f tokens/s (%lld tokens in %.2f s)\n", tokens / seconds,
                static_cast<long long>(tokens), seconds);
    std::printf("first token      p50 %.1f ms, p99 %.1f ms\n", 1e3 * Percentile(ttft, 50),
                1e3 * Percentile(ttft, 99));
    std::printf("between tokens   p50 %.1f ms, p99 %.1f ms\n", 1e3 * Percentile(itl, 50),
                1e3 * Percentile(itl, 99));
    if (pictures) {
      std::printf("pictures         %zu-token prompt; files to prompt rows p50 %.1f ms, p99 %.1f "
                  "ms of the first token's time (read, decode, preprocess p50 %.1f ms; tower "
                  "%.1f ms)\n",
                  prompts[0].size(), 1e3 * Percentile(picture_s, 50),
                  1e3 * Percentile(picture_s, 99), out["picture_prepare_ms_p50"].get<double>(),
                  out["picture_tower_ms_p50"].get<double>());
    }
    if (o.background > 0) {
      std::printf("background       %d sequences: %.1f tokens/s, between tokens p50 %.1f ms, "
                  "p99 %.1f ms\n",
                  o.background, out["background"]["output_tokens_per_s"].get<double>(),
                  1e3 * Percentile(background_itl, 50), 1e3 * Percentile(background_itl, 99));
    }
    if (!op_totals.empty()) {
      std::printf("ops              %.1f ms in all, each launched alone (no recorded steps):\n",
                  ops_ms);
      std::sort(op_totals.begin(), op_totals.end(),
                [](const OpTime& a, const OpTime& b) { return a.ms > b.ms; });
      for (const OpTime& t : op_totals) {
        std::printf("  %-14s %9.1f ms %5.1f%%  %8lld calls  %8.3f ms a call\n", t.op.c_str(), t.ms,
                    100 * t.ms / ops_ms, static_cast<long long>(t.calls), t.ms / t.calls);
      }
    }
    for (const auto& [name, d] : drafters) {
      if (d->drafted == 0 && std::string(name) != "lookup") continue;
      std::printf(
          "drafts           %s: %s %lld drafted, %lld kept (%.1f%%), in %lld of %lld "
          "steps, %.2f kept a step\n",
          o.draft.draft.c_str(), name, static_cast<long long>(d->drafted),
          static_cast<long long>(d->accepted),
          d->drafted > 0 ? 100.0 * d->accepted / d->drafted : 0.0,
          static_cast<long long>(d->steps), static_cast<long long>(stats.steps),
          stats.steps > 0 ? static_cast<double>(d->accepted) / stats.steps : 0.0);
    }
    if (cache.slots > 0) {
      std::printf(
          "expert cache     %lld slots: %lld hits, %lld misses (%.1f%% hits), %.1f ms "
          "reading\n",
          static_cast<long long>(cache.slots), static_cast<long long>(cache.hits),
          static_cast<long long>(cache.misses), 100 * cache.HitRate(), cache.read_ms);
    }
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
  o->model.AddPipeline(cmd);
  o->draft.Add(cmd);
  cmd->add_option("--requests,-n", o->requests, "Requests in all")->default_val(32);
  cmd->add_option("--prompt-tokens,-p", o->prompt_tokens, "Tokens of each random prompt")
      ->default_val(128);
  cmd->add_option("--output-tokens,-o", o->output_tokens, "Tokens each request generates")
      ->default_val(128);
  cmd->add_option("--concurrency,-c", o->concurrency, "Requests in flight (the engine's slots)")
      ->default_val(16);
  cmd->add_option("--rows", o->rows,
                  "Most rows one step reads (at least the sequences; default: on a GPU one for "
                  "each generating sequence and 512 for prompt pieces beside them, and up to "
                  "2,048 for prompts alone; on the CPU 256)");
  cmd->add_option("--kv-mib", o->kv_mib,
                  "KV memory (MiB) that --kv auto fits every sequence's whole context into, "
                  "choosing the format (default: the device's memory left after the weights, "
                  "less a reserve; on the CPU a quarter of it, 256 MiB to 1 GiB). The pool "
                  "holds every sequence's whole context in the chosen format");
  cmd->add_option("--prompts", o->prompts,
                  "JSONL file of prompts: {\"prompt\": text} or {\"tokens\": [ids]} per line");
  cmd->add_option("--seed", o->seed, "Seed of the random prompts")->default_val(1);
  cmd->add_option("--temperature", o->temperature, "Sampling temperature (0: greedy)")
      ->default_val(0.0f)
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--top-p", o->top_p, "Nucleus sampling mass")
      ->default_val(1.0f)
      ->check(CLI::Range(0.0f, 1.0f));
  cmd->add_option("--json-schema", o->json_schema,
                  "Every request's answer follows this JSON Schema file (a token mask a step; "
                  "the model's stop tokens end an answer where its JSON is complete)");
  cmd->add_option("--grammar", o->grammar, "Every request's answer follows this GBNF file");
  cmd->add_option("--image", o->images,
                  "Every request is a chat with this picture (repeat for several) and "
                  "--image-prompt, run one at a time (--concurrency 1); its first-token time "
                  "counts from reading the files: decoding, preprocessing and the vision tower "
                  "included, nothing reused from the request before. Two untimed requests warm "
                  "it up");
  cmd->add_option("--image-prompt", o->image_prompt, "The text after the pictures")
      ->default_val("Describe the picture.");
  cmd->add_flag("--host-sampling", o->host_sampling,
                "Pick tokens on the host from copied logits, even where the device can");
  cmd->add_flag("!--no-warm", o->warm, "Skip Engine::Warm before the timed run");
  cmd->add_flag("--json", o->json, "One JSON object on stdout");
  cmd->add_option("--rate", o->rate,
                  "Requests arrive at this many a second (exponential gaps, --seed), and wait in "
                  "the engine's queue for a slot; first-token times count from arrival "
                  "(0: keep --concurrency requests in flight from the start)")
      ->default_val(0.0);
  cmd->add_option("--background", o->background,
                  "Sequences (16-token prompts) decoding --background-tokens each from the start, "
                  "in slots of their own beside the requests: mixed load, reported apart")
      ->default_val(0);
  cmd->add_option("--background-tokens", o->background_tokens,
                  "Tokens each background sequence generates")
      ->default_val(512);
  cmd->add_option(
      "--trace", o->trace,
      "Write one JSON line a step: start and duration (ms), the runner's time, the drafter's "
      "time before the step (MTP or DFlash), rows (decode and prompt), sequences, waiting "
      "requests, free KV pages, drafts made and kept");
  cmd->add_flag("--trace-ops", o->trace_ops,
                "Time every op (CUDA: events on the stream; CPU: the clock) and report the totals "
                "per op (with --trace, each step's too). Steps are not recorded as CUDA graphs "
                "meanwhile, so each op is launched on its own and the run is slower");
  cmd->callback([&ctx, o, cmd] {
    // Picture requests run one at a time unless told otherwise (and then refused).
    if (!o->images.empty() && cmd->count("--concurrency") == 0) o->concurrency = 1;
    ctx.exit_code = RunBench(*o);
  });
}

}  // namespace gizllm::cli
