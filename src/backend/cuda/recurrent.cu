// The recurrent (linear-attention) layers' ops of Qwen3-Next and Qwen3.5: the causal
// convolution, the L2 norm of q and k, the gated delta rule and the gated RMSNorm; and the
// gated add that ends their mixtures' shared expert.
//
// The convolution and the delta rule carry each slot's state across rows: a step's rows of one
// slot are adjacent at consecutive positions (a run). Their kernels give one block to each
// candidate run start (every row; a block whose row continues the row before it returns at
// once), and that block walks its run's rows in order, holding the state in registers, so a
// step needs no host-side description of its runs and can be recorded as a CUDA graph.
//
// The delta rule is separable by columns of the state S [k_dim, v_dim]: column j's update reads
// only S[:, j], k, q, v_j, the decay and beta. A warp owns 32 columns of one value head, each
// lane one column of k_dim values in registers; k and q of the row go through shared memory.
// Each row is the recurrence itself (decay, S^T k, the delta, the rank-one update, S^T q), so a
// prompt read whole equals the same prompt a row at a time up to float32 rounding; the CPU's
// chunked form equals it the same way.
#include <cstdio>
#include <cstdlib>

#include "backend/cuda/kernels.cuh"

namespace gizllm::cuda {
namespace {

__device__ __forceinline__ void Prologue() {
  AllowDependentLaunch();
  WaitForPriorGrid();
}

__device__ __forceinline__ float Silu(float x) { return x / (1.0f + expf(-x)); }

// Whether row r starts a run (its slot differs from the row before it).
__device__ __forceinline__ bool RunStart(const int32_t* slots, int64_t r) {
  return r == 0 || slots[r - 1] != slots[r];
}

// grid (rows, channel blocks of 256): the block of a run start walks the run's rows.
template <int kKernel>
__global__ void CausalConvKernel(CausalConvParams p) {
  Prologue();
  constexpr int kTail = kKernel - 1;
  const int64_t r0 = blockIdx.x;
  const int64_t c = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (!RunStart(p.slots, r0) || c >= p.channels) return;
  const int32_t slot = p.slots[r0];
  float* state = p.states + static_cast<int64_t>(slot) * kTail * p.channels;
  float w[kKernel], window[kTail];  // window: the last kTail inputs, oldest first
#pragma unroll
  for (int j = 0; j < kKernel; ++j) w[j] = p.weight[c * kKernel + j];
  const bool fresh = p.positions[r0] == 0;
#pragma unroll
  for (int j = 0; j < kTail; ++j) window[j] = fresh ? 0.0f : state[j * p.channels + c];
  for (int64_t r = r0; r < p.rows && p.slots[r] == slot; ++r) {
    float* x = p.x + r * p.row_stride + c;
    const float now = *x;
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kTail; ++j) sum += w[j] * window[j];
    sum += w[kTail] * now;
    *x = Silu(sum);
#pragma unroll
    for (int j = 0; j + 1 < kTail; ++j) window[j] = window[j + 1];
    window[kTail - 1] = now;
  }
#pragma unroll
  for (int j = 0; j < kTail; ++j) state[j * p.channels + c] = window[j];
}

// One warp a (row, head).
__global__ void L2NormKernel(L2NormParams p) {
  Prologue();
  const int64_t item = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (item >= p.rows * p.heads) return;
  const int64_t r = item / p.heads;
  float* x = p.x + r * p.row_stride + (item % p.heads) * p.dim;
  float ss = 0.0f;
  for (int i = lane; i < p.dim; i += 32) ss += x[i] * x[i];
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  const float inv = rsqrtf(ss + p.eps);
  for (int i = lane; i < p.dim; i += 32) x[i] *= inv;
}

// One warp a group.
__global__ void GatedRmsNormKernel(GatedRmsNormParams p) {
  Prologue();
  const int64_t g = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (g >= p.groups) return;
  const float* x = p.x + g * p.dim;
  const float* z = p.z + g * p.dim;
  float* out = p.out + g * p.dim;
  float ss = 0.0f;
  for (int64_t i = lane; i < p.dim; i += 32) ss += x[i] * x[i];
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  const float inv = rsqrtf(ss / static_cast<float>(p.dim) + p.eps);
  for (int64_t i = lane; i < p.dim; i += 32) out[i] = p.weight[i] * (x[i] * inv) * Silu(z[i]);
}

// grid (rows, v_heads, column blocks of 32), one warp a block: lane j owns column
// blockIdx.z * 32 + j of head blockIdx.y's state.
template <int kKd>
__global__ void __launch_bounds__(32) GatedDeltaRuleKernel(GatedDeltaRuleParams p) {
  Prologue();
  const int64_t r0 = blockIdx.x;
  if (!RunStart(p.slots, r0)) return;
  const int h = blockIdx.y;
  const int lane = threadIdx.x;
  const int64_t j = static_cast<int64_t>(blockIdx.z) * 32 + lane;
  const bool active = j < p.v_dim;
  const int64_t vd = p.v_dim;
  const int64_t kh = h / (p.v_heads / p.k_heads);
  __shared__ float sk[kKd], sq[kKd];
  const int32_t slot = p.slots[r0];
  float* st = p.states + (static_cast<int64_t>(slot) * p.v_heads + h) * kKd * vd;
  const bool fresh = p.positions[r0] == 0;
  float s[kKd];
#pragma unroll
  for (int i = 0; i < kKd; ++i) s[i] = active && !fresh ? st[i * vd + j] : 0.0f;
  const float a_scale = expf(p.a_log[h]);
  const float dt_bias = p.dt_bias[h];
  for (int64_t r = r0; r < p.rows && p.slots[r] == slot; ++r) {
    const float* q = p.q + r * p.qk_stride + kh * kKd;
    const float* k = p.k + r * p.qk_stride + kh * kKd;
    for (int i = lane; i < kKd; i += 32) {
      sk[i] = k[i];
      sq[i] = q[i];
    }
    __syncwarp();
    const float x = p.a[r * p.ab_stride + h] + dt_bias;
    const float softplus = x > 20.0f ? x : log1pf(expf(x));
    const float decay = expf(-a_scale * softplus);
    const float beta = 1.0f / (1.0f + expf(-p.b[r * p.ab_stride + h]));
    float kv = 0.0f;
#pragma unroll
    for (int i = 0; i < kKd; ++i) {
      s[i] *= decay;
      kv += s[i] * sk[i];
    }
    const float v = active ? p.v[r * p.v_stride + h * vd + j] : 0.0f;
    const float delta = beta * (v - kv);
    float o = 0.0f;
#pragma unroll
    for (int i = 0; i < kKd; ++i) {
      s[i] += sk[i] * delta;
      o += s[i] * sq[i];
    }
    if (active) p.out[(r * p.v_heads + h) * vd + j] = o * p.scale;
    __syncwarp();  // every lane has read sk and sq before the next row's
  }
  if (!active) return;
#pragma unroll
  for (int i = 0; i < kKd; ++i) st[i * vd + j] = s[i];
}

unsigned CeilDiv(int64_t n, int per) { return static_cast<unsigned>((n + per - 1) / per); }

// out[r, c] += sigmoid(scale[r]) * y[r, c] (scale null: + y).
__global__ void GatedAddKernel(float* out, const float* y, const float* scale, int64_t rows,
                               int64_t dim) {
  Prologue();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * dim) return;
  const float g = scale ? 1.0f / (1.0f + expf(-scale[i / dim])) : 1.0f;
  out[i] += g * y[i];
}

