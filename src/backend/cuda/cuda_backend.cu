// CudaBackend: device memory, weights, and the ops issued in order on one stream.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels.cuh"
#include "core/check.h"
#include "formats/gguf.h"
#include "quant/layout.h"

namespace gizllm {
namespace {

#define GZ_CUBLAS_CHECK(expr)                                                    \
  do {                                                                           \
    cublasStatus_t gz_st_ = (expr);                                              \
    if (gz_st_ != CUBLAS_STATUS_SUCCESS) {                                       \
      std::fprintf(stderr, "%s:%d: cuBLASLt error %d: %s\n", __FILE__, __LINE__, \
                   static_cast<int>(gz_st_), #expr);                             \
      std::abort();                                                              \
    }                                                                            \
  } while (0)

class CudaBuffer : public Buffer {
 public:
  CudaBuffer(void* data, size_t bytes) : data_(data), bytes_(bytes) {}
  ~CudaBuffer() override {
    if (data_) cudaFree(data_);
  }
  void* data() override { return data_; }
  size_t bytes() const override { return bytes_; }

 private:
  void* data_;
  size_t bytes_;
};

// A weight's storage and its bf16 copy (CudaOptions::bf16_copies), kept alive together; data()
// is the weight's.
class WithCopy : public Buffer {
 public:
  WithCopy(std::unique_ptr<Buffer> main, std::unique_ptr<Buffer> copy)
      : main_(std::move(main)), copy_(std::move(copy)) {}
  void* data() override { return main_->data(); }
  size_t bytes() const override { return main_->bytes() + copy_->bytes(); }

 private:
  std::unique_ptr<Buffer> main_, copy_;
};

// One cuBLASLt product shape and the algorithm picked for it.
// Products of at least this many rows take the algorithm chosen for their rows rounded up to 128;
// from kBucketedPlanRows rows up to it, rounded up to 32 (a step of decode rows with drafts, or
// with a prompt piece beside them, makes row counts that come once or a few times).
constexpr int64_t kRoundedPlanRows = 256;
constexpr int64_t kBucketedPlanRows = 33;

// The row count whose heuristic algorithm a product of `rows` rows takes (itself where it is one).
int64_t PlanBucket(int64_t rows) {
  if (rows >= kRoundedPlanRows) return (rows + 127) / 128 * 128;
  if (rows >= kBucketedPlanRows) return (rows + 31) / 32 * 32;
  return rows;
}

struct LtPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo;
  bool found = false;  // whether the heuristic gave an algorithm (always, without a bias end)
};

class CudaBackend : public Backend {
 public:
  CudaBackend(const CudaOptions& options, cudaStream_t stream, cublasLtHandle_t lt,
              const cudaDeviceProp& prop)
      : options_(options),
        stream_(stream),
        lt_(lt),
        name_(prop.name),
        sm_count_(prop.multiProcessorCount),
        gemv_max_rows_(options.gemv_max_rows >= 0 ? options.gemv_max_rows
                                                  : (options.exact ? 8 : 1)) {}

  ~CudaBackend() override {
    cudaStreamSynchronize(stream_);
    for (auto& [key, step] : graphs_) cudaGraphExecDestroy(step.exec);
    for (cudaEvent_t e : op_events_) cudaEventDestroy(e);
    for (auto& [key, plan] : plans_) {
      cublasLtMatrixLayoutDestroy(plan.a);
      cublasLtMatrixLayoutDestroy(plan.b);
      cublasLtMatrixLayoutDestroy(plan.c);
      cublasLtMatmulDescDestroy(plan.desc);
    }
    if (workspace_) cudaFree(workspace_);
    for (auto& [pointers, table] : moe_tables_) cudaFree(table);
    if (upload_) cudaStreamDestroy(upload_);
    for (Staging& half : staging_) {
      if (half.done) cudaEventDestroy(half.done);
    }
    if (staging_[0].host) cudaFreeHost(staging_[0].host);
    FreeExpertCache();
    if (fork_) {
      for (int i = 0; i < kSides; ++i) {
        cudaStreamSynchronize(side_[i]);
        cudaStreamDestroy(side_[i]);
        cudaEventDestroy(join_[i]);
        cudaFree(side_workspace_[i]);
      }
      cudaEventDestroy(fork_);
    }
    cublasLtDestroy(lt_);
    cudaStreamDestroy(stream_);
  }

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string Describe() const override {
    return "cuda (" + name_ + (options_.exact ? ", exact" : "") + ")";
  }

  Expected<std::unique_ptr<Buffer>> Allocate(size_t bytes) override {
    ForgetHandOffs();
    void* data = nullptr;
    if (bytes > 0) {
      cudaError_t err = cudaMalloc(&data, bytes);
      if (err != cudaSuccess) {
        cudaGetLastError();
        return ResourceExhausted("cuda: cannot allocate " + std::to_string(bytes) +
                                 " bytes of device memory: " + cudaGetErrorString(err));
      }
      GZ_CUDA_CHECK(cudaMemsetAsync(data, 0, bytes, stream_));
      GZ_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    return std::unique_ptr<Buffer>(new CudaBuffer(data, bytes));
  }

  DeviceMemory Memory() const override {
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
      cudaGetLastError();
      return {};
    }
    return {static_cast<int64_t>(free), static_cast<int64_t>(total)};
  }

  // A small copy (a step's tokens, positions, page tables, sampling rows) goes through pinned
  // staging and is not waited for: the ops after it on the stream see it, and the host goes on
  // preparing the next inputs instead of waiting for the device a copy. A step uploads ten or
  // more such arrays, each a round trip of several microseconds when it waited. Large copies
  // (weights) and copies while a step is recorded wait as before.
  void CopyToDevice(void* dst, const void* src, size_t bytes) override {
    ForgetHandOffs();
    if (bytes == 0) return;
    if (bytes <= kStagedMost && !capturing_) {
      if (void* staged = Stage(src, bytes)) {
        GZ_CUDA_CHECK(cudaMemcpyAsync(dst, staged, bytes, cudaMemcpyHostToDevice, stream_));
        return;
      }
    }
    GZ_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
    GZ_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void CopyToHost(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    GZ_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    GZ_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  // On the stream, without waiting: the ops after it see the copy.
  void CopyOnDevice(void* dst, const void* src, size_t bytes) override {
    ForgetHandOffs();
    if (bytes == 0) return;
    GZ_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  }

  Expected<Weight> PrepareWeight(const Weight& host, std::unique_ptr<Buffer>* storage) override {
    if (quant::IsQuantized(host.format)) {
      GZ_RETURN_IF_ERROR(cuda::CheckQuantWeight(host));
      std::vector<uint8_t> packed(cuda::QuantDeviceBytes(host));
      cuda::PackQuantWeight(host, packed.data());
      GZ_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> buffer, Allocate(packed.size()));
      CopyToDevice(buffer->data(), packed.data(), packed.size());
      Weight w = cuda::QuantDeviceWeight(host, buffer->data());
      *storage = std::move(buffer);
      return w;
    }
    if (host.format == Format::kGgml) {
      // ggml's blocks as the file holds them (ggml_matmul.cu).
      GgmlBlock block;
      if (!cuda::GgmlReads(host.ggml_type) ||
          !GgmlBlockOf(static_cast<GgmlType>(host.ggml_type), &block)) {
        return Unimplemented("cuda: ggml block type " +
                             GgmlTypeName(static_cast<GgmlType>(host.ggml_type)) +
                             " has no kernel (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, IQ4_XS and Q1_0 do)");
      }
      if (host.empty() || host.rows <= 0 || host.cols <= 0 || host.cols % block.elements != 0) {
        return InvalidArgument("cuda: ggml weight without data or with rows of partial blocks");
      }
    } else if (host.format != Format::kBf16 && host.format != Format::kF16 &&
               host.format != Format::kF32) {
      return Unimplemented("cuda: weight format " + FormatName(host.format) +
                           " has no CUDA kernel yet (plain bf16, f16 and f32 do)");
    }
    if (host.empty()) return InvalidArgument("cuda: PrepareWeight of an empty weight");
    size_t bytes = static_cast<size_t>(host.Bytes());
    GZ_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> buffer, Allocate(bytes));
    CopyToDevice(buffer->data(), host.data, bytes);
    Weight w = host;
    w.data = buffer->data();
    *storage = std::move(buffer);
    return w;
  }

