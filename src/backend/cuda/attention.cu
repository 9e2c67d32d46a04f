// Paged grouped-query attention over float32 KV pages.
//
// A row whose neighbours in the step belong to other sequences (a decoding row) goes to the
// decode kernel: one block per (row, kv head, split of its keys), so a long context is read by
// many blocks at once; a second kernel combines the splits. Runs of rows of one sequence (prompt
// pieces) go to the tile kernel: a block holds 64 query vectors (rows x the query heads of one
// kv head), walks the keys 64 at a time with an online softmax (flash-attention style), and so
// reads each key once per tile instead of once per row. Both kernels run on every step; each
// skips the rows that belong to the other, which lets one step mix decodes and prompt pieces.
// In the fast mode, prompt pieces go to the tensor-core tile kernel of attention_mma.cu instead
// (fp16 operands) wherever it covers the shape.
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

template <int W>
__device__ __forceinline__ void StoreVec(float* dst, const float* src) {
  if constexpr (W == 4) {
    *reinterpret_cast<float4*>(dst) = make_float4(src[0], src[1], src[2], src[3]);
  } else {
    *reinterpret_cast<float2*>(dst) = make_float2(src[0], src[1]);
  }
}

// Block (row, kv head x head chunk, split). Groups of 16 lanes take one key each; a lane holds
// HD/16 dimensions of the GB query heads, in pieces of kW floats 16 x kW floats apart.
template <int HD, int GB>
__global__ void __launch_bounds__(kDecodeThreads)
    DecodeKernel(AttentionParams p, int head_chunks, int splits,
                 float* part_acc,   // [rows, heads, splits, HD] when splits > 1
                 float* part_ml) {  // [rows, heads, splits, 2] (max, sum) when splits > 1
  constexpr int kW = Width<HD>();
  constexpr int kStride = kLanesPerKey * kW;
  constexpr int kDims = HD / kLanesPerKey;
  constexpr int kVecs = kDims / kW;
  extern __shared__ float shared[];
  float* s_acc = shared;                         // [kKeysAtOnce, GB, HD]
  float* s_ml = shared + kKeysAtOnce * GB * HD;  // [kKeysAtOnce, GB, 2]
  AllowDependentLaunch();  // the GEMV after it may start loading its weights
  int64_t r = blockIdx.x;
  if (!Alone(p, r)) return;
  int kv_head = blockIdx.y / head_chunks;
  int group_heads = p.heads / p.kv_heads;
  int head0 = kv_head * group_heads + (blockIdx.y % head_chunks) * GB;
  int split = blockIdx.z;
  int32_t slot = p.slots[r];
  int32_t position = p.positions[r];
  int32_t first = FirstVisible(p, position);
  int32_t span = (position - first + 1 + splits - 1) / splits;
  int32_t begin = first + split * span;
  int32_t end = min(position + 1, begin + span);
  int group = threadIdx.x / kLanesPerKey, sub = threadIdx.x % kLanesPerKey;

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
  const int32_t* pages = p.table.pages + static_cast<int64_t>(slot) * p.table.max_pages;
  // Keys and values of the next iteration are loaded while this one is computed (two sets in
  // registers), so each group has a page-table read and its key loads in flight behind the
  // arithmetic instead of one dependent read after another.
  auto load = [&](int32_t j, float* k, float* v) {
    if (j < end) {
      int64_t page = pages[j / kPage];
      int64_t at = ((page * kPage + j % kPage) * p.kv_heads + kv_head) * HD + sub * kW;
#pragma unroll
      for (int i = 0; i < kVecs; ++i) {
        LoadVec<kW, true>(p.cache.keys + at + i * kStride, &k[kW * i]);
        LoadVec<kW, true>(p.cache.values + at + i * kStride, &v[kW * i]);
      }
    } else {
#pragma unroll
      for (int d = 0; d < kDims; ++d) k[d] = v[d] = 0.0f;
    }
  };
  float k[kDims], v[kDims];
  load(begin + group, k, v);
  // Every lane runs the same iterations (the shuffles below need the whole warp); a group
  // whose key is past the end only takes part in them.
  for (int32_t j0 = begin; j0 < end; j0 += kKeysAtOnce) {
    const bool valid = j0 + group < end;
    float kn[kDims], vn[kDims];
    load(j0 + kKeysAtOnce + group, kn, vn);
#pragma unroll
    for (int g = 0; g < GB; ++g) {
      float s = 0.0f;
#pragma unroll
      for (int d = 0; d < kDims; ++d) s += q[g][d] * k[d];
#pragma unroll
      for (int o = kLanesPerKey / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      if (valid) {
        float m_new = fmaxf(m[g], s);
        float corr = exp2f(m[g] - m_new);
        float e = exp2f(s - m_new);
        l[g] = l[g] * corr + e;
#pragma unroll
        for (int d = 0; d < kDims; ++d) acc[g][d] = acc[g][d] * corr + e * v[d];
        m[g] = m_new;
      }
    }
#pragma unroll
    for (int d = 0; d < kDims; ++d) k[d] = kn[d], v[d] = vn[d];
  }
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

// One block of head_dim threads per (row, head): out = sum of the splits' parts, rescaled.
__global__ void CombineKernel(AttentionParams p, int splits, const float* part_acc,
                              const float* part_ml) {
  AllowDependentLaunch();  // the GEMV after it may start loading its weights
  int64_t r = blockIdx.x / p.heads;
  if (!Alone(p, r)) return;
  int64_t rh = blockIdx.x;
  float mm = -INFINITY;
  for (int s = 0; s < splits; ++s) mm = fmaxf(mm, part_ml[(rh * splits + s) * 2]);
  for (int d = threadIdx.x; d < p.head_dim; d += blockDim.x) {
    float ll = 0.0f, a = 0.0f;
    for (int s = 0; s < splits; ++s) {
      float ms = part_ml[(rh * splits + s) * 2];
      if (ms == -INFINITY) continue;
      float w = exp2f(ms - mm);
      ll += w * part_ml[(rh * splits + s) * 2 + 1];
      a += w * part_acc[(rh * splits + s) * p.head_dim + d];
    }
    p.out[rh * p.head_dim + d] = a / ll;
  }
}

constexpr int kTileQ = 64;  // query vectors per block
constexpr int kTileK = 64;  // keys per step
constexpr int kPad = 4;

// 256 threads as 16 x 16: thread (ty, tx) computes scores of query vectors ty*4.. and keys
// tx*4.., and the output of query vectors ty*4.. in dimensions tx*kW + 16*kW*u.
template <int HD>
__global__ void __launch_bounds__(256) TileKernel(AttentionParams p, int tile_rows) {
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
          a = *reinterpret_cast<const float4*>(p.cache.keys + at);
          b = *reinterpret_cast<const float4*>(p.cache.values + at);
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

template <int HD, int GB>
void LaunchDecode(const AttentionParams& p, int sm_count, Scratch* scratch, cudaStream_t stream) {
  int group_heads = p.heads / p.kv_heads;
  int head_chunks = group_heads / GB;
  int per_split = static_cast<int>(p.rows) * p.kv_heads * head_chunks;
  // About four blocks per multiprocessor in all; each split has at least a page of keys
  // whenever the context allows it (the kernel divides the row's own range).
  int splits = (4 * sm_count + per_split - 1) / per_split;
  splits = std::max(1, std::min(splits, 64));
  float* part_acc = nullptr;
  float* part_ml = nullptr;
  if (splits > 1) {
    size_t parts = static_cast<size_t>(p.rows) * p.heads * splits;
    float* base = static_cast<float*>(scratch->Get(parts * (HD + 2) * sizeof(float)));
    part_acc = base;
    part_ml = base + parts * HD;
  }
  size_t shared = (kKeysAtOnce * GB * HD + kKeysAtOnce * GB * 2) * sizeof(float);
  static bool raised = [shared] {
    return cudaFuncSetAttribute(DecodeKernel<HD, GB>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(shared)) == cudaSuccess;
  }();
  (void)raised;
  dim3 grid(static_cast<unsigned>(p.rows), static_cast<unsigned>(p.kv_heads * head_chunks),
            static_cast<unsigned>(splits));
  DecodeKernel<HD, GB>
      <<<grid, kDecodeThreads, shared, stream>>>(p, head_chunks, splits, part_acc, part_ml);
  GZ_CUDA_LAUNCHED();
  if (splits > 1) {
    CombineKernel<<<static_cast<unsigned>(p.rows * p.heads), HD, 0, stream>>>(p, splits, part_acc,
                                                                              part_ml);
    GZ_CUDA_LAUNCHED();
  }
}

template <int HD>
void LaunchTile(const AttentionParams& p, cudaStream_t stream) {
  int group_heads = p.heads / p.kv_heads;
  int tile_rows = kTileQ / group_heads;
  size_t shared =
      (HD * (kTileQ + kPad) + HD * (kTileK + kPad) + kTileK * HD + kTileQ * (kTileK + kPad)) *
      sizeof(float);
  static bool raised = [shared] {
    return cudaFuncSetAttribute(TileKernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(shared)) == cudaSuccess;
  }();
  (void)raised;
  dim3 grid(static_cast<unsigned>((p.rows + tile_rows - 1) / tile_rows),
            static_cast<unsigned>(p.kv_heads));
  TileKernel<HD><<<grid, 256, shared, stream>>>(p, tile_rows);
  GZ_CUDA_LAUNCHED();
}

template <int HD>
void LaunchFor(const AttentionParams& p, int sm_count, Scratch* scratch, cudaStream_t stream,
               bool tensor_cores) {
  int group_heads = p.heads / p.kv_heads;
  // Query heads per decode block: registers hold GB x HD/16 query and output values.
  constexpr int kMaxGb = HD > 128 ? 4 : 8;
  if (group_heads % 8 == 0 && kMaxGb >= 8) {
    LaunchDecode<HD, (kMaxGb >= 8 ? 8 : 4)>(p, sm_count, scratch, stream);
  } else if (group_heads % 4 == 0) {
    LaunchDecode<HD, 4>(p, sm_count, scratch, stream);
  } else if (group_heads % 3 == 0) {
    LaunchDecode<HD, 3>(p, sm_count, scratch, stream);
  } else if (group_heads % 2 == 0) {
    LaunchDecode<HD, 2>(p, sm_count, scratch, stream);
  } else {
    LaunchDecode<HD, 1>(p, sm_count, scratch, stream);
  }
  if (p.rows > 1) {
    if (tensor_cores && MmaTileSupported(p.heads, p.kv_heads, p.head_dim)) {
      LaunchMmaTile(p, sm_count, stream);
    } else {
      LaunchTile<HD>(p, stream);
    }
  }
}

}  // namespace

bool AttentionSupported(int heads, int kv_heads, int head_dim) {
  return head_dim % 32 == 0 && head_dim >= 32 && head_dim <= 256 && kv_heads > 0 &&
         heads % kv_heads == 0 && heads / kv_heads <= kTileQ;
}

void LaunchAttention(const AttentionParams& p, int sm_count, Scratch* scratch, cudaStream_t stream,
                     bool tensor_cores) {
  if (p.rows == 0) return;
  if (!AttentionSupported(p.heads, p.kv_heads, p.head_dim)) {
    std::fprintf(stderr,
                 "cuda Attention: head_dim %d with %d heads over %d kv heads has no kernel\n",
                 p.head_dim, p.heads, p.kv_heads);
    std::abort();
  }
  switch (p.head_dim) {
    case 32:
      return LaunchFor<32>(p, sm_count, scratch, stream, tensor_cores);
    case 64:
      return LaunchFor<64>(p, sm_count, scratch, stream, tensor_cores);
    case 96:
      return LaunchFor<96>(p, sm_count, scratch, stream, tensor_cores);
    case 128:
      return LaunchFor<128>(p, sm_count, scratch, stream, tensor_cores);
    case 160:
      return LaunchFor<160>(p, sm_count, scratch, stream, tensor_cores);
    case 192:
      return LaunchFor<192>(p, sm_count, scratch, stream, tensor_cores);
    case 224:
      return LaunchFor<224>(p, sm_count, scratch, stream, tensor_cores);
    default:
      return LaunchFor<256>(p, sm_count, scratch, stream, tensor_cores);
  }
}

}  // namespace gizllm::cuda
