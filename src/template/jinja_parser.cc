#include "template/jinja_parser.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <set>

#include "template/jinja_builtins.h"

namespace gizllm::jinja {

std::string FormatPos(const Pos& pos) {
  return "line " + std::to_string(pos.line) + ", column " + std::to_string(pos.column);
}

namespace {

// Jinja reads the source with its lines split and joined by "\n": "\r\n" and "\r" become "\n"
// and one final newline is dropped (keep_trailing_newline is off).
std::string NormalizeSource(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

// Python's str.isspace over UTF-8: the length of the whitespace run ending at `end`.
size_t TrailingSpace(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    std::vector<char32_t> cp = DecodeUtf8(s.substr(start, end - start));
    if (cp.size() != 1 || !IsPySpace(cp[0])) break;
    end = start;
  }
  return s.size() - end;
}

size_t LeadingSpace(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t n = 1;
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0xF0) {
      n = 4;
    } else if (c >= 0xE0) {
      n = 3;
    } else if (c >= 0xC0) {
      n = 2;
    }
    std::vector<char32_t> cp = DecodeUtf8(s.substr(i, n));
    if (cp.size() != 1 || !IsPySpace(cp[0])) break;
    i += n;
  }
  return i;
}

struct Segment {
  enum class Kind { kText, kVariable, kBlock };
  Kind kind;
  std::string text;  // the text, or the tag's inner source
  size_t offset;     // where text starts in the normalized source
};

class Locator {
 public:
  explicit Locator(const std::string& src) {
    starts_.push_back(0);
    for (size_t i = 0; i < src.size(); ++i) {
      if (src[i] == '\n') starts_.push_back(i + 1);
    }
  }
  Pos At(size_t offset) const {
    auto it = std::upper_bound(starts_.begin(), starts_.end(), offset);
    size_t line = static_cast<size_t>(it - starts_.begin());
    return Pos{static_cast<int>(line), static_cast<int>(offset - starts_[line - 1] + 1)};
  }

 private:
  std::vector<size_t> starts_;
};

Status ErrorAt(const Locator& loc, size_t offset, const std::string& message) {
  return Unimplemented(FormatPos(loc.At(offset)) + ": " + message);
}

// Finds the end of a {{ or {% tag that starts its inner source at `from`: the offset of "}}" or
// "%}" outside string literals and brackets.
Expected<size_t> FindTagEnd(const std::string& src, size_t from, char close, const Locator& loc) {
  int depth = 0;
  size_t i = from;
  while (i < src.size()) {
    char c = src[i];
    if (c == '"' || c == '\'') {
      size_t j = i + 1;
      while (j < src.size() && src[j] != c) j += src[j] == '\\' ? 2 : 1;
      if (j >= src.size()) return ErrorAt(loc, i, "unterminated string literal");
      i = j + 1;
      continue;
    }
    if (depth == 0 && c == close && i + 1 < src.size() && src[i + 1] == '}') return i;
    if (c == '(' || c == '[' || c == '{') {
      ++depth;
    } else if ((c == ')' || c == ']' || c == '}') && depth > 0) {
      --depth;
    }
    ++i;
  }
  return ErrorAt(loc, from, std::string("tag not closed with '") + close + "}'");
}

