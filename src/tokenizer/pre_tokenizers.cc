// Pre-tokenizers: Split, ByteLevel, Metaspace, Whitespace, WhitespaceSplit, Punctuation, Digits,
// BertPreTokenizer, CharDelimiterSplit, Sequence. Each splits the pieces the model has not yet read
// the way Hugging Face tokenizers does (same behaviors, same empty-piece rules).
#include <utility>

#include "tokenizer/byte_level.h"
#include "tokenizer/components.h"
#include "tokenizer/unicode.h"

namespace gizllm::tok {
namespace {

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct Span {
  size_t start, end;
  bool match;
};

// Turns the spans that cover `piece` into new pieces per `behavior`; empty pieces vanish.
void ApplyBehavior(const Piece& piece, const std::vector<Span>& spans, Behavior behavior,
                   std::vector<Piece>* out) {
  auto emit = [&](size_t s, size_t e) {
    if (e <= s) return;
    Piece p;
    p.text.assign(piece.text, s, e - s);
    p.at_start = piece.at_start && s == 0;
    out->push_back(std::move(p));
  };
  switch (behavior) {
    case Behavior::kIsolated:
      for (const Span& s : spans) emit(s.start, s.end);
      return;
    case Behavior::kRemoved:
      for (const Span& s : spans) {
        if (!s.match) emit(s.start, s.end);
      }
      return;
    case Behavior::kContiguous:
    case Behavior::kMergedWithPrevious: {
      std::vector<std::pair<size_t, size_t>> merged;
      bool previous_match = false;
      for (const Span& s : spans) {
        bool join = behavior == Behavior::kContiguous ? s.match == previous_match
                                                      : s.match && !previous_match;
        if (join && !merged.empty()) {
          merged.back().second = s.end;
        } else {
          merged.emplace_back(s.start, s.end);
        }
        previous_match = s.match;
      }
      for (auto [a, b] : merged) emit(a, b);
      return;
    }
    case Behavior::kMergedWithNext: {
      std::vector<std::pair<size_t, size_t>> merged;  // built from the end
      bool previous_match = false;
      for (size_t k = spans.size(); k-- > 0;) {
        const Span& s = spans[k];
        if (s.match && !previous_match && !merged.empty()) {
          merged.back().first = s.start;
        } else {
          merged.emplace_back(s.start, s.end);
        }
        previous_match = s.match;
      }
      for (size_t k = merged.size(); k-- > 0;) emit(merged[k].first, merged[k].second);
      return;
    }
  }
}

// Spans covering [0, size) from sorted, non-overlapping matches.
void CoverWithSpans(const std::vector<std::pair<size_t, size_t>>& matches, size_t size, bool invert,
                    std::vector<Span>* spans) {
  spans->clear();
  size_t prev = 0;
  for (auto [s, e] : matches) {
    if (prev != s) spans->push_back({prev, s, invert});
    spans->push_back({s, e, !invert});
    prev = e;
  }
  if (prev != size) spans->push_back({prev, size, invert});
}

// Applies `split` to every piece the model has not read; keeps recognized added tokens.
template <typename F>
void ForEachPiece(std::vector<Piece>* pieces, F&& split) {
  std::vector<Piece> out;
  out.reserve(pieces->size() * 4);
  for (Piece& p : *pieces) {
    if (p.id >= 0) {
      out.push_back(std::move(p));
    } else {
      split(p, &out);
    }
  }
  *pieces = std::move(out);
}

// One-character matches: every code point for which `is_match` holds.
template <typename F>
void CharSpans(std::string_view text, F&& is_match, std::vector<Span>* spans) {
  spans->clear();
  size_t i = 0, prev = 0;
  while (i < text.size()) {
    size_t start = i;
    char32_t cp = NextCodePoint(text, &i);
    if (is_match(cp)) {
      if (prev != start) spans->push_back({prev, start, false});
      spans->push_back({start, i, true});
      prev = i;
    }
  }
  if (prev != text.size()) spans->push_back({prev, text.size(), false});
}

Expected<Behavior> ReadBehavior(const Json& j, const std::string& where, Behavior fallback) {
  auto it = j.find("behavior");
  if (it == j.end() || it->is_null()) return fallback;
  std::string b = it->is_string() ? it->get<std::string>() : "";
  if (b == "Removed") return Behavior::kRemoved;
  if (b == "Isolated") return Behavior::kIsolated;
  if (b == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::kMergedWithNext;
  if (b == "Contiguous") return Behavior::kContiguous;
  return InvalidArgument("field '" + where + ".behavior': expected Removed, Isolated, " +
                         "MergedWithPrevious, MergedWithNext or Contiguous");
}

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(std::string literal, std::optional<Regex> regex, Behavior behavior, bool invert)
      : literal_(std::move(literal)),
        regex_(std::move(regex)),
        behavior_(behavior),
        invert_(invert) {}

  void PreTokenize(std::vector<Piece>* pieces) const override {
    std::vector<std::pair<size_t, size_t>> matches;
    std::vector<Span> spans;
    ForEachPiece(pieces, [&](const Piece& p, std::vector<Piece>* out) {
      matches.clear();
      if (regex_) {
        regex_->FindAll(p.text, &matches);
      } else if (!literal_.empty()) {
        size_t pos = 0;
        while ((pos = p.text.find(literal_, pos)) != std::string::npos) {
          matches.emplace_back(pos, pos + literal_.size());
          pos += literal_.size();
        }
      }
      CoverWithSpans(matches, p.text.size(), invert_, &spans);
      ApplyBehavior(p, spans, behavior_, out);
    });
  }

 private:
  std::string literal_;
  std::optional<Regex> regex_;
  Behavior behavior_;
  bool invert_;
};

constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::optional<Regex> regex)
      : add_prefix_space_(add_prefix_space), regex_(std::move(regex)) {}

