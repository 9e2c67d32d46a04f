// Paged grouped-query attention over KV pages of float32 or fp16 (KvFormat::kF16) elements.
//
// A row whose neighbours in the step belong to other sequences (a decoding row) goes to the
// decode kernel: one block per (row, kv head, split of its keys), so a long context is read by
// many blocks at once; a second kernel combines the splits. Runs of rows of one sequence (prompt
// pieces) go to the tile kernel: a block holds 64 query vectors (rows x the query heads of one
// kv head), walks the keys 64 at a time with an online softmax (flash-attention style), and so
// reads each key once per tile instead of once per row. Both kernels run on every step; each
// skips the rows that belong to the other, which lets one step mix decodes and prompt pieces.
// In the fast mode, prompt pieces go to the tensor-core tile kernel of attention_mma.cu instead
// (fp16 operands), which covers every shape these kernels take. With AttentionParams::softcap,
// every kernel caps the scores (SoftcapScore) before the mask and the softmax.
//
// Each kernel is a template over the pages' element type T (float or __half): fp16 pages are
// copied into shared memory as they are (half the bytes) and widened to float32 as a lane reads
// them, so the arithmetic is that of the float32 pages on the rounded keys and values.
#include <cuda_fp16.h>

#include <cmath>

#include "backend/cuda/kernels.cuh"

