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
// that grows to the largest matmul seen and is then reused.
void QuantMatmul(const MatmulParams& p, ThreadPool* pool, CpuIsa isa = DetectCpuIsa());

}  // namespace gizllm
