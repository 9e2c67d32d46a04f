// The CUDA backend on a Qwen3-8B-shaped model (hidden 4096, 36 layers, 32 query and 8 kv heads
// of 128, FFN 12288, vocab 151936, untied head) with random bf16 weights made in memory. It
// issues the ops of the forward pass (src/model/model.cc) in its order: embed; per layer norm,
// q/k/v, q and k norm + rotary, KV write, attention, output projection, fused residual norm,
// gate/up, SwiGLU, down; final norm, gather of the wanted rows, head.
//
// Measured in the same run: device copy bandwidth (bytes read + written) and the cuBLASLt bf16
// GEMM rate on random data; each figure is printed with its ratio to the limit they give. The
// prefill also times one layer's prompt attention alone, for the model's heads and for head_dim
// 256 (8 and 16 query heads over 4 and 8 kv heads), against the GEMM rate.
//
// With --bits L[/H] the linears of the layers (L) and the head (H, default L) are quantized
// (quant/layout.h: 8, 4, 2 or 1 bits, 16 for bf16): random codes and scales (q4 and q2 with zero
// points, as convert writes them), rotated, packed by the backend's PrepareWeight once per shape
// and copied on the device for every layer. The limits then count the bytes the kernels read
// (codes and per-group (mul, add) pairs).
//
// With --moe: one Qwen3-30B-A3B-shaped mixture-of-experts layer alone instead (ProfileMoe; with
// --bits L its experts quantized to L bits); with
// --encoder-attention the encoder attention alone (ProfileEncoderAttention); with --delta-rule
// one Qwen3.5-35B-A3B-shaped recurrent layer's gated delta rule alone (ProfileDeltaRule); with
// --kv-codes one layer's attention and KV write over fp16 and rotated pages (ProfileKvCodes).
//
// Usage: cuda_bench [--quick] [--exact] [--gemv-max-rows N] [--no-graphs] [--bits L[/H]]
//                   [--decode-only | --prefill-only | --moe | --attention | --encoder-attention
//                    | --delta-rule | --kv-codes]
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels.cuh"
#include "core/dtype.h"
#include "ops/backend.h"
#include "quant/hadamard.h"
#include "quant/layout.h"
#include "quant/quantize.h"

namespace gizllm {
namespace {

#define BENCH_CHECK(expr)                                                     \
  do {                                                                        \
    if (!(expr)) {                                                            \
      std::fprintf(stderr, "%s:%d: failed: %s\n", __FILE__, __LINE__, #expr); \
      std::exit(1);                                                           \
    }                                                                         \
  } while (0)

struct Shape {
  int64_t dim = 4096, layers = 36, heads = 32, kv_heads = 8, head_dim = 128, ffn = 12288;
  int64_t vocab = 151936;
  KvFormat kv = KvFormat::kF32;   // the pages' element type (--kv)
  int64_t LinearParams() const {  // per layer
    return dim * heads * head_dim + 2 * dim * kv_heads * head_dim + heads * head_dim * dim +
           3 * dim * ffn;
  }
  int64_t KvBytesPerPosition() const {
    return layers * kv_heads * head_dim * 2 * KvFormatBytes(kv);
  }
};

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Device-to-device copy of 2 GiB; bytes read + written per second.
double MeasureCopyBandwidth() {
  const size_t bytes = size_t{2} << 30;
  void *a = nullptr, *b = nullptr;
  BENCH_CHECK(cudaMalloc(&a, bytes) == cudaSuccess && cudaMalloc(&b, bytes) == cudaSuccess);
  BENCH_CHECK(cudaMemset(a, 0x3c, bytes) == cudaSuccess);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (int i = 0; i < 3; ++i) cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
  const int reps = 10;
  cudaEventRecord(start);
  for (int i = 0; i < reps; ++i)
    cudaMemcpy(i % 2 ? a : b, i % 2 ? b : a, bytes, cudaMemcpyDeviceToDevice);
  cudaEventRecord(stop);
  cudaEventSynchronize(stop);
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * bytes * reps / (ms * 1e-3);
}

// bf16 GEMM m = n = k = 8192 through cuBLASLt on random data; FLOP/s.
double MeasureGemmRate() {
  const int64_t s = 8192;
  std::vector<uint16_t> host(s * s);
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (auto& h : host) h = F32ToBf16(dist(rng));
  void *a, *b, *c, *ws;
  const size_t ws_bytes = 32 << 20;
  BENCH_CHECK(cudaMalloc(&a, s * s * 2) == cudaSuccess && cudaMalloc(&b, s * s * 2) == cudaSuccess);
  BENCH_CHECK(cudaMalloc(&c, s * s * 2) == cudaSuccess && cudaMalloc(&ws, ws_bytes) == cudaSuccess);
  cudaMemcpy(a, host.data(), s * s * 2, cudaMemcpyHostToDevice);
  std::shuffle(host.begin(), host.end(), rng);
  cudaMemcpy(b, host.data(), s * s * 2, cudaMemcpyHostToDevice);
  cublasLtHandle_t lt;
  BENCH_CHECK(cublasLtCreate(&lt) == CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulDesc_t desc;
  cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
  cublasLtMatrixLayout_t la, lb, lc;
  cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, s, s, s);
  cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, s, s, s);
  cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, s, s, s);
  cublasLtMatmulPreference_t pref;
  cublasLtMatmulPreferenceCreate(&pref);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                       sizeof(ws_bytes));
  cublasLtMatmulHeuristicResult_t result;
  int found = 0;
  cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 1, &result, &found);
  BENCH_CHECK(found > 0);
  float alpha = 1, beta = 0;
  auto run = [&] {
    BENCH_CHECK(cublasLtMatmul(lt, desc, &alpha, a, la, b, lb, &beta, c, lc, c, lc, &result.algo,
                               ws, ws_bytes, 0) == CUBLAS_STATUS_SUCCESS);
  };
  for (int i = 0; i < 3; ++i) run();
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  const int reps = 10;
  cudaEventRecord(start);
  for (int i = 0; i < reps; ++i) run();
  cudaEventRecord(stop);
  cudaEventSynchronize(stop);
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cublasLtDestroy(lt);
  cudaFree(a), cudaFree(b), cudaFree(c), cudaFree(ws);
  return 2.0 * s * s * s * reps / (ms * 1e-3);
}

// Random bf16 values (normal, std 0.02), copied from one pool at random offsets.
class RandomSource {
 public:
  explicit RandomSource(Backend* backend) : backend_(backend) {
    std::mt19937 rng(1);
    std::normal_distribution<float> dist(0.0f, 0.02f);
    pool_.resize(kPool + (size_t{1} << 20));
    for (auto& v : pool_) v = F32ToBf16(dist(rng));
  }
  // Fills `count` bf16 values at dst (a device pointer).
  void FillBf16(void* dst, size_t count) {
    uint8_t* d = static_cast<uint8_t*>(dst);
    for (size_t done = 0; done < count;) {
      size_t piece = std::min(count - done, kPool);
      size_t offset = rng_() % (pool_.size() - piece + 1);
      backend_->CopyToDevice(d + done * 2, pool_.data() + offset, piece * 2);
      done += piece;
    }
  }

 private:
  static constexpr size_t kPool = size_t{64} << 20;  // values
  Backend* backend_;
  std::vector<uint16_t> pool_;
  std::mt19937 rng_{2};
};

struct Layer {
  Weight q, k, v, o, gate, up, down;
  float *attn_norm, *ffn_norm, *q_norm, *k_norm;
  KvLayer kv;
};

class Bench {
 public:
  // layer_bits, head_bits: 16 (bf16) or 8, 4, 2, 1 (quantized linears).
  Bench(Backend* backend, const Shape& s, int64_t max_rows, int32_t pages, int layer_bits = 16,
        int head_bits = 16)
      : be_(*backend), s_(s), random_(backend) {
    auto plain = [&](int64_t rows, int64_t cols) {
      auto buffer = be_.Allocate(rows * cols * 2);
      BENCH_CHECK(buffer.ok());
      random_.FillBf16((*buffer)->data(), rows * cols);
      Weight w{Format::kBf16, rows, cols};
      w.data = (*buffer)->data();
      bytes_[w.data] = 2.0 * rows * cols;
      keep_.push_back(std::move(*buffer));
      return w;
    };
    auto weight = [&](int64_t rows, int64_t cols, int bits) {
      if (bits == 16) return plain(rows, cols);
      Weight w = QuantizedWeight(rows, cols, BitsFormat(bits));
      linear_bytes_ += bytes_[w.data];
      return w;
    };
    auto floats = [&](int64_t n, float value) {
      auto buffer = be_.Allocate(n * 4);
      BENCH_CHECK(buffer.ok());
      std::vector<float> host(n);
      std::mt19937 rng(n);
      std::uniform_real_distribution<float> dist(0.5f * value, 1.5f * value);
      for (auto& h : host) h = dist(rng);
      be_.CopyToDevice((*buffer)->data(), host.data(), n * 4);
      float* p = (*buffer)->as<float>();
      keep_.push_back(std::move(*buffer));
      return p;
    };
    const int64_t qd = s.heads * s.head_dim, kvd = s.kv_heads * s.head_dim;
    const size_t page_layer = static_cast<size_t>(kPage) * kvd * KvFormatBytes(s.kv);  // keys
    embed_ = plain(s.vocab, s.dim);
    head_ = weight(s.vocab, s.dim, head_bits);
    if (head_bits == 16) linear_bytes_ += bytes_[head_.data];
    final_norm_ = floats(s.dim, 1.0f);
    for (int64_t l = 0; l < s.layers; ++l) {
      Layer L;
      const int b = layer_bits;
      L.q = weight(qd, s.dim, b), L.k = weight(kvd, s.dim, b), L.v = weight(kvd, s.dim, b);
      L.o = weight(s.dim, qd, b);
      L.gate = weight(s.ffn, s.dim, b), L.up = weight(s.ffn, s.dim, b);
      L.down = weight(s.dim, s.ffn, b);
      if (b == 16) {
        for (const Weight* w : {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down})
          linear_bytes_ += bytes_[w->data];
      }
      L.attn_norm = floats(s.dim, 1.0f), L.ffn_norm = floats(s.dim, 1.0f);
      L.q_norm = floats(s.head_dim, 1.0f), L.k_norm = floats(s.head_dim, 1.0f);
      auto kv = be_.Allocate(2 * page_layer * pages);
      BENCH_CHECK(kv.ok());
      // Keys and values: random bf16 values read as float32 pairs or as fp16 (finite, varied).
      random_.FillBf16((*kv)->data(), 2 * page_layer * pages / 2);
      L.kv.keys = (*kv)->data();
      L.kv.values = (*kv)->as<char>() + page_layer * pages;
      L.kv.format = s.kv;
      keep_.push_back(std::move(*kv));
      layers_.push_back(L);
    }
    auto act = [&](int64_t n) {
      auto buffer = be_.Allocate(n * 4);
      BENCH_CHECK(buffer.ok());
      float* p = (*buffer)->as<float>();
      keep_.push_back(std::move(*buffer));
      return p;
    };
    x_ = act(max_rows * s.dim), h_ = act(max_rows * s.dim), o_ = act(max_rows * s.dim);
    q_ = act(max_rows * qd), k_ = act(max_rows * kvd), v_ = act(max_rows * kvd);
    attn_ = act(max_rows * qd);
    gate_ = act(max_rows * s.ffn), up_ = act(max_rows * s.ffn);
    picked_ = act(max_rows * s.dim), logits_ = act(max_rows * s.vocab);
    ints_ = reinterpret_cast<int32_t*>(act(max_rows * 5 + pages + 16));
    inv_freq_ = act(s.head_dim / 2);
    std::vector<float> inv(s.head_dim / 2);
    for (int64_t i = 0; i < s.head_dim / 2; ++i)
      inv[i] = std::pow(1e6f, -2.0f * i / static_cast<float>(s.head_dim));
    be_.CopyToDevice(inv_freq_, inv.data(), inv.size() * 4);
    be_.Synchronize();
  }

