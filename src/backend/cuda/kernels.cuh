// Launchers of the CUDA backend's kernels. Internal to backend/cuda: each takes the op's params
// (device pointers) and the stream the backend issues its work on.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "ops/backend.h"

// A failed CUDA call inside an op is a broken invariant (bad pointers, a lost device): the ops
// return nothing, so it stops the program with the call and the error.
#define GZ_CUDA_CHECK(expr)                                                         \
  do {                                                                              \
    cudaError_t gz_err_ = (expr);                                                   \
    if (gz_err_ != cudaSuccess) {                                                   \
      std::fprintf(stderr, "%s:%d: CUDA error %s: %s\n", __FILE__, __LINE__, #expr, \
                   cudaGetErrorString(gz_err_));                                    \
      std::abort();                                                                 \
    }                                                                               \
  } while (0)

#define GZ_CUDA_LAUNCHED() GZ_CUDA_CHECK(cudaGetLastError())

namespace gizllm::cuda {

// Programmatic dependent launch (Hopper): a kernel launched with
// cudaLaunchAttributeProgrammaticStreamSerialization may start before the kernel ahead of it
// ends, once every block of that one has called AllowDependentLaunch (or exited); it must call
// WaitForPriorGrid before it reads anything the kernel ahead wrote, or writes anything that one
// reads. No-ops before sm_90 and for kernels launched the plain way.
__device__ __forceinline__ void AllowDependentLaunch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void WaitForPriorGrid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Two floats as an fp16 pair (the first in the low half), rounded to nearest; a value past fp16's
// range becomes the largest finite fp16 (satfinite), a NaN stays NaN.
__device__ __forceinline__ uint32_t PackHalfSat(float lo, float hi) {
  uint32_t v;
  asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;\n" : "=r"(v) : "f"(hi), "f"(lo));
  return v;
}

// One element of a KV page: float32 as it is, or (KvFormat::kF16) rounded to the nearest fp16 as
// PackHalfSat rounds it (saturated at +-65504, as the CPU's pages and the reference store it).
__device__ __forceinline__ void StoreKv(void* pages, KvFormat format, int64_t at, float x) {
  if (format == KvFormat::kF16) {
    static_cast<uint16_t*>(pages)[at] = static_cast<uint16_t>(PackHalfSat(x, 0.0f) & 0xffffu);
  } else {
    static_cast<float*>(pages)[at] = x;
  }
}

// AttentionParams::softcap in the attention kernels' log2 units (their scores are scaled by
// log2 e); cap 0: off. Computed on the host and passed as a kernel argument, so that a kernel
// reads it from the constant bank instead of holding it in registers.
struct ScoreCap {
  float cap = 0.0f;
  float inv_cap = 0.0f;  // 1 / cap
};
inline ScoreCap ScoreCapOf(const AttentionParams& p) {
  constexpr float kLog2e = 1.4426950408889634f;
  if (!(p.softcap > 0.0f)) return {};
  return {p.softcap * kLog2e, 1.0f / (p.softcap * kLog2e)};
}

#ifdef __CUDACC__  // device intrinsics; host code (the bench) includes this header too
// cap * tanh(x / cap) for a score x, with tanh(y) = 1 - 2 / (e^2y + 1) by one exp2: within a few
// 1e-7 of tanh (absolute), exactly +-1 far out (e^2y past float's range gives 2 / inf = 0).
__device__ __forceinline__ float SoftcapScore(float x, ScoreCap c) {
  constexpr float k2Log2e = 2.8853900817779268f;  // 2 / ln 2
  return c.cap * (1.0f - __fdividef(2.0f, exp2f(k2Log2e * c.inv_cap * x) + 1.0f));
}
#endif

// Launches kernel<<<grid, block, shared, stream>>>(args...) as a programmatic dependent of the
// kernel ahead of it on the stream: its blocks may be scheduled while that one finishes, which
// hides the launch. The kernel must call WaitForPriorGrid on every path, before it touches
// memory an earlier kernel writes or reads (a kernel that exits without waiting could end before
// the one ahead of it, and the kernel after it would then not wait for that one).
template <typename... Params, typename... Args>
void LaunchDependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared,
                     cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  GZ_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...));
}

// Scratch device memory that grows to the largest request and is then reused. A buffer it
// outgrows stays allocated until the Scratch is destroyed: recorded steps (CUDA graphs) may
// still use it, and it may be allocated while a step is being recorded (no free, no sync).
class Scratch {
 public:
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() {
    if (data_) cudaFree(data_);
    for (void* old : retired_) cudaFree(old);
  }
  void* Get(size_t bytes) {
    if (bytes > bytes_) {
      if (data_) retired_.push_back(data_);
      GZ_CUDA_CHECK(cudaMalloc(&data_, bytes));
      bytes_ = bytes;
    }
    return data_;
  }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  std::vector<void*> retired_;
};

