// Runner: what the engine asks of a model. The engine (slots, pages, scheduling, sampling) is
// written against this interface and tested with a scripted fake; Model implements it on a
// backend.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <span>

#include "core/status.h"
#include "model/arch.h"
#include "model/rows.h"
#include "ops/backend.h"

namespace gizllm {

// The page tables of every slot for one step, in host memory.
struct PageTables {
  const int32_t* pages = nullptr;  // [slots, max_pages]: page index of block p of slot s
  int32_t slots = 0;
  int32_t max_pages = 0;
  // With window paging (Runner::AllocatePages): the window layers' tables, one per window group
  // (KvPaging), [window_groups, slots, max_pages]. A block wholly before the window of every row
  // the slot reads next may be a hole (-1): no op reads it.
  const int32_t* window_pages = nullptr;
};

// The cache one layer keeps for each sequence. An attention layer: KV pages of kPage positions,
// of this head shape and format (a sliding-window layer reads only the last `window` positions
// of its pages). A recurrent layer: no pages, a state per slot of `state_floats` float32 values
// (the convolution's tail and the delta rule's matrices), which holds what the slot read up to
// its last position only: it cannot be cut back to an earlier position, only replaced by its
// snapshot (Runner::SaveSlotState), which takes as many bytes again.
struct CacheSpec {
  LayerKind kind = LayerKind::kAttention;
  int kv_heads = 0;
  int head_dim = 0;
  int32_t window = 0;  // 0: every position
  KvFormat format = KvFormat::kF32;
  int64_t state_floats = 0;  // kRecurrent
  // kRecurrent: floats of one row's inputs to the state update, which a runner that reads drafts
  // keeps for every row of a step (Runner::ReserveDrafts).
  int64_t row_input_floats = 0;
  // Bytes of one page: keys and values (and their scales); 0 for a recurrent layer.
  int64_t PageBytes() const {
    if (kind != LayerKind::kAttention) return 0;
    return static_cast<int64_t>(kPage) * kv_heads *
           (KvKeyBytes(format, head_dim) + KvValueBytes(format, head_dim) +
            2 * KvFormatScaleBytes(format, head_dim));
  }
  // Bytes of one slot's state; 0 for an attention layer.
  int64_t SlotStateBytes() const {
    return kind == LayerKind::kRecurrent ? state_floats * static_cast<int64_t>(sizeof(float)) : 0;
  }
  // Bytes of one row's kept inputs (drafts); 0 for an attention layer.
  int64_t RowInputBytes() const {
    return kind == LayerKind::kRecurrent ? row_input_floats * static_cast<int64_t>(sizeof(float))
                                         : 0;
  }
};

// Whether any of `caches` keeps a per-slot state (a recurrent layer): a slot can then continue
// only from the last position it read, and a prefix held in pages alone cannot be resumed.
inline bool HasSlotStates(std::span<const CacheSpec> caches) {
  for (const CacheSpec& c : caches) {
    if (c.kind == LayerKind::kRecurrent) return true;
  }
  return false;
}

// How a pool page is shared among the attention layers under window paging, where the layers
// with a window keep only the pages their window still needs. A pool page holds kPage positions of
// `regions` layers, one region each: each layer without a window has a region of its own and
// reads PageTables::pages (every position); the layers with a window, taken in order, fill the
// regions again `regions` at a time, each such group reading a table of its own
// (PageTables::window_pages, only the last `window` positions held). A slot then holds 1 +
// window_groups pages a block while its window layers need it, and 1 after. It applies where a
// model has layers with and without a window, all of one page size (kv heads, head dim, format).
struct KvPaging {
  int32_t window = 0;         // the widest window of a window layer
  int32_t regions = 0;        // layers a pool page holds: those without a window
  int32_t window_groups = 0;  // page tables of the window layers; 0: no window paging
  int64_t page_bytes = 0;     // bytes of one pool page: regions layers' pages
  bool enabled() const { return window_groups > 0; }
};

inline KvPaging KvPagingOf(std::span<const CacheSpec> caches) {
  int32_t full = 0, windowed = 0, window = 0;
  int64_t bytes = -1;
  for (const CacheSpec& c : caches) {
    if (c.kind != LayerKind::kAttention) continue;
    if (bytes >= 0 && c.PageBytes() != bytes) return {};
    bytes = c.PageBytes();
    if (c.window > 0) {
      ++windowed;
      window = std::max(window, c.window);
    } else {
      ++full;
    }
  }
  if (full == 0 || windowed == 0) return {};
  return {window, full, (windowed + full - 1) / full, full * bytes};
}

// A slot whose states go back to those after its first `rows` rows of the last step
// (Runner::KeepDraftRowsOf).
struct KeptDraftRows {
  int32_t slot = 0;
  int64_t rows = 0;
};

class Runner {
 public:
  virtual ~Runner() = default;
  virtual const Arch& arch() const = 0;
  // Each layer's cache (one per layer, then one for the MTP layer where the model has one);
  // PageBytes is the sum of theirs.
  virtual std::span<const CacheSpec> caches() const { return {}; }

