// What the harnesses share: splitting one fuzz input into the parts a parser reads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>

namespace gizllm::fuzz {

// Keeps a value the harness computed only to make the parser do its work.
inline void Use(size_t value) { asm volatile("" : : "r"(value)); }

// The input as text.
inline std::string_view AsText(const uint8_t* data, size_t size) {
  return std::string_view(reinterpret_cast<const char*>(data), size);
}

// Splits `text` at its first NUL byte: (before, after, whether there was one). JSON and the
// templates' text never need a raw NUL, so a seed is "file\0second part".
struct Parts {
  std::string_view first;
  std::string_view second;
  bool split = false;
};
inline Parts SplitAtNul(std::string_view text) {
  const size_t nul = text.find('\0');
  if (nul == std::string_view::npos) return {text, {}, false};
  return {text.substr(0, nul), text.substr(nul + 1), true};
}

}  // namespace gizllm::fuzz
