// The ops every backend provides. The forward pass (model/) is written once against this
// interface; backend/cpu and backend/cuda implement it. Pointers in the params are device
// pointers of the backend that runs them (host pointers for the CPU backend).
//
// Activations are float32 ([rows, ...], row-major, contiguous) unless a params struct says
// otherwise. Every params struct has Check(), which returns a Status naming the bad field.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "core/status.h"
#include "ops/weight.h"

namespace gizllm {

enum class DeviceKind { kCpu, kCuda };

// Positions a KV page holds, for every attention layer.
inline constexpr int kPage = 16;

// out[r, :] = table[tokens[r], :] * scale, as float32 (Gemma scales by sqrt(dim)).
struct EmbedParams {
  float* out = nullptr;             // [rows, dim]
  const Weight* table = nullptr;    // [vocab, dim], plain format
  const int32_t* tokens = nullptr;  // [rows], each in [0, vocab)
  int64_t rows = 0;
  float scale = 1.0f;
  Status Check() const;
};

// out = x * rsqrt(mean(x^2) + eps) * (weight + offset); with `residual` set, first
// residual += x and then normalizes the sum (the fused residual add), out may equal x.
struct RmsNormParams {
  float* out = nullptr;           // [rows, dim]
  const float* x = nullptr;       // [rows, dim]
  float* residual = nullptr;      // [rows, dim] or null
  const float* weight = nullptr;  // [dim]
  int64_t rows = 0;
  int64_t dim = 0;
  float eps = 1e-6f;
  float offset = 0.0f;  // 1.0 for Gemma's (1 + w) norms
  Status Check() const;
};

// Up to three linears that share one input (q/k/v, gate/up): out_i = x W_i^T (+ bias_i).
//
// The fused ends, only for a backend whose FusesMatmul() is true (the model issues RmsNorm, Add
// and SwiGlu ops to the others; swiglu alone also where FusesSwiGlu() is):
// - norm: x is first RMS-normalized per row with this weight (RmsNormParams without residual);
// - accumulate (one output): out += x W^T (+ bias), the residual add; out must not alias x;
// - swiglu (two outputs of the same n): out[0] = silu(x W_0^T + b_0) * (x W_1^T + b_1); out[1]
//   is scratch, its contents afterwards unspecified.
struct MatmulParams {
  static constexpr int kMaxOutputs = 3;
  const float* x = nullptr;  // [rows, cols]
  int64_t rows = 0;
  int outputs = 1;
  const Weight* w[kMaxOutputs] = {};    // each [n_i, cols]
  float* out[kMaxOutputs] = {};         // each [rows, n_i]
  const float* bias[kMaxOutputs] = {};  // each [n_i] or null
  const float* norm = nullptr;          // [cols] or null
  float norm_eps = 1e-6f;
  float norm_offset = 0.0f;
  bool accumulate = false;
  bool swiglu = false;
  Status Check() const;
};

// Per head: optional RMSNorm over head_dim (q/k norms), then rotary embedding of the first
// rotary_dims of each head, rotate-half (NeoX/HF) pairing: (i, i + rotary_dims/2).
struct RopeParams {
  float* x = nullptr;  // [rows, heads, head_dim], in place
  int64_t rows = 0;
  int heads = 0;
  int head_dim = 0;
  int rotary_dims = 0;                 // even, <= head_dim
  const int32_t* positions = nullptr;  // [rows] rotary position of each row
  const float* inv_freq = nullptr;     // [rotary_dims / 2]
  const float* norm = nullptr;         // [head_dim] or null: RMSNorm weight before rotary
  float norm_eps = 1e-6f;
  Status Check() const;
};

// The element type of the KV pages: float32; float16 (half the bytes; every key and value
// rounded to the nearest float16 as it is written); or 8-bit integers (a quarter of the bytes
// and a float32 scale per position and kv head: each key or value vector x of head_dim is
// stored as round(x * 127 / max|x|), with scale max|x| / 127).
enum class KvFormat : uint8_t { kF32, kF16, kQ8 };
int KvFormatBytes(KvFormat f);         // bytes of one element
int KvFormatScaleBytes(KvFormat f);    // bytes of the scale of one position's kv head (0: none)
std::string KvFormatName(KvFormat f);  // "f32", "f16", "q8"
bool ParseKvFormat(std::string_view name, KvFormat* out);

// The KV cache of one attention layer: pages of kPage positions.
struct KvLayer {
  void* keys = nullptr;    // [pages, kPage, kv_heads, head_dim] of `format`
  void* values = nullptr;  // [pages, kPage, kv_heads, head_dim] of `format`
  KvFormat format = KvFormat::kF32;
  float* key_scales = nullptr;    // kQ8: [pages, kPage, kv_heads]
  float* value_scales = nullptr;  // kQ8: [pages, kPage, kv_heads]
  float* keys_f32() const { return static_cast<float*>(keys); }
  float* values_f32() const { return static_cast<float*>(values); }
};

// Which page holds each position of each slot.
struct PageTable {
  const int32_t* pages = nullptr;  // [slots, max_pages]: page index of block p of a slot
  int32_t max_pages = 0;           // columns of `pages`
};

// Writes each row's key and value at its slot's position.
struct KvWriteParams {
  KvLayer cache;
  PageTable table;
  const float* k = nullptr;            // [rows, kv_heads, head_dim]
  const float* v = nullptr;            // [rows, kv_heads, head_dim]
  const int32_t* slots = nullptr;      // [rows]
  const int32_t* positions = nullptr;  // [rows] KV position
  int64_t rows = 0;
  int kv_heads = 0;
  int head_dim = 0;
  Status Check() const;
};

// Causal grouped-query attention over KV pages: row r attends to positions
// [max(0, positions[r] - window + 1), positions[r]] of its slot (window 0: no limit).
// Its own key must already be written. A score is scale * q.k, then, with softcap > 0,
// softcap * tanh(score / softcap) (Gemma 2's attention soft-capping), then the softmax.
struct AttentionParams {
  float* out = nullptr;      // [rows, heads, head_dim]
  const float* q = nullptr;  // [rows, heads, head_dim]
  KvLayer cache;
  PageTable table;
  const int32_t* slots = nullptr;      // [rows]
  const int32_t* positions = nullptr;  // [rows] KV position of the row's query
  int64_t rows = 0;
  int heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  float scale = 0.0f;  // usually 1/sqrt(head_dim)
  int32_t window = 0;
  float softcap = 0.0f;  // 0: off
  Status Check() const;
};

// Rope(q), Rope(k) and KvWrite(kv) as one op: the query and key heads rotated (each with its
// optional norm) and the rotated keys and the values written at each row's position.
// k.x must be kv.k; the three agree on rows.
struct RopeKvParams {
  RopeParams q;
  RopeParams k;
  KvWriteParams kv;
  Status Check() const;
};

// The activation of a gated linear unit's gate.
enum class Activation : uint8_t {
  kSilu,      // x * sigmoid(x): SwiGLU (Llama, Qwen)
  kGeluTanh,  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): GeGLU (Gemma's gelu_pytorch_tanh)
};

// out = act(gate) * up, elementwise.
struct GluParams {
  float* out = nullptr;         // [n]
  const float* gate = nullptr;  // [n]
  const float* up = nullptr;    // [n]
  int64_t n = 0;
  Activation act = Activation::kSilu;
  Status Check() const;
};

// x = cap * tanh(x / cap), elementwise in place (Gemma 2's final-logit soft-capping).
struct SoftcapParams {
  float* x = nullptr;  // [n]
  int64_t n = 0;
  float cap = 0.0f;  // positive
  Status Check() const;
};

// out += x, elementwise.
struct AddParams {
  float* out = nullptr;      // [n]
  const float* x = nullptr;  // [n]
  int64_t n = 0;
  Status Check() const;
};

// out[i, :] = x[index[i], :].
struct GatherRowsParams {
  float* out = nullptr;            // [count, dim]
  const float* x = nullptr;        // [rows, dim]
  const int32_t* index = nullptr;  // [count]
  int64_t count = 0;
  int64_t dim = 0;
  Status Check() const;
};

// A mixture-of-experts feed-forward (model/arch.h MoeSpec), one op: per row, router logits
// x R^T, their softmax in float32, the top_k experts of the largest probabilities (the lowest
// index first among equals), their probabilities divided by their sum when norm_topk_prob; then
// out = sum over the picked experts e of p_e * down_e(silu(gate_e(x)) * up_e(x)), summed in
// the order of the expert indices (as transformers' index_add_), or out += that sum with
// `accumulate`. The weights are plain or as PrepareWeight made them; out must not alias x.
struct MoeFeedForwardParams {
  float* out = nullptr;      // [rows, dim]
  const float* x = nullptr;  // [rows, dim], the normalized input
  int64_t rows = 0;
  int64_t dim = 0;
  int64_t ffn = 0;  // each expert's width
  int experts = 0;
  int top_k = 0;  // experts per row, in [1, experts]
  bool norm_topk_prob = false;
  bool accumulate = false;
  const Weight* router = nullptr;  // [experts, dim]
  const Weight* gate = nullptr;    // host array of `experts` weights, each [ffn, dim]
  const Weight* up = nullptr;      // host array of `experts` weights, each [ffn, dim]
  const Weight* down = nullptr;    // host array of `experts` weights, each [dim, ffn]
  Status Check() const;
};

// How one row's token is picked on the device: sampling/sampling.h's steps 3 to 5 (temperature,
// min-p, top-k, top-p, the counter-based draw), for requests without penalties or logprobs.
struct SampleRow {
  float temperature = 0.0f;  // 0: the largest logit, lowest id among equals
  int32_t top_k = 0;         // 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
  uint64_t seed = 0;
  uint64_t index = 0;  // the draw's counter: output tokens so far
};

// The token a picker gives a row of logits that holds a NaN or +inf, or no finite value (the host
// Sampler and Backend::Sample alike; -inf alone marks a token as excluded): no token is right
// there; the model's weights hold non-finite values or its activations overflowed.
inline constexpr int32_t kNonFiniteToken = -1;

// tokens[r] = the token row r of `logits` picks under params[r], or kNonFiniteToken.
struct SampleParams {
  int32_t* tokens = nullptr;          // [rows]
  const float* logits = nullptr;      // [rows, vocab]
  const SampleRow* params = nullptr;  // [rows], device memory
  int64_t rows = 0;
  int64_t vocab = 0;
  Status Check() const;
};

// Device memory of a backend, freed by its destructor.
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual void* data() = 0;
  virtual size_t bytes() const = 0;
  template <typename T>
  T* as() {
    return static_cast<T*>(data());
  }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual DeviceKind kind() const = 0;
  virtual std::string Describe() const = 0;  // "cpu (2 threads, avx512)" / "cuda (NVIDIA H200)"

