// KV write and attention over rotated KV pages (ops/kv_codes.h) on CUDA.
//
// The write: each vector rotated in shared memory by kv::Rotate's butterflies, then each code
// group coded as kv::Quantize codes it, every per-element value computed as the CPU computes it
// and every sum over a group taken in the CPU's order (this file is compiled without fused
// multiply-adds), so the codes, steps and mins are the CPU's bit for bit
// (CudaKvCodesTest.WriteEqualsTheCodingFunctionsByteForByte). Two shapes of that arithmetic:
// - up to kWarpWriteVectors vectors (decode steps: a row over 8 kv heads is 16 vectors, 64
//   groups): RotatedKvWriteWarpKernel, a block per vector and a warp per group of 32, a lane
//   per element; the elementwise work (the 4-bit level search of both fit starts, the 8- and
//   2-bit codes of the 10 ranges) across the lanes, each ordered sum by a lane of its own;
// - more (prompts: 2,048 rows over 8 kv heads are 131,072 groups): RotatedKvWriteKernel, a
//   thread per group with its 32 elements in registers and every loop over them unrolled, the
//   fewest instructions per group (the first kernel, which ran kv::Quantize itself out of
//   shared memory, took 39-96 us for a decode step's write and 102-250 us for 2,048 rows on an
//   H200).
// Groups that are not 32 channels (head_dim not a multiple of 32) keep kv::Quantize, a thread
// each.
//
// The attention (LaunchRotatedAttention) works in the rotated space, q.k = (R q).(R k):
// 1. RotateKernel rotates every query vector once (a warp per (row, head)) into scratch memory.
// 2. Exact mode: every row through the split kernel (attention_codes_split.cu): flash-decoding
//    over the codes, a block per (row, kv head, split of its pages), codes and {step, min} pairs
//    streamed through shared memory by cp.async and read back in registers, float32
//    arithmetic; attention.cu's combine merges the splits.
// 3. Fast mode: decoding rows through the tensor-core decode kernel (attention_mma.cu, kCodes:
//    each warp's pages of codes read back to an fp16 page, then the fp16 pages' products; the
//    split kernel where it does not take the heads), and runs of rows of one sequence (prompt
//    pieces) through the tensor-core tile kernel (attention_mma.cu, kCodes): each key tile's
//    codes read back into its fp16 tiles once per block of 64 or 128 query vectors, so a prompt
//    is tile work, not a pass over the keys per row.
// 4. RotateKernel rotates each output vector back, in place (sum_t w_t v_t = R^T sum_t w_t R v_t).
// Head dims other than 64, 128 and 256 (or pages not 16-byte aligned) keep the first, per-row
// kernel (RotatedAttentionKernel): a block per (row, kv head), every key read once per row, no
// split; correct, not fast.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "backend/cuda/kernels.cuh"
#include "ops/kv_codes.h"

