// The CPU backend: every op of ops/backend.h on the host, parallel over a ThreadPool, with
// AVX-512, AVX2 or portable kernels picked once at run time.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_isa.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "ops/backend.h"

namespace gizllm {

struct MatmulKernels;
class Sampler;

struct CpuOptions {
  // Instruction set of the kernels; unset: the best this CPU supports. Asking for more than
  // the CPU supports is an error (Check()).
  std::optional<CpuIsa> isa;
  // Matmuls over bf16 weights round the activations to bf16 and use AVX-512 BF16 dot products
  // (vdpbf16ps): faster prompts and batches, about 1e-3 relative error in each product.
  // PrepareWeight packs bf16 weights for them once (blocks of 32 rows, each 32-bit lane a pair of
  // inputs of one row), which every step of any size then reads. Weights not prepared (a direct
  // Matmul over host memory) are repacked per call, from kBf16MinRows rows; fewer rows keep
  // float32 there (the repacking was measured slower than float32 for them). Off by default
  // (float32 activations, float32 accumulation). Needs a CPU with avx512_bf16.
  bool bf16_activations = false;
  static constexpr int64_t kBf16MinRows = 32;
  // Matmuls over q8 and q4 weights (a converted model's linears) quantize the (rotated)
  // activations to int8, a scale per row and group of 128 inputs, and use AVX-512 VNNI integer
  // dot products (vpdpbusd) for steps of any size. PrepareWeight repacks such weights once
  // (quant_kernels.h: kCpuVnniLayout; the packed copy replaces the codes in memory). Off by
  // default. Needs a CPU with avx512_vnni.
  bool int8_activations = false;
  Status Check() const;
};

// Ops run synchronously on the calling thread and the pool's workers; one caller at a time (the
// ops share work buffers that grow to the largest step and are then reused).
class CpuBackend : public Backend {
 public:
  // `pool` must outlive the backend; ops run on its threads.
  CpuBackend(ThreadPool* pool, const CpuOptions& options);
  ~CpuBackend() override;

  DeviceKind kind() const override { return DeviceKind::kCpu; }
  std::string Describe() const override;  // "cpu (2 threads, avx512)"
  CpuIsa isa() const { return isa_; }

  Expected<std::unique_ptr<Buffer>> Allocate(size_t bytes) override;
  // Host memory: /proc/meminfo's MemAvailable and MemTotal.
  DeviceMemory Memory() const override;
  void CopyToDevice(void* dst, const void* src, size_t bytes) override;
  void CopyToHost(void* dst, const void* src, size_t bytes) override;
  void CopyOnDevice(void* dst, const void* src, size_t bytes) override;
  // Plain formats are used in place (no copy, `storage` stays null), except bf16 weights where
  // PacksBf16(): packed once into panels of 32 outputs (matmul_kernels.h) that the vdpbf16ps
  // kernels (bf16_activations) read for any number of rows, and the float32 kernels from
  // kPackedMinRows rows (each panel row widened to float32: exact float32 products in
  // output-major tiles, no sums reduced across lanes). Fewer rows with float32 activations, and
  // Embed, read the host data, which must outlive the weight (a bf16 model's weights are then
  // resident twice: the mapped file's pages and the packed copy).
  static constexpr int64_t kPackedMinRows = 5;
  bool PacksBf16() const;
  Expected<Weight> PrepareWeight(const Weight& host, std::unique_ptr<Buffer>* storage) override;

