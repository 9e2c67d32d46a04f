// The list of commands; a new command adds its Add function here.
#pragma once

#include "cli/command.h"

namespace gizllm::cli {

void AddRunCommand(CLI::App& app, CommandContext& ctx);

inline constexpr void (*kCommands[])(CLI::App&, CommandContext&) = {
    AddRunCommand,
};

}  // namespace gizllm::cli
