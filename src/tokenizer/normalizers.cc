// Normalizers: Unicode forms, Replace, Prepend, Strip, Lowercase, StripAccents, Nmt,
// BertNormalizer, Precompiled (SentencePiece's character map), Sequence.
#include <utility>

#include "tokenizer/components.h"
#include "tokenizer/precompiled.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace gizllm::tok {
namespace {

class FormNormalizer : public Normalizer {
 public:
  explicit FormNormalizer(std::string (*form)(std::string_view)) : form_(form) {}
  void Normalize(std::string* text) const override { *text = form_(*text); }

 private:
  std::string (*form_)(std::string_view);
};

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts)
      : parts_(std::move(parts)) {}
  void Normalize(std::string* text) const override {
    for (const auto& p : parts_) p->Normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

// Replaces every non-overlapping occurrence of a literal or of a regex match.
class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(std::string literal, std::optional<Regex> regex, std::string content)
      : literal_(std::move(literal)), regex_(std::move(regex)), content_(std::move(content)) {}
  void Normalize(std::string* text) const override {
    std::string out;
    if (regex_) {
      std::vector<std::pair<size_t, size_t>> matches;
      regex_->FindAll(*text, &matches);
      if (matches.empty()) return;
      size_t prev = 0;
      for (auto [s, e] : matches) {
        out.append(*text, prev, s - prev);
        out += content_;
        prev = e;
      }
      out.append(*text, prev);
    } else {
      if (literal_.empty()) return;
      size_t prev = 0, pos;
      while ((pos = text->find(literal_, prev)) != std::string::npos) {
        out.append(*text, prev, pos - prev);
        out += content_;
        prev = pos + literal_.size();
      }
      if (prev == 0) return;
      out.append(*text, prev);
    }
    *text = std::move(out);
  }

 private:
  std::string literal_;
  std::optional<Regex> regex_;
  std::string content_;
};

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void Normalize(std::string* text) const override {
    if (!text->empty()) text->insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void Normalize(std::string* text) const override {
    size_t end = text->size();
    if (right_) {
      while (end > 0) {
        size_t i = end - 1;
        while (i > 0 && (static_cast<unsigned char>((*text)[i]) & 0xC0) == 0x80) --i;
        size_t k = i;
        if (!IsWhitespace(NextCodePoint(*text, &k))) break;
        end = i;
      }
    }
    size_t start = 0;
    if (left_) {
      while (start < end) {
        size_t k = start;
        if (!IsWhitespace(NextCodePoint(*text, &k))) break;
        start = k;
      }
    }
    *text = text->substr(start, end - start);
  }

 private:
  bool left_, right_;
};

// StripAccents removes every mark (M*); BertNormalizer only nonspacing ones (Mn), as Hugging Face.
std::string RemoveMarks(std::string_view text, bool nonspacing_only) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    size_t start = i;
    char32_t cp = NextCodePoint(text, &i);
    if (cp >= 0x300 && (nonspacing_only ? IsMark(cp) : IsCombiningMark(cp))) continue;
    out.append(text.substr(start, i - start));
  }
  return out;
}

class StripAccentsNormalizer : public Normalizer {
 public:
  void Normalize(std::string* text) const override {
    *text = RemoveMarks(*text, /*nonspacing_only=*/false);
  }
};

class LowercaseNormalizer : public Normalizer {
 public:
  void Normalize(std::string* text) const override { *text = Lowercase(*text); }
};

// Nmt: drops ASCII and C1 control characters, turns other spacing code points into spaces.
class NmtNormalizer : public Normalizer {
 public:
  void Normalize(std::string* text) const override {
    std::string out;
    out.reserve(text->size());
    size_t i = 0;
    while (i < text->size()) {
      size_t start = i;
      char32_t c = NextCodePoint(*text, &i);
      if ((c >= 0x1 && c <= 0x8) || c == 0xB || (c >= 0xE && c <= 0x1F) || c == 0x7F || c == 0x8F ||
          c == 0x9F) {
        continue;
      }
      if (c == 0x9 || c == 0xA || c == 0xC || c == 0xD || c == 0x1680 ||
          (c >= 0x200B && c <= 0x200F) || c == 0x2028 || c == 0x2029 || c == 0x2581 ||
          c == 0xFEFF || c == 0xFFFD) {
        out += ' ';
        continue;
      }
      out.append(*text, start, i - start);
    }
    *text = std::move(out);
  }
};

