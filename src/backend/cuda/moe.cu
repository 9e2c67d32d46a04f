// The mixture-of-experts feed-forward (MoeFeedForward) on the device, from the router to the
// weighted sum, with no host round-trip (the whole op records into a CUDA graph):
//   router logits: the float32 GEMV (few rows) or the tiled float32 GEMM, in every mode;
//   MoeRouteKernel: per row, softmax, the top k (lowest index first among equals), renormalized
//     with norm_topk_prob, the picks then ordered by expert index (the order of the sum);
// then, for at most kMoeDecodeRows rows (decode):
//   MoeGateUpDecodeKernel: per (row, pick), silu(gate x) * up x, streaming only the picked
//     experts' gate and up rows (one row reads top_k experts, never the others);
//   MoeDownDecodeKernel: per row, the picked experts' down rows against their hidden units, the
//     weighted sum over the picks in the same warp (fused: no per-pick output is written);
// or, for more rows (prompts, batches):
//   MoePlanKernel: one block counts the picks of each expert, places them sorted by expert and
//     lists tiles of up to kMoeTile rows of one expert;
//   a grouped GEMM over those tiles for gate/up (SwiGLU at its end) and one for down: bf16 tensor
//     cores (fast mode, bf16 weights), or in fast mode with about kMoeFewRows rows an expert or
//     fewer (batches of decode rows) MoeGroupedFewKernel, which streams each expert's weights once
//     against its few rows; float32 (exact mode, other formats); one launch each, blocks past the
//     tiles in use leave at once;
//   MoeCombineKernel: each row's weighted sum of its picks' down outputs in expert order (a
//     gather, so the sum's order is fixed and the result deterministic).
// Quantized experts (q8, q4, q2, q1 in the device layout of quant_layout.cuh, each expert its own
// weight, its 16-row tiles contiguous) run in float32 in every mode: their inputs rotated first
// where the weights were (x once for gate/up, the hidden units once for down), then
//   decode: MoeQuantGateUpDecodeKernel and MoeQuantDownDecodeKernel, a block per 16-output tile
//     of a picked expert, its warps over the tile's steps, each value mul * code + add;
//   many rows: in fast mode, where every expert has its bf16 copy (CudaOptions::bf16_copies,
//     MoeDevice::copies), the bf16 grouped path over the copies; else with about kMoeFewRows
//     rows an expert or fewer, MoeQuantGroupedFewKernel (each tile of codes read once for up to
//     kQuantFewPass rows of its expert); otherwise the same grouped float32 GEMM, each weight
//     value read from the packed layout as it is staged (QuantValueAt).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <algorithm>
#include <cub/block/block_scan.cuh>

#include "backend/cuda/kernels.cuh"
#include "backend/cuda/quant_layout.cuh"
#include "backend/cuda/weight_loads.cuh"

