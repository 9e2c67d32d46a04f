// The expert cache's slot policy: which of a bounded set of slots holds which expert, least
// recently used evicted. Pure host bookkeeping (no device memory): the CUDA backend keeps one for
// the slots of device memory that hold the experts of a model whose experts do not all fit, and
// reads an expert into its slot on a miss (backend/cuda/cuda_backend.cu).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

namespace gizllm {

// What an expert cache counted: its slots, the experts a step found in them (hits) and read into
// them (misses), and the milliseconds the reads took.
struct ExpertCacheStats {
  int64_t slots = 0;  // 0: no cache (every expert resident)
  int64_t hits = 0;
  int64_t misses = 0;
  double read_ms = 0.0;
  double HitRate() const {
    const int64_t n = hits + misses;
    return n > 0 ? static_cast<double>(hits) / n : 0.0;
  }
};

// `slots` slots, each holding at most one expert, an expert named by a key (any 64-bit value
// unique per expert). Use: Begin() a group of experts that must be resident together (one
// expert kernel launch), Acquire() each of them, then launch; the experts acquired since the last
// Begin() are pinned: none of them is evicted before the next Begin().
class ExpertSlots {
 public:
  explicit ExpertSlots(int64_t slots);

  // Starts a new group: the experts of the last one may be evicted again.
  void Begin() { ++group_; }

  struct Place {
    int32_t slot = 0;
    bool hit = false;  // held already; else the slot's old expert was evicted and `key` must be
                       // read into it
  };
  // The slot of `key`, pinned in this group: its own where it is held (a hit), else the least
  // recently used slot outside this group (its expert forgotten). None where every slot is
  // pinned (the group needs more slots than there are); nothing changes then.
  std::optional<Place> Acquire(uint64_t key);

  int64_t slots() const { return static_cast<int64_t>(key_.size()); }
  int64_t hits() const { return hits_; }
  int64_t misses() const { return misses_; }
  // Whether `key` is held (tests).
  bool Holds(uint64_t key) const { return slot_of_.count(key) > 0; }

 private:
  std::vector<uint64_t> key_;       // [slots] the expert held
  std::vector<bool> held_;          // [slots] whether key_ is valid
  std::vector<uint64_t> last_use_;  // [slots] the clock at its last Acquire
  std::vector<uint64_t> group_of_;  // [slots] the group of its last Acquire
  std::unordered_map<uint64_t, int32_t> slot_of_;
  uint64_t clock_ = 0;
  uint64_t group_ = 1;
  int64_t hits_ = 0;
  int64_t misses_ = 0;
};

// memcpy on up to kCopyThreads threads (this one and helpers it starts), a piece of at least
// kCopyPiece bytes each: an expert's read from the page cache into pinned staging is bound by one
// core's copy rate, well below the host-to-device link's.
inline constexpr int kCopyThreads = 4;
inline constexpr size_t kCopyPiece = size_t{1} << 20;
void CopyOnThreads(void* to, const void* from, size_t bytes);

}  // namespace gizllm
