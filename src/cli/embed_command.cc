// gizllm embed: one vector a text, from an encoder (BERT, RoBERTa, XLM-R) or a decoder's final
// hidden states (Qwen3-Embedding), pooled as its sentence-transformers files say.
//   stdin: JSON lines, each a text (a JSON string); stdout: JSON lines, each the array of its
//   vector's floats, in the order read.
// gizllm embed --bench: the model's throughput on random texts instead (RunBench below).
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cli/model_options.h"
#include "cli/text_lines.h"

namespace gizllm::cli {
namespace {

struct BenchOptions {
  std::vector<int64_t> tokens = {128};   // of each text
  std::vector<int64_t> batches = {256};  // texts of one Embed call
  double seconds = 2.0;                  // timed per (tokens, batch), after one warm-up call
  uint64_t seed = 1;
};

// Sequences and tokens per second of Embed calls on texts of random token ids (uniform over the
// vocabulary, token type 0), one JSON line per (tokens, batch): after a warm-up call, calls are
// timed until `seconds` have passed (at least two). Embed returns the pooled vectors on the
// host, so each call's time holds the whole run, pooling and the copy back included.
int RunBench(EmbeddingModel& model, const std::string& name, const BenchOptions& o) {
  for (int64_t n : o.tokens) {
    if (n < 1 || n > model.max_tokens()) {
      return Fail("--bench-tokens " + std::to_string(n) + ": expected 1 to the model's " +
                  std::to_string(model.max_tokens()));
    }
  }
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(model.vocab() - 1));
  for (int64_t n : o.tokens) {
    for (int64_t b : o.batches) {
      std::vector<Encoding> texts(b);
      for (Encoding& e : texts) {
        e.ids.resize(n);
        for (int32_t& t : e.ids) t = id(rng);
        e.types.assign(n, 0);
      }
      auto warm = model.Embed(texts);
      if (!warm.ok()) return Fail(warm.status().message());
      using Clock = std::chrono::steady_clock;
      const auto start = Clock::now();
      int64_t calls = 0;
      double seconds = 0;
      while (calls < 2 || seconds < o.seconds) {
        auto vectors = model.Embed(texts);
        if (!vectors.ok()) return Fail(vectors.status().message());
        ++calls;
        seconds = std::chrono::duration<double>(Clock::now() - start).count();
      }
      const double sequences = static_cast<double>(calls * b);
      nlohmann::json line = {{"bench", "embed"},
                             {"model", name},
                             {"family", model.family()},
                             {"device", model.device()},
                             {"dim", model.dim()},
                             {"tokens", n},
                             {"batch", b},
                             {"calls", calls},
                             {"warmup_calls", 1},
                             {"seconds", seconds},
                             {"sequences_per_s", sequences / seconds},
                             {"tokens_per_s", sequences * n / seconds}};
      std::printf("%s\n", line.dump().c_str());
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

void AddEmbedCommand(CLI::App& app, CommandContext& ctx) {
  auto* cmd = app.add_subcommand(
      "embed",
      "Print one embedding a text from an encoder, or a decoder's final-normed hidden states "
      "(Qwen3-Embedding): stdin holds JSON lines of texts (JSON strings), stdout gets "
      "JSON lines of float arrays. Pooling and normalization follow the model's "
      "sentence-transformers files (modules.json, 1_Pooling/config.json; without them mean "
      "pooling, not normalized); a text longer than sentence_bert_config.json's max_seq_length "
      "or the model's positions is cut at its end, as sentence-transformers does. A prompt of "
      "config_sentence_transformers.json (--prompt-name, else its default_prompt_name) is put "
      "before every text");
  struct Options {
    ModelOptions model;
    int64_t batch = 256;
    std::optional<std::string> prompt_name;
    bool verbose = false;
    bool bench = false;
    BenchOptions bench_options;
  };
  auto o = std::make_shared<Options>();
  o->model.Add(cmd);
  cmd->add_option("--batch", o->batch, "Texts embedded together (packed, no padding)")
      ->default_val(256)
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--prompt-name", o->prompt_name,
                  "The prompt of config_sentence_transformers.json put before every text "
                  "(default: its default_prompt_name, if any)");
  cmd->add_flag("--verbose,-v", o->verbose, "Print what was loaded on stderr");
  cmd->add_flag("--bench", o->bench,
                "Measure throughput instead of reading stdin: texts of random token ids, one "
                "JSON line per (--bench-tokens, --bench-batch) with sequences_per_s and "
                "tokens_per_s over --bench-seconds after one warm-up call");
  cmd->add_option("--bench-tokens", o->bench_options.tokens, "Tokens of each text (a list)")
      ->default_val(std::vector<int64_t>{128})
      ->delimiter(',');
  cmd->add_option("--bench-batch", o->bench_options.batches, "Texts of one embedding call (a list)")
      ->default_val(std::vector<int64_t>{256})
      ->delimiter(',')
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--bench-seconds", o->bench_options.seconds,
                  "Timed seconds of each (tokens, batch), at least two calls")
      ->default_val(2.0)
      ->check(CLI::Range(0.0, 3600.0));
  cmd->add_option("--bench-seed", o->bench_options.seed, "Seed of the random texts")
      ->default_val(1);
  cmd->callback([&ctx, o] {
    auto model = o->model.LoadEmbedding(o->verbose);
    if (!model.ok()) return void(ctx.exit_code = Fail(model.status().message()));
    if (o->bench) return void(ctx.exit_code = RunBench(**model, o->model.model, o->bench_options));
    auto prompt = PromptText((*model)->config(), o->prompt_name);
    if (!prompt.ok()) {
      return void(ctx.exit_code = Fail("--prompt-name: " + prompt.status().message()));
    }
    std::vector<Encoding> batch;
    std::string out;
    auto flush = [&]() -> Status {
      GZ_ASSIGN_OR_RETURN(auto vectors, (*model)->Embed(batch));
      for (const auto& v : vectors) AppendFloats(v, &out);
      std::fwrite(out.data(), 1, out.size(), stdout);
      out.clear();
      batch.clear();
      return Status::Ok();
    };
    Status read = ForEachTextLine(std::cin, [&](const std::string& text) -> Status {
      GZ_ASSIGN_OR_RETURN(Encoding e, (*model)->Tokenize(*prompt + text));
      batch.push_back(std::move(e));
      if (static_cast<int64_t>(batch.size()) >= o->batch) return flush();
      return Status::Ok();
    });
    if (read.ok()) read = flush();
    if (!read.ok()) ctx.exit_code = Fail(read.message());
  });
}

}  // namespace gizllm::cli
