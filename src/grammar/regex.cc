#include "grammar/regex.h"

#include <cstdint>
#include <cstdio>
#include <utility>
#include <vector>

namespace gizllm {
namespace {

// Regular expressions to GBNF. json_: over the characters of a JSON string (JSON Schema's
// `pattern`, searched as JavaScript does): what a character of the pattern matches is written as
// JSON writes it. Otherwise over plain text, the whole text one match.
class RegexCompiler {
 public:
  RegexCompiler(std::string_view pattern, std::string path, bool json)
      : p_(pattern), whole_(pattern), path_(std::move(path)), json_(json) {}

  Expected<std::string> Run() {
    bool start = false, end = false;
    if (!p_.empty() && p_[0] == '^') start = true, p_.remove_prefix(1), offset_ = 1;
    if (!p_.empty() && p_.back() == '$' && !Escaped(p_.size() - 1)) end = true, p_.remove_suffix(1);
    int top_alternatives = 0;
    GZ_ASSIGN_OR_RETURN(std::string body, Alternation(&top_alternatives, 0));
    if (i_ != p_.size()) return Refuse("unexpected ')'");
    if (!json_) return "(" + body + ")";  // a full match: the anchors change nothing
    if (top_alternatives > 1 && (start != end)) {
      return Refuse("an alternation with an anchor on one side only", 0);
    }
    std::string out = "\"\\\"\" ";
    if (!start) out += "char* ";
    out += "(" + body + ")";
    if (!end) out += " char*";
    return out + " \"\\\"\"";
  }

 private:
  bool Escaped(size_t at) const {
    size_t n = 0;
    while (at > n && p_[at - n - 1] == '\\') ++n;
    return n % 2 == 1;
  }
  // `at`: a byte offset into p_; npos: where the parse stands.
  Status Refuse(const std::string& what, size_t at = std::string_view::npos) const {
    const size_t pos = offset_ + (at == std::string_view::npos ? i_ : at);
    if (json_) {
      return InvalidArgument("json schema " + path_ + ": pattern " + std::string(whole_) + ": " +
                             what + " is not supported (at position " + std::to_string(pos) + ")");
    }
    return InvalidArgument("regex: at position " + std::to_string(pos) + ": " + what +
                           " is not supported");
  }

  Expected<std::string> Alternation(int* count, int depth) {
    if (depth > kMaxRegexNesting) {
      return Refuse("nesting deeper than " + std::to_string(kMaxRegexNesting));
    }
    std::vector<std::string> alts;
    while (true) {
      GZ_ASSIGN_OR_RETURN(std::string seq, Sequence(depth));
      alts.push_back(seq.empty() ? "\"\"" : seq);
      if (i_ < p_.size() && p_[i_] == '|') {
        ++i_;
        continue;
      }
      break;
    }
    *count = static_cast<int>(alts.size());
    std::string out;
    for (size_t k = 0; k < alts.size(); ++k) out += (k ? " | " : "") + alts[k];
    return out;
  }

  // A single character as a literal: its UTF-8 bytes, JSON-encoded under json_.
  std::string CharLiteral(uint32_t cp) const {
    if (!json_) return GbnfLiteral(Utf8(cp));
    if (cp == '"') return "\"\\\\\\\"\"";   // GBNF "\\\"" is the two bytes \"
    if (cp == '\\') return "\"\\\\\\\\\"";  // \\ in JSON
    if (cp < 0x20) {
      static const char* kHex = "0123456789abcdef";
      return std::string("\"\\\\u00") + kHex[cp >> 4] + kHex[cp & 15] + "\"";
    }
    return GbnfLiteral(Utf8(cp));
  }

  static std::string Utf8(uint32_t cp) {
    std::string bytes;
    if (cp < 0x80) {
      bytes += static_cast<char>(cp);
    } else if (cp < 0x800) {
      bytes += static_cast<char>(0xC0 | (cp >> 6));
      bytes += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      bytes += static_cast<char>(0xE0 | (cp >> 12));
      bytes += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      bytes += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      bytes += static_cast<char>(0xF0 | (cp >> 18));
      bytes += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      bytes += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      bytes += static_cast<char>(0x80 | (cp & 0x3F));
    }
    return bytes;
  }