namespace gizllm::cuda {
namespace {

constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ bool Alone(const AttentionParams& p, int64_t r) {
  int32_t slot = p.slots[r];
  return !(r > 0 && p.slots[r - 1] == slot) && !(r + 1 < p.rows && p.slots[r + 1] == slot);
}

__device__ __forceinline__ int32_t FirstVisible(const AttentionParams& p, int32_t position) {
  return p.window > 0 ? max(0, position - p.window + 1) : 0;
}

constexpr int kDecodeThreads = 128;
constexpr int kLanesPerKey = 16;
constexpr int kKeysAtOnce = kDecodeThreads / kLanesPerKey;

// The width of a lane's loads of one head vector: 16 lanes (or the 16 x-threads of a tile) cover
// a head in pieces of 16 x kWidth floats, so a head_dim that is a multiple of 64 takes float4
// loads and any other multiple of 32 float2 loads.
template <int HD>
constexpr int Width() {
  static_assert(HD % 32 == 0 && HD >= 32 && HD <= 256, "head_dim: a multiple of 32 up to 256");
  return HD % 64 == 0 ? 4 : 2;
}

// kW floats from global (kGlobal: through the read-only cache) or shared memory.
template <int W, bool kGlobal = false>
__device__ __forceinline__ void LoadVec(const float* src, float* dst) {
  if constexpr (W == 4) {
    float4 t = kGlobal ? __ldg(reinterpret_cast<const float4*>(src))
                       : *reinterpret_cast<const float4*>(src);
    dst[0] = t.x, dst[1] = t.y, dst[2] = t.z, dst[3] = t.w;
  } else {
    float2 t = kGlobal ? __ldg(reinterpret_cast<const float2*>(src))
                       : *reinterpret_cast<const float2*>(src);
    dst[0] = t.x, dst[1] = t.y;
  }
}

// The same from fp16 elements (shared memory or, kGlobal, global), widened to float32.
template <int W, bool kGlobal = false>
__device__ __forceinline__ void LoadVec(const __half* src, float* dst) {
  if constexpr (W == 4) {
    uint2 t =
        kGlobal ? __ldg(reinterpret_cast<const uint2*>(src)) : *reinterpret_cast<const uint2*>(src);
    float2 a = __half22float2(*reinterpret_cast<const __half2*>(&t.x));
    float2 b = __half22float2(*reinterpret_cast<const __half2*>(&t.y));
    dst[0] = a.x, dst[1] = a.y, dst[2] = b.x, dst[3] = b.y;
  } else {
    uint32_t t = kGlobal ? __ldg(reinterpret_cast<const unsigned int*>(src))
                         : *reinterpret_cast<const uint32_t*>(src);
    float2 a = __half22float2(*reinterpret_cast<const __half2*>(&t));
    dst[0] = a.x, dst[1] = a.y;
  }
}

// Four consecutive page elements (16-byte aligned for float, 8 for fp16) as float32.
__device__ __forceinline__ float4 LoadKv4(const float* src) {
  return *reinterpret_cast<const float4*>(src);
}
__device__ __forceinline__ float4 LoadKv4(const __half* src) {
  uint2 t = *reinterpret_cast<const uint2*>(src);
  float2 a = __half22float2(*reinterpret_cast<const __half2*>(&t.x));
  float2 b = __half22float2(*reinterpret_cast<const __half2*>(&t.y));
  return make_float4(a.x, a.y, b.x, b.y);
}

template <int W>
__device__ __forceinline__ void StoreVec(float* dst, const float* src) {
  if constexpr (W == 4) {
    *reinterpret_cast<float4*>(dst) = make_float4(src[0], src[1], src[2], src[3]);
  } else {
    *reinterpret_cast<float2*>(dst) = make_float2(src[0], src[1]);
  }
}

// 16 bytes global -> shared without passing through registers (nor L1: the cache is streamed
// once); visible to the other threads after CpAsyncWait<0-or-more> and a __syncthreads.
__device__ __forceinline__ void CpAsync16(void* dst, const void* src) {
  uint32_t at = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(at), "l"(src) : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Stages of the decode kernel's ring: one stage is one page (kPage keys and their values,
// 32 x HD elements of T). The ring takes about 48 KB, so about four blocks share a
// multiprocessor's shared memory and each has all stages but the one being computed in flight:
// with HD = 128, 3 stages of 16 KB (float32; 6 of 8 KB in fp16), 4 blocks keep ~128 KB of loads
// in flight per multiprocessor, which is what HBM latency under load (~1.5-2 us at ~32 GB/s per
// multiprocessor) wants.
template <typename T, int HD>
constexpr int DecodeStages() {
  constexpr int stages = 48 * 1024 / (kPage * HD * 2 * static_cast<int>(sizeof(T)));
  return stages < 3 ? 3 : stages > 8 ? 8 : stages;
}

template <typename T, int HD, int GB>
constexpr size_t DecodeSharedBytes() {
  constexpr size_t ring = static_cast<size_t>(DecodeStages<T, HD>()) * 2 * kPage * HD * sizeof(T);
  constexpr size_t combine = static_cast<size_t>(kKeysAtOnce) * GB * (HD + 2) * sizeof(float);
  return ring > combine ? ring : combine;
}

// Blocks per multiprocessor the decode kernel is compiled for. Where the values a lane holds
// (GB query and GB output vectors, a key and two values, HD/16 each) leave room, registers are
// capped at 128 so that four blocks fit beside their four rings (as many as shared memory
// holds); otherwise the registers decide (fewer blocks, each still with its stages in flight).
// Up to 88 such values fit under the cap without spilling (ptxas: 88 at GB 4 over HD 128 fits,
// 98 at GB 2 over HD 224 spills, where fp16 stages leave shared memory for four blocks). GB = 8
// over HD = 64 would spill under the cap too (8 scores and their shuffles per key).
template <typename T, int HD, int GB>
constexpr int DecodeMinBlocks() {
  constexpr int by_shared = 227 * 1024 / static_cast<int>(DecodeSharedBytes<T, HD, GB>() + 1024);
  constexpr int by_registers = GB <= 4 && (2 * GB + 3) * (HD / 16) <= 88 ? 4 : 1;
  return by_shared < by_registers ? by_shared : by_registers;
}

// Block (row, kv head x head chunk, split). A split is a run of whole pages of the row's range.
// The pages stream through a ring of shared-memory stages filled with cp.async several pages
// ahead of the arithmetic, so a block keeps tens of KB of loads in flight with no registers
// held for them and no load in the dependent chain of the softmax. Groups of 16 lanes take keys
// group and group + 8 of each page; a lane holds HD/16 dimensions of the GB query heads, in
// pieces of kW floats 16 x kW floats apart (conflict-free reads of the stage: the 16 lanes of a
// group read one key's consecutive 16 x kW floats).
template <typename T, int HD, int GB>
__global__ void __launch_bounds__(kDecodeThreads, (DecodeMinBlocks<T, HD, GB>()))
    DecodeKernel(AttentionParams p, ScoreCap score_cap, int head_chunks, int splits,
                 float* part_acc,   // [rows, heads, splits, HD] when splits > 1
                 float* part_ml) {  // [rows, heads, splits, 2] (max, sum) when splits > 1
  constexpr int kW = Width<HD>();
  constexpr int kStride = kLanesPerKey * kW;
  constexpr int kDims = HD / kLanesPerKey;
  constexpr int kVecs = kDims / kW;
  constexpr int kStages = DecodeStages<T, HD>();
  constexpr int kStageElems = 2 * kPage * HD;  // keys [kPage, HD], values [kPage, HD]
  constexpr int kPerChunk = 16 / static_cast<int>(sizeof(T));  // elements of a 16-byte piece
  constexpr int kChunks = kPage * HD / kPerChunk;              // 16-byte pieces of a page's keys
  // Rounds of the block's copy of a page; the last one partial where the pieces do not divide
  // among the threads (fp16 at HD 32, 96, 160, 224).
  constexpr int kChunkRounds = (kChunks + kDecodeThreads - 1) / kDecodeThreads;
  constexpr int kKeysPerGroup = kPage / kKeysAtOnce;
  static_assert(kPage % kKeysAtOnce == 0 && HD % kPerChunk == 0);
  extern __shared__ __align__(16) float shared[];
  T* ring = reinterpret_cast<T*>(shared);        // [kStages, kStageElems] while streaming
  float* s_acc = shared;                         // [kKeysAtOnce, GB, HD] after it
  float* s_ml = shared + kKeysAtOnce * GB * HD;  // [kKeysAtOnce, GB, 2]

  AllowDependentLaunch();  // the GEMV after it may start loading its weights
  WaitForPriorGrid();
  int64_t r = blockIdx.x;
  if (!Alone(p, r)) return;
  int kv_head = blockIdx.y / head_chunks;
  int group_heads = p.heads / p.kv_heads;
  int head0 = kv_head * group_heads + (blockIdx.y % head_chunks) * GB;
  int split = blockIdx.z;
  int32_t slot = p.slots[r];
  int32_t position = p.positions[r];
  int32_t first = FirstVisible(p, position);
  // The row's pages are divided among the splits; a split past the last page has none (its
  // part is empty: max -inf, sum 0, which the combine skips).
  int32_t first_page = first / kPage;
  int32_t row_pages = position / kPage - first_page + 1;
  int32_t split_pages = (row_pages + splits - 1) / splits;
  int32_t page0 = first_page + split * split_pages;  // the split's first page (block of the slot)
  int32_t stages = max(0, min(split_pages, row_pages - split * split_pages));
  int32_t begin = max(first, page0 * kPage);
  int32_t end = min(position + 1, (page0 + stages) * kPage);
  int group = threadIdx.x / kLanesPerKey, sub = threadIdx.x % kLanesPerKey;
  const int32_t* pages = p.table.pages + static_cast<int64_t>(slot) * p.table.max_pages;

  // Stage u of the split (page page0 + u, cache page `page`) into ring slot u % kStages. Keys
  // outside [begin, end) are not copied (the window's start, the positions after the row's);
  // the arithmetic masks them without reading them.
  auto issue = [&](int32_t u, int64_t page) {
    T* dst = ring + (u % kStages) * kStageElems;
    int32_t pos0 = (page0 + u) * kPage;
#pragma unroll
    for (int i = 0; i < kChunkRounds; ++i) {
      int c = threadIdx.x + i * kDecodeThreads;
      if (kChunks % kDecodeThreads != 0 && c >= kChunks) break;
      int o = c / (HD / kPerChunk), piece = c % (HD / kPerChunk);
      if (pos0 + o >= begin && pos0 + o < end) {
        int64_t at = ((page * kPage + o) * p.kv_heads + kv_head) * HD + piece * kPerChunk;
        CpAsync16(dst + o * HD + piece * kPerChunk, static_cast<const T*>(p.cache.keys) + at);
        CpAsync16(dst + kPage * HD + o * HD + piece * kPerChunk,
                  static_cast<const T*>(p.cache.values) + at);
      }
    }
  };
  // Fill all stages but one; the page indices are read first, all at once, so the prologue
  // waits for one page-table read, not one per stage. Every stage commits a group, empty or not,
  // so that the group count (and CpAsyncWait's argument) does not depend on the range.
  {
    int32_t ahead[kStages - 1];
#pragma unroll
    for (int u = 0; u < kStages - 1; ++u) ahead[u] = u < stages ? __ldg(pages + page0 + u) : 0;
#pragma unroll
    for (int u = 0; u < kStages - 1; ++u) {
      if (u < stages) issue(u, ahead[u]);
      CpAsyncCommit();
    }
  }
  // The page index of the next stage to issue is read a stage early, off the critical path.
  int32_t next_page = kStages - 1 < stages ? __ldg(pages + page0 + kStages - 1) : 0;

  float q[GB][kDims];
  float qscale = p.scale * kLog2e;
#pragma unroll
  for (int g = 0; g < GB; ++g) {
    const float* qh = p.q + (r * p.heads + head0 + g) * HD;
#pragma unroll
    for (int i = 0; i < kVecs; ++i) LoadVec<kW>(qh + sub * kW + i * kStride, &q[g][kW * i]);
#pragma unroll
    for (int d = 0; d < kDims; ++d) q[g][d] *= qscale;
  }
  float m[GB], l[GB], acc[GB][kDims];
#pragma unroll
  for (int g = 0; g < GB; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int d = 0; d < kDims; ++d) acc[g][d] = 0.0f;
  }
  // Every lane runs the same iterations (the shuffles below need the whole warp and the
  // __syncthreads the whole block); a key outside the range only takes part in them.
  for (int32_t t = 0; t < stages; ++t) {
    // Groups committed so far: stages 0 .. t + kStages - 2; stage t is done when at most
    // kStages - 2 are pending. The barrier makes every thread's copies of stage t visible, and
    // says every thread is done with stage t - 1, whose slot the next issue overwrites.
    CpAsyncWait<kStages - 2>();
    __syncthreads();
    int32_t u = t + kStages - 1;
    if (u < stages) {
      issue(u, next_page);
      if (u + 1 < stages) next_page = __ldg(pages + page0 + u + 1);
    }
    CpAsyncCommit();

    const T* ks = ring + (t % kStages) * kStageElems;
    const T* vs = ks + kPage * HD;
    int32_t pos0 = (page0 + t) * kPage;
    // Scores of the group's keys of the page first (independent dot products and shuffles),
    // then one rescale of the state for them all.
    float s[kKeysPerGroup][GB];
    bool valid[kKeysPerGroup];
#pragma unroll
    for (int kk = 0; kk < kKeysPerGroup; ++kk) {
      int o = group + kk * kKeysAtOnce;
      valid[kk] = pos0 + o >= begin && pos0 + o < end;
      float k[kDims];
#pragma unroll
      for (int i = 0; i < kVecs; ++i) LoadVec<kW>(ks + o * HD + sub * kW + i * kStride, &k[kW * i]);
#pragma unroll
      for (int g = 0; g < GB; ++g) {
        float dot = 0.0f;
#pragma unroll
        for (int d = 0; d < kDims; ++d) dot += q[g][d] * k[d];
        s[kk][g] = dot;
      }
    }
#pragma unroll
    for (int kk = 0; kk < kKeysPerGroup; ++kk)
#pragma unroll
      for (int g = 0; g < GB; ++g) {
#pragma unroll
        for (int o = kLanesPerKey / 2; o > 0; o >>= 1)
          s[kk][g] += __shfl_xor_sync(0xffffffffu, s[kk][g], o);
        if (score_cap.cap > 0.0f) s[kk][g] = SoftcapScore(s[kk][g], score_cap);
        // Uncopied keys hold stale shared memory: select, never multiply, them away.
        if (!valid[kk]) s[kk][g] = -INFINITY;
      }
    float v[kKeysPerGroup][kDims];
#pragma unroll
    for (int kk = 0; kk < kKeysPerGroup; ++kk) {
      int o = group + kk * kKeysAtOnce;
      if (valid[kk]) {
#pragma unroll
        for (int i = 0; i < kVecs; ++i)
          LoadVec<kW>(vs + o * HD + sub * kW + i * kStride, &v[kk][kW * i]);
      } else {
#pragma unroll
        for (int d = 0; d < kDims; ++d) v[kk][d] = 0.0f;
      }
    }
#pragma unroll
    for (int g = 0; g < GB; ++g) {
      float m_new = m[g];
#pragma unroll
      for (int kk = 0; kk < kKeysPerGroup; ++kk) m_new = fmaxf(m_new, s[kk][g]);
      if (m_new == -INFINITY) continue;  // nothing visible yet (the same in all 16 lanes)
      float corr = exp2f(m[g] - m_new);
      float e[kKeysPerGroup];
      float sum = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kKeysPerGroup; ++kk) e[kk] = exp2f(s[kk][g] - m_new), sum += e[kk];
      l[g] = l[g] * corr + sum;
#pragma unroll
      for (int d = 0; d < kDims; ++d) {
        float a = acc[g][d] * corr;
#pragma unroll
        for (int kk = 0; kk < kKeysPerGroup; ++kk) a += e[kk] * v[kk][d];
        acc[g][d] = a;
      }
      m[g] = m_new;
    }
  }
  // The combine below reuses the ring: no copy may still be landing in it, nor a lane reading.
  CpAsyncWait<0>();
  __syncthreads();
  // Combine the groups of the block.
#pragma unroll
  for (int g = 0; g < GB; ++g) {
#pragma unroll
    for (int i = 0; i < kVecs; ++i)
#pragma unroll
      for (int c = 0; c < kW; ++c)
        s_acc[(group * GB + g) * HD + sub * kW + i * kStride + c] = acc[g][kW * i + c];
    if (sub == 0) {
      s_ml[(group * GB + g) * 2] = m[g];
      s_ml[(group * GB + g) * 2 + 1] = l[g];
    }
  }
  __syncthreads();
  for (int t = threadIdx.x; t < GB * HD; t += kDecodeThreads) {
    int g = t / HD, d = t % HD;
    float mm = -INFINITY;
    for (int x = 0; x < kKeysAtOnce; ++x) mm = fmaxf(mm, s_ml[(x * GB + g) * 2]);
    float ll = 0.0f, a = 0.0f;
    if (mm != -INFINITY) {
      for (int x = 0; x < kKeysAtOnce; ++x) {
        float w = exp2f(s_ml[(x * GB + g) * 2] - mm);
        ll += w * s_ml[(x * GB + g) * 2 + 1];
        a += w * s_acc[(x * GB + g) * HD + d];
      }
    }
    int64_t head = head0 + g;
    if (splits == 1) {
      p.out[(r * p.heads + head) * HD + d] = a / ll;
    } else {
      int64_t at = (r * p.heads + head) * splits + split;
      part_acc[at * HD + d] = a;
      if (d == 0) {
        part_ml[at * 2] = mm;
        part_ml[at * 2 + 1] = ll;
      }
    }
  }
}

constexpr int kMaxSplits = 64;

// One block of head_dim threads per (row, head): out = sum of the splits' parts, rescaled. The
// splits' weights are found once, in shared memory, by the first warp (the maxima and sums
// loaded together, not one dependent load after another); then every dimension adds its splits'
// accumulators with several loads in flight. all_rows: every row's parts (the split kernel over
// rotated codes in exact mode), not only the decoding rows'.
__global__ void CombineKernel(AttentionParams p, int splits, const float* part_acc,
                              const float* part_ml, bool all_rows) {
  __shared__ float s_w[kMaxSplits];
  __shared__ float s_sum;
  AllowDependentLaunch();  // the GEMV after it may start loading its weights
  WaitForPriorGrid();
  int64_t r = blockIdx.x / p.heads;
  if (!all_rows && !Alone(p, r)) return;
  int64_t rh = blockIdx.x;
  const float* ml = part_ml + rh * splits * 2;
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    float m_part[kMaxSplits / 32], l_part[kMaxSplits / 32];
    float mm = -INFINITY;
#pragma unroll
    for (int i = 0; i < kMaxSplits / 32; ++i) {
      int s = lane + 32 * i;
      m_part[i] = s < splits ? ml[s * 2] : -INFINITY;
      l_part[i] = s < splits ? ml[s * 2 + 1] : 0.0f;
      mm = fmaxf(mm, m_part[i]);
    }
    for (int o = 16; o > 0; o >>= 1) mm = fmaxf(mm, __shfl_xor_sync(0xffffffffu, mm, o));
    float ll = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxSplits / 32; ++i) {
      int s = lane + 32 * i;
      float w = m_part[i] == -INFINITY ? 0.0f : exp2f(m_part[i] - mm);
      ll += w * l_part[i];
      if (s < splits) s_w[s] = w;
    }
    for (int o = 16; o > 0; o >>= 1) ll += __shfl_xor_sync(0xffffffffu, ll, o);
    if (lane == 0) s_sum = ll;
  }
  __syncthreads();
  const float inv = 1.0f / s_sum;
  for (int d = threadIdx.x; d < p.head_dim; d += blockDim.x) {
    const float* acc = part_acc + rh * splits * p.head_dim + d;
    float a = 0.0f;
#pragma unroll 8
    for (int s = 0; s < splits; ++s) a += s_w[s] * acc[static_cast<int64_t>(s) * p.head_dim];
    p.out[rh * p.head_dim + d] = a * inv;
  }
}

