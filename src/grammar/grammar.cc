#include "grammar/grammar.h"

#include <algorithm>
#include <map>
#include <unordered_map>
#include <utility>

namespace gizllm {
namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr int64_t kMaxRepeat = 1 << 16;  // most copies one {m,n} may ask for

struct Sym {
  bool rule = false;
  int32_t value = 0;  // a set, or a rule
};
using Seq = std::vector<Sym>;
using Alts = std::vector<Seq>;
using ByteRange = std::pair<uint8_t, uint8_t>;
using CodeRange = std::pair<uint32_t, uint32_t>;

int EncodeUtf8(uint32_t cp, uint8_t* out) {
  if (cp < 0x80) {
    out[0] = static_cast<uint8_t>(cp);
    return 1;
  }
  if (cp < 0x800) {
    out[0] = static_cast<uint8_t>(0xC0 | (cp >> 6));
    out[1] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    out[0] = static_cast<uint8_t>(0xE0 | (cp >> 12));
    out[1] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
    out[2] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
    return 3;
  }
  out[0] = static_cast<uint8_t>(0xF0 | (cp >> 18));
  out[1] = static_cast<uint8_t>(0x80 | ((cp >> 12) & 0x3F));
  out[2] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
  out[3] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
  return 4;
}

// The byte-range sequences whose UTF-8 strings are exactly the code points [lo, hi] (no
// surrogates in the range): the split of Rust's regex-syntax Utf8Sequences.
void Utf8Sequences(uint32_t lo, uint32_t hi, std::vector<std::vector<ByteRange>>* out) {
  for (uint32_t bound : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= bound && hi > bound) {
      Utf8Sequences(lo, bound, out);
      Utf8Sequences(bound + 1, hi, out);
      return;
    }
  }
  if (hi <= 0x7F) {
    out->push_back({{static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)}});
    return;
  }
  uint8_t a[4], b[4];
  const int n = EncodeUtf8(lo, a);
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        Utf8Sequences(lo, lo | m, out);
        Utf8Sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        Utf8Sequences(lo, (hi & ~m) - 1, out);
        Utf8Sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  EncodeUtf8(hi, b);
  std::vector<ByteRange> seq;
  for (int i = 0; i < n; ++i) seq.push_back({a[i], b[i]});
  out->push_back(std::move(seq));
}

// Sorted, merged, without surrogates.
std::vector<CodeRange> Normalize(std::vector<CodeRange> ranges) {
  std::sort(ranges.begin(), ranges.end());
  std::vector<CodeRange> merged;
  for (const CodeRange& r : ranges) {
    if (!merged.empty() && r.first <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, r.second);
    } else {
      merged.push_back(r);
    }
  }
  std::vector<CodeRange> out;
  for (const CodeRange& r : merged) {
    if (r.second < 0xD800 || r.first > 0xDFFF) {
      out.push_back(r);
      continue;
    }
    if (r.first < 0xD800) out.push_back({r.first, 0xD7FF});
    if (r.second > 0xDFFF) out.push_back({0xE000, r.second});
  }
  return out;
}

std::vector<CodeRange> Complement(const std::vector<CodeRange>& ranges) {
  std::vector<CodeRange> out;
  uint32_t next = 0;
  for (const CodeRange& r : ranges) {
    if (r.first > next) out.push_back({next, r.first - 1});
    next = r.second + 1;
  }
  if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
  return Normalize(out);
}

bool IsWordChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

class Parser {
 public:
  Parser(std::string_view text, std::string name) : text_(text), name_(std::move(name)) {}

