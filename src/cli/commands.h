// The list of commands; a new command adds its Add function here.
#pragma once

#include "cli/command.h"

namespace gizllm::cli {

void AddRunCommand(CLI::App& app, CommandContext& ctx);
void AddLogitsCommand(CLI::App& app, CommandContext& ctx);
void AddInfoCommand(CLI::App& app, CommandContext& ctx);
void AddTokenizeCommand(CLI::App& app, CommandContext& ctx);
void AddConvertCommand(CLI::App& app, CommandContext& ctx);
void AddPerplexityCommand(CLI::App& app, CommandContext& ctx);
void AddBenchCommand(CLI::App& app, CommandContext& ctx);
void AddTemplateCommand(CLI::App& app, CommandContext& ctx);
void AddServeCommand(CLI::App& app, CommandContext& ctx);
void AddChatCommand(CLI::App& app, CommandContext& ctx);
void AddEmbedCommand(CLI::App& app, CommandContext& ctx);
void AddRerankCommand(CLI::App& app, CommandContext& ctx);

inline constexpr void (*kCommands[])(CLI::App&, CommandContext&) = {
    AddRunCommand,     AddLogitsCommand,     AddInfoCommand,  AddTokenizeCommand,
    AddConvertCommand, AddPerplexityCommand, AddBenchCommand, AddTemplateCommand,
    AddServeCommand,   AddChatCommand,       AddEmbedCommand, AddRerankCommand,
};

}  // namespace gizllm::cli
