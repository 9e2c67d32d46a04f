// The plan of each step, over the Engine's slots and requests: Admit gives free slots to waiting
// requests (first come first served, each from the longest start of its prompt that a slot, a
// stored prefix or a shared start holds); Schedule picks the step's rows (one for every generating
// sequence, then pieces of unread prompts in the rows left) and Grow the pages they need,
// reclaiming cached pages first and then sending the request that came last back to waiting
// (Preempt). Free functions over EngineState, which the Engine owns.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "core/status.h"
#include "engine/page_pool.h"
#include "engine/prefix_cache.h"
#include "engine/request.h"
#include "grammar/token_mask.h"
#include "model/runner.h"

namespace gizllm {

struct EngineStats;

// A place for one sequence's KV: its page table and the tokens whose KV it holds.
struct Slot {
  std::vector<int32_t> pages;  // page table: pages[b] holds positions [b * kPage, (b + 1) * kPage)
  // Window paging: the window layers' pages, [pages.size(), window groups]; the blocks before
  // WindowFirstBlock of the tokens it held when it last read rows are holes (-1).
  std::vector<int32_t> window_pages;
  std::vector<int32_t> tokens;  // tokens whose KV the slot holds, positions [0, size)
  int64_t seq = -1;             // id of the request running here; -1: free
  bool pinned = false;          // in use by a low-level Step or Hidden call
  uint64_t used = 0;            // when it last changed hands
  // Tokens the runner's snapshot of this slot's states stands for (slot states only: taken when
  // a request's prompt reaches its mark, Runner::SaveSlotState); 0: none.
  int64_t saved = 0;
};

// A request, waiting (slot -1) or running in a slot.
struct Sequence {
  int64_t id = 0;
  Request request;
  // Prompt, then the answer so far. A picture row's token is a key of its inputs instead of its
  // placeholder (negative: no token of the vocabulary), so that prefixes match only the same
  // pictures; the prompt's tokens are request.prompt.
  std::vector<int32_t> tokens;
  int64_t prompt = 0;  // prompt size
  // With pictures: for each prompt row, its index among the picture rows, or -1.
  std::vector<int32_t> picture_row;
  int32_t mark = -1;
  int64_t shared = 0;       // its shared start (tokens many prompts share), whole pages
  bool registered = false;  // its shared start is registered in the prefix cache
  uint64_t seed = 0;
  std::vector<int32_t> stop;
  int32_t slot = -1;      // -1: waiting
  bool admitted = false;  // admitted at least once
  bool reported = false;  // its first Progress went out
  int64_t cached = 0;     // prompt tokens held at first admission
  // The grammar's state over the answer so far (request.sampling.grammar); advanced only by the
  // tokens the request keeps, so preemption and resumption leave it right.
  std::unique_ptr<TokenMatcher> matcher;
  // A kept token the matcher has not taken yet: the matcher takes it on a mask thread before
  // the next mask (TakeGrammarToken in engine.cc), beside the runner's step rather than on the
  // engine's thread. -1: none. grammar_refused: the token the matcher refused there.
  int32_t grammar_token = -1;
  int32_t grammar_refused = -1;
  // Where the answer is against the grammar (Sampling::think_open): before its first token
  // (think_open allowed beside the grammar's tokens), inside the thinking (no mask), or held.
  enum class GrammarPhase : int8_t { kStart, kThinking, kHeld };
  GrammarPhase grammar_phase = GrammarPhase::kHeld;
  bool Masked() const { return matcher && grammar_phase != GrammarPhase::kThinking; }
  // The grammar's mask for this step's token, computed while the runner steps (mask_ready), or
  // by PostProcess where it was not.
  std::vector<uint64_t> mask;
  bool mask_ready = false;
  // This step's drafts (generating sequences only): the guessed tokens after tokens.back(),
  // read as extra rows; Schedule may cut them, Preempt drops them.
  std::vector<int32_t> drafts;
  // Paced lookup (`auto`): drafts lookup proposed when the sequence held `shadow_from` tokens
  // and that were not read, judged against the tokens that come (Engine::JudgeShadows), so
  // lookup's acceptance is known without drafting.
  std::vector<int32_t> shadow;
  int64_t shadow_from = 0;
};

// A sequence of this step and the rows it reads.
struct Planned {
  int64_t id;
  int64_t rows;        // rows read: a prompt piece, or a generating sequence's 1 + drafts
  int64_t drafts = 0;  // of those, draft rows
};

// The slots and requests steps are planned over, with the pages and caches they use.
struct EngineState {
  int64_t rows = 0;       // most rows one step reads
  int64_t busy_rows = 0;  // most rows while any sequence generates (EngineOptions::busy_rows)
  Runner* runner = nullptr;
  int64_t page_bytes = 0;
  // Window paging (KvPaging::enabled): a block takes 1 + paging.window_groups pages while the
  // window layers need it.
  KvPaging paging;
  int32_t window_blocks =
      0;  // WindowBlocks(paging.window, rows): window pages a slot holds at most
  PagePool* pool = nullptr;
  PrefixCache* cache = nullptr;
  EngineStats* stats = nullptr;
  std::vector<Slot> slots;
  std::map<int64_t, Sequence> sequences;  // waiting and running, by id (= arrival order)
  std::set<int64_t> waiting;              // ids, arrival order
  std::vector<Planned> plan;              // this step's sequences and their row counts
  uint64_t clock = 0;                     // orders the slots' uses, for least-recently-used choices
  // The runner keeps a state per slot (recurrent layers, model/runner.h HasSlotStates): a slot's
  // state stands for every token it holds and cannot be cut back, so a request reuses held
  // tokens only where a slot holds a start of its tokens whole (the slot's state is then at the
  // position it continues from) or up to the slot's snapshot (Slot::saved: the end of a chat's
  // messages, `mark`, which a prompt piece then ends at), restored into the slot; stored
  // prefixes and shared starts (pages without a state) are neither kept nor read.
  bool slot_states = false;
};

// Admission: free slots take waiting requests while the pool can start them.
Status Admit(EngineState& state);
// Fills state.plan with this step's sequences and their rows; each gets the pages they need.
Status Schedule(EngineState& state);
// Gives running sequence `id` `blocks` more blocks (their pages), reclaiming caches and preempting
// the latest request; false when the sequence itself had to wait.
Expected<bool> Grow(EngineState& state, int64_t id, int32_t blocks);
// Sends a running request back to waiting. Its slot keeps what it wrote, so it resumes from
// there unless the pages are reclaimed first.
void Preempt(EngineState& state, int64_t id);

// Frees pages until `need` are free: what idle slots hold, then stored prefixes (to the host),
// then shared starts no slot reads. True when enough are free.
Expected<bool> Reclaim(EngineState& state, int32_t need);
// Pages that Reclaim could free.
int32_t Reclaimable(const EngineState& state);
// Keeps the first `length` tokens of a slot and the pages they need.
void Truncate(EngineState& state, Slot& slot, int64_t length);
// Pool pages for `blocks` more blocks of a slot: one each, and under window paging the window
// groups' pages.
int32_t BlockPages(const EngineState& state, int64_t blocks);
// Pool pages a slot of `positions` positions holds at most.
int32_t PoolPages(const EngineState& state, int64_t positions);
// Window paging: releases the window pages of a slot before the window of its next row
// (WindowFirstBlock); a no-op otherwise. Call before the slot reads rows: no row after its
// last position (nor a start Usable gives) sees them.
void TrimWindow(EngineState& state, Slot& slot);
// Appends `blocks` blocks of fresh pages to a slot. Call only with the pages free.
void AddBlocks(EngineState& state, Slot& slot, int32_t blocks);
// Ends a running request: its slot keeps what it holds, for the requests to come.
void Finish(EngineState& state, Sequence& seq);

}  // namespace gizllm
