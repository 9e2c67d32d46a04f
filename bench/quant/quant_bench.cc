// The linears of one tiny-chat token (Qwen3, 8 layers: q/k/v, o, gate/up, down; plus the head
// 8192 x 384) through CpuBackend::Matmul in each format, in the calls Model::Forward makes (q/k/v
// in one, gate/up in one with the SwiGLU end), against bf16 on the same backend:
// decode (1 row) time per token, its effective weight bandwidth, 16 rows (16 sequences' decode
// step) and prefill (128 rows) in GFLOP/s. --bf16 and --int8 set the backend's options of those
// names (CpuOptions), with the weights prepared by the backend as Model::Load prepares them.
// --one-layer: every layer reads the first layer's weights (3.4 MB in bf16, which stay cached),
// to set the cost of streaming each layer's own weights from memory against the arithmetic.
// Usage: quant_bench [--threads N] [--reps N] [--bf16] [--int8] [--one-layer]
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

// tiny-chat: dim 384, q 384, kv 128, ffn 1152, vocab 8192, 8 layers.
constexpr int kLayers = 8;
constexpr int64_t kDim = 384, kKv = 128, kFfn = 1152, kVocab = 8192;

// One Matmul call as Model::Forward issues it: q/k/v together, o, gate/up together (with the
// SwiGLU end where the backend fuses it), down, and the head.
struct Call {
  int w[3];
  int outputs;
  bool swiglu;
};

struct Case {
  const char* name;
  Format format;
  bool zeros;
};

int Run(int threads, int reps, const CpuOptions& options, bool one_layer) {
  ThreadPool pool(threads);
  CpuBackend backend(&pool, options);
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 0.05f);
  const Case cases[] = {{"bf16", Format::kBf16, false}, {"q8", Format::kQ8, false},
                        {"q4", Format::kQ4, true},      {"q4 (no zeros)", Format::kQ4, false},
                        {"q2", Format::kQ2, true},      {"q1", Format::kQ1, false}};
  std::printf("%s, tiny-chat linears per token (%d threads%s)\n", backend.Describe().c_str(),
              threads, one_layer ? ", every layer reading the first layer's weights" : "");
  std::printf("%-14s %10s %12s %10s %10s %12s %12s %14s\n", "format", "MB/token", "decode us",
              "GB/s", "vs bf16", "16 rows us", "16 GF/s", "prefill GF/s");
  double bf16_us = 0.0;
  for (const Case& c : cases) {
    // One distinct weight per linear of the token, as a real model reads them.
    std::vector<std::vector<uint16_t>> plain;
    std::vector<quant::QuantizedLinear> quantized;
    std::vector<Weight> weights;
    std::vector<std::unique_ptr<Buffer>> storage;
    auto make = [&](int64_t rows, int64_t cols) {
      std::vector<float> w(rows * cols);
      for (float& v : w) v = dist(rng);
      if (c.format == Format::kBf16) {
        std::vector<uint16_t> b(w.size());
        for (size_t k = 0; k < w.size(); ++k) b[k] = F32ToBf16(w[k]);
        plain.push_back(std::move(b));
        Weight x;
        x.format = Format::kBf16;
        x.rows = rows;
        x.cols = cols;
        x.data = plain.back().data();
        weights.push_back(x);
      } else {
        quantized.push_back(*quant::QuantizeLinear(
            w.data(), rows, cols, quant::QuantizeOptions{c.format, c.zeros, true}, &pool));
        weights.push_back(quantized.back().View());
      }
      return static_cast<int>(weights.size()) - 1;
    };
    std::vector<Call> calls;  // a token's, in turn
    Call layer[4];
    for (int l = 0; l < kLayers; ++l) {
      if (l == 0 || !one_layer) {
        layer[0] = {{make(kDim, kDim), make(kKv, kDim), make(kKv, kDim)}, 3, false};
        layer[1] = {{make(kDim, kDim)}, 1, false};
        layer[2] = {{make(kFfn, kDim), make(kFfn, kDim)}, 2, backend.FusesSwiGlu()};
        layer[3] = {{make(kDim, kFfn)}, 1, false};
      }
      calls.insert(calls.end(), layer, layer + 4);
    }
    calls.push_back({{make(kVocab, kDim)}, 1, false});
    int64_t bytes = 0;
    double flops_per_row = 0.0;
    for (const Call& call : calls) {
      for (int o = 0; o < call.outputs; ++o) {
        const Weight& w = weights[call.w[o]];
        bytes += w.Bytes();
        flops_per_row += 2.0 * w.rows * w.cols;
      }
    }
    for (Weight& w : weights) {
      storage.emplace_back();
      auto prepared = backend.PrepareWeight(w, &storage.back());
      if (!prepared.ok()) {
        std::fprintf(stderr, "%s\n", prepared.status().message().c_str());
        return 1;
      }
      w = *prepared;
    }
    auto pass = [&](int64_t rows, std::vector<float>& x, std::vector<float>* out) {
      for (const Call& call : calls) {
        MatmulParams p;
        p.x = x.data();
        p.rows = rows;
        p.outputs = call.outputs;
        for (int o = 0; o < call.outputs; ++o) {
          p.w[o] = &weights[call.w[o]];
          p.out[o] = out[o].data();
        }
        p.swiglu = call.swiglu;
        backend.Matmul(p);
      }
    };
    auto best = [&](int64_t rows) {
      std::vector<float> x(rows * kFfn), out[3];
      for (auto& o : out) o.resize(rows * kVocab);
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
  bool one_layer = false;
  gizllm::CpuOptions options;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--bf16") {
      options.bf16_activations = true;
    } else if (a == "--int8") {
      options.int8_activations = true;
    } else if (a == "--one-layer") {
      one_layer = true;
    } else if (a == "--threads" && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else {
      std::printf("usage: quant_bench [--threads N] [--reps N] [--bf16] [--int8] [--one-layer]\n");
      return a == "--help" ? 0 : 1;
    }
  }
  if (gizllm::Status s = options.Check(); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.message().c_str());
    return 1;
  }
  return gizllm::Run(std::max(1, threads), std::max(1, reps), options, one_layer);
}
