// KV write and attention over rotated KV pages (ops/kv_codes.h) on CUDA.
//
// The write (RotatedKvWriteKernel): a block per 32 key or value vectors in shared memory; each
// butterfly stage of the rotation over all of them at once, then a thread per code group of 32
// channels, which codes it with the CPU's own function (kv::Quantize; this file is compiled
// without fused multiply-adds, so the codes are the CPU's). A 2,048-row prompt over 8 kv heads is
// 32,768 vectors, 131,072 groups: a thread each, where a thread per vector (the first kernel)
// left most of the device idle and ran the rotation out of local memory.
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

// The write: a block per kWriteVectors vectors (i even: the key of (row, kv head) i / 2, odd:
// its value), in shared memory with rows of head_dim + 1 floats. The block flips the signs and
// runs each butterfly stage of the rotation over all its vectors at once (every thread a few
// pairs, a barrier between stages), then a thread per code group (group g of vector w: thread
// item g * kWriteVectors + w, so that a warp's 32 threads read 32 different rows, 32 different
// banks) codes it with kv::Quantize. Each butterfly and each group's fit is the CPU's arithmetic
// in the CPU's order, so the codes are the same.
constexpr int kWriteVectors = 32;
constexpr int kWriteThreads = 128;

__global__ void __launch_bounds__(kWriteThreads) RotatedKvWriteKernel(KvWriteParams p) {
  Prologue();
  extern __shared__ float shared[];  // [kWriteVectors, head_dim + 1] the rotated vectors
  const int hd = p.head_dim, row = hd + 1;
  const int64_t n = 2 * p.rows * p.kv_heads;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * kWriteVectors;
  for (int e = threadIdx.x; e < kWriteVectors * hd; e += kWriteThreads) {
    const int w = e / hd, d = e % hd;
    const int64_t i = base + w;
    float x = 0.0f;
    if (i < n) x = ((i % 2 == 0) ? p.k : p.v)[(i / 2) * hd + d];
    shared[w * row + d] = kv::SignFlipped(d) ? -x : x;
  }
  // kv::Hadamard: per stage h, pairs (lo, lo + h) of each block of `block` channels.
  const int block = kv::RotationBlock(hd);
  for (int h = 1; h < block; h *= 2) {
    __syncthreads();
    for (int e = threadIdx.x; e < kWriteVectors * (hd / 2); e += kWriteThreads) {
      const int w = e / (hd / 2), pair = e % (hd / 2);
      float* y = shared + w * row + (pair / h) * 2 * h + pair % h;
      const float a = y[0], c = y[h];
      y[0] = a + c;
      y[h] = a - c;
    }
  }
  __syncthreads();
  const float norm = 1.0f / sqrtf(static_cast<float>(block));
  for (int e = threadIdx.x; e < kWriteVectors * hd; e += kWriteThreads) {
    shared[e / hd * row + e % hd] *= norm;
  }
  __syncthreads();
  const KvFormat f = p.cache.format;
  const int part = kv::GroupSize(hd), parts = kv::Groups(hd);
  for (int item = threadIdx.x; item < kWriteVectors * parts; item += kWriteThreads) {
    const int w = item % kWriteVectors, g = item / kWriteVectors;
    const int64_t i = base + w;
    if (i >= n) continue;
    const bool keys = i % 2 == 0;
    const int64_t r = i / 2 / p.kv_heads;
    const int32_t pos = p.positions[r];
    const int64_t page =
        p.table.pages[static_cast<int64_t>(p.slots[r]) * p.table.max_pages + pos / kPage];
    const int64_t vector = (page * kPage + pos % kPage) * p.kv_heads + (i / 2) % p.kv_heads;
    const int bits = keys ? KvKeyBits(f) : KvValueBits(f);
    uint8_t* codes = static_cast<uint8_t*>(keys ? p.cache.keys : p.cache.values) +
                     vector * kv::CodeBytes(bits, hd) + g * part * bits / 8;
    float* step_min = (keys ? p.cache.key_scales : p.cache.value_scales) +
                      2 * (static_cast<int64_t>(parts) * vector + g);
    kv::Quantize(shared + w * row + g * part, part, bits, codes, step_min);
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
