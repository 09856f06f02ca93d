// flashdraft — the command-line tool: one subcommand per cli/cmd_*.cc (cli/command.h), dispatched
// here. `flashdraft --help` lists them.
#include <CLI/CLI.hpp>

#include "cli/command.h"
#include "common/logging.h"

int main(int argc, char** argv) {
  flashdraft::InitLogging(argv[0]);
  CLI::App app{"flashdraft: distributed training of DFlash speculative-decoding drafters"};
  app.require_subcommand(1);
  flashdraft::Commands commands;
  // In the order `flashdraft --help` lists them.
  for (auto add :
       {flashdraft::AddConfigCommands, flashdraft::AddInspectCommand, flashdraft::AddDebugCommands,
        flashdraft::AddLaunchCommand, flashdraft::AddRunRankCommand,
        flashdraft::AddMakeShardsCommand, flashdraft::AddMakeTinyTargetCommand,
        flashdraft::AddMakeTargetCommand, flashdraft::AddPrepareCommand, flashdraft::AddEvalCommand,
        flashdraft::AddReportCommand, flashdraft::AddStatusCommand, flashdraft::AddProbeCommand,
        flashdraft::AddExportCommand, flashdraft::AddVersionCommand}) {
    add(app, commands);
  }
  CLI11_PARSE(app, argc, argv);
  for (const auto& command : commands) {
    if (command->Chosen()) return command->Run();
  }
  return 1;
}