  static std::string ClassChar(uint32_t cp) {
    char buf[16];
    snprintf(buf, sizeof buf, "\\U%08X", cp);
    return buf;
  }

  Expected<uint32_t> NextCodePoint() {
    const auto c = static_cast<unsigned char>(p_[i_]);
    const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i_ + n > p_.size()) return Refuse("invalid UTF-8");
    uint32_t v = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
    for (int k = 1; k < n; ++k) v = (v << 6) | (static_cast<unsigned char>(p_[i_ + k]) & 0x3F);
    i_ += n;
    return v;
  }

  // A class's members as GBNF class text (without brackets), from `\d`, `\w`, `\s`.
  const char* ShortClass(char e) const {
    switch (e) {
      case 'd':
        return "0-9";
      case 'w':
        return "a-zA-Z0-9_";
      case 's':
        // In a JSON string the other white space would need escapes: a subset.
        return json_ ? " " : " \\t\\n\\x0B\\x0C\\r";
      default:
        return nullptr;
    }
  }

  // Characters of a JSON string that the escape-free form can hold.
  static constexpr const char* kUnsafe = "\"\\\\\\x00-\\x1F\\u2028\\u2029";

  void ShortRanges(char e, std::vector<std::pair<uint32_t, uint32_t>>* out) const {
    if (e == 'd') out->push_back({'0', '9'});
    if (e == 'w') {
      out->insert(out->end(), {{'a', 'z'}, {'A', 'Z'}, {'0', '9'}, {'_', '_'}});
    }
    if (e == 's') out->push_back({' ', ' '});
    if (e == 's' && !json_) out->push_back({'\t', '\r'});
  }

  Expected<std::string> Class() {
    const size_t open = i_;
    ++i_;  // [
    bool negate = false;
    if (i_ < p_.size() && p_[i_] == '^') negate = true, ++i_;
    std::vector<std::pair<uint32_t, uint32_t>> ranges;
    std::string members;  // for a negated class: GBNF class text
    bool first = true;
    while (true) {
      if (i_ >= p_.size()) return Refuse("an unterminated class", open);
      if (p_[i_] == ']' && !first) break;
      first = false;
      uint32_t lo;
      if (p_[i_] == '\\') {
        if (i_ + 1 >= p_.size()) return Refuse("an escape at the end");
        const char e = p_[i_ + 1];
        if (ShortClass(e) != nullptr) {
          ShortRanges(e, &ranges);
          i_ += 2;
          continue;
        }
        GZ_ASSIGN_OR_RETURN(lo, Escape());
      } else {
        GZ_ASSIGN_OR_RETURN(lo, NextCodePoint());
      }
      uint32_t hi = lo;
      if (i_ + 1 < p_.size() && p_[i_] == '-' && p_[i_ + 1] != ']') {
        ++i_;
        if (p_[i_] == '\\') {
          GZ_ASSIGN_OR_RETURN(hi, Escape());
        } else {
          GZ_ASSIGN_OR_RETURN(hi, NextCodePoint());
        }
        if (hi < lo) return Refuse("a class range out of order", open);
      }
      ranges.push_back({lo, hi});
    }
    ++i_;  // ]
    if (negate || !json_) {
      for (const auto& [lo, hi] : ranges) {
        members += ClassChar(lo);
        if (hi != lo) members += "-" + ClassChar(hi);
      }
      if (!json_) return (negate ? "[^" : "[") + members + "]";
      return "[^" + members + kUnsafe + "]";
    }
    // Members a JSON string must escape are left out (a subset of what the class matches).
    static const std::vector<std::pair<uint32_t, uint32_t>> kUnsafeRanges = {
        {0x00, 0x1F}, {'"', '"'}, {'\\', '\\'}, {0x2028, 0x2029}};
    for (const auto& [ulo, uhi] : kUnsafeRanges) {
      std::vector<std::pair<uint32_t, uint32_t>> kept;
      for (const auto& [lo, hi] : ranges) {
        if (hi < ulo || lo > uhi) {
          kept.push_back({lo, hi});
          continue;
        }
        if (lo < ulo) kept.push_back({lo, ulo - 1});
        if (hi > uhi) kept.push_back({uhi + 1, hi});
      }
      ranges = std::move(kept);
    }
    if (ranges.empty()) return Refuse("a class of only characters JSON escapes", open);
    for (const auto& [lo, hi] : ranges) {
      members += ClassChar(lo);
      if (hi != lo) members += "-" + ClassChar(hi);
    }
    return "[" + members + "]";
  }

