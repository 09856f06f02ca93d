#include "model/dflash_math.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace flashdraft {

double CosineLearningRate(double learning_rate, int64_t warmup_steps, int64_t total_steps,
                          int64_t step) {
  LearningRatePlan plan;
  plan.learning_rate = learning_rate;
  plan.warmup_steps = warmup_steps;
  plan.total_steps = total_steps;
  return LearningRateAt(plan, step);
}

bool ParseLrSchedule(std::string_view name, LrSchedule* out) {
  static constexpr std::pair<std::string_view, LrSchedule> kNames[] = {
      {"cosine", LrSchedule::kCosine},
      {"linear", LrSchedule::kLinear},
      {"constant", LrSchedule::kConstant},
      {"wsd", LrSchedule::kWsd}};
  for (const auto& [n, schedule] : kNames) {
    if (n == name) {
      *out = schedule;
      return true;
    }
  }
  return false;
}

namespace {

// How far a fall that starts at step `from` and ends at step `to` has come at `step`: 0 .. 1.
double Fallen(int64_t step, int64_t from, int64_t to) {
  return std::min(1.0, static_cast<double>(step - from) / std::max<int64_t>(1, to - from));
}

}  // namespace

double LearningRateAt(const LearningRatePlan& p, int64_t step) {
  if (step < p.warmup_steps) {
    return p.learning_rate * static_cast<double>(step) / std::max<int64_t>(1, p.warmup_steps);
  }
  double above_floor = 1.0;  // the share of (learning_rate - floor) left
  switch (p.schedule) {
    case LrSchedule::kCosine:
      above_floor =
          std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * Fallen(step, p.warmup_steps, p.total_steps))));
      break;
    case LrSchedule::kLinear:
      above_floor = 1.0 - Fallen(step, p.warmup_steps, p.total_steps);
      break;
    case LrSchedule::kConstant:
      return p.learning_rate;
    case LrSchedule::kWsd: {
      const int64_t decay_from = std::max(p.warmup_steps, p.total_steps - p.decay_steps);
      if (step >= decay_from) above_floor = 1.0 - Fallen(step, decay_from, p.total_steps);
      break;
    }
  }
  return p.learning_rate * (p.min_lr_ratio + (1.0 - p.min_lr_ratio) * above_floor);
}

std::vector<double> SlotAccuracy(const std::vector<int64_t>& correct,
                                 const std::vector<int64_t>& total) {
  std::vector<double> acc(total.size(), 0.0);
  for (size_t i = 0; i < acc.size() && i < correct.size(); ++i) {
    if (total[i] > 0) acc[i] = static_cast<double>(correct[i]) / total[i];
  }
  return acc;
}

double TauEstimate(const std::vector<double>& slot_accuracy) {
  double tau = 1.0, run = 1.0;
  for (double a : slot_accuracy) tau += (run *= a);
  return tau;
}

}  // namespace flashdraft