constexpr int kTileQ = 64;  // query vectors per block
constexpr int kTileK = 64;  // keys per step
constexpr int kPad = 4;

// 256 threads as 16 x 16: thread (ty, tx) computes scores of query vectors ty*4.. and keys
// tx*4.., and the output of query vectors ty*4.. in dimensions tx*kW + 16*kW*u.
template <typename T, int HD>
__global__ void __launch_bounds__(256)
    TileKernel(AttentionParams p, ScoreCap score_cap, int tile_rows) {
  constexpr int kW = Width<HD>();
  constexpr int kOutVecs = HD / (16 * kW);
  extern __shared__ float shared[];
  float* qt = shared;                     // [HD, kTileQ + kPad]
  float* kt = qt + HD * (kTileQ + kPad);  // [HD, kTileK + kPad]
  float* vs = kt + HD * (kTileK + kPad);  // [kTileK, HD]
  float* ps = vs + kTileK * HD;           // [kTileQ, kTileK + kPad]
  __shared__ int32_t s_slot[kTileQ], s_pos[kTileQ], s_first[kTileQ];
  __shared__ bool s_mine[kTileQ];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int group_heads = p.heads / p.kv_heads;
  const int kv_head = blockIdx.y;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * tile_rows;
  const int rows_here = static_cast<int>(p.rows - r0 < tile_rows ? p.rows - r0 : tile_rows);
  const int vectors = rows_here * group_heads;
  for (int i = threadIdx.x; i < rows_here; i += blockDim.x) {
    s_slot[i] = p.slots[r0 + i];
    s_pos[i] = p.positions[r0 + i];
    s_first[i] = FirstVisible(p, s_pos[i]);
    s_mine[i] = !Alone(p, r0 + i);
  }
  // A tile of decoding rows only (a batch of decodes) has nothing to do here.
  if (!__syncthreads_or(threadIdx.x < rows_here && s_mine[threadIdx.x])) return;
  // Queries, scaled for exp2, transposed: qt[d][vector].
  float qscale = p.scale * kLog2e;
  for (int t = threadIdx.x; t < kTileQ * (HD / 4); t += blockDim.x) {
    int vec = t % kTileQ, d4 = t / kTileQ;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (vec < vectors) {
      int64_t row = r0 + vec / group_heads;
      int head = kv_head * group_heads + vec % group_heads;
      v = *reinterpret_cast<const float4*>(p.q + (row * p.heads + head) * HD + d4 * 4);
    }
    qt[(d4 * 4 + 0) * (kTileQ + kPad) + vec] = v.x * qscale;
    qt[(d4 * 4 + 1) * (kTileQ + kPad) + vec] = v.y * qscale;
    qt[(d4 * 4 + 2) * (kTileQ + kPad) + vec] = v.z * qscale;
    qt[(d4 * 4 + 3) * (kTileQ + kPad) + vec] = v.w * qscale;
  }
  __syncthreads();

  float o[4][kOutVecs * kW] = {};
  float m[4], l[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) m[i] = -INFINITY, l[i] = 0.0f;

  // Runs of rows of one sequence, one after the other.
  int next = 0;
  while (true) {
    int seg = next;
    while (seg < rows_here && !s_mine[seg]) ++seg;
    if (seg >= rows_here) break;
    int32_t slot = s_slot[seg];
    int seg_end = seg;
    int32_t kbegin = INT32_MAX, kend = 0;
    while (seg_end < rows_here && s_mine[seg_end] && s_slot[seg_end] == slot) {
      kbegin = min(kbegin, s_first[seg_end]);
      kend = max(kend, s_pos[seg_end] + 1);
      ++seg_end;
    }
    next = seg_end;
    const int32_t* pages = p.table.pages + static_cast<int64_t>(slot) * p.table.max_pages;
    for (int32_t k0 = kbegin; k0 < kend; k0 += kTileK) {
      for (int t = threadIdx.x; t < kTileK * (HD / 4); t += blockDim.x) {
        int key = t % kTileK, d4 = t / kTileK;
        int32_t j = k0 + key;
        float4 a = make_float4(0.f, 0.f, 0.f, 0.f), b = a;
        if (j < kend) {
          int64_t page = pages[j / kPage];
          int64_t at = ((page * kPage + j % kPage) * p.kv_heads + kv_head) * HD + d4 * 4;
          a = LoadKv4(static_cast<const T*>(p.cache.keys) + at);
          b = LoadKv4(static_cast<const T*>(p.cache.values) + at);
        }
        kt[(d4 * 4 + 0) * (kTileK + kPad) + key] = a.x;
        kt[(d4 * 4 + 1) * (kTileK + kPad) + key] = a.y;
        kt[(d4 * 4 + 2) * (kTileK + kPad) + key] = a.z;
        kt[(d4 * 4 + 3) * (kTileK + kPad) + key] = a.w;
        *reinterpret_cast<float4*>(vs + key * HD + d4 * 4) = b;
      }
      __syncthreads();
      float s[4][4] = {};
#pragma unroll 8
      for (int d = 0; d < HD; ++d) {
        float4 a = *reinterpret_cast<const float4*>(qt + d * (kTileQ + kPad) + ty * 4);
        float4 b = *reinterpret_cast<const float4*>(kt + d * (kTileK + kPad) + tx * 4);
        float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int jj = 0; jj < 4; ++jj) s[i][jj] += av[i] * bv[jj];
      }
      if (score_cap.cap > 0.0f) {  // the same for every thread
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int jj = 0; jj < 4; ++jj) s[i][jj] = SoftcapScore(s[i][jj], score_cap);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        int vec = ty * 4 + i;
        int row = vec / group_heads;
        bool in_run = vec < vectors && row >= seg && row < seg_end;
        float mx = -INFINITY;
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
          int32_t j = k0 + tx * 4 + jj;
          bool visible = in_run && j < kend && j >= s_first[row] && j <= s_pos[row];
          if (!visible) s[i][jj] = -INFINITY;
          mx = fmaxf(mx, s[i][jj]);
        }
#pragma unroll
        for (int off = 8; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
        float m_new = fmaxf(m[i], mx);
        float corr = m_new == -INFINITY ? 1.0f : exp2f(m[i] - m_new);
        float sum = 0.0f;
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
          float e = m_new == -INFINITY ? 0.0f : exp2f(s[i][jj] - m_new);
          s[i][jj] = e;
          sum += e;
        }
#pragma unroll
        for (int off = 8; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
        l[i] = l[i] * corr + sum;
        m[i] = m_new;
#pragma unroll
        for (int d = 0; d < kOutVecs * kW; ++d) o[i][d] *= corr;
        *reinterpret_cast<float4*>(ps + vec * (kTileK + kPad) + tx * 4) =
            make_float4(s[i][0], s[i][1], s[i][2], s[i][3]);
      }
      __syncthreads();
#pragma unroll 4
      for (int key = 0; key < kTileK; ++key) {
        float pv[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) pv[i] = ps[(ty * 4 + i) * (kTileK + kPad) + key];
#pragma unroll
        for (int u = 0; u < kOutVecs; ++u) {
          float vv[kW];
          LoadVec<kW>(vs + key * HD + tx * kW + 16 * kW * u, vv);
#pragma unroll
          for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int c = 0; c < kW; ++c) o[i][u * kW + c] += pv[i] * vv[c];
        }
      }
      __syncthreads();
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    int vec = ty * 4 + i;
    if (vec >= vectors || !s_mine[vec / group_heads]) continue;
    int64_t row = r0 + vec / group_heads;
    int head = kv_head * group_heads + vec % group_heads;
    float* dst = p.out + (row * p.heads + head) * HD;
    float inv = 1.0f / l[i];