Expected<std::vector<Segment>> SplitTags(const std::string& src, const Locator& loc) {
  std::vector<Segment> out;
  size_t pos = 0;
  bool line_starting = true;
  while (pos <= src.size()) {
    size_t start = pos;
    while (true) {
      start = src.find('{', start);
      if (start == std::string::npos || start + 1 >= src.size()) {
        start = std::string::npos;
        break;
      }
      char t = src[start + 1];
      if (t == '{' || t == '%' || t == '#') break;
      ++start;
    }
    std::string text =
        src.substr(pos, start == std::string::npos ? std::string::npos : start - pos);
    if (start == std::string::npos) {
      if (!text.empty()) out.push_back({Segment::Kind::kText, text, pos});
      break;
    }
    char type = src[start + 1];
    char sign = start + 2 < src.size() && (src[start + 2] == '-' || src[start + 2] == '+')
                    ? src[start + 2]
                    : 0;
    if (sign == '-') {
      text.resize(text.size() - TrailingSpace(text));
    } else if (sign != '+' && type != '{') {
      size_t nl = text.rfind('\n');
      size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      if (l_pos > 0 || line_starting) {
        std::string_view rest(text.data() + l_pos, text.size() - l_pos);
        if (LeadingSpace(rest) == rest.size()) text.resize(l_pos);
      }
    }
    if (!text.empty()) out.push_back({Segment::Kind::kText, text, pos});
    size_t inner = start + 2 + (sign ? 1 : 0);
    size_t end;
    if (type == '#') {
      end = src.find("#}", inner);
      if (end == std::string::npos) return ErrorAt(loc, start, "comment not closed with '#}'");
    } else {
      GZ_ASSIGN_OR_RETURN(end, FindTagEnd(src, inner, type == '{' ? '}' : '%', loc));
    }
    char end_sign = end > inner && (src[end - 1] == '-' || src[end - 1] == '+') ? src[end - 1] : 0;
    std::string content = src.substr(inner, end - inner - (end_sign ? 1 : 0));
    size_t after = end + 2;
    if (end_sign == '-') {
      after += LeadingSpace(std::string_view(src).substr(after));
    } else if (end_sign != '+' && type != '{' && after < src.size() && src[after] == '\n') {
      ++after;
    }
    line_starting = after > end + 2 && src[after - 1] == '\n';
    if (type == '{') {
      out.push_back({Segment::Kind::kVariable, content, inner});
    } else if (type == '%') {
      std::string_view word(content);
      word.remove_prefix(LeadingSpace(word));
      word.remove_suffix(TrailingSpace(word));
      if (word == "raw") {
        // Everything up to {% endraw %} is text; the raw tag keeps the newline after it.
        size_t body_start = end + 2;
        if (end_sign == '-') body_start += LeadingSpace(std::string_view(src).substr(body_start));
        size_t search = body_start;
        while (true) {
          size_t tag = src.find("{%", search);
          if (tag == std::string::npos) return ErrorAt(loc, start, "raw block without endraw");
          size_t i = tag + 2;
          char s1 = src[i] == '-' || src[i] == '+' ? src[i] : 0;
          if (s1) ++i;
          while (i < src.size() && (src[i] == ' ' || src[i] == '\t' || src[i] == '\n')) ++i;
          if (src.compare(i, 6, "endraw") != 0) {
            search = tag + 2;
            continue;
          }
          i += 6;
          while (i < src.size() && (src[i] == ' ' || src[i] == '\t' || src[i] == '\n')) ++i;
          char s2 = i < src.size() && (src[i] == '-' || src[i] == '+') ? src[i] : 0;
          if (s2) ++i;
          if (src.compare(i, 2, "%}") != 0) return ErrorAt(loc, tag, "bad endraw tag");
          std::string raw = src.substr(body_start, tag - body_start);
          if (s1 == '-') raw.resize(raw.size() - TrailingSpace(raw));
          if (!raw.empty()) out.push_back({Segment::Kind::kText, raw, body_start});
          after = i + 2;
          if (s2 == '-') {
            after += LeadingSpace(std::string_view(src).substr(after));
          } else if (s2 != '+' && after < src.size() && src[after] == '\n') {
            ++after;
          }
          line_starting = src[after - 1] == '\n';
          break;
        }
      } else {
        out.push_back({Segment::Kind::kBlock, content, inner});
      }
    }
    pos = after;
  }
  return out;
}

struct Token {
  enum class Type { kName, kString, kInt, kFloat, kOp, kEnd };
  Type type;
  std::string text;
  Value value;
  size_t offset;
};

bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || (c >= '0' && c <= '9'); }

// Python's unicode-escape decoding of a string literal's inside.
std::string Unescape(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 >= s.size()) {
      out += s[i];
      continue;
    }
    char c = s[++i];
    auto hex = [&](size_t n) -> bool {
      if (i + n >= s.size()) return false;
      uint32_t v = 0;
      auto r = std::from_chars(s.data() + i + 1, s.data() + i + 1 + n, v, 16);
      if (r.ptr != s.data() + i + 1 + n) return false;
      AppendUtf8(static_cast<char32_t>(v), out);
      i += n;
      return true;
    };
    switch (c) {
      case 'n':
        out += '\n';
        break;
      case 't':
        out += '\t';
        break;
      case 'r':
        out += '\r';
        break;
      case '\\':
        out += '\\';
        break;
      case '\'':
        out += '\'';
        break;
      case '"':
        out += '"';
        break;
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'v':
        out += '\v';
        break;
      case '\n':
        break;
      case 'x':
        if (!hex(2)) out += "\\x";
        break;
      case 'u':
        if (!hex(4)) out += "\\u";
        break;
      case 'U':
        if (!hex(8)) out += "\\U";
        break;
      default:
        if (c >= '0' && c <= '7') {
          uint32_t v = 0;
          size_t n = 0;
          while (n < 3 && i < s.size() && s[i] >= '0' && s[i] <= '7') {
            v = v * 8 + static_cast<uint32_t>(s[i] - '0');
            ++i;
            ++n;
          }
          --i;
          AppendUtf8(static_cast<char32_t>(v), out);
        } else {
          out += '\\';
          out += c;
        }
    }
  }
  return out;
}