  // CudaOptions::bf16_copies: the weight's values as bf16 beside it, `storage` then holding
  // both; none in exact mode, for weights the many-row paths do not decode, and where the copy
  // would leave less than half the device's memory free.
  void AddBf16Copy(Weight* w, std::unique_ptr<Buffer>* storage) override {
    if (options_.exact || !options_.bf16_copies) return;
    if (w->rows * w->cols > cuda::kQuantGemmMaxElements) return;
    if (w->format == Format::kGgml ? !cuda::GgmlDequants(*w) : !quant::IsQuantized(w->format)) {
      return;
    }
    const size_t bytes = static_cast<size_t>(w->rows * w->cols) * 2;
    const DeviceMemory memory = Memory();
    if (memory.total <= 0 || memory.free - static_cast<int64_t>(bytes) < memory.total / 2) return;
    void* copy = nullptr;
    if (cudaMalloc(&copy, bytes) != cudaSuccess) {
      cudaGetLastError();
      return;
    }
    if (w->format == Format::kGgml) {
      cuda::LaunchGgmlDequantBf16(*w, copy, stream_);
    } else {
      cuda::LaunchDequantBf16(*w, copy, stream_);
    }
    GZ_CUDA_CHECK(cudaStreamSynchronize(stream_));
    w->bf16 = copy;
    *storage = std::unique_ptr<Buffer>(
        new WithCopy(std::move(*storage), std::unique_ptr<Buffer>(new CudaBuffer(copy, bytes))));
  }

  Status CheckAttentionShape(int heads, int kv_heads, int head_dim) const override {
    if (cuda::AttentionSupported(heads, kv_heads, head_dim)) return Status::Ok();
    return Unimplemented("cuda: attention with head_dim " + std::to_string(head_dim) + ", " +
                         std::to_string(heads) + " query heads over " + std::to_string(kv_heads) +
                         " kv heads has no kernel (head_dim must be a multiple of 32 up to 256, "
                         "query heads a multiple of kv heads, at most 64 per kv head)");
  }

  // Float32 pages, and fp16 pages (KvFormat::kF16) which every attention kernel, RopeKv and
  // KvWrite take as they are. fp16 rather than bf16: fp16 keeps 3 more bits of mantissa (each
  // value off by at most 2^-11 of itself, against bf16's 2^-8), and its narrower range costs
  // nothing here: keys and values (outputs of norms and of projections of modest size) stay far
  // inside +-65504 (beyond it a value saturates). It is also the CPU's 16-bit format and the
  // tensor-core kernel's operand type, so a prompt's keys reach the tensor cores as stored.
  // Rotated pages (8, 4 and 2 bits, ops/kv_codes.h): a write kernel and an attention kernel of
  // their own (attention_codes.cu; no tensor cores, no split of long contexts yet). q8 has none.
  bool SupportsKvFormat(KvFormat f) const override {
    return f == KvFormat::kF32 || f == KvFormat::kF16 || IsRotatedKv(f);
  }
  // fp16 pages by default: half the bytes a decode step reads and twice the positions a budget
  // holds; exact mode (float32 activations everywhere) keeps float32 pages.
  KvFormat DefaultKvFormat() const override {
    return options_.exact ? KvFormat::kF32 : KvFormat::kF16;
  }

  void Embed(const EmbedParams& p) override {
    auto trace = Trace("embed");
    ForgetHandOffs();
    if (p.table->format == Format::kGgml) return cuda::LaunchGgmlEmbed(p, stream_);
    cuda::LaunchEmbed(p, stream_);
  }

  bool ReadsGgml(uint32_t ggml_type) const override { return cuda::GgmlReads(ggml_type); }
  // The grouped expert kernels read plain and the own quantized formats only.
  bool ReadsGgmlExperts(uint32_t) const override { return false; }
  void RmsNorm(const RmsNormParams& p) override {
    auto trace = Trace("rms_norm");
    ForgetHandOffs();
    cuda::LaunchRmsNorm(p, stream_);
  }
  void Rope(const RopeParams& p) override {
    auto trace = Trace("rope");
    ForgetHandOffs();
    cuda::LaunchRope(p, stream_);
  }
  void KvWrite(const KvWriteParams& p) override {
    auto trace = Trace("kv_write");
    ForgetHandOffs();
    if (IsRotatedKv(p.cache.format)) return cuda::LaunchRotatedKvWrite(p, stream_);
    cuda::LaunchKvWrite(p, stream_);
  }
  void Attention(const AttentionParams& p) override {
    auto trace = Trace("attention");
    // Fast mode: prompt pieces on the tensor cores (fp16 operands), like the linears (bf16),
    // reading the fp16 copy of the keys RopeKv wrote just before for these rows where it did.
    const StepKv kv = step_kv_;
    ForgetHandOffs();
    if (IsRotatedKv(p.cache.format)) {
      return cuda::LaunchRotatedAttention(p, sm_count_, &attention_scratch_, stream_,
                                          /*tensor_cores=*/!options_.exact);
    }
    const bool same_step = kv.rows > 0 && kv.rows == p.rows && kv.keys == p.cache.keys &&
                           kv.slots == p.slots && kv.positions == p.positions;
    cuda::LaunchAttention(p, sm_count_, &attention_scratch_, stream_,
                          /*tensor_cores=*/!options_.exact, same_step ? kv.k16 : nullptr,
                          same_step ? kv.v16 : nullptr);
  }
  void Glu(const GluParams& p) override {
    auto trace = Trace("glu");
    ForgetHandOffs();
    cuda::LaunchGlu(p, stream_);
  }
  void Softcap(const SoftcapParams& p) override {
    auto trace = Trace("softcap");
    ForgetHandOffs();
    cuda::LaunchSoftcap(p, stream_);
  }
  void Add(const AddParams& p) override {
    auto trace = Trace("add");
    ForgetHandOffs();
    cuda::LaunchAdd(p, stream_);
  }
  void GatherRows(const GatherRowsParams& p) override {
    auto trace = Trace("gather_rows");
    ForgetHandOffs();
    cuda::LaunchGatherRows(p, stream_);
  }
  bool SupportsEncoder() const override { return true; }
  Status CheckEncoderShape(int head_dim) const override {
    if (cuda::EncoderAttentionCovers(head_dim)) return Status::Ok();
    return Unimplemented("cuda: encoder attention over heads of " + std::to_string(head_dim) +
                         " dims has no kernel (at most 256)");
  }
  // Fast mode: LayerNorm and Gelu over more rows than the GEMV takes leave a bf16 copy of their
  // output (Bf16Copy) for the matmul an encoder layer issues next (up after the attention's norm,
  // the next layer's q/k/v after the feed-forward's, down after Gelu): the copy costs 2 bytes an
  // element written, the conversion it replaces 4 read and 2 written.
  void LayerNorm(const LayerNormParams& p) override {
    auto trace = Trace("layer_norm");
    ForgetHandOffs();
    if (options_.exact || p.rows <= gemv_max_rows_) return cuda::LaunchLayerNorm(p, stream_);
    const int64_t n = p.rows * p.dim;
    void* ob = x_bf16_.Get(static_cast<size_t>(n) * 2);
    cuda::LaunchLayerNorm(p, stream_, ob);
    bf16_copy_ = {p.out, n, ob};
  }
  void Gelu(const GeluParams& p) override {
    auto trace = Trace("gelu");
    ForgetHandOffs();
    if (options_.exact) return cuda::LaunchGelu(p, stream_);
    void* ob = ffn_bf16_.Get(static_cast<size_t>(p.n) * 2);
    cuda::LaunchGelu(p, stream_, ob);
    bf16_copy_ = {p.x, p.n, ob};
  }
  void MeanRows(const MeanRowsParams& p) override {
    auto trace = Trace("mean_rows");
    ForgetHandOffs();
    cuda::LaunchMeanRows(p, stream_);
  }
  void EncoderAttention(const EncoderAttentionParams& p) override {
    auto trace = Trace("encoder_attention");
    ForgetHandOffs();
    // Fast mode: the tensor-core kernel (fp16 operands) where it covers the shape, leaving a
    // bf16 copy of its output for the output projection (Bf16Copy); exact mode and the other
    // shapes the float32 kernel. Encoder::Load checked CheckEncoderShape.
    if (!options_.exact && cuda::EncoderAttentionMmaCovers(p)) {
      const int64_t n = p.rows * p.heads * p.head_dim;
      void* ob = attention_bf16_.Get(static_cast<size_t>(n) * 2);
      void* kv16 = encoder_kv16_.Get(cuda::EncoderAttentionMmaScratchBytes(p));
      cuda::LaunchEncoderAttentionMma(p, ob, kv16, stream_);
      bf16_copy_ = {p.out, n, ob};
      return;
    }
    cuda::LaunchEncoderAttention(p, stream_);
  }
  bool CanSample() const override { return true; }
  void Sample(const SampleParams& p) override {
    auto trace = Trace("sample");
    ForgetHandOffs();
    cuda::LaunchSample(p, stream_);
  }

