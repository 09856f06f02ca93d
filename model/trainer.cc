#include "model/trainer.h"

#include <cmath>

#include "model/dflash_math.h"

namespace flashdraft {

double CosineLearningRate(const OptimizerOptions& o, int64_t step) {
  return CosineLearningRate(o.learning_rate, o.warmup_steps, o.total_steps, step);
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
