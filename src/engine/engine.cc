#include "engine/engine.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstring>
#include <future>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "core/check.h"
#include "core/word_hash.h"
#include "engine/lookup_drafter.h"
#include "ops/backend.h"

namespace gizllm {
namespace {

// Seeds of requests that bring none: a function of the request id.
constexpr uint64_t kDefaultSeedBase = 0x67697a6c6c6d5eedull;

}  // namespace

Status EngineOptions::Check() const {
  if (mask_threads < 0) {
    return InvalidArgument("engine mask threads: expected >= 0, got " +
                           std::to_string(mask_threads));
  }
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
  if (busy_rows != 0 && (busy_rows < slots || busy_rows > rows)) {
    return InvalidArgument("engine busy_rows: expected 0 or from the slots (" +
                           std::to_string(slots) + ") to rows (" + std::to_string(rows) +
                           "), got " + std::to_string(busy_rows));
  }
  if (draft == DraftMode::kBlock && drafts > 0) {
    if (!block_drafter) return InvalidArgument("engine draft: block drafts without a drafter");
    if (drafts > block_drafter->MostDrafts()) {
      return InvalidArgument("engine drafts: " + std::to_string(drafts) +
                             ", but the block drafter gives at most " +
                             std::to_string(block_drafter->MostDrafts()));
    }
  }
  if (prefix_state_bytes < 0) {
    return InvalidArgument("engine prefix_state_bytes: expected >= 0, got " +
                           std::to_string(prefix_state_bytes));
  }
  if (host_prefix_bytes < 0) {
    return InvalidArgument("engine host_prefix_bytes: expected >= 0, got " +
                           std::to_string(host_prefix_bytes));
  }
  if (drafts < 0 || drafts > kMaxDrafts) {
    return InvalidArgument("engine drafts: expected in [0, " + std::to_string(kMaxDrafts) +
                           "], got " + std::to_string(drafts));
  }
  if (kv_budget_bytes <= 0) {
    return InvalidArgument("engine kv_budget_bytes: expected > 0, got " +
                           std::to_string(kv_budget_bytes));
  }
  return Status::Ok();
}

int64_t Engine::StateBytes(std::span<const CacheSpec> caches, const EngineOptions& options) {
  // An engine that reads drafts keeps a second snapshot a slot (the states before a step with
  // drafts) and each row's inputs to the state updates (Runner::ReserveDrafts).
  const bool drafts = options.draft != DraftMode::kNone && options.drafts > 0;
  int64_t slot_state_bytes = 0, row_input_bytes = 0;
  for (const CacheSpec& c : caches) {
    slot_state_bytes += c.SlotStateBytes();
    row_input_bytes += c.RowInputBytes();
  }
  return slot_state_bytes * (drafts ? 3 : 2) * static_cast<int64_t>(options.slots) +
         (drafts ? row_input_bytes * options.rows : 0);
}

Expected<std::unique_ptr<Engine>> Engine::Create(Runner* runner, const EngineOptions& options) {
  GZ_RETURN_IF_ERROR(options.Check());
  const Arch& arch = runner->arch();
  if (arch.context > 0 && options.context > arch.context) {
    return InvalidArgument("engine context: " + std::to_string(options.context) +
                           " exceeds the model's max_position_embeddings " +
                           std::to_string(arch.context));
  }
  if (options.draft == DraftMode::kMtp && options.drafts > 0 && !runner->HasMtp()) {
    return InvalidArgument("engine draft: MTP drafts need a model with an MTP layer; " +
                           arch.family + " here has none");
  }
  // Window paging wherever the model allows it (its window layers keep only their window) and
  // the budget holds one sequence of the whole context under it.
  KvPaging paging = runner->PagesWindows() ? KvPagingOf(runner->caches()) : KvPaging{};
  const int32_t max_pages = PagesFor(options.context);
  // The slots' recurrent states and their snapshots (float32, allocated by the runner's
  // Reserve) come out of the budget first; the rest holds pages.
  const bool drafts = options.draft != DraftMode::kNone && options.drafts > 0;
  const int64_t state_bytes = StateBytes(runner->caches(), options);
  const int64_t page_budget = std::max<int64_t>(0, options.kv_budget_bytes - state_bytes);
  // One sequence of the whole context: its blocks, and the window layers' pages it holds at once.
  auto sequence_pages = [&] {
    return max_pages +
           paging.window_groups * std::min(max_pages, WindowBlocks(paging.window, options.rows));
  };
  if (paging.enabled() && page_budget / paging.page_bytes < sequence_pages()) paging = {};
  const int64_t page_bytes = paging.enabled() ? paging.page_bytes : runner->PageBytes();
  if (page_bytes <= 0) {
    return InvalidArgument("engine: the model (" + arch.family +
                           ") has no attention layer, so no KV pages; such models are not "
                           "supported");
  }
  const int64_t pages = page_budget / page_bytes;
  if (pages < sequence_pages()) {
    return InvalidArgument(
        "engine kv_budget_bytes: " + std::to_string(options.kv_budget_bytes) + " bytes" +
        (state_bytes > 0 ? " less " + std::to_string(state_bytes) +
                               " bytes of recurrent states, their snapshots and draft inputs (" +
                               std::to_string(options.slots) + " slots)"
                         : std::string()) +
        " hold " + std::to_string(pages) + " pages of " + std::to_string(page_bytes) +
        " bytes; one sequence of context " + std::to_string(options.context) + " needs " +
        std::to_string(sequence_pages()));
  }
  if (pages > INT32_MAX) return InvalidArgument("engine kv_budget_bytes: too many pages");
  // The pool is the one allocation that grows with the context: say which context asked for it.
  if (Status s = runner->AllocatePages(static_cast<int32_t>(pages), paging.enabled()); !s.ok()) {
    return s.Annotate("KV pages for a context of " + std::to_string(options.context) +
                      " positions (" + std::to_string(pages) + " pages, " +
                      std::to_string(pages * page_bytes) +
                      " bytes; a shorter context needs fewer)");
  }
  if (drafts) GZ_RETURN_IF_ERROR(runner->ReserveDrafts());
  GZ_RETURN_IF_ERROR(runner->Reserve(options.rows, options.slots, max_pages));
  const bool mtp = drafts && runner->HasMtp() &&
                   (options.draft == DraftMode::kMtp || options.draft == DraftMode::kAuto);
  if (mtp) GZ_RETURN_IF_ERROR(runner->KeepHidden());
  const bool block = drafts && options.draft == DraftMode::kBlock;
  if (block) {
    GZ_RETURN_IF_ERROR(runner->KeepFeatures(options.block_drafter->FeatureLayers()));
  }
  auto engine = std::unique_ptr<Engine>(
      new Engine(runner, options, paging, static_cast<int32_t>(pages), max_pages));
  engine->mtp_ = mtp;
  engine->block_ = block;
  engine->pacer_.SetDraftRuns(mtp);
  // Paced, a model with an MTP layer also weighs lookup drafts: on text that repeats itself they
  // are kept as often and need no run.
  if (mtp && options.draft == DraftMode::kAuto) engine->pacer_.AddLookup();
  // Paced lookup is judged without drafting (Sequence::shadow).
  if (drafts && !block && options.draft == DraftMode::kAuto) {
    engine->paced_lookup_ = mtp ? DraftPacer::kLookup : 0;
    engine->pacer_.JudgedWithoutDrafts(engine->paced_lookup_);
  }
  return engine;
}

Engine::Engine(Runner* runner, const EngineOptions& options, KvPaging paging, int32_t pages,
               int32_t max_pages)
    : runner_(runner),
      options_(options),
      vocab_(runner->arch().vocab),
      max_pages_(max_pages),
      paging_(paging),
      page_bytes_(paging_.enabled() ? paging_.page_bytes : runner->PageBytes()),
      pool_(pages),
      cache_(&pool_, runner, page_bytes_, paging_, options.host_prefix_bytes,
             options.prefix_state_bytes, options.slots,
             &stats_.host_copies),
      sampler_(runner->arch().vocab),
      tables_(static_cast<size_t>(options.slots) * max_pages, -1),
      window_tables_(static_cast<size_t>(paging_.window_groups) * options.slots * max_pages, -1),
      // Wanted rows: one a sequence, and its drafts.
      logits_(
          static_cast<size_t>(std::min<int64_t>(
              options.rows, static_cast<int64_t>(options.slots) *
                                (1 + (options.draft == DraftMode::kNone ? 0 : options.drafts)))) *
          runner->arch().vocab),
      appended_(options.slots, 0),
      drafted_(options.slots, 0),
      pacer_(options.busy_rows > 0 ? options.busy_rows : options.rows, options.drafts) {
  state_.rows = options.rows;
  state_.busy_rows = options.busy_rows > 0 ? options.busy_rows : options.rows;
  state_.runner = runner;
  state_.page_bytes = page_bytes_;
  state_.paging = paging_;
  state_.window_blocks = std::min(max_pages, WindowBlocks(paging_.window, options.rows));
  state_.pool = &pool_;
  state_.cache = &cache_;
  state_.stats = &stats_;
  state_.slot_states = HasSlotStates(runner->caches());
  state_.slots.resize(options.slots);
  state_.plan.reserve(options.slots);
}

Engine::~Engine() = default;

const std::vector<int32_t>& Engine::held(int32_t slot) const { return state_.slots[slot].tokens; }

namespace {

// What picture row j of `p` holds, for its key: the reader's digest of its picture and place
// (PromptPictures::keys), or a hash of the row and its deepstack features (host rows).
uint64_t PictureRowContent(const PromptPictures& p, int64_t j, int64_t dim) {
  if (!p.keys.empty()) return p.keys[j];
  WordHash h;
  h.Mix(p.embeddings.data() + j * dim, dim * sizeof(float));
  for (int l = 0; l < p.layers; ++l)
    h.Mix(p.deepstack.data() + (l * p.count() + j) * dim, dim * sizeof(float));
  return h.Final();
}

// The key that stands for picture row j of `p` in a sequence's tokens: a hash of what the
// language model reads there (the row's content, its three positions), as a negative number
// (no token of any vocabulary).
int32_t PictureRowKey(const PromptPictures& p, int64_t j, int64_t dim) {
  WordHash h;
  h.Mix(PictureRowContent(p, j, dim));
  const int64_t r = p.rows[j];
  const int32_t pos[3] = {p.positions.t[r], p.positions.h[r], p.positions.w[r]};
  h.Mix(pos, sizeof(pos));
  return -2 - static_cast<int32_t>(h.Final() % (uint64_t{1} << 30));
}

// `p`'s host rows copied once into `be`'s memory (one upload a request instead of one a step),
// keyed by their contents as before.
Expected<std::shared_ptr<const PromptPictures>> UploadPictures(const PromptPictures& p, Backend& be,
                                                               int64_t dim) {
  auto out = std::make_shared<PromptPictures>();
  out->positions = p.positions;
  out->rows = p.rows;
  out->layers = p.layers;
  out->keys.resize(p.count());
  for (int64_t j = 0; j < p.count(); ++j) out->keys[j] = PictureRowContent(p, j, dim);
  const size_t plane = p.count() * dim * sizeof(float);
  auto buffer = be.Allocate(std::max<size_t>(plane * (1 + p.layers), 64));
  if (!buffer.ok()) return buffer.status().Annotate("request.pictures: the rows on the device");
  be.CopyToDevice((*buffer)->data(), p.embeddings.data(), plane);
  if (p.layers > 0) {
    be.CopyToDevice(static_cast<char*>((*buffer)->data()) + plane, p.deepstack.data(),
                    plane * p.layers);
  }
  out->device = std::move(buffer).value();
  out->device_backend = &be;
  return std::shared_ptr<const PromptPictures>(std::move(out));
}

// Picture row `index` of `p` at step row `row`, read where the rows lie.
void PushVisual(const PromptPictures& p, int64_t index, int32_t row, int64_t dim, VisualRows* v) {
  v->rows.push_back(row);
  v->sources.push_back({p.DeviceRow(index, dim), p.count() * dim, p.layers});
  v->layers = std::max(v->layers, p.layers);
}

}  // namespace

Status Engine::CheckPictures(std::span<const int32_t> prompt, const PromptPictures& p) const {
  const int64_t n = static_cast<int64_t>(prompt.size());
  const int64_t dim = runner_->arch().dim;
  const int64_t count = static_cast<int64_t>(p.rows.size());
  const MropePositions& pos = p.positions;
  if (static_cast<int64_t>(pos.t.size()) != n || static_cast<int64_t>(pos.h.size()) != n ||
      static_cast<int64_t>(pos.w.size()) != n) {
    return InvalidArgument("request.pictures: expected three rotary positions for each of the " +
                           std::to_string(n) + " prompt tokens");
  }
  for (int64_t i = 0; i < n; ++i) {
    const int32_t most = std::max({pos.t[i], pos.h[i], pos.w[i]});
    if (std::min({pos.t[i], pos.h[i], pos.w[i]}) < 0 || most >= pos.next) {
      return InvalidArgument("request.pictures: the positions of prompt token " +
                             std::to_string(i) + " are outside [0, next " +
                             std::to_string(pos.next) + ")");
    }
  }
  if (pos.next > options_.context) {
    return InvalidArgument("request.pictures: the prompt's rotary positions reach " +
                           std::to_string(pos.next) + ", past the engine's context");
  }
  for (int64_t j = 0; j < count; ++j) {
    if (p.rows[j] < 0 || p.rows[j] >= n || (j > 0 && p.rows[j] <= p.rows[j - 1])) {
      return InvalidArgument("request.pictures: rows must be ascending prompt rows");
    }
  }
  if (!p.keys.empty() && static_cast<int64_t>(p.keys.size()) != count) {
    return InvalidArgument("request.pictures: expected a key for each of the " +
                           std::to_string(count) + " picture rows");
  }
  if (p.on_device()) {
    if (p.device_backend == nullptr || p.device_backend != runner_->StepBackend()) {
      return InvalidArgument(
          "request.pictures: the rows lie in another device's memory than the model's");
    }
    if (p.keys.empty() || !p.embeddings.empty() || !p.deepstack.empty() || p.layers < 0 ||
        p.layers > runner_->arch().layers ||
        p.device->bytes() < static_cast<size_t>((1 + p.layers) * count * dim) * sizeof(float)) {
      return InvalidArgument(
          "request.pictures: rows on the device need their keys, no host "
          "rows and [1 + layers, " +
          std::to_string(count) + ", " + std::to_string(dim) + "] floats");
    }
    return Status::Ok();
  }
  if (static_cast<int64_t>(p.embeddings.size()) != count * dim) {
    return InvalidArgument("request.pictures: expected embeddings [" + std::to_string(count) +
                           ", " + std::to_string(dim) + "]");
  }
  if (p.layers < 0 || p.layers > runner_->arch().layers ||
      static_cast<int64_t>(p.deepstack.size()) != p.layers * count * dim) {
    return InvalidArgument("request.pictures: expected deepstack features [layers <= " +
                           std::to_string(runner_->arch().layers) + ", " + std::to_string(count) +
                           ", " + std::to_string(dim) + "]");
  }
  return Status::Ok();
}

Expected<int64_t> Engine::Add(Request request, int32_t mark, int32_t shared) {
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
  if (shared < 0 || shared > n) {
    return InvalidArgument("request shared start: expected in [0, " + std::to_string(n) +
                           "], got " + std::to_string(shared));
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
  if (const auto& g = request.sampling.grammar; g != nullptr && g->vocabulary->size() != vocab_) {
    return InvalidArgument("request.sampling.grammar: the tokens' bytes cover " +
                           std::to_string(g->vocabulary->size()) + " tokens, the model has " +
                           std::to_string(vocab_));
  }
  if (request.pictures) {
    GZ_RETURN_IF_ERROR(CheckPictures(request.prompt, *request.pictures));
    // Host rows go to the device once, not a step at a time.
    if (Backend* be = runner_->StepBackend();
        be != nullptr && !request.pictures->on_device() && !request.pictures->rows.empty()) {
      GZ_ASSIGN_OR_RETURN(request.pictures,
                          UploadPictures(*request.pictures, *be, runner_->arch().dim));
    }
  }
  const int64_t id = next_id_++;
  Sequence seq;
  if (request.sampling.grammar) {
    seq.matcher = std::make_unique<TokenMatcher>(*request.sampling.grammar);
    const Sampling& s = request.sampling;
    seq.grammar_phase = s.thinking && s.think_close >= 0 ? Sequence::GrammarPhase::kThinking
                        : s.think_open >= 0 && s.think_close >= 0 ? Sequence::GrammarPhase::kStart
                                                                  : Sequence::GrammarPhase::kHeld;
  }
  seq.id = id;
  seq.tokens = request.prompt;
  seq.prompt = n;
  if (const PromptPictures* p = request.pictures.get()) {
    seq.picture_row.assign(n, -1);
    for (size_t j = 0; j < p->rows.size(); ++j) {
      seq.picture_row[p->rows[j]] = static_cast<int32_t>(j);
      seq.tokens[p->rows[j]] = PictureRowKey(*p, static_cast<int64_t>(j), runner_->arch().dim);
    }
  }
  seq.mark = mark;
  seq.shared = shared / kPage * kPage;
  seq.seed = request.sampling.seed.value_or(CounterHash(kDefaultSeedBase, id));
  seq.stop = std::move(stop);
  seq.request = std::move(request);
  state_.sequences.emplace(id, std::move(seq));
  state_.waiting.insert(id);
  return id;
}

Expected<std::vector<Progress>> Engine::Advance() {
  std::vector<Progress> progress;
  GZ_RETURN_IF_ERROR(Admit(state_));
  GZ_RETURN_IF_ERROR(Draft());
  GZ_RETURN_IF_ERROR(Schedule(state_));
  if (state_.plan.empty()) return progress;
  GZ_RETURN_IF_ERROR(Run());
  PostProcess(progress);
  return progress;
}

bool Engine::Cancel(int64_t id) {
  auto it = state_.sequences.find(id);
  if (it == state_.sequences.end()) return false;
  if (it->second.slot < 0) {
    state_.waiting.erase(id);
    state_.sequences.erase(it);
  } else {
    Finish(state_, it->second);
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
// Run and post-process.

// Sequences a step whose lookup drafts are proposed without drafting, for the pacer's estimate
// of lookup's acceptance (Engine::JudgeShadows): each costs a lookup over its tokens.
constexpr int64_t kShadowSequences = 2;

// Lookup drafts proposed and not read are judged as they would have been read: each kept while
// it and those before it are the tokens that came (sampling picks the same tokens with drafts and
// without), so the pacer knows lookup's acceptance at the cost of a few lookups a step.
void Engine::JudgeShadows() {
  int64_t accepted = 0, rejected = 0;
  for (auto& [id, seq] : state_.sequences) {
    if (seq.shadow.empty()) continue;
    const int64_t came = static_cast<int64_t>(seq.tokens.size()) - seq.shadow_from;
    const int64_t n = std::min<int64_t>(came, static_cast<int64_t>(seq.shadow.size()));
    int64_t kept = 0;
    while (kept < n && seq.tokens[seq.shadow_from + kept] == seq.shadow[kept]) ++kept;
    if (kept < n || kept == static_cast<int64_t>(seq.shadow.size())) {
      accepted += kept;
      rejected += kept < n;
      seq.shadow.clear();
    }
  }
  pacer_.RecordJudged(accepted, rejected, paced_lookup_);
}

// Drafts make no sense for a request whose pick depends on more than (logits, seed, position):
// penalties count the tokens before (a rejected draft would have counted), a grammar's matcher
// advances per kept token. Slot states go back to the last kept row by a snapshot before the
// step and a replay of the kept rows (Runner::KeepDraftRows).
Status Engine::Draft() {
  draft_ms_ = 0.0;
  if (paced_lookup_ >= 0) JudgeShadows();
  int64_t rows = 0, decodes = 0;
  std::vector<std::pair<Sequence*, int64_t>> eligible;  // sequence, most drafts it may keep
  for (auto& [id, seq] : state_.sequences) {
    seq.drafts.clear();
    if (seq.slot < 0) continue;
    const int64_t held = static_cast<int64_t>(state_.slots[seq.slot].tokens.size());
    const int64_t unread = static_cast<int64_t>(seq.tokens.size()) - held;
    rows += unread;
    if (unread != 1) continue;
    ++decodes;
    const Sampling& s = seq.request.sampling;
    if (options_.draft == DraftMode::kNone || seq.request.pictures || s.presence != 0.0f ||
        s.frequency != 0.0f || s.repetition != 1.0f || s.grammar != nullptr) {
      continue;
    }
    // Drafts past the request's limit or the context would never be kept: a step makes at most
    // 1 + drafts tokens, and the last draft's row is at position tokens.size() - 1 + drafts.
    int64_t most = std::min<int64_t>(options_.drafts, options_.context - seq.tokens.size());
    if (seq.request.limit > 0) {
      most = std::min<int64_t>(
          most, seq.request.limit - 1 - (static_cast<int64_t>(seq.tokens.size()) - seq.prompt));
    }
    if (most > 0) eligible.emplace_back(&seq, most);
  }
  // The pacer decides before any draft is made, as if every eligible sequence found drafts (the
  // most rows the step could take), so a step that will not draft costs no chained MTP rows and
  // no lookups beyond the few proposed for the pacer's estimate (Sequence::shadow).
  int32_t k = 0;
  std::vector<std::pair<Sequence*, int64_t>> cut;  // a probe's: every eligible sequence
  if (!eligible.empty()) {
    k = options_.draft == DraftMode::kLookup || options_.draft == DraftMode::kMtp ||
                options_.draft == DraftMode::kBlock
            ? options_.drafts
            : pacer_.Choose(std::min<int64_t>(rows, state_.busy_rows), decodes,
                            static_cast<int64_t>(eligible.size()));
    // A probe drafts for a few sequences, a different few each time.
    if (k > 0 && options_.draft == DraftMode::kAuto && pacer_.probing() &&
        static_cast<int64_t>(eligible.size()) > DraftPacer::kProbeSequences) {
      const size_t n = eligible.size(), first = probe_turn_++ % n;
      std::vector<std::pair<Sequence*, int64_t>> few;
      for (int64_t i = 0; i < DraftPacer::kProbeSequences; ++i) {
        few.push_back(eligible[(first + i) % n]);
      }
      cut = std::exchange(eligible, std::move(few));
    }
  }
  lookup_step_ = mtp_ && k > 0 && options_.draft == DraftMode::kAuto &&
                 pacer_.drafter() == DraftPacer::kLookup;
  if (paced_lookup_ >= 0) {
    const auto& candidates = cut.empty() ? eligible : cut;
    if (k > 0 && (lookup_step_ || !mtp_)) {
      // Every candidate drafts with lookup (lookup is never probed: its drafts are judged
      // without drafting) and is judged by its drafts.
      for (auto& e : eligible) e.first->shadow.clear();
    } else if (!candidates.empty()) {
      // A few propose lookup drafts that are not read, a different few each step.
      const size_t n = candidates.size(), first = shadow_turn_++ % n;
      int64_t proposed = 0;
      for (size_t i = 0; i < n && proposed < kShadowSequences; ++i) {
        auto& [seq, most] = candidates[(first + i) % n];
        if (!seq->shadow.empty()) continue;
        LookupDraft(seq->tokens, static_cast<int32_t>(most), &seq->shadow);
        seq->shadow_from = static_cast<int64_t>(seq->tokens.size());
        ++proposed;
      }
    }
  }
  // The MTP layer reads the last step's rows even where no sequence drafts: its KV of every
  // position is then there when drafting pays again (a lookup step drafts none with it).
  if (mtp_) {
    GZ_RETURN_IF_ERROR(DraftMtp(eligible, lookup_step_ ? 0 : k));
    if (!lookup_step_) return Status::Ok();
  }
  if (block_) return DraftBlock(eligible, k);
  if (k == 0) return Status::Ok();
  for (auto& [seq, most] : eligible) {
    LookupDraft(seq->tokens, static_cast<int32_t>(std::min<int64_t>(most, k)), &seq->drafts);
  }
  return Status::Ok();
}

Status Engine::DraftMtp(std::span<const std::pair<Sequence*, int64_t>> eligible, int32_t k) {
  const auto began = std::chrono::steady_clock::now();
  // The rows the last step kept, each at position p reading the token at p + 1 and the main
  // model's hidden state at p (its row of the last step).
  Rows& rows = mtp_rows_;
  rows.Clear();
  mtp_sources_.clear();
  std::map<int64_t, int32_t> last;  // sequence -> its last row here
  // Paced (auto), a sequence that drafts nothing leaves its answer's rows unread by the MTP
  // layer: reading them costs about a step's layer and more on a small model, where not drafting
  // is chosen because drafts do not pay. Their positions then hold no MTP keys, which only makes
  // later drafts worse (the pacer sees it in their acceptance); the prompt's rows are always read.
  std::set<int64_t> reading;  // sequences whose answer rows are read, paced
  if (k > 0) {
    for (const auto& e : eligible) reading.insert(e.first->id);
  }
  // Paced, the prompts' rows are read only while MTP drafts could pay with the sequences held
  // now (each drafting, every draft kept): at many sequences, where the step is compute-bound
  // and never drafts, reading them would add a layer to every prompt row for nothing.
  bool read_prompts = true;
  if (options_.draft == DraftMode::kAuto && k == 0) {
    int64_t held = 0;
    for (const auto& [id, seq] : state_.sequences) held += seq.slot >= 0;
    read_prompts = pacer_.CouldPay(std::min<int64_t>(held, state_.busy_rows), 0);
  }
  for (const MtpRow& m : mtp_pending_) {
    auto it = state_.sequences.find(m.id);
    if (it == state_.sequences.end() || it->second.slot != m.slot) continue;
    const Sequence& seq = it->second;
    if (options_.draft == DraftMode::kAuto &&
        (m.position >= seq.prompt ? !reading.count(m.id) : !read_prompts)) {
      continue;
    }
    if (m.position + 1 >= static_cast<int64_t>(seq.tokens.size()) ||
        m.position >= static_cast<int64_t>(state_.slots[m.slot].tokens.size())) {
      continue;
    }
    rows.Push(seq.tokens[m.position + 1], m.slot, m.position, /*want=*/false);
    mtp_sources_.push_back(m.row);
    last[m.id] = static_cast<int32_t>(rows.size() - 1);
  }
  mtp_pending_.clear();
  if (rows.size() == 0) return Status::Ok();
  // The drafting sequences: those whose last row here is the one before their newest token,
  // in row order (the wanted rows ascend).
  struct Drafting {
    int32_t row;  // its row in the last MTP run
    Sequence* seq;
    int64_t most;
  };
  std::vector<Drafting> drafting;
  for (const auto& [seq, most] : eligible) {
    if (k == 0) break;
    auto it = last.find(seq->id);
    if (it == last.end() ||
        rows.positions[it->second] + 2 != static_cast<int64_t>(seq->tokens.size())) {
      continue;
    }
    drafting.push_back({it->second, seq, std::min<int64_t>(most, k)});
  }
  std::sort(drafting.begin(), drafting.end(),
            [](const Drafting& a, const Drafting& b) { return a.row < b.row; });
  // Chained drafts: draft j comes from a row at position P + j - 2 (P: the newest token's),
  // whose keys and values only the chained rows after it read (the next step's first MTP run
  // writes the true ones there): a row past the slot's pages borrows a free page, given back
  // once the drafts are made. Every drafting sequence chains as far as the one with the fewest
  // pages allows; one that may keep fewer drafts keeps its first ones.
  int64_t chained = 0;
  for (const Drafting& d : drafting) chained = std::max<int64_t>(chained, d.most - 1);
  std::vector<Slot*> borrowed;
  for (const Drafting& d : drafting) {
    Slot& slot = state_.slots[d.seq->slot];
    // The last chained row's position: P + chained - 1.
    while (chained > 0 && static_cast<int64_t>(d.seq->tokens.size()) - 2 + chained >=
                              static_cast<int64_t>(slot.pages.size()) * kPage) {
      if (pool_.free() >= BlockPages(state_, 1)) {
        AddBlocks(state_, slot, 1);
        borrowed.push_back(&slot);
      } else {
        --chained;
      }
    }
  }
  for (const Drafting& d : drafting) rows.wanted.push_back(d.row);
  FillTables();
  const int64_t per = 1 + chained;
  mtp_picks_.resize(drafting.size() * per);
  const Status made = runner_->MtpDraft(rows, Tables(), mtp_sources_, static_cast<int32_t>(chained),
                                        mtp_picks_.data());
  for (Slot* slot : borrowed) Truncate(state_, *slot, static_cast<int64_t>(slot->tokens.size()));
  GZ_RETURN_IF_ERROR(made);
  for (size_t i = 0; i < drafting.size(); ++i) {
    const int64_t keep = std::min<int64_t>(drafting[i].most, per);
    drafting[i].seq->drafts.assign(mtp_picks_.begin() + i * per,
                                   mtp_picks_.begin() + i * per + keep);
  }
  // The pacer weighs drafts by this time; a run that drafts nothing (a prompt's rows read) is
  // the prompt's cost, not a step's.
  if (!drafting.empty()) {
    draft_ms_ =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began).count();
  }
  return Status::Ok();
}

Status Engine::DraftBlock(std::span<const std::pair<Sequence*, int64_t>> eligible, int32_t k) {
  // Contexts of sequences that are gone.
  for (auto it = block_contexts_.begin(); it != block_contexts_.end();) {
    it = state_.sequences.count(it->first) ? std::next(it) : block_contexts_.erase(it);
  }
  if (k == 0 || eligible.empty()) return Status::Ok();
  const auto began = std::chrono::steady_clock::now();
  std::vector<BlockDrafter::Context*> contexts;
  std::vector<int32_t> last;
  std::vector<int64_t> positions;
  std::vector<std::pair<Sequence*, int64_t>> drafting;
  for (const auto& [seq, most] : eligible) {
    auto it = block_contexts_.find(seq->id);
    if (it == block_contexts_.end()) continue;  // nothing read yet (a picture, or no step)
    contexts.push_back(it->second.get());
    last.push_back(seq->tokens.back());
    positions.push_back(static_cast<int64_t>(seq->tokens.size()) - 1);
    drafting.emplace_back(seq, std::min<int64_t>(most, k));
  }
  if (drafting.empty()) return Status::Ok();
  std::vector<int32_t> tokens(drafting.size() * k);
  GZ_RETURN_IF_ERROR(options_.block_drafter->Draft(contexts, last, positions, k, tokens.data()));
  for (size_t i = 0; i < drafting.size(); ++i) {
    drafting[i].first->drafts.assign(tokens.begin() + i * k,
                                     tokens.begin() + i * k + drafting[i].second);
  }
  draft_ms_ =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began).count();
  return Status::Ok();
}

Status Engine::ExtendBlockContext(const Sequence& seq, int64_t first, int64_t count,
                                  int64_t position) {
  if (count <= 0) return Status::Ok();
  const float* features = runner_->Features();
  if (!features) return Internal("block drafts: the runner kept no hidden states of the step");
  const std::span<const int> layers = options_.block_drafter->FeatureLayers();
  const int64_t dim = runner_->arch().dim, n = rows_.size(), width = layers.size() * dim;
  // The runner's [layers, rows, dim] as the drafter's [rows, layers * dim].
  block_features_.resize(count * width);
  for (int64_t i = 0; i < count; ++i) {
    for (size_t l = 0; l < layers.size(); ++l) {
      std::copy_n(features + (l * n + first + i) * dim, dim,
                  block_features_.data() + i * width + l * dim);
    }
  }
  std::vector<int64_t> positions(count);
  for (int64_t i = 0; i < count; ++i) positions[i] = position + i;
  auto& context = block_contexts_[seq.id];
  if (!context) context = options_.block_drafter->NewContext();
  return options_.block_drafter->Extend(*context, positions, block_features_.data());
}

void Engine::FillTables() {
  std::fill(tables_.begin(), tables_.end(), -1);
  std::fill(window_tables_.begin(), window_tables_.end(), -1);
  const int32_t groups = paging_.window_groups;
  const size_t table = state_.slots.size() * max_pages_;
  for (size_t s = 0; s < state_.slots.size(); ++s) {
    const Slot& slot = state_.slots[s];
    std::copy(slot.pages.begin(), slot.pages.end(), tables_.begin() + s * max_pages_);
    for (size_t e = 0; e < slot.window_pages.size(); ++e) {
      window_tables_[(e % groups) * table + s * max_pages_ + e / groups] = slot.window_pages[e];
    }
  }
}

PageTables Engine::Tables() const {
  return {tables_.data(), static_cast<int32_t>(state_.slots.size()), max_pages_,
          paging_.enabled() ? window_tables_.data() : nullptr};
}

// Has the sequence's matcher take the token kept last step (Sequence::grammar_token).
static void TakeGrammarToken(Sequence& seq) {
  if (seq.grammar_token < 0) return;
  if (!seq.matcher->Accept(seq.grammar_token)) {
    // Its next mask allows nothing: the pick ends the request with this token named.
    seq.grammar_refused = seq.grammar_token;
  }
  seq.grammar_token = -1;
}

// The sequence's mask for its next token: the grammar's, with think_open allowed where the
// answer has not started (Sequence::GrammarPhase), and none at all once the matcher refused a
// token (the pick then ends the request).
static void FillGrammarMask(Sequence& seq) {
  seq.matcher->FillMask(seq.stop, &seq.mask);
  if (seq.grammar_refused >= 0) {
    std::fill(seq.mask.begin(), seq.mask.end(), 0);
  } else if (seq.grammar_phase == Sequence::GrammarPhase::kStart) {
    const int32_t t = seq.request.sampling.think_open;
    if (t >= 0 && static_cast<size_t>(t >> 6) < seq.mask.size()) {
      seq.mask[t >> 6] |= uint64_t{1} << (t & 63);
    }
  }
}

// Sequences of one grammar in the same parse state share a mask (SharedMasks): the first of each
// state walks the trie, on the pool; the others then find its mask.
std::future<void> Engine::StartMasks() {
  if (masked_.empty()) return {};
  if (!mask_pool_) {
    const int threads = options_.mask_threads > 0
                            ? options_.mask_threads
                            : static_cast<int>(std::thread::hardware_concurrency()) / 2;
    mask_pool_ = std::make_unique<ThreadPool>(std::clamp(threads, 1, 8));
  }
  const int64_t words = MaskWords(vocab_);
  if (picked_) step_masks_.resize(masked_.size() * words);
  return std::async(std::launch::async, [this, words] {
    // The tokens kept last step, taken by the matchers first (each sequence's own).
    mask_pool_->ParallelFor(static_cast<int64_t>(masked_.size()), 1,
                            [&](int64_t begin, int64_t end, int) {
                              for (int64_t i = begin; i < end; ++i) TakeGrammarToken(*masked_[i]);
                            });
    std::vector<int32_t> first, rest;  // indices into masked_
    std::set<std::pair<const void*, std::string>> seen;
    for (size_t i = 0; i < masked_.size(); ++i) {
      Sequence& seq = *masked_[i];
      const void* grammar = seq.request.sampling.grammar->masks.get();
      (seen.emplace(grammar, seq.matcher->StateKey()).second ? first : rest)
          .push_back(static_cast<int32_t>(i));
    }
    for (std::vector<int32_t>* group : {&first, &rest}) {
      mask_pool_->ParallelFor(
          static_cast<int64_t>(group->size()), 1, [&](int64_t begin, int64_t end, int) {
            for (int64_t i = begin; i < end; ++i) {
              const int32_t m = (*group)[i];
              Sequence& seq = *masked_[m];
              FillGrammarMask(seq);
              seq.mask_ready = true;
              if (picked_) std::copy(seq.mask.begin(), seq.mask.end(), &step_masks_[m * words]);
            }
          });
    }
  });
}

Status Engine::Run() {
  rows_.Clear();
  // Picture rows of the step: (row, the sequence's pictures, index among its picture rows).
  struct PictureRow {
    int32_t row;
    const PromptPictures* pictures;
    int32_t index;
  };
  std::vector<PictureRow> picture_rows;
  plan_rows_.clear();
  for (const Planned& p : state_.plan) {
    const Sequence& seq = state_.sequences.at(p.id);
    DCHECK(static_cast<int64_t>(seq.drafts.size()) == p.drafts);
    plan_rows_.push_back(rows_.size());
    const int64_t start = static_cast<int64_t>(state_.slots[seq.slot].tokens.size());
    const int64_t end = start + p.rows - p.drafts;
    const PromptPictures* pictures = seq.request.pictures.get();
    // A row of the sequence: with pictures, its three rotary positions (the prompt's from the
    // request; after the prompt, all three count on from the prompt's `next`).
    auto push = [&](int32_t token, int64_t i, bool want) {
      if (!pictures) return rows_.Push(token, seq.slot, static_cast<int32_t>(i), want);
      const MropePositions& pos = pictures->positions;
      if (i < seq.prompt) {
        if (seq.picture_row[i] >= 0)
          picture_rows.push_back(
              {static_cast<int32_t>(rows_.size()), pictures, seq.picture_row[i]});
        return rows_.PushMrope(token, seq.slot, static_cast<int32_t>(i), pos.t[i], pos.h[i],
                               pos.w[i], want);
      }
      const int32_t r = static_cast<int32_t>(pos.next + (i - seq.prompt));
      rows_.PushMrope(token, seq.slot, static_cast<int32_t>(i), r, r, r, want);
    };
    for (int64_t i = start; i < end; ++i) {
      // A picture row reads its placeholder's id (its embedding is replaced below).
      push(i < seq.prompt ? seq.request.prompt[i] : seq.tokens[i], i,
           /*want=*/i == static_cast<int64_t>(seq.tokens.size()) - 1);
    }
    // Each draft's row judges the draft after it (the last row gives a token beyond them all).
    for (int64_t j = 0; j < p.drafts; ++j) push(seq.drafts[j], end + j, /*want=*/true);
  }
  if (!picture_rows.empty()) {
    // The rows' embeddings, and their deepstack features layer by layer (zero past a request's
    // own layers): where they lie in device memory, or copied from the host.
    const int64_t dim = runner_->arch().dim;
    const int64_t count = static_cast<int64_t>(picture_rows.size());
    VisualRows& v = rows_.visual;
    bool device = true;
    for (const PictureRow& r : picture_rows) {
      v.layers = std::max(v.layers, r.pictures->layers);
      device = device && r.pictures->on_device();
    }
    if (device) {
      for (const PictureRow& r : picture_rows) PushVisual(*r.pictures, r.index, r.row, dim, &v);
    } else {
      v.embeddings.resize(count * dim);
      v.deepstack.assign(v.layers * count * dim, 0.0f);
      for (int64_t k = 0; k < count; ++k) {
        const PictureRow& r = picture_rows[k];
        const PromptPictures& p = *r.pictures;
        const int64_t pictures_count = static_cast<int64_t>(p.rows.size());
        v.rows.push_back(r.row);
        std::copy_n(p.embeddings.begin() + r.index * dim, dim, v.embeddings.begin() + k * dim);
        for (int l = 0; l < p.layers; ++l) {
          std::copy_n(p.deepstack.begin() + (l * pictures_count + r.index) * dim, dim,
                      v.deepstack.begin() + (l * count + k) * dim);
        }
      }
    }
  }
  FillTables();
  const PageTables tables = Tables();
  // The masks of this step's constrained sequences that pick a token, computed on other threads
  // while the runner steps (they depend only on the tokens kept so far; requests with a grammar
  // make no drafts). The runner picks the tokens when every wanted row needs only steps 2b-5 of
  // sampling; a constrained row's mask then goes to the runner (row SampleRow::mask of
  // step_masks_) once the runner has issued the step.
  picked_ = options_.device_sampling && runner_->CanSample();
  sample_.clear();
  masked_.clear();
  for (const Planned& p : state_.plan) {
    Sequence& seq = state_.sequences.at(p.id);
    seq.mask_ready = false;
    if (static_cast<int64_t>(state_.slots[seq.slot].tokens.size()) + p.rows - p.drafts !=
        static_cast<int64_t>(seq.tokens.size())) {
      continue;  // a prompt piece: no token this step
    }
    const int32_t mask = seq.Masked() ? static_cast<int32_t>(masked_.size()) : -1;
    if (seq.Masked()) {
      DCHECK(p.drafts == 0);
      masked_.push_back(&seq);
    }
    const Sampling& s = seq.request.sampling;
    if (s.presence != 0.0f || s.frequency != 0.0f || s.repetition != 1.0f || s.logprobs >= 0) {
      picked_ = false;
    }
    if (!picked_) continue;
    SampleRow row;
    row.temperature = s.temperature;
    row.top_k = s.top_k;
    row.top_p = s.top_p;
    row.min_p = s.min_p;
    row.seed = seq.seed;
    row.mask = mask;
    // The draw of each row is the request's own at that position of its answer.
    for (int64_t j = 0; j <= p.drafts; ++j) {
      row.index = static_cast<uint64_t>(static_cast<int64_t>(seq.tokens.size()) - seq.prompt + j);
      sample_.push_back(row);
    }
  }
  std::future<void> masks = StartMasks();
  // Waits for the masks (once); the runner calls it between issuing the step and picking.
  auto wait_masks = [&] {
    if (!masks.valid()) return;
    masks.get();
    stats_.masks_beside_step += static_cast<int64_t>(masked_.size());
  };
  const auto began = std::chrono::steady_clock::now();
  // Slot states: a snapshot of each slot that reads drafts, for the rows kept (PostProcess);
  // part of the step's time, which the pacer weighs drafts by.
  if (state_.slot_states) {
    draft_slots_.clear();
    for (const Planned& p : state_.plan) {
      if (p.drafts > 0) draft_slots_.push_back(state_.sequences.at(p.id).slot);
    }
    if (!draft_slots_.empty()) GZ_RETURN_IF_ERROR(runner_->SnapshotDraftStates(draft_slots_));
  }
  if (picked_) {
    picks_.resize(sample_.size());
    GZ_RETURN_IF_ERROR(runner_->StepSample(
        rows_, tables, sample_,
        [&]() -> std::span<const uint64_t> {
          wait_masks();
          return step_masks_;
        },
        picks_.data()));
    ++stats_.device_sampled;
    stats_.masks_on_device += static_cast<int64_t>(masked_.size());
  } else {
    GZ_RETURN_IF_ERROR(runner_->Step(rows_, tables, logits_.data()));
  }
  wait_masks();
  last_step_ = StepTrace{};
  last_step_.runner_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began).count();
  last_step_.rows = rows_.size();
  last_step_.sequences = static_cast<int32_t>(state_.plan.size());
  last_step_.waiting = static_cast<int32_t>(state_.waiting.size());
  last_step_.device_sampled = picked_;
  for (const Planned& p : state_.plan) {
    const Sequence& seq = state_.sequences.at(p.id);
    // A generating sequence reads its one new token and its drafts; anything else is a prompt
    // piece.
    const bool decode =
        p.rows - p.drafts == 1 && static_cast<int64_t>(seq.tokens.size()) > seq.prompt;
    (decode ? last_step_.decode_rows : last_step_.prompt_rows) += p.rows;
    last_step_.drafted += p.drafts;
  }
  last_step_.draft_ms = draft_ms_;
  pacer_.RecordStep(rows_.size(), last_step_.runner_ms);
  if (draft_ms_ > 0.0) {
    int64_t drafting = 0;
    for (const Planned& p : state_.plan) drafting += p.drafts > 0;
    pacer_.RecordDraftRun(drafting, draft_ms_);
  }
  for (const Planned& p : state_.plan) {
    Sequence& seq = state_.sequences.at(p.id);
    Slot& slot = state_.slots[seq.slot];
    const int64_t start = static_cast<int64_t>(slot.tokens.size());
    slot.tokens.insert(slot.tokens.end(), seq.tokens.begin() + start,
                       seq.tokens.begin() + start + p.rows - p.drafts);
    slot.tokens.insert(slot.tokens.end(), seq.drafts.begin(), seq.drafts.end());
    // Slot states: saved where the chat's messages end, for the next turn to start from.
    if (state_.slot_states && seq.mark > 0 &&
        static_cast<int64_t>(slot.tokens.size()) == seq.mark) {
      GZ_RETURN_IF_ERROR(runner_->SaveSlotState(seq.slot));
      slot.saved = seq.mark;
    }
    // Slot states: a shared start is registered with the states after it (a piece ends there),
    // copied to the host, for the prompts that start with it.
    if (state_.slot_states && seq.shared > 0 && !seq.registered &&
        static_cast<int64_t>(slot.tokens.size()) >= seq.shared) {
      seq.registered = true;
      if (static_cast<int64_t>(slot.tokens.size()) == seq.shared) {
        std::vector<uint8_t> states(static_cast<size_t>(runner_->SlotStatesBytes()));
        GZ_RETURN_IF_ERROR(runner_->CopySlotStatesToHost(seq.slot, /*saved=*/false, states.data()));
        cache_.Share(std::vector<int32_t>(seq.tokens.begin(), seq.tokens.begin() + seq.shared),
                     slot.pages, slot.window_pages, std::move(states));
      }
    }
  }
  ++stats_.steps;
  stats_.rows += rows_.size();
  return Status::Ok();
}

void Engine::PostProcess(std::vector<Progress>& progress) {
  int64_t wanted = 0;
  int64_t refusals = 0;  // sequences whose drafts met a refused one this step
  DraftStats& drafter = mtp_ && !lookup_step_ ? stats_.mtp : block_ ? stats_.block : stats_.lookup;
  for (size_t planned = 0; planned < state_.plan.size(); ++planned) {
    const Planned& p = state_.plan[planned];
    Sequence& seq = state_.sequences.at(p.id);
    Slot& slot = state_.slots[seq.slot];
    // MTP drafts: the rows of this step the MTP layer reads next step (the first `kept`), each
    // with the token after it (DraftMtp).
    const int64_t start = static_cast<int64_t>(slot.tokens.size()) - p.rows;
    auto read_by_mtp = [&](int64_t kept) {
      // Block drafts: the kept rows join the sequence's context; a context that cannot take them
      // is dropped (the sequence drafts no more: drafts are guesses, the text does not change).
      if (block_ && !seq.request.pictures &&
          !ExtendBlockContext(seq, plan_rows_[planned], kept, start).ok()) {
        block_contexts_.erase(seq.id);
      }
      if (!mtp_ || seq.request.pictures) return;
      for (int64_t i = 0; i < kept; ++i) {
        mtp_pending_.push_back({seq.id, seq.slot, static_cast<int32_t>(plan_rows_[planned] + i),
                                static_cast<int32_t>(start + i)});
      }
    };
    // A shared start, once read, is registered for the prompts that start with it (with slot
    // states, after the step that ends there: see Step).
    if (seq.shared > 0 && !seq.registered && !state_.slot_states &&
        static_cast<int64_t>(slot.tokens.size()) >= seq.shared) {
      seq.registered = true;
      cache_.Share(std::vector<int32_t>(seq.tokens.begin(), seq.tokens.begin() + seq.shared),
                   slot.pages, slot.window_pages);
    }
    // A prompt piece, no logits yet.
    if (slot.tokens.size() != seq.tokens.size() + p.drafts) {
      read_by_mtp(p.rows);
      continue;
    }

    Progress out;
    out.id = seq.id;
    if (!seq.reported) {
      seq.reported = true;
      out.cached = seq.cached;
    }
    // Row j picks the token after the j-th draft; the draft j is kept when it is that token, so
    // the tokens are the ones the request picks without drafts, and the first refused draft's
    // pick is the step's last token.
    int64_t accepted = 0;
    for (int64_t j = 0; j <= p.drafts && out.end.empty(); ++j) {
      const int64_t w = wanted + j;
      Logprobs logprobs;
      int32_t token;
      if (picked_) {
        token = picks_[w];
      } else {
        std::span<const float> logits(&logits_[w * vocab_], vocab_);
        std::span<const int32_t> all(seq.tokens);
        if (seq.Masked() && !(seq.mask_ready && j == 0)) {
          TakeGrammarToken(seq);
          FillGrammarMask(seq);
        }
        seq.mask_ready = false;
        // The prompt as the request gave it (a picture row's placeholder, not its key).
        token = sampler_.Sample(
            logits, seq.request.sampling, seq.seed, seq.request.prompt, all.subspan(seq.prompt),
            &logprobs,
            seq.Masked() ? std::span<const uint64_t>(seq.mask) : std::span<const uint64_t>());
      }
      if (token == kNoAllowedToken) {
        out.end = "error";
        if (seq.grammar_refused >= 0) {
          out.status = Internal("the grammar refused the token " +
                                std::to_string(seq.grammar_refused) + " its mask allowed");
        } else {
          out.status = seq.matcher->status().ok()
                           ? Internal("the grammar allows no token after " +
                                      std::to_string(seq.tokens.size() - seq.prompt) +
                                      " tokens of the answer")
                           : seq.matcher->status();
        }
      } else if (token == kNonFiniteToken) {
        // This request ends; the others of the step go on.
        out.end = "error";
        out.status = Internal("the logits after " + std::to_string(seq.tokens.size()) +
                              " tokens hold NaN or infinity: the model's weights hold non-finite "
                              "values, or its activations overflow");
      } else if (std::find(seq.stop.begin(), seq.stop.end(), token) != seq.stop.end()) {
        out.end = "stop";
      } else {
        // The matcher takes the token with the next mask (TakeGrammarToken); a thinking block
        // before the grammar passes it by.
        if (seq.matcher) {
          const Sampling& s = seq.request.sampling;
          using Phase = Sequence::GrammarPhase;
          if (seq.grammar_phase == Phase::kThinking) {
            if (token == s.think_close) seq.grammar_phase = Phase::kHeld;
          } else if (seq.grammar_phase == Phase::kStart && token == s.think_open) {
            seq.grammar_phase = Phase::kThinking;
          } else {
            seq.grammar_phase = Phase::kHeld;
            seq.grammar_token = token;
          }
        }
        seq.tokens.push_back(token);
        out.tokens.push_back(token);
        if (seq.request.sampling.logprobs >= 0) out.logprobs.push_back(std::move(logprobs));
        const int64_t answer = static_cast<int64_t>(seq.tokens.size()) - seq.prompt;
        if ((seq.request.limit > 0 && answer >= seq.request.limit) ||
            static_cast<int64_t>(seq.tokens.size()) > options_.context) {
          out.end = "length";
        }
      }
      if (!out.end.empty() || j == p.drafts || token != seq.drafts[j]) break;
      ++accepted;
    }
    wanted += 1 + p.drafts;
    if (p.drafts > 0) {
      // The refused drafts' rows leave the slot: it holds the tokens whose KV is right, and
      // its states (slot states) those after its last kept row.
      // Their states go back after the loop, every such slot's at once (KeepDraftRowsOf).
      Truncate(state_, slot, static_cast<int64_t>(slot.tokens.size()) - (p.drafts - accepted));
      if (state_.slot_states && accepted < p.drafts) {
        kept_rows_.push_back({seq.slot, p.rows - (p.drafts - accepted)});
        kept_progress_.push_back(progress.size());
      }
      // Drafts after the first refused one were not judged.
      const bool refused = accepted < p.drafts && out.end.empty();
      refusals += refused;
      drafter.drafted += p.drafts;
      drafter.accepted += accepted;
      last_step_.accepted += accepted;
      seq.drafts.clear();
    }
    if (out.end.empty()) read_by_mtp(p.rows - p.drafts + accepted);
    if (!out.end.empty()) Finish(state_, seq);
    progress.push_back(std::move(out));
  }
  if (!kept_rows_.empty()) {
    if (Status kept = runner_->KeepDraftRowsOf(kept_rows_); !kept.ok()) {
      // The states match no row: the slots hold nothing to continue from.
      for (size_t i = 0; i < kept_rows_.size(); ++i) {
        Truncate(state_, state_.slots[kept_rows_[i].slot], 0);
        Progress& out = progress[kept_progress_[i]];
        if (out.end.empty()) Finish(state_, state_.sequences.at(out.id));
        out.end = "error";
        out.status = kept;
      }
    }
    kept_rows_.clear();
    kept_progress_.clear();
  }
  if (last_step_.drafted > 0) {
    ++drafter.steps;
    pacer_.RecordJudged(last_step_.accepted, refusals, lookup_step_ ? DraftPacer::kLookup : 0);
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
  std::vector<int64_t> count(state_.slots.size(), 0);
  for (int64_t r = 0; r < n; ++r) {
    const int32_t s = slots[r];
    if (s < 0 || s >= static_cast<int32_t>(state_.slots.size())) {
      return InvalidArgument("step slots[" + std::to_string(r) + "]: slot " + std::to_string(s) +
                             " is outside [0, " + std::to_string(state_.slots.size()) + ")");
    }
    if (state_.slots[s].seq >= 0) {
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
  for (size_t s = 0; s < state_.slots.size(); ++s) {
    if (count[s] > 0 &&
        static_cast<int64_t>(state_.slots[s].tokens.size()) + count[s] > options_.context) {
      return ResourceExhausted("step: slot " + std::to_string(s) + " would pass the context of " +
                               std::to_string(options_.context));
    }
  }
  // Pages: the slots of this call keep theirs while others' caches make room.
  int32_t need = 0;
  for (size_t s = 0; s < state_.slots.size(); ++s) {
    if (count[s] == 0) continue;
    state_.slots[s].pinned = true;
    TrimWindow(state_, state_.slots[s]);
    need += BlockPages(state_, PagesFor(state_.slots[s].tokens.size() + count[s]) -
                                   static_cast<int32_t>(state_.slots[s].pages.size()));
  }
  Expected<bool> room = Reclaim(state_, need);
  for (Slot& slot : state_.slots) slot.pinned = false;
  GZ_RETURN_IF_ERROR(room.status());
  if (!*room) {
    return ResourceExhausted("step: needs " + std::to_string(need) + " more KV pages, " +
                             std::to_string(pool_.free()) + " free");
  }
  rows_.Clear();
  std::vector<bool> is_wanted(n, false);
  for (int32_t w : wanted) is_wanted[w] = true;
  std::vector<int64_t> next(state_.slots.size());
  for (size_t s = 0; s < state_.slots.size(); ++s) {
    next[s] = static_cast<int64_t>(state_.slots[s].tokens.size());
    if (count[s] == 0) continue;
    // Positions it writes must be its own pages.
    Truncate(state_, state_.slots[s], next[s]);
    const int64_t block = next[s] / kPage;
    if (block < static_cast<int64_t>(state_.slots[s].pages.size()) &&
        pool_.refs(state_.slots[s].pages[block]) > 1) {
      return InvalidArgument("step: slot " + std::to_string(s) +
                             " would write a page a shared start holds; Reset it first");
    }
    AddBlocks(state_, state_.slots[s],
              PagesFor(next[s] + count[s]) - static_cast<int32_t>(state_.slots[s].pages.size()));
  }
  for (int64_t r = 0; r < n; ++r) {
    rows_.Push(tokens[r], slots[r], static_cast<int32_t>(next[slots[r]]++), is_wanted[r]);
  }
  FillTables();
  return Status::Ok();
}

Expected<std::vector<float>> Engine::Step(std::span<const int32_t> tokens,
                                          std::span<const int32_t> slots,
                                          std::span<const int32_t> wanted,
                                          std::span<const int32_t> drafts) {
  if (!drafts.empty() && drafts.size() != state_.slots.size()) {
    return InvalidArgument("step drafts: expected none or one count a slot (" +
                           std::to_string(state_.slots.size()) + "), got " +
                           std::to_string(drafts.size()));
  }
  GZ_RETURN_IF_ERROR(BuildRows(tokens, slots, wanted));
  for (size_t s = 0; s < drafts.size(); ++s) {
    const int64_t rows = std::count(slots.begin(), slots.end(), static_cast<int32_t>(s));
    if (drafts[s] < 0 || drafts[s] > rows) {
      return InvalidArgument("step drafts[" + std::to_string(s) + "]: expected in [0, " +
                             std::to_string(rows) + "] (the slot's rows), got " +
                             std::to_string(drafts[s]));
    }
    if (drafts[s] > 0 && state_.slot_states &&
        (options_.draft == DraftMode::kNone || options_.drafts == 0)) {
      return InvalidArgument(
          "step drafts: an engine made without drafts keeps no snapshot of the model's "
          "recurrent states (EngineOptions::draft)");
    }
  }
  std::fill(drafted_.begin(), drafted_.end(), 0);
  mtp_pending_.clear();  // the runner's kept hidden states are this call's now
  for (size_t s = 0; s < drafts.size(); ++s) {
    drafted_[s] = drafts[s];
    if (drafts[s] > 0 && state_.slot_states)
      GZ_RETURN_IF_ERROR(runner_->SnapshotDraftState(static_cast<int32_t>(s)));
  }
  std::vector<float> logits(wanted.size() * vocab_);
  GZ_RETURN_IF_ERROR(runner_->Step(rows_, Tables(), logits.data()));
  std::fill(appended_.begin(), appended_.end(), 0);
  for (size_t r = 0; r < tokens.size(); ++r) {
    state_.slots[slots[r]].tokens.push_back(tokens[r]);
    ++appended_[slots[r]];
  }
  ++stats_.steps;
  stats_.rows += rows_.size();
  return logits;
}

Status Engine::CheckLayers(std::span<const int> layers) const {
  for (size_t i = 0; i < layers.size(); ++i) {
    if (layers[i] < 0 || layers[i] > runner_->arch().layers) {
      return InvalidArgument("hidden layers[" + std::to_string(i) + "]: expected in [0, " +
                             std::to_string(runner_->arch().layers) + "], got " +
                             std::to_string(layers[i]));
    }
  }
  return Status::Ok();
}

Expected<std::vector<float>> Engine::Hidden(std::span<const int32_t> tokens,
                                            std::span<const int32_t> slots,
                                            std::span<const int> layers) {
  GZ_RETURN_IF_ERROR(CheckLayers(layers));
  GZ_RETURN_IF_ERROR(BuildRows(tokens, slots, {}));
  std::vector<float> out(layers.size() * tokens.size() * runner_->arch().dim);
  GZ_RETURN_IF_ERROR(runner_->Hidden(rows_, Tables(), layers, out.data()));
  std::fill(appended_.begin(), appended_.end(), 0);
  std::fill(drafted_.begin(), drafted_.end(), 0);
  mtp_pending_.clear();  // the runner's kept hidden states are this call's now
  for (size_t r = 0; r < tokens.size(); ++r) {
    state_.slots[slots[r]].tokens.push_back(tokens[r]);
    ++appended_[slots[r]];
  }
  ++stats_.steps;
  stats_.rows += rows_.size();
  return out;
}

Expected<std::vector<float>> Engine::Hidden(std::span<const int32_t> tokens, int32_t slot,
                                            const PromptPictures& pictures,
                                            std::span<const int> layers) {
  GZ_RETURN_IF_ERROR(CheckLayers(layers));
  if (slot < 0 || slot >= static_cast<int32_t>(state_.slots.size()) ||
      !state_.slots[slot].tokens.empty()) {
    return InvalidArgument("hidden with pictures: slot " + std::to_string(slot) +
                           " must be one of the engine's and hold nothing (Reset it first)");
  }
  GZ_RETURN_IF_ERROR(CheckPictures(tokens, pictures));
  const int64_t n = static_cast<int64_t>(tokens.size());
  const std::vector<int32_t> slots(n, slot);
  GZ_RETURN_IF_ERROR(BuildRows(tokens, slots, {}));
  // The slot held nothing: row i is prompt position i, with the prompt's rotary positions.
  const MropePositions& pos = pictures.positions;
  rows_.rotary = pos.t;
  rows_.rotary_h = pos.h;
  rows_.rotary_w = pos.w;
  VisualRows& v = rows_.visual;
  if (pictures.on_device()) {
    const int64_t dim = runner_->arch().dim;
    for (int64_t j = 0; j < pictures.count(); ++j)
      PushVisual(pictures, j, pictures.rows[j], dim, &v);
  } else {
    v.rows = pictures.rows;
    v.embeddings = pictures.embeddings;
    v.layers = pictures.layers;
    v.deepstack = pictures.deepstack;
  }
  std::vector<float> out(layers.size() * n * runner_->arch().dim);
  GZ_RETURN_IF_ERROR(runner_->Hidden(rows_, Tables(), layers, out.data()));
  std::fill(appended_.begin(), appended_.end(), 0);
  std::fill(drafted_.begin(), drafted_.end(), 0);
  mtp_pending_.clear();  // the runner's kept hidden states are this call's now
  std::vector<int32_t>& held = state_.slots[slot].tokens;
  held.assign(tokens.begin(), tokens.end());
  for (size_t j = 0; j < pictures.rows.size(); ++j) {
    held[pictures.rows[j]] = PictureRowKey(pictures, static_cast<int64_t>(j), runner_->arch().dim);
  }
  appended_[slot] = n;
  ++stats_.steps;
  stats_.rows += rows_.size();
  return out;
}

Status Engine::Warm(int32_t max_decode_shapes) {
  for (const Slot& slot : state_.slots) {
    if (slot.seq >= 0 || slot.pinned) return InvalidArgument("warm: a request runs in a slot");
  }
  DropCaches();
  const int32_t slots = static_cast<int32_t>(state_.slots.size());
  auto reset_all = [&] {
    for (Slot& slot : state_.slots) Truncate(state_, slot, 0);
  };
  // One prompt step of the most rows (in one slot, as far as its context allows) with its
  // last row wanted, then decode steps of n rows, one per slot.
  const int64_t prompt = std::min<int64_t>(options_.rows, options_.context);
  std::vector<int32_t> tokens(prompt), slot_of(prompt, 0);
  for (int64_t i = 0; i < prompt; ++i) tokens[i] = static_cast<int32_t>(i % vocab_);
  const int32_t last = static_cast<int32_t>(prompt - 1);
  // Each shape twice: a runner records a step the second time its shape comes (Model::Forward).
  for (int round = 0; round < 2; ++round) {
    GZ_RETURN_IF_ERROR(BuildRows(tokens, slot_of, std::span<const int32_t>(&last, 1)));
    GZ_RETURN_IF_ERROR(runner_->Step(rows_, Tables(), logits_.data()));
    reset_all();
  }
  // Both ways of ending a step: logits to the host, and tokens picked by the runner.
  const int32_t shapes = std::min(slots, std::max(max_decode_shapes, 1));
  for (int32_t k = 0; k < 2 * shapes; ++k) {
    const int32_t n = k / 2 + 1;
    std::vector<int32_t> t(n), s(n), w(n);
    for (int32_t r = 0; r < n; ++r) t[r] = r % vocab_, s[r] = r, w[r] = r;
    GZ_RETURN_IF_ERROR(BuildRows(t, s, w));
    const PageTables tab = Tables();
    if (options_.device_sampling && runner_->CanSample()) {
      std::vector<SampleRow> params(n);
      for (int32_t r = 0; r < n; ++r) params[r].temperature = r % 2 ? 0.7f : 0.0f;
      params[0].top_p = 0.9f;
      picks_.resize(n);
      // The rows after the first under masks that allow every token, one each: the masks'
      // buffer sized for every sequence of the step, and the masked kernel path.
      for (int32_t r = 1; r < n; ++r) params[r].mask = r - 1;
      const std::vector<uint64_t> every((n - 1) * MaskWords(vocab_), ~uint64_t{0});
      GZ_RETURN_IF_ERROR(runner_->StepSample(
          rows_, tab, params, [&] { return std::span<const uint64_t>(every); }, picks_.data()));
    } else {
      GZ_RETURN_IF_ERROR(runner_->Step(rows_, tab, logits_.data()));
    }
    reset_all();
  }
  // With drafts: verify steps (each slot's token and its drafts, every row wanted), and with
  // MTP drafts the MTP runs after them (the first q rows of each slot read again, q = 1 to all,
  // each slot's last one wanted, its drafts chained), in the slot's first page.
  const int32_t per = 1 + std::min<int32_t>(options_.drafts, kPage / 2);
  const int32_t chained = std::max(0, per - 2);
  for (int32_t k = 0; options_.draft != DraftMode::kNone && per > 1 && k < 2 * shapes; ++k) {
    const int32_t n = k / 2 + 1;
    if (static_cast<int64_t>(n) * per > options_.rows) break;
    std::vector<int32_t> t(n * per), s(n * per), w(n * per);
    for (int32_t r = 0; r < n * per; ++r) t[r] = r % vocab_, s[r] = r / per, w[r] = r;
    GZ_RETURN_IF_ERROR(BuildRows(t, s, w));
    const PageTables tab = Tables();
    if (options_.device_sampling && runner_->CanSample()) {
      std::vector<SampleRow> params(n * per);
      picks_.resize(n * per);
      GZ_RETURN_IF_ERROR(runner_->StepSample(rows_, tab, params, {}, picks_.data()));
    } else {
      GZ_RETURN_IF_ERROR(runner_->Step(rows_, tab, logits_.data()));
    }
    for (int32_t q = 1; mtp_ && q <= per; ++q) {
      Rows rows;
      std::vector<int32_t> sources;
      for (int32_t i = 0; i < n; ++i) {
        for (int32_t j = 0; j < q; ++j) {
          rows.Push(t[i * per + j], i, j, /*want=*/j == q - 1);
          sources.push_back(i * per + j);
        }
      }
      mtp_picks_.resize(static_cast<size_t>(n) * (1 + chained));
      GZ_RETURN_IF_ERROR(runner_->MtpDraft(rows, tab, sources, chained, mtp_picks_.data()));
    }
    reset_all();
  }
  mtp_pending_.clear();
  return Status::Ok();
}

Status Engine::Accept(int32_t slot, int64_t kept) {
  if (slot < 0 || slot >= static_cast<int32_t>(state_.slots.size())) {
    return InvalidArgument("accept: slot " + std::to_string(slot) + " is outside [0, " +
                           std::to_string(state_.slots.size()) + ")");
  }
  if (state_.slots[slot].seq >= 0) {
    return InvalidArgument("accept: a request runs in slot " + std::to_string(slot));
  }
  const int64_t appended = appended_[slot];
  if (kept < 0 || kept > appended) {
    return InvalidArgument("accept: kept " + std::to_string(kept) + " of the " +
                           std::to_string(appended) + " rows the last step appended to slot " +
                           std::to_string(slot));
  }
  if (kept < appended && state_.slot_states) {
    // The recurrent states go back only as far as the step's drafts (its snapshot).
    if (appended - kept > drafted_[slot]) {
      return InvalidArgument("accept: kept " + std::to_string(kept) + " of the " +
                             std::to_string(appended) + " rows the last step appended to slot " +
                             std::to_string(slot) + ", of which " + std::to_string(drafted_[slot]) +
                             " were drafts: the model's recurrent states go back no further");
    }
    GZ_RETURN_IF_ERROR(runner_->KeepDraftRows(slot, kept));
  }
  Slot& s = state_.slots[slot];
  Truncate(state_, s, static_cast<int64_t>(s.tokens.size()) - (appended - kept));
  appended_[slot] = kept;
  drafted_[slot] = 0;
  return Status::Ok();
}

Status Engine::Reset(int32_t slot) {
  if (slot < 0 || slot >= static_cast<int32_t>(state_.slots.size())) {
    return InvalidArgument("reset: slot " + std::to_string(slot) + " is outside [0, " +
                           std::to_string(state_.slots.size()) + ")");
  }
  if (state_.slots[slot].seq >= 0) {
    return InvalidArgument("reset: a request runs in slot " + std::to_string(slot));
  }
  Truncate(state_, state_.slots[slot], 0);
  appended_[slot] = 0;
  drafted_[slot] = 0;
  return Status::Ok();
}

void Engine::DropCaches() {
  for (Slot& slot : state_.slots) {
    if (slot.seq < 0) Truncate(state_, slot, 0);
  }
  cache_.Clear();
}

Status Engine::CheckPages() const {
  std::vector<int32_t> refs(pool_.pages(), 0);
  // Tokens each page holds, from the first holder seen; every other holder must agree.
  std::vector<const int32_t*> content(pool_.pages(), nullptr);
  std::vector<int32_t> filled(pool_.pages(), 0);
  // Page p holds block b of `tokens` (its positions [b * kPage, (b + 1) * kPage)).
  auto hold_page = [&](int32_t p, int64_t b, const std::vector<int32_t>& tokens,
                       const std::string& who) -> Status {
    if (p < 0 || p >= pool_.pages()) return Internal(who + ": page " + std::to_string(p));
    ++refs[p];
    const int64_t begin = b * kPage;
    const int32_t n = static_cast<int32_t>(
        std::clamp<int64_t>(static_cast<int64_t>(tokens.size()) - begin, 0, kPage));
    if (content[p] != nullptr) {
      const int32_t common = std::min(n, filled[p]);
      if (!std::equal(content[p], content[p] + common, tokens.data() + begin)) {
        return Internal(who + ": page " + std::to_string(p) + " holds other tokens elsewhere");
      }
    }
    if (n > filled[p]) content[p] = tokens.data() + begin, filled[p] = n;
    return Status::Ok();
  };
  // A holder's pages, and its window pages: a page a block from the first block its next row's
  // window needs (holes before it only).
  const int32_t groups = paging_.window_groups;
  auto hold = [&](const std::vector<int32_t>& pages, const std::vector<int32_t>& window_pages,
                  const std::vector<int32_t>& tokens, const std::string& who) -> Status {
    for (size_t b = 0; b < pages.size(); ++b) {
      GZ_RETURN_IF_ERROR(hold_page(pages[b], static_cast<int64_t>(b), tokens, who));
    }
    if (window_pages.size() != pages.size() * groups) {
      return Internal(who + ": " + std::to_string(window_pages.size()) + " window pages for " +
                      std::to_string(pages.size()) + " blocks");
    }
    const int32_t first = groups > 0 ? FirstHeldBlock(window_pages, groups) : 0;
    if (!pages.empty() && groups > 0 &&
        !WindowCovers(first, static_cast<int64_t>(tokens.size()), paging_.window)) {
      return Internal(who + ": window pages from block " + std::to_string(first) + " for " +
                      std::to_string(tokens.size()) + " tokens");
    }
    for (size_t e = static_cast<size_t>(first) * groups; e < window_pages.size(); ++e) {
      GZ_RETURN_IF_ERROR(
          hold_page(window_pages[e], static_cast<int64_t>(e / groups), tokens, who + " window"));
    }
    return Status::Ok();
  };
  for (size_t s = 0; s < state_.slots.size(); ++s) {
    const Slot& slot = state_.slots[s];
    const std::string who = "slot " + std::to_string(s);
    if (static_cast<int32_t>(slot.pages.size()) != PagesFor(slot.tokens.size())) {
      return Internal(who + ": " + std::to_string(slot.pages.size()) + " pages for " +
                      std::to_string(slot.tokens.size()) + " tokens");
    }
    GZ_RETURN_IF_ERROR(hold(slot.pages, slot.window_pages, slot.tokens, who));
    if (slot.seq >= 0) {
      auto it = state_.sequences.find(slot.seq);
      if (it == state_.sequences.end() || it->second.slot != static_cast<int32_t>(s)) {
        return Internal(who + ": runs a request that does not run there");
      }
      if (!std::equal(slot.tokens.begin(), slot.tokens.end(), it->second.tokens.begin())) {
        return Internal(who + ": holds tokens its request does not have");
      }
    }
  }
  GZ_RETURN_IF_ERROR(cache_.Check(hold));
  // A page a slot writes next is its own.
  for (size_t s = 0; s < state_.slots.size(); ++s) {
    const Slot& slot = state_.slots[s];
    const size_t block = slot.tokens.size() / kPage;
    if (slot.seq >= 0 && block < slot.pages.size() && refs[slot.pages[block]] != 1) {
      return Internal("slot " + std::to_string(s) + " writes next into a page others hold");
    }
    for (int32_t g = 0; slot.seq >= 0 && block < slot.pages.size() && g < groups; ++g) {
      const int32_t page = slot.window_pages[block * groups + g];
      if (page < 0 || refs[page] != 1) {
        return Internal("slot " + std::to_string(s) +
                        " writes next into a window page others hold");
      }
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
  return cache_.CheckHostBytes();
}

}  // namespace gizllm
