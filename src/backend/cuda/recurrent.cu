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
//
// A long run (a prompt piece: at least min_chunked_rows rows of one slot) goes instead through
// the chunked form (flash-linear-attention's chunk_gated_delta_rule): chunks of 64 rows, within
// a chunk the deltas solve a unit lower-triangular system (the UT transform) and the state is
// read and written once a chunk. Why: the row walk above keeps a warp a (head, 32 columns) and
// its rows strictly in order, so one 2,048-row piece of a 32-head layer runs 128 warps through
// 2,048 dependent steps; a chunk does the same rows' work as small matrix products. Two chunked
// forms: the serial kernel (ChunkedDeltaRuleKernel, one block a run, head and 32 columns walking
// the chunks in order, each chunk's products and triangular solve on the way) and the
// chunk-parallel kernels the backend uses (DeltaRuleIndexKernel .. DeltaRuleOutputKernel below:
// everything that does not depend on the state for all chunks at once, then a short pass over
// the states, then the outputs for all chunks at once; the short runs of its steps walked from
// a list by DeltaRuleRowListKernel). A step's kernels are the same whatever its runs (the run
// layout lives only in device memory, so a recorded step replays whatever runs its rows hold);
// each leaves at once the runs another owns.
#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>

#include "backend/cuda/kernels.cuh"
#include "backend/cuda/mma.cuh"

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