  void PreTokenize(std::vector<Piece>* pieces) const override {
    const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::Get();
    std::vector<std::pair<size_t, size_t>> matches;
    std::vector<Span> spans;
    ForEachPiece(pieces, [&](Piece& p, std::vector<Piece>* out) {
      if (add_prefix_space_ && (p.text.empty() || p.text[0] != ' ')) p.text.insert(0, " ");
      size_t first = out->size();
      if (regex_) {
        matches.clear();
        regex_->FindAll(p.text, &matches);
        CoverWithSpans(matches, p.text.size(), false, &spans);
        ApplyBehavior(p, spans, Behavior::kIsolated, out);
      } else {
        out->push_back(std::move(p));
      }
      for (size_t k = first; k < out->size(); ++k) {
        std::string mapped;
        mapped.reserve((*out)[k].text.size() * 2);
        alphabet.Encode((*out)[k].text, &mapped);
        (*out)[k].text = std::move(mapped);
      }
    });
  }

 private:
  bool add_prefix_space_;
  std::optional<Regex> regex_;
};

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  enum class Prepend { kAlways, kFirst, kNever };
  MetaspacePreTokenizer(std::string replacement, Prepend prepend, bool split)
      : replacement_(std::move(replacement)), prepend_(prepend), split_(split) {}

  void PreTokenize(std::vector<Piece>* pieces) const override {
    std::vector<Span> spans;
    ForEachPiece(pieces, [&](Piece& p, std::vector<Piece>* out) {
      std::string text;
      text.reserve(p.text.size() + 8);
      for (char c : p.text) {
        if (c == ' ') {
          text += replacement_;
        } else {
          text += c;
        }
      }
      bool starts = text.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts &&
          (prepend_ == Prepend::kAlways || (prepend_ == Prepend::kFirst && p.at_start))) {
        text.insert(0, replacement_);
      }
      p.text = std::move(text);
      if (!split_) {
        out->push_back(std::move(p));
        return;
      }
      spans.clear();
      size_t prev = 0, pos = 0;
      while ((pos = p.text.find(replacement_, pos)) != std::string::npos) {
        if (prev != pos) spans.push_back({prev, pos, false});
        spans.push_back({pos, pos + replacement_.size(), true});
        pos += replacement_.size();
        prev = pos;
      }
      if (prev != p.text.size()) spans.push_back({prev, p.text.size(), false});
      ApplyBehavior(p, spans, Behavior::kMergedWithNext, out);
    });
  }

 private:
  std::string replacement_;
  Prepend prepend_;
  bool split_;
};

