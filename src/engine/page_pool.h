// PagePool: which KV pages are in use and by how many holders (slots, stored prefixes, shared
// starts). Pages are indices into the runner's KV pool; free pages sit on a free list.
#pragma once

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

 private:
  std::vector<int32_t> refs_;  // [pages] holders of each page; 0: on the free list
  std::vector<int32_t> free_;  // free page indices, used as a stack
};

}  // namespace gizllm
