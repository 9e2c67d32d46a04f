// Engine: `slots` sequences of at most `context` positions, steps of at most `rows` rows, over a
// Runner (the model). Continuous batching with chunked prefill, a paged KV cache with preemption,
// prefix reuse (slots, stored prefixes, shared starts), per-request sampling, and lookup drafts
// (speculative decoding) paced by measured step times and acceptance.
//
// One Advance is one step: admit waiting requests into free slots, propose drafts, schedule rows
// (one for every generating sequence and its drafts, then pieces of unread prompts, first come
// first served), run the runner, sample and judge the drafts. Not thread safe: one thread drives an
// engine.
#pragma once

#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "engine/draft_pacer.h"
#include "engine/page_pool.h"
#include "engine/prefix_cache.h"
#include "engine/request.h"
#include "engine/scheduler.h"
#include "model/block_drafter.h"
#include "model/runner.h"
#include "sampling/sampling.h"

namespace gizllm {

// Where a generating sequence's drafts come from. kLookup drafts `drafts` tokens wherever a
// lookup (engine/lookup_drafter.h) finds them; kMtp drafts `drafts` tokens with the model's MTP
// layer (Runner::MtpDraft, chained); kAuto drafts with the MTP layer where the model has one,
// else by lookup, and only where the pacer (engine/draft_pacer.h) expects more tokens per
// second than without; kBlock drafts `drafts` tokens with EngineOptions::block_drafter (DFlash),
// which reads the target's hidden states of every kept row (Runner::KeepFeatures).
enum class DraftMode { kNone, kLookup, kMtp, kAuto, kBlock };

struct EngineOptions {
  int32_t slots = 16;                            // sequences at once
  int64_t context = 2048;                        // positions of each sequence (prompt and answer)
  int64_t rows = 256;                            // most rows one step reads; at least `slots`
  // Most rows of a step while any sequence generates (prompt pieces beside its decodes: a long
  // prompt stalls them a piece at a time); 0: `rows`. A step of prompts alone reads up to `rows`.
  int64_t busy_rows = 0;
  int64_t kv_budget_bytes = int64_t{256} << 20;  // KV pool: budget / Runner::PageBytes() pages
  // Host memory for prefixes copied out of the pool when it is full; 0: none, a full pool drops
  // its least recently used prefixes. Off by default: the copy goes a page and a layer at a
  // time, and on the H200 it cost 0.2 ms a prompt row, seven times what reading the row again
  // costs (bench/RESULTS.md). Where the pool is host memory (Runner::PagesInHostMemory) a copy
  // would hold the same bytes twice: a larger kv_budget_bytes keeps prefixes in place.
  int64_t host_prefix_bytes = 0;
  // Host memory for the recurrent states of stored prefixes (hybrid models: a slot another
  // request takes keeps its states beside its pages; the least recently used go first).
  int64_t prefix_state_bytes = int64_t{1} << 30;
  // Pick tokens where the logits are (Runner::CanSample) for steps whose requests use no
  // penalties and no logprobs (a grammar's masks go to the runner); otherwise the logits come
  // to the host.
  bool device_sampling = true;
  // Threads that compute grammar masks while the runner steps; 0: half the cores, at most 8.
  int32_t mask_threads = 0;
  // Drafts: extra rows of a generating sequence's step, each the guess of the token after the
  // row before it, kept while they equal the tokens the request picks (Engine::PostProcess).
  DraftMode draft = DraftMode::kNone;
  int32_t drafts = 3;  // most drafts a sequence carries in a step, [0, kMaxDrafts]
  static constexpr int32_t kMaxDrafts = 16;
  // kBlock: the drafter (it must outlive the engine; drafts at most its MostDrafts()).
  BlockDrafter* block_drafter = nullptr;
  Status Check() const;
};

// Drafts of one drafter: made, kept, and the steps that carried any.
struct DraftStats {
  int64_t drafted = 0;
  int64_t accepted = 0;
  int64_t steps = 0;
};

struct EngineStats {
  int64_t steps = 0;
  int64_t rows = 0;            // rows read, prompt pieces and decodes
  int64_t prompt_tokens = 0;   // prompt tokens of admitted requests (first admission)
  int64_t cached_tokens = 0;   // of those, the ones a slot, prefix or shared start already held
  int64_t prefix_hits = 0;     // first admissions that reused held tokens
  int64_t preemptions = 0;     // sequences sent back to waiting for lack of pages
  int64_t host_copies = 0;     // pages copied to host memory for stored prefixes
  int64_t device_sampled = 0;  // steps whose tokens the runner picked
  int64_t masks_beside_step = 0;  // grammar masks computed while the runner stepped
  int64_t masks_on_device = 0;    // of them, masks the runner applied where it picked the tokens
  DraftStats lookup;           // lookup drafts
  DraftStats mtp;              // the MTP layer's drafts
  DraftStats block;            // a block drafter's (DFlash)
};

// What the last step read and how long the runner took (`bench --trace`).
struct StepTrace {
  int64_t rows = 0;         // rows read
  int64_t decode_rows = 0;  // rows of generating sequences (one each, and their drafts)
  int64_t prompt_rows = 0;  // rows of prompt pieces
  int32_t sequences = 0;    // sequences in the step
  int32_t waiting = 0;      // requests waiting for a slot after the step's admission
  double runner_ms = 0.0;   // the runner's step, wall clock (it returns when the step is done)
  bool device_sampled = false;
  int64_t drafted = 0;   // draft rows (part of decode_rows)
  int64_t accepted = 0;  // drafts kept
  // The MTP layer's runs before the step (its rows of the last step, then the chained drafts),
  // or the block drafter's, wall clock; part of what the pacer weighs drafts by.
  double draft_ms = 0.0;
};

class Engine {
 public:
  // Allocates the KV pool and the runner's step buffers; keeps `runner`, which must outlive it.
  static Expected<std::unique_ptr<Engine>> Create(Runner* runner, const EngineOptions& options);
  // Bytes of `kv_budget_bytes` that an engine of `options` gives the recurrent layers' states
  // before any page (0 without recurrent layers): each slot's states and their snapshot at a
  // mark, and with drafts a second snapshot and each row's inputs to the state updates.
  static int64_t StateBytes(std::span<const CacheSpec> caches, const EngineOptions& options);
  ~Engine();

