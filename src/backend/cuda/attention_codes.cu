// KV write and attention over rotated KV pages (ops/kv_codes.h) on CUDA.
//
// The write: a thread per key or value vector (row, kv head), which rotates and codes it with the
// same functions as the CPU (ops/kv_codes.h), in its own registers and local memory. A decode step
// writes a few hundred vectors; a prompt of 2,048 rows over 8 kv heads 32,768, each a few thousand
// operations: correct and simple rather than fast.
//
// The attention: a block per (row, kv head), every row alike (decode and prompt pieces), reading
// the codes where they lie. The block's query heads are rotated once into shared memory; its
// warps take the positions in turn (warp w: first + w, first + w + kWarps, ...), a lane the
// elements lane, lane + 32, ... of each (read back as min + step * level of its group's code),
// with an online softmax per warp and query head; the warps' sums are combined at the end and
// rotated back. No split of a long context over blocks and no tensor cores: the prompt path reads
// every key once per row.
#include <cuda_runtime.h>

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

// Thread i: vector i / 2 of the rows' (row, kv head) vectors, its key (i even) or value (odd).
__global__ void RotatedKvWriteKernel(KvWriteParams p) {
  Prologue();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= 2 * p.rows * p.kv_heads) return;
  const bool keys = i % 2 == 0;
  const int64_t item = i / 2;  // row * kv_heads + kv head
  const int64_t r = item / p.kv_heads;
  const int32_t pos = p.positions[r];
  const int64_t page =
      p.table.pages[static_cast<int64_t>(p.slots[r]) * p.table.max_pages + pos / kPage];
  const int64_t vector = (page * kPage + pos % kPage) * p.kv_heads + item % p.kv_heads;
  const int hd = p.head_dim;
  float y[kMaxHeadDim];
  const float* x = (keys ? p.k : p.v) + item * hd;
  for (int e = 0; e < hd; ++e) y[e] = x[e];
  kv::Rotate(y, hd);
  const KvFormat f = p.cache.format;
  const int64_t bytes = kv::CodeBytes(keys ? KvKeyBits(f) : KvValueBits(f), hd);
  kv::QuantizeVector(
      y, hd, keys ? KvKeyBits(f) : KvValueBits(f),
      static_cast<uint8_t*>(keys ? p.cache.keys : p.cache.values) + vector * bytes,
      (keys ? p.cache.key_scales : p.cache.value_scales) + 2 * kv::Groups(hd) * vector);
}

// Element e of a rotated vector read back: its group's min + step * level of its code
// (kv::Level: the code, or at 4 bits kv::kLevels4's level).
__device__ __forceinline__ float Element(const uint8_t* codes, const float* step_mins, int e,
                                         int bits, int part) {
  const float* sm = step_mins + 2 * (e / part);
  return sm[1] + sm[0] * kv::Level(bits, kv::Code(codes, e, bits));
}

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
  LaunchDependent(RotatedKvWriteKernel, dim3(static_cast<unsigned>((n + 127) / 128)), dim3(128), 0,
                  stream, p);
  GZ_CUDA_LAUNCHED();
}

void LaunchRotatedAttention(const AttentionParams& p, cudaStream_t stream) {
  if (p.rows == 0) return;
  if (!RotatedAttentionSupported(p.heads, p.kv_heads, p.head_dim)) {
    std::fprintf(stderr,
                 "cuda Attention: rotated pages of head_dim %d with %d heads over %d kv heads "
                 "have no kernel\n",
                 p.head_dim, p.heads, p.kv_heads);
    std::abort();
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
