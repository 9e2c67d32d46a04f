// Quantized linears (kQ8, kQ4, kQ2, kQ1 of quant/layout.h) on CUDA.
//
// Every value of a group is mul * c + add (quant/layout.h), so a group's share of a dot product is
//   sum_k x_k (mul c_k + add) = mul * sum_k x_k c_k + add * sum_k x_k.
// The kernels compute sum_k x_k c_k on the tensor cores (mma.sync m16n8k16, float16 operands,
// float32 sums): small integer codes are exact in float16, so the only rounding of the operands is
// that of the activations to float16. Each group's sum is then scaled in float32 and the add term
// comes from the per-group sums of the activations, which the rotation kernel writes beside them.
// A warp turns each weight fragment into float16 codes in registers once and uses it for all (up
// to 32) activation rows of its block, so the weights are read once per 32 rows; few rows waste
// tensor-core lanes, which cost nothing there. By row count:
//   1          QuantDecodeKernel: each warp rotates the inputs of its own groups in registers and
//              serves 2 or 4 output tiles with them;
//   2..16      QuantMmaKernel<*, *, false>: the 8 warps of a block split the inputs of one
//              output tile and add in shared memory;
//   17..255    QuantMmaKernel<*, 4, true>: the 8 warps take 8 output tiles over one share of
//              the inputs (the activations shared through L1) for 32 rows at a time, added
//              atomically;
//   256 and up CudaBackend dequantizes the weight to bf16 (DequantBf16Kernel) for cuBLASLt.
// Below 256 rows a small kernel rotates and rounds the activations first (except for 1 row).
//
// PrepareWeight reorders the codes (PackQuantWeight) so that each lane's share of a 16-output x
// 128-input tile lies in consecutive 16-byte words: the warp streams the tile with coalesced
// 16-byte loads (512 contiguous bytes per load instruction) and finds its fragment in registers.
// Exact mode runs a float32 kernel over the same layout (float32 activations, values mul * c + add
// in float32), as the reference does.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstring>
#include <string>

#include "backend/cuda/kernels.cuh"
#include "backend/cuda/quant_layout.cuh"
#include "backend/cuda/weight_loads.cuh"
#include "quant/layout.h"

