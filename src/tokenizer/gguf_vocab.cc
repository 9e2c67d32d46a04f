// A Tokenizer from a GGUF file's tokenizer.ggml.* metadata: the Hugging Face tokenizer.json the
// converter read, written back from the vocabulary, token types, merges and special ids, with the
// pre-tokenizer that tokenizer.ggml.pre names; then read as any tokenizer.json. SentencePiece-style
// vocabularies (tokenizer.ggml.model "llama") are written as Llama 2's tokenizer.json is, but read
// with llama.cpp's merge order (tokenizer/spm.cc), which follows tokenizer.ggml.scores.
#include <algorithm>
#include <nlohmann/json.hpp>
#include <tuple>
#include <unordered_map>

#include "formats/gguf.h"
#include "tokenizer/models.h"
#include "tokenizer/tokenizer.h"

namespace gizllm {
namespace {

using nlohmann::json;

// llama.cpp's token types (llama_token_type).
constexpr int64_t kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5;
constexpr const char* kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space

// The digit rule differs: Qwen2's splits digits one by one, Llama 3's in runs of up to three.
constexpr const char* kQwen2Split =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr const char* kLlama3Split =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

json SplitThenBytes(const char* regex) {
  return {{"type", "Sequence"},
          {"pretokenizers", json::array({{{"type", "Split"},
                                          {"pattern", {{"Regex", regex}}},
                                          {"behavior", "Isolated"},
                                          {"invert", false}},
                                         {{"type", "ByteLevel"},
                                          {"add_prefix_space", false},
                                          {"trim_offsets", false},
                                          {"use_regex", false}}})}};
}

// The special token `key` names (tokenizer.ggml.bos_token_id, ...), or -1.
Expected<int64_t> SpecialId(const GgufFile& f, const std::string& key, size_t tokens) {
  if (!f.Find(key)) return int64_t{-1};
  GZ_ASSIGN_OR_RETURN(uint64_t id, f.GetUint(key));
  if (id >= tokens) {
    return InvalidArgument(f.path() + ": metadata \"" + key + "\" = " + std::to_string(id) +
                           " is not a token id (the vocabulary has " + std::to_string(tokens) +
                           ")");
  }
  return static_cast<int64_t>(id);
}

// What both tokenizer.ggml.model kinds share: the vocabulary, token types and special ids.
struct GgufVocab {
  std::vector<std::string> tokens;
  std::vector<int64_t> types;  // [tokens.size()] llama_token_type
  int64_t bos = -1, eos = -1, unk = -1;
  bool add_bos = false, add_eos = false;
};

Expected<GgufVocab> ReadVocab(const GgufFile& f) {
  const std::string& path = f.path();
  GgufVocab v;
  GZ_ASSIGN_OR_RETURN(v.tokens, f.GetStrings("tokenizer.ggml.tokens"));
  v.types.assign(v.tokens.size(), kNormal);
  if (f.Find("tokenizer.ggml.token_type")) {
    GZ_ASSIGN_OR_RETURN(v.types, f.GetInts("tokenizer.ggml.token_type"));
    if (v.types.size() != v.tokens.size()) {
      return InvalidArgument(path + ": tokenizer.ggml.token_type has " +
                             std::to_string(v.types.size()) + " entries for " +
                             std::to_string(v.tokens.size()) + " tokens");
    }
  }
  GZ_ASSIGN_OR_RETURN(v.bos, SpecialId(f, "tokenizer.ggml.bos_token_id", v.tokens.size()));
  GZ_ASSIGN_OR_RETURN(v.eos, SpecialId(f, "tokenizer.ggml.eos_token_id", v.tokens.size()));
  GZ_ASSIGN_OR_RETURN(v.unk, SpecialId(f, "tokenizer.ggml.unknown_token_id", v.tokens.size()));
  return v;
}

// BOS and EOS where the file says they are added (`fallback` where it does not say).
Status ReadAddSpecial(const GgufFile& f, bool fallback, GgufVocab* v) {
  v->add_bos = fallback;
  v->add_eos = false;
  if (f.Find("tokenizer.ggml.add_bos_token")) {
    GZ_ASSIGN_OR_RETURN(v->add_bos, f.GetBool("tokenizer.ggml.add_bos_token"));
  }
  if (f.Find("tokenizer.ggml.add_eos_token")) {
    GZ_ASSIGN_OR_RETURN(v->add_eos, f.GetBool("tokenizer.ggml.add_eos_token"));
  }
  v->add_bos = v->add_bos && v->bos >= 0;
  v->add_eos = v->add_eos && v->eos >= 0;
  return Status::Ok();
}

// Control and user-defined tokens are the added tokens (matched before the pre-tokenizer;
// user-defined ones are not special), and the unknown token where `unknown` says; unused ids (the
// converter's [PADn]) are in neither them nor the vocab.
json AddedTokens(const GgufVocab& v, bool unknown) {
  json added = json::array();
  for (size_t id = 0; id < v.tokens.size(); ++id) {
    const int64_t type = v.types[id];
    if (type != kControl && type != kUserDefined && !(unknown && type == kUnknown)) continue;
    added.push_back({{"id", id},
                     {"content", v.tokens[id]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", type != kUserDefined}});
  }
  return added;
}

json PostProcessor(const GgufVocab& v) {
  if (!v.add_bos && !v.add_eos) return nullptr;
  json single = json::array(), pair = json::array(), special = json::object();
  auto token = [&](int64_t id) {
    special[v.tokens[id]] = {{"id", v.tokens[id]}, {"ids", {id}}, {"tokens", {v.tokens[id]}}};
    return json{{"SpecialToken", {{"id", v.tokens[id]}, {"type_id", 0}}}};
  };
  for (const char* seq : {"A", "B"}) {
    json& out = seq[0] == 'A' ? single : pair;
    if (seq[0] == 'B') pair = single;
    if (v.add_bos) out.push_back(token(v.bos));
    out.push_back({{"Sequence", {{"id", seq}, {"type_id", 0}}}});
    if (v.add_eos) out.push_back(token(v.eos));
  }
  return {{"type", "TemplateProcessing"},
          {"single", std::move(single)},
          {"pair", std::move(pair)},
          {"special_tokens", std::move(special)}};
}

Expected<json> Gpt2Json(const GgufFile& f) {
  const std::string& path = f.path();
  std::string pre = "default";
  if (f.Find("tokenizer.ggml.pre")) {
    GZ_ASSIGN_OR_RETURN(pre, f.GetString("tokenizer.ggml.pre"));
  }
  json t = json::object();
  t["version"] = "1.0";
  t["normalizer"] = nullptr;
  bool ignore_merges = false;
  if (pre == "qwen2") {
    t["normalizer"] = {{"type", "NFC"}};
    t["pre_tokenizer"] = SplitThenBytes(kQwen2Split);
  } else if (pre == "llama-bpe" || pre == "llama3") {
    t["pre_tokenizer"] = SplitThenBytes(kLlama3Split);
    ignore_merges = true;
  } else if (pre == "default" || pre == "gpt-2" || pre == "gpt2") {
    t["pre_tokenizer"] = {{"type", "ByteLevel"},
                          {"add_prefix_space", false},
                          {"trim_offsets", false},
                          {"use_regex", true}};
  } else {
    return Unimplemented(path + ": tokenizer.ggml.pre \"" + pre +
                         "\" is not supported yet (expected qwen2, llama-bpe or default)");
  }
  t["decoder"] = {{"type", "ByteLevel"},
                  {"add_prefix_space", true},
                  {"trim_offsets", true},
                  {"use_regex", true}};

  GZ_ASSIGN_OR_RETURN(GgufVocab v, ReadVocab(f));
  GZ_RETURN_IF_ERROR(ReadAddSpecial(f, /*fallback=*/false, &v));
  std::vector<std::string> merges;
  if (f.Find("tokenizer.ggml.merges")) {
    GZ_ASSIGN_OR_RETURN(merges, f.GetStrings("tokenizer.ggml.merges"));
  }
  json vocab = json::object();
  for (size_t id = 0; id < v.tokens.size(); ++id) {
    const int64_t type = v.types[id];
    if (type == kUnused || type == kControl || type == kUserDefined) continue;
    vocab[v.tokens[id]] = id;
  }
  t["added_tokens"] = AddedTokens(v, /*unknown=*/false);
  t["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", ignore_merges},
                {"vocab", std::move(vocab)},
                {"merges", merges}};
  t["post_processor"] = PostProcessor(v);
  return t;
}

// A llama (SentencePiece-style) vocabulary as Hugging Face writes Llama 2's tokenizer.json: a
// space prefix (where tokenizer.ggml.add_space_prefix says, by default) and spaces as U+2581,
// no pre-tokenizer, BPE with byte fallback; decoding undoes both. `merges`: whether to write the
// merges Hugging Face's converter derives from the scores (each split of a token into two
// tokens, by the merged token's score, then by the two ids); FromGguf reads the scores instead.
// llama.cpp reads no pre-tokenizer for these vocabularies; tokenizer.ggml.pre is ignored.
json LlamaJson(const GgufVocab& v, const std::vector<float>& scores, bool add_space_prefix,
               bool merges) {
  json t = json::object();
  t["version"] = "1.0";
  json replace = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kSpace}};
  if (add_space_prefix) {
    t["normalizer"] = {{"type", "Sequence"},
                       {"normalizers", {{{"type", "Prepend"}, {"prepend", kSpace}}, replace}}};
  } else {
    t["normalizer"] = replace;
  }
  t["pre_tokenizer"] = nullptr;
  json decoders = {{{"type", "Replace"}, {"pattern", {{"String", kSpace}}}, {"content", " "}},
                   {{"type", "ByteFallback"}},
                   {{"type", "Fuse"}}};
  if (add_space_prefix) {
    decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  }
  t["decoder"] = {{"type", "Sequence"}, {"decoders", std::move(decoders)}};
  t["added_tokens"] = AddedTokens(v, /*unknown=*/true);
  json vocab = json::object();
  std::unordered_map<std::string, int64_t> ids;
  for (size_t id = 0; id < v.tokens.size(); ++id) {
    if (v.types[id] == kUnused) continue;
    vocab[v.tokens[id]] = id;
    ids[v.tokens[id]] = static_cast<int64_t>(id);
  }
  json merge_list = json::array();
  if (merges) {
    std::vector<std::tuple<float, int64_t, int64_t>> found;  // (score, left id, right id)
    for (size_t id = 0; id < v.tokens.size(); ++id) {
      const std::string& text = v.tokens[id];
      if (v.types[id] != kNormal && v.types[id] != kUserDefined) continue;
      for (size_t cut = 1; cut < text.size(); ++cut) {
        auto l = ids.find(text.substr(0, cut));
        auto r = ids.find(text.substr(cut));
        if (l != ids.end() && r != ids.end()) found.emplace_back(scores[id], l->second, r->second);
      }
    }
    std::stable_sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
      if (std::get<0>(a) != std::get<0>(b)) return std::get<0>(a) > std::get<0>(b);
      return std::make_pair(std::get<1>(a), std::get<2>(a)) <
             std::make_pair(std::get<1>(b), std::get<2>(b));
    });
    for (const auto& [score, l, r] : found) {
      merge_list.push_back(json::array({v.tokens[l], v.tokens[r]}));
    }
  }
  t["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", v.unk >= 0 ? json(v.tokens[v.unk]) : json(nullptr)},
                {"fuse_unk", true},
                {"byte_fallback", true},
                {"vocab", std::move(vocab)},
                {"merges", std::move(merge_list)}};
  t["post_processor"] = PostProcessor(v);
  return t;
}

