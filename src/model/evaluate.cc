#include "model/evaluate.h"

#include <algorithm>
#include <numeric>

#include "core/dtype.h"
#include "ops/backend.h"

namespace gizllm {
namespace {

// A single slot whose page table maps block p to page p.
struct OneSlot {
  std::vector<int32_t> pages;
  PageTables tables;
  explicit OneSlot(int64_t tokens) {
    int32_t n = static_cast<int32_t>(std::max<int64_t>(1, (tokens + kPage - 1) / kPage));
    pages.resize(n);
    std::iota(pages.begin(), pages.end(), 0);
    tables = {pages.data(), 1, n};
  }
};

}  // namespace

Expected<std::vector<float>> SequenceLogits(Runner& runner, std::span<const int32_t> ids,
                                            int64_t chunk) {
  if (ids.empty()) return InvalidArgument("no token ids");
  if (chunk <= 0) return InvalidArgument("chunk must be positive");
  const int64_t n = static_cast<int64_t>(ids.size());
  const int64_t vocab = runner.arch().vocab;
  OneSlot slot(n);
  GZ_RETURN_IF_ERROR(runner.AllocatePages(slot.tables.max_pages));
  GZ_RETURN_IF_ERROR(runner.Reserve(std::min(n, chunk), 1, slot.tables.max_pages));
  std::vector<float> logits(n * vocab);
  Rows rows;
  // Chunks run in order: each reads the keys and values the chunks before it wrote.
  for (int64_t begin = 0; begin < n; begin += chunk) {
    rows.Clear();
    int64_t end = std::min(n, begin + chunk);
    for (int64_t p = begin; p < end; ++p)
      rows.Push(ids[p], /*slot=*/0, static_cast<int32_t>(p), /*want=*/true);
    GZ_RETURN_IF_ERROR(runner.Step(rows, slot.tables, logits.data() + begin * vocab));
  }
  if (const int64_t bad = FirstNonFinite(logits); bad >= 0) {
    return Internal("the logits at position " + std::to_string(bad / vocab) +
                    " hold NaN or infinity: the model's weights hold non-finite values, or its "
                    "activations overflow");
  }
  return logits;
}

Expected<std::vector<float>> SequenceHidden(Runner& runner, std::span<const int32_t> ids,
                                            std::span<const int> layers) {
  if (ids.empty()) return InvalidArgument("no token ids");
  const int64_t n = static_cast<int64_t>(ids.size());
  OneSlot slot(n);
  GZ_RETURN_IF_ERROR(runner.AllocatePages(slot.tables.max_pages));
  Rows rows;
  for (int64_t p = 0; p < n; ++p) rows.Push(ids[p], 0, static_cast<int32_t>(p), false);
  std::vector<float> out(layers.size() * n * runner.arch().dim);
  GZ_RETURN_IF_ERROR(runner.Hidden(rows, slot.tables, layers, out.data()));
  return out;
}

}  // namespace gizllm