#pragma unroll
    for (int u = 0; u < kOutVecs; ++u) {
      float r[kW];
#pragma unroll
      for (int c = 0; c < kW; ++c) r[c] = o[i][u * kW + c] * inv;
      StoreVec<kW>(dst + tx * kW + 16 * kW * u, r);
    }
  }
}

template <typename T, int HD, int GB>
void LaunchDecode(const AttentionParams& p, int sm_count, Scratch* scratch, cudaStream_t stream) {
  int group_heads = p.heads / p.kv_heads;
  int head_chunks = group_heads / GB;
  int per_split = static_cast<int>(p.rows) * p.kv_heads * head_chunks;
  size_t shared = DecodeSharedBytes<T, HD, GB>();
  // Blocks of this instantiation one multiprocessor holds (shared memory or registers bound it).
  static int resident = [shared] {
    cudaFuncSetAttribute(DecodeKernel<T, HD, GB>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(shared));
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, DecodeKernel<T, HD, GB>, kDecodeThreads,
                                                      shared) != cudaSuccess ||
        n < 1) {
      n = 2;
    }
    return n;
  }();
  // Splits so that the grid fills the resident slots about once: a whole number of waves (the
  // floor) keeps a few leftover blocks from running as a second, latency-bound wave, unless the
  // floor leaves a quarter of the slots idle. Many rows need no split at all. The kernel divides
  // a row's pages, so every non-empty split has at least a page; splits past the row's last page
  // are empty and cost a block that only writes an empty part. No row has more pages than the
  // page table's width, so more splits than that would all be empty.
  int slots = resident * sm_count;
  int splits = std::max(1, slots / per_split);
  if (per_split < slots && splits * per_split < slots * 3 / 4) ++splits;
  splits = std::max(1, std::min(std::min(splits, kMaxSplits), static_cast<int>(p.table.max_pages)));
  float* part_acc = nullptr;
  float* part_ml = nullptr;
  if (splits > 1) {
    size_t parts = static_cast<size_t>(p.rows) * p.heads * splits;
    float* base = static_cast<float*>(scratch->Get(parts * (HD + 2) * sizeof(float)));
    part_acc = base;
    part_ml = base + parts * HD;
  }
  dim3 grid(static_cast<unsigned>(p.rows), static_cast<unsigned>(p.kv_heads * head_chunks),
            static_cast<unsigned>(splits));
  LaunchDependent(DecodeKernel<T, HD, GB>, grid, dim3(kDecodeThreads), shared, stream, p,
                  ScoreCapOf(p), head_chunks, splits, part_acc, part_ml);
  if (splits > 1) {
    LaunchDependent(CombineKernel, dim3(static_cast<unsigned>(p.rows * p.heads)), dim3(HD), 0,
                    stream, p, splits, static_cast<const float*>(part_acc),
                    static_cast<const float*>(part_ml), /*all_rows=*/false);
  }
}

