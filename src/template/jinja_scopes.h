// Which names each scope of a template owns from its start (see jinja_scopes.cc).
#pragma once

#include <string>
#include <vector>

#include "template/jinja_ast.h"

namespace gizllm::jinja {

// Fills scope_undefined and else_undefined of the loops, macros and call blocks in `root`, and
// returns the top level's: the names that start undefined (not looked up outside) in that scope.
std::vector<std::string> AnalyzeScopes(Body& root);

}  // namespace gizllm::jinja
