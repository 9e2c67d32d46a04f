#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <unordered_map>
#include <utility>

#include "core/mapped_file.h"
#include "formats/bitgpu_files.h"
#include "formats/gguf.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/components.h"
#include "tokenizer/json_scan.h"
#include "tokenizer/unicode.h"

namespace gizllm {
namespace tok {

struct TokenizerData {
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<Model> model;
  std::unique_ptr<PostProcessor> post_processor;
  std::unique_ptr<Decoder> decoder;

  std::vector<AddedToken> added;    // in the order of tokenizer.json
  TokenMatcher raw_matcher;         // added tokens with normalized = false
  TokenMatcher normalized_matcher;  // the others, normalized, matched after normalizing
  std::unordered_map<int32_t, int32_t> added_by_id;  // id -> index into `added`
  StringIdMap added_by_text;
  int64_t vocab_size = 0;

  // The ids of one text before post-processing.
  Expected<std::vector<int32_t>> EncodeText(std::string_view text) const;
};

Expected<std::vector<int32_t>> TokenizerData::EncodeText(std::string_view text) const {
  if (size_t bad = FindInvalidUtf8(text); bad != std::string_view::npos) {
    return InvalidArgument("text is not valid UTF-8 (byte " + std::to_string(bad) + ")");
  }
  std::vector<Piece> pieces;
  if (text.empty()) return std::vector<int32_t>();
  pieces.push_back(Piece{std::string(text), -1, true});
  SplitAddedTokens(raw_matcher, added, &pieces);
  if (normalizer) {
    for (Piece& p : pieces) {
      if (p.id < 0) normalizer->Normalize(&p.text);
    }
  }
  SplitAddedTokens(normalized_matcher, added, &pieces);
  // Normalizing can leave empty pieces, which Hugging Face drops.
  std::erase_if(pieces, [](const Piece& p) { return p.id < 0 && p.text.empty(); });
  if (pre_tokenizer) pre_tokenizer->PreTokenize(&pieces);
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  for (const Piece& p : pieces) {
    if (p.id >= 0) {
      ids.push_back(p.id);
    } else {
      model->Tokenize(p.text, &ids);
    }
  }
  return ids;
}

namespace {

Expected<std::shared_ptr<TokenizerData>> Build(const Json& root, const ModelText& model_text,
                                               std::unique_ptr<Model> model) {
  if (!root.is_object()) return InvalidArgument("expected a JSON object at the top level");
  auto data = std::make_shared<TokenizerData>();
  auto field = [&](const char* key) -> const Json& {
    static const Json kNull;
    auto it = root.find(key);
    return it == root.end() ? kNull : *it;
  };
  GZ_ASSIGN_OR_RETURN(data->normalizer, MakeNormalizer(field("normalizer"), "normalizer"));
  GZ_ASSIGN_OR_RETURN(data->pre_tokenizer,
                      MakePreTokenizer(field("pre_tokenizer"), "pre_tokenizer"));
  GZ_ASSIGN_OR_RETURN(data->decoder, MakeDecoder(field("decoder"), "decoder"));
  const Json& added = field("added_tokens");
  if (!added.is_null() && !added.is_array()) {
    return InvalidArgument("field 'added_tokens': expected an array");
  }
  if (!field("model").is_object()) return InvalidArgument("field 'model': expected an object");
  ModelText text = model_text;
  text.added_tokens = static_cast<int64_t>(added.size());
  if (model) {
    data->model = std::move(model);
  } else {
    GZ_ASSIGN_OR_RETURN(data->model, MakeModel(field("model"), text, "model"));
  }
  data->vocab_size = data->model->size();

  for (size_t i = 0; i < added.size(); ++i) {
    const Json& a = added[i];
    std::string where = "added_tokens[" + std::to_string(i) + "]";
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
        (!a["id"].is_number_unsigned() && a["id"].get<int64_t>() < 0)) {
      return InvalidArgument("field '" + where + ".id': expected a non-negative id");
    }
    AddedToken t;
    GZ_ASSIGN_OR_RETURN(t.content, GetString(a, "content", where));
    if (uint64_t id = a["id"].get<uint64_t>();
        id >= static_cast<uint64_t>(IdLimit(data->model->size(), text.added_tokens))) {
      return IdBeyondVocab(where + ".id", t.content, id, data->model->size(), text.added_tokens);
    }
    t.id = a["id"].get<int32_t>();
    GZ_ASSIGN_OR_RETURN(t.special, GetBool(a, "special", where, false));
    GZ_ASSIGN_OR_RETURN(t.single_word, GetBool(a, "single_word", where, false));
    GZ_ASSIGN_OR_RETURN(t.lstrip, GetBool(a, "lstrip", where, false));
    GZ_ASSIGN_OR_RETURN(t.rstrip, GetBool(a, "rstrip", where, false));
    GZ_ASSIGN_OR_RETURN(t.normalized, GetBool(a, "normalized", where, !t.special));
    if (t.content.empty()) continue;
    if (FindInvalidUtf8(t.content) != std::string::npos) {
      return InvalidArgument("field '" + where + ".content': expected valid UTF-8");
    }
    data->vocab_size = std::max<int64_t>(data->vocab_size, t.id + 1);
    data->added_by_id[t.id] = static_cast<int32_t>(data->added.size());
    data->added_by_text.Set(t.content, t.id);
    data->added.push_back(std::move(t));
  }
  // Hugging Face puts special tokens first in its matchers; a tie (same text) goes to them.
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t k = 0; k < data->added.size(); ++k) {
      const AddedToken& t = data->added[k];
      if (t.special != (pass == 0)) continue;
      if (!t.normalized) {
        data->raw_matcher.Add(t.content, static_cast<int32_t>(k));
      } else {
        std::string text = t.content;
        if (data->normalizer) data->normalizer->Normalize(&text);
        data->normalized_matcher.Add(text, static_cast<int32_t>(k));
      }
    }
  }
  // Last: its special tokens' ids must be below the vocab size, added tokens included.
  GZ_ASSIGN_OR_RETURN(data->post_processor, MakePostProcessor(field("post_processor"),
                                                              data->vocab_size, "post_processor"));
  return data;
}

}  // namespace
}  // namespace tok