  Expected<Grammar> Run() {
    SkipSpace(true);
    while (pos_ < text_.size()) {
      const size_t start = pos_;
      std::string name = ParseName();
      if (name.empty()) return Error(pos_, "expected a rule name");
      SkipSpace(false);
      if (text_.substr(pos_, 3) != "::=") return Error(pos_, "expected ::= after " + name);
      pos_ += 3;
      SkipSpace(true);
      const int32_t id = Id(name, start);
      if (defined_[id]) return Error(start, "rule " + name + " is defined twice");
      defined_[id] = true;
      GZ_ASSIGN_OR_RETURN(Alts alts, ParseAlternates(id, false));
      rules_[id] = std::move(alts);
      SkipSpace(false);
      if (pos_ < text_.size() && text_[pos_] != '\n' && text_[pos_] != '\r') {
        return Error(pos_, std::string("unexpected '") + text_[pos_] + "'");
      }
      SkipSpace(true);
    }
    for (size_t r = 0; r < rules_.size(); ++r) {
      if (!defined_[r]) return Error(where_[r], "rule " + names_[r] + " is used but not defined");
    }
    auto root = ids_.find("root");
    if (root == ids_.end()) return InvalidArgument(name_ + ": no rule named root");
    GZ_RETURN_IF_ERROR(CheckLeftRecursion());
    return Flatten(root->second);
  }

