// Decoders: ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, WordPiece, BPEDecoder,
// Sequence. Each rewrites the list of token strings as Hugging Face's decode_chain does.
#include <utility>

#include "tokenizer/byte_level.h"
#include "tokenizer/components.h"
#include "tokenizer/unicode.h"

namespace gizllm::tok {
namespace {

void ReplaceAll(std::string* s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  size_t pos = s->find(from);
  if (pos == std::string::npos) return;
  std::string out;
  size_t prev = 0;
  while (pos != std::string::npos) {
    out.append(*s, prev, pos - prev);
    out += to;
    prev = pos + from.size();
    pos = s->find(from, prev);
  }
  out.append(*s, prev);
  *s = std::move(out);
}

class ByteLevelDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    DecodeBytes(tokens);
    (*tokens)[0] = Utf8Lossy((*tokens)[0]);
  }
  void DecodeBytes(std::vector<std::string>* tokens) const override {
    const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::Get();
    std::string bytes;
    for (const std::string& t : *tokens) {
      // A token with a character outside the alphabet (an added token) keeps its own bytes.
      size_t mark = bytes.size();
      size_t i = 0;
      bool all = true;
      while (i < t.size()) {
        int b = alphabet.Byte(NextCodePoint(t, &i));
        if (b < 0) {
          all = false;
          break;
        }
        bytes.push_back(static_cast<char>(b));
      }
      if (!all) {
        bytes.resize(mark);
        bytes += t;
      }
    }
    tokens->assign(1, std::move(bytes));
  }
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool prepend)
      : replacement_(std::move(replacement)), prepend_(prepend) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (size_t i = 0; i < tokens->size(); ++i) {
      ReplaceAll(&(*tokens)[i], replacement_, i == 0 && prepend_ ? "" : " ");
    }
  }

 private:
  std::string replacement_;
  bool prepend_;
};

// "<0xNN>" -> the byte NN, or -1.
int FallbackByte(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  int hi = hex(t[3]), lo = hex(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

class ByteFallbackDecoder : public Decoder {
 public:
  void DecodeBytes(std::vector<std::string>* tokens) const override {
    for (std::string& t : *tokens) {
      const int b = FallbackByte(t);
      if (b >= 0) t = std::string(1, static_cast<char>(b));
    }
  }
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens->size());
    std::string bytes;
    auto flush = [&] {
      if (bytes.empty()) return;
      if (FindInvalidUtf8(bytes) == std::string::npos) {
        out.push_back(bytes);
      } else {
        for (size_t k = 0; k < bytes.size(); ++k) out.push_back("\xEF\xBF\xBD");
      }
      bytes.clear();
    };
    for (std::string& t : *tokens) {
      int b = FallbackByte(t);
      if (b >= 0) {
        bytes.push_back(static_cast<char>(b));
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    *tokens = std::move(out);
  }
};

class FuseDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::string all;
    for (const std::string& t : *tokens) all += t;
    tokens->assign(1, std::move(all));
  }
};

class StripDecoder : public Decoder {
 public:
  StripDecoder(char32_t content, size_t start, size_t stop)
      : content_(content), start_(start), stop_(stop) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (std::string& t : *tokens) {
      std::vector<std::pair<size_t, char32_t>> chars;  // byte offset, code point
      size_t i = 0;
      while (i < t.size()) {
        size_t at = i;
        chars.emplace_back(at, NextCodePoint(t, &i));
      }
      size_t start_cut = 0;
      for (size_t k = 0; k < start_ && k < chars.size(); ++k) {
        if (chars[k].second != content_) break;
        start_cut = k + 1;
      }
      size_t stop_cut = chars.size();
      for (size_t k = 0; k < stop_ && k < chars.size(); ++k) {
        size_t index = chars.size() - k - 1;
        if (chars[index].second != content_) break;
        stop_cut = index;
      }
      if (stop_cut < start_cut) stop_cut = start_cut;
      size_t b0 = start_cut < chars.size() ? chars[start_cut].first : t.size();
      size_t b1 = stop_cut < chars.size() ? chars[stop_cut].first : t.size();
      t = t.substr(b0, b1 - b0);
    }
  }

 private:
  char32_t content_;
  size_t start_, stop_;
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(std::string literal, std::optional<Regex> regex, std::string content)
      : literal_(std::move(literal)), regex_(std::move(regex)), content_(std::move(content)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (std::string& t : *tokens) {
      if (!regex_) {
        ReplaceAll(&t, literal_, content_);
        continue;
      }
      std::vector<std::pair<size_t, size_t>> matches;
      regex_->FindAll(t, &matches);
      if (matches.empty()) continue;
      std::string out;
      size_t prev = 0;
      for (auto [s, e] : matches) {
        out.append(t, prev, s - prev);
        out += content_;
        prev = e;
      }
      out.append(t, prev);
      t = std::move(out);
    }
  }

 private:
  std::string literal_;
  std::optional<Regex> regex_;
  std::string content_;
};

void Cleanup(std::string* s) {
  ReplaceAll(s, " .", ".");
  ReplaceAll(s, " ?", "?");
  ReplaceAll(s, " !", "!");
  ReplaceAll(s, " ,", ",");
  ReplaceAll(s, " ' ", "'");
  ReplaceAll(s, " n't", "n't");
  ReplaceAll(s, " 'm", "'m");
  ReplaceAll(s, " do not", " don't");
  ReplaceAll(s, " 's", "'s");
  ReplaceAll(s, " 've", "'ve");
  ReplaceAll(s, " 're", "'re");
}

