#include "tokenizer/precompiled.h"

#include <utf8proc.h>

#include <cstring>
#include <optional>
#include <vector>

#include "tokenizer/unicode.h"

namespace gizllm::tok {
namespace {

// Standard base64 (with padding, no line breaks); nullopt if malformed.
std::optional<std::string> DecodeBase64(std::string_view in) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::string out;
  out.reserve(in.size() / 4 * 3);
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    if (c == '=') break;
    int v = value(c);
    if (v < 0) return std::nullopt;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  return out;
}

// The character map: a darts-clone double array whose values are offsets into a blob of
// NUL-terminated replacements. Hugging Face applies it per grapheme (if shorter than 6 bytes) and
// otherwise per character, taking the shortest key that prefixes the chunk.
class PrecompiledNormalizer : public Normalizer {
 public:
  PrecompiledNormalizer(std::vector<uint32_t> units, std::string replacements)
      : units_(std::move(units)), replacements_(std::move(replacements)) {}

  void Normalize(std::string* text) const override {
    std::string out;
    out.reserve(text->size());
    const std::string& t = *text;
    size_t i = 0;
    utf8proc_int32_t state = 0;
    while (i < t.size()) {
      // One extended grapheme cluster: [i, end).
      size_t end = i;
      char32_t previous = NextCodePoint(t, &end);
      while (end < t.size()) {
        size_t k = end;
        char32_t next = NextCodePoint(t, &k);
        if (utf8proc_grapheme_break_stateful(static_cast<utf8proc_int32_t>(previous),
                                             static_cast<utf8proc_int32_t>(next), &state)) {
          break;
        }
        previous = next;
        end = k;
      }
      state = 0;
      std::string_view grapheme(t.data() + i, end - i);
      i = end;
      if (grapheme.size() < 6) {
        if (auto r = Transform(grapheme)) {
          out += *r;
          continue;
        }
      }
      size_t c = 0;
      while (c < grapheme.size()) {
        size_t start = c;
        c += Utf8Length(static_cast<unsigned char>(grapheme[c]));
        std::string_view ch = grapheme.substr(start, c - start);
        if (auto r = Transform(ch)) {
          out += *r;
        } else {
          out += ch;
        }
      }
    }
    *text = std::move(out);
  }

 private:
  static bool HasLeaf(uint32_t u) { return (u >> 8) & 1; }
  static uint32_t Value(uint32_t u) { return u & ((1u << 31) - 1); }
  static uint32_t Label(uint32_t u) { return u & ((1u << 31) | 0xFF); }
  static uint32_t Offset(uint32_t u) { return (u >> 10) << ((u & (1u << 9)) >> 6); }

  // The replacement of the shortest key that prefixes `chunk`.
  std::optional<std::string_view> Transform(std::string_view chunk) const {
    if (units_.empty()) return std::nullopt;
    size_t pos = Offset(units_[0]);
    for (unsigned char c : chunk) {
      pos ^= c;
      if (pos >= units_.size()) return std::nullopt;
      uint32_t unit = units_[pos];
      if (Label(unit) != c) return std::nullopt;
      pos ^= Offset(unit);
      if (pos >= units_.size()) return std::nullopt;
      if (HasLeaf(unit)) {
        size_t begin = Value(units_[pos]);
        if (begin >= replacements_.size()) return std::nullopt;
        size_t stop = replacements_.find('\0', begin);
        if (stop == std::string::npos) stop = replacements_.size();
        return std::string_view(replacements_).substr(begin, stop - begin);
      }
    }
    return std::nullopt;
  }

  std::vector<uint32_t> units_;
  std::string replacements_;
};

}  // namespace

Expected<std::unique_ptr<Normalizer>> MakePrecompiledNormalizer(const Json& j,
                                                                const std::string& where) {
  const std::string field = "field '" + where + ".precompiled_charsmap'";
  auto it = j.find("precompiled_charsmap");
  if (it == j.end() || it->is_null()) {
    // No map: the normalizer changes nothing.
    return std::unique_ptr<Normalizer>(new PrecompiledNormalizer({}, ""));
  }
  if (!it->is_string()) return InvalidArgument(field + ": expected a base64 string");
  auto blob = DecodeBase64(it->get_ref<const std::string&>());
  if (!blob || blob->size() < 4) return InvalidArgument(field + ": expected base64 of a charsmap");
  uint32_t trie_bytes;
  std::memcpy(&trie_bytes, blob->data(), 4);
  if (trie_bytes % 4 != 0 || 4 + static_cast<size_t>(trie_bytes) > blob->size()) {
    return InvalidArgument(field + ": trie size " + std::to_string(trie_bytes) +
                           " does not fit the map");
  }
  std::vector<uint32_t> units(trie_bytes / 4);
  std::memcpy(units.data(), blob->data() + 4, trie_bytes);
  std::string replacements = blob->substr(4 + trie_bytes);
  if (FindInvalidUtf8(replacements) != std::string::npos) {
    return InvalidArgument(field + ": replacements are not valid UTF-8");
  }
  return std::unique_ptr<Normalizer>(
      new PrecompiledNormalizer(std::move(units), std::move(replacements)));
}

}  // namespace gizllm::tok