  bool SupportsMoe() const override { return true; }
  Status CheckMoeShape(int experts, int top_k) const override {
    if (experts <= cuda::kMoeMaxExperts && top_k >= 1 && top_k <= experts) return Status::Ok();
    return Unimplemented("cuda: a mixture of " + std::to_string(experts) + " experts, " +
                         std::to_string(top_k) + " a token, has no kernel (at most " +
                         std::to_string(cuda::kMoeMaxExperts) + " experts)");
  }
  void MoeFeedForward(const MoeFeedForwardParams& p) override {
    auto trace = Trace("moe");
    ForgetHandOffs();
    if (p.rows == 0) return;
    // Fast mode: bf16 activations into the experts where a dense linear of as many rows would
    // take them (more rows than the GEMV takes), float32 otherwise; the router always float32.
    const bool bf16 = !options_.exact && p.rows > gemv_max_rows_;
    if (p.cached) return CachedMoe(p, bf16);
    cuda::MoeDevice d = MoeBuffers(p);
    MoeTable(p, &d);
    cuda::LaunchMoe(p, d, bf16, sm_count_, stream_);
    if (p.shared_ffn > 0) SharedExpertAdd(p, SharedExpert(p));
  }

  // Slots: [gate | up | down] of one expert, each part on kSlotAlign bytes, in the device layout
  // PrepareWeight gives it (quantized: PackQuantWeight's).
  bool SupportsExpertCache() const override { return true; }
  int64_t ExpertSlotBytes(const Weight& gate, const Weight& up, const Weight& down) const override {
    return SlotPart(gate) + SlotPart(up) + SlotPart(down);
  }
  Status ReserveExpertCache(int64_t slots, int64_t slot_bytes) override {
    if (slots <= 0 || slot_bytes <= 0)
      return InvalidArgument("cuda: an expert cache of " + std::to_string(slots) + " slots of " +
                             std::to_string(slot_bytes) + " bytes");
    if (expert_slots_) return Internal("cuda: the expert cache is reserved already");
    const size_t bytes = static_cast<size_t>(slots) * static_cast<size_t>(slot_bytes);
    if (cudaMalloc(&cache_.slots, bytes) != cudaSuccess) {
      cudaGetLastError();
      cache_.slots = nullptr;
      return ResourceExhausted("cuda: cannot allocate " + std::to_string(slots) +
                               " expert slots of " + std::to_string(slot_bytes) + " bytes (" +
                               std::to_string(bytes >> 20) + " MiB) of device memory");
    }
    cache_.slot_bytes = slot_bytes;
    GZ_CUDA_CHECK(cudaStreamCreateWithFlags(&cache_.copy, cudaStreamNonBlocking));
    for (ExpertCacheState::Staging& st : cache_.staging) {
      GZ_CUDA_CHECK(cudaHostAlloc(&st.host, static_cast<size_t>(slot_bytes), cudaHostAllocDefault));
      GZ_CUDA_CHECK(cudaEventCreateWithFlags(&st.done, cudaEventDisableTiming));
      GZ_CUDA_CHECK(cudaEventRecord(st.done, cache_.copy));
    }
    GZ_CUDA_CHECK(cudaEventCreateWithFlags(&cache_.ids_ready, cudaEventDisableTiming));
    GZ_CUDA_CHECK(cudaEventCreateWithFlags(&cache_.filled, cudaEventDisableTiming));
    GZ_CUDA_CHECK(cudaEventCreateWithFlags(&cache_.run_done, cudaEventDisableTiming));
    expert_slots_ = std::make_unique<ExpertSlots>(slots);
    return Status::Ok();
  }
  ExpertCacheStats ExpertCache() const override {
    if (!expert_slots_) return {};
    return {expert_slots_->slots(), expert_slots_->hits(), expert_slots_->misses(), cache_.read_ms};
  }

  bool SupportsRecurrent() const override { return true; }
  Status CheckRecurrentShape(int k_dim, int v_dim, int kernel) const override {
    return cuda::CheckRecurrentShape(k_dim, v_dim, kernel);
  }
  void CausalConv(const CausalConvParams& p) override {
    auto trace = Trace("causal_conv");
    ForgetHandOffs();
    cuda::LaunchCausalConv(p, stream_);
  }
  void L2Norm(const L2NormParams& p) override {
    auto trace = Trace("l2_norm");
    ForgetHandOffs();
    cuda::LaunchL2Norm(p, stream_);
  }
  void GatedDeltaRule(const GatedDeltaRuleParams& p) override {
    auto trace = Trace("gated_delta_rule");
    ForgetHandOffs();
    // The chunk-parallel form in float32 in both modes: with the serial kernel's products in
    // tf32 the qwen3_5 and qwen3_5_moe golden models' fast-mode logits were 3.3% and 6.5% (norm)
    // from their rounded references against 2% (H200, 2026-12-04). Its scratch comes from
    // delta_rule_scratch_ (sized by the step's rows, so a recorded step keeps its buffer).
    cuda::LaunchGatedDeltaRule(p, cuda::kDeltaRuleChunkedRows, cuda::DeltaRuleForm::kParallel,
                               &delta_rule_scratch_, stream_);
  }
  void GatedRmsNorm(const GatedRmsNormParams& p) override {
    auto trace = Trace("gated_rms_norm");
    ForgetHandOffs();
    cuda::LaunchGatedRmsNorm(p, stream_);
  }

  bool FusesMatmul() const override { return true; }
  void RopeKv(const RopeKvParams& p) override {
    auto trace = Trace("rope_kv");
    // A step of more than one row in fast mode over float32 pages: an fp16 copy of its keys and
    // values for the tensor-core attention that follows (StepKv). fp16 pages are read as they
    // are.
    ForgetHandOffs();
    if (IsRotatedKv(p.kv.cache.format)) {
      cuda::LaunchRope(p.q, stream_);
      cuda::LaunchRope(p.k, stream_);
      return cuda::LaunchRotatedKvWrite(p.kv, stream_);
    }
    if (!options_.exact && p.kv.rows > 1 && p.kv.head_dim % 8 == 0 &&
        p.kv.cache.format == KvFormat::kF32) {
      const size_t n = static_cast<size_t>(p.kv.rows) * p.kv.kv_heads * p.kv.head_dim;
      char* base = static_cast<char*>(step_kv16_.Get(n * 4));
      step_kv_ = {p.kv.rows, p.kv.cache.keys, p.kv.slots, p.kv.positions, base, base + n * 2};
    }
    cuda::LaunchRopeKv(p, stream_, step_kv_.rows > 0 ? step_kv_.k16 : nullptr,
                       step_kv_.rows > 0 ? step_kv_.v16 : nullptr);
  }

