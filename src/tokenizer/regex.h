// A compiled PCRE2 pattern (UTF, Unicode properties, JIT) that finds all matches in a text, with
// the semantics of the Oniguruma patterns Hugging Face tokenizers use (\s is White_Space).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace gizllm::tok {

class Regex {
 public:
  // Errors say where the pattern is wrong.
  static Expected<Regex> Compile(std::string_view pattern);

  // Appends the [start, end) byte ranges of the non-overlapping matches in `text`, left to right.
  // `text` must be valid UTF-8. Thread-safe.
  void FindAll(std::string_view text, std::vector<std::pair<size_t, size_t>>* matches) const;

 private:
  struct Code;
  std::shared_ptr<const Code> code_;
};

}  // namespace gizllm::tok