namespace gizllm::cuda {
namespace {

constexpr int kWarps = 8;   // warps of the decode kernels' blocks (one output each)
constexpr int kUnroll = 4;  // 16-byte weight loads in flight per lane and matrix

__device__ __forceinline__ float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float Silu(float g) { return g / (1.0f + expf(-g)); }

// v, or v rounded to bf16 (the fast mode's activations).
__device__ __forceinline__ float Activation(float v, bool bf16) {
  return bf16 ? __bfloat162float(__float2bfloat16(v)) : v;
}

// The 8 (or 4) products of a weight pack and the activations at x (rounded to bf16 with bf16).
template <int E>
__device__ __forceinline__ float PackDot(const float* wf, const float* x, bool bf16) {
  float s = 0.0f;
  const float4* x4 = reinterpret_cast<const float4*>(x);
#pragma unroll
  for (int q = 0; q < E / 4; ++q) {
    float4 v = __ldg(x4 + q);
    if (bf16) {
      v.x = Activation(v.x, true), v.y = Activation(v.y, true);
      v.z = Activation(v.z, true), v.w = Activation(v.w, true);
    }
    s += wf[4 * q] * v.x + wf[4 * q + 1] * v.y + wf[4 * q + 2] * v.z + wf[4 * q + 3] * v.w;
  }
  return s;
}

// ---- Routing ----

constexpr int kRouteWarps = 8;
constexpr int kPerLane = kMoeMaxExperts / 32;

// One warp per row: softmax of the router logits, the top k, their weights (renormalized with
// norm), written as (expert, weight) pairs in increasing expert order.
__global__ void __launch_bounds__(kRouteWarps * 32)
    MoeRouteKernel(const float* __restrict__ logits,  // [rows, experts]
                   int64_t rows, int experts, int k, bool norm,
                   int* __restrict__ ids,          // [rows, k]
                   float* __restrict__ weights) {  // [rows, k]
  const int lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRouteWarps + threadIdx.x / 32;
  if (row >= rows) return;
  const float* z = logits + row * experts;
  float p[kPerLane];
  float max = -INFINITY;
#pragma unroll
  for (int q = 0; q < kPerLane; ++q) {
    const int e = lane + 32 * q;
    p[q] = e < experts ? z[e] : -INFINITY;
    max = fmaxf(max, p[q]);
  }
  for (int o = 16; o > 0; o >>= 1) max = fmaxf(max, __shfl_xor_sync(0xffffffffu, max, o));
  float total = 0.0f;
#pragma unroll
  for (int q = 0; q < kPerLane; ++q) {
    const int e = lane + 32 * q;
    p[q] = e < experts ? expf(p[q] - max) : 0.0f;
    total += p[q];
  }
  total = WarpSum(total);
#pragma unroll
  for (int q = 0; q < kPerLane; ++q) p[q] /= total;
  int* row_ids = ids + row * k;
  float* row_weights = weights + row * k;
  unsigned taken = 0;  // bit q: expert lane + 32 q is picked
  float sum = 0.0f;
  for (int j = 0; j < k; ++j) {
    // This lane's best untaken expert (its experts ascend: strict > keeps the lowest index).
    float best = -1.0f;
    int index = 0x7fffffff;
#pragma unroll
    for (int q = 0; q < kPerLane; ++q) {
      const int e = lane + 32 * q;
      if (e < experts && !(taken >> q & 1u) && p[q] > best) {
        best = p[q];
        index = e;
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float b = __shfl_xor_sync(0xffffffffu, best, o);
      const int i = __shfl_xor_sync(0xffffffffu, index, o);
      if (b > best || (b == best && i < index)) {
        best = b;
        index = i;
      }
    }
    if (index % 32 == lane) taken |= 1u << (index / 32);
    if (lane == 0) {
      row_ids[j] = index;
      row_weights[j] = best;
    }
    sum += best;
  }
  __syncwarp();
  if (lane != 0) return;
  // The picks in increasing expert order (insertion sort of k pairs), renormalized by their sum
  // in the order they were picked (as the CPU op sums them).
  for (int j = 1; j < k; ++j) {
    const int e = row_ids[j];
    const float w = row_weights[j];
    int i = j - 1;
    for (; i >= 0 && row_ids[i] > e; --i) {
      row_ids[i + 1] = row_ids[i];
      row_weights[i + 1] = row_weights[i];
    }
    row_ids[i + 1] = e;
    row_weights[i + 1] = w;
  }
  if (norm) {
    for (int j = 0; j < k; ++j) row_weights[j] /= sum;
  }
}

// ---- Decode: few rows, only the picked experts' weights read ----

// h[slot, i] = silu(gate_e[i] . x_r) * (up_e[i] . x_r) for slot = r * k + j, e = ids[slot]; a
// warp per hidden unit i. table: [gate of each expert, up of each expert, down of each expert].
// bf16: x rounded to bf16 (the fast mode's many-row steps, as the grouped path's tensor cores).
template <typename T, bool kVec>
__global__ void __launch_bounds__(kWarps * 32)
    MoeGateUpDecodeKernel(const float* __restrict__ x, const int* __restrict__ ids,
                          const void* const* __restrict__ table, int experts, int k, int64_t dim,
                          int64_t ffn, bool bf16, float* __restrict__ h) {
  using P = Pack<T>;
  constexpr int E = P::kCount;
  const int lane = threadIdx.x % 32;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int slot = blockIdx.y;
  if (i >= ffn) return;
  const int e = ids[slot];
  const T* __restrict__ g = static_cast<const T*>(table[e]) + i * dim;
  const T* __restrict__ u = static_cast<const T*>(table[experts + e]) + i * dim;
  const float* __restrict__ xr = x + static_cast<int64_t>(slot / k) * dim;
  float ag = 0.0f, au = 0.0f;
  if constexpr (kVec) {
    const int packs = static_cast<int>(dim / E);
    for (int c0 = lane; c0 < packs; c0 += 32 * kUnroll) {
      uint4 vg[kUnroll], vu[kUnroll];
#pragma unroll
      for (int q = 0; q < kUnroll; ++q) {
        const int c = c0 + 32 * q;
        if (c < packs) {
          vg[q] = LoadStreaming(g + c * E);
          vu[q] = LoadStreaming(u + c * E);
        }
      }
#pragma unroll
      for (int q = 0; q < kUnroll; ++q) {
        const int c = c0 + 32 * q;
        if (c < packs) {
          float wf[E];
          P::Unpack(vg[q], wf);
          ag += PackDot<E>(wf, xr + c * E, bf16);
          P::Unpack(vu[q], wf);
          au += PackDot<E>(wf, xr + c * E, bf16);
        }
      }
    }
  } else {
    for (int64_t c = lane; c < dim; c += 32) {
      const float xc = Activation(xr[c], bf16);
      ag += ToFloat(g[c]) * xc;
      au += ToFloat(u[c]) * xc;
    }
  }
  ag = WarpSum(ag);
  au = WarpSum(au);
  if (lane == 0) h[static_cast<int64_t>(slot) * ffn + i] = Silu(ag) * au;
}

// out[r, c] (+)= sum over the row's picks j (in expert order) of weight_j * (down_e[c] . h[slot])
// with slot = r * k + j; a warp per output c, its lanes over every (pick, pack) so that loads of
// several experts are in flight together. bf16: h rounded to bf16.
template <typename T, bool kVec>
__global__ void __launch_bounds__(kWarps * 32)
    MoeDownDecodeKernel(const float* __restrict__ h, const int* __restrict__ ids,
                        const float* __restrict__ weights, const void* const* __restrict__ table,
                        int experts, int k, int64_t dim, int64_t ffn, bool bf16,
                        float* __restrict__ out, bool accumulate) {
  using P = Pack<T>;
  constexpr int E = P::kCount;
  const int lane = threadIdx.x % 32;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int64_t r = blockIdx.y;
  if (c >= dim) return;
  const int* row_ids = ids + r * k;
  const float* row_weights = weights + r * k;
  const void* const* down = table + 2 * experts;
  float acc = 0.0f;
  if constexpr (kVec) {
    // 32-bit (pick, pack) indices: ffn * k is far below 2^31.
    const int packs = static_cast<int>(ffn / E), total = packs * k;
    for (int t0 = lane; t0 < total; t0 += 32 * kUnroll) {
      uint4 v[kUnroll];
#pragma unroll
      for (int q = 0; q < kUnroll; ++q) {
        const int t = t0 + 32 * q;
        if (t < total) {
          const int j = t / packs, p = t % packs;
          v[q] = LoadStreaming(static_cast<const T*>(down[row_ids[j]]) + c * ffn + p * E);
        }
      }
#pragma unroll
      for (int q = 0; q < kUnroll; ++q) {
        const int t = t0 + 32 * q;
        if (t < total) {
          const int j = t / packs, p = t % packs;
          float wf[E];
          P::Unpack(v[q], wf);
          acc += row_weights[j] * PackDot<E>(wf, h + (r * k + j) * ffn + p * E, bf16);
        }
      }
    }
  } else {
    for (int j = 0; j < k; ++j) {
      const T* w = static_cast<const T*>(down[row_ids[j]]) + c * ffn;
      const float* hs = h + (r * k + j) * ffn;
      float part = 0.0f;
      for (int64_t i = lane; i < ffn; i += 32) part += ToFloat(w[i]) * Activation(hs[i], bf16);
      acc += row_weights[j] * part;
    }
  }
  acc = WarpSum(acc);
  if (lane == 0) {
    float* o = out + r * dim + c;
    *o = accumulate ? *o + acc : acc;
  }
}

// ---- Decode of quantized experts ----

// Lane `lane`'s share of a 16-output tile of a quantized weight [n, cols] against one row of
// (rotated) activations x, over the steps [s0, s1): acc[0] for output row lane / 4 of the tile,
// acc[1] for row lane / 4 + 8, each group's share as mul * sum(c x) + add * sum(x).
template <Format F>
__device__ __forceinline__ void QuantTileDot(const uint4* __restrict__ codes,
                                             const float2* __restrict__ affine, int64_t n,
                                             int64_t cols, int64_t tile, int64_t s0, int64_t s1,
                                             const float* __restrict__ x, int lane, float* acc) {
  using Q = QuantTraits<F>;
  const int g8 = lane >> 2, q4 = lane & 3;
  const int64_t groups = cols / quant::kGroup, rows_pad = PaddedRows(n);
  const int64_t steps = PaddedGroups(cols) / Q::kGroupsPerStep;
  const uint4* wp = codes + tile * steps * Q::kLoads * 32 + lane;
  for (int64_t st = s0; st < s1; ++st) {
    uint4 raw[Q::kLoads];
#pragma unroll
    for (int i = 0; i < Q::kLoads; ++i) raw[i] = LoadStreaming(wp + (st * Q::kLoads + i) * 32);
    const uint32_t* words = reinterpret_cast<const uint32_t*>(raw);
#pragma unroll
    for (int gs = 0; gs < Q::kGroupsPerStep; ++gs) {
      const int64_t g = st * Q::kGroupsPerStep + gs;
      if (g >= groups) continue;  // the padding group of an odd count
      const float2 f0 = __ldg(affine + g * rows_pad + tile * 16 + g8);
      const float2 f1 = __ldg(affine + g * rows_pad + tile * 16 + g8 + 8);
      float cx0 = 0.0f, cx1 = 0.0f, xs = 0.0f;
#pragma unroll
      for (int s = 0; s < 8; ++s) {
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
          const int64_t k = g * quant::kGroup + 16 * s + 2 * q4 + 8 * hi;
          const float2 xv = __ldg(reinterpret_cast<const float2*>(x + k));
          xs += xv.x + xv.y;
          const float2 c0 = __half22float2(CodePairAt<F>(words, (gs * 8 + s) * 4 + 2 * hi));
          const float2 c1 = __half22float2(CodePairAt<F>(words, (gs * 8 + s) * 4 + 2 * hi + 1));
          cx0 += c0.x * xv.x + c0.y * xv.y;
          cx1 += c1.x * xv.x + c1.y * xv.y;
        }
      }
      acc[0] += f0.x * cx0 + f0.y * xs;
      acc[1] += f1.x * cx1 + f1.y * xs;
    }
  }
}

// acc summed over the 4 lanes of each output row; lanes with lane % 4 == 0 write rows lane / 4
// and lane / 4 + 8 of `part` [16].
__device__ __forceinline__ void StoreTileRows(float* acc, int lane, float* part) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    acc[h] += __shfl_xor_sync(0xffffffffu, acc[h], 1);
    acc[h] += __shfl_xor_sync(0xffffffffu, acc[h], 2);
  }
  if (lane % 4 == 0) {
    part[lane / 4] = acc[0];
    part[lane / 4 + 8] = acc[1];
  }
}