[[noreturn]] void Refuse(const char* what) {
  std::fprintf(stderr, "cuda %s\n", what);
  std::abort();
}

}  // namespace

Status CheckRecurrentShape(int k_dim, int v_dim, int kernel) {
  if (k_dim != 16 && k_dim != 32 && k_dim != 64 && k_dim != 128)
    return Unimplemented("cuda: recurrent layers with a key head of " + std::to_string(k_dim) +
                         " have no kernel (16, 32, 64 or 128)");
  if (v_dim < 1 || v_dim > 1024)
    return Unimplemented("cuda: recurrent layers with a value head of " + std::to_string(v_dim) +
                         " have no kernel (at most 1024)");
  if (kernel < 2 || kernel > 8)
    return Unimplemented("cuda: a causal convolution of " + std::to_string(kernel) +
                         " taps has no kernel (2 to 8)");
  return Status::Ok();
}

void LaunchCausalConv(const CausalConvParams& p, cudaStream_t stream) {
  if (p.rows == 0 || p.channels == 0) return;
  const dim3 grid(static_cast<unsigned>(p.rows), static_cast<unsigned>(CeilDiv(p.channels, 256)));
  switch (p.kernel) {
    case 2: LaunchDependent(CausalConvKernel<2>, grid, dim3(256), 0, stream, p); break;
    case 3: LaunchDependent(CausalConvKernel<3>, grid, dim3(256), 0, stream, p); break;
    case 4: LaunchDependent(CausalConvKernel<4>, grid, dim3(256), 0, stream, p); break;
    case 5: LaunchDependent(CausalConvKernel<5>, grid, dim3(256), 0, stream, p); break;
    case 6: LaunchDependent(CausalConvKernel<6>, grid, dim3(256), 0, stream, p); break;
    case 7: LaunchDependent(CausalConvKernel<7>, grid, dim3(256), 0, stream, p); break;
    case 8: LaunchDependent(CausalConvKernel<8>, grid, dim3(256), 0, stream, p); break;
    default: Refuse("CausalConv: a kernel of 2 to 8 taps");
  }
  GZ_CUDA_LAUNCHED();
}

