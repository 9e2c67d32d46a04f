// A Jinja2 interpreter for the subset chat templates use, rendering as jinja2 3.1 does in
// transformers' sandboxed environment (trim_blocks and lstrip_blocks on, loop controls on).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "core/status.h"
#include "template/jinja_ast.h"
#include "template/jinja_value.h"

namespace gizllm::jinja {

// Bounds on one render, so that no template, and no value given to one, holds a thread or the
// memory without end: a loop of range(100000) inside another, a string doubled sixty times.
// Past a bound the render fails with an error that names it.
struct RenderLimits {
  int64_t steps = 2'000'000;            // statements run, expressions evaluated, items made
  int64_t bytes = int64_t{1} << 30;     // bytes of text made: output, captures, strings
  int64_t longest = int64_t{64} << 20;  // the longest text: the output or any one string
};

class Template {
 public:
  // An unsupported construct is an error naming its line and column.
  static Expected<Template> Parse(std::string_view source);

  // `variables` are the names the template reads (messages, tools, ...). Errors (a failed
  // raise_exception, a type error) name the line and column.
  Expected<std::string> Render(const Dict& variables, const RenderLimits& limits = {}) const;

 private:
  std::shared_ptr<const Body> body_;
  std::vector<std::string> root_undefined_;  // top-level names that start undefined
};

}  // namespace gizllm::jinja
