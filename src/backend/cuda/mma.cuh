// Device helpers of the tensor-core kernels (attention_mma.cu, encoder_mma.cu; the chunked delta
// rule's tf32 products in recurrent.cu): mma.sync m16n8k16 and m16n8k8 .tf32, ldmatrix and where
// a lane points in it, cp.async, fp16 packing, and a warp's scores and online softmax over a key
// tile for its m16 tile of query rows.
#pragma once

#include <cuda_fp16.h>

#include <cmath>
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

// mma.sync.m16n8k8 .tf32 (the float32 tensor-core product: 10 bits of mantissa in, float32
// sums). Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k8" .tf32), g and t as above:
//   A (16 x 8, row-major): a[0] = A[g][t], a[1] = A[g+8][t], a[2] = A[g][t+4], a[3] = A[g+8][t+4].
//   B (8 x 8, indexed B[k][n]): b[0] = B[t][g], b[1] = B[t+4][g].
//   C/D (16 x 8 float32): as m16n8k16's, c[0], c[1] = C[g][2t, 2t+1],
//     c[2], c[3] = C[g+8][2t, 2t+1].
__device__ __forceinline__ uint32_t Tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ void MmaTf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// c[n] += A B_n over kK (a multiple of 8) for a warp: A [16, kK] and the kTiles B_n [kK, 8]
// float32 in shared memory, element A[r][k] at a[r * a_row + k * a_col] and B_n[k][j] at
// b[k * b_row + (8 n + j) * b_col], rounded to tf32 as they are read; c[n] is B_n's C fragment.
template <int kTiles, int kK>
__device__ __forceinline__ void MmaTf32Rows(float (&c)[kTiles][4], const float* a, int a_row,
                                            int a_col, const float* b, int b_row, int b_col,
                                            int lane) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll 4
  for (int k0 = 0; k0 < kK; k0 += 8) {
    const uint32_t fa[4] = {
        Tf32(a[g * a_row + (k0 + t) * a_col]), Tf32(a[(g + 8) * a_row + (k0 + t) * a_col]),
        Tf32(a[g * a_row + (k0 + t + 4) * a_col]), Tf32(a[(g + 8) * a_row + (k0 + t + 4) * a_col])};
#pragma unroll
    for (int n = 0; n < kTiles; ++n) {
      const float* bn = b + (8 * n + g) * b_col;
      MmaTf32(c[n], fa, Tf32(bn[(k0 + t) * b_row]), Tf32(bn[(k0 + t + 4) * b_row]));
    }
  }
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

// Where a lane points in an x4 ldmatrix over a 16 x 16 block of fp16 in shared memory: lanes
// 8i .. 8i + 7 give the addresses of the 8 rows (16 bytes each) of matrix i = lane / 8, so lane
// l gives row `row` of the block from column `column` on.
struct LdMatrixLane {
  int row;     // 0 .. 15
  int column;  // 0 or 8
};

// Matrix i holds rows 8 (i % 2) .. and columns 8 (i / 2) ..: LdMatrixX4 gives the A fragment of
// the block (register i is a[i]); LdMatrixX4Trans of V [keys, dimensions] gives the B fragments
// of P V over its 16 keys, for dimensions 0..7 (registers 0, 1) and 8..15 (registers 2, 3).
__device__ __forceinline__ LdMatrixLane LdMatrixLaneRowsFirst(int lane) {
  return {(lane / 8 % 2) * 8 + lane % 8, (lane / 16) * 8};
}

