// `flashdraft run-rank JOB.yaml`: one rank of a job torchrun started (run_rank.h).
#include <string>

#include "cli/command.h"
#include "cli/run_rank.h"

namespace flashdraft {
namespace {

class RunRankCommand : public Command {
 public:
  explicit RunRankCommand(CLI::App& parent)
      : Command(parent.add_subcommand(
            "run-rank",
            "One rank of a job under torchrun (or what sets its environment: RANK, WORLD_SIZE, "
            "LOCAL_RANK, MASTER_ADDR, MASTER_PORT): rank 0 runs the coordinator and a worker, "
            "the others a worker each")) {
    RunRankOptions& o = options_;
    app().add_option("job", o.job_path, "YAML job file (the same on every node)")->required();
    app().add_option("--out", o.out_dir, "output directory (overrides output_dir)");
    app().add_option("--set", o.overrides, "override a field: section.field=value");
    app()
        .add_option("--stopped-exit-code", o.stopped_exit_code,
                    "exit with this when SIGTERM stopped this rank before the job's end (a "
                    "launcher then starts it again; PyTorchJob's ExitCode policy: 143)")
        ->capture_default_str()
        ->check(CLI::Range(0, 255));
  }

  int Run() override { return RunRank(options_); }

 private:
  RunRankOptions options_;
};

}  // namespace

void AddRunRankCommand(CLI::App& app, Commands& out) {
  out.push_back(std::make_unique<RunRankCommand>(app));
}

}  // namespace flashdraft
