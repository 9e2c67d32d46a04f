// The ops every backend provides. The forward pass (model/) is written once against this
// interface; backend/cpu and backend/cuda implement it. Pointers in the params are device
// pointers of the backend that runs them (host pointers for the CPU backend).
//
// Activations are float32 ([rows, ...], row-major, contiguous) unless a params struct says
// otherwise. Every params struct has Check(), which returns a Status naming the bad field.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "ops/expert_cache.h"
#include "ops/op_trace.h"
#include "ops/weight.h"

namespace gizllm {

enum class DeviceKind { kCpu, kCuda };
class Backend;

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

// The KV pages' format. Float32; float16 (half the bytes; every key and value rounded to the
// nearest float16 as it is written, saturated at +-65504); q8 (8-bit integers, a quarter of the
// bytes and a float32 scale per position and kv head: each key or value vector x of head_dim is
// stored as round(x * 127 / max|x|), with scale max|x| / 127); or rotated codes (RotatedKv: keys
// and values each of 8, 4 or 2 bits, ops/kv_codes.h: each vector rotated by blocks of a
// Hadamard transform, then each group of 32 elements stored as codes of 2^bits levels (even steps
// at 8 and 2 bits, a Gaussian's Lloyd-Max levels at 4) with a step and min of its own).
//
// The rotated formats are the enumerators RotatedKv(keys, values) makes (not named here).
enum class KvFormat : uint8_t { kF32 = 0, kF16 = 1, kQ8 = 2 };
inline constexpr uint8_t kRotatedKvBase = 0x40;
// The rotated pages of `key_bits` keys and `value_bits` values, each 8, 4 or 2.
constexpr KvFormat RotatedKv(int key_bits, int value_bits) {
  return static_cast<KvFormat>(kRotatedKvBase + 16 * key_bits + value_bits);
}
constexpr bool IsRotatedKv(KvFormat f) { return static_cast<uint8_t>(f) >= kRotatedKvBase; }
// Bits of one stored key and value: 32, 16, 8 (q8 too), 4 or 2.
constexpr int KvKeyBits(KvFormat f) {
  return IsRotatedKv(f)        ? (static_cast<uint8_t>(f) - kRotatedKvBase) / 16
         : f == KvFormat::kF32 ? 32
         : f == KvFormat::kF16 ? 16
                               : 8;
}
constexpr int KvValueBits(KvFormat f) {
  return IsRotatedKv(f) ? (static_cast<uint8_t>(f) - kRotatedKvBase) % 16 : KvKeyBits(f);
}
// Every format, widest first: f32, f16, q8, then the rotated ones by key bits, then value bits.
std::vector<KvFormat> AllKvFormats();
// Bytes of one element of the f32, f16 and q8 pages (the rotated ones pack their codes: below).
int KvFormatBytes(KvFormat f);
// Bytes of one position's key (or value) vector of one kv head, without its scales.
int64_t KvKeyBytes(KvFormat f, int head_dim);
int64_t KvValueBytes(KvFormat f, int head_dim);
// Bytes of the scales of one position's key (or value) vector of one kv head: 4 (q8: the
// scale), 8 per code group (rotated: the step and the range's low end, float32 each, per
// kv::GroupSize channels) or 0.
int KvFormatScaleBytes(KvFormat f, int head_dim);
// "f32", "f16", "q8"; rotated: "8", "4", "2" when keys and values agree, else "8/4".
std::string KvFormatName(KvFormat f);

// What `--kv` names: the bits of each stored key and of each stored value (32, 16, 8, 4 or 2;
// "8/4": 8-bit keys and 4-bit values; "f32" and "f16" are 32 and 16, "q8" is 8: the rotated 8-bit
// pages measure better than KvFormat::kQ8's unrotated codes, bench/RESULTS.md "Rotated KV pages",
// so the name stands for them).
struct KvBits {
  int keys = 16;
  int values = 16;
};
// "32", "16", "8", "4", "2", "K/V" of those, "f32", "f16", "q8"; anything else is an error
// naming the flag and what it takes.
Expected<KvBits> ParseKvBits(std::string_view text);
// The page format that stores `bits`, or none (keys and values of different bits where either is
// 16 or 32: no pages mix floats and codes).
std::optional<KvFormat> KvFormatOf(KvBits bits);

// What the automatic choice fits the KV pages to: the budget, the slots and the context each slot
// may fill, and the bytes one position of every attention layer takes in a format.
struct KvFit {
  int64_t budget_bytes = 0;
  int32_t slots = 0;
  int64_t context = 0;
  std::function<int64_t(KvFormat)> position_bytes;
};
// The automatic choice among `candidates` (widest first; the ones a backend takes, up to its
// default): the first of more than 4 bits (keys and values) in which every slot's whole context
// fits in the budget; else the first of 4 bits or fewer in which one whole context fits; else the
// smallest.
KvFormat AutoKvFormat(const std::vector<KvFormat>& candidates, const KvFit& fit);

// The KV pages `--kv text` gives on `backend`. "auto": its DefaultKvFormat(), or with `fit`,
// AutoKvFormat over the formats it takes from its default down. A format it has no kernels for
// is an error naming the flag, the device and the formats it takes.
Expected<KvFormat> ChooseKvFormat(std::string_view text, const Backend& backend,
                                  const KvFit* fit = nullptr);

// The KV cache of one attention layer: pages of kPage positions.
struct KvLayer {
  // [pages, kPage, kv_heads, head_dim] of `format` (rotated: [pages, kPage, kv_heads,
  // KvKeyBytes(format, head_dim)] bytes of packed codes, ops/kv_codes.h).
  void* keys = nullptr;
  void* values = nullptr;  // as keys, of KvValueBytes
  KvFormat format = KvFormat::kF32;
  // kQ8: [pages, kPage, kv_heads]; rotated: [pages, kPage, kv_heads, kv::Groups(head_dim), 2]
  // (step, min).
  float* key_scales = nullptr;
  float* value_scales = nullptr;  // as key_scales
  float* keys_f32() const { return static_cast<float*>(keys); }
  float* values_f32() const { return static_cast<float*>(values); }
};

// Which page holds each position of each slot. A window layer's table (window paging,
// model/runner.h KvPaging) holds -1 for the blocks wholly before the window of the slot's
// earliest row in the step: attention reads a slot's keys from that window's start on, and a
// row's key and value are written into its own block, so no op reads such a hole.
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
// softcap * tanh(score / softcap) (Gemma 2's attention soft-capping), then the softmax. Over
// rotated pages the op rotates each query head as the keys were (an orthogonal map, so q.k is
// kept) and rotates the weighted sum of the values back: q and out are as over float pages.
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
  kSigmoid,   // 1 / (1 + exp(-x)): an output gate (Qwen3-Next's attention), not a feed-forward's
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
// the order of the expert indices (as transformers' index_add_); with a shared expert (Qwen2-MoE,
// Qwen3-Next), then + sigmoid(x G^T) * down_s(silu(gate_s(x)) * up_s(x)) (G: shared_expert_gate,
// [1, dim]; without it, the shared expert ungated); out = that, or out += that with
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
  const Weight* router = nullptr;        // [experts, dim]
  const Weight* gate = nullptr;          // host array of `experts` weights, each [ffn, dim]
  const Weight* up = nullptr;            // host array of `experts` weights, each [ffn, dim]
  const Weight* down = nullptr;          // host array of `experts` weights, each [dim, ffn]
  int64_t shared_ffn = 0;                // the shared expert's width (0: none)
  const Weight* shared_gate = nullptr;   // [shared_ffn, dim]
  const Weight* shared_up = nullptr;     // [shared_ffn, dim]
  const Weight* shared_down = nullptr;   // [dim, shared_ffn]
  const Weight* shared_scale = nullptr;  // [1, dim] (shared_expert_gate) or null: ungated
  // gate, up and down are host weights (the memory-mapped file, as the loader read them) that
  // the backend reads into its expert cache as the routing picks them (ReserveExpertCache);
  // else every expert is placed. The router, the shared expert and out stay the backend's.
  bool cached = false;
  Status Check() const;
};

