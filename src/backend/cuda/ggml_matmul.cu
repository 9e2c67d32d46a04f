// Matmul and Embed over weights in ggml's blocks (Format::kGgml): Q8_0, Q4_0, Q4_K, Q5_K, Q6_K,
// IQ4_XS and Q1_0 read as a GGUF file holds them. Each weight value is decoded where it is read,
// exactly as formats/ggml_blocks.cc decodes it (this file is compiled with -fmad=false, so that
// d * q - m rounds its product and its difference apart, as there); the sums are float32 in
// another order than the CPU's (Q1_0's matmul multiplies d by a sum of signed activations).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/kernels.cuh"
#include "formats/ggml_blocks.h"
#include "formats/gguf.h"

namespace gizllm::cuda {
namespace {

__device__ __forceinline__ float Half(const uint8_t* p) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(p[0] | (p[1] << 8))));
}

// Element e of a row whose blocks start at `row`, one function a block type (the layouts of
// formats/ggml_blocks.h).
template <GgmlType kType>
__device__ __forceinline__ float Value(const uint8_t* row, int64_t e);

template <>
__device__ __forceinline__ float Value<GgmlType::kQ8_0>(const uint8_t* row, int64_t e) {
  const uint8_t* b = row + (e / 32) * 34;
  return static_cast<float>(static_cast<int8_t>(b[2 + e % 32])) * Half(b);
}

template <>
__device__ __forceinline__ float Value<GgmlType::kQ4_0>(const uint8_t* row, int64_t e) {
  const uint8_t* b = row + (e / 32) * 18;
  const int j = static_cast<int>(e % 32);
  const int nibble = j < 16 ? b[2 + j] & 0xF : b[2 + j - 16] >> 4;
  return static_cast<float>(nibble - 8) * Half(b);
}

// The 6-bit scale and min of group g (of 8) in Q4_K's and Q5_K's 12 scale bytes `s`.
__device__ __forceinline__ void ScaleMin(const uint8_t* s, int g, int* sc, int* m) {
  if (g < 4) {
    *sc = s[g] & 63;
    *m = s[g + 4] & 63;
  } else {
    *sc = (s[g + 4] & 0xF) | (s[g - 4] >> 6) << 4;
    *m = (s[g + 4] >> 4) | (s[g] >> 6) << 4;
  }
}

// Q4_K (kFifthBits false) and Q5_K: group g's codes are the low (g even) or high nibbles of
// qs[32 (g / 2) ...]; Q5_K's fifth bits are bit g of qh[l] (qh at byte 16, qs after it at 48).
template <bool kFifthBits>
__device__ __forceinline__ float KValue(const uint8_t* row, int64_t e) {
  constexpr int kBlockBytes = kFifthBits ? 176 : 144, kCodes = kFifthBits ? 48 : 16;
  const uint8_t* b = row + (e / 256) * kBlockBytes;
  const int g = static_cast<int>(e % 256) / 32, l = static_cast<int>(e % 32);
  int sc, m;
  ScaleMin(b + 4, g, &sc, &m);
  const float dl = Half(b) * static_cast<float>(sc), ml = Half(b + 2) * static_cast<float>(m);
  int q = (b[kCodes + 32 * (g / 2) + l] >> (4 * (g % 2))) & 0xF;
  if constexpr (kFifthBits) q |= ((b[16 + l] >> g) & 1) << 4;
  return dl * static_cast<float>(q) - ml;
}

template <>
__device__ __forceinline__ float Value<GgmlType::kQ4_K>(const uint8_t* row, int64_t e) {
  return KValue<false>(row, e);
}

template <>
__device__ __forceinline__ float Value<GgmlType::kQ5_K>(const uint8_t* row, int64_t e) {
  return KValue<true>(row, e);
}

