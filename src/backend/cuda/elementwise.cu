// Row-wise and elementwise kernels: embedding, RMSNorm (with the fused residual add), q/k norm
// and rotary, KV page write, SwiGLU, add, row gather.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backend/cuda/kernels.cuh"

namespace gizllm::cuda {
namespace {

__device__ __forceinline__ float Load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float Load(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}
__device__ __forceinline__ float Load(const __half* p, int64_t i) { return __half2float(p[i]); }

// Every kernel here is launched with LaunchDependent: it lets the kernel after it be scheduled at
// once and waits for the kernels before it.
__device__ __forceinline__ void Prologue() {
  AllowDependentLaunch();
  WaitForPriorGrid();
}

// Sum over the block; every thread gets the total. `shared` holds 32 floats.
__device__ float BlockSum(float v, float* shared) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // `shared` may still be read from an earlier call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  int warps = (blockDim.x + 31) / 32;
  v = lane < warps ? shared[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <typename T>
__global__ void EmbedKernel(float* out,             // [rows, dim]
                            const T* table,         // [vocab, dim]
                            const int32_t* tokens,  // [rows]
                            int64_t dim, float scale) {
  Prologue();
  int64_t r = blockIdx.x;
  const T* src = table + static_cast<int64_t>(tokens[r]) * dim;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) out[r * dim + i] = Load(src, i) * scale;
}

__device__ __forceinline__ void Store(float* p, float v) { *p = v; }
__device__ __forceinline__ void Store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

// One block per row. With `residual`: residual += x, then out = norm(residual). A bf16 `out`
// holds the float32 result rounded once (what ToBf16 of the float32 output would give).
template <typename Out>
__global__ void RmsNormKernel(Out* out,             // [rows, dim]
                              const float* x,       // [rows, dim]
                              float* residual,      // [rows, dim] or null
                              const float* weight,  // [dim]
                              int64_t dim, float eps, float offset) {
  Prologue();
  __shared__ float shared[32];
  int64_t r = blockIdx.x;
  const float* xr = x + r * dim;
  float* src = residual ? residual + r * dim : nullptr;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    float v = xr[i];
    if (src) {
      v += src[i];
      src[i] = v;
    }
    ss += v * v;
  }
  float total = BlockSum(ss, shared);
  float inv = rsqrtf(total / static_cast<float>(dim) + eps);
  const float* in = src ? src : xr;
  // Each thread reads back only what it wrote above, so out may alias x.
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
    Store(out + r * dim + i, in[i] * inv * (weight[i] + offset));
}

// One (row, head) of p by one warp: optional RMSNorm over head_dim, then rotate-half rotary, in
// place. `buf` holds head_dim floats of the warp's own.
__device__ void RopeHead(const RopeParams& p, int64_t item, float* buf, int lane) {
  int64_t r = item / p.heads;
  float* x = p.x + item * p.head_dim;
  float ss = 0.0f;
  for (int i = lane; i < p.head_dim; i += 32) {
    float v = x[i];
    buf[i] = v;
    ss += v * v;
  }
  if (p.norm) {
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    float inv = rsqrtf(ss / static_cast<float>(p.head_dim) + p.norm_eps);
    for (int i = lane; i < p.head_dim; i += 32) buf[i] = buf[i] * inv * p.norm[i];
  }
  __syncwarp();
  int half = p.rotary_dims / 2;
  float pos = half > 0 ? static_cast<float>(p.positions[r]) : 0.0f;
  for (int i = lane; i < half; i += 32) {
    float s, c;
    sincosf(pos * p.inv_freq[i], &s, &c);
    float a = buf[i], b = buf[i + half];
    x[i] = a * c - b * s;
    x[i + half] = b * c + a * s;
  }
  for (int i = p.rotary_dims + lane; i < p.head_dim; i += 32) x[i] = buf[i];
}

// One warp per (row, head).
__global__ void RopeKernel(RopeParams p) {
  Prologue();
  extern __shared__ float buf_all[];
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int64_t item = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + warp;
  if (item >= p.rows * p.heads) return;
  RopeHead(p, item, buf_all + warp * p.head_dim, lane);
}

// One warp per (row, query head) and per (row, kv head); a kv head's warp writes its rotated key
// and its value into the row's page (float32 or fp16), and with k16 as fp16 pairs into the step's
// copy.
__global__ void RopeKvKernel(RopeKvParams p, uint32_t* k16, uint32_t* v16) {
  Prologue();
  extern __shared__ float buf_all[];
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int64_t item = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + warp;
  const int64_t q_items = p.q.rows * p.q.heads;
  if (item < q_items) {
    RopeHead(p.q, item, buf_all + warp * p.q.head_dim, lane);
    return;
  }
  item -= q_items;
  if (item >= p.k.rows * p.k.heads) return;
  RopeHead(p.k, item, buf_all + warp * p.k.head_dim, lane);
  __syncwarp();  // the key this warp rotated, read back below
  const KvWriteParams& kv = p.kv;
  int64_t r = item / kv.kv_heads;
  int32_t pos = kv.positions[r];
  int64_t page =
      kv.table.pages[static_cast<int64_t>(kv.slots[r]) * kv.table.max_pages + pos / kPage];
  int64_t per_row = static_cast<int64_t>(kv.kv_heads) * kv.head_dim;
  int64_t at = (page * kPage + pos % kPage) * per_row + (item % kv.kv_heads) * kv.head_dim;
  const float* k = kv.k + item * kv.head_dim;
  const float* v = kv.v + item * kv.head_dim;
  for (int i = lane; i < kv.head_dim; i += 32) {
    StoreKv(kv.cache.keys, kv.cache.format, at + i, k[i]);
    StoreKv(kv.cache.values, kv.cache.format, at + i, v[i]);
  }
  if (k16) {
    const int64_t pairs = item * (kv.head_dim / 2);
    for (int i = lane; i < kv.head_dim / 2; i += 32) {
      k16[pairs + i] = PackHalfSat(k[2 * i], k[2 * i + 1]);
      v16[pairs + i] = PackHalfSat(v[2 * i], v[2 * i + 1]);
    }
  }
}

// One thread per (row, kv head, element).
__global__ void KvWriteKernel(KvWriteParams p) {
  Prologue();
  int64_t per_row = static_cast<int64_t>(p.kv_heads) * p.head_dim;
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.rows * per_row) return;
  int64_t r = i / per_row, e = i % per_row;
  int32_t pos = p.positions[r];
  int64_t page = p.table.pages[static_cast<int64_t>(p.slots[r]) * p.table.max_pages + pos / kPage];
  int64_t at = (page * kPage + pos % kPage) * per_row + e;
  StoreKv(p.cache.keys, p.cache.format, at, p.k[i]);
  StoreKv(p.cache.values, p.cache.format, at, p.v[i]);
}