Expected<std::vector<Token>> Tokenize(const std::string& src, size_t base, const Locator& loc) {
  static const char* kOps[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*",
                               "/",  "%",  "~",  "(",  ")",  "[",  "]", "{", "}",
                               ",",  ".",  ":",  "|",  "=",  "<",  ">"};
  std::vector<Token> out;
  size_t i = 0;
  while (i < src.size()) {
    char c = src[i];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      ++i;
      continue;
    }
    size_t at = base + i;
    if (IsNameStart(c)) {
      size_t j = i;
      while (j < src.size() && IsNameChar(src[j])) ++j;
      out.push_back({Token::Type::kName, src.substr(i, j - i), {}, at});
      i = j;
    } else if (c >= '0' && c <= '9') {
      size_t j = i;
      bool is_float = false;
      while (j < src.size() && ((src[j] >= '0' && src[j] <= '9') || src[j] == '_')) ++j;
      if (j + 1 < src.size() && src[j] == '.' && src[j + 1] >= '0' && src[j + 1] <= '9') {
        is_float = true;
        ++j;
        while (j < src.size() && ((src[j] >= '0' && src[j] <= '9') || src[j] == '_')) ++j;
      }
      if (j < src.size() && (src[j] == 'e' || src[j] == 'E')) {
        size_t k = j + 1;
        if (k < src.size() && (src[k] == '+' || src[k] == '-')) ++k;
        if (k < src.size() && src[k] >= '0' && src[k] <= '9') {
          is_float = true;
          j = k;
          while (j < src.size() && src[j] >= '0' && src[j] <= '9') ++j;
        }
      }
      std::string digits;
      for (size_t k = i; k < j; ++k) {
        if (src[k] != '_') digits += src[k];
      }
      Token t{is_float ? Token::Type::kFloat : Token::Type::kInt, digits, {}, at};
      if (is_float) {
        // strtod, not stod: a literal past the double range is inf, as in Python, not an
        // exception.
        t.value = Value(std::strtod(digits.c_str(), nullptr));
      } else {
        int64_t v = 0;
        auto r = std::from_chars(digits.data(), digits.data() + digits.size(), v);
        if (r.ec != std::errc()) return ErrorAt(loc, at, "integer literal out of range");
        t.value = Value(v);
      }
      out.push_back(std::move(t));
      i = j;
    } else if (c == '"' || c == '\'') {
      size_t j = i + 1;
      while (j < src.size() && src[j] != c) j += src[j] == '\\' ? 2 : 1;
      if (j >= src.size()) return ErrorAt(loc, at, "unterminated string literal");
      Token t{Token::Type::kString, src.substr(i, j + 1 - i), {}, at};
      t.value = Value(Unescape(std::string_view(src).substr(i + 1, j - i - 1)));
      out.push_back(std::move(t));
      i = j + 1;
    } else {
      bool found = false;
      for (const char* op : kOps) {
        size_t n = std::char_traits<char>::length(op);
        if (src.compare(i, n, op) == 0) {
          out.push_back({Token::Type::kOp, op, {}, at});
          i += n;
          found = true;
          break;
        }
      }
      if (!found) return ErrorAt(loc, at, std::string("unexpected character '") + c + "'");
    }
  }
  out.push_back({Token::Type::kEnd, "", {}, base + src.size()});
  return out;
}

// Parses one tag's tokens.
class ExprParser {
 public:
  ExprParser(std::vector<Token> tokens, const Locator& loc)
      : tokens_(std::move(tokens)), loc_(loc) {}

  const Token& Peek(size_t ahead = 0) const {
    return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
  }
  bool AtEnd() const { return Peek().type == Token::Type::kEnd; }
  bool IsOp(const char* op, size_t ahead = 0) const {
    return Peek(ahead).type == Token::Type::kOp && Peek(ahead).text == op;
  }
  bool IsName(const char* name, size_t ahead = 0) const {
    return Peek(ahead).type == Token::Type::kName && Peek(ahead).text == name;
  }
  Token Next() { return tokens_[std::min(pos_++, tokens_.size() - 1)]; }
  Pos PosOf(const Token& t) const { return loc_.At(t.offset); }

  Status Error(const std::string& message) const {
    const Token& t = Peek();
    std::string got = t.type == Token::Type::kEnd ? "end of tag" : "'" + t.text + "'";
    return Unimplemented(FormatPos(PosOf(t)) + ": " + message + " (found " + got + ")");
  }
  Status ExpectOp(const char* op) {
    if (!IsOp(op)) return Error(std::string("expected '") + op + "'");
    ++pos_;
    return Status::Ok();
  }
  Expected<std::string> ExpectName() {
    if (Peek().type != Token::Type::kName) return Error("expected a name");
    return Next().text;
  }
  Status ExpectEnd() {
    if (!AtEnd()) return Error("unexpected token");
    return Status::Ok();
  }

