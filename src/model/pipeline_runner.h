// PipelineRunner: a model's layers cut into consecutive stages, each a Model of its own on a
// backend of its own (one GPU each, or CPU backends), driven as one Runner. Stage 0 holds the
// embedding, the last stage the final norm, the head, the MTP layer and the picking of tokens.
// Every stage allocates as many KV pages as the engine asks for, each page holding its layers'
// part, so the engine's page ids and page tables serve every stage. A step runs the stages one
// after another, each handing its rows' residual stream to the next (Forward).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/model.h"
#include "model/runner.h"
#include "ops/backend.h"

namespace gizllm {

class PipelineRunner final : public Runner {
 public:
  // The stages in order: Models loaded with LoadOptions::first_layer and end_layer whose ranges
  // follow one another from layer 0 to the last, of one model folder.
  static Expected<std::unique_ptr<PipelineRunner>> Create(
      std::vector<std::unique_ptr<Model>> stages);

  int stages() const { return static_cast<int>(stages_.size()); }
  Model& stage(int s) { return *stages_[s]; }
  const Model& stage(int s) const { return *stages_[s]; }
  Model& last() { return *stages_.back(); }

  const Arch& arch() const override { return stages_.front()->arch(); }
  // Every stage's caches in layer order (the MTP layer's last): the whole model's.
  std::span<const CacheSpec> caches() const override { return caches_; }
  int64_t PageBytes() const override;  // the stages' page bytes together
  ExpertCacheStats ExpertCache() const override;
  bool PagesWindows() const override { return false; }
  using Runner::AllocatePages;
  Status AllocatePages(int32_t pages, bool window_paging) override;
  Status Reserve(int64_t rows, int32_t slots, int32_t max_pages) override;
  Status Step(const Rows& rows, const PageTables& tables, float* logits) override;
  Status StepHidden(const Rows& rows, const PageTables& tables, float* logits,
                    float* hidden) override;
  bool HasMtp() const override { return stages_.back()->HasMtp(); }
  Status MtpStep(const Rows& rows, const PageTables& tables, const float* hidden, float* normed,
                 float* logits) override;
  Status KeepHidden() override;
  Status MtpDraft(const Rows& rows, const PageTables& tables, std::span<const int32_t> sources,
                  int32_t chained, int32_t* tokens) override;
  bool CanSample() const override { return stages_.back()->CanSample(); }
  Status StepSample(const Rows& rows, const PageTables& tables, std::span<const SampleRow> params,
                    const SampleMasks& masks, int32_t* tokens) override;
  Status Hidden(const Rows& rows, const PageTables& tables, std::span<const int> layers,
                float* out) override;
  Status SaveSlotState(int32_t slot) override;
  Status RestoreSlotState(int32_t slot) override;
  // Each stage's part (Model::CopySlotStatesToHost) in stage order.
  int64_t SlotStatesBytes() const override;
  Status CopySlotStatesToHost(int32_t slot, bool saved, void* host) override;
  Status CopySlotStatesFromHost(int32_t slot, const void* host) override;
  Status ReserveDrafts() override;
  Status SnapshotDraftState(int32_t slot) override;
  Status KeepDraftRows(int32_t slot, int64_t rows) override;
  Status SnapshotDraftStates(std::span<const int32_t> slots) override;
  Status KeepDraftRowsOf(std::span<const KeptDraftRows> kept) override;
  bool PagesInHostMemory() const override;
  // A page's bytes on the host: each stage's part (Model::CopyPageToHost) in stage order.
  Status CopyPageToHost(int32_t page, void* host) override;
  Status CopyPageFromHost(int32_t page, const void* host) override;
  // Picture rows come as host rows, which each stage uploads to its own device.
  Backend* StepBackend() override { return nullptr; }

  // The KV pages' format, every stage's (Model::SetKvFormat), and the bytes one position takes
  // in pages of `format` in all of them.
  KvFormat kv_format() const { return stages_.front()->kv_format(); }
  Status SetKvFormat(KvFormat format);
  int64_t PositionBytes(KvFormat format) const;
  // The last stage's MTP draft head (Model::SetDraftVocab).
  Status SetDraftVocab(int64_t tokens) {
    last().backend().MakeCurrent();
    return FirstCurrent(last().SetDraftVocab(tokens));
  }

 private:
  explicit PipelineRunner(std::vector<std::unique_ptr<Model>> stages);
  // Runs every stage in order over `rows`: step(stage, s) calls the stage's Runner method, once
  // its input rows and the place of its output rows are set. Each stage's residual stream goes
  // to the next through host memory (the hand-off, this function's alone: peer copies or NCCL
  // would replace it here).
  template <typename StageStep>
  Status Forward(const Rows& rows, StageStep step);
  // Calls `f` on every stage in order, its device current.
  template <typename F>
  Status ForEach(F f);
  // Makes the first stage's device current again (after every call that made another's), so
  // that what runs beside the model on the first stage's backend (a vision tower) finds it.
  Status FirstCurrent(Status status);

  std::vector<std::unique_ptr<Model>> stages_;
  std::vector<CacheSpec> caches_;
  // The residual stream handed from stage s to s + 1, [rows, dim] floats each.
  std::vector<std::vector<float>> hand_off_;
};

// The layer bounds of `stages` consecutive stages of a model of `layers` layers: stages + 1
// numbers from 0 to `layers`, stage s holding [bounds[s], bounds[s + 1]). `cuts` (empty: the
// layers split evenly, the first stages one more where they do not divide) gives each stage's
// first layer after stage 0's, ascending. Refuses more stages than layers.
Expected<std::vector<int>> PipelineBounds(int layers, int stages, std::span<const int> cuts = {});

// Loads `dir` as one stage on each of `backends` (in order), its layers split as PipelineBounds
// says; `options` as Model::Load takes them (first_layer and end_layer set per stage).
Expected<std::unique_ptr<PipelineRunner>> LoadPipeline(
    const std::string& dir, std::span<const std::shared_ptr<Backend>> backends,
    const LoadOptions& options = {}, std::span<const int> cuts = {});

}  // namespace gizllm