namespace gizllm::cuda {
namespace {

constexpr int kMaxHeadDim = 256;
constexpr int kWarps = 4;

__device__ __forceinline__ void Prologue() {
  AllowDependentLaunch();
  WaitForPriorGrid();
}

// The write (the head of this file says how its two kernels code as the CPU does).

// The 4-bit level nearest t: kv::Level4(kv::Nearest4(t)) without the code in between (the same
// comparisons, as selects).
__device__ __forceinline__ float NearestLevel4(float t) {
  const float a = t < 0.0f ? -t : t;
  const float l = a > 2.4008f    ? 2.7326f
                  : a > 1.84355f ? 2.0690f
                  : a > 1.43715f ? 1.6181f
                  : a > 1.0993f  ? 1.2562f
                  : a > 0.7996f  ? 0.9424f
                  : a > 0.52245f ? 0.6568f
                  : a > 0.25825f ? 0.3881f
                                 : 0.1284f;
  return t < 0.0f ? -l : l;
}

// The codes of a group of 32 (one c_i per lane of a warp) packed little-endian as ops/kv_codes.h
// says, stored as 32-bit words (codes aligned to 4 bytes).
__device__ __forceinline__ void StoreCodesWarp(int c, int bits, int lane, uint8_t* codes) {
  uint32_t word = static_cast<uint32_t>(c) << ((lane * bits) % 32);
  const int per_word = 32 / bits;
  for (int o = 1; o < per_word; o *= 2) word |= __shfl_xor_sync(0xffffffffu, word, o);
  if (lane % per_word == 0) reinterpret_cast<uint32_t*>(codes)[lane / per_word] = word;
}

// Rows of kWarpSums (a 33rd float against bank conflicts): the values a warp's lanes hand to the
// lanes that sum them in order (4 bits: l, l * l and y * l of each fit start, and y).
constexpr int kWarpSums = 3 * kv::kStarts4 + 1;
using WarpSums = float[kWarpSums][33];

// The sum in order (j = 0, 1, ..., 31) of row `lane` of sums, for lanes < rows (others 0).
__device__ __forceinline__ float SumRowInOrder(const WarpSums& sums, int lane, int rows) {
  float total = 0.0f;
  if (lane < rows) {
#pragma unroll
    for (int j = 0; j < 32; ++j) total += sums[lane][j];
  }
  return total;
}

// kv::Quantize of a group y [32] (shared memory) by a warp: lane i holds y_i. sums: the warp's
// own scratch.
__device__ void QuantizeGroupWarp(const float* y, int bits, WarpSums& sums, uint8_t* codes,
                                  float* step_min) {
  constexpr unsigned kAll = 0xffffffffu;
  constexpr int n = 32;
  const int lane = threadIdx.x % 32;
  const float yi = y[lane];
  const bool finite = __all_sync(kAll, kv::Finite(yi));
  // The extremes as the CPU's scan finds them: the first element of the least (largest) value.
  float lo = yi, hi = yi;
  int lo_at = lane, hi_at = lane;
  for (int o = 16; o > 0; o /= 2) {
    const float l2 = __shfl_xor_sync(kAll, lo, o), h2 = __shfl_xor_sync(kAll, hi, o);
    const int l2_at = __shfl_xor_sync(kAll, lo_at, o), h2_at = __shfl_xor_sync(kAll, hi_at, o);
    if (l2 < lo || (l2 == lo && l2_at < lo_at)) lo = l2, lo_at = l2_at;
    if (h2 > hi || (h2 == hi && h2_at < hi_at)) hi = h2, hi_at = h2_at;
  }
  if (bits == 4 && finite && hi > lo) {
    // kv::Quantize4 with both starts in step: sums rows 3k, 3k + 1, 3k + 2 hold start k's l,
    // l * l and y * l; row 3 * kStarts4 y.
    const float middle = 0.5f * (lo + hi), half = 0.5f * (hi - lo) / 2.7326f;
    float step[kv::kStarts4], min[kv::kStarts4];
    bool fitting[kv::kStarts4];
#pragma unroll
    for (int k = 0; k < kv::kStarts4; ++k) {
      step[k] = half * (1.0f - kv::kStartStep4 * k);
      min[k] = middle;
      fitting[k] = true;
    }
    sums[3 * kv::kStarts4][lane] = yi;
    for (int round = 0; round < kv::kFitRounds; ++round) {
#pragma unroll
      for (int k = 0; k < kv::kStarts4; ++k) {
        const float inv = 1.0f / step[k];
        const float l = NearestLevel4((yi - min[k]) * inv);
        sums[3 * k][lane] = l;
        sums[3 * k + 1][lane] = l * l;
        sums[3 * k + 2][lane] = yi * l;
      }
      __syncwarp();
      const float total = SumRowInOrder(sums, lane, kWarpSums);
      __syncwarp();
      const float sy = __shfl_sync(kAll, total, 3 * kv::kStarts4);
#pragma unroll
      for (int k = 0; k < kv::kStarts4; ++k) {
        const float sl = __shfl_sync(kAll, total, 3 * k);
        const float sll = __shfl_sync(kAll, total, 3 * k + 1);
        const float syl = __shfl_sync(kAll, total, 3 * k + 2);
        const float det = static_cast<float>(n) * sll - sl * sl;
        const float s = (static_cast<float>(n) * syl - sl * sy) / det;
        if (!fitting[k]) continue;
        if (!(det > 0.0f) || !(s > 0.0f)) {
          fitting[k] = false;  // (the CPU's break: the start keeps its step and min)
          continue;
        }
        step[k] = s;
        min[k] = (sy - s * sl) / static_cast<float>(n);
      }
    }
#pragma unroll
    for (int k = 0; k < kv::kStarts4; ++k) {
      const float inv = 1.0f / step[k];
      const float e = min[k] + step[k] * NearestLevel4((yi - min[k]) * inv) - yi;
      sums[k][lane] = e * e;
    }
    __syncwarp();
    const float error = SumRowInOrder(sums, lane, kv::kStarts4);
    __syncwarp();
    // The first start of the least error, as the CPU's loop keeps it.
    float best_error = __shfl_sync(kAll, error, 0), s = step[0], m = min[0];
#pragma unroll
    for (int k = 1; k < kv::kStarts4; ++k) {
      const float e = __shfl_sync(kAll, error, k);
      if (e < best_error) best_error = e, s = step[k], m = min[k];
    }
    if (lane == 0) step_min[0] = s, step_min[1] = m;
    StoreCodesWarp(kv::Nearest4((yi - m) * (1.0f / s)), 4, lane, codes);
    return;
  }
  // Even steps: lane k < kShrinks sums the squared error of range k in order, y from shared.
  const int levels = (1 << bits) - 1;
  const float middle = 0.5f * (lo + hi), half = 0.5f * (hi - lo);
  float error = 0.0f;
  if (lane < kv::kShrinks) {
    const float shrink = 1.0f - kv::kShrinkStep * lane;
    const float a = middle - shrink * half;
    const float step = 2.0f * shrink * half / static_cast<float>(levels);
    const float inv = step > 0.0f ? 1.0f / step : 0.0f;
#pragma unroll 8
    for (int j = 0; j < n; ++j) {
      float c = nearbyintf((y[j] - a) * inv);
      c = c < 0.0f ? 0.0f : c > static_cast<float>(levels) ? static_cast<float>(levels) : c;
      const float e = a + step * c - y[j];
      error += e * e;
    }
  }
  float best_error = 0.0f, best_shrink = 1.0f;
  for (int k = 0; k < kv::kShrinks; ++k) {
    const float e = __shfl_sync(kAll, error, k);
    if (k == 0 || e < best_error) {
      best_error = e;
      best_shrink = 1.0f - kv::kShrinkStep * k;
    }
  }
  const float a = middle - best_shrink * half;
  const float step = finite ? 2.0f * best_shrink * half / static_cast<float>(levels) : nanf("");
  const float inv = finite && step > 0.0f ? 1.0f / step : 0.0f;
  int c = finite ? static_cast<int>(nearbyintf((yi - a) * inv)) : 0;
  c = c < 0 ? 0 : c > levels ? levels : c;
  if (lane == 0) step_min[0] = step, step_min[1] = finite ? a : nanf("");
  StoreCodesWarp(c, bits, lane, codes);
}

// kv::Quantize of a group [32] (shared memory) by one thread, the elements in registers.
template <int kBits>
__device__ __forceinline__ void QuantizeGroupThread(const float* group, uint8_t* codes,
                                                    float* step_min) {
  constexpr int n = 32;
  float y[n];
#pragma unroll
  for (int i = 0; i < n; ++i) y[i] = group[i];
  float lo = y[0], hi = y[0];
  bool finite = true;
#pragma unroll
  for (int i = 0; i < n; ++i) {
    finite = finite && kv::Finite(y[i]);
    lo = y[i] < lo ? y[i] : lo;
    hi = y[i] > hi ? y[i] : hi;
  }
  uint32_t words[kBits] = {};  // the 32 codes, packed
  float out_step, out_min;
  if (kBits == 4 && finite && hi > lo) {
    // kv::Quantize4.
    const float middle = 0.5f * (lo + hi), half = 0.5f * (hi - lo) / 2.7326f;
    float best_error = 0.0f, best_step = half, best_min = middle;
    float sy = 0.0f;  // (the CPU takes this sum in every round, the same each time)
#pragma unroll
    for (int i = 0; i < n; ++i) sy += y[i];
    for (int k = 0; k < kv::kStarts4; ++k) {
      float step = half * (1.0f - kv::kStartStep4 * k), min = middle;
      for (int round = 0; round < kv::kFitRounds; ++round) {
        float sl = 0.0f, sll = 0.0f, syl = 0.0f;
        const float inv = 1.0f / step;
#pragma unroll
        for (int i = 0; i < n; ++i) {
          const float l = NearestLevel4((y[i] - min) * inv);
          sl += l;
          sll += l * l;
          syl += y[i] * l;
        }
        const float det = static_cast<float>(n) * sll - sl * sl;
        const float s = (static_cast<float>(n) * syl - sl * sy) / det;
        if (!(det > 0.0f) || !(s > 0.0f)) break;
        step = s;
        min = (sy - s * sl) / static_cast<float>(n);
      }
      const float inv = 1.0f / step;
      float error = 0.0f;
#pragma unroll
      for (int i = 0; i < n; ++i) {
        const float e = min + step * NearestLevel4((y[i] - min) * inv) - y[i];
        error += e * e;
      }
      if (k == 0 || error < best_error) {
        best_error = error;
        best_step = step;
        best_min = min;
      }
    }
    const float inv = 1.0f / best_step;
#pragma unroll
    for (int i = 0; i < n; ++i) {
      words[i * kBits / 32] |= static_cast<uint32_t>(kv::Nearest4((y[i] - best_min) * inv))
                               << ((i * kBits) % 32);
    }
    out_step = best_step;
    out_min = best_min;
  } else {
    // kv::Quantize's even steps.
    constexpr int levels = (1 << kBits) - 1;
    const float middle = 0.5f * (lo + hi), half = 0.5f * (hi - lo);
    float best_error = 0.0f, best_shrink = 1.0f;
    for (int k = 0; k < kv::kShrinks; ++k) {
      const float shrink = 1.0f - kv::kShrinkStep * k;
      const float a = middle - shrink * half;
      const float step = 2.0f * shrink * half / static_cast<float>(levels);
      const float inv = step > 0.0f ? 1.0f / step : 0.0f;
      float error = 0.0f;
#pragma unroll
      for (int i = 0; i < n; ++i) {
        float c = nearbyintf((y[i] - a) * inv);
        c = c < 0.0f ? 0.0f : c > static_cast<float>(levels) ? static_cast<float>(levels) : c;
        const float e = a + step * c - y[i];
        error += e * e;
      }
      if (k == 0 || error < best_error) {
        best_error = error;
        best_shrink = shrink;
      }
    }
    const float a = middle - best_shrink * half;
    const float step = finite ? 2.0f * best_shrink * half / static_cast<float>(levels) : nanf("");
    const float inv = finite && step > 0.0f ? 1.0f / step : 0.0f;
#pragma unroll
    for (int i = 0; i < n; ++i) {
      int c = finite ? static_cast<int>(nearbyintf((y[i] - a) * inv)) : 0;
      c = c < 0 ? 0 : c > levels ? levels : c;
      words[i * kBits / 32] |= static_cast<uint32_t>(c) << ((i * kBits) % 32);
    }
    out_step = step;
    out_min = finite ? a : nanf("");
  }
#pragma unroll
  for (int j = 0; j < kBits; ++j) reinterpret_cast<uint32_t*>(codes)[j] = words[j];
  step_min[0] = out_step;
  step_min[1] = out_min;
}

// Where group g of vector i (i even: the key of (row, kv head) i / 2, odd: its value) goes: its
// codes, its {step, min} and its bits.
struct GroupOut {
  uint8_t* codes;
  float* step_min;
  int bits;
};

__device__ __forceinline__ GroupOut GroupAt(const KvWriteParams& p, int64_t i, int g) {
  const bool keys = i % 2 == 0;
  const int hd = p.head_dim, part = kv::GroupSize(hd), parts = kv::Groups(hd);
  const int64_t r = i / 2 / p.kv_heads;
  const int32_t pos = p.positions[r];
  const int64_t page =
      p.table.pages[static_cast<int64_t>(p.slots[r]) * p.table.max_pages + pos / kPage];
  const int64_t vector = (page * kPage + pos % kPage) * p.kv_heads + (i / 2) % p.kv_heads;
  GroupOut out;
  out.bits = keys ? KvKeyBits(p.cache.format) : KvValueBits(p.cache.format);
  out.codes = static_cast<uint8_t*>(keys ? p.cache.keys : p.cache.values) +
              vector * kv::CodeBytes(out.bits, hd) + g * part * out.bits / 8;
  out.step_min = (keys ? p.cache.key_scales : p.cache.value_scales) +
                 2 * (static_cast<int64_t>(parts) * vector + g);
  return out;
}

// The most vectors a write takes through the warp kernel (128 rows over 8 kv heads). Below it
// the thread kernel leaves the device mostly idle (a decode step's 16 vectors are 64 threads
// that each code a group alone); above it the warp kernel's ordered sums, a lane at a time, cost
// more than the device's idle time saves.
constexpr int64_t kWarpWriteVectors = 2048;

// Few vectors: a block per vector (head_dim threads, head_dim a multiple of 32), a warp per group.
__global__ void __launch_bounds__(kMaxHeadDim) RotatedKvWriteWarpKernel(KvWriteParams p) {
  Prologue();
  __shared__ float s_y[kMaxHeadDim];             // [head_dim] the vector, rotated
  __shared__ WarpSums s_sums[kMaxHeadDim / 32];  // a warp's scratch each
  const int hd = p.head_dim, d = threadIdx.x;
  const int64_t i = blockIdx.x;  // even: the key of (row, kv head) i / 2, odd: its value
  const float x = ((i % 2 == 0) ? p.k : p.v)[(i / 2) * hd + d];
  s_y[d] = kv::SignFlipped(d) ? -x : x;
  // kv::Hadamard: per stage h, pairs (lo, lo + h) of each block of `block` channels.
  const int block = kv::RotationBlock(hd);
  for (int h = 1; h < block; h *= 2) {
    __syncthreads();
    if (d < hd / 2) {
      float* y = s_y + (d / h) * 2 * h + d % h;
      const float a = y[0], c = y[h];
      y[0] = a + c;
      y[h] = a - c;
    }
  }
  __syncthreads();
  const float norm = 1.0f / sqrtf(static_cast<float>(block));
  s_y[d] *= norm;
  __syncthreads();
  const int g = d / 32;
  const GroupOut out = GroupAt(p, i, g);
  QuantizeGroupWarp(s_y + g * 32, out.bits, s_sums[g], out.codes, out.step_min);
}

// Many vectors: a block per kWriteVectors vectors (i even: the key of (row, kv head) i / 2, odd:
// its value), in shared memory with rows of head_dim + 1 floats: a warp rotates each vector
// (kv::Rotate's butterflies), then a thread codes each group.
constexpr int kWriteVectors = 32;
constexpr int kWriteThreads = 128;

__global__ void __launch_bounds__(kWriteThreads) RotatedKvWriteKernel(KvWriteParams p) {
  Prologue();
  extern __shared__ float shared[];  // [kWriteVectors, head_dim + 1] the rotated vectors
  const int hd = p.head_dim, row = hd + 1;
  const int64_t n = 2 * p.rows * p.kv_heads;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * kWriteVectors;
  // Each warp rotates its vectors in turn, a lane a few pairs of each butterfly stage (h a
  // power of two: shifts, not divisions).
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int block = kv::RotationBlock(hd);
  const float norm = 1.0f / sqrtf(static_cast<float>(block));
  for (int w = warp; w < kWriteVectors; w += kWriteThreads / 32) {
    const int64_t i = base + w;
    const float* x = i < n ? ((i % 2 == 0) ? p.k : p.v) + (i / 2) * hd : nullptr;
    float* y = shared + w * row;
    for (int d = lane; d < hd; d += 32) {
      const float xd = x ? x[d] : 0.0f;
      y[d] = kv::SignFlipped(d) ? -xd : xd;
    }
    // kv::Hadamard: per stage h, pairs (lo, lo + h) of each block of `block` channels.
    for (int h = 1, log_h = 0; h < block; h *= 2, ++log_h) {
      __syncwarp();
      for (int pair = lane; pair < hd / 2; pair += 32) {
        float* at = y + ((pair >> log_h) << (log_h + 1)) + (pair & (h - 1));
        const float a = at[0], c = at[h];
        at[0] = a + c;
        at[h] = a - c;
      }
    }
    __syncwarp();
    for (int d = lane; d < hd; d += 32) y[d] *= norm;
  }
  __syncthreads();
  const int part = kv::GroupSize(hd), parts = kv::Groups(hd);
  // Item -> (vector w, group g): the keys' groups first, then the values' (a warp codes keys or
  // values, not both: their bits may differ), the vectors of a warp's groups in turn.
  const int key_items = kWriteVectors / 2 * parts;
  for (int item = threadIdx.x; item < kWriteVectors * parts; item += kWriteThreads) {
    const int rest = item % key_items;
    const int w = 2 * (rest % (kWriteVectors / 2)) + item / key_items,
              g = rest / (kWriteVectors / 2);
    const int64_t i = base + w;
    if (i >= n) continue;
    const GroupOut out = GroupAt(p, i, g);
    const float* y = shared + w * row + g * part;
    if (part != 32) {
      kv::Quantize(y, part, out.bits, out.codes, out.step_min);
    } else if (out.bits == 8) {
      QuantizeGroupThread<8>(y, out.codes, out.step_min);
    } else if (out.bits == 4) {
      QuantizeGroupThread<4>(y, out.codes, out.step_min);
    } else {
      QuantizeGroupThread<2>(y, out.codes, out.step_min);
    }
  }
}

// Vectors [vectors, head_dim] rotated (inverse: rotated back), a warp per vector in shared
// memory: the butterflies of kv::Rotate / kv::Unrotate in the same order (the CPU's values).
constexpr int kRotateWarps = 4;

__global__ void __launch_bounds__(32 * kRotateWarps)
    RotateKernel(const float* in, float* out, int64_t vectors, int head_dim, bool inverse) {
  Prologue();
  __shared__ float s_vectors[kRotateWarps][kMaxHeadDim];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kRotateWarps + warp;
  if (i >= vectors) return;
  float* y = s_vectors[warp];
  for (int e = lane; e < head_dim; e += 32) {
    const float x = in[i * head_dim + e];
    y[e] = !inverse && kv::SignFlipped(e) ? -x : x;
  }
  const int block = kv::RotationBlock(head_dim);
  for (int h = 1; h < block; h *= 2) {
    __syncwarp();
    for (int pair = lane; pair < head_dim / 2; pair += 32) {
      float* at = y + (pair / h) * 2 * h + pair % h;
      const float a = at[0], c = at[h];
      at[0] = a + c;
      at[h] = a - c;
    }
  }
  __syncwarp();
  const float norm = 1.0f / sqrtf(static_cast<float>(block));
  for (int e = lane; e < head_dim; e += 32) {
    const float x = y[e] * norm;
    out[i * head_dim + e] = inverse && kv::SignFlipped(e) ? -x : x;
  }
}

// Element e of a rotated vector read back: its group's min + step * level of its code
// (kv::Level: the code, or at 4 bits kv::kLevels4's level).
__device__ __forceinline__ float Element(const uint8_t* codes, const float* step_mins, int e,
                                         int bits, int part) {
  const float* sm = step_mins + 2 * (e / part);
  return sm[1] + sm[0] * kv::Level(bits, kv::Code(codes, e, bits));
}

// The per-row kernel (head dims the split kernel does not take). The block's query heads are
// rotated once into shared memory; its warps take the positions in turn (warp w: first + w,
// first + w + kWarps, ...), a lane the elements lane, lane + 32, ... of each, with an online
// softmax per warp and query head; the warps' sums are combined at the end and rotated back.
// Shared memory (floats): q [group, hd] (rotated, scaled; at the end the output before its
// rotation back), acc [kWarps, group, hd], and per warp and head the running max and total
// [kWarps, group] each.
__global__ void RotatedAttentionKernel(AttentionParams p) {
  Prologue();
  extern __shared__ float shared[];
  const int group = p.heads / p.kv_heads;
  const int hd = p.head_dim;
  float* q = shared;
  float* acc = q + group * hd;
  float* max_score = acc + kWarps * group * hd;
  float* total = max_score + kWarps * group;
  const int64_t r = blockIdx.x;
  const int kvh = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int key_bits = KvKeyBits(p.cache.format), value_bits = KvValueBits(p.cache.format);
  const int64_t key_bytes = kv::CodeBytes(key_bits, hd);
  const int64_t value_bytes = kv::CodeBytes(value_bits, hd);
  const int part = kv::GroupSize(hd), parts = kv::Groups(hd);

  for (int e = threadIdx.x; e < group * hd; e += blockDim.x) {
    q[e] = p.q[(r * p.heads + kvh * group) * hd + e];
  }
  for (int e = threadIdx.x; e < kWarps * group * hd; e += blockDim.x) acc[e] = 0.0f;
  for (int e = threadIdx.x; e < kWarps * group; e += blockDim.x) {
    max_score[e] = -INFINITY;
    total[e] = 0.0f;
  }
  __syncthreads();
  for (int g = threadIdx.x; g < group; g += blockDim.x) {
    float* qg = q + g * hd;
    kv::Rotate(qg, hd);
    for (int e = 0; e < hd; ++e) qg[e] *= p.scale;
  }
  __syncthreads();

  const int32_t last = p.positions[r];
  const int32_t first = p.window > 0 ? max(0, last - p.window + 1) : 0;
  const int32_t* pages = p.table.pages + static_cast<int64_t>(p.slots[r]) * p.table.max_pages;
  const auto* keys = static_cast<const uint8_t*>(p.cache.keys);
  const auto* values = static_cast<const uint8_t*>(p.cache.values);
  float* my_acc = acc + warp * group * hd;
  for (int32_t pos = first + warp; pos <= last; pos += kWarps) {
    const int64_t v =
        (static_cast<int64_t>(pages[pos / kPage]) * kPage + pos % kPage) * p.kv_heads + kvh;
    const uint8_t* kc = keys + v * key_bytes;
    const float* ks = p.cache.key_scales + 2 * parts * v;
    const uint8_t* vc = values + v * value_bytes;
    const float* vs = p.cache.value_scales + 2 * parts * v;
    for (int g = 0; g < group; ++g) {
      const float* qg = q + g * hd;
      float score = 0.0f;
      for (int e = lane; e < hd; e += 32) score += qg[e] * Element(kc, ks, e, key_bits, part);
      for (int o = 16; o > 0; o /= 2) score += __shfl_xor_sync(0xffffffffu, score, o);
      score = __shfl_sync(0xffffffffu, score, 0);  // (lanes may differ in the last bit)
      if (p.softcap > 0.0f) score = p.softcap * tanhf(score / p.softcap);
      // Every lane holds the same score and state; lane 0 writes the state back.
      const int s = warp * group + g;
      const float old_max = max_score[s];
      const float new_max = fmaxf(old_max, score);
      const float correction = expf(old_max - new_max);  // 0 on the first position
      const float w = expf(score - new_max);
      float* a = my_acc + g * hd;
      for (int e = lane; e < hd; e += 32) {
        a[e] = a[e] * correction + w * Element(vc, vs, e, value_bits, part);
      }
      __syncwarp();
      if (lane == 0) {
        max_score[s] = new_max;
        total[s] = total[s] * correction + w;
      }
      __syncwarp();
    }
  }
  __syncthreads();
  // The warps' parts, over the same maximum; the output (rotated) into q.
  for (int e = threadIdx.x; e < group * hd; e += blockDim.x) {
    const int g = e / hd;
    float top = -INFINITY;
    for (int w = 0; w < kWarps; ++w) top = fmaxf(top, max_score[w * group + g]);
    float sum = 0.0f, out = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      const int s = w * group + g;
      if (total[s] == 0.0f) continue;  // a warp that saw no position
      const float c = expf(max_score[s] - top);
      sum += c * total[s];
      out += c * acc[w * group * hd + e];
    }
    q[e] = out / sum;
  }
  __syncthreads();
  for (int g = threadIdx.x; g < group; g += blockDim.x) kv::Unrotate(q + g * hd, hd);
  __syncthreads();
  for (int e = threadIdx.x; e < group * hd; e += blockDim.x) {
    p.out[(r * p.heads + kvh * group) * hd + e] = q[e];
  }
}

size_t SharedBytes(const AttentionParams& p) {
  const int group = p.heads / p.kv_heads;
  return sizeof(float) *
         (static_cast<size_t>(group) * p.head_dim * (1 + kWarps) + 2 * kWarps * group);
}

}  // namespace

