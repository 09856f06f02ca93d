// `flashdraft launch JOB.yaml --workers N`: the job here, the coordinator and N workers as child
// processes (launch.h).
#include <string>

#include "cli/command.h"
#include "cli/launch.h"

namespace flashdraft {
namespace {

class LaunchCommand : public Command {
 public:
  explicit LaunchCommand(CLI::App& parent)
      : Command(parent.add_subcommand(
            "launch", "Run a job here: the coordinator and N workers as child processes")) {
    LaunchOptions& o = options_;
    app().add_option("job", o.job_path, "YAML job file")->required();
    app().add_option("--workers", o.workers, "worker processes")->capture_default_str();
    app()
        .add_option("--feeders", o.feeders,
                    "target feeder processes (data.source: target): each holds the target and "
                    "computes shards for the workers; 0 runs the target in the coordinator")
        ->capture_default_str()
        ->check(CLI::Range(0, 64));
    app().add_option("--out", o.out_dir, "output directory (overrides output_dir)");
    app().add_option("--set", o.overrides, "override a field: section.field=value");
    app().add_flag("--skip-memory-check", o.skip_memory_check,
                   "start even when the job's expected peak memory exceeds what is available");
    app().add_flag("--resume", resume_,
                   "start from the newest checkpoint when there is one (checkpoint.resume=true)");
    app()
        .add_option("--max-restarts", o.max_restarts,
                    "start a crashed worker again up to this many times (1 s, 2 s, 4 s ... later)")
        ->capture_default_str()
        ->check(CLI::Range(0, 1000));
    app().add_option("--threads", o.threads_per_worker,
                     "LibTorch and OpenBLAS threads of every process of the job: sets "
                     "train.intra_op_threads (default: the job's)");
  }

  int Run() override {
    if (resume_) {
      options_.overrides.push_back("checkpoint.resume=true");
      options_.restart_coordinator = true;
    }
    return Launch(options_);
  }

 private:
  LaunchOptions options_;
  bool resume_ = false;
};

}  // namespace

void AddLaunchCommand(CLI::App& app, Commands& out) {
  out.push_back(std::make_unique<LaunchCommand>(app));
}

}  // namespace flashdraft
