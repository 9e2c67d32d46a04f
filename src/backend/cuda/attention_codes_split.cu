// The split kernel over rotated KV pages (ops/kv_codes.h): float32 attention of rows whose
// queries are already rotated (attention_codes.cu rotates them, and the output back), reading
// the codes where they lie: every row in exact mode (and the fast mode's decoding rows where the
// tensor-core decode kernel does not take the heads).
//
// The decode kernel of attention.cu over codes: a block per (row, kv head x head chunk, split
// of its pages); the split's pages stream through a ring of shared-memory stages (cp.async,
// several pages ahead of the arithmetic), one stage a page's kPage (16) key and value code
// vectors and their {step, min} pairs as they lie in the cache (each vector's codes and pairs are
// contiguous, 16-byte pieces). Groups of 16 lanes take keys group and group + 8 of a page; a
// lane holds head_dim / 16 consecutive dimensions of GB query heads (their codes are one load of
// 1 to 16 bytes, inside one code group: one {step, min}), reads them back in registers as
// min + step * level (8 and 2 bits: the code, by the float32 exponent trick; 4 bits: kLevels4
// from a shared table) and keeps the online softmax of the 16-bit kernel. The splits' parts go
// to attention.cu's combine.
//
// Bytes: a position of a kv head costs 2 * head_dim * bits / 8 of codes and 2 * head_dim / 4 of
// pairs (float32 step and min per 32 channels): at head_dim 128, 320 bytes at 8/8 bits against
// 512 for fp16 pages, 192 at 4/4. Qwen3-8B's shape at context 32,768 (8 kv heads, 36 layers):
// 83.9 MB a layer at 8/8 bits, 19.6 us at 4.28 TB/s (fp16 pages: 134 MB, 31.4 us), 0.71 ms a
// token (1.13). Arithmetic per lane and key (GB = 4, 8 dimensions a lane): 3 operations per
// element to read it back (shared by the GB heads), GB multiply-adds per element for the scores
// and as many for the output, 4 shuffles a score and the softmax: about 176, 2,800 a position
// and kv head, 22 us a layer at the H200's issue rate, so the kernel is near both limits. The
// fast mode's tensor-core decode kernel over codes (attention_mma.cu) reads each element back
// once per kv head (about 4 operations, 1,000 a position and kv head) and leaves the products
// to the tensor cores: bound by the bytes.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backend/cuda/kernels.cuh"
#include "backend/cuda/kv_codes.cuh"
#include "backend/cuda/mma.cuh"
#include "ops/kv_codes.h"

namespace gizllm::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kLanesPerKey = 16;
constexpr int kKeysAtOnce = kThreads / kLanesPerKey;
constexpr int kKeysPerGroup = kPage / kKeysAtOnce;
constexpr int kMaxSplits = 64;  // attention.cu's combine takes up to 64 splits

__device__ __forceinline__ bool Alone(const AttentionParams& p, int64_t r) {
  int32_t slot = p.slots[r];
  return !(r > 0 && p.slots[r - 1] == slot) && !(r + 1 < p.rows && p.slots[r + 1] == slot);
}

// Bytes of a stage at its largest (8-bit keys and values): the page's codes and pairs.
template <int HD>
constexpr int StageBytes() {
  return kPage * (2 * HD + 2 * (HD / 32) * 8);
}
// Stages of the ring: about 48 KB of it at 8/8 bits (4-bit pages leave part of each unused), as
// in attention.cu's decode kernel.
template <int HD>
constexpr int Stages() {
  constexpr int stages = 48 * 1024 / StageBytes<HD>();
  return stages < 3 ? 3 : stages > 8 ? 8 : stages;
}
template <int HD, int GB>
constexpr size_t SharedBytes() {
  constexpr size_t ring = static_cast<size_t>(Stages<HD>()) * StageBytes<HD>();
  constexpr size_t combine = static_cast<size_t>(kKeysAtOnce) * GB * (HD + 2) * sizeof(float);
  return ring > combine ? ring : combine;
}
// Blocks per multiprocessor, by attention.cu's DecodeMinBlocks rule (registers capped at 128
// where the lane's GB query and GB output vectors of head_dim / 16 leave room).
template <int HD, int GB>
constexpr int MinBlocks() {
  constexpr int by_shared = 227 * 1024 / static_cast<int>(SharedBytes<HD, GB>() + 1024);
  constexpr int by_registers = GB <= 4 && (2 * GB + 3) * (HD / 16) <= 88 ? 4 : 1;
  return by_shared < by_registers ? by_shared : by_registers;
}

