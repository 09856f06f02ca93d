#include "cli/train_synthetic.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/job_config.h"
#include "model/dflash_math.h"
#include "model/numeric_probe.h"
#include "model/synthetic_data.h"
#include "model/trainer.h"

namespace flashdraft {

namespace {

absl::Status CheckOptions(const SyntheticTrainingOptions& o) {
  if (o.steps < 1 || o.block_size < 2 || o.hidden_size < 32 || o.hidden_size % 32 != 0 ||
      o.vocab_size < 4 || o.seq_len < 2 * o.block_size) {
    return absl::InvalidArgumentError(
        "need steps >= 1, block_size >= 2, hidden_size a multiple of 32, vocab_size >= 4 and "
        "seq_len >= 2·block_size");
  }
  return absl::OkStatus();
}

// <out>/steps.jsonl, or a closed stream without --out.
absl::Status OpenStepsFile(const std::string& out_dir, std::ofstream& steps_file) {
  if (out_dir.empty()) return absl::OkStatus();
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  steps_file.open(out_dir + "/steps.jsonl");
  if (!steps_file)
    return absl::InternalError(absl::StrCat("cannot write ", out_dir, "/steps.jsonl"));
  return absl::OkStatus();
}

// A drafter over two target layers' worth of features; the frozen embedding and lm_head are the
// "target's".
Drafter MakeSyntheticDrafter(const SyntheticTrainingOptions& o, const SyntheticLanguage& lang) {
  const DrafterModelConfig config =
      SyntheticDrafterConfig(lang, o.block_size, o.hidden_size, o.layers);
  Drafter drafter(config);
  drafter->InitWeights(o.seed);
  auto [embed, lm_head] = MakeSyntheticTarget(lang, o.hidden_size, o.seed + 1);
  drafter->SetFrozen(embed, lm_head);
  return drafter;
}

void PrintHeader(const SyntheticTrainingOptions& o) {
  // Each draft position is right when every one before it was: 1 + Σ (1 - noise)^k.
  double best_tau = 1, run = 1;
  for (int64_t k = 1; k < o.block_size; ++k) best_tau += (run *= 1 - o.noise);
  std::printf(
      "training a %lld-layer drafter (hidden %lld, block %lld) on a synthetic language "
      "(vocab %lld, noise %.2f: the best possible τ is about %.1f)\n",
      static_cast<long long>(o.layers), static_cast<long long>(o.hidden_size),
      static_cast<long long>(o.block_size), static_cast<long long>(o.vocab_size), o.noise,
      best_tau);
  std::printf("%6s %9s %8s %8s %8s %8s %10s\n", "step", "loss", "acc@1", "acc@2", "acc@4",
              "tau_est", "tokens/s");
}

// The steps since the last printed row: mean loss, slot accuracies, throughput.
class TrainingWindow {
 public:
  explicit TrainingWindow(int64_t block_size)
      : correct_(block_size - 1, 0), total_(block_size - 1, 0) {}

  void Add(const DrafterLossResult& r, double loss, double seconds) {
    loss_ += loss;
    tokens_ += r.tokens;
    seconds_ += seconds;
    ++steps_;
    for (size_t k = 0; k < r.slot_total.size(); ++k) {
      correct_[k] += r.slot_correct[k];
      total_[k] += r.slot_total[k];
    }
  }
  // Its row, ending at `step` (1-based); then it starts over.
  void PrintAndReset(int64_t step) {
    const std::vector<double> acc = SlotAccuracy(correct_, total_);
    auto at = [&](size_t k) { return k <= acc.size() ? acc[k - 1] : 0.0; };
    std::printf("%6lld %9.4f %8.3f %8.3f %8.3f %8.3f %10.0f\n", static_cast<long long>(step),
                loss_ / steps_, at(1), at(2), at(4), TauEstimate(acc), tokens_ / seconds_);
    std::fflush(stdout);
    loss_ = tokens_ = seconds_ = 0;
    steps_ = 0;
    std::fill(correct_.begin(), correct_.end(), 0);
    std::fill(total_.begin(), total_.end(), 0);
  }

 private:
  double loss_ = 0, tokens_ = 0, seconds_ = 0;
  std::vector<int64_t> correct_, total_;
  int64_t steps_ = 0;
};

}  // namespace

absl::Status RunSyntheticTraining(const SyntheticTrainingOptions& o) {
  if (absl::Status s = CheckOptions(o); !s.ok()) return s;
  const std::optional<double> gamma = DefaultLossDecayGamma(static_cast<int>(o.block_size));
  if (!gamma) return absl::InvalidArgumentError("block_size must be 8, 10 or 16");
  PinComputeThreads(o.threads);
  std::ofstream steps_file;
  if (absl::Status s = OpenStepsFile(o.out_dir, steps_file); !s.ok()) return s;

  const SyntheticLanguage lang =
      MakeSyntheticLanguage(o.vocab_size, 2 * o.hidden_size, o.noise, o.seed);
  Drafter drafter = MakeSyntheticDrafter(o, lang);
  OptimizerOptions opt;
  opt.learning_rate = o.learning_rate;
  opt.warmup_steps = std::max<int64_t>(1, o.steps * 4 / 100);
  opt.total_steps = o.steps;
  DrafterTrainer trainer(drafter, opt);
  SyntheticBatchOptions batch_options;
  batch_options.batch = o.batch;
  batch_options.seq_len = o.seq_len;
  batch_options.max_anchors = o.max_anchors;

  PrintHeader(o);
  using Clock = std::chrono::steady_clock;
  TrainingWindow window(o.block_size);
  for (int64_t step = 0; step < o.steps; ++step) {
    const DrafterBatch batch = MakeSyntheticBatch(lang, batch_options, o.seed, step);
    const auto t0 = Clock::now();
    DrafterLossResult r = trainer.Accumulate(batch, *gamma);
    const double grad_norm = trainer.Apply(step);
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    const double loss = r.loss.item<double>();
    window.Add(r, loss, seconds);
    if (steps_file) {
      nlohmann::json j = {{"step", step},
                          {"loss", loss},
                          {"tokens", r.tokens},
                          {"world_size", 1},
                          {"tau_estimate", r.TauEstimate()},
                          {"slot_accuracy", r.SlotAccuracy()},
                          {"grad_norm", grad_norm},
                          {"learning_rate", CosineLearningRate(opt, step)},
                          {"step_seconds", seconds}};
      steps_file << j.dump() << "\n";
    }
    if ((step + 1) % o.print_every == 0 || step + 1 == o.steps) window.PrintAndReset(step + 1);
  }
  return absl::OkStatus();
}

}  // namespace flashdraft
