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

class Template {
 public:
  // An unsupported construct is an error naming its line and column.
  static Expected<Template> Parse(std::string_view source);

  // `variables` are the names the template reads (messages, tools, ...). Errors (a failed
  // raise_exception, a type error) name the line and column.
  Expected<std::string> Render(const Dict& variables) const;

 private:
  std::shared_ptr<const Body> body_;
  std::vector<std::string> root_undefined_;  // top-level names that start undefined
};

}  // namespace gizllm::jinja