// Whether the run starting at row r0 has at least min_rows rows (0: never): the rows of a slot
// are adjacent, so its row r0 + min_rows - 1 belongs to it exactly when the run is that long.
__device__ __forceinline__ bool LongRun(const int32_t* slots, int64_t rows, int64_t r0,
                                        int min_rows) {
  const int64_t last = r0 + min_rows - 1;
  return min_rows > 0 && last < rows && slots[last] == slots[r0];
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

// One warp's walk of a run from row r0: lane j owns column j0 + j of head h's state (sk and sq:
// the warp's kKd floats each of shared memory). Synchronizes by the warp only.
template <int kKd>
__device__ __forceinline__ void DeltaRuleRowWalk(const GatedDeltaRuleParams& p, int64_t r0, int h,
                                                 int64_t j0, int lane, float* sk, float* sq) {
  const int64_t j = j0 + lane;
  const bool active = j < p.v_dim;
  const int64_t vd = p.v_dim;
  const int64_t kh = h / (p.v_heads / p.k_heads);
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

// grid (rows, v_heads, column blocks of 32), one warp a block: the block of a run start walks
// the run (DeltaRuleRowWalk) for head blockIdx.y and columns 32 blockIdx.z ... Runs of
// min_chunked_rows rows or more are left to the chunked kernels (the serial form's steps; the
// chunk-parallel form's steps use DeltaRuleRowListKernel instead).
template <int kKd>
__global__ void __launch_bounds__(32)
    GatedDeltaRuleKernel(GatedDeltaRuleParams p, int min_chunked_rows) {
  Prologue();
  const int64_t r0 = blockIdx.x;
  if (!RunStart(p.slots, r0) || LongRun(p.slots, p.rows, r0, min_chunked_rows)) return;
  __shared__ float sk[kKd], sq[kKd];
  DeltaRuleRowWalk<kKd>(p, r0, blockIdx.y, static_cast<int64_t>(blockIdx.z) * 32, threadIdx.x, sk,
                        sq);
}

// The chunked form. With S0 the state before a chunk of c <= 64 rows, G_t the running sum of
// the rows' gates g within the chunk, beta_t the rows' betas and q already scaled:
//   A[t][s] = beta_t e^(G_t - G_s) k_t.k_s (s < t),  P[t][s] = e^(G_t - G_s) q_t.k_s (s <= t)
//   (I + A) delta = R,  R_t = beta_t (v_t - e^G_t S0^T k_t)
//   out_t = e^G_t S0^T q_t + sum_{s<=t} P[t][s] delta_s
//   S = e^G_last S0 + sum_t e^(G_last - G_t) k_t delta_t^T
// which is the recurrence unrolled over the chunk (the CPU backend's DeltaRuleRun writes the same
// sums). Every exponent is <= 0: no product grows past its inputs.
constexpr int kChunkRows = 64;
constexpr int kChunkColumns = 32;  // state columns (value dimensions) a block
constexpr int kChunkThreads = 256;

// The chunk kernel's shared memory, in floats. Rows of K and Q are padded to a multiple of 4
// floats (float4 loads) plus 4, and rows of 32 columns to 40, so that the lanes of a warp that
// read different rows hit different banks.
template <int kKd>
struct ChunkLayout {
  static constexpr int kKs = kKd + 4;               // K and Q row stride
  static constexpr int kAs = kChunkRows + 4;        // A and P row stride
  static constexpr int kCs = kChunkColumns + 8;     // S, D and O row stride
  static constexpr int kK = 0;                      // [64, kKs] keys (then e^(G_last - G_t) k_t)
  static constexpr int kQ = kK + kChunkRows * kKs;  // [64, kKs] scaled queries
  static constexpr int kA = kQ + kChunkRows * kKs;  // [64, kAs] A
  static constexpr int kP = kA + kChunkRows * kAs;  // [64, kAs] P
  static constexpr int kS = kP + kChunkRows * kAs;  // [kKd, kCs] the state's columns
  static constexpr int kD = kS + kKd * kCs;         // [64, kCs] v, then R, then delta
  static constexpr int kO = kD + kChunkRows * kCs;  // [64, kCs] e^G_t S0^T q_t
  static constexpr int kG = kO + kChunkRows * kCs;  // [64] G
  static constexpr int kBeta = kG + kChunkRows;     // [64] beta
  static constexpr int kLast = kBeta + kChunkRows;  // [64] e^(G_last - G_t)
  static constexpr size_t kBytes = (kLast + kChunkRows) * sizeof(float);
};

__device__ __forceinline__ float Dot4(float4 a, float4 b) {
  return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
}

// grid (ceil(rows / min_rows), v_heads, column blocks of 32), 256 threads. Block x owns the run
// of row x * min_rows where that row is the run's first multiple of min_rows and the run is
// long (LongRun): a long run holds exactly one such first multiple, so each long run has one
// owner a (head, column block), and the search for the run's start looks back fewer than
// min_rows (<= 256) rows, one thread each. The block walks the run's chunks in order with the
// state's 32 columns in shared memory; every chunk is padded to 64 rows of zero k, q and beta
// (G held at the last row's), which add nothing.
//
// kTf32: the three products over k_dim or 64 rows (A and P; S0^T k and S0^T q; the state's
// update) on the tensor cores in tf32, the triangular solve and P delta in float32 as in exact
// mode. Each warp holds m16 tiles: A and P 16 rows by 32 columns, S0^T k and S0^T q 16 rows by
// 16 columns, the state 16 key dimensions by 8 columns a tile.
template <int kKd, bool kTf32>
__global__ void __launch_bounds__(kChunkThreads)
    ChunkedDeltaRuleKernel(GatedDeltaRuleParams p, int min_rows) {
  Prologue();
  using L = ChunkLayout<kKd>;
  constexpr int kKs = L::kKs, kAs = L::kAs, kCs = L::kCs, kC = kChunkColumns;
  extern __shared__ float4 shared4[];
  float* const sk = reinterpret_cast<float*>(shared4) + L::kK;
  float* const sq = reinterpret_cast<float*>(shared4) + L::kQ;
  float* const sa = reinterpret_cast<float*>(shared4) + L::kA;
  float* const sp = reinterpret_cast<float*>(shared4) + L::kP;
  float* const ss = reinterpret_cast<float*>(shared4) + L::kS;
  float* const sd = reinterpret_cast<float*>(shared4) + L::kD;
  float* const so = reinterpret_cast<float*>(shared4) + L::kO;
  float* const sg = reinterpret_cast<float*>(shared4) + L::kG;
  float* const sbeta = reinterpret_cast<float*>(shared4) + L::kBeta;
  float* const slast = reinterpret_cast<float*>(shared4) + L::kLast;
  __shared__ int first;  // the distance back from row x * min_rows to its run's start
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  if (tid == 0) first = INT_MAX;
  __syncthreads();
  const int64_t r = static_cast<int64_t>(blockIdx.x) * min_rows;
  if (tid < min_rows && r - tid >= 0 && RunStart(p.slots, r - tid)) atomicMin(&first, tid);
  __syncthreads();
  if (first == INT_MAX) return;
  const int64_t r0 = r - first;
  if (!LongRun(p.slots, p.rows, r0, min_rows)) return;

  const int h = blockIdx.y;
  const int64_t vd = p.v_dim;
  const int64_t j0 = static_cast<int64_t>(blockIdx.z) * kC;
  const int64_t kh = h / (p.v_heads / p.k_heads);
  const int32_t slot = p.slots[r0];
  float* st = p.states + (static_cast<int64_t>(slot) * p.v_heads + h) * kKd * vd;
  const bool fresh = p.positions[r0] == 0;
  for (int idx = tid; idx < kKd * kC; idx += kChunkThreads) {
    const int i = idx / kC;
    const int64_t j = j0 + idx % kC;
    ss[i * kCs + idx % kC] = fresh || j >= vd ? 0.0f : st[i * vd + j];
  }
  const float a_scale = expf(p.a_log[h]);
  const float dt_bias = p.dt_bias[h];
  // Fragment coordinates of the tf32 tiles.
  const int g = lane / 4, t4 = lane % 4;

  for (int64_t base = r0;; base += kChunkRows) {
    // The chunk's rows: those of the slot from base on (adjacent, so a count).
    const bool in_run = tid < kChunkRows && base + tid < p.rows && p.slots[base + tid] == slot;
    const int c = __syncthreads_count(in_run);
    if (c == 0) break;
    for (int idx = tid; idx < kChunkRows * kKd; idx += kChunkThreads) {
      const int t = idx / kKd, i = idx % kKd;
      const int64_t at = (base + t) * p.qk_stride + kh * kKd + i;
      sk[t * kKs + i] = t < c ? p.k[at] : 0.0f;
      sq[t * kKs + i] = t < c ? p.q[at] * p.scale : 0.0f;
    }
    for (int idx = tid; idx < kChunkRows * kC; idx += kChunkThreads) {
      const int t = idx / kC;
      const int64_t j = j0 + idx % kC;
      sd[t * kCs + idx % kC] = t < c && j < vd ? p.v[(base + t) * p.v_stride + h * vd + j] : 0.0f;
    }
    if (tid < kChunkRows) {
      float gate = 0.0f, beta = 0.0f;
      if (tid < c) {
        const float x = p.a[(base + tid) * p.ab_stride + h] + dt_bias;
        gate = -a_scale * (x > 20.0f ? x : log1pf(expf(x)));
        beta = 1.0f / (1.0f + expf(-p.b[(base + tid) * p.ab_stride + h]));
      }
      sg[tid] = gate;
      sbeta[tid] = beta;
    }
    __syncthreads();
    if (tid == 0) {
      float total = 0.0f;
      for (int t = 0; t < kChunkRows; ++t) sg[t] = total += sg[t];
    }
    __syncthreads();
    if (tid < kChunkRows) slast[tid] = expf(sg[kChunkRows - 1] - sg[tid]);

    // A[t][s] and P[t][s] from k_t.k_s and q_t.k_s.
    auto put = [&](int t, int s, float kk, float qk) {
      const float decay = s <= t ? expf(sg[t] - sg[s]) : 0.0f;
      sa[t * kAs + s] = s < t ? sbeta[t] * decay * kk : 0.0f;
      sp[t * kAs + s] = decay * qk;
    };
    if constexpr (kTf32) {
      // Warp w: rows 16 (w / 2) .., columns 32 (w % 2) ..; the tiles past the rows are zero.
      const int t0 = 16 * (warp / 2), s0 = 32 * (warp % 2);
      float kk[4][4] = {}, qk[4][4] = {};
      if (s0 <= t0 + 15) {
        MmaTf32Rows<4, kKd>(kk, sk + t0 * kKs, kKs, 1, sk + s0 * kKs, 1, kKs, lane);
        MmaTf32Rows<4, kKd>(qk, sq + t0 * kKs, kKs, 1, sk + s0 * kKs, 1, kKs, lane);
      }
#pragma unroll
      for (int n = 0; n < 4; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          put(t0 + g + 8 * (e / 2), s0 + 8 * n + 2 * t4 + e % 2, kk[n][e], qk[n][e]);
        }
      }
    } else {
      // Thread (ty, tx): rows 4 ty .. 4 ty + 3, columns tx + 16 b. A warp's rows end at
      // 8 warp + 7, so the column groups past them (all zero) are skipped warp-wide.
      const int ty = tid / 16, tx = tid % 16;
      const int groups = (8 * warp + 7) / 16 + 1;
      float kk[4][4] = {}, qk[4][4] = {};
      for (int i = 0; i < kKd; i += 4) {
        float4 kt[4], qt[4];
#pragma unroll
        for (int a = 0; a < 4; ++a) {
          kt[a] = *reinterpret_cast<const float4*>(sk + (4 * ty + a) * kKs + i);
          qt[a] = *reinterpret_cast<const float4*>(sq + (4 * ty + a) * kKs + i);
        }
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          if (b >= groups) break;
          const float4 ks = *reinterpret_cast<const float4*>(sk + (tx + 16 * b) * kKs + i);
#pragma unroll
          for (int a = 0; a < 4; ++a) {
            kk[a][b] += Dot4(kt[a], ks);
            qk[a][b] += Dot4(qt[a], ks);
          }
        }
      }
#pragma unroll
      for (int a = 0; a < 4; ++a) {
#pragma unroll
        for (int b = 0; b < 4; ++b) put(4 * ty + a, tx + 16 * b, kk[a][b], qk[a][b]);
      }
    }
    // R_t = beta_t (v_t - e^G_t S0^T k_t) over v in sd, and e^G_t S0^T q_t into so.
    auto finish = [&](int t, int j, float ks, float qs) {
      const float e = expf(sg[t]);
      float* d = sd + t * kCs + j;
      *d = sbeta[t] * (*d - e * ks);
      so[t * kCs + j] = e * qs;
    };
    if constexpr (kTf32) {
      // Warp w: rows 16 (w / 2) .., columns 16 (w % 2) ...
      const int t0 = 16 * (warp / 2), j0w = 16 * (warp % 2);
      float ks[2][4] = {}, qs[2][4] = {};
      MmaTf32Rows<2, kKd>(ks, sk + t0 * kKs, kKs, 1, ss + j0w, kCs, 1, lane);
      MmaTf32Rows<2, kKd>(qs, sq + t0 * kKs, kKs, 1, ss + j0w, kCs, 1, lane);
#pragma unroll
      for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          finish(t0 + g + 8 * (e / 2), j0w + 8 * n + 2 * t4 + e % 2, ks[n][e], qs[n][e]);
        }
      }
    } else {
      // Thread (warp, lane): rows 8 warp .. 8 warp + 7 of column lane.
      float ks[8] = {}, qs[8] = {};
      for (int i = 0; i < kKd; i += 4) {
        const float s0 = ss[i * kCs + lane], s1 = ss[(i + 1) * kCs + lane],
                    s2 = ss[(i + 2) * kCs + lane], s3 = ss[(i + 3) * kCs + lane];
#pragma unroll
        for (int m = 0; m < 8; ++m) {
          const float4 k4 = *reinterpret_cast<const float4*>(sk + (8 * warp + m) * kKs + i);
          const float4 q4 = *reinterpret_cast<const float4*>(sq + (8 * warp + m) * kKs + i);
          ks[m] += k4.x * s0 + k4.y * s1 + k4.z * s2 + k4.w * s3;
          qs[m] += q4.x * s0 + q4.y * s1 + q4.z * s2 + q4.w * s3;
        }
      }
#pragma unroll
      for (int m = 0; m < 8; ++m) finish(8 * warp + m, lane, ks[m], qs[m]);
    }
    __syncthreads();
    // K is read once more, by the state's update, as e^(G_last - G_t) k_t.
    for (int idx = tid; idx < kChunkRows * kKd; idx += kChunkThreads) {
      const int t = idx / kKd;
      sk[t * kKs + idx % kKd] *= slast[t];
    }

    // (I + A) delta = R by blocks of 16 rows: a block's rows less A times the deltas solved
    // before it (all warps), then the block's own triangle by forward substitution (one warp,
    // lane = column).