template <>
__device__ __forceinline__ float Value<GgmlType::kQ6_K>(const uint8_t* row, int64_t e) {
  const uint8_t* b = row + (e / 256) * 210;
  const int i = static_cast<int>(e % 256);
  const int h = i / 128, k = (i / 32) % 4, l = i % 32;
  const int low = (b[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0xF;
  const int high = (b[128 + 32 * h + l] >> (2 * k)) & 3;
  const float scale = static_cast<float>(static_cast<int8_t>(b[192 + i / 16]));
  return Half(b + 208) * scale * static_cast<float>((low | high << 4) - 32);
}

// IQ4_NL's and IQ4_XS's 16 code values in constant memory: formats/ggml_blocks.h's
// kIq4NlValues, which device code cannot index.
struct Iq4Values {
  int8_t v[16];
};
constexpr Iq4Values CopyIq4Values() {
  Iq4Values t{};
  for (int i = 0; i < 16; ++i) t.v[i] = kIq4NlValues[i];
  return t;
}
__constant__ Iq4Values kIq4Values = CopyIq4Values();

// Group g (of 8): 6-bit scale from nibble g % 2 of scales_l[g / 2] and bits 2g of scales_h,
// minus 32; codes qs[16 g ...], low nibbles the first 16.
template <>
__device__ __forceinline__ float Value<GgmlType::kIQ4_XS>(const uint8_t* row, int64_t e) {
  const uint8_t* b = row + (e / 256) * 136;
  const int g = static_cast<int>(e % 256) / 32, j = static_cast<int>(e % 32);
  const int scales_h = b[2] | b[3] << 8;
  const int ls = ((b[4 + g / 2] >> (4 * (g % 2))) & 0xF) | ((scales_h >> (2 * g)) & 3) << 4;
  const float dl = Half(b) * static_cast<float>(ls - 32);
  const int code = j < 16 ? b[8 + 16 * g + j] & 0xF : b[8 + 16 * g + j - 16] >> 4;
  return dl * static_cast<float>(kIq4Values.v[code]);
}

// Element j of a block of 128 is bit j % 8 of qs[j / 8]: set is d, clear -d.
template <>
__device__ __forceinline__ float Value<GgmlType::kQ1_0>(const uint8_t* row, int64_t e) {
  const uint8_t* b = row + (e / 128) * 18;
  const int j = static_cast<int>(e % 128);
  const float d = Half(b);
  return (b[2 + j / 8] >> (j % 8)) & 1 ? d : -d;
}

// Activation rows a warp multiplies with its weight row at once.
constexpr int kWarpRows = 8;
constexpr int kWarps = 4;  // a block's warps, one weight row each

// One warp a weight row n (blockIdx.x, warp) and kWarpRows activation rows (blockIdx.y): each
// lane decodes every 32nd value of the row once and multiplies it with each activation row.
template <GgmlType kType>
__global__ void GgmlMatmulKernel(const float* x,  // [rows, cols]
                                 int64_t rows, int64_t cols,
                                 const uint8_t* w,  // [n, row_bytes]
                                 int64_t n, int64_t row_bytes,
                                 const float* bias,  // [n] or null
                                 float* out,         // [rows, n]
                                 bool accumulate) {
  const int lane = threadIdx.x % 32;
  const int64_t wrow = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (wrow >= n) return;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kWarpRows;
  const int count = rows - r0 < kWarpRows ? static_cast<int>(rows - r0) : kWarpRows;
  const uint8_t* row = w + wrow * row_bytes;
  float acc[kWarpRows] = {};
  for (int64_t e = lane; e < cols; e += 32) {
    const float v = Value<kType>(row, e);
#pragma unroll
    for (int k = 0; k < kWarpRows; ++k) {
      if (k < count) acc[k] += v * x[(r0 + k) * cols + e];
    }
  }
#pragma unroll
  for (int k = 0; k < kWarpRows; ++k) {
    for (int o = 16; o > 0; o /= 2) acc[k] += __shfl_xor_sync(0xffffffffu, acc[k], o);
  }
  if (lane != 0) return;
  const float b = bias ? bias[wrow] : 0.0f;
  for (int k = 0; k < count; ++k) {
    float* y = out + (r0 + k) * n + wrow;
    *y = accumulate ? *y + (acc[k] + b) : acc[k] + b;
  }
}

// Decode kernels (up to kFastRows activation rows) for Q8_0, Q4_0, Q4_K and Q6_K: a warp takes a
// weight row, and its lanes split each block (or pair of blocks) so that one warp load brings a
// block's codes in whole words, every lane decoding its 4 to 16 codes with the group's scale
// worked out once; the values are formats/ggml_blocks.cc's (the same operations, unfused), each
// multiplied into every activation row's sum (fused multiply-adds: another order of the same
// products). The activations come through the L1 cache as float4s (16-byte aligned rows).
constexpr int kFastRows = 8;
constexpr int kFastWarps = 4;  // a block's warps, one weight row each

__device__ __forceinline__ uint32_t Word16(const uint8_t* p) {  // 2-byte aligned
  const auto* h = reinterpret_cast<const uint16_t*>(p);
  return h[0] | static_cast<uint32_t>(h[1]) << 16;
}

__device__ __forceinline__ float4 X4(const float* x) {
  return __ldg(reinterpret_cast<const float4*>(x));
}

// acc[r] += sum_t v[t] * x[r * stride + t], t < 4, for the rows r < count.
template <int kRows>
__device__ __forceinline__ void Dot4(const float v[4], const float* x, int64_t stride, int count,
                                     float* acc) {
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (r >= count) break;
    const float4 a = X4(x + r * stride);
    float s = acc[r];
    s = __fmaf_rn(v[0], a.x, s);
    s = __fmaf_rn(v[1], a.y, s);
    s = __fmaf_rn(v[2], a.z, s);
    s = __fmaf_rn(v[3], a.w, s);
    acc[r] = s;
  }
}

// One block type's share of a warp step: Load reads a lane's words of block b (all of a step's
// loads are issued before any is used, kUnroll steps at a time, so that a warp keeps a whole
// row of 4,096 inputs in flight, or half of one: the kernels are bound by the rounds of loads a
// warp waits for, not by the bytes), Decode turns them into values, put(v, o) taking the four
// values v of the block's elements o .. o + 3. kStep blocks a warp step, the lane's first block
// First(lane).
template <GgmlType kType>
struct FastBlocks;

// Q8_0: 4 lanes a block, 8 codes a lane.
template <>
struct FastBlocks<GgmlType::kQ8_0> {
  static constexpr int kStep = 8, kUnroll = 8, kElements = 32, kBytes = 34;
  struct Raw {
    float d;
    uint32_t q[2];
  };
  static __device__ __forceinline__ int First(int lane) { return lane / 4; }
  static __device__ __forceinline__ Raw Load(const uint8_t* blk, int lane) {
    const uint8_t* q = blk + 2 + 8 * (lane % 4);
    return {Half(blk), {Word16(q), Word16(q + 4)}};
  }
  template <class Put>
  static __device__ __forceinline__ void Decode(const Raw& r, int lane, Put&& put) {
#pragma unroll
    for (int w = 0; w < 2; ++w) {
      float v[4];
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        v[t] = static_cast<float>(static_cast<int8_t>(r.q[w] >> (8 * t))) * r.d;
      }
      put(v, 8 * (lane % 4) + 4 * w);
    }
  }
};