namespace gizllm::cuda {
namespace {

size_t CodeBytes(const Weight& w) {
  // [row tiles of 16][steps][loads][32 lanes][16 bytes] = rows_pad * groups_pad * GroupBytes.
  return static_cast<size_t>(PaddedRows(w.rows) * PaddedGroups(w.cols) *
                             quant::GroupBytes(w.format));
}

// Lane `lane`'s pair `t` of a step (t in [0, 32 * groups per step)): which output row (in the
// 16-row tile) and which input (in the step) its first code is; the second is the next input.
// The order is that of the mma.sync A fragment: per k-step of 16, a0 (row g, inputs 2q, 2q+1),
// a1 (row g + 8, same inputs), a2 (row g, inputs 2q + 8, 2q + 9), a3 (row g + 8, same).
inline void PairPlace(int lane, int t, int* row, int* input) {
  int g = lane >> 2, q = lane & 3;
  int gs = t / 32, s = (t % 32) / 4, f = t % 4;
  *row = g + (f & 1) * 8;
  *input = gs * quant::kGroup + 16 * s + 2 * q + (f >> 1) * 8;
}

// ---- Device helpers ----

__device__ __forceinline__ void Mma(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Up to three quantized linears of one format over the same activations, in one launch: blocks
// [first_block[i], first_block[i + 1]) compute output i, one 16-output tile each.
struct QuantSet {
  const uint4* codes[MatmulParams::kMaxOutputs] = {};    // packed (PackQuantWeight)
  const float2* affine[MatmulParams::kMaxOutputs] = {};  // [groups_pad, rows_pad] (mul, add)
  const float* bias[MatmulParams::kMaxOutputs] = {};     // [n] or null
  float* out[MatmulParams::kMaxOutputs] = {};            // [rows, n]
  int64_t n[MatmulParams::kMaxOutputs] = {};
  unsigned first_block[MatmulParams::kMaxOutputs + 1] = {};
  int count = 0;
  // Batch-1 decode only (QuantDecodeKernel): out += the product; or, with two outputs of the
  // same n, out[0] = silu(output 0) * output 1, each block computing both for the same rows.
  bool accumulate = false;
  bool swiglu = false;
};

// The output of a block, picked with constant indices (a variable index would copy the set to
// local memory).
struct QuantPick {
  const uint4* codes;
  const float2* affine;
  const float* bias;
  float* out;
  int64_t n;
  int64_t tile;
};
__device__ __forceinline__ QuantPick Pick(const QuantSet& set) {
  static_assert(MatmulParams::kMaxOutputs == 3);
  const bool in1 = set.count > 1 && blockIdx.x >= set.first_block[1];
  const bool in2 = set.count > 2 && blockIdx.x >= set.first_block[2];
  QuantPick p;
  p.codes = in2 ? set.codes[2] : in1 ? set.codes[1] : set.codes[0];
  p.affine = in2 ? set.affine[2] : in1 ? set.affine[1] : set.affine[0];
  p.bias = in2 ? set.bias[2] : in1 ? set.bias[1] : set.bias[0];
  p.out = in2 ? set.out[2] : in1 ? set.out[1] : set.out[0];
  p.n = in2 ? set.n[2] : in1 ? set.n[1] : set.n[0];
  p.tile = blockIdx.x - (in2 ? set.first_block[2] : in1 ? set.first_block[1] : 0u);
  return p;
}

constexpr int kQuantWarps = 8;  // warps of a block

// out[r, j] = sum_g mul[j, g] S[r, j, g] + add[j, g] xsum[r, g] (+ bias[j]), with S the code sums
// of group g, for activation rows [8 kTiles blockIdx.y, ...) (kTiles: tiles of 8 rows). Without
// kSplitM a block computes outputs [16 b, 16 b + 16), each warp a contiguous range of steps, the
// parts added in shared memory; with it, outputs [128 b, 128 b + 128) over the steps of share
// blockIdx.z, each warp a tile, added atomically into out (zeroed by the caller).
template <Format F, int kTiles, bool kSplitM>
__global__ void __launch_bounds__(kQuantWarps * 32)
    QuantMmaKernel(QuantSet set,
                   const uint4* __restrict__ xh,    // [row tiles, k-steps / 2, 32 lanes] halves
                   const float* __restrict__ xsum,  // [row tiles * 8, groups_pad]
                   int64_t rows, int64_t row_tiles, int64_t groups_pad) {
  using Q = QuantTraits<F>;
  // 16-byte weight loads in flight per lane: many for few rows (the kernel streams), fewer where
  // the sums of many rows hold the registers. Whole steps, at most 4.
  constexpr int kLoadsWanted = kTiles >= 8 ? 2 : kTiles >= 4 ? 4 : 8;
  constexpr int kStepsInFlight = kLoadsWanted / Q::kLoads < 1   ? 1
                                 : kLoadsWanted / Q::kLoads > 4 ? 4
                                                                : kLoadsWanted / Q::kLoads;
  __shared__ float parts[kSplitM ? 1 : kQuantWarps][kTiles * 4][32];
  AllowDependentLaunch();
  WaitForPriorGrid();
  const QuantPick pick = Pick(set);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g8 = lane >> 2, q4 = lane & 3;
  const int64_t tile0 = static_cast<int64_t>(blockIdx.y) * kTiles;
  const int64_t rows_pad = PaddedRows(pick.n);
  const int64_t steps = groups_pad / Q::kGroupsPerStep;
  // kSplitM: the warps of a block take 8 output tiles over the same inputs (range blockIdx.z of
  // gridDim.z), so the activations they read are shared in L1, and add into out atomically.
  // Otherwise they split the inputs of one output tile and add in shared memory.
  const int64_t mtile = kSplitM ? pick.tile * kQuantWarps + warp : pick.tile;
  if (kSplitM && mtile >= rows_pad / 16) return;
  const int64_t split = kSplitM ? blockIdx.z : warp;
  const int64_t splits = kSplitM ? gridDim.z : kQuantWarps;
  const int64_t s0 = steps * split / splits, s1 = steps * (split + 1) / splits;
  const int64_t half_steps = groups_pad * 4;  // k-steps / 2 per row tile
  const uint4* wp = pick.codes + mtile * steps * Q::kLoads * 32 + lane;

  float total[kTiles][4];
#pragma unroll
  for (int t = 0; t < kTiles; ++t)
#pragma unroll
    for (int c = 0; c < 4; ++c) total[t][c] = 0.0f;

  for (int64_t c0 = s0; c0 < s1; c0 += kStepsInFlight) {
    uint4 raw[kStepsInFlight][Q::kLoads];
#pragma unroll
    for (int p = 0; p < kStepsInFlight; ++p) {
      if (c0 + p < s1) {
#pragma unroll
        for (int i = 0; i < Q::kLoads; ++i)
          raw[p][i] = LoadStreaming(wp + ((c0 + p) * Q::kLoads + i) * 32);
      }
    }
#pragma unroll
    for (int p = 0; p < kStepsInFlight; ++p) {
      if (c0 + p >= s1) continue;
      const uint32_t* words = reinterpret_cast<const uint32_t*>(raw[p]);
#pragma unroll
      for (int gs = 0; gs < Q::kGroupsPerStep; ++gs) {
        const int64_t g = (c0 + p) * Q::kGroupsPerStep + gs;
        float acc[kTiles][4];
#pragma unroll
        for (int t = 0; t < kTiles; ++t)
#pragma unroll
          for (int c = 0; c < 4; ++c) acc[t][c] = 0.0f;
        // The group's scales and activation sums first, so their loads overlap the products.
        const float2 f0 = __ldg(pick.affine + g * rows_pad + mtile * 16 + g8);
        const float2 f1 = __ldg(pick.affine + g * rows_pad + mtile * 16 + g8 + 8);
        float xs[kTiles][2];
#pragma unroll
        for (int t = 0; t < kTiles; ++t) {
          const int64_t r = (tile0 + t) * 8 + 2 * q4;
          const bool in = tile0 + t < row_tiles;
          xs[t][0] = in ? __ldg(xsum + r * groups_pad + g) : 0.0f;
          xs[t][1] = in ? __ldg(xsum + (r + 1) * groups_pad + g) : 0.0f;
        }
        // Two k-steps of 16 inputs take one 16-byte load of activations per row tile; for few
        // row tiles the loads of the whole group are issued together.
        constexpr int kAhead = kTiles <= 2 ? 4 : 1;
        uint4 bq[kAhead][kTiles];
#pragma unroll
        for (int s2 = 0; s2 < 4; ++s2) {
          if (s2 % kAhead == 0) {
#pragma unroll
            for (int u = 0; u < kAhead; ++u) {
#pragma unroll
              for (int t = 0; t < kTiles; ++t) {
                if (tile0 + t < row_tiles)
                  bq[u][t] = __ldg(xh + ((tile0 + t) * half_steps + g * 4 + s2 + u) * 32 + lane);
                else
                  bq[u][t] = make_uint4(0, 0, 0, 0);
              }
            }
          }
          const uint4* b = bq[s2 % kAhead];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int s = s2 * 2 + h;
            uint32_t a[4];
            a[0] = HalfBits(CodePairAt<F>(words, (gs * 8 + s) * 4 + 0));
            a[1] = HalfBits(CodePairAt<F>(words, (gs * 8 + s) * 4 + 1));
            a[2] = HalfBits(CodePairAt<F>(words, (gs * 8 + s) * 4 + 2));
            a[3] = HalfBits(CodePairAt<F>(words, (gs * 8 + s) * 4 + 3));
#pragma unroll
            for (int t = 0; t < kTiles; ++t)
              Mma(acc[t], a, h ? b[t].z : b[t].x, h ? b[t].w : b[t].y);
          }
        }
#pragma unroll
        for (int t = 0; t < kTiles; ++t) {
          const float x0 = xs[t][0], x1 = xs[t][1];
          total[t][0] += f0.x * acc[t][0] + f0.y * x0;
          total[t][1] += f0.x * acc[t][1] + f0.y * x1;
          total[t][2] += f1.x * acc[t][2] + f1.y * x0;
          total[t][3] += f1.x * acc[t][3] + f1.y * x1;
        }
      }
    }
  }
  if constexpr (kSplitM) {
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int64_t j = mtile * 16 + g8 + (c >= 2 ? 8 : 0);
        const int64_t r = (tile0 + t) * 8 + 2 * q4 + (c & 1);
        if (j >= pick.n || r >= rows) continue;
        const float b = pick.bias && blockIdx.z == 0 ? pick.bias[j] : 0.0f;
        atomicAdd(pick.out + r * pick.n + j, total[t][c] + b);
      }
    }
    return;
  } else {
#pragma unroll
    for (int t = 0; t < kTiles; ++t)
#pragma unroll
      for (int c = 0; c < 4; ++c) parts[warp][t * 4 + c][lane] = total[t][c];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kTiles * 4 * 32; i += blockDim.x) {
    const int t = i / 128, c = (i / 32) % 4, ln = i % 32;
    const int64_t j = pick.tile * 16 + (ln >> 2) + (c >= 2 ? 8 : 0);
    const int64_t r = (tile0 + t) * 8 + 2 * (ln & 3) + (c & 1);
    if (j >= pick.n || r >= rows) continue;
    float sum = pick.bias ? pick.bias[j] : 0.0f;
#pragma unroll
    for (int w = 0; w < kQuantWarps; ++w) sum += parts[w][t * 4 + c][ln];
    pick.out[r * pick.n + j] = sum;
  }
}

