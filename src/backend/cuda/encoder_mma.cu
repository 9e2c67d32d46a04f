// Tensor-core encoder attention for the fast mode (fp16 operands, float32 softmax and
// accumulators): bidirectional attention within each sequence of a packed batch, S = Q K^T and
// O += P V on mma.sync m16n8k16 (the fragments of attention_mma.cu's tile kernel, mma.cuh).
// Exact mode keeps encoder.cu's float32 kernel.
//
// Keys and values are rounded to fp16 once a call, by a pass of their own, into a scratch laid
// out [heads, rows, HD] (zero past head_dim): the attention kernel then copies fp16 key and value
// tiles straight into shared memory with cp.async, two tiles in flight. (Rounding them in every
// block, as each block read the float32 keys of its head, cost a quarter of the time of the
// tower's attention at Qwen3-VL's shapes.)
//
// A block is (tile of kTileQ consecutive rows of the packed batch, head), one m16 tile of rows
// per warp. A tile may hold the end of one sequence and the start of the next: each row sees
// the keys [starts[s], starts[s + 1]) of its own sequence s, so the block walks the union of its
// rows' key ranges kTileK keys at a time, a warp skips a key tile none of its rows sees, and
// only the tiles that cross a sequence bound of the warp's rows are masked. Sequences of one
// length L packed back to back cost the product of the L x L blocks and at most one key tile
// more per warp and bound; short sequences (a few tokens) share tiles and most of the product
// is masked, which costs little beside their linears.
//
// head_dim a multiple of 4 up to 128 (float4 reads of q), padded with zeros to the instantiated
// HD (32, 64, 80, 96, 128: Qwen3-VL's 72 runs as 80); q 16-byte aligned. Other shapes take the
// float32 kernel (EncoderAttentionMmaCovers).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "backend/cuda/kernels.cuh"
#include "backend/cuda/mma.cuh"

namespace gizllm::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kTileQ = 16 * kWarps;  // rows per block
constexpr int kTileK = 64;           // keys per step: eight n8 tiles of S
constexpr int kPad = 8;              // a shared key row is HD + 8 fp16: conflict-free ldmatrix
constexpr int kStages = 2;           // key and value tiles in flight

// Dynamic shared memory: kStages fp16 tiles of keys and values (45 KB at HD 80, 70 KB at 128).
template <int HD>
constexpr size_t EncoderMmaSharedBytes() {
  return static_cast<size_t>(kStages) * 2 * kTileK * (HD + kPad) * 2;
}

// The instantiated width for head_dim.
int PaddedHeadDim(int head_dim) {
  if (head_dim <= 32) return 32;
  if (head_dim <= 64) return 64;
  if (head_dim <= 80) return 80;
  if (head_dim <= 96) return 96;
  return 128;
}

// k16[h, r, d], v16[h, r, d] = k, v [r, h * head_dim + d] rounded to fp16, zero for d >= head_dim
// up to hd_padded; a thread per 8 dimensions (one 16-byte store each).
__global__ void EncoderKv16Kernel(EncoderAttentionParams p, int hd_padded, __half* k16,
                                  __half* v16) {
  AllowDependentLaunch();
  WaitForPriorGrid();
  const int pieces = hd_padded / 8;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.rows * p.heads * pieces) return;
  const int d = static_cast<int>(i % pieces) * 8;
  const int64_t rh = i / pieces;  // head * rows + row
  const int64_t r = rh % p.rows;
  const int head = static_cast<int>(rh / p.rows);
  const int64_t at = r * p.heads * p.head_dim + static_cast<int64_t>(head) * p.head_dim + d;
  uint32_t k[4] = {0, 0, 0, 0}, v[4] = {0, 0, 0, 0};
#pragma unroll
  for (int e = 0; e < 8; e += 4) {
    if (d + e >= p.head_dim) break;  // head_dim is a multiple of 4
    const float4 a = *reinterpret_cast<const float4*>(p.k + at + e);
    const float4 b = *reinterpret_cast<const float4*>(p.v + at + e);
    k[e / 2] = PackHalf(a.x, a.y), k[e / 2 + 1] = PackHalf(a.z, a.w);
    v[e / 2] = PackHalf(b.x, b.y), v[e / 2 + 1] = PackHalf(b.z, b.w);
  }
  const int64_t to = rh * hd_padded + d;
  *reinterpret_cast<uint4*>(k16 + to) = make_uint4(k[0], k[1], k[2], k[3]);
  *reinterpret_cast<uint4*>(v16 + to) = make_uint4(v[0], v[1], v[2], v[3]);
}

// The sequence of row r: [first, end) = [starts[s], starts[s + 1]) with starts[s] <= r.
__device__ __forceinline__ void SequenceOf(const int32_t* starts, int sequences, int64_t r,
                                           int32_t* first, int32_t* end) {
  int lo = 0, hi = sequences;  // starts[lo] <= r < starts[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (starts[mid] <= r) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  *first = starts[lo];
  *end = starts[lo + 1];
}