// Q4_0: 4 lanes a block, 4 bytes (8 codes) a lane.
template <>
struct FastBlocks<GgmlType::kQ4_0> {
  static constexpr int kStep = 8, kUnroll = 16, kElements = 32, kBytes = 18;
  struct Raw {
    float d;
    uint32_t q;
  };
  static __device__ __forceinline__ int First(int lane) { return lane / 4; }
  static __device__ __forceinline__ Raw Load(const uint8_t* blk, int lane) {
    return {Half(blk), Word16(blk + 2 + 4 * (lane % 4))};
  }
  template <class Put>
  static __device__ __forceinline__ void Decode(const Raw& r, int lane, Put&& put) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float v[4];
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        v[t] = static_cast<float>(static_cast<int>((r.q >> (8 * t + 4 * half)) & 0xF) - 8) * r.d;
      }
      put(v, 16 * half + 4 * (lane % 4));
    }
  }
};

// Q4_K: 8 lanes a block (four blocks a warp step), each lane one 16-byte word of the codes and the
// block's 16-byte head (d, dmin and the 12 scale bytes; the 8 lanes' loads of it are one read):
// lane 8 s + j takes bytes 16 j .. 16 j + 15 of the codes, elements 16 h .. 16 h + 15 (h = j % 2)
// of group 2 p (the low nibbles) and of group 2 p + 1 (the high ones), p = j / 2.
template <>
struct FastBlocks<GgmlType::kQ4_K> {
  static constexpr int kStep = 4, kUnroll = 4, kElements = 256, kBytes = 144;
  struct Raw {
    uint4 head, q;
  };
  static __device__ __forceinline__ int First(int lane) { return lane / 8; }
  static __device__ __forceinline__ Raw Load(const uint8_t* blk, int lane) {
    const auto* w = reinterpret_cast<const uint4*>(blk);  // 16-byte aligned
    return {__ldg(w), __ldg(w + 1 + lane % 8)};
  }
  // Byte i of the scales, kept in registers (a runtime index into an array would not be).
  static __device__ __forceinline__ int ScaleByte(const Raw& r, int i) {
    const uint32_t word = i < 4 ? r.head.y : i < 8 ? r.head.z : r.head.w;
    return (word >> (8 * (i % 4))) & 0xFF;
  }
  template <class Put>
  static __device__ __forceinline__ void Decode(const Raw& r, int lane, Put&& put) {
    const int j = lane % 8, p = j / 2, h = j % 2;
    const float d = __half2float(__ushort_as_half(static_cast<unsigned short>(r.head.x & 0xFFFF)));
    const float dmin = __half2float(__ushort_as_half(static_cast<unsigned short>(r.head.x >> 16)));
    const uint32_t q[4] = {r.q.x, r.q.y, r.q.z, r.q.w};
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      // ScaleMin's bits, from the bytes in registers.
      const int g = 2 * p + half;
      int sc, m;
      if (g < 4) {
        sc = ScaleByte(r, g) & 63;
        m = ScaleByte(r, g + 4) & 63;
      } else {
        sc = (ScaleByte(r, g + 4) & 0xF) | (ScaleByte(r, g - 4) >> 6) << 4;
        m = (ScaleByte(r, g + 4) >> 4) | (ScaleByte(r, g) >> 6) << 4;
      }
      const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(m);
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        float v[4];
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          v[t] = dl * static_cast<float>((q[w] >> (8 * t + 4 * half)) & 0xF) - ml;
        }
        put(v, 64 * p + 32 * half + 16 * h + 4 * w);
      }
    }
  }
};

