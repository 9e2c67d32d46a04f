// CPU matmul for the quantized formats (kQ8, kQ4, kQ2, kQ1; layouts in quant/layout.h).
#pragma once

#include "backend/cpu/cpu_isa.h"
#include "core/thread_pool.h"
#include "ops/backend.h"

namespace gizllm {

// Checks that a host weight is one these kernels can run: kQ8..kQ1 in groups of 128, columns a
// multiple of 128, codes and scales present, zeros only for kQ4 and kQ2.
Status CheckQuantWeight(const Weight& w);

// Whether any output of `p` has a quantized weight.
bool HasQuantizedOutput(const MatmulParams& p);

// Runs the outputs of `p` whose weights are quantized: out_i = x W_i^T (+ bias_i). The activation
// rows are rotated once (quant/hadamard.h) for all outputs that share a rotation; outputs with
// plain weights are left to the caller. Each quantized weight must pass quant::CheckQuantized
// (host pointers). Runs on `pool` when given. The rotated copy of x lives in a per-thread buffer
// that grows to the largest matmul seen and is then reused. With bf16_activations (AVX-512 on a
// CPU with avx512_bf16, from kQuantBf16MinRows rows), the rows are rounded to bf16 and each
// panel of weights is decoded and rounded to bf16 for vdpbf16ps products, float32 sums. Fewer
// rows keep the float32 panels: decoding and transposing a panel for the bf16 products costs
// about as much as the float32 products save up to 32 rows (1152 x 384 in q8 or q4 at 2
// threads: 16 rows 48 -> 60-62 us, 32 rows 86-91 -> 87-88 us, 48 rows 127-129 -> 112-113 us, 128
// rows 335-339 -> 240-245 us). Weights CpuBackend repacked for int8 activations
// (Weight::layout = kCpuVnniLayout) take the int8 path for any number of rows instead: each
// source of rows quantized to int8 once (QuantizeRowsInt8), then vpdpbusd products.
inline constexpr int64_t kQuantBf16MinRows = 48;
// From this many rows, with a pool, the rows' rotation and int8 quantization run on all threads.
inline constexpr int64_t kQuantParallelPrepareRows = 64;
void QuantMatmul(const MatmulParams& p, ThreadPool* pool, CpuIsa isa = DetectCpuIsa(),
                 bool bf16_activations = false);

}  // namespace gizllm
