// A Tokenizer from a GGUF file's tokenizer.ggml.* metadata: the Hugging Face tokenizer.json the
// converter read, written back from the vocabulary, token types, merges and special ids, with the
// pre-tokenizer that tokenizer.ggml.pre names; then read as any tokenizer.json.
#include <nlohmann/json.hpp>

#include "formats/gguf.h"
#include "tokenizer/tokenizer.h"

namespace gizllm {
namespace {

using nlohmann::json;

// llama.cpp's token types (llama_token_type).
constexpr int64_t kNormal = 1, kControl = 3, kUserDefined = 4, kUnused = 5;

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

}  // namespace

Expected<Tokenizer> Tokenizer::FromGguf(const GgufFile& f) {
  GZ_ASSIGN_OR_RETURN(std::string text, JsonFromGguf(f));
  return FromJson(text, f.path() + ": tokenizer.ggml");
}

Expected<std::string> Tokenizer::JsonFromGguf(const GgufFile& f) {
  const std::string& path = f.path();
  GZ_ASSIGN_OR_RETURN(std::string model, f.GetString("tokenizer.ggml.model"));
  if (model != "gpt2") {
    return Unimplemented(path + ": tokenizer.ggml.model \"" + model +
                         "\" is not supported yet (expected gpt2: byte-level BPE)");
  }
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

  GZ_ASSIGN_OR_RETURN(std::vector<std::string> tokens, f.GetStrings("tokenizer.ggml.tokens"));
  std::vector<int64_t> types(tokens.size(), kNormal);
  if (f.Find("tokenizer.ggml.token_type")) {
    GZ_ASSIGN_OR_RETURN(types, f.GetInts("tokenizer.ggml.token_type"));
    if (types.size() != tokens.size()) {
      return InvalidArgument(path + ": tokenizer.ggml.token_type has " +
                             std::to_string(types.size()) + " entries for " +
                             std::to_string(tokens.size()) + " tokens");
    }
  }
  std::vector<std::string> merges;
  if (f.Find("tokenizer.ggml.merges")) {
    GZ_ASSIGN_OR_RETURN(merges, f.GetStrings("tokenizer.ggml.merges"));
  }
  // Control and user-defined tokens are the added tokens (matched before the pre-tokenizer);
  // unused ids (the converter's [PADn]) are in neither.
  json vocab = json::object();
  json added = json::array();
  for (size_t id = 0; id < tokens.size(); ++id) {
    if (types[id] == kUnused) continue;
    if (types[id] == kControl || types[id] == kUserDefined) {
      added.push_back({{"id", id},
                       {"content", tokens[id]},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", types[id] == kControl}});
    } else {
      vocab[tokens[id]] = id;
    }
  }
  t["added_tokens"] = std::move(added);
  t["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", ignore_merges},
                {"vocab", std::move(vocab)},
                {"merges", merges}};

  // BOS and EOS where the file says they are added.
  GZ_ASSIGN_OR_RETURN(int64_t bos, SpecialId(f, "tokenizer.ggml.bos_token_id", tokens.size()));
  GZ_ASSIGN_OR_RETURN(int64_t eos, SpecialId(f, "tokenizer.ggml.eos_token_id", tokens.size()));
  bool add_bos = false, add_eos = false;
  if (f.Find("tokenizer.ggml.add_bos_token")) {
    GZ_ASSIGN_OR_RETURN(add_bos, f.GetBool("tokenizer.ggml.add_bos_token"));
  }
  if (f.Find("tokenizer.ggml.add_eos_token")) {
    GZ_ASSIGN_OR_RETURN(add_eos, f.GetBool("tokenizer.ggml.add_eos_token"));
  }
  add_bos = add_bos && bos >= 0;
  add_eos = add_eos && eos >= 0;
  t["post_processor"] = nullptr;
  if (add_bos || add_eos) {
    json single = json::array(), pair = json::array(), special = json::object();
    auto token = [&](int64_t id) {
      special[tokens[id]] = {{"id", tokens[id]}, {"ids", {id}}, {"tokens", {tokens[id]}}};
      return json{{"SpecialToken", {{"id", tokens[id]}, {"type_id", 0}}}};
    };
    for (const char* seq : {"A", "B"}) {
      json& out = seq[0] == 'A' ? single : pair;
      if (seq[0] == 'B') pair = single;
      if (add_bos) out.push_back(token(bos));
      out.push_back({{"Sequence", {{"id", seq}, {"type_id", 0}}}});
      if (add_eos) out.push_back(token(eos));
    }
    t["post_processor"] = {{"type", "TemplateProcessing"},
                           {"single", std::move(single)},
                           {"pair", std::move(pair)},
                           {"special_tokens", std::move(special)}};
  }
  return t.dump();
}

}  // namespace gizllm