// Two blocks a warp step: lane = 16 s + 8 h + j takes half h of block 2 i + s at positions
// l = 4j..4j + 3 of its four groups of 32 (k = 0..3: element 128 h + 32 k + l).
template <>
struct FastBlocks<GgmlType::kQ6_K> {
  static constexpr int kStep = 2, kUnroll = 8, kElements = 256, kBytes = 210;
  struct Raw {
    uint32_t ql0, ql1, qh, scales;
    float d;
  };
  static __device__ __forceinline__ int First(int lane) { return lane / 16; }
  static __device__ __forceinline__ Raw Load(const uint8_t* blk, int lane) {
    const int h = (lane / 8) % 2, j = lane % 8;
    Raw r;
    r.ql0 = Word16(blk + 64 * h + 4 * j);
    r.ql1 = Word16(blk + 64 * h + 32 + 4 * j);
    r.qh = Word16(blk + 128 + 32 * h + 4 * j);
    // The scales of groups k = 0..3 at these positions: bytes 192 + 8 h + 2 k + j / 4.
    const uint8_t* sc = blk + 192 + 8 * h + j / 4;
    r.scales = sc[0] | sc[2] << 8 | sc[4] << 16 | static_cast<uint32_t>(sc[6]) << 24;
    r.d = Half(blk + 208);
    return r;
  }
  template <class Put>
  static __device__ __forceinline__ void Decode(const Raw& r, int lane, Put&& put) {
    const int h = (lane / 8) % 2, j = lane % 8;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float ds = r.d * static_cast<float>(static_cast<int8_t>(r.scales >> (8 * k)));
      const uint32_t ql = k % 2 ? r.ql1 : r.ql0;
      float v[4];
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        const int low = (ql >> (8 * t + 4 * (k / 2))) & 0xF;
        const int high = (r.qh >> (8 * t + 2 * k)) & 3;
        v[t] = ds * static_cast<float>((low | high << 4) - 32);
      }
      put(v, 128 * h + 32 * k + 4 * j);
    }
  }
};

// Q1_0: a block (128 elements) a warp step, lane 8 c + t taking elements 32 c + 4 t .. + 3, the
// bits 4 t .. 4 t + 3 of the chunk's sign word (set: d, clear: -d). (Four blocks a warp step,
// lanes of 16 elements, measured 12% slower at batch 1 on the H200: bench/RESULTS.md.)
template <>
struct FastBlocks<GgmlType::kQ1_0> {
  static constexpr int kStep = 1, kUnroll = 4, kElements = 128, kBytes = 18;
  struct Raw {
    float d;
    uint32_t signs;
  };
  static __device__ __forceinline__ int First(int) { return 0; }
  static __device__ __forceinline__ Raw Load(const uint8_t* blk, int lane) {
    return {Half(blk), Word16(blk + 2 + 4 * (lane / 8))};
  }
  template <class Put>
  static __device__ __forceinline__ void Decode(const Raw& r, int lane, Put&& put) {
    const int c = lane / 8, t = lane % 8;
    float v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = (r.signs >> (4 * t + k)) & 1 ? r.d : -r.d;
    put(v, 32 * c + 4 * t);
  }
};

