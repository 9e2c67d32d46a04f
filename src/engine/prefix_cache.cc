#include "engine/prefix_cache.h"

#include <algorithm>
#include <utility>

#include "ops/backend.h"

namespace gizllm {
namespace {

int64_t CommonStart(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  const int64_t n = static_cast<int64_t>(std::min(a.size(), b.size()));
  int64_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

}  // namespace

PrefixCache::PrefixCache(PagePool* pool, Runner* runner, int64_t page_bytes, KvPaging paging,
                         int64_t host_bytes_limit, int64_t state_bytes_limit, int32_t slots,
                         int64_t* host_copies)
    : pool_(pool),
      runner_(runner),
      page_bytes_(page_bytes),
      paging_(paging),
      host_bytes_limit_(host_bytes_limit),
      state_bytes_limit_(state_bytes_limit),
      slots_(slots),
      host_copies_(host_copies) {}

int64_t PrefixCache::Usable(const std::vector<int32_t>& pages, int32_t window_first,
                            const std::vector<int32_t>& held, const std::vector<int32_t>& tokens,
                            bool shared) const {
  // At least the last token is read again: its logits give the next token.
  int64_t m = std::min<int64_t>(CommonStart(held, tokens), static_cast<int64_t>(tokens.size()) - 1);
  if (m <= 0) return 0;
  // The slot writes from position m on: never into a page another holder reads.
  const int64_t block = m / kPage;
  if (block < static_cast<int64_t>(pages.size()) && (shared || pool_->refs(pages[block]) > 1)) {
    m = block * kPage;
  }
  // Window paging: the row at m sees the window before it, which the holder must still hold.
  if (paging_.enabled() && m > 0 && !WindowCovers(window_first, m, paging_.window)) {
    return 0;
  }
  return m;
}

int32_t PrefixCache::BestPrefix(const std::vector<int32_t>& tokens, int64_t* best,
                                bool states) const {
  int32_t from = -1;
  for (int32_t i = 0; i < static_cast<int32_t>(prefixes_.size()); ++i) {
    const Prefix& p = prefixes_[i];
    const int32_t first =
        p.pages.empty() ? p.window_first : FirstHeldBlock(p.window_pages, paging_.window_groups);
    int64_t m = Usable(p.pages, first, p.tokens, tokens, /*shared=*/false);
    if (states && m != static_cast<int64_t>(p.tokens.size())) {
      // The states stand for the whole prefix, or for its first `saved` tokens.
      if (p.saved == 0 || m < p.saved) continue;
      m = p.saved;
    }
    if (m > *best) *best = m, from = i;
  }
  return from;
}

int32_t PrefixCache::BestShared(const std::vector<int32_t>& tokens, int64_t longest,
                                int64_t* best, bool states) const {
  int32_t from = -1;
  for (int32_t i = 0; i < static_cast<int32_t>(shared_.size()); ++i) {
    const Shared& s = shared_[i];
    if (static_cast<int64_t>(s.tokens.size()) > longest) continue;
    const int64_t m = Usable(s.pages, FirstHeldBlock(s.window_pages, paging_.window_groups),
                             s.tokens, tokens, /*shared=*/true);
    // The states stand for the whole start.
    if (states && (s.states.empty() || m != static_cast<int64_t>(s.tokens.size()))) continue;
    if (m > *best) *best = m, from = i;
  }
  return from;
}

PrefixCache::Prefix PrefixCache::Take(int32_t i) {
  Prefix prefix = std::move(prefixes_[i]);
  prefixes_.erase(prefixes_.begin() + i);
  return prefix;
}

const PrefixCache::Shared& PrefixCache::Use(int32_t i) {
  shared_[i].used = ++clock_;
  return shared_[i];
}

Status PrefixCache::Stash(std::vector<int32_t> tokens, std::vector<int32_t> pages,
                          std::vector<int32_t> window_pages, int32_t want_free,
                          std::vector<uint8_t> states, int64_t saved,
                          std::vector<uint8_t> saved_states) {
  Prefix prefix;
  prefix.tokens = std::move(tokens);
  prefix.pages = std::move(pages);
  prefix.window_pages = std::move(window_pages);
  prefix.used = ++clock_;
  if (!states.empty()) {
    // The states live on the host: room for them first, least recently used states going.
    const int64_t bytes = static_cast<int64_t>(states.size() + saved_states.size());
    MakeHostRoom(bytes, /*states=*/true);
    if (state_bytes_ + bytes > state_bytes_limit_) {
      pool_->ReleaseAll(prefix.pages);
      pool_->ReleaseAll(prefix.window_pages);
      return Status::Ok();
    }
    state_bytes_ += bytes;
    prefix.states = std::move(states);
    prefix.saved = saved_states.empty() ? 0 : saved;
    prefix.saved_states = std::move(saved_states);
  }
  // Of the window pages, only those its next row sees.
  if (paging_.enabled()) {
    pool_->ReleaseFront(prefix.window_pages, static_cast<size_t>(WindowFirstBlock(
                                                 prefix.tokens.size(), paging_.window)) *
                                                 paging_.window_groups);
  }
  // A stored prefix that is a start of this one says nothing new (unless this one's window pages
  // no longer hold what the row after it sees).
  const int32_t window_first = FirstHeldBlock(prefix.window_pages, paging_.window_groups);
  std::erase_if(prefixes_, [&](Prefix& p) {
    const int64_t n = static_cast<int64_t>(p.tokens.size());
    // With states, only a prefix whose states this one holds too (at its end or its mark).
    const bool same_states =
        prefix.states.empty() ||
        (n == static_cast<int64_t>(prefix.tokens.size()) || (p.saved == 0 && n == prefix.saved));
    const bool redundant = CommonStart(p.tokens, prefix.tokens) == n && same_states &&
                           (!paging_.enabled() || WindowCovers(window_first, n, paging_.window));
    if (redundant) Release(p);
    return redundant;
  });
  if (pool_->free() < want_free) GZ_RETURN_IF_ERROR(ToHost(prefix));
  if (prefix.pages.empty() && prefix.host.empty()) {
    Release(prefix);  // its states' host bytes
    return Status::Ok();
  }
  prefixes_.push_back(std::move(prefix));
  // At most a few per slot: the least recently used go first.
  while (prefixes_.size() > 4 * static_cast<size_t>(slots_)) {
    auto oldest =
        std::min_element(prefixes_.begin(), prefixes_.end(),
                         [](const Prefix& a, const Prefix& b) { return a.used < b.used; });
    Release(*oldest);
    prefixes_.erase(oldest);
  }
  return Status::Ok();
}

Status PrefixCache::ToHost(Prefix& prefix) {
  if (prefix.pages.empty()) return Status::Ok();
  const int32_t first =
      paging_.enabled() ? FirstHeldBlock(prefix.window_pages, paging_.window_groups) : 0;
  const int64_t window_at = static_cast<int64_t>(first) * paging_.window_groups;
  const int64_t count =
      static_cast<int64_t>(prefix.pages.size() + prefix.window_pages.size()) - window_at;
  const int64_t bytes = count * page_bytes_;
  MakeHostRoom(bytes);
  if (host_bytes_ + bytes <= host_bytes_limit_) {
    prefix.host.resize(bytes);
    // Its blocks' pages, then the window pages it holds (PrefixCache::Prefix::host).
    int64_t at = 0;
    for (int32_t page : prefix.pages) {
      GZ_RETURN_IF_ERROR(runner_->CopyPageToHost(page, &prefix.host[at++ * page_bytes_]));
    }
    for (size_t e = window_at; e < prefix.window_pages.size(); ++e) {
      GZ_RETURN_IF_ERROR(
          runner_->CopyPageToHost(prefix.window_pages[e], &prefix.host[at++ * page_bytes_]));
    }
    prefix.window_first = first;
    host_bytes_ += bytes;
    *host_copies_ += count;
  } else {
    prefix.tokens.clear();
  }
  pool_->ReleaseAll(prefix.pages);
  pool_->ReleaseAll(prefix.window_pages);
  return Status::Ok();
}

void PrefixCache::MakeHostRoom(int64_t bytes, bool states) {
  const int64_t& used = states ? state_bytes_ : host_bytes_;
  const int64_t limit = states ? state_bytes_limit_ : host_bytes_limit_;
  while (used + bytes > limit) {
    auto oldest = prefixes_.end();
    for (auto it = prefixes_.begin(); it != prefixes_.end(); ++it) {
      const bool holds = states ? !it->states.empty() : !it->host.empty();
      if (holds && (oldest == prefixes_.end() || it->used < oldest->used)) oldest = it;
    }
    if (oldest == prefixes_.end()) break;
    Release(*oldest);
    prefixes_.erase(oldest);
  }
}

void PrefixCache::ReleaseShared(Shared& start) {
  pool_->ReleaseAll(start.pages);
  pool_->ReleaseAll(start.window_pages);
  state_bytes_ -= static_cast<int64_t>(start.states.size());
  start.states.clear();
}

void PrefixCache::Release(Prefix& prefix) {
  pool_->ReleaseAll(prefix.pages);
  pool_->ReleaseAll(prefix.window_pages);
  host_bytes_ -= static_cast<int64_t>(prefix.host.size());
  state_bytes_ -= static_cast<int64_t>(prefix.states.size() + prefix.saved_states.size());
  prefix.host.clear();
  prefix.states.clear();
  prefix.saved_states.clear();
  prefix.saved = 0;
  prefix.tokens.clear();
}

void PrefixCache::Share(std::vector<int32_t> tokens, const std::vector<int32_t>& pages,
                        const std::vector<int32_t>& window_pages, std::vector<uint8_t> states) {
  const bool known = std::any_of(shared_.begin(), shared_.end(),
                                 [&](const Shared& s) { return s.tokens == tokens; });
  // Window paging: a slot that took a longer start may hold no window pages of this one's end.
  const bool covered =
      !paging_.enabled() || WindowCovers(FirstHeldBlock(window_pages, paging_.window_groups),
                                         static_cast<int64_t>(tokens.size()), paging_.window);
  if (known || !covered) return;
  if (!states.empty()) {
    const int64_t bytes = static_cast<int64_t>(states.size());
    MakeHostRoom(bytes, /*states=*/true);
    if (state_bytes_ + bytes > state_bytes_limit_) return;
    state_bytes_ += bytes;
  }
  const int32_t blocks = static_cast<int32_t>(tokens.size() / kPage);
  Shared s{std::move(tokens), {}, {}, ++clock_, std::move(states)};
  for (int32_t b = 0; b < blocks; ++b) {
    pool_->Retain(pages[b]);
    s.pages.push_back(pages[b]);
  }
  for (int32_t e = 0; e < blocks * paging_.window_groups; ++e) {
    if (window_pages[e] >= 0) pool_->Retain(window_pages[e]);
    s.window_pages.push_back(window_pages[e]);
  }
  shared_.push_back(std::move(s));
  while (shared_.size() > 2 * static_cast<size_t>(slots_)) {
    auto oldest =
        std::min_element(shared_.begin(), shared_.end(),
                         [](const Shared& a, const Shared& b) { return a.used < b.used; });
    ReleaseShared(*oldest);
    shared_.erase(oldest);
  }
}

int32_t PrefixCache::Reclaimable() const {
  int32_t n = 0;
  auto only_here = [&](const std::vector<int32_t>& pages) {
    for (int32_t page : pages) n += page >= 0 && pool_->refs(page) == 1;
  };
  for (const Prefix& p : prefixes_) only_here(p.pages), only_here(p.window_pages);
  for (const Shared& s : shared_) only_here(s.pages), only_here(s.window_pages);
  return n;
}

Expected<bool> PrefixCache::FreeOne() {
  auto prefix = prefixes_.end();
  for (auto it = prefixes_.begin(); it != prefixes_.end(); ++it) {
    if (!it->pages.empty() && (prefix == prefixes_.end() || it->used < prefix->used)) prefix = it;
  }
  if (prefix != prefixes_.end()) {
    Prefix moved = std::move(*prefix);
    prefixes_.erase(prefix);
    GZ_RETURN_IF_ERROR(ToHost(moved));
    if (!moved.host.empty()) {
      prefixes_.push_back(std::move(moved));
    } else {
      Release(moved);  // its states' host bytes
    }
    return true;
  }
  auto start = shared_.end();
  for (auto it = shared_.begin(); it != shared_.end(); ++it) {
    auto unread_pages = [&](const std::vector<int32_t>& pages) {
      return std::all_of(pages.begin(), pages.end(),
                         [&](int32_t p) { return p < 0 || pool_->refs(p) == 1; });
    };
    const bool unread = unread_pages(it->pages) && unread_pages(it->window_pages);
    if (unread && (start == shared_.end() || it->used < start->used)) start = it;
  }
  if (start != shared_.end()) {
    ReleaseShared(*start);
    shared_.erase(start);
    return true;
  }
  return false;
}

void PrefixCache::Clear() {
  for (Prefix& p : prefixes_) Release(p);
  prefixes_.clear();
  for (Shared& s : shared_) ReleaseShared(s);
  shared_.clear();
}

Status PrefixCache::Check(
    const std::function<
        Status(const std::vector<int32_t>& pages, const std::vector<int32_t>& window_pages,
               const std::vector<int32_t>& tokens, const std::string& who)>& hold) const {
  for (const Prefix& p : prefixes_) {
    if (!p.pages.empty() && static_cast<int32_t>(p.pages.size()) != PagesFor(p.tokens.size())) {
      return Internal("prefix: pages do not cover its tokens");
    }
    const int64_t blocks = PagesFor(p.tokens.size());
    if (!p.host.empty() &&
        static_cast<int64_t>(p.host.size()) !=
            (blocks + (blocks - p.window_first) * paging_.window_groups) * page_bytes_) {
      return Internal("prefix: host copy does not cover its tokens");
    }
    if (!p.host.empty() && paging_.enabled() &&
        !WindowCovers(p.window_first, static_cast<int64_t>(p.tokens.size()), paging_.window)) {
      return Internal("prefix: host copy misses window pages its next row sees");
    }
    GZ_RETURN_IF_ERROR(hold(p.pages, p.window_pages, p.tokens, "prefix"));
  }
  for (const Shared& s : shared_) {
    if (s.tokens.size() != s.pages.size() * kPage) return Internal("shared: not whole pages");
    GZ_RETURN_IF_ERROR(hold(s.pages, s.window_pages, s.tokens, "shared"));
  }
  return Status::Ok();
}

Status PrefixCache::CheckHostBytes() const {
  int64_t host = 0;
  int64_t states = 0;
  for (const Prefix& p : prefixes_) {
    host += static_cast<int64_t>(p.host.size());
    states += static_cast<int64_t>(p.states.size() + p.saved_states.size());
  }
  for (const Shared& s : shared_) states += static_cast<int64_t>(s.states.size());
  if (host != host_bytes_) return Internal("host prefix bytes do not add up");
  if (states != state_bytes_) return Internal("stored prefixes' state bytes do not add up");
  return Status::Ok();
}

}  // namespace gizllm