  // Bytes one KV page (kPage positions of every attention layer, the MTP layer's included, keys
  // and values) takes.
  virtual int64_t PageBytes() const = 0;
  // The counts of the expert cache the runner's experts go through (slots 0: none).
  virtual ExpertCacheStats ExpertCache() const { return {}; }
  // (Re)creates the KV pool with `pages` pages; earlier contents are lost. A page holds every
  // attention layer (PageBytes), or with `window_paging` (where KvPagingOf(caches()) is enabled)
  // KvPaging::page_bytes, and Step then reads the window layers' pages from
  // PageTables::window_pages.
  virtual Status AllocatePages(int32_t pages, bool window_paging) = 0;
  // Whether AllocatePages takes `window_paging` where KvPagingOf(caches()) allows it; a runner
  // that does not (a pipeline's stages) pages every layer at every position.
  virtual bool PagesWindows() const { return true; }
  Status AllocatePages(int32_t pages) { return AllocatePages(pages, /*window_paging=*/false); }
  // The most rows one Step may read; buffers are sized for it once, not per step.
  virtual Status Reserve(int64_t rows, int32_t slots, int32_t max_pages) = 0;

  // Reads `rows` (writing their keys and values into their slots' pages) and writes the logits
  // of the wanted rows: logits [rows.wanted.size(), vocab], host memory.
  virtual Status Step(const Rows& rows, const PageTables& tables, float* logits) = 0;

  // Like Step, and writes every row's final-normed hidden state (the last layer's output after
  // the final norm, what the head and the MTP layer read): hidden [rows.size(), dim], host memory.
  virtual Status StepHidden(const Rows& rows, const PageTables& tables, float* logits,
                            float* hidden) {
    (void)rows, (void)tables, (void)logits, (void)hidden;
    return Unimplemented("this runner gives no hidden states with its logits");
  }

  // Whether the model has a multi-token prediction layer (MtpStep).
  virtual bool HasMtp() const { return false; }
  // The multi-token prediction layer over `rows` (vLLM's reading of Qwen3-Next and Qwen3.5):
  // row r at position p reads rows.tokens[r], the token at p + 1, and hidden[r] ([rows, dim],
  // host memory), the model's final-normed hidden state at p (StepHidden), or for a chained draft
  // the normed output of the MTP row at p - 1. The row's keys and values go into the MTP layer's
  // pages of its slot at p (the page tables of Step, which cover one more attention layer for it),
  // and it attends to the slot's MTP keys and values at positions up to p, rotated as at p.
  // Writes normed [rows, dim] (the rows' outputs after the MTP layer's norm; null: not written)
  // and logits [rows.wanted.size(), vocab] (the wanted rows', predicting the token at p + 2).
  virtual Status MtpStep(const Rows& rows, const PageTables& tables, const float* hidden,
                         float* normed, float* logits) {
    (void)rows, (void)tables, (void)hidden, (void)normed, (void)logits;
    return Unimplemented("this runner has no MTP layer");
  }