// Decoding rows through the tensor-core decode kernel, split as LaunchDecode splits them.
void LaunchDecodeMma(const AttentionParams& p, int sm_count, Scratch* scratch,
                     cudaStream_t stream) {
  const int per_split = static_cast<int>(p.rows) * p.kv_heads;
  const int slots = LaunchMmaDecode(p, 0, nullptr, nullptr, stream) * sm_count;
  int splits = std::max(1, slots / per_split);
  if (per_split < slots && splits * per_split < slots * 3 / 4) ++splits;
  splits = std::max(1, std::min(std::min(splits, kMaxSplits), static_cast<int>(p.table.max_pages)));
  float* part_acc = nullptr;
  float* part_ml = nullptr;
  if (splits > 1) {
    size_t parts = static_cast<size_t>(p.rows) * p.heads * splits;
    float* base = static_cast<float*>(scratch->Get(parts * (p.head_dim + 2) * sizeof(float)));
    part_acc = base;
    part_ml = base + parts * p.head_dim;
  }
  LaunchMmaDecode(p, splits, part_acc, part_ml, stream);
  if (splits > 1) {
    LaunchDependent(CombineKernel, dim3(static_cast<unsigned>(p.rows * p.heads)), dim3(p.head_dim),
                    0, stream, p, splits, static_cast<const float*>(part_acc),
                    static_cast<const float*>(part_ml), /*all_rows=*/false);
  }
}

