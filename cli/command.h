// A subcommand of `flashdraft`: its object owns the values its CLI11 options are bound to, and Run
// does the work once parsing chose it. Each cmd_*.cc adds its subcommands through an Add*Command
// function below; main() adds them all in order, parses, and runs the one chosen.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/chat_template.h"

namespace flashdraft {

class Command {
 public:
  // `app`: the subcommand, owned by its parent CLI::App.
  explicit Command(CLI::App* app) : app_(app) {}
  virtual ~Command() = default;
  Command(const Command&) = delete;
  Command& operator=(const Command&) = delete;

  // Whether the command line named this subcommand.
  bool Chosen() const { return app_->parsed(); }
  // The process's exit code.
  virtual int Run() = 0;

 protected:
  CLI::App& app() const { return *app_; }

 private:
  CLI::App* app_;
};

using Commands = std::vector<std::unique_ptr<Command>>;

// "flashdraft: error: <message>" on stderr; returns 1, the exit code.
int Fail(const absl::Status& status);
// 0 when `status` is ok, else Fail(status).
int ExitCode(const absl::Status& status);
// --enable-thinking and --system-prompt, bound to `chat`: a job's data.enable_thinking and
// data.system_prompt for the commands that render chats outside a job (prepare, eval).
void AddChatOptionFlags(CLI::App& app, ChatRenderOptions& chat);
// --layers "1,9,17" → {1, 9, 17}, appended to `out`.
absl::Status ParseLayerIds(const std::string& text, std::vector<int>& out);

// Each adds its subcommand(s) to `app`, and what runs them to `out`.
void AddConfigCommands(CLI::App& app, Commands& out);     // config check
void AddInspectCommand(CLI::App& app, Commands& out);     // inspect
void AddDebugCommands(CLI::App& app, Commands& out);      // debug drafter-step|target-features|...
void AddLaunchCommand(CLI::App& app, Commands& out);      // launch
void AddRunRankCommand(CLI::App& app, Commands& out);     // run-rank
void AddMakeShardsCommand(CLI::App& app, Commands& out);  // make-shards
void AddMakeTinyTargetCommand(CLI::App& app, Commands& out);  // make-tiny-target
void AddMakeTargetCommand(CLI::App& app, Commands& out);      // make-target
void AddPrepareCommand(CLI::App& app, Commands& out);         // prepare
void AddEvalCommand(CLI::App& app, Commands& out);            // eval
void AddReportCommand(CLI::App& app, Commands& out);          // report
void AddStatusCommand(CLI::App& app, Commands& out);          // status
void AddProbeCommand(CLI::App& app, Commands& out);           // probe
void AddExportCommand(CLI::App& app, Commands& out);          // export
void AddVersionCommand(CLI::App& app, Commands& out);         // version

}  // namespace flashdraft