  // One step's inputs: `seqs` sequences, each `per_seq` rows ending at position `last`.
  void SetStep(int64_t seqs, int64_t per_seq, int32_t last, int32_t max_pages) {
    int64_t n = seqs * per_seq;
    std::vector<int32_t> tokens(n), slots(n), positions(n), wanted(seqs);
    std::mt19937 rng(3);
    for (int64_t sq = 0; sq < seqs; ++sq) {
      for (int64_t i = 0; i < per_seq; ++i) {
        int64_t r = sq * per_seq + i;
        tokens[r] = static_cast<int32_t>(rng() % s_.vocab);
        slots[r] = static_cast<int32_t>(sq);
        positions[r] = last - static_cast<int32_t>(per_seq - 1 - i);
      }
      wanted[sq] = static_cast<int32_t>((sq + 1) * per_seq - 1);
    }
    std::vector<int32_t> table(seqs * max_pages);
    for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
    rows_ = n;
    wanted_count_ = seqs;
    max_pages_ = max_pages;
    tokens_ = ints_, slots_ = ints_ + n, positions_ = ints_ + 2 * n, wanted_ = ints_ + 3 * n;
    pages_ = ints_ + 3 * n + seqs;
    be_.CopyToDevice(tokens_, tokens.data(), n * 4);
    be_.CopyToDevice(slots_, slots.data(), n * 4);
    be_.CopyToDevice(positions_, positions.data(), n * 4);
    be_.CopyToDevice(wanted_, wanted.data(), seqs * 4);
    be_.CopyToDevice(pages_, table.data(), table.size() * 4);
  }

  // One op of a layer: its name, the bytes of weights it reads, and how to issue it.
  struct Op {
    const char* name;
    double weight_bytes;
    std::function<void()> issue;
  };

  // The ops of one decoder layer, as src/model/model.cc issues them: with the norms, residual
  // adds and SwiGLU inside the matmuls where the backend fuses them, else as separate ops.
  // `first`: the residual stream has no pending block output yet (layer 0).
  std::vector<Op> LayerOps(const Layer& L, bool first) {
    const int64_t n = rows_;
    const Shape& s = s_;
    const bool fuse = be_.FusesMatmul();
    PageTable table{pages_, max_pages_};
    std::vector<Op> ops;
    auto w2 = [this](const Weight& w) { return bytes_[w.data]; };
    if (!fuse) {
      ops.push_back({"rms_norm (+ residual)", 0, [=, this] {
                       RmsNormParams p{
                           h_, first ? x_ : o_, first ? nullptr : x_, L.attn_norm, n, s.dim, 1e-6f};
                       be_.RmsNorm(p);
                     }});
    }
    ops.push_back(
        {fuse ? "matmul q/k/v + norm" : "matmul q/k/v", w2(L.q) + w2(L.k) + w2(L.v), [=, this] {
           MatmulParams qkv;
           qkv.x = fuse ? x_ : h_, qkv.rows = n, qkv.outputs = 3;
           if (fuse) qkv.norm = L.attn_norm;
           qkv.w[0] = &L.q, qkv.w[1] = &L.k, qkv.w[2] = &L.v;
           qkv.out[0] = q_, qkv.out[1] = k_, qkv.out[2] = v_;
           be_.Matmul(qkv);
         }});
    ops.push_back({"q/k norm + rotary + kv write", 0, [=, this] {
                     RopeKvParams p;
                     p.q = {q_,
                            n,
                            static_cast<int>(s.heads),
                            static_cast<int>(s.head_dim),
                            static_cast<int>(s.head_dim),
                            positions_,
                            inv_freq_,
                            L.q_norm,
                            1e-6f};
                     p.k = p.q;
                     p.k.x = k_, p.k.heads = static_cast<int>(s.kv_heads), p.k.norm = L.k_norm;
                     p.kv = {L.kv,
                             table,
                             k_,
                             v_,
                             slots_,
                             positions_,
                             n,
                             static_cast<int>(s.kv_heads),
                             static_cast<int>(s.head_dim)};
                     be_.RopeKv(p);
                   }});
    ops.push_back({"attention", 0, [=, this] {
                     AttentionParams att;
                     att.out = attn_, att.q = q_, att.cache = L.kv, att.table = table;
                     att.slots = slots_, att.positions = positions_, att.rows = n;
                     att.heads = static_cast<int>(s.heads);
                     att.kv_heads = static_cast<int>(s.kv_heads);
                     att.head_dim = static_cast<int>(s.head_dim);
                     att.scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
                     be_.Attention(att);
                   }});
    ops.push_back({fuse ? "matmul o + residual" : "matmul o", w2(L.o), [=, this] {
                     MatmulParams out_proj;
                     out_proj.x = attn_, out_proj.rows = n, out_proj.w[0] = &L.o;
                     out_proj.out[0] = fuse ? x_ : o_;
                     out_proj.accumulate = fuse;
                     be_.Matmul(out_proj);
                   }});
    if (!fuse) {
      ops.push_back({"rms_norm + residual", 0, [=, this] {
                       RmsNormParams p{h_, o_, x_, L.ffn_norm, n, s.dim, 1e-6f};
                       be_.RmsNorm(p);
                     }});
    }
    ops.push_back({fuse ? "matmul gate/up + norm, swiglu" : "matmul gate/up", w2(L.gate) + w2(L.up),
                   [=, this] {
                     MatmulParams gate_up;
                     gate_up.x = fuse ? x_ : h_, gate_up.rows = n, gate_up.outputs = 2;
                     if (fuse) gate_up.norm = L.ffn_norm;
                     gate_up.swiglu = fuse;
                     gate_up.w[0] = &L.gate, gate_up.w[1] = &L.up;
                     gate_up.out[0] = gate_, gate_up.out[1] = up_;
                     be_.Matmul(gate_up);
                   }});
    if (!fuse) {
      ops.push_back({"swiglu", 0, [=, this] { be_.Glu({gate_, gate_, up_, n * s.ffn}); }});
    }
    ops.push_back({fuse ? "matmul down + residual" : "matmul down", w2(L.down), [=, this] {
                     MatmulParams down;
                     down.x = gate_, down.rows = n, down.w[0] = &L.down;
                     down.out[0] = fuse ? x_ : o_;
                     down.accumulate = fuse;
                     be_.Matmul(down);
                   }});
    return ops;
  }

  std::vector<Op> HeadOps() {
    const int64_t n = rows_;
    if (be_.FusesMatmul()) {
      return {{"gather wanted rows", 0,
               [=, this] {
                 be_.GatherRows({picked_, x_, wanted_, wanted_count_, s_.dim});
               }},
              {"matmul head + norm", bytes_[head_.data], [=, this] {
                 MatmulParams head;
                 head.x = picked_, head.rows = wanted_count_, head.w[0] = &head_;
                 head.norm = final_norm_;
                 head.out[0] = logits_;
                 be_.Matmul(head);
               }}};
    }
    return {{"final rms_norm + residual", 0,
             [=, this] {
               RmsNormParams p{h_, o_, x_, final_norm_, n, s_.dim, 1e-6f};
               be_.RmsNorm(p);
             }},
            {"gather wanted rows", 0,
             [=, this] {
               be_.GatherRows({picked_, h_, wanted_, wanted_count_, s_.dim});
             }},
            {"matmul head", bytes_[head_.data], [=, this] {
               MatmulParams head;
               head.x = picked_, head.rows = wanted_count_, head.w[0] = &head_;
               head.out[0] = logits_;
               be_.Matmul(head);
             }}};
  }

  // The forward pass of src/model/model.cc over the step set by SetStep, recorded once per
  // step shape and replayed as model.cc does (where the backend records steps).
  // skip >= 0: every layer's op `skip` (an index into LayerOps) left out, recorded apart.
  void Forward(int skip = -1) {
    const uint64_t key =
        static_cast<uint64_t>(skip + 1) << 56 | static_cast<uint64_t>(rows_) << 40 |
        static_cast<uint64_t>(wanted_count_) << 20 | static_cast<uint64_t>(max_pages_);
    if (be_.ReplayStep(key)) return;
    be_.BeginStep(key);
    be_.Embed({x_, &embed_, tokens_, rows_});
    for (size_t l = 0; l < layers_.size(); ++l) {
      std::vector<Op> ops = LayerOps(layers_[l], l == 0);
      for (size_t i = 0; i < ops.size(); ++i)
        if (static_cast<int>(i) != skip) ops[i].issue();
    }
    for (Op& op : HeadOps()) op.issue();
    be_.EndStep();
  }

  // Each op of layer 1 and of the head alone, issued 20 times back to back (so one wait for the
  // device is shared by 20 issues, as in a step issued op by op): median microseconds per issue
  // over `reps` such runs, and the weight bytes it streams per second. Returns the seconds of
  // each op by name.
  std::map<std::string, double> Profile(int reps, double bandwidth) {
    std::map<std::string, double> seconds;
    std::vector<Op> ops = LayerOps(layers_[1], false);
    for (Op& op : HeadOps()) ops.push_back(op);
    constexpr int kBackToBack = 20;
    for (Op& op : ops) {
      std::vector<double> times;
      for (int i = 0; i < reps + 1; ++i) {
        be_.Synchronize();
        double t0 = Now();
        for (int j = 0; j < kBackToBack; ++j) op.issue();
        be_.Synchronize();
        if (i >= 1) times.push_back((Now() - t0) / kBackToBack);
      }
      std::sort(times.begin(), times.end());
      double t = times[times.size() / 2];
      seconds[op.name] = t;
      if (op.weight_bytes > 0) {
        std::printf("    %-30s %9.1f us  %6.2f TB/s of weights (%4.1f%% of copy)\n", op.name,
                    t * 1e6, op.weight_bytes / t * 1e-12, 100.0 * op.weight_bytes / t / bandwidth);
      } else {
        std::printf("    %-30s %9.1f us\n", op.name, t * 1e6);
      }
    }
    return seconds;
  }

