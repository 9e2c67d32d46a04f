// Benchmarks of the CPU kernels against what the machine can do:
//  - read bandwidth: a streaming sum over a buffer larger than L3 (and over a buffer the size of
//    tiny-chat's weights, which repeated decode steps read), 1 and N threads;
//  - matmul: the linears of every layer of tiny-chat (Qwen3, 8 layers, hidden 384, q 384,
//    kv 128, ffn 1152, tied head 8192, bf16, 33.8 MB) for one row (decode: GB/s and its ratio to
//    the read bandwidth) and for 128 rows (prefill: GFLOP/s);
//  - forward: every op of one forward pass of that shape (norms, rope, KV write, attention,
//    SwiGLU, residuals, head), as tokens per second; the decode attention of 16 sequences (the
//    rate it reads their float32 KV pages at).
// Usage: cpu_bench [--threads 1,2] [--quick] [--bf16] [--cpu-time] [--attention]
// (--attention: only the decode attention of 16 sequences, many times, for a profiler)
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/dtype.h"

namespace gizllm {
namespace {

// With --cpu-time: the process's CPU time instead of wall time. On a machine shared with other
// work, it counts only the time the benchmark ran (meaningful for one thread only: with more,
// it adds up the threads).
bool g_cpu_time = false;

double Now() {
  if (g_cpu_time) {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Best time of `reps` runs of fn after one warm-up run.
template <typename Fn>
double BestSeconds(int reps, Fn&& fn) {
  fn();
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    double t0 = Now();
    fn();
    best = std::min(best, Now() - t0);
  }
  return best;
}

GZ_TARGET_AVX512 float SumAvx512(const float* p, int64_t n) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i < n; i += 64) {
    a0 = _mm512_add_ps(a0, _mm512_load_ps(p + i));
    a1 = _mm512_add_ps(a1, _mm512_load_ps(p + i + 16));
    a2 = _mm512_add_ps(a2, _mm512_load_ps(p + i + 32));
    a3 = _mm512_add_ps(a3, _mm512_load_ps(p + i + 48));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

// GB/s of a streaming read of `bytes` split over the pool's threads.
double ReadBandwidth(ThreadPool& pool, size_t bytes, int reps) {
  const int64_t n = bytes / sizeof(float);
  float* buf = static_cast<float*>(std::aligned_alloc(64, bytes));
  for (int64_t i = 0; i < n; ++i) buf[i] = static_cast<float>(i & 7);
  std::vector<float> sink(pool.threads());
  double s = BestSeconds(reps, [&] {
    pool.ParallelFor(n, 1 << 14,
                     [&](int64_t b, int64_t e, int t) { sink[t] += SumAvx512(buf + b, e - b); });
  });
  std::free(buf);
  return bytes / s / 1e9;
}

// tiny-chat's shape.
constexpr int kLayers = 8, kDim = 384, kHeads = 6, kKvHeads = 2, kHeadDim = 64, kFfn = 1152,
              kVocab = 8192;

struct Layer {
  std::vector<uint16_t> q, k, v, o, gate, up, down;  // bf16 [outputs, inputs]
  Weight wq, wk, wv, wo, wgate, wup, wdown;
  std::vector<float> norm1, norm2, q_norm, k_norm;
};

std::vector<uint16_t> RandomBf16(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 0.05f);
  std::vector<uint16_t> v(n);
  for (auto& h : v) h = F32ToBf16(d(rng));
  return v;
}

struct Model {
  std::vector<Layer> layers;
  std::vector<uint16_t> embed;  // [vocab, dim], also the head
  Weight wembed;
  std::vector<float> final_norm;
  int64_t weight_bytes = 0;

