#include "backend/cpu/ggml_matmul.h"

#include <algorithm>
#include <vector>

#include "backend/cpu/vec_math.h"
#include "formats/ggml_blocks.h"
#include "formats/gguf.h"

namespace gizllm {
namespace {

// Bytes of one row of blocks.
int64_t RowBytes(const Weight& w) {
  GgmlBlock block;
  GgmlBlockOf(static_cast<GgmlType>(w.ggml_type), &block);
  return w.cols / block.elements * block.bytes;
}

// Output rows [n0, n1) of one weight for every activation row: out[r, n] = dot(W[n], x[r]) (+
// bias[n]). `row` is the thread's float32 row [w.cols].
template <class V>
void Slice(const MatmulParams& p, int o, int64_t n0, int64_t n1, float* row) {
  const Weight& w = *p.w[o];
  const int64_t cols = w.cols, n_all = w.rows;
  for (int64_t n = n0; n < n1; ++n) {
    GgmlRow(w, n, row);
    const float b = p.bias[o] ? p.bias[o][n] : 0.0f;
    for (int64_t r = 0; r < p.rows; ++r) {
      p.out[o][r * n_all + n] = V::Dot(row, p.x + r * cols, cols) + b;
    }
  }
}

template <class V>
void Run(const MatmulParams& p, ThreadPool* pool) {
  // Tasks of up to 16 output rows over every kGgml output, taken as threads finish.
  constexpr int64_t kChunk = 16;
  int64_t first_task[MatmulParams::kMaxOutputs + 1] = {0};
  for (int o = 0; o < p.outputs; ++o) {
    const int64_t n = p.w[o]->format == Format::kGgml ? p.w[o]->rows : 0;
    first_task[o + 1] = first_task[o] + (n + kChunk - 1) / kChunk;
  }
  const int64_t tasks = first_task[p.outputs];
  int64_t cols = p.w[0]->cols;
  auto run = [&](int64_t t0, int64_t t1, int) {
    thread_local std::vector<float> row;
    if (row.size() < static_cast<size_t>(cols)) row.resize(cols);
    for (int64_t task = t0; task < t1; ++task) {
      int o = 0;
      while (task >= first_task[o + 1]) ++o;
      const int64_t n0 = (task - first_task[o]) * kChunk;
      Slice<V>(p, o, n0, std::min(p.w[o]->rows, n0 + kChunk), row.data());
    }
  };
  if (!pool || pool->threads() == 1) {
    run(0, tasks, 0);
  } else {
    pool->ParallelFor(tasks, 1, run);
  }
}

}  // namespace

bool GgmlMatmulReads(uint32_t ggml_type) {
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

Status CheckGgmlWeight(const Weight& w) {
  const GgmlType type = static_cast<GgmlType>(w.ggml_type);
  GgmlBlock block;
  if (w.format != Format::kGgml || !GgmlMatmulReads(w.ggml_type) || !GgmlBlockOf(type, &block)) {
    return InvalidArgument("weight of format " + FormatName(w.format) + " and block type " +
                           GgmlTypeName(type) + " is not read by the ggml kernels (Q8_0, Q4_0, " +
                           "Q4_K, Q6_K)");
  }
  if (w.empty() || w.rows <= 0 || w.cols <= 0) {
    return InvalidArgument("ggml weight has no data or an empty shape");
  }
  if (w.cols % block.elements != 0) {
    return InvalidArgument("ggml weight's rows of " + std::to_string(w.cols) + " are not whole " +
                           GgmlTypeName(type) + " blocks of " + std::to_string(block.elements));
  }
  return Status::Ok();
}

bool HasGgmlOutput(const MatmulParams& p) {
  for (int i = 0; i < p.outputs; ++i) {
    if (p.w[i] && p.w[i]->format == Format::kGgml) return true;
  }
  return false;
}

void GgmlRow(const Weight& w, int64_t row, float* out) {
  const GgmlType type = static_cast<GgmlType>(w.ggml_type);
  GgmlBlock block;
  GgmlBlockOf(type, &block);
  const GgmlBlockFn decode = GgmlBlockDecoder(type);
  const uint8_t* data = static_cast<const uint8_t*>(w.data) + row * RowBytes(w);
  for (int64_t b = 0; b < w.cols / block.elements; ++b) {
    decode(data + b * block.bytes, out + b * block.elements);
  }
}

void GgmlMatmul(const MatmulParams& p, ThreadPool* pool, CpuIsa isa) {
#if defined(__x86_64__)
  if (isa == CpuIsa::kAvx512) return Run<vec::Avx512>(p, pool);
  if (isa == CpuIsa::kAvx2) return Run<vec::Avx2>(p, pool);
#endif
  Run<vec::Scalar>(p, pool);
}

}  // namespace gizllm