// Block (row, kv head x head chunk, split). key_bits, value_bits: 8, 4 or 2.
template <int HD, int GB>
__global__ void __launch_bounds__(kThreads, (MinBlocks<HD, GB>()))
    CodesDecodeKernel(AttentionParams p, ScoreCap score_cap, int head_chunks, int splits,
                      bool all_rows, int key_bits, int value_bits,
                      float* part_acc,   // [rows, heads, splits, HD] when splits > 1
                      float* part_ml) {  // [rows, heads, splits, 2] (max, sum) when splits > 1
  constexpr int kDims = HD / kLanesPerKey;
  constexpr int kGroups = HD / 32;         // code groups of a vector (kv::Groups)
  constexpr int kPairBytes = kGroups * 8;  // a vector's {step, min} pairs
  constexpr int kStages = Stages<HD>();
  constexpr int kStageBytes = StageBytes<HD>();
  static_assert(HD == 64 || HD == 128 || HD == 256, "head_dim 64, 128 or 256");
  extern __shared__ __align__(16) float shared[];
  uint8_t* ring = reinterpret_cast<uint8_t*>(shared);  // [kStages, kStageBytes] while streaming
  float* s_acc = shared;                               // [kKeysAtOnce, GB, HD] after it
  float* s_ml = shared + kKeysAtOnce * GB * HD;        // [kKeysAtOnce, GB, 2]
  __shared__ float s_levels4[16];

  AllowDependentLaunch();
  WaitForPriorGrid();
  const int64_t r = blockIdx.x;
  if (!all_rows && !Alone(p, r)) return;
  if (threadIdx.x < 16) s_levels4[threadIdx.x] = kv::Level4(static_cast<int>(threadIdx.x));
  const int kv_head = blockIdx.y / head_chunks;
  const int group_heads = p.heads / p.kv_heads;
  const int head0 = kv_head * group_heads + (blockIdx.y % head_chunks) * GB;
  const int split = blockIdx.z;
  const int32_t slot = p.slots[r];
  const int32_t position = p.positions[r];
  const int32_t first = p.window > 0 ? max(0, position - p.window + 1) : 0;
  // The row's pages divided among the splits, as attention.cu's decode kernel divides them.
  const int32_t first_page = first / kPage;
  const int32_t row_pages = position / kPage - first_page + 1;
  const int32_t split_pages = (row_pages + splits - 1) / splits;
  const int32_t page0 = first_page + split * split_pages;
  const int32_t stages = max(0, min(split_pages, row_pages - split * split_pages));
  const int32_t begin = max(first, page0 * kPage);
  const int32_t end = min(position + 1, (page0 + stages) * kPage);
  const int group = threadIdx.x / kLanesPerKey, sub = threadIdx.x % kLanesPerKey;
  const int32_t* pages = p.table.pages + static_cast<int64_t>(slot) * p.table.max_pages;

  // A stage: key codes [kPage, key_bytes], value codes [kPage, value_bytes], then the keys'
  // and the values' pairs [kPage, kPairBytes] each. Each part is copied in 16-byte pieces; a
  // vector's are a power of two (head_dim a multiple of 64), so position and piece are a shift
  // and a mask of the piece's index.
  const int key_bytes = HD * key_bits / 8, value_bytes = HD * value_bits / 8;
  const int value_at = kPage * key_bytes;
  const int key_pairs_at = value_at + kPage * value_bytes;
  const int value_pairs_at = key_pairs_at + kPage * kPairBytes;
  const auto* keys = static_cast<const uint8_t*>(p.cache.keys);
  const auto* values = static_cast<const uint8_t*>(p.cache.values);
  const auto* key_pairs = reinterpret_cast<const uint8_t*>(p.cache.key_scales);
  const auto* value_pairs = reinterpret_cast<const uint8_t*>(p.cache.value_scales);
  // Stage u of the split (cache page `page`) into ring slot u % kStages; positions outside
  // [begin, end) are not copied (the arithmetic masks them without reading them).
  auto issue = [&](int32_t u, int64_t page) {
    uint8_t* dst = ring + (u % kStages) * kStageBytes;
    const int32_t pos0 = (page0 + u) * kPage;
    const int64_t v0 = page * kPage * p.kv_heads + kv_head;  // the page's first vector
    // bytes: of a vector's part (16 to 256); src: the part's array; at: its offset in the stage.
    auto part = [&](const uint8_t* src, int bytes, int at) {
      const int shift = __ffs(bytes / 16) - 1;  // log2 of the pieces of a vector
      for (int c = threadIdx.x; c < kPage * bytes / 16; c += kThreads) {
        const int o = c >> shift, piece = c & ((1 << shift) - 1);
        if (pos0 + o < begin || pos0 + o >= end) continue;
        CpAsync16(dst + at + o * bytes + piece * 16,
                  src + (v0 + static_cast<int64_t>(o) * p.kv_heads) * bytes + piece * 16);
      }
    };
    part(keys, key_bytes, 0);
    part(values, value_bytes, value_at);
    part(key_pairs, kPairBytes, key_pairs_at);
    part(value_pairs, kPairBytes, value_pairs_at);
  };
  // All stages but one in flight, every stage committing a group, empty or not (attention.cu).
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
  int32_t next_page = kStages - 1 < stages ? __ldg(pages + page0 + kStages - 1) : 0;

  float q[GB][kDims];
  const float qscale = p.scale * kLog2e;
#pragma unroll
  for (int g = 0; g < GB; ++g) {
    const float* qh = p.q + (r * p.heads + head0 + g) * HD + sub * kDims;
#pragma unroll
    for (int d = 0; d < kDims; d += 4) {
      const float4 t = *reinterpret_cast<const float4*>(qh + d);
      q[g][d] = t.x * qscale, q[g][d + 1] = t.y * qscale;
      q[g][d + 2] = t.z * qscale, q[g][d + 3] = t.w * qscale;
    }
  }
  float m[GB], l[GB], acc[GB][kDims];
#pragma unroll
  for (int g = 0; g < GB; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int d = 0; d < kDims; ++d) acc[g][d] = 0.0f;
  }
  for (int32_t t = 0; t < stages; ++t) {
    // Stage t has landed (at most kStages - 2 groups pending) for every thread, and every
    // thread is done with stage t - 1, whose slot the next issue fills.
    CpAsyncWait<kStages - 2>();
    __syncthreads();
    const int32_t u = t + kStages - 1;
    if (u < stages) {
      issue(u, next_page);
      if (u + 1 < stages) next_page = __ldg(pages + page0 + u + 1);
    }
    CpAsyncCommit();

    const uint8_t* st = ring + (t % kStages) * kStageBytes;
    const auto* kp = reinterpret_cast<const float*>(st + key_pairs_at);
    const auto* vp = reinterpret_cast<const float*>(st + value_pairs_at);
    const int32_t pos0 = (page0 + t) * kPage;
    float s[kKeysPerGroup][GB];
    bool valid[kKeysPerGroup];
#pragma unroll
    for (int kk = 0; kk < kKeysPerGroup; ++kk) {
      const int o = group + kk * kKeysAtOnce;
      valid[kk] = pos0 + o >= begin && pos0 + o < end;
      float k[kDims];
      ReadBack<kDims>(st + o * key_bytes, kp + o * 2 * kGroups, key_bits, sub, s_levels4, k);
#pragma unroll
      for (int g = 0; g < GB; ++g) {
        float dot = 0.0f;
#pragma unroll
        for (int d = 0; d < kDims; ++d) dot = fmaf(q[g][d], k[d], dot);
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
        // Uncopied positions hold stale shared memory: select, never multiply, them away.
        if (!valid[kk]) s[kk][g] = -INFINITY;
      }
    float v[kKeysPerGroup][kDims];
#pragma unroll
    for (int kk = 0; kk < kKeysPerGroup; ++kk) {
      const int o = group + kk * kKeysAtOnce;
      if (valid[kk]) {
        ReadBack<kDims>(st + value_at + o * value_bytes, vp + o * 2 * kGroups, value_bits, sub,
                        s_levels4, v[kk]);
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
      const float corr = exp2f(m[g] - m_new);
      float e[kKeysPerGroup];
      float sum = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kKeysPerGroup; ++kk) e[kk] = exp2f(s[kk][g] - m_new), sum += e[kk];
      l[g] = l[g] * corr + sum;
#pragma unroll
      for (int d = 0; d < kDims; ++d) {
        float a = acc[g][d] * corr;
#pragma unroll
        for (int kk = 0; kk < kKeysPerGroup; ++kk) a = fmaf(e[kk], v[kk][d], a);
        acc[g][d] = a;
      }
      m[g] = m_new;
    }
  }
  // The combine below reuses the ring: no copy may still be landing in it, nor a lane reading.
  CpAsyncWait<0>();
  __syncthreads();
#pragma unroll
  for (int g = 0; g < GB; ++g) {
#pragma unroll
    for (int d = 0; d < kDims; d += 4) {
      *reinterpret_cast<float4*>(s_acc + (group * GB + g) * HD + sub * kDims + d) =
          make_float4(acc[g][d], acc[g][d + 1], acc[g][d + 2], acc[g][d + 3]);
    }
    if (sub == 0) {
      s_ml[(group * GB + g) * 2] = m[g];
      s_ml[(group * GB + g) * 2 + 1] = l[g];
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < GB * HD; i += kThreads) {
    const int g = i / HD, d = i % HD;
    float mm = -INFINITY;
    for (int x = 0; x < kKeysAtOnce; ++x) mm = fmaxf(mm, s_ml[(x * GB + g) * 2]);
    float ll = 0.0f, a = 0.0f;
    if (mm != -INFINITY) {
      for (int x = 0; x < kKeysAtOnce; ++x) {
        const float w = exp2f(s_ml[(x * GB + g) * 2] - mm);
        ll += w * s_ml[(x * GB + g) * 2 + 1];
        a += w * s_acc[(x * GB + g) * HD + d];
      }
    }
    const int64_t head = head0 + g;
    if (splits == 1) {
      p.out[(r * p.heads + head) * HD + d] = a / ll;
    } else {
      const int64_t at = (r * p.heads + head) * splits + split;
      part_acc[at * HD + d] = a;
      if (d == 0) {
        part_ml[at * 2] = mm;
        part_ml[at * 2 + 1] = ll;
      }
    }
  }
}

// Calls f.template operator()<HD, GB>() for p's head_dim and the query heads per block: GB
// the largest of 8 (up to head_dim 128), 4, 2, 1 that divides the heads of a kv head.
template <typename F>
auto WithShape(const AttentionParams& p, F&& f) {
  const int group_heads = p.heads / p.kv_heads;
  auto by_group = [&]<int HD>() {
    if (HD <= 128 && group_heads % 8 == 0) return f.template operator()<HD, (HD <= 128 ? 8 : 4)>();
    if (group_heads % 4 == 0) return f.template operator()<HD, 4>();
    if (group_heads % 2 == 0) return f.template operator()<HD, 2>();
    return f.template operator()<HD, 1>();
  };
  switch (p.head_dim) {
    case 64:
      return by_group.template operator()<64>();
    case 128:
      return by_group.template operator()<128>();
    default:
      return by_group.template operator()<256>();
  }
}

// Blocks of CodesDecodeKernel<HD, GB> a multiprocessor holds.
template <int HD, int GB>
int Resident() {
  static const int resident = [] {
    constexpr size_t shared = SharedBytes<HD, GB>();
    cudaFuncSetAttribute(CodesDecodeKernel<HD, GB>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(shared));
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, CodesDecodeKernel<HD, GB>, kThreads,
                                                      shared) != cudaSuccess ||
        n < 1) {
      n = 2;
    }
    return n;
  }();
  return resident;
}