// The recurrent (linear-attention) layers of Qwen3-Next and Qwen3.5. Their ops read a slot's
// state, [slots, ...] in device memory, and carry it across steps: the rows of one slot must be
// adjacent, at consecutive increasing positions, and a row at position p > 0 continues the
// state the slot's row at p - 1 left; a row at position 0 starts from a zero state.

// Causal depthwise convolution over each slot's inputs, then SiLU, in place: for channel c of
// the row at position t, x = silu(sum over j < kernel of weight[c, j] * in[t - kernel + 1 + j])
// where in[s] is the slot's input at position s (zero before 0). The slot's state holds its
// last kernel - 1 inputs, oldest first, and is updated.
struct CausalConvParams {
  float* x = nullptr;  // row r's channels at x + r * row_stride, in place
  int64_t rows = 0;
  int64_t channels = 0;
  int64_t row_stride = 0;              // floats, >= channels
  int kernel = 0;                      // >= 2
  const float* weight = nullptr;       // [channels, kernel]
  float* states = nullptr;             // [slots, kernel - 1, channels]
  const int32_t* slots = nullptr;      // [rows]
  const int32_t* positions = nullptr;  // [rows]
  Status Check() const;
};

// x = x / sqrt(sum(x^2) + eps) per head (flash-linear-attention's l2norm), in place.
struct L2NormParams {
  float* x = nullptr;  // row r's heads at x + r * row_stride, [heads, dim] each
  int64_t rows = 0;
  int heads = 0;
  int dim = 0;
  int64_t row_stride = 0;  // floats, >= heads * dim
  float eps = 1e-6f;
  Status Check() const;
};