  explicit Model(std::mt19937& rng) : layers(kLayers) {
    auto make = [&](std::vector<uint16_t>& data, Weight& w, int64_t rows, int64_t cols) {
      data = RandomBf16(rows * cols, rng);
      w = Weight{.format = Format::kBf16, .rows = rows, .cols = cols, .data = data.data()};
      weight_bytes += rows * cols * 2;
    };
    for (Layer& l : layers) {
      make(l.q, l.wq, kHeads * kHeadDim, kDim);
      make(l.k, l.wk, kKvHeads * kHeadDim, kDim);
      make(l.v, l.wv, kKvHeads * kHeadDim, kDim);
      make(l.o, l.wo, kDim, kHeads * kHeadDim);
      make(l.gate, l.wgate, kFfn, kDim);
      make(l.up, l.wup, kFfn, kDim);
      make(l.down, l.wdown, kDim, kFfn);
      l.norm1.assign(kDim, 1.0f);
      l.norm2.assign(kDim, 1.0f);
      l.q_norm.assign(kHeadDim, 1.0f);
      l.k_norm.assign(kHeadDim, 1.0f);
    }
    make(embed, wembed, kVocab, kDim);
    final_norm.assign(kDim, 1.0f);
  }

  // Every weight as `backend` prepares it at load (the packed bf16 panels with bf16
  // activations; the host data otherwise), kept in `storage`, which must outlive the backend's
  // use of the returned model. The copy's own data vectors are left empty.
  Model PreparedFor(Backend& backend, std::vector<std::unique_ptr<Buffer>>& storage) const {
    Model out(*this, Shallow{});
    auto prepare = [&](const Weight& host, Weight& w) {
      auto made = backend.PrepareWeight(host, &storage.emplace_back());
      if (!made.ok()) {
        std::fprintf(stderr, "%s\n", made.status().message().c_str());
        std::exit(1);
      }
      w = *made;
    };
    for (size_t i = 0; i < layers.size(); ++i) {
      const Layer& a = layers[i];
      Layer& b = out.layers[i];
      prepare(a.wq, b.wq), prepare(a.wk, b.wk), prepare(a.wv, b.wv), prepare(a.wo, b.wo);
      prepare(a.wgate, b.wgate), prepare(a.wup, b.wup), prepare(a.wdown, b.wdown);
    }
    prepare(wembed, out.wembed);
    return out;
  }