  // Memory. Buffers are zero-filled on allocation.
  virtual Expected<std::unique_ptr<Buffer>> Allocate(size_t bytes) = 0;
  virtual void CopyToDevice(void* dst, const void* src, size_t bytes) = 0;
  virtual void CopyToHost(void* dst, const void* src, size_t bytes) = 0;
  // Makes a host weight (e.g. a pointer into a memory-mapped file) usable by this backend;
  // `storage` receives whatever must stay alive (null where the host memory is used in place).
  virtual Expected<Weight> PrepareWeight(const Weight& host, std::unique_ptr<Buffer>* storage) = 0;

  // Whether Attention has a kernel for this head shape; a model checks it when it loads, so a
  // shape without one fails with a Status instead of stopping inside the op.
  virtual Status CheckAttentionShape(int heads, int kv_heads, int head_dim) const {
    (void)heads, (void)kv_heads, (void)head_dim;
    return Status::Ok();
  }

  // Whether KvWrite, RopeKv and Attention take pages of this format; a model checks it when it
  // loads.
  virtual bool SupportsKvFormat(KvFormat f) const { return f == KvFormat::kF32; }

  // Ops; each runs after the ones issued before it. Params must pass Check().
  virtual void Embed(const EmbedParams& p) = 0;
  virtual void RmsNorm(const RmsNormParams& p) = 0;
  virtual void Matmul(const MatmulParams& p) = 0;
  virtual void Rope(const RopeParams& p) = 0;
  virtual void KvWrite(const KvWriteParams& p) = 0;
  virtual void Attention(const AttentionParams& p) = 0;
  virtual void Glu(const GluParams& p) = 0;
  virtual void Softcap(const SoftcapParams& p) = 0;
  virtual void Add(const AddParams& p) = 0;
  virtual void GatherRows(const GatherRowsParams& p) = 0;
  virtual void RopeKv(const RopeKvParams& p) {
    Rope(p.q);
    Rope(p.k);
    KvWrite(p.kv);
  }
  // Whether Matmul runs MatmulParams' fused ends (norm, accumulate, swiglu; swiglu is the
  // kSilu gate only: a GeGLU is a Matmul and a Glu op).
  virtual bool FusesMatmul() const { return false; }
  // Whether Matmul runs the swiglu end, also where FusesMatmul() is false (the model then issues
  // RmsNorm and Add, and no Glu op for a SwiGLU).
  virtual bool FusesSwiGlu() const { return FusesMatmul(); }

