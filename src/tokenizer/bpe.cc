// Byte-pair encoding as Hugging Face tokenizers runs it: each character (with the continuing
// prefix / end-of-word suffix) becomes a symbol, unknown characters fall back to <0xNN> bytes or
// the unknown token, then the pair with the lowest merge rank (leftmost first) merges until none
// is left.
#include <algorithm>
#include <utility>

#include "tokenizer/hash_maps.h"
#include "tokenizer/json_scan.h"
#include "tokenizer/models.h"
#include "tokenizer/unicode.h"

namespace gizllm::tok {
namespace {

class BpeModel : public Model {
 public:
  void Tokenize(std::string_view piece, std::vector<int32_t>* ids) const override {
    if (piece.empty()) return;
    if (ignore_merges_) {
      int32_t id = vocab_.Get(piece);
      if (id >= 0) {
        ids->push_back(id);
        return;
      }
    }
    Merge(piece, ids);
  }

  int32_t TokenId(std::string_view token) const override { return vocab_.Get(token); }
  std::optional<std::string_view> TokenText(int32_t id) const override {
    if (id < 0 || id >= static_cast<int32_t>(tokens_.size()) || !known_[id]) return std::nullopt;
    return tokens_[id];
  }
  int64_t size() const override { return static_cast<int64_t>(tokens_.size()); }

  static Expected<std::unique_ptr<Model>> Make(const Json& j, const ModelText& text,
                                               const std::string& where);

 private:
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    bool removed;
  };
  struct Candidate {
    int32_t rank, pos, id;
    // std heap is a max-heap: the "largest" is the lowest rank, then the leftmost position.
    bool operator<(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };

  void AddSymbol(std::vector<Symbol>* word, int32_t id) const {
    int32_t n = static_cast<int32_t>(word->size());
    word->push_back({id, n - 1, n + 1, false});
  }

  void Merge(std::string_view w, std::vector<int32_t>* ids) const {
    std::vector<Symbol> word;
    word.reserve(w.size());
    int32_t unk_pending = -1;  // the unknown token waiting to be added (fused runs)
    std::string s;
    size_t i = 0;
    while (i < w.size()) {
      size_t start = i;
      i += Utf8Length(static_cast<unsigned char>(w[i]));
      std::string_view ch = w.substr(start, i - start);
      int32_t id;
      if (prefix_.empty() && suffix_.empty()) {
        id = vocab_.Get(ch);
        if (id < 0) s.assign(ch);
      } else {
        s.clear();
        if (start != 0) s += prefix_;
        s += ch;
        if (i == w.size()) s += suffix_;
        id = vocab_.Get(s);
      }
      if (id >= 0) {
        if (unk_pending >= 0) {
          AddSymbol(&word, unk_pending);
          unk_pending = -1;
        }
        AddSymbol(&word, id);
        continue;
      }
      if (byte_fallback_) {
        bool all = true;
        for (unsigned char b : s) all = all && byte_ids_[b] >= 0;
        if (all) {
          // Hugging Face adds the byte tokens without flushing a pending unknown token first.
          for (unsigned char b : s) AddSymbol(&word, byte_ids_[b]);
          continue;
        }
      }
      if (unk_id_ >= 0) {
        if (unk_pending >= 0 && !fuse_unk_) AddSymbol(&word, unk_pending);
        unk_pending = unk_id_;
      }
    }
    if (unk_pending >= 0) AddSymbol(&word, unk_pending);
    if (word.empty()) return;
    word.back().next = -1;

    std::vector<Candidate> heap;
    heap.reserve(word.size());
    for (size_t k = 0; k + 1 < word.size(); ++k) {
      if (const PairMap::Value* m = merges_.Get(word[k].id, word[k + 1].id)) {
        heap.push_back({m->rank, static_cast<int32_t>(k), m->id});
      }
    }
    std::make_heap(heap.begin(), heap.end());
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end());
      Candidate top = heap.back();
      heap.pop_back();
      Symbol& cur = word[top.pos];
      if (cur.removed || cur.next < 0) continue;
      int32_t next_pos = cur.next;
      const PairMap::Value* m = merges_.Get(cur.id, word[next_pos].id);
      if (m == nullptr || m->id != top.id) continue;  // a stale candidate
      cur.id = top.id;
      Symbol& right = word[next_pos];
      right.removed = true;
      cur.next = right.next;
      if (right.next >= 0) word[right.next].prev = top.pos;
      if (cur.prev >= 0) {
        if (const PairMap::Value* p = merges_.Get(word[cur.prev].id, cur.id)) {
          heap.push_back({p->rank, cur.prev, p->id});
          std::push_heap(heap.begin(), heap.end());
        }
      }
      if (cur.next >= 0) {
        if (const PairMap::Value* p = merges_.Get(cur.id, word[cur.next].id)) {
          heap.push_back({p->rank, top.pos, p->id});
          std::push_heap(heap.begin(), heap.end());
        }
      }
    }
    for (const Symbol& sym : word) {
      if (!sym.removed) ids->push_back(sym.id);
    }
  }

