// Tensor-core encoder attention for the fast mode (fp16 operands, float32 softmax and
// accumulators): bidirectional attention within each sequence of a packed batch, S = Q K^T and
// O += P V on mma.sync m16n8k16 (the fragments of attention_mma.cu's tile kernel, mma.cuh).
// Exact mode keeps encoder.cu's float32 kernel.
//
// A block is (tile of kTileQ consecutive rows of the packed batch, head), one m16 tile of rows
// per warp. A tile may hold the end of one sequence and the start of the next: each row sees
// the keys [starts[s], starts[s + 1]) of its own sequence s, so the block walks the union of its
// rows' key ranges kTileK keys at a time (the float32 keys and values of a tile copied by
// cp.async into staging while the warps multiply the tile before, then rounded to fp16 into
// shared memory), a warp skips a key tile none of its rows sees, and only the tiles that cross a
// sequence bound of the warp's rows are masked. Sequences of one length L packed back to back
// cost the product of the L x L blocks and at most one key tile more per warp and bound; short
// sequences (a few tokens) share tiles and most of the product is masked, which costs little
// beside their linears.
//
// head_dim a multiple of 4 up to 128 (float4 copies), padded with zeros to the instantiated HD
// (32, 64, 96, 128: Qwen3-VL's 72 runs as 96); q, k, v 16-byte aligned. Other shapes take the
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

// Dynamic shared memory: float32 staging and fp16 tiles of keys and values (98 KB at HD 128,
// two blocks a multiprocessor).
template <int HD>
constexpr size_t EncoderMmaSharedBytes() {
  return 2 * kTileK * HD * sizeof(float) + 2 * kTileK * (HD + kPad) * 2;
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
// output projection that reads it next.
template <int HD>
__global__ void __launch_bounds__(32 * kWarps, 2)
    EncoderMmaKernel(EncoderAttentionParams p, __nv_bfloat16* out16) {
  static_assert(HD % 32 == 0 && HD <= 128, "HD: a multiple of 32 up to 128");
  AllowDependentLaunch();
  WaitForPriorGrid();
  constexpr int kThreads = 32 * kWarps;
  constexpr int kSteps = HD / 16;                     // k16 steps of S = Q K^T; also n16 pairs of O
  constexpr int kOutTiles = HD / 8;                   // n8 tiles of O
  constexpr int kRow = HD + kPad;                     // fp16 per shared key row
  constexpr int kVecs4 = HD / 4;                      // float4 pieces of a (padded) key
  constexpr int kLoads = kTileK * kVecs4 / kThreads;  // pieces of K (and of V) per thread
  static_assert(kTileK * kVecs4 % kThreads == 0, "whole float4 pieces per thread");
  extern __shared__ __align__(16) float shared[];
  float* kf = shared;                                        // [kTileK, HD] staged keys
  float* vf = kf + kTileK * HD;                              // [kTileK, HD] and values
  __half* ks = reinterpret_cast<__half*>(vf + kTileK * HD);  // [kTileK, kRow] fp16 keys
  __half* vs = ks + kTileK * kRow;                           // [kTileK, kRow] fp16 values
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

  // The block's threads copy a key tile's float32 keys and values of this head into kf, vf (the
  // copy of tile i + 1 runs while the warps multiply tile i); each thread later rounds the very
  // pieces it copied to fp16 into ks, vs. Piece c of a thread is float4 i % kVecs4 of key
  // i / kVecs4, i = threadIdx.x + c * kThreads: a warp reads whole keys.
  auto fetch = [&](int32_t k0) {
#pragma unroll
    for (int c = 0; c < kLoads; ++c) {
      const int i = threadIdx.x + c * kThreads;
      const int32_t j = k0 + i / kVecs4;
      const int d = i % kVecs4 * 4;
      if (j < kend && d < hd) {
        const int64_t at = j * width + head * hd + d;
        CpAsync16(kf + 4 * i, p.k + at);
        CpAsync16(vf + 4 * i, p.v + at);
      }
    }
    CpAsyncCommit();
  };

  fetch(kbegin);
  for (int32_t k0 = kbegin; k0 < kend; k0 += kTileK) {
    // Keys and values k0 .. k0 + kTileK - 1 as fp16; past the block's keys and the head's
    // dimensions, zeros (a masked key's probability is 0, and 0 times a stale NaN is not).
    CpAsyncWait();
#pragma unroll
    for (int c = 0; c < kLoads; ++c) {
      const int i = threadIdx.x + c * kThreads;
      float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f), b = a;
      if (k0 + i / kVecs4 < kend && i % kVecs4 * 4 < hd) {
        a = *reinterpret_cast<const float4*>(kf + 4 * i);
        b = *reinterpret_cast<const float4*>(vf + 4 * i);
      }
      const int at = i / kVecs4 * kRow + i % kVecs4 * 4;
      *reinterpret_cast<uint2*>(ks + at) = make_uint2(PackHalf(a.x, a.y), PackHalf(a.z, a.w));
      *reinterpret_cast<uint2*>(vs + at) = make_uint2(PackHalf(b.x, b.y), PackHalf(b.z, b.w));
    }
    __syncthreads();
    if (k0 + kTileK < kend) fetch(k0 + kTileK);

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
    __syncthreads();  // every warp is done with ks, vs before the next tile's rounding
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
void Launch(const EncoderAttentionParams& p, void* out16, cudaStream_t stream) {
  constexpr size_t kShared = EncoderMmaSharedBytes<HD>();
  static const bool raised =
      cudaFuncSetAttribute(EncoderMmaKernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(kShared)) == cudaSuccess;
  (void)raised;
  const dim3 grid(static_cast<unsigned>((p.rows + kTileQ - 1) / kTileQ),
                  static_cast<unsigned>(p.heads));
  LaunchDependent(EncoderMmaKernel<HD>, grid, dim3(32 * kWarps), kShared, stream, p,
                  static_cast<__nv_bfloat16*>(out16));
  GZ_CUDA_LAUNCHED();
}

bool Aligned16(const void* x) { return reinterpret_cast<uintptr_t>(x) % 16 == 0; }

}  // namespace

bool EncoderAttentionMmaCovers(const EncoderAttentionParams& p) {
  return p.head_dim > 0 && p.head_dim <= 128 && p.head_dim % 4 == 0 && Aligned16(p.q) &&
         Aligned16(p.k) && Aligned16(p.v) && Aligned16(p.out);
}

void LaunchEncoderAttentionMma(const EncoderAttentionParams& p, void* out16, cudaStream_t stream) {
  if (p.rows == 0) return;
  if (p.head_dim <= 32) return Launch<32>(p, out16, stream);
  if (p.head_dim <= 64) return Launch<64>(p, out16, stream);
  if (p.head_dim <= 96) return Launch<96>(p, out16, stream);
  Launch<128>(p, out16, stream);
}

}  // namespace gizllm::cuda
