// `flashdraft debug drafter-step | target-features | train-synthetic`: tools for chasing numerics
// bugs, each on files or in this process.
#include <cstdio>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/train_synthetic.h"
#include "model/debug_step.h"

namespace flashdraft {
namespace {

// One drafter forward+backward on files: loss, slot accuracy, gradients.
class DrafterStepCommand : public Command {
 public:
  explicit DrafterStepCommand(CLI::App& debug)
      : Command(debug.add_subcommand(
            "drafter-step",
            "One drafter forward+backward on files: writes loss, slot accuracy, gradients")) {
    app().add_option("--config", files_.config, "HF-style drafter config.json")->required();
    app()
        .add_option("--weights", files_.weights,
                    "drafter weights + embed_tokens.weight (+ lm_head.weight)")
        ->required();
    app()
        .add_option("--batch", files_.batch,
                    "input_ids, loss_mask, hidden_states, anchors (safetensors)")
        ->required();
    app().add_option("--out", files_.out, "output safetensors")->required();
    gamma_option_ =
        app().add_option("--gamma", gamma_, "loss decay (default 7/5/4 for block size 16/10/8)");
    app().add_option("--ce-weight", files_.ce_weight,
                     "α of α·CE + (1−α)·KL(target ‖ drafter): 1 cross-entropy (default), 0 KL; "
                     "below 1 the batch needs teacher_hidden [b, S, H]");
  }

  int Run() override {
    if (gamma_option_->count() > 0) files_.gamma = gamma_;
    if (absl::Status s = RunDrafterDebugStep(files_); !s.ok()) return Fail(s);
    std::printf("wrote %s\n", files_.out.c_str());
    return 0;
  }

 private:
  DrafterStepFiles files_;
  double gamma_ = 0;
  CLI::Option* gamma_option_ = nullptr;
};

// A target model on input_ids: per-layer hidden states and logits.
class TargetFeaturesCommand : public Command {
 public:
  explicit TargetFeaturesCommand(CLI::App& debug)
      : Command(debug.add_subcommand(
            "target-features",
            "Run a target model on input_ids: per-layer hidden states and logits")) {
    app().add_option("--target", target_dir_, "Hugging Face model folder")->required();
    app().add_option("--ids", ids_path_, "safetensors with input_ids [b,S] I64")->required();
    app().add_option("--layers", layers_text_, "decoder layer ids, e.g. 1,3,5")->required();
    app().add_option("--out", out_, "output safetensors")->required();
    app().add_flag("--dense-attention", dense_attention_,
                   "whole [S, S] score matrices instead of tiles (memory quadratic in S)");
  }

  int Run() override {
    std::vector<int> layers;
    if (absl::Status s = ParseLayerIds(layers_text_, layers); !s.ok()) return Fail(s);
    absl::Status s = RunTargetFeaturesDebug(target_dir_, ids_path_, layers, out_, dense_attention_);
    if (!s.ok()) return Fail(s);
    std::printf("wrote %s\n", out_.c_str());
    return 0;
  }

 private:
  std::string target_dir_, ids_path_, layers_text_, out_;
  bool dense_attention_ = false;
};

// A drafter trained in this process on a synthetic learnable language.
class TrainSyntheticCommand : public Command {
 public:
  explicit TrainSyntheticCommand(CLI::App& debug)
      : Command(debug.add_subcommand(
            "train-synthetic",
            "Train a drafter in this process on a synthetic learnable language")) {
    SyntheticTrainingOptions& o = options_;
    app().add_option("--steps", o.steps, "training steps")->capture_default_str();
    app().add_option("--block-size", o.block_size, "8, 10 or 16")->capture_default_str();
    app().add_option("--hidden", o.hidden_size, "drafter hidden size")->capture_default_str();
    app().add_option("--layers", o.layers, "drafter layers")->capture_default_str();
    app()
        .add_option("--noise", o.noise, "probability of a random next token")
        ->capture_default_str();
    app().add_option("--lr", o.learning_rate, "peak learning rate")->capture_default_str();
    app().add_option("--seed", o.seed, "seed")->capture_default_str();
    app().add_option("--threads", o.threads, "intra-op threads")->capture_default_str();
    app().add_option("--out", o.out_dir, "directory for steps.jsonl");
  }

  int Run() override { return ExitCode(RunSyntheticTraining(options_)); }

 private:
  SyntheticTrainingOptions options_;
};

}  // namespace

void AddDebugCommands(CLI::App& app, Commands& out) {
  CLI::App* debug = app.add_subcommand("debug", "Tools for chasing numerics bugs");
  debug->require_subcommand(1);
  out.push_back(std::make_unique<DrafterStepCommand>(*debug));
  out.push_back(std::make_unique<TargetFeaturesCommand>(*debug));
  out.push_back(std::make_unique<TrainSyntheticCommand>(*debug));
}

}  // namespace flashdraft