  void Matmul(const MatmulParams& p) override {
    auto trace = Trace("matmul");
    const Bf16Copy copy = bf16_copy_;
    ForgetHandOffs();
    if (p.rows == 0) return;
    const int64_t cols = p.w[0]->cols;
    if (p.norm && FastGemm(p)) {
      // The normalized rows straight to bf16 for cuBLASLt: the float32 copy and its conversion
      // skipped, the same bf16 values.
      void* xb = x_bf16_.Get(static_cast<size_t>(p.rows * cols) * 2);
      cuda::LaunchRmsNormToBf16(
          {nullptr, p.x, nullptr, p.norm, p.rows, cols, p.norm_eps, p.norm_offset}, xb, stream_);
      return LtOutputs(p, xb);
    }
    if (p.norm) {
      // The norm into scratch, then the product of the normalized rows. (Normalizing inside the
      // GEMV costs every block a pass over x and the norm weight: slower than this kernel.)
      float* xn = static_cast<float*>(normed_x_.Get(static_cast<size_t>(p.rows * cols) * 4));
      cuda::LaunchRmsNorm({xn, p.x, nullptr, p.norm, p.rows, cols, p.norm_eps, p.norm_offset},
                          stream_);
      MatmulParams plain = p;
      plain.x = xn;
      plain.norm = nullptr;
      return Matmul(plain);
    }
    if (cuda::HasGgml(p)) {
      // Each output on its own kernel (a plain one beside a ggml one through Matmul alone), then
      // the SwiGLU end. Fast mode, past the decode kernels' rows: the weight decoded to bf16
      // scratch and the product on cuBLASLt (the decode kernels would read the weight once for
      // every 8 rows).
      void* xb = nullptr;
      for (int i = 0; i < p.outputs; ++i) {
        const Weight& w = *p.w[i];
        if (w.format == Format::kGgml && !options_.exact && p.rows > cuda::kGgmlGemmRows &&
            w.rows * w.cols <= cuda::kQuantGemmMaxElements && cuda::GgmlDequants(w)) {
          if (!xb) {
            xb = x_bf16_.Get(static_cast<size_t>(p.rows * cols) * 2);
            cuda::LaunchToBf16(p.x, p.rows * cols, xb, stream_);
          }
          Bf16Product(xb, p.rows, w, p.out[i], p.accumulate, p.bias[i],
                      [&](void* decoded) { cuda::LaunchGgmlDequantBf16(w, decoded, stream_); });
          continue;
        }
        if (w.format == Format::kGgml) {
          cuda::LaunchGgmlMatmul(p.x, p.rows, w, p.bias[i], p.out[i], p.accumulate, stream_);
          continue;
        }
        MatmulParams one;
        one.x = p.x;
        one.rows = p.rows;
        one.w[0] = p.w[i];
        one.out[0] = p.out[i];
        one.bias[0] = p.bias[i];
        one.accumulate = p.accumulate;
        Matmul(one);
      }
      if (p.swiglu) cuda::LaunchGlu({p.out[0], p.out[0], p.out[1], p.rows * p.w[0]->rows}, stream_);
      return;
    }
    if (cuda::HasQuantized(p)) {
      if ((p.accumulate || p.swiglu) && !cuda::QuantFusesEnds(p, options_.exact))
        return QuantEnds(p);
      MatmulParams plain =
          QuantGemmFits(p) ? QuantGemm(p)
                           : cuda::LaunchQuantMatmul(p, options_.exact, &quant_scratch_, stream_);
      if (plain.outputs > 0) Matmul(plain);
      return;
    }
    if (p.rows <= gemv_max_rows_ && cuda::GemvCovers(p)) {
      cuda::LaunchGemv(p, sm_count_, stream_);
      return;
    }
    if (FastGemm(p)) {
      // Fast mode: bf16 activations once for every output (or the copy the op before left of
      // them), then cuBLASLt.
      if (copy.of == p.x && copy.n == p.rows * cols) return LtOutputs(p, copy.data);
      void* xb = x_bf16_.Get(static_cast<size_t>(p.rows * cols) * 2);
      cuda::LaunchToBf16(p.x, p.rows * cols, xb, stream_);
      return LtOutputs(p, xb);
    }
    for (int i = 0; i < p.outputs; ++i)
      cuda::LaunchGemmF32(p.x, p.rows, *p.w[i], p.bias[i], p.out[i], p.accumulate, stream_);
    if (p.swiglu) {
      cuda::LaunchGlu({p.out[0], p.out[0], p.out[1], p.rows * p.w[0]->rows}, stream_);
    }
  }

  // Whether p (after its norm) runs on cuBLASLt with bf16 activations: fast mode, bf16
  // weights, more rows than the GEMV takes.
  bool FastGemm(const MatmulParams& p) const {
    if (options_.exact || cuda::HasQuantized(p)) return false;
    for (int i = 0; i < p.outputs; ++i)
      if (p.w[i]->format != Format::kBf16) return false;
    MatmulParams plain = p;
    plain.norm = nullptr;
    return !(p.rows <= gemv_max_rows_ && cuda::GemvCovers(plain));
  }

  // The products of p's outputs from bf16 activations xb (adding into out for accumulate),
  // their biases, and the swiglu end; SwiGLU leaves a bf16 copy of its result for the down
  // projection that reads it next (Bf16Copy).
  // Outputs after the first of a product of at most kForkRows rows run on side streams, beside
  // the first (forked after what the stream has issued, joined before what follows): at batched
  // decode sizes one cuBLASLt product (k or v beside q) leaves most of the device idle.
  void LtOutputs(const MatmulParams& p, const void* xb) {
    const bool fork = p.outputs > 1 && p.rows <= kForkRows;
    if (fork) {
      MakeSideStreams();
      GZ_CUDA_CHECK(cudaEventRecord(fork_, stream_));
      for (int i = 1; i < p.outputs; ++i)
        GZ_CUDA_CHECK(cudaStreamWaitEvent(side_[i - 1], fork_, 0));
    }
    for (int i = 0; i < p.outputs; ++i) {
      const int side = fork ? i : 0;
      if (!LtMatmul(xb, p.rows, *p.w[i], p.out[i], p.accumulate, side, p.bias[i]) && p.bias[i]) {
        cuda::LaunchAddBias(p.out[i], p.rows, p.w[i]->rows, p.bias[i],
                            side ? side_[side - 1] : stream_);
      }
    }
    if (fork) {
      for (int i = 1; i < p.outputs; ++i) {
        GZ_CUDA_CHECK(cudaEventRecord(join_[i - 1], side_[i - 1]));
        GZ_CUDA_CHECK(cudaStreamWaitEvent(stream_, join_[i - 1], 0));
      }
    }
    if (p.swiglu) {
      const int64_t n = p.rows * p.w[0]->rows;
      void* hb = ffn_bf16_.Get(static_cast<size_t>(n) * 2);
      cuda::LaunchGlu({p.out[0], p.out[0], p.out[1], n}, stream_, hb);
      bf16_copy_ = {p.out[0], n, hb};
    }
  }

  // The accumulate and swiglu ends of a quantized matmul: the product, then the add or SwiGLU.
  void QuantEnds(const MatmulParams& p) {
    MatmulParams plain = p;
    plain.accumulate = plain.swiglu = false;
    const int64_t n = p.w[0]->rows;
    if (p.accumulate) {
      float* y = static_cast<float*>(quant_out_.Get(static_cast<size_t>(p.rows * n) * 4));
      plain.out[0] = y;
      Matmul(plain);
      cuda::LaunchAdd({p.out[0], y, p.rows * n}, stream_);
      return;
    }
    Matmul(plain);
    cuda::LaunchGlu({p.out[0], p.out[0], p.out[1], p.rows * n}, stream_);
  }

  void Synchronize() override { GZ_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  void MakeCurrent() override { GZ_CUDA_CHECK(cudaSetDevice(options_.device)); }

  bool SetOpTrace(bool on) override {
    op_trace_ = on;
    op_events_used_ = 0;
    op_totals_.Take();
    return true;
  }

  std::vector<OpTime> TakeOpTrace() override {
    if (op_events_used_ > 0) {
      NoteOp(nullptr);  // the end of the last op
      GZ_CUDA_CHECK(cudaEventSynchronize(op_events_[op_events_used_ - 1]));
      for (size_t i = 0; i + 1 < op_events_used_; ++i) {
        float ms = 0.0f;
        GZ_CUDA_CHECK(cudaEventElapsedTime(&ms, op_events_[i], op_events_[i + 1]));
        op_totals_.Add(op_names_[i], ms);
      }
      op_events_used_ = 0;
    }
    return op_totals_.Take();
  }

  bool ReplayStep(uint64_t key) override {
    ForgetHandOffs();
    if (!options_.graphs || capturing_ || op_trace_ || expert_slots_) return false;
    auto it = graphs_.find(key);
    if (it == graphs_.end()) return false;
    it->second.last_use = ++use_clock_;
    GZ_CUDA_CHECK(cudaGraphLaunch(it->second.exec, stream_));
    return true;
  }

  void BeginStep(uint64_t key) override {
    ForgetHandOffs();
    if (!options_.graphs || options_.max_graphs <= 0 || capturing_ || op_trace_ || expert_slots_)
      return;
    // Relaxed: the ops may allocate scratch memory while they are recorded.
    GZ_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
    capturing_ = true;
    capture_key_ = key;
  }

  void EndStep() override {
    ForgetHandOffs();
    if (!capturing_) return;
    capturing_ = false;
    cudaGraph_t graph = nullptr;
    GZ_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
    cudaGraphExec_t exec = nullptr;
    GZ_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    GZ_CUDA_CHECK(cudaGraphDestroy(graph));
    auto old = graphs_.find(capture_key_);
    if (old != graphs_.end()) {
      cudaGraphExecDestroy(old->second.exec);
      graphs_.erase(old);
    }
    if (static_cast<int>(graphs_.size()) >= options_.max_graphs) {
      auto lru = graphs_.begin();
      for (auto it = graphs_.begin(); it != graphs_.end(); ++it)
        if (it->second.last_use < lru->second.last_use) lru = it;
      GZ_CUDA_CHECK(cudaGraphExecDestroy(lru->second.exec));
      graphs_.erase(lru);
    }
    graphs_[capture_key_] = {exec, ++use_clock_};
    // Recording ran nothing: run the step now.
    GZ_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
  }

 private:
  static constexpr size_t kWorkspaceBytes = 32 << 20;

  // out[rows, n] (f32) = x[rows, cols] (bf16) W[n, cols]^T (accumulate: out +=). In cuBLASLt's
  // column-major terms:
  // out^T [n, rows] = W^T^T ... that is D = op(A) B with A = W stored [cols, n] (transposed),
  // B = x stored [cols, rows].
  // `side`: on side stream side - 1 with its own workspace (0: the backend's stream).
  // `bias` ([n] or null): added in cuBLASLt's epilogue (out = x W^T (+ out) + bias) where a
  // 16-byte aligned bias has an algorithm there; returns whether it was added (false: the caller
  // adds it). The epilogue saves a read and a write of out: at an encoder's 8,192 rows, six
  // passes over [rows, dim] floats and two over [rows, ffn] a layer.
  bool LtMatmul(const void* x, int64_t rows, const Weight& w, float* out, bool accumulate = false,
                int side = 0, const float* bias = nullptr) {
    const bool aligned = bias && reinterpret_cast<uintptr_t>(bias) % 16 == 0;
    LtPlan* plan = aligned ? &Plan(rows, w.rows, w.cols, /*bias=*/true) : nullptr;
    const bool fused = plan && plan->found;
    if (fused) {
      GZ_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                     &bias, sizeof(bias)));
    } else {
      plan = &Plan(rows, w.rows, w.cols);
    }
    float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    GZ_CUBLAS_CHECK(cublasLtMatmul(lt_, plan->desc, &alpha, w.data, plan->a, x, plan->b, &beta, out,
                                   plan->c, out, plan->c, &plan->algo,
                                   side ? side_workspace_[side - 1] : workspace_, kWorkspaceBytes,
                                   side ? side_[side - 1] : stream_));
    return fused;
  }