// out = act(gate) * up; with out_bf16 also that rounded to bf16 there.
template <Activation kAct>
__global__ void GluKernel(float* out, const float* gate, const float* up, int64_t n,
                          __nv_bfloat16* out_bf16) {
  Prologue();
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float g = gate[i];
  float a;
  if constexpr (kAct == Activation::kSilu) {
    a = g / (1.0f + expf(-g));
  } else if constexpr (kAct == Activation::kSigmoid) {
    a = 1.0f / (1.0f + expf(-g));
  } else {  // gelu_pytorch_tanh
    a = 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
  }
  float y = a * up[i];
  out[i] = y;
  if (out_bf16) out_bf16[i] = __float2bfloat16_rn(y);
}

__global__ void SoftcapKernel(float* x, int64_t n, float cap) {
  Prologue();
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = cap * tanhf(x[i] / cap);
}

__global__ void AddKernel(float* out, const float* x, int64_t n) {
  Prologue();
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] += x[i];
}

__global__ void GatherRowsKernel(float* out, const float* x, const int32_t* index, int64_t dim) {
  Prologue();
  int64_t i = blockIdx.x;
  const float* src = x + static_cast<int64_t>(index[i]) * dim;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) out[i * dim + j] = src[j];
}

__global__ void ToBf16Kernel(const float* x, int64_t n, __nv_bfloat16* y) {
  Prologue();
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __float2bfloat16_rn(x[i]);
}

__global__ void AddBiasKernel(float* out, int64_t rows, int64_t n, const float* bias) {
  Prologue();
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < rows * n) out[i] += bias[i % n];
}

// The page formats StoreKv writes; any other is a broken invariant (Model::Load refuses it).
void CheckPageFormat(const char* op, KvFormat format) {
  if (format == KvFormat::kF32 || format == KvFormat::kF16) return;
  std::fprintf(stderr, "cuda %s: KV pages of format %s have no kernel\n", op,
               KvFormatName(format).c_str());
  std::abort();
}

unsigned Blocks(int64_t n, int threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

}  // namespace

void LaunchEmbed(const EmbedParams& p, cudaStream_t stream) {
  if (p.rows == 0) return;
  int64_t dim = p.table->cols;
  switch (p.table->format) {
    case Format::kF32:
      LaunchDependent(EmbedKernel<float>, dim3(p.rows), dim3(256), 0, stream, p.out,
                      static_cast<const float*>(p.table->data), p.tokens, dim, p.scale);
      break;
    case Format::kF16:
      LaunchDependent(EmbedKernel<__half>, dim3(p.rows), dim3(256), 0, stream, p.out,
                      static_cast<const __half*>(p.table->data), p.tokens, dim, p.scale);
      break;
    case Format::kBf16:
      LaunchDependent(EmbedKernel<__nv_bfloat16>, dim3(p.rows), dim3(256), 0, stream, p.out,
                      static_cast<const __nv_bfloat16*>(p.table->data), p.tokens, dim, p.scale);
      break;
    default:
      std::fprintf(stderr, "cuda Embed: table format %s is not plain\n",
                   FormatName(p.table->format).c_str());
      std::abort();
  }
  GZ_CUDA_LAUNCHED();
}

