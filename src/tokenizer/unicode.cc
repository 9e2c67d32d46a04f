#include "tokenizer/unicode.h"

#include <utf8proc.h>

#include <cstdlib>

namespace gizllm::tok {

char32_t LastCodePoint(std::string_view text) {
  size_t i = text.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80) --i;
  return NextCodePoint(text, &i);
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

namespace {

// Length of the valid UTF-8 sequence at s[i..n), or, negated, the length of the maximal
// invalid prefix (at least 1) that a lossy conversion replaces by one U+FFFD.
int SequenceAt(const unsigned char* s, size_t i, size_t n) {
  unsigned char c = s[i];
  if (c < 0x80) return 1;
  int need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
  } else if (c == 0xE0) {
    need = 2, lo = 0xA0;
  } else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) {
    need = 2;
  } else if (c == 0xED) {
    need = 2, hi = 0x9F;
  } else if (c == 0xF0) {
    need = 3, lo = 0x90;
  } else if (c >= 0xF1 && c <= 0xF3) {
    need = 3;
  } else if (c == 0xF4) {
    need = 3, hi = 0x8F;
  } else {
    return -1;
  }
  for (int k = 1; k <= need; ++k) {
    if (i + k >= n) return -k;
    unsigned char d = s[i + k];
    if (k == 1 ? (d < lo || d > hi) : (d < 0x80 || d > 0xBF)) return -k;
  }
  return need + 1;
}

}  // namespace

size_t FindInvalidUtf8(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    // ASCII runs, eight bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      __builtin_memcpy(&w, s + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    int len = SequenceAt(s, i, n);
    if (len < 0) return i;
    i += len;
  }
  return std::string_view::npos;
}

std::string Utf8Lossy(std::string_view bytes) {
  size_t bad = FindInvalidUtf8(bytes);
  if (bad == std::string_view::npos) return std::string(bytes);
  const auto* s = reinterpret_cast<const unsigned char*>(bytes.data());
  size_t n = bytes.size();
  std::string out(bytes.substr(0, bad));
  size_t i = bad;
  while (i < n) {
    int len = SequenceAt(s, i, n);
    if (len > 0) {
      out.append(bytes.data() + i, len);
      i += len;
    } else {
      out += "\xEF\xBF\xBD";
      i += -len;
    }
  }
  return out;
}

bool IsWhitespace(char32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  if (cp < 0x85) return false;
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

namespace {
utf8proc_category_t Category(char32_t cp) {
  return static_cast<utf8proc_category_t>(utf8proc_category(static_cast<utf8proc_int32_t>(cp)));
}
}  // namespace

bool IsAlphabetic(char32_t cp) {
  if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  auto c = Category(cp);
  return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) || c == UTF8PROC_CATEGORY_NL;
}

bool IsNumeric(char32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  auto c = Category(cp);
  return c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO;
}

bool IsDecimalDigit(char32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return Category(cp) == UTF8PROC_CATEGORY_ND;
}

bool IsAlphanumeric(char32_t cp) { return IsAlphabetic(cp) || IsNumeric(cp); }

bool IsWordChar(char32_t cp) {
  if (cp < 0x80) {
    return ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') || (cp >= '0' && cp <= '9') || cp == '_';
  }
  if (cp == 0x200C || cp == 0x200D) return true;
  auto c = Category(cp);
  return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) ||
         (c >= UTF8PROC_CATEGORY_MN && c <= UTF8PROC_CATEGORY_ME) || c == UTF8PROC_CATEGORY_ND ||
         c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_PC;
}

bool IsPunctuation(char32_t cp) {
  auto c = Category(cp);
  return c >= UTF8PROC_CATEGORY_PC && c <= UTF8PROC_CATEGORY_PO;
}

bool IsControl(char32_t cp) { return Category(cp) == UTF8PROC_CATEGORY_CC; }

bool IsOtherCategory(char32_t cp) {
  auto c = Category(cp);
  return c == UTF8PROC_CATEGORY_CN || (c >= UTF8PROC_CATEGORY_CC && c <= UTF8PROC_CATEGORY_CO);
}

bool IsControlOrFormat(char32_t cp) {
  auto c = Category(cp);
  return c == UTF8PROC_CATEGORY_CC || c == UTF8PROC_CATEGORY_CF || c == UTF8PROC_CATEGORY_CO;
}

bool IsMark(char32_t cp) { return Category(cp) == UTF8PROC_CATEGORY_MN; }

bool IsCombiningMark(char32_t cp) {
  auto c = Category(cp);
  return c >= UTF8PROC_CATEGORY_MN && c <= UTF8PROC_CATEGORY_ME;
}

namespace {
std::string Map(std::string_view text, int options) {
  utf8proc_uint8_t* out = nullptr;
  utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                    static_cast<utf8proc_ssize_t>(text.size()), &out,
                                    static_cast<utf8proc_option_t>(options | UTF8PROC_STABLE));
  if (n < 0) return std::string(text);  // only on invalid input, which callers exclude
  std::string result(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
  std::free(out);
  return result;
}

// Text made only of code points below U+0300 is the same in NFC and NFD (nothing below it
// decomposes or composes); in UTF-8 those are exactly the bytes below 0xCC.
bool BelowCombining(std::string_view text) {
  for (unsigned char c : text) {
    if (c >= 0xCC) return false;
  }
  return true;
}

bool IsAscii(std::string_view text) {
  for (unsigned char c : text) {
    if (c >= 0x80) return false;
  }
  return true;
}
}  // namespace

std::string Nfc(std::string_view text) {
  if (BelowCombining(text)) return std::string(text);
  return Map(text, UTF8PROC_COMPOSE);
}

std::string Nfd(std::string_view text) {
  if (IsAscii(text)) return std::string(text);
  return Map(text, UTF8PROC_DECOMPOSE);
}

std::string Nfkc(std::string_view text) {
  if (IsAscii(text)) return std::string(text);
  return Map(text, UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
}

std::string Nfkd(std::string_view text) {
  if (IsAscii(text)) return std::string(text);
  return Map(text, UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
}

std::string Lowercase(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  char32_t previous = 0;
  while (i < text.size()) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      out.push_back(static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c));
      previous = c;
      ++i;
      continue;
    }
    char32_t cp = NextCodePoint(text, &i);
    if (cp == 0x130) {  // İ lowercases to i and a combining dot above
      out += "i\xCC\x87";
    } else if (cp == 0x3A3) {
      // Σ after a letter and not before one is a final sigma.
      bool after = false;
      if (i < text.size()) {
        size_t k = i;
        after = IsAlphabetic(NextCodePoint(text, &k));
      }
      AppendUtf8(IsAlphabetic(previous) && !after ? 0x3C2 : 0x3C3, &out);
    } else {
      AppendUtf8(static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))), &out);
    }
    previous = cp;
  }
  return out;
}

}  // namespace gizllm::tok