// h[slot, i] = silu(gate_e[i] . x_r) * (up_e[i] . x_r) for slot = r * k + j, e = ids[slot], i in
// the block's 16-output tile; the warps split the tile's steps. x: rotated where the weights are.
// table: [gate, up, down of each expert (codes)], then [the same (mul, add) pairs].
template <Format F>
__global__ void __launch_bounds__(kWarps * 32)
    MoeQuantGateUpDecodeKernel(const float* __restrict__ x,  // [rows, dim]
                               const int* __restrict__ ids, const void* const* __restrict__ table,
                               int experts, int k, int64_t dim, int64_t ffn,
                               float* __restrict__ h) {  // [rows * k, ffn]
  __shared__ float parts[2][kWarps][16];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t tile = blockIdx.x;
  const int slot = blockIdx.y;
  const int e = ids[slot];
  const float* xr = x + static_cast<int64_t>(slot / k) * dim;
  const int64_t steps = PaddedGroups(dim) / QuantTraits<F>::kGroupsPerStep;
  const int64_t s0 = steps * warp / kWarps, s1 = steps * (warp + 1) / kWarps;
#pragma unroll
  for (int o = 0; o < 2; ++o) {
    const int index = o * experts + e;
    float acc[2] = {0.0f, 0.0f};
    QuantTileDot<F>(static_cast<const uint4*>(table[index]),
                    static_cast<const float2*>(table[3 * experts + index]), ffn, dim, tile, s0, s1,
                    xr, lane, acc);
    StoreTileRows(acc, lane, parts[o][warp]);
  }
  __syncthreads();
  if (threadIdx.x >= 16) return;
  const int64_t i = tile * 16 + threadIdx.x;
  if (i >= ffn) return;
  float g = 0.0f, u = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    g += parts[0][w][threadIdx.x];
    u += parts[1][w][threadIdx.x];
  }
  h[static_cast<int64_t>(slot) * ffn + i] = Silu(g) * u;
}

// out[r, c] (+)= sum over the row's picks j (in expert order) of weight_j * (down_e[c] . h[slot])
// with slot = r * k + j, c in the block's 16-output tile. h: rotated where the weights are.
template <Format F>
__global__ void __launch_bounds__(kWarps * 32)
    MoeQuantDownDecodeKernel(const float* __restrict__ h,  // [rows * k, ffn]
                             const int* __restrict__ ids, const float* __restrict__ weights,
                             const void* const* __restrict__ table, int experts, int k, int64_t dim,
                             int64_t ffn, float* __restrict__ out, bool accumulate) {
  __shared__ float parts[kWarps][16];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t tile = blockIdx.x, r = blockIdx.y;
  const int64_t steps = PaddedGroups(ffn) / QuantTraits<F>::kGroupsPerStep;
  const int64_t s0 = steps * warp / kWarps, s1 = steps * (warp + 1) / kWarps;
  float total[2] = {0.0f, 0.0f};
  for (int j = 0; j < k; ++j) {
    const int64_t slot = r * k + j;
    const int index = 2 * experts + ids[slot];
    float acc[2] = {0.0f, 0.0f};
    QuantTileDot<F>(static_cast<const uint4*>(table[index]),
                    static_cast<const float2*>(table[3 * experts + index]), dim, ffn, tile, s0, s1,
                    h + slot * ffn, lane, acc);
    total[0] += weights[slot] * acc[0];
    total[1] += weights[slot] * acc[1];
  }
  StoreTileRows(total, lane, parts[warp]);
  __syncthreads();
  if (threadIdx.x >= 16) return;
  const int64_t c = tile * 16 + threadIdx.x;
  if (c >= dim) return;
  float sum = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) sum += parts[w][threadIdx.x];
  float* o = out + r * dim + c;
  *o = accumulate ? *o + sum : sum;
}

// ---- Many rows: picks sorted by expert, grouped GEMMs over tiles of one expert ----

constexpr int kPlanThreads = kMoeMaxExperts;

// Counts each expert's picks, their places when sorted by expert (pos: sorted[pos] = slot,
// slot_pos[slot] = pos; the order within an expert does not change any result) and the tiles:
// (expert, first place, rows) for every kMoeTile places of an expert, *tile_count of them.
__global__ void __launch_bounds__(kPlanThreads)
    MoePlanKernel(const int* __restrict__ ids, int slots, int experts, int* __restrict__ sorted,
                  int* __restrict__ slot_pos, int4* __restrict__ tiles,
                  int* __restrict__ tile_count) {
  using Scan = cub::BlockScan<int, kPlanThreads>;
  __shared__ typename Scan::TempStorage scan;
  __shared__ int count[kPlanThreads], cursor[kPlanThreads];
  const int t = threadIdx.x;
  count[t] = 0;
  __syncthreads();
  for (int s = t; s < slots; s += kPlanThreads) atomicAdd(&count[ids[s]], 1);
  __syncthreads();
  const int c = t < experts ? count[t] : 0;
  const int n = (c + kMoeTile - 1) / kMoeTile;
  int first = 0, first_tile = 0, tiles_total = 0;
  Scan(scan).ExclusiveSum(c, first);
  __syncthreads();
  Scan(scan).ExclusiveSum(n, first_tile, tiles_total);
  cursor[t] = first;
  for (int i = 0; i < n; ++i)
    tiles[first_tile + i] = make_int4(t, first + i * kMoeTile, min(kMoeTile, c - i * kMoeTile), 0);
  if (t == 0) *tile_count = tiles_total;
  __syncthreads();
  for (int s = t; s < slots; s += kPlanThreads) {
    const int pos = atomicAdd(&cursor[ids[s]], 1);
    sorted[pos] = s;
    slot_pos[s] = pos;
  }
}

// The input row of place `pos` of a grouped GEMM: x's row of the pick (gate/up) or the hidden
// units at pos (down).
template <bool kGateUp>
__device__ __forceinline__ const float* GroupedRow(const float* a, const int* sorted, int k,
                                                   int64_t cols, int pos) {
  if constexpr (kGateUp) return a + static_cast<int64_t>(sorted[pos] / k) * cols;
  return a + static_cast<int64_t>(pos) * cols;
}

constexpr int kF32Depth = 16;