bool RotatedAttentionSupported(int heads, int kv_heads, int head_dim) {
  if (kv_heads <= 0 || heads % kv_heads != 0 || head_dim % 8 != 0 || head_dim > kMaxHeadDim)
    return false;
  AttentionParams p;
  p.heads = heads;
  p.kv_heads = kv_heads;
  p.head_dim = head_dim;
  return SharedBytes(p) <= 200 * 1024;
}

void LaunchRotatedKvWrite(const KvWriteParams& p, cudaStream_t stream) {
  const int64_t n = 2 * p.rows * p.kv_heads;
  if (n == 0) return;
  if (p.head_dim > kMaxHeadDim) {
    std::fprintf(stderr, "cuda KvWrite: rotated pages of head_dim %d have no kernel\n", p.head_dim);
    std::abort();
  }
  if (p.head_dim % 32 == 0 && n <= kWarpWriteVectors) {
    LaunchDependent(RotatedKvWriteWarpKernel, dim3(static_cast<unsigned>(n)),
                    dim3(static_cast<unsigned>(p.head_dim)), 0, stream, p);
    GZ_CUDA_LAUNCHED();
    return;
  }
  const size_t shared = sizeof(float) * kWriteVectors * (p.head_dim + 1);  // 32 KB at most
  LaunchDependent(RotatedKvWriteKernel,
                  dim3(static_cast<unsigned>((n + kWriteVectors - 1) / kWriteVectors)),
                  dim3(kWriteThreads), shared, stream, p);
  GZ_CUDA_LAUNCHED();
}

