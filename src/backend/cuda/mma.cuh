// Device helpers of the fp16 tensor-core kernels (attention_mma.cu, encoder_mma.cu): mma.sync
// m16n8k16, ldmatrix, cp.async and fp16 packing.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/kernels.cuh"

namespace gizllm::cuda {

inline constexpr float kLog2e = 1.4426950408889634f;

// Fragment layouts of mma.sync.m16n8k16 .f16 (PTX ISA, "Matrix Fragments for mma.m16n8k16
// with floating point type"). Lane l of the warp: g = l / 4 (groupID), t = l % 4
// (threadID_in_group). Each 32-bit register holds two fp16, the lower index in the low half.
//   A (16 x 16, row-major), 4 registers: a[0] = A[g][2t, 2t+1], a[1] = A[g+8][2t, 2t+1],
//     a[2] = A[g][2t+8, 2t+9], a[3] = A[g+8][2t+8, 2t+9].
//   B (16 x 8, "col": indexed B[k][n]), 2 registers: b[0] = B[2t, 2t+1][g],
//     b[1] = B[2t+8, 2t+9][g].
//   C/D (16 x 8 float32), 4 registers: c[0], c[1] = C[g][2t, 2t+1], c[2], c[3] =
//     C[g+8][2t, 2t+1].
// So the C fragments of two neighbouring n8 tiles (keys 0..7 and 8..15 of S) are, packed to
// fp16, the A fragment of the k16 step over those 16 keys in P V: no shuffle between them.
__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8 x 8 fp16 matrices from shared memory, transposed: lanes 8i..8i+7 give the addresses
// of the 8 rows (16 bytes each) of matrix i, and register i of lane l receives elements
// [row 2t, 2t+1][column g] of matrix i. With rows = keys and columns = dimensions of V, that is
// the B fragment half b[0] (keys 0..7 of the matrix) for output dimension g.
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const __half* row) {
  uint32_t at = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(at)
               : "memory");
}

// Four 8 x 8 fp16 matrices, not transposed: register i of lane l receives elements
// [row g][columns 2t, 2t+1] of matrix i. With rows = keys and columns = dimensions of K, that is
// the B fragment half of S = Q K^T for key g.
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const __half* row) {
  uint32_t at = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(at)
               : "memory");
}

// 16 bytes global -> shared without registers; visible to this thread after CpAsyncWait.
__device__ __forceinline__ void CpAsync16(void* dst, const void* src) {
  uint32_t at = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(at), "l"(src) : "memory");
}
// The same with src_bytes of 16 or 0 (0: nothing is read, the 16 bytes are zeroed).
__device__ __forceinline__ void CpAsync16Fill(void* dst, const void* src, int src_bytes) {
  uint32_t at = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(at), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}
// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Two values rounded to fp16 (PackHalfSat). fp16 rather than bf16 for its 3 more bits of
// mantissa: bf16 scores of sharp attention (tens in size) lose about 2^-9 of themselves, which
// took the golden qwen2 model's fast-mode logits past their 2% bound. Its range holds the
// queries, keys and values of the supported models; a value past it becomes the largest finite
// fp16.
__device__ __forceinline__ uint32_t PackHalf(float lo, float hi) { return PackHalfSat(lo, hi); }

// The same for values known to be in range (probabilities in [0, 1]).
__device__ __forceinline__ uint32_t PackHalfInRange(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

}  // namespace gizllm::cuda