// Batch-1 decode: QuantMmaKernel for one activation row with the activations prepared in the
// kernel (no separate launch): each warp reads the float32 inputs of its own groups, rotates
// them in registers once for kMT output tiles, and passes the float16 values through
// shared memory into B fragments (row 0 of the 8; the other lanes give zeros). A block computes
// outputs [16 kMT b, 16 kMT (b + 1)) where b is its index in the output's blocks. x: [1, cols].
template <Format F, int kMT, int kDepth>
__global__ void __launch_bounds__(kQuantWarps * 32)
    QuantDecodeKernel(QuantSet set, const float* __restrict__ x, int64_t cols, bool rotate,
                      uint64_t seed) {
  using Q = QuantTraits<F>;
  // kMT output tiles per warp share each rotated group; kDepth multiplies the steps whose loads
  // are in flight together (for launches of at most one block per multiprocessor).
  constexpr int kPerStep = Q::kLoads * kMT;  // 16-byte loads per lane per step
  constexpr int kSteps = 8 / kPerStep < 1 ? 1 : 8 / kPerStep > 4 ? 4 : 8 / kPerStep;
  constexpr int kStepsInFlight = kSteps * kDepth > 4 ? 4 : kSteps * kDepth;
  constexpr int kGroupsInFlight = kStepsInFlight * Q::kGroupsPerStep;
  __shared__ float parts[kQuantWarps][kMT * 2][8];
  __shared__ __align__(16) __half stage[kQuantWarps][quant::kGroup];
  AllowDependentLaunch();  // the kernel after it may be scheduled now
  const QuantPick pick = Pick(set);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g8 = lane >> 2, q4 = lane & 3;
  const int64_t groups = cols / quant::kGroup, groups_pad = PaddedGroups(cols);
  const int64_t rows_pad = PaddedRows(pick.n), tiles = rows_pad / 16;
  // With swiglu the first half of the kMT tiles are tiles of output 0 (the gate), the second
  // half the same tiles of output 1 (up); else kMT consecutive tiles of the block's output.
  constexpr int kHalf = kMT / 2;
  const int64_t tile0 = set.swiglu ? pick.tile * kHalf : pick.tile * kMT;
  const int64_t steps = groups_pad / Q::kGroupsPerStep;
  const int64_t s0 = steps * warp / kQuantWarps, s1 = steps * (warp + 1) / kQuantWarps;
  const int64_t tile_words = steps * Q::kLoads * 32;  // uint4 of one output tile
  // Tile m: its output tile index, codes (this lane's first word) and (mul, add) pairs.
  int64_t tile_of[kMT];
  const uint4* wp[kMT];
  const float2* ap[kMT];
#pragma unroll
  for (int m = 0; m < kMT; ++m) {
    const bool up = set.swiglu && m >= kHalf;
    tile_of[m] = set.swiglu ? tile0 + m % kHalf : tile0 + m;
    wp[m] = (up ? set.codes[1] : pick.codes) + tile_of[m] * tile_words + lane;
    ap[m] = (up ? set.affine[1] : pick.affine) + tile_of[m] * 16 + g8;
  }
  float total[kMT][2];  // outputs g8 and g8 + 8 of each tile, activation row 0
#pragma unroll
  for (int m = 0; m < kMT; ++m) total[m][0] = total[m][1] = 0.0f;
  uint4 raw[kStepsInFlight][kMT][Q::kLoads];
  float2 aff[kGroupsInFlight][kMT][2];
  // The codes of kStepsInFlight steps from c0 and their groups' (mul, add) pairs, loaded
  // together so that no load waits inside the products (the pairs are read once, like the codes).
  auto load_weights = [&](int64_t c0) {
#pragma unroll
    for (int p = 0; p < kStepsInFlight; ++p) {
#pragma unroll
      for (int m = 0; m < kMT; ++m) {
        if (c0 + p < s1 && tile_of[m] < tiles) {
#pragma unroll
          for (int i = 0; i < Q::kLoads; ++i)
            raw[p][m][i] = LoadStreaming(wp[m] + ((c0 + p) * Q::kLoads + i) * 32);
        }
      }
    }
#pragma unroll
    for (int gi = 0; gi < kGroupsInFlight; ++gi) {
      const int64_t g = c0 * Q::kGroupsPerStep + gi;
#pragma unroll
      for (int m = 0; m < kMT; ++m) {
        // Padding groups (g < groups_pad) have pairs (0, 0); tiles past the end are skipped.
        if (c0 + gi / Q::kGroupsPerStep < s1 && tile_of[m] < tiles) {
          aff[gi][m][0] = __ldg(ap[m] + g * rows_pad);
          aff[gi][m][1] = __ldg(ap[m] + g * rows_pad + 8);
        }
      }
    }
  };
  // The first weights are loaded before waiting for the kernel that writes x (programmatic
  // dependent launch): they do not depend on it, so their latency overlaps its tail.
  if (s0 < s1) load_weights(s0);
  WaitForPriorGrid();
  for (int64_t c0 = s0; c0 < s1; c0 += kStepsInFlight) {
    if (c0 != s0) load_weights(c0);
    float xv[kGroupsInFlight][4];
#pragma unroll
    for (int gi = 0; gi < kGroupsInFlight; ++gi) {
      const int64_t g = c0 * Q::kGroupsPerStep + gi;
      const bool valid = c0 + gi / Q::kGroupsPerStep < s1 && g < groups;
      const float4 v = valid ? __ldg(reinterpret_cast<const float4*>(x + g * quant::kGroup) + lane)
                             : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      xv[gi][0] = v.x, xv[gi][1] = v.y, xv[gi][2] = v.z, xv[gi][3] = v.w;
    }
#pragma unroll
    for (int p = 0; p < kStepsInFlight; ++p) {
      if (c0 + p >= s1) continue;
#pragma unroll
      for (int gs = 0; gs < Q::kGroupsPerStep; ++gs) {
        const int64_t g = (c0 + p) * Q::kGroupsPerStep + gs;
        float* v = xv[p * Q::kGroupsPerStep + gs];
        if (rotate) RotateBlock(v, lane, g, seed);
        __half2 h01 = __floats2half2_rn(v[0], v[1]), h23 = __floats2half2_rn(v[2], v[3]);
        float2 f01 = __half22float2(h01), f23 = __half22float2(h23);
        float xsum = f01.x + f01.y + f23.x + f23.y;
#pragma unroll
        for (int m = 16; m > 0; m >>= 1) xsum += __shfl_xor_sync(0xffffffffu, xsum, m);
        __syncwarp();
        reinterpret_cast<__half2*>(stage[warp])[2 * lane] = h01;
        reinterpret_cast<__half2*>(stage[warp])[2 * lane + 1] = h23;
        __syncwarp();
        const uint32_t* xs = reinterpret_cast<const uint32_t*>(stage[warp]);
        // Column g8 of B is activation row g8: only row 0 exists.
        uint32_t b[8][2];
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          b[k][0] = g8 == 0 ? xs[8 * k + q4] : 0u;
          b[k][1] = g8 == 0 ? xs[8 * k + q4 + 4] : 0u;
        }
#pragma unroll
        for (int m = 0; m < kMT; ++m) {
          if (tile_of[m] >= tiles) continue;
          const uint32_t* words = reinterpret_cast<const uint32_t*>(raw[p][m]);
          float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
          for (int k = 0; k < 8; ++k) {
            uint32_t a[4];
            a[0] = HalfBits(CodePairAt<F>(words, (gs * 8 + k) * 4 + 0));
            a[1] = HalfBits(CodePairAt<F>(words, (gs * 8 + k) * 4 + 1));
            a[2] = HalfBits(CodePairAt<F>(words, (gs * 8 + k) * 4 + 2));
            a[3] = HalfBits(CodePairAt<F>(words, (gs * 8 + k) * 4 + 3));
            Mma(acc, a, b[k][0], b[k][1]);
          }
          const float2 f0 = aff[p * Q::kGroupsPerStep + gs][m][0];
          const float2 f1 = aff[p * Q::kGroupsPerStep + gs][m][1];
          total[m][0] += f0.x * acc[0] + f0.y * xsum;
          total[m][1] += f1.x * acc[2] + f1.y * xsum;
        }
      }
    }
  }
  // Lanes with q4 == 0 hold activation row 0 (C column 2 q4).
  if (q4 == 0) {
#pragma unroll
    for (int m = 0; m < kMT; ++m) {
      parts[warp][2 * m][g8] = total[m][0];
      parts[warp][2 * m + 1][g8] = total[m][1];
    }
  }
  __syncthreads();
  // The sum over the warps of row `row` of tile m.
  auto total_of = [&](int m, int row) {
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kQuantWarps; ++w) sum += parts[w][2 * m + row / 8][row % 8];
    return sum;
  };
  if (set.swiglu) {
    if (threadIdx.x < 16 * kHalf) {
      const int m = threadIdx.x / 16, row = threadIdx.x % 16;
      const int64_t j = (tile0 + m) * 16 + row;
      if (j < pick.n) {
        const float g = total_of(m, row) + (set.bias[0] ? set.bias[0][j] : 0.0f);
        const float u = total_of(m + kHalf, row) + (set.bias[1] ? set.bias[1][j] : 0.0f);
        set.out[0][j] = g / (1.0f + expf(-g)) * u;
      }
    }
  } else if (threadIdx.x < 16 * kMT) {
    const int m = threadIdx.x / 16, row = threadIdx.x % 16;
    const int64_t j = (tile0 + m) * 16 + row;
    if (j < pick.n) {
      const float sum = total_of(m, row) + (pick.bias ? pick.bias[j] : 0.0f);
      pick.out[j] = set.accumulate ? pick.out[j] + sum : sum;
    }
  }
}