  // MTP drafts from hidden states that stay where the model computes them. After KeepHidden,
  // every Step and StepSample also keeps each row's final-normed hidden state (StepHidden's),
  // until the next step.
  virtual Status KeepHidden() { return Unimplemented("this runner has no MTP layer"); }
  // Drafts of the MTP layer. Its rows `rows` as MtpStep reads them, each row's hidden state
  // taken where the last Step kept it (sources[r]: a row of that step), write their keys and
  // values; each wanted row's pick (the largest logit, lowest id among equals) is its first
  // draft. Then `chained` more drafts a wanted row, each from a row at the next position that
  // reads the draft before it and the MTP layer's output at the row before (whose keys and values
  // go into the slot's pages there: the tables must map those positions). Writes tokens
  // [rows.wanted.size(), 1 + chained], host memory. Its ops may be recorded and replayed as a
  // step's.
  virtual Status MtpDraft(const Rows& rows, const PageTables& tables,
                          std::span<const int32_t> sources, int32_t chained, int32_t* tokens) {
    (void)rows, (void)tables, (void)sources, (void)chained, (void)tokens;
    return Unimplemented("this runner has no MTP layer");
  }

  // Block drafts (model/block_drafter.h): after KeepFeatures(layers), every Step and StepSample
  // also copies each row's hidden states after those layers (numbered as Hidden numbers them) to
  // host memory, which Features() gives until the next step: [layers.size(), rows, dim]. Steps
  // that keep features are not recorded for replay.
  virtual Status KeepFeatures(std::span<const int> layers) {
    (void)layers;
    return Unimplemented("this runner keeps no hidden states of its steps");
  }
  virtual const float* Features() const { return nullptr; }
  // The token embedding (times the family's embed scale) of `tokens`: out [tokens, dim], host
  // memory; and the head alone (no final norm) over host rows x [rows, dim]: logits [rows, vocab].
  // For a drafter that reads the target's embedding and head.
  virtual Status EmbedTokens(std::span<const int32_t> tokens, float* out) {
    (void)tokens, (void)out;
    return Unimplemented("this runner does not embed tokens alone");
  }
  virtual Status HeadLogits(const float* x, int64_t rows, float* logits) {
    (void)x, (void)rows, (void)logits;
    return Unimplemented("this runner does not run its head alone");
  }

  // Whether StepSample can pick the tokens where the logits are (on the device), so that only
  // token ids come back instead of [wanted, vocab] logits.
  virtual bool CanSample() const { return false; }
  // The masks of allowed tokens of a step's rows whose SampleRow::mask >= 0 (a grammar's), in
  // host memory: [those rows, MaskWords(vocab)] words, row SampleRow::mask of each. StepSample
  // calls it once, after it has issued the step's layers and before it picks, so that the masks
  // may be computed while the layers run; it blocks until they are ready.
  using SampleMasks = std::function<std::span<const uint64_t>()>;
  // Like Step, but picks the token of each wanted row under params[w] (sampling/sampling.h's
  // steps 2b-5: no penalties, no logprobs; a row with a mask only among the tokens it allows):
  // tokens [rows.wanted.size()], host memory, each a token or kNonFiniteToken or kNoAllowedToken.
  // masks: called only where a row has a mask.
  virtual Status StepSample(const Rows& rows, const PageTables& tables,
                            std::span<const SampleRow> params, const SampleMasks& masks,
                            int32_t* tokens) {
    (void)rows, (void)tables, (void)params, (void)masks, (void)tokens;
    return Unimplemented("this runner picks no tokens itself");
  }

