// gizllm perplexity: perplexity of a model over texts, and with --base how far its next-token
// distributions are from a base model's (mean KL divergence, share of the same top token).
#include <chrono>
#include <cstdio>
#include <memory>
#include <vector>

#include "cli/model_options.h"
#include "core/progress.h"
#include "jobs/perplexity.h"
#include "tokenizer/tokenizer.h"

namespace gizllm::cli {

void AddPerplexityCommand(CLI::App& app, CommandContext& ctx) {
  auto* cmd = app.add_subcommand(
      "perplexity", "Perplexity over texts; with --base, KL divergence from a base model");
  struct Options {
    ModelOptions model;
    std::string file, base, base_kv;
    quant::PerplexityOptions eval;
    int limit = 0;
  };
  auto o = std::make_shared<Options>();
  o->model.Add(cmd);
  cmd->add_option("--file,-f", o->file, "JSON lines, one {\"text\": ...} per line")->required();
  cmd->add_option("--base", o->base,
                  "Base model folder: report the mean KL divergence of the model's next-token "
                  "distributions from the base's, and how often both pick the same top token");
  cmd->add_option("--base-kv", o->base_kv,
                  "KV pages of the base model (--kv's values); without --base the base is the "
                  "model itself: the KL divergence a KV format costs, e.g. --kv q8 --base-kv f32");
  cmd->add_option("--window", o->eval.window, "Tokens per window; each window starts a new context")
      ->default_val(256);
  cmd->add_option("--max-tokens", o->eval.max_tokens,
                  "Read only the first N tokens of each text (0: all)")
      ->default_val(1024);
  cmd->add_option("--skip", o->eval.skip,
                  "Score each window from position N on; the positions before are context only "
                  "(llama-perplexity scores the second half: --skip with half the window)")
      ->default_val(0);
  cmd->add_option("--limit", o->limit, "Read only the first N texts (0: all)")->default_val(0);
  cmd->callback([&ctx, o] {
    Status check = o->eval.Check();
    if (!check.ok()) return void(ctx.exit_code = Fail(check.message()));
    if (!o->base_kv.empty()) {
      auto bits = ParseKvBits(o->base_kv);
      if (!bits.ok()) {
        return void(ctx.exit_code = Fail("--base-kv: " + o->base_kv +
                                         " is not a KV format (it takes --kv's values)"));
      }
    }
    auto texts = quant::ReadTexts(o->file, o->limit);
    if (!texts.ok()) return void(ctx.exit_code = Fail(texts.status().message()));
    auto model = o->model.Load(true);
    if (!model.ok()) return void(ctx.exit_code = Fail(model.status().message()));
    std::unique_ptr<Model> base;
    if (!o->base.empty() || !o->base_kv.empty()) {
      ModelOptions b = o->model;
      if (!o->base.empty()) b.model = o->base;
      if (!o->base_kv.empty()) b.kv = o->base_kv;
      auto loaded = b.Load(true);
      if (!loaded.ok()) return void(ctx.exit_code = Fail(loaded.status().message()));
      base = std::move(*loaded);
    }
    auto tokenizer = Tokenizer::Load((*model)->dir());
    if (!tokenizer.ok()) return void(ctx.exit_code = Fail(tokenizer.status().message()));
    std::vector<std::vector<int32_t>> ids;
    for (const std::string& text : *texts) {
      auto encoded = tokenizer->Encode(text);
      if (!encoded.ok()) return void(ctx.exit_code = Fail(encoded.status().message()));
      ids.push_back(std::move(*encoded));
    }
    auto line = std::make_shared<ProgressLine>(stderr);
    o->eval.progress = [line](size_t done, size_t total, double perplexity) {
      char text[80];
      std::snprintf(text, sizeof(text), "%zu/%zu texts, perplexity %.3f", done, total, perplexity);
      line->Update(static_cast<int64_t>(done), static_cast<int64_t>(total), text);
    };
    auto start = std::chrono::steady_clock::now();
    auto r = quant::MeasurePerplexity(**model, base.get(), ids, o->eval);
    if (!r.ok()) return void(ctx.exit_code = Fail(r.status().message()));
    double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("texts        %zu (first %d tokens each), windows of %d tokens", texts->size(),
                o->eval.max_tokens, o->eval.window);
    if (o->eval.skip > 0) std::printf(" scored from position %d", o->eval.skip);
    std::printf("\n");
    std::printf("tokens       %lld scored in %.1f s\n", static_cast<long long>(r->tokens), seconds);
    std::printf("perplexity   %.4f\n", r->perplexity);
    if (base) {
      if (!o->base_kv.empty())
        std::printf("kv           %s, base %s\n", o->model.kv.c_str(), o->base_kv.c_str());
      std::printf("base         %.4f\n", r->base_perplexity);
      std::printf("kl           %.4g (mean KL(base || model) per position)\n", r->kl);
      std::printf("same top     %.2f%%\n", 100.0 * r->same_top);
    }
  });
}

}  // namespace gizllm::cli
