// PagePool: which KV pages are in use and by how many holders (slots, stored prefixes, shared
// starts). Pages are indices into the runner's KV pool; free pages sit on a free list.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "core/check.h"
#include "ops/backend.h"

namespace gizllm {

// Pages that hold `positions` positions.
inline int32_t PagesFor(int64_t positions) {
  return static_cast<int32_t>((positions + kPage - 1) / kPage);
}

// Window paging (model/runner.h KvPaging): a holder of positions [0, held) keeps its window
// layers' pages from this block on, the block of the first position row `held` sees less one,
// so that a start up to kPage positions shorter (a chat's next prompt often renders the end of
// the last turn anew) can still be continued. The blocks before it are holes (-1).
inline int32_t WindowFirstBlock(int64_t held, int32_t window) {
  return static_cast<int32_t>(
      std::max<int64_t>(0, std::max<int64_t>(0, held - window + 1) / kPage - 1));
}

// Whether window pages from block `first` on hold every position row `length` sees (what a
// holder must keep for a slot to continue from `length`).
inline bool WindowCovers(int32_t first, int64_t length, int32_t window) {
  return static_cast<int64_t>(first) * kPage <= std::max<int64_t>(0, length - window + 1);
}

// The window pages a slot holds at most while it reads `rows` rows a step: from the block of
// WindowFirstBlock(held) to the block of its last row.
inline int32_t WindowBlocks(int32_t window, int64_t rows) { return PagesFor(window + rows) + 2; }

// The first block of `window_pages` ([blocks, groups], holes first) that holds pages; the
// block count when none does; 0 without window groups.
inline int32_t FirstHeldBlock(const std::vector<int32_t>& window_pages, int32_t groups) {
  if (groups == 0) return 0;
  size_t i = 0;
  while (i < window_pages.size() && window_pages[i] < 0) ++i;
  return static_cast<int32_t>(i / groups);
}

class PagePool {
 public:
  explicit PagePool(int32_t pages) : refs_(pages, 0) {
    free_.reserve(pages);
    // Lowest index on top of the stack: pages are handed out in ascending order at first.
    for (int32_t p = pages - 1; p >= 0; --p) free_.push_back(p);
  }

  int32_t pages() const { return static_cast<int32_t>(refs_.size()); }
  int32_t free() const { return static_cast<int32_t>(free_.size()); }
  int32_t refs(int32_t page) const { return refs_[page]; }
  const std::vector<int32_t>& free_list() const { return free_; }

  // A free page with one reference, or none when the pool is full.
  std::optional<int32_t> Allocate() {
    if (free_.empty()) return std::nullopt;
    const int32_t page = free_.back();
    free_.pop_back();
    DCHECK(refs_[page] == 0);
    refs_[page] = 1;
    return page;
  }

  // Call only on a page in use.
  void Retain(int32_t page) {
    CHECK(refs_[page] > 0);
    ++refs_[page];
  }

  // Drops one reference; the page is free again when none remain.
  void Release(int32_t page) {
    CHECK(refs_[page] > 0);
    if (--refs_[page] == 0) free_.push_back(page);
  }

  // Releases the first `end` entries of `pages` (holes, -1, skipped) and makes them holes.
  void ReleaseFront(std::vector<int32_t>& pages, size_t end) {
    for (size_t i = 0; i < std::min(end, pages.size()); ++i) {
      if (pages[i] >= 0) Release(pages[i]);
      pages[i] = -1;
    }
  }

  // Releases the pages of `pages` (holes, -1, skipped) and clears it.
  void ReleaseAll(std::vector<int32_t>& pages) {
    for (int32_t p : pages) {
      if (p >= 0) Release(p);
    }
    pages.clear();
  }

 private:
  std::vector<int32_t> refs_;  // [pages] holders of each page; 0: on the free list
  std::vector<int32_t> free_;  // free page indices, used as a stack
};

}  // namespace gizllm
