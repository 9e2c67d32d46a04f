// Jinja source to syntax tree, with the whitespace rules transformers sets (trim_blocks and
// lstrip_blocks on, a final newline dropped).
#pragma once

#include <string_view>

#include "core/status.h"
#include "template/jinja_ast.h"

namespace gizllm::jinja {

// A construct outside the supported subset is an error naming its line and column.
Expected<Body> ParseTemplate(std::string_view source);

}  // namespace gizllm::jinja
