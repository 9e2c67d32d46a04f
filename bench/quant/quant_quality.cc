// Quality and decode speed of the quantized formats on a real model (tiny-chat by default),
// against the same model in bf16, both on the CPU backend.
//
// The quantized model is loaded through a backend that quantizes each linear as it is prepared
// (the same quant::QuantizeLinear that `gizllm convert` runs), so the figures need no converted
// folder; the embedding, and with it the tied head, stays bf16 (head 16). For each bits/rotation
// case: perplexity over the texts, mean KL(bf16 || quantized) of the next-token distributions,
// and the share of positions with the same top token, in windows of 256 tokens
// (quant/perplexity.h). Then batch-1 decode tokens/s of bf16 and of each format (one row per step,
// logits every step).
//
// Usage: quant_quality [--model DIR] [--file JSONL] [--limit N] [--bits 8,4,2,1] [--threads N]
//                      [--decode N] [--no-zeros]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/dtype.h"
#include "model/model.h"
#include "quant/layout.h"
#include "quant/perplexity.h"
#include "quant/quantize.h"
#include "tokenizer/tokenizer.h"

namespace gizllm {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Forwards every op to `inner`; PrepareWeight quantizes plain linears (columns a multiple of 128,
// rows other than the vocabulary's) and keeps the quantized arrays alive.
class QuantizingBackend : public Backend {
 public:
  QuantizingBackend(std::shared_ptr<Backend> inner, quant::QuantizeOptions q, int64_t vocab,
                    ThreadPool* pool)
      : inner_(std::move(inner)), q_(q), vocab_(vocab), pool_(pool) {}

  DeviceKind kind() const override { return inner_->kind(); }
  std::string Describe() const override { return inner_->Describe(); }
  Expected<std::unique_ptr<Buffer>> Allocate(size_t bytes) override {
    return inner_->Allocate(bytes);
  }
  void CopyToDevice(void* dst, const void* src, size_t bytes) override {
    inner_->CopyToDevice(dst, src, bytes);
  }
  void CopyToHost(void* dst, const void* src, size_t bytes) override {
    inner_->CopyToHost(dst, src, bytes);
  }
  Expected<Weight> PrepareWeight(const Weight& host, std::unique_ptr<Buffer>* storage) override {
    if (host.format != Format::kBf16 || host.rows == vocab_ || host.cols % quant::kGroup != 0) {
      return inner_->PrepareWeight(host, storage);
    }
    std::vector<float> w(host.rows * host.cols);
    const auto* bf16 = static_cast<const uint16_t*>(host.data);
    for (size_t i = 0; i < w.size(); ++i) w[i] = Bf16ToF32(bf16[i]);
    GZ_ASSIGN_OR_RETURN(quant::QuantizedLinear ql,
                        quant::QuantizeLinear(w.data(), host.rows, host.cols, q_, pool_));
    owned_.push_back(std::make_unique<quant::QuantizedLinear>(std::move(ql)));
    bytes_ += owned_.back()->View().Bytes();
    return inner_->PrepareWeight(owned_.back()->View(), storage);
  }
  void Embed(const EmbedParams& p) override { inner_->Embed(p); }
  void RmsNorm(const RmsNormParams& p) override { inner_->RmsNorm(p); }
  void Matmul(const MatmulParams& p) override { inner_->Matmul(p); }
  void Rope(const RopeParams& p) override { inner_->Rope(p); }
  void KvWrite(const KvWriteParams& p) override { inner_->KvWrite(p); }
  void Attention(const AttentionParams& p) override { inner_->Attention(p); }
  void SwiGlu(const SwiGluParams& p) override { inner_->SwiGlu(p); }
  void Add(const AddParams& p) override { inner_->Add(p); }
  void GatherRows(const GatherRowsParams& p) override { inner_->GatherRows(p); }
  void Synchronize() override { inner_->Synchronize(); }

  int64_t quantized_bytes() const { return bytes_; }

 private:
  std::shared_ptr<Backend> inner_;
  quant::QuantizeOptions q_;
  int64_t vocab_;
  ThreadPool* pool_;
  std::vector<std::unique_ptr<quant::QuantizedLinear>> owned_;
  int64_t bytes_ = 0;
};

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
  std::string bits_list = "8,4,2,1";
  int limit = 0, threads = 2, decode = 128;
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
    else {
      std::printf(
          "usage: quant_quality [--model DIR] [--file JSONL] [--limit N] [--bits 8,4,2,1] "
          "[--threads N] [--decode N] [--no-zeros]\n");
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
  auto self = quant::MeasurePerplexity(**base, nullptr, ids, eval);
  if (!self.ok()) return fail(self.status());
  auto base_speed = DecodeTokensPerSecond(**base, ids[0], decode);
  if (!base_speed.ok()) return fail(base_speed.status());
  std::printf("%-6s %-7s %10s %12s %10s %10s %10s %10s\n", "bits", "rotate", "MB linears",
              "perplexity", "KL", "same top", "decode/s", "vs bf16");
  std::printf("%-6s %-7s %10.2f %12.4f %10s %10s %10.1f %10s\n", "bf16", "-",
              (*base)->WeightBytes() / 1e6, self->perplexity, "0", "100%", *base_speed, "1.00x");
  std::fflush(stdout);
  std::stringstream list(bits_list);
  std::string item;
  while (std::getline(list, item, ',')) {
    int bits = std::atoi(item.c_str());
    Format f = bits == 8   ? Format::kQ8
               : bits == 4 ? Format::kQ4
               : bits == 2 ? Format::kQ2
                           : Format::kQ1;
    for (bool rotate : {true, false}) {
      auto qb = std::make_shared<QuantizingBackend>(cpu, quant::QuantizeOptions{f, zeros, rotate},
                                                    (*base)->arch().vocab, &pool);
      auto m = Model::Load(model_dir, qb);
      if (!m.ok()) return fail(m.status());
      auto r = quant::MeasurePerplexity(**m, base->get(), ids, eval);
      if (!r.ok()) return fail(r.status());
      double speed = 0.0;
      if (rotate) {
        auto s = DecodeTokensPerSecond(**m, ids[0], decode);
        if (!s.ok()) return fail(s.status());
        speed = *s;
      }
      std::printf("%-6s %-7s %10.2f %12.4f %10.6f %9.2f%% ", (FormatName(f) + "/16").c_str(),
                  rotate ? "yes" : "no", qb->quantized_bytes() / 1e6, r->perplexity, r->kl,
                  100.0 * r->same_top);
      if (rotate) {
        std::printf("%10.1f %9.2fx\n", speed, speed / *base_speed);
      } else {
        std::printf("%10s %10s\n", "", "");
      }
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace gizllm

int main(int argc, char** argv) { return gizllm::Main(argc, argv); }
