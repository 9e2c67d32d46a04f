// PrefixCache: KV pages kept for prompts to come. A stored prefix is what a slot held when another
// request took it (its pages in the pool, or a host copy when the pool is short); a shared start is
// a start many prompts share, registered once a slot has read it, whose pages every slot whose
// prompt starts with it reads in place. Both go least recently used first when the pool or the
// host memory is short. The Engine owns one; the pages are counted in its PagePool.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "engine/page_pool.h"
#include "model/runner.h"

namespace gizllm {

class PrefixCache {
 public:
  // What a slot held when another request took it: pages in the pool or a host copy.
  struct Prefix {
    std::vector<int32_t> tokens;
    std::vector<int32_t> pages;  // in the pool; empty when on the host
    // Window paging: [pages.size(), window groups] as Slot::window_pages; empty on the host.
    std::vector<int32_t> window_pages;
    // [PagesFor(tokens) + (PagesFor(tokens) - window_first) * window groups, page_bytes] when on
    // the host: its blocks' pages, then the window pages of blocks window_first on.
    std::vector<uint8_t> host;
    int32_t window_first = 0;
    uint64_t used = 0;
    // A model with slot states (recurrent layers): the slot's states after its last token, and
    // where it had saved them at a chat's mark (`saved` tokens; 0: none) those too, on the host
    // (Runner::CopySlotStatesToHost). A request starts from the prefix only at one of those two
    // positions; they count against the states' limit.
    std::vector<uint8_t> states;
    int64_t saved = 0;
    std::vector<uint8_t> saved_states;
  };

  // A start many prompts share, read in place: its pages are whole and never written again.
  struct Shared {
    std::vector<int32_t> tokens;  // [pages.size() * kPage]
    std::vector<int32_t> pages;
    std::vector<int32_t> window_pages;  // as Slot::window_pages
    uint64_t used = 0;
    // A model with slot states: the states after its last token, on the host (counted against
    // the states' limit); a request starts from it only at its whole length.
    std::vector<uint8_t> states;
  };

  // Keeps at most 4 prefixes and 2 shared starts a slot, and host copies of at most
  // `host_bytes_limit` bytes, and slot states of at most `state_bytes_limit` bytes; counts the
  // pages it copies to the host in *host_copies.
  PrefixCache(PagePool* pool, Runner* runner, int64_t page_bytes, KvPaging paging,
              int64_t host_bytes_limit, int64_t state_bytes_limit, int32_t slots,
              int64_t* host_copies);

  // The longest start of `tokens` a holder of `pages` holding `held` can give without a slot
  // writing a page another holds, and whose window pages (from block `window_first` on) hold
  // what the next row sees; `shared`: the holder's pages are a shared start's.
  int64_t Usable(const std::vector<int32_t>& pages, int32_t window_first,
                 const std::vector<int32_t>& held, const std::vector<int32_t>& tokens,
                 bool shared) const;
  // The stored prefix, then the shared start no longer than `longest`, that gives more of `tokens`
  // than *best: its index, with *best raised to what it gives; -1 when none does.
  // `states`: a model with slot states, whose prefixes give only their whole length or their
  // `saved` length.
  int32_t BestPrefix(const std::vector<int32_t>& tokens, int64_t* best, bool states = false) const;
  int32_t BestShared(const std::vector<int32_t>& tokens, int64_t longest, int64_t* best,
                     bool states = false) const;

  // Takes stored prefix `i` out of the cache; its pages and host bytes stay counted until
  // Release.
  Prefix Take(int32_t i);
  // Shared start `i`, marked as just used.
  const Shared& Use(int32_t i);
  const Shared& shared(int32_t i) const { return shared_[i]; }

  // Keeps what a slot held as a stored prefix: its pages while `want_free` pages remain free,
  // else a host copy.
  // With `states` (and `saved_states` of the first `saved` tokens; see Prefix), they are kept
  // on the host with it, or the prefix is not kept when the states' limit leaves no room.
  Status Stash(std::vector<int32_t> tokens, std::vector<int32_t> pages,
               std::vector<int32_t> window_pages, int32_t want_free,
               std::vector<uint8_t> states = {}, int64_t saved = 0,
               std::vector<uint8_t> saved_states = {});
  // Registers the first `tokens.size()` positions of `pages` and `window_pages` (whole pages) as
  // a shared start, unless one with the same tokens is known or the window pages miss what its
  // next row sees.
  // With `states` (a model with slot states: those after the start's last token) they are kept
  // with it, or it is not registered when the states' limit leaves no room.
  void Share(std::vector<int32_t> tokens, const std::vector<int32_t>& pages,
             const std::vector<int32_t>& window_pages, std::vector<uint8_t> states = {});
  void Release(Prefix& prefix);
  // A shared start's pages and states' bytes given back (it stays listed).
  void ReleaseShared(Shared& start);

  // Pages only the cache holds.
  int32_t Reclaimable() const;
  // Frees pages of the least recently used stored prefix in the pool (copied to the host when
  // there is room), else of the least recently used shared start no slot reads. False when
  // neither holds pages.
  Expected<bool> FreeOne();
  // Releases every stored prefix and shared start.
  void Clear();

  // Checks that every prefix's pages or host copy cover its tokens and that shared starts are
  // whole pages, and calls `hold` with each holder's pages, window pages and tokens.
  Status Check(const std::function<
               Status(const std::vector<int32_t>& pages, const std::vector<int32_t>& window_pages,
                      const std::vector<int32_t>& tokens, const std::string& who)>& hold) const;
  // Checks the count of host bytes against the host copies.
  Status CheckHostBytes() const;

 private:
  // Copies a prefix's pages to the host and releases them; drops it when host memory is spent.
  Status ToHost(Prefix& prefix);
  // Releases the least recently used prefixes that hold host copies (`states`: states) until
  // `bytes` more fit under their limit (or none is left).
  void MakeHostRoom(int64_t bytes, bool states = false);

  PagePool* pool_;
  Runner* runner_;
  int64_t page_bytes_;
  KvPaging paging_;
  int64_t host_bytes_limit_;
  int64_t state_bytes_limit_;
  int32_t slots_;
  int64_t* host_copies_;
  std::vector<Prefix> prefixes_;
  std::vector<Shared> shared_;
  int64_t host_bytes_ = 0;   // bytes of host copies in prefixes_
  int64_t state_bytes_ = 0;  // bytes of slot states in prefixes_
  uint64_t clock_ = 0;      // orders uses, for least-recently-used choices
};

}  // namespace gizllm
