// UTF-8 and Unicode helpers the tokenizer components share: decoding, validation, the lossy
// conversion Rust's String::from_utf8_lossy does, character classes, normalization forms.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace gizllm::tok {

// Decodes the code point at text[*i] and advances *i past it. Call only on valid UTF-8.
inline char32_t NextCodePoint(std::string_view text, size_t* i) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  size_t p = *i;
  unsigned char c = s[p];
  if (c < 0x80) {
    *i = p + 1;
    return c;
  }
  if (c < 0xE0) {
    *i = p + 2;
    return ((c & 0x1F) << 6) | (s[p + 1] & 0x3F);
  }
  if (c < 0xF0) {
    *i = p + 3;
    return ((c & 0x0F) << 12) | ((s[p + 1] & 0x3F) << 6) | (s[p + 2] & 0x3F);
  }
  *i = p + 4;
  return ((c & 0x07) << 18) | ((s[p + 1] & 0x3F) << 12) | ((s[p + 2] & 0x3F) << 6) |
         (s[p + 3] & 0x3F);
}

// Length in bytes of the UTF-8 sequence that starts with `lead` (valid UTF-8 only).
inline size_t Utf8Length(unsigned char lead) {
  return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}

// Decodes the last code point of non-empty valid UTF-8 text.
char32_t LastCodePoint(std::string_view text);

void AppendUtf8(char32_t cp, std::string* out);

// Byte offset of the first byte that makes `text` invalid UTF-8, or npos if it is valid.
size_t FindInvalidUtf8(std::string_view text);

// Valid UTF-8 where each maximal invalid subsequence is replaced by U+FFFD (Rust's rule).
std::string Utf8Lossy(std::string_view bytes);

// The Unicode White_Space property (Rust's char::is_whitespace).
bool IsWhitespace(char32_t cp);
// Rust's char::is_alphanumeric: alphabetic or numeric (Nd, Nl, No).
bool IsAlphanumeric(char32_t cp);
// The regex class \w: alphabetic, marks, decimal digits, connector punctuation, joiners.
bool IsWordChar(char32_t cp);
// Unicode general category P* (punctuation).
bool IsPunctuation(char32_t cp);
// Rust's char::is_control (Cc) and the Cf/Cn/Co classes BertNormalizer treats as control.
bool IsControl(char32_t cp);
bool IsOtherCategory(char32_t cp);  // C*: Cc, Cf, Cn, Co, Cs
// Cc, Cf, Co: what BertNormalizer's clean_text removes (its tables leave Cn code points alone).
bool IsControlOrFormat(char32_t cp);
bool IsMark(char32_t cp);           // Mn
bool IsCombiningMark(char32_t cp);  // M*: Mn, Mc, Me
bool IsNumeric(char32_t cp);        // N*
bool IsDecimalDigit(char32_t cp);   // Nd
bool IsAlphabetic(char32_t cp);     // L* or Nl (approximates the Alphabetic property)

// Normalization forms (utf8proc). Inputs must be valid UTF-8.
std::string Nfc(std::string_view text);
std::string Nfd(std::string_view text);
std::string Nfkc(std::string_view text);
std::string Nfkd(std::string_view text);

// Full lowercase mapping as Rust's str::to_lowercase computes it.
std::string Lowercase(std::string_view text);

}  // namespace gizllm::tok
