// Model: an Arch, its weights on a backend, and the forward pass written once over the ops of
// src/ops/backend.h. It implements Runner, the interface the engine drives.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/arch.h"
#include "model/runner.h"
#include "model/weights.h"
#include "ops/backend.h"

namespace gizllm {

struct StepInputs;  // model/blocks.h

struct LoadOptions {
  int layers = -1;  // read only the first N layers (-1: all)
  // Element type of the KV pages; none: the backend's DefaultKvFormat() (CUDA: f16, f32 in exact
  // mode; CPU: f32).
  std::optional<KvFormat> kv;
  // Expert slots of the backend's expert cache for the whole model (mixture-of-experts models on
  // a backend with one, Backend::SupportsExpertCache: CUDA). 0: every expert on the device where
  // they all fit, else a cache of as many slots as fit beside a reserve (kExpertCacheReserve);
  // N: a cache of N slots, unless N holds every expert (then all are placed). At least the
  // largest top k of a layer.
  int64_t expert_cache = 0;
  // A pipeline stage (model/pipeline_runner.h): the layers [first_layer, end_layer) only (-1:
  // to the last layer read). A stage whose first layer is not 0 reads its rows' residual stream
  // from the stage before it (Model::SetStageRows) instead of the embedding; one whose end is
  // not the last layer writes its residual stream out instead of the final norm and the head
  // (and loads neither, nor the MTP layer). Other layers' weights are left in the file.
  int first_layer = 0;
  int end_layer = -1;
  Status Check() const;
};

// The device memory an expert cache sized by default leaves free for the KV pages and the
// steps' buffers: this share of the device's memory, at least kExpertCacheMinReserve bytes.
inline constexpr double kExpertCacheReserve = 0.2;
inline constexpr int64_t kExpertCacheMinReserve = int64_t{4} << 30;

class Model final : public Runner {
 public:
  // Reads dir (config.json, safetensors) and places the weights on `backend`.
  static Expected<std::unique_ptr<Model>> Load(const std::string& dir,
                                               std::shared_ptr<Backend> backend,
                                               const LoadOptions& options = {});
  ~Model() override;
  // The layers Load reads of `dir` with LoadOptions::layers `layers` (-1: all it holds), without
  // loading any (the count a pipeline's stages are cut from).
  static Expected<int> Layers(const std::string& dir, Backend& backend, int layers = -1);

  const Arch& arch() const override { return arch_; }
  const std::string& dir() const { return dir_; }
  Backend& backend() { return *backend_; }
  // The backend, for what runs beside the model on it (a vision tower).
  std::shared_ptr<Backend> shared_backend() const { return backend_; }
  int64_t Parameters() const;  // every tensor loaded, the MTP layer's included
  // The multi-token prediction layer's tensors (Arch::mtp_prefix), run by MtpStep (a model cut
  // by LoadOptions::layers loads none of them).
  int64_t MtpTensors() const;
  int64_t MtpParameters() const;
  // Tensors under Arch::skipped_prefixes (a vision tower) the checkpoint holds and the model
  // does not load.
  int64_t SkippedTensors() const;
  int64_t WeightBytes() const;
  const std::vector<WeightSummary>& weights() const;
  ExpertCacheStats ExpertCache() const override { return backend_->ExpertCache(); }
  std::span<const CacheSpec> caches() const override { return caches_; }

  KvFormat kv_format() const { return kv_format_; }
  // Bytes one position of every attention layer takes in pages of `format`.
  int64_t PositionBytes(KvFormat format) const;
  // Changes the KV pages' format before the pool is allocated (AllocatePages); refused after, or
  // for a format the backend has no kernels for.
  Status SetKvFormat(KvFormat format);
  int64_t PageBytes() const override;
  using Runner::AllocatePages;
  Status AllocatePages(int32_t pages, bool window_paging) override;
  Status Reserve(int64_t rows, int32_t slots, int32_t max_pages) override;
  Status Step(const Rows& rows, const PageTables& tables, float* logits) override;
  Status StepHidden(const Rows& rows, const PageTables& tables, float* logits,
                    float* hidden) override;
  bool HasMtp() const override;
  Status MtpStep(const Rows& rows, const PageTables& tables, const float* hidden, float* normed,
                 float* logits) override;
  Status KeepHidden() override;
  Status KeepFeatures(std::span<const int> layers) override;
  const float* Features() const override;
  Status EmbedTokens(std::span<const int32_t> tokens, float* out) override;
  Status HeadLogits(const float* x, int64_t rows, float* logits) override;
  Status MtpDraft(const Rows& rows, const PageTables& tables, std::span<const int32_t> sources,
                  int32_t chained, int32_t* tokens) override;
  // FR-Spec: MtpDraft's head computes the logits of the first `tokens` token ids only (for a
  // BPE vocabulary, those merged first: the most frequent), so its drafts are among them and
  // each costs that share of the head; the vocabulary's size: the whole head again.
  Status SetDraftVocab(int64_t tokens);
  // The most chained drafts MtpDraft makes after a wanted row's first.
  static constexpr int32_t kMaxMtpChain = 16;
  bool CanSample() const override;
  bool PagesInHostMemory() const override;
  Status StepSample(const Rows& rows, const PageTables& tables, std::span<const SampleRow> params,
                    const SampleMasks& masks, int32_t* tokens) override;
  Status Hidden(const Rows& rows, const PageTables& tables, std::span<const int> layers,
                float* out) override;
  Status SaveSlotState(int32_t slot) override;
  Status RestoreSlotState(int32_t slot) override;
  int64_t SlotStatesBytes() const override;
  Status CopySlotStatesToHost(int32_t slot, bool saved, void* host) override;
  Status CopySlotStatesFromHost(int32_t slot, const void* host) override;
  Status ReserveDrafts() override;
  Status SnapshotDraftState(int32_t slot) override;
  Status KeepDraftRows(int32_t slot, int64_t rows) override;
  Status SnapshotDraftStates(std::span<const int32_t> slots) override;
  Status KeepDraftRowsOf(std::span<const KeptDraftRows> kept) override;
  Status CopyPageToHost(int32_t page, void* host) override;
  Status CopyPageFromHost(int32_t page, const void* host) override;
  Backend* StepBackend() override { return backend_.get(); }

