// FakeRunner: a deterministic stand-in for a model. Each KV position stores its token and a
// chain hash of every token before it; a row's logits are a hash of its whole history read back
// through the page table, so a wrong page, a stale page or a page written by another slot
// changes the tokens (or fails the step when the chain does not add up).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "model/runner.h"
#include "ops/backend.h"
#include "sampling/sampling.h"

namespace gizllm {

class FakeRunner : public Runner {
 public:
  explicit FakeRunner(int64_t vocab = 64, int64_t dim = 4, int layers = 2) {
    arch_.family = "fake";
    arch_.vocab = vocab;
    arch_.dim = dim;
    arch_.layers = layers;
    arch_.layer.assign(layers, LayerSpec{});
    arch_.context = 4096;
    arch_.eos = {1};
  }

  const Arch& arch() const override { return arch_; }
  int64_t PageBytes() const override { return kPage * sizeof(Entry); }

  // Makes the fake a model with one layer without a window and `groups` layers with a window of
  // `window` positions (model/runner.h KvPaging): under window paging every row's entry is also
  // written through each window table, and every row reads the window positions it sees back
  // through them (a hole there, or another history's entry, fails the step).
  void SetWindow(int32_t window, int32_t groups) {
    window_ = window;
    caches_.assign(1, CacheSpec{LayerKind::kAttention, 1, kEntryDims, 0, KvFormat::kF32});
    for (int32_t g = 0; g < groups; ++g) {
      caches_.push_back({LayerKind::kAttention, 1, kEntryDims, window, KvFormat::kF32});
    }
  }
  std::span<const CacheSpec> caches() const override { return caches_; }

  // More pages than this fail to allocate, as a pool beyond the device's memory would.
  int64_t max_pool_pages = int64_t{1} << 24;
  Status AllocatePages(int32_t pages, bool window_paging) override {
    if (pages > max_pool_pages) {
      return ResourceExhausted("fake: cannot allocate " + std::to_string(pages) + " pages");
    }
    if (window_paging && !KvPagingOf(caches_).enabled()) return Internal("fake: no window layers");
    pool_.assign(static_cast<size_t>(pages) * kPage, Entry{});
    pages_ = pages;
    window_paging_ = window_paging;
    return Status::Ok();
  }
  bool window_paging() const { return window_paging_; }
  Status Reserve(int64_t rows, int32_t slots, int32_t max_pages) override {
    rows_limit_ = rows;
    return Status::Ok();
  }

  // A wanted row that reads poison_token gets poison_value as the logit of one token (as a model
  // with a non-finite weight, or activations that overflow, would give).
  int32_t poison_token = -1;
  float poison_value = std::numeric_limits<float>::quiet_NaN();

  // With copy_period set, a wanted row at position p (p + 1 >= copy_period) adds copy_boost to
  // the logit of the token at position p + 1 - copy_period of its slot: the text tends to repeat
  // itself with that period, as a model that copies from its context does (lookup drafts are
  // then kept).
  int32_t copy_period = 0;
  float copy_boost = 6.0f;

  Status Step(const Rows& rows, const PageTables& tables, float* logits) override {
    std::vector<uint64_t> chains;
    GZ_RETURN_IF_ERROR(Read(rows, tables, &chains));
    for (size_t w = 0; w < rows.wanted.size(); ++w) {
      const uint64_t h = chains[rows.wanted[w]];
      for (int64_t v = 0; v < arch_.vocab; ++v) {
        logits[w * arch_.vocab + v] = Logit(h, v);
      }
      const int32_t from = rows.positions[rows.wanted[w]] + 1 - copy_period;
      if (copy_period > 0 && from >= 0) {
        Status status;
        const Entry* e = At(tables, rows.slots[rows.wanted[w]], from, &status);
        if (e == nullptr) return status;
        logits[w * arch_.vocab + e->token] += copy_boost;
      }
      if (rows.tokens[rows.wanted[w]] == poison_token) {
        logits[w * arch_.vocab + h % arch_.vocab] = poison_value;
      }
    }
    return Status::Ok();
  }