// Element (j, c) of one expert's weight [n, cols], table entry `index`: a plain format T, or a
// quantized format F in the device layout (its (mul, add) pairs at entry 3 experts + index).
template <typename T>
struct PlainExpert {
  const T* w;
  __device__ PlainExpert(const void* const* table, int experts, int index)
      : w(static_cast<const T*>(table[index])) {}
  __device__ float At(int64_t n, int64_t cols, int64_t j, int64_t c) const {
    return ToFloat(w[j * cols + c]);
  }
};
template <Format F>
struct QuantExpert {
  const uint4* codes;
  const float2* affine;
  __device__ QuantExpert(const void* const* table, int experts, int index)
      : codes(static_cast<const uint4*>(table[index])),
        affine(static_cast<const float2*>(table[3 * experts + index])) {}
  __device__ float At(int64_t n, int64_t cols, int64_t j, int64_t c) const {
    return QuantValueAt<F>(codes, affine, n, cols, j, c);
  }
};

// Exact grouped GEMM (float32 activations and sums, any weight format W reads): a block computes
// a kMoeTile x kMoeTile tile, rows of one tile of the plan against `n` outputs of its expert;
// gate/up: out[pos, i] = silu(gate . x) * (up . x) (out: h [places, ffn]); down: out[pos, c] =
// down . h[pos] (out: [places, dim]).
template <typename W, bool kGateUp>
__global__ void __launch_bounds__(256)
    MoeGroupedF32Kernel(const float* __restrict__ a, const int* __restrict__ sorted,
                        const int4* __restrict__ tiles, const int* __restrict__ tile_count,
                        const void* const* __restrict__ table, int experts, int k, int64_t n,
                        int64_t cols, float* __restrict__ out) {
  constexpr int kOut = kGateUp ? 2 : 1;
  if (static_cast<int>(blockIdx.y) >= *tile_count) return;
  const int4 tile = tiles[blockIdx.y];
  const int e = tile.x, start = tile.y, count = tile.z;
  // gate and up, or down (twice).
  const W w0(table, experts, kGateUp ? e : 2 * experts + e);
  const W w1(table, experts, kGateUp ? experts + e : 2 * experts + e);
  __shared__ float xs[kF32Depth][kMoeTile + 4];        // [k][row]
  __shared__ float ws[kOut][kF32Depth][kMoeTile + 4];  // [k][output]
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kMoeTile;
  float acc[kOut][4][4] = {};
  for (int64_t k0 = 0; k0 < cols; k0 += kF32Depth) {
    for (int t = threadIdx.x; t < kMoeTile * kF32Depth; t += 256) {
      const int i = t / kF32Depth, kk = t % kF32Depth;
      const int64_t c = k0 + kk, wr = col0 + i;
      xs[kk][i] =
          i < count && c < cols ? GroupedRow<kGateUp>(a, sorted, k, cols, start + i)[c] : 0.0f;
#pragma unroll
      for (int o = 0; o < kOut; ++o)
        ws[o][kk][i] = wr < n && c < cols ? (o == 0 ? w0 : w1).At(n, cols, wr, c) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kF32Depth; ++kk) {
      float av[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) av[i] = xs[kk][ty * 4 + i];
#pragma unroll
      for (int o = 0; o < kOut; ++o) {
        float bv[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) bv[j] = ws[o][kk][tx * 4 + j];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[o][i][j] += av[i] * bv[j];
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int row = ty * 4 + i;
    if (row >= count) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t c = col0 + tx * 4 + j;
      if (c >= n) continue;
      float v = acc[0][i][j];
      if constexpr (kGateUp) v = Silu(v) * acc[1][i][j];
      out[static_cast<int64_t>(start + row) * n + c] = v;
    }
  }
}

// The same on the tensor cores (fast mode, bf16 weights): activations rounded to bf16 as they
// are staged, float32 sums. 4 warps, each a 32 x 32 quarter of the 64 x 64 tile, in 16 x 16 x 16
// steps over kMmaDepth inputs at a time.
constexpr int kMmaDepth = 32, kMmaPad = 8, kMmaLd = kMmaDepth + kMmaPad, kOutLd = kMoeTile + 4;

template <bool kGateUp>
__global__ void __launch_bounds__(128)
    MoeGroupedMmaKernel(const float* __restrict__ a, const int* __restrict__ sorted,
                        const int4* __restrict__ tiles, const int* __restrict__ tile_count,
                        const void* const* __restrict__ table, int experts, int k, int64_t n,
                        int64_t cols, float* __restrict__ out) {
  using namespace nvcuda;
  constexpr int kOut = kGateUp ? 2 : 1;
  constexpr int kStageBytes = (1 + kOut) * kMoeTile * kMmaLd * 2;
  constexpr int kEpilogueBytes = kOut * kMoeTile * kOutLd * 4;
  __shared__ __align__(
      128) unsigned char smem[kStageBytes > kEpilogueBytes ? kStageBytes : kEpilogueBytes];
  if (static_cast<int>(blockIdx.y) >= *tile_count) return;
  const int4 tile = tiles[blockIdx.y];
  const int e = tile.x, start = tile.y, count = tile.z;
  const __nv_bfloat16* w[kOut];
  if constexpr (kGateUp) {
    w[0] = static_cast<const __nv_bfloat16*>(table[e]);
    w[1] = static_cast<const __nv_bfloat16*>(table[experts + e]);
  } else {
    w[0] = static_cast<const __nv_bfloat16*>(table[2 * experts + e]);
  }
  auto* as = reinterpret_cast<__nv_bfloat16(*)[kMmaLd]>(smem);  // [row][input]
  auto* bs = reinterpret_cast<__nv_bfloat16(*)[kMoeTile][kMmaLd]>(
      smem + kMoeTile * kMmaLd * 2);                              // [o][output][input]
  auto* cs = reinterpret_cast<float(*)[kMoeTile][kOutLd]>(smem);  // [o][row][output]
  const int tid = threadIdx.x, warp = tid / 32;
  const int wm = warp / 2, wn = warp % 2;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kMoeTile;
  // Staging: a thread loads 16 inputs of row tid / 2 and two 8-weight packs of each output.
  const int a_row = tid / 2, a_col = (tid % 2) * 16;
  const float* a_src =
      a_row < count ? GroupedRow<kGateUp>(a, sorted, k, cols, start + a_row) : nullptr;
  const bool vec = cols % 8 == 0;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kOut][2][2];
#pragma unroll
  for (int o = 0; o < kOut; ++o)
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[o][i][j], 0.0f);
  for (int64_t k0 = 0; k0 < cols; k0 += kMmaDepth) {
#pragma unroll
    for (int q = 0; q < 16; q += 4) {
      const int64_t c = k0 + a_col + q;
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (a_src) {
        if (vec && c + 3 < cols) {
          v = *reinterpret_cast<const float4*>(a_src + c);
        } else {
          v.x = c < cols ? a_src[c] : 0.0f;
          v.y = c + 1 < cols ? a_src[c + 1] : 0.0f;
          v.z = c + 2 < cols ? a_src[c + 2] : 0.0f;
          v.w = c + 3 < cols ? a_src[c + 3] : 0.0f;
        }
      }
      *reinterpret_cast<__nv_bfloat162*>(&as[a_row][a_col + q]) = __floats2bfloat162_rn(v.x, v.y);
      *reinterpret_cast<__nv_bfloat162*>(&as[a_row][a_col + q + 2]) =
          __floats2bfloat162_rn(v.z, v.w);
    }
#pragma unroll
    for (int o = 0; o < kOut; ++o) {
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        const int idx = tid + 128 * s;  // 64 outputs x 4 packs
        const int r = idx / 4, p = (idx % 4) * 8;
        const int64_t wr = col0 + r, c = k0 + p;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (wr < n) {
          const __nv_bfloat16* src = w[o] + wr * cols + c;
          if (vec && c + 8 <= cols) {
            v = LoadStreaming(src);
          } else {
            __align__(16) __nv_bfloat16 t[8];
            for (int q = 0; q < 8; ++q) t[q] = c + q < cols ? src[q] : __float2bfloat16(0.0f);
            v = *reinterpret_cast<const uint4*>(t);
          }
        }
        *reinterpret_cast<uint4*>(&bs[o][r][p]) = v;
      }
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kMmaDepth; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(fa[i], &as[wm * 32 + i * 16][kk], kMmaLd);
#pragma unroll
      for (int o = 0; o < kOut; ++o) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
          wmma::load_matrix_sync(fb, &bs[o][wn * 32 + j * 16][kk], kMmaLd);
#pragma unroll
          for (int i = 0; i < 2; ++i) wmma::mma_sync(acc[o][i][j], fa[i], fb, acc[o][i][j]);
        }
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int o = 0; o < kOut; ++o)
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j)
        wmma::store_matrix_sync(&cs[o][wm * 32 + i * 16][wn * 32 + j * 16], acc[o][i][j], kOutLd,
                                wmma::mem_row_major);
  __syncthreads();
  for (int idx = tid; idx < kMoeTile * kMoeTile; idx += 128) {
    const int r = idx / kMoeTile, c = idx % kMoeTile;
    if (r >= count || col0 + c >= n) continue;
    float v = cs[0][r][c];
    if constexpr (kGateUp) v = Silu(v) * cs[1][r][c];
    out[static_cast<int64_t>(start + r) * n + col0 + c] = v;
  }
}