// A warp's walk over one weight row of `cols` values: the loads of kUnroll warp steps issued
// before any is used, then each lane's values v (4 at a time) handed to put(v, e), e the index of
// v[0] in the row.
template <GgmlType kType, class Put>
__device__ __forceinline__ void WalkRow(const uint8_t* row, int64_t cols, int lane, Put&& put) {
  using B = FastBlocks<kType>;
  const int64_t blocks = cols / B::kElements;
  for (int64_t b0 = B::First(lane); b0 < blocks; b0 += B::kStep * B::kUnroll) {
    typename B::Raw raw[B::kUnroll];
#pragma unroll
    for (int u = 0; u < B::kUnroll; ++u) {
      const int64_t b = b0 + u * B::kStep;
      if (b < blocks) raw[u] = B::Load(row + b * B::kBytes, lane);
    }
#pragma unroll
    for (int u = 0; u < B::kUnroll; ++u) {
      const int64_t b = b0 + u * B::kStep;
      if (b >= blocks) continue;
      B::Decode(raw[u], lane, [&](const float v[4], int o) { put(v, b * B::kElements + o); });
    }
  }
}

template <GgmlType kType, int kRows>
__device__ __forceinline__ void FastRow(const uint8_t* row, int64_t cols, const float* x,
                                        int64_t stride, int count, int lane, float* acc) {
  WalkRow<kType>(row, cols, lane,
                 [&](const float v[4], int64_t e) { Dot4<kRows>(v, x + e, stride, count, acc); });
}

// Weight row kFastWarps * blockIdx.y + warp against the activation rows [kRows * blockIdx.x, +
// kRows): the row blocks that share weight rows run one after another, so a weight row comes from
// the device's memory once and from L2 for the other activation rows.
template <GgmlType kType, int kRows>
__global__ void __launch_bounds__(kFastWarps * 32)
    GgmlFastKernel(const float* x, int64_t rows, int64_t cols, const uint8_t* w, int64_t n,
                   int64_t row_bytes, const float* bias, float* out, bool accumulate) {
  const int lane = threadIdx.x % 32;
  const int64_t wrow = static_cast<int64_t>(blockIdx.y) * kFastWarps + threadIdx.x / 32;
  if (wrow >= n) return;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const int count = rows - r0 < kRows ? static_cast<int>(rows - r0) : kRows;
  float acc[kRows] = {};
  FastRow<kType, kRows>(w + wrow * row_bytes, cols, x + r0 * cols, cols, count, lane, acc);
#pragma unroll
  for (int k = 0; k < kRows; ++k) {
    for (int o = 16; o > 0; o /= 2) acc[k] += __shfl_xor_sync(0xffffffffu, acc[k], o);
  }
  if (lane != 0) return;
  const float b = bias ? bias[wrow] : 0.0f;
  for (int k = 0; k < count; ++k) {
    float* y = out + (r0 + k) * n + wrow;
    *y = accumulate ? *y + (acc[k] + b) : acc[k] + b;
  }
}

// W as bf16 [n, cols], a warp a row (the values of FastBlocks, rounded to bf16), for the many-row
// path through cuBLASLt.
template <GgmlType kType>
__global__ void __launch_bounds__(kFastWarps * 32)
    GgmlDequantBf16Kernel(const uint8_t* w, int64_t n, int64_t cols, int64_t row_bytes,
                          __nv_bfloat16* out) {
  const int lane = threadIdx.x % 32;
  const int64_t wrow = static_cast<int64_t>(blockIdx.x) * kFastWarps + threadIdx.x / 32;
  if (wrow >= n) return;
  __nv_bfloat16* y = out + wrow * cols;
  WalkRow<kType>(w + wrow * row_bytes, cols, lane, [&](const float v[4], int64_t e) {
    auto* pair = reinterpret_cast<__nv_bfloat162*>(y + e);  // 8-byte aligned
    pair[0] = __floats2bfloat162_rn(v[0], v[1]);
    pair[1] = __floats2bfloat162_rn(v[2], v[3]);
  });
}

// Q1_0 weights are 1.125 bits a weight, so the float32 activations, not the weights, are most
// of what a warp reads: a block's warps share a tile of them in shared memory, and each warp
// multiplies kQ1WarpRows weight rows with every activation it reads there. A lane takes 32
// inputs at a time (a quarter of a block: its scale and 32 signs, the warp's loads 8 whole
// blocks in a row, 144 bytes), flips the signs of the 32 activations by the bits and multiplies
// their sum by d: d * sum(+-x), the same products as sum(+-d * x), rounded in another order.
constexpr int kQ1Warps = 8;     // a block's warps
constexpr int kQ1WarpRows = 4;  // weight rows a warp
// Chunks of 32 inputs a tile holds over all its activation rows, each padded to 36 floats so
// that 8 lanes' float4 reads of 8 chunks fall in different banks.
constexpr int kQ1TileChunks = 256;
constexpr int kQ1Padded = 36;

