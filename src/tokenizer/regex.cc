#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenizer/unicode.h"

namespace gizllm::tok {

struct Regex::Code {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Code() { pcre2_code_free(code); }
};

namespace {

// Oniguruma's \s is exactly the White_Space property; PCRE2's (10.42, with UCP) adds U+180E and
// lacks U+0085. Spell the property out for \s and \S so both agree.
constexpr const char* kWhiteSpace =
    "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}";

std::string OnigurumaClasses(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char n = p[i + 1];
      if (n == 's') {
        out += in_class ? std::string(kWhiteSpace) : "[" + std::string(kWhiteSpace) + "]";
      } else if (n == 'S' && !in_class) {
        out += "[^" + std::string(kWhiteSpace) + "]";
      } else {
        out += c;
        out += n;
      }
      ++i;
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

}  // namespace

Expected<Regex> Regex::Compile(std::string_view pattern) {
  std::string p = OnigurumaClasses(pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return InvalidArgument("bad regex '" + std::string(pattern) + "' at offset " +
                           std::to_string(offset) + ": " + reinterpret_cast<char*>(message));
  }
  auto c = std::make_shared<Code>();
  c->code = code;
  c->jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  Regex r;
  r.code_ = std::move(c);
  return r;
}

void Regex::FindAll(std::string_view text, std::vector<std::pair<size_t, size_t>>* matches) const {
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* mc = nullptr;
  pcre2_jit_stack* stack = nullptr;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  while (start <= text.size()) {
    int rc;
    if (code_->jit) {
      rc = pcre2_jit_match(code_->code, subject, text.size(), start, 0, md, mc);
      if (rc == PCRE2_ERROR_JIT_STACKLIMIT && stack == nullptr) {
        // Long runs (e.g. whitespace before a lookahead) need more than the default stack.
        mc = pcre2_match_context_create(nullptr);
        stack = pcre2_jit_stack_create(64 * 1024, 256 * 1024 * 1024, nullptr);
        pcre2_jit_stack_assign(mc, nullptr, stack);
        continue;
      }
    } else {
      rc = pcre2_match(code_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, md, mc);
    }
    if (rc < 0) break;  // no match (or a limit hit: the rest stays unmatched)
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    size_t s = ov[0], e = ov[1];
    matches->emplace_back(s, e);
    if (e > s) {
      start = e;
    } else {
      // An empty match: search again one character further.
      if (e >= text.size()) break;
      start = e + Utf8Length(static_cast<unsigned char>(text[e]));
    }
  }
  pcre2_match_data_free(md);
  if (mc != nullptr) pcre2_match_context_free(mc);
  if (stack != nullptr) pcre2_jit_stack_free(stack);
}

}  // namespace gizllm::tok