#pragma unroll
    for (int blk = 0; blk < 4; ++blk) {
      const int b0 = 16 * blk;
      if (blk > 0) {
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const int t = b0 + 2 * warp + u;
          float acc = 0.0f;
          for (int s = 0; s < b0; s += 4) {
            const float4 a4 = *reinterpret_cast<const float4*>(sa + t * kAs + s);
            acc += a4.x * sd[s * kCs + lane] + a4.y * sd[(s + 1) * kCs + lane] +
                   a4.z * sd[(s + 2) * kCs + lane] + a4.w * sd[(s + 3) * kCs + lane];
          }
          sd[t * kCs + lane] -= acc;
        }
        __syncthreads();
      }
      if (warp == 0) {
        float d[16];
#pragma unroll
        for (int u = 0; u < 16; ++u) {
          const int t = b0 + u;
          // Four partial sums: a chain of u / 4 dependent steps rather than u.
          float part[4] = {sd[t * kCs + lane], 0.0f, 0.0f, 0.0f};
#pragma unroll
          for (int v = 0; v < u; ++v) part[v % 4] -= sa[t * kAs + b0 + v] * d[v];
          d[u] = (part[0] + part[1]) + (part[2] + part[3]);
          sd[t * kCs + lane] = d[u];
        }
      }
      __syncthreads();
    }

    // out_t = so_t + sum_s P[t][s] delta_s (P is zero past each row): thread (warp, lane)
    // holds rows 8 warp .. 8 warp + 7 of column lane.
    {
      float o[8];
#pragma unroll
      for (int m = 0; m < 8; ++m) o[m] = so[(8 * warp + m) * kCs + lane];
      for (int s = 0; s < 8 * warp + 8; s += 4) {
        const float d0 = sd[s * kCs + lane], d1 = sd[(s + 1) * kCs + lane],
                    d2 = sd[(s + 2) * kCs + lane], d3 = sd[(s + 3) * kCs + lane];
#pragma unroll
        for (int m = 0; m < 8; ++m) {
          const float4 p4 = *reinterpret_cast<const float4*>(sp + (8 * warp + m) * kAs + s);
          o[m] += p4.x * d0 + p4.y * d1 + p4.z * d2 + p4.w * d3;
        }
      }
      if (j0 + lane < vd) {
#pragma unroll
        for (int m = 0; m < 8; ++m) {
          const int t = 8 * warp + m;
          if (t < c) p.out[((base + t) * p.v_heads + h) * vd + j0 + lane] = o[m];
        }
      }
    }
    // S = e^G_last S0 + sum_t (e^(G_last - G_t) k_t) delta_t^T.
    const float e_last = expf(sg[kChunkRows - 1]);
    if constexpr (kTf32) {
      // Tiles of 16 key dimensions by 8 columns, warp w from tile w on by 8.
      for (int tile = warp; tile < kKd / 16 * 4; tile += 8) {
        const int i0 = 16 * (tile / 4), n0 = 8 * (tile % 4);
        float acc[1][4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          acc[0][e] = e_last * ss[(i0 + g + 8 * (e / 2)) * kCs + n0 + 2 * t4 + e % 2];
        }
        MmaTf32Rows<1, kChunkRows>(acc, sk + i0, 1, kKs, sd + n0, kCs, 1, lane);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          ss[(i0 + g + 8 * (e / 2)) * kCs + n0 + 2 * t4 + e % 2] = acc[0][e];
        }
      }
    } else {
      // Thread (warp, lane): key dimensions warp * kKd / 8 .. of column lane.
      constexpr int kRows = kKd / 8;
      float acc[kRows] = {};
      for (int t = 0; t < kChunkRows; ++t) {
        const float d = sd[t * kCs + lane];
#pragma unroll
        for (int m = 0; m < kRows; ++m) acc[m] += sk[t * kKs + warp * kRows + m] * d;
      }
#pragma unroll
      for (int m = 0; m < kRows; ++m) {
        float* s = ss + (warp * kRows + m) * kCs + lane;
        *s = e_last * *s + acc[m];
      }
    }
    __syncthreads();  // the next chunk overwrites what this one read
    if (c < kChunkRows) break;
  }
  for (int idx = tid; idx < kKd * kC; idx += kChunkThreads) {
    const int64_t j = j0 + idx % kC;
    if (j < vd) st[(idx / kC) * vd + j] = ss[(idx / kC) * kCs + idx % kC];
  }
}