// The gated delta rule, per value head h of each row, over the slot's state S [k_dim, v_dim]:
// g = -exp(a_log[h]) * softplus(a + dt_bias[h]) (softplus(x) = x above 20), beta = sigmoid(b),
//   S = exp(g) S;  S += k (beta (v - S^T k))^T;  out = S^T (scale q)
// with q and k of key head h / (v_heads / k_heads) (L2-normalized by the caller). A run of a
// slot's rows longer than one goes in chunks of `chunk` rows (flash-linear-attention's chunked
// form: within a chunk the deltas solve a triangular system, the state is read and written once
// a chunk); it equals the row-by-row recurrence up to float32 rounding. One row (decode) is the
// recurrence itself.
struct GatedDeltaRuleParams {
  float* out = nullptr;      // [rows, v_heads, v_dim]
  const float* q = nullptr;  // row r at q + r * qk_stride: [k_heads, k_dim]
  const float* k = nullptr;  // row r at k + r * qk_stride: [k_heads, k_dim]
  int64_t qk_stride = 0;
  const float* v = nullptr;  // row r at v + r * v_stride: [v_heads, v_dim]
  int64_t v_stride = 0;
  const float* a = nullptr;  // row r at a + r * ab_stride: [v_heads], the decay's input
  const float* b = nullptr;  // row r at b + r * ab_stride: [v_heads], beta's input
  int64_t ab_stride = 0;
  const float* a_log = nullptr;        // [v_heads]
  const float* dt_bias = nullptr;      // [v_heads]
  float* states = nullptr;             // [slots, v_heads, k_dim, v_dim]
  const int32_t* slots = nullptr;      // [rows]
  const int32_t* positions = nullptr;  // [rows]
  int64_t rows = 0;
  int k_heads = 0;
  int v_heads = 0;  // a multiple of k_heads
  int k_dim = 0;
  int v_dim = 0;
  float scale = 0.0f;  // of q: 1 / sqrt(k_dim)
  int chunk = 64;      // >= 1
  Status Check() const;
};