 private:
  Status Error(size_t at, const std::string& message) const {
    int line = 1, column = 1;
    for (size_t i = 0; i < at && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    return InvalidArgument(name_ + ":" + std::to_string(line) + ":" + std::to_string(column) +
                           ": " + message);
  }

  void SkipSpace(bool newlines) {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c == ' ' || c == '\t' || ((c == '\n' || c == '\r') && newlines)) {
        ++pos_;
      } else if (c == '#') {
        while (pos_ < text_.size() && text_[pos_] != '\n' && text_[pos_] != '\r') ++pos_;
      } else {
        break;
      }
    }
  }

  std::string ParseName() {
    const size_t start = pos_;
    while (pos_ < text_.size() && IsWordChar(text_[pos_])) ++pos_;
    return std::string(text_.substr(start, pos_ - start));
  }

  int32_t Id(const std::string& name, size_t at) {
    auto [it, added] = ids_.emplace(name, static_cast<int32_t>(rules_.size()));
    if (added) NewRule(name, at);
    return it->second;
  }

  int32_t NewRule(const std::string& name, size_t at) {
    rules_.emplace_back();
    names_.push_back(name);
    defined_.push_back(false);
    where_.push_back(at);
    return static_cast<int32_t>(rules_.size() - 1);
  }

  int32_t Generated(int32_t parent, size_t at) {
    const int32_t r = NewRule(names_[parent] + "_" + std::to_string(++generated_[parent]), at);
    defined_[r] = true;
    return r;
  }

  int32_t SetId(const ByteSet& set) {
    auto [it, added] = set_ids_.emplace(set.bits, static_cast<int32_t>(sets_.size()));
    if (added) sets_.push_back(set);
    return it->second;
  }

  Sym ByteSym(uint8_t lo, uint8_t hi) {
    ByteSet s;
    s.AddRange(lo, hi);
    return Sym{false, SetId(s)};
  }

  // One code point of the source (UTF-8), or an escape when `escapes`.
  Expected<uint32_t> ParseChar() {
    const size_t start = pos_;
    const uint8_t c = static_cast<uint8_t>(text_[pos_]);
    if (c == '\\') {
      if (pos_ + 1 >= text_.size()) return Error(start, "an escape at the end of the text");
      const char e = text_[pos_ + 1];
      pos_ += 2;
      switch (e) {
        case 'n':
          return uint32_t{'\n'};
        case 't':
          return uint32_t{'\t'};
        case 'r':
          return uint32_t{'\r'};
        case '\\':
        case '"':
        case '[':
        case ']':
        case '-':
        case '^':
        case '/':
        case '\'':
          return static_cast<uint32_t>(e);
        case 'x':
        case 'u':
        case 'U': {
          const int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t v = 0;
          for (int i = 0; i < digits; ++i, ++pos_) {
            if (pos_ >= text_.size()) return Error(start, "a short \\" + std::string(1, e));
            const char h = text_[pos_];
            int d = h >= '0' && h <= '9'   ? h - '0'
                    : h >= 'a' && h <= 'f' ? h - 'a' + 10
                    : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                           : -1;
            if (d < 0) return Error(pos_, "expected a hex digit");
            v = v * 16 + d;
          }
          if (v > kMaxCodePoint || (v >= 0xD800 && v <= 0xDFFF)) {
            return Error(start, "not a Unicode scalar value");
          }
          return v;
        }
        default:
          return Error(start, std::string("unknown escape \\") + e);
      }
    }
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || pos_ + n > text_.size()) return Error(start, "invalid UTF-8");
    uint32_t v = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
    for (int i = 1; i < n; ++i) {
      const uint8_t k = static_cast<uint8_t>(text_[pos_ + i]);
      if ((k & 0xC0) != 0x80) return Error(start, "invalid UTF-8");
      v = (v << 6) | (k & 0x3F);
    }
    pos_ += n;
    return v;
  }

  // A class's symbol: one byte set when every character is ASCII, else a rule of byte sequences.
  Expected<Sym> ClassSym(const std::vector<CodeRange>& ranges, size_t at) {
    if (ranges.empty()) return Error(at, "a character class that matches nothing");
    std::string key;
    for (const CodeRange& r : ranges)
      key += std::to_string(r.first) + "-" + std::to_string(r.second) + ",";
    if (auto it = class_rules_.find(key); it != class_rules_.end()) return Sym{true, it->second};
    ByteSet ascii;
    bool any_ascii = false;
    std::vector<std::vector<ByteRange>> multi;
    for (const CodeRange& r : ranges) {
      if (r.first < 0x80) {
        ascii.AddRange(static_cast<uint8_t>(r.first),
                       static_cast<uint8_t>(std::min(r.second, 0x7Fu)));
        any_ascii = true;
      }
      if (r.second >= 0x80) Utf8Sequences(std::max(r.first, 0x80u), r.second, &multi);
    }
    if (multi.empty()) return Sym{false, SetId(ascii)};
    const int32_t rule = NewRule("char_class_" + std::to_string(class_rules_.size() + 1), at);
    defined_[rule] = true;
    if (any_ascii) rules_[rule].push_back({Sym{false, SetId(ascii)}});
    for (const auto& seq : multi) {
      Seq s;
      for (const ByteRange& b : seq) s.push_back(ByteSym(b.first, b.second));
      rules_[rule].push_back(std::move(s));
    }
    class_rules_.emplace(key, rule);
    return Sym{true, rule};
  }

  Expected<Alts> ParseAlternates(int32_t rule, bool nested) {
    Alts alts;
    GZ_ASSIGN_OR_RETURN(Seq first, ParseSequence(rule, nested));
    alts.push_back(std::move(first));
    while (pos_ < text_.size() && text_[pos_] == '|') {
      ++pos_;
      SkipSpace(true);
      GZ_ASSIGN_OR_RETURN(Seq next, ParseSequence(rule, nested));
      alts.push_back(std::move(next));
    }
    return alts;
  }

  Status Count(int64_t elements, size_t at) {
    elements_ += elements;
    if (elements_ > Grammar::kMaxElements) {
      return Error(at, "the grammar expands to more than " + std::to_string(Grammar::kMaxElements) +
                           " symbols");
    }
    return Status::Ok();
  }

  Expected<int64_t> ParseInt() {
    const size_t start = pos_;
    int64_t v = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      v = v * 10 + (text_[pos_++] - '0');
      if (v > kMaxRepeat)
        return Error(start, "a repetition count above " + std::to_string(kMaxRepeat));
    }
    if (pos_ == start) return Error(start, "expected a number");
    return v;
  }

  // Replaces seq[start:] by `min` copies of it and then up to max - min optional ones (max -1:
  // any number), as rules: x* is r ::= x r | "", x{0,2} is r2 ::= x r1 | "", r1 ::= x | "".
  Status Repeat(int32_t rule, Seq& seq, size_t start, int64_t min, int64_t max, size_t at) {
    const Seq item(seq.begin() + start, seq.end());
    seq.resize(start);
    const int64_t copies = min + (max < 0 ? 1 : max - min);
    GZ_RETURN_IF_ERROR(Count(copies * static_cast<int64_t>(item.size() + 2), at));
    for (int64_t i = 0; i < min; ++i) seq.insert(seq.end(), item.begin(), item.end());
    if (max < 0) {
      const int32_t r = Generated(rule, at);
      Seq loop = item;
      loop.push_back(Sym{true, r});
      rules_[r] = {std::move(loop), Seq{}};
      seq.push_back(Sym{true, r});
    } else if (max > min) {
      int32_t prev = -1;
      for (int64_t k = 0; k < max - min; ++k) {
        const int32_t r = Generated(rule, at);
        Seq once = item;
        if (prev >= 0) once.push_back(Sym{true, prev});
        rules_[r] = {std::move(once), Seq{}};
        prev = r;
      }
      seq.push_back(Sym{true, prev});
    }
    return Status::Ok();
  }

  Expected<Seq> ParseSequence(int32_t rule, bool nested) {
    Seq seq;
    size_t last = std::string::npos;  // where the last item starts in seq
    while (pos_ < text_.size()) {
      const size_t at = pos_;
      const char c = text_[pos_];
      if (c == '"') {
        ++pos_;
        last = seq.size();
        while (true) {
          if (pos_ >= text_.size()) return Error(at, "an unterminated string");
          if (text_[pos_] == '"') break;
          GZ_ASSIGN_OR_RETURN(uint32_t cp, ParseChar());
          uint8_t bytes[4];
          const int n = EncodeUtf8(cp, bytes);
          for (int i = 0; i < n; ++i) seq.push_back(ByteSym(bytes[i], bytes[i]));
        }
        ++pos_;
        GZ_RETURN_IF_ERROR(Count(static_cast<int64_t>(seq.size() - last), at));
      } else if (c == '[') {
        ++pos_;
        bool negate = false;
        if (pos_ < text_.size() && text_[pos_] == '^') negate = true, ++pos_;
        std::vector<CodeRange> ranges;
        while (true) {
          if (pos_ >= text_.size()) return Error(at, "an unterminated character class");
          if (text_[pos_] == ']') break;
          GZ_ASSIGN_OR_RETURN(uint32_t lo, ParseChar());
          uint32_t hi = lo;
          if (pos_ + 1 < text_.size() && text_[pos_] == '-' && text_[pos_ + 1] != ']') {
            ++pos_;
            const size_t range_at = pos_;
            GZ_ASSIGN_OR_RETURN(hi, ParseChar());
            if (hi < lo) return Error(range_at, "a range whose end is below its start");
          }
          ranges.push_back({lo, hi});
        }
        ++pos_;
        ranges = Normalize(std::move(ranges));
        if (negate) ranges = Complement(ranges);
        last = seq.size();
        GZ_ASSIGN_OR_RETURN(Sym s, ClassSym(ranges, at));
        seq.push_back(s);
        GZ_RETURN_IF_ERROR(Count(1, at));
      } else if (c == '.') {
        ++pos_;
        last = seq.size();
        GZ_ASSIGN_OR_RETURN(Sym s, ClassSym(Normalize({{0, kMaxCodePoint}}), at));
        seq.push_back(s);
        GZ_RETURN_IF_ERROR(Count(1, at));
      } else if (IsWordChar(c)) {
        std::string name = ParseName();
        last = seq.size();
        seq.push_back(Sym{true, Id(name, at)});
        GZ_RETURN_IF_ERROR(Count(1, at));
      } else if (c == '(') {
        if (++depth_ > Grammar::kMaxNesting) {
          return Error(at, "groups nested deeper than " + std::to_string(Grammar::kMaxNesting));
        }
        ++pos_;
        SkipSpace(true);
        const int32_t group = Generated(rule, at);
        GZ_ASSIGN_OR_RETURN(Alts alts, ParseAlternates(rule, true));
        rules_[group] = std::move(alts);
        if (pos_ >= text_.size() || text_[pos_] != ')') return Error(at, "an unclosed group");
        ++pos_;
        --depth_;
        last = seq.size();
        seq.push_back(Sym{true, group});
        GZ_RETURN_IF_ERROR(Count(1, at));
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (last == std::string::npos) return Error(at, std::string("'") + c + "' follows nothing");
        int64_t min = c == '+' ? 1 : 0, max = c == '?' ? 1 : -1;
        ++pos_;
        if (c == '{') {
          SkipSpace(false);
          GZ_ASSIGN_OR_RETURN(min, ParseInt());
          SkipSpace(false);
          max = min;
          if (pos_ < text_.size() && text_[pos_] == ',') {
            ++pos_;
            SkipSpace(false);
            max = -1;
            if (pos_ < text_.size() && text_[pos_] != '}') {
              GZ_ASSIGN_OR_RETURN(max, ParseInt());
              SkipSpace(false);
              if (max < min) return Error(at, "a repetition whose maximum is below its minimum");
            }
          }
          if (pos_ >= text_.size() || text_[pos_] != '}') return Error(pos_, "expected }");
          ++pos_;
        }
        GZ_RETURN_IF_ERROR(Repeat(rule, seq, last, min, max, at));
        last = std::string::npos;
      } else {
        break;
      }
      SkipSpace(nested);
    }
    return seq;
  }

  // A rule that can reach itself before reading a byte would expand forever.
  Status CheckLeftRecursion() const {
    const size_t n = rules_.size();
    std::vector<bool> nullable(n, false);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (const Seq& s : rules_[r]) {
          if (std::all_of(s.begin(), s.end(), [&](Sym x) { return x.rule && nullable[x.value]; })) {
            nullable[r] = changed = true;
            break;
          }
        }
      }
    }
    // left[r]: the rules r may start with.
    std::vector<std::vector<int32_t>> left(n);
    for (size_t r = 0; r < n; ++r) {
      for (const Seq& s : rules_[r]) {
        for (Sym x : s) {
          if (!x.rule) break;
          left[r].push_back(x.value);
          if (!nullable[x.value]) break;
        }
      }
    }
    // Iterative depth-first search for a cycle; colour 1: on the path, 2: done.
    std::vector<uint8_t> colour(n, 0);
    std::vector<std::pair<int32_t, size_t>> path;
    for (size_t start = 0; start < n; ++start) {
      if (colour[start]) continue;
      path.push_back({static_cast<int32_t>(start), 0});
      colour[start] = 1;
      while (!path.empty()) {
        auto& [r, next] = path.back();
        if (next == left[r].size()) {
          colour[r] = 2;
          path.pop_back();
          continue;
        }
        const int32_t to = left[r][next++];
        if (colour[to] == 1) {
          std::string cycle;
          bool on = false;
          for (const auto& [p, unused] : path) {
            on = on || p == to;
            if (on) cycle += names_[p] + " -> ";
          }
          return Error(where_[to], "left recursion: " + cycle + names_[to] +
                                       " (a rule reaches itself before reading a character)");
        }
        if (colour[to] == 0) {
          colour[to] = 1;
          path.push_back({to, 0});
        }
      }
    }
    return Status::Ok();
  }

  Grammar Flatten(int32_t root) {
    Grammar g;
    g.root = root;
    g.names = names_;
    g.sets = sets_;
    g.rules.resize(rules_.size());
    for (size_t r = 0; r < rules_.size(); ++r) {
      for (const Seq& s : rules_[r]) {
        g.rules[r].push_back(static_cast<int32_t>(g.elements.size()));
        for (Sym x : s) {
          g.elements.push_back({x.rule ? GrammarElement::kRule : GrammarElement::kBytes, x.value});
        }
        g.elements.push_back({GrammarElement::kEnd, 0});
      }
    }
    FindRuns(&g);
    return g;
  }

  // Fills g->canonical (Grammar::canonical) from the runs of each alternative that repeat a block
  // of up to kMaxPeriod elements, shortest periods first (a run found covers its elements for
  // longer periods), and from chains of optional copies.
  static void FindRuns(Grammar* g) {
    constexpr int32_t kMaxPeriod = 16;
    constexpr int64_t kDepth = Grammar::kCanonicalDepth;
    const int64_t n = static_cast<int64_t>(g->elements.size());
    // Rules that can read nothing.
    std::vector<bool> nullable(g->rules.size(), false);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < g->rules.size(); ++r) {
        if (nullable[r]) continue;
        for (int32_t alt : g->rules[r]) {
          bool empty = true;
          for (int32_t e = alt; empty && g->elements[e].kind != GrammarElement::kEnd; ++e) {
            empty = g->elements[e].kind == GrammarElement::kRule && nullable[g->elements[e].value];
          }
          if (empty) {
            nullable[r] = changed = true;
            break;
          }
        }
      }
    }
    auto same = [&](int64_t a, int64_t b) {
      return g->elements[a].kind == g->elements[b].kind &&
             g->elements[a].value == g->elements[b].value;
    };
    std::vector<bool> covered;
    for (int64_t begin = 0; begin < n;) {
      int64_t end = begin;
      while (g->elements[end].kind != GrammarElement::kEnd) ++end;
      if (end - begin >= kDepth + 3) {
        if (covered.empty()) covered.assign(n, false);
        for (int64_t s = 1; s <= kMaxPeriod; ++s) {
          for (int64_t b = begin; b + s < end;) {
            // The run from b: elements [b, b + t + s) repeat with period s.
            int64_t t = 0;
            while (b + t + s < end && !covered[b + t] && !covered[b + t + s] && same(b + t, b + t + s)) {
              ++t;
            }
            const int64_t copies = (t + s) / s;
            bool reads = false;  // a copy reads at least one byte
            for (int64_t j = 0; j < s && copies > kDepth + 2; ++j) {
              const GrammarElement& e = g->elements[b + j];
              reads = reads || e.kind == GrammarElement::kBytes || !nullable[e.value];
            }
            if (copies <= kDepth + 2 || !reads) {
              b += std::max<int64_t>(t, 1);
              continue;
            }
            if (g->canonical.empty()) {
              g->canonical.resize(n);
              for (int64_t e = 0; e < n; ++e) g->canonical[e] = static_cast<int32_t>(e);
            }
            const int64_t kept = b + (copies - 1 - (kDepth + 1)) * s;  // the representative copy
            for (int64_t p = b; p < kept; ++p) {
              g->canonical[p] = static_cast<int32_t>(kept + (p - b) % s);
            }
            for (int64_t p = b; p < b + copies * s; ++p) covered[p] = true;
            b += copies * s;
          }
        }
      }
      begin = end + 1;
    }
    // Chains of optional copies (x{m,n} past m: r_k ::= x r_(k-1) | "" down to r_1 ::= x | "",
    // generated in that order): the rules that allow more than kDepth + 2 copies map onto the
    // one of their chain that allows kDepth + 2. Up to kDepth bytes, what may follow a place in
    // either is the same and may end at the same places.
    const size_t rules = g->rules.size();
    std::vector<int64_t> depth(rules, 0);  // copies a chain rule allows; 0: not one
    std::vector<int64_t> item(rules, 0);   // elements of its copy
    std::vector<int32_t> next(rules, -1);  // the rule it ends in
    auto alt_size = [&](int32_t alt) {
      int64_t e = alt;
      while (g->elements[e].kind != GrammarElement::kEnd) ++e;
      return e - alt;
    };
    for (size_t r = 0; r < rules; ++r) {
      const std::vector<int32_t>& alts = g->rules[r];
      if (alts.size() != 2 || g->elements[alts[1]].kind != GrammarElement::kEnd) continue;
      const int32_t a = alts[0];
      const int64_t size = alt_size(a);
      if (size == 0) continue;
      const GrammarElement& last = g->elements[a + size - 1];
      if (size >= 2 && last.kind == GrammarElement::kRule && last.value < static_cast<int32_t>(r) &&
          depth[last.value] > 0 && item[last.value] == size - 1) {
        const int32_t below = g->rules[last.value][0];
        bool equal = true;
        for (int64_t j = 0; equal && j < size - 1; ++j) equal = same(a + j, below + j);
        if (equal) {
          depth[r] = depth[last.value] + 1;
          item[r] = size - 1;
          next[r] = last.value;
          continue;
        }
      }
      depth[r] = 1;
      item[r] = size;
    }
    for (size_t r = 0; r < rules; ++r) {
      if (depth[r] <= kDepth + 2) continue;
      bool reads = false;
      for (int64_t j = 0; j < item[r]; ++j) {
        const GrammarElement& e = g->elements[g->rules[r][0] + j];
        reads = reads || e.kind == GrammarElement::kBytes || !nullable[e.value];
      }
      if (!reads) continue;
      int32_t target = static_cast<int32_t>(r);
      while (depth[target] > kDepth + 2) target = next[target];
      if (g->canonical.empty()) {
        g->canonical.resize(n);
        for (int64_t e = 0; e < n; ++e) g->canonical[e] = static_cast<int32_t>(e);
      }
      const int32_t from = g->rules[r][0], to = g->rules[target][0];
      for (int64_t j = 0; j <= item[r]; ++j) g->canonical[from + j] = static_cast<int32_t>(to + j);
    }
  }

  std::string_view text_;
  size_t pos_ = 0;
  std::string name_;
  int depth_ = 0;
  int64_t elements_ = 0;
  std::vector<Alts> rules_;
  std::vector<std::string> names_;
  std::vector<bool> defined_;
  std::vector<size_t> where_;  // [rules] where each rule is first named
  std::unordered_map<int32_t, int32_t> generated_;
  std::unordered_map<std::string, int32_t> ids_;
  std::vector<ByteSet> sets_;
  std::map<std::array<uint64_t, 4>, int32_t> set_ids_;
  std::map<std::string, int32_t> class_rules_;
};

