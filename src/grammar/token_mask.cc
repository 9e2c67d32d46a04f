#include "grammar/token_mask.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstring>
#include <numeric>

namespace gizllm {

TokenVocabulary::Trie TokenVocabulary::BuildTrie(const std::vector<std::string>& keys) {
  Trie trie;
  for (int32_t id = 0; id < static_cast<int32_t>(keys.size()); ++id) {
    if (!keys[id].empty()) trie.ids.push_back(id);
  }
  std::sort(trie.ids.begin(), trie.ids.end(),
            [&](int32_t a, int32_t b) { return keys[a] != keys[b] ? keys[a] < keys[b] : a < b; });
  // Preorder from the sorted list: each token adds the nodes past its common prefix with the one
  // before (the first token below a node made it, so its tokens start at `begin`); `open` holds
  // the path of nodes from the root.
  std::vector<Node>& nodes = trie.nodes;
  std::vector<int32_t> open;
  const std::string* prev = nullptr;
  for (size_t k = 0; k < trie.ids.size(); ++k) {
    const std::string& b = keys[trie.ids[k]];
    size_t common = 0;
    if (prev != nullptr) {
      while (common < prev->size() && common < b.size() && (*prev)[common] == b[common]) ++common;
    }
    while (open.size() > common) {
      nodes[open.back()].end = static_cast<int32_t>(nodes.size());
      open.pop_back();
    }
    for (size_t d = common; d < b.size(); ++d) {
      open.push_back(static_cast<int32_t>(nodes.size()));
      nodes.push_back(
          {static_cast<uint8_t>(b[d]), static_cast<int32_t>(d + 1), 0, static_cast<int32_t>(k), 0});
    }
    ++nodes[open.back()].count;
    prev = &b;
  }
  for (int32_t n : open) nodes[n].end = static_cast<int32_t>(nodes.size());
  return trie;
}

TokenVocabulary::TokenVocabulary(std::vector<std::string> bytes) : bytes_(std::move(bytes)) {
  // Classes of bytes that grammars mostly read alike: the tokens of words, of numbers and of CJK
  // text fold together. Lower and upper case apart, as [a-z] and [A-Z] are common classes. JSON's
  // structure, quotes, backslash, whitespace and control bytes, and the UTF-8 lead bytes whose
  // continuations are narrowed (E0, ED, F0, F4) stay bytes of their own.
  for (int b = 0; b < 256; ++b) class_of_[b] = static_cast<uint8_t>(b);
  auto add_class = [&](auto in_class) {
    int first = -1;
    for (int b = 0; b < 256; ++b) {
      if (!in_class(b)) continue;
      if (first < 0) first = b;
      class_of_[b] = static_cast<uint8_t>(first);
    }
  };
  add_class([](int b) { return b >= 'a' && b <= 'z'; });
  add_class([](int b) { return b >= 'A' && b <= 'Z'; });
  add_class([](int b) { return b >= '0' && b <= '9'; });
  add_class([](int b) {
    return b > ' ' && b < 0x7f && !std::isalnum(b) && !std::strchr("\"\\{}[],:", b);
  });
  add_class([](int b) { return b >= 0x80 && b <= 0xbf; });
  add_class([](int b) { return b >= 0xc2 && b <= 0xdf; });
  // E1-EC and EE-EF apart: a class of any characters compiles them as two alternatives
  // (grammar.cc).
  add_class([](int b) { return b >= 0xe1 && b <= 0xec; });
  add_class([](int b) { return b == 0xee || b == 0xef; });
  add_class([](int b) { return b >= 0xf1 && b <= 0xf3; });
  for (int b = 0; b < 256; ++b) class_sets_[class_of_[b]].Add(static_cast<uint8_t>(b));
  for (int b = 0; b < 256; ++b) {
    int held = 0;
    for (uint64_t w : class_sets_[b].bits) held += std::popcount(w);
    class_wide_[b] = held > 1;
  }
  std::vector<std::string> classes(bytes_.size());
  for (size_t id = 0; id < bytes_.size(); ++id) {
    classes[id] = bytes_[id];
    for (char& c : classes[id]) c = static_cast<char>(class_of_[static_cast<uint8_t>(c)]);
    depth_ = std::max(depth_, static_cast<int32_t>(bytes_[id].size()));
  }
  byte_trie_ = BuildTrie(bytes_);
  class_trie_ = BuildTrie(classes);
  class_offsets_.push_back(0);
  for (int32_t id : class_trie_.ids) {
    class_bytes_ += bytes_[id];
    class_offsets_.push_back(static_cast<int32_t>(class_bytes_.size()));
  }
  const size_t words = (bytes_.size() + 63) / 64;
  class_dense_.assign(class_trie_.nodes.size(), -1);
  for (size_t i = 0; i < class_trie_.nodes.size(); ++i) {
    const Node& node = class_trie_.nodes[i];
    if (node.count < kDenseTokens) continue;
    class_dense_[i] = static_cast<int32_t>(dense_masks_.size() / words);
    dense_masks_.resize(dense_masks_.size() + words, 0);
    uint64_t* dense = dense_masks_.data() + dense_masks_.size() - words;
    for (int32_t k = node.begin; k < node.begin + node.count; ++k) {
      const int32_t id = class_trie_.ids[k];
      dense[id >> 6] |= uint64_t{1} << (id & 63);
    }
  }
  byte_roots_.fill(-1);
  for (int32_t i = 0; i < static_cast<int32_t>(byte_trie_.nodes.size());
       i = byte_trie_.nodes[i].end) {
    byte_roots_[byte_trie_.nodes[i].byte] = i;
  }
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

TokenMatcher::TokenMatcher(const TokenGrammar& grammar, bool cache, bool classes,
                           bool canonical)
    : vocabulary_(grammar.vocabulary),
      shared_(cache ? grammar.masks : nullptr),
      matcher_(grammar.grammar),
      levels_(static_cast<size_t>(grammar.vocabulary->depth_) + 1),
      use_cache_(cache),
      use_classes_(classes),
      canonical_(canonical && !grammar.grammar->canonical.empty() &&
                 grammar.vocabulary->depth_ <= Grammar::kCanonicalDepth) {}

namespace {

uint64_t HashState(const MatchState& state) {
  uint64_t h = state.complete ? 0x9e3779b97f4a7c15ull : 0;
  for (int32_t s : state.stacks) {
    h = (h ^ static_cast<uint32_t>(s)) * 0xff51afd7ed558ccdull;
    h ^= h >> 32;
  }
  return h;
}

}  // namespace

int32_t TokenMatcher::InternState(const MatchState& state) {
  size_t mask = walk_table_.size() - 1;
  size_t i = HashState(state) & mask;
  for (; walk_table_[i] >= 0; i = (i + 1) & mask) {
    if (walk_states_[walk_table_[i]] == state) return walk_table_[i];
  }
  const int32_t id = walk_count_++;
  if (id < static_cast<int32_t>(walk_states_.size())) {
    walk_states_[id] = state;  // reuses the stacks' memory of an earlier walk
  } else {
    walk_states_.push_back(state);
  }
  walk_table_[i] = id;
  walk_next_.resize(walk_next_.size() + 256, kUnknown);
  walk_same_.resize(walk_same_.size() + 256, -1);
  if (static_cast<size_t>(walk_count_) * 2 > walk_table_.size()) {
    walk_table_.assign(walk_table_.size() * 2, -1);
    mask = walk_table_.size() - 1;
    for (int32_t s = 0; s < walk_count_; ++s) {
      size_t j = HashState(walk_states_[s]) & mask;
      while (walk_table_[j] >= 0) j = (j + 1) & mask;
      walk_table_[j] = s;
    }
  }
  return id;
}

int32_t TokenMatcher::Next(int32_t from, uint8_t byte) {
  int32_t& to = walk_next_[static_cast<size_t>(from) * 256 + byte];
  if (to == kUnknown) {
    // Advance and InternState may grow walk_next_: assign through the index, not `to`.
    const int32_t next =
        matcher_.Advance(walk_states_[from], byte, &scratch_) ? InternState(scratch_) : kDead;
    walk_next_[static_cast<size_t>(from) * 256 + byte] = next;
    return next;
  }
  return to;
}

void TokenMatcher::WalkBytes(int32_t begin, int32_t end, uint64_t* bits) {
  const std::vector<TokenVocabulary::Node>& nodes = vocabulary_->byte_trie_.nodes;
  const std::vector<int32_t>& ids = vocabulary_->byte_trie_.ids;
  for (int32_t i = begin; i < end;) {
    const TokenVocabulary::Node& node = nodes[i];
    const int32_t to = Next(levels_[node.depth - 1], node.byte);
    if (to == kDead) {
      i = node.end;
      continue;
    }
    levels_[node.depth] = to;
    for (int32_t k = node.begin; k < node.begin + node.count; ++k) {
      bits[ids[k] >> 6] |= uint64_t{1} << (ids[k] & 63);
    }
    ++i;
  }
}

void TokenMatcher::Walk(const MatchState& root, std::vector<uint64_t>* mask) {
  const TokenVocabulary& v = *vocabulary_;
  uint64_t* bits = mask->data();
  const size_t mark = matcher_.Mark();
  walk_count_ = 0;
  if (walk_table_.empty()) walk_table_.resize(256);
  std::fill(walk_table_.begin(), walk_table_.end(), -1);
  walk_next_.clear();
  walk_same_.clear();
  levels_[0] = InternState(root);
  if (!use_classes_) {
    WalkBytes(0, static_cast<int32_t>(v.byte_trie_.nodes.size()), bits);
    matcher_.Rollback(mark);
    return;
  }
  // The class trie, node by node. A node whose parent state steps the bytes of its class apart
  // is walked by its tokens' bytes instead: at the root through the byte trie (one subtree a
  // byte, so refused bytes skip theirs), deeper token by token from the parent state.
  const std::vector<TokenVocabulary::Node>& nodes = v.class_trie_.nodes;
  const std::vector<int32_t>& ids = v.class_trie_.ids;
  ByteSet by_bytes;  // the first bytes of the root's classes walked through the byte trie
  const int32_t n = static_cast<int32_t>(nodes.size());
  for (int32_t i = 0; i < n;) {
    const TokenVocabulary::Node& node = nodes[i];
    const int32_t from = levels_[node.depth - 1];
    if (v.class_wide_[node.byte]) {
      int8_t& same = walk_same_[static_cast<size_t>(from) * 256 + node.byte];
      if (same < 0) same = matcher_.SameStep(walk_states_[from], v.class_sets_[node.byte]);
      if (!same) {
        if (node.depth == 1) {
          by_bytes.Add(node.byte);
        } else {
          // Most of the class's bytes die here (a value after a space takes t, f and n of
          // the letters): test each token's byte against those that live first.
          ByteSet alive;
          for (int b = node.byte; b < 256; ++b) {
            if (v.class_of_[b] == node.byte && Next(from, static_cast<uint8_t>(b)) != kDead) {
              alive.Add(static_cast<uint8_t>(b));
            }
          }
          const size_t at = node.depth - 1;
          const bool none = alive.bits == std::array<uint64_t, 4>{};
          const char* text = v.class_bytes_.data();
          for (int32_t k = node.begin, end = none ? k : v.class_trie_.TokensEnd(i); k < end; ++k) {
            const int32_t first = v.class_offsets_[k], last = v.class_offsets_[k + 1];
            if (!alive.Has(static_cast<uint8_t>(text[first + at]))) continue;
            int32_t s = from;
            for (int32_t j = first + at; j < last && s != kDead; ++j) {
              s = Next(s, static_cast<uint8_t>(text[j]));
            }
            if (s != kDead) bits[ids[k] >> 6] |= uint64_t{1} << (ids[k] & 63);
          }
        }
        i = node.end;
        continue;
      }
    }
    const int32_t to = Next(from, node.byte);
    if (to == kDead) {
      i = node.end;
      continue;
    }
    levels_[node.depth] = to;
    if (const int32_t dense = v.class_dense_[i]; dense >= 0) {
      const size_t words = mask->size();
      const uint64_t* add = v.dense_masks_.data() + dense * words;
      for (size_t w = 0; w < words; ++w) bits[w] |= add[w];
    } else {
      for (int32_t k = node.begin; k < node.begin + node.count; ++k) {
        bits[ids[k] >> 6] |= uint64_t{1} << (ids[k] & 63);
      }
    }
    ++i;
  }
  for (int b = 0; b < 256; ++b) {
    const int32_t root = v.byte_roots_[b];
    if (root < 0 || !by_bytes.Has(v.class_of_[b])) continue;
    WalkBytes(root, v.byte_trie_.nodes[root].end, bits);
  }
  matcher_.Rollback(mark);
}

void TokenMatcher::FillMask(std::span<const int32_t> stop, std::vector<uint64_t>* mask) {
  const size_t words = static_cast<size_t>((vocabulary_->size() + 63) / 64);
  const MatchState& state = matcher_.state();
  // By canonical positions, the states along a long repeated run share one key (and mask).
  std::string key;
  if (canonical_) {
    key = matcher_.Key(state, /*canonical=*/true);
  } else {
    key.assign(reinterpret_cast<const char*>(state.stacks.data()),
               state.stacks.size() * sizeof(int32_t));
    key.push_back(state.complete ? 1 : 0);
  }
  if (auto it = index_.find(key); use_cache_ && it != index_.end()) {
    ++hits_;
    cache_.splice(cache_.begin(), cache_, it->second);
    *mask = it->second->second;
  } else {
    // Another request of the grammar may have walked this state already.
    const std::string shared_key = !shared_ ? std::string() : canonical_ ? key : matcher_.Key(state);
    if (!shared_ || !matcher_.status().ok() || !shared_->Get(shared_key, mask)) {
      mask->assign(words, 0);
      if (matcher_.status().ok()) {
        // The walk from the canonical state gives the same mask (Grammar::canonical).
        const size_t mark = matcher_.Mark();
        const bool moved = canonical_ && matcher_.Canonical(state, &canonical_state_);
        Walk(moved ? canonical_state_ : state, mask);
        matcher_.Rollback(mark);
      }
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