// Exact mode: float32 activations x [rows <= 8, cols] (rotated), each value mul * c + add in
// float32, float32 sums. A block computes one 16-output tile; lanes hold the same fragments as
// in QuantMmaKernel and add over their inputs, then over the 4 lanes of a row and the warps.
template <Format F>
__global__ void __launch_bounds__(kQuantWarps * 32)
    QuantF32Kernel(QuantSet set, const float* __restrict__ x, int64_t rows, int64_t cols) {
  using Q = QuantTraits<F>;
  __shared__ float parts[kQuantWarps][16][8];
  AllowDependentLaunch();
  WaitForPriorGrid();
  const QuantPick pick = Pick(set);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g8 = lane >> 2, q4 = lane & 3;
  const int64_t groups = cols / quant::kGroup, groups_pad = PaddedGroups(cols);
  const int64_t rows_pad = PaddedRows(pick.n);
  const int64_t steps = groups_pad / Q::kGroupsPerStep;
  const int64_t s0 = steps * warp / kQuantWarps, s1 = steps * (warp + 1) / kQuantWarps;
  const uint4* wp = pick.codes + pick.tile * steps * Q::kLoads * 32 + lane;
  float acc[2][8];
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int r = 0; r < 8; ++r) acc[h][r] = 0.0f;
  for (int64_t st = s0; st < s1; ++st) {
    uint4 raw[Q::kLoads];
#pragma unroll
    for (int i = 0; i < Q::kLoads; ++i) raw[i] = LoadStreaming(wp + (st * Q::kLoads + i) * 32);
    const uint32_t* words = reinterpret_cast<const uint32_t*>(raw);
#pragma unroll
    for (int gs = 0; gs < Q::kGroupsPerStep; ++gs) {
      const int64_t g = st * Q::kGroupsPerStep + gs;
      if (g >= groups) continue;  // the padding group of an odd count
      const float2 f0 = pick.affine[g * rows_pad + pick.tile * 16 + g8];
      const float2 f1 = pick.affine[g * rows_pad + pick.tile * 16 + g8 + 8];
#pragma unroll
      for (int s = 0; s < 8; ++s) {
#pragma unroll
        for (int f = 0; f < 4; ++f) {
          const float2 c = __half22float2(CodePairAt<F>(words, (gs * 8 + s) * 4 + f));
          const float2 af = (f & 1) ? f1 : f0;
          const float w0 = af.x * c.x + af.y, w1 = af.x * c.y + af.y;
          const int64_t k = g * quant::kGroup + 16 * s + 2 * q4 + (f >> 1) * 8;
#pragma unroll
          for (int r = 0; r < 8; ++r) {
            if (r < rows) {
              const float2 xv = __ldg(reinterpret_cast<const float2*>(x + r * cols + k));
              acc[f & 1][r] += w0 * xv.x + w1 * xv.y;
            }
          }
        }
      }
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int r = 0; r < 8; ++r) {
      float v = acc[h][r];
      v += __shfl_xor_sync(0xffffffffu, v, 1);
      v += __shfl_xor_sync(0xffffffffu, v, 2);
      if (q4 == 0) parts[warp][g8 + 8 * h][r] = v;
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < 16 * 8; i += blockDim.x) {
    const int row = i / 8, r = i % 8;
    const int64_t j = pick.tile * 16 + row;
    if (j >= pick.n || r >= rows) continue;
    float sum = pick.bias ? pick.bias[j] : 0.0f;
#pragma unroll
    for (int w = 0; w < kQuantWarps; ++w) sum += parts[w][row][r];
    pick.out[r * pick.n + j] = sum;
  }
}