// out = rmsnorm(x) * weight * silu(z) per group of dim (Qwen3-Next's gated norm: the weight
// multiplies as it is, not as 1 + weight); out may equal x.
struct GatedRmsNormParams {
  float* out = nullptr;           // [groups, dim]
  const float* x = nullptr;       // [groups, dim]
  const float* z = nullptr;       // [groups, dim]
  const float* weight = nullptr;  // [dim]
  int64_t groups = 0;
  int64_t dim = 0;
  float eps = 1e-6f;
  Status Check() const;
};

// The encoder layers' ops (BERT, RoBERTa, XLM-R: model/encoder.h), where SupportsEncoder().

// out = (y - mean(y)) / sqrt(var(y) + eps) * weight + bias per row, y = x (+ residual where
// set: a post-norm layer's residual add); out may equal x.
struct LayerNormParams {
  float* out = nullptr;             // [rows, dim]
  const float* x = nullptr;         // [rows, dim]
  const float* residual = nullptr;  // [rows, dim] or null
  const float* weight = nullptr;    // [dim]
  const float* bias = nullptr;      // [dim]
  int64_t rows = 0;
  int64_t dim = 0;
  float eps = 1e-12f;
  Status Check() const;
};

// x = 0.5 x (1 + erf(x / sqrt(2))), elementwise in place (BERT's "gelu").
struct GeluParams {
  float* x = nullptr;  // [n]
  int64_t n = 0;
  Status Check() const;
};

// Bidirectional multi-head attention within each sequence of a packed batch: the rows
// [starts[s], starts[s + 1]) are sequence s, and each of its rows attends to every row of it
// (no mask, no padding): out = softmax(scale * q k^T) v per head.
struct EncoderAttentionParams {
  float* out = nullptr;             // [rows, heads, head_dim]
  const float* q = nullptr;         // [rows, heads, head_dim]
  const float* k = nullptr;         // [rows, heads, head_dim]
  const float* v = nullptr;         // [rows, heads, head_dim]
  const int32_t* starts = nullptr;  // [sequences + 1], increasing, starts[0] = 0, last = rows
  int64_t rows = 0;
  int sequences = 0;
  int heads = 0;
  int head_dim = 0;
  float scale = 0.0f;  // 1/sqrt(head_dim)
  Status Check() const;
};

// out[s] = the mean of the rows [starts[s], starts[s + 1]) of x: an encoder's mean pooling on
// the device, so that only [sequences, dim] floats come back to the host.
struct MeanRowsParams {
  float* out = nullptr;             // [sequences, dim]
  const float* x = nullptr;         // [rows, dim]
  const int32_t* starts = nullptr;  // [sequences + 1], increasing, starts[0] = 0
  int sequences = 0;
  int64_t dim = 0;
  Status Check() const;
};

// How one row's token is picked on the device: sampling/sampling.h's steps 3 to 5 (temperature,
// min-p, top-k, top-p, the counter-based draw), for requests without penalties or logprobs, after
// step 2b where the row has a grammar's mask.
struct SampleRow {
  float temperature = 0.0f;  // 0: the largest logit, lowest id among equals
  int32_t top_k = 0;         // 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
  uint64_t seed = 0;
  uint64_t index = 0;  // the draw's counter: output tokens so far
  // The row of SampleParams::masks that holds the tokens this row may pick (a grammar's mask:
  // the others count as -inf logits); -1: every token.
  int32_t mask = -1;
};

// Words of one row's mask of allowed tokens: bit t % 64 of word t / 64 is token t
// (TokenMatcher::FillMask's layout).
inline int64_t MaskWords(int64_t vocab) { return (vocab + 63) / 64; }

