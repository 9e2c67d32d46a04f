// The linears of one tiny-chat token (Qwen3, 8 layers: q/k/v, o, gate/up, down; plus the head
// 8192 x 384) through CpuBackend::Matmul in each format, against bf16 on the same backend:
// decode (1 row) time per token, its effective weight bandwidth, 16 rows (16 sequences' decode
// step) and prefill (128 rows) in GFLOP/s. --bf16 and --int8 set the backend's options of those
// names (CpuOptions), with the weights prepared by the backend as Model::Load prepares them.
// Usage: quant_bench [--threads N] [--reps N] [--bf16] [--int8]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/dtype.h"
#include "quant/quantize.h"

namespace gizllm {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Linear {
  int64_t rows, cols;
  int count;  // per token
};
// tiny-chat: dim 384, q 384, kv 128, ffn 1152, vocab 8192, 8 layers.
constexpr Linear kShapes[] = {
    {384, 384, 8 * 2},   // q, o
    {128, 384, 8 * 2},   // k, v
    {1152, 384, 8 * 2},  // gate, up
    {384, 1152, 8},      // down
    {8192, 384, 1},      // head
};

struct Case {
  const char* name;
  Format format;
  bool zeros;
};

int Run(int threads, int reps, const CpuOptions& options) {
  ThreadPool pool(threads);
  CpuBackend backend(&pool, options);
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 0.05f);
  const Case cases[] = {{"bf16", Format::kBf16, false}, {"q8", Format::kQ8, false},
                        {"q4", Format::kQ4, true},      {"q4 (no zeros)", Format::kQ4, false},
                        {"q2", Format::kQ2, true},      {"q1", Format::kQ1, false}};
  std::printf("%s, tiny-chat linears per token (%d threads)\n", backend.Describe().c_str(),
              threads);
  std::printf("%-14s %10s %12s %10s %10s %12s %12s %14s\n", "format", "MB/token", "decode us",
              "GB/s", "vs bf16", "16 rows us", "16 GF/s", "prefill GF/s");
  double bf16_us = 0.0;
  for (const Case& c : cases) {
    // One distinct weight per linear of the token, as a real model reads them.
    std::vector<std::vector<uint16_t>> plain;
    std::vector<quant::QuantizedLinear> quantized;
    std::vector<Weight> weights;
    std::vector<std::unique_ptr<Buffer>> storage;
    for (const Linear& l : kShapes) {
      for (int i = 0; i < l.count; ++i) {
        std::vector<float> w(l.rows * l.cols);
        for (float& v : w) v = dist(rng);
        if (c.format == Format::kBf16) {
          std::vector<uint16_t> b(w.size());
          for (size_t k = 0; k < w.size(); ++k) b[k] = F32ToBf16(w[k]);
          plain.push_back(std::move(b));
          Weight x;
          x.format = Format::kBf16;
          x.rows = l.rows;
          x.cols = l.cols;
          x.data = plain.back().data();
          weights.push_back(x);
        } else {
          quantized.push_back(*quant::QuantizeLinear(
              w.data(), l.rows, l.cols, quant::QuantizeOptions{c.format, c.zeros, true}, &pool));
          weights.push_back(quantized.back().View());
        }
      }
    }
    int64_t bytes = 0;
    double flops_per_row = 0.0;
    for (Weight& w : weights) {
      bytes += w.Bytes();
      flops_per_row += 2.0 * w.rows * w.cols;
      storage.emplace_back();
      auto prepared = backend.PrepareWeight(w, &storage.back());
      if (!prepared.ok()) {
        std::fprintf(stderr, "%s\n", prepared.status().message().c_str());
        return 1;
      }
      w = *prepared;
    }
    auto pass = [&](int64_t rows, std::vector<float>& x, std::vector<float>& out) {
      for (const Weight& w : weights) {
        MatmulParams p;
        p.x = x.data();
        p.rows = rows;
        p.w[0] = &w;
        p.out[0] = out.data();
        backend.Matmul(p);
      }
    };
    auto best = [&](int64_t rows) {
      std::vector<float> x(rows * 1152), out(rows * 8192);
      for (float& v : x) v = dist(rng) * 20.0f;
      pass(rows, x, out);
      double t = 1e30;
      for (int r = 0; r < reps; ++r) {
        double t0 = Now();
        pass(rows, x, out);
        t = std::min(t, Now() - t0);
      }
      return t;
    };
    double decode = best(1);
    double sixteen = best(16);
    double prefill = best(128);
    if (c.format == Format::kBf16) bf16_us = decode * 1e6;
    std::printf("%-14s %10.2f %12.1f %10.2f %9.2fx %12.1f %12.1f %14.1f\n", c.name, bytes / 1e6,
                decode * 1e6, bytes / decode / 1e9, bf16_us / (decode * 1e6), sixteen * 1e6,
                flops_per_row * 16 / sixteen / 1e9, flops_per_row * 128 / prefill / 1e9);
  }
  return 0;
}

}  // namespace
}  // namespace gizllm

int main(int argc, char** argv) {
  int threads = 2, reps = 20;
  gizllm::CpuOptions options;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--bf16") {
      options.bf16_activations = true;
    } else if (a == "--int8") {
      options.int8_activations = true;
    } else if (a == "--threads" && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else {
      std::printf("usage: quant_bench [--threads N] [--reps N] [--bf16] [--int8]\n");
      return a == "--help" ? 0 : 1;
    }
  }
  if (gizllm::Status s = options.Check(); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.message().c_str());
    return 1;
  }
  return gizllm::Run(std::max(1, threads), std::max(1, reps), options);
}
