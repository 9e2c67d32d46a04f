// End-to-end speed of one sequence on the CPU: prompt tokens/s (a 128-token prompt, logits of its
// last row only) and decode tokens/s, with 1 and 2 threads, against this machine's memory read
// bandwidth measured in the same run (bytes of weights and KV a decode step reads over it).
//
// Usage: model_bench [--model DIR] [--prompt 128] [--decode 128] [--reps 5] [--bf16] [--kv f32|f16]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/check.h"
#include "core/thread_pool.h"
#include "model/model.h"
#include "ops/device.h"

namespace gizllm {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// GB/s of a streaming read of `bytes` (well beyond the last-level cache) with `threads`.
double ReadBandwidth(int threads, size_t bytes) {
  std::vector<uint64_t> data(bytes / 8);
  for (size_t i = 0; i < data.size(); ++i) data[i] = i;
  ThreadPool pool(threads);
  std::vector<uint64_t> sums(threads);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    auto start = Clock::now();
    pool.ParallelFor(static_cast<int64_t>(data.size()), 4096, [&](int64_t b, int64_t e, int t) {
      uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      for (int64_t i = b; i + 3 < e; i += 4) {
        s0 += data[i], s1 += data[i + 1], s2 += data[i + 2], s3 += data[i + 3];
      }
      sums[t] += s0 + s1 + s2 + s3;
    });
    best = std::max(best, bytes / Since(start) / 1e9);
  }
  return best;
}

struct Figures {
  double prompt_tps = 0;
  double decode_tps = 0;
};

Figures Measure(Model& model, int prompt, int decode, int reps) {
  const int64_t vocab = model.arch().vocab;
  const int32_t max_pages = (prompt + decode + kPage - 1) / kPage + 1;
  std::vector<int32_t> pages(max_pages);
  std::iota(pages.begin(), pages.end(), 0);
  PageTables tables{pages.data(), 1, max_pages};
  CHECK(model.AllocatePages(max_pages).ok());
  CHECK(model.Reserve(prompt, 1, max_pages).ok());
  std::mt19937 rng(1);
  std::vector<int32_t> ids(prompt);
  for (int32_t& t : ids) t = static_cast<int32_t>(rng() % vocab);
  std::vector<float> logits(vocab);
  Figures best;
  for (int rep = 0; rep < reps; ++rep) {
    Rows rows;
    for (int p = 0; p < prompt; ++p) rows.Push(ids[p], 0, p, p + 1 == prompt);
    auto start = Clock::now();
    CHECK(model.Step(rows, tables, logits.data()).ok());
    best.prompt_tps = std::max(best.prompt_tps, prompt / Since(start));
    start = Clock::now();
    for (int d = 0; d < decode; ++d) {
      rows.Clear();
      int32_t next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) -
                                          logits.begin());
      rows.Push(next, 0, prompt + d, true);
      CHECK(model.Step(rows, tables, logits.data()).ok());
    }
    best.decode_tps = std::max(best.decode_tps, decode / Since(start));
  }
  return best;
}

int Main(int argc, char** argv) {
  std::string dir = "models/tiny-chat";
  int prompt = 128, decode = 128, reps = 5;
  bool bf16 = false;
  KvFormat kv_format = KvFormat::kF32;
  LoadOptions load;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--bf16") {
      bf16 = true;
    } else if (a == "--kv" && has_value) {
      auto bits = ParseKvBits(argv[++i]);
      CHECK(bits.ok() && KvFormatOf(*bits).has_value());
      kv_format = *KvFormatOf(*bits);
    } else if (a == "--model" && has_value) {
      dir = argv[++i];
    } else if (a == "--prompt" && has_value) {
      prompt = std::stoi(argv[++i]);
    } else if (a == "--decode" && has_value) {
      decode = std::stoi(argv[++i]);
    } else if (a == "--reps" && has_value) {
      reps = std::stoi(argv[++i]);
    } else {
      std::fprintf(stderr,
                   "usage: model_bench [--model DIR] [--prompt N] [--decode N] [--reps N] "
                   "[--bf16] [--kv f32|f16]\n");
      return 2;
    }
  }
  load.kv = kv_format;
  std::printf("model %s, prompt %d tokens, decode %d tokens, best of %d%s, %s KV pages\n",
              dir.c_str(), prompt, decode, reps, bf16 ? ", bf16 activations" : "",
              KvFormatName(kv_format).c_str());
  std::printf("%-8s %12s %14s %14s %14s %12s\n", "threads", "read GB/s", "prompt tok/s",
              "decode tok/s", "decode GB/s", "% of read");
  for (int threads : {1, 2}) {
    DeviceOptions device;
    device.device = "cpu";
    device.threads = threads;
    device.bf16 = bf16;
    device.exact = !bf16;  // float32 activations unless asked (the CPU's default would round)
    auto backend = OpenBackend(device);
    CHECK(backend.ok());
    auto model = Model::Load(dir, *backend, load);
    if (!model.ok()) {
      std::fprintf(stderr, "%s\n", model.status().message().c_str());
      return 1;
    }
    double bandwidth = ReadBandwidth(threads, size_t{1} << 30);
    Figures f = Measure(**model, prompt, decode, reps);
    // A decode step reads every weight once (the tied head reads the whole embedding) and the
    // keys and values of the positions so far (mean over the decoded tokens).
    const Arch& a = (*model)->arch();
    double kv = a.layers * 2.0 * a.KvDim() * KvFormatBytes(kv_format) * (prompt + decode / 2.0);
    double bytes = static_cast<double>((*model)->WeightBytes()) + kv;
    double gbs = f.decode_tps * bytes / 1e9;
    std::printf("%-8d %12.1f %14.0f %14.0f %14.1f %11.0f%%\n", threads, bandwidth, f.prompt_tps,
                f.decode_tps, gbs, 100.0 * gbs / bandwidth);
  }
  return 0;
}

}  // namespace
}  // namespace gizllm

int main(int argc, char** argv) { return gizllm::Main(argc, argv); }