  // Queues a request. mark: where a chat's messages end (stored for recurrent layers); shared:
  // prompt tokens many prompts share, cut to whole pages, whose pages slots read in place.
  // A bad request returns a Status naming its field.
  Expected<int64_t> Add(Request request, int32_t mark = -1, int32_t shared = 0);

  // One step: new tokens of every request that made progress, and why requests ended.
  Expected<std::vector<Progress>> Advance();

  // Runs one step of each shape a server meets first, so that their one-time costs (recorded
  // CUDA graphs, first kernel launches) are paid before the first request: decode steps of 1 to
  // min(slots, max_decode_shapes) rows and one prompt step of `rows` rows; with drafts, verify
  // steps of as many sequences with their drafts, and with MTP drafts the MTP runs after them.
  // Needs every slot idle; leaves them empty.
  Status Warm(int32_t max_decode_shapes = 32);

  // Drops a waiting or running request; false when `id` is unknown or already ended.
  bool Cancel(int64_t id);
  bool Busy() const { return !state_.sequences.empty(); }

  // Runs the requests to completion: the tokens of each, in order, without stop tokens. A request
  // that ends in an error cancels the others and returns its Status.
  Expected<std::vector<std::vector<int32_t>>> Generate(std::vector<Request> requests);

  // Low level, on slots no request runs in: appends each row's token to its slot at the slot's
  // next position (rows of a slot consecutive) and returns the logits of the wanted rows
  // [wanted.size(), vocab]. Out of pages or context is ResourceExhausted here. `drafts` (none,
  // or a count a slot): the last drafts[s] rows of slot s are drafts, which Accept may drop; on
  // a model with recurrent layers only drafts can be dropped, and only on an engine made with
  // drafts (EngineOptions::draft), which keeps the states from before the step.
  Expected<std::vector<float>> Step(std::span<const int32_t> tokens, std::span<const int32_t> slots,
                                    std::span<const int32_t> wanted,
                                    std::span<const int32_t> drafts = {});
  // Like Step, but returns the residual stream after each of `layers` (0: embeddings;
  // Hugging Face's hidden_states[l]): [layers.size(), rows, dim].
  Expected<std::vector<float>> Hidden(std::span<const int32_t> tokens,
                                      std::span<const int32_t> slots, std::span<const int> layers);
  // Hidden of a prompt with pictures (PictureReader's expansion: `pictures` as a Request
  // carries them) read whole into `slot`, which must hold nothing: each picture row reads its
  // picture's embedding (and deepstack features), every row its three rotary positions.
  // [layers.size(), tokens.size(), dim]. The slot then holds the prompt, its picture rows
  // keyed by their pictures as a request's are.
  Expected<std::vector<float>> Hidden(std::span<const int32_t> tokens, int32_t slot,
                                      const PromptPictures& pictures, std::span<const int> layers);
  // Keeps the first `kept` of the rows the last Step or Hidden call appended to `slot` and forgets
  // the others (rejected drafts: their KV is dropped, the next row goes at the first dropped
  // position). On a model with recurrent layers the slot's states become those after its last
  // kept row (Runner::KeepDraftRows); there only rows the Step called drafts can be dropped.
  Status Accept(int32_t slot, int64_t kept);
  // Forgets what a slot holds. Call only on a slot no request runs in.
  Status Reset(int32_t slot);