  // The side streams, their workspaces and the fork and join events, made on first use.
  void MakeSideStreams() {
    if (fork_) return;
    GZ_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
    for (int i = 0; i < kSides; ++i) {
      GZ_CUDA_CHECK(cudaStreamCreateWithFlags(&side_[i], cudaStreamNonBlocking));
      GZ_CUDA_CHECK(cudaEventCreateWithFlags(&join_[i], cudaEventDisableTiming));
      GZ_CUDA_CHECK(cudaMalloc(&side_workspace_[i], kWorkspaceBytes));
    }
  }

  // Many rows of quantized weights in fast mode: each weight dequantized to bf16 scratch and the
  // activations rotated to bf16, then cuBLASLt (weights read once more, a small share of the
  // products' time at this many rows).
  bool QuantGemmFits(const MatmulParams& p) const {
    if (options_.exact || p.rows < cuda::kQuantGemmRows) return false;
    for (int i = 0; i < p.outputs; ++i) {
      const Weight& w = *p.w[i];
      if (quant::IsQuantized(w.format) && w.rows * w.cols > cuda::kQuantGemmMaxElements)
        return false;
    }
    return true;
  }
  // Runs the quantized outputs of p; returns the plain ones left.
  MatmulParams QuantGemm(const MatmulParams& p) {
    MatmulParams plain = p;
    plain.outputs = 0;
    for (int i = 0; i < p.outputs; ++i) {
      const Weight& w = *p.w[i];
      if (!quant::IsQuantized(w.format)) {
        plain.w[plain.outputs] = p.w[i];
        plain.out[plain.outputs] = p.out[i];
        plain.bias[plain.outputs] = p.bias[i];
        ++plain.outputs;
        continue;
      }
      void* xb = quant_x_bf16_.Get(static_cast<size_t>(p.rows * w.cols) * 2);
      cuda::LaunchRotateToBf16(p.x, p.rows, w, xb, stream_);
      Bf16Product(xb, p.rows, w, p.out[i], /*accumulate=*/false, p.bias[i],
                  [&](void* decoded) { cuda::LaunchDequantBf16(w, decoded, stream_); });
    }
    return plain;
  }

  // out [rows, w.rows] (+)= xb [rows, w.cols] (bf16) times w's values in bf16 through cuBLASLt:
  // its copy (Weight::bf16), else `decode(scratch)` writes them for this product; then the bias
  // where LtMatmul did not add it.
  template <class Decode>
  void Bf16Product(const void* xb, int64_t rows, const Weight& w, float* out, bool accumulate,
                   const float* bias, Decode&& decode) {
    const void* wb = w.bf16;
    if (!wb) {
      void* decoded = quant_w_bf16_.Get(static_cast<size_t>(w.rows * w.cols) * 2);
      decode(decoded);
      wb = decoded;
    }
    Weight view{Format::kBf16, w.rows, w.cols};
    view.data = wb;
    if (!LtMatmul(xb, rows, view, out, accumulate, /*side=*/0, bias) && bias) {
      cuda::LaunchAddBias(out, rows, w.rows, bias, stream_);
    }
  }

  // The algorithms the heuristic gives for a product (0 or 1). A bias epilogue it does not
  // take (an error status) counts as none; any other error stops.
  int Heuristic(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                cublasLtMatrixLayout_t c, cublasLtMatmulPreference_t pref,
                cublasLtMatmulHeuristicResult_t* result, bool bias) {
    int found = 0;
    const cublasStatus_t status =
        cublasLtMatmulAlgoGetHeuristic(lt_, desc, a, b, c, c, pref, 1, result, &found);
    if (status != CUBLAS_STATUS_SUCCESS && bias) return 0;
    GZ_CUBLAS_CHECK(status);
    return found;
  }