Expected<Tokenizer> Tokenizer::FromJson(std::string_view json, const std::string& name) {
  return FromJsonWithModel(json, name, nullptr);
}

Expected<Tokenizer> Tokenizer::FromJsonWithModel(std::string_view json, const std::string& name,
                                                 std::unique_ptr<tok::Model> model) {
  // The scanner below takes the model's strings as they are, and the components after it expect
  // UTF-8 (the Strip decoder read past a token's end on a cut sequence): the file must be UTF-8,
  // as nlohmann-json and Hugging Face require of the rest.
  if (size_t bad = tok::FindInvalidUtf8(json); bad != std::string_view::npos) {
    return InvalidArgument(name + ": not valid UTF-8 at byte " + std::to_string(bad));
  }
  // The model's vocab and merges (most of the file) are read by a fast scanner; the rest, with
  // those two replaced by null, as a JSON document.
  tok::ModelText model_text;
  std::string rest;
  {
    tok::JsonScanner scan(json);
    scan.Peek();
    tok::JsonRange top{scan.pos(), json.size()};
    auto model = tok::FindMember(json, top, "model");
    if (!model.ok()) return InvalidArgument(name + ": not valid JSON: " + model.status().message());
    tok::JsonRange vocab, merges;
    if (!model->empty() && json[model->begin] == '{') {
      auto v = tok::FindMember(json, *model, "vocab");
      auto m = tok::FindMember(json, *model, "merges");
      if (!v.ok() || !m.ok()) {
        return InvalidArgument(
            name + ": not valid JSON in field 'model': " + (v.ok() ? m : v).status().message());
      }
      vocab = *v;
      merges = *m;
    }
    model_text.vocab = json.substr(vocab.begin, vocab.end - vocab.begin);
    model_text.merges = json.substr(merges.begin, merges.end - merges.begin);
    // Cut them out, in text order.
    std::vector<tok::JsonRange> cuts;
    for (auto r : {vocab, merges}) {
      if (!r.empty()) cuts.push_back(r);
    }
    std::sort(cuts.begin(), cuts.end(), [](auto& x, auto& y) { return x.begin < y.begin; });
    size_t prev = 0;
    for (const auto& r : cuts) {
      rest.append(json.substr(prev, r.begin - prev));
      rest += "null";
      prev = r.end;
    }
    rest.append(json.substr(prev));
  }
  tok::Json root;
  try {
    root = tok::Json::parse(rest);
  } catch (const tok::Json::exception& e) {
    return InvalidArgument(name + ": not valid JSON: " + e.what());
  }
  try {
    auto data = tok::Build(root, model_text, std::move(model));
    if (!data.ok()) return data.status().Annotate(name);
    Tokenizer t;
    t.data_ = std::move(data).value();
    return t;
  } catch (const tok::Json::exception& e) {
    return InvalidArgument(name + ": unexpected field type: " + e.what());
  }
}

