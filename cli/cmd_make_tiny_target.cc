// `flashdraft make-tiny-target`: a small Qwen3-shaped target trained here (tests, demos).
#include <cstdint>

#include "cli/command.h"
#include "cli/make_tiny_target.h"

namespace flashdraft {
namespace {

class MakeTinyTargetCommand : public Command {
 public:
  explicit MakeTinyTargetCommand(CLI::App& parent)
      : Command(parent.add_subcommand(
            "make-tiny-target",
            "Create a small Qwen3-shaped Hugging Face target trained on Debian's license texts")) {
    MakeTinyTargetOptions& o = options_;
    app().add_option("--out", o.out, "output folder")->required();
    app()
        .add_option("--steps", o.steps, "training steps")
        ->capture_default_str()
        ->check(CLI::Range(int64_t{1}, int64_t{10000000}));
    app()
        .add_option("--merges", o.num_merges, "BPE merges")
        ->capture_default_str()
        ->check(CLI::Range(0, 1000000));
    app()
        .add_option("--hidden", o.hidden_size, "hidden size")
        ->capture_default_str()
        ->check(CLI::Range(int64_t{8}, int64_t{4096}));
    app()
        .add_option("--layers", o.num_layers, "decoder layers")
        ->capture_default_str()
        ->check(CLI::Range(int64_t{1}, int64_t{64}));
    app().add_option("--corpus", o.corpus_dir, "folder of text files")->capture_default_str();
    app()
        .add_option("--threads", o.threads, "intra-op threads")
        ->capture_default_str()
        ->check(CLI::Range(1, 1024));
    app().add_option("--seed", o.seed, "seed")->capture_default_str();
    app().add_flag("--force", o.force, "retrain even if the folder is up to date");
  }

  int Run() override { return ExitCode(MakeTinyTarget(options_)); }

 private:
  MakeTinyTargetOptions options_;
};

}  // namespace

void AddMakeTinyTargetCommand(CLI::App& app, Commands& out) {
  out.push_back(std::make_unique<MakeTinyTargetCommand>(app));
}

}  // namespace flashdraft
