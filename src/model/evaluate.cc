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

Expected<std::vector<float>> SequenceMtpLogits(Runner& runner, std::span<const int32_t> ids,
                                               int64_t chunk) {
  if (!runner.HasMtp()) return Unimplemented("the model has no MTP layer");
  if (ids.size() < 2) return InvalidArgument("the MTP layer reads at least two token ids");
  if (chunk <= 0) return InvalidArgument("chunk must be positive");
  const int64_t n = static_cast<int64_t>(ids.size());
  const int64_t vocab = runner.arch().vocab, dim = runner.arch().dim;
  OneSlot slot(n);
  GZ_RETURN_IF_ERROR(runner.AllocatePages(slot.tables.max_pages));
  GZ_RETURN_IF_ERROR(runner.Reserve(std::min(n, chunk), 1, slot.tables.max_pages));
  std::vector<float> logits((n - 1) * vocab);
  std::vector<float> hidden(std::min(n, chunk) * dim);
  Rows rows;
  // A chunk's MTP rows read its hidden states and the MTP keys the chunks before them wrote.
  for (int64_t begin = 0; begin < n; begin += chunk) {
    const int64_t end = std::min(n, begin + chunk);
    rows.Clear();
    for (int64_t p = begin; p < end; ++p)
      rows.Push(ids[p], /*slot=*/0, static_cast<int32_t>(p), /*want=*/false);
    GZ_RETURN_IF_ERROR(runner.StepHidden(rows, slot.tables, nullptr, hidden.data()));
    rows.Clear();
    for (int64_t p = begin; p < std::min(end, n - 1); ++p)
      rows.Push(ids[p + 1], /*slot=*/0, static_cast<int32_t>(p), /*want=*/true);
    if (rows.size() == 0) break;
    GZ_RETURN_IF_ERROR(
        runner.MtpStep(rows, slot.tables, hidden.data(), nullptr, logits.data() + begin * vocab));
  }
  if (const int64_t bad = FirstNonFinite(logits); bad >= 0) {
    return Internal("the MTP logits at position " + std::to_string(bad / vocab) +
                    " hold NaN or infinity");
  }
  return logits;
}

Expected<std::vector<float>> LastLogits(Runner& runner, std::span<const int32_t> ids,
                                        int64_t chunk) {
  if (ids.empty()) return InvalidArgument("no token ids");
  if (chunk <= 0) return InvalidArgument("chunk must be positive");
  const int64_t n = static_cast<int64_t>(ids.size());
  OneSlot slot(n);
  GZ_RETURN_IF_ERROR(runner.AllocatePages(slot.tables.max_pages));
  GZ_RETURN_IF_ERROR(runner.Reserve(std::min(n, chunk), 1, slot.tables.max_pages));
  std::vector<float> logits(runner.arch().vocab);
  Rows rows;
  for (int64_t begin = 0; begin < n; begin += chunk) {
    rows.Clear();
    const int64_t end = std::min(n, begin + chunk);
    for (int64_t p = begin; p < end; ++p) {
      rows.Push(ids[p], /*slot=*/0, static_cast<int32_t>(p), /*want=*/p == n - 1);
    }
    GZ_RETURN_IF_ERROR(runner.Step(rows, slot.tables, end == n ? logits.data() : nullptr));
  }
  if (FirstNonFinite(logits) >= 0) {
    return Internal(
        "the last position's logits hold NaN or infinity: the model's weights hold "
        "non-finite values, or its activations overflow");
  }
  return logits;
}

Expected<PromptPictures> PlacePictures(const VisionArch& arch, std::span<const int32_t> ids,
                                       MropePositions positions, const VisionOutput& tower) {
  PromptPictures p;
  p.positions = std::move(positions);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] == arch.image_token || ids[i] == arch.video_token) {
      p.rows.push_back(static_cast<int32_t>(i));
    }
  }
  const int64_t count = static_cast<int64_t>(p.rows.size());
  if (count != tower.rows) {
    return InvalidArgument("the prompt holds " + std::to_string(count) +
                           " image and video placeholders, the pictures and videos give " +
                           std::to_string(tower.rows) + " rows");
  }
  if (tower.device) {
    // The rows stay where the tower left them ([1 + deepstack, rows, out_dim] floats).
    p.device = tower.device;
    p.layers = static_cast<int>(arch.deepstack.size());
    return p;
  }
  p.embeddings = tower.embeddings;
  p.layers = static_cast<int>(tower.deepstack.size());
  for (const std::vector<float>& feature : tower.deepstack) {
    p.deepstack.insert(p.deepstack.end(), feature.begin(), feature.end());
  }
  return p;
}

