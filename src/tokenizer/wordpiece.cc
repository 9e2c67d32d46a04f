// WordPiece (BERT): the longest vocabulary prefix of a word, then the longest "##" continuation,
// and so on; a word that cannot be covered, or is longer than max_input_chars_per_word
// characters, becomes the unknown token.
#include <algorithm>

#include "tokenizer/hash_maps.h"
#include "tokenizer/models.h"
#include "tokenizer/unicode.h"

namespace gizllm::tok {
namespace {

class WordPieceModel : public Model {
 public:
  void Tokenize(std::string_view word, std::vector<int32_t>* ids) const override {
    size_t chars = 0;
    for (unsigned char c : word) chars += (c & 0xC0) != 0x80;
    if (chars > max_chars_) {
      ids->push_back(unk_id_);
      return;
    }
    size_t mark = ids->size();
    std::string candidate;
    size_t start = 0;
    while (start < word.size()) {
      size_t end = word.size();
      int32_t found = -1;
      while (start < end) {
        candidate.clear();
        if (start > 0) candidate += prefix_;
        candidate.append(word.substr(start, end - start));
        found = vocab_.Get(candidate);
        if (found >= 0) break;
        // Drop the last character.
        do {
          --end;
        } while (end > start && (static_cast<unsigned char>(word[end]) & 0xC0) == 0x80);
      }
      if (found < 0) {
        ids->resize(mark);
        ids->push_back(unk_id_);
        return;
      }
      ids->push_back(found);
      start = end;
    }
  }

  int32_t TokenId(std::string_view token) const override { return vocab_.Get(token); }
  std::optional<std::string_view> TokenText(int32_t id) const override {
    if (id < 0 || id >= static_cast<int32_t>(tokens_.size()) || !known_[id]) return std::nullopt;
    return tokens_[id];
  }
  int64_t size() const override { return static_cast<int64_t>(tokens_.size()); }

  static Expected<std::unique_ptr<Model>> Make(const Json& j, const ModelText& text,
                                               const std::string& where) {
    auto m = std::make_unique<WordPieceModel>();
    int32_t max_id = -1;
    GZ_RETURN_IF_ERROR(
        ReadIdObject(text.vocab, text.added_tokens, where + ".vocab", &m->vocab_, &max_id));
    m->tokens_.resize(max_id + 1);
    m->known_.assign(max_id + 1, false);
    m->vocab_.ForEach([&](std::string_view token, int32_t id) {
      m->tokens_[id] = token;
      m->known_[id] = true;
    });
    GZ_ASSIGN_OR_RETURN(std::string unk, GetString(j, "unk_token", where));
    m->unk_id_ = m->vocab_.Get(unk);
    if (m->unk_id_ < 0) {
      return InvalidArgument("field '" + where + ".unk_token': '" + unk + "' is not in the vocab");
    }
    m->prefix_ = "##";
    if (auto it = j.find("continuing_subword_prefix"); it != j.end() && it->is_string()) {
      m->prefix_ = it->get<std::string>();
    }
    if (auto it = j.find("max_input_chars_per_word"); it != j.end() && it->is_number_integer()) {
      m->max_chars_ = it->get<size_t>();
    }
    return std::unique_ptr<Model>(std::move(m));
  }

 private:
  StringIdMap vocab_;
  std::vector<std::string_view> tokens_;  // [size()] token text by id (in vocab_)
  std::vector<bool> known_;               // [size()] whether the id is in the vocabulary
  int32_t unk_id_ = -1;
  std::string prefix_;
  size_t max_chars_ = 100;
};

}  // namespace

Expected<std::unique_ptr<Model>> MakeWordPieceModel(const Json& j, const ModelText& text,
                                                    const std::string& where) {
  return WordPieceModel::Make(j, text, where);
}

}  // namespace gizllm::tok
