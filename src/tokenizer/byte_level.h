// GPT-2's byte-level alphabet: each byte is shown as a printable code point so that BPE
// vocabularies hold only visible characters ("Ġ" is the byte 0x20).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace gizllm::tok {

class ByteLevelAlphabet {
 public:
  static const ByteLevelAlphabet& Get();

  // The UTF-8 text of the code point that stands for byte b (1 or 2 bytes long).
  std::string_view Char(uint8_t b) const { return {chars_[b].data(), lengths_[b]}; }
  // Appends each byte of `bytes` as its character.
  void Encode(std::string_view bytes, std::string* out) const {
    for (unsigned char b : bytes) out->append(chars_[b].data(), lengths_[b]);
  }
  // The byte a code point stands for, or -1 if it is not in the alphabet.
  int Byte(char32_t cp) const { return cp < byte_of_.size() ? byte_of_[cp] : -1; }

 private:
  ByteLevelAlphabet();
  std::array<std::array<char, 2>, 256> chars_{};
  std::array<uint8_t, 256> lengths_{};
  std::array<int16_t, 324> byte_of_{};
};

}  // namespace gizllm::tok