void LaunchEmbed(const EmbedParams& p, cudaStream_t stream);
void LaunchRmsNorm(const RmsNormParams& p, cudaStream_t stream);
// The same with p.out ignored: the normalized rows as bf16 into out ([rows, dim]).
void LaunchRmsNormToBf16(const RmsNormParams& p, void* out, cudaStream_t stream);
void LaunchRope(const RopeParams& p, cudaStream_t stream);
void LaunchKvWrite(const KvWriteParams& p, cudaStream_t stream);
// Pages of KvFormat kF32 or kF16 (StoreKv). With k16 and v16 (each [rows, kv_heads, head_dim]
// fp16), the step's rotated keys and its values are also written there, in row order, as
// PackHalfSat rounds them: the tensor-core tile kernel reads a prompt's keys from that copy
// instead of converting the float32 pages (fp16 pages need no copy).
void LaunchRopeKv(const RopeKvParams& p, cudaStream_t stream, void* k16 = nullptr,
                  void* v16 = nullptr);
// Rotated KV pages (attention_codes.cu): the write of each key and value vector as codes, and the
// attention that reads them. Supported: head_dim a multiple of 8 up to 256. tensor_cores (the
// fast mode): prompt pieces through the tensor-core tile kernel over the codes (fp16 operands);
// otherwise every row through the float32 split kernel.
bool RotatedAttentionSupported(int heads, int kv_heads, int head_dim);
void LaunchRotatedKvWrite(const KvWriteParams& p, cudaStream_t stream);
void LaunchRotatedAttention(const AttentionParams& p, int sm_count, Scratch* scratch,
                            cudaStream_t stream, bool tensor_cores);
// The kernels behind it, over queries already rotated (p.q) and writing the output rotated:
// the float32 split kernel over the codes (attention_codes_split.cu; head_dim 64, 128 or 256, pages
// 16-byte aligned), for the rows alone in their sequence or (all_rows) every row, in `splits`
// blocks per (row, kv head, head chunk) whose parts (part_acc [rows, heads, splits, head_dim],
// part_ml [rows, heads, splits, 2]; where splits > 1) LaunchAttentionCombine merges; and the
// tensor-core tile kernel over codes dequantized into its fp16 tiles (attention_mma.cu) for the
// runs of rows of one sequence.
bool CodesDecodeSupported(const AttentionParams& p);
int CodesDecodeSplits(const AttentionParams& p, int sm_count);
void LaunchCodesDecode(const AttentionParams& p, bool all_rows, int splits, float* part_acc,
                       float* part_ml, cudaStream_t stream);
void LaunchMmaTileCodes(const AttentionParams& p, int sm_count, cudaStream_t stream, int warps = 0);
// The fast mode's decoding rows: the tensor-core decode kernel (attention_mma.cu, as
// LaunchMmaDecode) over pages of codes read back to fp16 a page at a time (head_dim 64, 128 or
// 256; up to 16 query heads per kv head, 8 at 256).
bool MmaDecodeCodesSupported(const AttentionParams& p);
int LaunchMmaDecodeCodes(const AttentionParams& p, int splits, float* part_acc, float* part_ml,
                         cudaStream_t stream);
// The decode kernels' combine (attention.cu): out = the splits' parts rescaled, for the rows
// alone in their sequence or (all_rows) every row.
void LaunchAttentionCombine(const AttentionParams& p, bool all_rows, int splits,
                            const float* part_acc, const float* part_ml, cudaStream_t stream);
