// Linears: the streaming GEMV kernel for few rows and a tiled float32 GEMM for the rest (exact
// mode, float32 and float16 weights). Many-row bf16 products go to cuBLASLt (cublas_matmul.cu).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backend/cuda/kernels.cuh"
#include "backend/cuda/weight_loads.cuh"

namespace gizllm::cuda {
namespace {

constexpr int kGemvWarps = 8;
constexpr int kGemvUnroll = 4;  // 16-byte weight loads in flight per lane (8 measured slower)

// Up to three linears over the same input, issued as one launch: blocks [first_block[i],
// first_block[i + 1]) compute output i. With swiglu (two outputs), every block computes
// rows_per_block / 2 outputs of both linears (gate in the first half of its rows, up in the
// second) and writes silu(gate) * up to out[0].
template <typename T>
struct GemvSet {
  const T* w[MatmulParams::kMaxOutputs] = {};
  const float* bias[MatmulParams::kMaxOutputs] = {};
  float* out[MatmulParams::kMaxOutputs] = {};
  int64_t n[MatmulParams::kMaxOutputs] = {};
  unsigned first_block[MatmulParams::kMaxOutputs + 1] = {};
  int count = 0;
  bool accumulate = false;  // out += the product
  bool swiglu = false;
};

// Registers of the few-row kernels held to what five (one row) or four (two rows) blocks on each
// multiprocessor allow; left alone the compiler takes enough for only three.
template <int R>
constexpr int GemvMinBlocks() {
  return R == 1 ? 5 : R == 2 ? 4 : 1;
}

// out[r, j] = sum_k x[r, k] w[j, k] (+ bias[j]) for R rows. A block holds `rows_per_block`
// weight rows; the kGemvWarps / rows_per_block warps of one row split its inputs and add their
// parts in shared memory. kVec: cols is a multiple of the 16-byte pack (else scalar loads).
template <typename T, int R, bool kVec>
__global__ void __launch_bounds__(kGemvWarps * 32, GemvMinBlocks<R>())
    GemvKernel(const float* __restrict__ x,  // [R, cols]
               GemvSet<T> set, int64_t cols, int rows_per_block) {
  using P = Pack<T>;
  constexpr int E = P::kCount;
  __shared__ float parts[kGemvWarps][R];
  AllowDependentLaunch();  // the kernel after it may be scheduled now
  // The output this warp computes, picked with constant indices: indexing the parameter arrays
  // with a variable would copy the whole set to local memory in every thread.
  static_assert(MatmulParams::kMaxOutputs == 3);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int splits = kGemvWarps / rows_per_block;
  const int local = warp / splits, part = warp % splits;
  const int per_block = set.swiglu ? rows_per_block / 2 : rows_per_block;
  const bool in1 =
      set.swiglu ? local >= per_block : set.count > 1 && blockIdx.x >= set.first_block[1];
  const bool in2 = !set.swiglu && set.count > 2 && blockIdx.x >= set.first_block[2];
  const T* __restrict__ w = in2 ? set.w[2] : in1 ? set.w[1] : set.w[0];
  const int64_t n = in2 ? set.n[2] : in1 ? set.n[1] : set.n[0];
  const int64_t block = set.swiglu ? blockIdx.x
                                   : blockIdx.x - (in2   ? set.first_block[2]
                                                   : in1 ? set.first_block[1]
                                                         : 0u);
  const int64_t j = block * per_block + local % per_block;
  const bool active = j < n;
  const T* wj = w + j * cols;
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  if constexpr (kVec) {
    const int64_t packs = cols / E;
    const int64_t begin = packs * part / splits, end = packs * (part + 1) / splits;
    // The first weights are loaded before waiting for the kernel that writes x (programmatic
    // dependent launch): the weights do not depend on it, so their latency overlaps its tail.
    uint4 v[kGemvUnroll];
#pragma unroll
    for (int u = 0; u < kGemvUnroll; ++u) {
      int64_t c = begin + lane + 32 * u;
      if (active && c < end) v[u] = LoadStreaming(wj + c * E);
    }
    WaitForPriorGrid();
    for (int64_t c0 = begin + lane; active && c0 < end; c0 += 32 * kGemvUnroll) {
      if (c0 != begin + lane) {
#pragma unroll
        for (int u = 0; u < kGemvUnroll; ++u) {
          int64_t c = c0 + 32 * u;
          if (c < end) v[u] = LoadStreaming(wj + c * E);
        }
      }
#pragma unroll
      for (int u = 0; u < kGemvUnroll; ++u) {
        int64_t c = c0 + 32 * u;
        if (c < end) {
          float wf[E];
          P::Unpack(v[u], wf);
#pragma unroll
          for (int r = 0; r < R; ++r) {
            const float4* xr = reinterpret_cast<const float4*>(x + r * cols + c * E);
#pragma unroll
            for (int q = 0; q < E / 4; ++q) {
              float4 xv = __ldg(xr + q);
              acc[r] += wf[4 * q] * xv.x + wf[4 * q + 1] * xv.y + wf[4 * q + 2] * xv.z +
                        wf[4 * q + 3] * xv.w;
            }
          }
        }
      }
    }
  } else {
    WaitForPriorGrid();
    if (active) {
      int64_t begin = cols * part / splits, end = cols * (part + 1) / splits;
      for (int64_t c = begin + lane; c < end; c += 32) {
        float wf = ToFloat(wj[c]);
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] += wf * x[r * cols + c];
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float v = acc[r];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) parts[warp][r] = v;
  }
  __syncthreads();
  // The sum of a block row's parts.
  auto total = [&](int row_in_block, int r) {
    float sum = 0.0f;
    for (int s = 0; s < splits; ++s) sum += parts[row_in_block * splits + s][r];
    return sum;
  };
  for (int t = threadIdx.x; t < per_block * R; t += blockDim.x) {
    const int lo = t / R, r = t % R;
    const int64_t jj = block * per_block + lo;
    if (set.swiglu) {
      if (jj >= set.n[0]) continue;
      float g = total(lo, r) + (set.bias[0] ? set.bias[0][jj] : 0.0f);
      float u = total(lo + per_block, r) + (set.bias[1] ? set.bias[1][jj] : 0.0f);
      set.out[0][r * set.n[0] + jj] = g / (1.0f + expf(-g)) * u;
      continue;
    }
    if (jj >= n) continue;
    float* out = (in2 ? set.out[2] : in1 ? set.out[1] : set.out[0]) + r * n + jj;
    const float* bias = in2 ? set.bias[2] : in1 ? set.bias[1] : set.bias[0];
    float sum = total(lo, r) + (bias ? bias[jj] : 0.0f);
    *out = set.accumulate ? *out + sum : sum;
  }
}

// The outputs of one GEMV launch: weights of one format and the same cols.
struct GemvJob {
  const float* x;
  int64_t cols;
  int count;
  const Weight* w[MatmulParams::kMaxOutputs];
  const float* bias[MatmulParams::kMaxOutputs];
  float* out[MatmulParams::kMaxOutputs];
  bool accumulate, swiglu;
};

bool GemvVec(const GemvJob& job, int pack) {
  bool vec = job.cols % pack == 0 && reinterpret_cast<uintptr_t>(job.x) % 16 == 0;
  for (int i = 0; i < job.count; ++i)
    vec = vec && reinterpret_cast<uintptr_t>(job.w[i]->data) % 16 == 0;
  return vec;
}

// Resident blocks of a GEMV kernel on one multiprocessor.
template <typename T, int R, bool kVec>
int GemvOccupancy() {
  static const int blocks = [] {
    int b = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, GemvKernel<T, R, kVec>, kGemvWarps * 32,
                                                      0) != cudaSuccess) {
      cudaGetLastError();
      b = 1;
    }
    return b > 0 ? b : 1;
  }();
  return blocks;
}