Expected<std::vector<float>> SequenceLogits(Runner& runner, std::span<const int32_t> ids,
                                            const PromptPictures& pictures, int64_t chunk) {
  if (ids.empty()) return InvalidArgument("no token ids");
  if (chunk <= 0) return InvalidArgument("chunk must be positive");
  const int64_t n = static_cast<int64_t>(ids.size());
  const MropePositions& pos = pictures.positions;
  if (static_cast<int64_t>(pos.t.size()) != n)
    return InvalidArgument("the M-RoPE positions are not the prompt's");
  if (pictures.on_device() && pictures.device_backend != runner.StepBackend())
    return InvalidArgument("the pictures' rows lie in another device's memory than the model's");
  const int64_t vocab = runner.arch().vocab;
  const int64_t dim = runner.arch().dim;
  const int64_t count = static_cast<int64_t>(pictures.rows.size());
  OneSlot slot(n);
  GZ_RETURN_IF_ERROR(runner.AllocatePages(slot.tables.max_pages));
  GZ_RETURN_IF_ERROR(runner.Reserve(std::min(n, chunk), 1, slot.tables.max_pages));
  std::vector<float> logits(n * vocab);
  Rows rows;
  int64_t next_picture_row = 0;  // index into pictures.rows
  for (int64_t begin = 0; begin < n; begin += chunk) {
    rows.Clear();
    const int64_t end = std::min(n, begin + chunk);
    for (int64_t p = begin; p < end; ++p) {
      rows.PushMrope(ids[p], /*slot=*/0, static_cast<int32_t>(p), pos.t[p], pos.h[p], pos.w[p],
                     /*want=*/true);
    }
    // This chunk's picture rows, and their deepstack features layer by layer.
    const int64_t first = next_picture_row;
    while (next_picture_row < count && pictures.rows[next_picture_row] < end) ++next_picture_row;
    const int64_t taken = next_picture_row - first;
    VisualRows& v = rows.visual;
    if (pictures.on_device()) {
      // Rows in the runner's device memory are read there.
      for (int64_t j = first; j < next_picture_row; ++j) {
        v.rows.push_back(static_cast<int32_t>(pictures.rows[j] - begin));
        v.sources.push_back({pictures.DeviceRow(j, dim), count * dim, pictures.layers});
      }
      v.layers = taken > 0 ? pictures.layers : 0;
      GZ_RETURN_IF_ERROR(runner.Step(rows, slot.tables, logits.data() + begin * vocab));
      continue;
    }
    for (int64_t j = first; j < next_picture_row; ++j)
      v.rows.push_back(static_cast<int32_t>(pictures.rows[j] - begin));
    v.embeddings.assign(pictures.embeddings.begin() + first * dim,
                        pictures.embeddings.begin() + next_picture_row * dim);
    v.layers = taken > 0 ? pictures.layers : 0;
    for (int l = 0; l < v.layers; ++l) {
      const float* feature = pictures.deepstack.data() + (l * count + first) * dim;
      v.deepstack.insert(v.deepstack.end(), feature, feature + taken * dim);
    }
    GZ_RETURN_IF_ERROR(runner.Step(rows, slot.tables, logits.data() + begin * vocab));
  }
  if (const int64_t bad = FirstNonFinite(logits); bad >= 0) {
    return Internal("the logits at position " + std::to_string(bad / vocab) +
                    " hold NaN or infinity");
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

Expected<std::vector<float>> SequenceHidden(Runner& runner, std::span<const int32_t> ids,
                                            const PromptPictures& pictures,
                                            std::span<const int> layers) {
  if (ids.empty()) return InvalidArgument("no token ids");
  const int64_t n = static_cast<int64_t>(ids.size());
  const MropePositions& pos = pictures.positions;
  if (static_cast<int64_t>(pos.t.size()) != n)
    return InvalidArgument("the M-RoPE positions are not the prompt's");
  if (pictures.on_device() && pictures.device_backend != runner.StepBackend())
    return InvalidArgument("the pictures' rows lie in another device's memory than the model's");
  OneSlot slot(n);
  GZ_RETURN_IF_ERROR(runner.AllocatePages(slot.tables.max_pages));
  Rows rows;
  for (int64_t p = 0; p < n; ++p) {
    rows.PushMrope(ids[p], /*slot=*/0, static_cast<int32_t>(p), pos.t[p], pos.h[p], pos.w[p],
                   /*want=*/false);
  }
  VisualRows& v = rows.visual;
  v.rows = pictures.rows;
  v.layers = pictures.layers;
  if (pictures.on_device()) {
    const int64_t dim = runner.arch().dim;
    for (int64_t j = 0; j < pictures.count(); ++j)
      v.sources.push_back({pictures.DeviceRow(j, dim), pictures.count() * dim, pictures.layers});
  } else {
    v.embeddings = pictures.embeddings;
    v.deepstack = pictures.deepstack;
  }
  std::vector<float> out(layers.size() * n * runner.arch().dim);
  GZ_RETURN_IF_ERROR(runner.Hidden(rows, slot.tables, layers, out.data()));
  return out;
}

}  // namespace gizllm