// With out_bf16 ([n] bf16), the result rounded to bf16 there too.
void LaunchGlu(const GluParams& p, cudaStream_t stream, void* out_bf16 = nullptr);
void LaunchSoftcap(const SoftcapParams& p, cudaStream_t stream);
void LaunchAdd(const AddParams& p, cudaStream_t stream);
void LaunchGatherRows(const GatherRowsParams& p, cudaStream_t stream);
// The encoder ops (encoder.cu). EncoderAttention: head_dim up to 256 (EncoderAttentionCovers).
// out_bf16: where not null, [rows, dim] (LayerNorm) or [n] (Gelu) bf16, the output rounded for
// the matmul that reads it next.
void LaunchLayerNorm(const LayerNormParams& p, cudaStream_t stream, void* out_bf16 = nullptr);
void LaunchGelu(const GeluParams& p, cudaStream_t stream, void* out_bf16 = nullptr);
void LaunchMeanRows(const MeanRowsParams& p, cudaStream_t stream);
bool EncoderAttentionCovers(int head_dim);
void LaunchEncoderAttention(const EncoderAttentionParams& p, cudaStream_t stream);
// The fast mode's tensor-core encoder attention (encoder_mma.cu; fp16 operands): where it covers
// p (head_dim a multiple of 4 up to 128, q, k, v and out 16-byte aligned). out16: where not null,
// [rows, heads, head_dim] bf16, out rounded for the output projection.
bool EncoderAttentionMmaCovers(const EncoderAttentionParams& p);
// Bytes of the scratch LaunchEncoderAttentionMma takes: the keys and values in fp16.
size_t EncoderAttentionMmaScratchBytes(const EncoderAttentionParams& p);
void LaunchEncoderAttentionMma(const EncoderAttentionParams& p, void* out16, void* scratch,
                               cudaStream_t stream);

// Every output of p (out_i[rows, n_i] = x W_i^T + bias_i) streaming each W once per 8 rows,
// float32 x; the outputs of one weight format in one launch, with p's accumulate and swiglu
// ends, where GemvCovers(p).
void LaunchGemv(const MatmulParams& p, int sm_count, cudaStream_t stream);
// Whether LaunchGemv runs p: plain weights, no norm (the backend normalizes first), and for
// swiglu one format for both outputs.
bool GemvCovers(const MatmulParams& p);
// The same product by a tiled float32 kernel (any rows; exact mode and plain non-bf16 weights);
// accumulate: out += the product.
void LaunchGemmF32(const float* x, int64_t rows, const Weight& w, const float* bias, float* out,
                   bool accumulate, cudaStream_t stream);
// y[n] = bf16(x[n]).
void LaunchToBf16(const float* x, int64_t n, void* y, cudaStream_t stream);
// out[r, :] += bias for every row.
void LaunchAddBias(float* out, int64_t rows, int64_t n, const float* bias, cudaStream_t stream);

// Quantized linears (quant/layout.h formats; quant_matmul.cu). PrepareWeight uploads
// PackQuantWeight's bytes (QuantDeviceBytes of them: the codes reordered for the kernels, then
// (mul, add) per group) and uses QuantDeviceWeight's pointers into them.
Status CheckQuantWeight(const Weight& host);
size_t QuantDeviceBytes(const Weight& host);
void PackQuantWeight(const Weight& host, uint8_t* out);
Weight QuantDeviceWeight(const Weight& host, void* device);
// Whether any output of p has a quantized weight.
bool HasQuantized(const MatmulParams& p);
// Weights in ggml's blocks (Format::kGgml) as a GGUF file holds them (ggml_matmul.cu): whether
// the kernels read block type `ggml_type` (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, IQ4_XS, Q1_0); whether
// any output of p has such a weight; out [rows, w.rows] = x [rows, w.cols] W^T (+ bias), added into
// out with `accumulate`; Embed's rows decoded from the table's blocks.
bool GgmlReads(uint32_t ggml_type);
bool HasGgml(const MatmulParams& p);
void LaunchGgmlMatmul(const float* x, int64_t rows, const Weight& w, const float* bias, float* out,
                      bool accumulate, cudaStream_t stream);
void LaunchGgmlEmbed(const EmbedParams& p, cudaStream_t stream);
// The many-row path of fast mode (more than kGgmlGemmRows rows, weights of at most
// kQuantGemmMaxElements values): W's values rounded to bf16 into out [w.rows, w.cols], for
// cuBLASLt; GgmlDequants says whether w's block type and alignment have the kernel.
inline constexpr int64_t kGgmlGemmRows = 8;
bool GgmlDequants(const Weight& w);
void LaunchGgmlDequantBf16(const Weight& w, void* out, cudaStream_t stream);
// Activations of quantized matmuls: rotated float16 copies and group sums (fast), rotated
// float32 (exact).
struct QuantScratch {
  Scratch xh, xsum, x32;
};
// Whether LaunchQuantMatmul runs p's accumulate and swiglu ends itself (inside the batch-1
// decode kernel: fast mode, one row, every output quantized alike, no norm left to apply);
// otherwise the caller runs p without them and adds or applies SwiGLU after.
bool QuantFusesEnds(const MatmulParams& p, bool exact);
// Runs the quantized outputs of p (exact: float32 activations and sums, else float16 activations
// on the tensor cores) and returns the params of the plain outputs left to run (outputs 0: none).
// p's accumulate and swiglu only where QuantFusesEnds(p, exact).
MatmulParams LaunchQuantMatmul(const MatmulParams& p, bool exact, QuantScratch* scratch,
                               cudaStream_t stream);