// The token a picker gives a row of logits that holds a NaN or +inf, or no finite value (the host
// Sampler and Backend::Sample alike; -inf alone marks a token as excluded): no token is right
// there; the model's weights hold non-finite values or its activations overflowed.
inline constexpr int32_t kNonFiniteToken = -1;
// The token a picker gives a row whose logits can pick (not kNonFiniteToken) but whose mask
// allows no token with a finite logit: the grammar leaves nothing to write.
inline constexpr int32_t kNoAllowedToken = -2;

// tokens[r] = the token row r of `logits` picks under params[r], kNonFiniteToken or
// kNoAllowedToken.
struct SampleParams {
  int32_t* tokens = nullptr;          // [rows]
  const float* logits = nullptr;      // [rows, vocab]
  const SampleRow* params = nullptr;  // [rows], device memory
  int64_t rows = 0;
  int64_t vocab = 0;
  // [rows with a mask, MaskWords(vocab)], device memory: the masks SampleRow::mask names; null
  // where no row has one.
  const uint64_t* masks = nullptr;
  Status Check() const;
};

// The memory of the device a backend's buffers live in (host memory for the CPU), in bytes; zeros
// where unknown.
struct DeviceMemory {
  int64_t free = 0;  // not taken now (CUDA: cudaMemGetInfo's free; CPU: MemAvailable)
  int64_t total = 0;
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
  // The device's memory now (the KV budget is sized from what the weights left free).
  virtual DeviceMemory Memory() const { return {}; }
  virtual void CopyToDevice(void* dst, const void* src, size_t bytes) = 0;
  virtual void CopyToHost(void* dst, const void* src, size_t bytes) = 0;
  // Copies within the device's memory (both pointers the backend's), in order with the ops.
  virtual void CopyOnDevice(void* dst, const void* src, size_t bytes) = 0;
  // Makes a host weight (e.g. a pointer into a memory-mapped file) usable by this backend;
  // `storage` receives whatever must stay alive (null where the host memory is used in place).
  virtual Expected<Weight> PrepareWeight(const Weight& host, std::unique_ptr<Buffer>* storage) = 0;
  // A linear's prepared weight may get a copy of its values in bf16 (Weight::bf16) for products
  // of many rows, kept in `storage` with it, where the backend keeps such copies (CUDA's
  // fast mode); by default it gets none.
  virtual void AddBf16Copy(Weight* w, std::unique_ptr<Buffer>* storage) { (void)w, (void)storage; }

  // Whether Attention has a kernel for this head shape; a model checks it when it loads, so a
  // shape without one fails with a Status instead of stopping inside the op.
  virtual Status CheckAttentionShape(int heads, int kv_heads, int head_dim) const {
    (void)heads, (void)kv_heads, (void)head_dim;
    return Status::Ok();
  }

  // Whether KvWrite, RopeKv and Attention take pages of this format; a model checks it when it
  // loads.
  virtual bool SupportsKvFormat(KvFormat f) const { return f == KvFormat::kF32; }
  // The pages a model keeps when its load options name none.
  virtual KvFormat DefaultKvFormat() const { return KvFormat::kF32; }

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
  // Whether Matmul and Embed read weights of Format::kGgml in block type `ggml_type` (a
  // GgmlType) as they are; a GGUF model keeps such tensors in their blocks and has the others
  // converted to float32 at load.
  virtual bool ReadsGgml(uint32_t ggml_type) const {
    (void)ggml_type;
    return false;
  }
  // Whether MoeFeedForward reads experts of Format::kGgml in block type `ggml_type` as they are
  // (the CPU runs each expert through Matmul, so whatever ReadsGgml says); where it does not, a
  // GGUF model whose experts are in that type is refused at load with the way out.
  virtual bool ReadsGgmlExperts(uint32_t ggml_type) const { return ReadsGgml(ggml_type); }
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

