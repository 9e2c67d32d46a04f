#include "tokenizer/byte_level.h"

namespace gizllm::tok {

const ByteLevelAlphabet& ByteLevelAlphabet::Get() {
  static const ByteLevelAlphabet alphabet;
  return alphabet;
}

ByteLevelAlphabet::ByteLevelAlphabet() {
  byte_of_.fill(-1);
  // Printable Latin-1 bytes stand for themselves; the others map to 256, 257, ... in order.
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    int cp = printable ? b : next++;
    byte_of_[cp] = static_cast<int16_t>(b);
    if (cp < 0x80) {
      chars_[b][0] = static_cast<char>(cp);
      lengths_[b] = 1;
    } else {
      chars_[b][0] = static_cast<char>(0xC0 | (cp >> 6));
      chars_[b][1] = static_cast<char>(0x80 | (cp & 0x3F));
      lengths_[b] = 2;
    }
  }
}

}  // namespace gizllm::tok