  // Releases stored prefixes, shared starts and what idle slots hold.
  void DropCaches();
  // Recounts every page's holders and checks the pool, the free list, that no slot writes a page
  // another holds, and that a page held by several holds the same tokens for each.
  Status CheckPages() const;

  const EngineOptions& options() const { return options_; }
  const EngineStats& stats() const { return stats_; }
  // The runner the engine steps (its expert cache's counts, for /metrics).
  const Runner& runner() const { return *runner_; }
  const StepTrace& last_step() const { return last_step_; }
  int64_t vocab() const { return vocab_; }
  int32_t pages() const { return pool_.pages(); }
  int32_t free_pages() const { return pool_.free(); }
  // Tokens slot `slot` holds (KV written at positions [0, size)).
  const std::vector<int32_t>& held(int32_t slot) const;

 private:
  Engine(Runner* runner, const EngineOptions& options, KvPaging paging, int32_t pages,
         int32_t max_pages);

  // Request::pictures against the prompt and the model: sizes, rows, positions.
  Status CheckPictures(std::span<const int32_t> prompt, const PromptPictures& p) const;
  // Hidden's layers: each in [0, layers].
  Status CheckLayers(std::span<const int> layers) const;
  // The parts of a step after the plan (engine/scheduler.h): run the runner, then sample.
  Status Run();
  // Starts computing the masks of masked_ on the mask pool: the future is ready once each
  // sequence's mask is (and, where the runner picks, its row of step_masks_); none without masks.
  std::future<void> StartMasks();
  void PostProcess(std::vector<Progress>& progress);
  // Proposes each generating sequence's drafts for the step (Sequence::drafts) before Schedule.
  Status Draft();
  // MTP drafts: the MTP layer reads the rows the last step kept (mtp_pending_: each row's hidden
  // state and the token after it), which writes its KV and gives the first draft of each
  // sequence in `eligible` (with the most drafts it may keep); then up to k - 1 chained rows a
  // sequence, each reading the draft before it.
  Status DraftMtp(std::span<const std::pair<Sequence*, int64_t>> eligible, int32_t k);
  // Block drafts (EngineOptions::block_drafter): each sequence in `eligible` drafts from its
  // context (block_contexts_), up to its most and k.
  Status DraftBlock(std::span<const std::pair<Sequence*, int64_t>> eligible, int32_t k);
  // The kept rows [first, first + count) of the last step, at positions from `position`, join
  // the sequence's block context (features from Runner::Features).
  Status ExtendBlockContext(const Sequence& seq, int64_t first, int64_t count, int64_t position);