  void Embed(const EmbedParams& p) override;
  void RmsNorm(const RmsNormParams& p) override;
  void Matmul(const MatmulParams& p) override;
  void Rope(const RopeParams& p) override;
  bool SupportsKvFormat(KvFormat) const override { return true; }  // every format
  void KvWrite(const KvWriteParams& p) override;
  void Attention(const AttentionParams& p) override;
  void Glu(const GluParams& p) override;
  void Softcap(const SoftcapParams& p) override;
  void Add(const AddParams& p) override;
  void GatherRows(const GatherRowsParams& p) override;
  // The swiglu end of a gate/up matmul (not the norm and accumulate ends).
  bool FusesSwiGlu() const override { return true; }
  bool ReadsGgml(uint32_t ggml_type) const override;
  // Rows grouped by expert: each expert's rows through the Matmul paths (gate and up with the
  // swiglu end, then down), the experts one after another, each matmul over the pool.
  bool SupportsMoe() const override { return true; }
  void MoeFeedForward(const MoeFeedForwardParams& p) override;
  // The recurrent layers' ops. GatedDeltaRule: a task per value head of each run of a slot's
  // adjacent rows; a run of one row is the recurrence, longer runs go in chunks.
  bool SupportsRecurrent() const override { return true; }
  void CausalConv(const CausalConvParams& p) override;
  void L2Norm(const L2NormParams& p) override;
  void GatedDeltaRule(const GatedDeltaRuleParams& p) override;
  void GatedRmsNorm(const GatedRmsNormParams& p) override;
  // The encoder ops. EncoderAttention: a task per (row, head), each over its sequence's rows.
  bool SupportsEncoder() const override { return true; }
  void LayerNorm(const LayerNormParams& p) override;
  void Gelu(const GeluParams& p) override;
  void EncoderAttention(const EncoderAttentionParams& p) override;
  // MeanRows: a task per sequence, its sums in double over rows read in order.
  void MeanRows(const MeanRowsParams& p) override;
  // Sample: the host Sampler (sampling/sampling.h) over each row, rows spread over the pool, so
  // a row picks what the engine's host path picks from the same logits and mask.
  bool CanSample() const override { return true; }
  void Sample(const SampleParams& p) override;
  void Synchronize() override {}
  // Host clock times of each op (the ops are synchronous).
  bool SetOpTrace(bool on) override;
  std::vector<OpTime> TakeOpTrace() override;

 private:
  // Each op's first line: notes the op's start where tracing and outermost (OpScope).
  [[nodiscard]] OpScope Trace(const char* op);
  // A 64-byte aligned float buffer that only grows (nothing is allocated once it is large
  // enough for the engine's biggest step).
  class Scratch {
   public:
    ~Scratch();
    float* Get(size_t floats);

   private:
    float* data_ = nullptr;
    size_t size_ = 0;
  };

  // cos and sin of the rotary angles of every position up to the largest the rows read
  // (positions x rotary_dims), each computed once while the frequencies stay the same.
  const float* RopeTable(const RopeParams& p);

  ThreadPool* pool_;
  CpuOptions options_;
  CpuIsa isa_;
  const MatmulKernels* matmul_;
  const MatmulKernels* bf16_matmul_;  // bf16 weights with bf16_activations, else null
  Scratch activations_[5];            // matmul inputs in each kernel order (Matmul)
  // Data of the bf16 weights PrepareWeight packed (bf16_activations), read by the packed
  // kernels, to the host data each was packed from (which, as for the plain formats used in
  // place, must outlive the prepared weight): Embed reads a packed table's rows there.
  std::unordered_map<const void*, const void*> packed_;
  // RopeTable: a cos/sin table for each set of frequencies seen (a model's layers may rotate
  // with different tables: Gemma's local and global), keyed by the frequencies' values.
  struct RopeCache {
    std::vector<float> inv_freq;
    std::vector<float> table;  // [positions, rotary_dims]: cos then sin
  };
  std::vector<RopeCache> rope_tables_;
  Scratch attention_;       // per thread: accumulators of one kv head's query heads
  Scratch tile_attention_;  // per thread: prompt tiles' queries, keys, values and sums
  std::vector<std::pair<int64_t, int64_t>> tiles_;  // Attention: (first row, rows) a task
  // MoeFeedForward: router logits, each row's experts and weights, an expert's rows gathered,
  // its gate/up and down outputs, the weighted sums.
  struct MoeScratch {
    std::vector<float> logits, weights, rows_in, gate, up, rows_out, sum;
    std::vector<int32_t> picked;
    std::vector<std::vector<std::pair<int32_t, float>>> by_expert;  // (row, weight)
  };
  MoeScratch moe_;
  std::vector<std::unique_ptr<Sampler>> samplers_;  // [pool threads], each made at its first row
  // SetOpTrace: the op running since op_start_ (null: none), and the totals so far.
  bool op_trace_ = false;
  int op_depth_ = 0;
  const char* op_name_ = nullptr;
  std::chrono::steady_clock::time_point op_start_;
  OpTotals op_totals_;
};

// The CPU backend with default options.
std::unique_ptr<Backend> MakeCpuBackend(ThreadPool* pool);
// Fails where the options ask for what this CPU lacks.
Expected<std::unique_ptr<Backend>> MakeCpuBackend(ThreadPool* pool, const CpuOptions& options);

}  // namespace gizllm
