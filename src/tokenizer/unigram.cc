// Unigram (SentencePiece, XLM-RoBERTa, T5): the segmentation with the highest sum of piece scores
// (Viterbi over byte positions); a character no piece covers costs the lowest score minus 10 and
// becomes the unknown token, consecutive unknowns fused into one; with byte_fallback an unknown
// piece becomes its <0xNN> byte tokens.
#include <algorithm>
#include <limits>

#include "tokenizer/hash_maps.h"
#include "tokenizer/json_scan.h"
#include "tokenizer/models.h"
#include "tokenizer/unicode.h"

namespace gizllm::tok {
namespace {

class UnigramModel : public Model {
 public:
  void Tokenize(std::string_view text, std::vector<int32_t>* ids) const override {
    if (text.empty()) return;
    const double unk_score = min_score_ - 10.0;
    struct Node {
      double score = 0;
      int64_t start = -1;  // where the best piece ending here starts; -1: not reached
      int32_t id = -1;
    };
    size_t n = text.size();
    std::vector<Node> best(n + 1);
    best[0].start = 0;
    size_t pos = 0;
    while (pos < n) {
      double here = best[pos].score;
      size_t char_len = Utf8Length(static_cast<unsigned char>(text[pos]));
      bool single = false;
      // Every piece that starts at pos (a walk down the trie).
      int32_t node = 0;
      for (size_t i = pos; i < n; ++i) {
        const PairMap::Value* e = edges_.Get(node, static_cast<unsigned char>(text[i]));
        if (e == nullptr) break;
        node = e->id;
        int32_t id = terminal_[node];
        if (id < 0) continue;
        size_t end = i + 1;
        double score = here + scores_[id];
        Node& target = best[end];
        if (target.start < 0 || score > target.score) {
          target = {score, static_cast<int64_t>(pos), id};
        }
        if (end - pos == char_len) single = true;
      }
      if (!single) {
        Node& target = best[pos + char_len];
        double score = here + unk_score;
        if (target.start < 0 || score > target.score) {
          target = {score, static_cast<int64_t>(pos), unk_id_};
        }
      }
      pos += char_len;
    }
    // Walk back from the end; fuse runs of unknowns.
    std::vector<std::pair<size_t, size_t>> pieces;  // [start, end), reversed
    size_t end = n;
    size_t unk_end = 0;
    bool in_unk = false;
    while (end > 0) {
      const Node& node = best[end];
      size_t start = static_cast<size_t>(node.start);
      if (unk_id_ >= 0 && node.id == unk_id_) {
        if (!in_unk) unk_end = end;
        in_unk = true;
      } else {
        if (in_unk) pieces.emplace_back(end, unk_end);
        in_unk = false;
        pieces.emplace_back(start, end);
      }
      end = start;
    }
    if (in_unk) pieces.emplace_back(0, unk_end);
    for (size_t k = pieces.size(); k-- > 0;) {
      std::string_view piece = text.substr(pieces[k].first, pieces[k].second - pieces[k].first);
      int32_t id = vocab_.Get(piece);
      if (id >= 0) {
        ids->push_back(id);
        continue;
      }
      if (byte_fallback_) {
        bool all = true;
        for (unsigned char b : piece) all = all && byte_ids_[b] >= 0;
        if (all) {
          for (unsigned char b : piece) ids->push_back(byte_ids_[b]);
          continue;
        }
      }
      if (unk_id_ >= 0) ids->push_back(unk_id_);  // without one, Hugging Face fails; skip it
    }
  }

  int32_t TokenId(std::string_view token) const override { return vocab_.Get(token); }
  std::optional<std::string_view> TokenText(int32_t id) const override {
    if (id < 0 || id >= static_cast<int32_t>(tokens_.size())) return std::nullopt;
    return tokens_[id];
  }
  int64_t size() const override { return static_cast<int64_t>(tokens_.size()); }

  static Expected<std::unique_ptr<Model>> Make(const Json& j, const ModelText& text,
                                               const std::string& where) {
    auto m = std::make_unique<UnigramModel>();
    const std::string vwhere = where + ".vocab";
    JsonScanner scan(text.vocab);
    if (!scan.Consume('[')) {
      return InvalidArgument("field '" + vwhere + "': expected an array of [piece, score]");
    }
    m->vocab_.Reserve(text.vocab.size() / 16);
    m->min_score_ = std::numeric_limits<double>::infinity();
    std::string piece;
    for (int32_t id = 0; !scan.Consume(']'); ++id) {
      double score;
      if ((id > 0 && !scan.Consume(',')) || !scan.Consume('[') || !scan.String(&piece) ||
          !scan.Consume(',') || !scan.Number(&score) || !scan.Consume(']')) {
        return InvalidArgument("field '" + vwhere + "[" + std::to_string(id) +
                               "]': expected [piece, score]");
      }
      // A duplicate piece maps to its last id, as in Hugging Face.
      m->vocab_.Set(piece, id);
      m->tokens_.push_back(piece);
      m->scores_.push_back(score);
      m->min_score_ = std::min(m->min_score_, score);
    }
    // The trie holds every piece; the last duplicate wins, as the text -> id map.
    m->terminal_.assign(1, -1);
    m->vocab_.ForEach([&](std::string_view piece, int32_t) {
      int32_t id = m->vocab_.Get(piece);
      m->AddToTrie(piece, id);
    });
    if (auto it = j.find("unk_id"); it != j.end() && !it->is_null()) {
      if (!it->is_number_integer() || it->get<int64_t>() < 0 ||
          it->get<int64_t>() >= static_cast<int64_t>(m->tokens_.size())) {
        return InvalidArgument("field '" + where + ".unk_id': expected an id in the vocab");
      }
      m->unk_id_ = it->get<int32_t>();
    }
    GZ_ASSIGN_OR_RETURN(m->byte_fallback_, GetBool(j, "byte_fallback", where, false));
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      m->byte_ids_[b] = m->vocab_.Get(name);
    }
    return std::unique_ptr<Model>(std::move(m));
  }

 private:
  void AddToTrie(std::string_view piece, int32_t id) {
    if (piece.empty()) return;
    int32_t node = 0;
    for (unsigned char b : piece) {
      const PairMap::Value* e = edges_.Get(node, b);
      if (e != nullptr) {
        node = e->id;
      } else {
        int32_t child = static_cast<int32_t>(terminal_.size());
        edges_.Set(node, b, {0, child});
        terminal_.push_back(-1);
        node = child;
      }
    }
    terminal_[node] = id;
  }

  StringIdMap vocab_;
  std::vector<std::string> tokens_;  // [size()] piece by id
  std::vector<double> scores_;       // [size()] log probability by id
  PairMap edges_;                    // trie: (node, byte) -> child node (in Value::id)
  std::vector<int32_t> terminal_;    // [nodes] id of the piece ending at a node, or -1
  double min_score_ = 0;
  int32_t unk_id_ = -1;
  bool byte_fallback_ = false;
  int32_t byte_ids_[256];
};

}  // namespace

Expected<std::unique_ptr<Model>> MakeUnigramModel(const Json& j, const ModelText& text,
                                                  const std::string& where) {
  return UnigramModel::Make(j, text, where);
}

}  // namespace gizllm::tok