  StringIdMap vocab_;
  std::vector<std::string_view> tokens_;  // [size()] token text by id (in vocab_)
  std::vector<bool> known_;               // [size()] whether the id is in the vocabulary
  PairMap merges_;
  int32_t byte_ids_[256];
  int32_t unk_id_ = -1;
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  std::string prefix_, suffix_;
};

Expected<std::string> OptionalString(const Json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::string();
  if (!it->is_string()) {
    return InvalidArgument("field '" + where + "." + key + "': expected a string or null");
  }
  return it->get<std::string>();
}

Expected<std::unique_ptr<Model>> BpeModel::Make(const Json& j, const ModelText& text,
                                                const std::string& where) {
  auto m = std::make_unique<BpeModel>();
  int32_t max_id = -1;
  GZ_RETURN_IF_ERROR(
      ReadIdObject(text.vocab, text.added_tokens, where + ".vocab", &m->vocab_, &max_id));
  m->tokens_.resize(max_id + 1);
  m->known_.assign(max_id + 1, false);
  m->vocab_.ForEach([&](std::string_view token, int32_t id) {
    m->tokens_[id] = token;
    m->known_[id] = true;
  });

  GZ_ASSIGN_OR_RETURN(m->prefix_, OptionalString(j, "continuing_subword_prefix", where));
  GZ_ASSIGN_OR_RETURN(m->suffix_, OptionalString(j, "end_of_word_suffix", where));
  GZ_ASSIGN_OR_RETURN(std::string unk, OptionalString(j, "unk_token", where));
  if (!unk.empty()) {
    m->unk_id_ = m->vocab_.Get(unk);
    if (m->unk_id_ < 0) {
      return InvalidArgument("field '" + where + ".unk_token': '" + unk + "' is not in the vocab");
    }
  }
  GZ_ASSIGN_OR_RETURN(m->fuse_unk_, GetBool(j, "fuse_unk", where, false));
  GZ_ASSIGN_OR_RETURN(m->byte_fallback_, GetBool(j, "byte_fallback", where, false));
  GZ_ASSIGN_OR_RETURN(m->ignore_merges_, GetBool(j, "ignore_merges", where, false));
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    m->byte_ids_[b] = m->vocab_.Get(name);
  }

  // Merges: ["a b", ...] or [["a", "b"], ...].
  const std::string mwhere = where + ".merges";
  JsonScanner scan(text.merges);
  if (!scan.Consume('[')) return InvalidArgument("field '" + mwhere + "': expected an array");
  {
    // Size the table once: one merge per string ("a b") or per two strings (["a", "b"]).
    size_t quotes = CountByte(text.merges, '"');
    bool pairs = text.merges.find('[', text.merges.find('[') + 1) != std::string_view::npos;
    m->merges_.Reserve(quotes / (pairs ? 4 : 2));
  }
  // Merges are read in batches whose hash-table lookups are prefetched together: the tables are
  // large, and a lookup is mostly a cache miss.
  constexpr int kBatch = 64;
  struct Pending {
    std::string a, b, merged;
    uint64_t ha, hb, hm;
  };
  std::vector<Pending> batch(kBatch);
  int32_t rank = 0;
  bool done = false;
  while (!done) {
    int n = 0;
    for (; n < kBatch; ++n, ++rank) {
      if (scan.Consume(']')) {
        done = true;
        break;
      }
      auto at = [&] { return mwhere + "[" + std::to_string(rank) + "]"; };
      if (rank > 0 && !scan.Consume(',')) {
        return InvalidArgument("field '" + at() + "': expected ',' or ']' before it");
      }
      Pending& p = batch[n];
      if (scan.Peek() == '"') {
        if (!scan.String(&p.merged)) return InvalidArgument("field '" + at() + "': bad string");
        size_t sp = p.merged.find(' ');
        if (sp == std::string::npos || p.merged.find(' ', sp + 1) != std::string::npos) {
          return InvalidArgument("field '" + at() +
                                 "': expected two tokens separated by one space");
        }
        p.a.assign(p.merged, 0, sp);
        p.b.assign(p.merged, sp + 1);
      } else if (scan.Consume('[')) {
        if (!scan.String(&p.a) || !scan.Consume(',') || !scan.String(&p.b) || !scan.Consume(']')) {
          return InvalidArgument("field '" + at() + "': expected [\"a\", \"b\"]");
        }
      } else {
        return InvalidArgument("field '" + at() + "': expected \"a b\" or [\"a\", \"b\"]");
      }
      p.merged.assign(p.a);
      std::string_view tail = p.b;
      if (!m->prefix_.empty() && tail.substr(0, m->prefix_.size()) == m->prefix_) {
        tail.remove_prefix(m->prefix_.size());
      }
      p.merged += tail;
      p.ha = HashBytes(p.a);
      p.hb = HashBytes(p.b);
      p.hm = HashBytes(p.merged);
      m->vocab_.Prefetch(p.ha);
      m->vocab_.Prefetch(p.hb);
      m->vocab_.Prefetch(p.hm);
    }
    int32_t first = rank - n;
    for (int k = 0; k < n; ++k) {
      const Pending& p = batch[k];
      auto at = [&] { return mwhere + "[" + std::to_string(first + k) + "]"; };
      int32_t ia = m->vocab_.Get(p.a, p.ha), ib = m->vocab_.Get(p.b, p.hb);
      if (ia < 0 || ib < 0) {
        return InvalidArgument("field '" + at() + "': token '" + (ia < 0 ? p.a : p.b) +
                               "' is not in the vocab");
      }
      int32_t id = m->vocab_.Get(p.merged, p.hm);
      if (id < 0) {
        return InvalidArgument("field '" + at() + "': merged token '" + p.merged +
                               "' is not in the vocab");
      }
      m->merges_.Set(ia, ib, {first + k, id});
    }
  }
  return std::unique_ptr<Model>(std::move(m));
}

}  // namespace

