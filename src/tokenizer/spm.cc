// SentencePiece-style BPE as llama.cpp runs it for GGUF vocabularies of tokenizer.ggml.model
// "llama": each character starts as a symbol, and the adjacent pair whose concatenation is a token
// of the highest score merges first (equal scores: the leftmost pair), until no pair is a token.
// Symbols that are not tokens fall back to their <0xNN> byte tokens. Hugging Face's BPE ranks
// each merge on its own instead (its converter orders merges of one score by the pieces' ids), so
// where overlapping pairs form tokens of one score the two can differ; this follows llama.cpp.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <utility>

#include "tokenizer/hash_maps.h"
#include "tokenizer/models.h"
#include "tokenizer/unicode.h"

namespace gizllm::tok {
namespace {

class SpmModel : public Model {
 public:
  SpmModel(std::vector<std::string> tokens, std::vector<float> scores, std::vector<bool> known,
           int32_t unk_id)
      : tokens_(std::move(tokens)),
        scores_(std::move(scores)),
        known_(std::move(known)),
        unk_id_(unk_id) {
    // A NaN score would break the heap's order; it scores lowest.
    for (float& score : scores_) {
      if (std::isnan(score)) score = -std::numeric_limits<float>::infinity();
    }
    by_text_.Reserve(tokens_.size(), 0);
    // A text given twice is the later id's, as llama.cpp's token_to_id.
    for (size_t id = 0; id < tokens_.size(); ++id) {
      by_text_.Set(tokens_[id], static_cast<int32_t>(id));
    }
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      byte_ids_[b] = by_text_.Get(name);
    }
  }

  void Tokenize(std::string_view piece, std::vector<int32_t>* ids) const override {
    if (piece.empty()) return;
    std::vector<Symbol> symbols;
    symbols.reserve(piece.size());
    for (size_t i = 0; i < piece.size();) {
      const size_t n = std::min(Utf8Length(static_cast<unsigned char>(piece[i])), piece.size() - i);
      const int32_t k = static_cast<int32_t>(symbols.size());
      symbols.push_back({static_cast<uint32_t>(i), static_cast<uint32_t>(n), k - 1, k + 1});
      i += n;
    }
    symbols.back().next = -1;

    std::vector<Bigram> heap;
    heap.reserve(symbols.size());
    auto add = [&](int32_t left, int32_t right) {
      if (left < 0 || right < 0) return;
      const uint32_t size = symbols[left].size + symbols[right].size;
      const int32_t id = by_text_.Get(piece.substr(symbols[left].start, size));
      if (id < 0) return;
      heap.push_back({scores_[id], left, right, size});
      std::push_heap(heap.begin(), heap.end());
    };
    for (int32_t k = 1; k < static_cast<int32_t>(symbols.size()); ++k) add(k - 1, k);
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end());
      const Bigram top = heap.back();
      heap.pop_back();
      Symbol& left = symbols[top.left];
      Symbol& right = symbols[top.right];
      // Stale: one side merged since (a merged-away symbol has size 0; a grown one a larger sum).
      if (left.size == 0 || right.size == 0 || left.size + right.size != top.size) continue;
      left.size += right.size;
      right.size = 0;
      left.next = right.next;
      if (right.next >= 0) symbols[right.next].prev = top.left;
      add(left.prev, top.left);
      add(top.left, left.next);
    }
    for (int32_t k = 0; k >= 0; k = symbols[k].next) {
      const Symbol& s = symbols[k];
      std::string_view text = piece.substr(s.start, s.size);
      if (int32_t id = by_text_.Get(text); id >= 0) {
        ids->push_back(id);
        continue;
      }
      // Only a single character that is no token is left unmerged; its bytes (or the unknown
      // token where the vocabulary has no byte tokens).
      for (unsigned char b : text) {
        if (byte_ids_[b] >= 0) {
          ids->push_back(byte_ids_[b]);
        } else if (unk_id_ >= 0) {
          ids->push_back(unk_id_);
        }
      }
    }
  }

  int32_t TokenId(std::string_view token) const override {
    int32_t id = by_text_.Get(token);
    return id >= 0 && known_[id] ? id : -1;
  }
  std::optional<std::string_view> TokenText(int32_t id) const override {
    if (id < 0 || id >= static_cast<int32_t>(tokens_.size()) || !known_[id]) return std::nullopt;
    return tokens_[id];
  }
  int64_t size() const override { return static_cast<int64_t>(tokens_.size()); }

 private:
  struct Symbol {
    uint32_t start, size;  // bytes of the piece; size 0 once merged into its left neighbour
    int32_t prev, next;
  };
  struct Bigram {
    float score;
    int32_t left, right;
    uint32_t size;  // bytes of the merged text, to tell a stale bigram
    // std heap is a max-heap: the "largest" is the highest score, then the leftmost pair.
    bool operator<(const Bigram& o) const {
      return score != o.score ? score < o.score : left > o.left;
    }
  };

  std::vector<std::string> tokens_;  // [size()] token text by id
  std::vector<float> scores_;        // [size()]
  std::vector<bool> known_;          // [size()] whether TokenText/TokenId give the id
  StringIdMap by_text_;              // every token's text, merges may form any of them
  int32_t byte_ids_[256];
  int32_t unk_id_ = -1;
};

}  // namespace

std::unique_ptr<Model> MakeSpmModel(std::vector<std::string> tokens, std::vector<float> scores,
                                    std::vector<bool> known, int32_t unk_id) {
  return std::make_unique<SpmModel>(std::move(tokens), std::move(scores), std::move(known), unk_id);
}

}  // namespace gizllm::tok