template <typename T, int HD>
void LaunchTile(const AttentionParams& p, cudaStream_t stream) {
  int group_heads = p.heads / p.kv_heads;
  int tile_rows = kTileQ / group_heads;
  size_t shared =
      (HD * (kTileQ + kPad) + HD * (kTileK + kPad) + kTileK * HD + kTileQ * (kTileK + kPad)) *
      sizeof(float);
  static bool raised = [shared] {
    return cudaFuncSetAttribute(TileKernel<T, HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(shared)) == cudaSuccess;
  }();
  (void)raised;
  dim3 grid(static_cast<unsigned>((p.rows + tile_rows - 1) / tile_rows),
            static_cast<unsigned>(p.kv_heads));
  TileKernel<T, HD><<<grid, 256, shared, stream>>>(p, ScoreCapOf(p), tile_rows);
  GZ_CUDA_LAUNCHED();
}

template <typename T, int HD>
void LaunchFor(const AttentionParams& p, int sm_count, Scratch* scratch, cudaStream_t stream,
               bool tensor_cores, const void* k16, const void* v16) {
  int group_heads = p.heads / p.kv_heads;
  // Query heads per decode block: registers hold GB x HD/16 query and output values.
  constexpr int kMaxGb = HD > 128 ? 4 : 8;
  if (tensor_cores && MmaDecodeSupported(p)) {
    LaunchDecodeMma(p, sm_count, scratch, stream);
  } else if (group_heads % 8 == 0 && kMaxGb >= 8) {
    LaunchDecode<T, HD, (kMaxGb >= 8 ? 8 : 4)>(p, sm_count, scratch, stream);
  } else if (group_heads % 4 == 0) {
    LaunchDecode<T, HD, 4>(p, sm_count, scratch, stream);
  } else if (group_heads % 3 == 0) {
    LaunchDecode<T, HD, 3>(p, sm_count, scratch, stream);
  } else if (group_heads % 2 == 0) {
    LaunchDecode<T, HD, 2>(p, sm_count, scratch, stream);
  } else {
    LaunchDecode<T, HD, 1>(p, sm_count, scratch, stream);
  }
  if (p.rows > 1) {
    if (tensor_cores && MmaTileSupported(p.heads, p.kv_heads, p.head_dim)) {
      LaunchMmaTile(p, sm_count, stream, 0, k16, v16);
    } else {
      LaunchTile<T, HD>(p, stream);
    }
  }
}