// The many-row path (fast mode, at least kQuantGemmRows rows, weights of at most
// kQuantGemmMaxElements values): W dequantized to bf16 [w.rows, w.cols] and x rotated like W's
// inputs into bf16 [rows, w.cols], for cuBLASLt.
inline constexpr int64_t kQuantGemmRows = 256;
inline constexpr int64_t kQuantGemmMaxElements = int64_t{64} << 20;
void LaunchDequantBf16(const Weight& w, void* out, cudaStream_t stream);
// out [rows, cols] <- each row of x [rows, cols] rotated as quant::RotateRow with `seed`
// (float32; cols a multiple of 128; out must not overlap x).
void LaunchRotateRows(const float* x, int64_t rows, int64_t cols, uint64_t seed, float* out,
                      cudaStream_t stream);
void LaunchRotateToBf16(const float* x, int64_t rows, const Weight& w, void* out,
                        cudaStream_t stream);

// Paged grouped-query attention: the decode kernel (rows that are alone in their sequence,
// keys split across blocks) and the tile kernel (runs of rows of one sequence).
// Whether the attention kernels cover this shape (head_dim a multiple of 32 up to 256, at most
// 64 query heads per kv head). LaunchAttention stops the program on any other shape.
bool AttentionSupported(int heads, int kv_heads, int head_dim);
// tensor_cores (the fast mode): prompt pieces through the fp16 tensor-core tile kernel where it
// covers the shape, and decoding rows over fp16 pages through the tensor-core decode kernel.
// k16, v16: the step's fp16 keys and values as LaunchRopeKv writes them for p's rows (or null).
void LaunchAttention(const AttentionParams& p, int sm_count, Scratch* scratch, cudaStream_t stream,
                     bool tensor_cores = false, const void* k16 = nullptr,
                     const void* v16 = nullptr);
// The tensor-core tile kernel (attention_mma.cu): runs of rows of one sequence, fp16 Q, K, V and
// probabilities, float32 softmax and sums. Covers head_dim a multiple of 32 up to 256 (every
// shape AttentionSupported takes) with at most 64 query heads per kv head.
bool MmaTileSupported(int heads, int kv_heads, int head_dim);
// warps: 4 or 8 per block; 0: 8 where that still gives every multiprocessor a block. k16, v16:
// the step's fp16 keys and values (LaunchRopeKv) or null; a run of rows whose keys were all
// written in this step reads them there.
void LaunchMmaTile(const AttentionParams& p, int sm_count, cudaStream_t stream, int warps = 0,
                   const void* k16 = nullptr, const void* v16 = nullptr);
// The tensor-core decode kernel (attention_mma.cu): rows alone in their sequence over fp16
// pages, fp16 Q, K, V and probabilities, float32 softmax and sums; up to 16 query heads per kv
// head (8 above head_dim 128). One block per (row, kv head, split); with splits > 1 it writes
// the parts LaunchAttention's combine kernel reads ([rows, heads, splits, head_dim] and
// [rows, heads, splits, 2]). splits 0: launches nothing. Returns the blocks a multiprocessor
// holds.
bool MmaDecodeSupported(const AttentionParams& p);
int LaunchMmaDecode(const AttentionParams& p, int splits, float* part_acc, float* part_ml,
                    cudaStream_t stream);