// Weight rows per block. Blocks run in waves of `capacity` (the resident blocks of the device);
// a block's warps each read rows_per_block / kGemvWarps of a row in rounds of kGemvUnroll loads,
// plus about a round and a half of start, reduction and exit. The choice with the fewest rounds
// over all waves: the matrices of few rows (q/k/v, o) then fill one wave instead of leaving a
// nearly empty second one, and the large ones keep whole rows per warp.
int GemvRowsPerBlock(const GemvJob& job, int64_t capacity, int elements_per_round) {
  int best = kGemvWarps;
  double best_cost = 0.0;
  for (int rpb = kGemvWarps; rpb >= (job.swiglu ? 2 : 1); rpb /= 2) {
    int64_t blocks = 0;
    if (job.swiglu) {
      blocks = (job.w[0]->rows + rpb / 2 - 1) / (rpb / 2);
    } else {
      for (int i = 0; i < job.count; ++i) blocks += (job.w[i]->rows + rpb - 1) / rpb;
    }
    const int64_t waves = (blocks + capacity - 1) / capacity;
    const int64_t per_warp = job.cols * rpb / kGemvWarps;
    const int64_t rounds = (per_warp + elements_per_round - 1) / elements_per_round;
    const double cost = static_cast<double>(waves) * (static_cast<double>(rounds) + 1.5);
    if (rpb == kGemvWarps || cost < best_cost) {
      best = rpb;
      best_cost = cost;
    }
  }
  return best;
}

