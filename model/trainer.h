// The drafter's training step (DFLASH.md §4): AdamW on fp32 master weights, global grad-norm
// clipping, cosine schedule with linear warmup, gradient accumulation over microbatches whose
// losses are scaled by one global normaliser Σw (so the sum over microbatches and workers is the
// loss of the whole global batch).
#pragma once

#include <torch/torch.h>

#include <memory>

#include "model/drafter.h"

namespace flashdraft {

struct OptimizerOptions {
  double learning_rate = 6e-4;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.0;
  double grad_clip_norm = 1.0;  // 0: no clipping
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
};

// Hugging Face's cosine schedule with warmup: lr·s/warmup while s < warmup, then
// lr·0.5·(1 + cos(π·progress)) with progress = (s − warmup)/(total − warmup).
double CosineLearningRate(const OptimizerOptions& options, int64_t step);

class DrafterTrainer {
 public:
  DrafterTrainer(Drafter drafter, OptimizerOptions options);

  // Forward + backward of one microbatch; gradients accumulate until Apply().
  DrafterLossResult Accumulate(const DrafterBatch& batch, double gamma,
                               std::optional<double> normaliser = std::nullopt);

  // Clips, steps AdamW at the scheduled rate for `step`, zeroes gradients. Returns the gradient
  // norm before clipping.
  double Apply(int64_t step);
  // The same with a learning rate decided elsewhere (the coordinator sends it with each step).
  double ApplyWithLearningRate(double learning_rate);

  // Drops accumulated gradients (a step that will be re-issued).
  void DiscardGradients();

  Drafter& drafter() { return drafter_; }
  torch::optim::AdamW& optimizer() { return *optimizer_; }

 private:
  Drafter drafter_;
  OptimizerOptions options_;
  std::unique_ptr<torch::optim::AdamW> optimizer_;
};

}  // namespace flashdraft
