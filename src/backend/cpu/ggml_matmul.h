// CPU matmul and embedding rows over weights kept in ggml's blocks (Format::kGgml, as a GGUF
// file holds them): Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, IQ4_XS and Q1_0, and gizllm's own GZ8, GZ4 and
// GZ4S (convert --bits b8 / b4).
//
// Each weight row is decoded once into float32 (exactly the values llama.cpp dequantizes,
// formats/ggml_blocks.h) in a per-thread row that stays in L1, then multiplied with every
// activation row (vec Dot, float32 sums); on AVX-512 from 4 activation rows, 4 weight rows at a
// time are decoded into a panel for the float32 panel product (matmul_kernels.h). The weights stay
// in their blocks in memory (1.125 to 8.5 bits a weight instead of 32); the products are those of the
// float32 matmul over the same values, summed in another order.
#pragma once

#include <cstdint>

#include "backend/cpu/cpu_isa.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "ops/backend.h"

namespace gizllm {

// Whether these kernels read block type `ggml_type` (a GgmlType).
bool GgmlMatmulReads(uint32_t ggml_type);

// Checks that a host weight is one these kernels run: kGgml of a type they read, data present,
// rows of whole blocks.
Status CheckGgmlWeight(const Weight& w);

// Whether any output of `p` has a kGgml weight.
bool HasGgmlOutput(const MatmulParams& p);

// Runs the outputs of `p` whose weights are kGgml: out_i = x W_i^T (+ bias_i); the others are
// left to the caller. Each weight must pass CheckGgmlWeight. Runs on `pool` when given.
void GgmlMatmul(const MatmulParams& p, ThreadPool* pool, CpuIsa isa);

// Row `row` of a kGgml weight as float32 (exactly formats/ggml_blocks.h's values): out [w.cols].
// On AVX-512 the codes are widened 16 at a time.
void GgmlRow(const Weight& w, int64_t row, float* out, CpuIsa isa);

}  // namespace gizllm