  ExprPtr Make(Expr::Kind kind, Pos pos) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->pos = pos;
    return e;
  }

  // expression: or_expr ['if' or_expr ['else' expression]]
  Expected<ExprPtr> ParseExpression(bool with_cond = true) {
    GZ_ASSIGN_OR_RETURN(ExprPtr e, ParseOr());
    if (!with_cond) return e;
    while (IsName("if")) {
      Pos p = PosOf(Next());
      GZ_ASSIGN_OR_RETURN(ExprPtr cond, ParseOr());
      ExprPtr other;
      if (IsName("else")) {
        Next();
        GZ_ASSIGN_OR_RETURN(other, ParseExpression());
      }
      ExprPtr c = Make(Expr::Kind::kCond, p);
      c->children.push_back(std::move(e));
      c->children.push_back(std::move(cond));
      c->children.push_back(std::move(other));
      e = std::move(c);
    }
    return e;
  }

  // A comma list read as a list literal when it has a comma ("a, b" or "a,").
  Expected<ExprPtr> ParseTuple(bool with_cond = true) {
    Pos p = PosOf(Peek());
    GZ_ASSIGN_OR_RETURN(ExprPtr first, ParseExpression(with_cond));
    if (!IsOp(",")) return first;
    ExprPtr list = Make(Expr::Kind::kTuple, p);
    list->children.push_back(std::move(first));
    while (IsOp(",")) {
      Next();
      if (AtEnd() || IsName("in") || IsOp("=") || IsOp(")")) break;
      GZ_ASSIGN_OR_RETURN(ExprPtr item, ParseExpression(with_cond));
      list->children.push_back(std::move(item));
    }
    return list;
  }

  Expected<ExprPtr> Binary(ExprPtr l, const Token& op, ExprPtr r) {
    ExprPtr b = Make(Expr::Kind::kBinary, PosOf(op));
    b->name = op.text;
    b->children.push_back(std::move(l));
    b->children.push_back(std::move(r));
    return b;
  }

  Expected<ExprPtr> ParseOr() {
    GZ_ASSIGN_OR_RETURN(ExprPtr l, ParseAnd());
    while (IsName("or")) {
      Token op = Next();
      GZ_ASSIGN_OR_RETURN(ExprPtr r, ParseAnd());
      GZ_ASSIGN_OR_RETURN(l, Binary(std::move(l), op, std::move(r)));
    }
    return l;
  }
  Expected<ExprPtr> ParseAnd() {
    GZ_ASSIGN_OR_RETURN(ExprPtr l, ParseNot());
    while (IsName("and")) {
      Token op = Next();
      GZ_ASSIGN_OR_RETURN(ExprPtr r, ParseNot());
      GZ_ASSIGN_OR_RETURN(l, Binary(std::move(l), op, std::move(r)));
    }
    return l;
  }
  Expected<ExprPtr> ParseNot() {
    if (IsName("not")) {
      Pos p = PosOf(Next());
      GZ_ASSIGN_OR_RETURN(ExprPtr operand, ParseNot());
      ExprPtr u = Make(Expr::Kind::kUnary, p);
      u->name = "not";
      u->children.push_back(std::move(operand));
      return u;
    }
    return ParseCompare();
  }
  Expected<ExprPtr> ParseCompare() {
    Pos p = PosOf(Peek());
    GZ_ASSIGN_OR_RETURN(ExprPtr first, ParseMath1());
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (Peek().type == Token::Type::kOp &&
          (Peek().text == "==" || Peek().text == "!=" || Peek().text == "<" ||
           Peek().text == "<=" || Peek().text == ">" || Peek().text == ">=")) {
        op = Next().text;
      } else if (IsName("in")) {
        Next();
        op = "in";
      } else if (IsName("not") && IsName("in", 1)) {
        Next();
        Next();
        op = "notin";
      } else {
        break;
      }
      GZ_ASSIGN_OR_RETURN(ExprPtr operand, ParseMath1());
      if (!cmp) {
        cmp = Make(Expr::Kind::kCompare, p);
        cmp->children.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->children.push_back(std::move(operand));
    }
    return cmp ? std::move(cmp) : std::move(first);
  }
  Expected<ExprPtr> ParseMath1() {
    GZ_ASSIGN_OR_RETURN(ExprPtr l, ParseConcat());
    while (IsOp("+") || IsOp("-")) {
      Token op = Next();
      GZ_ASSIGN_OR_RETURN(ExprPtr r, ParseConcat());
      GZ_ASSIGN_OR_RETURN(l, Binary(std::move(l), op, std::move(r)));
    }
    return l;
  }
  Expected<ExprPtr> ParseConcat() {
    GZ_ASSIGN_OR_RETURN(ExprPtr l, ParseMath2());
    while (IsOp("~")) {
      Token op = Next();
      GZ_ASSIGN_OR_RETURN(ExprPtr r, ParseMath2());
      GZ_ASSIGN_OR_RETURN(l, Binary(std::move(l), op, std::move(r)));
    }
    return l;
  }
  Expected<ExprPtr> ParseMath2() {
    GZ_ASSIGN_OR_RETURN(ExprPtr l, ParsePow());
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      Token op = Next();
      GZ_ASSIGN_OR_RETURN(ExprPtr r, ParsePow());
      GZ_ASSIGN_OR_RETURN(l, Binary(std::move(l), op, std::move(r)));
    }
    return l;
  }
  Expected<ExprPtr> ParsePow() {
    GZ_ASSIGN_OR_RETURN(ExprPtr l, ParseUnary());
    while (IsOp("**")) {
      Token op = Next();
      GZ_ASSIGN_OR_RETURN(ExprPtr r, ParseUnary());
      GZ_ASSIGN_OR_RETURN(l, Binary(std::move(l), op, std::move(r)));
    }
    return l;
  }
  Expected<ExprPtr> ParseUnary(bool with_filter = true) {
    // Nesting (parentheses, unary minus) is bounded so that a hostile template cannot exhaust
    // the stack.
    if (++depth_ > kMaxDepth) return Error("expression nested too deeply");
    Expected<ExprPtr> e = ParseUnaryInner(with_filter);
    --depth_;
    return e;
  }

  Expected<ExprPtr> ParseUnaryInner(bool with_filter) {
    if (IsOp("-") || IsOp("+")) {
      Token op = Next();
      GZ_ASSIGN_OR_RETURN(ExprPtr operand, ParseUnary(false));
      ExprPtr u = Make(Expr::Kind::kUnary, PosOf(op));
      u->name = op.text;
      u->children.push_back(std::move(operand));
      if (with_filter) return ParseFilters(std::move(u));
      return u;
    }
    GZ_ASSIGN_OR_RETURN(ExprPtr e, ParsePrimary());
    GZ_ASSIGN_OR_RETURN(e, ParsePostfix(std::move(e)));
    if (with_filter) return ParseFilters(std::move(e));
    return e;
  }

  Expected<ExprPtr> ParsePrimary() {
    const Token& t = Peek();
    Pos p = PosOf(t);
    switch (t.type) {
      case Token::Type::kName: {
        std::string n = Next().text;
        ExprPtr e = Make(Expr::Kind::kLiteral, p);
        if (n == "true" || n == "True") {
          e->literal = Value(true);
        } else if (n == "false" || n == "False") {
          e->literal = Value(false);
        } else if (n == "none" || n == "None") {
          e->literal = Value(None{});
        } else {
          e->kind = Expr::Kind::kName;
          e->name = n;
        }
        return e;
      }
      case Token::Type::kString: {
        std::string s;
        while (Peek().type == Token::Type::kString) s += Next().value.AsString();
        ExprPtr e = Make(Expr::Kind::kLiteral, p);
        e->literal = Value(std::move(s));
        return e;
      }
      case Token::Type::kInt:
      case Token::Type::kFloat: {
        ExprPtr e = Make(Expr::Kind::kLiteral, p);
        e->literal = Next().value;
        return e;
      }
      case Token::Type::kOp:
        if (t.text == "(") {
          Next();
          if (IsOp(")")) {
            Next();
            return Make(Expr::Kind::kTuple, p);
          }
          GZ_ASSIGN_OR_RETURN(ExprPtr e, ParseTuple());
          GZ_RETURN_IF_ERROR(ExpectOp(")"));
          return e;
        }
        if (t.text == "[") {
          Next();
          ExprPtr e = Make(Expr::Kind::kList, p);
          while (!IsOp("]")) {
            if (!e->children.empty()) GZ_RETURN_IF_ERROR(ExpectOp(","));
            if (IsOp("]")) break;
            GZ_ASSIGN_OR_RETURN(ExprPtr item, ParseExpression());
            e->children.push_back(std::move(item));
          }
          Next();
          return e;
        }
        if (t.text == "{") {
          Next();
          ExprPtr e = Make(Expr::Kind::kDict, p);
          while (!IsOp("}")) {
            if (!e->children.empty()) GZ_RETURN_IF_ERROR(ExpectOp(","));
            if (IsOp("}")) break;
            GZ_ASSIGN_OR_RETURN(ExprPtr key, ParseExpression());
            GZ_RETURN_IF_ERROR(ExpectOp(":"));
            GZ_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression());
            e->children.push_back(std::move(key));
            e->children.push_back(std::move(value));
          }
          Next();
          return e;
        }
        break;
      default:
        break;
    }
    return Error("expected an expression");
  }

  Status ParseCallArgs(Expr& call) {
    GZ_RETURN_IF_ERROR(ExpectOp("("));
    bool first = true;
    while (!IsOp(")")) {
      if (!first) GZ_RETURN_IF_ERROR(ExpectOp(","));
      first = false;
      if (IsOp(")")) break;
      if (IsOp("*") || IsOp("**")) return Error("*args and **kwargs are not supported");
      if (Peek().type == Token::Type::kName && IsOp("=", 1)) {
        std::string name = Next().text;
        Next();
        GZ_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression());
        call.keyword.emplace_back(std::move(name), std::move(value));
      } else {
        if (!call.keyword.empty()) return Error("positional argument after keyword argument");
        GZ_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression());
        call.children.push_back(std::move(value));
      }
    }
    Next();
    return Status::Ok();
  }

  Expected<ExprPtr> ParsePostfix(ExprPtr e) {
    while (true) {
      if (IsOp(".")) {
        Pos p = PosOf(Next());
        ExprPtr g = Make(Expr::Kind::kGetattr, p);
        if (Peek().type == Token::Type::kInt) {
          g->kind = Expr::Kind::kGetitem;
          g->children.push_back(std::move(e));
          ExprPtr index = Make(Expr::Kind::kLiteral, p);
          index->literal = Next().value;
          g->children.push_back(std::move(index));
        } else {
          GZ_ASSIGN_OR_RETURN(g->name, ExpectName());
          g->children.push_back(std::move(e));
        }
        e = std::move(g);
      } else if (IsOp("[")) {
        Pos p = PosOf(Next());
        ExprPtr parts[3];
        bool is_slice = false;
        for (int k = 0; k < 3; ++k) {
          if (!IsOp(":") && !IsOp("]")) {
            GZ_ASSIGN_OR_RETURN(parts[k], ParseExpression());
          }
          if (IsOp(":") && k < 2) {
            Next();
            is_slice = true;
          } else {
            break;
          }
        }
        GZ_RETURN_IF_ERROR(ExpectOp("]"));
        ExprPtr g = Make(is_slice ? Expr::Kind::kSlice : Expr::Kind::kGetitem, p);
        g->children.push_back(std::move(e));
        if (is_slice) {
          for (auto& part : parts) g->children.push_back(std::move(part));
        } else {
          if (!parts[0]) return Error("expected an index");
          g->children.push_back(std::move(parts[0]));
        }
        e = std::move(g);
      } else if (IsOp("(")) {
        ExprPtr c = Make(Expr::Kind::kCall, e->pos);
        c->children.push_back(std::move(e));
        GZ_RETURN_IF_ERROR(ParseCallArgs(*c));
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  // Filters (| name(args)) and tests (is [not] name args) after a unary expression.
  Expected<ExprPtr> ParseFilters(ExprPtr e) {
    while (true) {
      if (IsOp("|")) {
        Pos p = PosOf(Next());
        ExprPtr f = Make(Expr::Kind::kFilter, p);
        GZ_ASSIGN_OR_RETURN(f->name, ExpectName());
        if (!IsFilter(f->name)) {
          return Unimplemented(FormatPos(p) + ": unsupported filter '" + f->name + "'");
        }
        f->children.push_back(std::move(e));
        if (IsOp("(")) GZ_RETURN_IF_ERROR(ParseCallArgs(*f));
        e = std::move(f);
      } else if (IsName("is")) {
        Pos p = PosOf(Next());
        ExprPtr t = Make(Expr::Kind::kTest, p);
        if (IsName("not")) {
          Next();
          t->negated = true;
        }
        GZ_ASSIGN_OR_RETURN(t->name, ExpectName());
        if (!IsTest(t->name)) {
          return Unimplemented(FormatPos(p) + ": unsupported test '" + t->name + "'");
        }
        t->children.push_back(std::move(e));
        if (IsOp("(")) {
          GZ_RETURN_IF_ERROR(ParseCallArgs(*t));
        } else if (Peek().type == Token::Type::kInt || Peek().type == Token::Type::kFloat ||
                   Peek().type == Token::Type::kString || IsOp("[") || IsOp("{") ||
                   (Peek().type == Token::Type::kName && !IsName("else") && !IsName("or") &&
                    !IsName("and") && !IsName("if") && !IsName("in") && !IsName("not") &&
                    !IsName("is"))) {
          // One argument without parentheses: "is sameas false", "is divisibleby 3".
          GZ_ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
          GZ_ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
          t->children.push_back(std::move(arg));
        }
        e = std::move(t);
      } else if (IsOp("(")) {
        ExprPtr c = Make(Expr::Kind::kCall, PosOf(Peek()));
        c->children.push_back(std::move(e));
        GZ_RETURN_IF_ERROR(ParseCallArgs(*c));
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

 private:
  static constexpr int kMaxDepth = 200;
  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  const Locator& loc_;
};

class TemplateParser {
 public:
  TemplateParser(std::vector<Segment> segments, const Locator& loc)
      : segments_(std::move(segments)), loc_(loc) {}

  Expected<Body> ParseAll() {
    Body body;
    std::string end;
    GZ_RETURN_IF_ERROR(ParseBody({}, body, end));
    return body;
  }

 private:
  NodePtr MakeNode(Node::Kind kind, Pos pos) {
    auto n = std::make_unique<Node>();
    n->kind = kind;
    n->pos = pos;
    return n;
  }

  // Parses nodes until a block tag whose first word is in `ends`; that word is stored in `end`
  // and the tag's parser (positioned after the word) in `end_parser_`.
  Status ParseBody(const std::set<std::string>& ends, Body& body, std::string& end) {
    while (index_ < segments_.size()) {
      const Segment& seg = segments_[index_++];
      Pos pos = loc_.At(seg.offset);
      if (seg.kind == Segment::Kind::kText) {
        NodePtr n = MakeNode(Node::Kind::kText, pos);
        n->text = seg.text;
        body.push_back(std::move(n));
        continue;
      }
      GZ_ASSIGN_OR_RETURN(std::vector<Token> tokens, Tokenize(seg.text, seg.offset, loc_));
      auto p = std::make_unique<ExprParser>(std::move(tokens), loc_);
      if (seg.kind == Segment::Kind::kVariable) {
        NodePtr n = MakeNode(Node::Kind::kOutput, pos);
        GZ_ASSIGN_OR_RETURN(n->expr, p->ParseTuple());
        GZ_RETURN_IF_ERROR(p->ExpectEnd());
        body.push_back(std::move(n));
        continue;
      }
      if (p->Peek().type != Token::Type::kName) return p->Error("expected a statement name");
      Pos tag_pos = p->PosOf(p->Peek());
      std::string word = p->Next().text;
      if (ends.count(word)) {
        end = word;
        end_parser_ = std::move(p);
        return Status::Ok();
      }
      GZ_ASSIGN_OR_RETURN(NodePtr n, ParseStatement(word, tag_pos, *p));
      if (n) body.push_back(std::move(n));
    }
    return Status::Ok();
  }

  Status ParseBlockUntil(const std::set<std::string>& ends, Body& body, std::string& end,
                         const std::string& opener, Pos pos) {
    if (++depth_ > kMaxDepth) {
      return Unimplemented(FormatPos(pos) + ": blocks nested deeper than " +
                           std::to_string(kMaxDepth));
    }
    Status s = ParseBody(ends, body, end);
    --depth_;
    GZ_RETURN_IF_ERROR(s);
    if (end.empty()) {
      return Unimplemented(FormatPos(pos) + ": '" + opener +
                           "' block is never closed (missing {% " + *ends.rbegin() + " %})");
    }
    return Status::Ok();
  }

  Expected<NodePtr> ParseStatement(const std::string& word, Pos pos, ExprParser& p) {
    if (word == "if") {
      NodePtr n = MakeNode(Node::Kind::kIf, pos);
      GZ_ASSIGN_OR_RETURN(ExprPtr cond, p.ParseTuple());
      GZ_RETURN_IF_ERROR(p.ExpectEnd());
      while (true) {
        Body body;
        std::string end;
        GZ_RETURN_IF_ERROR(ParseBlockUntil({"elif", "else", "endif"}, body, end, "if", pos));
        n->branches.emplace_back(std::move(cond), std::move(body));
        ExprParser& ep = *end_parser_;
        if (end == "elif") {
          GZ_ASSIGN_OR_RETURN(cond, ep.ParseTuple());
          GZ_RETURN_IF_ERROR(ep.ExpectEnd());
        } else if (end == "else") {
          GZ_RETURN_IF_ERROR(ep.ExpectEnd());
          Body else_body;
          GZ_RETURN_IF_ERROR(ParseBlockUntil({"endif"}, else_body, end, "if", pos));
          GZ_RETURN_IF_ERROR(end_parser_->ExpectEnd());
          n->branches.emplace_back(nullptr, std::move(else_body));
          break;
        } else {
          GZ_RETURN_IF_ERROR(ep.ExpectEnd());
          break;
        }
      }
      return n;
    }
    if (word == "for") {
      NodePtr n = MakeNode(Node::Kind::kFor, pos);
      do {
        if (!n->targets.empty()) p.Next();
        GZ_ASSIGN_OR_RETURN(std::string target, p.ExpectName());
        n->targets.push_back(target);
      } while (p.IsOp(","));
      if (!p.IsName("in")) return p.Error("expected 'in'");
      p.Next();
      GZ_ASSIGN_OR_RETURN(n->expr, p.ParseTuple(/*with_cond=*/false));
      if (p.IsName("if")) {
        p.Next();
        GZ_ASSIGN_OR_RETURN(n->condition, p.ParseExpression());
      }
      if (p.IsName("recursive")) return p.Error("recursive loops are not supported");
      GZ_RETURN_IF_ERROR(p.ExpectEnd());
      std::string end;
      GZ_RETURN_IF_ERROR(ParseBlockUntil({"else", "endfor"}, n->body, end, "for", pos));
      GZ_RETURN_IF_ERROR(end_parser_->ExpectEnd());
      if (end == "else") {
        GZ_RETURN_IF_ERROR(ParseBlockUntil({"endfor"}, n->else_body, end, "for", pos));
        GZ_RETURN_IF_ERROR(end_parser_->ExpectEnd());
      }
      return n;
    }
    if (word == "set") {
      NodePtr n = MakeNode(Node::Kind::kSet, pos);
      GZ_ASSIGN_OR_RETURN(std::string target, p.ExpectName());
      n->targets.push_back(target);
      if (p.IsOp(".")) {
        p.Next();
        GZ_ASSIGN_OR_RETURN(n->attr, p.ExpectName());
      } else {
        while (p.IsOp(",")) {
          p.Next();
          GZ_ASSIGN_OR_RETURN(std::string more, p.ExpectName());
          n->targets.push_back(more);
        }
      }
      if (p.AtEnd() && n->attr.empty() && n->targets.size() == 1) {
        n->kind = Node::Kind::kSetBlock;
        std::string end;
        GZ_RETURN_IF_ERROR(ParseBlockUntil({"endset"}, n->body, end, "set", pos));
        GZ_RETURN_IF_ERROR(end_parser_->ExpectEnd());
        return n;
      }
      if (p.IsOp("|")) return p.Error("filtered set blocks are not supported");
      GZ_RETURN_IF_ERROR(p.ExpectOp("="));
      GZ_ASSIGN_OR_RETURN(n->expr, p.ParseTuple());
      GZ_RETURN_IF_ERROR(p.ExpectEnd());
      return n;
    }
    if (word == "macro") {
      NodePtr n = MakeNode(Node::Kind::kMacro, pos);
      GZ_ASSIGN_OR_RETURN(n->name, p.ExpectName());
      GZ_RETURN_IF_ERROR(ParseParams(p, *n));
      GZ_RETURN_IF_ERROR(p.ExpectEnd());
      std::string end;
      GZ_RETURN_IF_ERROR(ParseBlockUntil({"endmacro"}, n->body, end, "macro", pos));
      if (end_parser_->Peek().type == Token::Type::kName) end_parser_->Next();
      GZ_RETURN_IF_ERROR(end_parser_->ExpectEnd());
      return n;
    }
    if (word == "call") {
      NodePtr n = MakeNode(Node::Kind::kCallBlock, pos);
      if (p.IsOp("(")) GZ_RETURN_IF_ERROR(ParseParams(p, *n));
      GZ_ASSIGN_OR_RETURN(n->expr, p.ParseExpression());
      if (n->expr->kind != Expr::Kind::kCall) return p.Error("expected a macro call");
      GZ_RETURN_IF_ERROR(p.ExpectEnd());
      std::string end;
      GZ_RETURN_IF_ERROR(ParseBlockUntil({"endcall"}, n->body, end, "call", pos));
      GZ_RETURN_IF_ERROR(end_parser_->ExpectEnd());
      return n;
    }
    if (word == "break" || word == "continue") {
      GZ_RETURN_IF_ERROR(p.ExpectEnd());
      return MakeNode(word == "break" ? Node::Kind::kBreak : Node::Kind::kContinue, pos);
    }
    if (word == "filter") {
      NodePtr n = MakeNode(Node::Kind::kFilterBlock, pos);
      n->expr = p.Make(Expr::Kind::kFilter, p.PosOf(p.Peek()));
      n->expr->children.push_back(p.Make(Expr::Kind::kLiteral, pos));
      GZ_ASSIGN_OR_RETURN(n->expr->name, p.ExpectName());
      if (!IsFilter(n->expr->name)) {
        return Unimplemented(FormatPos(n->expr->pos) + ": unsupported filter '" + n->expr->name +
                             "'");
      }
      if (p.IsOp("(")) GZ_RETURN_IF_ERROR(p.ParseCallArgs(*n->expr));
      GZ_RETURN_IF_ERROR(p.ExpectEnd());
      std::string end;
      GZ_RETURN_IF_ERROR(ParseBlockUntil({"endfilter"}, n->body, end, "filter", pos));
      GZ_RETURN_IF_ERROR(end_parser_->ExpectEnd());
      return n;
    }
    if (word == "generation") {
      // transformers' assistant-mask marker: renders its body in place.
      NodePtr n = MakeNode(Node::Kind::kScope, pos);
      GZ_RETURN_IF_ERROR(p.ExpectEnd());
      std::string end;
      GZ_RETURN_IF_ERROR(ParseBlockUntil({"endgeneration"}, n->body, end, "generation", pos));
      GZ_RETURN_IF_ERROR(end_parser_->ExpectEnd());
      return n;
    }
    return Unimplemented(FormatPos(pos) + ": unsupported statement '" + word + "'");
  }

  Status ParseParams(ExprParser& p, Node& n) {
    GZ_RETURN_IF_ERROR(p.ExpectOp("("));
    while (!p.IsOp(")")) {
      if (!n.params.empty()) GZ_RETURN_IF_ERROR(p.ExpectOp(","));
      if (p.IsOp(")")) break;
      GZ_ASSIGN_OR_RETURN(std::string name, p.ExpectName());
      n.params.push_back(name);
      ExprPtr def;
      if (p.IsOp("=")) {
        p.Next();
        GZ_ASSIGN_OR_RETURN(def, p.ParseExpression());
      }
      n.defaults.push_back(std::move(def));
    }
    p.Next();
    return Status::Ok();
  }

  static constexpr int kMaxDepth = 100;
  std::vector<Segment> segments_;
  size_t index_ = 0;
  int depth_ = 0;
  const Locator& loc_;
  std::unique_ptr<ExprParser> end_parser_;
};

}  // namespace

Expected<Body> ParseTemplate(std::string_view source) {
  std::string src = NormalizeSource(source);
  Locator loc(src);
  GZ_ASSIGN_OR_RETURN(std::vector<Segment> segments, SplitTags(src, loc));
  TemplateParser parser(std::move(segments), loc);
  return parser.ParseAll();
}

}  // namespace gizllm::jinja