// \w+|[^\w\s]+: runs of word characters and runs of other non-space characters.
class WhitespacePreTokenizer : public PreTokenizer {
 public:
  void PreTokenize(std::vector<Piece>* pieces) const override {
    ForEachPiece(pieces, [&](const Piece& p, std::vector<Piece>* out) {
      const std::string& t = p.text;
      size_t i = 0;
      int run = 0;  // 0 none, 1 word, 2 other
      size_t run_start = 0;
      auto close = [&](size_t end) {
        if (run != 0) {
          Piece q;
          q.text.assign(t, run_start, end - run_start);
          q.at_start = p.at_start && run_start == 0;
          out->push_back(std::move(q));
        }
      };
      while (i < t.size()) {
        size_t start = i;
        char32_t cp = NextCodePoint(t, &i);
        int kind = IsWordChar(cp) ? 1 : IsWhitespace(cp) ? 0 : 2;
        if (kind != run) {
          close(start);
          run = kind;
          run_start = start;
        }
      }
      close(t.size());
    });
  }
};

template <typename F>
class CharSplitPreTokenizer : public PreTokenizer {
 public:
  CharSplitPreTokenizer(F is_match, Behavior behavior) : is_match_(is_match), behavior_(behavior) {}
  void PreTokenize(std::vector<Piece>* pieces) const override {
    std::vector<Span> spans;
    ForEachPiece(pieces, [&](const Piece& p, std::vector<Piece>* out) {
      CharSpans(p.text, is_match_, &spans);
      ApplyBehavior(p, spans, behavior_, out);
    });
  }

 private:
  F is_match_;
  Behavior behavior_;
};

template <typename F>
std::unique_ptr<PreTokenizer> MakeCharSplit(F f, Behavior b) {
  return std::make_unique<CharSplitPreTokenizer<F>>(f, b);
}

bool IsBertPunctuation(char32_t cp) {
  if (cp < 0x80) {
    return (cp >= 33 && cp <= 47) || (cp >= 58 && cp <= 64) || (cp >= 91 && cp <= 96) ||
           (cp >= 123 && cp <= 126);
  }
  return IsPunctuation(cp);
}

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts)
      : parts_(std::move(parts)) {}
  void PreTokenize(std::vector<Piece>* pieces) const override {
    for (const auto& p : parts_) p->PreTokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

}  // namespace

