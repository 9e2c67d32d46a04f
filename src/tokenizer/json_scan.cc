#include "tokenizer/json_scan.h"

#include <cstdlib>
#include <cstring>

#include "tokenizer/unicode.h"

namespace gizllm::tok {

namespace {
int Hex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}
}  // namespace

bool JsonScanner::String(std::string* out) {
  if (!Consume('"')) return false;
  out->clear();
  const char* p = text_.data() + pos_;
  const char* end = text_.data() + text_.size();
  while (true) {
    // Copy the run up to the next quote or backslash.
    const char* q = p;
    while (q < end && *q != '"' && *q != '\\') ++q;
    out->append(p, q);
    if (q >= end) return false;
    if (*q == '"') {
      pos_ = static_cast<size_t>(q + 1 - text_.data());
      return true;
    }
    // An escape.
    if (q + 1 >= end) return false;
    char e = q[1];
    p = q + 2;
    switch (e) {
      case '"':
        out->push_back('"');
        break;
      case '\\':
        out->push_back('\\');
        break;
      case '/':
        out->push_back('/');
        break;
      case 'b':
        out->push_back('\b');
        break;
      case 'f':
        out->push_back('\f');
        break;
      case 'n':
        out->push_back('\n');
        break;
      case 'r':
        out->push_back('\r');
        break;
      case 't':
        out->push_back('\t');
        break;
      case 'u': {
        auto read4 = [&](const char* at, char32_t* v) {
          if (end - at < 4) return false;
          *v = 0;
          for (int k = 0; k < 4; ++k) {
            int h = Hex(at[k]);
            if (h < 0) return false;
            *v = *v * 16 + h;
          }
          return true;
        };
        char32_t cp;
        if (!read4(p, &cp)) return false;
        p += 4;
        if (cp >= 0xD800 && cp < 0xDC00) {
          char32_t lo;
          if (end - p >= 6 && p[0] == '\\' && p[1] == 'u' && read4(p + 2, &lo) && lo >= 0xDC00 &&
              lo < 0xE000) {
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            p += 6;
          } else {
            return false;  // a lone surrogate is not text
          }
        } else if (cp >= 0xDC00 && cp < 0xE000) {
          return false;
        }
        AppendUtf8(cp, out);
        break;
      }
      default:
        return false;
    }
  }
}

bool JsonScanner::Number(double* out) {
  SkipSpace();
  const char* begin = text_.data() + pos_;
  char* stop = nullptr;
  // strtod needs a terminator; numbers in JSON end at a delimiter, so copy a short window.
  char buf[64];
  size_t n = 0;
  while (pos_ + n < text_.size() && n + 1 < sizeof(buf)) {
    char c = begin[n];
    if (!((c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E')) {
      break;
    }
    buf[n++] = c;
  }
  if (n == 0) return false;
  buf[n] = 0;
  *out = std::strtod(buf, &stop);
  if (stop != buf + n) return false;
  pos_ += n;
  return true;
}

bool JsonScanner::Skip() {
  char c = Peek();
  const char* p = text_.data() + pos_;
  const char* end = text_.data() + text_.size();
  if (c == '"' || c == '{' || c == '[') {
    // Strings and containers: jump from one interesting character to the next.
    int depth = 0;
    bool in_string = false;
    while (p < end) {
      if (in_string) {
        const char* q = static_cast<const char*>(std::memchr(p, '"', end - p));
        if (q == nullptr) return false;
        // The quote ends the string unless an odd number of backslashes precede it.
        size_t backslashes = 0;
        while (q - backslashes > p && q[-1 - static_cast<ptrdiff_t>(backslashes)] == '\\') {
          ++backslashes;
        }
        p = q + 1;
        if (backslashes % 2 == 1) continue;
        in_string = false;
        if (depth == 0) break;
        continue;
      }
      char d = *p++;
      if (d == '"') {
        in_string = true;
      } else if (d == '{' || d == '[') {
        ++depth;
      } else if (d == '}' || d == ']') {
        if (--depth == 0) break;
      }
    }
    if (in_string || depth != 0) return false;
    pos_ = static_cast<size_t>(p - text_.data());
    return true;
  }
  // A number or a literal: up to the next delimiter.
  size_t start = pos_;
  while (pos_ < text_.size() && text_[pos_] != ',' && text_[pos_] != '}' && text_[pos_] != ']' &&
         text_[pos_] != ' ' && text_[pos_] != '\n' && text_[pos_] != '\r' && text_[pos_] != '\t') {
    ++pos_;
  }
  return pos_ > start;
}

Expected<JsonRange> FindMember(std::string_view text, JsonRange object, std::string_view key) {
  JsonScanner s(text);
  s.set_pos(object.begin);
  if (!s.Consume('{')) return InvalidArgument("expected an object");
  std::string name;
  if (s.Consume('}')) return JsonRange{};
  while (true) {
    if (!s.String(&name) || !s.Consume(':')) {
      return InvalidArgument("bad JSON near byte " + std::to_string(s.pos()));
    }
    s.Peek();
    size_t begin = s.pos();
    if (!s.Skip()) return InvalidArgument("bad JSON near byte " + std::to_string(s.pos()));
    if (name == key) return JsonRange{begin, s.pos()};
    if (s.Consume(',')) continue;
    if (s.Consume('}')) return JsonRange{};
    return InvalidArgument("bad JSON near byte " + std::to_string(s.pos()));
  }
}

}  // namespace gizllm::tok