  // With picks_tokens set, the fake also picks tokens itself (as a device would), through the
  // host Sampler from the SampleRow alone: a wrong seed, index or parameter changes the tokens.
  bool picks_tokens = false;
  int64_t sampled_rows = 0;  // wanted rows whose token the fake picked
  bool CanSample() const override { return picks_tokens; }
  // With pages_on_host set, the fake says its pool is host memory (a CPU backend).
  bool pages_on_host = false;
  bool PagesInHostMemory() const override { return pages_on_host; }
  int64_t masked_rows = 0;  // of them, rows picked under a mask
  Status StepSample(const Rows& rows, const PageTables& tables, std::span<const SampleRow> params,
                    const SampleMasks& masks, int32_t* tokens) override {
    if (!picks_tokens) return Internal("fake: StepSample without picks_tokens");
    if (params.size() != rows.wanted.size()) return Internal("fake: one SampleRow per wanted row");
    std::vector<float> logits(rows.wanted.size() * arch_.vocab);
    GZ_RETURN_IF_ERROR(Step(rows, tables, logits.data()));
    // The masks only after the step, as a device runner takes them.
    std::span<const uint64_t> allowed;
    const int64_t words = MaskWords(arch_.vocab);
    for (const SampleRow& row : params) {
      if (row.mask < 0) continue;
      if (allowed.empty()) allowed = masks();
      if (static_cast<int64_t>(allowed.size()) < (row.mask + 1) * words)
        return Internal("fake: a SampleRow's mask outside the masks");
    }
    Sampler sampler(arch_.vocab);
    for (size_t w = 0; w < params.size(); ++w) {
      const SampleRow& row = params[w];
      tokens[w] = sampler.Sample(
          std::span<const float>(&logits[w * arch_.vocab], arch_.vocab), row,
          row.mask < 0 ? std::span<const uint64_t>() : allowed.subspan(row.mask * words, words));
      ++sampled_rows;
      masked_rows += row.mask >= 0;
    }
    return Status::Ok();
  }

  Status Hidden(const Rows& rows, const PageTables& tables, std::span<const int> layers,
                float* out) override {
    std::vector<uint64_t> chains;
    GZ_RETURN_IF_ERROR(Read(rows, tables, &chains));
    for (size_t l = 0; l < layers.size(); ++l) {
      for (int64_t r = 0; r < rows.size(); ++r) {
        for (int64_t d = 0; d < arch_.dim; ++d) {
          out[(l * rows.size() + r) * arch_.dim + d] = Logit(chains[r] + layers[l] * 1000, d);
        }
      }
    }
    return Status::Ok();
  }

  Status CopyPageToHost(int32_t page, void* host) override {
    if (page < 0 || page >= pages_) return Internal("fake: copy of page " + std::to_string(page));
    std::memcpy(host, &pool_[static_cast<size_t>(page) * kPage], PageBytes());
    return Status::Ok();
  }
  Status CopyPageFromHost(int32_t page, const void* host) override {
    if (page < 0 || page >= pages_) return Internal("fake: copy of page " + std::to_string(page));
    std::memcpy(&pool_[static_cast<size_t>(page) * kPage], host, PageBytes());
    return Status::Ok();
  }

  int64_t rows_read() const { return rows_read_; }
  int64_t steps() const { return steps_; }
  const std::vector<int64_t>& step_rows() const { return step_rows_; }  // rows of each step

  // The logit of token v after a history whose chain hash is h.
  static float Logit(uint64_t h, int64_t v) {
    uint64_t z = Mix(h ^ (static_cast<uint64_t>(v) * 0xD6E8FEB86659FD93ull));
    return static_cast<float>(z >> 40) * (8.0f / 16777216.0f) - 4.0f;
  }
  static uint64_t Chain(uint64_t before, int32_t token, int32_t position) {
    return Mix(before * 31 + static_cast<uint64_t>(token) * 0x9E3779B97F4A7C15ull + position) | 1;
  }

 private:
  struct Entry {
    int32_t token = -1;
    uint64_t chain = 0;  // 0: never written
  };
  // A CacheSpec of this head dim (one kv head, float32) takes as many bytes a page as the fake.
  static constexpr int kEntryDims = sizeof(Entry) / (2 * sizeof(float));
  static_assert(kEntryDims * 2 * sizeof(float) == sizeof(Entry));

  static uint64_t Mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