struct LlamaVocab {
  GgufVocab vocab;
  std::vector<float> scores;  // [tokens]
  bool add_space_prefix = true;
};

Expected<LlamaVocab> ReadLlamaVocab(const GgufFile& f) {
  LlamaVocab l;
  GZ_ASSIGN_OR_RETURN(l.vocab, ReadVocab(f));
  // llama.cpp adds BOS to SentencePiece vocabularies unless the file says otherwise.
  GZ_RETURN_IF_ERROR(ReadAddSpecial(f, /*fallback=*/true, &l.vocab));
  l.scores.assign(l.vocab.tokens.size(), 0.0f);
  if (f.Find("tokenizer.ggml.scores")) {
    GZ_ASSIGN_OR_RETURN(std::vector<double> scores, f.GetFloats("tokenizer.ggml.scores"));
    if (scores.size() != l.vocab.tokens.size()) {
      return InvalidArgument(f.path() + ": tokenizer.ggml.scores has " +
                             std::to_string(scores.size()) + " entries for " +
                             std::to_string(l.vocab.tokens.size()) + " tokens");
    }
    std::copy(scores.begin(), scores.end(), l.scores.begin());
  }
  if (f.Find("tokenizer.ggml.add_space_prefix")) {
    GZ_ASSIGN_OR_RETURN(l.add_space_prefix, f.GetBool("tokenizer.ggml.add_space_prefix"));
  }
  return l;
}