// The activations of a quantized matmul, one warp per (row, group of 128): each group rotated
// (quant/hadamard.h: the signs, then the normalized Walsh-Hadamard transform; lane l holds inputs
// 4l..4l+3) when `rotate`, then either
//   xr != null (exact): written as float32 to xr [rows, cols], or
//   xb != null (many rows, through cuBLASLt): written as bf16 to xb [rows, cols], or
//   rounded to float16 into xh in the mma B-fragment order, with the group sums of the rounded
//   values in xsum; rows up to row_tiles * 8 and groups up to groups_pad are zero-filled.
__global__ void __launch_bounds__(128)
    PrepareActivationsKernel(const float* __restrict__ x,  // [rows, cols]
                             int64_t rows, int64_t cols, bool rotate, uint64_t seed,
                             float* __restrict__ xr,          // [rows, cols] or null
                             __nv_bfloat16* __restrict__ xb,  // [rows, cols] or null
                             __half* __restrict__ xh,         // [row_tiles, groups_pad * 4, 32, 8]
                             float* __restrict__ xsum,        // [row_tiles * 8, groups_pad]
                             int64_t row_tiles, int64_t groups_pad) {
  AllowDependentLaunch();
  WaitForPriorGrid();
  const int lane = threadIdx.x % 32;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * 4 + threadIdx.x / 32;
  if (item >= row_tiles * 8 * groups_pad) return;
  const int64_t r = item / groups_pad, g = item % groups_pad;
  const int64_t groups = cols / quant::kGroup;
  const bool valid = r < rows && g < groups;
  float v[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = valid ? x[r * cols + g * quant::kGroup + 4 * lane + i] : 0.0f;
  if (rotate) RotateBlock(v, lane, g, seed);
  if (xr) {
    if (valid) {
#pragma unroll
      for (int i = 0; i < 4; ++i) xr[r * cols + g * quant::kGroup + 4 * lane + i] = v[i];
    }
    return;
  }
  if (xb) {
    if (valid) {
      auto* dst = reinterpret_cast<__nv_bfloat162*>(xb + r * cols + g * quant::kGroup + 4 * lane);
      dst[0] = __floats2bfloat162_rn(v[0], v[1]);
      dst[1] = __floats2bfloat162_rn(v[2], v[3]);
    }
    return;
  }
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __half h = __float2half_rn(v[i]);
    sum += __half2float(h);
    const int k = 4 * lane + i, kk = k % 16;
    const int64_t ks = g * 8 + k / 16;
    const int dest_lane = static_cast<int>(r % 8) * 4 + (kk % 8) / 2;
    const int64_t word = ((r / 8) * groups_pad * 4 + ks / 2) * 32 + dest_lane;
    xh[word * 8 + (ks % 2) * 4 + (kk / 8) * 2 + kk % 2] = h;
  }
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, m);
  if (lane == 0) xsum[r * groups_pad + g] = sum;
}

// W as bf16 [n, cols] (in the stored, rotated basis): value mul * c + add of each code, for
// the many-row path through cuBLASLt. One warp per (output tile, step), each lane writing the
// values of its own fragment pairs.
template <Format F>
__global__ void __launch_bounds__(256)
    DequantBf16Kernel(const uint4* __restrict__ codes, const float2* __restrict__ affine, int64_t n,
                      int64_t cols, __nv_bfloat16* __restrict__ out) {
  using Q = QuantTraits<F>;
  const int lane = threadIdx.x % 32, g8 = lane >> 2, q4 = lane & 3;
  const int64_t groups = cols / quant::kGroup, groups_pad = PaddedGroups(cols);
  const int64_t rows_pad = PaddedRows(n), steps = groups_pad / Q::kGroupsPerStep;
  const int64_t unit = static_cast<int64_t>(blockIdx.x) * 8 + threadIdx.x / 32;
  if (unit >= rows_pad / 16 * steps) return;
  const int64_t tile = unit / steps, st = unit % steps;
  uint4 raw[Q::kLoads];
#pragma unroll
  for (int i = 0; i < Q::kLoads; ++i)
    raw[i] = LoadStreaming(codes + ((tile * steps + st) * Q::kLoads + i) * 32 + lane);
  const uint32_t* words = reinterpret_cast<const uint32_t*>(raw);
#pragma unroll
  for (int gs = 0; gs < Q::kGroupsPerStep; ++gs) {
    const int64_t g = st * Q::kGroupsPerStep + gs;
    if (g >= groups) continue;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t j = tile * 16 + g8 + 8 * h;
      if (j >= n) continue;
      const float2 af = affine[g * rows_pad + j];
#pragma unroll
      for (int s = 0; s < 8; ++s) {
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
          const float2 c = __half22float2(CodePairAt<F>(words, (gs * 8 + s) * 4 + h + 2 * hi));
          const int64_t k = g * quant::kGroup + 16 * s + 2 * q4 + 8 * hi;
          *reinterpret_cast<__nv_bfloat162*>(out + j * cols + k) =
              __floats2bfloat162_rn(af.x * c.x + af.y, af.x * c.y + af.y);
        }
      }
    }
  }
}