// Few rows an expert (fast mode, bf16 weights): a batch of decode rows over many experts (64
// rows, top 8 of 128 experts: about 4 rows an expert), where the tensor-core kernel's 64 x 64 tiles
// are mostly padding and its synchronous staging leaves the weights' stream far below the copy
// rate (1.15 ms a layer of the Qwen3-30B-A3B shape at 64 rows, 25% of it). A block takes one tile
// of the plan and kFewOutputs of its expert's outputs, reads each of those weight rows once a pass
// of up to kFewPass of the tile's rows (staged in shared memory as float32), and each warp
// computes kFewWeights weight rows at a time (gate/up: 2 outputs' gate and up rows; down: 4
// outputs), its lanes striding the inputs 8 bf16 values at a time; the inputs rounded to bf16 as
// the tensor-core kernel rounds them, float32 products and sums, the lanes' sums added by
// shuffles.
constexpr int kFewPass = 8;      // a tile's rows a pass
constexpr int kFewOutputs = 64;  // outputs of a block
constexpr int kFewWeights = 4;   // weight rows a warp reads at a time
constexpr int kFewThreads = 256;
constexpr int64_t kFewSharedBytes = 64 << 10;  // the most the staged rows take
// Steps whose picks give the experts at most this many rows each on average take this path.
constexpr int64_t kMoeFewRows = 8;

