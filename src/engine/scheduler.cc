#include "engine/scheduler.h"

#include <algorithm>
#include <utility>

#include "core/check.h"
#include "engine/engine.h"
#include "ops/backend.h"

namespace gizllm {
namespace {

enum Kind { kNone, kFromSlot, kFromPrefix, kFromShared };

// Gives slot `s` the first `length` tokens of `seq` from where they are held.
Status Install(EngineState& state, Sequence& seq, int32_t s, int kind, PrefixCache::Prefix* prefix,
               int32_t shared, int64_t length) {
  Slot& slot = state.slots[s];
  slot.used = ++state.clock;
  if (kind == kFromSlot || kind == kNone) {
    // Slot states: a start shorter than what the slot holds is its snapshot's.
    const bool restore =
        kind == kFromSlot && state.slot_states && length < static_cast<int64_t>(slot.tokens.size());
    DCHECK(!restore || length == slot.saved);
    Truncate(state, slot, kind == kNone ? 0 : length);
    if (restore) GZ_RETURN_IF_ERROR(state.runner->RestoreSlotState(s));
    return Status::Ok();
  }
  DCHECK(slot.pages.empty() && slot.window_pages.empty());
  const int32_t blocks = PagesFor(length);
  const int32_t groups = state.paging.window_groups;
  if (kind == kFromShared) {
    const PrefixCache::Shared& start = state.cache->shared(shared);
    for (int32_t b = 0; b < blocks; ++b) {
      state.pool->Retain(start.pages[b]);
      slot.pages.push_back(start.pages[b]);
    }
    for (int32_t e = 0; e < blocks * groups; ++e) {
      if (start.window_pages[e] >= 0) state.pool->Retain(start.window_pages[e]);
      slot.window_pages.push_back(start.window_pages[e]);
    }
    if (state.slot_states) {
      DCHECK(length == static_cast<int64_t>(start.tokens.size()));
      GZ_RETURN_IF_ERROR(state.runner->CopySlotStatesFromHost(s, start.states.data()));
      slot.saved = 0;
    }
  } else if (!prefix->pages.empty()) {
    slot.pages = std::move(prefix->pages);
    slot.window_pages = std::move(prefix->window_pages);
    prefix->pages.clear();
    prefix->window_pages.clear();
  } else {
    // Back from the host, into fresh pages; without room it starts cold. The host copy holds
    // the prefix's blocks, then its window pages from block window_first on.
    const int32_t first = std::min(prefix->window_first, blocks);
    GZ_ASSIGN_OR_RETURN(bool room, Reclaim(state, blocks + (blocks - first) * groups));
    if (room) {
      const int64_t window_at = PagesFor(prefix->tokens.size());
      auto restore = [&](int64_t host_page) -> Expected<int32_t> {
        const int32_t page = *state.pool->Allocate();
        GZ_RETURN_IF_ERROR(
            state.runner->CopyPageFromHost(page, &prefix->host[host_page * state.page_bytes]));
        return page;
      };
      for (int32_t b = 0; b < blocks; ++b) {
        GZ_ASSIGN_OR_RETURN(int32_t page, restore(b));
        slot.pages.push_back(page);
      }
      slot.window_pages.assign(static_cast<size_t>(first) * groups, -1);
      for (int32_t b = first; b < blocks; ++b) {
        for (int32_t g = 0; g < groups; ++g) {
          GZ_ASSIGN_OR_RETURN(
              int32_t page, restore(window_at + (b - prefix->window_first) * int64_t{groups} + g));
          slot.window_pages.push_back(page);
        }
      }
    } else {
      length = 0;
    }
  }
  // Slot states: the prefix's states at the position it gives (its end or its mark).
  if (kind == kFromPrefix && state.slot_states && length > 0) {
    const bool whole = length == static_cast<int64_t>(prefix->tokens.size());
    DCHECK(whole || length == prefix->saved);
    const std::vector<uint8_t>& states = whole ? prefix->states : prefix->saved_states;
    GZ_RETURN_IF_ERROR(state.runner->CopySlotStatesFromHost(s, states.data()));
    slot.saved = 0;
  }
  if (kind == kFromPrefix) state.cache->Release(*prefix);
  slot.tokens.assign(seq.tokens.begin(), seq.tokens.begin() + length);
  Truncate(state, slot, length);
  return Status::Ok();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Admission: free slots take waiting requests, first come first served; a request starts from
// the longest start of its tokens that a free slot, a stored prefix or a shared start holds.

Status Admit(EngineState& state) {
  PrefixCache& cache = *state.cache;
  int64_t running = static_cast<int64_t>(state.sequences.size() - state.waiting.size());
  for (auto it = state.waiting.begin(); it != state.waiting.end();) {
    const int64_t id = *it;
    Sequence& seq = state.sequences.at(id);
    int32_t free_slot = -1;
    int kind = kNone;
    int32_t from = -1;
    int64_t best = 0;
    for (int32_t s = 0; s < static_cast<int32_t>(state.slots.size()); ++s) {
      const Slot& slot = state.slots[s];
      if (slot.seq >= 0 || slot.pinned) continue;
      // Among free slots: an empty one, else the least recently used.
      if (free_slot < 0 || (!state.slots[free_slot].tokens.empty() &&
                            (slot.tokens.empty() || slot.used < state.slots[free_slot].used))) {
        free_slot = s;
      }
      int64_t m =
          cache.Usable(slot.pages, FirstHeldBlock(slot.window_pages, state.paging.window_groups),
                       slot.tokens, seq.tokens, /*shared=*/false);
      // With slot states, only the slot's whole start (its state is at that position) or its
      // snapshot's.
      if (state.slot_states && m != static_cast<int64_t>(slot.tokens.size())) {
        if (slot.saved == 0 || m < slot.saved) continue;
        m = slot.saved;
      }
      if (m > best) best = m, kind = kFromSlot, from = s;
    }
    if (free_slot < 0) break;
    // Stored prefixes and shared starts keep a model's slot states with their pages.
    if (const int32_t i = cache.BestPrefix(seq.tokens, &best, state.slot_states); i >= 0) {
      kind = kFromPrefix, from = i;
    }
    if (const int32_t i = cache.BestShared(seq.tokens, seq.shared, &best, state.slot_states);
        i >= 0) {
      kind = kFromShared, from = i;
    }
    // Admit only what the pool can start: its first piece, and a page for each running
    // sequence to grow. The earliest request always starts when nothing runs.
    const int64_t first =
        std::min<int64_t>(static_cast<int64_t>(seq.tokens.size()), best + state.rows);
    const int32_t need = BlockPages(state, PagesFor(first) - best / kPage + running);
    if (running > 0 && need > state.pool->free() + Reclaimable(state)) break;

    const int32_t s = kind == kFromSlot ? from : free_slot;
    PrefixCache::Prefix prefix;
    if (kind == kFromPrefix) prefix = cache.Take(from);
    if (kind == kFromShared) cache.Use(from);
    state.slots[s].seq = id;
    seq.slot = s;
    if (kind != kFromSlot && !state.slots[s].tokens.empty()) {
      // What the slot held stays as a stored prefix, with its states (slot states: those after
      // its last token, and the snapshot at a chat's mark where it saved one) on the host.
      Slot& slot = state.slots[s];
      std::vector<uint8_t> states, saved_states;
      int64_t saved = 0;
      if (state.slot_states) {
        const int64_t bytes = state.runner->SlotStatesBytes();
        states.resize(static_cast<size_t>(bytes));
        GZ_RETURN_IF_ERROR(state.runner->CopySlotStatesToHost(s, /*saved=*/false, states.data()));
        if (slot.saved > 0 && slot.saved < static_cast<int64_t>(slot.tokens.size())) {
          saved = slot.saved;
          saved_states.resize(static_cast<size_t>(bytes));
          GZ_RETURN_IF_ERROR(
              state.runner->CopySlotStatesToHost(s, /*saved=*/true, saved_states.data()));
        }
      }
      std::vector<int32_t> tokens = std::move(slot.tokens), pages = std::move(slot.pages),
                           window_pages = std::move(slot.window_pages);
      slot.tokens.clear();
      slot.pages.clear();
      slot.window_pages.clear();
      slot.saved = 0;
      GZ_RETURN_IF_ERROR(cache.Stash(std::move(tokens), std::move(pages), std::move(window_pages),
                                     PoolPages(state, seq.tokens.size()), std::move(states), saved,
                                     std::move(saved_states)));
    }
    GZ_RETURN_IF_ERROR(Install(state, seq, s, kind, &prefix, from, best));
    if (!seq.admitted) {
      seq.admitted = true;
      seq.cached =
          std::min<int64_t>(static_cast<int64_t>(state.slots[s].tokens.size()), seq.prompt);
      state.stats->prompt_tokens += seq.prompt;
      state.stats->cached_tokens += seq.cached;
      state.stats->prefix_hits += seq.cached > 0;
    }
    ++running;
    it = state.waiting.erase(it);
  }
  return Status::Ok();
}

int32_t Reclaimable(const EngineState& state) {
  int32_t n = 0;
  for (const Slot& s : state.slots) {
    if (s.seq >= 0 || s.pinned) continue;
    for (int32_t p : s.pages) n += state.pool->refs(p) == 1;
    for (int32_t p : s.window_pages) n += p >= 0 && state.pool->refs(p) == 1;
  }
  return n + state.cache->Reclaimable();
}

void Truncate(EngineState& state, Slot& slot, int64_t length) {
  const int32_t blocks = PagesFor(length);
  while (static_cast<int32_t>(slot.pages.size()) > blocks) {
    state.pool->Release(slot.pages.back());
    slot.pages.pop_back();
  }
  const size_t entries = static_cast<size_t>(blocks) * state.paging.window_groups;
  while (slot.window_pages.size() > entries) {
    if (slot.window_pages.back() >= 0) state.pool->Release(slot.window_pages.back());
    slot.window_pages.pop_back();
  }
  if (static_cast<int64_t>(slot.tokens.size()) > length) slot.tokens.resize(length);
  if (slot.saved > length) slot.saved = 0;
}

int32_t BlockPages(const EngineState& state, int64_t blocks) {
  return static_cast<int32_t>(blocks * (1 + state.paging.window_groups));
}

int32_t PoolPages(const EngineState& state, int64_t positions) {
  const int32_t blocks = PagesFor(positions);
  return blocks + state.paging.window_groups * std::min(blocks, state.window_blocks);
}

void TrimWindow(EngineState& state, Slot& slot) {
  if (!state.paging.enabled()) return;
  state.pool->ReleaseFront(slot.window_pages, static_cast<size_t>(WindowFirstBlock(
                                                  slot.tokens.size(), state.paging.window)) *
                                                  state.paging.window_groups);
}

void AddBlocks(EngineState& state, Slot& slot, int32_t blocks) {
  for (int32_t i = 0; i < blocks; ++i) {
    slot.pages.push_back(*state.pool->Allocate());
    for (int32_t g = 0; g < state.paging.window_groups; ++g) {
      slot.window_pages.push_back(*state.pool->Allocate());
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Scheduling: one row for each generating sequence, then pieces of unread prompts in the rows
// left, first come first served; each sequence gets the pages its rows need.

Status Schedule(EngineState& state) {
  state.plan.clear();
  // Window pages no row of the step sees go back to the pool first.
  for (const auto& [id, seq] : state.sequences) {
    if (seq.slot >= 0) TrimWindow(state, state.slots[seq.slot]);
  }
  // Generating sequences not planned yet: each keeps one row, so drafts take only the others.
  // Pages the step's rows without drafts may take from the free list (a page each generating
  // sequence, a prompt piece's), which drafts leave to them.
  int64_t decodes_left = 0, reserved = 0;
  for (const auto& [id, seq] : state.sequences) {
    if (seq.slot < 0) continue;
    decodes_left += seq.tokens.size() - state.slots[seq.slot].tokens.size() == 1;
  }
  // Beside generating sequences prompt pieces share busy_rows; prompts alone take up to rows.
  const int64_t bound = decodes_left > 0 ? state.busy_rows : state.rows;
  for (const auto& [id, seq] : state.sequences) {
    if (seq.slot < 0) continue;
    const Slot& slot = state.slots[seq.slot];
    const int64_t held = static_cast<int64_t>(slot.tokens.size());
    const int64_t unread = static_cast<int64_t>(seq.tokens.size()) - held;
    reserved += BlockPages(state, std::max<int64_t>(0, PagesFor(held + std::min(unread, bound)) -
                                                           static_cast<int64_t>(slot.pages.size())));
  }
  int64_t rows_left = bound;
  for (int pass = 0; pass < 2; ++pass) {
    const bool decodes = pass == 0;
    for (auto it = state.sequences.begin(); it != state.sequences.end();) {
      const int64_t id = it->first;
      Sequence& seq = it->second;
      ++it;  // Grow may preempt (never erase) sequences
      if (seq.slot < 0) continue;
      const Slot& slot = state.slots[seq.slot];
      const int64_t unread = static_cast<int64_t>(seq.tokens.size() - slot.tokens.size());
      DCHECK(unread >= 1);
      if ((unread == 1) != decodes) continue;
      if (decodes) --decodes_left;
      int64_t n = std::min(unread, rows_left);
      if (n == 0) break;
      // Slot states: a piece ends at the request's mark, where the states are saved, and at the
      // end of its shared start, where they are kept with it.
      const int64_t held = static_cast<int64_t>(slot.tokens.size());
      if (state.slot_states && seq.mark > held) n = std::min<int64_t>(n, seq.mark - held);
      if (state.slot_states && !seq.registered && seq.shared > held) {
        n = std::min<int64_t>(n, seq.shared - held);
      }
      // Drafts: in the rows the other generating sequences leave and in free pages (never
      // preempting a request or dropping a stored prefix for a guess).
      if (decodes && !seq.drafts.empty()) {
        const int64_t positions =
            (static_cast<int64_t>(PagesFor(held + 1)) +
             std::max<int64_t>(0, state.pool->free() - reserved) / BlockPages(state, 1)) *
            kPage;
        const int64_t k =
            std::clamp<int64_t>(std::min(rows_left - 1 - decodes_left, positions - held - 1), 0,
                                static_cast<int64_t>(seq.drafts.size()));
        seq.drafts.resize(k);
        n = 1 + k;
      }
      const int32_t blocks =
          PagesFor(slot.tokens.size() + n) - static_cast<int32_t>(slot.pages.size());
      // This sequence's reserve is spent now (its pages beyond it were free beyond the reserve).
      reserved -=
          BlockPages(state, std::max<int64_t>(0, PagesFor(held + std::min(unread, bound)) -
                                                     static_cast<int64_t>(slot.pages.size())));
      GZ_ASSIGN_OR_RETURN(bool granted, Grow(state, id, blocks));
      // Grow may have sent planned sequences back to waiting: their rows are free again.
      rows_left = bound;
      for (const Planned& p : state.plan) rows_left -= p.rows;
      if (!granted) continue;
      state.plan.push_back({id, n, decodes ? n - 1 : 0});
      rows_left -= n;
    }
  }
  return Status::Ok();
}

Expected<bool> Grow(EngineState& state, int64_t id, int32_t blocks) {
  if (blocks <= 0) return true;
  const int32_t need = BlockPages(state, blocks);
  while (state.pool->free() < need) {
    GZ_ASSIGN_OR_RETURN(bool room, Reclaim(state, need));
    if (room) break;
    // The request that came last waits again, from where it is.
    int64_t victim = -1;
    for (auto it = state.sequences.rbegin(); it != state.sequences.rend(); ++it) {
      if (it->second.slot >= 0) {
        victim = it->first;
        break;
      }
    }
    CHECK(victim >= 0);
    Preempt(state, victim);
    for (size_t i = 0; i < state.plan.size(); ++i) {
      if (state.plan[i].id == victim) {
        state.plan.erase(state.plan.begin() + i);
        break;
      }
    }
    if (victim == id) return false;
  }
  AddBlocks(state, state.slots[state.sequences.at(id).slot], blocks);
  return true;
}

Expected<bool> Reclaim(EngineState& state, int32_t need) {
  while (state.pool->free() < need) {
    int32_t idle = -1;
    for (int32_t s = 0; s < static_cast<int32_t>(state.slots.size()); ++s) {
      const Slot& slot = state.slots[s];
      if (slot.seq >= 0 || slot.pinned || slot.pages.empty()) continue;
      if (idle < 0 || slot.used < state.slots[idle].used) idle = s;
    }
    if (idle >= 0) {
      Truncate(state, state.slots[idle], 0);
      continue;
    }
    GZ_ASSIGN_OR_RETURN(bool freed, state.cache->FreeOne());
    if (!freed) return false;
  }
  return true;
}

void Preempt(EngineState& state, int64_t id) {
  Sequence& seq = state.sequences.at(id);
  Slot& slot = state.slots[seq.slot];
  Truncate(state, slot, static_cast<int64_t>(slot.tokens.size()));
  TrimWindow(state, slot);
  slot.seq = -1;
  slot.used = ++state.clock;
  seq.slot = -1;
  seq.drafts.clear();
  state.waiting.insert(id);
  ++state.stats->preemptions;
}

void Finish(EngineState& state, Sequence& seq) {
  Slot& slot = state.slots[seq.slot];
  Truncate(state, slot, static_cast<int64_t>(slot.tokens.size()));
  TrimWindow(state, slot);
  slot.seq = -1;
  slot.used = ++state.clock;
  state.sequences.erase(seq.id);
}

}  // namespace gizllm