Expected<Tokenizer> Tokenizer::Load(const std::string& path) {
  if (path.ends_with(".gguf") && FileExists(path)) {
    GZ_ASSIGN_OR_RETURN(GgufFile gguf, GgufFile::Open(path));
    return FromGguf(gguf);
  }
  if (!FileExists(path + "/tokenizer.json")) {
    // A bitgpu folder without tokenizer.json: its data file's metadata.
    const std::string gguf = BitgpuGgufDataFile(path);
    if (!gguf.empty() && FileExists(gguf)) return Load(gguf);
  }
  std::string file = path;
  if (!FileExists(file) || FileExists(file + "/tokenizer.json")) file = path + "/tokenizer.json";
  auto mapped = MappedFile::Open(file);
  if (!mapped.ok()) return mapped.status();
  return FromJson(std::string_view(reinterpret_cast<const char*>(mapped->data()), mapped->size()),
                  file);
}

namespace {
Status NotLoaded() { return InvalidArgument("the tokenizer is empty (not loaded)"); }
}  // namespace

Expected<std::vector<int32_t>> Tokenizer::Encode(std::string_view text, bool add_special) const {
  if (!data_) return NotLoaded();
  GZ_ASSIGN_OR_RETURN(std::vector<int32_t> ids, data_->EncodeText(text));
  if (data_->post_processor) {
    std::vector<std::vector<int32_t>> sequences(1), types(1);
    sequences[0] = std::move(ids);
    types[0].assign(sequences[0].size(), 0);
    data_->post_processor->Process(&sequences, &types, add_special);
    ids = std::move(sequences[0]);
  }
  return ids;
}

Expected<std::vector<int32_t>> Tokenizer::EncodePair(std::string_view a, std::string_view b,
                                                     bool add_special) const {
  if (!data_) return NotLoaded();
  auto first = data_->EncodeText(a);
  if (!first.ok()) return first.status().Annotate("first text");
  auto second = data_->EncodeText(b);
  if (!second.ok()) return second.status().Annotate("second text");
  std::vector<std::vector<int32_t>> sequences;
  sequences.push_back(std::move(first).value());
  sequences.push_back(std::move(second).value());
  std::vector<std::vector<int32_t>> types = {std::vector<int32_t>(sequences[0].size(), 0),
                                             std::vector<int32_t>(sequences[1].size(), 1)};
  if (data_->post_processor) data_->post_processor->Process(&sequences, &types, add_special);
  std::vector<int32_t> ids;
  for (const auto& s : sequences) ids.insert(ids.end(), s.begin(), s.end());
  return ids;
}

Expected<Encoding> Tokenizer::EncodeTyped(std::string_view first,
                                          std::optional<std::string_view> second, bool add_special,
                                          int64_t max_tokens) const {
  if (!data_) return NotLoaded();
  std::vector<std::vector<int32_t>> sequences, types;
  auto a = data_->EncodeText(first);
  if (!a.ok()) return second ? a.status().Annotate("first text") : a.status();
  sequences.push_back(std::move(a).value());
  if (second) {
    auto b = data_->EncodeText(*second);
    if (!b.ok()) return b.status().Annotate("second text");
    sequences.push_back(std::move(b).value());
  }
  if (max_tokens > 0) {
    // The special tokens the post-processor adds: what it makes of empty texts.
    std::vector<std::vector<int32_t>> empty(sequences.size()), empty_types(sequences.size());
    if (data_->post_processor) data_->post_processor->Process(&empty, &empty_types, add_special);
    int64_t specials = 0;
    for (const auto& e : empty) specials += static_cast<int64_t>(e.size());
    const int64_t budget = max_tokens - specials;
    if (budget < 0) {
      return InvalidArgument("a limit of " + std::to_string(max_tokens) + " tokens is below the " +
                             std::to_string(specials) + " special tokens the tokenizer adds");
    }
    if (sequences.size() == 1) {
      if (static_cast<int64_t>(sequences[0].size()) > budget) sequences[0].resize(budget);
    } else {
      // Hugging Face's longest_first: the shorter text keeps its length while it fits in half
      // the budget; otherwise both get half (the longer, or the second of equals, the odd token).
      int64_t n1 = static_cast<int64_t>(sequences[0].size());
      int64_t n2 = static_cast<int64_t>(sequences[1].size());
      if (n1 + n2 > budget) {
        const bool swap = n1 > n2;
        if (swap) std::swap(n1, n2);
        n2 = n1 > budget ? n1 : std::max(n1, budget - n1);
        if (n1 + n2 > budget) {
          n1 = budget / 2;
          n2 = n1 + budget % 2;
        }
        if (swap) std::swap(n1, n2);
        sequences[0].resize(std::min<int64_t>(n1, static_cast<int64_t>(sequences[0].size())));
        sequences[1].resize(std::min<int64_t>(n2, static_cast<int64_t>(sequences[1].size())));
      }
    }
  }
  for (size_t i = 0; i < sequences.size(); ++i) {
    types.emplace_back(sequences[i].size(), static_cast<int32_t>(i));
  }
  if (data_->post_processor) data_->post_processor->Process(&sequences, &types, add_special);
  Encoding out;
  for (size_t i = 0; i < sequences.size(); ++i) {
    out.ids.insert(out.ids.end(), sequences[i].begin(), sequences[i].end());
    out.types.insert(out.types.end(), types[i].begin(), types[i].end());
  }
  return out;
}

