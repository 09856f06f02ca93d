// `flashdraft make-target --shape NAME`: a random-weight target of a real model's shape.
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/command.h"
#include "cli/make_target.h"

namespace flashdraft {
namespace {

class MakeTargetCommand : public Command {
 public:
  explicit MakeTargetCommand(CLI::App& parent)
      : Command(parent.add_subcommand(
            "make-target", "Create a random-weight Hugging Face target of a real model's shape")) {
    MakeTargetOptions& o = options_;
    app()
        .add_option("--shape", o.shape,
                    absl::StrCat("the real model: ", absl::StrJoin(TargetShapeNames(), ", ")))
        ->required();
    app().add_option("--out", o.out, "output folder")->required();
    app().add_option("--layers", o.layers, "decoder layers (default: the real model's)");
    app().add_option("--dtype", o.dtype, "weights: bf16 or fp32")->capture_default_str();
    app().add_option(
        "--max-seq-len", o.max_seq_len,
        "the tokenizer's model_max_length and the reply length of long-chats.jsonl (default 2048)");
    app().add_option("--corpus", o.corpus_dir, "folder of text files")->capture_default_str();
    app().add_option("--seed", o.seed, "seed")->capture_default_str();
    app().add_flag("--force", o.force, "make it again even if up to date");
  }

  int Run() override { return ExitCode(MakeTarget(options_)); }

 private:
  MakeTargetOptions options_;
};

}  // namespace

void AddMakeTargetCommand(CLI::App& app, Commands& out) {
  out.push_back(std::make_unique<MakeTargetCommand>(app));
}

}  // namespace flashdraft
