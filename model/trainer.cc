#include "model/trainer.h"

#include <cmath>

namespace flashdraft {

double CosineLearningRate(const OptimizerOptions& o, int64_t step) {
  if (step < o.warmup_steps) {
    return o.learning_rate * static_cast<double>(step) / std::max<int64_t>(1, o.warmup_steps);
  }
  const double progress = static_cast<double>(step - o.warmup_steps) /
                          std::max<int64_t>(1, o.total_steps - o.warmup_steps);
  return o.learning_rate * std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * std::min(1.0, progress))));
}

DrafterTrainer::DrafterTrainer(Drafter drafter, OptimizerOptions options)
    : drafter_(std::move(drafter)), options_(options) {
  torch::optim::AdamWOptions adam(options_.learning_rate);
  adam.betas({options_.beta1, options_.beta2})
      .eps(options_.eps)
      .weight_decay(options_.weight_decay);
  optimizer_ = std::make_unique<torch::optim::AdamW>(drafter_->parameters(), adam);
}

DrafterLossResult DrafterTrainer::Accumulate(const DrafterBatch& batch, double gamma,
                                             std::optional<double> normaliser) {
  DrafterLossResult result = drafter_->Loss(batch, gamma, normaliser);
  result.loss.backward();
  return result;
}

double DrafterTrainer::Apply(int64_t step) {
  return ApplyWithLearningRate(CosineLearningRate(options_, step));
}

double DrafterTrainer::ApplyWithLearningRate(double lr) {
  std::vector<torch::Tensor> params = drafter_->parameters();
  double norm;
  if (options_.grad_clip_norm > 0) {
    norm = torch::nn::utils::clip_grad_norm_(params, options_.grad_clip_norm);
  } else {
    double sq = 0;
    for (const auto& p : params) {
      if (p.grad().defined()) sq += p.grad().pow(2).sum().item<double>();
    }
    norm = std::sqrt(sq);
  }
  for (auto& group : optimizer_->param_groups()) {
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  }
  optimizer_->step();
  optimizer_->zero_grad();
  return norm;
}

void DrafterTrainer::DiscardGradients() { optimizer_->zero_grad(); }

}  // namespace flashdraft