  // Like Step, but writes the residual stream after each layer in `layers` (0 = embeddings,
  // l = after layer l, as Hugging Face's hidden_states[l]; layers + 1 = the last layer's after
  // the final norm, transformers' last_hidden_state): out [layers.size(), rows, dim].
  virtual Status Hidden(const Rows& rows, const PageTables& tables, std::span<const int> layers,
                        float* out) = 0;

  // The per-slot states' snapshots (recurrent layers; HasSlotStates): one a slot, which
  // SaveSlotState overwrites with the slot's states and RestoreSlotState copies back. A runner
  // without states keeps none.
  virtual Status SaveSlotState(int32_t slot) {
    (void)slot;
    return Status::Ok();
  }
  virtual Status RestoreSlotState(int32_t slot) {
    (void)slot;
    return Status::Ok();
  }
  // A slot's states, or their snapshot (`saved`), copied to host memory, and host memory copied
  // into a slot's states: SlotStatesBytes() bytes, layer by layer (a stored prefix keeps them
  // beside its pages). Runners without states hold none.
  virtual int64_t SlotStatesBytes() const { return 0; }
  virtual Status CopySlotStatesToHost(int32_t slot, bool saved, void* host) {
    (void)slot, (void)saved, (void)host;
    return Status::Ok();
  }
  virtual Status CopySlotStatesFromHost(int32_t slot, const void* host) {
    (void)slot, (void)host;
    return Status::Ok();
  }

  // Draft rows on a runner with slot states, which cannot go back to a row inside a step. Once
  // ReserveDrafts is called (before the steps, beside Reserve), every step keeps each row's
  // inputs to the recurrent layers' state updates, and a second snapshot a slot holds the
  // states from before a step whose last rows of the slot are drafts (SnapshotDraftState,
  // called before that step; apart from SaveSlotState's). After the step, KeepDraftRows(slot,
  // rows) makes the slot's states those after its first `rows` rows of the step: the snapshot
  // back, then the state updates of those rows again from their kept inputs (no projections,
  // no attention, no KV written). Runners without states keep none.
  virtual Status ReserveDrafts() { return Status::Ok(); }
  virtual Status SnapshotDraftState(int32_t slot) {
    (void)slot;
    return Status::Ok();
  }
  virtual Status KeepDraftRows(int32_t slot, int64_t rows) {
    (void)slot, (void)rows;
    return Status::Ok();
  }
  // The same for many slots of one step at once (each slot at most once): the snapshots of
  // adjacent slots are copied together and the kept rows of every slot replayed in one pass,
  // where a runner can (a step of many sequences with drafts otherwise pays a few copies and
  // launches a slot and layer).
  virtual Status SnapshotDraftStates(std::span<const int32_t> slots) {
    for (int32_t slot : slots) GZ_RETURN_IF_ERROR(SnapshotDraftState(slot));
    return Status::Ok();
  }
  virtual Status KeepDraftRowsOf(std::span<const KeptDraftRows> kept) {
    for (const KeptDraftRows& k : kept) GZ_RETURN_IF_ERROR(KeepDraftRows(k.slot, k.rows));
    return Status::Ok();
  }

  // Whether the KV pool is itself in host memory (a CPU backend). A host copy of a page then
  // holds the same bytes in the same memory twice, so the engine keeps none by default.
  virtual bool PagesInHostMemory() const { return false; }
  // Copies one page between the KV pool and host memory (PageBytes() bytes, or with window
  // paging KvPaging::page_bytes), for prefixes kept on the host when the pool is full.
  virtual Status CopyPageToHost(int32_t page, void* host) = 0;
  virtual Status CopyPageFromHost(int32_t page, const void* host) = 0;
  // The backend whose memory a step's VisualRows::sources lie in (a picture's rows kept where
  // the tower ran, or uploaded once a request); nullptr: the runner reads host rows only.
  virtual Backend* StepBackend() { return nullptr; }
};

}  // namespace gizllm
