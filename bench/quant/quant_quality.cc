// Quality and decode speed of the quantized formats on a real model (tiny-chat by default),
// against the same model in bf16, both on the CPU backend.
//
// Each case is converted by quant::Convert (what `gizllm convert` runs) into a temporary folder
// and loaded from there; the embedding, and with it the tied head, stays bf16 (head 16). Cases:
// bits x calibration (round to nearest, or GPTQ on calibration text: jobs/calibrate.h) x
// rotation. The calibration text is made once (the model's own continuations unless --calibration
// names a file) and every calibrated case reads the same tokens. For each case: perplexity over
// the texts, mean KL(bf16 || quantized) of the next-token distributions, and the share of
// positions with the same top token, in windows of 256 tokens (jobs/perplexity.h); the seconds
// the conversion took. Then batch-1 decode tokens/s of bf16 and of each format (one row per step,
// logits every step), on the rounded and rotated case.
//
// Usage: quant_quality [--model DIR] [--file JSONL] [--limit N] [--bits 8,4,2,1] [--threads N]
//                      [--decode N] [--no-zeros] [--calibration self|FILE|off]
//                      [--calibration-rows N] [--rotate both|yes|no]
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "backend/cpu/cpu_backend.h"
#include "core/dtype.h"
#include "jobs/calibrate.h"
#include "jobs/convert.h"
#include "jobs/perplexity.h"
#include "model/model.h"
#include "quant/layout.h"
#include "tokenizer/tokenizer.h"