// ---- Host side ----

template <Format F>
void PackCodes(const Weight& host, uint8_t* out) {
  using Q = QuantTraits<F>;
  constexpr int kBytes = quant::GroupBytes(F);
  const int64_t groups = host.cols / quant::kGroup, groups_pad = PaddedGroups(host.cols);
  const int64_t steps = groups_pad / Q::kGroupsPerStep;
  const auto* codes = static_cast<const uint8_t*>(host.data);
  auto* words = reinterpret_cast<uint32_t*>(out);
  for (int64_t tile = 0; tile < PaddedRows(host.rows) / 16; ++tile) {
    for (int64_t st = 0; st < steps; ++st) {
      for (int i = 0; i < Q::kLoads; ++i) {
        for (int lane = 0; lane < 32; ++lane) {
          for (int wi = 0; wi < 4; ++wi) {
            uint32_t word = 0;
            for (int q = 0; q < Q::kPairsPerWord; ++q) {
              const int t = (i * 4 + wi) * Q::kPairsPerWord + q;
              const int shift = (q / Q::kPairsPerByte) * 8 + (q % Q::kPairsPerByte) * Q::kBits;
              int row, input;
              PairPlace(lane, t, &row, &input);
              const int64_t j = tile * 16 + row;
              for (int e = 0; e < 2; ++e) {
                const int64_t k = st * Q::kGroupsPerStep * quant::kGroup + input + e;
                const int64_t g = k / quant::kGroup;
                int code = 0;
                if (j < host.rows && g < groups) {
                  code = quant::CodeAt(F, codes + (j * groups + g) * kBytes,
                                       static_cast<int>(k % quant::kGroup));
                }
                word |= static_cast<uint32_t>(code + Q::kOffset) << (shift + 16 * e);
              }
            }
            *words++ = word;
          }
        }
      }
    }
  }
}

// The prepared activations of the fast kernel.
struct QuantScratchView {
  const uint4* xh = nullptr;
  const float* xsum = nullptr;
};

// decode: one row, activations prepared inside the kernel (x rotated when `rotate`).
// Multiprocessors of the current device, read once.
int SmCount() {
  static const int count = [] {
    int device = 0, sms = 0;
    GZ_CUDA_CHECK(cudaGetDevice(&device));
    GZ_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    return sms;
  }();
  return count;
}

// The set with blocks of `tiles_per_block` output tiles (8: QuantMmaKernel<F, *, true>; with
// swiglu, QuantDecodeKernel's blocks of half as many tiles of each of the two outputs); *blocks
// gets their count.
QuantSet SplitSet(const QuantSet& set, unsigned* blocks, int64_t tiles_per_block = kQuantWarps) {
  QuantSet split = set;
  if (set.swiglu) {
    const int64_t half = tiles_per_block / 2, tiles = PaddedRows(set.n[0]) / 16;
    *blocks = static_cast<unsigned>((tiles + half - 1) / half);
    split.first_block[0] = 0;
    split.first_block[1] = split.first_block[2] = *blocks;  // every block picks output 0
    return split;
  }
  unsigned total = 0;
  for (int i = 0; i < set.count; ++i) {
    split.first_block[i] = total;
    const int64_t tiles = PaddedRows(set.n[i]) / 16;
    total += static_cast<unsigned>((tiles + tiles_per_block - 1) / tiles_per_block);
  }
  split.first_block[set.count] = total;
  *blocks = total;
  return split;
}

template <Format F>
void LaunchSet(const QuantSet& set, unsigned blocks, bool exact, bool decode, const float* x,
               int64_t rows, int64_t cols, bool rotate, uint64_t seed, int64_t row_tiles,
               const QuantScratchView& act, cudaStream_t stream) {
  unsigned split_blocks = 0;
  const QuantSet split_set = SplitSet(set, &split_blocks);
  if (decode) {
    // Four output tiles per warp where that still leaves two blocks per multiprocessor (fewer
    // rotations per weight byte); else two, with twice the loads in flight where every block has
    // a multiprocessor of its own.
    unsigned blocks4 = 0, blocks2 = 0;
    const QuantSet set4 = SplitSet(set, &blocks4, 4), set2 = SplitSet(set, &blocks2, 2);
    const unsigned sms = static_cast<unsigned>(SmCount());
    const dim3 threads(kQuantWarps * 32);
    if (blocks4 >= 2 * sms) {
      LaunchDependent(QuantDecodeKernel<F, 4, 1>, dim3(blocks4), threads, 0, stream, set4, x, cols,
                      rotate, seed);
    } else if (blocks2 <= sms) {
      LaunchDependent(QuantDecodeKernel<F, 2, 2>, dim3(blocks2), threads, 0, stream, set2, x, cols,
                      rotate, seed);
    } else {
      LaunchDependent(QuantDecodeKernel<F, 2, 1>, dim3(blocks2), threads, 0, stream, set2, x, cols,
                      rotate, seed);
    }
    return;
  }
  if (exact) {
    for (int64_t r0 = 0; r0 < rows; r0 += 8) {
      QuantSet part = set;
      for (int i = 0; i < set.count; ++i) part.out[i] = set.out[i] + r0 * set.n[i];
      LaunchDependent(QuantF32Kernel<F>, dim3(blocks), dim3(kQuantWarps * 32), 0, stream, part,
                      x + r0 * cols, rows - r0 < 8 ? rows - r0 : 8, cols);
    }
    return;
  }
  const int64_t groups_pad = PaddedGroups(cols);
  auto launch = [&](auto kernel, int tiles) {
    dim3 grid(blocks, static_cast<unsigned>((row_tiles + tiles - 1) / tiles));
    LaunchDependent(kernel, grid, dim3(kQuantWarps * 32), 0, stream, set, act.xh, act.xsum, rows,
                    row_tiles, groups_pad);
  };
  if (row_tiles == 1) {
    launch(QuantMmaKernel<F, 1, false>, 1);
  } else if (row_tiles == 2) {
    launch(QuantMmaKernel<F, 2, false>, 2);
  } else {
    // Many rows: 8 output tiles per block over a share of the inputs, so that the activations
    // come from L1 for 8 tiles; outputs zeroed first and summed atomically. Enough input shares
    // for about two blocks per multiprocessor. Blocks of 4 row tiles (32 rows) at any row count:
    // 8 (64 rows) held 190-255 registers a thread, one block per multiprocessor, and measured
    // slower even though they read the weights half as often (4-bit, 64 sequences: 4,440
    // against 5,201 tokens/s; 128: 5,046 against 6,371).
    constexpr int tiles = 4;
    const int64_t steps = groups_pad / QuantTraits<F>::kGroupsPerStep;
    const int64_t row_blocks = (row_tiles + tiles - 1) / tiles;
    int64_t splits = (2 * SmCount() + static_cast<int64_t>(split_blocks) * row_blocks - 1) /
                     (static_cast<int64_t>(split_blocks) * row_blocks);
    splits = splits < 1 ? 1 : splits > steps ? steps : splits;
    for (int i = 0; i < set.count; ++i)
      GZ_CUDA_CHECK(cudaMemsetAsync(set.out[i], 0, rows * set.n[i] * sizeof(float), stream));
    dim3 grid(split_blocks, static_cast<unsigned>(row_blocks), static_cast<unsigned>(splits));
    LaunchDependent(QuantMmaKernel<F, tiles, true>, grid, dim3(kQuantWarps * 32), 0, stream,
                    split_set, act.xh, act.xsum, rows, row_tiles, groups_pad);
  }
}

}  // namespace