template <typename T, int R, bool kVec>
void GemvLaunch(const GemvJob& job, int sm_count, cudaStream_t stream) {
  const int64_t capacity = static_cast<int64_t>(GemvOccupancy<T, R, kVec>()) * sm_count;
  const int rows_per_block =
      GemvRowsPerBlock(job, capacity, 32 * kGemvUnroll * (kVec ? Pack<T>::kCount : 1));
  GemvSet<T> set;
  set.count = job.count;
  set.accumulate = job.accumulate;
  set.swiglu = job.swiglu;
  unsigned blocks = 0;
  for (int i = 0; i < job.count; ++i) {
    set.w[i] = static_cast<const T*>(job.w[i]->data);
    set.bias[i] = job.bias[i];
    set.out[i] = job.out[i];
    set.n[i] = job.w[i]->rows;
    set.first_block[i] = blocks;
    if (!job.swiglu)
      blocks += static_cast<unsigned>((job.w[i]->rows + rows_per_block - 1) / rows_per_block);
  }
  if (job.swiglu) {
    const int per_block = rows_per_block / 2;
    blocks = static_cast<unsigned>((job.w[0]->rows + per_block - 1) / per_block);
  }
  set.first_block[job.count] = blocks;
  // Launched as a programmatic dependent of the kernel before it; the kernel waits for that grid
  // before it reads x.
  LaunchDependent(GemvKernel<T, R, kVec>, dim3(blocks), dim3(kGemvWarps * 32), 0, stream, job.x,
                  set, job.cols, rows_per_block);
}

template <typename T, int R>
void GemvFor(const GemvJob& job, int sm_count, cudaStream_t stream) {
  if (GemvVec(job, Pack<T>::kCount)) {
    GemvLaunch<T, R, true>(job, sm_count, stream);
  } else {
    GemvLaunch<T, R, false>(job, sm_count, stream);
  }
}

template <typename T>
void GemvRows(const GemvJob& job, int64_t rows, int sm_count, cudaStream_t stream) {
  switch (rows) {
    case 1:
      return GemvFor<T, 1>(job, sm_count, stream);
    case 2:
      return GemvFor<T, 2>(job, sm_count, stream);
    case 3:
      return GemvFor<T, 3>(job, sm_count, stream);
    case 4:
      return GemvFor<T, 4>(job, sm_count, stream);
    case 5:
      return GemvFor<T, 5>(job, sm_count, stream);
    case 6:
      return GemvFor<T, 6>(job, sm_count, stream);
    case 7:
      return GemvFor<T, 7>(job, sm_count, stream);
    case 8:
      return GemvFor<T, 8>(job, sm_count, stream);
    default:
      break;
  }
  // More rows: pieces of 8 (each piece reads the weights again).
  for (int64_t r0 = 0; r0 < rows; r0 += 8) {
    int64_t piece = rows - r0 < 8 ? rows - r0 : 8;
    GemvJob part = job;
    part.x = job.x + r0 * job.cols;
    for (int i = 0; i < job.count; ++i) part.out[i] = job.out[i] + r0 * job.w[i]->rows;
    GemvRows<T>(part, piece, sm_count, stream);
  }
}

// Tiled float32 GEMM: a block computes a 64x64 tile of out with 256 threads, 4x4 each.
constexpr int kTile = 64, kDepth = 16;