// The chunk-parallel form (flash-linear-attention's split of chunk_gated_delta_rule into kernels
// over all chunks at once and one short pass over the states). With S0 the state before a chunk,
// G, beta and A as above (q scaled) and T = (I + A)^-1, the chunk's deltas are
//   delta = T R = u - w S0,  u = T (beta v),  w = T (beta e^G k)   (the WY form)
// where u and w do not depend on the state. So:
//   1. per chunk and value head, all chunks at once (DeltaRuleChunkKernel): G, the k.k and q.k
//      products, u and w by forward substitution through I + A (every column of k and v at once),
//      and P (the decayed causal q.k) kept for step 3;
//   2. per run, value head and 32 state columns, the run's chunks in order (DeltaRuleStateKernel):
//      delta = u - w S0 and e^G_t S0^T q_t (the output's part from the state, into out), then
//      S = e^G_last S0 + sum_t e^(G_last - G_t) k_t delta_t^T: three products over the chunk,
//      the only serial part;
//   3. per chunk and value head, all chunks at once (DeltaRuleOutputKernel): out += P delta.
// A first kernel of one block (DeltaRuleIndexKernel) lists the long runs and their chunks (chunks
// of 64 rows from each run's start) in device memory, so that the steps need no host-side run
// list, and the short runs, which DeltaRuleRowListKernel walks row by row; the kernels are
// launched over bounds of those counts and loop over the items the lists hold. All intermediates
// are per row ([rows, v_heads, ...]: w, u then delta, G, P), so the scratch is bounded by the
// step's rows.
constexpr int kParallelThreads = 256;
constexpr int kIndexThreads = 1024;
constexpr int kRowListWarps = 4;

// The chunk-parallel form's scratch (DeltaRuleScratchBytes lays it out).
struct DeltaRuleScratch {
  int* counts = nullptr;   // [3]: long runs, chunks, short runs
  int* runs = nullptr;     // [run_bound] the long runs' first rows
  int* chunks = nullptr;   // [chunk_bound] their chunks' first rows, run by run
  int* lengths = nullptr;  // [rows]: at a long run's first row, its rows
  int* shorts = nullptr;   // [rows] the other runs' first rows
  float* w = nullptr;      // [rows, v_heads, k_dim]
  float* u = nullptr;      // [rows, v_heads, v_dim]: u, then the deltas
  float* g = nullptr;      // [rows, v_heads]: G, the gates' running sum within the chunk
  float* pm = nullptr;     // [rows, v_heads, 64]: P[t][s] of row t's chunk, zero past s = t
  int run_bound = 0, chunk_bound = 0;
};

// One block of kIndexThreads: per tile of rows, each row's run start (a block-wide max-scan of
// the rows that start a run, carried across tiles), then the long runs' first rows and their
// chunks' first rows (rows whose distance from their long run's start is a multiple of 64) by
// block-wide counts, in row order; a long run's last row writes its length; and the other runs'
// first rows (decode rows, short runs) for DeltaRuleRowListKernel.
__global__ void __launch_bounds__(kIndexThreads)
    DeltaRuleIndexKernel(GatedDeltaRuleParams p, int min_rows, DeltaRuleScratch s) {
  Prologue();
  constexpr int kWarps = kIndexThreads / 32;
  __shared__ int warp_start[kWarps], warp_runs[kWarps], warp_chunks[kWarps], warp_shorts[kWarps];
  __shared__ int carry_start, carry_runs, carry_chunks, carry_shorts;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const unsigned below = (1u << lane) - 1u;
  if (tid == 0) carry_start = 0, carry_runs = 0, carry_chunks = 0, carry_shorts = 0;
  __syncthreads();
  for (int64_t tile = 0; tile < p.rows; tile += kIndexThreads) {
    const int64_t r = tile + tid;
    const bool valid = r < p.rows;
    int start = valid && RunStart(p.slots, r) ? static_cast<int>(r) : -1;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, start, o);
      if (lane >= o) start = max(start, y);
    }
    if (lane == 31) warp_start[warp] = start;
    __syncthreads();
    if (warp == 0) {
      int x = warp_start[lane];
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x = max(x, y);
      }
      warp_start[lane] = x;  // the max over warps 0 .. lane
    }
    __syncthreads();
    if (warp > 0) start = max(start, warp_start[warp - 1]);
    start = max(start, carry_start);
    const bool is_long = valid && LongRun(p.slots, p.rows, start, min_rows);
    const bool run = is_long && r == start;
    const bool chunk = is_long && (r - start) % kChunkRows == 0;
    const bool short_run = valid && !is_long && r == start;
    const unsigned run_mask = __ballot_sync(0xffffffffu, run);
    const unsigned chunk_mask = __ballot_sync(0xffffffffu, chunk);
    const unsigned short_mask = __ballot_sync(0xffffffffu, short_run);
    if (lane == 0) {
      warp_runs[warp] = __popc(run_mask);
      warp_chunks[warp] = __popc(chunk_mask);
      warp_shorts[warp] = __popc(short_mask);
    }
    __syncthreads();
    int run_at = carry_runs + __popc(run_mask & below);
    int chunk_at = carry_chunks + __popc(chunk_mask & below);
    int short_at = carry_shorts + __popc(short_mask & below);
    for (int w = 0; w < warp; ++w) {
      run_at += warp_runs[w], chunk_at += warp_chunks[w], short_at += warp_shorts[w];
    }
    if (run && run_at < s.run_bound) s.runs[run_at] = static_cast<int>(r);
    if (chunk && chunk_at < s.chunk_bound) s.chunks[chunk_at] = static_cast<int>(r);
    if (short_run) s.shorts[short_at] = static_cast<int>(r);
    if (is_long && (r + 1 == p.rows || RunStart(p.slots, r + 1)))
      s.lengths[start] = static_cast<int>(r - start + 1);
    __syncthreads();  // every thread has read the carries and the warp counts
    if (tid == 0) {
      carry_start = max(carry_start, warp_start[kWarps - 1]);
      for (int w = 0; w < kWarps; ++w) {
        carry_runs += warp_runs[w], carry_chunks += warp_chunks[w], carry_shorts += warp_shorts[w];
      }
    }
    __syncthreads();
  }
  if (tid == 0) {
    s.counts[0] = min(carry_runs, s.run_bound);
    s.counts[1] = min(carry_chunks, s.chunk_bound);
    s.counts[2] = carry_shorts;
  }
}

// The runs the chunked kernels leave (decode rows, short runs) in the chunk-parallel form's
// steps: grid-stride by warps over (listed run, value head, column block of 32), each warp
// walking its run as GatedDeltaRuleKernel's (a grid of the blocks that fit, not one a row: a
// prompt step's many rows then cost no blocks that only leave).
template <int kKd>
__global__ void __launch_bounds__(32 * kRowListWarps)
    DeltaRuleRowListKernel(GatedDeltaRuleParams p, DeltaRuleScratch s) {
  Prologue();
  __shared__ float sk[kRowListWarps][kKd], sq[kRowListWarps][kKd];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int blocks = (p.v_dim + 31) / 32;
  const int64_t per_run = static_cast<int64_t>(p.v_heads) * blocks;
  const int64_t items = s.counts[2] * per_run;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * kRowListWarps + warp; item < items;
       item += static_cast<int64_t>(gridDim.x) * kRowListWarps) {
    const int64_t r0 = s.shorts[item / per_run];
    const int h = static_cast<int>(item % per_run / blocks);
    const int64_t j0 = static_cast<int64_t>(item % blocks) * 32;
    DeltaRuleRowWalk<kKd>(p, r0, h, j0, lane, sk[warp], sq[warp]);
  }
}

