// The encoder ops (ops/backend.h): LayerNorm with bias, GELU of erf, bidirectional attention
// within each sequence of a packed batch, and the mean of each sequence's rows. Plain float32
// kernels, the CPU's order of operations; the attention here is the exact mode's (and the
// fallback of shapes encoder_mma.cu's tensor-core kernel does not cover).
#include <cuda_bf16.h>

#include "backend/cuda/kernels.cuh"

namespace gizllm::cuda {
namespace {

__device__ __forceinline__ void Prologue() {
  AllowDependentLaunch();
  WaitForPriorGrid();
}

// Sum over the block (blockDim.x a multiple of 32); every thread gets the total.
__device__ float BlockTotal(float v, float* shared) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  v = lane < warps ? shared[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// One block a row: y = x (+ residual) into out, then the mean, the centred squares, and
// (y - mean) * rsqrt(var + eps) * weight + bias (also rounded to bf16 into out16 where set).
__global__ void LayerNormKernel(LayerNormParams p, __nv_bfloat16* out16) {
  Prologue();
  __shared__ float shared[32];
  const int64_t r = blockIdx.x;
  const float* x = p.x + r * p.dim;
  const float* res = p.residual ? p.residual + r * p.dim : nullptr;
  float* out = p.out + r * p.dim;
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x) {
    const float y = res ? x[i] + res[i] : x[i];
    out[i] = y;  // out may be x or residual: each element is read before it is written
    sum += y;
  }
  const float mean = BlockTotal(sum, shared) / static_cast<float>(p.dim);
  float squares = 0.0f;
  for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x) {
    const float d = out[i] - mean;
    squares += d * d;
  }
  const float inv = rsqrtf(BlockTotal(squares, shared) / static_cast<float>(p.dim) + p.eps);
  for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x) {
    const float y = (out[i] - mean) * inv * p.weight[i] + p.bias[i];
    out[i] = y;
    if (out16) out16[r * p.dim + i] = __float2bfloat16_rn(y);
  }
}

__global__ void GeluKernel(float* x, int64_t n, __nv_bfloat16* out16) {
  Prologue();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float y = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f));
  x[i] = y;
  if (out16) out16[i] = __float2bfloat16_rn(y);
}

// Block (sequence, 256 columns): each thread sums its column over the sequence's rows in
// double (the CPU's sums), reading rows across the block in order.
__global__ void MeanRowsKernel(MeanRowsParams p) {
  Prologue();
  const int s = blockIdx.x;
  const int64_t i = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (i >= p.dim) return;
  const int64_t first = p.starts[s], end = p.starts[s + 1];
  double sum = 0.0;
  for (int64_t r = first; r < end; ++r) sum += p.x[r * p.dim + i];
  p.out[s * p.dim + i] = static_cast<float>(sum / static_cast<double>(end - first));
}

// The most head_dim a lane's accumulators hold (8 a lane).
constexpr int kMaxHeadDim = 256;

// One warp a (row, head): an online softmax over the sequence's keys, one key at a time (the
// dot product summed across the warp), each lane accumulating head_dim / 32 of the output.
__global__ void EncoderAttentionKernel(EncoderAttentionParams p) {
  Prologue();
  const int warps = blockDim.x / 32;
  const int64_t task = static_cast<int64_t>(blockIdx.x) * warps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (task >= p.rows * p.heads) return;
  const int64_t r = task / p.heads;
  const int h = static_cast<int>(task % p.heads);
  // The row's sequence: the last start at or before r.
  int lo = 0, hi = p.sequences;  // starts[lo] <= r < starts[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (p.starts[mid] <= r) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  const int64_t first = p.starts[lo], end = p.starts[lo + 1];
  const int64_t width = static_cast<int64_t>(p.heads) * p.head_dim;
  const float* q = p.q + r * width + h * p.head_dim;
  float acc[kMaxHeadDim / 32] = {};
  float max = -INFINITY, sum = 0.0f;
  for (int64_t j = first; j < end; ++j) {
    const float* k = p.k + j * width + h * p.head_dim;
    float dot = 0.0f;
    for (int d = lane; d < p.head_dim; d += 32) dot += q[d] * k[d];
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    const float s = p.scale * dot;
    const float next = fmaxf(max, s);
    const float rescale = __expf(max - next);  // 0 for the first key
    const float w = __expf(s - next);
    sum = sum * rescale + w;
    const float* v = p.v + j * width + h * p.head_dim;
    for (int i = 0, d = lane; d < p.head_dim; ++i, d += 32) acc[i] = acc[i] * rescale + w * v[d];
    max = next;
  }
  float* out = p.out + r * width + h * p.head_dim;
  for (int i = 0, d = lane; d < p.head_dim; ++i, d += 32) out[d] = acc[i] / sum;
}

unsigned Blocks(int64_t n, int threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

}  // namespace

void LaunchLayerNorm(const LayerNormParams& p, cudaStream_t stream, void* out_bf16) {
  if (p.rows == 0) return;
  LaunchDependent(LayerNormKernel, dim3(static_cast<unsigned>(p.rows)), dim3(256), 0, stream, p,
                  static_cast<__nv_bfloat16*>(out_bf16));
  GZ_CUDA_LAUNCHED();
}

void LaunchGelu(const GeluParams& p, cudaStream_t stream, void* out_bf16) {
  if (p.n == 0) return;
  LaunchDependent(GeluKernel, dim3(Blocks(p.n, 256)), dim3(256), 0, stream, p.x, p.n,
                  static_cast<__nv_bfloat16*>(out_bf16));
  GZ_CUDA_LAUNCHED();
}

void LaunchMeanRows(const MeanRowsParams& p, cudaStream_t stream) {
  if (p.sequences == 0) return;
  LaunchDependent(MeanRowsKernel, dim3(static_cast<unsigned>(p.sequences), Blocks(p.dim, 256)),
                  dim3(256), 0, stream, p);
  GZ_CUDA_LAUNCHED();
}

bool EncoderAttentionCovers(int head_dim) { return head_dim > 0 && head_dim <= kMaxHeadDim; }

void LaunchEncoderAttention(const EncoderAttentionParams& p, cudaStream_t stream) {
  if (p.rows == 0) return;
  constexpr int kWarps = 4;
  LaunchDependent(EncoderAttentionKernel, dim3(Blocks(p.rows * p.heads, kWarps)), dim3(kWarps * 32),
                  0, stream, p);
  GZ_CUDA_LAUNCHED();
}

}  // namespace gizllm::cuda