  // One escaped character (after `\`), outside the short classes.
  Expected<uint32_t> Escape() {
    const size_t at = i_;
    const char e = p_[i_ + 1];
    i_ += 2;
    switch (e) {
      case 'n':
        return uint32_t{'\n'};
      case 't':
        return uint32_t{'\t'};
      case 'r':
        return uint32_t{'\r'};
      case 'f':
        return uint32_t{'\f'};
      case 'v':
        return uint32_t{'\v'};
      case '0':
        return uint32_t{0};
      case 'u':
      case 'x': {
        const int n = e == 'x' ? 2 : 4;
        if (i_ + n > p_.size()) return Refuse("a short \\" + std::string(1, e), at);
        uint32_t v = 0;
        for (int k = 0; k < n; ++k) {
          const char h = p_[i_++];
          const int d = h >= '0' && h <= '9'   ? h - '0'
                        : h >= 'a' && h <= 'f' ? h - 'a' + 10
                        : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                               : -1;
          if (d < 0) return Refuse("a bad hex digit", at);
          v = v * 16 + d;
        }
        if (v >= 0xD800 && v <= 0xDFFF) return Refuse("a surrogate escape", at);
        return v;
      }
      default:
        if (e >= '1' && e <= '9') {
          return Refuse(std::string("the escape \\") + e + " (a backreference)", at);
        }
        if (e == 'b' || e == 'B') {
          return Refuse(std::string("the escape \\") + e + " (a word boundary)", at);
        }
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || e == '0') {
          return Refuse(std::string("the escape \\") + e, at);
        }
        return static_cast<uint32_t>(static_cast<unsigned char>(e));
    }
  }