template <typename T>
__global__ void __launch_bounds__(256)
    GemmF32Kernel(const float* __restrict__ x,     // [rows, cols]
                  const T* __restrict__ w,         // [n, cols]
                  const float* __restrict__ bias,  // [n] or null
                  float* __restrict__ out,         // [rows, n]
                  int64_t rows, int64_t n, int64_t cols, bool accumulate) {
  __shared__ float xs[kDepth][kTile + 4];  // [k][row]
  __shared__ float ws[kDepth][kTile + 4];  // [k][output]
  int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  int64_t row0 = static_cast<int64_t>(blockIdx.y) * kTile;
  int64_t col0 = static_cast<int64_t>(blockIdx.x) * kTile;
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < cols; k0 += kDepth) {
    // 64 x 16 values of each operand; 256 threads load 4 each.
    for (int t = threadIdx.x; t < kTile * kDepth; t += 256) {
      int i = t / kDepth, k = t % kDepth;
      int64_t kk = k0 + k;
      int64_t xr = row0 + i, wr = col0 + i;
      xs[k][i] = (xr < rows && kk < cols) ? x[xr * cols + kk] : 0.0f;
      ws[k][i] = (wr < n && kk < cols) ? ToFloat(w[wr * cols + kk]) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kDepth; ++k) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        a[i] = xs[k][ty * 4 + i];
        b[i] = ws[k][tx * 4 + i];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) acc[i][jj] += a[i] * b[jj];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    int64_t r = row0 + ty * 4 + i;
    if (r >= rows) continue;
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
      int64_t c = col0 + tx * 4 + jj;
      if (c < n) {
        float v = acc[i][jj] + (bias ? bias[c] : 0.0f);
        out[r * n + c] = accumulate ? out[r * n + c] + v : v;
      }
    }
  }
}

template <typename T>
void GemmFor(const float* x, int64_t rows, const Weight& w, const float* bias, float* out,
             bool accumulate, cudaStream_t stream) {
  dim3 grid(static_cast<unsigned>((w.rows + kTile - 1) / kTile),
            static_cast<unsigned>((rows + kTile - 1) / kTile));
  GemmF32Kernel<T><<<grid, 256, 0, stream>>>(x, static_cast<const T*>(w.data), bias, out, rows,
                                             w.rows, w.cols, accumulate);
  GZ_CUDA_LAUNCHED();
}

[[noreturn]] void Unsupported(const Weight& w) {
  std::fprintf(stderr, "cuda Matmul: weight format %s has no CUDA kernel\n",
               FormatName(w.format).c_str());
  std::abort();
}

}  // namespace

bool GemvCovers(const MatmulParams& p) {
  if (p.norm) return false;
  for (int i = 0; i < p.outputs; ++i) {
    const Format f = p.w[i]->format;
    if (f != Format::kBf16 && f != Format::kF16 && f != Format::kF32) return false;
    // SwiGLU pairs the rows of both outputs in one launch.
    if (p.swiglu && f != p.w[0]->format) return false;
  }
  return true;
}

void LaunchGemv(const MatmulParams& p, int sm_count, cudaStream_t stream) {
  if (p.rows == 0) return;
  // One launch for each run of outputs with the same weight format (usually all of them).
  for (int first = 0; first < p.outputs;) {
    GemvJob job{p.x, p.w[first]->cols, 0, {}, {}, {}, p.accumulate, p.swiglu};
    int end = first;
    while (end < p.outputs && p.w[end]->format == p.w[first]->format) {
      job.w[job.count] = p.w[end];
      job.bias[job.count] = p.bias[end];
      job.out[job.count] = p.out[end];
      ++job.count;
      ++end;
    }
    switch (p.w[first]->format) {
      case Format::kBf16:
        GemvRows<__nv_bfloat16>(job, p.rows, sm_count, stream);
        break;
      case Format::kF16:
        GemvRows<__half>(job, p.rows, sm_count, stream);
        break;
      case Format::kF32:
        GemvRows<float>(job, p.rows, sm_count, stream);
        break;
      default:
        Unsupported(*p.w[first]);
    }
    first = end;
  }
}

void LaunchGemmF32(const float* x, int64_t rows, const Weight& w, const float* bias, float* out,
                   bool accumulate, cudaStream_t stream) {
  if (rows == 0) return;
  switch (w.format) {
    case Format::kBf16:
      return GemmFor<__nv_bfloat16>(x, rows, w, bias, out, accumulate, stream);
    case Format::kF16:
      return GemmFor<__half>(x, rows, w, bias, out, accumulate, stream);
    case Format::kF32:
      return GemmFor<float>(x, rows, w, bias, out, accumulate, stream);
    default:
      Unsupported(w);
  }
}

}  // namespace gizllm::cuda