Status CheckQuantWeight(const Weight& w) {
  const std::string what = "cuda: weight of format " + FormatName(w.format);
  if (!quant::IsQuantized(w.format)) return InvalidArgument(what + " is not quantized");
  if (w.group != quant::kGroup)
    return InvalidArgument(what + " has groups of " + std::to_string(w.group) + ", expected 128");
  if (w.rows <= 0 || w.cols <= 0 || w.cols % quant::kGroup != 0)
    return InvalidArgument(what + " has shape " + std::to_string(w.rows) + " x " +
                           std::to_string(w.cols) + ", expected columns a multiple of 128");
  if (!w.data || !w.scales) return InvalidArgument(what + " has no codes or scales");
  if (w.zeros && !quant::AllowsZeros(w.format))
    return InvalidArgument(what + " has zeros, which only q4 and q2 have");
  return Status::Ok();
}

bool HasQuantized(const MatmulParams& p) {
  for (int i = 0; i < p.outputs; ++i)
    if (quant::IsQuantized(p.w[i]->format)) return true;
  return false;
}

bool QuantFusesEnds(const MatmulParams& p, bool exact) {
  if (exact || p.rows != 1 || p.norm || reinterpret_cast<uintptr_t>(p.x) % alignof(float4) != 0)
    return false;
  const Weight& w0 = *p.w[0];
  for (int i = 0; i < p.outputs; ++i) {
    const Weight& w = *p.w[i];
    if (!quant::IsQuantized(w.format) || w.format != w0.format || w.rotated != w0.rotated ||
        (w.rotated && w.rotation_seed != w0.rotation_seed) || w.cols != w0.cols)
      return false;
  }
  return !p.swiglu || (p.outputs == 2 && p.w[1]->rows == w0.rows);
}

size_t QuantDeviceBytes(const Weight& host) {
  return CodeBytes(host) +
         static_cast<size_t>(PaddedGroups(host.cols) * PaddedRows(host.rows)) * sizeof(float2);
}

void PackQuantWeight(const Weight& host, uint8_t* out) {
  switch (host.format) {
    case Format::kQ8:
      PackCodes<Format::kQ8>(host, out);
      break;
    case Format::kQ4:
      PackCodes<Format::kQ4>(host, out);
      break;
    case Format::kQ2:
      PackCodes<Format::kQ2>(host, out);
      break;
    default:
      PackCodes<Format::kQ1>(host, out);
      break;
  }
  // (mul, add) of every group, [groups_pad, rows_pad]; padding (0, 0).
  const int64_t groups = host.cols / quant::kGroup, groups_pad = PaddedGroups(host.cols);
  const int64_t rows_pad = PaddedRows(host.rows);
  auto* affine = reinterpret_cast<float2*>(out + CodeBytes(host));
  const auto* scales = static_cast<const float*>(host.scales);
  const auto* zeros = static_cast<const float*>(host.zeros);
  for (int64_t g = 0; g < groups_pad; ++g) {
    for (int64_t j = 0; j < rows_pad; ++j) {
      float2 v = make_float2(0.0f, 0.0f);
      if (g < groups && j < host.rows) {
        const int64_t i = j * groups + g;
        quant::Affine a = quant::GroupAffine(host.format, scales[i], zeros ? zeros + i : nullptr);
        v = make_float2(a.mul, a.add);
      }
      affine[g * rows_pad + j] = v;
    }
  }
}

Weight QuantDeviceWeight(const Weight& host, void* device) {
  Weight w = host;
  w.data = device;
  w.scales = static_cast<const uint8_t*>(device) + CodeBytes(host);
  w.zeros = nullptr;  // folded into the (mul, add) pairs
  return w;
}

void LaunchRotateToBf16(const float* x, int64_t rows, const Weight& w, void* out,
                        cudaStream_t stream) {
  const int64_t groups = w.cols / quant::kGroup, items = rows * groups;
  if (items == 0) return;
  LaunchDependent(PrepareActivationsKernel, dim3(static_cast<unsigned>((items + 3) / 4)), dim3(128),
                  0, stream, x, rows, w.cols, w.rotated, w.rotation_seed, nullptr,
                  static_cast<__nv_bfloat16*>(out), nullptr, nullptr, (rows + 7) / 8, groups);
}

void LaunchRotateRows(const float* x, int64_t rows, int64_t cols, uint64_t seed, float* out,
                      cudaStream_t stream) {
  // Items are (row, group) of the real rows: row_tiles 1 / groups_pad of a group count.
  const int64_t items = rows * (cols / quant::kGroup);
  if (items == 0) return;
  LaunchDependent(PrepareActivationsKernel, dim3(static_cast<unsigned>((items + 3) / 4)), dim3(128),
                  0, stream, x, rows, cols, true, seed, out, nullptr, nullptr, nullptr,
                  (rows + 7) / 8, cols / quant::kGroup);
}

