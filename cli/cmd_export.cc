// `flashdraft export --checkpoint DIR --out DIR`: the drafter folder SGLang, vLLM and the z-lab
// code load, from a checkpoint.
#include <cstdio>
#include <string>

#include "cli/command.h"
#include "coordinator/checkpoint.h"
#include "model/drafter_export.h"

namespace flashdraft {
namespace {

class ExportCommand : public Command {
 public:
  explicit ExportCommand(CLI::App& parent)
      : Command(parent.add_subcommand(
            "export",
            "Write the drafter folder SGLang, vLLM and the z-lab code load from a checkpoint")) {
    app()
        .add_option("--checkpoint", checkpoint_,
                    "a checkpoint directory (step-N under the job's checkpoint.dir)")
        ->required();
    app().add_option("--out", out_, "the folder to write")->required();
  }

  int Run() override {
    absl::StatusOr<CheckpointInfo> checkpoint = OpenCheckpoint(checkpoint_);
    if (!checkpoint.ok()) return Fail(checkpoint.status());
    if (absl::Status s = ExportCheckpoint(checkpoint->dir, out_); !s.ok()) return Fail(s);
    std::printf("exported the drafter after step %llu to %s\n",
                static_cast<unsigned long long>(checkpoint->completed_steps), out_.c_str());
    return 0;
  }

 private:
  std::string checkpoint_, out_;
};

}  // namespace

void AddExportCommand(CLI::App& app, Commands& out) {
  out.push_back(std::make_unique<ExportCommand>(app));
}

}  // namespace flashdraft