// +x where bit e of signs is set, -x where it is clear (the sign bit flipped by ~signs).
__device__ __forceinline__ float Signed(float x, uint32_t not_signs, int e) {
  return __int_as_float(__float_as_int(x) ^ ((not_signs << (31 - e)) & 0x80000000u));
}

// Weight rows [n0, n0 + kQ1Warps * kQ1WarpRows) (blockIdx.x, a warp's rows in turn) times
// activation rows [r0, r0 + kXRows) (blockIdx.y); used for batches of more than kFastRows rows
// (the decode kernels take fewer).
template <int kXRows>
__global__ void __launch_bounds__(kQ1Warps * 32)
    Q1MatmulKernel(const float* x,  // [rows, cols]
                   int64_t rows, int64_t cols,
                   const uint8_t* w,  // [n, cols / 128, 18]
                   int64_t n,
                   const float* bias,  // [n] or null
                   float* out,         // [rows, n]
                   bool accumulate) {
  constexpr int kChunks = kQ1TileChunks / kXRows;  // chunks of 32 inputs a tile holds
  constexpr int kLaneChunks = kChunks / 32;        // of them a lane's
  __shared__ __align__(16) float xs[kXRows * kChunks * kQ1Padded];  // [kXRows, kChunks, 36]
  const int lane = threadIdx.x % 32;
  const int64_t n0 = (static_cast<int64_t>(blockIdx.x) * kQ1Warps + threadIdx.x / 32) * kQ1WarpRows;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kXRows;
  const int count = rows - r0 < kXRows ? static_cast<int>(rows - r0) : kXRows;
  const int64_t row_bytes = cols / 128 * 18, chunks = cols / 32;
  float acc[kQ1WarpRows][kXRows] = {};
  for (int64_t c0 = 0; c0 < chunks; c0 += kChunks) {
    const int tile = chunks - c0 < kChunks ? static_cast<int>(chunks - c0) : kChunks;
    // The tile's scales and signs first, so that their loads overlap the activations' copy.
    float d[kLaneChunks][kQ1WarpRows];
    uint32_t not_signs[kLaneChunks][kQ1WarpRows];
#pragma unroll
    for (int k = 0; k < kLaneChunks; ++k) {
      const int64_t chunk = c0 + 32 * k + lane;
#pragma unroll
      for (int j = 0; j < kQ1WarpRows; ++j) {
        d[k][j] = 0.0f;
        not_signs[k][j] = 0;
        if (32 * k + lane < tile && n0 + j < n) {
          const auto* h = reinterpret_cast<const uint16_t*>(w + (n0 + j) * row_bytes +
                                                            chunk / 4 * 18);  // 2-byte aligned
          d[k][j] = __half2float(__ushort_as_half(h[0]));
          not_signs[k][j] =
              ~(h[1 + 2 * (chunk % 4)] | static_cast<uint32_t>(h[2 + 2 * (chunk % 4)]) << 16);
        }
      }
    }
    __syncthreads();  // every warp is done with the last tile
    for (int i = threadIdx.x; i < kXRows * tile * 32; i += blockDim.x) {
      const int r = i / (tile * 32), e = i % (tile * 32);
      xs[(r * kChunks + e / 32) * kQ1Padded + e % 32] =
          r < count ? x[(r0 + r) * cols + c0 * 32 + e] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kLaneChunks; ++k) {
      if (32 * k + lane >= tile) break;
#pragma unroll
      for (int r = 0; r < kXRows; ++r) {
        if (r >= count) break;
        const float4* v4 =
            reinterpret_cast<const float4*>(xs + (r * kChunks + 32 * k + lane) * kQ1Padded);
        float sum[kQ1WarpRows] = {};
#pragma unroll
        for (int q = 0; q < 8; ++q) {
          const float4 v = v4[q];
#pragma unroll
          for (int j = 0; j < kQ1WarpRows; ++j) {
            sum[j] += Signed(v.x, not_signs[k][j], 4 * q);
            sum[j] += Signed(v.y, not_signs[k][j], 4 * q + 1);
            sum[j] += Signed(v.z, not_signs[k][j], 4 * q + 2);
            sum[j] += Signed(v.w, not_signs[k][j], 4 * q + 3);
          }
        }
#pragma unroll
        for (int j = 0; j < kQ1WarpRows; ++j) acc[j][r] += d[k][j] * sum[j];
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kQ1WarpRows; ++j) {
#pragma unroll
    for (int r = 0; r < kXRows; ++r) {
      for (int o = 16; o > 0; o /= 2) acc[j][r] += __shfl_xor_sync(0xffffffffu, acc[j][r], o);
    }
  }
  if (lane != 0) return;
#pragma unroll
  for (int j = 0; j < kQ1WarpRows; ++j) {
    if (n0 + j >= n) break;
    const float b = bias ? bias[n0 + j] : 0.0f;
#pragma unroll
    for (int r = 0; r < kXRows; ++r) {
      if (r >= count) break;
      float* y = out + (r0 + r) * n + n0 + j;
      *y = accumulate ? *y + (acc[j][r] + b) : acc[j][r] + b;
    }
  }
}

// out[r, :] = row tokens[r] of the table * scale.
template <GgmlType kType>
__global__ void GgmlEmbedKernel(float* out,             // [rows, dim]
                                const uint8_t* table,   // [vocab, row_bytes]
                                const int32_t* tokens,  // [rows]
                                int64_t dim, int64_t row_bytes, float scale) {
  const int64_t r = blockIdx.x;
  const uint8_t* row = table + static_cast<int64_t>(tokens[r]) * row_bytes;
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
    const float v = Value<kType>(row, c);
    out[r * dim + c] = scale != 1.0f ? v * scale : v;
  }
}

int64_t RowBytes(const Weight& w) {
  GgmlBlock block;
  GgmlBlockOf(static_cast<GgmlType>(w.ggml_type), &block);
  return w.cols / block.elements * block.bytes;
}

// Calls fn.template operator()<kType>() for w's block type.
template <typename Fn>
void ByType(uint32_t ggml_type, Fn&& fn) {
  switch (static_cast<GgmlType>(ggml_type)) {
    case GgmlType::kQ8_0:
      return fn.template operator()<GgmlType::kQ8_0>();
    case GgmlType::kQ4_0:
      return fn.template operator()<GgmlType::kQ4_0>();
    case GgmlType::kQ4_K:
      return fn.template operator()<GgmlType::kQ4_K>();
    case GgmlType::kQ5_K:
      return fn.template operator()<GgmlType::kQ5_K>();
    case GgmlType::kQ6_K:
      return fn.template operator()<GgmlType::kQ6_K>();
    case GgmlType::kIQ4_XS:
      return fn.template operator()<GgmlType::kIQ4_XS>();
    case GgmlType::kQ1_0:
      return fn.template operator()<GgmlType::kQ1_0>();
    default:
      std::fprintf(stderr, "cuda: ggml block type %u has no kernel\n", ggml_type);
      std::abort();
  }
}

}  // namespace

