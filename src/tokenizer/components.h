// The stages of a tokenizer.json pipeline, each an interface with one implementation per "type":
// normalizer -> pre-tokenizer -> model -> post-processor, and the decoder back to text.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "tokenizer/regex.h"

namespace gizllm::tok {

using Json = nlohmann::json;

// A piece of the input on its way to the model: text the model reads, or an added token already
// recognized (id >= 0), which later stages pass through untouched.
struct Piece {
  std::string text;
  int32_t id = -1;
  bool at_start = false;  // starts at the beginning of the input (Metaspace's "first" scheme)
};

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // `text` is valid UTF-8 and stays so.
  virtual void Normalize(std::string* text) const = 0;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Splits and rewrites the pieces with id < 0; keeps their order.
  virtual void PreTokenize(std::vector<Piece>* pieces) const = 0;
};

class Model {
 public:
  virtual ~Model() = default;
  // Appends the ids of one pre-tokenized piece.
  virtual void Tokenize(std::string_view piece, std::vector<int32_t>* ids) const = 0;
  virtual int32_t TokenId(std::string_view token) const = 0;  // -1 if absent
  // The token's text, or nullopt if the id is not in the vocabulary.
  virtual std::optional<std::string_view> TokenText(int32_t id) const = 0;
  virtual int64_t size() const = 0;  // highest id + 1
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  // Rewrites the token strings; the decoded text is their concatenation.
  virtual void DecodeChain(std::vector<std::string>* tokens) const = 0;
  // The same, but bytes stay as the tokens give them: no U+FFFD for partial or invalid UTF-8.
  virtual void DecodeBytes(std::vector<std::string>* tokens) const { DecodeChain(tokens); }
};

// Adds special tokens around the ids of one text or a pair (TemplateProcessing, BertProcessing,
// ...). `sequences` holds one or two id lists; a processor that adds tokens merges them into one.
// `types` holds each id's token type (segment), the same shape: 0 for the first text's, 1 for the
// second's on the way in; a processor that adds tokens sets them as its template says.
class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  virtual void Process(std::vector<std::vector<int32_t>>* sequences,
                       std::vector<std::vector<int32_t>>* types, bool add_special) const = 0;
};

// Factories from the JSON objects of tokenizer.json. `where` names the field for messages, e.g.
// "pre_tokenizer.pretokenizers[1]". A null JSON value gives a null pointer. `depth` counts the
// Sequences around `j` (CheckSequenceDepth).
Expected<std::unique_ptr<Normalizer>> MakeNormalizer(const Json& j, const std::string& where,
                                                     int depth = 0);
Expected<std::unique_ptr<PreTokenizer>> MakePreTokenizer(const Json& j, const std::string& where,
                                                         int depth = 0);
Expected<std::unique_ptr<Decoder>> MakeDecoder(const Json& j, const std::string& where,
                                               int depth = 0);
// `vocab_size`: ids of special tokens must be below it.
Expected<std::unique_ptr<PostProcessor>> MakePostProcessor(const Json& j, int64_t vocab_size,
                                                           const std::string& where, int depth = 0);
// A Sequence at `depth` Sequences deep: an error past kMaxSequenceDepth. Each level is a frame of
// the recursive factories above (and of the destructors), and a hostile file nests a million;
// real files nest one or two.
constexpr int kMaxSequenceDepth = 32;
Status CheckSequenceDepth(int depth, const std::string& where);
// The model's big fields as JSON text (read with a fast scanner, not as a JSON document).
struct ModelText {
  std::string_view vocab;    // model.vocab; empty if absent
  std::string_view merges;   // model.merges; empty if absent
  int64_t added_tokens = 0;  // how many entries added_tokens has (ids the vocab may leave to them)
};

// Token ids are dense: in every tokenizer.json we know, each id is below the number of vocab
// entries plus the number of added tokens. A few ids more (holes) are allowed; an id beyond is an
// error, since tables indexed by id would grow with it (an id of 2^30 is gigabytes).
constexpr int64_t kIdSlack = 1024;
// The first id past what `entries` vocab entries and `added` added tokens may use.
inline int64_t IdLimit(int64_t entries, int64_t added) { return entries + added + kIdSlack; }
// The error for `token` of `id` at or past IdLimit(entries, added), naming `where`.
Status IdBeyondVocab(const std::string& where, std::string_view token, uint64_t id, int64_t entries,
                     int64_t added);
// `j` is the model object without its vocab and merges, which come in `text`.
Expected<std::unique_ptr<Model>> MakeModel(const Json& j, const ModelText& text,
                                           const std::string& where);

// Helpers for the factories: typed field access with messages that name the field.
Expected<std::string> GetString(const Json& j, const char* key, const std::string& where);
Expected<bool> GetBool(const Json& j, const char* key, const std::string& where, bool fallback);
std::string TypeOf(const Json& j);
// A "pattern" field: {"String": literal} or {"Regex": pattern}; sets one of the two.
Status ReadSplitPattern(const Json& j, const std::string& where, std::string* literal,
                        std::optional<Regex>* regex);

}  // namespace gizllm::tok