  // Position `position` of `slot` through PageTables::pages, or with group >= 0 through that
  // window group's table.
  Entry* At(const PageTables& tables, int32_t slot, int32_t position, Status* status,
            int32_t group = -1) {
    const int32_t block = position / kPage;
    if (slot < 0 || slot >= tables.slots || block >= tables.max_pages) {
      *status = Internal("fake: slot " + std::to_string(slot) + " position " +
                         std::to_string(position) + " outside the page tables");
      return nullptr;
    }
    const int32_t* table = group < 0 ? tables.pages
                                     : tables.window_pages + static_cast<int64_t>(group) *
                                                                 tables.slots * tables.max_pages;
    const int32_t page = table[slot * tables.max_pages + block];
    if (page < 0 || page >= pages_) {
      *status = Internal("fake: slot " + std::to_string(slot) + " position " +
                         std::to_string(position) + " has no page (" + std::to_string(page) + ")");
      return nullptr;
    }
    return &pool_[static_cast<size_t>(page) * kPage + position % kPage];
  }

  // Writes every row's entry, then checks every wanted row's whole history.
  Status Read(const Rows& rows, const PageTables& tables, std::vector<uint64_t>* chains) {
    if (rows.size() == 0 || rows.size() > rows_limit_) return Internal("fake: bad row count");
    if (window_paging_ && tables.window_pages == nullptr) {
      return Internal("fake: window paging without window page tables");
    }
    ++steps_;
    rows_read_ += rows.size();
    step_rows_.push_back(rows.size());
    chains->resize(rows.size());
    Status status;
    for (int64_t r = 0; r < rows.size(); ++r) {
      const int32_t slot = rows.slots[r];
      const int32_t position = rows.positions[r];
      uint64_t before = 0x5157;
      if (position > 0) {
        Entry* prev = At(tables, slot, position - 1, &status);
        if (prev == nullptr) return status;
        if (prev->chain == 0) return Internal("fake: reads an unwritten position");
        before = prev->chain;
      }
      Entry* e = At(tables, slot, position, &status);
      if (e == nullptr) return status;
      e->token = rows.tokens[r];
      e->chain = Chain(before, rows.tokens[r], position);
      (*chains)[r] = e->chain;
      for (int32_t g = 0; g < WindowGroups(tables); ++g) {
        Entry* w = At(tables, slot, position, &status, g);
        if (w == nullptr) return status;
        *w = *e;
      }
    }
    // Each row's window, through each window table, holds what the page table holds.
    for (int64_t r = 0; r < rows.size(); ++r) {
      for (int32_t g = 0; g < WindowGroups(tables); ++g) {
        for (int32_t p = std::max(0, rows.positions[r] - window_ + 1); p <= rows.positions[r];
             ++p) {
          const Entry* w = At(tables, rows.slots[r], p, &status, g);
          if (w == nullptr) return status;
          const Entry* e = At(tables, rows.slots[r], p, &status);
          if (e == nullptr) return status;
          if (w->chain == 0 || w->token != e->token || w->chain != e->chain) {
            return Internal("fake: slot " + std::to_string(rows.slots[r]) + " position " +
                            std::to_string(p) + " of window group " + std::to_string(g) +
                            " holds KV of another history");
          }
        }
      }
    }
    // The history a row attends to must be the one that wrote it, position by position.
    for (int32_t w : rows.wanted) {
      uint64_t h = 0x5157;
      for (int32_t p = 0; p <= rows.positions[w]; ++p) {
        Entry* e = At(tables, rows.slots[w], p, &status);
        if (e == nullptr) return status;
        h = Chain(h, e->token, p);
        if (h != e->chain) {
          return Internal("fake: slot " + std::to_string(rows.slots[w]) + " position " +
                          std::to_string(p) + " holds KV of another history");
        }
      }
    }
    return Status::Ok();
  }

  int32_t WindowGroups(const PageTables& tables) const {
    return window_paging_ && tables.window_pages != nullptr ? KvPagingOf(caches_).window_groups : 0;
  }

  Arch arch_;
  std::vector<CacheSpec> caches_;
  int32_t window_ = 0;
  bool window_paging_ = false;
  std::vector<Entry> pool_;  // [pages, kPage]
  int32_t pages_ = 0;
  int64_t rows_limit_ = 0;
  int64_t rows_read_ = 0;
  int64_t steps_ = 0;
  std::vector<int64_t> step_rows_;
};

}  // namespace gizllm