Expected<std::string> ModelKind(const GgufFile& f) {
  GZ_ASSIGN_OR_RETURN(std::string model, f.GetString("tokenizer.ggml.model"));
  if (model != "gpt2" && model != "llama") {
    return Unimplemented(f.path() + ": tokenizer.ggml.model \"" + model +
                         "\" is not supported yet (expected gpt2: byte-level BPE, or llama: "
                         "SentencePiece-style BPE)");
  }
  return model;
}

}  // namespace

Expected<Tokenizer> Tokenizer::FromGguf(const GgufFile& f) {
  GZ_ASSIGN_OR_RETURN(std::string kind, ModelKind(f));
  const std::string name = f.path() + ": tokenizer.ggml";
  if (kind == "gpt2") {
    GZ_ASSIGN_OR_RETURN(json t, Gpt2Json(f));
    return FromJson(t.dump(), name);
  }
  GZ_ASSIGN_OR_RETURN(LlamaVocab l, ReadLlamaVocab(f));
  const json t = LlamaJson(l.vocab, l.scores, l.add_space_prefix, /*merges=*/false);
  std::vector<bool> known(l.vocab.tokens.size());
  for (size_t id = 0; id < known.size(); ++id) known[id] = l.vocab.types[id] != kUnused;
  return FromJsonWithModel(
      t.dump(), name,
      tok::MakeSpmModel(l.vocab.tokens, std::move(l.scores), std::move(known), l.vocab.unk));
}

Expected<std::string> Tokenizer::JsonFromGguf(const GgufFile& f) {
  GZ_ASSIGN_OR_RETURN(std::string kind, ModelKind(f));
  if (kind == "gpt2") {
    GZ_ASSIGN_OR_RETURN(json t, Gpt2Json(f));
    return t.dump();
  }
  GZ_ASSIGN_OR_RETURN(LlamaVocab l, ReadLlamaVocab(f));
  return LlamaJson(l.vocab, l.scores, l.add_space_prefix, /*merges=*/true).dump();
}

}  // namespace gizllm
