#include "grammar/matcher.h"

#include <algorithm>

#include "core/check.h"

namespace gizllm {
namespace {

uint64_t HashFrame(int32_t pos, int32_t parent) {
  uint64_t x =
      (static_cast<uint64_t>(static_cast<uint32_t>(pos)) << 32) | static_cast<uint32_t>(parent);
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return x;
}

}  // namespace

Matcher::Matcher(std::shared_ptr<const Grammar> grammar) : grammar_(std::move(grammar)) {
  Rehash(1024);
  int64_t work = 0;
  for (int32_t alt : grammar_->rules[grammar_->root]) {
    if (!Close(alt, -1, &state_, &work)) {
      state_ = MatchState{};
      status_ = ResourceExhausted("grammar: the start expands past the matcher's bounds");
      return;
    }
  }
  std::sort(state_.stacks.begin(), state_.stacks.end());
  state_.stacks.erase(std::unique(state_.stacks.begin(), state_.stacks.end()), state_.stacks.end());
}

void Matcher::Rehash(size_t capacity) {
  table_.assign(capacity, -1);
  for (int32_t id = 0; id < static_cast<int32_t>(frames_.size()); ++id) Insert(id);
}

void Matcher::Insert(int32_t id) {
  const size_t mask = table_.size() - 1;
  size_t i = HashFrame(frames_[id].pos, frames_[id].parent) & mask;
  while (table_[i] >= 0) i = (i + 1) & mask;
  table_[i] = id;
}

int32_t Matcher::Intern(int32_t pos, int32_t parent) {
  const size_t mask = table_.size() - 1;
  size_t i = HashFrame(pos, parent) & mask;
  while (table_[i] >= 0) {
    const Frame& f = frames_[table_[i]];
    if (f.pos == pos && f.parent == parent) return table_[i];
    i = (i + 1) & mask;
  }
  const int32_t id = static_cast<int32_t>(frames_.size());
  frames_.push_back({pos, parent});
  table_[i] = id;
  if (frames_.size() * 2 > table_.size()) Rehash(table_.size() * 2);
  return id;
}

std::string Matcher::Key(const MatchState& state, bool canonical) const {
  const Grammar& g = *grammar_;
  canonical = canonical && !g.canonical.empty();
  std::vector<std::vector<int32_t>> stacks;
  stacks.reserve(state.stacks.size());
  for (int32_t id : state.stacks) {
    std::vector<int32_t>& positions = stacks.emplace_back();
    for (int32_t f = id; f >= 0; f = frames_[f].parent) {
      positions.push_back(canonical ? g.canonical[frames_[f].pos] : frames_[f].pos);
    }
  }
  std::sort(stacks.begin(), stacks.end());
  std::string key;
  for (const std::vector<int32_t>& positions : stacks) {
    key.append(reinterpret_cast<const char*>(positions.data()), positions.size() * sizeof(int32_t));
    const int32_t end = -1;  // positions are >= 0
    key.append(reinterpret_cast<const char*>(&end), sizeof(end));
  }
  key.push_back(state.complete ? 1 : 0);
  return key;
}

bool Matcher::Canonical(const MatchState& state, MatchState* out) {
  const Grammar& g = *grammar_;
  if (g.canonical.empty()) return false;
  bool moved = false;
  for (int32_t id : state.stacks) {
    for (int32_t f = id; f >= 0 && !moved; f = frames_[f].parent) {
      moved = g.canonical[frames_[f].pos] != frames_[f].pos;
    }
  }
  if (!moved) return false;
  out->stacks.clear();
  out->complete = state.complete;
  std::vector<int32_t> positions;
  for (int32_t id : state.stacks) {
    positions.clear();
    for (int32_t f = id; f >= 0; f = frames_[f].parent) positions.push_back(frames_[f].pos);
    int32_t parent = -1;  // interned from the bottom up
    for (auto it = positions.rbegin(); it != positions.rend(); ++it) {
      parent = Intern(g.canonical[*it], parent);
    }
    out->stacks.push_back(parent);
  }
  std::sort(out->stacks.begin(), out->stacks.end());
  out->stacks.erase(std::unique(out->stacks.begin(), out->stacks.end()), out->stacks.end());
  return true;
}

void Matcher::Rollback(size_t mark) {
  DCHECK(mark <= frames_.size());
  // Removing the newest entries first leaves linear probing exact: every entry that probed past
  // a removed one's slot came after it and is already gone.
  const size_t mask = table_.size() - 1;
  for (size_t id = frames_.size(); id-- > mark;) {
    size_t i = HashFrame(frames_[id].pos, frames_[id].parent) & mask;
    while (table_[i] != static_cast<int32_t>(id)) i = (i + 1) & mask;
    table_[i] = -1;
  }
  frames_.resize(mark);
}

bool Matcher::Close(int32_t pos, int32_t parent, MatchState* to, int64_t* work) {
  const Grammar& g = *grammar_;
  pending_.clear();
  pending_.push_back({pos, parent});
  while (!pending_.empty()) {
    const Frame f = pending_.back();
    pending_.pop_back();
    if (++*work > kMaxWork) return false;
    const GrammarElement& e = g.elements[f.pos];
    switch (e.kind) {
      case GrammarElement::kBytes:
        to->stacks.push_back(Intern(f.pos, f.parent));
        break;
      case GrammarElement::kEnd:
        if (f.parent < 0) {
          to->complete = true;
        } else {
          pending_.push_back(frames_[f.parent]);
        }
        break;
      case GrammarElement::kRule: {
        const int32_t ret = g.elements[f.pos + 1].kind == GrammarElement::kEnd
                                ? f.parent
                                : Intern(f.pos + 1, f.parent);
        const std::vector<int32_t>& alts = g.rules[e.value];
        for (auto it = alts.rbegin(); it != alts.rend(); ++it) pending_.push_back({*it, ret});
        break;
      }
    }
  }
  return true;
}

bool Matcher::Advance(const MatchState& from, uint8_t byte, MatchState* to) {
  const Grammar& g = *grammar_;
  to->stacks.clear();
  to->complete = false;
  overflow_ = false;
  int64_t work = 0;
  for (int32_t s : from.stacks) {
    const Frame f = frames_[s];
    if (!g.sets[g.elements[f.pos].value].Has(byte)) continue;
    if (!Close(f.pos + 1, f.parent, to, &work)) {
      to->stacks.clear();
      to->complete = false;
      overflow_ = true;
      return false;
    }
  }
  if (to->stacks.size() > 1) {
    std::sort(to->stacks.begin(), to->stacks.end());
    to->stacks.erase(std::unique(to->stacks.begin(), to->stacks.end()), to->stacks.end());
  }
  if (static_cast<int64_t>(to->stacks.size()) > kMaxStacks) {
    to->stacks.clear();
    to->complete = false;
    overflow_ = true;
    return false;
  }
  return !to->Dead();
}

bool Matcher::SameStep(const MatchState& state, const ByteSet& bytes) const {
  const Grammar& g = *grammar_;
  for (int32_t s : state.stacks) {
    const ByteSet& top = g.sets[g.elements[frames_[s].pos].value];
    bool none = true, all = true;
    for (int w = 0; w < 4; ++w) {
      const uint64_t held = top.bits[w] & bytes.bits[w];
      none = none && held == 0;
      all = all && held == bytes.bits[w];
    }
    if (!none && !all) return false;
  }
  return true;
}

bool Matcher::Accept(uint8_t byte) {
  if (!status_.ok()) return false;
  const size_t mark = Mark();
  if (!Advance(state_, byte, &next_)) {
    Rollback(mark);
    if (overflow_) {
      status_ = ResourceExhausted("grammar: the text is ambiguous past the matcher's bounds (" +
                                  std::to_string(kMaxStacks) + " stacks, " +
                                  std::to_string(kMaxWork) + " expansions a byte)");
    }
    return false;
  }
  std::swap(state_, next_);
  return true;
}

bool Matcher::Accept(std::string_view bytes) {
  const size_t mark = Mark();
  MatchState saved = state_;
  for (char c : bytes) {
    if (!Accept(static_cast<uint8_t>(c))) {
      state_ = std::move(saved);
      Rollback(mark);
      return false;
    }
  }
  return true;
}

}  // namespace gizllm
