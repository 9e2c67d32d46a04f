#include "ops/expert_cache.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "core/check.h"

namespace gizllm {

ExpertSlots::ExpertSlots(int64_t slots)
    : key_(slots, 0), held_(slots, false), last_use_(slots, 0), group_of_(slots, 0) {
  CHECK(slots > 0);
}

std::optional<ExpertSlots::Place> ExpertSlots::Acquire(uint64_t key) {
  if (auto it = slot_of_.find(key); it != slot_of_.end()) {
    const int32_t s = it->second;
    last_use_[s] = ++clock_;
    group_of_[s] = group_;
    ++hits_;
    return Place{s, /*hit=*/true};
  }
  // The least recently used slot outside this group; an empty slot before any held one (the
  // lowest index first among equals, so that the choice does not depend on the map's order).
  int32_t best = -1;
  for (int32_t s = 0; s < static_cast<int32_t>(key_.size()); ++s) {
    if (group_of_[s] == group_) continue;
    if (best < 0 || (!held_[s] && held_[best]) ||
        (held_[s] == held_[best] && last_use_[s] < last_use_[best]))
      best = s;
  }
  if (best < 0) return std::nullopt;
  if (held_[best]) slot_of_.erase(key_[best]);
  key_[best] = key;
  held_[best] = true;
  slot_of_[key] = best;
  last_use_[best] = ++clock_;
  group_of_[best] = group_;
  ++misses_;
  return Place{best, /*hit=*/false};
}

void CopyOnThreads(void* to, const void* from, size_t bytes) {
  auto* out = static_cast<uint8_t*>(to);
  const auto* in = static_cast<const uint8_t*>(from);
  const size_t threads = std::min<size_t>(kCopyThreads, bytes / kCopyPiece);
  if (threads <= 1) {
    std::memcpy(out, in, bytes);
    return;
  }
  // Shares of whole pages, the last one shorter.
  const size_t share = ((bytes + threads - 1) / threads + 4095) / 4096 * 4096;
  std::vector<std::thread> helpers;
  for (size_t t = 1; t < threads && t * share < bytes; ++t) {
    const size_t n = std::min(share, bytes - t * share);
    helpers.emplace_back([=] { std::memcpy(out + t * share, in + t * share, n); });
  }
  std::memcpy(out, in, std::min(share, bytes));
  for (std::thread& h : helpers) h.join();
}

}  // namespace gizllm