Expected<std::unique_ptr<PreTokenizer>> MakePreTokenizer(const Json& j, const std::string& where,
                                                         int depth) {
  if (j.is_null()) return std::unique_ptr<PreTokenizer>();
  std::string type = TypeOf(j);
  if (type == "Sequence") {
    GZ_RETURN_IF_ERROR(CheckSequenceDepth(depth, where));
    auto it = j.find("pretokenizers");
    if (it == j.end() || !it->is_array()) {
      return InvalidArgument("field '" + where + ".pretokenizers': expected an array");
    }
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (size_t i = 0; i < it->size(); ++i) {
      GZ_ASSIGN_OR_RETURN(
          auto part, MakePreTokenizer((*it)[i], where + ".pretokenizers[" + std::to_string(i) + "]",
                                      depth + 1));
      if (part) parts.push_back(std::move(part));
    }
    return std::unique_ptr<PreTokenizer>(new SequencePreTokenizer(std::move(parts)));
  }
  if (type == "Split") {
    std::string literal;
    std::optional<Regex> regex;
    GZ_RETURN_IF_ERROR(ReadSplitPattern(j, where, &literal, &regex));
    GZ_ASSIGN_OR_RETURN(Behavior behavior, ReadBehavior(j, where, Behavior::kIsolated));
    GZ_ASSIGN_OR_RETURN(bool invert, GetBool(j, "invert", where, false));
    return std::unique_ptr<PreTokenizer>(
        new SplitPreTokenizer(std::move(literal), std::move(regex), behavior, invert));
  }
  if (type == "ByteLevel") {
    GZ_ASSIGN_OR_RETURN(bool prefix, GetBool(j, "add_prefix_space", where, true));
    GZ_ASSIGN_OR_RETURN(bool use_regex, GetBool(j, "use_regex", where, true));
    std::optional<Regex> regex;
    if (use_regex) {
      GZ_ASSIGN_OR_RETURN(regex, Regex::Compile(kGpt2Pattern));
    }
    return std::unique_ptr<PreTokenizer>(new ByteLevelPreTokenizer(prefix, std::move(regex)));
  }
  if (type == "Metaspace") {
    GZ_ASSIGN_OR_RETURN(std::string replacement, GetString(j, "replacement", where));
    GZ_ASSIGN_OR_RETURN(bool split, GetBool(j, "split", where, true));
    auto prepend = MetaspacePreTokenizer::Prepend::kAlways;
    if (auto it = j.find("prepend_scheme"); it != j.end() && it->is_string()) {
      std::string s = it->get<std::string>();
      if (s == "first") {
        prepend = MetaspacePreTokenizer::Prepend::kFirst;
      } else if (s == "never") {
        prepend = MetaspacePreTokenizer::Prepend::kNever;
      } else if (s != "always") {
        return InvalidArgument("field '" + where +
                               ".prepend_scheme': expected always, first or never");
      }
    } else {
      GZ_ASSIGN_OR_RETURN(bool add, GetBool(j, "add_prefix_space", where, true));
      if (!add) prepend = MetaspacePreTokenizer::Prepend::kNever;
    }
    return std::unique_ptr<PreTokenizer>(
        new MetaspacePreTokenizer(std::move(replacement), prepend, split));
  }
  if (type == "Whitespace") return std::unique_ptr<PreTokenizer>(new WhitespacePreTokenizer());
  if (type == "WhitespaceSplit") {
    return MakeCharSplit([](char32_t c) { return IsWhitespace(c); }, Behavior::kRemoved);
  }
  if (type == "BertPreTokenizer") {
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    parts.push_back(MakeCharSplit([](char32_t c) { return IsWhitespace(c); }, Behavior::kRemoved));
    parts.push_back(MakeCharSplit(IsBertPunctuation, Behavior::kIsolated));
    return std::unique_ptr<PreTokenizer>(new SequencePreTokenizer(std::move(parts)));
  }
  if (type == "Punctuation") {
    GZ_ASSIGN_OR_RETURN(Behavior behavior, ReadBehavior(j, where, Behavior::kIsolated));
    return MakeCharSplit(IsBertPunctuation, behavior);
  }
  if (type == "Digits") {
    GZ_ASSIGN_OR_RETURN(bool individual, GetBool(j, "individual_digits", where, false));
    return MakeCharSplit([](char32_t c) { return IsNumeric(c); },
                         individual ? Behavior::kIsolated : Behavior::kContiguous);
  }
  if (type == "CharDelimiterSplit") {
    GZ_ASSIGN_OR_RETURN(std::string d, GetString(j, "delimiter", where));
    size_t k = 0;
    if (d.empty()) return InvalidArgument("field '" + where + ".delimiter': expected a character");
    char32_t delimiter = NextCodePoint(d, &k);
    return MakeCharSplit([delimiter](char32_t c) { return c == delimiter; }, Behavior::kRemoved);
  }
  if (type.empty()) return InvalidArgument("field '" + where + ".type': expected a string");
  return Unimplemented("field '" + where + ".type': unknown pre-tokenizer type '" + type + "'");
}

}  // namespace gizllm::tok