__device__ __forceinline__ void Bf16x8(const uint4& v, float* f) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 t = __bfloat1622float2(h[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}

template <bool kGateUp>
__global__ void __launch_bounds__(kFewThreads)
    MoeGroupedFewKernel(const float* __restrict__ a, const int* __restrict__ sorted,
                        const int4* __restrict__ tiles, const int* __restrict__ tile_count,
                        const void* const* __restrict__ table, int experts, int k, int64_t n,
                        int64_t cols, int pass_rows, float* __restrict__ out) {
  extern __shared__ float4 xs4[];  // [pass_rows][cols / 4]
  const float* xs = reinterpret_cast<const float*>(xs4);
  if (static_cast<int>(blockIdx.y) >= *tile_count) return;
  const int4 tile = tiles[blockIdx.y];
  const int e = tile.x, start = tile.y, count = tile.z;
  constexpr int kOut = kGateUp ? 2 : 1;       // weights an output reads
  constexpr int kGroup = kFewWeights / kOut;  // outputs a warp computes at once
  const __nv_bfloat16* w[kOut];
  if constexpr (kGateUp) {
    w[0] = static_cast<const __nv_bfloat16*>(table[e]);
    w[1] = static_cast<const __nv_bfloat16*>(table[experts + e]);
  } else {
    w[0] = static_cast<const __nv_bfloat16*>(table[2 * experts + e]);
  }
  constexpr int kFewWarps = kFewThreads / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t out0 = static_cast<int64_t>(blockIdx.x) * kFewOutputs;
  const int64_t quads = cols / 4;
  for (int first = 0; first < count; first += pass_rows) {
    const int rows = min(pass_rows, count - first);
    __syncthreads();  // the last pass's reads of the staged rows are done
    for (int r = 0; r < rows; ++r) {
      const float4* src = reinterpret_cast<const float4*>(
          GroupedRow<kGateUp>(a, sorted, k, cols, start + first + r));
      for (int64_t c = threadIdx.x; c < quads; c += kFewThreads) {
        // Rounded to bf16 as the tensor-core path rounds what it stages (the fast mode's
        // products with bf16 weights take bf16 inputs, whichever kernel runs them).
        const float4 v = src[c];
        xs4[r * quads + c] = make_float4(
            __bfloat162float(__float2bfloat16_rn(v.x)), __bfloat162float(__float2bfloat16_rn(v.y)),
            __bfloat162float(__float2bfloat16_rn(v.z)), __bfloat162float(__float2bfloat16_rn(v.w)));
      }
    }
    __syncthreads();
    for (int g = warp * kGroup; g < kFewOutputs; g += kFewWarps * kGroup) {
      float acc[kOut][kGroup][kFewPass];
#pragma unroll
      for (int o = 0; o < kOut; ++o)
#pragma unroll
        for (int i = 0; i < kGroup; ++i)
#pragma unroll
          for (int r = 0; r < kFewPass; ++r) acc[o][i][r] = 0.0f;
      for (int64_t c = lane * 8; c < cols; c += 32 * 8) {
        uint4 raw[kOut][kGroup];
#pragma unroll
        for (int o = 0; o < kOut; ++o)
#pragma unroll
          for (int i = 0; i < kGroup; ++i) {
            const int64_t j = out0 + g + i;
            raw[o][i] = j < n ? LoadStreaming(w[o] + j * cols + c) : make_uint4(0, 0, 0, 0);
          }
        float wv[kOut][kGroup][8];
#pragma unroll
        for (int o = 0; o < kOut; ++o)
#pragma unroll
          for (int i = 0; i < kGroup; ++i) Bf16x8(raw[o][i], wv[o][i]);
#pragma unroll
        for (int r = 0; r < kFewPass; ++r) {
          if (r < rows) {
            const float4 x0 = *reinterpret_cast<const float4*>(&xs[r * cols + c]);
            const float4 x1 = *reinterpret_cast<const float4*>(&xs[r * cols + c + 4]);
#pragma unroll
            for (int o = 0; o < kOut; ++o)
#pragma unroll
              for (int i = 0; i < kGroup; ++i) {
                const float* v = wv[o][i];
                acc[o][i][r] += v[0] * x0.x + v[1] * x0.y + v[2] * x0.z + v[3] * x0.w +
                                v[4] * x1.x + v[5] * x1.y + v[6] * x1.z + v[7] * x1.w;
              }
          }
        }
      }
#pragma unroll
      for (int o = 0; o < kOut; ++o)
#pragma unroll
        for (int i = 0; i < kGroup; ++i)
#pragma unroll
          for (int r = 0; r < kFewPass; ++r) {
            float v = acc[o][i][r];
#pragma unroll
            for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
            acc[o][i][r] = v;
          }
      if (lane == 0) {
#pragma unroll
        for (int i = 0; i < kGroup; ++i) {
          const int64_t j = out0 + g + i;
#pragma unroll
          for (int r = 0; r < kFewPass; ++r) {
            if (j < n && r < rows) {
              float v = acc[0][i][r];
              if constexpr (kGateUp) v = Silu(v) * acc[kOut - 1][i][r];
              out[static_cast<int64_t>(start + first + r) * n + j] = v;
            }
          }
        }
      }
    }
  }
}

// Few rows an expert, quantized experts (q8, q4, q2, q1; every mode): the grouped GEMM's
// element-by-element dequantization and 64 x 64 tiles cost 38 ms a step at 64 rows of the
// Qwen3-30B-A3B shape at 4 bits. A block takes one tile of the plan and 16 of its expert's
// outputs (one 16-row tile of the device layout); its warps split the steps over the inputs as
// the decode kernels do, and each lane's codes, read once, serve up to kQuantFewPass of the tile's
// rows: per row the same float32 sums in the same order as MoeQuantGateUpDecodeKernel and
// MoeQuantDownDecodeKernel (gate/up: out = h [places, ffn]; down: out [places, dim], the
// weighted sum then MoeCombineKernel's).
constexpr int kQuantFewPass = 8;

template <Format F, bool kGateUp>
__global__ void __launch_bounds__(kWarps * 32)
    MoeQuantGroupedFewKernel(const float* __restrict__ a, const int* __restrict__ sorted,
                             const int4* __restrict__ tiles, const int* __restrict__ tile_count,
                             const void* const* __restrict__ table, int experts, int k, int64_t n,
                             int64_t cols, float* __restrict__ out) {
  using Q = QuantTraits<F>;
  constexpr int kOut = kGateUp ? 2 : 1;
  constexpr int kPass = kQuantFewPass;
  __shared__ float parts[kOut][kWarps][kPass][16];
  if (static_cast<int>(blockIdx.y) >= *tile_count) return;
  const int4 tile = tiles[blockIdx.y];
  const int e = tile.x, start = tile.y, count = tile.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g8 = lane >> 2, q4 = lane & 3;
  const int64_t t16 = blockIdx.x;
  const int64_t groups = cols / quant::kGroup, rows_pad = PaddedRows(n);
  const int64_t steps = PaddedGroups(cols) / Q::kGroupsPerStep;
  const int64_t s0 = steps * warp / kWarps, s1 = steps * (warp + 1) / kWarps;
  for (int first = 0; first < count; first += kPass) {
    const int rows = min(kPass, count - first);
    const float* x[kPass];
#pragma unroll
    for (int r = 0; r < kPass; ++r) {
      x[r] = GroupedRow<kGateUp>(a, sorted, k, cols, start + first + min(r, rows - 1));
    }
#pragma unroll
    for (int o = 0; o < kOut; ++o) {
      const int index = kGateUp ? o * experts + e : 2 * experts + e;
      const float2* affine = static_cast<const float2*>(table[3 * experts + index]);
      const uint4* wp =
          static_cast<const uint4*>(table[index]) + t16 * steps * Q::kLoads * 32 + lane;
      float acc[kPass][2];
#pragma unroll
      for (int r = 0; r < kPass; ++r) acc[r][0] = acc[r][1] = 0.0f;
      for (int64_t st = s0; st < s1; ++st) {
        uint4 raw[Q::kLoads];
#pragma unroll
        for (int i = 0; i < Q::kLoads; ++i) raw[i] = LoadStreaming(wp + (st * Q::kLoads + i) * 32);
        const uint32_t* words = reinterpret_cast<const uint32_t*>(raw);
#pragma unroll
        for (int gs = 0; gs < Q::kGroupsPerStep; ++gs) {
          const int64_t g = st * Q::kGroupsPerStep + gs;
          if (g >= groups) continue;  // the padding group of an odd count
          const float2 f0 = __ldg(affine + g * rows_pad + t16 * 16 + g8);
          const float2 f1 = __ldg(affine + g * rows_pad + t16 * 16 + g8 + 8);
          float cx0[kPass], cx1[kPass], xs[kPass];
#pragma unroll
          for (int r = 0; r < kPass; ++r) cx0[r] = cx1[r] = xs[r] = 0.0f;
#pragma unroll
          for (int s = 0; s < 8; ++s) {
#pragma unroll
            for (int hi = 0; hi < 2; ++hi) {
              const int64_t kk = g * quant::kGroup + 16 * s + 2 * q4 + 8 * hi;
              const float2 c0 = __half22float2(CodePairAt<F>(words, (gs * 8 + s) * 4 + 2 * hi));
              const float2 c1 =
                  __half22float2(CodePairAt<F>(words, (gs * 8 + s) * 4 + 2 * hi + 1));
#pragma unroll
              for (int r = 0; r < kPass; ++r) {
                if (r < rows) {
                  const float2 xv = __ldg(reinterpret_cast<const float2*>(x[r] + kk));
                  xs[r] += xv.x + xv.y;
                  cx0[r] += c0.x * xv.x + c0.y * xv.y;
                  cx1[r] += c1.x * xv.x + c1.y * xv.y;
                }
              }
            }
          }
#pragma unroll
          for (int r = 0; r < kPass; ++r) {
            acc[r][0] += f0.x * cx0[r] + f0.y * xs[r];
            acc[r][1] += f1.x * cx1[r] + f1.y * xs[r];
          }
        }
      }
#pragma unroll
      for (int r = 0; r < kPass; ++r) StoreTileRows(acc[r], lane, parts[o][warp][r]);
    }
    __syncthreads();
    for (int t = threadIdx.x; t < 16 * kPass; t += kWarps * 32) {
      const int r = t / 16, i = t % 16;
      const int64_t j = t16 * 16 + i;
      if (r >= rows || j >= n) continue;
      float g = 0.0f, u = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        g += parts[0][w][r][i];
        if constexpr (kGateUp) u += parts[kOut - 1][w][r][i];
      }
      out[static_cast<int64_t>(start + first + r) * n + j] = kGateUp ? Silu(g) * u : g;
    }
    __syncthreads();  // the parts are written again by the next pass
  }
}

// out[r, c] (+)= sum over the row's picks j (expert order) of weight_j * y[slot_pos[r k + j], c].
__global__ void __launch_bounds__(256)
    MoeCombineKernel(const float* __restrict__ y, const int* __restrict__ slot_pos,
                     const float* __restrict__ weights, int k, int64_t dim, float* __restrict__ out,
                     bool accumulate) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x;
  const int64_t r = blockIdx.y;
  if (c >= dim) return;
  float acc = 0.0f;
  for (int j = 0; j < k; ++j)
    acc += weights[r * k + j] * y[static_cast<int64_t>(slot_pos[r * k + j]) * dim + c];
  float* o = out + r * dim + c;
  *o = accumulate ? *o + acc : acc;
}

