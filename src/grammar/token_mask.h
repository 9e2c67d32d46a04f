// Token masks: which tokens of the whole vocabulary a grammar allows next.
//
// TokenVocabulary holds every token's bytes (Tokenizer::TokenBytes) in two tries laid out in
// preorder, each node with the index just past its subtree: one over the bytes, and one over byte
// classes (letters, digits, other punctuation, UTF-8 continuation bytes, UTF-8 lead bytes of each
// length; every other byte a class of its own), where the ~100k tokens of letters and of CJK
// characters fold into a few thousand nodes. A mask walks the class trie with the matcher: a
// node's state is its parent's advanced by the class, which is exact wherever the parent state
// steps every byte of the class alike (Matcher::SameStep: inside a string, every class); where it
// does not, the node's tokens are walked by their bytes (at the root, the byte trie's subtrees of
// the class's bytes; deeper, token by token). Tokens that share a prefix share its work, a class
// the grammar refuses skips the whole subtree, and the states met in one walk form an automaton
// built as it is needed, so a state and a byte seen before cost a table lookup. Special and
// control tokens have no bytes here and are never allowed, except the stop tokens, which are
// allowed exactly where the text is complete. Byte-fallback tokens are their byte, and tokens
// that end inside a UTF-8 character are matched as the bytes they are (the grammar is over bytes).
//
// TokenMatcher keeps a request's matcher and caches masks by matcher state (interned stacks make
// equal states equal), so a state met again, as every character inside a string is, costs a
// lookup.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "grammar/grammar.h"
#include "grammar/matcher.h"
#include "tokenizer/tokenizer.h"

namespace gizllm {

class TokenVocabulary {
 public:
  // bytes[id]: what token id adds to the text; empty: never allowed (special, control, unused).
  explicit TokenVocabulary(std::vector<std::string> bytes);
  // From a tokenizer: `vocab` ids (the model's rows), special tokens left out.
  static TokenVocabulary FromTokenizer(const Tokenizer& tokenizer, int64_t vocab);

  int64_t size() const { return static_cast<int64_t>(bytes_.size()); }
  const std::string& bytes(int32_t id) const { return bytes_[id]; }

 private:
  friend class TokenMatcher;
  // A trie node: tokens ending here are ids[begin, begin + count); the tokens below it (itself
  // included) are ids[begin, the `begin` of nodes[end]) (or to the end of ids).
  struct Node {
    uint8_t byte;   // the byte, or in the class trie the class's first byte
    int32_t depth;  // 1 for the first byte of a token
    int32_t end;    // the node after this one's subtree
    int32_t begin;
    int32_t count;
  };
  struct Trie {
    std::vector<Node> nodes;   // preorder
    std::vector<int32_t> ids;  // token ids in key order
    int32_t TokensEnd(int32_t node) const {
      const int32_t end = nodes[node].end;
      return end < static_cast<int32_t>(nodes.size()) ? nodes[end].begin
                                                      : static_cast<int32_t>(ids.size());
    }
  };
  // keys[id]: the token's key (its bytes, or its bytes' classes); empty: left out.
  static Trie BuildTrie(const std::vector<std::string>& keys);

  std::vector<std::string> bytes_;  // [vocab]
  Trie byte_trie_;
  Trie class_trie_;
  // The tokens' bytes in class_trie_.ids order, token k's at [class_offsets_[k], [k + 1]): the
  // walk's fallback reads them in a row.
  std::string class_bytes_;
  std::vector<int32_t> class_offsets_;
  // Class nodes where kDenseTokens tokens or more end (words of one length, CJK characters of
  // one count) also hold those tokens as a mask, one OR a 64-bit word instead of a bit a token:
  // dense_masks_[class_dense_[node] * words, + words); class_dense_ -1: none.
  static constexpr int32_t kDenseTokens = 512;
  std::vector<int32_t> class_dense_;
  std::vector<uint64_t> dense_masks_;
  std::array<int32_t, 256> byte_roots_;  // byte_trie_'s depth-1 node of each byte; -1: none
  // class_of_[b]: the first byte of b's class; class_sets_[b]: the bytes of the class that b
  // is the first of (a single byte for bytes of their own).
  std::array<uint8_t, 256> class_of_;
  std::array<ByteSet, 256> class_sets_;
  std::array<bool, 256> class_wide_;  // the class holds more than one byte
  int32_t depth_ = 0;                 // the longest token
};

// Masks of one grammar over one vocabulary by parse state (Matcher::Key), shared by every
// request of that grammar: requests that reach the same state (the same place in a JSON
// structure, the same length into a bounded string) walk the trie once. Thread-safe; the least
// recently used mask goes first.
class SharedMasks {
 public:
  static constexpr size_t kMasks = 256;
  // The mask of `key` into *mask; false if none is held.
  bool Get(const std::string& key, std::vector<uint64_t>* mask);
  void Put(const std::string& key, const std::vector<uint64_t>& mask);
  int64_t hits() const { return hits_; }