  // The fast mode's tensor-core attention of layer 1 alone over the step set by SetStep, in
  // blocks of 4 and of 8 warps (LaunchMmaTile picks 8 where every multiprocessor gets a block):
  // median microseconds of 20 launches back to back, and the rate for `flops` per launch.
  void ProfileMmaAttention(int reps, double flops, double rate) {
    AttentionParams att;
    att.out = attn_, att.q = q_, att.cache = layers_[1].kv, att.table = {pages_, max_pages_};
    att.slots = slots_, att.positions = positions_, att.rows = rows_;
    att.heads = static_cast<int>(s_.heads);
    att.kv_heads = static_cast<int>(s_.kv_heads);
    att.head_dim = static_cast<int>(s_.head_dim);
    att.scale = 1.0f / std::sqrt(static_cast<float>(s_.head_dim));
    int device = 0, sms = 0;
    BENCH_CHECK(cudaGetDevice(&device) == cudaSuccess);
    BENCH_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) ==
                cudaSuccess);
    // The step's keys as fp16 (zeros: the time does not depend on them), as RopeKv leaves them.
    void* kv16 = nullptr;
    const size_t n = static_cast<size_t>(rows_) * s_.kv_heads * s_.head_dim;
    BENCH_CHECK(cudaMalloc(&kv16, n * 4) == cudaSuccess);
    BENCH_CHECK(cudaMemset(kv16, 0, n * 4) == cudaSuccess);
    be_.Synchronize();
    constexpr int kBackToBack = 20;
    for (int warps : {4, 8, -8}) {
      const bool step_copy = warps < 0;
      const void* k16 = step_copy ? kv16 : nullptr;
      const void* v16 = step_copy ? static_cast<const char*>(kv16) + n * 2 : nullptr;
      std::vector<double> times;
      for (int i = 0; i < reps + 1; ++i) {
        double t0 = Now();
        for (int j = 0; j < kBackToBack; ++j)
          cuda::LaunchMmaTile(att, sms, nullptr, std::abs(warps), k16, v16);
        BENCH_CHECK(cudaStreamSynchronize(nullptr) == cudaSuccess);
        if (i >= 1) times.push_back((Now() - t0) / kBackToBack);
      }
      std::sort(times.begin(), times.end());
      double t = times[times.size() / 2];
      std::printf(
          "    tensor-core attention, %d warps%s %6.1f us  %4.0f TFLOP/s (%.1f%% of GEMM)\n",
          std::abs(warps), step_copy ? ", fp16 keys of the step" : "", t * 1e6, flops / t * 1e-12,
          100.0 * flops / t / rate);
    }
    BENCH_CHECK(cudaFree(kv16) == cudaSuccess);
  }

  // Seconds per Forward(), the median of `reps` after a warm-up.
  double Time(int reps, int skip = -1) {
    Forward(skip);
    be_.Synchronize();
    std::vector<double> times;
    for (int i = 0; i < reps; ++i) {
      double t0 = Now();
      Forward(skip);
      be_.Synchronize();
      times.push_back(Now() - t0);
    }
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
  }

  // What each op of a layer costs inside the replayed step, where neighbouring kernels overlap
  // (programmatic dependent launch) and the weights of the op are not left in L2 by a repeat of
  // it: the step with that op left out of every layer, subtracted from the whole step (`full`
  // seconds), per layer.
  void ProfileInStep(int reps, double full) {
    std::vector<Op> ops = LayerOps(layers_[1], false);
    for (size_t i = 0; i < ops.size(); ++i) {
      const double t = Time(reps, static_cast<int>(i));
      std::printf("    in the step: %-30s %7.1f us\n", ops[i].name,
                  (full - t) / static_cast<double>(layers_.size()) * 1e6);
    }
  }

  // The cost of the layer op `name` inside a step that takes `full` seconds (as ProfileInStep).
  double InStepCost(int reps, double full, const std::string& name) {
    std::vector<Op> ops = LayerOps(layers_[1], false);
    for (size_t i = 0; i < ops.size(); ++i) {
      if (name == ops[i].name)
        return (full - Time(reps, static_cast<int>(i))) / static_cast<double>(layers_.size());
    }
    BENCH_CHECK(false && "no such op");
    return 0.0;
  }

  float* logits() { return logits_; }
  // Bytes of the linears' weights (layers and head) that a step reads.
  double linear_bytes() const { return linear_bytes_; }

  static Format BitsFormat(int bits) {
    return bits == 8   ? Format::kQ8
           : bits == 4 ? Format::kQ4
           : bits == 2 ? Format::kQ2
                       : Format::kQ1;
  }

 private:
  // A quantized weight of random codes. The first of each shape and format is made on the host
  // and packed by PrepareWeight; the others are device copies of it.
  Weight QuantizedWeight(int64_t rows, int64_t cols, Format format) {
    const auto key = std::make_tuple(rows, cols, static_cast<int>(format));
    auto it = templates_.find(key);
    if (it != templates_.end()) {
      const Weight& t = it->second;
      const size_t bytes = static_cast<size_t>(bytes_[t.data]);
      auto buffer = be_.Allocate(bytes);
      BENCH_CHECK(buffer.ok());
      BENCH_CHECK(cudaMemcpy((*buffer)->data(), t.data, bytes, cudaMemcpyDeviceToDevice) ==
                  cudaSuccess);
      Weight w = t;
      auto* base = static_cast<uint8_t*>((*buffer)->data());
      w.data = base;
      w.scales =
          base + (static_cast<const uint8_t*>(t.scales) - static_cast<const uint8_t*>(t.data));
      bytes_[w.data] = static_cast<double>(bytes);
      keep_.push_back(std::move(*buffer));
      return w;
    }
    const int64_t groups = cols / quant::kGroup;
    std::vector<uint8_t> codes(static_cast<size_t>(rows * groups * quant::GroupBytes(format)));
    std::mt19937_64 rng(static_cast<uint64_t>(rows * 31 + cols));
    for (size_t i = 0; i < codes.size(); i += 8) {
      uint64_t r = rng();
      std::memcpy(codes.data() + i, &r, std::min<size_t>(8, codes.size() - i));
    }
    // Scales of normal weights of std 0.02 over the format's levels; zero points near the middle.
    const int levels = format == Format::kQ8 ? 255 : format == Format::kQ4 ? 16 : 4;
    std::vector<float> scales(static_cast<size_t>(rows * groups)), zeros;
    std::uniform_real_distribution<float> unit(0.8f, 1.2f);
    for (float& v : scales) v = 0.02f * 6.0f / static_cast<float>(levels) * unit(rng);
    if (quant::AllowsZeros(format)) {
      zeros.resize(scales.size());
      for (size_t i = 0; i < zeros.size(); ++i)
        zeros[i] = -0.5f * (levels - 1) * scales[i] * unit(rng);
    }
    Weight host{format, rows, cols};
    host.data = codes.data();
    host.scales = scales.data();
    host.zeros = zeros.empty() ? nullptr : zeros.data();
    host.group = quant::kGroup;
    host.rotated = true;
    host.rotation_seed = quant::kDefaultRotationSeed;
    std::unique_ptr<Buffer> storage;
    auto w = be_.PrepareWeight(host, &storage);
    BENCH_CHECK(w.ok());
    bytes_[w->data] = static_cast<double>(storage->bytes());
    keep_.push_back(std::move(storage));
    templates_[key] = *w;
    return *w;
  }

  Backend& be_;
  Shape s_;
  RandomSource random_;
  std::vector<std::unique_ptr<Buffer>> keep_;
  std::vector<Layer> layers_;
  Weight embed_, head_;
  std::map<const void*, double> bytes_;  // device bytes of each weight, by its data pointer
  std::map<std::tuple<int64_t, int64_t, int>, Weight> templates_;  // quantized, by shape
  double linear_bytes_ = 0;
  float* final_norm_;
  float *x_, *h_, *o_, *q_, *k_, *v_, *attn_, *gate_, *up_, *picked_, *logits_, *inv_freq_;
  int32_t* ints_;
  int32_t *tokens_ = nullptr, *slots_ = nullptr, *positions_ = nullptr, *wanted_ = nullptr,
          *pages_ = nullptr;
  int64_t rows_ = 0, wanted_count_ = 0;
  int32_t max_pages_ = 0;
};

