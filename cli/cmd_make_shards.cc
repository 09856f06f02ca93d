// `flashdraft make-shards`: a synthetic learnable data set as offline shards (demo, tests).
#include "cli/command.h"
#include "cli/make_shards.h"

namespace flashdraft {
namespace {

class MakeShardsCommand : public Command {
 public:
  explicit MakeShardsCommand(CLI::App& parent)
      : Command(parent.add_subcommand(
            "make-shards",
            "Write a synthetic learnable data set as offline shards (demo, tests)")) {
    MakeShardsOptions& o = options_;
    app().add_option("--out", o.out, "output directory")->required();
    app().add_option("--samples", o.samples, "samples")->capture_default_str();
    app().add_option("--seq", o.seq_len, "longest sample")->capture_default_str();
    app().add_option("--vocab", o.vocab_size, "vocabulary")->capture_default_str();
    app().add_option("--hidden", o.hidden_size, "target hidden size")->capture_default_str();
    app()
        .add_option("--noise", o.noise, "probability of a random next token")
        ->capture_default_str();
    app().add_option("--seed", o.seed, "seed")->capture_default_str();
  }

  int Run() override { return ExitCode(MakeShards(options_)); }

 private:
  MakeShardsOptions options_;
};

}  // namespace

void AddMakeShardsCommand(CLI::App& app, Commands& out) {
  out.push_back(std::make_unique<MakeShardsCommand>(app));
}

}  // namespace flashdraft
