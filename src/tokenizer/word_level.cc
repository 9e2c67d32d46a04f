// WordLevel: each pre-tokenized piece is one token, or the unknown token.
#include <algorithm>

#include "tokenizer/models.h"

namespace gizllm::tok {
namespace {

class WordLevelModel : public Model {
 public:
  void Tokenize(std::string_view word, std::vector<int32_t>* ids) const override {
    int32_t id = vocab_.Get(word);
    if (id < 0) id = unk_id_;
    if (id >= 0) ids->push_back(id);  // without an unknown token Hugging Face fails; skip it
  }

  int32_t TokenId(std::string_view token) const override { return vocab_.Get(token); }
  std::optional<std::string_view> TokenText(int32_t id) const override {
    if (id < 0 || id >= static_cast<int32_t>(tokens_.size()) || !known_[id]) return std::nullopt;
    return tokens_[id];
  }
  int64_t size() const override { return static_cast<int64_t>(tokens_.size()); }

  static Expected<std::unique_ptr<Model>> Make(const Json& j, const ModelText& text,
                                               const std::string& where) {
    auto m = std::make_unique<WordLevelModel>();
    int32_t max_id = -1;
    GZ_RETURN_IF_ERROR(
        ReadIdObject(text.vocab, text.added_tokens, where + ".vocab", &m->vocab_, &max_id));
    m->tokens_.resize(max_id + 1);
    m->known_.assign(max_id + 1, false);
    m->vocab_.ForEach([&](std::string_view token, int32_t id) {
      m->tokens_[id] = token;
      m->known_[id] = true;
    });
    if (auto it = j.find("unk_token"); it != j.end() && it->is_string()) {
      m->unk_id_ = m->vocab_.Get(it->get<std::string>());
    }
    return std::unique_ptr<Model>(std::move(m));
  }

 private:
  StringIdMap vocab_;
  std::vector<std::string_view> tokens_;  // [size()] token text by id (in vocab_)
  std::vector<bool> known_;               // [size()] whether the id is in the vocabulary
  int32_t unk_id_ = -1;
};

}  // namespace

Expected<std::unique_ptr<Model>> MakeWordLevelModel(const Json& j, const ModelText& text,
                                                    const std::string& where) {
  return WordLevelModel::Make(j, text, where);
}

}  // namespace gizllm::tok
