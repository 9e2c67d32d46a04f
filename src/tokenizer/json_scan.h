// A small, fast JSON scanner for the big parts of tokenizer.json (the model's vocab and merges):
// it reads strings, numbers and nesting straight from the text without building a document, so a
// 33 MB file loads in a fraction of a second. Everything else goes through nlohmann::json.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "core/status.h"

namespace gizllm::tok {

class JsonScanner {
 public:
  explicit JsonScanner(std::string_view text) : text_(text) {}

  size_t pos() const { return pos_; }
  void set_pos(size_t pos) { pos_ = pos; }
  bool at_end() { return SkipSpace() >= text_.size(); }
  // The next non-space character (0 at the end), without consuming it.
  char Peek() {
    SkipSpace();
    return pos_ < text_.size() ? text_[pos_] : 0;
  }
  // Consumes `c` after optional space; false if the next character is something else.
  bool Consume(char c) {
    if (Peek() != c) return false;
    ++pos_;
    return true;
  }
  // Reads a string at the cursor, unescaped into *out.
  bool String(std::string* out);
  // Reads a number at the cursor.
  bool Number(double* out);
  // Skips one value of any kind.
  bool Skip();

 private:
  size_t SkipSpace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n' ||
                                   text_[pos_] == '\r' || text_[pos_] == '\t')) {
      ++pos_;
    }
    return pos_;
  }

  std::string_view text_;
  size_t pos_ = 0;
};

// Byte ranges [begin, end) of a value in the text; empty when absent.
struct JsonRange {
  size_t begin = 0, end = 0;
  bool empty() const { return end == begin; }
};

// Finds the value of `key` in the object that starts at `object.begin`. Returns an error if the
// text there is not an object.
Expected<JsonRange> FindMember(std::string_view text, JsonRange object, std::string_view key);

}  // namespace gizllm::tok