void LaunchRotatedAttention(const AttentionParams& p, int sm_count, Scratch* scratch,
                            cudaStream_t stream, bool tensor_cores) {
  if (p.rows == 0) return;
  if (!RotatedAttentionSupported(p.heads, p.kv_heads, p.head_dim)) {
    std::fprintf(stderr,
                 "cuda Attention: rotated pages of head_dim %d with %d heads over %d kv heads "
                 "have no kernel\n",
                 p.head_dim, p.heads, p.kv_heads);
    std::abort();
  }
  if (CodesDecodeSupported(p)) {
    // Exact mode: every row through the float32 split kernel. Fast mode: the decoding rows
    // through the tensor-core decode kernel (or the split kernel where it does not take the
    // heads), the prompt pieces through the tensor-core tiles.
    const bool tiles =
        tensor_cores && p.rows > 1 && MmaTileSupported(p.heads, p.kv_heads, p.head_dim);
    const bool all_rows = !tiles;
    const bool mma_decode = tensor_cores && MmaDecodeCodesSupported(p);
    int splits = 0;
    if (mma_decode) {
      // As attention.cu's LaunchDecodeMma: about one wave of the resident blocks.
      const int64_t per_split = p.rows * p.kv_heads;
      const int64_t slots =
          static_cast<int64_t>(LaunchMmaDecodeCodes(p, 0, nullptr, nullptr, stream)) * sm_count;
      int64_t n = std::max<int64_t>(1, slots / per_split);
      if (per_split < slots && n * per_split < slots * 3 / 4) ++n;
      splits = static_cast<int>(
          std::max<int64_t>(1, std::min<int64_t>(std::min<int64_t>(n, 64), p.table.max_pages)));
    } else {
      splits = CodesDecodeSplits(p, sm_count);
    }
    const size_t vectors = static_cast<size_t>(p.rows) * p.heads;
    const size_t parts = splits > 1 ? vectors * splits : 0;
    float* q = static_cast<float*>(
        scratch->Get(sizeof(float) * (vectors * p.head_dim + parts * (p.head_dim + 2))));
    float* part_acc = splits > 1 ? q + vectors * p.head_dim : nullptr;
    float* part_ml = splits > 1 ? part_acc + parts * p.head_dim : nullptr;
    const unsigned rotate_blocks =
        static_cast<unsigned>((vectors + kRotateWarps - 1) / kRotateWarps);
    LaunchDependent(RotateKernel, dim3(rotate_blocks), dim3(32 * kRotateWarps), 0, stream, p.q, q,
                    static_cast<int64_t>(vectors), p.head_dim, false);
    GZ_CUDA_LAUNCHED();
    AttentionParams rotated = p;  // the rotated queries; the output rotated too, until the end
    rotated.q = q;
    if (mma_decode) {
      LaunchMmaDecodeCodes(rotated, splits, part_acc, part_ml, stream);
      GZ_CUDA_LAUNCHED();
      if (splits > 1) {
        LaunchAttentionCombine(rotated, /*all_rows=*/false, splits, part_acc, part_ml, stream);
      }
    } else {
      LaunchCodesDecode(rotated, all_rows, splits, part_acc, part_ml, stream);
    }
    if (tiles) LaunchMmaTileCodes(rotated, sm_count, stream);
    LaunchDependent(RotateKernel, dim3(rotate_blocks), dim3(32 * kRotateWarps), 0, stream,
                    static_cast<const float*>(p.out), p.out, static_cast<int64_t>(vectors),
                    p.head_dim, true);
    GZ_CUDA_LAUNCHED();
    return;
  }
  const size_t shared = SharedBytes(p);
  if (shared > 48 * 1024) {
    GZ_CUDA_CHECK(cudaFuncSetAttribute(RotatedAttentionKernel,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(shared)));
  }
  LaunchDependent(RotatedAttentionKernel,
                  dim3(static_cast<unsigned>(p.rows), static_cast<unsigned>(p.kv_heads)),
                  dim3(kWarps * 32), shared, stream, p);
  GZ_CUDA_LAUNCHED();
}

}  // namespace gizllm::cuda