  // The plan of a product shape, with the bias epilogue (float32 bias, D's type) or without;
  // a bias plan may have no algorithm (found false), one without always has.
  LtPlan& Plan(int64_t rows, int64_t n, int64_t cols, bool bias = false) {
    auto key = std::make_tuple(rows, n, cols, bias);
    auto it = plans_.find(key);
    if (it != plans_.end()) return it->second;
    if (!workspace_) GZ_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
    LtPlan plan;
    GZ_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    GZ_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    GZ_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    if (bias) {
      // The heuristic reads the bias pointer's alignment: one of 16 bytes and no more (the
      // workspace + 16), so that the algorithm takes any 16-byte aligned bias.
      const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
      const void* probe = static_cast<const char*>(workspace_) + 16;
      GZ_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                     &epilogue, sizeof(epilogue)));
      GZ_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                     &probe, sizeof(probe)));
    }
    GZ_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.a, CUDA_R_16BF, cols, n, cols));
    GZ_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.b, CUDA_R_16BF, cols, rows, cols));
    GZ_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.c, CUDA_R_32F, n, rows, n));
    cublasLtMatmulPreference_t pref;
    GZ_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = kWorkspaceBytes;
    GZ_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    cublasLtMatmulHeuristicResult_t result;
    int found = 0;
    // Prompt-sized products and batches of decode rows: the algorithm the heuristic gives for
    // the rows rounded up to their bucket (PlanBucket; asked once for all the row counts it
    // covers), where it also runs this shape. A prompt's last piece beside the decode rows, or
    // a step's drafts, make row counts that come once: they then cost no heuristic of their own.
    if (const int64_t padded = PlanBucket(rows); padded != rows) {
      auto bucket = std::make_tuple(padded, n, cols, bias);
      auto known = bucket_algos_.find(bucket);
      if (known == bucket_algos_.end()) {
        cublasLtMatrixLayout_t b = nullptr, c = nullptr;
        GZ_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, cols, padded, cols));
        GZ_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c, CUDA_R_32F, n, padded, n));
        cublasLtMatmulHeuristicResult_t rounded;
        const int rounded_found = Heuristic(plan.desc, plan.a, b, c, pref, &rounded, bias);
        cublasLtMatrixLayoutDestroy(b);
        cublasLtMatrixLayoutDestroy(c);
        known = bucket_algos_.emplace(bucket, std::optional<cublasLtMatmulAlgo_t>()).first;
        if (rounded_found > 0) known->second = rounded.algo;
      }
      cublasLtMatmulHeuristicResult_t checked;
      if (known->second &&
          cublasLtMatmulAlgoCheck(lt_, plan.desc, plan.a, plan.b, plan.c, plan.c, &*known->second,
                                  &checked) == CUBLAS_STATUS_SUCCESS &&
          checked.workspaceSize <= kWorkspaceBytes) {
        result.algo = *known->second;
        found = 1;
      }
    }
    if (found == 0) found = Heuristic(plan.desc, plan.a, plan.b, plan.c, pref, &result, bias);
    cublasLtMatmulPreferenceDestroy(pref);
    if (found == 0 && bias) return plans_.emplace(key, plan).first->second;  // found: false
    if (found == 0) {
      std::fprintf(stderr, "cuBLASLt: no algorithm for %lld x %lld x %lld\n",
                   static_cast<long long>(rows), static_cast<long long>(n),
                   static_cast<long long>(cols));
      std::abort();
    }
    plan.algo = result.algo;
    plan.found = true;
    return plans_.emplace(key, plan).first->second;
  }

  // The shared expert of a mixture (Qwen3-Next, Qwen3.5-MoE): this backend's matmuls (SwiGLU
  // fused into gate/up) into y, and the gate's sigmoid argument (null: ungated); SharedExpertAdd
  // then adds it after the routed experts, out += sigmoid(x G^T) * y.
  struct SharedOut {
    const float* y = nullptr;
    const float* scale = nullptr;
  };
  SharedOut SharedExpert(const MoeFeedForwardParams& p) {
    const int64_t n = p.rows, sf = p.shared_ffn;
    float* gate = static_cast<float*>(moe_.shared_gate.Get(n * sf * 4));
    float* up = static_cast<float*>(moe_.shared_up.Get(n * sf * 4));
    float* y = static_cast<float*>(moe_.shared_out.Get(n * p.dim * 4));
    MatmulParams gate_up;
    gate_up.x = p.x;
    gate_up.rows = n;
    gate_up.outputs = 2;
    gate_up.w[0] = p.shared_gate, gate_up.w[1] = p.shared_up;
    gate_up.out[0] = gate, gate_up.out[1] = up;
    gate_up.swiglu = true;
    Matmul(gate_up);
    MatmulParams down;
    down.x = gate;
    down.rows = n;
    down.w[0] = p.shared_down;
    down.out[0] = y;
    Matmul(down);
    float* scale = nullptr;
    if (p.shared_scale) {
      scale = static_cast<float*>(moe_.shared_scale.Get(n * 4));
      MatmulParams g;
      g.x = p.x;
      g.rows = n;
      g.w[0] = p.shared_scale;
      g.out[0] = scale;
      Matmul(g);
    }
    return {y, scale};
  }
  void SharedExpertAdd(const MoeFeedForwardParams& p, SharedOut shared) {
    ForgetHandOffs();
    cuda::LaunchGatedAdd(p.out, shared.y, shared.scale, p.rows, p.dim, stream_);
  }

  // The table of a MoeFeedForward's experts' weight pointers (uploaded the first time these
  // weights are seen, on a stream of its own so that it may happen while a step is recorded).
  void MoeTable(const MoeFeedForwardParams& p, cuda::MoeDevice* d) {
    const int experts = p.experts;
    if (experts > cuda::kMoeMaxExperts) {
      std::fprintf(stderr, "cuda MoeFeedForward: %d experts, at most %d\n", experts,
                   cuda::kMoeMaxExperts);
      std::abort();
    }
    // [data of gate, up, down of each expert], then [their scales] (quantized: (mul, add) pairs).
    // Quantized experts' bf16 copies (AddBf16Copy), laid out alike with null scales, where every
    // expert has them.
    std::vector<const void*> pointers(6 * static_cast<size_t>(experts)), copies(pointers.size());
    bool aligned = true, copied = true;
    for (int e = 0; e < experts; ++e) {
      const Weight* w[3] = {&p.gate[e], &p.up[e], &p.down[e]};
      for (int m = 0; m < 3; ++m) {
        CheckExpertFormat(p, e, *w[m], m);
        pointers[m * experts + e] = w[m]->data;
        pointers[(3 + m) * experts + e] = w[m]->scales;
        aligned = aligned && reinterpret_cast<uintptr_t>(w[m]->data) % 16 == 0;
        copies[m * experts + e] = w[m]->bf16;
        copied = copied && quant::IsQuantized(w[m]->format) && w[m]->bf16 &&
                 reinterpret_cast<uintptr_t>(w[m]->bf16) % 16 == 0;
      }
    }
    d->table = DeviceTable(std::move(pointers));
    d->aligned = aligned;
    d->copies = copied ? DeviceTable(std::move(copies)) : nullptr;
  }

  // A table of device pointers on the device, uploaded the first time it is seen (on a stream
  // of its own, so that it may happen while a step is recorded) and kept.
  const void* const* DeviceTable(std::vector<const void*> pointers) {
    auto it = moe_tables_.find(pointers);
    if (it == moe_tables_.end()) {
      if (!upload_) GZ_CUDA_CHECK(cudaStreamCreateWithFlags(&upload_, cudaStreamNonBlocking));
      void* table = nullptr;
      const size_t bytes = pointers.size() * sizeof(void*);
      GZ_CUDA_CHECK(cudaMalloc(&table, bytes));
      GZ_CUDA_CHECK(
          cudaMemcpyAsync(table, pointers.data(), bytes, cudaMemcpyHostToDevice, upload_));
      GZ_CUDA_CHECK(cudaStreamSynchronize(upload_));
      it = moe_tables_.emplace(std::move(pointers), table).first;
    }
    return static_cast<const void* const*>(it->second);
  }

  // Every gate and up alike (one input, rotated once), every down alike: m is 0, 1, 2 for gate,
  // up, down.
  static void CheckExpertFormat(const MoeFeedForwardParams& p, int e, const Weight& w, int m) {
    const Weight& want = m == 2 ? p.down[0] : p.gate[0];
    const bool plain =
        want.format == Format::kBf16 || want.format == Format::kF16 || want.format == Format::kF32;
    if (w.format != want.format || (!plain && !quant::IsQuantized(want.format)) ||
        w.rotated != want.rotated || (want.rotated && w.rotation_seed != want.rotation_seed)) {
      std::fprintf(stderr,
                   "cuda MoeFeedForward: expert %d's weights are %s (every gate and up of "
                   "one plain or quantized format and rotation, every down of one)\n",
                   e, FormatName(w.format).c_str());
      std::abort();
    }
  }

  // The op's scratch (MoeSizes), without the table.
  cuda::MoeDevice MoeBuffers(const MoeFeedForwardParams& p) {
    const cuda::MoeSizes n = cuda::MoeScratchSizes(p);
    cuda::MoeDevice d;
    d.logits = static_cast<float*>(moe_.logits.Get(n.logits * 4));
    d.ids = static_cast<int*>(moe_.ids.Get(n.slots * 4));
    d.weights = static_cast<float*>(moe_.weights.Get(n.slots * 4));
    d.hidden = static_cast<float*>(moe_.hidden.Get(n.hidden * 4));
    if (n.outputs > 0) {
      d.outputs = static_cast<float*>(moe_.outputs.Get(n.outputs * 4));
      d.sorted = static_cast<int*>(moe_.sorted.Get(n.slots * 4));
      d.slot_pos = static_cast<int*>(moe_.slot_pos.Get(n.slots * 4));
      d.tiles = static_cast<int4*>(moe_.tiles.Get(n.tiles * sizeof(int4)));
      d.tile_count = static_cast<int*>(moe_.tile_count.Get(4));
    }
    if (n.rotated > 0) d.rotated = static_cast<float*>(moe_.rotated.Get(n.rotated * 4));
    return d;
  }

  // ---- The expert cache ----

  static constexpr int64_t kSlotAlign = 256;
  static int64_t SlotPart(const Weight& w) {
    const int64_t bytes =
        quant::IsQuantized(w.format) ? static_cast<int64_t>(cuda::QuantDeviceBytes(w)) : w.Bytes();
    return (bytes + kSlotAlign - 1) / kSlotAlign * kSlotAlign;
  }

  // A layer's table of pointers into the slots (by its experts' weights): on the device, and
  // its host copy, which a read changes and which goes up whole before the kernels.
  struct CachedTable {
    void* device = nullptr;
    std::vector<const void*> host;  // [6 * experts] as MoeTable's
  };
  // A MoeFeedForward over cached experts. The routing runs on the device and its picks come back
  // to the host (the one wait of the op); meanwhile the shared expert runs. Then, run by run of
  // rows whose experts fit the slots together (every row of a step where they do): the run's
  // missed experts are read from the host weights into pinned staging buffers and copied into
  // their slots on the copy stream (the read of one beside the copy of the one before), the
  // layer's table of pointers takes their slots, and the expert kernels run once the copies are
  // in. Each run is the resident path's kernels over its rows (the step's choice of decode or
  // grouped kernels and of bf16 activations), so every row's result is the resident one's.
  void CachedMoe(const MoeFeedForwardParams& p, bool bf16) {
    CHECK(expert_slots_ != nullptr);
    const int experts = p.experts, k = p.top_k;
    if (experts > cuda::kMoeMaxExperts || k > expert_slots_->slots()) {
      std::fprintf(stderr, "cuda MoeFeedForward: top %d of %d experts over %lld cache slots\n", k,
                   experts, static_cast<long long>(expert_slots_->slots()));
      std::abort();
    }
    cuda::MoeDevice d = MoeBuffers(p);
    CachedTable& table = CachedTableOf(p);
    d.table = static_cast<const void* const*>(table.device);
    d.aligned = true;  // slots and their parts lie on kSlotAlign bytes
    cuda::LaunchMoeRoute(p, d, sm_count_, stream_);
    const size_t picks = static_cast<size_t>(p.rows) * k;
    if (cache_.ids_capacity < picks) {
      if (cache_.ids) GZ_CUDA_CHECK(cudaFreeHost(cache_.ids));
      GZ_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&cache_.ids), picks * sizeof(int),
                                  cudaHostAllocDefault));
      cache_.ids_capacity = picks;
    }
    GZ_CUDA_CHECK(
        cudaMemcpyAsync(cache_.ids, d.ids, picks * sizeof(int), cudaMemcpyDeviceToHost, stream_));
    GZ_CUDA_CHECK(cudaEventRecord(cache_.ids_ready, stream_));
    // The copy stream writes slots only after every op before the routing read them.
    GZ_CUDA_CHECK(cudaStreamWaitEvent(cache_.copy, cache_.ids_ready, 0));
    SharedOut shared;
    if (p.shared_ffn > 0) shared = SharedExpert(p);
    GZ_CUDA_CHECK(cudaEventSynchronize(cache_.ids_ready));
    const bool decode = p.rows <= cuda::kMoeDecodeRows;
    const int64_t slots = expert_slots_->slots();
    std::vector<char> in_run(experts);
    for (int64_t r0 = 0; r0 < p.rows;) {
      // The run: rows from r0 while their experts fit the slots together.
      std::fill(in_run.begin(), in_run.end(), 0);
      int64_t distinct = 0, r1 = r0;
      for (; r1 < p.rows; ++r1) {
        int64_t added = 0;
        for (int j = 0; j < k; ++j) added += !in_run[cache_.ids[r1 * k + j]];
        if (distinct + added > slots) break;
        for (int j = 0; j < k; ++j) {
          const int e = cache_.ids[r1 * k + j];
          distinct += !in_run[e];
          in_run[e] = 1;
        }
      }
      expert_slots_->Begin();
      bool missed = false;
      for (int e = 0; e < experts; ++e) {
        if (!in_run[e]) continue;
        const auto place = expert_slots_->Acquire(reinterpret_cast<uintptr_t>(&p.gate[e]));
        CHECK(place.has_value());
        if (!place->hit) {
          ReadExpert(p, e, place->slot, &table);
          missed = true;
        }
      }
      if (missed) {
        GZ_CUDA_CHECK(cudaEventRecord(cache_.filled, cache_.copy));
        GZ_CUDA_CHECK(cudaStreamWaitEvent(stream_, cache_.filled, 0));
        GZ_CUDA_CHECK(cudaMemcpyAsync(table.device, table.host.data(),
                                      table.host.size() * sizeof(void*), cudaMemcpyHostToDevice,
                                      stream_));
      }
      MoeFeedForwardParams run = p;
      run.x = p.x + r0 * p.dim;
      run.out = p.out + r0 * p.dim;
      run.rows = r1 - r0;
      cuda::MoeDevice run_d = d;
      run_d.ids = d.ids + r0 * k;
      run_d.weights = d.weights + r0 * k;
      cuda::LaunchMoeExperts(run, run_d, bf16, decode, stream_);
      if (r1 < p.rows) {
        // The next run's reads may evict this run's experts: its copies wait for its kernels.
        GZ_CUDA_CHECK(cudaEventRecord(cache_.run_done, stream_));
        GZ_CUDA_CHECK(cudaStreamWaitEvent(cache_.copy, cache_.run_done, 0));
      }
      r0 = r1;
    }
    if (p.shared_ffn > 0) SharedExpertAdd(p, shared);
  }

  // Reads expert e of p (its host weights) into slot `slot` through the next staging buffer and
  // points the layer's table at it.
  void ReadExpert(const MoeFeedForwardParams& p, int e, int32_t slot, CachedTable* table) {
    const auto start = std::chrono::steady_clock::now();
    ExpertCacheState::Staging& st = cache_.staging[cache_.next_staging];
    cache_.next_staging = (cache_.next_staging + 1) % ExpertCacheState::kStaging;
    GZ_CUDA_CHECK(cudaEventSynchronize(st.done));  // its last copy is out
    uint8_t* device = static_cast<uint8_t*>(cache_.slots) + slot * cache_.slot_bytes;
    const Weight* w[3] = {&p.gate[e], &p.up[e], &p.down[e]};
    int64_t offset = 0;
    for (int m = 0; m < 3; ++m) {
      CheckExpertFormat(p, e, *w[m], m);
      uint8_t* staged = st.host + offset;
      Weight placed = *w[m];
      if (quant::IsQuantized(w[m]->format)) {
        cuda::PackQuantWeight(*w[m], staged);
        placed = cuda::QuantDeviceWeight(*w[m], device + offset);
      } else {
        CopyOnThreads(staged, w[m]->data, static_cast<size_t>(w[m]->Bytes()));
        placed.data = device + offset;
        placed.scales = nullptr;
      }
      table->host[m * p.experts + e] = placed.data;
      table->host[(3 + m) * p.experts + e] = placed.scales;
      offset += SlotPart(*w[m]);
    }
    CHECK(offset <= cache_.slot_bytes);
    GZ_CUDA_CHECK(cudaMemcpyAsync(device, st.host, static_cast<size_t>(offset),
                                  cudaMemcpyHostToDevice, cache_.copy));
    GZ_CUDA_CHECK(cudaEventRecord(st.done, cache_.copy));
    cache_.read_ms +=
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  }

  CachedTable& CachedTableOf(const MoeFeedForwardParams& p) {
    auto it = cached_tables_.find(p.gate);
    if (it != cached_tables_.end()) return it->second;
    CachedTable t;
    t.host.assign(6 * static_cast<size_t>(p.experts), nullptr);
    GZ_CUDA_CHECK(cudaMalloc(&t.device, t.host.size() * sizeof(void*)));
    GZ_CUDA_CHECK(cudaMemsetAsync(t.device, 0, t.host.size() * sizeof(void*), stream_));
    return cached_tables_.emplace(p.gate, std::move(t)).first->second;
  }

  void FreeExpertCache() {
    for (auto& [gate, t] : cached_tables_) cudaFree(t.device);
    if (!expert_slots_) return;
    cudaStreamSynchronize(cache_.copy);
    for (ExpertCacheState::Staging& st : cache_.staging) {
      cudaFreeHost(st.host);
      cudaEventDestroy(st.done);
    }
    if (cache_.ids) cudaFreeHost(cache_.ids);
    cudaEventDestroy(cache_.ids_ready);
    cudaEventDestroy(cache_.filled);
    cudaEventDestroy(cache_.run_done);
    cudaStreamDestroy(cache_.copy);
    cudaFree(cache_.slots);
  }

  // The fp16 keys and values the last RopeKv wrote, for the Attention right after it over the
  // same rows and layer (rows 0: none). Any other KV op forgets them.
  struct StepKv {
    int64_t rows = 0;
    const void* keys = nullptr;  // the layer's cache (which layer)
    const int32_t* slots = nullptr;
    const int32_t* positions = nullptr;
    void* k16 = nullptr;  // [rows, kv_heads, head_dim] fp16
    void* v16 = nullptr;
  };

  // A bf16 copy of the float32 activations at `of` ([n]) the last op left, for a fast-mode
  // Matmul right after it that reads them (no conversion).
  struct Bf16Copy {
    const float* of = nullptr;
    int64_t n = 0;
    const void* data = nullptr;
  };

  // Each op's first line: where tracing and outermost (OpScope), an event at the op's start.
  [[nodiscard]] OpScope Trace(const char* op) {
    if (op_trace_ && op_depth_ == 0) NoteOp(op);
    return OpScope(&op_depth_);
  }
  void NoteOp(const char* op) {
    if (op_events_used_ == op_events_.size()) {
      cudaEvent_t e;
      GZ_CUDA_CHECK(cudaEventCreate(&e));
      op_events_.push_back(e);
      op_names_.push_back(nullptr);
    }
    op_names_[op_events_used_] = op;
    GZ_CUDA_CHECK(cudaEventRecord(op_events_[op_events_used_++], stream_));
  }

  // Every op calls this first (after reading the hand-off it may take): a StepKv or Bf16Copy
  // holds only from one op to the very next.
  void ForgetHandOffs() {
    step_kv_.rows = 0;
    bf16_copy_.of = nullptr;
  }

  struct RecordedStep {
    cudaGraphExec_t exec = nullptr;
    uint64_t last_use = 0;
  };

  CudaOptions options_;
  cudaStream_t stream_;
  cublasLtHandle_t lt_;
  std::string name_;
  int sm_count_;
  int gemv_max_rows_;
  std::map<uint64_t, RecordedStep> graphs_;
  bool capturing_ = false;
  // CopyToDevice's pinned staging: two halves used in turn. A half is written again only after
  // the copies issued from it ran (its event, recorded when the other half took over).
  static constexpr size_t kStagingHalf = size_t{2} << 20;
  static constexpr size_t kStagedMost = size_t{256} << 10;
  struct Staging {
    uint8_t* host = nullptr;
    cudaEvent_t done = nullptr;
  };
  Staging staging_[2];
  int staging_half_ = 0;
  size_t staging_used_ = 0;
  bool staging_failed_ = false;
  // A copy of `bytes` bytes of `src` in the staging, or null (no pinned memory: copy directly).
  void* Stage(const void* src, size_t bytes) {
    if (staging_failed_) return nullptr;
    if (!staging_[0].host) {
      void* host = nullptr;
      if (cudaHostAlloc(&host, 2 * kStagingHalf, cudaHostAllocDefault) != cudaSuccess ||
          cudaEventCreateWithFlags(&staging_[0].done, cudaEventDisableTiming) != cudaSuccess ||
          cudaEventCreateWithFlags(&staging_[1].done, cudaEventDisableTiming) != cudaSuccess) {
        cudaGetLastError();
        if (host) cudaFreeHost(host);
        staging_failed_ = true;
        return nullptr;
      }
      staging_[0].host = static_cast<uint8_t*>(host);
      staging_[1].host = staging_[0].host + kStagingHalf;
    }
    if (staging_used_ + bytes > kStagingHalf) {
      GZ_CUDA_CHECK(cudaEventRecord(staging_[staging_half_].done, stream_));
      staging_half_ ^= 1;
      GZ_CUDA_CHECK(cudaEventSynchronize(staging_[staging_half_].done));
      staging_used_ = 0;
    }
    uint8_t* at = staging_[staging_half_].host + staging_used_;
    std::memcpy(at, src, bytes);
    staging_used_ += (bytes + 255) / 256 * 256;
    return at;
  }
  uint64_t capture_key_ = 0;
  uint64_t use_clock_ = 0;
  void* workspace_ = nullptr;
  static constexpr int kSides = MatmulParams::kMaxOutputs - 1;
  static constexpr int64_t kForkRows = 256;
  cudaStream_t side_[kSides] = {};
  cudaEvent_t fork_ = nullptr, join_[kSides] = {};
  void* side_workspace_[kSides] = {};
  std::map<std::tuple<int64_t, int64_t, int64_t, bool>, LtPlan> plans_;  // rows, n, cols, bias
  // The algorithm chosen for a rounded row count (Plan), or none where the heuristic had none.
  std::map<std::tuple<int64_t, int64_t, int64_t, bool>, std::optional<cublasLtMatmulAlgo_t>>
      bucket_algos_;
  cuda::Scratch x_bf16_;             // [rows, cols] bf16 activations of a fast-mode matmul
  cuda::Scratch normed_x_;           // [rows, cols] the normalized x of a matmul with a norm
  cuda::Scratch quant_out_;          // [rows, n] a quantized product that is then added
  cuda::Scratch attention_scratch_;  // the decode kernel's split parts
  cuda::Scratch delta_rule_scratch_;  // the chunk-parallel delta rule's scratch
  cuda::Scratch step_kv16_;          // StepKv's k16 and v16
  StepKv step_kv_;
  cuda::Scratch ffn_bf16_;        // Bf16Copy's data after a SwiGLU
  cuda::Scratch attention_bf16_;  // Bf16Copy's data after an EncoderAttention
  cuda::Scratch encoder_kv16_;    // the fast EncoderAttention's fp16 keys and values
  Bf16Copy bf16_copy_;
  cuda::QuantScratch quant_scratch_;  // activations of quantized matmuls
  cuda::Scratch quant_x_bf16_;        // [rows, cols] rotated bf16 activations (QuantGemm)
  cuda::Scratch quant_w_bf16_;        // [n, cols] a quantized weight as bf16 (QuantGemm)
  // SetOpTrace: an event at each op's start (op_names_ beside), summed in TakeOpTrace.
  bool op_trace_ = false;
  int op_depth_ = 0;
  std::vector<cudaEvent_t> op_events_;
  std::vector<const char*> op_names_;
  size_t op_events_used_ = 0;
  OpTotals op_totals_;
  // MoeFeedForward: each set of experts' pointer table (by the pointers), the upload stream,
  // the op's scratch (MoeSizes).
  std::map<std::vector<const void*>, void*> moe_tables_;
  cudaStream_t upload_ = nullptr;
  struct MoeScratch {
    cuda::Scratch logits, ids, weights, hidden, outputs, sorted, slot_pos, tiles, tile_count,
        rotated;
    cuda::Scratch shared_gate, shared_up, shared_out, shared_scale;  // SharedExpert
  };
  MoeScratch moe_;
  // The expert cache (ReserveExpertCache; null: every expert placed): its slot policy, its
  // device slots, streams, staging and counts, and each layer's table into the slots.
  std::unique_ptr<ExpertSlots> expert_slots_;
  struct ExpertCacheState {
    void* slots = nullptr;  // [slots, slot_bytes]
    int64_t slot_bytes = 0;
    cudaStream_t copy = nullptr;  // the slots' copies
    static constexpr int kStaging = 4;
    struct Staging {
      uint8_t* host = nullptr;     // [slot_bytes] pinned
      cudaEvent_t done = nullptr;  // its last copy to a slot is out
    };
    Staging staging[kStaging];
    int next_staging = 0;
    int* ids = nullptr;  // [ids_capacity] pinned: the routing's picks
    size_t ids_capacity = 0;
    cudaEvent_t ids_ready = nullptr, filled = nullptr, run_done = nullptr;
    double read_ms = 0.0;
  };
  ExpertCacheState cache_;
  std::map<const Weight*, CachedTable> cached_tables_;
};

}  // namespace

