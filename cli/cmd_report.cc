// `flashdraft report --job DIR --out FILE`: one self-contained HTML page of a job (report.h).
#include <cstdio>

#include "cli/command.h"
#include "cli/report.h"

namespace flashdraft {
namespace {

class ReportCommand : public Command {
 public:
  explicit ReportCommand(CLI::App& parent)
      : Command(parent.add_subcommand(
            "report",
            "One self-contained HTML page of a job: curves, phases, workers, eval, config")) {
    app().add_option("--job", options_.job_dir, "the job's output_dir (steps.jsonl)")->required();
    app().add_option("--eval", options_.eval, "JSON of `flashdraft eval --json`");
    app().add_option("--out", options_.out, "HTML file to write")->required();
  }

  int Run() override {
    if (absl::Status s = WriteReport(options_); !s.ok()) return Fail(s);
    std::printf("wrote %s\n", options_.out.c_str());
    return 0;
  }

 private:
  ReportOptions options_;
};

}  // namespace

void AddReportCommand(CLI::App& app, Commands& out) {
  out.push_back(std::make_unique<ReportCommand>(app));
}

}  // namespace flashdraft