// The rows of the chunk from row base on: those of its slot (adjacent, so a count, at most 64).
// Also a barrier: the block's threads are done with the item before.
__device__ __forceinline__ int ChunkRows(const GatedDeltaRuleParams& p, int64_t base, int tid) {
  const int32_t slot = p.slots[base];
  return __syncthreads_count(tid < kChunkRows && base + tid < p.rows &&
                             p.slots[base + tid] == slot);
}

// Step 1's shared memory, in floats (rows padded as ChunkLayout's).
template <int kKd>
struct PrepareLayout {
  static constexpr int kKs = kKd + 4, kAs = kChunkRows + 4;
  static constexpr int kK = 0;                       // [64, kKs] keys
  static constexpr int kQ = kK + kChunkRows * kKs;   // [64, kKs] scaled queries
  static constexpr int kA = kQ + kChunkRows * kKs;   // [64, kAs] A
  static constexpr int kG = kA + kChunkRows * kAs;   // [64] G
  static constexpr int kBeta = kG + kChunkRows;      // [64] beta
  static constexpr int kBetaE = kBeta + kChunkRows;  // [64] beta e^G
  static constexpr size_t kBytes = (kBetaE + kChunkRows) * sizeof(float);
};

// Step 1: grid-stride over (chunk, value head), 256 threads. Rows of the chunk past its c rows
// are zero k, q and beta (G held at the last row's), so their A and P rows are zero and their u
// and w rows zero; only the c rows are written.
template <int kKd>
__global__ void __launch_bounds__(kParallelThreads)
    DeltaRuleChunkKernel(GatedDeltaRuleParams p, DeltaRuleScratch s) {
  Prologue();
  using L = PrepareLayout<kKd>;
  constexpr int kKs = L::kKs, kAs = L::kAs;
  extern __shared__ float4 shared4[];
  float* const sk = reinterpret_cast<float*>(shared4) + L::kK;
  float* const sq = reinterpret_cast<float*>(shared4) + L::kQ;
  float* const sa = reinterpret_cast<float*>(shared4) + L::kA;
  float* const sg = reinterpret_cast<float*>(shared4) + L::kG;
  float* const sbeta = reinterpret_cast<float*>(shared4) + L::kBeta;
  float* const sbe = reinterpret_cast<float*>(shared4) + L::kBetaE;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int64_t vd = p.v_dim, vh = p.v_heads;
  const int64_t items = static_cast<int64_t>(s.counts[1]) * vh;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t base = s.chunks[item / vh];
    const int h = static_cast<int>(item % vh);
    const int64_t kh = h / (p.v_heads / p.k_heads);
    const int c = ChunkRows(p, base, tid);
    for (int idx = tid; idx < kChunkRows * kKd; idx += kParallelThreads) {
      const int t = idx / kKd, i = idx % kKd;
      const int64_t at = (base + t) * p.qk_stride + kh * kKd + i;
      sk[t * kKs + i] = t < c ? p.k[at] : 0.0f;
      sq[t * kKs + i] = t < c ? p.q[at] * p.scale : 0.0f;
    }
    if (tid < kChunkRows) {
      float gate = 0.0f, beta = 0.0f;
      if (tid < c) {
        const float x = p.a[(base + tid) * p.ab_stride + h] + p.dt_bias[h];
        gate = -expf(p.a_log[h]) * (x > 20.0f ? x : log1pf(expf(x)));
        beta = 1.0f / (1.0f + expf(-p.b[(base + tid) * p.ab_stride + h]));
      }
      sg[tid] = gate;
      sbeta[tid] = beta;
    }
    __syncthreads();
    if (warp == 0) {  // G: the running sums of rows 0 .. 31 and 32 .. 63, the second on the first's
      float lo = sg[lane], hi = sg[32 + lane];
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const float ylo = __shfl_up_sync(0xffffffffu, lo, o);
        const float yhi = __shfl_up_sync(0xffffffffu, hi, o);
        if (lane >= o) lo += ylo, hi += yhi;
      }
      hi += __shfl_sync(0xffffffffu, lo, 31);
      sg[lane] = lo;
      sg[32 + lane] = hi;
      sbe[lane] = sbeta[lane] * expf(lo);
      sbe[32 + lane] = sbeta[32 + lane] * expf(hi);
      if (lane < c) s.g[(base + lane) * vh + h] = lo;
      if (32 + lane < c) s.g[(base + 32 + lane) * vh + h] = hi;
    }
    __syncthreads();
    {
      // A and P from k.k and q.k as the serial kernel's float32 path: thread (ty, tx) rows
      // 4 ty .. 4 ty + 3, columns tx + 16 b; the column groups past a warp's rows are zero.
      const int ty = tid / 16, tx = tid % 16;
      const int groups = (8 * warp + 7) / 16 + 1;
      float kk[4][4] = {}, qk[4][4] = {};
      for (int i = 0; i < kKd; i += 4) {
        float4 kt[4], qt[4];
#pragma unroll
        for (int a = 0; a < 4; ++a) {
          kt[a] = *reinterpret_cast<const float4*>(sk + (4 * ty + a) * kKs + i);
          qt[a] = *reinterpret_cast<const float4*>(sq + (4 * ty + a) * kKs + i);
        }
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          if (b >= groups) break;
          const float4 ks = *reinterpret_cast<const float4*>(sk + (tx + 16 * b) * kKs + i);
#pragma unroll
          for (int a = 0; a < 4; ++a) {
            kk[a][b] += Dot4(kt[a], ks);
            qk[a][b] += Dot4(qt[a], ks);
          }
        }
      }
#pragma unroll
      for (int a = 0; a < 4; ++a) {
        const int t = 4 * ty + a;
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          const int u = tx + 16 * b;
          const float decay = u <= t ? expf(sg[t] - sg[u]) : 0.0f;
          sa[t * kAs + u] = u < t ? sbeta[t] * decay * kk[a][b] : 0.0f;
          if (t < c) s.pm[((base + t) * vh + h) * kChunkRows + u] = decay * qk[a][b];
        }
      }
    }
    __syncthreads();
    // [w | u] = (I + A)^-1 [beta e^G k | beta v] by forward substitution, a column a thread:
    // row t less A[t][s] times the rows s < t solved before it, in four partial sums.
    for (int col = tid; col < kKd + vd; col += kParallelThreads) {
      float x[kChunkRows];
      if (col < kKd) {
#pragma unroll
        for (int t = 0; t < kChunkRows; ++t) x[t] = sbe[t] * sk[t * kKs + col];
      } else {
        const float* v = p.v + base * p.v_stride + static_cast<int64_t>(h) * vd + (col - kKd);
#pragma unroll
        for (int t = 0; t < kChunkRows; ++t) x[t] = t < c ? sbeta[t] * v[t * p.v_stride] : 0.0f;
      }
#pragma unroll
      for (int t = 1; t < kChunkRows; ++t) {
        float part[4] = {x[t], 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int u = 0; u < t; u += 4) {
          const float4 a4 = *reinterpret_cast<const float4*>(sa + t * kAs + u);
          // (The entries of the float4 past the diagonal are skipped.)
          part[0] -= a4.x * x[u];
          if (u + 1 < t) part[1] -= a4.y * x[u + 1];
          if (u + 2 < t) part[2] -= a4.z * x[u + 2];
          if (u + 3 < t) part[3] -= a4.w * x[u + 3];
        }
        x[t] = (part[0] + part[1]) + (part[2] + part[3]);
      }
      float* dst =
          col < kKd ? s.w + (base * vh + h) * kKd + col : s.u + (base * vh + h) * vd + (col - kKd);
      const int64_t step = col < kKd ? vh * kKd : vh * vd;
#pragma unroll
      for (int t = 0; t < kChunkRows; ++t) {
        if (t < c) dst[t * step] = x[t];
      }
    }
  }
}

