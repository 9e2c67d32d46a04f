#include "backend/cpu/quant_matmul.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/matmul_kernels.h"
#include "backend/cpu/quant_kernels.h"
#include "core/check.h"
#include "quant/hadamard.h"
#include "quant/layout.h"

namespace gizllm {
namespace {

QuantSliceFn SliceFor(CpuIsa isa, Format format) {
  switch (isa) {
    case CpuIsa::kAvx512:
      return QuantSliceAvx512(format);
    case CpuIsa::kAvx2:
      return QuantSliceAvx2(format);
    default:
      return QuantSliceScalar(format);
  }
}

}  // namespace

Status CheckQuantWeight(const Weight& w) {
  const std::string what = "weight of format " + FormatName(w.format);
  if (!quant::IsQuantized(w.format)) return InvalidArgument(what + " is not quantized");
  if (w.group != quant::kGroup) {
    return InvalidArgument(what + " has groups of " + std::to_string(w.group) + ", expected 128");
  }
  if (w.rows <= 0 || w.cols <= 0 || w.cols % quant::kGroup != 0) {
    return InvalidArgument(what + " has shape " + std::to_string(w.rows) + " x " +
                           std::to_string(w.cols) + ", expected columns a multiple of 128");
  }
  if (!w.data || !w.scales) return InvalidArgument(what + " has no codes or scales");
  if (w.zeros && !quant::AllowsZeros(w.format)) {
    return InvalidArgument(what + " has zeros, which only q4 and q2 have");
  }
  return Status::Ok();
}

bool HasQuantizedOutput(const MatmulParams& p) {
  for (int i = 0; i < p.outputs; ++i) {
    if (p.w[i] && quant::IsQuantized(p.w[i]->format)) return true;
  }
  return false;
}

void QuantMatmul(const MatmulParams& p, ThreadPool* pool, CpuIsa isa, bool bf16_activations) {
  struct Job {
    QuantSlice slice;
    QuantSliceFn fn;
    int64_t first;  // index of the job's first weight row in the concatenation of all jobs
  };
  Job jobs[MatmulParams::kMaxOutputs];
  int count = 0;
  int64_t total = 0;
  const int64_t cols = p.w[0]->cols;

  // Rotated copies of x, one per distinct seed (usually one for all outputs).
  thread_local std::vector<float> rotated;
  uint64_t seeds[MatmulParams::kMaxOutputs];
  int rotations = 0;
  for (int i = 0; i < p.outputs; ++i) {
    const Weight& w = *p.w[i];
    if (!quant::IsQuantized(w.format) || !w.rotated) continue;
    if (std::find(seeds, seeds + rotations, w.rotation_seed) == seeds + rotations) {
      seeds[rotations++] = w.rotation_seed;
    }
  }
  const int64_t x_floats = p.rows * cols;
  if (rotations > 0 && rotated.size() < static_cast<size_t>(rotations * x_floats)) {
    rotated.resize(rotations * x_floats);
  }
  RotateRowFn rotate = isa == CpuIsa::kAvx512 ? RotateRowAvx512() : nullptr;
  if (rotate == nullptr) rotate = quant::RotateRow;

  // int8 activations for weights in the VNNI layout: each source of rows (x, or a rotated copy)
  // quantized once, in slot k (rotation k) or `rotations` (x itself).
  thread_local std::vector<int8_t> codes;
  thread_local std::vector<float> code_scales;  // per source: scales [rows, groups], then sums
  const int64_t groups = cols / quant::kGroup;
  bool coded[MatmulParams::kMaxOutputs + 1] = {};
  bool vnni = false;
  for (int i = 0; i < p.outputs; ++i) {
    const Weight& w = *p.w[i];
    if (!quant::IsQuantized(w.format) || w.layout != kCpuVnniLayout) continue;
    vnni = true;
    coded[w.rotated ? std::find(seeds, seeds + rotations, w.rotation_seed) - seeds : rotations] =
        true;
  }
  if (vnni) {
    CHECK(QuantizeRowsInt8() != nullptr);
    if (codes.size() < static_cast<size_t>((rotations + 1) * x_floats)) {
      codes.resize((rotations + 1) * x_floats);
    }
    if (code_scales.size() < static_cast<size_t>((rotations + 1) * 2 * p.rows * groups)) {
      code_scales.resize((rotations + 1) * 2 * p.rows * groups);
    }
  }
  // Rows [r0, r1) of every rotated copy and of every int8 source. (The buffers by pointer: they
  // are the calling thread's, and a worker naming a thread_local would get its own.)
  float* const rotated_data = rotated.data();
  int8_t* const code_data = codes.data();
  float* const scale_data = code_scales.data();
  auto prepare = [&](int64_t r0, int64_t r1) {
    for (int k = 0; k < rotations; ++k) {
      float* dst = rotated_data + k * x_floats;
      std::memcpy(dst + r0 * cols, p.x + r0 * cols, (r1 - r0) * cols * sizeof(float));
      for (int64_t r = r0; r < r1; ++r) rotate(dst + r * cols, cols, seeds[k]);
    }
    for (int k = 0; k <= rotations; ++k) {
      if (!coded[k]) continue;
      const float* src = k < rotations ? rotated_data + k * x_floats : p.x;
      float* scales = scale_data + k * 2 * p.rows * groups;
      QuantizeRowsInt8()(src + r0 * cols, r1 - r0, cols, code_data + k * x_floats + r0 * cols,
                         scales + r0 * groups, scales + (p.rows + r0) * groups);
    }
  };
  // Many rows (prompts): every thread prepares some of them.
  if (pool && pool->threads() > 1 && p.rows >= kQuantParallelPrepareRows) {
    pool->ParallelFor(p.rows, 8, [&](int64_t r0, int64_t r1, int) { prepare(r0, r1); });
  } else {
    prepare(0, p.rows);
  }

  // bf16 activations: each source of rows (x, or a rotated copy) rounded to bf16 once, in
  // slot k (rotation k) or `rotations` (x itself).
  const bool bf16 = bf16_activations && isa == CpuIsa::kAvx512 && CpuHasAvx512Bf16() &&
                    p.rows >= kQuantBf16MinRows && QuantSliceAvx512Bf16(Format::kQ8) != nullptr;
  thread_local std::vector<float> rounded;
  const MatmulKernels& bf16_kernels = Avx512Bf16MatmulKernels();
  const int64_t bf16_stride = bf16 ? ActivationStride(bf16_kernels, cols) : 0;
  const int64_t bf16_floats = p.rows * bf16_stride;
  bool rounded_ready[MatmulParams::kMaxOutputs + 1] = {};
  if (bf16 && rounded.size() < static_cast<size_t>((rotations + 1) * bf16_floats)) {
    rounded.resize((rotations + 1) * bf16_floats);
  }

  for (int i = 0; i < p.outputs; ++i) {
    const Weight& w = *p.w[i];
    if (!quant::IsQuantized(w.format)) continue;
    DCHECK(w.group == quant::kGroup && w.cols == cols && w.cols % quant::kGroup == 0);
    const float* x = p.x;
    int source = rotations;
    if (w.rotated) {
      source = static_cast<int>(std::find(seeds, seeds + rotations, w.rotation_seed) - seeds);
      x = rotated_data + source * x_floats;
    }
    QuantSlice slice{&w, x, p.rows, p.out[i], p.bias[i]};
    QuantSliceFn fn = SliceFor(isa, w.format);
    if (w.layout == kCpuVnniLayout) {
      // Packed by CpuBackend::PrepareWeight for a CPU with AVX-512 VNNI: only these kernels read
      // that layout.
      fn = QuantSliceAvx512Vnni(w.format);
      CHECK(fn != nullptr);
      slice.x_i8 = code_data + source * x_floats;
      slice.x_scales = scale_data + source * 2 * p.rows * groups;
      slice.x_sums = slice.x_scales + p.rows * groups;
    } else if (bf16) {
      float* dst = rounded.data() + source * bf16_floats;
      if (!rounded_ready[source]) {
        bf16_kernels.prepare(Format::kBf16, x, p.rows, cols, dst);
        rounded_ready[source] = true;
      }
      slice.x_bf16 = dst;
      slice.x_bf16_stride = bf16_stride;
      fn = QuantSliceAvx512Bf16(w.format);
    }
    if (fn == nullptr) fn = QuantSliceScalar(w.format);
    jobs[count++] = {slice, fn, total};
    total += w.rows;
  }
  if (count == 0) return;

  // Threads split the weight rows of all outputs together, in multiples of 8 rows (32, the
  // panels' width, with bf16 activations, and two blocks of the VNNI layout).
  auto run = [&](int64_t begin, int64_t end, int /*thread*/) {
    for (int j = 0; j < count; ++j) {
      const Job& job = jobs[j];
      int64_t n0 = std::max(begin, job.first) - job.first;
      int64_t n1 = std::min(end, job.first + job.slice.w->rows) - job.first;
      if (n0 < n1) job.fn(job.slice, n0, n1);
    }
  };
  if (pool && pool->threads() > 1) {
    pool->ParallelFor(total, bf16 || vnni ? 32 : 8, run);
  } else {
    run(0, total, 0);
  }
}

}  // namespace gizllm
