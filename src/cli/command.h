// Each CLI command lives in <name>_command.cc and registers itself on the app with
// Add<Name>Command; its callback stores the process exit code in `ctx`.
#pragma once

#include <CLI/CLI.hpp>

namespace gizllm::cli {

struct CommandContext {
  int exit_code = 0;
};

// Prints "gizllm: <message>" on stderr as one line and returns exit code 1.
int Fail(const std::string& message);

}  // namespace gizllm::cli