void LaunchRmsNorm(const RmsNormParams& p, cudaStream_t stream) {
  if (p.rows == 0) return;
  int threads = p.dim >= 2048 ? 512 : p.dim >= 512 ? 256 : 128;
  LaunchDependent(RmsNormKernel<float>, dim3(p.rows), dim3(threads), 0, stream, p.out, p.x,
                  p.residual, p.weight, p.dim, p.eps, p.offset);
  GZ_CUDA_LAUNCHED();
}

void LaunchRmsNormToBf16(const RmsNormParams& p, void* out, cudaStream_t stream) {
  if (p.rows == 0) return;
  int threads = p.dim >= 2048 ? 512 : p.dim >= 512 ? 256 : 128;
  LaunchDependent(RmsNormKernel<__nv_bfloat16>, dim3(p.rows), dim3(threads), 0, stream,
                  static_cast<__nv_bfloat16*>(out), p.x, p.residual, p.weight, p.dim, p.eps,
                  p.offset);
  GZ_CUDA_LAUNCHED();
}

void LaunchRope(const RopeParams& p, cudaStream_t stream) {
  int64_t items = p.rows * p.heads;
  if (items == 0) return;
  constexpr int kWarps = 4;
  LaunchDependent(RopeKernel, dim3(Blocks(items, kWarps)), dim3(kWarps * 32),
                  kWarps * p.head_dim * sizeof(float), stream, p);
  GZ_CUDA_LAUNCHED();
}

void LaunchRopeKv(const RopeKvParams& p, cudaStream_t stream, void* k16, void* v16) {
  int64_t items = p.q.rows * p.q.heads + p.k.rows * p.k.heads;
  if (items == 0) return;
  CheckPageFormat("RopeKv", p.kv.cache.format);
  constexpr int kWarps = 4;
  int head_dim = p.q.head_dim > p.k.head_dim ? p.q.head_dim : p.k.head_dim;
  LaunchDependent(RopeKvKernel, dim3(Blocks(items, kWarps)), dim3(kWarps * 32),
                  kWarps * head_dim * sizeof(float), stream, p, static_cast<uint32_t*>(k16),
                  static_cast<uint32_t*>(v16));
  GZ_CUDA_LAUNCHED();
}

void LaunchKvWrite(const KvWriteParams& p, cudaStream_t stream) {
  int64_t n = p.rows * p.kv_heads * p.head_dim;
  if (n == 0) return;
  CheckPageFormat("KvWrite", p.cache.format);
  LaunchDependent(KvWriteKernel, dim3(Blocks(n, 256)), dim3(256), 0, stream, p);
  GZ_CUDA_LAUNCHED();
}

void LaunchGlu(const GluParams& p, cudaStream_t stream, void* out_bf16) {
  if (p.n == 0) return;
  auto kernel = p.act == Activation::kSilu      ? GluKernel<Activation::kSilu>
                : p.act == Activation::kSigmoid ? GluKernel<Activation::kSigmoid>
                                                : GluKernel<Activation::kGeluTanh>;
  LaunchDependent(kernel, dim3(Blocks(p.n, 256)), dim3(256), 0, stream, p.out, p.gate, p.up, p.n,
                  static_cast<__nv_bfloat16*>(out_bf16));
  GZ_CUDA_LAUNCHED();
}

void LaunchSoftcap(const SoftcapParams& p, cudaStream_t stream) {
  if (p.n == 0) return;
  LaunchDependent(SoftcapKernel, dim3(Blocks(p.n, 256)), dim3(256), 0, stream, p.x, p.n, p.cap);
  GZ_CUDA_LAUNCHED();
}

void LaunchAdd(const AddParams& p, cudaStream_t stream) {
  if (p.n == 0) return;
  LaunchDependent(AddKernel, dim3(Blocks(p.n, 256)), dim3(256), 0, stream, p.out, p.x, p.n);
  GZ_CUDA_LAUNCHED();
}

void LaunchGatherRows(const GatherRowsParams& p, cudaStream_t stream) {
  if (p.count == 0) return;
  LaunchDependent(GatherRowsKernel, dim3(p.count), dim3(256), 0, stream, p.out, p.x, p.index,
                  p.dim);
  GZ_CUDA_LAUNCHED();
}

void LaunchToBf16(const float* x, int64_t n, void* y, cudaStream_t stream) {
  if (n == 0) return;
  LaunchDependent(ToBf16Kernel, dim3(Blocks(n, 256)), dim3(256), 0, stream, x, n,
                  static_cast<__nv_bfloat16*>(y));
  GZ_CUDA_LAUNCHED();
}

void LaunchAddBias(float* out, int64_t rows, int64_t n, const float* bias, cudaStream_t stream) {
  if (rows * n == 0) return;
  LaunchDependent(AddBiasKernel, dim3(Blocks(rows * n, 256)), dim3(256), 0, stream, out, rows, n,
                  bias);
  GZ_CUDA_LAUNCHED();
}

}  // namespace gizllm::cuda