// The kernels of the pages' element type.
template <int HD>
void LaunchForPages(const AttentionParams& p, int sm_count, Scratch* scratch, cudaStream_t stream,
                    bool tensor_cores, const void* k16, const void* v16) {
  if (p.cache.format == KvFormat::kF16) {
    LaunchFor<__half, HD>(p, sm_count, scratch, stream, tensor_cores, k16, v16);
  } else {
    LaunchFor<float, HD>(p, sm_count, scratch, stream, tensor_cores, k16, v16);
  }
}

}  // namespace

void LaunchAttentionCombine(const AttentionParams& p, bool all_rows, int splits,
                            const float* part_acc, const float* part_ml, cudaStream_t stream) {
  LaunchDependent(CombineKernel, dim3(static_cast<unsigned>(p.rows * p.heads)), dim3(p.head_dim), 0,
                  stream, p, splits, part_acc, part_ml, all_rows);
  GZ_CUDA_LAUNCHED();
}

bool AttentionSupported(int heads, int kv_heads, int head_dim) {
  return head_dim % 32 == 0 && head_dim >= 32 && head_dim <= 256 && kv_heads > 0 &&
         heads % kv_heads == 0 && heads / kv_heads <= kTileQ;
}

void LaunchAttention(const AttentionParams& p, int sm_count, Scratch* scratch, cudaStream_t stream,
                     bool tensor_cores, const void* k16, const void* v16) {
  if (p.rows == 0) return;
  if (!AttentionSupported(p.heads, p.kv_heads, p.head_dim)) {
    std::fprintf(stderr,
                 "cuda Attention: head_dim %d with %d heads over %d kv heads has no kernel\n",
                 p.head_dim, p.heads, p.kv_heads);
    std::abort();
  }
  if (p.cache.format != KvFormat::kF32 && p.cache.format != KvFormat::kF16) {
    std::fprintf(stderr, "cuda Attention: KV pages of format %s have no kernel\n",
                 KvFormatName(p.cache.format).c_str());
    std::abort();
  }
  switch (p.head_dim) {
    case 32:
      return LaunchForPages<32>(p, sm_count, scratch, stream, tensor_cores, k16, v16);
    case 64:
      return LaunchForPages<64>(p, sm_count, scratch, stream, tensor_cores, k16, v16);
    case 96:
      return LaunchForPages<96>(p, sm_count, scratch, stream, tensor_cores, k16, v16);
    case 128:
      return LaunchForPages<128>(p, sm_count, scratch, stream, tensor_cores, k16, v16);
    case 160:
      return LaunchForPages<160>(p, sm_count, scratch, stream, tensor_cores, k16, v16);
    case 192:
      return LaunchForPages<192>(p, sm_count, scratch, stream, tensor_cores, k16, v16);
    case 224:
      return LaunchForPages<224>(p, sm_count, scratch, stream, tensor_cores, k16, v16);
    default:
      return LaunchForPages<256>(p, sm_count, scratch, stream, tensor_cores, k16, v16);
  }
}

}  // namespace gizllm::cuda
