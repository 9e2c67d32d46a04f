// gizllm: one program, many commands.
#include <cstdio>

#include "cli/command.h"
#include "cli/commands.h"
#include "core/host_memory.h"

namespace gizllm::cli {
int Fail(const std::string& message) {
  std::fprintf(stderr, "gizllm: %s\n", message.c_str());
  return 1;
}
}  // namespace gizllm::cli

int main(int argc, char** argv) {
  gizllm::KeepLargeBlocks(argv, /*huge_pages=*/true);
  CLI::App app{"gizllm: run language models fast on the GPU or CPU it finds"};
  app.require_subcommand(1);
  gizllm::cli::CommandContext ctx;
  for (auto add : gizllm::cli::kCommands) add(app, ctx);
  CLI11_PARSE(app, argc, argv);
  return ctx.exit_code;
}