// Step 2's shared memory, in floats.
template <int kKd>
struct StateLayout {
  static constexpr int kKs = kKd + 4, kCs = kChunkColumns + 4;
  static constexpr int kWq = 0;                            // [128, kKs] w, then q
  static constexpr int kKd2 = kWq + 2 * kChunkRows * kKs;  // [64, kKs] k
  static constexpr int kS = kKd2 + kChunkRows * kKs;       // [kKd, kCs] the state's columns
  static constexpr int kD = kS + kKd * kCs;          // [64, kCs] u, then e^(G_last - G_t) delta
  static constexpr int kFq = kD + kChunkRows * kCs;  // [64] e^G_t (scale)
  static constexpr int kFk = kFq + kChunkRows;       // [64] e^(G_last - G_t)
  static constexpr size_t kBytes = (kFk + kChunkRows) * sizeof(float);
};

// Step 2: grid-stride over (long run, value head, column block of 32), 256 threads; the state's
// 32 columns in shared memory across the run's chunks (its length from the index kernel, so a
// chunk's rows need no look-up). Per chunk, thread (ry, cx) = (tid / 8, tid % 8) holds rows
// 4 ry .. 4 ry + 3 of [w; q] (128 rows) by columns 4 cx .. 4 cx + 3 of the product with S0 (the
// rows' factors e^G_t scale applied at its end), then key dimensions 4 ry .. of the state's
// update by the same columns.
template <int kKd>
__global__ void __launch_bounds__(kParallelThreads)
    DeltaRuleStateKernel(GatedDeltaRuleParams p, DeltaRuleScratch s) {
  Prologue();
  using L = StateLayout<kKd>;
  constexpr int kKs = L::kKs, kCs = L::kCs, kC = kChunkColumns;
  extern __shared__ float4 shared4[];
  float* const swq = reinterpret_cast<float*>(shared4) + L::kWq;
  float* const skd = reinterpret_cast<float*>(shared4) + L::kKd2;
  float* const ss = reinterpret_cast<float*>(shared4) + L::kS;
  float* const sd = reinterpret_cast<float*>(shared4) + L::kD;
  float* const sfq = reinterpret_cast<float*>(shared4) + L::kFq;
  float* const sfk = reinterpret_cast<float*>(shared4) + L::kFk;
  const int tid = threadIdx.x;
  const int ry = tid / 8, cx = tid % 8;
  const int64_t vd = p.v_dim, vh = p.v_heads;
  const int blocks = static_cast<int>((vd + kC - 1) / kC);
  const int64_t items = static_cast<int64_t>(s.counts[0]) * vh * blocks;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t r0 = s.runs[item / (vh * blocks)];
    const int h = static_cast<int>(item / blocks % vh);
    const int64_t j0 = static_cast<int64_t>(item % blocks) * kC;
    const int64_t kh = h / (p.v_heads / p.k_heads);
    const int32_t slot = p.slots[r0];
    float* st = p.states + (static_cast<int64_t>(slot) * p.v_heads + h) * kKd * vd;
    const bool fresh = p.positions[r0] == 0;
    __syncthreads();  // the item before is done with the state's columns
    for (int idx = tid; idx < kKd * kC; idx += kParallelThreads) {
      const int i = idx / kC;
      const int64_t j = j0 + idx % kC;
      ss[i * kCs + idx % kC] = fresh || j >= vd ? 0.0f : st[i * vd + j];
    }
    const int64_t end = r0 + s.lengths[r0];
    for (int64_t base = r0; base < end; base += kChunkRows) {
      const int c = static_cast<int>(std::min<int64_t>(kChunkRows, end - base));
      __syncthreads();  // the chunk before is done with sd, swq and skd
      // Every load of the chunk at once (one round trip): the factors of the rows (applied to
      // the products' rows in their ends), w, q, k and u.
      const float* g = s.g + base * vh + h;
      const float last = g[(c - 1) * vh];
      if (tid < kChunkRows) {
        const float gt = tid < c ? g[tid * vh] : last;
        sfq[tid] = tid < c ? expf(gt) * p.scale : 0.0f;
        sfk[tid] = tid < c ? expf(last - gt) : 0.0f;
      }
      for (int idx = tid; idx < kChunkRows * kKd; idx += kParallelThreads) {
        const int t = idx / kKd, i = idx % kKd;
        const int64_t at = (base + t) * p.qk_stride + kh * kKd + i;
        const bool in = t < c;
        swq[t * kKs + i] = in ? s.w[((base + t) * vh + h) * kKd + i] : 0.0f;
        swq[(kChunkRows + t) * kKs + i] = in ? p.q[at] : 0.0f;
        skd[t * kKs + i] = in ? p.k[at] : 0.0f;
      }
      for (int idx = tid; idx < kChunkRows * kC; idx += kParallelThreads) {
        const int t = idx / kC;
        const int64_t j = j0 + idx % kC;
        sd[t * kCs + idx % kC] = t < c && j < vd ? s.u[((base + t) * vh + h) * vd + j] : 0.0f;
      }
      __syncthreads();
      // [w; e^G q] S0.
      float acc[4][4] = {};
      for (int i = 0; i < kKd; i += 4) {
        float4 a4[4], s4[4];
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          a4[m] = *reinterpret_cast<const float4*>(swq + (4 * ry + m) * kKs + i);
          s4[m] = *reinterpret_cast<const float4*>(ss + (i + m) * kCs + 4 * cx);
        }
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          const float am[4] = {a4[m].x, a4[m].y, a4[m].z, a4[m].w};
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            acc[m][0] += am[e] * s4[e].x;
            acc[m][1] += am[e] * s4[e].y;
            acc[m][2] += am[e] * s4[e].z;
            acc[m][3] += am[e] * s4[e].w;
          }
        }
      }
      // Rows 0 .. 63: delta = u - w S0 (over u, and times e^(G_last - G_t) into sd for the
      // state's update); rows 64 ..: e^G_t S0^T (scale q_t), the output's part from the state
      // (into out; step 3 adds the chunk's own part).
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const int row = 4 * ry + m;
        const int t = row % kChunkRows;