 private:
  std::mutex mu_;
  std::list<std::pair<std::string, std::vector<uint64_t>>> masks_;
  std::unordered_map<std::string, decltype(masks_)::iterator> index_;
  std::atomic<int64_t> hits_{0};
};

// A grammar over a vocabulary: what a request's Sampling carries. Requests that share one
// TokenGrammar share its masks.
struct TokenGrammar {
  std::shared_ptr<const Grammar> grammar;
  std::shared_ptr<const TokenVocabulary> vocabulary;
  std::shared_ptr<SharedMasks> masks = std::make_shared<SharedMasks>();
};

class TokenMatcher {
 public:
  static constexpr size_t kCachedMasks = 64;

  // cache: keep masks by state (off: every mask walks the trie; for measuring the walk).
  // classes: walk the class trie (off: the byte trie alone, the plain walk tests compare with).
  // canonical: key masks by canonical states (Grammar::canonical), where the vocabulary's
  // longest token is within Grammar::kCanonicalDepth bytes (off: every state its own).
  explicit TokenMatcher(const TokenGrammar& grammar, bool cache = true, bool classes = true,
                        bool canonical = true);

  // mask: [ceil(vocab / 64)] bits, 1 where the token is allowed next. stop: the request's stop
  // tokens, allowed where the text is complete.
  void FillMask(std::span<const int32_t> stop, std::vector<uint64_t>* mask);
  // The key of the matcher's state across requests of the grammar (Matcher::Key).
  std::string StateKey() const { return matcher_.Key(matcher_.state(), canonical_); }
  // Takes a chosen (non-stop) token; false if the grammar does not allow it here.
  bool Accept(int32_t token);
  bool Complete() const { return matcher_.Complete(); }
  const Status& status() const { return matcher_.status(); }
  int64_t cache_hits() const { return hits_; }

 private:
  void Walk(const MatchState& root, std::vector<uint64_t>* mask);
  // Walks byte_trie_'s nodes [begin, end) (whole subtrees), the root's state in levels_[0].
  void WalkBytes(int32_t begin, int32_t end, uint64_t* bits);
  // The state after `byte` from walk state `from` (kDead: none).
  int32_t Next(int32_t from, uint8_t byte);
  int32_t InternState(const MatchState& state);

  std::shared_ptr<const TokenVocabulary> vocabulary_;
  std::shared_ptr<SharedMasks> shared_;  // the grammar's masks (null: none shared)
  Matcher matcher_;
  // One walk's states as a lazily built automaton: walk_next_[state * 256 + byte] is the state
  // after the byte, kDead, or kUnknown until first needed. Inside a string most trie nodes are
  // one lookup.
  static constexpr int32_t kUnknown = -2;
  static constexpr int32_t kDead = -1;
  std::vector<int32_t> levels_;  // [depth + 1] state ids along the trie walk
  // walk_states_[0, walk_count_): the walk's states (the vector keeps the states of earlier
  // walks past walk_count_, to reuse their memory).
  std::vector<MatchState> walk_states_;
  int32_t walk_count_ = 0;
  // walk_same_[state * 256 + class]: 1 if the state steps every byte of the class alike, 0 if
  // not, -1 until first needed.
  std::vector<int8_t> walk_same_;
  // Open addressing over walk_states_ by their stacks; -1: empty.
  std::vector<int32_t> walk_table_;
  std::vector<int32_t> walk_next_;
  MatchState scratch_;
  // Masks by state (key: the stacks' ids and the complete flag, or with canonical_ the
  // canonical Matcher::Key), least recently used last.
  std::list<std::pair<std::string, std::vector<uint64_t>>> cache_;
  std::unordered_map<std::string, decltype(cache_)::iterator> index_;
  int64_t hits_ = 0;
  bool use_cache_ = true;
  bool use_classes_ = true;
  bool canonical_ = false;
  MatchState canonical_state_;
};

// Sets logits of tokens the mask leaves out to -inf.
void ApplyMask(std::span<const uint64_t> mask, std::span<float> logits);

}  // namespace gizllm
