#include "engine/engine.h"

#include <algorithm>
#include <string>
#include <utility>

#include "core/check.h"
#include "ops/backend.h"

namespace gizllm {
namespace {

int32_t PagesFor(int64_t positions) {
  return static_cast<int32_t>((positions + kPage - 1) / kPage);
}

int64_t CommonStart(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  const int64_t n = static_cast<int64_t>(std::min(a.size(), b.size()));
  int64_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

// Seeds of requests that bring none: a function of the request id.
constexpr uint64_t kDefaultSeedBase = 0x67697a6c6c6d5eedull;

enum Kind { kNone, kFromSlot, kFromPrefix, kFromShared };

}  // namespace

Status EngineOptions::Check() const {
  if (slots < 1)
    return InvalidArgument("engine slots: expected >= 1, got " + std::to_string(slots));
  if (context < 2) {
    return InvalidArgument("engine context: expected >= 2, got " + std::to_string(context));
  }
  if (rows < slots) {
    return InvalidArgument("engine rows: expected at least the slots (" + std::to_string(slots) +
                           ") so every sequence reads a row each step, got " +
                           std::to_string(rows));
  }
  if (host_prefix_bytes < 0) {
    return InvalidArgument("engine host_prefix_bytes: expected >= 0, got " +
                           std::to_string(host_prefix_bytes));
  }
  if (kv_budget_bytes <= 0) {
    return InvalidArgument("engine kv_budget_bytes: expected > 0, got " +
                           std::to_string(kv_budget_bytes));
  }
  return Status::Ok();
}

Expected<std::unique_ptr<Engine>> Engine::Create(Runner* runner, const EngineOptions& options) {
  GZ_RETURN_IF_ERROR(options.Check());
  const Arch& arch = runner->arch();
  if (arch.context > 0 && options.context > arch.context) {
    return InvalidArgument("engine context: " + std::to_string(options.context) +
                           " exceeds the model's max_position_embeddings " +
                           std::to_string(arch.context));
  }
  const int64_t page_bytes = runner->PageBytes();
  CHECK(page_bytes > 0);
  const int32_t max_pages = PagesFor(options.context);
  const int64_t pages = options.kv_budget_bytes / page_bytes;
  if (pages < max_pages) {
    return InvalidArgument("engine kv_budget_bytes: " + std::to_string(options.kv_budget_bytes) +
                           " bytes hold " + std::to_string(pages) + " pages of " +
                           std::to_string(page_bytes) + " bytes; one sequence of context " +
                           std::to_string(options.context) + " needs " + std::to_string(max_pages));
  }
  if (pages > INT32_MAX) return InvalidArgument("engine kv_budget_bytes: too many pages");
  // The pool is the one allocation that grows with the context: say which context asked for it.
  if (Status s = runner->AllocatePages(static_cast<int32_t>(pages)); !s.ok()) {
    return s.Annotate("KV pages for a context of " + std::to_string(options.context) +
                      " positions (" + std::to_string(pages) + " pages, " +
                      std::to_string(pages * page_bytes) +
                      " bytes; a shorter context needs fewer)");
  }
  GZ_RETURN_IF_ERROR(runner->Reserve(options.rows, options.slots, max_pages));
  return std::unique_ptr<Engine>(
      new Engine(runner, options, static_cast<int32_t>(pages), max_pages));
}

Engine::Engine(Runner* runner, const EngineOptions& options, int32_t pages, int32_t max_pages)
    : runner_(runner),
      options_(options),
      vocab_(runner->arch().vocab),
      max_pages_(max_pages),
      page_bytes_(runner->PageBytes()),
      pool_(pages),
      slots_(options.slots),
      sampler_(runner->arch().vocab),
      tables_(static_cast<size_t>(options.slots) * max_pages, -1),
      logits_(static_cast<size_t>(options.slots) * runner->arch().vocab) {
  plan_.reserve(options.slots);
}

Engine::~Engine() = default;

const std::vector<int32_t>& Engine::held(int32_t slot) const { return slots_[slot].tokens; }

Expected<int64_t> Engine::Add(Request request, int32_t mark, int32_t head) {
  const int64_t n = static_cast<int64_t>(request.prompt.size());
  if (n == 0) return InvalidArgument("request.prompt: expected at least one token");
  if (n > options_.context) {
    return InvalidArgument("request.prompt: " + std::to_string(n) +
                           " tokens exceed the engine's context of " +
                           std::to_string(options_.context));
  }
  for (int64_t i = 0; i < n; ++i) {
    if (request.prompt[i] < 0 || request.prompt[i] >= vocab_) {
      return InvalidArgument("request.prompt[" + std::to_string(i) + "]: token " +
                             std::to_string(request.prompt[i]) + " is outside the vocabulary [0, " +
                             std::to_string(vocab_) + ")");
    }
  }
  if (request.limit != -1 && request.limit < 1) {
    return InvalidArgument("request.limit: expected >= 1 or -1 (until the context is full), got " +
                           std::to_string(request.limit));
  }
  GZ_RETURN_IF_ERROR(request.sampling.Check().Annotate("request"));
  if (head < 0 || head > n) {
    return InvalidArgument("request head: expected in [0, " + std::to_string(n) + "], got " +
                           std::to_string(head));
  }
  if (mark < -1 || mark > n) {
    return InvalidArgument("request mark: expected -1 or in [0, " + std::to_string(n) + "], got " +
                           std::to_string(mark));
  }
  std::vector<int32_t> stop = request.stop ? *request.stop : runner_->arch().eos;
  for (int32_t t : stop) {
    if (t < 0 || t >= vocab_) {
      return InvalidArgument("request.stop: token " + std::to_string(t) +
                             " is outside the vocabulary [0, " + std::to_string(vocab_) + ")");
    }
  }
  const int64_t id = next_id_++;
  Sequence seq;
  seq.id = id;
  seq.tokens = request.prompt;
  seq.prompt = n;
  seq.mark = mark;
  seq.head = head / kPage * kPage;
  seq.seed = request.sampling.seed.value_or(CounterHash(kDefaultSeedBase, id));
  seq.stop = std::move(stop);
  seq.request = std::move(request);
  sequences_.emplace(id, std::move(seq));
  waiting_.insert(id);
  return id;
}

Expected<std::vector<Progress>> Engine::Advance() {
  std::vector<Progress> progress;
  GZ_RETURN_IF_ERROR(Admit());
  GZ_RETURN_IF_ERROR(Schedule());
  if (plan_.empty()) return progress;
  GZ_RETURN_IF_ERROR(Run());
  PostProcess(progress);
  return progress;
}

bool Engine::Cancel(int64_t id) {
  auto it = sequences_.find(id);
  if (it == sequences_.end()) return false;
  if (it->second.slot < 0) {
    waiting_.erase(id);
    sequences_.erase(it);
  } else {
    Finish(it->second);
  }
  return true;
}

Expected<std::vector<std::vector<int32_t>>> Engine::Generate(std::vector<Request> requests) {
  std::map<int64_t, size_t> index;  // id -> position in `requests`
  for (size_t i = 0; i < requests.size(); ++i) {
    Expected<int64_t> id = Add(std::move(requests[i]));
    if (!id.ok()) return id.status().Annotate("request " + std::to_string(i));
    index[*id] = i;
  }
  std::vector<std::vector<int32_t>> out(requests.size());
  while (Busy()) {
    GZ_ASSIGN_OR_RETURN(std::vector<Progress> progress, Advance());
    for (const Progress& p : progress) {
      auto it = index.find(p.id);
      if (it == index.end()) continue;
      if (!p.status.ok()) {
        for (const auto& [id, i] : index) Cancel(id);
        return p.status.Annotate("request " + std::to_string(it->second));
      }
      out[it->second].insert(out[it->second].end(), p.tokens.begin(), p.tokens.end());
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Admission: free slots take waiting requests, first come first served; a request starts from
// the longest start of its tokens that a free slot, a stored prefix or a shared head holds.

int64_t Engine::Usable(const std::vector<int32_t>& pages, const std::vector<int32_t>& held,
                       const std::vector<int32_t>& tokens, bool shared) const {
  // At least the last token is read again: its logits give the next token.
  int64_t m = std::min<int64_t>(CommonStart(held, tokens), static_cast<int64_t>(tokens.size()) - 1);
  if (m <= 0) return 0;
  // The slot writes from position m on: never into a page another holder reads.
  const int64_t block = m / kPage;
  if (block < static_cast<int64_t>(pages.size()) && (shared || pool_.refs(pages[block]) > 1)) {
    m = block * kPage;
  }
  return m;
}

int32_t Engine::Reclaimable() const {
  int32_t n = 0;
  for (const Slot& s : slots_) {
    if (s.seq >= 0 || s.pinned) continue;
    for (int32_t p : s.pages) n += pool_.refs(p) == 1;
  }
  for (const Prefix& p : prefixes_) {
    for (int32_t page : p.pages) n += pool_.refs(page) == 1;
  }
  for (const Shared& s : shared_) {
    for (int32_t page : s.pages) n += pool_.refs(page) == 1;
  }
  return n;
}

Status Engine::Admit() {
  int64_t running = static_cast<int64_t>(sequences_.size() - waiting_.size());
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    const int64_t id = *it;
    Sequence& seq = sequences_.at(id);
    int32_t free_slot = -1;
    int kind = kNone;
    int32_t from = -1;
    int64_t best = 0;
    for (int32_t s = 0; s < static_cast<int32_t>(slots_.size()); ++s) {
      const Slot& slot = slots_[s];
      if (slot.seq >= 0 || slot.pinned) continue;
      // Among free slots: an empty one, else the least recently used.
      if (free_slot < 0 || (!slots_[free_slot].tokens.empty() &&
                            (slot.tokens.empty() || slot.used < slots_[free_slot].used))) {
        free_slot = s;
      }
      const int64_t m = Usable(slot.pages, slot.tokens, seq.tokens, /*shared=*/false);
      if (m > best) best = m, kind = kFromSlot, from = s;
    }
    if (free_slot < 0) break;
    for (int32_t i = 0; i < static_cast<int32_t>(prefixes_.size()); ++i) {
      const Prefix& p = prefixes_[i];
      const int64_t m = Usable(p.pages, p.tokens, seq.tokens, /*shared=*/false);
      if (m > best) best = m, kind = kFromPrefix, from = i;
    }
    for (int32_t i = 0; i < static_cast<int32_t>(shared_.size()); ++i) {
      const Shared& s = shared_[i];
      if (static_cast<int64_t>(s.tokens.size()) > seq.head) continue;
      const int64_t m = Usable(s.pages, s.tokens, seq.tokens, /*shared=*/true);
      if (m > best) best = m, kind = kFromShared, from = i;
    }
    // Admit only what the pool can start: its first piece, and a page for each running
    // sequence to grow. The earliest request always starts when nothing runs.
    const int64_t first =
        std::min<int64_t>(static_cast<int64_t>(seq.tokens.size()), best + options_.rows);
    const int32_t need = PagesFor(first) - best / kPage + static_cast<int32_t>(running);
    if (running > 0 && need > pool_.free() + Reclaimable()) break;

    const int32_t s = kind == kFromSlot ? from : free_slot;
    Prefix prefix;
    if (kind == kFromPrefix) {
      prefix = std::move(prefixes_[from]);
      prefixes_.erase(prefixes_.begin() + from);
    }
    if (kind == kFromShared) shared_[from].used = ++clock_;
    slots_[s].seq = id;
    seq.slot = s;
    if (kind != kFromSlot && !slots_[s].tokens.empty()) {
      GZ_RETURN_IF_ERROR(Stash(s, PagesFor(seq.tokens.size())));
    }
    GZ_RETURN_IF_ERROR(Install(seq, s, kind, &prefix, from, best));
    if (!seq.admitted) {
      seq.admitted = true;
      seq.cached = std::min<int64_t>(static_cast<int64_t>(slots_[s].tokens.size()), seq.prompt);
      stats_.prompt_tokens += seq.prompt;
      stats_.cached_tokens += seq.cached;
      stats_.prefix_hits += seq.cached > 0;
    }
    ++running;
    it = waiting_.erase(it);
  }
  return Status::Ok();
}

// Keeps what slot `s` holds as a Prefix: its pages while `want_free` pages remain free, else a
// host copy.
Status Engine::Stash(int32_t s, int32_t want_free) {
  Slot& slot = slots_[s];
  Prefix prefix;
  prefix.tokens = std::move(slot.tokens);
  prefix.pages = std::move(slot.pages);
  prefix.used = ++clock_;
  slot.tokens.clear();
  slot.pages.clear();
  // A stored prefix that is a start of this one says nothing new.
  std::erase_if(prefixes_, [&](Prefix& p) {
    const bool redundant =
        CommonStart(p.tokens, prefix.tokens) == static_cast<int64_t>(p.tokens.size());
    if (redundant) ReleasePrefix(p);
    return redundant;
  });
  if (pool_.free() < want_free) GZ_RETURN_IF_ERROR(ToHost(prefix));
  if (prefix.pages.empty() && prefix.host.empty()) return Status::Ok();
  prefixes_.push_back(std::move(prefix));
  // At most a few per slot: the least recently used go first.
  while (prefixes_.size() > 4 * slots_.size()) {
    auto oldest =
        std::min_element(prefixes_.begin(), prefixes_.end(),
                         [](const Prefix& a, const Prefix& b) { return a.used < b.used; });
    ReleasePrefix(*oldest);
    prefixes_.erase(oldest);
  }
  return Status::Ok();
}

// Copies a prefix's pages to the host and releases them; drops it when host memory is spent.
Status Engine::ToHost(Prefix& prefix) {
  if (prefix.pages.empty()) return Status::Ok();
  const int64_t bytes = static_cast<int64_t>(prefix.pages.size()) * page_bytes_;
  // Room on the host: least recently used host copies go first.
  while (host_bytes_ + bytes > options_.host_prefix_bytes) {
    auto oldest = prefixes_.end();
    for (auto it = prefixes_.begin(); it != prefixes_.end(); ++it) {
      if (!it->host.empty() && (oldest == prefixes_.end() || it->used < oldest->used)) oldest = it;
    }
    if (oldest == prefixes_.end()) break;
    ReleasePrefix(*oldest);
    prefixes_.erase(oldest);
  }
  if (host_bytes_ + bytes <= options_.host_prefix_bytes) {
    prefix.host.resize(bytes);
    for (size_t b = 0; b < prefix.pages.size(); ++b) {
      GZ_RETURN_IF_ERROR(runner_->CopyPageToHost(prefix.pages[b], &prefix.host[b * page_bytes_]));
    }
    host_bytes_ += bytes;
    stats_.host_copies += static_cast<int64_t>(prefix.pages.size());
  } else {
    prefix.tokens.clear();
  }
  for (int32_t p : prefix.pages) pool_.Release(p);
  prefix.pages.clear();
  return Status::Ok();
}

void Engine::ReleasePrefix(Prefix& prefix) {
  for (int32_t p : prefix.pages) pool_.Release(p);
  prefix.pages.clear();
  host_bytes_ -= static_cast<int64_t>(prefix.host.size());
  prefix.host.clear();
  prefix.tokens.clear();
}

// Gives slot `s` the first `length` tokens of `seq` from where they are held.
Status Engine::Install(Sequence& seq, int32_t s, int kind, Prefix* prefix, int32_t shared,
                       int64_t length) {
  Slot& slot = slots_[s];
  slot.used = ++clock_;
  if (kind == kFromSlot || kind == kNone) {
    Truncate(slot, kind == kNone ? 0 : length);
    return Status::Ok();
  }
  DCHECK(slot.pages.empty());
  const int32_t blocks = PagesFor(length);
  if (kind == kFromShared) {
    const Shared& head = shared_[shared];
    for (int32_t b = 0; b < blocks; ++b) {
      pool_.Retain(head.pages[b]);
      slot.pages.push_back(head.pages[b]);
    }
  } else if (!prefix->pages.empty()) {
    slot.pages = std::move(prefix->pages);
    prefix->pages.clear();
  } else {
    // Back from the host, into fresh pages; without room it starts cold.
    GZ_ASSIGN_OR_RETURN(bool room, Reclaim(blocks));
    if (room) {
      for (int32_t b = 0; b < blocks; ++b) {
        const int32_t page = *pool_.Allocate();
        GZ_RETURN_IF_ERROR(runner_->CopyPageFromHost(page, &prefix->host[b * page_bytes_]));
        slot.pages.push_back(page);
      }
    } else {
      length = 0;
    }
  }
  if (kind == kFromPrefix) ReleasePrefix(*prefix);
  slot.tokens.assign(seq.tokens.begin(), seq.tokens.begin() + length);
  Truncate(slot, length);
  return Status::Ok();
}

void Engine::Truncate(Slot& slot, int64_t length) {
  const int32_t blocks = PagesFor(length);
  while (static_cast<int32_t>(slot.pages.size()) > blocks) {
    pool_.Release(slot.pages.back());
    slot.pages.pop_back();
  }
  if (static_cast<int64_t>(slot.tokens.size()) > length) slot.tokens.resize(length);
}

// ---------------------------------------------------------------------------------------------
// Scheduling: one row for each generating sequence, then pieces of unread prompts in the rows
// left, first come first served; each sequence gets the pages its rows need.

Status Engine::Schedule() {
  plan_.clear();
  int64_t rows_left = options_.rows;
  for (int pass = 0; pass < 2; ++pass) {
    const bool decodes = pass == 0;
    for (auto it = sequences_.begin(); it != sequences_.end();) {
      const int64_t id = it->first;
      const Sequence& seq = it->second;
      ++it;  // Grow may preempt (never erase) sequences
      if (seq.slot < 0) continue;
      const Slot& slot = slots_[seq.slot];
      const int64_t unread = static_cast<int64_t>(seq.tokens.size() - slot.tokens.size());
      DCHECK(unread >= 1);
      if ((unread == 1) != decodes) continue;
      const int64_t n = std::min(unread, rows_left);
      if (n == 0) break;
      const int32_t need =
          PagesFor(slot.tokens.size() + n) - static_cast<int32_t>(slot.pages.size());
      GZ_ASSIGN_OR_RETURN(bool granted, Grow(id, need));
      // Grow may have sent planned sequences back to waiting: their rows are free again.
      rows_left = options_.rows;
      for (const Planned& p : plan_) rows_left -= p.rows;
      if (!granted) continue;
      plan_.push_back({id, n});
      rows_left -= n;
    }
  }
  return Status::Ok();
}

Expected<bool> Engine::Grow(int64_t id, int32_t need) {
  if (need <= 0) return true;
  while (pool_.free() < need) {
    GZ_ASSIGN_OR_RETURN(bool room, Reclaim(need));
    if (room) break;
    // The request that came last waits again, from where it is.
    int64_t victim = -1;
    for (auto it = sequences_.rbegin(); it != sequences_.rend(); ++it) {
      if (it->second.slot >= 0) {
        victim = it->first;
        break;
      }
    }
    CHECK(victim >= 0);
    Preempt(victim);
    for (size_t i = 0; i < plan_.size(); ++i) {
      if (plan_[i].id == victim) {
        plan_.erase(plan_.begin() + i);
        break;
      }
    }
    if (victim == id) return false;
  }
  Slot& slot = slots_[sequences_.at(id).slot];
  for (int32_t i = 0; i < need; ++i) slot.pages.push_back(*pool_.Allocate());
  return true;
}

// Frees pages until `need` are free: what idle slots hold, then stored prefixes (to the host),
// then shared heads no slot reads. True when enough are free.
Expected<bool> Engine::Reclaim(int32_t need) {
  while (pool_.free() < need) {
    int32_t idle = -1;
    for (int32_t s = 0; s < static_cast<int32_t>(slots_.size()); ++s) {
      const Slot& slot = slots_[s];
      if (slot.seq >= 0 || slot.pinned || slot.pages.empty()) continue;
      if (idle < 0 || slot.used < slots_[idle].used) idle = s;
    }
    if (idle >= 0) {
      Truncate(slots_[idle], 0);
      continue;
    }
    auto prefix = prefixes_.end();
    for (auto it = prefixes_.begin(); it != prefixes_.end(); ++it) {
      if (!it->pages.empty() && (prefix == prefixes_.end() || it->used < prefix->used)) prefix = it;
    }
    if (prefix != prefixes_.end()) {
      Prefix moved = std::move(*prefix);
      prefixes_.erase(prefix);
      GZ_RETURN_IF_ERROR(ToHost(moved));
      if (!moved.host.empty()) prefixes_.push_back(std::move(moved));
      continue;
    }
    auto head = shared_.end();
    for (auto it = shared_.begin(); it != shared_.end(); ++it) {
      const bool unread = std::all_of(it->pages.begin(), it->pages.end(),
                                      [&](int32_t p) { return pool_.refs(p) == 1; });
      if (unread && (head == shared_.end() || it->used < head->used)) head = it;
    }
    if (head != shared_.end()) {
      for (int32_t p : head->pages) pool_.Release(p);
      shared_.erase(head);
      continue;
    }
    return false;
  }
  return true;
}

// Sends a running request back to waiting. Its slot keeps what it wrote, so it resumes from
// there unless the pages are reclaimed first.
void Engine::Preempt(int64_t id) {
  Sequence& seq = sequences_.at(id);
  Slot& slot = slots_[seq.slot];
  Truncate(slot, static_cast<int64_t>(slot.tokens.size()));
  slot.seq = -1;
  slot.used = ++clock_;
  seq.slot = -1;
  waiting_.insert(id);
  ++stats_.preemptions;
}

void Engine::Finish(Sequence& seq) {
  Slot& slot = slots_[seq.slot];
  Truncate(slot, static_cast<int64_t>(slot.tokens.size()));
  slot.seq = -1;
  slot.used = ++clock_;
  sequences_.erase(seq.id);
}

// ---------------------------------------------------------------------------------------------
// Run and post-process.

void Engine::FillTables() {
  std::fill(tables_.begin(), tables_.end(), -1);
  for (size_t s = 0; s < slots_.size(); ++s) {
    std::copy(slots_[s].pages.begin(), slots_[s].pages.end(), tables_.begin() + s * max_pages_);
  }
}

Status Engine::Run() {
  rows_.Clear();
  for (const Planned& p : plan_) {
    const Sequence& seq = sequences_.at(p.id);
    const int64_t start = static_cast<int64_t>(slots_[seq.slot].tokens.size());
    const int64_t end = start + p.rows;
    for (int64_t i = start; i < end; ++i) {
      rows_.Push(seq.tokens[i], seq.slot, static_cast<int32_t>(i),
                 /*want=*/i == static_cast<int64_t>(seq.tokens.size()) - 1);
    }
  }
  FillTables();
  const PageTables tables{tables_.data(), static_cast<int32_t>(slots_.size()), max_pages_};
  // The runner picks the tokens when every wanted row needs only steps 3-5 of sampling.
  picked_ = options_.device_sampling && runner_->CanSample();
  sample_.clear();
  for (const Planned& p : plan_) {
    const Sequence& seq = sequences_.at(p.id);
    if (static_cast<int64_t>(slots_[seq.slot].tokens.size()) + p.rows !=
        static_cast<int64_t>(seq.tokens.size())) {
      continue;  // a prompt piece: no token this step
    }
    const Sampling& s = seq.request.sampling;
    if (s.presence != 0.0f || s.frequency != 0.0f || s.repetition != 1.0f || s.logprobs >= 0) {
      picked_ = false;
      break;
    }
    SampleRow row;
    row.temperature = s.temperature;
    row.top_k = s.top_k;
    row.top_p = s.top_p;
    row.min_p = s.min_p;
    row.seed = seq.seed;
    row.index = static_cast<uint64_t>(static_cast<int64_t>(seq.tokens.size()) - seq.prompt);
    sample_.push_back(row);
  }
  if (picked_) {
    picks_.resize(sample_.size());
    GZ_RETURN_IF_ERROR(runner_->StepSample(rows_, tables, sample_, picks_.data()));
    ++stats_.device_sampled;
  } else {
    GZ_RETURN_IF_ERROR(runner_->Step(rows_, tables, logits_.data()));
  }
  for (const Planned& p : plan_) {
    const Sequence& seq = sequences_.at(p.id);
    Slot& slot = slots_[seq.slot];
    const int64_t start = static_cast<int64_t>(slot.tokens.size());
    slot.tokens.insert(slot.tokens.end(), seq.tokens.begin() + start,
                       seq.tokens.begin() + start + p.rows);
  }
  ++stats_.steps;
  stats_.rows += rows_.size();
  return Status::Ok();
}

void Engine::PostProcess(std::vector<Progress>& progress) {
  int64_t wanted = 0;
  for (const Planned& p : plan_) {
    Sequence& seq = sequences_.at(p.id);
    Slot& slot = slots_[seq.slot];
    // A head, once read, is registered for the prompts that start with it.
    if (seq.head > 0 && !seq.head_shared && static_cast<int64_t>(slot.tokens.size()) >= seq.head) {
      seq.head_shared = true;
      std::vector<int32_t> head(seq.tokens.begin(), seq.tokens.begin() + seq.head);
      const bool known = std::any_of(shared_.begin(), shared_.end(),
                                     [&](const Shared& s) { return s.tokens == head; });
      if (!known) {
        Shared s{std::move(head), {}, ++clock_};
        for (int32_t b = 0; b < seq.head / kPage; ++b) {
          pool_.Retain(slot.pages[b]);
          s.pages.push_back(slot.pages[b]);
        }
        shared_.push_back(std::move(s));
        while (shared_.size() > 2 * slots_.size()) {
          auto oldest =
              std::min_element(shared_.begin(), shared_.end(),
                               [](const Shared& a, const Shared& b) { return a.used < b.used; });
          for (int32_t page : oldest->pages) pool_.Release(page);
          shared_.erase(oldest);
        }
      }
    }
    if (slot.tokens.size() != seq.tokens.size()) continue;  // a prompt piece, no logits yet

    Logprobs logprobs;
    int32_t token;
    if (picked_) {
      token = picks_[wanted++];
    } else {
      std::span<const float> logits(&logits_[wanted++ * vocab_], vocab_);
      std::span<const int32_t> all(seq.tokens);
      token = sampler_.Sample(logits, seq.request.sampling, seq.seed, all.first(seq.prompt),
                              all.subspan(seq.prompt), &logprobs);
    }
    Progress out;
    out.id = seq.id;
    if (!seq.reported) {
      seq.reported = true;
      out.cached = seq.cached;
    }
    if (token == kNonFiniteToken) {
      // This request ends; the others of the step go on.
      out.end = "error";
      out.status = Internal("the logits after " + std::to_string(seq.tokens.size()) +
                            " tokens hold NaN or infinity: the model's weights hold non-finite "
                            "values, or its activations overflow");
    } else if (std::find(seq.stop.begin(), seq.stop.end(), token) != seq.stop.end()) {
      out.end = "stop";
    } else {
      seq.tokens.push_back(token);
      out.tokens.push_back(token);
      if (seq.request.sampling.logprobs >= 0) out.logprobs.push_back(std::move(logprobs));
      const int64_t answer = static_cast<int64_t>(seq.tokens.size()) - seq.prompt;
      if ((seq.request.limit > 0 && answer >= seq.request.limit) ||
          static_cast<int64_t>(seq.tokens.size()) > options_.context) {
        out.end = "length";
      }
    }
    if (!out.end.empty()) Finish(seq);
    progress.push_back(std::move(out));
  }
}

// ---------------------------------------------------------------------------------------------
// Low level steps on idle slots.

Status Engine::BuildRows(std::span<const int32_t> tokens, std::span<const int32_t> slots,
                         std::span<const int32_t> wanted) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (static_cast<int64_t>(slots.size()) != n) {
    return InvalidArgument("step slots: expected one per token (" + std::to_string(n) + "), got " +
                           std::to_string(slots.size()));
  }
  if (n == 0 || n > options_.rows) {
    return InvalidArgument("step tokens: expected 1 to " + std::to_string(options_.rows) +
                           " rows, got " + std::to_string(n));
  }
  for (size_t i = 0; i < wanted.size(); ++i) {
    if (wanted[i] < 0 || wanted[i] >= n || (i > 0 && wanted[i] <= wanted[i - 1])) {
      return InvalidArgument("step wanted[" + std::to_string(i) +
                             "]: expected ascending rows in [0, " + std::to_string(n) + ")");
    }
  }
  std::vector<int64_t> count(slots_.size(), 0);
  for (int64_t r = 0; r < n; ++r) {
    const int32_t s = slots[r];
    if (s < 0 || s >= static_cast<int32_t>(slots_.size())) {
      return InvalidArgument("step slots[" + std::to_string(r) + "]: slot " + std::to_string(s) +
                             " is outside [0, " + std::to_string(slots_.size()) + ")");
    }
    if (slots_[s].seq >= 0) {
      return InvalidArgument("step slots[" + std::to_string(r) + "]: a request runs in slot " +
                             std::to_string(s));
    }
    if (count[s] > 0 && slots[r - 1] != s) {
      return InvalidArgument("step slots[" + std::to_string(r) + "]: rows of slot " +
                             std::to_string(s) + " must be consecutive");
    }
    if (tokens[r] < 0 || tokens[r] >= vocab_) {
      return InvalidArgument("step tokens[" + std::to_string(r) + "]: token " +
                             std::to_string(tokens[r]) + " is outside the vocabulary");
    }
    ++count[s];
  }
  for (size_t s = 0; s < slots_.size(); ++s) {
    if (count[s] > 0 &&
        static_cast<int64_t>(slots_[s].tokens.size()) + count[s] > options_.context) {
      return ResourceExhausted("step: slot " + std::to_string(s) + " would pass the context of " +
                               std::to_string(options_.context));
    }
  }
  // Pages: the slots of this call keep theirs while others' caches make room.
  int32_t need = 0;
  for (size_t s = 0; s < slots_.size(); ++s) {
    if (count[s] == 0) continue;
    slots_[s].pinned = true;
    need +=
        PagesFor(slots_[s].tokens.size() + count[s]) - static_cast<int32_t>(slots_[s].pages.size());
  }
  Expected<bool> room = Reclaim(need);
  for (Slot& slot : slots_) slot.pinned = false;
  GZ_RETURN_IF_ERROR(room.status());
  if (!*room) {
    return ResourceExhausted("step: needs " + std::to_string(need) + " more KV pages, " +
                             std::to_string(pool_.free()) + " free");
  }
  rows_.Clear();
  std::vector<bool> is_wanted(n, false);
  for (int32_t w : wanted) is_wanted[w] = true;
  std::vector<int64_t> next(slots_.size());
  for (size_t s = 0; s < slots_.size(); ++s) {
    next[s] = static_cast<int64_t>(slots_[s].tokens.size());
    if (count[s] == 0) continue;
    // Positions it writes must be its own pages.
    Truncate(slots_[s], next[s]);
    const int64_t block = next[s] / kPage;
    if (block < static_cast<int64_t>(slots_[s].pages.size()) &&
        pool_.refs(slots_[s].pages[block]) > 1) {
      return InvalidArgument("step: slot " + std::to_string(s) +
                             " would write a page a shared head holds; Reset it first");
    }
    while (static_cast<int64_t>(slots_[s].pages.size()) < PagesFor(next[s] + count[s])) {
      slots_[s].pages.push_back(*pool_.Allocate());
    }
  }
  for (int64_t r = 0; r < n; ++r) {
    rows_.Push(tokens[r], slots[r], static_cast<int32_t>(next[slots[r]]++), is_wanted[r]);
  }
  FillTables();
  return Status::Ok();
}

Expected<std::vector<float>> Engine::Step(std::span<const int32_t> tokens,
                                          std::span<const int32_t> slots,
                                          std::span<const int32_t> wanted) {
  GZ_RETURN_IF_ERROR(BuildRows(tokens, slots, wanted));
  std::vector<float> logits(wanted.size() * vocab_);
  const PageTables tables{tables_.data(), static_cast<int32_t>(slots_.size()), max_pages_};
  GZ_RETURN_IF_ERROR(runner_->Step(rows_, tables, logits.data()));
  for (size_t r = 0; r < tokens.size(); ++r) slots_[slots[r]].tokens.push_back(tokens[r]);
  ++stats_.steps;
  stats_.rows += rows_.size();
  return logits;
}

Expected<std::vector<float>> Engine::Hidden(std::span<const int32_t> tokens,
                                            std::span<const int32_t> slots,
                                            std::span<const int> layers) {
  for (size_t i = 0; i < layers.size(); ++i) {
    if (layers[i] < 0 || layers[i] > runner_->arch().layers) {
      return InvalidArgument("hidden layers[" + std::to_string(i) + "]: expected in [0, " +
                             std::to_string(runner_->arch().layers) + "], got " +
                             std::to_string(layers[i]));
    }
  }
  GZ_RETURN_IF_ERROR(BuildRows(tokens, slots, {}));
  std::vector<float> out(layers.size() * tokens.size() * runner_->arch().dim);
  const PageTables tables{tables_.data(), static_cast<int32_t>(slots_.size()), max_pages_};
  GZ_RETURN_IF_ERROR(runner_->Hidden(rows_, tables, layers, out.data()));
  for (size_t r = 0; r < tokens.size(); ++r) slots_[slots[r]].tokens.push_back(tokens[r]);
  ++stats_.steps;
  stats_.rows += rows_.size();
  return out;
}

Status Engine::Warm(int32_t max_decode_shapes) {
  for (const Slot& slot : slots_) {
    if (slot.seq >= 0 || slot.pinned) return InvalidArgument("warm: a request runs in a slot");
  }
  DropCaches();
  const int32_t slots = static_cast<int32_t>(slots_.size());
  auto reset_all = [&] {
    for (Slot& slot : slots_) Truncate(slot, 0);
  };
  // One prompt step of the most rows (in one slot, as far as its context allows) with its
  // last row wanted, then decode steps of n rows, one per slot.
  const int64_t prompt = std::min<int64_t>(options_.rows, options_.context);
  std::vector<int32_t> tokens(prompt), slot_of(prompt, 0);
  for (int64_t i = 0; i < prompt; ++i) tokens[i] = static_cast<int32_t>(i % vocab_);
  const int32_t last = static_cast<int32_t>(prompt - 1);
  GZ_RETURN_IF_ERROR(BuildRows(tokens, slot_of, std::span<const int32_t>(&last, 1)));
  const PageTables tables{tables_.data(), slots, max_pages_};
  // Both ways of ending a step: logits to the host, and tokens picked by the runner.
  GZ_RETURN_IF_ERROR(runner_->Step(rows_, tables, logits_.data()));
  reset_all();
  const int32_t shapes = std::min(slots, std::max(max_decode_shapes, 1));
  for (int32_t n = 1; n <= shapes; ++n) {
    std::vector<int32_t> t(n), s(n), w(n);
    for (int32_t r = 0; r < n; ++r) t[r] = r % vocab_, s[r] = r, w[r] = r;
    GZ_RETURN_IF_ERROR(BuildRows(t, s, w));
    const PageTables tab{tables_.data(), slots, max_pages_};
    if (options_.device_sampling && runner_->CanSample()) {
      std::vector<SampleRow> params(n);
      for (int32_t r = 0; r < n; ++r) params[r].temperature = r % 2 ? 0.7f : 0.0f;
      params[0].top_p = 0.9f;
      picks_.resize(n);
      GZ_RETURN_IF_ERROR(runner_->StepSample(rows_, tab, params, picks_.data()));
    } else {
      GZ_RETURN_IF_ERROR(runner_->Step(rows_, tab, logits_.data()));
    }
    reset_all();
  }
  return Status::Ok();
}

Status Engine::Reset(int32_t slot) {
  if (slot < 0 || slot >= static_cast<int32_t>(slots_.size())) {
    return InvalidArgument("reset: slot " + std::to_string(slot) + " is outside [0, " +
                           std::to_string(slots_.size()) + ")");
  }
  if (slots_[slot].seq >= 0) {
    return InvalidArgument("reset: a request runs in slot " + std::to_string(slot));
  }
  Truncate(slots_[slot], 0);
  return Status::Ok();
}

void Engine::DropCaches() {
  for (Slot& slot : slots_) {
    if (slot.seq < 0) Truncate(slot, 0);
  }
  for (Prefix& p : prefixes_) ReleasePrefix(p);
  prefixes_.clear();
  for (Shared& s : shared_) {
    for (int32_t p : s.pages) pool_.Release(p);
  }
  shared_.clear();
}

Status Engine::CheckPages() const {
  std::vector<int32_t> refs(pool_.pages(), 0);
  // Tokens each page holds, from the first holder seen; every other holder must agree.
  std::vector<const int32_t*> content(pool_.pages(), nullptr);
  std::vector<int32_t> filled(pool_.pages(), 0);
  auto hold = [&](const std::vector<int32_t>& pages, const std::vector<int32_t>& tokens,
                  const std::string& who) -> Status {
    for (size_t b = 0; b < pages.size(); ++b) {
      const int32_t p = pages[b];
      if (p < 0 || p >= pool_.pages()) return Internal(who + ": page " + std::to_string(p));
      ++refs[p];
      const int64_t begin = static_cast<int64_t>(b) * kPage;
      const int32_t n = static_cast<int32_t>(
          std::clamp<int64_t>(static_cast<int64_t>(tokens.size()) - begin, 0, kPage));
      if (content[p] != nullptr) {
        const int32_t common = std::min(n, filled[p]);
        if (!std::equal(content[p], content[p] + common, tokens.data() + begin)) {
          return Internal(who + ": page " + std::to_string(p) + " holds other tokens elsewhere");
        }
      }
      if (n > filled[p]) content[p] = tokens.data() + begin, filled[p] = n;
    }
    return Status::Ok();
  };
  for (size_t s = 0; s < slots_.size(); ++s) {
    const Slot& slot = slots_[s];
    const std::string who = "slot " + std::to_string(s);
    if (static_cast<int32_t>(slot.pages.size()) != PagesFor(slot.tokens.size())) {
      return Internal(who + ": " + std::to_string(slot.pages.size()) + " pages for " +
                      std::to_string(slot.tokens.size()) + " tokens");
    }
    GZ_RETURN_IF_ERROR(hold(slot.pages, slot.tokens, who));
    if (slot.seq >= 0) {
      auto it = sequences_.find(slot.seq);
      if (it == sequences_.end() || it->second.slot != static_cast<int32_t>(s)) {
        return Internal(who + ": runs a request that does not run there");
      }
      if (!std::equal(slot.tokens.begin(), slot.tokens.end(), it->second.tokens.begin())) {
        return Internal(who + ": holds tokens its request does not have");
      }
    }
  }
  for (const Prefix& p : prefixes_) {
    if (!p.pages.empty() && static_cast<int32_t>(p.pages.size()) != PagesFor(p.tokens.size())) {
      return Internal("prefix: pages do not cover its tokens");
    }
    if (!p.host.empty() &&
        static_cast<int64_t>(p.host.size()) != PagesFor(p.tokens.size()) * page_bytes_) {
      return Internal("prefix: host copy does not cover its tokens");
    }
    GZ_RETURN_IF_ERROR(hold(p.pages, p.tokens, "prefix"));
  }
  for (const Shared& s : shared_) {
    if (s.tokens.size() != s.pages.size() * kPage) return Internal("shared: not whole pages");
    GZ_RETURN_IF_ERROR(hold(s.pages, s.tokens, "shared"));
  }
  // A page a slot writes next is its own.
  for (size_t s = 0; s < slots_.size(); ++s) {
    const Slot& slot = slots_[s];
    const size_t block = slot.tokens.size() / kPage;
    if (slot.seq >= 0 && block < slot.pages.size() && refs[slot.pages[block]] != 1) {
      return Internal("slot " + std::to_string(s) + " writes next into a page others hold");
    }
  }
  std::vector<bool> on_list(pool_.pages(), false);
  for (int32_t p : pool_.free_list()) {
    if (on_list[p]) return Internal("page " + std::to_string(p) + " twice on the free list");
    on_list[p] = true;
  }
  for (int32_t p = 0; p < pool_.pages(); ++p) {
    if (refs[p] != pool_.refs(p)) {
      return Internal("page " + std::to_string(p) + ": " + std::to_string(pool_.refs(p)) +
                      " references counted, " + std::to_string(refs[p]) + " holders");
    }
    if ((refs[p] == 0) != on_list[p]) {
      return Internal("page " + std::to_string(p) + (refs[p] == 0 ? " leaked" : " free but held"));
    }
  }
  int64_t host = 0;
  for (const Prefix& p : prefixes_) host += static_cast<int64_t>(p.host.size());
  if (host != host_bytes_) return Internal("host prefix bytes do not add up");
  return Status::Ok();
}

}  // namespace gizllm