std::string Tokenizer::Decode(std::span<const int32_t> ids, bool skip_special) const {
  if (!data_) return "";
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (auto it = data_->added_by_id.find(id); it != data_->added_by_id.end()) {
      const tok::AddedToken& t = data_->added[it->second];
      if (!(skip_special && t.special)) tokens.push_back(t.content);
      continue;
    }
    if (auto text = data_->model->TokenText(id)) tokens.emplace_back(*text);
  }
  if (!data_->decoder) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) out += ' ';
      out += tokens[i];
    }
    return out;
  }
  data_->decoder->DecodeChain(&tokens);
  std::string out;
  for (const std::string& t : tokens) out += t;
  return tok::Utf8Lossy(out);
}

std::string Tokenizer::TokenBytes(int32_t id) const {
  if (!data_) return "";
  if (auto it = data_->added_by_id.find(id); it != data_->added_by_id.end()) {
    return data_->added[it->second].content;
  }
  auto text = data_->model->TokenText(id);
  if (!text) return "";
  if (!data_->decoder) return std::string(*text);
  // Decoders may drop what starts a text (Metaspace's prepended space, Strip): the token's
  // bytes after itself are what it adds mid-text.
  std::vector<std::string> one{std::string(*text)}, two{std::string(*text), std::string(*text)};
  data_->decoder->DecodeBytes(&one);
  data_->decoder->DecodeBytes(&two);
  std::string a, b;
  for (const std::string& t : one) a += t;
  for (const std::string& t : two) b += t;
  if (b.size() >= a.size() && b.compare(0, a.size(), a) == 0) return b.substr(a.size());
  return a;
}

int32_t Tokenizer::TokenId(std::string_view token) const {
  if (!data_) return -1;
  int32_t id = data_->added_by_text.Get(token);
  return id >= 0 ? id : data_->model->TokenId(token);
}

std::string Tokenizer::TokenText(int32_t id) const {
  if (!data_) return "";
  if (auto it = data_->added_by_id.find(id); it != data_->added_by_id.end()) {
    return data_->added[it->second].content;
  }
  auto text = data_->model->TokenText(id);
  return text ? std::string(*text) : std::string();
}

int64_t Tokenizer::vocab_size() const { return data_ ? data_->vocab_size : 0; }

bool Tokenizer::IsSpecial(int32_t id) const {
  if (!data_) return false;
  auto it = data_->added_by_id.find(id);
  return it != data_->added_by_id.end() && data_->added[it->second].special;
}

StreamDecoder::StreamDecoder(const Tokenizer& t, bool skip_special)
    : tokenizer_(t), skip_special_(skip_special) {}

std::string StreamDecoder::Push(int32_t id) {
  ids_.push_back(id);
  std::string text = tokenizer_.Decode(ids_, skip_special_);
  // Hold back text that ends in U+FFFD: the next bytes may complete the character.
  if (text.size() <= prefix_.size() ||
      (text.size() >= 3 && text.compare(text.size() - 3, 3, "\xEF\xBF\xBD") == 0)) {
    return "";
  }
  size_t common = text.compare(0, prefix_.size(), prefix_) == 0 ? prefix_.size() : 0;
  std::string fresh = text.substr(common);
  // The ids just emitted stay as context: decoders treat the first token specially.
  ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(prefix_ids_));
  prefix_ids_ = ids_.size();
  prefix_ = tokenizer_.Decode(ids_, skip_special_);
  return fresh;
}

std::string StreamDecoder::Flush() {
  std::string text = tokenizer_.Decode(ids_, skip_special_);
  std::string fresh;
  if (text.size() > prefix_.size()) {
    fresh = text.compare(0, prefix_.size(), prefix_) == 0 ? text.substr(prefix_.size()) : text;
  }
  ids_.clear();
  prefix_ids_ = 0;
  prefix_.clear();
  return fresh;
}

}  // namespace gizllm
