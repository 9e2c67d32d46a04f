#include "model/pipeline_runner.h"

#include <algorithm>
#include <cstring>

namespace gizllm {

PipelineRunner::PipelineRunner(std::vector<std::unique_ptr<Model>> stages)
    : stages_(std::move(stages)) {
  // Each stage lists its layers' caches, the last the MTP layer's after them.
  for (const auto& stage : stages_) {
    caches_.insert(caches_.end(), stage->caches().begin(), stage->caches().end());
  }
  hand_off_.resize(stages_.size() - 1);
}

Expected<std::unique_ptr<PipelineRunner>> PipelineRunner::Create(
    std::vector<std::unique_ptr<Model>> stages) {
  if (stages.empty()) return InvalidArgument("pipeline: no stages");
  int next = 0;
  for (size_t s = 0; s < stages.size(); ++s) {
    const Model& m = *stages[s];
    if (m.first_layer() != next) {
      return InvalidArgument("pipeline: stage " + std::to_string(s) + " begins at layer " +
                             std::to_string(m.first_layer()) + ", expected " +
                             std::to_string(next));
    }
    if (m.dir() != stages[0]->dir() || m.arch().layers != stages[0]->arch().layers)
      return InvalidArgument("pipeline: the stages are not of one model");
    if (m.kv_format() != stages[0]->kv_format())
      return InvalidArgument("pipeline: the stages' KV pages differ in format");
    next = m.end_layer();
  }
  if (next != stages[0]->arch().layers) {
    return InvalidArgument("pipeline: the stages end at layer " + std::to_string(next) + " of " +
                           std::to_string(stages[0]->arch().layers));
  }
  return std::unique_ptr<PipelineRunner>(new PipelineRunner(std::move(stages)));
}

Status PipelineRunner::FirstCurrent(Status status) {
  stages_.front()->backend().MakeCurrent();
  return status;
}

template <typename F>
Status PipelineRunner::ForEach(F f) {
  for (auto& stage : stages_) {
    stage->backend().MakeCurrent();
    if (Status s = f(*stage); !s.ok()) return FirstCurrent(s);
  }
  return FirstCurrent(Status::Ok());
}

template <typename StageStep>
Status PipelineRunner::Forward(const Rows& rows, StageStep step) {
  const size_t floats = rows.size() * static_cast<size_t>(arch().dim);
  for (std::vector<float>& rows_out : hand_off_) {
    if (rows_out.size() < floats) rows_out.resize(floats);
  }
  const int last = stages() - 1;
  for (int s = 0; s <= last; ++s) {
    Model& stage = *stages_[s];
    stage.SetStageRows(s > 0 ? hand_off_[s - 1].data() : nullptr,
                       s < last ? hand_off_[s].data() : nullptr);
    stage.backend().MakeCurrent();
    if (Status status = step(stage, s); !status.ok()) return FirstCurrent(status);
  }
  return FirstCurrent(Status::Ok());
}

int64_t PipelineRunner::PageBytes() const {
  int64_t bytes = 0;
  for (const auto& stage : stages_) bytes += stage->PageBytes();
  return bytes;
}

ExpertCacheStats PipelineRunner::ExpertCache() const {
  ExpertCacheStats all;
  for (const auto& stage : stages_) {
    const ExpertCacheStats one = stage->ExpertCache();
    all.slots += one.slots;
    all.hits += one.hits;
    all.misses += one.misses;
    all.read_ms += one.read_ms;
  }
  return all;
}

Status PipelineRunner::AllocatePages(int32_t pages, bool window_paging) {
  if (window_paging)
    return InvalidArgument("KV pool: a pipeline pages every layer at every position");
  return ForEach([&](Model& m) { return m.AllocatePages(pages, false); });
}

Status PipelineRunner::Reserve(int64_t rows, int32_t slots, int32_t max_pages) {
  GZ_RETURN_IF_ERROR(ForEach([&](Model& m) { return m.Reserve(rows, slots, max_pages); }));
  const size_t floats = rows * static_cast<size_t>(arch().dim);
  for (std::vector<float>& rows_out : hand_off_) {
    if (rows_out.size() < floats) rows_out.resize(floats);
  }
  return Status::Ok();
}

Status PipelineRunner::Step(const Rows& rows, const PageTables& tables, float* logits) {
  const int last = stages() - 1;
  return Forward(
      rows, [&](Model& m, int s) { return m.Step(rows, tables, s == last ? logits : nullptr); });
}

Status PipelineRunner::StepHidden(const Rows& rows, const PageTables& tables, float* logits,
                                  float* hidden) {
  const int last = stages() - 1;
  return Forward(rows, [&](Model& m, int s) {
    return s == last ? m.StepHidden(rows, tables, logits, hidden) : m.Step(rows, tables, nullptr);
  });
}

Status PipelineRunner::StepSample(const Rows& rows, const PageTables& tables,
                                  std::span<const SampleRow> params, const SampleMasks& masks,
                                  int32_t* tokens) {
  if (!CanSample()) return Unimplemented("StepSample: the last stage's backend picks no tokens");
  const int last = stages() - 1;
  return Forward(rows, [&](Model& m, int s) {
    return s == last ? m.StepSample(rows, tables, params, masks, tokens)
                     : m.Step(rows, tables, nullptr);
  });
}

Status PipelineRunner::Hidden(const Rows& rows, const PageTables& tables,
                              std::span<const int> layers, float* out) {
  const int count = arch().layers;
  for (int l : layers) {
    if (l < 0 || l > count + 1)
      return InvalidArgument("Hidden: layer " + std::to_string(l) + " outside [0, " +
                             std::to_string(count + 1) + "]");
  }
  // Each hidden state is the stage's that writes it: the embeddings the first's, the stream
  // after layer l the stage's that holds layer l - 1, the final-normed one the last's.
  const int last = stages() - 1;
  const int64_t plane = rows.size() * static_cast<int64_t>(arch().dim);
  std::vector<int> own;
  std::vector<size_t> where;
  std::vector<float> part;
  return Forward(rows, [&](Model& m, int s) -> Status {
    own.clear();
    where.clear();
    for (size_t i = 0; i < layers.size(); ++i) {
      const int l = layers[i];
      const bool mine = (l == 0 && s == 0) || (l > m.first_layer() && l <= m.end_layer()) ||
                        (l == count + 1 && s == last);
      if (!mine) continue;
      own.push_back(l);
      where.push_back(i);
    }
    part.resize(own.size() * plane);
    GZ_RETURN_IF_ERROR(m.Hidden(rows, tables, own, part.data()));
    for (size_t j = 0; j < own.size(); ++j) {
      std::memcpy(out + where[j] * plane, part.data() + j * plane, plane * sizeof(float));
    }
    return Status::Ok();
  });
}

Status PipelineRunner::MtpStep(const Rows& rows, const PageTables& tables, const float* hidden,
                               float* normed, float* logits) {
  last().backend().MakeCurrent();
  return FirstCurrent(last().MtpStep(rows, tables, hidden, normed, logits));
}

Status PipelineRunner::KeepHidden() {
  last().backend().MakeCurrent();
  return FirstCurrent(last().KeepHidden());
}

Status PipelineRunner::MtpDraft(const Rows& rows, const PageTables& tables,
                                std::span<const int32_t> sources, int32_t chained,
                                int32_t* tokens) {
  last().backend().MakeCurrent();
  return FirstCurrent(last().MtpDraft(rows, tables, sources, chained, tokens));
}

Status PipelineRunner::SaveSlotState(int32_t slot) {
  return ForEach([&](Model& m) { return m.SaveSlotState(slot); });
}

Status PipelineRunner::RestoreSlotState(int32_t slot) {
  return ForEach([&](Model& m) { return m.RestoreSlotState(slot); });
}

int64_t PipelineRunner::SlotStatesBytes() const {
  int64_t bytes = 0;
  for (const auto& stage : stages_) bytes += stage->SlotStatesBytes();
  return bytes;
}

Status PipelineRunner::CopySlotStatesToHost(int32_t slot, bool saved, void* host) {
  auto* at = static_cast<uint8_t*>(host);
  return ForEach([&](Model& m) {
    GZ_RETURN_IF_ERROR(m.CopySlotStatesToHost(slot, saved, at));
    at += m.SlotStatesBytes();
    return Status::Ok();
  });
}

Status PipelineRunner::CopySlotStatesFromHost(int32_t slot, const void* host) {
  const auto* at = static_cast<const uint8_t*>(host);
  return ForEach([&](Model& m) {
    GZ_RETURN_IF_ERROR(m.CopySlotStatesFromHost(slot, at));
    at += m.SlotStatesBytes();
    return Status::Ok();
  });
}

Status PipelineRunner::ReserveDrafts() {
  return ForEach([&](Model& m) { return m.ReserveDrafts(); });
}

Status PipelineRunner::SnapshotDraftState(int32_t slot) {
  return ForEach([&](Model& m) { return m.SnapshotDraftState(slot); });
}

Status PipelineRunner::KeepDraftRows(int32_t slot, int64_t rows) {
  return ForEach([&](Model& m) { return m.KeepDraftRows(slot, rows); });
}

Status PipelineRunner::SnapshotDraftStates(std::span<const int32_t> slots) {
  return ForEach([&](Model& m) { return m.SnapshotDraftStates(slots); });
}

Status PipelineRunner::KeepDraftRowsOf(std::span<const KeptDraftRows> kept) {
  return ForEach([&](Model& m) { return m.KeepDraftRowsOf(kept); });
}

bool PipelineRunner::PagesInHostMemory() const {
  return std::all_of(stages_.begin(), stages_.end(),
                     [](const auto& stage) { return stage->PagesInHostMemory(); });
}

Status PipelineRunner::CopyPageToHost(int32_t page, void* host) {
  auto* at = static_cast<uint8_t*>(host);
  return ForEach([&](Model& m) {
    GZ_RETURN_IF_ERROR(m.CopyPageToHost(page, at));
    at += m.PageBytes();
    return Status::Ok();
  });
}

Status PipelineRunner::CopyPageFromHost(int32_t page, const void* host) {
  const auto* at = static_cast<const uint8_t*>(host);
  return ForEach([&](Model& m) {
    GZ_RETURN_IF_ERROR(m.CopyPageFromHost(page, at));
    at += m.PageBytes();
    return Status::Ok();
  });
}

Status PipelineRunner::SetKvFormat(KvFormat format) {
  GZ_RETURN_IF_ERROR(ForEach([&](Model& m) { return m.SetKvFormat(format); }));
  caches_.clear();
  for (const auto& stage : stages_) {
    caches_.insert(caches_.end(), stage->caches().begin(), stage->caches().end());
  }
  return Status::Ok();
}

int64_t PipelineRunner::PositionBytes(KvFormat format) const {
  int64_t bytes = 0;
  for (const auto& stage : stages_) bytes += stage->PositionBytes(format);
  return bytes;
}

Expected<std::vector<int>> PipelineBounds(int layers, int stages, std::span<const int> cuts) {
  if (stages < 1) return InvalidArgument("--pipeline: expected 1 or more stages");
  if (stages > layers) {
    return InvalidArgument("--pipeline " + std::to_string(stages) + ": more stages than the " +
                           std::to_string(layers) + " layers of the model");
  }
  std::vector<int> bounds = {0};
  if (cuts.empty()) {
    for (int s = 0; s < stages; ++s) {
      bounds.push_back(bounds.back() + layers / stages + (s < layers % stages ? 1 : 0));
    }
    return bounds;
  }
  if (static_cast<int>(cuts.size()) != stages - 1) {
    return InvalidArgument("pipeline cuts: expected " + std::to_string(stages - 1) +
                           " (a first layer for each stage after the first), got " +
                           std::to_string(cuts.size()));
  }
  for (int cut : cuts) {
    if (cut <= bounds.back() || cut >= layers) {
      return InvalidArgument(
          "pipeline cuts: each stage's first layer must be after the one "
          "before and below the model's " +
          std::to_string(layers) + " layers, got " + std::to_string(cut));
    }
    bounds.push_back(cut);
  }
  bounds.push_back(layers);
  return bounds;
}

Expected<std::unique_ptr<PipelineRunner>> LoadPipeline(
    const std::string& dir, std::span<const std::shared_ptr<Backend>> backends,
    const LoadOptions& options, std::span<const int> cuts) {
  if (backends.empty()) return InvalidArgument("pipeline: no backends");
  GZ_RETURN_IF_ERROR(options.Check());
  if (options.first_layer != 0 || options.end_layer != -1)
    return InvalidArgument("pipeline: the stages' layers are its own to choose");
  GZ_ASSIGN_OR_RETURN(const int layers, Model::Layers(dir, *backends[0], options.layers));
  GZ_ASSIGN_OR_RETURN(std::vector<int> bounds,
                      PipelineBounds(layers, static_cast<int>(backends.size()), cuts));
  std::vector<std::unique_ptr<Model>> stages;
  for (size_t s = 0; s < backends.size(); ++s) {
    LoadOptions stage = options;
    stage.first_layer = bounds[s];
    stage.end_layer = bounds[s + 1];
    backends[s]->MakeCurrent();
    auto model = Model::Load(dir, backends[s], stage);
    backends[0]->MakeCurrent();
    if (!model.ok()) {
      return model.status().Annotate("pipeline stage " + std::to_string(s) + " (layers " +
                                     std::to_string(bounds[s]) + " to " +
                                     std::to_string(bounds[s + 1] - 1) + ")");
    }
    stages.push_back(std::move(*model));
  }
  return PipelineRunner::Create(std::move(stages));
}

}  // namespace gizllm