Status CudaOptions::Check() const {
  if (device < 0) return InvalidArgument("cuda: device index must not be negative");
  if (gemv_max_rows < -1)
    return InvalidArgument("cuda: gemv_max_rows must be -1 (by mode) or at least 0");
  if (max_graphs < 0) return InvalidArgument("cuda: max_graphs must not be negative");
  return Status::Ok();
}

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

Expected<std::unique_ptr<Backend>> MakeCudaBackend(const CudaOptions& options) {
  GZ_RETURN_IF_ERROR(options.Check());
  int count = CudaDeviceCount();
  if (count == 0) return NotFound("cuda: no CUDA device or driver found");
  if (options.device >= count)
    return InvalidArgument("cuda: device " + std::to_string(options.device) + " requested, " +
                           std::to_string(count) + " found");
  cudaError_t err = cudaSetDevice(options.device);
  cudaDeviceProp prop;
  if (err == cudaSuccess) err = cudaGetDeviceProperties(&prop, options.device);
  cudaStream_t stream = nullptr;
  if (err == cudaSuccess) err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return Internal(std::string("cuda: cannot start device: ") + cudaGetErrorString(err));
  }
  cublasLtHandle_t lt = nullptr;
  if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) {
    cudaStreamDestroy(stream);
    return Internal("cuda: cannot create a cuBLASLt handle");
  }
  return std::unique_ptr<Backend>(new CudaBackend(options, stream, lt, prop));
}

}  // namespace gizllm
