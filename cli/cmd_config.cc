// `flashdraft config check JOB.yaml [--set section.field=value ...]`: validates a job file and
// prints it in full, with each process's expected peak memory.
#include <iostream>
#include <string>
#include <vector>

#include "cli/command.h"
#include "common/job_config.h"
#include "model/memory_estimate.h"

namespace flashdraft {
namespace {

class ConfigCheckCommand : public Command {
 public:
  explicit ConfigCheckCommand(CLI::App& config)
      : Command(config.add_subcommand("check", "Validate a job file and print it in full")) {
    app().add_option("job", job_path_, "YAML job file")->required();
    app().add_option("--set", overrides_, "Override a field: section.field=value (repeatable)");
  }

  int Run() override {
    absl::StatusOr<JobConfig> config = LoadJobConfig(job_path_);
    if (!config.ok()) return Fail(config.status());
    if (absl::Status s = ApplyOverrides(*config, overrides_); !s.ok()) return Fail(s);
    std::cout << "# " << job_path_ << ": valid\n";
    // Each process's expected peak memory, where the target's (or the shards') files are here.
    absl::StatusOr<MemoryInputs> inputs = MemoryInputsForJob(*config);
    if (inputs.ok()) {
      std::cout << FormatJobMemory(EstimateJobMemory(*config, *inputs, config->cluster.max_workers,
                                                     config->cluster.min_feeders));
    } else {
      std::cout << "# memory estimate: not available (" << inputs.status().message() << ")\n";
    }
    std::cout << JobConfigToYaml(*config);
    return 0;
  }

 private:
  std::string job_path_;
  std::vector<std::string> overrides_;
};

}  // namespace

void AddConfigCommands(CLI::App& app, Commands& out) {
  CLI::App* config = app.add_subcommand("config", "Job file tools");
  config->require_subcommand(1);
  out.push_back(std::make_unique<ConfigCheckCommand>(*config));
}

}  // namespace flashdraft