unsigned Blocks(int64_t n, int64_t per) { return static_cast<unsigned>((n + per - 1) / per); }

template <typename T>
void GateUpDecode(const MoeFeedForwardParams& p, const MoeDevice& d, bool vec, bool bf16, float* h,
                  cudaStream_t stream) {
  dim3 grid(Blocks(p.ffn, kWarps), static_cast<unsigned>(p.rows * p.top_k));
  if (vec) {
    MoeGateUpDecodeKernel<T, true><<<grid, kWarps * 32, 0, stream>>>(
        p.x, d.ids, d.table, p.experts, p.top_k, p.dim, p.ffn, bf16, h);
  } else {
    MoeGateUpDecodeKernel<T, false><<<grid, kWarps * 32, 0, stream>>>(
        p.x, d.ids, d.table, p.experts, p.top_k, p.dim, p.ffn, bf16, h);
  }
  GZ_CUDA_LAUNCHED();
}

template <typename T>
void DownDecode(const MoeFeedForwardParams& p, const MoeDevice& d, bool vec, bool bf16,
                const float* h, cudaStream_t stream) {
  dim3 grid(Blocks(p.dim, kWarps), static_cast<unsigned>(p.rows));
  if (vec) {
    MoeDownDecodeKernel<T, true><<<grid, kWarps * 32, 0, stream>>>(
        h, d.ids, d.weights, d.table, p.experts, p.top_k, p.dim, p.ffn, bf16, p.out, p.accumulate);
  } else {
    MoeDownDecodeKernel<T, false><<<grid, kWarps * 32, 0, stream>>>(
        h, d.ids, d.weights, d.table, p.experts, p.top_k, p.dim, p.ffn, bf16, p.out, p.accumulate);
  }
  GZ_CUDA_LAUNCHED();
}

// Whether a grouped GEMM of this step takes the few-rows kernel (where the tensor-core one would
// run): inputs of whole 16-byte packs, and on average at most kMoeFewRows rows an expert.
bool FewRows(const MoeFeedForwardParams& p, int64_t cols) {
  return p.rows * p.top_k <= kMoeFewRows * p.experts && cols % 8 == 0;
}

template <bool kGateUp>
void LaunchFew(const MoeFeedForwardParams& p, const MoeDevice& d, const float* a, float* out,
               int64_t n, int64_t cols, unsigned max_tiles, cudaStream_t stream) {
  const int pass_rows =
      static_cast<int>(std::clamp<int64_t>(kFewSharedBytes / (cols * 4), 1, kFewPass));
  const size_t shared = static_cast<size_t>(pass_rows) * cols * sizeof(float);
  static const bool attribute = [] {
    return cudaFuncSetAttribute(MoeGroupedFewKernel<kGateUp>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(kFewSharedBytes)) == cudaSuccess;
  }();
  (void)attribute;
  MoeGroupedFewKernel<kGateUp>
      <<<dim3(Blocks(n, kFewOutputs), max_tiles), kFewThreads, shared, stream>>>(
          a, d.sorted, d.tiles, d.tile_count, d.table, p.experts, p.top_k, n, cols, pass_rows, out);
  GZ_CUDA_LAUNCHED();
}

template <bool kGateUp>
void LaunchQuantFew(const MoeFeedForwardParams& p, const MoeDevice& d, Format format,
                    const float* a, float* out, int64_t n, int64_t cols, unsigned max_tiles,
                    cudaStream_t stream) {
  auto kernel = MoeQuantGroupedFewKernel<Format::kQ1, kGateUp>;
  switch (format) {
    case Format::kQ8:
      kernel = MoeQuantGroupedFewKernel<Format::kQ8, kGateUp>;
      break;
    case Format::kQ4:
      kernel = MoeQuantGroupedFewKernel<Format::kQ4, kGateUp>;
      break;
    case Format::kQ2:
      kernel = MoeQuantGroupedFewKernel<Format::kQ2, kGateUp>;
      break;
    default:
      break;
  }
  kernel<<<dim3(static_cast<unsigned>(PaddedRows(n) / 16), max_tiles), kWarps * 32, 0, stream>>>(
      a, d.sorted, d.tiles, d.tile_count, d.table, p.experts, p.top_k, n, cols, out);
  GZ_CUDA_LAUNCHED();
}

template <bool kGateUp>
void Grouped(const MoeFeedForwardParams& p, const MoeDevice& d, Format format, bool bf16,
             const float* a, float* out, unsigned max_tiles, cudaStream_t stream) {
  const int64_t n = kGateUp ? p.ffn : p.dim, cols = kGateUp ? p.dim : p.ffn;
  dim3 grid(Blocks(n, kMoeTile), max_tiles);
  if (bf16 && format == Format::kBf16 && d.aligned && FewRows(p, cols)) {
    LaunchFew<kGateUp>(p, d, a, out, n, cols, max_tiles, stream);
    return;
  }
  if (quant::IsQuantized(format) && FewRows(p, cols)) {
    LaunchQuantFew<kGateUp>(p, d, format, a, out, n, cols, max_tiles, stream);
    return;
  }
  if (bf16 && format == Format::kBf16 && d.aligned) {
    MoeGroupedMmaKernel<kGateUp><<<grid, 128, 0, stream>>>(
        a, d.sorted, d.tiles, d.tile_count, d.table, p.experts, p.top_k, n, cols, out);
  } else {
    auto kernel = MoeGroupedF32Kernel<PlainExpert<float>, kGateUp>;
    switch (format) {
      case Format::kBf16:
        kernel = MoeGroupedF32Kernel<PlainExpert<__nv_bfloat16>, kGateUp>;
        break;
      case Format::kF16:
        kernel = MoeGroupedF32Kernel<PlainExpert<__half>, kGateUp>;
        break;
      case Format::kQ8:
        kernel = MoeGroupedF32Kernel<QuantExpert<Format::kQ8>, kGateUp>;
        break;
      case Format::kQ4:
        kernel = MoeGroupedF32Kernel<QuantExpert<Format::kQ4>, kGateUp>;
        break;
      case Format::kQ2:
        kernel = MoeGroupedF32Kernel<QuantExpert<Format::kQ2>, kGateUp>;
        break;
      case Format::kQ1:
        kernel = MoeGroupedF32Kernel<QuantExpert<Format::kQ1>, kGateUp>;
        break;
      default:
        break;
    }
    kernel<<<grid, 256, 0, stream>>>(a, d.sorted, d.tiles, d.tile_count, d.table, p.experts,
                                     p.top_k, n, cols, out);
  }
  GZ_CUDA_LAUNCHED();
}