  Expected<std::string> Sequence(int depth) {
    std::string out;
    std::string last;
    auto flush = [&] {
      if (!last.empty()) out += (out.empty() ? "" : " ") + last;
      last.clear();
    };
    while (i_ < p_.size() && p_[i_] != '|' && p_[i_] != ')') {
      const char c = p_[i_];
      if (c == '*' || c == '+' || c == '?' || c == '{') {
        const size_t at = i_;
        if (last.empty()) return Refuse(std::string("'") + c + "' after nothing");
        std::string op(1, c);
        ++i_;
        if (c == '{') {
          const size_t close = p_.find('}', i_);
          if (close == std::string_view::npos) return Refuse("an unterminated {", at);
          std::string inner(p_.substr(i_, close - i_));
          if (!json_ && !inner.empty() && inner[0] == ',') inner = "0" + inner;  // Python's {,n}
          const size_t comma = inner.find(',');
          if (inner.empty() || inner.find_first_not_of("0123456789,") != std::string::npos ||
              inner[0] == ',' || inner.find(',', comma + 1) != std::string::npos ||
              inner.size() > 11) {
            return Refuse("the quantifier {" + inner + "}", at);
          }
          const long lo = std::stol(inner.substr(0, comma));
          const long hi = comma == std::string::npos  ? lo
                          : comma + 1 == inner.size() ? lo
                                                      : std::stol(inner.substr(comma + 1));
          if (lo > kMaxRegexRepeat || hi > kMaxRegexRepeat || hi < lo) {
            return Refuse("the quantifier {" + inner + "} (counts up to " +
                              std::to_string(kMaxRegexRepeat) + ", in order)",
                          at);
          }
          op = "{" + inner + "}";
          i_ = close + 1;
        }
        if (i_ < p_.size() && p_[i_] == '?') ++i_;  // lazy: the same language
        if (i_ < p_.size() && (p_[i_] == '*' || p_[i_] == '+' || p_[i_] == '{')) {
          return Refuse("a quantifier after a quantifier");
        }
        last = "(" + last + ")" + op;
        flush();
        continue;
      }
      flush();
      if (c == '(') {
        const size_t open = i_;
        ++i_;
        if (i_ < p_.size() && p_[i_] == '?') {
          const std::string_view rest = p_.substr(i_ + 1);
          if (rest.starts_with(":")) {
            i_ += 2;
          } else if (rest.starts_with("=") || rest.starts_with("!") || rest.starts_with("<=") ||
                     rest.starts_with("<!")) {
            return Refuse("a lookaround", open);
          } else if (rest.starts_with("P<") || rest.starts_with("<")) {  // a named group
            const size_t close = p_.find('>', i_);
            if (close == std::string_view::npos) return Refuse("an unterminated group name", open);
            i_ = close + 1;
          } else if (rest.starts_with("P=")) {
            return Refuse("a backreference", open);
          } else {
            return Refuse(
                "the group (?" + std::string(rest.substr(0, 1)) + " (flags or an extension)", open);
          }
        }
        int unused;
        GZ_ASSIGN_OR_RETURN(std::string inner, Alternation(&unused, depth + 1));
        if (i_ >= p_.size() || p_[i_] != ')') return Refuse("an unclosed group", open);
        ++i_;
        last = "(" + inner + ")";
      } else if (c == '[') {
        GZ_ASSIGN_OR_RETURN(last, Class());
      } else if (c == '.') {
        ++i_;
        last = json_ ? std::string("[^") + kUnsafe + "]" : "[^\\n]";
      } else if (c == '^' || c == '$') {
        return Refuse("an anchor inside the pattern");
      } else if (c == '\\') {
        if (i_ + 1 >= p_.size()) return Refuse("an escape at the end");
        const char e = p_[i_ + 1];
        if (const char* s = ShortClass(e)) {
          i_ += 2;
          last = std::string("[") + s + "]";
        } else if (e == 'D' || e == 'W' || e == 'S') {
          i_ += 2;
          const char* unsafe = json_ ? kUnsafe : "";
          last = std::string("[^") + ShortClass(static_cast<char>(e - 'A' + 'a')) + unsafe + "]";
          if (e == 'S') last = std::string("[^ \\t\\n\\r") + unsafe + "]";
          if (e == 'S' && !json_) last = "[^ \\t\\n\\x0B\\x0C\\r]";
        } else {
          GZ_ASSIGN_OR_RETURN(uint32_t cp, Escape());
          last = CharLiteral(cp);
        }
      } else {
        GZ_ASSIGN_OR_RETURN(uint32_t cp, NextCodePoint());
        last = CharLiteral(cp);
      }
    }
    flush();
    return out;
  }

  std::string_view p_;
  std::string_view whole_;  // p_ before the anchors came off
  std::string path_;
  bool json_;
  size_t offset_ = 0;  // where p_ starts in whole_
  size_t i_ = 0;
};

}  // namespace

Expected<std::string> RegexToGbnf(std::string_view regex) {
  GZ_ASSIGN_OR_RETURN(std::string body, RegexCompiler(regex, "", /*json=*/false).Run());
  return "root ::= " + body + "\n";
}

Expected<Grammar> RegexGrammar(std::string_view regex) {
  GZ_ASSIGN_OR_RETURN(std::string text, RegexToGbnf(regex));
  Expected<Grammar> g = ParseGbnf(text, "regex");
  if (!g.ok()) return InvalidArgument("regex: " + g.status().message());
  return g;
}

Expected<std::string> JsonStringPatternGbnf(std::string_view pattern, const std::string& path) {
  return RegexCompiler(pattern, path, /*json=*/true).Run();
}

}  // namespace gizllm