class WordPieceDecoder : public Decoder {
 public:
  WordPieceDecoder(std::string prefix, bool cleanup)
      : prefix_(std::move(prefix)), cleanup_(cleanup) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (size_t i = 0; i < tokens->size(); ++i) {
      std::string& t = (*tokens)[i];
      if (i != 0) {
        if (t.compare(0, prefix_.size(), prefix_) == 0) {
          t.erase(0, prefix_.size());
        } else {
          t.insert(0, " ");
        }
      }
      if (cleanup_) Cleanup(&t);
    }
  }

 private:
  std::string prefix_;
  bool cleanup_;
};

class BpeDecoder : public Decoder {
 public:
  explicit BpeDecoder(std::string suffix) : suffix_(std::move(suffix)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (size_t i = 0; i < tokens->size(); ++i) {
      ReplaceAll(&(*tokens)[i], suffix_, i + 1 == tokens->size() ? "" : " ");
    }
  }

 private:
  std::string suffix_;
};

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts)
      : parts_(std::move(parts)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (const auto& p : parts_) p->DecodeChain(tokens);
  }
  void DecodeBytes(std::vector<std::string>* tokens) const override {
    for (const auto& p : parts_) p->DecodeBytes(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

Expected<size_t> GetCount(const Json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_unsigned()) {
    if (it != j.end() && it->is_number_integer() && it->get<int64_t>() >= 0) {
      return static_cast<size_t>(it->get<int64_t>());
    }
    return InvalidArgument("field '" + where + "." + key + "': expected a count");
  }
  return it->get<size_t>();
}

}  // namespace

Expected<std::unique_ptr<Decoder>> MakeDecoder(const Json& j, const std::string& where, int depth) {
  if (j.is_null()) return std::unique_ptr<Decoder>();
  std::string type = TypeOf(j);
  if (type == "ByteLevel") return std::unique_ptr<Decoder>(new ByteLevelDecoder());
  if (type == "ByteFallback") return std::unique_ptr<Decoder>(new ByteFallbackDecoder());
  if (type == "Fuse") return std::unique_ptr<Decoder>(new FuseDecoder());
  if (type == "Sequence") {
    GZ_RETURN_IF_ERROR(CheckSequenceDepth(depth, where));
    auto it = j.find("decoders");
    if (it == j.end() || !it->is_array()) {
      return InvalidArgument("field '" + where + ".decoders': expected an array");
    }
    std::vector<std::unique_ptr<Decoder>> parts;
    for (size_t i = 0; i < it->size(); ++i) {
      GZ_ASSIGN_OR_RETURN(
          auto part,
          MakeDecoder((*it)[i], where + ".decoders[" + std::to_string(i) + "]", depth + 1));
      if (part) parts.push_back(std::move(part));
    }
    return std::unique_ptr<Decoder>(new SequenceDecoder(std::move(parts)));
  }
  if (type == "Metaspace") {
    GZ_ASSIGN_OR_RETURN(std::string replacement, GetString(j, "replacement", where));
    bool prepend = true;
    if (auto it = j.find("prepend_scheme"); it != j.end() && it->is_string()) {
      prepend = it->get<std::string>() != "never";
    } else {
      GZ_ASSIGN_OR_RETURN(prepend, GetBool(j, "add_prefix_space", where, true));
    }
    return std::unique_ptr<Decoder>(new MetaspaceDecoder(std::move(replacement), prepend));
  }
  if (type == "Strip") {
    GZ_ASSIGN_OR_RETURN(std::string content, GetString(j, "content", where));
    GZ_ASSIGN_OR_RETURN(size_t start, GetCount(j, "start", where));
    GZ_ASSIGN_OR_RETURN(size_t stop, GetCount(j, "stop", where));
    if (content.empty()) return InvalidArgument("field '" + where + ".content': expected a char");
    size_t k = 0;
    return std::unique_ptr<Decoder>(new StripDecoder(NextCodePoint(content, &k), start, stop));
  }
  if (type == "Replace") {
    std::string literal;
    std::optional<Regex> regex;
    GZ_RETURN_IF_ERROR(ReadSplitPattern(j, where, &literal, &regex));
    GZ_ASSIGN_OR_RETURN(std::string content, GetString(j, "content", where));
    return std::unique_ptr<Decoder>(
        new ReplaceDecoder(std::move(literal), std::move(regex), std::move(content)));
  }
  if (type == "WordPiece") {
    std::string prefix = "##";
    if (j.contains("prefix")) {
      GZ_ASSIGN_OR_RETURN(prefix, GetString(j, "prefix", where));
    }
    GZ_ASSIGN_OR_RETURN(bool cleanup, GetBool(j, "cleanup", where, true));
    return std::unique_ptr<Decoder>(new WordPieceDecoder(std::move(prefix), cleanup));
  }
  if (type == "BPEDecoder") {
    std::string suffix = "</w>";
    if (j.contains("suffix")) {
      GZ_ASSIGN_OR_RETURN(suffix, GetString(j, "suffix", where));
    }
    return std::unique_ptr<Decoder>(new BpeDecoder(std::move(suffix)));
  }
  if (type.empty()) return InvalidArgument("field '" + where + ".type': expected a string");
  return Unimplemented("field '" + where + ".type': unknown decoder type '" + type + "'");
}

}  // namespace gizllm::tok