bool GgmlReads(uint32_t ggml_type) {
  switch (static_cast<GgmlType>(ggml_type)) {
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
    case GgmlType::kIQ4_XS:
    case GgmlType::kQ1_0:
      return true;
    default:
      return false;
  }
}

bool HasGgml(const MatmulParams& p) {
  for (int i = 0; i < p.outputs; ++i) {
    if (p.w[i] && p.w[i]->format == Format::kGgml) return true;
  }
  return false;
}

void LaunchGgmlMatmul(const float* x, int64_t rows, const Weight& w, const float* bias, float* out,
                      bool accumulate, cudaStream_t stream) {
  if (rows == 0) return;
  const dim3 grid(static_cast<unsigned>((w.rows + kWarps - 1) / kWarps),
                  static_cast<unsigned>((rows + kWarpRows - 1) / kWarpRows));
  const bool q1_fast = static_cast<GgmlType>(w.ggml_type) == GgmlType::kQ1_0 && rows <= kFastRows;
  if (static_cast<GgmlType>(w.ggml_type) == GgmlType::kQ1_0 && !q1_fast) {
    // Batches past the decode kernels' rows: tiles of 8 activation rows a block.
    const auto* blocks = static_cast<const uint8_t*>(w.data);
    const unsigned row_blocks =
        static_cast<unsigned>((w.rows + kQ1Warps * kQ1WarpRows - 1) / (kQ1Warps * kQ1WarpRows));
    Q1MatmulKernel<8>
        <<<dim3(row_blocks, static_cast<unsigned>((rows + 7) / 8)), kQ1Warps * 32, 0, stream>>>(
            x, rows, w.cols, blocks, w.rows, bias, out, accumulate);
    GZ_CUDA_LAUNCHED();
    return;
  }
  const GgmlType type = static_cast<GgmlType>(w.ggml_type);
  const bool fast = (type == GgmlType::kQ8_0 || type == GgmlType::kQ4_0 ||
                     type == GgmlType::kQ4_K || type == GgmlType::kQ6_K || q1_fast) &&
                    reinterpret_cast<uintptr_t>(x) % 16 == 0 && w.cols % 4 == 0 &&
                    reinterpret_cast<uintptr_t>(w.data) % (type == GgmlType::kQ4_K ? 16 : 4) == 0 &&
                    w.rows <= int64_t{65535} * kFastWarps;  // the grid's y
  if (fast) {
    const auto* blocks = static_cast<const uint8_t*>(w.data);
    const unsigned weight_blocks = static_cast<unsigned>((w.rows + kFastWarps - 1) / kFastWarps);
    auto launch = [&]<GgmlType kType, int kRows>() {
      GgmlFastKernel<kType, kRows>
          <<<dim3(static_cast<unsigned>((rows + kRows - 1) / kRows), weight_blocks),
             kFastWarps * 32, 0, stream>>>(x, rows, w.cols, blocks, w.rows, RowBytes(w), bias,
                                           out, accumulate);
    };
    auto by_rows = [&]<GgmlType kType>() {
      if (rows == 1) {
        launch.template operator()<kType, 1>();
      } else if (rows <= 4) {
        launch.template operator()<kType, 4>();
      } else {
        launch.template operator()<kType, kFastRows>();
      }
    };
    switch (type) {
      case GgmlType::kQ8_0:
        by_rows.template operator()<GgmlType::kQ8_0>();
        break;
      case GgmlType::kQ4_0:
        by_rows.template operator()<GgmlType::kQ4_0>();
        break;
      case GgmlType::kQ4_K:
        by_rows.template operator()<GgmlType::kQ4_K>();
        break;
      case GgmlType::kQ1_0:
        by_rows.template operator()<GgmlType::kQ1_0>();
        break;
      default:
        by_rows.template operator()<GgmlType::kQ6_K>();
        break;
    }
    GZ_CUDA_LAUNCHED();
    return;
  }
  ByType(w.ggml_type, [&]<GgmlType kType>() {
    GgmlMatmulKernel<kType>
        <<<grid, kWarps * 32, 0, stream>>>(x, rows, w.cols, static_cast<const uint8_t*>(w.data),
                                           w.rows, RowBytes(w), bias, out, accumulate);
  });
  GZ_CUDA_LAUNCHED();
}