// The mixture-of-experts feed-forward (moe.cu). Routing runs on the device (float32 router
// logits, softmax, top k, renormalized weights); at most kMoeDecodeRows rows stream only the
// picked experts' weights (the weighted sum fused into the down kernel); more rows are sorted by
// expert and go through grouped GEMMs over tiles of kMoeTile rows of one expert, then a
// weighted gather-sum per row. bf16 (the fast mode's many-row steps): the activations into bf16
// weights rounded to bf16 (the grouped path on the tensor cores); else float32 throughout.
// Quantized experts (q8, q4, q2, q1, as PrepareWeight lays them out) in float32 in every mode,
// their inputs rotated first into `rotated` where the weights were; in fast mode's grouped path
// (more than kMoeDecodeRows rows) their bf16 copies (MoeDevice::copies) where every expert has one.
inline constexpr int kMoeMaxExperts = 512;
inline constexpr int64_t kMoeDecodeRows = 4;
inline constexpr int kMoeTile = 64;
// Elements (not bytes) of each device buffer LaunchMoe needs for p (0: not used).
struct MoeSizes {
  int64_t logits = 0;   // float [rows, experts]
  int64_t slots = 0;    // ids (int), weights (float), sorted and slot_pos (int): [rows * top_k]
  int64_t hidden = 0;   // float [rows * top_k, ffn]
  int64_t outputs = 0;  // float [rows * top_k, dim] (many rows)
  int64_t tiles = 0;    // int4 [tiles] (many rows), an upper bound of the tiles in use
  int64_t rotated = 0;  // float: the rotated inputs of rotated quantized experts,
                        // max([rows, dim], [rows * top_k, ffn])
};
MoeSizes MoeScratchSizes(const MoeFeedForwardParams& p);
struct MoeDevice {
  // [gate of each expert, up of each expert, down of each expert]: the weights' device pointers
  // (data), then the same for their scales (quantized: the (mul, add) pairs; plain: null)
  const void* const* table = nullptr;
  bool aligned = false;  // every pointer of the table on 16 bytes
  // Quantized experts whose every gate, up and down has its bf16 copy (Weight::bf16): the table
  // of those copies, laid out as `table` (scales null); else null. Fast mode's grouped path
  // multiplies these as bf16 experts (the copies hold the rotated basis: inputs rotated first).
  const void* const* copies = nullptr;
  float* logits = nullptr;
  int* ids = nullptr;
  float* weights = nullptr;
  float* hidden = nullptr;
  float* outputs = nullptr;
  int* sorted = nullptr;
  int* slot_pos = nullptr;
  int4* tiles = nullptr;
  int* tile_count = nullptr;
  float* rotated = nullptr;
};
// p's weights: plain or quantized, every gate and up of one format (and rotation), every down
// of one format (and rotation), at most kMoeMaxExperts experts (the backend checks).
void LaunchMoe(const MoeFeedForwardParams& p, const MoeDevice& d, bool bf16, int sm_count,
               cudaStream_t stream);
// LaunchMoe's two halves, for the expert cache (which reads the routing back between them):
// the router logits and the routing into d.ids and d.weights; then the experts over those picks
// (decode: the decode kernels, else the grouped path; a run of rows of a larger step passes its
// step's choice, so that each row's result does not depend on the run it is in). The experts'
// half reads only p.rows rows of d.ids and d.weights (a run of rows passes them offset).
void LaunchMoeRoute(const MoeFeedForwardParams& p, const MoeDevice& d, int sm_count,
                    cudaStream_t stream);
void LaunchMoeExperts(const MoeFeedForwardParams& p, const MoeDevice& d, bool bf16, bool decode,
                      cudaStream_t stream);

// The recurrent layers' ops (recurrent.cu). CheckRecurrentShape: whether a layer of that key
// head, value head and convolution has kernels; the launches refuse (abort) what it refuses.
Status CheckRecurrentShape(int k_dim, int v_dim, int kernel);
void LaunchCausalConv(const CausalConvParams& p, cudaStream_t stream);
void LaunchL2Norm(const L2NormParams& p, cudaStream_t stream);
// The gated delta rule: each run of at least min_chunked_rows rows of one slot (1 to 256; 0:
// none) in a chunked form (chunks of 64 rows), the others (decode rows, short runs) row by row in
// float32. The chunked forms: kParallel, the chunk-parallel kernels (float32; scratch from
// `scratch`, DeltaRuleScratchBytes of it, which must not be null); kSerial, the one-block-a-run
// kernel that walks the chunks in order (float32), and kSerialTf32, the same with its larger
// products in tf32 on the tensor cores (kept for comparison: cuda_bench --delta-rule). The
// backend chunks runs of kDeltaRuleChunkedRows rows or more with kParallel in both modes.
enum class DeltaRuleForm { kParallel, kSerial, kSerialTf32 };
inline constexpr int kDeltaRuleChunkedRows = 16;
size_t DeltaRuleScratchBytes(const GatedDeltaRuleParams& p, int min_chunked_rows);
void LaunchGatedDeltaRule(const GatedDeltaRuleParams& p, int min_chunked_rows, DeltaRuleForm form,
                          Scratch* scratch, cudaStream_t stream);
void LaunchGatedRmsNorm(const GatedRmsNormParams& p, cudaStream_t stream);
// out[r, c] += sigmoid(scale[r]) * y[r, c] over [rows, dim]; scale null: out += y.
void LaunchGatedAdd(float* out, const float* y, const float* scale, int64_t rows, int64_t dim,
                    cudaStream_t stream);

// tokens[r] = the token row r picks (backend.h's SampleRow; sampling/sampling.h's steps 2b-5).
void LaunchSample(const SampleParams& p, cudaStream_t stream);

}  // namespace gizllm::cuda