// out16: where not null, out rounded to bf16 as well ([rows, heads, head_dim]), for the
// output projection that reads it next. k16, v16: EncoderKv16Kernel's.
template <int HD>
__global__ void __launch_bounds__(32 * kWarps, 3)
    EncoderMmaKernel(EncoderAttentionParams p, __nv_bfloat16* out16, const __half* k16,
                     const __half* v16) {
  static_assert(HD % 16 == 0 && HD <= 128, "HD: a multiple of 16 up to 128");
  AllowDependentLaunch();
  WaitForPriorGrid();
  constexpr int kThreads = 32 * kWarps;
  constexpr int kSteps = HD / 16;                      // k16 steps of S = Q K^T; also n16 pairs of O
  constexpr int kOutTiles = HD / 8;                    // n8 tiles of O
  constexpr int kRow = HD + kPad;                      // fp16 per shared key row
  constexpr int kChunks = HD / 8;                      // 16-byte pieces of a key row
  constexpr int kLoads = kTileK * kChunks / kThreads;  // pieces of K (and of V) per thread
  static_assert(kTileK * kChunks % kThreads == 0, "whole 16-byte pieces per thread");
  extern __shared__ __align__(16) __half tiles[];  // [kStages][K, V][kTileK, kRow]
  __shared__ int32_t s_first[kTileQ], s_end[kTileQ];

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int head = blockIdx.y;
  const int hd = p.head_dim;  // <= HD; dimensions past it are zeros
  const int64_t width = static_cast<int64_t>(p.heads) * hd;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kTileQ;
  const int rows_here = static_cast<int>(p.rows - r0 < kTileQ ? p.rows - r0 : kTileQ);
  for (int i = threadIdx.x; i < rows_here; i += kThreads)
    SequenceOf(p.starts, p.sequences, r0 + i, &s_first[i], &s_end[i]);
  __syncthreads();
  // The keys any row of the block sees: its first row's sequence to its last row's.
  const int32_t kbegin = s_first[0], kend = s_end[rows_here - 1];

  // This lane's two rows: fragment rows g (half 0) and g + 8 (half 1) of the warp's, and the
  // keys each sees ([first, last]; none where the row is past the batch: first > last).
  int row[2];
  int32_t first[2], last[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    row[h] = warp * 16 + g + 8 * h;
    const bool valid = row[h] < rows_here;
    first[h] = valid ? s_first[row[h]] : INT32_MAX;
    last[h] = valid ? s_end[row[h]] - 1 : -1;
    if (!valid) row[h] = -1;
  }
  const int32_t warp_first = __reduce_min_sync(0xffffffffu, min(first[0], first[1]));
  const int32_t warp_last = __reduce_max_sync(0xffffffffu, max(last[0], last[1]));
  // Keys [all_from, all_to] are seen by every row of the warp: tiles inside need no mask.
  const int32_t all_from = __reduce_max_sync(0xffffffffu, max(first[0], first[1]));
  const int32_t all_to = __reduce_min_sync(0xffffffffu, min(last[0], last[1]));

  // Q as A fragments, scaled for exp2 and rounded to fp16 once: qf[kk] covers dimensions
  // 16 kk .. 16 kk + 15, register h + 2c holds half h, dimensions 16 kk + 8c + 2t, +1.
  uint32_t qf[kSteps][4];
  const float qscale = p.scale * kLog2e;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float* src = row[h] >= 0 ? p.q + (r0 + row[h]) * width + head * hd : nullptr;
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int d = 16 * kk + 8 * c + 2 * t;
        float2 x =
            src && d < hd ? *reinterpret_cast<const float2*>(src + d) : make_float2(0.0f, 0.0f);
        qf[kk][h + 2 * c] = PackHalf(x.x * qscale, x.y * qscale);
      }
    }
  }

  OnlineSoftmax<kOutTiles> softmax;
  softmax.Start();
  // ldmatrix row addresses of K's and V's 16 x 16 blocks (rows = keys).
  const LdMatrixLane k_lane = LdMatrixLaneColumnsFirst(lane);
  const LdMatrixLane v_lane = LdMatrixLaneRowsFirst(lane);

  // The block's threads copy key tile k0's fp16 keys and values of this head into stage
  // `stage`; keys past the block's, zeros (a masked key's probability is 0, and 0 times a stale
  // NaN is not). Piece c of a thread is 16-byte piece i % kChunks of key i / kChunks,
  // i = threadIdx.x + c * kThreads: a warp reads whole keys.
  const __half* head_k = k16 + static_cast<int64_t>(head) * p.rows * HD;
  const __half* head_v = v16 + static_cast<int64_t>(head) * p.rows * HD;
  auto fetch = [&](int stage, int32_t k0) {
    __half* ks = tiles + stage * 2 * kTileK * kRow;
    __half* vs = ks + kTileK * kRow;
#pragma unroll
    for (int c = 0; c < kLoads; ++c) {
      const int i = threadIdx.x + c * kThreads;
      const int32_t j = k0 + i / kChunks;
      const int d = i % kChunks * 8;
      const int at = i / kChunks * kRow + d;
      const bool in = j < kend;
      const int64_t from = (in ? static_cast<int64_t>(j) : 0) * HD + d;
      CpAsync16Fill(ks + at, head_k + from, in ? 16 : 0);
      CpAsync16Fill(vs + at, head_v + from, in ? 16 : 0);
    }
    CpAsyncCommit();
  };

  int stage = 0;
  fetch(0, kbegin);
  for (int32_t k0 = kbegin; k0 < kend; k0 += kTileK) {
    if (k0 + kTileK < kend) {
      fetch(stage ^ 1, k0 + kTileK);
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();
    const __half* ks = tiles + stage * 2 * kTileK * kRow;
    const __half* vs = ks + kTileK * kRow;

    // Warp-uniform: skip a tile none of the warp's rows sees.
    if (k0 <= warp_last && k0 + kTileK > warp_first) {
      // S = Q K^T over the tile: s[n] is the C fragment of keys k0 + 8n .. k0 + 8n + 7.
      float s[kTileK / 8][4];
#pragma unroll
      for (int n = 0; n < kTileK / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kSteps; ++kk) AddScores(s, qf[kk], ks + 16 * kk, kRow, k_lane);
      // The mask by sequence bounds (warp-uniform: only tiles that cross one), then the online
      // softmax of each half, and O += P V.
      if (k0 < all_from || k0 + kTileK - 1 > all_to) {
#pragma unroll
        for (int n = 0; n < kTileK / 8; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int32_t j = k0 + 8 * n + 2 * t + e % 2;
            if (j < first[e / 2] || j > last[e / 2]) s[n][e] = -INFINITY;
          }
        }
      }
      softmax.Update(s);
      softmax.AddPv(s, vs, kRow, v_lane);
    }
    __syncthreads();  // every warp is done with this stage before the next fetch refills it
    stage ^= 1;
  }

  // out = O / l for this lane's rows (each sees at least its own key: l > 0).
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float sum = softmax.RowSum(h);
    if (row[h] < 0) continue;
    const int64_t at = (r0 + row[h]) * width + head * hd;
    const float inv = 1.0f / sum;
