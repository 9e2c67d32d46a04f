// Matmul and Embed over weights in ggml's blocks (Format::kGgml): Q8_0, Q4_0, Q4_K and Q6_K read
// as a GGUF file holds them. Each weight value is decoded where it is read, exactly as
// formats/ggml_blocks.cc decodes it (this file is compiled with -fmad=false, so that d * q - m
// rounds its product and its difference apart, as there); the sums are float32 in another order
// than the CPU's.
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/kernels.cuh"
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

template <>
__device__ __forceinline__ float Value<GgmlType::kQ4_K>(const uint8_t* row, int64_t e) {
  const uint8_t* b = row + (e / 256) * 144;
  const int g = static_cast<int>(e % 256) / 32, l = static_cast<int>(e % 32);
  const uint8_t* s = b + 4;
  int sc, m;
  if (g < 4) {
    sc = s[g] & 63;
    m = s[g + 4] & 63;
  } else {
    sc = (s[g + 4] & 0xF) | (s[g - 4] >> 6) << 4;
    m = (s[g + 4] >> 4) | (s[g] >> 6) << 4;
  }
  const float dl = Half(b) * static_cast<float>(sc), ml = Half(b + 2) * static_cast<float>(m);
  const int q = (b[16 + 32 * (g / 2) + l] >> (4 * (g % 2))) & 0xF;
  return dl * static_cast<float>(q) - ml;
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
    case GgmlType::kQ6_K:
      return fn.template operator()<GgmlType::kQ6_K>();
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
    case GgmlType::kQ6_K:
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
  ByType(w.ggml_type, [&]<GgmlType kType>() {
    GgmlMatmulKernel<kType>
        <<<grid, kWarps * 32, 0, stream>>>(x, rows, w.cols, static_cast<const uint8_t*>(w.data),
                                           w.rows, RowBytes(w), bias, out, accumulate);
  });
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