  Status BuildRows(std::span<const int32_t> tokens, std::span<const int32_t> slots,
                   std::span<const int32_t> wanted);
  void FillTables();
  // This step's page tables (FillTables).
  PageTables Tables() const;

  Runner* runner_;
  EngineOptions options_;
  int64_t vocab_;
  int32_t max_pages_;  // pages of a full context
  KvPaging paging_;    // window paging, where the model allows it and the budget holds a context
  int64_t page_bytes_;
  PagePool pool_;
  EngineStats stats_;
  StepTrace last_step_;
  PrefixCache cache_;
  EngineState state_;  // slots, requests and this step's plan
  int64_t next_id_ = 0;
  Sampler sampler_;
  Rows rows_;
  std::vector<int32_t> tables_;         // [slots, max_pages] page tables of this step; -1: none
  std::vector<int32_t> window_tables_;  // [window groups, slots, max_pages] likewise; -1: none
  std::vector<float> logits_;           // [slots, vocab] logits of this step's wanted rows
  bool picked_ = false;                 // this step's tokens came from the runner (picks_)
  std::vector<SampleRow> sample_;       // [wanted] how the runner picks each wanted row's token
  std::vector<int32_t> picks_;          // [wanted] tokens the runner picked
  // [masked_, MaskWords(vocab)] this step's masks, row SampleRow::mask of each, for the runner
  // where it picks the tokens.
  std::vector<uint64_t> step_masks_;
  // Threads that compute this step's grammar masks while the runner steps (made at the first
  // constrained step), and the sequences whose masks they compute.
  std::unique_ptr<ThreadPool> mask_pool_;
  std::vector<Sequence*> masked_;
  std::vector<int64_t> appended_;  // [slots] rows the last low-level Step or Hidden appended
  std::vector<int64_t> drafted_;   // [slots] of them, the drafts (Step's `drafts`)
  DraftPacer pacer_;
  size_t probe_turn_ = 0;  // the first of the eligible sequences the next probe drafts for
  // Whether this step's drafts came from lookup on an engine that also makes MTP drafts (`auto`
  // weighs both, DraftPacer::AddLookup).
  bool lookup_step_ = false;
  // The pacer's index of lookup where `auto` weighs it (-1: not), and the first of the eligible
  // sequences whose lookup drafts the next step proposes without drafting (Sequence::shadow).
  int32_t paced_lookup_ = -1;
  size_t shadow_turn_ = 0;
  // The step's slots that read drafts (their states' snapshot), and after it those whose states
  // go back to a kept row, with their entry in PostProcess's progress.
  std::vector<int32_t> draft_slots_;
  std::vector<KeptDraftRows> kept_rows_;
  std::vector<size_t> kept_progress_;
  void JudgeShadows();
  // MTP drafts (DraftMtp): whether this engine makes them, the rows of the last step the MTP
  // layer has still to read (sequence, slot, row of the step, position), where each planned
  // sequence's rows began in the step, and the MTP runs' rows, sources and picks.
  bool mtp_ = false;
  struct MtpRow {
    int64_t id;
    int32_t slot;
    int32_t row;
    int32_t position;
  };
  std::vector<MtpRow> mtp_pending_;
  // Block drafts: whether this engine makes them, and each sequence's context by id.
  bool block_ = false;
  std::map<int64_t, std::unique_ptr<BlockDrafter::Context>> block_contexts_;
  std::vector<float> block_features_;
  std::vector<int64_t> plan_rows_;
  Rows mtp_rows_;
  std::vector<int32_t> mtp_sources_;
  std::vector<int32_t> mtp_picks_;
  double draft_ms_ = 0.0;
};

}  // namespace gizllm