  // Whether MoeFeedForward runs; a model with mixture-of-experts layers checks it when it loads
  // and refuses a backend without it. The default op is never reached.
  virtual bool SupportsMoe() const { return false; }
  // Whether MoeFeedForward runs a mixture of `experts` experts, top_k a row (a backend whose
  // kernels have limits refuses the rest); checked with SupportsMoe when a model loads.
  virtual Status CheckMoeShape(int experts, int top_k) const {
    (void)experts;
    (void)top_k;
    return Status::Ok();
  }
  virtual void MoeFeedForward(const MoeFeedForwardParams& p) { (void)p; }

  // Token picking on the device; a backend without it (CanSample false) leaves it to the host.
  virtual bool CanSample() const { return false; }
  virtual void Sample(const SampleParams& p) { (void)p; }

  // Waits until every issued op has finished.
  virtual void Synchronize() = 0;

  // Recorded steps (CUDA graphs). A caller whose op issue is the same for a key (the same ops
  // with the same params: rows, wanted rows, page-table width and buffers; only the contents of
  // device memory differ) calls ReplayStep(key) and, where it returns false, issues the ops
  // between BeginStep(key) and EndStep(), which records them and runs them. Between the two,
  // nothing may copy to or from the host or synchronize. The defaults record nothing.
  virtual bool ReplayStep(uint64_t key) {
    (void)key;
    return false;
  }
  virtual void BeginStep(uint64_t key) { (void)key; }
  virtual void EndStep() {}
};

}  // namespace gizllm