  // A pipeline stage's layers [first_layer(), end_layer()) (the whole model: 0 and
  // arch().layers); caches() lists theirs alone (and the MTP layer's on the last stage).
  int first_layer() const;
  int end_layer() const;
  bool first_stage() const { return first_layer() == 0; }
  bool last_stage() const { return end_layer() == arch_.layers; }
  // Where the steps of a pipeline stage find their rows' residual stream and leave theirs,
  // [rows, dim] float32 in host memory, until changed: a stage that is not the first reads
  // `in` (the stream after layer first_layer() - 1) in place of the embedding; one that is not
  // the last writes the stream after its last layer to `out` (and no logits, tokens or final
  // hidden states). Ignored by the first (in) and the last (out) stage.
  void SetStageRows(const float* in, float* out);

 private:
  struct Layer;
  struct Buffers;
  Model() = default;
  // Reads the rows; writes the hidden states asked for, and for the wanted rows either their
  // logits (to host `logits`) or, with `sample`, the tokens picked on the backend (the masks
  // of the rows with one taken from `masks` once the layers are issued).
  Status Forward(const Rows& rows, const PageTables& tables, std::span<const int> hidden_layers,
                 float* hidden_out, float* logits, std::span<const SampleRow> sample = {},
                 const SampleMasks* masks = nullptr, int32_t* tokens = nullptr);
  // recurrent_order: refuse rows of a slot that are not adjacent and at consecutive positions
  // (what recurrent layers need; the MTP layer does not).
  Status UploadStepInputs(const Rows& rows, const PageTables& tables, bool recurrent_order = true);
  // The MTP layer's parts (MtpStep, MtpDraft): a refusal of rows it cannot read; fc's row order
  // for n rows (into mtp_order, or `to`); the layer over n rows whose hidden states are in place
  // (mtp_in's second half), normed into `normed` (tokens, inputs, order: null, the step's
  // buffers); the head over `wanted` rows of `normed` (index: null, the step's wanted rows) into
  // the logits buffer.
  Status CheckMtpRows(const Rows& rows, const char* who) const;
  void UploadMtpOrder(int64_t n, Buffer* to = nullptr);
  void IssueMtpLayer(int64_t n, float* normed, const int32_t* tokens = nullptr,
                     const StepInputs* inputs = nullptr, const int32_t* order = nullptr);
  void IssueMtpHead(const float* normed, int64_t wanted, const int32_t* index = nullptr,
                    const Weight* head = nullptr);
  // Loads the MTP layer (Arch::mtp_prefix) and appends its cache to caches_.
  Status LoadMtp();
  // The mixture-of-experts layers' experts, which `w` kept on the host: placed on the backend,
  // or read through its expert cache (LoadOptions::expert_cache, `asked` slots).
  Status PlaceExperts(WeightLoader& w, int64_t asked);
  // Copies one page between the pool and the host, region by region (a layer's, or under window
  // paging the layers that share it).
  Status CopyPage(int32_t page, void* host, bool to_host);
  // Copies slot `slot`'s recurrent states from the buffer `from` to `to` (each laid out as the
  // states: the live ones, the mark's snapshot or the drafts').
  // Each recurrent layer's part of slot `slot` in a buffer laid out as the states: `part(at,
  // floats)` with its offset in floats from the buffer's start, conv state then delta state.
  Status ForEachSlotStatePart(int32_t slot, const char* who,
                              const std::function<void(int64_t at, int64_t floats)>& part);
  Status CopySlotState(int32_t slot, float* from, float* to, const char* who);
  // The states of `slots` (ascending, distinct, in range) from `from` to `to`: one copy a
  // layer's part for each run of adjacent slots.
  void CopySlotRuns(std::span<const int32_t> slots, float* from, float* to);
  // One slot's parts of the buffer laid out as the states (`buffer`) to or from `host`.
  Status CopySlotStatesHost(int32_t slot, float* buffer, uint8_t* host, bool to_host,
                            const char* who);

  std::string dir_;
  Arch arch_;
  std::shared_ptr<Backend> backend_;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  KvFormat kv_format_ = KvFormat::kF32;
  std::vector<CacheSpec> caches_;
};

}  // namespace gizllm
