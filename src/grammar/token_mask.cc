#include "grammar/token_mask.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace gizllm {

TokenVocabulary::TokenVocabulary(std::vector<std::string> bytes) : bytes_(std::move(bytes)) {
  std::vector<int32_t> order;
  for (int32_t id = 0; id < static_cast<int32_t>(bytes_.size()); ++id) {
    if (!bytes_[id].empty()) order.push_back(id);
  }
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return bytes_[a] != bytes_[b] ? bytes_[a] < bytes_[b] : a < b;
  });
  ids_ = order;
  // Preorder from the sorted list: each token adds the nodes past its common prefix with the one
  // before; `open` holds the path of nodes from the root.
  std::vector<int32_t> open;
  const std::string* prev = nullptr;
  for (size_t k = 0; k < order.size(); ++k) {
    const std::string& b = bytes_[order[k]];
    size_t common = 0;
    if (prev != nullptr) {
      while (common < prev->size() && common < b.size() && (*prev)[common] == b[common]) ++common;
    }
    while (open.size() > common) {
      nodes_[open.back()].end = static_cast<int32_t>(nodes_.size());
      open.pop_back();
    }
    for (size_t d = common; d < b.size(); ++d) {
      open.push_back(static_cast<int32_t>(nodes_.size()));
      nodes_.push_back({static_cast<uint8_t>(b[d]), static_cast<int32_t>(d + 1), 0, 0, 0});
    }
    Node& last = nodes_[open.back()];
    if (last.count == 0) last.first = static_cast<int32_t>(k);
    ++last.count;
    depth_ = std::max(depth_, static_cast<int32_t>(b.size()));
    prev = &b;
  }
  for (int32_t n : open) nodes_[n].end = static_cast<int32_t>(nodes_.size());
}

TokenVocabulary TokenVocabulary::FromTokenizer(const Tokenizer& tokenizer, int64_t vocab) {
  std::vector<std::string> bytes(vocab);
  for (int32_t id = 0; id < vocab; ++id) {
    if (!tokenizer.IsSpecial(id)) bytes[id] = tokenizer.TokenBytes(id);
  }
  return TokenVocabulary(std::move(bytes));
}

bool SharedMasks::Get(const std::string& key, std::vector<uint64_t>* mask) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(key);
  if (it == index_.end()) return false;
  masks_.splice(masks_.begin(), masks_, it->second);
  *mask = it->second->second;
  ++hits_;
  return true;
}

void SharedMasks::Put(const std::string& key, const std::vector<uint64_t>& mask) {
  std::lock_guard<std::mutex> lock(mu_);
  if (index_.count(key)) return;
  if (masks_.size() >= kMasks) {
    index_.erase(masks_.back().first);
    masks_.pop_back();
  }
  masks_.emplace_front(key, mask);
  index_[key] = masks_.begin();
}

TokenMatcher::TokenMatcher(const TokenGrammar& grammar, bool cache)
    : vocabulary_(grammar.vocabulary),
      shared_(cache ? grammar.masks : nullptr),
      matcher_(grammar.grammar),
      levels_(static_cast<size_t>(grammar.vocabulary->depth_) + 1),
      use_cache_(cache) {}

int32_t TokenMatcher::InternState(const MatchState& state) {
  std::string key(reinterpret_cast<const char*>(state.stacks.data()),
                  state.stacks.size() * sizeof(int32_t));
  key.push_back(state.complete ? 1 : 0);
  auto [it, added] = walk_index_.emplace(std::move(key), static_cast<int32_t>(walk_states_.size()));
  if (added) {
    walk_states_.push_back(state);
    walk_next_.resize(walk_next_.size() + 256, kUnknown);
  }
  return it->second;
}

void TokenMatcher::Walk(std::vector<uint64_t>* mask) {
  const std::vector<TokenVocabulary::Node>& nodes = vocabulary_->nodes_;
  const std::vector<int32_t>& ids = vocabulary_->ids_;
  uint64_t* bits = mask->data();
  const size_t mark = matcher_.Mark();
  walk_states_.clear();
  walk_index_.clear();
  walk_next_.clear();
  levels_[0] = InternState(matcher_.state());
  const int32_t n = static_cast<int32_t>(nodes.size());
  for (int32_t i = 0; i < n;) {
    const TokenVocabulary::Node& node = nodes[i];
    const int32_t from = levels_[node.depth - 1];
    int32_t to = walk_next_[static_cast<size_t>(from) * 256 + node.byte];
    if (to == kUnknown) {
      to = matcher_.Advance(walk_states_[from], node.byte, &scratch_) ? InternState(scratch_)
                                                                      : kDead;
      walk_next_[static_cast<size_t>(from) * 256 + node.byte] = to;
    }
    if (to == kDead) {
      i = node.end;
      continue;
    }
    levels_[node.depth] = to;
    for (int32_t k = node.first; k < node.first + node.count; ++k) {
      bits[ids[k] >> 6] |= uint64_t{1} << (ids[k] & 63);
    }
    ++i;
  }
  matcher_.Rollback(mark);
}

void TokenMatcher::FillMask(std::span<const int32_t> stop, std::vector<uint64_t>* mask) {
  const size_t words = static_cast<size_t>((vocabulary_->size() + 63) / 64);
  const MatchState& state = matcher_.state();
  std::string key(reinterpret_cast<const char*>(state.stacks.data()),
                  state.stacks.size() * sizeof(int32_t));
  key.push_back(state.complete ? 1 : 0);
  if (auto it = index_.find(key); use_cache_ && it != index_.end()) {
    ++hits_;
    cache_.splice(cache_.begin(), cache_, it->second);
    *mask = it->second->second;
  } else {
    // Another request of the grammar may have walked this state already.
    const std::string shared_key = shared_ ? matcher_.Key(state) : std::string();
    if (!shared_ || !matcher_.status().ok() || !shared_->Get(shared_key, mask)) {
      mask->assign(words, 0);
      if (matcher_.status().ok()) Walk(mask);
      if (shared_ && matcher_.status().ok()) shared_->Put(shared_key, *mask);
    }
    if (use_cache_) {
      if (cache_.size() >= kCachedMasks) {
        index_.erase(cache_.back().first);
        cache_.pop_back();
      }
      cache_.emplace_front(key, *mask);
      index_[key] = cache_.begin();
    }
  }
  for (int32_t t : stop) {
    if (t < 0 || t >= vocabulary_->size()) continue;
    const uint64_t bit = uint64_t{1} << (t & 63);
    if (matcher_.Complete() && matcher_.status().ok()) {
      (*mask)[t >> 6] |= bit;
    } else {
      (*mask)[t >> 6] &= ~bit;
    }
  }
}

bool TokenMatcher::Accept(int32_t token) {
  if (token < 0 || token >= vocabulary_->size()) return false;
  const std::string& b = vocabulary_->bytes(token);
  return !b.empty() && matcher_.Accept(b);
}

void ApplyMask(std::span<const uint64_t> mask, std::span<float> logits) {
  for (size_t i = 0; i < logits.size(); ++i) {
    if (!((mask[i >> 6] >> (i & 63)) & 1)) logits[i] = -INFINITY;
  }
}

}  // namespace gizllm