Expected<std::unique_ptr<Model>> MakeBpeModel(const Json& j, const ModelText& text,
                                              const std::string& where) {
  return BpeModel::Make(j, text, where);
}

Status ReadIdObject(std::string_view text, int64_t added_tokens, const std::string& where,
                    StringIdMap* vocab, int32_t* max_id) {
  JsonScanner scan(text);
  if (!scan.Consume('{')) return InvalidArgument("field '" + where + "': expected an object");
  {
    size_t quotes = CountByte(text, '"');
    vocab->Reserve(quotes / 2, text.size());
  }
  *max_id = -1;
  int64_t entries = 0;
  std::string token, max_token;
  for (bool first = true; !scan.Consume('}'); first = false, ++entries) {
    if (!first && !scan.Consume(',')) {
      return InvalidArgument("field '" + where + "': expected ',' or '}' at byte " +
                             std::to_string(scan.pos()));
    }
    double id;
    if (!scan.String(&token) || !scan.Consume(':') || !scan.Number(&id) || id < 0 ||
        id > (1 << 30) || id != static_cast<int32_t>(id)) {
      return InvalidArgument("field '" + where + "[\"" + token +
                             "\"]': expected a token and a non-negative integer id");
    }
    vocab->Set(token, static_cast<int32_t>(id));
    if (id > *max_id) {
      *max_id = static_cast<int32_t>(id);
      max_token = token;
    }
  }
  if (*max_id >= IdLimit(entries, added_tokens)) {
    return IdBeyondVocab(where + "[\"" + max_token + "\"]", max_token, *max_id, entries,
                         added_tokens);
  }
  return Status::Ok();
}

Expected<std::unique_ptr<Model>> MakeModel(const Json& j, const ModelText& text,
                                           const std::string& where) {
  std::string type = TypeOf(j);
  if (type.empty() && !text.merges.empty()) type = "BPE";
  if (type == "BPE") return MakeBpeModel(j, text, where);
  if (type == "WordPiece") return MakeWordPieceModel(j, text, where);
  if (type == "Unigram") return MakeUnigramModel(j, text, where);
  if (type == "WordLevel") return MakeWordLevelModel(j, text, where);
  if (type.empty()) return InvalidArgument("field '" + where + ".type': expected a string");
  return Unimplemented("field '" + where + ".type': unknown model type '" + type + "'");
}

}  // namespace gizllm::tok