// The quantized decode kernels of `format` (q8, q4, q2, q1): gate/up into h, or down from h.
template <Format F>
void QuantDecodeOf(const MoeFeedForwardParams& p, const MoeDevice& d, bool gate_up, const float* a,
                   float* h, cudaStream_t stream) {
  if (gate_up) {
    dim3 grid(static_cast<unsigned>(PaddedRows(p.ffn) / 16),
              static_cast<unsigned>(p.rows * p.top_k));
    MoeQuantGateUpDecodeKernel<F>
        <<<grid, kWarps * 32, 0, stream>>>(a, d.ids, d.table, p.experts, p.top_k, p.dim, p.ffn, h);
  } else {
    dim3 grid(static_cast<unsigned>(PaddedRows(p.dim) / 16), static_cast<unsigned>(p.rows));
    MoeQuantDownDecodeKernel<F><<<grid, kWarps * 32, 0, stream>>>(
        a, d.ids, d.weights, d.table, p.experts, p.top_k, p.dim, p.ffn, p.out, p.accumulate);
  }
  GZ_CUDA_LAUNCHED();
}
void QuantDecode(const MoeFeedForwardParams& p, const MoeDevice& d, Format format, bool gate_up,
                 const float* a, float* h, cudaStream_t stream) {
  switch (format) {
    case Format::kQ8:
      return QuantDecodeOf<Format::kQ8>(p, d, gate_up, a, h, stream);
    case Format::kQ4:
      return QuantDecodeOf<Format::kQ4>(p, d, gate_up, a, h, stream);
    case Format::kQ2:
      return QuantDecodeOf<Format::kQ2>(p, d, gate_up, a, h, stream);
    default:
      return QuantDecodeOf<Format::kQ1>(p, d, gate_up, a, h, stream);
  }
}

// The input of quantized experts: `a` [rows, cols] rotated into d.rotated where the weights
// were rotated (every expert with the same seed), else `a` itself.
const float* ExpertInput(const float* a, int64_t rows, int64_t cols, const Weight& w,
                         const MoeDevice& d, cudaStream_t stream) {
  if (!quant::IsQuantized(w.format) || !w.rotated) return a;
  LaunchRotateRows(a, rows, cols, w.rotation_seed, d.rotated, stream);
  return d.rotated;
}

}  // namespace

MoeSizes MoeScratchSizes(const MoeFeedForwardParams& p) {
  MoeSizes s;
  const int64_t slots = p.rows * p.top_k;
  s.logits = p.rows * p.experts;
  s.slots = slots;
  s.hidden = slots * p.ffn;
  if (p.rows > kMoeDecodeRows) {
    s.outputs = slots * p.dim;
    s.tiles = (slots + kMoeTile - 1) / kMoeTile + std::min<int64_t>(p.experts, slots);
  }
  const Weight &gate = p.gate[0], &down = p.down[0];
  if (quant::IsQuantized(gate.format) && gate.rotated) s.rotated = p.rows * p.dim;
  if (quant::IsQuantized(down.format) && down.rotated)
    s.rotated = std::max(s.rotated, slots * p.ffn);
  return s;
}

void LaunchMoeRoute(const MoeFeedForwardParams& p, const MoeDevice& d, int sm_count,
                    cudaStream_t stream) {
  if (p.rows == 0) return;
  // Router logits in float32 (every mode).
  MatmulParams router;
  router.x = p.x;
  router.rows = p.rows;
  router.w[0] = p.router;
  router.out[0] = d.logits;
  if (p.rows <= 8 && GemvCovers(router)) {
    LaunchGemv(router, sm_count, stream);
  } else {
    LaunchGemmF32(p.x, p.rows, *p.router, nullptr, d.logits, false, stream);
  }
  MoeRouteKernel<<<Blocks(p.rows, kRouteWarps), kRouteWarps * 32, 0, stream>>>(
      d.logits, p.rows, p.experts, p.top_k, p.norm_topk_prob, d.ids, d.weights);
  GZ_CUDA_LAUNCHED();
}

void LaunchMoeExperts(const MoeFeedForwardParams& p, const MoeDevice& d, bool bf16, bool decode,
                      cudaStream_t stream) {
  if (p.rows == 0) return;
  const Format gate_up = p.gate[0].format, down = p.down[0].format;
  // Quantized experts read rotated inputs (d.rotated holds x, then the hidden units).
  const float* x = ExpertInput(p.x, p.rows, p.dim, p.gate[0], d, stream);
  if (decode) {
    const bool vec_gu = d.aligned && p.dim % (gate_up == Format::kF32 ? 4 : 8) == 0;
    const bool vec_d = d.aligned && p.ffn % (down == Format::kF32 ? 4 : 8) == 0;
    // Activations rounded to bf16 only where the weights are bf16 (as the grouped path).
    switch (gate_up) {
      case Format::kBf16:
        GateUpDecode<__nv_bfloat16>(p, d, vec_gu, bf16, d.hidden, stream);
        break;
      case Format::kF16:
        GateUpDecode<__half>(p, d, vec_gu, false, d.hidden, stream);
        break;
      case Format::kF32:
        GateUpDecode<float>(p, d, vec_gu, false, d.hidden, stream);
        break;
      default:
        QuantDecode(p, d, gate_up, /*gate_up=*/true, x, d.hidden, stream);
        break;
    }
    switch (down) {
      case Format::kBf16:
        DownDecode<__nv_bfloat16>(p, d, vec_d, bf16, d.hidden, stream);
        break;
      case Format::kF16:
        DownDecode<__half>(p, d, vec_d, false, d.hidden, stream);
        break;
      case Format::kF32:
        DownDecode<float>(p, d, vec_d, false, d.hidden, stream);
        break;
      default:
        QuantDecode(p, d, down, /*gate_up=*/false,
                    ExpertInput(d.hidden, p.rows * p.top_k, p.ffn, p.down[0], d, stream), nullptr,
                    stream);
        break;
    }
    return;
  }
  const int64_t slots = p.rows * p.top_k;
  MoePlanKernel<<<1, kPlanThreads, 0, stream>>>(d.ids, static_cast<int>(slots), p.experts, d.sorted,
                                                d.slot_pos, d.tiles, d.tile_count);
  GZ_CUDA_LAUNCHED();
  const unsigned max_tiles = static_cast<unsigned>((slots + kMoeTile - 1) / kMoeTile +
                                                   std::min<int64_t>(p.experts, slots));
  if (bf16 && d.copies) {
    // Quantized experts' bf16 copies, as bf16 experts (rotated inputs where the weights were).
    MoeDevice c = d;
    c.table = d.copies;
    c.aligned = true;
    Grouped<true>(p, c, Format::kBf16, true, x, d.hidden, max_tiles, stream);
    const float* h = ExpertInput(d.hidden, slots, p.ffn, p.down[0], d, stream);
    Grouped<false>(p, c, Format::kBf16, true, h, d.outputs, max_tiles, stream);
  } else {
    Grouped<true>(p, d, gate_up, bf16, x, d.hidden, max_tiles, stream);
    const float* h = ExpertInput(d.hidden, slots, p.ffn, p.down[0], d, stream);
    Grouped<false>(p, d, down, bf16, h, d.outputs, max_tiles, stream);
  }
  MoeCombineKernel<<<dim3(Blocks(p.dim, 256), static_cast<unsigned>(p.rows)), 256, 0, stream>>>(
      d.outputs, d.slot_pos, d.weights, p.top_k, p.dim, p.out, p.accumulate);
  GZ_CUDA_LAUNCHED();
}

void LaunchMoe(const MoeFeedForwardParams& p, const MoeDevice& d, bool bf16, int sm_count,
               cudaStream_t stream) {
  LaunchMoeRoute(p, d, sm_count, stream);
  LaunchMoeExperts(p, d, bf16, /*decode=*/p.rows <= kMoeDecodeRows, stream);
}

}  // namespace gizllm::cuda