 private:
  struct Shallow {};
  // The weights' descriptions, norms and size of `m` without its weight data.
  Model(const Model& m, Shallow)
      : layers(m.layers.size()),
        wembed(m.wembed),
        final_norm(m.final_norm),
        weight_bytes(m.weight_bytes) {
    for (size_t i = 0; i < layers.size(); ++i) {
      const Layer& a = m.layers[i];
      Layer& b = layers[i];
      b.wq = a.wq, b.wk = a.wk, b.wv = a.wv, b.wo = a.wo;
      b.wgate = a.wgate, b.wup = a.wup, b.wdown = a.wdown;
      b.norm1 = a.norm1, b.norm2 = a.norm2, b.q_norm = a.q_norm, b.k_norm = a.k_norm;
    }
  }
};

// Activations and KV cache for `rows` rows of one sequence at positions [start, start + rows).
struct State {
  int64_t rows;
  std::vector<float> x, residual, h, q, k, v, att, gate, up, logits;
  std::vector<float> keys, values;  // per layer, [pages, kPage, kv_heads, head_dim]
  std::vector<int32_t> tokens, slots, positions, pages;
  int max_pages;
  State(int64_t rows, int context) : rows(rows) {
    max_pages = (context + kPage - 1) / kPage;
    x.assign(rows * kDim, 0.1f);
    residual = h = x;
    q.assign(rows * kHeads * kHeadDim, 0.0f);
    att = q;
    k.assign(rows * kKvHeads * kHeadDim, 0.0f);
    v = k;
    gate.assign(rows * kFfn, 0.0f);
    up = gate;
    logits.assign(kVocab, 0.0f);
    keys.assign(static_cast<size_t>(kLayers) * max_pages * kPage * kKvHeads * kHeadDim, 0.01f);
    values = keys;
    tokens.assign(rows, 5);
    slots.assign(rows, 0);
    positions.resize(rows);
    pages.resize(max_pages);
    for (int i = 0; i < max_pages; ++i) pages[i] = i;
  }
};

// Every op of one forward pass of `state.rows` rows at positions [start, start + rows); logits
// for the last row only. With matmuls_only, just the linears.
void Forward(Backend& b, const Model& m, State& s, int start, bool matmuls_only,
             const std::vector<float>& inv_freq) {
  const int64_t rows = s.rows;
  for (int64_t r = 0; r < rows; ++r) s.positions[r] = start + static_cast<int32_t>(r);
  if (!matmuls_only) {
    b.Embed(
        {.out = s.residual.data(), .table = &m.wembed, .tokens = s.tokens.data(), .rows = rows});
  }
  const int64_t layer_floats = static_cast<int64_t>(s.max_pages) * kPage * kKvHeads * kHeadDim;
  for (int l = 0; l < kLayers; ++l) {
    const Layer& L = m.layers[l];
    KvLayer cache{s.keys.data() + l * layer_floats, s.values.data() + l * layer_floats};
    PageTable table{s.pages.data(), s.max_pages};
    if (!matmuls_only) {
      b.RmsNorm({.out = s.h.data(),
                 .x = s.residual.data(),
                 .weight = L.norm1.data(),
                 .rows = rows,
                 .dim = kDim});
    }
    MatmulParams qkv;
    qkv.x = s.h.data();
    qkv.rows = rows;
    qkv.outputs = 3;
    qkv.w[0] = &L.wq, qkv.w[1] = &L.wk, qkv.w[2] = &L.wv;
    qkv.out[0] = s.q.data(), qkv.out[1] = s.k.data(), qkv.out[2] = s.v.data();
    b.Matmul(qkv);
    if (!matmuls_only) {
      b.Rope({.x = s.q.data(),
              .rows = rows,
              .heads = kHeads,
              .head_dim = kHeadDim,
              .rotary_dims = kHeadDim,
              .positions = s.positions.data(),
              .inv_freq = inv_freq.data(),
              .norm = L.q_norm.data()});
      b.Rope({.x = s.k.data(),
              .rows = rows,
              .heads = kKvHeads,
              .head_dim = kHeadDim,
              .rotary_dims = kHeadDim,
              .positions = s.positions.data(),
              .inv_freq = inv_freq.data(),
              .norm = L.k_norm.data()});
      b.KvWrite({.cache = cache,
                 .table = table,
                 .k = s.k.data(),
                 .v = s.v.data(),
                 .slots = s.slots.data(),
                 .positions = s.positions.data(),
                 .rows = rows,
                 .kv_heads = kKvHeads,
                 .head_dim = kHeadDim});
      b.Attention({.out = s.att.data(),
                   .q = s.q.data(),
                   .cache = cache,
                   .table = table,
                   .slots = s.slots.data(),
                   .positions = s.positions.data(),
                   .rows = rows,
                   .heads = kHeads,
                   .kv_heads = kKvHeads,
                   .head_dim = kHeadDim,
                   .scale = 0.125f});
    }
    MatmulParams o;
    o.x = s.att.data();
    o.rows = rows;
    o.w[0] = &L.wo;
    o.out[0] = s.x.data();
    b.Matmul(o);
    if (!matmuls_only) {
      b.RmsNorm({.out = s.h.data(),
                 .x = s.x.data(),
                 .residual = s.residual.data(),
                 .weight = L.norm2.data(),
                 .rows = rows,
                 .dim = kDim});
    }
    MatmulParams gu;
    gu.x = s.h.data();
    gu.rows = rows;
    gu.outputs = 2;
    gu.w[0] = &L.wgate, gu.w[1] = &L.wup;
    gu.out[0] = s.gate.data(), gu.out[1] = s.up.data();
    b.Matmul(gu);
    if (!matmuls_only) {
      b.Glu({.out = s.gate.data(), .gate = s.gate.data(), .up = s.up.data(), .n = rows * kFfn});
    }
    MatmulParams down;
    down.x = s.gate.data();
    down.rows = rows;
    down.w[0] = &L.wdown;
    down.out[0] = s.x.data();
    b.Matmul(down);
    if (!matmuls_only) b.Add({.out = s.residual.data(), .x = s.x.data(), .n = rows * kDim});
  }
  if (!matmuls_only) {
    b.RmsNorm({.out = s.h.data(),
               .x = s.residual.data() + (rows - 1) * kDim,
               .weight = m.final_norm.data(),
               .rows = 1,
               .dim = kDim});
  }
  MatmulParams head;
  head.x = s.h.data();
  head.rows = 1;
  head.w[0] = &m.wembed;
  head.out[0] = s.logits.data();
  b.Matmul(head);
}

// Flops of the linears of a forward pass of `rows` rows (head for one row).
double MatmulFlops(int64_t rows) {
  double per_row = 2.0 * kLayers *
                   (static_cast<double>(kDim) * (kHeads + 2 * kKvHeads) * kHeadDim +
                    kHeads * kHeadDim * kDim + 3.0 * kDim * kFfn);
  return per_row * rows + 2.0 * kDim * kVocab;
}

// Microseconds per call of the non-matmul ops of one layer for `rows` rows at positions
// [start, start + rows).
void OpTimes(Backend& b, const Model& m, int64_t rows, int start, int reps,
             const std::vector<float>& inv_freq) {
  State s(rows, start + static_cast<int>(rows));
  for (int64_t r = 0; r < rows; ++r) s.positions[r] = start + static_cast<int32_t>(r);
  const Layer& L = m.layers[0];
  KvLayer cache{s.keys.data(), s.values.data()};
  PageTable table{s.pages.data(), s.max_pages};
  auto us = [&](auto&& fn) { return BestSeconds(reps, fn) * 1e6; };
  double norm = us([&] {
    b.RmsNorm({.out = s.h.data(),
               .x = s.x.data(),
               .residual = s.residual.data(),
               .weight = L.norm2.data(),
               .rows = rows,
               .dim = kDim});
  });
  double rope = us([&] {
    b.Rope({.x = s.q.data(),
            .rows = rows,
            .heads = kHeads,
            .head_dim = kHeadDim,
            .rotary_dims = kHeadDim,
            .positions = s.positions.data(),
            .inv_freq = inv_freq.data(),
            .norm = L.q_norm.data()});
  });
  double attention = us([&] {
    b.Attention({.out = s.att.data(),
                 .q = s.q.data(),
                 .cache = cache,
                 .table = table,
                 .slots = s.slots.data(),
                 .positions = s.positions.data(),
                 .rows = rows,
                 .heads = kHeads,
                 .kv_heads = kKvHeads,
                 .head_dim = kHeadDim,
                 .scale = 0.125f});
  });
  double swiglu = us([&] {
    b.Glu({.out = s.gate.data(), .gate = s.gate.data(), .up = s.up.data(), .n = rows * kFfn});
  });
  std::printf(
      "ops of one layer, %lld row(s) at position %d: rms_norm %.1f us, rope(q) %.1f us, "
      "attention %.1f us, swiglu %.1f us\n",
      static_cast<long long>(rows), start, norm, rope, attention, swiglu);
}

// Decode attention of one layer for `rows` sequences (one row each, slots of their own with their
// pages scattered in the pool) at position `context`, over pages of `format`: time and the rate it
// reads the keys and values at.
void DecodeAttention(Backend& b, int rows, int context, int reps, KvFormat format, bool cold) {
  const int max_pages = context / kPage + 1;
  const int64_t pool_pages = static_cast<int64_t>(rows) * max_pages;
  std::vector<int32_t> table(pool_pages), slots(rows), positions(rows, context);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937(5));
  std::iota(slots.begin(), slots.end(), 0);
  const size_t cache = static_cast<size_t>(pool_pages) * kPage * kKvHeads * kHeadDim;
  const size_t bytes_per = static_cast<size_t>(KvFormatBytes(format));
  // Small varied values, the same bytes in either format (a float pattern or a half pattern).
  std::vector<uint8_t> keys(cache * bytes_per), values(cache * bytes_per);
  for (size_t i = 0; i < keys.size(); ++i) {
    keys[i] = static_cast<uint8_t>(i % bytes_per == bytes_per - 1 ? 0x3c : i * 7);
    values[i] = static_cast<uint8_t>(i % bytes_per == bytes_per - 1 ? 0x3c : i * 13);
  }
  // 8-bit pages: a scale per position and kv head.
  const size_t scale_count = format == KvFormat::kQ8 ? cache / kHeadDim : 0;
  std::vector<float> key_scales(scale_count, 0.01f), value_scales(scale_count, 0.02f);
  std::vector<float> q(static_cast<size_t>(rows) * kHeads * kHeadDim, 0.1f), out(q.size());
  // Cold: a 64 MB read before each call evicts the keys and values from the caches, as a
  // model step's weights do (the median call is reported then).
  std::vector<float> evict(cold ? (64 << 20) / sizeof(float) : 0, 1.0f);
  std::vector<double> times;
  float sink = 0.0f;
  auto call = [&] {
    b.Attention(
        {.out = out.data(),
         .q = q.data(),
         .cache = {keys.data(), values.data(), format, key_scales.data(), value_scales.data()},
         .table = {table.data(), max_pages},
         .slots = slots.data(),
         .positions = positions.data(),
         .rows = rows,
         .heads = kHeads,
         .kv_heads = kKvHeads,
         .head_dim = kHeadDim,
         .scale = 0.125f});
  };
  double t;
  if (cold) {
    for (int i = 0; i < reps; ++i) {
      sink += SumAvx512(evict.data(), static_cast<int64_t>(evict.size()));
      const double t0 = Now();
      call();
      times.push_back(Now() - t0);
    }
    std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
    t = times[times.size() / 2] + (sink == 0.5f ? 1e-12 : 0.0);
  } else {
    t = BestSeconds(reps, call);
  }
  const double bytes =
      2.0 * rows * (context + 1) * kKvHeads * (kHeadDim * bytes_per + KvFormatScaleBytes(format, kHeadDim));
  std::printf(
      "decode attention of one layer, %d sequences at position %d, %s pages%s: %.1f us, %.2f MB "
      "of KV at %.1f GB/s\n",
      rows, context, KvFormatName(format).c_str(), cold ? " (cold)" : "", t * 1e6, bytes / 1e6,
      bytes / t / 1e9);
}

// Error of bf16 activations: the logits of a 16-row forward pass with and without them,
// max |difference| / max |logit|.
void Bf16Error(ThreadPool& pool, const Model& m, const std::vector<float>& inv_freq) {
  auto exact = MakeCpuBackend(&pool, CpuOptions{});
  auto rounded = MakeCpuBackend(&pool, CpuOptions{.isa = std::nullopt, .bf16_activations = true});
  if (!exact.ok() || !rounded.ok()) return;
  std::vector<std::unique_ptr<Buffer>> storage;
  const Model packed = m.PreparedFor(**rounded, storage);
  std::mt19937 rng(7);
  State a(16, 16), b(16, 16);
  for (int64_t r = 0; r < 16; ++r) a.tokens[r] = b.tokens[r] = rng() % kVocab;
  Forward(**exact, m, a, 0, false, inv_freq);
  Forward(**rounded, packed, b, 0, false, inv_freq);
  float max_logit = 0.0f, max_diff = 0.0f;
  for (int i = 0; i < kVocab; ++i) {
    max_logit = std::max(max_logit, std::abs(a.logits[i]));
    max_diff = std::max(max_diff, std::abs(a.logits[i] - b.logits[i]));
  }
  std::printf("bf16 activations: max |logit difference| %.3g = %.3g of max |logit| %.3g\n",
              max_diff, max_diff / max_logit, max_logit);
}

int Main(int argc, char** argv) {
  std::vector<int> thread_counts = {1, 2};
  bool quick = false;
  bool bf16 = false;
  bool attention_only = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--quick") {
      quick = true;
    } else if (a == "--cpu-time") {
      g_cpu_time = true;
    } else if (a == "--bf16") {
      bf16 = true;
    } else if (a == "--attention") {
      attention_only = true;
    } else if (a == "--threads" && i + 1 < argc) {
      thread_counts.clear();
      for (const char* p = argv[++i]; *p;) {
        thread_counts.push_back(std::atoi(p));
        while (*p && *p != ',') ++p;
        if (*p == ',') ++p;
      }
    } else {
      std::fprintf(
          stderr,
          "usage: cpu_bench [--threads 1,2] [--quick] [--bf16] [--cpu-time] [--attention]\n");
      return 2;
    }
  }
  const int reps = quick ? 3 : 10;
  std::mt19937 rng(1);
  const Model base(rng);
  std::vector<float> inv_freq(kHeadDim / 2);
  for (int i = 0; i < kHeadDim / 2; ++i) inv_freq[i] = std::pow(1e6f, -2.0f * i / kHeadDim);
  std::printf("isa %s, avx512_bf16 %d; tiny-chat shape, %.1f MB of bf16 weights\n",
              CpuIsaName(DetectCpuIsa()), CpuHasAvx512Bf16() ? 1 : 0, base.weight_bytes / 1e6);

  for (int threads : thread_counts) {
    ThreadPool pool(threads);
    if (attention_only) {
      auto made = MakeCpuBackend(&pool, CpuOptions{});
      if (!made.ok()) return 1;
      std::printf("\n[%d thread%s] %s\n", threads, threads > 1 ? "s" : "",
                  (*made)->Describe().c_str());
      for (KvFormat format : {KvFormat::kF32, KvFormat::kF16, KvFormat::kQ8}) {
        DecodeAttention(**made, 16, 191, reps * 3000, format, false);
        DecodeAttention(**made, 16, 191, reps * 30, format, true);
      }
      continue;
    }
    const double dram = ReadBandwidth(pool, size_t{1} << 30, quick ? 2 : 5);
    const double warm = ReadBandwidth(pool, base.weight_bytes / 64 * 64, reps * 4);
    std::printf("\n[%d thread%s]\n", threads, threads > 1 ? "s" : "");
    std::printf(
        "read bandwidth: %.1f GB/s (1 GiB buffer), %.1f GB/s (%.1f MB buffer, read "
        "repeatedly)\n",
        dram, warm, base.weight_bytes / 1e6);
    CpuOptions options;
    options.bf16_activations = bf16;
    auto made = MakeCpuBackend(&pool, options);
    if (!made.ok()) {
      std::fprintf(stderr, "%s\n", made.status().message().c_str());
      return 1;
    }
    Backend& backend = **made;
    std::printf("backend: %s\n", backend.Describe().c_str());
    std::vector<std::unique_ptr<Buffer>> storage;
    const Model model = base.PreparedFor(backend, storage);

    State decode(1, 256);
    double t = BestSeconds(reps * 10, [&] { Forward(backend, model, decode, 0, true, inv_freq); });
    double gbs = model.weight_bytes / t / 1e9;
    std::printf(
        "decode matmuls (1 row): %.1f us/token, %.1f GB/s = %.2f x read bandwidth "
        "(%.2f x the %.1f MB repeated read)\n",
        t * 1e6, gbs, gbs / dram, gbs / warm, model.weight_bytes / 1e6);
    for (int context : {16, 128, 512}) {
      State d(1, context + 1);
      t = BestSeconds(reps * 10, [&] { Forward(backend, model, d, context, false, inv_freq); });
      std::printf("decode forward at position %d: %.1f us/token = %.0f tokens/s\n", context,
                  t * 1e6, 1.0 / t);
    }
    if (CpuHasAvx512Bf16()) Bf16Error(pool, base, inv_freq);
    OpTimes(backend, model, 1, 512, reps * 10, inv_freq);
    OpTimes(backend, model, 128, 0, reps, inv_freq);
    for (KvFormat format : {KvFormat::kF32, KvFormat::kF16, KvFormat::kQ8}) {
      DecodeAttention(backend, 16, 191, reps * 10, format, false);
      DecodeAttention(backend, 16, 191, reps * 10, format, true);
    }
    for (int rows : {16, 32, 64, 128}) {
      State prefill(rows, rows);
      t = BestSeconds(reps, [&] { Forward(backend, model, prefill, 0, true, inv_freq); });
      std::printf("prefill matmuls (%d rows): %.2f ms, %.1f GFLOP/s\n", rows, t * 1e3,
                  MatmulFlops(rows) / t / 1e9);
      t = BestSeconds(reps, [&] { Forward(backend, model, prefill, 0, false, inv_freq); });
      std::printf("prefill forward (%d rows): %.2f ms = %.0f tokens/s\n", rows, t * 1e3, rows / t);
    }
  }
  return 0;
}

}  // namespace
}  // namespace gizllm

int main(int argc, char** argv) { return gizllm::Main(argc, argv); }