bool IsChineseChar(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
         (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

class BertNormalizer : public Normalizer {
 public:
  BertNormalizer(bool clean_text, bool chinese, bool strip_accents, bool lowercase)
      : clean_text_(clean_text),
        chinese_(chinese),
        strip_accents_(strip_accents),
        lowercase_(lowercase) {}
  void Normalize(std::string* text) const override {
    if (clean_text_ || chinese_) {
      std::string out;
      out.reserve(text->size());
      size_t i = 0;
      while (i < text->size()) {
        size_t start = i;
        char32_t cp = NextCodePoint(*text, &i);
        if (clean_text_) {
          // Controls go first (all but \t \n \r: \v, \f and U+0085 too), then whitespace
          // becomes a space.
          bool kept = cp == '\t' || cp == '\n' || cp == '\r';
          if (!kept && (cp == 0 || cp == 0xFFFD || IsControlOrFormat(cp))) continue;
          if (kept || IsWhitespace(cp)) {
            out += ' ';
            continue;
          }
        }
        if (chinese_ && IsChineseChar(cp)) {
          out += ' ';
          out.append(*text, start, i - start);
          out += ' ';
          continue;
        }
        out.append(*text, start, i - start);
      }
      *text = std::move(out);
    }
    if (strip_accents_) *text = RemoveMarks(Nfd(*text), /*nonspacing_only=*/true);
    if (lowercase_) *text = Lowercase(*text);
  }

 private:
  bool clean_text_, chinese_, strip_accents_, lowercase_;
};

// A Replace/Split pattern: {"String": "..."} or {"Regex": "..."}.
Status ReadPattern(const Json& j, const std::string& where, std::string* literal,
                   std::optional<Regex>* regex) {
  auto it = j.find("pattern");
  if (it == j.end() || !it->is_object()) {
    return InvalidArgument("field '" + where + ".pattern': expected {\"String\": ...} or " +
                           "{\"Regex\": ...}");
  }
  if (auto s = it->find("String"); s != it->end() && s->is_string()) {
    *literal = s->get<std::string>();
    return Status::Ok();
  }
  if (auto r = it->find("Regex"); r != it->end() && r->is_string()) {
    auto compiled = Regex::Compile(r->get<std::string>());
    if (!compiled.ok()) return compiled.status().Annotate("field '" + where + ".pattern'");
    *regex = std::move(compiled).value();
    return Status::Ok();
  }
  return InvalidArgument("field '" + where + ".pattern': expected {\"String\": ...} or " +
                         "{\"Regex\": ...}");
}

}  // namespace

Status ReadSplitPattern(const Json& j, const std::string& where, std::string* literal,
                        std::optional<Regex>* regex) {
  return ReadPattern(j, where, literal, regex);
}

Expected<std::unique_ptr<Normalizer>> MakeNormalizer(const Json& j, const std::string& where,
                                                     int depth) {
  if (j.is_null()) return std::unique_ptr<Normalizer>();
  std::string type = TypeOf(j);
  if (type == "NFC") return std::unique_ptr<Normalizer>(new FormNormalizer(Nfc));
  if (type == "NFD") return std::unique_ptr<Normalizer>(new FormNormalizer(Nfd));
  if (type == "NFKC") return std::unique_ptr<Normalizer>(new FormNormalizer(Nfkc));
  if (type == "NFKD") return std::unique_ptr<Normalizer>(new FormNormalizer(Nfkd));
  if (type == "Lowercase") return std::unique_ptr<Normalizer>(new LowercaseNormalizer());
  if (type == "Nmt") return std::unique_ptr<Normalizer>(new NmtNormalizer());
  if (type == "StripAccents") return std::unique_ptr<Normalizer>(new StripAccentsNormalizer());
  if (type == "Sequence") {
    GZ_RETURN_IF_ERROR(CheckSequenceDepth(depth, where));
    auto it = j.find("normalizers");
    if (it == j.end() || !it->is_array()) {
      return InvalidArgument("field '" + where + ".normalizers': expected an array");
    }
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (size_t i = 0; i < it->size(); ++i) {
      GZ_ASSIGN_OR_RETURN(
          auto part,
          MakeNormalizer((*it)[i], where + ".normalizers[" + std::to_string(i) + "]", depth + 1));
      if (part) parts.push_back(std::move(part));
    }
    return std::unique_ptr<Normalizer>(new SequenceNormalizer(std::move(parts)));
  }
  if (type == "Replace") {
    std::string literal;
    std::optional<Regex> regex;
    GZ_RETURN_IF_ERROR(ReadPattern(j, where, &literal, &regex));
    GZ_ASSIGN_OR_RETURN(std::string content, GetString(j, "content", where));
    return std::unique_ptr<Normalizer>(
        new ReplaceNormalizer(std::move(literal), std::move(regex), std::move(content)));
  }
  if (type == "Prepend") {
    GZ_ASSIGN_OR_RETURN(std::string prefix, GetString(j, "prepend", where));
    return std::unique_ptr<Normalizer>(new PrependNormalizer(std::move(prefix)));
  }
  if (type == "Strip") {
    GZ_ASSIGN_OR_RETURN(bool left, GetBool(j, "strip_left", where, true));
    GZ_ASSIGN_OR_RETURN(bool right, GetBool(j, "strip_right", where, true));
    return std::unique_ptr<Normalizer>(new StripNormalizer(left, right));
  }
  if (type == "BertNormalizer") {
    GZ_ASSIGN_OR_RETURN(bool clean, GetBool(j, "clean_text", where, true));
    GZ_ASSIGN_OR_RETURN(bool chinese, GetBool(j, "handle_chinese_chars", where, true));
    GZ_ASSIGN_OR_RETURN(bool lowercase, GetBool(j, "lowercase", where, true));
    // strip_accents: null means "as lowercase".
    GZ_ASSIGN_OR_RETURN(bool strip, GetBool(j, "strip_accents", where, lowercase));
    return std::unique_ptr<Normalizer>(new BertNormalizer(clean, chinese, strip, lowercase));
  }
  if (type == "Precompiled") {
    GZ_ASSIGN_OR_RETURN(auto p, MakePrecompiledNormalizer(j, where));
    return std::unique_ptr<Normalizer>(std::move(p));
  }
  if (type.empty()) return InvalidArgument("field '" + where + ".type': expected a string");
  return Unimplemented("field '" + where + ".type': unknown normalizer type '" + type + "'");
}

}  // namespace gizllm::tok