// Matrix i holds rows 8 (i / 2) .. and columns 8 (i % 2) ..: LdMatrixX4 of K [keys, dimensions]
// gives the B fragments of Q K^T over 16 dimensions, for keys 0..7 (registers 0, 1) and 8..15
// (registers 2, 3); LdMatrixX4Trans gives the A fragment of the block's transpose.
__device__ __forceinline__ LdMatrixLane LdMatrixLaneColumnsFirst(int lane) {
  return {(lane / 16) * 8 + lane % 8, (lane / 8 % 2) * 8};
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

// S += Q K^T over one k16 step of dimensions: s[n] is the C fragment of keys 8n .. 8n + 7 of a
// tile, q the A fragment of the step's 16 dimensions of a warp's 16 query rows, k the tile's fp16
// keys [keys, stride] from the step's first dimension on, read by one ldmatrix per 16 keys at
// `lane` (LdMatrixLaneColumnsFirst).
template <int kKeyTiles>
__device__ __forceinline__ void AddScores(float (&s)[kKeyTiles][4], const uint32_t (&q)[4],
                                          const __half* k, int stride, LdMatrixLane lane) {
#pragma unroll
  for (int n2 = 0; n2 < kKeyTiles / 2; ++n2) {
    uint32_t b[4];
    LdMatrixX4(b, k + (16 * n2 + lane.row) * stride + lane.column);
    Mma(s[2 * n2], q, b[0], b[1]);
    Mma(s[2 * n2 + 1], q, b[2], b[3]);
  }
}

// The state of a warp's online softmax over an m16 tile of query rows (flash-attention 2: the
// scores and probabilities stay in registers, the probabilities are the A operand of P V as they
// are). A lane holds two rows of the tile, fragment rows g (half 0) and g + 8 (half 1), and
// kOutTiles n8 tiles of their output O over head_dim = 8 kOutTiles.
template <int kOutTiles>
struct OnlineSoftmax {
  float o[kOutTiles][4];  // O fragments: o[n][h * 2 + e] = O[half h][8n + 2t + e]
  float m[2];             // running max (log2 units), one per half
  float l[2];             // running sum of this lane's columns; the quad's sum is RowSum

  // No key seen: m = -inf, l = 0, o = 0.
  __device__ __forceinline__ void Start() {
#pragma unroll
    for (int n = 0; n < kOutTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.0f;
  }

  // Turns s, the C fragments of a tile's scores (log2 units; -inf where masked), into
  // probabilities against the new running max of each row, and rescales l and O to that max. A
  // row's max is shared by its quad; a row that has seen no key yet keeps m = -inf, l = 0, o = 0.
  template <int kKeyTiles>
  __device__ __forceinline__ void Update(float (&s)[kKeyTiles][4]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < kKeyTiles; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[h], mx);
      const float corr = m_new == -INFINITY ? 1.0f : exp2f(m[h] - m_new);
      float sum = 0.0f;
#pragma unroll
      for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float x = m_new == -INFINITY ? 0.0f : exp2f(s[n][2 * h + e] - m_new);
          s[n][2 * h + e] = x;
          sum += x;
        }
      }
      l[h] = l[h] * corr + sum;
      m[h] = m_new;
#pragma unroll
      for (int n = 0; n < kOutTiles; ++n) o[n][2 * h] *= corr, o[n][2 * h + 1] *= corr;
    }
  }

  // O += P V over the tile: P's k16 step kt is p[2kt] (keys 0..7) and p[2kt + 1] (keys 8..15)
  // packed to fp16; V's B fragments for output dimensions 16 d .. 16 d + 15 by one transposed
  // ldmatrix from v, the tile's fp16 values [keys, stride], at `lane`
  // (LdMatrixLaneRowsFirst).
  template <int kKeyTiles>
  __device__ __forceinline__ void AddPv(const float (&p)[kKeyTiles][4], const __half* v, int stride,
                                        LdMatrixLane lane) {
#pragma unroll
    for (int kt = 0; kt < kKeyTiles / 2; ++kt) {
      const uint32_t a[4] = {PackHalfInRange(p[2 * kt][0], p[2 * kt][1]),
                             PackHalfInRange(p[2 * kt][2], p[2 * kt][3]),
                             PackHalfInRange(p[2 * kt + 1][0], p[2 * kt + 1][1]),
                             PackHalfInRange(p[2 * kt + 1][2], p[2 * kt + 1][3])};
#pragma unroll
      for (int d = 0; d < kOutTiles / 2; ++d) {
        uint32_t b[4];
        LdMatrixX4Trans(b, v + (16 * kt + lane.row) * stride + 16 * d + lane.column);
        Mma(o[2 * d], a, b[0], b[1]);
        Mma(o[2 * d + 1], a, b[2], b[3]);
      }
    }
  }

  // The sum of half h's row over its quad (every lane of the warp takes part).
  __device__ __forceinline__ float RowSum(int h) const {
    float sum = l[h];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    return sum;
  }
};

}  // namespace gizllm::cuda
