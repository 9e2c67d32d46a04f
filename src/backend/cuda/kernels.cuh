// Launchers of the CUDA backend's kernels. Internal to backend/cuda: each takes the op's params
// (device pointers) and the stream the backend issues its work on.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "ops/backend.h"

// A failed CUDA call inside an op is a broken invariant (bad pointers, a lost device): the ops
// return nothing, so it stops the program with the call and the error.
#define GZ_CUDA_CHECK(expr)                                                         \
  do {                                                                              \
    cudaError_t gz_err_ = (expr);                                                   \
    if (gz_err_ != cudaSuccess) {                                                   \
      std::fprintf(stderr, "%s:%d: CUDA error %s: %s\n", __FILE__, __LINE__, #expr, \
                   cudaGetErrorString(gz_err_));                                    \
      std::abort();                                                                 \
    }                                                                               \
  } while (0)

#define GZ_CUDA_LAUNCHED() GZ_CUDA_CHECK(cudaGetLastError())

namespace gizllm::cuda {

// Scratch device memory that grows to the largest request and is then reused.
class Scratch {
 public:
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() {
    if (data_) cudaFree(data_);
  }
  void* Get(size_t bytes) {
    if (bytes > bytes_) {
      if (data_) GZ_CUDA_CHECK(cudaFree(data_));
      GZ_CUDA_CHECK(cudaMalloc(&data_, bytes));
      bytes_ = bytes;
    }
    return data_;
  }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

void LaunchEmbed(const EmbedParams& p, cudaStream_t stream);
void LaunchRmsNorm(const RmsNormParams& p, cudaStream_t stream);
void LaunchRope(const RopeParams& p, cudaStream_t stream);
void LaunchKvWrite(const KvWriteParams& p, cudaStream_t stream);
void LaunchSwiGlu(const SwiGluParams& p, cudaStream_t stream);
void LaunchAdd(const AddParams& p, cudaStream_t stream);
void LaunchGatherRows(const GatherRowsParams& p, cudaStream_t stream);

// out[rows, n] = x[rows, cols] W^T (+ bias), streaming W once; float32 x, rows <= 8.
void LaunchGemv(const float* x, int64_t rows, const Weight& w, const float* bias, float* out,
                int sm_count, cudaStream_t stream);
// The same product by a tiled float32 kernel (any rows; exact mode and plain non-bf16 weights).
void LaunchGemmF32(const float* x, int64_t rows, const Weight& w, const float* bias, float* out,
                   cudaStream_t stream);
// y[n] = bf16(x[n]).
void LaunchToBf16(const float* x, int64_t n, void* y, cudaStream_t stream);
// out[r, :] += bias for every row.
void LaunchAddBias(float* out, int64_t rows, int64_t n, const float* bias, cudaStream_t stream);

// Paged grouped-query attention: the decode kernel (rows that are alone in their sequence,
// keys split across blocks) and the tile kernel (runs of rows of one sequence).
// Whether the attention kernels cover this shape (head_dim 64, 128 or 256).
bool AttentionSupported(int heads, int kv_heads, int head_dim);
void LaunchAttention(const AttentionParams& p, int sm_count, Scratch* scratch, cudaStream_t stream);

}  // namespace gizllm::cuda