#pragma unroll
        for (int n = 0; n < 4; ++n) {
          const int jj = 4 * cx + n;
          const int64_t j = j0 + jj;
          if (row < kChunkRows) {
            const float d = sd[t * kCs + jj] - acc[m][n];
            sd[t * kCs + jj] = sfk[t] * d;
            if (t < c && j < vd) s.u[((base + t) * vh + h) * vd + j] = d;
          } else if (t < c && j < vd) {
            p.out[((base + t) * vh + h) * vd + j] = sfq[t] * acc[m][n];
          }
        }
      }
      __syncthreads();
      // S = e^G_last S0 + sum_t k_t (e^(G_last - G_t) delta_t)^T: key dimensions 4 ry .. 4 ry + 3
      // (threads past kKd / 4 row groups idle).
      if (ry < kKd / 4) {
        float up[4][4] = {};
        for (int t = 0; t < kChunkRows; ++t) {
          const float4 k4 = *reinterpret_cast<const float4*>(skd + t * kKs + 4 * ry);
          const float4 d4 = *reinterpret_cast<const float4*>(sd + t * kCs + 4 * cx);
          const float km[4] = {k4.x, k4.y, k4.z, k4.w}, dn[4] = {d4.x, d4.y, d4.z, d4.w};
#pragma unroll
          for (int m = 0; m < 4; ++m) {
#pragma unroll
            for (int n = 0; n < 4; ++n) up[m][n] += km[m] * dn[n];
          }
        }
        const float e_last = expf(last);
#pragma unroll
        for (int m = 0; m < 4; ++m) {
#pragma unroll
          for (int n = 0; n < 4; ++n) {
            float* x = ss + (4 * ry + m) * kCs + 4 * cx + n;
            *x = e_last * *x + up[m][n];
          }
        }
      }
    }
    __syncthreads();  // the state's last update is complete
    for (int idx = tid; idx < kKd * kC; idx += kParallelThreads) {
      const int64_t j = j0 + idx % kC;
      if (j < vd) st[(idx / kC) * vd + j] = ss[(idx / kC) * kCs + idx % kC];
    }
  }
}

// Step 3's shared memory, in floats.
struct OutputLayout {
  static constexpr int kAs = kChunkRows + 4;
  static constexpr int kP = 0;                      // [64, kAs] P
  static constexpr int kD = kP + kChunkRows * kAs;  // [64, kAs] 64 columns of delta
  static constexpr size_t kBytes = (kD + kChunkRows * kAs) * sizeof(float);
};

// Step 3: grid-stride over (chunk, value head), 256 threads: out += P delta over column tiles of
// 64; thread (ty, tx) = (tid / 16, tid % 16) holds rows 4 ty .. 4 ty + 3 by columns
// 4 tx .. 4 tx + 3 and sums the rows s up to its warp's last (P is zero past the diagonal).
__global__ void __launch_bounds__(kParallelThreads)
    DeltaRuleOutputKernel(GatedDeltaRuleParams p, DeltaRuleScratch s) {
  Prologue();
  constexpr int kAs = OutputLayout::kAs, kT = kChunkRows;
  extern __shared__ float4 shared4[];
  float* const sp = reinterpret_cast<float*>(shared4) + OutputLayout::kP;
  float* const sd = reinterpret_cast<float*>(shared4) + OutputLayout::kD;
  const int tid = threadIdx.x, warp = tid / 32;
  const int ty = tid / 16, tx = tid % 16;
  const int64_t vd = p.v_dim, vh = p.v_heads;
  const int64_t items = static_cast<int64_t>(s.counts[1]) * vh;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t base = s.chunks[item / vh];
    const int h = static_cast<int>(item % vh);
    const int c = ChunkRows(p, base, tid);
    for (int idx = tid; idx < kChunkRows * kChunkRows; idx += kParallelThreads) {
      const int t = idx / kChunkRows, u = idx % kChunkRows;
      sp[t * kAs + u] = t < c ? s.pm[((base + t) * vh + h) * kChunkRows + u] : 0.0f;
    }
    for (int64_t j0 = 0; j0 < vd; j0 += kT) {
      __syncthreads();  // P is in; the tile before is done with sd
      for (int idx = tid; idx < kChunkRows * kT; idx += kParallelThreads) {
        const int t = idx / kT;
        const int64_t j = j0 + idx % kT;
        sd[t * kAs + idx % kT] = t < c && j < vd ? s.u[((base + t) * vh + h) * vd + j] : 0.0f;
      }
      __syncthreads();
      float acc[4][4] = {};
      for (int u = 0; u < 8 * warp + 8; u += 4) {
        float4 p4[4], d4[4];
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          p4[m] = *reinterpret_cast<const float4*>(sp + (4 * ty + m) * kAs + u);
          d4[m] = *reinterpret_cast<const float4*>(sd + (u + m) * kAs + 4 * tx);
        }
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          const float pm[4] = {p4[m].x, p4[m].y, p4[m].z, p4[m].w};
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            acc[m][0] += pm[e] * d4[e].x;
            acc[m][1] += pm[e] * d4[e].y;
            acc[m][2] += pm[e] * d4[e].z;
            acc[m][3] += pm[e] * d4[e].w;
          }
        }
      }
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const int t = 4 * ty + m;
        if (t >= c) continue;
#pragma unroll
        for (int n = 0; n < 4; ++n) {
          const int64_t j = j0 + 4 * tx + n;
          if (j < vd) p.out[((base + t) * vh + h) * vd + j] += acc[m][n];
        }
      }
    }
    __syncthreads();  // the next item overwrites P
  }
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

namespace {

template <int kKd, bool kTf32>
void LaunchChunkedDeltaRule(const GatedDeltaRuleParams& p, int min_rows, cudaStream_t stream) {
  constexpr size_t kShared = ChunkLayout<kKd>::kBytes;
  static const bool raised = cudaFuncSetAttribute(ChunkedDeltaRuleKernel<kKd, kTf32>,
                                                  cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                  static_cast<int>(kShared)) == cudaSuccess;
  if (!raised) Refuse("GatedDeltaRule: the chunked kernel's shared memory");
  const dim3 grid(CeilDiv(p.rows, min_rows), static_cast<unsigned>(p.v_heads),
                  CeilDiv(p.v_dim, kChunkColumns));
  LaunchDependent(ChunkedDeltaRuleKernel<kKd, kTf32>, grid, dim3(kChunkThreads), kShared, stream, p,
                  min_rows);
}

// The chunk-parallel form's scratch over base (null: the sizes only): its bytes. The bounds:
// a long run has at least min_rows rows, so there are at most rows / min_rows, and its
// ceil(n / 64) chunks are at most n / 64 + 1, so all of them at most ceil(rows / 64) + rows /
// min_rows.
size_t LayOutDeltaRuleScratch(const GatedDeltaRuleParams& p, int min_rows, void* base,
                              DeltaRuleScratch* s) {
  const int64_t run_bound = p.rows / min_rows;
  const int64_t chunk_bound = (p.rows + kChunkRows - 1) / kChunkRows + run_bound;
  const int64_t rh = p.rows * p.v_heads;
  size_t at = 0;
  auto take = [&](int64_t bytes) {
    const size_t here = at;
    at += (static_cast<size_t>(bytes) + 255) / 256 * 256;
    return here;
  };
  const size_t counts = take(3 * sizeof(int)), runs = take(run_bound * sizeof(int)),
               chunks = take(chunk_bound * sizeof(int)), lengths = take(p.rows * sizeof(int)),
               shorts = take(p.rows * sizeof(int)), w = take(rh * p.k_dim * sizeof(float)),
               u = take(rh * p.v_dim * sizeof(float)), g = take(rh * sizeof(float)),
               pm = take(rh * kChunkRows * sizeof(float));
  if (base && s) {
    char* b = static_cast<char*>(base);
    s->counts = reinterpret_cast<int*>(b + counts);
    s->runs = reinterpret_cast<int*>(b + runs);
    s->chunks = reinterpret_cast<int*>(b + chunks);
    s->lengths = reinterpret_cast<int*>(b + lengths);
    s->shorts = reinterpret_cast<int*>(b + shorts);
    s->w = reinterpret_cast<float*>(b + w);
    s->u = reinterpret_cast<float*>(b + u);
    s->g = reinterpret_cast<float*>(b + g);
    s->pm = reinterpret_cast<float*>(b + pm);
    s->run_bound = static_cast<int>(run_bound);
    s->chunk_bound = static_cast<int>(chunk_bound);
  }
  return at;
}

int SmCount() {
  static const int count = [] {
    int device = 0, n = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || n < 1)
      n = 132;
    return n;
  }();
  return count;
}