bool GgmlDequants(const Weight& w) {
  const GgmlType type = static_cast<GgmlType>(w.ggml_type);
  return (type == GgmlType::kQ8_0 || type == GgmlType::kQ4_0 || type == GgmlType::kQ4_K ||
          type == GgmlType::kQ6_K || type == GgmlType::kQ1_0) &&
         w.cols % 4 == 0 &&
         reinterpret_cast<uintptr_t>(w.data) % (type == GgmlType::kQ4_K ? 16 : 4) == 0;
}

void LaunchGgmlDequantBf16(const Weight& w, void* out, cudaStream_t stream) {
  const auto* blocks = static_cast<const uint8_t*>(w.data);
  const unsigned grid = static_cast<unsigned>((w.rows + kFastWarps - 1) / kFastWarps);
  auto launch = [&]<GgmlType kType>() {
    GgmlDequantBf16Kernel<kType><<<grid, kFastWarps * 32, 0, stream>>>(
        blocks, w.rows, w.cols, RowBytes(w), static_cast<__nv_bfloat16*>(out));
  };
  switch (static_cast<GgmlType>(w.ggml_type)) {
    case GgmlType::kQ8_0:
      launch.template operator()<GgmlType::kQ8_0>();
      break;
    case GgmlType::kQ4_0:
      launch.template operator()<GgmlType::kQ4_0>();
      break;
    case GgmlType::kQ4_K:
      launch.template operator()<GgmlType::kQ4_K>();
      break;
    case GgmlType::kQ6_K:
      launch.template operator()<GgmlType::kQ6_K>();
      break;
    case GgmlType::kQ1_0:
      launch.template operator()<GgmlType::kQ1_0>();
      break;
    default:
      std::fprintf(stderr, "cuda: no bf16 decoder for ggml block type %u\n", w.ggml_type);
      std::abort();
  }
  GZ_CUDA_LAUNCHED();
}

void LaunchGgmlEmbed(const EmbedParams& p, cudaStream_t stream) {
  if (p.rows == 0) return;
  const Weight& t = *p.table;
  ByType(t.ggml_type, [&]<GgmlType kType>() {
    GgmlEmbedKernel<kType><<<static_cast<unsigned>(p.rows), 256, 0, stream>>>(
        p.out, static_cast<const uint8_t*>(t.data), p.tokens, t.cols, RowBytes(t), p.scale);
  });
  GZ_CUDA_LAUNCHED();
}

}  // namespace gizllm::cuda