namespace gizllm {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Batch-1 decode: one token per step at positions 0..n-1, logits every step. Best of 3 runs.
Expected<double> DecodeTokensPerSecond(Runner& runner, const std::vector<int32_t>& ids, int n) {
  n = std::min<int>(n, static_cast<int>(ids.size()));
  const int32_t pages = (n + kPage - 1) / kPage;
  std::vector<int32_t> table(pages);
  std::iota(table.begin(), table.end(), 0);
  PageTables tables{table.data(), 1, pages};
  GZ_RETURN_IF_ERROR(runner.AllocatePages(pages));
  GZ_RETURN_IF_ERROR(runner.Reserve(1, 1, pages));
  std::vector<float> logits(runner.arch().vocab);
  Rows rows;
  double best = 1e30;
  for (int run = 0; run < 3; ++run) {
    double t0 = Now();
    for (int p = 0; p < n; ++p) {
      rows.Clear();
      rows.Push(ids[p], 0, p, true);
      GZ_RETURN_IF_ERROR(runner.Step(rows, tables, logits.data()));
    }
    best = std::min(best, Now() - t0);
  }
  return n / best;
}

int Main(int argc, char** argv) {
  std::string model_dir = "models/tiny-chat", file = "models/tiny-chat/heldout.jsonl";
  std::string bits_list = "8,4,2,1", calibration = "self", rotate_list = "both";
  int limit = 0, threads = 2, decode = 128;
  int64_t calibration_rows = 4096;
  bool zeros = true;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--model")
      model_dir = next();
    else if (a == "--file")
      file = next();
    else if (a == "--limit")
      limit = std::atoi(next().c_str());
    else if (a == "--bits")
      bits_list = next();
    else if (a == "--threads")
      threads = std::atoi(next().c_str());
    else if (a == "--decode")
      decode = std::atoi(next().c_str());
    else if (a == "--no-zeros")
      zeros = false;
    else if (a == "--calibration")
      calibration = next();
    else if (a == "--calibration-rows")
      calibration_rows = std::atoll(next().c_str());
    else if (a == "--rotate")
      rotate_list = next();
    else {
      std::printf(
          "usage: quant_quality [--model DIR] [--file JSONL] [--limit N] [--bits 8,4,2,1] "
          "[--threads N] [--decode N] [--no-zeros] [--calibration self|FILE|off] "
          "[--calibration-rows N] [--rotate both|yes|no]\n");
      return a == "--help" ? 0 : 1;
    }
  }
  ThreadPool pool(threads);
  auto cpu = std::make_shared<CpuBackend>(&pool, CpuOptions{});
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "quant_quality: %s\n", s.message().c_str());
    return 1;
  };
  auto base = Model::Load(model_dir, cpu);
  if (!base.ok()) return fail(base.status());
  auto tokenizer = Tokenizer::Load(model_dir);
  if (!tokenizer.ok()) return fail(tokenizer.status());
  auto texts = quant::ReadTexts(file, limit);
  if (!texts.ok()) return fail(texts.status());
  std::vector<std::vector<int32_t>> ids;
  for (const std::string& t : *texts) {
    auto e = tokenizer->Encode(t);
    if (!e.ok()) return fail(e.status());
    ids.push_back(std::move(*e));
  }
  quant::PerplexityOptions eval;
  std::printf("%s: %zu texts of %s, windows of %d tokens (first %d tokens of each), %s\n",
              model_dir.c_str(), texts->size(), file.c_str(), eval.window, eval.max_tokens,
              cpu->Describe().c_str());

  // The calibration tokens, once for every calibrated case.
  quant::CalibrationOptions calib;
  calib.rows = calibration_rows;
  if (calibration != "off") {
    calib.file = calibration == "self" ? "" : calibration;
    double t0 = Now();
    auto calibrator = quant::Calibrator::Open(model_dir, cpu, {}, &pool);
    if (!calibrator.ok()) return fail(calibrator.status());
    auto sequences = (*calibrator)->Sequences(calib);
    if (!sequences.ok()) return fail(sequences.status());
    calib.tokens = std::move(*sequences);
    int64_t tokens = 0;
    for (const auto& s : calib.tokens) tokens += static_cast<int64_t>(s.size());
    std::printf("calibration: %lld tokens in %zu sequences, %s, made in %.1f s\n",
                static_cast<long long>(tokens), calib.tokens.size(),
                calib.file.empty() ? "the model's own text" : calib.file.c_str(), Now() - t0);
    std::string first = tokenizer->Decode(calib.tokens[0]);
    std::printf("calibration text, start of the first sequence: %s\n",
                nlohmann::json(first.substr(0, 160)).dump().c_str());
  }

  auto self = quant::MeasurePerplexity(**base, nullptr, ids, eval);
  if (!self.ok()) return fail(self.status());
  auto base_speed = DecodeTokensPerSecond(**base, ids[0], decode);
  if (!base_speed.ok()) return fail(base_speed.status());
  std::printf("%-6s %-6s %-7s %10s %12s %10s %10s %9s %10s %10s\n", "bits", "gptq", "rotate",
              "MB linears", "perplexity", "KL", "same top", "convert s", "decode/s", "vs bf16");
  std::printf("%-6s %-6s %-7s %10.2f %12.4f %10s %10s %9s %10.1f %10s\n", "bf16", "-", "-",
              (*base)->WeightBytes() / 1e6, self->perplexity, "0", "100%", "-", *base_speed,
              "1.00x");
  std::fflush(stdout);
  const std::string tmp = (std::filesystem::temp_directory_path() /
                           ("quant_quality_" + std::to_string(::getpid())))
                              .string();
  std::vector<bool> rotations;
  if (rotate_list != "no") rotations.push_back(true);
  if (rotate_list != "yes") rotations.push_back(false);
  std::stringstream list(bits_list);
  std::string item;
  while (std::getline(list, item, ',')) {
    auto bits = quant::ParseBits(item + "/16");
    if (!bits.ok()) return fail(bits.status());
    const Format f = quant::BitsFormat(bits->layers);
    for (bool calibrate : {false, true}) {
      if (calibrate && calibration == "off") continue;
      for (bool rotate : rotations) {
        quant::ConvertOptions c;
        c.from = model_dir;
        c.to = tmp;
        c.bits = *bits;
        c.rotate = rotate;
        c.zeros = zeros;
        c.pool = &pool;
        c.calibrate = calibrate;
        c.calibration = calib;
        c.backend = cpu;
        std::filesystem::remove_all(tmp);
        double t0 = Now();
        auto converted = quant::Convert(c);
        if (!converted.ok()) return fail(converted.status());
        const double convert_s = Now() - t0;
        auto m = Model::Load(tmp, cpu);
        if (!m.ok()) return fail(m.status());
        auto r = quant::MeasurePerplexity(**m, base->get(), ids, eval);
        if (!r.ok()) return fail(r.status());
        int64_t linear_bytes = 0;
        for (const WeightSummary& w : (*m)->weights()) {
          if (w.format == FormatName(f)) linear_bytes += w.bytes;
        }
        double speed = 0.0;
        const bool timed = rotate && !calibrate;
        if (timed) {
          auto s = DecodeTokensPerSecond(**m, ids[0], decode);
          if (!s.ok()) return fail(s.status());
          speed = *s;
        }
        std::printf("%-6s %-6s %-7s %10.2f %12.4f %10.6f %9.2f%% %9.1f ",
                    (FormatName(f) + "/16").c_str(), calibrate ? "yes" : "no",
                    rotate ? "yes" : "no", linear_bytes / 1e6, r->perplexity, r->kl,
                    100.0 * r->same_top, convert_s);
        if (timed) {
          std::printf("%10.1f %9.2fx\n", speed, speed / *base_speed);
        } else {
          std::printf("%10s %10s\n", "", "");
        }
        std::fflush(stdout);
        m->reset();
        std::filesystem::remove_all(tmp);
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace gizllm

int main(int argc, char** argv) { return gizllm::Main(argc, argv); }