#pragma unroll
    for (int n = 0; n < kOutTiles; ++n) {
      const int d = 8 * n + 2 * t;
      if (d >= hd) continue;
      const float2 y = make_float2(softmax.o[n][2 * h] * inv, softmax.o[n][2 * h + 1] * inv);
      *reinterpret_cast<float2*>(p.out + at + d) = y;
      if (out16) *reinterpret_cast<__nv_bfloat162*>(out16 + at + d) = __float22bfloat162_rn(y);
    }
  }
}

template <int HD>
void Launch(const EncoderAttentionParams& p, void* out16, __half* k16, __half* v16,
            cudaStream_t stream) {
  constexpr size_t kShared = EncoderMmaSharedBytes<HD>();
  static const bool raised =
      cudaFuncSetAttribute(EncoderMmaKernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(kShared)) == cudaSuccess;
  (void)raised;
  const int64_t pieces = p.rows * p.heads * (HD / 8);
  LaunchDependent(EncoderKv16Kernel, dim3(static_cast<unsigned>((pieces + 255) / 256)), dim3(256),
                  0, stream, p, HD, k16, v16);
  GZ_CUDA_LAUNCHED();
  const dim3 grid(static_cast<unsigned>((p.rows + kTileQ - 1) / kTileQ),
                  static_cast<unsigned>(p.heads));
  LaunchDependent(EncoderMmaKernel<HD>, grid, dim3(32 * kWarps), kShared, stream, p,
                  static_cast<__nv_bfloat16*>(out16), static_cast<const __half*>(k16),
                  static_cast<const __half*>(v16));
  GZ_CUDA_LAUNCHED();
}

bool Aligned16(const void* x) { return reinterpret_cast<uintptr_t>(x) % 16 == 0; }

}  // namespace

bool EncoderAttentionMmaCovers(const EncoderAttentionParams& p) {
  return p.head_dim > 0 && p.head_dim <= 128 && p.head_dim % 4 == 0 && Aligned16(p.q) &&
         Aligned16(p.k) && Aligned16(p.v) && Aligned16(p.out);
}

size_t EncoderAttentionMmaScratchBytes(const EncoderAttentionParams& p) {
  return 2 * static_cast<size_t>(p.rows) * p.heads * PaddedHeadDim(p.head_dim) * sizeof(__half);
}

void LaunchEncoderAttentionMma(const EncoderAttentionParams& p, void* out16, void* scratch,
                               cudaStream_t stream) {
  if (p.rows == 0) return;
  const int hd = PaddedHeadDim(p.head_dim);
  __half* k16 = static_cast<__half*>(scratch);
  __half* v16 = k16 + static_cast<int64_t>(p.rows) * p.heads * hd;
  switch (hd) {
    case 32: return Launch<32>(p, out16, k16, v16, stream);
    case 64: return Launch<64>(p, out16, k16, v16, stream);
    case 80: return Launch<80>(p, out16, k16, v16, stream);
    case 96: return Launch<96>(p, out16, k16, v16, stream);
    default: return Launch<128>(p, out16, k16, v16, stream);
  }
}

}  // namespace gizllm::cuda