// One n-token prompt's attention (one sequence, causal, one layer) alone, for a head shape other
// than the model's too, over float32 pages of random keys and values: the backend's Attention (in
// the fast mode the tensor-core tile kernel wherever it covers the shape), and in the fast mode
// LaunchMmaTile in blocks of 4 and of 8 warps, and reading fp16 keys of the step (as after
// RopeKv). Median microseconds of 20 launches back to back and the rate for 2 n^2 heads
// head_dim FLOP (causal: half of 4 n^2), against the GEMM rate: the figures of head_dim 128 and
// 256 side by side.
void ProfilePromptAttention(Backend* be, int heads, int kv_heads, int head_dim, int64_t n,
                            double rate, bool tensor_cores) {
  const int32_t max_pages = static_cast<int32_t>((n + kPage - 1) / kPage);
  const size_t cache = static_cast<size_t>(max_pages) * kPage * kv_heads * head_dim;
  const size_t queries = static_cast<size_t>(n) * heads * head_dim;
  const size_t step = static_cast<size_t>(n) * kv_heads * head_dim;
  std::vector<float> host(std::max(cache, queries));
  std::mt19937 rng(static_cast<uint32_t>(head_dim));
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (float& x : host) x = dist(rng);
  std::vector<int32_t> table(max_pages), slots(n, 0), positions(n);
  std::iota(table.begin(), table.end(), 0);
  std::iota(positions.begin(), positions.end(), 0);
  float *keys = nullptr, *values = nullptr, *q = nullptr, *out = nullptr;
  int32_t *d_table = nullptr, *d_slots = nullptr, *d_positions = nullptr;
  void* kv16 = nullptr;  // [2, n, kv_heads, head_dim] fp16: the step's keys, then its values
  BENCH_CHECK(cudaMalloc(&keys, cache * 4) == cudaSuccess);
  BENCH_CHECK(cudaMalloc(&values, cache * 4) == cudaSuccess);
  BENCH_CHECK(cudaMalloc(&q, queries * 4) == cudaSuccess);
  BENCH_CHECK(cudaMalloc(&out, queries * 4) == cudaSuccess);
  BENCH_CHECK(cudaMalloc(&d_table, table.size() * 4) == cudaSuccess);
  BENCH_CHECK(cudaMalloc(&d_slots, slots.size() * 4) == cudaSuccess);
  BENCH_CHECK(cudaMalloc(&d_positions, positions.size() * 4) == cudaSuccess);
  BENCH_CHECK(cudaMalloc(&kv16, step * 4) == cudaSuccess);
  BENCH_CHECK(cudaMemcpy(keys, host.data(), cache * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  BENCH_CHECK(cudaMemcpy(values, host.data(), cache * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  BENCH_CHECK(cudaMemcpy(q, host.data(), queries * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  BENCH_CHECK(cudaMemcpy(d_table, table.data(), table.size() * 4, cudaMemcpyHostToDevice) ==
              cudaSuccess);
  BENCH_CHECK(cudaMemcpy(d_slots, slots.data(), slots.size() * 4, cudaMemcpyHostToDevice) ==
              cudaSuccess);
  BENCH_CHECK(cudaMemcpy(d_positions, positions.data(), positions.size() * 4,
                         cudaMemcpyHostToDevice) == cudaSuccess);
  BENCH_CHECK(cudaMemset(kv16, 0, step * 4) == cudaSuccess);  // the time does not depend on it
  AttentionParams att;
  att.out = out, att.q = q, att.cache = {keys, values}, att.table = {d_table, max_pages};
  att.slots = d_slots, att.positions = d_positions, att.rows = n;
  att.heads = heads, att.kv_heads = kv_heads, att.head_dim = head_dim;
  att.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  BENCH_CHECK(att.Check().ok());
  int device = 0, sms = 0;
  BENCH_CHECK(cudaGetDevice(&device) == cudaSuccess);
  BENCH_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess);
  const double flops = 2.0 * n * n * heads * head_dim;
  auto measure = [&](const char* what, const std::function<void()>& launch) {
    constexpr int kBackToBack = 20;
    std::vector<double> times;
    for (int i = 0; i < 4; ++i) {
      double t0 = Now();
      for (int j = 0; j < kBackToBack; ++j) launch();
      be->Synchronize();
      BENCH_CHECK(cudaDeviceSynchronize() == cudaSuccess);
      if (i >= 1) times.push_back((Now() - t0) / kBackToBack);
    }
    std::sort(times.begin(), times.end());
    double t = times[times.size() / 2];
    std::printf("    %-44s %7.1f us  %4.0f TFLOP/s (%.1f%% of GEMM)\n", what, t * 1e6,
                flops / t * 1e-12, 100.0 * flops / t / rate);
  };
  std::printf("  attention of a %lld-token prompt, %d query heads over %d kv heads of %d:\n",
              static_cast<long long>(n), heads, kv_heads, head_dim);
  measure("backend Attention", [&] { be->Attention(att); });
  if (tensor_cores) {
    const void* k16 = kv16;
    const void* v16 = static_cast<const char*>(kv16) + step * 2;
    measure("tensor-core kernel, 4 warps", [&] { cuda::LaunchMmaTile(att, sms, nullptr, 4); });
    measure("tensor-core kernel, 8 warps", [&] { cuda::LaunchMmaTile(att, sms, nullptr, 8); });
    measure("tensor-core kernel, fp16 keys of the step",
            [&] { cuda::LaunchMmaTile(att, sms, nullptr, 0, k16, v16); });
  }
  for (void* p : {static_cast<void*>(keys), static_cast<void*>(values), static_cast<void*>(q),
                  static_cast<void*>(out), static_cast<void*>(d_table), static_cast<void*>(d_slots),
                  static_cast<void*>(d_positions), kv16}) {
    BENCH_CHECK(cudaFree(p) == cudaSuccess);
  }
}

// The encoder attention alone (one layer, bidirectional within each sequence of a packed batch):
// batches of 64 sequences of 128 tokens and 16 of 512 (8,192 rows each), BERT-base's heads (12 of
// 64) and 16 of 128, over random float32 queries, keys and values: the backend's
// EncoderAttention (fast mode: the tensor-core kernel, encoder_mma.cu; exact mode: the float32
// kernel), the tensor-core kernel without its bf16 copy, and the float32 kernel (encoder.cu).
// Median microseconds of 10 launches back to back and the rate for 4 L^2 heads head_dim FLOP a
// sequence of L tokens, against the GEMM rate.
void ProfileEncoderAttention(Backend* be, double rate, bool tensor_cores) {
  for (auto [batch, tokens] : {std::pair<int, int>{64, 128}, std::pair<int, int>{16, 512}}) {
    for (auto [heads, head_dim] : {std::pair<int, int>{12, 64}, std::pair<int, int>{16, 128}}) {
      const int64_t rows = static_cast<int64_t>(batch) * tokens;
      const size_t n = static_cast<size_t>(rows) * heads * head_dim;
      std::vector<float> host(n);
      std::mt19937 rng(static_cast<uint32_t>(head_dim + tokens));
      std::normal_distribution<float> dist(0.0f, 1.0f);
      for (float& x : host) x = dist(rng);
      std::vector<int32_t> starts(batch + 1);
      for (int s = 0; s <= batch; ++s) starts[s] = s * tokens;
      float *q = nullptr, *k = nullptr, *v = nullptr, *out = nullptr;
      int32_t* d_starts = nullptr;
      for (float** p : {&q, &k, &v, &out}) {
        BENCH_CHECK(cudaMalloc(p, n * 4) == cudaSuccess);
        BENCH_CHECK(cudaMemcpy(*p, host.data(), n * 4, cudaMemcpyHostToDevice) == cudaSuccess);
      }
      BENCH_CHECK(cudaMalloc(&d_starts, starts.size() * 4) == cudaSuccess);
      BENCH_CHECK(cudaMemcpy(d_starts, starts.data(), starts.size() * 4, cudaMemcpyHostToDevice) ==
                  cudaSuccess);
      const EncoderAttentionParams p{
          out,  q,     k,     v,        d_starts,
          rows, batch, heads, head_dim, 1.0f / std::sqrt(static_cast<float>(head_dim))};
      BENCH_CHECK(p.Check().ok());
      const double flops = 4.0 * batch * tokens * tokens * heads * head_dim;
      auto measure = [&](const char* what, const std::function<void()>& launch) {
        constexpr int kBackToBack = 10;
        std::vector<double> times;
        for (int i = 0; i < 4; ++i) {
          double t0 = Now();
          for (int j = 0; j < kBackToBack; ++j) launch();
          be->Synchronize();
          BENCH_CHECK(cudaDeviceSynchronize() == cudaSuccess);
          if (i >= 1) times.push_back((Now() - t0) / kBackToBack);
        }
        std::sort(times.begin(), times.end());
        double t = times[times.size() / 2];
        std::printf("    %-44s %9.1f us  %5.1f TFLOP/s (%.1f%% of GEMM)\n", what, t * 1e6,
                    flops / t * 1e-12, 100.0 * flops / t / rate);
      };
      std::printf("  encoder attention, %d sequences of %d tokens, %d heads of %d:\n", batch,
                  tokens, heads, head_dim);
      measure("backend EncoderAttention", [&] { be->EncoderAttention(p); });
      void* scratch = nullptr;
      if (tensor_cores) {
        BENCH_CHECK(cudaMalloc(&scratch, cuda::EncoderAttentionMmaScratchBytes(p)) ==
                    cudaSuccess);
        measure("tensor-core kernel, no bf16 copy",
                [&] { cuda::LaunchEncoderAttentionMma(p, nullptr, scratch, nullptr); });
      }
      measure("float32 kernel", [&] { cuda::LaunchEncoderAttention(p, nullptr); });
      for (void* ptr : {static_cast<void*>(q), static_cast<void*>(k), static_cast<void*>(v),
                        static_cast<void*>(out), static_cast<void*>(d_starts), scratch}) {
        if (ptr) BENCH_CHECK(cudaFree(ptr) == cudaSuccess);
      }
    }
  }
}

// Decoding rows' attention alone (one layer, Qwen3-8B's heads: 32 over 8 kv heads of 128) over
// fp16 pages: the float32 decode kernel (LaunchAttention without tensor cores: the exact mode's
// kernel over these pages) against the tensor-core decode kernel (the fast mode's), for steps of
// `rows` sequences at context `context` (and a step of many short rows with one long one), and
// a step of a 512-row prompt piece continuing 512 earlier keys beside 64 decoding rows. Median
// microseconds of 20 launches back to back; for decoding, the keys and values read per second
// against the copy bandwidth (read + written).
void ProfileDecodeAttention(double bandwidth) {
  constexpr int heads = 32, kv_heads = 8, head_dim = 128;
  int device = 0, sms = 0;
  BENCH_CHECK(cudaGetDevice(&device) == cudaSuccess);
  BENCH_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess);
  struct Case {
    const char* name;
    std::vector<std::pair<int32_t, int32_t>> runs;  // (first position, rows) per sequence
  };
  auto decodes = [](int n, int32_t context) {
    return std::vector<std::pair<int32_t, int32_t>>(n, {context, 1});
  };
  std::vector<Case> cases = {{"1 row at 32,768", decodes(1, 32768)},
                             {"1 row at 4,096", decodes(1, 4096)},
                             {"64 rows at 128", decodes(64, 128)},
                             {"64 rows at 1,100", decodes(64, 1100)},
                             {"64 rows at 4,096", decodes(64, 4096)},
                             {"256 rows at 200", decodes(256, 200)},
                             {"64 rows at 300 + 1 at 2,048", decodes(64, 300)}};
  cases.back().runs.push_back({2048, 1});
  cases.push_back({"64 rows at 1,100 + 512-row piece at 512", decodes(64, 1100)});
  cases.back().runs.push_back({512, 512});
  std::printf(
      "\ndecoding rows' attention, one layer, %d heads over %d kv heads of %d, fp16 pages:\n",
      heads, kv_heads, head_dim);
  std::printf("  %-40s %14s %14s %12s %8s\n", "step", "float32 us", "tensor-core us", "GB/s (tc)",
              "% copy");
  cuda::Scratch scratch;
  for (const Case& c : cases) {
    int32_t max_pages = 0;
    int64_t rows = 0;
    double bytes = 0;
    for (auto [first, n] : c.runs) {
      max_pages = std::max(max_pages, (first + n + kPage - 1) / kPage);
      rows += n;
      if (n == 1) bytes += 2.0 * (first + 1) * kv_heads * head_dim * 2;
    }
    const int32_t seqs = static_cast<int32_t>(c.runs.size());
    const size_t cache = static_cast<size_t>(seqs) * max_pages * kPage * kv_heads * head_dim;
    std::vector<uint16_t> host(cache);
    std::mt19937 rng(7);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (uint16_t& h : host) h = F32ToF16(dist(rng));
    std::vector<int32_t> table(static_cast<size_t>(seqs) * max_pages), slots, positions;
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    for (int32_t i = 0; i < seqs; ++i) {
      for (int32_t j = 0; j < c.runs[i].second; ++j) {
        slots.push_back(i);
        positions.push_back(c.runs[i].first + j);
      }
    }
    std::vector<float> q(static_cast<size_t>(rows) * heads * head_dim);
    for (float& x : q) x = dist(rng);
    void *keys = nullptr, *values = nullptr;
    float *d_q = nullptr, *out = nullptr;
    int32_t *d_table = nullptr, *d_slots = nullptr, *d_positions = nullptr;
    BENCH_CHECK(cudaMalloc(&keys, cache * 2) == cudaSuccess);
    BENCH_CHECK(cudaMalloc(&values, cache * 2) == cudaSuccess);
    BENCH_CHECK(cudaMalloc(&d_q, q.size() * 4) == cudaSuccess);
    BENCH_CHECK(cudaMalloc(&out, q.size() * 4) == cudaSuccess);
    BENCH_CHECK(cudaMalloc(&d_table, table.size() * 4) == cudaSuccess);
    BENCH_CHECK(cudaMalloc(&d_slots, slots.size() * 4) == cudaSuccess);
    BENCH_CHECK(cudaMalloc(&d_positions, positions.size() * 4) == cudaSuccess);
    BENCH_CHECK(cudaMemcpy(keys, host.data(), cache * 2, cudaMemcpyHostToDevice) == cudaSuccess);
    BENCH_CHECK(cudaMemcpy(values, host.data(), cache * 2, cudaMemcpyHostToDevice) == cudaSuccess);
    BENCH_CHECK(cudaMemcpy(d_q, q.data(), q.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
    BENCH_CHECK(cudaMemcpy(d_table, table.data(), table.size() * 4, cudaMemcpyHostToDevice) ==
                cudaSuccess);
    BENCH_CHECK(cudaMemcpy(d_slots, slots.data(), slots.size() * 4, cudaMemcpyHostToDevice) ==
                cudaSuccess);
    BENCH_CHECK(cudaMemcpy(d_positions, positions.data(), positions.size() * 4,
                           cudaMemcpyHostToDevice) == cudaSuccess);
    AttentionParams att;
    att.out = out, att.q = d_q, att.cache = {keys, values, KvFormat::kF16};
    att.table = {d_table, max_pages};
    att.slots = d_slots, att.positions = d_positions, att.rows = rows;
    att.heads = heads, att.kv_heads = kv_heads, att.head_dim = head_dim;
    att.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    BENCH_CHECK(att.Check().ok());
    auto measure = [&](bool tensor_cores) {
      constexpr int kBackToBack = 20;
      std::vector<double> times;
      for (int i = 0; i < 4; ++i) {
        double t0 = Now();
        for (int j = 0; j < kBackToBack; ++j) {
          cuda::LaunchAttention(att, sms, &scratch, nullptr, tensor_cores);
        }
        BENCH_CHECK(cudaDeviceSynchronize() == cudaSuccess);
        if (i >= 1) times.push_back((Now() - t0) / kBackToBack);
      }
      std::sort(times.begin(), times.end());
      return times[times.size() / 2];
    };
    const double plain = measure(false), tc = measure(true);
    std::printf("  %-40s %14.1f %14.1f %12.0f %7.1f%%\n", c.name, plain * 1e6, tc * 1e6,
                bytes / tc * 1e-9, 100.0 * bytes / tc / bandwidth);
    for (void* p : {keys, values, static_cast<void*>(d_q), static_cast<void*>(out),
                    static_cast<void*>(d_table), static_cast<void*>(d_slots),
                    static_cast<void*>(d_positions)}) {
      BENCH_CHECK(cudaFree(p) == cudaSuccess);
    }
  }
}

// Attention over rotated KV pages (--kv-codes) against fp16 pages, one layer of the model's heads
// (32 query heads over 8 kv heads of 128), through the backend (the fast mode unless --exact):
// batch-1 decode at context 4,096 and 32,768, a 2,048-token prompt (causal, one sequence), and
// the KV write of 1 and 2,048 rows. A decode is timed over enough copies of the layer's pages,
// read in turn, that they do not fit in L2 (50 MB on an H200); its figure counts the bytes it
// reads (codes and {step, min} pairs, or fp16 elements) against the copy bandwidth, and 36 layers
// of it (the model's attention per token). Median microseconds of 4 rounds after a first one.
void ProfileKvCodes(Backend* be, double bandwidth, bool exact) {
  constexpr int heads = 32, kv_heads = 8, head_dim = 128, layers = 36;
  constexpr int64_t kChunk = 4096;  // rows per KvWrite while the pages are filled
  constexpr int64_t kPrompt = 2048;
  const size_t chunk = static_cast<size_t>(kChunk) * kv_heads * head_dim;
  const size_t queries = static_cast<size_t>(kPrompt) * heads * head_dim;
  std::vector<float> host(std::max(chunk, queries));
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (float& x : host) x = dist(rng);
  // Keys with channel offsets, as a model's keys have (the values: the same floats).
  std::vector<float> host_k(host.begin(), host.begin() + chunk);
  for (size_t i = 0; i < chunk; ++i) host_k[i] += (i % head_dim) % 7 == 0 ? 3.0f : 0.0f;
  float *k = nullptr, *v = nullptr, *q = nullptr, *out = nullptr;
  int32_t *slots = nullptr, *positions = nullptr, *table = nullptr;
  const int32_t max_pages = 32768 / kPage + 2;
  BENCH_CHECK(cudaMalloc(&k, chunk * 4) == cudaSuccess);
  BENCH_CHECK(cudaMalloc(&v, chunk * 4) == cudaSuccess);
  BENCH_CHECK(cudaMalloc(&q, queries * 4) == cudaSuccess);
  BENCH_CHECK(cudaMalloc(&out, queries * 4) == cudaSuccess);
  BENCH_CHECK(cudaMalloc(&slots, kChunk * 4) == cudaSuccess);
  BENCH_CHECK(cudaMalloc(&positions, kChunk * 4) == cudaSuccess);
  BENCH_CHECK(cudaMalloc(&table, max_pages * 4) == cudaSuccess);
  BENCH_CHECK(cudaMemcpy(k, host_k.data(), chunk * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  BENCH_CHECK(cudaMemcpy(v, host.data(), chunk * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  BENCH_CHECK(cudaMemcpy(q, host.data(), queries * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  BENCH_CHECK(cudaMemset(slots, 0, kChunk * 4) == cudaSuccess);
  std::vector<int32_t> pages(max_pages);
  std::iota(pages.begin(), pages.end(), 0);
  BENCH_CHECK(cudaMemcpy(table, pages.data(), max_pages * 4, cudaMemcpyHostToDevice) ==
              cudaSuccess);
  // Positions [first, first + n) of slot 0 as the rows' positions.
  auto set_positions = [&](int32_t first, int64_t n) {
    std::vector<int32_t> at(n);
    std::iota(at.begin(), at.end(), first);
    BENCH_CHECK(cudaMemcpy(positions, at.data(), n * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  };
  auto median = [](const std::function<void()>& run, int calls) {
    std::vector<double> times;
    for (int i = 0; i < 5; ++i) {
      double t0 = Now();
      run();
      BENCH_CHECK(cudaDeviceSynchronize() == cudaSuccess);
      if (i >= 1) times.push_back((Now() - t0) / calls);
    }
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
  };
  const PageTable page_table{table, max_pages};
  std::printf(
      "\nKV pages' formats, one layer, %d heads over %d kv heads of %d, %s mode (median us a "
      "call):\n",
      heads, kv_heads, head_dim, exact ? "exact" : "fast");
  std::printf("  %-6s %-24s %10s %10s %10s %8s %12s\n", "pages", "step", "us", "MB read", "GB/s",
              "% copy", "36 layers ms");
  for (KvFormat format :
       {KvFormat::kF16, RotatedKv(8, 8), RotatedKv(8, 4), RotatedKv(4, 4), RotatedKv(2, 2)}) {
    if (!be->SupportsKvFormat(format)) continue;
    const int64_t key_bytes = KvKeyBytes(format, head_dim),
                  value_bytes = KvValueBytes(format, head_dim),
                  scale_bytes = KvFormatScaleBytes(format, head_dim);
    const double position_bytes =
        static_cast<double>(kv_heads) * (key_bytes + value_bytes + 2 * scale_bytes);
    const std::string name = KvFormatName(format);
    for (int32_t context : {4096, 32768}) {
      // Pages of positions 0 .. context in `copies` layers, written through the backend.
      const int32_t layer_pages = context / kPage + 1;
      const double layer_bytes = position_bytes * layer_pages * kPage;
      const int copies = std::max(2, static_cast<int>(std::ceil(256e6 / layer_bytes)));
      std::vector<std::unique_ptr<Buffer>> keep;
      std::vector<KvLayer> copy_layers;
      for (int c = 0; c < copies; ++c) {
        KvLayer layer;
        layer.format = format;
        auto alloc = [&](int64_t bytes) -> void* {
          if (bytes == 0) return nullptr;
          auto b = be->Allocate(static_cast<size_t>(bytes) * layer_pages * kPage * kv_heads);
          BENCH_CHECK(b.ok());
          keep.push_back(std::move(*b));
          return keep.back()->data();
        };
        layer.keys = alloc(key_bytes);
        layer.values = alloc(value_bytes);
        layer.key_scales = static_cast<float*>(alloc(scale_bytes));
        layer.value_scales = static_cast<float*>(alloc(scale_bytes));
        for (int32_t first = 0; first <= context; first += kChunk) {
          const int64_t n = std::min<int64_t>(kChunk, context + 1 - first);
          set_positions(first, n);
          KvWriteParams w{.cache = layer,
                          .table = page_table,
                          .k = k,
                          .v = v,
                          .slots = slots,
                          .positions = positions,
                          .rows = n,
                          .kv_heads = kv_heads,
                          .head_dim = head_dim};
          BENCH_CHECK(w.Check().ok());
          be->KvWrite(w);
        }
        copy_layers.push_back(layer);
      }
      be->Synchronize();
      set_positions(context, 1);
      AttentionParams att;
      att.out = out, att.q = q, att.table = page_table;
      att.slots = slots, att.positions = positions, att.rows = 1;
      att.heads = heads, att.kv_heads = kv_heads, att.head_dim = head_dim;
      att.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
      const int calls = 4 * copies;
      const double t = median(
          [&] {
            for (int i = 0; i < calls; ++i) {
              att.cache = copy_layers[i % copies];
              be->Attention(att);
            }
          },
          calls);
      const double bytes = position_bytes * (context + 1);
      char step[64];
      std::snprintf(step, sizeof(step), "decode 1 row at %d", context);
      std::printf("  %-6s %-24s %10.1f %10.1f %10.0f %7.1f%% %12.2f\n", name.c_str(), step, t * 1e6,
                  bytes * 1e-6, bytes / t * 1e-9, 100.0 * bytes / t / bandwidth, layers * t * 1e3);
      if (context != 4096) continue;
      // The 2,048-token prompt's attention over the first copy's positions 0 .. 2,047, and the
      // writes of its rows and of one row.
      att.cache = copy_layers[0];
      att.rows = kPrompt;
      set_positions(0, kPrompt);
      const double prompt = median([&] { be->Attention(att); }, 1);
      const double flops = 2.0 * kPrompt * kPrompt * heads * head_dim;  // causal: half of 4 n^2
      std::printf("  %-6s %-24s %10.1f %10s %10s %8s %12.2f   (%.0f TFLOP/s)\n", name.c_str(),
                  "prompt of 2048 rows", prompt * 1e6, "", "", "", layers * prompt * 1e3,
                  flops / prompt * 1e-12);
      for (int64_t rows : {int64_t{1}, kPrompt}) {
        KvWriteParams w{.cache = copy_layers[0],
                        .table = page_table,
                        .k = k,
                        .v = v,
                        .slots = slots,
                        .positions = positions,
                        .rows = rows,
                        .kv_heads = kv_heads,
                        .head_dim = head_dim};
        const double write = median([&] { be->KvWrite(w); }, 1);
        char what[64];
        std::snprintf(what, sizeof(what), "KV write of %lld rows", static_cast<long long>(rows));
        std::printf("  %-6s %-24s %10.1f %10s %10s %8s %12.2f\n", name.c_str(), what, write * 1e6,
                    "", "", "", layers * write * 1e3);
      }
    }
  }
  for (void* p : {static_cast<void*>(k), static_cast<void*>(v), static_cast<void*>(q),
                  static_cast<void*>(out), static_cast<void*>(slots), static_cast<void*>(positions),
                  static_cast<void*>(table)}) {
    BENCH_CHECK(cudaFree(p) == cudaSuccess);
  }
}

// The quantized matmul kernels alone on the layer shapes of the model (q/k/v in one launch,
// gate/up in one, down), against the bf16 path on the same shapes: median microseconds of 20
// launches back to back, and the weight bytes streamed per second as a share of the copy
// bandwidth. Random codes; the layout, not the values, sets the speed.
void ProfileQuantKernels(Backend* be, const Shape& s, double bandwidth) {
  struct Linears {
    const char* name;
    int outputs;
    int64_t n[3];
    int64_t cols;
  };
  const int64_t qd = s.heads * s.head_dim, kvd = s.kv_heads * s.head_dim;
  const Linears shapes[] = {{"q/k/v", 3, {qd, kvd, kvd}, s.dim},
                            {"gate/up", 2, {s.ffn, s.ffn, 0}, s.dim},
                            {"down", 1, {s.dim, 0, 0}, s.ffn}};
  const int64_t max_rows = 64;
  std::vector<std::unique_ptr<Buffer>> keep;
  auto device_floats = [&](int64_t n, float scale) {
    std::vector<float> host(n);
    std::mt19937 rng(static_cast<uint32_t>(n));
    std::normal_distribution<float> dist(0.0f, scale);
    for (float& v : host) v = dist(rng);
    auto buffer = be->Allocate(n * 4);
    BENCH_CHECK(buffer.ok());
    be->CopyToDevice((*buffer)->data(), host.data(), n * 4);
    float* p = (*buffer)->as<float>();
    keep.push_back(std::move(*buffer));
    return p;
  };
  std::printf("\nquantized matmul kernels (weights TB/s, %% of copy), against bf16:\n");
  std::printf("  %-8s %-5s %6s %10s %8s %7s\n", "linears", "bits", "rows", "us", "TB/s", "%copy");
  for (const Linears& sh : shapes) {
    const float* x = device_floats(max_rows * sh.cols, 1.0f);
    for (int bits : {16, 8, 4}) {
      MatmulParams p;
      p.x = x;
      p.outputs = sh.outputs;
      std::vector<Weight> weights(sh.outputs);
      double bytes = 0;
      for (int i = 0; i < sh.outputs; ++i) {
        const int64_t n = sh.n[i], groups = sh.cols / quant::kGroup;
        std::unique_ptr<Buffer> storage;
        Weight host;
        std::vector<uint8_t> codes;
        std::vector<uint16_t> plain;
        std::vector<float> scales(n * groups), zeros;
        std::mt19937_64 rng(static_cast<uint64_t>(n * 7 + bits));
        if (bits == 16) {
          plain.resize(n * sh.cols);
          for (auto& v : plain) v = F32ToBf16(0.02f * (static_cast<float>(rng() % 1000) / 500 - 1));
          host = Weight{Format::kBf16, n, sh.cols};
          host.data = plain.data();
        } else {
          const Format f = bits == 8 ? Format::kQ8 : Format::kQ4;
          codes.resize(n * groups * quant::GroupBytes(f));
          for (auto& c : codes) c = static_cast<uint8_t>(rng());
          for (auto& v : scales) v = 0.001f;
          if (f == Format::kQ4) zeros.assign(scales.size(), -0.0075f);
          host = Weight{f, n, sh.cols};
          host.data = codes.data();
          host.scales = scales.data();
          host.zeros = zeros.empty() ? nullptr : zeros.data();
          host.group = quant::kGroup;
          host.rotated = true;
          host.rotation_seed = quant::kDefaultRotationSeed;
        }
        auto w = be->PrepareWeight(host, &storage);
        BENCH_CHECK(w.ok());
        weights[i] = *w;
        bytes += static_cast<double>(storage->bytes());
        keep.push_back(std::move(storage));
        p.w[i] = &weights[i];
        p.out[i] = device_floats(max_rows * n, 0.0f);
      }
      for (int64_t rows : {1, 8, 32, 64}) {
        p.rows = rows;
        constexpr int kBackToBack = 20;
        std::vector<double> times;
        for (int rep = 0; rep < 6; ++rep) {
          be->Synchronize();
          double t0 = Now();
          for (int j = 0; j < kBackToBack; ++j) be->Matmul(p);
          be->Synchronize();
          if (rep > 0) times.push_back((Now() - t0) / kBackToBack);
        }
        std::sort(times.begin(), times.end());
        const double t = times[times.size() / 2];
        std::printf("  %-8s %-5d %6lld %10.1f %8.2f %6.1f%%\n", sh.name, bits,
                    static_cast<long long>(rows), t * 1e6, bytes / t * 1e-12,
                    100.0 * bytes / t / bandwidth);
      }
      // Freed before the next format: the largest shapes are a few hundred MB each.
      be->Synchronize();
    }
  }
}

// One mixture-of-experts layer of Qwen3-30B-A3B's shape (hidden 2048, 128 experts of 768, 8 a
// token, renormalized), random bf16 weights, the MoeFeedForward op alone: batch-1 decode,
// batches of 8 and 64 rows, a 2,048-token prompt. The mean of `reps` steps, issued directly
// (launches from the host) and replayed as a recorded step (CUDA graph; not with --no-graphs).
// Decode rows are held to the bytes they read: the router and the experts picked (batch 1: 8 of
// 128; more rows: the expected distinct experts under uniform routing, 128 (1 - (1 - 8/128)^rows)),
// over the copy bandwidth (read + written); the prompt to the FLOPs of its active experts over the
// GEMM rate.
// With `bits` 8, 4, 2 or 1 the experts are quantized (rotated, zeros at 4 and 2 bits): one random
// gate, up and down quantized on the host, each expert its own device copy of them.
void ProfileMoe(Backend* be, double bandwidth, double rate, int reps, int bits) {
  constexpr int kExperts = 128, kTopK = 8;
  constexpr int64_t kDim = 2048, kFfn = 768, kMaxRows = 2048;
  RandomSource random(be);
  std::vector<std::unique_ptr<Buffer>> storage;
  const Format format = bits == 8   ? Format::kQ8
                        : bits == 4 ? Format::kQ4
                        : bits == 2 ? Format::kQ2
                                    : Format::kQ1;
  std::map<int64_t, quant::QuantizedLinear> quantized;  // by rows
  std::vector<size_t> quantized_storage;  // the quantized experts' storage, in placing order
  auto place_quantized = [&](int64_t rows, int64_t cols) {
    auto it = quantized.find(rows);
    if (it == quantized.end()) {
      std::mt19937 rng(static_cast<uint32_t>(rows));
      std::normal_distribution<float> dist(0.0f, 0.02f);
      std::vector<float> w(static_cast<size_t>(rows * cols));
      for (float& v : w) v = dist(rng);
      const quant::QuantizeOptions options{format, format == Format::kQ4 || format == Format::kQ2,
                                           true};
      auto q = quant::QuantizeLinear(w.data(), rows, cols, options);
      BENCH_CHECK(q.ok());
      it = quantized.emplace(rows, std::move(*q)).first;
    }
    std::unique_ptr<Buffer> buffer;
    auto prepared = be->PrepareWeight(it->second.View(), &buffer);
    BENCH_CHECK(prepared.ok());
    storage.push_back(std::move(buffer));
    quantized_storage.push_back(storage.size() - 1);
    return *prepared;
  };
  auto place = [&](int64_t rows, int64_t cols) {
    auto buffer = be->Allocate(static_cast<size_t>(rows * cols) * 2);
    BENCH_CHECK(buffer.ok());
    random.FillBf16((*buffer)->data(), static_cast<size_t>(rows * cols));
    Weight w{Format::kBf16, rows, cols};
    w.data = (*buffer)->data();
    storage.push_back(std::move(buffer).value());
    return w;
  };
  Weight router = place(kExperts, kDim);
  std::vector<Weight> gate, up, down;
  for (int e = 0; e < kExperts; ++e) {
    gate.push_back(bits == 16 ? place(kFfn, kDim) : place_quantized(kFfn, kDim));
    up.push_back(bits == 16 ? place(kFfn, kDim) : place_quantized(kFfn, kDim));
    down.push_back(bits == 16 ? place(kDim, kFfn) : place_quantized(kDim, kFfn));
  }
  auto x = be->Allocate(kMaxRows * kDim * 4);
  auto out = be->Allocate(kMaxRows * kDim * 4);
  BENCH_CHECK(x.ok() && out.ok());
  {
    std::mt19937 rng(5);
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> host(kMaxRows * kDim);
    for (float& v : host) v = d(rng);
    be->CopyToDevice((*x)->data(), host.data(), host.size() * 4);
  }
  // A quantized value: its bits, and a group's (scale, zero) pair of floats per 128.
  const double value_bytes = bits == 16 ? 2.0 : bits / 8.0 + 8.0 / quant::kGroup;
  const double expert_bytes = 3.0 * kFfn * kDim * value_bytes, router_bytes = kExperts * kDim * 2.0;
  std::printf("\nmixture of experts: one layer, hidden %lld, %d experts of %lld, top %d, %s\n",
              static_cast<long long>(kDim), kExperts, static_cast<long long>(kFfn), kTopK,
              bits == 16 ? "bf16" : (std::to_string(bits) + "-bit experts").c_str());
  std::printf("%-22s %10s %10s %12s %10s %8s %8s\n", "rows", "direct us", "graph us", "bytes read",
              "limit us", "% limit", "TFLOP/s");
  uint64_t key = 0x4d6f45;
  // Quantized experts: the rows read the codes, then again with the experts' bf16 copies (what
  // the loader gives them in fast mode while the device keeps half its memory free: the grouped
  // path of more than 4 rows multiplies the copies).
  for (int pass = 0; pass < (bits == 16 ? 1 : 2); ++pass) {
    if (pass == 1) {
      // Placed expert by expert: gate, up, down.
      for (int e = 0; e < kExperts; ++e) {
        Weight* w[3] = {&gate[e], &up[e], &down[e]};
        for (int m = 0; m < 3; ++m) {
          be->AddBf16Copy(w[m], &storage[quantized_storage[3 * e + m]]);
          BENCH_CHECK(w[m]->bf16 != nullptr);
        }
      }
      std::printf("the same with the experts' bf16 copies (fast mode):\n");
    }
    for (int64_t rows : {int64_t{1}, int64_t{8}, int64_t{64}, kMaxRows}) {
      MoeFeedForwardParams p;
      p.out = static_cast<float*>((*out)->data());
      p.x = static_cast<const float*>((*x)->data());
      p.rows = rows;
      p.dim = kDim;
      p.ffn = kFfn;
      p.experts = kExperts;
      p.top_k = kTopK;
      p.norm_topk_prob = true;
      p.router = &router;
      p.gate = gate.data();
      p.up = up.data();
      p.down = down.data();
      BENCH_CHECK(p.Check().ok());
      be->MoeFeedForward(p);  // warm: tables, scratch
      be->Synchronize();
      const int n = rows == kMaxRows ? std::max(reps / 2, 2) : reps * 10;
      double t0 = Now();
      for (int i = 0; i < n; ++i) be->MoeFeedForward(p);
      be->Synchronize();
      const double direct = (Now() - t0) / n;
      be->BeginStep(++key);
      be->MoeFeedForward(p);
      be->EndStep();
      be->Synchronize();
      double graph = NAN;
      if (be->ReplayStep(key)) {
        be->Synchronize();
        t0 = Now();
        for (int i = 0; i < n; ++i) BENCH_CHECK(be->ReplayStep(key));
        be->Synchronize();
        graph = (Now() - t0) / n;
      }
      const double distinct = kExperts * (1.0 - std::pow(1.0 - double{kTopK} / kExperts, rows));
      // With the copies, more than 4 rows read the experts' bf16 values.
      const double read = pass == 1 && rows > 4 ? 3.0 * kFfn * kDim * 2.0 : expert_bytes;
      const double bytes = router_bytes + distinct * read + 2.0 * rows * kDim * 4;
      const double flops = 2.0 * rows * kTopK * 3 * kFfn * kDim;
      const double limit = std::max(bytes / bandwidth, flops / rate);
      const double best = std::isnan(graph) ? direct : std::min(direct, graph);
      char name[48];
      std::snprintf(name, sizeof(name), rows == kMaxRows ? "prompt %lld" : "decode %lld",
                    static_cast<long long>(rows));
      std::printf("%-22s %10.1f %10.1f %9.1f MB %10.1f %7.1f%% %8.1f\n", name, direct * 1e6,
                  graph * 1e6, bytes * 1e-6, limit * 1e6, 100.0 * limit / best,
                  flops / best * 1e-12);
    }
  }
  std::vector<float> sample(8);
  be->CopyToHost(sample.data(), (*out)->data(), sample.size() * 4);
  for (float v : sample) BENCH_CHECK(std::isfinite(v));
}

// One recurrent layer's gated delta rule at Qwen3.5-35B-A3B's shape (16 key heads, 32 value
// heads, dims 128; state [32, 128, 128] float32 a slot), the op alone on random inputs (q and k
// L2-normalized): a 2,048-row piece from position 0 and one continuing a state at position
// 2,048, each through the backend's op (the chunk-parallel kernels, float32 in both modes) and
// through the serial chunked kernel (one block a run, value head and 32 columns walking the
// chunks; float32, and its tf32 variant), the same piece row by row (the decode kernel over every
// row, min_chunked_rows 0), and 64 decode rows of 64 slots; then the largest difference between
// the chunk-parallel and the serial float32 outputs of one piece from the same state, relative to
// the largest output. The mean of `reps` runs issued directly. Each figure is set against the bytes
// the op must move (q, k, v and a, b read, out written, the states read and written) over the
// copy bandwidth and against its useful FLOPs (per value head and chunk of C = 64 rows: k.k and
// q.k over the causal half, C^2 K; S^T k and S^T q, 2 C K V; the triangular solve and P delta,
// C^2 V; the state's update, C K V; decode rows: 4 K V a row) over the bf16 GEMM rate.
void ProfileDeltaRule(Backend* be, double bandwidth, double rate, int reps) {
  constexpr int kKeyHeads = 16, kValueHeads = 32, kDim = 128, kSlots = 64;
  constexpr int64_t kRows = 2048;
  constexpr int64_t kStride = 2 * kKeyHeads * kDim + kValueHeads * kDim;  // q, k, v a row
  constexpr int64_t kState = int64_t{kValueHeads} * kDim * kDim;
  auto floats = [&](int64_t n) {
    auto buffer = be->Allocate(static_cast<size_t>(n) * 4);
    BENCH_CHECK(buffer.ok());
    return std::move(buffer).value();
  };
  auto mix = floats(kRows * kStride), ab = floats(kRows * 2 * kValueHeads),
       out = floats(kRows * kValueHeads * kDim), states = floats(kSlots * kState),
       a_log = floats(kValueHeads), dt_bias = floats(kValueHeads);
  auto slots = be->Allocate(kRows * 4), positions = be->Allocate(kRows * 4);
  BENCH_CHECK(slots.ok() && positions.ok());
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto upload = [&](Buffer* b, std::vector<float> host) {
    be->CopyToDevice(b->data(), host.data(), host.size() * 4);
  };
  {
    std::vector<float> host(kRows * kStride);
    for (float& v : host) v = normal(rng);
    for (int64_t r = 0; r < kRows; ++r) {
      for (int h = 0; h < 2 * kKeyHeads; ++h) {
        float* x = host.data() + r * kStride + h * kDim;
        double ss = 0.0;
        for (int i = 0; i < kDim; ++i) ss += double{x[i]} * x[i];
        for (int i = 0; i < kDim; ++i) x[i] = static_cast<float>(x[i] / std::sqrt(ss + 1e-6));
      }
    }
    upload(mix.get(), std::move(host));
    std::vector<float> gates(kRows * 2 * kValueHeads), state(kSlots * kState);
    for (float& v : gates) v = normal(rng);
    for (float& v : state) v = 0.3f * normal(rng);
    upload(ab.get(), std::move(gates));
    upload(states.get(), std::move(state));
    std::vector<float> logs(kValueHeads), biases(kValueHeads);
    for (int h = 0; h < kValueHeads; ++h) {
      logs[h] = std::log(0.02f + 0.23f * static_cast<float>(h) / kValueHeads);
      biases[h] = 0.5f * normal(rng);
    }
    upload(a_log.get(), std::move(logs));
    upload(dt_bias.get(), std::move(biases));
  }
  auto layout = [&](int64_t rows, bool decode, int32_t first) {
    std::vector<int32_t> s(rows), pos(rows);
    for (int64_t r = 0; r < rows; ++r) {
      s[r] = decode ? static_cast<int32_t>(r) : 0;
      pos[r] = decode ? first : first + static_cast<int32_t>(r);
    }
    be->CopyToDevice((*slots)->data(), s.data(), rows * 4);
    be->CopyToDevice((*positions)->data(), pos.data(), rows * 4);
  };
  GatedDeltaRuleParams p;
  const float* m = static_cast<const float*>(mix->data());
  p.out = static_cast<float*>(out->data());
  p.q = m;
  p.k = m + kKeyHeads * kDim;
  p.qk_stride = kStride;
  p.v = m + 2 * kKeyHeads * kDim;
  p.v_stride = kStride;
  p.a = static_cast<const float*>(ab->data());
  p.b = p.a + kValueHeads;
  p.ab_stride = 2 * kValueHeads;
  p.a_log = static_cast<const float*>(a_log->data());
  p.dt_bias = static_cast<const float*>(dt_bias->data());
  p.states = static_cast<float*>(states->data());
  p.slots = static_cast<const int32_t*>((*slots)->data());
  p.positions = static_cast<const int32_t*>((*positions)->data());
  p.k_heads = kKeyHeads;
  p.v_heads = kValueHeads;
  p.k_dim = kDim;
  p.v_dim = kDim;
  p.scale = 1.0f / std::sqrt(static_cast<float>(kDim));
  std::printf(
      "\ngated delta rule: one layer, %d key heads, %d value heads, dims %d, float32 states "
      "(%s)\n",
      kKeyHeads, kValueHeads, kDim, be->Describe().c_str());
  std::printf("%-46s %10s %10s %10s %8s %9s\n", "rows", "us", "MB moved", "limit us", "% limit",
              "TFLOP/s");
  auto time = [&](const std::function<void()>& issue, int n) {
    issue();  // warm
    be->Synchronize();
    BENCH_CHECK(cudaDeviceSynchronize() == cudaSuccess);
    const double t0 = Now();
    for (int i = 0; i < n; ++i) issue();
    be->Synchronize();
    BENCH_CHECK(cudaDeviceSynchronize() == cudaSuccess);
    return (Now() - t0) / n;
  };
  auto report = [&](const char* name, int64_t rows, int64_t slots_touched, double seconds) {
    const double c = 64.0, k = kDim, v = kDim;
    const double flops =
        rows == kSlots && slots_touched == kSlots
            ? 2.0 * rows * kValueHeads * 4 * k * v
            : 2.0 * rows / c * kValueHeads * (c * c * k + 2 * c * k * v + c * c * v + c * k * v);
    const double bytes = 4.0 * rows * (kStride + 2 * kValueHeads + kValueHeads * kDim) +
                         2.0 * 4 * slots_touched * kState;
    const double limit = std::max(bytes / bandwidth, flops / rate);
    std::printf("%-46s %10.1f %10.1f %10.1f %7.1f%% %9.2f\n", name, seconds * 1e6, bytes * 1e-6,
                limit * 1e6, 100.0 * limit / seconds, flops / seconds * 1e-12);
  };
  // A piece from position 0 and one continuing the state at 2,048 (the op leaves the state
  // where the next run reads it: each repetition continues the last, as a longer prompt would).
  struct Form {
    const char* name;
    cuda::DeltaRuleForm form;
  };
  const Form forms[] = {{"", cuda::DeltaRuleForm::kParallel},
                        {", serial chunks", cuda::DeltaRuleForm::kSerial},
                        {", serial chunks tf32", cuda::DeltaRuleForm::kSerialTf32}};
  for (int32_t first : {0, static_cast<int32_t>(kRows)}) {
    layout(kRows, /*decode=*/false, first);
    p.rows = kRows;
    for (const Form& f : forms) {
      // The parallel form through the backend's op; the serial ones launched directly.
      const double t = time(
          [&] {
            if (f.form == cuda::DeltaRuleForm::kParallel) {
              be->GatedDeltaRule(p);
            } else {
              cuda::LaunchGatedDeltaRule(p, cuda::kDeltaRuleChunkedRows, f.form,
                                         /*scratch=*/nullptr, /*stream=*/nullptr);
            }
          },
          reps);
      const std::string name =
          std::string(first == 0 ? "2048 rows from position 0" : "2048 rows from 2048") + f.name;
      report(name.c_str(), kRows, 1, t);
    }
  }
  {
    // One piece from the same state through both float32 forms.
    auto saved = floats(kState);
    const size_t state_bytes = static_cast<size_t>(kState) * 4;
    BENCH_CHECK(cudaMemcpy(saved->data(), states->data(), state_bytes, cudaMemcpyDeviceToDevice) ==
                cudaSuccess);
    std::vector<float> parallel(kRows * kValueHeads * kDim), serial(parallel.size());
    be->GatedDeltaRule(p);
    be->CopyToHost(parallel.data(), out->data(), parallel.size() * 4);
    be->Synchronize();
    BENCH_CHECK(cudaMemcpy(states->data(), saved->data(), state_bytes, cudaMemcpyDeviceToDevice) ==
                cudaSuccess);
    cuda::LaunchGatedDeltaRule(p, cuda::kDeltaRuleChunkedRows, cuda::DeltaRuleForm::kSerial,
                               /*scratch=*/nullptr, /*stream=*/nullptr);
    BENCH_CHECK(cudaDeviceSynchronize() == cudaSuccess);
    be->CopyToHost(serial.data(), out->data(), serial.size() * 4);
    be->Synchronize();
    double largest = 0.0, diff = 0.0;
    for (size_t i = 0; i < serial.size(); ++i) {
      BENCH_CHECK(std::isfinite(parallel[i]));
      largest = std::max(largest, std::fabs(static_cast<double>(serial[i])));
      diff = std::max(diff, std::fabs(static_cast<double>(parallel[i]) - serial[i]));
    }
    std::printf(
        "chunk-parallel against serial chunks (2048 rows from 2048): max |diff| %.3g of "
        "the largest output %.3g (%.2g)\n",
        diff, largest, diff / std::max(largest, 1e-30));
  }
  const double rows_t = time(
      [&] {
        cuda::LaunchGatedDeltaRule(p, /*min_chunked_rows=*/0, cuda::DeltaRuleForm::kSerial,
                                   /*scratch=*/nullptr, /*stream=*/nullptr);
      },
      std::max(reps / 5, 1));
  report("2048 rows, row by row", kRows, 1, rows_t);
  layout(kSlots, /*decode=*/true, 100);
  p.rows = kSlots;
  const double decode_t = time([&] { be->GatedDeltaRule(p); }, reps * 10);
  report("64 decode rows (64 slots)", kSlots, kSlots, decode_t);
  std::vector<float> sample(8);
  be->CopyToHost(sample.data(), out->data(), sample.size() * 4);
  be->Synchronize();
  for (float x : sample) BENCH_CHECK(std::isfinite(x));
}

int Main(int argc, char** argv) {
  bool quick = false, decode_only = false, prefill_only = false, moe = false, attention = false,
       encoder_attention = false, delta_rule = false, kv_codes = false;
  int layer_bits = 16, head_bits = 16;
  KvFormat kv = KvFormat::kF32;
  CudaOptions options;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--quick")
      quick = true;
    else if (a == "--exact")
      options.exact = true;
    else if (a == "--gemv-max-rows" && i + 1 < argc)
      options.gemv_max_rows = std::atoi(argv[++i]);
    else if (a == "--no-graphs")
      options.graphs = false;
    else if (a == "--prefill-only")
      prefill_only = true;
    else if (a == "--decode-only")
      decode_only = true;
    else if (a == "--kv" && i + 1 < argc &&
             (argv[i + 1] == std::string("f16") || argv[i + 1] == std::string("f32")))
      kv = argv[++i] == std::string("f16") ? KvFormat::kF16 : KvFormat::kF32;
    else if (a == "--moe")
      moe = true;
    else if (a == "--attention")
      attention = true;
    else if (a == "--encoder-attention")
      encoder_attention = true;
    else if (a == "--kv-codes")
      kv_codes = true;
    else if (a == "--delta-rule")
      delta_rule = true;
    else if (a == "--bits" && i + 1 < argc) {
      std::string v = argv[++i];
      size_t slash = v.find('/');
      layer_bits = std::atoi(v.substr(0, slash).c_str());
      head_bits = slash == std::string::npos ? layer_bits : std::atoi(v.substr(slash + 1).c_str());
      auto valid = [](int b) { return b == 16 || b == 8 || b == 4 || b == 2 || b == 1; };
      if (!valid(layer_bits) || !valid(head_bits)) {
        std::fprintf(stderr, "cuda_bench: --bits takes L or L/H, each 16, 8, 4, 2 or 1\n");
        return 2;
      }
    } else {
      std::fprintf(stderr,
                   "usage: cuda_bench [--quick] [--exact] [--gemv-max-rows N] [--no-graphs] "
                   "[--bits L[/H]] [--kv f32|f16] [--decode-only | --prefill-only | --moe | "
                   "--attention | --encoder-attention | --delta-rule | --kv-codes]\n"
                   "  --kv: the KV pages' element type (f32 by default)\n"
                   "  --decode-only: batch-1 decode steps alone, without per-op profiles (for a "
                   "profiler's trace)\n"
                   "  --prefill-only: the 2,048-token prompt alone\n"
                   "  --moe: one Qwen3-30B-A3B-shaped mixture-of-experts layer alone\n"
                   "  --attention: decoding rows' attention alone, the float32 and the "
                   "tensor-core decode kernels over fp16 pages\n"
                   "  --encoder-attention: the encoder attention alone (bidirectional, packed "
                   "sequences of 128 and 512 tokens), the tensor-core and the float32 kernels\n"
                   "  --delta-rule: one Qwen3.5-35B-A3B-shaped recurrent layer's gated delta rule "
                   "alone (a 2,048-row piece chunked and row by row, 64 decode rows)\n"
                   "  --kv-codes: one layer's attention and KV write over fp16 and rotated 8, 8/4, "
                   "4 and 2-bit pages (batch-1 decode at 4,096 and 32,768, a 2,048-row prompt)\n");
      return 2;
    }
  }
  if (CudaDeviceCount() == 0) {
    std::printf("no CUDA device was found: nothing to measure\n");
    return 0;
  }
  auto backend = MakeCudaBackend(options);
  if (!backend.ok()) {
    std::fprintf(stderr, "cuda_bench: %s\n", backend.status().message().c_str());
    return 2;
  }
  Backend* be = backend->get();
  std::printf("device: %s\n", be->Describe().c_str());
  const double bandwidth = MeasureCopyBandwidth();
  const double rate = MeasureGemmRate();
  std::printf("ceilings: copy %.2f TB/s (read + written), cuBLASLt bf16 GEMM 8192^3 %.1f TFLOP/s\n",
              bandwidth * 1e-12, rate * 1e-12);

  if (moe) {
    ProfileMoe(be, bandwidth, rate, quick ? 3 : 10, layer_bits);
    return 0;
  }
  if (attention) {
    ProfileDecodeAttention(bandwidth);
    return 0;
  }
  if (encoder_attention) {
    ProfileEncoderAttention(be, rate, !options.exact);
    return 0;
  }
  if (kv_codes) {
    ProfileKvCodes(be, bandwidth, options.exact);
    return 0;
  }
  if (delta_rule) {
    ProfileDeltaRule(be, bandwidth, rate, quick ? 3 : 10);
    return 0;
  }
  Shape s;
  s.kv = kv;
  std::printf("KV pages: %s\n", KvFormatName(kv).c_str());
  if (!options.exact && !decode_only && !prefill_only) ProfileQuantKernels(be, s, bandwidth);
  const int64_t max_rows = 2048;
  const int32_t pages = 4700;  // 256 sequences x 18 pages, or 1 x 8193 positions
  double t0 = Now();
  Bench bench(be, s, max_rows, pages, layer_bits, head_bits);
  const double linear_bytes = bench.linear_bytes();
  if (layer_bits == 16 && head_bits == 16) {
    std::printf("model: random bf16 weights placed in %.1f s\n", Now() - t0);
  } else {
    std::printf(
        "model: linears of %d bits, head of %d bits (random codes), %.2f GB of linear "
        "weights read per step, placed in %.1f s\n",
        layer_bits, head_bits, linear_bytes * 1e-9, Now() - t0);
  }
  const double linear_flops_per_row = 2.0 * (s.LinearParams() * s.layers);
  const double head_flops_per_row = 2.0 * s.vocab * s.dim;
  const int reps = quick ? 3 : 10;

  std::printf("\n%-34s %10s %12s %10s %8s\n", "workload", "step ms", "tokens/s", "limit ms",
              "% limit");
  auto report = [&](const char* name, double seconds, double tokens, double bytes, double flops) {
    double limit = std::max(bytes / bandwidth, flops / rate);
    std::printf("%-34s %10.3f %12.1f %10.3f %7.1f%%\n", name, seconds * 1e3, tokens / seconds,
                limit * 1e3, 100.0 * limit / seconds);
  };
  // Batch-1 decode: the step's row sits at position `context` (context keys before it).
  for (int32_t context : {512, 8192}) {
    if (prefill_only) break;
    int32_t max_pages = (context + kPage) / kPage + 1;
    bench.SetStep(1, 1, context, max_pages);
    double t = bench.Time(reps);
    double bytes = linear_bytes + (context + 1.0) * s.KvBytesPerPosition();
    double flops = linear_flops_per_row + head_flops_per_row +
                   4.0 * (context + 1) * s.heads * s.head_dim * s.layers;
    char name[64];
    std::snprintf(name, sizeof(name), "decode batch 1, context %d", context);
    report(name, t, 1, bytes, flops);
    bench.ProfileInStep(reps, t);
    if (context == 8192 && !decode_only) bench.Profile(reps, bandwidth);
  }
  if (decode_only) return 0;
  // Batched decode at context 192 (128 prompt + 64 new: the middle of 128 + 128).
  for (int64_t seqs : {8, 32, 64, 128, 256}) {
    if (prefill_only) break;
    const int32_t context = 192;
    bench.SetStep(seqs, 1, context, (context + kPage) / kPage + 1);
    double t = bench.Time(reps);
    double bytes =
        linear_bytes + seqs * (context + 1.0) * s.KvBytesPerPosition() + seqs * 4.0 * s.vocab;
    double flops = seqs * (linear_flops_per_row + head_flops_per_row +
                           4.0 * (context + 1) * s.heads * s.head_dim * s.layers);
    char name[64];
    std::snprintf(name, sizeof(name), "decode %lld sequences, context 192",
                  static_cast<long long>(seqs));
    report(name, t, static_cast<double>(seqs), bytes, flops);
    if (seqs == 256) bench.Profile(reps, bandwidth);
  }
  // Prefill of one 2,048-token prompt; logits of its last row only.
  {
    const int64_t n = 2048;
    bench.SetStep(1, n, static_cast<int32_t>(n - 1), static_cast<int32_t>(n / kPage + 1));
    double t = bench.Time(quick ? 2 : 5);
    double flops = n * linear_flops_per_row + head_flops_per_row +
                   2.0 * n * n * s.heads * s.head_dim * s.layers;  // causal: half of 4 n^2
    double bytes = linear_bytes + n * s.KvBytesPerPosition();
    std::printf("%-34s %10.3f %12.1f %10.3f %7.1f%%   (time to first token; %.0f TFLOP/s)\n",
                "prefill 2048 tokens", t * 1e3, n / t,
                std::max(bytes / bandwidth, flops / rate) * 1e3,
                100.0 * std::max(bytes / bandwidth, flops / rate) / t, flops / t * 1e-12);
    // Each op issued alone (the attention then reads the float32 pages: RopeKv's fp16 copy of
    // the step's keys is only used right after it), then a layer's attention inside the step:
    // 4 FLOP per visible (query head, key, dimension), half of n^2 keys.
    bench.Profile(3, bandwidth);
    double attention = bench.InStepCost(quick ? 2 : 3, t, "attention");
    std::printf(
        "    attention of one layer in the step: %.1f us, %.0f TFLOP/s (%.1f%% of the GEMM "
        "rate)\n",
        attention * 1e6, 2.0 * n * n * s.heads * s.head_dim / attention * 1e-12,
        100.0 * 2.0 * n * n * s.heads * s.head_dim / attention / rate);
    if (!options.exact) bench.ProfileMmaAttention(3, 2.0 * n * n * s.heads * s.head_dim, rate);
    // The same attention alone for the model's heads and for head_dim 256 (Gemma 3 4B's and
    // 12B's heads; the latter does the model's FLOP).
    for (auto [heads, kv_heads, head_dim] :
         {std::tuple{static_cast<int>(s.heads), static_cast<int>(s.kv_heads),
                     static_cast<int>(s.head_dim)},
          std::tuple{8, 4, 256}, std::tuple{16, 8, 256}}) {
      ProfilePromptAttention(be, heads, kv_heads, head_dim, n, rate, !options.exact);
    }
  }
  // The profile issues ops over their own outputs (SwiGLU 20 times over its gate grows it past
  // float range): one whole step again before the logits are checked.
  bench.Forward();
  std::vector<float> sample(8);
  be->CopyToHost(sample.data(), bench.logits(), sample.size() * 4);
  for (float v : sample) BENCH_CHECK(std::isfinite(v));
  return 0;
}

}  // namespace
}  // namespace gizllm

int main(int argc, char** argv) { return gizllm::Main(argc, argv); }