void LaunchL2Norm(const L2NormParams& p, cudaStream_t stream) {
  const int64_t items = p.rows * p.heads;
  if (items == 0) return;
  LaunchDependent(L2NormKernel, dim3(CeilDiv(items, 8)), dim3(256), 0, stream, p);
  GZ_CUDA_LAUNCHED();
}

void LaunchGatedDeltaRule(const GatedDeltaRuleParams& p, cudaStream_t stream) {
  if (p.rows == 0) return;
  const dim3 grid(static_cast<unsigned>(p.rows), static_cast<unsigned>(p.v_heads),
                  static_cast<unsigned>(CeilDiv(p.v_dim, 32)));
  switch (p.k_dim) {
    case 16: LaunchDependent(GatedDeltaRuleKernel<16>, grid, dim3(32), 0, stream, p); break;
    case 32: LaunchDependent(GatedDeltaRuleKernel<32>, grid, dim3(32), 0, stream, p); break;
    case 64: LaunchDependent(GatedDeltaRuleKernel<64>, grid, dim3(32), 0, stream, p); break;
    case 128: LaunchDependent(GatedDeltaRuleKernel<128>, grid, dim3(32), 0, stream, p); break;
    default: Refuse("GatedDeltaRule: a key head of 16, 32, 64 or 128");
  }
  GZ_CUDA_LAUNCHED();
}

void LaunchGatedAdd(float* out, const float* y, const float* scale, int64_t rows, int64_t dim,
                    cudaStream_t stream) {
  if (rows * dim == 0) return;
  LaunchDependent(GatedAddKernel, dim3(CeilDiv(rows * dim, 256)), dim3(256), 0, stream, out, y,
                  scale, rows, dim);
  GZ_CUDA_LAUNCHED();
}

void LaunchGatedRmsNorm(const GatedRmsNormParams& p, cudaStream_t stream) {
  if (p.groups == 0) return;
  LaunchDependent(GatedRmsNormKernel, dim3(CeilDiv(p.groups, 8)), dim3(256), 0, stream, p);
  GZ_CUDA_LAUNCHED();
}

}  // namespace gizllm::cuda