void LaunchDequantBf16(const Weight& w, void* out, cudaStream_t stream) {
  const int64_t steps = PaddedGroups(w.cols) / (w.format == Format::kQ1 ? 2 : 1);
  const int64_t units = PaddedRows(w.rows) / 16 * steps;
  const unsigned blocks = static_cast<unsigned>((units + 7) / 8);
  const auto* codes = static_cast<const uint4*>(w.data);
  const auto* affine = static_cast<const float2*>(w.scales);
  auto* dst = static_cast<__nv_bfloat16*>(out);
  switch (w.format) {
    case Format::kQ8:
      DequantBf16Kernel<Format::kQ8>
          <<<blocks, 256, 0, stream>>>(codes, affine, w.rows, w.cols, dst);
      break;
    case Format::kQ4:
      DequantBf16Kernel<Format::kQ4>
          <<<blocks, 256, 0, stream>>>(codes, affine, w.rows, w.cols, dst);
      break;
    case Format::kQ2:
      DequantBf16Kernel<Format::kQ2>
          <<<blocks, 256, 0, stream>>>(codes, affine, w.rows, w.cols, dst);
      break;
    default:
      DequantBf16Kernel<Format::kQ1>
          <<<blocks, 256, 0, stream>>>(codes, affine, w.rows, w.cols, dst);
      break;
  }
  GZ_CUDA_LAUNCHED();
}

MatmulParams LaunchQuantMatmul(const MatmulParams& p, bool exact, QuantScratch* scratch,
                               cudaStream_t stream) {
  MatmulParams plain;
  plain.x = p.x;
  plain.rows = p.rows;
  plain.outputs = 0;
  const int64_t cols = p.w[0]->cols;
  const int64_t row_tiles = (p.rows + 7) / 8, groups_pad = PaddedGroups(cols);
  bool done[MatmulParams::kMaxOutputs] = {};
  // Batch-1 decode rotates inside the matmul kernel (float4 loads of x).
  const bool decode =
      !exact && p.rows == 1 && reinterpret_cast<uintptr_t>(p.x) % alignof(float4) == 0;
  bool prepared = false, prepared_rotated = false;
  uint64_t prepared_seed = 0;
  const float* xr = nullptr;  // exact mode: the rotated float32 activations
  QuantScratchView act;       // fast mode
  for (int i = 0; i < p.outputs; ++i) {
    const Weight& wi = *p.w[i];
    if (!quant::IsQuantized(wi.format)) {
      plain.w[plain.outputs] = p.w[i];
      plain.out[plain.outputs] = p.out[i];
      plain.bias[plain.outputs] = p.bias[i];
      ++plain.outputs;
      continue;
    }
    if (done[i]) continue;
    // The outputs of one launch: this format and rotation.
    auto same = [&](const Weight& w) {
      return w.format == wi.format && w.rotated == wi.rotated &&
             (!w.rotated || w.rotation_seed == wi.rotation_seed);
    };
    QuantSet set;
    unsigned blocks = 0;
    for (int j = i; j < p.outputs; ++j) {
      if (done[j] || !same(*p.w[j])) continue;
      done[j] = true;
      set.codes[set.count] = static_cast<const uint4*>(p.w[j]->data);
      set.affine[set.count] = static_cast<const float2*>(p.w[j]->scales);
      set.bias[set.count] = p.bias[j];
      set.out[set.count] = p.out[j];
      set.n[set.count] = p.w[j]->rows;
      set.first_block[set.count] = blocks;
      blocks += static_cast<unsigned>(PaddedRows(p.w[j]->rows) / 16);  // LaunchSet regroups
      ++set.count;
    }
    set.first_block[set.count] = blocks;
    if (p.accumulate || p.swiglu) {
      // The caller checked QuantFusesEnds: one decode set holds every output.
      set.accumulate = p.accumulate;
      set.swiglu = p.swiglu;
    }

    // The activations, once per rotation.
    if (decode) {
      xr = p.x;
    } else if (!prepared || prepared_rotated != wi.rotated ||
               (wi.rotated && prepared_seed != wi.rotation_seed)) {
      prepared = true;
      prepared_rotated = wi.rotated;
      prepared_seed = wi.rotation_seed;
      if (exact) {
        xr = p.x;
        if (wi.rotated) {
          auto* rotated = static_cast<float*>(scratch->x32.Get(p.rows * cols * sizeof(float)));
          // Items are (row, group) of the real rows: row_tiles 1 / groups_pad of a group count.
          const int64_t items = p.rows * (cols / quant::kGroup);
          LaunchDependent(PrepareActivationsKernel, dim3(static_cast<unsigned>((items + 3) / 4)),
                          dim3(128), 0, stream, p.x, p.rows, cols, true, wi.rotation_seed, rotated,
                          nullptr, nullptr, nullptr, (p.rows + 7) / 8, cols / quant::kGroup);
          xr = rotated;
        }
      } else {
        auto* xh = static_cast<__half*>(
            scratch->xh.Get(row_tiles * 8 * groups_pad * quant::kGroup * sizeof(__half)));
        auto* xsum =
            static_cast<float*>(scratch->xsum.Get(row_tiles * 8 * groups_pad * sizeof(float)));
        const int64_t items = row_tiles * 8 * groups_pad;
        LaunchDependent(PrepareActivationsKernel, dim3(static_cast<unsigned>((items + 3) / 4)),
                        dim3(128), 0, stream, p.x, p.rows, cols, wi.rotated, wi.rotation_seed,
                        nullptr, nullptr, xh, xsum, row_tiles, groups_pad);
        act.xh = reinterpret_cast<const uint4*>(xh);
        act.xsum = xsum;
      }
    }
    const float* x = xr;
    switch (wi.format) {
      case Format::kQ8:
        LaunchSet<Format::kQ8>(set, blocks, exact, decode, x, p.rows, cols, wi.rotated,
                               wi.rotation_seed, row_tiles, act, stream);
        break;
      case Format::kQ4:
        LaunchSet<Format::kQ4>(set, blocks, exact, decode, x, p.rows, cols, wi.rotated,
                               wi.rotation_seed, row_tiles, act, stream);
        break;
      case Format::kQ2:
        LaunchSet<Format::kQ2>(set, blocks, exact, decode, x, p.rows, cols, wi.rotated,
                               wi.rotation_seed, row_tiles, act, stream);
        break;
      default:
        LaunchSet<Format::kQ1>(set, blocks, exact, decode, x, p.rows, cols, wi.rotated,
                               wi.rotation_seed, row_tiles, act, stream);
        break;
    }
  }
  return plain;
}

}  // namespace gizllm::cuda