  // The expert cache: a bounded set of slots in the device's memory for the experts of a model
  // whose experts do not all fit, filled from the host weights (the memory-mapped file) as the
  // routing picks them, least recently used evicted (ExpertSlots). MoeFeedForward with `cached`
  // params reads its experts through it. A backend that keeps weights in host memory (the CPU)
  // has none.
  virtual bool SupportsExpertCache() const { return false; }
  // Bytes of a slot that holds one expert whose gate, up and down are these host weights.
  virtual int64_t ExpertSlotBytes(const Weight& gate, const Weight& up, const Weight& down) const {
    (void)gate, (void)up, (void)down;
    return 0;
  }
  // Allocates `slots` slots of `slot_bytes` (ExpertSlotBytes of the largest expert). Steps are
  // not recorded from then on (ReplayStep answers false): which experts a step reads is known
  // only once its routing is read back to the host.
  virtual Status ReserveExpertCache(int64_t slots, int64_t slot_bytes) {
    (void)slots, (void)slot_bytes;
    return Unimplemented("this backend has no expert cache");
  }
  // Its counts so far (slots 0: none reserved).
  virtual ExpertCacheStats ExpertCache() const { return {}; }

  // Whether the recurrent layers' ops (CausalConv, L2Norm, GatedDeltaRule, GatedRmsNorm) run; a
  // model with recurrent layers checks it when it loads and refuses a backend without them. The
  // default ops are never reached.
  virtual bool SupportsRecurrent() const { return false; }
  // Whether a recurrent layer of these sizes has kernels here (key and value head, the
  // convolution's taps); checked at load beside SupportsRecurrent.
  virtual Status CheckRecurrentShape(int k_dim, int v_dim, int kernel) const {
    (void)k_dim, (void)v_dim, (void)kernel;
    return Status::Ok();
  }
  virtual void CausalConv(const CausalConvParams& p) { (void)p; }
  virtual void L2Norm(const L2NormParams& p) { (void)p; }
  virtual void GatedDeltaRule(const GatedDeltaRuleParams& p) { (void)p; }
  virtual void GatedRmsNorm(const GatedRmsNormParams& p) { (void)p; }

  // Whether the encoder ops (LayerNorm, Gelu, EncoderAttention, MeanRows) run; an encoder model
  // checks it when it loads and refuses a backend without them. The default ops are never reached.
  virtual bool SupportsEncoder() const { return false; }
  // Whether EncoderAttention has a kernel for heads of head_dim; checked with SupportsEncoder.
  virtual Status CheckEncoderShape(int head_dim) const {
    (void)head_dim;
    return Status::Ok();
  }
  virtual void LayerNorm(const LayerNormParams& p) { (void)p; }
  virtual void Gelu(const GeluParams& p) { (void)p; }
  virtual void EncoderAttention(const EncoderAttentionParams& p) { (void)p; }
  virtual void MeanRows(const MeanRowsParams& p) { (void)p; }

  // Token picking on the device; a backend without it (CanSample false) leaves it to the host.
  virtual bool CanSample() const { return false; }
  virtual void Sample(const SampleParams& p) { (void)p; }

  // Waits until every issued op has finished.
  virtual void Synchronize() = 0;
  // Makes this backend's device the calling thread's current one (CUDA: its GPU), for a thread
  // that drives backends on several devices (pipeline stages, model/pipeline_runner.h): called
  // before loading onto a backend and before each run of its ops.
  virtual void MakeCurrent() {}

  // Per-op times (ops/op_trace.h), for profiling. While on, each op notes when it starts (CUDA:
  // an event on the stream; CPU: the clock) and recorded steps are neither made nor replayed, so
  // every op is launched on its own. SetOpTrace returns false where the backend keeps none.
  virtual bool SetOpTrace(bool on) {
    (void)on;
    return false;
  }
  // The ops issued since the last call, with their calls and milliseconds; waits for them.
  virtual std::vector<OpTime> TakeOpTrace() { return {}; }

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