bool Aligned16(const void* at) { return reinterpret_cast<uintptr_t>(at) % 16 == 0; }

}  // namespace

bool CodesDecodeSupported(const AttentionParams& p) {
  return (p.head_dim == 64 || p.head_dim == 128 || p.head_dim == 256) && p.kv_heads > 0 &&
         p.heads % p.kv_heads == 0 && Aligned16(p.cache.keys) && Aligned16(p.cache.values) &&
         Aligned16(p.cache.key_scales) && Aligned16(p.cache.value_scales);
}

int CodesDecodeSplits(const AttentionParams& p, int sm_count) {
  return WithShape(p, [&]<int HD, int GB>() {
    // As attention.cu's LaunchDecode: about one wave of the resident slots (every row counts,
    // as there, the prompt rows that exit at once in the fast mode too).
    const int64_t per_split = p.rows * p.kv_heads * (p.heads / p.kv_heads / GB);
    const int64_t slots = static_cast<int64_t>(Resident<HD, GB>()) * sm_count;
    int64_t splits = std::max<int64_t>(1, slots / per_split);
    if (per_split < slots && splits * per_split < slots * 3 / 4) ++splits;
    splits = std::max<int64_t>(
        1, std::min<int64_t>(std::min<int64_t>(splits, kMaxSplits), p.table.max_pages));
    return static_cast<int>(splits);
  });
}

void LaunchCodesDecode(const AttentionParams& p, bool all_rows, int splits, float* part_acc,
                       float* part_ml, cudaStream_t stream) {
  WithShape(p, [&]<int HD, int GB>() {
    const int head_chunks = p.heads / p.kv_heads / GB;
    (void)Resident<HD, GB>();  // raises the kernel's shared memory limit once
    const dim3 grid(static_cast<unsigned>(p.rows), static_cast<unsigned>(p.kv_heads * head_chunks),
                    static_cast<unsigned>(splits));
    LaunchDependent(CodesDecodeKernel<HD, GB>, grid, dim3(kThreads), SharedBytes<HD, GB>(), stream,
                    p, ScoreCapOf(p), head_chunks, splits, all_rows, KvKeyBits(p.cache.format),
                    KvValueBits(p.cache.format), part_acc, part_ml);
    GZ_CUDA_LAUNCHED();
  });
  if (splits > 1) LaunchAttentionCombine(p, all_rows, splits, part_acc, part_ml, stream);
}

}  // namespace gizllm::cuda