std::string SetString(const ByteSet& s) {
  auto show = [](int b) {
    if (b >= 0x21 && b < 0x7F && b != '\\' && b != ']' && b != '-' && b != '^' && b != '"') {
      return std::string(1, static_cast<char>(b));
    }
    static const char* kHex = "0123456789ABCDEF";
    return std::string("\\x") + kHex[b >> 4] + kHex[b & 15];
  };
  std::string out = "[";
  for (int b = 0; b < 256;) {
    if (!s.Has(static_cast<uint8_t>(b))) {
      ++b;
      continue;
    }
    int e = b;
    while (e + 1 < 256 && s.Has(static_cast<uint8_t>(e + 1))) ++e;
    out += show(b);
    if (e > b) out += "-" + show(e);
    b = e + 1;
  }
  return out + "]";
}

}  // namespace

std::string Grammar::ToString() const {
  std::string out;
  for (size_t r = 0; r < rules.size(); ++r) {
    out += names[r] + " ::=";
    for (size_t a = 0; a < rules[r].size(); ++a) {
      if (a > 0) out += " |";
      for (int32_t i = rules[r][a]; elements[i].kind != GrammarElement::kEnd; ++i) {
        const GrammarElement& e = elements[i];
        out += " " + (e.kind == GrammarElement::kRule ? names[e.value] : SetString(sets[e.value]));
      }
      if (elements[rules[r][a]].kind == GrammarElement::kEnd) out += " \"\"";
    }
    out += "\n";
  }
  return out;
}

std::string GbnfLiteral(std::string_view bytes) {
  std::string out = "\"";
  for (char c : bytes) {
    const auto b = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (b < 0x20) {
      static const char* kHex = "0123456789ABCDEF";
      out += std::string("\\x") + kHex[b >> 4] + kHex[b & 15];
    } else {
      out += c;
    }
  }
  return out + "\"";
}

Expected<Grammar> ParseGbnf(std::string_view text, const std::string& name) {
  return Parser(text, name).Run();
}

}  // namespace gizllm