// Blocks of `threads` with `shared` bytes that fit the GPU at once (at least one an SM), after
// raising the kernel's shared memory limit.
template <typename... Params>
int64_t ResidentBlocks(void (*kernel)(Params...), int threads, size_t shared) {
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(shared)) != cudaSuccess)
    Refuse("GatedDeltaRule: the chunk-parallel kernels' shared memory");
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, shared) !=
          cudaSuccess ||
      per_sm < 1)
    per_sm = 1;
  return static_cast<int64_t>(per_sm) * SmCount();
}

unsigned GridOf(int64_t items, int64_t resident) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(items, resident)));
}

template <int kKd>
void LaunchParallelDeltaRule(const GatedDeltaRuleParams& p, int min_rows, Scratch* scratch,
                             cudaStream_t stream) {
  if (!scratch) Refuse("GatedDeltaRule: the chunk-parallel form without scratch");
  constexpr size_t kChunkShared = PrepareLayout<kKd>::kBytes;
  constexpr size_t kStateShared = StateLayout<kKd>::kBytes;
  constexpr size_t kOutputShared = OutputLayout::kBytes;
  static const int64_t row_blocks =
      ResidentBlocks(DeltaRuleRowListKernel<kKd>, 32 * kRowListWarps, 0);
  static const int64_t chunk_blocks =
      ResidentBlocks(DeltaRuleChunkKernel<kKd>, kParallelThreads, kChunkShared);
  static const int64_t state_blocks =
      ResidentBlocks(DeltaRuleStateKernel<kKd>, kParallelThreads, kStateShared);
  static const int64_t output_blocks =
      ResidentBlocks(DeltaRuleOutputKernel, kParallelThreads, kOutputShared);
  DeltaRuleScratch s;
  LayOutDeltaRuleScratch(p, min_rows,
                         scratch->Get(LayOutDeltaRuleScratch(p, min_rows, nullptr, nullptr)), &s);
  const int64_t chunk_items = static_cast<int64_t>(s.chunk_bound) * p.v_heads;
  const int64_t state_items =
      static_cast<int64_t>(s.run_bound) * p.v_heads * CeilDiv(p.v_dim, kChunkColumns);
  // Short runs: at most one a row.
  const int64_t row_items = p.rows * p.v_heads * CeilDiv(p.v_dim, 32);
  LaunchDependent(DeltaRuleIndexKernel, dim3(1), dim3(kIndexThreads), 0, stream, p, min_rows, s);
  GZ_CUDA_LAUNCHED();
  LaunchDependent(DeltaRuleRowListKernel<kKd>,
                  dim3(GridOf((row_items + kRowListWarps - 1) / kRowListWarps, row_blocks)),
                  dim3(32 * kRowListWarps), 0, stream, p, s);
  GZ_CUDA_LAUNCHED();
  LaunchDependent(DeltaRuleChunkKernel<kKd>, dim3(GridOf(chunk_items, chunk_blocks)),
                  dim3(kParallelThreads), kChunkShared, stream, p, s);
  GZ_CUDA_LAUNCHED();
  LaunchDependent(DeltaRuleStateKernel<kKd>, dim3(GridOf(state_items, state_blocks)),
                  dim3(kParallelThreads), kStateShared, stream, p, s);
  GZ_CUDA_LAUNCHED();
  LaunchDependent(DeltaRuleOutputKernel, dim3(GridOf(chunk_items, output_blocks)),
                  dim3(kParallelThreads), kOutputShared, stream, p, s);
  GZ_CUDA_LAUNCHED();
}

template <int kKd>
void LaunchDeltaRule(const GatedDeltaRuleParams& p, int min_chunked_rows, DeltaRuleForm form,
                     Scratch* scratch, cudaStream_t stream) {
  // A step of fewer rows than min_chunked_rows holds no long run.
  const bool chunked = min_chunked_rows > 0 && p.rows >= min_chunked_rows;
  const int min_rows = chunked ? min_chunked_rows : 0;
  if (chunked && form == DeltaRuleForm::kParallel) {
    return LaunchParallelDeltaRule<kKd>(p, min_rows, scratch, stream);
  }
  const dim3 grid(static_cast<unsigned>(p.rows), static_cast<unsigned>(p.v_heads),
                  CeilDiv(p.v_dim, 32));
  LaunchDependent(GatedDeltaRuleKernel<kKd>, grid, dim3(32), 0, stream, p, min_rows);
  GZ_CUDA_LAUNCHED();
  if (!chunked) return;
  if (form == DeltaRuleForm::kSerialTf32) {
    LaunchChunkedDeltaRule<kKd, true>(p, min_rows, stream);
  } else {
    LaunchChunkedDeltaRule<kKd, false>(p, min_rows, stream);
  }
  GZ_CUDA_LAUNCHED();
}

}  // namespace

size_t DeltaRuleScratchBytes(const GatedDeltaRuleParams& p, int min_chunked_rows) {
  if (min_chunked_rows <= 0 || p.rows < min_chunked_rows) return 0;
  return LayOutDeltaRuleScratch(p, min_chunked_rows, nullptr, nullptr);
}

void LaunchGatedDeltaRule(const GatedDeltaRuleParams& p, int min_chunked_rows, DeltaRuleForm form,
                          Scratch* scratch, cudaStream_t stream) {
  if (p.rows == 0) return;
  if (min_chunked_rows < 0 || min_chunked_rows > kChunkThreads)
    Refuse("GatedDeltaRule: min_chunked_rows of 0 to 256");
  switch (p.k_dim) {
    case 16:
      return LaunchDeltaRule<16>(p, min_chunked_rows, form, scratch, stream);
    case 32:
      return LaunchDeltaRule<32>(p, min_chunked_rows, form, scratch, stream);
    case 64:
      return LaunchDeltaRule<64>(p, min_chunked_rows, form, scratch, stream);
    case 128:
      return LaunchDeltaRule<128>(p, min_chunked_rows, form, scratch, stream);
    default: Refuse("GatedDeltaRule: a key head of 16, 32, 64 or 128");
  }
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
